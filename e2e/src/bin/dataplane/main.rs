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
//!     and Apache Traffic Server, each one tier in front of the same origin
//!     (`peers/servers.rs`: how each runs; the generated one is the pod of `cache-1`, asked
//!     directly): req/s of cached objects of 1 KiB, 1 MiB and 4 MiB against nginx serving the
//!     file, servers interleaved, the median of `max(--wrk-rounds, 3)` rounds (20a to 20c); a
//!     cold 1 MiB miss (21); 200 concurrent misses of a slow object (22); a Zipf workload, every
//!     cache given a tenth of the set (23); objects expired while the origin hangs 15 s (24); 200
//!     concurrent requests for a `no-cache` object (25); a cached 1 KiB object through two tiers of
//!     each kind (26). `--only peers` runs them.
//!
//! Each column (`--before`: an older binary's configurations; `after`: this workspace's binary,
//! found as the e2e crate finds it) runs the rows on a fresh origin, caches and balancer; the
//! table shows both columns and the targets. The balancer is restarted (a fresh pod) after the
//! rows that make the origin fail (4, 5, 6), so that a member left out by one row does not fail
//! the next. Clients: a small blocking HTTP/1.1 client (`client.rs`, per-request timeout 30 s),
//! threads for concurrency, `wrk` for throughput. Everything ends by itself: bounded loops,
//! timeouts, every nginx stopped on exit (and, bubblewrap's `--die-with-parent`, if this process
//! dies).
//!
//! The files, lower layers first (a file uses only files named before it): `util.rs` (small
//! helpers), `report.rs` (the table's lines, the figures, the table), `lab.rs` (addresses, the
//! network namespace, names), `client.rs` and `wrk.rs` (the clients), `zipf.rs` and `origin.rs`
//! (the origin and its content), `pods.rs` (rendering, pods), `cdn.rs` (one column's CDN),
//! `traffic.rs` (how rows ask and count failures), `peers/servers.rs` (Varnish, Traffic Server),
//! then the rows, methods of `Cdn`: `rows/` (1 to 17, a file per group, listed in `rows/mod.rs`)
//! and `peers/` (20 to 26, listed in `peers/mod.rs`). A new row goes in its group's file, its line
//! in `report.rs`'s ROWS.

mod cdn;
mod client;
mod lab;
mod origin;
mod peers;
mod pods;
mod report;
mod rows;
mod traffic;
mod util;
mod wrk;
mod zipf;

use cdn::Cdn;
use cdn_operator::purge::signing::Signer;
use cdn_operator_e2e::operator_binary;
use cdn_operator_testkit::nginx::{self, Sandbox};
use clap::Parser;
use lab::{cluster_dns, hosts_file, private_network, Setup, TOKEN_KEY, TOKEN_SECRET};
use origin::{make_content, start_direct};
use report::{table, Column};
use serde_json::json;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::SystemTime;
use util::chmod;

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
