//! The nginx configuration of a CdnCluster: pure text generation from role and resolved sources.
//!
//! Routing: regex locations in source order (nginx tries them in the order written, first match
//! wins), then `location /` for the default source, or a 404 when there is none. Sources that
//! share a pathCondition (or have none) are a pool: one location, one upstream of several
//! servers. `/healthz` is an exact location, which nginx checks before any regex, so probes never
//! reach a source.
//!
//! HTTPS (`spec.tls`): the server of the routes listens on a TLS port too, so both ports answer
//! from one set of locations; with `redirect`, plain HTTP gets a server of its own that answers
//! the probes and redirects everything else.
//!
//! Signed URLs (`spec.signedUrls`): njs checks each request's token (`token.js`, beside this file)
//! before any source is asked; the token is left out of the cache key, the pool's hash and, unless
//! asked, the request to the sources.

use crate::api::Role;
use std::fmt::Write;

/// The folder of the pod where the ConfigMap is mounted: nginx.conf, the entrypoint and, with
/// signed URLs, the verifier.
pub const CONFIG_DIR: &str = "/etc/nginx/cdn";
/// The port nginx listens on in the pod: unprivileged, so it runs as non-root.
pub const LISTEN_PORT: u16 = 8080;
/// The port nginx serves HTTPS on in the pod, when the spec sets `tls`.
pub const TLS_LISTEN_PORT: u16 = 8443;
/// Where the pod mounts the TLS Secret: its keys `tls.crt` and `tls.key` are files there.
pub const TLS_DIR: &str = "/etc/nginx/tls";
/// The certificate (then its intermediates) and the key, in [`TLS_DIR`].
pub const TLS_CERT_FILE: &str = "tls.crt";
pub const TLS_KEY_FILE: &str = "tls.key";
/// The TLS 1.2 cipher suites of Mozilla's "intermediate" configuration (guidelines 6.0): ECDHE
/// key exchange, AEAD ciphers. TLS 1.3's suites are OpenSSL's, all of them fine.
pub const TLS_CIPHERS: &str = "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:\
    ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:\
    ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305";
/// The path of the probe endpoint.
pub const HEALTH_PATH: &str = "/healthz";
/// The response header in which a cache reports HIT, MISS, EXPIRED, ...
pub const CACHE_STATUS_HEADER: &str = "X-Cache-Status";
/// The response header in which a pool's location reports the member that answered (after the
/// members that failed, comma-separated): nginx's `$upstream_addr`.
pub const UPSTREAM_HEADER: &str = "X-Cdn-Upstream";
/// The name of a CdnCluster's Service port. Parents look the cluster's pods up by it: the cluster
/// DNS publishes `_http._tcp.NAME.NAMESPACE.svc.DOMAIN` with one SRV record per ready pod of a
/// headless Service (a cache's), one naming the Service itself otherwise.
pub const SERVICE_PORT_NAME: &str = "http";
/// The name of the container and Service ports of HTTPS, when the spec sets `tls`.
pub const TLS_PORT_NAME: &str = "https";

/// The file, in the temp folder, where nginx writes the metrics sidecar (`cdn-operator
/// nginx-metrics`) a line per request, buffered as its access log is: the sidecar reads it as it
/// grows and frees what it read (docs/adr/0004-cdn-metrics-from-a-buffered-log.md).
pub const METRICS_LOG: &str = "cdn-metrics.log";
/// The unix socket, in the temp folder, where nginx serves its connections' status page to the
/// metrics sidecar: out of the network's reach.
pub const STATUS_SOCKET: &str = "nginx-status.sock";

/// Signed URLs: the key of the verifier in the ConfigMap (in [`CONFIG_DIR`] in the pod), and its
/// source, njs.
pub const TOKEN_SCRIPT: &str = "token.js";
pub const TOKEN_SCRIPT_SOURCE: &str = include_str!("token.js");
/// Where the pod mounts the Secret of the keys of signed URLs: each of its entries a key.
pub const TOKEN_KEYS_DIR: &str = "/etc/nginx/token-keys";
/// The file, in the temp folder, where the entrypoint writes the valid keys for nginx to preload
/// ([`token_keys_json`]).
pub const TOKEN_KEYS_FILE: &str = "token-keys.json";
/// The variable holding `ok`, or why the request is refused (the reasons of
/// [`crate::nginx_metrics::log::Denial`]); `-` in a cluster without signed URLs. The last field of
/// the metrics log.
pub const TOKEN_STATUS: &str = "$cdn_token_status";
/// The zone where the workers remember the tokens whose MAC verified: an HMAC once per token.
const TOKEN_ZONE: &str = "zone=cdn_tokens:4m timeout=10m evict";
/// The response headers by which an origin tags its objects for purges (Fastly's and
/// Cloudflare's names): the tiers read them, viewers have no use for them.
pub const SURROGATE_HEADERS: [&str; 2] = ["Surrogate-Key", "Cache-Tag"];

/// The file, in the temp folder, where the entrypoint writes nginx's `resolver` directive.
pub const RESOLVER_FILE: &str = "resolver.conf";
/// How long nginx keeps what it looked up: a source's new address is followed this fast.
pub const RESOLVER_VALID: &str = "5s";
/// A pool member that fails this many times within [`POOL_FAIL_TIMEOUT`] is left out for
/// [`POOL_FAIL_TIMEOUT`], then tried again. Only its own failures count (refused, reset, timed out):
/// what it relays from further up is an answer.
pub const POOL_MAX_FAILS: u32 = 2;
pub const POOL_FAIL_TIMEOUT: &str = "5s";
/// The members a request to a ring with a tier in it tries at most: a tier's pods are members
/// too, however many there are.
pub const RING_TRIES: usize = 3;

/// Timeouts, ordered so that the inner tier gives up first: a cache answers (stale, or the
/// origin's error) before the balancer in front of it would give up on it, so a slow origin
/// neither marks a healthy cache down nor makes the balancer fetch one object again through a
/// second cache. In seconds; [`timeouts_are_ordered`] is the rule.
pub mod timeouts {
    /// An origin that does not accept a connection this fast is failed (the next of its pool).
    pub const ORIGIN_CONNECT: u32 = 3;
    /// An origin silent this long between two reads is failed.
    pub const ORIGIN_READ: u32 = 8;
    /// A request is passed to the next origin of a pool only within this time of its first
    /// attempt: after a quick failure, not after a slow one.
    pub const ORIGIN_NEXT: u32 = 4;
    /// How long a request waits for another that is fetching the same object to cache it, before
    /// going to the origin itself (and not caching what it gets). Short, because an answer that
    /// turns out not cacheable (`no-cache`, `private`) holds every request for its object that
    /// came meanwhile for this long: with nginx's default of 5 s, 200 concurrent requests for a
    /// `no-cache` object waited 4.5 s at the median (data-plane benchmark). Long enough for a
    /// slice (1 MiB) from a healthy origin, so a popular new segment is still fetched once.
    pub const CACHE_LOCK: u32 = 2;
    /// A CdnCluster that does not accept a connection this fast is down: the next member of its
    /// pool gets the request.
    pub const TIER_CONNECT: u32 = 2;
    /// A CdnCluster silent this long between two reads is hung: longer than the worst a cache
    /// waits for its origins before it answers.
    pub const TIER_READ: u32 = 25;
    /// A request is passed to the next member of a pool of CdnClusters only within this time of
    /// its first attempt: long enough to follow a hung member.
    pub const TIER_NEXT: u32 = 30;
}

/// The rule the timeouts follow: a cache's worst wait before it answers (the cache lock, then a
/// last attempt at an origin started just within the pool's bound) is shorter than the read
/// timeout of a balancer in front of it, and a balancer still tries another member after a hung
/// one.
pub const fn timeouts_are_ordered() -> bool {
    use timeouts::*;
    CACHE_LOCK + ORIGIN_NEXT + ORIGIN_CONNECT + ORIGIN_READ < TIER_READ
        && TIER_CONNECT + TIER_READ <= TIER_NEXT
}
const _: () = assert!(timeouts_are_ordered());

/// The ranges a cache trusts `X-Forwarded-For` from by default: the private networks where the
/// pods of the tiers in front of it run.
pub const PRIVATE_RANGES: [&str; 5] = [
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "100.64.0.0/10",
    "fc00::/7",
];

/// The lifetimes by path of a cache whose spec sets no rules, for HLS and DASH: manifests change
/// at every segment, segments never change.
pub const DEFAULT_RULES: [(&str, &str); 2] = [
    (r"\.(m3u8|mpd)$", "2s"),
    (
        r"\.(ts|m4s|mp4|m4a|m4v|aac|ac3|ec3|cmfv|cmfa|vtt|webvtt)$",
        "1d",
    ),
];

/// Objects that live this long or less (seconds; live manifests) are cached whole and refreshed
/// in the background: an expired one is answered at once from the cache, even while its source
/// hangs. Longer-lived objects (segments, files) are cached by slices, which nginx 1.30 can only
/// refresh in the foreground: a background subrequest has no slice of its own
/// (`ngx_http_slice_range_variable`), so it would fetch the whole object under another key and
/// leave the slices stale for good.
pub const BACKGROUND_REFRESH_MAX_SECONDS: u64 = 60;

/// Whether objects fresh for `valid` (nginx's time syntax, as the CRD admits it) are refreshed in
/// the background ([`BACKGROUND_REFRESH_MAX_SECONDS`]).
pub fn refreshed_in_background(valid: &str) -> bool {
    lifetime_seconds(valid).is_some_and(|s| s <= BACKGROUND_REFRESH_MAX_SECONDS)
}

/// nginx's time syntax (`500ms`, `2s`, `10m`, `1d`, `1M`, `90`) in whole seconds, rounded up;
/// `None` when it is not one.
fn lifetime_seconds(valid: &str) -> Option<u64> {
    let split = valid
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(valid.len());
    let (digits, unit) = valid.split_at(split);
    let n: u64 = digits.parse().ok()?;
    let seconds = match unit {
        "ms" => return Some(n.div_ceil(1000)),
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        "w" => 7 * 86_400,
        "M" => 30 * 86_400,
        "y" => 365 * 86_400,
        _ => return None,
    };
    n.checked_mul(seconds)
}

/// A source whose address is known.
#[derive(Clone, Debug, PartialEq)]
pub struct Upstream {
    /// The source's name in the spec, for comments and logs.
    pub name: String,
    /// The regex of requests routed to it; `None` for the default source.
    pub path_condition: Option<String>,
    /// `http` or `https`.
    pub scheme: &'static str,
    /// `host:port` nginx connects to, a host name looked up while nginx runs; for a tier, the
    /// Service's name alone: its pods are looked up by the port's SRV records.
    pub address: String,
    /// The Host header sent upstream; `None` keeps the client's.
    pub host_header: Option<String>,
    /// A path prefixed to every request path (from an origin URL).
    pub path_prefix: String,
    /// Its share of its pool (`weight=` on the hash ring), for each of its pods when a tier.
    pub weight: u32,
    /// Another CdnCluster (a tier of this CDN) rather than an origin: its pods are members of the
    /// hash ring, its timeouts are the tiers', and it is failed over only when it fails itself.
    pub tier: bool,
}

/// The sources that share a location, as indexes into the upstreams: those with the same
/// `pathCondition` (or none), in the order their first member appears.
pub fn pools(upstreams: &[Upstream]) -> Vec<Vec<usize>> {
    let mut pools: Vec<Vec<usize>> = Vec::new();
    for (i, up) in upstreams.iter().enumerate() {
        match pools
            .iter_mut()
            .find(|p| upstreams[p[0]].path_condition == up.path_condition)
        {
            Some(pool) => pool.push(i),
            None => pools.push(vec![i]),
        }
    }
    pools
}

/// A pool named by its members and its condition, for messages: `pool cache-a + cache-b (default)`.
pub fn describe_pool(upstreams: &[Upstream], pool: &[usize]) -> String {
    let members: Vec<&str> = pool.iter().map(|&i| upstreams[i].name.as_str()).collect();
    let condition = upstreams[pool[0]]
        .path_condition
        .as_deref()
        .map(|c| format!("pathCondition {c:?}"))
        .unwrap_or_else(|| "default".into());
    format!("pool {} ({condition})", members.join(" + "))
}

/// Where nginx listens and keeps its files; the pod mounts emptyDirs there (the root filesystem
/// is read-only).
#[derive(Clone, Debug, PartialEq)]
pub struct Paths {
    /// Plain HTTP: a port, or `address:port`.
    pub listen: String,
    /// HTTPS, when the spec sets `tls`.
    pub tls_listen: String,
    pub temp_dir: String,
    pub cache_dir: String,
    /// Where the ConfigMap's files are: the verifier of signed URLs.
    pub config_dir: String,
}

impl Default for Paths {
    fn default() -> Self {
        Paths {
            listen: LISTEN_PORT.to_string(),
            tls_listen: TLS_LISTEN_PORT.to_string(),
            temp_dir: "/tmp".to_string(),
            cache_dir: "/var/cache/nginx".to_string(),
            config_dir: CONFIG_DIR.to_string(),
        }
    }
}

/// HTTPS, when the spec sets `tls`: the certificate and key are the files of [`TLS_DIR`].
#[derive(Clone, Debug, PartialEq, Default)]
pub struct TlsTuning {
    /// Plain HTTP answers a 301 to HTTPS, but for [`HEALTH_PATH`].
    pub redirect: bool,
}

/// The largest on-disk cache of an instance when `cache.size` is not set.
pub const DEFAULT_CACHE_SIZE: &str = "1g";

/// Cache tuning, with defaults applied.
#[derive(Clone, Debug, PartialEq)]
pub struct CacheTuning {
    pub size: String,
    pub inactive: String,
    pub valid: String,
    pub not_found_valid: String,
    pub slice_size: String,
    /// `(pathCondition, valid)`, first match wins.
    pub rules: Vec<(String, String)>,
}

impl Default for CacheTuning {
    fn default() -> Self {
        CacheTuning {
            size: DEFAULT_CACHE_SIZE.into(),
            inactive: "10m".into(),
            valid: "10m".into(),
            not_found_valid: "1s".into(),
            slice_size: "1m".into(),
            rules: DEFAULT_RULES
                .iter()
                .map(|(path, valid)| (path.to_string(), valid.to_string()))
                .collect(),
        }
    }
}

/// How requests are identified and how long those in flight may take at a stop, with defaults
/// applied.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct HttpTuning {
    /// Peers whose X-Forwarded-For and X-Forwarded-Proto are kept.
    pub trusted_proxies: Vec<String>,
    /// Query parameters left out of the cache key and of a pool's hash.
    pub excluded_query_parameters: Vec<String>,
    /// Seconds nginx's workers have, once told to quit, to finish the requests in flight before
    /// nginx closes them itself (and logs them) rather than being killed; `None`: no limit.
    pub shutdown_timeout_seconds: Option<i64>,
    /// Each request is counted by the metrics sidecar: a line to [`METRICS_LOG`], and the
    /// status page on [`STATUS_SOCKET`].
    pub metrics: bool,
    /// Every request but the probes must carry a valid token.
    pub signed_urls: Option<SignedUrlsTuning>,
}

/// Signed URLs (`spec.signedUrls`), with defaults applied.
#[derive(Clone, Debug, PartialEq)]
pub struct SignedUrlsTuning {
    /// The query parameter, and the cookie, that carry the token.
    pub token_name: String,
    /// The token is sent on to the sources; otherwise it is taken out of their requests.
    pub forward_token: bool,
}

impl HttpTuning {
    /// The defaults of `role`: a balancer is the edge and trusts no one; a cache trusts the
    /// private ranges, where the balancers in front of it run.
    pub fn for_role(role: Role) -> Self {
        let trusted_proxies = match role {
            Role::Balancer => Vec::new(),
            Role::Cache => PRIVATE_RANGES.iter().map(|r| r.to_string()).collect(),
        };
        HttpTuning {
            trusted_proxies,
            excluded_query_parameters: Vec::new(),
            shutdown_timeout_seconds: None,
            metrics: false,
            signed_urls: None,
        }
    }
}

/// The file the entrypoint writes for nginx to preload ([`TOKEN_KEYS_FILE`]): the valid keys
/// (hex) and a version that changes with them, which the verifier's memory of good tokens is
/// keyed by. For the tests, which run nginx without the entrypoint: the same shape, another
/// version.
pub fn token_keys_json(keys: &[&str]) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(keys.join(" ").as_bytes());
    let version: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
    let keys: Vec<String> = keys.iter().map(|k| format!("\"{k}\"")).collect();
    format!(
        "{{\"version\":\"{version}\",\"keys\":[{}]}}\n",
        keys.join(",")
    )
}

/// Bytes of nginx's size syntax (`1g`, `512m`, `64k`, `1000`); `None` when it is not one.
pub fn size_bytes(size: &str) -> Option<u64> {
    let (digits, unit) = match size.char_indices().last()? {
        (i, c) if c.is_ascii_alphabetic() => (&size[..i], c.to_ascii_lowercase()),
        _ => (size, 'b'),
    };
    let n: u64 = digits.parse().ok()?;
    let scale = match unit {
        'b' => 1,
        'k' => 1 << 10,
        'm' => 1 << 20,
        'g' => 1 << 30,
        _ => return None,
    };
    n.checked_mul(scale)
}

/// The shared memory of the cache's keys, in MiB: nginx keeps about 8,000 keys in one MiB, and
/// a cache of `size` holds `size` / 128 KiB objects at most on average (slices, segments and
/// small manifests); 16 MiB at least.
pub fn keys_zone_mib(size: &str) -> u64 {
    const AVERAGE_OBJECT: u64 = 128 << 10;
    const KEYS_PER_MIB: u64 = 8_000;
    let objects = size_bytes(size).unwrap_or(0) / AVERAGE_OBJECT;
    objects.div_ceil(KEYS_PER_MIB).max(16)
}

/// The variable holding the query string that identifies an object (`?a=1`, or empty): the query
/// without the excluded parameters.
const KEY_ARGS: &str = "$cdn_key_args";
/// `close` for a response over HTTP/1 that started a background refresh, else empty.
const STALE_CLOSE: &str = "$cdn_stale_close";
/// The variables of the X-Forwarded-* headers sent upstream.
const FORWARDED_FOR: &str = "$cdn_forwarded_for";
const FORWARDED_PROTO: &str = "$cdn_forwarded_proto";

/// Renders the complete nginx.conf; HTTPS too when `tls` is set.
pub fn render(
    title: &str,
    role: Role,
    upstreams: &[Upstream],
    cache: &CacheTuning,
    http: &HttpTuning,
    tls: Option<&TlsTuning>,
    paths: &Paths,
) -> String {
    let mut c = String::new();
    let tmp = &paths.temp_dir;
    // A stop waits for the requests in flight up to the pod's grace: closed by nginx just before
    // it, they are logged and the access log's buffer is written.
    let shutdown = http
        .shutdown_timeout_seconds
        .map(|s| format!("worker_shutdown_timeout {s}s;\n"))
        .unwrap_or_default();
    let signed = http.signed_urls.as_ref();
    // njs, for the verifier of signed URLs; only where it is needed.
    let js_module = if signed.is_some() {
        "# Signed URLs: the tokens are checked by njs.\nload_module modules/ngx_http_js_module.so;\n"
    } else {
        ""
    };
    let token_log = if signed.is_some() {
        format!(" token={TOKEN_STATUS}")
    } else {
        String::new()
    };
    // Infallible: writing to a String.
    let _ = write!(
        c,
        "# nginx configuration of {title} (role {role}), generated by cdn-operator.\n\
         # Do not edit: the operator puts back what it generated.\n\
         worker_processes auto;\n\
         {js_module}\
         {shutdown}\
         pid {tmp}/nginx.pid;\n\
         error_log stderr notice;\n\
         \n\
         events {{\n    worker_connections 4096;\n}}\n\
         \n\
         http {{\n\
         \x20   default_type application/octet-stream;\n\
         \x20   log_format cdn '$remote_addr - [$time_local] \"$request\" $status $body_bytes_sent '\n\
         \x20                  '\"$http_user_agent\" rt=$request_time cache=$upstream_cache_status upstream=$upstream_addr{token_log}';\n\
         {access_log}\
         \x20   server_tokens off;\n\
         \x20   sendfile on;\n\
         \x20   # A cached object's body starts after its headers in the cache file, not on a page: one\n\
         \x20   # big sendfile from there costs a 1 MiB hit a quarter of its throughput; 128k calls do not.\n\
         \x20   sendfile_max_chunk 128k;\n\
         \x20   tcp_nopush on;\n\
         \x20   keepalive_timeout 65s;\n\
         \x20   keepalive_requests 10000;\n\
         \x20   # A pod told to stop answers the next request of a connection used in the last 5 s (a\n\
         \x20   # client fetching back to back, a player its next segment) with Connection: close,\n\
         \x20   # rather than closing it as that request comes in.\n\
         \x20   keepalive_min_timeout 5s;\n\
         \x20   client_body_temp_path {tmp}/client_body;\n\
         \x20   proxy_temp_path {tmp}/proxy;\n\
         \x20   fastcgi_temp_path {tmp}/fastcgi;\n\
         \x20   uwsgi_temp_path {tmp}/uwsgi;\n\
         \x20   scgi_temp_path {tmp}/scgi;\n",
        role = role.as_str(),
        access_log = access_log(http.metrics.then(|| format!("{tmp}/{METRICS_LOG}")).as_deref()),
    );
    // The keys zone's size, in MiB, which its name carries too.
    let zone = keys_zone_mib(&cache.size);
    if role == Role::Cache {
        // The zone's name carries its size: nginx refuses to reload into a zone of another size,
        // and a new name loads the cache on disk into the new zone instead.
        let _ = write!(
            c,
            "    proxy_cache_path {dir}/cdn levels=1:2 keys_zone=cdn_{zone}m:{zone}m max_size={size} inactive={inactive} use_temp_path=off;\n\
             \x20   # Cached files stay open between hits.\n\
             \x20   open_file_cache max=10000 inactive=30s;\n",
            dir = paths.cache_dir,
            size = cache.size,
            inactive = cache.inactive,
        );
    }
    if !upstreams.is_empty() || tls.is_some() {
        // nginx looks its sources (and its certificate's OCSP responder) up itself, with the DNS
        // server the entrypoint found in the pod's /etc/resolv.conf (nginx reads no resolv.conf).
        let _ = writeln!(c, "    include {tmp}/{RESOLVER_FILE};");
    }
    write_forwarding(&mut c, &http.trusted_proxies);
    // A token is never part of an object's identity; it is matched in any case, as nginx reads
    // it.
    let mut excluded: Vec<(&str, bool)> = http
        .excluded_query_parameters
        .iter()
        .map(|p| (p.as_str(), false))
        .collect();
    if let Some(signed) = signed {
        excluded.retain(|(p, _)| *p != signed.token_name);
        excluded.push((&signed.token_name, true));
    }
    write_key_args(&mut c, &excluded);
    match signed {
        Some(signed) => write_signed_urls(&mut c, signed, paths),
        // The metrics log has the field in every cluster: the sidecar reads one format.
        None if http.metrics => {
            let _ = writeln!(
                c,
                "    # No signed URLs: no token status.\n    map \"\" {TOKEN_STATUS} {{\n        default \"-\";\n    }}"
            );
        }
        None => {}
    }

    let background_anywhere = refreshed_in_background(&cache.valid)
        || cache
            .rules
            .iter()
            .any(|(_, valid)| refreshed_in_background(valid));
    if role == Role::Cache && background_anywhere {
        // A response that started a background refresh is the only one STALE with no source
        // asked (one served stale after a failure names the source it tried). HTTP/2 has no
        // `Connection`, and a refresh holds only its stream.
        let _ = writeln!(
            c,
            "    # `close` when this response started a background refresh.\n\
             \x20   map \"$upstream_cache_status|$upstream_addr|$server_protocol\" {STALE_CLOSE} {{\n\
             \x20       \"~^STALE\\|\\|HTTP/1\" close;\n\
             \x20       default \"\";\n\
             \x20   }}"
        );
    }

    let pools = pools(upstreams);
    for pool in &pools {
        let i = pool[0];
        c.push('\n');
        for &m in pool {
            let up = &upstreams[m];
            let _ = writeln!(c, "    # source {}", comment(&up.name));
        }
        let _ = writeln!(c, "    upstream source_{i} {{");
        // A ring when there is more than one member: a pool, or a tier's pods.
        let ring = pool.len() > 1 || pool.iter().any(|&m| upstreams[m].tier);
        if ring {
            // One member per object, so each object is fetched and cached by one cache pod of
            // the pool; a member leaving or joining moves only its own share of the objects. The
            // key is the caches' own key, so an excluded parameter does not spread an object.
            // nginx places a member on the ring by its name: a tier's pods by the names their
            // SRV records give each (the addresses of one A name would share its points and be
            // taken in turns).
            let _ = writeln!(c, "        hash $host$uri{KEY_ARGS} consistent;");
        }
        // The addresses nginx looks up while it runs are kept in the zone, and the failures
        // seen by one worker mark a member down for all of them.
        let _ = writeln!(c, "        zone source_{i} 64k;");
        for &m in pool {
            let up = &upstreams[m];
            // `resolve`: a name is looked up again while nginx runs (every `RESOLVER_VALID`), so a
            // Service that appears after nginx started, is re-created with another address, or an
            // origin whose DNS changes is followed without a new configuration; an address is
            // taken as it is.
            let lookup = if up.tier {
                format!(" service={SERVICE_PORT_NAME}")
            } else {
                String::new()
            };
            if ring {
                // Weights written doubled: on a line whose weight is 1, nginx gives each pod
                // the weight of its SRV record instead (the cluster DNS divides 100 among a
                // Service's pods), and sources of weight 1 and 2 would no longer be 1:2.
                let _ = writeln!(
                    c,
                    "        server {}{lookup} resolve weight={} max_fails={POOL_MAX_FAILS} fail_timeout={POOL_FAIL_TIMEOUT};",
                    up.address,
                    2 * up.weight,
                );
            } else {
                let _ = writeln!(c, "        server {} resolve;", up.address);
            }
        }
        // Connections to every source are reused (HTTP/1.1 without `Connection: close`, set in
        // each location); the sources' own idle timeouts are longer (65s for a CdnCluster). Up
        // to 10,000 requests a connection, as a CdnCluster serves them: nginx's default of 1,000
        // reopened the balancer's connections 270 times in 5 s of load.
        let _ = writeln!(
            c,
            "        keepalive 32;\n        keepalive_requests 10000;\n        keepalive_timeout 60s;\n    }}"
        );
    }
    let redirect = tls.is_some_and(|t| t.redirect);
    if redirect {
        // Plain HTTP only redirects; the probes stay on it.
        let _ = write!(
            c,
            "\n    # Plain HTTP: a redirect to the same URL over HTTPS, but for the probes.\n\
             \x20   server {{\n\
             \x20       listen {listen};\n",
            listen = paths.listen,
        );
        if http.metrics {
            c.push_str(NO_SOURCE);
        }
        write_health(&mut c);
        c.push_str(
            "\n        location / {\n            return 301 https://$host$request_uri;\n        }\n    }\n",
        );
    }
    if http.metrics {
        let _ = write!(
            c,
            "\n    # nginx's connections, for the metrics sidecar: on a unix socket, out of the network's reach.\n\
             \x20   server {{\n\
             \x20       listen unix:{tmp}/{STATUS_SOCKET};\n\
             \x20       access_log off;\n\
             \x20       location = {status} {{\n\
             \x20           stub_status;\n\
             \x20       }}\n\
             \x20       location / {{\n\
             \x20           return 404;\n\
             \x20       }}\n\
             \x20   }}\n",
            status = crate::nginx_metrics::STATUS_PATH,
        );
    }
    c.push_str("\n    server {\n");
    if http.metrics {
        c.push_str(NO_SOURCE);
    }
    if !redirect {
        let _ = writeln!(c, "        listen {};", paths.listen);
    }
    if tls.is_some() {
        write_tls(&mut c, &paths.tls_listen);
    }
    c.push_str("\n        proxy_http_version 1.1;\n");
    if role == Role::Balancer || signed.is_some() {
        // An origin's purge tags stay inside the CDN: read by the caches, which keep them with
        // their objects for the tiers in front, never shown to a viewer.
        c.push_str(
            "        # The origin's purge tags (surrogate keys) are the CDN's, not the viewers'.\n",
        );
        for header in SURROGATE_HEADERS {
            let _ = writeln!(c, "        proxy_hide_header {header};");
        }
    }
    if role == Role::Cache {
        let _ = write!(
            c,
            "\n        proxy_cache cdn_{zone}m;\n\
             \x20       # Large objects are fetched and cached by slices: a range fetches only what it covers.\n\
             \x20       slice {slice};\n\
             \x20       # The host is part of the key: one path of two sites is two objects. So is a\n\
             \x20       # HEAD, which is passed on as a HEAD: it does not fetch the body.\n\
             \x20       proxy_cache_key $request_method$host$uri{KEY_ARGS}$slice_range;\n\
             \x20       proxy_cache_convert_head off;\n\
             \x20       # Concurrent misses of one object make one request to the source.\n\
             \x20       proxy_cache_lock on;\n\
             \x20       proxy_cache_lock_timeout {lock}s;\n\
             \x20       proxy_cache_lock_age {lock}s;\n\
             \x20       # What is cached is served while the source fails, hangs or is being asked again by\n\
             \x20       # another request; the request that finds it expired asks again and waits, but where\n\
             \x20       # objects are refreshed in the background (short lifetimes, whole objects).\n\
             \x20       proxy_cache_use_stale error timeout invalid_header updating http_500 http_502 http_503 http_504;\n\
             \x20       proxy_cache_revalidate on;\n\
             \x20       # A request with credentials gets the viewer's own answer (RFC 9111, 3.5): neither\n\
             \x20       # served from the cache nor stored, so never shown to another viewer, and it waits\n\
             \x20       # for no other request's fetch.\n\
             \x20       proxy_cache_bypass $http_authorization;\n\
             \x20       proxy_no_cache $http_authorization;\n\
             \x20       # Each cache reports its own status, not the one of a cache behind it.\n\
             \x20       proxy_hide_header {header};\n\
             \x20       add_header {header} $upstream_cache_status always;\n",
            slice = cache.slice_size,
            lock = timeouts::CACHE_LOCK,
            header = CACHE_STATUS_HEADER,
        );
    }
    write_health(&mut c);
    // Every route is a regex location, the default last (`^/`): nginx looks for a regex nested in
    // a prefix location before the regexes beside it, so a lifetime rule nested in `location /`
    // would take the paths of the routes written after it.
    let routes = pools
        .iter()
        .filter(|p| upstreams[p[0]].path_condition.is_some())
        .map(|p| {
            (
                upstreams[p[0]]
                    .path_condition
                    .as_deref()
                    .unwrap_or_default(),
                p,
                "",
            )
        });
    let default = pools
        .iter()
        .find(|p| upstreams[p[0]].path_condition.is_none())
        .map(|p| ("^/", p, "default "));
    for (regex, pool, what_kind) in routes.chain(default) {
        let _ = write!(
            c,
            "\n        # {what_kind}{what}\n        location ~ \"{regex}\" {{\n{body}",
            what = what(upstreams, pool),
            regex = quote(regex),
            body = proxy(
                role,
                upstreams,
                pool,
                &cache.valid,
                cache,
                http,
                "            "
            ),
        );
        if role == Role::Cache {
            for (rule, valid) in &cache.rules {
                let _ = write!(
                    c,
                    "\n            # lifetime rule\n            location ~ \"{rule}\" {{\n{body}            }}\n",
                    rule = quote(rule),
                    body = proxy(role, upstreams, pool, valid, cache, http, "                "),
                );
            }
        }
        c.push_str("        }\n");
    }
    if default.is_none() {
        let _ = write!(
            c,
            "\n        # no default source: paths no source matches are not found\n        location / {{\n{check}            return 404;\n        }}\n",
            check = if signed.is_some() { token_check("            ") } else { String::new() },
        );
    }
    c.push_str("    }\n}\n");
    c
}

/// The probes' location: answered by nginx itself, never by a source.
fn write_health(c: &mut String) {
    let _ = write!(
        c,
        "\n        location = {HEALTH_PATH} {{\n\
         \x20           access_log off;\n\
         \x20           default_type text/plain;\n\
         \x20           return 200 \"ok\\n\";\n\
         \x20       }}\n"
    );
}

/// HTTPS in the server of the routes, on `listen`: the same locations answer both ports, and
/// `$scheme` (so X-Forwarded-Proto) says which one a request came on.
fn write_tls(c: &mut String, listen: &str) {
    let _ = write!(
        c,
        "        # HTTPS (spec.tls): the same routes and cache, over HTTP/2 or HTTP/1.1.\n\
         \x20       listen {listen} ssl;\n\
         \x20       http2 on;\n\
         \x20       # The Secret's files: the entrypoint reloads nginx when they change (a renewal).\n\
         \x20       ssl_certificate {TLS_DIR}/{TLS_CERT_FILE};\n\
         \x20       ssl_certificate_key {TLS_DIR}/{TLS_KEY_FILE};\n\
         \x20       # Mozilla's \"intermediate\" configuration.\n\
         \x20       ssl_protocols TLSv1.2 TLSv1.3;\n\
         \x20       ssl_ciphers {TLS_CIPHERS};\n\
         \x20       ssl_prefer_server_ciphers off;\n\
         \x20       # Sessions resume from a cache the workers share, not from tickets (forward secrecy).\n\
         \x20       ssl_session_cache shared:cdn_tls:10m;\n\
         \x20       ssl_session_timeout 1d;\n\
         \x20       ssl_session_tickets off;\n\
         \x20       # The OCSP responder named by the certificate, asked through the resolver: nginx\n\
         \x20       # only warns when it names none.\n\
         \x20       ssl_stapling on;\n\
         \x20       ssl_stapling_verify on;\n"
    );
}

/// The viewer's address and the X-Forwarded-* headers sent upstream. nginx's realip module makes
/// `$remote_addr` the viewer as the trusted proxies in front report it (X-Forwarded-For, read
/// from the right, past every trusted address), `$realip_remote_addr` staying the peer: what
/// the access log says and what a token bound to an address is checked against. Upstream: from a
/// trusted peer (a tier in front of this one), its X-Forwarded-For with the peer appended and its
/// X-Forwarded-Proto; from any other peer, the peer's address and this hop's scheme alone, so a
/// client cannot forge them.
fn write_forwarding(c: &mut String, trusted: &[String]) {
    if !trusted.is_empty() {
        c.push_str("\n    # The viewer, as the trusted proxies in front report it.\n");
        for range in trusted {
            let _ = writeln!(c, "    set_real_ip_from {range};");
        }
        c.push_str("    real_ip_header X-Forwarded-For;\n    real_ip_recursive on;\n");
    }
    let _ = write!(
        c,
        "\n    # 1 when the peer is a trusted proxy.\n    geo $realip_remote_addr $cdn_trusted_peer {{\n        default 0;\n"
    );
    for range in trusted {
        let _ = writeln!(c, "        {range} 1;");
    }
    let _ = write!(
        c,
        "    }}\n\
         \x20   map \"$cdn_trusted_peer$http_x_forwarded_for\" {FORWARDED_FOR} {{\n\
         \x20       \"~^1(?<cdn_xff>.+)$\" \"$cdn_xff, $realip_remote_addr\";\n\
         \x20       default $realip_remote_addr;\n\
         \x20   }}\n\
         \x20   map \"$cdn_trusted_peer$http_x_forwarded_proto\" {FORWARDED_PROTO} {{\n\
         \x20       \"~^1(?<cdn_xfp>https?)$\" $cdn_xfp;\n\
         \x20       default $scheme;\n\
         \x20   }}\n"
    );
}

/// Signed URLs: the token (`$cdn_token`, the parameter else the cookie), the verifier and its
/// keys, `$cdn_token_status`; unless the token goes on to the sources, the query and cookies they
/// get without it. Parameter and cookie names are matched as nginx's `$arg_` and `$cookie_` match
/// them: in any case.
fn write_signed_urls(c: &mut String, signed: &SignedUrlsTuning, paths: &Paths) {
    let name = &signed.token_name;
    let pattern = quote(&regex_literal(name));
    let _ = write!(
        c,
        "    # Signed URLs (spec.signedUrls): the token, from the parameter {name}, else the cookie.\n\
         \x20   map $arg_{name} $cdn_token {{\n\
         \x20       \"\" $cookie_{name};\n\
         \x20       default $arg_{name};\n\
         \x20   }}\n\
         \x20   # The verifier (njs), with the keys the entrypoint found in the Secret, and the tokens\n\
         \x20   # it verified already, which the workers share.\n\
         \x20   js_import cdn_token from {config}/{TOKEN_SCRIPT};\n\
         \x20   js_preload_object cdn_token_keys from {tmp}/{TOKEN_KEYS_FILE};\n\
         \x20   js_shared_dict_zone {TOKEN_ZONE};\n\
         \x20   # ok, or why the request is refused.\n\
         \x20   js_set {TOKEN_STATUS} cdn_token.verify;\n",
        config = paths.config_dir,
        tmp = paths.temp_dir,
    );
    if signed.forward_token {
        return;
    }
    let _ = write!(
        c,
        "    # The sources get the request without the token: the parameter taken out of the query\n\
         \x20   # (when it is there: the path is then sent as nginx normalized it), the cookie out of Cookie.\n\
         \x20   map $args $cdn_token_in_args {{\n\
         \x20       \"~*(?:^|&){pattern}(?:=|&|$)\" 1;\n\
         \x20       default \"\";\n\
         \x20   }}\n\
         \x20   map $args $cdn_origin_args_0 {{\n\
         \x20       \"~*^(?<cdn_args_before>.*?)(?:^|&){pattern}(?:=[^&]*)?(?<cdn_args_after>&.*)?$\" \"$cdn_args_before$cdn_args_after\";\n\
         \x20       default $args;\n\
         \x20   }}\n\
         \x20   map $cdn_origin_args_0 $cdn_origin_args {{\n\
         \x20       \"~^&(?<cdn_args_rest>.*)$\" $cdn_args_rest;\n\
         \x20       default $cdn_origin_args_0;\n\
         \x20   }}\n\
         \x20   map $http_cookie $cdn_origin_cookie_0 {{\n\
         \x20       \"~*^(?<cdn_cookie_before>.*?)(?:^|;\\s*){pattern}=[^;]*(?<cdn_cookie_after>.*)$\" \"$cdn_cookie_before$cdn_cookie_after\";\n\
         \x20       default $http_cookie;\n\
         \x20   }}\n\
         \x20   map $cdn_origin_cookie_0 $cdn_origin_cookie {{\n\
         \x20       \"~^;\\s*(?<cdn_cookie_rest>.*)$\" $cdn_cookie_rest;\n\
         \x20       default $cdn_origin_cookie_0;\n\
         \x20   }}\n"
    );
}

/// The refusal of a request whose token is not good, indented by `pad`: before any source is
/// asked, in every location that could ask one (a nested location runs none of its parent's).
fn token_check(pad: &str) -> String {
    format!("{pad}if ({TOKEN_STATUS} != ok) {{\n{pad}    return 403;\n{pad}}}\n")
}

/// `$cdn_key_args`: `?` and the query without the excluded parameters, or empty. Each map takes
/// out the first occurrence of one parameter, with or without a value.
fn write_key_args(c: &mut String, excluded: &[(&str, bool)]) {
    let _ = writeln!(
        c,
        "    # The query that identifies an object{}.",
        if excluded.is_empty() {
            String::new()
        } else {
            format!(
                ", without {}",
                excluded
                    .iter()
                    .map(|(p, _)| comment(p))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        }
    );
    let _ = writeln!(
        c,
        "    map $args $cdn_args_0 {{\n        default \"&$args\";\n    }}"
    );
    for (i, (name, any_case)) in excluded.iter().enumerate() {
        let escaped = regex_literal(name);
        let n = i + 1;
        let case = if *any_case { "*" } else { "" };
        let _ = writeln!(
            c,
            "    map $cdn_args_{i} $cdn_args_{n} {{\n        \"~{case}^(?<cdn_before_{n}>.*?)&{escaped}(?:=[^&]*)?(?<cdn_after_{n}>&.*)?$\" \"$cdn_before_{n}$cdn_after_{n}\";\n        default $cdn_args_{i};\n    }}",
            escaped = quote(&escaped),
        );
    }
    let _ = writeln!(
        c,
        "    map $cdn_args_{last} {KEY_ARGS} {{\n        \"~^&(?<cdn_query>.+)$\" \"?$cdn_query\";\n        default \"\";\n    }}",
        last = excluded.len()
    );
}

/// `s` matched literally by a PCRE regex.
fn regex_literal(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        if r"\.^$|?*+()[]{}".contains(ch) {
            out.push('\\');
        }
        out.push(ch);
    }
    out
}

/// The names of the sources of `pool`, each on one line.
fn names(upstreams: &[Upstream], pool: &[usize]) -> Vec<String> {
    pool.iter().map(|&m| comment(&upstreams[m].name)).collect()
}

/// What the sources of `pool` are, for the metrics: `cdncluster` (tiers of this CDN), `origin`,
/// or `mixed`.
fn source_kind(upstreams: &[Upstream], pool: &[usize]) -> &'static str {
    let tiers = pool.iter().filter(|&&m| upstreams[m].tier).count();
    match tiers {
        0 => "origin",
        n if n == pool.len() => "cdncluster",
        _ => "mixed",
    }
}

/// The source of what nginx answers itself (probes, redirects, a path no source matches), in
/// the server: each proxying location sets its own.
const NO_SOURCE: &str = "        set $cdn_source \"none none\";\n";

/// The access logs: nginx's own to stdout, and with a `metrics` file a line per request (and per
/// slice) there, for the metrics sidecar.
fn access_log(metrics: Option<&str>) -> String {
    // Buffered: a write per request costs a fifth of the throughput of hits.
    let stdout = "access_log /dev/stdout cdn buffer=64k flush=1s";
    let Some(file) = metrics else {
        return format!(
            "    # Buffered: a write per request costs a fifth of the throughput of hits.\n    {stdout};\n"
        );
    };
    format!(
        "    # Buffered: a write per request costs a fifth of the throughput of hits. Client requests\n\
         \x20   # only: a subrequest (a slice) has no request of its own ($request_length 0).\n\
         \x20   map $request_length $cdn_client_request {{\n\
         \x20       0 0;\n\
         \x20       default 1;\n\
         \x20   }}\n\
         \x20   {stdout} if=$cdn_client_request;\n\
         \x20   # A line per request, and per slice fetched, for the metrics sidecar, buffered as the\n\
         \x20   # access log: a file nginx never waits for, which the sidecar reads and frees.\n\
         \x20   log_format cdn_metrics \"{format}\";\n\
         \x20   log_subrequest on;\n\
         \x20   access_log {file} cdn_metrics buffer=64k flush=1s;\n",
        format = crate::nginx_metrics::log::FORMAT,
    )
}

/// `source NAME`, or `pool A + B` for a pool of several sources.
fn what(upstreams: &[Upstream], pool: &[usize]) -> String {
    let names = names(upstreams, pool);
    match names.len() {
        1 => format!("source {}", names[0]),
        _ => format!("pool {}", names.join(" + ")),
    }
}

/// The directives of a location that proxies to `pool`, indented by `pad`, its successful
/// answers fresh for `valid` (in a cache). Everything is written in each location: nginx drops a
/// server's `proxy_set_header` lines in a location that sets one, and a nested location runs
/// none of its parent's `rewrite`.
fn proxy(
    role: Role,
    upstreams: &[Upstream],
    pool: &[usize],
    valid: &str,
    cache: &CacheTuning,
    http: &HttpTuning,
    pad: &str,
) -> String {
    let i = pool[0];
    let up = &upstreams[i];
    let mut b = String::new();
    let host = up
        .host_header
        .as_deref()
        .map(quote)
        .unwrap_or_else(|| "$host".to_string());
    if http.metrics {
        let _ = writeln!(
            b,
            "{pad}set $cdn_source \"{} {}\";",
            source_kind(upstreams, pool),
            quote(&names(upstreams, pool).join("+"))
        );
    }
    let strip_token = http.signed_urls.as_ref().is_some_and(|s| !s.forward_token);
    if http.signed_urls.is_some() {
        b.push_str(&token_check(pad));
        if strip_token {
            // Only then: setting $args sends the path as nginx decoded and normalized it.
            let _ = writeln!(
                b,
                "{pad}if ($cdn_token_in_args) {{\n{pad}    set $args $cdn_origin_args;\n{pad}}}"
            );
        }
    }
    let mut line = |text: &str| {
        b.push_str(pad);
        b.push_str(text);
        b.push('\n');
    };
    line(&format!("proxy_set_header Host \"{host}\";"));
    line("proxy_set_header Connection \"\";");
    line(&format!(
        "proxy_set_header X-Forwarded-For {FORWARDED_FOR};"
    ));
    line(&format!(
        "proxy_set_header X-Forwarded-Proto {FORWARDED_PROTO};"
    ));
    if strip_token {
        line("proxy_set_header Cookie $cdn_origin_cookie;");
    }
    let background = role == Role::Cache && refreshed_in_background(valid);
    if background {
        line(
            "# Short-lived: cached whole and refreshed in the background, so an expired object is",
        );
        line("# answered at once, even while the source hangs.");
        line("slice 0;");
        line("proxy_cache_background_update on;");
    }
    if role == Role::Cache {
        line("proxy_set_header Range $slice_range;");
        line(&format!("proxy_cache_valid 200 206 301 302 {valid};"));
        line(&format!(
            "proxy_cache_valid 404 410 {};",
            cache.not_found_valid
        ));
    }
    if !up.path_prefix.is_empty() {
        // A regex location cannot give proxy_pass a URI part: prefix the path by rewriting.
        line(&format!(
            "rewrite ^(.*)$ \"{}$1\" break;",
            quote(&up.path_prefix)
        ));
    }
    if up.scheme == "https" {
        let server_name = up.host_header.as_deref().map(quote).unwrap_or_default();
        line("proxy_ssl_server_name on;");
        line(&format!("proxy_ssl_name \"{server_name}\";"));
    }
    // More than one member: a pool, or a tier's pods.
    let pooled = pool.len() > 1 || pool.iter().any(|&m| upstreams[m].tier);
    let (connect, read, next) = if up.tier {
        use timeouts::{TIER_CONNECT, TIER_NEXT, TIER_READ};
        (TIER_CONNECT, TIER_READ, TIER_NEXT)
    } else {
        use timeouts::{ORIGIN_CONNECT, ORIGIN_NEXT, ORIGIN_READ};
        (ORIGIN_CONNECT, ORIGIN_READ, ORIGIN_NEXT)
    };
    line(&format!("proxy_connect_timeout {connect}s;"));
    line(&format!("proxy_read_timeout {read}s;"));
    if up.tier || !pooled {
        // A CdnCluster is failed over when it fails itself: an error it relays from its origin
        // is an answer, passed on, and marks no member down.
        line("proxy_next_upstream error timeout;");
    } else {
        // Redundant origins: one that answers 502/503/504 is skipped for this request too.
        line("proxy_next_upstream error timeout http_502 http_503 http_504;");
    }
    if pooled {
        // Each member at most once.
        let tries = if pool.iter().any(|&m| upstreams[m].tier) {
            pool.len().max(RING_TRIES)
        } else {
            pool.len()
        };
        line(&format!("proxy_next_upstream_tries {tries};"));
    }
    line(&format!("proxy_next_upstream_timeout {next}s;"));
    if pooled {
        // Which member answered (after those that failed): for debugging the balance.
        line(&format!(
            "add_header {UPSTREAM_HEADER} $upstream_addr always;"
        ));
    }
    if role == Role::Cache && (pooled || background) {
        // A location's add_header replaces the server's: repeat the cache status.
        line(&format!(
            "add_header {CACHE_STATUS_HEADER} $upstream_cache_status always;"
        ));
    }
    if background {
        // The connection of a response that started a background refresh takes no other
        // request until the refresh ends (nginx keeps the request open): up to the read timeout
        // while the source hangs. Closed after it, a client or a balancer in front asks again
        // on another connection at once.
        line(&format!("add_header Connection {STALE_CLOSE};"));
    }
    line(&format!("proxy_pass {}://source_{i};", up.scheme));
    b
}

/// Escapes a string for an nginx double-quoted token: nginx unescapes `\\` and `\"` there.
fn quote(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

/// Keeps a user-supplied string on one comment line.
fn comment(s: &str) -> String {
    s.chars().filter(|c| !c.is_control()).collect()
}
