//! The cluster DNS of the e2e node (`cluster-dns`), without a cluster: its records computed from
//! Services and EndpointSlices as an API server returns them, then its server followed through
//! watch events and asked over UDP, as nginx's resolver asks it.
//!
//! The Services are the ones captured from a v1.36.2 server (tests/fixtures/real-server/: the
//! seed's `balancer` with a ClusterIP, the headless `cache-live` and `cache-vod`, and `cache-live`
//! re-created with an address). The EndpointSlices (e2e/fixtures/cluster-dns/, captured by
//! e2e/capture-cluster-dns-fixtures.sh from a v1.36.2 server) are the endpointslice controller's
//! slices of those Services: `balancer`'s one pod; `cache-live`'s four pods in two slices, a ready
//! and a starting (not ready) one in the first, a ready and a terminating (serving, not ready) one
//! in the second; `cache-vod`'s placeholder (no pod: `endpoints` and `ports` null). Their Services'
//! uids and ClusterIPs are those of the capture's server, not the fixtures': only names join them.

use cdn_operator::cdncluster::nginx::{LISTEN_PORT, SERVICE_PORT_NAME};
use cdn_operator::cdncluster::sources::{service_host, DEFAULT_CLUSTER_DOMAIN, SERVICE_PORT};
use cdn_operator_e2e::cluster_dns::{changes, follow, records};
use cdn_operator_testkit::{Dns, Records};
use futures::channel::mpsc::{unbounded, UnboundedSender};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::watcher::{self, Event};
use serde::de::DeserializeOwned;
use simple_dns::rdata::RData;
use simple_dns::{Name, Packet, PacketFlag, Question, CLASS, QCLASS, RCODE, TYPE};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const NS: &str = "probe";

fn fixture<T: DeserializeOwned>(path: &str) -> T {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()))
}

fn service(name: &str) -> Service {
    fixture(&format!(
        "../tests/fixtures/real-server/service-{name}.json"
    ))
}

/// The address the server gave the balancer's Service when the fixtures were captured.
static BALANCER_IP: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let spec = service("balancer").spec.expect("a Service has a spec");
    spec.cluster_ip
        .expect("the balancer's Service has an address")
});

fn slice(name: &str) -> EndpointSlice {
    fixture(&format!("fixtures/cluster-dns/endpointslice-{name}.json"))
}

/// The fully qualified name of the Service `name` of the test's namespace, as the operator
/// writes it in nginx.conf.
fn host(name: &str) -> String {
    service_host(name, NS, DEFAULT_CLUSTER_DOMAIN)
}

/// The SRV name nginx asks for a pool member's pods (`server HOST service=http resolve`).
fn srv_name(name: &str) -> String {
    format!("_{SERVICE_PORT_NAME}._tcp.{}", host(name))
}

fn ips(ips: &[&str]) -> Vec<Ipv4Addr> {
    ips.iter().map(|ip| ip.parse().unwrap()).collect()
}

fn targets(records: &Records, name: &str) -> Option<Vec<String>> {
    records.srv(name).map(|targets| {
        targets
            .iter()
            .map(|(weight, port, target)| format!("{weight} {port} {target}"))
            .collect()
    })
}

#[test]
fn records_follow_services_and_their_ready_endpoints() {
    let services = [
        service("balancer"),
        service("cache-live"),
        service("cache-vod"),
    ];
    let slices = [
        slice("balancer"),
        slice("cache-live-1"),
        slice("cache-live-2"),
        slice("cache-vod"),
    ];
    let got = records(&services, &slices, DEFAULT_CLUSTER_DOMAIN);

    // A Service with a ClusterIP: its address, and one SRV record naming it, its Service port.
    assert_eq!(
        got.address(&host("balancer")),
        Some(&ips(&[BALANCER_IP.as_str()])[..])
    );
    assert_eq!(
        targets(&got, &srv_name("balancer")),
        Some(vec![format!("100 {SERVICE_PORT} {}", host("balancer"))])
    );
    // Its pod by its dashed address, as CoreDNS answers for an endpoint of any Service.
    assert_eq!(
        got.address(&format!("10-88-0-20.{}", host("balancer"))),
        Some(&ips(&["10.88.0.20"])[..])
    );

    // A headless Service: its ready pods of both slices, neither the starting one nor the
    // terminating one; an SRV record per ready pod, the pod's port, 100 shared.
    assert_eq!(
        got.address(&host("cache-live")),
        Some(&ips(&["10.88.0.11", "10.88.0.13"])[..])
    );
    let pod = |ip: &str| format!("{}.{}", ip.replace('.', "-"), host("cache-live"));
    assert_eq!(
        targets(&got, &srv_name("cache-live")),
        Some(vec![
            format!("50 {LISTEN_PORT} {}", pod("10.88.0.11")),
            format!("50 {LISTEN_PORT} {}", pod("10.88.0.13")),
        ])
    );
    assert_eq!(
        got.address(&pod("10.88.0.11")),
        Some(&ips(&["10.88.0.11"])[..])
    );
    assert_eq!(
        got.address(&pod("10.88.0.13")),
        Some(&ips(&["10.88.0.13"])[..])
    );
    assert_eq!(got.address(&pod("10.88.0.12")), None, "not ready");
    assert_eq!(got.address(&pod("10.88.0.14")), None, "terminating");

    // A headless Service without a ready pod (its placeholder slice, endpoints null): no name,
    // as CoreDNS answers NXDOMAIN for it.
    assert_eq!(got.address(&host("cache-vod")), None);
    assert_eq!(got.srv(&srv_name("cache-vod")), None);

    // Nothing else: the names above are all there is.
    let names: Vec<&str> = got.addresses().map(|(name, _)| name).collect();
    assert_eq!(names.len(), 5, "{names:?}");
    let services_named: Vec<&str> = got.services().map(|(name, _)| name).collect();
    assert_eq!(services_named.len(), 2, "{services_named:?}");

    // A pod's hostname (a StatefulSet's with a subdomain) names it instead of its address; a
    // slice of another address type, or of a Service that does not exist, publishes nothing; an
    // endpoint whose conditions say nothing of readiness is ready.
    let mut named = slice("cache-live-2");
    let endpoints = named.endpoints.as_mut().unwrap();
    endpoints[0].hostname = Some("cache-live-0".into());
    endpoints[1].conditions = None;
    let mut v6 = slice("cache-live-1");
    v6.address_type = "IPv6".into();
    v6.endpoints.as_mut().unwrap()[0].addresses = vec!["fd00::11".into()];
    let mut orphan = slice("balancer");
    orphan
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("kubernetes.io/service-name".into(), "gone".into());
    let got = records(&services, &[named, v6, orphan], DEFAULT_CLUSTER_DOMAIN);
    let pinned = format!("cache-live-0.{}", host("cache-live"));
    assert_eq!(
        targets(&got, &srv_name("cache-live")),
        Some(vec![
            format!("50 {LISTEN_PORT} {}", pod("10.88.0.14")),
            format!("50 {LISTEN_PORT} {pinned}"),
        ])
    );
    assert_eq!(got.address(&pinned), Some(&ips(&["10.88.0.13"])[..]));
    assert_eq!(
        got.address(&host("cache-live")),
        Some(&ips(&["10.88.0.13", "10.88.0.14"])[..])
    );
    assert_eq!(
        got.address(&format!("10-88-0-20.{}", host("balancer"))),
        None
    );
    assert_eq!(
        got.address(&host("balancer")),
        Some(&ips(&[BALANCER_IP.as_str()])[..])
    );

    // An ExternalName Service has no record (no CNAME); a UDP port is `_udp`; another domain.
    let external: Service = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "outside", "namespace": NS},
        "spec": {"type": "ExternalName", "externalName": "origin.example.com"}
    }))
    .unwrap();
    let dns: Service = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "dns", "namespace": "kube-system"},
        "spec": {"clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10"], "type": "ClusterIP",
                 "ports": [{"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53},
                           {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 53},
                           {"port": 9153, "protocol": "TCP", "targetPort": 9153}]}
    }))
    .unwrap();
    let got = records(&[external, dns], &[], "example.internal");
    assert_eq!(got.addresses().count(), 1);
    assert_eq!(
        got.address("dns.kube-system.svc.example.internal"),
        Some(&ips(&["10.96.0.10"])[..])
    );
    assert_eq!(
        targets(&got, "_dns._udp.dns.kube-system.svc.example.internal"),
        Some(vec!["100 53 dns.kube-system.svc.example.internal".into()])
    );
    assert_eq!(
        targets(&got, "_dns-tcp._tcp.dns.kube-system.svc.example.internal"),
        Some(vec!["100 53 dns.kube-system.svc.example.internal".into()])
    );
    assert_eq!(got.services().count(), 2, "an unnamed port has no SRV name");
}

#[test]
fn changes_are_a_line_per_changed_name() {
    let mut old = Records::default();
    old.set("a.ns.svc.cluster.local", &ips(&["10.0.0.1"]));
    old.set("b.ns.svc.cluster.local", &ips(&["10.0.0.2"]));
    old.set_srv(
        "_http._tcp.b.ns.svc.cluster.local",
        &[(100, 80, "b.ns.svc.cluster.local")],
    );
    let mut new = old.clone();
    assert_eq!(changes(&old, &new), Vec::<String>::new());
    new.remove("a.ns.svc.cluster.local");
    new.set("b.ns.svc.cluster.local", &ips(&["10.0.0.2", "10.0.0.3"]));
    new.set_srv(
        "_http._tcp.c.ns.svc.cluster.local",
        &[
            (50, 8080, "x.c.ns.svc.cluster.local"),
            (50, 8080, "y.c.ns.svc.cluster.local"),
        ],
    );
    assert_eq!(
        changes(&old, &new),
        [
            "A a.ns.svc.cluster.local removed",
            "A b.ns.svc.cluster.local = 10.0.0.2 10.0.0.3",
            "SRV _http._tcp.c.ns.svc.cluster.local = 50 8080 x.c.ns.svc.cluster.local, 50 8080 y.c.ns.svc.cluster.local",
        ]
    );
}

/// Asks the server at `server` for `name`'s records of `qtype`, as a resolver does (recursion
/// desired): the reply's code and its records as text (an address; `weight port target`).
async fn ask(server: SocketAddr, name: &str, qtype: TYPE) -> (RCODE, Vec<String>) {
    let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let mut query = Packet::new_query(0x4e2e);
    query.set_flags(PacketFlag::RECURSION_DESIRED);
    query.questions.push(Question::new(
        Name::new_unchecked(name),
        qtype.into(),
        QCLASS::CLASS(CLASS::IN),
        false,
    ));
    socket
        .send_to(&query.build_bytes_vec().unwrap(), server)
        .await
        .unwrap();
    let mut buf = [0u8; 4096];
    let len = tokio::time::timeout(Duration::from_secs(2), socket.recv(&mut buf))
        .await
        .expect("a reply within 2 s")
        .unwrap();
    let reply = Packet::parse(&buf[..len]).unwrap();
    assert_eq!(reply.id(), 0x4e2e);
    let answers = reply
        .answers
        .iter()
        .map(|rr| {
            assert_eq!(rr.ttl, Dns::TTL);
            match &rr.rdata {
                RData::A(a) => Ipv4Addr::from(a.clone()).to_string(),
                RData::SRV(srv) => format!("{} {} {}", srv.weight, srv.port, srv.target),
                other => panic!("neither A nor SRV: {other:?}"),
            }
        })
        .collect();
    (reply.rcode(), answers)
}

/// Asks until the answer is `expected`, for 5 s at most.
async fn until(server: SocketAddr, name: &str, qtype: TYPE, expected: (RCODE, Vec<String>)) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let got = ask(server, name, qtype).await;
        if got == expected {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{name} {qtype:?}: {got:?}, expected {expected:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn answer(items: &[String]) -> (RCODE, Vec<String>) {
    (RCODE::NoError, items.to_vec())
}

fn nxdomain() -> (RCODE, Vec<String>) {
    (RCODE::NameError, vec![])
}

type Feed<K> = UnboundedSender<watcher::Result<Event<K>>>;

fn send<K>(feed: &Feed<K>, events: impl IntoIterator<Item = Event<K>>) {
    for event in events {
        feed.unbounded_send(Ok(event))
            .expect("the follower is running");
    }
}

#[tokio::test]
async fn the_server_follows_watch_events_and_answers_over_udp() {
    let dns = Arc::new(Dns::start());
    let server = dns.addr();
    let (services, service_events) = unbounded();
    let (slices, slice_events) = unbounded();
    let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    let follower = {
        let (dns, lines) = (dns.clone(), lines.clone());
        tokio::spawn(async move {
            follow(
                service_events,
                slice_events,
                &dns,
                DEFAULT_CLUSTER_DOMAIN,
                |line| lines.lock().unwrap().push(line),
            )
            .await
        })
    };
    let text = |items: &[&str]| -> Vec<String> { items.iter().map(|s| s.to_string()).collect() };
    let pod = |ip: &str| format!("{}.{}", ip.replace('.', "-"), host("cache-live"));
    let live_srv = |ips: &[&str]| -> Vec<String> {
        let weight = 100 / ips.len();
        ips.iter()
            .map(|ip| format!("{weight} {LISTEN_PORT} {}", pod(ip)))
            .collect()
    };

    // The Services listed, the slices not yet: nothing is published, not even the Service with
    // an address (a headless one would show without its pods).
    send(
        &services,
        [
            Event::Init,
            Event::InitApply(service("balancer")),
            Event::InitApply(service("cache-live")),
            Event::InitApply(service("cache-vod")),
            Event::InitDone,
        ],
    );
    send(
        &slices,
        [
            Event::Init,
            Event::InitApply(slice("balancer")),
            Event::InitApply(slice("cache-live-1")),
        ],
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(ask(server, &host("balancer"), TYPE::A).await, nxdomain());

    // Both listed: every name at once.
    send(
        &slices,
        [
            Event::InitApply(slice("cache-live-2")),
            Event::InitApply(slice("cache-vod")),
            Event::InitDone,
        ],
    );
    until(
        server,
        &host("balancer"),
        TYPE::A,
        answer(&text(&[BALANCER_IP.as_str()])),
    )
    .await;
    assert_eq!(
        ask(server, &srv_name("balancer"), TYPE::SRV).await,
        answer(&[format!("100 {SERVICE_PORT} {}", host("balancer"))])
    );
    assert_eq!(
        ask(server, &host("cache-live"), TYPE::A).await,
        answer(&text(&["10.88.0.11", "10.88.0.13"]))
    );
    assert_eq!(
        ask(server, &srv_name("cache-live"), TYPE::SRV).await,
        answer(&live_srv(&["10.88.0.11", "10.88.0.13"]))
    );
    // What nginx asks next: each SRV target's address.
    assert_eq!(
        ask(server, &pod("10.88.0.13"), TYPE::A).await,
        answer(&text(&["10.88.0.13"]))
    );
    assert_eq!(ask(server, &pod("10.88.0.12"), TYPE::A).await, nxdomain());
    assert_eq!(ask(server, &host("cache-vod"), TYPE::A).await, nxdomain());
    // Any case, the final dot; AAAA of a known name is empty, not NXDOMAIN (glibc asks both).
    assert_eq!(
        ask(server, &format!("{}.", host("Balancer")), TYPE::A).await,
        answer(&text(&[BALANCER_IP.as_str()]))
    );
    assert_eq!(
        ask(server, &host("balancer"), TYPE::AAAA).await,
        answer(&[])
    );
    assert_eq!(ask(server, "example.com", TYPE::A).await, nxdomain());
    assert!(
        lines
            .lock()
            .unwrap()
            .contains(&format!("A {} = 10.88.0.11 10.88.0.13", host("cache-live"))),
        "{:?}",
        lines.lock().unwrap()
    );

    // The starting pod becomes ready: a third SRV record, 100 shared in three.
    let mut ready = slice("cache-live-1");
    ready.endpoints.as_mut().unwrap()[1]
        .conditions
        .as_mut()
        .unwrap()
        .ready = Some(true);
    send(&slices, [Event::Apply(ready.clone())]);
    let three = ["10.88.0.11", "10.88.0.12", "10.88.0.13"];
    until(
        server,
        &srv_name("cache-live"),
        TYPE::SRV,
        answer(&live_srv(&three)),
    )
    .await;
    assert_eq!(
        ask(server, &host("cache-live"), TYPE::A).await,
        answer(&text(&three))
    );

    // A slice deleted: its pods' names go.
    send(&slices, [Event::Delete(slice("cache-live-2"))]);
    let two = ["10.88.0.11", "10.88.0.12"];
    until(
        server,
        &srv_name("cache-live"),
        TYPE::SRV,
        answer(&live_srv(&two)),
    )
    .await;
    assert_eq!(ask(server, &pod("10.88.0.13"), TYPE::A).await, nxdomain());

    // The headless Service deleted: every name of it goes, its pods' too. Created again with an
    // address: its ClusterIP, and one SRV record naming the Service with its own port.
    send(&services, [Event::Delete(service("cache-live"))]);
    until(server, &host("cache-live"), TYPE::A, nxdomain()).await;
    assert_eq!(
        ask(server, &srv_name("cache-live"), TYPE::SRV).await,
        nxdomain()
    );
    assert_eq!(ask(server, &pod("10.88.0.11"), TYPE::A).await, nxdomain());
    send(
        &services,
        [Event::Apply(service("cache-live-with-address"))],
    );
    until(
        server,
        &host("cache-live"),
        TYPE::A,
        answer(&text(&["10.96.21.73"])),
    )
    .await;
    assert_eq!(
        ask(server, &srv_name("cache-live"), TYPE::SRV).await,
        answer(&[format!("100 {SERVICE_PORT} {}", host("cache-live"))])
    );

    // The Services' watch restarted and listing only the balancer: what it no longer lists
    // was deleted meanwhile.
    send(
        &services,
        [
            Event::Init,
            Event::InitApply(service("balancer")),
            Event::InitDone,
        ],
    );
    until(server, &host("cache-live"), TYPE::A, nxdomain()).await;
    assert_eq!(
        ask(server, &host("balancer"), TYPE::A).await,
        answer(&text(&[BALANCER_IP.as_str()]))
    );

    // A watch error (the watcher relists by itself): a line, and the names stay.
    slices
        .unbounded_send(Err(watcher::Error::NoResourceVersion))
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !lines
        .lock()
        .unwrap()
        .iter()
        .any(|line| line.starts_with("watch of EndpointSlices: "))
    {
        assert!(Instant::now() < deadline, "{:?}", lines.lock().unwrap());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        ask(server, &host("balancer"), TYPE::A).await,
        answer(&text(&[BALANCER_IP.as_str()]))
    );

    // The last Service deleted: nothing is left.
    send(&services, [Event::Delete(service("balancer"))]);
    until(server, &host("balancer"), TYPE::A, nxdomain()).await;
    assert_eq!(
        ask(server, &srv_name("balancer"), TYPE::SRV).await,
        nxdomain()
    );
    assert_eq!(dns.records(), Records::default());
    {
        let lines = lines.lock().unwrap();
        assert!(
            lines.contains(&format!("A {} removed", host("balancer"))),
            "{lines:?}"
        );
        assert!(
            lines.contains(&format!("SRV {} removed", srv_name("balancer"))),
            "{lines:?}"
        );
    }

    // Both watches ended: so does the follower.
    drop((services, slices));
    tokio::time::timeout(Duration::from_secs(5), follower)
        .await
        .expect("the follower ends with its streams")
        .unwrap();
}
