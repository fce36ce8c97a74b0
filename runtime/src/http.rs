//! The HTTP endpoints: probes (`/healthz`, `/readyz`) and `/metrics`, each server on its own
//! address so the metrics port can be exposed (or protected) separately from the kubelet's
//! probes: the probes stay plain HTTP, `/metrics` is served over HTTPS ([`serve_tls`]) behind
//! [`super::access`] unless turned off. Checks are named and registered by the glue; this module
//! knows no controller.

use super::metrics::{self as exposition, Metrics};
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Named liveness and readiness checks.
#[derive(Clone, Default)]
pub struct Health {
    live: Arc<Mutex<BTreeMap<String, Arc<AtomicBool>>>>,
    ready: Arc<Mutex<BTreeMap<String, Arc<AtomicBool>>>>,
}

impl Health {
    /// A readiness check `name`, failing until `until` completes (e.g. caches synced). Spawns a
    /// task: call inside a Tokio runtime.
    pub fn ready_when(&self, name: &str, until: impl Future<Output = ()> + Send + 'static) {
        let flag = register(&self.ready, name);
        tokio::spawn(async move {
            until.await;
            flag.store(true, Ordering::SeqCst);
        });
    }

    /// A liveness check `name`, passing while the returned guard lives. Hold it in the loop it
    /// vouches for: when the loop ends (or panics) the guard drops and `/healthz` fails.
    pub fn alive_while(&self, name: &str) -> AliveGuard {
        let flag = register(&self.live, name);
        flag.store(true, Ordering::SeqCst);
        AliveGuard(flag)
    }

    /// A readiness check `name` that its holder passes and fails as it goes (failing until first
    /// set), for a readiness that can be lost.
    pub fn ready_if(&self, name: &str) -> ReadyFlag {
        ReadyFlag(register(&self.ready, name))
    }

    pub fn is_ready(&self) -> bool {
        report(&self.ready).0
    }
}

/// A readiness check set by its holder ([`Health::ready_if`]).
pub struct ReadyFlag(Arc<AtomicBool>);

impl ReadyFlag {
    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::SeqCst);
    }
}

fn register(checks: &Mutex<BTreeMap<String, Arc<AtomicBool>>>, name: &str) -> Arc<AtomicBool> {
    let flag = Arc::new(AtomicBool::new(false));
    checks
        .lock()
        .expect("health lock")
        .insert(name.to_string(), flag.clone());
    flag
}

/// Whether every check passes, and a Kubernetes-style report (`[+]name ok` / `[-]name failed`).
fn report(checks: &Mutex<BTreeMap<String, Arc<AtomicBool>>>) -> (bool, String) {
    let checks = checks.lock().expect("health lock");
    let mut ok = true;
    let mut text = String::new();
    for (name, flag) in checks.iter() {
        if flag.load(Ordering::SeqCst) {
            text.push_str(&format!("[+]{name} ok\n"));
        } else {
            ok = false;
            text.push_str(&format!("[-]{name} failed\n"));
        }
    }
    text.push_str(if ok { "ok\n" } else { "not ok\n" });
    (ok, text)
}

/// Marks a liveness check failed when dropped.
pub struct AliveGuard(Arc<AtomicBool>);

impl Drop for AliveGuard {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

/// `/healthz` and `/readyz`.
pub fn probes(health: Health) -> Router {
    Router::new()
        .route(
            "/healthz",
            get(|State(h): State<Health>| async move { answer(report(&h.live)) }),
        )
        .route(
            "/readyz",
            get(|State(h): State<Health>| async move { answer(report(&h.ready)) }),
        )
        .with_state(health)
}

fn answer((ok, text): (bool, String)) -> Response {
    let status = if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        text,
    )
        .into_response()
}

/// `/metrics` of the operator's [`Metrics`].
pub fn metrics(metrics: Arc<Metrics>) -> Router {
    exposition(move |_| {
        let metrics = metrics.clone();
        async move { metrics.encode() }
    })
}

/// The header in which Prometheus tells each scrape's timeout, in seconds.
pub const SCRAPE_TIMEOUT_HEADER: &str = "x-prometheus-scrape-timeout-seconds";

/// `/metrics` serving the OpenMetrics text `encode` makes at each scrape: as it is when the
/// scraper asks for it (Prometheus does), else in the classic Prometheus text format. `encode`
/// gets the scrape's timeout when the scraper tells it ([`SCRAPE_TIMEOUT_HEADER`]), to answer
/// within it.
pub fn exposition<F, Made>(encode: F) -> Router
where
    F: Fn(Option<Duration>) -> Made + Clone + Send + Sync + 'static,
    Made: Future<Output = String> + Send + 'static,
{
    Router::new().route(
        "/metrics",
        get(move |headers: axum::http::HeaderMap| async move {
            let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
            let timeout = headers
                .get(SCRAPE_TIMEOUT_HEADER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<f64>().ok())
                .and_then(|s| Duration::try_from_secs_f64(s).ok());
            let (content_type, body) = exposition::negotiate(encode(timeout).await, accept);
            ([(header::CONTENT_TYPE, content_type)], body).into_response()
        }),
    )
}

/// Serves `router` on `listener` until `stop` completes, then finishes the requests under way.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    stop: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router)
        .with_graceful_shutdown(stop)
        .await
}

/// Serves `router` over TLS (HTTP/1.1) on `listener` until `stop` completes, then gives the
/// requests under way a few seconds.
pub async fn serve_tls(
    listener: tokio::net::TcpListener,
    router: Router,
    tls: axum_server::tls_rustls::RustlsConfig,
    stop: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let handle = axum_server::Handle::new();
    let stopping = handle.clone();
    tokio::spawn(async move {
        stop.await;
        stopping.graceful_shutdown(Some(std::time::Duration::from_secs(5)));
    });
    axum_server::from_tcp_rustls(listener.into_std()?, tls)?
        .http1_only()
        .handle(handle)
        .serve(router.into_make_service())
        .await
}

/// A listen address written as kubebuilder does: `:8080` (every interface), `127.0.0.1:8080`,
/// `[::]:8080`; `0` disables the server.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a listen address like :8080, 127.0.0.1:8080 or [::]:8080 (0 disables)")]
pub struct AddressError(pub String);

/// Why a listen address flag cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error("--{flag}: {source}")]
    Address {
        flag: String,
        #[source]
        source: AddressError,
    },
    #[error("--{flag}: cannot listen on {address}: {source}")]
    Listen {
        flag: String,
        address: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// Binds the listen address `value` of the flag `flag` (see [`AddressError`]); None for `0`.
pub async fn bind(flag: &str, value: &str) -> Result<Option<tokio::net::TcpListener>, BindError> {
    let parsed = parse_address(value).map_err(|source| BindError::Address {
        flag: flag.into(),
        source,
    })?;
    let Some(address) = parsed else {
        return Ok(None);
    };
    tokio::net::TcpListener::bind(address)
        .await
        .map(Some)
        .map_err(|source| BindError::Listen {
            flag: flag.into(),
            address,
            source,
        })
}

/// Parses a listen address (see [`AddressError`]).
pub fn parse_address(value: &str) -> Result<Option<SocketAddr>, AddressError> {
    let value = value.trim();
    if value == "0" {
        return Ok(None);
    }
    let full = match value.strip_prefix(':') {
        Some(port) => format!("0.0.0.0:{port}"),
        None => value.to_string(),
    };
    full.parse::<SocketAddr>()
        .map(Some)
        .map_err(|_| AddressError(value.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse_like_kubebuilder_flags() {
        assert_eq!(
            parse_address(":8080"),
            Ok(Some("0.0.0.0:8080".parse().unwrap()))
        );
        assert_eq!(
            parse_address("127.0.0.1:9"),
            Ok(Some("127.0.0.1:9".parse().unwrap()))
        );
        assert_eq!(
            parse_address("[::]:8081"),
            Ok(Some("[::]:8081".parse().unwrap()))
        );
        assert_eq!(parse_address("0"), Ok(None));
        assert!(parse_address("8080")
            .unwrap_err()
            .to_string()
            .contains("not a listen address"));
        assert!(parse_address(":http").is_err());
        assert!(parse_address("").is_err());
    }

    /// Prometheus tells each scrape's timeout in a header: the exposition hands it to `encode`.
    #[tokio::test]
    async fn the_scrape_timeout_prometheus_sends_reaches_the_encoder() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let router = exposition(|timeout: Option<Duration>| async move { format!("{timeout:?}") });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(serve(listener, router, std::future::pending()));
        for (header, seen) in [
            ("X-Prometheus-Scrape-Timeout-Seconds: 1.5\r\n", "Some(1.5s)"),
            ("", "None"),
        ] {
            let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
            let request = format!("GET /metrics HTTP/1.0\r\n{header}\r\n");
            stream.write_all(request.as_bytes()).await.unwrap();
            let mut response = String::new();
            stream.read_to_string(&mut response).await.unwrap();
            let body = response.split_once("\r\n\r\n").map(|(_, b)| b.trim());
            assert_eq!(body, Some(seen), "{header:?}: {response}");
        }
    }

    #[tokio::test]
    async fn a_busy_port_is_a_clear_error() {
        let taken = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = taken.local_addr().unwrap().to_string();
        let error = bind("metrics-bind-address", &address)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with("--metrics-bind-address: cannot listen on"),
            "{error}"
        );
        assert!(bind("x", "0").await.unwrap().is_none());
    }

    #[tokio::test]
    async fn reports_list_every_check() {
        let health = Health::default();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        health.ready_when("cache", async move {
            let _ = rx.await;
        });
        health.ready_when("other", async {});
        tokio::task::yield_now().await;
        let (ok, text) = report(&health.ready);
        assert!(!ok);
        assert_eq!(text, "[-]cache failed\n[+]other ok\nnot ok\n");
        tx.send(()).unwrap();
        for _ in 0..100 {
            if health.is_ready() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        assert_eq!(
            report(&health.ready),
            (true, "[+]cache ok\n[+]other ok\nok\n".into())
        );

        let guard = health.alive_while("loop");
        assert!(report(&health.live).0);
        drop(guard);
        assert_eq!(
            report(&health.live),
            (false, "[-]loop failed\nnot ok\n".into())
        );
    }
}
