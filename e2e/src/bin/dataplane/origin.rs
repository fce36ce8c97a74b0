//! The origin: an nginx serving the benchmark's files (one process, in a sandbox), its access log
//! (from which each row counts the requests and bytes of its own URLs) and its count of accepted
//! connections; the files themselves; and the nginx serving them directly, the throughput limit.

use cdn_operator_testkit::nginx::{Nginx, Sandbox};
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::client::Client;
use crate::lab::{DIRECT, ORIGIN, ORIGIN_IP, ORIGIN_STATUS};
use crate::util::{chmod, pattern};
use crate::zipf;

/// The large object: 50 MB.
pub(crate) const BIG: u64 = 50_000_000;

/// The origin's access log: one line per request, `$msec|$request|$status|$bytes_sent|$connection|
/// $http_range|$host`.
pub(crate) struct OriginLog {
    pub(crate) path: PathBuf,
}

#[derive(Clone, Debug)]
pub(crate) struct Entry {
    pub(crate) method: String,
    pub(crate) path: String,
    pub(crate) status: u16,
    pub(crate) bytes: u64,
    pub(crate) connection: u64,
    pub(crate) range: String,
}

impl OriginLog {
    /// Where the log ends now.
    pub(crate) fn mark(&self) -> u64 {
        std::fs::metadata(&self.path).map(|m| m.len()).unwrap_or(0)
    }

    /// The requests logged after `mark` whose path starts with `prefix`, once the log has stopped
    /// growing for `quiet` (at most 20 s): a request is logged when it ends.
    pub(crate) fn settle(&self, mark: u64, prefix: &str, quiet: Duration) -> Vec<Entry> {
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut len = self.mark();
        let mut since = Instant::now();
        while Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
            let now = self.mark();
            if now != len {
                len = now;
                since = Instant::now();
            } else if since.elapsed() >= quiet {
                break;
            }
        }
        self.since(mark)
            .into_iter()
            .filter(|e| e.path.starts_with(prefix))
            .collect()
    }

    fn since(&self, mark: u64) -> Vec<Entry> {
        let mut text = Vec::new();
        if let Ok(mut file) = std::fs::File::open(&self.path) {
            use std::io::Seek;
            let _ = file.seek(io::SeekFrom::Start(mark));
            let _ = file.read_to_end(&mut text);
        }
        String::from_utf8_lossy(&text)
            .lines()
            .filter_map(|line| {
                let f: Vec<&str> = line.split('|').collect();
                if f.len() < 7 {
                    return None;
                }
                let mut request = f[1].split(' ');
                Some(Entry {
                    method: request.next()?.to_string(),
                    path: request.next()?.to_string(),
                    status: f[2].parse().ok()?,
                    bytes: f[3].parse().ok()?,
                    connection: f[4].parse().ok()?,
                    range: f[5].to_string(),
                })
            })
            .collect()
    }
}

/// The origin's configuration (one process, as testkit runs it).
pub(crate) fn origin_config(www: &Path, dir: &Path, log: &Path) -> String {
    let (www, tmp, log) = (www.display(), dir.display(), log.display());
    format!(
        "pid {tmp}/origin.pid;\n\
         events {{ worker_connections 4096; }}\n\
         http {{\n\
         \x20 default_type application/octet-stream;\n\
         \x20 client_body_temp_path {tmp}/o-cb; proxy_temp_path {tmp}/o-p; fastcgi_temp_path {tmp}/o-f;\n\
         \x20 uwsgi_temp_path {tmp}/o-u; scgi_temp_path {tmp}/o-s;\n\
         \x20 log_format bench '$msec|$request|$status|$bytes_sent|$connection|$http_range|$host';\n\
         \x20 access_log {log} bench;\n\
         \x20 sendfile on;\n\
         \x20 keepalive_requests 100000;\n\
         \x20 keepalive_timeout 65s;\n\
         \x20 server {{\n\
         \x20   listen {ORIGIN};\n\
         \x20   root {www};\n\
         \x20   location /obj/ {{ rewrite ^ /1k.bin break; }}\n\
         \x20   location /big/ {{ rewrite ^ /50m.bin break; }}\n\
         \x20   location /mib/ {{ rewrite ^ /1m.bin break; }}\n\
         \x20   location /m4/ {{ rewrite ^ /4m.bin break; }}\n\
         \x20   location ~ ^/z/[0-9]+/[0-9]+-(?<class>[0-9]+)$ {{ rewrite ^ /zipf/$class.bin break; }}\n\
         \x20   location /short/ {{ add_header Cache-Control max-age=1; rewrite ^ /1k.bin break; }}\n\
         \x20   location /slow/ {{ limit_rate 128k; rewrite ^ /64k.bin break; }}\n\
         \x20   location /nocache/ {{ add_header Cache-Control no-cache; rewrite ^ /1k.bin break; }}\n\
         \x20   location /err/ {{ return 503 \"origin failure\\n\"; }}\n\
         \x20   location /site/ {{ root {www}/sites/$host; }}\n\
         \x20   location ~ ^/pt/(?<tag>[^/]+)/ {{ add_header Surrogate-Key $tag; rewrite ^ /1k.bin break; }}\n\
         \x20 }}\n\
         \x20 server {{\n\
         \x20   listen {ORIGIN_STATUS};\n\
         \x20   access_log off;\n\
         \x20   location / {{ stub_status; }}\n\
         \x20 }}\n\
         }}\n"
    )
}

/// The 1 KiB file served directly: the generated configurations' http settings, no proxy.
pub(crate) fn start_direct(dir: &Path, www: &Path) -> Nginx {
    let (tmp, www) = (dir.display(), www.display());
    let conf = format!(
        "worker_processes auto;\n\
         pid {tmp}/direct.pid;\n\
         events {{ worker_connections 4096; }}\n\
         http {{\n\
         \x20 default_type application/octet-stream;\n\
         \x20 client_body_temp_path {tmp}/d-cb; proxy_temp_path {tmp}/d-p; fastcgi_temp_path {tmp}/d-f;\n\
         \x20 uwsgi_temp_path {tmp}/d-u; scgi_temp_path {tmp}/d-s;\n\
         \x20 access_log {tmp}/direct.access.log combined buffer=64k flush=1s;\n\
         \x20 server_tokens off;\n\
         \x20 sendfile on;\n\
         \x20 tcp_nopush on;\n\
         \x20 keepalive_timeout 65s;\n\
         \x20 keepalive_requests 10000;\n\
         \x20 server {{ listen {DIRECT}; root {www}; }}\n\
         }}\n"
    );
    let file = dir.join("direct.conf");
    std::fs::write(&file, &conf).expect("writing direct.conf");
    let command = Sandbox::new().share(dir).nginx(&[
        "-e".as_ref(),
        "stderr".as_ref(),
        "-c".as_ref(),
        file.as_os_str(),
        "-g".as_ref(),
        "daemon off;".as_ref(),
    ]);
    let server = Nginx::spawn("direct", command, &dir.join("direct.log"));
    server.wait_listening(DIRECT, &conf);
    server
}

/// The origin's accepted connections, from its stub_status (which counts this request's own).
pub(crate) fn origin_accepts() -> Option<u64> {
    let r = Client::once(ORIGIN_STATUS, "GET", "/", &[("Host", ORIGIN_IP)]).ok()?;
    let text = String::from_utf8_lossy(&r.body).into_owned();
    // "Active connections: 1\nserver accepts handled requests\n 5 5 9\n..."
    let line = text.lines().nth(2)?;
    line.split_whitespace().next()?.parse().ok()
}

/// The origin's files.
pub(crate) fn make_content(www: &Path) {
    let mkdir = |p: &Path| {
        std::fs::create_dir_all(p).unwrap_or_else(|e| panic!("creating {}: {e}", p.display()));
        chmod(p, 0o755);
    };
    let write = |p: &Path, data: &[u8]| {
        std::fs::write(p, data).unwrap_or_else(|e| panic!("writing {}: {e}", p.display()));
        chmod(p, 0o644);
    };
    for dir in [
        "seg",
        "live",
        "sites/customer-a/site",
        "sites/customer-b/site",
    ] {
        mkdir(&www.join(dir));
    }
    write(&www.join("1k.bin"), &pattern(1024));
    write(&www.join("64k.bin"), &pattern(64 * 1024));
    write(&www.join("1m.bin"), &pattern(1 << 20));
    write(&www.join("4m.bin"), &pattern(4 << 20));
    mkdir(&www.join("zipf"));
    zipf::make_zipf_content(www, write);
    // Random bytes, so that nothing on the way compresses them.
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut big = Vec::with_capacity(BIG as usize);
    while (big.len() as u64) < BIG {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        big.extend_from_slice(&state.to_le_bytes());
    }
    big.truncate(BIG as usize);
    write(&www.join("50m.bin"), &big);
    for i in 0..2000 {
        let mut data = format!("segment {i:04}\n").into_bytes();
        data.resize(2048, b'.');
        write(&www.join(format!("seg/{i:04}.ts")), &data);
    }
    for site in ["customer-a", "customer-b"] {
        write(
            &www.join(format!("sites/{site}/site/page.html")),
            format!("page of {site}\n").as_bytes(),
        );
    }
}
