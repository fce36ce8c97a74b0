//! A client like wrk for the node tests: keep-alive connections, each on a thread of its own,
//! asking objects in a scattered order and retrying nothing; what they saw, counted by kind of
//! failure. Stands alone.

use super::origin::ORIGIN_BIG_BYTES;
use cdn_operator::cdncluster::nginx::CACHE_STATUS_HEADER;
use cdn_operator_testkit::KeepAlive;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the client saw, summed over its connections.
#[derive(Default)]
pub struct Counters {
    pub requests: AtomicUsize,
    /// An answer other than 200 with the whole object.
    pub failed_status: AtomicUsize,
    /// A request sent and not answered: the connection closed or reset under it.
    pub cut: AtomicUsize,
    /// A new connection refused (no request sent, but wrk counts it as an error too).
    pub refused: AtomicUsize,
    /// The first failures, to show what they were.
    pub samples: Mutex<Vec<String>>,
}

impl Counters {
    fn failed(&self, counter: &AtomicUsize, what: String) {
        counter.fetch_add(1, Ordering::Relaxed);
        let mut samples = self.samples.lock().unwrap();
        if samples.len() < 20 {
            samples.push(what);
        }
    }
}

/// The counters and the origin's count at one moment.
#[derive(Clone, Copy, Debug, Default)]
pub struct Snapshot {
    pub requests: usize,
    pub failed_status: usize,
    pub cut: usize,
    pub refused: usize,
    pub origin: usize,
}

impl Snapshot {
    pub fn since(&self, before: &Snapshot) -> Snapshot {
        Snapshot {
            requests: self.requests - before.requests,
            failed_status: self.failed_status - before.failed_status,
            cut: self.cut - before.cut,
            refused: self.refused - before.refused,
            origin: self.origin - before.origin,
        }
    }

    pub fn failed(&self) -> usize {
        self.failed_status + self.cut + self.refused
    }
}

/// The client: its connections asking until stopped, and what they saw.
pub struct Load {
    pub counters: Arc<Counters>,
    stop: Arc<AtomicBool>,
    connections: Vec<std::thread::JoinHandle<()>>,
}

impl Load {
    /// `connections` [`connection`]s to `edge` (as `host`), asking `paths` without pause.
    pub fn start(
        edge: SocketAddr,
        host: &'static str,
        paths: Vec<String>,
        connections: usize,
    ) -> Load {
        let (counters, stop) = (
            Arc::new(Counters::default()),
            Arc::new(AtomicBool::new(false)),
        );
        let paths = Arc::new(paths);
        let connections = (0..connections)
            .map(|seed| {
                connection(
                    edge,
                    host,
                    paths.clone(),
                    counters.clone(),
                    stop.clone(),
                    seed,
                )
            })
            .collect();
        Load {
            counters,
            stop,
            connections,
        }
    }

    /// Stops the connections once their requests in flight are answered.
    pub async fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        for c in self.connections {
            tokio::task::spawn_blocking(move || c.join().unwrap())
                .await
                .unwrap();
        }
    }
}

/// One connection of the client: GETs the objects in a scattered order until `stop`.
fn connection(
    edge: SocketAddr,
    host: &'static str,
    paths: Arc<Vec<String>>,
    counters: Arc<Counters>,
    stop: Arc<AtomicBool>,
    seed: usize,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut c = KeepAlive::without_retry(edge, host);
        let mut i = seed;
        while !stop.load(Ordering::Relaxed) {
            i = (i + 7 + seed * 2) % paths.len();
            let path = &paths[i];
            let kept = c.connected();
            match c.get(path, &[]) {
                Ok(r) if r.status == 200 && r.body.len() == ORIGIN_BIG_BYTES => {}
                Ok(r) => counters.failed(
                    &counters.failed_status,
                    format!(
                        "GET {path}: {} ({:?}, {} bytes)",
                        r.status,
                        r.header(CACHE_STATUS_HEADER),
                        r.body.len()
                    ),
                ),
                Err(e) if !kept && e.kind() == std::io::ErrorKind::ConnectionRefused => {
                    counters.failed(&counters.refused, format!("GET {path}: {e}"));
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => counters.failed(
                    &counters.cut,
                    format!("GET {path}: {e} (on a kept connection: {kept})"),
                ),
            }
            counters.requests.fetch_add(1, Ordering::Relaxed);
        }
    })
}
