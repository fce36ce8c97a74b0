//! What the operator's tests (`tests/`) and its end-to-end suite (`e2e/`) both need to drive the
//! built binary from outside: a handle on the process that captures its output, HTTP on
//! loopback, reading a Prometheus exposition, polling, and races on the API server; and to run
//! the nginx the pods run (nginx 1.30 in a root of its own) with a DNS server of the test's.
//!
//! It does not depend on `cdn-operator`, so the root package can take it as a dev-dependency.

pub mod dns;
pub mod http;
pub mod metrics;
pub mod nginx;
pub mod process;
pub mod race;
pub mod wait;

pub use dns::{Dns, Records};
pub use http::{
    free_port, http_get, http_get_accepting, https_get, request, tls_certificate, KeepAlive, Reply,
    Response,
};
pub use metrics::{has_line, metric_sum, promtool_check_metrics, sample};
pub use nginx::{Nginx, Sandbox};
pub use process::{
    run_with_stdin, Operator, Signal, Switches, Usage, SIGINT, SIGKILL, SIGQUIT, SIGTERM,
};
pub use race::racing;
pub use wait::{blocking, eventually, on_own_thread, poll, settle};
