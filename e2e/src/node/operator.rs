//! The installed operator: its pods, replicas and Lease in every install path, the wait until it
//! is Ready and leading, and its `/metrics` through its Service with the RBAC (ServiceAccounts,
//! tokens, ClusterRoleBindings) that allows or denies reading it. Depends on `probe`, `wait` and
//! `world` (a binding is deleted with the [`NodeTest`]); no other file of `node` uses this one.

use super::probe::service_address;
use super::wait::ready_pods;
use super::world::NodeTest;
use crate::eventually;
use cdn_operator_testkit::http::Reply;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::api::{Api, PostParams};
use kube::core::GroupVersionKind;
use kube::{Client, ResourceExt};
use serde_json::json;
use std::time::Duration;

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
    token_valid_for(client, ns, name, Duration::from_secs(600)).await
}

/// A token of ServiceAccount `name` of `ns`, valid for `validity` (a scraper that runs longer
/// than [`token`]'s 10 minutes).
pub async fn token_valid_for(client: &Client, ns: &str, name: &str, validity: Duration) -> String {
    let request = TokenRequest {
        // No audience: the API server's own, which its TokenReview accepts.
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(validity.as_secs() as i64),
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
