//! `cdn-operator run`: the controllers side by side, with the runtime around them (leader
//! election, probes, metrics, traces, logs, graceful shutdown). The glue between the domain-free
//! runtime and the controllers lives here.

use crate::api::{At, CdnCluster, Outcome, Phase, State};
use crate::controller::{Events, Leadership, Scope};
use crate::runtime::http::{self, Health};
use crate::runtime::instrument::Reconciles;
use crate::runtime::leader::{self, Elector};
use crate::runtime::logs::{self, LogFormat};
use crate::runtime::metrics::Metrics;
use crate::runtime::parse_duration;
use crate::runtime::shutdown::{self, Shutdown};
use crate::runtime::telemetry::{self, Otlp, Telemetry};
use crate::{at, cdncluster};
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use kube::runtime::controller::{self as kube_controller, Action, Controller};
use kube::runtime::reflector::Store;
use kube::Resource;
use serde::de::DeserializeOwned;
use std::fmt::Debug;
use std::future::Future;
use std::hash::Hash;
use std::process::ExitCode;
use std::sync::Arc;
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
    /// for a single local process.
    #[arg(long, env = "LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
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
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    pub leader_election_lease_duration: Duration,

    /// How long the leader retries renewing before it gives up (and exits).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub leader_election_renew_deadline: Duration,

    /// How often candidates try to acquire and the leader renews.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub leader_election_retry_period: Duration,

    /// Address of /healthz and /readyz (`:8081`, `127.0.0.1:8081`; `0` disables).
    #[arg(long, env = "HEALTH_PROBE_BIND_ADDRESS", default_value = ":8081")]
    pub health_probe_bind_address: String,

    /// Address of /metrics (`:8080`, `127.0.0.1:8080`; `0` disables).
    #[arg(long, env = "METRICS_BIND_ADDRESS", default_value = ":8080")]
    pub metrics_bind_address: String,

    /// Log format: default json inside a cluster, text elsewhere.
    #[arg(long, env = "LOG_FORMAT", value_enum)]
    pub log_format: Option<LogFormat>,

    /// Log filter (`info`, `debug`, `info,kube=debug` ...): default RUST_LOG, else info.
    #[arg(long)]
    pub log_level: Option<String>,

    /// On SIGTERM/SIGINT, how long in-flight reconciles may take to finish.
    #[arg(long, env = "SHUTDOWN_TIMEOUT", default_value = "25s", value_parser = parse_duration)]
    pub shutdown_timeout: Duration,
}

impl Args {
    pub fn scope(&self) -> Scope {
        match &self.namespace {
            Some(ns) if !ns.is_empty() => Scope::Namespace(ns.clone()),
            _ => Scope::All,
        }
    }

    /// The election settings, or None with `--leader-elect=false`. Checked before connecting.
    pub fn election(&self) -> Result<Option<leader::Config>, String> {
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

    fn telemetry(&self) -> Result<telemetry::Settings, String> {
        let filter = match &self.log_level {
            Some(level) => level.clone(),
            None => std::env::var("RUST_LOG")
                .ok()
                .filter(|v| !v.trim().is_empty())
                .unwrap_or_else(|| logs::DEFAULT_LOG_FILTER.into()),
        };
        Ok(telemetry::Settings {
            format: self
                .log_format
                .unwrap_or_else(LogFormat::default_for_environment),
            filter,
            otlp: Otlp::from_env(|name| std::env::var(name).ok())?,
        })
    }
}

/// Runs the operator; any failure is one line on stderr and a non-zero exit.
pub fn main(args: Args) -> ExitCode {
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(error) => {
            eprintln!("cdn-operator: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        let telemetry = telemetry::init(&args.telemetry()?)?;
        let result = run(args).await;
        telemetry_shutdown(telemetry).await;
        result
    });
    // Whatever still runs (an abandoned reconcile) is dropped, not waited for.
    runtime.shutdown_timeout(Duration::from_secs(1));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("cdn-operator: {}", one_line(&error));
            ExitCode::FAILURE
        }
    }
}

/// Some errors (a YAML parser's, with its source snippet) span lines: the fatal message is one.
fn one_line(message: &str) -> String {
    message
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

async fn telemetry_shutdown(telemetry: Telemetry) {
    telemetry.shutdown(Duration::from_secs(5)).await;
}

/// The operator's life: serve probes and metrics, connect, campaign, run the controllers, and
/// on SIGTERM/SIGINT drain them, release the lease and return Ok.
pub async fn run(args: Args) -> Result<(), String> {
    let election = args.election()?;
    let shutdown = Shutdown::new();
    shutdown::on_signals(&shutdown).map_err(|e| format!("cannot handle signals: {e}"))?;
    // Bound before connecting: a busy port is a configuration error worth failing on at once.
    let probe_listener =
        http::bind("health-probe-bind-address", &args.health_probe_bind_address).await?;
    let metrics_listener = http::bind("metrics-bind-address", &args.metrics_bind_address).await?;

    let client = tokio::select! {
        client = connect() => client?,
        _ = shutdown.clone().cancelled_owned() => return Ok(()),
    };

    let metrics = Metrics::new();
    let health = Health::default();
    let servers_stop = Shutdown::new();
    for (endpoints, listener, router) in [
        ("probes", probe_listener, http::probes(health.clone())),
        ("metrics", metrics_listener, http::metrics(metrics.clone())),
    ] {
        if let Some(listener) = listener {
            let address = listener
                .local_addr()
                .map_err(|e| format!("cannot serve {endpoints}: {e}"))?;
            tracing::info!(%address, endpoints, "serving HTTP");
            let stop = servers_stop.clone().cancelled_owned();
            tokio::spawn(async move {
                if let Err(error) = http::serve(listener, router, stop).await {
                    tracing::error!(%error, %address, endpoints, "HTTP server failed");
                }
            });
        }
    }

    let leadership = match &election {
        Some(_) => Leadership::standby(),
        None => Leadership::always(),
    };
    let elector = election.map(|config| {
        let status = metrics.leader_status(&config.lease_name);
        Arc::new(Elector::new(
            client.clone(),
            config,
            leadership.clone(),
            status,
        ))
    });

    let scope = args.scope();
    let events = Events::new(client.clone(), args.pod_name.clone());
    let concurrency = args.max_concurrent_reconciles;
    let glue = Glue {
        metrics: metrics.clone(),
        health: health.clone(),
        shutdown: shutdown.clone(),
        leadership: leadership.clone(),
        concurrency,
    };

    let (ctx, controller) = cdncluster::controller(
        client.clone(),
        &scope,
        events.clone(),
        leadership.clone(),
        concurrency,
    );
    register_cdncluster_gauges(&metrics, ctx.clusters.clone());
    let ready = {
        let ctx = ctx.clone();
        async move { ctx.wait_until_ready().await }
    };
    let cdnclusters = glue.controller(
        cdncluster::CONTROLLER,
        controller,
        ready,
        cdncluster::reconcile,
        cdncluster::error_policy,
        ctx,
    );

    let (at_ctx, at_controller, at_janitor) = at::controller(
        client.clone(),
        &scope,
        events.clone(),
        leadership.clone(),
        concurrency,
    );
    register_at_gauges(&metrics, at_ctx.ats.clone());
    let at_ready = || {
        let ctx = at_ctx.clone();
        async move { ctx.wait_until_ready().await }
    };
    let ats = glue.controller(
        at::CONTROLLER,
        at_controller,
        at_ready(),
        at::reconcile,
        at::error_policy,
        at_ctx.clone(),
    );
    let at_pods = glue.controller(
        at::JANITOR,
        at_janitor,
        at_ready(),
        at::release_orphan,
        at::orphan_error_policy,
        at_ctx.clone(),
    );

    tracing::info!(
        ?scope,
        leader_election = elector.is_some(),
        "starting the controllers"
    );
    let mut controllers = AbortOnDrop(tokio::spawn(async move {
        futures::future::join_all([cdnclusters, ats, at_pods]).await;
    }));

    let campaign = {
        let elector = elector.clone();
        let shutdown = shutdown.clone();
        let alive = health.alive_while("leader-election");
        async move {
            let _alive = alive;
            match elector {
                Some(elector) => elector.run(shutdown.clone().cancelled_owned()).await,
                None => {
                    shutdown.clone().cancelled_owned().await;
                    Ok(())
                }
            }
        }
    };
    let stopped = tokio::select! {
        result = campaign => {
            // Ok only once shutdown is requested; a loss has already stopped the reconciles.
            result.map_err(|lost| format!("{lost}; exiting so a fresh process rejoins the election"))?;
            false
        }
        _ = &mut controllers.0 => {
            // On a signal, idle controllers may stop before the election loop notices.
            if !shutdown.is_cancelled() {
                return Err("the controllers stopped unexpectedly".into());
            }
            true
        }
    };

    // Shutdown: the controllers stop taking work on the same signal; in-flight reconciles get
    // the timeout to finish.
    if !stopped {
        tracing::info!(timeout = ?args.shutdown_timeout, "shutting down: finishing in-flight reconciles");
        match tokio::time::timeout(args.shutdown_timeout, &mut controllers.0).await {
            Ok(_) => tracing::info!("the controllers stopped"),
            Err(_) => tracing::warn!(
                timeout = ?args.shutdown_timeout,
                "in-flight reconciles did not finish in time; abandoning them (they are retried by the next leader)"
            ),
        }
    } else {
        tracing::info!("the controllers stopped");
    }
    drop(controllers);
    match &elector {
        Some(elector) => elector.release().await,
        None => leadership.set(false),
    }
    servers_stop.cancel();
    Ok(())
}

/// A client, checked by one request so an unreachable API server fails at start.
async fn connect() -> Result<kube::Client, String> {
    let client = crate::client::connect()
        .await
        .map_err(|e| format!("cannot configure a Kubernetes client: {e}"))?;
    let version = client
        .apiserver_version()
        .await
        .map_err(|e| format!("cannot reach the Kubernetes API server: {e}"))?;
    tracing::info!(version = %version.git_version, "connected to the Kubernetes API server");
    Ok(client)
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What every controller is wired to: metrics, probes, the shutdown signal.
struct Glue {
    metrics: Arc<Metrics>,
    health: Health,
    shutdown: Shutdown,
    leadership: Leadership,
    concurrency: u16,
}

impl Glue {
    /// Wires one controller: readiness once `ready` completes (its caches listed), liveness while
    /// its loop runs, each reconcile instrumented, graceful shutdown on the signal. Returns the
    /// loop, to be polled until the controller stops.
    fn controller<K, Ctx, Fut, E>(
        &self,
        name: &'static str,
        controller: Controller<K>,
        ready: impl Future<Output = ()> + Send + 'static,
        reconcile: fn(Arc<K>, Arc<Ctx>) -> Fut,
        error_policy: fn(Arc<K>, &E, Arc<Ctx>) -> Action,
        ctx: Arc<Ctx>,
    ) -> BoxFuture<'static, ()>
    where
        K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
        K::DynamicType: Eq + Hash + Clone + Debug + Unpin + Send + Sync,
        Ctx: Send + Sync + 'static,
        Fut: Future<Output = Result<Action, E>> + Send + 'static,
        E: std::error::Error + Send + 'static,
    {
        self.health.ready_when(name, ready);
        let alive = self.health.alive_while(name);
        let reconciles = Reconciles::new(
            self.metrics.controller(name, self.concurrency),
            self.leadership.clone(),
        );
        let stream = controller
            .graceful_shutdown_on(self.shutdown.clone().cancelled_owned())
            .run(
                move |obj, ctx| reconciles.run(obj, ctx, reconcile),
                error_policy,
                ctx,
            );
        async move {
            let _alive = alive;
            stream
                .for_each(|result| async move {
                    match result {
                        // error_policy has logged it.
                        Ok(_) | Err(kube_controller::Error::ReconcilerFailed(..)) => {}
                        // A trigger for an object deleted meanwhile: every deletion makes some.
                        Err(error @ kube_controller::Error::ObjectNotFound(_)) => {
                            tracing::debug!(controller = name, %error, "nothing to reconcile")
                        }
                        Err(error) => tracing::warn!(controller = name, %error, "controller error"),
                    }
                })
                .await;
        }
        .boxed()
    }
}

/// `cdn_operator_cdnclusters{state}`: CdnClusters in the cache by `status.state`, at scrape time.
pub fn register_cdncluster_gauges(metrics: &Metrics, clusters: Store<CdnCluster>) {
    register_count_by(
        metrics,
        "cdn_operator_cdnclusters",
        "CdnClusters by status.state (Unknown: not reconciled yet)",
        &["state"],
        clusters,
        State::ALL.iter().map(|s| [s.as_str()]).collect(),
        |c| {
            c.status
                .as_ref()
                .and_then(|s| s.state)
                .map(|s| [s.as_str()])
        },
    );
}

/// `cdn_operator_ats{phase,outcome}`: Ats in the cache by `status.phase` and, once DONE,
/// `status.outcome` (empty before), at scrape time.
pub fn register_at_gauges(metrics: &Metrics, ats: Store<At>) {
    let mut all = vec![[Phase::Pending.as_str(), ""], [Phase::Running.as_str(), ""]];
    all.extend(Outcome::ALL.map(|o| [Phase::Done.as_str(), o.as_str()]));
    register_count_by(
        metrics,
        "cdn_operator_ats",
        "Ats by status.phase and status.outcome (Unknown: not reconciled yet)",
        &["phase", "outcome"],
        ats,
        all,
        |a| {
            let status = a.status.as_ref()?;
            Some([
                status.phase?.as_str(),
                status.outcome.map_or("", Outcome::as_str),
            ])
        },
    );
}

/// A gauge family counting the cached objects by `key` (one value per label): every combination
/// in `all` is always present (at 0 when no object has it); objects without a key count under
/// `Unknown` (every label).
fn register_count_by<K, const L: usize>(
    metrics: &Metrics,
    name: &str,
    help: &str,
    labels: &'static [&'static str],
    store: Store<K>,
    all: Vec<[&'static str; L]>,
    key: fn(&K) -> Option<[&'static str; L]>,
) where
    K: Resource + Clone + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Send + Sync,
{
    metrics.register_gauge_fn(name, help, labels, move || {
        let keys: Vec<Option<[&str; L]>> = store.state().iter().map(|o| key(o)).collect();
        let count = |k: Option<[&str; L]>| keys.iter().filter(|x| **x == k).count() as i64;
        let series = |values: [&str; L]| values.iter().map(|v| v.to_string()).collect::<Vec<_>>();
        all.iter()
            .map(|values| (series(*values), count(Some(*values))))
            .chain([(series(["Unknown"; L]), count(None))])
            .collect()
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::reflector;
    use kube::runtime::watcher;

    #[test]
    fn domain_gauges_count_the_cache_by_state_and_phase() {
        let metrics = Metrics::new();
        let (clusters, mut cluster_writer) = reflector::store::<CdnCluster>();
        let (ats, mut at_writer) = reflector::store::<At>();
        register_cdncluster_gauges(&metrics, clusters);
        register_at_gauges(&metrics, ats);
        let cluster = |name: &str, state: Option<&str>| -> CdnCluster {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "cluster.anevia.com/v1", "kind": "CdnCluster",
                "metadata": {"name": name, "namespace": "n"},
                "spec": {"role": "cache", "sources": []},
                "status": state.map(|s| serde_json::json!({"state": s})),
            }))
            .unwrap()
        };
        for c in [
            cluster("a", Some("Running")),
            cluster("b", Some("Running")),
            cluster("c", None),
        ] {
            cluster_writer.apply_watcher_event(&watcher::Event::Apply(c));
        }
        let at: At = serde_json::from_value(serde_json::json!({
            "apiVersion": "cnat.programming-kubernetes.info/v1alpha1", "kind": "At",
            "metadata": {"name": "x", "namespace": "n"},
            "spec": {"schedule": "2020-01-01T00:00:00Z", "command": "echo YAY"},
            "status": {"phase": "DONE", "outcome": "Failed"},
        }))
        .unwrap();
        at_writer.apply_watcher_event(&watcher::Event::Apply(at));
        let text = metrics.encode();
        for line in [
            "cdn_operator_cdnclusters{state=\"Running\"} 2",
            "cdn_operator_cdnclusters{state=\"Unknown\"} 1",
            "cdn_operator_cdnclusters{state=\"WaitingSource\"} 0",
            "cdn_operator_cdnclusters{state=\"Deploying\"} 0",
            "cdn_operator_cdnclusters{state=\"Invalid\"} 0",
            "cdn_operator_ats{phase=\"DONE\",outcome=\"Failed\"} 1",
            "cdn_operator_ats{phase=\"DONE\",outcome=\"Succeeded\"} 0",
            "cdn_operator_ats{phase=\"PENDING\",outcome=\"\"} 0",
            "cdn_operator_ats{phase=\"RUNNING\",outcome=\"\"} 0",
            "cdn_operator_ats{phase=\"Unknown\",outcome=\"Unknown\"} 0",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing `{line}` in:\n{text}"
            );
        }
    }
}
