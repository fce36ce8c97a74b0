//! The operator's purge key: an Ed25519 key pair with which it signs what it sends the pods'
//! sidecars. The public half goes into every cache's ConfigMap; the private half lives in a
//! Secret of the operator's namespace, [`SECRET_NAME`], which the install ships empty and the
//! first replica to start fills, so every replica and every restart signs with the same key and
//! no ConfigMap is written again.
//!
//! Why a Secret the install ships: the operator may then only read and patch that one Secret. A
//! right to create Secrets would let whoever holds the operator's token mint the token of any
//! ServiceAccount of the namespace (a `service-account-token` Secret, read back).

use crate::kubernetes::apply;
use crate::nginx_cache::wire;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::ByteString;
use kube::api::Api;
use kube::Client;
use ring::signature::{Ed25519KeyPair, KeyPair};
use serde_json::json;
use std::collections::BTreeMap;

/// The Secret holding the private key, in the operator's namespace.
pub const SECRET_NAME: &str = "cdn-operator-purge-signing";
/// Its entry: the key as PKCS#8 (ring's Ed25519 v2 document).
pub const KEY_ENTRY: &str = "ed25519.pk8";

/// The operator's key pair.
pub struct Signer {
    pair: Ed25519KeyPair,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer")
            .field("public", &self.public_keys_file())
            .finish()
    }
}

/// Why the operator has no purge key: purges then fail with this, and pods refuse any.
#[derive(Debug, thiserror::Error)]
pub enum SigningError {
    #[error(
        "cannot read Secret {namespace}/{SECRET_NAME}: {}",
        crate::kubernetes::errors::describe(source)
    )]
    Read {
        namespace: String,
        #[source]
        source: kube::Error,
    },
    #[error(
        "cannot write the key into Secret {namespace}/{SECRET_NAME}: {}",
        crate::kubernetes::errors::describe(source)
    )]
    Write {
        namespace: String,
        #[source]
        source: kube::Error,
    },
    #[error("Secret {namespace}/{SECRET_NAME} holds no Ed25519 key in {KEY_ENTRY}: {why} (delete the entry: a new key is made at the next start)")]
    Corrupt { namespace: String, why: String },
    #[error("no namespace of the operator to keep its purge key in (POD_NAMESPACE, --namespace)")]
    NoNamespace,
}

impl Signer {
    /// A new key pair, and its PKCS#8 document to keep.
    pub fn generate() -> (Signer, Vec<u8>) {
        let random = ring::rand::SystemRandom::new();
        let document =
            Ed25519KeyPair::generate_pkcs8(&random).expect("the system has a random source");
        let pkcs8 = document.as_ref().to_vec();
        let signer = Signer::from_pkcs8(&pkcs8).expect("a key just made reads back");
        (signer, pkcs8)
    }

    /// The key pair of a PKCS#8 document.
    pub fn from_pkcs8(pkcs8: &[u8]) -> Result<Signer, String> {
        Ed25519KeyPair::from_pkcs8(pkcs8)
            .map(|pair| Signer { pair })
            .map_err(|e| e.to_string())
    }

    /// The signature of `message`.
    pub fn sign(&self, message: &[u8]) -> Vec<u8> {
        self.pair.sign(message).as_ref().to_vec()
    }

    /// The public key, as a cache's ConfigMap publishes it.
    pub fn public_keys_file(&self) -> String {
        wire::public_keys_file(&[self.pair.public_key().as_ref().to_vec()])
    }
}

/// The key of Secret `namespace`/[`SECRET_NAME`]; one is made and written into it when it holds
/// none. Where the install did not ship the Secret (a local run), it is created, if allowed.
pub async fn load(client: &Client, namespace: &str) -> Result<Signer, SigningError> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let read = |source| SigningError::Read {
        namespace: namespace.to_string(),
        source,
    };
    let write = |source| SigningError::Write {
        namespace: namespace.to_string(),
        source,
    };
    // Twice at most: a second pass reads what a replica that came first wrote.
    for _ in 0..3 {
        let observed = api.get_opt(SECRET_NAME).await.map_err(read)?;
        if let Some(pkcs8) = observed.as_ref().and_then(key_of) {
            return Signer::from_pkcs8(&pkcs8).map_err(|why| SigningError::Corrupt {
                namespace: namespace.to_string(),
                why,
            });
        }
        let (signer, pkcs8) = Signer::generate();
        let data = BTreeMap::from([(KEY_ENTRY.to_string(), ByteString(pkcs8))]);
        let written = match &observed {
            Some(secret) => {
                let patch = json!({ "data": data });
                apply::fill_once(&api, secret, patch).await.map_err(write)?
            }
            None => {
                let secret = Secret {
                    metadata: kube::api::ObjectMeta {
                        name: Some(SECRET_NAME.into()),
                        labels: Some(BTreeMap::from([(
                            "app.kubernetes.io/name".to_string(),
                            "cdn-operator".to_string(),
                        )])),
                        ..Default::default()
                    },
                    data: Some(data),
                    type_: Some("Opaque".into()),
                    ..Secret::default()
                };
                apply::create_once(&api, &secret).await.map_err(write)?
            }
        };
        if written.is_some() {
            tracing::info!(%namespace, secret = SECRET_NAME, "made the operator's purge key");
            return Ok(signer);
        }
    }
    Err(SigningError::Corrupt {
        namespace: namespace.to_string(),
        why: "it kept changing while the key was written".into(),
    })
}

/// The key entry of `secret`, when it has one.
fn key_of(secret: &Secret) -> Option<Vec<u8>> {
    let bytes = secret.data.as_ref()?.get(KEY_ENTRY)?;
    (!bytes.0.is_empty()).then(|| bytes.0.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_signs_what_its_published_public_key_verifies() {
        let (signer, pkcs8) = Signer::generate();
        let again = Signer::from_pkcs8(&pkcs8).unwrap();
        let keys = wire::parse_public_keys(&signer.public_keys_file());
        assert_eq!(keys.len(), 1);
        assert_eq!(again.public_keys_file(), signer.public_keys_file());
        let signature = again.sign(b"batch");
        let verifies = |message: &[u8]| {
            ring::signature::UnparsedPublicKey::new(&ring::signature::ED25519, &keys[0])
                .verify(message, &signature)
                .is_ok()
        };
        assert!(verifies(b"batch"));
        assert!(!verifies(b"batch2"));
        assert!(Signer::from_pkcs8(b"not a key").is_err());
    }
}
