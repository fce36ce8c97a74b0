//! Waiting on the cluster: [`until`] (a retried attempt that reports its last failure), whether a
//! node or a pod is Ready, and waits for a number of Ready pods or for none. Depends on no other
//! file of `node`.

use crate::eventually;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};
use kube::Client;
use std::time::Duration;

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
