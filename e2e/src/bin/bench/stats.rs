//! The small figures every part of the benchmark is measured with: milliseconds, percentiles, and
//! the server's answers to a phase's writes ([`Answers`]). A leaf, so that the phases and the
//! report all look down to it and none back up.

use std::time::Duration;

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The server's answers to one phase's writes, as the proxy timed them.
#[derive(Debug, PartialEq, serde::Serialize)]
pub struct Answers {
    writes: usize,
    p50_ms: f64,
    p99_ms: f64,
    /// Writes in flight on average over the phase: their summed answer times over its length.
    /// Near the concurrency, the client kept the server busy; well below, it did not.
    in_flight: f64,
}

impl Answers {
    pub fn of(times: &[Duration], phase: Duration) -> Answers {
        let mut answers: Vec<f64> = times.iter().copied().map(ms).collect();
        answers.sort_by(|a, b| a.total_cmp(b));
        let busy: f64 = answers.iter().sum::<f64>() / 1000.0;
        Answers {
            writes: answers.len(),
            p50_ms: percentile(&answers, 50.0),
            p99_ms: percentile(&answers, 99.0),
            in_flight: busy / phase.as_secs_f64().max(f64::MIN_POSITIVE),
        }
    }
}

impl std::fmt::Display for Answers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} writes, {:.1} ms / {:.1} ms, {:.1} in flight",
            self.writes, self.p50_ms, self.p99_ms, self.in_flight
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_summarized_with_the_writes_in_flight() {
        let ms = |m: u64| Duration::from_millis(m);
        let times: Vec<Duration> = (1..=100).map(ms).collect();
        let answers = Answers::of(&times, Duration::from_secs(1));
        // 5,050 ms of answers over 1 s: about five writes at a time.
        assert_eq!(
            answers,
            Answers {
                writes: 100,
                p50_ms: 50.0,
                p99_ms: 99.0,
                in_flight: 5.05
            }
        );
        assert_eq!(
            answers.to_string(),
            "100 writes, 50.0 ms / 99.0 ms, 5.0 in flight"
        );
        let none = Answers::of(&[], Duration::from_secs(1));
        assert_eq!((none.writes, none.in_flight), (0, 0.0));
    }
}
