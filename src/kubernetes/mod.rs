//! The Kubernetes plumbing every controller uses, domain-free: the client, the one write path
//! and the caches that let it skip writes, what a failed request tells, Events, and the
//! restricted Pod Security settings.

pub mod apply;
pub mod arrivals;
pub mod cache;
pub(crate) mod client;
pub mod compact;
pub mod errors;
pub mod events;
pub mod fields;
pub mod index;
pub mod problems;
pub mod record;
pub mod records;
pub(crate) mod restricted;
