//! How the rows ask the CDN: requests with the benchmark's Host, through the balancer or of a
//! server named, objects warmed before a row measures them, and the failures counted among the
//! answers.

use cdn_operator::cdncluster::nginx::CACHE_STATUS_HEADER;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io;
use std::time::Duration;

use crate::client::{Client, Response};
use crate::lab::{EDGE, HOST};
use crate::report::{figure, Figure};

/// Asks for each path through the balancer (one keep-alive connection): what a row needs cached.
pub(crate) fn warm(paths: &[String]) {
    let mut client = Client::new(EDGE);
    for path in paths {
        let _ = client.get(path);
    }
}

pub(crate) fn segment(i: usize) -> String {
    format!("/seg/{i:04}.ts")
}

/// A GET of `path` through the balancer with the benchmark's Host, on a connection of its own.
/// Whether `path` through the balancer is a HIT within 5 s (asked every 100 ms).
pub(crate) fn becomes_hit(path: &str) -> bool {
    (0..50).any(|_| {
        let hit = get_once(path).is_ok_and(|r| r.header(CACHE_STATUS_HEADER) == Some("HIT"));
        if !hit {
            std::thread::sleep(Duration::from_millis(100));
        }
        hit
    })
}

pub(crate) fn get_once(path: &str) -> io::Result<Response> {
    get_from(EDGE, path)
}

/// A GET of `path` from `addr` with the benchmark's Host, on a connection of its own.
pub(crate) fn get_from(addr: &str, path: &str) -> io::Result<Response> {
    Client::once(addr, "GET", path, &[("Host", HOST)])
}

/// The response's X-Cache-Status; `-` without one, or without a response.
pub(crate) fn cache_status(r: &io::Result<Response>) -> &str {
    r.as_ref()
        .ok()
        .and_then(|r| r.header(CACHE_STATUS_HEADER))
        .unwrap_or("-")
}

/// Failed requests: an error, or another status than expected.
#[derive(Default)]
pub(crate) struct Failures {
    /// The requests checked.
    total: usize,
    pub(crate) count: usize,
    kinds: BTreeMap<String, usize>,
}

impl Failures {
    /// The failures of `responses` (taken in turn: the requests run as it is iterated).
    pub(crate) fn of(
        responses: impl IntoIterator<Item = io::Result<Response>>,
        expected: u16,
    ) -> Failures {
        let mut failures = Failures::default();
        for r in responses {
            failures.check(r, expected);
        }
        failures
    }

    pub(crate) fn check(&mut self, r: io::Result<Response>, expected: u16) {
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
    pub(crate) fn figure(&self, id: &str, note: &str, data: Value) -> Figure {
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
    pub(crate) fn suffix(&self) -> String {
        if self.count == 0 {
            String::new()
        } else {
            format!(", {} failed{}", self.count, self.detail())
        }
    }

    pub(crate) fn to_json(&self) -> Value {
        json!({ "count": self.count, "kinds": self.kinds })
    }
}
