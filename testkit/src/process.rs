//! The operator process under test (or what stands in for it): started from a prepared
//! command, its output captured, signalled, waited for, scraped, and killed when dropped.

use crate::http::{http_get, Reply};
use crate::metrics::metric_sum;
use crate::wait::{blocking, poll};
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub use libc::{SIGINT, SIGKILL, SIGQUIT, SIGTERM};

/// A signal number, as kill(2) takes it.
pub type Signal = libc::c_int;

/// What the process wrote, line by line.
#[derive(Default)]
struct Output {
    stdout: String,
    stderr: String,
    /// Both, in the order the lines arrived (as a shared log file would hold them).
    both: String,
}

/// A running process; killed when dropped.
pub struct Operator {
    /// Its name in messages (and its POD_NAME in the end-to-end suite).
    pub identity: String,
    child: Child,
    /// Where it serves probes and metrics, once known.
    pub probes: u16,
    pub metrics: u16,
    output: Arc<Mutex<Output>>,
    readers: Vec<JoinHandle<()>>,
}

impl Operator {
    /// Spawns `command` with stdin closed and stdout and stderr captured.
    pub fn spawn(identity: &str, mut command: Command) -> Operator {
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {:?}: {e}", command.get_program()));
        let output = Arc::new(Mutex::new(Output::default()));
        let readers = vec![
            collect(child.stdout.take().unwrap(), &output, |o| &mut o.stdout),
            collect(child.stderr.take().unwrap(), &output, |o| &mut o.stderr),
        ];
        Operator {
            identity: identity.into(),
            child,
            probes: 0,
            metrics: 0,
            output,
            readers,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn stdout(&self) -> String {
        self.output.lock().unwrap().stdout.clone()
    }

    pub fn stderr(&self) -> String {
        self.output.lock().unwrap().stderr.clone()
    }

    /// stdout and stderr together, in the order written.
    pub fn logs(&self) -> String {
        self.output.lock().unwrap().both.clone()
    }

    /// Its exit status, if it has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Sends `signal` (SIGTERM, SIGINT).
    pub fn signal(&self, signal: Signal) {
        // SAFETY: kill(2) on the pid of a child this process started and has not reaped.
        let sent = unsafe { libc::kill(self.child.id() as libc::pid_t, signal) };
        assert_eq!(sent, 0, "kill {signal} {}", self.child.id());
    }

    /// Sends SIGTERM: a graceful stop.
    pub fn terminate(&self) {
        self.signal(SIGTERM);
    }

    /// Waits up to `within` for the process to exit, then for its output to be read to the end.
    pub async fn exit_within(&mut self, within: Duration) -> Option<ExitStatus> {
        let child = &mut self.child;
        let status = poll(within, Duration::from_millis(20), || {
            std::future::ready(child.try_wait().ok().flatten())
        })
        .await?;
        // The pipes close with the process: the readers end.
        for reader in self.readers.drain(..) {
            let _ = reader.join();
        }
        Some(status)
    }

    /// [`Self::exit_within`] for a synchronous test: panics, with stderr, when it does not exit.
    pub fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        blocking(self.exit_within(within))
            .unwrap_or_else(|| panic!("no exit within {within:?}; stderr:\n{}", self.stderr()))
    }

    /// Polls `check` every 50 ms for a synchronous test; panics, with the output, when the
    /// process exits first or `within` passes.
    pub fn wait_for(
        &mut self,
        what: &str,
        within: Duration,
        mut check: impl FnMut(&mut Self) -> bool,
    ) {
        let done = blocking(poll(within, Duration::from_millis(50), || {
            let done = check(self);
            if let (false, Some(status)) = (done, self.exited()) {
                panic!(
                    "{what}: the operator exited ({status}); stderr:\n{}\nstdout:\n{}",
                    self.stderr(),
                    self.stdout()
                );
            }
            std::future::ready(done.then_some(()))
        }));
        assert!(
            done.is_some(),
            "{what}: not within {within:?}; stderr:\n{}\nstdout:\n{}",
            self.stderr(),
            self.stdout()
        );
    }

    /// A GET on one of its ports.
    pub fn get(&self, port: u16, path: &str) -> Option<Reply> {
        http_get(port, path)
    }

    /// Its exposition now; empty when the metrics server does not answer.
    pub fn scrape(&self) -> String {
        self.get(self.metrics, "/metrics")
            .map(|r| r.body)
            .unwrap_or_default()
    }

    /// Its exposition, retried for a few seconds: the metrics server may start listening a
    /// moment after the health server. Panics when it never answers 200.
    pub fn metrics_text(&self) -> String {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match self.get(self.metrics, "/metrics") {
                Some(reply) if reply.status == 200 => return reply.body,
                other if Instant::now() >= deadline => panic!(
                    "operator {}: GET /metrics on port {} gave {:?}",
                    self.identity,
                    self.metrics,
                    other.map(|r| r.status)
                ),
                _ => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    /// The sum of a metric's samples over all labels matching `labels` (e.g. `controller="cdncluster"`).
    pub fn metric_sum(&self, name: &str, labels: &str) -> Option<f64> {
        metric_sum(&self.metrics_text(), name, labels)
    }

    /// Resident memory of the process (VmRSS), in kibibytes.
    pub fn rss_kib(&self) -> Option<u64> {
        self.usage().map(|u| u.rss_kib)
    }

    /// The process's memory and CPU so far.
    pub fn usage(&self) -> Option<Usage> {
        Usage::of(self.child.id())
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Reads `pipe` line by line into its part of `output` (chosen by `part`) and into `both`.
fn collect(
    pipe: impl Read + Send + 'static,
    output: &Arc<Mutex<Output>>,
    part: fn(&mut Output) -> &mut String,
) -> JoinHandle<()> {
    let output = output.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines() {
            let Ok(line) = line else { break };
            let mut output = output.lock().unwrap();
            let line = format!("{line}\n");
            part(&mut output).push_str(&line);
            output.both.push_str(&line);
        }
    })
}

/// What a process used so far, from /proc (with the procfs crate).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Usage {
    /// VmRSS: resident memory now.
    pub rss_kib: u64,
    /// VmHWM: the peak of resident memory.
    pub peak_rss_kib: u64,
    /// User and system CPU time.
    pub cpu_seconds: f64,
    /// The system part of `cpu_seconds`: the kernel working for the process (syscalls, page
    /// faults).
    pub system_seconds: f64,
    /// Minor page faults: pages the process touched that the kernel had to map (a first touch,
    /// or again after the allocator gave them back).
    pub minor_faults: u64,
    /// Context switches of its live threads: voluntary (a thread waited, then was woken) and
    /// involuntary (preempted by another process).
    pub switches: Switches,
}

/// Context switches, from each thread's /proc status.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Switches {
    pub voluntary: u64,
    pub involuntary: u64,
}

impl Usage {
    pub fn of(pid: u32) -> Option<Usage> {
        let process = procfs::process::Process::new(i32::try_from(pid).ok()?).ok()?;
        let status = process.status().ok()?;
        let stat = process.stat().ok()?;
        let mut switches = Switches::default();
        for task in process.tasks().ok()?.flatten() {
            // A thread that ended between the listing and the read has nothing left to count.
            let Ok(status) = task.status() else { continue };
            switches.voluntary += status.voluntary_ctxt_switches.unwrap_or_default();
            switches.involuntary += status.nonvoluntary_ctxt_switches.unwrap_or_default();
        }
        let seconds = |ticks: u64| ticks as f64 / procfs::ticks_per_second() as f64;
        Some(Usage {
            rss_kib: status.vmrss?,
            peak_rss_kib: status.vmhwm?,
            cpu_seconds: seconds(stat.utime + stat.stime),
            system_seconds: seconds(stat.stime),
            minor_faults: stat.minflt,
            switches,
        })
    }
}

/// Runs `command` to its end with `stdin` as its input, capturing stdout and stderr.
pub fn run_with_stdin(command: &mut Command, stdin: &str) -> std::io::Result<std::process::Output> {
    use std::io::Write;
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    // A command that exits without reading its input closes the pipe: not an error here.
    let _ = child
        .stdin
        .take()
        .expect("piped")
        .write_all(stdin.as_bytes());
    child.wait_with_output()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_counts_a_thread_that_waits() {
        // A process of its own, waiting again and again: this test process's threads come and go
        // with the other tests, and a thread gone takes its counts with it.
        let mut waiter = std::process::Command::new("sh")
            .args(["-c", "while :; do sleep 0.01; done"])
            .spawn()
            .expect("sh");
        let usage = || Usage::of(waiter.id()).expect("the waiter's usage");
        std::thread::sleep(Duration::from_millis(50));
        let before = usage().switches;
        std::thread::sleep(Duration::from_millis(200));
        let after = usage().switches;
        let _ = waiter.kill();
        let _ = waiter.wait();
        assert!(after.voluntary > before.voluntary, "{before:?} → {after:?}");
        assert!(after.involuntary >= before.involuntary);
    }

    #[test]
    fn usage_counts_the_pages_a_process_touches() {
        let before = Usage::of(std::process::id()).expect("this process's usage");
        // 16 MiB, mapped on its own (above malloc's mmap threshold) and touched page by page.
        let mut touched = vec![0u8; 16 << 20];
        for page in touched.chunks_mut(4096) {
            page[0] = 1;
        }
        let after = Usage::of(std::process::id()).expect("this process's usage");
        assert_eq!(touched.iter().map(|&b| b as usize).sum::<usize>(), 4096);
        // 4,096 pages of 4 KiB (fewer faults if the kernel maps huge pages).
        assert!(
            after.minor_faults >= before.minor_faults + 8,
            "{before:?} → {after:?}"
        );
        assert!(after.system_seconds >= before.system_seconds);
        assert!(after.system_seconds <= after.cpu_seconds);
    }
}
