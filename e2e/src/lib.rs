//! The end-to-end harness: reach the cluster of `KUBECONFIG` (or skip with one line), install the
//! CRDs, run the built operator binary out of cluster, give each test a fresh namespace, and clean
//! up afterwards, also when a test fails (printing the operator's logs then).

pub mod canary;
pub mod cluster_dns;
pub mod proxy;

pub mod monitoring;
pub mod node;

use cdn_operator::api::CdnCluster;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use kube::discovery::pinned_kind;
use kube::{Client, Config, Resource, ResourceExt};
use serde_json::json;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

// The process handle, polling and metric parsing are the tests' (testkit/), shared.
pub use cdn_operator_testkit::{eventually, Operator, Usage};
use cdn_operator_testkit::{free_port, http_get, on_own_thread, poll};

/// How long the API server gets to answer before the suite decides there is no cluster.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The field manager of the objects the tests create, as a user would.
pub const USER_MANAGER: &str = "e2e-user";

/// Prints one line on the real stderr, past the test harness's capture, so a skip is visible in
/// `cargo test` output without `--nocapture`.
pub fn say(line: &str) {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "{line}");
}

/// Selects rustls's ring provider for this process. Needed before any kube client exists: when
/// both ring and aws-lc-rs are compiled in (test builds), rustls cannot choose by itself.
pub fn crypto() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A client for the cluster of `KUBECONFIG` when one answers; otherwise one line saying why
/// (`<what> skipped: …`), and `None`, so the caller passes without testing anything.
pub async fn connect(what: &str) -> Option<Client> {
    match reach().await {
        Ok(client) => Some(client),
        Err(error) => {
            say(&format!("{what} skipped: {error}"));
            None
        }
    }
}

/// A client for the cluster of `KUBECONFIG` once its API server has answered within
/// [`CONNECT_TIMEOUT`]; otherwise why not (`no reachable Kubernetes API (KUBECONFIG=…): …`).
pub async fn reach() -> Result<Client, String> {
    crypto();
    let kubeconfig = std::env::var("KUBECONFIG").unwrap_or_else(|_| "unset".into());
    let attempt = async {
        let config = Config::infer().await.map_err(|e| e.to_string())?;
        let client = Client::try_from(config).map_err(|e| e.to_string())?;
        tokio::time::timeout(CONNECT_TIMEOUT, client.apiserver_version())
            .await
            .map_err(|_| format!("no answer within {CONNECT_TIMEOUT:?}"))?
            .map_err(|e| e.to_string())?;
        Ok::<_, String>(client)
    };
    attempt
        .await
        .map_err(|error| format!("no reachable Kubernetes API (KUBECONFIG={kubeconfig}): {error}"))
}

/// Installs or updates the CRDs as `run.sh` does (server-side apply, manager `cdn-operator`) and
/// waits until the API server serves them.
pub async fn install_crds(client: &Client) {
    apply_crds(client, &cdn_operator::api::crds()).await;
}

/// Installs or updates `crds` as `run.sh` does (the current ones, or a release's for the upgrade
/// test) and waits until the API server serves them.
pub async fn apply_crds(client: &Client, crds: &[CustomResourceDefinition]) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply(cdn_operator::kubernetes::record::FIELD_MANAGER).force();
    for crd in crds {
        let name = crd.name_any();
        api.patch(&name, &params, &Patch::Apply(crd))
            .await
            .unwrap_or_else(|e| panic!("installing the CRD {name}: {e}"));
        eventually(
            &format!("CRD {name} Established"),
            Duration::from_secs(60),
            || async {
                let crd = api.get(&name).await.ok()?;
                let established = crd
                    .status?
                    .conditions?
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True");
                established.then_some(())
            },
        )
        .await;
    }
}

/// The operator binary: `CDN_OPERATOR_BIN`, else `target/debug/cdn-operator` of this workspace
/// (built by `cargo build` or by `cargo test --workspace`, which builds the root package's binary).
pub fn operator_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("CDN_OPERATOR_BIN") {
        return path.into();
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("e2e/ is inside the repository");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let path = target.join("debug").join("cdn-operator");
    assert!(
        path.exists(),
        "no operator binary at {}: run `cargo build` first or set CDN_OPERATOR_BIN",
        path.display()
    );
    path
}

/// The repository root (for the shipped manifests).
pub fn repository_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("e2e/ is inside the repository")
        .to_path_buf()
}

/// The first of `candidates` that `cdn-operator run --help` documents: flag names that differ
/// between releases are looked up rather than guessed.
pub fn run_flag(candidates: &[&str]) -> Option<String> {
    let output = Command::new(operator_binary())
        .args(["run", "--help"])
        .output()
        .ok()?;
    let help = String::from_utf8_lossy(&output.stdout);
    candidates
        .iter()
        .find(|flag| {
            help.split(|c: char| c.is_whitespace() || c == ',' || c == '=' || c == '<')
                .any(|word| word == **flag)
        })
        .map(|flag| flag.to_string())
}

/// How to start one operator process.
#[derive(Clone, Debug, Default)]
pub struct OperatorOptions {
    /// Watch only this namespace (`--namespace`); `None`: every namespace.
    pub namespace: Option<String>,
    /// Leader election: the Lease's namespace and name. `None`: `--leader-elect=false`.
    pub lease: Option<(String, String)>,
    /// A kubeconfig other than the test's (impersonation, the benchmark's counting proxy).
    pub kubeconfig: Option<PathBuf>,
    /// Extra arguments to `cdn-operator run`.
    pub args: Vec<String>,
}

impl OperatorOptions {
    /// Starts `cdn-operator run` as `identity`, its output captured, and waits until its health
    /// endpoint answers.
    pub async fn start(&self, identity: &str) -> Operator {
        self.start_binary(identity, &operator_binary()).await
    }

    /// [`OperatorOptions::start`] with another binary (a previous release's, for the upgrade
    /// test).
    pub async fn start_binary(&self, identity: &str, binary: &Path) -> Operator {
        let (health, metrics) = (free_port(), free_port());
        let mut command = Command::new(binary);
        command
            .arg("run")
            .arg(format!("--health-probe-bind-address=127.0.0.1:{health}"))
            .arg(format!("--metrics-bind-address=127.0.0.1:{metrics}"))
            .arg("--log-format=text")
            .env("POD_NAME", identity)
            .env(
                "RUST_LOG",
                std::env::var("E2E_OPERATOR_LOG").unwrap_or_else(|_| "info,kube=warn".into()),
            );
        if let Some(namespace) = &self.namespace {
            command.arg(format!("--namespace={namespace}"));
        }
        match &self.lease {
            None => {
                command.arg("--leader-elect=false");
            }
            Some((namespace, name)) => {
                command
                    .arg("--leader-elect=true")
                    .arg(format!("--leader-election-namespace={namespace}"))
                    .arg(format!("--leader-election-id={name}"))
                    .env("POD_NAMESPACE", namespace);
            }
        }
        if let Some(kubeconfig) = &self.kubeconfig {
            command.env("KUBECONFIG", kubeconfig);
        }
        // Scraped over plain HTTP unless a test asks for the secured endpoint.
        if !self.args.iter().any(|a| a.starts_with("--metrics-secure")) {
            command.arg("--metrics-secure=false");
        }
        command.args(&self.args);
        let mut operator = Operator::spawn(identity, command);
        (operator.probes, operator.metrics) = (health, metrics);
        let healthy = poll(Duration::from_secs(30), Duration::from_millis(100), || {
            if let Some(status) = operator.exited() {
                panic!(
                    "operator {identity} exited at start ({status}):\n{}",
                    operator.logs()
                );
            }
            std::future::ready(
                http_get(health, "/healthz")
                    .is_some_and(|r| r.status == 200)
                    .then_some(()),
            )
        })
        .await;
        if healthy.is_none() {
            panic!(
                "operator {identity}: /healthz on port {health} did not answer 200 within 30s:\n{}",
                operator.logs()
            );
        }
        operator
    }
}

/// One test's world: a client, a fresh namespace, the operators it started and the
/// cluster-scoped objects it made. Dropping it stops the operators and deletes all of it; when
/// the test is failing, the operators' logs are printed first.
pub struct Env {
    pub client: Client,
    pub ns: String,
    pub test: String,
    pub dir: tempfile::TempDir,
    pub operators: Vec<Operator>,
    cluster_scoped: Vec<(GroupVersionKind, String)>,
}

impl Env {
    /// Connects (or skips: `None`), installs the CRDs and creates the test's namespace.
    pub async fn new(test: &str) -> Option<Env> {
        Env::with_crds(test, &cdn_operator::api::crds()).await
    }

    /// [`Env::new`] with these CRDs installed instead of the current ones (a release's).
    pub async fn with_crds(test: &str, crds: &[CustomResourceDefinition]) -> Option<Env> {
        let client = connect(&format!("e2e {test}")).await?;
        apply_crds(&client, crds).await;
        let suffix = format!(
            "{:x}",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("clock after 1970")
                .as_micros()
                % 0xffffff
        );
        let base: String = test
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '-'
                }
            })
            .take(40)
            .collect();
        let ns = format!("e2e-{}-{suffix}", base.trim_matches('-'));
        let namespace: Namespace = serde_json::from_value(json!({
            "metadata": {"name": ns, "labels": {"app.kubernetes.io/part-of": "cdn-operator-e2e"}}
        }))
        .expect("namespace");
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &namespace)
            .await
            .unwrap_or_else(|e| panic!("creating namespace {ns}: {e}"));
        Some(Env {
            client,
            ns,
            test: test.into(),
            dir: tempfile::tempdir().expect("temporary directory"),
            operators: Vec::new(),
            cluster_scoped: Vec::new(),
        })
    }

    /// Starts an operator watching this namespace only (so tests running at the same time do not
    /// share objects), without leader election. Returns its index in `operators`.
    pub async fn start_operator(&mut self) -> usize {
        let options = OperatorOptions {
            namespace: Some(self.ns.clone()),
            ..Default::default()
        };
        self.start_operator_with("operator", options).await
    }

    pub async fn start_operator_with(&mut self, identity: &str, options: OperatorOptions) -> usize {
        let operator = options.start(identity).await;
        self.operators.push(operator);
        self.operators.len() - 1
    }

    /// Deletes this cluster-scoped object with the namespace.
    pub fn owns_cluster_scoped(&mut self, gvk: GroupVersionKind, name: &str) {
        self.cluster_scoped.push((gvk, name.into()));
    }

    pub fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// Server-side applies a YAML manifest as a user would (`kubectl apply --server-side`),
    /// unchanged, into the namespace.
    pub async fn apply_yaml(&self, yaml: &str) -> Result<DynamicObject, kube::Error> {
        let mut object: DynamicObject = serde_yaml::from_str(yaml).expect("a YAML object");
        object.metadata.namespace = Some(self.ns.clone());
        let types = object.types.clone().expect("apiVersion and kind");
        let gvk = GroupVersionKind::try_from(&types).expect("a valid apiVersion");
        let (resource, _) = pinned_kind(&self.client, &gvk).await?;
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &self.ns, &resource);
        api.patch(
            &object.name_any(),
            &PatchParams::apply(USER_MANAGER),
            &Patch::Apply(&object),
        )
        .await
    }

    /// Creates a CdnCluster from its spec as raw JSON, sent as is (so a spec the types could not
    /// hold reaches the API server's validation).
    pub async fn create_cluster(
        &self,
        name: &str,
        spec: serde_json::Value,
    ) -> Result<CdnCluster, kube::Error> {
        let object: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "cluster.anevia.com/v1", "kind": "CdnCluster",
            "metadata": {"name": name}, "spec": spec,
        }))
        .expect("a JSON object");
        let resource = kube::core::ApiResource::erase::<CdnCluster>(&());
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &self.ns, &resource);
        let created = api.create(&PostParams::default(), &object).await?;
        Ok(created
            .try_parse::<CdnCluster>()
            .expect("the API server returns a CdnCluster"))
    }

    /// The Events the operator published in the namespace, as the API server lists them.
    async fn operator_events(&self) -> Vec<Event> {
        let events = self.api::<Event>().list(&ListParams::default()).await;
        let mut events = events.expect("listing Events").items;
        events.retain(|e| {
            e.reporting_controller.as_deref()
                == Some(cdn_operator::kubernetes::events::EVENT_REPORTER)
        });
        events
    }

    /// The Events the operator published in the namespace, oldest first, as
    /// (object name, type, reason, note).
    pub async fn events(&self) -> Vec<(String, String, String, String)> {
        let mut events = self.operator_events().await;
        events.sort_by_key(|e| {
            (
                e.event_time.as_ref().map(|t| t.0),
                e.metadata.creation_timestamp.as_ref().map(|t| t.0),
            )
        });
        events
            .into_iter()
            .map(|e| {
                (
                    e.regarding.and_then(|r| r.name).unwrap_or_default(),
                    e.type_.unwrap_or_default(),
                    e.reason.unwrap_or_default(),
                    e.note.unwrap_or_default(),
                )
            })
            .collect()
    }

    /// How many times the operator reported `reason` about `name`: the operator folds a
    /// repeated Event (same type, reason, note, object and related object, within six minutes)
    /// into one Event with `series.count`.
    pub async fn event_count(&self, name: &str, reason: &str) -> i32 {
        self.operator_events()
            .await
            .iter()
            .filter(|e| e.reason.as_deref() == Some(reason))
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
            .map(|e| e.series.as_ref().map_or(1, |s| s.count))
            .sum()
    }

    /// The operators' logs, for a failure message.
    pub fn logs(&self) -> String {
        self.operators
            .iter()
            .map(|o| format!("----- operator {}\n{}", o.identity, o.logs()))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "===== {} failed in namespace {}; operator logs:\n{}",
                self.test,
                self.ns,
                self.logs()
            );
        }
        // Stop the operators before deleting what they manage.
        self.operators.clear();
        let ns = self.ns.clone();
        let cluster_scoped = std::mem::take(&mut self.cluster_scoped);
        // Drop cannot await, and the test's runtime may be the one dropping.
        if let Ok(Err(error)) = on_own_thread(cleanup(ns, cluster_scoped)) {
            eprintln!("e2e cleanup of {}: {error}", self.ns);
        }
    }
}

/// Releases the finalizers of the pods of namespace `ns` (no operator may be left to), deletes
/// the `cluster_scoped` objects, then starts the deletion of the namespace.
pub async fn cleanup(
    ns: String,
    cluster_scoped: Vec<(GroupVersionKind, String)>,
) -> Result<(), String> {
    let client = Client::try_default().await.map_err(|e| e.to_string())?;
    // Pods held by the At's finalizer would keep the namespace Terminating now that no operator
    // runs to release them.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    if let Ok(list) = pods.list(&ListParams::default()).await {
        for pod in list.items.iter().filter(|p| !p.finalizers().is_empty()) {
            let _ = pods
                .patch(
                    &pod.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"finalizers": null}})),
                )
                .await;
        }
    }
    for (gvk, name) in cluster_scoped {
        if let Ok((resource, _)) = pinned_kind(&client, &gvk).await {
            let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
            let _ = api.delete(&name, &DeleteParams::default()).await;
        }
    }
    delete_namespace(&client, &ns).await
}

/// Starts the deletion of namespace `ns`, in the background; one already gone is done too (the
/// benchmark deletes the operator's before its baseline, and its guard again at the end).
pub async fn delete_namespace(client: &Client, ns: &str) -> Result<(), String> {
    match Api::<Namespace>::all(client.clone())
        .delete(ns, &DeleteParams::background())
        .await
    {
        Ok(_) => Ok(()),
        Err(error) if cdn_operator::kubernetes::errors::is_not_found(&error) => Ok(()),
        Err(error) => Err(format!("cannot delete namespace {ns}: {error}")),
    }
}

/// `kubeconfig` with the current context's user impersonating `user` (kubeconfig `as:`), so a
/// process using it acts with `user`'s permissions only. File paths are already absolute
/// (`Kubeconfig::read` makes them so), so the result can live anywhere.
pub fn impersonating(
    mut kubeconfig: kube::config::Kubeconfig,
    user: &str,
) -> Result<kube::config::Kubeconfig, String> {
    let context = kubeconfig
        .current_context
        .clone()
        .ok_or("the kubeconfig has no current context")?;
    let auth = kubeconfig
        .contexts
        .iter()
        .find(|c| c.name == context)
        .and_then(|c| c.context.as_ref())
        .and_then(|c| c.user.clone())
        .ok_or_else(|| format!("context {context} names no user"))?;
    let info = kubeconfig
        .auth_infos
        .iter_mut()
        .find(|a| a.name == auth)
        .ok_or_else(|| format!("no user {auth} in the kubeconfig"))?
        .auth_info
        .get_or_insert_with(Default::default);
    info.impersonate = Some(user.to_string());
    Ok(kubeconfig)
}

/// Reads a fixture of `e2e/fixtures/`.
pub fn fixture(path: &str) -> String {
    let full = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{}: {e}", full.display()))
}

/// Deletes namespaces when dropped (a benchmark's, also when it fails).
pub struct NamespaceGuard {
    pub namespaces: Vec<String>,
    /// Leave them in place (to inspect a run).
    pub keep: bool,
}

impl Drop for NamespaceGuard {
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        let namespaces = std::mem::take(&mut self.namespaces);
        let _ = on_own_thread(async move {
            for ns in namespaces {
                if let Err(error) = cleanup(ns.clone(), Vec::new()).await {
                    eprintln!("cleanup of {ns}: {error}");
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_impersonating_kubeconfig_keeps_the_credentials_and_adds_as() {
        let yaml = "apiVersion: v1\nkind: Config\ncurrent-context: kind\n\
clusters:\n- name: kind\n  cluster:\n    server: https://127.0.0.1:6443\n    insecure-skip-tls-verify: true\n\
users:\n- name: admin\n  user:\n    token: secret-token\n- name: other\n  user:\n    token: other\n\
contexts:\n- name: kind\n  context:\n    cluster: kind\n    user: admin\n";
        let kubeconfig = kube::config::Kubeconfig::from_yaml(yaml).unwrap();
        let user = "system:serviceaccount:e2e-rbac:cdn-operator";
        let written = serde_yaml::to_string(&impersonating(kubeconfig, user).unwrap()).unwrap();
        assert!(written.contains(&format!("as: {user}")), "{written}");
        let read = kube::config::Kubeconfig::from_yaml(&written).unwrap();
        let config = Config::from_custom_kubeconfig(read, &Default::default())
            .await
            .unwrap();
        assert_eq!(config.auth_info.impersonate.as_deref(), Some(user));
        assert!(config.auth_info.token.is_some(), "the token is kept");
        let other = serde_yaml::to_string(
            &kube::config::Kubeconfig::from_yaml(&written)
                .unwrap()
                .auth_infos[1],
        )
        .unwrap();
        assert!(
            !other.contains("as:"),
            "only the current user impersonates: {other}"
        );
    }
}
