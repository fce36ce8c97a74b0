//! Lease-based leader election (coordination.k8s.io/v1, with kube-leader-election), with
//! controller-runtime's timing: a candidate tries every retry period; the leader renews every
//! retry period and gives up if it could not renew within the renew deadline, which is shorter
//! than the lease so it stops before anyone else may take over.
//!
//! The election drives a [`Leadership`]: the controllers reconcile only while it says so.

use crate::reconcile::Leadership;
use k8s_openapi::api::coordination::v1::Lease;
use kube_leader_election::{LeaseLock, LeaseLockParams, LeaseLockResult};
use prometheus_client::metrics::gauge::Gauge;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;
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
    pub fn validate(&self) -> Result<(), String> {
        if self.namespace.is_empty() {
            return Err("the leader election namespace is empty".into());
        }
        if self.lease_name.is_empty() {
            return Err("the leader election lease name is empty".into());
        }
        if self.identity.is_empty() {
            return Err("the leader election identity is empty".into());
        }
        if self.lease_duration.subsec_nanos() != 0 || self.lease_duration.is_zero() {
            return Err(format!(
                "--leader-election-lease-duration must be a whole number of seconds, got {:?}",
                self.lease_duration
            ));
        }
        if self.lease_duration <= self.renew_deadline {
            return Err(format!(
                "--leader-election-lease-duration ({:?}) must be longer than --leader-election-renew-deadline ({:?})",
                self.lease_duration, self.renew_deadline
            ));
        }
        if self.retry_period.is_zero() || self.renew_deadline <= self.retry_period.mul_f64(1.2) {
            return Err(format!(
                "--leader-election-renew-deadline ({:?}) must be longer than 1.2 × --leader-election-retry-period ({:?}), which must not be zero",
                self.renew_deadline, self.retry_period
            ));
        }
        Ok(())
    }
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
        .unwrap_or_else(|| "cdn-operator".into());
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
) -> Result<String, String> {
    if let Some(ns) = flag.map(str::trim).filter(|n| !n.is_empty()) {
        return Ok(ns.to_string());
    }
    match std::fs::read_to_string(service_account_file) {
        Ok(ns) if !ns.trim().is_empty() => Ok(ns.trim().to_string()),
        _ => Err("cannot tell which namespace to hold the leader election lease in: set --leader-election-namespace (or POD_NAMESPACE), or run with --leader-elect=false".into()),
    }
}

/// Where Kubernetes mounts the pod's namespace.
pub const SERVICE_ACCOUNT_NAMESPACE: &str =
    "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

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
            .contains("must be longer than --leader-election-renew-deadline"));
        let mut c = config();
        c.retry_period = Duration::from_secs(9);
        assert!(c.validate().unwrap_err().contains("1.2 ×"));
        let mut c = config();
        c.retry_period = Duration::ZERO;
        assert!(c.validate().is_err());
        let mut c = config();
        c.lease_duration = Duration::from_millis(15500);
        assert!(c
            .validate()
            .unwrap_err()
            .contains("whole number of seconds"));
        let mut c = config();
        c.identity = String::new();
        assert!(c.validate().unwrap_err().contains("identity"));
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
            .contains("--leader-election-namespace"));
        std::fs::write(&file, "operators\n").unwrap();
        assert_eq!(namespace(None, &file), Ok("operators".into()));
        assert_eq!(namespace(Some(" "), &file), Ok("operators".into()));
    }
}

/// The election against the in-memory API server (kube-fake-client). What it cannot show: real
/// API latency, resourceVersion conflicts between racing candidates (the library patches without
/// preconditions), and clock skew between nodes.
#[cfg(test)]
mod api_tests {
    use super::*;
    use kube::api::{Api, Patch, PatchParams};
    use kube_fake_client::interceptor::Funcs;
    use kube_fake_client::ClientBuilder;
    use std::sync::atomic::{AtomicBool, Ordering};

    fn config(identity: &str) -> Config {
        Config {
            namespace: "ops".into(),
            lease_name: "cdn-operator".into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(3),
            renew_deadline: Duration::from_secs(2),
            retry_period: Duration::from_millis(200),
        }
    }

    fn elector(client: &kube::Client, identity: &str) -> (Elector, Leadership, Gauge) {
        let leadership = Leadership::standby();
        let gauge = Gauge::default();
        let elector = Elector::new(
            client.clone(),
            config(identity),
            leadership.clone(),
            gauge.clone(),
        );
        (elector, leadership, gauge)
    }

    async fn lease(client: &kube::Client) -> Lease {
        Api::<Lease>::namespaced(client.clone(), "ops")
            .get("cdn-operator")
            .await
            .unwrap()
    }

    fn spec_holder(lease: &Lease) -> Option<String> {
        lease.spec.as_ref().unwrap().holder_identity.clone()
    }

    async fn eventually(what: &str, within: Duration, check: impl Fn() -> bool) {
        let start = Instant::now();
        while !check() {
            assert!(start.elapsed() < within, "{what}: not within {within:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// `client`, where each patch of a Lease waits until `racers` patches are under way: every
    /// candidate has read the Lease before any writes it, the worst interleaving.
    fn racing(client: kube::Client, racers: usize) -> kube::Client {
        let barrier = Arc::new(tokio::sync::Barrier::new(racers));
        let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
            let (client, barrier) = (client.clone(), barrier.clone());
            async move {
                let lease_patch = request.method() == http::Method::PATCH
                    && request.uri().path().contains("/leases/");
                if lease_patch {
                    barrier.wait().await;
                }
                client.send(request).await.map_err(tower::BoxError::from)
            }
        });
        kube::Client::new(service, "default")
    }

    #[tokio::test]
    async fn two_candidates_racing_for_an_expired_lease_never_both_lead() {
        let client = ClientBuilder::new().build().await.unwrap();
        let expired: Lease = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "cdn-operator", "namespace": "ops"},
            "spec": {"holderIdentity": "pod-gone", "leaseDurationSeconds": 1,
                "renewTime": "2026-01-01T00:00:00.000000Z", "acquireTime": "2026-01-01T00:00:00.000000Z",
                "leaseTransitions": 0}
        }))
        .unwrap();
        Api::<Lease>::namespaced(client.clone(), "ops")
            .create(&Default::default(), &expired)
            .await
            .unwrap();
        let racing = racing(client.clone(), 2);
        let (a, _, _) = elector(&racing, "pod-a");
        let (b, _, _) = elector(&racing, "pod-b");
        let (ra, rb) = tokio::join!(
            a.attempt(Duration::from_secs(5)),
            b.attempt(Duration::from_secs(5))
        );
        let leading: Vec<&str> = [("pod-a", &ra), ("pod-b", &rb)]
            .into_iter()
            .filter(|(_, r)| matches!(r, Attempt::Leading))
            .map(|(who, _)| who)
            .collect();
        assert_eq!(leading.len(), 1, "exactly one leads: {ra:?} / {rb:?}");
        let holder = spec_holder(&lease(&client).await).unwrap();
        assert_eq!(holder, leading[0], "and it is the holder");
        let loser = if holder == "pod-a" { &rb } else { &ra };
        assert!(
            matches!(loser, Attempt::Failed(e) if e.contains("409") || e.contains("onflict")),
            "the other was refused by the precondition: {loser:?}"
        );
    }

    #[tokio::test]
    async fn acquire_renew_and_stand_by() {
        let client = ClientBuilder::new().build().await.unwrap();
        let (a, _, _) = elector(&client, "pod-a");
        let (b, _, _) = elector(&client, "pod-b");

        assert!(matches!(
            a.attempt(Duration::from_secs(1)).await,
            Attempt::Leading
        ));
        let first = lease(&client).await;
        assert_eq!(spec_holder(&first), Some("pod-a".into()));
        assert_eq!(first.spec.as_ref().unwrap().lease_duration_seconds, Some(3));

        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(matches!(
            a.attempt(Duration::from_secs(1)).await,
            Attempt::Leading
        ));
        let renewed = lease(&client).await;
        let renew_time = |l: &Lease| l.spec.as_ref().unwrap().renew_time.clone().unwrap().0;
        assert!(
            renew_time(&renewed) > renew_time(&first),
            "the renewal moved renewTime"
        );

        match b.attempt(Duration::from_secs(1)).await {
            Attempt::Following { holder, retry_in } => {
                assert_eq!(holder, "pod-a");
                assert_eq!(
                    retry_in,
                    b.config().retry_period,
                    "a live lease: retry at the period"
                );
            }
            other => panic!("pod-b must follow, got {other:?}"),
        }
        assert_eq!(spec_holder(&lease(&client).await), Some("pod-a".into()));
    }

    #[tokio::test]
    async fn the_leader_releases_and_a_standby_takes_over_within_a_retry_period() {
        let client = ClientBuilder::new().build().await.unwrap();
        let (a, a_leads, a_gauge) = elector(&client, "pod-a");
        let (mut b, b_leads, b_gauge) = elector(&client, "pod-b");
        // A realistic retry period, to show the standby does not wait for it after a release.
        b.config.retry_period = Duration::from_millis(1500);

        let stop_a = Arc::new(tokio::sync::Notify::new());
        let stop = stop_a.clone();
        let a = Arc::new(a);
        let running_a = {
            let a = a.clone();
            tokio::spawn(async move { a.run(stop.notified()).await })
        };
        eventually("pod-a leads", Duration::from_secs(2), || {
            a_leads.is_leader()
        })
        .await;
        assert_eq!(a_gauge.get(), 1);

        let b = Arc::new(b);
        let running_b = {
            let b = b.clone();
            tokio::spawn(async move { b.run(std::future::pending()).await })
        };
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert!(
            !b_leads.is_leader(),
            "a standby must not lead while the lease is held"
        );
        assert_eq!(b_gauge.get(), 0);
        assert!(a_leads.is_leader(), "the leader keeps renewing");

        stop_a.notify_one();
        running_a.await.unwrap().unwrap();
        a.release().await;
        assert!(!a_leads.is_leader());
        assert_eq!(a_gauge.get(), 0);
        let released = Instant::now();
        assert_eq!(spec_holder(&lease(&client).await), Some(String::new()));

        // The released lease expires one second after release; pod-b tries then, or at its next
        // retry if that comes first: within its retry period (plus scheduling slack), not the
        // 1 s expiry + a retry period it would take without looking at the expiry.
        eventually("pod-b takes over", Duration::from_millis(2000), || {
            b_leads.is_leader()
        })
        .await;
        assert!(released.elapsed() >= Duration::from_secs(1));
        assert_eq!(b_gauge.get(), 1);
        assert_eq!(spec_holder(&lease(&client).await), Some("pod-b".into()));
        running_b.abort();
    }

    #[tokio::test]
    async fn a_leader_whose_lease_is_taken_stops_at_once_with_an_error() {
        let client = ClientBuilder::new().build().await.unwrap();
        let (a, a_leads, a_gauge) = elector(&client, "pod-a");
        let running = {
            let a = Arc::new(a);
            tokio::spawn(async move { a.run(std::future::pending()).await })
        };
        eventually("pod-a leads", Duration::from_secs(2), || {
            a_leads.is_leader()
        })
        .await;

        // Another replica (clock skew, a partition) writes itself in as the holder.
        let now = format!("{:.6}", jiff::Timestamp::now());
        let patch = serde_json::json!({"spec": {"holderIdentity": "pod-z", "renewTime": now}});
        Api::<Lease>::namespaced(client.clone(), "ops")
            .patch(
                "cdn-operator",
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .unwrap();

        let lost = tokio::time::timeout(Duration::from_secs(2), running)
            .await
            .expect("the loss is seen at the next renewal")
            .unwrap()
            .unwrap_err();
        assert!(
            matches!(&lost, Lost::TakenOver { holder, .. } if holder == "pod-z"),
            "{lost}"
        );
        assert_eq!(
            lost.to_string(),
            "lost the leader election lease ops/cdn-operator: it is now held by pod-z"
        );
        assert!(!a_leads.is_leader());
        assert_eq!(a_gauge.get(), 0);
    }

    #[tokio::test]
    async fn a_leader_that_cannot_renew_gives_up_at_the_renew_deadline() {
        let failing = Arc::new(AtomicBool::new(false));
        let fail = failing.clone();
        let client = ClientBuilder::new()
            .with_interceptor_funcs(Funcs::new().patch(move |_| {
                if fail.load(Ordering::SeqCst) {
                    Err(kube_fake_client::Error::InvalidRequest(
                        "the API server is unreachable".into(),
                    ))
                } else {
                    Ok(None)
                }
            }))
            .build()
            .await
            .unwrap();
        let (a, a_leads, _) = elector(&client, "pod-a");
        let running = {
            let a = Arc::new(a);
            tokio::spawn(async move { a.run(std::future::pending()).await })
        };
        eventually("pod-a leads", Duration::from_secs(2), || {
            a_leads.is_leader()
        })
        .await;
        failing.store(true, Ordering::SeqCst);
        let cut = Instant::now();

        tokio::time::sleep(Duration::from_millis(1000)).await;
        assert!(
            a_leads.is_leader(),
            "failures within the deadline are retried"
        );
        let lost = tokio::time::timeout(Duration::from_secs(3), running)
            .await
            .expect("the leader gives up")
            .unwrap()
            .unwrap_err();
        let given_up = cut.elapsed();
        assert!(matches!(lost, Lost::RenewDeadline { .. }), "{lost}");
        assert!(
            lost.to_string().contains("the API server is unreachable"),
            "{lost}"
        );
        // Before the 3 s lease expires, so no other replica could have taken over yet.
        assert!(given_up < Duration::from_secs(3), "{given_up:?}");
        assert!(given_up >= Duration::from_millis(1700), "{given_up:?}");
        assert!(!a_leads.is_leader());
    }
}
