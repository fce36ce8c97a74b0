//! The built binary under `cdn-operator run`, against a small fake API server on loopback (no
//! real API server can be installed here): probes and metrics over real HTTP, metrics over HTTPS
//! behind TokenReview and SubjectAccessReview, promtool on the
//! exposition, leader election through the Lease endpoints, traces to the OTLP test receiver,
//! SIGTERM and SIGINT, lease loss, bad flags and an unreachable API server.
//!
//! One test binary; what the tests stand on (the fake API server, the launcher, the OTLP
//! receiver and its TLS front) apart from the tests, which are grouped by concern.

mod fake_api;
mod launch;
mod otlp;

mod allocator;
mod election;
mod image;
mod kubebuilder_flags;
mod probes_and_metrics;
mod secure_metrics;
mod shutdown;
mod start_failures;
mod traces;
