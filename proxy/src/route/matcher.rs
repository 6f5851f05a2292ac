//! Request matchers: path, method, headers, query parameters.

pub use cftunnel_config::valid::Pattern;
use http::{HeaderMap, HeaderName, Method};
use std::sync::Arc;

/// What a matcher needs to see of a request: borrowed, so matching allocates nothing.
#[derive(Debug, Clone, Copy)]
pub struct RequestView<'a> {
    pub method: &'a Method,
    pub path: &'a str,
    pub query: Option<&'a str>,
    pub headers: &'a HeaderMap,
}

/// A path matcher. Prefixes are segment-aware and stored without a trailing slash (except `/`).
#[derive(Debug, Clone)]
pub enum PathMatcher {
    /// Shared with the table's path index, which keys on the same text.
    Exact(Arc<str>),
    Prefix(Arc<str>),
    /// Anchored: the pattern must span the whole path.
    Regex(Pattern),
}

impl PathMatcher {
    pub fn matches(&self, path: &str) -> bool {
        match self {
            Self::Exact(p) => path == &**p,
            Self::Prefix(p) => prefix_matches(p, path),
            Self::Regex(re) => re.is_match(path),
        }
    }

    /// The prefix a `ReplacePrefixMatch` rewrite replaces, if this is a prefix matcher.
    pub fn prefix(&self) -> Option<&str> {
        match self {
            Self::Prefix(p) => Some(p),
            Self::Exact(p) => Some(p),
            Self::Regex(_) => None,
        }
    }
}

/// Segment-aware prefix: `/foo` matches `/foo` and `/foo/bar`, never `/foobar`.
fn prefix_matches(prefix: &str, path: &str) -> bool {
    if prefix == "/" {
        return true;
    }
    match path.strip_prefix(prefix) {
        Some(rest) => rest.is_empty() || rest.starts_with('/'),
        None => false,
    }
}

/// A header or query-parameter value matcher.
#[derive(Debug, Clone)]
pub enum ValueMatcher {
    Exact(Box<str>),
    /// Anchored: the pattern must span the whole value.
    Regex(Pattern),
}

impl ValueMatcher {
    pub fn matches(&self, value: &str) -> bool {
        match self {
            Self::Exact(v) => value == &**v,
            Self::Regex(re) => re.is_match(value),
        }
    }
}

/// One entry of a rule's `matches`: every field must hold (AND).
#[derive(Debug, Clone)]
pub struct MatchSpec {
    pub path: PathMatcher,
    pub method: Option<Method>,
    pub headers: Box<[(HeaderName, ValueMatcher)]>,
    /// Query parameter names are compared exactly (case-sensitive), as Gateway API specifies.
    pub query: Box<[(Box<str>, ValueMatcher)]>,
}

impl MatchSpec {
    pub fn matches(&self, req: &RequestView<'_>) -> bool {
        self.path.matches(req.path) && self.matches_besides_path(req)
    }

    /// The regular expressions of this match: of its path, header and query values.
    pub fn patterns(&self) -> impl Iterator<Item = &Pattern> {
        let path = match &self.path {
            PathMatcher::Regex(p) => Some(p),
            _ => None,
        };
        fn value(v: &ValueMatcher) -> Option<&Pattern> {
            match v {
                ValueMatcher::Regex(p) => Some(p),
                ValueMatcher::Exact(_) => None,
            }
        }
        path.into_iter()
            .chain(self.headers.iter().filter_map(|(_, v)| value(v)))
            .chain(self.query.iter().filter_map(|(_, v)| value(v)))
    }

    /// Everything but the path, for callers that matched the path through an index.
    pub fn matches_besides_path(&self, req: &RequestView<'_>) -> bool {
        if let Some(m) = &self.method {
            if m != req.method {
                return false;
            }
        }
        for (name, want) in self.headers.iter() {
            // A repeated header matches if any of its values does. Values are compared as
            // UTF-8 text, as Go compares them (`to_str` would take visible ASCII only, and a
            // `X-User: José` would match nothing).
            let hit = req
                .headers
                .get_all(name)
                .iter()
                .any(|v| std::str::from_utf8(v.as_bytes()).is_ok_and(|v| want.matches(v)));
            if !hit {
                return false;
            }
        }
        for (name, want) in self.query.iter() {
            // Only the first occurrence of a parameter counts, as in Gateway API.
            let Some(value) = query_param(req.query, name) else {
                return false;
            };
            if !want.matches(&value) {
                return false;
            }
        }
        true
    }

    /// Precedence key: smaller sorts first (Gateway API HTTPRoute rule precedence, with
    /// regular expressions after prefixes as the proxy contract fixes).
    pub(crate) fn precedence(
        &self,
    ) -> (
        u8,
        std::cmp::Reverse<usize>,
        bool,
        std::cmp::Reverse<usize>,
        std::cmp::Reverse<usize>,
    ) {
        let (kind, len) = match &self.path {
            PathMatcher::Exact(p) => (0, p.len()),
            PathMatcher::Prefix(p) => (1, p.len()),
            PathMatcher::Regex(_) => (2, 0),
        };
        (
            kind,
            std::cmp::Reverse(len),
            self.method.is_none(),
            std::cmp::Reverse(self.headers.len()),
            std::cmp::Reverse(self.query.len()),
        )
    }
}

/// The first value of query parameter `name`, percent-decoded.
fn query_param<'q>(query: Option<&'q str>, name: &str) -> Option<std::borrow::Cow<'q, str>> {
    let query = query?;
    for pair in query.split('&') {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if decode(k) == name {
            return Some(decode(v));
        }
    }
    None
}

/// Percent- and plus-decoding; borrows when there is nothing to decode.
fn decode(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.bytes().any(|b| b == b'%' || b == b'+') {
        return std::borrow::Cow::Borrowed(s);
    }
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h << 4 | l);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
    std::borrow::Cow::Owned(String::from_utf8_lossy(&out).into_owned())
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}
