//! Expired objects while the origin hangs 15 s, beside the peers (row 24): manifests, which the
//! generated cache refreshes in the background, and other objects.

use serde_json::json;
use std::time::{Duration, Instant};

use super::servers::Peers;
use crate::cdn::Cdn;
use crate::report::{figure, Figure};
use crate::traffic::get_from;
use crate::util::{failed_suffix, parallel, per_server, sleep_until};

impl Cdn {
    /// Row 24: per one-tier server, 10 manifests (`.m3u8`, which the generated cache keeps whole
    /// and refreshes in the background) and 10 other objects (kept by slices), each with a
    /// lifetime of 1 s (`Cache-Control: max-age=1`), cached, expired, then the origin hung
    /// (SIGSTOP) for 15 s: each object asked twice (the 20 at once, then the 20 at once again),
    /// every server at the same time; per server and kind the slowest answer and how many took
    /// over 0.5 s (24a manifests, 24b the others).
    pub(super) fn row24_stale_on_hang(&mut self, peers: &Peers) -> Vec<Figure> {
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
}
