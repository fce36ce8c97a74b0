//! A real Prometheus and Alertmanager on this machine (Debian's `prometheus` and
//! `prometheus-alertmanager`), configured by the test: scrape configurations, a rules file, an
//! Alertmanager whose only receiver is a webhook this process serves and counts. Their HTTP APIs
//! (`/api/v1/targets`, `/api/v1/query`, `/api/v1/series`, `/api/v1/alerts`) read back as plain
//! values. Stopped (and their folders removed) when dropped.

use cdn_operator_testkit::{free_port, http_get};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The Prometheus binary: `PROMETHEUS`, else `prometheus` on `PATH`.
pub const PROMETHEUS_ENV: &str = "PROMETHEUS";
/// The Alertmanager binary: `ALERTMANAGER`, else Debian's `prometheus-alertmanager` or
/// `alertmanager` on `PATH`.
pub const ALERTMANAGER_ENV: &str = "ALERTMANAGER";

fn on_path(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|dir| names.iter().map(move |n| dir.join(n)))
        .find(|p| p.is_file())
}

fn binary(variable: &str, names: &[&str]) -> Result<PathBuf, String> {
    match std::env::var(variable) {
        Ok(path) if !path.trim().is_empty() => Ok(PathBuf::from(path.trim())),
        _ => on_path(names).ok_or_else(|| {
            format!(
                "no {} binary (set {variable}, or install Debian's {})",
                names[0], names[0]
            )
        }),
    }
}

/// Both binaries, or why not (the test skips with that line).
pub fn binaries() -> Result<(PathBuf, PathBuf), String> {
    Ok((
        binary(PROMETHEUS_ENV, &["prometheus"])?,
        binary(
            ALERTMANAGER_ENV,
            &["prometheus-alertmanager", "alertmanager"],
        )?,
    ))
}

/// A notification Alertmanager sent the webhook: one alert of it.
#[derive(Clone, Debug)]
pub struct Notified {
    pub at: Instant,
    pub alertname: String,
    /// `firing` or `resolved`.
    pub status: String,
    pub labels: BTreeMap<String, String>,
}

/// The webhook receiver: every alert of every notification, in order.
#[derive(Clone, Default)]
pub struct Webhook {
    received: Arc<Mutex<Vec<Notified>>>,
}

impl Webhook {
    /// Serves on a free loopback port, on a thread of its own: answers every POST 200 and keeps
    /// its alerts. The port.
    fn serve(&self) -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let port = listener.local_addr().expect("its address").port();
        let received = self.received.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let received = received.clone();
                std::thread::spawn(move || {
                    let _ = Webhook::answer(stream, &received);
                });
            }
        });
        port
    }

    fn answer(stream: std::net::TcpStream, received: &Mutex<Vec<Notified>>) -> std::io::Result<()> {
        let mut reader = BufReader::new(stream.try_clone()?);
        let mut writer = stream;
        loop {
            let mut length = 0usize;
            let mut line = String::new();
            if reader.read_line(&mut line)? == 0 {
                return Ok(());
            }
            loop {
                let mut header = String::new();
                reader.read_line(&mut header)?;
                let header = header.trim_end();
                if header.is_empty() {
                    break;
                }
                if let Some((name, value)) = header.split_once(':') {
                    if name.eq_ignore_ascii_case("content-length") {
                        length = value.trim().parse().unwrap_or(0);
                    }
                }
            }
            let mut body = vec![0; length];
            reader.read_exact(&mut body)?;
            let at = Instant::now();
            if let Ok(notification) = serde_json::from_slice::<Value>(&body) {
                let mut received = received.lock().expect("webhook lock");
                for alert in notification["alerts"].as_array().into_iter().flatten() {
                    let labels: BTreeMap<String, String> =
                        serde_json::from_value(alert["labels"].clone()).unwrap_or_default();
                    received.push(Notified {
                        at,
                        alertname: labels.get("alertname").cloned().unwrap_or_default(),
                        status: alert["status"].as_str().unwrap_or_default().into(),
                        labels,
                    });
                }
            }
            writer.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")?;
        }
    }

    /// Every alert received so far.
    pub fn received(&self) -> Vec<Notified> {
        self.received.lock().expect("webhook lock").clone()
    }
}

/// A target as `/api/v1/targets` lists it.
#[derive(Clone, Debug)]
pub struct Target {
    pub scrape_pool: String,
    pub labels: BTreeMap<String, String>,
    pub health: String,
    pub last_error: String,
    pub scrape_url: String,
}

/// One series of an instant query: its labels and value.
#[derive(Clone, Debug)]
pub struct Sample {
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// An alert as `/api/v1/alerts` lists it.
#[derive(Clone, Debug)]
pub struct ActiveAlert {
    pub name: String,
    /// `pending` or `firing`.
    pub state: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// When its expression started to hold (RFC 3339).
    pub active_at: String,
}

/// Prometheus and Alertmanager running, with the webhook they notify.
pub struct Prometheus {
    prometheus: Child,
    alertmanager: Child,
    pub port: u16,
    pub alertmanager_port: u16,
    pub webhook: Webhook,
    pub dir: tempfile::TempDir,
}

impl Prometheus {
    /// Starts Alertmanager (a route to the webhook, grouped by alert and labels, sent at once)
    /// and Prometheus with `scrape_configs`, the rules file `rules` and `interval` as its
    /// scrape and evaluation interval, then waits until both are ready.
    pub fn start(
        (prometheus, alertmanager): &(PathBuf, PathBuf),
        scrape_configs: &[Value],
        rules: &Value,
        interval: &str,
    ) -> Prometheus {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let webhook = Webhook::default();
        let hook = webhook.serve();
        let alertmanager_port = free_port();
        let alertmanager_config = json!({
            "route": {
                "receiver": "webhook",
                "group_by": ["..."],
                "group_wait": "0s",
                "group_interval": "1s",
                "repeat_interval": "1h",
            },
            "receivers": [{
                "name": "webhook",
                "webhook_configs": [{"url": format!("http://127.0.0.1:{hook}/"), "send_resolved": true}],
            }],
        });
        write_json(&dir.path().join("alertmanager.yml"), &alertmanager_config);
        let mut alertmanager = spawn(
            alertmanager,
            dir.path(),
            "alertmanager",
            &[
                format!(
                    "--storage.path={}",
                    dir.path().join("alertmanager").display()
                ),
                format!("--web.listen-address=127.0.0.1:{alertmanager_port}"),
                // A single instance: no gossip port to bind.
                "--cluster.listen-address=".into(),
            ],
        );
        write_json(&dir.path().join("rules.yml"), rules);
        let config = json!({
            "global": {
                "scrape_interval": interval,
                "evaluation_interval": interval,
                "scrape_timeout": interval,
            },
            "rule_files": [dir.path().join("rules.yml")],
            "alerting": {"alertmanagers": [{"static_configs": [{"targets": [format!("127.0.0.1:{alertmanager_port}")]}]}]},
            "scrape_configs": scrape_configs,
        });
        write_json(&dir.path().join("prometheus.yml"), &config);
        let port = free_port();
        // Alertmanager ready first: an alert Prometheus could not deliver is sent again only
        // after its resend delay.
        if let Err(why) = ready("Alertmanager", alertmanager_port) {
            let _ = alertmanager.kill();
            let log = std::fs::read_to_string(dir.path().join("alertmanager.log"));
            panic!("{why}:\n{}", log.unwrap_or_default());
        }
        let prometheus = spawn(
            prometheus,
            dir.path(),
            "prometheus",
            &[
                format!("--storage.tsdb.path={}", dir.path().join("data").display()),
                format!("--web.listen-address=127.0.0.1:{port}"),
                // Alerts go out again (to an Alertmanager restarted, say) on the test's time
                // scale.
                format!("--rules.alert.resend-delay={interval}"),
            ],
        );
        let started = Prometheus {
            prometheus,
            alertmanager,
            port,
            alertmanager_port,
            webhook,
            dir,
        };
        if let Err(why) = ready("Prometheus", port) {
            panic!("{why}:\n{}", started.logs());
        }
        started
    }

    /// Both logs, for a failure's message.
    pub fn logs(&self) -> String {
        let read =
            |name: &str| std::fs::read_to_string(self.dir.path().join(name)).unwrap_or_default();
        format!(
            "--- prometheus.log\n{}\n--- alertmanager.log\n{}",
            tail(&read("prometheus.log"), 60),
            tail(&read("alertmanager.log"), 30)
        )
    }

    fn api(&self, path: &str) -> Result<Value, String> {
        let reply = http_get(self.port, path).ok_or_else(|| format!("no answer to {path}"))?;
        let body: Value = serde_json::from_str(&reply.body)
            .map_err(|e| format!("{path}: {e}: {}", reply.body))?;
        if body["status"] != "success" {
            return Err(format!("{path}: {} {}", reply.status, reply.body));
        }
        Ok(body["data"].clone())
    }

    /// The active targets.
    pub fn targets(&self) -> Vec<Target> {
        let data = self
            .api("/api/v1/targets?state=active")
            .unwrap_or_else(|e| panic!("{e}"));
        data["activeTargets"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|t| Target {
                scrape_pool: t["scrapePool"].as_str().unwrap_or_default().into(),
                labels: serde_json::from_value(t["labels"].clone()).unwrap_or_default(),
                health: t["health"].as_str().unwrap_or_default().into(),
                last_error: t["lastError"].as_str().unwrap_or_default().into(),
                scrape_url: t["scrapeUrl"].as_str().unwrap_or_default().into(),
            })
            .collect()
    }

    /// An instant query's series (a scalar as one series without labels).
    pub fn query(&self, expr: &str) -> Result<Vec<Sample>, String> {
        let data = self.api(&format!("/api/v1/query?query={}", encode(expr)))?;
        let value = |v: &Value| {
            v[1].as_str()
                .and_then(|s| s.parse::<f64>().ok())
                .unwrap_or(f64::NAN)
        };
        Ok(match data["resultType"].as_str() {
            Some("scalar") => vec![Sample {
                labels: BTreeMap::new(),
                value: value(&data["result"]),
            }],
            _ => data["result"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|s| Sample {
                    labels: serde_json::from_value(s["metric"].clone()).unwrap_or_default(),
                    value: value(&s["value"]),
                })
                .collect(),
        })
    }

    /// The values of `label` among the series `selector` selects, as Grafana's `label_values`.
    pub fn label_values(&self, selector: &str, label: &str) -> Result<Vec<String>, String> {
        let data = self.api(&format!("/api/v1/series?match[]={}", encode(selector)))?;
        let mut values: Vec<String> = data
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s[label].as_str().map(String::from))
            .collect();
        values.sort();
        values.dedup();
        Ok(values)
    }

    /// The alerts pending or firing now.
    pub fn alerts(&self) -> Vec<ActiveAlert> {
        let data = self.api("/api/v1/alerts").unwrap_or_else(|e| panic!("{e}"));
        data["alerts"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|a| {
                let labels: BTreeMap<String, String> =
                    serde_json::from_value(a["labels"].clone()).unwrap_or_default();
                ActiveAlert {
                    name: labels.get("alertname").cloned().unwrap_or_default(),
                    state: a["state"].as_str().unwrap_or_default().into(),
                    annotations: serde_json::from_value(a["annotations"].clone())
                        .unwrap_or_default(),
                    labels,
                    active_at: a["activeAt"].as_str().unwrap_or_default().into(),
                }
            })
            .collect()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        for child in [&mut self.prometheus, &mut self.alertmanager] {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Waits up to 60 s for `what` to answer `/-/ready` on `port`.
fn ready(what: &str, port: u16) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while http_get(port, "/-/ready").is_none_or(|r| r.status != 200) {
        if Instant::now() > deadline {
            return Err(format!("{what} not ready within 60 s"));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(())
}

fn write_json(path: &Path, value: &Value) {
    // JSON is YAML: both programs read it as their YAML configuration.
    std::fs::write(path, serde_json::to_string_pretty(value).expect("JSON"))
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}

/// Starts `binary` with its configuration `<dir>/<name>.yml` and `args`, its log in
/// `<dir>/<name>.log`.
fn spawn(binary: &Path, dir: &Path, name: &str, args: &[String]) -> Child {
    let log = std::fs::File::create(dir.join(format!("{name}.log"))).expect("a log file");
    Command::new(binary)
        .arg(format!(
            "--config.file={}",
            dir.join(format!("{name}.yml")).display()
        ))
        .args(args)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", binary.display()))
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Percent-encodes a query parameter's value (PromQL has `{`, `"`, `=`, `+`, spaces…).
fn encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_is_encoded_whole() {
        assert_eq!(
            encode(r#"sum(up{job="a b"}) + 1"#),
            "sum%28up%7Bjob%3D%22a%20b%22%7D%29%20%2B%201"
        );
    }

    /// Prometheus and Alertmanager of this machine, with an alert that always fires: it is
    /// listed firing by Prometheus and reaches the webhook through Alertmanager.
    #[test]
    fn an_alert_reaches_the_webhook_through_alertmanager() {
        let binaries = match binaries() {
            Ok(b) => b,
            Err(why) => {
                eprintln!("skipped: {why}");
                return;
            }
        };
        let rules = json!({"groups": [{"name": "t", "rules": [
            {"alert": "Always", "expr": "vector(1)", "labels": {"severity": "none"}},
        ]}]});
        let p = Prometheus::start(&binaries, &[], &rules, "500ms");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let firing = p
                .alerts()
                .iter()
                .any(|a| a.name == "Always" && a.state == "firing");
            let notified = p
                .webhook
                .received()
                .iter()
                .any(|n| n.alertname == "Always" && n.status == "firing");
            if firing && notified {
                break;
            }
            assert!(Instant::now() < deadline, "no notification:\n{}", p.logs());
            std::thread::sleep(Duration::from_millis(200));
        }
        assert_eq!(p.query("vector(2)").unwrap()[0].value, 2.0);
    }
}
