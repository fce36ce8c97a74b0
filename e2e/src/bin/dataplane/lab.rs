//! The lab: where the topology's pods and the origin listen on loopback, what every column shares
//! ([`Setup`]), the benchmark's own network namespace and its count of accepted connections, and
//! the names as a cluster resolves them (the DNS server, the sandboxes' /etc/hosts).

use cdn_operator::cdncluster::nginx::SERVICE_PORT_NAME;
use cdn_operator::purge::signing::Signer;
use cdn_operator_testkit::Dns;
use std::collections::BTreeMap;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};

use crate::util::chmod;

/// The Host of the requests (but row 3's).
pub(crate) const HOST: &str = "cdn.test";
/// The namespace of the topology's CdnClusters.
pub(crate) const NAMESPACE: &str = "default";
/// The pods: CdnCluster and address, parents before sources.
pub(crate) const PODS: [(&str, &str); 3] = [
    ("edge", "127.0.0.10"),
    ("cache-1", "127.0.0.11"),
    ("cache-2", "127.0.0.12"),
];
pub(crate) const EDGE: &str = "127.0.0.10:80";
pub(crate) const ORIGIN_IP: &str = "127.0.0.20";
pub(crate) const ORIGIN: &str = "127.0.0.20:8080";
pub(crate) const ORIGIN_STATUS: &str = "127.0.0.20:8081";
pub(crate) const DIRECT: &str = "127.0.0.30:80";
/// The metrics image the topology is rendered with by row 2m: the binary under test runs as the
/// sidecar, at the image's entrypoint.
pub(crate) const METRICS_IMAGE: &str = "cdn-operator-under-test";
pub(crate) const IMAGE_ENTRYPOINT: &str = "/cdn-operator";
/// The port of the metrics sidecar, moved to the pod's address as nginx's listen line is.
pub(crate) const METRICS_PORT: u16 = 9113;
/// The uid and gid of the nginx-unprivileged image, which the pods run as.
pub(crate) const POD_USER: (u32, u32) = (101, 101);
/// Row 2s: the Secret of the balancer's signed URLs, and its one key.
pub(crate) const TOKEN_SECRET: &str = "edge-token-keys";
pub(crate) const TOKEN_KEY: &str =
    "5d0c1f7a9e3b2d4c6a8f0e1d3c5b7a9f1e2d3c4b5a6978695a4b3c2d1e0f1a2b";

/// What every column shares.
pub(crate) struct Setup {
    pub(crate) hosts: PathBuf,
    pub(crate) resolv_conf: PathBuf,
    /// Answers the pods' lookups while it lives; row 15 scales a cache in it.
    pub(crate) dns: Dns,
    pub(crate) www: PathBuf,
    /// Whether the run has a network namespace of its own (then the pods run as [`POD_USER`]).
    pub(crate) isolated: bool,
    pub(crate) wrk_seconds: u64,
    pub(crate) wrk_rounds: u32,
    /// The rows to run; empty: all.
    pub(crate) only: Vec<String>,
    pub(crate) has_wrk: bool,
    /// The benchmark's purge key, in the place of the operator's: its public half goes into each
    /// cache pod's ConfigMap, as the operator puts its own there.
    pub(crate) signer: Signer,
    /// The Secrets the pods mount: name, then file name and content.
    pub(crate) secrets: BTreeMap<String, BTreeMap<String, String>>,
}

impl Setup {
    /// The pods' uid and gid; `None`: root.
    pub(crate) fn user(&self) -> Option<(u32, u32)> {
        self.isolated.then_some(POD_USER)
    }

    /// Whether row `id` runs (`--only`).
    pub(crate) fn runs(&self, id: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|o| o == id)
    }
}

/// Moves the process into a network namespace of its own with its loopback up, and lets any uid
/// listen on ports below 1024 there.
pub(crate) fn private_network() -> io::Result<()> {
    // SAFETY: unshare(2) takes no pointers; called before any other thread exists.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a socket used only for the interface ioctls below, closed at the end; `request` is
    // a zeroed ifreq naming "lo", which both ioctls read and the first one fills.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut request: libc::ifreq = std::mem::zeroed();
        for (to, from) in request.ifr_name.iter_mut().zip(b"lo\0") {
            *to = *from as libc::c_char;
        }
        let mut result = libc::ioctl(
            fd,
            libc::SIOCGIFFLAGS as _,
            &mut request as *mut libc::ifreq,
        );
        if result == 0 {
            request.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
            result = libc::ioctl(fd, libc::SIOCSIFFLAGS as _, &request as *const libc::ifreq);
        }
        let error = io::Error::last_os_error();
        libc::close(fd);
        if result != 0 {
            return Err(error);
        }
    }
    std::fs::write("/proc/sys/net/ipv4/ip_unprivileged_port_start", "0")
}

/// The kernel's count of accepted TCP connections (the benchmark's network namespace's).
pub(crate) fn passive_opens(setup: &Setup) -> Option<u64> {
    if !setup.isolated {
        return None;
    }
    let snmp = std::fs::read_to_string("/proc/net/snmp").ok()?;
    let mut tcp = snmp.lines().filter(|l| l.starts_with("Tcp:"));
    let (names, values) = (tcp.next()?, tcp.next()?);
    let at = names.split_whitespace().position(|n| n == "PassiveOpens")?;
    values.split_whitespace().nth(at)?.parse().ok()
}

/// The cluster's DNS server (port 53 of 127.0.0.53) with the Services' fully qualified names, and
/// the resolv.conf that names it.
pub(crate) fn cluster_dns(dir: &Path) -> (Dns, PathBuf) {
    let dns = Dns::start_on(SocketAddr::from(([127, 0, 0, 53], 53)));
    for (cluster, ip) in PODS.iter().chain([&("origin", ORIGIN_IP)]) {
        // The caches' Services are headless, as the operator makes them.
        publish(&dns, cluster, cluster.starts_with("cache-"), &[ip]);
    }
    let path = dir.join("resolv.conf");
    std::fs::write(&path, "nameserver 127.0.0.53\n").expect("writing resolv.conf");
    chmod(&path, 0o644);
    (dns, path)
}

/// Publishes the Service `service` of the namespace `default` with the ready pods at `ips`, as
/// the cluster DNS does: headless (a cache's) or with an address of its own (`ips[0]`).
pub(crate) fn publish(dns: &Dns, service: &str, headless: bool, ips: &[&str]) {
    let name = format!("{service}.default.svc.cluster.local");
    let ips: Vec<Ipv4Addr> = ips
        .iter()
        .map(|ip| ip.parse().expect("an IPv4 address"))
        .collect();
    if headless {
        dns.publish_headless(&name, SERVICE_PORT_NAME, &ips);
    } else {
        dns.publish_service(&name, SERVICE_PORT_NAME, ips[0]);
    }
}

/// The sandboxes' /etc/hosts: the Services' names on loopback addresses.
pub(crate) fn hosts_file(dir: &Path) -> PathBuf {
    let mut text = String::from("127.0.0.1 localhost\n::1 localhost\n");
    for (cluster, ip) in PODS {
        text.push_str(&format!("{ip} {cluster}.default.svc\n"));
    }
    text.push_str(&format!("{ORIGIN_IP} origin.default.svc\n"));
    let path = dir.join("hosts");
    std::fs::write(&path, text).expect("writing hosts");
    chmod(&path, 0o644);
    path
}
