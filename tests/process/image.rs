//! The image as a container runtime runs it: its root filesystem (a fresh copy named by
//! `CDN_OPERATOR_IMAGE_ROOT`, which scripts/check-artifacts.sh extracts from the image it builds
//! with buildah), /etc/hosts and /etc/resolv.conf written as the runtime binds them, /proc, the
//! image's user, and nothing else: no CA certificates, no NSS modules, no nsswitch.conf. The
//! operator must reach a kubeconfig's API server named in /etc/hosts and an OTLP collector named
//! by DNS (a Service's short name through the search list, answered by dnsmasq on loopback), and
//! deliver its spans.

use crate::fake_api::{cluster, FakeApi, FakeState};
use crate::otlp::{Killed, Receiver};
use cdn_operator_testkit::Operator;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The resolver the image's resolv.conf names: a loopback address of its own, port 53.
const DNS: &str = "127.83.0.1";

#[test]
#[ignore = "needs root, dnsmasq and the image's root filesystem: scripts/check-artifacts.sh runs it"]
fn the_image_resolves_its_api_server_and_collector_by_name_and_delivers_spans() {
    let root = PathBuf::from(std::env::var("CDN_OPERATOR_IMAGE_ROOT").expect(
        "CDN_OPERATOR_IMAGE_ROOT must name a copy of the image's root filesystem \
         (scripts/check-artifacts.sh makes one)",
    ));
    let entries: Vec<String> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(entries, ["cdn-operator"], "a fresh copy of the image");

    let receiver = Receiver::start();
    let api = FakeApi::start(FakeState {
        clusters: vec![cluster("origin")],
        ..FakeState::default()
    });
    let dir = tempfile::tempdir().unwrap();
    let queries = dir.path().join("dns.log");
    let _dns = dnsmasq(&queries);

    let etc = root.join("etc");
    std::fs::create_dir_all(&etc).unwrap();
    std::fs::create_dir_all(root.join("proc")).unwrap();
    std::fs::create_dir_all(root.join("dev")).unwrap();
    std::fs::write(
        etc.join("hosts"),
        "127.0.0.1 localhost\n::1 localhost\n127.0.0.1 kube-api.test\n",
    )
    .unwrap();
    std::fs::write(
        etc.join("resolv.conf"),
        format!("nameserver {DNS}\nsearch monitoring.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5\n"),
    )
    .unwrap();
    let kubeconfig = std::fs::read_to_string(&api.kubeconfig).unwrap();
    let by_name = kubeconfig.replace("http://127.0.0.1:", "http://kube-api.test:");
    assert_ne!(by_name, kubeconfig);
    std::fs::write(etc.join("kubeconfig"), by_name).unwrap();

    // A mount namespace of its own for /proc and /dev (/dev/urandom: getrandom's fallback in a
    // static binary), as a runtime mounts them; each step execs the next, so the pid signalled
    // below is the operator's.
    let mut command = Command::new("unshare");
    command
        .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
        .arg(
            r#"root=$1; shift; mount --bind /proc "$root/proc" && mount --bind /dev "$root/dev" \
               && exec chroot --userspec=101:101 "$root" /cdn-operator "$@""#,
        )
        .arg("sh")
        .arg(&root)
        .args([
            "run",
            "--leader-elect=false",
            "--health-probe-bind-address=127.0.0.1:0",
            "--metrics-bind-address=127.0.0.1:0",
            "--log-format=json",
        ])
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("KUBECONFIG", "/etc/kubeconfig")
        .env(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("http://collector:{}", receiver.http),
        )
        .env("OTEL_SERVICE_NAME", "cdn-operator-image");
    let mut operator = Operator::spawn("image", command);
    operator.wait_for(
        "a reconcile through kube-api.test",
        Duration::from_secs(30),
        |_| api.state.lock().unwrap().status_writes_done > 0,
    );
    operator.terminate();
    let status = operator.wait_exit(Duration::from_secs(15));
    assert_eq!(status.code(), Some(0), "logs:\n{}", operator.logs());

    let spans = receiver.spans_once("reconcile");
    assert!(
        spans
            .iter()
            .any(|s| s["name"] == "reconcile" && s["service.name"] == "cdn-operator-image"),
        "spans through http://collector:{}: {spans:#?}\nlogs:\n{}",
        receiver.http,
        operator.logs()
    );
    let log = std::fs::read_to_string(&queries).unwrap();
    assert!(
        log.contains("query[A] collector.monitoring.svc.cluster.local"),
        "the collector's name went through DNS: {log}"
    );
}

/// dnsmasq on [`DNS`]:53 answering `collector.monitoring.svc.cluster.local` with loopback and
/// logging its queries to `log`; killed when dropped.
fn dnsmasq(log: &std::path::Path) -> Killed {
    let mut child = Command::new("dnsmasq")
        .args([
            "--keep-in-foreground",
            "--pid-file=",
            "--no-resolv",
            "--no-hosts",
            "--bind-interfaces",
            "--port=53",
            &format!("--listen-address={DNS}"),
            "--address=/collector.monitoring.svc.cluster.local/127.0.0.1",
            "--log-queries",
        ])
        .arg(format!("--log-facility={}", log.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("dnsmasq (Debian package dnsmasq-base) must be installed");
    let start = Instant::now();
    while !std::fs::read_to_string(log).is_ok_and(|l| l.contains("started")) {
        if let Ok(Some(status)) = child.try_wait() {
            let mut error = String::new();
            std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut error).ok();
            panic!("dnsmasq exited ({status}): {error}");
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "dnsmasq did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    Killed(child)
}
