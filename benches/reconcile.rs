//! In-memory benchmark of the CdnCluster reconcile: `cargo bench --bench reconcile`.
//!
//! NOT the target setup (a real API server, see e2e/): the API is kube-fake-client, in
//! process, so the figures measure the operator's own work (resolve, build, compare, apply,
//! status, Events) and its write discipline, without network or API server costs.
//!
//! 1. 1,000 CdnClusters (per group of ten: one balancer routing to nine caches with URL origins,
//!    over ten namespaces) reconciled with the real `cdncluster::reconcile`, caches filled from the
//!    API as the watches would fill them: time, writes per reconcile; then a second pass after the
//!    caches caught up: writes must be 0. Then the same with 10,000: the time per reconcile should
//!    not grow with the objects cached.
//! 2. Resident memory of the caches (kube's store of CdnClusters, compact records of children)
//!    holding 10,000 CdnClusters and their 30,000 children as
//!    the operator caches them, made from objects a real v1.36 API server returned (defaults,
//!    status, managedFields: `tests/fixtures/real-server/`).
//!
//! Under `cargo test` (no `--bench` argument) it runs a small size, as a check of the invariants.

use cdn_operator::api::{CdnCluster, CdnClusterSpec, Role, Source};
use cdn_operator::cdncluster::{self, Context};
use cdn_operator::kubernetes::cache;
use cdn_operator::kubernetes::compact::Compact;
use cdn_operator::kubernetes::events::Events;
use cdn_operator::kubernetes::index::Index;
use cdn_operator::kubernetes::records::Records;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use kube::api::{Api, PostParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::FakeApi;

#[path = "../tests/support/mod.rs"]
mod support;

const NAMESPACES: usize = 10;
const GROUP: usize = 10;

/// The benchmark's topology: cluster `i` of `n`, in its namespace.
fn cluster(i: usize) -> CdnCluster {
    let group = i / GROUP;
    let namespace = format!("bench-{}", group % NAMESPACES);
    let (name, spec) = if i.is_multiple_of(GROUP) {
        let sources = (1..GROUP)
            .map(|k| Source::cluster(&format!("c{group}-{k}"), Some(&format!("^/c{k}/"))))
            .collect();
        (format!("b{group}"), spec(Role::Balancer, sources))
    } else {
        let origin = Source::url(
            "origin",
            &format!("http://origin-{group}.example.com:8080/media"),
            None,
        );
        (
            format!("c{group}-{}", i % GROUP),
            spec(Role::Cache, vec![origin]),
        )
    };
    let mut cluster = CdnCluster::new(&name, spec);
    cluster.metadata.namespace = Some(namespace);
    cluster
}

fn spec(role: Role, sources: Vec<Source>) -> CdnClusterSpec {
    CdnClusterSpec {
        replicas: 2,
        ..CdnClusterSpec::new(role, sources)
    }
}

struct Pass {
    elapsed: Duration,
    writes: BTreeMap<String, u64>,
}

/// Reconciles every CdnCluster of the caches once, one after the other (the figure is the
/// operator's cost per reconcile; the controller runs up to 16 at once).
async fn pass(ctx: &Arc<Context>, fake: &FakeApi) -> Pass {
    let clusters = ctx.clusters.state();
    fake.take_writes();
    let start = Instant::now();
    for cluster in clusters {
        cdncluster::reconcile(cluster, ctx.clone())
            .await
            .expect("reconcile");
    }
    let elapsed = start.elapsed();
    // By "verb Kind": the log names each object too.
    let mut writes = BTreeMap::new();
    for entry in fake.take_writes() {
        let kind: Vec<&str> = entry.split(' ').take(2).collect();
        *writes.entry(kind.join(" ")).or_insert(0) += 1;
    }
    Pass { elapsed, writes }
}

fn total(writes: &BTreeMap<String, u64>) -> u64 {
    writes.values().sum()
}

async fn reconcile_bench(n: usize) -> serde_json::Value {
    let fake = FakeApi::new().await;
    let client = fake.client.clone();
    for i in 0..n {
        let c = cluster(i);
        let api: Api<CdnCluster> =
            Api::namespaced(client.clone(), c.namespace().as_deref().unwrap());
        api.create(&PostParams::default(), &c)
            .await
            .expect("create");
    }
    let events = || Events::new(client.clone(), Some("bench".into()));
    let ctx = fake.context(events()).await;
    let first = pass(&ctx, &fake).await;
    // The watches deliver what the first pass wrote; then nothing is left to do.
    let ctx = fake.context(events()).await;
    let second = pass(&ctx, &fake).await;

    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!("== in-memory reconcile (kube-fake-client, not a real API server) ==");
    println!(
        "{n} CdnClusters ({} balancers, {} caches) in {NAMESPACES} namespaces",
        n.div_ceil(GROUP),
        n - n.div_ceil(GROUP)
    );
    println!("| pass | time | per reconcile | writes | writes/reconcile |");
    println!("|---|---|---|---|---|");
    for (label, p) in [
        ("first (children + status + Events)", &first),
        ("second (caches caught up)", &second),
    ] {
        println!(
            "| {label} | {:.0} ms | {:.3} ms | {} | {:.2} |",
            ms(p.elapsed),
            ms(p.elapsed) / n as f64,
            total(&p.writes),
            total(&p.writes) as f64 / n as f64
        );
    }
    println!("first-pass writes by kind: {:?}", first.writes);
    assert_eq!(
        first.writes.get("patch ConfigMap").copied().unwrap_or(0) as usize,
        n,
        "one ConfigMap apply per CdnCluster"
    );
    assert_eq!(
        total(&second.writes),
        0,
        "an unchanged world costs no write: {:?}",
        second.writes
    );
    serde_json::json!({
        "clusters": n,
        "first_pass_ms": ms(first.elapsed),
        "first_pass_writes": total(&first.writes),
        "first_pass_writes_by_kind": first.writes,
        "second_pass_ms": ms(second.elapsed),
        "second_pass_writes": total(&second.writes),
    })
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// A real-server fixture (`tests/fixtures/real-server/`) as object `i` of the benchmark: its own
/// name, namespace, uid and resourceVersion, and its controller's; the rest (defaults, status,
/// managedFields) as the API server returned it. The controller's uid is also in the
/// managedFields (`k:{"uid":…}`): replaced there too, as each child of a real server has its own.
fn served(fixture: &str, i: usize) -> serde_json::Value {
    let path = format!(
        "{}/tests/fixtures/real-server/{fixture}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let obj: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    let owner_uid = format!("0d7c0b57-3c8e-4a0e-b1f3-{i:012x}");
    let text = match obj["metadata"]["ownerReferences"][0]["uid"].as_str() {
        Some(uid) => {
            assert_eq!(
                text.matches(uid).count(),
                2,
                "{path}: the owner uid in ownerReferences and managedFields"
            );
            text.replace(uid, &owner_uid)
        }
        None => text,
    };
    let mut obj: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    let name = format!("cluster-{i}");
    let meta = &mut obj["metadata"];
    meta["name"] = name.clone().into();
    meta["namespace"] = format!("bench-{}", i % NAMESPACES).into();
    meta["uid"] = format!("6f1c2f0e-8d5b-4c1e-9a57-{i:012x}").into();
    meta["resourceVersion"] = (1_000_000 + i).to_string().into();
    if let Some(owner) = meta["ownerReferences"].get_mut(0) {
        owner["name"] = name.into();
    }
    obj
}

/// Object `i` of a kind, from the fixture of a balancer (one in ten, as in the topology) or a cache.
fn kind_of(i: usize, kind: &str) -> String {
    let of = if i.is_multiple_of(GROUP) {
        "balancer"
    } else {
        "cache-live"
    };
    format!("{kind}-{of}")
}

/// CdnCluster `i` as the operator caches it: typed, [`cache::strip`]ped.
fn cached_cluster(i: usize) -> CdnCluster {
    let mut cluster: CdnCluster =
        serde_json::from_value(served(&kind_of(i, "cdncluster"), i)).expect("a CdnCluster");
    cache::strip(&mut cluster);
    cluster
}

/// Child `i` of a kind as the operator caches it: compact, read from the JSON as a watch reads it.
fn cached_child<K>(i: usize, kind: &str) -> Compact<K> {
    serde_json::from_value(served(&kind_of(i, kind), i)).expect("a child")
}

/// Fills one compact cache with `n` children made by `make`, as the watch fills it; (RSS growth
/// in KiB, JSON bytes of the objects as delivered, compacted).
fn fill_records<K>(n: usize, make: impl Fn(usize) -> Compact<K>) -> (Records, u64, usize)
where
    K: Resource<DynamicType = ()> + Send + 'static,
{
    let records = Records::default();
    let mut writer = records.writer();
    let before = rss_kib();
    let mut bytes = 0;
    for i in 0..n {
        let obj = make(i);
        bytes += serde_json::to_vec(&obj).unwrap().len();
        writer.apply(&obj);
    }
    let grown = rss_kib().saturating_sub(before);
    assert_eq!(records.len(), n);
    (records, grown, bytes)
}

/// Fills one store with `n` objects made by `make`; (RSS growth in KiB, JSON bytes).
fn fill<K>(n: usize, make: impl Fn(usize) -> K) -> (Store<K>, u64, usize)
where
    K: Resource<DynamicType = ()> + Clone + serde::Serialize + 'static,
{
    let (reader, mut writer) = reflector::store::<K>();
    let before = rss_kib();
    let mut bytes = 0;
    for i in 0..n {
        let obj = make(i);
        bytes += serde_json::to_vec(&obj).unwrap().len();
        writer.apply_watcher_event(&watcher::Event::Apply(obj));
    }
    let grown = rss_kib().saturating_sub(before);
    assert_eq!(reader.len(), n);
    (reader, grown, bytes)
}

fn memory_bench(n: usize) -> serde_json::Value {
    // Warm up: one-time allocations (lazy statics, the interner) are not cache.
    for i in 0..GROUP.min(n) {
        drop((
            cached_cluster(i),
            cached_child::<Deployment>(i, "deployment"),
        ));
    }
    let before = rss_kib();
    // One kind after the other, so each store's growth is seen on its own.
    let (clusters, c_kib, c_bytes) = fill(n, cached_cluster);
    let (config_maps, m_kib, m_bytes) =
        fill_records(n, |i| cached_child::<ConfigMap>(i, "configmap"));
    let (services, s_kib, s_bytes) = fill_records(n, |i| cached_child::<Service>(i, "service"));
    let (deployments, d_kib, d_bytes) =
        fill_records(n, |i| cached_child::<Deployment>(i, "deployment"));
    let after = rss_kib();
    let delta = after.saturating_sub(before);
    let bytes = c_bytes + m_bytes + s_bytes + d_bytes;
    println!("== in-memory cache footprint (the operator's caches, objects as a real API server returns them) ==");
    println!("| store | objects | VmRSS growth | per object | JSON per object as cached |");
    println!("|---|---|---|---|---|");
    for (kind, kib, json) in [
        ("CdnCluster", c_kib, c_bytes),
        ("ConfigMap", m_kib, m_bytes),
        ("Service", s_kib, s_bytes),
        ("Deployment", d_kib, d_bytes),
    ] {
        println!(
            "| {kind} | {n} | {:.1} MiB | {:.2} KiB | {:.2} KiB |",
            kib as f64 / 1024.0,
            kib as f64 / n as f64,
            json as f64 / n as f64 / 1024.0
        );
    }
    println!(
        "| all | {} | {:.1} MiB ({:.1} → {:.1} MiB) | {:.1} KiB per CdnCluster with its children | {:.1} MiB in all |",
        4 * n,
        delta as f64 / 1024.0,
        before as f64 / 1024.0,
        after as f64 / 1024.0,
        delta as f64 / n as f64,
        bytes as f64 / 1048576.0
    );
    let held = clusters.len() + config_maps.len() + services.len() + deployments.len();
    assert_eq!(held, 4 * n);
    serde_json::json!({
        "clusters": n,
        "children": 3 * n,
        "rss_before_kib": before,
        "rss_after_kib": after,
        "rss_delta_kib": delta,
        "rss_growth_kib": {"CdnCluster": c_kib, "ConfigMap": m_kib, "Service": s_kib, "Deployment": d_kib},
        "json_bytes": {"CdnCluster": c_bytes, "ConfigMap": m_bytes, "Service": s_bytes, "Deployment": d_bytes},
    })
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --all-targets` runs this too, without it: small.
    let full = std::env::args().any(|a| a == "--bench");
    let (n, cached) = if full { (1_000, 10_000) } else { (50, 200) };
    // Memory first, in a fresh heap: memory freed by the reconcile benchmark would otherwise be
    // reused by the stores and hide part of their growth.
    let memory = memory_bench(cached);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let reconcile = runtime.block_on(reconcile_bench(n));
    // Again with ten times as many: the operator's own work per reconcile should not grow with
    // the number of objects it caches.
    let reconcile_at_10000 = full.then(|| runtime.block_on(reconcile_bench(10_000)));
    let report = serde_json::json!({
        "setup": "in-memory (kube-fake-client), not a real API server",
        "reconcile": reconcile,
        "reconcile_at_10000": reconcile_at_10000,
        "cache_memory": memory,
    });
    if full {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench-reconcile.json");
        std::fs::write(&path, serde_json::to_string_pretty(&report).unwrap()).expect("write JSON");
        println!("JSON: {}", path.display());
    }
}
