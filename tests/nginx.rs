//! Generated nginx configurations, run by the real nginx, of the release the pods run (1.30, in
//! the testkit's root): `nginx -t` for every shape of spec, and the seed topology serving real
//! requests (balancer → cache-live / cache-vod → origins).
//!
//! The in-cluster Service names of the configuration resolve to loopback addresses through a DNS
//! server of each test (nginx looks them up while it runs; `support::Names`), so the
//! configurations under test are exactly the ones the operator ships, with only the listen
//! address and file paths moved.

mod support;

use cdn_operator::api::{CacheSpec, CdnCluster, CdnClusterSpec, Role, Source, TlsSpec};
use cdn_operator::cdncluster::build;
use cdn_operator::cdncluster::nginx::{timeouts, Paths, CACHE_STATUS_HEADER, UPSTREAM_HEADER};
use cdn_operator_testkit::nginx::{static_server_config, test_config, Nginx, Sandbox};
use cdn_operator_testkit::{request, settle, Response};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::{wait_resolved, Names};

fn cluster(name: &str, role: Role, sources: Vec<Source>) -> CdnCluster {
    let mut c = CdnCluster::new(name, CdnClusterSpec::new(role, sources));
    c.metadata.namespace = Some("default".into());
    c.metadata.uid = Some(format!("{name}-uid"));
    c
}

// The names of each test are in an /etc/hosts and in a DNS server on port 53 of a loopback
// address of the test's own (`Names`: the tests run side by side).

fn check(conf: &str, dir: &Path, names: &Names) {
    let file = dir.join("nginx.conf");
    std::fs::write(&file, conf).unwrap();
    if let Err(report) = test_config(&names.sandbox(dir), &file) {
        panic!("nginx -t refused the generated configuration:\n{report}\n--- configuration ---\n{conf}");
    }
}

#[test]
fn every_generated_configuration_passes_nginx_t() {
    let dir = tempfile::tempdir().unwrap();
    let names = Names::new(
        dir.path(),
        "127.0.0.51",
        &[
            ("cache-live.default.svc.cluster.local", "127.0.0.1"),
            ("cache-vod.default.svc.cluster.local", "127.0.0.1"),
            ("cache-tuned.default.svc.cluster.local", "127.0.0.1"),
            ("cache-origins.default.svc.cluster.local", "127.0.0.1"),
            ("vod-store.default.svc.cluster.local", "127.0.0.1"),
            ("origin.example.com", "127.0.0.1"),
        ],
    );
    let live = cluster("cache-live", Role::Cache, vec![]);
    let vod = cluster("cache-vod", Role::Cache, vec![]);
    let mut tuned = cluster(
        "cache-tuned",
        Role::Cache,
        vec![Source::url(
            "web",
            "https://origin.example.com:8443/media/",
            None,
        )],
    );
    tuned.spec.cache = Some(Box::new(CacheSpec {
        size: Some("20g".into()),
        inactive: Some("1h".into()),
        valid: Some("30s".into()),
        ..CacheSpec::default()
    }));
    let specs = vec![
        // The seed: a balancer routing by path, no default.
        cluster(
            "balancer",
            Role::Balancer,
            vec![
                Source::cluster("cache-live", Some("^/live/")),
                Source::cluster("cache-vod", Some("^/vod/")),
            ],
        ),
        // The seed caches: no sources at all.
        live.clone(),
        vod.clone(),
        // A default source after a routed one.
        cluster(
            "balancer-default",
            Role::Balancer,
            vec![
                Source::cluster("cache-live", Some("^/live/")),
                Source::cluster("cache-vod", None),
            ],
        ),
        // Only a default.
        cluster(
            "balancer-one",
            Role::Balancer,
            vec![Source::cluster("cache-live", None)],
        ),
        // Origins: URL (http with path, https with port) and Service.
        cluster(
            "cache-origins",
            Role::Cache,
            vec![
                Source::url("hls", "http://origin.example.com/hls", Some("\\.m3u8$")),
                Source::service("store", "vod-store", 80, None),
            ],
        ),
        tuned,
        // Pools: three caches as the default, two weighted URL origins of one host behind a path.
        cluster(
            "balancer-pool",
            Role::Balancer,
            vec![
                Source::cluster("cache-live", None).weighted(2),
                Source::cluster("cache-vod", Some("^/vod/")),
                Source::cluster("cache-tuned", None),
                Source::cluster("cache-origins", None),
            ],
        ),
        cluster(
            "cache-pool",
            Role::Cache,
            vec![
                Source::url("o1", "https://origin.example.com:8443/a", Some("^/a/")),
                Source::url("o2", "https://origin.example.com:9443/a", Some("^/a/")).weighted(3),
                Source::service("s1", "vod-store", 80, None),
                Source::service("s2", "vod-store", 81, None),
            ],
        ),
        // Regexes nginx must read back exactly: quotes, backslashes, braces, alternation.
        cluster(
            "balancer-regex",
            Role::Balancer,
            vec![
                Source::cluster("cache-live", Some(r#"^/(live|hls)/[a-z]{2,8}/.*\.ts$"#)),
                Source::cluster("cache-vod", Some(r#"^/vod/"quoted"/\d+;x$"#)),
            ],
        ),
    ];
    let mut world = specs.clone();
    world.extend([live, vod]);
    for c in &specs {
        let case = dir.path().join(c.metadata.name.as_deref().unwrap());
        std::fs::create_dir_all(&case).unwrap();
        // Production paths, except the cache (nginx -t creates it) and the temp folder (with
        // the resolver the entrypoint writes).
        let paths = Paths {
            cache_dir: case.to_str().unwrap().into(),
            temp_dir: case.to_str().unwrap().into(),
            ..Paths::default()
        };
        check(&names.config(c, &world, &paths), &case, &names);
    }
}

#[test]
fn tls_configurations_pass_nginx_t_and_ocsp_stapling_only_warns() {
    // Every role, with and without a redirect, with sources and without: nginx reads the
    // certificate of the Secret at the pods' path (mounted read-only, as the kubelet does).
    let dir = tempfile::tempdir().unwrap();
    let names = Names::new(
        dir.path(),
        "127.0.0.56",
        &[
            ("cache-live.default.svc.cluster.local", "127.0.0.1"),
            ("vod-store.default.svc.cluster.local", "127.0.0.1"),
        ],
    );
    let ca = support::tls::Ca::new("cdn-operator test CA");
    let certificate = ca.issue("cdn.example", "cdn.example", 1);
    let secret = dir.path().join("secret");
    std::fs::create_dir_all(&secret).unwrap();
    for (key, value) in certificate.secret_data() {
        std::fs::write(secret.join(key), value).unwrap();
    }
    let tls = |mut c: CdnCluster, redirect: bool| {
        c.spec.tls = Some(Box::new(TlsSpec {
            secret_name: "cdn-tls".into(),
            redirect,
        }));
        c
    };
    let live = cluster("cache-live", Role::Cache, vec![]);
    let edge = || {
        cluster(
            "balancer",
            Role::Balancer,
            vec![Source::cluster("cache-live", None)],
        )
    };
    let store = || {
        cluster(
            "cache-store",
            Role::Cache,
            vec![Source::service("store", "vod-store", 80, None)],
        )
    };
    for c in [
        tls(edge(), false),
        tls(edge(), true),
        tls(store(), false),
        tls(store(), true),
        // No source: the resolver, for the OCSP responder, all the same.
        tls(cluster("cache-alone", Role::Cache, vec![]), false),
    ] {
        let redirect = c.spec.tls.as_ref().unwrap().redirect;
        let case = dir.path().join(format!(
            "{}-{redirect}",
            c.metadata.name.as_deref().unwrap()
        ));
        std::fs::create_dir_all(&case).unwrap();
        let paths = Paths {
            cache_dir: case.to_str().unwrap().into(),
            temp_dir: case.to_str().unwrap().into(),
            ..Paths::default()
        };
        let conf = names.config(&c, &[live.clone(), c.clone()], &paths);
        assert!(conf.contains("ssl_stapling on;"));
        let file = case.join("nginx.conf");
        std::fs::write(&file, &conf).unwrap();
        let sandbox = names
            .sandbox(&case)
            .read_only(&secret, cdn_operator::cdncluster::nginx::TLS_DIR);
        let report = test_config(&sandbox, &file).unwrap_or_else(|report| {
            panic!("nginx -t refused the generated configuration:\n{report}\n--- configuration ---\n{conf}")
        });
        // The certificate names no OCSP responder (as most do now): a warning, nothing worse.
        assert!(
            report.contains("[warn]")
                && report
                    .contains("\"ssl_stapling\" ignored, no OCSP responder URL in the certificate"),
            "{report}"
        );
        for worse in ["[error]", "[crit]", "[alert]", "[emerg]"] {
            assert!(!report.contains(worse), "{worse}: {report}");
        }
    }
    // Without the Secret's files nginx refuses the configuration (in a cluster, the kubelet
    // starts no pod before the Secret exists).
    let conf = dir.path().join("cache-alone-false/nginx.conf");
    let refused = test_config(&names.sandbox(dir.path()), &conf).unwrap_err();
    assert!(
        refused.contains("[emerg]") && refused.contains("tls.crt"),
        "{refused}"
    );
}

#[test]
fn signed_url_configurations_pass_nginx_t_with_the_verifier_and_keys_of_the_pod() {
    // Every role, forwarding the token or not, with HTTPS, counted by the sidecar: nginx loads
    // njs, the verifier from the ConfigMap's folder (read-only) and the keys the entrypoint wrote.
    use cdn_operator::api::{HttpSpec, SignedUrls};
    use cdn_operator::cdncluster::nginx::{self, CONFIG_DIR, TOKEN_KEYS_FILE, TOKEN_SCRIPT};
    let dir = tempfile::tempdir().unwrap();
    let names = Names::new(
        dir.path(),
        "127.0.0.57",
        &[
            ("cache-live.default.svc.cluster.local", "127.0.0.1"),
            ("vod-store.default.svc.cluster.local", "127.0.0.1"),
        ],
    );
    let config = dir.path().join("config");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(config.join(TOKEN_SCRIPT), nginx::TOKEN_SCRIPT_SOURCE).unwrap();
    let ca = support::tls::Ca::new("cdn-operator test CA");
    let certificate = ca.issue("cdn.example", "cdn.example", 1);
    let secret = dir.path().join("secret");
    std::fs::create_dir_all(&secret).unwrap();
    for (key, value) in certificate.secret_data() {
        std::fs::write(secret.join(key), value).unwrap();
    }
    let signed = |mut c: CdnCluster, token_name: Option<&str>, forward_token: bool| {
        c.spec.signed_urls = Some(Box::new(SignedUrls {
            secret_name: "keys".into(),
            token_name: token_name.map(Into::into),
            forward_token,
        }));
        c
    };
    let live = cluster("cache-live", Role::Cache, vec![]);
    let edge = || {
        cluster(
            "balancer",
            Role::Balancer,
            vec![
                Source::cluster("cache-live", Some("^/live/")),
                Source::service("store", "vod-store", 80, None),
            ],
        )
    };
    let store = || {
        cluster(
            "cache-store",
            Role::Cache,
            vec![Source::service("store", "vod-store", 80, Some("^/vod/"))],
        )
    };
    let mut behind_lb = signed(edge(), Some("token"), false);
    behind_lb.spec.http = Some(Box::new(HttpSpec {
        trusted_proxies: Some(vec!["10.0.0.0/8".into(), "2001:db8::/32".into()]),
        excluded_query_parameters: Some(vec!["token".into(), "session".into()]),
    }));
    let mut https = signed(store(), None, false);
    https.spec.tls = Some(Box::new(TlsSpec {
        secret_name: "cdn-tls".into(),
        redirect: true,
    }));
    for (case, c, metrics) in [
        ("edge", signed(edge(), None, false), false),
        ("edge-counted", signed(edge(), None, false), true),
        ("edge-forwarding", signed(edge(), Some("t"), true), true),
        ("edge-behind-lb", behind_lb, false),
        ("cache", signed(store(), None, false), true),
        ("cache-https", https, true),
        // No default source: the 404 of unrouted paths is checked too.
        (
            "cache-alone",
            signed(cluster("cache-alone", Role::Cache, vec![]), None, false),
            false,
        ),
        // Without signed URLs but counted: the log's token field is `-`.
        ("plain-counted", store(), true),
    ] {
        let own = dir.path().join(case);
        std::fs::create_dir_all(&own).unwrap();
        std::fs::write(
            own.join(TOKEN_KEYS_FILE),
            nginx::token_keys_json(&["00112233445566778899aabbccddeeff"]),
        )
        .unwrap();
        let paths = Paths {
            cache_dir: own.to_str().unwrap().into(),
            temp_dir: own.to_str().unwrap().into(),
            ..Paths::default()
        };
        let conf = names.config_counted(&c, &[live.clone(), c.clone()], &paths, metrics);
        let file = own.join("nginx.conf");
        std::fs::write(&file, &conf).unwrap();
        let sandbox = names
            .sandbox(&own)
            .read_only(&config, CONFIG_DIR)
            .read_only(&secret, nginx::TLS_DIR);
        let report = test_config(&sandbox, &file).unwrap_or_else(|report| {
            panic!("{case}: nginx -t refused the configuration:\n{report}\n--- configuration ---\n{conf}")
        });
        for worse in ["[error]", "[crit]", "[alert]", "[emerg]"] {
            assert!(!report.contains(worse), "{case}: {worse}: {report}");
        }
    }
    // Without the keys the entrypoint writes, nginx refuses to start: the pod never serves
    // unchecked.
    let file = dir.path().join("edge/nginx.conf");
    std::fs::remove_file(dir.path().join("edge").join(TOKEN_KEYS_FILE)).unwrap();
    let refused = test_config(
        &names
            .sandbox(&dir.path().join("edge"))
            .read_only(&config, CONFIG_DIR),
        &file,
    )
    .unwrap_err();
    // (njs 1.0.2 names no file: "failed to initialize preload objects".)
    assert!(
        refused.contains("[emerg]") && refused.contains("preload objects"),
        "{refused}"
    );
}

#[test]
fn nginx_t_catches_a_broken_configuration() {
    // The check above must be able to fail: a config nginx cannot read is reported.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("nginx.conf");
    std::fs::write(
        &file,
        "events {}\nhttp { server { location ~ \"(\" { } } }\n",
    )
    .unwrap();
    let refused = test_config(&Sandbox::new().share(dir.path()), &file);
    assert!(refused.is_err(), "{refused:?}");
}

/// `conf` run by nginx as the instance `name`, its files in `dir`; once it listens on `addr`.
/// Stopped gracefully when dropped.
fn start(name: &str, conf: &str, dir: &Path, names: &Names, addr: &str) -> Nginx {
    Nginx::start(&names.sandbox(dir), name, conf, dir, addr)
}

/// The nginx of `c`, configured for `paths`, as [`start`] runs it; once it found its sources.
fn start_cluster(
    c: &CdnCluster,
    world: &[CdnCluster],
    paths: &Paths,
    dir: &Path,
    names: &Names,
) -> Nginx {
    let name = c.metadata.name.as_deref().unwrap();
    let nginx = start(
        name,
        &names.config(c, world, paths),
        dir,
        names,
        &paths.listen,
    );
    wait_resolved(&paths.listen, HOST);
    nginx
}

/// The Host of the test's requests: the CDN's public name.
const HOST: &str = "cdn.example.com";

fn get(addr: &str, path: &str) -> Response {
    try_get(addr, path).unwrap_or_else(|e| panic!("GET {path} from {addr}: {e}"))
}

/// A GET on a connection of its own; its read waits longer than the pools' proxy_read_timeout,
/// so a request failed over from a hung member gets its answer.
fn try_get(addr: &str, path: &str) -> std::io::Result<Response> {
    request(addr, "GET", path, &[("Host", HOST)], b"")
}

/// An origin: nginx serving the files under `root` at `addr`, its temp files under `dir`/tmp.
fn start_origin(name: &str, root: &Path, dir: &Path, names: &Names, addr: &str) -> Nginx {
    let tmp = dir.join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    start(
        name,
        &static_server_config(root, &tmp, addr),
        dir,
        names,
        addr,
    )
}

#[test]
fn seed_topology_routes_caches_and_answers_404() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // Origins: each serves different content, so a body tells which path a request took.
    let live_root = d.join("origin-live");
    let vod_root = d.join("origin-vod");
    std::fs::create_dir_all(live_root.join("live")).unwrap();
    std::fs::create_dir_all(vod_root.join("vod")).unwrap();
    std::fs::write(live_root.join("live/seg1.ts"), "LIVE-SEGMENT-1").unwrap();
    std::fs::write(vod_root.join("vod/movie.mp4"), "VOD-MOVIE").unwrap();
    std::fs::write(vod_root.join("other.txt"), "VOD-OTHER").unwrap();

    let names = Names::new(
        d,
        "127.0.0.53",
        &[
            ("cache-live.default.svc.cluster.local", "127.0.0.11"),
            ("cache-vod.default.svc.cluster.local", "127.0.0.12"),
            ("origin-live.default.svc.cluster.local", "127.0.0.21"),
            ("origin-vod.default.svc.cluster.local", "127.0.0.22"),
        ],
    );

    // The seed examples, with an origin added to each cache ("add origins here").
    let cache_live = cluster(
        "cache-live",
        Role::Cache,
        vec![Source::service("origin", "origin-live", 80, None)],
    );
    let cache_vod = cluster(
        "cache-vod",
        Role::Cache,
        vec![Source::service("origin", "origin-vod", 80, None)],
    );
    let balancer = cluster(
        "balancer",
        Role::Balancer,
        vec![
            Source::cluster("cache-live", Some("^/live/")),
            Source::cluster("cache-vod", Some("^/vod/")),
        ],
    );
    let balancer_default = cluster(
        "balancer-default",
        Role::Balancer,
        vec![
            Source::cluster("cache-live", Some("^/live/")),
            Source::cluster("cache-vod", None),
        ],
    );
    let world = [
        cache_live.clone(),
        cache_vod.clone(),
        balancer.clone(),
        balancer_default.clone(),
    ];

    let mut servers = Vec::new();
    servers.push(start_origin(
        "origin-live",
        &live_root,
        d,
        &names,
        "127.0.0.21:80",
    ));
    servers.push(start_origin(
        "origin-vod",
        &vod_root,
        d,
        &names,
        "127.0.0.22:80",
    ));
    // Each CdnCluster listens where its Service name points, on the Service port.
    for (c, addr) in [
        (&cache_live, "127.0.0.11:80"),
        (&cache_vod, "127.0.0.12:80"),
        (&balancer, "127.0.0.13:80"),
        (&balancer_default, "127.0.0.14:80"),
    ] {
        let name = c.metadata.name.clone().unwrap();
        let own = d.join(&name);
        std::fs::create_dir_all(&own).unwrap();
        let paths = Paths {
            listen: addr.into(),
            temp_dir: own.to_str().unwrap().into(),
            cache_dir: own.to_str().unwrap().into(),
            ..Paths::default()
        };
        servers.push(start_cluster(c, &world, &paths, d, &names));
    }

    let balancer = "127.0.0.13:80";
    let r = get(balancer, "/live/seg1.ts");
    assert_eq!(
        (r.status, r.body.as_str()),
        (200, "LIVE-SEGMENT-1"),
        "/live/ reaches cache-live"
    );
    assert_eq!(r.header(CACHE_STATUS_HEADER), Some("MISS"));
    let r = get(balancer, "/live/seg1.ts");
    assert_eq!((r.status, r.body.as_str()), (200, "LIVE-SEGMENT-1"));
    assert_eq!(
        r.header(CACHE_STATUS_HEADER),
        Some("HIT"),
        "second request is a cache HIT"
    );
    // Only one request reached the live cache's origin... and the HIT is served even without it.
    drop(servers.remove(0));
    let r = get(balancer, "/live/seg1.ts");
    assert_eq!(
        (r.status, r.header(CACHE_STATUS_HEADER)),
        (200, Some("HIT"))
    );

    let r = get(balancer, "/vod/movie.mp4");
    assert_eq!(
        (r.status, r.body.as_str()),
        (200, "VOD-MOVIE"),
        "/vod/ reaches cache-vod"
    );
    assert_eq!(r.header(CACHE_STATUS_HEADER), Some("MISS"));
    assert_eq!(
        get(balancer, "/vod/movie.mp4").header(CACHE_STATUS_HEADER),
        Some("HIT")
    );

    // No default source: what no pathCondition matches is not found, without reaching a cache.
    let r = get(balancer, "/other.txt");
    assert_eq!(r.status, 404);
    assert_eq!(r.header(CACHE_STATUS_HEADER), None);
    // With a default source, it goes there.
    let r = get("127.0.0.14:80", "/other.txt");
    assert_eq!((r.status, r.body.as_str()), (200, "VOD-OTHER"));
    // Routed paths still take their own source on the balancer with a default.
    let r = get("127.0.0.14:80", "/live/seg1.ts");
    assert_eq!((r.status, r.body.as_str()), (200, "LIVE-SEGMENT-1"));

    // The probe endpoint answers on every instance and never reaches a source.
    for addr in ["127.0.0.11:80", "127.0.0.12:80", balancer] {
        let r = get(addr, "/healthz");
        assert_eq!((r.status, r.body.as_str()), (200, "ok\n"));
    }
    // A balancer does not cache: the status it passes on is the cache's own.
    let r = get("127.0.0.12:80", "/vod/movie.mp4");
    assert_eq!(r.header(CACHE_STATUS_HEADER), Some("HIT"));
    assert_eq!(r.header_count(CACHE_STATUS_HEADER), 1);
}

/// The pool test's world: a balancer whose default is a pool of three caches (cache-a weighted
/// `weight_a`), each cache fetching from one origin. Caches listen on 127.0.0.3{1,2,3}:80.
fn pool_world(weight_a: i32) -> Vec<CdnCluster> {
    let cache = |name: &str| {
        cluster(
            name,
            Role::Cache,
            vec![Source::service("origin", "origin", 80, None)],
        )
    };
    vec![
        cluster(
            "balancer",
            Role::Balancer,
            vec![
                Source::cluster("cache-a", None).weighted(weight_a),
                Source::cluster("cache-b", None),
                Source::cluster("cache-c", None),
            ],
        ),
        cache("cache-a"),
        cache("cache-b"),
        cache("cache-c"),
    ]
}

const POOL_CACHES: [(&str, &str); 3] = [
    ("cache-a", "127.0.0.31:80"),
    ("cache-b", "127.0.0.32:80"),
    ("cache-c", "127.0.0.33:80"),
];

/// Which cache served `r`: the last address of the balancer's X-Cdn-Upstream (the ones before
/// it failed).
fn served_by(r: &Response) -> &'static str {
    let header = r
        .header(UPSTREAM_HEADER)
        .unwrap_or_else(|| panic!("no {UPSTREAM_HEADER} in {:?}", r.headers));
    let last = header.rsplit(", ").next().unwrap_or_default();
    POOL_CACHES
        .iter()
        .find(|(_, addr)| *addr == last)
        .map(|(name, _)| *name)
        .unwrap_or_else(|| panic!("{UPSTREAM_HEADER}: {header} is no cache"))
}

/// Every URI once through `balancer`: the cache that served it, each answer a 200 with the body.
fn pass(balancer: &str, uris: &[String]) -> Vec<&'static str> {
    uris.iter()
        .map(|uri| {
            let r = get(balancer, uri);
            assert_eq!((r.status, r.body.as_str()), (200, uri.as_str()), "{uri}");
            served_by(&r)
        })
        .collect()
}

fn shares(placement: &[&str]) -> Vec<f64> {
    POOL_CACHES
        .iter()
        .map(|(name, _)| {
            placement.iter().filter(|c| *c == name).count() as f64 / placement.len() as f64
        })
        .collect()
}

#[test]
fn a_pool_spreads_uris_by_consistent_hashing_and_fails_over_without_errors() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let root = d.join("origin");
    std::fs::create_dir_all(root.join("obj")).unwrap();
    let uris: Vec<String> = (0..300).map(|i| format!("/obj/{i}.bin")).collect();
    for uri in &uris {
        // The body is the URI: an answer tells which object it is.
        std::fs::write(root.join(&uri[1..]), uri).unwrap();
    }
    let names = Names::new(
        d,
        "127.0.0.54",
        &[
            ("cache-a.default.svc.cluster.local", "127.0.0.31"),
            ("cache-b.default.svc.cluster.local", "127.0.0.32"),
            ("cache-c.default.svc.cluster.local", "127.0.0.33"),
            ("origin.default.svc.cluster.local", "127.0.0.40"),
        ],
    );
    let _origin = start_origin("origin", &root, d, &names, "127.0.0.40:80");
    let paths = |name: &str, listen: &str| {
        let own = d.join(name);
        std::fs::create_dir_all(&own).unwrap();
        Paths {
            listen: listen.into(),
            temp_dir: own.to_str().unwrap().into(),
            cache_dir: own.to_str().unwrap().into(),
            ..Paths::default()
        }
    };
    let world = pool_world(1);
    let run = |c: &CdnCluster, listen: &str| {
        let name = c.metadata.name.clone().unwrap();
        start_cluster(c, &world, &paths(&name, listen), d, &names)
    };
    let mut caches: Vec<Option<Nginx>> = POOL_CACHES
        .iter()
        .zip(&world[1..])
        .map(|((_, addr), c)| Some(run(c, addr)))
        .collect();
    let balancer = "127.0.0.30:80";
    let _balancer = run(&world[0], balancer);

    // Each URI has one cache: the first pass fetches it there (MISS), the second finds it there.
    let placement = pass(balancer, &uris);
    for (uri, cache) in uris.iter().zip(&placement) {
        let r = get(balancer, uri);
        assert_eq!(served_by(&r), *cache, "{uri} moved without a change");
        assert_eq!(r.header(CACHE_STATUS_HEADER), Some("HIT"), "{uri}");
    }
    let even = shares(&placement);
    eprintln!("shares of cache-a, cache-b, cache-c: {even:.3?}");
    for share in &even {
        assert!((0.20..=0.47).contains(share), "shares {even:?}");
    }

    // cache-b stops while requests keep coming: none fails.
    let stop = Arc::new(AtomicBool::new(false));
    let load = {
        let (stop, uris) = (stop.clone(), uris.clone());
        std::thread::spawn(move || {
            let (mut sent, mut failed) = (0usize, Vec::new());
            while !stop.load(Ordering::Relaxed) {
                let uri = &uris[sent % uris.len()];
                match try_get(balancer, uri) {
                    Ok(r) if r.status == 200 && r.body == *uri => {}
                    Ok(r) => failed.push(format!("{uri}: {} {:?}", r.status, r.headers)),
                    Err(e) => failed.push(format!("{uri}: {e}")),
                }
                sent += 1;
            }
            (sent, failed)
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    // At once (SIGKILL), as a crash: the requests it was serving fail with it.
    caches[1].take().unwrap().kill();
    std::thread::sleep(Duration::from_millis(700));
    let without_b = pass(balancer, &uris);
    stop.store(true, Ordering::Relaxed);
    let (sent, failed) = load.join().unwrap();
    eprintln!("requests during the stop: {sent}, failed: {}", failed.len());
    assert!(
        failed.is_empty(),
        "{} of {sent} failed: {failed:?}",
        failed.len()
    );
    assert!(
        sent > 100,
        "the load ran through the change ({sent} requests)"
    );
    let mut moved = 0;
    for ((uri, before), after) in uris.iter().zip(&placement).zip(&without_b) {
        if *before == "cache-b" {
            assert_ne!(*after, "cache-b", "{uri}");
            moved += 1;
        } else {
            assert_eq!(
                before, after,
                "{uri} was not on the stopped cache, it must not move"
            );
        }
    }
    eprintln!("URIs moved when cache-b stopped: {moved} of {}", uris.len());
    assert_eq!(moved, placement.iter().filter(|c| **c == "cache-b").count());
    assert!(
        without_b.contains(&"cache-a") && without_b.contains(&"cache-c"),
        "its URIs are spread over the other two"
    );

    // cache-b back: once its fail_timeout is over, its URIs come back (to its cache, still full).
    caches[1] = Some(run(&world[2], POOL_CACHES[1].1));
    let back = settle(
        Duration::from_secs(20),
        Duration::from_millis(500),
        || pass(balancer, &uris),
        |now| *now == placement,
    );
    assert_eq!(back, placement, "cache-b's URIs came back, and only those");
    let r = get(
        balancer,
        &uris[placement.iter().position(|c| *c == "cache-b").unwrap()],
    );
    assert_eq!(r.header(CACHE_STATUS_HEADER), Some("HIT"));

    // cache-b hangs (accepts connections, never answers): its requests wait for the pool's read
    // timeout, then another member answers; two such failures leave it out, and its URIs are
    // served at once.
    let b_uris: Vec<&String> = uris
        .iter()
        .zip(&placement)
        .filter(|(_, c)| **c == "cache-b")
        .map(|(u, _)| u)
        .collect();
    let b = caches[1].as_ref().unwrap();
    b.pause();
    let started = Instant::now();
    let hung: Vec<_> = b_uris[..2]
        .iter()
        .map(|uri| {
            let uri = uri.to_string();
            std::thread::spawn(move || (try_get(balancer, &uri), uri))
        })
        .collect();
    for thread in hung {
        let (r, uri) = thread.join().unwrap();
        let r = r.unwrap_or_else(|e| {
            panic!(
                "{uri} through a hung member: {e} after {:?}",
                started.elapsed()
            )
        });
        assert_eq!((r.status, r.body.as_str()), (200, uri.as_str()));
        assert_ne!(served_by(&r), "cache-b");
        assert!(
            r.header(UPSTREAM_HEADER)
                .unwrap()
                .starts_with(POOL_CACHES[1].1),
            "cache-b was tried first: {:?}",
            r.header(UPSTREAM_HEADER)
        );
    }
    let waited = started.elapsed();
    eprintln!("requests to the hung cache-b answered by another after {waited:?}");
    // The pool's read timeout (that of a tier), and not much more.
    let read = u64::from(timeouts::TIER_READ);
    assert!(
        (read - 1..read + 5).contains(&waited.as_secs()),
        "{waited:?}"
    );
    let started = Instant::now();
    let r = get(balancer, b_uris[2]);
    assert_ne!(served_by(&r), "cache-b");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "cache-b is left out"
    );
    b.resume();

    // Weights 2:1:1 give cache-a about half of the URIs.
    let weighted = pool_world(2);
    let addr = "127.0.0.34:80";
    let _weighted = start_cluster(
        &weighted[0],
        &weighted,
        &paths("balancer-weighted", addr),
        d,
        &names,
    );
    let heavy = shares(&pass(addr, &uris));
    eprintln!("weighted 2:1:1 shares of cache-a, cache-b, cache-c: {heavy:.3?}");
    assert!((0.40..=0.60).contains(&heavy[0]), "shares {heavy:?}");
    assert!(
        heavy[1] < even[1] && heavy[2] < even[2],
        "{heavy:?} vs {even:?}"
    );
    drop(caches);
}

/// The uid and gid OpenShift's restricted-v2 SCC runs a pod as: one from the namespace's range,
/// group root. Neither is known to the image.
const ARBITRARY_UID: u32 = 1000680000;
const ARBITRARY_GID: u32 = 0;

/// The pod template's spec of a Deployment the operator built.
fn pod_spec(
    deployment: &k8s_openapi::api::apps::v1::Deployment,
) -> &k8s_openapi::api::core::v1::PodSpec {
    let template = &deployment.spec.as_ref().unwrap().template;
    template.spec.as_ref().unwrap()
}

/// nginx started exactly as the pod of `children` runs it (the Deployment's command, volumes and
/// mounts), as an arbitrary uid, in a sandbox whose root is read-only, with a tmpfs (mode 0777, as
/// an emptyDir) at each emptyDir mount and the ConfigMap's files read-only at its mount, `conf` as
/// nginx.conf. Any write outside the emptyDirs fails. Its standard error goes to
/// `dir`/pod-nginx.log. Stopped (SIGQUIT) on drop.
fn start_as_pod(
    children: &build::Children,
    conf: &str,
    dir: &Path,
    names: &Names,
    addr: &str,
) -> Nginx {
    let pod = pod_spec(children.workload.deployment().unwrap());
    let container = &pod.containers[0];
    let volumes = pod.volumes.as_deref().unwrap();
    let config = dir.join("config");
    std::fs::create_dir_all(&config).unwrap();
    for (key, text) in children.config_map.data.as_ref().unwrap() {
        let text = if key == build::CONFIG_KEY { conf } else { text };
        std::fs::write(config.join(key), text).unwrap();
    }
    // The pod's read-only root filesystem, and its volumes.
    let mut sandbox = Sandbox::read_only_root()
        .hosts(&names.hosts)
        .resolv_conf(names.resolv_conf(dir));
    for mount in container.volume_mounts.as_deref().unwrap() {
        let volume = volumes.iter().find(|v| v.name == mount.name).unwrap();
        if volume.empty_dir.is_some() {
            sandbox = sandbox.empty_dir(&mount.mount_path);
        } else if volume.config_map.is_some() {
            assert_eq!(mount.read_only, Some(true), "{} is read-only", mount.name);
            sandbox = sandbox.read_only(&config, &mount.mount_path);
        } else {
            panic!("the nginx pod mounts a volume that is neither an emptyDir nor the ConfigMap: {volume:?}");
        }
    }
    let sandbox = sandbox.user(ARBITRARY_UID, ARBITRARY_GID);
    // The container's command, word for word.
    let command = sandbox.command(container.command.as_deref().unwrap());
    let server = Nginx::spawn("pod", command, &dir.join("pod-nginx.log"));
    server.wait_listening(addr, conf);
    wait_resolved(addr, HOST);
    server
}

fn post(addr: &str, path: &str, body: &[u8]) -> u16 {
    request(addr, "POST", path, &[("Host", HOST)], body)
        .unwrap_or_else(|e| panic!("POST {path} to {addr}: {e}"))
        .status
}

#[test]
fn the_pod_runs_nginx_as_any_uid_writing_only_to_its_empty_dirs() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // An origin large enough that nginx buffers responses to files, and a request body too.
    let origin_root = d.join("origin");
    std::fs::create_dir_all(origin_root.join("vod")).unwrap();
    let movie: String = (0..(2 << 20))
        .map(|i| (b'a' + (i % 26) as u8) as char)
        .collect();
    std::fs::write(origin_root.join("vod/movie.mp4"), &movie).unwrap();
    let names = Names::new(
        d,
        "127.0.0.55",
        &[("origin.default.svc.cluster.local", "127.0.0.42")],
    );
    let _origin = start_origin("origin", &origin_root, d, &names, "127.0.0.42:80");

    for (name, role) in [("cache", Role::Cache), ("balancer", Role::Balancer)] {
        let c = cluster(
            name,
            role,
            vec![Source::service("origin", "origin", 80, None)],
        );
        let upstreams = cdn_operator::cdncluster::sources::resolve(
            &c,
            |_| None,
            cdn_operator::cdncluster::sources::DEFAULT_CLUSTER_DOMAIN,
        )
        .unwrap();
        let children = build::children(&c, &upstreams, &Default::default(), &Default::default());
        let psc = pod_spec(children.workload.deployment().unwrap())
            .security_context
            .as_ref()
            .unwrap();
        assert_eq!(psc.run_as_user, None, "the pod fixes no uid");
        // Production configuration, only the listen address moved (the pod's port, 8080).
        let addr = "127.0.0.41:8080";
        let conf = build::config(
            &c,
            &upstreams,
            &Paths {
                listen: addr.into(),
                ..Paths::default()
            },
            false,
        );
        let shipped = &children.config_map.data.as_ref().unwrap()[build::CONFIG_KEY];
        assert_eq!(conf.replace(addr, "8080"), *shipped);

        let own = d.join(name);
        std::fs::create_dir_all(&own).unwrap();
        let server = start_as_pod(&children, &conf, &own, &names, addr);
        assert_eq!(get(addr, "/healthz").status, 200, "{name}");
        let r = get(addr, "/vod/movie.mp4");
        assert_eq!((r.status, r.body.len()), (200, movie.len()), "{name}");
        if role == Role::Cache {
            let r = get(addr, "/vod/movie.mp4");
            assert_eq!(
                (r.status, r.header(CACHE_STATUS_HEADER)),
                (200, Some("HIT")),
                "the cache writes to its emptyDir"
            );
        }
        // A body above nginx's memory buffer goes to client_body_temp_path: the origin's static
        // server then refuses the method (405), not nginx a write (500).
        assert_eq!(
            post(addr, "/vod/movie.mp4", &[b'x'; 256 << 10]),
            405,
            "{name}"
        );
        drop(server);
        let log = std::fs::read_to_string(own.join("pod-nginx.log")).unwrap();
        for bad in [
            "[emerg]",
            "[alert]",
            "[crit]",
            "Permission denied",
            "Read-only file system",
        ] {
            assert!(
                !log.contains(bad),
                "{name} as uid {ARBITRARY_UID}: {bad}\n{log}"
            );
        }
    }
}
