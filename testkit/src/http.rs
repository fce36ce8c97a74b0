//! HTTP on loopback, as a probe or a scraper does it: one GET on its own connection; and one
//! request with all the headers of its response, for what passes through nginx.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

/// A free loopback port: bound then released.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

/// What a GET got back.
#[derive(Clone, Debug, PartialEq)]
pub struct Reply {
    pub status: u16,
    /// The Content-Type header, lower-cased; empty without one.
    pub content_type: String,
    pub body: String,
}

/// A GET on loopback that accepts anything, as curl sends it.
pub fn http_get(port: u16, path: &str) -> Option<Reply> {
    http_get_accepting(port, path, "*/*")
}

/// A plain HTTP/1.1 GET on loopback with this Accept header, the connection closed after the
/// response; a chunked body is decoded. `None` when nothing answered in time.
pub fn http_get_accepting(port: u16, path: &str, accept: &str) -> Option<Reply> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    exchange(&mut stream, &request_text(addr, path, accept, None))
}

/// The same GET over TLS, with `Authorization: Bearer <token>` when a token is given, as
/// Prometheus scrapes a secured endpoint with `insecureSkipVerify` (the operator's default
/// certificate is self-signed): the certificate chain is not verified, its signatures are.
/// `None` when the TLS handshake or the exchange fails.
pub fn https_get(port: u16, path: &str, accept: &str, token: Option<&str>) -> Option<Reply> {
    https_get_at(
        SocketAddr::from(([127, 0, 0, 1], port)),
        path,
        accept,
        token,
    )
}

/// [`https_get`] to any address: a Service's ClusterIP and port, from a host that routes to
/// them (kube-proxy), as a scraper in the cluster reaches the secured `/metrics`.
pub fn https_get_at(
    addr: SocketAddr,
    path: &str,
    accept: &str,
    token: Option<&str>,
) -> Option<Reply> {
    let mut stream = tls_connect(addr)?;
    exchange(&mut stream, &request_text(addr, path, accept, token))
}

/// The certificate (DER) a TLS server on loopback `port` presents; `None` without a handshake.
pub fn tls_certificate(port: u16) -> Option<Vec<u8>> {
    let mut stream = tls_connect(SocketAddr::from(([127, 0, 0, 1], port)))?;
    while stream.conn.is_handshaking() {
        stream.conn.complete_io(&mut stream.sock).ok()?;
    }
    let leaf = stream.conn.peer_certificates()?.first()?.to_vec();
    Some(leaf)
}

fn tls_connect(
    addr: SocketAddr,
) -> Option<rustls::StreamOwned<rustls::ClientConnection, TcpStream>> {
    let tcp = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    tcp.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .ok()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(SkipVerify(provider)))
        .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from("localhost").ok()?;
    let connection = rustls::ClientConnection::new(Arc::new(config), name).ok()?;
    Some(rustls::StreamOwned::new(connection, tcp))
}

fn request_text(addr: SocketAddr, path: &str, accept: &str, token: Option<&str>) -> String {
    let authorization = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: {accept}\r\n{authorization}Connection: close\r\n\r\n"
    )
}

/// Writes `request`, reads the response to the end of the connection and parses it.
fn exchange(stream: &mut (impl Read + Write), request: &str) -> Option<Reply> {
    stream.write_all(request.as_bytes()).ok()?;
    let mut response = Vec::new();
    if let Err(error) = stream.read_to_end(&mut response) {
        // A TLS peer that closes without close_notify after a complete response is common.
        if error.kind() != std::io::ErrorKind::UnexpectedEof || response.is_empty() {
            return None;
        }
    }
    let text = String::from_utf8_lossy(&response);
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    let header = |name: &str| {
        head.lines().find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix(name)
                .map(|v| v.trim().to_string())
        })
    };
    let body = if header("transfer-encoding:").as_deref() == Some("chunked") {
        dechunk(body)
    } else {
        body.to_string()
    };
    Some(Reply {
        status,
        content_type: header("content-type:").unwrap_or_default(),
        body,
    })
}

/// A response with all its headers.
#[derive(Clone, Debug, PartialEq)]
pub struct Response {
    pub status: u16,
    /// Names and values, in the order received.
    pub headers: Vec<(String, String)>,
    /// The body, invalid UTF-8 replaced.
    pub body: String,
}

impl Response {
    /// A whole HTTP/1.x response as read until the server closed the connection.
    pub fn parse(raw: &[u8]) -> std::io::Result<Response> {
        let raw = String::from_utf8_lossy(raw);
        let not_http = || std::io::Error::other(format!("not an HTTP response: {raw:?}"));
        let (head, body) = raw.split_once("\r\n\r\n").ok_or_else(not_http)?;
        let mut lines = head.lines();
        let status = lines
            .next()
            .and_then(|l| l.split(' ').nth(1))
            .and_then(|s| s.parse().ok())
            .ok_or_else(not_http)?;
        let headers = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(n, v)| (n.trim().to_string(), v.trim().to_string()))
            .collect();
        Ok(Response {
            status,
            headers,
            body: body.to_string(),
        })
    }

    /// The value of the first header named `name` (in any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// How many headers are named `name` (in any case).
    pub fn header_count(&self, name: &str) -> usize {
        self.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .count()
    }
}

/// How long [`request`] waits for its response: above the timeouts of the proxies under test
/// (a pool's proxy_read_timeout), so a request that waits for one to fail over gets its answer.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// One HTTP/1.0 request on a connection of its own to `addr` (any address), its response read
/// until the server closes the connection: `METHOD path` with `headers`, and `body` with its
/// Content-Length when it is not empty.
pub fn request(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<Response> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(REQUEST_TIMEOUT))?;
    let mut head = format!("{method} {path} HTTP/1.0\r\n");
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    if !body.is_empty() {
        head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    stream.write_all(body)?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    Response::parse(&raw)
}

/// Accepts any certificate chain (`insecureSkipVerify`) but checks the handshake signatures
/// with the provider's algorithms, so the peer still proves it holds the certificate's key.
#[derive(Debug)]
struct SkipVerify(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for SkipVerify {
    fn verify_server_cert(
        &self,
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let size =
            usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16).unwrap_or(0);
        if size == 0 || rest.len() < size {
            break;
        }
        out.push_str(&rest[..size]);
        body = rest[size..].trim_start_matches("\r\n");
    }
    out
}

/// An HTTP/1.1 client keeping its connection open between requests, as a player does: many
/// requests a second to one address without a connection each. Bodies are read by their
/// Content-Length (what nginx sends for cached and static objects).
pub struct KeepAlive {
    addr: SocketAddr,
    host: String,
    conn: Option<std::io::BufReader<TcpStream>>,
    retry: bool,
}

impl KeepAlive {
    pub fn new(addr: SocketAddr, host: &str) -> KeepAlive {
        KeepAlive {
            addr,
            host: host.into(),
            conn: None,
            retry: true,
        }
    }

    /// A client as wrk is: a request cut on its kept connection is an error, not sent again.
    pub fn without_retry(addr: SocketAddr, host: &str) -> KeepAlive {
        KeepAlive {
            retry: false,
            ..KeepAlive::new(addr, host)
        }
    }

    /// Whether a connection is kept open for the next request: when not, the next one connects
    /// first (and a refused connection means no request was sent).
    pub fn connected(&self) -> bool {
        self.conn.is_some()
    }

    /// GET `path` with `headers`; once more on a new connection when the kept one was closed
    /// before answering (unless made [`KeepAlive::without_retry`]).
    pub fn get(&mut self, path: &str, headers: &[(&str, &str)]) -> std::io::Result<Response> {
        let mut head = format!("GET {path} HTTP/1.1\r\nHost: {}\r\n", self.host);
        for (name, value) in headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str("\r\n");
        let kept = self.conn.is_some();
        match self.exchange(&head) {
            Err(_) if kept && self.retry => {
                self.conn = None;
                self.exchange(&head)
            }
            other => other,
        }
    }

    fn exchange(&mut self, head: &str) -> std::io::Result<Response> {
        use std::io::BufRead;
        let conn = match &mut self.conn {
            Some(conn) => conn,
            None => {
                let stream = TcpStream::connect_timeout(&self.addr, Duration::from_secs(3))?;
                stream.set_read_timeout(Some(REQUEST_TIMEOUT))?;
                stream.set_nodelay(true)?;
                self.conn.insert(std::io::BufReader::new(stream))
            }
        };
        let failed = |conn: &mut Option<_>, e| {
            *conn = None;
            Err(e)
        };
        if let Err(e) = conn.get_mut().write_all(head.as_bytes()) {
            return failed(&mut self.conn, e);
        }
        let mut raw = Vec::new();
        let mut length = 0usize;
        let mut close = false;
        loop {
            let before = raw.len();
            match conn.read_until(b'\n', &mut raw) {
                Ok(0) => {
                    let e = std::io::Error::other("closed before the response's end");
                    return failed(&mut self.conn, e);
                }
                Ok(_) => {}
                Err(e) => return failed(&mut self.conn, e),
            }
            let line = String::from_utf8_lossy(&raw[before..]).to_ascii_lowercase();
            if let Some(value) = line.strip_prefix("content-length:") {
                length = value.trim().parse().unwrap_or(0);
            } else if line.starts_with("connection:") && line.contains("close") {
                close = true;
            } else if line == "\r\n" {
                break;
            }
        }
        let start = raw.len();
        raw.resize(start + length, 0);
        if let Err(e) = conn.read_exact(&mut raw[start..]) {
            return failed(&mut self.conn, e);
        }
        if close {
            self.conn = None;
        }
        Response::parse(&raw)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunked_bodies_are_decoded() {
        assert_eq!(
            dechunk("5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"),
            "hello world"
        );
    }
}
