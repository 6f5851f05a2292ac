use super::reuse::{Compiled, Key};
use super::{Cache, ConfigError, TargetId};
use crate::access::{TeamKeys, Teams};
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
use foldhash::{HashMap, HashMapExt};
use std::sync::Arc;

/// Compiles a config document into a route table: every rule is checked by the contract
/// ([`valid::rule`]), the one set of rules the controller checks its documents with too, then
/// built into the table. Every pattern's matcher is built here, before the table serves, so
/// no request waits for one. Pure apart from building (not dialling) backend clients; reuses the
/// clients, compiled patterns and compiled rules in `cache` (a rule pushed again unchanged is
/// shared with the table in service, see [`super::reuse`]) and, when the document compiles,
/// leaves only the ones it uses there.
pub fn compile(
    config: &cftunnel_config::Config,
    metrics: &ProxyMetrics,
    cache: &mut Cache,
) -> Result<Routes, ConfigError> {
    let mut compiler = Compiler::new(cache, Some(config.rules.len()));
    for rule in &config.rules {
        compiler.push(rule);
    }
    compiler.finish(metrics, config.version, config.has_grpc_route)
}

/// [`compile`] of a document's JSON text, each rule compiled as it is read
/// ([`super::stream`]). `current` is the version in service: a document with an older one is
/// stale, and when its version comes before its rules none of them is compiled.
///
/// # Errors
/// In this order: text that is not one config document ([`ConfigError::Json`]), a stale
/// version, a refused rule.
pub fn compile_json(
    text: &[u8],
    current: i64,
    metrics: &ProxyMetrics,
    cache: &mut Cache,
) -> Result<Routes, ConfigError> {
    let mut compiler = Compiler::new(cache, None);
    let header = super::stream::read(text, current, &mut compiler).map_err(ConfigError::Json)?;
    if super::is_stale(header.version, current) {
        return Err(ConfigError::Stale {
            pushed: header.version,
            current,
        });
    }
    compiler.finish(metrics, header.version, header.has_grpc_route)
}

/// A table being compiled, one rule at a time, as [`compile`] does for a whole document: a
/// document read from JSON text is compiled as its rules are read, without holding them all.
///
/// Dropped unfinished (a refused document), it leaves `cache` as it found it.
pub(crate) struct Compiler<'c> {
    cache: &'c mut Cache,
    upstreams: Upstreams,
    builder: TableBuilder<Rule>,
    /// Position of the next rule.
    next: usize,
    /// The first rule refused; the rules after it are not compiled.
    refused: Option<valid::RuleRefused>,
    /// The Cloudflare Access teams the rules so far name.
    teams: HashMap<Box<str>, Arc<TeamKeys>>,
    /// A rule so far sends requests to an `h2c` backend.
    h2c_backend: bool,
    finished: bool,
}

impl<'c> Compiler<'c> {
    /// `rules`: how many rules the document has, if known, to size the table's maps (else as
    /// many as the table in service).
    pub(crate) fn new(cache: &'c mut Cache, rules: Option<usize>) -> Self {
        let old = std::mem::take(&mut cache.upstreams);
        let upstreams = Upstreams {
            backends: cache.backends.clone(),
            used: HashMap::with_capacity(old.len()),
            old,
            taken: Vec::new(),
        };
        let builder =
            TableBuilder::with_capacity(rules.unwrap_or(cache.last_rules), cache.last_hosts);
        Self {
            cache,
            upstreams,
            builder,
            next: 0,
            refused: None,
            teams: HashMap::new(),
            h2c_backend: false,
            finished: false,
        }
    }

    /// Adds the next rule of the document.
    pub(crate) fn push(&mut self, rule: &cftunnel_config::Rule) {
        let Some(index) = self.next_index() else {
            return;
        };
        let key = Key::Parsed(self.cache.rules.fingerprint(rule));
        match self.cache.rules.get(key) {
            Some(compiled) if self.share(&compiled) => {}
            _ => self.compile_new(index, key, rule),
        }
    }

    /// [`Compiler::push`] of a rule's JSON text. A rule pushed before with this very text is
    /// shared without being parsed; any other is read into the config type first.
    ///
    /// # Errors
    /// Text that is not a rule; also after a refused rule, when nothing more is compiled.
    pub(crate) fn push_text(&mut self, text: &str) -> Result<(), serde_json::Error> {
        let Some(index) = self.next_index() else {
            serde_json::from_str::<cftunnel_config::Rule>(text)?;
            return Ok(());
        };
        let key = Key::Text(text);
        match self.cache.rules.get(key) {
            Some(compiled) if self.share(&compiled) => {}
            _ => self.compile_new(index, key, &serde_json::from_str(text)?),
        }
        Ok(())
    }

    /// The position of the rule being added, or `None` once one was refused: the rules after
    /// it are not compiled.
    fn next_index(&mut self) -> Option<usize> {
        let index = self.next;
        self.next += 1;
        self.refused.is_none().then_some(index)
    }

    /// Adds a rule compiled before, keeping what it holds in the caches it came from, and
    /// counting its patterns against this document's budget.
    ///
    /// `false`, with nothing added or kept, when its patterns would take the document past
    /// the budget: the caller checks the rule anew, which refuses it at the field at fault.
    fn share(&mut self, compiled: &Arc<Compiled>) -> bool {
        let cache = &mut *self.cache;
        if !cache.checked.keep_patterns(&compiled.patterns) {
            return false;
        }
        for (target, upstream) in compiled.targets.iter() {
            self.upstreams.keep(target, upstream);
            cache.checked.keep_target(target);
        }
        if let Some(access) = &compiled.rule.access {
            Teams::keep(access, &mut self.teams);
        }
        self.add(compiled);
        true
    }

    /// Checks and builds a rule not seen before, or one seen before whose patterns the budget
    /// cannot take (to refuse it at the field at fault), remembering it under `key`.
    fn compile_new(&mut self, index: usize, key: Key<'_>, rule: &cftunnel_config::Rule) {
        match compile_rule(rule, self.cache, &mut self.upstreams, &mut self.teams) {
            Ok(compiled) => {
                let compiled = Arc::new(compiled);
                self.cache.rules.insert(key, compiled.clone());
                self.add(&compiled);
            }
            Err(invalid) => {
                self.refused = Some(valid::RuleRefused {
                    index,
                    name: rule.name.clone(),
                    invalid,
                });
            }
        }
    }

    fn add(&mut self, compiled: &Compiled) {
        // Mirrors do not count: their responses go nowhere.
        self.h2c_backend = self.h2c_backend
            || compiled
                .rule
                .backends
                .iter()
                .any(|b| b.upstream.as_deref().is_some_and(Upstream::h2c));
        self.builder.push_shared(
            &compiled.hostnames,
            compiled.matches.clone(),
            compiled.rule.clone(),
        );
    }

    /// The table, unless a rule was refused; either way `cache` is left holding what the
    /// table in service uses.
    pub(crate) fn finish(
        mut self,
        metrics: &ProxyMetrics,
        version: i64,
        has_grpc_route: bool,
    ) -> Result<Routes, ConfigError> {
        if version < 0 {
            return Err(ConfigError::NegativeVersion(version));
        }
        if let Some(refused) = self.refused.take() {
            return Err(ConfigError::Refused(refused));
        }
        self.finished = true;
        let cache = &mut *self.cache;
        let table = std::mem::take(&mut self.builder).build_with(&mut cache.regex_sets);
        cache.upstreams = std::mem::take(&mut self.upstreams.used);
        cache.last_rules = table.rule_count();
        cache.last_hosts = table.host_buckets();
        cache.checked.keep_used();
        cache.rules.keep_used();
        cache.access.replace(std::mem::take(&mut self.teams));
        Ok(Routes::new(
            table,
            metrics.clone(),
            version,
            has_grpc_route,
            self.h2c_backend,
        ))
    }
}

/// The reader hands a document's rules over as it reads them.
impl super::stream::RuleSink for Compiler<'_> {
    fn push_text(&mut self, text: &str) -> Result<(), serde_json::Error> {
        Compiler::push_text(self, text)
    }
}

impl Drop for Compiler<'_> {
    fn drop(&mut self) {
        if !self.finished {
            self.cache.upstreams = std::mem::take(&mut self.upstreams.old);
            self.cache.checked.drop_used();
            self.cache.rules.drop_used();
        }
    }
}

/// Checks one rule and builds it; a failure names the field relative to the rule.
fn compile_rule(
    rule: &cftunnel_config::Rule,
    cache: &mut Cache,
    upstreams: &mut Upstreams,
    teams: &mut HashMap<Box<str>, Arc<TeamKeys>>,
) -> Result<Compiled, valid::Invalid> {
    let rule = valid::rule(rule, &mut cache.checked)?;
    let access = rule
        .access
        .map(|a| cache.access.check(a, teams))
        .transpose()
        .map_err(|e| valid::Invalid::new("access.teamName", e))?;
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
            access,
            name: rule.name,
            filters,
            backends: Backends::new(backends),
            request_timeout: rule.request_timeout,
            backend_timeout: rule.backend_timeout,
            timeouts_off: rule.timeouts_off,
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
struct Upstreams {
    backends: crate::forward::BackendOptions,
    old: HashMap<TargetId, Arc<Upstream>>,
    used: HashMap<TargetId, Arc<Upstream>>,
    /// What the rule being compiled took, for [`Compiled::targets`].
    taken: Vec<(Arc<valid::Target>, Arc<Upstream>)>,
}

impl Upstreams {
    fn get(&mut self, target: Arc<valid::Target>) -> Result<Arc<Upstream>, UpstreamError> {
        let id = TargetId(target);
        let upstream = match self.used.get(&id) {
            Some(u) => u.clone(),
            None => {
                let upstream = match self.old.get(&id) {
                    Some(u) => u.clone(),
                    None => Arc::new(Upstream::new(&id.0, &self.backends)?),
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
        self.used.entry(id).or_insert_with(|| upstream.clone());
    }
}

/// Builds a checked backend; a failure names the field of the backend (`url`). Only the TLS
/// setup of a client can fail once the contract has accepted a rule.
fn backend(
    b: valid::Backend,
    upstreams: &mut Upstreams,
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
            valid::PathMatch::Exact(p) => PathMatcher::Exact(p.into()),
            valid::PathMatch::Prefix(p) => PathMatcher::Prefix(p.into()),
            valid::PathMatch::Regex(p) => PathMatcher::Regex(p),
        },
        method: m.method,
        headers: m.headers.into_iter().map(|(n, v)| (n, value(v))).collect(),
        query: m.query.into_iter().map(|(n, v)| (n, value(v))).collect(),
    }
}

fn filters(f: valid::Filters, upstreams: &mut Upstreams) -> Result<Filters, UpstreamError> {
    if f.is_empty() {
        return Ok(Filters::default());
    }
    let mirrors = f
        .mirrors
        .into_iter()
        .map(|m| {
            upstreams.get(m.target).map(|upstream| Mirror {
                upstream,
                share: m.share,
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
