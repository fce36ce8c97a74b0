//! Starting the peers of rows 20 to 26: Varnish and Apache Traffic Server, the packages of Debian
//! stable (`scripts/install-test-deps.sh` installs them), each run as a user choosing a cache
//! would run it and given the same room:
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

use cdn_operator_testkit::process::Operator;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::client::Client;
use crate::lab::{HOST, ORIGIN};
use crate::zipf::zipf_room_mib;

/// The peers' addresses: one tier each, then a tier in front of each.
const VARNISH: &str = "127.0.0.40:80";
const ATS: &str = "127.0.0.41:80";
const VARNISH_FRONT: &str = "127.0.0.42:80";
const ATS_FRONT: &str = "127.0.0.43:80";
/// The generated cache as one tier: the pod of `cache-1`.
pub(super) const GENERATED: &str = "127.0.0.11:80";

/// How long a peer may take to answer its first request.
const START_PATIENCE: Duration = Duration::from_secs(60);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
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
    fn version(self) -> Result<String, String> {
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
    pub(super) addr: &'static str,
    process: Operator,
    /// Traffic Server's cache volume, on /dev/shm.
    _volume: Option<tempfile::TempDir>,
}

impl Peer {
    /// Starts `kind` at `addr` in front of `backend`, with `room_mib` of cache, its files in
    /// `dir`; returns once it has answered a request for a cached object (`/obj/ready`).
    fn start(
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
    pub(super) varnish_front: Peer,
    pub(super) ats_front: Peer,
    /// `Varnish 7.1.1`, `ATS 9.2.9`.
    pub(super) names: [String; 2],
    pub(super) room_mib: u64,
}

impl Peers {
    pub(super) fn start(dir: &Path) -> Result<Peers, String> {
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
    pub(super) fn one_tier(&self) -> [(&str, &str); 3] {
        [
            ("generated", GENERATED),
            (self.names[0].as_str(), self.varnish.addr),
            (self.names[1].as_str(), self.ats.addr),
        ]
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
}
