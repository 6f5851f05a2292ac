use super::PathModifier;
use http::{header, uri::PathAndQuery, HeaderValue, Uri};

/// `URLRewrite`: host and path seen by the backend.
#[derive(Debug, Clone)]
pub struct Rewrite {
    pub hostname: Option<HeaderValue>,
    pub path: Option<PathModifier>,
}

impl Rewrite {
    pub fn apply(&self, parts: &mut http::request::Parts, matched_prefix: Option<&str>) {
        if let Some(host) = &self.hostname {
            parts.headers.insert(header::HOST, host.clone());
        }
        if let Some(m) = &self.path {
            let new_path = m.apply(parts.uri.path(), matched_prefix);
            let pq = match parts.uri.query() {
                Some(q) => format!("{new_path}?{q}"),
                None => new_path,
            };
            if let Ok(pq) = PathAndQuery::try_from(pq) {
                let mut uri = std::mem::take(&mut parts.uri).into_parts();
                uri.path_and_query = Some(pq);
                parts.uri = Uri::from_parts(uri).unwrap_or_default();
            }
        }
    }
}
