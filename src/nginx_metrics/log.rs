//! One line of nginx's metrics log: the fields of [`FORMAT`], tab-separated. Pure: no I/O.

/// The `log_format` of the metrics log. `$request_length` is 0 for a subrequest (a slice of a
/// large object, logged with `log_subrequest on`): only its upstream figures count, as the client
/// request that asked for it is counted once, by its own line. `$cdn_source` is set by each
/// location: the kind of its pool, a space, its sources' names. The upstream variables list one
/// value per attempt, separated by `, ` (and ` : ` after an internal redirect).
/// `$cdn_token_status`, the last field, is what the verifier of signed URLs said (`ok` or why it
/// refused), `-` in a cluster without them; nginx of an older release writes lines without it,
/// which read as `-`: a pod's log holds both kinds across an upgrade.
pub const FORMAT: &str = "$request_length\\t$status\\t$upstream_cache_status\\t$bytes_sent\\t\
$upstream_status\\t$upstream_header_time\\t$upstream_response_time\\t$upstream_bytes_received\\t\
$cdn_source\\t$cdn_token_status";

/// Why a request with signed URLs was refused (a 403), as the verifier says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Denial {
    /// No token, in the parameter or the cookie.
    Missing,
    /// Not a token of the expected format.
    Malformed,
    /// Past its expiry, or before its start.
    Expired,
    /// Its MAC verifies with no key: tampered with, or signed with an unknown key.
    Invalid,
    /// Its ACL does not cover the request's path.
    Path,
    /// Bound to another address than the viewer's.
    Address,
}

impl Denial {
    pub const ALL: [Denial; 6] = [
        Denial::Missing,
        Denial::Malformed,
        Denial::Expired,
        Denial::Invalid,
        Denial::Path,
        Denial::Address,
    ];

    /// Its place in [`Denial::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Denial::Missing => "missing",
            Denial::Malformed => "malformed",
            Denial::Expired => "expired",
            Denial::Invalid => "invalid",
            Denial::Path => "path",
            Denial::Address => "address",
        }
    }

    /// The verifier's word for it; `None` for `ok`, `-` (no check) or anything else.
    fn parse(value: &str) -> Option<Denial> {
        Denial::ALL.into_iter().find(|d| d.as_str() == value)
    }
}

/// What nginx's `$upstream_cache_status` says of a response; [`CacheStatus::None`] when no cache
/// took part (a balancer, or a response nginx made itself).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CacheStatus {
    Hit,
    Miss,
    Expired,
    Stale,
    Updating,
    Revalidated,
    Bypass,
    None,
}

impl CacheStatus {
    pub const ALL: [CacheStatus; 8] = [
        CacheStatus::Hit,
        CacheStatus::Miss,
        CacheStatus::Expired,
        CacheStatus::Stale,
        CacheStatus::Updating,
        CacheStatus::Revalidated,
        CacheStatus::Bypass,
        CacheStatus::None,
    ];

    fn parse(value: &str) -> CacheStatus {
        match value {
            "HIT" => CacheStatus::Hit,
            "MISS" => CacheStatus::Miss,
            "EXPIRED" => CacheStatus::Expired,
            "STALE" => CacheStatus::Stale,
            "UPDATING" => CacheStatus::Updating,
            "REVALIDATED" => CacheStatus::Revalidated,
            "BYPASS" => CacheStatus::Bypass,
            _ => CacheStatus::None,
        }
    }

    /// Its place in [`CacheStatus::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    pub fn as_str(self) -> &'static str {
        match self {
            CacheStatus::Hit => "HIT",
            CacheStatus::Miss => "MISS",
            CacheStatus::Expired => "EXPIRED",
            CacheStatus::Stale => "STALE",
            CacheStatus::Updating => "UPDATING",
            CacheStatus::Revalidated => "REVALIDATED",
            CacheStatus::Bypass => "BYPASS",
            CacheStatus::None => "NONE",
        }
    }
}

/// Why an attempt at a source failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UpstreamError {
    /// No answer: refused, reset, an invalid header, or no member left (nginx's 502).
    Error,
    /// No answer in time (nginx's 504).
    Timeout,
    /// The source answered with a 5xx.
    Http5xx,
}

impl UpstreamError {
    pub const ALL: [UpstreamError; 3] = [
        UpstreamError::Error,
        UpstreamError::Timeout,
        UpstreamError::Http5xx,
    ];

    /// Its place in [`UpstreamError::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    pub fn as_str(self) -> &'static str {
        match self {
            UpstreamError::Error => "error",
            UpstreamError::Timeout => "timeout",
            UpstreamError::Http5xx => "http_5xx",
        }
    }
}

/// One attempt at a source.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Attempt {
    pub seconds: f64,
    pub bytes_received: u64,
    pub error: Option<UpstreamError>,
}

/// A line of the metrics log.
#[derive(Clone, Debug, PartialEq)]
pub struct Line<'a> {
    /// A client's request; `false` for a subrequest (a slice).
    pub main: bool,
    pub status: u16,
    pub cache_status: CacheStatus,
    pub bytes_sent: u64,
    /// `$cdn_source` whole: the kind, a space, the pool's sources' names.
    pub source: &'a str,
    /// Why the verifier of signed URLs refused the request; `None` when it did not (no check,
    /// a good token, or a line without the field).
    pub denial: Option<Denial>,
    /// The upstream variables, one value per attempt each: status, header time, response time,
    /// bytes received.
    upstream: [&'a str; 4],
}

/// The kinds of source a location names (`$cdn_source`).
pub const SOURCE_KINDS: [&str; 4] = ["cdncluster", "origin", "mixed", "none"];

/// `$cdn_source` read: its kind (`cdncluster`, `origin`, `mixed`, or `none` when nginx answered
/// itself) and its pool's sources' names, `+`-joined (`none` when nginx answered itself).
pub fn source(field: &str) -> Option<(&str, &str)> {
    field
        .split_once(' ')
        .filter(|(kind, _)| SOURCE_KINDS.contains(kind))
}

/// Reads a line (without its end); `None` when it is not a line of [`FORMAT`]. Its source is
/// read by [`source`], once per pool rather than once per line.
pub fn parse(line: &[u8]) -> Option<Line<'_>> {
    let text = std::str::from_utf8(line).ok()?;
    let mut fields = text.split('\t');
    let mut next = || fields.next();
    let request_length = next()?;
    let status = number(next()?)?;
    let cache_status = CacheStatus::parse(next()?);
    let bytes_sent = number(next()?)?;
    let upstream = [next()?, next()?, next()?, next()?];
    let source = next()?;
    // Absent from an older nginx's lines.
    let token = next();
    if next().is_some() || !(100..600).contains(&status) {
        return None;
    }
    Some(Line {
        main: request_length != "0",
        status: u16::try_from(status).ok()?,
        cache_status,
        bytes_sent,
        source,
        denial: token.and_then(Denial::parse),
        upstream,
    })
}

impl<'a> Line<'a> {
    /// The attempts at the pool's members, in order; none when no source was asked. A value
    /// missing from a list (nginx writes one per attempt in each) reads as `-`.
    pub fn attempts(&self) -> impl Iterator<Item = Attempt> + 'a {
        let [statuses, headers, times, received] = self.upstream;
        let asked = statuses != "-";
        let (mut headers, mut times, mut received) =
            (values(headers), values(times), values(received));
        values(statuses).filter(move |_| asked).map(move |status| {
            let (header, time, bytes) = (
                headers.next().unwrap_or("-"),
                times.next().unwrap_or("-"),
                received.next().unwrap_or("-"),
            );
            let answered = header != "-";
            let error = match number(status) {
                Some(502) if !answered => Some(UpstreamError::Error),
                Some(504) if !answered => Some(UpstreamError::Timeout),
                Some(500..=599) => Some(UpstreamError::Http5xx),
                _ => None,
            };
            Attempt {
                seconds: seconds(time),
                bytes_received: number(bytes).unwrap_or(0),
                error,
            }
        })
    }
}

/// The values of an upstream variable, one per attempt: `-` (none) or a list separated by `, `
/// (and ` : ` after an internal redirect).
fn values(list: &str) -> impl Iterator<Item = &str> {
    list.split([',', ':']).map(str::trim)
}

/// A decimal number as nginx writes one.
fn number(text: &str) -> Option<u64> {
    if text.is_empty() {
        return None;
    }
    text.bytes().try_fold(0u64, |n, b| {
        b.is_ascii_digit()
            .then(|| n.checked_mul(10)?.checked_add(u64::from(b - b'0')))
            .flatten()
    })
}

/// nginx's seconds with milliseconds (`0.004`), read without a float parser: the digits as one
/// integer, divided once, so the value is the parser's; 0 for `-`.
fn seconds(text: &str) -> f64 {
    let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
    match (
        number(whole),
        number(fraction).or(fraction.is_empty().then_some(0)),
    ) {
        (Some(whole_part), Some(fraction_part)) if fraction.len() <= 6 => {
            let scale = 10u64.pow(fraction.len() as u32);
            (whole_part.saturating_mul(scale) + fraction_part) as f64 / scale as f64
        }
        _ => 0.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_request_served_from_the_cache() {
        let text = String::from("84\t200\tHIT\t3500260\t-\t-\t-\t-\torigin origin-a");
        let parsed = parse(text.as_bytes()).unwrap();
        assert!(parsed.main);
        assert_eq!(parsed.status, 200);
        assert_eq!(parsed.cache_status, CacheStatus::Hit);
        assert_eq!(parsed.bytes_sent, 3_500_260);
        assert_eq!(source(parsed.source), Some(("origin", "origin-a")));
        assert_eq!(parsed.attempts().count(), 0);
    }

    #[test]
    fn a_slice_fetched_by_a_subrequest_counts_its_attempt_only() {
        let text = String::from(
            "0\t200\tMISS\t2097412\t206\t0.002\t0.003\t1048873\tcdncluster cache-a+cache-b",
        );
        let parsed = parse(text.as_bytes()).unwrap();
        assert!(!parsed.main);
        assert_eq!(
            source(parsed.source),
            Some(("cdncluster", "cache-a+cache-b"))
        );
        assert_eq!(
            parsed.attempts().collect::<Vec<_>>(),
            [Attempt {
                seconds: 0.003,
                bytes_received: 1_048_873,
                error: None
            }]
        );
    }

    #[test]
    fn failed_attempts_are_told_apart_by_whether_the_source_answered() {
        let text = String::from(
            "82\t200\tMISS\t500\t502, 504, 503 : 200\t-, -, 0.010 : 0.020\t0.000, 8.001, 0.011 : 0.021\t0, 0, 120 : 900\torigin a+b+c",
        );
        let parsed = parse(text.as_bytes()).unwrap();
        let attempts: Vec<_> = parsed.attempts().collect();
        let errors: Vec<_> = attempts.iter().map(|a| a.error).collect();
        assert_eq!(
            errors,
            [
                Some(UpstreamError::Error),
                Some(UpstreamError::Timeout),
                Some(UpstreamError::Http5xx),
                None
            ]
        );
        assert_eq!(attempts[1].seconds, 8.001);
        assert_eq!(attempts[3].bytes_received, 900);
        // A 502 the source sent itself (a tier relaying its origin's) is an answer.
        let relayed = String::from("82\t502\tNONE\t300\t502\t0.004\t0.004\t300\tcdncluster cache");
        let relayed = parse(relayed.as_bytes()).unwrap();
        assert_eq!(
            relayed.attempts().next().unwrap().error,
            Some(UpstreamError::Http5xx)
        );
    }

    #[test]
    fn lines_with_and_without_the_token_field_are_read_alike() {
        // An upgrade: the old nginx's lines end at the source, the new one's have the field.
        let old = String::from("84\t200\tHIT\t3500\t-\t-\t-\t-\torigin origin-a");
        let new = format!("{old}\t-");
        let (old, new) = (
            parse(old.as_bytes()).unwrap(),
            parse(new.as_bytes()).unwrap(),
        );
        assert_eq!(old, new);
        assert_eq!(new.denial, None);
        let ok = String::from("84\t200\tHIT\t3500\t-\t-\t-\t-\torigin origin-a\tok");
        assert_eq!(parse(ok.as_bytes()).unwrap().denial, None);
        for denial in Denial::ALL {
            let text = format!(
                "84\t403\t-\t300\t-\t-\t-\t-\torigin origin-a\t{}",
                denial.as_str()
            );
            let line = parse(text.as_bytes()).unwrap();
            assert_eq!((line.status, line.denial), (403, Some(denial)), "{text}");
        }
        // A word of a later verifier: the line counts, the denial does not.
        let unknown = String::from("84\t403\t-\t300\t-\t-\t-\t-\torigin o\tsomething-new");
        assert_eq!(parse(unknown.as_bytes()).unwrap().denial, None);
    }

    #[test]
    fn a_response_nginx_made_itself_has_no_source() {
        let text = String::from("82\t404\t-\t153\t-\t-\t-\t-\tnone none");
        let parsed = parse(text.as_bytes()).unwrap();
        assert_eq!(parsed.cache_status, CacheStatus::None);
        assert_eq!(source(parsed.source), Some(("none", "none")));
    }

    #[test]
    fn seconds_are_read_as_nginx_writes_them() {
        for (text, value) in [
            ("0.004", 0.004),
            ("12.5", 12.5),
            ("3", 3.0),
            ("-", 0.0),
            ("x.1", 0.0),
        ] {
            assert_eq!(seconds(text), value, "{text}");
        }
    }

    #[test]
    fn anything_else_is_refused() {
        for bad in [
            "not a line of the format".to_string(),
            String::from("84\t200\tHIT\t10\t-\t-\t-\t-"),
            String::from("84\t200\tHIT\t10\t-\t-\t-\t-\torigin a\tok\textra"),
            String::from("84\t999\tHIT\t10\t-\t-\t-\t-\torigin a"),
            String::from("84\t200\tHIT\tmany\t-\t-\t-\t-\torigin a"),
        ] {
            assert_eq!(parse(bad.as_bytes()), None, "{bad}");
        }
        assert_eq!(source("planet a"), None);
        assert_eq!(source("origin"), None);
    }
}
