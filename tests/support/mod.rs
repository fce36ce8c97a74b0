//! The in-memory API (kube-fake-client) as the CdnCluster reconcile tests and the in-memory
//! benchmark drive it: write requests logged, a write failed on demand, and the controller's
//! caches filled from the API as its watches would fill them (the fake serves no watches).
//!
//! Included by `tests/cdncluster_reconcile.rs` (`mod support;`) and `benches/reconcile.rs`
//! (`#[path]`); each uses part of it.
#![allow(dead_code)]

use cdn_operator::api::CdnCluster;
use cdn_operator::cache::CachesReady;
use cdn_operator::cdncluster::Context;
use cdn_operator::events::Events;
use cdn_operator::reconcile::Shared;
use http_body_util::BodyExt;
use kube::api::{Api, ListParams};
use kube::runtime::reflector::{self, Store};
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
}

/// Every write request sent, in order: `create Event`, `patch Deployment foo-deployment`,
/// `status CdnCluster foo`, `update Kind`, `replace-status name`.
pub type WriteLog = Arc<Mutex<Vec<String>>>;

/// A refusal to answer instead of the API: the writes whose log entry starts with `prefix` get
/// this HTTP status and message, as a real API server words them.
#[derive(Clone, Debug)]
pub struct Refuse {
    pub prefix: String,
    pub code: u16,
    pub message: String,
}

pub type Failure = Arc<Mutex<Option<Refuse>>>;

/// An in-memory API that knows CdnClusters (status as a subresource), logs every write, and
/// refuses writes on demand.
pub struct FakeApi {
    pub client: Client,
    pub writes: WriteLog,
    pub fail: Failure,
}

/// The log entry of a write request, from what the API server sees of it; `None` for reads.
fn describe(method: &http::Method, path: &str, body: &[u8]) -> Option<String> {
    let kind = || {
        serde_json::from_slice::<serde_json::Value>(body)
            .ok()
            .and_then(|v| v.get("kind")?.as_str().map(String::from))
            .unwrap_or_else(|| "?".into())
    };
    let segments: Vec<&str> = path.trim_end_matches('/').split('/').collect();
    let status = segments.last() == Some(&"status");
    let name = if status {
        segments[segments.len() - 2]
    } else {
        segments[segments.len() - 1]
    };
    match (method.as_str(), status) {
        ("POST", _) => Some(format!("create {}", kind())),
        ("PATCH", false) => Some(format!("patch {} {name}", kind())),
        ("PATCH", true) => Some(format!("status {} {name}", kind())),
        ("PUT", false) => Some(format!("update {}", kind())),
        ("PUT", true) => Some(format!("replace-status {name}")),
        _ => None,
    }
}

/// The API server's answer to a refused request: a `Status`.
fn refusal(refuse: &Refuse) -> http::Response<kube::client::Body> {
    let reason = match refuse.code {
        403 => "Forbidden",
        409 => "Conflict",
        422 => "Invalid",
        _ => "InternalError",
    };
    let status = serde_json::json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": refuse.message, "reason": reason, "code": refuse.code});
    http::Response::builder()
        .status(refuse.code)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(kube::client::Body::from(status.to_string().into_bytes()))
        .expect("a valid response")
}

impl FakeApi {
    pub async fn new() -> FakeApi {
        FakeApi::with_objects(Vec::new()).await
    }

    /// The in-memory API holding `objects` (JSON, as a real server returned them).
    pub async fn with_objects(objects: Vec<serde_json::Value>) -> FakeApi {
        let writes = WriteLog::default();
        let fail = Failure::default();
        let fake = ClientBuilder::new()
            .with_resource::<CdnCluster>()
            .with_status_subresource::<gvk::CdnCluster>()
            // A real server returns them; the operator tells drift by them.
            .with_return_managed_fields()
            .with_runtime_objects(objects)
            .build()
            .await
            .expect("fake client");
        // In front of the fake, as the network would be: every request passes here.
        let service = {
            let (writes, fail) = (writes.clone(), fail.clone());
            tower::service_fn(move |request: http::Request<kube::client::Body>| {
                let (fake, writes, fail) = (fake.clone(), writes.clone(), fail.clone());
                async move {
                    let (parts, body) = request.into_parts();
                    let body = body.collect().await?.to_bytes();
                    if let Some(entry) = describe(&parts.method, parts.uri.path(), &body) {
                        writes.lock().unwrap().push(entry.clone());
                        let refused = fail.lock().unwrap().clone();
                        if let Some(refuse) = refused.filter(|r| entry.starts_with(&r.prefix)) {
                            return Ok(refusal(&refuse));
                        }
                    }
                    let request = http::Request::from_parts(parts, body.to_vec().into());
                    fake.send(request).await.map_err(tower::BoxError::from)
                }
            })
        };
        FakeApi {
            client: Client::new(service, "default"),
            writes,
            fail,
        }
    }

    /// Refuses the writes whose log entry starts with `prefix` with `code` and `message`.
    pub fn refuse(&self, prefix: &str, code: u16, message: &str) {
        *self.fail.lock().unwrap() = Some(Refuse {
            prefix: prefix.into(),
            code,
            message: message.into(),
        });
    }

    /// Answers every request again.
    pub fn accept(&self) {
        *self.fail.lock().unwrap() = None;
    }

    /// The writes logged since the last call.
    pub fn take_writes(&self) -> Vec<String> {
        std::mem::take(&mut *self.writes.lock().unwrap())
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
        for mut obj in api.list(&ListParams::default()).await.expect("list") {
            obj.managed_fields_mut().clear();
            writer.apply_watcher_event(&watcher::Event::Apply(obj));
        }
        reader
    }

    /// The controller's context, caches as fresh as the watches would make them.
    pub async fn context(&self, events: Events) -> Arc<Context> {
        Arc::new(Context {
            shared: Shared::new(self.client.clone(), events, CachesReady::already()),
            clusters: self.store().await,
            deployments: self.store().await,
            config_maps: self.store().await,
            services: self.store().await,
            // The caches are filled by hand before each reconcile: no watch to wait for.
            writes_visible_within: std::time::Duration::ZERO,
        })
    }
}
