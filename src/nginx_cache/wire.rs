//! What the operator sends a pod's sidecar to apply purges, and what it answers: JSON over HTTP
//! (`POST /purge` on the sidecar's port), signed by the operator with Ed25519. The sidecar
//! accepts a batch only under a signature of a key the operator published in the CdnCluster's
//! ConfigMap ([`PUBLIC_KEYS_KEY`]), only before it expires, and only once.

use crate::api::PurgeMode;
use serde::{Deserialize, Serialize};

/// The sidecar's path that takes a [`Batch`].
pub const PURGE_PATH: &str = "/purge";
/// The request header carrying the signature of the body: `ed25519=<base64 of 64 bytes>`.
pub const SIGNATURE_HEADER: &str = "x-cdn-purge-signature";
/// The key, in a CdnCluster's ConfigMap, of the operator's public keys: one line each,
/// `ed25519 <base64 of 32 bytes>`.
pub const PUBLIC_KEYS_KEY: &str = "purge-keys.pub";
/// How long a batch may be applied after it was signed: a copy replayed later is refused.
pub const VALIDITY_SECONDS: i64 = 300;
/// The largest batch the operator sends: more purges wait for the next batch.
pub const MAX_BATCH_BYTES: usize = 4 << 20;
/// How far ahead of the sidecar's clock a batch may claim to be signed (clocks differ).
pub const CLOCK_SKEW_SECONDS: i64 = 300;

/// Purges for one pod, applied in one walk of its cache.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Batch {
    /// Unique: a batch is applied once (a replay within its validity is refused).
    pub id: String,
    /// When it was signed and until when it may be applied (epoch seconds, the operator's clock).
    pub issued: i64,
    pub expires: i64,
    /// The CdnCluster (`namespace/name`) of the pods it is meant for: another cluster's pod
    /// refuses it.
    pub cluster: String,
    pub purges: Vec<Purge>,
}

/// One purge, as a batch carries it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Purge {
    /// The purge and its pass (`namespace/name/uid/pass`): a pod that sees it again (a retry)
    /// applies it with the cutoff of its first time, so what was fetched since stays cached.
    pub id: String,
    pub mode: Mode,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prefixes: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub regexes: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub surrogate_keys: Vec<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub all: bool,
}

/// [`PurgeMode`] on the wire.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Mode {
    #[default]
    Hard,
    Soft,
}

impl From<PurgeMode> for Mode {
    fn from(mode: PurgeMode) -> Self {
        match mode {
            PurgeMode::Hard => Mode::Hard,
            PurgeMode::Soft => Mode::Soft,
        }
    }
}

/// What a pod did with a batch.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Applied {
    /// Objects invalidated, by purge (in the batch's order).
    pub invalidated: Vec<u64>,
    /// Cache files read.
    pub scanned: u64,
    /// Cache files known unchanged since the pod's walk before, not named: not read. Absent from
    /// a sidecar older than this field.
    #[serde(default)]
    pub recalled: u64,
    /// Fills that were in flight when the walk began, waited for and checked.
    pub fills_awaited: u64,
    /// Fills still in flight when the wait gave up (a stalled source): not checked.
    pub fills_unchecked: u64,
    /// How long the pod took, in milliseconds.
    pub millis: u64,
}

/// The text signed: the request body as sent.
pub fn signature_header(signature: &[u8]) -> String {
    use base64::Engine as _;
    format!(
        "ed25519={}",
        base64::engine::general_purpose::STANDARD.encode(signature)
    )
}

/// The signature of a [`SIGNATURE_HEADER`] value; `None` when it is not one.
pub fn parse_signature_header(value: &str) -> Option<Vec<u8>> {
    use base64::Engine as _;
    let encoded = value.trim().strip_prefix("ed25519=")?;
    base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .ok()
        .filter(|s| s.len() == 64)
}

/// The lines of [`PUBLIC_KEYS_KEY`] for `keys` (each 32 bytes).
pub fn public_keys_file(keys: &[Vec<u8>]) -> String {
    use base64::Engine as _;
    keys.iter()
        .map(|k| {
            format!(
                "ed25519 {}\n",
                base64::engine::general_purpose::STANDARD.encode(k)
            )
        })
        .collect()
}

/// The keys of a [`PUBLIC_KEYS_KEY`] file: the well-formed lines; others are skipped.
pub fn parse_public_keys(text: &str) -> Vec<Vec<u8>> {
    use base64::Engine as _;
    text.lines()
        .filter_map(|line| line.trim().strip_prefix("ed25519 "))
        .filter_map(|k| {
            base64::engine::general_purpose::STANDARD
                .decode(k.trim())
                .ok()
        })
        .filter(|k| k.len() == 32)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_signatures_read_back() {
        let keys = vec![vec![7u8; 32], vec![9u8; 32]];
        let text = public_keys_file(&keys);
        assert_eq!(parse_public_keys(&text), keys);
        assert_eq!(
            parse_public_keys("ed25519 c2hvcnQ=\nrsa AAAA\n\n"),
            Vec::<Vec<u8>>::new()
        );
        let header = signature_header(&[1u8; 64]);
        assert_eq!(parse_signature_header(&header), Some(vec![1u8; 64]));
        assert_eq!(parse_signature_header("ed25519=AAAA"), None);
        assert_eq!(parse_signature_header("hmac=AAAA"), None);
    }

    #[test]
    fn a_batch_reads_back_and_defaults_are_left_out() {
        let batch = Batch {
            id: "b1".into(),
            issued: 10,
            expires: 310,
            cluster: "ns/cache".into(),
            purges: vec![Purge {
                id: "ns/p/uid/1".into(),
                paths: vec!["/a.ts".into()],
                ..Purge::default()
            }],
        };
        let json = serde_json::to_string(&batch).unwrap();
        assert_eq!(
            json,
            r#"{"id":"b1","issued":10,"expires":310,"cluster":"ns/cache","purges":[{"id":"ns/p/uid/1","mode":"hard","paths":["/a.ts"]}]}"#
        );
        assert_eq!(serde_json::from_str::<Batch>(&json).unwrap(), batch);
    }
}
