//! Which GatewayClasses and Gateways are ours, the conflicts between their listeners (within a
//! Gateway and across the shared plane), and the Gateway status (Gateway API
//! `GatewayConditionType`). A listener itself, its validation and status
//! (`ListenerConditionType`), is [`super::listener`]'s.

use std::collections::hash_map::Entry;
use std::collections::BTreeMap;
use std::hash::BuildHasher;
use std::sync::Arc;

use gateway_api::experimental::gatewayclasses::GatewayClass;
use gateway_api::experimental::gateways::{Gateway, GatewayListeners};
use hashbrown::HashTable;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use rustc_hash::{FxBuildHasher, FxHashMap, FxHashSet};

use crate::render::Plans;

use super::bundle_version;
use super::client_certificate;
use super::listener::{listener, OwnedListener};
use super::listener_set;
use super::listener_tls;
use super::scheme::Scheme;
use super::status::{Condition, ConditionType, GatewayStatus, Reason};
use super::{
    Index, ObjectKey, Options, PlaneKey, Precedence, Snapshot, TunnelIdentity,
    GATEWAY_CONFIG_GROUP, GATEWAY_CONFIG_KIND,
};

/// The owned classes by name; `None` when the class is owned by name only (`--gateway-class-name`)
/// and its object is not in the snapshot.
pub(super) fn owned_classes<'a>(
    snapshot: &'a Snapshot,
    options: &Options,
) -> BTreeMap<String, Option<&'a GatewayClass>> {
    let mut classes = BTreeMap::new();
    for class in snapshot.gateway_classes.iter().map(Arc::as_ref) {
        let Some(name) = class.metadata.name.as_deref() else {
            continue;
        };
        let by_controller = class.spec.controller_name == options.controller_name;
        let by_name = options.gateway_class_name.as_deref() == Some(name);
        if by_controller || by_name {
            classes.insert(name.to_owned(), Some(class));
        }
    }
    if let Some(name) = &options.gateway_class_name {
        classes.entry(name.clone()).or_insert(None);
    }
    classes
}

/// An owned class's conditions: `Accepted` (False with `InvalidParameters` when its
/// `parametersRef` cannot be used, `refused`), and with it `SupportedVersion`, which the spec
/// requires whenever a class is accepted. Unsupported CRD versions leave the class accepted:
/// we serve them on a best-effort basis (see [`bundle_version`]).
pub(super) fn class_conditions(
    class: Option<&GatewayClass>,
    refused: Option<&str>,
    crd_versions: &bundle_version::CrdVersions,
) -> Vec<Condition> {
    let generation = class.and_then(|c| c.metadata.generation);
    let accepted = match refused {
        None => Condition::new(
            ConditionType::Accepted,
            true,
            Reason::Accepted,
            "",
            generation,
        ),
        Some(why) => Condition::new(
            ConditionType::Accepted,
            false,
            Reason::InvalidParameters,
            why,
            generation,
        ),
    };
    vec![accepted, crd_versions.condition(generation)]
}

#[derive(Debug)]
pub(super) struct OwnedGateway<'a> {
    pub(super) key: ObjectKey,
    created: Option<&'a Time>,
    generation: Option<i64>,
    /// The plane serving this Gateway; `None` when the Gateway is not accepted, but for a
    /// dedicated Gateway whose listeners are all invalid: its plane stays, serving none of its
    /// routes (only those of accepted Gateways sharing its tunnel).
    pub(super) plane: Option<PlaneKey>,
    /// The tunnel of that plane, when known (a dedicated plane's always is).
    pub(super) tunnel: Option<TunnelIdentity>,
    /// A dedicated Gateway on a tunnel that dedicated Gateways of other namespaces use too
    /// (`TunnelShared`): sharing is supported there and its routes stay accepted, so routes
    /// of the two kinds are kept apart only among its namespace's Gateways there
    /// ([`super::binding::RouteTable`]).
    pub(super) tenant_shared_tunnel: bool,
    pub(super) listeners: Vec<OwnedListener<'a>>,
    /// Why `infrastructure.parametersRef` makes no plane.
    refused: Option<(Reason, String)>,
    /// `spec.addresses`, as `(type, value)`.
    requested: Vec<(&'a str, &'a str)>,
    /// `spec.tls.backend.clientCertificateRef`, when set: the certificate, or why it cannot
    /// be used (the Gateway's `ResolvedRefs`; it stays accepted either way).
    pub(super) client_certificate:
        Option<Result<client_certificate::GatewayClientCertificate, (Reason, String)>>,
    conditions: Vec<Condition>,
}

impl<'a> OwnedGateway<'a> {
    /// Whether the Gateway is accepted, and if not why; final once every listener conflict is
    /// known.
    fn acceptance(&self) -> Result<(), (Reason, String)> {
        match &self.refused {
            Some(refused) => Err(refused.clone()),
            None if self.every_own_listener(|_, l| !l.usable) => {
                Err((Reason::ListenersNotValid, "no listener is valid".to_owned()))
            }
            None => Ok(()),
        }
    }

    /// Why `spec.addresses` is not what the Gateway gets, if it is not: Gateway API requires
    /// an address asked for and not assigned to show in the conditions. A Gateway is reached
    /// at its tunnel's hostname alone, so the one address it can be given is that `Hostname`
    /// (asked for by value, or by type alone).
    fn unassigned_addresses(&self) -> Option<String> {
        if self.requested.is_empty() {
            return None;
        }
        let ours = self.tunnel.map(|t| crate::render::tunnel_hostname(t.id));
        let unassigned: Vec<String> = self
            .requested
            .iter()
            // A tunnel not known here (named by its ID alone, or its token unreadable for
            // now) may well have the hostname asked for.
            .filter(|(kind, value)| {
                *kind != "Hostname"
                    || !(value.is_empty() || ours.is_none() || Some(*value) == ours.as_deref())
            })
            .map(|(kind, value)| match *value {
                "" => format!("an address of type {kind}"),
                value => format!("{kind} {value}"),
            })
            .collect();
        if unassigned.is_empty() {
            return None;
        }
        let at = match &ours {
            Some(ours) => format!("its tunnel's hostname, {ours}"),
            None => "its tunnel's hostname".to_owned(),
        };
        Some(format!(
            "spec.addresses asks for {}: a Gateway is reached at {at}, alone",
            unassigned.join(", ")
        ))
    }

    /// Whether the Gateway is accepted; final once every listener conflict is known.
    pub(super) fn accepted(&self) -> bool {
        self.acceptance().is_ok()
    }

    /// The listeners that hold their hostnames in the route table (listener isolation, and the
    /// scheme each host is served over): the usable ones of an accepted Gateway, its
    /// ListenerSets' included. A Gateway that is not accepted serves none of its routes, so its
    /// listeners take no hostname from another's, though a dedicated one keeps its plane.
    /// Final once the Gateway is settled.
    pub(super) fn hostname_holders(&self) -> impl Iterator<Item = &OwnedListener<'a>> {
        let accepted = self.accepted();
        self.listeners.iter().filter(move |l| accepted && l.usable)
    }

    /// The Gateway's own listeners, without those of its ListenerSets.
    fn own_listeners(&self) -> impl Iterator<Item = &OwnedListener<'_>> {
        self.listeners.iter().filter(|l| l.set.is_none())
    }

    /// Whether the Gateway has listeners of its own and `out` holds for each of them (with
    /// its position in `listeners`): without one left, it is not accepted.
    fn every_own_listener(&self, mut out: impl FnMut(usize, &OwnedListener<'_>) -> bool) -> bool {
        let mut own = self
            .listeners
            .iter()
            .enumerate()
            .filter(|(_, l)| l.set.is_none())
            .peekable();
        own.peek().is_some() && own.all(|(index, l)| out(index, l))
    }

    /// Settles the status once every listener conflict is known, within the Gateway and, on
    /// the shared plane, with its other Gateways: the listeners' Conflicted and Programmed, the
    /// Gateway's Accepted and Programmed. A Gateway that ends up not accepted has no plane,
    /// except a dedicated one whose listeners are all invalid: without a plane, the runtime
    /// would leave its running pods on their last config, still serving the routes of the
    /// listeners that are gone, so it keeps its plane, which gets none of its routes. Its pods
    /// stay connectors of its tunnel, so they still serve the routes of the accepted Gateways
    /// on that tunnel (`serving`, by tunnel), and `Programmed` says which.
    fn settle(&mut self, serving: &BTreeMap<TunnelIdentity, Vec<ObjectKey>>) {
        let generation = self.generation;
        // Listener conflicts are all marked by now, so acceptance is final.
        let accepted = self.acceptance();
        for l in &mut self.listeners {
            l.settle(generation, accepted.is_ok());
        }
        // Gateway API: ListenersNotValid may come with Accepted=True when the Gateway still
        // serves its valid listeners.
        let invalid: Vec<&str> = self
            .own_listeners()
            .filter(|l| !l.usable)
            .map(|l| l.name)
            .collect();
        let (accepted_reason, accepted_message) = if invalid.is_empty() {
            (Reason::Accepted, String::new())
        } else {
            (
                Reason::ListenersNotValid,
                format!("listeners not valid: {}", invalid.join(", ")),
            )
        };
        self.conditions = match accepted {
            Ok(()) => vec![
                Condition::new(
                    ConditionType::Accepted,
                    true,
                    accepted_reason,
                    accepted_message,
                    generation,
                ),
                match self.unassigned_addresses() {
                    None => Condition::new(
                        ConditionType::Programmed,
                        true,
                        Reason::Programmed,
                        "",
                        generation,
                    ),
                    Some(why) => Condition::new(
                        ConditionType::Programmed,
                        false,
                        Reason::AddressNotAssigned,
                        why,
                        generation,
                    ),
                },
            ],
            Err((reason, message)) => {
                let keeps_plane = reason == Reason::ListenersNotValid
                    && matches!(self.plane, Some(PlaneKey::Dedicated(_)));
                let sharing = self
                    .tunnel
                    .and_then(|t| serving.get(&t).map(|keys| (t.id, keys)));
                let programmed = if !keeps_plane {
                    self.plane = None;
                    self.tunnel = None;
                    "the Gateway is not accepted".to_owned()
                } else if let Some((id, keys)) = sharing {
                    let keys: Vec<String> = keys.iter().map(ToString::to_string).collect();
                    format!(
                        "the Gateway is not accepted; until a listener is valid its data plane \
                         serves none of its own routes, only those of the other Gateways on \
                         its tunnel {id} ({})",
                        keys.join(", ")
                    )
                } else {
                    "the Gateway is not accepted; its data plane serves no routes (every \
                     request gets 404) until a listener is valid"
                        .to_owned()
                };
                vec![
                    Condition::new(ConditionType::Accepted, false, reason, message, generation),
                    Condition::new(
                        ConditionType::Programmed,
                        false,
                        Reason::Invalid,
                        programmed,
                        generation,
                    ),
                ]
            }
        };
        if let Some(resolved) = &self.client_certificate {
            self.conditions
                .push(client_certificate::condition(resolved, generation));
        }
    }

    /// The client certificate the Gateway presents to backends, when it names a usable one.
    pub(super) fn backend_certificate(
        &self,
    ) -> Option<&client_certificate::GatewayClientCertificate> {
        self.client_certificate
            .as_ref()
            .and_then(|r| r.as_ref().ok())
    }

    /// The Gateway's status, with `attached_listener_sets` ListenerSets attached.
    pub(super) fn into_status(self, attached_listener_sets: i32) -> GatewayStatus {
        let listeners = self.own_listeners().map(OwnedListener::status).collect();
        GatewayStatus {
            conditions: self.conditions,
            listeners,
            attached_listener_sets,
        }
    }
}

/// Our Gateways in `{namespace}/{name}` order, each also found by hash: every route looks up
/// the Gateways of its parentRefs, and an ordered map would compare their keys as strings at
/// every level. A Gateway's position in the order identifies it for the rest of a translation.
pub(super) struct OwnedGateways<'a> {
    list: Vec<OwnedGateway<'a>>,
    /// Positions in `list` by the hash of the key.
    positions: HashTable<usize>,
}

fn key_hash(namespace: &str, name: &str) -> u64 {
    FxBuildHasher.hash_one((namespace, name))
}

impl<'a> OwnedGateways<'a> {
    fn new(gateways: BTreeMap<ObjectKey, OwnedGateway<'a>>) -> Self {
        let list: Vec<OwnedGateway<'a>> = gateways.into_values().collect();
        let mut positions = HashTable::with_capacity(list.len());
        for (i, gw) in list.iter().enumerate() {
            positions.insert_unique(key_hash(&gw.key.namespace, &gw.key.name), i, |&j| {
                let key = &list[j].key;
                key_hash(&key.namespace, &key.name)
            });
        }
        Self { list, positions }
    }

    /// The position of Gateway `namespace/name`, when it is ours.
    pub(super) fn position(&self, namespace: &str, name: &str) -> Option<usize> {
        self.positions
            .find(key_hash(namespace, name), |&i| {
                let key = &self.list[i].key;
                key.namespace == namespace && key.name == name
            })
            .copied()
    }

    pub(super) fn get(&self, key: &ObjectKey) -> Option<&OwnedGateway<'a>> {
        self.position(&key.namespace, &key.name)
            .map(|i| &self.list[i])
    }

    /// The Gateway at `position`.
    pub(super) fn at(&self, position: usize) -> Option<&OwnedGateway<'a>> {
        self.list.get(position)
    }

    pub(super) fn at_mut(&mut self, position: usize) -> Option<&mut OwnedGateway<'a>> {
        self.list.get_mut(position)
    }

    /// In `{namespace}/{name}` order.
    pub(super) fn values(&self) -> std::slice::Iter<'_, OwnedGateway<'a>> {
        self.list.iter()
    }

    pub(super) fn values_mut(&mut self) -> std::slice::IterMut<'_, OwnedGateway<'a>> {
        self.list.iter_mut()
    }

    pub(super) fn into_values(self) -> std::vec::IntoIter<OwnedGateway<'a>> {
        self.list.into_iter()
    }
}

/// Our Gateways, each with the listeners of the ListenerSets in `sets` it admits after its own.
pub(super) fn owned_gateways<'a>(
    snapshot: &'a Snapshot,
    classes: &BTreeMap<String, Option<&GatewayClass>>,
    options: &Options,
    plans: &Plans,
    index: &Index<'_>,
    sets: &'a listener_set::ListenerSets,
) -> OwnedGateways<'a> {
    let mut out = BTreeMap::new();
    for gw in &snapshot.gateways {
        if !classes.contains_key(&gw.spec.gateway_class_name) {
            continue;
        }
        let (Some(ns), Some(name)) = (
            gw.metadata.namespace.as_deref(),
            gw.metadata.name.as_deref(),
        ) else {
            continue;
        };
        let key = ObjectKey::new(ns, name);
        let mut owned = owned_gateway(key.clone(), gw, options, plans);
        for (position, (l, spec)) in owned
            .listeners
            .iter_mut()
            .zip(&gw.spec.listeners)
            .enumerate()
        {
            if let Some((reason, message)) =
                listener_tls::problem(spec, position, ns, "Gateway", index)
            {
                l.refs_unresolved(reason, message);
            }
        }
        owned.client_certificate = client_certificate::resolve(gw, ns, index);
        sets.extend(&owned.key, &mut owned.listeners, index);
        out.insert(key, owned);
    }
    mark_shared_plane_conflicts(&mut out);
    // The Gateways whose routes each tunnel serves: what a plane kept without routes of its
    // own still serves (see `OwnedGateway::settle`).
    let mut serving: BTreeMap<TunnelIdentity, Vec<ObjectKey>> = BTreeMap::new();
    for gw in out.values() {
        if let (Some(_), Some(tunnel), Ok(())) = (&gw.plane, gw.tunnel, gw.acceptance()) {
            serving.entry(tunnel).or_default().push(gw.key.clone());
        }
    }
    for gw in out.values_mut() {
        gw.settle(&serving);
    }
    OwnedGateways::new(out)
}

/// The tunnel of the data plane the GatewayConfig `name` (in the Gateway's namespace) makes,
/// or why it cannot make one: missing, or failing to resolve or render. Read from the render
/// the caller applies, not rendered again.
fn dedicated_tunnel(key: &ObjectKey, name: &str, plans: &Plans) -> Result<TunnelIdentity, String> {
    match plans.get(key) {
        Some(Ok(rendered)) => Ok(TunnelIdentity::of(&rendered.credentials.tunnel)),
        Some(Err(e)) => Err(e.to_string()),
        None => Err(format!(
            "{GATEWAY_CONFIG_KIND} {}/{name} (infrastructure.parametersRef) was not rendered",
            key.namespace
        )),
    }
}

fn owned_gateway<'a>(
    key: ObjectKey,
    gw: &'a Gateway,
    options: &Options,
    plans: &Plans,
) -> OwnedGateway<'a> {
    let generation = gw.metadata.generation;
    let mut listeners: Vec<OwnedListener<'_>> = gw
        .spec
        .listeners
        .iter()
        .map(|l| listener(l, generation))
        .collect();
    mark_conflicts(&mut listeners, &gw.spec.listeners);

    let parameters = gw
        .spec
        .infrastructure
        .as_ref()
        .and_then(|i| i.parameters_ref.as_ref());
    let (plane, tunnel, refused) = match parameters {
        None => (Some(PlaneKey::Shared), options.shared_tunnel, None),
        Some(p) if p.group == GATEWAY_CONFIG_GROUP && p.kind == GATEWAY_CONFIG_KIND => {
            match dedicated_tunnel(&key, &p.name, plans) {
                Ok(id) => {
                    let running = options.running_tunnels.get(&key).copied();
                    (Some(PlaneKey::Dedicated(key.clone())), running.or(Some(id)), None)
                }
                Err(problem) => (None, None, Some((Reason::InvalidParameters, problem))),
            }
        }
        Some(p) => (
            None,
            None,
            Some((
                Reason::InvalidParameters,
                format!(
                    "infrastructure.parametersRef must name a {GATEWAY_CONFIG_GROUP}/{GATEWAY_CONFIG_KIND}, not {}/{}",
                    p.group, p.kind
                ),
            )),
        ),
    };
    OwnedGateway {
        key,
        created: gw.metadata.creation_timestamp.as_ref(),
        generation,
        plane,
        tunnel,
        tenant_shared_tunnel: false,
        listeners,
        refused,
        requested: gw
            .spec
            .addresses
            .iter()
            .flatten()
            .map(|a| {
                (
                    a.r#type.as_deref().unwrap_or("IPAddress"),
                    a.value.as_deref().unwrap_or_default(),
                )
            })
            .collect(),
        client_certificate: None,
        conditions: Vec::new(),
    }
}

/// Listeners sharing a port conflict when their protocols differ or their hostnames are equal
/// (Gateway API "Listener conflicts"); conflicted listeners serve nothing.
fn mark_conflicts(listeners: &mut [OwnedListener<'_>], specs: &[GatewayListeners]) {
    let mut conflicts: Vec<Option<(Reason, String)>> = vec![None; listeners.len()];
    for (i, a) in specs.iter().enumerate() {
        for (j, b) in specs.iter().enumerate() {
            if i == j || a.port != b.port {
                continue;
            }
            let reason = if a.protocol != b.protocol {
                Some((
                    Reason::ProtocolConflict,
                    format!(
                        "listener {} uses port {} with protocol {}",
                        b.name, b.port, b.protocol
                    ),
                ))
            } else if listeners[i].hostname == listeners[j].hostname {
                Some((
                    Reason::HostnameConflict,
                    format!("listener {} uses the same port and hostname", b.name),
                ))
            } else {
                None
            };
            if let (Some(r), Some(slot)) = (reason, conflicts.get_mut(i)) {
                if slot.is_none() {
                    *slot = Some(r);
                }
            }
        }
    }
    for (l, conflict) in listeners.iter_mut().zip(conflicts) {
        if let Some((reason, message)) = conflict {
            l.conflicts(reason, message);
        }
    }
}

/// Conflicts (`HostnameConflict`) each listener of a shared-plane ([`PlaneKey::Shared`]) Gateway
/// whose scheme and hostname (both without one included) an older Gateway's usable listener
/// holds: behind a tunnel ports mean nothing, so both would take the same requests. Gateways on
/// dedicated planes never conflict across Gateways. See docs/design/listeners-and-schemes.md.
fn mark_shared_plane_conflicts(gateways: &mut BTreeMap<ObjectKey, OwnedGateway<'_>>) {
    // A Gateway that will not be accepted (every listener of its own invalid) serves nothing,
    // so its listeners, its ListenerSets' included, take no hostname from another.
    let mut order: Vec<&OwnedGateway<'_>> = gateways
        .values()
        .filter(|gw| gw.plane == Some(PlaneKey::Shared) && gw.accepted())
        .collect();
    order.sort_by(|a, b| {
        Precedence::new(a.created, &a.key.namespace, &a.key.name).cmp(&Precedence::new(
            b.created,
            &b.key.namespace,
            &b.key.name,
        ))
    });
    // Nor does one whose own listeners all lose here: the pass is run again without the first
    // such (the later ones may have lost to it), and its listeners keep the conflicts they lost
    // by.
    let mut carried = Vec::new();
    let conflicts = loop {
        let conflicts = shared_plane_conflicts(&order);
        let lost: FxHashSet<(&ObjectKey, usize)> = conflicts
            .iter()
            .map(|(key, index, _)| (key, *index))
            .collect();
        let first_out = order.iter().position(|gw| {
            gw.every_own_listener(|index, l| !l.usable || lost.contains(&(&gw.key, index)))
        });
        let Some(first_out) = first_out else {
            break conflicts;
        };
        let out = order.remove(first_out);
        carried.extend(conflicts.into_iter().filter(|(key, _, _)| *key == out.key));
    };
    for (key, index, message) in conflicts.into_iter().chain(carried) {
        if let Some(l) = gateways
            .get_mut(&key)
            .and_then(|gw| gw.listeners.get_mut(index))
        {
            l.conflicts(Reason::HostnameConflict, message);
        }
    }
}

/// The listeners of the Gateways in `order` (precedence order) that an earlier one's usable
/// listener of the same scheme and hostname holds, with why: `(Gateway, listener position,
/// message)`.
fn shared_plane_conflicts(order: &[&OwnedGateway<'_>]) -> Vec<(ObjectKey, usize, String)> {
    // Per scheme and hostname: the Gateway and listener keeping them. Only looked up, never
    // iterated, so a hash map: its order cannot reach the output. Sized for every listener,
    // where growing it rehashed every entry at each doubling.
    let mut holders: FxHashMap<(Scheme, Option<&str>), (&ObjectKey, &str)> =
        FxHashMap::with_capacity_and_hasher(
            order.iter().map(|gw| gw.listeners.len()).sum(),
            Default::default(),
        );
    let mut conflicts = Vec::new();
    for gw in order {
        for (index, l) in gw.listeners.iter().enumerate().filter(|(_, l)| l.usable) {
            match holders.entry((l.scheme, l.hostname.as_deref())) {
                Entry::Vacant(entry) => {
                    entry.insert((&gw.key, l.name));
                }
                // Two listeners of one Gateway on different ports: its own routes.
                Entry::Occupied(entry) if *entry.get().0 == gw.key => {}
                Entry::Occupied(entry) => {
                    let (holder, listener) = *entry.get();
                    let what = l.serves();
                    conflicts.push((
                        gw.key.clone(),
                        index,
                        format!(
                            "listener {listener} of Gateway {holder} already serves {what} on the shared plane and takes precedence (older, or first by namespace/name); ports do not tell listeners apart behind a tunnel"
                        ),
                    ));
                }
            }
        }
    }
    conflicts
}

/// Status of a request no route of its listener matches.
pub(super) const NO_ROUTE_STATUS: u16 = 404;

/// Listener isolation (Gateway API `GatewayHTTPListenerIsolation`): a request whose host
/// matches a listener's hostname is served only by routes attached to that listener. The
/// proxy falls back from a host's rules to less specific hostnames when no rule matches (right
/// within one listener, where route hostnames refine it), so each listener hostname gets a
/// last-resort rule that answers 404 instead of falling through to other listeners. It is a
/// regular expression match placed after every route rule, so any route rule of the same
/// hostname outranks it. Each comes with its listener's scheme.
///
/// These are the listeners of `gw` that get one, with their hostnames: those holding a
/// hostname ([`OwnedGateway::hostname_holders`]). One rule serves a hostname for every
/// listener of it on a plane, so the caller builds it ([`listener_isolation_rule`]) only for
/// the first.
pub(super) fn isolated_listeners<'g, 'a>(
    gw: &'g OwnedGateway<'a>,
) -> impl Iterator<Item = (&'g str, &'g OwnedListener<'a>)> + 'g {
    gw.hostname_holders()
        .filter_map(|l| Some((l.hostname.as_deref()?, l)))
}

/// The listener-isolation rule of `hostname`, named after listener `l` of `gw` (see
/// [`isolated_listeners`]).
pub(super) fn listener_isolation_rule(
    gw: &OwnedGateway<'_>,
    l: &OwnedListener<'_>,
    hostname: &str,
) -> cftunnel_config::Rule {
    // `<namespace>/<name>/listener:<listener>`, or the ListenerSet's key and
    // `listenerset-listener:` for one of its listeners.
    let (owner, kind) = match &l.set {
        None => (&gw.key, "/listener:"),
        Some(entry) => (&entry.set, "/listenerset-listener:"),
    };
    cftunnel_config::Rule {
        hostnames: vec![hostname.to_owned()],
        matches: vec![cftunnel_config::Match {
            path: Some(cftunnel_config::PathMatch {
                kind: cftunnel_config::PathMatchType::RegularExpression,
                value: ".*".to_owned(),
            }),
            ..cftunnel_config::Match::default()
        }],
        unavailable_status: Some(NO_ROUTE_STATUS),
        name: Some(super::joined([
            &owner.namespace,
            "/",
            &owner.name,
            kind,
            l.name,
        ])),
        ..cftunnel_config::Rule::default()
    }
}
