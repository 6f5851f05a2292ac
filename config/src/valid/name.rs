//! Names and values a request is matched on or edited with: hostnames, header names and
//! values, methods, paths.

use http::{HeaderName, HeaderValue, Method};

/// A rule hostname, exact (`a.example.com`) or wildcard (`*.example.com`, at least one label
/// after `*.`), returned lower-cased without surrounding white space: labels of letters,
/// digits, `-` and `_`, each 1 to 63 bytes, 253 in all.
///
/// # Errors
/// Anything else, with a message naming the value (see [`check_hostname`]).
pub fn hostname(h: &str) -> Result<Box<str>, String> {
    check_hostname(h)?;
    Ok(lower_hostname(h))
}

/// A hostname [`check_hostname`] took, as [`hostname`] returns it.
pub(super) fn lower_hostname(h: &str) -> Box<str> {
    h.trim().to_ascii_lowercase().into()
}

/// The bytes a hostname label may hold: letters, digits, `-` and `_`. A table, since every
/// byte of every route hostname is looked up each round.
const LABEL_BYTES: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        let byte = b as u8;
        table[b] = byte.is_ascii_alphanumeric() || byte == b'-' || byte == b'_';
        b += 1;
    }
    table
};

/// Whether [`hostname`] takes `h`, without building the name: for a caller that keeps its own
/// copy (the controller checks every route hostname each round).
///
/// # Errors
/// As [`hostname`].
pub fn check_hostname(h: &str) -> Result<(), String> {
    let trimmed = h.trim();
    // Lower-casing changes neither `*`, `.` nor which bytes are letters, so the name is
    // checked as written.
    let name = trimmed.strip_prefix("*.").unwrap_or(trimmed);
    if name.is_empty() {
        return Err(format!(
            "{h:?} is not a hostname (a wildcard needs a domain after `*.`)"
        ));
    }
    if name.len() > 253 {
        return Err(format!("{h:?} is longer than 253 characters"));
    }
    // Labels: 1 to 63 bytes each, of letters, digits, `-` and `_`.
    let mut label = 0usize;
    let mut valid = true;
    for &b in name.as_bytes() {
        if b == b'.' {
            valid &= label > 0;
            label = 0;
        } else {
            valid &= LABEL_BYTES[usize::from(b)];
            label += 1;
            valid &= label <= 63;
        }
    }
    if !valid || label == 0 {
        return Err(format!("{h:?} is not a valid hostname"));
    }
    Ok(())
}

/// A hostname a redirect or rewrite sends requests to: [`hostname`] without a wildcard.
///
/// # Errors
/// A wildcard, or anything [`hostname`] refuses.
pub fn exact_hostname(h: &str, what: &str) -> Result<Box<str>, String> {
    if h.contains('*') {
        return Err(format!("{h:?}: a {what} needs an exact hostname"));
    }
    hostname(h)
}

/// A header name (RFC 9110 token), as the proxy stores it.
///
/// # Errors
/// A name that is empty or holds a byte a token cannot.
pub fn header_name(name: &str) -> Result<HeaderName, String> {
    HeaderName::from_bytes(name.as_bytes()).map_err(|_| format!("{name:?} is not a header name"))
}

/// A header value: visible ASCII, spaces and tabs, no line breaks or other control bytes.
///
/// # Errors
/// A value holding a byte a header value cannot.
pub fn header_value(value: &str) -> Result<HeaderValue, String> {
    HeaderValue::from_str(value).map_err(|_| format!("{value:?} is not a valid header value"))
}

/// An HTTP method, any case.
///
/// # Errors
/// A value that is not a method token.
pub fn method(m: &str) -> Result<Method, String> {
    Method::from_bytes(m.to_ascii_uppercase().as_bytes())
        .map_err(|_| format!("{m:?} is not an HTTP method"))
}

/// An absolute path a rule matches on or a filter writes: empty means `/`.
///
/// # Errors
/// A path that does not start with `/`.
pub fn absolute_path(path: &str) -> Result<&str, String> {
    let path = if path.is_empty() { "/" } else { path };
    if path.starts_with('/') {
        Ok(path)
    } else {
        Err(format!("path {path:?} must start with `/`"))
    }
}

/// A path a redirect or rewrite writes: an absolute path ([`absolute_path`]) that a request
/// line can carry as it is, with no query or fragment of its own (the request's query is kept).
///
/// # Errors
/// A relative path, or one holding a byte a request target cannot (a space, a control byte),
/// `?` or `#`.
pub fn replacement_path(path: &str) -> Result<&str, String> {
    let path = absolute_path(path)?;
    if path.contains(['?', '#']) || path.parse::<http::uri::PathAndQuery>().is_err() {
        return Err(format!("path {path:?} is not a valid URL path"));
    }
    Ok(path)
}
