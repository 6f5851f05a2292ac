//! Names and values a request is matched on or edited with: hostnames, header names and
//! values, methods, paths.

use http::{HeaderName, HeaderValue, Method};

/// A rule hostname, exact (`a.example.com`) or wildcard (`*.example.com`, at least one label
/// after `*.`), returned lower-cased without surrounding white space: labels of letters,
/// digits, `-` and `_`, each 1 to 63 bytes, 253 in all.
///
/// # Errors
/// Anything else, with a message naming the value.
pub fn hostname(h: &str) -> Result<Box<str>, String> {
    let lower = h.trim().to_ascii_lowercase();
    let name = lower.strip_prefix("*.").unwrap_or(&lower);
    if name.is_empty() {
        return Err(format!(
            "{h:?} is not a hostname (a wildcard needs a domain after `*.`)"
        ));
    }
    if name.len() > 253 {
        return Err(format!("{h:?} is longer than 253 characters"));
    }
    let valid = name.split('.').all(|label| {
        !label.is_empty()
            && label.len() <= 63
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    });
    if !valid {
        return Err(format!("{h:?} is not a valid hostname"));
    }
    Ok(lower.into())
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
