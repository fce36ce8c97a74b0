//! cdn-operator: a Kubernetes operator for CDN clusters of nginx (CdnCluster) and one-shot
//! commands (At).

pub mod api;
pub mod apply;
pub mod at;
pub mod cache;
pub mod cdncluster;
pub mod cli;
pub mod client;
pub mod compact;
pub mod conditions;
pub mod events;
pub mod fields;
pub mod reconcile;
pub mod restricted;
pub mod run;
pub mod runtime;

/// The operator's version, as built.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
