//! `cluster.anevia.com/v1` CdnPurge: objects of a CdnCluster's caches that are no longer valid.

use super::Condition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The most paths, surrogate keys, prefixes and regular expressions one CdnPurge names.
pub const MAX_PATHS: usize = 1000;
pub const MAX_SURROGATE_KEYS: usize = 1000;
pub const MAX_PREFIXES: usize = 100;
pub const MAX_REGEXES: usize = 16;

/// Says that some objects cached by a CdnCluster, and by every cache cluster it fetches through,
/// are no longer valid: by path, path prefix, regular expression or surrogate key (a tag the
/// origin sent with the object), optionally for one host. A record: its spec cannot change, and
/// its status says when every pod has applied it.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "cluster.anevia.com",
    version = "v1",
    kind = "CdnPurge",
    plural = "cdnpurges",
    shortname = "purge",
    doc = "Invalidates objects cached by a CdnCluster and by every cache cluster below it: by path, prefix, regular expression or surrogate key; hard (gone) or soft (stale, served only when the source fails).",
    namespaced,
    status = "CdnPurgeStatus",
    printcolumn = r#"{"name":"Cluster","type":"string","jsonPath":".spec.cdnCluster","description":"the CdnCluster purged, with the caches below it"}"#,
    printcolumn = r#"{"name":"Mode","type":"string","jsonPath":".spec.mode","description":"hard (gone) or soft (stale)"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase","description":"Pending, Purging, Complete or Failed"}"#,
    printcolumn = r#"{"name":"Pods","type":"string","jsonPath":".status.progress","description":"pods that applied it / pods that must"}"#,
    printcolumn = r#"{"name":"Objects","type":"integer","jsonPath":".status.objects","description":"cached objects invalidated"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "self == oldSelf", "message": "a CdnPurge records one purge: its spec cannot change (create another)"},
    {"rule": "!(has(self.all) && self.all) || (!has(self.paths) && !has(self.prefixes) && !has(self.regexes) && !has(self.surrogateKeys))", "message": "all: true purges every object and takes no paths, prefixes, regexes or surrogateKeys"},
    {"rule": "(has(self.all) && self.all) || (has(self.paths) && size(self.paths) > 0) || (has(self.prefixes) && size(self.prefixes) > 0) || (has(self.regexes) && size(self.regexes) > 0) || (has(self.surrogateKeys) && size(self.surrogateKeys) > 0)", "message": "a purge names what it invalidates: paths, prefixes, regexes or surrogateKeys (at least one entry), or all: true for every object"}
]))]
pub struct CdnPurgeSpec {
    /// The CdnCluster (of the namespace) whose objects are purged: itself if it is a cache, and
    /// every cache cluster it fetches through, down to the origins. Name the cluster viewers
    /// reach (a balancer) to purge every copy they could be served.
    #[schemars(length(min = 1, max = 63))]
    pub cdn_cluster: String,

    /// `hard` (default): the objects are gone, fetched again on their next request and never
    /// served again, even when the source fails. `soft`: the objects become stale, revalidated
    /// with the source on their next request (a 304 keeps the body), and still served when the
    /// source fails.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<PurgeMode>,

    /// Only objects of this host (the `Host` viewers asked for, without its port). Default: every
    /// host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    #[schemars(regex(
        pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
    ))]
    pub host: Option<String>,

    /// Exact paths (`/live/ch1/index.m3u8`), each with every query string cached for it;
    /// percent-encoded or not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1000))]
    #[schemars(extend("items" = {"type": "string", "minLength": 1, "maxLength": 4096, "x-kubernetes-validations": [{"rule": "self.startsWith('/')", "message": "a path starts with /"}]}))]
    pub paths: Option<Vec<String>>,

    /// Path prefixes (`/vod/title-123/`): every object whose path starts with one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 100))]
    #[schemars(extend("items" = {"type": "string", "minLength": 1, "maxLength": 1024, "x-kubernetes-validations": [{"rule": "self.startsWith('/')", "message": "a prefix starts with /"}, {"rule": "self != '/'", "message": "the prefix / would purge every object: say so with all: true"}]}))]
    pub prefixes: Option<Vec<String>>,

    /// Regular expressions (RE2 syntax, unanchored) matched against the path and its query
    /// (`/vod/a.ts?v=2`, as the cache key holds it: decoded, without the excluded parameters).
    /// One that matches `/` would purge every object and is refused: say so with `all: true`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    #[schemars(extend("items" = {"type": "string", "minLength": 1, "maxLength": 1024, "x-kubernetes-validations": [{"rule": "!'/'.matches(self)", "message": "must be a valid RE2 regular expression that does not match the path / (one that does would purge every object: say so with all: true)"}]}))]
    pub regexes: Option<Vec<String>>,

    /// Surrogate keys: every object the origin tagged with one of them, in its `Surrogate-Key`
    /// (space-separated) or `Cache-Tag` (comma-separated) response header.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1000))]
    #[schemars(extend("items" = {"type": "string", "minLength": 1, "maxLength": 256, "pattern": "^[^\\s,]+$"}))]
    pub surrogate_keys: Option<Vec<String>>,

    /// Every object of the caches (of `host`, if set): a full flush, which sends the whole
    /// audience to the sources at once. Only alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub all: Option<bool>,
}

impl CdnPurgeSpec {
    /// A hard purge of `cluster`'s objects at `paths`.
    pub fn paths(cluster: &str, paths: &[&str]) -> Self {
        CdnPurgeSpec {
            cdn_cluster: cluster.into(),
            mode: None,
            host: None,
            paths: Some(paths.iter().map(|p| p.to_string()).collect()),
            prefixes: None,
            regexes: None,
            surrogate_keys: None,
            all: None,
        }
    }

    /// The mode, `hard` unless set.
    pub fn mode(&self) -> PurgeMode {
        self.mode.unwrap_or(PurgeMode::Hard)
    }
}

/// What a purge does to the objects it names.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum PurgeMode {
    /// Gone: fetched again on their next request, never served again.
    Hard,
    /// Stale: revalidated on their next request, served while the source fails.
    Soft,
}

impl PurgeMode {
    pub fn as_str(self) -> &'static str {
        match self {
            PurgeMode::Hard => "hard",
            PurgeMode::Soft => "soft",
        }
    }
}

/// What the operator observed of a CdnPurge.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CdnPurgeStatus {
    /// `Pending` (not started), `Purging` (some pods have not applied it yet), `Complete` (every
    /// pod has: none serves what it names), `Failed` (it cannot be applied; see the conditions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<PurgePhase>,

    /// The CdnClusters whose caches it purges, the deepest (nearest the origins) first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clusters: Vec<String>,

    /// Pods of those clusters that have applied it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods_purged: Option<i32>,

    /// Pods of those clusters that must apply it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods: Option<i32>,

    /// `podsPurged/pods`, for `kubectl get`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<String>,

    /// Cached objects invalidated, over every pod (each slice of a large object counts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub objects: Option<i64>,

    /// When the operator started applying it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,

    /// When the last pod applied it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,

    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// kstatus conditions: `Ready` (True once Complete), `Reconciling` (True while Purging) and
    /// `Stalled` (True when Failed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// Where a CdnPurge stands.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum PurgePhase {
    /// Not started yet.
    Pending,
    /// Some pods have not applied it yet (unreachable ones are retried).
    Purging,
    /// Every pod has applied it: no pod serves what it names.
    Complete,
    /// It cannot be applied (its CdnCluster does not exist, an invalid pattern, pods without the
    /// sidecar that applies purges); the conditions say why.
    Failed,
}

impl PurgePhase {
    pub fn as_str(self) -> &'static str {
        match self {
            PurgePhase::Pending => "Pending",
            PurgePhase::Purging => "Purging",
            PurgePhase::Complete => "Complete",
            PurgePhase::Failed => "Failed",
        }
    }

    pub const ALL: [PurgePhase; 4] = [
        PurgePhase::Pending,
        PurgePhase::Purging,
        PurgePhase::Complete,
        PurgePhase::Failed,
    ];

    /// Whether nothing more happens to a purge in this phase.
    pub fn is_final(self) -> bool {
        matches!(self, PurgePhase::Complete | PurgePhase::Failed)
    }
}
