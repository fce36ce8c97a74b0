//! The harness's process handling, checked here without a cluster: this test binary plays
//! `cdn-operator` itself (invoked as `<exe> run …`: health and metrics servers on the given
//! addresses, arguments logged, a clean exit on SIGTERM), and the harness drives it as it drives
//! the real operator.

use cdn_operator_e2e::{run_flag, OperatorOptions};
use cdn_operator_testkit::{poll, Operator};
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

static TERMINATED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigterm(_: libc::c_int) {
    TERMINATED.store(true, Ordering::SeqCst);
}

/// Answers every request on `addr` with `body`, as the operator's probe and metrics servers do.
fn serve(addr: &str, body: &'static str) {
    let addr = addr.to_string();
    let listener = TcpListener::bind(&addr).unwrap_or_else(|e| panic!("bind {addr}: {e}"));
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(&stream);
            // Read the whole request: closing with unread bytes would reset the connection.
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
                line.clear();
            }
            let mut out = &stream;
            let _ = write!(
                out,
                "HTTP/1.0 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
        }
    });
}

fn fake_operator(args: &[String]) {
    if args.iter().any(|a| a == "--help") {
        println!("Usage: cdn-operator run [OPTIONS]\n      --leader-election-retry-period <LEADER_ELECTION_RETRY_PERIOD>\n          How often candidates try to acquire");
        return;
    }
    println!("started with {}", args.join(" "));
    let flag = |name: &str| {
        args.iter()
            .find_map(|a| a.strip_prefix(&format!("{name}=")))
            .unwrap_or_else(|| panic!("no {name}"))
            .to_string()
    };
    // SAFETY: installs a handler that only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGTERM, on_sigterm as *const () as libc::sighandler_t);
    }
    serve(&flag("--health-probe-bind-address"), "ok");
    serve(
        &flag("--metrics-bind-address"),
        "controller_runtime_reconcile_total{controller=\"cdncluster\",result=\"success\"} 3\n\
         controller_runtime_reconcile_total{controller=\"cdncluster\",result=\"error\"} 1\n# EOF\n",
    );
    while !TERMINATED.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(10));
    }
    println!("terminated by SIGTERM");
}

/// The operator's logs once its first line is in: they are read on another thread, which may not
/// have caught up when /healthz answers.
async fn logs_once_started(operator: &Operator) -> String {
    poll(Duration::from_secs(10), Duration::from_millis(10), || {
        let logs = operator.logs();
        std::future::ready(logs.contains("started with").then_some(logs))
    })
    .await
    .unwrap_or_else(|| operator.logs())
}

async fn drive() {
    assert_eq!(
        run_flag(&["--retry-period", "--leader-election-retry-period"]).as_deref(),
        Some("--leader-election-retry-period")
    );
    assert_eq!(run_flag(&["--no-such-flag"]), None);

    let options = OperatorOptions {
        namespace: Some("ns1".into()),
        lease: None,
        kubeconfig: None,
        args: vec!["--max-concurrent-reconciles=4".into()],
    };
    let mut operator = options.start("fake").await;
    let logs = logs_once_started(&operator).await;
    for arg in [
        "run",
        "--namespace=ns1",
        "--leader-elect=false",
        "--log-format=text",
        "--max-concurrent-reconciles=4",
    ] {
        assert!(logs.contains(arg), "{arg} passed: {logs}");
    }
    assert_eq!(
        operator.metric_sum(
            "controller_runtime_reconcile_total",
            "controller=\"cdncluster\""
        ),
        Some(4.0)
    );
    assert!(operator.rss_kib().is_some_and(|k| k > 0));
    operator.terminate();
    let exit = operator.exit_within(Duration::from_secs(10)).await;
    assert!(exit.is_some_and(|s| s.success()), "clean exit: {exit:?}");
    assert!(operator.logs().contains("terminated by SIGTERM"));

    let elected = OperatorOptions {
        lease: Some(("ns2".into(), "lease-x".into())),
        ..Default::default()
    };
    let operator = elected.start("fake-elected").await;
    let logs = logs_once_started(&operator).await;
    for arg in [
        "--leader-elect=true",
        "--leader-election-namespace=ns2",
        "--leader-election-id=lease-x",
    ] {
        assert!(logs.contains(arg), "{arg} passed: {logs}");
    }
    assert!(
        !logs.contains("--namespace="),
        "cluster-wide without a namespace: {logs}"
    );
    drop(operator); // killed, not left behind
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("run") {
        return fake_operator(&args);
    }
    // libtest-style filters and flags (`cargo test -- --list`, names) are not meaningful here.
    if args.iter().any(|a| a == "--list") {
        println!("harness: test");
        return;
    }
    std::env::set_var(
        "CDN_OPERATOR_BIN",
        std::env::current_exe().expect("own path"),
    );
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(drive());
    println!("test harness ... ok");
}
