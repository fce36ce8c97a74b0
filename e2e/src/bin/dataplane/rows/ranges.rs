//! Ranges of a cold 50 MB object, which the caches fetch by slices: one (row 7), eight at once (8).

use serde_json::json;
use std::time::Duration;

use crate::cdn::Cdn;
use crate::client::Client;
use crate::lab::{EDGE, HOST};
use crate::origin::BIG;
use crate::report::{figure, Figure};
use crate::util::{bytes, parallel, requests};

/// A range of it: 1 MB.
const RANGE: u64 = 1_000_000;
/// The caches' slice (`slice 1m`), and what a slice's response may carry in headers.
const SLICE: u64 = 1 << 20;
const SLICE_HEADERS: u64 = 1024;

impl Cdn {
    /// Row 7: the last 1 MB of a cold 50 MB object: time to its first byte, bytes the origin sent.
    pub(super) fn row7_cold_range(&mut self) -> Vec<Figure> {
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
    pub(super) fn row8_concurrent_ranges(&mut self) -> Vec<Figure> {
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
}
