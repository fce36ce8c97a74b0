//! The standard `process_*` metrics of Prometheus client libraries, read from /proc at each
//! scrape. Linux only (where the operator runs); elsewhere the family is simply absent.

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
    pub fn read() -> std::io::Result<Sample> {
        let stat = std::fs::read_to_string("/proc/self/stat")?;
        let boot = std::fs::read_to_string("/proc/stat")?;
        let limits = std::fs::read_to_string("/proc/self/limits")?;
        let open_fds = std::fs::read_dir("/proc/self/fd")?.count() as u64;
        let ticks = clock_ticks_per_second();
        let page = page_size();
        let invalid = |what| std::io::Error::new(std::io::ErrorKind::InvalidData, what);
        let stat = parse_stat(&stat).ok_or_else(|| invalid("unreadable /proc/self/stat"))?;
        let boot_time = parse_boot_time(&boot).ok_or_else(|| invalid("no btime in /proc/stat"))?;
        Ok(Sample {
            cpu_seconds: (stat.utime + stat.stime) as f64 / ticks,
            resident_memory_bytes: stat.rss_pages.saturating_mul(page),
            virtual_memory_bytes: stat.vsize,
            open_fds,
            max_fds: parse_max_fds(&limits),
            start_time_seconds: boot_time as f64 + stat.start_ticks as f64 / ticks,
        })
    }
}

#[derive(Debug, PartialEq)]
struct Stat {
    utime: u64,
    stime: u64,
    start_ticks: u64,
    vsize: u64,
    rss_pages: u64,
}

/// Fields of /proc/self/stat (proc(5)); the command name may hold spaces and parentheses, so
/// fields are counted from its closing parenthesis.
fn parse_stat(text: &str) -> Option<Stat> {
    let rest = &text[text.rfind(')')? + 1..];
    // After the name, the state is field 3; utime is field 14, so index 11 here.
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    Some(Stat {
        utime: field(14)?,
        stime: field(15)?,
        start_ticks: field(22)?,
        vsize: field(23)?,
        rss_pages: field(24)?,
    })
}

fn parse_boot_time(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

fn parse_max_fds(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    // Columns: name, soft limit, hard limit, units; the soft limit is what the process gets.
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

fn clock_ticks_per_second() -> f64 {
    // SAFETY: sysconf only reads a configuration value.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 {
        ticks as f64
    } else {
        100.0
    }
}

fn page_size() -> u64 {
    // SAFETY: sysconf only reads a configuration value.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(size).ok().filter(|s| *s > 0).unwrap_or(4096)
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
    fn stat_fields_are_counted_after_the_command_name() {
        let line = "4242 (cdn op (x)) S 1 4242 4242 0 -1 4194560 1000 0 0 0 250 75 0 0 20 0 \
                    9 0 123456 987654321 2048 18446744073709551615";
        assert_eq!(
            parse_stat(line),
            Some(Stat {
                utime: 250,
                stime: 75,
                start_ticks: 123456,
                vsize: 987654321,
                rss_pages: 2048,
            })
        );
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(parse_stat("1 (x) S 1 2"), None);
    }

    #[test]
    fn boot_time_and_fd_limit_are_found() {
        assert_eq!(
            parse_boot_time("cpu  1 2 3\nbtime 1700000000\nprocesses 5\n"),
            Some(1700000000)
        );
        assert_eq!(parse_boot_time("cpu 1\n"), None);
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max cpu time              unlimited            unlimited            seconds\n\
                      Max open files            1024                 524288               files\n";
        assert_eq!(parse_max_fds(limits), Some(1024));
    }

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
