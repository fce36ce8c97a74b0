//! The in-memory API (kube-fake-client) as the reconcile tests and the in-memory benchmark drive
//! it: every request logged at an HTTP front, a write refused on demand, the controllers' caches
//! filled from the API as their watches would fill them (the fake serves no watches), and a
//! clock the test sets.
//!
//! Included by the test files (`mod support;`) and `benches/reconcile.rs` (`#[path]`); each uses
//! part of it.
#![allow(dead_code)]

/// HTTPS clients and certificates (tests/nginx.rs, tests/data_plane.rs).
pub mod tls;

use cdn_operator::api::CdnCluster;
use cdn_operator::at::Clock;
use cdn_operator::cdncluster::nginx::SERVICE_PORT_NAME;
use cdn_operator::cdncluster::Context;
use cdn_operator::kubernetes::cache::CachesReady;
use cdn_operator::kubernetes::compact::Compact;
use cdn_operator::kubernetes::events::Events;
use cdn_operator::kubernetes::problems::{PodProblems, PodSummary};
use cdn_operator::kubernetes::records::Records;
use cdn_operator::reconcile::Shared;
use http_body_util::BodyExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use kube::api::{Api, ListParams};
use kube::runtime::reflector::{self, store::Writer, Store};
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use kube_fake_client::ClientBuilder;
use serde::de::DeserializeOwned;
use std::fmt::Debug;
use std::sync::{Arc, Mutex};

/// kube-fake-client reads the group/version/kind of a status subresource from `K::default()`;
/// CdnCluster has no meaningful default, so this type names the same GVK.
mod gvk {
    #[derive(
        kube::CustomResource,
        serde::Serialize,
        serde::Deserialize,
        Clone,
        Debug,
        Default,
        schemars::JsonSchema,
    )]
    #[kube(
        group = "cluster.anevia.com",
        version = "v1",
        kind = "CdnCluster",
        namespaced,
        derive = "Default"
    )]
    pub struct Spec {}

    /// The same for CdnPurge.
    pub mod purge {
        #[derive(
            kube::CustomResource,
            serde::Serialize,
            serde::Deserialize,
            Clone,
            Debug,
            Default,
            schemars::JsonSchema,
        )]
        #[kube(
            group = "cluster.anevia.com",
            version = "v1",
            kind = "CdnPurge",
            namespaced,
            derive = "Default"
        )]
        pub struct Spec {}
    }
}

/// One request the API received, as its HTTP front saw it.
#[derive(Clone, Debug)]
pub struct Request {
    /// `get`, `list`, `create`, `patch`, `patch_status`, `replace`, `replace_status`, `delete`.
    pub verb: &'static str,
    /// The object's kind when the request body tells it (`""` otherwise).
    pub kind: String,
    /// The object's name: from the path, else from the body.
    pub name: String,
    /// The resource of the path (`poddisruptionbudgets`).
    pub resource: String,
    /// An Event's reason.
    pub reason: Option<String>,
}

impl Request {
    fn of(method: &http::Method, path: &str, body: &[u8]) -> Request {
        let body: serde_json::Value = match *method {
            // Only these carry an object.
            http::Method::POST | http::Method::PATCH | http::Method::PUT => {
                serde_json::from_slice(body).unwrap_or_default()
            }
            _ => serde_json::Value::Null,
        };
        let field = |path: &[&str]| {
            path.iter()
                .try_fold(&body, |v, k| v.get(k))
                .and_then(serde_json::Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        // /api/v1 or /apis/<group>/<version>, [namespaces/<namespace>], resource[/name[/sub]]
        let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
        let mut rest = &segments[if segments[0] == "api" { 2 } else { 3 }.min(segments.len())..];
        if rest.len() > 2 && rest[0] == "namespaces" {
            rest = &rest[2..];
        }
        let status = rest.get(2) == Some(&"status");
        let verb = match (method.as_str(), rest.len() > 1, status) {
            ("GET", true, _) => "get",
            ("GET", false, _) => "list",
            ("POST", _, _) => "create",
            ("PATCH", _, false) => "patch",
            ("PATCH", _, true) => "patch_status",
            ("PUT", _, false) => "replace",
            ("PUT", _, true) => "replace_status",
            ("DELETE", _, _) => "delete",
            _ => "other",
        };
        let kind = field(&["kind"]);
        Request {
            verb,
            reason: (kind == "Event").then(|| field(&["reason"])),
            kind,
            resource: rest.first().map_or_else(String::new, |r| r.to_string()),
            name: rest
                .get(1)
                .map_or_else(|| field(&["metadata", "name"]), |n| n.to_string()),
        }
    }

    /// Its line in the log of writes: `create Event`, `patch Deployment foo-deployment`,
    /// `status CdnCluster foo`, `update Kind`, `replace-status name` (`?`: a body naming no
    /// kind), `delete services foo` (a deletion names the resource); `None` for reads.
    pub fn entry(&self) -> Option<String> {
        let kind = if self.kind.is_empty() {
            "?"
        } else {
            &self.kind
        };
        let name = &self.name;
        match self.verb {
            "create" => Some(format!("create {kind}")),
            "patch" => Some(format!("patch {kind} {name}")),
            "patch_status" => Some(format!("status {kind} {name}")),
            "replace" => Some(format!("update {kind}")),
            "replace_status" => Some(format!("replace-status {name}")),
            "delete" => Some(format!("delete {} {name}", self.resource)),
            _ => None,
        }
    }

    /// An Event published, or counted again in a series.
    pub fn is_event(&self) -> bool {
        self.kind == "Event" || self.reason.is_some()
    }

    /// A change to an object other than an Event.
    pub fn is_write(&self) -> bool {
        !matches!(self.verb, "get" | "list") && !self.is_event()
    }
}

/// Every request sent, in order.
pub type RequestLog = Arc<Mutex<Vec<Request>>>;

/// A refusal to answer instead of the API: the writes whose log entry starts with `prefix` get
/// this HTTP status and message, as a real API server words them.
#[derive(Clone, Debug)]
pub struct Refuse {
    pub prefix: String,
    pub code: u16,
    pub message: String,
    /// How many more to refuse; `None`: until [`FakeApi::accept`].
    pub times: Option<usize>,
    /// The Status's `reason` and `details`, when the server gives more than code and message.
    pub status: Option<(String, serde_json::Value)>,
}

pub type Failure = Arc<Mutex<Option<Refuse>>>;

/// An in-memory API in front of which every request is logged, and writes are refused on demand.
pub struct FakeApi {
    pub client: Client,
    pub requests: RequestLog,
    pub fail: Failure,
}

/// The API server's answer to a refused request: a `Status`.
fn refusal(refuse: &Refuse) -> http::Response<kube::client::Body> {
    let reason = match refuse.code {
        403 => "Forbidden",
        409 => "Conflict",
        422 => "Invalid",
        _ => "InternalError",
    };
    let mut status = serde_json::json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": refuse.message, "reason": reason, "code": refuse.code});
    if let Some((reason, details)) = &refuse.status {
        status["reason"] = reason.as_str().into();
        status["details"] = details.clone();
    }
    http::Response::builder()
        .status(refuse.code)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(kube::client::Body::from(status.to_string().into_bytes()))
        .expect("a valid response")
}

/// Whether `entry` is refused now; counts the refusal.
fn refused(fail: &Failure, entry: &str) -> Option<Refuse> {
    let mut fail = fail.lock().unwrap();
    let refuse = fail.clone().filter(|r| entry.starts_with(&r.prefix))?;
    match refuse.times {
        Some(1) => *fail = None,
        Some(n) => fail.as_mut().unwrap().times = Some(n - 1),
        None => {}
    }
    Some(refuse)
}

impl FakeApi {
    pub async fn new() -> FakeApi {
        FakeApi::with_objects(Vec::new()).await
    }

    /// The in-memory API that knows CdnClusters (status as a subresource), holding `objects`
    /// (JSON, as a real server returned them).
    pub async fn with_objects(objects: Vec<serde_json::Value>) -> FakeApi {
        FakeApi::over(
            ClientBuilder::new()
                .with_resource::<CdnCluster>()
                .with_status_subresource::<gvk::CdnCluster>()
                // A real server returns them; the operator tells drift by them.
                .with_return_managed_fields()
                .with_runtime_objects(objects),
        )
        .await
    }

    /// The in-memory API that knows CdnClusters and CdnPurges (their status as a subresource),
    /// holding `objects`.
    pub async fn with_purges(objects: Vec<serde_json::Value>) -> FakeApi {
        FakeApi::over(
            ClientBuilder::new()
                .with_resource::<CdnCluster>()
                .with_resource::<cdn_operator::api::CdnPurge>()
                .with_status_subresource::<gvk::CdnCluster>()
                .with_status_subresource::<gvk::purge::CdnPurge>()
                .with_return_managed_fields()
                .with_runtime_objects(objects),
        )
        .await
    }

    /// The in-memory API that `fake` builds, behind the front.
    pub async fn over(fake: ClientBuilder) -> FakeApi {
        let requests = RequestLog::default();
        let fail = Failure::default();
        let fake = fake.build().await.expect("fake client");
        // In front of the fake, as the network would be: every request passes here.
        let service = {
            let (requests, fail) = (requests.clone(), fail.clone());
            tower::service_fn(move |request: http::Request<kube::client::Body>| {
                let (fake, requests, fail) = (fake.clone(), requests.clone(), fail.clone());
                async move {
                    let (parts, body) = request.into_parts();
                    let body = body.collect().await?.to_bytes();
                    let logged = Request::of(&parts.method, parts.uri.path(), &body);
                    let entry = logged.entry();
                    requests.lock().unwrap().push(logged);
                    if let Some(refuse) = entry.and_then(|e| refused(&fail, &e)) {
                        return Ok(refusal(&refuse));
                    }
                    let request = http::Request::from_parts(parts, body.to_vec().into());
                    fake.send(request).await.map_err(tower::BoxError::from)
                }
            })
        };
        FakeApi {
            client: Client::new(service, "default"),
            requests,
            fail,
        }
    }

    /// Refuses the writes whose log entry starts with `prefix` with `code` and `message`.
    pub fn refuse(&self, prefix: &str, code: u16, message: &str) {
        self.refuse_times(prefix, code, message, None);
    }

    /// Refuses the next `times` writes whose log entry starts with `prefix`, then answers again.
    pub fn refuse_next(&self, times: usize, prefix: &str, code: u16, message: &str) {
        self.refuse_times(prefix, code, message, Some(times).filter(|&n| n > 0));
    }

    fn refuse_times(&self, prefix: &str, code: u16, message: &str, times: Option<usize>) {
        *self.fail.lock().unwrap() = Some(Refuse {
            prefix: prefix.into(),
            code,
            message: message.into(),
            times,
            status: None,
        });
    }

    /// Refuses every creation, as a real server does in the namespace `namespace` once it is
    /// being deleted (the Status as kube-apiserver v1.36.2 words it, for a ConfigMap).
    pub fn refuse_namespace_terminating(&self, namespace: &str) {
        *self.fail.lock().unwrap() = Some(Refuse {
            prefix: "patch ConfigMap".into(),
            code: 403,
            message: format!("configmaps \"x\" is forbidden: unable to create new content in namespace {namespace} because it is being terminated"),
            times: None,
            status: Some((
                "Forbidden".into(),
                serde_json::json!({"name": "x", "kind": "configmaps", "causes": [{
                    "reason": "NamespaceTerminating",
                    "message": format!("namespace {namespace} is being terminated"),
                    "field": "metadata.namespace",
                }]}),
            )),
        });
    }

    /// Answers every request again.
    pub fn accept(&self) {
        *self.fail.lock().unwrap() = None;
    }

    /// The requests logged since the last [`Self::clear`] or [`Self::take_writes`].
    pub fn requests(&self) -> Vec<Request> {
        self.requests.lock().unwrap().clone()
    }

    /// Forgets the requests logged so far.
    pub fn clear(&self) {
        self.requests.lock().unwrap().clear();
    }

    /// The log entries of the writes since the last call (see [`Request::entry`]).
    pub fn take_writes(&self) -> Vec<String> {
        std::mem::take(&mut *self.requests.lock().unwrap())
            .iter()
            .filter_map(Request::entry)
            .collect()
    }

    /// A cache of every `K` of every namespace, as the controller's watch fills it.
    pub async fn store<K>(&self) -> Store<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + DeserializeOwned
            + Debug
            + Send
            + Sync
            + 'static,
    {
        let (reader, mut writer) = reflector::store();
        let api: Api<K> = Api::all(self.client.clone());
        let mut objects = api.list(&ListParams::default()).await.expect("list").items;
        for obj in &mut objects {
            obj.managed_fields_mut().clear();
        }
        fill(&mut writer, objects);
        reader
    }

    /// A compact cache of every `K` of every namespace, as the controller's watch fills it.
    pub async fn records<K>(&self) -> Records
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + Send
            + Sync
            + 'static,
    {
        let api: Api<Compact<K>> = Api::all(self.client.clone());
        let records = Records::default();
        records.fill(api.list(&ListParams::default()).await.expect("list").items);
        records
    }

    /// The problems of the CdnClusters' pods, as the controller's watch (label-selected) fills it.
    pub async fn pod_problems(&self) -> PodProblems {
        let api: Api<PodSummary> = Api::all(self.client.clone());
        let selector = cdn_operator::cdncluster::build::pod_watch_selector();
        let pods = api.list(&ListParams::default().labels(&selector)).await;
        let problems = PodProblems::default();
        problems.fill(pods.expect("list").items);
        problems
    }

    /// The controller's context, caches as fresh as the watches would make them.
    pub async fn context(&self, events: Events) -> Arc<Context> {
        self.context_with(events, Default::default()).await
    }

    /// [`FakeApi::context`], its pods built as `pod_settings` sets them.
    pub async fn context_with(
        &self,
        events: Events,
        pod_settings: cdn_operator::cdncluster::build::PodSettings,
    ) -> Arc<Context> {
        Arc::new(Context {
            shared: Shared::new(self.client.clone(), events, CachesReady::default()),
            clusters: self.store().await,
            cluster_arrivals: Default::default(),
            deployments: self.records::<Deployment>().await,
            stateful_sets: self
                .records::<k8s_openapi::api::apps::v1::StatefulSet>()
                .await,
            stateful_set_watch: Default::default(),
            config_maps: self.records::<ConfigMap>().await,
            services: self.records::<Service>().await,
            pod_disruption_budgets: self
                .records::<k8s_openapi::api::policy::v1::PodDisruptionBudget>()
                .await,
            ingresses: self
                .records::<k8s_openapi::api::networking::v1::Ingress>()
                .await,
            pods: self.pod_problems().await,
            // The caches are filled by hand before each reconcile: no watch to wait for.
            writes_visible_within: std::time::Duration::ZERO,
            cluster_domain: cdn_operator::cdncluster::sources::DEFAULT_CLUSTER_DOMAIN.into(),
            pod_settings,
        })
    }
}

/// Sets what a cache shows, replacing all it showed, as a watch's (re)list does.
pub fn fill<K>(writer: &mut Writer<K>, objects: Vec<K>)
where
    K: Resource + Clone,
    K::DynamicType: Clone + Eq + std::hash::Hash + Default,
{
    writer.apply_watcher_event(&watcher::Event::Init);
    for object in objects {
        writer.apply_watcher_event(&watcher::Event::InitApply(object));
    }
    writer.apply_watcher_event(&watcher::Event::InitDone);
}

/// A clock the test sets, for the At controller.
pub struct TestClock(Mutex<jiff::Timestamp>);

impl TestClock {
    /// At `now` (RFC 3339).
    pub fn at(now: &str) -> Arc<TestClock> {
        Arc::new(TestClock(Mutex::new(
            now.parse().expect("an RFC 3339 time"),
        )))
    }

    pub fn set(&self, now: jiff::Timestamp) {
        *self.0.lock().unwrap() = now;
    }

    pub fn advance(&self, by: std::time::Duration) {
        let mut now = self.0.lock().unwrap();
        *now += jiff::SignedDuration::try_from(by).unwrap();
    }
}

impl Clock for TestClock {
    fn now(&self) -> jiff::Timestamp {
        *self.0.lock().unwrap()
    }
}

/// `object` as JSON without the metadata the API server fills in (managedFields, resourceVersion,
/// uid, creationTimestamp, generation): what the operator applied, to compare with what it builds.
pub fn without_server_fields(object: &impl serde::Serialize) -> serde_json::Value {
    let mut value = serde_json::to_value(object).expect("objects serialize");
    let metadata = value["metadata"].as_object_mut().expect("metadata");
    for server_field in [
        "managedFields",
        "resourceVersion",
        "uid",
        "creationTimestamp",
        "generation",
    ] {
        metadata.remove(server_field);
    }
    value
}

/// A file or folder of `../shared`, beside the repository as CI has it.
pub fn shared(path: &str) -> std::path::PathBuf {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared")
        .join(path);
    assert!(
        path.exists(),
        "{} is missing: the tests expect ../shared beside the repository",
        path.display()
    );
    path
}

/// The nginx configuration of `c` as the controller builds it, its sources looked up among `all`,
/// with nginx's files and listen address at `paths` (tests/nginx.rs, tests/data_plane.rs).
pub fn nginx_config(
    c: &CdnCluster,
    all: &[CdnCluster],
    paths: &cdn_operator::cdncluster::nginx::Paths,
) -> String {
    nginx_config_counted(c, all, paths, false)
}

/// [`nginx_config`], each request counted by a metrics sidecar with `metrics`.
pub fn nginx_config_counted(
    c: &CdnCluster,
    all: &[CdnCluster],
    paths: &cdn_operator::cdncluster::nginx::Paths,
    metrics: bool,
) -> String {
    let upstreams = cdn_operator::cdncluster::sources::resolve(
        c,
        |name| {
            all.iter()
                .find(|x| x.metadata.name.as_deref() == Some(name))
                .map(|x| Arc::new(x.clone()))
        },
        cdn_operator::cdncluster::sources::DEFAULT_CLUSTER_DOMAIN,
    )
    .unwrap_or_else(|problem| panic!("{problem:?}"));
    cdn_operator::cdncluster::build::config(c, &upstreams, paths, metrics)
}

/// The names the nginx instances of a test look up, as a pod finds them: the Services' names
/// (fully qualified) in a DNS server of the test on port 53 of `dns_ip` (nginx looks them up while
/// it runs), each with the SRV record of its `http` port as the cluster DNS publishes it for a
/// Service with an address (the name itself, port 80; a test makes a Service headless with
/// [`Names::members`]); every name in an /etc/hosts for its sandbox too (a URL origin's host is
/// looked up when nginx loads its configuration).
pub struct Names {
    pub dns: cdn_operator_testkit::Dns,
    pub hosts: std::path::PathBuf,
}

impl Names {
    /// Names in `dir`/hosts and in a DNS server on `dns_ip`:53, each mapped to its address.
    pub fn new(dir: &std::path::Path, dns_ip: &str, names: &[(&str, &str)]) -> Names {
        let dns = cdn_operator_testkit::Dns::start_on(format!("{dns_ip}:53").parse().unwrap());
        let mut text = String::from("127.0.0.1 localhost\n::1 localhost\n");
        for (name, ip) in names {
            text.push_str(&format!("{ip} {name}\n"));
            dns.publish_service(name, SERVICE_PORT_NAME, ip.parse().unwrap());
        }
        let hosts = dir.join("hosts");
        std::fs::write(&hosts, text).unwrap();
        Names { dns, hosts }
    }

    /// The Service `service` is now headless with the ready pods at `pods`
    /// ([`cdn_operator_testkit::Dns::publish_headless`]).
    pub fn members(&self, service: &str, pods: &[&str]) {
        let pods: Vec<std::net::Ipv4Addr> = pods.iter().map(|ip| ip.parse().unwrap()).collect();
        self.dns.publish_headless(service, SERVICE_PORT_NAME, &pods);
    }

    /// Writes the resolver an nginx with its temp files in `temp_dir` includes: what the pod's
    /// entrypoint writes for a nameserver at this DNS server's address.
    pub fn resolver_for(&self, temp_dir: &str) {
        let file =
            std::path::Path::new(temp_dir).join(cdn_operator::cdncluster::nginx::RESOLVER_FILE);
        std::fs::create_dir_all(temp_dir).unwrap();
        std::fs::write(file, self.resolv_line()).unwrap();
    }

    /// The configuration of `c` ([`nginx_config`]), with the resolver it includes written.
    pub fn config(
        &self,
        c: &CdnCluster,
        all: &[CdnCluster],
        paths: &cdn_operator::cdncluster::nginx::Paths,
    ) -> String {
        self.config_counted(c, all, paths, false)
    }

    /// [`Names::config`], each request counted by a metrics sidecar with `metrics`.
    pub fn config_counted(
        &self,
        c: &CdnCluster,
        all: &[CdnCluster],
        paths: &cdn_operator::cdncluster::nginx::Paths,
        metrics: bool,
    ) -> String {
        self.resolver_for(&paths.temp_dir);
        nginx_config_counted(c, all, paths, metrics)
    }

    /// A sandbox sharing `dir`, with these names as its /etc/hosts.
    pub fn sandbox(&self, dir: &std::path::Path) -> cdn_operator_testkit::Sandbox {
        cdn_operator_testkit::Sandbox::new()
            .share(dir)
            .hosts(&self.hosts)
    }

    /// A resolv.conf naming this DNS server, for a sandbox running the pod's entrypoint.
    pub fn resolv_conf(&self, dir: &std::path::Path) -> std::path::PathBuf {
        let path = dir.join("resolv.conf");
        std::fs::write(&path, format!("nameserver {}\n", self.dns.addr().ip())).unwrap();
        path
    }

    fn resolv_line(&self) -> String {
        format!(
            "resolver {} ipv6=off valid={};\n",
            self.dns.addr().ip(),
            cdn_operator::cdncluster::nginx::RESOLVER_VALID
        )
    }
}

/// Waits until the nginx at `addr` has looked its sources up. nginx asks the DNS server once it
/// runs: a request before the answer finds no address ("no live upstreams", 502). In a pod that is
/// the first round trip to the cluster's DNS, before the kubelet's first readiness probe; after a
/// reload the addresses carry over. Asks for a path no origin has (`/not-here/…`), with `host`,
/// until the answer is not a 502.
pub fn wait_resolved(addr: &str, host: &str) {
    let ask = || {
        cdn_operator_testkit::request(addr, "GET", "/not-here/resolved", &[("Host", host)], b"")
            .unwrap_or_else(|e| panic!("GET from {addr}: {e}"))
            .status
    };
    let status = cdn_operator_testkit::settle(
        std::time::Duration::from_secs(10),
        std::time::Duration::from_millis(20),
        ask,
        |status| *status != 502,
    );
    assert_ne!(status, 502, "{addr} never resolved its sources");
}
