//! Cached objects while the origin fails: after 3 quick 503s (row 4), during a 503 a second (5),
//! while it hangs (6). `run_rows` gives the balancer a fresh pod after each.

use serde_json::json;
use std::time::{Duration, Instant};

use crate::cdn::Cdn;
use crate::report::Figure;
use crate::traffic::{get_once, segment, warm, Failures};
use crate::util::{parallel, sleep_until};

impl Cdn {
    /// Row 4: 20 segments cached, then 3 quick origin 503s through the balancer, then the 20
    /// segments again: failed requests.
    pub(super) fn row4_quick_errors(&mut self) -> Vec<Figure> {
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
    pub(super) fn row5_steady_errors(&mut self) -> Vec<Figure> {
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
    pub(super) fn row6_hung_origin(&mut self) -> Vec<Figure> {
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
}
