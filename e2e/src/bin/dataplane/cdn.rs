//! The CDN under test of one column: its rendered topology, the origin and the pods running it;
//! a pod replaced, a new rendering applied, as Kubernetes would. The rows are methods of [`Cdn`]
//! too, in `rows/` and `peers/`.

use cdn_operator_testkit::nginx::{Nginx, Sandbox};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::lab::{Setup, ORIGIN, PODS};
use crate::origin::{origin_config, OriginLog};
use crate::pods::{pod_template, render, start_pod, switch_files, Desired, Pod};
use crate::util::first_line;

pub(crate) struct Cdn {
    pub(crate) dir: PathBuf,
    pub(crate) desired: BTreeMap<String, Desired>,
    pub(crate) binary: PathBuf,
    pub(crate) origin: Nginx,
    pub(crate) log: OriginLog,
    pub(crate) pods: BTreeMap<String, Pod>,
    pub(crate) incarnations: BTreeMap<String, u32>,
}

impl Cdn {
    /// Renders the topology with `binary` and starts the origin and the three pods.
    pub(crate) fn start(setup: &Setup, binary: &Path, dir: &Path) -> Result<Cdn, String> {
        let desired = render(binary, dir, "topology.yaml", None, false, false)?;
        let log = dir.join("origin.access.log");
        std::fs::write(&log, "").map_err(|e| e.to_string())?;
        let conf = origin_config(&setup.www, dir, &log);
        let origin = Nginx::start(
            &Sandbox::new().share(&setup.www),
            "origin",
            &conf,
            dir,
            ORIGIN,
        );
        let mut cdn = Cdn {
            dir: dir.to_path_buf(),
            desired,
            binary: binary.to_path_buf(),
            origin,
            log: OriginLog { path: log },
            pods: BTreeMap::new(),
            incarnations: BTreeMap::new(),
        };
        // Sources first, as the operator waits for them.
        for (cluster, _) in PODS.iter().rev() {
            cdn.restart_pod(setup, cluster)?;
        }
        Ok(cdn)
    }

    /// Replaces the pod of `cluster` with a new one (fresh emptyDirs), or starts it.
    pub(crate) fn restart_pod(&mut self, setup: &Setup, cluster: &str) -> Result<(), String> {
        if let Some(pod) = self.pods.remove(cluster) {
            pod.nginx.stop();
            if let Some(sidecar) = pod.sidecar {
                sidecar.kill();
            }
        }
        let ip = PODS.iter().find(|(c, _)| *c == cluster).expect("a pod").1;
        let n = self.incarnations.entry(cluster.to_string()).or_insert(0);
        *n += 1;
        let pod = start_pod(
            setup,
            &self.dir,
            cluster,
            ip,
            &self.desired[cluster],
            *n,
            &self.binary,
        )?;
        self.pods.insert(cluster.to_string(), pod);
        Ok(())
    }

    /// Applies a new rendering as Kubernetes would: a cluster whose pod template changed gets a
    /// new pod (new emptyDirs: an empty cache); one whose ConfigMap alone changed gets the new
    /// files in its volume (the kubelet's `..data` switch), and, when the ConfigMap has `run.sh`,
    /// waits for it to reload nginx. What was done, per cluster.
    pub(crate) fn apply(
        &mut self,
        setup: &Setup,
        desired: BTreeMap<String, Desired>,
    ) -> BTreeMap<String, String> {
        let mut done = BTreeMap::new();
        let old = std::mem::replace(&mut self.desired, desired);
        for (cluster, ip) in PODS {
            let (before, after) = (&old[cluster], &self.desired[cluster]);
            let what = if pod_template(before) != pod_template(after) {
                match self.restart_pod(setup, cluster) {
                    Ok(()) => "pod template changed: pod replaced (empty cache)".to_string(),
                    Err(e) => format!("pod template changed, new pod failed: {e}"),
                }
            } else if before.files != after.files {
                switch_files(self.pods.get_mut(cluster).expect("a pod"), after, ip)
            } else {
                "unchanged".to_string()
            };
            done.insert(cluster.to_string(), what);
        }
        done
    }

    /// A fresh balancer pod: forgets the members it left out.
    pub(crate) fn reset_balancer(&mut self, setup: &Setup) {
        if let Err(e) = self.restart_pod(setup, "edge") {
            eprintln!("dataplane: restarting the balancer: {e}");
        }
    }

    /// The cache directory of `cluster`'s pod, seen from outside its sandbox (through its
    /// nginx's /proc root).
    /// The topology with every pod's metrics sidecar (`topology-metrics.yaml`), as this binary
    /// renders it; `Err` says why it renders none.
    pub(crate) fn render_counted(&self) -> Result<BTreeMap<String, Desired>, String> {
        render(
            &self.binary,
            &self.dir,
            "topology-metrics.yaml",
            None,
            true,
            false,
        )
        .map_err(|e| {
            format!(
                "this binary renders no metrics sidecar ({})",
                first_line(&e)
            )
        })
    }

    pub(crate) fn cache_dir(&self, cluster: &str) -> Option<PathBuf> {
        let pod = self.pods.get(cluster)?;
        let (pid, _) = pod
            .nginx
            .processes()
            .into_iter()
            .find(|(_, c)| c.contains("nginx"))?;
        Some(PathBuf::from(format!("/proc/{pid}/root/var/cache/nginx")))
    }
}

impl Drop for Cdn {
    fn drop(&mut self) {
        // The pods first (parents before sources), then the origin (its own Drop).
        for (cluster, _) in PODS {
            if let Some(pod) = self.pods.remove(cluster) {
                pod.nginx.stop();
            }
        }
    }
}
