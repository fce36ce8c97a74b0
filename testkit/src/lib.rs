//! What the operator's tests (`tests/`) and its end-to-end suite (`e2e/`) both need to drive the
//! built binary from outside: a handle on the process that captures its output, HTTP on
//! loopback, reading a Prometheus exposition, polling, and races on the API server.
//!
//! It does not depend on `cdn-operator`, so the root package can take it as a dev-dependency.

pub mod http;
pub mod metrics;
pub mod process;
pub mod race;
pub mod wait;

pub use http::{free_port, http_get, http_get_accepting, https_get, tls_certificate, Reply};
pub use metrics::{has_line, metric_sum, sample};
pub use process::{run_with_stdin, Operator, Signal, Switches, Usage, SIGINT, SIGTERM};
pub use race::racing;
pub use wait::{blocking, eventually, on_own_thread, poll};
