//! The operator's CPU and memory: sampled every 2 s while it converges and fitted ([`CpuFit`]),
//! cut by stretch of CdnClusters converged ([`Stretch`]) with the machine's speed then (the
//! canary), and its use of the machine at the ends of the phases ([`Usages`]).

use crate::watch::Seen;
use cdn_operator_e2e::canary::{self, Canary, Cost};
use cdn_operator_e2e::Usage;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often the operator's CPU is sampled while it converges ([`CpuFit`]).
pub const CPU_SAMPLE_EVERY: Duration = Duration::from_secs(2);

/// The operator's CPU time and the CdnClusters converged, `seconds` after the first create.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct CpuSample {
    seconds: f64,
    cpu_seconds: f64,
    converged: usize,
}

/// One stretch of the convergence, cut by CdnClusters converged from the CPU samples: its pace,
/// the operator's CPU per CdnCluster, and how fast the machine ran then ([`canary`]: its task's
/// cost against its idle cost). Whether the CPU per CdnCluster grows with the CdnClusters held or
/// with the pace, and whether the machine slowed, shows stretch by stretch.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Stretch {
    from: usize,
    to: usize,
    per_second: f64,
    cpu_ms_per_cluster: f64,
    /// The canary's loads and arithmetic against their idle cost, when it ran in the stretch.
    canary: Option<(f64, f64)>,
    #[serde(skip)]
    seconds: (f64, f64),
}

impl Stretch {
    /// The stretches of at least `step` CdnClusters each (the last may be shorter), from the
    /// samples' boundaries.
    fn of(samples: &[CpuSample], step: usize) -> Vec<Stretch> {
        let mut stretches = Vec::new();
        let Some(mut from) = samples.first().copied() else {
            return stretches;
        };
        for (i, sample) in samples.iter().enumerate().skip(1) {
            let last = i == samples.len() - 1;
            let done = sample.converged.saturating_sub(from.converged);
            if done >= step.max(1) || (last && done > 0) {
                let seconds = sample.seconds - from.seconds;
                stretches.push(Stretch {
                    from: from.converged,
                    to: sample.converged,
                    per_second: done as f64 / seconds.max(f64::MIN_POSITIVE),
                    cpu_ms_per_cluster: (sample.cpu_seconds - from.cpu_seconds) * 1000.0
                        / done as f64,
                    canary: None,
                    seconds: (from.seconds, sample.seconds),
                });
                from = *sample;
            }
        }
        stretches
    }
}

impl std::fmt::Display for Stretch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}–{}: {:.2} ms at {:.1}/s",
            self.from, self.to, self.cpu_ms_per_cluster, self.per_second
        )?;
        if let Some((loads, arithmetic)) = self.canary {
            write!(f, " (canary {loads:.2}×/{arithmetic:.2}×)")?;
        }
        Ok(())
    }
}

/// The operator's CPU over the convergence, taken apart by least squares over the sampling
/// intervals: `cpu = per_second × length + per_cluster × CdnClusters converged` (no constant: an
/// empty interval costs nothing). A part paid per second whatever the progress makes the CPU
/// grow with the length of the run, not with the work alone: at 10,000 the server converges
/// each 1,000 more slowly than at 1,000. A cost per CdnCluster that grows as the pace falls fits
/// as a part per second too: a run with the server slowed tells them apart.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct CpuFit {
    pub per_second_ms: f64,
    per_cluster_ms: f64,
    /// The share of the intervals' CPU variance the two terms explain.
    r2: f64,
    intervals: usize,
}

impl CpuFit {
    /// None with fewer than three intervals, or when length and progress move together so
    /// closely that the two cannot be told apart.
    fn of(samples: &[CpuSample]) -> Option<CpuFit> {
        let intervals: Vec<[f64; 3]> = samples
            .windows(2)
            .map(|w| {
                [
                    w[1].seconds - w[0].seconds,
                    w[1].converged as f64 - w[0].converged as f64,
                    w[1].cpu_seconds - w[0].cpu_seconds,
                ]
            })
            .collect();
        if intervals.len() < 3 {
            return None;
        }
        let sum = |f: fn(&[f64; 3]) -> f64| intervals.iter().map(f).sum::<f64>();
        let (tt, tc, cc) = (
            sum(|i| i[0] * i[0]),
            sum(|i| i[0] * i[1]),
            sum(|i| i[1] * i[1]),
        );
        let (ty, cy) = (sum(|i| i[0] * i[2]), sum(|i| i[1] * i[2]));
        let det = tt * cc - tc * tc;
        if det <= 1e-9 * tt * cc {
            return None;
        }
        let per_second = (cc * ty - tc * cy) / det;
        let per_cluster = (tt * cy - tc * ty) / det;
        let mean = sum(|i| i[2]) / intervals.len() as f64;
        let total = sum(|i| i[2] * i[2]) - mean * mean * intervals.len() as f64;
        let residual: f64 = intervals
            .iter()
            .map(|i| (i[2] - per_second * i[0] - per_cluster * i[1]).powi(2))
            .sum();
        Some(CpuFit {
            per_second_ms: per_second * 1000.0,
            per_cluster_ms: per_cluster * 1000.0,
            r2: if total > 0.0 {
                1.0 - residual / total
            } else {
                0.0
            },
            intervals: intervals.len(),
        })
    }
}

impl std::fmt::Display for CpuFit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:.1} ms per second + {:.2} ms per CdnCluster (R² {:.2}, {} intervals)",
            self.per_second_ms, self.per_cluster_ms, self.r2, self.intervals
        )
    }
}

/// The sampling task of [`sample_cpu`], which keeps its samples until [`CpuSampling::stop`].
pub struct CpuSampling {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Vec<CpuSample>>,
}

impl CpuSampling {
    /// Stops sampling and returns the samples, the last one taken now.
    pub async fn stop(self) -> Vec<CpuSample> {
        let _ = self.stop.send(());
        self.task.await.expect("the CPU sampling task")
    }
}

/// Samples the operator's CPU and the CdnClusters converged (`seen` done) every
/// [`CPU_SAMPLE_EVERY`] from now on, and once more when stopped.
pub fn sample_cpu(pid: u32, seen: Arc<Seen>, start: Instant) -> CpuSampling {
    let (stop, mut stopped) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let mut samples = Vec::new();
        let mut every = tokio::time::interval(CPU_SAMPLE_EVERY);
        loop {
            let last = tokio::select! {
                _ = every.tick() => false,
                _ = &mut stopped => true,
            };
            samples.extend(cpu_sample(pid, &seen, start));
            if last {
                return samples;
            }
        }
    });
    CpuSampling { stop, task }
}

fn cpu_sample(pid: u32, seen: &Seen, start: Instant) -> Option<CpuSample> {
    Some(CpuSample {
        seconds: start.elapsed().as_secs_f64(),
        cpu_seconds: Usage::of(pid)?.cpu_seconds,
        converged: seen.done(),
    })
}

/// The canary's idle cost: its median over its first eight tasks from now (the operator settled,
/// nothing created yet).
pub async fn idle_cost(canary: &Canary) -> Option<Cost> {
    let idle_from = Instant::now();
    while canary.taken_since(idle_from) < 8 {
        tokio::time::sleep(canary::EVERY).await;
    }
    canary.cost_between(idle_from, Instant::now())
}

/// The operator's CPU over the convergence, from its samples: the fit, the machine's speed
/// against idle (the canary's loads and arithmetic), and the stretches with the machine's speed
/// in each.
pub struct ConvergenceCpu {
    pub samples: Vec<CpuSample>,
    pub fit: Option<CpuFit>,
    pub machine: Option<(f64, f64)>,
    pub stretches: Vec<Stretch>,
}

impl ConvergenceCpu {
    /// `samples` from `start`, converged `n` CdnClusters after `converged`; `canary`'s costs
    /// meanwhile against `idle`.
    pub fn of(
        samples: Vec<CpuSample>,
        (canary, idle): (&Canary, Option<Cost>),
        start: Instant,
        converged: Duration,
        n: usize,
    ) -> ConvergenceCpu {
        let fit = CpuFit::of(&samples);
        let at = |seconds: f64| start + Duration::from_secs_f64(seconds);
        let against_idle = |from: f64, to: f64| {
            let cost = canary.cost_between(at(from), at(to))?;
            let against = cost.against(idle?);
            Some((against.loads_us, against.arithmetic_us))
        };
        let machine = against_idle(0.0, converged.as_secs_f64());
        let stretches: Vec<Stretch> = Stretch::of(&samples, (n / 10).max(100))
            .into_iter()
            .map(|s| Stretch {
                canary: against_idle(s.seconds.0, s.seconds.1),
                ..s
            })
            .collect();
        ConvergenceCpu {
            samples,
            fit,
            machine,
            stretches,
        }
    }

    /// The part paid per second, over the whole convergence (`converged` long), in seconds.
    pub fn per_second_part(&self, converged: Duration) -> Option<f64> {
        self.fit
            .map(|f| f.per_second_ms * converged.as_secs_f64() / 1000.0)
    }
}

/// The CPU seconds between two readings of a process's use.
pub fn cpu(from: Option<Usage>, to: Option<Usage>) -> Option<f64> {
    Some(to?.cpu_seconds - from?.cpu_seconds)
}

/// The operator's use of the machine at the ends of its phases (when the CdnClusters' creation
/// starts, once converged, after the steady state, after the spec changes), and the benchmark
/// process's own until converged.
pub struct Usages {
    pub at_start: Option<Usage>,
    pub at_converged: Option<Usage>,
    pub at_steady: Option<Usage>,
    pub at_end: Option<Usage>,
    pub bench_at_start: Option<Usage>,
    pub bench_at_converged: Option<Usage>,
}

impl Usages {
    /// The benchmark process's own use now.
    pub fn myself() -> Option<Usage> {
        Usage::of(std::process::id())
    }

    /// The operator's CPU seconds in each phase: convergence, steady state, spec changes.
    pub fn cpu_by_phase(&self) -> (Option<f64>, Option<f64>, Option<f64>) {
        (
            cpu(self.at_start, self.at_converged),
            cpu(self.at_converged, self.at_steady),
            cpu(self.at_steady, self.at_end),
        )
    }

    /// The benchmark process's CPU seconds during the convergence.
    pub fn bench_cpu(&self) -> Option<f64> {
        cpu(self.bench_at_start, self.bench_at_converged)
    }

    /// The operator's context switches per CdnCluster (`n`) during the convergence: voluntary,
    /// involuntary. Each voluntary switch is a wake-up, after which the operator's data is no
    /// longer in the caches the server's processes shared meanwhile; involuntary ones are
    /// preemptions.
    pub fn switches(&self, n: usize) -> Option<(f64, f64)> {
        let (from, to) = self.at_start.zip(self.at_converged)?;
        Some((
            (to.switches.voluntary - from.switches.voluntary) as f64 / n as f64,
            (to.switches.involuntary - from.switches.involuntary) as f64 / n as f64,
        ))
    }

    /// The kernel's part during the convergence: the operator's system CPU seconds, and its minor
    /// page faults per CdnCluster (`n`): syscalls and the pages the allocator returns and touches
    /// again.
    pub fn kernel(&self, n: usize) -> Option<(f64, f64)> {
        let (from, to) = self.at_start.zip(self.at_converged)?;
        Some((
            to.system_seconds - from.system_seconds,
            (to.minor_faults - from.minor_faults) as f64 / n as f64,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Samples of an operator that spends `per_second` s each second and `per_cluster` s per
    /// CdnCluster, converging at `paces` CdnClusters per second, one interval each.
    fn samples(per_second: f64, per_cluster: f64, paces: &[usize]) -> Vec<CpuSample> {
        let mut sample = CpuSample {
            seconds: 0.0,
            cpu_seconds: 0.0,
            converged: 0,
        };
        let mut all = vec![sample];
        for &pace in paces {
            sample.seconds += 2.0;
            sample.converged += 2 * pace;
            sample.cpu_seconds += 2.0 * per_second + (2 * pace) as f64 * per_cluster;
            all.push(sample);
        }
        all
    }

    #[test]
    fn stretches_cut_the_convergence_by_cdnclusters_converged() {
        // 0.5 ms per CdnCluster at 50/s, 1 ms at 20/s.
        let mut all = samples(0.0, 0.0005, &[50, 50, 50]);
        let fast = *all.last().unwrap();
        for (k, sample) in samples(0.0, 0.001, &[20, 20, 20, 20])
            .into_iter()
            .enumerate()
            .skip(1)
        {
            all.push(CpuSample {
                seconds: fast.seconds + 2.0 * k as f64,
                cpu_seconds: fast.cpu_seconds + sample.cpu_seconds,
                converged: fast.converged + sample.converged,
            });
        }
        let stretches = Stretch::of(&all, 150);
        let cut: Vec<(usize, usize)> = stretches.iter().map(|s| (s.from, s.to)).collect();
        // At least 150 each, cut where the samples fall; the last one shorter.
        assert_eq!(cut, [(0, 200), (200, 380), (380, 460)]);
        let pace: Vec<f64> = stretches.iter().map(|s| s.per_second).collect();
        assert_eq!(pace, [50.0, 30.0, 20.0]);
        let cost = |s: &Stretch| (s.cpu_ms_per_cluster * 1000.0).round() / 1000.0;
        // The middle one holds 100 at 0.5 ms and 80 at 1 ms.
        assert_eq!(
            stretches.iter().map(cost).collect::<Vec<_>>(),
            [0.5, 0.722, 1.0]
        );
        assert_eq!(stretches[0].to_string(), "0–200: 0.50 ms at 50.0/s");
        assert!(Stretch::of(&all[..1], 150).is_empty());
    }

    #[test]
    fn the_cpu_fit_tells_a_cost_per_second_from_a_cost_per_cluster() {
        let fit = CpuFit::of(&samples(0.016, 0.0018, &[40, 35, 30, 20, 17])).unwrap();
        assert!((fit.per_second_ms - 16.0).abs() < 1e-6, "{fit}");
        assert!((fit.per_cluster_ms - 1.8).abs() < 1e-6, "{fit}");
        assert!(fit.r2 > 0.999_999, "{fit}");
        assert_eq!(fit.intervals, 5);
        // No cost per second: none is found.
        let fit = CpuFit::of(&samples(0.0, 0.0025, &[40, 10, 25])).unwrap();
        assert!(fit.per_second_ms.abs() < 1e-6, "{fit}");
        assert!((fit.per_cluster_ms - 2.5).abs() < 1e-6, "{fit}");
        // Noise lowers R².
        let mut noisy = samples(0.016, 0.0018, &[40, 35, 30, 20, 17, 25]);
        noisy[3].cpu_seconds += 0.05;
        assert!(CpuFit::of(&noisy).unwrap().r2 < 0.99);
    }

    #[test]
    fn the_cpu_fit_needs_three_intervals_whose_pace_varies() {
        assert_eq!(CpuFit::of(&samples(0.016, 0.0018, &[40, 30])), None);
        // A steady pace: a cost per second and a cost per CdnCluster look the same.
        assert_eq!(CpuFit::of(&samples(0.016, 0.0018, &[30, 30, 30, 30])), None);
        assert_eq!(CpuFit::of(&[]), None);
    }
}
