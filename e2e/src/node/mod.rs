//! The node mode of the end-to-end suite (issue 39): the operator installed from its own image
//! (Helm, kustomize) into a cluster with a Ready node, and the CDN's nginx pods serving through
//! Services. What `e2e/tests/node.rs`, `rollouts.rs`, `persistent_caches.rs` and `monitoring.rs` share: the skip (no cluster, no Ready node, no images),
//! fresh namespaces under restricted Pod Security, `helm` and `kubectl` (the user's tools, their
//! exit status checked and their stderr shown), the operator's pods and Lease, `/metrics`
//! through its Service, plain HTTP to a Service's ClusterIP, and a guard that prints the pods'
//! state and logs when a test fails and uninstalls and deletes what the test made, also then.
//!
//! Split by concern; each file says what it holds and which others it uses (none uses a file
//! above it): `tools`, `image`, `wait`, `probe` and `origin` stand alone, `load` (a client like wrk) uses `origin`, `cdn_cluster` uses
//! `wait`, `world` (the [`NodeTest`]) uses `image`, `tools` and `wait`, `operator` uses
//! `probe`, `wait` and `world`, and `storage` (the node's volumes) uses `world`. Everything is re-exported here, so the paths stay
//! `cdn_operator_e2e::node::…`.

mod cdn_cluster;
mod image;
mod load;
mod operator;
mod origin;
mod probe;
mod storage;
mod tools;
mod wait;
mod world;

pub use cdn_cluster::{apply_cluster, cluster_pods, cluster_running};
pub use image::{ImageRef, NGINX_IMAGE_ENV, OPERATOR_IMAGE_ENV, PAUSE_IMAGE_ENV, ROOT_IMAGE_ENV};
pub use load::{Counters, Load, Snapshot};
pub use operator::{
    bind_cluster_role, check_metrics, lease_holder, operator_ready_and_leading, service_account,
    token, token_valid_for, INSTALL_WAIT, LEASE, OPERATOR_PODS, OPERATOR_REPLICAS,
};
pub use origin::{
    apply_origin, big_body, origin_log, origin_requests, origin_requests_matching, OriginRequest,
    ORIGIN_BIG_BYTES, ORIGIN_BODY, ORIGIN_PODS, ORIGIN_POD_HEADER,
};
pub use probe::{answering_upstream, http_get, service_address};
pub use storage::{local_volumes, Backing, VOLUME_DIR_ENV};
pub use tools::{diagnostics, helm, relative_path, run, TOOL_TIMEOUT};
pub use wait::{node_ready, pod_ready, pods_gone, ready_pods, until};
pub use world::{NodeTest, Release, Scope};
