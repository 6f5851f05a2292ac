//! Server-side apply's field ownership, at the granularity the controller's objects need:
//! every map is a set of fields, the lists the API server merges by key (containers, their
//! env, volumes...) a set of items each a set of fields, and every other list and scalar one
//! field. Ownership lives in `metadata.managedFields` in the `FieldsV1` format, so clients read
//! it as they would from a real server.
//!
//! An applier's fields it no longer sends go unless another manager owns them too; another
//! manager's fields with a different value conflict (409) unless the apply is forced, which
//! takes them over; fields another manager owns that the apply does not send stay, as they do
//! on a real server (a forced apply of an env var's `valueFrom` keeps the `value` someone else
//! set, and validation then refuses the object); and other writes (create, replace, merge
//! patch, the `scale` subresource) take the fields they change.
//!
//! Simplifications: only lists keyed by one string field are merged item by item (container
//! and Service ports, keyed by number and protocol, are atomic here); a label selector and a
//! Service's `spec.selector` are atomic, as their schemas say, told apart by their field names.

use std::collections::BTreeSet;

use serde_json::{json, Map, Value};

/// One step of a field's path: a map key, or the item of a keyed list whose key field (`.0`)
/// holds `.1`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Step {
    Key(String),
    Item(String, String),
}

type Path = Vec<Step>;

struct Manager {
    name: String,
    operation: String,
    /// `scale` for a write through that subresource.
    subresource: Option<String>,
    fields: BTreeSet<Path>,
}

/// The key field of the items of list `field` (`x-kubernetes-list-type: map`), for the keyed
/// lists of the objects the controller writes that have one string key.
fn list_key(field: &str) -> Option<&'static str> {
    match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "env"
        | "volumes"
        | "imagePullSecrets" => Some("name"),
        "volumeMounts" => Some("mountPath"),
        _ => None,
    }
}

/// Whether the map `field` is one field (`x-kubernetes-map-type: atomic`): a label selector
/// (`LabelSelector` is atomic) or a Service's `spec.selector`.
fn atomic_map(field: &str) -> bool {
    matches!(
        field,
        "selector" | "podSelector" | "namespaceSelector" | "labelSelector"
    )
}

/// The key field of `items`, list `field`, when it is merged by key and every item has a
/// distinct one.
fn keyed<'a>(field: &str, items: &'a [Value]) -> Option<(&'static str, Vec<&'a str>)> {
    let key = list_key(field)?;
    let ids: Vec<&str> = items
        .iter()
        .map(|i| i.get(key).and_then(Value::as_str))
        .collect::<Option<_>>()?;
    let distinct: BTreeSet<&str> = ids.iter().copied().collect();
    (distinct.len() == ids.len()).then_some((key, ids))
}

/// The fields an object sets: everything but `apiVersion`, `kind`, `status` and the
/// server's metadata; of the metadata, labels, annotations and owner references.
fn fields(object: &Value) -> BTreeSet<Path> {
    let key = |k: &str| Step::Key(k.to_owned());
    let mut out = BTreeSet::new();
    for (k, v) in object.as_object().into_iter().flatten() {
        match k.as_str() {
            "apiVersion" | "kind" | "status" => {}
            "metadata" => {
                for f in ["labels", "annotations"] {
                    for label in v.get(f).and_then(Value::as_object).into_iter().flatten() {
                        out.insert(vec![key("metadata"), key(f), key(label.0)]);
                    }
                }
                if v.get("ownerReferences").is_some() {
                    out.insert(vec![key("metadata"), key("ownerReferences")]);
                }
            }
            _ => leaves(v, vec![key(k)], &mut out),
        }
    }
    out
}

fn leaves(v: &Value, path: Path, out: &mut BTreeSet<Path>) {
    let field = match path.last() {
        Some(Step::Key(k)) => k.as_str(),
        _ => "",
    };
    match v {
        Value::Object(m) if !m.is_empty() && !atomic_map(field) => {
            for (k, child) in m {
                let mut p = path.clone();
                p.push(Step::Key(k.clone()));
                leaves(child, p, out);
            }
        }
        Value::Array(items) if !items.is_empty() => match keyed(field, items) {
            Some((key, ids)) => {
                for (item, id) in items.iter().zip(ids) {
                    let mut p = path.clone();
                    p.push(Step::Item(key.to_owned(), id.to_owned()));
                    leaves(item, p, out);
                }
            }
            None => {
                out.insert(path);
            }
        },
        _ => {
            out.insert(path);
        }
    }
}

fn is_item(item: &Value, key: &str, id: &str) -> bool {
    item.get(key).and_then(Value::as_str) == Some(id)
}

fn get<'a>(object: &'a Value, path: &[Step]) -> Option<&'a Value> {
    path.iter().try_fold(object, |v, step| match step {
        Step::Key(k) => v.get(k),
        Step::Item(key, id) => v.as_array()?.iter().find(|i| is_item(i, key, id)),
    })
}

/// The value at `step` of `at`, made (with `at` made a map or list) if missing.
fn entry<'a>(at: &'a mut Value, step: &Step) -> &'a mut Value {
    match step {
        Step::Key(k) => {
            if !at.is_object() {
                *at = Value::Object(Map::new());
            }
            // A map: indexing adds the key if missing.
            &mut at[k.as_str()]
        }
        Step::Item(key, id) => {
            if !at.is_array() {
                *at = Value::Array(Vec::new());
            }
            let found = at
                .as_array()
                .and_then(|items| items.iter().position(|i| is_item(i, key, id)));
            let n = match (found, at.as_array_mut()) {
                (Some(n), _) => n,
                (None, Some(items)) => {
                    items.push(json!({ key.as_str(): id }));
                    items.len() - 1
                }
                (None, None) => 0,
            };
            // A list holding item `n`.
            &mut at[n]
        }
    }
}

fn set(object: &mut Value, path: &[Step], value: Value) {
    *path.iter().fold(object, entry) = value;
}

/// Removes a field and the maps and lists that held only it. An item's key field goes with the
/// item, not on its own.
fn remove(object: &mut Value, path: &[Step]) {
    fn empty(v: &Value) -> bool {
        v.as_object().is_some_and(Map::is_empty) || v.as_array().is_some_and(Vec::is_empty)
    }
    fn go(at: &mut Value, path: &[Step]) -> bool {
        match path {
            [] => return false,
            [Step::Key(k)] => {
                if let Some(map) = at.as_object_mut() {
                    map.remove(k);
                }
            }
            [Step::Item(key, id)] => {
                if let Some(items) = at.as_array_mut() {
                    items.retain(|i| !is_item(i, key, id));
                }
            }
            [Step::Item(key, _), Step::Key(k)] if key == k => return false,
            [first, rest @ ..] => {
                let emptied = match first {
                    Step::Key(k) => at.get_mut(k.as_str()).is_some_and(|c| go(c, rest)),
                    Step::Item(key, id) => at
                        .as_array_mut()
                        .and_then(|items| items.iter_mut().find(|i| is_item(i, key, id)))
                        .is_some_and(|c| go(c, rest)),
                };
                if emptied {
                    return go(at, std::slice::from_ref(first));
                }
                return false;
            }
        }
        empty(at)
    }
    go(object, path);
}
/// A step as `FieldsV1` writes it: `f:<key>`, or `k:{"<key field>":"<value>"}`.
fn encode(step: &Step) -> String {
    match step {
        Step::Key(k) => format!("f:{k}"),
        Step::Item(key, id) => format!("k:{}", json!({ key.as_str(): id })),
    }
}

fn decode(key: &str) -> Option<Step> {
    if let Some(k) = key.strip_prefix("f:") {
        return Some(Step::Key(k.to_owned()));
    }
    let item: Map<String, Value> = serde_json::from_str(key.strip_prefix("k:")?).ok()?;
    match item.into_iter().collect::<Vec<_>>().as_slice() {
        [(field, Value::String(id))] => Some(Step::Item(field.clone(), id.clone())),
        _ => None,
    }
}

fn read(object: &Value) -> Vec<Manager> {
    fn paths(v: &Value, path: Path, out: &mut BTreeSet<Path>) {
        match v.as_object() {
            Some(m) if m.keys().any(|k| k != ".") => {
                for (k, child) in m {
                    if let Some(step) = decode(k) {
                        let mut p = path.clone();
                        p.push(step);
                        paths(child, p, out);
                    }
                }
            }
            _ if !path.is_empty() => {
                out.insert(path);
            }
            _ => {}
        }
    }
    let entries = object
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array);
    entries
        .into_iter()
        .flatten()
        .map(|e| {
            let mut fields = BTreeSet::new();
            paths(&e["fieldsV1"], Vec::new(), &mut fields);
            Manager {
                name: e["manager"].as_str().unwrap_or_default().to_owned(),
                operation: e["operation"].as_str().unwrap_or_default().to_owned(),
                subresource: e["subresource"].as_str().map(str::to_owned),
                fields,
            }
        })
        .collect()
}

/// `fields` as a `FieldsV1` tree: an item of a keyed list carries `.` besides its fields.
fn fields_v1(fields: &BTreeSet<Path>) -> Value {
    let mut tree = json!({});
    for path in fields {
        let mut at = &mut tree;
        for step in path {
            if !at.is_object() {
                *at = json!({});
            }
            at = &mut at[encode(step).as_str()];
            if at.is_null() {
                *at = if matches!(step, Step::Item(..)) {
                    json!({".": {}})
                } else {
                    json!({})
                };
            }
        }
    }
    tree
}

fn write(object: &mut Value, managers: &[Manager]) {
    let api_version = object.get("apiVersion").cloned().unwrap_or(Value::Null);
    let entries: Vec<Value> = managers
        .iter()
        .filter(|m| !m.fields.is_empty())
        .map(|m| {
            let mut entry = json!({
                "manager": m.name,
                "operation": m.operation,
                "apiVersion": api_version,
                "fieldsType": "FieldsV1",
                "fieldsV1": fields_v1(&m.fields),
            });
            if let Some(sub) = &m.subresource {
                entry["subresource"] = sub.as_str().into();
            }
            entry
        })
        .collect();
    if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        if entries.is_empty() {
            meta.remove("managedFields");
        } else {
            meta.insert("managedFields".into(), entries.into());
        }
    }
}

/// Server-side apply of `applied` by `manager` onto `object`: fields another manager owns
/// with a different value are a conflict (an error naming them) unless `force` takes them
/// over; fields `manager` applied before and no longer does are removed unless another
/// manager owns them too, and so are items of keyed lists that no manager owns a field of
/// any more. Fields another manager owns that `applied` does not set stay as they are.
pub(super) fn apply(
    object: &mut Value,
    applied: &Value,
    manager: &str,
    force: bool,
) -> Result<(), String> {
    let mut managers = read(object);
    let mine = fields(applied);
    let differs = |p: &Path| get(object, p) != get(applied, p);
    // Managers are told apart by name and operation: the applier's own earlier updates
    // are another manager's fields here, as on a real server.
    let other =
        |m: &Manager| m.name != manager || m.operation != "Apply" || m.subresource.is_some();
    let conflicts: Vec<String> = managers
        .iter()
        .filter(|m| other(m))
        .flat_map(|m| {
            m.fields
                .intersection(&mine)
                .filter(|p| differs(p))
                .map(|p| format!("conflict with \"{}\": .{}", m.name, dotted(p)))
        })
        .collect();
    if !conflicts.is_empty() {
        if !force {
            return Err(format!(
                "Apply failed with {} conflict(s): {}",
                conflicts.len(),
                conflicts.join(", ")
            ));
        }
        let taken: BTreeSet<Path> = mine.iter().filter(|p| differs(p)).cloned().collect();
        for m in managers.iter_mut().filter(|m| other(m)) {
            m.fields.retain(|p| !taken.contains(p));
        }
    }
    let before = managers
        .iter()
        .find(|m| !other(m))
        .map(|m| m.fields.clone())
        .unwrap_or_default();
    let owned = |prefix: &[Step]| {
        mine.iter()
            .chain(managers.iter().filter(|m| other(m)).flat_map(|m| &m.fields))
            .any(|p| p.starts_with(prefix))
    };
    let dropped: Vec<&Path> = before.difference(&mine).filter(|p| !owned(p)).collect();
    for p in &dropped {
        remove(object, p);
    }
    // An item no one owns a field of any more goes, its key with it.
    for p in &dropped {
        for end in (1..=p.len()).rev() {
            let prefix = &p[..end];
            if matches!(prefix.last(), Some(Step::Item(..))) && !owned(prefix) {
                remove(object, prefix);
            }
        }
    }
    for p in &mine {
        if let Some(v) = get(applied, p) {
            set(object, p, v.clone());
        }
    }
    managers.retain(other);
    managers.push(Manager {
        name: manager.to_owned(),
        operation: "Apply".to_owned(),
        subresource: None,
        fields: mine,
    });
    write(object, &managers);
    Ok(())
}

/// A path as a conflict names it: `spec.template.spec.containers[name="proxy"].image`.
fn dotted(path: &[Step]) -> String {
    let mut out = String::new();
    for step in path {
        match step {
            Step::Key(k) if out.is_empty() => out.push_str(k),
            Step::Key(k) => {
                out.push('.');
                out.push_str(k);
            }
            Step::Item(key, id) => out.push_str(&format!("[{key}=\"{id}\"]")),
        }
    }
    out
}
/// Any other write by `manager` (create, replace, merge patch): the fields it changed
/// become its own and no one else's; fields that are gone are no one's.
pub(super) fn update(before: Option<&Value>, after: &mut Value, manager: &str) {
    update_subresource(before, after, manager, None);
}

/// [`update`] through a subresource (`scale`), recorded on the manager's entry.
pub(super) fn update_subresource(
    before: Option<&Value>,
    after: &mut Value,
    manager: &str,
    subresource: Option<&str>,
) {
    let mut managers = before.map(read).unwrap_or_default();
    let changed: BTreeSet<Path> = fields(after)
        .into_iter()
        .filter(|p| before.and_then(|b| get(b, p)) != get(after, p))
        .collect();
    for m in &mut managers {
        m.fields
            .retain(|p| !changed.contains(p) && get(after, p).is_some());
    }
    if !changed.is_empty() {
        match managers.iter_mut().find(|m| {
            m.name == manager && m.operation == "Update" && m.subresource.as_deref() == subresource
        }) {
            Some(m) => m.fields.extend(changed),
            None => managers.push(Manager {
                name: manager.to_owned(),
                operation: "Update".to_owned(),
                subresource: subresource.map(str::to_owned),
                fields: changed,
            }),
        }
    }
    write(after, &managers);
}

#[cfg(test)]
mod tests;
