//! The Zipf workload beside the peers, every cache given a tenth of the set (row 23): hit ratio,
//! the origin's bytes per byte served, and how much the generated cache's files took.

use cdn_operator::cdncluster::build;
use serde_json::{json, Value};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::servers::Peers;
use crate::cdn::Cdn;
use crate::client::Client;
use crate::lab::Setup;
use crate::pods::render;
use crate::report::{figure, Figure};
use crate::util::{failed_suffix, per_server};
use crate::zipf::{zipf_class, zipf_sequence, ZIPF_MEASURED, ZIPF_OBJECTS, ZIPF_S, ZIPF_WARM};

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

impl Cdn {
    /// Row 23: a Zipf workload over `ZIPF_OBJECTS` objects of 0.5 to 2 MiB, every server's
    /// cache room a tenth of the set (the generated cache rendered with that `cache.size`: its
    /// pods replaced, empty): `ZIPF_WARM` requests, then `ZIPF_MEASURED` measured (4 client
    /// threads, keep-alive); the request hit ratio (1 - the origin's fetches of an object, a
    /// whole object or its first slice, per request) and the origin's bytes per byte served.
    pub(super) fn row23_zipf(&mut self, setup: &Setup, peers: &Peers) -> Vec<Figure> {
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
}
