//! cdn-operator: a Kubernetes operator for CDN clusters of nginx (CdnCluster) and one-shot
//! commands (At).

pub mod api;
pub mod at;
pub mod cdncluster;
pub mod cli;
pub mod kubernetes;
pub mod nginx_cache;
pub mod nginx_metrics;
pub mod purge;
pub mod reconcile;
pub mod run;

/// The runtime around the controllers, a crate of its own (runtime/) that knows no custom
/// resource.
pub use cdn_operator_runtime as runtime;

/// The operator's version, as built.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// A command's fatal failure: the message on one line of stderr, exit code 1. Some errors (a YAML
/// parser's, with its source snippet) span lines.
pub fn fail(message: &str) -> std::process::ExitCode {
    let line = message
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    eprintln!("cdn-operator: {line}");
    std::process::ExitCode::FAILURE
}
