//! HTTPS to the generated nginx, as clients reach an edge: a CA of the test's and the server
//! certificates it issues (rcgen), the files of a `kubernetes.io/tls` Secret, HTTP/2 over TLS
//! negotiated by ALPN (h2 over tokio-rustls, the client verifying the chain and the name), and a
//! bare ClientHello of a chosen protocol version, to see which versions a server accepts (rustls
//! speaks nothing older than TLS 1.2).

use cdn_operator_testkit::Response;
use rustls::pki_types::{CertificateDer, ServerName};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

/// How long a connection, a request or a read may take.
const PATIENCE: Duration = Duration::from_secs(30);

/// A certificate authority of the test's.
pub struct Ca {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    /// Its certificate, which clients trust.
    pub der: CertificateDer<'static>,
    pem: String,
}

/// A server certificate and its key, as a `kubernetes.io/tls` Secret holds them.
pub struct ServerCertificate {
    /// The certificate nginx must present (DER).
    pub der: Vec<u8>,
    /// `tls.crt`: the certificate, then its issuer's (as cert-manager writes the chain).
    pub chain_pem: String,
    /// `tls.key`.
    pub key_pem: String,
}

impl Ca {
    pub fn new(name: &str) -> Ca {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key).unwrap();
        Ca {
            der: cert.der().clone(),
            pem: cert.pem(),
            issuer: rcgen::Issuer::new(params, key),
        }
    }

    /// A certificate for the DNS name `host`, its subject's common name `common_name`, serial
    /// number `serial`, with a key of its own (as a renewal with cert-manager's
    /// `rotationPolicy: Always`), signed by this CA. It names no OCSP responder.
    pub fn issue(&self, host: &str, common_name: &str, serial: u64) -> ServerCertificate {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec![host.to_string()]).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, common_name);
        params.serial_number = Some(serial.into());
        params.use_authority_key_identifier_extension = true;
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        ServerCertificate {
            der: cert.der().to_vec(),
            chain_pem: format!("{}{}", cert.pem(), self.pem),
            key_pem: key.serialize_pem(),
        }
    }
}

impl ServerCertificate {
    /// The Secret's data: `tls.crt` and `tls.key`.
    pub fn secret_data(&self) -> [(&'static str, &str); 2] {
        [("tls.crt", &self.chain_pem), ("tls.key", &self.key_pem)]
    }
}

/// One HTTP/2 connection over TLS, as a browser or a player opens it.
pub struct H2 {
    runtime: tokio::runtime::Runtime,
    send: h2::client::SendRequest<bytes::Bytes>,
    host: String,
    /// The certificate the server presented (DER).
    pub certificate: Vec<u8>,
    /// The protocol version and cipher suite negotiated.
    pub version: rustls::ProtocolVersion,
    pub suite: rustls::CipherSuite,
}

/// A response whose body is being read: [`H2::read`], then [`H2::finish`].
pub struct Download {
    response: Response,
    body: h2::RecvStream,
    received: Vec<u8>,
}

impl Download {
    /// The bytes of the body received so far.
    pub fn received(&self) -> usize {
        self.received.len()
    }
}

impl H2 {
    /// Connects to `addr` for the site `host`, offering TLS `versions` and ALPN `h2` only, trusting
    /// `ca`: fails unless the server proves a certificate of `ca` for `host` and agrees on h2.
    pub fn connect(
        addr: &str,
        host: &str,
        ca: &Ca,
        versions: &[&'static rustls::SupportedProtocolVersion],
    ) -> std::io::Result<H2> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.der.clone()).map_err(std::io::Error::other)?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        // A configuration of its own: no session of another connection is resumed, so the
        // server sends its certificate on each.
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(versions)
            .map_err(std::io::Error::other)?
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"h2".to_vec()];
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let name = ServerName::try_from(host.to_string()).map_err(std::io::Error::other)?;
        let addr = addr.to_string();
        let (send, certificate, version, suite) = runtime.block_on(async {
            let connect = async {
                let tcp = tokio::net::TcpStream::connect(&addr).await?;
                let tls = connector.connect(name, tcp).await?;
                let (_, session) = tls.get_ref();
                let alpn = session.alpn_protocol().map(<[u8]>::to_vec);
                if alpn.as_deref() != Some(b"h2") {
                    return Err(std::io::Error::other(format!(
                        "ALPN: the server chose {:?}, not h2",
                        alpn.map(|a| String::from_utf8_lossy(&a).into_owned())
                    )));
                }
                let certificate = session
                    .peer_certificates()
                    .and_then(|chain| chain.first())
                    .map(|c| c.to_vec())
                    .unwrap_or_default();
                let version = session.protocol_version().unwrap();
                let suite = session.negotiated_cipher_suite().unwrap().suite();
                let (send, connection) = h2::client::handshake(tls)
                    .await
                    .map_err(std::io::Error::other)?;
                tokio::spawn(async move {
                    let _ = connection.await;
                });
                Ok((send, certificate, version, suite))
            };
            tokio::time::timeout(PATIENCE, connect)
                .await
                .map_err(std::io::Error::other)?
        })?;
        Ok(H2 {
            runtime,
            send,
            host: host.to_string(),
            certificate,
            version,
            suite,
        })
    }

    /// GET `path` with `headers`, read to its end.
    pub fn get(&self, path: &str, headers: &[(&str, &str)]) -> std::io::Result<Response> {
        let mut download = self.start(path, headers)?;
        self.read(&mut download, usize::MAX)?;
        Ok(self.finish(download))
    }

    /// GET `path` with `headers`: the status and headers, the body left to read.
    pub fn start(&self, path: &str, headers: &[(&str, &str)]) -> std::io::Result<Download> {
        let mut request = http::Request::get(format!("https://{}{path}", self.host));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request.body(()).map_err(std::io::Error::other)?;
        let send = self.send.clone();
        self.runtime.block_on(async {
            let exchange = async {
                let mut send = send.ready().await?;
                let (response, _) = send.send_request(request, true)?;
                response.await
            };
            let response = tokio::time::timeout(PATIENCE, exchange)
                .await
                .map_err(std::io::Error::other)?
                .map_err(std::io::Error::other)?;
            let (head, body) = response.into_parts();
            let headers = head
                .headers
                .iter()
                .map(|(n, v)| (n.to_string(), String::from_utf8_lossy(v.as_bytes()).into()))
                .collect();
            Ok(Download {
                response: Response {
                    status: head.status.as_u16(),
                    headers,
                    body: String::new(),
                },
                body,
                received: Vec::new(),
            })
        })
    }

    /// Reads `download`'s body until `more` bytes more came, or its end; whether it ended.
    pub fn read(&self, download: &mut Download, more: usize) -> std::io::Result<bool> {
        let until = download.received.len().saturating_add(more);
        self.runtime.block_on(async {
            while download.received.len() < until {
                let chunk = tokio::time::timeout(PATIENCE, download.body.data())
                    .await
                    .map_err(std::io::Error::other)?;
                match chunk {
                    None => return Ok(true),
                    Some(chunk) => {
                        let chunk = chunk.map_err(std::io::Error::other)?;
                        download.received.extend_from_slice(&chunk);
                        // Flow control: the server may send as much again.
                        let _ = download.body.flow_control().release_capacity(chunk.len());
                    }
                }
            }
            Ok(download.body.is_end_stream())
        })
    }

    /// The response, its body what was read.
    pub fn finish(&self, download: Download) -> Response {
        Response {
            body: String::from_utf8_lossy(&download.received).into_owned(),
            ..download.response
        }
    }
}

/// What a server answers a ClientHello.
#[derive(Debug, PartialEq, Eq)]
pub enum Hello {
    /// A ServerHello agreeing on this protocol version (0x0303 for TLS 1.2, 0x0302 for TLS 1.1).
    Accepted(u16),
    /// An alert: its description (70: protocol_version).
    Alert(u8),
    /// The connection closed, or something else came.
    Other(String),
}

/// The alert a server sends a client whose protocol version it does not speak.
pub const PROTOCOL_VERSION_ALERT: u8 = 70;

/// Sends a ClientHello of protocol `version` (0x0302: TLS 1.1, 0x0303: TLS 1.2; without the
/// supported_versions extension, so TLS 1.3 is not offered) for `host` to `addr`, offering the
/// ECDHE suites of TLS 1.2 (AEAD) and of TLS 1.0 and 1.1 (CBC), and says what the server
/// answered. The same hello of version 0x0303 is accepted by a server of TLS 1.2: a refusal of
/// 0x0302 is the version's.
pub fn client_hello(addr: &str, host: &str, version: u16) -> Hello {
    let mut stream = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    stream
        .write_all(&client_hello_record(host, version))
        .unwrap();
    let mut header = [0u8; 5];
    if let Err(e) = stream.read_exact(&mut header) {
        return Hello::Other(format!("no answer: {e}"));
    }
    let mut record = vec![0u8; usize::from(u16::from_be_bytes([header[3], header[4]]))];
    if let Err(e) = stream.read_exact(&mut record) {
        return Hello::Other(format!("a short record: {e}"));
    }
    match (header[0], record.as_slice()) {
        // A handshake record starting with a ServerHello: type 2, length (3 bytes), version.
        (0x16, [2, _, _, _, major, minor, ..]) => {
            Hello::Accepted(u16::from_be_bytes([*major, *minor]))
        }
        // An alert: level, description.
        (0x15, [_, description, ..]) => Hello::Alert(*description),
        (kind, data) => Hello::Other(format!("record type {kind}: {data:02x?}")),
    }
}

fn client_hello_record(host: &str, version: u16) -> Vec<u8> {
    fn extension(out: &mut Vec<u8>, kind: u16, data: &[u8]) {
        out.extend(kind.to_be_bytes());
        out.extend((data.len() as u16).to_be_bytes());
        out.extend(data);
    }
    let mut body = Vec::new();
    body.extend(version.to_be_bytes());
    body.extend([0x5a; 32]); // random
    body.push(0); // no session id
    let suites: [u16; 12] = [
        0xc02b, 0xc02f, 0xc02c, 0xc030, 0xcca9, 0xcca8, // ECDHE, AEAD: TLS 1.2
        0xc009, 0xc013, 0xc00a, 0xc014, // ECDHE, CBC-SHA: TLS 1.0 to 1.2
        0x002f, 0x0035, // RSA, CBC-SHA
    ];
    body.extend((2 * suites.len() as u16).to_be_bytes());
    for suite in suites {
        body.extend(suite.to_be_bytes());
    }
    body.extend([1, 0]); // compression: none
    let mut extensions = Vec::new();
    let mut name = vec![0u8]; // host_name
    name.extend((host.len() as u16).to_be_bytes());
    name.extend(host.as_bytes());
    let mut list = (name.len() as u16).to_be_bytes().to_vec();
    list.extend(name);
    extension(&mut extensions, 0x0000, &list); // server_name
    extension(&mut extensions, 0x000a, &[0, 4, 0, 0x17, 0, 0x1d]); // groups: P-256, X25519
    extension(&mut extensions, 0x000b, &[1, 0]); // point formats: uncompressed
                                                 // Signature algorithms: ECDSA P-256 SHA-256, RSA-PSS SHA-256, RSA SHA-256, then the SHA-1
                                                 // ones of older versions.
    extension(
        &mut extensions,
        0x000d,
        &[0, 10, 4, 3, 8, 4, 4, 1, 2, 3, 2, 1],
    );
    body.extend((extensions.len() as u16).to_be_bytes());
    body.extend(extensions);
    let mut handshake = vec![1]; // ClientHello
    handshake.extend(&(body.len() as u32).to_be_bytes()[1..]);
    handshake.extend(body);
    let mut record = vec![0x16, 3, 1]; // handshake, record version TLS 1.0 as clients write it
    record.extend((handshake.len() as u16).to_be_bytes());
    record.extend(handshake);
    record
}
