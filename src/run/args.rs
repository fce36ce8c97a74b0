//! The flags and environment of `cdn-operator run`.

use crate::cdncluster::build::PodImages;
use crate::cdncluster::sources::{parse_cluster_domain, DEFAULT_CLUSTER_DOMAIN};
use crate::kubernetes::cache::Scope;
use crate::kubernetes::client::Kubeconfig;
use crate::kubernetes::restricted::RunAs;
use crate::runtime::leader;
use crate::runtime::logs::{self, LogFormat};
use crate::runtime::parse_duration;
use crate::runtime::telemetry::{self, Otlp};
use crate::runtime::tls;
use std::path::PathBuf;
use std::time::Duration;

#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Watch and manage one namespace only (namespaced RBAC); default: every namespace.
    #[arg(long, env = "WATCH_NAMESPACE")]
    pub namespace: Option<String>,

    /// How many objects each controller reconciles at once.
    #[arg(long, env = "MAX_CONCURRENT_RECONCILES", default_value_t = 16,
          value_parser = clap::value_parser!(u16).range(1..))]
    pub max_concurrent_reconciles: u16,

    /// This replica's identity in Events (the pod name in a cluster).
    #[arg(long, env = "POD_NAME")]
    pub pod_name: Option<String>,

    /// Elect a leader among the replicas with a Lease; only the leader reconciles. Set to false
    /// for a single local process. `--leader-elect` alone, as Go's flags take it, means true.
    #[arg(long, env = "LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set,
          num_args = 0..=1, default_missing_value = "true", require_equals = true)]
    pub leader_elect: bool,

    /// Namespace of the Lease: default the pod's namespace (POD_NAMESPACE, or the service
    /// account's namespace file).
    #[arg(long, env = "POD_NAMESPACE")]
    pub leader_election_namespace: Option<String>,

    /// Name of the Lease.
    #[arg(
        long,
        env = "LEADER_ELECTION_ID",
        default_value = "cdn-operator-leader"
    )]
    pub leader_election_id: String,

    /// This replica's identity in the Lease: default the pod name, else host name + random suffix.
    #[arg(long, env = "LEADER_ELECTION_IDENTITY")]
    pub leader_election_identity: Option<String>,

    /// How long a Lease is valid after its last renewal (whole seconds).
    #[arg(long, env = "LEADER_ELECTION_LEASE_DURATION", default_value = "15s", value_parser = parse_duration)]
    pub leader_election_lease_duration: Duration,

    /// How long the leader retries renewing before it gives up (and exits).
    #[arg(long, env = "LEADER_ELECTION_RENEW_DEADLINE", default_value = "10s", value_parser = parse_duration)]
    pub leader_election_renew_deadline: Duration,

    /// How often candidates try to acquire and the leader renews.
    #[arg(long, env = "LEADER_ELECTION_RETRY_PERIOD", default_value = "2s", value_parser = parse_duration)]
    pub leader_election_retry_period: Duration,

    /// Address of /healthz and /readyz (`:8081`, `127.0.0.1:8081`; `0` disables).
    #[arg(long, env = "HEALTH_PROBE_BIND_ADDRESS", default_value = ":8081")]
    pub health_probe_bind_address: String,

    /// Address of /metrics (`:8443`, `127.0.0.1:8443`; `0` disables).
    #[arg(long, env = "METRICS_BIND_ADDRESS", default_value = ":8443")]
    pub metrics_bind_address: String,

    /// Serve /metrics over HTTPS to callers the API server authenticates (TokenReview) and
    /// allows to get the non-resource URL /metrics (SubjectAccessReview), as controller-runtime's
    /// secure metrics do. Set to false for plain, open HTTP (local runs).
    #[arg(long, env = "METRICS_SECURE", default_value_t = true, action = clap::ArgAction::Set,
          num_args = 0..=1, default_missing_value = "true", require_equals = true)]
    pub metrics_secure: bool,

    /// Directory of the metrics serving certificate and key (a mounted kubernetes.io/tls
    /// Secret); reloaded when they change. Default: a self-signed certificate made at start.
    /// `--metrics-cert-path` is controller-runtime's name for it.
    #[arg(
        long,
        visible_alias = "metrics-cert-path",
        env = "METRICS_CERT_DIR",
        value_name = "DIR"
    )]
    pub metrics_cert_dir: Option<PathBuf>,

    /// The certificate (PEM, chain allowed) in --metrics-cert-dir.
    #[arg(long, env = "METRICS_CERT_NAME", default_value = "tls.crt")]
    pub metrics_cert_name: String,

    /// The private key (PEM) in --metrics-cert-dir.
    #[arg(long, env = "METRICS_CERT_KEY", default_value = "tls.key")]
    pub metrics_cert_key: String,

    /// Log format: default json inside a cluster, text elsewhere. `--zap-encoder` (json or
    /// console) is zap's name for it.
    #[arg(long, visible_alias = "zap-encoder", env = "LOG_FORMAT", value_enum)]
    pub log_format: Option<LogFormat>,

    /// Log filter (`info`, `debug`, `info,kube=debug` ...), or a level as zap takes it
    /// (`--zap-log-level`: debug, info, error, panic as error, 1 as debug, 2 and more as trace).
    /// Default: info, the Kubernetes client at warn.
    #[arg(long, visible_alias = "zap-log-level", env = "RUST_LOG", value_name = "LEVEL",
          value_parser = parse_log_level)]
    pub log_level: Option<String>,

    /// On SIGTERM/SIGINT, how long in-flight reconciles may take to finish.
    #[arg(long, env = "SHUTDOWN_TIMEOUT", default_value = "25s", value_parser = parse_duration)]
    pub shutdown_timeout: Duration,

    /// The cluster's DNS domain, in the names of the Services the CdnClusters' nginx looks up
    /// (default: the one this pod's /etc/resolv.conf searches, else cluster.local).
    #[arg(long, env = "KUBERNETES_CLUSTER_DOMAIN", value_parser = parse_cluster_domain)]
    pub cluster_domain: Option<String>,

    #[command(flatten)]
    pub kubeconfig: Kubeconfig,

    #[command(flatten)]
    pub pods: RunAs,

    #[command(flatten)]
    pub images: PodImages,
}

impl Args {
    /// The cluster domain: the flag's, else the one of the pod's DNS search list.
    pub fn cluster_domain(&self) -> String {
        self.cluster_domain.clone().unwrap_or_else(|| {
            std::fs::read_to_string("/etc/resolv.conf")
                .ok()
                .and_then(|conf| cluster_domain_searched(&conf))
                .unwrap_or_else(|| DEFAULT_CLUSTER_DOMAIN.to_string())
        })
    }

    /// The operator's own namespace, where its purge key is kept: the pod's (POD_NAMESPACE, or
    /// the service account's namespace file), else the one it manages (`--namespace`).
    pub fn own_namespace(&self) -> Option<String> {
        leader::namespace(
            self.leader_election_namespace.as_deref(),
            std::path::Path::new(leader::SERVICE_ACCOUNT_NAMESPACE),
        )
        .ok()
        .or_else(|| self.namespace.clone().filter(|ns| !ns.is_empty()))
    }

    pub fn scope(&self) -> Scope {
        match &self.namespace {
            Some(ns) if !ns.is_empty() => Scope::Namespace(ns.clone()),
            _ => Scope::All,
        }
    }

    /// The election settings, or None with `--leader-elect=false`. Checked before connecting.
    pub fn election(&self) -> Result<Option<leader::Config>, leader::ConfigError> {
        if !self.leader_elect {
            return Ok(None);
        }
        let namespace = leader::namespace(
            self.leader_election_namespace.as_deref(),
            std::path::Path::new(leader::SERVICE_ACCOUNT_NAMESPACE),
        )?;
        let config = leader::Config {
            namespace,
            lease_name: self.leader_election_id.clone(),
            identity: match &self.leader_election_identity {
                Some(identity) => identity.clone(),
                None => leader::default_identity(self.pod_name.as_deref()),
            },
            lease_duration: self.leader_election_lease_duration,
            renew_deadline: self.leader_election_renew_deadline,
            retry_period: self.leader_election_retry_period,
        };
        config.validate()?;
        Ok(Some(config))
    }

    /// Where the metrics certificate comes from; None with `--metrics-secure=false` (plain HTTP).
    /// Checked before connecting.
    pub fn metrics_tls(&self) -> Result<Option<tls::Source>, super::Error> {
        match (&self.metrics_cert_dir, self.metrics_secure) {
            (Some(_), false) => Err(super::Error::CertificateWithoutTls),
            (None, false) => Ok(None),
            (None, true) => Ok(Some(tls::Source::SelfSigned)),
            (Some(dir), true) => Ok(Some(tls::Source::Files {
                cert: dir.join(&self.metrics_cert_name),
                key: dir.join(&self.metrics_cert_key),
            })),
        }
    }

    pub(super) fn telemetry(&self) -> Result<telemetry::Settings, telemetry::TelemetryError> {
        let filter = self
            .log_level
            .clone()
            .filter(|level| !level.is_empty())
            .unwrap_or_else(|| logs::DEFAULT_LOG_FILTER.into());
        Ok(telemetry::Settings {
            format: self
                .log_format
                .unwrap_or_else(LogFormat::default_for_environment),
            filter,
            otlp: Otlp::from_env(
                telemetry::Service {
                    name: "cdn-operator",
                    version: crate::VERSION,
                },
                |name| std::env::var(name).ok(),
            )?,
        })
    }
}

/// A log filter as `--log-level` takes it: an `EnvFilter` (checked when logging starts), or one of
/// zap's levels as kubebuilder's `--zap-log-level` takes them. zap's words `debug`, `info` and
/// `error` are EnvFilter's too; `panic` (nothing below a panic, which the operator never logs) is
/// read as `error`, the least it logs; a number N > 0 is zap's verbosity V(N), debug for 1, and
/// beyond debug (trace) from 2. EnvFilter would read a number as a level from error (1) to trace
/// (5) instead: the kubebuilder meaning wins. Empty (an empty RUST_LOG) is the default.
pub fn parse_log_level(value: &str) -> Result<String, String> {
    let value = value.trim();
    if value.eq_ignore_ascii_case("panic") {
        return Ok("error".into());
    }
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit() || b == b'-') {
        return match value.parse::<i64>() {
            Ok(1) => Ok("debug".into()),
            Ok(n) if n > 1 => Ok("trace".into()),
            _ => Err(format!(
                "zap's numeric levels are integers > 0 (1: debug, 2 and more: trace), not {value}"
            )),
        };
    }
    Ok(value.to_string())
}

/// The cluster domain a pod's resolv.conf searches: kubelet writes `search <namespace>.svc.<domain>
/// svc.<domain> <domain>`; `None` outside a cluster.
pub fn cluster_domain_searched(resolv_conf: &str) -> Option<String> {
    resolv_conf
        .lines()
        .filter_map(|line| line.strip_prefix("search"))
        .flat_map(str::split_whitespace)
        .find_map(|domain| domain.strip_prefix("svc."))
        .and_then(|domain| parse_cluster_domain(domain).ok())
}

#[cfg(test)]
mod tests {
    use super::{cluster_domain_searched, parse_log_level, Args, LogFormat};
    use clap::{Args as _, Parser};
    use std::collections::BTreeSet;

    fn run() -> clap::Command {
        Args::augment_args(clap::Command::new("run"))
    }

    #[test]
    fn every_flag_has_an_environment_variable_and_the_help_names_it() {
        let mut run = run();
        let help = run.render_long_help().to_string();
        let mut names = BTreeSet::new();
        for arg in run.get_arguments() {
            let id = arg.get_id().as_str();
            if matches!(id, "help" | "version") {
                continue;
            }
            let env = arg
                .get_env()
                .unwrap_or_else(|| panic!("--{id} has no environment variable"))
                .to_str()
                .unwrap();
            assert!(names.insert(env), "{env} is the variable of two flags");
            assert!(help.contains(&format!("[env: {env}")), "--help: {env}");
        }
        // Every flag was walked, not only the few with a variable.
        assert!(names.len() >= 25, "{names:?}");
        assert!(names.contains("KUBECONFIG") && names.contains("RUST_LOG"));
    }

    #[derive(Parser)]
    struct Run {
        #[command(flatten)]
        args: Args,
    }

    #[test]
    fn kubebuilder_flag_names_are_accepted() {
        let Run { args } = Run::try_parse_from([
            "run",
            "--zap-log-level=1",
            "--zap-encoder=console",
            "--metrics-cert-path=/tls",
            "--metrics-cert-name=cert.pem",
            "--metrics-cert-key=key.pem",
            "--kubeconfig=/etc/kube/config",
            "--leader-elect=false",
            "--metrics-bind-address=:8443",
            "--health-probe-bind-address=:8081",
            "--metrics-secure=true",
        ])
        .unwrap();
        assert_eq!(args.log_level.as_deref(), Some("debug"));
        assert_eq!(args.log_format, Some(LogFormat::Text));
        assert_eq!(
            args.metrics_tls().unwrap(),
            Some(crate::runtime::tls::Source::Files {
                cert: "/tls/cert.pem".into(),
                key: "/tls/key.pem".into()
            })
        );
        assert_eq!(
            args.kubeconfig.kubeconfig.as_deref(),
            Some(std::ffi::OsStr::new("/etc/kube/config"))
        );
        // Go's boolean flags: alone, true; with a value, after `=` only.
        for (given, elect) in [
            (&["--leader-elect"][..], true),
            (&["--leader-elect=false"], false),
        ] {
            let argv = ["run"].iter().chain(given).chain(&["--metrics-secure"]);
            let Run { args } = Run::try_parse_from(argv).unwrap();
            assert_eq!(args.leader_elect, elect, "{given:?}");
            assert!(args.metrics_secure);
        }
        // What docs/operations.md says is refused, not ignored.
        for refused in [
            "--enable-http2=false",
            "--zap-devel",
            "--zap-stacktrace-level=error",
            "--zap-time-encoding=rfc3339",
            "--webhook-cert-path=/tls",
        ] {
            let error = Run::try_parse_from(["run", refused]).err().expect(refused);
            assert_eq!(
                error.kind(),
                clap::error::ErrorKind::UnknownArgument,
                "{refused}"
            );
        }
        for help in [
            "--zap-log-level",
            "--zap-encoder",
            "--metrics-cert-path",
            "--kubeconfig",
        ] {
            assert!(
                run().render_long_help().to_string().contains(help),
                "{help}"
            );
        }
    }

    #[test]
    fn zap_levels_are_read_as_zap_reads_them() {
        for (zap, filter) in [
            ("debug", "debug"),
            ("info", "info"),
            ("error", "error"),
            ("panic", "error"),
            ("1", "debug"),
            ("2", "trace"),
            ("10", "trace"),
            ("info,kube_client=debug", "info,kube_client=debug"),
            ("", ""),
        ] {
            assert_eq!(parse_log_level(zap).as_deref(), Ok(filter), "{zap}");
        }
        for refused in ["0", "-1"] {
            let error = parse_log_level(refused).unwrap_err();
            assert!(error.contains("integers > 0"), "{refused}: {error}");
        }
    }

    #[test]
    fn the_cluster_domain_is_the_one_a_pod_searches() {
        let pod = "search cdn-operator-system.svc.example.internal svc.example.internal example.internal\nnameserver 10.96.0.10\noptions ndots:5\n";
        assert_eq!(
            cluster_domain_searched(pod).as_deref(),
            Some("example.internal")
        );
        let host = "nameserver 127.0.0.53\nsearch corp.example\n";
        assert_eq!(cluster_domain_searched(host), None);
        assert_eq!(cluster_domain_searched("search svc.\n"), None);
        assert_eq!(
            cluster_domain_searched("search svc.example.internal.\n").as_deref(),
            Some("example.internal")
        );
    }
}
