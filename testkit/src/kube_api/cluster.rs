//! The cluster's state as every request handler shares it: the objects ([`Store`]) behind one
//! lock, the signal that wakes the watches on each write, and which Gateway API CRDs are
//! installed.

use std::sync::{Mutex, MutexGuard};

use serde_json::Value;
use tokio::sync::watch;

use super::served::{GatewayApiCrds, Installed};
use super::store::{Event, Key, Store};

pub(super) struct Cluster {
    store: Mutex<Store>,
    /// The resourceVersion of the last write; also sent when the CRDs change.
    changed: watch::Sender<u64>,
    crds: Mutex<Installed>,
}

impl Cluster {
    pub(super) fn new() -> Self {
        Self {
            store: Mutex::new(Store::default()),
            changed: watch::channel(0).0,
            crds: Mutex::new(Installed::default()),
        }
    }

    /// The objects, locked: a handler reads, decides and writes under one lock, so each
    /// request sees and changes one consistent state.
    pub(super) fn lock(&self) -> MutexGuard<'_, Store> {
        self.store.lock().expect("the store's lock")
    }

    /// [`Store::record`], then wakes the watches.
    pub(super) fn write(&self, store: &mut Store, key: Key, object: Value, event: Event) -> Value {
        let stored = store.record(key, object, event);
        self.changed.send_replace(store.resource_version());
        stored
    }

    /// Woken on every write and every change of the CRDs.
    pub(super) fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    pub(super) fn crds(&self) -> Installed {
        self.crds.lock().expect("the CRDs' lock").clone()
    }

    /// Installs `crds`, and wakes the watches: those of a version no longer served end.
    pub(super) fn set_crds(&self, crds: GatewayApiCrds) {
        self.crds.lock().expect("the CRDs' lock").gateway_api = crds;
        self.changed.send_modify(|_| {});
    }

    /// Serves the resource of CRD `name` at `versions` (none: not at all), and wakes the
    /// watches: those of a version no longer served end.
    pub(super) fn set_crd(&self, name: &str, versions: Vec<String>) {
        self.crds
            .lock()
            .expect("the CRDs' lock")
            .set_crd(name, versions);
        self.changed.send_modify(|_| {});
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_write_and_a_change_of_crds_wake_the_watches() {
        let cluster = Cluster::new();
        let mut woken = cluster.subscribe();
        assert!(!woken.has_changed().expect("the sender lives"));

        let key = ("".into(), "secrets".into(), "ns".into(), "a".into());
        let mut store = cluster.lock();
        cluster.write(&mut store, key, json!({"metadata": {}}), Event::Added);
        drop(store);
        assert!(woken.has_changed().expect("the sender lives"));
        assert_eq!(*woken.borrow_and_update(), 1);

        cluster.set_crds(GatewayApiCrds::V1_4);
        assert!(woken.has_changed().expect("the sender lives"));
        assert_eq!(cluster.crds(), GatewayApiCrds::V1_4.into());
    }
}
