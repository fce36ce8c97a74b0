//! HTTP on loopback, as a probe or a scraper does it: one GET on its own connection.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
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
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: {accept}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).ok()?;
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
