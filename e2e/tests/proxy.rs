//! The benchmark's counting proxy, over real HTTP, in front of the in-memory API
//! (kube-fake-client): requests pass through unchanged and are counted by verb and resource.

use cdn_operator_e2e::proxy::Proxy;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::config::Kubeconfig;
use kube::{Client, Config, ResourceExt};
use serde_json::json;

#[tokio::test]
async fn requests_pass_through_and_are_counted() {
    cdn_operator_e2e::crypto();
    let fake = kube_fake_client::ClientBuilder::new()
        .build()
        .await
        .expect("fake client");
    let proxy = Proxy::start(fake).await.expect("proxy");
    assert_eq!(proxy.writes_answered(), 0);
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = Kubeconfig::read_from(proxy.kubeconfig(dir.path())).expect("kubeconfig");
    let config = Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .expect("config");
    assert_eq!(
        config.cluster_url.to_string(),
        format!("http://{}/", proxy.addr)
    );
    let client = Client::try_from(config).expect("client");
    let api: Api<ConfigMap> = Api::namespaced(client, "default");

    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "a"}, "data": {"k": "v"}
    }))
    .unwrap();
    api.create(&PostParams::default(), &cm)
        .await
        .expect("create through the proxy");
    let applied = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}, "data": {"k": "w"}});
    api.patch(
        "a",
        &PatchParams::apply("tester").force(),
        &Patch::Apply(&applied),
    )
    .await
    .expect("apply through the proxy");
    let got = api.get("a").await.expect("get through the proxy");
    assert_eq!(got.data.as_ref().unwrap()["k"], "w");
    assert_eq!(got.name_any(), "a");
    let listed = api
        .list(&ListParams::default())
        .await
        .expect("list through the proxy");
    assert_eq!(listed.items.len(), 1);
    // An API error travels back as the API server's Status.
    let missing = api.get("missing").await.expect_err("404");
    assert!(
        matches!(missing, kube::Error::Api(ref s) if s.code == 404),
        "{missing:?}"
    );

    let counts = proxy.counts();
    let expected: Vec<(&str, u64)> = vec![
        ("create configmaps", 1),
        ("get configmaps", 2),
        ("list configmaps", 1),
        ("patch configmaps", 1),
    ];
    let seen: Vec<(&str, u64)> = counts.0.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    assert_eq!(seen, expected);
    assert_eq!((counts.requests(), counts.writes()), (5, 2));
    // Each write, and only writes, timed: the create and the apply.
    assert_eq!(proxy.writes_answered(), 2);
    assert_eq!(proxy.write_times_since(1).len(), 1);
    assert!(proxy.write_times_since(3).is_empty());
}
