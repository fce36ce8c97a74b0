//! The fake API server: it answers what the operator asks. /version, lists (one CdnCluster or
//! none), watches (held open, silent), server-side applies (echoed), status patches (merged),
//! Events, a Lease (get/create/merge-patch), and the TokenReviews and SubjectAccessReviews of
//! the secured /metrics.

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub const LEASE: &str = "cdn-operator-leader";

#[derive(Default)]
pub struct FakeState {
    pub lease: Option<Value>,
    /// While set, this identity holds the lease and keeps renewing it.
    pub foreign_holder: Option<String>,
    pub clusters: Vec<Value>,
    pub requests: Vec<String>,
    pub lease_patches: Vec<Value>,
    /// How long a CdnCluster status write takes (to hold a reconcile in flight).
    pub status_delay: Duration,
    pub status_writes_started: usize,
    pub status_writes_done: usize,
    pub user_agents: std::collections::BTreeSet<String>,
    /// The bearer tokens TokenReviews accept, and the user each names; any other is rejected.
    pub tokens: std::collections::BTreeMap<String, String>,
    /// The users SubjectAccessReviews allow to get /metrics (as a metrics-reader binding would).
    pub metrics_readers: std::collections::BTreeSet<String>,
}

type Shared = Arc<Mutex<FakeState>>;

pub fn now() -> String {
    format!("{:.6}", jiff::Timestamp::now())
}

fn merge(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        (t, p) => *t = p.clone(),
    }
}

fn reply(status: u16, body: Value) -> Response {
    (
        StatusCode::from_u16(status).unwrap(),
        [("content-type", "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn not_found(what: &str) -> Response {
    reply(
        404,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": format!("{what} not found"), "reason": "NotFound", "code": 404}),
    )
}

async fn handle(
    State(state): State<Shared>,
    method: Method,
    uri: Uri,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> Response {
    if let Some(agent) = headers.get("user-agent").and_then(|v| v.to_str().ok()) {
        state.lock().unwrap().user_agents.insert(agent.to_string());
    }
    let path = uri.path().to_string();
    let query = uri.query().unwrap_or("").to_string();
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let status_write = method == Method::PATCH && path.ends_with("/status");
    if status_write {
        let delay = {
            let mut s = state.lock().unwrap();
            s.status_writes_started += 1;
            s.status_delay
        };
        tokio::time::sleep(delay).await;
        state.lock().unwrap().status_writes_done += 1;
    }
    let mut s = state.lock().unwrap();
    s.requests.push(format!("{method} {uri}"));
    if path == "/version" {
        return reply(
            200,
            json!({"major": "1", "minor": "36", "gitVersion": "v1.36.0-fake", "gitCommit": "0",
                   "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1",
                   "compiler": "gc", "platform": "linux/amd64"}),
        );
    }
    if method == Method::POST && path == "/apis/authentication.k8s.io/v1/tokenreviews" {
        let token = body["spec"]["token"].as_str().unwrap_or("");
        let status = match s.tokens.get(token) {
            Some(user) => json!({"authenticated": true,
                "user": {"username": user, "uid": format!("uid-{user}"), "groups": ["system:authenticated"]}}),
            None => json!({"authenticated": false, "error": "invalid bearer token"}),
        };
        let mut review = body;
        review["status"] = status;
        return reply(201, review);
    }
    if method == Method::POST && path == "/apis/authorization.k8s.io/v1/subjectaccessreviews" {
        let spec = &body["spec"];
        let allowed = spec["nonResourceAttributes"] == json!({"path": "/metrics", "verb": "get"})
            && spec["resourceAttributes"].is_null()
            && spec["groups"] == json!(["system:authenticated"])
            && spec["user"].as_str().is_some_and(|user| {
                s.metrics_readers.contains(user) && spec["uid"] == format!("uid-{user}")
            });
        let mut review = body;
        review["status"] = json!({"allowed": allowed});
        return reply(201, review);
    }
    if query
        .split('&')
        .any(|p| p == "watch=true" || p == "watch=1")
    {
        // Silent, held open: the caches stay as listed.
        let stream = futures::stream::pending::<Result<Bytes, std::io::Error>>();
        return Response::builder()
            .header("content-type", "application/json")
            .body(Body::from_stream(stream))
            .unwrap();
    }
    if path.starts_with("/apis/coordination.k8s.io/v1/namespaces/ops/leases") {
        if let Some(holder) = s.foreign_holder.clone() {
            let lease = s.lease.get_or_insert_with(|| {
                json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                       "metadata": {"name": LEASE, "namespace": "ops", "resourceVersion": "1"},
                       "spec": {"leaseTransitions": 0, "acquireTime": now()}})
            });
            merge(
                lease,
                &json!({"spec": {"holderIdentity": holder, "renewTime": now(), "leaseDurationSeconds": 15}}),
            );
        }
        return match method {
            Method::GET => match &s.lease {
                Some(lease) => reply(200, lease.clone()),
                None => not_found("lease"),
            },
            Method::POST => {
                let mut lease = body;
                merge(
                    &mut lease,
                    &json!({"metadata": {"namespace": "ops", "resourceVersion": "1"}}),
                );
                s.lease = Some(lease.clone());
                reply(201, lease)
            }
            Method::PATCH => {
                s.lease_patches.push(body.clone());
                match &mut s.lease {
                    Some(lease) => {
                        merge(lease, &body);
                        reply(200, lease.clone())
                    }
                    None => not_found("lease"),
                }
            }
            _ => reply(405, json!({})),
        };
    }
    if method == Method::PATCH && path.contains("/cdnclusters/") && path.ends_with("/status") {
        let name = path
            .trim_end_matches("/status")
            .rsplit('/')
            .next()
            .unwrap()
            .to_string();
        return match s
            .clusters
            .iter_mut()
            .find(|c| c["metadata"]["name"] == name.as_str())
        {
            Some(cluster) => {
                merge(cluster, &json!({"status": body["status"]}));
                reply(200, cluster.clone())
            }
            None => not_found(&name),
        };
    }
    match method {
        Method::GET => {
            let items = if path.ends_with("/cdnclusters") {
                s.clusters.clone()
            } else {
                Vec::new()
            };
            reply(
                200,
                json!({"kind": "List", "apiVersion": "v1", "metadata": {"resourceVersion": "10"}, "items": items}),
            )
        }
        Method::PATCH | Method::POST => {
            let mut object = body;
            let namespace = path
                .split('/')
                .skip_while(|p| *p != "namespaces")
                .nth(1)
                .unwrap_or("");
            merge(
                &mut object,
                &json!({"metadata": {"namespace": namespace, "resourceVersion": "11", "uid": "uid-1"}}),
            );
            reply(if method == Method::POST { 201 } else { 200 }, object)
        }
        _ => reply(405, json!({})),
    }
}

/// The fake on loopback, served by a runtime of its own, and a kubeconfig that names it.
pub struct FakeApi {
    pub state: Shared,
    _dir: tempfile::TempDir,
    pub kubeconfig: PathBuf,
    _runtime: tokio::runtime::Runtime,
}

impl FakeApi {
    pub fn start(state: FakeState) -> FakeApi {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let state = Arc::new(Mutex::new(state));
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let port = listener.local_addr().unwrap().port();
        let router = axum::Router::new()
            .fallback(handle)
            .with_state(state.clone());
        runtime.spawn(async move { axum::serve(listener, router).await });
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = kubeconfig(dir.path(), port);
        FakeApi {
            state,
            _dir: dir,
            kubeconfig,
            _runtime: runtime,
        }
    }

    pub fn requests(&self) -> Vec<String> {
        self.state.lock().unwrap().requests.clone()
    }
}

/// A kubeconfig in `dir` for an API server on loopback `port`.
pub fn kubeconfig(dir: &Path, port: u16) -> PathBuf {
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://127.0.0.1:{port}\n\
             users:\n- name: fake\n  user: {{}}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n    namespace: default\n\
             current-context: fake\n"
        ),
    )
    .unwrap();
    path
}

pub fn cluster(name: &str) -> Value {
    json!({"apiVersion": "cluster.anevia.com/v1", "kind": "CdnCluster",
           "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"),
                        "generation": 1, "resourceVersion": "5"},
           "spec": {"role": "cache", "sources": []}})
}
