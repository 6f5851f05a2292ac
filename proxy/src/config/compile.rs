use super::{Cache, ConfigError};
use crate::filter::{
    Allow, Cors, Filters, HeaderModifier, Mirror, OriginPattern, PathModifier, Redirect,
    RequestEdit, Rewrite,
};
use crate::forward::{Upstream, UpstreamError};
use crate::metrics::ProxyMetrics;
use crate::proxy::Routes;
use crate::route::{MatchSpec, PathMatcher, Pattern, TableBuilder, ValueMatcher};
use crate::rule::{Backend, Backends, RetryPolicy, Rule};
use cftunnel_config as doc;
use http::{HeaderName, HeaderValue, Method, StatusCode};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// Compiles a config document into a route table. Pure apart from building (not dialling)
/// backend clients; reuses the clients in `cache` and leaves only the ones still used there.
pub fn compile(
    config: &doc::Config,
    metrics: &ProxyMetrics,
    cache: &mut Cache,
) -> Result<Routes, ConfigError> {
    let mut upstreams = Upstreams {
        max_connections: cache.max_connections,
        old: &mut cache.upstreams,
        used: HashMap::new(),
        old_patterns: &mut cache.patterns,
        patterns: HashMap::new(),
    };
    let mut builder = TableBuilder::default();
    for (i, rule) in config.rules.iter().enumerate() {
        let at = |field: &str| format!("rules[{i}].{field}");
        let hostnames = rule
            .hostnames
            .iter()
            .enumerate()
            .map(|(j, h)| {
                hostname(h).map_err(|m| ConfigError::invalid(at(&format!("hostnames[{j}]")), m))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let matches = if rule.matches.is_empty() {
            vec![match_all()]
        } else {
            rule.matches
                .iter()
                .enumerate()
                .map(|(j, m)| compile_match(m, &at(&format!("matches[{j}]")), &mut upstreams))
                .collect::<Result<Vec<_>, _>>()?
        };
        let compiled = compile_rule(rule, &at(""), &mut upstreams)?;
        builder.push(&hostnames, matches, compiled);
    }
    let table = builder.build();
    let mut host_labels = vec![Box::<str>::from(""); table.bucket_count()];
    for bucket in table.buckets() {
        if let Some(slot) = host_labels.get_mut(bucket.id) {
            *slot = bucket.pattern.clone();
        }
    }
    *upstreams.old = upstreams.used;
    *upstreams.old_patterns = upstreams.patterns;
    Ok(Routes::new(
        table,
        host_labels,
        metrics.clone(),
        config.version,
        config.has_grpc_route,
    ))
}

/// Backend clients and compiled patterns of the previous table, reused when unchanged, and
/// the ones this table uses (which become the cache once it is swapped in).
struct Upstreams<'c> {
    max_connections: usize,
    old: &'c mut HashMap<crate::forward::UpstreamKey, Arc<Upstream>>,
    used: HashMap<crate::forward::UpstreamKey, Arc<Upstream>>,
    old_patterns: &'c mut HashMap<String, Pattern>,
    patterns: HashMap<String, Pattern>,
}

impl Upstreams<'_> {
    fn get(
        &mut self,
        url: &str,
        protocol: doc::BackendProtocol,
        websocket: bool,
        tls: Option<&doc::BackendTls>,
        public_only: bool,
    ) -> Result<Arc<Upstream>, UpstreamError> {
        let key = Upstream::key(url, protocol, websocket, tls, public_only);
        if let Some(u) = self.used.get(&key) {
            return Ok(u.clone());
        }
        let upstream = match self.old.get(&key) {
            Some(u) => u.clone(),
            None => Arc::new(Upstream::new(
                url,
                protocol,
                websocket,
                tls,
                public_only,
                self.max_connections,
            )?),
        };
        self.used.insert(key, upstream.clone());
        Ok(upstream)
    }

    fn pattern(&mut self, source: &str, at: &str) -> Result<Pattern, ConfigError> {
        if let Some(p) = self.patterns.get(source) {
            return Ok(p.clone());
        }
        let pattern = match self.old_patterns.get(source) {
            Some(p) => p.clone(),
            None => Pattern::new(source)
                .map_err(|e| ConfigError::invalid(at, format!("regex does not compile: {e}")))?,
        };
        self.patterns.insert(source.to_owned(), pattern.clone());
        Ok(pattern)
    }
}

fn compile_rule(
    rule: &doc::Rule,
    at: &str,
    upstreams: &mut Upstreams<'_>,
) -> Result<Rule, ConfigError> {
    let filters = compile_filters(&rule.filters, &format!("{at}filters"), upstreams)?;
    let mut backends = Vec::with_capacity(rule.backends.len());
    for (j, b) in rule.backends.iter().enumerate() {
        let at = format!("{at}backends[{j}]");
        let unavailable = b
            .unavailable_status
            .map(|s| final_status(s, &format!("{at}.unavailableStatus")))
            .transpose()?;
        let upstream = if b.url.is_empty() && unavailable.is_some() {
            None
        } else {
            Some(
                upstreams
                    .get(
                        &b.url,
                        b.protocol,
                        b.websocket,
                        b.tls.as_ref(),
                        b.public_only,
                    )
                    .map_err(|e| ConfigError::invalid(format!("{at}.url"), e))?,
            )
        };
        backends.push(Backend {
            upstream,
            filters: compile_filters(&b.filters, &format!("{at}.filters"), upstreams)?,
            unavailable,
            weight: b.weight,
        });
    }
    let timeouts = rule.timeouts.clone().unwrap_or_default();
    let nonzero = |d: Option<doc::Duration>| d.map(|d| d.0).filter(|d| !d.is_zero());
    let retry = match &rule.retry {
        None => None,
        Some(r) => {
            for (k, code) in r.codes.iter().enumerate() {
                status(*code, &format!("{at}retry.codes[{k}]"))?;
            }
            Some(RetryPolicy {
                codes: r.codes.clone().into_boxed_slice(),
                attempts: r.attempts.unwrap_or(1),
                backoff: r.backoff.map(|d| d.0).unwrap_or(Duration::ZERO),
            })
        }
    };
    Ok(Rule {
        name: rule.name.as_deref().map(Into::into),
        filters,
        backends: Backends::new(backends),
        request_timeout: nonzero(timeouts.request),
        backend_timeout: nonzero(timeouts.backend),
        unavailable: rule
            .unavailable_status
            .map(|s| final_status(s, &format!("{at}unavailableStatus")))
            .transpose()?,
        retry,
    })
}

/// A status a response can end with: an informational one (1xx) is never a final answer.
fn final_status(code: u16, at: &str) -> Result<StatusCode, ConfigError> {
    if code < 200 {
        return Err(ConfigError::invalid(
            at,
            format!("status {code} is informational, not a final answer"),
        ));
    }
    status(code, at)
}

fn status(code: u16, at: &str) -> Result<StatusCode, ConfigError> {
    if !(100..=599).contains(&code) {
        return Err(ConfigError::invalid(
            at,
            format!("status {code} is not between 100 and 599"),
        ));
    }
    StatusCode::from_u16(code).map_err(|e| ConfigError::invalid(at, e))
}

/// Validates and lower-cases a rule hostname: exact (`a.example.com`) or wildcard (`*.example.com`).
fn hostname(h: &str) -> Result<Box<str>, String> {
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

fn match_all() -> MatchSpec {
    MatchSpec {
        path: PathMatcher::Prefix("/".into()),
        method: None,
        headers: Box::new([]),
        query: Box::new([]),
    }
}

fn compile_match(
    m: &doc::Match,
    at: &str,
    upstreams: &mut Upstreams<'_>,
) -> Result<MatchSpec, ConfigError> {
    let path = match &m.path {
        None => PathMatcher::Prefix("/".into()),
        Some(p) => {
            let field = format!("{at}.path");
            match p.kind {
                doc::PathMatchType::RegularExpression => {
                    PathMatcher::Regex(upstreams.pattern(&p.value, &field)?)
                }
                kind => {
                    let value = if p.value.is_empty() {
                        "/"
                    } else {
                        p.value.as_str()
                    };
                    if !value.starts_with('/') {
                        return Err(ConfigError::invalid(
                            field,
                            format!("path {value:?} must start with `/`"),
                        ));
                    }
                    if kind == doc::PathMatchType::Exact {
                        PathMatcher::Exact(value.into())
                    } else {
                        let trimmed = value.trim_end_matches('/');
                        PathMatcher::Prefix(if trimmed.is_empty() { "/" } else { trimmed }.into())
                    }
                }
            }
        }
    };
    let method = m
        .method
        .as_deref()
        .map(|s| {
            Method::from_bytes(s.to_ascii_uppercase().as_bytes()).map_err(|_| {
                ConfigError::invalid(
                    format!("{at}.method"),
                    format!("{s:?} is not an HTTP method"),
                )
            })
        })
        .transpose()?;
    let mut headers = Vec::with_capacity(m.headers.len());
    for (k, h) in m.headers.iter().enumerate() {
        let field = format!("{at}.headers[{k}]");
        let name = HeaderName::from_bytes(h.name.as_bytes()).map_err(|_| {
            ConfigError::invalid(
                format!("{field}.name"),
                format!("{:?} is not a header name", h.name),
            )
        })?;
        // Gateway API: among equivalent header names only the first entry counts.
        if headers.iter().any(|(n, _)| *n == name) {
            continue;
        }
        headers.push((name, value_matcher(h, &field, upstreams)?));
    }
    let mut query: Vec<(Box<str>, ValueMatcher)> = Vec::with_capacity(m.query_params.len());
    for (k, q) in m.query_params.iter().enumerate() {
        let field = format!("{at}.queryParams[{k}]");
        if q.name.is_empty() {
            return Err(ConfigError::invalid(
                format!("{field}.name"),
                "must not be empty",
            ));
        }
        if query.iter().any(|(n, _)| **n == *q.name) {
            continue;
        }
        query.push((q.name.as_str().into(), value_matcher(q, &field, upstreams)?));
    }
    Ok(MatchSpec {
        path,
        method,
        headers: headers.into_boxed_slice(),
        query: query.into_boxed_slice(),
    })
}

fn value_matcher(
    v: &doc::ValueMatch,
    at: &str,
    upstreams: &mut Upstreams<'_>,
) -> Result<ValueMatcher, ConfigError> {
    Ok(match v.kind {
        doc::ValueMatchType::Exact => ValueMatcher::Exact(v.value.as_str().into()),
        doc::ValueMatchType::RegularExpression => {
            ValueMatcher::Regex(upstreams.pattern(&v.value, &format!("{at}.value"))?)
        }
    })
}

fn header_modifier(m: &doc::HeaderModifier, at: &str) -> Result<HeaderModifier, ConfigError> {
    let pairs = |list: &[doc::Header], what: &str| {
        list.iter()
            .enumerate()
            .map(|(k, h)| {
                let field = format!("{at}.{what}[{k}]");
                let name = HeaderName::from_bytes(h.name.as_bytes()).map_err(|_| {
                    ConfigError::invalid(
                        format!("{field}.name"),
                        format!("{:?} is not a header name", h.name),
                    )
                })?;
                let value = HeaderValue::from_str(&h.value).map_err(|_| {
                    ConfigError::invalid(format!("{field}.value"), "not a valid header value")
                })?;
                Ok((name, value))
            })
            .collect::<Result<Vec<_>, ConfigError>>()
            .map(Vec::into_boxed_slice)
    };
    let remove = m
        .remove
        .iter()
        .enumerate()
        .map(|(k, n)| {
            HeaderName::from_bytes(n.as_bytes()).map_err(|_| {
                ConfigError::invalid(
                    format!("{at}.remove[{k}]"),
                    format!("{n:?} is not a header name"),
                )
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(HeaderModifier {
        set: pairs(&m.set, "set")?,
        add: pairs(&m.add, "add")?,
        remove: remove.into_boxed_slice(),
    })
}

fn missing(at: &str, field: &str) -> ConfigError {
    ConfigError::invalid(format!("{at}.{field}"), "required by the filter type")
}

fn compile_filters(
    list: &[doc::Filter],
    at: &str,
    upstreams: &mut Upstreams<'_>,
) -> Result<Filters, ConfigError> {
    let mut request = Vec::new();
    let mut response = Vec::new();
    let mut redirect = None;
    let mut mirrors = Vec::new();
    let mut cors = None;
    for (k, f) in list.iter().enumerate() {
        let at = format!("{at}[{k}]");
        match f.kind {
            doc::FilterType::RequestHeaderModifier => {
                let m = f
                    .request_header_modifier
                    .as_ref()
                    .ok_or_else(|| missing(&at, "requestHeaderModifier"))?;
                request.push(RequestEdit::Headers(header_modifier(
                    m,
                    &format!("{at}.requestHeaderModifier"),
                )?));
            }
            doc::FilterType::ResponseHeaderModifier => {
                let m = f
                    .response_header_modifier
                    .as_ref()
                    .ok_or_else(|| missing(&at, "responseHeaderModifier"))?;
                response.push(header_modifier(m, &format!("{at}.responseHeaderModifier"))?);
            }
            doc::FilterType::RequestRedirect => {
                let r = f
                    .request_redirect
                    .as_ref()
                    .ok_or_else(|| missing(&at, "requestRedirect"))?;
                if redirect.is_some() {
                    return Err(ConfigError::invalid(
                        at,
                        "only one RequestRedirect is allowed",
                    ));
                }
                redirect = Some(compile_redirect(r, &format!("{at}.requestRedirect"))?);
            }
            doc::FilterType::URLRewrite => {
                let r = f
                    .url_rewrite
                    .as_ref()
                    .ok_or_else(|| missing(&at, "urlRewrite"))?;
                let field = format!("{at}.urlRewrite");
                let hostname = r
                    .hostname
                    .as_deref()
                    .map(|h| {
                        let invalid =
                            |m: String| ConfigError::invalid(format!("{field}.hostname"), m);
                        if h.contains('*') {
                            return Err(invalid(format!(
                                "{h:?}: a rewrite needs an exact hostname"
                            )));
                        }
                        let h = hostname(h).map_err(invalid)?;
                        HeaderValue::from_str(&h).map_err(|_| {
                            ConfigError::invalid(format!("{field}.hostname"), "not a valid host")
                        })
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
                        path_modifier(p.kind, value.as_deref(), &format!("{field}.path"))
                    })
                    .transpose()?;
                request.push(RequestEdit::Rewrite(Rewrite { hostname, path }));
            }
            doc::FilterType::RequestMirror => {
                let m = f
                    .request_mirror
                    .as_ref()
                    .ok_or_else(|| missing(&at, "requestMirror"))?;
                let field = format!("{at}.requestMirror");
                let percent = m.percent.unwrap_or(100);
                if percent > 100 {
                    return Err(ConfigError::invalid(
                        format!("{field}.percent"),
                        "must be between 0 and 100",
                    ));
                }
                let upstream = upstreams
                    .get(&m.backend_url, m.protocol, false, None, m.public_only)
                    .map_err(|e| ConfigError::invalid(format!("{field}.backendUrl"), e))?;
                mirrors.push(Mirror { upstream, percent });
            }
            doc::FilterType::Cors => {
                let c = f.cors.as_ref().ok_or_else(|| missing(&at, "cors"))?;
                cors = Some(compile_cors(c, &format!("{at}.cors"))?);
            }
        }
    }
    Ok(Filters {
        request: request.into_boxed_slice(),
        response: response.into_boxed_slice(),
        redirect,
        mirrors: mirrors.into_boxed_slice(),
        cors,
    })
}

fn path_modifier(
    kind: doc::PathModifierType,
    value: Option<&str>,
    at: &str,
) -> Result<PathModifier, ConfigError> {
    let value = value.unwrap_or("/");
    let value = if value.is_empty() { "/" } else { value };
    if !value.starts_with('/') {
        return Err(ConfigError::invalid(
            at,
            format!("path {value:?} must start with `/`"),
        ));
    }
    Ok(match kind {
        doc::PathModifierType::ReplaceFullPath => PathModifier::Full(value.into()),
        doc::PathModifierType::ReplacePrefixMatch => PathModifier::Prefix(value.into()),
    })
}

fn compile_redirect(r: &doc::RequestRedirect, at: &str) -> Result<Redirect, ConfigError> {
    let scheme = match r.scheme.as_deref().map(str::to_ascii_lowercase) {
        None => None,
        Some(s) if s == "http" || s == "https" => Some(s.into()),
        Some(s) => {
            return Err(ConfigError::invalid(
                format!("{at}.scheme"),
                format!("{s:?} is not http or https"),
            ))
        }
    };
    let hostname = r
        .hostname
        .as_deref()
        .map(|h| {
            if h.contains('*') {
                return Err(format!("{h:?}: a redirect needs an exact hostname"));
            }
            hostname(h)
        })
        .transpose()
        .map_err(|m| ConfigError::invalid(format!("{at}.hostname"), m))?;
    if r.port == Some(0) {
        return Err(ConfigError::invalid(
            format!("{at}.port"),
            "0 is not a port",
        ));
    }
    let code = r.status_code.unwrap_or(302);
    if ![301, 302, 303, 307, 308].contains(&code) {
        return Err(ConfigError::invalid(
            format!("{at}.statusCode"),
            format!("{code} is not a redirect status"),
        ));
    }
    let path = r
        .path
        .as_ref()
        .map(|p| path_modifier(p.kind, Some(&p.value), &format!("{at}.path")))
        .transpose()?;
    Ok(Redirect {
        scheme,
        hostname,
        port: r.port,
        path,
        status: status(code, &format!("{at}.statusCode"))?,
    })
}

fn compile_cors(c: &doc::Cors, at: &str) -> Result<Cors, ConfigError> {
    let allow = |list: &[String], field: &str| -> Result<Allow, ConfigError> {
        if list.is_empty() {
            return Ok(Allow::Nothing);
        }
        if list.iter().any(|v| v == "*") {
            return Ok(Allow::Any);
        }
        HeaderValue::from_str(&list.join(", "))
            .map(Allow::List)
            .map_err(|_| ConfigError::invalid(format!("{at}.{field}"), "not a valid header value"))
    };
    let expose_headers = if c.expose_headers.is_empty() {
        None
    } else {
        Some(
            HeaderValue::from_str(&c.expose_headers.join(", ")).map_err(|_| {
                ConfigError::invalid(format!("{at}.exposeHeaders"), "not a valid header value")
            })?,
        )
    };
    Ok(Cors {
        allow_origins: c
            .allow_origins
            .iter()
            .map(|o| OriginPattern::parse(o))
            .collect(),
        allow_credentials: c.allow_credentials.unwrap_or(false),
        allow_methods: allow(&c.allow_methods, "allowMethods")?,
        allow_headers: allow(&c.allow_headers, "allowHeaders")?,
        expose_headers,
        max_age: c.max_age.map(HeaderValue::from),
    })
}
