//! The shipped Grafana dashboards' queries as Grafana sends them to Prometheus, so the end-to-end
//! test can evaluate every panel against a real Prometheus: each target of each panel, with the
//! dashboard's template variables and Grafana's built-in interval variables substituted.
//!
//! Substitution follows Grafana's template service and its Prometheus data source: `$var`,
//! `${var}`, `${var:format}`, `[[var]]` and `[[var:format]]`. A variable with `multi` or
//! `includeAll` has its values regex-escaped and, when several, joined as `(a|b)`, wherever it
//! appears (Grafana does not look at the matcher around it); "All" is the variable's `allValue`
//! as written, or else every value. `$__interval`, `$__rate_interval` and `$__range` (and their
//! `_ms`, `_s` forms) are written as Grafana's Prometheus backend writes them. Panel and target
//! "Min interval" settings are not modelled: the shipped dashboards set none.

use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::time::Duration;

/// One target of one panel: what Grafana asks Prometheus for.
#[derive(Clone, Debug, PartialEq)]
pub struct PanelQuery {
    pub dashboard: String,
    /// The row the panel sits in, if any: panel titles repeat across rows.
    pub row: Option<String>,
    pub panel: String,
    pub ref_id: String,
    pub expr: String,
    /// A target switched off in the editor (`"hide": true`): Grafana does not send it.
    pub hidden: bool,
}

/// A dashboard variable whose values come from Prometheus: the test resolves `query` (see
/// [`parse_label_values`]) after substituting the variables before it.
#[derive(Clone, Debug, PartialEq)]
pub struct VariableQuery {
    pub name: String,
    pub query: String,
    pub multi: bool,
    pub include_all: bool,
    /// What "All" stands for when set; otherwise "All" is every value.
    pub all_value: Option<String>,
}

/// What a variable is set to in the dashboard's picker.
#[derive(Clone, Debug, PartialEq)]
pub enum Selection {
    /// The values picked (exactly one for a variable without `multi`).
    Values(Vec<String>),
    /// "All", with every value the variable offers (used when it has no `allValue`).
    All(Vec<String>),
}

/// The values of Grafana's built-in time variables for a query.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Intervals {
    /// The data source's scrape interval, Grafana's minimum step.
    pub scrape: Duration,
    /// The query's step: `$__interval`.
    pub interval: Duration,
    /// The dashboard's time range: `$__range`.
    pub range: Duration,
}

/// The variables' selections and the built-in intervals, to substitute into queries.
#[derive(Clone, Debug)]
pub struct Variables {
    intervals: Intervals,
    selected: BTreeMap<String, (VariableQuery, Selection)>,
}

impl Variables {
    pub fn new(intervals: Intervals) -> Variables {
        Variables {
            intervals,
            selected: BTreeMap::new(),
        }
    }

    /// Sets `variable` as its picker would: an error for a choice the picker does not offer.
    pub fn select(&mut self, variable: &VariableQuery, selection: Selection) -> Result<(), String> {
        let name = &variable.name;
        match &selection {
            Selection::All(_) if !variable.include_all => {
                return Err(format!("variable {name} has no All"));
            }
            Selection::Values(values) if values.is_empty() => {
                return Err(format!("variable {name}: no value selected"));
            }
            Selection::Values(values) if !variable.multi && values.len() > 1 => {
                return Err(format!("variable {name} takes one value, not {values:?}"));
            }
            _ => {}
        }
        self.selected
            .insert(name.clone(), (variable.clone(), selection));
        Ok(())
    }

    /// `text` with every variable reference replaced as Grafana does before sending it to
    /// Prometheus. A reference to a variable not selected (undefined, a data source variable, or
    /// one not selected yet) is an error, except `$1`-like ones, which Grafana leaves as written
    /// for `label_replace`'s capture groups.
    pub fn substitute(&self, text: &str) -> Result<String, String> {
        let mut substituted = String::with_capacity(text.len());
        let mut rest = text;
        while let Some(at) = rest.find(['$', '[']) {
            substituted.push_str(&rest[..at]);
            let Some((reference, after)) = parse_reference(&rest[at..]) else {
                substituted.push_str(&rest[at..at + 1]);
                rest = &rest[at + 1..];
                continue;
            };
            let written = &rest[at..rest.len() - after.len()];
            substituted.push_str(&self.value_of(&reference, written)?);
            rest = after;
        }
        substituted.push_str(rest);
        Ok(substituted)
    }

    fn value_of(&self, reference: &Reference, written: &str) -> Result<String, String> {
        if let Some(value) = self.builtin(reference.name) {
            return match reference.format {
                None => Ok(value),
                Some(format) => Err(format!("{written}: format {format} of a built-in variable")),
            };
        }
        if let Some((variable, selection)) = self.selected.get(reference.name) {
            return interpolate(variable, selection, reference.format)
                .map_err(|e| format!("{written}: {e}"));
        }
        if reference.name.bytes().all(|b| b.is_ascii_digit()) {
            return Ok(written.to_string());
        }
        Err(format!("{written}: no such variable selected"))
    }

    /// Grafana's built-in time variables, as its Prometheus backend writes them.
    fn builtin(&self, name: &str) -> Option<String> {
        let Intervals {
            scrape,
            interval,
            range,
        } = self.intervals;
        // Grafana's definition: room for at least 4 scrapes, and for one more than the step.
        let rate_interval = (interval + scrape).max(scrape * 4);
        let range_s = (range.as_millis() + 500) / 1000;
        Some(match name {
            "__interval" => grafana_interval(interval),
            "__interval_ms" => interval.as_millis().to_string(),
            "__rate_interval" => go_duration(rate_interval),
            "__rate_interval_ms" => rate_interval.as_millis().to_string(),
            "__range" => format!("{range_s}s"),
            "__range_s" => range_s.to_string(),
            "__range_ms" => range.as_millis().to_string(),
            _ => return None,
        })
    }
}

/// A variable reference as Grafana's template service finds them.
struct Reference<'a> {
    name: &'a str,
    format: Option<&'a str>,
}

/// The reference at the start of `text` (`$name`, `${name}`, `${name:format}`, `[[name]]`,
/// `[[name:format]]`) and the text after it; None when `text` starts with none.
fn parse_reference(text: &str) -> Option<(Reference<'_>, &str)> {
    let word_len = |s: &str| {
        s.bytes()
            .take_while(|b| b.is_ascii_alphanumeric() || *b == b'_')
            .count()
    };
    let (inner, after) = if let Some(braced) = text.strip_prefix("${") {
        let close = braced.find('}')?;
        (&braced[..close], &braced[close + 1..])
    } else if let Some(bracketed) = text.strip_prefix("[[") {
        let close = bracketed.find("]]")?;
        (&bracketed[..close], &bracketed[close + 2..])
    } else {
        let rest = text.strip_prefix('$')?;
        let len = word_len(rest);
        return (len > 0).then(|| {
            let reference = Reference {
                name: &rest[..len],
                format: None,
            };
            (reference, &rest[len..])
        });
    };
    let len = word_len(inner);
    let format = match &inner[len..] {
        "" => None,
        tail => Some(tail.strip_prefix(':').filter(|format| !format.is_empty())?),
    };
    (len > 0).then_some((
        Reference {
            name: &inner[..len],
            format,
        },
        after,
    ))
}

/// A selected variable's text in a query: Grafana's Prometheus data source formatting unless
/// the reference names a format.
fn interpolate(
    variable: &VariableQuery,
    selection: &Selection,
    format: Option<&str>,
) -> Result<String, String> {
    let values = match (selection, &variable.all_value) {
        // Grafana writes a custom all value as it is, whatever the format.
        (Selection::All(_), Some(all_value)) => return Ok(all_value.clone()),
        (Selection::All(values) | Selection::Values(values), _) => values,
    };
    let either = |escape: fn(&str) -> String| {
        let escaped: Vec<String> = values.iter().map(|value| escape(value)).collect();
        match escaped.as_slice() {
            [one] => one.clone(),
            many => format!("({})", many.join("|")),
        }
    };
    Ok(match format {
        None if !variable.multi && !variable.include_all => prometheus_regular_escape(&values[0]),
        None => either(prometheus_regex_escape),
        Some("regex") => either(regex_escape),
        Some("pipe") => values.join("|"),
        Some("csv" | "raw") => values.join(","),
        Some(other) => return Err(format!("format {other} is not modelled")),
    })
}

/// Grafana's escaping of a single-valued variable's value: backslashes and single quotes, for a
/// string literal.
fn prometheus_regular_escape(value: &str) -> String {
    value.replace('\\', "\\\\").replace('\'', "\\\\'")
}

/// Grafana's escaping of a multi-value or All variable's values: regex metacharacters escaped
/// for a regex inside a PromQL string literal, hence the doubled backslashes.
fn prometheus_regex_escape(value: &str) -> String {
    let mut escaped = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => escaped.push_str("\\\\\\\\"),
            '$' | '^' | '*' | '{' | '}' | '[' | ']' | '+' | '?' | '.' | '(' | ')' | '|' => {
                escaped.push_str("\\\\");
                escaped.push(c);
            }
            _ => escaped.push(c),
        }
    }
    escaped
}

/// Grafana's `regex` format: a regex escape with single backslashes (which a PromQL string
/// literal rejects: `"\."` is not a PromQL escape).
fn regex_escape(value: &str) -> String {
    let mut escaped = String::with_capacity(value.len());
    for c in value.chars() {
        if "\\^$*+?.()|[]{}/".contains(c) {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

/// `$__interval` as Grafana writes it: the count of its largest unit only (90s is `1m`).
fn grafana_interval(interval: Duration) -> String {
    const UNITS: [(&str, u128); 6] = [
        ("y", 365 * 24 * 3600 * 1000),
        ("d", 24 * 3600 * 1000),
        ("h", 3600 * 1000),
        ("m", 60 * 1000),
        ("s", 1000),
        ("ms", 1),
    ];
    let millis = interval.as_millis();
    UNITS
        .iter()
        .find(|(_, unit_ms)| millis >= *unit_ms)
        .map_or("1ms".to_string(), |(unit, unit_ms)| {
            format!("{}{unit}", millis / unit_ms)
        })
}

/// `$__rate_interval` as Grafana writes it: Go's `time.Duration.String()` (`1h0m0s`, `1m30s`,
/// `6s`, and `1.5s`, which Prometheus does not parse: a scrape interval with a fraction of a
/// second can give Grafana a query Prometheus rejects).
fn go_duration(duration: Duration) -> String {
    let nanos = duration.as_nanos();
    if nanos == 0 {
        return "0s".to_string();
    }
    if nanos < 1_000_000_000 {
        let (unit, scale) = if nanos < 1_000 {
            ("ns", 1)
        } else if nanos < 1_000_000 {
            ("µs", 1_000)
        } else {
            ("ms", 1_000_000)
        };
        return format!("{}{unit}", decimal(nanos, scale));
    }
    let seconds = nanos / 1_000_000_000;
    let (hours, minutes) = (seconds / 3600, seconds / 60 % 60);
    let mut text = String::new();
    if hours > 0 {
        write!(text, "{hours}h").expect("writing to a String");
    }
    if hours > 0 || minutes > 0 {
        write!(text, "{minutes}m").expect("writing to a String");
    }
    let second_nanos = nanos % 60_000_000_000;
    text + &decimal(second_nanos, 1_000_000_000) + "s"
}

/// `value / scale` in decimal, without trailing zeros (`scale` a power of ten).
fn decimal(value: u128, scale: u128) -> String {
    let (whole, fraction) = (value / scale, value % scale);
    if fraction == 0 {
        return whole.to_string();
    }
    let width = scale.ilog10() as usize;
    let fraction = format!("{fraction:0width$}");
    format!("{whole}.{}", fraction.trim_end_matches('0'))
}

/// The dashboard's query variables, in order (each may use the ones before it). Data source
/// variables are left out: they pick the data source and appear in no expression. Other
/// variable types, and a `regex` filter on values, are errors: nothing here resolves them.
pub fn variable_queries(dashboard_json: &str) -> Result<Vec<VariableQuery>, String> {
    let dashboard = parse(dashboard_json)?;
    let mut queries = Vec::new();
    for variable in array(&dashboard["templating"]["list"]) {
        let name = variable["name"]
            .as_str()
            .ok_or("a variable without a name")?;
        match variable["type"].as_str() {
            Some("datasource") => continue,
            Some("query") => {}
            other => return Err(format!("variable {name}: type {other:?} is not modelled")),
        }
        if variable["regex"]
            .as_str()
            .is_some_and(|regex| !regex.is_empty())
        {
            return Err(format!("variable {name}: a regex filter is not modelled"));
        }
        // Newer dashboards hold the query in an object, older ones as a string.
        let query = variable["query"]["query"]
            .as_str()
            .or(variable["query"].as_str())
            .ok_or_else(|| format!("variable {name}: no query"))?;
        queries.push(VariableQuery {
            name: name.to_string(),
            query: query.to_string(),
            multi: variable["multi"] == true,
            include_all: variable["includeAll"] == true,
            all_value: variable["allValue"]
                .as_str()
                .filter(|all| !all.is_empty())
                .map(str::to_string),
        });
    }
    Ok(queries)
}

/// The series selector and label of a `label_values(selector, label)` variable query, which
/// Grafana resolves with `/api/v1/series`; None for any other query.
pub fn parse_label_values(query: &str) -> Option<(String, String)> {
    let arguments = query
        .trim()
        .strip_prefix("label_values(")?
        .strip_suffix(')')?;
    // The label name has no comma; the selector may.
    let (selector, label) = arguments.rsplit_once(',')?;
    let (selector, label) = (selector.trim(), label.trim());
    let mut label_bytes = label.bytes();
    let label_name = label_bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && label_bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_');
    (label_name && !selector.is_empty()).then(|| (selector.to_string(), label.to_string()))
}

/// Every target of every panel (also the panels of collapsed rows), substituted by `variables`.
/// Targets without an expression are left out, as Grafana does not send them; hidden ones are
/// listed with `hidden`, for the test to skip and say so.
pub fn panel_queries(
    dashboard_json: &str,
    variables: &Variables,
) -> Result<Vec<PanelQuery>, String> {
    let dashboard = parse(dashboard_json)?;
    let title = dashboard["title"].as_str().unwrap_or_default();
    let mut queries = Vec::new();
    let mut row: Option<&str> = None;
    for panel in array(&dashboard["panels"]) {
        // An expanded row's panels follow it; a collapsed row holds its own.
        if panel["type"] == "row" {
            row = panel["title"].as_str();
        }
        let nested = array(&panel["panels"])
            .iter()
            .map(|nested| (panel["title"].as_str(), nested));
        for (row, panel) in std::iter::once((row, panel)).chain(nested) {
            let panel_title = panel["title"].as_str().unwrap_or_default();
            for target in array(&panel["targets"]) {
                let Some(expr) = target["expr"].as_str().filter(|expr| !expr.is_empty()) else {
                    continue;
                };
                let ref_id = target["refId"].as_str().unwrap_or_default();
                let expr = variables.substitute(expr).map_err(|e| {
                    format!("dashboard {title}, panel {panel_title}, target {ref_id}: {e}")
                })?;
                queries.push(PanelQuery {
                    dashboard: title.to_string(),
                    row: row.map(str::to_string),
                    panel: panel_title.to_string(),
                    ref_id: ref_id.to_string(),
                    expr,
                    hidden: target["hide"] == true,
                });
            }
        }
    }
    Ok(queries)
}

fn parse(dashboard_json: &str) -> Result<Value, String> {
    serde_json::from_str(dashboard_json).map_err(|e| format!("dashboard JSON: {e}"))
}

fn array(value: &Value) -> &[Value] {
    value.as_array().map_or(&[], Vec::as_slice)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::monitoring::rules::promtool_check_rules;
    use serde_json::json;

    /// The time-scaled end-to-end run's intervals: scrapes every 1.5 s, a 3-minute range.
    const INTERVALS: Intervals = Intervals {
        scrape: Duration::from_millis(1500),
        interval: Duration::from_secs(1),
        range: Duration::from_secs(180),
    };

    fn shipped(name: &str) -> String {
        let path = crate::repository_root()
            .join("kustomize/components/grafana-dashboards")
            .join(name);
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    /// The variables of `dashboard` set to made-up values, with dots for the regex escaping:
    /// "All" everywhere it is offered, or the values themselves.
    fn select_all(dashboard: &str, all: bool) -> (Variables, Vec<String>) {
        let mut variables = Variables::new(INTERVALS);
        let mut resolved = Vec::new();
        for variable in variable_queries(dashboard).unwrap() {
            let query = variables.substitute(&variable.query).unwrap();
            let (selector, _) = parse_label_values(&query)
                .unwrap_or_else(|| panic!("{}: not label_values(selector, label)", variable.name));
            resolved.push(selector);
            let values: Vec<String> = ["a.example", "b"]
                .iter()
                .map(|value| format!("{}-{value}", variable.name))
                .collect();
            let selection = match (all, variable.include_all, variable.multi) {
                (true, true, _) => Selection::All(values),
                (_, _, true) => Selection::Values(values),
                _ => Selection::Values(values[..1].to_vec()),
            };
            variables.select(&variable, selection).unwrap();
        }
        (variables, resolved)
    }

    #[test]
    fn shipped_dashboards_queries_pass_promtool() {
        let mut exprs = Vec::new();
        for (name, targets) in [("cdn-clusters.json", 44), ("cdn-operator.json", 21)] {
            let dashboard = shipped(name);
            for all in [true, false] {
                let (variables, selectors) = select_all(&dashboard, all);
                let queries = panel_queries(&dashboard, &variables).unwrap();
                assert_eq!(queries.len(), targets, "{name}");
                for query in &queries {
                    assert!(!query.hidden, "{query:?}");
                    assert!(!query.expr.contains('$'), "{query:?}");
                    assert!(query.row.is_some(), "{query:?}");
                }
                exprs.extend(selectors);
                exprs.extend(queries.into_iter().map(|query| query.expr));
            }
        }
        let rules: Vec<Value> = exprs
            .iter()
            .enumerate()
            .map(|(n, expr)| json!({"record": format!("dashboard:query:{n}"), "expr": expr}))
            .collect();
        let groups = json!({"groups": [{"name": "dashboards", "rules": rules}]});
        match promtool_check_rules(&groups) {
            None => crate::say("monitoring::dashboards promtool check skipped: no promtool"),
            Some(result) => result.unwrap(),
        }
    }

    const TINY: &str = r#"{
      "title": "Tiny",
      "templating": {"list": [
        {"name": "datasource", "type": "datasource", "query": "prometheus"},
        {"name": "ns", "type": "query", "query": {"query": "label_values(up, namespace)"},
         "multi": true, "includeAll": true, "allValue": null},
        {"name": "cluster", "type": "query",
         "query": "label_values(up{namespace=~\"$ns\"}, cluster)",
         "multi": true, "includeAll": true, "allValue": ".*"},
        {"name": "pod", "type": "query",
         "query": {"query": "label_values(up{namespace=~\"$ns\", cluster=~\"${cluster}\"}, pod)"},
         "multi": false, "includeAll": false}
      ]},
      "panels": [
        {"type": "stat", "title": "Top", "targets": [
          {"refId": "A", "expr": "sum(rate(x{namespace=~\"$ns\", cluster=~\"${cluster}\"}[$__rate_interval]))"},
          {"refId": "B", "expr": "x{pod=\"[[pod]]\"}", "hide": true},
          {"refId": "C", "expr": ""}
        ]},
        {"type": "row", "title": "Collapsed", "collapsed": true, "panels": [
          {"type": "timeseries", "title": "Inside", "targets": [
            {"refId": "A", "expr": "label_replace(avg_over_time(x{namespace=~\"${ns:pipe}\"}[$__interval] offset $__range), \"p\", \"$1\", \"pod\", \"(.*)\")"}
          ]}
        ]},
        {"type": "row", "title": "Open", "panels": []},
        {"type": "timeseries", "title": "After", "targets": [
          {"refId": "A", "expr": "x{pod='$pod', namespace=~\"[[ns:regex]]\"} / $__range_s"}
        ]}
      ]
    }"#;

    #[test]
    fn tiny_dashboard_substituted_as_grafana_does() {
        let definitions = variable_queries(TINY).unwrap();
        let names: Vec<&str> = definitions.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(names, ["ns", "cluster", "pod"]);
        assert_eq!(definitions[0].all_value, None);
        assert_eq!(definitions[1].all_value.as_deref(), Some(".*"));

        let mut variables = Variables::new(INTERVALS);
        assert!(variables.substitute(&definitions[1].query).is_err());
        let ns = Selection::Values(vec!["a.b".to_string(), "c".to_string()]);
        variables.select(&definitions[0], ns).unwrap();
        let cluster_query = variables.substitute(&definitions[1].query).unwrap();
        assert_eq!(
            cluster_query,
            r#"label_values(up{namespace=~"(a\\.b|c)"}, cluster)"#
        );
        assert_eq!(
            parse_label_values(&cluster_query),
            Some((
                r#"up{namespace=~"(a\\.b|c)"}"#.to_string(),
                "cluster".to_string()
            ))
        );
        let all_clusters = Selection::All(vec!["x".to_string(), "y".to_string()]);
        variables.select(&definitions[1], all_clusters).unwrap();
        assert_eq!(
            parse_label_values(&variables.substitute(&definitions[2].query).unwrap()),
            Some((
                r#"up{namespace=~"(a\\.b|c)", cluster=~".*"}"#.to_string(),
                "pod".to_string()
            ))
        );
        let pod = Selection::Values(vec!["web-0".to_string()]);
        variables.select(&definitions[2], pod).unwrap();

        let queries = panel_queries(TINY, &variables).unwrap();
        let listed: Vec<(Option<&str>, &str, &str, &str, bool)> = queries
            .iter()
            .map(|q| {
                (
                    q.row.as_deref(),
                    q.panel.as_str(),
                    q.ref_id.as_str(),
                    q.expr.as_str(),
                    q.hidden,
                )
            })
            .collect();
        assert_eq!(
            listed,
            [
                (
                    None,
                    "Top",
                    "A",
                    r#"sum(rate(x{namespace=~"(a\\.b|c)", cluster=~".*"}[6s]))"#,
                    false
                ),
                (None, "Top", "B", r#"x{pod="web-0"}"#, true),
                (
                    Some("Collapsed"),
                    "Inside",
                    "A",
                    r#"label_replace(avg_over_time(x{namespace=~"a.b|c"}[1s] offset 180s), "p", "$1", "pod", "(.*)")"#,
                    false
                ),
                (
                    Some("Open"),
                    "After",
                    "A",
                    r#"x{pod='web-0', namespace=~"(a\.b|c)"} / 180"#,
                    false
                ),
            ]
        );
        assert!(queries.iter().all(|q| q.dashboard == "Tiny"));
    }

    #[test]
    fn all_without_all_value_is_every_value_and_one_value_has_no_parentheses() {
        let definitions = variable_queries(TINY).unwrap();
        let mut variables = Variables::new(INTERVALS);
        let every = Selection::All(vec!["a".to_string(), "b(1)".to_string()]);
        variables.select(&definitions[0], every).unwrap();
        assert_eq!(
            variables.substitute("{n=~\"$ns\"}").unwrap(),
            r#"{n=~"(a|b\\(1\\))"}"#
        );
        variables
            .select(&definitions[0], Selection::Values(vec!["a\\b".to_string()]))
            .unwrap();
        assert_eq!(
            variables.substitute("{n=~\"$ns\"}").unwrap(),
            r#"{n=~"a\\\\b"}"#
        );
        variables
            .select(&definitions[2], Selection::Values(vec!["it's".to_string()]))
            .unwrap();
        assert_eq!(variables.substitute("$pod").unwrap(), r"it\\'s");
    }

    #[test]
    fn mistakes_are_errors() {
        let definitions = variable_queries(TINY).unwrap();
        let mut variables = Variables::new(INTERVALS);
        let two = Selection::Values(vec!["a".to_string(), "b".to_string()]);
        assert!(variables.select(&definitions[2], two).is_err());
        assert!(variables
            .select(&definitions[2], Selection::All(vec![]))
            .is_err());
        assert!(variables
            .select(&definitions[0], Selection::Values(vec![]))
            .is_err());
        for text in ["$nope", "${datasource}", "[[ns]]", "${__interval:csv}"] {
            assert!(variables.substitute(text).is_err(), "{text} substituted");
        }
        for text in ["$", "${}", "$-1", "x[5m]", "[[", "${1}", "$1"] {
            assert_eq!(variables.substitute(text).unwrap(), text);
        }
        let regex = r#"{"templating": {"list": [{"name": "v", "type": "query", "query": "q", "regex": "/a/"}]}}"#;
        assert!(variable_queries(regex).is_err());
        let custom =
            r#"{"templating": {"list": [{"name": "v", "type": "custom", "query": "a,b"}]}}"#;
        assert!(variable_queries(custom).is_err());
        for query in [
            "label_values(namespace)",
            "label_values(up, )",
            "query_result(up)",
        ] {
            assert_eq!(parse_label_values(query), None, "{query}");
        }
    }

    #[test]
    fn builtin_intervals_are_written_as_grafana_writes_them() {
        for (millis, interval, go) in [
            (500, "500ms", "500ms"),
            (6_000, "6s", "6s"),
            (11_500, "11s", "11.5s"),
            (90_000, "1m", "1m30s"),
            (3_600_000, "1h", "1h0m0s"),
            (90_061_250, "1d", "25h1m1.25s"),
        ] {
            let duration = Duration::from_millis(millis);
            assert_eq!(grafana_interval(duration), interval, "{millis}");
            assert_eq!(go_duration(duration), go, "{millis}");
        }
        assert_eq!(go_duration(Duration::from_micros(1500)), "1.5ms");
        let wide = Variables::new(Intervals {
            scrape: Duration::from_secs(15),
            interval: Duration::from_secs(60),
            range: Duration::from_millis(3_600_499),
        });
        assert_eq!(
            wide.substitute(
                "$__rate_interval ${__rate_interval_ms} $__interval_ms $__range $__range_ms"
            )
            .unwrap(),
            "1m15s 75000 60000 3600s 3600499"
        );
    }
}
