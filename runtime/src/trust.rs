//! The CAs the operator's TLS clients (the Kubernetes API, an OTLP collector) trust when their
//! own configuration names none.

use rustls::pki_types::CertificateDer;

/// Mozilla's roots, built into the binary so that the image (`FROM scratch`) needs no CA files,
/// plus the system's store when there is one, or the files `SSL_CERT_FILE` / `SSL_CERT_DIR` name
/// (a private CA mounted into the pod). Without those variables a missing store is normal; a
/// file they name must be readable.
pub fn default_roots() -> Result<Vec<CertificateDer<'static>>, RootsError> {
    let mut roots = webpki_root_certs::TLS_SERVER_ROOT_CERTS.to_vec();
    let system = rustls_native_certs::load_native_certs();
    let named = ["SSL_CERT_FILE", "SSL_CERT_DIR"]
        .iter()
        .any(|name| std::env::var_os(name).is_some());
    if let (true, Some(error)) = (named, system.errors.first()) {
        return Err(RootsError(error.to_string()));
    }
    roots.extend(system.certs);
    Ok(roots)
}

/// A CA file or folder that `SSL_CERT_FILE` / `SSL_CERT_DIR` name cannot be read.
#[derive(Debug, thiserror::Error)]
#[error("SSL_CERT_FILE / SSL_CERT_DIR: {0}")]
pub struct RootsError(String);

#[cfg(test)]
mod tests {
    #[test]
    fn mozillas_roots_are_there_whatever_the_machine_has() {
        let roots = super::default_roots().unwrap();
        assert!(roots.len() >= webpki_root_certs::TLS_SERVER_ROOT_CERTS.len());
        let mut store = rustls::RootCertStore::empty();
        let (valid, invalid) = store
            .add_parsable_certificates(webpki_root_certs::TLS_SERVER_ROOT_CERTS.iter().cloned());
        assert_eq!(invalid, 0);
        assert!(valid > 100, "{valid}");
    }
}
