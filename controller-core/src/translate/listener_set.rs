//! ListenerSets (Gateway API `ListenerSet`, GEP-1713): listeners attached to one of our Gateways
//! from outside it, so that a team can add its hostnames to a Gateway it does not own.
//!
//! A Gateway admits ListenerSets through `spec.allowedListeners.namespaces.from` (`None`, the
//! default, admits none; `Same`, `All`, `Selector`). An admitted set's listeners are appended
//! to its Gateway's, after the Gateway's own and in ListenerSet precedence (oldest, then
//! `{namespace}/{name}`), and are from then on listeners of that Gateway like any other: the
//! same plane, hostnames, listener isolation and conflicts across the shared plane. Within the
//! Gateway, a ListenerSet listener that shares a port with an earlier listener and either its
//! hostname or not its protocol is `Conflicted` (the earlier one wins: the Gateway's own
//! first). Routes reach them only through a parentRef of kind `ListenerSet` (its `sectionName`
//! a listener name), never through one naming the Gateway, and a listener's `allowedRoutes`
//! `Same` means the ListenerSet's namespace.

use std::collections::BTreeMap;
use std::sync::Arc;

use gateway_api::experimental::gatewayclasses::GatewayClass;
use gateway_api::experimental::gateways::{
    Gateway, GatewayAllowedListenersNamespacesFrom, GatewayListeners,
    GatewayListenersAllowedRoutesNamespacesSelector,
};
use gateway_api::experimental::listenersets::ListenerSet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::listener::{self, selector_matches, Entry, OwnedListener};
use super::listener_tls;
use super::status::{Condition, ConditionType, ListenerSetStatus, Reason};
use super::{Index, ObjectKey, Precedence, Snapshot, GATEWAY_API_GROUP};

/// One ListenerSet whose parent is one of our Gateways, judged against it.
#[derive(Debug)]
struct Judged {
    key: ObjectKey,
    gateway: ObjectKey,
    generation: Option<i64>,
    /// Its listeners, read as a Gateway's; or why the Gateway does not take them.
    listeners: Result<Vec<GatewayListeners>, (Reason, String)>,
}

/// The ListenerSets of our Gateways, in precedence order.
#[derive(Debug, Default)]
pub(super) struct ListenerSets {
    sets: Vec<Judged>,
    /// Sets whose Gateway no longer exists while their status still says they are accepted:
    /// no controller is left to say otherwise, so we do (whoever wrote it, it is stale).
    orphaned: Vec<Orphan>,
}

/// A ListenerSet still marked accepted by a Gateway that is gone.
#[derive(Debug)]
struct Orphan {
    key: ObjectKey,
    gateway: ObjectKey,
    generation: Option<i64>,
}

impl ListenerSets {
    /// Judges every ListenerSet whose `parentRef` names a Gateway of one of `classes`; others
    /// are not ours and are left out.
    pub(super) fn new(
        snapshot: &Snapshot,
        classes: &BTreeMap<String, Option<&GatewayClass>>,
        index: &Index<'_>,
    ) -> Self {
        let gateways: BTreeMap<(&str, &str), &Gateway> = snapshot
            .gateways
            .iter()
            .map(Arc::as_ref)
            .filter(|gw| classes.contains_key(&gw.spec.gateway_class_name))
            .filter_map(|gw| {
                let meta = &gw.metadata;
                Some(((meta.namespace.as_deref()?, meta.name.as_deref()?), gw))
            })
            .collect();
        let mut sets: Vec<(Option<&Time>, Judged)> = Vec::new();
        let mut orphaned = Vec::new();
        for set in &snapshot.listener_sets {
            let (Some(namespace), Some(name)) = (
                set.metadata.namespace.as_deref(),
                set.metadata.name.as_deref(),
            ) else {
                continue;
            };
            let parent = &set.spec.parent_ref;
            if parent.group.as_deref().unwrap_or(GATEWAY_API_GROUP) != GATEWAY_API_GROUP
                || parent.kind.as_deref().unwrap_or("Gateway") != "Gateway"
            {
                continue;
            }
            let parent_namespace = parent.namespace.as_deref().unwrap_or(namespace);
            let Some(gw) = gateways.get(&(parent_namespace, parent.name.as_str())) else {
                if still_accepted(set) && !exists(snapshot, parent_namespace, &parent.name) {
                    orphaned.push(Orphan {
                        key: ObjectKey::new(namespace, name),
                        gateway: ObjectKey::new(parent_namespace, &parent.name),
                        generation: set.metadata.generation,
                    });
                }
                continue;
            };
            let listeners = admits(gw, parent_namespace, namespace, index)
                .and_then(|()| as_gateway_listeners(set));
            sets.push((
                set.metadata.creation_timestamp.as_ref(),
                Judged {
                    key: ObjectKey::new(namespace, name),
                    gateway: ObjectKey::new(parent_namespace, &parent.name),
                    generation: set.metadata.generation,
                    listeners,
                },
            ));
        }
        sets.sort_by(|(a_created, a), (b_created, b)| {
            Precedence::new(*a_created, &a.key.namespace, &a.key.name).cmp(&Precedence::new(
                *b_created,
                &b.key.namespace,
                &b.key.name,
            ))
        });
        Self {
            sets: sets.into_iter().map(|(_, judged)| judged).collect(),
            orphaned,
        }
    }

    /// The Gateway the ListenerSet `key` is attached to, if it is admitted by one of ours;
    /// `Err` with why when its Gateway is ours but does not take it.
    pub(super) fn gateway_of(&self, key: &ObjectKey) -> Option<Result<&ObjectKey, String>> {
        let set = self.sets.iter().find(|s| s.key == *key)?;
        Some(match &set.listeners {
            Ok(_) => Ok(&set.gateway),
            Err((_, why)) => Err(format!(
                "ListenerSet {key} is not attached to Gateway {}: {why}",
                set.gateway
            )),
        })
    }

    /// Appends to `owned`, the listeners of Gateway `gateway`, those of the ListenerSets it
    /// admits, in precedence order, marking each whose certificates cannot be used and each
    /// that conflicts with a listener before it.
    pub(super) fn extend<'a>(
        &'a self,
        gateway: &ObjectKey,
        owned: &mut Vec<OwnedListener<'a>>,
        index: &Index<'_>,
    ) {
        for set in self.sets.iter().filter(|s| s.gateway == *gateway) {
            let Ok(listeners) = &set.listeners else {
                continue;
            };
            for (i, spec) in listeners.iter().enumerate() {
                let mut l = listener::listener(spec, set.generation);
                l.set = Some(Entry {
                    set: set.key.clone(),
                    generation: set.generation,
                });
                // Certificates resolve as a Gateway listener's do, a Secret of another namespace
                // granted to ListenerSets of the set's.
                if let Some((reason, message)) =
                    listener_tls::problem(spec, i, &set.key.namespace, "ListenerSet", index)
                {
                    l.refs_unresolved(reason, message);
                }
                if let Some((reason, message)) = conflict(owned, &l) {
                    l.conflicts(reason, message);
                }
                owned.push(l);
            }
        }
    }

    /// Each ListenerSet's status, and for each Gateway how many of its ListenerSets are
    /// accepted (`attachedListenerSets`). Read once routes are counted on the listeners:
    /// `gateway` gives each of our Gateways' acceptance and listeners, by key.
    pub(super) fn statuses<'g>(
        &self,
        gateway: impl Fn(&ObjectKey) -> Option<(bool, &'g [OwnedListener<'g>])>,
    ) -> (
        BTreeMap<ObjectKey, ListenerSetStatus>,
        BTreeMap<ObjectKey, i32>,
    ) {
        let mut statuses = BTreeMap::new();
        let mut attached: BTreeMap<ObjectKey, i32> = BTreeMap::new();
        for set in &self.sets {
            let Some((gateway_accepted, gateway_listeners)) = gateway(&set.gateway) else {
                continue;
            };
            let listeners: Vec<&OwnedListener<'_>> = match &set.listeners {
                Ok(_) => gateway_listeners
                    .iter()
                    .filter(|l| l.set.as_ref().is_some_and(|e| e.set == set.key))
                    .collect(),
                Err(_) => Vec::new(),
            };
            let refused = match &set.listeners {
                Err(refused) => Some(refused.clone()),
                Ok(_) if !gateway_accepted => Some((
                    Reason::ParentNotAccepted,
                    format!("Gateway {} is not accepted", set.gateway),
                )),
                Ok(_) if listeners.iter().all(|l| !l.usable) => {
                    Some((Reason::ListenersNotValid, "no listener is valid".to_owned()))
                }
                Ok(_) => None,
            };
            let generation = set.generation;
            let conditions = match refused {
                Some((reason, message)) => vec![
                    Condition::new(
                        ConditionType::Accepted,
                        false,
                        reason,
                        message.clone(),
                        generation,
                    ),
                    Condition::new(
                        ConditionType::Programmed,
                        false,
                        reason,
                        message,
                        generation,
                    ),
                ],
                None => {
                    *attached.entry(set.gateway.clone()).or_default() += 1;
                    let invalid: Vec<&str> = listeners
                        .iter()
                        .filter(|l| !l.usable)
                        .map(|l| l.name)
                        .collect();
                    let (reason, message) = if invalid.is_empty() {
                        (Reason::Accepted, String::new())
                    } else {
                        (
                            Reason::ListenersNotValid,
                            format!("listeners not valid: {}", invalid.join(", ")),
                        )
                    };
                    vec![
                        Condition::new(ConditionType::Accepted, true, reason, message, generation),
                        Condition::new(
                            ConditionType::Programmed,
                            true,
                            Reason::Programmed,
                            "",
                            generation,
                        ),
                    ]
                }
            };
            statuses.insert(
                set.key.clone(),
                ListenerSetStatus {
                    gateway: set.gateway.clone(),
                    conditions,
                    listeners: listeners.iter().map(|l| l.status()).collect(),
                },
            );
        }
        for orphan in &self.orphaned {
            let message = format!("Gateway {} does not exist", orphan.gateway);
            let conditions = [ConditionType::Accepted, ConditionType::Programmed]
                .into_iter()
                .map(|kind| {
                    Condition::new(
                        kind,
                        false,
                        Reason::ParentNotAccepted,
                        message.clone(),
                        orphan.generation,
                    )
                })
                .collect();
            statuses.insert(
                orphan.key.clone(),
                ListenerSetStatus {
                    gateway: orphan.gateway.clone(),
                    conditions,
                    listeners: Vec::new(),
                },
            );
        }
        (statuses, attached)
    }
}

/// Whether `set`'s status says it is accepted.
fn still_accepted(set: &ListenerSet) -> bool {
    set.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c.type_ == "Accepted" && c.status == "True")
        })
}

/// Whether a Gateway `namespace/name` exists, of whatever class, read or not.
fn exists(snapshot: &Snapshot, namespace: &str, name: &str) -> bool {
    snapshot.gateways.iter().any(|gw| {
        gw.metadata.namespace.as_deref() == Some(namespace)
            && gw.metadata.name.as_deref() == Some(name)
    }) || snapshot
        .unreadable_gateways
        .iter()
        .any(|gw| gw.namespace == namespace && gw.name == name)
}

/// Whether Gateway `gw` (in `gateway_namespace`) admits ListenerSets of `namespace`.
fn admits(
    gw: &Gateway,
    gateway_namespace: &str,
    namespace: &str,
    index: &Index<'_>,
) -> Result<(), (Reason, String)> {
    let allowed = gw
        .spec
        .allowed_listeners
        .as_ref()
        .and_then(|a| a.namespaces.as_ref());
    let from = allowed.and_then(|a| a.from.as_ref());
    let admitted = match from {
        None | Some(GatewayAllowedListenersNamespacesFrom::None) => false,
        Some(GatewayAllowedListenersNamespacesFrom::All) => true,
        Some(GatewayAllowedListenersNamespacesFrom::Same) => gateway_namespace == namespace,
        Some(GatewayAllowedListenersNamespacesFrom::Selector) => allowed
            .and_then(|a| a.selector.as_ref())
            .and_then(|sel| {
                serde_json::to_value(sel).ok().and_then(|v| {
                    serde_json::from_value::<GatewayListenersAllowedRoutesNamespacesSelector>(v)
                        .ok()
                })
            })
            .is_some_and(|sel| selector_matches(&sel, index.namespace_labels(namespace))),
    };
    if admitted {
        return Ok(());
    }
    let why = match from {
        None | Some(GatewayAllowedListenersNamespacesFrom::None) => {
            "its spec.allowedListeners admits no ListenerSet".to_owned()
        }
        Some(GatewayAllowedListenersNamespacesFrom::Same) => {
            format!("its spec.allowedListeners admits ListenerSets of namespace {gateway_namespace} only")
        }
        _ => format!("its spec.allowedListeners does not admit namespace {namespace}"),
    };
    Err((Reason::NotAllowed, why))
}

/// The ListenerSet's listeners as a Gateway's, whose fields they share.
fn as_gateway_listeners(set: &ListenerSet) -> Result<Vec<GatewayListeners>, (Reason, String)> {
    serde_json::to_value(&set.spec.listeners)
        .and_then(serde_json::from_value)
        .map_err(|e| (Reason::Invalid, format!("spec.listeners: {e}")))
}

/// Why listener `l` of a ListenerSet conflicts with one before it in its Gateway's list, if it
/// does: the same port and either the same hostname or another protocol; or, on another port,
/// the same scheme and hostname as a listener written elsewhere (the Gateway or another
/// ListenerSet): behind a tunnel ports do not tell listeners apart, and the set's routes would
/// take requests that listener's `allowedRoutes` keeps to others. ListenerSet listeners that
/// serve nothing (already conflicted, or invalid: a missing certificate) do not count, so a
/// later set's listener can hold the hostname until the earlier one is mended and then
/// conflicts. Across ports, a Gateway listener of a
/// protocol we serve conflicts whatever its state (a missing certificate, a conflict of its
/// own): its hostname stays its own, rather than going to the set while it is broken and
/// coming back from under the set's routes once it is mended; one of a protocol we do not
/// serve (TLS, TCP) takes no request and conflicts with nothing there. The set's listener
/// must itself be usable, so that one that serves nothing is told why instead.
fn conflict(before: &[OwnedListener<'_>], l: &OwnedListener<'_>) -> Option<(Reason, String)> {
    before
        .iter()
        .filter(|b| b.set.is_none() || b.usable)
        .find_map(|b| {
            let owner = match &b.set {
                None => "of the Gateway".to_owned(),
                Some(entry) => format!("of ListenerSet {}", entry.set),
            };
            if b.port != l.port {
                let same = (b.set.is_some() || super::listener::served_protocol(b.protocol))
                    && l.usable
                    && b.scheme == l.scheme
                    && b.hostname == l.hostname
                    && b.set.as_ref().map(|e| &e.set) != l.set.as_ref().map(|e| &e.set);
                return same.then(|| {
                    let what = l.serves();
                    (
                        Reason::HostnameConflict,
                        format!(
                            "listener {} {owner} serves {what} on port {}; ports do not tell listeners apart behind a tunnel",
                            b.name, b.port
                        ),
                    )
                });
            }
            if b.protocol != l.protocol {
                Some((
                    Reason::ProtocolConflict,
                    format!(
                        "listener {} {owner} uses port {} with protocol {}",
                        b.name, b.port, b.protocol
                    ),
                ))
            } else if b.hostname == l.hostname {
                Some((
                    Reason::HostnameConflict,
                    format!(
                        "listener {} {owner} uses the same port and hostname",
                        b.name
                    ),
                ))
            } else {
                None
            }
        })
}
