//! Filters, checked: header modifiers, redirect, URL rewrite, mirrors, CORS.

use super::{name, status, At, Cache, Invalid, Keep, Target};
use crate::document as doc;
use http::{HeaderName, HeaderValue, StatusCode};
use std::sync::Arc;

/// The filters of one rule or one backend, in the order they apply.
#[derive(Debug, Clone, Default)]
pub struct Filters {
    /// Request edits in document order.
    pub request: Vec<RequestEdit>,
    /// Response header edits in document order.
    pub response: Vec<HeaderEdits>,
    pub redirect: Option<Box<Redirect>>,
    pub mirrors: Vec<Mirror>,
    pub cors: Option<Box<Cors>>,
}

impl Filters {
    /// No filter at all: what most rules and backends have.
    pub fn is_empty(&self) -> bool {
        self.request.is_empty()
            && self.response.is_empty()
            && self.redirect.is_none()
            && self.mirrors.is_empty()
            && self.cors.is_none()
    }
}

/// A request-side edit.
#[derive(Debug, Clone)]
pub enum RequestEdit {
    Headers(HeaderEdits),
    Rewrite(Rewrite),
}

/// `RequestHeaderModifier` / `ResponseHeaderModifier`: set, then add, then remove.
#[derive(Debug, Clone, Default)]
pub struct HeaderEdits {
    pub set: Vec<(HeaderName, HeaderValue)>,
    pub add: Vec<(HeaderName, HeaderValue)>,
    pub remove: Vec<HeaderName>,
}

/// A path a redirect or rewrite writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathEdit {
    /// The whole path.
    Full(Box<str>),
    /// The matched prefix, keeping the rest of the path.
    Prefix(Box<str>),
}

/// `URLRewrite`.
#[derive(Debug, Clone)]
pub struct Rewrite {
    /// Exact hostname, as a `Host` value.
    pub hostname: Option<HeaderValue>,
    pub path: Option<PathEdit>,
}

/// `RequestRedirect`.
#[derive(Debug, Clone)]
pub struct Redirect {
    /// `http` or `https`, lower-case.
    pub scheme: Option<Box<str>>,
    /// Exact hostname, lower-case.
    pub hostname: Option<Box<str>>,
    /// 1 to 65535.
    pub port: Option<u16>,
    pub path: Option<PathEdit>,
    /// 301, 302 (the default), 303, 307 or 308.
    pub status: StatusCode,
}

/// `RequestMirror`.
#[derive(Debug, Clone)]
pub struct Mirror {
    pub target: Arc<Target>,
    /// The share of requests copied: `numerator` in `denominator` (never 0), at most all.
    pub share: doc::Fraction,
}

/// An allow-list of methods or headers.
#[derive(Debug, Clone)]
pub enum Allow {
    /// Nothing beyond what CORS always allows.
    Nothing,
    /// `*`: whatever a preflight asks for.
    Any,
    /// The listed values, joined with `, `.
    List(HeaderValue),
}

/// `CORS`.
#[derive(Debug, Clone)]
pub struct Cors {
    /// As written: exact origins, `*`-patterns, or `*` alone.
    pub allow_origins: Vec<Box<str>>,
    pub allow_credentials: bool,
    pub allow_methods: Allow,
    pub allow_headers: Allow,
    pub expose_headers: Option<HeaderValue>,
    /// Seconds, as a header value.
    pub max_age: Option<HeaderValue>,
}

/// Checks a list of filters; `at` is the list's field (`filters`, `backends[1].filters`).
/// `None` where nothing is kept ([`Keep`]). Inlined for the empty list most rules and backends
/// have, which then costs its caller nothing to make or drop.
#[inline(always)]
pub(super) fn filters<F: Keep>(
    list: &[doc::Filter],
    at: &At<'_>,
    path_regex: bool,
    cache: &mut Cache,
) -> Result<Option<Filters>, Invalid> {
    if list.is_empty() {
        return Ok(F::BUILD.then(Filters::default));
    }
    some_filters::<F>(list, at, path_regex, cache)
}

fn some_filters<F: Keep>(
    list: &[doc::Filter],
    at: &At<'_>,
    path_regex: bool,
    cache: &mut Cache,
) -> Result<Option<Filters>, Invalid> {
    let mut out = Filters::default();
    let mut redirected = false;
    for (k, f) in list.iter().enumerate() {
        let at = at.index(k);
        let missing = |field: &str| Invalid::new(at.field(field), "required by the filter type");
        match f.kind {
            doc::FilterType::RequestHeaderModifier => {
                let m = f
                    .request_header_modifier
                    .as_ref()
                    .ok_or_else(|| missing("requestHeaderModifier"))?;
                let edits = header_edits(m, &at.field("requestHeaderModifier"))?;
                if F::BUILD {
                    out.request.push(RequestEdit::Headers(edits));
                }
            }
            doc::FilterType::ResponseHeaderModifier => {
                let m = f
                    .response_header_modifier
                    .as_ref()
                    .ok_or_else(|| missing("responseHeaderModifier"))?;
                let edits = header_edits(m, &at.field("responseHeaderModifier"))?;
                if F::BUILD {
                    out.response.push(edits);
                }
            }
            doc::FilterType::RequestRedirect => {
                let r = f
                    .request_redirect
                    .as_ref()
                    .ok_or_else(|| missing("requestRedirect"))?;
                if redirected {
                    return Err(Invalid::new(at, "only one RequestRedirect is allowed"));
                }
                redirected = true;
                let redirect = redirect(r, &at.field("requestRedirect"), path_regex)?;
                if F::BUILD {
                    out.redirect = Some(Box::new(redirect));
                }
            }
            doc::FilterType::URLRewrite => {
                let r = f
                    .url_rewrite
                    .as_ref()
                    .ok_or_else(|| missing("urlRewrite"))?;
                let rewrite = rewrite(r, &at.field("urlRewrite"), path_regex)?;
                if F::BUILD {
                    out.request.push(RequestEdit::Rewrite(rewrite));
                }
            }
            doc::FilterType::RequestMirror => {
                let m = f
                    .request_mirror
                    .as_ref()
                    .ok_or_else(|| missing("requestMirror"))?;
                let at = at.field("requestMirror");
                let share = match m.fraction {
                    Some(f) if f.denominator == 0 => {
                        return Err(Invalid::new(
                            at.field("fraction").field("denominator"),
                            "must be more than 0",
                        ))
                    }
                    Some(f) if f.numerator > f.denominator => {
                        return Err(Invalid::new(
                            at.field("fraction").field("numerator"),
                            "must be at most the denominator",
                        ))
                    }
                    Some(f) => f,
                    None => {
                        let percent = m.percent.unwrap_or(100);
                        if percent > 100 {
                            return Err(Invalid::new(
                                at.field("percent"),
                                "must be between 0 and 100",
                            ));
                        }
                        doc::Fraction {
                            numerator: percent,
                            denominator: 100,
                        }
                    }
                };
                let target = cache
                    .target(
                        &m.backend_url,
                        m.protocol,
                        false,
                        m.tls.as_ref(),
                        m.public_only,
                    )
                    .map_err(|e| {
                        let field = match e.field.as_str() {
                            "url" => "backendUrl",
                            tls => tls,
                        };
                        Invalid::new(at.field(field), e.message)
                    })?;
                if F::BUILD {
                    out.mirrors.push(Mirror {
                        target: target.clone(),
                        share,
                    });
                }
            }
            doc::FilterType::Cors => {
                let c = f.cors.as_ref().ok_or_else(|| missing("cors"))?;
                let cors = cors(c, &at.field("cors"))?;
                if F::BUILD {
                    out.cors = Some(Box::new(cors));
                }
            }
        }
    }
    Ok(F::BUILD.then_some(out))
}

/// A header modifier, checked. Gateway API (`HTTPHeader`): of the `set` or `add` entries with
/// equivalent names (header names are compared in any case) the first counts and the others
/// are ignored, so `set: [X-Env: prod, x-env: dev]` sets `prod`, and `add` adds it once.
///
/// `set` and `add` may not name a header that frames the message ([`proxy_owned`]); `remove`
/// may, as the proxy frames what it forwards itself.
fn header_edits(m: &doc::HeaderModifier, at: &At<'_>) -> Result<HeaderEdits, Invalid> {
    let pairs = |list: &[doc::Header], what: &str| {
        let list_at = at.field(what);
        let mut out: Vec<(HeaderName, HeaderValue)> = Vec::with_capacity(list.len());
        // Parsed names are lower-case, so equal names are equivalent ones. A set, not a scan
        // of `out`: a pushed document's lists have no length limit.
        let mut seen = std::collections::HashSet::with_capacity(list.len());
        for (k, h) in list.iter().enumerate() {
            let at = list_at.index(k);
            let name = name::header_name(&h.name).map_err(|m| Invalid::new(at.field("name"), m))?;
            if let Some(why) = proxy_owned(&name) {
                return Err(Invalid::new(
                    at.field("name"),
                    format!("{name} {why}: a filter may remove it, not {what} it"),
                ));
            }
            let value =
                name::header_value(&h.value).map_err(|m| Invalid::new(at.field("value"), m))?;
            if let Some(named) = connection_names_framing(&name, &value) {
                return Err(Invalid::new(
                    at.field("value"),
                    format!(
                        "connection names {named}, which a next hop would then remove: a filter \
                         may not {what} it"
                    ),
                ));
            }
            if seen.insert(name.clone()) {
                out.push((name, value));
            }
        }
        Ok::<_, Invalid>(out)
    };
    let remove = m
        .remove
        .iter()
        .enumerate()
        .map(|(k, n)| {
            name::header_name(n).map_err(|m| Invalid::new(at.field("remove").index(k), m))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(HeaderEdits {
        set: pairs(&m.set, "set")?,
        add: pairs(&m.add, "add")?,
        remove,
    })
}

/// The framing header (or `host`) a `Connection` value names, if it names one: a next hop
/// that removes what `Connection` lists would remove it and read the message otherwise.
/// The proxy ignores those names in a client's `Connection`, but one a filter sets is sent on.
fn connection_names_framing(name: &HeaderName, value: &HeaderValue) -> Option<&'static str> {
    if name != http::header::CONNECTION {
        return None;
    }
    // By bytes: a value with any byte past ASCII is still a list a next hop splits.
    value
        .as_bytes()
        .split(|&b| b == b',')
        .map(<[u8]>::trim_ascii)
        .find_map(|token| {
            ["content-length", "transfer-encoding", "host"]
                .into_iter()
                .find(|framing| token.eq_ignore_ascii_case(framing.as_bytes()))
        })
}

/// Why a filter may not set or add header `name`, if it may not: `Content-Length` or
/// `Transfer-Encoding` could disagree with the body the proxy frames, so the peer would read
/// the rest of the body as the next message on its connection (a poisoned response queue,
/// a smuggled request) or wait for bytes that never come. Other hop-by-hop headers are taken,
/// as the Go implementation takes them: set after the client's are stripped, they speak for
/// the proxy's own hop (`Connection: close` on a response closes that client connection).
fn proxy_owned(name: &HeaderName) -> Option<&'static str> {
    (name == http::header::CONTENT_LENGTH || name == http::header::TRANSFER_ENCODING)
        .then_some("frames the message, and the proxy frames what it sends")
}

/// A replacement path. `ReplacePrefixMatch` needs a matched prefix: a rule with a regex path
/// match has none, so the two together are refused rather than rewriting unpredictably.
fn path_edit(
    kind: doc::PathModifierType,
    value: Option<&str>,
    at: &At<'_>,
    path_regex: bool,
) -> Result<PathEdit, Invalid> {
    let value =
        name::replacement_path(value.unwrap_or_default()).map_err(|m| Invalid::new(at, m))?;
    Ok(match kind {
        doc::PathModifierType::ReplaceFullPath => PathEdit::Full(value.into()),
        doc::PathModifierType::ReplacePrefixMatch if path_regex => {
            return Err(Invalid::new(
                at,
                "ReplacePrefixMatch needs prefix or exact path matches, not a regular expression",
            ))
        }
        doc::PathModifierType::ReplacePrefixMatch => PathEdit::Prefix(value.into()),
    })
}

fn rewrite(r: &doc::UrlRewrite, at: &At<'_>, path_regex: bool) -> Result<Rewrite, Invalid> {
    let hostname = r
        .hostname
        .as_deref()
        .map(|h| {
            let h = name::exact_hostname(h, "rewrite")
                .map_err(|m| Invalid::new(at.field("hostname"), m))?;
            name::header_value(&h).map_err(|m| Invalid::new(at.field("hostname"), m))
        })
        .transpose()?;
    let path = r
        .path
        .as_ref()
        .map(|p| {
            let value = match p.kind {
                doc::PathModifierType::ReplaceFullPath => &p.replace_full_path,
                doc::PathModifierType::ReplacePrefixMatch => &p.replace_prefix_match,
            };
            path_edit(p.kind, value.as_deref(), &at.field("path"), path_regex)
        })
        .transpose()?;
    Ok(Rewrite { hostname, path })
}

fn redirect(r: &doc::RequestRedirect, at: &At<'_>, path_regex: bool) -> Result<Redirect, Invalid> {
    let scheme = match r.scheme.as_deref().map(str::to_ascii_lowercase) {
        None => None,
        Some(s) if s == "http" || s == "https" => Some(s.into()),
        Some(s) => {
            return Err(Invalid::new(
                at.field("scheme"),
                format!("{s:?} is not http or https"),
            ))
        }
    };
    let hostname = r
        .hostname
        .as_deref()
        .map(|h| name::exact_hostname(h, "redirect"))
        .transpose()
        .map_err(|m| Invalid::new(at.field("hostname"), m))?;
    if r.port == Some(0) {
        return Err(Invalid::new(at.field("port"), "0 is not a port"));
    }
    let status = status::redirect_status(r.status_code.unwrap_or(302))
        .map_err(|m| Invalid::new(at.field("statusCode"), m))?;
    let path = r
        .path
        .as_ref()
        .map(|p| path_edit(p.kind, Some(&p.value), &at.field("path"), path_regex))
        .transpose()?;
    Ok(Redirect {
        scheme,
        hostname,
        port: r.port,
        path,
        status,
    })
}

fn cors(c: &doc::Cors, at: &At<'_>) -> Result<Cors, Invalid> {
    let joined = |list: &[String], field: &str| {
        name::header_value(&list.join(", ")).map_err(|m| Invalid::new(at.field(field), m))
    };
    let allow = |list: &[String], field: &str| -> Result<Allow, Invalid> {
        if list.is_empty() {
            return Ok(Allow::Nothing);
        }
        if list.iter().any(|v| v == "*") {
            return Ok(Allow::Any);
        }
        joined(list, field).map(Allow::List)
    };
    // Origins are compared with a request's `Origin`, and the one allowed is echoed back.
    joined(&c.allow_origins, "allowOrigins")?;
    let expose_headers = if c.expose_headers.is_empty() {
        None
    } else {
        Some(joined(&c.expose_headers, "exposeHeaders")?)
    };
    Ok(Cors {
        allow_origins: c.allow_origins.iter().map(|o| o.as_str().into()).collect(),
        allow_credentials: c.allow_credentials.unwrap_or(false),
        allow_methods: allow(&c.allow_methods, "allowMethods")?,
        allow_headers: allow(&c.allow_headers, "allowHeaders")?,
        expose_headers,
        max_age: c.max_age.map(HeaderValue::from),
    })
}
