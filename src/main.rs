use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// jemalloc: the caches hold hundreds of thousands of small objects, which glibc's malloc sizes
/// with a header each and spreads over per-thread arenas. Measured on a real API server with
/// 10,000 CdnClusters: peak resident memory 43.5 MiB with glibc (one arena), 40.3 with jemalloc as
/// configured below (38.8 with the release profile's `panic = "abort"` too).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options (`_RJEM_MALLOC_CONF` in the environment adds to them): one arena, as the
/// operator mostly waits on the API server and memory freed in one arena is reused only there;
/// freed pages returned to the system at once, not kept for reuse for ten seconds, so the
/// caches' tables, which double as they grow, do not hold their old pages too. That costs 26 page
/// faults per CdnCluster created; a second's decay took them to 2 (2 to 6 % less CPU), but a
/// restart over 10,000 CdnClusters peaked 4 MiB higher (run 17, docs/benchmark-history.md).
#[export_name = "_rjem_malloc_conf"]
static MALLOC_CONF: &[u8] = b"narenas:1,dirty_decay_ms:0,muzzy_decay_ms:0\0";

/// Kubernetes operator for CDN clusters of nginx (CdnCluster) and one-shot commands (At).
#[derive(Parser)]
#[command(name = "cdn-operator", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the controllers against the cluster of --kubeconfig (KUBECONFIG), or the in-cluster config.
    Run(Box<cdn_operator::run::Args>),
    /// Print the children the operator would create for some manifests (no cluster needed).
    Render(cdn_operator::cli::render::Args),
    /// Show the topology: balancers → caches → origins, with each cluster's state.
    Graph(cdn_operator::cli::graph::Args),
    /// Print the CustomResourceDefinitions as YAML, generated from the code.
    Crd,
    /// The sidecar of the CdnClusters' pods: count nginx's requests and serve them on /metrics.
    NginxMetrics(cdn_operator::nginx_metrics::Args),
    /// Print a token of a CdnCluster's signed URLs (spec.signedUrls), or the URL with it.
    SignUrl(cdn_operator::cli::sign_url::Args),
    /// Uninstall: release the finalizer of every At pod (the Helm chart's pre-delete hook).
    ReleaseFinalizers(cdn_operator::cli::release_finalizers::Args),
    /// Print the version.
    Version,
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // Help and version go to stdout as clap writes them; a usage error is one line on
        // stderr (clap's first), and exit code 2 as clap's.
        Err(error)
            if !error.use_stderr()
                || error.kind()
                    == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand =>
        {
            error.exit()
        }
        Err(error) => {
            let text = error.to_string();
            let first = text.lines().next().unwrap_or("invalid arguments");
            eprintln!("cdn-operator: {}", first.trim_start_matches("error: "));
            return ExitCode::from(2);
        }
    };
    match cli.command {
        Command::Crd => cdn_operator::cli::print_out(&cdn_operator::api::crds_yaml()),
        Command::Version => {
            cdn_operator::cli::print_out(&format!("cdn-operator {}\n", cdn_operator::VERSION))
        }
        Command::Run(args) => cdn_operator::run::main(*args),
        Command::Render(args) => cdn_operator::cli::render::main(args),
        Command::Graph(args) => cdn_operator::cli::graph::main(args),
        Command::NginxMetrics(args) => cdn_operator::nginx_metrics::main(args),
        Command::SignUrl(args) => cdn_operator::cli::sign_url::main(args),
        Command::ReleaseFinalizers(args) => cdn_operator::cli::release_finalizers::main(args),
    }
}
