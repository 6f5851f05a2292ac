use http::{header, HeaderMap, HeaderValue, Method};

/// Gateway API `CORS` filter: preflights are answered by the proxy, actual requests get the
/// `Access-Control-Allow-*` response headers.
#[derive(Debug, Clone)]
pub struct Cors {
    /// Exact origins and `*`-patterns (`https://*.example.com`); `*` alone allows any origin.
    pub allow_origins: Box<[OriginPattern]>,
    pub allow_credentials: bool,
    pub allow_methods: Allow,
    pub allow_headers: Allow,
    pub expose_headers: Option<HeaderValue>,
    pub max_age: Option<HeaderValue>,
}

/// An allow-list of methods or headers; `Any` (`*`) echoes back whatever the preflight asks
/// for, which also works with credentials.
pub use cftunnel_config::valid::Allow;

#[derive(Debug, Clone)]
pub enum OriginPattern {
    Any,
    Exact(Box<str>),
    /// `prefix*suffix`.
    Glob(Box<str>, Box<str>),
}

impl OriginPattern {
    pub fn parse(s: &str) -> Self {
        if s == "*" {
            return Self::Any;
        }
        match s.split_once('*') {
            Some((pre, suf)) => Self::Glob(
                pre.to_ascii_lowercase().into(),
                suf.to_ascii_lowercase().into(),
            ),
            None => Self::Exact(s.to_ascii_lowercase().into()),
        }
    }

    fn matches(&self, origin: &str) -> bool {
        match self {
            Self::Any => true,
            Self::Exact(o) => origin.eq_ignore_ascii_case(o),
            Self::Glob(pre, suf) => {
                origin.len() > pre.len() + suf.len()
                    && origin
                        .get(..pre.len())
                        .is_some_and(|p| p.eq_ignore_ascii_case(pre))
                    && origin
                        .get(origin.len() - suf.len()..)
                        .is_some_and(|s| s.eq_ignore_ascii_case(suf))
            }
        }
    }
}

impl Cors {
    /// The allowed `Origin` of a request, if it carries one this filter allows.
    fn allowed_origin<'h>(&self, headers: &'h HeaderMap) -> Option<&'h HeaderValue> {
        let origin = headers.get(header::ORIGIN)?;
        self.allows(origin).then_some(origin)
    }

    /// Whether `origin` is one this filter allows.
    fn allows(&self, origin: &HeaderValue) -> bool {
        origin
            .to_str()
            .is_ok_and(|text| self.allow_origins.iter().any(|p| p.matches(text)))
    }

    /// Whether the request is a CORS preflight (`OPTIONS` + `Origin` + `Access-Control-Request-Method`).
    pub fn is_preflight(method: &Method, headers: &HeaderMap) -> bool {
        method == Method::OPTIONS
            && headers.contains_key(header::ORIGIN)
            && headers.contains_key(header::ACCESS_CONTROL_REQUEST_METHOD)
    }

    /// Response headers for a preflight; empty when the origin or method is not allowed, so
    /// the browser refuses the actual request.
    pub fn preflight(&self, headers: &HeaderMap) -> HeaderMap {
        let mut out = HeaderMap::new();
        out.insert(header::VARY, HeaderValue::from_static("Origin"));
        let Some(origin) = self.allowed_origin(headers) else {
            return out;
        };
        let requested_method = headers.get(header::ACCESS_CONTROL_REQUEST_METHOD);
        let methods = match (&self.allow_methods, requested_method) {
            (Allow::List(list), Some(m)) => {
                let m = m.to_str().unwrap_or("");
                // The CORS-safelisted methods are always allowed, listed or not.
                let allowed = ["GET", "HEAD", "POST"].contains(&m)
                    || list
                        .to_str()
                        .unwrap_or("")
                        .split(',')
                        .any(|a| a.trim().eq_ignore_ascii_case(m));
                if !allowed {
                    return out;
                }
                Some(list.clone())
            }
            (Allow::List(list), None) => Some(list.clone()),
            (Allow::Any, Some(m)) => Some(m.clone()),
            (Allow::Any, None) => Some(HeaderValue::from_static("*")),
            (Allow::Nothing, _) => None,
        };
        out.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin.clone());
        if let Some(methods) = methods {
            out.insert(header::ACCESS_CONTROL_ALLOW_METHODS, methods);
        }
        let req_headers = headers.get(header::ACCESS_CONTROL_REQUEST_HEADERS);
        match (&self.allow_headers, req_headers) {
            (Allow::List(list), _) => {
                out.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, list.clone());
            }
            (Allow::Any, Some(h)) => {
                out.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, h.clone());
            }
            _ => {}
        }
        if let Some(v) = &self.expose_headers {
            out.insert(header::ACCESS_CONTROL_EXPOSE_HEADERS, v.clone());
        }
        if let Some(v) = &self.max_age {
            out.insert(header::ACCESS_CONTROL_MAX_AGE, v.clone());
        }
        if self.allow_credentials {
            out.insert(
                header::ACCESS_CONTROL_ALLOW_CREDENTIALS,
                HeaderValue::from_static("true"),
            );
        }
        out
    }

    /// Adds the CORS headers of an actual (non-preflight) request's response, given the
    /// request's `Origin`.
    pub fn decorate(&self, origin: &HeaderValue, response: &mut HeaderMap) {
        if !self.allows(origin) {
            return;
        }
        response.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin.clone());
        response.append(header::VARY, HeaderValue::from_static("Origin"));
        if self.allow_credentials {
            response.insert(
                header::ACCESS_CONTROL_ALLOW_CREDENTIALS,
                HeaderValue::from_static("true"),
            );
        }
        if let Some(v) = &self.expose_headers {
            response.insert(header::ACCESS_CONTROL_EXPOSE_HEADERS, v.clone());
        }
    }
}
