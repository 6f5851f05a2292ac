//! A route of either kind as the translation reads it: its identity, precedence, hostnames and
//! `parentRefs`, collected from the snapshot once. Attachment ([`super::binding`]) and the
//! translation of its rules ([`super::http_route`], [`super::grpc_route`]) both start here.

use std::borrow::Cow;
use std::cmp::Ordering;

use cftunnel_config::valid;
use gateway_api::experimental::grpcroutes::GrpcRoute;
use gateway_api::experimental::httproutes::HttpRoute;

use super::{ObjectKey, Precedence, RouteKey, RouteKind, Snapshot};

/// The route object itself, by kind.
#[derive(Debug, Clone, Copy)]
pub(super) enum RouteSource<'a> {
    Http(&'a HttpRoute),
    Grpc(&'a GrpcRoute),
}

/// One `parentRefs` entry, whichever the route kind.
#[derive(Debug, Clone)]
pub(super) struct ParentRefView<'a> {
    pub(super) group: Option<&'a str>,
    pub(super) kind: Option<&'a str>,
    pub(super) namespace: Option<&'a str>,
    pub(super) name: &'a str,
    pub(super) section_name: Option<&'a str>,
    pub(super) port: Option<i32>,
}

/// The kind-independent part of a route.
#[derive(Debug, Clone)]
pub(super) struct RouteView<'a> {
    pub(super) kind: RouteKind,
    pub(super) namespace: &'a str,
    pub(super) name: &'a str,
    /// Its place in precedence, kept for the sort of every route.
    precedence: Precedence<'a>,
    pub(super) generation: Option<i64>,
    /// Lower-cased: borrowed where the route wrote them so, as it almost always does.
    pub(super) hostnames: Vec<Cow<'a, str>>,
    /// Set when a route hostname cannot be served; the route is then refused on every parent
    /// (dropping the name would widen the route to more hosts).
    pub(super) invalid_hostnames: Option<String>,
    pub(super) parent_refs: Vec<ParentRefView<'a>>,
    pub(super) source: RouteSource<'a>,
}

impl<'a> RouteView<'a> {
    pub(super) fn key(&self) -> RouteKey {
        RouteKey {
            kind: self.kind,
            key: ObjectKey::new(self.namespace, self.name),
        }
    }

    /// How many rules the route writes.
    pub(super) fn rule_count(&self) -> usize {
        match self.source {
            RouteSource::Http(r) => r.spec.rules.as_ref().map_or(0, Vec::len),
            RouteSource::Grpc(r) => r.spec.rules.as_ref().map_or(0, Vec::len),
        }
    }

    /// Gateway API precedence across routes (see [`Precedence`]); the kind breaks the last tie
    /// so the order is total.
    pub(super) fn precedence_cmp(&self, other: &Self) -> Ordering {
        self.precedence
            .cmp(&other.precedence)
            .then_with(|| self.kind.cmp(&other.kind))
    }
}

/// Builds the view of a route of either kind: the generated HTTPRoute and GRPCRoute types
/// share these field names but not a type.
macro_rules! route_view {
    ($route:expr, $kind:expr, $source:expr) => {{
        let r = $route;
        match (r.metadata.namespace.as_deref(), r.metadata.name.as_deref()) {
            (Some(namespace), Some(name)) => Some(RouteView {
                kind: $kind,
                namespace,
                name,
                precedence: Precedence::keyed(
                    r.metadata.creation_timestamp.as_ref(),
                    namespace,
                    name,
                ),
                generation: r.metadata.generation,
                hostnames: lower(r.spec.hostnames.as_deref()),
                invalid_hostnames: invalid_hostnames(r.spec.hostnames.as_deref()),
                parent_refs: r
                    .spec
                    .parent_refs
                    .iter()
                    .flatten()
                    .map(|p| ParentRefView {
                        group: p.group.as_deref(),
                        kind: p.kind.as_deref(),
                        namespace: p.namespace.as_deref(),
                        name: &p.name,
                        section_name: p.section_name.as_deref(),
                        port: p.port,
                    })
                    .collect(),
                source: $source(r),
            }),
            _ => None,
        }
    }};
}

pub(super) fn collect_routes(snapshot: &Snapshot) -> Vec<RouteView<'_>> {
    let http = snapshot
        .http_routes
        .iter()
        .filter_map(|r| route_view!(r, RouteKind::Http, RouteSource::Http));
    let grpc = snapshot
        .grpc_routes
        .iter()
        .filter_map(|r| route_view!(r, RouteKind::Grpc, RouteSource::Grpc));
    let mut routes = Vec::with_capacity(snapshot.http_routes.len() + snapshot.grpc_routes.len());
    routes.extend(http.chain(grpc));
    routes
}

fn invalid_hostnames(hostnames: Option<&[String]>) -> Option<String> {
    let hostnames = hostnames.unwrap_or_default();
    // Almost always every hostname is valid: then nothing is collected.
    if hostnames.iter().all(|h| valid::check_hostname(h).is_ok()) {
        return None;
    }
    let problems: Vec<String> = hostnames
        .iter()
        .enumerate()
        .filter_map(|(i, h)| {
            valid::check_hostname(h)
                .err()
                .map(|e| format!("spec.hostnames[{i}]: {e}"))
        })
        .collect();
    (!problems.is_empty()).then(|| problems.join("; "))
}

fn lower(hostnames: Option<&[String]>) -> Vec<Cow<'_, str>> {
    hostnames
        .unwrap_or_default()
        .iter()
        .map(|h| {
            // Every byte is read (almost no name has a capital to stop at), without a branch
            // per byte.
            if h.bytes()
                .fold(false, |upper, b| upper | b.is_ascii_uppercase())
            {
                Cow::Owned(h.to_ascii_lowercase())
            } else {
                Cow::Borrowed(h.as_str())
            }
        })
        .collect()
}
