//! Plain HTTP to the CDN from this host: a Service's ClusterIP (reached through kube-proxy), one
//! HTTP/1.0 GET, and which member of a pool answered. Depends on no other file of `node`.

use cdn_operator_testkit::http::{Response, REQUEST_TIMEOUT};
use k8s_openapi::api::core::v1::Service;
use kube::api::Api;
use kube::Client;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::Duration;

/// The address of Service `name` of `ns` on its port `port_name`: its ClusterIP, which this host
/// reaches through kube-proxy.
pub async fn service_address(client: &Client, ns: &str, name: &str, port_name: &str) -> SocketAddr {
    let service = Api::<Service>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .unwrap_or_else(|e| panic!("Service {ns}/{name}: {e}"));
    let spec = service.spec.expect("the Service's spec");
    let ip: IpAddr = spec
        .cluster_ip
        .as_deref()
        .and_then(|ip| ip.parse().ok())
        .unwrap_or_else(|| {
            panic!(
                "Service {ns}/{name} has no ClusterIP: {:?}",
                spec.cluster_ip
            )
        });
    let port = spec
        .ports
        .unwrap_or_default()
        .into_iter()
        .find(|p| p.name.as_deref() == Some(port_name))
        .unwrap_or_else(|| panic!("Service {ns}/{name} has no port {port_name}"))
        .port;
    SocketAddr::new(ip, port as u16)
}

/// One plain HTTP/1.0 GET of `path` from `addr` (a Service's ClusterIP), the connection
/// closed by the server after the response: at most 3 s to connect, [`REQUEST_TIMEOUT`] to
/// answer (above the proxies' own timeouts). Runs on a thread of its own.
pub async fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<Response> {
    let path = path.to_string();
    tokio::task::spawn_blocking(move || {
        let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(3))?;
        stream.set_read_timeout(Some(REQUEST_TIMEOUT))?;
        write!(
            stream,
            "GET {path} HTTP/1.0\r\nHost: cdn.node-e2e.test\r\nUser-Agent: cdn-operator-e2e\r\n\r\n"
        )?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw)?;
        Response::parse(&raw)
    })
    .await
    .expect("the HTTP client")
}

/// The member of a pool that answered, from `X-Cdn-Upstream` (`$upstream_addr`: the addresses
/// tried, separated by `, ` within a group and ` : ` across groups; the last one answered).
pub fn answering_upstream(response: &Response) -> Option<String> {
    let value = response.header(cdn_operator::cdncluster::nginx::UPSTREAM_HEADER)?;
    value
        .split(", ")
        .flat_map(|part| part.split(" : "))
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .last()
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_answering_member_is_the_last_address() {
        let response = |value: &str| Response {
            status: 200,
            headers: vec![("X-Cdn-Upstream".into(), value.into())],
            body: String::new(),
        };
        assert_eq!(
            answering_upstream(&response("10.88.0.5:8080")).as_deref(),
            Some("10.88.0.5:8080")
        );
        assert_eq!(
            answering_upstream(&response("10.88.0.5:8080, 10.88.0.6:8080")).as_deref(),
            Some("10.88.0.6:8080")
        );
        assert_eq!(
            answering_upstream(&response("10.88.0.5:8080 : 10.88.0.7:8080")).as_deref(),
            Some("10.88.0.7:8080")
        );
    }

    #[test]
    fn a_response_is_parsed_with_its_headers() {
        let raw = b"HTTP/1.1 200 OK\r\nX-Cache-Status: MISS\r\nContent-Length: 3\r\n\r\nabc";
        let response = Response::parse(raw).unwrap();
        assert_eq!(response.status, 200);
        assert_eq!(response.header("x-cache-status"), Some("MISS"));
        assert_eq!(response.body, "abc");
    }
}
