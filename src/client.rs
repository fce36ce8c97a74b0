//! The Kubernetes client: from KUBECONFIG or the in-cluster config, identified as the operator.

use http::header::{HeaderValue, USER_AGENT};
use kube::{Client, Config};

/// The product in the User-Agent of every request, so API server audit logs and metrics name the
/// operator: `cdn-operator/<version>`.
pub const PRODUCT: &str = "cdn-operator";

/// The User-Agent of every request.
pub fn user_agent() -> String {
    format!("{PRODUCT}/{}", crate::VERSION)
}

/// Sets the operator's User-Agent on a client configuration.
pub fn identify(config: &mut Config) {
    let value = HeaderValue::from_str(&user_agent()).expect("the version is a valid header value");
    config.headers.retain(|(name, _)| name != USER_AGENT);
    config.headers.push((USER_AGENT, value));
}

/// A client for the cluster of `KUBECONFIG` (or `~/.kube/config`), or the in-cluster config.
pub async fn connect() -> Result<Client, kube::Error> {
    // kube is built with ring, but another crate in the graph (in test builds, the fake
    // client's jsonschema) may enable aws-lc-rs too; rustls then refuses to pick one and
    // panics. Choose explicitly; an Err means a provider is already installed, which is fine.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut config = Config::infer().await.map_err(kube::Error::InferConfig)?;
    identify(&mut config);
    Client::try_from(config)
}
