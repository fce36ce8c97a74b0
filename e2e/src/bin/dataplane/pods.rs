//! The CDN as the binary under test renders it (`render -f` of the topology: each CdnCluster's
//! ConfigMap and Deployment), and its pods run as Kubernetes would run them: the ConfigMap
//! projected as the kubelet projects it, the Deployment's volumes and command in a sandbox, the
//! sidecars beside nginx; a changed ConfigMap switched in the pod's volume.

use cdn_operator::cdncluster::build::{self, CONFIG_KEY, ENTRYPOINT_KEY};
use cdn_operator::nginx_cache::wire;
use cdn_operator_testkit::nginx::{Nginx, Sandbox};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Container;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::lab::{
    Setup, IMAGE_ENTRYPOINT, METRICS_IMAGE, METRICS_PORT, NAMESPACE, PODS, TOKEN_SECRET,
};
use crate::util::{chmod, count, wait_for};

/// What the binary renders for one CdnCluster: its ConfigMap's files and its Deployment.
#[derive(Clone, Debug)]
pub(crate) struct Desired {
    pub(crate) files: BTreeMap<String, String>,
    pub(crate) deployment: Deployment,
}

/// The topology; `cache`: the fields of a `cache` given to both caches (`valid: 20m`, a change of
/// their configuration); `signed`: the balancer with signed URLs.
fn topology(cache: Option<&str>, signed: bool) -> String {
    let cache = cache
        .map(|c| format!("  cache: {{{c}}}\n"))
        .unwrap_or_default();
    let mut yaml = String::from(
        "apiVersion: cluster.anevia.com/v1\nkind: CdnCluster\nmetadata: {name: edge, namespace: default}\n\
         spec:\n  role: balancer\n  sources:\n  - name: cache-1\n  - name: cache-2\n",
    );
    if signed {
        yaml.push_str(&format!("  signedUrls: {{secretName: {TOKEN_SECRET}}}\n"));
    }
    for name in ["cache-1", "cache-2"] {
        yaml.push_str(&format!(
            "---\napiVersion: cluster.anevia.com/v1\nkind: CdnCluster\nmetadata: {{name: {name}, namespace: default}}\n\
             spec:\n  role: cache\n{cache}  sources:\n  - name: origin\n    origin: {{service: {{name: origin, port: 8080}}}}\n"
        ));
    }
    yaml
}

/// `binary render -f` of the topology (written to `dir`/`file`, `cache` as [`topology`] takes it):
/// the children of each CdnCluster.
/// With `metrics`, as an operator given a metrics image renders it: every pod with its metrics
/// sidecar, of the same binary; with `signed`, the balancer with signed URLs.
pub(crate) fn render(
    binary: &Path,
    dir: &Path,
    file: &str,
    cache: Option<&str>,
    metrics: bool,
    signed: bool,
) -> Result<BTreeMap<String, Desired>, String> {
    let path = dir.join(file);
    std::fs::write(&path, topology(cache, signed))
        .map_err(|e| format!("writing {}: {e}", path.display()))?;
    let mut command = Command::new(binary);
    command.arg("render");
    if metrics {
        command.args(["--nginx-metrics-image", METRICS_IMAGE]);
    }
    let out = command
        .arg("-f")
        .arg(&path)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("running {}: {e}", binary.display()))?;
    if !out.status.success() {
        return Err(format!(
            "{} render: {}\n{}",
            binary.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut files: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    let mut deployments: BTreeMap<String, Deployment> = BTreeMap::new();
    for document in serde_yaml::Deserializer::from_str(&text) {
        let value =
            serde_yaml::Value::deserialize(document).map_err(|e| format!("render's YAML: {e}"))?;
        let name = value["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        match value["kind"].as_str() {
            Some("ConfigMap") => {
                let data: BTreeMap<String, String> = serde_yaml::from_value(value["data"].clone())
                    .map_err(|e| format!("ConfigMap {name}: {e}"))?;
                files.insert(name, data);
            }
            Some("Deployment") => {
                let deployment: Deployment =
                    serde_yaml::from_value(value).map_err(|e| format!("Deployment {name}: {e}"))?;
                deployments.insert(name, deployment);
            }
            _ => {}
        }
    }
    let mut desired = BTreeMap::new();
    for (cluster, _) in PODS {
        let (config_map, deployment_name) = (
            build::config_map_name(cluster),
            build::deployment_name(cluster),
        );
        let files = files
            .remove(&config_map)
            .ok_or_else(|| format!("render gave no ConfigMap {config_map}"))?;
        if !files.contains_key(CONFIG_KEY) {
            return Err(format!("ConfigMap {config_map} has no {CONFIG_KEY}"));
        }
        let deployment = deployments
            .remove(&deployment_name)
            .ok_or_else(|| format!("render gave no Deployment {deployment_name}"))?;
        desired.insert(cluster.to_string(), Desired { files, deployment });
    }
    Ok(desired)
}

/// The generated configuration with its one change: `listen 8080;` → `listen IP:80;`.
fn on_loopback(conf: &str, ip: &str) -> Result<String, String> {
    let listens = conf.lines().filter(|l| l.trim() == "listen 8080;").count();
    if listens != 1 {
        return Err(format!(
            "{listens} lines `listen 8080;` in the generated configuration, not 1"
        ));
    }
    Ok(conf
        .lines()
        .map(|l| {
            if l.trim() == "listen 8080;" {
                l.replace("listen 8080;", &format!("listen {ip}:80;"))
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
        + if conf.ends_with('\n') { "\n" } else { "" })
}

/// Writes `files` into `dir` as the kubelet projects a ConfigMap volume: the files in a directory
/// of this `generation`, `..data` a symlink to it, each key a symlink through `..data`. A new
/// generation switches all the files at once: a new `..data` link renamed over the old one.
fn project(dir: &Path, files: &BTreeMap<String, String>, generation: u32) -> io::Result<()> {
    std::fs::create_dir_all(dir)?;
    chmod(dir, 0o755);
    let version = format!("..gen_{generation}");
    let data = dir.join(&version);
    std::fs::create_dir_all(&data)?;
    chmod(&data, 0o755);
    for (key, text) in files {
        let path = data.join(key);
        std::fs::write(&path, text)?;
        chmod(&path, 0o644);
    }
    let link = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&version, &link)?;
    std::fs::rename(&link, dir.join("..data"))?;
    for key in files.keys() {
        let path = dir.join(key);
        if path.symlink_metadata().is_err() {
            std::os::unix::fs::symlink(format!("..data/{key}"), &path)?;
        }
    }
    // The kubelet removes the previous generation once switched.
    for entry in std::fs::read_dir(dir)?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("..gen_") && name != version {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
    Ok(())
}

/// A running pod of a CdnCluster.
pub(crate) struct Pod {
    pub(crate) nginx: Nginx,
    /// Its metrics sidecar, when it has one: stopped after nginx, as a pod stops its sidecars.
    pub(crate) sidecar: Option<Nginx>,
    /// Its ConfigMap volume, and the generation projected there.
    config: PathBuf,
    generation: u32,
}

/// Starts `cluster` as its pod: the Deployment's volumes and command, the ConfigMap's files (the
/// listen line moved to `ip`:80), a fresh tmpfs at each emptyDir. `incarnation` numbers the pods of
/// a cluster (each has directories of its own). Call from the main thread (bubblewrap's
/// --die-with-parent follows the spawning thread).
pub(crate) fn start_pod(
    setup: &Setup,
    dir: &Path,
    cluster: &str,
    ip: &str,
    desired: &Desired,
    incarnation: u32,
    binary: &Path,
) -> Result<Pod, String> {
    let pod_dir = dir.join(format!("{cluster}-pod{incarnation}"));
    let config = pod_dir.join("config");
    let logs = pod_dir.join("logs");
    std::fs::create_dir_all(&logs).map_err(|e| e.to_string())?;
    chmod(&pod_dir, 0o755);
    let mut files = pod_files(desired, ip)?;
    if takes_purges(desired) {
        files.insert(
            wire::PUBLIC_KEYS_KEY.into(),
            setup.signer.public_keys_file(),
        );
    }
    project(&config, &files, 1).map_err(|e| format!("projecting {}: {e}", config.display()))?;

    let spec = desired
        .deployment
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .ok_or("the Deployment has no pod template")?;
    let container = spec.containers.first().ok_or("the pod has no container")?;
    let volumes = spec.volumes.as_deref().unwrap_or_default();
    // The sidecars: restartable init containers, started before nginx.
    let sidecars: Vec<&Container> = spec
        .init_containers
        .iter()
        .flatten()
        .filter(|c| c.restart_policy.as_deref() == Some("Always"))
        .collect();
    // An emptyDir a sidecar mounts too is a folder of the host both sandboxes see; any other, a
    // tmpfs of nginx's sandbox.
    let shared = |name: &str| {
        sidecars
            .iter()
            .flat_map(|c| c.volume_mounts.iter().flatten())
            .any(|m| m.name == name)
    };
    let volume_dir = |name: &str| -> Result<PathBuf, String> {
        let path = pod_dir.join("volumes").join(name);
        std::fs::create_dir_all(&path).map_err(|e| e.to_string())?;
        chmod(&path, 0o777);
        Ok(path)
    };
    let mut sandbox = Sandbox::read_only_root()
        .hosts(&setup.hosts)
        .resolv_conf(&setup.resolv_conf);
    for mount in container.volume_mounts.as_deref().unwrap_or_default() {
        let volume = volumes
            .iter()
            .find(|v| v.name == mount.name)
            .ok_or_else(|| format!("no volume {}", mount.name))?;
        if volume.empty_dir.is_some() && shared(&volume.name) {
            sandbox = sandbox.volume(volume_dir(&volume.name)?, &mount.mount_path);
        } else if volume.empty_dir.is_some() {
            sandbox = sandbox.empty_dir(&mount.mount_path);
        } else if volume.config_map.is_some() {
            sandbox = sandbox.read_only(&config, &mount.mount_path);
        } else if let Some(secret) = &volume.secret {
            // Projected as the kubelet projects a Secret, like a ConfigMap.
            let name = secret.secret_name.clone().unwrap_or_default();
            let files = setup
                .secrets
                .get(&name)
                .ok_or_else(|| format!("no Secret {name} in the benchmark"))?;
            let path = pod_dir.join("secrets").join(&name);
            project(&path, files, 1).map_err(|e| format!("projecting {}: {e}", path.display()))?;
            sandbox = sandbox.read_only(&path, &mount.mount_path);
        } else {
            return Err(format!(
                "volume {} is neither an emptyDir, the ConfigMap nor a Secret",
                volume.name
            ));
        }
    }
    if let Some((uid, gid)) = setup.user() {
        sandbox = sandbox.user(uid, gid);
    }
    let mut sidecar = None;
    for container in sidecars {
        // The binary under test at the image's entrypoint, the pod's shared emptyDirs at their
        // mounts; its arguments word for word but its listen address, moved to the pod's.
        let mut sandbox = Sandbox::read_only_root().read_only(binary, IMAGE_ENTRYPOINT);
        for mount in container.volume_mounts.iter().flatten() {
            let is_config = volumes
                .iter()
                .any(|v| v.name == mount.name && v.config_map.is_some());
            sandbox = if is_config {
                sandbox.read_only(&config, &mount.mount_path)
            } else if mount.read_only == Some(true) {
                sandbox.read_only(volume_dir(&mount.name)?, &mount.mount_path)
            } else {
                sandbox.volume(volume_dir(&mount.name)?, &mount.mount_path)
            };
        }
        if let Some((uid, gid)) = setup.user() {
            sandbox = sandbox.user(uid, gid);
        }
        let listen = format!("{ip}:{METRICS_PORT}");
        let argv: Vec<String> = std::iter::once(IMAGE_ENTRYPOINT.to_string())
            .chain(container.args.iter().flatten().map(|a| {
                if *a == format!(":{METRICS_PORT}") {
                    listen.clone()
                } else {
                    a.clone()
                }
            }))
            .collect();
        let name = format!("{cluster}-pod{incarnation}-{}", container.name);
        let mut command = sandbox.command(&argv);
        // The downward API's fields the container asks for (its namespace).
        for var in container.env.iter().flatten() {
            let field = var.value_from.as_ref().and_then(|v| v.field_ref.as_ref());
            if field.is_some_and(|f| f.field_path == "metadata.namespace") {
                command.env(&var.name, NAMESPACE);
            }
        }
        let process = Nginx::spawn(
            &name,
            command,
            &logs.join(format!("{}.log", container.name)),
        );
        process.wait_listening(&listen, &argv.join(" "));
        sidecar = Some(process);
    }
    let mut argv: Vec<String> = container.command.clone().unwrap_or_default();
    argv.extend(container.args.clone().unwrap_or_default());
    if argv.is_empty() {
        return Err("the container has no command".into());
    }
    // The container's command word for word; its standard output (the access log) and error (the
    // error log, run.sh's messages: `Nginx::log`) to files, as a container runtime keeps them.
    let command = sandbox.command(&argv);
    // nginx reopens /dev/stdout by its /proc path: the pod's uid must be able to write to it.
    let stdout = logs.join("stdout.log");
    std::fs::write(&stdout, "").map_err(|e| e.to_string())?;
    chmod(&stdout, 0o666);
    let nginx = Nginx::spawn_logging(
        &format!("{cluster}-pod{incarnation}"),
        command,
        &logs.join("stderr.log"),
        &stdout,
    );
    nginx.wait_listening(&format!("{ip}:80"), &files[CONFIG_KEY]);
    Ok(Pod {
        nginx,
        sidecar,
        config,
        generation: 1,
    })
}

/// Whether the pod of `desired` has a sidecar that applies purges (`--purge-keys`).
pub(crate) fn takes_purges(desired: &Desired) -> bool {
    desired
        .deployment
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.init_containers.as_ref())
        .is_some_and(|c| {
            c.iter()
                .any(|c| c.args.iter().flatten().any(|a| a == "--purge-keys"))
        })
}

/// The ConfigMap's files as the pod at `ip` gets them: nginx.conf with its listen line moved.
fn pod_files(desired: &Desired, ip: &str) -> Result<BTreeMap<String, String>, String> {
    let mut files = desired.files.clone();
    let conf = on_loopback(&files[CONFIG_KEY], ip)?;
    files.insert(CONFIG_KEY.into(), conf);
    Ok(files)
}

/// A Deployment's pod template, to compare two renderings.
pub(crate) fn pod_template(desired: &Desired) -> String {
    serde_json::to_string(&desired.deployment.spec.as_ref().map(|s| &s.template))
        .unwrap_or_default()
}

/// Projects `desired`'s files (a changed ConfigMap) into the pod's volume, as the kubelet does;
/// when they have run.sh, waits for it to reload nginx. What happened.
pub(crate) fn switch_files(pod: &mut Pod, desired: &Desired, ip: &str) -> String {
    let (reloads, workers) = reload_counts(&pod.nginx);
    pod.generation += 1;
    let projected = pod_files(desired, ip)
        .and_then(|files| project(&pod.config, &files, pod.generation).map_err(|e| e.to_string()));
    if let Err(e) = projected {
        return format!("ConfigMap changed, not projected: {e}");
    }
    if !desired.files.contains_key(ENTRYPOINT_KEY) {
        return "ConfigMap changed: nothing reloads nginx".to_string();
    }
    let started = Instant::now();
    let reloaded = wait_for(Duration::from_secs(10), || {
        let (r, w) = reload_counts(&pod.nginx);
        r > reloads && w > workers
    });
    // The new workers take the listening sockets; the old ones finish.
    std::thread::sleep(Duration::from_millis(300));
    if reloaded {
        format!(
            "ConfigMap changed: run.sh reloaded nginx in place ({:.1} s)",
            started.elapsed().as_secs_f64()
        )
    } else {
        "ConfigMap changed: run.sh did not reload nginx within 10 s".to_string()
    }
}

/// The reloads run.sh announced and the worker processes nginx started, from its error log.
fn reload_counts(nginx: &Nginx) -> (usize, usize) {
    let log = nginx.log();
    (
        count(&log, "reloading nginx"),
        count(&log, "start worker process"),
    )
}
