//! `cluster.anevia.com/v1` CdnCluster: a cluster of identically configured nginx instances.

use super::Condition;
use k8s_openapi::api::core::v1::{
    Affinity, ResourceRequirements, Toleration, TopologySpreadConstraint,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// nginx's time syntax, as the CRD checks it: `30s`, `10m`, `1d`.
const DURATION_PATTERN: &str = r"^[1-9][0-9]*(ms|s|m|h|d|w|M|y)?$";

/// The longest CdnCluster name whose children still have valid names: the pod label value
/// `<name>-deployment` must fit in 63 characters.
pub const MAX_NAME_LEN: usize = 63 - "-deployment".len();

/// A cluster of identically configured nginx instances that fetch from their sources.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "cluster.anevia.com",
    version = "v1",
    kind = "CdnCluster",
    plural = "cdnclusters",
    shortname = "cdn",
    doc = "A cluster of identically configured nginx instances (role balancer or cache) that fetch from their sources: other CdnClusters of the namespace, or origins.",
    namespaced,
    status = "CdnClusterStatus",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    printcolumn = r#"{"name":"Role","type":"string","jsonPath":".spec.role","description":"balancer or cache"}"#,
    printcolumn = r#"{"name":"State","type":"string","jsonPath":".status.state","description":"WaitingSource, Deploying, Running, Invalid or Error"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.ready","description":"ready replicas / desired replicas"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].reason","description":"why the cluster is or is not ready: Running, Deploying, CrashLoopBackOff, ImagePullBackOff, Unschedulable…"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{"rule": "self.role == 'balancer' || !has(self.service) || !has(self.service.type) || self.service.type == 'ClusterIP'", "message": "only a balancer's Service can be a NodePort or LoadBalancer: a cache's Service is headless"}, {"rule": "self.role == 'balancer' || !has(self.ingress)", "message": "only a balancer can have an ingress: viewers reach the caches through it"}]))]
pub struct CdnClusterSpec {
    /// What the instances do: `balancer` routes requests to its sources without caching; `cache`
    /// stores what it fetches and serves it again.
    pub role: Role,

    /// Where the instances fetch from, tried in order: a source with a `pathCondition` receives the
    /// requests whose path matches it; sources without a `pathCondition` are the default; with no
    /// default, unmatched paths get 404. Sources that share a `pathCondition` (or all have none)
    /// form a pool: nginx spreads its requests over them by consistent hashing of the request URI
    /// and fails over to the next member when one is down. May be empty (`[]`): the cluster then
    /// answers 404.
    pub sources: Vec<Source>,

    /// Number of nginx instances.
    #[serde(default = "default_replicas")]
    #[schemars(range(min = 0))]
    pub replicas: i32,

    /// nginx container image. Defaults to a pinned nginx release.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,

    /// Compute resources of the nginx container. Defaults to requests of 50m CPU and 64Mi memory and
    /// a 256Mi memory limit.
    // Boxed, as `cache`: rarely set, and every cached CdnCluster would carry their size inline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<Box<ResourceRequirements>>,

    /// Cache tuning; used by the `cache` role only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<Box<CacheSpec>>,

    /// How requests are identified: whose `X-Forwarded-For` is trusted, and which query parameters
    /// do not make an object different.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<Box<HttpSpec>>,

    /// How viewers reach the cluster: the type and annotations of its Service. Default: a
    /// ClusterIP Service, reachable from inside the cluster only (headless for a `cache`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<Box<ServiceExposure>>,

    /// An Ingress to the cluster's Service, for viewers who come through an ingress controller;
    /// the operator owns it and deletes it when this is removed. Balancer only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingress: Option<Box<IngressExposure>>,

    /// How and where the pods run: placement, disruption budget, graceful stop. Default: spread
    /// over nodes (and zones), at most one pod down at once in a drain, 60 s to finish a request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods: Option<Box<Pods>>,
    /// HTTPS on the instances, with the certificate of a Secret of the namespace: a new port
    /// `https` (443 on the Service), HTTP/2, TLS 1.2 and 1.3, the same routes and cache as plain
    /// HTTP. A renewed certificate is served within seconds, with no restart. Usually set on the
    /// balancers that clients reach.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<Box<TlsSpec>>,

    /// Signed URLs: every request must carry a valid token (HMAC-SHA256 over an expiry, a path
    /// ACL with wildcards and optionally the viewer's address), in a query parameter or a
    /// cookie; others get 403 without reaching a source. The token is left out of the cache key
    /// and, unless asked, of the request to the sources. Usually set on the balancers viewers
    /// reach; such a cluster trusts no proxy's `X-Forwarded-For` unless `http.trustedProxies`
    /// names it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signed_urls: Option<Box<SignedUrls>>,
}

fn default_replicas() -> i32 {
    1
}

impl CdnClusterSpec {
    /// The spec of a `role` cluster fetching from `sources`, every tuning at its default.
    pub fn new(role: Role, sources: Vec<Source>) -> Self {
        CdnClusterSpec {
            role,
            sources,
            replicas: default_replicas(),
            image: None,
            resources: None,
            cache: None,
            http: None,
            service: None,
            ingress: None,
            pods: None,
            tls: None,
            signed_urls: None,
        }
    }
}

impl Source {
    /// The CdnCluster `name` of the same namespace, for the paths `path_condition` matches (the
    /// default source without one).
    pub fn cluster(name: &str, path_condition: Option<&str>) -> Self {
        Source {
            name: name.into(),
            path_condition: path_condition.map(Into::into),
            origin: None,
            weight: None,
        }
    }

    /// This source with `weight` in its pool.
    pub fn weighted(self, weight: i32) -> Self {
        Source {
            weight: Some(weight),
            ..self
        }
    }

    /// Its share in its pool: `weight`, 1 by default.
    pub fn weight(&self) -> i32 {
        self.weight.unwrap_or(1)
    }

    /// The origin at `url`, labelled `name`.
    pub fn url(name: &str, url: &str, path_condition: Option<&str>) -> Self {
        Source {
            origin: Some(Origin {
                url: Some(url.into()),
                service: None,
            }),
            ..Source::cluster(name, path_condition)
        }
    }

    /// The Service origin `service:port` of the same namespace, labelled `name`.
    pub fn service(name: &str, service: &str, port: i32, path_condition: Option<&str>) -> Self {
        Source {
            origin: Some(Origin {
                url: None,
                service: Some(ServiceOrigin {
                    name: service.into(),
                    port,
                }),
            }),
            ..Source::cluster(name, path_condition)
        }
    }
}

/// The role of every instance of a CdnCluster.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Role {
    /// Routes requests to its sources without caching.
    Balancer,
    /// Caches what it fetches from its sources.
    Cache,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Balancer => "balancer",
            Role::Cache => "cache",
        }
    }
}

/// One upstream of a CdnCluster.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Source {
    /// Without `origin`: the name of a CdnCluster in the same namespace. With `origin`: a label
    /// for that origin, unique among the sources.
    #[schemars(length(min = 1))]
    pub name: String,

    /// A regular expression (PCRE, as nginx uses) matched against the request path; requests that
    /// match go to this source. Omit it for the default source.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_condition: Option<String>,

    /// Fetch from something outside the CdnCluster graph instead of a CdnCluster: exactly one of
    /// `url` or `service`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<Origin>,

    /// The source's share of its pool (the sources with the same `pathCondition`): a member of
    /// weight 2 receives about twice the URIs of a member of weight 1. A CdnCluster's ready pods
    /// each have this share, so its replicas add capacity. Default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub weight: Option<i32>,
}

/// An upstream outside the CdnCluster graph.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{"rule": "has(self.url) != has(self.service)", "message": "an origin takes exactly one of url or service"}]))]
pub struct Origin {
    /// An http or https URL such as `http://origin.example.com:8080`; its path, if any, is
    /// prefixed to every request path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,

    /// A Service in the same namespace, reached over plain HTTP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<ServiceOrigin>,
}

/// A Service in the CdnCluster's namespace.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceOrigin {
    /// The Service's name.
    #[schemars(length(min = 1))]
    pub name: String,
    /// The Service port to use.
    #[serde(default = "default_service_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
}

fn default_service_port() -> i32 {
    80
}

/// Cache tuning for the `cache` role.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
// A StatefulSet's claims are made once: the API server refuses to change them.
#[schemars(extend("x-kubernetes-validations" = [{"rule": "!has(self.volume) || !has(oldSelf.volume) || (self.volume == oldSelf.volume && has(self.size) == has(oldSelf.size) && (!has(self.size) || self.size == oldSelf.size))", "message": "a cache with a volume keeps its size and storage class: its claims are made once (remove the volume first, which empties the cache)"}]))]
pub struct CacheSpec {
    /// Largest size of the on-disk cache of each instance, in nginx's size syntax (`512m`, `10g`).
    /// Default `1g`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[1-9][0-9]*[kKmMgG]?$"))]
    pub size: Option<String>,

    /// Cached objects not requested for this long are removed, in nginx's time syntax (`10m`, `1h`,
    /// `1d`). Default `10m`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub inactive: Option<String>,

    /// How long a successful response (200, 206, 301, 302) stays fresh when the source does not say
    /// (no `Cache-Control` or `Expires`) and no rule matches, in nginx's time syntax. Default `10m`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub valid: Option<String>,

    /// Lifetimes by path when the source does not say, first match wins: for HLS and DASH,
    /// manifests that change every few seconds and segments that never change. Without `rules`,
    /// manifests (`.m3u8`, `.mpd`) live 2s and segments (`.ts`, `.m4s`, `.mp4`, `.aac`, ...) 1d;
    /// `rules: []` leaves every path to `valid`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    pub rules: Option<Vec<CacheRule>>,

    /// How long a 404 or 410 answer stays cached when the source does not say: the requests for a
    /// missing object within it reach the source once. Default `1s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub not_found_valid: Option<String>,

    /// Large objects are fetched and cached in slices of this size, so a range request fetches only
    /// the slices it covers; in nginx's size syntax (`512k`, `1m`, `4m`). Default `1m`. Changing it
    /// changes every object's cache key: what is cached is fetched again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[1-9][0-9]*[kKmM]?$"))]
    pub slice_size: Option<String>,

    /// A volume per pod that outlives it: a PersistentVolumeClaim of this class, sized for `size`
    /// (a quarter more, as the default emptyDir). The pods then run in a StatefulSet, each with
    /// its own claim and a stable name on its parents' hash ring: a rollout, a restarted or
    /// rescheduled pod or an operator upgrade keeps what the cache holds. Without it (the
    /// default), the cache is an emptyDir, emptied whenever its pod is replaced. The claims are
    /// deleted with the CdnCluster and when it scales down (a claim kept aside would miss the
    /// purges made meanwhile). `size` and the class cannot change while the volume is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume: Option<CacheVolume>,
}

/// The volume a cache keeps across its pods' replacements.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct CacheVolume {
    /// The StorageClass of the pods' claims; unset: the cluster's default class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub storage_class_name: Option<String>,
}

/// The lifetime of the responses for some paths when their source does not say.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CacheRule {
    /// A regular expression (PCRE, as nginx uses) matched against the request path.
    #[schemars(length(min = 1))]
    pub path_condition: String,

    /// How long a successful response (200, 206, 301, 302) of a matching path stays fresh, in
    /// nginx's time syntax.
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub valid: String,
}

/// How requests are identified.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct HttpSpec {
    /// Addresses or CIDR ranges of the proxies in front of this cluster whose `X-Forwarded-For`
    /// and `X-Forwarded-Proto` are trusted: the client address they carry is kept and this
    /// cluster appends its peer's. From any other peer the headers are replaced by the peer's
    /// own address and scheme, so a client cannot forge them. Default: none for a `balancer`
    /// (the edge), the private ranges (10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16, 100.64.0.0/10,
    /// fc00::/7), where the tiers in front of it run, for a `cache`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    #[schemars(extend("items" = {"type": "string", "maxLength": 64, "x-kubernetes-validations": [{"rule": "isCIDR(self) || isIP(self)", "message": "must be an IP address or a CIDR range"}]}))]
    pub trusted_proxies: Option<Vec<String>>,

    /// Query parameters that do not make an object different, such as the tokens of signed URLs:
    /// left out of a cache's key and of the hash by which a balancer spreads requests over a pool,
    /// so one object is cached once whatever its token. They are still sent to the source.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    #[schemars(extend("items" = {"type": "string", "minLength": 1, "maxLength": 128, "pattern": "^[A-Za-z0-9_.~-]+$"}))]
    pub excluded_query_parameters: Option<Vec<String>>,
}

/// A DNS-1123 subdomain, as Kubernetes names a Secret: lowercase letters, digits, '-' and '.',
/// starting and ending with a letter or digit (at most 253 characters, checked beside it).
pub const DNS_SUBDOMAIN_PATTERN: &str =
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";

/// HTTPS on a CdnCluster's instances.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TlsSpec {
    /// The Secret of type `kubernetes.io/tls` in the CdnCluster's namespace holding the
    /// certificate (`tls.crt`: the server's certificate first, then its intermediates) and its key
    /// (`tls.key`), as cert-manager writes it for a Certificate. Mounted read-only in the pods:
    /// they start once it exists, and a renewed certificate is served within seconds, without a
    /// restart and without losing the cache.
    #[schemars(length(min = 1, max = 253), regex(pattern = DNS_SUBDOMAIN_PATTERN))]
    pub secret_name: String,

    /// Answer plain HTTP with a 301 redirect to the same URL over HTTPS, except the health
    /// probes' path. Default false: plain HTTP serves as HTTPS does.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub redirect: bool,
}

/// The default name of the query parameter and cookie that carry a token: Akamai EdgeAuth's, so
/// its signers work unchanged.
pub const DEFAULT_TOKEN_NAME: &str = "__token__";

/// Signed URLs on a CdnCluster's instances.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SignedUrls {
    /// A Secret of the namespace whose entries are the keys, each a hex string of 16 to 64 bytes
    /// (`openssl rand -hex 32`). Every key it holds is accepted: to rotate, add the new key,
    /// sign with it once the pods have it (about a minute), and remove the old one once the
    /// tokens it signed have expired. A changed Secret is applied without a restart. Mounted in
    /// the pods: they start once it exists.
    #[schemars(length(min = 1, max = 253), regex(pattern = DNS_SUBDOMAIN_PATTERN))]
    pub secret_name: String,

    /// The query parameter, and the cookie, that carry the token (the parameter first). Default
    /// `__token__`, Akamai EdgeAuth's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64), regex(pattern = r"^[A-Za-z0-9_]+$"))]
    pub token_name: Option<String>,

    /// Send the token on to the sources. Default false: it is removed from the request they get.
    /// Either way it is no part of the cache key or of a pool's hash: one object is cached once,
    /// whatever its token.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub forward_token: bool,
}

impl SignedUrls {
    /// The query parameter and cookie of the token.
    pub fn token_name(&self) -> &str {
        self.token_name.as_deref().unwrap_or(DEFAULT_TOKEN_NAME)
    }
}

/// What the operator observed of a CdnCluster.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CdnClusterStatus {
    /// `WaitingSource` (a source does not exist yet), `Deploying` (children applied, not every
    /// replica ready), `Running` (every replica ready), `Invalid` (the spec cannot be served) or
    /// `Error` (the API server refused a child).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<State>,

    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// Desired replicas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,

    /// Replicas ready to serve.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_replicas: Option<i32>,

    /// `readyReplicas/replicas`, for `kubectl get`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<String>,

    /// The label selector of the cluster's pods, for the scale subresource (what a
    /// HorizontalPodAutoscaler reads the pods' metrics by).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,

    /// kstatus conditions: Ready, SourcesReady, Reconciling and Stalled.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// The state of a CdnCluster, as the original system reported it, plus Running and Invalid.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum State {
    /// A source does not exist yet; nothing is deployed until it does.
    WaitingSource,
    /// Children are applied; not every replica is ready yet.
    Deploying,
    /// Every replica is ready.
    Running,
    /// The spec cannot be served (a cycle, a duplicate or unusable source); see the conditions.
    Invalid,
    /// The API server refused a child (a quota, an admission webhook, RBAC); the conditions and a
    /// Warning Event carry its message. Retried with backoff.
    Error,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::WaitingSource => "WaitingSource",
            State::Deploying => "Deploying",
            State::Running => "Running",
            State::Invalid => "Invalid",
            State::Error => "Error",
        }
    }

    pub const ALL: [State; 5] = [
        State::WaitingSource,
        State::Deploying,
        State::Running,
        State::Invalid,
        State::Error,
    ];
}

/// The Service of a CdnCluster, as viewers reach it.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{"rule": "!has(self.externalTrafficPolicy) || (has(self.type) && self.type != 'ClusterIP')", "message": "externalTrafficPolicy applies to a NodePort or LoadBalancer Service"}, {"rule": "!has(self.loadBalancerClass) || (has(self.type) && self.type == 'LoadBalancer')", "message": "loadBalancerClass applies to a LoadBalancer Service"}]))]
pub struct ServiceExposure {
    /// `ClusterIP` (default), `NodePort` or `LoadBalancer`; other than `ClusterIP` for a
    /// `balancer` only (a cache's Service is headless: its parents reach each of its pods).
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<ServiceType>,

    /// Annotations of the Service, for the load balancer that serves it (a cloud provider's,
    /// MetalLB's). Only these are the operator's: annotations others add are left alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,

    /// `Local` keeps the viewer's address (the balancer then sees it and passes it on in
    /// `X-Forwarded-For`) and sends traffic only to nodes that run a pod of the cluster;
    /// `Cluster` (Kubernetes' default) spreads over every node and hides the address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_traffic_policy: Option<TrafficPolicy>,

    /// The load balancer implementation to use, when the cluster has several.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub load_balancer_class: Option<String>,

    /// Viewer address ranges allowed through the load balancer (CIDRs), where it supports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    #[schemars(extend("items" = {"type": "string", "maxLength": 64, "x-kubernetes-validations": [{"rule": "isCIDR(self)", "message": "must be a CIDR range"}]}))]
    pub load_balancer_source_ranges: Option<Vec<String>>,
}

/// An Ingress in front of a CdnCluster: every path of `host` to its Service.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IngressExposure {
    /// The host viewers ask for (`cdn.example.com`, or `*.example.com`).
    #[schemars(length(min = 1, max = 253))]
    #[schemars(regex(
        pattern = r"^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
    ))]
    pub host: String,

    /// The IngressClass that serves it; the cluster's default class when left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub class_name: Option<String>,

    /// Annotations of the Ingress, for its controller (cert-manager's issuer, rate limits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,

    /// A `kubernetes.io/tls` Secret of the namespace holding the host's certificate: the ingress
    /// controller then serves HTTPS for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub tls_secret_name: Option<String>,
}

/// The type of a CdnCluster's Service.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ServiceType {
    ClusterIP,
    NodePort,
    LoadBalancer,
}

impl ServiceType {
    pub fn as_str(self) -> &'static str {
        match self {
            ServiceType::ClusterIP => "ClusterIP",
            ServiceType::NodePort => "NodePort",
            ServiceType::LoadBalancer => "LoadBalancer",
        }
    }
}

/// Where the traffic of a node-facing Service goes.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum TrafficPolicy {
    Cluster,
    Local,
}

impl TrafficPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            TrafficPolicy::Cluster => "Cluster",
            TrafficPolicy::Local => "Local",
        }
    }
}

/// How and where a CdnCluster's pods run: the placement fields as a pod spec has them, and how
/// they stop.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct Pods {
    /// Nodes must have these labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,

    /// Taints the pods tolerate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerations: Option<Vec<Toleration>>,

    /// Node and pod affinity and anti-affinity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,

    /// The PriorityClass of the pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub priority_class_name: Option<String>,

    /// How the pods spread over topology domains. Default: at most one pod more on a node than on
    /// another, and in a zone than in another, where the scheduler can (`ScheduleAnyway`); `[]`:
    /// no spreading.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology_spread_constraints: Option<Vec<TopologySpreadConstraint>>,

    /// How many pods may be down at once in a voluntary disruption (a node drain) when the
    /// cluster has more than one replica: a PodDisruptionBudget. A number or a percentage.
    /// Default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-validations" = [{"rule": "type(self) == int ? self >= 1 : self.matches('^([1-9][0-9]?|100)%$')", "message": "must be at least 1, or a percentage from 1% to 100%"}]))]
    pub max_unavailable: Option<IntOrString>,

    /// Seconds a pod told to stop has to finish the requests in flight (long downloads included)
    /// before it is killed; it stops taking new connections first. Default 60.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 10, max = 86400))]
    pub termination_grace_period_seconds: Option<i64>,
}
