//! Checks that values can be compiled by the proxy, so one bad object never makes the proxy
//! refuse a whole push (it compiles every value before swapping the table, proxy contract
//! "Config API"). Each check mirrors the proxy's own.

/// A rule hostname: exact or `*.`-wildcard, labels of letters, digits, `-` and `_`.
pub(super) fn hostname(h: &str) -> Result<(), String> {
    let name = h.strip_prefix("*.").unwrap_or(h);
    if name.is_empty() || name.len() > 253 {
        return Err(format!("{h:?} is not a hostname"));
    }
    let valid = name.split('.').all(|label| {
        !label.is_empty()
            && label.len() <= 63
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    });
    if valid {
        Ok(())
    } else {
        Err(format!("{h:?} is not a valid hostname"))
    }
}

pub(super) fn header_name(name: &str) -> Result<(), String> {
    http::HeaderName::from_bytes(name.as_bytes())
        .map(|_| ())
        .map_err(|_| format!("{name:?} is not a header name"))
}

pub(super) fn header_value(value: &str) -> Result<(), String> {
    http::HeaderValue::from_str(value)
        .map(|_| ())
        .map_err(|_| format!("{value:?} is not a valid header value"))
}

/// A replacement path: empty (meaning `/`) or absolute.
pub(super) fn replacement_path(path: &str) -> Result<(), String> {
    if path.is_empty() || path.starts_with('/') {
        Ok(())
    } else {
        Err(format!("path {path:?} must start with '/'"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostnames_follow_the_proxy_rules() {
        for ok in ["a.example.com", "*.example.com", "x_y.example", "localhost"] {
            assert_eq!(hostname(ok), Ok(()), "{ok}");
        }
        for bad in ["", "*.", "a..b", "a b.com", "*.*.com", "exa$mple.com"] {
            assert!(hostname(bad).is_err(), "{bad}");
        }
    }
}
