//! The data plane, on real nginx 1.30 (the minor version of the pods' image): what a streaming CDN
//! needs of the generated configurations, each behaviour on balancer `edge` → pool `cache-a` +
//! `cache-b` → a Service origin that counts the connections, requests and bytes it serves.
//!
//! The configurations are the operator's, with only the listen address and the file paths moved
//! (`Paths`); a DNS server of the test (on 127.0.`net`.53) maps the Service names to loopback
//! addresses. Each test has a /24 of loopback of its own, so the tests run side by side.

mod support;

use cdn_operator::api::{
    CacheRule, CacheSpec, CdnCluster, CdnClusterSpec, HttpSpec, Role, Source, TlsSpec,
};
use cdn_operator::cdncluster::build::{self, CONFIG_KEY, ENTRYPOINT, ENTRYPOINT_KEY};
use cdn_operator::cdncluster::nginx::{Paths, CACHE_STATUS_HEADER, TLS_DIR, UPSTREAM_HEADER};
use cdn_operator::nginx_cache::wire::{self, Applied, Batch};
use cdn_operator::purge::signing::Signer;
use cdn_operator_testkit::{request, settle, Nginx, Response, Sandbox, Signal, SIGQUIT, SIGTERM};
use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use support::tls::{client_hello, Ca, Hello, ServerCertificate, H2, PROTOCOL_VERSION_ALERT};
use support::{nginx_config, wait_resolved, Names};

const HOST: (&str, &str) = ("Host", "cdn.example");

/// The topology: `edge` balances a pool of two caches, each fetching from the Service origin
/// `origin`; `tune` adjusts each CdnCluster.
fn topology(tune: impl Fn(&mut CdnCluster)) -> Vec<CdnCluster> {
    let cluster = |name: &str, role, sources| {
        let mut c = CdnCluster::new(name, CdnClusterSpec::new(role, sources));
        c.metadata.namespace = Some("default".into());
        c.metadata.uid = Some(format!("{name}-uid"));
        tune(&mut c);
        c
    };
    let origin = || vec![Source::service("origin", "origin", 80, None)];
    vec![
        cluster(
            "edge",
            Role::Balancer,
            vec![
                Source::cluster("cache-a", None),
                Source::cluster("cache-b", None),
            ],
        ),
        cluster("cache-a", Role::Cache, origin()),
        cluster("cache-b", Role::Cache, origin()),
    ]
}

/// The fully qualified name of the Service `name` of the namespace `default`.
fn service_name(name: &str) -> String {
    format!("{name}.default.svc.cluster.local")
}

/// The IP of `name` in a world on 127.0.`net`.0/24.
fn ip(net: u8, name: &str) -> String {
    address(net, name).trim_end_matches(":80").to_string()
}

/// HTTPS of `name` in a world on 127.0.`net`.0/24, on its Service's port.
fn tls_address(net: u8, name: &str) -> String {
    format!("{}:443", ip(net, name))
}

/// The hosts of a world on 127.0.`net`.0/24, on their Services' port.
fn address(net: u8, name: &str) -> String {
    let host = match name {
        "origin" => 10,
        "cache-a" => 11,
        "cache-b" => 12,
        "edge" => 20,
        // Pods started again, and late (sources_are_looked_up_while_nginx_runs).
        "cache-b-again" => 13,
        "cache-a-late" => 14,
        // The pods of a cache cluster of three (the_pods_of_a_cache_cluster_form_one_ring).
        "cache-a-0" => 31,
        "cache-a-1" => 32,
        "cache-a-2" => 33,
        other => panic!("no address for {other}"),
    };
    format!("127.0.{net}.{host}:80")
}

/// The origin: files under `www` (a folder per Host under `www/sites`), 503 under /err/,
/// `Cache-Control: no-cache` under /nocache/, the forwarded headers echoed under /echo/, files
/// under /slow/ sent at 256 KiB/s (nginx's `limit_rate`: each request's first second at once),
/// files under /tagged/TAG/ tagged `TAG every-tagged` (Surrogate-Key) and `ct-TAG` (Cache-Tag); its
/// access log counts requests and body bytes, its stub_status (on port 81) connections.
fn origin_config(dir: &Path, net: u8) -> String {
    let d = dir.display();
    let listen = address(net, "origin");
    let status = format!("{}:81", ip(net, "origin"));
    format!(
        "pid {d}/origin.pid;\nevents {{}}\nhttp {{\n\
         \x20 log_format count '$request_method $uri $status $body_bytes_sent';\n\
         \x20 access_log {d}/origin.access count;\n\
         \x20 client_body_temp_path {d}/tmp; proxy_temp_path {d}/tmp; fastcgi_temp_path {d}/tmp;\n\
         \x20 uwsgi_temp_path {d}/tmp; scgi_temp_path {d}/tmp;\n\
         \x20 server {{\n\
         \x20   listen {listen};\n\
         \x20   root {d}/www;\n\
         \x20   location /sites/ {{ root {d}/www/sites/$host; rewrite ^/sites(/.*)$ $1 break; }}\n\
         \x20   location /err/ {{ return 503; }}\n\
         \x20   location /nocache/ {{ add_header Cache-Control no-cache; }}\n\
         \x20   location /echo/ {{ return 200 \"$http_x_forwarded_for|$http_x_forwarded_proto\"; }}\n\
         \x20   location /slow/ {{ limit_rate 256k; }}\n\
         \x20   location ~ ^/tagged/(?<tag>[^/]+)/ {{ add_header Surrogate-Key \"$tag every-tagged\"; add_header Cache-Tag \"ct-$tag\"; }}\n\
         \x20 }}\n\
         \x20 server {{ listen {status}; access_log off; location / {{ stub_status; }} }}\n\
         }}\n"
    )
}

/// One origin request, from its access log.
#[derive(Debug)]
struct Served {
    method: String,
    uri: String,
    status: u16,
    bytes: u64,
}

/// A topology running: the origin, then each CdnCluster's nginx.
struct World {
    net: u8,
    sandbox: Sandbox,
    clusters: Vec<CdnCluster>,
    running: Vec<(String, Nginx)>,
    origin: Nginx,
    /// The Services' names, in the DNS server the CdnClusters' nginx asks.
    names: Names,
    /// Each instance counted by a metrics sidecar (`cdn-operator nginx-metrics`), started
    /// before its nginx as the pod starts it.
    counted: bool,
    sidecars: Vec<(String, Sidecar)>,
    /// The operator's purge key: its public half is the caches' sidecars' `--purge-keys`.
    signer: Signer,
    /// Last: removed once everything that writes in it has stopped (fields drop in order).
    dir: tempfile::TempDir,
}

impl World {
    fn start(net: u8, clusters: Vec<CdnCluster>) -> World {
        World::start_with_secret(net, clusters, None, false)
    }

    /// [`World::start`], each instance with its metrics sidecar.
    fn start_counted(net: u8, clusters: Vec<CdnCluster>) -> World {
        World::start_with_secret(net, clusters, None, true)
    }

    /// [`World::start`], the CdnClusters that set `tls` serving `certificate`: the files of their
    /// Secret, as the kubelet mounts them, at the pods' path.
    fn start_with_secret(
        net: u8,
        clusters: Vec<CdnCluster>,
        certificate: Option<&ServerCertificate>,
        counted: bool,
    ) -> World {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir_all(d.join("www/sites")).unwrap();
        std::fs::create_dir_all(d.join("tmp")).unwrap();
        if let Some(certificate) = certificate {
            SecretVolume::new(d.join("secret"), &certificate.secret_data());
        }
        let ips: Vec<(String, String)> = ["origin", "cache-a", "cache-b", "edge"]
            .into_iter()
            .map(|name| (service_name(name), ip(net, name)))
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
        let (signer, _) = Signer::generate();
        std::fs::write(d.join(wire::PUBLIC_KEYS_KEY), signer.public_keys_file()).unwrap();
        let mut world = World {
            dir,
            net,
            names,
            sandbox,
            clusters,
            origin,
            running: Vec::new(),
            counted,
            sidecars: Vec::new(),
            signer,
        };
        for name in ["cache-a", "cache-b", "edge"] {
            world.run(name);
        }
        world
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn cluster(&self, name: &str) -> &CdnCluster {
        self.clusters
            .iter()
            .find(|c| c.metadata.name.as_deref() == Some(name))
            .unwrap()
    }

    /// Starts `name`'s nginx with its own temp and cache folders.
    fn run(&mut self, name: &str) {
        self.run_instance(name, name, &address(self.net, name));
    }

    /// Starts an instance (`instance`, a pod) of the CdnCluster `name` listening on `listen`, with
    /// temp and cache folders of its own...
    /// ... once it found its sources in DNS (`wait_resolved`).
    fn run_instance(&mut self, name: &str, instance: &str, listen: &str) {
        self.start_instance(name, instance, listen);
        wait_resolved(listen, HOST.1);
    }

    /// [`World::run_instance`] without waiting for the sources to resolve.
    fn start_instance(&mut self, name: &str, instance: &str, listen: &str) {
        let own = self.path().join(instance);
        std::fs::create_dir_all(&own).unwrap();
        let (host, _) = listen.rsplit_once(':').unwrap();
        let paths = Paths {
            listen: listen.into(),
            tls_listen: format!("{host}:443"),
            temp_dir: own.to_str().unwrap().into(),
            cache_dir: own.to_str().unwrap().into(),
            ..Paths::default()
        };
        if self.counted {
            let keys = self.path().join(wire::PUBLIC_KEYS_KEY);
            let sidecar = Sidecar::start(
                self.cluster(name),
                instance,
                &own,
                &format!("{host}:9113"),
                &keys,
            );
            self.sidecars.push((instance.into(), sidecar));
        }
        self.start_nginx(name, instance, &paths);
    }

    /// Starts the nginx of `instance` of the CdnCluster `name` on `paths` (its folders kept).
    fn start_nginx(&mut self, name: &str, instance: &str, paths: &Paths) {
        let cluster = self.cluster(name);
        let conf = self
            .names
            .config_counted(cluster, &self.clusters, paths, self.counted);
        let sandbox = if cluster.spec.tls.is_some() {
            self.sandbox
                .clone()
                .read_only(self.path().join("secret"), TLS_DIR)
        } else {
            self.sandbox.clone()
        };
        let nginx = Nginx::start(&sandbox, instance, &conf, self.path(), &paths.listen);
        self.running.push((instance.into(), nginx));
    }

    /// Restarts the nginx of the instance `instance` of `name` as a container restarts: a new
    /// process on the same folders (the pod's emptyDirs), its sidecar left running.
    fn restart(&mut self, name: &str, instance: &str) {
        self.stop(instance);
        self.start_again(name, instance);
    }

    /// Starts again the nginx of `instance` of `name`, stopped by [`World::stop`], on its
    /// folders.
    fn start_again(&mut self, name: &str, instance: &str) {
        let own = self.path().join(instance);
        let listen = address(self.net, instance);
        let (host, _) = listen.rsplit_once(':').unwrap();
        let paths = Paths {
            listen: listen.clone(),
            tls_listen: format!("{host}:443"),
            temp_dir: own.to_str().unwrap().into(),
            cache_dir: own.to_str().unwrap().into(),
            ..Paths::default()
        };
        self.start_nginx(name, instance, &paths);
        wait_resolved(&listen, HOST.1);
    }

    /// Stops the instance `instance`'s nginx, its sidecar left running.
    fn stop(&mut self, instance: &str) {
        let at = self
            .running
            .iter()
            .position(|(i, _)| i == instance)
            .unwrap();
        self.running.remove(at).1.stop();
    }

    /// `purges` as a batch for the pods of `cluster`, signed with `key`, issued now.
    fn batch(&self, cluster: &str, purges: &[wire::Purge], key: &Signer) -> (Vec<u8>, String) {
        let issued = jiff::Timestamp::now().as_second();
        let batch = Batch {
            id: format!(
                "{cluster}-{}",
                std::process::id() as u64 * 1_000_000 + next_id()
            ),
            issued,
            expires: issued + wire::VALIDITY_SECONDS,
            cluster: format!("default/{cluster}"),
            purges: purges.to_vec(),
        };
        let body = serde_json::to_vec(&batch).unwrap();
        let signature = wire::signature_header(&key.sign(&body));
        (body, signature)
    }

    /// Sends `body` signed `signature` to the sidecar of `instance`.
    fn send_batch(&self, instance: &str, body: &[u8], signature: Option<&str>) -> Response {
        let (_, sidecar) = self.sidecars.iter().find(|(i, _)| i == instance).unwrap();
        let mut headers = vec![("Content-Type", "application/json")];
        if let Some(signature) = signature {
            headers.push((wire::SIGNATURE_HEADER, signature));
        }
        request(&sidecar.listen, "POST", wire::PURGE_PATH, &headers, body).unwrap()
    }

    /// Applies `purges`, as the operator does: one batch signed with its key to the sidecar of
    /// each cache instance; what each applied.
    fn purge(&self, purges: &[wire::Purge]) -> Vec<Applied> {
        let caches: Vec<(String, String)> = self
            .sidecars
            .iter()
            .filter(|(_, s)| self.cluster(&s.cluster).spec.role == Role::Cache)
            .map(|(i, s)| (i.clone(), s.cluster.clone()))
            .collect();
        caches
            .iter()
            .map(|(instance, cluster)| {
                let (body, signature) = self.batch(cluster, purges, &self.signer);
                let r = self.send_batch(instance, &body, Some(&signature));
                assert_eq!(r.status, 200, "{instance}: {}", r.body);
                serde_json::from_str(&r.body).unwrap()
            })
            .collect()
    }

    /// What the metrics sidecar of `instance` serves (the classic text format).
    fn metrics(&self, instance: &str) -> String {
        let (_, sidecar) = self.sidecars.iter().find(|(i, _)| i == instance).unwrap();
        sidecar.scrape()
    }

    /// The status of `instance`'s sidecar's `/readyz`: the pod's readiness.
    fn ready(&self, instance: &str) -> u16 {
        let (_, sidecar) = self.sidecars.iter().find(|(i, _)| i == instance).unwrap();
        request(&sidecar.listen, "GET", "/readyz", &[], b"").map_or(0, |reply| reply.status)
    }

    /// Writes the object `path` (from the origin's root) with `body`.
    fn put(&self, path: &str, body: &[u8]) {
        let file = self.path().join("www").join(path.trim_start_matches('/'));
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        // Replaced, not rewritten in place: nginx may be sending the old one.
        let tmp = file.with_extension("new");
        std::fs::write(&tmp, body).unwrap();
        std::fs::rename(tmp, file).unwrap();
    }

    fn get(&self, path: &str, headers: &[(&str, &str)]) -> Response {
        self.ask("edge", "GET", path, headers)
    }

    fn ask(&self, to: &str, method: &str, path: &str, headers: &[(&str, &str)]) -> Response {
        let mut all = vec![HOST];
        all.extend(headers.iter().filter(|(n, _)| *n != "Host"));
        if let Some(host) = headers.iter().find(|(n, _)| *n == "Host") {
            all[0] = *host;
        }
        request(&address(self.net, to), method, path, &all, b"")
            .unwrap_or_else(|e| panic!("{method} {path} to {to}: {e}"))
    }

    /// What the origin served so far (its log once settled, [`settled_log`](cdn_operator_testkit::nginx::settled_log)).
    fn served(&self) -> Vec<Served> {
        let log = cdn_operator_testkit::nginx::settled_log(&self.path().join("origin.access"));
        log.lines()
            .map(|line| line.split(' ').collect::<Vec<&str>>())
            // Not the probes of `wait_resolved`.
            .filter(|f| !f[1].starts_with("/not-here/"))
            .map(|f| Served {
                method: f[0].into(),
                uri: f[1].into(),
                status: f[2].parse().unwrap(),
                bytes: f[3].parse().unwrap(),
            })
            .collect()
    }

    fn served_for(&self, uri: &str) -> Vec<Served> {
        self.served().into_iter().filter(|s| s.uri == uri).collect()
    }

    /// The TCP connections the origin accepted so far, this count's own excluded.
    fn origin_connections(&self) -> u64 {
        let status = format!("{}:81", ip(self.net, "origin"));
        let text = request(&status, "GET", "/", &[], b"").unwrap().body;
        // "Active connections: 1\nserver accepts handled requests\n 12 12 40\n..."
        let counts = text.lines().nth(2).unwrap();
        counts
            .split_whitespace()
            .next()
            .unwrap()
            .parse::<u64>()
            .unwrap()
            - 1
    }
}

/// `n` requests at once, each on its own thread and connection.
fn at_once(world: &World, n: usize, path: &str) -> Vec<(Response, Duration)> {
    std::thread::scope(|s| {
        let threads: Vec<_> = (0..n)
            .map(|_| {
                s.spawn(|| {
                    let started = Instant::now();
                    (world.get(path, &[]), started.elapsed())
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    })
}

#[test]
fn connections_to_every_tier_are_reused() {
    let world = World::start(1, topology(|_| {}));
    for i in 0..60 {
        world.put(&format!("/obj/{i}"), format!("object {i}").as_bytes());
    }
    let before = world.origin_connections();
    let caches = ["cache-a", "cache-b"].map(|c| address(world.net, c));
    let cache_sockets =
        || -> BTreeSet<String> { caches.iter().flat_map(|c| tcp_sockets_at(c)).collect() };
    let sockets_before = cache_sockets();
    for i in 0..60 {
        let r = world.get(&format!("/obj/{i}"), &[]);
        assert_eq!(
            (r.status, r.body.as_str()),
            (200, format!("object {i}").as_str())
        );
        assert_eq!(r.header(CACHE_STATUS_HEADER), Some("MISS"));
    }
    let connections = world.origin_connections() - before;
    assert_eq!(world.served().len(), 60);
    // Each cache keeps its connections to the origin open: a handful, not one per miss. (Each
    // client request here comes on a connection of its own, so the caches' workers take turns.)
    assert!(
        connections <= 8,
        "{connections} origin connections for 60 sequential misses"
    );
    // So does the edge with the caches: the caches' ends of the connections they accepted
    // meanwhile, open or closed a moment ago (TIME_WAIT), are a handful too.
    let accepted = cache_sockets().difference(&sockets_before).count();
    assert!(
        accepted <= 8,
        "{accepted} connections accepted by the caches for 60 requests"
    );
    assert!(
        !cache_sockets().is_empty(),
        "the edge's connections, kept open, are seen"
    );
}

/// The TCP sockets whose local end is `addr` (`a.b.c.d:port`), its listener excluded, by their
/// remote end: the connections it accepted, open or just closed (TIME_WAIT lasts a minute, so an
/// earlier test's may still be there).
fn tcp_sockets_at(addr: &str) -> Vec<String> {
    let (ip, port) = addr.split_once(':').unwrap();
    let ip: std::net::Ipv4Addr = ip.parse().unwrap();
    let port: u16 = port.parse().unwrap();
    // /proc/net/tcp writes an IPv4 address as its u32 in host byte order, in hex.
    let local = format!("{:08X}:{port:04X}", u32::from_ne_bytes(ip.octets()));
    std::fs::read_to_string("/proc/net/tcp")
        .unwrap()
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            (fields[1] == local && fields[3] != "0A").then(|| format!("{addr} {}", fields[2]))
        })
        .collect()
}

#[test]
fn forwarded_headers_are_trusted_only_from_trusted_proxies() {
    // On loopback every peer is 127.0.0.1, the balancer too: cache-a trusts it, as a cache
    // trusts the private ranges of a cluster; cache-b trusts no one.
    let world = World::start(
        2,
        topology(|c| {
            let trusted = match c.metadata.name.as_deref() {
                Some("cache-a") => vec!["127.0.0.1".to_string()],
                _ => vec![],
            };
            if c.spec.role == Role::Cache {
                c.spec.http = Some(Box::new(HttpSpec {
                    trusted_proxies: Some(trusted),
                    ..HttpSpec::default()
                }));
            }
        }),
    );
    let forged = [
        ("X-Forwarded-For", "6.6.6.6"),
        ("X-Forwarded-Proto", "https"),
    ];
    // From a trusted proxy, the client it names is kept and the proxy appended.
    let r = world.ask("cache-a", "GET", "/echo/a", &forged);
    assert_eq!(r.body, "6.6.6.6, 127.0.0.1|https");
    // From anyone else, replaced: the peer and this hop's scheme.
    let r = world.ask("cache-b", "GET", "/echo/b", &forged);
    assert_eq!(r.body, "127.0.0.1|http");
    // Through the edge, which trusts no one: the client forges nothing; a cache that trusts the
    // balancer appends it. Both caches are seen.
    let mut seen = BTreeSet::new();
    for i in 0..10 {
        let r = world.get(&format!("/echo/edge-{i}"), &forged);
        let via_a = r.header(UPSTREAM_HEADER) == Some(address(2, "cache-a").as_str());
        seen.insert(via_a);
        let expected = if via_a {
            "127.0.0.1, 127.0.0.1|http"
        } else {
            "127.0.0.1|http"
        };
        assert_eq!(r.body, expected, "via {:?}", r.header(UPSTREAM_HEADER));
    }
    assert_eq!(seen.len(), 2, "the 10 paths all went to one cache");
}

#[test]
fn the_cache_key_holds_the_host_and_leaves_out_excluded_parameters() {
    let world = World::start(
        3,
        topology(|c| {
            c.spec.http = Some(Box::new(HttpSpec {
                excluded_query_parameters: Some(vec!["token".into(), "expires".into()]),
                ..HttpSpec::default()
            }));
        }),
    );
    for site in ["customer-a", "customer-b"] {
        world.put(&format!("/sites/{site}/live/seg.ts"), site.as_bytes());
    }
    // On one cache (the balancer may hash the two hosts to different ones).
    let a = world.ask(
        "cache-a",
        "GET",
        "/sites/live/seg.ts",
        &[("Host", "customer-a")],
    );
    assert_eq!((a.status, a.body.as_str()), (200, "customer-a"));
    let b = world.ask(
        "cache-a",
        "GET",
        "/sites/live/seg.ts",
        &[("Host", "customer-b")],
    );
    assert_eq!(
        (b.status, b.body.as_str()),
        (200, "customer-b"),
        "no cross-host hit"
    );
    assert_eq!(b.header(CACHE_STATUS_HEADER), Some("MISS"));
    // And through the balancer.
    for site in ["customer-a", "customer-b"] {
        assert_eq!(
            world.get("/sites/live/seg.ts", &[("Host", site)]).body,
            site
        );
    }

    // Signed URLs: one object whatever its token, on one cache; other parameters still count.
    world.put("/vod/movie.mp4", b"movie");
    let first = world.get("/vod/movie.mp4?token=abc&expires=1&q=1", &[]);
    assert_eq!(first.header(CACHE_STATUS_HEADER), Some("MISS"));
    for query in [
        "token=xyz&expires=2&q=1",
        "q=1&token=other",
        "expires=9&q=1",
    ] {
        let r = world.get(&format!("/vod/movie.mp4?{query}"), &[]);
        assert_eq!(r.header(CACHE_STATUS_HEADER), Some("HIT"), "{query}");
        assert_eq!(
            r.header(UPSTREAM_HEADER),
            first.header(UPSTREAM_HEADER),
            "{query}: the same cache"
        );
    }
    let other = world.get("/vod/movie.mp4?token=abc&q=2", &[]);
    assert_eq!(other.header(CACHE_STATUS_HEADER), Some("MISS"));
    assert_eq!(world.served_for("/vod/movie.mp4").len(), 2);
}

#[test]
fn origin_errors_stay_at_the_origin() {
    let world = World::start(4, topology(|_| {}));
    let segments: Vec<String> = (0..20).map(|i| format!("/live/{i}.ts")).collect();
    for s in &segments {
        world.put(s, s.as_bytes());
        assert_eq!(world.get(s, &[]).status, 200);
    }
    // Errors the caches relay from the origin are answers: passed on once, no other cache
    // asked, no cache marked down.
    for i in 0..3 {
        let r = world.get(&format!("/err/{i}"), &[]);
        assert_eq!(r.status, 503);
        assert_eq!(
            r.header(UPSTREAM_HEADER).map(|a| a.contains(',')),
            Some(false),
            "one cache asked: {:?}",
            r.header(UPSTREAM_HEADER)
        );
    }
    assert_eq!(world.served().iter().filter(|s| s.status == 503).count(), 3);
    for s in &segments {
        let r = world.get(s, &[]);
        assert_eq!((r.status, r.body.as_str()), (200, s.as_str()), "after 503s");
        assert_eq!(r.header(CACHE_STATUS_HEADER), Some("HIT"));
    }

    // The origin hangs: what the caches hold is served at once; a miss gets the cache's 504
    // once the cache gives up on the origin, before the balancer would give up on the cache.
    world.origin.pause();
    let started = Instant::now();
    let (miss, hits) = std::thread::scope(|s| {
        let miss = s.spawn(|| world.get("/live/new.ts", &[]));
        std::thread::sleep(Duration::from_millis(200));
        let hits: Vec<(u16, Duration)> = segments
            .iter()
            .map(|seg| {
                let t = Instant::now();
                (world.get(seg, &[]).status, t.elapsed())
            })
            .collect();
        (miss.join().unwrap(), hits)
    });
    let waited = started.elapsed();
    world.origin.resume();
    for (status, took) in &hits {
        assert_eq!(*status, 200);
        // At once, not after the 8 s the cache gives the hung origin.
        assert!(*took < Duration::from_secs(3), "a hit took {took:?}");
    }
    assert_eq!(miss.status, 504, "{miss:?}");
    assert!(
        miss.header(UPSTREAM_HEADER)
            .is_some_and(|a| !a.contains(',')),
        "the cache answered, no failover: {:?}",
        miss.header(UPSTREAM_HEADER)
    );
    assert!(waited < Duration::from_secs(20), "{waited:?}");
    // And the caches are still in the pool: every segment still a HIT.
    for s in &segments {
        assert_eq!(world.get(s, &[]).header(CACHE_STATUS_HEADER), Some("HIT"));
    }
}

#[test]
fn ranges_fetch_only_their_slices_and_a_head_no_body() {
    let world = World::start(5, topology(|_| {}));
    // Text, so the body read back is the body sent.
    let big: Vec<u8> = (0..8u32 << 20).map(|i| b'a' + (i % 26) as u8).collect();
    world.put("/vod/big.bin", &big);
    let last = big.len() - (1 << 20);
    let range = format!("bytes={last}-");
    let r = world.get("/vod/big.bin", &[("Range", &range)]);
    assert_eq!(r.status, 206);
    assert_eq!(r.header("Content-Length"), Some("1048576"));
    assert!(r.body.as_bytes() == &big[last..], "the last MiB");
    let from_origin: u64 = world.served().iter().map(|s| s.bytes).sum();
    // The last MiB is one slice (two when it straddles them): not the whole object.
    assert!(
        from_origin <= 2 << 20,
        "{from_origin} bytes from the origin"
    );
    // (How fast: the data-plane benchmark measures the first byte.)

    // A HEAD of a cold object is a HEAD at the origin.
    world.put("/vod/other.bin", &big);
    let r = world.ask("edge", "HEAD", "/vod/other.bin", &[]);
    assert_eq!(r.status, 200);
    assert!(r.body.is_empty());
    assert_eq!(r.header("Content-Length"), Some("8388608"));
    let heads = world.served_for("/vod/other.bin");
    assert_eq!(heads.len(), 1);
    assert_eq!((heads[0].method.as_str(), heads[0].bytes), ("HEAD", 0));

    // The whole object, assembled from slices, is the object.
    let r = world.get("/vod/big.bin", &[]);
    assert_eq!(r.status, 200);
    assert!(
        r.body.as_bytes() == big,
        "the object assembled from its slices"
    );
}

#[test]
fn missing_and_uncacheable_answers_do_not_pile_up_at_the_origin() {
    let world = World::start(6, topology(|_| {}));
    for _ in 0..20 {
        assert_eq!(world.get("/live/missing.ts", &[]).status, 404);
    }
    let asked = world.served_for("/live/missing.ts").len();
    assert!(asked <= 2, "{asked} origin requests for 20 sequential 404s");
    // Briefly: a segment published a moment later is found. (nginx counts lifetimes in whole
    // seconds: `1s` lasts one to two.)
    std::thread::sleep(Duration::from_millis(2100));
    world.put("/live/missing.ts", b"now here");
    assert_eq!(world.get("/live/missing.ts", &[]).status, 200);

    // 100 at once for a missing object: one origin request, no queue.
    let answers = at_once(&world, 100, "/live/gone.ts");
    assert!(answers.iter().all(|(r, _)| r.status == 404));
    assert_eq!(world.served_for("/live/gone.ts").len(), 1);
    // None waited for nginx's lock bound of 5 s (the old configuration's queue), even on a
    // loaded machine.
    let slowest = answers.iter().map(|(_, t)| *t).max().unwrap();
    assert!(slowest < Duration::from_secs(4), "{slowest:?}");

    // 100 at once for an object the origin says not to cache: each reaches the origin, held by
    // the cache lock for at most its bound (2 s, nginx looks every 0.5 s), not nginx's 5 s.
    world.put("/nocache/personal.m3u8", b"yours");
    let answers = at_once(&world, 100, "/nocache/personal.m3u8");
    assert!(answers.iter().all(|(r, _)| r.body == "yours"));
    assert_eq!(world.served_for("/nocache/personal.m3u8").len(), 100);
    let slowest = answers.iter().map(|(_, t)| *t).max().unwrap();
    assert!(
        slowest < Duration::from_millis(4500),
        "{slowest:?}, not the 2 s bound"
    );

    // With credentials, each viewer's own: 100 at once each reach the origin, none waits for
    // another's fetch, and nothing is kept for a viewer without them.
    world.put("/vod/mine.mp4", b"mine");
    let answers: Vec<(Response, Duration)> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..100)
            .map(|_| {
                s.spawn(|| {
                    let started = Instant::now();
                    let r = world.get("/vod/mine.mp4", &[("Authorization", "Bearer viewer")]);
                    (r, started.elapsed())
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    assert!(answers
        .iter()
        .all(|(r, _)| r.body == "mine" && r.header(CACHE_STATUS_HEADER) == Some("BYPASS")));
    assert_eq!(world.served_for("/vod/mine.mp4").len(), 100);
    // Not the lock's bound (2 s, checked every 0.5 s), even on a loaded machine.
    let slowest = answers.iter().map(|(_, t)| *t).max().unwrap();
    assert!(slowest < Duration::from_millis(1500), "{slowest:?}");
    assert_eq!(
        world.get("/vod/mine.mp4", &[]).header(CACHE_STATUS_HEADER),
        Some("MISS")
    );

    // 100 at once for one object: one origin request.
    world.put("/vod/popular.mp4", b"popular");
    let answers = at_once(&world, 100, "/vod/popular.mp4");
    assert!(answers.iter().all(|(r, _)| r.body == "popular"));
    assert_eq!(world.served_for("/vod/popular.mp4").len(), 1);
}

#[test]
fn live_manifests_follow_the_origin_when_it_says_nothing() {
    let world = World::start(7, topology(|_| {}));
    world.put("/live/index.m3u8", b"#EXTM3U\n#1\n");
    world.put("/vod/notes.txt", b"v1");
    assert_eq!(world.get("/live/index.m3u8", &[]).body, "#EXTM3U\n#1\n");
    assert_eq!(world.get("/vod/notes.txt", &[]).body, "v1");
    // A new length: within the second, the origin's validators (Last-Modified, and an ETag of
    // mtime and size) tell the new version from the old by its size alone.
    world.put("/live/index.m3u8", b"#EXTM3U\n#1\n#2\n");
    world.put("/vod/notes.txt", b"v2.");
    // The manifest rule (2 s) applies; other paths keep `valid` (10 m).
    let manifest = settle(
        Duration::from_secs(6),
        Duration::from_millis(250),
        || world.get("/live/index.m3u8", &[]).body,
        |body| body == "#EXTM3U\n#1\n#2\n",
    );
    assert_eq!(manifest, "#EXTM3U\n#1\n#2\n", "the manifest stayed frozen");
    assert_eq!(world.get("/vod/notes.txt", &[]).body, "v1");

    // Rules of the user's replace the defaults.
    let world = World::start(
        8,
        topology(|c| {
            c.spec.cache = Some(Box::new(CacheSpec {
                rules: Some(vec![CacheRule {
                    path_condition: r"\.txt$".into(),
                    valid: "1s".into(),
                }]),
                ..CacheSpec::default()
            }));
        }),
    );
    world.put("/vod/notes.txt", b"v1");
    world.put("/live/index.m3u8", b"#EXTM3U\n#1\n");
    assert_eq!(world.get("/vod/notes.txt", &[]).body, "v1");
    assert_eq!(world.get("/live/index.m3u8", &[]).body, "#EXTM3U\n#1\n");
    world.put("/vod/notes.txt", b"v2.");
    world.put("/live/index.m3u8", b"#EXTM3U\n#1\n#2\n");
    std::thread::sleep(Duration::from_millis(2100));
    // Short-lived, so refreshed in the background: the request that finds it expired gets the
    // cached copy at once, the next ones the new version.
    let r = world.get("/vod/notes.txt", &[]);
    assert_eq!(
        (r.header(CACHE_STATUS_HEADER), r.body.as_str()),
        (Some("STALE"), "v1")
    );
    let notes = settle(
        Duration::from_secs(5),
        Duration::from_millis(100),
        || world.get("/vod/notes.txt", &[]).body,
        |body| body == "v2.",
    );
    assert_eq!(notes, "v2.");
    // The default manifest rule (2 s) is gone: the manifest keeps `valid` (10 m).
    assert_eq!(world.get("/live/index.m3u8", &[]).body, "#EXTM3U\n#1\n");
}

#[test]
fn an_expired_manifest_is_answered_at_once_while_the_origin_hangs_and_refreshed_after() {
    let world = World::start(24, topology(|_| {}));
    let manifests: Vec<String> = (0..5).map(|k| format!("/live/m{k}.m3u8")).collect();
    for m in &manifests {
        world.put(m, b"#EXTM3U\n#1\n");
        assert_eq!(world.get(m, &[]).body, "#EXTM3U\n#1\n");
    }
    for m in &manifests {
        world.put(m, b"#EXTM3U\n#1\n#2\n");
    }
    // Past the manifests' lifetime (2 s; nginx counts whole seconds), then the origin hangs.
    std::thread::sleep(Duration::from_millis(3100));
    world.origin.pause();
    // Each asked three times in turn through the balancer, which reuses its connections to the
    // caches: the first answer starts a refresh that waits on the hung origin, and the
    // connection it came on is closed, not left to hold the next request for the 8 s read
    // timeout.
    let mut answers = Vec::new();
    for _ in 0..3 {
        for m in &manifests {
            let started = Instant::now();
            let r = world.get(m, &[]);
            answers.push((m.clone(), r, started.elapsed()));
        }
    }
    world.origin.resume();
    for (m, r, took) in &answers {
        assert_eq!(
            (r.status, r.body.as_str()),
            (200, "#EXTM3U\n#1\n"),
            "{m}: the cached copy"
        );
        assert!(
            matches!(r.header(CACHE_STATUS_HEADER), Some("STALE" | "UPDATING")),
            "{m}: {:?}",
            r.header(CACHE_STATUS_HEADER)
        );
        assert!(*took < Duration::from_millis(500), "{m} took {took:?}");
    }
    // The origin answers again: the refreshes land, in the background.
    for m in &manifests {
        let body = settle(
            Duration::from_secs(12),
            Duration::from_millis(200),
            || world.get(m, &[]).body,
            |body| body == "#EXTM3U\n#1\n#2\n",
        );
        assert_eq!(body, "#EXTM3U\n#1\n#2\n", "{m} was not refreshed");
    }
}

/// A ConfigMap or Secret volume as the kubelet writes it: `KEY -> ..data/KEY`,
/// `..data -> ..<version>`, a new version swapped in with one rename.
struct ConfigVolume {
    dir: PathBuf,
    version: u32,
}

/// The kubelet writes a Secret's files as a ConfigMap's.
type SecretVolume = ConfigVolume;

impl ConfigVolume {
    fn new(dir: PathBuf, data: &[(&str, &str)]) -> ConfigVolume {
        std::fs::create_dir_all(&dir).unwrap();
        let mut volume = ConfigVolume { dir, version: 0 };
        volume.update(data);
        for (key, _) in data {
            std::os::unix::fs::symlink(format!("..data/{key}"), volume.dir.join(key)).unwrap();
        }
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
    }
}

/// A pod of a CdnCluster as Kubernetes runs it: its entrypoint from its ConfigMap `volume`
/// (holding its configuration `conf`), mounted read-only at /etc/nginx/cdn, emptyDirs at /tmp
/// and /var/cache/nginx, listening on `listen`; its standard error in `NAME.log`, its standard
/// output (the access log) in `NAME.out`.
fn run_pod(world: &World, name: &str, volume: &ConfigVolume, listen: &str, conf: &str) -> Nginx {
    let pod = Sandbox::read_only_root()
        .hosts(&world.names.hosts)
        .resolv_conf(world.names.resolv_conf(world.path()))
        .read_only(&volume.dir, build::CONFIG_DIR)
        .empty_dir("/tmp")
        .empty_dir("/var/cache/nginx");
    let entrypoint = format!("{}/{ENTRYPOINT_KEY}", build::CONFIG_DIR);
    let nginx = Nginx::spawn_logging(
        name,
        pod.command(&["/bin/sh", &entrypoint]),
        &world.path().join(format!("{name}.log")),
        &world.path().join(format!("{name}.out")),
    );
    nginx.wait_listening(listen, conf);
    wait_resolved(listen, HOST.1);
    nginx
}

/// [`run_pod`] of a pod `pod` of the CdnCluster `cluster` of `world` listening on `listen`, its
/// configuration and entrypoint as the operator writes them in its ConfigMap.
fn cluster_pod(world: &World, cluster: &str, listen: &str) -> Nginx {
    let paths = Paths {
        listen: listen.into(),
        ..Paths::default()
    };
    let conf = nginx_config(world.cluster(cluster), &world.clusters, &paths);
    let volume = ConfigVolume::new(
        world.path().join("cm"),
        &[(CONFIG_KEY, &conf), (ENTRYPOINT_KEY, ENTRYPOINT)],
    );
    run_pod(world, "pod", &volume, listen, &conf)
}

#[test]
fn a_configuration_change_is_applied_in_place_and_keeps_the_cache() {
    // The cache runs as its pod does: the entrypoint from its ConfigMap, mounted read-only at
    // /etc/nginx/cdn, emptyDirs at /tmp and /var/cache/nginx; only the listen address moved.
    let mut world = World::start(9, topology(|_| {}));
    let mut cache = world.cluster("cache-a").clone();
    let listen = "127.0.9.31:80";
    let paths = Paths {
        listen: listen.into(),
        ..Paths::default()
    };
    let conf = nginx_config(&cache, &world.clusters, &paths);
    let mut volume = ConfigVolume::new(
        world.path().join("cm"),
        &[(CONFIG_KEY, &conf), (ENTRYPOINT_KEY, ENTRYPOINT)],
    );
    let nginx = run_pod(&world, "pod", &volume, listen, &conf);
    world.running.push(("pod".into(), nginx));

    let objects: Vec<String> = (0..50).map(|i| format!("/vod/{i}.ts")).collect();
    for o in &objects {
        world.put(o, o.as_bytes());
        let r = request(listen, "GET", o, &[HOST], b"").unwrap();
        assert_eq!(
            (r.status, r.header(CACHE_STATUS_HEADER)),
            (200, Some("MISS"))
        );
    }
    // A new lifetime and a new size (a keys zone of another size): reloaded, every object
    // still a HIT.
    cache.spec.cache = Some(Box::new(CacheSpec {
        size: Some("100g".into()),
        valid: Some("20m".into()),
        ..CacheSpec::default()
    }));
    let new = nginx_config(&cache, &world.clusters, &paths);
    assert_ne!(new, conf);
    volume.update(&[(CONFIG_KEY, &new), (ENTRYPOINT_KEY, ENTRYPOINT)]);
    let log = || std::fs::read_to_string(world.path().join("pod.log")).unwrap();
    // The entrypoint looks every 2 s; nginx says "reconfiguring" on SIGHUP, starts new workers,
    // then tells the old ones to finish: from then on only the new configuration answers.
    let reloaded = |log: &String| {
        [
            "reloading nginx",
            "reconfiguring",
            "gracefully shutting down",
        ]
        .iter()
        .all(|line| log.contains(line))
    };
    let seen = settle(
        Duration::from_secs(10),
        Duration::from_millis(100),
        log,
        reloaded,
    );
    assert!(reloaded(&seen), "not reloaded:\n{seen}");
    let not_hits: Vec<String> = objects
        .iter()
        .filter_map(|o| {
            let r = request(listen, "GET", o, &[HOST], b"").unwrap();
            assert_eq!(r.body, **o);
            let status = r.header(CACHE_STATUS_HEADER).unwrap_or("none");
            (status != "HIT").then(|| format!("{o}: {status}"))
        })
        .collect();
    assert!(
        not_hits.is_empty(),
        "not hits after the reload: {not_hits:?}\n{}",
        log()
    );
    assert!(!log().contains("[emerg]"), "{}", log());
    assert_eq!(world.served().len(), objects.len(), "nothing fetched again");

    // The pod's stop signal stops nginx gracefully through the entrypoint (said after what the
    // reload said).
    let reloaded = log().len();
    let (_, pod) = world.running.pop().unwrap();
    let log = pod.stop();
    let stopping = &log[reloaded..];
    assert!(
        stopping.contains("gracefully shutting down") || stopping.contains("exiting"),
        "{log}"
    );
}

#[test]
fn sources_are_looked_up_while_nginx_runs() {
    // edge → cache-a + cache-b → origin, every Service name in the DNS server.
    let mut world = World::start(10, topology(|_| {}));
    let objects: Vec<String> = (0..40).map(|i| format!("/vod/{i}.ts")).collect();
    for o in &objects {
        world.put(o, o.as_bytes());
    }
    let via = |world: &World| -> Vec<String> {
        objects
            .iter()
            .map(|o| {
                let r = world.get(o, &[]);
                assert_eq!((r.status, r.body.as_str()), (200, o.as_str()));
                r.header(UPSTREAM_HEADER).unwrap_or_default().to_string()
            })
            .collect()
    };
    let first = via(&world);
    let old_b = address(world.net, "cache-b");
    assert!(first.contains(&old_b), "{first:?}");

    // cache-b is deleted and created again: its Service gets another address, where its new pod
    // answers. The edge follows the name within its lookups' lifetime, with no new
    // configuration and no request failed (the old address fails over to cache-a meanwhile).
    let new_b = address(world.net, "cache-b-again");
    world.run_instance("cache-b", "cache-b-again", &new_b);
    let stopped = world
        .running
        .iter()
        .position(|(n, _)| n == "cache-b")
        .unwrap();
    drop(world.running.remove(stopped));
    world.names.dns.set(
        &service_name("cache-b"),
        &[ip(world.net, "cache-b-again").parse().unwrap()],
    );
    // Its share goes back to the same member, at its new address (each of the edge's workers
    // follows the name within the lookup's lifetime: a busy machine sees some before others).
    let expected: Vec<String> = first
        .iter()
        .map(|a| {
            if *a == old_b {
                new_b.clone()
            } else {
                a.clone()
            }
        })
        .collect();
    let now = settle(
        Duration::from_secs(15),
        Duration::from_millis(500),
        || via(&world),
        |now| *now == expected,
    );
    assert_eq!(now, expected);
    let edge = &world.running.iter().find(|(n, _)| n == "edge").unwrap().1;
    assert!(!edge.log().contains("reconfiguring"), "{}", edge.log());

    // A cache whose origin's Service does not exist yet starts anyway (nginx refused to start
    // with a name it could not resolve), answers 502 meanwhile, and fetches once it exists.
    world.names.dns.remove(&service_name("origin"));
    let late = address(world.net, "cache-a-late");
    world.start_instance("cache-a", "cache-a-late", &late);
    let ask = || request(&late, "GET", "/vod/late.ts", &[HOST], b"").unwrap();
    world.put("/vod/late.ts", b"late");
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(ask().status, 502);
    world.names.dns.set(
        &service_name("origin"),
        &[ip(world.net, "origin").parse().unwrap()],
    );
    let status = settle(
        Duration::from_secs(15),
        Duration::from_millis(500),
        || ask().status,
        |status| *status == 200,
    );
    assert_eq!(status, 200, "the origin is never looked up again");
    assert_eq!(ask().body, "late");
}

#[test]
fn the_pods_of_a_cache_cluster_form_one_ring() {
    // edge → cache-a, whose three pods are named by its headless Service; → origin.
    let mut world = World::start(
        11,
        topology(|c| {
            if c.metadata.name.as_deref() == Some("edge") {
                c.spec.sources.truncate(1);
            }
        }),
    );
    let pods = ["cache-a-0", "cache-a-1", "cache-a-2"];
    for pod in pods {
        world.run_instance("cache-a", pod, &address(world.net, pod));
    }
    let stopped = world
        .running
        .iter()
        .position(|(n, _)| n == "cache-a")
        .unwrap();
    drop(world.running.remove(stopped));
    // Its headless Service names the ready pods, as the cluster DNS does.
    let publish = |world: &World, ready: &[&str]| {
        let ips: Vec<String> = ready.iter().map(|pod| ip(world.net, pod)).collect();
        let ips: Vec<&str> = ips.iter().map(String::as_str).collect();
        world.names.members(&service_name("cache-a"), &ips);
    };
    // Which pods the edge sends 60 probes (paths no object has) to.
    let probed = |world: &World| -> BTreeSet<String> {
        (0..60)
            .map(|i| {
                let r = world.get(&format!("/not-here/probe-{i}"), &[]);
                r.header(UPSTREAM_HEADER).unwrap_or_default().to_string()
            })
            .collect()
    };
    let addresses = |ready: &[&str]| -> BTreeSet<String> {
        ready.iter().map(|pod| address(world.net, pod)).collect()
    };
    publish(&world, &pods);
    let seen = settle(
        Duration::from_secs(15),
        Duration::from_millis(300),
        || probed(&world),
        |seen| *seen == addresses(&pods),
    );
    assert_eq!(
        seen,
        addresses(&pods),
        "the edge never found the three pods"
    );

    let objects: Vec<String> = (0..90).map(|i| format!("/vod/ring/{i}.ts")).collect();
    for o in &objects {
        world.put(o, o.as_bytes());
    }
    // The pod that answered each object, asked in order or in reverse (nginx taking turns
    // between pods would give another pod for some).
    let via = |world: &World, status: &str, reverse: bool| -> Vec<String> {
        let order: Vec<&String> = if reverse {
            objects.iter().rev().collect()
        } else {
            objects.iter().collect()
        };
        let mut pods: Vec<String> = order
            .into_iter()
            .map(|o| {
                let r = world.get(o, &[]);
                assert_eq!((r.status, r.body.as_str()), (200, o.as_str()));
                assert_eq!(r.header(CACHE_STATUS_HEADER), Some(status), "{o}");
                r.header(UPSTREAM_HEADER).unwrap().to_string()
            })
            .collect();
        if reverse {
            pods.reverse();
        }
        pods
    };
    let fetched = |world: &World| {
        world
            .served()
            .into_iter()
            .filter(|s| s.uri.starts_with("/vod/ring/"))
            .count()
    };

    // Each object is fetched once for the cluster, by one pod, and the pods share the objects.
    let first = via(&world, "MISS", false);
    assert_eq!(fetched(&world), 90);
    let share =
        |of: &[String], pod: &str| of.iter().filter(|a| **a == address(world.net, pod)).count();
    for pod in pods {
        assert!(
            share(&first, pod) >= 10,
            "{pod} holds {} of 90 objects: {first:?}",
            share(&first, pod)
        );
    }
    // Asked again, each is a hit at the same pod: nothing more from the origin.
    assert_eq!(via(&world, "HIT", true), first);
    assert_eq!(fetched(&world), 90);

    // cache-a-2 is no longer ready: its Service names two pods. Only its own objects move, each
    // fetched once more; the others stay where they are cached.
    publish(&world, &pods[..2]);
    let seen = settle(
        Duration::from_secs(15),
        Duration::from_millis(300),
        || probed(&world),
        |seen| *seen == addresses(&pods[..2]),
    );
    assert_eq!(seen, addresses(&pods[..2]));
    let moved = share(&first, "cache-a-2");
    let mut statuses = std::collections::BTreeMap::<&str, usize>::new();
    let mut now = Vec::new();
    for (o, before) in objects.iter().zip(&first) {
        let r = world.get(o, &[]);
        assert_eq!((r.status, r.body.as_str()), (200, o.as_str()));
        let to = r.header(UPSTREAM_HEADER).unwrap().to_string();
        let status = r.header(CACHE_STATUS_HEADER).unwrap().to_string();
        if *before != address(world.net, "cache-a-2") {
            assert_eq!((&to, status.as_str()), (before, "HIT"), "{o} moved");
        }
        *statuses
            .entry(if status == "HIT" { "HIT" } else { "other" })
            .or_default() += 1;
        now.push(to);
    }
    assert_eq!(
        statuses.get("other").copied().unwrap_or(0),
        moved,
        "{statuses:?}"
    );
    assert_eq!(fetched(&world), 90 + moved);
    assert_eq!(share(&now, "cache-a-2"), 0);
}

/// A download read as it arrives: its status, its body, when the server closed the connection.
struct Download {
    status: u16,
    body: Vec<u8>,
    ended: Instant,
    /// How the connection ended, if not by the server closing it.
    error: Option<std::io::Error>,
}

/// GET `path` from `addr` in HTTP/1.0 (the body ends with the connection), read as it arrives;
/// `started` is told once the head and 64 KiB of the body are in.
fn download(addr: &str, path: &str, started: std::sync::mpsc::Sender<()>) -> Download {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {}\r\n\r\n", HOST.1).unwrap();
    let mut raw = Vec::new();
    let mut buf = [0; 16 * 1024];
    let mut error = None;
    loop {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            Err(e) => {
                error = Some(e);
                break;
            }
        }
        if raw.len() > 64 * 1024 {
            // Only the first is received; the others find the channel closed.
            let _ = started.send(());
        }
    }
    let ended = Instant::now();
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no HTTP head in {} bytes ({error:?})", raw.len()));
    let head = String::from_utf8_lossy(&raw[..end]);
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    Download {
        status,
        body: raw[end + 4..].to_vec(),
        ended,
        error,
    }
}

/// A pod of cache-a is told to stop with `signal` (what the kubelet sends a container: its
/// image's STOPSIGNAL, else SIGTERM; after the preStop sleep, left out here) while a client
/// downloads an object its origin sends over about 6 s. The download ends whole; the pod takes
/// no new connection meanwhile, and exits, with status 0, once it has sent the last byte.
fn a_pod_told_to_stop_during_a_download(net: u8, signal: Signal) {
    let name = match signal {
        SIGTERM => "SIGTERM",
        SIGQUIT => "SIGQUIT",
        _ => "a signal",
    };
    let world = World::start(net, topology(|_| {}));
    // 1.5 MiB and a bit: two slices for the cache to fetch, the second after the signal.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let object: Vec<u8> = (0..(3 << 19) + 12_345)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 32) as u8
        })
        .collect();
    world.put("/slow/movie.mp4", &object);
    let listen = format!("127.0.{net}.40:80");
    let mut pod = cluster_pod(&world, "cache-a", &listen);
    let log = || std::fs::read_to_string(world.path().join("pod.log")).unwrap();

    let (got, signalled, refused, exit, exited) = std::thread::scope(|s| {
        let (started, start) = std::sync::mpsc::channel();
        let client = s.spawn(|| download(&listen, "/slow/movie.mp4", started));
        start
            .recv_timeout(Duration::from_secs(10))
            .expect("the download did not start");
        let signalled = Instant::now();
        pod.signal(signal);
        // A new connection is refused once nginx closed its listening socket.
        let connect = || TcpStream::connect(&listen).map(drop).map_err(|e| e.kind());
        let refusal = Err(std::io::ErrorKind::ConnectionRefused);
        let seen = settle(
            Duration::from_secs(2),
            Duration::from_millis(10),
            connect,
            |seen| *seen == refusal,
        );
        assert_eq!(seen, refusal, "a new connection after {name}\n{}", log());
        let refused = Instant::now();
        let exit = pod.wait_exit(Duration::from_secs(20));
        let exited = Instant::now();
        (client.join().unwrap(), signalled, refused, exit, exited)
    });
    let log = log();
    let since = |t: Instant| t.duration_since(signalled);
    let timeline = format!(
        "after {name}: refused {:?}, download ended {:?}, pod exited {:?} ({exit:?})\n{log}",
        since(refused),
        since(got.ended),
        since(exited),
    );

    // The download ends whole, by the pod closing the connection after its last byte.
    assert!(got.error.is_none(), "{:?}: {timeline}", got.error);
    assert_eq!(got.status, 200, "{timeline}");
    assert_eq!(got.body.len(), object.len(), "{timeline}");
    assert!(got.body == object, "another body: {timeline}");
    // It was in flight: nginx had yet to fetch and send most of it.
    assert!(
        since(got.ended) > Duration::from_secs(2),
        "the download ended too soon for the test: {timeline}"
    );
    // No new connection while it went on.
    assert!(refused < got.ended, "{timeline}");
    // The pod ended after it, not before (the client reads on at once: a scheduling delay at
    // most), and promptly.
    assert_eq!(exit.and_then(|e| e.code()), Some(0), "{timeline}");
    assert!(
        exited + Duration::from_millis(200) > got.ended,
        "{timeline}"
    );
    assert!(
        exited < got.ended + Duration::from_secs(2),
        "the pod lingered: {timeline}"
    );
    // nginx was told to quit gracefully (SIGQUIT, from the entrypoint), not to stop at once
    // (SIGTERM, SIGINT), and says so.
    assert!(log.contains("signal 3 (SIGQUIT) received"), "{timeline}");
    assert!(log.contains("gracefully shutting down"), "{timeline}");
    assert!(
        !log.contains("signal 15 (SIGTERM) received") && !log.contains("signal 2 (SIGINT)"),
        "{timeline}"
    );
    // And logged the download as served whole (the access log, on standard output).
    let access = std::fs::read_to_string(world.path().join("pod.out")).unwrap();
    let line = format!("\"GET /slow/movie.mp4 HTTP/1.0\" 200 {} ", object.len());
    assert!(access.contains(&line), "{access}\n{timeline}");
}

#[test]
fn a_download_in_flight_when_the_pod_is_told_to_stop_completes() {
    a_pod_told_to_stop_during_a_download(15, SIGTERM);
}

#[test]
fn a_download_in_flight_when_the_pod_is_told_to_stop_by_sigquit_completes() {
    a_pod_told_to_stop_during_a_download(16, SIGQUIT);
}

/// A pod of the balancer told to stop (its entrypoint gets SIGQUIT after the preStop sleep) while
/// 32 clients keep their connections busy as wrk does, or a player fetching segments back to
/// back, none retrying a request: no request is cut. Each busy connection gets its next answer,
/// with `Connection: close`, and the client connects again elsewhere (in a cluster the Service
/// sends it to another pod by then: the preStop sleep waited for that).
/// Without `keepalive_min_timeout` nginx closes, at once, every connection that is between two
/// requests at that moment, and the client's next request is cut.
#[test]
fn busy_keep_alive_connections_are_answered_then_closed_not_cut_when_the_pod_stops() {
    use cdn_operator_testkit::KeepAlive;
    use std::sync::atomic::{AtomicBool, Ordering};
    let world = World::start(25, topology(|_| {}));
    world.put("/kept/small.ts", &[7u8; 1024]);
    let listen = "127.0.25.40:80".to_string();
    let mut pod = cluster_pod(&world, "edge", &listen);
    let addr: std::net::SocketAddr = listen.parse().unwrap();
    let first = KeepAlive::new(addr, HOST.1)
        .get("/kept/small.ts", &[])
        .unwrap();
    assert_eq!(first.status, 200, "{first:?}");

    #[derive(Default, Debug)]
    struct Client {
        answered: usize,
        told_to_close: usize,
        cut: Vec<String>,
    }
    let loaded = AtomicBool::new(false);
    let (clients, exit, signalled) = std::thread::scope(|s| {
        let clients: Vec<_> = (0..32)
            .map(|_| {
                s.spawn(|| {
                    let mut c = KeepAlive::without_retry(addr, HOST.1);
                    let mut seen = Client::default();
                    loop {
                        let kept = c.connected();
                        match c.get("/kept/small.ts", &[]) {
                            Ok(r) => {
                                assert_eq!(r.status, 200, "{r:?}");
                                seen.answered += 1;
                                // The client goes to another pod, as the Service sends it there
                                // by now.
                                if r.header("Connection") == Some("close") {
                                    seen.told_to_close += 1;
                                    break seen;
                                }
                            }
                            // The pod no longer listens: nothing was sent.
                            Err(e)
                                if !kept && e.kind() == std::io::ErrorKind::ConnectionRefused =>
                            {
                                break seen
                            }
                            Err(e) => {
                                seen.cut.push(format!("{e} (on a kept connection: {kept})"));
                                break seen;
                            }
                        }
                        if seen.answered == 200 {
                            loaded.store(true, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        while !loaded.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(10));
        }
        std::thread::sleep(Duration::from_millis(300));
        let signalled = Instant::now();
        pod.signal(SIGQUIT);
        let clients: Vec<Client> = clients.into_iter().map(|c| c.join().unwrap()).collect();
        (clients, pod.wait_exit(Duration::from_secs(20)), signalled)
    });
    let log = std::fs::read_to_string(world.path().join("pod.log")).unwrap();
    let cut: Vec<&String> = clients.iter().flat_map(|c| &c.cut).collect();
    let answered: usize = clients.iter().map(|c| c.answered).sum();
    let told: usize = clients.iter().map(|c| c.told_to_close).sum();
    let summary = format!(
        "{answered} answered, {told} with Connection: close, {} cut: {cut:?}; exited {:?} after SIGQUIT ({exit:?})\n{log}",
        cut.len(),
        signalled.elapsed(),
    );
    println!("{}", summary.lines().next().unwrap_or_default());
    assert!(cut.is_empty(), "{summary}");
    // Every client was told, on an answer, that its connection ends.
    assert!(
        clients.iter().all(|c| c.told_to_close >= 1),
        "{clients:?}\n{summary}"
    );
    assert_eq!(exit.and_then(|e| e.code()), Some(0), "{summary}");
    assert!(log.contains("gracefully shutting down"), "{summary}");
}

/// A pod is Ready (its sidecar's `/readyz`, the readiness probe the operator writes) only once
/// nginx holds every ready pod of its sources: each SRV answer nginx looks up unchanged for longer
/// than nginx keeps one (5 s) since nginx answered. A change before that starts the wait again;
/// once Ready, a change of the sources leaves it Ready; nginx stopped makes it unready, and
/// started again it waits again. A cache whose sources are origins (no SRV lookup) is Ready as
/// soon as nginx answers.
#[test]
fn a_pod_is_ready_once_nginx_holds_every_pod_of_its_sources() {
    let mut world = World::start_counted(26, topology(|_| {}));
    let is_ready = |world: &World, instance: &str, within: Duration| {
        settle(
            within,
            Duration::from_millis(100),
            || world.ready(instance),
            |status| *status == 200,
        ) == 200
    };
    assert!(is_ready(&world, "cache-a", Duration::from_secs(3)));
    // The edge's nginx answers since a moment: it may not hold the caches' pods yet.
    assert_eq!(world.ready("edge"), 503);
    std::thread::sleep(Duration::from_secs(2));
    // cache-a gains a pod: nginx may keep its old answer for 5 s more.
    let pods = [ip(26, "cache-a"), "127.0.26.41".to_string()];
    let pods: Vec<&str> = pods.iter().map(String::as_str).collect();
    world.names.members(&service_name("cache-a"), &pods);
    let changed = Instant::now();
    assert!(is_ready(&world, "edge", Duration::from_secs(15)));
    let waited = changed.elapsed();
    assert!(
        waited >= Duration::from_secs(5),
        "Ready {waited:?} after its source changed: nginx may not hold it yet"
    );
    // Ready: a source's change (a pod gone) leaves it Ready.
    world
        .names
        .members(&service_name("cache-a"), &[&ip(26, "cache-a")]);
    for _ in 0..20 {
        assert_eq!(
            world.ready("edge"),
            200,
            "unready for a change of its sources"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // nginx stopped: unready; started again: not before it can hold its sources again.
    world.stop("edge");
    assert!(
        settle(
            Duration::from_secs(5),
            Duration::from_millis(100),
            || world.ready("edge"),
            |status| *status == 503,
        ) == 503,
        "Ready while nginx is down"
    );
    world.start_again("edge", "edge");
    let restarted = Instant::now();
    assert_eq!(world.ready("edge"), 503);
    assert!(is_ready(&world, "edge", Duration::from_secs(15)));
    assert!(
        restarted.elapsed() >= Duration::from_secs(4),
        "{:?}",
        restarted.elapsed()
    );
    // Through it all, the edge serves.
    world.put("/ready/a.ts", b"ready");
    assert_eq!(world.get("/ready/a.ts", &[]).status, 200);
}

/// `c` serving HTTPS with the Secret `edge-tls`, plain HTTP redirected if `redirect`.
fn with_tls(c: &mut CdnCluster, redirect: bool) {
    c.spec.tls = Some(Box::new(TlsSpec {
        secret_name: "edge-tls".into(),
        redirect,
    }));
}

/// A cache trusting what its peers on loopback forward, as a cache trusts the balancers of its
/// cluster's private ranges.
fn trusting_loopback(c: &mut CdnCluster) {
    if c.spec.role == Role::Cache {
        c.spec.http = Some(Box::new(HttpSpec {
            trusted_proxies: Some(vec!["127.0.0.1".into()]),
            ..HttpSpec::default()
        }));
    }
}

/// Connects to `addr` over HTTP/2 and TLS (1.3 or 1.2) for the test's site, trusting `ca`.
fn connect_h2(addr: &str, ca: &Ca) -> H2 {
    H2::connect(addr, HOST.1, ca, rustls::DEFAULT_VERSIONS)
        .unwrap_or_else(|e| panic!("HTTP/2 over TLS to {addr}: {e}"))
}

/// GET `path` over `h2`, with `headers`.
fn h2_get(h2: &H2, path: &str, headers: &[(&str, &str)]) -> Response {
    h2.get(path, headers)
        .unwrap_or_else(|e| panic!("GET {path} over HTTP/2: {e}"))
}

#[test]
fn https_at_the_edge_serves_the_routes_and_the_cache_over_http2() {
    let ca = Ca::new("cdn-operator test CA");
    let certificate = ca.issue(HOST.1, "cdn.example", 1);
    let world = World::start_with_secret(
        12,
        topology(|c| {
            if c.spec.role == Role::Balancer {
                with_tls(c, false);
            }
            trusting_loopback(c);
        }),
        Some(&certificate),
        false,
    );
    let https = tls_address(world.net, "edge");

    // HTTP/2 agreed by ALPN, over TLS 1.3, with the Secret's certificate (the client checks
    // the chain and the name).
    let client = connect_h2(&https, &ca);
    assert_eq!(client.version, rustls::ProtocolVersion::TLSv1_3);
    assert!(
        client.certificate == certificate.der,
        "not the Secret's certificate"
    );
    world.put("/vod/seg.ts", b"segment");
    let r = h2_get(&client, "/vod/seg.ts", &[]);
    assert_eq!(
        (r.status, r.body.as_str(), r.header(CACHE_STATUS_HEADER)),
        (200, "segment", Some("MISS"))
    );
    let r = h2_get(&client, "/vod/seg.ts", &[]);
    assert_eq!(
        (r.status, r.body.as_str(), r.header(CACHE_STATUS_HEADER)),
        (200, "segment", Some("HIT")),
        "the second request is a cache HIT"
    );
    // One cache for both ports: the same object over plain HTTP, fetched once.
    let r = world.get("/vod/seg.ts", &[]);
    assert_eq!(
        (r.status, r.body.as_str(), r.header(CACHE_STATUS_HEADER)),
        (200, "segment", Some("HIT"))
    );
    assert_eq!(world.served_for("/vod/seg.ts").len(), 1);

    // TLS 1.2 with a suite of Mozilla's intermediate list (ECDHE, AEAD).
    let tls12 = H2::connect(&https, HOST.1, &ca, &[&rustls::version::TLS12]).unwrap();
    assert_eq!(tls12.version, rustls::ProtocolVersion::TLSv1_2);
    let suite = format!("{:?}", tls12.suite);
    assert!(
        suite.starts_with("TLS_ECDHE_ECDSA_WITH_")
            && (suite.contains("_GCM_") || suite.contains("CHACHA20")),
        "{suite}"
    );
    assert_eq!(
        h2_get(&tls12, "/vod/seg.ts", &[]).header(CACHE_STATUS_HEADER),
        Some("HIT")
    );
    // TLS 1.1 is refused; the same hello as TLS 1.2 is accepted, so the version is the reason.
    assert_eq!(
        client_hello(&https, HOST.1, 0x0303),
        Hello::Accepted(0x0303)
    );
    assert_eq!(
        client_hello(&https, HOST.1, 0x0302),
        Hello::Alert(PROTOCOL_VERSION_ALERT),
        "TLS 1.1"
    );

    // X-Forwarded-Proto says how the client came, whatever it claims; the caches (trusting the
    // edge) pass it to the origin.
    let forged = [
        ("X-Forwarded-Proto", "http"),
        ("X-Forwarded-For", "6.6.6.6"),
    ];
    let r = h2_get(&client, "/echo/over-tls", &forged);
    assert_eq!(r.body, "127.0.0.1, 127.0.0.1|https");
    let r = world.get("/echo/plain", &[("X-Forwarded-Proto", "https")]);
    assert_eq!(r.body, "127.0.0.1, 127.0.0.1|http");

    // Plain HTTP keeps serving, the probes with it.
    let r = world.ask("edge", "GET", "/healthz", &[]);
    assert_eq!((r.status, r.body.as_str()), (200, "ok\n"));
}

#[test]
fn a_redirect_sends_plain_http_to_https_but_for_the_probes() {
    let ca = Ca::new("cdn-operator test CA");
    let certificate = ca.issue(HOST.1, "cdn.example", 1);
    let world = World::start_with_secret(
        13,
        topology(|c| {
            if c.spec.role == Role::Balancer {
                with_tls(c, true);
            }
        }),
        Some(&certificate),
        false,
    );
    world.put("/vod/seg.ts", b"segment");
    for (method, path, host, location) in [
        (
            "GET",
            "/vod/seg.ts",
            HOST.1,
            "https://cdn.example/vod/seg.ts",
        ),
        (
            "GET",
            "/vod/seg.ts?token=a&b=1",
            HOST.1,
            "https://cdn.example/vod/seg.ts?token=a&b=1",
        ),
        // To HTTPS's port, whatever the plain one.
        (
            "HEAD",
            "/live/",
            "cdn.example:8080",
            "https://cdn.example/live/",
        ),
        ("POST", "/", "other.example", "https://other.example/"),
    ] {
        let r = world.ask("edge", method, path, &[("Host", host)]);
        assert_eq!(
            (r.status, r.header("Location")),
            (301, Some(location)),
            "{method} {path}"
        );
    }
    // The probes are answered on plain HTTP.
    let r = world.ask("edge", "GET", "/healthz", &[]);
    assert_eq!((r.status, r.body.as_str()), (200, "ok\n"));
    assert!(world.served().is_empty(), "a redirect fetches nothing");

    // HTTPS serves, once the edge has found its caches (the wait of `World::start` asked plain
    // HTTP, which redirects).
    let client = connect_h2(&tls_address(world.net, "edge"), &ca);
    let status = settle(
        Duration::from_secs(10),
        Duration::from_millis(20),
        || h2_get(&client, "/not-here/resolved", &[]).status,
        |status| *status != 502,
    );
    assert_eq!(status, 404);
    let statuses: Vec<_> = (0..2)
        .map(|_| {
            let r = h2_get(&client, "/vod/seg.ts", &[]);
            assert_eq!(r.body, "segment");
            r.header(CACHE_STATUS_HEADER).map(String::from)
        })
        .collect();
    assert_eq!(statuses, [Some("MISS".into()), Some("HIT".into())]);
}

/// The pid of the nginx master among `processes` ([`Nginx::processes`]), and its workers'.
fn nginx_pids(processes: &[(u32, String)]) -> (u32, BTreeSet<u32>) {
    let with = |title: &str| -> Vec<u32> {
        processes
            .iter()
            .filter(|(_, c)| c.starts_with(title))
            .map(|(p, _)| *p)
            .collect()
    };
    let masters = with("nginx: master process");
    assert_eq!(masters.len(), 1, "{processes:?}");
    (
        masters[0],
        with("nginx: worker process").into_iter().collect(),
    )
}

#[test]
fn a_renewed_certificate_is_served_within_seconds_without_a_restart_keeping_the_cache() {
    // cache-a with HTTPS runs as its pod does: the Deployment's command and volumes (the
    // ConfigMap and the Secret read-only, as the kubelet writes them; emptyDirs), as an
    // arbitrary uid; its listen addresses only moved.
    let world = World::start(14, topology(|_| {}));
    let mut cache = world.cluster("cache-a").clone();
    with_tls(&mut cache, false);
    let upstreams = cdn_operator::cdncluster::sources::resolve(
        &cache,
        |name| {
            world
                .clusters
                .iter()
                .find(|c| c.metadata.name.as_deref() == Some(name))
                .map(|c| std::sync::Arc::new(c.clone()))
        },
        cdn_operator::cdncluster::sources::DEFAULT_CLUSTER_DOMAIN,
    )
    .unwrap();
    let children = build::children(&cache, &upstreams, &Default::default(), &Default::default());
    let (plain, https) = ("127.0.14.31:8080", "127.0.14.31:8443");
    let paths = Paths {
        listen: plain.into(),
        tls_listen: https.into(),
        ..Paths::default()
    };
    let conf = nginx_config(&cache, &world.clusters, &paths);
    let data = children.config_map.data.as_ref().unwrap();
    assert_eq!(
        conf.replace("127.0.14.31:", ""),
        data[CONFIG_KEY],
        "the shipped configuration, its addresses only moved"
    );
    let entrypoint = &data[ENTRYPOINT_KEY];
    let _config = ConfigVolume::new(
        world.path().join("cm"),
        &[(CONFIG_KEY, &conf), (ENTRYPOINT_KEY, entrypoint)],
    );
    let ca = Ca::new("cdn-operator test CA");
    let first = ca.issue(HOST.1, "cdn.example (first)", 1);
    let mut secret = SecretVolume::new(world.path().join("secret"), &first.secret_data());

    let pod = children
        .workload
        .deployment()
        .unwrap()
        .spec
        .as_ref()
        .unwrap();
    let pod = pod.template.spec.as_ref().unwrap();
    let container = &pod.containers[0];
    let mut sandbox = Sandbox::read_only_root()
        .hosts(&world.names.hosts)
        .resolv_conf(world.names.resolv_conf(world.path()));
    for mount in container.volume_mounts.as_deref().unwrap() {
        let volume = pod
            .volumes
            .as_deref()
            .unwrap()
            .iter()
            .find(|v| v.name == mount.name)
            .unwrap();
        sandbox = if volume.empty_dir.is_some() {
            sandbox.empty_dir(&mount.mount_path)
        } else {
            assert_eq!(mount.read_only, Some(true), "{}", mount.name);
            if volume.config_map.is_some() {
                sandbox.read_only(world.path().join("cm"), &mount.mount_path)
            } else if volume.secret.is_some() {
                sandbox.read_only(&secret.dir, &mount.mount_path)
            } else {
                panic!("an unexpected volume: {volume:?}")
            }
        };
    }
    let sandbox = sandbox.user(1000680000, 0);
    let log = world.path().join("pod.log");
    let nginx = Nginx::spawn(
        "pod",
        sandbox.command(container.command.as_deref().unwrap()),
        &log,
    );
    nginx.wait_listening(plain, &conf);
    nginx.wait_listening(https, &conf);
    wait_resolved(plain, HOST.1);
    let log = || std::fs::read_to_string(&log).unwrap();

    // Objects cached over HTTPS, a large one among them.
    let objects: Vec<String> = (0..20).map(|i| format!("/vod/{i}.ts")).collect();
    let big: String = (0..4u32 << 20)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    world.put("/vod/big.mp4", big.as_bytes());
    let client = connect_h2(https, &ca);
    assert!(client.certificate == first.der, "not the first certificate");
    for o in &objects {
        world.put(o, o.as_bytes());
        let r = h2_get(&client, o, &[]);
        assert_eq!(
            (r.status, r.body.as_str(), r.header(CACHE_STATUS_HEADER)),
            (200, o.as_str(), Some("MISS"))
        );
    }
    assert_eq!(h2_get(&client, "/vod/big.mp4", &[]).body.len(), big.len());
    let fetched = world.served().len();
    let (master, workers) = nginx_pids(&nginx.processes());
    assert!(!log().contains("reloading"), "{}", log());

    // A download under way when the certificate is renewed.
    let mut download = client.start("/vod/big.mp4", &[]).unwrap();
    assert!(!client.read(&mut download, 64 << 10).unwrap());

    // The renewal, as the kubelet writes it: a new directory, then `..data` swapped.
    let renewed = ca.issue(HOST.1, "cdn.example (renewed)", 2);
    secret.update(&renewed.secret_data());
    let started = Instant::now();
    let presented = settle(
        Duration::from_secs(15),
        Duration::from_millis(100),
        || {
            H2::connect(https, HOST.1, &ca, rustls::DEFAULT_VERSIONS)
                .map(|c| c.certificate)
                .unwrap_or_default()
        },
        |presented| *presented == renewed.der,
    );
    let took = started.elapsed();
    assert!(
        presented == renewed.der,
        "the renewed certificate (serial 2) is not served after {took:?}:\n{}",
        log()
    );
    eprintln!("the renewed certificate served after {took:?}");
    assert!(took < Duration::from_secs(10), "{took:?}");
    let (master_now, workers_now) = nginx_pids(&nginx.processes());
    assert_eq!(master_now, master, "nginx's master was restarted");
    assert!(
        !workers_now.is_subset(&workers),
        "reloaded: new workers ({workers:?}, now {workers_now:?})"
    );
    assert!(
        !workers_now.is_disjoint(&workers),
        "an old worker is still sending the download ({workers:?}, now {workers_now:?})"
    );
    let said = log();
    assert!(
        said.contains("the TLS certificate changed: reloading nginx")
            && said.contains("reconfiguring"),
        "{said}"
    );

    // The download ends whole, on the connection opened before the renewal.
    assert!(client.read(&mut download, usize::MAX).unwrap());
    let r = client.finish(download);
    assert_eq!((r.status, r.body.len()), (200, big.len()));
    assert!(r.body == big);
    // Then the old workers, done, are gone.
    let remaining = settle(
        Duration::from_secs(10),
        Duration::from_millis(100),
        || nginx_pids(&nginx.processes()).1,
        |now| now.is_disjoint(&workers),
    );
    assert!(remaining.is_disjoint(&workers), "{remaining:?}");
    // The cache is kept: every object a HIT, on a new connection with the new certificate.
    let client = connect_h2(https, &ca);
    assert!(client.certificate == renewed.der);
    for o in &objects {
        let r = h2_get(&client, o, &[]);
        assert_eq!(
            (r.status, r.body.as_str(), r.header(CACHE_STATUS_HEADER)),
            (200, o.as_str(), Some("HIT"))
        );
    }
    assert_eq!(world.served().len(), fetched, "nothing fetched again");
    let said = log();
    assert!(
        !said.contains("[emerg]") && !said.contains("[alert]"),
        "{said}"
    );
    drop(nginx);
}

/// The metrics sidecar of an instance (`cdn-operator nginx-metrics`), as the pod runs it: nginx's
/// log and status socket in the instance's temp folder, its cache folder measured; stopped when
/// dropped.
struct Sidecar {
    child: std::process::Child,
    listen: String,
    /// The CdnCluster of its pod.
    cluster: String,
}

impl Sidecar {
    /// Starts the sidecar of `instance` of `cluster`, whose folders are `own` (its configuration
    /// beside them, `instance.conf`), serving on `listen`; returns once it serves.
    fn start(
        cluster: &CdnCluster,
        instance: &str,
        own: &Path,
        listen: &str,
        purge_keys: &Path,
    ) -> Sidecar {
        use cdn_operator::cdncluster::nginx::{METRICS_LOG, STATUS_SOCKET};
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_cdn-operator"));
        command
            .arg("nginx-metrics")
            .arg("--log")
            .arg(own.join(METRICS_LOG))
            .arg("--nginx-status")
            .arg(own.join(STATUS_SOCKET))
            .args(["--listen", listen])
            .args(["--cdncluster", cluster.metadata.name.as_deref().unwrap()])
            .args(["--role", cluster.spec.role.as_str()])
            // The pod's readiness, as the operator writes the sidecar's arguments: the
            // configuration nginx runs and the resolver it was given.
            .arg("--nginx-conf")
            .arg(own.parent().unwrap().join(format!("{instance}.conf")))
            .arg("--resolver")
            .arg(own.join(cdn_operator::cdncluster::nginx::RESOLVER_FILE));
        if cluster.spec.role == Role::Cache {
            command
                .arg("--cache-dir")
                .arg(own)
                .args(["--cache-max-size", "1073741824"])
                .arg("--purge-keys")
                .arg(purge_keys)
                .args(["--namespace", "default"]);
        }
        let child = command
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .expect("the sidecar starts");
        let sidecar = Sidecar {
            child,
            listen: listen.into(),
            cluster: cluster.metadata.name.clone().unwrap_or_default(),
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
        let reply = request(&self.listen, "GET", "/metrics", &[], b"").unwrap();
        assert_eq!(reply.status, 200, "{}", reply.body);
        reply.body
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The sum of the series `name` of an exposition whose labels include `labels` (written in the
/// order served); 0 when there is none.
fn count(text: &str, name: &str, labels: &str) -> f64 {
    cdn_operator_testkit::metric_sum(text, name, labels).unwrap_or(0.0)
}

#[test]
fn every_pod_counts_its_requests_hits_misses_slices_and_errors() {
    let mut world = World::start_counted(17, topology(|_| {}));
    // What each pod counted of its start (the lookups' probes): the figures below are what the
    // mix adds to it.
    let instances = ["edge", "cache-a", "cache-b"];
    let lines = |world: &World, instance: &str| {
        count(
            &world.metrics(instance),
            "cdn_log_lines_total",
            r#"result="counted""#,
        )
    };
    // Every line is in before the figures are read: nginx writes its buffer of lines at least
    // every second, and the sidecar reads every 200 ms, so counts unchanged over 1.3 s are whole.
    let settled = |world: &World| {
        let last = std::cell::Cell::new(None);
        settle(
            Duration::from_secs(15),
            Duration::from_millis(1300),
            || instances.map(|instance| lines(world, instance)),
            |now| last.replace(Some(*now)) == Some(*now),
        );
        instances.map(|instance| world.metrics(instance))
    };
    let [edge_before, cache_a_before, cache_b_before] = settled(&world);
    world.put("/obj/a", &[b'a'; 1024]);
    // Four slices of 1 MiB: three fetched by subrequests.
    world.put("/big.ts", &vec![b'v'; 3_500_000]);
    let expect = |world: &World, path: &str, status: u16, cache: &str| {
        let r = world.get(path, &[]);
        assert_eq!(r.status, status, "{path}: {}", r.body);
        assert_eq!(r.header(CACHE_STATUS_HEADER), Some(cache), "{path}");
        r
    };
    expect(&world, "/obj/a", 200, "MISS");
    expect(&world, "/obj/a", 200, "HIT");
    let big = expect(&world, "/big.ts", 200, "MISS");
    assert_eq!(big.body.len(), 3_500_000);
    expect(&world, "/err/x", 503, "MISS");
    expect(&world, "/missing", 404, "MISS");

    // One cache stops: the balancer's attempts at it are refused, and the other cache answers.
    world.stop("cache-a");
    let (mut fetched, mut refused) = (0u32, 0u32);
    while refused == 0 || fetched < 4 {
        assert!(fetched < 40, "no object of the ring's is cache-a's");
        world.put(&format!("/obj/f{fetched}"), b"f");
        let r = expect(&world, &format!("/obj/f{fetched}"), 200, "MISS");
        // The members tried, those refused first: `A, B`.
        refused += r.header(UPSTREAM_HEADER).unwrap().matches(',').count() as u32;
        fetched += 1;
    }

    let [edge, cache_a, cache_b] = settled(&world);
    let at_caches = |name: &str, labels: &str| -> f64 {
        count(&cache_a, name, labels) - count(&cache_a_before, name, labels)
            + count(&cache_b, name, labels)
            - count(&cache_b_before, name, labels)
    };
    let origin = r#"source="origin",source_kind="origin""#;
    let requests = |class: &str, cache: &str| {
        at_caches(
            "cdn_requests_total",
            &format!(r#"{origin},status_class="{class}",cache_status="{cache}""#),
        )
    };
    let fetched = f64::from(fetched);
    assert_eq!(requests("2xx", "MISS"), 2.0 + fetched);
    assert_eq!(requests("2xx", "HIT"), 1.0);
    assert_eq!(requests("5xx", "MISS"), 1.0);
    assert_eq!(requests("4xx", "MISS"), 1.0);
    // Every attempt at the origin: each slice of the large object is one.
    assert_eq!(
        at_caches("cdn_upstream_response_seconds_count", origin),
        1.0 + 4.0 + 1.0 + 1.0 + fetched
    );
    assert_eq!(
        at_caches(
            "cdn_upstream_errors_total",
            &format!(r#"{origin},kind="http_5xx""#)
        ),
        1.0
    );
    // The bytes the caches received from the origin: its bodies, and a header each.
    let bodies: f64 = world.served().iter().map(|s| s.bytes as f64).sum();
    let received = at_caches("cdn_upstream_received_bytes_total", origin);
    let answers = 1.0 + 4.0 + 1.0 + 1.0 + fetched;
    assert!(
        received >= bodies && received <= bodies + answers * 1024.0,
        "received {received}, the origin's bodies {bodies}"
    );

    let tier = r#"source="cache-a+cache-b",source_kind="cdncluster""#;
    let at_edge =
        |name: &str, labels: &str| count(&edge, name, labels) - count(&edge_before, name, labels);
    let edge_requests = |class: &str| {
        at_edge(
            "cdn_requests_total",
            &format!(r#"{tier},status_class="{class}",cache_status="NONE""#),
        )
    };
    assert_eq!(edge_requests("2xx"), 3.0 + fetched);
    assert_eq!(edge_requests("5xx"), 1.0);
    assert_eq!(edge_requests("4xx"), 1.0);
    assert_eq!(
        at_edge(
            "cdn_upstream_errors_total",
            &format!(r#"{tier},kind="error""#)
        ),
        f64::from(refused)
    );
    // The 503 a cache relayed is an answer, not the cache failing.
    assert_eq!(
        at_edge(
            "cdn_upstream_errors_total",
            &format!(r#"{tier},kind="http_5xx""#)
        ),
        1.0
    );
    assert_eq!(
        at_edge("cdn_upstream_response_seconds_count", tier),
        5.0 + fetched + f64::from(refused)
    );
    assert!(at_edge("cdn_sent_bytes_total", tier) > 3_500_000.0 + 1024.0);

    for (instance, up) in [("edge", 1.0), ("cache-b", 1.0), ("cache-a", 0.0)] {
        let text = world.metrics(instance);
        assert_eq!(count(&text, "cdn_nginx_up", ""), up, "{instance}: {text}");
        assert_eq!(
            count(&text, "cdn_log_lines_total", r#"result="unreadable""#),
            0.0,
            "{instance}"
        );
        let (ok, said) = cdn_operator_testkit::promtool_check_metrics(&text);
        assert!(ok, "promtool check metrics on {instance}'s: {said}\n{text}");
    }
    // The status page's own connection is one.
    assert!(count(&cache_b, "cdn_connections", r#"state="active""#) >= 1.0);
    assert_eq!(
        count(&cache_b, "cdn_cache_max_size_bytes", ""),
        1073741824.0
    );
    assert!(count(&cache_b, "cdn_cache_filesystem_size_bytes", "") > 0.0);
    assert!(count(&cache_b, "cdn_cache_filesystem_avail_bytes", "") > 0.0);

    // What the pods serve is what docs/cdn-metrics.txt lists, no more, no less.
    let served: BTreeSet<&str> = [&edge, &cache_a, &cache_b]
        .into_iter()
        .flat_map(|text| text.lines())
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split(['{', ' ']).next())
        .collect();
    let documented = std::fs::read_to_string("docs/cdn-metrics.txt").unwrap();
    let documented: BTreeSet<&str> = documented
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    assert_eq!(served, documented, "docs/cdn-metrics.txt");
}

/// nginx killed (the OOM killer, or the end of a stop's grace) leaves its status socket in the
/// pod's /tmp, which outlives the container: the restarted container's nginx must listen again.
#[test]
fn a_container_restarted_after_nginx_was_killed_serves_again() {
    let world = World::start(18, topology(|_| {}));
    let cache = world.cluster("cache-a");
    let listen = "127.0.18.31:80";
    let paths = Paths {
        listen: listen.into(),
        ..Paths::default()
    };
    let conf = support::nginx_config_counted(cache, &world.clusters, &paths, true);
    let volume = ConfigVolume::new(
        world.path().join("cm"),
        &[(CONFIG_KEY, &conf), (ENTRYPOINT_KEY, ENTRYPOINT)],
    );
    let tmp = world.path().join("pod-tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let pod = || {
        Sandbox::read_only_root()
            .hosts(&world.names.hosts)
            .resolv_conf(world.names.resolv_conf(world.path()))
            .read_only(&volume.dir, build::CONFIG_DIR)
            .volume(&tmp, "/tmp")
            .empty_dir("/var/cache/nginx")
    };
    let entrypoint = format!("{}/{ENTRYPOINT_KEY}", build::CONFIG_DIR);
    let start = |name: &str| {
        let nginx = Nginx::spawn(
            name,
            pod().command(&["/bin/sh", &entrypoint]),
            &world.path().join(format!("{name}.log")),
        );
        nginx.wait_listening(listen, &conf);
        nginx
    };
    let first = start("first");
    let socket = tmp.join(cdn_operator::cdncluster::nginx::STATUS_SOCKET);
    assert!(socket.exists(), "nginx serves its status on {socket:?}");
    first.signal_all(cdn_operator_testkit::SIGKILL);
    first.kill();
    assert!(socket.exists(), "a killed nginx leaves its socket");
    let second = start("second");
    let r = request(listen, "GET", "/healthz", &[HOST], b"").unwrap();
    assert_eq!(r.status, 200, "{}", second.log());
}

/// A number no other call of this process gets.
fn next_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// A purge (hard unless `f` says), with an id of its own.
fn purge(f: impl FnOnce(&mut wire::Purge)) -> wire::Purge {
    let mut p = wire::Purge {
        id: format!("default/p{}/uid/cache/last", next_id()),
        ..wire::Purge::default()
    };
    f(&mut p);
    p
}

/// Objects invalidated by each purge of a batch, summed over the pods that applied it.
fn invalidated(applied: &[Applied]) -> Vec<u64> {
    let n = applied
        .iter()
        .map(|a| a.invalidated.len())
        .max()
        .unwrap_or(0);
    (0..n)
        .map(|i| applied.iter().map(|a| a.invalidated[i]).sum())
        .collect()
}

#[test]
fn a_hard_purge_is_a_miss_on_every_cache_at_once_and_leaves_the_rest_cached() {
    let world = World::start_counted(20, topology(|_| {}));
    let paths: Vec<String> = (0..10)
        .flat_map(|i| {
            [
                format!("/tagged/t1/{i}.ts"),
                format!("/tagged/t2/{i}.ts"),
                format!("/vod/x/{i}.ts"),
                format!("/vod/y/{i}.ts"),
                format!("/plain/{i}.m4s"),
            ]
        })
        .collect();
    for path in &paths {
        world.put(path, format!("{path} v1").as_bytes());
        assert_eq!(
            world.get(path, &[]).header(CACHE_STATUS_HEADER),
            Some("MISS")
        );
        assert_eq!(
            world.get(path, &[]).header(CACHE_STATUS_HEADER),
            Some("HIT")
        );
        world.put(path, format!("{path} v2").as_bytes());
    }
    let before = world.served().len();
    let by_tag = purge(|p| p.surrogate_keys = vec!["t1".into()]);
    let applied = world.purge(&[
        by_tag.clone(),
        purge(|p| p.surrogate_keys = vec!["ct-t2".into()]),
        purge(|p| p.prefixes = vec!["/vod/x/".into()]),
        purge(|p| p.paths = vec!["/plain/3.m4s".into(), "/plain/%37.m4s".into()]),
        purge(|p| {
            p.regexes = vec![r"^/vod/y/[0-4]\.ts$".into()];
            p.host = Some("cdn.example".into());
        }),
        purge(|p| {
            p.all = true;
            p.host = Some("other.example".into());
        }),
    ]);
    // Each object is cached by one cache of the pool: the two together invalidated each once.
    assert_eq!(invalidated(&applied), [10, 10, 10, 2, 5, 0]);
    assert!(applied
        .iter()
        .all(|a| a.fills_unchecked == 0 && a.scanned > 0));
    // A purge names what was fetched up to the second it began (nginx dates what it caches by the
    // second): what is fetched in a later second is kept by a purge sent again (below).
    let next_second = 1_000 - jiff::Timestamp::now().subsec_millisecond() as u64;
    std::thread::sleep(Duration::from_millis(next_second + 10));
    let purged = |path: &str| {
        path.starts_with("/tagged/")
            || path.starts_with("/vod/x/")
            || path == "/plain/3.m4s"
            || path == "/plain/7.m4s"
            || (path.starts_with("/vod/y/") && path[7..8].parse::<u32>().unwrap() < 5)
    };
    for path in &paths {
        let r = world.get(path, &[]);
        if purged(path) {
            // Gone at once: fetched again, the new body.
            assert_eq!(r.header(CACHE_STATUS_HEADER), Some("MISS"), "{path}");
            assert_eq!(r.body, format!("{path} v2"), "{path}");
            assert_eq!(
                world.get(path, &[]).header(CACHE_STATUS_HEADER),
                Some("HIT")
            );
        } else {
            // Not named: still a hit, still the copy cached before.
            assert_eq!(r.header(CACHE_STATUS_HEADER), Some("HIT"), "{path}");
            assert_eq!(r.body, format!("{path} v1"), "{path}");
        }
    }
    let refetched = paths.iter().filter(|p| purged(p)).count();
    assert_eq!(
        world.served().len() - before,
        refetched,
        "one origin request per purged object"
    );
    // A purge sent again (the operator retries a pod that did not answer) keeps the cutoff of its
    // first time: what was fetched since stays cached. A new purge invalidates it again.
    let again = world.purge(&[by_tag]);
    assert_eq!(invalidated(&again), [0]);
    let new = world.purge(&[purge(|p| p.surrogate_keys = vec!["t1".into()])]);
    assert_eq!(invalidated(&new), [10]);
    // A container restarted on the same cache (its emptyDir kept) loads the files nginx cached:
    // what was purged stays a miss.
    let mut world = world;
    for cache in ["cache-a", "cache-b"] {
        world.restart(cache, cache);
    }
    for i in 0..10 {
        let r = world.get(&format!("/tagged/t1/{i}.ts"), &[]);
        assert_eq!(
            r.header(CACHE_STATUS_HEADER),
            Some("MISS"),
            "after a restart"
        );
        let kept = world.get(&format!("/tagged/t2/{i}.ts"), &[]);
        assert_eq!(
            kept.header(CACHE_STATUS_HEADER),
            Some("HIT"),
            "after a restart"
        );
    }
}

#[test]
fn a_soft_purge_revalidates_and_serves_the_old_copy_while_the_origin_fails() {
    let mut world = World::start_counted(21, topology(|_| {}));
    // A manifest is refreshed in the background: the request after a soft purge gets the copy
    // at once, as after its lifetime, and the origin a conditional request.
    world.put("/soft/a.m3u8", b"playlist v1");
    world.get("/soft/a.m3u8", &[]);
    let applied = world.purge(&[purge(|p| {
        p.mode = wire::Mode::Soft;
        p.paths = vec!["/soft/a.m3u8".into()];
    })]);
    assert_eq!(invalidated(&applied), [1]);
    let r = world.get("/soft/a.m3u8", &[]);
    assert_eq!(
        (r.header(CACHE_STATUS_HEADER), r.body.as_str()),
        (Some("STALE"), "playlist v1")
    );
    let revalidated = settle(
        Duration::from_secs(5),
        Duration::from_millis(100),
        || world.served_for("/soft/a.m3u8").last().map(|s| s.status),
        |status| *status == Some(304),
    );
    assert_eq!(revalidated, Some(304));
    let r = world.get("/soft/a.m3u8", &[]);
    assert_eq!(
        (r.header(CACHE_STATUS_HEADER), r.body.as_str()),
        (Some("HIT"), "playlist v1")
    );

    // Any other object is revalidated by the request that finds it soft-purged.
    world.put("/soft/a.txt", b"notes v1");
    assert_eq!(
        world.get("/soft/a.txt", &[]).header(CACHE_STATUS_HEADER),
        Some("MISS")
    );
    // The origin has not changed it: a conditional request, a 304, the copy kept.
    let applied = world.purge(&[purge(|p| {
        p.mode = wire::Mode::Soft;
        p.prefixes = vec!["/soft/a.t".into()];
    })]);
    assert_eq!(invalidated(&applied), [1]);
    let r = world.get("/soft/a.txt", &[]);
    assert_eq!(
        (r.header(CACHE_STATUS_HEADER), r.body.as_str()),
        (Some("REVALIDATED"), "notes v1")
    );
    assert_eq!(
        world.served_for("/soft/a.txt").last().map(|s| s.status),
        Some(304)
    );
    // The origin fails: the soft-purged copy is served, stale.
    world.purge(&[purge(|p| {
        p.mode = wire::Mode::Soft;
        p.paths = vec!["/soft/a.txt".into()];
    })]);
    world.origin.signal(SIGQUIT);
    world.origin.wait_exit(Duration::from_secs(10));
    let r = world.get("/soft/a.txt", &[]);
    assert_eq!(
        (r.status, r.header(CACHE_STATUS_HEADER), r.body.as_str()),
        (200, Some("STALE"), "notes v1")
    );
    // A hard purge: gone, even while the origin fails.
    world.purge(&[purge(|p| p.paths = vec!["/soft/a.txt".into()])]);
    let r = world.get("/soft/a.txt", &[]);
    assert!(
        r.status == 502 || r.status == 504,
        "{} {}",
        r.status,
        r.body
    );
    assert_ne!(r.body, "notes v1");
}

#[test]
fn a_fill_in_flight_when_a_purge_starts_is_purged_when_it_lands() {
    let world = World::start_counted(22, topology(|_| {}));
    // One slice of 700 KiB sent at 256 KiB/s: fetched for about 2 s.
    world.put("/slow/late.ts", &vec![b'o'; 700 << 10]);
    let client = {
        let addr = address(world.net, "edge");
        std::thread::spawn(move || request(&addr, "GET", "/slow/late.ts", &[HOST], b"").unwrap())
    };
    std::thread::sleep(Duration::from_millis(600));
    world.put("/slow/late.ts", &vec![b'n'; 700 << 10]);
    let applied = world.purge(&[purge(|p| p.paths = vec!["/slow/late.ts".into()])]);
    let first = client.join().unwrap();
    assert_eq!(
        first.body.as_bytes()[0],
        b'o',
        "the download under way completes"
    );
    let awaited: u64 = applied.iter().map(|a| a.fills_awaited).sum();
    assert_eq!(awaited, 1, "{applied:?}");
    assert_eq!(invalidated(&applied), [1], "the fill, once landed");
    let r = world.get("/slow/late.ts", &[]);
    assert_eq!(r.header(CACHE_STATUS_HEADER), Some("MISS"));
    assert_eq!(r.body.as_bytes()[0], b'n');
}

#[test]
fn a_sidecar_applies_only_what_the_operator_signed_for_its_cluster_in_time_and_once() {
    let world = World::start_counted(23, topology(|_| {}));
    world.put("/k/a.ts", b"a");
    world.get("/k/a.ts", &[]);
    let purges = [purge(|p| p.paths = vec!["/k/a.ts".into()])];
    let (body, signature) = world.batch("cache-a", &purges, &world.signer);
    let status = |r: Response| (r.status, r.body.trim().to_string());
    let (code, why) = status(world.send_batch("cache-a", &body, None));
    assert_eq!(code, 401, "{why}");
    let (other, _) = Signer::generate();
    let (_, forged) = world.batch("cache-a", &purges, &other);
    let (code, why) = status(world.send_batch("cache-a", &body, Some(&forged)));
    assert_eq!(
        (code, why.contains("not the operator's")),
        (403, true),
        "{why}"
    );
    let mut tampered = body.clone();
    let at = tampered.len() - 5;
    tampered[at] ^= 1;
    assert_eq!(
        world
            .send_batch("cache-a", &tampered, Some(&signature))
            .status,
        403
    );
    let (for_b, signed_for_b) = world.batch("cache-b", &purges, &world.signer);
    let (code, why) = status(world.send_batch("cache-a", &for_b, Some(&signed_for_b)));
    assert_eq!(code, 403, "{why}");
    assert!(
        why.contains("for default/cache-b, this pod is of default/cache-a"),
        "{why}"
    );
    let stale = Batch {
        id: "old".into(),
        issued: 1_000,
        expires: 1_300,
        cluster: "default/cache-a".into(),
        purges: purges.to_vec(),
    };
    let stale = serde_json::to_vec(&stale).unwrap();
    let signed = wire::signature_header(&world.signer.sign(&stale));
    assert_eq!(
        world.send_batch("cache-a", &stale, Some(&signed)).status,
        403
    );
    let bad = [purge(|p| p.regexes = vec!["(".into()])];
    let (bad, signed) = world.batch("cache-a", &bad, &world.signer);
    let (code, why) = status(world.send_batch("cache-a", &bad, Some(&signed)));
    assert_eq!(code, 400, "{why}");
    assert!(why.contains("is invalid"), "{why}");
    // Signed, for it, in time: applied once; the same batch again is refused.
    assert_eq!(
        world.send_batch("cache-a", &body, Some(&signature)).status,
        200
    );
    let (code, why) = status(world.send_batch("cache-a", &body, Some(&signature)));
    assert_eq!(code, 409, "{why}");
}
