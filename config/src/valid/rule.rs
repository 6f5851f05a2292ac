//! A rule, checked: where it applies (hostnames, matches) and what it does (filters,
//! backends, timeouts, retries).

use super::budget::{Named, Site};
use super::filter::{self, Filters};
use super::{access, name, status, Access, At, Cache, Invalid, Keep, Pattern, Target};
use crate::document as doc;
use crate::path;
use http::{HeaderName, Method, StatusCode};
use std::sync::Arc;
use std::time::Duration;

/// A rule that satisfies every rule of the contract, with its values parsed.
#[derive(Debug, Clone)]
pub struct Rule {
    /// `<namespace>/<route>/<rule>`, for logs and for naming the rule in errors.
    pub name: Option<Box<str>>,
    /// Lower-case, exact or `*.` wildcard; empty: any host.
    pub hostnames: Vec<Box<str>>,
    /// Never empty: a rule without matches matches every request (one `PathPrefix /`).
    pub matches: Vec<Match>,
    pub filters: Filters,
    pub backends: Vec<Backend>,
    /// Bounds the whole exchange, retries included; `None`: unbounded (absent or zero).
    pub request_timeout: Option<Duration>,
    /// Bounds each try; `None`: the proxy's default (absent or zero).
    pub backend_timeout: Option<Duration>,
    /// One of the timeouts is zero: Gateway API's `0s` turns the timeout off, and with it
    /// the proxy's default wait for the response head.
    pub timeouts_off: bool,
    /// Answer this instead of proxying (fail closed).
    pub unavailable: Option<StatusCode>,
    pub retry: Option<Retry>,
    /// A Cloudflare Access token every request must carry; `None`: no check.
    pub access: Option<Access>,
}

/// One entry of a rule's `matches`: every field must hold.
#[derive(Debug, Clone)]
pub struct Match {
    pub path: PathMatch,
    pub method: Option<Method>,
    /// Among equal names (any case) only the first entry counts, as Gateway API says.
    pub headers: Vec<(HeaderName, ValueMatch)>,
    /// Names compared exactly; among equal names only the first entry counts.
    pub query: Vec<(Box<str>, ValueMatch)>,
}

/// A path match. A prefix is stored without its trailing `/` (but `/` itself).
#[derive(Debug, Clone)]
pub enum PathMatch {
    Exact(Box<str>),
    Prefix(Box<str>),
    Regex(Pattern),
}

/// A header or query-parameter value match.
#[derive(Debug, Clone)]
pub enum ValueMatch {
    Exact(Box<str>),
    Regex(Pattern),
}

/// A backend, checked.
#[derive(Debug, Clone)]
pub struct Backend {
    /// `None` only when `unavailable` is set and the URL is empty: a backend never dialled.
    pub target: Option<Arc<Target>>,
    pub filters: Filters,
    pub unavailable: Option<StatusCode>,
    /// 0 never receives traffic.
    pub weight: u32,
}

/// Gateway API `retry`.
#[derive(Debug, Clone)]
pub struct Retry {
    /// Statuses that trigger another try (connection errors always do).
    pub codes: Vec<u16>,
    /// Tries after the first; absent: 1.
    pub attempts: u32,
    pub backoff: Duration,
}

/// Checks one rule and returns it parsed, for a caller that builds from it (the proxy). Fields
/// in the error are relative to the rule (`matches[0].path`).
///
/// Its patterns count against the budget of the document being checked in `cache` (see
/// [`budget`](super::budget)), and their matchers are built, so that no match waits for one.
///
/// # Errors
/// The first value that breaks a rule of the contract.
pub fn rule(rule: &doc::Rule, cache: &mut Cache) -> Result<Rule, Invalid> {
    checked(rule, cache, &mut Named::default())
}

/// [`rule`]'s verdict alone, for a caller that keeps its own copy of the rule (the controller
/// checks every rule it emits, each round): the same checks in the same order, counting the
/// same patterns and targets as used, with nothing of the rule built, no pattern's matcher
/// included. The budget is not counted: it bounds what one document's matchers take once
/// built, and the controller's checks span every plane's rules, so one tenant's patterns
/// would take from another plane's budget: the controller weighs each plane's document
/// apart ([`super::Costs`]).
///
/// # Errors
/// As [`rule`], but for the budget.
pub fn check(rule: &doc::Rule, cache: &mut Cache) -> Result<(), Invalid> {
    checked(rule, cache, &mut Named::default())
}

/// The patterns of a rule that passes [`check`], as [`rule`] counts them against the budget;
/// empty for one that fails it.
pub(super) fn named(rule: &doc::Rule, cache: &mut Cache) -> Named {
    let mut named = Named::default();
    match checked::<()>(rule, cache, &mut named) {
        Ok(()) => named,
        Err(_) => Named::default(),
    }
}

/// What the checks return: the rule built ([`rule`]) or nothing ([`check`]). One body of
/// checks, [`checked`], serves both, so they cannot drift apart: where nothing is built, only
/// what is built from a value that passed is left out. A value whose parse is its check (a
/// header name, a compiled pattern) is parsed either way.
pub(super) trait Form: Keep + Sized {
    fn of(make: impl FnOnce() -> Rule) -> Self;
}

impl Keep for Rule {
    const BUILD: bool = true;
}

impl Form for Rule {
    fn of(make: impl FnOnce() -> Rule) -> Self {
        make()
    }
}

impl Form for () {
    fn of(_: impl FnOnce() -> Rule) {}
}

/// The checks; the patterns the matches name are added to `named`, and counted against the
/// budget once the rest passed where the rule is built.
fn checked<F: Form>(rule: &doc::Rule, cache: &mut Cache, named: &mut Named) -> Result<F, Invalid> {
    let at = At::Rule;
    let capacity = |n: usize| if F::BUILD { n } else { 0 };
    let mut hostnames = Vec::with_capacity(capacity(rule.hostnames.len()));
    for (j, h) in rule.hostnames.iter().enumerate() {
        name::check_hostname(h).map_err(|m| Invalid::new(at.field("hostnames").index(j), m))?;
        if F::BUILD {
            hostnames.push(name::lower_hostname(h));
        }
    }
    let matches = if rule.matches.is_empty() {
        if F::BUILD {
            vec![Match::every_request()]
        } else {
            Vec::new()
        }
    } else {
        let list = at.field("matches");
        let mut matches = Vec::with_capacity(capacity(rule.matches.len()));
        for (j, m) in rule.matches.iter().enumerate() {
            matches.extend(match_::<F>(m, (&list.index(j), j), cache, named)?);
        }
        matches
    };
    let path_regex = rule.matches.iter().any(|m| {
        m.path
            .as_ref()
            .is_some_and(|p| p.kind == doc::PathMatchType::RegularExpression)
    });
    let filters = filter::filters::<F>(&rule.filters, &at.field("filters"), path_regex, cache)?;
    let list = at.field("backends");
    let mut backends = Vec::with_capacity(capacity(rule.backends.len()));
    for (j, b) in rule.backends.iter().enumerate() {
        let at = list.index(j);
        let unavailable = b
            .unavailable_status
            .map(|s| {
                status::final_status(s).map_err(|m| Invalid::new(at.field("unavailableStatus"), m))
            })
            .transpose()?;
        let target = if b.url.is_empty() && unavailable.is_some() {
            None
        } else {
            let target = cache
                .target(
                    &b.url,
                    b.protocol,
                    b.websocket,
                    b.tls.as_ref(),
                    b.public_only,
                )
                .map_err(|e| Invalid::new(at.field(&e.field), e.message))?;
            F::BUILD.then(|| target.clone())
        };
        let filters = filter::filters::<F>(&b.filters, &at.field("filters"), path_regex, cache)?;
        if F::BUILD {
            backends.push(Backend {
                target,
                filters: filters.unwrap_or_default(),
                unavailable,
                weight: b.weight,
            });
        }
    }
    let nonzero = |d: Option<crate::Duration>| d.map(|d| d.0).filter(|d| !d.is_zero());
    let (request_timeout, backend_timeout) = match &rule.timeouts {
        Some(t) => (nonzero(t.request), nonzero(t.backend)),
        None => (None, None),
    };
    let zero = |d: Option<crate::Duration>| d.is_some_and(|d| d.0.is_zero());
    let timeouts_off = rule
        .timeouts
        .as_ref()
        .is_some_and(|t| zero(t.request) || zero(t.backend));
    let retry = match &rule.retry {
        None => None,
        Some(r) => {
            for (k, code) in r.codes.iter().enumerate() {
                status::status(*code)
                    .map_err(|m| Invalid::new(at.field("retry").field("codes").index(k), m))?;
            }
            F::BUILD.then(|| Retry {
                codes: r.codes.clone(),
                attempts: r.attempts.unwrap_or(1),
                backoff: r.backoff.map(|d| d.0).unwrap_or(Duration::ZERO),
            })
        }
    };
    let unavailable = rule
        .unavailable_status
        .map(|s| status::final_status(s).map_err(|m| Invalid::new("unavailableStatus", m)))
        .transpose()?;
    let access = rule.access.as_ref().map(access::access).transpose()?;
    if F::BUILD {
        cache.count(named)?;
    }
    Ok(F::of(|| Rule {
        name: rule.name.as_deref().map(Into::into),
        hostnames,
        matches,
        filters: filters.unwrap_or_default(),
        backends,
        request_timeout,
        backend_timeout,
        timeouts_off,
        unavailable,
        retry,
        access,
    }))
}

impl Match {
    /// The regular expressions of this match: of its path, header and query values.
    pub fn patterns(&self) -> impl Iterator<Item = &Pattern> {
        let path = match &self.path {
            PathMatch::Regex(p) => Some(p),
            _ => None,
        };
        fn value(v: &ValueMatch) -> Option<&Pattern> {
            match v {
                ValueMatch::Regex(p) => Some(p),
                ValueMatch::Exact(_) => None,
            }
        }
        path.into_iter()
            .chain(self.headers.iter().filter_map(|(_, v)| value(v)))
            .chain(self.query.iter().filter_map(|(_, v)| value(v)))
    }

    /// What a rule without matches matches: every request.
    pub fn every_request() -> Self {
        Self {
            path: PathMatch::Prefix("/".into()),
            method: None,
            headers: Vec::new(),
            query: Vec::new(),
        }
    }
}

/// Match `j` of a rule (at `at`), checked; `None` where nothing is built (see [`Form`]). Its
/// patterns are added to `named`.
fn match_<F: Form>(
    m: &doc::Match,
    (at, j): (&At<'_>, usize),
    cache: &mut Cache,
    named: &mut Named,
) -> Result<Option<Match>, Invalid> {
    let path = match &m.path {
        None => F::BUILD.then(|| PathMatch::Prefix("/".into())),
        Some(p) => {
            let at = at.field("path");
            match p.kind {
                doc::PathMatchType::RegularExpression => {
                    let pattern = cache
                        .pattern_for(&p.value, F::BUILD)
                        .map_err(|m| Invalid::regex(at, m))?;
                    named.push(pattern.clone(), Site::Path { m: j });
                    F::BUILD.then(|| PathMatch::Regex(pattern))
                }
                kind => {
                    let value = name::absolute_path(&p.value).map_err(|m| Invalid::new(at, m))?;
                    // Requests are routed on their canonical path, so the value is written the
                    // same way: `/%7Ebob` matches `/~bob`, `/%7ebob` and `/%7Ebob` alike.
                    let canonical = path::canonical(value).map_err(|e| {
                        let m = format!("path {value:?} has {e}, which no routed request has");
                        Invalid::new(at, m)
                    })?;
                    F::BUILD.then(|| {
                        let value = canonical.as_deref().unwrap_or(value);
                        if kind == doc::PathMatchType::Exact {
                            PathMatch::Exact(value.into())
                        } else {
                            let trimmed = value.trim_end_matches('/');
                            PathMatch::Prefix(if trimmed.is_empty() { "/" } else { trimmed }.into())
                        }
                    })
                }
            }
        }
    };
    let method = m
        .method
        .as_deref()
        .map(|s| name::method(s).map_err(|e| Invalid::new(at.field("method"), e)))
        .transpose()?;
    let capacity = |n: usize| if F::BUILD { n } else { 0 };
    let list = at.field("headers");
    let mut headers: Vec<(HeaderName, ValueMatch)> = Vec::with_capacity(capacity(m.headers.len()));
    for (k, h) in m.headers.iter().enumerate() {
        let at = list.index(k);
        let name = name::header_name(&h.name).map_err(|m| Invalid::new(at.field("name"), m))?;
        // Header names are tokens, compared in any case: the entries before passed, so a
        // name equal to one of theirs ignoring case is the same header name.
        if m.headers[..k]
            .iter()
            .any(|earlier| earlier.name.eq_ignore_ascii_case(&h.name))
        {
            continue;
        }
        let site = Site::Header { m: j, k };
        if let Some(value) = value_match::<F>(h, (&at, site), cache, named)? {
            headers.push((name, value));
        }
    }
    let list = at.field("queryParams");
    let mut query: Vec<(Box<str>, ValueMatch)> = Vec::with_capacity(capacity(m.query_params.len()));
    for (k, q) in m.query_params.iter().enumerate() {
        let at = list.index(k);
        if q.name.is_empty() {
            return Err(Invalid::new(at.field("name"), "must not be empty"));
        }
        if m.query_params[..k]
            .iter()
            .any(|earlier| earlier.name == q.name)
        {
            continue;
        }
        let site = Site::Query { m: j, k };
        if let Some(value) = value_match::<F>(q, (&at, site), cache, named)? {
            query.push((q.name.as_str().into(), value));
        }
    }
    Ok(path.map(|path| Match {
        path,
        method,
        headers,
        query,
    }))
}

/// A header or query-parameter value match at `at` (`site` for the budget), checked.
fn value_match<F: Form>(
    v: &doc::ValueMatch,
    (at, site): (&At<'_>, Site),
    cache: &mut Cache,
    named: &mut Named,
) -> Result<Option<ValueMatch>, Invalid> {
    Ok(match v.kind {
        doc::ValueMatchType::Exact => F::BUILD.then(|| ValueMatch::Exact(v.value.as_str().into())),
        doc::ValueMatchType::RegularExpression => {
            let pattern = cache
                .pattern_for(&v.value, F::BUILD)
                .map_err(|m| Invalid::regex(at.field("value"), m))?;
            named.push(pattern.clone(), site);
            F::BUILD.then(|| ValueMatch::Regex(pattern))
        }
    })
}
