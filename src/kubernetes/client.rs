//! The Kubernetes client: from --kubeconfig (KUBECONFIG) or the in-cluster config, identified as
//! the operator.

use crate::runtime::client_metrics::CountRequests;
use http::header::{HeaderValue, USER_AGENT};
use kube::client::ClientBuilder;
use kube::config::{KubeConfigOptions, Kubeconfig as KubeconfigFile};
use kube::{Client, Config};
use std::ffi::OsString;
use std::path::PathBuf;

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
    #[error("{0}")]
    Kubeconfig(#[from] kube::config::KubeconfigError),
    #[error(transparent)]
    Roots(#[from] crate::runtime::trust::RootsError),
    #[error("{0}")]
    Client(#[source] kube::Error),
}

/// Which kubeconfig to use, as controller-runtime's `--kubeconfig` flag and client-go's
/// `KUBECONFIG` name it.
#[derive(clap::Args, Debug, Clone, Default, PartialEq, Eq)]
pub struct Kubeconfig {
    /// The kubeconfig file (a list of files separated by `:` merged as kubectl merges them);
    /// default: ~/.kube/config, else the in-cluster service account.
    #[arg(long, env = "KUBECONFIG", value_name = "PATH")]
    pub kubeconfig: Option<OsString>,
}

impl Kubeconfig {
    /// The files named, empty ones left out (as kubectl leaves them).
    fn paths(&self) -> Vec<PathBuf> {
        self.kubeconfig
            .as_deref()
            .map(|paths| {
                std::env::split_paths(paths)
                    .filter(|p| !p.as_os_str().is_empty())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The client configuration: of the files named, which must load (no silent fallback to
    /// another cluster, as with controller-runtime), else inferred (~/.kube/config, in-cluster).
    async fn config(&self) -> Result<Config, ConnectError> {
        let paths = self.paths();
        if paths.is_empty() {
            return Config::infer()
                .await
                .map_err(|e| ConnectError::Config(kube::Error::InferConfig(e)));
        }
        let merged = paths
            .iter()
            .try_fold(KubeconfigFile::default(), |merged, path| {
                KubeconfigFile::read_from(path).and_then(|file| merged.merge(file))
            })?;
        let mut config =
            Config::from_custom_kubeconfig(merged, &KubeConfigOptions::default()).await?;
        // What Config::infer applies too (KUBE_RS_DEBUG_IMPERSONATE, KUBE_RS_DEBUG_OVERRIDE_URL).
        config.apply_debug_overrides();
        Ok(config)
    }
}

/// A client for the cluster of `kubeconfig`; its requests counted by `counted` when given
/// (`rest_client_requests_total`).
pub async fn connect(
    kubeconfig: &Kubeconfig,
    counted: Option<&CountRequests>,
) -> Result<Client, ConnectError> {
    // kube is built with ring, but another crate in the graph (in test builds, the fake
    // client's jsonschema) may enable aws-lc-rs too; rustls then refuses to pick one and
    // panics. Choose explicitly; an Err means a provider is already installed, which is fine.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut config = kubeconfig.config().await?;
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
