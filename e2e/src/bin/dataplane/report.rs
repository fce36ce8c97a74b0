//! The report: the lines of the table ([`ROWS`]), the figure a row measures for one of them, a
//! column's figures, and the table printed from the columns (`main` writes them as JSON too). It
//! knows no row: a row makes its figures with [`figure`], by the id of its line here.

use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// The lines of the table, in order: id, what is measured, target (`-`: none).
#[rustfmt::skip]
pub(crate) const ROWS: &[(&str, &str, &str)] = &[
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
pub(crate) struct Figure {
    pub(crate) id: &'static str,
    pub(crate) what: &'static str,
    pub(crate) target: &'static str,
    /// The table's cell.
    pub(crate) shown: String,
    /// Whether the target is met; `None` without a target.
    pub(crate) met: Option<bool>,
    /// Everything measured, for --json.
    pub(crate) data: Value,
}

/// The figure of line `id` of [`ROWS`] (which must have it).
pub(crate) fn figure(id: &str, shown: String, met: Option<bool>, data: Value) -> Figure {
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

pub(crate) struct Column {
    pub(crate) binary: PathBuf,
    pub(crate) figures: Vec<Figure>,
}

impl Column {
    pub(crate) fn to_json(&self) -> Value {
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

pub(crate) fn table(columns: &BTreeMap<&str, Column>) -> String {
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
