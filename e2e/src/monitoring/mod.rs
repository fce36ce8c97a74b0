//! The monitoring as users run it (issue 52): what the Prometheus Operator would make of the
//! shipped ServiceMonitor and PodMonitor (`scrape`), the Kubernetes targets for a Prometheus
//! built without Kubernetes discovery (`discovery`), the shipped alert rules time-scaled and the
//! dashboards' queries as Grafana sends them (`rules`, `duration`, `dashboards`), and that
//! Prometheus with its Alertmanager, run on this machine (`prometheus`).

pub mod dashboards;
pub mod discovery;
pub mod duration;
pub mod prometheus;
pub mod rules;
pub mod scrape;
