//! `cdn-operator nginx-metrics`: the sidecar of every CdnCluster pod that turns nginx's work into
//! Prometheus series (docs/cdn-metrics.md). Open-source nginx counts nothing by itself but its
//! connections, so nginx writes a line per request ([`log::FORMAT`]) to a file of the pod's temp
//! folder, buffered as its access log is; this program reads the file as it grows, adds the
//! lines up ([`series::Tally`]) and frees what it read (a hole punched in the file), and serves
//! the series on `/metrics`, with nginx's connections (`stub_status`, on a unix socket) and the
//! cache's filesystem read at each scrape.
//!
//! A buffered file, because nginx then never waits for this program and pays a write per 64 KiB
//! of lines, not per request (docs/adr/0004-cdn-metrics-from-a-buffered-log.md). Where the reading
//! stands is kept beside the file, so a restarted sidecar counts each line once. The series are
//! bounded: fixed labels, and at most [`series::MAX_SOURCES`] pools.

pub mod log;
pub mod purge;
pub mod ring;
pub mod series;

use crate::runtime::http::{self, Health};
use crate::runtime::shutdown::{self, Shutdown};
use series::{Identity, Series, StubStatus, Tally};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The port the sidecar serves `/metrics` (and `/healthz`) on: nginx-prometheus-exporter's.
pub const PORT: u16 = 9113;
/// The name of that port, which the PodMonitor scrapes.
pub const PORT_NAME: &str = "metrics";
/// The path of nginx's `stub_status` page on its status socket.
pub const STATUS_PATH: &str = "/stub_status";
/// How long a scrape waits for nginx's status page at most.
const STATUS_TIMEOUT: Duration = Duration::from_secs(2);
/// What is read of the log at once: nginx writes it 64 KiB at a time per worker.
const READ_SIZE: usize = 256 << 10;
/// How often the log is looked at when it has nothing new: nginx writes at least every second.
const POLL: Duration = Duration::from_millis(200);

#[derive(clap::Args, Debug, Clone)]
#[command(about = "Count nginx's requests from its metrics log and serve them on /metrics")]
pub struct Args {
    /// The file nginx writes its metrics log to (made, writable by the pod's other users: nginx
    /// may run as another one). Where its reading stands is kept beside it (`.offset`).
    #[arg(long, value_name = "PATH")]
    pub log: PathBuf,

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

    /// The operator's public keys (one `ed25519 <base64>` line each, from the CdnCluster's
    /// ConfigMap): with `--cache-dir`, purges signed by one of them are applied to the cache
    /// (`POST /purge`). Read at each purge, so a new key is taken without a restart.
    #[arg(long, value_name = "PATH", requires = "cache_dir")]
    pub purge_keys: Option<PathBuf>,

    /// The namespace of the pod's CdnCluster (POD_NAMESPACE, from the downward API): a purge
    /// batch names the cluster it is meant for.
    #[arg(long, env = "POD_NAMESPACE", default_value = "")]
    pub namespace: String,

    /// nginx's configuration: with `--resolver`, `/readyz` passes only once nginx holds every
    /// ready pod of the sources it looks up by SRV records ([`ring`]), then while nginx answers.
    #[arg(long, value_name = "PATH", requires = "resolver")]
    pub nginx_conf: Option<PathBuf>,

    /// The file naming nginx's resolver (`resolver ADDRESS valid=5s;`, written by the entrypoint).
    #[arg(long, value_name = "PATH", requires = "nginx_conf")]
    pub resolver: Option<PathBuf>,
}

/// The sidecar's niceness: below nginx's priority, so on a busy node nginx's workers get the CPU
/// first and the sidecar catches up on the log when they leave some (the log waits in its file).
/// Lowering one's own priority needs no privilege.
const NICENESS: i32 = 10;

pub fn main(args: Args) -> ExitCode {
    // Started before the priority is lowered: the thread keeps nginx's (see Purger).
    let purger = match (&args.cache_dir, &args.purge_keys) {
        (Some(dir), Some(_)) => match purge::Purger::start(dir.clone()) {
            Ok(purger) => Some(purger),
            Err(error) => return crate::fail(&format!("cannot start the purge thread: {error}")),
        },
        _ => None,
    };
    if let Err(error) = rustix::process::nice(NICENESS) {
        eprintln!("cdn-operator: nginx-metrics: cannot lower its priority: {error}");
    }
    let identity = Identity {
        cdncluster: args.cdncluster.clone(),
        role: args.role.clone(),
        cache_max_size_bytes: args.cache_max_size,
    };
    let series = Arc::new(Series::new(&identity));
    let log = match Log::open(&args.log) {
        Ok(log) => log,
        Err(error) => {
            return crate::fail(&format!(
                "cannot read nginx's log {}: {error}",
                args.log.display()
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
    runtime.block_on(serve(args, series, log, purger))
}

async fn serve(
    args: Args,
    series: Arc<Series>,
    log: Log,
    purger: Option<purge::Purger>,
) -> ExitCode {
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
            let error = log.follow(&tallied);
            eprintln!("cdn-operator: nginx-metrics: reading the log failed: {error}");
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
        args.log.display(),
        args.listen
    );
    if let (Some(conf), Some(resolver)) = (&args.nginx_conf, &args.resolver) {
        let flag = health.ready_if("sources");
        tokio::spawn(follow_sources(
            conf.clone(),
            resolver.clone(),
            args.nginx_status.clone(),
            flag,
        ));
    }
    let status = args.nginx_status.clone();
    let cache_dir = args.cache_dir.clone();
    let purges = match (purger, &args.purge_keys) {
        (Some(purger), Some(keys)) => {
            let cluster = format!("{}/{}", args.namespace, args.cdncluster);
            purge::Endpoint::new(keys.clone(), cluster, purger).router()
        }
        _ => axum::Router::new(),
    };
    let router =
        http::probes(health)
            .merge(purges)
            .merge(http::exposition(move |scrape_timeout| {
                let (series, status, cache_dir) =
                    (series.clone(), status.clone(), cache_dir.clone());
                async move {
                    let wait = status_wait(scrape_timeout);
                    series.observe_status(read_status(&status, wait).await.as_ref());
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

/// Passes `ready` once nginx holds every ready pod of its sources ([`ring::Watch`]), then while
/// nginx answers: looks every second, asking the cluster DNS only until ready.
async fn follow_sources(
    conf: PathBuf,
    resolver: PathBuf,
    status: PathBuf,
    ready: crate::runtime::http::ReadyFlag,
) {
    let mut watch = ring::Watch::default();
    let mut said: Option<bool> = None;
    loop {
        let up = read_status(&status, STATUS_TIMEOUT).await.is_some();
        watch.nginx(up, Instant::now());
        let verdict = if up && watch.is_ready() {
            Ok(())
        } else {
            look_up_sources(&mut watch, &conf, &resolver).await
        };
        ready.set(verdict.is_ok());
        if said != Some(verdict.is_ok()) {
            match &verdict {
                Ok(()) => eprintln!("cdn-operator: nginx-metrics: ready: nginx holds its sources"),
                Err(why) => eprintln!("cdn-operator: nginx-metrics: not ready: {why}"),
            }
            said = Some(verdict.is_ok());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Asks nginx's resolver what nginx asks it, the names read from its configuration each time (a
/// new one may name other sources), and judges with `watch` whether nginx holds the answers.
async fn look_up_sources(
    watch: &mut ring::Watch,
    conf: &Path,
    resolver: &Path,
) -> Result<(), String> {
    let names = std::fs::read_to_string(conf)
        .map(|text| ring::lookups(&text))
        .unwrap_or_default();
    let server = std::fs::read_to_string(resolver)
        .ok()
        .and_then(|text| ring::resolver(&text));
    let Some((server, valid)) = server else {
        if names.is_empty() {
            return watch.ready(&[], Duration::ZERO, Instant::now());
        }
        return Err(format!(
            "no resolver in {} to look the sources up with",
            resolver.display()
        ));
    };
    for name in &names {
        let answer = ring::srv(server, name).await;
        watch.answer(name, answer, Instant::now());
    }
    watch.ready(&names, valid, Instant::now())
}

/// nginx's metrics log, read from where the last reading stopped.
struct Log {
    file: File,
    /// Where the reading stands: a byte offset, written as 20 digits.
    offset_file: File,
    offset: u64,
    /// Whether what was read is freed: not on a filesystem that cannot punch holes.
    freeing: bool,
}

impl Log {
    /// The log at `path`, made if nginx has not yet (readable and writable by every user of the
    /// pod, for nginx's), and where its last reading stopped.
    fn open(path: &Path) -> io::Result<Log> {
        let open = |path: &Path| {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(path)?;
            // The mode asked at creation passes through the umask.
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))?;
            io::Result::Ok(file)
        };
        let file = open(path)?;
        let mut offset_path = path.as_os_str().to_owned();
        offset_path.push(".offset");
        let offset_file = open(Path::new(&offset_path))?;
        let mut saved = [0u8; 20];
        let read = offset_file.read_at(&mut saved, 0)?;
        let length = file.metadata()?.len();
        // A saved offset past the end is of another file: read it from its start.
        let offset = std::str::from_utf8(&saved[..read])
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
            .filter(|&o| o <= length)
            .unwrap_or(0);
        Ok(Log {
            file,
            offset_file,
            offset,
            freeing: true,
        })
    }

    /// Adds every complete line to the series as nginx writes them, until reading fails.
    fn follow(mut self, series: &Series) -> io::Error {
        let mut reader = Reader::new(series);
        loop {
            match self.read(&mut reader) {
                Ok(0) => std::thread::sleep(POLL),
                Ok(_) => {}
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => return error,
            }
        }
    }

    /// Adds the complete lines written since the last reading; the bytes read.
    fn read(&mut self, reader: &mut Reader) -> io::Result<usize> {
        let Reader {
            tally,
            buffer,
            pending,
        } = reader;
        let read = self
            .file
            .read_at(&mut buffer[*pending..], self.offset + *pending as u64)?;
        if read == 0 {
            return Ok(0);
        }
        let filled = *pending + read;
        let complete = match buffer[..filled].iter().rposition(|&b| b == b'\n') {
            Some(end) => end + 1,
            // A line longer than the buffer is no line of the format: skipped whole.
            None if filled == buffer.len() => filled,
            None => {
                *pending = filled;
                return Ok(read);
            }
        };
        for line in buffer[..complete].split(|&b| b == b'\n') {
            if !line.is_empty() {
                tally.add(line);
            }
        }
        buffer.copy_within(complete..filled, 0);
        *pending = filled - complete;
        self.consumed(complete as u64)?;
        Ok(read)
    }

    /// Moves the reading on by `bytes`: saved, then the bytes read freed.
    fn consumed(&mut self, bytes: u64) -> io::Result<()> {
        let from = self.offset;
        self.offset += bytes;
        self.offset_file
            .write_all_at(format!("{:020}", self.offset).as_bytes(), 0)?;
        if self.freeing {
            use rustix::fs::{fallocate, FallocateFlags};
            let punch = FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE;
            if let Err(error) = fallocate(&self.file, punch, from, bytes) {
                eprintln!(
                    "cdn-operator: nginx-metrics: cannot free what was read of the log ({error}): it grows"
                );
                self.freeing = false;
            }
        }
        Ok(())
    }
}

/// What reading the log keeps between two readings.
struct Reader<'a> {
    tally: Tally<'a>,
    buffer: Vec<u8>,
    /// The start of a line whose end is not written yet, at the buffer's start.
    pending: usize,
}

impl<'a> Reader<'a> {
    fn new(series: &'a Series) -> Reader<'a> {
        Reader {
            tally: Tally::new(series),
            buffer: vec![0u8; READ_SIZE],
            pending: 0,
        }
    }
}

/// How long a scrape waits for nginx's status: [`STATUS_TIMEOUT`], or half the scrape's own
/// timeout when that is shorter, so a hung nginx is reported (`cdn_nginx_up 0`) rather than the
/// whole scrape failing (no series, and no alert).
fn status_wait(scrape_timeout: Option<Duration>) -> Duration {
    scrape_timeout.map_or(STATUS_TIMEOUT, |t| STATUS_TIMEOUT.min(t / 2))
}

/// nginx's status page, from its unix socket; `None` when nginx does not answer it within `wait`.
async fn read_status(socket: &Path, wait: Duration) -> Option<StubStatus> {
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
    tokio::time::timeout(wait, exchange).await.ok().flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::MetadataExt;

    fn requests(series: &Series) -> f64 {
        let text = crate::runtime::metrics::to_prometheus_text(&series.encode());
        text.lines()
            .filter(|l| l.starts_with("cdn_requests_total{"))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum()
    }

    /// A hung nginx (its status socket accepts and never answers) is reported within half the
    /// scrape's timeout, so the scrape itself succeeds and says nginx is down.
    #[tokio::test]
    async fn a_hung_nginx_is_given_up_on_within_the_scrape_s_timeout() {
        assert_eq!(status_wait(None), STATUS_TIMEOUT);
        assert_eq!(status_wait(Some(Duration::from_secs(10))), STATUS_TIMEOUT);
        assert_eq!(
            status_wait(Some(Duration::from_millis(1500))),
            Duration::from_millis(750)
        );
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("status.sock");
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        let held = tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            std::future::pending::<()>().await;
            drop(stream);
        });
        let started = Instant::now();
        let wait = status_wait(Some(Duration::from_millis(400)));
        assert!(read_status(&socket, wait).await.is_none());
        let took = started.elapsed();
        assert!(
            took >= wait && took < Duration::from_millis(400),
            "{took:?}"
        );
        held.abort();
    }

    #[test]
    fn the_log_is_read_line_by_line_freed_and_resumed_where_it_stopped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cdn-metrics.log");
        let identity = Identity {
            cdncluster: "edge".into(),
            role: "balancer".into(),
            cache_max_size_bytes: None,
        };
        let line = "84\t200\t-\t1100\t200\t0.001\t0.001\t1000\tcdncluster cache\n";
        let mut log = Log::open(&path).unwrap();
        assert_eq!(
            std::fs::metadata(&path).unwrap().mode() & 0o777,
            0o666,
            "nginx's user writes it"
        );
        let mut writer = OpenOptions::new().append(true).open(&path).unwrap();
        // 2,000 lines (about 100 KiB, blocks of the filesystem), and the start of one more.
        writer.write_all(line.repeat(2_000).as_bytes()).unwrap();
        writer.write_all(&line.as_bytes()[..10]).unwrap();
        let written = std::fs::metadata(&path).unwrap();
        let series = Series::new(&identity);
        let mut reader = Reader::new(&series);
        while log.read(&mut reader).unwrap() > 0 {}
        assert_eq!(requests(&series), 2_000.0);
        let read = std::fs::metadata(&path).unwrap();
        assert_eq!(read.len(), written.len(), "the file keeps its size");
        assert!(
            read.blocks() < written.blocks() / 4,
            "what was read is freed: {} blocks, {} before",
            read.blocks(),
            written.blocks()
        );
        // A restarted sidecar: the line begun is read once written whole, no line twice.
        drop(log);
        let mut log = Log::open(&path).unwrap();
        writer.write_all(&line.as_bytes()[10..]).unwrap();
        writer.write_all(line.as_bytes()).unwrap();
        let series = Series::new(&identity);
        let mut reader = Reader::new(&series);
        while log.read(&mut reader).unwrap() > 0 {}
        assert_eq!(requests(&series), 2.0);
    }
}
