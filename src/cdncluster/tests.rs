//! Pure tests of the build step: sources, children, nginx configuration and status.

use super::build::{self, Workload, CONFIG_KEY, ENTRYPOINT, ENTRYPOINT_KEY};
use super::nginx::{self, Paths, Upstream};
use super::sources::{self, Problem};
use super::status::{self, Observed};
use crate::api::{
    CacheRule, CacheSpec, CacheVolume, CdnCluster, CdnClusterSpec, CdnClusterStatus, HttpSpec,
    Origin, Role, ServiceOrigin, SignedUrls, Source, State, TlsSpec,
};
use crate::kubernetes::restricted::RunAs;
use k8s_openapi::api::apps::v1::{Deployment, DeploymentStatus};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::collections::BTreeMap;
use std::sync::Arc;

fn cluster(name: &str, role: Role, sources: Vec<Source>) -> CdnCluster {
    let mut c = CdnCluster::new(name, CdnClusterSpec::new(role, sources));
    c.metadata.namespace = Some("default".into());
    c.metadata.uid = Some(format!("uid-{name}"));
    c.metadata.generation = Some(1);
    c
}

fn world(clusters: &[CdnCluster]) -> impl Fn(&str) -> Option<Arc<CdnCluster>> + '_ {
    move |name| {
        clusters
            .iter()
            .find(|c| c.metadata.name.as_deref() == Some(name))
            .map(|c| Arc::new(c.clone()))
    }
}

fn seed() -> Vec<CdnCluster> {
    vec![
        cluster(
            "balancer",
            Role::Balancer,
            vec![
                Source::cluster("cache-live", Some("^/live/")),
                Source::cluster("cache-vod", Some("^/vod/")),
            ],
        ),
        cluster("cache-live", Role::Cache, vec![]),
        cluster("cache-vod", Role::Cache, vec![]),
    ]
}

fn now() -> Time {
    Time("2026-11-22T10:00:00Z".parse().unwrap())
}

#[test]
fn the_spec_fields_rarely_set_are_not_carried_inline() {
    // Every CdnCluster is cached: `resources`, `cache`, `http`, `tls`, `service`, `ingress`,
    // `pods` and `signedUrls` inline would add several hundred bytes to each. Boxed, each costs
    // one pointer.
    assert!(std::mem::size_of::<CdnClusterSpec>() <= 120);
    assert_eq!(std::mem::size_of::<Option<Box<crate::api::Pods>>>(), 8);
}

#[test]
fn seed_balancer_resolves_its_caches_through_their_services() {
    let all = seed();
    let upstreams =
        sources::resolve(&all[0], world(&all), sources::DEFAULT_CLUSTER_DOMAIN).unwrap();
    assert_eq!(upstreams.len(), 2);
    assert_eq!(upstreams[0].address, "cache-live.default.svc.cluster.local");
    assert_eq!(upstreams[0].path_condition.as_deref(), Some("^/live/"));
    // Its pods looked up while nginx runs, by the SRV records of the Service's port: one member
    // of the ring per pod.
    let conf = build::config(&all[0], &upstreams, &Paths::default(), false);
    assert!(conf.contains(
        "    upstream source_0 {\n        hash $host$uri$cdn_key_args consistent;\n        zone source_0 64k;\n\
         \x20       server cache-live.default.svc.cluster.local service=http resolve weight=2 max_fails=2 fail_timeout=5s;\n"
    ), "{conf}");
    assert_eq!(upstreams[1].address, "cache-vod.default.svc.cluster.local");
    // Whichever pod fails, up to three are tried.
    assert_eq!(conf.matches("proxy_next_upstream_tries 3;").count(), 2);
}

#[test]
fn missing_sources_are_listed_in_order() {
    let all = seed();
    let problem =
        sources::resolve(&all[0], world(&all[..1]), sources::DEFAULT_CLUSTER_DOMAIN).unwrap_err();
    assert_eq!(
        problem,
        Problem::Missing(vec!["cache-live".into(), "cache-vod".into()])
    );
}

#[test]
fn invalid_specs_are_refused_with_a_reason() {
    let invalid = |c: &CdnCluster, all: &[CdnCluster]| match sources::resolve(
        c,
        world(all),
        sources::DEFAULT_CLUSTER_DOMAIN,
    ) {
        Err(Problem::Invalid(message)) => message,
        other => panic!("expected Invalid, got {other:?}"),
    };
    let itself = cluster("a", Role::Cache, vec![Source::cluster("a", None)]);
    assert!(invalid(&itself, &[]).contains("lists itself"));

    let twice = cluster(
        "a",
        Role::Cache,
        vec![
            Source::cluster("b", None),
            Source::cluster("b", Some("^/x")),
        ],
    );
    assert!(invalid(&twice, &[]).contains("listed twice"));

    // Several defaults are a pool now (see below); members reached differently are not.
    let mixed = cluster(
        "a",
        Role::Cache,
        vec![
            Source::cluster("b", None),
            Source::url("web", "https://o.example.com/x", None),
        ],
    );
    assert_eq!(
        invalid(&mixed, &[]),
        "pool b + web (default) cannot be balanced: b is reached over http with the client's Host \
         but web is the URL origin https://o.example.com/x; a pool's members must all be \
         CdnClusters or Service origins, or URL origins of the same scheme, host and path"
    );
    let heavy = cluster(
        "a",
        Role::Cache,
        vec![Source::cluster("b", None).weighted(0)],
    );
    assert!(invalid(&heavy, &[]).contains("source b: weight 0 is out of range: 1 to 100"));

    let regex = cluster(
        "a",
        Role::Cache,
        vec![Source::cluster("b", Some("^/(live"))],
    );
    assert!(invalid(&regex, &[]).contains("not a valid regular expression"));

    let a = cluster("a", Role::Balancer, vec![Source::cluster("b", None)]);
    let b = cluster("b", Role::Cache, vec![Source::cluster("c", None)]);
    let c = cluster("c", Role::Cache, vec![Source::cluster("a", None)]);
    let all = [a.clone(), b, c];
    assert_eq!(invalid(&a, &all), "sources form a cycle: a → b → c → a");

    let long = cluster(&"x".repeat(53), Role::Cache, vec![]);
    assert!(invalid(&long, &[]).contains("at most 52"));
    let dotted = cluster("a.b", Role::Cache, vec![]);
    assert!(invalid(&dotted, &[]).contains("DNS-1035"));

    for bad in [
        "",
        "Edge-TLS",
        "edge_tls",
        "-edge",
        "edge.",
        "a..b",
        &"x".repeat(254),
    ] {
        let mut tls = cluster("a", Role::Balancer, vec![]);
        tls.spec.tls = Some(Box::new(TlsSpec {
            secret_name: bad.into(),
            redirect: false,
        }));
        assert!(
            invalid(&tls, &[]).starts_with(&format!(
                "tls.secretName {bad:?} is not the name of a Secret"
            )),
            "{bad:?}"
        );
    }
    for good in ["edge-tls", "edge.example.com-tls", "0", &"x".repeat(253)] {
        let mut tls = cluster("a", Role::Balancer, vec![]);
        tls.spec.tls = Some(Box::new(TlsSpec {
            secret_name: good.into(),
            redirect: false,
        }));
        assert!(
            sources::resolve(&tls, world(&[]), sources::DEFAULT_CLUSTER_DOMAIN).is_ok(),
            "{good:?}"
        );
    }
}

fn pool_world() -> Vec<CdnCluster> {
    vec![
        cluster(
            "balancer",
            Role::Balancer,
            vec![
                Source::cluster("cache-a", None).weighted(2),
                Source::cluster("live", Some("^/live/")),
                Source::cluster("cache-b", None),
                Source::cluster("cache-c", None),
            ],
        ),
        cluster("cache-a", Role::Cache, vec![]),
        cluster("cache-b", Role::Cache, vec![]),
        cluster("cache-c", Role::Cache, vec![]),
        cluster("live", Role::Cache, vec![]),
    ]
}

#[test]
fn sources_sharing_a_condition_are_one_pool_balanced_by_consistent_hashing() {
    let all = pool_world();
    let ups = sources::resolve(&all[0], world(&all), sources::DEFAULT_CLUSTER_DOMAIN).unwrap();
    assert_eq!(nginx::pools(&ups), vec![vec![0, 2, 3], vec![1]]);
    assert_eq!(
        nginx::describe_pool(&ups, &[0, 2, 3]),
        "pool cache-a + cache-b + cache-c (default)"
    );
    assert_eq!(
        ups.iter().map(|u| u.weight).collect::<Vec<_>>(),
        [2, 1, 1, 1]
    );
    let conf = build::config(&all[0], &ups, &Paths::default(), false);
    assert!(
        conf.contains(
            "    upstream source_0 {\n        hash $host$uri$cdn_key_args consistent;\n        zone source_0 64k;\n\
             \x20       server cache-a.default.svc.cluster.local service=http resolve weight=4 max_fails=2 fail_timeout=5s;\n\
             \x20       server cache-b.default.svc.cluster.local service=http resolve weight=2 max_fails=2 fail_timeout=5s;\n\
             \x20       server cache-c.default.svc.cluster.local service=http resolve weight=2 max_fails=2 fail_timeout=5s;\n\
             \x20       keepalive 32;\n        keepalive_requests 10000;\n        keepalive_timeout 60s;\n    }"
        ),
        "{conf}"
    );
    assert!(conf.contains("    # source cache-b\n"));
    // nginx looks the names up with the resolver the entrypoint writes.
    assert!(conf.contains("\n    include /tmp/resolver.conf;\n"));
    // A source of one CdnCluster is a ring too: of its pods.
    assert!(conf.contains("    upstream source_1 {\n        hash $host$uri$cdn_key_args consistent;\n        zone source_1 64k;\n        server live.default.svc.cluster.local service=http resolve weight=2 max_fails=2 fail_timeout=5s;\n        keepalive 32;\n        keepalive_requests 10000;\n        keepalive_timeout 60s;\n    }"), "{conf}");
    assert_eq!(conf.matches("upstream source_").count(), 2);
    assert!(!conf.contains("source_2") && !conf.contains("source_3"));
    let default = conf
        .find("        # default pool cache-a + cache-b + cache-c\n        location ~ \"^/\" {")
        .unwrap();
    assert!(conf.find("location ~ \"^/live/\"").unwrap() < default);
    let location = &conf[default..];
    for line in [
        // Failover on the member's own failures only: not on what it relays from its origin.
        "proxy_next_upstream error timeout;",
        "proxy_next_upstream_tries 3;",
        "proxy_next_upstream_timeout 30s;",
        "proxy_connect_timeout 2s;",
        "proxy_read_timeout 25s;",
        "add_header X-Cdn-Upstream $upstream_addr always;",
        "proxy_pass http://source_0;",
    ] {
        assert!(location.contains(line), "{line} missing in\n{location}");
    }
    // A balancer passes the cache's X-Cache-Status on; it adds none.
    assert!(!location.contains("add_header X-Cache-Status"));
    assert_eq!(conf.matches("proxy_next_upstream_tries 3;").count(), 2);

    // In a cache, a pool's location repeats the cache status (a location's add_header
    // replaces the server's).
    let origins = cluster(
        "c",
        Role::Cache,
        vec![
            Source::url("o1", "http://o.example.com:8080/v", Some("^/v/")),
            Source::url("o2", "http://o.example.com:8081/v", Some("^/v/")),
        ],
    );
    let ups = sources::resolve(&origins, world(&[]), sources::DEFAULT_CLUSTER_DOMAIN).unwrap();
    let conf = build::config(&origins, &ups, &Paths::default(), false);
    let location = &conf[conf
        .find("# pool o1 + o2\n        location ~ \"^/v/\"")
        .unwrap()..];
    assert!(location.contains("add_header X-Cache-Status $upstream_cache_status always;"));
    assert!(location.contains("proxy_set_header Host \"o.example.com\";"));
    // Redundant origins are failed over on their 502/503/504 too, within the origins' bound.
    assert!(location.contains("proxy_next_upstream error timeout http_502 http_503 http_504;"));
    assert!(location.contains("proxy_connect_timeout 3s;\n"));
    assert!(location.contains("proxy_next_upstream_timeout 4s;\n"));
}

#[test]
fn a_pool_reaches_the_status_by_its_members() {
    let c = cluster(
        "b",
        Role::Balancer,
        vec![
            Source::service("store", "store", 80, Some("^/s/")),
            Source::url("web", "http://web.example.com", Some("^/s/")),
        ],
    );
    let problem = sources::resolve(&c, world(&[]), sources::DEFAULT_CLUSTER_DOMAIN).unwrap_err();
    let next = status::desired(&c, Observed::Problem(&problem), &now());
    assert_eq!(next.state, Some(State::Invalid));
    let ready = crate::reconcile::conditions::find(&next.conditions, status::READY).unwrap();
    assert!(
        ready
            .message
            .starts_with("pool store + web (pathCondition \"^/s/\") cannot be balanced"),
        "{}",
        ready.message
    );
    // A missing member is waited for, named as the seed names a missing source.
    let all = pool_world();
    let problem =
        sources::resolve(&all[0], world(&all[..2]), sources::DEFAULT_CLUSTER_DOMAIN).unwrap_err();
    assert_eq!(
        status::describe(&problem),
        "Source live not found, will retry later"
    );
}

#[test]
fn a_cycle_elsewhere_in_the_graph_does_not_invalidate_a_parent() {
    // top → a → b → a: top is not on the cycle; it waits on nothing and deploys.
    let top = cluster("top", Role::Balancer, vec![Source::cluster("a", None)]);
    let a = cluster("a", Role::Cache, vec![Source::cluster("b", None)]);
    let b = cluster("b", Role::Cache, vec![Source::cluster("a", None)]);
    let all = [top.clone(), a, b];
    assert!(sources::resolve(&top, world(&all), sources::DEFAULT_CLUSTER_DOMAIN).is_ok());
}

#[test]
fn origins_resolve_to_urls_and_services() {
    let mut c = cluster(
        "c",
        Role::Cache,
        vec![
            Source {
                name: "web".into(),
                path_condition: Some("^/web/".into()),
                origin: Some(Origin {
                    url: Some("https://origin.example.com/media/".into()),
                    service: None,
                }),
                weight: None,
            },
            Source {
                name: "store".into(),
                path_condition: None,
                origin: Some(Origin {
                    url: None,
                    service: Some(ServiceOrigin {
                        name: "vod-store".into(),
                        port: 8080,
                    }),
                }),
                weight: None,
            },
        ],
    );
    let ups = sources::resolve(&c, world(&[]), sources::DEFAULT_CLUSTER_DOMAIN).unwrap();
    assert_eq!(ups[0].scheme, "https");
    assert_eq!(ups[0].address, "origin.example.com:443");
    assert_eq!(ups[0].host_header.as_deref(), Some("origin.example.com"));
    assert_eq!(ups[0].path_prefix, "/media");
    assert_eq!(ups[1].address, "vod-store.default.svc.cluster.local:8080");
    // Both are looked up while nginx runs, the URL's host as the Service.
    let conf = build::config(&c, &ups, &Paths::default(), false);
    assert!(
        conf.contains("        server origin.example.com:443 resolve;\n"),
        "{conf}"
    );
    assert!(conf.contains("        server vod-store.default.svc.cluster.local:8080 resolve;\n"));

    for (url, why) in [
        ("ftp://x", "only http and https"),
        ("http://u:p@x", "credentials"),
        ("http://x/?a=1", "query"),
        ("not a url", "is not a URL"),
    ] {
        c.spec.sources[0].origin.as_mut().unwrap().url = Some(url.into());
        match sources::resolve(&c, world(&[]), sources::DEFAULT_CLUSTER_DOMAIN) {
            Err(Problem::Invalid(m)) => assert!(m.contains(why), "{url}: {m}"),
            other => panic!("{url}: {other:?}"),
        }
    }
    c.spec.sources[0].origin = Some(Origin {
        url: None,
        service: None,
    });
    assert!(matches!(
        sources::resolve(&c, world(&[]), sources::DEFAULT_CLUSTER_DOMAIN),
        Err(Problem::Invalid(m)) if m.contains("exactly one of url or service")
    ));
}

#[test]
fn children_have_the_seed_names_labels_and_owner() {
    let all = seed();
    let ups = sources::resolve(&all[0], world(&all), sources::DEFAULT_CLUSTER_DOMAIN).unwrap();
    let children = build::children(&all[0], &ups, &RunAs::default(), &Default::default());

    let d = &children.workload.deployment().cloned().unwrap();
    assert_eq!(d.metadata.name.as_deref(), Some("balancer-deployment"));
    let owner = &d.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (
            owner.kind.as_str(),
            owner.name.as_str(),
            owner.uid.as_str(),
            owner.controller
        ),
        ("CdnCluster", "balancer", "uid-balancer", Some(true))
    );
    let spec = d.spec.as_ref().unwrap();
    let selector = spec.selector.match_labels.as_ref().unwrap();
    assert_eq!(
        selector.get("deployment").map(String::as_str),
        Some("balancer-deployment")
    );
    let template = spec.template.metadata.as_ref().unwrap();
    assert_eq!(
        template
            .labels
            .as_ref()
            .unwrap()
            .get("deployment")
            .map(String::as_str),
        Some("balancer-deployment")
    );
    let pod = spec.template.spec.as_ref().unwrap();
    assert_eq!(pod.containers[0].name, "nginx");
    assert_eq!(
        pod.containers[0].image.as_deref(),
        Some(build::DEFAULT_IMAGE)
    );

    assert_eq!(
        children.config_map.metadata.name.as_deref(),
        Some("balancer-nginx")
    );
    assert_eq!(children.service.metadata.name.as_deref(), Some("balancer"));
    let svc = children.service.spec.as_ref().unwrap();
    assert_eq!(
        svc.selector
            .as_ref()
            .unwrap()
            .get("deployment")
            .map(String::as_str),
        Some("balancer-deployment")
    );
    // The balancer's Service has an address for its clients; a cache's is headless, so that the
    // cluster DNS names each of its pods under the port its parents look up.
    assert_eq!(svc.cluster_ip, None);
    let port = &svc.ports.as_ref().unwrap()[0];
    assert_eq!(port.name.as_deref(), Some(nginx::SERVICE_PORT_NAME));
    let cache = build::children(&all[1], &[], &RunAs::default(), &Default::default());
    let cache_svc = cache.service.spec.as_ref().unwrap();
    assert_eq!(cache_svc.cluster_ip.as_deref(), Some("None"));
    assert_eq!(
        cache_svc.publish_not_ready_addresses, None,
        "ready pods only"
    );
    for meta in [
        &children.workload.deployment().cloned().unwrap().metadata,
        &children.config_map.metadata,
        &children.service.metadata,
    ] {
        assert_eq!(meta.namespace.as_deref(), Some("default"));
        assert_eq!(
            meta.owner_references.as_ref().unwrap()[0].uid,
            "uid-balancer"
        );
        assert_eq!(
            meta.labels
                .as_ref()
                .unwrap()
                .get("app.kubernetes.io/managed-by")
                .map(String::as_str),
            Some("cdn-operator")
        );
    }
}

#[test]
fn the_ids_a_cluster_pins_are_set_on_the_nginx_pods() {
    let c = cluster("c", Role::Balancer, vec![]);
    let run_as = RunAs {
        user: Some(1_000_680_000),
        group: None,
        fs_group: Some(1_000_680_000),
    };
    let d = build::children(&c, &[], &run_as, &Default::default())
        .workload
        .deployment()
        .cloned()
        .unwrap();
    let psc = d.spec.unwrap().template.spec.unwrap().security_context;
    assert_eq!(psc, Some(crate::kubernetes::restricted::pod(&run_as)));
}

/// The pod spec of `c`'s Deployment, built with `pods`.
fn pod_spec(c: &CdnCluster, pods: &build::PodSettings) -> k8s_openapi::api::core::v1::PodSpec {
    pod_spec_of(build::children(c, &[], &RunAs::default(), pods))
}

/// The pod spec of the Deployment of `children`.
fn pod_spec_of(children: build::Children) -> k8s_openapi::api::core::v1::PodSpec {
    children.workload.template().spec.clone().unwrap()
}

#[test]
fn nginx_runs_the_operators_default_image_unless_the_spec_names_one() {
    // A release pins the default by digest (RELATED_IMAGE_NGINX): a mirror serves digests only.
    let images = build::PodImages {
        nginx: "mirror.example/nginx-unprivileged@sha256:0123".into(),
        metrics: None,
    };
    let image = |c: &CdnCluster| {
        let pods = build::PodSettings {
            images: images.clone(),
            ..Default::default()
        };
        pod_spec(c, &pods).containers[0].image.clone()
    };
    let mut c = cluster("c", Role::Cache, vec![]);
    assert_eq!(image(&c).as_deref(), Some(images.nginx.as_str()));
    c.spec.image = Some("registry.example/nginx:1.31".into());
    assert_eq!(image(&c).as_deref(), Some("registry.example/nginx:1.31"));
}

#[test]
fn pods_meet_the_restricted_pod_security_standard() {
    let c = cluster("c", Role::Cache, vec![]);
    let d = build::children(&c, &[], &RunAs::default(), &Default::default())
        .workload
        .deployment()
        .cloned()
        .unwrap();
    let pod = d.spec.unwrap().template.spec.unwrap();
    let psc = pod.security_context.unwrap();
    assert_eq!(psc.run_as_non_root, Some(true));
    // No fixed UID: OpenShift's restricted-v2 SCC refuses one outside the namespace's range, and
    // the default image's numeric USER meets runAsNonRoot elsewhere.
    assert_eq!(
        (psc.run_as_user, psc.run_as_group, psc.fs_group),
        (None, None, None)
    );
    assert_eq!(psc.seccomp_profile.unwrap().type_, "RuntimeDefault");
    assert_eq!(pod.automount_service_account_token, Some(false));
    let container = &pod.containers[0];
    let sc = container.security_context.as_ref().unwrap();
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(
        sc.capabilities.as_ref().unwrap().drop.as_deref(),
        Some(&["ALL".to_string()][..])
    );
    let port = container.ports.as_ref().unwrap()[0].container_port;
    assert!(port >= 1024, "unprivileged port");
    // A cache gets an emptyDir for its cache, and every pod one for /tmp.
    let mounts: Vec<_> = container
        .volume_mounts
        .as_ref()
        .unwrap()
        .iter()
        .map(|m| m.mount_path.as_str())
        .collect();
    assert_eq!(mounts, ["/etc/nginx/cdn", "/tmp", "/var/cache/nginx"]);
    let probe = container.readiness_probe.as_ref().unwrap();
    assert_eq!(
        probe.http_get.as_ref().unwrap().path.as_deref(),
        Some(nginx::HEALTH_PATH)
    );
}

#[test]
fn a_config_change_is_applied_in_place_without_a_rollout() {
    let all = seed();
    let children = |c: &CdnCluster| {
        let ups = sources::resolve(c, world(&all), sources::DEFAULT_CLUSTER_DOMAIN).unwrap();
        build::children(c, &ups, &RunAs::default(), &Default::default())
    };
    let before = children(&all[0]);
    let mut changed = all[0].clone();
    changed.spec.sources[1].path_condition = Some("^/vod2/".into());
    let after = children(&changed);
    let config = |c: &build::Children| c.config_map.data.as_ref().unwrap()[CONFIG_KEY].clone();
    assert_ne!(config(&before), config(&after));
    // The pod template is the same: no pod restarts, no cache is emptied; the entrypoint
    // reloads nginx when the mounted configuration changes.
    assert_eq!(before.workload.template(), after.workload.template());
    let data = after.config_map.data.unwrap();
    assert_eq!(data[ENTRYPOINT_KEY], ENTRYPOINT);
    let pod = pod_spec_of(before);
    let container = &pod.containers[0];
    assert_eq!(
        container.command.as_deref(),
        Some(
            &[
                "/bin/sh".to_string(),
                format!("{}/{ENTRYPOINT_KEY}", build::CONFIG_DIR)
            ][..]
        )
    );
    assert!(ENTRYPOINT.contains(&format!("\nconf={}/{CONFIG_KEY}\n", build::CONFIG_DIR)));
}

#[test]
fn nginx_routes_in_order_with_default_or_404() {
    let up = |name: &str, path: Option<&str>| Upstream {
        name: name.into(),
        path_condition: path.map(Into::into),
        scheme: "http",
        address: format!("{name}.default.svc:80"),
        host_header: None,
        path_prefix: String::new(),
        weight: 1,
        tier: true,
    };
    let c = cluster("b", Role::Balancer, vec![]);
    let conf = build::config(
        &c,
        &[up("live", Some("^/live/")), up("vod", Some("^/vod/"))],
        &Paths::default(),
        false,
    );
    let live = conf.find("location ~ \"^/live/\"").unwrap();
    let vod = conf.find("location ~ \"^/vod/\"").unwrap();
    assert!(live < vod, "regex locations keep the order of the sources");
    assert!(conf.contains("location / {\n            return 404;"));
    assert!(!conf.contains("proxy_cache "), "a balancer does not cache");
    assert!(conf.contains("location = /healthz"));

    let conf = build::config(
        &c,
        &[up("live", Some("^/live/")), up("vod", None)],
        &Paths::default(),
        false,
    );
    let default = &conf[conf.find("location ~ \"^/\" {").unwrap()..];
    assert!(
        default.starts_with("location ~ \"^/\" {\n            proxy_set_header Host \"$host\";\n")
    );
    assert!(default.contains("            proxy_pass http://source_1;\n        }\n"));
    assert!(
        conf.find("location ~ \"^/live/\"").unwrap() < conf.find("location ~ \"^/\" {").unwrap(),
        "the default is the last route"
    );
    assert!(!conf.contains("return 404"));
}

#[test]
fn nginx_quotes_regexes_and_caches_as_tuned() {
    let mut c = cluster("c", Role::Cache, vec![]);
    c.spec.cache = Some(Box::new(CacheSpec {
        size: Some("5g".into()),
        inactive: Some("2h".into()),
        valid: Some("30s".into()),
        ..CacheSpec::default()
    }));
    let tricky = Upstream {
        name: "o".into(),
        path_condition: Some(r#"^/a"b\d+$"#.into()),
        scheme: "http",
        address: "o.default.svc:80".into(),
        host_header: None,
        path_prefix: String::new(),
        weight: 1,
        tier: false,
    };
    let conf = build::config(&c, &[tricky], &Paths::default(), false);
    assert!(conf.contains(r#"location ~ "^/a\"b\\d+$" {"#), "{conf}");
    assert!(conf.contains("max_size=5g inactive=2h"));
    assert!(conf.contains("proxy_cache_valid 200 206 301 302 30s;"));
    assert!(conf.contains("add_header X-Cache-Status $upstream_cache_status always;"));
}

/// The configuration of `c`, its sources looked up among `all`.
fn conf_of(c: &CdnCluster, all: &[CdnCluster]) -> String {
    let ups = sources::resolve(c, world(all), sources::DEFAULT_CLUSTER_DOMAIN).unwrap();
    build::config(c, &ups, &Paths::default(), false)
}

#[test]
fn every_location_sends_every_proxy_header() {
    // nginx drops the server's proxy_set_header lines in a location that sets one: each location
    // that proxies sets them all, or keepalive and X-Forwarded-* are lost.
    let all = pool_world();
    let mut cache = cluster(
        "c",
        Role::Cache,
        vec![
            Source::url("o", "https://o.example.com/media", Some("^/m/")),
            Source::service("s", "store", 80, None),
        ],
    );
    cache.spec.cache = Some(Box::new(CacheSpec::default()));
    for conf in [conf_of(&all[0], &all), conf_of(&cache, &[])] {
        let passes = conf.matches("proxy_pass ").count();
        assert!(passes >= 2, "{conf}");
        for header in [
            "proxy_set_header Host ",
            "proxy_set_header Connection \"\";",
            "proxy_set_header X-Forwarded-For $cdn_forwarded_for;",
            "proxy_set_header X-Forwarded-Proto $cdn_forwarded_proto;",
        ] {
            assert_eq!(conf.matches(header).count(), passes, "{header} in\n{conf}");
        }
        assert!(conf.contains("proxy_http_version 1.1;"));
        assert_eq!(
            conf.matches("keepalive 32;").count(),
            conf.matches("upstream source_").count()
        );
    }
}

#[test]
fn the_cache_key_holds_the_host_and_not_the_order_of_the_sources() {
    let c = cluster(
        "c",
        Role::Cache,
        vec![
            Source::url("a", "http://a.example.com", Some("^/a/")),
            Source::url("b", "http://b.example.com", None),
        ],
    );
    let conf = conf_of(&c, &[]);
    let key = "proxy_cache_key $request_method$host$uri$cdn_key_args$slice_range;";
    assert!(conf.contains(key), "{conf}");
    assert!(!conf.contains("$proxy_host"));
    let mut reordered = c.clone();
    reordered.spec.sources.reverse();
    assert!(conf_of(&reordered, &[]).contains(key));
    // Ranges are cached by slice; a HEAD is passed on as a HEAD.
    assert!(conf.contains("slice 1m;"));
    assert_eq!(
        conf.matches("proxy_set_header Range $slice_range;").count(),
        conf.matches("proxy_pass ").count()
    );
    assert!(conf.contains("proxy_cache_convert_head off;"));
}

#[test]
fn excluded_query_parameters_leave_the_key_and_the_hash() {
    let mut c = cluster("c", Role::Cache, vec![]);
    c.spec.http = Some(Box::new(HttpSpec {
        excluded_query_parameters: Some(vec!["token".into(), "hdnts.v2".into()]),
        ..HttpSpec::default()
    }));
    let conf = conf_of(&c, &[]);
    assert!(conf.contains(
        "    map $cdn_args_0 $cdn_args_1 {\n        \"~^(?<cdn_before_1>.*?)&token(?:=[^&]*)?(?<cdn_after_1>&.*)?$\" \"$cdn_before_1$cdn_after_1\";\n        default $cdn_args_0;\n    }"
    ), "{conf}");
    assert!(
        conf.contains("&hdnts\\\\.v2(?:=[^&]*)?"),
        "escaped, then quoted:\n{conf}"
    );
    assert!(conf.contains("    map $cdn_args_2 $cdn_key_args {"));
    // A balancer hashes its pools by the same key.
    let all = pool_world();
    let mut b = all[0].clone();
    b.spec.http = c.spec.http.clone();
    let conf = conf_of(&b, &all);
    assert!(conf.contains("hash $host$uri$cdn_key_args consistent;"));
    assert!(conf.contains("map $cdn_args_1 $cdn_args_2 {"));

    let mut bad = c.clone();
    bad.spec.http = Some(Box::new(HttpSpec {
        excluded_query_parameters: Some(vec!["to ken".into()]),
        ..HttpSpec::default()
    }));
    match sources::resolve(&bad, world(&[]), sources::DEFAULT_CLUSTER_DOMAIN) {
        Err(Problem::Invalid(m)) => {
            assert!(m.contains("\"to ken\" is not a parameter name"), "{m}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn only_trusted_proxies_forward_a_client_address() {
    // The peer, not the viewer realip makes $remote_addr.
    let geo = |conf: &str| {
        let start = conf
            .find("geo $realip_remote_addr $cdn_trusted_peer {")
            .unwrap();
        conf[start..start + conf[start..].find('}').unwrap()].to_string()
    };
    // The balancer is the edge: it trusts no one by default; a cache trusts the private ranges.
    let all = seed();
    let edge = conf_of(&all[0], &all);
    assert_eq!(
        geo(&edge),
        "geo $realip_remote_addr $cdn_trusted_peer {\n        default 0;\n    "
    );
    assert!(!edge.contains("real_ip"), "{edge}");
    let cache_conf = conf_of(&all[1], &all);
    let cache = geo(&cache_conf);
    for range in nginx::PRIVATE_RANGES {
        assert!(cache.contains(&format!("        {range} 1;\n")), "{cache}");
        // The same peers report the viewer.
        assert!(cache_conf.contains(&format!("    set_real_ip_from {range};\n")));
    }
    assert!(cache_conf.contains("    real_ip_header X-Forwarded-For;\n    real_ip_recursive on;\n"));
    // What goes upstream is the peer's view as before: the header it sent, the peer appended.
    assert!(cache_conf.contains("\"~^1(?<cdn_xff>.+)$\" \"$cdn_xff, $realip_remote_addr\";"));
    // A cache that viewers reach (spec.service) trusts no one by default.
    let mut exposed = all[1].clone();
    exposed.spec.service = Some(Box::default());
    let exposed = conf_of(&exposed, &all);
    assert!(geo(&exposed).ends_with("default 0;\n    "), "{exposed}");
    assert!(!exposed.contains("real_ip"), "{exposed}");
    let mut edge_cache = all[1].clone();
    edge_cache.spec.http = Some(Box::new(HttpSpec {
        trusted_proxies: Some(vec!["203.0.113.0/24".into(), "2001:db8::1".into()]),
        ..HttpSpec::default()
    }));
    let trusted = geo(&conf_of(&edge_cache, &all));
    assert!(trusted.contains("        203.0.113.0/24 1;\n        2001:db8::1 1;\n"));
    assert!(!trusted.contains("10.0.0.0/8"));

    for bad in [
        "10.0.0.0/33",
        "10.0.0/8",
        "fc00::/129",
        "example.com",
        "10.0.0.0/+8",
    ] {
        let mut c = all[1].clone();
        c.spec.http = Some(Box::new(HttpSpec {
            trusted_proxies: Some(vec![bad.into()]),
            ..HttpSpec::default()
        }));
        match sources::resolve(&c, world(&all), sources::DEFAULT_CLUSTER_DOMAIN) {
            Err(Problem::Invalid(m)) => {
                assert!(m.contains("is not an IP address or a CIDR range"), "{m}")
            }
            other => panic!("{bad}: {other:?}"),
        }
    }
}

#[test]
fn short_lifetimes_are_refreshed_in_the_background_whole_and_long_ones_by_slices() {
    for (valid, background) in [
        ("500ms", true),
        ("2s", true),
        ("60", true),
        ("1m", true),
        ("61s", false),
        ("2m", false),
        ("1d", false),
        ("1y", false),
        ("10x", false),
    ] {
        assert_eq!(nginx::refreshed_in_background(valid), background, "{valid}");
    }
    let all = seed();
    let cache = cluster(
        "c",
        Role::Cache,
        vec![Source::url("o", "http://o.example.com", None)],
    );
    // The defaults: manifests (2 s) whole and refreshed in the background; segments (1 d) and
    // the rest (10 m) by slices, refreshed by the request that finds them expired.
    let conf = conf_of(&cache, &all);
    let location = |regex: &str| {
        let at = conf.find(&format!("location ~ \"{regex}\" {{")).unwrap();
        let end = conf[at..].find("proxy_pass").unwrap() + at;
        conf[at..end].to_string()
    };
    let manifests = location("\\\\.(m3u8|mpd)$");
    for line in [
        "slice 0;",
        "proxy_cache_background_update on;",
        "add_header X-Cache-Status $upstream_cache_status always;",
        "add_header Connection $cdn_stale_close;",
    ] {
        assert!(manifests.contains(line), "{line}\n{manifests}");
    }
    assert_eq!(conf.matches("proxy_cache_background_update on;").count(), 1);
    assert_eq!(conf.matches("slice 0;").count(), 1);
    assert!(conf.contains("\n        slice 1m;\n"));
    assert!(conf.contains(
        "map \"$upstream_cache_status|$upstream_addr|$server_protocol\" $cdn_stale_close {"
    ));
    // Nothing short-lived: no background refresh, no map for it.
    let mut long = cache.clone();
    long.spec.cache = Some(Box::new(CacheSpec {
        rules: Some(vec![]),
        ..CacheSpec::default()
    }));
    let conf = conf_of(&long, &all);
    assert!(!conf.contains("background_update"), "{conf}");
    assert!(!conf.contains("cdn_stale_close"), "{conf}");
    // A short `valid` applies to the route itself.
    long.spec.cache = Some(Box::new(CacheSpec {
        rules: Some(vec![]),
        valid: Some("30s".into()),
        ..CacheSpec::default()
    }));
    let conf = conf_of(&long, &all);
    assert_eq!(conf.matches("proxy_cache_background_update on;").count(), 1);
}

#[test]
fn lifetime_rules_are_nested_in_every_route_of_a_cache() {
    let all = seed();
    let routed = cluster(
        "c",
        Role::Cache,
        vec![
            Source::url("live", "http://live.example.com/x", Some("^/live/")),
            Source::url("rest", "http://rest.example.com", None),
        ],
    );
    // Without rules: HLS and DASH manifests 2s, segments 1d, in each route, after its own lifetime.
    let conf = conf_of(&routed, &all);
    assert_eq!(
        conf.matches("location ~ \"\\\\.(m3u8|mpd)$\" {").count(),
        2,
        "{conf}"
    );
    assert_eq!(
        conf.matches("proxy_cache_valid 200 206 301 302 2s;")
            .count(),
        2
    );
    assert_eq!(
        conf.matches("proxy_cache_valid 200 206 301 302 1d;")
            .count(),
        2
    );
    assert_eq!(
        conf.matches("proxy_cache_valid 200 206 301 302 10m;")
            .count(),
        2
    );
    assert_eq!(conf.matches("proxy_cache_valid 404 410 1s;").count(), 6);
    // A nested location runs none of its parent's rewrites: each repeats the origin's prefix.
    assert_eq!(conf.matches("rewrite ^(.*)$ \"/x$1\" break;").count(), 3);
    let live = conf.find("location ~ \"^/live/\"").unwrap();
    let default = conf.find("location ~ \"^/\" {").unwrap();
    let manifests = conf[live..].find("(m3u8|mpd)").unwrap() + live;
    assert!(manifests < default, "nested in the live route");

    // Rules set replace the defaults; `rules: []` leaves every path to `valid`.
    let mut tuned = routed.clone();
    tuned.spec.cache = Some(Box::new(CacheSpec {
        rules: Some(vec![CacheRule {
            path_condition: "\\.m3u8$".into(),
            valid: "1s".into(),
        }]),
        not_found_valid: Some("3s".into()),
        ..CacheSpec::default()
    }));
    let conf = conf_of(&tuned, &all);
    assert_eq!(conf.matches("location ~ \"\\\\.m3u8$\" {").count(), 2);
    assert!(!conf.contains("mpd"));
    assert_eq!(conf.matches("proxy_cache_valid 404 410 3s;").count(), 4);
    let mut none = routed.clone();
    none.spec.cache = Some(Box::new(CacheSpec {
        rules: Some(vec![]),
        ..CacheSpec::default()
    }));
    assert!(!conf_of(&none, &all).contains("lifetime rule"));
    // A balancer caches nothing: no rule, no lifetime.
    assert!(!conf_of(&all[0], &all).contains("proxy_cache_valid"));

    let mut bad = routed.clone();
    bad.spec.cache = Some(Box::new(CacheSpec {
        rules: Some(vec![CacheRule {
            path_condition: "^/(live".into(),
            valid: "1s".into(),
        }]),
        ..CacheSpec::default()
    }));
    match sources::resolve(&bad, world(&all), sources::DEFAULT_CLUSTER_DOMAIN) {
        Err(Problem::Invalid(m)) => {
            assert!(
                m.starts_with("cache rule \"^/(live\": not a valid regular expression"),
                "{m}"
            )
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_cache_is_sized_from_cache_size() {
    assert_eq!(nginx::size_bytes("1g"), Some(1 << 30));
    assert_eq!(nginx::size_bytes("512M"), Some(512 << 20));
    assert_eq!(nginx::size_bytes("64k"), Some(64 << 10));
    assert_eq!(nginx::size_bytes("1000"), Some(1000));
    assert_eq!(nginx::size_bytes("1t"), None);
    assert_eq!(nginx::size_bytes(""), None);
    // 8,000 keys a MiB, objects of 128 KiB on average, 16 MiB at least.
    assert_eq!(nginx::keys_zone_mib("1g"), 16);
    assert_eq!(nginx::keys_zone_mib("100g"), 103);
    // A quarter above nginx's max_size, which nginx passes for a while.
    assert_eq!(build::cache_volume_mib("1g"), 1280);
    assert_eq!(build::cache_volume_mib("10m"), 16);

    let mut c = cluster("c", Role::Cache, vec![]);
    c.spec.cache = Some(Box::new(CacheSpec {
        size: Some("100g".into()),
        ..CacheSpec::default()
    }));
    let conf = conf_of(&c, &[]);
    assert!(
        conf.contains("keys_zone=cdn_103m:103m max_size=100g"),
        "{conf}"
    );
    assert!(conf.contains("proxy_cache cdn_103m;"));
    let pod = build::children(&c, &[], &RunAs::default(), &Default::default())
        .workload
        .template()
        .spec
        .clone()
        .unwrap();
    let volume = pod
        .volumes
        .unwrap()
        .into_iter()
        .find(|v| v.name == "cache")
        .unwrap();
    let limit = volume.empty_dir.unwrap().size_limit.unwrap();
    assert_eq!(limit.0, "128000Mi");
    let requests = pod.containers[0]
        .resources
        .clone()
        .unwrap()
        .requests
        .unwrap();
    assert_eq!(requests["ephemeral-storage"].0, "128000Mi");
    assert_eq!(requests["cpu"].0, "50m", "the defaults beside it");
    // A balancer has no cache, so no storage request.
    let b = build::children(&seed()[0], &[], &RunAs::default(), &Default::default())
        .workload
        .deployment()
        .cloned()
        .unwrap();
    let requests = b.spec.unwrap().template.spec.unwrap().containers[0]
        .resources
        .clone()
        .unwrap()
        .requests
        .unwrap();
    assert!(!requests.contains_key("ephemeral-storage"));

    let mut bad = c.clone();
    bad.spec.cache = Some(Box::new(CacheSpec {
        slice_size: Some("0".into()),
        ..CacheSpec::default()
    }));
    match sources::resolve(&bad, world(&[]), sources::DEFAULT_CLUSTER_DOMAIN) {
        Err(Problem::Invalid(m)) => {
            assert_eq!(m, "cache.sliceSize \"0\" is not a size such as 512m or 10g")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_cache_with_a_volume_runs_in_a_stateful_set_each_pod_with_its_claim() {
    let mut c = cluster("vod", Role::Cache, vec![]);
    c.spec.replicas = 2;
    c.spec.cache = Some(Box::new(CacheSpec {
        size: Some("100g".into()),
        volume: Some(CacheVolume {
            storage_class_name: Some("fast".into()),
        }),
        ..CacheSpec::default()
    }));
    let children = build::children(&c, &[], &RunAs::default(), &Default::default());
    assert!(children.workload.deployment().is_none());
    let Workload::StatefulSet(set) = &children.workload else {
        panic!("{:?}", children.workload)
    };
    assert_eq!(
        set.metadata.name.as_deref(),
        Some("vod"),
        "pods vod-0, vod-1"
    );
    let spec = set.spec.as_ref().unwrap();
    assert_eq!(spec.replicas, Some(2));
    // Each pod named in the cluster DNS under the cache's headless Service.
    assert_eq!(spec.service_name.as_deref(), Some("vod"));
    assert!(build::is_headless(&children.service));
    assert_eq!(
        spec.selector.match_labels,
        children.service.spec.as_ref().unwrap().selector,
        "the Service selects the StatefulSet's pods"
    );
    assert_eq!(spec.pod_management_policy.as_deref(), Some("Parallel"));
    let retention = spec
        .persistent_volume_claim_retention_policy
        .as_ref()
        .unwrap();
    assert_eq!(
        (
            retention.when_deleted.as_deref(),
            retention.when_scaled.as_deref()
        ),
        (Some("Delete"), Some("Delete"))
    );
    let [claim] = spec.volume_claim_templates.as_deref().unwrap() else {
        panic!("one claim per pod")
    };
    assert_eq!(claim.metadata.name.as_deref(), Some("cache"));
    let claim = claim.spec.as_ref().unwrap();
    assert_eq!(claim.storage_class_name.as_deref(), Some("fast"));
    assert_eq!(claim.access_modes, Some(vec!["ReadWriteOnce".to_string()]));
    let storage = &claim.resources.as_ref().unwrap().requests.as_ref().unwrap()["storage"];
    assert_eq!(
        storage.0, "128000Mi",
        "the size of the emptyDir it replaces"
    );
    // The pod mounts its claim where nginx keeps the cache; no emptyDir, no ephemeral storage.
    let pod = children.workload.template().spec.as_ref().unwrap();
    let volumes = pod.volumes.as_deref().unwrap();
    assert!(volumes.iter().all(|v| v.name != "cache"), "{volumes:?}");
    let mounts = pod.containers[0].volume_mounts.as_deref().unwrap();
    let mount = mounts.iter().find(|m| m.name == "cache").unwrap();
    assert_eq!(mount.mount_path, "/var/cache/nginx");
    let requests = pod.containers[0]
        .resources
        .as_ref()
        .unwrap()
        .requests
        .as_ref()
        .unwrap();
    assert!(!requests.contains_key("ephemeral-storage"), "{requests:?}");
    // The default spread counts within a revision of the StatefulSet's pods.
    let spread = pod.topology_spread_constraints.as_deref().unwrap();
    assert!(spread
        .iter()
        .all(|t| t.match_label_keys == Some(vec!["controller-revision-hash".to_string()])));

    // Without a class: the cluster's default one. A balancer has no cache, a volume or not.
    let mut default_class = c.clone();
    default_class.spec.cache.as_mut().unwrap().volume = Some(CacheVolume::default());
    let children = build::children(&default_class, &[], &RunAs::default(), &Default::default());
    let Workload::StatefulSet(set) = children.workload else {
        panic!()
    };
    let claims = set.spec.unwrap().volume_claim_templates.unwrap();
    assert_eq!(claims[0].spec.as_ref().unwrap().storage_class_name, None);
    let mut balancer = c.clone();
    balancer.spec.role = Role::Balancer;
    let children = build::children(&balancer, &[], &RunAs::default(), &Default::default());
    assert!(children.workload.deployment().is_some());
}

#[test]
fn config_map_holds_the_config() {
    let c = cluster("c", Role::Cache, vec![]);
    let children = build::children(&c, &[], &RunAs::default(), &Default::default());
    let data = children.config_map.data.unwrap();
    assert!(data[CONFIG_KEY].contains("proxy_cache_path /var/cache/nginx/cdn"));
}

fn deployment(ready: i32, updated: i32, generation: i64, observed: i64) -> Deployment {
    let mut d = Deployment::default();
    d.metadata.generation = Some(generation);
    d.status = Some(DeploymentStatus {
        replicas: Some(1),
        ready_replicas: Some(ready),
        updated_replicas: Some(updated),
        observed_generation: Some(observed),
        ..DeploymentStatus::default()
    });
    d
}

#[test]
fn status_follows_the_deployment() {
    let c = cluster("c", Role::Cache, vec![]);
    let s = status::desired(&c, Observed::Deployed(None, None), &now());
    assert_eq!(s.state, Some(State::Deploying));
    assert_eq!(s.ready.as_deref(), Some("0/1"));
    let s = status::desired(
        &c,
        Observed::Deployed(Some(&deployment(1, 1, 2, 1)), None),
        &now(),
    );
    assert_eq!(s.state, Some(State::Deploying), "old generation observed");
    let s = status::desired(
        &c,
        Observed::Deployed(Some(&deployment(1, 1, 2, 2)), None),
        &now(),
    );
    assert_eq!(s.state, Some(State::Running));
    assert_eq!(s.ready_replicas, Some(1));
    assert_eq!(s.observed_generation, Some(1));
    assert!(crate::reconcile::conditions::is_true(
        &s.conditions,
        status::READY
    ));
}

#[test]
fn unchanged_status_keeps_transition_times_and_emits_nothing() {
    let mut c = cluster("c", Role::Cache, vec![Source::cluster("x", None)]);
    let missing = Problem::Missing(vec!["x".into()]);
    let first = status::desired(&c, Observed::Problem(&missing), &now());
    assert_eq!(first.state, Some(State::WaitingSource));
    let notices = status::notices(&c, &first, &Observed::Problem(&missing), &[]);
    assert_eq!(notices.len(), 1);
    assert_eq!(notices[0].reason, "SourceNotFound");
    assert_eq!(notices[0].message, "Source x not found, will retry later");

    c.status = Some(first.clone());
    let later = Time("2026-11-22T11:00:00Z".parse().unwrap());
    let second = status::desired(&c, Observed::Problem(&missing), &later);
    assert_eq!(first, second, "same world, same status");
    assert!(status::notices(&c, &second, &Observed::Problem(&missing), &[]).is_empty());

    // Another source missing now: a new Event.
    let other = Problem::Missing(vec!["y".into()]);
    let third = status::desired(&c, Observed::Problem(&other), &later);
    let notices = status::notices(&c, &third, &Observed::Problem(&other), &[]);
    assert_eq!(notices[0].message, "Source y not found, will retry later");
}

#[test]
fn invalid_and_running_transitions_emit_one_event_each() {
    let mut c = cluster("c", Role::Cache, vec![]);
    let invalid = Problem::Invalid("sources form a cycle: c → d → c".into());
    let s = status::desired(&c, Observed::Problem(&invalid), &now());
    assert_eq!(s.state, Some(State::Invalid));
    let n = status::notices(&c, &s, &Observed::Problem(&invalid), &[]);
    assert_eq!(
        (n.len(), n[0].reason, n[0].warning),
        (1, "InvalidSpec", true)
    );
    assert!(crate::reconcile::conditions::is_true(
        &s.conditions,
        status::STALLED
    ));

    c.status = Some(CdnClusterStatus {
        state: Some(State::Deploying),
        ..CdnClusterStatus::default()
    });
    let s = status::desired(
        &c,
        Observed::Deployed(Some(&deployment(1, 1, 1, 1)), None),
        &now(),
    );
    let ready = deployment(1, 1, 1, 1);
    let n = status::notices(&c, &s, &Observed::Deployed(Some(&ready), None), &[]);
    assert_eq!(n.iter().map(|n| n.reason).collect::<Vec<_>>(), ["Running"]);
}

/// A reference to the child `kind` `name` of namespace `ns`.
fn child_ref(kind: &str, name: &str) -> ObjectReference {
    ObjectReference {
        kind: Some(kind.into()),
        name: Some(name.into()),
        namespace: Some("ns".into()),
        ..ObjectReference::default()
    }
}

fn refusal(kind: &str, name: &str, code: Option<u16>, message: &str) -> status::Refusal {
    status::Refusal {
        child: child_ref(kind, name),
        code,
        message: message.into(),
    }
}

#[test]
fn a_refused_child_is_reported_once_per_message_naming_the_child() {
    let mut c = cluster("c", Role::Cache, vec![]);
    let quota = refusal(
        "Service",
        "c",
        Some(403),
        "services \"c\" is forbidden: exceeded quota: q, requested: count/services=1, used: count/services=0, limited: count/services=0",
    );
    let s = status::desired(&c, Observed::Refused(&quota), &now());
    assert_eq!(s.state, Some(State::Error));
    let ready = crate::reconcile::conditions::find(&s.conditions, status::READY).unwrap();
    assert_eq!(ready.reason, "ApplyFailed");
    assert!(
        ready.message.starts_with(
            "Service c was refused (403): services \"c\" is forbidden: exceeded quota"
        ),
        "{}",
        ready.message
    );
    // A refusal of the request itself: only a change elsewhere can help.
    assert!(crate::reconcile::conditions::is_true(
        &s.conditions,
        status::STALLED
    ));
    assert!(!crate::reconcile::conditions::is_true(
        &s.conditions,
        status::RECONCILING
    ));
    let n = status::notices(&c, &s, &Observed::Refused(&quota), &[]);
    assert_eq!(n.len(), 1);
    assert_eq!((n[0].reason, n[0].warning), ("ApplyFailed", true));
    assert_eq!(n[0].message, ready.message);
    assert_eq!(
        n[0].related.as_ref().unwrap().kind.as_deref(),
        Some("Service")
    );

    // The same refusal again: no new Event. Another message: one more.
    c.status = Some(s);
    let again = status::desired(&c, Observed::Refused(&quota), &now());
    assert_eq!(Some(&again), c.status.as_ref());
    assert!(status::notices(&c, &again, &Observed::Refused(&quota), &[]).is_empty());
    let server = refusal(
        "Service",
        "c",
        Some(500),
        "failed to allocate a serviceIP: range is full",
    );
    let s = status::desired(&c, Observed::Refused(&server), &now());
    assert!(
        crate::reconcile::conditions::is_true(&s.conditions, status::RECONCILING),
        "a server error is retried"
    );
    assert!(!crate::reconcile::conditions::is_true(
        &s.conditions,
        status::STALLED
    ));
    assert_eq!(
        status::notices(&c, &s, &Observed::Refused(&server), &[]).len(),
        1
    );

    // Applied again: the state leaves Error.
    c.status = Some(s);
    let s = status::desired(&c, Observed::Deployed(None, None), &now());
    assert_eq!(s.state, Some(State::Deploying));
    assert!(!crate::reconcile::conditions::is_true(
        &s.conditions,
        status::STALLED
    ));
}

#[test]
fn each_child_change_is_one_event() {
    let mut c = cluster("c", Role::Cache, vec![]);
    let child = |kind: &str, name: &str, change| status::ChildChange {
        child: child_ref(kind, name),
        change,
    };
    let created = [
        child("ConfigMap", "c-nginx", status::Change::Created),
        child("Service", "c", status::Change::Created),
        child("Deployment", "c-deployment", status::Change::Created),
    ];
    let s = status::desired(&c, Observed::Deployed(None, None), &now());
    let events = |c: &CdnCluster, changes: &[status::ChildChange]| {
        status::notices(c, &s, &Observed::Deployed(None, None), changes)
            .into_iter()
            .map(|n| (n.reason, n.warning, n.message))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        events(&c, &created),
        [(
            "DeploymentCreated",
            false,
            "The Deployment c-deployment has been created".to_string()
        )],
        "a first creation is the seed's one Event"
    );
    c.status = Some(s.clone());
    assert_eq!(
        events(&c, &created[1..]),
        [
            (
                "ChildRestored",
                true,
                "Service c was deleted outside the operator; re-created it".to_string()
            ),
            (
                "DeploymentCreated",
                false,
                "The Deployment c-deployment has been created".to_string()
            )
        ],
        "a deleted child is re-created with one Event each"
    );
    assert_eq!(
        events(
            &c,
            &[
                child("ConfigMap", "c-nginx", status::Change::Updated),
                child("Deployment", "c-deployment", status::Change::Restored)
            ]
        ),
        [
            (
                "ChildUpdated",
                false,
                "ConfigMap c-nginx updated to the current spec".to_string()
            ),
            (
                "ChildRestored",
                true,
                "Deployment c-deployment was changed outside the operator; restored it".to_string()
            )
        ]
    );
}

#[test]
fn every_label_value_fits_for_the_longest_name() {
    let name = "a".repeat(crate::api::MAX_NAME_LEN);
    let c = cluster(&name, Role::Cache, vec![]);
    let children = build::children(&c, &[], &RunAs::default(), &Default::default());
    let labels: BTreeMap<String, String> = children
        .workload
        .deployment()
        .cloned()
        .unwrap()
        .spec
        .unwrap()
        .template
        .metadata
        .unwrap()
        .labels
        .unwrap();
    for value in labels.values() {
        assert!(value.len() <= 63, "{value}");
    }
    assert!(sources::check_name(&name).is_ok());
}

#[test]
fn only_existence_identity_and_spec_changes_concern_parents() {
    let old = cluster("cache", Role::Cache, vec![]);
    let concerns = |new: &CdnCluster| super::parents::concerns_parents(Some(&old), new);
    assert!(
        super::parents::concerns_parents(None, &old),
        "a new cluster"
    );

    let mut status_only = old.clone();
    status_only.status = Some(CdnClusterStatus {
        state: Some(State::Running),
        ..CdnClusterStatus::default()
    });
    assert!(!concerns(&status_only), "the operator's own status writes");

    let mut spec = old.clone();
    spec.spec.sources.push(Source::cluster("lb", None));
    spec.metadata.generation = Some(2);
    assert!(concerns(&spec), "a spec change (a cycle may appear)");

    let mut recreated = old.clone();
    recreated.metadata.uid = Some("uid-cache-2".into());
    assert!(concerns(&recreated), "a new Service address");
}

fn with_tls(mut c: CdnCluster, redirect: bool) -> CdnCluster {
    c.spec.tls = Some(Box::new(TlsSpec {
        secret_name: "edge-tls".into(),
        redirect,
    }));
    c
}

#[test]
fn tls_adds_an_https_port_the_secret_read_only_and_a_certificate_watch() {
    let all = seed();
    let edge = with_tls(all[0].clone(), false);
    let ups = sources::resolve(&edge, world(&all), sources::DEFAULT_CLUSTER_DOMAIN).unwrap();
    let plain = build::children(&all[0], &ups, &RunAs::default(), &Default::default());
    let children = build::children(&edge, &ups, &RunAs::default(), &Default::default());

    let ports: Vec<_> = children
        .service
        .spec
        .as_ref()
        .unwrap()
        .ports
        .clone()
        .unwrap();
    let ports: Vec<_> = ports
        .iter()
        .map(|p| (p.name.as_deref().unwrap(), p.port, p.target_port.clone()))
        .collect();
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String as Named;
    assert_eq!(
        ports,
        [
            ("http", 80, Some(Named("http".into()))),
            ("https", 443, Some(Named("https".into())))
        ]
    );
    let pod = children.workload.template().spec.clone().unwrap();
    let container = &pod.containers[0];
    let ports: Vec<_> = container
        .ports
        .as_ref()
        .unwrap()
        .iter()
        .map(|p| (p.name.as_deref().unwrap(), p.container_port))
        .collect();
    assert_eq!(ports, [("http", 8080), ("https", 8443)]);
    // The probes stay on plain HTTP.
    let probe = container
        .readiness_probe
        .as_ref()
        .unwrap()
        .http_get
        .as_ref()
        .unwrap();
    assert_eq!(
        probe.port,
        k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String("http".into())
    );
    let mount = container
        .volume_mounts
        .as_ref()
        .unwrap()
        .iter()
        .find(|m| m.mount_path == nginx::TLS_DIR)
        .unwrap();
    assert_eq!(mount.read_only, Some(true));
    let volume = pod
        .volumes
        .as_ref()
        .unwrap()
        .iter()
        .find(|v| v.name == mount.name)
        .unwrap();
    let secret = volume.secret.as_ref().unwrap();
    assert_eq!(secret.secret_name.as_deref(), Some("edge-tls"));
    let items: Vec<_> = secret
        .items
        .as_ref()
        .unwrap()
        .iter()
        .map(|i| (i.key.as_str(), i.path.as_str()))
        .collect();
    assert_eq!(items, [("tls.crt", "tls.crt"), ("tls.key", "tls.key")]);

    // The entrypoint also reloads nginx when the certificate or key changes.
    let data = children.config_map.data.as_ref().unwrap();
    assert_eq!(data[ENTRYPOINT_KEY], build::entrypoint(true, false));
    assert_ne!(data[ENTRYPOINT_KEY], ENTRYPOINT);
    let conf = &data[CONFIG_KEY];
    for line in [
        "        listen 8080;\n        # HTTPS",
        "        listen 8443 ssl;\n        http2 on;\n",
        "        ssl_certificate /etc/nginx/tls/tls.crt;\n        ssl_certificate_key /etc/nginx/tls/tls.key;\n",
        "        ssl_protocols TLSv1.2 TLSv1.3;\n",
        "        ssl_prefer_server_ciphers off;\n",
        "        ssl_session_tickets off;\n",
        "        ssl_stapling on;\n        ssl_stapling_verify on;\n",
    ] {
        assert!(conf.contains(line), "{line:?} in\n{conf}");
    }
    // One server, so one set of routes for both ports.
    assert_eq!(conf.matches("\n    server {").count(), 1);
    assert_eq!(conf.matches("location ~ \"^/live/\"").count(), 1);

    // Without TLS, as before: nothing of it.
    let plain_data = plain.config_map.data.unwrap();
    assert_eq!(plain_data[ENTRYPOINT_KEY], ENTRYPOINT);
    assert!(!plain_data[CONFIG_KEY].contains("ssl"));
    assert_eq!(plain.service.spec.unwrap().ports.unwrap().len(), 1);
}

#[test]
fn a_redirect_leaves_plain_http_the_probes_and_301s() {
    let all = seed();
    let edge = with_tls(all[0].clone(), true);
    let ups = sources::resolve(&edge, world(&all), sources::DEFAULT_CLUSTER_DOMAIN).unwrap();
    let conf = build::config(&edge, &ups, &Paths::default(), false);
    let servers: Vec<&str> = conf.split("\n    server {\n").skip(1).collect();
    assert_eq!(servers.len(), 2, "{conf}");
    let (plain, routes) = (servers[0], servers[1]);
    assert!(plain.starts_with("        listen 8080;\n"), "{plain}");
    assert!(plain.contains("location = /healthz {"));
    assert!(plain.contains("location / {\n            return 301 https://$host$request_uri;\n"));
    assert!(!plain.contains("proxy_pass"));
    assert!(!routes.contains("listen 8080"));
    assert!(routes.starts_with("        # HTTPS (spec.tls)"), "{routes}");
    assert!(routes.contains("listen 8443 ssl;"));
    assert!(routes.contains("proxy_pass"));
}

#[test]
fn a_cluster_with_tls_and_no_source_still_has_a_resolver_for_ocsp() {
    let cache = with_tls(cluster("cache", Role::Cache, vec![]), false);
    let conf = build::config(&cache, &[], &Paths::default(), false);
    assert!(conf.contains("    include /tmp/resolver.conf;\n"), "{conf}");
    let plain = build::config(
        &cluster("cache", Role::Cache, vec![]),
        &[],
        &Paths::default(),
        false,
    );
    assert!(!plain.contains("resolver"), "as before: {plain}");
}

#[test]
fn the_tls_entrypoint_differs_only_in_what_its_watcher_checksums() {
    assert_eq!(build::entrypoint(false, false), ENTRYPOINT);
    let tls = build::entrypoint(true, false);
    assert_eq!(
        tls.matches("cksum \"$conf\" \"$tls_cert\" \"$tls_key\"")
            .count(),
        2
    );
    assert!(!tls.contains("cksum < "));
    assert!(tls.contains("\ntls_cert=/etc/nginx/tls/tls.crt\ntls_key=/etc/nginx/tls/tls.key\n"));
    // Names no other line of the script sets (the resolv.conf loop reads into `key`).
    for name in ["tls_cert", "tls_key"] {
        assert!(!ENTRYPOINT.contains(name), "{name}");
    }
    // Every other line is the plain script's, in order.
    let plain: Vec<&str> = ENTRYPOINT.lines().collect();
    let kept: Vec<&str> = tls.lines().filter(|l| plain.contains(l)).collect();
    let changed = plain
        .iter()
        .filter(|l| !tls.lines().any(|t| t == **l))
        .count();
    assert_eq!(changed, 3, "the two checksums and the message");
    assert_eq!(kept.len(), plain.len() - changed);
    assert_eq!(tls.lines().count(), plain.len() + 3);
}

#[test]
fn the_entrypoint_gives_nginx_the_pods_nameserver() {
    assert!(ENTRYPOINT.contains(&format!(
        "echo \"resolver $resolver valid={};\" > /tmp/{}\n",
        nginx::RESOLVER_VALID,
        nginx::RESOLVER_FILE
    )));
}

#[test]
fn a_cluster_domain_is_checked() {
    assert_eq!(
        sources::parse_cluster_domain("cluster.local").as_deref(),
        Ok("cluster.local")
    );
    assert_eq!(
        sources::parse_cluster_domain("k8s-1.example.internal.").as_deref(),
        Ok("k8s-1.example.internal")
    );
    for bad in [
        "",
        ".",
        "Cluster.Local",
        "cluster..local",
        "-a.local",
        "a b",
        "a_b.local",
    ] {
        let error = sources::parse_cluster_domain(bad).unwrap_err();
        assert!(error.contains("is not a DNS domain"), "{bad:?}: {error}");
    }
}

#[test]
fn nginx_closes_the_requests_in_flight_itself_before_the_pod_is_killed() {
    let pod = |cluster: &CdnCluster| pod_spec(cluster, &Default::default());
    let stop_delay = |cluster: &CdnCluster| {
        pod(cluster).containers[0]
            .lifecycle
            .clone()
            .and_then(|l| l.pre_stop)
            .and_then(|h| h.sleep)
            .map(|s| s.seconds)
    };
    let mut all = seed();
    let (mut cache, balancer) = (all.remove(1), all.remove(0));
    // 60 s of grace by default, of which the stop delay comes first: 12 s for a cache (its
    // parents' nginx look it up again every 5 s, in a DNS that caches for 5 s), 5 s for a balancer
    // (kube-proxy); nginx gets the rest but 3 s.
    assert_eq!(stop_delay(&cache), Some(12));
    assert_eq!(build::shutdown_timeout_seconds(&cache), 45);
    let conf = build::config(&cache, &[], &Paths::default(), false);
    assert!(conf.contains("\nworker_shutdown_timeout 45s;\n"), "{conf}");
    assert_eq!(stop_delay(&balancer), Some(5));
    assert_eq!(build::shutdown_timeout_seconds(&balancer), 52);
    let grace = |seconds: i64| {
        Some(Box::new(crate::api::Pods {
            termination_grace_period_seconds: Some(seconds),
            ..Default::default()
        }))
    };
    cache.spec.pods = grace(600);
    assert_eq!(build::shutdown_timeout_seconds(&cache), 585);
    assert_eq!(pod(&cache).termination_grace_period_seconds, Some(600));
    // A short grace shortens the stop delay, leaving nginx its 3 s.
    cache.spec.pods = grace(10);
    assert_eq!(stop_delay(&cache), Some(7));
    assert_eq!(build::shutdown_timeout_seconds(&cache), 1);
    cache.spec.pods = grace(2);
    assert_eq!(stop_delay(&cache), Some(1));
}

/// A CdnCluster, its Deployment and a pod as a v1.36.2 server and kubelet wrote them.
fn real_node<K: serde::de::DeserializeOwned>(file: &str) -> K {
    let path = format!(
        "{}/tests/fixtures/real-node/{file}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn pod_problem(file: &str) -> Option<crate::kubernetes::problems::Problem> {
    let pod: k8s_openapi::api::core::v1::Pod = real_node(file);
    crate::kubernetes::problems::of_pod(pod.status.as_ref().unwrap())
}

/// The status says why the replicas are not ready, once, in a condition and a Warning; the same
/// world again changes nothing; a pod that recovers clears it.
#[test]
fn replicas_that_cannot_start_are_reported_with_their_reason_once() {
    use crate::reconcile::conditions::{find, is_true};
    let mut c: CdnCluster = real_node("cdncluster-rootimage");
    c.status = None;
    let d: Deployment = real_node("deployment-rootimage");
    let problem = pod_problem("pod-rootimage");
    let observed = Observed::Deployed(Some(&d), problem.as_ref());
    let s = status::desired(&c, observed, &now());
    assert_eq!(s.state, Some(State::Deploying));
    let ready = find(&s.conditions, status::READY).unwrap();
    assert_eq!(
        (
            ready.status.as_str(),
            ready.reason.as_str(),
            ready.message.as_str()
        ),
        (
            "False",
            "CreateContainerConfigError",
            "container nginx cannot start: container has runAsNonRoot and image will run as root"
        )
    );
    assert!(is_true(&s.conditions, status::RECONCILING));
    assert!(
        !is_true(&s.conditions, status::STALLED),
        "the Deployment has not given up: a change elsewhere may yet fix it"
    );
    let n = status::notices(&c, &s, &observed, &[]);
    assert_eq!(
        n.iter().map(|n| (n.reason, n.warning)).collect::<Vec<_>>(),
        [("CreateContainerConfigError", true)]
    );
    assert_eq!(n[0].message, ready.message.to_string());

    c.status = Some(s.clone());
    let again = status::desired(&c, observed, &now());
    assert_eq!(again, s, "the same world: the same status, no write");
    assert!(status::notices(&c, &again, &observed, &[]).is_empty());

    let recovered = Observed::Deployed(Some(&d), None);
    let s = status::desired(&c, recovered, &now());
    let ready = find(&s.conditions, status::READY).unwrap();
    assert_eq!(
        ready.reason.to_string(),
        "Deploying",
        "the problem is cleared"
    );
    assert!(status::notices(&c, &s, &recovered, &[]).is_empty());
}

/// A crash loop whose last lines differ from one restart to the next (seen on a real node: the
/// entrypoint's two failing commands race, either may print last), also after a spec edit (whose
/// rollout leaves the old pods crashing for a while): one problem, so the same status and no
/// Event; another reason is a new problem, with its own message and Warning.
#[test]
fn a_crash_whose_last_lines_change_between_restarts_is_one_problem_until_its_reason_changes() {
    use crate::reconcile::conditions::find;
    let mut c: CdnCluster = real_node("cdncluster-crash");
    c.status = None;
    let d: Deployment = real_node("deployment-crash");
    let first = pod_problem("pod-crash-logs").unwrap();
    assert_eq!(first.reason, "CrashLoopBackOff");
    let observed = Observed::Deployed(Some(&d), Some(&first));
    let s = status::desired(&c, observed, &now());
    assert_eq!(status::notices(&c, &s, &observed, &[]).len(), 1);
    c.status = Some(s.clone());

    let next_restart = crate::kubernetes::problems::Problem {
        message: format!("{} (printed in another order)", first.message),
        ..first.clone()
    };
    let observed = Observed::Deployed(Some(&d), Some(&next_restart));
    let again = status::desired(&c, observed, &now());
    assert_eq!(again, s, "the same reason: the same status, no write");
    assert!(status::notices(&c, &again, &observed, &[]).is_empty());
    c.metadata.generation = Some(c.metadata.generation.unwrap_or(1) + 1);
    let edited = status::desired(&c, observed, &now());
    assert_eq!(
        find(&edited.conditions, status::READY)
            .unwrap()
            .message
            .to_string(),
        first.message,
        "an edit rolling out beside the crashing pods: the same problem"
    );
    assert!(status::notices(&c, &edited, &observed, &[]).is_empty());

    let unpullable = pod_problem("pod-nopull").unwrap();
    let observed = Observed::Deployed(Some(&d), Some(&unpullable));
    let other = status::desired(&c, observed, &now());
    let ready = find(&other.conditions, status::READY).unwrap();
    assert_eq!(ready.message.to_string(), unpullable.message);
    let n = status::notices(&c, &other, &observed, &[]);
    assert_eq!(
        n.iter()
            .map(|n| (n.reason, n.warning, n.message.clone()))
            .collect::<Vec<_>>(),
        [("ImagePullBackOff", true, unpullable.message.clone())]
    );
}

/// A crash loop past the Deployment's progress deadline: the pods' reason, and Stalled.
#[test]
fn a_rollout_past_its_deadline_is_stalled_with_the_pods_reason() {
    use crate::reconcile::conditions::{find, is_true};
    let mut c: CdnCluster = real_node("cdncluster-crash");
    c.status = None;
    let d: Deployment = real_node("deployment-crash");
    let problem = pod_problem("pod-crash-logs");
    let s = status::desired(&c, Observed::Deployed(Some(&d), problem.as_ref()), &now());
    let ready = find(&s.conditions, status::READY).unwrap();
    assert_eq!(ready.reason.to_string(), "CrashLoopBackOff");
    assert!(
        ready.message.contains("cksum: not found"),
        "{}",
        ready.message
    );
    let stalled = find(&s.conditions, status::STALLED).unwrap();
    assert_eq!(
        (stalled.status.as_str(), stalled.reason.as_str()),
        ("True", "ProgressDeadlineExceeded")
    );
    assert!(!is_true(&s.conditions, status::RECONCILING));

    // No pod says more (they are gone, or merely not ready): the deadline is the reason.
    let s = status::desired(&c, Observed::Deployed(Some(&d), None), &now());
    let ready = find(&s.conditions, status::READY).unwrap();
    assert_eq!(ready.reason.to_string(), "ProgressDeadlineExceeded");
}

/// Every replica ready: Running, whatever an old pod on its way out says.
#[test]
fn a_rolled_out_cluster_runs_whatever_a_pod_says() {
    let c = cluster("c", Role::Cache, vec![]);
    let problem = pod_problem("pod-crash");
    let s = status::desired(
        &c,
        Observed::Deployed(Some(&deployment(1, 1, 1, 1)), problem.as_ref()),
        &now(),
    );
    assert_eq!(s.state, Some(State::Running));
}

/// A pod's event reconciles the cluster its instance label names.
#[test]
fn a_pod_is_routed_to_its_cluster_by_its_instance_label() {
    use crate::kubernetes::problems::PodSummary;
    let pod: k8s_openapi::api::core::v1::Pod = real_node("pod-crash");
    let routed = super::cluster_of(PodSummary::of(&pod)).unwrap();
    assert_eq!(
        (routed.name.as_str(), routed.namespace.as_deref()),
        ("crash", Some("fail41"))
    );
    let mut unlabelled = pod;
    unlabelled.metadata.labels = None;
    assert!(super::cluster_of(PodSummary::of(&unlabelled)).is_none());
}

/// Replicas lost with a reason: that reason's Warning, not ReplicasUnavailable as well.
#[test]
fn replicas_lost_for_a_reason_are_told_once_by_that_reason() {
    let mut c: CdnCluster = real_node("cdncluster-nopull");
    let mut running = c.status.clone().unwrap();
    running.state = Some(State::Running);
    running.observed_generation = c.metadata.generation;
    c.status = Some(running);
    let d: Deployment = real_node("deployment-rootimage");
    let problem = pod_problem("pod-nopull");
    let observed = Observed::Deployed(Some(&d), problem.as_ref());
    let s = status::desired(&c, observed, &now());
    let n = status::notices(&c, &s, &observed, &[]);
    assert_eq!(
        n.iter().map(|n| n.reason).collect::<Vec<_>>(),
        ["ImagePullBackOff"]
    );
    let without = Observed::Deployed(Some(&d), None);
    let s = status::desired(&c, without, &now());
    let n = status::notices(&c, &s, &without, &[]);
    assert_eq!(
        n.iter().map(|n| n.reason).collect::<Vec<_>>(),
        ["ReplicasUnavailable"],
        "no reason known: as before"
    );
}

/// A pod deleted without a problem reconciles nothing; one with a problem, even on its way out,
/// reconciles its cluster; any other event the cache passed on does.
#[test]
fn only_the_deletion_of_a_pod_with_a_problem_reconciles() {
    use crate::kubernetes::problems::PodSummary;
    use kube::runtime::watcher::Event;
    let stuck: k8s_openapi::api::core::v1::Pod = real_node("pod-unschedulable");
    let mut leaving = stuck.clone();
    leaving.metadata.deletion_timestamp = stuck.metadata.creation_timestamp.clone();
    let mut fine = stuck.clone();
    fine.status = None;
    assert!(super::tells(&Event::Delete(PodSummary::of(&stuck))));
    assert!(super::tells(&Event::Delete(PodSummary::of(&leaving))));
    assert!(!super::tells(&Event::Delete(PodSummary::of(&fine))));
    assert!(super::tells(&Event::Apply(PodSummary::of(&fine))));
}

fn with_signed_urls(
    mut c: CdnCluster,
    token_name: Option<&str>,
    forward_token: bool,
) -> CdnCluster {
    c.spec.signed_urls = Some(Box::new(SignedUrls {
        secret_name: "edge-token-keys".into(),
        token_name: token_name.map(Into::into),
        forward_token,
    }));
    c
}

#[test]
fn signed_urls_check_every_route_before_any_source_and_keep_the_token_out_of_key_and_origin() {
    let all = seed();
    let edge = with_signed_urls(all[0].clone(), None, false);
    let conf = conf_of(&edge, &all);
    // njs, loaded before anything uses it; the verifier from the ConfigMap, the keys the
    // entrypoint wrote, the shared memory of verified tokens.
    assert!(conf.contains("worker_processes auto;\n# Signed URLs: the tokens are checked by njs.\nload_module modules/ngx_http_js_module.so;\n"));
    for line in [
        "    map $arg___token__ $cdn_token {\n        \"\" $cookie___token__;\n        default $arg___token__;\n    }\n",
        "    js_import cdn_token from /etc/nginx/cdn/token.js;\n",
        "    js_preload_object cdn_token_keys from /tmp/token-keys.json;\n",
        "    js_shared_dict_zone zone=cdn_tokens:4m timeout=10m evict;\n",
        "    js_set $cdn_token_status cdn_token.verify;\n",
    ] {
        assert!(conf.contains(line), "{line:?} in\n{conf}");
    }
    // Every location that asks a source refuses first, and the one for paths no source has too
    // (the seed's balancer has no default); the probes need no token.
    let checks = conf
        .matches("if ($cdn_token_status != ok) {\n                return 403;\n")
        .count();
    assert_eq!(checks, conf.matches("proxy_pass ").count() + 1, "{conf}");
    let health = &conf[conf.find("location = /healthz").unwrap()..];
    assert!(!health[..health.find('}').unwrap()].contains("cdn_token"));
    // The check comes before anything else of the location.
    for location in conf.split("location ~ ").skip(1) {
        let body = location.split_once("{\n").unwrap().1.trim_start();
        assert!(
            body.starts_with("if ($cdn_token_status != ok) {"),
            "{location}"
        );
    }
    // Not in the key, not in the request to the sources, in any case.
    assert!(conf.contains("\"~*^(?<cdn_before_1>.*?)&__token__(?:=[^&]*)?(?<cdn_after_1>&.*)?$\""));
    assert_eq!(
        conf.matches("                set $args $cdn_origin_args;\n")
            .count(),
        2
    );
    assert_eq!(
        conf.matches("proxy_set_header Cookie $cdn_origin_cookie;")
            .count(),
        2
    );
    // The viewer's address is the peer's: no proxy believed by default.
    assert!(!conf.contains("set_real_ip_from"));
    assert!(conf.contains("log_format cdn ") && conf.contains(" token=$cdn_token_status';"));

    // A cache with signed URLs trusts no proxy by default either, and hides the purge tags.
    let cache = with_signed_urls(all[1].clone(), Some("t"), true);
    let cache_conf = conf_of(&cache, &all);
    assert!(!cache_conf.contains("set_real_ip_from"), "{cache_conf}");
    assert!(cache_conf.contains("    map $arg_t $cdn_token {\n        \"\" $cookie_t;\n"));
    // forwardToken: the token goes on to the source, still out of the key.
    assert!(!cache_conf.contains("$cdn_origin_args") && !cache_conf.contains("Cookie $cdn_origin"));
    assert!(cache_conf.contains("&t(?:=[^&]*)?"));
    for header in nginx::SURROGATE_HEADERS {
        assert!(cache_conf.contains(&format!("        proxy_hide_header {header};\n")));
    }
    // An excluded parameter of the same name is one map, not two.
    let mut both = edge.clone();
    both.spec.http = Some(Box::new(HttpSpec {
        excluded_query_parameters: Some(vec!["__token__".into(), "session".into()]),
        ..HttpSpec::default()
    }));
    let both = conf_of(&both, &all);
    assert_eq!(both.matches("__token__(?:=[^&]*)?(?<cdn_after").count(), 1);
    assert!(both.contains("# The query that identifies an object, without session, __token__."));
}

#[test]
fn without_signed_urls_nothing_of_them_but_the_metrics_field() {
    let all = seed();
    let conf = conf_of(&all[1], &all);
    for absent in [
        "js_",
        "load_module",
        "cdn_token",
        "cdn_origin",
        "return 403",
    ] {
        assert!(!conf.contains(absent), "{absent} in\n{conf}");
    }
    // A plain cache keeps the purge tags (the tiers in front read them); a balancer hides them.
    assert!(!conf.contains("Surrogate-Key"));
    let edge = conf_of(&all[0], &all);
    assert!(edge.contains(
        "        proxy_hide_header Surrogate-Key;\n        proxy_hide_header Cache-Tag;\n"
    ));
    // With metrics, the log's last field is `-`.
    let ups = sources::resolve(&all[1], world(&all), sources::DEFAULT_CLUSTER_DOMAIN).unwrap();
    let counted = build::config(&all[1], &ups, &Paths::default(), true);
    assert!(counted.contains("    map \"\" $cdn_token_status {\n        default \"-\";\n    }\n"));
    assert!(
        counted.contains("\\t$cdn_source\\t$cdn_token_status\";"),
        "{counted}"
    );
    let signed = with_signed_urls(
        cluster(
            "c",
            Role::Cache,
            vec![Source::service("s", "store", 80, None)],
        ),
        None,
        false,
    );
    let ups = sources::resolve(&signed, world(&[]), sources::DEFAULT_CLUSTER_DOMAIN).unwrap();
    let counted = build::config(&signed, &ups, &Paths::default(), true);
    assert!(!counted.contains("map \"\" $cdn_token_status"));
    // The metrics' source is set first, so a refusal counts for its route.
    assert!(
        counted.contains(
            "            set $cdn_source \"origin s\";\n            if ($cdn_token_status != ok) {"
        ),
        "{counted}"
    );
}

#[test]
fn signed_urls_ship_the_verifier_mount_the_keys_and_watch_them() {
    let all = seed();
    let edge = with_signed_urls(all[0].clone(), None, false);
    let ups = sources::resolve(&edge, world(&all), sources::DEFAULT_CLUSTER_DOMAIN).unwrap();
    let children = build::children(&edge, &ups, &RunAs::default(), &Default::default());
    let data = children.config_map.data.as_ref().unwrap();
    assert_eq!(data[nginx::TOKEN_SCRIPT], nginx::TOKEN_SCRIPT_SOURCE);
    assert_eq!(data[ENTRYPOINT_KEY], build::entrypoint(false, true));
    let pod = children.workload.template().spec.clone().unwrap();
    let mount = pod.containers[0]
        .volume_mounts
        .as_ref()
        .unwrap()
        .iter()
        .find(|m| m.mount_path == nginx::TOKEN_KEYS_DIR)
        .unwrap();
    assert_eq!(mount.read_only, Some(true));
    let volume = pod
        .volumes
        .as_ref()
        .unwrap()
        .iter()
        .find(|v| v.name == mount.name)
        .unwrap();
    let secret = volume.secret.as_ref().unwrap();
    assert_eq!(secret.secret_name.as_deref(), Some("edge-token-keys"));
    // Every entry, however named; a missing Secret keeps the pod from starting.
    assert_eq!((secret.items.as_ref(), secret.optional), (None, None));
    // Without signed URLs: no verifier, no keys.
    let plain = build::children(&all[0], &ups, &RunAs::default(), &Default::default());
    assert_eq!(plain.config_map.data.as_ref().unwrap().len(), 2);
    let plain_pod = plain.workload.template().spec.clone().unwrap();
    assert!(plain_pod
        .volumes
        .unwrap()
        .iter()
        .all(|v| v.secret.is_none()));
}

#[test]
fn the_signed_urls_entrypoint_writes_the_keys_then_watches_them_with_the_rest() {
    let signed = build::entrypoint(false, true);
    let both = build::entrypoint(true, true);
    for script in [&signed, &both] {
        assert!(
            script.contains("\nkeys_dir=/etc/nginx/token-keys\nscript=/etc/nginx/cdn/token.js\n")
        );
        assert!(script.contains("> /tmp/token-keys.json\n}\nwrite_keys\n"));
        assert!(script.contains("applied=$(watched)"));
        assert!(script.contains("now=$(watched) || continue"));
        assert!(script.contains("write_keys\n            kill -HUP \"$nginx\""));
        assert!(!script.contains("cksum < "));
    }
    assert!(signed.contains(
        "    cksum \"$conf\" || return\n    cksum \"$script\" \"$keys_dir\"/* 2>/dev/null || :\n"
    ));
    assert!(signed.contains("$conf or the token keys changed: reloading nginx"));
    assert!(both.contains("    cksum \"$conf\" \"$tls_cert\" \"$tls_key\" || return\n"));
    assert!(both.contains("$conf, the TLS certificate, or the token keys changed: reloading nginx"));
    // The rest is the plain script's, but the two checksums and the message.
    let start = signed.find("# Signed URLs:").unwrap();
    let end = signed.find("# nginx looks its sources up").unwrap();
    let rest = format!("{}{}", &signed[..start], &signed[end..])
        .replace("write_keys\n            kill -HUP", "kill -HUP");
    assert_eq!(rest.lines().count(), ENTRYPOINT.lines().count());
    let changed = ENTRYPOINT
        .lines()
        .zip(rest.lines())
        .filter(|(plain, signed)| plain != signed)
        .count();
    assert_eq!(changed, 3, "{rest}");
}
