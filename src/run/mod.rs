//! `cdn-operator run`: the controllers side by side, with the runtime around them (leader
//! election, probes, metrics, traces, logs, graceful shutdown). The glue between the domain-free
//! runtime and the controllers lives here.

mod args;
mod gauges;
mod glue;

pub use args::Args;
pub use gauges::{register_at_gauges, register_cdncluster_gauges, register_purge_gauges};

use crate::kubernetes::events::Events;
use crate::runtime::access::Access;
use crate::runtime::http::{self, Health};
use crate::runtime::leader::Leadership;
use crate::runtime::leader::{self, Elector};
use crate::runtime::metrics::Metrics;
use crate::runtime::shutdown::{self, Shutdown};
use crate::runtime::telemetry::{self, Telemetry};
use crate::runtime::tls::{self, Certificate};
use crate::{at, cdncluster, purge};
use glue::Glue;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

/// Runs the operator; any failure is one line on stderr and a non-zero exit.
pub fn main(args: Args) -> ExitCode {
    // One thread: the operator waits on the API server far more than it computes (at most a
    // tenth of a core), and with a thread per core each wake-up crossed threads. Measured on a
    // real server at 1,000 CdnClusters: context switches took 13.6 % of its CPU with two
    // threads, 7.4 % with one.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(error) => return crate::fail(&Error::AsyncRuntime(error).to_string()),
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
        Err(error) => crate::fail(&error.to_string()),
    }
}

async fn telemetry_shutdown(telemetry: Telemetry) {
    telemetry.shutdown(Duration::from_secs(5)).await;
}

/// Why the operator stopped, or could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot start the async runtime: {0}")]
    AsyncRuntime(#[source] std::io::Error),
    #[error(transparent)]
    Telemetry(#[from] telemetry::TelemetryError),
    #[error(transparent)]
    Election(#[from] leader::ConfigError),
    #[error("cannot handle signals: {0}")]
    Signals(#[source] std::io::Error),
    #[error(transparent)]
    Bind(#[from] http::BindError),
    #[error("--metrics-cert-dir needs --metrics-secure=true (plain HTTP takes no certificate)")]
    CertificateWithoutTls,
    #[error(transparent)]
    Certificate(#[from] tls::CertificateError),
    #[error("cannot configure a Kubernetes client: {0}")]
    Client(#[from] crate::kubernetes::client::ConnectError),
    #[error("cannot reach the Kubernetes API server: {0}")]
    Unreachable(#[source] kube::Error),
    #[error("cannot serve {endpoints}: {source}")]
    Serve {
        endpoints: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}; exiting so a fresh process rejoins the election")]
    LostLeadership(#[source] leader::Lost),
    #[error("the controllers stopped unexpectedly")]
    ControllersStopped,
}

/// The operator's life: serve probes and metrics, connect, campaign, run the controllers, and
/// on SIGTERM/SIGINT drain them, release the lease and return Ok.
pub async fn run(args: Args) -> Result<(), Error> {
    let election = args.election()?;
    let shutdown = Shutdown::new();
    shutdown::on_signals(&shutdown).map_err(Error::Signals)?;
    // Bound before connecting: a busy port is a configuration error worth failing on at once.
    let probe_listener =
        http::bind("health-probe-bind-address", &args.health_probe_bind_address).await?;
    let metrics_listener = http::bind("metrics-bind-address", &args.metrics_bind_address).await?;
    // The certificate too: a missing or broken file fails the start, not the first scrape.
    let metrics_tls = match (&metrics_listener, args.metrics_tls()?) {
        (Some(_), Some(source)) => Some(Certificate::load(source)?),
        _ => None,
    };

    let metrics = Metrics::new();
    let client = tokio::select! {
        client = connect(&args.kubeconfig, &metrics) => client?,
        _ = shutdown.clone().cancelled_owned() => return Ok(()),
    };

    let health = Health::default();
    let servers_stop = Shutdown::new();
    // The probes stay plain and open (the kubelet probes them); /metrics is HTTPS behind the API
    // server's authentication and authorization unless --metrics-secure=false.
    let metrics_router = match &metrics_tls {
        Some(_) => Access::new(client.clone()).protect(http::metrics(metrics.clone())),
        None => http::metrics(metrics.clone()),
    };
    for (endpoints, listener, router, tls) in [
        ("probes", probe_listener, http::probes(health.clone()), None),
        ("metrics", metrics_listener, metrics_router, metrics_tls),
    ] {
        if let Some(listener) = listener {
            let address = listener
                .local_addr()
                .map_err(|source| Error::Serve { endpoints, source })?;
            let scheme = if tls.is_some() { "HTTPS" } else { "HTTP" };
            tracing::info!(%address, endpoints, "serving {scheme}");
            let stop = servers_stop.clone().cancelled_owned();
            tokio::spawn(async move {
                let served = match tls {
                    Some(certificate) => {
                        let config = certificate.config.clone();
                        certificate.watch();
                        http::serve_tls(listener, router, config, stop).await
                    }
                    None => http::serve(listener, router, stop).await,
                };
                if let Err(error) = served {
                    tracing::error!(%error, %address, endpoints, "{scheme} server failed");
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

    // The key purges are signed with, kept in a Secret of the operator's namespace: its public
    // half goes into every cache's ConfigMap. Without it the operator runs, and purges fail
    // saying why.
    let signer = match args.own_namespace() {
        Some(namespace) => purge::signing::load(&client, &namespace).await,
        None => Err(purge::signing::SigningError::NoNamespace),
    }
    .map(Arc::new)
    .map_err(|error| {
        tracing::error!(%error, "purges cannot be applied: {error}");
        error.to_string()
    });
    // The pods purges reach, kept from the CdnClusters' watch of their pods.
    let purge_pods = purge::pods::PodTargets::default();
    let (ctx, controller) = cdncluster::controller(
        client.clone(),
        &scope,
        events.clone(),
        leadership.clone(),
        concurrency,
        cdncluster::Settings {
            run_as: args.pods.clone(),
            pods: cdncluster::build::PodSettings {
                images: args.images.clone(),
                purge_keys: signer
                    .as_ref()
                    .map(|s| s.public_keys_file())
                    .unwrap_or_default(),
            },
            cluster_domain: args.cluster_domain(),
        },
        purge_pods.writer(),
    );
    register_cdncluster_gauges(&metrics, ctx.clusters.clone(), leadership.clone());
    let (purge_ctx, purge_controller) = purge::controller(
        client.clone(),
        &scope,
        events.clone(),
        leadership.clone(),
        concurrency,
        ctx.clusters.clone(),
        ctx.shared.ready.clone(),
        purge_pods,
        signer,
    );
    register_purge_gauges(&metrics, purge_ctx.purges.clone(), leadership.clone());
    let cdnpurges = glue.controller(
        purge::CONTROLLER,
        purge_controller,
        purge::reconcile,
        purge_ctx,
    );
    let cdnclusters = glue.controller(
        cdncluster::CONTROLLER,
        controller,
        cdncluster::reconcile,
        ctx,
    );

    let (at_ctx, at_controller, at_janitor) = at::controller(
        client.clone(),
        &scope,
        events.clone(),
        leadership.clone(),
        concurrency,
        args.pods.clone(),
        args.images.nginx.clone(),
    );
    register_at_gauges(&metrics, at_ctx.ats.clone(), leadership.clone());
    let ats = glue.controller(at::CONTROLLER, at_controller, at::reconcile, at_ctx.clone());
    let at_pods = glue.controller(at::JANITOR, at_janitor, at::release_orphan, at_ctx);

    tracing::info!(
        ?scope,
        leader_election = elector.is_some(),
        "starting the controllers"
    );
    let mut controllers = AbortOnDrop(tokio::spawn(async move {
        futures::future::join_all([cdnclusters, cdnpurges, ats, at_pods]).await;
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
            result.map_err(Error::LostLeadership)?;
            false
        }
        _ = &mut controllers.0 => {
            // On a signal, idle controllers may stop before the election loop notices.
            if !shutdown.is_cancelled() {
                return Err(Error::ControllersStopped);
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
/// Its requests are counted in `metrics`.
async fn connect(
    kubeconfig: &crate::kubernetes::client::Kubeconfig,
    metrics: &Metrics,
) -> Result<kube::Client, Error> {
    let client =
        crate::kubernetes::client::connect(kubeconfig, Some(&metrics.count_requests())).await?;
    let version = client
        .apiserver_version()
        .await
        .map_err(Error::Unreachable)?;
    tracing::info!(version = %version.git_version, "connected to the Kubernetes API server");
    Ok(client)
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
