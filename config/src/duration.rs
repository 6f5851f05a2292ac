//! Go-style duration strings (`"10s"`, `"500ms"`, `"1m30s"`), as the Go implementation writes them.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::str::FromStr;

/// A non-negative duration written as a Go duration string.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Duration(pub std::time::Duration);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseDurationError {
    #[error("empty duration")]
    Empty,
    #[error("invalid duration {0:?}: expected a number followed by a unit (ns, us, ms, s, m, h)")]
    Invalid(String),
    #[error("negative duration {0:?}")]
    Negative(String),
}

impl FromStr for Duration {
    type Err = ParseDurationError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if s.is_empty() {
            return Err(ParseDurationError::Empty);
        }
        if s.starts_with('-') {
            return Err(ParseDurationError::Negative(s.to_owned()));
        }
        let body = s.strip_prefix('+').unwrap_or(s);
        if body == "0" {
            return Ok(Self::default());
        }
        let invalid = || ParseDurationError::Invalid(s.to_owned());
        let mut total_nanos: f64 = 0.0;
        let mut rest = body;
        while !rest.is_empty() {
            let num_len = rest
                .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                .ok_or_else(invalid)?;
            if num_len == 0 {
                return Err(invalid());
            }
            let value: f64 = rest[..num_len].parse().map_err(|_| invalid())?;
            rest = &rest[num_len..];
            let unit_len = rest
                .find(|c: char| c.is_ascii_digit() || c == '.')
                .unwrap_or(rest.len());
            let scale = match &rest[..unit_len] {
                "ns" => 1.0,
                "us" | "µs" | "μs" => 1e3,
                "ms" => 1e6,
                "s" => 1e9,
                "m" => 60e9,
                "h" => 3600e9,
                _ => return Err(invalid()),
            };
            rest = &rest[unit_len..];
            total_nanos += value * scale;
        }
        if !total_nanos.is_finite() || total_nanos > u64::MAX as f64 {
            return Err(invalid());
        }
        Ok(Self(std::time::Duration::from_nanos(
            total_nanos.round() as u64
        )))
    }
}

impl fmt::Display for Duration {
    /// Writes the shortest exact form in one unit (`1500ms`, `2s`, `0s`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let nanos = self.0.as_nanos();
        for (unit, size) in [
            ("h", 3_600_000_000_000u128),
            ("m", 60_000_000_000),
            ("s", 1_000_000_000),
            ("ms", 1_000_000),
            ("us", 1_000),
        ] {
            if nanos != 0 && nanos.is_multiple_of(size) {
                return write!(f, "{}{unit}", nanos / size);
            }
        }
        if nanos == 0 {
            return f.write_str("0s");
        }
        write!(f, "{nanos}ns")
    }
}

impl Serialize for Duration {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Duration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}
