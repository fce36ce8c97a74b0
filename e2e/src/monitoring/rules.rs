//! The shipped alert rules as the end-to-end test loads them into a real Prometheus: the rule
//! groups of the PrometheusRule, time-scaled, and the alerting rules with their `for`, to time
//! each alert.
//!
//! The test runs Prometheus time-scaled so that a `for: 30m` fires in seconds: every duration of
//! the rules is divided by one factor, as if Prometheus's clock ran that much faster. Thresholds,
//! matchers and functions stay byte-identical, so what fires is still the shipped expression.

use super::duration;
use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::Duration;

/// An alerting rule, as the test needs it to cause the alert and time it.
#[derive(Clone, Debug, PartialEq)]
pub struct Alert {
    pub group: String,
    pub name: String,
    pub expr: String,
    /// How long the expression must hold before the alert fires (zero when unset).
    pub for_: Duration,
    /// How long the alert keeps firing once the expression stops holding (zero when unset).
    pub keep_firing_for: Duration,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
}

/// The `.spec` of the one PrometheusRule in `yaml` (its own manifest or a multi-document render
/// holding it): `{"groups": [...]}`, which is also the shape of a Prometheus rules file.
pub fn prometheus_rule_groups(yaml: &str) -> Result<Value, String> {
    let mut rules = Vec::new();
    for document in serde_yaml::Deserializer::from_str(yaml) {
        let document = Value::deserialize(document).map_err(|e| format!("YAML: {e}"))?;
        if document.get("kind").and_then(Value::as_str) == Some("PrometheusRule") {
            rules.push(document);
        }
    }
    let [rule] = <[Value; 1]>::try_from(rules)
        .map_err(|rules| format!("{} PrometheusRules, expected one", rules.len()))?;
    let name = rule["metadata"]["name"].as_str().unwrap_or_default();
    let spec = rule
        .get("spec")
        .filter(|spec| spec["groups"].is_array())
        .ok_or_else(|| format!("PrometheusRule {name}: no spec.groups"))?;
    Ok(spec.clone())
}

/// `groups` (a rules file) with every duration divided by `factor`: each group's `interval`,
/// each rule's `for` and `keep_firing_for`, and in each `expr` the ranges `[d]`, subqueries
/// `[d:r]` and `[d:]`, and offsets `offset d` and `offset -d`. Everything else (labels,
/// annotations, thresholds, durations inside strings) stays as written. A duration that does not
/// divide into whole milliseconds is an error: Prometheus has no finer resolution.
pub fn scale_rules(groups: &Value, factor: u32) -> Result<Value, String> {
    if factor == 0 {
        return Err("time-scaling factor 0".to_string());
    }
    let mut scaled = groups.clone();
    let groups = scaled
        .get_mut("groups")
        .and_then(Value::as_array_mut)
        .ok_or("no groups")?;
    for group in groups {
        let group_name = group["name"].as_str().unwrap_or_default().to_string();
        scale_field(group, "interval", factor).map_err(|e| format!("group {group_name}: {e}"))?;
        let rules = group
            .get_mut("rules")
            .and_then(Value::as_array_mut)
            .ok_or_else(|| format!("group {group_name}: no rules"))?;
        for rule in rules {
            let rule_name = rule
                .get("alert")
                .or_else(|| rule.get("record"))
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            let context = |e: String| format!("group {group_name}, rule {rule_name}: {e}");
            scale_field(rule, "for", factor).map_err(context)?;
            scale_field(rule, "keep_firing_for", factor).map_err(context)?;
            if let Some(Value::String(expr)) = rule.get_mut("expr") {
                *expr = scale_expr(expr, factor).map_err(|e| context(format!("expr: {e}")))?;
            }
        }
    }
    Ok(scaled)
}

/// The alerting rules of `groups` (a rules file), in file order; recording rules are left out.
pub fn alerts(groups: &Value) -> Result<Vec<Alert>, String> {
    #[derive(Deserialize)]
    struct RuleFile {
        groups: Vec<Group>,
    }
    #[derive(Deserialize)]
    struct Group {
        name: String,
        rules: Vec<Rule>,
    }
    #[derive(Deserialize)]
    struct Rule {
        alert: Option<String>,
        expr: String,
        #[serde(rename = "for")]
        for_: Option<String>,
        keep_firing_for: Option<String>,
        #[serde(default)]
        labels: BTreeMap<String, String>,
        #[serde(default)]
        annotations: BTreeMap<String, String>,
    }
    let file = RuleFile::deserialize(groups).map_err(|e| format!("rules file: {e}"))?;
    let mut alerts = Vec::new();
    for group in file.groups {
        for rule in group.rules {
            let Some(name) = rule.alert else { continue };
            let duration = |field: &str, text: Option<String>| {
                text.map_or(Ok(Duration::ZERO), |text| duration::parse(&text))
                    .map_err(|e| format!("group {}, alert {name}: {field}: {e}", group.name))
            };
            alerts.push(Alert {
                for_: duration("for", rule.for_)?,
                keep_firing_for: duration("keep_firing_for", rule.keep_firing_for)?,
                group: group.name.clone(),
                name,
                expr: rule.expr,
                labels: rule.labels,
                annotations: rule.annotations,
            });
        }
    }
    Ok(alerts)
}

/// Divides the duration string at `object[field]`, if there is one.
fn scale_field(object: &mut Value, field: &str, factor: u32) -> Result<(), String> {
    let Some(value) = object.get_mut(field) else {
        return Ok(());
    };
    let text = value
        .as_str()
        .ok_or_else(|| format!("{field}: not a duration string: {value}"))?;
    let scaled = duration::scale(text, factor).map_err(|e| format!("{field}: {e}"))?;
    *value = Value::String(scaled);
    Ok(())
}

/// `expr` with the durations PromQL takes (after `[`, after `:` inside brackets, after `offset`
/// and `offset -`) divided by `factor`. A small lexer rather than a pattern: strings (`"…"`,
/// `'…'`, `` `…` ``) and `#` comments are skipped whole, so a matcher value that looks like a
/// duration stays as written, and a duration anywhere else is an error rather than a guess.
fn scale_expr(expr: &str, factor: u32) -> Result<String, String> {
    let bytes = expr.as_bytes();
    let mut scaled = String::with_capacity(expr.len());
    let mut copied = 0;
    let mut at = 0;
    let mut in_brackets = false;
    // Whether the last token puts a duration next, and whether it was `offset` (then a `-` may
    // come between).
    let mut duration_next = false;
    let mut after_offset = false;
    while at < bytes.len() {
        let start = at;
        match bytes[at] {
            b' ' | b'\t' | b'\r' | b'\n' => {
                at += 1;
                continue;
            }
            b'#' => {
                at = expr[at..].find('\n').map_or(bytes.len(), |end| at + end);
                continue;
            }
            b'"' | b'\'' | b'`' => {
                at = string_end(bytes, at)
                    .ok_or_else(|| format!("unterminated string at byte {start}"))?;
                duration_next = false;
            }
            b'0'..=b'9' | b'.' => {
                at = token_end(bytes, at, |b| {
                    b.is_ascii_alphanumeric() || b == b'_' || b == b'.'
                });
                let token = &expr[start..at];
                if duration_next {
                    scaled.push_str(&expr[copied..start]);
                    scaled.push_str(&duration::scale(token, factor)?);
                    copied = at;
                } else if token.bytes().any(|b| b.is_ascii_alphabetic())
                    && duration::parse(token).is_ok()
                {
                    return Err(format!(
                        "duration {token} outside a range, subquery or offset"
                    ));
                }
                duration_next = false;
            }
            b if b.is_ascii_alphabetic() || b == b'_' || (b == b':' && !in_brackets) => {
                at = token_end(bytes, at, |b| {
                    b.is_ascii_alphanumeric() || b == b'_' || b == b':'
                });
                let offset = expr[start..at].eq_ignore_ascii_case("offset");
                duration_next = offset;
                after_offset = offset;
                continue;
            }
            b'[' => {
                in_brackets = true;
                duration_next = true;
                at += 1;
            }
            b':' => {
                duration_next = true;
                at += 1;
            }
            b'-' if after_offset => {
                at += 1;
            }
            b']' => {
                in_brackets = false;
                duration_next = false;
                at += 1;
            }
            _ => {
                duration_next = false;
                at += 1;
            }
        }
        after_offset = false;
    }
    scaled.push_str(&expr[copied..]);
    Ok(scaled)
}

/// The index past the closing quote of the string opening at `start`; backslash escapes count
/// in `"…"` and `'…'`, not in raw `` `…` `` strings.
fn string_end(bytes: &[u8], start: usize) -> Option<usize> {
    let quote = bytes[start];
    let mut at = start + 1;
    while at < bytes.len() {
        match bytes[at] {
            b'\\' if quote != b'`' => at += 2,
            b if b == quote => return Some(at + 1),
            _ => at += 1,
        }
    }
    None
}

fn token_end(bytes: &[u8], start: usize, belongs: impl Fn(u8) -> bool) -> usize {
    start + bytes[start..].iter().take_while(|&&b| belongs(b)).count()
}

/// `promtool check rules` on `groups` written as a rules file: the real Prometheus parser on
/// every expression. None when promtool is not installed.
#[cfg(test)]
pub(super) fn promtool_check_rules(groups: &Value) -> Option<Result<(), String>> {
    let file = tempfile::Builder::new()
        .suffix(".yaml")
        .tempfile()
        .expect("a temporary file");
    let yaml = serde_yaml::to_string(groups).expect("rules as YAML");
    std::fs::write(file.path(), yaml).expect("writing the rules file");
    let output = match std::process::Command::new("promtool")
        .args(["check", "rules"])
        .arg(file.path())
        .output()
    {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => return Some(Err(format!("running promtool: {e}"))),
        Ok(output) => output,
    };
    Some(if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "promtool check rules: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn shipped() -> Value {
        let path =
            crate::repository_root().join("kustomize/components/prometheus/prometheus_rule.yaml");
        let yaml =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        prometheus_rule_groups(&yaml).unwrap()
    }

    fn alert<'a>(alerts: &'a [Alert], name: &str) -> &'a Alert {
        alerts
            .iter()
            .find(|alert| alert.name == name)
            .unwrap_or_else(|| panic!("no alert {name}"))
    }

    /// One rule's expression scaled by `factor`, or the error.
    fn scaled(expr: &str, factor: u32) -> Result<String, String> {
        let groups = json!({"groups": [{"name": "g", "rules": [{"alert": "A", "expr": expr}]}]});
        scale_rules(&groups, factor).map(|groups| {
            groups["groups"][0]["rules"][0]["expr"]
                .as_str()
                .unwrap()
                .to_string()
        })
    }

    #[test]
    fn shipped_rules_scaled_by_20() {
        let original = alerts(&shipped()).unwrap();
        let scaled = alerts(&scale_rules(&shipped(), 20).unwrap()).unwrap();
        assert_eq!(scaled.len(), original.len());
        assert_eq!(scaled.len(), 13);

        let hit_ratio = alert(&original, "CdnHitRatioCollapse");
        assert_eq!(
            alert(&scaled, "CdnHitRatioCollapse").expr,
            hit_ratio
                .expr
                .replace("[10m]", "[30s]")
                .replace("[6h] offset 10m", "[18m] offset 30s")
        );
        assert!(hit_ratio.expr.contains("[6h] offset 10m"));

        let evicting = alert(&original, "CdnCacheEvictingFast");
        assert_eq!(
            alert(&scaled, "CdnCacheEvictingFast").expr,
            evicting
                .expr
                .replace("[1d] offset 1h", "[1h12m] offset 3m")
                .replace("[1h]", "[3m]")
        );
        assert!(evicting.expr.contains("[1d] offset 1h"));
        assert_eq!(
            alert(&scaled, "CdnCacheTierUnreachable").expr,
            alert(&original, "CdnCacheTierUnreachable")
                .expr
                .replace("[2m]", "[6s]")
        );

        let waiting = alert(&scaled, "CdnClusterWaitingSource");
        assert_eq!(waiting.for_, Duration::from_secs(90));
        let scaled_groups = scale_rules(&shipped(), 20).unwrap();
        let waiting_rule = &scaled_groups["groups"][0]["rules"][3];
        assert_eq!(waiting_rule["alert"], "CdnClusterWaitingSource");
        assert_eq!(waiting_rule["for"], "1m30s");
        assert_eq!(alert(&scaled, "AtFailed").for_, Duration::from_secs(3));
        assert_eq!(
            alert(&scaled, "CdnOperatorDown").for_,
            Duration::from_secs(30)
        );

        for (scaled, original) in scaled.iter().zip(&original) {
            assert_eq!(scaled.name, original.name);
            assert_eq!(scaled.for_ * 20, original.for_, "{}", original.name);
            assert_eq!(scaled.labels, original.labels);
            assert_eq!(scaled.annotations, original.annotations);
        }
    }

    #[test]
    fn factor_1_gives_the_rules_back() {
        assert_eq!(scale_rules(&shipped(), 1).unwrap(), shipped());
        let odd = "rate(x[90s] offset 60s) + max_over_time(y[1h0m:30000ms])";
        assert_eq!(scaled(odd, 1).unwrap(), odd);
    }

    #[test]
    fn subqueries_offsets_and_at_are_scaled_as_durations() {
        assert_eq!(
            scaled(
                "max_over_time(rate(x[5m])[1h:1m] offset -10m) @ start() + min_over_time(y[2h:] OFFSET 1d)",
                20
            )
            .unwrap(),
            "max_over_time(rate(x[15s])[3m:3s] offset -30s) @ start() + min_over_time(y[6m:] OFFSET 1h12m)"
        );
        assert_eq!(
            scaled("sum by (offset) (x[ 90s ] @ 1609746000)", 20).unwrap(),
            "sum by (offset) (x[ 4s500ms ] @ 1609746000)"
        );
        assert_eq!(
            scaled("job:rate5m:sum{a=\"b\"}[30m] > 1e-3", 20).unwrap(),
            "job:rate5m:sum{a=\"b\"}[1m30s] > 1e-3"
        );
    }

    #[test]
    fn strings_and_comments_keep_their_durations() {
        let expr = "rate(x{le=\"5m\", a='[1h] offset 2h', b=~`\\[10m]`, c=\"\\\"[5m]\"}[10m]) # [1h] offset 1d\n  > 0.5";
        assert_eq!(
            scaled(expr, 20).unwrap(),
            expr.replacen("}[10m])", "}[30s])", 1)
        );
    }

    #[test]
    fn bad_durations_are_errors() {
        let error = scaled("rate(x[1ms])", 20).unwrap_err();
        assert!(error.contains("whole number of milliseconds"), "{error}");
        for expr in [
            "rate(x[5x])",
            "rate(x[5])",
            "rate(x[5m1h])",
            "x offset 5mm",
            "x > 5m",
            "x{a=\"5m}",
        ] {
            assert!(scaled(expr, 20).is_err(), "{expr} scaled");
        }
        let groups = json!({"groups": [{"name": "g", "rules": [{"alert": "A", "expr": "x", "for": "1ms"}]}]});
        let error = scale_rules(&groups, 20).unwrap_err();
        assert!(error.contains("group g, rule A: for:"), "{error}");
        assert!(scale_rules(&shipped(), 0).is_err());
        let groups = json!({"groups": [{"name": "g", "interval": "10x", "rules": []}]});
        assert!(scale_rules(&groups, 1).is_err());
    }

    #[test]
    fn the_prometheus_rule_of_a_render_is_found() {
        let rule = "kind: PrometheusRule\nmetadata: {name: r}\nspec:\n  groups: []\n";
        let render = format!("---\n# Source: a comment alone\n---\nkind: ConfigMap\n---\n{rule}");
        assert_eq!(
            prometheus_rule_groups(&render).unwrap(),
            json!({"groups": []})
        );
        assert!(prometheus_rule_groups("kind: ConfigMap\n").is_err());
        assert!(prometheus_rule_groups(&format!("{rule}---\n{rule}")).is_err());
        assert!(prometheus_rule_groups("kind: PrometheusRule\nspec: {}\n").is_err());
    }

    #[test]
    fn scaled_shipped_rules_pass_promtool() {
        let scaled = scale_rules(&shipped(), 20).unwrap();
        match promtool_check_rules(&scaled) {
            None => crate::say("monitoring::rules promtool check skipped: no promtool"),
            Some(result) => result.unwrap(),
        }
    }
}
