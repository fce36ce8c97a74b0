//! The caches users would pick instead of the generated one, measured beside it (rows 20 to 26):
//! Varnish and Apache Traffic Server, the packages of Debian stable (`scripts/install-test-deps.sh`
//! installs them). `servers.rs` starts them (how each runs, the room each is given); the rows are
//! methods of `Cdn` by group: `hits.rs` (20, 26), `misses.rs` (21, 22, 25), `eviction.rs` (23),
//! `stale.rs` (24); [`Cdn::rows_peers`] here runs them.

mod eviction;
mod hits;
mod misses;
mod servers;
mod stale;

use serde_json::Value;

use crate::cdn::Cdn;
use crate::lab::Setup;
use crate::report::{figure, Figure, ROWS};
use servers::Peers;

/// The rows of the peers; `--only peers` runs them all.
pub(crate) const IDS: [&str; 7] = ["20", "21", "22", "23", "24", "25", "26"];

/// Whether row `id` of the peers runs.
pub(crate) fn runs(setup: &Setup, id: &str) -> bool {
    setup.runs(id) || setup.runs("peers")
}

impl Cdn {
    /// Rows 20 to 26: the generated configuration beside Varnish and Traffic Server.
    pub(crate) fn rows_peers(&mut self, setup: &Setup) -> Vec<Figure> {
        let wanted: Vec<&str> = IDS.iter().copied().filter(|id| runs(setup, id)).collect();
        let not_measured = |why: &str| -> Vec<Figure> {
            ROWS.iter()
                .filter(|(r, _, _)| wanted.iter().any(|id| r.starts_with(id)))
                .map(|(id, _, _)| figure(id, format!("not measured: {why}"), None, Value::Null))
                .collect()
        };
        if !setup.isolated {
            // The peers listen on port 80 of addresses the benchmark's own namespace gives it.
            return not_measured("no network namespace of its own (run as root)");
        }
        if !setup.has_wrk {
            return not_measured("no wrk");
        }
        let peers = match Peers::start(&self.dir.join("peers")) {
            Ok(peers) => peers,
            Err(e) => return not_measured(&e),
        };
        eprintln!("dataplane:   peers: {}, {}", peers.names[0], peers.names[1]);
        type Row = fn(&mut Cdn, &Setup, &Peers) -> Vec<Figure>;
        let rows: [(&str, Row); 7] = [
            ("20", |c, s, p| c.row20_hits(s, p)),
            ("21", |c, _, p| c.row21_cold_miss(p)),
            ("22", |c, _, p| c.row22_concurrent_misses(p)),
            ("23", |c, s, p| c.row23_zipf(s, p)),
            ("24", |c, _, p| c.row24_stale_on_hang(p)),
            ("25", |c, _, p| c.row25_uncacheable(p)),
            ("26", |c, s, p| c.row26_two_tiers(s, p)),
        ];
        let mut figures = Vec::new();
        for (id, row) in rows {
            if wanted.contains(&id) {
                eprintln!("dataplane:   row {id}");
                figures.extend(row(self, setup, &peers));
            }
        }
        figures
    }
}
