//! Lease-based leader election (coordination.k8s.io/v1, with kube-leader-election), with
//! controller-runtime's timing: a candidate tries every retry period; the leader renews every
//! retry period and gives up if it could not renew within the renew deadline, which is shorter
//! than the lease so it stops before anyone else may take over.
//!
//! The election drives a [`Leadership`]: the controllers reconcile only while it says so.

use futures::Stream;
use k8s_openapi::api::coordination::v1::Lease;
use kube_leader_election::{LeaseLock, LeaseLockParams, LeaseLockResult};
use prometheus_client::metrics::gauge::Gauge;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// Where the election takes place and how fast it moves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    pub namespace: String,
    pub lease_name: String,
    pub identity: String,
    /// How long a lease is valid after its last renewal (whole seconds: the Lease stores seconds).
    pub lease_duration: Duration,
    /// How long the leader keeps trying to renew before it gives up leadership.
    pub renew_deadline: Duration,
    /// How often candidates try to acquire and the leader renews.
    pub retry_period: Duration,
}

impl Config {
    pub const DEFAULT_LEASE_DURATION: Duration = Duration::from_secs(15);
    pub const DEFAULT_RENEW_DEADLINE: Duration = Duration::from_secs(10);
    pub const DEFAULT_RETRY_PERIOD: Duration = Duration::from_secs(2);

    /// The same rules as client-go: lease > renew deadline > 1.2 × retry period.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.namespace.is_empty() {
            return Err(ConfigError::Empty("namespace"));
        }
        if self.lease_name.is_empty() {
            return Err(ConfigError::Empty("lease name"));
        }
        if self.identity.is_empty() {
            return Err(ConfigError::Empty("identity"));
        }
        if self.lease_duration.subsec_nanos() != 0 || self.lease_duration.is_zero() {
            return Err(ConfigError::LeaseNotWholeSeconds(self.lease_duration));
        }
        if self.lease_duration <= self.renew_deadline {
            return Err(ConfigError::LeaseNotLongerThanRenewDeadline {
                lease: self.lease_duration,
                renew: self.renew_deadline,
            });
        }
        if self.retry_period.is_zero() || self.renew_deadline <= self.retry_period.mul_f64(1.2) {
            return Err(ConfigError::RenewDeadlineTooShort {
                renew: self.renew_deadline,
                retry: self.retry_period,
            });
        }
        Ok(())
    }
}

/// Why the leader election cannot be set up as configured.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("the leader election {0} is empty")]
    Empty(&'static str),
    #[error("--leader-election-lease-duration must be a whole number of seconds, got {0:?}")]
    LeaseNotWholeSeconds(Duration),
    #[error("--leader-election-lease-duration ({lease:?}) must be longer than --leader-election-renew-deadline ({renew:?})")]
    LeaseNotLongerThanRenewDeadline { lease: Duration, renew: Duration },
    #[error("--leader-election-renew-deadline ({renew:?}) must be longer than 1.2 × --leader-election-retry-period ({retry:?}), which must not be zero")]
    RenewDeadlineTooShort { renew: Duration, retry: Duration },
    #[error("cannot tell which namespace to hold the leader election lease in: set --leader-election-namespace (or POD_NAMESPACE), or run with --leader-elect=false")]
    NoNamespace,
}

/// Why the replica stopped leading. The process must exit and restart clean: its caches and
/// queues assumed leadership.
#[derive(Debug, thiserror::Error)]
pub enum Lost {
    #[error("lost the leader election lease {namespace}/{name}: it is now held by {holder}")]
    TakenOver {
        namespace: String,
        name: String,
        holder: String,
    },
    #[error(
        "could not renew the leader election lease {namespace}/{name} within {deadline:?}: {error}"
    )]
    RenewDeadline {
        namespace: String,
        name: String,
        deadline: Duration,
        error: String,
    },
}

/// What one attempt found.
#[derive(Debug)]
pub enum Attempt {
    /// This replica holds the lease (just acquired or renewed).
    Leading,
    /// Someone else holds it; try again in the given time.
    Following { holder: String, retry_in: Duration },
    /// The API call failed or timed out.
    Failed(String),
}

pub struct Elector {
    lock: LeaseLock,
    config: Config,
    leadership: Leadership,
    status: Gauge,
    /// Whether this elector holds the lease, whatever others did to `leadership` since.
    holding: std::sync::atomic::AtomicBool,
}

impl Elector {
    /// `status` is set to 1 while leading (`leader_election_master_status`).
    pub fn new(
        client: kube::Client,
        config: Config,
        leadership: Leadership,
        status: Gauge,
    ) -> Self {
        let lock = LeaseLock::new(
            compare_and_swap(client, &config.lease_name),
            &config.namespace,
            LeaseLockParams {
                lease_name: config.lease_name.clone(),
                holder_id: config.identity.clone(),
                lease_ttl: config.lease_duration,
            },
        );
        status.set(0);
        Elector {
            lock,
            config,
            leadership,
            status,
            holding: std::sync::atomic::AtomicBool::new(false),
        }
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// One try to acquire or renew, bounded by `timeout`.
    pub async fn attempt(&self, timeout: Duration) -> Attempt {
        match tokio::time::timeout(timeout, self.lock.try_acquire_or_renew()).await {
            Err(_) => Attempt::Failed(format!("no answer within {timeout:?}")),
            Ok(Err(error)) => Attempt::Failed(error.to_string()),
            Ok(Ok(LeaseLockResult::Acquired(_))) => Attempt::Leading,
            Ok(Ok(LeaseLockResult::NotAcquired(lease))) => Attempt::Following {
                holder: holder(&lease),
                retry_in: self.retry_in(&lease, jiff::Timestamp::now()),
            },
        }
    }

    /// When to try again while following: at the retry period, or as soon as the lease expires
    /// if that is sooner (a released lease expires a second after release), so a standby takes
    /// over within one retry period of a release.
    fn retry_in(&self, lease: &Lease, now: jiff::Timestamp) -> Duration {
        let retry = self.config.retry_period;
        let Some(spec) = &lease.spec else {
            return retry;
        };
        let (Some(renewed), Some(seconds)) = (&spec.renew_time, spec.lease_duration_seconds) else {
            return retry;
        };
        let expiry = renewed.0 + jiff::SignedDuration::from_secs(i64::from(seconds));
        let until = Duration::try_from(expiry.duration_since(now)).unwrap_or(Duration::ZERO);
        // The library takes over strictly after expiry; a little margin avoids a wasted try.
        (until + Duration::from_millis(50)).min(retry)
    }

    /// Campaigns until `stop` completes (then returns Ok, still holding the lease if leading:
    /// call [`Elector::release`]) or leadership is lost (Err, leadership already revoked).
    pub async fn run(&self, stop: impl Future<Output = ()>) -> Result<(), Lost> {
        tokio::pin!(stop);
        let mut renewed_at: Option<Instant> = None;
        loop {
            let leading = renewed_at.is_some();
            // A leader's attempt may not outlast its deadline; a candidate's may take as long.
            let timeout = match renewed_at {
                Some(at) => self
                    .config
                    .renew_deadline
                    .saturating_sub(at.elapsed())
                    .max(Duration::from_millis(1)),
                None => self.config.renew_deadline,
            };
            let attempt = tokio::select! {
                _ = &mut stop => return Ok(()),
                attempt = self.attempt(timeout) => attempt,
            };
            let wait = match attempt {
                Attempt::Leading => {
                    if !leading {
                        tracing::info!(lease = %self.config.lease_name, identity = %self.config.identity, "became the leader");
                        self.set(true);
                    }
                    renewed_at = Some(Instant::now());
                    self.config.retry_period
                }
                Attempt::Following { holder, retry_in } => {
                    if leading {
                        self.set(false);
                        return Err(Lost::TakenOver {
                            namespace: self.config.namespace.clone(),
                            name: self.config.lease_name.clone(),
                            holder,
                        });
                    }
                    tracing::debug!(%holder, "another replica leads; standing by");
                    retry_in
                }
                Attempt::Failed(error) => {
                    if let Some(at) = renewed_at {
                        if at.elapsed() >= self.config.renew_deadline {
                            self.set(false);
                            return Err(Lost::RenewDeadline {
                                namespace: self.config.namespace.clone(),
                                name: self.config.lease_name.clone(),
                                deadline: self.config.renew_deadline,
                                error,
                            });
                        }
                    }
                    tracing::warn!(%error, leading, "leader election attempt failed");
                    self.config.retry_period
                }
            };
            tokio::select! {
                _ = &mut stop => return Ok(()),
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// Stops leading and releases the lease so a standby takes over at once rather than after
    /// the lease expires. Reconciles stop before the lease is given up.
    pub async fn release(&self) {
        let holding = self.holding.load(std::sync::atomic::Ordering::SeqCst);
        self.set(false);
        if !holding {
            return;
        }
        match tokio::time::timeout(self.config.renew_deadline, self.lock.step_down()).await {
            Ok(Ok(())) => {
                tracing::info!(lease = %self.config.lease_name, "released the leader election lease")
            }
            Ok(Err(error)) => {
                tracing::warn!(%error, "could not release the leader election lease; it will expire")
            }
            Err(_) => {
                tracing::warn!("releasing the leader election lease timed out; it will expire")
            }
        }
    }

    fn set(&self, leading: bool) {
        self.holding
            .store(leading, std::sync::atomic::Ordering::SeqCst);
        self.leadership.set(leading);
        self.status.set(i64::from(leading));
    }
}

/// The client of the lease lock, made a compare-and-swap: kube-leader-election reads the Lease,
/// decides, then merge-patches it with no precondition, so two candidates racing for an expired
/// Lease would both be told they acquired it. Here each patch of the Lease carries the
/// resourceVersion of the Lease as last read: the second writer gets 409 Conflict and follows.
fn compare_and_swap(client: kube::Client, lease: &str) -> kube::Client {
    use http_body_util::BodyExt;
    let suffix = format!("/leases/{lease}");
    let last_read: Arc<Mutex<Option<String>>> = Arc::default();
    let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
        let (client, suffix, last_read) = (client.clone(), suffix.clone(), last_read.clone());
        async move {
            if !request.uri().path().ends_with(&suffix) {
                return client.send(request).await.map_err(tower::BoxError::from);
            }
            let (parts, body) = request.into_parts();
            let mut body = body.collect().await?.to_bytes();
            if parts.method == http::Method::PATCH {
                let version = last_read.lock().expect("lease version lock").clone();
                if let (Some(version), Ok(mut patch)) =
                    (version, serde_json::from_slice::<serde_json::Value>(&body))
                {
                    patch["metadata"]["resourceVersion"] = serde_json::Value::String(version);
                    body = serde_json::to_vec(&patch)?.into();
                }
            }
            let reads = parts.method == http::Method::GET;
            let request = http::Request::from_parts(parts, body.to_vec().into());
            let response = client.send(request).await?;
            if !(reads && response.status().is_success()) {
                return Ok(response);
            }
            let (parts, body) = response.into_parts();
            let body = body.collect().await?.to_bytes();
            let version = serde_json::from_slice::<Lease>(&body)
                .ok()
                .and_then(|lease| lease.metadata.resource_version);
            *last_read.lock().expect("lease version lock") = version;
            Ok::<_, tower::BoxError>(http::Response::from_parts(parts, body.to_vec().into()))
        }
    });
    kube::Client::new(service, "default")
}

fn holder(lease: &Lease) -> String {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.clone())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "nobody (released)".into())
}

/// The default identity: the pod name, else the host name with a random suffix so two
/// processes on one machine never share an identity (which would make both leaders).
pub fn default_identity(pod_name: Option<&str>) -> String {
    if let Some(pod) = pod_name.filter(|p| !p.is_empty()) {
        return pod.to_string();
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".into());
    // Unique per process, not secret: std's RandomState is keyed from the OS's random source,
    // which is all 32 bits of suffix need; no random-number crate for that.
    use std::hash::{BuildHasher, Hasher};
    let suffix = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    format!("{host}_{:08x}", suffix as u32)
}

/// The namespace of the Lease: the flag, else `POD_NAMESPACE` (both via `flag`), else the
/// namespace of the service account the pod runs as.
pub fn namespace(
    flag: Option<&str>,
    service_account_file: &std::path::Path,
) -> Result<String, ConfigError> {
    if let Some(ns) = flag.map(str::trim).filter(|n| !n.is_empty()) {
        return Ok(ns.to_string());
    }
    match std::fs::read_to_string(service_account_file) {
        Ok(ns) if !ns.trim().is_empty() => Ok(ns.trim().to_string()),
        _ => Err(ConfigError::NoNamespace),
    }
}

/// Where Kubernetes mounts the pod's namespace.
pub const SERVICE_ACCOUNT_NAMESPACE: &str =
    "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

/// Whether this replica may write. Standby replicas keep their caches warm and reconcile nothing:
/// the runtime calls no reconcile on them ([`crate::instrument::Reconciles`]), and each acquisition
/// of leadership triggers a full reconcile (`acquired`, given to each controller).
#[derive(Clone)]
pub struct Leadership {
    tx: Arc<watch::Sender<bool>>,
}

impl Leadership {
    /// Starts as a standby until `set(true)`.
    pub fn standby() -> Self {
        Leadership {
            tx: Arc::new(watch::Sender::new(false)),
        }
    }

    /// Always the leader: no election (local runs, tests).
    pub fn always() -> Self {
        Leadership {
            tx: Arc::new(watch::Sender::new(true)),
        }
    }

    pub fn set(&self, leader: bool) {
        self.tx.send_replace(leader);
    }

    pub fn is_leader(&self) -> bool {
        *self.tx.borrow()
    }

    /// Yields once each time leadership is acquired after this call.
    pub fn acquired(&self) -> impl Stream<Item = ()> + Send + 'static {
        let mut rx = self.tx.subscribe();
        rx.mark_unchanged();
        futures::stream::unfold(rx, |mut rx| async move {
            loop {
                rx.changed().await.ok()?;
                if *rx.borrow_and_update() {
                    return Some(((), rx));
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Config {
        Config {
            namespace: "ops".into(),
            lease_name: "cdn-operator".into(),
            identity: "pod-a".into(),
            lease_duration: Config::DEFAULT_LEASE_DURATION,
            renew_deadline: Config::DEFAULT_RENEW_DEADLINE,
            retry_period: Config::DEFAULT_RETRY_PERIOD,
        }
    }

    #[test]
    fn controller_runtime_defaults_are_valid() {
        assert_eq!(config().validate(), Ok(()));
    }

    #[test]
    fn inconsistent_timings_are_refused() {
        let mut c = config();
        c.renew_deadline = Duration::from_secs(15);
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("must be longer than --leader-election-renew-deadline"));
        let mut c = config();
        c.retry_period = Duration::from_secs(9);
        assert!(c.validate().unwrap_err().to_string().contains("1.2 ×"));
        let mut c = config();
        c.retry_period = Duration::ZERO;
        assert!(c.validate().is_err());
        let mut c = config();
        c.lease_duration = Duration::from_millis(15500);
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("whole number of seconds"));
        let mut c = config();
        c.identity = String::new();
        assert!(c.validate().unwrap_err().to_string().contains("identity"));
    }

    #[test]
    fn identity_is_the_pod_name_else_a_unique_host_identity() {
        assert_eq!(
            default_identity(Some("cdn-operator-7d9f-abcde")),
            "cdn-operator-7d9f-abcde"
        );
        let a = default_identity(None);
        let b = default_identity(Some(""));
        assert!(a.contains('_') && !a.starts_with('_'), "{a}");
        assert_ne!(a, b, "two processes on one host must differ");
    }

    #[test]
    fn namespace_comes_from_the_flag_or_the_service_account() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("namespace");
        assert_eq!(namespace(Some("ops"), &file), Ok("ops".into()));
        assert!(namespace(None, &file)
            .unwrap_err()
            .to_string()
            .contains("--leader-election-namespace"));
        std::fs::write(&file, "operators\n").unwrap();
        assert_eq!(namespace(None, &file), Ok("operators".into()));
        assert_eq!(namespace(Some(" "), &file), Ok("operators".into()));
    }
}
