//! The sidecar's purge endpoint (`POST /purge`): takes a [`Batch`] the operator signed, checks it,
//! and applies it to the pod's cache on a thread of its own ([`Purger`]), one batch at a time.
//!
//! What it checks, in order: the signature (Ed25519, by a key of the file the operator publishes
//! in the CdnCluster's ConfigMap, read at each request so a new key is taken as soon as the
//! kubelet has updated the volume), the cluster the batch is meant for, its validity, that it was
//! not applied already. A purge seen again (the operator retries after a timeout) keeps the
//! cutoff of its first time, so what was fetched since stays cached.

use crate::nginx_cache::scan::{self, Target};
use crate::nginx_cache::selector::{Matcher, Selection};
use crate::nginx_cache::wire::{self, Applied, Batch};
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::oneshot;

/// The largest batch taken: the operator sends at most [`wire::MAX_BATCH_BYTES`].
const BODY_LIMIT: usize = 2 * wire::MAX_BATCH_BYTES;
/// How long a walk waits for the fills in flight at its start: longer than a tier's read
/// timeout, so only a stalled source's fill is left unchecked.
const FILL_WAIT: Duration = Duration::from_secs(30);
/// How long a purge's cutoff is remembered: longer than the operator's retries of one pod.
const CUTOFF_MEMORY: Duration = Duration::from_secs(3600);
/// How long after its walk a purge still applies to what nginx writes ([`scan::sweep`]): a fill
/// whose response came before the purge but that a busy worker wrote after the walk. Only fills
/// dated before the purge's second: one of the same second may have come after it (nginx dates
/// by the second), and the walk kept those on purpose.
const LINGER: Duration = Duration::from_secs(3);
/// How often the folders changed meanwhile are swept while purges linger.
const SWEEP_EVERY: Duration = Duration::from_millis(50);

/// Seconds since the epoch, the unit of nginx's cache headers.
fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

struct Job {
    batch: Batch,
    reply: oneshot::Sender<Result<Applied, String>>,
}

/// The thread that walks the cache. Started before the sidecar lowers its priority (a thread's
/// nice value is its own on Linux, inherited by threads started after): a purge under load is
/// not starved by nginx's workers, which the counting of the log is, on purpose.
#[derive(Clone)]
pub struct Purger {
    jobs: mpsc::Sender<Job>,
}

impl Purger {
    /// Starts the thread that applies purges to the cache at `cache_dir`.
    pub fn start(cache_dir: PathBuf) -> std::io::Result<Purger> {
        let (jobs, queue) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("purge".into())
            .spawn(move || {
                let mut cutoffs: HashMap<String, (i64, Instant)> = HashMap::new();
                let mut memory = scan::Memory::watching();
                let mut lingering = Lingering::default();
                loop {
                    let job = if lingering.purges.is_empty() {
                        match queue.recv() {
                            Ok(job) => job,
                            Err(_) => break,
                        }
                    } else {
                        match queue.recv_timeout(SWEEP_EVERY) {
                            Ok(job) => job,
                            Err(mpsc::RecvTimeoutError::Timeout) => {
                                lingering.sweep(&cache_dir, &mut memory);
                                continue;
                            }
                            Err(mpsc::RecvTimeoutError::Disconnected) => break,
                        }
                    };
                    cutoffs.retain(|_, (_, seen)| seen.elapsed() < CUTOFF_MEMORY);
                    let result = apply(
                        &cache_dir,
                        &job.batch,
                        &mut cutoffs,
                        &mut memory,
                        &mut lingering,
                    );
                    let _ = job.reply.send(result);
                }
            })?;
        Ok(Purger { jobs })
    }

    async fn apply(&self, batch: Batch) -> Result<Applied, String> {
        let (reply, answer) = oneshot::channel();
        self.jobs
            .send(Job { batch, reply })
            .map_err(|_| "the purge thread stopped".to_string())?;
        answer
            .await
            .map_err(|_| "the purge thread stopped".to_string())?
    }
}

/// The purges applied in the last [`LINGER`], still applied to what nginx writes.
#[derive(Default)]
struct Lingering {
    purges: Vec<(Selection, Target, Instant)>,
}

impl Lingering {
    /// The purges still lingering (those whose time is over forgotten).
    fn current(&mut self) -> (Vec<Selection>, Vec<Target>) {
        let now = Instant::now();
        self.purges.retain(|(_, _, until)| now < *until);
        self.purges.iter().map(|(s, t, _)| (s.clone(), *t)).unzip()
    }

    /// Keeps `selections` applied for [`LINGER`] to the fills dated before their second.
    fn add(&mut self, selections: Vec<Selection>, targets: &[Target]) {
        let until = Instant::now() + LINGER;
        let before = |t: &Target| Target {
            cutoff: t.cutoff - 1,
            ..*t
        };
        (self.purges).extend(
            selections
                .into_iter()
                .zip(targets)
                .map(|(s, t)| (s, before(t), until)),
        );
    }

    /// Sweeps what changed since the last walk or sweep with the purges lingering.
    fn sweep(&mut self, dir: &std::path::Path, memory: &mut scan::Memory) {
        let (selections, targets) = self.current();
        if selections.is_empty() {
            return;
        }
        let outcome = scan::sweep(dir, &Matcher::new(&selections), &targets, memory);
        if let Some(error) = outcome.first_error {
            eprintln!(
                "cdn-operator: nginx-metrics: sweeping the fills after a purge: {} cache files could not be read or written, first {error}",
                outcome.errors
            );
        }
    }
}

/// Applies `batch` to the cache at `dir`: one walk for all its purges (and those `lingering`,
/// whose walk may have missed a late fill in the folders this one reads), which `memory` spares
/// what is unchanged since the walk before.
fn apply(
    dir: &std::path::Path,
    batch: &Batch,
    cutoffs: &mut HashMap<String, (i64, Instant)>,
    memory: &mut scan::Memory,
    lingering: &mut Lingering,
) -> Result<Applied, String> {
    let started = Instant::now();
    let selections = batch
        .purges
        .iter()
        .map(|p| Selection::new(p).map_err(|e| format!("purge {}: {e}", p.id)))
        .collect::<Result<Vec<_>, _>>()?;
    let now = now();
    let targets: Vec<Target> = batch
        .purges
        .iter()
        .map(|p| {
            let (cutoff, _) = *cutoffs
                .entry(p.id.clone())
                .or_insert_with(|| (now, Instant::now()));
            Target {
                mode: p.mode,
                cutoff,
            }
        })
        .collect::<Vec<Target>>();
    // The batch's purges first: the counts are theirs.
    let (mut all_selections, mut all_targets) = (selections.clone(), targets.clone());
    let (lingering_selections, lingering_targets) = lingering.current();
    all_selections.extend(lingering_selections);
    all_targets.extend(lingering_targets);
    let mut outcome = scan::apply(
        dir,
        &Matcher::new(&all_selections),
        &all_targets,
        FILL_WAIT,
        memory,
    );
    outcome.invalidated.truncate(targets.len());
    lingering.add(selections, &targets);
    if let Some(error) = &outcome.first_error {
        // Files it could not read or write: the objects they hold may still be served.
        return Err(format!(
            "{} cache files could not be purged, first {error}",
            outcome.errors
        ));
    }
    Ok(Applied {
        invalidated: outcome.invalidated,
        scanned: outcome.scanned,
        recalled: outcome.recalled,
        fills_awaited: outcome.fills_awaited,
        fills_unchecked: outcome.fills_unchecked,
        millis: started.elapsed().as_millis() as u64,
    })
}

/// What the endpoint knows.
#[derive(Clone)]
pub struct Endpoint {
    /// The operator's public keys, as its ConfigMap publishes them.
    pub keys: PathBuf,
    /// `namespace/name` of the pod's CdnCluster.
    pub cluster: String,
    pub purger: Purger,
    /// Batches applied, until they expire: a replay is refused.
    seen: Arc<Mutex<HashMap<String, i64>>>,
}

impl Endpoint {
    pub fn new(keys: PathBuf, cluster: String, purger: Purger) -> Self {
        Endpoint {
            keys,
            cluster,
            purger,
            seen: Arc::default(),
        }
    }

    /// `POST /purge`.
    pub fn router(self) -> Router {
        Router::new()
            .route(wire::PURGE_PATH, post(purge))
            .layer(DefaultBodyLimit::max(BODY_LIMIT))
            .with_state(self)
    }

    /// The batch of `body` if `signature` is the operator's, it is meant for this pod's cluster,
    /// valid now and new.
    fn admit(&self, body: &[u8], signature: Option<&str>) -> Result<Batch, (StatusCode, String)> {
        let refused = |status: StatusCode, why: String| Err((status, why));
        let Some(signature) = signature.and_then(wire::parse_signature_header) else {
            return refused(
                StatusCode::UNAUTHORIZED,
                format!(
                    "no {} header of the form ed25519=<base64>",
                    wire::SIGNATURE_HEADER
                ),
            );
        };
        let keys = match std::fs::read_to_string(&self.keys) {
            Ok(text) => wire::parse_public_keys(&text),
            Err(error) => {
                return refused(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!(
                        "cannot read the operator's keys {}: {error}",
                        self.keys.display()
                    ),
                )
            }
        };
        if keys.is_empty() {
            return refused(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "no key in {}: the operator published none",
                    self.keys.display()
                ),
            );
        }
        let signed = keys.iter().any(|key| {
            ring::signature::UnparsedPublicKey::new(&ring::signature::ED25519, key)
                .verify(body, &signature)
                .is_ok()
        });
        if !signed {
            return refused(
                StatusCode::FORBIDDEN,
                "the signature is not the operator's (no published key verifies it)".into(),
            );
        }
        let batch: Batch = serde_json::from_slice(body)
            .map_err(|e| (StatusCode::BAD_REQUEST, format!("not a purge batch: {e}")))?;
        if let Some((purge, error)) = batch
            .purges
            .iter()
            .find_map(|p| Selection::new(p).err().map(|e| (&p.id, e)))
        {
            return refused(StatusCode::BAD_REQUEST, format!("purge {purge}: {error}"));
        }
        if batch.cluster != self.cluster {
            return refused(
                StatusCode::FORBIDDEN,
                format!(
                    "the batch is for {}, this pod is of {}",
                    batch.cluster, self.cluster
                ),
            );
        }
        let now = now();
        if now > batch.expires || batch.issued > now + wire::CLOCK_SKEW_SECONDS {
            return refused(
                StatusCode::FORBIDDEN,
                format!(
                    "the batch is valid from {} to {}, it is {now} here",
                    batch.issued, batch.expires
                ),
            );
        }
        let mut seen = self.seen.lock().expect("seen lock");
        seen.retain(|_, expires| *expires >= now);
        if seen.insert(batch.id.clone(), batch.expires).is_some() {
            return refused(
                StatusCode::CONFLICT,
                format!("the batch {} was applied already", batch.id),
            );
        }
        Ok(batch)
    }
}

async fn purge(State(endpoint): State<Endpoint>, headers: HeaderMap, body: Bytes) -> Response {
    let signature = headers
        .get(wire::SIGNATURE_HEADER)
        .and_then(|v| v.to_str().ok());
    let batch = match endpoint.admit(&body, signature) {
        Ok(batch) => batch,
        Err((status, why)) => return text(status, why),
    };
    let id = batch.id.clone();
    match endpoint.purger.apply(batch).await {
        Ok(applied) => {
            let body = serde_json::to_string(&applied).expect("serializes");
            (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "application/json")],
                body,
            )
                .into_response()
        }
        Err(why) => {
            eprintln!("cdn-operator: nginx-metrics: purge batch {id}: {why}");
            text(StatusCode::INTERNAL_SERVER_ERROR, why)
        }
    }
}

fn text(status: StatusCode, why: String) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        why + "\n",
    )
        .into_response()
}
