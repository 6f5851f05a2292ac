use super::reuse::Compiled;
use super::{Cache, ConfigError, TargetId};
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
/// clients, compiled patterns and compiled rules in `cache` (a rule pushed again unchanged is
/// shared with the table in service, see [`super::reuse`]) and, when the document compiles,
/// leaves only the ones it uses there.
pub fn compile(
    config: &cftunnel_config::Config,
    metrics: &ProxyMetrics,
    cache: &mut Cache,
) -> Result<Routes, ConfigError> {
    let result = build(config, metrics, cache);
    match &result {
        Ok(_) => {
            cache.checked.keep_used();
            cache.rules.keep_used();
        }
        Err(_) => {
            cache.checked.drop_used();
            cache.rules.drop_used();
        }
    }
    result
}

fn build(
    config: &cftunnel_config::Config,
    metrics: &ProxyMetrics,
    cache: &mut Cache,
) -> Result<Routes, ConfigError> {
    let mut used = HashMap::with_capacity(cache.upstreams.len());
    let mut upstreams = Upstreams {
        max_connections: cache.max_connections,
        old: &cache.upstreams,
        used: &mut used,
        taken: Vec::new(),
    };
    let mut builder = TableBuilder::default();
    for (index, rule) in config.rules.iter().enumerate() {
        let fingerprint = cache.rules.fingerprint(rule);
        let compiled = match cache.rules.get(fingerprint) {
            Some(compiled) => {
                // Still in use: keep what it holds in the caches it came from.
                for (target, upstream) in compiled.targets.iter() {
                    upstreams.keep(target, upstream);
                    cache.checked.keep_target(target);
                }
                for pattern in compiled.patterns.iter() {
                    cache.checked.keep_pattern(pattern);
                }
                compiled
            }
            None => {
                let compiled = Arc::new(
                    compile_rule(rule, &mut cache.checked, &mut upstreams).map_err(|invalid| {
                        ConfigError::Refused(valid::RuleRefused {
                            index,
                            name: rule.name.clone(),
                            invalid,
                        })
                    })?,
                );
                cache.rules.insert(fingerprint, compiled.clone());
                compiled
            }
        };
        builder.push_shared(
            &compiled.hostnames,
            compiled.matches.clone(),
            compiled.rule.clone(),
        );
    }
    let table = builder.build_with(&mut cache.regex_sets);
    let mut host_labels = vec![Box::<str>::from(""); table.bucket_count()];
    for bucket in table.buckets() {
        if let Some(slot) = host_labels.get_mut(bucket.id) {
            *slot = bucket.pattern.clone();
        }
    }
    cache.upstreams = used;
    Ok(Routes::new(
        table,
        host_labels,
        metrics.clone(),
        config.version,
        config.has_grpc_route,
    ))
}

/// Checks one rule and builds it; a failure names the field relative to the rule.
fn compile_rule(
    rule: &cftunnel_config::Rule,
    checked: &mut valid::Cache,
    upstreams: &mut Upstreams<'_>,
) -> Result<Compiled, valid::Invalid> {
    let rule = valid::rule(rule, checked)?;
    let patterns = rule
        .matches
        .iter()
        .flat_map(valid::Match::patterns)
        .cloned()
        .collect();
    let matches = rule.matches.into_iter().map(match_spec).collect();
    let mut backends = Vec::with_capacity(rule.backends.len());
    for (j, b) in rule.backends.into_iter().enumerate() {
        backends.push(backend(b, upstreams).map_err(|(field, e)| {
            valid::Invalid::new(format!("backends[{j}].{field}"), e.to_string())
        })?);
    }
    let filters = filters(rule.filters, upstreams)
        .map_err(|e| valid::Invalid::new("filters", e.to_string()))?;
    Ok(Compiled {
        hostnames: rule.hostnames.into_boxed_slice(),
        matches,
        rule: Arc::new(Rule {
            name: rule.name,
            filters,
            backends: Backends::new(backends),
            request_timeout: rule.request_timeout,
            backend_timeout: rule.backend_timeout,
            unavailable: rule.unavailable,
            retry: rule.retry.map(|r| RetryPolicy {
                codes: r.codes.into_boxed_slice(),
                attempts: r.attempts,
                backoff: r.backoff,
            }),
        }),
        targets: std::mem::take(&mut upstreams.taken).into_boxed_slice(),
        patterns,
    })
}

/// Backend clients of the previous table, reused when their target is unchanged (so
/// connection pools survive a reload), and the ones this table uses.
struct Upstreams<'c> {
    max_connections: usize,
    old: &'c HashMap<TargetId, Arc<Upstream>>,
    used: &'c mut HashMap<TargetId, Arc<Upstream>>,
    /// What the rule being compiled took, for [`Compiled::targets`].
    taken: Vec<(Arc<valid::Target>, Arc<Upstream>)>,
}

impl Upstreams<'_> {
    fn get(&mut self, target: Arc<valid::Target>) -> Result<Arc<Upstream>, UpstreamError> {
        let id = TargetId(target);
        let upstream = match self.used.get(&id) {
            Some(u) => u.clone(),
            None => {
                let upstream = match self.old.get(&id) {
                    Some(u) => u.clone(),
                    None => Arc::new(Upstream::new(&id.0, self.max_connections)?),
                };
                self.used.insert(id.clone(), upstream.clone());
                upstream
            }
        };
        self.taken.push((id.0, upstream.clone()));
        Ok(upstream)
    }

    /// Keeps the client of a rule compiled before.
    fn keep(&mut self, target: &Arc<valid::Target>, upstream: &Arc<Upstream>) {
        let id = TargetId(target.clone());
        if !self.used.contains_key(&id) {
            self.used.insert(id, upstream.clone());
        }
    }
}

/// Builds a checked backend; a failure names the field of the backend (`url`). Only the TLS
/// setup of a client can fail once the contract has accepted a rule.
fn backend(
    b: valid::Backend,
    upstreams: &mut Upstreams<'_>,
) -> Result<Backend, (&'static str, UpstreamError)> {
    let upstream = b
        .target
        .map(|t| upstreams.get(t))
        .transpose()
        .map_err(|e| ("url", e))?;
    Ok(Backend {
        upstream,
        filters: filters(b.filters, upstreams).map_err(|e| ("filters", e))?,
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
    if f.is_empty() {
        return Ok(Filters::default());
    }
    let mirrors = f
        .mirrors
        .into_iter()
        .map(|m| {
            upstreams.get(m.target).map(|upstream| Mirror {
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
        redirect: f.redirect.map(|r| {
            Box::new(Redirect {
                scheme: r.scheme,
                hostname: r.hostname,
                port: r.port,
                path: r.path.map(path_modifier),
                status: r.status,
            })
        }),
        mirrors: mirrors.into_boxed_slice(),
        cors: f.cors.map(|c| {
            Box::new(Cors {
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
            })
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
