//! The standard `process_*` metrics of Prometheus client libraries, read from /proc (with the
//! procfs crate) at each scrape. Linux only (where the operator runs); elsewhere the family is
//! simply absent.

use procfs::WithCurrentSystemInfo;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Unit;

/// A snapshot of the process, from /proc.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub cpu_seconds: f64,
    pub resident_memory_bytes: u64,
    pub virtual_memory_bytes: u64,
    pub open_fds: u64,
    pub max_fds: Option<u64>,
    pub start_time_seconds: f64,
}

impl Sample {
    /// Reads the current process.
    pub fn read() -> procfs::ProcResult<Sample> {
        let me = procfs::process::Process::myself()?;
        let stat = me.stat()?;
        let ticks = procfs::ticks_per_second() as f64;
        let max_fds = match me.limits()?.max_open_files.soft_limit {
            procfs::process::LimitValue::Value(n) => Some(n),
            procfs::process::LimitValue::Unlimited => None,
        };
        Ok(Sample {
            cpu_seconds: (stat.utime + stat.stime) as f64 / ticks,
            resident_memory_bytes: stat.rss_bytes().get(),
            virtual_memory_bytes: stat.vsize,
            open_fds: me.fd_count()? as u64,
            max_fds,
            start_time_seconds: procfs::boot_time_secs()? as f64 + stat.starttime as f64 / ticks,
        })
    }
}

/// Encodes a [`Sample`] at each scrape.
#[derive(Debug)]
pub struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Ok(sample) = Sample::read() else {
            // Not Linux, or /proc not mounted: no process metrics rather than a failed scrape.
            return Ok(());
        };
        let cpu = ConstCounter::new(sample.cpu_seconds);
        cpu.encode(encoder.encode_descriptor(
            "process_cpu",
            "Total user and system CPU time spent in seconds.",
            Some(&Unit::Seconds),
            MetricType::Counter,
        )?)?;
        let gauges: [(&str, &str, Option<Unit>, f64); 4] = [
            (
                "process_resident_memory",
                "Resident memory size in bytes.",
                Some(Unit::Bytes),
                sample.resident_memory_bytes as f64,
            ),
            (
                "process_virtual_memory",
                "Virtual memory size in bytes.",
                Some(Unit::Bytes),
                sample.virtual_memory_bytes as f64,
            ),
            (
                "process_open_fds",
                "Number of open file descriptors.",
                None,
                sample.open_fds as f64,
            ),
            (
                "process_start_time",
                "Start time of the process since unix epoch in seconds.",
                Some(Unit::Seconds),
                sample.start_time_seconds,
            ),
        ];
        for (name, help, unit, value) in gauges {
            ConstGauge::new(value).encode(encoder.encode_descriptor(
                name,
                help,
                unit.as_ref(),
                MetricType::Gauge,
            )?)?;
        }
        if let Some(max) = sample.max_fds {
            ConstGauge::new(max as f64).encode(encoder.encode_descriptor(
                "process_max_fds",
                "Maximum number of open file descriptors.",
                None,
                MetricType::Gauge,
            )?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_reads_sensibly() {
        // Burn some CPU so at least a few clock ticks are accounted.
        let spin = std::time::Instant::now();
        let mut x = 0u64;
        while spin.elapsed() < std::time::Duration::from_millis(60) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        // Other tests open and close files in parallel: only stable facts are checked.
        let before = Sample::read().expect("/proc is readable on Linux");
        assert!(before.open_fds >= 3, "{before:?}");
        assert!(before.cpu_seconds > 0.0, "{before:?}");
        assert!(before.resident_memory_bytes > 1 << 20);
        assert!(before.virtual_memory_bytes >= before.resident_memory_bytes);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        assert!(
            before.start_time_seconds <= now + 1.0
                && before.start_time_seconds > now - 86400.0 * 30.0
        );
        assert!(before.max_fds.is_some_and(|m| m > 0));
    }
}
