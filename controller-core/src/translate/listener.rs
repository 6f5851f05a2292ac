//! A listener of one of our Gateways, its own or one a ListenerSet brought
//! ([`super::listener_set`]): what it serves (hostname, scheme, route kinds, the namespaces it
//! admits routes from), whether routes may attach, and its status conditions. The Gateways
//! ([`super::gateway`]), the ListenerSets and route attachment ([`super::binding`]) all read
//! listeners so.

use std::collections::{BTreeMap, BTreeSet};

use cftunnel_config::valid;
use gateway_api::experimental::gateways::{
    GatewayListeners, GatewayListenersAllowedRoutesNamespacesFrom,
    GatewayListenersAllowedRoutesNamespacesSelector,
};

use super::scheme::Scheme;
use super::status::{Condition, ConditionType, ListenerStatus, Reason};
use super::{ObjectKey, RouteKind, GATEWAY_API_GROUP};

/// Which namespaces a listener admits routes from.
#[derive(Debug, Clone)]
pub(super) enum AllowedNamespaces<'a> {
    Same,
    All,
    Selector(&'a GatewayListenersAllowedRoutesNamespacesSelector),
}

#[derive(Debug)]
pub(super) struct OwnedListener<'a> {
    pub(super) name: &'a str,
    pub(super) port: i32,
    /// As written (`HTTP`, `HTTPS`, or one we do not serve).
    pub(super) protocol: &'a str,
    /// `port` is the well-known port of the listener's protocol (HTTP 80, HTTPS 443).
    pub(super) well_known_port: bool,
    /// The scheme the listener's clients use: `https` for an HTTPS listener, else `http`.
    pub(super) scheme: Scheme,
    /// Lower-cased.
    pub(super) hostname: Option<String>,
    /// Valid, unconflicted and of a supported protocol: routes may attach.
    pub(super) usable: bool,
    pub(super) kinds: BTreeSet<RouteKind>,
    pub(super) namespaces: AllowedNamespaces<'a>,
    pub(super) attached_routes: i32,
    /// The ListenerSet the listener comes from; `None` for the Gateway's own.
    pub(super) set: Option<Entry>,
    /// Why the listener conflicts with another one, until it is reported as `Conflicted`.
    pub(super) conflict: Option<(Reason, String)>,
    pub(super) conditions: Vec<Condition>,
}

impl OwnedListener<'_> {
    /// What the listener takes behind a tunnel, for conflict messages: `scheme://hostname`, or
    /// the scheme for any host.
    pub(super) fn serves(&self) -> String {
        match self.hostname.as_deref() {
            Some(hostname) => format!("{}://{hostname}", self.scheme),
            None => format!("{} for any host", self.scheme),
        }
    }

    /// Marks the listener conflicted: it serves nothing. The first conflict found is the one
    /// reported.
    pub(super) fn conflicts(&mut self, reason: Reason, message: String) {
        self.usable = false;
        self.conflict.get_or_insert((reason, message));
    }

    /// The listener's status as computed so far.
    pub(super) fn status(&self) -> ListenerStatus {
        ListenerStatus {
            name: self.name.to_owned(),
            attached_routes: self.attached_routes,
            supported_kinds: self.kinds.iter().map(|k| k.as_str().to_owned()).collect(),
            conditions: self.conditions.clone(),
        }
    }

    /// Marks the listener's references unresolved (its certificates, see [`listener_tls`]): it
    /// serves nothing. A route-kinds problem already reported keeps its place.
    pub(super) fn refs_unresolved(&mut self, reason: Reason, message: String) {
        self.usable = false;
        if let Some(c) = self
            .conditions
            .iter_mut()
            .find(|c| c.kind == ConditionType::ResolvedRefs && c.status)
        {
            c.status = false;
            c.reason = reason;
            c.message = message;
        }
    }

    /// Adds the conditions that wait for every conflict to be known: Conflicted, Programmed.
    /// A listener of a Gateway that is not accepted (`gateway_accepted` false) serves nothing,
    /// however valid, its ListenerSets' included.
    pub(super) fn settle(&mut self, generation: Option<i64>, gateway_accepted: bool) {
        if self.set.is_some() {
            return settle_entry(self, gateway_accepted);
        }
        match self.conflict.take() {
            Some((reason, message)) => {
                self.conditions.push(Condition::new(
                    ConditionType::Conflicted,
                    true,
                    reason,
                    message,
                    generation,
                ));
                self.push_programmed(generation, gateway_accepted);
            }
            None => self.push_unconflicted(generation, gateway_accepted),
        }
    }

    /// Conflicted=False, then Programmed as the listener's usability and its Gateway's
    /// acceptance say.
    fn push_unconflicted(&mut self, generation: Option<i64>, gateway_accepted: bool) {
        self.conditions.push(Condition::new(
            ConditionType::Conflicted,
            false,
            Reason::NoConflicts,
            "",
            generation,
        ));
        self.push_programmed(generation, gateway_accepted);
    }

    fn push_programmed(&mut self, generation: Option<i64>, gateway_accepted: bool) {
        let (programmed, reason, message) = match (self.usable, gateway_accepted) {
            (true, true) => (true, Reason::Programmed, ""),
            (true, false) => (false, Reason::Invalid, "the Gateway is not accepted"),
            (false, _) => (false, Reason::Invalid, ""),
        };
        self.conditions.push(Condition::new(
            ConditionType::Programmed,
            programmed,
            reason,
            message,
            generation,
        ));
    }
}

/// Where a listener of a Gateway comes from when a ListenerSet brought it.
#[derive(Debug, Clone)]
pub(super) struct Entry {
    pub(super) set: ObjectKey,
    pub(super) generation: Option<i64>,
}

/// Adds a ListenerSet listener's conditions that wait for every conflict to be known. A
/// conflicted one is not accepted either, and says why in each condition.
fn settle_entry(l: &mut OwnedListener<'_>, gateway_accepted: bool) {
    let generation = l.set.as_ref().and_then(|e| e.generation);
    match l.conflict.take() {
        Some((reason, message)) => {
            for c in l
                .conditions
                .iter_mut()
                .filter(|c| c.kind == ConditionType::Accepted)
            {
                *c = Condition::new(
                    ConditionType::Accepted,
                    false,
                    reason,
                    message.clone(),
                    generation,
                );
            }
            l.conditions.push(Condition::new(
                ConditionType::Conflicted,
                true,
                reason,
                message.clone(),
                generation,
            ));
            l.conditions.push(Condition::new(
                ConditionType::Programmed,
                false,
                reason,
                message,
                generation,
            ));
        }
        None => l.push_unconflicted(generation, gateway_accepted),
    }
}

/// Whether listeners of `protocol` are served. TLS terminates at the Cloudflare edge: the
/// data plane sees HTTPS listeners as HTTP.
pub(super) fn served_protocol(protocol: &str) -> bool {
    matches!(protocol, "HTTP" | "HTTPS")
}

/// Listener `l` as written, validated on its own (protocol, hostname, route kinds): conflicts
/// with other listeners are marked later, by whoever holds them side by side.
pub(super) fn listener(l: &GatewayListeners, generation: Option<i64>) -> OwnedListener<'_> {
    let mut conditions = Vec::new();
    let supported_protocol = served_protocol(&l.protocol);
    let problem = if !supported_protocol {
        Some((
            Reason::UnsupportedProtocol,
            format!("protocol {} is not supported (HTTP, HTTPS)", l.protocol),
        ))
    } else {
        l.hostname
            .as_deref()
            .and_then(|h| valid::check_hostname(h).err())
            .map(|e| (Reason::UnsupportedValue, format!("hostname: {e}")))
    };
    let valid = problem.is_none();
    match problem {
        None => conditions.push(Condition::new(
            ConditionType::Accepted,
            true,
            Reason::Accepted,
            "",
            generation,
        )),
        Some((reason, message)) => conditions.push(Condition::new(
            ConditionType::Accepted,
            false,
            reason,
            message,
            generation,
        )),
    }

    let allowed = l.allowed_routes.as_ref();
    let mut kinds = BTreeSet::new();
    let mut invalid_kinds = Vec::new();
    match allowed.and_then(|a| a.kinds.as_ref()) {
        Some(requested) if !requested.is_empty() => {
            for k in requested {
                let group_ok = k.group.as_deref().unwrap_or(GATEWAY_API_GROUP) == GATEWAY_API_GROUP;
                match (group_ok, k.kind.as_str()) {
                    (true, "HTTPRoute") => {
                        kinds.insert(RouteKind::Http);
                    }
                    (true, "GRPCRoute") => {
                        kinds.insert(RouteKind::Grpc);
                    }
                    _ => invalid_kinds.push(k.kind.clone()),
                }
            }
        }
        _ => {
            kinds.insert(RouteKind::Http);
            kinds.insert(RouteKind::Grpc);
        }
    }
    if invalid_kinds.is_empty() {
        conditions.push(Condition::new(
            ConditionType::ResolvedRefs,
            true,
            Reason::ResolvedRefs,
            "",
            generation,
        ));
    } else {
        conditions.push(Condition::new(
            ConditionType::ResolvedRefs,
            false,
            Reason::InvalidRouteKinds,
            format!("unsupported route kinds: {}", invalid_kinds.join(", ")),
            generation,
        ));
    }

    let namespaces = match allowed.and_then(|a| a.namespaces.as_ref()) {
        None => AllowedNamespaces::Same,
        Some(ns) => match (&ns.from, &ns.selector) {
            (Some(GatewayListenersAllowedRoutesNamespacesFrom::All), _) => AllowedNamespaces::All,
            (Some(GatewayListenersAllowedRoutesNamespacesFrom::Selector), Some(sel)) => {
                AllowedNamespaces::Selector(sel)
            }
            _ => AllowedNamespaces::Same,
        },
    };

    if !supported_protocol {
        // The listener serves no route kind of ours (e.g. TLS passthrough wants TLSRoute).
        kinds.clear();
    }
    OwnedListener {
        name: &l.name,
        port: l.port,
        protocol: &l.protocol,
        well_known_port: matches!((l.protocol.as_str(), l.port), ("HTTP", 80) | ("HTTPS", 443)),
        scheme: if l.protocol == "HTTPS" {
            Scheme::Https
        } else {
            Scheme::Http
        },
        hostname: l.hostname.as_deref().map(str::to_ascii_lowercase),
        usable: valid,
        kinds,
        namespaces,
        attached_routes: 0,
        set: None,
        conflict: None,
        conditions,
    }
}

/// Whether a label selector matches `labels` (matchLabels and matchExpressions ANDed).
pub(super) fn selector_matches(
    selector: &GatewayListenersAllowedRoutesNamespacesSelector,
    labels: Option<&BTreeMap<String, String>>,
) -> bool {
    let get = |k: &str| labels.and_then(|l| l.get(k));
    let labels_ok = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| get(k) == Some(v));
    let expressions_ok = selector.match_expressions.iter().flatten().all(|e| {
        let values = e.values.as_deref().unwrap_or_default();
        match e.operator.as_str() {
            "In" => get(&e.key).is_some_and(|v| values.contains(v)),
            "NotIn" => get(&e.key).is_none_or(|v| !values.contains(v)),
            "Exists" => get(&e.key).is_some(),
            "DoesNotExist" => get(&e.key).is_none(),
            _ => false,
        }
    });
    labels_ok && expressions_ok
}
