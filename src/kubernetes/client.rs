//! The Kubernetes client: from KUBECONFIG or the in-cluster config, identified as the operator.

use crate::runtime::client_metrics::CountRequests;
use http::header::{HeaderValue, USER_AGENT};
use kube::client::ClientBuilder;
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

/// Why no client can be made for the cluster.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("{0}")]
    Config(#[source] kube::Error),
    #[error(transparent)]
    Roots(#[from] crate::runtime::trust::RootsError),
    #[error("{0}")]
    Client(#[source] kube::Error),
}

/// A client for the cluster of `KUBECONFIG` (or `~/.kube/config`), or the in-cluster config;
/// its requests counted by `counted` when given (`rest_client_requests_total`).
pub async fn connect(counted: Option<&CountRequests>) -> Result<Client, ConnectError> {
    // kube is built with ring, but another crate in the graph (in test builds, the fake
    // client's jsonschema) may enable aws-lc-rs too; rustls then refuses to pick one and
    // panics. Choose explicitly; an Err means a provider is already installed, which is fine.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut config = Config::infer()
        .await
        .map_err(|e| ConnectError::Config(kube::Error::InferConfig(e)))?;
    identify(&mut config);
    trust_default_roots(&mut config)?;
    let builder = ClientBuilder::try_from(config).map_err(ConnectError::Client)?;
    Ok(match counted {
        Some(layer) => builder.with_layer(layer).build(),
        None => builder.build(),
    })
}

/// A kubeconfig that names no CA (the in-cluster config always does): kube would ask the
/// system's store, which the image does not have, and fail even for an `http://` server. An
/// `https://` server is verified against [`crate::runtime::trust::default_roots`] instead; `http://`
/// needs no CA.
fn trust_default_roots(config: &mut Config) -> Result<(), ConnectError> {
    if config.root_cert.is_some() {
        return Ok(());
    }
    let roots = if config.cluster_url.scheme_str() == Some("https") {
        crate::runtime::trust::default_roots()?
    } else {
        Vec::new()
    };
    config.root_cert = Some(roots.into_iter().map(|c| c.to_vec()).collect());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kubeconfig_without_a_ca_trusts_the_default_roots_for_https_only() {
        let mut https = Config::new("https://api.example:6443".parse().unwrap());
        trust_default_roots(&mut https).unwrap();
        let roots = https.root_cert.unwrap();
        assert!(roots.len() >= webpki_root_certs::TLS_SERVER_ROOT_CERTS.len());

        let mut http = Config::new("http://api.example:8080".parse().unwrap());
        trust_default_roots(&mut http).unwrap();
        assert_eq!(http.root_cert, Some(vec![]));

        let mut own = Config::new("https://api.example:6443".parse().unwrap());
        own.root_cert = Some(vec![b"the kubeconfig's CA".to_vec()]);
        trust_default_roots(&mut own).unwrap();
        assert_eq!(own.root_cert, Some(vec![b"the kubeconfig's CA".to_vec()]));
    }
}
