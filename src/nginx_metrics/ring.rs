//! Whether nginx holds every ready pod of its sources: the pod's readiness (issue 51).
//!
//! nginx finds the pods of a CdnCluster source by the SRV records of its Service (`server NAME
//! service=http resolve`), looked up when its workers start and again when the answer is older
//! than the resolver's `valid=` (5 s). A pod that served as soon as nginx listened would serve
//! with no member yet for a source whose pods were not ready when it looked (answering 502), or
//! with a ring that lacks the pods that became ready since (sending objects to caches that do not
//! hold them, which then fetch them again). No nginx of the stock image tells what it holds, so
//! this reads it from nginx's own rule: the sidecar asks the same server the same names; an answer
//! that has not changed for longer than `valid` since nginx started is the one nginx holds. The
//! pod is ready from then on, and as long as nginx answers: a later change of its sources (a cache
//! scaled, a pod replaced) is followed by nginx within `valid` and never makes it unready, so a
//! source's trouble cannot empty a balancer's Service.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

/// The SRV names nginx looks up for `conf`'s `server NAME service=SERVICE resolve` lines:
/// `_SERVICE._tcp.NAME` (or `SERVICE.NAME` when it names the protocol itself, as nginx reads it).
pub fn lookups(conf: &str) -> Vec<String> {
    let mut names: Vec<String> = conf
        .lines()
        .filter_map(|line| {
            let mut words = line.trim().trim_end_matches(';').split_whitespace();
            (words.next()? == "server").then_some(())?;
            let name = words.next()?;
            let rest: Vec<&str> = words.collect();
            rest.contains(&"resolve").then_some(())?;
            let service = rest.iter().find_map(|w| w.strip_prefix("service="))?;
            Some(if service.starts_with('_') {
                format!("{service}.{name}")
            } else {
                format!("_{service}._tcp.{name}")
            })
        })
        .collect();
    names.sort();
    names.dedup();
    names
}

/// nginx's resolver, from the file the entrypoint writes for it (`resolver ADDRESS [ipv6=off]
/// valid=5s;`): its first address and how long nginx keeps an answer.
pub fn resolver(text: &str) -> Option<(SocketAddr, Duration)> {
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with("resolver"))?;
    let mut words = line.trim().trim_end_matches(';').split_whitespace().skip(1);
    let address = words.next()?;
    let ip: IpAddr = address
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .ok()?;
    let valid = words
        .find_map(|w| w.strip_prefix("valid="))
        .and_then(seconds)?;
    Some((SocketAddr::new(ip, 53), valid))
}

/// nginx's time syntax as the entrypoint writes it: `5s`, `1m`, `500ms`, bare seconds.
fn seconds(value: &str) -> Option<Duration> {
    let (number, unit) = value
        .find(|c: char| !c.is_ascii_digit())
        .map_or((value, ""), |at| value.split_at(at));
    let n: u64 = number.parse().ok()?;
    match unit {
        "" | "s" => Some(Duration::from_secs(n)),
        "ms" => Some(Duration::from_millis(n)),
        "m" => Some(Duration::from_secs(n * 60)),
        _ => None,
    }
}

/// What nginx answered and when each name's answer was last seen to change.
#[derive(Debug, Default)]
pub struct Watch {
    /// Since when nginx answers, without a gap.
    nginx_since: Option<Instant>,
    /// Per SRV name: its records (sorted), and when they were first seen so.
    answers: BTreeMap<String, (Vec<String>, Instant)>,
    /// Ready once: it stays so while nginx answers.
    ready: bool,
}

impl Watch {
    /// Whether it was ready: it stays so while nginx answers.
    pub fn is_ready(&self) -> bool {
        self.ready
    }

    /// nginx answered (`up`) or not at `now`: a gap starts its time again, and its readiness.
    pub fn nginx(&mut self, up: bool, now: Instant) {
        if !up {
            self.nginx_since = None;
            self.ready = false;
        } else if self.nginx_since.is_none() {
            self.nginx_since = Some(now);
        }
    }

    /// `name` answered `records` (None: no answer, which says nothing) at `now`.
    pub fn answer(&mut self, name: &str, records: Option<Vec<String>>, now: Instant) {
        let Some(mut records) = records else { return };
        records.sort();
        match self.answers.get(name) {
            Some((seen, _)) if *seen == records => {}
            _ => {
                self.answers.insert(name.to_string(), (records, now));
            }
        }
    }

    /// Whether the pod is ready at `now` for the lookups `names`, nginx keeping answers `valid`:
    /// `Err` says what it waits for.
    pub fn ready(&mut self, names: &[String], valid: Duration, now: Instant) -> Result<(), String> {
        let Some(since) = self.nginx_since else {
            return Err("nginx does not answer yet".into());
        };
        if self.ready {
            return Ok(());
        }
        // nginx looks a name up when it starts, then when its answer is older than `valid`: an
        // answer unchanged for `valid` since nginx started (a second more for this side's own
        // lookups, a second apart) is the one it holds.
        let settle = valid + Duration::from_secs(1);
        let mut waiting = Vec::new();
        for name in names {
            match self.answers.get(name) {
                None => waiting.push(format!("{name}: no answer yet")),
                Some((_, changed)) => {
                    let stable = now.saturating_duration_since((*changed).max(since));
                    if stable < settle {
                        waiting.push(format!(
                            "{name}: nginx may not hold its answer yet ({:.1} s of {:.0} s)",
                            stable.as_secs_f64(),
                            settle.as_secs_f64()
                        ));
                    }
                }
            }
        }
        if waiting.is_empty() {
            self.ready = true;
            Ok(())
        } else {
            Err(waiting.join("; "))
        }
    }
}

/// The SRV records of `name` from `server`: `weight port target` each, sorted; an empty list for
/// no record (NXDOMAIN too: a Service with no ready pod); `None` when no answer came.
pub async fn srv(server: SocketAddr, name: &str) -> Option<Vec<String>> {
    ask(server, name, simple_dns::TYPE::SRV).await
}

/// The IPv4 addresses (A records) of `name` from `server`, as [`srv`] answers.
pub async fn addresses(server: SocketAddr, name: &str) -> Option<Vec<String>> {
    ask(server, name, simple_dns::TYPE::A).await
}

/// One question of type `kind` over UDP, the records of that type in the answer as text, sorted.
async fn ask(server: SocketAddr, name: &str, kind: simple_dns::TYPE) -> Option<Vec<String>> {
    use simple_dns::rdata::RData;
    use simple_dns::{Name, Packet, PacketFlag, Question, CLASS, QCLASS, RCODE};
    let bind: SocketAddr = if server.is_ipv4() {
        "0.0.0.0:0".parse().ok()?
    } else {
        "[::]:0".parse().ok()?
    };
    let socket = tokio::net::UdpSocket::bind(bind).await.ok()?;
    let id = (std::process::id() as u16) ^ (name.len() as u16);
    let mut query = Packet::new_query(id);
    query.set_flags(PacketFlag::RECURSION_DESIRED);
    query.questions.push(Question::new(
        Name::new(name).ok()?,
        kind.into(),
        QCLASS::CLASS(CLASS::IN),
        false,
    ));
    socket
        .send_to(&query.build_bytes_vec().ok()?, server)
        .await
        .ok()?;
    let mut buf = [0u8; 4096];
    let reply = loop {
        let len = tokio::time::timeout(Duration::from_secs(1), socket.recv(&mut buf))
            .await
            .ok()?
            .ok()?;
        match Packet::parse(&buf[..len]) {
            Ok(reply) if reply.id() == id => break reply,
            _ => continue,
        }
    };
    match reply.rcode() {
        RCODE::NoError | RCODE::NameError => {}
        _ => return None,
    }
    let mut records: Vec<String> = reply
        .answers
        .iter()
        .filter_map(|rr| match &rr.rdata {
            RData::SRV(srv) if kind == simple_dns::TYPE::SRV => {
                Some(format!("{} {} {}", srv.weight, srv.port, srv.target))
            }
            RData::A(a) if kind == simple_dns::TYPE::A => {
                Some(std::net::Ipv4Addr::from(a.clone()).to_string())
            }
            _ => None,
        })
        .collect();
    records.sort();
    Some(records)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONF: &str = "\
    upstream cdn_pool_0 {
        zone cdn_pool_0 256k;
        hash $cdn_key consistent;
        server cache-a.ns.svc.cluster.local service=http resolve weight=2 max_fails=2 fail_timeout=5s;
        server cache-b.ns.svc.cluster.local service=http resolve weight=4 max_fails=2 fail_timeout=5s;
    }
    upstream cdn_origin_1 {
        server origin.ns.svc.cluster.local:8080 resolve;
        server 10.0.0.1:80;
    }
    upstream cdn_other {
        server cache-a.ns.svc.cluster.local service=http resolve;
        server shield.ns.svc.cluster.local service=_https._tcp resolve;
    }
";

    #[test]
    fn the_lookups_are_the_srv_names_of_the_resolved_server_lines() {
        assert_eq!(
            lookups(CONF),
            [
                "_http._tcp.cache-a.ns.svc.cluster.local",
                "_http._tcp.cache-b.ns.svc.cluster.local",
                "_https._tcp.shield.ns.svc.cluster.local",
            ]
        );
        assert!(lookups("server origin:8080 resolve;").is_empty());
    }

    #[test]
    fn the_resolver_is_read_as_the_entrypoint_writes_it() {
        assert_eq!(
            resolver("resolver 10.96.0.10 ipv6=off valid=5s;\n"),
            Some(("10.96.0.10:53".parse().unwrap(), Duration::from_secs(5)))
        );
        assert_eq!(
            resolver("resolver [fd00::a] ipv4=off valid=500ms;\n"),
            Some(("[fd00::a]:53".parse().unwrap(), Duration::from_millis(500)))
        );
        assert_eq!(resolver("resolver 10.96.0.10;\n"), None);
        assert_eq!(resolver(""), None);
    }

    fn names() -> Vec<String> {
        vec!["_http._tcp.a".into(), "_http._tcp.b".into()]
    }

    #[test]
    fn ready_once_every_answer_is_older_than_nginx_keeps_it_since_nginx_answers() {
        let valid = Duration::from_secs(5);
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut watch = Watch::default();
        assert!(watch.ready(&names(), valid, at(0)).is_err(), "nginx not up");
        watch.nginx(true, at(1));
        watch.answer("_http._tcp.a", Some(vec!["50 8080 pod-1.a".into()]), at(1));
        // b has no answer yet: a lookup that failed says nothing.
        watch.answer("_http._tcp.b", None, at(1));
        let waiting = watch.ready(&names(), valid, at(2)).unwrap_err();
        assert!(waiting.contains("_http._tcp.b: no answer yet"), "{waiting}");
        // b has no pod ready: an empty answer is an answer.
        watch.answer("_http._tcp.b", Some(vec![]), at(2));
        // a gains a pod at 4: nginx may still hold the old answer until 4 + 5.
        watch.answer(
            "_http._tcp.a",
            Some(vec!["50 8080 pod-2.a".into(), "50 8080 pod-1.a".into()]),
            at(4),
        );
        // The same records in another order: no change.
        watch.answer(
            "_http._tcp.a",
            Some(vec!["50 8080 pod-1.a".into(), "50 8080 pod-2.a".into()]),
            at(5),
        );
        let waiting = watch.ready(&names(), valid, at(9)).unwrap_err();
        assert!(
            waiting.starts_with("_http._tcp.a: nginx may not hold"),
            "{waiting}"
        );
        assert!(watch.ready(&names(), valid, at(10)).is_ok());
        // Once ready, a change of the sources does not make it unready.
        watch.answer(
            "_http._tcp.b",
            Some(vec!["100 8080 pod-1.b".into()]),
            at(11),
        );
        assert!(watch.ready(&names(), valid, at(11)).is_ok());
        // nginx restarting does, and the wait starts again from its answer.
        watch.nginx(false, at(12));
        assert!(watch.ready(&names(), valid, at(12)).is_err());
        watch.nginx(true, at(13));
        assert!(watch.ready(&names(), valid, at(18)).is_err());
        assert!(watch.ready(&names(), valid, at(19)).is_ok());
    }

    #[test]
    fn without_lookups_ready_as_soon_as_nginx_answers() {
        let mut watch = Watch::default();
        let now = Instant::now();
        watch.nginx(true, now);
        assert!(watch.ready(&[], Duration::from_secs(5), now).is_ok());
    }

    #[tokio::test]
    async fn srv_and_a_records_are_asked_over_udp() {
        let dns = cdn_operator_testkit::Dns::start();
        dns.set_srv(
            "_http._tcp.cache.ns.svc.cluster.local",
            &[(50, 8080, "10-0-0-2.cache.ns.svc.cluster.local")],
        );
        assert_eq!(
            srv(dns.addr(), "_http._tcp.cache.ns.svc.cluster.local").await,
            Some(vec![
                "50 8080 10-0-0-2.cache.ns.svc.cluster.local".to_string()
            ])
        );
        assert_eq!(
            srv(dns.addr(), "_http._tcp.none.ns.svc.cluster.local").await,
            Some(vec![])
        );
        dns.set(
            "cache.ns.svc.cluster.local",
            &["10.0.0.3".parse().unwrap(), "10.0.0.2".parse().unwrap()],
        );
        assert_eq!(
            addresses(dns.addr(), "cache.ns.svc.cluster.local").await,
            Some(vec!["10.0.0.2".to_string(), "10.0.0.3".to_string()])
        );
        // No server there: no answer, not an empty one.
        let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        assert_eq!(
            srv(silent.local_addr().unwrap(), "_http._tcp.cache").await,
            None
        );
    }
}
