//! Prometheus durations (`1h30m`, `1s500ms`): parsed, written as Prometheus writes them, and
//! divided by the factor of the time-scaled test, for the rules and the monitors alike.

use std::fmt::Write;
use std::time::Duration;

const DAY_MS: u64 = 24 * 60 * 60 * 1000;

/// Prometheus's duration units, largest first, the order a duration must write them in.
const UNITS: [(&str, u64); 7] = [
    ("y", 365 * DAY_MS),
    ("w", 7 * DAY_MS),
    ("d", DAY_MS),
    ("h", 60 * 60 * 1000),
    ("m", 60 * 1000),
    ("s", 1000),
    ("ms", 1),
];

/// A duration of Prometheus syntax (`1h30m`, `1d`, `1500ms`, or `0`): units largest first, each
/// at most once, as Prometheus's own parser takes them.
pub fn parse(text: &str) -> Result<Duration, String> {
    let bad = || format!("bad duration {text:?}");
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    let mut units = UNITS.iter();
    let mut rest = text;
    let mut millis: u64 = 0;
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let count: u64 = rest[..digits].parse().map_err(|_| bad())?;
        let after_count = &rest[digits..];
        // A unit ends where the next count starts, or at the end: `m` is not the `m` of `ms`.
        let (unit_ms, after_unit) = units
            .by_ref()
            .find_map(|(unit, unit_ms)| {
                let after = after_count.strip_prefix(unit)?;
                after
                    .bytes()
                    .next()
                    .is_none_or(|b| b.is_ascii_digit())
                    .then_some((*unit_ms, after))
            })
            .ok_or_else(bad)?;
        millis = count
            .checked_mul(unit_ms)
            .and_then(|ms| millis.checked_add(ms))
            .ok_or_else(|| format!("duration {text:?} out of range"))?;
        rest = after_unit;
    }
    Ok(Duration::from_millis(millis))
}

/// `d` as Prometheus writes it: largest units first, years and weeks only when exact (`90d`,
/// not `12w6d`), `0s` for zero. Below a millisecond, Prometheus's precision, is dropped.
pub fn format(d: Duration) -> String {
    let mut millis = d.as_millis();
    if millis == 0 {
        return "0s".to_string();
    }
    let mut text = String::new();
    for (unit, unit_ms) in UNITS {
        let unit_ms = u128::from(unit_ms);
        if matches!(unit, "y" | "w") && !millis.is_multiple_of(unit_ms) {
            continue;
        }
        let count = millis / unit_ms;
        if count > 0 {
            write!(text, "{count}{unit}").expect("writing to a String");
            millis -= count * unit_ms;
        }
    }
    text
}

/// `text` divided by `factor`, written as Prometheus writes durations; as written when the
/// division changes nothing (factor 1, zero), so factor 1 gives the text back byte for byte. A
/// quotient that is not a whole number of milliseconds, or a factor 0, is an error.
pub fn scale(text: &str, factor: u32) -> Result<String, String> {
    if factor == 0 {
        return Err(format!("{text} divided by 0"));
    }
    let millis = parse(text)?.as_millis();
    let factor = u128::from(factor);
    if !millis.is_multiple_of(factor) {
        return Err(format!(
            "{text} divided by {factor} is not a whole number of milliseconds"
        ));
    }
    if millis / factor == millis {
        return Ok(text.to_string());
    }
    let scaled = u64::try_from(millis / factor).expect("smaller than the parsed duration");
    Ok(format(Duration::from_millis(scaled)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_and_format_as_prometheus_writes_them() {
        for (text, millis, written) in [
            ("30s", 30_000, "30s"),
            ("1m30s", 90_000, "1m30s"),
            ("90s", 90_000, "1m30s"),
            ("1h30m", 5_400_000, "1h30m"),
            ("1h1s", 3_601_000, "1h1s"),
            ("1500ms", 1_500, "1s500ms"),
            ("1d", 86_400_000, "1d"),
            ("8d", 691_200_000, "8d"),
            ("90d", 7_776_000_000, "90d"),
            ("14d", 1_209_600_000, "2w"),
            ("2w", 1_209_600_000, "2w"),
            ("371d", 32_054_400_000, "53w"),
            ("1y", 31_536_000_000, "1y"),
            ("5m0s", 300_000, "5m"),
            ("0", 0, "0s"),
            ("0s", 0, "0s"),
        ] {
            let duration = parse(text).unwrap();
            assert_eq!(duration, Duration::from_millis(millis), "{text}");
            assert_eq!(format(duration), written, "{text}");
        }
        assert_eq!(format(Duration::from_micros(1_500_700)), "1s500ms");
        for text in [
            "",
            "m",
            "s",
            "5",
            "30",
            "0.5",
            "1.5s",
            "-1m",
            "-1s",
            "1M",
            "1x",
            "1m1h",
            "1s1m",
            "1s1s",
            "1h1h",
            "1m 30s",
            "99999999999999999y",
        ] {
            assert!(parse(text).is_err(), "{text:?} parsed");
        }
    }

    #[test]
    fn scaling_divides_into_whole_milliseconds_or_keeps_the_text() {
        for (text, factor, scaled) in [
            ("30s", 20, "1s500ms"),
            ("10s", 20, "500ms"),
            ("1m", 20, "3s"),
            ("1d", 20, "1h12m"),
            ("1h0m", 1, "1h0m"),
            ("0", 20, "0"),
        ] {
            assert_eq!(scale(text, factor).unwrap(), scaled, "{text} / {factor}");
        }
        for (text, factor) in [("10ms", 20), ("1001ms", 2), ("1m", 0), ("5x", 20)] {
            assert!(scale(text, factor).is_err(), "{text} / {factor} scaled");
        }
        let error = scale("1ms", 20).unwrap_err();
        assert!(error.contains("whole number of milliseconds"), "{error}");
    }
}
