//! The rows 1 to 17, a file per group, as methods of [`Cdn`]; [`Cdn::run_rows`] runs them in
//! order, then the peers' rows 20 to 26 (`peers/`). A new row goes in its group's file (or a new
//! one), in the list of `run_rows`, and its line in the report's ROWS.

mod changes;
mod failures;
mod origin_load;
mod purge;
mod ranges;
mod serving;
mod signed_urls;
mod throughput;

use crate::cdn::Cdn;
use crate::lab::Setup;
use crate::peers;
use crate::report::Figure;

impl Cdn {
    /// The rows, in order (those of `--only`, when given). After each of the rows that make the
    /// origin fail (4, 5, 6), a fresh balancer pod.
    pub(crate) fn run_rows(&mut self, setup: &Setup) -> Vec<Figure> {
        type Row = fn(&mut Cdn, &Setup) -> Vec<Figure>;
        let rows: [(&str, Row, bool); 19] = [
            ("1", |c, s| c.row1_connections(s), false),
            ("2", |c, s| c.row2_throughput(s), false),
            ("2m", |c, s| c.row2m_metrics_cost(s), false),
            ("2s", |c, s| c.row2s_signed_urls(s), false),
            ("3", |c, _| c.row3_hosts(), false),
            ("4", |c, _| c.row4_quick_errors(), true),
            ("5", |c, _| c.row5_steady_errors(), true),
            ("6", |c, _| c.row6_hung_origin(), true),
            ("7", |c, _| c.row7_cold_range(), false),
            ("8", |c, _| c.row8_concurrent_ranges(), false),
            ("9", |c, _| c.row9_uncacheable(), false),
            ("10", |c, _| c.row10_missing(), false),
            ("11", |c, s| c.row11_live_manifest(s), false),
            ("12", |c, _| c.row12_collapsed_misses(), false),
            ("13", |c, _| c.row13_head(), false),
            ("14", |c, s| c.row14_config_change(s), false),
            ("15", |c, s| c.row15_replicas(s), false),
            ("16", |c, s| c.row16_purge_burst(s), false),
            ("17", |c, s| c.row17_purge_by_key(s), false),
        ];
        let mut figures = Vec::new();
        for (id, row, resets) in rows {
            if !setup.runs(id) {
                continue;
            }
            eprintln!("dataplane:   row {id}");
            figures.extend(row(self, setup));
            if resets {
                self.reset_balancer(setup);
            }
        }
        if peers::IDS.iter().any(|id| peers::runs(setup, id)) {
            figures.extend(self.rows_peers(setup));
        }
        figures
    }
}
