//! Parsing of Go `time.ParseDuration` strings (`1s`, `250ms`, `1m30s`, `1.5h`), which is what
//! the echo contract's `delay` and `delayRetry` query parameters carry.

use std::time::Duration;

/// A duration string that Go's `time.ParseDuration` would reject, or a negative duration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration {0:?}")]
pub struct InvalidDuration(pub String);

/// Parses a Go duration string. Negative durations are rejected: a delay cannot be negative.
pub fn parse(s: &str) -> Result<Duration, InvalidDuration> {
    let invalid = || InvalidDuration(s.to_owned());
    let mut rest = s;
    if let Some(r) = rest.strip_prefix('+') {
        rest = r;
    } else if let Some(r) = rest.strip_prefix('-') {
        // "-0" is valid in Go and means zero; any other negative value is refused.
        if r == "0" {
            return Ok(Duration::ZERO);
        }
        return Err(invalid());
    }
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(invalid());
    }
    let mut total_nanos: f64 = 0.0;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(invalid)?;
        let (num, tail) = rest.split_at(num_len);
        if num.is_empty() || num == "." || num.matches('.').count() > 1 {
            return Err(invalid());
        }
        let value: f64 = num.parse().map_err(|_| invalid())?;
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, next) = tail.split_at(unit_len);
        let scale = match unit {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return Err(invalid()),
        };
        total_nanos += value * scale;
        rest = next;
    }
    // Go caps durations at ~292 years (i64 nanoseconds); anything beyond is an overflow error.
    if !total_nanos.is_finite() || total_nanos > i64::MAX as f64 {
        return Err(invalid());
    }
    Ok(Duration::from_nanos(total_nanos.round() as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_duration_strings_parse_like_time_parse_duration() {
        let ok = [
            ("0", Duration::ZERO),
            ("1s", Duration::from_secs(1)),
            ("250ms", Duration::from_millis(250)),
            ("1m30s", Duration::from_secs(90)),
            ("1.5h", Duration::from_secs(5400)),
            ("10us", Duration::from_micros(10)),
            ("10µs", Duration::from_micros(10)),
            ("7ns", Duration::from_nanos(7)),
            ("+2s", Duration::from_secs(2)),
            (".5s", Duration::from_millis(500)),
        ];
        for (input, want) in ok {
            assert_eq!(parse(input), Ok(want), "{input}");
        }
        for bad in ["", "1", "s", "1x", "-1s", "1..2s", "1s2", "abc"] {
            assert!(parse(bad).is_err(), "{bad} should be rejected");
        }
    }
}
