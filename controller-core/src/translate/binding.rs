//! Route attachment: `parentRefs` against listeners (sectionName, port), `allowedRoutes`
//! (kinds, namespaces) and listener/route hostnames ([`super::hostname`]), and the status each
//! parent gets once the route's rules are translated.

use std::collections::BTreeMap;

use super::attachment::Attachment;
use super::gateway::{OwnedGateway, OwnedGateways};
use super::hostname::{intersect, Hosts};
use super::listener::{selector_matches, AllowedNamespaces, OwnedListener};
use super::listener_set::ListenerSets;
use super::ownership;
use super::route::{ParentRefView, RouteView};
use super::rule::TranslatedRoute;
use super::scheme::{Scheme, SchemeListeners};
use super::status::{Condition, ConditionType, ParentKind, ParentRef, Reason, RouteParentStatus};
use super::{
    Index, ObjectKey, PlaneKey, RouteKey, RouteKind, TunnelIdentity,
    EXPERIMENTAL_GATEWAY_API_GROUP, GATEWAY_API_GROUP,
};

/// One listener a parentRef attaches a route to.
#[derive(Debug, Clone)]
pub(super) struct ListenerAttachment<'h> {
    /// Position of the listener in its Gateway's `listeners`.
    index: usize,
    name: &'h str,
    /// The hosts the route serves through this listener.
    hosts: Hosts<'h>,
    /// The port a `RequestRedirect` that sets neither scheme nor port carries: the listener's,
    /// `None` when it is the well-known port of its protocol (see [`Attachment::add`]).
    redirect_port: Option<u16>,
    /// The listener's scheme, which the route's rules for `hosts` require where the other
    /// scheme's listeners could take the same requests (see [`Attachment::add`]).
    scheme: Scheme,
    /// The listener's hostname, `None` for any host: with `scheme`, the hosts of the route
    /// table its routes share with the table's other listeners (see [`SharedHosts`]).
    hostname: Option<&'h str>,
}

/// A listener of one of our Gateways.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct ListenerKey {
    /// The Gateway's position in [`OwnedGateways`].
    pub(super) gateway: usize,
    pub(super) index: usize,
}

/// The route table a Gateway's routes' rules land in. Every plane on a tunnel serves the union
/// of the tunnel's routes (the edge hands its requests to any of its connectors), so the planes
/// of one tunnel are one table: the tunnel the Gateway's plane is on ([`OwnedGateway::tunnel`],
/// which `Tunnels` files the plane under), the class tunnel for the shared plane when there is
/// one. A plane on no known tunnel is a table of its own. On a tunnel that dedicated Gateways of
/// several namespaces share (`TunnelShared`), each namespace's are a table: the isolation guide
/// promises such tenants' routes stay accepted, served together as before, whatever the other
/// tenants hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum RouteTable<'h> {
    Tunnel(TunnelIdentity),
    /// The Gateways of one namespace on a tunnel that tenants of other namespaces share.
    Tenant(TunnelIdentity, &'h str),
    Plane(&'h PlaneKey),
}

impl<'h> RouteTable<'h> {
    fn of(plane: &'h PlaneKey, gw: &'h OwnedGateway<'_>) -> Self {
        match gw.tunnel {
            Some(tunnel) if gw.tenant_shared_tunnel => Self::Tenant(tunnel, &gw.key.namespace),
            Some(tunnel) => Self::Tunnel(tunnel),
            None => Self::Plane(plane),
        }
    }
}

/// The listeners whose routes' rules land in the same hosts of one route table: those of one
/// scheme and hostname (or none), whatever their ports and Gateways, which behind the tunnel
/// tell no request apart. Routes of the two kinds are kept apart across them as on one
/// listener ([`ListenerClaims`]). Listeners of one port of a Gateway with the same scheme and
/// hostname conflict, as do those of Gateways on the shared plane, and one with a more specific
/// hostname takes its hosts from a less specific one (listener isolation), so only equal
/// hostnames share hosts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct SharedHosts<'h> {
    table: RouteTable<'h>,
    scheme: Scheme,
    hostname: Option<&'h str>,
}

/// The outcome of attaching a route to one of our Gateways.
#[derive(Debug)]
pub(super) struct ParentBinding<'h> {
    parent_ref: ParentRef,
    /// The Gateway's position in [`OwnedGateways`]; `None` for a ListenerSet that is not
    /// attached to one (the parent is then refused).
    gateway: Option<usize>,
    /// The plane serving the Gateway, its route table and the listeners the route attaches to
    /// there.
    outcome: Result<Attached<'h>, (Reason, String)>,
    /// Listeners (positions in the Gateway's) that select and allow the route, with a hostname
    /// it shares, but are not valid (their certificates do not resolve, say). The route is
    /// not accepted through them, yet their `attachedRoutes` count it: Gateway API's own
    /// conformance suite asks so (`GatewayWithAttachedRoutes`, "AttachedRoutes set even when
    /// Gateway has unresolved refs", in v1.5 and v1.6), so the count tells an operator what
    /// such a listener takes down. Every other route refused on a parent is counted nowhere
    /// (see [`Accepted::listeners`]).
    invalid: Vec<usize>,
}

/// The plane of a Gateway a parentRef attaches a route to, its route table, and the listeners.
type Attached<'h> = (PlaneKey, RouteTable<'h>, Vec<ListenerAttachment<'h>>);

/// Where a route is accepted through one parentRef: made only by
/// [`ParentBinding::into_status`], with the `Accepted=True` condition it writes.
#[derive(Debug)]
pub(super) struct Accepted<'h> {
    pub(super) plane: PlaneKey,
    /// The listeners the route is attached to, with the hosts it serves through each: the
    /// valid listeners whose `attachedRoutes` count the route. Gateway API v1.5: "The
    /// AttachedRoutes number represents the number of Routes with the Accepted condition set
    /// to "True" that have been attached to this Listener. Routes with any other value for
    /// the Accepted condition MUST NOT be included in this count." A route refused on this
    /// parent (its rules all dropped, its listeners lost to a route of the other kind, or of
    /// a Gateway not accepted) has no `Accepted`, so it is counted nowhere there, but by
    /// listeners that are not valid, as the conformance suite asks
    /// ([`ParentBinding::invalid`](ParentBinding)).
    pub(super) listeners: AttachedListeners<'h>,
    /// What the route serves on `plane` through them.
    pub(super) attachment: Attachment<'h>,
}

/// The listeners of one Gateway a route is accepted on: the attachments found for it, kept
/// as they are (no list of keys is built per route).
#[derive(Debug)]
pub(super) struct AttachedListeners<'h> {
    gateway: usize,
    table: RouteTable<'h>,
    attached: Vec<ListenerAttachment<'h>>,
}

impl<'h> AttachedListeners<'h> {
    /// Each listener, with the listeners it shares hosts with and the hosts the route serves
    /// through it.
    pub(super) fn into_keyed(
        self,
    ) -> impl Iterator<Item = (ListenerKey, SharedHosts<'h>, Hosts<'h>)> {
        let (gateway, table) = (self.gateway, self.table);
        self.attached.into_iter().map(move |l| {
            let key = ListenerKey {
                gateway,
                index: l.index,
            };
            let shared = SharedHosts {
                table,
                scheme: l.scheme,
                hostname: l.hostname,
            };
            (key, shared, l.hosts)
        })
    }
}

impl<'h> ParentBinding<'h> {
    /// The Gateway of the parent, the one named or the ListenerSet's: its position in
    /// [`OwnedGateways`].
    pub(super) fn gateway(&self) -> Option<usize> {
        self.gateway
    }

    /// The listeners that count the route though not valid (see
    /// [`ParentBinding::invalid`](Self)), taken out.
    pub(super) fn take_invalid(&mut self) -> impl Iterator<Item = ListenerKey> + '_ {
        let gateway = self.gateway;
        self.invalid
            .drain(..)
            .filter_map(move |index| gateway.map(|gateway| ListenerKey { gateway, index }))
    }

    /// Leaves out the listeners where a route of the other kind with intersecting hostnames
    /// is already accepted, on the listener or on another of its route table with the same
    /// scheme and hostname (on another port, or of another Gateway on the tunnel: its routes
    /// share the listener's hosts, see [`SharedHosts`]); with none left, the route is refused
    /// on this parent. Routes are bound in precedence order (oldest, then
    /// `{namespace}/{name}`), so the route holding a listener first is the one the spec
    /// accepts. A route keeps the listeners of this parentRef that are free of such a
    /// conflict; the listeners it loses do not count it.
    pub(super) fn yield_to_other_kind(&mut self, kind: RouteKind, claims: &ListenerClaims<'_>) {
        if !claims.kept {
            return;
        }
        let Ok((_, table, attached)) = &mut self.outcome else {
            return;
        };
        let mut conflicts = Vec::new();
        attached.retain(|l| {
            let key = SharedHosts {
                table: *table,
                scheme: l.scheme,
                hostname: l.hostname,
            };
            match claims.holder(&key, kind, &l.hosts) {
                Some(holder) => {
                    conflicts.push(format!(
                        "on listener {} its hostnames intersect those of {holder}",
                        l.name
                    ));
                    false
                }
                None => true,
            }
        });
        if attached.is_empty() {
            self.outcome = Err((
                Reason::HostnameConflict,
                format!(
                    "{}, which takes precedence (older, or first by namespace/name); HTTPRoutes and GRPCRoutes are not merged on a listener, nor on listeners of the same scheme and hostname on other ports or on other Gateways whose routes the tunnel serves (behind a tunnel they take the same requests)",
                    conflicts.join("; ")
                ),
            ));
        }
    }

    /// The route's status towards this parent and, when it is accepted there, where.
    pub(super) fn into_status(
        self,
        translated: &TranslatedRoute,
        generation: Option<i64>,
    ) -> (RouteParentStatus, Option<Accepted<'h>>) {
        let mut conditions = Vec::with_capacity(3);
        let mut accepted = None;
        match self.outcome {
            Err((reason, message)) => conditions.push(Condition::new(
                ConditionType::Accepted,
                false,
                reason,
                message,
                generation,
            )),
            Ok(_) if translated.serves_nothing() => conditions.push(Condition::new(
                ConditionType::Accepted,
                false,
                Reason::UnsupportedValue,
                translated.dropped_message(),
                generation,
            )),
            Ok((plane, table, attached)) => {
                conditions.push(Condition::new(
                    ConditionType::Accepted,
                    true,
                    Reason::Accepted,
                    "",
                    generation,
                ));
                let mut attachment = Attachment::default();
                for l in &attached {
                    attachment.add(&l.hosts, l.scheme, l.redirect_port);
                }
                accepted = Some(Accepted {
                    plane,
                    listeners: AttachedListeners {
                        // An attached parent is always one of our Gateways.
                        gateway: self.gateway.unwrap_or_default(),
                        table,
                        attached,
                    },
                    attachment,
                });
            }
        }
        conditions.push(translated.resolved_refs(generation));
        if !translated.rules.is_empty() && !translated.dropped.is_empty() {
            conditions.push(Condition::new(
                ConditionType::PartiallyInvalid,
                true,
                Reason::UnsupportedValue,
                translated.dropped_message(),
                generation,
            ));
        }
        let status = RouteParentStatus {
            parent_ref: self.parent_ref,
            conditions,
        };
        (status, accepted)
    }
}

/// The routes accepted so far on each listener, with the hosts they serve there: Gateway API
/// requires an HTTPRoute and a GRPCRoute whose hostnames intersect on one listener not to be
/// merged; exactly one of them is accepted. Claims are held on the listeners of a route table
/// that share hosts ([`SharedHosts`]) as on one listener: behind the tunnel two listeners of
/// one scheme and hostname put their routes' rules in the same hosts, whatever their ports and
/// Gateways, so the two kinds would be merged there all the same.
#[derive(Debug)]
pub(super) struct ListenerClaims<'h> {
    /// Whether routes of both kinds are bound: with one kind, no route can conflict, and
    /// nothing is kept or looked up.
    kept: bool,
    claims: BTreeMap<SharedHosts<'h>, Claims<'h>>,
}

/// The routes of each kind accepted on listeners that share hosts, in precedence order, each
/// once with the hosts it serves there: a route looks among the other kind's alone.
#[derive(Debug, Default)]
struct Claims<'h> {
    http: Vec<(RouteKey, Hosts<'h>)>,
    grpc: Vec<(RouteKey, Hosts<'h>)>,
}

impl<'h> Claims<'h> {
    fn of(&self, kind: RouteKind) -> &[(RouteKey, Hosts<'h>)] {
        match kind {
            RouteKind::Http => &self.http,
            RouteKind::Grpc => &self.grpc,
        }
    }

    fn of_mut(&mut self, kind: RouteKind) -> &mut Vec<(RouteKey, Hosts<'h>)> {
        match kind {
            RouteKind::Http => &mut self.http,
            RouteKind::Grpc => &mut self.grpc,
        }
    }
}

impl<'h> ListenerClaims<'h> {
    /// The claims of `routes`, the routes to be bound.
    pub(super) fn new(routes: &[RouteView<'_>]) -> Self {
        let kept = routes.iter().any(|r| r.kind == RouteKind::Http)
            && routes.iter().any(|r| r.kind == RouteKind::Grpc);
        Self {
            kept,
            claims: BTreeMap::new(),
        }
    }

    /// A route of the other kind than `kind` accepted on `listeners` whose hosts there
    /// intersect `hosts`.
    fn holder(
        &self,
        listeners: &SharedHosts<'h>,
        kind: RouteKind,
        hosts: &Hosts<'_>,
    ) -> Option<&RouteKey> {
        let other = match kind {
            RouteKind::Http => RouteKind::Grpc,
            RouteKind::Grpc => RouteKind::Http,
        };
        self.claims
            .get(listeners)?
            .of(other)
            .iter()
            .find(|(_, held)| held.intersects(hosts))
            .map(|(route, _)| route)
    }

    /// Records that `route` is accepted on `listeners`, serving `hosts` there. Routes claim
    /// one after another, so a route attached through several of those listeners (on other
    /// ports, or of several Gateways on the tunnel) finds its own claim last and is kept once.
    pub(super) fn claim(&mut self, route: &RouteKey, listeners: SharedHosts<'h>, hosts: Hosts<'h>) {
        if !self.kept {
            return;
        }
        let held = self.claims.entry(listeners).or_default().of_mut(route.kind);
        if held
            .last()
            .is_some_and(|(last, last_hosts)| last == route && *last_hosts == hosts)
        {
            return;
        }
        held.push((route.clone(), hosts));
    }
}

/// Attaches a route to our Gateways: one entry per parentRef that names one of them, in
/// `parents`, which it empties first (a list kept for every route's parents). Nothing
/// is counted on the listeners yet; that waits until the route's rules are translated and it
/// is known to be accepted. `scheme_listeners` holds each plane's listeners, for listener
/// isolation across its route table. With `hostname_ownership`, a parent whose listeners would
/// have the route serve a host its namespace may not publish refuses it ([`ownership`]).
pub(super) fn bind<'h>(
    route: &'h RouteView<'_>,
    gateways: &'h OwnedGateways<'_>,
    listener_sets: &ListenerSets,
    scheme_listeners: &BTreeMap<PlaneKey, SchemeListeners<'_>>,
    index: &Index<'_>,
    hostname_ownership: bool,
    parents: &mut Vec<ParentBinding<'h>>,
) {
    parents.clear();
    for p in &route.parent_refs {
        // Most parentRefs leave the group out: no string to compare then.
        let experimental = match p.group {
            None => false,
            Some(group) if group == GATEWAY_API_GROUP => false,
            Some(group) if group == EXPERIMENTAL_GATEWAY_API_GROUP => true,
            Some(_) => continue,
        };
        let namespace = p.namespace.unwrap_or(route.namespace);
        let set_key;
        // The Gateway, and for a ListenerSet which one's listeners, or why it has none.
        let (kind, position, set) = match (experimental, p.kind.unwrap_or("Gateway")) {
            (false, "Gateway") => (
                ParentKind::Gateway,
                gateways.position(namespace, p.name),
                Ok(None),
            ),
            (false, "ListenerSet") | (true, "XListenerSet") => {
                let kind = if experimental {
                    ParentKind::XListenerSet
                } else {
                    ParentKind::ListenerSet
                };
                set_key = ObjectKey::new(namespace, p.name);
                match listener_sets.gateway_of(&set_key) {
                    None => continue,
                    Some(Ok(gateway)) => (
                        kind,
                        gateways.position(&gateway.namespace, &gateway.name),
                        Ok(Some(&set_key)),
                    ),
                    Some(Err(why)) => (kind, None, Err(why)),
                }
            }
            _ => continue,
        };
        let gw = position.and_then(|i| gateways.at(i));
        if gw.is_none() && set.is_ok() {
            continue;
        }
        let parent_ref = ParentRef {
            kind,
            namespace: namespace.to_owned(),
            name: p.name.to_owned(),
            section_name: p.section_name.map(str::to_owned),
            port: p.port,
        };
        let mut invalid = Vec::new();
        let outcome = match (&route.invalid_hostnames, set, gw) {
            (Some(problem), _, _) => Err((Reason::UnsupportedValue, problem.clone())),
            (None, Err(why), _) => Err((Reason::NoMatchingParent, why)),
            (None, Ok(set), Some(gw)) => {
                attach(route, p, gw, set, scheme_listeners, index, &mut invalid)
            }
            (None, Ok(_), None) => continue,
        };
        let outcome = outcome.and_then(|(plane, table, attached)| {
            if hostname_ownership {
                let labels = index.namespace_labels(route.namespace);
                if let Some(why) =
                    ownership::names_refusal(&route.hostnames, route.namespace, labels).or_else(
                        || {
                            attached
                                .iter()
                                .find_map(|a| ownership::refusal(&a.hosts, route.namespace, labels))
                        },
                    )
                {
                    return Err((Reason::HostnameNotPermitted, why));
                }
            }
            Ok((plane, table, attached))
        });
        parents.push(ParentBinding {
            parent_ref,
            gateway: position,
            outcome,
            invalid,
        });
    }
}

/// Attaches a route to the listeners of `gw` a parentRef selects: the Gateway's own, or with
/// `set` those of that ListenerSet. Listeners that would take it but are not valid go to
/// `invalid` (see [`ParentBinding::invalid`](ParentBinding)).
fn attach<'h>(
    route: &'h RouteView<'_>,
    p: &ParentRefView<'_>,
    gw: &'h OwnedGateway<'_>,
    set: Option<&ObjectKey>,
    scheme_listeners: &BTreeMap<PlaneKey, SchemeListeners<'_>>,
    index: &Index<'_>,
    invalid: &mut Vec<usize>,
) -> Result<Attached<'h>, (Reason, String)> {
    // The listeners the parentRef selects, those of them that allow the route, and those of
    // these that are usable: the first stage left empty says why the route is refused.
    let selected = |l: &OwnedListener<'_>| {
        l.set.as_ref().map(|e| &e.set) == set
            && p.section_name.is_none_or(|s| s == l.name)
            && p.port.is_none_or(|port| port == l.port)
    };
    let allows = |l: &OwnedListener<'_>| {
        // `Same` is the namespace of the object the listener is written in.
        let home = l.set.as_ref().map_or(&gw.key, |e| &e.set);
        l.kinds.contains(&route.kind)
            && namespace_allowed(&l.namespaces, &home.namespace, route.namespace, index)
    };
    let (mut any_selected, mut any_allowed, mut any_usable) = (false, false, false);
    // A Gateway without a plane serves nothing (refused below) and has no route table.
    let table = gw
        .plane
        .as_ref()
        .and_then(|plane| scheme_listeners.get(plane));
    let mut attached = Vec::with_capacity(gw.listeners.len());
    for (i, l) in gw.listeners.iter().enumerate() {
        if !selected(l) {
            continue;
        }
        any_selected = true;
        if !allows(l) {
            continue;
        }
        any_allowed = true;
        if !l.usable {
            if intersect(l.hostname.as_deref(), &route.hostnames).is_some() {
                invalid.push(i);
            }
            continue;
        }
        any_usable = true;
        if let Some(hosts) = intersect(l.hostname.as_deref(), &route.hostnames) {
            // Listener isolation: hostnames inside a more specific listener of the route
            // table are left to it; the route stays accepted (see
            // `SchemeListeners::taken_by_more_specific`).
            let taken = |h: &str| {
                table.is_some_and(|t| t.taken_by_more_specific(l.scheme, l.hostname.as_deref(), h))
            };
            let hosts = match hosts {
                Hosts::One(h) if taken(h) => Hosts::Some(Vec::new()),
                Hosts::Some(list) => Hosts::Some(list.into_iter().filter(|h| !taken(h)).collect()),
                hosts => hosts,
            };
            let redirect_port = if l.well_known_port {
                None
            } else {
                u16::try_from(l.port).ok()
            };
            attached.push(ListenerAttachment {
                index: i,
                name: l.name,
                hosts,
                redirect_port,
                scheme: l.scheme,
                hostname: l.hostname.as_deref(),
            });
        }
    }
    if !any_selected {
        return Err((
            Reason::NoMatchingParent,
            "no listener matches the parentRef sectionName/port".to_owned(),
        ));
    }
    if !any_allowed {
        return Err((
            Reason::NotAllowedByListeners,
            format!(
                "no listener allows {} from namespace {}",
                route.kind.as_str(),
                route.namespace
            ),
        ));
    }
    if !any_usable {
        return Err((
            Reason::NoMatchingParent,
            "the matching listeners are not valid".to_owned(),
        ));
    }
    if attached.is_empty() {
        return Err((
            Reason::NoMatchingListenerHostname,
            "no route hostname intersects a listener hostname".to_owned(),
        ));
    }
    // Listener problems are reported first; a Gateway refused for its parameters serves nothing,
    // and one not accepted takes no route, through a ListenerSet's listeners either (a
    // dedicated Gateway whose own listeners are all invalid keeps its plane, serving none).
    match &gw.plane {
        Some(plane) if gw.accepted() => Ok((plane.clone(), RouteTable::of(plane, gw), attached)),
        _ => Err((
            Reason::NoMatchingParent,
            format!("Gateway {} is not accepted", gw.key),
        )),
    }
}

fn namespace_allowed(
    allowed: &AllowedNamespaces<'_>,
    gateway_namespace: &str,
    route_namespace: &str,
    index: &Index<'_>,
) -> bool {
    match allowed {
        AllowedNamespaces::Same => gateway_namespace == route_namespace,
        AllowedNamespaces::All => true,
        AllowedNamespaces::Selector(sel) => {
            selector_matches(sel, index.namespace_labels(route_namespace))
        }
    }
}
