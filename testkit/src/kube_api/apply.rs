//! Server-side apply's field ownership, at the granularity the controller's objects need:
//! every map is a set of fields, every list and scalar one field. Ownership lives in
//! `metadata.managedFields` in the `FieldsV1` format, so clients read it as they would from a
//! real server.
//!
//! An applier's fields it no longer sends go unless another manager owns them too; another
//! manager's fields with a different value conflict (409) unless the apply is forced, which
//! takes them over; and other writes (create, replace, merge patch, the `scale` subresource)
//! take the fields they change.
//!
//! Simplification: lists are owned whole (a real server merges lists with merge keys item by
//! item; the controller applies whole objects, so its lists are only ever replaced whole).

use std::collections::BTreeSet;

use serde_json::{json, Map, Value};

type Path = Vec<String>;

struct Manager {
    name: String,
    operation: String,
    /// `scale` for a write through that subresource.
    subresource: Option<String>,
    fields: BTreeSet<Path>,
}

/// The fields an object sets: everything but `apiVersion`, `kind`, `status` and the
/// server's metadata; of the metadata, labels, annotations and owner references.
fn fields(object: &Value) -> BTreeSet<Path> {
    let mut out = BTreeSet::new();
    for (k, v) in object.as_object().into_iter().flatten() {
        match k.as_str() {
            "apiVersion" | "kind" | "status" => {}
            "metadata" => {
                for f in ["labels", "annotations"] {
                    for key in v.get(f).and_then(Value::as_object).into_iter().flatten() {
                        out.insert(vec!["metadata".into(), f.into(), key.0.clone()]);
                    }
                }
                if v.get("ownerReferences").is_some() {
                    out.insert(vec!["metadata".into(), "ownerReferences".into()]);
                }
            }
            _ => leaves(v, vec![k.clone()], &mut out),
        }
    }
    out
}

fn leaves(v: &Value, path: Path, out: &mut BTreeSet<Path>) {
    match v.as_object() {
        Some(m) if !m.is_empty() => {
            for (k, child) in m {
                let mut p = path.clone();
                p.push(k.clone());
                leaves(child, p, out);
            }
        }
        _ => {
            out.insert(path);
        }
    }
}

fn get<'a>(object: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(object, |v, k| v.get(k))
}

fn set(object: &mut Value, path: &[String], value: Value) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut at = object;
    for k in parents {
        if !at.is_object() {
            *at = Value::Object(Map::new());
        }
        let Some(map) = at.as_object_mut() else {
            return;
        };
        at = map.entry(k.clone()).or_insert(Value::Object(Map::new()));
    }
    if !at.is_object() {
        *at = Value::Object(Map::new());
    }
    if let Some(map) = at.as_object_mut() {
        map.insert(last.clone(), value);
    }
}

/// Removes a field and the maps that held only it.
fn remove(object: &mut Value, path: &[String]) {
    fn go(at: &mut Value, path: &[String]) -> bool {
        let Some(map) = at.as_object_mut() else {
            return false;
        };
        match path {
            [] => return false,
            [last] => {
                map.remove(last);
            }
            [first, rest @ ..] => {
                if map.get_mut(first).is_some_and(|child| go(child, rest)) {
                    map.remove(first);
                }
            }
        }
        map.is_empty()
    }
    go(object, path);
}

fn read(object: &Value) -> Vec<Manager> {
    fn decode(v: &Value, path: Path, out: &mut BTreeSet<Path>) {
        match v.as_object() {
            Some(m) if !m.is_empty() => {
                for (k, child) in m {
                    if let Some(k) = k.strip_prefix("f:") {
                        let mut p = path.clone();
                        p.push(k.to_owned());
                        decode(child, p, out);
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
            decode(&e["fieldsV1"], Vec::new(), &mut fields);
            Manager {
                name: e["manager"].as_str().unwrap_or_default().to_owned(),
                operation: e["operation"].as_str().unwrap_or_default().to_owned(),
                subresource: e["subresource"].as_str().map(str::to_owned),
                fields,
            }
        })
        .collect()
}

fn write(object: &mut Value, managers: &[Manager]) {
    let api_version = object.get("apiVersion").cloned().unwrap_or(Value::Null);
    let entries: Vec<Value> = managers
        .iter()
        .filter(|m| !m.fields.is_empty())
        .map(|m| {
            let mut tree = json!({});
            for p in &m.fields {
                let keys: Vec<String> = p.iter().map(|k| format!("f:{k}")).collect();
                set(&mut tree, &keys, json!({}));
            }
            let mut entry = json!({
                "manager": m.name,
                "operation": m.operation,
                "apiVersion": api_version,
                "fieldsType": "FieldsV1",
                "fieldsV1": tree,
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
/// manager owns them too.
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
                .map(|p| format!("conflict with \"{}\": .{}", m.name, p.join(".")))
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
    for p in before.difference(&mine) {
        if !managers.iter().any(|m| other(m) && m.fields.contains(p)) {
            remove(object, p);
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
