//! The in-memory API (kube-fake-client) as the CdnCluster reconcile tests and the in-memory
//! benchmark drive it: write requests logged, a write failed on demand, and the controller's
//! caches filled from the API as its watches would fill them (the fake serves no watches).
//!
//! Included by `tests/cdncluster_reconcile.rs` (`mod support;`) and `benches/reconcile.rs`
//! (`#[path]`); each uses part of it.
#![allow(dead_code)]

use cdn_operator::api::CdnCluster;
use cdn_operator::cdncluster::Context;
use cdn_operator::controller::{Backoff, CachesReady, Events};
use kube::api::{Api, ListParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use kube_fake_client::{interceptor, ClientBuilder};
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
/// The prefix of a write to fail (`patch Deployment`, say), to exercise errors.
pub type Failure = Arc<Mutex<Option<String>>>;

/// An in-memory API that knows CdnClusters (status as a subresource) and logs every write.
pub struct FakeApi {
    pub client: Client,
    pub writes: WriteLog,
    pub fail: Failure,
}

fn kind_of(v: &serde_json::Value) -> String {
    v.get("kind")
        .and_then(|k| k.as_str())
        .unwrap_or("?")
        .to_string()
}

impl FakeApi {
    pub async fn new() -> FakeApi {
        let writes = WriteLog::default();
        let fail = Failure::default();
        let recorder = |writes: &WriteLog, fail: &Failure| {
            let (writes, fail) = (writes.clone(), fail.clone());
            move |entry: String| {
                let injected = fail
                    .lock()
                    .unwrap()
                    .as_ref()
                    .is_some_and(|f| entry.starts_with(f.as_str()));
                writes.lock().unwrap().push(entry.clone());
                if injected {
                    Err(kube_fake_client::Error::Internal(format!(
                        "injected failure of {entry}"
                    )))
                } else {
                    Ok(None)
                }
            }
        };
        let (create, patch, status, update, replace) = (
            recorder(&writes, &fail),
            recorder(&writes, &fail),
            recorder(&writes, &fail),
            recorder(&writes, &fail),
            recorder(&writes, &fail),
        );
        let funcs = interceptor::Funcs::new()
            .create(move |ctx| create(format!("create {}", kind_of(ctx.object))))
            .patch(move |ctx| patch(format!("patch {} {}", kind_of(ctx.patch), ctx.name)))
            .patch_status(move |ctx| status(format!("status {} {}", kind_of(ctx.patch), ctx.name)))
            .update(move |ctx| update(format!("update {}", kind_of(ctx.object))))
            .replace_status(move |ctx| replace(format!("replace-status {}", ctx.name)));
        let client = ClientBuilder::new()
            .with_resource::<CdnCluster>()
            .with_status_subresource::<gvk::CdnCluster>()
            .with_interceptor_funcs(funcs)
            .build()
            .await
            .expect("fake client");
        FakeApi {
            client,
            writes,
            fail,
        }
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
            client: self.client.clone(),
            events,
            clusters: self.store().await,
            deployments: self.store().await,
            config_maps: self.store().await,
            services: self.store().await,
            backoff: Backoff::default(),
            ready: CachesReady::already(),
        })
    }
}
