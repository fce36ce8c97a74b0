//! A DNS server for tests: nginx's `resolver` (and an upstream's `server NAME resolve;`) looks
//! names up over DNS while it runs, not in /etc/hosts, so a test that changes what a name
//! resolves to needs a server of its own.
//!
//! It answers on loopback UDP from maps the test changes as it goes: names to IPv4 addresses (A
//! records) and service names to their targets (SRV records, as the cluster DNS publishes a
//! Service's named ports), with a short TTL; an empty answer for a known name's other types
//! (AAAA), NXDOMAIN for any other name. A program that computes every name at once (the e2e
//! crate's `cluster-dns`, from a cluster's Services and EndpointSlices) builds [`Records`] and
//! swaps them in with [`Dns::replace`].

use simple_dns::rdata::{RData, A, SRV};
use simple_dns::Name;
use simple_dns::{Packet, PacketFlag, ResourceRecord, CLASS, QTYPE, RCODE, TYPE};
use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// What a server knows, by name (lower case, without the final dot): built whole and swapped in
/// at once with [`Dns::replace`], or changed name by name through [`Dns::set`] and the others.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Records {
    addresses: BTreeMap<String, Vec<Ipv4Addr>>,
    /// SRV targets: (weight, port, target name).
    services: BTreeMap<String, Vec<(u16, u16, String)>>,
}

impl Records {
    /// `name` resolves to `addresses` (none: an empty answer, not NXDOMAIN).
    pub fn set(&mut self, name: &str, addresses: &[Ipv4Addr]) {
        self.addresses.insert(key(name), addresses.to_vec());
    }

    /// `name` has the SRV records `targets`: (weight, port, target), priority 0 (none: an empty
    /// answer, not NXDOMAIN).
    pub fn set_srv(&mut self, name: &str, targets: &[(u16, u16, &str)]) {
        let targets = targets
            .iter()
            .map(|&(weight, port, target)| (weight, port, key(target)))
            .collect();
        self.services.insert(key(name), targets);
    }

    /// `name` is no longer known, for any type.
    pub fn remove(&mut self, name: &str) {
        self.addresses.remove(&key(name));
        self.services.remove(&key(name));
    }

    /// The addresses of `name`, if it has an A record set.
    pub fn address(&self, name: &str) -> Option<&[Ipv4Addr]> {
        self.addresses.get(&key(name)).map(Vec::as_slice)
    }

    /// The SRV targets of `name` (weight, port, target), if it has SRV records set.
    pub fn srv(&self, name: &str) -> Option<&[(u16, u16, String)]> {
        self.services.get(&key(name)).map(Vec::as_slice)
    }

    /// Every name with A records set, and its addresses, by name.
    pub fn addresses(&self) -> impl Iterator<Item = (&str, &[Ipv4Addr])> {
        self.addresses
            .iter()
            .map(|(name, addresses)| (name.as_str(), addresses.as_slice()))
    }

    /// Every name with SRV records set, and its targets, by name.
    pub fn services(&self) -> impl Iterator<Item = (&str, &[(u16, u16, String)])> {
        self.services
            .iter()
            .map(|(name, targets)| (name.as_str(), targets.as_slice()))
    }
}

/// A DNS server on 127.0.0.1, answering from its own thread until dropped.
pub struct Dns {
    addr: SocketAddr,
    records: Arc<Mutex<Records>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Dns {
    /// The TTL of its answers, in seconds: short, so a cache sees a change soon.
    pub const TTL: u32 = 1;

    /// A server on a free port of 127.0.0.1 that knows no name yet.
    pub fn start() -> Dns {
        Dns::start_on("127.0.0.1:0".parse().expect("an address"))
    }

    /// A server on `addr` (port 53 of a loopback address, as a pod's nameserver: resolv.conf
    /// names no port) that knows no name yet.
    pub fn start_on(addr: SocketAddr) -> Dns {
        Dns::try_start_on(addr)
            .unwrap_or_else(|e| panic!("binding the test DNS server to {addr}: {e}"))
    }

    /// [`Dns::start_on`], the error to the caller when `addr` cannot be bound (a program's
    /// `--listen` on an address the host does not have, a port taken).
    pub fn try_start_on(addr: SocketAddr) -> std::io::Result<Dns> {
        let socket = UdpSocket::bind(addr)?;
        // Wakes the thread now and then to see whether it must stop.
        socket.set_read_timeout(Some(Duration::from_millis(50)))?;
        let addr = socket.local_addr()?;
        let records = Arc::new(Mutex::new(Records::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (records, stop) = (records.clone(), stop.clone());
            std::thread::spawn(move || serve(&socket, &records, &stop))
        };
        Ok(Dns {
            addr,
            records,
            stop,
            thread: Some(thread),
        })
    }

    /// Where it listens, e.g. for `resolver 127.0.0.1:PORT`.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `name` now resolves to `addresses` (none: an empty answer, not NXDOMAIN).
    pub fn set(&self, name: &str, addresses: &[Ipv4Addr]) {
        self.records.lock().unwrap().set(name, addresses);
    }

    /// `name` (`_http._tcp.SERVICE…`) now has the SRV records `targets`: (weight, port, target),
    /// priority 0 (none: an empty answer, not NXDOMAIN). The targets' addresses are `set` apart.
    pub fn set_srv(&self, name: &str, targets: &[(u16, u16, &str)]) {
        self.records.lock().unwrap().set_srv(name, targets);
    }

    /// Answers from `records` alone from now on, every name at once: a query sees either the
    /// old set or the new one, never a mix.
    pub fn replace(&self, records: Records) {
        *self.records.lock().unwrap() = records;
    }

    /// What it answers from now.
    pub fn records(&self) -> Records {
        self.records.lock().unwrap().clone()
    }

    /// Publishes the Service `name` (fully qualified) with an address of its own, `ip`, as the
    /// cluster DNS does: its name, and one SRV record of its port `port_name` (80) naming it.
    pub fn publish_service(&self, name: &str, port_name: &str, ip: Ipv4Addr) {
        self.set(name, &[ip]);
        self.set_srv(&format!("_{port_name}._tcp.{name}"), &[(100, 80, name)]);
    }

    /// Publishes the headless Service `name` (fully qualified) with the ready pods at `pods`, as
    /// the cluster DNS does: each pod named by its dashed address under the Service, an SRV
    /// record of the port `port_name` (80) per pod (CoreDNS's weight, 100/N), and the Service's
    /// name with every pod's address.
    pub fn publish_headless(&self, name: &str, port_name: &str, pods: &[Ipv4Addr]) {
        let named: Vec<String> = pods
            .iter()
            .map(|ip| format!("{}.{name}", ip.to_string().replace('.', "-")))
            .collect();
        for (pod, ip) in named.iter().zip(pods) {
            self.set(pod, &[*ip]);
        }
        self.set(name, pods);
        let weight = 100 / pods.len().max(1) as u16;
        let targets: Vec<(u16, u16, &str)> =
            named.iter().map(|pod| (weight, 80, pod.as_str())).collect();
        self.set_srv(&format!("_{port_name}._tcp.{name}"), &targets);
    }

    /// `name` is no longer known, for any type: NXDOMAIN.
    pub fn remove(&self, name: &str) {
        self.records.lock().unwrap().remove(name);
    }
}

impl Drop for Dns {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn key(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

fn serve(socket: &UdpSocket, records: &Mutex<Records>, stop: &AtomicBool) {
    let mut buf = [0u8; 4096];
    while !stop.load(Ordering::Relaxed) {
        let Ok((len, from)) = socket.recv_from(&mut buf) else {
            continue;
        };
        let reply = answer(&buf[..len], &records.lock().unwrap());
        if let Some(reply) = reply {
            let _ = socket.send_to(&reply, from);
        }
    }
}

/// The reply to the query `bytes`; `None` for what is no query (it gets no reply).
fn answer(bytes: &[u8], records: &Records) -> Option<Vec<u8>> {
    let query = Packet::parse(bytes).ok()?;
    if query.has_flags(PacketFlag::RESPONSE) {
        return None;
    }
    let mut reply = Packet::new_reply(query.id());
    reply.set_flags(PacketFlag::AUTHORITATIVE_ANSWER);
    if query.has_flags(PacketFlag::RECURSION_DESIRED) {
        reply.set_flags(PacketFlag::RECURSION_DESIRED);
    }
    for question in &query.questions {
        let name = key(&question.qname.to_string());
        let record =
            |rdata| ResourceRecord::new(question.qname.clone(), CLASS::IN, Dns::TTL, rdata);
        match (
            records.addresses.get(&name),
            records.services.get(&name),
            question.qtype,
        ) {
            (None, None, _) => *reply.rcode_mut() = RCODE::NameError,
            (Some(addresses), _, QTYPE::TYPE(TYPE::A)) => {
                reply.answers.extend(
                    addresses
                        .iter()
                        .map(|&address| record(RData::A(A::from(address)))),
                );
            }
            (_, Some(targets), QTYPE::TYPE(TYPE::SRV)) => {
                for (weight, port, target) in targets {
                    let Ok(target) = Name::new(target) else {
                        continue;
                    };
                    reply.answers.push(record(RData::SRV(SRV {
                        priority: 0,
                        weight: *weight,
                        port: *port,
                        target,
                    })));
                }
            }
            // Known, but not with this type: no data.
            _ => {}
        }
        // A resolver matches the reply to its question.
        reply.questions.push(question.clone());
    }
    reply.build_bytes_vec().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use simple_dns::{Question, QCLASS};

    /// Asks `dns` for `name`'s records of `qtype`: the reply's code, its records as text (an
    /// address; `weight port target` for SRV) and its id.
    fn ask(dns: &Dns, name: &str, qtype: TYPE) -> (RCODE, Vec<String>, u16) {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        socket
            .set_read_timeout(Some(Duration::from_secs(2)))
            .unwrap();
        let mut query = Packet::new_query(0x1234);
        query.set_flags(PacketFlag::RECURSION_DESIRED);
        query.questions.push(Question::new(
            Name::new_unchecked(name),
            qtype.into(),
            QCLASS::CLASS(CLASS::IN),
            false,
        ));
        socket
            .send_to(&query.build_bytes_vec().unwrap(), dns.addr())
            .unwrap();
        let mut buf = [0u8; 4096];
        let len = socket.recv(&mut buf).expect("a reply");
        let reply = Packet::parse(&buf[..len]).unwrap();
        assert!(reply.has_flags(PacketFlag::RESPONSE));
        assert_eq!(reply.questions.len(), 1, "the question is echoed");
        let addresses = reply
            .answers
            .iter()
            .map(|rr| {
                assert_eq!(rr.ttl, Dns::TTL);
                match &rr.rdata {
                    RData::A(a) => Ipv4Addr::from(a.clone()).to_string(),
                    RData::SRV(srv) => {
                        assert_eq!(srv.priority, 0);
                        format!("{} {} {}", srv.weight, srv.port, srv.target)
                    }
                    other => panic!("neither A nor SRV: {other:?}"),
                }
            })
            .collect();
        (reply.rcode(), addresses, reply.id())
    }

    #[test]
    fn answers_from_its_map_as_it_changes() {
        let dns = Dns::start();
        let name = "cache-a-members.default.svc.cluster.local";
        let (a, b) = (Ipv4Addr::new(127, 0, 0, 31), Ipv4Addr::new(127, 0, 0, 32));
        let text = |addresses: &[Ipv4Addr]| -> Vec<String> {
            addresses.iter().map(Ipv4Addr::to_string).collect()
        };
        assert_eq!(ask(&dns, name, TYPE::A).0, RCODE::NameError);

        dns.set(name, &[a, b]);
        assert_eq!(
            ask(&dns, name, TYPE::A),
            (RCODE::NoError, text(&[a, b]), 0x1234)
        );
        // Any case, with or without the final dot.
        let upper = "CACHE-A-MEMBERS.default.svc.cluster.local.";
        assert_eq!(ask(&dns, upper, TYPE::A).1, text(&[a, b]));
        assert_eq!(ask(&dns, name, TYPE::AAAA).0, RCODE::NoError);
        assert_eq!(ask(&dns, name, TYPE::AAAA).1, text(&[]));
        assert_eq!(ask(&dns, name, TYPE::SRV).1, text(&[]));
        assert_eq!(ask(&dns, "other.default.svc", TYPE::A).0, RCODE::NameError);

        dns.set(name, &[b]);
        assert_eq!(ask(&dns, name, TYPE::A).1, text(&[b]));
        dns.set(name, &[]);
        assert_eq!(
            ask(&dns, name, TYPE::A),
            (RCODE::NoError, text(&[]), 0x1234)
        );
        dns.remove(name);
        assert_eq!(ask(&dns, name, TYPE::A).0, RCODE::NameError);
    }

    #[test]
    fn replace_swaps_every_name_at_once() {
        let dns = Dns::start();
        let (a, b) = (Ipv4Addr::new(127, 0, 0, 51), Ipv4Addr::new(127, 0, 0, 52));
        dns.publish_service("old.default.svc.cluster.local", "http", a);

        let mut records = Records::default();
        records.set("New.default.svc.cluster.local.", &[b]);
        records.set_srv(
            "_http._tcp.new.default.svc.cluster.local",
            &[(100, 80, "New.default.svc.cluster.local.")],
        );
        assert_eq!(
            records.address("new.default.svc.cluster.local"),
            Some(&[b][..])
        );
        dns.replace(records.clone());
        assert_eq!(dns.records(), records);

        // The old names are gone, for every type; the new ones answer, keys normalized.
        assert_eq!(
            ask(&dns, "old.default.svc.cluster.local", TYPE::A).0,
            RCODE::NameError
        );
        assert_eq!(
            ask(&dns, "_http._tcp.old.default.svc.cluster.local", TYPE::SRV).0,
            RCODE::NameError
        );
        assert_eq!(
            ask(&dns, "new.default.svc.cluster.local", TYPE::A).1,
            ["127.0.0.52"]
        );
        assert_eq!(
            ask(&dns, "_http._tcp.new.default.svc.cluster.local", TYPE::SRV).1,
            ["100 80 new.default.svc.cluster.local"]
        );
        let names: Vec<&str> = records.addresses().map(|(name, _)| name).collect();
        assert_eq!(names, ["new.default.svc.cluster.local"]);
        let services: Vec<&str> = records.services().map(|(name, _)| name).collect();
        assert_eq!(services, ["_http._tcp.new.default.svc.cluster.local"]);

        dns.replace(Records::default());
        assert_eq!(
            ask(&dns, "new.default.svc.cluster.local", TYPE::A).0,
            RCODE::NameError
        );
    }

    #[test]
    fn answers_srv_records_as_the_cluster_dns_publishes_a_named_port() {
        let dns = Dns::start();
        let service = "_http._tcp.cache-a.default.svc.cluster.local";
        assert_eq!(ask(&dns, service, TYPE::SRV).0, RCODE::NameError);

        dns.set_srv(
            service,
            &[
                (33, 8080, "10-0-0-1.cache-a.default.svc.cluster.local"),
                (33, 8080, "10-0-0-2.cache-a.default.svc.cluster.local."),
            ],
        );
        assert_eq!(
            ask(&dns, service, TYPE::SRV),
            (
                RCODE::NoError,
                vec![
                    "33 8080 10-0-0-1.cache-a.default.svc.cluster.local".to_string(),
                    "33 8080 10-0-0-2.cache-a.default.svc.cluster.local".to_string(),
                ],
                0x1234
            )
        );
        // A service name has no address; the targets' are set apart.
        assert_eq!(
            ask(&dns, service, TYPE::A),
            (RCODE::NoError, vec![], 0x1234)
        );
        dns.set_srv(service, &[]);
        assert_eq!(ask(&dns, service, TYPE::SRV).1, Vec::<String>::new());
        dns.remove(service);
        assert_eq!(ask(&dns, service, TYPE::SRV).0, RCODE::NameError);

        // A headless Service of two ready pods, as CoreDNS publishes it.
        let name = "cache-b.default.svc.cluster.local";
        let (a, b) = (Ipv4Addr::new(127, 0, 0, 41), Ipv4Addr::new(127, 0, 0, 42));
        dns.publish_headless(name, "http", &[a, b]);
        assert_eq!(
            ask(
                &dns,
                "_http._tcp.cache-b.default.svc.cluster.local",
                TYPE::SRV
            )
            .1,
            [
                "50 80 127-0-0-41.cache-b.default.svc.cluster.local",
                "50 80 127-0-0-42.cache-b.default.svc.cluster.local"
            ]
        );
        assert_eq!(
            ask(
                &dns,
                "127-0-0-42.cache-b.default.svc.cluster.local",
                TYPE::A
            )
            .1,
            ["127.0.0.42"]
        );
        assert_eq!(ask(&dns, name, TYPE::A).1, ["127.0.0.41", "127.0.0.42"]);
        // One with an address: its SRV record names the Service itself.
        dns.publish_service(name, "http", a);
        assert_eq!(
            ask(
                &dns,
                "_http._tcp.cache-b.default.svc.cluster.local",
                TYPE::SRV
            )
            .1,
            ["100 80 cache-b.default.svc.cluster.local"]
        );
        assert_eq!(ask(&dns, name, TYPE::A).1, ["127.0.0.41"]);
    }
}
