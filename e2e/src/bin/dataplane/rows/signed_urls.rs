//! What signed URLs cost on hits: the balancer rendered with `signedUrls` against without, one
//! token for every request (rows 2s, 2s-1m) or a new one each time (2s-new).

use cdn_operator::cdncluster::nginx::TOKEN_SCRIPT;
use cdn_operator::cli::sign_url;
use serde_json::{json, Value};
use std::time::SystemTime;

use crate::cdn::Cdn;
use crate::lab::{Setup, EDGE, PODS, TOKEN_KEY};
use crate::pods::render;
use crate::report::{figure, Figure};
use crate::traffic::becomes_hit;
use crate::util::first_line;
use crate::wrk::{wrk, wrk_script};

/// Row 2s-new: the tokens asked in turn, more than the verifier remembers (about 15,000).
const TOKENS: usize = 20_000;

impl Cdn {
    /// Row 2s: what signed URLs cost on hits. The balancer as rendered, then rendered with
    /// `signedUrls` (its pod replaced: the Secret's one key mounted, run.sh writing it for nginx),
    /// off, on, on, off, `--wrk-rounds` times, the caches untouched. Each time: a 1 KiB (2s)
    /// and a 1 MiB (2s-1m) object, cached, asked by `wrk -t1 -c50` with one valid token (the same
    /// URLs when off: the token is then a parameter like another); when on, also (2s-new) with a new
    /// token per request, from a list longer than the verifier remembers. The figures: req/s on
    /// over off, all runs of a kind summed.
    pub(super) fn row2s_signed_urls(&mut self, setup: &Setup) -> Vec<Figure> {
        let not_measured = |why: String| {
            ["2s", "2s-1m", "2s-new"]
                .map(|id| figure(id, format!("not measured: {why}"), None, Value::Null))
                .into()
        };
        if !setup.has_wrk {
            return not_measured("no wrk".into());
        }
        let signed = match render(
            &self.binary,
            &self.dir,
            "topology-signed.yaml",
            None,
            false,
            true,
        ) {
            Ok(desired) => desired,
            Err(e) => return not_measured(first_line(&e).to_string()),
        };
        if !signed[PODS[0].0].files.contains_key(TOKEN_SCRIPT) {
            return not_measured("this binary renders no signed URLs".into());
        }
        let key = sign_url::parse_key(TOKEN_KEY).expect("the benchmark's key");
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let fields = sign_url::Fields {
            expires: now + 86_400,
            acl: vec!["/obj/*".into(), "/mib/*".into()],
            ..sign_url::Fields::default()
        };
        let token = sign_url::token(&key, &fields);
        let small = format!("/obj/r2s-1k?__token__={token}");
        let large = format!("/mib/r2s-1m?__token__={token}");
        // 2s-new: a Lua list of tokens that differ by their session id, asked in turn.
        let script = self.dir.join("tokens.lua");
        let mut lua = String::from("local tokens = {\n");
        for i in 0..TOKENS {
            let fields = sign_url::Fields {
                id: Some(format!("viewer-{i}")),
                ..fields.clone()
            };
            lua.push_str(&format!("  \"{}\",\n", sign_url::token(&key, &fields)));
        }
        lua.push_str(
            "}\nlocal i = 0\nrequest = function()\n  i = i % #tokens + 1\n  \
             return wrk.format(nil, \"/obj/r2s-1k?__token__=\" .. tokens[i])\nend\n",
        );
        if let Err(e) = std::fs::write(&script, lua) {
            return not_measured(format!("writing {}: {e}", script.display()));
        }
        let plain = self.desired.clone();
        let mut errors = Vec::new();
        // (signed, object, rps, requests); object: 0 = 1 KiB, 1 = 1 MiB, 2 = 1 KiB new tokens.
        let mut runs: Vec<(bool, usize, f64, u64)> = Vec::new();
        let order = [false, true, true, false].repeat(setup.wrk_rounds as usize);
        for &on in &order {
            let wanted = if on { &signed } else { &plain };
            if self.desired[PODS[0].0].files != wanted[PODS[0].0].files {
                let done = self.apply(setup, wanted.clone());
                if let Some(failed) = done.values().find(|d| d.contains("failed")) {
                    errors.push(failed.clone());
                    break;
                }
            }
            for (object, path) in [&small, &large].into_iter().enumerate() {
                if !becomes_hit(path) {
                    errors.push(format!("{path}: no HIT (signed {on})"));
                }
                // A first run of each pod, not counted: the first run is slower.
                if object == 0 {
                    let _ = wrk(&format!("http://{EDGE}{path}"), 1);
                }
                match wrk(&format!("http://{EDGE}{path}"), setup.wrk_seconds) {
                    Ok(run) => {
                        if run.errors > 0 {
                            errors.push(format!("signed {on}, {path}: {} errors", run.errors));
                        }
                        runs.push((on, object, run.rps, run.requests));
                    }
                    Err(e) => errors.push(format!("signed {on}, {path}: {e}")),
                }
            }
            if on {
                match wrk_script(&format!("http://{EDGE}/"), setup.wrk_seconds, Some(&script)) {
                    Ok(run) => {
                        if run.errors > 0 {
                            errors.push(format!("new tokens: {} errors", run.errors));
                        }
                        runs.push((on, 2, run.rps, run.requests));
                    }
                    Err(e) => errors.push(format!("new tokens: {e}")),
                }
            }
        }
        // Back as rendered, for the rows after this one.
        if self.desired[PODS[0].0].files != plain[PODS[0].0].files {
            self.apply(setup, plain);
        }
        let rounds = 2 * setup.wrk_rounds as usize;
        let mean = |on: bool, object: usize| -> Option<f64> {
            let rps: Vec<f64> = runs
                .iter()
                .filter(|(o, k, _, _)| *o == on && *k == object)
                .map(|(_, _, rps, _)| *rps)
                .collect();
            (rps.len() == rounds).then(|| rps.iter().sum::<f64>() / rps.len() as f64)
        };
        let errors_shown = if errors.is_empty() { "" } else { ", errors" };
        let row = |id: &str, on: Option<f64>, off: Option<f64>, target: bool| {
            let ratio = match (on, off) {
                (Some(on), Some(off)) if off > 0.0 => Some(on / off),
                _ => None,
            };
            let shown = match (ratio, on, off) {
                (Some(r), Some(on), Some(off)) => {
                    format!("{r:.2} ({on:.0} / {off:.0}){errors_shown}")
                }
                _ => format!("not measured: {}", errors.join("; ")),
            };
            figure(
                id,
                shown,
                if target {
                    ratio.map(|r| r >= 0.90)
                } else {
                    None
                },
                json!({"on_rps": on, "off_rps": off, "ratio": ratio}),
            )
        };
        const OBJECTS: [&str; 3] = ["1k", "1m", "1k-new-tokens"];
        let mut figures = vec![
            row("2s", mean(true, 0), mean(false, 0), true),
            row("2s-1m", mean(true, 1), mean(false, 1), true),
            row("2s-new", mean(true, 2), mean(false, 0), false),
        ];
        figures[0].data["runs"] = json!(runs
            .iter()
            .map(|(on, object, rps, requests)| json!({
                "signed": on,
                "object": OBJECTS[*object],
                "rps": rps,
                "requests": requests,
            }))
            .collect::<Vec<_>>());
        figures[0].data["errors"] = json!(errors);
        figures[0].data["wrk_seconds"] = json!(setup.wrk_seconds);
        figures
    }
}
