//! Small helpers the rows share: files written as the pods read them, waiting, statistics, work
//! on threads that start together, and the text of figures. It uses no other file of the benchmark.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

pub(crate) fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| b'a' + (i % 26) as u8).collect()
}

pub(crate) fn chmod(path: &Path, mode: u32) {
    let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode));
}

/// Replaces `path` with `text` in one rename, as a publisher would.
pub(crate) fn write_atomically(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).expect("writing a manifest");
    chmod(&tmp, 0o644);
    std::fs::rename(&tmp, path).expect("renaming a manifest");
}

pub(crate) fn count(text: &str, needle: &str) -> usize {
    text.matches(needle).count()
}

pub(crate) fn wait_for(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    done()
}

pub(crate) fn sleep_until(t: Instant) {
    let now = Instant::now();
    if t > now {
        std::thread::sleep(t - now);
    }
}

pub(crate) fn median(values: &[f64]) -> Option<f64> {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => None,
        n if n % 2 == 1 => Some(v[n / 2]),
        n => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// `1 request`, `15 requests`.
pub(crate) fn requests(n: usize) -> String {
    format!("{n} request{}", if n == 1 { "" } else { "s" })
}

pub(crate) fn bytes(n: u64) -> String {
    if n >= 1 << 20 {
        format!("{:.2} MiB", n as f64 / (1 << 20) as f64)
    } else if n >= 1 << 10 {
        format!("{:.1} KiB", n as f64 / 1024.0)
    } else {
        format!("{n} B")
    }
}

/// Runs `f(i)` for each i below `n` on `threads` threads that start together; results by i.
pub(crate) fn parallel<T: Send>(n: usize, threads: usize, f: impl Fn(usize) -> T + Sync) -> Vec<T> {
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

/// The first line of a message.
pub(crate) fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or_default()
}

/// The sum of the series of `name` whose labels include `labels` in a Prometheus exposition.
pub(crate) fn metric_sum(text: &str, name: &str, labels: &str) -> f64 {
    cdn_operator_testkit::metric_sum(text, name, labels).unwrap_or(0.0)
}

/// A figure's text for one value per server: `generated 0.61 · Varnish 7.1.1 0.82 · …`.
pub(crate) fn per_server(values: &[(&str, String)]) -> String {
    values
        .iter()
        .map(|(name, v)| format!("{name} {v}"))
        .collect::<Vec<_>>()
        .join(" · ")
}

/// `, 3 failed`; nothing when none failed.
pub(crate) fn failed_suffix(failed: usize) -> String {
    if failed > 0 {
        format!(", {failed} failed")
    } else {
        String::new()
    }
}
