//! `cdn-operator nginx-metrics`: the sidecar of every CdnCluster pod that turns nginx's work into
//! Prometheus series (docs/cdn-metrics.md). Open-source nginx counts nothing by itself but its
//! connections, so nginx sends a line per request to this program ([`log::FORMAT`]), a syslog
//! datagram on a unix socket, which it adds up ([`series::Tally`]) and serves on `/metrics`,
//! with nginx's connections (`stub_status`, on a unix socket too) and the cache's filesystem
//! read at each scrape.
//!
//! Datagrams, because nginx never waits for them: its socket does not block, and a line the
//! kernel cannot queue (this program gone or far behind) is dropped, not the request held. The
//! series are bounded: fixed labels, and at most [`series::MAX_SOURCES`] pools.

pub mod log;
pub mod series;

use crate::runtime::http::{self, Health};
use crate::runtime::shutdown::{self, Shutdown};
use series::{Identity, Series, StubStatus, Tally};
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

/// The port the sidecar serves `/metrics` (and `/healthz`) on: nginx-prometheus-exporter's.
pub const PORT: u16 = 9113;
/// The name of that port, which the PodMonitor scrapes.
pub const PORT_NAME: &str = "metrics";
/// The path of nginx's `stub_status` page on its status socket.
pub const STATUS_PATH: &str = "/stub_status";
/// How long a scrape waits for nginx's status page.
const STATUS_TIMEOUT: Duration = Duration::from_secs(2);
/// The largest datagram read: nginx's syslog lines are at most a few KiB.
const DATAGRAM_MAX: usize = 64 << 10;

#[derive(clap::Args, Debug, Clone)]
#[command(about = "Count nginx's requests from its metrics log and serve them on /metrics")]
pub struct Args {
    /// The unix datagram socket nginx sends its metrics log to (made, and left writable by the
    /// pod's other users: nginx may run as another one).
    #[arg(long, value_name = "PATH")]
    pub socket: PathBuf,

    /// The unix socket nginx serves its `stub_status` page on.
    #[arg(long, value_name = "PATH")]
    pub nginx_status: PathBuf,

    /// The address `/metrics` is served on: `:9113`, `127.0.0.1:9113`, `[::]:9113`.
    #[arg(long, default_value = ":9113")]
    pub listen: String,

    /// The CdnCluster of the pod: the `cdncluster` label of every series.
    #[arg(long)]
    pub cdncluster: String,

    /// The role of the CdnCluster: the `role` label of every series.
    #[arg(long, value_parser = ["balancer", "cache"])]
    pub role: String,

    /// The folder of the cache, whose filesystem is measured at each scrape (caches only).
    #[arg(long, value_name = "PATH", requires = "cache_max_size")]
    pub cache_dir: Option<PathBuf>,

    /// The cache's max_size, in bytes (caches only).
    #[arg(long, value_name = "BYTES")]
    pub cache_max_size: Option<u64>,
}

pub fn main(args: Args) -> ExitCode {
    let identity = Identity {
        cdncluster: args.cdncluster.clone(),
        role: args.role.clone(),
        cache_max_size_bytes: args.cache_max_size,
    };
    let series = Arc::new(Series::new(&identity));
    let socket = match bind(&args.socket) {
        Ok(socket) => socket,
        Err(error) => {
            return crate::fail(&format!(
                "cannot receive nginx's log on {}: {error}",
                args.socket.display()
            ))
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => return crate::fail(&format!("cannot start: {error}")),
    };
    runtime.block_on(serve(args, series, socket))
}

async fn serve(args: Args, series: Arc<Series>, socket: UnixDatagram) -> ExitCode {
    let stop = Shutdown::new();
    if let Err(error) = shutdown::on_signals(&stop) {
        return crate::fail(&format!("cannot handle signals: {error}"));
    }
    let health = Health::default();
    let receiving = health.alive_while("log");
    let tallied = series.clone();
    std::thread::Builder::new()
        .name("log".into())
        .spawn(move || {
            let error = receive(&socket, &tallied);
            eprintln!("cdn-operator: nginx-metrics: the log socket failed: {error}");
            drop(receiving);
        })
        .expect("a thread starts");
    let listener = match http::bind("listen", &args.listen).await {
        Ok(Some(listener)) => listener,
        Ok(None) => return crate::fail("--listen: 0: the series must be served"),
        Err(error) => return crate::fail(&error.to_string()),
    };
    eprintln!(
        "cdn-operator: nginx-metrics: counting the log of {} on {}, serving /metrics on {}",
        args.role,
        args.socket.display(),
        args.listen
    );
    let status = args.nginx_status.clone();
    let cache_dir = args.cache_dir.clone();
    let router = http::probes(health).merge(http::exposition(move || {
        let (series, status, cache_dir) = (series.clone(), status.clone(), cache_dir.clone());
        async move {
            series.observe_status(read_status(&status).await.as_ref());
            if let Some(dir) = &cache_dir {
                if let Ok(fs) = rustix::fs::statvfs(dir) {
                    series.observe_filesystem(
                        fs.f_blocks.saturating_mul(fs.f_frsize),
                        fs.f_bavail.saturating_mul(fs.f_frsize),
                    );
                }
            }
            series.encode()
        }
    }));
    match http::serve(listener, router, stop.cancelled_owned()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => crate::fail(&format!("serving /metrics: {error}")),
    }
}

/// The log's socket, made anew (one left by an earlier run is removed) and writable by every
/// user of the pod: nginx's workers run as the image's user, this program as its own.
fn bind(path: &Path) -> io::Result<UnixDatagram> {
    match std::fs::remove_file(path) {
        Err(error) if error.kind() != io::ErrorKind::NotFound => return Err(error),
        _ => {}
    }
    let socket = UnixDatagram::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))?;
    Ok(socket)
}

/// Adds every datagram to the series, until the socket fails.
fn receive(socket: &UnixDatagram, series: &Series) -> io::Error {
    let mut tally = Tally::new(series);
    let mut buffer = vec![0u8; DATAGRAM_MAX];
    loop {
        match socket.recv(&mut buffer) {
            Ok(n) => tally.add(&buffer[..n]),
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return error,
        }
    }
}

/// nginx's status page, from its unix socket; `None` when nginx does not answer it in time.
async fn read_status(socket: &Path) -> Option<StubStatus> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let mut stream = tokio::net::UnixStream::connect(socket).await.ok()?;
        let request = format!("GET {STATUS_PATH} HTTP/1.0\r\nHost: localhost\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        // HTTP/1.0: nginx closes the connection after the page.
        let mut response = String::new();
        stream.read_to_string(&mut response).await.ok()?;
        let (head, body) = response.split_once("\r\n\r\n")?;
        (head.split(' ').nth(1) == Some("200")).then_some(())?;
        StubStatus::parse(body)
    };
    tokio::time::timeout(STATUS_TIMEOUT, exchange)
        .await
        .ok()
        .flatten()
}
