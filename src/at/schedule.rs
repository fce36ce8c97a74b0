//! `spec.schedule`: when an At runs. Pure.

use jiff::Timestamp;
use std::time::Duration;

/// Parses a schedule: an RFC 3339 time with an offset, such as the seed's
/// `2019-04-12T10:12:00Z` (UTC) or `2019-04-12T12:12:00+02:00`. A time without an offset is
/// refused: it would depend on the operator's time zone. The error is a sentence for the user,
/// quoting what they wrote.
pub fn parse(schedule: &str) -> Result<Timestamp, String> {
    schedule.parse::<Timestamp>().map_err(|error| {
        format!(
            "spec.schedule {schedule:?} is not an RFC 3339 time such as 2019-04-12T10:12:00Z or \
             2019-04-12T12:12:00+02:00: {error}"
        )
    })
}

/// The longest the controller sleeps before looking at a PENDING At again. A far schedule is
/// re-checked once a day: the timer queue cannot hold delays of years, and a monotonic timer does
/// not follow changes of the wall clock (NTP steps, a suspended machine).
pub const MAX_WAIT: Duration = Duration::from_secs(24 * 60 * 60);

/// How long until `at`, from `now`: `None` once it is due.
pub fn remaining(at: Timestamp, now: Timestamp) -> Option<Duration> {
    let left = at.duration_since(now);
    if left.is_zero() || left.is_negative() {
        return None;
    }
    Some(Duration::try_from(left).map_or(MAX_WAIT, |d| d.min(MAX_WAIT)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn the_seed_layout_is_utc() {
        assert_eq!(
            parse("2019-04-12T10:12:00Z").unwrap(),
            ts("2019-04-12T10:12:00Z")
        );
        assert_eq!(
            parse("2006-01-02T15:04:05Z").unwrap().as_second(),
            1136214245
        );
    }

    #[test]
    fn rfc3339_offsets_and_fractions_are_accepted() {
        assert_eq!(
            parse("2019-04-12T12:12:00+02:00").unwrap(),
            ts("2019-04-12T10:12:00Z")
        );
        assert_eq!(
            parse("2019-04-12T05:12:00-05:00").unwrap(),
            ts("2019-04-12T10:12:00Z")
        );
        assert_eq!(
            parse("2019-04-12T10:12:00.5Z").unwrap(),
            ts("2019-04-12T10:12:00Z") + jiff::SignedDuration::from_millis(500)
        );
        assert_eq!(
            parse("2019-04-12t10:12:00z").unwrap(),
            ts("2019-04-12T10:12:00Z")
        );
    }

    #[test]
    fn garbage_is_refused_with_a_message_quoting_it() {
        for bad in [
            "tomorrow",
            "",
            "2019-04-12",
            "2019-04-12T10:12:00",
            "2019-13-12T10:12:00Z",
            "12/04/2019 10:12",
            "* * * * *",
        ] {
            let error = parse(bad).unwrap_err();
            assert!(error.contains(&format!("{bad:?}")), "{error}");
            assert!(error.contains("RFC 3339"), "{error}");
        }
    }

    #[test]
    fn remaining_is_exact_then_none_once_due() {
        let now = ts("2030-01-01T00:00:00Z");
        assert_eq!(
            remaining(ts("2030-01-01T01:00:00.25Z"), now),
            Some(Duration::from_millis(3_600_250))
        );
        assert_eq!(remaining(now, now), None);
        assert_eq!(remaining(ts("2019-04-12T10:12:00Z"), now), None);
        assert_eq!(remaining(ts("2040-01-01T00:00:00Z"), now), Some(MAX_WAIT));
    }
}
