//! The data-plane benchmark: what the nginx configurations a cdn-operator binary renders do with
//! real traffic, on nginx 1.30 (the pods' release, testkit's sandboxed runner) on loopback.
//!
//! `cargo run --release -p cdn-operator-e2e --bin dataplane -- [--before OLD_BINARY] [--json FILE]`
//!
//! Method. The topology (balancer `edge` over a pool of caches `cache-1` and `cache-2`, both
//! fetching from the Service `origin:8080`, namespace `default`) is written as YAML to a temporary
//! directory and rendered by the binary under test (`cdn-operator render -f`: the ConfigMaps and
//! Deployments it would apply). Each CdnCluster then runs as its pod would: in its own sandbox
//! (read-only root; a fresh tmpfs at each emptyDir mount of the rendered Deployment, i.e. /tmp and
//! /var/cache/nginx; the ConfigMap's files at its mount, /etc/nginx/cdn, laid out as the kubelet
//! does with a `..data` symlink), started with the Deployment's command word for word (the new
//! `/bin/sh /etc/nginx/cdn/run.sh`, or the old `nginx -e stderr -c … -g 'daemon off;'`), as uid 101
//! (the image's user), its standard output (the access log) kept in a file as a container runtime
//! keeps it. Names resolve as in a cluster: the sandbox's /etc/resolv.conf names a DNS server of the
//! benchmark at 127.0.0.53 (which nginx asks for the names it looks up while it runs: the
//! Services' fully qualified names, `edge.default.svc.cluster.local` …), and its /etc/hosts holds
//! the short names (`edge.default.svc`, which older configurations resolve when nginx starts):
//! edge → 127.0.0.10, cache-1 → 127.0.0.11, cache-2 → 127.0.0.12, origin → 127.0.0.20.
//!
//! The one change to the generated text: its line `listen 8080;` becomes `listen 127.0.0.X:80;`
//! (the pod's address and its Service's port, as a parent reaches it). Nothing else is touched.
//!
//! The whole run is in a network namespace of its own (when the process may make one: it is root):
//! only its own traffic on its own loopback, so the kernel's count of accepted TCP connections
//! (`PassiveOpens` of /proc/net/snmp) is the benchmark's alone, and no other test's nginx on the
//! same 127.0.0.x addresses interferes; there, ports below 1024 are opened to any uid, so the pods
//! run unprivileged. Without it (not root), the pods run as root and row 1's count of the caches'
//! connections is not measured.
//!
//! The origin is an nginx (same sandbox kind, one process) at 127.0.0.20:8080 with `stub_status`
//! on :8081 (accepted connections) and an access log of `$msec|$request|$status|$bytes_sent|
//! $connection|$http_range|$host`, from which each row counts the requests and bytes of its own
//! URLs (every row asks for URLs of its own). It serves 1 KiB objects (`/obj/*`), 2,000 segment
//! files (`/seg/NNNN.ts`), a 50 MB file of random bytes (`/big/*`), a page per Host
//! (`/site/page.html` from `sites/$host/`), 503 (`/err/*`), `Cache-Control: no-cache`
//! (`/nocache/*`), 404 (anything missing), live manifests (`/live/*.m3u8`, no Cache-Control nor
//! Expires), a slow 64 KiB object (`/slow/*`, 128 KiB/s: 0.5 s, so that concurrent misses
//! overlap), a 1 MiB object (`/mib/*`), a 4 MiB one (`/m4/*`), 16 files of 0.5 to 2 MiB
//! (`/z/SERVER/RANK-CLASS`, row 23), the 1 KiB object with a lifetime of 1 s (`/short/*`),
//! versioned objects (`/pv/*`, files of row 16) and the 1 KiB object tagged by its path
//! (`/pt/TAG/*`, `Surrogate-Key: TAG`). A hung origin is every process of its sandbox stopped
//! (SIGSTOP), then continued.
//! A second nginx serves the files directly (static, with the generated configurations' http
//! settings: workers, sendfile, keepalive, buffered access log, but nginx's own
//! `sendfile_max_chunk`: its files start on a page) as the throughput limit.
//!
//! Measured (rows of the table; each row asks for URLs of its own):
//! 1. TCP connections the origin accepts (stub_status) for 500 sequential misses over one
//!    keep-alive client connection; the caches' accepted connections in the same loop (the
//!    namespace's PassiveOpens less the client's and the origin's);
//! 2. req/s of a cached 1 KiB object through balancer -> cache against nginx serving it directly
//!    (wrk), and (2b) of its cache alone; (2m) the same through balancer -> cache with every
//!    pod's metrics sidecar against without (the topology rendered again with
//!    `--nginx-metrics-image`: the pods replaced, each sidecar the binary under test in a
//!    sandbox of its own sharing the pod's emptyDirs, its listen address moved to the pod's),
//!    off, on, on, off, and what the balancer's sidecar counted of wrk's requests; (2s) what
//!    signed URLs cost: req/s of a cached 1 KiB (2s) and 1 MiB (2s-1m) object through balancer
//!    -> cache, the balancer rendered with `signedUrls` (its pod with the Secret of one key
//!    mounted, as the kubelet projects it; every request carrying one valid token, which the
//!    verifier remembers) against without, the same URLs, off, on, on, off, `--wrk-rounds`
//!    times, the balancer's pod replaced at each switch (the caches keep their objects); (2s-new)
//!    a new token per request (20,000 tokens in turn, more than the verifier remembers: every
//!    MAC verified) against the same off runs;
//! 3. whose body and X-Cache-Status `Host: customer-b` gets after `customer-a` cached the path;
//! 4. failures of 20 cached segments after 3 quick origin 503s;
//! 5. failures of 75 cached requests during an origin 503 a second;
//! 6. failures of 100 cached requests while the origin is hung;
//! 7. a cold range (last 1 MB of 50 MB): time to first byte, bytes the origin sent;
//! 8. 8 concurrent cold ranges of another 50 MB object: bytes the origin sent, the slowest;
//! 9. 200 concurrent requests for a 404, then for a no-cache object: p50 latency, origin requests;
//! 10. origin requests for 20 sequential requests of a missing object;
//! 11. seconds until a changed live manifest (no Cache-Control) is served;
//! 12. origin requests for 200 concurrent misses of one object;
//! 13. bytes the origin sends for a HEAD of an uncached 50 MB object;
//! 14. hit ratio of 200 cached objects right after a configuration change (`cache.valid` of both
//!     caches), applied as Kubernetes would: a new pod (empty cache) if the Deployment's pod
//!     template changed, else the ConfigMap's files switched in the volume (run.sh reloads nginx);
//! 15. not measured (the replicas of a cache cluster do not form a ring yet).
//! 16. purges (the topology with sidecars, as row 2m renders it; each cache pod's ConfigMap
//!     holding the benchmark's public key, as the operator publishes its own): 2,000 versioned
//!     objects cached, 1,000 of them changed at the origin, then 1,000 purges (a path each) at
//!     once, sent as the operator's dispatcher sends them (each cache pod gets the first alone,
//!     the other 999 in the next batch, once the first is applied): per purged object, the time
//!     from the burst until the balancer serves its new body (p50, p99, max, polled by 8
//!     threads); once both batches are applied, stale bodies among the purged objects and hits
//!     among the 1,000 others;
//! 17. 10,000 objects tagged `bulk` (Surrogate-Key) and 1,000 tagged `other` cached, then one
//!     purge of the key `bulk`: the time until both cache pods applied it, objects invalidated,
//!     and then misses among 500 `bulk` objects, hits among the 1,000 `other` ones.
//! 20. to 26. the generated configuration beside the caches users would pick instead, Varnish
//!     and Apache Traffic Server, each one tier in front of the same origin (`peers.rs`: how each
//!     runs; the generated one is the pod of `cache-1`, asked directly): req/s of cached objects
//!     of 1 KiB, 1 MiB and 4 MiB against nginx serving the file, servers interleaved, the median
//!     of `max(--wrk-rounds, 3)` rounds (20a to 20c); a cold 1 MiB miss (21); 200 concurrent misses
//!     of a slow object (22); a Zipf workload, every cache given a tenth of the set (23); objects
//!     expired while the origin hangs 15 s (24); 200 concurrent requests for a `no-cache` object
//!     (25); a cached 1 KiB object through two tiers of each kind (26). `--only peers` runs them.
//!
//! Each column (`--before`: an older binary's configurations; `after`: this workspace's binary,
//! found as the e2e crate finds it) runs the rows on a fresh origin, caches and balancer; the
//! table shows both columns and the targets. The balancer is restarted (a fresh pod) after the
//! rows that make the origin fail (4, 5, 6), so that a member left out by one row does not fail
//! the next. Clients: a small blocking HTTP/1.1 client of this file (per-request timeout 30 s),
//! threads for concurrency, `wrk` for throughput. Everything ends by itself: bounded loops,
//! timeouts, every nginx stopped on exit (and, bubblewrap's `--die-with-parent`, if this process
//! dies).

mod peers;

use cdn_operator::cdncluster::build::{self, CONFIG_KEY, ENTRYPOINT_KEY};
use cdn_operator::cdncluster::nginx::{
    CACHE_STATUS_HEADER, SERVICE_PORT_NAME, TOKEN_SCRIPT, UPSTREAM_HEADER,
};
use cdn_operator::cli::sign_url;
use cdn_operator::nginx_cache::wire::{self, Applied, Batch};
use cdn_operator::purge::signing::Signer;
use cdn_operator_e2e::operator_binary;
use cdn_operator_testkit::nginx::{self, Nginx, Sandbox};
use cdn_operator_testkit::Dns;
use clap::Parser;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Container;
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant, SystemTime};

#[derive(Parser, Debug)]
#[command(
    about = "Data-plane benchmark: the nginx configurations rendered by cdn-operator binaries, on real nginx 1.30 on loopback"
)]
struct Args {
    /// An older cdn-operator binary: its configurations are measured too, in the column `before`.
    #[arg(long)]
    before: Option<PathBuf>,
    /// The binary of the column `after` (default: this workspace's, as the e2e crate finds it:
    /// CDN_OPERATOR_BIN, else target/debug/cdn-operator).
    #[arg(long)]
    after: Option<PathBuf>,
    /// Writes every figure to this file as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Duration of each wrk run of the throughput row, in seconds.
    #[arg(long, default_value_t = 5)]
    wrk_seconds: u64,
    /// Rounds of wrk runs of the throughput row (direct, through the balancer, the cache alone).
    #[arg(long, default_value_t = 2)]
    wrk_rounds: u32,
    /// Runs only these rows (e.g. `--only 2` or `--only 4,5`), to measure a noisy row again.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Keeps the working directory (configurations, nginx logs, access logs) and prints its path.
    #[arg(long)]
    keep: bool,
}

/// The Host of the requests (but row 3's).
const HOST: &str = "cdn.test";
/// The namespace of the topology's CdnClusters.
const NAMESPACE: &str = "default";
/// The pods: CdnCluster and address, parents before sources.
const PODS: [(&str, &str); 3] = [
    ("edge", "127.0.0.10"),
    ("cache-1", "127.0.0.11"),
    ("cache-2", "127.0.0.12"),
];
const EDGE: &str = "127.0.0.10:80";
const ORIGIN_IP: &str = "127.0.0.20";
const ORIGIN: &str = "127.0.0.20:8080";
const ORIGIN_STATUS: &str = "127.0.0.20:8081";
const DIRECT: &str = "127.0.0.30:80";
/// The metrics image the topology is rendered with by row 2m: the binary under test runs as the
/// sidecar, at the image's entrypoint.
const METRICS_IMAGE: &str = "cdn-operator-under-test";
const IMAGE_ENTRYPOINT: &str = "/cdn-operator";
/// The port of the metrics sidecar, moved to the pod's address as nginx's listen line is.
const METRICS_PORT: u16 = 9113;
/// The uid and gid of the nginx-unprivileged image, which the pods run as.
const POD_USER: (u32, u32) = (101, 101);
/// The large object: 50 MB.
const BIG: u64 = 50_000_000;
/// Row 2s: the Secret of the balancer's signed URLs, and its one key.
const TOKEN_SECRET: &str = "edge-token-keys";
const TOKEN_KEY: &str = "5d0c1f7a9e3b2d4c6a8f0e1d3c5b7a9f1e2d3c4b5a6978695a4b3c2d1e0f1a2b";
/// Row 2s-new: the tokens asked in turn, more than the verifier remembers (about 15,000).
const TOKENS: usize = 20_000;
/// A range of it: 1 MB.
const RANGE: u64 = 1_000_000;
/// The caches' slice (`slice 1m`), and what a slice's response may carry in headers.
const SLICE: u64 = 1 << 20;
const SLICE_HEADERS: u64 = 1024;
/// Per-request timeout.
const TIMEOUT: Duration = Duration::from_secs(30);

fn main() -> ExitCode {
    let args = Args::parse();
    // First, before any thread exists: every thread and child after this runs in it.
    let isolated = match private_network() {
        Ok(()) => true,
        Err(error) => {
            eprintln!(
                "dataplane: no network namespace of its own ({error}): the host's loopback, pods as root, \
                 the caches' connections of row 1 not measured"
            );
            false
        }
    };
    let after = args.after.clone().unwrap_or_else(operator_binary);
    if args.after.is_none() {
        warn_if_stale(&after);
    }
    let version = nginx::version(&Sandbox::new());
    if !version.contains(nginx::VERSION_PREFIX) {
        eprintln!(
            "dataplane: {version}: not nginx {}x (run scripts/install-test-deps.sh)",
            nginx::VERSION_PREFIX
        );
        return ExitCode::FAILURE;
    }
    let has_wrk = Command::new("wrk")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    if !has_wrk {
        eprintln!(
            "dataplane: no wrk (scripts/install-test-deps.sh installs it): row 2 not measured"
        );
    }

    let work = tempfile::Builder::new()
        .prefix("cdn-dataplane-")
        .tempdir()
        .expect("a temporary directory");
    let dir = work.path().to_path_buf();
    // Readable by nginx's workers and the pods' uid.
    chmod(&dir, 0o755);
    eprintln!("dataplane: {version}; working in {}", dir.display());
    let www = dir.join("www");
    make_content(&www);
    let hosts = hosts_file(&dir);
    let (dns, resolv_conf) = cluster_dns(&dir);
    let setup = Setup {
        hosts,
        resolv_conf,
        dns,
        www,
        isolated,
        wrk_seconds: args.wrk_seconds,
        wrk_rounds: args.wrk_rounds.max(1),
        only: args.only.clone(),
        has_wrk,
        signer: Signer::generate().0,
        secrets: BTreeMap::from([(
            TOKEN_SECRET.to_string(),
            BTreeMap::from([("key-1".to_string(), format!("{TOKEN_KEY}\n"))]),
        )]),
    };
    let direct = start_direct(&dir, &setup.www);

    let mut columns: Vec<(&str, PathBuf)> = Vec::new();
    if let Some(before) = &args.before {
        columns.push(("before", before.clone()));
    }
    columns.push(("after", after));
    let mut results: BTreeMap<&str, Column> = BTreeMap::new();
    for (name, binary) in &columns {
        eprintln!("dataplane: column {name}: {}", binary.display());
        let column_dir = dir.join(name);
        std::fs::create_dir_all(&column_dir).expect("a column directory");
        chmod(&column_dir, 0o755);
        let figures = match Cdn::start(&setup, binary, &column_dir) {
            Ok(mut cdn) => cdn.run_rows(&setup),
            Err(error) => {
                eprintln!("dataplane: column {name}: {error}");
                Vec::new()
            }
        };
        results.insert(
            *name,
            Column {
                binary: binary.clone(),
                figures,
            },
        );
    }
    drop(direct);

    let table = table(&results);
    println!("{table}");
    let mut code = ExitCode::SUCCESS;
    if let Some(path) = &args.json {
        let document = json!({
            "nginx": version,
            "private_network_namespace": isolated,
            "columns": results.iter().map(|(name, c)| (name.to_string(), c.to_json())).collect::<serde_json::Map<_, _>>(),
            "table": table,
        });
        let text = serde_json::to_string_pretty(&document).expect("JSON");
        if let Err(error) = std::fs::write(path, text + "\n") {
            eprintln!("dataplane: writing {}: {error}", path.display());
            code = ExitCode::FAILURE;
        }
    }
    if args.keep {
        let kept = work.keep();
        eprintln!("dataplane: kept {}", kept.display());
    }
    code
}

/// What every column shares.
struct Setup {
    hosts: PathBuf,
    resolv_conf: PathBuf,
    /// Answers the pods' lookups while it lives; row 15 scales a cache in it.
    dns: Dns,
    www: PathBuf,
    /// Whether the run has a network namespace of its own (then the pods run as [`POD_USER`]).
    isolated: bool,
    wrk_seconds: u64,
    wrk_rounds: u32,
    /// The rows to run; empty: all.
    only: Vec<String>,
    has_wrk: bool,
    /// The benchmark's purge key, in the place of the operator's: its public half goes into each
    /// cache pod's ConfigMap, as the operator puts its own there.
    signer: Signer,
    /// The Secrets the pods mount: name, then file name and content.
    secrets: BTreeMap<String, BTreeMap<String, String>>,
}

impl Setup {
    /// The pods' uid and gid; `None`: root.
    fn user(&self) -> Option<(u32, u32)> {
        self.isolated.then_some(POD_USER)
    }

    /// Whether row `id` runs (`--only`).
    fn runs(&self, id: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|o| o == id)
    }
}

/// The lines of the table, in order: id, what is measured, target (`-`: none).
#[rustfmt::skip]
const ROWS: &[(&str, &str, &str)] = &[
    ("1a", "origin TCP connections, 500 sequential misses (1 client keep-alive conn)", "<= 10"),
    ("1b", "TCP connections accepted by the caches from the balancer, same loop", "-"),
    ("2", "req/s, cached 1 KiB: balancer->cache / nginx direct (wrk -t1 -c50)", ">= 0.65"),
    ("2b", "req/s, same object asked of its cache directly / nginx direct", "-"),
    ("2m", "req/s, cached 1 KiB, balancer->cache: metrics sidecars on / off (wrk -t1 -c50)",
        ">= 0.95"),
    ("2s", "req/s, cached 1 KiB, balancer->cache: signed URLs on / off (one token, wrk -t1 -c50)",
        ">= 0.90"),
    ("2s-1m", "req/s, cached 1 MiB, balancer->cache: signed URLs on / off (one token)", ">= 0.90"),
    ("2s-new", "req/s, cached 1 KiB, a new token per request (every MAC verified) / off", "-"),
    ("3", "cross-host hits: customer-b after customer-a cached the path", "0"),
    ("4", "failed of 20 cached segments after 3 quick origin 503s", "0"),
    ("5", "failed of 75 cached requests during an origin 503 a second (5 s)", "0"),
    ("6", "failed of 100 cached requests, origin hung (SIGSTOP)", "0"),
    ("7a", "cold range (last 1 MB of 50 MB): time to first byte", "<= 0.3 s"),
    ("7b", "cold range (last 1 MB of 50 MB): bytes sent by the origin",
        "<= 2 slices (2 MiB + headers)"),
    ("8a", "8 concurrent cold 1 MB ranges of 50 MB: bytes sent by the origin", "-"),
    ("8b", "8 concurrent cold 1 MB ranges of 50 MB: slowest request", "-"),
    ("9a", "200 concurrent requests for a 404: p50 latency, origin requests", "-"),
    ("9b", "200 concurrent requests, no-cache object: p50 latency, origin requests", "-"),
    ("10", "origin requests for 20 sequential requests of a missing object", "<= 2"),
    ("11", "live manifest without Cache-Control: seconds until a new version is served", "-"),
    ("12", "origin requests for 200 concurrent misses of one object", "1"),
    ("13", "HEAD of an uncached 50 MB object: bytes sent by the origin", "-"),
    ("14", "hit ratio of 200 cached objects: before -> right after a config change",
        "after >= 90 % of before"),
    ("15", "fetches per object from the origin, 3-replica cache cluster", "1"),
    ("16a", "1,000 purges at once: burst -> new body served, per object, p50 / p99 / max",
        "p99 <= 2 s"),
    ("16b", "after the purges are applied: stale bodies among the 1,000 purged", "0"),
    ("16c", "after the purges are applied: hits among 1,000 objects not purged", ">= 99 %"),
    ("17a", "purge by surrogate key of 10,000 tagged objects: time until applied", "<= 2 s"),
    ("17b", "after it: misses among 500 of them, hits among 1,000 of another key",
        "500, >= 99 %"),
    ("20a", "req/s, cached 1 KiB, one tier: each server / nginx direct (wrk -t1 -c50)",
        ">= 0.95, >= best peer"),
    ("20b", "req/s, cached 1 MiB, one tier: each server / nginx direct", ">= 0.92, >= best peer"),
    ("20c", "req/s, cached 4 MiB, one tier: each server / nginx direct", "-"),
    ("21", "cold miss of 1 MiB, one tier: time to last byte, bytes from the origin", "-"),
    ("22", "200 concurrent misses of one slow object (0.5 s), one tier: origin requests",
        "generated: 1"),
    ("23", "Zipf over 0.5-2 MiB objects, room a tenth of the set: hit ratio, origin B per B",
        "generated >= best peer"),
    ("24a", "10 expired manifests asked twice, origin hung 15 s: slowest, over 0.5 s",
        "generated <= 0.5 s"),
    ("24b", "10 expired other objects (sliced) asked twice, origin hung 15 s: slowest",
        "generated <= 0.5 s"),
    ("25", "200 concurrent requests, no-cache object, one tier: p50, origin requests",
        "generated p50 <= 0.2 s"),
    ("25b", "200 concurrent requests with Authorization, cacheable object: p50, origin requests",
        "generated p50 <= 0.2 s, 200"),
    ("26", "req/s, cached 1 KiB, two tiers (balancer->cache, Varnish->Varnish, ATS->ATS) / direct",
        "-"),
];

/// One measured line of the table.
#[derive(Clone, Debug)]
struct Figure {
    id: &'static str,
    what: &'static str,
    target: &'static str,
    /// The table's cell.
    shown: String,
    /// Whether the target is met; `None` without a target.
    met: Option<bool>,
    /// Everything measured, for --json.
    data: Value,
}

/// The figure of line `id` of [`ROWS`] (which must have it).
fn figure(id: &str, shown: String, met: Option<bool>, data: Value) -> Figure {
    let &(id, what, target) = ROWS
        .iter()
        .find(|(row, _, _)| *row == id)
        .unwrap_or_else(|| panic!("no line {id} in ROWS"));
    Figure {
        id,
        what,
        target,
        shown,
        met,
        data,
    }
}

struct Column {
    binary: PathBuf,
    figures: Vec<Figure>,
}

impl Column {
    fn to_json(&self) -> Value {
        json!({
            "binary": self.binary.display().to_string(),
            "rows": self.figures.iter().map(|f| (f.id.to_string(), json!({
                "what": f.what,
                "target": f.target,
                "shown": f.shown,
                "met": f.met,
                "data": f.data,
            }))).collect::<serde_json::Map<_, _>>(),
        })
    }
}

// ---------------------------------------------------------------------------------------------
// The CDN under test: its rendered configuration, and the pods and origin running it.

/// What the binary renders for one CdnCluster: its ConfigMap's files and its Deployment.
#[derive(Clone, Debug)]
struct Desired {
    files: BTreeMap<String, String>,
    deployment: Deployment,
}

/// The topology; `cache`: the fields of a `cache` given to both caches (`valid: 20m`, a change of
/// their configuration); `signed`: the balancer with signed URLs.
fn topology(cache: Option<&str>, signed: bool) -> String {
    let cache = cache
        .map(|c| format!("  cache: {{{c}}}\n"))
        .unwrap_or_default();
    let mut yaml = String::from(
        "apiVersion: cluster.anevia.com/v1\nkind: CdnCluster\nmetadata: {name: edge, namespace: default}\n\
         spec:\n  role: balancer\n  sources:\n  - name: cache-1\n  - name: cache-2\n",
    );
    if signed {
        yaml.push_str(&format!("  signedUrls: {{secretName: {TOKEN_SECRET}}}\n"));
    }
    for name in ["cache-1", "cache-2"] {
        yaml.push_str(&format!(
            "---\napiVersion: cluster.anevia.com/v1\nkind: CdnCluster\nmetadata: {{name: {name}, namespace: default}}\n\
             spec:\n  role: cache\n{cache}  sources:\n  - name: origin\n    origin: {{service: {{name: origin, port: 8080}}}}\n"
        ));
    }
    yaml
}

/// `binary render -f` of the topology (written to `dir`/`file`, `cache` as [`topology`] takes it):
/// the children of each CdnCluster.
/// With `metrics`, as an operator given a metrics image renders it: every pod with its metrics
/// sidecar, of the same binary; with `signed`, the balancer with signed URLs.
fn render(
    binary: &Path,
    dir: &Path,
    file: &str,
    cache: Option<&str>,
    metrics: bool,
    signed: bool,
) -> Result<BTreeMap<String, Desired>, String> {
    let path = dir.join(file);
    std::fs::write(&path, topology(cache, signed))
        .map_err(|e| format!("writing {}: {e}", path.display()))?;
    let mut command = Command::new(binary);
    command.arg("render");
    if metrics {
        command.args(["--nginx-metrics-image", METRICS_IMAGE]);
    }
    let out = command
        .arg("-f")
        .arg(&path)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("running {}: {e}", binary.display()))?;
    if !out.status.success() {
        return Err(format!(
            "{} render: {}\n{}",
            binary.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut files: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    let mut deployments: BTreeMap<String, Deployment> = BTreeMap::new();
    for document in serde_yaml::Deserializer::from_str(&text) {
        let value =
            serde_yaml::Value::deserialize(document).map_err(|e| format!("render's YAML: {e}"))?;
        let name = value["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        match value["kind"].as_str() {
            Some("ConfigMap") => {
                let data: BTreeMap<String, String> = serde_yaml::from_value(value["data"].clone())
                    .map_err(|e| format!("ConfigMap {name}: {e}"))?;
                files.insert(name, data);
            }
            Some("Deployment") => {
                let deployment: Deployment =
                    serde_yaml::from_value(value).map_err(|e| format!("Deployment {name}: {e}"))?;
                deployments.insert(name, deployment);
            }
            _ => {}
        }
    }
    let mut desired = BTreeMap::new();
    for (cluster, _) in PODS {
        let (config_map, deployment_name) = (
            build::config_map_name(cluster),
            build::deployment_name(cluster),
        );
        let files = files
            .remove(&config_map)
            .ok_or_else(|| format!("render gave no ConfigMap {config_map}"))?;
        if !files.contains_key(CONFIG_KEY) {
            return Err(format!("ConfigMap {config_map} has no {CONFIG_KEY}"));
        }
        let deployment = deployments
            .remove(&deployment_name)
            .ok_or_else(|| format!("render gave no Deployment {deployment_name}"))?;
        desired.insert(cluster.to_string(), Desired { files, deployment });
    }
    Ok(desired)
}

/// The generated configuration with its one change: `listen 8080;` → `listen IP:80;`.
fn on_loopback(conf: &str, ip: &str) -> Result<String, String> {
    let listens = conf.lines().filter(|l| l.trim() == "listen 8080;").count();
    if listens != 1 {
        return Err(format!(
            "{listens} lines `listen 8080;` in the generated configuration, not 1"
        ));
    }
    Ok(conf
        .lines()
        .map(|l| {
            if l.trim() == "listen 8080;" {
                l.replace("listen 8080;", &format!("listen {ip}:80;"))
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
        + if conf.ends_with('\n') { "\n" } else { "" })
}

/// Writes `files` into `dir` as the kubelet projects a ConfigMap volume: the files in a directory
/// of this `generation`, `..data` a symlink to it, each key a symlink through `..data`. A new
/// generation switches all the files at once: a new `..data` link renamed over the old one.
fn project(dir: &Path, files: &BTreeMap<String, String>, generation: u32) -> io::Result<()> {
    std::fs::create_dir_all(dir)?;
    chmod(dir, 0o755);
    let version = format!("..gen_{generation}");
    let data = dir.join(&version);
    std::fs::create_dir_all(&data)?;
    chmod(&data, 0o755);
    for (key, text) in files {
        let path = data.join(key);
        std::fs::write(&path, text)?;
        chmod(&path, 0o644);
    }
    let link = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&version, &link)?;
    std::fs::rename(&link, dir.join("..data"))?;
    for key in files.keys() {
        let path = dir.join(key);
        if path.symlink_metadata().is_err() {
            std::os::unix::fs::symlink(format!("..data/{key}"), &path)?;
        }
    }
    // The kubelet removes the previous generation once switched.
    for entry in std::fs::read_dir(dir)?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("..gen_") && name != version {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
    Ok(())
}

/// A running pod of a CdnCluster.
struct Pod {
    nginx: Nginx,
    /// Its metrics sidecar, when it has one: stopped after nginx, as a pod stops its sidecars.
    sidecar: Option<Nginx>,
    /// Its ConfigMap volume, and the generation projected there.
    config: PathBuf,
    generation: u32,
}

/// Starts `cluster` as its pod: the Deployment's volumes and command, the ConfigMap's files (the
/// listen line moved to `ip`:80), a fresh tmpfs at each emptyDir. `incarnation` numbers the pods of
/// a cluster (each has directories of its own). Call from the main thread (bubblewrap's
/// --die-with-parent follows the spawning thread).
fn start_pod(
    setup: &Setup,
    dir: &Path,
    cluster: &str,
    ip: &str,
    desired: &Desired,
    incarnation: u32,
    binary: &Path,
) -> Result<Pod, String> {
    let pod_dir = dir.join(format!("{cluster}-pod{incarnation}"));
    let config = pod_dir.join("config");
    let logs = pod_dir.join("logs");
    std::fs::create_dir_all(&logs).map_err(|e| e.to_string())?;
    chmod(&pod_dir, 0o755);
    let mut files = pod_files(desired, ip)?;
    if takes_purges(desired) {
        files.insert(
            wire::PUBLIC_KEYS_KEY.into(),
            setup.signer.public_keys_file(),
        );
    }
    project(&config, &files, 1).map_err(|e| format!("projecting {}: {e}", config.display()))?;

    let spec = desired
        .deployment
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .ok_or("the Deployment has no pod template")?;
    let container = spec.containers.first().ok_or("the pod has no container")?;
    let volumes = spec.volumes.as_deref().unwrap_or_default();
    // The sidecars: restartable init containers, started before nginx.
    let sidecars: Vec<&Container> = spec
        .init_containers
        .iter()
        .flatten()
        .filter(|c| c.restart_policy.as_deref() == Some("Always"))
        .collect();
    // An emptyDir a sidecar mounts too is a folder of the host both sandboxes see; any other, a
    // tmpfs of nginx's sandbox.
    let shared = |name: &str| {
        sidecars
            .iter()
            .flat_map(|c| c.volume_mounts.iter().flatten())
            .any(|m| m.name == name)
    };
    let volume_dir = |name: &str| -> Result<PathBuf, String> {
        let path = pod_dir.join("volumes").join(name);
        std::fs::create_dir_all(&path).map_err(|e| e.to_string())?;
        chmod(&path, 0o777);
        Ok(path)
    };
    let mut sandbox = Sandbox::read_only_root()
        .hosts(&setup.hosts)
        .resolv_conf(&setup.resolv_conf);
    for mount in container.volume_mounts.as_deref().unwrap_or_default() {
        let volume = volumes
            .iter()
            .find(|v| v.name == mount.name)
            .ok_or_else(|| format!("no volume {}", mount.name))?;
        if volume.empty_dir.is_some() && shared(&volume.name) {
            sandbox = sandbox.volume(volume_dir(&volume.name)?, &mount.mount_path);
        } else if volume.empty_dir.is_some() {
            sandbox = sandbox.empty_dir(&mount.mount_path);
        } else if volume.config_map.is_some() {
            sandbox = sandbox.read_only(&config, &mount.mount_path);
        } else if let Some(secret) = &volume.secret {
            // Projected as the kubelet projects a Secret, like a ConfigMap.
            let name = secret.secret_name.clone().unwrap_or_default();
            let files = setup
                .secrets
                .get(&name)
                .ok_or_else(|| format!("no Secret {name} in the benchmark"))?;
            let path = pod_dir.join("secrets").join(&name);
            project(&path, files, 1).map_err(|e| format!("projecting {}: {e}", path.display()))?;
            sandbox = sandbox.read_only(&path, &mount.mount_path);
        } else {
            return Err(format!(
                "volume {} is neither an emptyDir, the ConfigMap nor a Secret",
                volume.name
            ));
        }
    }
    if let Some((uid, gid)) = setup.user() {
        sandbox = sandbox.user(uid, gid);
    }
    let mut sidecar = None;
    for container in sidecars {
        // The binary under test at the image's entrypoint, the pod's shared emptyDirs at their
        // mounts; its arguments word for word but its listen address, moved to the pod's.
        let mut sandbox = Sandbox::read_only_root().read_only(binary, IMAGE_ENTRYPOINT);
        for mount in container.volume_mounts.iter().flatten() {
            let is_config = volumes
                .iter()
                .any(|v| v.name == mount.name && v.config_map.is_some());
            sandbox = if is_config {
                sandbox.read_only(&config, &mount.mount_path)
            } else if mount.read_only == Some(true) {
                sandbox.read_only(volume_dir(&mount.name)?, &mount.mount_path)
            } else {
                sandbox.volume(volume_dir(&mount.name)?, &mount.mount_path)
            };
        }
        if let Some((uid, gid)) = setup.user() {
            sandbox = sandbox.user(uid, gid);
        }
        let listen = format!("{ip}:{METRICS_PORT}");
        let argv: Vec<String> = std::iter::once(IMAGE_ENTRYPOINT.to_string())
            .chain(container.args.iter().flatten().map(|a| {
                if *a == format!(":{METRICS_PORT}") {
                    listen.clone()
                } else {
                    a.clone()
                }
            }))
            .collect();
        let name = format!("{cluster}-pod{incarnation}-{}", container.name);
        let mut command = sandbox.command(&argv);
        // The downward API's fields the container asks for (its namespace).
        for var in container.env.iter().flatten() {
            let field = var.value_from.as_ref().and_then(|v| v.field_ref.as_ref());
            if field.is_some_and(|f| f.field_path == "metadata.namespace") {
                command.env(&var.name, NAMESPACE);
            }
        }
        let process = Nginx::spawn(
            &name,
            command,
            &logs.join(format!("{}.log", container.name)),
        );
        process.wait_listening(&listen, &argv.join(" "));
        sidecar = Some(process);
    }
    let mut argv: Vec<String> = container.command.clone().unwrap_or_default();
    argv.extend(container.args.clone().unwrap_or_default());
    if argv.is_empty() {
        return Err("the container has no command".into());
    }
    // The container's command word for word; its standard output (the access log) and error (the
    // error log, run.sh's messages: `Nginx::log`) to files, as a container runtime keeps them.
    let command = sandbox.command(&argv);
    // nginx reopens /dev/stdout by its /proc path: the pod's uid must be able to write to it.
    let stdout = logs.join("stdout.log");
    std::fs::write(&stdout, "").map_err(|e| e.to_string())?;
    chmod(&stdout, 0o666);
    let nginx = Nginx::spawn_logging(
        &format!("{cluster}-pod{incarnation}"),
        command,
        &logs.join("stderr.log"),
        &stdout,
    );
    nginx.wait_listening(&format!("{ip}:80"), &files[CONFIG_KEY]);
    Ok(Pod {
        nginx,
        sidecar,
        config,
        generation: 1,
    })
}

/// Whether the pod of `desired` has a sidecar that applies purges (`--purge-keys`).
fn takes_purges(desired: &Desired) -> bool {
    desired
        .deployment
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.init_containers.as_ref())
        .is_some_and(|c| {
            c.iter()
                .any(|c| c.args.iter().flatten().any(|a| a == "--purge-keys"))
        })
}

/// The ConfigMap's files as the pod at `ip` gets them: nginx.conf with its listen line moved.
fn pod_files(desired: &Desired, ip: &str) -> Result<BTreeMap<String, String>, String> {
    let mut files = desired.files.clone();
    let conf = on_loopback(&files[CONFIG_KEY], ip)?;
    files.insert(CONFIG_KEY.into(), conf);
    Ok(files)
}

/// A Deployment's pod template, to compare two renderings.
fn pod_template(desired: &Desired) -> String {
    serde_json::to_string(&desired.deployment.spec.as_ref().map(|s| &s.template))
        .unwrap_or_default()
}

/// Projects `desired`'s files (a changed ConfigMap) into the pod's volume, as the kubelet does;
/// when they have run.sh, waits for it to reload nginx. What happened.
fn switch_files(pod: &mut Pod, desired: &Desired, ip: &str) -> String {
    let (reloads, workers) = reload_counts(&pod.nginx);
    pod.generation += 1;
    let projected = pod_files(desired, ip)
        .and_then(|files| project(&pod.config, &files, pod.generation).map_err(|e| e.to_string()));
    if let Err(e) = projected {
        return format!("ConfigMap changed, not projected: {e}");
    }
    if !desired.files.contains_key(ENTRYPOINT_KEY) {
        return "ConfigMap changed: nothing reloads nginx".to_string();
    }
    let started = Instant::now();
    let reloaded = wait_for(Duration::from_secs(10), || {
        let (r, w) = reload_counts(&pod.nginx);
        r > reloads && w > workers
    });
    // The new workers take the listening sockets; the old ones finish.
    std::thread::sleep(Duration::from_millis(300));
    if reloaded {
        format!(
            "ConfigMap changed: run.sh reloaded nginx in place ({:.1} s)",
            started.elapsed().as_secs_f64()
        )
    } else {
        "ConfigMap changed: run.sh did not reload nginx within 10 s".to_string()
    }
}

/// The reloads run.sh announced and the worker processes nginx started, from its error log.
fn reload_counts(nginx: &Nginx) -> (usize, usize) {
    let log = nginx.log();
    (
        count(&log, "reloading nginx"),
        count(&log, "start worker process"),
    )
}

/// The origin's access log: one line per request, `$msec|$request|$status|$bytes_sent|$connection|
/// $http_range|$host`.
struct OriginLog {
    path: PathBuf,
}

#[derive(Clone, Debug)]
struct Entry {
    method: String,
    path: String,
    status: u16,
    bytes: u64,
    connection: u64,
    range: String,
}

impl OriginLog {
    /// Where the log ends now.
    fn mark(&self) -> u64 {
        std::fs::metadata(&self.path).map(|m| m.len()).unwrap_or(0)
    }

    /// The requests logged after `mark` whose path starts with `prefix`, once the log has stopped
    /// growing for `quiet` (at most 20 s): a request is logged when it ends.
    fn settle(&self, mark: u64, prefix: &str, quiet: Duration) -> Vec<Entry> {
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut len = self.mark();
        let mut since = Instant::now();
        while Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
            let now = self.mark();
            if now != len {
                len = now;
                since = Instant::now();
            } else if since.elapsed() >= quiet {
                break;
            }
        }
        self.since(mark)
            .into_iter()
            .filter(|e| e.path.starts_with(prefix))
            .collect()
    }

    fn since(&self, mark: u64) -> Vec<Entry> {
        let mut text = Vec::new();
        if let Ok(mut file) = std::fs::File::open(&self.path) {
            use std::io::Seek;
            let _ = file.seek(io::SeekFrom::Start(mark));
            let _ = file.read_to_end(&mut text);
        }
        String::from_utf8_lossy(&text)
            .lines()
            .filter_map(|line| {
                let f: Vec<&str> = line.split('|').collect();
                if f.len() < 7 {
                    return None;
                }
                let mut request = f[1].split(' ');
                Some(Entry {
                    method: request.next()?.to_string(),
                    path: request.next()?.to_string(),
                    status: f[2].parse().ok()?,
                    bytes: f[3].parse().ok()?,
                    connection: f[4].parse().ok()?,
                    range: f[5].to_string(),
                })
            })
            .collect()
    }
}

/// The origin's configuration (one process, as testkit runs it).
fn origin_config(www: &Path, dir: &Path, log: &Path) -> String {
    let (www, tmp, log) = (www.display(), dir.display(), log.display());
    format!(
        "pid {tmp}/origin.pid;\n\
         events {{ worker_connections 4096; }}\n\
         http {{\n\
         \x20 default_type application/octet-stream;\n\
         \x20 client_body_temp_path {tmp}/o-cb; proxy_temp_path {tmp}/o-p; fastcgi_temp_path {tmp}/o-f;\n\
         \x20 uwsgi_temp_path {tmp}/o-u; scgi_temp_path {tmp}/o-s;\n\
         \x20 log_format bench '$msec|$request|$status|$bytes_sent|$connection|$http_range|$host';\n\
         \x20 access_log {log} bench;\n\
         \x20 sendfile on;\n\
         \x20 keepalive_requests 100000;\n\
         \x20 keepalive_timeout 65s;\n\
         \x20 server {{\n\
         \x20   listen {ORIGIN};\n\
         \x20   root {www};\n\
         \x20   location /obj/ {{ rewrite ^ /1k.bin break; }}\n\
         \x20   location /big/ {{ rewrite ^ /50m.bin break; }}\n\
         \x20   location /mib/ {{ rewrite ^ /1m.bin break; }}\n\
         \x20   location /m4/ {{ rewrite ^ /4m.bin break; }}\n\
         \x20   location ~ ^/z/[0-9]+/[0-9]+-(?<class>[0-9]+)$ {{ rewrite ^ /zipf/$class.bin break; }}\n\
         \x20   location /short/ {{ add_header Cache-Control max-age=1; rewrite ^ /1k.bin break; }}\n\
         \x20   location /slow/ {{ limit_rate 128k; rewrite ^ /64k.bin break; }}\n\
         \x20   location /nocache/ {{ add_header Cache-Control no-cache; rewrite ^ /1k.bin break; }}\n\
         \x20   location /err/ {{ return 503 \"origin failure\\n\"; }}\n\
         \x20   location /site/ {{ root {www}/sites/$host; }}\n\
         \x20   location ~ ^/pt/(?<tag>[^/]+)/ {{ add_header Surrogate-Key $tag; rewrite ^ /1k.bin break; }}\n\
         \x20 }}\n\
         \x20 server {{\n\
         \x20   listen {ORIGIN_STATUS};\n\
         \x20   access_log off;\n\
         \x20   location / {{ stub_status; }}\n\
         \x20 }}\n\
         }}\n"
    )
}

/// The 1 KiB file served directly: the generated configurations' http settings, no proxy.
fn start_direct(dir: &Path, www: &Path) -> Nginx {
    let (tmp, www) = (dir.display(), www.display());
    let conf = format!(
        "worker_processes auto;\n\
         pid {tmp}/direct.pid;\n\
         events {{ worker_connections 4096; }}\n\
         http {{\n\
         \x20 default_type application/octet-stream;\n\
         \x20 client_body_temp_path {tmp}/d-cb; proxy_temp_path {tmp}/d-p; fastcgi_temp_path {tmp}/d-f;\n\
         \x20 uwsgi_temp_path {tmp}/d-u; scgi_temp_path {tmp}/d-s;\n\
         \x20 access_log {tmp}/direct.access.log combined buffer=64k flush=1s;\n\
         \x20 server_tokens off;\n\
         \x20 sendfile on;\n\
         \x20 tcp_nopush on;\n\
         \x20 keepalive_timeout 65s;\n\
         \x20 keepalive_requests 10000;\n\
         \x20 server {{ listen {DIRECT}; root {www}; }}\n\
         }}\n"
    );
    let file = dir.join("direct.conf");
    std::fs::write(&file, &conf).expect("writing direct.conf");
    let command = Sandbox::new().share(dir).nginx(&[
        "-e".as_ref(),
        "stderr".as_ref(),
        "-c".as_ref(),
        file.as_os_str(),
        "-g".as_ref(),
        "daemon off;".as_ref(),
    ]);
    let server = Nginx::spawn("direct", command, &dir.join("direct.log"));
    server.wait_listening(DIRECT, &conf);
    server
}

struct Cdn {
    dir: PathBuf,
    desired: BTreeMap<String, Desired>,
    binary: PathBuf,
    origin: Nginx,
    log: OriginLog,
    pods: BTreeMap<String, Pod>,
    incarnations: BTreeMap<String, u32>,
}

impl Cdn {
    /// Renders the topology with `binary` and starts the origin and the three pods.
    fn start(setup: &Setup, binary: &Path, dir: &Path) -> Result<Cdn, String> {
        let desired = render(binary, dir, "topology.yaml", None, false, false)?;
        let log = dir.join("origin.access.log");
        std::fs::write(&log, "").map_err(|e| e.to_string())?;
        let conf = origin_config(&setup.www, dir, &log);
        let origin = Nginx::start(
            &Sandbox::new().share(&setup.www),
            "origin",
            &conf,
            dir,
            ORIGIN,
        );
        let mut cdn = Cdn {
            dir: dir.to_path_buf(),
            desired,
            binary: binary.to_path_buf(),
            origin,
            log: OriginLog { path: log },
            pods: BTreeMap::new(),
            incarnations: BTreeMap::new(),
        };
        // Sources first, as the operator waits for them.
        for (cluster, _) in PODS.iter().rev() {
            cdn.restart_pod(setup, cluster)?;
        }
        Ok(cdn)
    }

    /// Replaces the pod of `cluster` with a new one (fresh emptyDirs), or starts it.
    fn restart_pod(&mut self, setup: &Setup, cluster: &str) -> Result<(), String> {
        if let Some(pod) = self.pods.remove(cluster) {
            pod.nginx.stop();
            if let Some(sidecar) = pod.sidecar {
                sidecar.kill();
            }
        }
        let ip = PODS.iter().find(|(c, _)| *c == cluster).expect("a pod").1;
        let n = self.incarnations.entry(cluster.to_string()).or_insert(0);
        *n += 1;
        let pod = start_pod(
            setup,
            &self.dir,
            cluster,
            ip,
            &self.desired[cluster],
            *n,
            &self.binary,
        )?;
        self.pods.insert(cluster.to_string(), pod);
        Ok(())
    }

    /// Applies a new rendering as Kubernetes would: a cluster whose pod template changed gets a
    /// new pod (new emptyDirs: an empty cache); one whose ConfigMap alone changed gets the new
    /// files in its volume (the kubelet's `..data` switch), and, when the ConfigMap has `run.sh`,
    /// waits for it to reload nginx. What was done, per cluster.
    fn apply(
        &mut self,
        setup: &Setup,
        desired: BTreeMap<String, Desired>,
    ) -> BTreeMap<String, String> {
        let mut done = BTreeMap::new();
        let old = std::mem::replace(&mut self.desired, desired);
        for (cluster, ip) in PODS {
            let (before, after) = (&old[cluster], &self.desired[cluster]);
            let what = if pod_template(before) != pod_template(after) {
                match self.restart_pod(setup, cluster) {
                    Ok(()) => "pod template changed: pod replaced (empty cache)".to_string(),
                    Err(e) => format!("pod template changed, new pod failed: {e}"),
                }
            } else if before.files != after.files {
                switch_files(self.pods.get_mut(cluster).expect("a pod"), after, ip)
            } else {
                "unchanged".to_string()
            };
            done.insert(cluster.to_string(), what);
        }
        done
    }

    /// The rows, in order (those of `--only`, when given). After each of the rows that make the
    /// origin fail (4, 5, 6), a fresh balancer pod.
    fn run_rows(&mut self, setup: &Setup) -> Vec<Figure> {
        type Row = fn(&mut Cdn, &Setup) -> Vec<Figure>;
        let rows: [(&str, Row, bool); 19] = [
            ("1", |c, s| c.row1_connections(s), false),
            ("2", |c, s| c.row2_throughput(s), false),
            ("2m", |c, s| c.row2m_metrics_cost(s), false),
            ("2s", |c, s| c.row2s_signed_urls(s), false),
            ("3", |c, _| c.row3_hosts(), false),
            ("4", |c, _| c.row4_quick_errors(), true),
            ("5", |c, _| c.row5_steady_errors(), true),
            ("6", |c, _| c.row6_hung_origin(), true),
            ("7", |c, _| c.row7_cold_range(), false),
            ("8", |c, _| c.row8_concurrent_ranges(), false),
            ("9", |c, _| c.row9_uncacheable(), false),
            ("10", |c, _| c.row10_missing(), false),
            ("11", |c, s| c.row11_live_manifest(s), false),
            ("12", |c, _| c.row12_collapsed_misses(), false),
            ("13", |c, _| c.row13_head(), false),
            ("14", |c, s| c.row14_config_change(s), false),
            ("15", |c, s| c.row15_replicas(s), false),
            ("16", |c, s| c.row16_purge_burst(s), false),
            ("17", |c, s| c.row17_purge_by_key(s), false),
        ];
        let mut figures = Vec::new();
        for (id, row, resets) in rows {
            if !setup.runs(id) {
                continue;
            }
            eprintln!("dataplane:   row {id}");
            figures.extend(row(self, setup));
            if resets {
                self.reset_balancer(setup);
            }
        }
        if peers::IDS.iter().any(|id| peers::runs(setup, id)) {
            figures.extend(self.rows_peers(setup));
        }
        figures
    }

    /// A fresh balancer pod: forgets the members it left out.
    fn reset_balancer(&mut self, setup: &Setup) {
        if let Err(e) = self.restart_pod(setup, "edge") {
            eprintln!("dataplane: restarting the balancer: {e}");
        }
    }

    /// Row 1: 500 sequential misses (500 distinct 1 KiB objects) over ONE keep-alive client
    /// connection to the balancer. Origin connections: stub_status's accepted count, before and
    /// after. The balancer's connections to the caches: the kernel's PassiveOpens in the benchmark's
    /// own network namespace over the loop, less the client's and the origin's connections.
    fn row1_connections(&mut self, setup: &Setup) -> Vec<Figure> {
        let mark = self.log.mark();
        let accepts_0 = origin_accepts();
        let opens_0 = passive_opens(setup);
        let mut client = Client::new(EDGE);
        let failures = Failures::of((0..500).map(|i| client.get(&format!("/obj/r1-{i}"))), 200);
        let opens_1 = passive_opens(setup);
        let accepts_1 = origin_accepts();
        let entries = self
            .log
            .settle(mark, "/obj/r1-", Duration::from_millis(300));
        // The second stub_status read counts its own connection.
        let origin_connections = match (accepts_0, accepts_1) {
            (Some(a), Some(b)) => Some(b.saturating_sub(a).saturating_sub(1)),
            _ => None,
        };
        let distinct: BTreeSet<u64> = entries.iter().map(|e| e.connection).collect();
        let cache_connections = match (opens_0, opens_1, origin_connections) {
            (Some(a), Some(b), Some(o)) => Some((b - a).saturating_sub(client.connects + o)),
            _ => None,
        };
        let shown = match origin_connections {
            Some(n) => format!(
                "{n} conns ({} requests{})",
                entries.len(),
                failures.suffix()
            ),
            None => "not measured (stub_status unreadable)".into(),
        };
        vec![
            figure(
                "1a",
                shown,
                origin_connections.map(|n| n <= 10),
                json!({
                    "origin_connections_accepted": origin_connections,
                    "origin_connections_in_log": distinct.len(),
                    "origin_requests": entries.len(),
                    "client_connections": client.connects,
                    "failed": failures.to_json(),
                }),
            ),
            figure(
                "1b",
                match cache_connections {
                    Some(n) => format!("{n} conns"),
                    None => "not measured (no private network namespace)".into(),
                },
                None,
                json!({ "cache_connections_accepted": cache_connections }),
            ),
        ]
    }

    /// Row 2: a cached 1 KiB object, `wrk -t1 -c50` through balancer -> cache, against the same
    /// file served directly. Rounds of three runs back to back (direct, through the balancer, its
    /// cache asked directly: the member `X-Cdn-Upstream` names), `--wrk-rounds` of them (2 by
    /// default); each round's ratio is of runs seconds apart, which share the machine's load of the
    /// moment; the figure is the median of the rounds' ratios. 2b splits the cost between the two
    /// hops (informational).
    fn row2_throughput(&mut self, setup: &Setup) -> Vec<Figure> {
        if !setup.has_wrk {
            return vec![figure(
                "2",
                "not measured: no wrk".into(),
                None,
                Value::Null,
            )];
        }
        let path = "/obj/r2-1k";
        let mut member = None;
        let warmed = (0..5).any(|_| {
            get_once(path).is_ok_and(|r| {
                member = r.header(UPSTREAM_HEADER).map(str::to_string);
                r.status == 200 && r.header(CACHE_STATUS_HEADER) == Some("HIT")
            })
        });
        let member = member.unwrap_or_else(|| "127.0.0.11:80".into());
        let seconds = setup.wrk_seconds;
        let urls = [
            format!("http://{DIRECT}/1k.bin"),
            format!("http://{EDGE}{path}"),
            format!("http://{member}{path}"),
        ];
        let mut rounds: Vec<[Option<f64>; 3]> = Vec::new();
        let mut errors = Vec::new();
        for _ in 0..setup.wrk_rounds {
            let mut round = [None; 3];
            for (url, rps) in urls.iter().zip(round.iter_mut()) {
                match wrk(url, seconds) {
                    Ok(run) => {
                        if run.errors > 0 {
                            errors.push(format!("{url}: {} errors", run.errors));
                        }
                        *rps = Some(run.rps);
                    }
                    Err(e) => errors.push(format!("{url}: {e}")),
                }
            }
            rounds.push(round);
        }
        let ratios = |i: usize| -> Vec<f64> {
            rounds
                .iter()
                .filter_map(|r| match (r[0], r[i]) {
                    (Some(d), Some(x)) if d > 0.0 => Some(x / d),
                    _ => None,
                })
                .collect()
        };
        let column = |i: usize| -> Vec<f64> { rounds.iter().filter_map(|r| r[i]).collect() };
        let (through, alone) = (ratios(1), ratios(2));
        let (ratio, ratio_alone) = (median(&through), median(&alone));
        let shown =
            |ratio: Option<f64>, i: usize| match (ratio, median(&column(i)), median(&column(0))) {
                (Some(r), Some(x), Some(d)) => format!(
                    "{r:.2} ({x:.0} / {d:.0}){}{}",
                    if warmed { "" } else { ", not a HIT" },
                    if errors.is_empty() { "" } else { ", errors" }
                ),
                _ => format!("not measured: {}", errors.join("; ")),
            };
        vec![
            figure(
                "2",
                shown(ratio, 1),
                ratio.map(|r| r >= 0.65),
                json!({
                    "direct_rps": column(0),
                    "proxied_rps": column(1),
                    "ratios_by_round": through,
                    "median_ratio": ratio,
                    "warmed_hit": warmed,
                    "errors": errors,
                    "wrk_seconds": seconds,
                }),
            ),
            figure(
                "2b",
                shown(ratio_alone, 2),
                None,
                json!({
                    "cache": member,
                    "cache_rps": column(2),
                    "ratios_by_round": alone,
                    "median_ratio": ratio_alone,
                }),
            ),
        ]
    }

    /// Row 2m: what counting costs. The cached 1 KiB object through balancer -> cache, `wrk -t1
    /// -c50`, with every pod as rendered (no metrics), then as rendered with a metrics image (each
    /// pod with its sidecar, reading the line per request nginx writes), then with them again,
    /// then without (ABBA, so that a drift of the machine's load weighs on both alike),
    /// `--wrk-rounds` times. The pods are replaced at each switch, as a new pod template replaces
    /// them. The figure: requests/s with metrics over without (all runs), and what the balancer's
    /// sidecar counted of wrk's requests.
    fn row2m_metrics_cost(&mut self, setup: &Setup) -> Vec<Figure> {
        let not_measured = |why: String| {
            vec![figure(
                "2m",
                format!("not measured: {why}"),
                None,
                Value::Null,
            )]
        };
        if !setup.has_wrk {
            return not_measured("no wrk".into());
        }
        let counted = match render(
            &self.binary,
            &self.dir,
            "topology-metrics.yaml",
            None,
            true,
            false,
        ) {
            Ok(desired) => desired,
            Err(e) => {
                return not_measured(format!(
                    "this binary renders no metrics sidecar ({})",
                    first_line(&e)
                ))
            }
        };
        let has_sidecar = |desired: &BTreeMap<String, Desired>| {
            desired.values().all(|d| {
                d.deployment
                    .spec
                    .as_ref()
                    .and_then(|s| s.template.spec.as_ref())
                    .is_some_and(|p| p.init_containers.as_ref().is_some_and(|c| !c.is_empty()))
            })
        };
        if !has_sidecar(&counted) {
            return not_measured("this binary renders no metrics sidecar".into());
        }
        let plain = self.desired.clone();
        let path = "/obj/r2m-1k";
        let mut errors = Vec::new();
        let mut runs: Vec<(bool, f64, u64)> = Vec::new();
        let mut edge_counted = None;
        // A first run, not counted: the first run of a row is slower than those after it.
        if let Err(e) = wrk(&format!("http://{EDGE}{path}"), 2) {
            errors.push(format!("warm-up: {e}"));
        }
        let order = [false, true, true, false].repeat(setup.wrk_rounds as usize);
        for (i, &metrics) in order.iter().enumerate() {
            let wanted = if metrics { &counted } else { &plain };
            if self.desired[PODS[0].0].deployment != wanted[PODS[0].0].deployment {
                let done = self.apply(setup, wanted.clone());
                if let Some(failed) = done.values().find(|d| d.contains("failed")) {
                    errors.push(failed.clone());
                    break;
                }
            }
            // A fresh cache: the object fetched once, then a HIT.
            if !becomes_hit(path) {
                errors.push(format!("{path}: no HIT (metrics {metrics})"));
            }
            match wrk(&format!("http://{EDGE}{path}"), setup.wrk_seconds) {
                Ok(run) => {
                    if run.errors > 0 {
                        errors.push(format!("metrics {metrics}: {} errors", run.errors));
                    }
                    runs.push((metrics, run.rps, run.requests));
                }
                Err(e) => errors.push(format!("metrics {metrics}: {e}")),
            }
            // At the end of pods with metrics (replaced next, counts and all): what the
            // balancer's sidecar counted, read once nginx's last lines are in (its buffer is
            // written every second, read every 200 ms).
            if metrics && order.get(i + 1) != Some(&true) {
                std::thread::sleep(Duration::from_millis(1500));
                let counted = Client::once(
                    &format!("{}:{METRICS_PORT}", PODS[0].1),
                    "GET",
                    "/metrics",
                    &[],
                )
                .ok()
                .map(|r| {
                    let text = String::from_utf8_lossy(&r.body);
                    (
                        metric_sum(&text, "cdn_requests_total", ""),
                        metric_sum(&text, "cdn_log_lines_total", r#"result="unreadable""#),
                    )
                });
                edge_counted = match (edge_counted, counted) {
                    (Some((c, u)), Some((more, more_u))) => Some((c + more, u + more_u)),
                    (None, counted) if i < 3 => counted,
                    _ => None,
                };
            }
        }
        // Back as rendered, for the rows after this one.
        if self.desired[PODS[0].0].deployment != plain[PODS[0].0].deployment {
            self.apply(setup, plain);
        }
        let total = |on: bool| -> (f64, u64, usize) {
            runs.iter()
                .filter(|(m, _, _)| *m == on)
                .fold((0.0, 0, 0), |(r, n, k), (_, rps, req)| {
                    (r + rps, n + req, k + 1)
                })
        };
        let ((on_rps, on_requests, on_runs), (off_rps, _, off_runs)) = (total(true), total(false));
        let rounds = 2 * setup.wrk_rounds as usize;
        let measured = on_runs == rounds && off_runs == rounds && off_rps > 0.0;
        let ratio = measured.then(|| on_rps / off_rps);
        let shown = match ratio {
            Some(r) => format!(
                "{r:.2} ({:.0} / {:.0}), balancer counted {} of {} requests, {} unreadable{}",
                on_rps / rounds as f64,
                off_rps / rounds as f64,
                edge_counted.map_or("?".into(), |(c, _)| format!("{c:.0}")),
                on_requests,
                edge_counted.map_or("?".into(), |(_, d)| format!("{d:.0}")),
                if errors.is_empty() { "" } else { ", errors" }
            ),
            None => format!("not measured: {}", errors.join("; ")),
        };
        vec![figure(
            "2m",
            shown,
            ratio.map(|r| r >= 0.95),
            json!({
                "runs": runs.iter().map(|(m, rps, req)| json!({"metrics": m, "rps": rps, "requests": req})).collect::<Vec<_>>(),
                "ratio": ratio,
                "edge_counted_requests": edge_counted.map(|(c, _)| c),
                "edge_unreadable_lines": edge_counted.map(|(_, d)| d),
                "wrk_requests_with_metrics": on_requests,
                "errors": errors,
                "wrk_seconds": setup.wrk_seconds,
            }),
        )]
    }

    /// Row 2s: what signed URLs cost on hits. The balancer as rendered, then rendered with
    /// `signedUrls` (its pod replaced: the Secret's one key mounted, run.sh writing it for nginx),
    /// off, on, on, off, `--wrk-rounds` times, the caches untouched. Each time: a 1 KiB (2s)
    /// and a 1 MiB (2s-1m) object, cached, asked by `wrk -t1 -c50` with one valid token (the same
    /// URLs when off: the token is then a parameter like another); when on, also (2s-new) with a new
    /// token per request, from a list longer than the verifier remembers. The figures: req/s on
    /// over off, all runs of a kind summed.
    fn row2s_signed_urls(&mut self, setup: &Setup) -> Vec<Figure> {
        let not_measured = |why: String| {
            ["2s", "2s-1m", "2s-new"]
                .map(|id| figure(id, format!("not measured: {why}"), None, Value::Null))
                .into()
        };
        if !setup.has_wrk {
            return not_measured("no wrk".into());
        }
        let signed = match render(
            &self.binary,
            &self.dir,
            "topology-signed.yaml",
            None,
            false,
            true,
        ) {
            Ok(desired) => desired,
            Err(e) => return not_measured(first_line(&e).to_string()),
        };
        if !signed[PODS[0].0].files.contains_key(TOKEN_SCRIPT) {
            return not_measured("this binary renders no signed URLs".into());
        }
        let key = sign_url::parse_key(TOKEN_KEY).expect("the benchmark's key");
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let fields = sign_url::Fields {
            expires: now + 86_400,
            acl: vec!["/obj/*".into(), "/mib/*".into()],
            ..sign_url::Fields::default()
        };
        let token = sign_url::token(&key, &fields);
        let small = format!("/obj/r2s-1k?__token__={token}");
        let large = format!("/mib/r2s-1m?__token__={token}");
        // 2s-new: a Lua list of tokens that differ by their session id, asked in turn.
        let script = self.dir.join("tokens.lua");
        let mut lua = String::from("local tokens = {\n");
        for i in 0..TOKENS {
            let fields = sign_url::Fields {
                id: Some(format!("viewer-{i}")),
                ..fields.clone()
            };
            lua.push_str(&format!("  \"{}\",\n", sign_url::token(&key, &fields)));
        }
        lua.push_str(
            "}\nlocal i = 0\nrequest = function()\n  i = i % #tokens + 1\n  \
             return wrk.format(nil, \"/obj/r2s-1k?__token__=\" .. tokens[i])\nend\n",
        );
        if let Err(e) = std::fs::write(&script, lua) {
            return not_measured(format!("writing {}: {e}", script.display()));
        }
        let plain = self.desired.clone();
        let mut errors = Vec::new();
        // (signed, object, rps, requests); object: 0 = 1 KiB, 1 = 1 MiB, 2 = 1 KiB new tokens.
        let mut runs: Vec<(bool, usize, f64, u64)> = Vec::new();
        let order = [false, true, true, false].repeat(setup.wrk_rounds as usize);
        for &on in &order {
            let wanted = if on { &signed } else { &plain };
            if self.desired[PODS[0].0].files != wanted[PODS[0].0].files {
                let done = self.apply(setup, wanted.clone());
                if let Some(failed) = done.values().find(|d| d.contains("failed")) {
                    errors.push(failed.clone());
                    break;
                }
            }
            for (object, path) in [&small, &large].into_iter().enumerate() {
                if !becomes_hit(path) {
                    errors.push(format!("{path}: no HIT (signed {on})"));
                }
                // A first run of each pod, not counted: the first run is slower.
                if object == 0 {
                    let _ = wrk(&format!("http://{EDGE}{path}"), 1);
                }
                match wrk(&format!("http://{EDGE}{path}"), setup.wrk_seconds) {
                    Ok(run) => {
                        if run.errors > 0 {
                            errors.push(format!("signed {on}, {path}: {} errors", run.errors));
                        }
                        runs.push((on, object, run.rps, run.requests));
                    }
                    Err(e) => errors.push(format!("signed {on}, {path}: {e}")),
                }
            }
            if on {
                match wrk_script(&format!("http://{EDGE}/"), setup.wrk_seconds, Some(&script)) {
                    Ok(run) => {
                        if run.errors > 0 {
                            errors.push(format!("new tokens: {} errors", run.errors));
                        }
                        runs.push((on, 2, run.rps, run.requests));
                    }
                    Err(e) => errors.push(format!("new tokens: {e}")),
                }
            }
        }
        // Back as rendered, for the rows after this one.
        if self.desired[PODS[0].0].files != plain[PODS[0].0].files {
            self.apply(setup, plain);
        }
        let rounds = 2 * setup.wrk_rounds as usize;
        let mean = |on: bool, object: usize| -> Option<f64> {
            let rps: Vec<f64> = runs
                .iter()
                .filter(|(o, k, _, _)| *o == on && *k == object)
                .map(|(_, _, rps, _)| *rps)
                .collect();
            (rps.len() == rounds).then(|| rps.iter().sum::<f64>() / rps.len() as f64)
        };
        let errors_shown = if errors.is_empty() { "" } else { ", errors" };
        let row = |id: &str, on: Option<f64>, off: Option<f64>, target: bool| {
            let ratio = match (on, off) {
                (Some(on), Some(off)) if off > 0.0 => Some(on / off),
                _ => None,
            };
            let shown = match (ratio, on, off) {
                (Some(r), Some(on), Some(off)) => {
                    format!("{r:.2} ({on:.0} / {off:.0}){errors_shown}")
                }
                _ => format!("not measured: {}", errors.join("; ")),
            };
            figure(
                id,
                shown,
                if target {
                    ratio.map(|r| r >= 0.90)
                } else {
                    None
                },
                json!({"on_rps": on, "off_rps": off, "ratio": ratio}),
            )
        };
        const OBJECTS: [&str; 3] = ["1k", "1m", "1k-new-tokens"];
        let mut figures = vec![
            row("2s", mean(true, 0), mean(false, 0), true),
            row("2s-1m", mean(true, 1), mean(false, 1), true),
            row("2s-new", mean(true, 2), mean(false, 0), false),
        ];
        figures[0].data["runs"] = json!(runs
            .iter()
            .map(|(on, object, rps, requests)| json!({
                "signed": on,
                "object": OBJECTS[*object],
                "rps": rps,
                "requests": requests,
            }))
            .collect::<Vec<_>>());
        figures[0].data["errors"] = json!(errors);
        figures[0].data["wrk_seconds"] = json!(setup.wrk_seconds);
        figures
    }

    /// Row 3: `Host: customer-a` caches /site/page.html; then `Host: customer-b` asks for it.
    fn row3_hosts(&mut self) -> Vec<Figure> {
        let path = "/site/page.html";
        let ask = |host: &str| Client::once(EDGE, "GET", path, &[("Host", host)]);
        let a1 = ask("customer-a");
        let a2 = ask("customer-a");
        let b = ask("customer-b");
        let body = |r: &io::Result<Response>| match r {
            Ok(r) => String::from_utf8_lossy(&r.body).trim().to_string(),
            Err(e) => format!("error: {e}"),
        };
        let a_body = body(&a1);
        let b_body = body(&b);
        let cross = b.is_ok() && b_body == a_body;
        let shown = format!(
            "{} (b got {}, {})",
            u8::from(cross),
            if cross {
                "customer-a's body".to_string()
            } else if b_body == "page of customer-b" {
                "its own body".to_string()
            } else {
                b_body.clone()
            },
            cache_status(&b)
        );
        vec![figure(
            "3",
            shown,
            Some(!cross),
            json!({
                "customer_a": [body(&a1), cache_status(&a1), cache_status(&a2)],
                "customer_b": [b_body, cache_status(&b)],
                "cross_host_hits": u8::from(cross),
            }),
        )]
    }

    /// Row 4: 20 segments cached, then 3 quick origin 503s through the balancer, then the 20
    /// segments again: failed requests.
    fn row4_quick_errors(&mut self) -> Vec<Figure> {
        let segments: Vec<String> = (500..520).map(segment).collect();
        warm(&segments);
        let errors: Vec<String> = (0..3)
            .map(|k| match get_once(&format!("/err/r4-{k}")) {
                Ok(r) => r.status.to_string(),
                Err(e) => e.kind().to_string(),
            })
            .collect();
        let failures = Failures::of(segments.iter().map(|p| get_once(p)), 200);
        vec![failures.figure(
            "4",
            "",
            json!({ "origin_errors_seen": errors, "failed": failures.to_json() }),
        )]
    }

    /// Row 5: one origin 503 a second (an unrelated URL) for 5 s, while 75 requests for cached
    /// segments are spread over the same 5 s (each on its own connection).
    fn row5_steady_errors(&mut self) -> Vec<Figure> {
        let segments: Vec<String> = (520..595).map(segment).collect();
        warm(&segments);
        let started = Instant::now();
        let failures = std::thread::scope(|s| {
            let errors = s.spawn(|| {
                for k in 0..5u32 {
                    let _ = get_once(&format!("/err/r5-{k}"));
                    sleep_until(started + Duration::from_secs(u64::from(k) + 1));
                }
            });
            let requests = segments.iter().enumerate().map(|(i, path)| {
                sleep_until(started + Duration::from_millis(i as u64 * 5000 / 75));
                get_once(path)
            });
            let failures = Failures::of(requests, 200);
            let _ = errors.join();
            failures
        });
        vec![failures.figure(
            "5",
            "",
            json!({ "failed": failures.to_json(), "seconds": started.elapsed().as_secs_f64() }),
        )]
    }

    /// Row 6: 100 segments cached; the origin hung (SIGSTOP to all its processes); the 100 asked
    /// again, 10 threads, 30 s timeout each; SIGCONT.
    fn row6_hung_origin(&mut self) -> Vec<Figure> {
        let segments: Vec<String> = (600..700).map(segment).collect();
        warm(&segments);
        self.origin.signal_all(libc::SIGSTOP);
        let started = Instant::now();
        let results = parallel(segments.len(), 10, |i| {
            let t = Instant::now();
            let r = get_once(&segments[i]);
            (r, t.elapsed())
        });
        let elapsed = started.elapsed();
        self.origin.signal_all(libc::SIGCONT);
        let slowest = results.iter().map(|(_, t)| *t).max().unwrap_or_default();
        let failures = Failures::of(results.into_iter().map(|(r, _)| r), 200);
        vec![failures.figure(
            "6",
            &format!(" (slowest {:.2} s)", slowest.as_secs_f64()),
            json!({
                "failed": failures.to_json(),
                "slowest_s": slowest.as_secs_f64(),
                "row_s": elapsed.as_secs_f64(),
            }),
        )]
    }

    /// Row 7: the last 1 MB of a cold 50 MB object: time to its first byte, bytes the origin sent.
    fn row7_cold_range(&mut self) -> Vec<Figure> {
        let mark = self.log.mark();
        let (first, last) = (BIG - RANGE, BIG - 1);
        let range = format!("bytes={first}-{last}");
        let r = Client::once(
            EDGE,
            "GET",
            "/big/r7.bin",
            &[("Host", HOST), ("Range", range.as_str())],
        );
        let entries = self
            .log
            .settle(mark, "/big/r7", Duration::from_millis(1000));
        let origin_bytes: u64 = entries.iter().map(|e| e.bytes).sum();
        let (ttfb, ok, status) = match &r {
            Ok(r) => (
                Some(r.ttfb.as_secs_f64()),
                r.status == 206 && r.body.len() as u64 == RANGE,
                r.status.to_string(),
            ),
            Err(e) => (None, false, e.to_string()),
        };
        let budget = 2 * (SLICE + SLICE_HEADERS);
        vec![
            figure(
                "7a",
                match ttfb {
                    Some(t) => format!("{t:.3} s{}", if ok { "" } else { " (wrong answer)" }),
                    None => format!("failed: {status}"),
                },
                ttfb.map(|t| t <= 0.3 && ok),
                json!({
                    "ttfb_s": ttfb,
                    "total_s": r.as_ref().ok().map(|r| r.elapsed.as_secs_f64()),
                    "status": status,
                    "right_206_body": ok,
                }),
            ),
            figure(
                "7b",
                format!("{} ({})", bytes(origin_bytes), requests(entries.len())),
                Some(origin_bytes <= budget && !entries.is_empty()),
                json!({
                    "origin_bytes": origin_bytes,
                    "origin_requests": entries.iter().map(|e| json!([e.method, e.status, e.range, e.bytes])).collect::<Vec<_>>(),
                    "budget_bytes": budget,
                }),
            ),
        ]
    }

    /// Row 8: 8 concurrent cold 1 MB ranges, at 8 places of another 50 MB object.
    fn row8_concurrent_ranges(&mut self) -> Vec<Figure> {
        let mark = self.log.mark();
        let results = parallel(8, 8, |k| {
            let first = k as u64 * 6_000_000;
            let range = format!("bytes={first}-{}", first + RANGE - 1);
            let r = Client::once(
                EDGE,
                "GET",
                "/big/r8.bin",
                &[("Host", HOST), ("Range", range.as_str())],
            );
            let ok = r
                .as_ref()
                .is_ok_and(|r| r.status == 206 && r.body.len() as u64 == RANGE);
            (ok, r.map(|r| r.elapsed))
        });
        let entries = self
            .log
            .settle(mark, "/big/r8", Duration::from_millis(1000));
        let origin_bytes: u64 = entries.iter().map(|e| e.bytes).sum();
        let wrong = results.iter().filter(|(ok, _)| !ok).count();
        let slowest = results
            .iter()
            .filter_map(|(_, r)| r.as_ref().ok().copied())
            .max()
            .unwrap_or_default();
        vec![
            figure(
                "8a",
                format!(
                    "{} ({}{})",
                    bytes(origin_bytes),
                    requests(entries.len()),
                    if wrong > 0 {
                        format!(", {wrong} wrong answers")
                    } else {
                        String::new()
                    }
                ),
                None,
                json!({
                    "origin_bytes": origin_bytes,
                    "origin_requests": entries.len(),
                    "wrong_answers": wrong,
                }),
            ),
            figure(
                "8b",
                format!("{:.3} s", slowest.as_secs_f64()),
                None,
                json!({ "slowest_s": slowest.as_secs_f64() }),
            ),
        ]
    }

    /// Row 9: 200 concurrent requests (each on its own connection) for one missing object, then
    /// for one `Cache-Control: no-cache` object: median latency, origin requests.
    fn row9_uncacheable(&mut self) -> Vec<Figure> {
        let mut figures = Vec::new();
        for (id, path, status) in [
            ("9a", "/missing/r9.html", 404),
            ("9b", "/nocache/r9.bin", 200),
        ] {
            let mark = self.log.mark();
            let results = parallel(200, 200, |_| {
                let t = Instant::now();
                let r = get_once(path);
                (r, t.elapsed())
            });
            let entries = self.log.settle(mark, path, Duration::from_millis(500));
            let mut latencies: Vec<f64> = results
                .iter()
                .map(|(_, t)| t.as_secs_f64() * 1000.0)
                .collect();
            latencies.sort_by(f64::total_cmp);
            let p50 = latencies[latencies.len() / 2];
            let max = latencies.last().copied().unwrap_or_default();
            let failures = Failures::of(results.into_iter().map(|(r, _)| r), status);
            figures.push(figure(
                id,
                format!(
                    "p50 {p50:.0} ms, {} origin req{}",
                    entries.len(),
                    failures.suffix()
                ),
                None,
                json!({
                    "p50_ms": p50,
                    "max_ms": max,
                    "origin_requests": entries.len(),
                    "failed": failures.to_json(),
                }),
            ));
        }
        figures
    }

    /// Row 10: 20 sequential requests (one keep-alive connection) for a missing object.
    fn row10_missing(&mut self) -> Vec<Figure> {
        let mark = self.log.mark();
        let mut client = Client::new(EDGE);
        let started = Instant::now();
        let failures = Failures::of((0..20).map(|_| client.get("/missing/r10.html")), 404);
        let elapsed = started.elapsed();
        let entries = self
            .log
            .settle(mark, "/missing/r10", Duration::from_millis(300));
        vec![figure(
            "10",
            format!(
                "{} (in {:.2} s{})",
                entries.len(),
                elapsed.as_secs_f64(),
                failures.suffix()
            ),
            Some(entries.len() <= 2),
            json!({
                "origin_requests": entries.len(),
                "seconds": elapsed.as_secs_f64(),
                "failed": failures.to_json(),
            }),
        )]
    }

    /// Row 11: a live manifest (no Cache-Control, no Expires) cached; 1 s later a new version at
    /// the origin; asked once a second: when the new version is served (at most 30 s).
    fn row11_live_manifest(&mut self, setup: &Setup) -> Vec<Figure> {
        let file = setup.www.join("live/r11.m3u8");
        let path = "/live/r11.m3u8";
        write_atomically(&file, "#EXTM3U\n#EXT-X-MEDIA-SEQUENCE:1\n#v1\n");
        let first = get_once(path);
        let second = get_once(path);
        // Another second: nginx's Last-Modified has a resolution of one second.
        std::thread::sleep(Duration::from_millis(1100));
        write_atomically(
            &file,
            "#EXTM3U\n#EXT-X-MEDIA-SEQUENCE:2\n#v2 (a new segment)\n",
        );
        let changed = Instant::now();
        let mut seen = None;
        let mut polls = Vec::new();
        while changed.elapsed() < Duration::from_secs(30) {
            sleep_until(changed + Duration::from_secs(polls.len() as u64 + 1));
            let r = get_once(path);
            let new = r
                .as_ref()
                .is_ok_and(|r| String::from_utf8_lossy(&r.body).contains("#v2"));
            polls.push(match &r {
                Ok(_) => format!("{} {}", if new { "v2" } else { "v1" }, cache_status(&r)),
                Err(e) => e.kind().to_string(),
            });
            if new {
                seen = Some(changed.elapsed().as_secs_f64());
                break;
            }
        }
        vec![figure(
            "11",
            match seen {
                Some(s) => format!("{s:.0} s"),
                None => "> 30 s (frozen)".into(),
            },
            None,
            json!({
                "seconds": seen,
                // Without the header: null here, `-` elsewhere.
                "first": first.as_ref().ok().and_then(|r| r.header(CACHE_STATUS_HEADER)),
                "second": cache_status(&second),
                "polls": polls,
            }),
        )]
    }

    /// Row 12: 200 concurrent misses (each on its own connection) for one slow object (64 KiB sent
    /// at 128 KiB/s, so the misses overlap): origin requests.
    fn row12_collapsed_misses(&mut self) -> Vec<Figure> {
        let mark = self.log.mark();
        let path = "/slow/r12.bin";
        let results = parallel(200, 200, |_| get_once(path));
        let entries = self.log.settle(mark, path, Duration::from_millis(500));
        let failures = Failures::of(results, 200);
        vec![figure(
            "12",
            format!("{}{}", entries.len(), failures.suffix()),
            Some(entries.len() == 1),
            json!({ "origin_requests": entries.len(), "failed": failures.to_json() }),
        )]
    }

    /// Row 13: a HEAD of an uncached 50 MB object: bytes the origin sent.
    fn row13_head(&mut self) -> Vec<Figure> {
        let mark = self.log.mark();
        let r = Client::once(EDGE, "HEAD", "/big/r13.bin", &[("Host", HOST)]);
        let entries = self
            .log
            .settle(mark, "/big/r13", Duration::from_millis(1000));
        let origin_bytes: u64 = entries.iter().map(|e| e.bytes).sum();
        vec![figure(
            "13",
            format!(
                "{} ({})",
                bytes(origin_bytes),
                entries
                    .iter()
                    .map(|e| e.method.clone())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            None,
            json!({
                "origin_bytes": origin_bytes,
                "origin_requests": entries.iter().map(|e| json!([e.method, e.status, e.bytes])).collect::<Vec<_>>(),
                "client_status": r.as_ref().map(|r| r.status).ok(),
            }),
        )]
    }

    /// Row 14: 200 segments warmed through the balancer; a pass over them (hit ratio); the
    /// caches' configuration changed (`cache: {valid: 20m}`), rendered again and applied as
    /// Kubernetes would ([`Cdn::apply`]); a second pass (hit ratio).
    fn row14_config_change(&mut self, setup: &Setup) -> Vec<Figure> {
        let segments: Vec<String> = (1000..1200).map(segment).collect();
        let mut client = Client::new(EDGE);
        let pass = |client: &mut Client| {
            segments
                .iter()
                .filter(|p| {
                    client.get(p).is_ok_and(|r| {
                        r.status == 200 && r.header(CACHE_STATUS_HEADER) == Some("HIT")
                    })
                })
                .count()
        };
        pass(&mut client);
        let before = pass(&mut client);
        let applied = match render(
            &self.binary,
            &self.dir,
            "topology-changed.yaml",
            Some("valid: 20m"),
            false,
            false,
        ) {
            Ok(desired) => {
                let changed: Vec<&str> = PODS
                    .iter()
                    .filter(|(c, _)| self.desired[*c].files != desired[*c].files)
                    .map(|(c, _)| *c)
                    .collect();
                let mut done = self.apply(setup, desired);
                done.insert("configs changed".into(), changed.join(", "));
                done
            }
            Err(e) => BTreeMap::from([("error".to_string(), e)]),
        };
        let mut client = Client::new(EDGE);
        let after = pass(&mut client);
        let (rb, ra) = (before as f64 / 2.0, after as f64 / 2.0);
        vec![figure(
            "14",
            format!("{rb:.0} % -> {ra:.0} %"),
            Some(before > 0 && after as f64 >= 0.9 * before as f64),
            json!({
                "hits_before": before,
                "hits_after": after,
                "objects": segments.len(),
                "applied": applied,
            }),
        )]
    }

    /// Row 15: cache-1 scaled to three pods, its headless Service naming each; 90 objects asked
    /// three times through the balancer (in order, in reverse, in order). The origin's fetches
    /// per object: 1 when each object has one pod, up to 3 when the balancer takes turns between
    /// the pods of one name. cache-1 goes back to one pod afterwards.
    fn row15_replicas(&mut self, setup: &Setup) -> Vec<Figure> {
        const EXTRA: [&str; 2] = ["127.0.0.13", "127.0.0.14"];
        let one = PODS[1].1;
        let three = [one, EXTRA[0], EXTRA[1]];
        let mut extra = Vec::new();
        for (k, ip) in EXTRA.iter().enumerate() {
            match start_pod(
                setup,
                &self.dir,
                "cache-1",
                ip,
                &self.desired["cache-1"],
                100 + k as u32,
                &self.binary,
            ) {
                Ok(pod) => extra.push(pod),
                Err(e) => {
                    return vec![figure(
                        "15",
                        format!("not measured: {e}"),
                        None,
                        Value::Null,
                    )]
                }
            }
        }
        // The members the balancer sends 60 probes (paths no object has) to.
        let probed = || -> BTreeSet<String> {
            let mut client = Client::new(EDGE);
            (0..60)
                .filter_map(|i| client.get(&format!("/probe/r15-{i}")).ok())
                .filter_map(|r| r.header(UPSTREAM_HEADER).map(str::to_string))
                .flat_map(|a| a.split(", ").map(str::to_string).collect::<Vec<_>>())
                .collect()
        };
        let member = |ip: &str| format!("{ip}:80");
        publish(&setup.dns, "cache-1", true, &three);
        // Within the balancer's lookup lifetime (5 s).
        let found = wait_for(Duration::from_secs(20), || {
            let seen = probed();
            three.iter().all(|ip| seen.contains(&member(ip)))
        });

        let mark = self.log.mark();
        let objects: Vec<String> = (0..90).map(|i| format!("/obj/r15-{i}")).collect();
        let mut client = Client::new(EDGE);
        let mut failures = Failures::default();
        let mut members: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
        for pass in 0..3 {
            let order: Vec<&String> = if pass == 1 {
                objects.iter().rev().collect()
            } else {
                objects.iter().collect()
            };
            for object in order {
                let r = client.get(object);
                if let Ok(r) = &r {
                    if let Some(a) = r.header(UPSTREAM_HEADER) {
                        members.entry(object).or_default().insert(a.to_string());
                    }
                }
                failures.check(r, 200);
            }
        }
        let fetches = self
            .log
            .settle(mark, "/obj/r15-", Duration::from_millis(300))
            .len();
        let on_three = members
            .values()
            .flatten()
            .filter(|a| EXTRA.iter().any(|ip| **a == member(ip)))
            .count();

        publish(&setup.dns, "cache-1", true, &[one]);
        let back = wait_for(Duration::from_secs(20), || {
            let seen = probed();
            !EXTRA.iter().any(|ip| seen.contains(&member(ip)))
        });
        for pod in extra {
            pod.nginx.stop();
        }
        let per_object = fetches as f64 / objects.len() as f64;
        let found_note = if found {
            ""
        } else {
            ", the pods never all seen"
        };
        vec![figure(
            "15",
            format!(
                "{per_object:.2} ({fetches} fetches of {} objects asked 3 times{found_note}{})",
                objects.len(),
                failures.suffix()
            ),
            Some(found && fetches == objects.len() && failures.count == 0),
            json!({
                "fetches": fetches,
                "objects": objects.len(),
                "passes": 3,
                "all_pods_seen": found,
                "answers_by_the_added_pods": on_three,
                "objects_answered_by_more_than_one_member": members.values().filter(|m| m.len() > 1).count(),
                "back_to_one_pod": back,
                "failed": failures.to_json(),
            }),
        )]
    }

    /// The topology with every pod's sidecar (rendered with a metrics image, as row 2m), its
    /// caches' sidecars applying purges signed with the benchmark's key; `Err` when this binary
    /// renders no sidecar that applies purges.
    fn with_purging_sidecars(
        &mut self,
        setup: &Setup,
    ) -> Result<BTreeMap<String, Desired>, String> {
        let counted = render(
            &self.binary,
            &self.dir,
            "topology-metrics.yaml",
            None,
            true,
            false,
        )
        .map_err(|e| format!("this binary renders no sidecar ({})", first_line(&e)))?;
        if !counted.values().any(takes_purges) {
            return Err("this binary's sidecars apply no purges".into());
        }
        let plain = self.desired.clone();
        if self.desired[PODS[1].0].deployment != counted[PODS[1].0].deployment {
            let done = self.apply(setup, counted);
            if let Some(failed) = done.values().find(|d| d.contains("failed")) {
                return Err(failed.clone());
            }
        }
        Ok(plain)
    }

    /// Sends `purges` as one batch to the sidecar of each cache pod, at once; what each applied.
    fn purge(&self, setup: &Setup, purges: &[wire::Purge]) -> Result<Vec<Applied>, String> {
        std::thread::scope(|s| {
            let sends: Vec<_> = PODS
                .iter()
                .filter(|(cluster, _)| takes_purges(&self.desired[*cluster]))
                .map(|(cluster, ip)| {
                    s.spawn(move || {
                        let issued = SystemTime::now()
                            .duration_since(SystemTime::UNIX_EPOCH)
                            .map(|d| d.as_secs() as i64)
                            .unwrap_or(0);
                        let batch = Batch {
                            id: format!("{cluster}-{}", next_batch()),
                            issued,
                            expires: issued + wire::VALIDITY_SECONDS,
                            cluster: format!("{NAMESPACE}/{cluster}"),
                            purges: purges.to_vec(),
                        };
                        let body = serde_json::to_vec(&batch).expect("a batch");
                        let signature = wire::signature_header(&setup.signer.sign(&body));
                        let addr = format!("{ip}:{METRICS_PORT}");
                        let r = cdn_operator_testkit::request(
                            &addr,
                            "POST",
                            wire::PURGE_PATH,
                            &[(wire::SIGNATURE_HEADER, &signature)],
                            &body,
                        )
                        .map_err(|e| format!("{addr}: {e}"))?;
                        if r.status != 200 {
                            return Err(format!("{addr}: {} {}", r.status, r.body.trim()));
                        }
                        serde_json::from_str::<Applied>(&r.body).map_err(|e| format!("{addr}: {e}"))
                    })
                })
                .collect();
            sends
                .into_iter()
                .map(|t| t.join().expect("a send"))
                .collect()
        })
    }

    /// Row 16: 1,000 purges at once. 2,000 versioned objects (`/pv/NNNN`) cached through the
    /// balancer; the first 1,000 changed at the origin; then a purge per changed object, all at
    /// once, sent as the operator's dispatcher sends a burst: each cache pod gets the first purge
    /// alone, and the 999 that came meanwhile in one batch once it answered. Eight threads poll
    /// the purged objects through the balancer from the burst on, each until it serves the new
    /// body: the time of each. Once both batches are applied: stale bodies among the purged
    /// objects, and hits among the 1,000 not purged.
    fn row16_purge_burst(&mut self, setup: &Setup) -> Vec<Figure> {
        let not_measured = |why: String| {
            ["16a", "16b", "16c"]
                .map(|id| figure(id, format!("not measured: {why}"), None, Value::Null))
                .to_vec()
        };
        let plain = match self.with_purging_sidecars(setup) {
            Ok(plain) => plain,
            Err(why) => return not_measured(why),
        };
        let figures = self.purge_burst(setup).unwrap_or_else(not_measured);
        if self.desired[PODS[1].0].deployment != plain[PODS[1].0].deployment {
            self.apply(setup, plain);
        }
        figures
    }

    fn purge_burst(&mut self, setup: &Setup) -> Result<Vec<Figure>, String> {
        const OBJECTS: usize = 2000;
        const PURGED: usize = 1000;
        let pv = setup.www.join("pv");
        std::fs::create_dir_all(&pv).map_err(|e| e.to_string())?;
        chmod(&pv, 0o755);
        let path = |i: usize| format!("/pv/{i:04}");
        let write = |i: usize, version: &str| {
            // Replaced, not rewritten in place: the origin may be sending the old one.
            let file = pv.join(format!("{i:04}"));
            let tmp = pv.join(format!(".{i:04}"));
            std::fs::write(&tmp, format!("{version} {i:04}\n")).expect("writing an object");
            chmod(&tmp, 0o644);
            std::fs::rename(&tmp, &file).expect("replacing an object");
        };
        for i in 0..OBJECTS {
            write(i, "v1");
        }
        let all: Vec<String> = (0..OBJECTS).map(path).collect();
        warm(&all);
        let mut client = Client::new(EDGE);
        let cached = all
            .iter()
            .filter(|p| cache_status(&client.get(p)) == "HIT")
            .count();
        if cached < OBJECTS * 99 / 100 {
            return Err(format!("only {cached} of {OBJECTS} objects cached"));
        }
        for i in 0..PURGED {
            write(i, "v2");
        }
        let purges: Vec<wire::Purge> = (0..PURGED)
            .map(|i| wire::Purge {
                id: format!("{NAMESPACE}/burst-{i}/uid/cache/last"),
                paths: vec![path(i)],
                ..wire::Purge::default()
            })
            .collect();
        let started = Instant::now();
        let seen: Mutex<Vec<Option<Duration>>> = Mutex::new(vec![None; PURGED]);
        let applied_at: Mutex<Option<Duration>> = Mutex::new(None);
        let outcome: Result<(Vec<Applied>, Vec<Applied>), String> = std::thread::scope(|s| {
            for t in 0..8 {
                let (seen, applied_at) = (&seen, &applied_at);
                s.spawn(move || {
                    let mut client = Client::new(EDGE);
                    let mine: Vec<usize> = (t..PURGED).step_by(8).collect();
                    let deadline = started + Duration::from_secs(30);
                    while Instant::now() < deadline {
                        let mut left = 0;
                        for &i in &mine {
                            if seen.lock().unwrap()[i].is_some() {
                                continue;
                            }
                            left += 1;
                            let new = client
                                .get(&path(i))
                                .is_ok_and(|r| r.body.starts_with(b"v2"));
                            if new {
                                seen.lock().unwrap()[i] = Some(started.elapsed());
                            }
                        }
                        if left == 0 || applied_at.lock().unwrap().is_some_and(|_| left == 0) {
                            break;
                        }
                    }
                });
            }
            let first = self.purge(setup, &purges[..1])?;
            let rest = self.purge(setup, &purges[1..])?;
            *applied_at.lock().unwrap() = Some(started.elapsed());
            Ok((first, rest))
        });
        let (first, rest) = outcome?;
        let applied = applied_at.into_inner().unwrap().unwrap_or_default();
        let mut times: Vec<f64> = seen
            .into_inner()
            .unwrap()
            .iter()
            .flatten()
            .map(|d| d.as_secs_f64())
            .collect();
        let never = PURGED - times.len();
        times.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let at = |q: f64| {
            times
                .get(((times.len() as f64 * q).ceil() as usize).saturating_sub(1))
                .copied()
        };
        let (p50, p99, max) = (at(0.50), at(0.99), times.last().copied());
        // Once applied: no purged object served stale, the others still hits.
        let mut client = Client::new(EDGE);
        let stale = (0..PURGED)
            .filter(|&i| {
                client
                    .get(&path(i))
                    .map_or(true, |r| !r.body.starts_with(b"v2"))
            })
            .count();
        let hits = (PURGED..OBJECTS)
            .filter(|&i| {
                client.get(&path(i)).is_ok_and(|r| {
                    r.header(CACHE_STATUS_HEADER) == Some("HIT") && r.body.starts_with(b"v1")
                })
            })
            .count();
        let invalidated: u64 = first.iter().chain(&rest).flat_map(|a| &a.invalidated).sum();
        let secs = |t: Option<f64>| t.map_or("-".into(), |t| format!("{t:.3} s"));
        Ok(vec![
            figure(
                "16a",
                format!(
                    "{} / {} / {}{} (both batches applied in {:.3} s, {invalidated} objects invalidated)",
                    secs(p50),
                    secs(p99),
                    secs(max),
                    if never > 0 { format!(", {never} never seen new") } else { String::new() },
                    applied.as_secs_f64()
                ),
                Some(never == 0 && p99.is_some_and(|p| p <= 2.0)),
                json!({"p50_s": p50, "p99_s": p99, "max_s": max, "never": never,
                       "applied_s": applied.as_secs_f64(), "invalidated": invalidated,
                       "first_batch": first, "second_batch": rest}),
            ),
            figure(
                "16b",
                format!("{stale} of {PURGED}"),
                Some(stale == 0),
                json!({"stale": stale}),
            ),
            figure(
                "16c",
                format!("{:.1} % ({hits} of {})", 100.0 * hits as f64 / (OBJECTS - PURGED) as f64, OBJECTS - PURGED),
                Some(hits * 100 >= (OBJECTS - PURGED) * 99),
                json!({"hits": hits, "of": OBJECTS - PURGED}),
            ),
        ])
    }

    /// Row 17: 10,000 objects tagged `bulk` and 1,000 tagged `other` (`/pt/TAG/N`, the origin
    /// sends `Surrogate-Key: TAG`) cached through the balancer by 8 threads; one purge of the key
    /// `bulk`, sent to both cache pods at once: the time until both applied it. Then misses among
    /// 500 `bulk` objects, and hits among the `other` ones.
    fn row17_purge_by_key(&mut self, setup: &Setup) -> Vec<Figure> {
        let not_measured = |why: String| {
            ["17a", "17b"]
                .map(|id| figure(id, format!("not measured: {why}"), None, Value::Null))
                .to_vec()
        };
        let plain = match self.with_purging_sidecars(setup) {
            Ok(plain) => plain,
            Err(why) => return not_measured(why),
        };
        let figures = self.purge_by_key(setup).unwrap_or_else(not_measured);
        if self.desired[PODS[1].0].deployment != plain[PODS[1].0].deployment {
            self.apply(setup, plain);
        }
        figures
    }

    fn purge_by_key(&mut self, setup: &Setup) -> Result<Vec<Figure>, String> {
        const BULK: usize = 10_000;
        const OTHER: usize = 1_000;
        let bulk = |i: usize| format!("/pt/bulk/{i:05}");
        let other = |i: usize| format!("/pt/other/{i:04}");
        let all: Vec<String> = (0..BULK).map(bulk).chain((0..OTHER).map(other)).collect();
        std::thread::scope(|s| {
            for part in all.chunks(all.len().div_ceil(8)) {
                s.spawn(move || warm(part));
            }
        });
        let purge = wire::Purge {
            id: format!("{NAMESPACE}/by-key/uid/cache/last"),
            surrogate_keys: vec!["bulk".into()],
            ..wire::Purge::default()
        };
        let started = Instant::now();
        let applied = self.purge(setup, std::slice::from_ref(&purge))?;
        let took = started.elapsed().as_secs_f64();
        let invalidated: u64 = applied.iter().flat_map(|a| &a.invalidated).sum();
        let scanned: u64 = applied.iter().map(|a| a.scanned).sum();
        let by_pod: Vec<u64> = applied.iter().map(|a| a.millis).collect();
        let mut client = Client::new(EDGE);
        let misses = (0..BULK)
            .step_by(BULK / 500)
            .filter(|&i| cache_status(&client.get(&bulk(i))) == "MISS")
            .count();
        let hits = (0..OTHER)
            .filter(|&i| cache_status(&client.get(&other(i))) == "HIT")
            .count();
        Ok(vec![
            figure(
                "17a",
                format!("{took:.3} s ({invalidated} invalidated, {scanned} cache files read, per pod {by_pod:?} ms)"),
                Some(took <= 2.0 && invalidated as usize == BULK),
                json!({"seconds": took, "invalidated": invalidated, "scanned": scanned, "pod_millis": by_pod, "applied": applied}),
            ),
            figure(
                "17b",
                format!("{misses} of 500, {:.1} % ({hits} of {OTHER})", 100.0 * hits as f64 / OTHER as f64),
                Some(misses == 500 && hits * 100 >= OTHER * 99),
                json!({"misses": misses, "hits": hits}),
            ),
        ])
    }
}

/// A number no other batch of this run has.
fn next_batch() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

impl Drop for Cdn {
    fn drop(&mut self) {
        // The pods first (parents before sources), then the origin (its own Drop).
        for (cluster, _) in PODS {
            if let Some(pod) = self.pods.remove(cluster) {
                pod.nginx.stop();
            }
        }
    }
}

/// Asks for each path through the balancer (one keep-alive connection): what a row needs cached.
fn warm(paths: &[String]) {
    let mut client = Client::new(EDGE);
    for path in paths {
        let _ = client.get(path);
    }
}

fn segment(i: usize) -> String {
    format!("/seg/{i:04}.ts")
}

/// A GET of `path` through the balancer with the benchmark's Host, on a connection of its own.
/// Whether `path` through the balancer is a HIT within 5 s (asked every 100 ms).
fn becomes_hit(path: &str) -> bool {
    (0..50).any(|_| {
        let hit = get_once(path).is_ok_and(|r| r.header(CACHE_STATUS_HEADER) == Some("HIT"));
        if !hit {
            std::thread::sleep(Duration::from_millis(100));
        }
        hit
    })
}

fn get_once(path: &str) -> io::Result<Response> {
    get_from(EDGE, path)
}

/// A GET of `path` from `addr` with the benchmark's Host, on a connection of its own.
fn get_from(addr: &str, path: &str) -> io::Result<Response> {
    Client::once(addr, "GET", path, &[("Host", HOST)])
}

/// The response's X-Cache-Status; `-` without one, or without a response.
fn cache_status(r: &io::Result<Response>) -> &str {
    r.as_ref()
        .ok()
        .and_then(|r| r.header(CACHE_STATUS_HEADER))
        .unwrap_or("-")
}

/// Failed requests: an error, or another status than expected.
#[derive(Default)]
struct Failures {
    /// The requests checked.
    total: usize,
    count: usize,
    kinds: BTreeMap<String, usize>,
}

impl Failures {
    /// The failures of `responses` (taken in turn: the requests run as it is iterated).
    fn of(responses: impl IntoIterator<Item = io::Result<Response>>, expected: u16) -> Failures {
        let mut failures = Failures::default();
        for r in responses {
            failures.check(r, expected);
        }
        failures
    }

    fn check(&mut self, r: io::Result<Response>, expected: u16) {
        self.total += 1;
        let kind = match r {
            Ok(r) if r.status == expected => return,
            Ok(r) => format!("{}", r.status),
            Err(e) => format!("{:?}", e.kind()),
        };
        self.count += 1;
        *self.kinds.entry(kind).or_default() += 1;
    }

    /// The figure of rows 4, 5, 6: `3/20 failed{note}: 502 x3`, met when none failed.
    fn figure(&self, id: &str, note: &str, data: Value) -> Figure {
        figure(
            id,
            format!(
                "{}/{} failed{note}{}",
                self.count,
                self.total,
                self.detail()
            ),
            Some(self.count == 0),
            data,
        )
    }

    /// `: 502 x12` or nothing.
    fn detail(&self) -> String {
        if self.kinds.is_empty() {
            return String::new();
        }
        let kinds: Vec<String> = self
            .kinds
            .iter()
            .map(|(k, n)| format!("{k} x{n}"))
            .collect();
        format!(": {}", kinds.join(", "))
    }

    /// `, 3 failed: ...` or nothing.
    fn suffix(&self) -> String {
        if self.count == 0 {
            String::new()
        } else {
            format!(", {} failed{}", self.count, self.detail())
        }
    }

    fn to_json(&self) -> Value {
        json!({ "count": self.count, "kinds": self.kinds })
    }
}

// ---------------------------------------------------------------------------------------------
// The environment: network namespace, content, hosts, counters, wrk.

/// Moves the process into a network namespace of its own with its loopback up, and lets any uid
/// listen on ports below 1024 there.
fn private_network() -> io::Result<()> {
    // SAFETY: unshare(2) takes no pointers; called before any other thread exists.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a socket used only for the interface ioctls below, closed at the end; `request` is
    // a zeroed ifreq naming "lo", which both ioctls read and the first one fills.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut request: libc::ifreq = std::mem::zeroed();
        for (to, from) in request.ifr_name.iter_mut().zip(b"lo\0") {
            *to = *from as libc::c_char;
        }
        let mut result = libc::ioctl(
            fd,
            libc::SIOCGIFFLAGS as _,
            &mut request as *mut libc::ifreq,
        );
        if result == 0 {
            request.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
            result = libc::ioctl(fd, libc::SIOCSIFFLAGS as _, &request as *const libc::ifreq);
        }
        let error = io::Error::last_os_error();
        libc::close(fd);
        if result != 0 {
            return Err(error);
        }
    }
    std::fs::write("/proc/sys/net/ipv4/ip_unprivileged_port_start", "0")
}

/// The kernel's count of accepted TCP connections (the benchmark's network namespace's).
fn passive_opens(setup: &Setup) -> Option<u64> {
    if !setup.isolated {
        return None;
    }
    let snmp = std::fs::read_to_string("/proc/net/snmp").ok()?;
    let mut tcp = snmp.lines().filter(|l| l.starts_with("Tcp:"));
    let (names, values) = (tcp.next()?, tcp.next()?);
    let at = names.split_whitespace().position(|n| n == "PassiveOpens")?;
    values.split_whitespace().nth(at)?.parse().ok()
}

/// The origin's accepted connections, from its stub_status (which counts this request's own).
fn origin_accepts() -> Option<u64> {
    let r = Client::once(ORIGIN_STATUS, "GET", "/", &[("Host", ORIGIN_IP)]).ok()?;
    let text = String::from_utf8_lossy(&r.body).into_owned();
    // "Active connections: 1\nserver accepts handled requests\n 5 5 9\n..."
    let line = text.lines().nth(2)?;
    line.split_whitespace().next()?.parse().ok()
}

/// The origin's files.
fn make_content(www: &Path) {
    let mkdir = |p: &Path| {
        std::fs::create_dir_all(p).unwrap_or_else(|e| panic!("creating {}: {e}", p.display()));
        chmod(p, 0o755);
    };
    let write = |p: &Path, data: &[u8]| {
        std::fs::write(p, data).unwrap_or_else(|e| panic!("writing {}: {e}", p.display()));
        chmod(p, 0o644);
    };
    for dir in [
        "seg",
        "live",
        "sites/customer-a/site",
        "sites/customer-b/site",
    ] {
        mkdir(&www.join(dir));
    }
    write(&www.join("1k.bin"), &pattern(1024));
    write(&www.join("64k.bin"), &pattern(64 * 1024));
    write(&www.join("1m.bin"), &pattern(1 << 20));
    write(&www.join("4m.bin"), &pattern(4 << 20));
    mkdir(&www.join("zipf"));
    peers::make_zipf_content(www, write);
    // Random bytes, so that nothing on the way compresses them.
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut big = Vec::with_capacity(BIG as usize);
    while (big.len() as u64) < BIG {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        big.extend_from_slice(&state.to_le_bytes());
    }
    big.truncate(BIG as usize);
    write(&www.join("50m.bin"), &big);
    for i in 0..2000 {
        let mut data = format!("segment {i:04}\n").into_bytes();
        data.resize(2048, b'.');
        write(&www.join(format!("seg/{i:04}.ts")), &data);
    }
    for site in ["customer-a", "customer-b"] {
        write(
            &www.join(format!("sites/{site}/site/page.html")),
            format!("page of {site}\n").as_bytes(),
        );
    }
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| b'a' + (i % 26) as u8).collect()
}

/// The cluster's DNS server (port 53 of 127.0.0.53) with the Services' fully qualified names, and
/// the resolv.conf that names it.
fn cluster_dns(dir: &Path) -> (Dns, PathBuf) {
    let dns = Dns::start_on(SocketAddr::from(([127, 0, 0, 53], 53)));
    for (cluster, ip) in PODS.iter().chain([&("origin", ORIGIN_IP)]) {
        // The caches' Services are headless, as the operator makes them.
        publish(&dns, cluster, cluster.starts_with("cache-"), &[ip]);
    }
    let path = dir.join("resolv.conf");
    std::fs::write(&path, "nameserver 127.0.0.53\n").expect("writing resolv.conf");
    chmod(&path, 0o644);
    (dns, path)
}

/// Publishes the Service `service` of the namespace `default` with the ready pods at `ips`, as
/// the cluster DNS does: headless (a cache's) or with an address of its own (`ips[0]`).
fn publish(dns: &Dns, service: &str, headless: bool, ips: &[&str]) {
    let name = format!("{service}.default.svc.cluster.local");
    let ips: Vec<Ipv4Addr> = ips
        .iter()
        .map(|ip| ip.parse().expect("an IPv4 address"))
        .collect();
    if headless {
        dns.publish_headless(&name, SERVICE_PORT_NAME, &ips);
    } else {
        dns.publish_service(&name, SERVICE_PORT_NAME, ips[0]);
    }
}

/// The sandboxes' /etc/hosts: the Services' names on loopback addresses.
fn hosts_file(dir: &Path) -> PathBuf {
    let mut text = String::from("127.0.0.1 localhost\n::1 localhost\n");
    for (cluster, ip) in PODS {
        text.push_str(&format!("{ip} {cluster}.default.svc\n"));
    }
    text.push_str(&format!("{ORIGIN_IP} origin.default.svc\n"));
    let path = dir.join("hosts");
    std::fs::write(&path, text).expect("writing hosts");
    chmod(&path, 0o644);
    path
}

fn chmod(path: &Path, mode: u32) {
    let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode));
}

/// Replaces `path` with `text` in one rename, as a publisher would.
fn write_atomically(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).expect("writing a manifest");
    chmod(&tmp, 0o644);
    std::fs::rename(&tmp, path).expect("renaming a manifest");
}

fn count(text: &str, needle: &str) -> usize {
    text.matches(needle).count()
}

fn wait_for(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    done()
}

fn sleep_until(t: Instant) {
    let now = Instant::now();
    if t > now {
        std::thread::sleep(t - now);
    }
}

fn median(values: &[f64]) -> Option<f64> {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => None,
        n if n % 2 == 1 => Some(v[n / 2]),
        n => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// `1 request`, `15 requests`.
fn requests(n: usize) -> String {
    format!("{n} request{}", if n == 1 { "" } else { "s" })
}

fn bytes(n: u64) -> String {
    if n >= 1 << 20 {
        format!("{:.2} MiB", n as f64 / (1 << 20) as f64)
    } else if n >= 1 << 10 {
        format!("{:.1} KiB", n as f64 / 1024.0)
    } else {
        format!("{n} B")
    }
}

/// Runs `f(i)` for each i below `n` on `threads` threads that start together; results by i.
fn parallel<T: Send>(n: usize, threads: usize, f: impl Fn(usize) -> T + Sync) -> Vec<T> {
    let next = AtomicUsize::new(0);
    let barrier = Barrier::new(threads);
    let results: Mutex<Vec<Option<T>>> = Mutex::new((0..n).map(|_| None).collect());
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                barrier.wait();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        break;
                    }
                    let r = f(i);
                    results.lock().expect("results")[i] = Some(r);
                }
            });
        }
    });
    results
        .into_inner()
        .expect("results")
        .into_iter()
        .map(|r| r.expect("every index ran"))
        .collect()
}

struct WrkRun {
    rps: f64,
    /// Requests completed.
    requests: u64,
    errors: u64,
}

/// `wrk -t1 -c50 -dSECONDS` of `url` with the benchmark's Host; killed if it overruns.
fn wrk(url: &str, seconds: u64) -> Result<WrkRun, String> {
    wrk_script(url, seconds, None)
}

/// [`wrk`], its requests made by the Lua `script` when there is one.
fn wrk_script(url: &str, seconds: u64, script: Option<&Path>) -> Result<WrkRun, String> {
    let mut command = Command::new("wrk");
    command.args([
        "-t1",
        "-c50",
        &format!("-d{seconds}s"),
        "-H",
        &format!("Host: {HOST}"),
    ]);
    if let Some(script) = script {
        command.arg("-s").arg(script);
    }
    let mut child = command
        .arg(url)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("wrk: {e}"))?;
    let deadline = Instant::now() + Duration::from_secs(seconds + 20);
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(100)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err("wrk overran".into());
            }
        }
    }
    let mut out = String::new();
    if let Some(mut stdout) = child.stdout.take() {
        let _ = stdout.read_to_string(&mut out);
    }
    let number = |prefix: &str| {
        out.lines()
            .find_map(|l| l.trim().strip_prefix(prefix))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<f64>().ok())
    };
    let rps = number("Requests/sec:").ok_or_else(|| format!("wrk said: {out}"))?;
    // `  123456 requests in 5.00s, 40.12MB read`
    let requests = out
        .lines()
        .find(|l| l.contains(" requests in "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    let mut errors = number("Non-2xx or 3xx responses:").unwrap_or(0.0) as u64;
    if let Some(line) = out.lines().find(|l| l.trim().starts_with("Socket errors:")) {
        errors += line
            .split(|c: char| !c.is_ascii_digit())
            .filter_map(|n| n.parse::<u64>().ok())
            .sum::<u64>();
    }
    Ok(WrkRun {
        rps,
        requests,
        errors,
    })
}

/// Says so when the workspace's binary is older than the operator's sources.
fn warn_if_stale(binary: &Path) {
    let built = std::fs::metadata(binary).and_then(|m| m.modified()).ok();
    let root = cdn_operator_e2e::repository_root();
    let newest = newest_mtime(&root.join("src"));
    if let (Some(built), Some(newest)) = (built, newest) {
        if newest > built {
            eprintln!(
                "dataplane: {} is older than src/: run `cargo build --bin cdn-operator` first",
                binary.display()
            );
        }
    }
}

fn newest_mtime(dir: &Path) -> Option<SystemTime> {
    let mut newest = None;
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let t = if entry.path().is_dir() {
            newest_mtime(&entry.path())
        } else {
            entry.metadata().and_then(|m| m.modified()).ok()
        };
        newest = newest.max(t);
    }
    newest
}

// ---------------------------------------------------------------------------------------------
// A small blocking HTTP/1.1 client.

#[derive(Debug)]
struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    /// From the request written to the first byte of the response.
    ttfb: Duration,
    /// From the request written to the end of the response.
    elapsed: Duration,
}

impl Response {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// A client connection to `addr`, kept alive between requests while the server keeps it.
struct Client {
    addr: String,
    conn: Option<BufReader<TcpStream>>,
    /// TCP connections it opened.
    connects: u64,
}

impl Client {
    fn new(addr: &str) -> Client {
        Client {
            addr: addr.into(),
            conn: None,
            connects: 0,
        }
    }

    /// One request on a connection of its own, closed after it.
    fn once(
        addr: &str,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
    ) -> io::Result<Response> {
        let mut conn = connect(addr)?;
        exchange(&mut conn, method, path, headers, true).map(|(r, _)| r)
    }

    /// A GET of `path` with the benchmark's Host.
    fn get(&mut self, path: &str) -> io::Result<Response> {
        self.request("GET", path, &[("Host", HOST)])
    }

    /// A request on the kept connection (a new one if there is none); once more on a new
    /// connection if a kept one was closed by the server before answering.
    fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
    ) -> io::Result<Response> {
        loop {
            let reused = self.conn.is_some();
            if self.conn.is_none() {
                self.conn = Some(connect(&self.addr)?);
                self.connects += 1;
            }
            let conn = self.conn.as_mut().expect("a connection");
            match exchange(conn, method, path, headers, false) {
                Ok((response, keep)) => {
                    if !keep {
                        self.conn = None;
                    }
                    return Ok(response);
                }
                Err(e) => {
                    self.conn = None;
                    let closed = matches!(
                        e.kind(),
                        io::ErrorKind::UnexpectedEof
                            | io::ErrorKind::ConnectionReset
                            | io::ErrorKind::BrokenPipe
                    );
                    if !(reused && closed) {
                        return Err(e);
                    }
                }
            }
        }
    }
}

fn connect(addr: &str) -> io::Result<BufReader<TcpStream>> {
    let addr: SocketAddr = addr
        .parse()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("{addr}: {e}")))?;
    let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    stream.set_read_timeout(Some(TIMEOUT))?;
    stream.set_write_timeout(Some(TIMEOUT))?;
    stream.set_nodelay(true)?;
    Ok(BufReader::with_capacity(64 * 1024, stream))
}

/// Writes one request and reads its response: the response, and whether the connection may
/// carry another request.
fn exchange(
    conn: &mut BufReader<TcpStream>,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    close: bool,
) -> io::Result<(Response, bool)> {
    let mut head = format!("{method} {path} HTTP/1.1\r\n");
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    if close {
        head.push_str("Connection: close\r\n");
    }
    head.push_str("\r\n");
    let started = Instant::now();
    conn.get_mut().write_all(head.as_bytes())?;
    if conn.fill_buf()?.is_empty() {
        return Err(eof("the connection closed before a response"));
    }
    let ttfb = started.elapsed();
    let mut line = String::new();
    read_line(conn, &mut line)?;
    let mut words = line.split_whitespace();
    let version = words.next().unwrap_or_default().to_string();
    let status: u16 = words.next().and_then(|s| s.parse().ok()).ok_or_else(|| {
        io::Error::new(io::ErrorKind::InvalidData, format!("status line {line:?}"))
    })?;
    let mut response_headers = Vec::new();
    loop {
        read_line(conn, &mut line)?;
        let text = line.trim_end();
        if text.is_empty() {
            break;
        }
        if let Some((name, value)) = text.split_once(':') {
            response_headers.push((name.trim().to_string(), value.trim().to_string()));
        }
    }
    let header = |name: &str| {
        response_headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.to_ascii_lowercase())
    };
    let mut body = Vec::new();
    let mut framed = true;
    if method == "HEAD" || status == 204 || status == 304 || status < 200 {
    } else if header("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        loop {
            read_line(conn, &mut line)?;
            let size = usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16)
                .map_err(|_| {
                    io::Error::new(io::ErrorKind::InvalidData, format!("chunk size {line:?}"))
                })?;
            if size == 0 {
                loop {
                    read_line(conn, &mut line)?;
                    if line.trim().is_empty() {
                        break;
                    }
                }
                break;
            }
            let at = body.len();
            body.resize(at + size, 0);
            conn.read_exact(&mut body[at..])?;
            read_line(conn, &mut line)?;
        }
    } else if let Some(length) = header("content-length").and_then(|v| v.parse::<usize>().ok()) {
        body.resize(length, 0);
        conn.read_exact(&mut body)?;
    } else {
        conn.read_to_end(&mut body)?;
        framed = false;
    }
    let keep = framed
        && !close
        && version == "HTTP/1.1"
        && !header("connection").is_some_and(|v| v.contains("close"));
    Ok((
        Response {
            status,
            headers: response_headers,
            body,
            ttfb,
            elapsed: started.elapsed(),
        },
        keep,
    ))
}

fn read_line(conn: &mut BufReader<TcpStream>, line: &mut String) -> io::Result<()> {
    line.clear();
    if conn.read_line(line)? == 0 {
        return Err(eof("the connection closed mid-response"));
    }
    Ok(())
}

fn eof(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::UnexpectedEof, what)
}

// ---------------------------------------------------------------------------------------------
// The table.

fn table(columns: &BTreeMap<&str, Column>) -> String {
    // The lines of ROWS that a column measured.
    let ids = ROWS.iter().filter(|(id, _, _)| {
        columns
            .values()
            .any(|c| c.figures.iter().any(|f| f.id == *id))
    });
    let cell = |column: &str, id: &str| -> (String, String) {
        match columns.get(column) {
            None => ("-".into(), String::new()),
            Some(c) => match c.figures.iter().find(|f| f.id == id) {
                None => ("(not run)".into(), String::new()),
                Some(f) => (
                    f.shown.clone(),
                    match f.met {
                        Some(true) => "met".into(),
                        Some(false) => "NOT met".into(),
                        None => String::new(),
                    },
                ),
            },
        }
    };
    let mut rows: Vec<[String; 6]> = vec![[
        "#".into(),
        "measure".into(),
        "before".into(),
        "after".into(),
        "target".into(),
        "met (before / after)".into(),
    ]];
    for &(id, what, target) in ids {
        let (b, bm) = cell("before", id);
        let (a, am) = cell("after", id);
        let met = if bm.is_empty() && am.is_empty() {
            String::new()
        } else {
            format!(
                "{} / {}",
                if bm.is_empty() { "-" } else { &bm },
                if am.is_empty() { "-" } else { &am }
            )
        };
        rows.push([id.into(), what.into(), b, a, target.into(), met]);
    }
    let widths: Vec<usize> = (0..6)
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for (n, row) in rows.iter().enumerate() {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out.push_str(&format!("| {} |\n", cells.join(" | ")));
        if n == 0 {
            let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
            out.push_str(&format!("|-{}-|\n", rule.join("-|-")));
        }
    }
    for (name, column) in columns {
        out.push_str(&format!("{name}: {}\n", column.binary.display()));
    }
    out
}

/// The first line of a message.
fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or_default()
}

/// The sum of the series of `name` whose labels include `labels` in a Prometheus exposition.
fn metric_sum(text: &str, name: &str, labels: &str) -> f64 {
    cdn_operator_testkit::metric_sum(text, name, labels).unwrap_or(0.0)
}
