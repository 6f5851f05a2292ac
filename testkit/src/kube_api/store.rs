//! Object storage: every object under its key, one resourceVersion counter across all kinds (a
//! write takes the next one, as etcd's revision), the uids and timestamps a create fills in,
//! and the log of every write that watches replay from a resourceVersion.
//!
//! Simplifications: no garbage collection (deleting an owner leaves its dependents) and the
//! log is never compacted, so a watch from any resourceVersion is served (never 410 Gone).

use std::collections::BTreeMap;

use serde_json::Value;

use super::served::{group_of, plural_of};

/// `(group, plural, namespace, name)`; cluster-scoped objects have an empty namespace.
pub(super) type Key = (String, String, String, String);

/// The key of an object a test names; `None` for a kind the server does not serve.
pub(super) fn key_for(api_version: &str, kind: &str, namespace: &str, name: &str) -> Option<Key> {
    Some((
        group_of(api_version).to_owned(),
        plural_of(kind)?.to_owned(),
        namespace.to_owned(),
        name.to_owned(),
    ))
}

/// The key of a whole object, from its `apiVersion`, `kind` and metadata; `None` for a kind the
/// server does not serve.
pub(super) fn key_of(object: &Value) -> Option<Key> {
    let field = |pointer: &str| object.pointer(pointer).and_then(Value::as_str);
    key_for(
        field("/apiVersion").unwrap_or_default(),
        field("/kind")?,
        field("/metadata/namespace").unwrap_or_default(),
        field("/metadata/name").unwrap_or_default(),
    )
}

/// The type of a watch event, as a write logs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Event {
    Added,
    Modified,
    Deleted,
}

impl Event {
    /// As a watch event's `type` names it.
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
        }
    }
}

/// One write, as the log keeps it for watches.
pub(super) struct Entry {
    pub(super) rv: u64,
    pub(super) group: String,
    pub(super) plural: String,
    pub(super) namespace: String,
    pub(super) event: Event,
    /// The object as written (as it was, for a deletion).
    pub(super) object: Value,
    /// The object before a modification: a label-selected watch sees it leave (DELETED) or
    /// enter (ADDED) its selection.
    pub(super) previous: Option<Value>,
}

impl Entry {
    /// `EVENT plural namespace/name`.
    pub(super) fn describe(&self) -> String {
        let name = self
            .object
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        format!(
            "{} {} {}/{name}",
            self.event.as_str(),
            self.plural,
            self.namespace
        )
    }
}

/// The objects and the log of their writes.
#[derive(Default)]
pub(super) struct Store {
    rv: u64,
    uid: u64,
    objects: BTreeMap<Key, Value>,
    log: Vec<Entry>,
}

impl Store {
    /// The resourceVersion of the last write (0 before any).
    pub(super) fn resource_version(&self) -> u64 {
        self.rv
    }

    pub(super) fn get(&self, key: &Key) -> Option<&Value> {
        self.objects.get(key)
    }

    /// Every object, in key order.
    pub(super) fn objects(&self) -> impl Iterator<Item = (&Key, &Value)> {
        self.objects.iter()
    }

    /// The writes after resourceVersion `rv`, oldest first.
    pub(super) fn writes_since(&self, rv: u64) -> impl Iterator<Item = &Entry> {
        // The log is in resourceVersion order: skip what came before `rv`.
        let start = self.log.partition_point(|e| e.rv <= rv);
        self.log[start..].iter()
    }

    /// Stores `object` under the next resourceVersion (or removes it, for a deletion) and logs
    /// the write; the object as stored.
    pub(super) fn record(&mut self, key: Key, mut object: Value, event: Event) -> Value {
        self.rv += 1;
        let rv = self.rv;
        if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.insert("resourceVersion".into(), rv.to_string().into());
        }
        let previous = if event == Event::Deleted {
            self.objects.remove(&key);
            None
        } else {
            self.objects.insert(key.clone(), object.clone())
        };
        let (group, plural, namespace, _) = key;
        self.log.push(Entry {
            rv,
            group,
            plural,
            namespace,
            event,
            object: object.clone(),
            previous,
        });
        object
    }

    /// Fills in what the API server sets on create: a new uid, the creation time, generation 1
    /// and (for a namespaced object) its namespace.
    pub(super) fn created(&mut self, mut object: Value, namespace: &str) -> Value {
        self.uid += 1;
        let uid = format!("00000000-0000-4000-8000-{:012x}", self.uid);
        if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.insert("uid".into(), uid.into());
            meta.insert("creationTimestamp".into(), "2026-12-01T00:00:00Z".into());
            meta.insert("generation".into(), 1.into());
            if !namespace.is_empty() {
                meta.insert("namespace".into(), namespace.into());
            }
        }
        object
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn secret_key(name: &str) -> Key {
        key_for("v1", "Secret", "ns", name).expect("Secrets are served")
    }

    fn secret(name: &str, value: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "Secret",
               "metadata": {"name": name, "namespace": "ns"}, "data": {"k": value}})
    }

    #[test]
    fn each_write_takes_the_next_resource_version_across_all_objects() {
        let mut store = Store::default();
        assert_eq!(store.resource_version(), 0);
        let a = store.record(secret_key("a"), secret("a", "1"), Event::Added);
        let b = store.record(secret_key("b"), secret("b", "1"), Event::Added);
        assert_eq!(a["metadata"]["resourceVersion"], "1");
        assert_eq!(b["metadata"]["resourceVersion"], "2");
        assert_eq!(store.resource_version(), 2);
        assert_eq!(store.get(&secret_key("a")), Some(&a));
    }

    #[test]
    fn a_modification_logs_the_object_before_and_a_deletion_removes_it() {
        let mut store = Store::default();
        let key = secret_key("a");
        let first = store.record(key.clone(), secret("a", "1"), Event::Added);
        store.record(key.clone(), secret("a", "2"), Event::Modified);
        let gone = store.record(key.clone(), secret("a", "2"), Event::Deleted);
        assert_eq!(store.get(&key), None);
        assert_eq!(gone["metadata"]["resourceVersion"], "3");
        let log: Vec<&Entry> = store.writes_since(0).collect();
        assert_eq!(log[1].previous.as_ref(), Some(&first));
        assert_eq!(log[2].previous, None);
        let described: Vec<String> = log.iter().map(|e| e.describe()).collect();
        assert_eq!(
            described,
            [
                "ADDED secrets ns/a",
                "MODIFIED secrets ns/a",
                "DELETED secrets ns/a"
            ]
        );
    }

    #[test]
    fn writes_since_a_resource_version_are_those_after_it() {
        let mut store = Store::default();
        for name in ["a", "b", "c"] {
            store.record(secret_key(name), secret(name, "1"), Event::Added);
        }
        let after = |rv| store.writes_since(rv).map(|e| e.rv).collect::<Vec<_>>();
        assert_eq!(after(0), [1, 2, 3]);
        assert_eq!(after(2), [3]);
        assert!(after(3).is_empty());
        assert!(after(99).is_empty());
    }

    #[test]
    fn a_create_fills_in_uid_timestamp_generation_and_namespace() {
        let mut store = Store::default();
        let first = store.created(json!({"metadata": {"name": "a"}}), "ns");
        let second = store.created(json!({"metadata": {"name": "b"}}), "");
        assert_eq!(
            first["metadata"],
            json!({"name": "a", "namespace": "ns", "generation": 1,
                   "uid": "00000000-0000-4000-8000-000000000001",
                   "creationTimestamp": "2026-12-01T00:00:00Z"})
        );
        assert_eq!(
            second["metadata"]["uid"],
            "00000000-0000-4000-8000-000000000002"
        );
        assert!(second["metadata"].get("namespace").is_none());
    }

    #[test]
    fn objects_are_keyed_by_group_plural_namespace_and_name() {
        let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment",
                                "metadata": {"name": "web", "namespace": "ns"}});
        assert_eq!(
            key_of(&deployment),
            Some((
                "apps".to_owned(),
                "deployments".to_owned(),
                "ns".to_owned(),
                "web".to_owned()
            ))
        );
        let namespace =
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ns"}});
        assert_eq!(
            key_of(&namespace).map(|k| (k.0, k.2)),
            Some((String::new(), String::new()))
        );
        assert_eq!(key_of(&json!({"apiVersion": "v1", "kind": "Node"})), None);
    }
}
