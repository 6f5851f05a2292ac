//! The parents this installation serves, listed for the chart's hostname-ownership admission
//! policy (`--ownership-parents-configmap`).
//!
//! A ValidatingAdmissionPolicy cannot look up a route's Gateway or its class, so on its own it
//! would judge every HTTPRoute and GRPCRoute of the cluster, those of other Gateway API
//! implementations too. The controller's own rule applies only to parents that are its
//! Gateways (or ListenerSets of them): it writes their keys into a ConfigMap of its namespace,
//! the policy's parameter, and the policy judges only routes that name one of them
//! ([`ADMISSION_PARENTS_EXPRESSION`]).
//!
//! What admission cannot judge is left to the controller, whose rule does not depend on this
//! list: a route stored before its parent became one of ours (or before the list was
//! written) and not changed since, and any route while the ConfigMap is missing (the policy's
//! binding then admits).
//!
//! The runtime writes the list as it writes statuses: in the background, a round waiting for
//! it briefly, and held back for a while after a failure, so a write that hangs or keeps
//! failing (an admission webhook on ConfigMaps) holds up no round. Each write names the
//! resourceVersion watched, so one that lands late cannot put an older list back.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use kube::Client;
use serde_json::{json, Value};

use crate::translate::{ObjectKey, Snapshot, Statuses};

/// The ConfigMap key of the list: one `<Kind>/<namespace>/<name>` a line, each line ended by
/// `\n`; `Kind` is `Gateway` or `ListenerSet` (for either ListenerSet kind, which the
/// controller treats alike).
pub const DATA_KEY: &str = "parents";

/// The API call this makes, as an RBAC rule (the chart holds it to the ConfigMap's name, which
/// it creates): the list's server-side apply, which is also a create when the ConfigMap has
/// been deleted since (the API server authorizes that apply as `create` on the name too).
pub const RBAC: (&str, &str, &[&str]) = ("", "configmaps", &["patch", "create"]);

/// CEL, in the policy's validation: whether the route names a parent of the list in the
/// policy's parameter (`params`, the ConfigMap), as the controller binds parentRefs: group
/// `gateway.networking.k8s.io` (or none) and kind `Gateway` (or none), or kind `ListenerSet`
/// there or `XListenerSet` in `gateway.networking.x-k8s.io`; the namespace is the route's
/// unless the parentRef names one. Names hold neither `/` nor a line break, so a line matches
/// one parent exactly.
pub const ADMISSION_PARENTS_EXPRESSION: &str = "has(object.spec.parentRefs) && \
has(params.data) && has(params.data.parents) && object.spec.parentRefs.exists(p, \
('\\n' + params.data.parents).contains('\\n' + \
(((!has(p.group) || p.group == 'gateway.networking.k8s.io') && (!has(p.kind) || p.kind == 'Gateway')) ? 'Gateway' : \
((((!has(p.group) || p.group == 'gateway.networking.k8s.io') && has(p.kind) && p.kind == 'ListenerSet') || \
(has(p.group) && p.group == 'gateway.networking.x-k8s.io' && has(p.kind) && p.kind == 'XListenerSet')) ? 'ListenerSet' : '-')) + \
'/' + (has(p.namespace) ? p.namespace : request.namespace) + '/' + p.name + '\\n'))";

/// The list for a round's statuses: the Gateways of ours and the ListenerSets attached to
/// them, sorted, so an unchanged set writes nothing.
pub fn parents(statuses: &Statuses) -> String {
    let line = |kind: &str, key: &ObjectKey| format!("{kind}/{}/{}\n", key.namespace, key.name);
    statuses
        .gateways
        .keys()
        .map(|key| line("Gateway", key))
        .chain(
            statuses
                .listener_sets
                .iter()
                // One still marked accepted by a Gateway that is gone is not attached to ours.
                .filter(|(_, set)| statuses.gateways.contains_key(&set.gateway))
                .map(|(key, _)| line("ListenerSet", key)),
        )
        .collect()
}

/// What ConfigMap `configmap` lacks: see [`due`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Due {
    /// The list to write ([`parents`]).
    pub list: String,
    /// The resourceVersion of the ConfigMap as watched; `None` when none is.
    pub resource_version: Option<String>,
}

/// The list for a round's `statuses`, unless ConfigMap `configmap` as watched holds it already.
pub fn due(configmap: &ObjectKey, snapshot: &Snapshot, statuses: &Statuses) -> Option<Due> {
    let list = parents(statuses);
    let live = snapshot.config_maps.iter().find(|c| {
        c.metadata.namespace.as_deref() == Some(configmap.namespace.as_str())
            && c.metadata.name.as_deref() == Some(configmap.name.as_str())
    });
    let listed = live
        .and_then(|c| c.data.as_ref())
        .and_then(|d| d.get(DATA_KEY));
    (listed != Some(&list)).then(|| Due {
        list,
        resource_version: live.and_then(|c| c.metadata.resource_version.clone()),
    })
}

/// Writes `list` into ConfigMap `configmap` by server-side apply, which makes the ConfigMap
/// again if it was deleted; logs how it went. With `resource_version` (the ConfigMap's as
/// watched), the write applies only to that version: a write that lands after a newer one
/// (sent before it, and answered late) is refused rather than putting an older list back.
///
/// # Errors
/// The API server's refusal or failure: routes are judged by the controller alone meanwhile,
/// and the caller tries again after a wait. A conflict (409): the ConfigMap changed since
/// `resource_version`, and the caller writes again at the newer one.
pub async fn write(
    client: Client,
    configmap: ObjectKey,
    list: String,
    resource_version: Option<String>,
) -> Result<(), kube::Error> {
    let api: Api<ConfigMap> = Api::namespaced(client, &configmap.namespace);
    let mut object = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": { "name": configmap.name, "namespace": configmap.namespace },
        "data": { DATA_KEY: list },
    });
    if let Some(version) = resource_version {
        object["metadata"]["resourceVersion"] = Value::String(version);
    }
    match api
        .patch(
            &configmap.name,
            &PatchParams::apply(super::FIELD_MANAGER).force(),
            &Patch::Apply(&object),
        )
        .await
    {
        Ok(_) => {
            tracing::info!(%configmap, "listed this controller's Gateways for hostname-ownership admission");
            Ok(())
        }
        Err(kube::Error::Api(e)) if e.code == 409 => {
            tracing::debug!(%configmap, "the hostname-ownership list changed meanwhile; written again once its newer version is seen");
            Err(kube::Error::Api(e))
        }
        Err(error) => {
            tracing::warn!(%configmap, %error, "the Gateways for hostname-ownership admission could not be listed; routes are judged by the controller alone meanwhile");
            Err(error)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use cftunnel_testkit::kube_api::ApiServer;

    use super::*;
    use crate::translate::{GatewayStatus, ListenerSetStatus};

    /// Writes the list for `statuses` when `snapshot`'s ConfigMap lacks it, as a round does.
    async fn sync(
        client: &Client,
        configmap: &ObjectKey,
        snapshot: &Snapshot,
        statuses: &Statuses,
    ) {
        if let Some(due) = due(configmap, snapshot, statuses) {
            write(
                client.clone(),
                configmap.clone(),
                due.list,
                due.resource_version,
            )
            .await
            .expect("the list is written");
        }
    }

    fn ours(gateways: &[(&str, &str)]) -> Statuses {
        let mut statuses = Statuses::default();
        for (ns, name) in gateways {
            let status = GatewayStatus {
                conditions: Vec::new(),
                listeners: Vec::new(),
                attached_listener_sets: 0,
            };
            statuses.gateways.insert(ObjectKey::new(*ns, *name), status);
        }
        statuses
    }

    /// The ConfigMap as the API server holds it, and as the watch hands it to the next round.
    fn live(api: &ApiServer, key: &ObjectKey) -> (serde_json::Value, Snapshot) {
        let object = api
            .get("v1", "ConfigMap", &key.namespace, &key.name)
            .expect("the ConfigMap");
        let mut snapshot = Snapshot::default();
        let config_map: ConfigMap = serde_json::from_value(object.clone()).expect("a ConfigMap");
        snapshot.config_maps.push(Arc::new(config_map));
        (object, snapshot)
    }

    /// A mock API server holding the list's ConfigMap, empty, and the ConfigMap's key.
    async fn with_empty_list() -> (ApiServer, ObjectKey) {
        let api = ApiServer::builder().rbac(&[RBAC]).start().await;
        let key = ObjectKey::new("cf-system", "cf-hostname-ownership");
        api.put(json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": { "name": key.name, "namespace": key.namespace },
        }));
        (api, key)
    }

    #[tokio::test]
    async fn the_list_is_written_into_the_configmap_only_when_it_changes() {
        let (api, key) = with_empty_list().await;
        let client = api.client();
        // Counts the list's writes, refusing none.
        let patches = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&patches);
        let _counting = api.forbid(move |call| {
            if call.method == "PATCH" && call.kind == "ConfigMap" {
                counted.fetch_add(1, Ordering::Relaxed);
            }
            false
        });

        let (_, before) = live(&api, &key);
        let two = ours(&[("infra", "edge"), ("team-a", "own")]);
        sync(&client, &key, &before, &two).await;
        let (object, snapshot) = live(&api, &key);
        assert_eq!(
            object["data"][DATA_KEY].as_str(),
            Some("Gateway/infra/edge\nGateway/team-a/own\n")
        );

        assert_eq!(patches.load(Ordering::Relaxed), 1);

        // The same list again: not even sent.
        sync(&client, &key, &snapshot, &two).await;
        assert_eq!(patches.load(Ordering::Relaxed), 1);

        // A Gateway gone (or no longer of the class): the list follows.
        sync(&client, &key, &snapshot, &ours(&[("team-a", "own")])).await;
        let (object, _) = live(&api, &key);
        assert_eq!(
            object["data"][DATA_KEY].as_str(),
            Some("Gateway/team-a/own\n")
        );
    }

    /// A write at the resourceVersion watched applies only to that version: one sent before a
    /// newer write and answered after it is refused as a conflict, not an overwrite with the
    /// older list; the caller writes again at the newer version.
    #[tokio::test]
    async fn a_write_at_a_version_the_configmap_moved_past_is_refused_as_a_conflict() {
        let (api, key) = with_empty_list().await;
        let client = api.client();
        let (_, older) = live(&api, &key);
        let older = due(&key, &older, &ours(&[("infra", "edge")])).expect("a list due");
        let (_, newer) = live(&api, &key);
        let newer =
            due(&key, &newer, &ours(&[("infra", "edge"), ("team-a", "own")])).expect("a list due");
        write(
            client.clone(),
            key.clone(),
            newer.list,
            newer.resource_version,
        )
        .await
        .expect("the newer list is written");

        let refused = write(
            client.clone(),
            key.clone(),
            older.list,
            older.resource_version,
        )
        .await
        .expect_err("the older write is refused");
        assert!(
            matches!(&refused, kube::Error::Api(e) if e.code == 409),
            "{refused}"
        );
        let (object, now) = live(&api, &key);
        assert_eq!(
            object["data"][DATA_KEY].as_str(),
            Some("Gateway/infra/edge\nGateway/team-a/own\n"),
            "the newer list stays"
        );
        let again = due(&key, &now, &ours(&[("infra", "edge")])).expect("a list due");
        write(client, key.clone(), again.list, again.resource_version)
            .await
            .expect("written at the newer version");
        let (object, _) = live(&api, &key);
        assert_eq!(
            object["data"][DATA_KEY].as_str(),
            Some("Gateway/infra/edge\n")
        );
    }

    /// A ConfigMap deleted after install is made again by the next write: admission would
    /// otherwise judge nothing for good (its binding admits while the parameter is missing).
    #[tokio::test]
    async fn a_deleted_configmap_is_made_again() {
        let api = ApiServer::builder().rbac(&[RBAC]).start().await;
        let key = ObjectKey::new("cf-system", "cf-hostname-ownership");
        sync(
            &api.client(),
            &key,
            &Snapshot::default(),
            &ours(&[("infra", "edge")]),
        )
        .await;
        let (object, _) = live(&api, &key);
        assert_eq!(
            object["data"][DATA_KEY].as_str(),
            Some("Gateway/infra/edge\n")
        );
    }

    #[test]
    fn the_list_names_each_gateway_and_listener_set_of_ours_once_sorted() {
        let mut statuses = ours(&[("team-b", "edge"), ("team-a", "edge.example.com")]);
        statuses.listener_sets.insert(
            ObjectKey::new("team-c", "extra"),
            ListenerSetStatus {
                gateway: ObjectKey::new("team-b", "edge"),
                conditions: Vec::new(),
                listeners: Vec::new(),
            },
        );
        // Told its Gateway is gone: attached to none of ours.
        statuses.listener_sets.insert(
            ObjectKey::new("team-d", "orphan"),
            ListenerSetStatus {
                gateway: ObjectKey::new("team-d", "deleted"),
                conditions: Vec::new(),
                listeners: Vec::new(),
            },
        );
        assert_eq!(
            parents(&statuses),
            "Gateway/team-a/edge.example.com\nGateway/team-b/edge\nListenerSet/team-c/extra\n"
        );
        assert_eq!(parents(&Statuses::default()), "");
    }
}
