//! A counting proxy between the operator and the API server, for the benchmark: every request it
//! sends is counted here, by verb and resource, on its way through, and each write timed from its
//! forwarding to the server's answer. The operator counts its requests itself too
//! (`rest_client_requests_total`), which the benchmark reads and checks against this count; the
//! proxy still gives what that metric does not: each write's answer time and when it was
//! forwarded (the spec-change path), when the operator went quiet, and the counts and times of
//! the bare-client baseline, which no operator counts.
//! It listens on plain HTTP on loopback and forwards through a kube
//! client holding the caller's credentials (the same client stack the operator uses), streaming
//! responses so watches work unchanged.

use http::header::{CONNECTION, CONTENT_LENGTH, HOST, TRANSFER_ENCODING};
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use kube::client::Body;
use kube::Client;
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;

/// Requests seen, by "VERB resource" (verbs as the API server's audit names them: get, list,
/// watch, create, patch, update, delete).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counts(pub BTreeMap<String, u64>);

impl Counts {
    pub fn requests(&self) -> u64 {
        self.0.values().sum()
    }

    /// Requests that change state: create, patch, update, delete.
    pub fn writes(&self) -> u64 {
        self.0
            .iter()
            .filter(|(key, _)| is_write(key))
            .map(|(_, n)| n)
            .sum()
    }

    /// The requests that change state alone, by verb and resource.
    pub fn only_writes(&self) -> Counts {
        Counts(
            self.0
                .iter()
                .filter(|(key, _)| is_write(key))
                .map(|(k, n)| (k.clone(), *n))
                .collect(),
        )
    }

    /// What happened between `before` and `self`.
    pub fn since(&self, before: &Counts) -> Counts {
        Counts(
            self.0
                .iter()
                .map(|(k, n)| (k.clone(), n - before.0.get(k).copied().unwrap_or(0)))
                .filter(|(_, n)| *n > 0)
                .collect(),
        )
    }
}

/// Whether a request, by its [`classify`] key, changes state.
fn is_write(key: &str) -> bool {
    let verb = key.split(' ').next().unwrap_or("");
    matches!(verb, "create" | "patch" | "update" | "delete")
}

/// What the proxy records of the requests through it.
#[derive(Default)]
struct Seen {
    counts: Counts,
    /// Each write's time from forwarding to the server's response headers, in microseconds, in
    /// the order answered: whether a slow phase was the server's answers or the client's pace.
    write_micros: Vec<u32>,
    /// Each write with its path and times, once [`Proxy::log_writes`] turned it on (not while
    /// converging: it would hold one path per write).
    logged: Option<Vec<LoggedWrite>>,
}

/// A write as the proxy forwarded it: when, to which path, and how long the server took.
#[derive(Clone, Debug, PartialEq)]
pub struct LoggedWrite {
    pub path: String,
    pub forwarded: Instant,
    pub answer: Duration,
}

/// The first write to `path` forwarded at or after `since`.
fn first_write_to<'a>(
    log: &'a [LoggedWrite],
    path: &str,
    since: Instant,
) -> Option<&'a LoggedWrite> {
    log.iter()
        .find(|write| write.forwarded >= since && write.path == path)
}

pub struct Proxy {
    pub addr: SocketAddr,
    seen: Arc<Mutex<Seen>>,
    task: JoinHandle<()>,
}

impl Proxy {
    pub async fn start(client: Client) -> std::io::Result<Proxy> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let seen = Arc::new(Mutex::new(Seen::default()));
        let shared = seen.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let client = client.clone();
                let seen = shared.clone();
                let service =
                    service_fn(move |request| forward(client.clone(), seen.clone(), request));
                tokio::spawn(async move {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(Proxy { addr, seen, task })
    }

    pub fn counts(&self) -> Counts {
        self.lock().counts.clone()
    }

    /// How many writes have been answered so far: a mark for [`Proxy::write_times_since`].
    pub fn writes_answered(&self) -> usize {
        self.lock().write_micros.len()
    }

    /// The answer times of the writes answered since `mark`, in the order answered.
    pub fn write_times_since(&self, mark: usize) -> Vec<Duration> {
        let seen = self.lock();
        let since = seen.write_micros.get(mark..).unwrap_or_default();
        since
            .iter()
            .map(|&us| Duration::from_micros(us.into()))
            .collect()
    }

    /// From now on, logs each write with its path and times, for [`Proxy::first_write_to`].
    pub fn log_writes(&self) {
        self.lock().logged.get_or_insert_with(Vec::new);
    }

    /// The first logged write to `path` (without its query) forwarded at or after `since`.
    pub fn first_write_to(&self, path: &str, since: Instant) -> Option<LoggedWrite> {
        let seen = self.lock();
        first_write_to(seen.logged.as_deref().unwrap_or_default(), path, since).cloned()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen.lock().expect("proxy lock")
    }

    /// A kubeconfig that sends a client through this proxy (no credentials: the proxy holds them).
    pub fn kubeconfig(&self, dir: &Path) -> PathBuf {
        let path = dir.join("proxy.kubeconfig");
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: proxy\n  cluster:\n    server: http://{}\nusers:\n- name: proxy\n  user: {{}}\ncontexts:\n- name: proxy\n  context:\n    cluster: proxy\n    user: proxy\ncurrent-context: proxy\n",
            self.addr
        );
        std::fs::write(&path, text).expect("writing the proxy kubeconfig");
        path
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The audit-style key of a request: "verb resource[/subresource]", as the operator's
/// `rest_client_requests_total` names it.
pub fn classify(method: &http::Method, path: &str, query: Option<&str>) -> String {
    let (verb, resource) = cdn_operator::runtime::client_metrics::classify(method, path, query);
    format!("{verb} {resource}")
}

async fn forward(
    client: Client,
    seen: Arc<Mutex<Seen>>,
    request: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let (parts, body) = request.into_parts();
    let key = classify(&parts.method, parts.uri.path(), parts.uri.query());
    let write = is_write(&key);
    *seen
        .lock()
        .expect("proxy lock")
        .counts
        .0
        .entry(key)
        .or_insert(0) += 1;
    let bytes = match body.collect().await {
        Ok(collected) => collected.to_bytes().to_vec(),
        Err(error) => return Ok(failure(StatusCode::BAD_REQUEST, error.to_string())),
    };
    let target = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".into());
    let mut builder = Request::builder().method(parts.method).uri(target);
    for (name, value) in &parts.headers {
        // Hop-by-hop and framing headers belong to each connection; the client sets its own.
        if name != HOST && name != CONNECTION && name != CONTENT_LENGTH && name != TRANSFER_ENCODING
        {
            builder = builder.header(name, value);
        }
    }
    let forwarded = match builder.body(Body::from(bytes)) {
        Ok(request) => request,
        Err(error) => return Ok(failure(StatusCode::BAD_REQUEST, error.to_string())),
    };
    let sent = Instant::now();
    let answer = client.send(forwarded).await;
    if write {
        let answer = sent.elapsed();
        let micros = u32::try_from(answer.as_micros()).unwrap_or(u32::MAX);
        let mut seen = seen.lock().expect("proxy lock");
        seen.write_micros.push(micros);
        if let Some(log) = &mut seen.logged {
            log.push(LoggedWrite {
                path: parts.uri.path().to_owned(),
                forwarded: sent,
                answer,
            });
        }
    }
    match answer {
        Ok(mut response) => {
            let headers = response.headers_mut();
            headers.remove(CONNECTION);
            headers.remove(TRANSFER_ENCODING);
            Ok(response)
        }
        Err(error) => Ok(failure(StatusCode::BAD_GATEWAY, error.to_string())),
    }
}

fn failure(code: StatusCode, message: String) -> Response<Body> {
    let mut response = Response::new(Body::from(message.into_bytes()));
    *response.status_mut() = code;
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_write_to_a_path_is_the_first_forwarded_since_the_mark() {
        let start = Instant::now();
        let write = |path: &str, after_ms: u64| LoggedWrite {
            path: path.to_string(),
            forwarded: start + Duration::from_millis(after_ms),
            answer: Duration::from_millis(after_ms + 1),
        };
        let (cm, other) = (
            "/api/v1/namespaces/a/configmaps/b-nginx",
            "/api/v1/namespaces/a/services/b",
        );
        let log = [write(cm, 1), write(other, 5), write(cm, 7), write(cm, 9)];
        let since = start + Duration::from_millis(2);
        assert_eq!(first_write_to(&log, cm, since), Some(&log[2]));
        assert_eq!(first_write_to(&log, other, since), Some(&log[1]));
        assert_eq!(
            first_write_to(&log, other, start + Duration::from_millis(6)),
            None
        );
        assert_eq!(
            first_write_to(&log, "/api/v1/namespaces/a/configmaps/c", start),
            None
        );
    }

    #[test]
    fn writes_are_the_mutating_verbs() {
        let counts = Counts(
            [
                ("patch configmaps", 3),
                ("create events", 2),
                ("watch configmaps", 1),
                ("list pods", 4),
            ]
            .into_iter()
            .map(|(k, n)| (k.to_string(), n))
            .collect(),
        );
        assert_eq!((counts.requests(), counts.writes()), (10, 5));
        let writes = counts.only_writes();
        let keys: Vec<&str> = writes.0.keys().map(String::as_str).collect();
        assert_eq!(keys, ["create events", "patch configmaps"]);
        let before = Counts([("patch configmaps".to_string(), 1)].into_iter().collect());
        assert_eq!(counts.since(&before).0.get("patch configmaps"), Some(&2));
    }
}
