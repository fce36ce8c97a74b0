//! The serving certificate of the HTTPS metrics endpoint, as controller-runtime's metrics server
//! gets it: a certificate and key from a directory (`tls.crt`/`tls.key`, e.g. a cert-manager
//! Secret mounted there), reloaded when the files change, or a self-signed certificate generated
//! at start when no directory is given. HTTP/1.1 only: controller-runtime and kubebuilder turn
//! HTTP/2 off on this endpoint (HTTP/2 rapid-reset and stream-cancellation attacks).

use axum_server::tls_rustls::RustlsConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::ServerConfig;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Where the certificate comes from.
#[derive(Clone, Debug, PartialEq)]
pub enum Source {
    /// PEM files: the certificate (chain) and its private key.
    Files { cert: PathBuf, key: PathBuf },
    /// A certificate made at start for `localhost` and the loopback addresses, signed by itself.
    SelfSigned,
}

/// How often the files are read again to notice a renewed certificate (controller-runtime's
/// certwatcher polls every 10 s as well).
pub const RELOAD_PERIOD: Duration = Duration::from_secs(10);

/// The TLS configuration of the server, and the PEM it was made from (to notice changes).
pub struct Certificate {
    pub config: RustlsConfig,
    source: Source,
    loaded: (Vec<u8>, Vec<u8>),
}

impl Certificate {
    /// Loads or generates the certificate; a missing, unreadable or invalid file is an error
    /// that names it.
    pub fn load(source: Source) -> Result<Certificate, CertificateError> {
        let (cert, key) = match &source {
            Source::Files { cert, key } => (read(cert)?, read(key)?),
            Source::SelfSigned => self_signed().map_err(CertificateError::SelfSigned)?,
        };
        let config = server_config(&cert, &key).map_err(|reason| match &source {
            Source::Files { cert, key } => CertificateError::Unusable {
                cert: cert.clone(),
                key: key.clone(),
                reason,
            },
            Source::SelfSigned => CertificateError::SelfSigned(reason),
        })?;
        Ok(Certificate {
            config: RustlsConfig::from_config(Arc::new(config)),
            source,
            loaded: (cert, key),
        })
    }

    /// Reads the files again every [`RELOAD_PERIOD`] and serves the new certificate once both
    /// parse; a broken renewal is logged and the previous certificate kept. Nothing to do for a
    /// self-signed one. Spawns a task: call inside a Tokio runtime.
    pub fn watch(self) {
        let Source::Files { cert, key } = self.source.clone() else {
            return;
        };
        tokio::spawn(async move {
            let mut loaded = self.loaded;
            let mut tick = tokio::time::interval(RELOAD_PERIOD);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let (Ok(new_cert), Ok(new_key)) = (read(&cert), read(&key)) else {
                    continue;
                };
                if (&new_cert, &new_key) == (&loaded.0, &loaded.1) {
                    continue;
                }
                match server_config(&new_cert, &new_key) {
                    Ok(config) => {
                        self.config.reload_from_config(Arc::new(config));
                        tracing::info!(cert = %cert.display(), "reloaded the metrics certificate");
                        loaded = (new_cert, new_key);
                    }
                    Err(error) => tracing::warn!(
                        %error,
                        cert = %cert.display(),
                        "the changed metrics certificate is not usable; serving the previous one"
                    ),
                }
            }
        });
    }
}

/// Why the metrics certificate cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum CertificateError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the metrics certificate {} and key {}: {reason}", cert.display(), key.display())]
    Unusable {
        cert: PathBuf,
        key: PathBuf,
        reason: String,
    },
    #[error("the self-signed metrics certificate: {0}")]
    SelfSigned(String),
}

fn read(path: &Path) -> Result<Vec<u8>, CertificateError> {
    std::fs::read(path).map_err(|source| CertificateError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// A server configuration over kube's crypto provider (ring), HTTP/1.1 only.
fn server_config(cert_pem: &[u8], key_pem: &[u8]) -> Result<ServerConfig, String> {
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("not a PEM certificate: {e}"))?;
    if chain.is_empty() {
        return Err("no PEM certificate in the certificate file".into());
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem)
        .map_err(|e| format!("not a PEM private key: {e}"))?;
    let mut config =
        ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .map_err(|e| format!("the key does not fit the certificate: {e}"))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// A self-signed certificate and its key, PEM: what controller-runtime generates when no
/// certificate directory is set. Scrapers skip verification (`insecureSkipVerify`) or are given
/// a real certificate through the directory.
fn self_signed() -> Result<(Vec<u8>, Vec<u8>), String> {
    let names = vec![
        "localhost".to_string(),
        "127.0.0.1".to_string(),
        "::1".to_string(),
    ];
    let rcgen::CertifiedKey { cert, signing_key } = rcgen::generate_simple_self_signed(names)
        .map_err(|e| format!("cannot generate a self-signed certificate: {e}"))?;
    Ok((
        cert.pem().into_bytes(),
        signing_key.serialize_pem().into_bytes(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn self_signed_certificates_make_a_server_config() {
        let (cert, key) = self_signed().unwrap();
        let config = server_config(&cert, &key).unwrap();
        assert_eq!(config.alpn_protocols, vec![b"http/1.1".to_vec()]);
    }

    #[test]
    fn bad_files_are_named_in_the_error() {
        let dir = tempfile::tempdir().unwrap();
        let cert = dir.path().join("tls.crt");
        let key = dir.path().join("tls.key");
        let files = || Source::Files {
            cert: cert.clone(),
            key: key.clone(),
        };
        let error = Certificate::load(files()).err().unwrap().to_string();
        assert!(
            error.starts_with(&format!("cannot read {}:", cert.display())),
            "{error}"
        );

        let (good_cert, good_key) = self_signed().unwrap();
        std::fs::write(&cert, &good_cert).unwrap();
        std::fs::write(&key, "not a key").unwrap();
        let error = Certificate::load(files()).err().unwrap().to_string();
        assert!(error.contains("not a PEM private key"), "{error}");

        // A key of another certificate.
        let (_, other_key) = self_signed().unwrap();
        std::fs::write(&key, &other_key).unwrap();
        let error = Certificate::load(files()).err().unwrap().to_string();
        assert!(
            error.contains("the key does not fit the certificate"),
            "{error}"
        );

        std::fs::write(&key, &good_key).unwrap();
        assert!(Certificate::load(files()).is_ok());
    }
}
