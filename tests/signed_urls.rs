//! Signed URLs (`spec.signedUrls`) on real nginx 1.30 with njs, as the pods run them: balancers
//! with signed URLs (`edge`; `edge-fwd`, which forwards the token; `edge-lb`, behind a trusted
//! load balancer) in front of a cache `cache` in front of a Service origin that logs what it is
//! asked (path, query, cookies). The configurations are the operator's, with only the listen
//! address and the file paths moved; the verifier is the ConfigMap's script and the keys the file
//! the entrypoint writes (`nginx::token_keys_json`; the rotation test runs the entrypoint
//! itself). Each test has a /24 of loopback of its own, so the tests run side by side.
//!
//! On loopback every client is 127.0.0.1: it is the viewer's address the edge sees, and the
//! trusted load balancer of `edge-lb`.

mod support;

use cdn_operator::api::{CdnCluster, CdnClusterSpec, HttpSpec, Role, SignedUrls, Source};
use cdn_operator::cdncluster::build::{self, CONFIG_KEY, ENTRYPOINT_KEY};
use cdn_operator::cdncluster::nginx::{
    self, Paths, CACHE_STATUS_HEADER, TOKEN_KEYS_DIR, TOKEN_KEYS_FILE, TOKEN_SCRIPT,
    TOKEN_SCRIPT_SOURCE,
};
use cdn_operator::cli::sign_url::{self, Fields};
use cdn_operator_testkit::{request, settle, Nginx, Response, Sandbox};
use serde::Deserialize;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};
use support::Names;

const HOST: (&str, &str) = ("Host", "cdn.example");
/// The keys of the Secret (the vectors' two), and one it does not hold.
const KEY_A: &str = "6f1ed002ab5595859014ebf0951522d9e0b6e3fa8b0ebc7a1c4a6b7e35ff9c1c";
const KEY_B: &str = "00112233445566778899aabbccddeeff";
const KEY_C: &str = "c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00";
const TOKEN: &str = "__token__";

fn now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A token under `key` admitting `acl` for an hour, with `tune` applied to its fields.
fn token(key: &str, acl: &[&str], tune: impl FnOnce(&mut Fields)) -> String {
    let mut fields = Fields {
        expires: now() + 3600,
        acl: acl.iter().map(|p| p.to_string()).collect(),
        ..Fields::default()
    };
    tune(&mut fields);
    sign_url::token(&sign_url::parse_key(key).unwrap(), &fields)
}

fn with_token(path: &str, token: &str) -> String {
    let separator = if path.contains('?') { '&' } else { '?' };
    format!("{path}{separator}{TOKEN}={token}")
}

fn cluster(name: &str, role: Role, sources: Vec<Source>) -> CdnCluster {
    let mut c = CdnCluster::new(name, CdnClusterSpec::new(role, sources));
    c.metadata.namespace = Some("default".into());
    c.metadata.uid = Some(format!("{name}-uid"));
    c
}

fn signed(mut c: CdnCluster, forward_token: bool) -> CdnCluster {
    c.spec.signed_urls = Some(Box::new(SignedUrls {
        secret_name: "token-keys".into(),
        token_name: None,
        forward_token,
    }));
    c
}

/// The CdnClusters of every test.
fn clusters() -> Vec<CdnCluster> {
    let to_cache = || vec![Source::cluster("cache", None)];
    let mut behind_lb = signed(cluster("edge-lb", Role::Balancer, to_cache()), false);
    behind_lb.spec.http = Some(Box::new(HttpSpec {
        trusted_proxies: Some(vec!["127.0.0.1".into()]),
        ..HttpSpec::default()
    }));
    // The cache behind a balancer that forwards the token keeps it out of its key too.
    let mut cache = cluster(
        "cache",
        Role::Cache,
        vec![Source::service("origin", "origin", 80, None)],
    );
    cache.spec.http = Some(Box::new(HttpSpec {
        excluded_query_parameters: Some(vec![TOKEN.into()]),
        ..HttpSpec::default()
    }));
    vec![
        cache,
        signed(cluster("edge", Role::Balancer, to_cache()), false),
        signed(cluster("edge-fwd", Role::Balancer, to_cache()), true),
        behind_lb,
        // A cache with signed URLs of its own, fetching large objects by slices.
        signed(
            cluster(
                "cache-signed",
                Role::Cache,
                vec![Source::service("origin", "origin", 80, None)],
            ),
            false,
        ),
    ]
}

fn ip(net: u8, name: &str) -> String {
    let host = match name {
        "origin" => 10,
        "cache" => 11,
        "cache-signed" => 12,
        "edge" => 20,
        "edge-fwd" => 21,
        "edge-lb" => 22,
        "pod" => 30,
        other => panic!("no address for {other}"),
    };
    format!("127.0.{net}.{host}")
}

fn address(net: u8, name: &str) -> String {
    format!("{}:80", ip(net, name))
}

/// The origin: files under `www`, `Surrogate-Key` and `Cache-Tag` on every answer; its access log
/// holds, per request, what it was asked and with which cookies.
fn origin_config(dir: &Path, net: u8) -> String {
    let d = dir.display();
    let listen = address(net, "origin");
    format!(
        "pid {d}/origin.pid;\nevents {{}}\nhttp {{\n\
         \x20 log_format asked '$request_uri|$http_cookie';\n\
         \x20 access_log {d}/origin.access asked;\n\
         \x20 client_body_temp_path {d}/tmp; proxy_temp_path {d}/tmp; fastcgi_temp_path {d}/tmp;\n\
         \x20 uwsgi_temp_path {d}/tmp; scgi_temp_path {d}/tmp;\n\
         \x20 server {{\n\
         \x20   listen {listen};\n\
         \x20   root {d}/www;\n\
         \x20   add_header Surrogate-Key \"title-1 all\";\n\
         \x20   add_header Cache-Tag \"title-1\";\n\
         \x20 }}\n\
         }}\n"
    )
}

/// One request the origin served: its URI (path and query) and Cookie header (`-`: none).
#[derive(Debug, PartialEq)]
struct Asked {
    uri: String,
    cookie: String,
}

/// The metrics sidecar of an instance (`cdn-operator nginx-metrics`), as its pod runs it;
/// stopped when dropped.
struct Sidecar {
    child: std::process::Child,
    listen: String,
}

impl Sidecar {
    fn start(cluster: &CdnCluster, own: &Path, listen: &str) -> Sidecar {
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_cdn-operator"))
            .arg("nginx-metrics")
            .arg("--log")
            .arg(own.join(nginx::METRICS_LOG))
            .arg("--nginx-status")
            .arg(own.join(nginx::STATUS_SOCKET))
            .args(["--listen", listen])
            .args(["--cdncluster", cluster.metadata.name.as_deref().unwrap()])
            .args(["--role", cluster.spec.role.as_str()])
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("the sidecar starts");
        let sidecar = Sidecar {
            child,
            listen: listen.into(),
        };
        let serving = settle(
            Duration::from_secs(10),
            Duration::from_millis(20),
            || TcpStream::connect(listen).is_ok(),
            |up| *up,
        );
        assert!(serving, "the sidecar serves on {listen}");
        sidecar
    }

    fn scrape(&self) -> String {
        request(&self.listen, "GET", "/metrics", &[], b"")
            .unwrap()
            .body
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The origin, the cache and the balancers running, the edge counted by a metrics sidecar.
struct World {
    net: u8,
    sandbox: Sandbox,
    names: Names,
    clusters: Vec<CdnCluster>,
    running: Vec<Nginx>,
    sidecar: Option<Sidecar>,
    _origin: Nginx,
    /// Last: removed once everything that writes in it has stopped.
    dir: tempfile::TempDir,
}

impl World {
    fn start(net: u8) -> World {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir_all(d.join("www")).unwrap();
        std::fs::create_dir_all(d.join("tmp")).unwrap();
        let ips: Vec<(String, String)> = [
            "origin",
            "cache",
            "edge",
            "edge-fwd",
            "edge-lb",
            "cache-signed",
        ]
        .into_iter()
        .map(|name| (format!("{name}.default.svc.cluster.local"), ip(net, name)))
        .collect();
        let pairs: Vec<(&str, &str)> = ips.iter().map(|(n, a)| (n.as_str(), a.as_str())).collect();
        let names = Names::new(d, &format!("127.0.{net}.53"), &pairs);
        let sandbox = names.sandbox(d);
        let origin = Nginx::start(
            &sandbox,
            "origin",
            &origin_config(d, net),
            d,
            &address(net, "origin"),
        );
        let mut world = World {
            net,
            sandbox,
            names,
            clusters: clusters(),
            running: Vec::new(),
            sidecar: None,
            _origin: origin,
            dir,
        };
        for name in ["cache", "edge", "edge-fwd", "edge-lb", "cache-signed"] {
            world.run(name);
        }
        world
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Starts `name`'s nginx with its own folders; a cluster with signed URLs with the verifier
    /// where the ConfigMap puts it and the keys A and B where the entrypoint writes them, `edge`
    /// counted by its sidecar; once it found its sources.
    fn run(&mut self, name: &str) {
        let own = self.path().join(name);
        std::fs::create_dir_all(&own).unwrap();
        let own_dir = own.to_str().unwrap().to_string();
        let listen = address(self.net, name);
        let paths = Paths {
            listen: listen.clone(),
            temp_dir: own_dir.clone(),
            cache_dir: own_dir.clone(),
            config_dir: own_dir,
            ..Paths::default()
        };
        let cluster = self
            .clusters
            .iter()
            .find(|c| c.metadata.name.as_deref() == Some(name))
            .unwrap()
            .clone();
        let counted = name == "edge";
        if counted {
            let sidecar = Sidecar::start(&cluster, &own, &format!("{}:9113", ip(self.net, name)));
            self.sidecar = Some(sidecar);
        }
        if cluster.spec.signed_urls.is_some() {
            std::fs::write(own.join(TOKEN_SCRIPT), TOKEN_SCRIPT_SOURCE).unwrap();
            std::fs::write(
                own.join(TOKEN_KEYS_FILE),
                nginx::token_keys_json(&[KEY_A, KEY_B]),
            )
            .unwrap();
        }
        let conf = self
            .names
            .config_counted(&cluster, &self.clusters, &paths, counted);
        let nginx = Nginx::start(&self.sandbox, name, &conf, self.path(), &listen);
        wait_resolved(&listen);
        self.running.push(nginx);
    }

    /// Writes the object `path` of the origin.
    fn put(&self, path: &str, body: &str) {
        let file = self.path().join("www").join(path.trim_start_matches('/'));
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(file, body).unwrap();
    }

    fn get(&self, to: &str, path: &str, headers: &[(&str, &str)]) -> Response {
        let mut all = vec![HOST];
        all.extend(headers);
        request(&address(self.net, to), "GET", path, &all, b"")
            .unwrap_or_else(|e| panic!("GET {path} from {to}: {e}"))
    }

    /// What the origin served so far (its log once settled, [`settled_log`](cdn_operator_testkit::nginx::settled_log)), the lookups' probes left out.
    fn asked(&self) -> Vec<Asked> {
        let log = cdn_operator_testkit::nginx::settled_log(&self.path().join("origin.access"));
        log.lines()
            .filter(|l| !l.starts_with("/not-here/"))
            .map(|l| {
                let (uri, cookie) = l.split_once('|').unwrap();
                Asked {
                    uri: uri.into(),
                    cookie: cookie.into(),
                }
            })
            .collect()
    }

    fn asked_for(&self, path: &str) -> Vec<Asked> {
        self.asked()
            .into_iter()
            .filter(|a| a.uri.split('?').next() == Some(path))
            .collect()
    }

    /// What the edge's sidecar counted, once nginx wrote its log (at least every second) and
    /// the sidecar read it: `name{labels}` of its last scrape, counts unchanged for 1.3 s.
    fn edge_metrics(&self) -> String {
        let sidecar = self.sidecar.as_ref().unwrap();
        let mut last = sidecar.scrape();
        let lines = |text: &str| {
            cdn_operator_testkit::metric_sum(text, "cdn_log_lines_total", "").unwrap_or(0.0)
        };
        let mut since = std::time::Instant::now();
        let deadline = since + Duration::from_secs(15);
        while std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
            let now = sidecar.scrape();
            if lines(&now) != lines(&last) {
                since = std::time::Instant::now();
                last = now;
            } else if since.elapsed() > Duration::from_millis(1300) {
                break;
            }
        }
        last
    }
}

/// Waits until the nginx at `addr` has looked its sources up (a path no origin has, with a good
/// token, answers something else than 502), or answers itself (a cache has no token to check).
fn wait_resolved(addr: &str) {
    let path = with_token("/not-here/resolved", &token(KEY_A, &["/*"], |_| {}));
    let status = settle(
        Duration::from_secs(10),
        Duration::from_millis(20),
        || request(addr, "GET", &path, &[HOST], b"").unwrap().status,
        |status| *status != 502,
    );
    assert_ne!(status, 502, "{addr} never resolved its sources");
}

#[test]
fn each_refusal_is_a_403_that_reaches_no_source_and_is_counted_by_reason() {
    let world = World::start(61);
    world.put("/vod/title/seg1.ts", "segment");
    let path = "/vod/title/seg1.ts";
    let good = token(KEY_A, &["/vod/title/*"], |_| {});
    let tampered = good.replace("exp=", "exp=9");
    let forged_cookie = format!("{TOKEN}=exp={}~acl=/*~hmac={}", now() + 60, "0".repeat(64));
    let counted_before = world.edge_metrics();
    // Reason, URL, cookie.
    let cases: Vec<(&str, String, Option<&str>)> = vec![
        ("missing", path.into(), None),
        ("missing", with_token(path, ""), None),
        ("malformed", with_token(path, "not-a-token"), None),
        (
            "malformed",
            with_token(path, &good.replace("~hmac=", "~mac=")),
            None,
        ),
        (
            "expired",
            with_token(path, &token(KEY_A, &["/vod/*"], |f| f.expires = now() - 5)),
            None,
        ),
        // Not valid yet.
        (
            "expired",
            with_token(
                path,
                &token(KEY_A, &["/vod/*"], |f| f.start = Some(now() + 600)),
            ),
            None,
        ),
        ("invalid", with_token(path, &tampered), None),
        (
            "invalid",
            with_token(path, &token(KEY_C, &["/vod/*"], |_| {})),
            None,
        ),
        (
            "path",
            with_token(path, &token(KEY_A, &["/vod/other/*"], |_| {})),
            None,
        ),
        (
            "address",
            with_token(
                path,
                &token(KEY_B, &["/vod/*"], |f| f.ip = Some("203.0.113.9".into())),
            ),
            None,
        ),
        // In a cookie, refused for the same reasons.
        ("invalid", path.into(), Some(&forged_cookie)),
    ];
    let mut expected = std::collections::BTreeMap::<&str, f64>::new();
    for (reason, url, cookie) in &cases {
        let headers: Vec<(&str, &str)> = cookie.iter().map(|c| ("Cookie", *c)).collect();
        let r = world.get("edge", url, &headers);
        assert_eq!(r.status, 403, "{reason}: {url} {cookie:?}: {}", r.body);
        // Answered by the edge itself: no cache took part.
        assert_eq!(r.header(CACHE_STATUS_HEADER), None, "{reason}");
        *expected.entry(reason).or_default() += 1.0;
    }
    assert_eq!(world.asked(), [], "a refusal reached the origin");

    // Counted by reason, as client requests of the route, 4xx.
    let metrics = world.edge_metrics();
    for (reason, count) in &expected {
        let counted = cdn_operator_testkit::metric_sum(
            &metrics,
            "cdn_token_denials_total",
            &format!(r#"reason="{reason}""#),
        );
        assert_eq!(counted, Some(*count), "{reason} in\n{metrics}");
    }
    let client_errors = |text: &str| {
        cdn_operator_testkit::metric_sum(
            text,
            "cdn_requests_total",
            r#"source="cache",source_kind="cdncluster",status_class="4xx""#,
        )
        .unwrap_or(0.0)
    };
    assert_eq!(
        client_errors(&metrics) - client_errors(&counted_before),
        cases.len() as f64,
        "{metrics}"
    );

    // The same path with the good token: served.
    let r = world.get("edge", &with_token(path, &good), &[]);
    assert_eq!((r.status, r.body.as_str()), (200, "segment"));
    assert_eq!(world.asked_for(path).len(), 1);
}

#[test]
fn a_valid_token_is_served_cached_once_whatever_the_token_and_never_reaches_the_origin() {
    let world = World::start(62);
    world.put("/vod/title/seg1.ts", "segment 1");
    let path = "/vod/title/seg1.ts";
    let first = token(KEY_A, &["/vod/title/*"], |_| {});
    // Another token for the same object: another key, another expiry, a session id.
    let second = token(KEY_B, &["/vod/*"], |f| {
        f.expires += 60;
        f.id = Some("viewer-2".into());
    });
    assert_ne!(first, second);
    let r = world.get("edge", &with_token(path, &first), &[]);
    assert_eq!(
        (r.status, r.body.as_str(), r.header(CACHE_STATUS_HEADER)),
        (200, "segment 1", Some("MISS"))
    );
    let r = world.get("edge", &with_token(path, &second), &[]);
    assert_eq!(r.header(CACHE_STATUS_HEADER), Some("HIT"));
    // In a cookie, beside others: the same object.
    let cookie = format!("session=abc; {TOKEN}={first}; lang=fr");
    let r = world.get("edge", path, &[("Cookie", &cookie)]);
    assert_eq!(
        (r.status, r.header(CACHE_STATUS_HEADER)),
        (200, Some("HIT"))
    );
    assert_eq!(world.asked_for(path).len(), 1, "one object, fetched once");

    // The origin never sees a token: the parameter leaves the query (others stay, in their order
    // and encoding), the cookie leaves Cookie (others stay).
    let url = format!("/vod/title/seg1.ts?a=1&{TOKEN}={first}&b=%2F");
    let r = world.get("edge", &url, &[("Cookie", &cookie)]);
    assert_eq!(
        (r.status, r.header(CACHE_STATUS_HEADER)),
        (200, Some("MISS"))
    );
    let token_first = format!("/vod/title/seg1.ts?{TOKEN}={second}&q=2");
    world.get(
        "edge",
        &token_first,
        &[("Cookie", &format!("{TOKEN}={first}"))],
    );
    let asked = world.asked_for(path);
    assert_eq!(
        asked,
        [
            Asked {
                uri: path.into(),
                cookie: "-".into()
            },
            Asked {
                uri: format!("{path}?a=1&b=%2F"),
                cookie: "session=abc; lang=fr".into()
            },
            Asked {
                uri: format!("{path}?q=2"),
                cookie: "-".into()
            },
        ]
    );

    // A percent-encoded token (a client's encodeURIComponent) is the same token.
    world.put("/vod/title/seg2.ts", "segment 2");
    let encoded: String = first
        .replace('=', "%3D")
        .replace('/', "%2F")
        .replace('~', "%7E");
    let r = world.get("edge", &with_token("/vod/title/seg2.ts", &encoded), &[]);
    assert_eq!((r.status, r.body.as_str()), (200, "segment 2"));

    // The origin's purge tags stay in the CDN: the cache keeps them, the edge hides them.
    let from_cache = world.get("cache", path, &[]);
    assert_eq!(from_cache.header("Surrogate-Key"), Some("title-1 all"));
    assert_eq!(from_cache.header("Cache-Tag"), Some("title-1"));
    let r = world.get("edge", &with_token(path, &first), &[]);
    assert_eq!(
        (r.header("Surrogate-Key"), r.header("Cache-Tag")),
        (None, None)
    );
}

#[test]
fn a_signed_cache_serves_a_large_object_by_slices_checking_the_token_once() {
    let world = World::start(68);
    // 2.5 MiB: three slices of 1 MiB, each a subrequest of the cache.
    let body: String = (0..(5 << 19))
        .map(|i| (b'a' + (i % 26) as u8) as char)
        .collect();
    world.put("/vod/big.mp4", &body);
    let good = token(KEY_A, &["/vod/*"], |_| {});
    let r = world.get("cache-signed", &with_token("/vod/big.mp4?v=1", &good), &[]);
    assert_eq!((r.status, r.body.len()), (200, body.len()));
    assert!(r.body == body, "the object whole");
    // Each slice asked of the origin without the token, the other parameter kept.
    let asked = world.asked_for("/vod/big.mp4");
    assert_eq!(asked.len(), 3, "{asked:?}");
    assert!(
        asked.iter().all(|a| a.uri == "/vod/big.mp4?v=1"),
        "{asked:?}"
    );
    // Another token: the same object, from the cache; a range too.
    let other = token(KEY_B, &["/vod/big.mp4"], |_| {});
    let r = world.get("cache-signed", &with_token("/vod/big.mp4?v=1", &other), &[]);
    assert_eq!(
        (r.status, r.header(CACHE_STATUS_HEADER)),
        (200, Some("HIT"))
    );
    let r = world.get(
        "cache-signed",
        &with_token("/vod/big.mp4?v=1", &other),
        &[("Range", "bytes=2097152-2097161")],
    );
    assert_eq!((r.status, r.body.as_str()), (206, &body[2097152..2097162]));
    let r = world.get(
        "cache-signed",
        "/vod/big.mp4?v=1",
        &[("Range", "bytes=0-9")],
    );
    assert_eq!(r.status, 403, "a range needs a token too");
    assert_eq!(
        world.asked_for("/vod/big.mp4").len(),
        3,
        "nothing fetched again"
    );
}

#[test]
fn forward_token_sends_the_token_on_but_keeps_it_out_of_the_key() {
    let world = World::start(63);
    world.put("/live/index.m3u8", "#EXTM3U");
    let path = "/live/index.m3u8";
    let first = token(KEY_A, &["/live/*"], |_| {});
    let second = token(KEY_A, &["/live/*"], |f| f.expires += 1);
    let r = world.get("edge-fwd", &with_token(path, &first), &[]);
    assert_eq!(
        (r.status, r.header(CACHE_STATUS_HEADER)),
        (200, Some("MISS"))
    );
    let cookie = format!("{TOKEN}={second}");
    let r = world.get(
        "edge-fwd",
        &with_token(path, &second),
        &[("Cookie", &cookie)],
    );
    assert_eq!(
        (r.status, r.header(CACHE_STATUS_HEADER)),
        (200, Some("HIT"))
    );
    // The first token went on to the origin (the cache in between keeps what it gets).
    assert_eq!(
        world.asked_for(path),
        [Asked {
            uri: with_token(path, &first),
            cookie: "-".into()
        }]
    );
    // Still checked: a bad token is refused there too.
    let r = world.get("edge-fwd", &with_token(path, "exp=1~hmac=0"), &[]);
    assert_eq!(r.status, 403);
}

#[test]
fn an_acl_with_wildcards_admits_a_manifest_and_its_segments_and_nothing_else() {
    let world = World::start(64);
    for path in [
        "/vod/title/index.m3u8",
        "/vod/title/seg1.ts",
        "/vod/title/a b.ts",
        "/vod/other/seg1.ts",
    ] {
        world.put(path, path);
    }
    let title = token(KEY_A, &["/vod/title/*"], |_| {});
    for path in [
        "/vod/title/index.m3u8",
        "/vod/title/seg1.ts",
        "/vod/title/a%20b.ts",
    ] {
        let r = world.get("edge", &with_token(path, &title), &[]);
        assert_eq!(r.status, 200, "{path}: {}", r.body);
    }
    // The path as nginx decodes and normalizes it: no way around the ACL.
    for path in [
        "/vod/other/seg1.ts",
        "/vod/title/../other/seg1.ts",
        "/vod/title/%2E%2E/other/seg1.ts",
        "/vod//other/seg1.ts",
    ] {
        let r = world.get("edge", &with_token(path, &title), &[]);
        assert_eq!(r.status, 403, "{path}");
    }
    assert!(world.asked_for("/vod/other/seg1.ts").is_empty());
    // Several patterns, stars inside; a URL token admits its path alone.
    let several = token(KEY_B, &["/vod/title/*.m3u8", "/vod/title/seg*.ts"], |_| {});
    for (path, status) in [
        ("/vod/other/index.m3u8", 403),
        ("/vod/title/index.m3u8", 200),
        ("/vod/title/seg1.ts", 200),
        ("/vod/other/seg1.ts", 403),
    ] {
        let r = world.get("edge", &with_token(path, &several), &[]);
        assert_eq!(r.status, status, "{path}");
    }
    let mut fields = Fields {
        expires: now() + 60,
        url: Some("/vod/title/seg1.ts".into()),
        ..Fields::default()
    };
    let url = sign_url::token(&sign_url::parse_key(KEY_A).unwrap(), &fields);
    assert_eq!(
        world
            .get("edge", &with_token("/vod/title/seg1.ts", &url), &[])
            .status,
        200
    );
    let r = world.get("edge", &with_token("/vod/title/index.m3u8", &url), &[]);
    assert_eq!(
        r.status, 403,
        "a URL token signs its path: another one does not verify"
    );
    fields.url = Some("/vod/title/a b.ts".into());
    let url = sign_url::token(&sign_url::parse_key(KEY_A).unwrap(), &fields);
    assert_eq!(
        world
            .get("edge", &with_token("/vod/title/a%20b.ts", &url), &[])
            .status,
        200
    );
}

#[test]
fn a_token_bound_to_an_address_checks_the_peer_or_what_a_trusted_proxy_reports() {
    let world = World::start(65);
    world.put("/vod/a.ts", "a");
    let bound = |ip: &str| token(KEY_A, &["/vod/*"], |f| f.ip = Some(ip.into()));
    let url = |ip: &str| with_token("/vod/a.ts", &bound(ip));
    // The edge that viewers reach directly: the peer's address, a forwarded one ignored.
    assert_eq!(world.get("edge", &url("127.0.0.1"), &[]).status, 200);
    let forged = [("X-Forwarded-For", "203.0.113.9")];
    assert_eq!(world.get("edge", &url("127.0.0.1"), &forged).status, 200);
    assert_eq!(world.get("edge", &url("203.0.113.9"), &forged).status, 403);
    // Behind a load balancer it trusts (127.0.0.1 here): the viewer it reports, the rightmost
    // address it did not add; the load balancer's own address is not the viewer's.
    let reported = [("X-Forwarded-For", "198.51.100.1, 203.0.113.9")];
    assert_eq!(
        world.get("edge-lb", &url("203.0.113.9"), &reported).status,
        200
    );
    assert_eq!(
        world.get("edge-lb", &url("198.51.100.1"), &reported).status,
        403
    );
    assert_eq!(
        world.get("edge-lb", &url("127.0.0.1"), &reported).status,
        403
    );
    // What goes on upstream keeps today's meaning: the header received, the peer appended.
    assert_eq!(world.asked_for("/vod/a.ts").len(), 1, "cached once");
}

/// A vector of `tests/fixtures/signed-urls/vectors.json`.
#[derive(Deserialize, Debug, PartialEq)]
struct Vector {
    name: String,
    key: String,
    expires: u64,
    start: Option<u64>,
    ip: Option<String>,
    id: Option<String>,
    data: Option<String>,
    acl: Option<Vec<String>>,
    url: Option<String>,
    token: String,
    admits: Vec<String>,
    refuses: Vec<String>,
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/signed-urls")
        .join(name)
}

fn vectors() -> Vec<Vector> {
    serde_json::from_str(&std::fs::read_to_string(fixture("vectors.json")).unwrap()).unwrap()
}

fn fields(v: &Vector) -> Fields {
    Fields {
        ip: v.ip.clone(),
        start: v.start,
        expires: v.expires,
        acl: v.acl.clone().unwrap_or_default(),
        url: v.url.clone(),
        id: v.id.clone(),
        data: v.data.clone(),
    }
}

#[test]
fn the_test_vectors_are_akamais_signers_output() {
    // An implementation independent of the operator's: akamai-edgeauth (installed by
    // scripts/install-test-deps.sh) prints the fixture again.
    let out = std::process::Command::new("python3")
        .arg(fixture("generate.py"))
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "generate.py failed (scripts/install-test-deps.sh installs akamai-edgeauth): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let again: Vec<Vector> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(again, vectors());
}

#[test]
fn sign_url_makes_the_vectors_tokens() {
    for v in vectors() {
        let key = sign_url::parse_key(&v.key).unwrap();
        assert_eq!(sign_url::token(&key, &fields(&v)), v.token, "{}", v.name);
        // The command, its key from a file or from the environment.
        let dir = tempfile::tempdir().unwrap();
        let key_file = dir.path().join("key");
        std::fs::write(&key_file, format!("{}\n", v.key)).unwrap();
        let mut args: Vec<String> =
            vec!["sign-url".into(), "--expires".into(), v.expires.to_string()];
        for pattern in v.acl.iter().flatten() {
            args.extend(["--acl".into(), pattern.clone()]);
        }
        for (flag, value) in [
            ("--url", v.url.clone()),
            ("--start", v.start.map(|s| s.to_string())),
            ("--ip", v.ip.clone()),
            ("--id", v.id.clone()),
            ("--data", v.data.clone()),
        ] {
            if let Some(value) = value {
                args.extend([flag.into(), value]);
            }
        }
        let run = |extra: &[&str], env: Option<&str>| {
            let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_cdn-operator"));
            command
                .args(&args)
                .args(extra)
                .env_remove(sign_url::KEY_ENV);
            if let Some(key) = env {
                command.env(sign_url::KEY_ENV, key);
            }
            let out = command.output().unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8(out.stdout).unwrap()
        };
        let from_file = run(&["--key-file", key_file.to_str().unwrap()], None);
        assert_eq!(from_file, format!("{}\n", v.token), "{}", v.name);
        assert_eq!(run(&[], Some(&v.key)), from_file, "{}", v.name);
        let url = run(
            &["--base-url", "https://cdn.example/vod/x.ts"],
            Some(&v.key),
        );
        assert_eq!(
            url,
            format!("https://cdn.example/vod/x.ts?{TOKEN}={}\n", v.token)
        );
    }
    // No key, or a bad one: refused, nothing printed.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cdn-operator"))
        .args(["sign-url", "--acl", "/*", "--ttl", "1h"])
        .env_remove(sign_url::KEY_ENV)
        .output()
        .unwrap();
    assert!(!out.status.success() && out.stdout.is_empty());
    assert!(String::from_utf8_lossy(&out.stderr).contains("CDN_TOKEN_KEY"));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cdn-operator"))
        .args(["sign-url", "--acl", "/*", "--ttl", "1h"])
        .env(sign_url::KEY_ENV, "short")
        .output()
        .unwrap();
    assert!(!out.status.success() && out.stdout.is_empty());
}

#[test]
fn the_verifier_in_nginx_admits_and_refuses_what_each_vector_says() {
    let world = World::start(66);
    for v in vectors() {
        for path in &v.admits {
            world.put(path, path);
        }
        for path in &v.admits {
            let r = world.get("edge", &with_token(path, &v.token), &[]);
            assert_eq!(
                (r.status, r.body.as_str()),
                (200, path.as_str()),
                "{}",
                v.name
            );
            // And from the cookie.
            let cookie = format!("{TOKEN}={}", v.token);
            let r = world.get("edge", path, &[("Cookie", &cookie)]);
            assert_eq!(r.status, 200, "{} (cookie)", v.name);
        }
        for path in &v.refuses {
            let r = world.get("edge", &with_token(path, &v.token), &[]);
            assert_eq!(r.status, 403, "{}: {path}", v.name);
        }
    }
}

#[test]
fn the_documented_formula_gives_the_vectors_tokens_in_shell_and_python() {
    // docs/data-plane.md signs the first vector by hand, in two languages: run them.
    let docs =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/data-plane.md"))
            .unwrap();
    let block = |language: &str| {
        let marker = docs
            .find("<!-- signed-urls-example -->")
            .expect("the marker of the examples");
        let fence = format!("```{language}\n");
        let body = &docs[marker..];
        let body = &body[body.find(&fence).expect(language) + fence.len()..];
        body[..body.find("```").unwrap()].to_string()
    };
    let expected = format!("{}\n", vectors()[0].token);
    let sh = std::process::Command::new("sh")
        .args(["-c", &block("sh")])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&sh.stdout),
        expected,
        "{}",
        String::from_utf8_lossy(&sh.stderr)
    );
    let py = std::process::Command::new("python3")
        .args(["-c", &block("python")])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&py.stdout),
        expected,
        "{}",
        String::from_utf8_lossy(&py.stderr)
    );
}

/// A ConfigMap or Secret volume as the kubelet writes it: `KEY -> ..data/KEY`,
/// `..data -> ..<version>`, a new version swapped in with one rename.
struct Volume {
    dir: PathBuf,
    version: u32,
}

impl Volume {
    fn new(dir: PathBuf, data: &[(&str, &str)]) -> Volume {
        std::fs::create_dir_all(&dir).unwrap();
        let mut volume = Volume { dir, version: 0 };
        volume.update(data);
        volume
    }

    fn update(&mut self, data: &[(&str, &str)]) {
        self.version += 1;
        let version = format!("..{}", self.version);
        std::fs::create_dir(self.dir.join(&version)).unwrap();
        for (key, value) in data {
            std::fs::write(self.dir.join(&version).join(key), value).unwrap();
        }
        std::os::unix::fs::symlink(&version, self.dir.join("..data_tmp")).unwrap();
        std::fs::rename(self.dir.join("..data_tmp"), self.dir.join("..data")).unwrap();
        // The keys' links: the ones of the new data, no other (the kubelet removes the others).
        for entry in std::fs::read_dir(&self.dir).unwrap().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !name.starts_with("..") && !data.iter().any(|(k, _)| *k == name) {
                std::fs::remove_file(entry.path()).unwrap();
            }
        }
        for (key, _) in data {
            let link = self.dir.join(key);
            if link.symlink_metadata().is_err() {
                std::os::unix::fs::symlink(format!("..data/{key}"), link).unwrap();
            }
        }
    }
}

#[test]
fn keys_rotate_without_a_restart_and_without_a_failed_request() {
    // The edge as its pod runs it: the entrypoint from the ConfigMap, the Secret mounted at the
    // pods' path, emptyDirs at /tmp and /var/cache/nginx.
    let world = World::start(67);
    world.put("/vod/a.ts", "a");
    let listen = address(world.net, "pod");
    let edge = world
        .clusters
        .iter()
        .find(|c| c.metadata.name.as_deref() == Some("edge"))
        .unwrap();
    let paths = Paths {
        listen: listen.clone(),
        ..Paths::default()
    };
    let conf = support::nginx_config(edge, &world.clusters, &paths);
    let entrypoint = build::entrypoint(false, true);
    let config = Volume::new(
        world.path().join("cm"),
        &[
            (CONFIG_KEY, &conf),
            (ENTRYPOINT_KEY, &entrypoint),
            (TOKEN_SCRIPT, TOKEN_SCRIPT_SOURCE),
        ],
    );
    let mut secret = Volume::new(
        world.path().join("secret"),
        &[("a", &format!("{KEY_A}\n")), ("b", KEY_B)],
    );
    let pod = Sandbox::read_only_root()
        .hosts(&world.names.hosts)
        .resolv_conf(world.names.resolv_conf(world.path()))
        .read_only(&config.dir, build::CONFIG_DIR)
        .read_only(&secret.dir, TOKEN_KEYS_DIR)
        .empty_dir("/tmp")
        .empty_dir("/var/cache/nginx");
    let log = world.path().join("pod.log");
    let nginx = Nginx::spawn_logging(
        "pod",
        pod.command(&[
            "/bin/sh",
            &format!("{}/{ENTRYPOINT_KEY}", build::CONFIG_DIR),
        ]),
        &log,
        &world.path().join("pod.out"),
    );
    nginx.wait_listening(&listen, &conf);
    wait_resolved(&listen);
    let master = |nginx: &Nginx| {
        nginx
            .processes()
            .into_iter()
            .find(|(_, cmd)| cmd.starts_with("nginx: master process"))
            .map(|(pid, _)| pid)
            .unwrap()
    };
    let before = master(&nginx);
    let get = |key: &str| {
        let url = with_token("/vod/a.ts", &token(key, &["/vod/*"], |_| {}));
        request(&listen, "GET", &url, &[HOST], b"").map(|r| r.status)
    };
    assert_eq!(
        (
            get(KEY_A).unwrap(),
            get(KEY_B).unwrap(),
            get(KEY_C).unwrap()
        ),
        (200, 200, 403)
    );

    // A viewer with a token of the key that stays asks all along; meanwhile A goes, C comes,
    // and an entry that is no key is added.
    let stop = AtomicBool::new(false);
    let failures = std::thread::scope(|s| {
        let viewer = s.spawn(|| {
            let mut failures = Vec::new();
            let mut asked = 0;
            while !stop.load(Ordering::Relaxed) {
                match get(KEY_B) {
                    Ok(200) => {}
                    other => failures.push(format!("{other:?}")),
                }
                asked += 1;
            }
            (asked, failures)
        });
        secret.update(&[("b", KEY_B), ("c", KEY_C), ("notes", "rotated on Tuesday")]);
        let rotated = settle(
            Duration::from_secs(15),
            Duration::from_millis(100),
            || (get(KEY_A).unwrap(), get(KEY_C).unwrap()),
            |statuses| *statuses == (403, 200),
        );
        assert_eq!(
            rotated,
            (403, 200),
            "the new keys are not in use:\n{}",
            nginx.log()
        );
        std::thread::sleep(Duration::from_millis(500));
        stop.store(true, Ordering::Relaxed);
        viewer.join().unwrap()
    });
    let (asked, failed) = failures;
    assert!(asked > 20, "the viewer asked {asked} times");
    assert_eq!(
        failed,
        Vec::<String>::new(),
        "requests failed during the rotation"
    );
    assert_eq!(master(&nginx), before, "nginx was restarted");
    let said = nginx.log();
    assert!(
        said.contains("the token keys changed: reloading nginx"),
        "{said}"
    );
    assert!(
        said.contains("the token key notes is not hexadecimal: skipped"),
        "{said}"
    );
    assert!(!said.contains("[emerg]"), "{said}");

    // No valid key at all: every token refused, nginx still serves (the probes).
    secret.update(&[("notes", "none left")]);
    let refused = settle(
        Duration::from_secs(15),
        Duration::from_millis(100),
        || get(KEY_B).unwrap(),
        |status| *status == 403,
    );
    assert_eq!(refused, 403);
    let health = request(&listen, "GET", "/healthz", &[HOST], b"").unwrap();
    assert_eq!(health.status, 200);
    assert!(nginx.log().contains("no valid key"));
    assert_eq!(master(&nginx), before);
}

#[test]
fn the_example_is_accepted_by_the_crd_and_renders_a_signed_balancer() {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/signed-urls.yaml");
    let dir = tempfile::tempdir().unwrap();
    let crds = dir.path().join("crds.yaml");
    std::fs::write(&crds, cdn_operator::api::crds_yaml()).unwrap();
    let out = std::process::Command::new("python3")
        .arg(support::shared("tools/crd_validate.py"))
        .arg(&crds)
        .arg(&example)
        .output()
        .expect("python3 with jsonschema and pyyaml (scripts/install-test-deps.sh)");
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{report}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for name in ["edge", "cache-vod"] {
        assert!(report.contains(&format!(": {name}: OK")), "{report}");
    }
    // What the operator makes of it: the verifier and the Secret in the balancer's pods only.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cdn-operator"))
        .args(["render", "-f"])
        .arg(&example)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rendered = String::from_utf8(out.stdout).unwrap();
    assert_eq!(rendered.matches("token.js: |").count(), 1, "{rendered}");
    assert_eq!(rendered.matches("secretName: edge-token-keys").count(), 1);
    assert_eq!(
        rendered.matches(TOKEN_KEYS_DIR).count(),
        2,
        "the mount and run.sh"
    );
}
