use super::PathModifier;
use http::{HeaderValue, StatusCode};

/// `RequestRedirect`, answered by the proxy without contacting a backend.
#[derive(Debug, Clone)]
pub struct Redirect {
    pub scheme: Option<Box<str>>,
    pub hostname: Option<Box<str>>,
    pub port: Option<u16>,
    pub path: Option<PathModifier>,
    pub status: StatusCode,
}

impl Redirect {
    /// The `Location` for a request.
    ///
    /// Port rules follow Gateway API: an explicit port wins; otherwise the redirect uses the
    /// scheme's well-known port (omitted from the URL). The listener the client reached is the
    /// public one at the edge, so the request's own port is never carried over.
    pub fn location(
        &self,
        request_scheme: &str,
        request_host: &str,
        path: &str,
        query: Option<&str>,
        matched_prefix: Option<&str>,
    ) -> Result<HeaderValue, http::header::InvalidHeaderValue> {
        let scheme = self.scheme.as_deref().unwrap_or(request_scheme);
        let host = self.hostname.as_deref().unwrap_or(request_host);
        let mut location = String::with_capacity(scheme.len() + host.len() + path.len() + 16);
        location.push_str(scheme);
        location.push_str("://");
        location.push_str(host);
        if let Some(port) = self.port {
            let default = match scheme {
                "https" => 443,
                _ => 80,
            };
            if port != default {
                use std::fmt::Write as _;
                let _ = write!(location, ":{port}");
            }
        }
        match &self.path {
            Some(m) => location.push_str(&m.apply(path, matched_prefix)),
            None => location.push_str(path),
        }
        if let Some(q) = query {
            location.push('?');
            location.push_str(q);
        }
        HeaderValue::try_from(location)
    }
}
