//! Misses beside the peers: a cold 1 MiB miss (row 21), 200 concurrent misses of a slow object
//! (22), 200 concurrent requests that no cache may answer from what it stored (25, 25b).

use serde_json::{json, Value};
use std::time::{Duration, Instant};

use super::servers::Peers;
use crate::cdn::Cdn;
use crate::client::Client;
use crate::lab::HOST;
use crate::report::{figure, Figure};
use crate::traffic::{get_from, Failures};
use crate::util::{bytes, parallel, per_server};

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

/// Latencies in ms, sorted; p50 and max.
fn p50_max(mut ms: Vec<f64>) -> (f64, f64) {
    ms.sort_by(f64::total_cmp);
    let p50 = ms.get(ms.len() / 2).copied().unwrap_or_default();
    (p50, ms.last().copied().unwrap_or_default())
}

impl Cdn {
    /// Row 21: a cold 1 MiB object asked of each one-tier server: time to its last byte, and
    /// bytes the origin sent for it.
    pub(super) fn row21_cold_miss(&mut self, peers: &Peers) -> Vec<Figure> {
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
    pub(super) fn row22_concurrent_misses(&mut self, peers: &Peers) -> Vec<Figure> {
        self.herd_row(peers, "22", "/slow/p22", &[], |generated| {
            generated.origin_requests == 1
        })
    }

    /// Row 25: 200 concurrent requests for an object the origin marks `no-cache`, per one-tier
    /// server in turn: p50, origin requests.
    pub(super) fn row25_uncacheable(&mut self, peers: &Peers) -> Vec<Figure> {
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
}
