//! Pure translation of Gateway API objects into proxy config documents.
//!
//! [`translate`] takes a [`Snapshot`] of the objects the controller watches and returns one
//! config document per data plane plus the status every owned object should carry. It performs
//! no I/O, reads no clock and iterates only ordered maps, so the same snapshot always yields
//! byte-identical output (golden tests rely on this).
//!
//! What it leaves out: talking to the API server, pushing configs and writing status (with
//! `lastTransitionTime`), which belong to the runtime, and the objects of dedicated data planes,
//! which [`crate::render`] produces. A dedicated Gateway is accepted, and gets its tunnel, by
//! the render of its plane ([`render::plan`]): the caller renders once and passes the plans to
//! [`translate_with`], and applies those same planes; [`translate`] renders them itself, for
//! callers that apply nothing.

mod attachment;
mod backend;
mod backend_ref;
mod backend_tls;
mod binding;
pub mod bundle_version;
mod client_certificate;
mod external_backend;
pub mod external_name;
mod features;
mod field;
mod gateway;
mod grpc_route;
mod hostname;
mod http_route;
mod listener;
mod listener_set;
mod listener_tls;
pub mod ownership;
mod plane_rules;
mod route;
mod rule;
mod scheme;
mod service_import;
mod shadow;
mod status;

#[cfg(test)]
mod tests;

use rustc_hash::FxHashMap;
use std::cell::RefCell;
use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;

use cftunnel_config::{valid, Config};
use gateway_api::experimental::referencegrants::ReferenceGrant;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::{Serialize, Serializer};
use sha2::{Digest, Sha256};

use crate::access_policy::AccessPolicySpec;
use crate::external_backend::ExternalBackend;
use crate::render::{self, Plans, RenderSettings};
use crate::service_import::ServiceImport;

pub use crate::snapshot::{
    ObjectKey, Snapshot, EXPERIMENTAL_GATEWAY_API_GROUP, GATEWAY_API_GROUP, GATEWAY_CONFIG_GROUP,
    GATEWAY_CONFIG_KIND,
};
pub use backend_ref::BackendRefError;
pub use external_name::ExternalNameBackends;
pub use features::SUPPORTED_FEATURES;
pub use hostname::route_hosts_through;
pub use rule::RuleError;
pub use status::{
    Condition, ConditionType, GatewayStatus, ListenerSetStatus, ListenerStatus, ParentKind,
    ParentRef, PolicyAncestorStatus, Reason, RouteParentStatus, Statuses,
};

/// The `controllerName` this controller answers for unless configured otherwise.
pub const DEFAULT_CONTROLLER_NAME: &str = "cf.k8s.lex.la/tunnel-controller";
/// The default cluster DNS domain.
pub const DEFAULT_CLUSTER_DOMAIN: &str = "cluster.local";

/// Which Gateways are ours and how cluster names are spelled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// GatewayClasses whose `spec.controllerName` equals this are ours.
    pub controller_name: String,
    /// When set, Gateways of this class are ours whether or not the GatewayClass object is in
    /// the snapshot (offline use); classes matched by `controller_name` stay ours too.
    pub gateway_class_name: Option<String>,
    /// Suffix of Service DNS names (`name.ns.svc.<cluster_domain>`); with
    /// [`ExternalNameBackends::External`], the domain ExternalName backends may not be under.
    pub cluster_domain: String,
    /// Which ExternalName Services are admitted as backends (`--external-name-backends`).
    pub external_name_backends: ExternalNameBackends,
    /// The cluster's own globally routable address ranges (`--cluster-cidrs`): under
    /// [`ExternalNameBackends::External`], an ExternalBackend whose host is an address in one
    /// is refused, as one that is not public is.
    pub cluster_ranges: cftunnel_config::address::ClusterRanges,
    /// The proxy image of dedicated data planes whose `GatewayConfig` names none
    /// (`--proxy-image`). Without either, such a Gateway is not accepted (`InvalidParameters`).
    /// Read by [`translate`], which renders the planes itself; [`translate_with`] takes them
    /// rendered, with the image of the caller's [`RenderSettings`].
    pub proxy_image: Option<String>,
    /// The tunnel of the shared plane (the class tunnel), when known. A dedicated Gateway on
    /// the same tunnel shares it with the shared plane, the documented migration path.
    pub shared_tunnel: Option<TunnelIdentity>,
    /// The tunnel a dedicated plane's pods run on, where it is not the one its render names:
    /// its connector token moved and the move is not applied yet. The plane serves with that
    /// tunnel's planes until the move lands, since its connectors are still there.
    pub running_tunnels: BTreeMap<ObjectKey, TunnelIdentity>,
    /// Routes publish only hostnames their namespace is labelled for (`--hostname-ownership`,
    /// see [`ownership`]).
    pub hostname_ownership: bool,
    /// Owned GatewayClasses whose `parametersRef` cannot be used, with why: `Accepted=False`
    /// (`InvalidParameters`). Settled by [`crate::class_parameters::settle`], whose
    /// settings the caller runs the shared plane with.
    pub refused_classes: BTreeMap<String, String>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            controller_name: DEFAULT_CONTROLLER_NAME.to_owned(),
            gateway_class_name: None,
            cluster_domain: DEFAULT_CLUSTER_DOMAIN.to_owned(),
            external_name_backends: ExternalNameBackends::default(),
            cluster_ranges: cftunnel_config::address::ClusterRanges::default(),
            proxy_image: None,
            shared_tunnel: None,
            running_tunnels: BTreeMap::new(),
            hostname_ownership: false,
            refused_classes: BTreeMap::new(),
        }
    }
}

/// An object's place in Gateway API precedence, where objects of one kind compete for the same
/// thing (routes for a listener, Gateways for a hostname on the shared plane): the oldest first,
/// then the first in alphabetical order of `{namespace}/{name}` (compared as that one string, so
/// `team-a/r` comes before `team/r`). Objects without a creation timestamp sort after those
/// with one.
#[derive(Debug, Clone, Copy)]
struct Precedence<'a> {
    created: Option<&'a Time>,
    namespace: &'a str,
    name: &'a str,
    /// See [`Precedence::keyed`].
    leading: Option<u64>,
}

impl<'a> Precedence<'a> {
    fn new(created: Option<&'a Time>, namespace: &'a str, name: &'a str) -> Self {
        Self {
            created,
            namespace,
            name,
            leading: None,
        }
    }

    /// [`Precedence::new`] for an object compared many times (routes are sorted by it): the
    /// first eight bytes of `{namespace}/{name}`, zero-padded, are kept as one number. Where
    /// two such numbers differ, they order the objects as the joined strings do, in one
    /// comparison instead of a walk of the names; where they are equal, the names decide.
    fn keyed(created: Option<&'a Time>, namespace: &'a str, name: &'a str) -> Self {
        let mut leading = [0u8; 8];
        let joined = namespace
            .bytes()
            .chain(std::iter::once(b'/'))
            .chain(name.bytes());
        for (slot, b) in leading.iter_mut().zip(joined) {
            *slot = b;
        }
        Self {
            leading: Some(u64::from_be_bytes(leading)),
            ..Self::new(created, namespace, name)
        }
    }

    /// `{namespace}/{name}` compared as that one string. Routes are sorted by it, thousands
    /// of times a translation: namespaces that differ before either ends, or are equal, decide
    /// (or leave it to the names) without walking the joined bytes.
    fn cmp_joined(&self, other: &Self) -> Ordering {
        let (a, b) = (self.namespace.as_bytes(), other.namespace.as_bytes());
        let n = a.len().min(b.len());
        match a[..n].cmp(&b[..n]) {
            Ordering::Equal if a.len() == b.len() => self.name.cmp(other.name),
            Ordering::Equal => self.joined().cmp(other.joined()),
            unequal => unequal,
        }
    }

    fn joined(&self) -> impl Iterator<Item = u8> + 'a {
        self.namespace
            .bytes()
            .chain(std::iter::once(b'/'))
            .chain(self.name.bytes())
    }
}

impl Ord for Precedence<'_> {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.created.is_none(), self.created)
            .cmp(&(other.created.is_none(), other.created))
            .then_with(|| match (self.leading, other.leading) {
                // A byte that differs within the first eight decides as it does in the joined
                // strings (a string that ended there has the lesser, zero, byte).
                (Some(a), Some(b)) if a != b => a.cmp(&b),
                _ => self.cmp_joined(other),
            })
    }
}

impl PartialOrd for Precedence<'_> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Precedence<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Precedence<'_> {}

/// The route kinds the translation handles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RouteKind {
    Http,
    Grpc,
}

impl RouteKind {
    /// The Kubernetes kind.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Http => "HTTPRoute",
            Self::Grpc => "GRPCRoute",
        }
    }
}

/// A route, by kind, namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RouteKey {
    pub kind: RouteKind,
    pub key: ObjectKey,
}

impl fmt::Display for RouteKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.kind.as_str(), self.key)
    }
}

impl Serialize for RouteKey {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// A data plane: the shared pool, or the dedicated plane of one Gateway (one whose
/// `infrastructure.parametersRef` names a `GatewayConfig`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PlaneKey {
    Shared,
    Dedicated(ObjectKey),
}

impl fmt::Display for PlaneKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Shared => f.write_str("shared"),
            Self::Dedicated(gateway) => write!(f, "gateway {gateway}"),
        }
    }
}

impl Serialize for PlaneKey {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// What [`translate`] produces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    /// One document per data plane. The shared plane is always present (possibly empty, so a
    /// push removes routes that went away); a dedicated plane exists for each owned Gateway
    /// that asks for one. `version` is 0: the pusher assigns versions.
    pub configs: BTreeMap<PlaneKey, Config>,
    /// For each plane, the route each rule of its document comes from, by position (`None`
    /// for a rule of the controller's own, such as a listener's isolation rule): where a
    /// proxy that refuses a rule is reported.
    pub owners: BTreeMap<PlaneKey, Vec<Option<RouteKey>>>,
    pub statuses: Statuses,
    /// For each owned Gateway, the plane it is served by: none when it is not accepted, except
    /// a dedicated Gateway whose listeners are all invalid, whose plane serves none of its
    /// routes (only those of the accepted Gateways on its tunnel, if any).
    pub planes: BTreeMap<ObjectKey, PlaneKey>,
}

impl Output {
    /// What the regexes of `plane`'s document take of a proxy's budget
    /// ([`valid::PATTERN_BUDGET`]), as the document stands (a caller may have added rules to
    /// it): the pusher keeps each document within it, leaving out first the rules naming a
    /// regex its pods do not hold yet. Only route rules may go: the controller's own (a listener's isolation
    /// rule) and any the caller added never do. `contract` is the cache the translation
    /// checked with, where the patterns are compiled already.
    pub fn costs(&self, plane: &PlaneKey, contract: &mut valid::Cache) -> valid::Costs {
        let Some(config) = self.configs.get(plane) else {
            return valid::Costs::default();
        };
        let owners = self.owners.get(plane);
        valid::Costs::of(&config.rules, contract, |i| {
            owners.and_then(|o| o.get(i)).is_some_and(Option::is_some)
        })
    }
}

/// Translates a snapshot into proxy configs and statuses, for callers that apply no data
/// plane (the `translate` command, tests): the dedicated planes are rendered here, with
/// `options.proxy_image` and the default settings otherwise, which decide nothing else the
/// translation reads.
///
/// Never fails as a whole: every problem with an object is reported in that object's status
/// (and fails closed in the config where the spec says so), so one bad route cannot stop the
/// others from being served.
pub fn translate(snapshot: &Snapshot, options: &Options) -> Output {
    let settings = RenderSettings {
        proxy_image: options.proxy_image.clone(),
        ..RenderSettings::default()
    };
    let plans = render::plan_unapplied(snapshot, &settings);
    translate_with(snapshot, options, &plans, &mut valid::Cache::default())
}

/// [`translate`] with the dedicated planes already rendered, by [`render::plan`] from the same
/// snapshot: a dedicated Gateway is accepted when its plane rendered, with the tunnel its
/// token names, and otherwise refused with the render's error (`InvalidParameters`). A
/// Gateway missing from `plans` is refused too. `options.proxy_image` is not read.
///
/// `contract` is the config contract's cache of compiled patterns, kept by the caller so that
/// successive translations compile an unchanged regex once. Only what this translation used
/// is left in it.
pub fn translate_with(
    snapshot: &Snapshot,
    options: &Options,
    plans: &Plans,
    contract: &mut valid::Cache,
) -> Output {
    translate_keeping(snapshot, options, plans, &BTreeMap::new(), contract)
}

/// [`translate_with`] for a caller that keeps a dedicated plane serving the config it last
/// served once its Gateway is no longer accepted (a `GatewayConfig` that stops resolving):
/// `kept` is, per Gateway, the tunnel its plane's pods run on. A Gateway of `kept` that this
/// translation gives no plane still has connectors on that tunnel, which take a share of its
/// requests, so the dedicated Gateways of other namespaces on it stay flagged `TunnelShared`
/// (naming it) as while it was accepted. That is all `kept` changes: none of such a Gateway's
/// routes is served here (the caller gives its plane what it last served), and a Gateway
/// given a plane is on the tunnel its render names, whatever `kept` says.
pub fn translate_keeping(
    snapshot: &Snapshot,
    options: &Options,
    plans: &Plans,
    kept: &BTreeMap<ObjectKey, TunnelIdentity>,
    contract: &mut valid::Cache,
) -> Output {
    let cell = RefCell::new(std::mem::take(contract));
    let output = translate_checked(snapshot, options, plans, kept, &cell);
    *contract = cell.into_inner();
    contract.keep_used();
    output
}

fn translate_checked(
    snapshot: &Snapshot,
    options: &Options,
    plans: &Plans,
    kept: &BTreeMap<ObjectKey, TunnelIdentity>,
    contract: &RefCell<valid::Cache>,
) -> Output {
    let index = Index::new(snapshot);
    let classes = gateway::owned_classes(snapshot, options);
    let crd_versions = bundle_version::check(&snapshot.custom_resource_definitions);
    let mut statuses = Statuses {
        gateway_classes: classes
            .iter()
            .map(|(name, class)| {
                (
                    name.clone(),
                    gateway::class_conditions(
                        class.as_deref(),
                        options.refused_classes.get(name).map(String::as_str),
                        &crd_versions,
                    ),
                )
            })
            .collect(),
        ..Statuses::default()
    };

    let listener_sets = listener_set::ListenerSets::new(snapshot, &classes, &index);
    let mut gateways =
        gateway::owned_gateways(snapshot, &classes, options, plans, &index, &listener_sets);
    // The client certificates Gateways present to TLS backends, by the Secret they come from.
    let client_certificates: BTreeMap<ObjectKey, cftunnel_config::ClientCertificate> = gateways
        .values()
        .filter_map(|gw| gw.backend_certificate())
        .map(|c| (c.secret.clone(), c.certificate.clone()))
        .collect();
    // Which Gateways' routes use each Service port: the ancestors of the BackendTLSPolicies.
    let mut port_users: BTreeMap<backend_tls::PortKey, BTreeSet<ParentRef>> = BTreeMap::new();
    let mut configs: BTreeMap<PlaneKey, Config> = BTreeMap::new();
    configs.insert(PlaneKey::Shared, Config::default());
    for plane in gateways.values().filter_map(|gw| gw.plane.as_ref()) {
        configs.entry(plane.clone()).or_default();
    }
    // Collected at once: the Gateways come in key order, so the map is built without a
    // search per Gateway.
    let planes: BTreeMap<ObjectKey, PlaneKey> = gateways
        .values()
        .filter_map(|gw| Some((gw.key.clone(), gw.plane.clone()?)))
        .collect();

    // The Access requirement of each dedicated plane's Gateway (its GatewayConfig's), carried
    // by every rule of its routes that names none of its own, on every plane they are copied to.
    let gateway_access: BTreeMap<PlaneKey, cftunnel_config::Access> = gateways
        .values()
        .filter_map(|gw| match &gw.plane {
            Some(plane @ PlaneKey::Dedicated(key)) => {
                let access = plans.get(key)?.as_ref().ok()?.access.clone()?;
                Some((plane.clone(), access))
            }
            _ => None,
        })
        .collect();
    let tunnels = Tunnels::new(&gateways, options.shared_tunnel, kept);
    for gw in gateways.values_mut() {
        gw.tenant_shared_tunnel = tunnels.shared.contains_key(&gw.key);
    }
    let scheme_listeners = scheme_listeners(&gateways, &tunnels);

    let routes = route::collect_routes(snapshot);
    // In precedence order, by reference: sorting the views themselves moved each, a couple of
    // hundred bytes, a dozen times.
    let mut ordered: Vec<&route::RouteView<'_>> = routes.iter().collect();
    ordered.sort_by(|a, b| a.precedence_cmp(b));

    // One isolation rule per listener hostname and plane, after every route rule, in hostname
    // order, with the schemes of the listeners of that hostname, named after its first
    // listener. A plane's listeners are collected in Gateway order and sorted by hostname
    // once (stably: Gateways come close to their hostnames' order), where an ordered map
    // looked up each hostname among a thousand sharing their first bytes.
    type Isolated<'g, 'a> = Vec<(
        &'g str,
        &'g gateway::OwnedGateway<'a>,
        &'g listener::OwnedListener<'a>,
    )>;
    let mut isolation: BTreeMap<PlaneKey, Isolated<'_, '_>> = BTreeMap::new();
    for gw in gateways.values() {
        let Some(plane) = &gw.plane else {
            continue;
        };
        for target in tunnels.planes_with(plane) {
            isolation
                .entry(target.clone())
                .or_default()
                .extend(gateway::isolated_listeners(gw).map(|(hostname, l)| (hostname, gw, l)));
        }
    }
    for listeners in isolation.values_mut() {
        listeners.sort_by(|a, b| a.0.cmp(b.0));
    }
    let isolated_hostnames =
        |listeners: &Isolated<'_, '_>| listeners.chunk_by(|a, b| a.0 == b.0).count();

    let mut rules_by_plane: BTreeMap<PlaneKey, plane_rules::PlaneRules> = BTreeMap::new();
    // The shared plane, which most routes reach, has room for every route's rules from the
    // start (growing it moved every rule placed so far, a dozen times over), and for its
    // isolation rules, so that its document is the list its rules were placed in.
    let route_rules: usize = routes.iter().map(route::RouteView::rule_count).sum();
    let shared_isolation = isolation
        .get(&PlaneKey::Shared)
        .map_or(0, isolated_hostnames);
    rules_by_plane.insert(
        PlaneKey::Shared,
        plane_rules::PlaneRules::with_capacity(route_rules + shared_isolation),
    );
    let mut claims = binding::ListenerClaims::new(&routes);
    let mut route_statuses: Vec<(RouteKey, Vec<RouteParentStatus>)> =
        Vec::with_capacity(routes.len());
    // Gateway API attachedRoutes: each route once per listener it is accepted through (the
    // listeners of its `binding::Accepted` parents, see there) or that is not valid but would
    // take it (`binding::ParentBinding::take_invalid`), however many of its parentRefs select
    // that listener. Counted once every route is bound, so that the routes'
    // attachments may borrow the listeners' hostnames meanwhile.
    let mut attached_routes: Vec<binding::ListenerKey> = Vec::with_capacity(routes.len());
    // Each route's planes, by plane and the Secret of the client certificate the Gateway
    // presents to backends, in that order once settled: a route reaches few. One list for
    // every route, emptied by each.
    let mut route_planes: Vec<((PlaneKey, Option<ObjectKey>), attachment::Attachment<'_>)> =
        Vec::new();
    // Each route's parents, as bound: one list for every route, emptied by each.
    let mut bound = Vec::new();
    // What each route lost to older ones; left empty by each route (most lose nothing, and
    // dropping an empty one per route cost more than keeping one).
    let mut shadowed = shadow::Shadowed::default();
    for (position, route) in ordered.into_iter().enumerate() {
        binding::bind(
            route,
            &gateways,
            &listener_sets,
            &scheme_listeners,
            &index,
            options.hostname_ownership,
            &mut bound,
        );
        if bound.is_empty() {
            continue;
        }
        let mut translated = match route.source {
            route::RouteSource::Http(r) => {
                http_route::translate_rules(route, r, &index, options, contract)
            }
            route::RouteSource::Grpc(r) => {
                grpc_route::translate_rules(route, r, &index, options, contract)
            }
        };
        let route_key = route.key();
        let mut parents = Vec::with_capacity(bound.len());
        route_planes.clear();
        let listeners_from = attached_routes.len();
        for mut parent in bound.drain(..) {
            parent.yield_to_other_kind(route.kind, &claims);
            attached_routes.extend(parent.take_invalid());
            let position = parent.gateway();
            let (mut status, accepted) = parent.into_status(&translated, route.generation);
            let (Some(accepted), Some(gw)) = (accepted, position.and_then(|i| gateways.at(i)))
            else {
                parents.push(status);
                continue;
            };
            let gateway = &gw.key;
            if let Some(message) = tunnels.shared_with(gateway) {
                status.conditions.push(Condition::new(
                    ConditionType::TunnelShared,
                    true,
                    Reason::TunnelShared,
                    message,
                    route.generation,
                ));
            }
            parents.push(status);
            for (listener, shared_hosts, hosts) in accepted.listeners.into_keyed() {
                claims.claim(&route_key, shared_hosts, hosts);
                attached_routes.push(listener);
            }
            // With no BackendTLSPolicy, no Service port has ancestors to report.
            let ports = if !index.tls_policies {
                None
            } else {
                Some(&translated.ports)
            };
            for port in ports.into_iter().flatten() {
                port_users
                    .entry(port.clone())
                    .or_default()
                    .insert(ParentRef {
                        kind: ParentKind::Gateway,
                        namespace: gateway.namespace.clone(),
                        name: gateway.name.clone(),
                        section_name: None,
                        port: None,
                    });
            }
            let certificate = gw.backend_certificate().map(|c| c.secret.clone());
            let key = (accepted.plane, certificate);
            match route_planes.iter_mut().find(|(k, _)| *k == key) {
                Some((_, attachment)) => attachment.merge(accepted.attachment),
                None => route_planes.push((key, accepted.attachment)),
            }
        }
        // Each listener once for this route.
        let counted = &mut attached_routes[listeners_from..];
        counted.sort_unstable();
        let distinct = listeners_from + partition_dedup(counted);
        attached_routes.truncate(distinct);
        route_planes.sort_unstable_by(|(a, _), (b, _)| a.cmp(b));
        // Only accepted parents contribute planes; where every hostname of the route belongs
        // to more specific listeners, the plane gets none of its rules. Every plane on the
        // tunnel gets the route: the edge may hand its requests to any of the tunnel's
        // connectors.
        route_planes.retain_mut(|(_, attachment)| {
            let serves = attachment.serves();
            if serves {
                attachment.settle();
            }
            serves
        });
        // The templates are copied into each plane but the last, which takes them.
        let mut uses_left: usize = route_planes
            .iter()
            .map(|((plane, _), _)| tunnels.planes_with(plane).count())
            .sum();
        let has_rules = !translated.rules.is_empty();
        let mut templates = std::mem::take(&mut translated.rules);
        for ((plane, certificate), attachment) in route_planes.drain(..) {
            let certificate = certificate.and_then(|c| client_certificates.get(&c));
            for target in tunnels.planes_with(&plane) {
                uses_left -= 1;
                let owned = if uses_left == 0 {
                    std::mem::take(&mut templates)
                } else {
                    Vec::new()
                };
                let out = rules_by_plane.entry(target.clone()).or_default();
                let listeners = scheme_listeners.get(target);
                let attached = templates
                    .iter()
                    .map(|t| (t.rule.clone(), t.grpc))
                    .chain(owned.into_iter().map(|t| (t.rule, t.grpc)));
                for (mut rule, grpc) in attached {
                    if let Some(certificate) = certificate {
                        present_client_certificate(&mut rule, certificate);
                    }
                    if rule.access.is_none() {
                        rule.access = gateway_access.get(&plane).cloned();
                    }
                    let placement = grpc.map(|rank| rank.placement(position));
                    // For any host and under each host, for the schemes of the listeners
                    // the route serves it through (see `attachment`).
                    attachment.place(rule, listeners, |rule| {
                        out.place(placement, rule, &route_key, &mut shadowed)
                    });
                }
                if route.kind == RouteKind::Grpc && has_rules {
                    if let Some(config) = configs.get_mut(target) {
                        config.has_grpc_route = true;
                    }
                }
            }
        }
        if !shadowed.is_empty() {
            let message = shadowed.message();
            shadowed = shadow::Shadowed::default();
            for parent in &mut parents {
                if parent
                    .condition(ConditionType::Accepted)
                    .is_some_and(|c| c.status)
                {
                    parent.conditions.push(Condition::new(
                        ConditionType::RouteShadowed,
                        true,
                        Reason::OlderRouteMatches,
                        message.clone(),
                        route.generation,
                    ));
                }
            }
        }
        route_statuses.push((route_key, parents));
    }
    // Built at once rather than inserted route by route: routes come in precedence order,
    // close to key order, so sorting them costs little against a search per insertion.
    statuses.routes = route_statuses.into_iter().collect();
    let mut owners: BTreeMap<PlaneKey, Vec<Option<RouteKey>>> = BTreeMap::new();
    for (plane, config) in &mut configs {
        let (mut rules, routes) = rules_by_plane
            .remove(plane)
            .map(plane_rules::PlaneRules::into_ordered)
            .unwrap_or_default();
        let isolated = isolation.remove(plane).unwrap_or_default();
        // Room for the isolation rules too (the shared plane's list has it already): the
        // document is not copied again to take them.
        let more = isolated_hostnames(&isolated);
        rules.reserve_exact(more);
        let mut owned_by = Vec::with_capacity(routes.len() + more);
        owned_by.extend(routes.into_iter().map(Some));
        let listeners = scheme_listeners.get(plane);
        for listeners_of in isolated.chunk_by(|a, b| a.0 == b.0) {
            let Some(&(hostname, gw, l)) = listeners_of.first() else {
                continue;
            };
            let mut schemes = scheme::Schemes::default();
            for (_, _, l) in listeners_of {
                schemes.insert(l.scheme);
            }
            let rule = gateway::listener_isolation_rule(gw, l, hostname);
            rules.push(match listeners {
                Some(listeners) => listeners.scope_isolation(rule, hostname, schemes),
                None => rule,
            });
            owned_by.push(None);
        }
        config.rules = rules;
        owners.insert(plane.clone(), owned_by);
    }
    for listener in attached_routes {
        if let Some(l) = gateways
            .at_mut(listener.gateway)
            .and_then(|gw| gw.listeners.get_mut(listener.index))
        {
            l.attached_routes += 1;
        }
    }

    let (set_statuses, attached_sets) = listener_sets.statuses(|key| {
        let gw = gateways.get(key)?;
        Some((gw.accepted(), gw.listeners.as_slice()))
    });
    statuses.listener_sets = set_statuses;
    // Built at once: the Gateways come in key order, so the map is built without a search per
    // Gateway.
    statuses.gateways = gateways
        .into_values()
        .map(|gw| {
            let attached = attached_sets.get(&gw.key).copied().unwrap_or_default();
            (gw.key.clone(), gw.into_status(attached))
        })
        .collect();
    statuses.backend_tls_policies = index
        .policies
        .statuses(&snapshot.backend_tls_policies, &port_users);
    Output {
        configs,
        owners,
        statuses,
        planes,
    }
}

/// Moves the distinct values of the sorted `values` to its front, in order, and returns how
/// many there are.
fn partition_dedup<T: PartialEq + Copy>(values: &mut [T]) -> usize {
    let mut distinct = 0;
    for i in 0..values.len() {
        if distinct == 0 || values[i] != values[distinct - 1] {
            values[distinct] = values[i];
            distinct += 1;
        }
    }
    distinct
}

/// Gives every backend of `rule` dialled over TLS, and every mirror, the Gateway's client
/// certificate, presented when the backend asks for one (Gateway API
/// `spec.tls.backend.clientCertificateRef`).
fn present_client_certificate(
    rule: &mut cftunnel_config::Rule,
    certificate: &cftunnel_config::ClientCertificate,
) {
    fn mirror_tls(f: &mut cftunnel_config::Filter) -> Option<&mut cftunnel_config::BackendTls> {
        f.request_mirror.as_mut()?.tls.as_mut()
    }
    let rule_mirrors = rule.filters.iter_mut().filter_map(mirror_tls);
    let backends = rule.backends.iter_mut().flat_map(|b| {
        b.filters
            .iter_mut()
            .filter_map(mirror_tls)
            .chain(b.tls.as_mut())
    });
    for tls in rule_mirrors.chain(backends) {
        tls.client_certificate = Some(certificate.clone());
    }
}

/// A tunnel as its connectors know it: its id and a digest of its secret. Planes share a tunnel
/// only when they hold the same secret: a token that names another tunnel's id without its
/// secret cannot register there, and must not get that tunnel's routes either.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TunnelIdentity {
    pub id: uuid::Uuid,
    secret: [u8; 32],
}

impl TunnelIdentity {
    /// The identity of the tunnel a connector token opens.
    pub fn of(token: &cftunnel_config::Token) -> Self {
        Self {
            id: token.tunnel_id(),
            secret: Sha256::digest(token.tunnel_secret()).into(),
        }
    }

    /// Whether `proof` is [`render::tunnel_proof`] of this tunnel for the Gateway `gateway_uid`:
    /// that Gateway's plane was rendered with a connector token of this tunnel. Never for a
    /// tunnel known by its id alone ([`TunnelIdentity::named`]): anyone can compute a proof
    /// over the secret it lacks.
    pub fn proven_by(&self, gateway_uid: &str, proof: &str) -> bool {
        self.secret != [0; 32] && render::tunnel_proof(&self.secret, gateway_uid) == proof
    }

    /// A tunnel known by its id alone (a GatewayClassConfig's `tunnelID` without a connector
    /// token): no plane holding a token shares it, as none can be shown to hold its secret.
    pub fn named(id: uuid::Uuid) -> Self {
        Self {
            id,
            secret: [0; 32],
        }
    }
}

/// Which planes share a tunnel. The edge spreads a tunnel's requests over all its connectors,
/// so every plane on a tunnel must serve the union of the tunnel's routes.
struct Tunnels {
    /// The tunnel of each plane on a known one: a Gateway's plane is filed under
    /// `OwnedGateway::tunnel`, the tunnel `binding::RouteTable` keys its route table by.
    planes: BTreeMap<PlaneKey, TunnelIdentity>,
    /// The planes of each tunnel, in order: asked for every route's planes.
    on_tunnel: BTreeMap<TunnelIdentity, Vec<PlaneKey>>,
    /// Dedicated Gateways on a tunnel that dedicated Gateways of another namespace also use
    /// (isolation the tenants expect but do not have), with the message naming the others.
    /// The class tunnel is left out: a dedicated Gateway on it shares the shared plane's
    /// tunnel, the documented way to move a Gateway onto a plane of its own, not a tenant's.
    shared: BTreeMap<ObjectKey, String>,
}

impl Tunnels {
    /// `shared_tunnel` puts the shared pool on the class tunnel whether or not a Gateway is
    /// served by it: its connectors take a share of the tunnel's requests either way. So do
    /// those of the planes `kept` serving their last config whose Gateways have no plane here
    /// ([`translate_keeping`]): they count for `shared`, and take none of the tunnel's routes.
    fn new(
        gateways: &gateway::OwnedGateways<'_>,
        shared_tunnel: Option<TunnelIdentity>,
        kept: &BTreeMap<ObjectKey, TunnelIdentity>,
    ) -> Self {
        let mut planes: BTreeMap<PlaneKey, TunnelIdentity> = shared_tunnel
            .map(|tunnel| (PlaneKey::Shared, tunnel))
            .into_iter()
            .collect();
        let mut dedicated: BTreeMap<TunnelIdentity, Vec<&ObjectKey>> = BTreeMap::new();
        for gw in gateways.values() {
            let (Some(plane), Some(tunnel)) = (&gw.plane, gw.tunnel) else {
                continue;
            };
            planes.insert(plane.clone(), tunnel);
            if let PlaneKey::Dedicated(key) = plane {
                if shared_tunnel != Some(tunnel) {
                    dedicated.entry(tunnel).or_default().push(key);
                }
            }
        }
        for (key, tunnel) in kept {
            let planeless = gateways.get(key).is_some_and(|gw| gw.plane.is_none());
            if planeless && shared_tunnel != Some(*tunnel) {
                dedicated.entry(*tunnel).or_default().push(key);
            }
        }
        // In key order, kept planes among the others.
        for keys in dedicated.values_mut() {
            keys.sort();
        }
        let mut shared = BTreeMap::new();
        for (tunnel, keys) in &dedicated {
            let namespaces: BTreeSet<&str> = keys.iter().map(|k| k.namespace.as_str()).collect();
            if namespaces.len() < 2 {
                continue;
            }
            for key in keys {
                let others: Vec<String> = keys
                    .iter()
                    .filter(|k| **k != *key)
                    .map(ToString::to_string)
                    .collect();
                shared.insert(
                    (*key).clone(),
                    format!(
                        "tunnel {} is also used by Gateway {}: each one's proxies serve the other's routes, so they are not isolated",
                        tunnel.id,
                        others.join(", ")
                    ),
                );
            }
        }
        let mut on_tunnel: BTreeMap<TunnelIdentity, Vec<PlaneKey>> = BTreeMap::new();
        for (plane, tunnel) in &planes {
            on_tunnel.entry(*tunnel).or_default().push(plane.clone());
        }
        Self {
            planes,
            on_tunnel,
            shared,
        }
    }

    /// `plane` and every other plane on its tunnel, in order.
    fn planes_with<'s>(&'s self, plane: &'s PlaneKey) -> impl Iterator<Item = &'s PlaneKey> + 's {
        self.planes
            .get(plane)
            .and_then(|tunnel| self.on_tunnel.get(tunnel))
            .map_or(std::slice::from_ref(plane), Vec::as_slice)
            .iter()
    }

    /// Why `gateway` is flagged as sharing its tunnel, if it is.
    fn shared_with(&self, gateway: &ObjectKey) -> Option<&str> {
        self.shared.get(gateway).map(String::as_str)
    }
}

/// The listeners of each scheme on each plane: the usable listeners of every Gateway whose
/// routes the plane gets, so the planes of one tunnel, which serve the union of its routes,
/// hold the same listeners, those of their route table. They keep the schemes apart (see
/// [`scheme`]) and give listener isolation across the table
/// ([`scheme::SchemeListeners::taken_by_more_specific`]). Built from the settled Gateways: one
/// without a plane or not accepted, or a listener that is not usable, contributes nothing
/// ([`gateway::OwnedGateway::hostname_holders`]).
fn scheme_listeners<'g>(
    gateways: &'g gateway::OwnedGateways<'_>,
    tunnels: &Tunnels,
) -> BTreeMap<PlaneKey, scheme::SchemeListeners<'g>> {
    let mut planes: BTreeMap<PlaneKey, scheme::SchemeListeners<'g>> = BTreeMap::new();
    for gw in gateways.values() {
        let Some(plane) = &gw.plane else { continue };
        for target in tunnels.planes_with(plane) {
            let listeners = planes.entry(target.clone()).or_default();
            for l in gw.hostname_holders() {
                listeners.add(l.scheme, l.hostname.as_deref());
            }
        }
    }
    planes
}

/// Lookups over the snapshot, built once per translation.
///
/// The maps every route looks in, each as large as the cluster, are hash maps: they are only
/// looked up, never iterated, so their order cannot reach the output.
pub(crate) struct Index<'a> {
    namespaces: FxHashMap<&'a str, &'a Namespace>,
    /// Services and their EndpointSlices, by (namespace, name): one lookup finds both.
    services: FxHashMap<(&'a str, &'a str), ServiceObjects<'a>>,
    grants: Vec<&'a ReferenceGrant>,
    secrets: BTreeMap<(&'a str, &'a str), &'a Secret>,
    /// ConfigMaps, for the CA certificates TLS settings name.
    config_maps: BTreeMap<(&'a str, &'a str), &'a ConfigMap>,
    /// The BackendTLSPolicies, judged, and which covers each Service port.
    policies: backend_tls::Policies,
    /// Whether the snapshot holds BackendTLSPolicies: without, no Service port's users are
    /// collected for their status.
    tls_policies: bool,
    access_policies: BTreeMap<(&'a str, &'a str), &'a AccessPolicySpec>,
    external_backends: BTreeMap<(&'a str, &'a str), &'a ExternalBackend>,
    /// `None` where the Multi-Cluster Services API is not served.
    service_imports: Option<BTreeMap<(&'a str, &'a str), &'a ServiceImport>>,
}

/// `parts` written one after another, into a string allocated once at their length. Each
/// rule's name and backend URLs are joined so, without the separator handling of `concat`'s
/// general join. Always inlined: the parts are then of known number, and literal ones of known
/// length, so they are copied without a call each.
#[inline(always)]
pub(crate) fn joined<const N: usize>(parts: [&str; N]) -> String {
    let mut out = String::with_capacity(parts.iter().map(|p| p.len()).sum());
    for part in parts {
        out.push_str(part);
    }
    out
}

/// A Service and its EndpointSlices (by `kubernetes.io/service-name`), either of which may be
/// missing.
#[derive(Debug, Default)]
pub(crate) struct ServiceObjects<'a> {
    service: Option<&'a Service>,
    /// Sorted by name; empty: no slice names the Service.
    slices: Vec<&'a EndpointSlice>,
}

/// Objects of a namespaced kind by (namespace, name).
fn by_key<T: kube::Resource>(objects: &[Arc<T>]) -> BTreeMap<(&str, &str), &T> {
    objects
        .iter()
        .map(Arc::as_ref)
        .filter_map(|o| {
            let meta = o.meta();
            Some(((meta.namespace.as_deref()?, meta.name.as_deref()?), o))
        })
        .collect()
}

const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

impl<'a> Index<'a> {
    fn new(snapshot: &'a Snapshot) -> Self {
        let mut namespaces =
            FxHashMap::with_capacity_and_hasher(snapshot.namespaces.len(), Default::default());
        for ns in snapshot.namespaces.iter().map(Arc::as_ref) {
            if let Some(name) = ns.metadata.name.as_deref() {
                namespaces.insert(name, ns);
            }
        }
        let mut services: FxHashMap<(&str, &str), ServiceObjects<'_>> =
            FxHashMap::with_capacity_and_hasher(snapshot.services.len(), Default::default());
        for svc in snapshot.services.iter().map(Arc::as_ref) {
            if let (Some(ns), Some(name)) = (
                svc.metadata.namespace.as_deref(),
                svc.metadata.name.as_deref(),
            ) {
                services.entry((ns, name)).or_default().service = Some(svc);
            }
        }
        for slice in snapshot.endpoint_slices.iter().map(Arc::as_ref) {
            let ns = slice.metadata.namespace.as_deref();
            let svc = slice
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(SERVICE_NAME_LABEL))
                .map(String::as_str);
            if let (Some(ns), Some(svc)) = (ns, svc) {
                let slices = &mut services.entry((ns, svc)).or_default().slices;
                // Most Services have one slice: a list of one.
                push_first_alone(slices, slice);
            }
        }
        for objects in services.values_mut() {
            objects
                .slices
                .sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        }
        let secrets = by_key(&snapshot.secrets);
        let config_maps: BTreeMap<(&str, &str), &ConfigMap> = by_key(&snapshot.config_maps);
        let policies = backend_tls::Policies::new(
            &snapshot.backend_tls_policies,
            &backend_tls::CaSources {
                config_maps: &config_maps,
                secrets: &secrets,
            },
        );
        let access_policies = snapshot
            .access_policies
            .iter()
            .filter_map(|p| {
                let key = (
                    p.metadata.namespace.as_deref()?,
                    p.metadata.name.as_deref()?,
                );
                Some((key, &p.spec))
            })
            .collect();
        Self {
            external_backends: by_key(&snapshot.external_backends),
            namespaces,
            services,
            grants: snapshot.reference_grants.iter().map(Arc::as_ref).collect(),
            secrets,
            config_maps,
            policies,
            tls_policies: !snapshot.backend_tls_policies.is_empty(),
            access_policies,
            service_imports: snapshot.service_imports.as_deref().map(by_key),
        }
    }

    /// Where `caCertificateRefs` are looked up.
    fn ca_sources(&self) -> backend_tls::CaSources<'_> {
        backend_tls::CaSources {
            config_maps: &self.config_maps,
            secrets: &self.secrets,
        }
    }

    /// The spec of the AccessPolicy `namespace/name`.
    fn access_policy(&self, namespace: &str, name: &str) -> Option<&'a AccessPolicySpec> {
        self.access_policies.get(&(namespace, name)).copied()
    }

    fn namespace_labels(&self, name: &str) -> Option<&'a BTreeMap<String, String>> {
        self.namespaces
            .get(name)
            .and_then(|ns| ns.metadata.labels.as_ref())
    }

    /// Whether a ReferenceGrant in `to_namespace` lets objects of `from_kind` in
    /// `from_namespace` refer to the `to_group`/`to_kind` object named `to_name`.
    fn reference_granted(
        &self,
        from_kind: &str,
        from_namespace: &str,
        to_group: &str,
        to_kind: &str,
        to_namespace: &str,
        to_name: &str,
    ) -> bool {
        self.grants.iter().any(|grant| {
            grant.metadata.namespace.as_deref() == Some(to_namespace)
                && grant.spec.from.iter().any(|from| {
                    from.group == GATEWAY_API_GROUP
                        && from.kind == from_kind
                        && from.namespace == from_namespace
                })
                && grant.spec.to.iter().any(|to| {
                    to.group == to_group
                        && to.kind == to_kind
                        && to.name.as_deref().is_none_or(|n| n == to_name)
                })
        })
    }
}

/// Pushes `item`, as a list of exactly one when `list` is empty: where most lists stay at one
/// item, `push`'s growth path would allocate room for four.
fn push_first_alone<T>(list: &mut Vec<T>, item: T) {
    if list.is_empty() {
        *list = vec![item];
    } else {
        list.push(item);
    }
}
