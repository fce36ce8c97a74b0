//! The cluster DNS of the local node of the end-to-end suite: answers the pods' queries (the
//! kubelet's `clusterDNS`) for the cluster domain from the Services and EndpointSlices of every
//! namespace, as CoreDNS's kubernetes plugin does for the names the CDN uses
//! (`cdn_operator_e2e::cluster_dns` says which). UDP only; a line on stderr per changed name;
//! exits 0 on SIGTERM or SIGINT.
//!
//! `cargo run -p cdn-operator-e2e --bin cluster-dns -- --listen 10.88.0.1:53`

use cdn_operator::cdncluster::sources::{parse_cluster_domain, DEFAULT_CLUSTER_DOMAIN};
use cdn_operator_e2e::cluster_dns::follow;
use cdn_operator_testkit::Dns;
use clap::Parser;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::Api;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Client, Config, ResourceExt};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use tokio::signal::unix::{signal, SignalKind};

#[derive(Parser, Debug)]
#[command(
    name = "cluster-dns",
    about = "DNS for the cluster domain from the Services and EndpointSlices of the cluster of KUBECONFIG (the e2e node's cluster DNS)"
)]
struct Args {
    /// The UDP address to answer on: the kubelet's clusterDNS, port 53.
    #[arg(long, default_value = "127.0.0.1:53")]
    listen: SocketAddr,
    /// The cluster domain: `SVC.NS.svc.DOMAIN`.
    #[arg(long, default_value = DEFAULT_CLUSTER_DOMAIN, value_parser = parse_cluster_domain)]
    domain: String,
    /// The kubeconfig to reach the API server with; without it, KUBECONFIG, ~/.kube/config or
    /// the in-cluster account.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
}

fn say(line: &str) {
    eprintln!("cluster-dns: {line}");
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    cdn_operator_e2e::crypto();
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            say(&error);
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), String> {
    let mut terminate = signal(SignalKind::terminate()).map_err(|e| format!("SIGTERM: {e}"))?;
    let mut interrupt = signal(SignalKind::interrupt()).map_err(|e| format!("SIGINT: {e}"))?;
    let config = match &args.kubeconfig {
        Some(path) => {
            let kubeconfig = Kubeconfig::read_from(path)
                .map_err(|e| format!("reading {}: {e}", path.display()))?;
            Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .map_err(|e| format!("{}: {e}", path.display()))?
        }
        None => Config::infer()
            .await
            .map_err(|e| format!("no kubeconfig: {e}"))?,
    };
    let server = config.cluster_url.clone();
    let client = Client::try_from(config).map_err(|e| format!("client: {e}"))?;
    let dns = Dns::try_start_on(args.listen)
        .map_err(|e| format!("listening on {} (udp): {e}", args.listen))?;
    say(&format!(
        "answering for {} on {} (udp), from the Services and EndpointSlices of {server}",
        args.domain,
        dns.addr()
    ));

    // Only what the records are made of is kept.
    let services = watcher(
        Api::<Service>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .modify(|service| service.managed_fields_mut().clear());
    let slices = watcher(
        Api::<EndpointSlice>::all(client),
        watcher::Config::default(),
    )
    .default_backoff()
    .modify(|slice| slice.managed_fields_mut().clear());
    let following = follow(services, slices, &dns, &args.domain, |line| say(&line));
    tokio::select! {
        () = following => return Err("the watches ended".into()),
        _ = terminate.recv() => say("SIGTERM: stopping"),
        _ = interrupt.recv() => say("SIGINT: stopping"),
    }
    // Joins the server's thread.
    drop(dns);
    Ok(())
}
