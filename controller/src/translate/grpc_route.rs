//! GRPCRoute rules to config rules: `service`/`method` matches become path matches on
//! `/<service>/<method>`, header matches and filters carry over, backends speak h2c.

use std::borrow::Cow;

use cftunnel_config::{BackendProtocol, Match, PathMatch, PathMatchType};
use gateway_api::experimental::grpcroutes::{
    GrpcRoute, GrpcRouteRulesMatches, GrpcRouteRulesMatchesHeadersType,
    GrpcRouteRulesMatchesMethodType,
};
use gateway_api::experimental::httproutes::HttpRouteRules;

use super::binding::RouteView;
use super::http_route::{
    check_regex, header_matches, reshape, translate_all, RouteContext, RuleError, TranslatedRoute,
};
use super::{Index, Options};

pub(super) fn translate_rules(
    route: &RouteView<'_>,
    grpc: &GrpcRoute,
    index: &Index<'_>,
    options: &Options,
) -> TranslatedRoute {
    let ctx = RouteContext {
        route,
        index,
        options,
    };
    translate_all(
        &ctx,
        grpc.spec.rules.as_deref().unwrap_or_default(),
        Some(BackendProtocol::H2c),
        |rule, field| {
            rule.matches
                .iter()
                .flatten()
                .enumerate()
                .map(|(j, m)| convert_match(m, &format!("{field}.matches[{j}]")))
                .collect()
        },
        |rule, field| {
            // Filters and backendRefs of a GRPCRoute rule are a subset of an HTTPRoute rule's.
            let mut shared = rule.clone();
            shared.matches = None;
            reshape::<_, HttpRouteRules>(&shared, field).map(Cow::Owned)
        },
    )
}

/// A gRPC method match as a path match: Exact `/S/M`, `PathPrefix /S` for a service alone,
/// and a regular expression when either part is a regex or the service is omitted.
fn convert_match(m: &GrpcRouteRulesMatches, field: &str) -> Result<Match, RuleError> {
    let path = match &m.method {
        None => PathMatch {
            kind: PathMatchType::PathPrefix,
            value: "/".to_owned(),
        },
        Some(method) => {
            let mfield = format!("{field}.method");
            let service = method.service.as_deref().filter(|s| !s.is_empty());
            let name = method.method.as_deref().filter(|s| !s.is_empty());
            let regex = matches!(
                method.r#type,
                Some(GrpcRouteRulesMatchesMethodType::RegularExpression)
            );
            match (regex, service, name) {
                (_, None, None) => {
                    return Err(RuleError::UnsupportedValue {
                        field: mfield,
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
                    value: format!("/[^/]+/{}", regex::escape(n)),
                },
                (true, s, n) => {
                    if let Some(s) = s {
                        check_regex(s, &format!("{mfield}.service"))?;
                    }
                    if let Some(n) = n {
                        check_regex(n, &format!("{mfield}.method"))?;
                    }
                    let value =
                        format!("/(?:{})/(?:{})", s.unwrap_or("[^/]+"), n.unwrap_or("[^/]+"));
                    check_regex(&value, &mfield)?;
                    PathMatch {
                        kind: PathMatchType::RegularExpression,
                        value,
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
                    Some(GrpcRouteRulesMatchesHeadersType::RegularExpression)
                ),
            )
        }),
        field,
    )?;
    Ok(Match {
        path: Some(path),
        headers,
        ..Match::default()
    })
}
