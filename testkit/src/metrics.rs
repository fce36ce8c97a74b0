//! Reading a Prometheus exposition (text format 0.0.4 or OpenMetrics).

/// Whether `text` has exactly this line.
pub fn has_line(text: &str, line: &str) -> bool {
    text.lines().any(|l| l == line)
}

/// The value of one series, named with its labels exactly as served (`name{a="b"}`).
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// Sums the samples of `name` (exact metric name) whose label set contains `labels`. `None` when
/// the exposition has no such series.
pub fn metric_sum(text: &str, name: &str, labels: &str) -> Option<f64> {
    let mut found = None;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let (series, value) = match line.rsplit_once(' ') {
            Some(parts) => parts,
            None => continue,
        };
        let (metric, set) = match series.split_once('{') {
            Some((m, rest)) => (m, rest.trim_end_matches('}')),
            None => (series, ""),
        };
        if metric != name || !set.contains(labels) {
            continue;
        }
        if let Ok(v) = value.parse::<f64>() {
            *found.get_or_insert(0.0) += v;
        }
    }
    found
}

/// `promtool check metrics` on an exposition (the classic text format): whether it passed, and
/// what it said. promtool is installed by scripts/install-test-deps.sh; a missing one fails the
/// test rather than skipping the check.
pub fn promtool_check_metrics(exposition: &str) -> (bool, String) {
    let output = crate::run_with_stdin(
        std::process::Command::new("promtool").args(["check", "metrics"]),
        exposition,
    )
    .expect(
        "promtool (Debian package prometheus) must be installed: run scripts/install-test-deps.sh",
    );
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), said)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str =
        "# HELP controller_runtime_reconcile Total number of reconciliations per controller.\n\
# TYPE controller_runtime_reconcile counter\n\
controller_runtime_reconcile_total{controller=\"cdncluster\",result=\"success\"} 7\n\
controller_runtime_reconcile_total{controller=\"cdncluster\",result=\"error\"} 2\n\
controller_runtime_reconcile_total{controller=\"at\",result=\"success\"} 5\n\
controller_runtime_reconcile_errors_total{controller=\"cdncluster\"} 2\n\
# EOF\n";

    #[test]
    fn metric_sums_add_the_matching_series_only() {
        let sum = |labels| metric_sum(TEXT, "controller_runtime_reconcile_total", labels);
        assert_eq!(sum("controller=\"cdncluster\""), Some(9.0));
        assert_eq!(sum("controller=\"at\""), Some(5.0));
        assert_eq!(sum("controller=\"other\""), None);
        assert_eq!(metric_sum(TEXT, "controller_runtime_reconcile", ""), None);
    }

    #[test]
    fn a_sample_is_one_whole_series() {
        let series = "controller_runtime_reconcile_total{controller=\"at\",result=\"success\"}";
        assert_eq!(sample(TEXT, series), Some(5.0));
        assert_eq!(sample(TEXT, "controller_runtime_reconcile_total"), None);
        assert!(has_line(TEXT, "# EOF"));
        assert!(!has_line(TEXT, "# EO"));
    }
}
