//! HTTPRoute rules to config rules: matches, filters (rule and backend level), timeouts,
//! retry, rule names, backends; plus the per-route `ResolvedRefs` and dropped-rule accounting.

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::BTreeSet;

use cftunnel_config::valid;
use cftunnel_config::{
    BackendProtocol, Cors, Duration, Filter, FilterType, Header, HeaderModifier, Match, PathMatch,
    PathMatchType, PathModifierType, RedirectPath, RequestMirror, RequestRedirect, Retry,
    RewritePath, Rule, Timeouts, UrlRewrite, ValueMatch, ValueMatchType,
};
use gateway_api::experimental::httproutes::{
    HttpRoute, HttpRouteRules, HttpRouteRulesBackendRefs, HttpRouteRulesFilters,
    HttpRouteRulesFiltersRequestRedirectPathType, HttpRouteRulesFiltersRequestRedirectScheme,
    HttpRouteRulesFiltersType, HttpRouteRulesFiltersUrlRewritePathType, HttpRouteRulesMatches,
    HttpRouteRulesMatchesHeadersType, HttpRouteRulesMatchesMethod, HttpRouteRulesMatchesPathType,
    HttpRouteRulesMatchesQueryParamsType,
};

use super::backend::{self, WeightedTarget};
use super::backend_ref::{BackendRefError, BackendRefView};
use super::backend_tls::PortKey;
use super::field::Field;
use super::route::RouteView;
use super::rule::{RuleError, RuleTemplate, TranslatedRoute};
use super::{Index, Options, GATEWAY_CONFIG_GROUP};
use crate::access_policy::ACCESS_POLICY_KIND;

/// Context shared by the rules of one route.
pub(super) struct RouteContext<'a, 'b> {
    pub(super) route: &'b RouteView<'a>,
    pub(super) index: &'b Index<'a>,
    pub(super) options: &'b Options,
    /// The config contract's compiled patterns and parsed targets, shared by every route of a
    /// translation, so each regex is compiled once.
    pub(super) contract: &'b RefCell<valid::Cache>,
    /// The Service ports the route's backends use (for the status of the BackendTLSPolicies
    /// covering them).
    pub(super) ports: RefCell<BTreeSet<PortKey>>,
}

pub(super) fn translate_rules(
    route: &RouteView<'_>,
    http: &HttpRoute,
    index: &Index<'_>,
    options: &Options,
    contract: &RefCell<valid::Cache>,
) -> TranslatedRoute {
    let ctx = RouteContext {
        route,
        index,
        options,
        contract,
        ports: RefCell::default(),
    };
    translate_all(
        &ctx,
        http.spec.rules.as_deref().unwrap_or_default(),
        None,
        |rule, field| {
            rule.matches
                .iter()
                .flatten()
                .enumerate()
                .map(|(j, m)| convert_match(m, field.item("matches", j), contract))
                .collect()
        },
        |rule, _| Ok(Cow::Borrowed(rule)),
    )
}

/// Translates the rules of a route of either kind: `matches` converts a rule's matches,
/// `as_http` gives its filters, backendRefs, timeouts and retry in HTTPRoute shape.
pub(super) fn translate_all<'r, R>(
    ctx: &RouteContext<'_, '_>,
    rules: &'r [R],
    protocol: Option<BackendProtocol>,
    matches: impl Fn(&R, Field<'_>) -> Result<Vec<Match>, RuleError>,
    as_http: impl Fn(&'r R, Field<'_>) -> Result<Cow<'r, HttpRouteRules>, RuleError>,
) -> TranslatedRoute {
    let mut out = TranslatedRoute {
        rules: Vec::with_capacity(rules.len()),
        ..TranslatedRoute::default()
    };
    let spec = Field::Root("spec");
    // The first dropped rule that names an ExtensionRef (a Cloudflare Access requirement).
    let mut dropped_guard = None;
    for (i, rule) in rules.iter().enumerate() {
        let field = spec.item("rules", i);
        let translated = matches(rule, field).and_then(|m| {
            let m = if m.is_empty() {
                vec![default_match()]
            } else {
                m
            };
            let http = as_http(rule, field)?;
            let rule = translate_rule(ctx, i, &http, m, protocol, field, &mut out.ref_errors)?;
            // The contract the proxy compiles with: what it would refuse is left out here,
            // and the route says why, rather than the proxy refusing the plane's document.
            valid::check(&rule, &mut ctx.contract.borrow_mut()).map_err(|invalid| {
                RuleError::Refused {
                    field: field.to_string(),
                    invalid,
                }
            })?;
            Ok(rule)
        });
        match translated {
            Ok(rule) => out.rules.push(RuleTemplate {
                rule,
                index: i,
                grpc: None,
            }),
            Err(e) => {
                if dropped_guard.is_none() && as_http(rule, field).is_ok_and(|h| guarded(&h)) {
                    dropped_guard = Some(field.to_string());
                }
                out.dropped.push(e);
            }
        }
    }
    // Requests the dropped rule would have checked could match a later rule (a catch-all) and
    // reach its backend unchecked: the route serves nothing rather than that.
    if let Some(guard) = dropped_guard {
        for kept in out.rules.drain(..) {
            out.dropped.push(RuleError::unsupported(
                spec.item("rules", kept.index).to_string(),
                format!(
                    "left out with {guard}, whose Cloudflare Access requirement cannot be \
                     served: its requests could otherwise reach this rule unchecked"
                ),
            ));
        }
    }
    out.ports = ctx.ports.take();
    out
}

/// Whether a rule names an ExtensionRef filter: an Access requirement, or one that fails
/// closed; either way its requests must not be served without it.
fn guarded(rule: &HttpRouteRules) -> bool {
    rule.filters
        .iter()
        .flatten()
        .any(|f| f.r#type == HttpRouteRulesFiltersType::ExtensionRef)
}

/// The match of a rule without matches: every request (Gateway API default `PathPrefix /`).
fn default_match() -> Match {
    Match {
        path: Some(PathMatch {
            kind: PathMatchType::PathPrefix,
            value: "/".to_owned(),
        }),
        ..Match::default()
    }
}

/// Translates one rule given its already-converted matches. `protocol` forces the backend
/// protocol (GRPCRoute). Boxed where it is built, as its template keeps it
/// ([`RuleTemplate::rule`]).
fn translate_rule(
    ctx: &RouteContext<'_, '_>,
    i: usize,
    rule: &HttpRouteRules,
    matches: Vec<Match>,
    protocol: Option<BackendProtocol>,
    field: Field<'_>,
    ref_errors: &mut Vec<BackendRefError>,
) -> Result<Box<Rule>, RuleError> {
    let all_prefix = matches.iter().all(|m| {
        m.path
            .as_ref()
            .is_some_and(|p| p.kind == PathMatchType::PathPrefix)
    });
    let mut unavailable = None;
    let mut filters = Vec::new();
    let mut redirects = false;
    let mut access = None;
    check_filter_kinds(rule.filters.as_deref().unwrap_or_default(), field)?;
    for (j, f) in rule.filters.iter().flatten().enumerate() {
        let ffield = field.item("filters", j);
        match convert_filter(ctx, f, all_prefix, protocol, ffield, ref_errors)? {
            FilterOutcome::Filter(f) => {
                redirects |= f.kind == FilterType::RequestRedirect;
                filters.push(*f);
            }
            FilterOutcome::Access(a) if access.is_none() => access = Some(a),
            FilterOutcome::Access(_) => {
                // Which of two policies would win is not the route's to leave open.
                ref_errors.push(BackendRefError::AccessPolicyUnusable {
                    field: ffield.to_string(),
                    message: "a rule may name one AccessPolicy".to_owned(),
                });
                unavailable = Some(backend::INVALID_REF_STATUS);
            }
            FilterOutcome::Skip => {}
            FilterOutcome::FailClosed => unavailable = Some(backend::INVALID_REF_STATUS),
        }
    }

    let mut targets = Vec::with_capacity(rule.backend_refs.as_ref().map_or(0, Vec::len));
    for (j, b) in rule.backend_refs.iter().flatten().enumerate() {
        let bfield = field.item("backendRefs", j);
        targets.push(convert_backend(
            ctx, b, protocol, bfield, all_prefix, ref_errors,
        )?);
    }
    let backends = backend::expand(targets);
    if backends.is_empty() && !redirects {
        // Gateway API: a rule with no backendRefs and no redirect answers 500.
        unavailable = Some(backend::INVALID_REF_STATUS);
    }

    let timeouts = match &rule.timeouts {
        None => None,
        Some(t) => {
            let timeouts = field.child("timeouts");
            let request = gateway_duration(t.request.as_deref(), timeouts.child("request"))?;
            let backend = gateway_duration(
                t.backend_request.as_deref(),
                timeouts.child("backendRequest"),
            )?;
            (request.is_some() || backend.is_some()).then_some(Timeouts { request, backend })
        }
    };
    let retry = match &rule.retry {
        None => None,
        Some(r) => {
            let attempts = match r.attempts {
                None => None,
                Some(a) => Some(u32::try_from(a).map_err(|_| {
                    RuleError::unsupported(format!("{field}.retry.attempts"), "must be 0 or more")
                })?),
            };
            let codes = r
                .codes
                .iter()
                .flatten()
                .map(|c| {
                    u16::try_from(*c)
                        .ok()
                        .filter(|c| (400..=599).contains(c))
                        .ok_or_else(|| {
                            RuleError::unsupported(
                                format!("{field}.retry.codes"),
                                format!("{c} is not a 4xx/5xx status"),
                            )
                        })
                })
                .collect::<Result<Vec<_>, _>>()?;
            let backoff =
                match r.backoff.as_deref() {
                    None => None,
                    Some(b) => Some(b.parse::<Duration>().map_err(|source| {
                        RuleError::InvalidDuration {
                            field: format!("{field}.retry.backoff"),
                            source,
                        }
                    })?),
                };
            Some(Retry {
                codes,
                attempts,
                backoff,
            })
        }
    };
    let mut index = itoa::Buffer::new();
    let rule_name = match &rule.name {
        Some(name) => name.as_str(),
        None => index.format(i),
    };
    Ok(Box::new(Rule {
        hostnames: Vec::new(),
        matches,
        filters,
        backends,
        timeouts,
        unavailable_status: unavailable,
        retry,
        access,
        name: Some(super::joined([
            ctx.route.namespace,
            "/",
            ctx.route.name,
            "/",
            rule_name,
        ])),
    }))
}

fn fraction_refused(field: Field<'_>) -> RuleError {
    RuleError::unsupported(
        format!("{field}.requestMirror.fraction"),
        "numerator must be between 0 and a positive denominator",
    )
}

/// A Gateway API duration; `0s` disables the timeout, and is passed on as such (the proxy's
/// default wait for a response head goes with it).
fn gateway_duration(value: Option<&str>, field: Field<'_>) -> Result<Option<Duration>, RuleError> {
    let Some(value) = value else {
        return Ok(None);
    };
    let d = value
        .parse::<Duration>()
        .map_err(|source| RuleError::InvalidDuration {
            field: field.to_string(),
            source,
        })?;
    Ok(Some(d))
}

fn convert_backend<'t>(
    ctx: &'t RouteContext<'_, '_>,
    b: &'t HttpRouteRulesBackendRefs,
    protocol: Option<BackendProtocol>,
    field: Field<'_>,
    all_prefix: bool,
    ref_errors: &mut Vec<BackendRefError>,
) -> Result<WeightedTarget<'t>, RuleError> {
    let weight = u32::try_from(b.weight.unwrap_or(1))
        .map_err(|_| RuleError::unsupported(format!("{field}.weight"), "must be 0 or more"))?;
    let mut filters = Vec::new();
    let mut fail_closed = false;
    // Most backendRefs have no filters: nothing to reshape or check then.
    let specs: Vec<HttpRouteRulesFilters> = match b.filters.as_deref() {
        None | Some([]) => Vec::new(),
        Some(list) => {
            let specs = list
                .iter()
                .enumerate()
                .map(|(k, f)| reshape(f, field.item("filters", k)))
                .collect::<Result<Vec<_>, _>>()?;
            check_filter_kinds(&specs, field)?;
            specs
        }
    };
    for (k, f) in specs.iter().enumerate() {
        let ffield = field.item("filters", k);
        match convert_filter(ctx, f, all_prefix, protocol, ffield, ref_errors)? {
            FilterOutcome::Filter(f) => filters.push(*f),
            FilterOutcome::Skip => {}
            FilterOutcome::FailClosed => fail_closed = true,
            FilterOutcome::Access(_) => {
                // The check runs before a backend is chosen, so it belongs to the rule.
                ref_errors.push(BackendRefError::AccessPolicyUnusable {
                    field: ffield.to_string(),
                    message: "an AccessPolicy applies to a whole rule: name it in the rule's filters, not a backendRef's".to_owned(),
                });
                fail_closed = true;
            }
        }
    }
    let view = BackendRefView {
        group: b.group.as_deref(),
        kind: b.kind.as_deref(),
        name: &b.name,
        namespace: b.namespace.as_deref(),
        port: b.port,
    };
    let target = match backend::resolve(
        view,
        ctx.route.kind,
        ctx.route.namespace,
        field,
        ctx.index,
        ctx.options,
    ) {
        Ok(mut r) => {
            if let Some(port) = r.port.take() {
                ctx.ports.borrow_mut().insert(*port);
            }
            if let Some(notice) = r.notice.take() {
                ref_errors.push(*notice);
            }
            // A BackendTLSPolicy that cannot be used fails its backends closed (spec: the
            // client gets a 5xx), as an invalid reference does.
            if fail_closed || r.tls_refused {
                Err(r.into_service_url())
            } else {
                Ok(r)
            }
        }
        Err(e) => {
            let url = placeholder_url(view, ctx);
            ref_errors.push(e);
            Err(url)
        }
    };
    Ok(WeightedTarget {
        weight,
        target,
        filters,
        protocol,
    })
}

/// The URL an unresolvable reference would have had; it is never dialled (the backend carries
/// `unavailableStatus`) but names the reference in the config.
fn placeholder_url(r: BackendRefView<'_>, ctx: &RouteContext<'_, '_>) -> String {
    let namespace = r.namespace.unwrap_or(ctx.route.namespace);
    let port = r.port.unwrap_or(80);
    let name = sanitize_label(r.name);
    let namespace = sanitize_label(namespace);
    format!(
        "http://{name}.{namespace}.svc.{}:{port}",
        ctx.options.cluster_domain
    )
}

fn sanitize_label(s: &str) -> String {
    let cleaned: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    if cleaned.is_empty() {
        "invalid".to_owned()
    } else {
        cleaned
    }
}

/// Converts between the structurally identical filter/backend types the Gateway API bindings
/// generate per position (rule vs backendRef, HTTPRoute vs GRPCRoute).
pub(super) fn reshape<T: serde::Serialize, U: serde::de::DeserializeOwned>(
    value: &T,
    field: Field<'_>,
) -> Result<U, RuleError> {
    serde_json::to_value(value)
        .and_then(serde_json::from_value)
        .map_err(|e| RuleError::unsupported(field, e.to_string()))
}

/// Checks a regular expression as the proxy checks it at push (the config contract's
/// [`valid::Pattern`]: the same syntax, anchoring and size limit), so the condition names the
/// Gateway API field.
pub(super) fn check_regex(
    contract: &RefCell<valid::Cache>,
    pattern: &str,
    field: Field<'_>,
) -> Result<(), RuleError> {
    contract
        .borrow_mut()
        .pattern(pattern)
        .map(|_| ())
        .map_err(|message| RuleError::InvalidRegex {
            field: field.to_string(),
            message,
        })
}

fn convert_match(
    m: &HttpRouteRulesMatches,
    field: Field<'_>,
    contract: &RefCell<valid::Cache>,
) -> Result<Match, RuleError> {
    let path = match &m.path {
        None => PathMatch {
            kind: PathMatchType::PathPrefix,
            value: "/".to_owned(),
        },
        Some(p) => {
            // Copied once, as the match keeps it.
            let value = p.value.as_deref().unwrap_or("/");
            let pfield = field.child("path");
            match p
                .r#type
                .as_ref()
                .unwrap_or(&HttpRouteRulesMatchesPathType::PathPrefix)
            {
                HttpRouteRulesMatchesPathType::Exact => {
                    require_absolute(value, pfield)?;
                    PathMatch {
                        kind: PathMatchType::Exact,
                        value: value.to_owned(),
                    }
                }
                HttpRouteRulesMatchesPathType::PathPrefix => {
                    require_absolute(value, pfield)?;
                    // Gateway API: a trailing `/` is ignored for prefix matching.
                    let trimmed = value.trim_end_matches('/');
                    let value = if trimmed.is_empty() { "/" } else { trimmed }.to_owned();
                    PathMatch {
                        kind: PathMatchType::PathPrefix,
                        value,
                    }
                }
                HttpRouteRulesMatchesPathType::RegularExpression => {
                    check_regex(contract, value, pfield)?;
                    PathMatch {
                        kind: PathMatchType::RegularExpression,
                        value: value.to_owned(),
                    }
                }
            }
        }
    };
    let headers = header_matches(
        m.headers.iter().flatten().map(|h| {
            (
                h.name.clone(),
                h.value.clone(),
                matches!(
                    h.r#type,
                    Some(HttpRouteRulesMatchesHeadersType::RegularExpression)
                ),
            )
        }),
        field,
        contract,
    )?;
    let mut query_params: Vec<ValueMatch> = Vec::new();
    for (k, q) in m.query_params.iter().flatten().enumerate() {
        if q.name.is_empty() {
            return Err(RuleError::unsupported(
                format!("{field}.queryParams[{k}].name"),
                "must not be empty",
            ));
        }
        if query_params.iter().any(|x| x.name == q.name) {
            continue;
        }
        let kind = match q.r#type {
            Some(HttpRouteRulesMatchesQueryParamsType::RegularExpression) => {
                check_regex(contract, &q.value, field.item("queryParams", k))?;
                ValueMatchType::RegularExpression
            }
            _ => ValueMatchType::Exact,
        };
        query_params.push(ValueMatch {
            kind,
            name: q.name.clone(),
            value: q.value.clone(),
        });
    }
    Ok(Match {
        path: Some(path),
        headers,
        query_params,
        method: m.method.as_ref().map(|m| method_name(m).to_owned()),
    })
}

pub(super) fn header_matches(
    headers: impl IntoIterator<Item = (String, String, bool)>,
    field: Field<'_>,
    contract: &RefCell<valid::Cache>,
) -> Result<Vec<ValueMatch>, RuleError> {
    let mut out: Vec<ValueMatch> = Vec::new();
    for (k, (name, value, regex)) in headers.into_iter().enumerate() {
        if out.iter().any(|x| x.name.eq_ignore_ascii_case(&name)) {
            continue;
        }
        let hfield = field.item("headers", k);
        valid::header_name(&name).map_err(|e| RuleError::unsupported(hfield, e))?;
        if regex {
            check_regex(contract, &value, hfield)?;
        }
        out.push(ValueMatch {
            kind: if regex {
                ValueMatchType::RegularExpression
            } else {
                ValueMatchType::Exact
            },
            name,
            value,
        });
    }
    Ok(out)
}

fn require_absolute(value: &str, field: Field<'_>) -> Result<(), RuleError> {
    if value.starts_with('/') {
        Ok(())
    } else {
        Err(RuleError::unsupported(field, "path must start with '/'"))
    }
}

fn method_name(m: &HttpRouteRulesMatchesMethod) -> &'static str {
    match m {
        HttpRouteRulesMatchesMethod::Get => "GET",
        HttpRouteRulesMatchesMethod::Head => "HEAD",
        HttpRouteRulesMatchesMethod::Post => "POST",
        HttpRouteRulesMatchesMethod::Put => "PUT",
        HttpRouteRulesMatchesMethod::Delete => "DELETE",
        HttpRouteRulesMatchesMethod::Connect => "CONNECT",
        HttpRouteRulesMatchesMethod::Options => "OPTIONS",
        HttpRouteRulesMatchesMethod::Trace => "TRACE",
        HttpRouteRulesMatchesMethod::Patch => "PATCH",
    }
}

enum FilterOutcome {
    Filter(Box<Filter>),
    /// An ExtensionRef to an AccessPolicy: the rule's Cloudflare Access requirement.
    Access(cftunnel_config::Access),
    /// Nothing to do in the data plane (e.g. a mirror whose target has no endpoint).
    Skip,
    /// The filter cannot be honoured: requests it would process get 500 (Gateway API: an
    /// unresolvable filter must not be skipped).
    FailClosed,
}

/// `protocol`: how the route's backends, and so its mirrors, are spoken to whatever their
/// Service says (gRPC: h2c).
fn convert_filter(
    ctx: &RouteContext<'_, '_>,
    f: &HttpRouteRulesFilters,
    all_prefix: bool,
    protocol: Option<BackendProtocol>,
    field: Field<'_>,
    ref_errors: &mut Vec<BackendRefError>,
) -> Result<FilterOutcome, RuleError> {
    let missing = |what: &str| RuleError::unsupported(field, format!("{what} is required"));
    let filter = match f.r#type {
        HttpRouteRulesFiltersType::RequestHeaderModifier => {
            let m = f
                .request_header_modifier
                .as_ref()
                .ok_or_else(|| missing("requestHeaderModifier"))?;
            let mut out = Filter::new(FilterType::RequestHeaderModifier);
            out.request_header_modifier = Some(header_modifier(
                m.set.iter().flatten().map(|h| (&h.name, &h.value)),
                m.add.iter().flatten().map(|h| (&h.name, &h.value)),
                m.remove.as_deref(),
                field.child("requestHeaderModifier"),
            )?);
            out
        }
        HttpRouteRulesFiltersType::ResponseHeaderModifier => {
            let m = f
                .response_header_modifier
                .as_ref()
                .ok_or_else(|| missing("responseHeaderModifier"))?;
            let mut out = Filter::new(FilterType::ResponseHeaderModifier);
            out.response_header_modifier = Some(header_modifier(
                m.set.iter().flatten().map(|h| (&h.name, &h.value)),
                m.add.iter().flatten().map(|h| (&h.name, &h.value)),
                m.remove.as_deref(),
                field.child("responseHeaderModifier"),
            )?);
            out
        }
        HttpRouteRulesFiltersType::RequestRedirect => {
            let r = f
                .request_redirect
                .as_ref()
                .ok_or_else(|| missing("requestRedirect"))?;
            let scheme = r.scheme.as_ref().map(|s| match s {
                HttpRouteRulesFiltersRequestRedirectScheme::Http => "http",
                HttpRouteRulesFiltersRequestRedirectScheme::Https => "https",
            });
            let port = match r.port {
                None => None,
                Some(p) => Some(u16::try_from(p).ok().filter(|p| *p > 0).ok_or_else(|| {
                    RuleError::unsupported(format!("{field}.requestRedirect.port"), "out of range")
                })?),
            };
            // Gateway API: without a port, a redirect to a scheme uses its well-known port.
            let port = port.or(match scheme {
                Some("http") => Some(80),
                Some("https") => Some(443),
                _ => None,
            });
            let status_code = match r.status_code {
                None => None,
                Some(c) => Some(
                    u16::try_from(c)
                        .ok()
                        .filter(|c| matches!(c, 301 | 302 | 303 | 307 | 308))
                        .ok_or_else(|| {
                            RuleError::unsupported(
                                format!("{field}.requestRedirect.statusCode"),
                                format!("{c} is not a redirect status"),
                            )
                        })?,
                ),
            };
            let path = match &r.path {
                None => None,
                Some(p) => Some(match p.r#type {
                    HttpRouteRulesFiltersRequestRedirectPathType::ReplaceFullPath => RedirectPath {
                        kind: PathModifierType::ReplaceFullPath,
                        value: p
                            .replace_full_path
                            .clone()
                            .ok_or_else(|| missing("requestRedirect.path.replaceFullPath"))?,
                    },
                    HttpRouteRulesFiltersRequestRedirectPathType::ReplacePrefixMatch => {
                        require_prefix(all_prefix, field)?;
                        RedirectPath {
                            kind: PathModifierType::ReplacePrefixMatch,
                            value: p.replace_prefix_match.clone().ok_or_else(|| {
                                missing("requestRedirect.path.replacePrefixMatch")
                            })?,
                        }
                    }
                }),
            };
            if let Some(h) = &r.hostname {
                valid::exact_hostname(h, "redirect").map_err(|e| {
                    RuleError::unsupported(format!("{field}.requestRedirect.hostname"), e)
                })?;
            }
            if let Some(p) = &path {
                valid::replacement_path(&p.value).map_err(|e| {
                    RuleError::unsupported(format!("{field}.requestRedirect.path"), e)
                })?;
            }
            let mut out = Filter::new(FilterType::RequestRedirect);
            out.request_redirect = Some(RequestRedirect {
                scheme: scheme.map(str::to_owned),
                hostname: r.hostname.clone(),
                port,
                path,
                status_code,
            });
            out
        }
        HttpRouteRulesFiltersType::UrlRewrite => {
            let r = f
                .url_rewrite
                .as_ref()
                .ok_or_else(|| missing("urlRewrite"))?;
            let path = match &r.path {
                None => None,
                Some(p) => Some(match p.r#type {
                    HttpRouteRulesFiltersUrlRewritePathType::ReplaceFullPath => RewritePath {
                        kind: PathModifierType::ReplaceFullPath,
                        replace_full_path: Some(
                            p.replace_full_path
                                .clone()
                                .ok_or_else(|| missing("urlRewrite.path.replaceFullPath"))?,
                        ),
                        replace_prefix_match: None,
                    },
                    HttpRouteRulesFiltersUrlRewritePathType::ReplacePrefixMatch => {
                        require_prefix(all_prefix, field)?;
                        RewritePath {
                            kind: PathModifierType::ReplacePrefixMatch,
                            replace_full_path: None,
                            replace_prefix_match: Some(
                                p.replace_prefix_match
                                    .clone()
                                    .ok_or_else(|| missing("urlRewrite.path.replacePrefixMatch"))?,
                            ),
                        }
                    }
                }),
            };
            if let Some(h) = &r.hostname {
                valid::exact_hostname(h, "rewrite").map_err(|e| {
                    RuleError::unsupported(format!("{field}.urlRewrite.hostname"), e)
                })?;
            }
            if let Some(p) = &path {
                let value = p
                    .replace_full_path
                    .as_deref()
                    .or(p.replace_prefix_match.as_deref())
                    .unwrap_or_default();
                valid::replacement_path(value)
                    .map_err(|e| RuleError::unsupported(format!("{field}.urlRewrite.path"), e))?;
            }
            let mut out = Filter::new(FilterType::URLRewrite);
            out.url_rewrite = Some(UrlRewrite {
                hostname: r.hostname.clone(),
                path,
            });
            out
        }
        HttpRouteRulesFiltersType::RequestMirror => {
            let m = f
                .request_mirror
                .as_ref()
                .ok_or_else(|| missing("requestMirror"))?;
            let (percent, fraction) = match (&m.percent, &m.fraction) {
                (Some(p), _) => {
                    let percent =
                        u32::try_from(*p)
                            .ok()
                            .filter(|p| *p <= 100)
                            .ok_or_else(|| {
                                RuleError::unsupported(
                                    format!("{field}.requestMirror.percent"),
                                    "must be 0..100",
                                )
                            })?;
                    (Some(percent), None)
                }
                (None, Some(fr)) => {
                    let den = fr.denominator.unwrap_or(100);
                    let (Ok(numerator), Ok(denominator)) =
                        (u32::try_from(fr.numerator), u32::try_from(den))
                    else {
                        return Err(fraction_refused(field));
                    };
                    if denominator == 0 || numerator > denominator {
                        return Err(fraction_refused(field));
                    }
                    // Proxies that predate `fraction` read the nearest whole percent, at
                    // least 1 where anything is copied.
                    let nearest = (u64::from(numerator) * 100 + u64::from(denominator) / 2)
                        / u64::from(denominator);
                    let percent = u32::try_from(nearest)
                        .unwrap_or(100)
                        .max(u32::from(numerator > 0));
                    let fraction = cftunnel_config::Fraction {
                        numerator,
                        denominator,
                    };
                    (Some(percent), Some(fraction))
                }
                (None, None) => (None, None),
            };
            let b = &m.backend_ref;
            let view = BackendRefView {
                group: b.group.as_deref(),
                kind: b.kind.as_deref(),
                name: &b.name,
                namespace: b.namespace.as_deref(),
                port: b.port,
            };
            let mirror = field.child("requestMirror");
            let mfield = mirror.child("backendRef");
            match backend::resolve(
                view,
                ctx.route.kind,
                ctx.route.namespace,
                mfield,
                ctx.index,
                ctx.options,
            ) {
                Err(e) => {
                    ref_errors.push(e);
                    return Ok(FilterOutcome::Skip);
                }
                // A BackendTLSPolicy that cannot be used fails the backend closed: no copies.
                Ok(resolved) if resolved.tls_refused => return Ok(FilterOutcome::Skip),
                Ok(mut resolved) => {
                    if let Some(notice) = resolved.notice.take() {
                        ref_errors.push(*notice);
                    }
                    match backend::mirror_url(&resolved) {
                        None => return Ok(FilterOutcome::Skip),
                        Some(backend_url) => {
                            let mut out = Filter::new(FilterType::RequestMirror);
                            out.request_mirror = Some(RequestMirror {
                                backend_url,
                                percent,
                                fraction,
                                protocol: protocol.unwrap_or(resolved.protocol),
                                public_only: resolved.public_only,
                                // Copies go over TLS as the backend's requests do.
                                tls: resolved.tls.map(|tls| *tls),
                            });
                            out
                        }
                    }
                }
            }
        }
        HttpRouteRulesFiltersType::Cors => {
            let c = f.cors.as_ref().ok_or_else(|| missing("cors"))?;
            let max_age = match c.max_age {
                None => None,
                Some(a) => Some(u32::try_from(a).map_err(|_| {
                    RuleError::unsupported(format!("{field}.cors.maxAge"), "must be 0 or more")
                })?),
            };
            for (name, list) in [
                ("allowOrigins", &c.allow_origins),
                ("allowMethods", &c.allow_methods),
                ("allowHeaders", &c.allow_headers),
                ("exposeHeaders", &c.expose_headers),
            ] {
                valid::header_value(&list.as_deref().unwrap_or_default().join(", "))
                    .map_err(|e| RuleError::unsupported(format!("{field}.cors.{name}"), e))?;
            }
            let mut out = Filter::new(FilterType::Cors);
            out.cors = Some(Cors {
                allow_origins: c.allow_origins.clone().unwrap_or_default(),
                allow_credentials: c.allow_credentials,
                allow_methods: c.allow_methods.clone().unwrap_or_default(),
                allow_headers: c.allow_headers.clone().unwrap_or_default(),
                expose_headers: c.expose_headers.clone().unwrap_or_default(),
                max_age,
            });
            out
        }
        HttpRouteRulesFiltersType::ExtensionRef => {
            return Ok(extension_ref(ctx, f, field, ref_errors));
        }
        HttpRouteRulesFiltersType::ExternalAuth => {
            ref_errors.push(BackendRefError::UnsupportedFilter {
                field: field.to_string(),
                kind: "ExternalAuth",
            });
            return Ok(FilterOutcome::FailClosed);
        }
    };
    Ok(FilterOutcome::Filter(Box::new(filter)))
}

/// An ExtensionRef filter: an `AccessPolicy` of the route's namespace becomes the rule's
/// Access requirement. Any other kind, or a policy that is missing or unusable, fails the
/// rule closed (Gateway API: a filter that cannot be resolved must not be skipped; requests
/// it would process get 500) and sets `ResolvedRefs=False`.
fn extension_ref(
    ctx: &RouteContext<'_, '_>,
    f: &HttpRouteRulesFilters,
    field: Field<'_>,
    ref_errors: &mut Vec<BackendRefError>,
) -> FilterOutcome {
    let Some(r) = f.extension_ref.as_ref() else {
        ref_errors.push(BackendRefError::AccessPolicyUnusable {
            field: field.to_string(),
            message: "extensionRef is required".to_owned(),
        });
        return FilterOutcome::FailClosed;
    };
    if r.group != GATEWAY_CONFIG_GROUP || r.kind != ACCESS_POLICY_KIND {
        ref_errors.push(BackendRefError::UnsupportedFilter {
            field: field.to_string(),
            kind: "ExtensionRef",
        });
        return FilterOutcome::FailClosed;
    }
    let namespace = ctx.route.namespace;
    let Some(policy) = ctx.index.access_policy(namespace, &r.name) else {
        ref_errors.push(BackendRefError::AccessPolicyNotFound {
            field: format!("{field}.extensionRef"),
            namespace: namespace.to_owned(),
            name: r.name.clone(),
        });
        return FilterOutcome::FailClosed;
    };
    match policy.to_document() {
        Ok(access) => FilterOutcome::Access(access),
        Err(invalid) => {
            ref_errors.push(BackendRefError::AccessPolicyUnusable {
                field: format!("{field}.extensionRef"),
                message: format!("AccessPolicy {namespace}/{}: spec.{invalid}", r.name),
            });
            FilterOutcome::FailClosed
        }
    }
}

/// Gateway API: each filter type but RequestMirror and ExtensionRef appears at most once in a
/// list, and RequestRedirect excludes URLRewrite.
/// Checks the filter kinds of the object at `parent`, whose `filters` they are (the field is
/// written out only for an error).
fn check_filter_kinds(
    filters: &[HttpRouteRulesFilters],
    parent: Field<'_>,
) -> Result<(), RuleError> {
    use HttpRouteRulesFiltersType as T;
    let field = || format!("{parent}.filters");
    let count = |kind: T| filters.iter().filter(|f| f.r#type == kind).count();
    for (kind, name) in [
        (T::RequestHeaderModifier, "RequestHeaderModifier"),
        (T::ResponseHeaderModifier, "ResponseHeaderModifier"),
        (T::RequestRedirect, "RequestRedirect"),
        (T::UrlRewrite, "URLRewrite"),
        (T::Cors, "CORS"),
    ] {
        if count(kind) > 1 {
            return Err(RuleError::unsupported(
                field(),
                format!("{name} may appear only once"),
            ));
        }
    }
    if count(T::RequestRedirect) > 0 && count(T::UrlRewrite) > 0 {
        return Err(RuleError::unsupported(
            field(),
            "RequestRedirect and URLRewrite cannot be combined",
        ));
    }
    Ok(())
}

fn require_prefix(all_prefix: bool, field: Field<'_>) -> Result<(), RuleError> {
    if all_prefix {
        Ok(())
    } else {
        Err(RuleError::unsupported(
            field,
            "ReplacePrefixMatch requires every match of the rule to be a PathPrefix match",
        ))
    }
}

fn header_modifier<'a>(
    set: impl Iterator<Item = (&'a String, &'a String)>,
    add: impl Iterator<Item = (&'a String, &'a String)>,
    remove: Option<&[String]>,
    field: Field<'_>,
) -> Result<HeaderModifier, RuleError> {
    let header = |(name, value): (&String, &String)| -> Result<Header, RuleError> {
        valid::header_name(name)
            .and_then(|_| valid::header_value(value))
            .map_err(|e| RuleError::unsupported(field, e))?;
        Ok(Header {
            name: name.clone(),
            value: value.clone(),
        })
    };
    let remove = remove.map(<[String]>::to_vec).unwrap_or_default();
    for name in &remove {
        valid::header_name(name).map_err(|e| RuleError::unsupported(field, e))?;
    }
    Ok(HeaderModifier {
        set: set.map(header).collect::<Result<_, _>>()?,
        add: add.map(header).collect::<Result<_, _>>()?,
        remove,
    })
}
