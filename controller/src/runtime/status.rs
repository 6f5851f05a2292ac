//! Status documents as the API server stores them, built from the translation's conditions.
//!
//! Pure: given the status an object has now, each function returns the status it should have,
//! keeping `lastTransitionTime` of every condition whose status did not change, so an unchanged
//! object compares equal and is not written.

use gateway_api::experimental::listenersets::ListenerSetListeners;
use serde_json::{json, Map, Value};

use crate::translate::{
    Condition, GatewayStatus, ListenerSetStatus, ListenerStatus, ParentRef, PolicyAncestorStatus,
    RouteParentStatus, GATEWAY_API_GROUP, GATEWAY_CONFIG_GROUP,
};

/// A condition's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Truth {
    True,
    False,
    Unknown,
}

impl Truth {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::True => "True",
            Self::False => "False",
            Self::Unknown => "Unknown",
        }
    }
}

impl From<bool> for Truth {
    fn from(b: bool) -> Self {
        if b {
            Self::True
        } else {
            Self::False
        }
    }
}

/// A condition in `metav1.Condition` form, for conditions the translation does not compute.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeCondition {
    pub kind: String,
    pub status: Truth,
    pub reason: String,
    pub message: String,
    pub observed_generation: Option<i64>,
}

impl From<&Condition> for KubeCondition {
    fn from(c: &Condition) -> Self {
        Self {
            kind: c.kind.as_str().to_owned(),
            status: c.status.into(),
            reason: c.reason.as_str().to_owned(),
            message: c.message.clone(),
            observed_generation: c.observed_generation,
        }
    }
}

/// The `conditions` list: each condition keeps the `lastTransitionTime` it had when its status
/// is unchanged, else gets `now` (RFC 3339).
///
/// Conditions other controllers keep on the object (domain-prefixed types of another domain,
/// as a policy controller's `example.com/PolicyAffected`) stay where they are: a merge patch
/// replaces the whole list, and dropping theirs would start a write loop with them. Ours are
/// updated in place, new ones appended, and ours no longer wanted removed; theirs give way to
/// ours past the eight conditions a list takes (see [`within_cap`]).
pub fn conditions(desired: &[KubeCondition], existing: Option<&Value>, now: &str) -> Value {
    let render = |c: &KubeCondition, previous: Option<&Value>| {
        let status = c.status.as_str();
        let since = previous
            .filter(|p| p.get("status").and_then(Value::as_str) == Some(status))
            .and_then(|p| p.get("lastTransitionTime").cloned())
            .unwrap_or_else(|| Value::String(now.to_owned()));
        let mut out = Map::new();
        out.insert("type".into(), c.kind.clone().into());
        out.insert("status".into(), status.into());
        out.insert("reason".into(), c.reason.clone().into());
        out.insert("message".into(), c.message.clone().into());
        if let Some(g) = c.observed_generation {
            out.insert("observedGeneration".into(), g.into());
        }
        out.insert("lastTransitionTime".into(), since);
        Value::Object(out)
    };
    let mut placed = vec![false; desired.len()];
    let mut out = Vec::with_capacity(desired.len());
    for e in existing.and_then(Value::as_array).into_iter().flatten() {
        let kind = e.get("type").and_then(Value::as_str).unwrap_or_default();
        match desired.iter().position(|c| c.kind == kind) {
            Some(i) if !placed[i] => {
                placed[i] = true;
                out.push(render(&desired[i], Some(e)));
            }
            Some(_) => {}
            None if !is_ours(kind) => out.push(e.clone()),
            None => {}
        }
    }
    for (c, _) in desired.iter().zip(&placed).filter(|(_, placed)| !**placed) {
        out.push(render(c, None));
    }
    within_cap(Value::Array(out))
}

/// Whether a condition type is this controller's to write: Gateway API's own types (no domain
/// prefix: on an object we manage, only we set them) and our domain's.
fn is_ours(kind: &str) -> bool {
    kind.split_once('/')
        .is_none_or(|(domain, _)| domain == GATEWAY_CONFIG_GROUP)
}

/// A Gateway's status: its conditions (as given, so the caller can gate `Programmed`), its
/// listeners, and its addresses (`Hostname` entries).
pub fn gateway(
    desired: &GatewayStatus,
    gateway_conditions: &[KubeCondition],
    addresses: &[String],
    existing: Option<&Value>,
    now: &str,
) -> Value {
    let pending = gateway_conditions
        .iter()
        .find(|c| c.kind == "Programmed" && c.status == Truth::False && c.reason == "Pending")
        .map(|c| c.message.clone());
    let listeners = listener_statuses(&desired.listeners, pending.as_deref(), existing, now);
    let mut out = Map::new();
    out.insert(
        "conditions".into(),
        conditions(
            gateway_conditions,
            existing.and_then(|s| s.get("conditions")),
            now,
        ),
    );
    out.insert("listeners".into(), Value::Array(listeners));
    out.insert(
        "attachedListenerSets".into(),
        desired.attached_listener_sets.into(),
    );
    // `null` removes addresses a merge patch would otherwise keep from an earlier write.
    out.insert(
        "addresses".into(),
        if addresses.is_empty() {
            Value::Null
        } else {
            Value::Array(
                addresses
                    .iter()
                    .map(|a| json!({"type": "Hostname", "value": a}))
                    .collect(),
            )
        },
    );
    Value::Object(out)
}

/// The `listeners` of a Gateway's or ListenerSet's status; `pending`, when set, is why the
/// Gateway is not programmed yet: a listener is programmed no sooner than its Gateway.
fn listener_statuses(
    desired: &[ListenerStatus],
    pending: Option<&str>,
    existing: Option<&Value>,
    now: &str,
) -> Vec<Value> {
    let existing_listener = |name: &str| {
        existing
            .and_then(|s| s.get("listeners"))
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .find(|l| l.get("name").and_then(Value::as_str) == Some(name))
    };
    desired
        .iter()
        .map(|l| {
            let mut kinds: Vec<KubeCondition> =
                l.conditions.iter().map(KubeCondition::from).collect();
            if let Some(pending) = pending {
                set_programmed_pending(&mut kinds, pending);
            }
            json!({
                "name": l.name,
                "attachedRoutes": l.attached_routes,
                "supportedKinds": l.supported_kinds.iter().map(|k| json!({"group": GATEWAY_API_GROUP, "kind": k})).collect::<Vec<_>>(),
                "conditions": conditions(&kinds, existing_listener(&l.name).and_then(|e| e.get("conditions")), now),
            })
        })
        .collect()
}

/// A ListenerSet's status: its conditions and its listeners'. `pending`, when set, is why its
/// Gateway is not programmed yet: neither are the ListenerSet and its listeners.
pub fn listener_set(
    desired: &ListenerSetStatus,
    pending: Option<&str>,
    existing: Option<&Value>,
    now: &str,
) -> Value {
    let mut own: Vec<KubeCondition> = desired.conditions.iter().map(KubeCondition::from).collect();
    if let Some(pending) = pending {
        set_programmed_pending(&mut own, pending);
    }
    json!({
        "conditions": conditions(&own, existing.and_then(|s| s.get("conditions")), now),
        "listeners": listener_statuses(&desired.listeners, pending, existing, now),
    })
}

/// Adds to each listener of a ListenerSet status the `port` of the listener of that name.
pub fn add_listener_ports(status: &mut Value, listeners: &[ListenerSetListeners]) {
    let entries = status
        .get_mut("listeners")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten();
    for entry in entries {
        let port = listeners
            .iter()
            .find(|l| entry.get("name").and_then(Value::as_str) == Some(l.name.as_str()))
            .map(|l| l.port);
        if let (Some(port), Some(entry)) = (port, entry.as_object_mut()) {
            entry.insert("port".into(), port.into());
        }
    }
}

/// A route's status. Other controllers' parents stay where they are, untouched; ours are
/// updated in place, dropped when no longer ours, and new ones appended, so two controllers
/// writing one route never reorder each other's entries. `adjust` may change the conditions
/// of one of our parents (by index in `ours`).
pub fn route(
    ours: &[RouteParentStatus],
    adjust: &dyn Fn(usize, &mut Vec<KubeCondition>),
    controller_name: &str,
    existing: Option<&Value>,
    now: &str,
) -> Value {
    let desired = ours
        .iter()
        .enumerate()
        .map(|(i, parent)| {
            let mut wanted: Vec<KubeCondition> =
                parent.conditions.iter().map(KubeCondition::from).collect();
            adjust(i, &mut wanted);
            (gateway_ref(&parent.parent_ref), wanted)
        })
        .collect();
    owned_entries(
        "parents",
        "parentRef",
        MAX_PARENTS,
        desired,
        controller_name,
        existing,
        now,
    )
}

/// The status of a route this build cannot read: each of our parents in its `existing`
/// status `Accepted=False` (`UnsupportedValue`, `message`) at `generation`, keeping its other
/// Gateway API conditions as they were; other controllers' parents untouched. `None` when no
/// parent is ours.
pub fn unreadable_route(
    existing: Option<&Value>,
    controller_name: &str,
    generation: Option<i64>,
    message: &str,
    now: &str,
) -> Option<Value> {
    let parents = existing?.get("parents")?.as_array()?;
    let is_ours = |p: &Value| written_by(p, controller_name);
    if !parents.iter().any(is_ours) {
        return None;
    }
    let refused = KubeCondition {
        kind: "Accepted".to_owned(),
        status: Truth::False,
        reason: "UnsupportedValue".to_owned(),
        message: message.to_owned(),
        observed_generation: generation,
    };
    let parents = parents
        .iter()
        .map(|p| {
            if !is_ours(p) {
                return p.clone();
            }
            let previous = p.get("conditions");
            // Gateway API's other conditions (`ResolvedRefs`) stay as last judged; ours
            // (`cf.k8s.lex.la/...`) are about serving, which no longer happens.
            let mut wanted = vec![refused.clone()];
            wanted.extend(
                previous
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(kube_condition)
                    .filter(|c| c.kind != "Accepted" && !c.kind.contains('/')),
            );
            let mut entry = p.clone();
            if let Some(entry) = entry.as_object_mut() {
                entry.insert("conditions".into(), conditions(&wanted, previous, now));
            }
            entry
        })
        .collect();
    Some(json!({ "parents": Value::Array(parents) }))
}

/// A condition as the API server holds it, read back.
fn kube_condition(c: &Value) -> Option<KubeCondition> {
    let text = |key: &str| c.get(key).and_then(Value::as_str);
    Some(KubeCondition {
        kind: text("type")?.to_owned(),
        status: match text("status")? {
            "True" => Truth::True,
            "False" => Truth::False,
            _ => Truth::Unknown,
        },
        reason: text("reason").unwrap_or_default().to_owned(),
        message: text("message").unwrap_or_default().to_owned(),
        observed_generation: c.get("observedGeneration").and_then(Value::as_i64),
    })
}

/// A policy's status (Gateway API `PolicyStatus`): its `ancestors`, ours kept apart from other
/// controllers' as [`route`] keeps parents.
pub fn policy(
    ours: &[PolicyAncestorStatus],
    controller_name: &str,
    existing: Option<&Value>,
    now: &str,
) -> Value {
    let desired = ours
        .iter()
        .map(|a| {
            (
                gateway_ref(&a.ancestor_ref),
                a.conditions.iter().map(KubeCondition::from).collect(),
            )
        })
        .collect();
    owned_entries(
        "ancestors",
        "ancestorRef",
        MAX_ANCESTORS,
        desired,
        controller_name,
        existing,
        now,
    )
}

/// A reference to a Gateway or ListenerSet as route parents and policy ancestors spell it.
fn gateway_ref(r: &ParentRef) -> Value {
    let mut parent_ref = Map::new();
    parent_ref.insert("group".into(), r.kind.group().into());
    parent_ref.insert("kind".into(), r.kind.as_str().into());
    parent_ref.insert("namespace".into(), r.namespace.clone().into());
    parent_ref.insert("name".into(), r.name.clone().into());
    if let Some(section) = &r.section_name {
        parent_ref.insert("sectionName".into(), section.clone().into());
    }
    if let Some(port) = r.port {
        parent_ref.insert("port".into(), port.into());
    }
    Value::Object(parent_ref)
}

/// The most entries a policy's `status.ancestors` takes (the CRD's `maxItems`).
const MAX_ANCESTORS: usize = 16;
/// The most entries a route's `status.parents` takes (the CRD's `maxItems`).
const MAX_PARENTS: usize = 32;
/// The most conditions a list of them takes: a Gateway's, a listener's, a GatewayClass's, a
/// route parent's or a policy ancestor's (the Gateway API CRDs' `maxItems`).
const MAX_CONDITIONS: usize = 8;

/// `conditions` (a list) cut to [`MAX_CONDITIONS`]: past it the API server refuses the
/// whole write, at every round. Ours all stay, so what this controller judges is said;
/// other controllers' kept on our entry go, the last first, until the list fits.
fn within_cap(mut conditions: Value) -> Value {
    if let Value::Array(list) = &mut conditions {
        let over = list.len().saturating_sub(MAX_CONDITIONS);
        let dropped: Vec<usize> = list
            .iter()
            .enumerate()
            .rev()
            .filter(|(_, c)| !is_ours(c.get("type").and_then(Value::as_str).unwrap_or_default()))
            .map(|(at, _)| at)
            .take(over)
            .collect();
        let mut at = 0;
        list.retain(|_| {
            at += 1;
            !dropped.contains(&(at - 1))
        });
    }
    conditions
}

/// The `list` of a status whose entries each name a Gateway under `reference` and carry a
/// `controllerName`: other controllers' entries stay where they are; ours are updated in
/// place, dropped when not `desired`, and new ones appended while the list has room for them
/// (`max`, past which the API server refuses the whole write: Gateway API asks that no entry
/// be added to a full list).
fn owned_entries(
    list: &str,
    reference: &str,
    max: usize,
    desired: Vec<(Value, Vec<KubeCondition>)>,
    controller_name: &str,
    existing: Option<&Value>,
    now: &str,
) -> Value {
    let existing_entries: Vec<&Value> = existing
        .and_then(|s| s.get(list))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .collect();
    let is_ours = |p: &Value| written_by(p, controller_name);
    let mut desired: Vec<Option<Value>> = desired
        .into_iter()
        .map(|(target, wanted)| {
            let previous = existing_entries
                .iter()
                .find(|p| is_ours(p) && same_ref(p.get(reference), &target));
            let mut entry = Map::new();
            entry.insert(reference.into(), target);
            entry.insert("controllerName".into(), controller_name.into());
            entry.insert(
                "conditions".into(),
                conditions(&wanted, previous.and_then(|p| p.get("conditions")), now),
            );
            Some(Value::Object(entry))
        })
        .collect();
    let mut entries = Vec::with_capacity(existing_entries.len().max(desired.len()));
    for p in &existing_entries {
        if !is_ours(p) {
            entries.push((*p).clone());
            continue;
        }
        let replacement = desired.iter_mut().find(|d| {
            d.as_ref()
                .is_some_and(|d| same_ref(p.get(reference), &d[reference]))
        });
        if let Some(slot) = replacement {
            entries.extend(slot.take());
        }
    }
    let room = max.saturating_sub(entries.len());
    entries.extend(desired.into_iter().flatten().take(room));
    let mut out = Map::new();
    out.insert(list.into(), Value::Array(entries));
    Value::Object(out)
}

/// Whether a route parent's or policy ancestor's status entry is `controller_name`'s.
pub fn written_by(entry: &Value, controller_name: &str) -> bool {
    entry.get("controllerName").and_then(Value::as_str) == Some(controller_name)
}

/// The conditions a route's `existing` status has `controller_name` saying for `parent`.
fn conditions_before<'a>(
    existing: Option<&'a Value>,
    controller_name: &'a str,
    parent: &ParentRef,
) -> impl Iterator<Item = &'a Value> + 'a {
    let wanted = gateway_ref(parent);
    existing
        .and_then(|s| s.get("parents"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(move |p| written_by(p, controller_name) && same_ref(p.get("parentRef"), &wanted))
        .filter_map(|p| p.get("conditions").and_then(Value::as_array))
        .flatten()
}

/// Whether a route's `existing` status has `controller_name` saying `Accepted=True` for
/// `parent`.
pub fn accepted_before(
    existing: Option<&Value>,
    controller_name: &str,
    parent: &ParentRef,
) -> bool {
    conditions_before(existing, controller_name, parent)
        .any(|c| c["type"] == "Accepted" && c["status"] == "True")
}

/// The condition `kind` a route's `existing` status has `controller_name` saying for one of
/// `parents` (the first found): what an earlier leader told the route's owner, which a new one
/// need not tell again.
pub fn condition_before<'a, 'p>(
    existing: Option<&'a Value>,
    controller_name: &'a str,
    parents: impl IntoIterator<Item = &'p ParentRef>,
    kind: &str,
) -> Option<&'a Value> {
    parents.into_iter().find_map(|parent| {
        conditions_before(existing, controller_name, parent).find(|c| c["type"] == kind)
    })
}

/// Parent references are equal when the fields that identify them are (the API server fills
/// in `group` and `kind` defaults, so they may be absent on one side).
fn same_ref(a: Option<&Value>, b: &Value) -> bool {
    let Some(a) = a else { return false };
    let field = |v: &Value, k: &str, default: &str| {
        v.get(k)
            .map(|x| x.to_string())
            .unwrap_or_else(|| json!(default).to_string())
    };
    ["namespace", "name", "sectionName", "port"]
        .iter()
        .all(|k| field(a, k, "") == field(b, k, ""))
        && field(a, "group", GATEWAY_API_GROUP) == field(b, "group", GATEWAY_API_GROUP)
        && field(a, "kind", "Gateway") == field(b, "kind", "Gateway")
}

/// Replaces a `Programmed` condition that is `True` with `False` (`Pending`).
pub fn set_programmed_pending(conditions: &mut [KubeCondition], message: &str) {
    for c in conditions.iter_mut().filter(|c| c.kind == "Programmed") {
        if c.status == Truth::True {
            c.status = Truth::False;
            c.reason = "Pending".to_owned();
            c.message = message.to_owned();
        }
    }
}

/// A GatewayClass's status: its conditions and `supportedFeatures` (GEP-2162), the feature
/// names in the order given, which must be sorted by name as the spec requires.
pub fn gateway_class(
    desired: &[Condition],
    supported_features: &[&str],
    existing: Option<&Value>,
    now: &str,
) -> Value {
    let wanted: Vec<KubeCondition> = desired.iter().map(KubeCondition::from).collect();
    json!({
        "conditions": conditions(&wanted, existing.and_then(|s| s.get("conditions")), now),
        "supportedFeatures": supported_features.iter().map(|name| json!({"name": name})).collect::<Vec<_>>(),
    })
}

/// A Gateway that names a GatewayConfig, as its status says: its name, and the message of its
/// `Accepted=False` (`InvalidParameters`) condition when the GatewayConfig does not render.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigUser {
    pub gateway: String,
    pub render_error: Option<String>,
}

/// A GatewayConfig's status: the generation observed, `InUse` (which Gateways name it) and
/// `Rendered` (whether their planes render from it; if not, the error their `Accepted`
/// condition carries, as it is when one Gateway or all say the same, else each prefixed with
/// its Gateway). `users` are in the order to name them.
pub fn gateway_config(
    generation: Option<i64>,
    users: &[ConfigUser],
    existing: Option<&Value>,
    now: &str,
) -> Value {
    use crate::gateway_config::{IN_USE_CONDITION, RENDERED_CONDITION};
    let condition = |kind: &str, status: Truth, reason: &str, message: String| KubeCondition {
        kind: kind.to_owned(),
        status,
        reason: reason.to_owned(),
        message,
        observed_generation: generation,
    };
    let named = |users: &[&ConfigUser]| {
        let names: Vec<&str> = users.iter().map(|u| u.gateway.as_str()).collect();
        match names.as_slice() {
            [one] => format!("Gateway {one}"),
            many => format!("Gateways {}", many.join(", ")),
        }
    };
    let all: Vec<&ConfigUser> = users.iter().collect();
    let failing: Vec<&ConfigUser> = users.iter().filter(|u| u.render_error.is_some()).collect();
    let wanted = if users.is_empty() {
        vec![
            condition(
                IN_USE_CONDITION,
                Truth::False,
                "NotReferenced",
                "no Gateway of this controller names it in spec.infrastructure.parametersRef"
                    .to_owned(),
            ),
            condition(
                RENDERED_CONDITION,
                Truth::Unknown,
                "NotReferenced",
                "nothing is rendered from it until a Gateway names it".to_owned(),
            ),
        ]
    } else {
        let in_use = condition(
            IN_USE_CONDITION,
            Truth::True,
            "Referenced",
            format!("used by {}", named(&all)),
        );
        let errors: Vec<&str> = failing
            .iter()
            .filter_map(|u| u.render_error.as_deref())
            .collect();
        let rendered = match errors.as_slice() {
            [] => condition(
                RENDERED_CONDITION,
                Truth::True,
                "Rendered",
                format!("the data plane of {} renders", named(&all)),
            ),
            [first, rest @ ..] if rest.iter().all(|e| e == first) => condition(
                RENDERED_CONDITION,
                Truth::False,
                "InvalidParameters",
                (*first).to_owned(),
            ),
            _ => condition(
                RENDERED_CONDITION,
                Truth::False,
                "InvalidParameters",
                failing
                    .iter()
                    .filter_map(|u| {
                        Some(format!(
                            "Gateway {}: {}",
                            u.gateway,
                            u.render_error.as_ref()?
                        ))
                    })
                    .collect::<Vec<_>>()
                    .join("; "),
            ),
        };
        vec![in_use, rendered]
    };
    json!({
        "observedGeneration": generation,
        "conditions": conditions(&wanted, existing.and_then(|s| s.get("conditions")), now),
    })
}

/// Top-level status fields the cluster's CRDs drop, per kind: a CRD of an older Gateway API
/// release has no `attachedListenerSets` on Gateways (before v1.5) or no `supportedFeatures` on
/// GatewayClasses (standard channel before v1.4), and the API server prunes what its schema
/// lacks. Such a field never reads back, so without this every object of the kind would be
/// written again at every round. A field is tried again after [`Pruned::RETRY`], in case the
/// CRDs were upgraded meanwhile.
#[derive(Debug, Default)]
pub struct Pruned {
    fields: std::collections::HashMap<(String, String), std::time::Instant>,
}

impl Pruned {
    pub const RETRY: std::time::Duration = std::time::Duration::from_secs(3600);

    /// `desired` without the fields of `kind` known to be dropped.
    pub fn strip(&mut self, kind: &str, desired: &mut Value, now: std::time::Instant) {
        if self.fields.is_empty() {
            return;
        }
        self.fields
            .retain(|_, since| now.duration_since(*since) < Self::RETRY);
        if let Value::Object(d) = desired {
            // A handful of entries at most: looked through, not keyed by a new string each.
            d.retain(|field, _| !self.fields.keys().any(|(k, f)| k == kind && f == field));
        }
    }

    /// Learns, from the status a write returned, which fields it sent did not stick; returns
    /// them (to be told once).
    pub fn learn(
        &mut self,
        kind: &str,
        sent: &Value,
        written: Option<&Value>,
        now: std::time::Instant,
    ) -> Vec<String> {
        let Value::Object(sent) = sent else {
            return Vec::new();
        };
        let carries = |v: &Value| match v {
            Value::Null => false,
            Value::Array(a) => !a.is_empty(),
            Value::Object(o) => !o.is_empty(),
            _ => true,
        };
        let mut dropped = Vec::new();
        for (field, value) in sent {
            if carries(value) && written.and_then(|w| w.get(field)).is_none() {
                self.fields.insert((kind.to_owned(), field.clone()), now);
                dropped.push(field.clone());
            }
        }
        dropped
    }
}

/// Whether `existing` already says everything `desired` says (fields only in `existing`, such as
/// other controllers' additions, do not count).
pub fn contains(existing: Option<&Value>, desired: &Value) -> bool {
    match (existing, desired) {
        (Some(Value::Object(e)), Value::Object(d)) => d.iter().all(|(k, v)| contains(e.get(k), v)),
        (Some(Value::Array(e)), Value::Array(d)) => {
            e.len() == d.len() && e.iter().zip(d).all(|(e, d)| contains(Some(e), d))
        }
        (Some(e), d) => e == d,
        // A field the patch removes is already absent.
        (None, Value::Null) => true,
        (None, _) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cond(kind: &str, status: bool, reason: &str) -> KubeCondition {
        KubeCondition {
            kind: kind.to_owned(),
            status: status.into(),
            reason: reason.to_owned(),
            message: String::new(),
            observed_generation: Some(2),
        }
    }

    #[test]
    fn a_condition_keeps_its_transition_time_until_its_status_changes() {
        let first = conditions(&[cond("Accepted", true, "Accepted")], None, "T1");
        assert_eq!(first[0]["lastTransitionTime"], "T1");
        assert_eq!(first[0]["status"], "True");
        assert_eq!(first[0]["observedGeneration"], 2);
        // Same status, another reason: the time stays.
        let second = conditions(&[cond("Accepted", true, "Other")], Some(&first), "T2");
        assert_eq!(second[0]["lastTransitionTime"], "T1");
        assert_eq!(second[0]["reason"], "Other");
        let third = conditions(&[cond("Accepted", false, "Invalid")], Some(&second), "T3");
        assert_eq!(third[0]["lastTransitionTime"], "T3");
    }

    #[test]
    fn other_controllers_conditions_stay_in_place_and_ours_no_longer_wanted_go() {
        let existing = json!([
            {"type": "example.com/PolicyAffected", "status": "True", "reason": "Applied", "message": "", "lastTransitionTime": "T0"},
            {"type": "Accepted", "status": "True", "reason": "Accepted", "message": "", "lastTransitionTime": "T0"},
            {"type": "Conflicted", "status": "True", "reason": "HostnameConflict", "message": "", "lastTransitionTime": "T0"},
            {"type": "cf.k8s.lex.la/TunnelShared", "status": "True", "reason": "Shared", "message": "", "lastTransitionTime": "T0"},
            {"type": "Unprefixed", "status": "True", "reason": "Ours", "message": "", "lastTransitionTime": "T0"},
        ]);
        let out = conditions(
            &[
                cond("Programmed", true, "Programmed"),
                cond("Accepted", true, "Accepted"),
            ],
            Some(&existing),
            "T1",
        );
        let kinds = types(&out);
        assert_eq!(
            kinds,
            ["example.com/PolicyAffected", "Accepted", "Programmed"],
            "{out}"
        );
        assert_eq!(out[0], existing[0], "theirs untouched");
        assert_eq!(out[1]["lastTransitionTime"], "T0");
        assert_eq!(out[2]["lastTransitionTime"], "T1");
        // Written once, it compares equal: nothing to write at the next round.
        let again = conditions(
            &[
                cond("Programmed", true, "Programmed"),
                cond("Accepted", true, "Accepted"),
            ],
            Some(&out),
            "T2",
        );
        assert_eq!(again, out);
    }

    /// The types of a conditions list, in its order.
    fn types(conditions: &Value) -> Vec<&str> {
        conditions
            .as_array()
            .expect("a list")
            .iter()
            .filter_map(|c| c["type"].as_str())
            .collect()
    }

    /// A Gateway's or a listener's conditions, as a route parent's, keep within the eight a
    /// list takes: ours all stay, other controllers' give way, the last first.
    #[test]
    fn other_controllers_conditions_give_way_to_ours_past_eight() {
        let theirs: Vec<Value> = (0..7)
            .map(|i| json!({"type": format!("example.com/Policy{i}"), "status": "True", "reason": "Applied", "message": "", "lastTransitionTime": "T0"}))
            .collect();
        let out = conditions(
            &[
                cond("Accepted", true, "Accepted"),
                cond("Programmed", true, "Programmed"),
            ],
            Some(&Value::Array(theirs)),
            "T1",
        );
        let kinds = types(&out);
        assert_eq!(
            kinds,
            [
                "example.com/Policy0",
                "example.com/Policy1",
                "example.com/Policy2",
                "example.com/Policy3",
                "example.com/Policy4",
                "example.com/Policy5",
                "Accepted",
                "Programmed"
            ],
            "{out}"
        );
    }

    #[test]
    fn a_field_the_crd_drops_is_left_out_until_it_is_tried_again() {
        let mut pruned = Pruned::default();
        let start = std::time::Instant::now();
        let sent = json!({"conditions": [{"type": "Accepted"}], "attachedListenerSets": 0, "addresses": null, "listeners": []});
        let written = json!({"conditions": [{"type": "Accepted"}]});
        assert_eq!(
            pruned.learn("Gateway", &sent, Some(&written), start),
            ["attachedListenerSets"],
            "a null or an empty list says nothing"
        );
        let mut desired = sent.clone();
        pruned.strip("Gateway", &mut desired, start);
        assert!(desired.get("attachedListenerSets").is_none());
        assert!(desired.get("conditions").is_some());
        let mut other = sent.clone();
        pruned.strip("ListenerSet", &mut other, start);
        assert!(other.get("attachedListenerSets").is_some(), "per kind");
        let mut later = sent.clone();
        pruned.strip("Gateway", &mut later, start + Pruned::RETRY);
        assert!(later.get("attachedListenerSets").is_some(), "tried again");
    }

    #[test]
    fn no_ancestor_is_added_to_a_full_list() {
        use crate::translate::{ParentKind, PolicyAncestorStatus};
        let ancestor = |name: String| PolicyAncestorStatus {
            ancestor_ref: ParentRef {
                kind: ParentKind::Gateway,
                namespace: "a".to_owned(),
                name,
                section_name: None,
                port: None,
            },
            conditions: Vec::new(),
        };
        let theirs: Vec<Value> = (0..3)
            .map(|i| json!({"ancestorRef": {"name": format!("t{i}"), "namespace": "a"}, "controllerName": "example.com/other", "conditions": []}))
            .collect();
        let existing = json!({ "ancestors": theirs });
        let ours: Vec<_> = (0..20).map(|i| ancestor(format!("g{i:02}"))).collect();
        let out = policy(&ours, "cf", Some(&existing), "T");
        let list = out["ancestors"].as_array().expect("ancestors");
        assert_eq!(list.len(), MAX_ANCESTORS);
        assert_eq!(list[..3], theirs[..], "theirs kept");
        assert_eq!(list[3]["ancestorRef"]["name"], "g00");
        assert_eq!(list[15]["ancestorRef"]["name"], "g12");
        // The next round finds the list full and changes nothing.
        assert_eq!(policy(&ours, "cf", Some(&out), "T"), out);
    }

    #[test]
    fn a_parent_was_accepted_before_only_if_our_entry_for_it_said_so() {
        use crate::translate::ParentRef;
        let parent = |name: &str, section: Option<&str>| ParentRef {
            kind: crate::translate::ParentKind::Gateway,
            namespace: "a".to_owned(),
            name: name.to_owned(),
            section_name: section.map(str::to_owned),
            port: None,
        };
        let accepted = |status: &str| json!([{"type": "Accepted", "status": status}]);
        let existing = json!({"parents": [
            {"parentRef": {"name": "yes", "namespace": "a"}, "controllerName": "cf", "conditions": accepted("True")},
            {"parentRef": {"name": "unknown", "namespace": "a"}, "controllerName": "cf", "conditions": accepted("Unknown")},
            {"parentRef": {"name": "theirs", "namespace": "a"}, "controllerName": "example.com/other", "conditions": accepted("True")},
        ]});
        let before = |p: &ParentRef| accepted_before(Some(&existing), "cf", p);
        assert!(before(&parent("yes", None)));
        assert!(
            !before(&parent("yes", Some("http"))),
            "another listener's entry"
        );
        assert!(!before(&parent("unknown", None)));
        assert!(
            !before(&parent("theirs", None)),
            "another controller's word"
        );
        assert!(!before(&parent("new", None)));
        assert!(!accepted_before(None, "cf", &parent("yes", None)));
    }

    #[test]
    fn our_parents_are_updated_in_place_between_other_controllers_entries() {
        use crate::translate::{Condition, ConditionType, ParentRef, Reason};
        let ours = |name: &str| RouteParentStatus {
            parent_ref: ParentRef {
                kind: crate::translate::ParentKind::Gateway,
                namespace: "a".to_owned(),
                name: name.to_owned(),
                section_name: None,
                port: None,
            },
            conditions: vec![Condition {
                kind: ConditionType::Accepted,
                status: true,
                reason: Reason::Accepted,
                message: String::new(),
                observed_generation: Some(1),
            }],
        };
        let existing = json!({"parents": [
            {"parentRef": {"name": "mine", "namespace": "a"}, "controllerName": "cf", "conditions": []},
            {"parentRef": {"name": "theirs", "namespace": "a"}, "controllerName": "example.com/other", "conditions": []},
        ]});
        let out = route(
            &[ours("new"), ours("mine")],
            &|_, _| {},
            "cf",
            Some(&existing),
            "T",
        );
        let names: Vec<&str> = out["parents"]
            .as_array()
            .expect("parents")
            .iter()
            .map(|p| p["parentRef"]["name"].as_str().unwrap_or_default())
            .collect();
        assert_eq!(names, ["mine", "theirs", "new"]);
    }

    #[test]
    fn policy_ancestors_keep_other_controllers_entries_and_drop_our_stale_ones() {
        use crate::translate::{Condition, ConditionType, ParentRef, Reason};
        let ours = PolicyAncestorStatus {
            ancestor_ref: ParentRef {
                kind: crate::translate::ParentKind::Gateway,
                namespace: "a".to_owned(),
                name: "gw".to_owned(),
                section_name: None,
                port: None,
            },
            conditions: vec![Condition {
                kind: ConditionType::Accepted,
                status: false,
                reason: Reason::Conflicted,
                message: "m".to_owned(),
                observed_generation: Some(3),
            }],
        };
        let existing = json!({"ancestors": [
            {"ancestorRef": {"name": "gone", "namespace": "a"}, "controllerName": "cf", "conditions": []},
            {"ancestorRef": {"name": "gw", "namespace": "a"}, "controllerName": "example.com/other", "conditions": []},
        ]});
        let out = policy(&[ours], "cf", Some(&existing), "T");
        let ancestors = out["ancestors"].as_array().expect("ancestors");
        assert_eq!(ancestors.len(), 2, "{out}");
        assert_eq!(ancestors[0]["controllerName"], "example.com/other");
        assert_eq!(ancestors[1]["controllerName"], "cf");
        assert_eq!(
            ancestors[1]["ancestorRef"],
            json!({"group": GATEWAY_API_GROUP, "kind": "Gateway", "namespace": "a", "name": "gw"})
        );
        assert_eq!(ancestors[1]["conditions"][0]["reason"], "Conflicted");
        assert_eq!(ancestors[1]["conditions"][0]["observedGeneration"], 3);
        assert_eq!(
            policy(&[], "cf", Some(&existing), "T")["ancestors"]
                .as_array()
                .map(Vec::len),
            Some(1)
        );
    }

    #[test]
    fn route_status_keeps_other_controllers_parents() {
        let existing = json!({"parents": [
            {"parentRef": {"name": "theirs", "namespace": "a"}, "controllerName": "example.com/other", "conditions": []},
            {"parentRef": {"name": "gone", "namespace": "a"}, "controllerName": "cf.k8s.lex.la/tunnel-controller", "conditions": []},
        ]});
        let out = route(
            &[],
            &|_, _| {},
            "cf.k8s.lex.la/tunnel-controller",
            Some(&existing),
            "T",
        );
        let parents = out["parents"].as_array().expect("parents");
        assert_eq!(parents.len(), 1, "our stale parent goes, theirs stays");
        assert_eq!(parents[0]["controllerName"], "example.com/other");
    }

    #[test]
    fn a_gateway_class_status_lists_its_features_as_named_entries() {
        let out = gateway_class(
            &[crate::translate::Condition {
                kind: crate::translate::ConditionType::Accepted,
                status: true,
                reason: crate::translate::Reason::Accepted,
                message: String::new(),
                observed_generation: Some(1),
            }],
            &["Gateway", "HTTPRoute"],
            None,
            "T",
        );
        assert_eq!(
            out["supportedFeatures"],
            json!([{"name": "Gateway"}, {"name": "HTTPRoute"}])
        );
        assert_eq!(out["conditions"][0]["type"], "Accepted");
    }

    #[test]
    fn a_gateway_config_status_names_its_gateways_and_their_render_error() {
        let user = |gateway: &str, error: Option<&str>| ConfigUser {
            gateway: gateway.to_owned(),
            render_error: error.map(str::to_owned),
        };
        let summary = |status: &Value| -> Vec<(String, String, String)> {
            status["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|c| {
                    (
                        format!(
                            "{}={}",
                            c["type"].as_str().unwrap_or_default(),
                            c["status"].as_str().unwrap_or_default()
                        ),
                        c["reason"].as_str().unwrap_or_default().to_owned(),
                        c["message"].as_str().unwrap_or_default().to_owned(),
                    )
                })
                .collect()
        };
        let triple = |a: &str, b: &str, c: &str| (a.to_owned(), b.to_owned(), c.to_owned());

        let unused = gateway_config(Some(4), &[], None, "T1");
        assert_eq!(unused["observedGeneration"], 4);
        assert_eq!(unused["conditions"][0]["observedGeneration"], 4);
        assert_eq!(
            summary(&unused),
            [
                triple(
                    "InUse=False",
                    "NotReferenced",
                    "no Gateway of this controller names it in spec.infrastructure.parametersRef"
                ),
                triple(
                    "Rendered=Unknown",
                    "NotReferenced",
                    "nothing is rendered from it until a Gateway names it"
                ),
            ]
        );

        let used = gateway_config(
            Some(4),
            &[user("a", None), user("b", None)],
            Some(&unused),
            "T2",
        );
        assert_eq!(
            summary(&used),
            [
                triple("InUse=True", "Referenced", "used by Gateways a, b"),
                triple(
                    "Rendered=True",
                    "Rendered",
                    "the data plane of Gateways a, b renders"
                ),
            ]
        );
        assert_eq!(used["conditions"][0]["lastTransitionTime"], "T2");

        // One error, or the same one for all: as the Gateways carry it.
        let broken = gateway_config(
            Some(5),
            &[user("a", Some("no image")), user("b", Some("no image"))],
            Some(&used),
            "T3",
        );
        assert_eq!(
            summary(&broken)[1],
            triple("Rendered=False", "InvalidParameters", "no image")
        );
        assert_eq!(
            broken["conditions"][0]["lastTransitionTime"], "T2",
            "still in use"
        );
        let mixed = gateway_config(
            Some(5),
            &[user("a", None), user("b", Some("x")), user("c", Some("y"))],
            None,
            "T",
        );
        assert_eq!(summary(&mixed)[1].2, "Gateway b: x; Gateway c: y");
    }

    #[test]
    fn contains_ignores_fields_only_the_existing_status_has() {
        let desired = json!({"conditions": [{"type": "A", "status": "True"}]});
        let existing =
            json!({"conditions": [{"type": "A", "status": "True", "extra": 1}], "other": 2});
        assert!(contains(Some(&existing), &desired));
        let changed = json!({"conditions": [{"type": "A", "status": "False"}]});
        assert!(!contains(Some(&existing), &changed));
        assert!(!contains(None, &desired));
        let longer = json!({"conditions": [{"type": "A", "status": "True"}, {"type": "B", "status": "True"}]});
        assert!(!contains(Some(&existing), &longer));
    }
}
