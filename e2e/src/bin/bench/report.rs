//! The figures of a run: printed as a table, written as JSON. It sits on top of the phases; the
//! small figures they share with it are in [`crate::stats`], below them all.

use crate::baseline::Baseline;
use crate::cpu::{Stretch, Usages, CPU_SAMPLE_EVERY};
use crate::latency::SpecChanges;
use crate::metrics::Requests;
use crate::stats::percentile;
use crate::workload::GROUP;
use crate::{Args, Convergence, Steady};
use serde_json::json;
use std::process::ExitStatus;
use std::time::Duration;

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// `x` per `d`, when `d` is positive.
fn per(x: u64, d: Option<f64>) -> Option<f64> {
    d.filter(|d| *d > 0.0).map(|d| x as f64 / d)
}

/// A ratio per reconcile, or why there is none.
fn per_reconcile(x: Option<f64>) -> String {
    x.map(|v| format!("{v:.2}"))
        .unwrap_or_else(|| "n/a (no controller_runtime_reconcile_total)".into())
}

fn mib(k: Option<u64>) -> String {
    k.map(|k| format!("{:.1} MiB", k as f64 / 1024.0))
        .unwrap_or_else(|| "n/a".into())
}

fn seconds(s: Option<f64>) -> String {
    s.map(|s| format!("{s:.2} s"))
        .unwrap_or_else(|| "n/a".into())
}

/// Everything a run measured, to print and to write.
pub struct Report<'a> {
    pub args: &'a Args,
    pub namespaces: usize,
    pub convergence: &'a Convergence,
    pub steady: &'a Steady,
    pub changes: &'a SpecChanges,
    pub usages: &'a Usages,
    pub exit: Option<ExitStatus>,
    pub baseline: &'a Baseline,
}

impl Report<'_> {
    /// Prints the table and the requests by verb and resource.
    pub fn print(&self) {
        let (args, c, s, l, u, baseline) = (
            self.args,
            self.convergence,
            self.steady,
            self.changes,
            self.usages,
            self.baseline,
        );
        let n = args.clusters;
        // The operator's own counts (checked against the proxy's, see `Requests`).
        let convergence = &c.requests.operator;
        let reconciled = c.reconciles.map(|r| r.count);
        let (cpu_converge, cpu_steady, cpu_changes) = u.cpu_by_phase();
        let path = &l.path;
        println!("\n== cdn-operator benchmark: {n} CdnClusters ({} balancers, {} caches), {} namespaces, replicas {} ==", n.div_ceil(GROUP), n - n.div_ceil(GROUP), self.namespaces, args.replicas);
        println!("| measure | value |");
        println!("|---|---|");
        println!("| creates sent (user) | {:.2} s |", secs(c.created));
        println!("| every child applied | {:.2} s |", secs(c.children_at));
        println!("| every status written | {:.2} s |", secs(c.converged));
        println!(
            "| reconciles (operator metric) | {} |",
            reconciled
                .map(|r| format!("{r:.0}"))
                .unwrap_or_else(|| "n/a".into())
        );
        println!(
            "| API requests during convergence | {} |",
            convergence.requests()
        );
        println!(
            "| API writes during convergence | {} |",
            convergence.writes()
        );
        println!(
            "| API writes during convergence, counted by the operator (rest_client_requests_total) / by the proxy | {} / {} |",
            convergence.writes(),
            c.requests.proxy.writes()
        );
        println!(
            "| requests per reconcile | {} |",
            per_reconcile(per(convergence.requests(), reconciled))
        );
        println!(
            "| writes per reconcile | {} |",
            per_reconcile(per(convergence.writes(), reconciled))
        );
        println!(
            "| writes per CdnCluster | {:.2} |",
            convergence.writes() as f64 / n as f64
        );
        println!(
            "| steady state ({} s): operator writes (proxy) | {} |",
            args.steady_seconds,
            s.requests.proxy.writes()
        );
        println!(
            "| steady state: operator writes, counted by the operator (rest_client_requests_total) / by the proxy | {} / {} |",
            s.requests.operator.writes(),
            s.requests.proxy.writes()
        );
        println!("| steady state: resourceVersion changes seen (CdnClusters + children, any writer) | {} |", s.rv_changes);
        println!(
            "| spec change → ConfigMap updated p50 | {:.1} ms |",
            percentile(&l.latencies, 50.0)
        );
        println!(
            "| spec change → ConfigMap updated p99 | {:.1} ms |",
            percentile(&l.latencies, 99.0)
        );
        println!(
            "| why: spec changes: the server's answer to the change p50 / p99; to the operator's writes meanwhile | {:.1} ms / {:.1} ms; {} |",
            percentile(&l.change_answers, 50.0),
            percentile(&l.change_answers, 99.0),
            l.operator_answers
        );
        println!(
            "| why: spec changes, p50 / p99 from the change: its watch event seen; the operator's ConfigMap apply forwarded; from the event to the apply; the apply's answer; the slowest (total = change answered, event seen, apply forwarded, its answer) | {:.1} / {:.1} ms; {:.1} / {:.1} ms; {:.1} / {:.1} ms; {:.1} / {:.1} ms; {} |",
            path.event_seen_p50, path.event_seen_p99, path.apply_sent_p50, path.apply_sent_p99,
            path.reaction_p50, path.reaction_p99, path.apply_answer_p50, path.apply_answer_p99,
            path.slowest.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
        );
        println!(
            "| time per 1,000 CdnClusters (every status written) | {:.2} s |",
            secs(c.converged) * 1000.0 / n as f64
        );
        println!("| operator CPU: convergence | {} |", seconds(cpu_converge));
        println!("| operator CPU: steady state | {} |", seconds(cpu_steady));
        println!("| operator CPU: spec changes | {} |", seconds(cpu_changes));
        println!(
            "| benchmark process (creates, proxy, watches): CPU during convergence, peak VmRSS | {}, {} |",
            seconds(u.bench_cpu()),
            mib(u.bench_at_converged.map(|u| u.peak_rss_kib))
        );
        println!(
            "| operator VmRSS after the steady state | {} |",
            mib(u.at_steady.map(|u| u.rss_kib))
        );
        println!(
            "| operator peak VmRSS (VmHWM) | {} |",
            mib(u.at_end.map(|u| u.peak_rss_kib))
        );
        println!(
            "| operator VmRSS at the end | {} |",
            mib(u.at_end.map(|u| u.rss_kib))
        );
        println!(
            "| baseline: the creates and the same writes from one client{} | {:.2} s ({:.2} s from its first write), {} writes |",
            if args.baseline_first {
                ", run first"
            } else {
                ""
            },
            secs(baseline.time),
            secs(baseline.from_first_write),
            baseline.requests.writes()
        );
        println!(
            "| operator time / baseline time | {:.2} |",
            secs(c.converged) / secs(baseline.time)
        );
        println!(
            "| operator writes / baseline writes | {:.2} |",
            convergence.writes() as f64 / baseline.requests.writes().max(1) as f64
        );
        println!(
            "| why: operator reconciles during convergence: mean time; over 1 s | {} |",
            c.reconciles
                .map(|t| format!("{:.1} ms; {:.0}", t.mean_ms(), t.over_1s))
                .unwrap_or_else(|| "n/a".into())
        );
        println!(
            "| why: operator context switches per CdnCluster during convergence: voluntary / involuntary | {} |",
            u.switches(n)
                .map(|(v, i)| format!("{v:.1} / {i:.1}"))
                .unwrap_or_else(|| "n/a".into())
        );
        println!(
            "| why: operator system CPU during convergence; minor page faults per CdnCluster | {} |",
            u.kernel(n)
                .map(|(s, f)| format!("{s:.2} s; {f:.1}"))
                .unwrap_or_else(|| "n/a".into())
        );
        println!(
            "| why: operator CPU during convergence, sampled every {} s and fitted: paid per second whatever the progress + per CdnCluster converged | {} |",
            CPU_SAMPLE_EVERY.as_secs(),
            c.cpu.fit.map_or("n/a".into(), |f| f.to_string())
        );
        println!(
            "| why: the machine's speed during convergence: a canary's fixed task (dependent loads through 16 MiB; arithmetic), its cost against idle | {} |",
            c.cpu.machine.map_or("n/a".into(), |(l, a)| format!("{l:.2}× / {a:.2}×"))
        );
        println!(
            "| why: operator CPU per CdnCluster by stretch of CdnClusters converged, at the stretch's pace (canary against idle) | {} |",
            c.cpu.stretches
                .iter()
                .map(Stretch::to_string)
                .collect::<Vec<_>>()
                .join("; ")
        );
        println!(
            "| why: the part paid per second, over the convergence | {} |",
            match (c.cpu.per_second_part(c.converged), cpu_converge) {
                (Some(part), Some(all)) => format!("{part:.2} s of {all:.2} s"),
                _ => "n/a".into(),
            }
        );
        println!(
            "| why: server's answers to the operator's writes until converged: p50 / p99; in flight | {} |",
            c.operator_answers
        );
        println!(
            "| why: server's answers to the baseline's writes: p50 / p99; in flight | {} |",
            baseline.answers
        );
        println!(
            "convergence requests by verb and resource: {:?}",
            convergence.0
        );
        println!("steady-state requests: {:?}", s.requests.operator.0);
    }

    /// The figures as JSON.
    pub fn json(&self) -> serde_json::Value {
        let (args, c, s, l, u, baseline) = (
            self.args,
            self.convergence,
            self.steady,
            self.changes,
            self.usages,
            self.baseline,
        );
        let n = args.clusters;
        // The operator's own counts (checked against the proxy's, see `Requests`).
        let convergence = &c.requests.operator;
        let reconciled = c.reconciles.map(|r| r.count);
        let (cpu_converge, cpu_steady, cpu_changes) = u.cpu_by_phase();
        let mut report = json!({
            "clusters": n, "namespaces": self.namespaces, "replicas": args.replicas,
            "max_concurrent_reconciles": args.max_concurrent_reconciles,
            "created_s": secs(c.created), "children_applied_s": secs(c.children_at), "statuses_written_s": secs(c.converged),
            "reconciles": reconciled,
            "convergence_requests": convergence.requests(), "convergence_writes": convergence.writes(),
            "convergence_by_request": convergence.0,
            "requests_per_reconcile": per(convergence.requests(), reconciled),
            "writes_per_reconcile": per(convergence.writes(), reconciled),
            "steady_seconds": args.steady_seconds, "steady_writes": s.requests.operator.writes(), "steady_requests": s.requests.operator.0,
            "steady_resource_version_changes": s.rv_changes,
            "spec_change_latency_ms": {"samples": l.latencies.len(), "p50": percentile(&l.latencies, 50.0), "p99": percentile(&l.latencies, 99.0),
                "change_answer_p50": percentile(&l.change_answers, 50.0), "change_answer_p99": percentile(&l.change_answers, 99.0),
                "operator_write_answers": l.operator_answers, "path": l.path},
            "operator_rss_kib": u.at_end.map(|u| u.rss_kib),
            "operator_steady_rss_kib": u.at_steady.map(|u| u.rss_kib),
            "operator_peak_rss_kib": u.at_end.map(|u| u.peak_rss_kib),
            "operator_cpu_seconds": {"convergence": cpu_converge, "steady": cpu_steady, "spec_changes": cpu_changes},
            "benchmark_process": {"cpu_seconds_convergence": u.bench_cpu(), "peak_rss_kib": u.bench_at_converged.map(|u| u.peak_rss_kib)},
            "seconds_per_1000": secs(c.converged) * 1000.0 / n as f64,
            "operator_exit": self.exit.map(|s| s.to_string()),
            "baseline_first": args.baseline_first,
            "baseline_s": secs(baseline.time), "baseline_from_first_write_s": secs(baseline.from_first_write), "baseline_requests": baseline.requests.0,
            "ratio_operator_to_baseline_time": secs(c.converged) / secs(baseline.time),
            "ratio_operator_to_baseline_writes": convergence.writes() as f64 / baseline.requests.writes().max(1) as f64,
            "reconcile_time": c.reconciles.map(|t| json!({"reconciles": t.count, "mean_ms": t.mean_ms(), "over_1s": t.over_1s})),
            "write_answers": {"operator": c.operator_answers, "baseline": baseline.answers},
            "operator_switches_per_cluster": u.switches(n).map(|(v, i)| json!({"voluntary": v, "involuntary": i})),
            "operator_kernel": u.kernel(n).map(|(s, f)| json!({"system_cpu_seconds_convergence": s, "minor_faults_per_cluster": f})),
            "operator_cpu_fit": c.cpu.fit.map(|f| json!({"fit": f, "per_second_part_s": c.cpu.per_second_part(c.converged)})),
            "operator_cpu_samples": c.cpu.samples,
        });
        // Beside the macro above, whose size meets the recursion limit.
        report["operator_cpu_by_stretch"] = json!(c.cpu.stretches);
        report["canary_against_idle"] = json!(c
            .cpu
            .machine
            .map(|(l, a)| json!({"loads": l, "arithmetic": a})));
        // The operator's writes as it counts them (which the figures above read) and as the
        // proxy did: they must agree.
        let both = |r: &Requests| json!({"operator_metric": r.operator.writes(), "proxy": r.proxy.writes()});
        report["write_counts"] =
            json!({"convergence": both(&c.requests), "steady": both(&s.requests)});
        report
    }

    /// Writes [`Report::json`] to `--json` (relative to the repository's root) and says where.
    pub fn write_json(&self) {
        let json_path = if self.args.json.is_absolute() {
            self.args.json.clone()
        } else {
            cdn_operator_e2e::repository_root().join(&self.args.json)
        };
        if let Some(parent) = json_path.parent() {
            let _ = std::fs::create_dir_all(parent);
        }
        std::fs::write(
            &json_path,
            serde_json::to_string_pretty(&self.json()).unwrap(),
        )
        .expect("write the JSON report");
        println!("JSON: {}", json_path.display());
    }
}
