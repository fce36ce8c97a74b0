//! The tests' origin: an nginx Deployment and Service in the test's namespace serving fixed,
//! versioned and tagged objects and logging every request, so a test can count what reached it.
//! Depends on no other file of `node`.

use crate::USER_MANAGER;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{Api, Patch, PatchParams};
use kube::Client;
use serde_json::json;

/// The body the tests' origin serves for every `/vod/` path (a static file: ranges answer 206,
/// as the caches' slices ask).
pub const ORIGIN_BODY: &str = "node-e2e origin body: the same bytes for every /vod/ path\n";
/// The size of the objects the origin serves under `/big/` (the same file for every path), as
/// small video segments: long enough on the wire that a request cut shows.
pub const ORIGIN_BIG_BYTES: usize = 60 * 1024;
/// The header naming the origin pod that served a response (nginx's `$hostname`: the pod's name).
pub const ORIGIN_POD_HEADER: &str = "X-Origin-Pod";
/// The origin's pods.
pub const ORIGIN_PODS: &str = "app=origin";

/// The origin's nginx.conf: every request logged on stdout as `origin-request <method> <path>
/// <status> <bytes sent>`; `/fail/*` 503, as an origin failing; `/vod/*` the same static file; `/big/*` one of [`ORIGIN_BIG_BYTES`]; `/pv/*` a body naming the version asked for
/// (`X-Version`), `/pt/TAG/*` tagged `Surrogate-Key: TAG`; `/healthz` for the probe. Runs read-only as the
/// image's user: the pid file and nginx's temporary paths under the `/tmp` emptyDir.
const ORIGIN_CONF: &str = r#"# The origin of the node tests (e2e/src/node/origin.rs).
pid /tmp/nginx.pid;
worker_processes 1;
error_log stderr notice;
events {
    worker_connections 256;
}
http {
    client_body_temp_path /tmp/client_body;
    proxy_temp_path /tmp/proxy;
    fastcgi_temp_path /tmp/fastcgi;
    uwsgi_temp_path /tmp/uwsgi;
    scgi_temp_path /tmp/scgi;
    # $request_uri: the path asked for ($uri is /body.ts once try_files found it).
    log_format origin 'origin-request $request_method $request_uri $status $bytes_sent';
    map $http_x_version $version {
        "" 1;
        default $http_x_version;
    }
    access_log /dev/stdout origin;
    server {
        listen 8080;
        root /etc/nginx/origin;
        default_type video/mp2t;
        add_header X-Origin-Pod $hostname always;
        location = /healthz {
            access_log off;
            return 200 "ok
";
        }
        location /vod/ {
            try_files /body.ts =404;
        }
        location /big/ {
            try_files /big.ts =404;
        }
        # Versioned objects (the purge test): the body names the version the request asks for in
        # X-Version (1 without), as an origin that published a new version.
        location /pv/ {
            default_type text/plain;
            return 200 "v$version $uri
";
        }
        # Tagged objects (the purge test): Surrogate-Key names the tag in the path.
        location ~ ^/pt/(?<tag>[^/]+)/ {
            default_type text/plain;
            add_header Surrogate-Key $tag;
            return 200 "tagged $uri
";
        }
        location /fail/ {
            return 503;
        }
        location / {
            return 404;
        }
    }
}
"#;

/// Applies the origin of `ns` (server-side, idempotent): ConfigMap `origin` (its nginx.conf and
/// body), Deployment `origin` (one pod of `image` meeting the restricted Pod Security standard:
/// non-root, seccomp RuntimeDefault, no capability, no privilege escalation, read-only root
/// filesystem with an emptyDir on /tmp) and Service `origin` port 8080.
pub async fn apply_origin(client: &Client, ns: &str, image: &str) {
    let params = PatchParams::apply(USER_MANAGER);
    let config_map: k8s_openapi::api::core::v1::ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "origin"},
        "data": {"nginx.conf": ORIGIN_CONF, "body.ts": ORIGIN_BODY, "big.ts": big_body()},
    }))
    .expect("a ConfigMap");
    Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), ns)
        .patch("origin", &params, &Patch::Apply(&config_map))
        .await
        .unwrap_or_else(|e| panic!("ConfigMap {ns}/origin: {e}"));
    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "origin"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "origin"}},
            "template": {
                "metadata": {"labels": {"app": "origin"}},
                "spec": {
                    "automountServiceAccountToken": false,
                    "securityContext": {
                        "runAsNonRoot": true,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [{
                        "name": "origin",
                        "image": image,
                        "imagePullPolicy": "IfNotPresent",
                        "command": ["nginx", "-e", "stderr", "-c", "/etc/nginx/origin/nginx.conf",
                                    "-g", "daemon off;"],
                        "ports": [{"name": "http", "containerPort": 8080}],
                        "readinessProbe": {
                            "httpGet": {"path": "/healthz", "port": "http"},
                            "periodSeconds": 2,
                        },
                        "resources": {
                            "requests": {"cpu": "10m", "memory": "16Mi"},
                            "limits": {"memory": "64Mi"},
                        },
                        "securityContext": {
                            "allowPrivilegeEscalation": false,
                            "readOnlyRootFilesystem": true,
                            "runAsNonRoot": true,
                            "capabilities": {"drop": ["ALL"]},
                            "seccompProfile": {"type": "RuntimeDefault"},
                        },
                        "volumeMounts": [
                            {"name": "conf", "mountPath": "/etc/nginx/origin", "readOnly": true},
                            {"name": "tmp", "mountPath": "/tmp"},
                        ],
                    }],
                    "volumes": [
                        {"name": "conf", "configMap": {"name": "origin"}},
                        {"name": "tmp", "emptyDir": {}},
                    ],
                },
            },
        },
    }))
    .expect("a Deployment");
    Api::<Deployment>::namespaced(client.clone(), ns)
        .patch("origin", &params, &Patch::Apply(&deployment))
        .await
        .unwrap_or_else(|e| panic!("Deployment {ns}/origin: {e}"));
    let service: Service = serde_json::from_value(json!({
        "metadata": {"name": "origin"},
        "spec": {
            "selector": {"app": "origin"},
            "ports": [{"name": "http", "port": 8080, "targetPort": "http"}],
        },
    }))
    .expect("a Service");
    Api::<Service>::namespaced(client.clone(), ns)
        .patch("origin", &params, &Patch::Apply(&service))
        .await
        .unwrap_or_else(|e| panic!("Service {ns}/origin: {e}"));
}

/// The body of every `/big/` object: [`ORIGIN_BIG_BYTES`] of text.
pub fn big_body() -> String {
    "0123456789abcdef".repeat(ORIGIN_BIG_BYTES / 16)
}

/// One request the origin logged.
#[derive(Clone, Debug, PartialEq)]
pub struct OriginRequest {
    pub method: String,
    pub path: String,
    pub status: u16,
    /// What it sent, headers and body: what the cache that asked received.
    pub bytes: u64,
}

/// Every request origin pod `pod` of `ns` logged, in order.
pub async fn origin_log(client: &Client, ns: &str, pod: &str) -> Vec<OriginRequest> {
    let params = kube::api::LogParams {
        container: Some("origin".into()),
        ..Default::default()
    };
    let logs = Api::<Pod>::namespaced(client.clone(), ns)
        .logs(pod, &params)
        .await
        .unwrap_or_else(|e| panic!("logs of {ns}/{pod}: {e}"));
    logs.lines()
        .filter_map(|l| {
            let mut fields = l.strip_prefix("origin-request ")?.split(' ');
            Some(OriginRequest {
                method: fields.next()?.into(),
                path: fields.next()?.into(),
                status: fields.next()?.parse().ok()?,
                bytes: fields.next()?.parse().ok()?,
            })
        })
        .collect()
}

/// How many GETs of `path` origin pod `pod` of `ns` logged.
pub async fn origin_requests(client: &Client, ns: &str, pod: &str, path: &str) -> usize {
    origin_log(client, ns, pod)
        .await
        .iter()
        .filter(|r| r.method == "GET" && r.path == path)
        .count()
}

/// How many GETs of a path starting with `prefix` origin pod `pod` of `ns` logged.
pub async fn origin_requests_matching(client: &Client, ns: &str, pod: &str, prefix: &str) -> usize {
    origin_log(client, ns, pod)
        .await
        .iter()
        .filter(|r| r.method == "GET" && r.path.starts_with(prefix))
        .count()
}
