//! Throughput of cached hits (`wrk`): through balancer -> cache, and of the cache alone, against
//! nginx serving the file (rows 2, 2b); what the metrics sidecars cost (2m).

use cdn_operator::cdncluster::nginx::{CACHE_STATUS_HEADER, UPSTREAM_HEADER};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::Duration;

use crate::cdn::Cdn;
use crate::client::Client;
use crate::lab::{Setup, DIRECT, EDGE, METRICS_PORT, PODS};
use crate::pods::Desired;
use crate::report::{figure, Figure};
use crate::traffic::{becomes_hit, get_once};
use crate::util::{median, metric_sum};
use crate::wrk::wrk;

impl Cdn {
    /// Row 2: a cached 1 KiB object, `wrk -t1 -c50` through balancer -> cache, against the same
    /// file served directly. Rounds of three runs back to back (direct, through the balancer, its
    /// cache asked directly: the member `X-Cdn-Upstream` names), `--wrk-rounds` of them (2 by
    /// default); each round's ratio is of runs seconds apart, which share the machine's load of the
    /// moment; the figure is the median of the rounds' ratios. 2b splits the cost between the two
    /// hops (informational).
    pub(super) fn row2_throughput(&mut self, setup: &Setup) -> Vec<Figure> {
        if !setup.has_wrk {
            return vec![figure(
                "2",
                "not measured: no wrk".into(),
                None,
                Value::Null,
            )];
        }
        let path = "/obj/r2-1k";
        let mut member = None;
        let warmed = (0..5).any(|_| {
            get_once(path).is_ok_and(|r| {
                member = r.header(UPSTREAM_HEADER).map(str::to_string);
                r.status == 200 && r.header(CACHE_STATUS_HEADER) == Some("HIT")
            })
        });
        let member = member.unwrap_or_else(|| "127.0.0.11:80".into());
        let seconds = setup.wrk_seconds;
        let urls = [
            format!("http://{DIRECT}/1k.bin"),
            format!("http://{EDGE}{path}"),
            format!("http://{member}{path}"),
        ];
        let mut rounds: Vec<[Option<f64>; 3]> = Vec::new();
        let mut errors = Vec::new();
        for _ in 0..setup.wrk_rounds {
            let mut round = [None; 3];
            for (url, rps) in urls.iter().zip(round.iter_mut()) {
                match wrk(url, seconds) {
                    Ok(run) => {
                        if run.errors > 0 {
                            errors.push(format!("{url}: {} errors", run.errors));
                        }
                        *rps = Some(run.rps);
                    }
                    Err(e) => errors.push(format!("{url}: {e}")),
                }
            }
            rounds.push(round);
        }
        let ratios = |i: usize| -> Vec<f64> {
            rounds
                .iter()
                .filter_map(|r| match (r[0], r[i]) {
                    (Some(d), Some(x)) if d > 0.0 => Some(x / d),
                    _ => None,
                })
                .collect()
        };
        let column = |i: usize| -> Vec<f64> { rounds.iter().filter_map(|r| r[i]).collect() };
        let (through, alone) = (ratios(1), ratios(2));
        let (ratio, ratio_alone) = (median(&through), median(&alone));
        let shown =
            |ratio: Option<f64>, i: usize| match (ratio, median(&column(i)), median(&column(0))) {
                (Some(r), Some(x), Some(d)) => format!(
                    "{r:.2} ({x:.0} / {d:.0}){}{}",
                    if warmed { "" } else { ", not a HIT" },
                    if errors.is_empty() { "" } else { ", errors" }
                ),
                _ => format!("not measured: {}", errors.join("; ")),
            };
        vec![
            figure(
                "2",
                shown(ratio, 1),
                ratio.map(|r| r >= 0.65),
                json!({
                    "direct_rps": column(0),
                    "proxied_rps": column(1),
                    "ratios_by_round": through,
                    "median_ratio": ratio,
                    "warmed_hit": warmed,
                    "errors": errors,
                    "wrk_seconds": seconds,
                }),
            ),
            figure(
                "2b",
                shown(ratio_alone, 2),
                None,
                json!({
                    "cache": member,
                    "cache_rps": column(2),
                    "ratios_by_round": alone,
                    "median_ratio": ratio_alone,
                }),
            ),
        ]
    }

    /// Row 2m: what counting costs. The cached 1 KiB object through balancer -> cache, `wrk -t1
    /// -c50`, with every pod as rendered (no metrics), then as rendered with a metrics image (each
    /// pod with its sidecar, reading the line per request nginx writes), then with them again,
    /// then without (ABBA, so that a drift of the machine's load weighs on both alike),
    /// `--wrk-rounds` times. The pods are replaced at each switch, as a new pod template replaces
    /// them. The figure: requests/s with metrics over without (all runs), and what the balancer's
    /// sidecar counted of wrk's requests.
    pub(super) fn row2m_metrics_cost(&mut self, setup: &Setup) -> Vec<Figure> {
        let not_measured = |why: String| {
            vec![figure(
                "2m",
                format!("not measured: {why}"),
                None,
                Value::Null,
            )]
        };
        if !setup.has_wrk {
            return not_measured("no wrk".into());
        }
        let counted = match self.render_counted() {
            Ok(desired) => desired,
            Err(e) => return not_measured(e),
        };
        let has_sidecar = |desired: &BTreeMap<String, Desired>| {
            desired.values().all(|d| {
                d.deployment
                    .spec
                    .as_ref()
                    .and_then(|s| s.template.spec.as_ref())
                    .is_some_and(|p| p.init_containers.as_ref().is_some_and(|c| !c.is_empty()))
            })
        };
        if !has_sidecar(&counted) {
            return not_measured("this binary renders no metrics sidecar".into());
        }
        let plain = self.desired.clone();
        let path = "/obj/r2m-1k";
        let mut errors = Vec::new();
        let mut runs: Vec<(bool, f64, u64)> = Vec::new();
        let mut edge_counted = None;
        // A first run, not counted: the first run of a row is slower than those after it.
        if let Err(e) = wrk(&format!("http://{EDGE}{path}"), 2) {
            errors.push(format!("warm-up: {e}"));
        }
        let order = [false, true, true, false].repeat(setup.wrk_rounds as usize);
        for (i, &metrics) in order.iter().enumerate() {
            let wanted = if metrics { &counted } else { &plain };
            if self.desired[PODS[0].0].deployment != wanted[PODS[0].0].deployment {
                let done = self.apply(setup, wanted.clone());
                if let Some(failed) = done.values().find(|d| d.contains("failed")) {
                    errors.push(failed.clone());
                    break;
                }
            }
            // A fresh cache: the object fetched once, then a HIT.
            if !becomes_hit(path) {
                errors.push(format!("{path}: no HIT (metrics {metrics})"));
            }
            match wrk(&format!("http://{EDGE}{path}"), setup.wrk_seconds) {
                Ok(run) => {
                    if run.errors > 0 {
                        errors.push(format!("metrics {metrics}: {} errors", run.errors));
                    }
                    runs.push((metrics, run.rps, run.requests));
                }
                Err(e) => errors.push(format!("metrics {metrics}: {e}")),
            }
            // At the end of pods with metrics (replaced next, counts and all): what the
            // balancer's sidecar counted, read once nginx's last lines are in (its buffer is
            // written every second, read every 200 ms).
            if metrics && order.get(i + 1) != Some(&true) {
                std::thread::sleep(Duration::from_millis(1500));
                let counted = Client::once(
                    &format!("{}:{METRICS_PORT}", PODS[0].1),
                    "GET",
                    "/metrics",
                    &[],
                )
                .ok()
                .map(|r| {
                    let text = String::from_utf8_lossy(&r.body);
                    (
                        metric_sum(&text, "cdn_requests_total", ""),
                        metric_sum(&text, "cdn_log_lines_total", r#"result="unreadable""#),
                    )
                });
                edge_counted = match (edge_counted, counted) {
                    (Some((c, u)), Some((more, more_u))) => Some((c + more, u + more_u)),
                    (None, counted) if i < 3 => counted,
                    _ => None,
                };
            }
        }
        // Back as rendered, for the rows after this one.
        if self.desired[PODS[0].0].deployment != plain[PODS[0].0].deployment {
            self.apply(setup, plain);
        }
        let total = |on: bool| -> (f64, u64, usize) {
            runs.iter()
                .filter(|(m, _, _)| *m == on)
                .fold((0.0, 0, 0), |(r, n, k), (_, rps, req)| {
                    (r + rps, n + req, k + 1)
                })
        };
        let ((on_rps, on_requests, on_runs), (off_rps, _, off_runs)) = (total(true), total(false));
        let rounds = 2 * setup.wrk_rounds as usize;
        let measured = on_runs == rounds && off_runs == rounds && off_rps > 0.0;
        let ratio = measured.then(|| on_rps / off_rps);
        let shown = match ratio {
            Some(r) => format!(
                "{r:.2} ({:.0} / {:.0}), balancer counted {} of {} requests, {} unreadable{}",
                on_rps / rounds as f64,
                off_rps / rounds as f64,
                edge_counted.map_or("?".into(), |(c, _)| format!("{c:.0}")),
                on_requests,
                edge_counted.map_or("?".into(), |(_, d)| format!("{d:.0}")),
                if errors.is_empty() { "" } else { ", errors" }
            ),
            None => format!("not measured: {}", errors.join("; ")),
        };
        vec![figure(
            "2m",
            shown,
            ratio.map(|r| r >= 0.95),
            json!({
                "runs": runs.iter().map(|(m, rps, req)| json!({"metrics": m, "rps": rps, "requests": req})).collect::<Vec<_>>(),
                "ratio": ratio,
                "edge_counted_requests": edge_counted.map(|(c, _)| c),
                "edge_unreadable_lines": edge_counted.map(|(_, d)| d),
                "wrk_requests_with_metrics": on_requests,
                "errors": errors,
                "wrk_seconds": setup.wrk_seconds,
            }),
        )]
    }
}
