//! A canary for the benchmark: a fixed task, timed on its own thread's CPU clock every half
//! second, tells how fast the machine runs anything at a moment against its idle speed. On a
//! machine the API server, etcd and the operator share, a CPU figure that grows may be the work
//! growing or every instruction costing more; the canary tells the two apart.
//!
//! The task: dependent loads through a 16 MiB random cycle (memory latency and TLB misses, as
//! the caches' lookups meet them) and a loop of arithmetic (the core's own speed).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How often the task runs.
pub const EVERY: Duration = Duration::from_millis(500);
/// The cycle the loads go through: larger than the L2 caches, as the operator's heap is.
const CYCLE_BYTES: usize = 16 << 20;
const LOADS: usize = 20_000;
const ROUNDS: usize = 1_000_000;

/// The task's CPU time, in microseconds: its loads, its arithmetic.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Cost {
    pub loads_us: f64,
    pub arithmetic_us: f64,
}

impl Cost {
    /// This cost against `idle`'s, part by part.
    pub fn against(self, idle: Cost) -> Cost {
        Cost {
            loads_us: self.loads_us / idle.loads_us,
            arithmetic_us: self.arithmetic_us / idle.arithmetic_us,
        }
    }
}

/// The running canary; stops when dropped (its thread ends at its next wake-up, unwaited).
pub struct Canary {
    samples: Arc<Mutex<Vec<(Instant, Cost)>>>,
    stop: Arc<AtomicBool>,
}

impl Canary {
    /// Starts the task on a thread of its own.
    pub fn start() -> Canary {
        let samples = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        {
            let (samples, stop) = (samples.clone(), stop.clone());
            std::thread::spawn(move || {
                let cycle = random_cycle(CYCLE_BYTES / std::mem::size_of::<u32>());
                let mut at = 0u32;
                while !stop.load(Ordering::Relaxed) {
                    let (cost, next) = task(&cycle, at);
                    at = next;
                    samples.lock().unwrap().push((Instant::now(), cost));
                    std::thread::sleep(EVERY);
                }
            });
        }
        Canary { samples, stop }
    }

    /// The median cost of the tasks that ended within `from..to`; None if none did.
    pub fn cost_between(&self, from: Instant, to: Instant) -> Option<Cost> {
        let samples = self.samples.lock().unwrap();
        let within: Vec<Cost> = samples
            .iter()
            .filter(|(at, _)| (from..to).contains(at))
            .map(|(_, cost)| *cost)
            .collect();
        let median = |part: fn(&Cost) -> f64| {
            let mut values: Vec<f64> = within.iter().map(part).collect();
            values.sort_by(f64::total_cmp);
            values[values.len() / 2]
        };
        (!within.is_empty()).then(|| Cost {
            loads_us: median(|c| c.loads_us),
            arithmetic_us: median(|c| c.arithmetic_us),
        })
    }

    /// How many tasks ended since `from`.
    pub fn taken_since(&self, from: Instant) -> usize {
        let samples = self.samples.lock().unwrap();
        samples.iter().filter(|(at, _)| *at >= from).count()
    }
}

impl Drop for Canary {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// One run of the task from `at` in `cycle`; returns its cost and where the loads stopped.
fn task(cycle: &[u32], mut at: u32) -> (Cost, u32) {
    let start = thread_cpu();
    for _ in 0..LOADS {
        at = cycle[at as usize];
    }
    let loaded = thread_cpu();
    let mut x = 88_172_645_463_325_252u64;
    for _ in 0..ROUNDS {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
    }
    std::hint::black_box(x);
    let done = thread_cpu();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let cost = Cost {
        loads_us: us(loaded - start),
        arithmetic_us: us(done - loaded),
    };
    (cost, std::hint::black_box(at))
}

/// A single cycle through `n` slots in random order (Sattolo's shuffle), so each load depends on
/// the one before and lands anywhere.
fn random_cycle(n: usize) -> Vec<u32> {
    let mut order: Vec<u32> = (0..n as u32).collect();
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    for i in (1..n).rev() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        order.swap(i, (state % i as u64) as usize);
    }
    let mut cycle = vec![0u32; n];
    for i in 0..n {
        cycle[order[i] as usize] = order[(i + 1) % n];
    }
    cycle
}

/// The calling thread's CPU time.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for the call to fill.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "the thread CPU clock is always there on Linux");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cycle_visits_every_slot_once() {
        let cycle = random_cycle(1000);
        let mut at = 0u32;
        let mut seen = vec![false; 1000];
        for _ in 0..1000 {
            assert!(!seen[at as usize], "slot {at} visited twice");
            seen[at as usize] = true;
            at = cycle[at as usize];
        }
        assert_eq!(at, 0, "back where it started");
        assert!(seen.iter().all(|s| *s));
    }

    #[test]
    fn the_canary_times_its_task_on_its_thread_clock() {
        let start = Instant::now();
        let canary = Canary::start();
        // Building the cycle takes a while in a debug build; then a task each half second.
        let deadline = Instant::now() + Duration::from_secs(60);
        while canary.taken_since(start) < 2 && Instant::now() < deadline {
            std::thread::sleep(EVERY / 5);
        }
        assert!(canary.taken_since(start) >= 2, "two tasks within a minute");
        let cost = canary
            .cost_between(start, Instant::now())
            .expect("tasks taken");
        // A million rounds take a few milliseconds of CPU, not the half second slept.
        assert!(cost.arithmetic_us > 100.0, "{cost:?}");
        assert!(cost.arithmetic_us < 400_000.0, "{cost:?}");
        assert!(cost.loads_us > 0.0, "{cost:?}");
        let against = cost.against(cost);
        assert_eq!((against.loads_us, against.arithmetic_us), (1.0, 1.0));
        assert_eq!(canary.cost_between(start, start), None);
    }
}
