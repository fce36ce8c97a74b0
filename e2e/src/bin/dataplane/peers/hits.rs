//! Throughput of cached objects beside the peers, in interleaved `wrk` rounds against nginx serving
//! the file: one tier (row 20: 1 KiB, 1 MiB, 4 MiB), two tiers (26).

use cdn_operator::cdncluster::nginx::CACHE_STATUS_HEADER;
use serde_json::json;

use super::servers::{Peers, GENERATED};
use crate::cdn::Cdn;
use crate::lab::{Setup, DIRECT, EDGE};
use crate::report::{figure, Figure};
use crate::traffic::get_from;
use crate::util::{median, per_server};
use crate::wrk::wrk;

/// What `wrk` measured of a path on each server, in rounds.
struct Rounds {
    /// req/s of nginx serving the file, a value per round.
    direct: Vec<f64>,
    /// Per server, req/s and the ratio to the round's direct figure.
    rps: Vec<Vec<f64>>,
    ratios: Vec<Vec<f64>>,
    errors: Vec<String>,
}

/// `max(--wrk-rounds, 3)` rounds of `wrk` of nginx serving `file`, then of `path` on each of
/// `servers` in turn: runs seconds apart share the machine's load of the moment.
fn interleaved(setup: &Setup, file: &str, servers: &[(&str, &str)], path: &str) -> Rounds {
    let mut rounds = Rounds {
        direct: Vec::new(),
        rps: vec![Vec::new(); servers.len()],
        ratios: vec![Vec::new(); servers.len()],
        errors: Vec::new(),
    };
    for _ in 0..setup.wrk_rounds.max(3) {
        let direct = match wrk(&format!("http://{DIRECT}{file}"), setup.wrk_seconds) {
            Ok(run) => run.rps,
            Err(e) => {
                rounds.errors.push(format!("direct: {e}"));
                continue;
            }
        };
        rounds.direct.push(direct);
        for (i, (name, addr)) in servers.iter().enumerate() {
            match wrk(&format!("http://{addr}{path}"), setup.wrk_seconds) {
                Ok(run) => {
                    if run.errors > 0 {
                        rounds.errors.push(format!("{name}: {} errors", run.errors));
                    }
                    rounds.rps[i].push(run.rps);
                    rounds.ratios[i].push(run.rps / direct);
                }
                Err(e) => rounds.errors.push(format!("{name}: {e}")),
            }
        }
    }
    rounds
}

/// Each server's median ratio, as a figure shows it.
fn ratios_shown<'a>(
    servers: &[(&'a str, &str)],
    medians: &[Option<f64>],
) -> Vec<(&'a str, String)> {
    servers
        .iter()
        .zip(medians)
        .map(|((n, _), m)| (*n, m.map_or("-".into(), |m| format!("{m:.2}"))))
        .collect()
}

impl Cdn {
    /// Row 20: cached objects of 1 KiB, 1 MiB and 4 MiB, `wrk -t1 -c50` of nginx serving the
    /// file, then of each one-tier server, in turn, `max(--wrk-rounds, 3)` rounds; per server
    /// the median of its rounds' ratios to nginx direct, and the generated cache's to the best
    /// peer.
    pub(super) fn row20_hits(&mut self, setup: &Setup, peers: &Peers) -> Vec<Figure> {
        let objects = [
            ("20a", "/obj/p20", "/1k.bin", Some(0.95)),
            ("20b", "/mib/p20", "/1m.bin", Some(0.92)),
            ("20c", "/m4/p20", "/4m.bin", None),
        ];
        let servers = peers.one_tier();
        let mut figures = Vec::new();
        for (id, path, file, target) in objects {
            for (_, addr) in servers {
                for _ in 0..2 {
                    let _ = get_from(addr, path);
                }
            }
            let hit = get_from(GENERATED, path)
                .is_ok_and(|r| r.header(CACHE_STATUS_HEADER) == Some("HIT"));
            let Rounds {
                direct,
                rps,
                ratios,
                errors,
            } = interleaved(setup, file, &servers, path);
            let medians: Vec<Option<f64>> = ratios.iter().map(|r| median(r)).collect();
            let best_peer = medians[1..]
                .iter()
                .flatten()
                .copied()
                .fold(None, |b: Option<f64>, r| Some(b.map_or(r, |b| b.max(r))));
            let generated = medians[0];
            let shown = match (generated, median(&direct)) {
                (Some(g), Some(d)) => format!(
                    "{} (direct {d:.0} req/s); generated / best peer {}{}{}",
                    per_server(&ratios_shown(&servers, &medians)),
                    best_peer.map_or("-".into(), |b| format!("{:.2}", g / b)),
                    if hit { "" } else { ", not a HIT" },
                    if errors.is_empty() { "" } else { ", errors" },
                ),
                _ => format!("not measured: {}", errors.join("; ")),
            };
            // The target: the ratio to nginx direct, and at least the best peer's.
            let met = target.and_then(|t| Some(generated? >= t && generated? >= best_peer?));
            figures.push(figure(
                id,
                shown,
                met,
                json!({
                    "direct_rps": direct,
                    "servers": servers.iter().map(|(n, _)| n).collect::<Vec<_>>(),
                    "rps": rps,
                    "ratios_by_round": ratios,
                    "median_ratios": medians,
                    "generated_over_best_peer": generated.zip(best_peer).map(|(g, b)| g / b),
                    "generated_hit": hit,
                    "errors": errors,
                    "wrk_seconds": setup.wrk_seconds,
                }),
            ));
        }
        figures
    }

    /// Row 26: a cached 1 KiB object through two tiers (the balancer over the caches; Varnish
    /// over Varnish; Traffic Server over Traffic Server), as row 20 measures one.
    pub(super) fn row26_two_tiers(&mut self, setup: &Setup, peers: &Peers) -> Vec<Figure> {
        let path = "/obj/p26";
        let servers = [
            ("generated", EDGE),
            (peers.names[0].as_str(), peers.varnish_front.addr),
            (peers.names[1].as_str(), peers.ats_front.addr),
        ];
        for (_, addr) in servers {
            for _ in 0..3 {
                let _ = get_from(addr, path);
            }
        }
        let Rounds {
            direct,
            ratios,
            errors,
            ..
        } = interleaved(setup, "/1k.bin", &servers, path);
        let medians: Vec<Option<f64>> = ratios.iter().map(|r| median(r)).collect();
        let shown = format!(
            "{} (direct {:.0} req/s){}",
            per_server(&ratios_shown(&servers, &medians)),
            median(&direct).unwrap_or_default(),
            if errors.is_empty() {
                String::new()
            } else {
                format!(", errors: {}", errors.join("; "))
            }
        );
        vec![figure(
            "26",
            shown,
            None,
            json!({"servers": servers.iter().map(|(n, _)| n).collect::<Vec<_>>(),
                "direct_rps": direct, "ratios_by_round": ratios, "median_ratios": medians,
                "errors": errors}),
        )]
    }
}
