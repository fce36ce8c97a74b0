//! What reaches the origin: its connections for sequential misses (row 1), the requests of
//! uncacheable answers asked at once (9), of a missing object asked again and again (10), of
//! concurrent misses of one object (12), and the bytes of a HEAD (13).

use serde_json::json;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use crate::cdn::Cdn;
use crate::client::Client;
use crate::lab::{passive_opens, Setup, EDGE, HOST};
use crate::origin::origin_accepts;
use crate::report::{figure, Figure};
use crate::traffic::{get_once, Failures};
use crate::util::{bytes, parallel};

impl Cdn {
    /// Row 1: 500 sequential misses (500 distinct 1 KiB objects) over ONE keep-alive client
    /// connection to the balancer. Origin connections: stub_status's accepted count, before and
    /// after. The balancer's connections to the caches: the kernel's PassiveOpens in the benchmark's
    /// own network namespace over the loop, less the client's and the origin's connections.
    pub(super) fn row1_connections(&mut self, setup: &Setup) -> Vec<Figure> {
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

    /// Row 9: 200 concurrent requests (each on its own connection) for one missing object, then
    /// for one `Cache-Control: no-cache` object: median latency, origin requests.
    pub(super) fn row9_uncacheable(&mut self) -> Vec<Figure> {
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
    pub(super) fn row10_missing(&mut self) -> Vec<Figure> {
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

    /// Row 12: 200 concurrent misses (each on its own connection) for one slow object (64 KiB sent
    /// at 128 KiB/s, so the misses overlap): origin requests.
    pub(super) fn row12_collapsed_misses(&mut self) -> Vec<Figure> {
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
    pub(super) fn row13_head(&mut self) -> Vec<Figure> {
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
}
