use super::{Cache, ConfigError};
use crate::filter::{
    Cors, Filters, HeaderModifier, Mirror, OriginPattern, PathModifier, Redirect, RequestEdit,
    Rewrite,
};
use crate::forward::{Upstream, UpstreamError};
use crate::metrics::ProxyMetrics;
use crate::route::{MatchSpec, PathMatcher, TableBuilder, ValueMatcher};
use crate::routes::Routes;
use crate::rule::{Backend, Backends, RetryPolicy, Rule};
use cftunnel_config::valid;
use std::collections::HashMap;
use std::sync::Arc;

/// Compiles a config document into a route table: every rule is checked by the contract
/// ([`valid::rule`]), the one set of rules the controller checks its documents with too, then
/// built into the table. Pure apart from building (not dialling) backend clients; reuses the
/// clients and compiled patterns in `cache` and, when the document compiles, leaves only the
/// ones it uses there.
pub fn compile(
    config: &cftunnel_config::Config,
    metrics: &ProxyMetrics,
    cache: &mut Cache,
) -> Result<Routes, ConfigError> {
    let result = build(config, metrics, cache);
    match &result {
        Ok(_) => cache.checked.keep_used(),
        Err(_) => cache.checked.drop_used(),
    }
    result
}

fn build(
    config: &cftunnel_config::Config,
    metrics: &ProxyMetrics,
    cache: &mut Cache,
) -> Result<Routes, ConfigError> {
    let mut used = HashMap::new();
    let mut upstreams = Upstreams {
        max_connections: cache.max_connections,
        old: &cache.upstreams,
        used: &mut used,
    };
    let mut teams = HashMap::new();
    let mut builder = TableBuilder::default();
    for (index, rule) in config.rules.iter().enumerate() {
        let refused = |invalid| {
            ConfigError::Refused(valid::RuleRefused {
                index,
                name: rule.name.clone(),
                invalid,
            })
        };
        let checked = valid::rule(rule, &mut cache.checked).map_err(refused)?;
        let hostnames = checked.hostnames;
        let matches = checked.matches.into_iter().map(match_spec).collect();
        let built = |field: String| {
            move |e: UpstreamError| refused(valid::Invalid::new(field, e.to_string()))
        };
        let mut backends = Vec::with_capacity(checked.backends.len());
        for (j, b) in checked.backends.into_iter().enumerate() {
            backends.push(
                backend(b, &mut upstreams, &format!("backends[{j}]"))
                    .map_err(|(field, e)| refused(valid::Invalid::new(field, e.to_string())))?,
            );
        }
        let access = checked
            .access
            .map(|a| cache.access.check(a, &mut teams))
            .transpose()
            .map_err(|e| refused(valid::Invalid::new("access.teamName", e)))?;
        let compiled = Rule {
            access,
            name: checked.name,
            filters: filters(checked.filters, &mut upstreams)
                .map_err(built("filters".to_owned()))?,
            backends: Backends::new(backends),
            request_timeout: checked.request_timeout,
            backend_timeout: checked.backend_timeout,
            unavailable: checked.unavailable,
            retry: checked.retry.map(|r| RetryPolicy {
                codes: r.codes.into_boxed_slice(),
                attempts: r.attempts,
                backoff: r.backoff,
            }),
        };
        builder.push(&hostnames, matches, compiled);
    }
    let table = builder.build();
    let mut host_labels = vec![Box::<str>::from(""); table.bucket_count()];
    for bucket in table.buckets() {
        if let Some(slot) = host_labels.get_mut(bucket.id) {
            *slot = bucket.pattern.clone();
        }
    }
    cache.upstreams = used;
    cache.access.replace(teams);
    Ok(Routes::new(
        table,
        host_labels,
        metrics.clone(),
        config.version,
        config.has_grpc_route,
    ))
}

/// Backend clients of the previous table, reused when their target is unchanged (so
/// connection pools survive a reload), and the ones this table uses.
struct Upstreams<'c> {
    max_connections: usize,
    old: &'c HashMap<Box<str>, Arc<Upstream>>,
    used: &'c mut HashMap<Box<str>, Arc<Upstream>>,
}

impl Upstreams<'_> {
    fn get(&mut self, target: &valid::Target) -> Result<Arc<Upstream>, UpstreamError> {
        if let Some(u) = self.used.get(target.key()) {
            return Ok(u.clone());
        }
        let upstream = match self.old.get(target.key()) {
            Some(u) => u.clone(),
            None => Arc::new(Upstream::new(target, self.max_connections)?),
        };
        self.used.insert(target.key().into(), upstream.clone());
        Ok(upstream)
    }
}

/// Builds a checked backend; a failure names the field (`backends[1].url`). Only the TLS setup
/// of a client can fail once the contract has accepted a rule.
fn backend(
    b: valid::Backend,
    upstreams: &mut Upstreams<'_>,
    at: &str,
) -> Result<Backend, (String, UpstreamError)> {
    let upstream = b
        .target
        .map(|t| upstreams.get(&t))
        .transpose()
        .map_err(|e| (format!("{at}.url"), e))?;
    Ok(Backend {
        upstream,
        filters: filters(b.filters, upstreams).map_err(|e| (format!("{at}.filters"), e))?,
        unavailable: b.unavailable,
        weight: b.weight,
    })
}

fn match_spec(m: valid::Match) -> MatchSpec {
    let value = |v: valid::ValueMatch| match v {
        valid::ValueMatch::Exact(s) => ValueMatcher::Exact(s),
        valid::ValueMatch::Regex(p) => ValueMatcher::Regex(p),
    };
    MatchSpec {
        path: match m.path {
            valid::PathMatch::Exact(p) => PathMatcher::Exact(p),
            valid::PathMatch::Prefix(p) => PathMatcher::Prefix(p),
            valid::PathMatch::Regex(p) => PathMatcher::Regex(p),
        },
        method: m.method,
        headers: m.headers.into_iter().map(|(n, v)| (n, value(v))).collect(),
        query: m.query.into_iter().map(|(n, v)| (n, value(v))).collect(),
    }
}

fn filters(f: valid::Filters, upstreams: &mut Upstreams<'_>) -> Result<Filters, UpstreamError> {
    let mirrors = f
        .mirrors
        .into_iter()
        .map(|m| {
            upstreams.get(&m.target).map(|upstream| Mirror {
                upstream,
                percent: m.percent,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Filters {
        request: f
            .request
            .into_iter()
            .map(|e| match e {
                valid::RequestEdit::Headers(h) => RequestEdit::Headers(header_modifier(h)),
                valid::RequestEdit::Rewrite(r) => RequestEdit::Rewrite(Rewrite {
                    hostname: r.hostname,
                    path: r.path.map(path_modifier),
                }),
            })
            .collect(),
        response: f.response.into_iter().map(header_modifier).collect(),
        redirect: f.redirect.map(|r| Redirect {
            scheme: r.scheme,
            hostname: r.hostname,
            port: r.port,
            path: r.path.map(path_modifier),
            status: r.status,
        }),
        mirrors: mirrors.into_boxed_slice(),
        cors: f.cors.map(|c| Cors {
            allow_origins: c
                .allow_origins
                .iter()
                .map(|o| OriginPattern::parse(o))
                .collect(),
            allow_credentials: c.allow_credentials,
            allow_methods: c.allow_methods,
            allow_headers: c.allow_headers,
            expose_headers: c.expose_headers,
            max_age: c.max_age,
        }),
    })
}

fn header_modifier(h: valid::HeaderEdits) -> HeaderModifier {
    HeaderModifier {
        set: h.set.into_boxed_slice(),
        add: h.add.into_boxed_slice(),
        remove: h.remove.into_boxed_slice(),
    }
}

fn path_modifier(p: valid::PathEdit) -> PathModifier {
    match p {
        valid::PathEdit::Full(p) => PathModifier::Full(p),
        valid::PathEdit::Prefix(p) => PathModifier::Prefix(p),
    }
}
