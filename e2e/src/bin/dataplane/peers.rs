//! The caches users would pick instead of the generated one, measured beside it (rows 20 to 26):
//! Varnish and Apache Traffic Server, the packages of Debian stable (`scripts/install-test-deps.sh`
//! installs them), each run as a user choosing a cache would run it and given the same room:
//!
//! - **Varnish** (`varnishd -F`): the default VCL in front of one backend (`-b`), `malloc` storage
//!   of the room given, objects without a lifetime of their own kept a day (`default_ttl`), as the
//!   generated caches keep them (`cache.valid`).
//! - **Traffic Server** (`traffic_server` with a runroot of its own, started as root and run as
//!   its user `trafficserver`, as the package runs it): Debian's configuration with a reverse-proxy
//!   `remap` of the benchmark's Host to its backend, the Host kept, a cache volume of the room
//!   given in memory (a file on /dev/shm, as the generated caches' emptyDir is a tmpfs here) and a
//!   RAM cache of the same size, objects without a lifetime kept a day (the heuristic lifetime
//!   pinned to a day, no explicit lifetime required).
//!
//! Each listens on an address of its own of the benchmark's loopback: one tier in front of the
//! origin (`VARNISH`, `ATS`), or a second tier in front of the first (`VARNISH_FRONT`,
//! `ATS_FRONT`). The generated cache as one tier is the pod of `cache-1`, asked directly.

use super::*;
use cdn_operator_testkit::process::Operator;

/// The peers' addresses: one tier each, then a tier in front of each.
const VARNISH: &str = "127.0.0.40:80";
const ATS: &str = "127.0.0.41:80";
const VARNISH_FRONT: &str = "127.0.0.42:80";
const ATS_FRONT: &str = "127.0.0.43:80";
/// The generated cache as one tier: the pod of `cache-1`.
const GENERATED: &str = "127.0.0.11:80";

/// Zipf workload (row 23): objects, their sizes, the exponent, requests.
const ZIPF_OBJECTS: usize = 2_000;
const ZIPF_CLASSES: usize = 16;
const ZIPF_S: f64 = 1.0;
const ZIPF_WARM: usize = 4_000;
const ZIPF_MEASURED: usize = 8_000;

/// The rows of the peers; `--only peers` runs them all.
pub(super) const IDS: [&str; 7] = ["20", "21", "22", "23", "24", "25", "26"];

/// Whether row `id` of the peers runs.
pub(super) fn runs(setup: &Setup, id: &str) -> bool {
    setup.runs(id) || setup.runs("peers")
}

/// How long a peer may take to answer its first request.
const START_PATIENCE: Duration = Duration::from_secs(60);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    Varnish,
    TrafficServer,
}

impl Kind {
    fn program(self) -> &'static str {
        match self {
            Kind::Varnish => "varnishd",
            Kind::TrafficServer => "traffic_server",
        }
    }

    /// Its release, as the program says it (`7.1.1`); an error saying how to install it.
    pub(super) fn version(self) -> Result<String, String> {
        let out = Command::new(self.program())
            .arg("-V")
            .stdin(Stdio::null())
            .output()
            .map_err(|e| {
                format!(
                    "no {} ({e}): scripts/install-test-deps.sh installs Debian's",
                    self.program()
                )
            })?;
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        // `varnishd (varnish-7.1.1 revision …)`, `Traffic Server 9.2.9 Apr  4 2026 …`.
        let version = match self {
            Kind::Varnish => text
                .split("varnish-")
                .nth(1)
                .and_then(|v| v.split_whitespace().next()),
            Kind::TrafficServer => text
                .split("Traffic Server ")
                .nth(1)
                .and_then(|v| v.split_whitespace().next()),
        };
        version
            .map(str::to_string)
            .ok_or_else(|| format!("{} -V said: {text}", self.program()))
    }
}

/// A running peer; killed when dropped.
pub(super) struct Peer {
    addr: &'static str,
    process: Operator,
    /// Traffic Server's cache volume, on /dev/shm.
    _volume: Option<tempfile::TempDir>,
}

impl Peer {
    /// Starts `kind` at `addr` in front of `backend`, with `room_mib` of cache, its files in
    /// `dir`; returns once it has answered a request for a cached object (`/obj/ready`).
    pub(super) fn start(
        kind: Kind,
        dir: &Path,
        addr: &'static str,
        backend: &str,
        room_mib: u64,
    ) -> Result<Peer, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let (command, volume) = match kind {
            Kind::Varnish => (varnish(dir, addr, backend, room_mib), None),
            Kind::TrafficServer => {
                let (command, volume) = traffic_server(dir, addr, backend, room_mib)?;
                (command, Some(volume))
            }
        };
        let mut process = Operator::spawn(kind.program(), command);
        let deadline = Instant::now() + START_PATIENCE;
        loop {
            let answered = Client::once(addr, "GET", "/obj/ready", &[("Host", HOST)])
                .is_ok_and(|r| r.status == 200);
            if answered {
                break;
            }
            if let Some(status) = process.exited() {
                return Err(format!(
                    "{} exited ({status}):\n{}",
                    kind.program(),
                    process.logs()
                ));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{} did not answer on {addr} within {START_PATIENCE:?}:\n{}",
                    kind.program(),
                    process.logs()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(Peer {
            addr,
            process,
            _volume: volume,
        })
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        // Varnish's manager stops its child on SIGTERM; Traffic Server stops on it.
        if self.process.exited().is_none() {
            self.process.terminate();
            let deadline = Instant::now() + Duration::from_secs(10);
            while self.process.exited().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

fn varnish(dir: &Path, addr: &str, backend: &str, room_mib: u64) -> Command {
    let mut command = Command::new("varnishd");
    command
        .arg("-F")
        .arg("-n")
        .arg(dir)
        .args(["-a", addr, "-b", backend])
        .arg("-s")
        .arg(format!("malloc,{room_mib}M"))
        // The generated caches keep an object without a lifetime of its own a day.
        .args(["-t", "86400"]);
    command
}

/// Traffic Server's command and its cache volume: a runroot in `dir` (its configuration copied
/// from Debian's, then changed), every path in it but the programs'.
fn traffic_server(
    dir: &Path,
    addr: &str,
    backend: &str,
    room_mib: u64,
) -> Result<(Command, tempfile::TempDir), String> {
    let fail = |what: &str, e: &dyn std::fmt::Display| format!("Traffic Server's {what}: {e}");
    let etc = dir.join("etc");
    for sub in ["etc", "var", "run", "log"] {
        std::fs::create_dir_all(dir.join(sub)).map_err(|e| fail(sub, &e))?;
    }
    let copied = Command::new("cp")
        .arg("-r")
        .arg("/etc/trafficserver/.")
        .arg(&etc)
        .status()
        .map_err(|e| fail("configuration", &e))?;
    if !copied.success() {
        return Err(fail("configuration", &"cp -r /etc/trafficserver failed"));
    }
    let volume = tempfile::Builder::new()
        .prefix("cdn-dataplane-ats-")
        .tempdir_in("/dev/shm")
        .map_err(|e| fail("volume on /dev/shm", &e))?;
    let (ip, port) = addr.split_once(':').expect("an address with a port");
    let records = std::fs::read_to_string(etc.join("records.config"))
        .map_err(|e| fail("records.config", &e))?;
    let records = set_records(
        &records,
        &[
            (
                "proxy.config.http.server_ports",
                format!("STRING {port}:ip-in={ip}"),
            ),
            (
                "proxy.config.cache.ram_cache.size",
                format!("INT {}", room_mib << 20),
            ),
            // The Host a viewer asked for goes to the origin, as the generated caches send it.
            ("proxy.config.url_remap.pristine_host_hdr", "INT 1".into()),
            // A day for objects without a lifetime of their own, as the generated caches.
            ("proxy.config.http.cache.required_headers", "INT 0".into()),
            (
                "proxy.config.http.cache.heuristic_min_lifetime",
                "INT 86400".into(),
            ),
            (
                "proxy.config.http.cache.heuristic_max_lifetime",
                "INT 86400".into(),
            ),
        ],
    );
    let files = [
        ("records.config", records),
        (
            "remap.config",
            format!("map http://{HOST}/ http://{backend}/\n"),
        ),
        (
            "storage.config",
            format!("{} {room_mib}M\n", volume.path().display()),
        ),
    ];
    for (name, text) in files {
        std::fs::write(etc.join(name), text).map_err(|e| fail(name, &e))?;
    }
    let runroot = dir.join("runroot.yaml");
    let d = dir.display();
    std::fs::write(
        &runroot,
        format!(
            "prefix: {d}\nexec_prefix: /usr\nbindir: /usr/bin\nsbindir: /usr/sbin\n\
             sysconfdir: {d}/etc\ndatadir: {d}/var\nincludedir: /usr/include\n\
             libdir: /usr/lib/trafficserver\nlibexecdir: /usr/lib/trafficserver/modules\n\
             localstatedir: {d}/var\nruntimedir: {d}/run\nlogdir: {d}/log\ncachedir: {d}/var\n"
        ),
    )
    .map_err(|e| fail("runroot.yaml", &e))?;
    // It runs as its own user, as Debian's package runs it.
    for path in [dir, volume.path()] {
        let owned = Command::new("chown")
            .arg("-R")
            .arg("trafficserver:trafficserver")
            .arg(path)
            .status()
            .map_err(|e| fail("ownership", &e))?;
        if !owned.success() {
            return Err(fail("ownership", &format!("chown {}", path.display())));
        }
    }
    let mut command = Command::new("traffic_server");
    command.arg(format!("--run-root={}", runroot.display()));
    Ok((command, volume))
}

/// `records` with each `(name, "TYPE value")` set: its line replaced, or added.
fn set_records(records: &str, settings: &[(&str, String)]) -> String {
    let mut lines: Vec<String> = records.lines().map(str::to_string).collect();
    for (name, value) in settings {
        let line = format!("CONFIG {name} {value}");
        let prefix = format!("CONFIG {name} ");
        match lines.iter_mut().find(|l| l.starts_with(&prefix)) {
            Some(existing) => *existing = line,
            None => lines.push(line),
        }
    }
    lines.join("\n") + "\n"
}

/// The peers of one run: one tier of each, and a second tier in front of each.
pub(super) struct Peers {
    varnish: Peer,
    ats: Peer,
    varnish_front: Peer,
    ats_front: Peer,
    /// `Varnish 7.1.1`, `ATS 9.2.9`.
    names: [String; 2],
    room_mib: u64,
}

impl Peers {
    fn start(dir: &Path) -> Result<Peers, String> {
        let names = [
            format!("Varnish {}", Kind::Varnish.version()?),
            format!("ATS {}", Kind::TrafficServer.version()?),
        ];
        let room_mib = zipf_room_mib();
        let start = |kind, name: &str, addr, backend: &str| {
            Peer::start(kind, &dir.join(name), addr, backend, room_mib)
        };
        Ok(Peers {
            varnish: start(Kind::Varnish, "varnish", VARNISH, ORIGIN)?,
            ats: start(Kind::TrafficServer, "ats", ATS, ORIGIN)?,
            varnish_front: start(Kind::Varnish, "varnish-front", VARNISH_FRONT, VARNISH)?,
            ats_front: start(Kind::TrafficServer, "ats-front", ATS_FRONT, ATS)?,
            names,
            room_mib,
        })
    }

    /// The one-tier servers: the generated cache, then the peers; name and address.
    fn one_tier(&self) -> [(&str, &str); 3] {
        [
            ("generated", GENERATED),
            (self.names[0].as_str(), self.varnish.addr),
            (self.names[1].as_str(), self.ats.addr),
        ]
    }
}

/// The size class of Zipf object `rank` (0 to 15: 512 KiB to 1,952 KiB).
fn zipf_class(rank: usize) -> usize {
    (rank.wrapping_mul(2_654_435_761) >> 7) % ZIPF_CLASSES
}

pub(super) fn zipf_class_bytes(class: usize) -> usize {
    (512 + 96 * class) << 10
}

/// The cache room of row 23, for every server: a tenth of the Zipf set, in MiB.
fn zipf_room_mib() -> u64 {
    let set: usize = (0..ZIPF_OBJECTS)
        .map(|r| zipf_class_bytes(zipf_class(r)))
        .sum();
    (set as u64 / 10) >> 20
}

/// The Zipf files of the origin, `zipf/CLASS.bin`, under `www`.
pub(super) fn make_zipf_content(www: &Path, write: impl Fn(&Path, &[u8])) {
    for class in 0..ZIPF_CLASSES {
        write(
            &www.join(format!("zipf/{class}.bin")),
            &pattern(zipf_class_bytes(class)),
        );
    }
}

/// The requests of row 23: ranks drawn from Zipf(`ZIPF_S`) over `ZIPF_OBJECTS` with a fixed
/// seed, the same sequence for every server.
fn zipf_sequence(n: usize) -> Vec<usize> {
    let weights: Vec<f64> = (1..=ZIPF_OBJECTS)
        .map(|k| 1.0 / (k as f64).powf(ZIPF_S))
        .collect();
    let total: f64 = weights.iter().sum();
    let mut cdf = Vec::with_capacity(ZIPF_OBJECTS);
    let mut acc = 0.0;
    for w in weights {
        acc += w / total;
        cdf.push(acc);
    }
    let mut state: u64 = 0x2545_f491_4f6c_dd1d;
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let u = (state >> 11) as f64 / (1u64 << 53) as f64;
            cdf.partition_point(|&c| c < u).min(ZIPF_OBJECTS - 1)
        })
        .collect()
}

/// A figure's text for one value per server: `generated 0.61 · Varnish 7.1.1 0.82 · …`.
fn per_server(values: &[(&str, String)]) -> String {
    values
        .iter()
        .map(|(name, v)| format!("{name} {v}"))
        .collect::<Vec<_>>()
        .join(" · ")
}

/// Bytes the files under `dir` take (their blocks, as `du` counts them).
fn disk_usage(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            match entry.metadata() {
                Ok(m) if m.is_dir() => pending.push(entry.path()),
                Ok(m) => total += m.blocks() * 512,
                Err(_) => {}
            }
        }
    }
    total
}

/// What 200 concurrent requests for one object did on one server (rows 22 and 25).
struct Herd<'a> {
    name: &'a str,
    origin_requests: usize,
    p50_ms: f64,
    max_ms: f64,
    failures: Failures,
}

impl<'a> Herd<'a> {
    fn shown(&self) -> (&'a str, String) {
        (
            self.name,
            format!(
                "{} origin req, p50 {:.0} ms, slowest {:.0} ms{}",
                self.origin_requests,
                self.p50_ms,
                self.max_ms,
                self.failures.suffix()
            ),
        )
    }

    fn to_json(&self) -> Value {
        json!({"server": self.name, "origin_requests": self.origin_requests,
            "p50_ms": self.p50_ms, "max_ms": self.max_ms, "failed": self.failures.to_json()})
    }
}

/// What `wrk` measured of a path on each server, in rounds.
struct Rounds {
    /// req/s of nginx serving the file, a value per round.
    direct: Vec<f64>,
    /// Per server, req/s and the ratio to the round's direct figure.
    rps: Vec<Vec<f64>>,
    ratios: Vec<Vec<f64>>,
    errors: Vec<String>,
}

/// `max(--wrk-rounds, 3)` rounds of `wrk` of nginx serving `file`, then of `path` on each of
/// `servers` in turn: runs seconds apart share the machine's load of the moment.
fn interleaved(setup: &Setup, file: &str, servers: &[(&str, &str)], path: &str) -> Rounds {
    let mut rounds = Rounds {
        direct: Vec::new(),
        rps: vec![Vec::new(); servers.len()],
        ratios: vec![Vec::new(); servers.len()],
        errors: Vec::new(),
    };
    for _ in 0..setup.wrk_rounds.max(3) {
        let direct = match wrk(&format!("http://{DIRECT}{file}"), setup.wrk_seconds) {
            Ok(run) => run.rps,
            Err(e) => {
                rounds.errors.push(format!("direct: {e}"));
                continue;
            }
        };
        rounds.direct.push(direct);
        for (i, (name, addr)) in servers.iter().enumerate() {
            match wrk(&format!("http://{addr}{path}"), setup.wrk_seconds) {
                Ok(run) => {
                    if run.errors > 0 {
                        rounds.errors.push(format!("{name}: {} errors", run.errors));
                    }
                    rounds.rps[i].push(run.rps);
                    rounds.ratios[i].push(run.rps / direct);
                }
                Err(e) => rounds.errors.push(format!("{name}: {e}")),
            }
        }
    }
    rounds
}

/// Each server's median ratio, as a figure shows it.
fn ratios_shown<'a>(
    servers: &[(&'a str, &str)],
    medians: &[Option<f64>],
) -> Vec<(&'a str, String)> {
    servers
        .iter()
        .zip(medians)
        .map(|((n, _), m)| (*n, m.map_or("-".into(), |m| format!("{m:.2}"))))
        .collect()
}

/// `, 3 failed`; nothing when none failed.
fn failed_suffix(failed: usize) -> String {
    if failed > 0 {
        format!(", {failed} failed")
    } else {
        String::new()
    }
}

/// Latencies in ms, sorted; p50 and max.
fn p50_max(mut ms: Vec<f64>) -> (f64, f64) {
    ms.sort_by(f64::total_cmp);
    let p50 = ms.get(ms.len() / 2).copied().unwrap_or_default();
    (p50, ms.last().copied().unwrap_or_default())
}

impl Cdn {
    /// The cache directory of `cluster`'s pod, seen from outside its sandbox (through its
    /// nginx's /proc root).
    fn cache_dir(&self, cluster: &str) -> Option<PathBuf> {
        let pod = self.pods.get(cluster)?;
        let (pid, _) = pod
            .nginx
            .processes()
            .into_iter()
            .find(|(_, c)| c.contains("nginx"))?;
        Some(PathBuf::from(format!("/proc/{pid}/root/var/cache/nginx")))
    }

    /// Rows 20 to 26: the generated configuration beside Varnish and Traffic Server.
    pub(super) fn rows_peers(&mut self, setup: &Setup) -> Vec<Figure> {
        let wanted: Vec<&str> = IDS.iter().copied().filter(|id| runs(setup, id)).collect();
        let not_measured = |why: &str| -> Vec<Figure> {
            ROWS.iter()
                .filter(|(r, _, _)| wanted.iter().any(|id| r.starts_with(id)))
                .map(|(id, _, _)| figure(id, format!("not measured: {why}"), None, Value::Null))
                .collect()
        };
        if !setup.isolated {
            // The peers listen on port 80 of addresses the benchmark's own namespace gives it.
            return not_measured("no network namespace of its own (run as root)");
        }
        if !setup.has_wrk {
            return not_measured("no wrk");
        }
        let peers = match Peers::start(&self.dir.join("peers")) {
            Ok(peers) => peers,
            Err(e) => return not_measured(&e),
        };
        eprintln!("dataplane:   peers: {}, {}", peers.names[0], peers.names[1]);
        type Row = fn(&mut Cdn, &Setup, &Peers) -> Vec<Figure>;
        let rows: [(&str, Row); 7] = [
            ("20", |c, s, p| c.row20_hits(s, p)),
            ("21", |c, _, p| c.row21_cold_miss(p)),
            ("22", |c, _, p| c.row22_concurrent_misses(p)),
            ("23", |c, s, p| c.row23_zipf(s, p)),
            ("24", |c, _, p| c.row24_stale_on_hang(p)),
            ("25", |c, _, p| c.row25_uncacheable(p)),
            ("26", |c, s, p| c.row26_two_tiers(s, p)),
        ];
        let mut figures = Vec::new();
        for (id, row) in rows {
            if wanted.contains(&id) {
                eprintln!("dataplane:   row {id}");
                figures.extend(row(self, setup, &peers));
            }
        }
        figures
    }

    /// Row 20: cached objects of 1 KiB, 1 MiB and 4 MiB, `wrk -t1 -c50` of nginx serving the
    /// file, then of each one-tier server, in turn, `max(--wrk-rounds, 3)` rounds; per server
    /// the median of its rounds' ratios to nginx direct, and the generated cache's to the best
    /// peer.
    fn row20_hits(&mut self, setup: &Setup, peers: &Peers) -> Vec<Figure> {
        let objects = [
            ("20a", "/obj/p20", "/1k.bin", Some(0.95)),
            ("20b", "/mib/p20", "/1m.bin", Some(0.92)),
            ("20c", "/m4/p20", "/4m.bin", None),
        ];
        let servers = peers.one_tier();
        let mut figures = Vec::new();
        for (id, path, file, target) in objects {
            for (_, addr) in servers {
                for _ in 0..2 {
                    let _ = get_from(addr, path);
                }
            }
            let hit = get_from(GENERATED, path)
                .is_ok_and(|r| r.header(CACHE_STATUS_HEADER) == Some("HIT"));
            let Rounds {
                direct,
                rps,
                ratios,
                errors,
            } = interleaved(setup, file, &servers, path);
            let medians: Vec<Option<f64>> = ratios.iter().map(|r| median(r)).collect();
            let best_peer = medians[1..]
                .iter()
                .flatten()
                .copied()
                .fold(None, |b: Option<f64>, r| Some(b.map_or(r, |b| b.max(r))));
            let generated = medians[0];
            let shown = match (generated, median(&direct)) {
                (Some(g), Some(d)) => format!(
                    "{} (direct {d:.0} req/s); generated / best peer {}{}{}",
                    per_server(&ratios_shown(&servers, &medians)),
                    best_peer.map_or("-".into(), |b| format!("{:.2}", g / b)),
                    if hit { "" } else { ", not a HIT" },
                    if errors.is_empty() { "" } else { ", errors" },
                ),
                _ => format!("not measured: {}", errors.join("; ")),
            };
            // The target: the ratio to nginx direct, and at least the best peer's.
            let met = target.and_then(|t| Some(generated? >= t && generated? >= best_peer?));
            figures.push(figure(
                id,
                shown,
                met,
                json!({
                    "direct_rps": direct,
                    "servers": servers.iter().map(|(n, _)| n).collect::<Vec<_>>(),
                    "rps": rps,
                    "ratios_by_round": ratios,
                    "median_ratios": medians,
                    "generated_over_best_peer": generated.zip(best_peer).map(|(g, b)| g / b),
                    "generated_hit": hit,
                    "errors": errors,
                    "wrk_seconds": setup.wrk_seconds,
                }),
            ));
        }
        figures
    }

    /// Row 21: a cold 1 MiB object asked of each one-tier server: time to its last byte, and
    /// bytes the origin sent for it.
    fn row21_cold_miss(&mut self, peers: &Peers) -> Vec<Figure> {
        let mut values = Vec::new();
        let mut data = Vec::new();
        for (i, (name, addr)) in peers.one_tier().iter().enumerate() {
            let path = format!("/mib/p21-{i}");
            let mark = self.log.mark();
            let r = get_from(addr, &path);
            let entries = self.log.settle(mark, &path, Duration::from_millis(300));
            let origin: u64 = entries.iter().map(|e| e.bytes).sum();
            let (ms, ok) = match &r {
                Ok(r) => (
                    r.elapsed.as_secs_f64() * 1000.0,
                    r.status == 200 && r.body.len() == 1 << 20,
                ),
                Err(_) => (f64::NAN, false),
            };
            values.push((
                *name,
                format!(
                    "{ms:.1} ms ({} from origin{})",
                    bytes(origin),
                    if ok { "" } else { ", FAILED" }
                ),
            ));
            data.push(json!({"server": name, "ms": ms, "origin_bytes": origin, "ok": ok}));
        }
        vec![figure("21", per_server(&values), None, json!(data))]
    }

    /// Row 22: 200 concurrent misses of one slow object (64 KiB at 128 KiB/s: 0.5 s) per
    /// one-tier server, in turn: origin requests, p50 and slowest.
    fn row22_concurrent_misses(&mut self, peers: &Peers) -> Vec<Figure> {
        self.herd_row(peers, "22", "/slow/p22", &[], |generated| {
            generated.origin_requests == 1
        })
    }

    /// The figure `id` of [`Self::herds`] of `prefix`, its target `met` by the generated cache.
    fn herd_row(
        &mut self,
        peers: &Peers,
        id: &str,
        prefix: &str,
        headers: &[(&str, &str)],
        met: impl Fn(&Herd) -> bool,
    ) -> Vec<Figure> {
        let herds = self.herds(peers, prefix, headers);
        vec![figure(
            id,
            per_server(&herds.iter().map(Herd::shown).collect::<Vec<_>>()),
            herds.first().map(met),
            json!(herds.iter().map(Herd::to_json).collect::<Vec<_>>()),
        )]
    }

    /// 200 concurrent requests for `PREFIX-I` of each one-tier server `I`, in turn, with
    /// `headers` beside the Host.
    fn herds<'p>(
        &mut self,
        peers: &'p Peers,
        prefix: &str,
        headers: &[(&str, &str)],
    ) -> Vec<Herd<'p>> {
        let mut herds = Vec::new();
        let mut sent = vec![("Host", HOST)];
        sent.extend_from_slice(headers);
        for (i, (name, addr)) in peers.one_tier().into_iter().enumerate() {
            let path = format!("{prefix}-{i}");
            let mark = self.log.mark();
            let results = parallel(200, 200, |_| {
                let t = Instant::now();
                let r = Client::once(addr, "GET", &path, &sent);
                (r, t.elapsed())
            });
            let entries = self.log.settle(mark, &path, Duration::from_millis(500));
            let (p50_ms, max_ms) = p50_max(
                results
                    .iter()
                    .map(|(_, t)| t.as_secs_f64() * 1000.0)
                    .collect(),
            );
            herds.push(Herd {
                name,
                origin_requests: entries.len(),
                p50_ms,
                max_ms,
                failures: Failures::of(results.into_iter().map(|(r, _)| r), 200),
            });
        }
        herds
    }

    /// Row 23: a Zipf workload over `ZIPF_OBJECTS` objects of 0.5 to 2 MiB, every server's
    /// cache room a tenth of the set (the generated cache rendered with that `cache.size`: its
    /// pods replaced, empty): `ZIPF_WARM` requests, then `ZIPF_MEASURED` measured (4 client
    /// threads, keep-alive); the request hit ratio (1 - the origin's fetches of an object, a
    /// whole object or its first slice, per request) and the origin's bytes per byte served.
    fn row23_zipf(&mut self, setup: &Setup, peers: &Peers) -> Vec<Figure> {
        let room = format!("size: {}m", peers.room_mib);
        match render(
            &self.binary,
            &self.dir,
            "topology-zipf.yaml",
            Some(&room),
            false,
            false,
        ) {
            Ok(desired) => {
                self.apply(setup, desired);
            }
            Err(e) => {
                return vec![figure(
                    "23",
                    format!("not measured: {e}"),
                    None,
                    Value::Null,
                )];
            }
        }
        let sequence = zipf_sequence(ZIPF_WARM + ZIPF_MEASURED);
        let mut values = Vec::new();
        let mut data = Vec::new();
        let mut ratios = Vec::new();
        let mut generated_peak = None;
        for (i, (name, addr)) in peers.one_tier().iter().enumerate() {
            let url = |rank: usize| format!("/z/{i}/{rank}-{}", zipf_class(rank));
            let run = |ranks: &[usize]| -> (u64, usize) {
                let next = AtomicUsize::new(0);
                let served = AtomicUsize::new(0);
                let failed = AtomicUsize::new(0);
                std::thread::scope(|s| {
                    for _ in 0..4 {
                        s.spawn(|| {
                            let mut client = Client::new(addr);
                            loop {
                                let n = next.fetch_add(1, Ordering::Relaxed);
                                let Some(&rank) = ranks.get(n) else { break };
                                match client.get(&url(rank)) {
                                    Ok(r) if r.status == 200 => {
                                        served.fetch_add(r.body.len(), Ordering::Relaxed);
                                    }
                                    _ => {
                                        failed.fetch_add(1, Ordering::Relaxed);
                                    }
                                }
                            }
                        });
                    }
                });
                (served.into_inner() as u64, failed.into_inner())
            };
            // The generated cache's files, seen from inside its pod, as it grows: nginx keeps
            // `max_size` with a cache manager that looks at the size at most every 10 s.
            let cache_dir = (i == 0).then(|| self.cache_dir("cache-1")).flatten();
            let peak = AtomicUsize::new(0);
            let done = std::sync::atomic::AtomicBool::new(false);
            let (served, failed, seconds, mark) = std::thread::scope(|s| {
                if let Some(dir) = &cache_dir {
                    s.spawn(|| {
                        while !done.load(Ordering::Relaxed) {
                            peak.fetch_max(disk_usage(dir) as usize, Ordering::Relaxed);
                            std::thread::sleep(Duration::from_millis(200));
                        }
                    });
                }
                run(&sequence[..ZIPF_WARM]);
                let mark = self.log.mark();
                let started = Instant::now();
                let (served, failed) = run(&sequence[ZIPF_WARM..]);
                let seconds = started.elapsed().as_secs_f64();
                done.store(true, Ordering::Relaxed);
                (served, failed, seconds, mark)
            });
            let peak_mib = cache_dir
                .is_some()
                .then(|| (peak.into_inner() >> 20) as u64);
            let entries = self
                .log
                .settle(mark, &format!("/z/{i}/"), Duration::from_millis(500));
            let origin: u64 = entries.iter().map(|e| e.bytes).sum();
            // A whole object, or the first slice of one: a fetch of an object.
            let fetches = entries
                .iter()
                .filter(|e| e.range.is_empty() || e.range == "-" || e.range.starts_with("bytes=0-"))
                .count();
            let hit_ratio = 1.0 - fetches as f64 / ZIPF_MEASURED as f64;
            let per_byte = origin as f64 / served.max(1) as f64;
            ratios.push(hit_ratio);
            if i == 0 {
                generated_peak = peak_mib;
            }
            values.push((
                *name,
                format!(
                    "hits {:.1} %, origin {per_byte:.3} B/B{}{}",
                    hit_ratio * 100.0,
                    peak_mib.map_or(String::new(), |p| format!(", files up to {p} MiB")),
                    failed_suffix(failed)
                ),
            ));
            data.push(
                json!({"server": name, "hit_ratio": hit_ratio, "origin_bytes": origin,
                "served_bytes": served, "origin_per_served_byte": per_byte, "fetches": fetches,
                "failed": failed, "seconds": seconds, "peak_cache_mib": peak_mib}),
            );
        }
        // Back to the topology of the other rows (new pods: empty caches).
        if let Ok(desired) = render(&self.binary, &self.dir, "topology.yaml", None, false, false) {
            self.apply(setup, desired);
        }
        let best_peer = ratios[1..].iter().copied().fold(f64::MIN, f64::max);
        // The same room for every server: a cache that held more than its pod's volume (a
        // quarter over `max_size`, where the kubelet would evict the pod) had more room.
        let volume = build::cache_volume_mib(&format!("{}m", peers.room_mib));
        let within_room = generated_peak.is_some_and(|p| p <= volume);
        vec![figure(
            "23",
            format!(
                "{}; room {} MiB each (the generated pod's volume {volume} MiB), {ZIPF_OBJECTS} \
                 objects, s = {ZIPF_S}{}",
                per_server(&values),
                peers.room_mib,
                if within_room {
                    ""
                } else {
                    "; generated: more room than the others, not comparable"
                }
            ),
            Some(within_room && ratios[0] >= best_peer),
            json!({"servers": data, "room_mib": peers.room_mib, "objects": ZIPF_OBJECTS,
                "s": ZIPF_S, "warm": ZIPF_WARM, "measured": ZIPF_MEASURED, "volume_mib": volume}),
        )]
    }

    /// Row 24: per one-tier server, 10 manifests (`.m3u8`, which the generated cache keeps whole
    /// and refreshes in the background) and 10 other objects (kept by slices), each with a
    /// lifetime of 1 s (`Cache-Control: max-age=1`), cached, expired, then the origin hung
    /// (SIGSTOP) for 15 s: each object asked twice (the 20 at once, then the 20 at once again),
    /// every server at the same time; per server and kind the slowest answer and how many took
    /// over 0.5 s (24a manifests, 24b the others).
    fn row24_stale_on_hang(&mut self, peers: &Peers) -> Vec<Figure> {
        let servers = peers.one_tier();
        const KINDS: [(&str, &str); 2] = [("24a", ".m3u8"), ("24b", "")];
        let paths = |i: usize| -> Vec<String> {
            KINDS
                .iter()
                .flat_map(|(_, ext)| (0..10).map(move |k| format!("/short/p24-{i}-{k}{ext}")))
                .collect()
        };
        for (i, (_, addr)) in servers.iter().enumerate() {
            for path in paths(i) {
                for _ in 0..2 {
                    let _ = get_from(addr, &path);
                }
            }
        }
        std::thread::sleep(Duration::from_millis(2500));
        self.origin.signal_all(libc::SIGSTOP);
        let hung = Instant::now();
        // Per server, per path, its two answers: (answered 200, seconds).
        let results: Vec<Vec<(String, bool, f64)>> = std::thread::scope(|s| {
            let waiting: Vec<_> = servers
                .iter()
                .enumerate()
                .map(|(i, (_, addr))| {
                    let paths = paths(i);
                    s.spawn(move || {
                        let mut all = Vec::new();
                        for _ in 0..2 {
                            all.extend(parallel(paths.len(), paths.len(), |k| {
                                let t = Instant::now();
                                let r = get_from(addr, &paths[k]);
                                (
                                    paths[k].clone(),
                                    r.is_ok_and(|r| r.status == 200),
                                    t.elapsed().as_secs_f64(),
                                )
                            }));
                        }
                        all
                    })
                })
                .collect();
            sleep_until(hung + Duration::from_secs(15));
            self.origin.signal_all(libc::SIGCONT);
            waiting
                .into_iter()
                .map(|w| w.join().expect("a row 24 thread"))
                .collect()
        });
        KINDS
            .iter()
            .map(|&(id, ext)| {
                let manifests = !ext.is_empty();
                let of_kind = |answers: &[(String, bool, f64)]| -> Vec<(bool, f64)> {
                    answers
                        .iter()
                        .filter(|a| a.0.ends_with(".m3u8") == manifests)
                        .map(|a| (a.1, a.2))
                        .collect()
                };
                let mut values = Vec::new();
                let mut data = Vec::new();
                for ((name, _), answers) in servers.iter().zip(&results) {
                    let answers = of_kind(answers);
                    let slowest = answers.iter().map(|a| a.1).fold(0.0, f64::max);
                    let slow = answers.iter().filter(|a| a.1 > 0.5).count();
                    let failed = answers.iter().filter(|a| !a.0).count();
                    values.push((
                        *name,
                        format!(
                            "slowest {slowest:.2} s, {slow}/{} over 0.5 s{}",
                            answers.len(),
                            failed_suffix(failed)
                        ),
                    ));
                    data.push(json!({"server": name, "slowest_s": slowest,
                        "over_half_second": slow, "failed": failed,
                        "seconds": answers.iter().map(|a| a.1).collect::<Vec<_>>()}));
                }
                let generated = of_kind(&results[0]);
                figure(
                    id,
                    per_server(&values),
                    Some(generated.iter().all(|a| a.0 && a.1 <= 0.5)),
                    json!(data),
                )
            })
            .collect()
    }

    /// Row 25: 200 concurrent requests for an object the origin marks `no-cache`, per one-tier
    /// server in turn: p50, origin requests.
    fn row25_uncacheable(&mut self, peers: &Peers) -> Vec<Figure> {
        let mut figures = self.herd_row(peers, "25", "/nocache/p25", &[], |generated| {
            generated.p50_ms <= 200.0
        });
        // 25b: the same for a cacheable object asked with credentials, which a shared cache
        // must not answer from what it stored for another request (RFC 9111, 3.5).
        figures.extend(self.herd_row(
            peers,
            "25b",
            "/obj/p25b",
            &[("Authorization", "Bearer viewer")],
            |generated| generated.p50_ms <= 200.0 && generated.origin_requests == 200,
        ));
        figures
    }

    /// Row 26: a cached 1 KiB object through two tiers (the balancer over the caches; Varnish
    /// over Varnish; Traffic Server over Traffic Server), as row 20 measures one.
    fn row26_two_tiers(&mut self, setup: &Setup, peers: &Peers) -> Vec<Figure> {
        let path = "/obj/p26";
        let servers = [
            ("generated", EDGE),
            (peers.names[0].as_str(), peers.varnish_front.addr),
            (peers.names[1].as_str(), peers.ats_front.addr),
        ];
        for (_, addr) in servers {
            for _ in 0..3 {
                let _ = get_from(addr, path);
            }
        }
        let Rounds {
            direct,
            ratios,
            errors,
            ..
        } = interleaved(setup, "/1k.bin", &servers, path);
        let medians: Vec<Option<f64>> = ratios.iter().map(|r| median(r)).collect();
        let shown = format!(
            "{} (direct {:.0} req/s){}",
            per_server(&ratios_shown(&servers, &medians)),
            median(&direct).unwrap_or_default(),
            if errors.is_empty() {
                String::new()
            } else {
                format!(", errors: {}", errors.join("; "))
            }
        );
        vec![figure(
            "26",
            shown,
            None,
            json!({"servers": servers.iter().map(|(n, _)| n).collect::<Vec<_>>(),
                "direct_rps": direct, "ratios_by_round": ratios, "median_ratios": medians,
                "errors": errors}),
        )]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_replaced_in_place_or_added() {
        let records = "# a comment\nCONFIG proxy.config.a INT 1\nCONFIG proxy.config.ab INT 2\n";
        let set = set_records(
            records,
            &[
                ("proxy.config.a", "INT 5".into()),
                ("proxy.config.c", "STRING x".into()),
            ],
        );
        assert_eq!(
            set,
            "# a comment\nCONFIG proxy.config.a INT 5\nCONFIG proxy.config.ab INT 2\n\
             CONFIG proxy.config.c STRING x\n"
        );
    }

    #[test]
    fn the_zipf_requests_are_the_same_for_every_server_and_follow_the_law() {
        let a = zipf_sequence(20_000);
        assert_eq!(a, zipf_sequence(20_000));
        let count = |rank: usize| a.iter().filter(|&&r| r == rank).count() as f64;
        // P(rank k) = (1/k) / H(2000), H(2000) ≈ 8.18: the first about 12 %, the second half of it.
        let first = count(0) / a.len() as f64;
        assert!((0.11..0.135).contains(&first), "{first}");
        let half = count(1) / count(0);
        assert!((0.42..0.58).contains(&half), "{half}");
        assert!(a.iter().all(|&r| r < ZIPF_OBJECTS));
    }

    #[test]
    fn the_zipf_set_spans_half_a_mebibyte_to_two_and_the_room_is_a_tenth() {
        assert_eq!(zipf_class_bytes(0), 512 << 10);
        assert_eq!(zipf_class_bytes(ZIPF_CLASSES - 1), 1952 << 10);
        let classes: BTreeSet<usize> = (0..ZIPF_OBJECTS).map(zipf_class).collect();
        assert_eq!(classes.len(), ZIPF_CLASSES);
        let set_mib = (0..ZIPF_OBJECTS)
            .map(|r| zipf_class_bytes(zipf_class(r)) as u64)
            .sum::<u64>()
            >> 20;
        assert_eq!(zipf_room_mib(), set_mib / 10);
    }
}
