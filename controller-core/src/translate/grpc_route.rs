//! GRPCRoute rules to config rules: `service`/`method` matches become path matches on
//! `/<service>/<method>`, header matches and filters carry over, backends speak h2c. Each match
//! becomes a rule of its own and GRPCRoute rules are put in spec precedence order ([`order`]),
//! so the proxy's ranking follows Gateway API's but for two corner cases.
//! See docs/design/grpc-routes.md.

use std::borrow::Cow;
use std::cell::RefCell;

use cftunnel_config::valid;
use cftunnel_config::{BackendProtocol, Match, PathMatch, PathMatchType, Rule};
use gateway_api::experimental::grpcroutes::{
    GrpcRoute, GrpcRouteRules, GrpcRouteRulesMatches, GrpcRouteRulesMatchesHeadersType,
    GrpcRouteRulesMatchesMethodType,
};
use gateway_api::experimental::httproutes::HttpRouteRules;

use super::field::Field;
use super::http_route::{check_regex, header_matches, reshape, translate_all, RouteContext};
use super::route::RouteView;
use super::rule::{MatchRank, Placement, RuleError, RuleTemplate, TranslatedRoute};
use super::{Index, Options};

pub(super) fn translate_rules(
    route: &RouteView<'_>,
    grpc: &GrpcRoute,
    index: &Index<'_>,
    options: &Options,
    contract: &RefCell<valid::Cache>,
) -> TranslatedRoute {
    let ctx = RouteContext {
        route,
        index,
        options,
        contract,
        ports: std::cell::RefCell::default(),
    };
    let rules = grpc.spec.rules.as_deref().unwrap_or_default();
    let mut out = translate_all(
        &ctx,
        rules,
        Some(BackendProtocol::H2c),
        |rule, field| {
            let matches = rule.matches.as_deref().unwrap_or_default();
            if matches.is_empty() {
                // Gateway API: a rule without matches matches every gRPC request.
                return Ok(vec![match_any()]);
            }
            matches
                .iter()
                .enumerate()
                .map(|(j, m)| convert_match(m, field.item("matches", j), contract))
                .collect()
        },
        |rule, field| {
            // Filters and backendRefs of a GRPCRoute rule are a subset of an HTTPRoute rule's.
            let mut shared = rule.clone();
            shared.matches = None;
            reshape::<_, HttpRouteRules>(&shared, field).map(Cow::Owned)
        },
    );
    out.rules = std::mem::take(&mut out.rules)
        .into_iter()
        .flat_map(|template| split(template, rules))
        .collect();
    out
}

/// Where match `m` (the `matched`th of rule `rule`) ranks: see docs/design/grpc-routes.md.
fn rank(m: Option<&GrpcRouteRulesMatches>, rule: usize, matched: usize) -> MatchRank {
    let method = m.and_then(|m| m.method.as_ref());
    let chars = |s: Option<&String>| s.map_or(0, String::len);
    MatchRank {
        service: chars(method.and_then(|m| m.service.as_ref())),
        method: chars(method.and_then(|m| m.method.as_ref())),
        headers: m.and_then(|m| m.headers.as_ref()).map_or(0, Vec::len),
        rule,
        matched,
    }
}

/// One template per match of a translated GRPCRoute rule, each ranked by its match.
fn split(template: RuleTemplate, rules: &[GrpcRouteRules]) -> Vec<RuleTemplate> {
    let spec = rules
        .get(template.index)
        .and_then(|r| r.matches.as_deref())
        .unwrap_or_default();
    let RuleTemplate { rule, index, .. } = template;
    rule.matches
        .iter()
        .enumerate()
        .map(|(j, m)| RuleTemplate {
            rule: Box::new(Rule {
                matches: vec![m.clone()],
                ..Rule::clone(&rule)
            }),
            index,
            grpc: Some(rank(spec.get(j), index, j)),
        })
        .collect()
}

/// Puts the rules of a document in the order to push them: GRPCRoute rules, at the positions
/// `grpc` gives with their placements (in increasing position), sorted by placement in the
/// places GRPCRoute rules hold; every other rule stays where it is. `swap` swaps the rules at
/// two positions, so only GRPCRoute rules move, and each at most once.
pub(super) fn order(mut grpc: Vec<(Placement, usize)>, mut swap: impl FnMut(usize, usize)) {
    if grpc.is_empty() {
        return;
    }
    let slots: Vec<usize> = grpc.iter().map(|&(_, at)| at).collect();
    grpc.sort_unstable();
    // The `k`th place takes the rule of the `from[k]`th: a permutation, followed cycle by
    // cycle.
    let from: Vec<usize> = grpc
        .iter()
        .map(|&(_, at)| slots.binary_search(&at).unwrap_or_default())
        .collect();
    let mut done = vec![false; from.len()];
    for start in 0..from.len() {
        let mut k = start;
        while !done[k] {
            done[k] = true;
            let next = from[k];
            if next == start {
                break;
            }
            swap(slots[k], slots[next]);
            k = next;
        }
    }
}

/// The path match of a GRPCRoute match without a method: every request, ranked after the
/// matches that name a service or method.
fn match_any() -> Match {
    Match {
        path: Some(PathMatch {
            kind: PathMatchType::RegularExpression,
            value: ".*".to_owned(),
        }),
        ..Match::default()
    }
}

/// A gRPC method match as a path match: Exact `/S/M`, `PathPrefix /S` for a service alone,
/// and a regular expression when either part is a regex or the service is omitted; without
/// a method match, [`match_any`].
fn convert_match(
    m: &GrpcRouteRulesMatches,
    field: Field<'_>,
    contract: &RefCell<valid::Cache>,
) -> Result<Match, RuleError> {
    let path = match &m.method {
        None => match_any().path,
        Some(method) => {
            let mfield = field.child("method");
            let service = method.service.as_deref().filter(|s| !s.is_empty());
            let name = method.method.as_deref().filter(|s| !s.is_empty());
            let regex = matches!(
                method.r#type,
                Some(GrpcRouteRulesMatchesMethodType::RegularExpression)
            );
            Some(match (regex, service, name) {
                (_, None, None) => {
                    return Err(RuleError::UnsupportedValue {
                        field: mfield.to_string(),
                        message: "one of service or method is required".to_owned(),
                    })
                }
                (false, Some(s), Some(n)) => PathMatch {
                    kind: PathMatchType::Exact,
                    value: format!("/{s}/{n}"),
                },
                (false, Some(s), None) => PathMatch {
                    kind: PathMatchType::PathPrefix,
                    value: format!("/{s}"),
                },
                (false, None, Some(n)) => PathMatch {
                    kind: PathMatchType::RegularExpression,
                    value: format!("/[^/]+/{}", valid::escape(n)),
                },
                (true, s, n) => {
                    if let Some(s) = s {
                        check_regex(contract, s, mfield.child("service"))?;
                    }
                    if let Some(n) = n {
                        check_regex(contract, n, mfield.child("method"))?;
                    }
                    let value =
                        format!("/(?:{})/(?:{})", s.unwrap_or("[^/]+"), n.unwrap_or("[^/]+"));
                    check_regex(contract, &value, mfield)?;
                    PathMatch {
                        kind: PathMatchType::RegularExpression,
                        value,
                    }
                }
            })
        }
    };
    let headers = header_matches(
        m.headers.iter().flatten().map(|h| {
            (
                h.name.clone(),
                h.value.clone(),
                matches!(
                    h.r#type,
                    Some(GrpcRouteRulesMatchesHeadersType::RegularExpression)
                ),
            )
        }),
        field,
        contract,
    )?;
    Ok(Match {
        path,
        headers,
        ..Match::default()
    })
}
