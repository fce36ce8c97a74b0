//! CdnPurge end to end, against the cluster of `KUBECONFIG` (a real API server, no kubelet): the
//! API server refuses bad purges with clear messages; the operator (the built binary, out of
//! cluster) keeps its key in a Secret, publishes it to the caches' ConfigMaps, and has every cache
//! pod below a purge's CdnCluster apply it. The pods are the ReplicaSets' own; the test plays
//! their kubelet (writing them Running, each on a loopback address of its own) and runs their
//! sidecars (`cdn-operator nginx-metrics`, on a cache folder of files as nginx writes them).
//! On a cluster with a node the kubelet owns the pods' status: the node tests cover it there.

use cdn_operator::api::{CdnPurge, PurgePhase, State};
use cdn_operator::nginx_cache::{file, wire};
use cdn_operator::purge::signing;
use cdn_operator_e2e::{eventually, say, Env, OperatorOptions};
use cdn_operator_testkit::settle;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, Secret};
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(60);
/// When the caches' objects were fetched: before every purge.
const FETCHED: i64 = 1_700_000_000;

/// Whether a node's kubelet runs the pods (it would overwrite the status this test writes).
async fn kubelet_runs(env: &Env) -> bool {
    let nodes = Api::<Node>::all(env.client.clone())
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    nodes.iter().any(|n| {
        n.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
    })
}

/// Creates the purge `name` with `spec` as raw JSON, as a user would; the API server's answer.
async fn create_purge(env: &Env, name: &str, spec: serde_json::Value) -> Result<(), kube::Error> {
    let object: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cluster.anevia.com/v1", "kind": "CdnPurge",
        "metadata": {"name": name}, "spec": spec,
    }))
    .unwrap();
    let resource = kube::core::ApiResource::erase::<CdnPurge>(&());
    let api: Api<DynamicObject> = Api::namespaced_with(env.client.clone(), &env.ns, &resource);
    api.create(&PostParams::default(), &object)
        .await
        .map(|_| ())
}

/// The API server's refusal of the purge `spec`.
async fn refused(env: &Env, spec: serde_json::Value) -> String {
    match create_purge(env, "bad", spec.clone()).await {
        Ok(()) => panic!("the API server accepted {spec}"),
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 422, "{spec}: {status:?}");
            status.message
        }
        Err(other) => panic!("{spec}: {other}"),
    }
}

#[tokio::test]
async fn bad_purges_are_refused_by_the_api_server_with_a_clear_message() {
    let Some(env) = Env::new("purge-bad-input").await else {
        return;
    };
    let cases = [
        (
            json!({"cdnCluster": "edge"}),
            "spec: Invalid value: a purge names what it invalidates: paths, prefixes, regexes or surrogateKeys (at least one entry), or all: true for every object",
        ),
        (
            json!({"cdnCluster": "edge", "paths": []}),
            "a purge names what it invalidates",
        ),
        (
            json!({"cdnCluster": "edge", "all": true, "prefixes": ["/vod/"]}),
            "all: true purges every object and takes no paths, prefixes, regexes or surrogateKeys",
        ),
        (
            json!({"cdnCluster": "edge", "prefixes": ["/"]}),
            "spec.prefixes[0]: Invalid value: \"/\": the prefix / would purge every object: say so with all: true",
        ),
        (
            json!({"cdnCluster": "edge", "regexes": [".*"]}),
            "must be a valid RE2 regular expression that does not match the path / (one that does would purge every object: say so with all: true)",
        ),
        (
            json!({"cdnCluster": "edge", "regexes": ["/vod/(a"]}),
            "error parsing regexp: missing closing ): `/vod/(a`",
        ),
        (
            json!({"cdnCluster": "edge", "paths": ["vod/a.ts"]}),
            "spec.paths[0]: Invalid value: \"vod/a.ts\": a path starts with /",
        ),
        (
            json!({"cdnCluster": "edge", "surrogateKeys": ["two keys"]}),
            "spec.surrogateKeys[0]",
        ),
        (
            json!({"cdnCluster": "edge", "paths": ["/a"], "mode": "gone"}),
            "spec.mode: Unsupported value: \"gone\"",
        ),
    ];
    for (spec, expected) in cases {
        let message = refused(&env, spec.clone()).await;
        assert!(message.contains(expected), "{spec}: {message}");
    }
    // A record: its spec cannot change once created.
    create_purge(
        &env,
        "fix",
        json!({"cdnCluster": "edge", "paths": ["/a.ts"]}),
    )
    .await
    .expect("a valid purge");
    let changed = env
        .api::<CdnPurge>()
        .patch(
            "fix",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"paths": ["/b.ts"]}})),
        )
        .await;
    match changed {
        Err(kube::Error::Api(status)) => assert!(
            status
                .message
                .contains("a CdnPurge records one purge: its spec cannot change (create another)"),
            "{}",
            status.message
        ),
        other => panic!("a changed purge was accepted: {other:?}"),
    }
}

/// A pod's sidecar, running.
struct Sidecar(std::process::Child);

impl Drop for Sidecar {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the sidecar of the pod of `cluster` at `ip`, on `cache`, with the keys of `keys`.
fn sidecar(env: &Env, cluster: &str, ip: &str, cache: &Path, keys: &Path) -> Sidecar {
    let dir = env.dir.path();
    let listen = format!("{ip}:{}", cdn_operator::nginx_metrics::PORT);
    let child = std::process::Command::new(cdn_operator_e2e::operator_binary())
        .arg("nginx-metrics")
        .arg("--log")
        .arg(dir.join(format!("{cluster}.log")))
        .arg("--nginx-status")
        .arg(dir.join(format!("{cluster}.sock")))
        .args(["--listen", &listen])
        .args(["--cdncluster", cluster, "--role", "cache"])
        .arg("--cache-dir")
        .arg(cache)
        .args(["--cache-max-size", "1000000"])
        .arg("--purge-keys")
        .arg(keys)
        .args(["--namespace", &env.ns])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("the sidecar starts");
    let up = settle(
        Duration::from_secs(10),
        Duration::from_millis(20),
        || std::net::TcpStream::connect(&listen).is_ok(),
        |up| *up,
    );
    assert!(up, "the sidecar serves on {listen}");
    Sidecar(child)
}

/// A cache folder with `objects` (path, surrogate keys), as nginx writes them.
fn cache(dir: &Path, name: &str, objects: &[(&str, &str)]) -> PathBuf {
    let folder = dir.join(name);
    for (i, (path, tags)) in objects.iter().enumerate() {
        let sub = folder.join(format!("{}/{:02x}", i % 16, i));
        std::fs::create_dir_all(&sub).unwrap();
        let header = format!("HTTP/1.1 200 OK\r\nSurrogate-Key: {tags}\r\n\r\n");
        let key = format!("GETcdn.example{path}bytes=0-1048575");
        let bytes = file::format(&key, FETCHED, FETCHED + 86_400, &header, b"body");
        std::fs::write(sub.join(format!("{i:032x}")), bytes).unwrap();
    }
    folder
}

/// Whether the object of `path` in `folder` is still served (not hard-purged).
fn live(folder: &Path, path: &str) -> bool {
    let mut stack = vec![folder.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let p = entry.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let object = file::parse(&std::fs::read(&p).unwrap()).unwrap();
                if object.key.contains(path) {
                    return object.is_live();
                }
            }
        }
    }
    panic!("no object {path} in {}", folder.display())
}

/// Plays the kubelet of the pod of `cluster`: Running at `ip`.
async fn run_pod(env: &Env, cluster: &str, ip: &str) {
    let pods = env.api::<Pod>();
    let selector = cdn_operator::cdncluster::build::pod_selector_string(cluster);
    let pod: Pod = eventually(&format!("the pod of {cluster}"), WAIT, || async {
        pods.list(&ListParams::default().labels(&selector))
            .await
            .ok()?
            .items
            .into_iter()
            .next()
    })
    .await;
    let name = pod.metadata.name.unwrap();
    let status = json!({"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}});
    pods.patch_status(&name, &PatchParams::default(), &Patch::Merge(status))
        .await
        .expect("the pod's status, as a kubelet writes it");
}

async fn wait_phase(env: &Env, name: &str, phase: PurgePhase) -> CdnPurge {
    eventually(&format!("CdnPurge {name} {phase:?}"), WAIT, || async {
        let purge = env.api::<CdnPurge>().get_opt(name).await.ok()??;
        (purge.status.as_ref()?.phase == Some(phase)).then_some(purge)
    })
    .await
}

fn ready_message(purge: &CdnPurge) -> String {
    purge
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
        .map(|c| format!("{} {}: {}", c.status, c.reason, c.message))
        .unwrap_or_default()
}

#[tokio::test]
async fn a_purge_of_the_edge_is_applied_by_every_cache_pod_below_it_and_completes() {
    let Some(mut env) = Env::new("purge").await else {
        return;
    };
    if kubelet_runs(&env).await {
        say("e2e purge skipped: a kubelet runs the pods here (the node tests cover purges on it)");
        return;
    }
    let options = OperatorOptions {
        namespace: Some(env.ns.clone()),
        // The pods get the sidecar that applies purges.
        args: vec!["--nginx-metrics-image=localhost/cdn-operator:e2e".into()],
        ..Default::default()
    };
    env.start_operator_with("operator", options).await;
    for (name, role, sources) in [
        (
            "shield",
            "cache",
            json!([{"name": "origin", "origin": {"url": "http://origin.example"}}]),
        ),
        ("mid", "cache", json!([{"name": "shield"}])),
        ("edge", "balancer", json!([{"name": "mid"}])),
    ] {
        env.create_cluster(name, json!({"role": role, "sources": sources}))
            .await
            .expect("a CdnCluster");
    }
    for name in ["shield", "mid", "edge"] {
        eventually(&format!("{name} deployed"), WAIT, || async {
            let c = env
                .api::<cdn_operator::api::CdnCluster>()
                .get(name)
                .await
                .ok()?;
            matches!(c.status?.state, Some(State::Deploying | State::Running)).then_some(())
        })
        .await;
    }
    // The operator made its key: the Secret holds it, the caches' ConfigMaps publish it.
    let secret: Secret = env
        .api()
        .get(signing::SECRET_NAME)
        .await
        .expect("the key's Secret");
    let pkcs8 = &secret.data.unwrap()[signing::KEY_ENTRY].0;
    let published = signing::Signer::from_pkcs8(pkcs8)
        .unwrap()
        .public_keys_file();
    let keys = env.dir.path().join(wire::PUBLIC_KEYS_KEY);
    for cache in ["shield", "mid"] {
        let cm: ConfigMap = env.api().get(&format!("{cache}-nginx")).await.unwrap();
        assert_eq!(
            cm.data.unwrap()[wire::PUBLIC_KEYS_KEY],
            published,
            "{cache}"
        );
    }
    let edge: ConfigMap = env.api().get("edge-nginx").await.unwrap();
    assert!(
        !edge.data.unwrap().contains_key(wire::PUBLIC_KEYS_KEY),
        "a balancer caches nothing"
    );
    std::fs::write(&keys, &published).unwrap();

    let objects = [
        ("/vod/t1/1.ts", "title-1"),
        ("/vod/t1/2.ts", "title-1 season-1"),
        ("/vod/t2/1.ts", "title-2"),
        ("/live/ch1.m3u8", "live"),
    ];
    let folders = [
        cache(env.dir.path(), "shield", &objects),
        cache(env.dir.path(), "mid", &objects),
    ];
    run_pod(&env, "shield", "127.0.0.2").await;
    run_pod(&env, "mid", "127.0.0.3").await;
    let _shield = sidecar(&env, "shield", "127.0.0.2", &folders[0], &keys);
    let mut mid = Some(sidecar(&env, "mid", "127.0.0.3", &folders[1], &keys));

    create_purge(
        &env,
        "takedown",
        json!({"cdnCluster": "edge", "surrogateKeys": ["title-1"]}),
    )
    .await
    .unwrap();
    let purge = wait_phase(&env, "takedown", PurgePhase::Complete).await;
    let status = purge.status.clone().unwrap();
    assert_eq!(status.clusters, ["shield", "mid"], "the deepest first");
    assert_eq!(status.progress.as_deref(), Some("2/2"));
    assert_eq!(status.objects, Some(4), "two objects on each cache");
    let message = ready_message(&purge);
    assert!(
        message.starts_with("True Complete: 4 objects invalidated on 2 pods of shield, mid in "),
        "{message}"
    );
    for folder in &folders {
        assert!(!live(folder, "/vod/t1/1.ts") && !live(folder, "/vod/t1/2.ts"));
        assert!(live(folder, "/vod/t2/1.ts") && live(folder, "/live/ch1.m3u8"));
    }
    let events = env.events().await;
    let purged: Vec<_> = events.iter().filter(|e| e.0 == "takedown").collect();
    assert_eq!(purged.len(), 1, "{events:?}");
    assert_eq!(
        (purged[0].1.as_str(), purged[0].2.as_str()),
        ("Normal", "Purged")
    );

    // A pod whose sidecar does not answer: the purge waits for it, says so, and completes once
    // it answers again.
    drop(mid.take());
    create_purge(
        &env,
        "live",
        json!({"cdnCluster": "edge", "paths": ["/live/ch1.m3u8"]}),
    )
    .await
    .unwrap();
    let waiting = wait_phase(&env, "live", PurgePhase::Purging).await;
    let message = ready_message(&waiting);
    assert!(
        message.contains("False PodNotPurged: waiting for pod mid-deployment-"),
        "{message}"
    );
    assert!(message.contains("127.0.0.3:9113"), "{message}");
    let _mid = sidecar(&env, "mid", "127.0.0.3", &folders[1], &keys);
    let done = wait_phase(&env, "live", PurgePhase::Complete).await;
    assert_eq!(done.status.unwrap().progress.as_deref(), Some("2/2"));
    assert!(folders.iter().all(|f| !live(f, "/live/ch1.m3u8")));
    // The Event follows the Complete status: waited for (5 s at most), then compared whole.
    let mut reasons: Vec<String> = Vec::new();
    for _ in 0..20 {
        reasons = (env.events().await.into_iter())
            .filter(|e| e.0 == "live")
            .map(|e| e.2)
            .collect();
        if reasons.len() >= 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    assert_eq!(reasons, ["PurgeRetrying", "Purged"]);

    // A purge of a CdnCluster that does not exist fails, once.
    create_purge(
        &env,
        "nowhere",
        json!({"cdnCluster": "not-here", "paths": ["/a"]}),
    )
    .await
    .unwrap();
    let failed = wait_phase(&env, "nowhere", PurgePhase::Failed).await;
    assert_eq!(
        ready_message(&failed),
        "False CdnClusterNotFound: there is no CdnCluster not-here in the namespace"
    );
    // Over: nothing more written about them.
    let versions = |purges: Vec<CdnPurge>| -> Vec<Option<String>> {
        purges
            .into_iter()
            .map(|p| p.metadata.resource_version)
            .collect()
    };
    let before = versions(
        env.api::<CdnPurge>()
            .list(&ListParams::default())
            .await
            .unwrap()
            .items,
    );
    tokio::time::sleep(Duration::from_secs(6)).await;
    let after = versions(
        env.api::<CdnPurge>()
            .list(&ListParams::default())
            .await
            .unwrap()
            .items,
    );
    assert_eq!(before, after, "no write once over");
}
