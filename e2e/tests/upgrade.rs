//! An upgrade over objects stored under the last release, against the cluster of `KUBECONFIG`:
//! the release's CRDs (tests/fixtures/released-crds/NEWEST/) installed, the seed examples created
//! and converged by the release's operator, which then stops; the current CRDs applied as
//! `run.sh` applies them (server-side); the current operator started behind the counting proxy.
//! Every object must survive unchanged, readable as the current types, and the current operator
//! must not write at all: what the release converged is already what it would write. With another
//! release's binary (`CDN_OPERATOR_PREVIOUS_BIN`), the children may change and the user's objects
//! may not; either way it prints how many Deployments, and pods, the upgrade rolls (a changed pod
//! template), the cost docs/adr/0013-what-an-upgrade-rolls.md explains.
//!
//! The release's operator is `CDN_OPERATOR_PREVIOUS_BIN` (the binary built from the release's
//! tag); without it, the current binary plays it, which is the same code as long as the newest
//! release is the version being developed (0.1.0 now). A test binary of its own: it replaces the
//! cluster's CRDs for a while, so it must not run beside the other e2e tests (cargo runs test
//! binaries one after another).

use cdn_operator::api::{At, CdnCluster, State};
use cdn_operator_e2e::proxy::Proxy;
use cdn_operator_e2e::{
    eventually, fixture, install_crds, operator_binary, repository_root, say, Env, OperatorOptions,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(60);

/// The newest released copy of the CRDs: (version, CRDs).
fn newest_release() -> (String, Vec<CustomResourceDefinition>) {
    let dir = repository_root().join("tests/fixtures/released-crds");
    let mut versions: Vec<(Vec<u64>, PathBuf)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .map(|path| {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let key = name
                .split(['.', '-'])
                .map(|n| n.parse().unwrap_or(u64::MAX))
                .collect();
            (key, path)
        })
        .collect();
    versions.sort();
    let (_, path) = versions.pop().expect("at least one released copy");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&path)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    let crds = files
        .iter()
        .map(|f| {
            let text = std::fs::read_to_string(f).unwrap();
            serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", f.display()))
        })
        .collect();
    let version = path.file_name().unwrap().to_string_lossy().into_owned();
    (version, crds)
}

/// The kinds of objects the operator is given (custom: true) and those it makes.
fn kinds() -> Vec<(ApiResource, bool)> {
    let custom = [
        ApiResource::erase::<CdnCluster>(&()),
        ApiResource::erase::<At>(&()),
    ];
    let made = [
        ApiResource::erase::<Deployment>(&()),
        ApiResource::erase::<ConfigMap>(&()),
        ApiResource::erase::<Service>(&()),
        ApiResource::erase::<PodDisruptionBudget>(&()),
        ApiResource::erase::<Pod>(&()),
    ];
    let custom = custom.into_iter().map(|r| (r, true));
    custom.chain(made.into_iter().map(|r| (r, false))).collect()
}

/// Every object of [`kinds`] in the namespace, by "Kind/name", as stored, less what others than
/// the user and the operator write: the status of built-in kinds (the controller manager's) and
/// its fields in managedFields, and the resourceVersion those writes move. Custom resources are
/// kept whole, resourceVersion included: nothing but the user and the operator writes them.
async fn snapshot(env: &Env) -> BTreeMap<String, Value> {
    let mut objects = BTreeMap::new();
    for (resource, custom) in kinds() {
        let api: Api<DynamicObject> = Api::namespaced_with(env.client.clone(), &env.ns, &resource);
        let list = api
            .list(&ListParams::default())
            .await
            .unwrap_or_else(|e| panic!("listing {}: {e}", resource.plural));
        for item in list.items {
            let mut value = serde_json::to_value(&item).unwrap();
            let name = value["metadata"]["name"].as_str().unwrap().to_string();
            // Pods of the caches' ReplicaSets are the controller manager's, not the operator's.
            let owned_by_replica_set = value["metadata"]["ownerReferences"]
                .as_array()
                .is_some_and(|refs| refs.iter().any(|r| r["kind"] == "ReplicaSet"));
            if name == "kube-root-ca.crt" || owned_by_replica_set {
                continue;
            }
            if !custom {
                let object = value.as_object_mut().unwrap();
                object.remove("status");
                let metadata = object["metadata"].as_object_mut().unwrap();
                metadata.remove("resourceVersion");
                if let Some(Value::Array(fields)) = metadata.get_mut("managedFields") {
                    fields.retain(|f| f["manager"] != "kube-controller-manager");
                }
                // The Deployment controller's revision annotation.
                if let Some(Value::Object(annotations)) = metadata.get_mut("annotations") {
                    annotations.remove("deployment.kubernetes.io/revision");
                }
            }
            objects.insert(format!("{}/{name}", resource.kind), value);
        }
    }
    objects
}

/// Waits until the namespace's objects stay the same for `quiet`, and returns them.
async fn settled(env: &Env, quiet: Duration) -> BTreeMap<String, Value> {
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut last = snapshot(env).await;
    loop {
        tokio::time::sleep(quiet).await;
        let now = snapshot(env).await;
        if now == last {
            return now;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the objects did not settle within {WAIT:?}:\n{}",
            changes(&last, &now)
        );
        last = now;
    }
}

/// The objects that differ between `before` and `after`, each with the paths that differ.
fn changes(before: &BTreeMap<String, Value>, after: &BTreeMap<String, Value>) -> String {
    let keys: std::collections::BTreeSet<&String> = before.keys().chain(after.keys()).collect();
    let mut lines = Vec::new();
    for key in keys {
        let (old, new) = (before.get(key), after.get(key));
        match (old, new) {
            (Some(old), Some(new)) if old != new => {
                let mut paths = Vec::new();
                differences("", old, new, &mut paths);
                lines.push(format!("{key}:\n  {}", paths.join("\n  ")));
            }
            (Some(_), None) => lines.push(format!("{key}: gone")),
            (None, Some(_)) => lines.push(format!("{key}: new")),
            _ => {}
        }
    }
    lines.join("\n")
}

/// The paths where `old` and `new` differ, with both values.
fn differences(path: &str, old: &Value, new: &Value, out: &mut Vec<String>) {
    match (old, new) {
        (Value::Object(o), Value::Object(n)) => {
            let keys: std::collections::BTreeSet<&String> = o.keys().chain(n.keys()).collect();
            for k in keys {
                let (a, b) = (
                    o.get(k).unwrap_or(&Value::Null),
                    n.get(k).unwrap_or(&Value::Null),
                );
                differences(&format!("{path}.{k}"), a, b, out);
            }
        }
        (Value::Array(o), Value::Array(n)) if o.len() == n.len() => {
            for (i, (a, b)) in o.iter().zip(n).enumerate() {
                differences(&format!("{path}[{i}]"), a, b, out);
            }
        }
        _ if old != new => out.push(format!("{path}: {old} -> {new}")),
        _ => {}
    }
}

fn reconciles(operator: &cdn_operator_e2e::Operator, controller: &str) -> f64 {
    operator
        .metric_sum(
            "controller_runtime_reconcile_total",
            &format!("controller=\"{controller}\""),
        )
        .unwrap_or(0.0)
}

#[tokio::test]
async fn objects_stored_under_the_last_release_survive_the_upgrade_with_no_write() {
    let (version, released) = newest_release();
    let Some(mut env) = Env::with_crds("upgrade", &released).await else {
        return;
    };
    let given = std::env::var_os("CDN_OPERATOR_PREVIOUS_BIN");
    let same_code = given.is_none();
    let previous = match given {
        Some(path) => PathBuf::from(path),
        None => {
            say(&format!(
                "e2e upgrade: the current binary plays the {version} operator \
                 (set CDN_OPERATOR_PREVIOUS_BIN to the release's binary)"
            ));
            operator_binary()
        }
    };
    let options = OperatorOptions {
        namespace: Some(env.ns.clone()),
        ..Default::default()
    };

    // What the release stored: the seed examples, as its operator converged them.
    let operator = options.start_binary("previous", &previous).await;
    env.operators.push(operator);
    for seed in [
        "cdncluster-cache-live",
        "cdncluster-cache-vod",
        "cdncluster-balancer",
        "at-example",
    ] {
        env.apply_yaml(&fixture(&format!("seed-examples/{seed}.yaml")))
            .await
            .unwrap_or_else(|e| panic!("{seed} under the {version} CRDs: {e}"));
    }
    for name in ["cache-live", "cache-vod", "balancer"] {
        eventually(&format!("{name} deployed"), WAIT, || async {
            let cluster = env.api::<CdnCluster>().get_opt(name).await.ok()??;
            let status = cluster.status?;
            let current = status.observed_generation == cluster.metadata.generation;
            let deployed = matches!(status.state, Some(State::Deploying | State::Running));
            (current && deployed).then_some(())
        })
        .await;
    }
    eventually("example-at's pod", WAIT, || async {
        let at = env.api::<At>().get_opt("example-at").await.ok()??;
        at.status?.pod_name.map(|_| ())
    })
    .await;
    let stored = settled(&env, Duration::from_secs(3)).await;
    let mut previous = env.operators.pop().unwrap();
    previous.terminate();
    let exit = previous.exit_within(Duration::from_secs(20)).await;
    assert!(
        exit.is_some_and(|s| s.success()),
        "the {version} operator stops cleanly: {exit:?}"
    );
    for kind in [
        "CdnCluster",
        "At",
        "Deployment",
        "ConfigMap",
        "Service",
        "Pod",
    ] {
        assert!(
            stored.keys().any(|k| k.starts_with(&format!("{kind}/"))),
            "a {kind} stored before the upgrade: {:?}",
            stored.keys()
        );
    }

    // The upgrade: the current CRDs, applied as run.sh applies them.
    install_crds(&env.client).await;
    let after_crds = snapshot(&env).await;
    assert!(
        after_crds == stored,
        "applying the current CRDs changed stored objects:\n{}",
        changes(&stored, &after_crds)
    );
    // Readable as the current types.
    let clusters = env.api::<CdnCluster>().list(&ListParams::default()).await;
    assert_eq!(
        clusters
            .expect("CdnClusters as the current type")
            .items
            .len(),
        3
    );
    let ats = env.api::<At>().list(&ListParams::default()).await;
    assert_eq!(ats.expect("Ats as the current type").items.len(), 1);

    // The current operator, every request it sends counted by the proxy.
    let proxy = Proxy::start(env.client.clone()).await.expect("proxy");
    let options = OperatorOptions {
        kubeconfig: Some(proxy.kubeconfig(env.dir.path())),
        ..options
    };
    let index = env.start_operator_with("current", options).await;
    eventually("the current operator's first reconciles", WAIT, || {
        let operator = &env.operators[index];
        let done = reconciles(operator, cdn_operator::cdncluster::CONTROLLER) >= 3.0
            && reconciles(operator, cdn_operator::at::CONTROLLER) >= 1.0;
        std::future::ready(done.then_some(()))
    })
    .await;
    // A steady window on top: a write the reconciles scheduled (a requeue, an Event) shows here.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let counts = proxy.counts();
    assert!(
        counts.requests() > 0,
        "the operator's requests go through the proxy"
    );
    let writes = counts.only_writes();
    let after = snapshot(&env).await;
    // What the upgrade costs the CDN: the Deployments whose pod template it changed roll their
    // pods (caches on emptyDir start empty).
    let deployments: Vec<&String> = stored
        .keys()
        .filter(|k| k.starts_with("Deployment/"))
        .collect();
    let rolled: Vec<&String> = deployments
        .iter()
        .copied()
        .filter(|k| {
            after.get(*k).map(|a| &a["spec"]["template"]) != Some(&stored[*k]["spec"]["template"])
        })
        .collect();
    let pods: u64 = rolled
        .iter()
        .filter_map(|k| stored[*k]["spec"]["replicas"].as_u64())
        .sum();
    say(&format!(
        "e2e upgrade: from the {version} operator, {} of {} Deployments roll their pods ({pods} pods): {rolled:?}; {} writes {:?}",
        rolled.len(),
        deployments.len(),
        writes.0.values().sum::<u64>(),
        writes.0,
    ));
    if same_code {
        assert!(
            writes.0.is_empty(),
            "the current operator wrote over objects the {version} operator converged: {:?}",
            writes.0
        );
        assert!(
            after == stored,
            "objects changed across the upgrade:\n{}",
            changes(&stored, &after)
        );
    } else {
        // Another release's operator: the children may change (reported above), never what the
        // user wrote.
        for (key, object) in stored
            .iter()
            .filter(|(k, _)| k.starts_with("CdnCluster/") || k.starts_with("At/"))
        {
            assert_eq!(
                after.get(key).map(|a| &a["spec"]),
                Some(&object["spec"]),
                "the upgrade changed the spec of {key}"
            );
        }
        let user_writes: Vec<&String> = writes
            .0
            .keys()
            .filter(|k| k.ends_with(" cdnclusters") || k.ends_with(" ats"))
            .collect();
        assert!(
            user_writes.is_empty(),
            "the upgrade wrote the user's objects: {user_writes:?}"
        );
    }
}
