//! `wrk`, the load of the throughput rows: a run of it (killed if it overruns) and what it reports.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::lab::HOST;

pub(crate) struct WrkRun {
    pub(crate) rps: f64,
    /// Requests completed.
    pub(crate) requests: u64,
    pub(crate) errors: u64,
}

/// `wrk -t1 -c50 -dSECONDS` of `url` with the benchmark's Host; killed if it overruns.
pub(crate) fn wrk(url: &str, seconds: u64) -> Result<WrkRun, String> {
    wrk_script(url, seconds, None)
}

/// [`wrk`], its requests made by the Lua `script` when there is one.
pub(crate) fn wrk_script(url: &str, seconds: u64, script: Option<&Path>) -> Result<WrkRun, String> {
    let mut command = Command::new("wrk");
    command.args([
        "-t1",
        "-c50",
        &format!("-d{seconds}s"),
        "-H",
        &format!("Host: {HOST}"),
    ]);
    if let Some(script) = script {
        command.arg("-s").arg(script);
    }
    let mut child = command
        .arg(url)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("wrk: {e}"))?;
    let deadline = Instant::now() + Duration::from_secs(seconds + 20);
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(100)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err("wrk overran".into());
            }
        }
    }
    let mut out = String::new();
    if let Some(mut stdout) = child.stdout.take() {
        let _ = stdout.read_to_string(&mut out);
    }
    let number = |prefix: &str| {
        out.lines()
            .find_map(|l| l.trim().strip_prefix(prefix))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<f64>().ok())
    };
    let rps = number("Requests/sec:").ok_or_else(|| format!("wrk said: {out}"))?;
    // `  123456 requests in 5.00s, 40.12MB read`
    let requests = out
        .lines()
        .find(|l| l.contains(" requests in "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    let mut errors = number("Non-2xx or 3xx responses:").unwrap_or(0.0) as u64;
    if let Some(line) = out.lines().find(|l| l.trim().starts_with("Socket errors:")) {
        errors += line
            .split(|c: char| !c.is_ascii_digit())
            .filter_map(|n| n.parse::<u64>().ok())
            .sum::<u64>();
    }
    Ok(WrkRun {
        rps,
        requests,
        errors,
    })
}
