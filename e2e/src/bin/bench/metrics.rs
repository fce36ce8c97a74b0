//! What the benchmark reads from the operator's own /metrics: its CdnCluster reconciles
//! (`controller_runtime_reconcile_*`), and its requests to the API server as it counts them
//! (`rest_client_requests_total`), checked against the counting proxy's count ([`Requests`]).

use cdn_operator_e2e::proxy::{Counts, Proxy};
use cdn_operator_e2e::Operator;
use std::time::{Duration, Instant};

/// The operator's CdnCluster reconciles so far: how many (`controller_runtime_reconcile_total`),
/// and their time (`controller_runtime_reconcile_time_seconds`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Reconciles {
    pub count: f64,
    seconds: f64,
    pub over_1s: f64,
}

impl Reconciles {
    pub fn of(operator: &Operator) -> Option<Reconciles> {
        let labels = "controller=\"cdncluster\"";
        let metric = |name: &str, labels: &str| operator.metric_sum(name, labels);
        let time = "controller_runtime_reconcile_time_seconds";
        let timed = metric(&format!("{time}_count"), labels)?;
        let within_1s = metric(&format!("{time}_bucket"), &format!("le=\"1.0\",{labels}"))?;
        Some(Reconciles {
            count: metric("controller_runtime_reconcile_total", labels)?,
            seconds: metric(&format!("{time}_sum"), labels)?,
            over_1s: timed - within_1s,
        })
    }

    pub fn since(self, before: Reconciles) -> Reconciles {
        Reconciles {
            count: self.count - before.count,
            seconds: self.seconds - before.seconds,
            over_1s: self.over_1s - before.over_1s,
        }
    }

    pub fn mean_ms(self) -> f64 {
        self.seconds * 1000.0 / self.count
    }
}

const CLIENT_REQUESTS: &str = "rest_client_requests_total";

/// The requests an exposition's `rest_client_requests_total{verb, resource, code}` counts, by
/// "verb resource" as the proxy keys them (`patch configmaps`), whatever their code. None when it
/// has no such series.
fn client_requests(text: &str) -> Option<Counts> {
    let mut counts = Counts::default();
    let mut found = false;
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(CLIENT_REQUESTS) else {
            continue;
        };
        let Some((set, value)) = rest.strip_prefix('{').and_then(|r| r.rsplit_once("} ")) else {
            continue;
        };
        let labels = labels(set);
        let label = |name: &str| {
            labels
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.as_str())
        };
        let (Some(verb), Some(resource), Ok(value)) = (
            label("verb"),
            label("resource"),
            value.trim().parse::<f64>(),
        ) else {
            continue;
        };
        found = true;
        *counts.0.entry(format!("{verb} {resource}")).or_insert(0) += value as u64;
    }
    found.then_some(counts)
}

/// The labels of a series, `a="x",b="y"`, their values unescaped.
fn labels(set: &str) -> Vec<(&str, String)> {
    let mut labels = Vec::new();
    let mut rest = set;
    while let Some((name, tail)) = rest.split_once("=\"") {
        let mut value = String::new();
        let mut end = tail.len();
        let mut chars = tail.char_indices();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, other)) => value.push(other),
                    None => {}
                },
                '"' => {
                    end = i;
                    break;
                }
                c => value.push(c),
            }
        }
        labels.push((name.trim_start_matches(',').trim(), value));
        rest = tail.get(end + 1..).unwrap_or_default();
    }
    labels
}

/// The operator's requests by verb and resource, counted two ways: by the operator itself (its
/// `rest_client_requests_total`, which the benchmark's figures read) and by the counting proxy
/// they all pass through. The two must agree on the writes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Requests {
    pub operator: Counts,
    pub proxy: Counts,
}

impl Requests {
    /// Both counts now: the operator's, scraped, and the proxy's since `before_operator` (its
    /// counts when the operator started). The proxy counts a request as it arrives, the operator
    /// once answered, so a write in flight is the proxy's alone for a moment: both are read
    /// again until they agree on the writes, for up to 5 s. An error when the operator exports
    /// no `rest_client_requests_total`.
    pub async fn take(
        proxy: &Proxy,
        before_operator: &Counts,
        operator: &Operator,
    ) -> Result<Requests, String> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let by_proxy = proxy.counts().since(before_operator);
            let Some(by_operator) = client_requests(&operator.metrics_text()) else {
                return Err(format!(
                    "the operator exports no {CLIENT_REQUESTS} on its /metrics: its writes cannot be counted"
                ));
            };
            let requests = Requests {
                operator: by_operator,
                proxy: by_proxy,
            };
            if requests.disagreements().is_empty() || Instant::now() > deadline {
                return Ok(requests);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// What happened between `before` and `self`, by each count.
    pub fn since(&self, before: &Requests) -> Requests {
        Requests {
            operator: self.operator.since(&before.operator),
            proxy: self.proxy.since(&before.proxy),
        }
    }

    /// The writes the two count differently, each as `verb resource: N by the operator, M by
    /// the proxy`; none when they agree.
    pub fn disagreements(&self) -> Vec<String> {
        let (operator, proxy) = (self.operator.only_writes(), self.proxy.only_writes());
        let mut keys: Vec<&String> = operator.0.keys().chain(proxy.0.keys()).collect();
        keys.sort();
        keys.dedup();
        keys.into_iter()
            .filter_map(|key| {
                let count = |counts: &Counts| counts.0.get(key).copied().unwrap_or(0);
                let (by_operator, by_proxy) = (count(&operator), count(&proxy));
                (by_operator != by_proxy).then(|| {
                    format!("{key}: {by_operator} by the operator, {by_proxy} by the proxy")
                })
            })
            .collect()
    }
}

/// Fails, loudly, when the operator's own count of its writes in a phase (its
/// `rest_client_requests_total`, which the figures read) differs from the proxy's.
pub fn writes_agree(phases: &[(&str, &Requests)]) -> Result<(), String> {
    let disagreements: Vec<String> = phases
        .iter()
        .flat_map(|(phase, requests)| {
            let differ = requests.disagreements();
            differ.into_iter().map(move |d| format!("{phase}: {d}"))
        })
        .collect();
    if disagreements.is_empty() {
        return Ok(());
    }
    Err(format!(
        "FAILED: the operator's own count of its writes (rest_client_requests_total) and the proxy's differ:\n{}",
        disagreements.join("\n")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# HELP rest_client_requests Requests to the API server.\n\
# TYPE rest_client_requests counter\n\
rest_client_requests_total{verb=\"patch\",resource=\"configmaps\",code=\"200\"} 7\n\
rest_client_requests_total{verb=\"patch\",resource=\"configmaps\",code=\"409\"} 1\n\
rest_client_requests_total{verb=\"patch\",resource=\"cdnclusters/status\",code=\"<error>\"} 2\n\
rest_client_requests_total{verb=\"watch\",resource=\"deployments\",code=\"200\"} 3\n\
rest_client_requests_total{verb=\"get\",resource=\"/version\",code=\"200\"} 1\n\
rest_client_requests_created{verb=\"patch\",resource=\"configmaps\",code=\"200\"} 1.7e9\n\
controller_runtime_reconcile_total{controller=\"cdncluster\",result=\"success\"} 5\n\
# EOF\n";

    fn counts(pairs: &[(&str, u64)]) -> Counts {
        Counts(pairs.iter().map(|(k, n)| (k.to_string(), *n)).collect())
    }

    #[test]
    fn the_operator_s_requests_are_keyed_as_the_proxy_keys_them_whatever_their_code() {
        assert_eq!(
            client_requests(TEXT),
            Some(counts(&[
                ("get /version", 1),
                ("patch cdnclusters/status", 2),
                ("patch configmaps", 8),
                ("watch deployments", 3),
            ]))
        );
        assert_eq!(client_requests("# EOF\n"), None);
        assert_eq!(
            labels(r#"verb="patch",resource="a\"b",code="200""#),
            [
                ("verb", "patch".to_string()),
                ("resource", "a\"b".to_string()),
                ("code", "200".to_string())
            ]
        );
    }

    #[test]
    fn the_two_counts_must_agree_on_the_writes_only() {
        let before = Requests::default();
        let agreeing = Requests {
            operator: counts(&[("patch configmaps", 3), ("watch pods", 2)]),
            proxy: counts(&[("patch configmaps", 3), ("watch pods", 1)]),
        };
        assert!(agreeing.since(&before).disagreements().is_empty());
        let differing = Requests {
            operator: counts(&[("patch configmaps", 3)]),
            proxy: counts(&[("patch configmaps", 4), ("create events", 1)]),
        };
        assert_eq!(
            differing.disagreements(),
            [
                "create events: 0 by the operator, 1 by the proxy",
                "patch configmaps: 3 by the operator, 4 by the proxy"
            ]
        );
        let later = Requests {
            operator: counts(&[("patch configmaps", 5)]),
            proxy: counts(&[("patch configmaps", 6), ("create events", 1)]),
        };
        assert_eq!(writes_agree(&[("a", &agreeing), ("b", &agreeing)]), Ok(()));
        assert_eq!(
            writes_agree(&[("a", &agreeing), ("b", &differing)]),
            Err(
                "FAILED: the operator's own count of its writes (rest_client_requests_total) and \
                 the proxy's differ:\nb: create events: 0 by the operator, 1 by the proxy\n\
                 b: patch configmaps: 3 by the operator, 4 by the proxy"
                    .to_string()
            )
        );
        assert_eq!(
            later.since(&differing),
            Requests {
                operator: counts(&[("patch configmaps", 2)]),
                proxy: counts(&[("patch configmaps", 2)]),
            }
        );
    }
}
