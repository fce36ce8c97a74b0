//! The OTLP test receiver (../shared/tools/otlp_receiver.py), and a TLS front for it.

use serde_json::Value;
use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cdn_operator_testkit::free_port;

/// A helper process, killed when dropped.
pub struct Killed(pub Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// ../shared/tools/otlp_receiver.py on loopback; killed when dropped.
pub struct Receiver {
    _child: Killed,
    pub http: u16,
    pub spans: PathBuf,
    _dir: tempfile::TempDir,
}

impl Receiver {
    pub fn start() -> Receiver {
        let script =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/tools/otlp_receiver.py");
        assert!(script.exists(), "{} is missing", script.display());
        let dir = tempfile::tempdir().unwrap();
        let spans = dir.path().join("spans.jsonl");
        let (grpc, http) = (free_port(), free_port());
        let mut child = Command::new("python3")
            .arg(&script)
            .args(["--grpc", &format!("127.0.0.1:{grpc}")])
            .args(["--http", &format!("127.0.0.1:{http}")])
            .arg("--out")
            .arg(&spans)
            .args(["--max-seconds", "120"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("python3 runs the OTLP receiver");
        let mut first = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut first)
            .unwrap();
        if !first.starts_with("listening") {
            let mut error = String::new();
            let _ = child.stderr.take().unwrap().read_to_string(&mut error);
            let _ = child.kill();
            panic!("the OTLP receiver did not start ({first}): {error} (scripts/install-test-deps.sh installs its modules)");
        }
        Receiver {
            _child: Killed(child),
            http,
            spans,
            _dir: dir,
        }
    }

    /// The spans received, waiting up to 5 s for one named `name`.
    pub fn spans_once(&self, name: &str) -> Vec<Value> {
        let start = Instant::now();
        loop {
            let text = std::fs::read_to_string(&self.spans).unwrap_or_default();
            let spans: Vec<Value> = text
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
            if spans.iter().any(|s| s["name"] == name) || start.elapsed() > Duration::from_secs(5) {
                return spans;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// A TLS front for the receiver's HTTP port (a collector behind https), with a fresh CA.
/// Returns the TLS port, the CA file and the forwarder process.
pub fn tls_front(dir: &std::path::Path, target: u16) -> (u16, PathBuf, Killed) {
    let run = |args: &[&str]| {
        let output = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("openssl (Debian package openssl) must be installed");
        assert!(
            output.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    };
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    run(&[
        &["req", "-x509"][..],
        &ec,
        &[
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "1",
            "-subj",
            "/CN=test-ca",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign",
        ],
    ]
    .concat());
    run(&[
        &["req"][..],
        &ec,
        &[
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=127.0.0.1",
        ],
    ]
    .concat());
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.pem",
        "-days",
        "1",
        "-extfile",
        "server.ext",
    ]);
    let forwarder = r#"
import socket, ssl, sys, threading
target = int(sys.argv[1])
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain("server.pem", "server.key")
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen()
print(srv.getsockname()[1], flush=True)
def pipe(a, b):
    try:
        while True:
            data = a.recv(65536)
            if not data:
                break
            b.sendall(data)
    except Exception:
        pass
    finally:
        for s in (a, b):
            try:
                s.close()
            except Exception:
                pass
def handle(conn):
    try:
        tls = ctx.wrap_socket(conn, server_side=True)
    except Exception:
        return
    upstream = socket.create_connection(("127.0.0.1", target))
    threading.Thread(target=pipe, args=(tls, upstream), daemon=True).start()
    pipe(upstream, tls)
while True:
    conn, _ = srv.accept()
    threading.Thread(target=handle, args=(conn,), daemon=True).start()
"#;
    let mut child = Command::new("python3")
        .args(["-c", forwarder, &target.to_string()])
        .current_dir(dir)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut port = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut port)
        .unwrap();
    (
        port.trim().parse().expect("the TLS front prints its port"),
        dir.join("ca.pem"),
        Killed(child),
    )
}
