//! `rest_client_requests_total{verb, resource, code}`: every request a controller's client sends
//! to the API server, named as the server's audit log names it (`patch configmaps`, `watch
//! cdnclusters`, `patch cdnclusters/status`), counted by the answer's status code (`<error>`
//! when none came). client-go counts requests under this name by method and host; the verb and
//! resource tell a controller's writes from its reads, which is what an operator is judged on
//! (writes per object, none at steady state).

use futures::future::BoxFuture;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use std::task::{Context, Poll};
use tower::{Layer, Service};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RequestLabels {
    verb: String,
    resource: String,
    code: String,
}

/// The counters, by verb, resource and code.
pub(crate) type Requests = Family<RequestLabels, Counter>;

/// A tower layer counting each request of the client it wraps (kube's `ClientBuilder::with_layer`).
#[derive(Clone)]
pub struct CountRequests {
    pub(crate) requests: Requests,
}

impl<S> Layer<S> for CountRequests {
    type Service = Counted<S>;

    fn layer(&self, inner: S) -> Counted<S> {
        Counted {
            inner,
            requests: self.requests.clone(),
        }
    }
}

/// A client service whose requests are counted.
#[derive(Clone)]
pub struct Counted<S> {
    inner: S,
    requests: Requests,
}

impl<S, B, R> Service<http::Request<B>> for Counted<S>
where
    S: Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let uri = request.uri();
        let (verb, resource) = classify(request.method(), uri.path(), uri.query());
        let requests = self.requests.clone();
        let answer = self.inner.call(request);
        Box::pin(async move {
            let result = answer.await;
            // A watch is counted once, when its answer starts.
            let code = match &result {
                Ok(response) => response.status().as_u16().to_string(),
                Err(_) => "<error>".to_string(),
            };
            requests
                .get_or_create(&RequestLabels {
                    verb: verb.into(),
                    resource,
                    code,
                })
                .inc();
            result
        })
    }
}

/// A request as the API server's audit log names it: its verb (`get`, `list`, `watch`, `create`,
/// `update`, `patch`, `delete`) and its resource (`configmaps`, `cdnclusters/status`); a path
/// outside the resource API (`/version`) is its own resource, with the method as verb.
pub fn classify(method: &http::Method, path: &str, query: Option<&str>) -> (&'static str, String) {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    // /api/v1/... or /apis/<group>/<version>/...
    let rest: &[&str] = match segments.as_slice() {
        ["api", _version, rest @ ..] => rest,
        ["apis", _group, _version, rest @ ..] => rest,
        _ => return (method_verb(method), path.to_string()),
    };
    let rest = match rest {
        ["namespaces", _ns, tail @ ..] if !tail.is_empty() => tail,
        other => other,
    };
    let (resource, named) = match rest {
        [resource] => (resource.to_string(), false),
        [resource, _name] => (resource.to_string(), true),
        [resource, _name, sub, ..] => (format!("{resource}/{sub}"), true),
        [] => ("namespaces".into(), false),
    };
    let watch = query.is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"));
    let verb = match *method {
        http::Method::GET if watch => "watch",
        http::Method::GET if named => "get",
        http::Method::GET => "list",
        http::Method::POST => "create",
        http::Method::PATCH => "patch",
        http::Method::PUT => "update",
        http::Method::DELETE => "delete",
        _ => "other",
    };
    (verb, resource)
}

fn method_verb(method: &http::Method) -> &'static str {
    match *method {
        http::Method::GET => "get",
        http::Method::POST => "post",
        http::Method::PUT => "put",
        http::Method::PATCH => "patch",
        http::Method::DELETE => "delete",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;
    use http::Method;
    use tower::ServiceExt;

    #[test]
    fn requests_are_named_as_audit_logs_name_them() {
        let cases = [
            (
                Method::GET,
                "/api/v1/configmaps",
                Some("labelSelector=x"),
                "list configmaps",
            ),
            (
                Method::GET,
                "/api/v1/configmaps",
                Some("watch=true&resourceVersion=1"),
                "watch configmaps",
            ),
            (
                Method::PATCH,
                "/api/v1/namespaces/a/configmaps/b-nginx",
                Some("fieldManager=cdn-operator&force=true"),
                "patch configmaps",
            ),
            (
                Method::PATCH,
                "/apis/cluster.anevia.com/v1/namespaces/a/cdnclusters/b/status",
                None,
                "patch cdnclusters/status",
            ),
            (
                Method::POST,
                "/apis/events.k8s.io/v1/namespaces/a/events",
                None,
                "create events",
            ),
            (
                Method::GET,
                "/apis/coordination.k8s.io/v1/namespaces/a/leases/l",
                None,
                "get leases",
            ),
            (
                Method::PUT,
                "/api/v1/namespaces/a",
                None,
                "update namespaces",
            ),
            (
                Method::DELETE,
                "/api/v1/namespaces/a/services/s",
                None,
                "delete services",
            ),
            (Method::GET, "/version", None, "get /version"),
        ];
        for (method, path, query, want) in cases {
            let (verb, resource) = classify(&method, path, query);
            assert_eq!(format!("{verb} {resource}"), want, "{method} {path}");
        }
    }

    #[tokio::test]
    async fn each_request_is_counted_by_verb_resource_and_code() {
        let metrics = Metrics::new();
        let layer = metrics.count_requests();
        // A server answering 201 to creations, 404 to reads, and failing deletions outright.
        let server = tower::service_fn(|request: http::Request<()>| async move {
            match *request.method() {
                Method::POST => Ok(http::Response::builder().status(201).body(()).unwrap()),
                Method::DELETE => Err("connection reset"),
                _ => Ok(http::Response::builder().status(404).body(()).unwrap()),
            }
        });
        let mut client = layer.layer(server);
        let send = |method: Method, path: &str| {
            http::Request::builder()
                .method(method)
                .uri(path)
                .body(())
                .unwrap()
        };
        for _ in 0..2 {
            let request = send(Method::POST, "/api/v1/namespaces/a/configmaps");
            client.ready().await.unwrap().call(request).await.unwrap();
        }
        let request = send(Method::GET, "/api/v1/namespaces/a/configmaps/x");
        client.ready().await.unwrap().call(request).await.unwrap();
        let request = send(Method::DELETE, "/api/v1/namespaces/a/services/s");
        assert!(client.ready().await.unwrap().call(request).await.is_err());

        let text = metrics.encode();
        for line in [
            "# TYPE rest_client_requests counter",
            "rest_client_requests_total{verb=\"create\",resource=\"configmaps\",code=\"201\"} 2",
            "rest_client_requests_total{verb=\"get\",resource=\"configmaps\",code=\"404\"} 1",
            "rest_client_requests_total{verb=\"delete\",resource=\"services\",code=\"<error>\"} 1",
        ] {
            assert!(text.contains(line), "{line} missing in\n{text}");
        }
    }
}
