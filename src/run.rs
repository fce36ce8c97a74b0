//! `cdn-operator run`: the controllers side by side, with the runtime around them.

use crate::cdncluster;
use crate::controller::{Events, Leadership, Scope};
use futures::StreamExt;
use std::process::ExitCode;

#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Watch and manage one namespace only (namespaced RBAC); default: every namespace.
    #[arg(long, env = "WATCH_NAMESPACE")]
    pub namespace: Option<String>,

    /// How many objects each controller reconciles at once.
    #[arg(long, env = "MAX_CONCURRENT_RECONCILES", default_value_t = 16)]
    pub max_concurrent_reconciles: u16,

    /// This replica's identity in Events (the pod name in a cluster).
    #[arg(long, env = "POD_NAME")]
    pub pod_name: Option<String>,
}

impl Args {
    pub fn scope(&self) -> Scope {
        match &self.namespace {
            Some(ns) if !ns.is_empty() => Scope::Namespace(ns.clone()),
            _ => Scope::All,
        }
    }
}

pub fn main(args: Args) -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,kube=warn".into()),
        )
        .init();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(error) => {
            eprintln!("cdn-operator: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("cdn-operator: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), String> {
    let client = crate::client::connect()
        .await
        .map_err(|e| format!("cannot configure a Kubernetes client: {e}"))?;
    client
        .apiserver_version()
        .await
        .map_err(|e| format!("cannot reach the Kubernetes API server: {e}"))?;
    let scope = args.scope();
    let leadership = Leadership::always();
    let events = Events::new(client.clone(), args.pod_name.clone());

    let (ctx, controller) = cdncluster::controller(
        client.clone(),
        &scope,
        events,
        leadership,
        args.max_concurrent_reconciles,
    );
    tracing::info!(?scope, "starting the controllers");
    controller
        .shutdown_on_signal()
        .run(cdncluster::reconcile, cdncluster::error_policy, ctx)
        .for_each(|_| async {})
        .await;
    Ok(())
}
