//! Uninstall: release the finalizer of every At pod, so that none is left held once the operator
//! is gone (docs/adr/0006-no-finalizer-left-at-uninstall.md). Run by `cdn-operator
//! release-finalizers`, the Helm chart's pre-delete hook, and by hand before a kustomize or OLM
//! uninstall. Never by the operator itself: a restart, an upgrade or a scale to zero must keep the
//! finalizer, which is what keeps a RUNNING At's pod from vanishing unseen.

use super::build;
use crate::kubernetes::apply;
use crate::kubernetes::cache::Scope;
use crate::kubernetes::errors;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

/// How many times [`release_all`] lists again after a pod changed under it.
pub const ROUNDS: usize = 5;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("could not list the At pods: {}", errors::describe(.0))]
    List(#[source] kube::Error),
    #[error(
        "could not release the finalizer of Pod {pod}: {}",
        errors::describe(source)
    )]
    Release {
        pod: String,
        #[source]
        source: kube::Error,
    },
    #[error(
        "At pods still changed after {ROUNDS} rounds of releasing their finalizer; run it again"
    )]
    StillChanging,
}

/// Releases the operator's finalizer from every At pod in `scope` (found by
/// [`build::selector`]), whatever its At's phase. A pod that changed between the list and the
/// patch (a conflict: the patch carries the listed resourceVersion) is released on the next list.
/// Returns the pods released, as `namespace/name`.
pub async fn release_all(client: &Client, scope: &Scope) -> Result<Vec<String>, Error> {
    let selector = ListParams::default().labels(&build::selector());
    let mut released = Vec::new();
    for _ in 0..ROUNDS {
        let pods = scope
            .api::<Pod>(client.clone())
            .list(&selector)
            .await
            .map_err(Error::List)?;
        let mut conflicts = 0;
        for pod in pods.items.iter().filter(|pod| build::held(pod)) {
            let namespace = pod.namespace().unwrap_or_default();
            let api: Api<Pod> = Api::namespaced(client.clone(), &namespace);
            match apply::remove_finalizer(&api, pod, build::FINALIZER).await {
                Ok(true) => released.push(format!("{namespace}/{}", pod.name_any())),
                // Gone since the list: nothing holds it.
                Ok(false) => {}
                Err(kube::Error::Api(status)) if status.code == 409 => conflicts += 1,
                Err(source) => {
                    return Err(Error::Release {
                        pod: format!("{namespace}/{}", pod.name_any()),
                        source,
                    })
                }
            }
        }
        if conflicts == 0 {
            return Ok(released);
        }
    }
    Err(Error::StillChanging)
}
