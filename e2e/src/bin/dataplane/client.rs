//! A small blocking HTTP/1.1 client: a request on a connection of its own, or on one kept alive
//! between requests; what it measures of each answer (time to its first byte, to its last).

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use crate::lab::HOST;

/// Per-request timeout.
pub(crate) const TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug)]
pub(crate) struct Response {
    pub(crate) status: u16,
    headers: Vec<(String, String)>,
    pub(crate) body: Vec<u8>,
    /// From the request written to the first byte of the response.
    pub(crate) ttfb: Duration,
    /// From the request written to the end of the response.
    pub(crate) elapsed: Duration,
}

impl Response {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// A client connection to `addr`, kept alive between requests while the server keeps it.
pub(crate) struct Client {
    addr: String,
    conn: Option<BufReader<TcpStream>>,
    /// TCP connections it opened.
    pub(crate) connects: u64,
}

impl Client {
    pub(crate) fn new(addr: &str) -> Client {
        Client {
            addr: addr.into(),
            conn: None,
            connects: 0,
        }
    }

    /// One request on a connection of its own, closed after it.
    pub(crate) fn once(
        addr: &str,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
    ) -> io::Result<Response> {
        let mut conn = connect(addr)?;
        exchange(&mut conn, method, path, headers, true).map(|(r, _)| r)
    }

    /// A GET of `path` with the benchmark's Host.
    pub(crate) fn get(&mut self, path: &str) -> io::Result<Response> {
        self.request("GET", path, &[("Host", HOST)])
    }

    /// A request on the kept connection (a new one if there is none); once more on a new
    /// connection if a kept one was closed by the server before answering.
    fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
    ) -> io::Result<Response> {
        loop {
            let reused = self.conn.is_some();
            if self.conn.is_none() {
                self.conn = Some(connect(&self.addr)?);
                self.connects += 1;
            }
            let conn = self.conn.as_mut().expect("a connection");
            match exchange(conn, method, path, headers, false) {
                Ok((response, keep)) => {
                    if !keep {
                        self.conn = None;
                    }
                    return Ok(response);
                }
                Err(e) => {
                    self.conn = None;
                    let closed = matches!(
                        e.kind(),
                        io::ErrorKind::UnexpectedEof
                            | io::ErrorKind::ConnectionReset
                            | io::ErrorKind::BrokenPipe
                    );
                    if !(reused && closed) {
                        return Err(e);
                    }
                }
            }
        }
    }
}

fn connect(addr: &str) -> io::Result<BufReader<TcpStream>> {
    let addr: SocketAddr = addr
        .parse()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("{addr}: {e}")))?;
    let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    stream.set_read_timeout(Some(TIMEOUT))?;
    stream.set_write_timeout(Some(TIMEOUT))?;
    stream.set_nodelay(true)?;
    Ok(BufReader::with_capacity(64 * 1024, stream))
}

/// Writes one request and reads its response: the response, and whether the connection may
/// carry another request.
fn exchange(
    conn: &mut BufReader<TcpStream>,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    close: bool,
) -> io::Result<(Response, bool)> {
    let mut head = format!("{method} {path} HTTP/1.1\r\n");
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    if close {
        head.push_str("Connection: close\r\n");
    }
    head.push_str("\r\n");
    let started = Instant::now();
    conn.get_mut().write_all(head.as_bytes())?;
    if conn.fill_buf()?.is_empty() {
        return Err(eof("the connection closed before a response"));
    }
    let ttfb = started.elapsed();
    let mut line = String::new();
    read_line(conn, &mut line)?;
    let mut words = line.split_whitespace();
    let version = words.next().unwrap_or_default().to_string();
    let status: u16 = words.next().and_then(|s| s.parse().ok()).ok_or_else(|| {
        io::Error::new(io::ErrorKind::InvalidData, format!("status line {line:?}"))
    })?;
    let mut response_headers = Vec::new();
    loop {
        read_line(conn, &mut line)?;
        let text = line.trim_end();
        if text.is_empty() {
            break;
        }
        if let Some((name, value)) = text.split_once(':') {
            response_headers.push((name.trim().to_string(), value.trim().to_string()));
        }
    }
    let header = |name: &str| {
        response_headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.to_ascii_lowercase())
    };
    let mut body = Vec::new();
    let mut framed = true;
    if method == "HEAD" || status == 204 || status == 304 || status < 200 {
    } else if header("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        loop {
            read_line(conn, &mut line)?;
            let size = usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16)
                .map_err(|_| {
                    io::Error::new(io::ErrorKind::InvalidData, format!("chunk size {line:?}"))
                })?;
            if size == 0 {
                loop {
                    read_line(conn, &mut line)?;
                    if line.trim().is_empty() {
                        break;
                    }
                }
                break;
            }
            let at = body.len();
            body.resize(at + size, 0);
            conn.read_exact(&mut body[at..])?;
            read_line(conn, &mut line)?;
        }
    } else if let Some(length) = header("content-length").and_then(|v| v.parse::<usize>().ok()) {
        body.resize(length, 0);
        conn.read_exact(&mut body)?;
    } else {
        conn.read_to_end(&mut body)?;
        framed = false;
    }
    let keep = framed
        && !close
        && version == "HTTP/1.1"
        && !header("connection").is_some_and(|v| v.contains("close"));
    Ok((
        Response {
            status,
            headers: response_headers,
            body,
            ttfb,
            elapsed: started.elapsed(),
        },
        keep,
    ))
}

fn read_line(conn: &mut BufReader<TcpStream>, line: &mut String) -> io::Result<()> {
    line.clear();
    if conn.read_line(line)? == 0 {
        return Err(eof("the connection closed mid-response"));
    }
    Ok(())
}

fn eof(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::UnexpectedEof, what)
}
