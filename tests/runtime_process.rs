//! The built binary under `cdn-operator run`, against a small fake API server on loopback (no
//! real API server can be installed here): probes and metrics over real HTTP, promtool on the
//! exposition, leader election through the Lease endpoints, traces to the OTLP test receiver,
//! SIGTERM, lease loss, bad flags and an unreachable API server.
//!
//! The fake answers what the operator asks: /version, lists (one CdnCluster or none), watches
//! (held open, silent), server-side applies (echoed), status patches (merged), Events, and a
//! Lease (get/create/merge-patch).

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const LEASE: &str = "cdn-operator-leader";

#[derive(Default)]
struct FakeState {
    lease: Option<Value>,
    /// While set, this identity holds the lease and keeps renewing it.
    foreign_holder: Option<String>,
    clusters: Vec<Value>,
    requests: Vec<String>,
    lease_patches: Vec<Value>,
    /// How long a CdnCluster status write takes (to hold a reconcile in flight).
    status_delay: Duration,
    status_writes_started: usize,
    status_writes_done: usize,
    user_agents: std::collections::BTreeSet<String>,
}

type Shared = Arc<Mutex<FakeState>>;

fn now() -> String {
    format!("{:.6}", jiff::Timestamp::now())
}

fn merge(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        (t, p) => *t = p.clone(),
    }
}

fn reply(status: u16, body: Value) -> Response {
    (
        StatusCode::from_u16(status).unwrap(),
        [("content-type", "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn not_found(what: &str) -> Response {
    reply(
        404,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": format!("{what} not found"), "reason": "NotFound", "code": 404}),
    )
}

async fn handle(
    State(state): State<Shared>,
    method: Method,
    uri: Uri,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> Response {
    if let Some(agent) = headers.get("user-agent").and_then(|v| v.to_str().ok()) {
        state.lock().unwrap().user_agents.insert(agent.to_string());
    }
    let path = uri.path().to_string();
    let query = uri.query().unwrap_or("").to_string();
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let status_write = method == Method::PATCH && path.ends_with("/status");
    if status_write {
        let delay = {
            let mut s = state.lock().unwrap();
            s.status_writes_started += 1;
            s.status_delay
        };
        tokio::time::sleep(delay).await;
        state.lock().unwrap().status_writes_done += 1;
    }
    let mut s = state.lock().unwrap();
    s.requests.push(format!("{method} {uri}"));
    if path == "/version" {
        return reply(
            200,
            json!({"major": "1", "minor": "36", "gitVersion": "v1.36.0-fake", "gitCommit": "0",
                   "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1",
                   "compiler": "gc", "platform": "linux/amd64"}),
        );
    }
    if query
        .split('&')
        .any(|p| p == "watch=true" || p == "watch=1")
    {
        // Silent, held open: the caches stay as listed.
        let stream = futures::stream::pending::<Result<Bytes, std::io::Error>>();
        return Response::builder()
            .header("content-type", "application/json")
            .body(Body::from_stream(stream))
            .unwrap();
    }
    if path.starts_with("/apis/coordination.k8s.io/v1/namespaces/ops/leases") {
        if let Some(holder) = s.foreign_holder.clone() {
            let lease = s.lease.get_or_insert_with(|| {
                json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                       "metadata": {"name": LEASE, "namespace": "ops", "resourceVersion": "1"},
                       "spec": {"leaseTransitions": 0, "acquireTime": now()}})
            });
            merge(
                lease,
                &json!({"spec": {"holderIdentity": holder, "renewTime": now(), "leaseDurationSeconds": 15}}),
            );
        }
        return match method {
            Method::GET => match &s.lease {
                Some(lease) => reply(200, lease.clone()),
                None => not_found("lease"),
            },
            Method::POST => {
                let mut lease = body;
                merge(
                    &mut lease,
                    &json!({"metadata": {"namespace": "ops", "resourceVersion": "1"}}),
                );
                s.lease = Some(lease.clone());
                reply(201, lease)
            }
            Method::PATCH => {
                s.lease_patches.push(body.clone());
                match &mut s.lease {
                    Some(lease) => {
                        merge(lease, &body);
                        reply(200, lease.clone())
                    }
                    None => not_found("lease"),
                }
            }
            _ => reply(405, json!({})),
        };
    }
    if method == Method::PATCH && path.contains("/cdnclusters/") && path.ends_with("/status") {
        let name = path
            .trim_end_matches("/status")
            .rsplit('/')
            .next()
            .unwrap()
            .to_string();
        return match s
            .clusters
            .iter_mut()
            .find(|c| c["metadata"]["name"] == name.as_str())
        {
            Some(cluster) => {
                merge(cluster, &json!({"status": body["status"]}));
                reply(200, cluster.clone())
            }
            None => not_found(&name),
        };
    }
    match method {
        Method::GET => {
            let items = if path.ends_with("/cdnclusters") {
                s.clusters.clone()
            } else {
                Vec::new()
            };
            reply(
                200,
                json!({"kind": "List", "apiVersion": "v1", "metadata": {"resourceVersion": "10"}, "items": items}),
            )
        }
        Method::PATCH | Method::POST => {
            let mut object = body;
            let namespace = path
                .split('/')
                .skip_while(|p| *p != "namespaces")
                .nth(1)
                .unwrap_or("");
            merge(
                &mut object,
                &json!({"metadata": {"namespace": namespace, "resourceVersion": "11", "uid": "uid-1"}}),
            );
            reply(if method == Method::POST { 201 } else { 200 }, object)
        }
        _ => reply(405, json!({})),
    }
}

struct FakeApi {
    state: Shared,
    _dir: tempfile::TempDir,
    kubeconfig: PathBuf,
    _runtime: tokio::runtime::Runtime,
}

impl FakeApi {
    fn start(state: FakeState) -> FakeApi {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let state = Arc::new(Mutex::new(state));
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let port = listener.local_addr().unwrap().port();
        let router = axum::Router::new()
            .fallback(handle)
            .with_state(state.clone());
        runtime.spawn(async move { axum::serve(listener, router).await });
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = kubeconfig(&dir, port);
        FakeApi {
            state,
            _dir: dir,
            kubeconfig,
            _runtime: runtime,
        }
    }

    fn requests(&self) -> Vec<String> {
        self.state.lock().unwrap().requests.clone()
    }
}

fn kubeconfig(dir: &tempfile::TempDir, port: u16) -> PathBuf {
    let path = dir.path().join("kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://127.0.0.1:{port}\n\
             users:\n- name: fake\n  user: {{}}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n    namespace: default\n\
             current-context: fake\n"
        ),
    )
    .unwrap();
    path
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn cluster(name: &str) -> Value {
    json!({"apiVersion": "cluster.anevia.com/v1", "kind": "CdnCluster",
           "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"),
                        "generation": 1, "resourceVersion": "5"},
           "spec": {"role": "cache", "sources": []}})
}

/// The operator process; killed if the test ends first.
struct Operator {
    child: Child,
    probes: u16,
    metrics: u16,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
}

impl Operator {
    fn start(kubeconfig: &std::path::Path, args: &[&str], env: &[(&str, &str)]) -> Operator {
        let mut command = Command::new(env!("CARGO_BIN_EXE_cdn-operator"));
        command.arg("run");
        // Port 0: the operator picks free ports and logs them (no race between parallel tests).
        for flag in ["--health-probe-bind-address", "--metrics-bind-address"] {
            if !args.iter().any(|a| a.starts_with(flag)) {
                command.arg(format!("{flag}=127.0.0.1:0"));
            }
        }
        command
            .args(args)
            .env("KUBECONFIG", kubeconfig)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for name in [
            "RUST_LOG",
            "POD_NAME",
            "POD_NAMESPACE",
            "WATCH_NAMESPACE",
            "KUBERNETES_SERVICE_HOST",
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "OTEL_SDK_DISABLED",
            "LEADER_ELECT",
            "LOG_FORMAT",
        ] {
            command.env_remove(name);
        }
        command.envs(env.iter().copied());
        let mut child = command.spawn().unwrap();
        let stdout = collect(child.stdout.take().unwrap());
        let stderr = collect(child.stderr.take().unwrap());
        Operator {
            child,
            probes: 0,
            metrics: 0,
            stdout,
            stderr,
        }
    }

    /// Waits for the operator to log where it serves probes and metrics.
    fn serving(mut self) -> Operator {
        self.wait_for("serving HTTP", Duration::from_secs(30), |o| {
            let logs = o.stdout();
            let port = |endpoints: &str| {
                logs.lines()
                    .filter(|l| l.contains("serving HTTP") && l.contains(endpoints))
                    .find_map(|l| {
                        let at = l.find("127.0.0.1:")? + "127.0.0.1:".len();
                        let digits: String =
                            l[at..].chars().take_while(char::is_ascii_digit).collect();
                        digits.parse::<u16>().ok()
                    })
            };
            match (port("probes"), port("metrics")) {
                (Some(probes), Some(metrics)) => {
                    o.probes = probes;
                    o.metrics = metrics;
                    true
                }
                _ => false,
            }
        });
        self
    }

    fn get(&self, port: u16, path: &str) -> Option<(u16, String, String)> {
        http_get(port, path, "*/*")
    }

    fn wait_for(&mut self, what: &str, within: Duration, mut check: impl FnMut(&mut Self) -> bool) {
        let start = Instant::now();
        while !check(self) {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "{what}: the operator exited ({status}); stderr:\n{}\nstdout:\n{}",
                    self.stderr(),
                    self.stdout()
                );
            }
            assert!(
                start.elapsed() < within,
                "{what}: not within {within:?}; stderr:\n{}\nstdout:\n{}",
                self.stderr(),
                self.stdout()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn scrape(&self) -> String {
        self.get(self.metrics, "/metrics")
            .map(|(_, _, body)| body)
            .unwrap_or_default()
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.child.id().to_string())
            .status()
            .unwrap();
        assert!(status.success());
    }

    fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                // Let the readers drain the pipes.
                std::thread::sleep(Duration::from_millis(100));
                return status;
            }
            assert!(
                start.elapsed() < within,
                "no exit within {within:?}; stderr:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn stdout(&self) -> String {
        self.stdout.lock().unwrap().clone()
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn collect(pipe: impl Read + Send + 'static) -> Arc<Mutex<String>> {
    let out = Arc::new(Mutex::new(String::new()));
    let sink = out.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines() {
            let Ok(line) = line else { break };
            let mut sink = sink.lock().unwrap();
            sink.push_str(&line);
            sink.push('\n');
        }
    });
    out
}

/// What Prometheus 2.x sends.
const OPENMETRICS_ACCEPT: &str = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";

/// A plain HTTP/1.1 GET: status, content type, body.
fn http_get(port: u16, path: &str, accept: &str) -> Option<(u16, String, String)> {
    use std::io::Write;
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: {accept}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    let content_type = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-type:")
                .map(|v| v.trim().to_string())
        })
        .unwrap_or_default();
    Some((status, content_type, body.to_string()))
}

fn has_line(text: &str, line: &str) -> bool {
    text.lines().any(|l| l == line)
}

/// The value of one series in an exposition.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

const RECONCILED: &str =
    "controller_runtime_reconcile_total{controller=\"cdncluster\",result=\"success\"}";

const FAST_ELECTION: [&str; 6] = [
    "--leader-election-namespace=ops",
    "--leader-election-identity=pod-a",
    "--leader-election-lease-duration=3s",
    "--leader-election-renew-deadline=2s",
    "--leader-election-retry-period=300ms",
    "--shutdown-timeout=5s",
];

#[test]
fn leader_serves_probes_and_metrics_then_releases_the_lease_and_exits_0_on_sigterm() {
    let mut running = cluster("origin");
    running["status"] = json!({"state": "Running"});
    let api = FakeApi::start(FakeState {
        clusters: vec![running],
        ..FakeState::default()
    });
    let mut operator = Operator::start(&api.kubeconfig, &FAST_ELECTION, &[]).serving();

    operator.wait_for("ready", Duration::from_secs(30), |o| {
        o.get(o.probes, "/readyz")
            .is_some_and(|(status, _, _)| status == 200)
    });
    let (status, _, body) = operator.get(operator.probes, "/healthz").unwrap();
    assert_eq!(status, 200);
    assert!(
        body.contains("[+]cdncluster ok") && body.contains("[+]leader-election ok"),
        "{body}"
    );
    let (_, _, ready) = operator.get(operator.probes, "/readyz").unwrap();
    assert!(ready.contains("[+]cdncluster ok"), "{ready}");
    assert_eq!(
        operator.get(operator.probes, "/metrics").unwrap().0,
        404,
        "metrics are on their own port"
    );

    operator.wait_for(
        "leading, and the CdnCluster reconciled",
        Duration::from_secs(30),
        |o| {
            let text = o.scrape();
            has_line(
                &text,
                &format!("leader_election_master_status{{name=\"{LEASE}\"}} 1"),
            ) && sample(&text, RECONCILED).is_some_and(|n| n >= 1.0)
        },
    );
    let (status, content_type, text) =
        http_get(operator.metrics, "/metrics", OPENMETRICS_ACCEPT).unwrap();
    assert_eq!(status, 200);
    assert_eq!(
        content_type,
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    for expected in [
        "controller_runtime_reconcile_errors_total{controller=\"cdncluster\"} 0",
        "controller_runtime_max_concurrent_reconciles{controller=\"cdncluster\"} 16",
        "controller_runtime_active_workers{controller=\"cdncluster\"} 0",
        "cdn_operator_cdnclusters{state=\"Running\"} 1",
        "cdn_operator_cdnclusters{state=\"WaitingSource\"} 0",
        "cdn_operator_cdnclusters{state=\"Unknown\"} 0",
        "# TYPE process_cpu_seconds counter",
        "# UNIT process_cpu_seconds seconds",
        "# TYPE process_resident_memory_bytes gauge",
        "# TYPE process_open_fds gauge",
        "# TYPE process_start_time_seconds gauge",
        "# EOF",
    ] {
        assert!(
            has_line(&text, expected),
            "missing `{expected}` in:\n{text}"
        );
    }
    // What a plain client (curl, promtool) gets: the classic text format, linted by promtool.
    let (status, content_type, classic) = operator.get(operator.metrics, "/metrics").unwrap();
    assert_eq!(status, 200);
    assert_eq!(content_type, "text/plain; version=0.0.4; charset=utf-8");
    for expected in [
        "# TYPE controller_runtime_reconcile_total counter",
        "# TYPE controller_runtime_reconcile_errors_total counter",
        "# TYPE controller_runtime_reconcile_time_seconds histogram",
        "# TYPE controller_runtime_max_concurrent_reconciles gauge",
        "# TYPE controller_runtime_active_workers gauge",
        "# TYPE leader_election_master_status gauge",
        "# TYPE process_cpu_seconds_total counter",
        "# TYPE process_max_fds gauge",
        "# TYPE cdn_operator_cdnclusters gauge",
    ] {
        assert!(
            has_line(&classic, expected),
            "missing `{expected}` in:\n{classic}"
        );
    }
    let (ok, report) = promtool_check_metrics(&classic);
    assert!(
        ok,
        "promtool check metrics failed:\n{report}\non:\n{classic}"
    );
    // Why two formats: promtool (and any 0.0.4 reader) takes OpenMetrics counters, whose family
    // is named without `_total`, for families with no HELP.
    let (ok, report) = promtool_check_metrics(&text);
    assert!(
        !ok && report.contains("controller_runtime_reconcile_total no help text"),
        "OpenMetrics read as 0.0.4 by promtool: {report}"
    );
    // The other half of the contract with the dashboards and alerts (tests/shipped_artifacts.rs
    // checks they use only these names): every name listed is a series this exposition serves.
    let listed = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/metrics.txt"))
        .expect("docs/metrics.txt");
    let served: std::collections::BTreeSet<&str> = classic
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .collect();
    for name in listed
        .lines()
        .map(str::trim)
        .filter(|n| !n.is_empty() && !n.starts_with('#'))
    {
        assert!(
            served.contains(name),
            "docs/metrics.txt lists {name}, which /metrics does not serve:\n{classic}"
        );
    }
    for series in [
        "cdn_operator_ats{phase=\"DONE\",outcome=\"Failed\"} 0",
        "cdn_operator_ats{phase=\"PENDING\",outcome=\"\"} 0",
        "controller_runtime_reconcile_total{controller=\"at\",result=\"success\"} 0",
    ] {
        assert!(
            has_line(&classic, series),
            "missing `{series}` in:\n{classic}"
        );
    }
    eprintln!(
        "measured: resident memory {:?} bytes, CPU {:?} s, open fds {:?} after start-up and one reconcile",
        sample(&classic, "process_resident_memory_bytes"),
        sample(&classic, "process_cpu_seconds_total"),
        sample(&classic, "process_open_fds"),
    );

    // The reconcile wrote through the one apply path: children, then the status.
    let requests = api.requests();
    for write in [
        "PATCH /api/v1/namespaces/default/configmaps/",
        "PATCH /apis/apps/v1/namespaces/default/deployments/",
        "PATCH /apis/cluster.anevia.com/v1/namespaces/default/cdnclusters/origin/status",
    ] {
        assert!(
            requests.iter().any(|r| r.starts_with(write)),
            "no `{write}` in {requests:#?}"
        );
    }

    operator.signal("TERM");
    let started = Instant::now();
    let status = operator.wait_exit(Duration::from_secs(10));
    assert_eq!(status.code(), Some(0), "stderr:\n{}", operator.stderr());
    eprintln!(
        "measured: SIGTERM to exit as leader (release included) {:?}",
        started.elapsed()
    );
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "within the shutdown timeout"
    );
    assert_eq!(
        operator.stderr(),
        "",
        "a clean exit prints nothing on stderr"
    );
    let state = api.state.lock().unwrap();
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(
        state.user_agents.iter().cloned().collect::<Vec<_>>(),
        vec![format!("cdn-operator/{version}")],
        "every request, the lease's included, names the operator"
    );
    let lease = state.lease.as_ref().expect("the lease was created");
    assert_eq!(lease["spec"]["holderIdentity"], "", "released: {lease}");
    assert_eq!(lease["spec"]["leaseDurationSeconds"], 1);
    let logs = operator.stdout();
    assert!(
        logs.contains("released the leader election lease"),
        "{logs}"
    );
}

#[test]
fn a_standby_is_ready_writes_nothing_and_exits_0_on_sigterm() {
    let api = FakeApi::start(FakeState {
        clusters: vec![cluster("origin")],
        foreign_holder: Some("pod-b".into()),
        ..FakeState::default()
    });
    let mut operator = Operator::start(&api.kubeconfig, &FAST_ELECTION, &[]).serving();
    operator.wait_for("ready on standby", Duration::from_secs(30), |o| {
        o.get(o.probes, "/readyz")
            .is_some_and(|(status, _, _)| status == 200)
    });
    operator.wait_for("standby status", Duration::from_secs(10), |o| {
        has_line(
            &o.scrape(),
            &format!("leader_election_master_status{{name=\"{LEASE}\"}} 0"),
        )
    });
    // Several retry periods: still a standby, nothing written, nothing reconciled.
    std::thread::sleep(Duration::from_millis(1500));
    let text = operator.scrape();
    assert!(
        has_line(
            &text,
            &format!("leader_election_master_status{{name=\"{LEASE}\"}} 0")
        ),
        "{text}"
    );
    assert!(has_line(
        &text,
        "controller_runtime_reconcile_total{controller=\"cdncluster\",result=\"success\"} 0"
    ));
    let writes: Vec<String> = api
        .requests()
        .into_iter()
        .filter(|r| !r.starts_with("GET "))
        .collect();
    assert_eq!(writes, Vec::<String>::new(), "a standby writes nothing");

    operator.signal("TERM");
    let status = operator.wait_exit(Duration::from_secs(10));
    assert_eq!(status.code(), Some(0), "stderr:\n{}", operator.stderr());
    assert!(
        api.state.lock().unwrap().lease_patches.is_empty(),
        "a standby releases nothing"
    );
}

#[test]
fn a_leader_that_loses_its_lease_exits_non_zero_with_one_line() {
    let api = FakeApi::start(FakeState::default());
    let mut operator = Operator::start(&api.kubeconfig, &FAST_ELECTION, &[]).serving();
    operator.wait_for("leading", Duration::from_secs(30), |o| {
        has_line(
            &o.scrape(),
            &format!("leader_election_master_status{{name=\"{LEASE}\"}} 1"),
        )
    });
    api.state.lock().unwrap().foreign_holder = Some("pod-z".into());
    let status = operator.wait_exit(Duration::from_secs(5));
    assert_eq!(status.code(), Some(1));
    let stderr = operator.stderr();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("cdn-operator: lost the leader election lease ops/cdn-operator-leader: it is now held by pod-z"),
        "{stderr}"
    );
}

#[test]
fn an_unreachable_api_server_is_one_line_and_exit_1() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = kubeconfig(&dir, free_port());
    let mut operator = Operator::start(&kubeconfig, &["--leader-elect=false"], &[]);
    let status = operator.wait_exit(Duration::from_secs(30));
    assert_eq!(status.code(), Some(1));
    let stderr = operator.stderr();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("cdn-operator: cannot reach the Kubernetes API server: "),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn a_broken_kubeconfig_is_one_line_and_exit_1() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, "clusters: [\n").unwrap();
    let mut operator = Operator::start(&kubeconfig, &["--leader-elect=false"], &[]);
    assert_eq!(operator.wait_exit(Duration::from_secs(20)).code(), Some(1));
    let stderr = operator.stderr();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("cdn-operator: cannot configure a Kubernetes client: "),
        "{stderr}"
    );
}

#[test]
fn bad_flags_are_one_line_and_non_zero() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = kubeconfig(&dir, free_port());
    let cases: [(&[&str], &str); 6] = [
        (&["--leader-election-lease-duration=soon"], "cdn-operator: invalid value 'soon' for '--leader-election-lease-duration"),
        (&["--no-such-flag"], "cdn-operator: unexpected argument '--no-such-flag' found"),
        (&["--max-concurrent-reconciles=0"], "cdn-operator: invalid value '0' for '--max-concurrent-reconciles"),
        (
            &["--leader-election-namespace=ops", "--leader-election-renew-deadline=20s"],
            "cdn-operator: --leader-election-lease-duration (15s) must be longer than --leader-election-renew-deadline (20s)",
        ),
        (&[], "cdn-operator: cannot tell which namespace to hold the leader election lease in"),
        (&["--leader-elect=false", "--metrics-bind-address=8080"], "cdn-operator: --metrics-bind-address: `8080` is not a listen address"),
    ];
    for (args, expected) in cases {
        let mut operator = Operator::start(&kubeconfig, args, &[]);
        let status = operator.wait_exit(Duration::from_secs(20));
        assert!(!status.success(), "{args:?}");
        let stderr = operator.stderr();
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.starts_with(expected), "{args:?}: {stderr}");
    }
}

/// `promtool check metrics` on what /metrics served: whether it passed, and what it said.
/// promtool is installed by scripts/install-test-deps.sh; a missing one fails the test rather
/// than skipping it.
fn promtool_check_metrics(exposition: &str) -> (bool, String) {
    use std::io::Write;
    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian package prometheus) must be installed: run scripts/install-test-deps.sh");
    promtool
        .stdin
        .take()
        .unwrap()
        .write_all(exposition.as_bytes())
        .unwrap();
    let output = promtool.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), said)
}

#[test]
fn the_spans_of_a_reconcile_reach_an_otlp_receiver_with_their_parent_links() {
    let receiver = Receiver::start();
    let http = receiver.http;

    let api = FakeApi::start(FakeState {
        clusters: vec![cluster("origin")],
        ..FakeState::default()
    });
    let endpoint = format!("http://127.0.0.1:{http}");
    let mut operator = Operator::start(
        &api.kubeconfig,
        &[
            "--leader-elect=false",
            "--log-format=json",
            "--log-level=info,kube_client=debug",
        ],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_SERVICE_NAME", "cdn-operator-test"),
        ],
    )
    .serving();
    operator.wait_for("the CdnCluster reconciled", Duration::from_secs(30), |o| {
        sample(&o.scrape(), RECONCILED) == Some(1.0)
    });
    operator.signal("TERM");
    let status = operator.wait_exit(Duration::from_secs(15));
    assert_eq!(status.code(), Some(0), "stderr:\n{}", operator.stderr());

    // Flushed at shutdown: the spans are there once the process has exited.
    let spans = receiver.spans_once("reconcile");
    let roots: Vec<&Value> = spans.iter().filter(|s| s["name"] == "reconcile").collect();
    assert_eq!(roots.len(), 1, "one reconcile, one root span: {spans:#?}");
    let root = roots[0];
    assert_eq!(root["parent_span_id"], "", "the reconcile span is a root");
    assert_eq!(root["service.name"], "cdn-operator-test");
    let attributes = &root["attributes"];
    for (key, value) in [
        ("controller", "cdncluster"),
        ("namespace", "default"),
        ("name", "origin"),
        ("result", "success"),
    ] {
        assert!(
            attributes[key]
                .as_str()
                .is_some_and(|v| v.contains(&format!("\"{value}\""))),
            "attribute {key} = {value} in {root}"
        );
    }
    let trace_id = root["trace_id"].as_str().unwrap();
    let children: Vec<&Value> = spans
        .iter()
        .filter(|s| s["parent_span_id"] == root["span_id"])
        .collect();
    // ConfigMap, Service and Deployment applies, the status, the Event.
    assert!(children.len() >= 5, "API calls as child spans: {spans:#?}");
    for child in &children {
        assert_eq!(child["trace_id"], trace_id, "{child}");
        let method = child["attributes"]["http.method"]
            .as_str()
            .unwrap_or_default();
        assert!(
            method.contains("PATCH") || method.contains("POST"),
            "{child}"
        );
    }
    assert!(
        children.iter().any(|c| c["attributes"]["http.url"]
            .as_str()
            .is_some_and(|u| u.contains("/cdnclusters/origin/status"))),
        "{children:#?}"
    );
    // No span of a watch or of the start-up: only what happened inside the reconcile.
    assert!(
        spans.iter().all(|s| s["trace_id"] == trace_id),
        "{spans:#?}"
    );

    // Logs inside the reconcile carry its trace id.
    let logs = operator.stdout();
    let inside: Vec<Value> = logs
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|l| {
            l["span"]
                .as_str()
                .is_some_and(|s| s.starts_with("reconcile"))
        })
        .collect();
    assert!(!inside.is_empty(), "{logs}");
    for line in inside {
        assert_eq!(line["trace_id"], trace_id, "{line}");
        assert_eq!(line["controller"], "cdncluster", "{line}");
    }
    drop(receiver);
}

/// ../shared/tools/otlp_receiver.py on loopback; killed when dropped.
struct Receiver {
    child: Child,
    http: u16,
    spans: PathBuf,
    _dir: tempfile::TempDir,
}

impl Receiver {
    fn start() -> Receiver {
        let script =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/tools/otlp_receiver.py");
        assert!(script.exists(), "{} is missing", script.display());
        let dir = tempfile::tempdir().unwrap();
        let spans = dir.path().join("spans.jsonl");
        let (grpc, http) = (free_port(), free_port());
        let mut child = Command::new("python3")
            .arg(&script)
            .args(["--grpc", &format!("127.0.0.1:{grpc}")])
            .args(["--http", &format!("127.0.0.1:{http}")])
            .arg("--out")
            .arg(&spans)
            .args(["--max-seconds", "120"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("python3 runs the OTLP receiver");
        let mut first = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut first)
            .unwrap();
        if !first.starts_with("listening") {
            let mut error = String::new();
            let _ = child.stderr.take().unwrap().read_to_string(&mut error);
            let _ = child.kill();
            panic!("the OTLP receiver did not start ({first}): {error} (scripts/install-test-deps.sh installs its modules)");
        }
        Receiver {
            child,
            http,
            spans,
            _dir: dir,
        }
    }

    /// The spans received, waiting up to 5 s for one named `name`.
    fn spans_once(&self, name: &str) -> Vec<Value> {
        let start = Instant::now();
        loop {
            let text = std::fs::read_to_string(&self.spans).unwrap_or_default();
            let spans: Vec<Value> = text
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
            if spans.iter().any(|s| s["name"] == name) || start.elapsed() > Duration::from_secs(5) {
                return spans;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A TLS front for the receiver's HTTP port (a collector behind https), with a fresh CA.
/// Returns the TLS port, the CA file and the forwarder process.
fn tls_front(dir: &std::path::Path, target: u16) -> (u16, PathBuf, Child) {
    let run = |args: &[&str]| {
        let output = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("openssl (Debian package openssl) must be installed");
        assert!(
            output.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    };
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    run(&[
        &["req", "-x509"][..],
        &ec,
        &[
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "1",
            "-subj",
            "/CN=test-ca",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign",
        ],
    ]
    .concat());
    run(&[
        &["req"][..],
        &ec,
        &[
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=127.0.0.1",
        ],
    ]
    .concat());
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.pem",
        "-days",
        "1",
        "-extfile",
        "server.ext",
    ]);
    let forwarder = r#"
import socket, ssl, sys, threading
target = int(sys.argv[1])
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain("server.pem", "server.key")
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen()
print(srv.getsockname()[1], flush=True)
def pipe(a, b):
    try:
        while True:
            data = a.recv(65536)
            if not data:
                break
            b.sendall(data)
    except Exception:
        pass
    finally:
        for s in (a, b):
            try:
                s.close()
            except Exception:
                pass
def handle(conn):
    try:
        tls = ctx.wrap_socket(conn, server_side=True)
    except Exception:
        return
    upstream = socket.create_connection(("127.0.0.1", target))
    threading.Thread(target=pipe, args=(tls, upstream), daemon=True).start()
    pipe(upstream, tls)
while True:
    conn, _ = srv.accept()
    threading.Thread(target=handle, args=(conn,), daemon=True).start()
"#;
    let mut child = Command::new("python3")
        .args(["-c", forwarder, &target.to_string()])
        .current_dir(dir)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut port = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut port)
        .unwrap();
    (
        port.trim().parse().expect("the TLS front prints its port"),
        dir.join("ca.pem"),
        child,
    )
}

#[test]
fn spans_reach_an_https_collector_verified_with_the_given_ca() {
    let receiver = Receiver::start();
    let dir = tempfile::tempdir().unwrap();
    let (port, ca, front) = tls_front(dir.path(), receiver.http);
    struct Kill(Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _front = Kill(front);
    let api = FakeApi::start(FakeState {
        clusters: vec![cluster("origin")],
        ..FakeState::default()
    });
    let endpoint = format!("https://127.0.0.1:{port}");
    let ca = ca.to_str().unwrap().to_string();
    let mut operator = Operator::start(
        &api.kubeconfig,
        &["--leader-elect=false"],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", &ca),
        ],
    )
    .serving();
    operator.wait_for("the CdnCluster reconciled", Duration::from_secs(30), |o| {
        sample(&o.scrape(), RECONCILED) == Some(1.0)
    });
    operator.signal("TERM");
    assert_eq!(operator.wait_exit(Duration::from_secs(15)).code(), Some(0));
    let spans = receiver.spans_once("reconcile");
    assert!(
        spans
            .iter()
            .any(|s| s["name"] == "reconcile" && s["service.name"] == "cdn-operator"),
        "over TLS: {spans:#?}\nlogs: {}",
        operator.stdout()
    );

    // The same collector without its CA: the certificate is refused, nothing is delivered, and
    // a failing export never fails the operator.
    let before = spans.iter().filter(|s| s["name"] == "reconcile").count();
    let mut untrusting = Operator::start(
        &api.kubeconfig,
        &["--leader-elect=false"],
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)],
    )
    .serving();
    untrusting.wait_for("reconciled again", Duration::from_secs(30), |o| {
        sample(&o.scrape(), RECONCILED) == Some(1.0)
    });
    untrusting.signal("TERM");
    assert_eq!(
        untrusting.wait_exit(Duration::from_secs(15)).code(),
        Some(0)
    );
    // The operator has exited: whatever it could deliver, it has.
    let after = std::fs::read_to_string(&receiver.spans)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("\"name\": \"reconcile\""))
        .count();
    assert_eq!(after, before, "an untrusted collector receives nothing");
}

#[test]
fn sigterm_lets_an_in_flight_reconcile_finish_then_exits_0() {
    let api = FakeApi::start(FakeState {
        clusters: vec![cluster("origin")],
        status_delay: Duration::from_millis(1500),
        ..FakeState::default()
    });
    let mut operator = Operator::start(
        &api.kubeconfig,
        &["--leader-elect=false", "--shutdown-timeout=10s"],
        &[],
    )
    .serving();
    operator.wait_for("a reconcile in flight", Duration::from_secs(30), |_| {
        api.state.lock().unwrap().status_writes_started == 1
    });
    operator.signal("TERM");
    let signalled = Instant::now();
    let status = operator.wait_exit(Duration::from_secs(10));
    assert_eq!(status.code(), Some(0), "stderr:\n{}", operator.stderr());
    assert_eq!(
        api.state.lock().unwrap().status_writes_done,
        1,
        "the reconcile finished"
    );
    assert!(
        signalled.elapsed() >= Duration::from_millis(1000),
        "it waited for the reconcile"
    );
    assert!(
        operator.stdout().contains("the controllers stopped"),
        "{}",
        operator.stdout()
    );
}

#[test]
fn sigint_abandons_a_reconcile_that_outlasts_the_shutdown_timeout_and_exits_0() {
    let api = FakeApi::start(FakeState {
        clusters: vec![cluster("origin")],
        status_delay: Duration::from_secs(60),
        ..FakeState::default()
    });
    let mut operator = Operator::start(
        &api.kubeconfig,
        &["--leader-elect=false", "--shutdown-timeout=1s"],
        &[],
    )
    .serving();
    operator.wait_for("a reconcile in flight", Duration::from_secs(30), |_| {
        api.state.lock().unwrap().status_writes_started == 1
    });
    // SIGINT (Ctrl-C in a terminal) takes the same path as SIGTERM.
    operator.signal("INT");
    let signalled = Instant::now();
    let status = operator.wait_exit(Duration::from_secs(10));
    assert_eq!(status.code(), Some(0), "stderr:\n{}", operator.stderr());
    let took = signalled.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(4),
        "{took:?}"
    );
    assert_eq!(api.state.lock().unwrap().status_writes_done, 0);
    assert!(
        operator
            .stdout()
            .contains("in-flight reconciles did not finish in time"),
        "{}",
        operator.stdout()
    );
}

#[test]
fn a_standby_takes_over_a_released_lease_and_reconciles_everything() {
    let api = FakeApi::start(FakeState {
        clusters: vec![cluster("origin")],
        foreign_holder: Some("pod-b".into()),
        ..FakeState::default()
    });
    // The default 2 s retry period: the takeover must not wait for it.
    let mut operator = Operator::start(
        &api.kubeconfig,
        &[
            "--leader-election-namespace=ops",
            "--leader-election-identity=pod-a",
        ],
        &[],
    )
    .serving();
    operator.wait_for("ready on standby", Duration::from_secs(30), |o| {
        o.get(o.probes, "/readyz")
            .is_some_and(|(status, _, _)| status == 200)
    });
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(sample(&operator.scrape(), RECONCILED), Some(0.0));

    // pod-b shuts down gracefully and releases the lease the way the library does.
    let released = Instant::now();
    {
        let mut s = api.state.lock().unwrap();
        s.foreign_holder = None;
        let lease = s.lease.as_mut().unwrap();
        lease["spec"]["holderIdentity"] = json!("");
        lease["spec"]["leaseDurationSeconds"] = json!(1);
        lease["spec"]["renewTime"] = json!(now());
    }
    operator.wait_for("leading and reconciled", Duration::from_secs(10), |o| {
        let text = o.scrape();
        has_line(
            &text,
            &format!("leader_election_master_status{{name=\"{LEASE}\"}} 1"),
        ) && sample(&text, RECONCILED) == Some(1.0)
    });
    eprintln!("measured: takeover after release {:?}", released.elapsed());
    // At most one retry period (2 s) + the reconcile, with slack for a loaded machine.
    assert!(
        released.elapsed() < Duration::from_secs(4),
        "{:?}",
        released.elapsed()
    );
    assert!(api.requests().iter().any(|r| r.starts_with(
        "PATCH /apis/cluster.anevia.com/v1/namespaces/default/cdnclusters/origin/status"
    )));
    let lease = api.state.lock().unwrap().lease.clone().unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], "pod-a", "{lease}");

    operator.signal("TERM");
    assert_eq!(operator.wait_exit(Duration::from_secs(10)).code(), Some(0));
}
