//! `cdn-operator run` as these tests start it: the binary cargo built for them, an environment
//! cleared of what would change its behaviour, and probes and metrics on ports it picks itself.

use cdn_operator_testkit::Operator;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

pub const RECONCILED: &str =
    "controller_runtime_reconcile_total{controller=\"cdncluster\",result=\"success\"}";

pub const FAST_ELECTION: [&str; 6] = [
    "--leader-election-namespace=ops",
    "--leader-election-identity=pod-a",
    "--leader-election-lease-duration=3s",
    "--leader-election-renew-deadline=2s",
    "--leader-election-retry-period=300ms",
    "--shutdown-timeout=5s",
];

/// The series of leader election's status: `1` leading, `0` standing by.
pub fn master_status(value: u8) -> String {
    format!(
        "leader_election_master_status{{name=\"{}\"}} {value}",
        crate::fake_api::LEASE
    )
}

pub trait Launch {
    /// Starts `cdn-operator run` with `args` and `env` against `kubeconfig`.
    fn start(kubeconfig: &Path, args: &[&str], env: &[(&str, &str)]) -> Self;
    /// Waits for the operator to log where it serves probes and metrics.
    fn serving(self) -> Self;
    /// Waits until /readyz answers 200.
    fn ready(&mut self, what: &str);
}

impl Launch for Operator {
    fn start(kubeconfig: &Path, args: &[&str], env: &[(&str, &str)]) -> Operator {
        let mut command = Command::new(env!("CARGO_BIN_EXE_cdn-operator"));
        command.arg("run");
        // Port 0: the operator picks free ports and logs them (no race between parallel tests).
        for flag in ["--health-probe-bind-address", "--metrics-bind-address"] {
            if !args.iter().any(|a| a.starts_with(flag)) {
                command.arg(format!("{flag}=127.0.0.1:0"));
            }
        }
        // Plain HTTP unless a test asks for the secured endpoint (tests/process/secure_metrics.rs).
        if !args.iter().any(|a| a.starts_with("--metrics-secure")) {
            command.arg("--metrics-secure=false");
        }
        command.args(args).env("KUBECONFIG", kubeconfig);
        for name in [
            "RUST_LOG",
            "POD_NAME",
            "POD_NAMESPACE",
            "WATCH_NAMESPACE",
            "KUBERNETES_SERVICE_HOST",
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "OTEL_SDK_DISABLED",
            "OTEL_EXPORTER_OTLP_CERTIFICATE",
            "SSL_CERT_FILE",
            "SSL_CERT_DIR",
            "LEADER_ELECT",
            "LOG_FORMAT",
            "METRICS_SECURE",
            "METRICS_CERT_DIR",
            "METRICS_CERT_NAME",
            "METRICS_CERT_KEY",
            "LEADER_ELECTION_LEASE_DURATION",
            "LEADER_ELECTION_RENEW_DEADLINE",
            "LEADER_ELECTION_RETRY_PERIOD",
        ] {
            command.env_remove(name);
        }
        command.envs(env.iter().copied());
        Operator::spawn("operator", command)
    }

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

    fn ready(&mut self, what: &str) {
        self.wait_for(what, Duration::from_secs(30), |o| {
            o.get(o.probes, "/readyz").is_some_and(|r| r.status == 200)
        });
    }
}
