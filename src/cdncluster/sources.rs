//! Dereference and validate a CdnCluster's sources: pure, given a lookup of CdnClusters in the
//! same namespace (the controller's store).

use super::nginx::{describe_pool, pools, size_bytes, Upstream};
use crate::api::{CdnCluster, MAX_NAME_LEN};
use kube::ResourceExt;
use std::collections::HashSet;
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};

/// Why a CdnCluster cannot be deployed (yet).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Problem {
    /// Sources that are not there yet, in spec order. Deploying waits for them.
    Missing(Vec<String>),
    /// The spec cannot be served as it is; the message says why.
    Invalid(String),
}

/// The DNS name of a Service, fully qualified: nginx looks it up itself, without the pod's search
/// domains.
pub fn service_host(name: &str, namespace: &str, cluster_domain: &str) -> String {
    format!("{name}.{namespace}.svc.{cluster_domain}")
}

/// A Service's name and `port`, as nginx connects to it.
pub fn service_address(name: &str, namespace: &str, cluster_domain: &str, port: i32) -> String {
    format!("{}:{port}", service_host(name, namespace, cluster_domain))
}

/// The cluster domain when nothing says otherwise.
pub const DEFAULT_CLUSTER_DOMAIN: &str = "cluster.local";

/// A cluster domain as a flag gives it (`cluster.local`, `example.internal.`), checked: lower-case
/// DNS labels separated by dots, without the final dot.
pub fn parse_cluster_domain(domain: &str) -> Result<String, String> {
    let domain = domain.strip_suffix('.').unwrap_or(domain);
    let label_ok = |label: &str| {
        (1..=63).contains(&label.len())
            && !label.starts_with('-')
            && !label.ends_with('-')
            && label
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    };
    if domain.len() <= 253 && domain.split('.').all(label_ok) {
        Ok(domain.to_string())
    } else {
        Err(format!(
            "{domain:?} is not a DNS domain such as cluster.local (lower-case labels separated by dots)"
        ))
    }
}

/// The port on which a CdnCluster's Service serves.
pub const SERVICE_PORT: i32 = 80;
/// The port on which a CdnCluster's Service serves HTTPS, when its spec sets `tls`.
pub const TLS_SERVICE_PORT: i32 = 443;

/// Checks the spec and resolves every source to an upstream, its Service named in
/// `cluster_domain`. Invalid specs are reported before missing sources: waiting would not make
/// them servable.
pub fn resolve<F>(
    cluster: &CdnCluster,
    lookup: F,
    cluster_domain: &str,
) -> Result<Vec<Upstream>, Problem>
where
    F: Fn(&str) -> Option<Arc<CdnCluster>>,
{
    let name = cluster.name_any();
    let namespace = cluster.namespace().unwrap_or_default();
    check_name(&name).map_err(Problem::Invalid)?;
    check_tuning(cluster).map_err(Problem::Invalid)?;

    let mut seen = HashSet::new();
    for source in &cluster.spec.sources {
        if source.name.is_empty() {
            return Err(Problem::Invalid("a source has an empty name".into()));
        }
        if !seen.insert(source.name.as_str()) {
            return Err(Problem::Invalid(format!(
                "source {} is listed twice: each source may appear once",
                source.name
            )));
        }
        if source.origin.is_none() && source.name == name {
            return Err(Problem::Invalid(format!("{name} lists itself as a source")));
        }
        if let Some(regex) = &source.path_condition {
            check_regex(regex).map_err(|e| {
                Problem::Invalid(format!(
                    "source {}: pathCondition {regex:?} is not a valid regular expression: {e}",
                    source.name
                ))
            })?;
        }
        if !(1..=MAX_WEIGHT).contains(&source.weight()) {
            return Err(Problem::Invalid(format!(
                "source {}: weight {} is out of range: 1 to {MAX_WEIGHT}",
                source.name,
                source.weight()
            )));
        }
    }
    if let Some(cycle) = find_cycle(cluster, &lookup) {
        return Err(Problem::Invalid(format!(
            "sources form a cycle: {}",
            cycle.join(" → ")
        )));
    }

    let mut upstreams = Vec::with_capacity(cluster.spec.sources.len());
    let mut missing = Vec::new();
    for source in &cluster.spec.sources {
        let mut upstream = Upstream {
            name: source.name.clone(),
            path_condition: source.path_condition.clone(),
            scheme: "http",
            address: String::new(),
            host_header: None,
            path_prefix: String::new(),
            weight: source.weight().unsigned_abs(),
            tier: source.origin.is_none(),
        };
        match &source.origin {
            None => match lookup(&source.name) {
                Some(_) => {
                    // Looked up by its port's SRV records: the port comes with them.
                    upstream.address = service_host(&source.name, &namespace, cluster_domain);
                }
                None => missing.push(source.name.clone()),
            },
            Some(origin) => match (&origin.url, &origin.service) {
                (Some(url), None) => {
                    let parsed = parse_origin_url(url).map_err(|e| {
                        Problem::Invalid(format!("source {}: origin url {url:?} {e}", source.name))
                    })?;
                    upstream.scheme = parsed.scheme;
                    upstream.address = parsed.address;
                    upstream.host_header = Some(parsed.host);
                    upstream.path_prefix = parsed.path_prefix;
                }
                (None, Some(service)) => {
                    if !is_dns_label(&service.name) {
                        return Err(Problem::Invalid(format!(
                            "source {}: origin service {:?} is not a valid Service name",
                            source.name, service.name
                        )));
                    }
                    if !(1..=65535).contains(&service.port) {
                        return Err(Problem::Invalid(format!(
                            "source {}: origin service port {} is out of range",
                            source.name, service.port
                        )));
                    }
                    upstream.address =
                        service_address(&service.name, &namespace, cluster_domain, service.port);
                }
                _ => {
                    return Err(Problem::Invalid(format!(
                        "source {}: an origin takes exactly one of url or service",
                        source.name
                    )))
                }
            },
        }
        upstreams.push(upstream);
    }
    check_pools(&upstreams).map_err(Problem::Invalid)?;
    if !missing.is_empty() {
        return Err(Problem::Missing(missing));
    }
    Ok(upstreams)
}

/// The largest `weight` of a source: nginx gives each unit of weight 160 points on the hash ring.
pub const MAX_WEIGHT: i32 = 100;

/// The members of a pool share one location, so one `Host` header, scheme and path prefix: they
/// must be reached the same way.
fn check_pools(upstreams: &[Upstream]) -> Result<(), String> {
    for pool in pools(upstreams) {
        let first = &upstreams[pool[0]];
        let reach = |u: &Upstream| (u.scheme, u.host_header.clone(), u.path_prefix.clone());
        if let Some(other) = pool
            .iter()
            .map(|&i| &upstreams[i])
            .find(|u| reach(u) != reach(first))
        {
            let how = |u: &Upstream| match &u.host_header {
                None => format!("{} is reached over http with the client's Host", u.name),
                Some(host) => format!(
                    "{} is the URL origin {}://{host}{}",
                    u.name, u.scheme, u.path_prefix
                ),
            };
            return Err(format!(
                "{} cannot be balanced: {} but {}; a pool's members must all be CdnClusters or Service origins, or URL origins of the same scheme, host and path",
                describe_pool(upstreams, &pool),
                how(first),
                how(other)
            ));
        }
    }
    Ok(())
}

/// The settings nginx would refuse, or that would not mean what they say, are refused with the
/// reason (the CRD refuses most of them already; objects stored under an older CRD are not).
fn check_tuning(cluster: &CdnCluster) -> Result<(), String> {
    if let Some(cache) = cluster.spec.cache.as_deref() {
        for (field, size) in [("size", &cache.size), ("sliceSize", &cache.slice_size)] {
            if let Some(size) = size {
                if size_bytes(size).is_none_or(|b| b == 0) {
                    return Err(format!(
                        "cache.{field} {size:?} is not a size such as 512m or 10g"
                    ));
                }
            }
        }
        for rule in cache.rules.iter().flatten() {
            check_regex(&rule.path_condition).map_err(|e| {
                format!(
                    "cache rule {:?}: not a valid regular expression: {e}",
                    rule.path_condition
                )
            })?;
        }
    }
    if let Some(tls) = cluster.spec.tls.as_deref() {
        if !is_dns_subdomain(&tls.secret_name) {
            return Err(format!(
                "tls.secretName {:?} is not the name of a Secret (a DNS-1123 subdomain: lowercase letters, digits, '-' and '.', at most 253 characters)",
                tls.secret_name
            ));
        }
    }
    if let Some(http) = cluster.spec.http.as_deref() {
        for proxy in http.trusted_proxies.iter().flatten() {
            if !is_address_or_range(proxy) {
                return Err(format!(
                    "http.trustedProxies: {proxy:?} is not an IP address or a CIDR range"
                ));
            }
        }
        for parameter in http.excluded_query_parameters.iter().flatten() {
            let allowed = |c: char| c.is_ascii_alphanumeric() || "_.~-".contains(c);
            if parameter.is_empty() || !parameter.chars().all(allowed) {
                return Err(format!(
                    "http.excludedQueryParameters: {parameter:?} is not a parameter name (letters, digits, '_', '.', '~', '-')"
                ));
            }
        }
    }
    Ok(())
}

/// `10.0.0.1`, `10.0.0.0/8`, `fc00::/7`: an address, or a range whose prefix fits its family.
fn is_address_or_range(s: &str) -> bool {
    let (address, prefix) = match s.split_once('/') {
        Some((a, p)) => (a, Some(p)),
        None => (s, None),
    };
    let Ok(address) = address.parse::<std::net::IpAddr>() else {
        return false;
    };
    let bits = if address.is_ipv4() { 32 } else { 128 };
    prefix.is_none_or(|p| p.parse::<u8>().is_ok_and(|p| p <= bits) && !p.starts_with('+'))
}

/// Names the children cannot carry are refused with the reason (the CRD refuses them too).
pub fn check_name(name: &str) -> Result<(), String> {
    if name.len() > MAX_NAME_LEN {
        return Err(format!(
            "name {name:?} is {} characters long: at most {MAX_NAME_LEN} fit in the Deployment's pod label {name}-deployment",
            name.len()
        ));
    }
    if !is_dns_label(name) {
        return Err(format!(
            "name {name:?} is not a DNS-1035 label (lowercase letters, digits and '-', starting with a letter): it names the cluster's Service"
        ));
    }
    Ok(())
}

fn is_dns_label(s: &str) -> bool {
    let bytes = s.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes[0].is_ascii_lowercase()
        && bytes[bytes.len() - 1] != b'-'
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
}

/// A DNS-1123 subdomain, as Kubernetes names a Secret: dot-separated labels of lowercase letters,
/// digits and '-', each starting and ending with a letter or digit; at most 253 characters.
fn is_dns_subdomain(s: &str) -> bool {
    let label = |l: &str| {
        let b = l.as_bytes();
        !b.is_empty()
            && b[0].is_ascii_alphanumeric()
            && b[b.len() - 1].is_ascii_alphanumeric()
            && b.iter()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
    };
    s.len() <= 253 && s.split('.').all(label)
}

/// Checks a pathCondition with a PCRE-like engine (nginx uses PCRE); control characters could not
/// be written into nginx's configuration.
fn check_regex(regex: &str) -> Result<(), String> {
    if regex.is_empty() {
        return Err("it is empty".into());
    }
    if regex.chars().any(char::is_control) {
        return Err("it contains a control character".into());
    }
    if VALID_PATTERNS.is_known(regex) {
        return Ok(());
    }
    fancy_regex::Regex::new(regex).map_err(|e| e.to_string())?;
    VALID_PATTERNS.learn(regex);
    Ok(())
}

/// The path conditions already compiled without error. Compiling one builds its automata: every
/// reconcile of a balancer compiling its conditions again took 4 % of the operator's CPU
/// (creating 1,000 CdnClusters on a real server), and most of its allocations. Invalid patterns
/// are not remembered: they are rare and reported once per spec change.
static VALID_PATTERNS: LazyLock<KnownPatterns> = LazyLock::new(KnownPatterns::default);

/// A set of patterns, emptied when it would hold more than [`KnownPatterns::LIMIT`]: a CDN has
/// few distinct path conditions, and the set must not grow with whatever is written to specs.
#[derive(Default)]
struct KnownPatterns(Mutex<HashSet<Box<str>>>);

impl KnownPatterns {
    const LIMIT: usize = 1024;

    fn set(&self) -> MutexGuard<'_, HashSet<Box<str>>> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn is_known(&self, pattern: &str) -> bool {
        self.set().contains(pattern)
    }

    fn learn(&self, pattern: &str) {
        let mut set = self.set();
        if set.len() >= Self::LIMIT {
            set.clear();
        }
        set.insert(pattern.into());
    }
}

/// The first cycle through `cluster` found by following CdnCluster sources, as a path of names
/// that starts and ends with `cluster`'s name.
pub fn find_cycle<F>(cluster: &CdnCluster, lookup: &F) -> Option<Vec<String>>
where
    F: Fn(&str) -> Option<Arc<CdnCluster>>,
{
    let start = cluster.name_any();
    let mut path = vec![start.clone()];
    let mut visited = HashSet::new();
    fn walk<F>(
        node: &CdnCluster,
        start: &str,
        lookup: &F,
        path: &mut Vec<String>,
        visited: &mut HashSet<String>,
    ) -> bool
    where
        F: Fn(&str) -> Option<Arc<CdnCluster>>,
    {
        for source in node.spec.sources.iter().filter(|s| s.origin.is_none()) {
            path.push(source.name.clone());
            if source.name == start {
                return true;
            }
            if visited.insert(source.name.clone()) {
                if let Some(next) = lookup(&source.name) {
                    if walk(&next, start, lookup, path, visited) {
                        return true;
                    }
                }
            }
            path.pop();
        }
        false
    }
    walk(cluster, &start, lookup, &mut path, &mut visited).then_some(path)
}

struct OriginUrl {
    scheme: &'static str,
    address: String,
    host: String,
    path_prefix: String,
}

fn parse_origin_url(raw: &str) -> Result<OriginUrl, String> {
    let url = url::Url::parse(raw).map_err(|e| format!("is not a URL: {e}"))?;
    let scheme = match url.scheme() {
        "http" => "http",
        "https" => "https",
        other => {
            return Err(format!(
                "has scheme {other:?}: only http and https are served"
            ))
        }
    };
    let host = url.host_str().ok_or("has no host")?.to_string();
    if !url.username().is_empty() || url.password().is_some() {
        return Err("must not carry credentials".into());
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err("must not have a query or fragment".into());
    }
    let port = url.port_or_known_default().ok_or("has no port")?;
    let path_prefix = url.path().trim_end_matches('/').to_string();
    if path_prefix.contains(['$', '"', '\\']) || path_prefix.chars().any(char::is_whitespace) {
        return Err("has a path nginx could not use".into());
    }
    Ok(OriginUrl {
        scheme,
        address: format!("{host}:{port}"),
        host,
        path_prefix,
    })
}

#[cfg(test)]
mod tests {
    use super::{check_regex, KnownPatterns};

    #[test]
    fn a_pattern_is_compiled_until_it_is_known_valid() {
        let known = KnownPatterns::default();
        assert!(!known.is_known("^/live/"));
        known.learn("^/live/");
        assert!(known.is_known("^/live/"));
        assert!(!known.is_known("^/vod/"));
        for i in 1..KnownPatterns::LIMIT {
            known.learn(&format!("^/{i}/"));
        }
        assert!(known.is_known("^/live/"), "kept up to the limit");
        known.learn("^/one-too-many/");
        assert!(!known.is_known("^/live/"), "emptied past the limit");
        assert!(known.is_known("^/one-too-many/"));
    }

    #[test]
    fn a_valid_pattern_remembered_does_not_let_an_invalid_one_through() {
        assert_eq!(check_regex("^/(live|vod)/"), Ok(()));
        assert_eq!(check_regex("^/(live|vod)/"), Ok(()));
        for invalid in ["^/(live", "(?<=a+)b", "[z-a]"] {
            assert!(check_regex(invalid).is_err(), "{invalid}");
            assert!(check_regex(invalid).is_err(), "{invalid}, again");
        }
        assert_eq!(check_regex(""), Err("it is empty".into()));
        assert_eq!(
            check_regex("^/a\n"),
            Err("it contains a control character".into())
        );
    }
}
