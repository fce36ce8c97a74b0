//! The production runtime around the controllers: leader election, probes over HTTP, metrics over
//! HTTPS behind the API server's authentication and authorization,
//! traces and logs, shutdown. Nothing here knows CdnCluster or At: this crate depends on nothing
//! of the operator, whose `run` module glues the two.

pub mod access;
pub mod client_metrics;
pub mod http;
pub mod instrument;
pub mod leader;
pub mod logs;
pub mod metrics;
pub mod process;
pub mod shutdown;
pub mod telemetry;
pub mod tls;
pub mod trust;

/// A duration flag that is not one.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("`{value}` is not a duration like 15s, 500ms or 1m30s ({reason})")]
    NotADuration { value: String, reason: String },
    #[error("`{0}` is negative")]
    Negative(String),
}

/// Parses a duration flag the way Go and kubebuilder operators write them (`15s`, `500ms`,
/// `1m30s`), also accepting ISO 8601 (`PT15S`). Negative durations are refused.
pub fn parse_duration(value: &str) -> Result<std::time::Duration, DurationError> {
    let parsed: jiff::SignedDuration =
        value
            .trim()
            .parse()
            .map_err(|e: jiff::Error| DurationError::NotADuration {
                value: value.to_string(),
                reason: e.to_string(),
            })?;
    std::time::Duration::try_from(parsed).map_err(|_| DurationError::Negative(value.to_string()))
}

#[cfg(test)]
mod tests {
    use super::parse_duration;
    use std::time::Duration;

    #[test]
    fn durations_parse_like_go_flags() {
        assert_eq!(parse_duration("15s"), Ok(Duration::from_secs(15)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("PT2S"), Ok(Duration::from_secs(2)));
        assert!(parse_duration("fifteen")
            .unwrap_err()
            .to_string()
            .contains("not a duration"));
        assert!(parse_duration("-1s")
            .unwrap_err()
            .to_string()
            .contains("negative"));
        assert!(parse_duration("").is_err());
    }
}
