//! One node test's world, [`NodeTest`]: the skip (no cluster, no Ready node, no images), the
//! lock that keeps cluster-wide installs apart from the other tests, fresh namespaces under
//! restricted Pod Security, the chart's install, and the cleanup (with diagnostics when the test
//! fails). Depends on `image`, `tools` and `wait`.

use super::image::{ImageRef, NGINX_IMAGE_ENV, OPERATOR_IMAGE_ENV};
use super::tools::{diagnostics, helm, outcome, run, TOOL_TIMEOUT};
use super::wait::node_ready;
use crate::{cleanup, install_crds, reach, repository_root, say};
use cdn_operator_testkit::on_own_thread;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Node};
use kube::api::{Api, ListParams, PostParams};
use kube::core::GroupVersionKind;
use kube::{Client, ResourceExt};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};
use tokio::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Tests that install an operator watching every namespace (Helm's and kustomize's defaults)
/// take this lock exclusively, those that install one watching its own namespace share it: a
/// cluster-wide operator would also reconcile the CdnClusters and Ats of the tests running
/// beside it, and deleting a kustomize install deletes the CRDs (and every CdnCluster and At).
static INSTALLS: RwLock<()> = RwLock::const_new(());

/// What a test's operator watches, hence how it shares the cluster with the other tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// The operator manages its own namespace only (Helm `singleNamespace.enabled=true`): runs
    /// beside other such tests.
    Namespace,
    /// The operator manages every namespace: runs alone among the node tests.
    Cluster,
}

enum Lock {
    Shared(#[allow(dead_code)] RwLockReadGuard<'static, ()>),
    Exclusive(#[allow(dead_code)] RwLockWriteGuard<'static, ()>),
}

/// One node test's world: a client, the images, the namespaces, Helm releases, kustomize installs
/// and cluster-scoped objects it made. Dropping it prints, when the test is failing, the state,
/// Events and logs of every pod of its namespaces, then uninstalls and deletes all of it.
pub struct NodeTest {
    pub client: Client,
    pub test: String,
    pub operator_image: String,
    pub nginx_image: String,
    /// A temporary directory of the test (the kustomize overlay).
    pub dir: tempfile::TempDir,
    suffix: String,
    namespaces: Vec<String>,
    releases: Vec<(String, String)>,
    overlays: Vec<PathBuf>,
    cluster_scoped: Vec<(GroupVersionKind, String)>,
    mounts: Vec<PathBuf>,
    _lock: Lock,
}

/// A Helm release of the chart, installed by [`NodeTest::helm_install`].
#[derive(Clone, Debug)]
pub struct Release {
    pub namespace: String,
    pub name: String,
    /// The name of its objects (the release name, which contains `cdn-operator`).
    pub fullname: String,
}

static SUFFIXES: AtomicU32 = AtomicU32::new(0);

impl NodeTest {
    /// The cluster of `KUBECONFIG` when it answers, has a Ready node and the images are named;
    /// otherwise one line (`node tests skipped: <test>: <why>`) and `None`, so the test passes
    /// without testing anything. Waits for its turn among the node tests (see [`Scope`]).
    pub async fn new(test: &str, scope: Scope) -> Option<NodeTest> {
        let skip = |why: &str| say(&format!("node tests skipped: {test}: {why}"));
        let client = match reach().await {
            Ok(client) => client,
            Err(error) => {
                skip(&error);
                return None;
            }
        };
        let nodes = match Api::<Node>::all(client.clone())
            .list(&ListParams::default())
            .await
        {
            Ok(list) => list.items,
            Err(error) => {
                skip(&format!("cannot list the nodes: {error}"));
                return None;
            }
        };
        if !nodes.iter().any(node_ready) {
            let names: Vec<String> = nodes.iter().map(|n| n.name_any()).collect();
            skip(&format!("no Ready node (nodes: {names:?})"));
            return None;
        }
        let mut images = Vec::new();
        for variable in [OPERATOR_IMAGE_ENV, NGINX_IMAGE_ENV] {
            match std::env::var(variable) {
                Ok(image) if !image.trim().is_empty() => {
                    if let Err(error) = ImageRef::parse(image.trim()) {
                        panic!("{variable}: {error}");
                    }
                    images.push(image.trim().to_string());
                }
                _ => {
                    skip(&format!(
                        "{variable} is unset (an image present in the node's container runtime)"
                    ));
                    return None;
                }
            }
        }
        let lock = match scope {
            Scope::Namespace => Lock::Shared(INSTALLS.read().await),
            Scope::Cluster => Lock::Exclusive(INSTALLS.write().await),
        };
        let micros = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock after 1970")
            .as_micros();
        let suffix = format!(
            "{:x}{}",
            micros % 0xfffff,
            SUFFIXES.fetch_add(1, Ordering::Relaxed) % 10
        );
        Some(NodeTest {
            client,
            test: test.into(),
            operator_image: images[0].clone(),
            nginx_image: images[1].clone(),
            dir: tempfile::tempdir().expect("a temporary directory"),
            suffix,
            namespaces: Vec::new(),
            releases: Vec::new(),
            overlays: Vec::new(),
            cluster_scoped: Vec::new(),
            mounts: Vec::new(),
            _lock: lock,
        })
    }

    /// The image named by `variable` beyond the two every test needs
    /// ([`PAUSE_IMAGE_ENV`](super::PAUSE_IMAGE_ENV), [`ROOT_IMAGE_ENV`](super::ROOT_IMAGE_ENV));
    /// when unset, one line (`node tests skipped: <test>: …`) and `None`.
    pub fn extra_image(&self, variable: &str) -> Option<String> {
        match std::env::var(variable) {
            Ok(image) if !image.trim().is_empty() => {
                if let Err(error) = ImageRef::parse(image.trim()) {
                    panic!("{variable}: {error}");
                }
                Some(image.trim().to_string())
            }
            _ => {
                say(&format!(
                    "node tests skipped: {}: {variable} is unset (an image present in the node's \
                     container runtime)",
                    self.test
                ));
                None
            }
        }
    }

    /// A name unique to this test run: `<base>-<suffix>`.
    pub fn unique(&self, base: &str) -> String {
        format!("{base}-{}", self.suffix)
    }

    /// Creates the namespace `node-<short>-<suffix>`, enforcing (and warning and auditing) the
    /// restricted Pod Security standard, deleted when the test ends.
    pub async fn namespace(&mut self, short: &str) -> String {
        let ns = self.unique(&format!("node-{short}"));
        let namespace: Namespace = serde_json::from_value(json!({"metadata": {
            "name": ns,
            "labels": {
                "app.kubernetes.io/part-of": "cdn-operator-e2e",
                "pod-security.kubernetes.io/enforce": "restricted",
                "pod-security.kubernetes.io/enforce-version": "latest",
                "pod-security.kubernetes.io/warn": "restricted",
                "pod-security.kubernetes.io/audit": "restricted",
            },
        }}))
        .expect("a Namespace");
        Api::<Namespace>::all(self.client.clone())
            .create(&PostParams::default(), &namespace)
            .await
            .unwrap_or_else(|e| panic!("creating namespace {ns}: {e}"));
        self.namespaces.push(ns.clone());
        ns
    }

    /// Deletes (and, on failure, describes) namespace `ns` with the test, though the test did not
    /// create it itself (kustomize's).
    pub fn owns_namespace(&mut self, ns: &str) {
        self.namespaces.push(ns.into());
    }

    /// Deletes this cluster-scoped object when the test ends.
    pub fn owns_cluster_scoped(&mut self, gvk: GroupVersionKind, name: &str) {
        self.cluster_scoped.push((gvk, name.into()));
    }

    /// Unmounts this folder of the node (this machine) once the test's objects are deleted.
    pub fn owns_mount(&mut self, path: &Path) {
        self.mounts.push(path.into());
    }

    /// `kubectl delete -k <overlay>` when the test ends, unless [`NodeTest::deleted_overlay`].
    pub fn owns_overlay(&mut self, overlay: &Path) {
        self.overlays.push(overlay.into());
    }

    /// The test deleted this kustomize install itself.
    pub fn deleted_overlay(&mut self, overlay: &Path) {
        self.overlays.retain(|o| o != overlay);
    }

    /// `helm install` of `helm/cdn-operator` into `ns` as release `cdn-operator-<short>-<suffix>`,
    /// with the local images (`image.*`, `image.pullPolicy=IfNotPresent`, `managedPods.image`)
    /// and `args` (more `--set`s), then checks that its Deployment runs the local image. The CRDs:
    /// the chart's templates create them when absent and refuse to adopt those another release
    /// or `run.sh` installed, so they are applied first (server-side, as `run.sh` does:
    /// idempotent, also with installs running at once), and the chart takes them over
    /// (`--take-ownership`, Helm ≥ 3.17); they keep `helm.sh/resource-policy: keep`.
    pub async fn helm_install(&mut self, ns: &str, short: &str, args: &[String]) -> Release {
        install_crds(&self.client).await;
        let name = self.unique(&format!("cdn-operator-{short}"));
        let image = ImageRef::parse(&self.operator_image).expect("checked in new");
        let chart = repository_root().join("helm/cdn-operator");
        let mut command = Command::new(helm());
        command
            .args(["install", &name])
            .arg(&chart)
            .args(["--namespace", ns, "--take-ownership"])
            .args(["--timeout", TOOL_TIMEOUT])
            .args(self.local_images(&image))
            .args(args);
        self.releases.push((ns.into(), name.clone()));
        run(&mut command, &format!("helm install {name}"));
        let release = Release {
            namespace: ns.into(),
            fullname: name.clone(),
            name,
        };
        let deployment: Deployment = Api::namespaced(self.client.clone(), ns)
            .get(&release.fullname)
            .await
            .unwrap_or_else(|e| panic!("the chart's Deployment {}: {e}", release.fullname));
        let container = &deployment
            .spec
            .expect("spec")
            .template
            .spec
            .expect("pod spec")
            .containers[0];
        assert_eq!(
            container.image.as_deref(),
            Some(self.operator_image.as_str()),
            "the chart runs the local image"
        );
        assert_eq!(container.image_pull_policy.as_deref(), Some("IfNotPresent"));
        release
    }

    /// The chart's values for the local images. Strings as strings: a tag such as 1.30 would
    /// be a number to `--set`.
    fn local_images(&self, image: &ImageRef) -> Vec<String> {
        vec![
            format!("--set-string=image.registry={}", image.registry),
            format!("--set-string=image.repository={}", image.repository),
            format!("--set-string=image.tag={}", image.tag),
            format!("--set-string=image.digest={}", image.digest),
            "--set-string=image.pullPolicy=IfNotPresent".into(),
            format!("--set-string=managedPods.image={}", self.nginx_image),
        ]
    }

    /// `helm template` of `release` as [`NodeTest::helm_install`] installed it with `args`,
    /// plus `more` (values that render what the cluster cannot install, such as the
    /// Prometheus Operator's kinds): the rendered manifests.
    pub fn helm_template(&self, release: &Release, args: &[String], more: &[String]) -> String {
        let image = ImageRef::parse(&self.operator_image).expect("checked in new");
        let mut command = Command::new(helm());
        command
            .args(["template", &release.name])
            .arg(repository_root().join("helm/cdn-operator"))
            .args(["--namespace", &release.namespace])
            .args(self.local_images(&image))
            .args(args)
            .args(more);
        run(&mut command, &format!("helm template {}", release.name))
    }

    /// `helm uninstall --wait` of `release`, on a thread of its own (the test's tasks run
    /// meanwhile): its output (the caller asserts on it).
    pub async fn helm_uninstall(&mut self, release: &Release) -> Output {
        self.releases
            .retain(|(ns, name)| !(ns == &release.namespace && name == &release.name));
        let mut command = Command::new(helm());
        command
            .args([
                "uninstall",
                &release.name,
                "--namespace",
                &release.namespace,
            ])
            .args(["--wait", "--timeout", TOOL_TIMEOUT]);
        tokio::task::spawn_blocking(move || command.output().expect("running helm"))
            .await
            .expect("helm uninstall")
    }
}

impl Drop for NodeTest {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "===== node test {} failed; namespaces {:?}",
                self.test, self.namespaces
            );
            for ns in &self.namespaces {
                eprintln!("{}", diagnostics(ns));
            }
        }
        // The releases first: the pre-delete hook releases the At pods, and the cluster-scoped
        // RBAC goes with them.
        for (ns, name) in std::mem::take(&mut self.releases) {
            // The hook Job gets 2 minutes here: a failed test may have left no pod able to
            // start; then the release goes without it.
            let uninstall = |extra: &[&str]| {
                Command::new(helm())
                    .args(["uninstall", &name, "--namespace", &ns, "--timeout", "2m"])
                    .args(extra)
                    .output()
            };
            match uninstall(&[]) {
                Ok(out) if out.status.success() => {}
                other => {
                    eprintln!("node cleanup: helm uninstall {name}: {}", outcome(&other));
                    let again = uninstall(&["--no-hooks"]);
                    if !matches!(&again, Ok(o) if o.status.success()) {
                        eprintln!(
                            "node cleanup: helm uninstall --no-hooks {name}: {}",
                            outcome(&again)
                        );
                    }
                }
            }
        }
        for overlay in std::mem::take(&mut self.overlays) {
            let out = Command::new("kubectl")
                .args(["delete", "--ignore-not-found", "--timeout=3m", "-k"])
                .arg(&overlay)
                .output();
            if !matches!(&out, Ok(o) if o.status.success()) {
                eprintln!(
                    "node cleanup: kubectl delete -k {}: {}",
                    overlay.display(),
                    outcome(&out)
                );
            }
        }
        let namespaces = std::mem::take(&mut self.namespaces);
        let mut cluster_scoped = std::mem::take(&mut self.cluster_scoped);
        let result = on_own_thread(async move {
            let mut errors = Vec::new();
            for ns in namespaces {
                if let Err(error) = cleanup(ns, std::mem::take(&mut cluster_scoped)).await {
                    errors.push(error);
                }
            }
            errors
        });
        match result {
            Ok(errors) => errors
                .iter()
                .for_each(|e| eprintln!("node cleanup of {}: {e}", self.test)),
            Err(_) => eprintln!("node cleanup of {} panicked", self.test),
        }
        // Lazily: a pod of the deleted namespaces may still be leaving it.
        for mount in std::mem::take(&mut self.mounts) {
            let out = Command::new("umount").arg("-l").arg(&mount).output();
            if !matches!(&out, Ok(o) if o.status.success()) {
                eprintln!(
                    "node cleanup: umount {}: {}",
                    mount.display(),
                    outcome(&out)
                );
            }
        }
    }
}
