//! The node mode of the end-to-end suite (issue 39): the operator installed from its own image
//! (Helm, kustomize) into a cluster with a Ready node, and the CDN's nginx pods serving through
//! Services. What `e2e/tests/node.rs` shares: the skip (no cluster, no Ready node, no images),
//! fresh namespaces under restricted Pod Security, `helm` and `kubectl` (the user's tools, their
//! exit status checked and their stderr shown), the operator's pods and Lease, `/metrics`
//! through its Service, plain HTTP to a Service's ClusterIP, and a guard that prints the pods'
//! state and logs when a test fails and uninstalls and deletes what the test made, also then.

use crate::{cleanup, eventually, install_crds, reach, repository_root, say, USER_MANAGER};
use cdn_operator::api::{CdnCluster, State};
use cdn_operator_testkit::http::{Reply, Response, REQUEST_TIMEOUT};
use cdn_operator_testkit::on_own_thread;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service, ServiceAccount};
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Client, ResourceExt};
use serde_json::json;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::path::{Component, Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;
use tokio::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// The operator's image, present in the node's container runtime (e.g. `localhost/cdn-operator:e2e`).
pub const OPERATOR_IMAGE_ENV: &str = "CDN_E2E_OPERATOR_IMAGE";
/// The nginx image of the CDN's pods, the At pods and the tests' origin (e.g. `localhost/cdn-nginx:1.30`).
pub const NGINX_IMAGE_ENV: &str = "CDN_E2E_NGINX_IMAGE";
/// Busybox without nginx (the node's sandbox image, e.g. `localhost/cdn-e2e-pause:1`): a
/// CdnCluster running it crash-loops (`cksum: not found`, exit 127). Only the test of pods that
/// cannot run needs it.
pub const PAUSE_IMAGE_ENV: &str = "CDN_E2E_PAUSE_IMAGE";
/// The nginx image run as root (`USER 0:0`, e.g. `localhost/cdn-nginx-root:1.30`): refused under
/// `runAsNonRoot`. Only the test of pods that cannot run needs it.
pub const ROOT_IMAGE_ENV: &str = "CDN_E2E_ROOT_IMAGE";
/// The Lease every install path elects its leader on (`--leader-election-id`, Helm
/// `leaderElection.id`), in the operator's namespace.
pub const LEASE: &str = "cdn-operator-leader";
/// The operator's pods, in every install path.
pub const OPERATOR_PODS: &str =
    "app.kubernetes.io/name=cdn-operator,app.kubernetes.io/component=operator";
/// The replicas every install path runs by default (Helm `replicaCount`, kustomize base).
pub const OPERATOR_REPLICAS: usize = 2;
/// How long an install gets until its pods are Ready (images present: seconds, but a first test
/// on a busy 2-core machine may take a minute or two).
pub const INSTALL_WAIT: Duration = Duration::from_secs(240);
/// How long `helm` and `kubectl` operations may wait (hooks, deletions).
pub const TOOL_TIMEOUT: &str = "5m";

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

/// An image reference split as the chart and kustomize's `images:` take it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageRef {
    /// The registry host (and port), when the reference names one; else empty.
    pub registry: String,
    pub repository: String,
    pub tag: String,
    /// `sha256:…`, or empty.
    pub digest: String,
}

impl ImageRef {
    /// Splits `reference` (`[registry/]repository[:tag][@digest]`). The first path component is
    /// a registry when it has a `.` or a `:`, or is `localhost`, as the container runtimes read
    /// it. A reference must pin a tag other than `latest`, or a digest: the operator's pods take
    /// Kubernetes' default pull policy, which is `Always` for `latest` (no registry answers here).
    pub fn parse(reference: &str) -> Result<ImageRef, String> {
        let (name, digest) = match reference.split_once('@') {
            Some((name, digest)) => (name, digest.to_string()),
            None => (reference, String::new()),
        };
        let slash = name.rfind('/').map_or(0, |i| i + 1);
        let (name, tag) = match name[slash..].rfind(':') {
            Some(i) => (&name[..slash + i], name[slash + i + 1..].to_string()),
            None => (name, String::new()),
        };
        let (registry, repository) = match name.split_once('/') {
            Some((first, rest))
                if first.contains('.') || first.contains(':') || first == "localhost" =>
            {
                (first.to_string(), rest.to_string())
            }
            _ => (String::new(), name.to_string()),
        };
        if repository.is_empty() || reference.chars().any(char::is_whitespace) {
            return Err(format!("`{reference}` is not an image reference"));
        }
        if digest.is_empty() && (tag.is_empty() || tag == "latest") {
            return Err(format!(
                "`{reference}` must name a tag other than `latest` (or a digest): the pods pull \
                 `latest` Always, and no registry is reachable"
            ));
        }
        Ok(ImageRef {
            registry,
            repository,
            tag,
            digest,
        })
    }

    /// `registry/repository`, or the repository alone.
    pub fn name(&self) -> String {
        if self.registry.is_empty() {
            self.repository.clone()
        } else {
            format!("{}/{}", self.registry, self.repository)
        }
    }
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
            _lock: lock,
        })
    }

    /// The image named by `variable` beyond the two every test needs ([`PAUSE_IMAGE_ENV`],
    /// [`ROOT_IMAGE_ENV`]); when unset, one line (`node tests skipped: <test>: …`) and `None`.
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
            // Strings as strings: a tag such as 1.30 would be a number to --set.
            .arg(format!("--set-string=image.registry={}", image.registry))
            .arg(format!(
                "--set-string=image.repository={}",
                image.repository
            ))
            .arg(format!("--set-string=image.tag={}", image.tag))
            .arg(format!("--set-string=image.digest={}", image.digest))
            .arg("--set-string=image.pullPolicy=IfNotPresent")
            .arg(format!(
                "--set-string=managedPods.image={}",
                self.nginx_image
            ))
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
    }
}

fn outcome(output: &std::io::Result<Output>) -> String {
    match output {
        Ok(o) => format!(
            "{}: {}{}",
            o.status,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
        Err(e) => e.to_string(),
    }
}

/// Whether the node reports Ready.
pub fn node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Whether the pod is Ready and not being deleted.
pub fn pod_ready(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// `helm`: `HELM`, else `helm` on PATH, else where `scripts/install-helm.sh` puts it for the
/// artifact checks (`~/.cache/cdn-operator-tools/bin/helm`).
pub fn helm() -> PathBuf {
    if let Some(path) = std::env::var_os("HELM").filter(|p| !p.is_empty()) {
        return path.into();
    }
    let on_path = std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|dir| dir.join("helm").is_file()))
        .unwrap_or(false);
    if on_path {
        return "helm".into();
    }
    let cached = std::env::var_os("HOME")
        .map(|home| PathBuf::from(home).join(".cache/cdn-operator-tools/bin/helm"))
        .filter(|p| p.is_file());
    cached.unwrap_or_else(|| {
        panic!("no helm: set HELM, put helm on PATH, or run scripts/install-helm.sh ~/.cache/cdn-operator-tools")
    })
}

/// Runs `command` to the end: its stdout; panics with its exit status, stdout and stderr when
/// it fails.
pub fn run(command: &mut Command, what: &str) -> String {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run {:?}: {e}", command.get_program()));
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{what} failed ({}):\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// What a failing test prints of namespace `ns`: its objects, the CdnClusters' and Ats' status,
/// its Events, `kubectl describe pods`, and every pod's logs (all containers, the previous run's
/// too where a container restarted).
pub fn diagnostics(ns: &str) -> String {
    let kubectl = |args: &[&str]| -> String {
        let shown = format!("--- $ kubectl {} -n {ns}", args.join(" "));
        match Command::new("kubectl").args(args).args(["-n", ns]).output() {
            Ok(out) => format!(
                "{shown}\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
            Err(e) => format!("{shown}\n{e}\n"),
        }
    };
    let mut text = String::new();
    text += &kubectl(&[
        "get",
        "pods,deployments,replicasets,services,endpointslices,jobs,leases",
        "-o",
        "wide",
    ]);
    text += &kubectl(&["get", "cdnclusters,ats", "-o", "yaml"]);
    text += &kubectl(&["get", "events", "--sort-by=.lastTimestamp"]);
    text += &kubectl(&["describe", "pods"]);
    let pods = Command::new("kubectl")
        .args(["get", "pods", "-o", "name", "-n", ns])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    for pod in pods.lines().filter(|l| !l.is_empty()) {
        text += &kubectl(&["logs", pod, "--all-containers", "--prefix", "--tail=300"]);
        let previous = Command::new("kubectl")
            .args([
                "logs",
                pod,
                "--all-containers",
                "--prefix",
                "--previous",
                "-n",
                ns,
            ])
            .output();
        if let Some(out) = previous
            .ok()
            .filter(|o| o.status.success() && !o.stdout.is_empty())
        {
            text += &format!(
                "--- previous run of {pod}\n{}",
                String::from_utf8_lossy(&out.stdout)
            );
        }
    }
    text
}

/// Waits until `count` pods of `ns` match `selector`, all Ready (none being deleted).
pub async fn ready_pods(
    client: &Client,
    ns: &str,
    selector: &str,
    count: usize,
    within: Duration,
) -> Vec<Pod> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    eventually(
        &format!("{count} Ready pods {selector} in {ns}"),
        within,
        || async {
            let list = pods
                .list(&ListParams::default().labels(selector))
                .await
                .ok()?;
            let live: Vec<Pod> = list
                .items
                .into_iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .collect();
            (live.len() == count && live.iter().all(pod_ready)).then_some(live)
        },
    )
    .await
}

/// Waits until no pod of `ns` matches `selector` any more.
pub async fn pods_gone(client: &Client, ns: &str, selector: &str, within: Duration) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    eventually(&format!("no pod {selector} in {ns}"), within, || async {
        let list = pods
            .list(&ListParams::default().labels(selector))
            .await
            .ok()?;
        list.items.is_empty().then_some(())
    })
    .await
}

/// The holder of Lease `lease` of `ns`, when one holds it.
pub async fn lease_holder(client: &Client, ns: &str, lease: &str) -> Option<String> {
    Api::<Lease>::namespaced(client.clone(), ns)
        .get_opt(lease)
        .await
        .ok()??
        .spec?
        .holder_identity
        .filter(|h| !h.is_empty())
}

/// The operator's replicas in `ns` all Ready ([`OPERATOR_REPLICAS`]) and one of them holding
/// [`LEASE`]: the pods, and the leader's name.
pub async fn operator_ready_and_leading(client: &Client, ns: &str) -> (Vec<Pod>, String) {
    let pods = ready_pods(client, ns, OPERATOR_PODS, OPERATOR_REPLICAS, INSTALL_WAIT).await;
    let names: Vec<String> = pods.iter().map(|p| p.name_any()).collect();
    let leader = eventually(
        &format!("Lease {LEASE} of {ns} held by one of {names:?}"),
        Duration::from_secs(60),
        || async {
            lease_holder(client, ns, LEASE)
                .await
                .filter(|h| names.contains(h))
        },
    )
    .await;
    (pods, leader)
}

/// Creates ServiceAccount `name` in `ns`.
pub async fn service_account(client: &Client, ns: &str, name: &str) {
    let account: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": name}})).expect("a ServiceAccount");
    Api::<ServiceAccount>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &account)
        .await
        .unwrap_or_else(|e| panic!("ServiceAccount {ns}/{name}: {e}"));
}

/// A token of ServiceAccount `name` of `ns` from the TokenRequest API (`create` on
/// `serviceaccounts/token`), valid 10 minutes.
pub async fn token(client: &Client, ns: &str, name: &str) -> String {
    let request = TokenRequest {
        // No audience: the API server's own, which its TokenReview accepts.
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(600),
            ..Default::default()
        }),
        ..Default::default()
    };
    Api::<ServiceAccount>::namespaced(client.clone(), ns)
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .unwrap_or_else(|e| panic!("a token of {ns}/{name}: {e}"))
        .status
        .and_then(|s| s.token)
        .expect("the TokenRequest's token")
}

/// The address of Service `name` of `ns` on its port `port_name`: its ClusterIP, which this host
/// reaches through kube-proxy.
pub async fn service_address(client: &Client, ns: &str, name: &str, port_name: &str) -> SocketAddr {
    let service = Api::<Service>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .unwrap_or_else(|e| panic!("Service {ns}/{name}: {e}"));
    let spec = service.spec.expect("the Service's spec");
    let ip: IpAddr = spec
        .cluster_ip
        .as_deref()
        .and_then(|ip| ip.parse().ok())
        .unwrap_or_else(|| {
            panic!(
                "Service {ns}/{name} has no ClusterIP: {:?}",
                spec.cluster_ip
            )
        });
    let port = spec
        .ports
        .unwrap_or_default()
        .into_iter()
        .find(|p| p.name.as_deref() == Some(port_name))
        .unwrap_or_else(|| panic!("Service {ns}/{name} has no port {port_name}"))
        .port;
    SocketAddr::new(ip, port as u16)
}

/// `/metrics` of the operator through its Service `service` of `ns` (ClusterIP, port `metrics`,
/// HTTPS; the certificate is self-signed, so its chain is not verified, as the chart's
/// ServiceMonitor's `insecureSkipVerify`; its handshake signature is): 401 without a token, 403
/// with the token of `denied` (a ServiceAccount of `ns` with no binding), 200 and the controller
/// metrics with the token of `allowed` (bound to the install's metrics-reader ClusterRole).
pub async fn check_metrics(client: &Client, ns: &str, service: &str, allowed: &str, denied: &str) {
    let addr = service_address(client, ns, service, "metrics").await;
    let get = |token: Option<String>| {
        std::thread::spawn(move || {
            cdn_operator_testkit::http::https_get_at(addr, "/metrics", "*/*", token.as_deref())
        })
        .join()
        .expect("the HTTPS client")
    };
    // The first answer through a new Service may take a moment (kube-proxy's rules).
    let anonymous: Reply = eventually(
        &format!("an HTTPS answer from {service} at {addr}"),
        Duration::from_secs(60),
        || std::future::ready(get(None)),
    )
    .await;
    assert_eq!(anonymous.status, 401, "no token: {}", anonymous.body);

    let denied_token = token(client, ns, denied).await;
    let refused = get(Some(denied_token)).expect("an HTTPS reply");
    let user = format!("system:serviceaccount:{ns}:{denied}");
    assert_eq!(
        refused.status, 403,
        "a token without the role: {}",
        refused.body
    );
    assert!(refused.body.contains(&user), "{}", refused.body);

    // RBAC reaches the authorizer within seconds; a denial the operator cached (30 s) expires.
    let allowed_token = token(client, ns, allowed).await;
    let scraped = eventually(
        &format!("200 from /metrics of {service} for {allowed}"),
        Duration::from_secs(120),
        || {
            let reply = get(Some(allowed_token.clone()));
            std::future::ready(reply.filter(|r| r.status == 200))
        },
    )
    .await;
    for metric in [
        "controller_runtime_reconcile_total",
        "leader_election_master_status",
    ] {
        assert!(
            scraped.body.contains(metric),
            "{metric} in /metrics:\n{}",
            scraped.body
        );
    }
}

/// Binds ClusterRole `role` to ServiceAccount `account` of `ns` with ClusterRoleBinding `name`,
/// deleted with the test.
pub async fn bind_cluster_role(
    test: &mut NodeTest,
    name: &str,
    role: &str,
    ns: &str,
    account: &str,
) {
    let binding: k8s_openapi::api::rbac::v1::ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app.kubernetes.io/part-of": "cdn-operator-e2e"}},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": ns}],
    }))
    .expect("a ClusterRoleBinding");
    Api::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>::all(test.client.clone())
        .create(&PostParams::default(), &binding)
        .await
        .unwrap_or_else(|e| panic!("ClusterRoleBinding {name}: {e}"));
    test.owns_cluster_scoped(
        GroupVersionKind::gvk("rbac.authorization.k8s.io", "v1", "ClusterRoleBinding"),
        name,
    );
}

/// Server-side applies CdnCluster `name` of `ns` with `spec` (raw JSON), as a user would.
pub async fn apply_cluster(client: &Client, ns: &str, name: &str, spec: serde_json::Value) {
    let object: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cluster.anevia.com/v1", "kind": "CdnCluster",
        "metadata": {"name": name, "namespace": ns}, "spec": spec,
    }))
    .expect("a CdnCluster");
    let resource = ApiResource::erase::<CdnCluster>(&());
    Api::<DynamicObject>::namespaced_with(client.clone(), ns, &resource)
        .patch(
            name,
            &PatchParams::apply(USER_MANAGER),
            &Patch::Apply(&object),
        )
        .await
        .unwrap_or_else(|e| panic!("CdnCluster {ns}/{name}: {e}"));
}

/// The pods of CdnCluster `name` (the seed's label `deployment: <name>-deployment`).
pub fn cluster_pods(name: &str) -> String {
    format!("deployment={name}-deployment")
}

/// Waits until CdnCluster `name` of `ns` is `Running` for its current generation with its
/// `Ready` condition `True`, its Deployment available with every replica updated, and its
/// `replicas` pods Ready: those pods.
pub async fn cluster_running(client: &Client, ns: &str, name: &str, within: Duration) -> Vec<Pod> {
    let clusters: Api<CdnCluster> = Api::namespaced(client.clone(), ns);
    let replicas = eventually(
        &format!("CdnCluster {ns}/{name} Running and Ready"),
        within,
        || async {
            let cluster = clusters.get_opt(name).await.ok()??;
            let status = cluster.status.as_ref()?;
            let current = status.observed_generation == cluster.metadata.generation;
            let ready = status
                .conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            (current && ready && status.state == Some(State::Running))
                .then_some(cluster.spec.replicas)
        },
    )
    .await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let deployment = format!("{name}-deployment");
    eventually(
        &format!("Deployment {ns}/{deployment} available"),
        within,
        || async {
            let d = deployments.get_opt(&deployment).await.ok()??;
            let status = d.status?;
            let available = status
                .conditions
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Available" && c.status == "True");
            let all = status.updated_replicas == Some(replicas)
                && status.ready_replicas == Some(replicas)
                && status.replicas == Some(replicas);
            (available && all).then_some(())
        },
    )
    .await;
    ready_pods(client, ns, &cluster_pods(name), replicas as usize, within).await
}

/// One plain HTTP/1.0 GET of `path` from `addr` (a Service's ClusterIP), the connection
/// closed by the server after the response: at most 3 s to connect, [`REQUEST_TIMEOUT`] to
/// answer (above the proxies' own timeouts). Runs on a thread of its own.
pub async fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<Response> {
    let path = path.to_string();
    tokio::task::spawn_blocking(move || {
        let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(3))?;
        stream.set_read_timeout(Some(REQUEST_TIMEOUT))?;
        write!(
            stream,
            "GET {path} HTTP/1.0\r\nHost: cdn.node-e2e.test\r\nUser-Agent: cdn-operator-e2e\r\n\r\n"
        )?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw)?;
        Response::parse(&raw)
    })
    .await
    .expect("the HTTP client")
}

/// The member of a pool that answered, from `X-Cdn-Upstream` (`$upstream_addr`: the addresses
/// tried, separated by `, ` within a group and ` : ` across groups; the last one answered).
pub fn answering_upstream(response: &Response) -> Option<String> {
    let value = response.header(cdn_operator::cdncluster::nginx::UPSTREAM_HEADER)?;
    value
        .split(", ")
        .flat_map(|part| part.split(" : "))
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .last()
        .map(str::to_string)
}

/// Tries `attempt` every 500 ms until it succeeds: its value; panics naming `what` and the last
/// failure after `within` (so a timeout shows what was seen last).
pub async fn until<T, F, Fut>(what: &str, within: Duration, mut attempt: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let deadline = std::time::Instant::now() + within;
    loop {
        let last = match attempt().await {
            Ok(value) => return value,
            Err(error) => error,
        };
        if std::time::Instant::now() >= deadline {
            panic!("timed out after {within:?} waiting for {what}; last seen: {last}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The body the tests' origin serves for every `/vod/` path (a static file: ranges answer 206,
/// as the caches' slices ask).
pub const ORIGIN_BODY: &str = "node-e2e origin body: the same bytes for every /vod/ path\n";
/// The header naming the origin pod that served a response (nginx's `$hostname`: the pod's name).
pub const ORIGIN_POD_HEADER: &str = "X-Origin-Pod";
/// The origin's pods.
pub const ORIGIN_PODS: &str = "app=origin";

/// The origin's nginx.conf: every request logged on stdout as `origin-request <method> <path>
/// <status>`; `/vod/*` the same static file; `/pv/*` a body naming the version asked for
/// (`X-Version`), `/pt/TAG/*` tagged `Surrogate-Key: TAG`; `/healthz` for the probe. Runs read-only as the
/// image's user: the pid file and nginx's temporary paths under the `/tmp` emptyDir.
const ORIGIN_CONF: &str = r#"# The origin of the node tests (e2e/src/node.rs).
pid /tmp/nginx.pid;
worker_processes 1;
error_log stderr notice;
events {
    worker_connections 256;
}
http {
    client_body_temp_path /tmp/client_body;
    proxy_temp_path /tmp/proxy;
    fastcgi_temp_path /tmp/fastcgi;
    uwsgi_temp_path /tmp/uwsgi;
    scgi_temp_path /tmp/scgi;
    # $request_uri: the path asked for ($uri is /body.ts once try_files found it).
    log_format origin 'origin-request $request_method $request_uri $status';
    map $http_x_version $version {
        "" 1;
        default $http_x_version;
    }
    access_log /dev/stdout origin;
    server {
        listen 8080;
        root /etc/nginx/origin;
        default_type video/mp2t;
        add_header X-Origin-Pod $hostname always;
        location = /healthz {
            access_log off;
            return 200 "ok
";
        }
        location /vod/ {
            try_files /body.ts =404;
        }
        # Versioned objects (the purge test): the body names the version the request asks for in
        # X-Version (1 without), as an origin that published a new version.
        location /pv/ {
            default_type text/plain;
            return 200 "v$version $uri
";
        }
        # Tagged objects (the purge test): Surrogate-Key names the tag in the path.
        location ~ ^/pt/(?<tag>[^/]+)/ {
            default_type text/plain;
            add_header Surrogate-Key $tag;
            return 200 "tagged $uri
";
        }
        location / {
            return 404;
        }
    }
}
"#;

/// Applies the origin of `ns` (server-side, idempotent): ConfigMap `origin` (its nginx.conf and
/// body), Deployment `origin` (one pod of `image` meeting the restricted Pod Security standard:
/// non-root, seccomp RuntimeDefault, no capability, no privilege escalation, read-only root
/// filesystem with an emptyDir on /tmp) and Service `origin` port 8080.
pub async fn apply_origin(client: &Client, ns: &str, image: &str) {
    let params = PatchParams::apply(USER_MANAGER);
    let config_map: k8s_openapi::api::core::v1::ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "origin"},
        "data": {"nginx.conf": ORIGIN_CONF, "body.ts": ORIGIN_BODY},
    }))
    .expect("a ConfigMap");
    Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), ns)
        .patch("origin", &params, &Patch::Apply(&config_map))
        .await
        .unwrap_or_else(|e| panic!("ConfigMap {ns}/origin: {e}"));
    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "origin"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "origin"}},
            "template": {
                "metadata": {"labels": {"app": "origin"}},
                "spec": {
                    "automountServiceAccountToken": false,
                    "securityContext": {
                        "runAsNonRoot": true,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [{
                        "name": "origin",
                        "image": image,
                        "imagePullPolicy": "IfNotPresent",
                        "command": ["nginx", "-e", "stderr", "-c", "/etc/nginx/origin/nginx.conf",
                                    "-g", "daemon off;"],
                        "ports": [{"name": "http", "containerPort": 8080}],
                        "readinessProbe": {
                            "httpGet": {"path": "/healthz", "port": "http"},
                            "periodSeconds": 2,
                        },
                        "resources": {
                            "requests": {"cpu": "10m", "memory": "16Mi"},
                            "limits": {"memory": "64Mi"},
                        },
                        "securityContext": {
                            "allowPrivilegeEscalation": false,
                            "readOnlyRootFilesystem": true,
                            "runAsNonRoot": true,
                            "capabilities": {"drop": ["ALL"]},
                            "seccompProfile": {"type": "RuntimeDefault"},
                        },
                        "volumeMounts": [
                            {"name": "conf", "mountPath": "/etc/nginx/origin", "readOnly": true},
                            {"name": "tmp", "mountPath": "/tmp"},
                        ],
                    }],
                    "volumes": [
                        {"name": "conf", "configMap": {"name": "origin"}},
                        {"name": "tmp", "emptyDir": {}},
                    ],
                },
            },
        },
    }))
    .expect("a Deployment");
    Api::<Deployment>::namespaced(client.clone(), ns)
        .patch("origin", &params, &Patch::Apply(&deployment))
        .await
        .unwrap_or_else(|e| panic!("Deployment {ns}/origin: {e}"));
    let service: Service = serde_json::from_value(json!({
        "metadata": {"name": "origin"},
        "spec": {
            "selector": {"app": "origin"},
            "ports": [{"name": "http", "port": 8080, "targetPort": "http"}],
        },
    }))
    .expect("a Service");
    Api::<Service>::namespaced(client.clone(), ns)
        .patch("origin", &params, &Patch::Apply(&service))
        .await
        .unwrap_or_else(|e| panic!("Service {ns}/origin: {e}"));
}

/// How many requests for `path` origin pod `pod` of `ns` logged.
pub async fn origin_requests(client: &Client, ns: &str, pod: &str, path: &str) -> usize {
    let params = kube::api::LogParams {
        container: Some("origin".into()),
        ..Default::default()
    };
    let logs = Api::<Pod>::namespaced(client.clone(), ns)
        .logs(pod, &params)
        .await
        .unwrap_or_else(|e| panic!("the logs of {ns}/{pod}: {e}"));
    let line = format!("origin-request GET {path} ");
    logs.lines().filter(|l| l.starts_with(&line)).count()
}

/// `to` relative to directory `from`, both absolute: kustomize refuses absolute resource paths.
pub fn relative_path(from: &Path, to: &Path) -> PathBuf {
    let from: Vec<Component> = from.components().collect();
    let to: Vec<Component> = to.components().collect();
    let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
    let mut path = PathBuf::new();
    for _ in common..from.len() {
        path.push("..");
    }
    for component in &to[common..] {
        path.push(component.as_os_str());
    }
    path
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(registry: &str, repository: &str, tag: &str, digest: &str) -> ImageRef {
        ImageRef {
            registry: registry.into(),
            repository: repository.into(),
            tag: tag.into(),
            digest: digest.into(),
        }
    }

    #[test]
    fn image_references_split_as_the_chart_takes_them() {
        let digest = format!("sha256:{}", "a".repeat(64));
        let cases = [
            (
                "localhost/cdn-operator:e2e",
                image("localhost", "cdn-operator", "e2e", ""),
            ),
            (
                "localhost/cdn-nginx:1.30",
                image("localhost", "cdn-nginx", "1.30", ""),
            ),
            (
                "registry.example.com:5000/team/cdn-operator:0.2.0",
                image(
                    "registry.example.com:5000",
                    "team/cdn-operator",
                    "0.2.0",
                    "",
                ),
            ),
            (
                "anevia/cdn-operator:dev",
                image("", "anevia/cdn-operator", "dev", ""),
            ),
            ("cdn-operator:e2e", image("", "cdn-operator", "e2e", "")),
            (
                &format!("ghcr.io/anevia/cdn-operator@{digest}"),
                image("ghcr.io", "anevia/cdn-operator", "", &digest),
            ),
        ];
        for (reference, expected) in cases {
            let parsed = ImageRef::parse(reference).unwrap();
            assert_eq!(parsed, expected, "{reference}");
            let rebuilt = match (parsed.tag.is_empty(), parsed.digest.is_empty()) {
                (false, true) => format!("{}:{}", parsed.name(), parsed.tag),
                (true, false) => format!("{}@{}", parsed.name(), parsed.digest),
                _ => unreachable!(),
            };
            assert_eq!(rebuilt, reference);
        }
        for refused in ["localhost/cdn-operator", "cdn-operator:latest", "", "a b:1"] {
            assert!(ImageRef::parse(refused).is_err(), "{refused}");
        }
    }

    #[test]
    fn the_overlay_reaches_the_base_by_a_relative_path() {
        assert_eq!(
            relative_path(
                Path::new("/tmp/.tmpAbC"),
                Path::new("/work/x/kustomize/base")
            ),
            PathBuf::from("../../work/x/kustomize/base")
        );
        assert_eq!(
            relative_path(Path::new("/work/x/t"), Path::new("/work/x/kustomize/base")),
            PathBuf::from("../kustomize/base")
        );
    }

    #[test]
    fn the_answering_member_is_the_last_address() {
        let response = |value: &str| Response {
            status: 200,
            headers: vec![("X-Cdn-Upstream".into(), value.into())],
            body: String::new(),
        };
        assert_eq!(
            answering_upstream(&response("10.88.0.5:8080")).as_deref(),
            Some("10.88.0.5:8080")
        );
        assert_eq!(
            answering_upstream(&response("10.88.0.5:8080, 10.88.0.6:8080")).as_deref(),
            Some("10.88.0.6:8080")
        );
        assert_eq!(
            answering_upstream(&response("10.88.0.5:8080 : 10.88.0.7:8080")).as_deref(),
            Some("10.88.0.7:8080")
        );
    }

    #[test]
    fn a_response_is_parsed_with_its_headers() {
        let raw = b"HTTP/1.1 200 OK\r\nX-Cache-Status: MISS\r\nContent-Length: 3\r\n\r\nabc";
        let response = Response::parse(raw).unwrap();
        assert_eq!(response.status, 200);
        assert_eq!(response.header("x-cache-status"), Some("MISS"));
        assert_eq!(response.body, "abc");
    }
}
