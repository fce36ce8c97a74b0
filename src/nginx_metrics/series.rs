//! The sidecar's series (docs/cdn-metrics.md): what the log lines add up to, nginx's connections
//! and the cache's filesystem. Pure: the lines, the status page and the filesystem's figures are
//! given; nothing here reads a socket or a file.

use super::log::{CacheStatus, Denial, Line, UpstreamError};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};
use std::sync::atomic::AtomicU64;

/// Seconds of an attempt at a source: a hit of a tier in under a few ms, a miss fetched from a
/// distant origin in tens to hundreds, a slice of a slow origin in seconds, the read timeouts at
/// 8 s (origins) and 25 s (tiers).
const UPSTREAM_BUCKETS: [f64; 13] = [
    0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// The pools one nginx names are few (one a route); a line naming more than this many is folded
/// into [`OTHER`], so no input makes the series grow without bound.
pub const MAX_SOURCES: usize = 64;
pub const OTHER: &str = "other";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    source: String,
    source_kind: String,
    status_class: &'static str,
    cache_status: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BytesLabels {
    source: String,
    source_kind: String,
    cache_status: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceLabels {
    source: String,
    source_kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    source: String,
    source_kind: String,
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DenialLabels {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

/// Every series, registered under the labels that name the pod's CdnCluster.
pub struct Series {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    sent: Family<BytesLabels, Counter>,
    received: Family<BytesLabels, Counter>,
    upstream_seconds: Family<SourceLabels, Histogram>,
    upstream_errors: Family<ErrorLabels, Counter>,
    token_denials: Family<DenialLabels, Counter>,
    lines: Family<ResultLabels, Counter>,
    connections: Family<StateLabels, Gauge>,
    accepted: Counter,
    /// nginx's count of accepted connections at the last read, to add what came since.
    accepted_seen: AtomicU64,
    nginx_up: Gauge,
    filesystem_size: Gauge,
    filesystem_avail: Gauge,
}

/// What the pod is: the labels on every series, and the cache's size when it is a cache.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub cdncluster: String,
    pub role: String,
    pub cache_max_size_bytes: Option<u64>,
}

impl Series {
    pub fn new(identity: &Identity) -> Series {
        let mut registry = Registry::with_labels(
            [
                ("cdncluster".into(), identity.cdncluster.clone().into()),
                ("role".into(), identity.role.clone().into()),
            ]
            .into_iter(),
        );
        let lines = Family::<ResultLabels, Counter>::default();
        let series = Series {
            registry: Registry::default(),
            requests: Family::default(),
            sent: Family::default(),
            received: Family::default(),
            upstream_seconds: Family::new_with_constructor(|| Histogram::new(UPSTREAM_BUCKETS)),
            upstream_errors: Family::default(),
            token_denials: Family::default(),
            lines,
            connections: Family::default(),
            accepted: Counter::default(),
            accepted_seen: AtomicU64::new(0),
            nginx_up: Gauge::default(),
            filesystem_size: Gauge::default(),
            filesystem_avail: Gauge::default(),
        };
        let cdn = registry.sub_registry_with_prefix("cdn");
        cdn.register(
            "requests",
            "Client requests (not probes, not slices), by the pool that served them, status class and cache status",
            series.requests.clone(),
        );
        cdn.register_with_unit(
            "sent",
            "Bytes sent to clients, headers and bodies",
            Unit::Bytes,
            series.sent.clone(),
        );
        cdn.register_with_unit(
            "upstream_received",
            "Bytes received from sources, every slice included, by the cache status of what they answered",
            Unit::Bytes,
            series.received.clone(),
        );
        cdn.register_with_unit(
            "upstream_response",
            "Time of each attempt at a source (the count is the attempts)",
            Unit::Seconds,
            series.upstream_seconds.clone(),
        );
        cdn.register(
            "upstream_errors",
            "Failed attempts at a source: error (no answer: refused, reset, invalid), timeout, http_5xx (answered 5xx)",
            series.upstream_errors.clone(),
        );
        // Every reason from the start, at 0: a rate over a series that appears with its first
        // refusal would miss that refusal.
        for denial in Denial::ALL {
            let _ = series.token_denials.get_or_create(&DenialLabels {
                reason: denial.as_str(),
            });
        }
        cdn.register(
            "token_denials",
            "Client requests refused (403) for their signed URL's token, by reason: missing, malformed, expired, invalid, path, address",
            series.token_denials.clone(),
        );
        cdn.register(
            "connections",
            "nginx's client connections, by state",
            series.connections.clone(),
        );
        cdn.register(
            "connections_accepted",
            "Client connections nginx accepted",
            series.accepted.clone(),
        );
        cdn.register(
            "nginx_up",
            "1 when nginx's status answered at this scrape",
            series.nginx_up.clone(),
        );
        cdn.register(
            "log_lines",
            "Lines of nginx's metrics log read: counted, or unreadable",
            series.lines.clone(),
        );
        if let Some(max) = identity.cache_max_size_bytes {
            cdn.register_with_unit(
                "cache_max_size",
                "The cache's max_size",
                Unit::Bytes,
                prometheus_client::metrics::gauge::ConstGauge::new(max as i64),
            );
            cdn.register_with_unit(
                "cache_filesystem_size",
                "Size of the filesystem holding the cache",
                Unit::Bytes,
                series.filesystem_size.clone(),
            );
            cdn.register_with_unit(
                "cache_filesystem_avail",
                "Bytes of the filesystem holding the cache available to nginx",
                Unit::Bytes,
                series.filesystem_avail.clone(),
            );
        }
        Series { registry, ..series }
    }

    /// The exposition, in the OpenMetrics text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }

    /// nginx's status page (`stub_status`) as read at a scrape, or `None` when it did not answer.
    pub fn observe_status(&self, status: Option<&StubStatus>) {
        let Some(status) = status else {
            self.nginx_up.set(0);
            return;
        };
        self.nginx_up.set(1);
        for (state, value) in [
            ("active", status.active),
            ("reading", status.reading),
            ("writing", status.writing),
            ("waiting", status.waiting),
        ] {
            self.connections
                .get_or_create(&StateLabels { state })
                .set(value as i64);
        }
        // nginx counts from its start: after a restart its count is lower, and all of it is new.
        self.accepted
            .inc_by(since(&self.accepted_seen, status.accepted));
    }

    /// The cache's filesystem: its size and what is available, in bytes.
    pub fn observe_filesystem(&self, size: u64, available: u64) {
        self.filesystem_size.set(size as i64);
        self.filesystem_avail.set(available as i64);
    }
}

/// What a count of nginx's added since it was `seen` last, and now seen; all of it when it went
/// down (counted again from nginx's restart).
fn since(seen: &AtomicU64, now: u64) -> u64 {
    let before = seen.swap(now, std::sync::atomic::Ordering::Relaxed);
    if now >= before {
        now - before
    } else {
        now
    }
}

/// nginx's `stub_status` page.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct StubStatus {
    pub active: u64,
    pub accepted: u64,
    pub reading: u64,
    pub writing: u64,
    pub waiting: u64,
}

impl StubStatus {
    /// Reads the page: `Active connections: N`, a header line and `accepts handled requests`,
    /// then `Reading: N Writing: N Waiting: N`.
    pub fn parse(page: &str) -> Option<StubStatus> {
        let mut lines = page.lines();
        let active = lines
            .next()?
            .trim()
            .strip_prefix("Active connections:")?
            .trim()
            .parse()
            .ok()?;
        lines.next()?;
        let accepted = lines.next()?.split_whitespace().next()?.parse().ok()?;
        let words: Vec<&str> = lines.next()?.split_whitespace().collect();
        let [_, reading, _, writing, _, waiting] = words.as_slice() else {
            return None;
        };
        Some(StubStatus {
            active,
            accepted,
            reading: reading.parse().ok()?,
            writing: writing.parse().ok()?,
            waiting: waiting.parse().ok()?,
        })
    }
}

/// The series of one pool, resolved once: the handles a line adds to, indexed by status class,
/// cache status and error kind, so a line costs no lookup and no allocation.
struct Source {
    requests: [[Option<Counter>; CACHE_STATUSES]; 5],
    sent: [Option<Counter>; CACHE_STATUSES],
    received: [Option<Counter>; CACHE_STATUSES],
    seconds: Histogram,
    /// Created at the pool's first attempt.
    errors: Option<[Counter; UpstreamError::ALL.len()]>,
    labels: SourceLabels,
}

const CACHE_STATUSES: usize = CacheStatus::ALL.len();

/// Adds the log lines to the series. Owned by the one thread that receives them.
pub struct Tally<'a> {
    series: &'a Series,
    /// The pools seen, by their whole `$cdn_source`.
    sources: Vec<(String, Source)>,
    counted: Counter,
    unreadable: Counter,
    /// The denials by reason, resolved the first time each is seen.
    denials: [Option<Counter>; Denial::ALL.len()],
}

impl<'a> Tally<'a> {
    pub fn new(series: &'a Series) -> Tally<'a> {
        let result = |result| series.lines.get_or_create(&ResultLabels { result }).clone();
        Tally {
            series,
            sources: Vec::new(),
            counted: result("counted"),
            unreadable: result("unreadable"),
            denials: Default::default(),
        }
    }

    /// Adds a line of the metrics log (without its end).
    pub fn add(&mut self, line: &[u8]) {
        let counted = super::log::parse(line)
            .is_some_and(|line| self.add_line(&line) && self.add_denial(&line));
        if counted {
            self.counted.inc();
        } else {
            self.unreadable.inc();
        }
    }

    /// Adds a line; `false` when its source is none of the kinds nginx writes.
    fn add_line(&mut self, line: &Line) -> bool {
        let series = self.series;
        let Some(source) = self.source(line.source) else {
            return false;
        };
        if line.main {
            let class = usize::from(line.status / 100 - 1);
            source.requests[class][line.cache_status.index()]
                .get_or_insert_with(|| {
                    series
                        .requests
                        .get_or_create(&RequestLabels {
                            source: source.labels.source.clone(),
                            source_kind: source.labels.source_kind.clone(),
                            status_class: STATUS_CLASSES[class],
                            cache_status: line.cache_status.as_str(),
                        })
                        .clone()
                })
                .inc();
            bytes(&series.sent, source, line.cache_status, Direction::Sent).inc_by(line.bytes_sent);
        }
        for attempt in line.attempts() {
            source.seconds.observe(attempt.seconds);
            if attempt.bytes_received > 0 {
                bytes(
                    &series.received,
                    source,
                    line.cache_status,
                    Direction::Received,
                )
                .inc_by(attempt.bytes_received);
            }
            // Every kind at 0 from a source's first attempt: one that never fails shows a rate
            // of 0 on the dashboards, not "no data".
            let errors = source.errors.get_or_insert_with(|| {
                UpstreamError::ALL.map(|kind| {
                    series
                        .upstream_errors
                        .get_or_create(&ErrorLabels {
                            source: source.labels.source.clone(),
                            source_kind: source.labels.source_kind.clone(),
                            kind: kind.as_str(),
                        })
                        .clone()
                })
            });
            if let Some(kind) = attempt.error {
                errors[kind.index()].inc();
            }
        }
        true
    }

    /// Counts a client request the verifier of signed URLs refused, by its reason. The status
    /// is checked too: a response nginx made before any check (a redirect to HTTPS) may still
    /// log what the verifier would have said. Always `true`: the line is counted either way.
    fn add_denial(&mut self, line: &Line) -> bool {
        if let Some(denial) = line.denial.filter(|_| line.main && line.status == 403) {
            let family = &self.series.token_denials;
            self.denials[denial.index()]
                .get_or_insert_with(|| {
                    family
                        .get_or_create(&DenialLabels {
                            reason: denial.as_str(),
                        })
                        .clone()
                })
                .inc();
        }
        true
    }

    /// The pool of `$cdn_source` `field`, resolved the first time it is seen; `None` when it
    /// names none.
    fn source(&mut self, field: &str) -> Option<&mut Source> {
        let index = match self.sources.iter().position(|(f, _)| f == field) {
            Some(index) => index,
            None => {
                let (kind, name) = super::log::source(field)?;
                if self.sources.len() < MAX_SOURCES {
                    let source = self.resolve(kind, name);
                    self.sources.push((field.into(), source));
                    self.sources.len() - 1
                } else {
                    // Past the bound, every new pool is one: `other`.
                    let other = format!("{OTHER} {OTHER}");
                    match self.sources.iter().position(|(f, _)| *f == other) {
                        Some(index) => index,
                        None => {
                            let source = self.resolve(OTHER, OTHER);
                            self.sources.push((other, source));
                            self.sources.len() - 1
                        }
                    }
                }
            }
        };
        Some(&mut self.sources[index].1)
    }

    fn resolve(&self, kind: &str, name: &str) -> Source {
        let labels = SourceLabels {
            source: name.into(),
            source_kind: kind.into(),
        };
        Source {
            requests: Default::default(),
            sent: Default::default(),
            received: Default::default(),
            seconds: self.series.upstream_seconds.get_or_create(&labels).clone(),
            errors: None,
            labels,
        }
    }
}

const STATUS_CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

enum Direction {
    Sent,
    Received,
}

/// The handle of the bytes of `source` with `cache_status`, sent or received.
fn bytes<'s>(
    family: &Family<BytesLabels, Counter>,
    source: &'s mut Source,
    cache_status: CacheStatus,
    direction: Direction,
) -> &'s Counter {
    let labels = &source.labels;
    let handles = match direction {
        Direction::Sent => &mut source.sent,
        Direction::Received => &mut source.received,
    };
    handles[cache_status.index()].get_or_insert_with(|| {
        family
            .get_or_create(&BytesLabels {
                source: labels.source.clone(),
                source_kind: labels.source_kind.clone(),
                cache_status: cache_status.as_str(),
            })
            .clone()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(cache: Option<u64>) -> Identity {
        Identity {
            cdncluster: "cache-a".into(),
            role: if cache.is_some() { "cache" } else { "balancer" }.into(),
            cache_max_size_bytes: cache,
        }
    }

    fn sample<'t>(text: &'t str, series: &str) -> Option<&'t str> {
        text.lines()
            .find(|l| l.split_once(' ').is_some_and(|(s, _)| s == series))
            .map(|l| l.rsplit_once(' ').unwrap().1)
    }

    #[test]
    fn lines_add_up_by_pool_status_and_cache_status() {
        let series = Series::new(&identity(Some(1 << 30)));
        let mut tally = Tally::new(&series);
        for message in [
            // A miss fetched in two slices: the subrequest's line first, then the client's.
            "0\t200\tMISS\t2097412\t206\t0.002\t0.003\t1048873\torigin origin",
            "84\t200\tMISS\t2097600\t206\t0.003\t0.004\t1048867\torigin origin",
            "84\t200\tHIT\t2097600\t-\t-\t-\t-\torigin origin",
            "82\t502\tMISS\t314\t502\t-\t0.000\t0\torigin origin",
            "82\t404\t-\t153\t-\t-\t-\t-\tnone none",
        ] {
            tally.add(message.as_bytes());
        }
        tally.add(b"garbage");
        let text = crate::runtime::metrics::to_prometheus_text(&series.encode());
        let l = r#"cdncluster="cache-a",role="cache""#;
        let origin = r#"source="origin",source_kind="origin""#;
        for (name, value) in [
            (
                format!(
                    r#"cdn_requests_total{{{l},{origin},status_class="2xx",cache_status="MISS"}}"#
                ),
                "1",
            ),
            (
                format!(
                    r#"cdn_requests_total{{{l},{origin},status_class="2xx",cache_status="HIT"}}"#
                ),
                "1",
            ),
            (
                format!(
                    r#"cdn_requests_total{{{l},{origin},status_class="5xx",cache_status="MISS"}}"#
                ),
                "1",
            ),
            (
                format!(
                    r#"cdn_requests_total{{{l},source="none",source_kind="none",status_class="4xx",cache_status="NONE"}}"#
                ),
                "1",
            ),
            (
                format!(r#"cdn_sent_bytes_total{{{l},{origin},cache_status="MISS"}}"#),
                "2097914",
            ),
            (
                format!(r#"cdn_upstream_received_bytes_total{{{l},{origin},cache_status="MISS"}}"#),
                "2097740",
            ),
            (
                format!(r#"cdn_upstream_response_seconds_count{{{l},{origin}}}"#),
                "3",
            ),
            (
                format!(r#"cdn_upstream_errors_total{{{l},{origin},kind="error"}}"#),
                "1",
            ),
            // The kinds that did not happen, from 0: a rate of 0, not no data.
            (
                format!(r#"cdn_upstream_errors_total{{{l},{origin},kind="timeout"}}"#),
                "0",
            ),
            (
                format!(r#"cdn_upstream_errors_total{{{l},{origin},kind="http_5xx"}}"#),
                "0",
            ),
            (
                format!(r#"cdn_log_lines_total{{{l},result="counted"}}"#),
                "5",
            ),
            (
                format!(r#"cdn_log_lines_total{{{l},result="unreadable"}}"#),
                "1",
            ),
            (format!(r#"cdn_cache_max_size_bytes{{{l}}}"#), "1073741824"),
        ] {
            assert_eq!(sample(&text, &name), Some(value), "{name} in\n{text}");
        }
    }

    #[test]
    fn refusals_of_signed_urls_are_counted_by_reason_old_lines_and_new_alike() {
        let series = Series::new(&identity(None));
        let mut tally = Tally::new(&series);
        for message in [
            // A line of the nginx before the upgrade, then the same with the field.
            "84\t200\t-\t900\t200\t0.001\t0.001\t800\tcdncluster cache",
            "84\t200\t-\t900\t200\t0.001\t0.001\t800\tcdncluster cache\tok",
            "84\t403\t-\t300\t-\t-\t-\t-\tcdncluster cache\texpired",
            "84\t403\t-\t300\t-\t-\t-\t-\tcdncluster cache\texpired",
            "84\t403\t-\t300\t-\t-\t-\t-\tnone none\tmissing",
            // A redirect made before any check: not a refusal.
            "84\t301\t-\t300\t-\t-\t-\t-\tnone none\tmissing",
            // A 403 of the origin, passed on, the token good.
            "84\t403\t-\t300\t403\t0.001\t0.001\t200\tcdncluster cache\tok",
        ] {
            tally.add(message.as_bytes());
        }
        let text = crate::runtime::metrics::to_prometheus_text(&series.encode());
        let l = r#"cdncluster="cache-a",role="balancer""#;
        for (reason, value) in [
            ("expired", Some("2")),
            ("missing", Some("1")),
            ("path", Some("0")),
        ] {
            let name = format!(r#"cdn_token_denials_total{{{l},reason="{reason}"}}"#);
            assert_eq!(sample(&text, &name), value, "{name} in\n{text}");
        }
        let name = format!(r#"cdn_log_lines_total{{{l},result="counted"}}"#);
        assert_eq!(sample(&text, &name), Some("7"), "{text}");
        let name = format!(
            r#"cdn_requests_total{{{l},source="cache",source_kind="cdncluster",status_class="4xx",cache_status="NONE"}}"#
        );
        assert_eq!(sample(&text, &name), Some("3"), "{text}");
    }

    #[test]
    fn the_pools_a_log_names_are_bounded() {
        let series = Series::new(&identity(None));
        let mut tally = Tally::new(&series);
        for i in 0..(MAX_SOURCES + 10) {
            tally.add(format!("84\t200\t-\t10\t200\t0.001\t0.001\t10\torigin o{i}").as_bytes());
        }
        let text = crate::runtime::metrics::to_prometheus_text(&series.encode());
        let pools = text
            .lines()
            .filter(|l| l.starts_with("cdn_upstream_response_seconds_count{"))
            .count();
        assert_eq!(pools, MAX_SOURCES + 1, "{text}");
        let other = r#"cdn_requests_total{cdncluster="cache-a",role="balancer",source="other",source_kind="other",status_class="2xx",cache_status="NONE"}"#;
        assert_eq!(sample(&text, other), Some("10"), "{text}");
        assert!(
            !text.contains("cdn_cache_max_size_bytes"),
            "a balancer has no cache"
        );
    }

    #[test]
    fn nginx_s_status_page_gives_the_connections() {
        let page = "Active connections: 291 \nserver accepts handled requests\n 16630948 16630948 31070465 \nReading: 6 Writing: 179 Waiting: 106 \n";
        let status = StubStatus::parse(page).unwrap();
        assert_eq!(
            status,
            StubStatus {
                active: 291,
                accepted: 16_630_948,
                reading: 6,
                writing: 179,
                waiting: 106
            }
        );
        assert_eq!(StubStatus::parse("<html>502</html>"), None);
        let series = Series::new(&identity(None));
        series.observe_status(Some(&status));
        // nginx restarted: its count starts again, and all of it is new.
        series.observe_status(Some(&StubStatus {
            accepted: 5,
            ..status.clone()
        }));
        let text = crate::runtime::metrics::to_prometheus_text(&series.encode());
        let l = r#"cdncluster="cache-a",role="balancer""#;
        assert_eq!(
            sample(&text, &format!("cdn_connections_accepted_total{{{l}}}")),
            Some("16630953")
        );
        assert_eq!(
            sample(&text, &format!(r#"cdn_connections{{{l},state="writing"}}"#)),
            Some("179")
        );
        assert_eq!(sample(&text, &format!("cdn_nginx_up{{{l}}}")), Some("1"));
        series.observe_status(None);
        let text = crate::runtime::metrics::to_prometheus_text(&series.encode());
        assert_eq!(sample(&text, &format!("cdn_nginx_up{{{l}}}")), Some("0"));
    }
}
