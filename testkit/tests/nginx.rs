//! The runner's nginx (1.30, as the pods run it) and the test DNS server together: what the
//! product relies on to follow a pool's members, an upstream whose `server NAME resolve;` nginx
//! looks up again while it runs.

use cdn_operator_testkit::nginx::{self, static_server_config, Nginx, Sandbox};
use cdn_operator_testkit::{request, Dns, Response};
use std::net::Ipv4Addr;
use std::path::Path;
use std::time::{Duration, Instant};

const MEMBERS: &str = "cache-a-members.default.svc.cluster.local";
const BACKEND_PORT: u16 = 8081;

/// A backend at `ip`:8081 answering /who with its `name`.
fn backend(sandbox: &Sandbox, dir: &Path, name: &str, ip: Ipv4Addr) -> Nginx {
    let root = dir.join(name);
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(root.join("who"), name).unwrap();
    let addr = format!("{ip}:{BACKEND_PORT}");
    let conf = static_server_config(&root, dir, &addr);
    Nginx::start(sandbox, name, &conf, dir, &addr)
}

fn who(addr: &str) -> Response {
    request(addr, "GET", "/who", &[("Host", "cdn.example.com")], b"")
        .unwrap_or_else(|e| panic!("GET /who from {addr}: {e}"))
}

/// Asks `addr` until `done` holds for an answer (panics after 15 s): the answers meanwhile.
fn until(addr: &str, mut done: impl FnMut(&Response) -> bool) -> Vec<Response> {
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut seen = Vec::new();
    loop {
        let r = who(addr);
        let finished = done(&r);
        seen.push(r);
        if finished {
            return seen;
        }
        assert!(
            Instant::now() < deadline,
            "not within 15 s; last answers: {:?}",
            &seen[seen.len().saturating_sub(3)..]
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn an_upstream_resolved_at_run_time_follows_its_dns_record() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let sandbox = Sandbox::new().share(d);
    let dns = Dns::start();
    let (a, b) = (Ipv4Addr::new(127, 0, 0, 51), Ipv4Addr::new(127, 0, 0, 52));
    let _a = backend(&sandbox, d, "backend-a", a);
    let _b = backend(&sandbox, d, "backend-b", b);

    let front = "127.0.0.50:8080";
    let tmp = d.display();
    let conf = format!(
        "pid {tmp}/front.pid;\nevents {{}}\nhttp {{\n  access_log off;\n  \
         client_body_temp_path {tmp}/cb; proxy_temp_path {tmp}/p; fastcgi_temp_path {tmp}/f;\n  \
         uwsgi_temp_path {tmp}/u; scgi_temp_path {tmp}/s;\n  \
         resolver {dns} valid=1s;\n  \
         upstream members {{ zone members 64k; server {MEMBERS}:{BACKEND_PORT} resolve; }}\n  \
         server {{\n    listen {front};\n    \
         location / {{ proxy_pass http://members; add_header X-Upstream $upstream_addr always; }}\n  \
         }}\n}}\n",
        dns = dns.addr(),
    );
    // The name is unknown when nginx starts (a pool whose members are not up yet): nginx starts
    // all the same, and has no server to pass requests to.
    let _front = Nginx::start(&sandbox, "front", &conf, d, front);
    assert_eq!(who(front).status, 502, "no member yet");

    let started = Instant::now();
    dns.set(MEMBERS, &[a]);
    let seen = until(front, |r| r.status == 200);
    eprintln!("the first member answered after {:?}", started.elapsed());
    assert_eq!(seen.last().unwrap().body, "backend-a");

    // A second member: both get requests (round robin).
    let started = Instant::now();
    dns.set(MEMBERS, &[a, b]);
    until(front, |r| r.body == "backend-b");
    eprintln!("the second member answered after {:?}", started.elapsed());
    let bodies: Vec<String> = (0..6).map(|_| who(front).body).collect();
    for backend in ["backend-a", "backend-b"] {
        assert!(bodies.iter().any(|body| body == backend), "{bodies:?}");
    }

    // The first one leaves: only the second gets requests, none fails.
    dns.set(MEMBERS, &[b]);
    // Until 10 answers in a row came from the second, each answer kept and checked.
    let mut streak = 0;
    let seen = until(front, |r| {
        streak = if r.body == "backend-b" { streak + 1 } else { 0 };
        streak > 10
    });
    for r in &seen {
        assert_eq!(r.status, 200, "{r:?}");
    }
    assert_eq!(
        who(front).header("X-Upstream"),
        Some(format!("{b}:{BACKEND_PORT}").as_str())
    );
}

#[test]
fn the_sandbox_runs_nginx_as_any_uid_with_a_read_only_root() {
    // What the pod test of tests/nginx.rs relies on: a uid of no user, no capability, and no
    // write but to an emptyDir, even where the root has no mount point for it.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let config = d.join("config");
    std::fs::create_dir_all(&config).unwrap();
    let probe = "for f in /etc/nginx/cdn/x /var/cache/nginx/x /tmp/x /x /etc/x; do \
                 if touch $f 2>/dev/null; then echo writable $f; else echo read-only $f; fi; done; \
                 grep -E '^(Uid|Gid|Groups|CapEff|CapPrm):' /proc/self/status; \
                 test -f /etc/nginx/mime.types && echo root-entries-kept";
    let pod = Sandbox::read_only_root()
        .read_only(&config, "/etc/nginx/cdn")
        .empty_dir("/tmp")
        .empty_dir("/var/cache/nginx");
    let run = |sandbox: Sandbox| {
        let out = sandbox.command(&["sh", "-c", probe]).output().unwrap();
        let report = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{report}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        for line in [
            "read-only /etc/nginx/cdn/x",
            "writable /var/cache/nginx/x",
            "writable /tmp/x",
            "read-only /x",
            "read-only /etc/x",
            "root-entries-kept",
        ] {
            assert!(report.lines().any(|l| l == line), "{line}:\n{report}");
        }
        report
    };
    // Read-only by its mounts, not only by permissions: even to root.
    let as_root = run(pod.clone());
    assert!(as_root.contains("CapEff:\t000001ff"), "{as_root}");
    let report = run(pod.user(1000680000, 0));
    let field = |name: &str| {
        report
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap_or_default()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert_eq!(field("Uid:"), "1000680000 1000680000 1000680000 1000680000");
    assert_eq!(field("Gid:"), "0 0 0 0");
    assert_eq!(field("Groups:"), "");
    assert_eq!(field("CapEff:"), "0000000000000000");
    assert_eq!(field("CapPrm:"), "0000000000000000");
    // The shared root is left as it was.
    assert!(!nginx::root().join("etc/nginx/cdn").exists());
    assert!(!nginx::root().join("var/cache/nginx").exists());
}
