//! The cluster DNS of the local node (`cluster-dns`, e2e/src/bin/cluster-dns.rs): no CoreDNS is
//! obtainable there, so this answers the pods' queries (the kubelet's `clusterDNS`) for the cluster
//! domain from the Services and EndpointSlices of every namespace, as CoreDNS's kubernetes plugin
//! does for the names the CDN uses. The server is testkit's [`Dns`]; this module computes its
//! [`Records`] from the objects ([`records`]) and keeps them in step with two watches ([`follow`]).
//!
//! Published, for a Service `SVC` of the namespace `NS`, `BASE` being `SVC.NS.svc.DOMAIN`:
//! - with a ClusterIP: `BASE` A → the ClusterIP; `_PORT._PROTO.BASE` SRV → (weight 100, the
//!   Service's port, `BASE`) for each named port (PROTO lower case, `tcp` by default);
//! - headless (`clusterIP: None`): `BASE` A → the addresses of its ready endpoints, every slice
//!   labelled `kubernetes.io/service-name: SVC` merged; `_PORT._PROTO.BASE` SRV → (100/N, the
//!   endpoint's port, `HOST.BASE`) for each of the N ready endpoints with that named port. A
//!   headless Service without any ready endpoint has no name (NXDOMAIN), as with CoreDNS;
//! - either way, `HOST.BASE` A → the endpoint's address, for each ready endpoint; `HOST` is its
//!   `hostname`, or its address with dashes for dots.
//!
//! An endpoint is ready when its `conditions.ready` is true or absent (the EndpointSlice
//! controller sets it true for every endpoint of a Service that publishes not-ready addresses).
//! Only IPv4 is served (AAAA queries get empty answers); ExternalName Services get no record (no
//! CNAME: the node has no upstream DNS to resolve an outside name with anyway); no PTR, no pod
//! records (`A-B-C-D.NS.pod.DOMAIN`), and names out of the domain are NXDOMAIN (nothing is
//! forwarded).

use cdn_operator_testkit::{Dns, Records};
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::reflector::{self, reflector};
use kube::runtime::watcher;
use kube::ResourceExt;
use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

/// The label by which an EndpointSlice names its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// The records of `services` and their `slices` in `domain` (`cluster.local`, no final dot).
pub fn records<'a>(
    services: impl IntoIterator<Item = &'a Service>,
    slices: impl IntoIterator<Item = &'a EndpointSlice>,
    domain: &str,
) -> Records {
    // The ready endpoints of each Service, (namespace, name), from all its slices.
    let mut endpoints: BTreeMap<(String, String), Vec<Ready>> = BTreeMap::new();
    for slice in slices {
        let Some(service) = slice.labels().get(SERVICE_NAME_LABEL) else {
            continue;
        };
        if slice.address_type != "IPv4" {
            continue;
        }
        let key = (slice.namespace().unwrap_or_default(), service.clone());
        let ports: Vec<(String, String, u16)> = slice
            .ports
            .iter()
            .flatten()
            .filter_map(|port| {
                let name = port.name.as_deref().filter(|name| !name.is_empty())?;
                let number = u16::try_from(port.port?).ok()?;
                Some((name.to_string(), protocol(port.protocol.as_deref()), number))
            })
            .collect();
        for endpoint in slice.endpoints.iter().flatten() {
            let ready = endpoint.conditions.as_ref().and_then(|c| c.ready);
            if ready == Some(false) {
                continue;
            }
            for address in &endpoint.addresses {
                let Ok(ip) = address.parse::<Ipv4Addr>() else {
                    continue;
                };
                let host = match endpoint.hostname.as_deref() {
                    Some(hostname) if !hostname.is_empty() => hostname.to_string(),
                    _ => ip.to_string().replace('.', "-"),
                };
                endpoints.entry(key.clone()).or_default().push(Ready {
                    host,
                    ip,
                    ports: ports.clone(),
                });
            }
        }
    }

    let mut records = Records::default();
    for service in services {
        let (namespace, name) = (service.namespace().unwrap_or_default(), service.name_any());
        let Some(spec) = &service.spec else { continue };
        if spec.type_.as_deref() == Some("ExternalName") {
            continue;
        }
        let base = format!("{name}.{namespace}.svc.{domain}");
        let ready = endpoints
            .get(&(namespace, name))
            .map(Vec::as_slice)
            .unwrap_or_default();

        // Each ready endpoint by its own name.
        let mut hosts: BTreeMap<String, BTreeSet<Ipv4Addr>> = BTreeMap::new();
        for endpoint in ready {
            hosts
                .entry(format!("{}.{base}", endpoint.host))
                .or_default()
                .insert(endpoint.ip);
        }
        for (host, ips) in &hosts {
            records.set(host, &ips.iter().copied().collect::<Vec<_>>());
        }

        if spec.cluster_ip.as_deref() == Some("None") {
            if ready.is_empty() {
                continue;
            }
            let ips: BTreeSet<Ipv4Addr> = ready.iter().map(|endpoint| endpoint.ip).collect();
            records.set(&base, &ips.into_iter().collect::<Vec<_>>());
            // Per named port: (port, target), each once.
            let mut srv: BTreeMap<String, BTreeSet<(u16, String)>> = BTreeMap::new();
            for endpoint in ready {
                for (port, protocol, number) in &endpoint.ports {
                    srv.entry(format!("_{port}._{protocol}.{base}"))
                        .or_default()
                        .insert((*number, format!("{}.{base}", endpoint.host)));
                }
            }
            for (name, targets) in &srv {
                // CoreDNS's weights: 100 shared among a name's records.
                let weight = (100 / targets.len()).max(1) as u16;
                let targets: Vec<(u16, u16, &str)> = targets
                    .iter()
                    .map(|(port, target)| (weight, *port, target.as_str()))
                    .collect();
                records.set_srv(name, &targets);
            }
        } else {
            let ips: Vec<Ipv4Addr> = spec
                .cluster_ips
                .iter()
                .flatten()
                .chain(&spec.cluster_ip)
                .filter_map(|ip| ip.parse().ok())
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect();
            if ips.is_empty() {
                continue;
            }
            records.set(&base, &ips);
            for port in spec.ports.iter().flatten() {
                let Some(port_name) = port.name.as_deref().filter(|name| !name.is_empty()) else {
                    continue;
                };
                let Ok(number) = u16::try_from(port.port) else {
                    continue;
                };
                let protocol = protocol(port.protocol.as_deref());
                records.set_srv(
                    &format!("_{port_name}._{protocol}.{base}"),
                    &[(100, number, base.as_str())],
                );
            }
        }
    }
    records
}

/// A ready endpoint of a Service: its name under the Service, its address, and its slice's named
/// ports (name, protocol, port).
struct Ready {
    host: String,
    ip: Ipv4Addr,
    ports: Vec<(String, String, u16)>,
}

/// A port's protocol as an SRV name spells it: lower case, TCP when the object says none.
fn protocol(protocol: Option<&str>) -> String {
    protocol.unwrap_or("TCP").to_ascii_lowercase()
}

/// What changed from `old` to `new`, a line per name whose record set changed:
/// `A NAME = 10.0.0.1 10.0.0.2`, `SRV NAME = 50 8080 TARGET, …`, `A NAME removed`.
pub fn changes(old: &Records, new: &Records) -> Vec<String> {
    let mut lines = Vec::new();
    let text = |ips: &[Ipv4Addr]| -> String {
        let ips: Vec<String> = ips.iter().map(Ipv4Addr::to_string).collect();
        ips.join(" ")
    };
    diff(old.addresses(), new.addresses(), |name, now| {
        lines.push(match now {
            Some(ips) => format!("A {name} = {}", text(ips)),
            None => format!("A {name} removed"),
        });
    });
    let text = |targets: &[(u16, u16, String)]| -> String {
        let targets: Vec<String> = targets
            .iter()
            .map(|(weight, port, target)| format!("{weight} {port} {target}"))
            .collect();
        targets.join(", ")
    };
    diff(old.services(), new.services(), |name, now| {
        lines.push(match now {
            Some(targets) => format!("SRV {name} = {}", text(targets)),
            None => format!("SRV {name} removed"),
        });
    });
    lines
}

/// Calls `changed(name, Some(new value))` for each name of `new` whose value differs from
/// `old`'s, `changed(name, None)` for each name of `old` only; both sorted by name.
fn diff<'a, T: PartialEq + ?Sized + 'a>(
    old: impl Iterator<Item = (&'a str, &'a T)>,
    new: impl Iterator<Item = (&'a str, &'a T)>,
    mut changed: impl FnMut(&str, Option<&T>),
) {
    let old: BTreeMap<&str, &T> = old.collect();
    let new: BTreeMap<&str, &T> = new.collect();
    let names: BTreeSet<&str> = old.keys().chain(new.keys()).copied().collect();
    for name in names {
        match (old.get(name), new.get(name)) {
            (Some(before), Some(now)) if before == now => {}
            (_, Some(now)) => changed(name, Some(now)),
            (Some(_), None) => changed(name, None),
            (None, None) => {}
        }
    }
}

/// Keeps `dns` answering for `domain` from the watch events of Services and EndpointSlices (of
/// every namespace, as `kube::runtime::watcher` gives them), until both streams end (a watcher's
/// never do). Nothing is published before both have listed every object once, so that a
/// headless Service never shows without the endpoints its slices already have; after that each
/// event replaces the whole set of records at once. `log` gets a line per changed name
/// ([`changes`]) and one per watch error (the watcher retries by itself).
pub async fn follow<S, E>(
    services: S,
    slices: E,
    dns: &Dns,
    domain: &str,
    mut log: impl FnMut(String),
) where
    S: Stream<Item = watcher::Result<watcher::Event<Service>>>,
    E: Stream<Item = watcher::Result<watcher::Event<EndpointSlice>>>,
{
    let (service_store, service_writer) = reflector::store();
    let (slice_store, slice_writer) = reflector::store();
    // Which kind each event is of, and whether it ends a (re)list.
    let services = reflector(service_writer, services).map(|event| match event {
        Ok(event) => Ok((Kind::Services, listed(&event))),
        Err(error) => Err(format!("watch of Services: {error} (retrying)")),
    });
    let slices = reflector(slice_writer, slices).map(|event| match event {
        Ok(event) => Ok((Kind::EndpointSlices, listed(&event))),
        Err(error) => Err(format!("watch of EndpointSlices: {error} (retrying)")),
    });
    let mut events = std::pin::pin!(futures::stream::select(services, slices));
    let (mut services_listed, mut slices_listed) = (false, false);
    while let Some(event) = events.next().await {
        match event {
            Ok((Kind::Services, listed)) => services_listed |= listed,
            Ok((Kind::EndpointSlices, listed)) => slices_listed |= listed,
            Err(error) => {
                log(error);
                continue;
            }
        }
        if !(services_listed && slices_listed) {
            continue;
        }
        let (services, slices) = (service_store.state(), slice_store.state());
        let new = records(
            services.iter().map(AsRef::as_ref),
            slices.iter().map(AsRef::as_ref),
            domain,
        );
        let old = dns.records();
        if new != old {
            for line in changes(&old, &new) {
                log(line);
            }
            dns.replace(new);
        }
    }
}

enum Kind {
    Services,
    EndpointSlices,
}

fn listed<K>(event: &watcher::Event<K>) -> bool {
    matches!(event, watcher::Event::InitDone)
}
