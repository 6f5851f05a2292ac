//! Applying and removing a Gateway's rendered objects, never touching one the Gateway does not
//! control: an object of the same name that someone else created is reported, not taken over.

use std::collections::BTreeMap;
use std::fmt::Debug;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::NamespaceResourceScope;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::gateway_config::DEFAULT_AUTH_TOKEN_KEY;
use crate::render::{self, DataPlane, PlaneNames, RenderError};
use crate::translate::{ObjectKey, Snapshot};

/// Whether `meta`'s controlling owner is the object with `uid`.
fn controlled_by(
    owners: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference],
    uid: &str,
) -> bool {
    owners
        .iter()
        .any(|o| o.controller == Some(true) && o.uid == uid)
}

/// Applies one object (server-side apply, forced: the controller owns every field it sets)
/// unless an object of that name exists that `uid` does not control. Returns whether the
/// object was created or changed.
async fn apply_one<K>(
    client: &Client,
    obj: &K,
    uid: &str,
    field_manager: &str,
) -> Result<bool, String>
where
    K: Resource<Scope = NamespaceResourceScope> + Clone + Debug + DeserializeOwned + Serialize,
    K::DynamicType: Default,
{
    let namespace = obj.namespace().unwrap_or_default();
    let name = obj.name_any();
    let kind = K::kind(&K::DynamicType::default()).into_owned();
    let api: Api<K> = Api::namespaced(client.clone(), &namespace);
    let existing = api
        .get_opt(&name)
        .await
        .map_err(|e| format!("reading {kind} {namespace}/{name}: {e}"))?;
    if let Some(existing) = &existing {
        if !controlled_by(existing.owner_references(), uid) {
            return Err(format!(
                "{kind} {namespace}/{name} exists and is not owned by this Gateway; rename or remove it"
            ));
        }
    }
    let applied = api
        .patch(
            &name,
            &PatchParams::apply(field_manager).force(),
            &Patch::Apply(obj),
        )
        .await
        .map_err(|e| format!("applying {kind} {namespace}/{name}: {e}"))?;
    Ok(existing.and_then(|e| e.resource_version()) != applied.resource_version())
}

/// Field manager that holds a Deployment's `spec.replicas` between the controller letting go
/// of it and the autoscaler's first write, the hand-over the Kubernetes server-side apply
/// documentation prescribes: without it the API server removes the field the controller no
/// longer applies and the Deployment falls to one replica.
pub const REPLICAS_HANDOVER_MANAGER: &str = "cftunnel-controller-handover";

/// Whether `manager`'s server-side apply owns the Deployment's `spec.replicas`.
fn applies_replicas(deployment: &Deployment, manager: &str) -> bool {
    deployment
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .any(|m| {
            m.manager.as_deref() == Some(manager)
                && m.operation.as_deref() == Some("Apply")
                && m.subresource.is_none()
                && m.fields_v1
                    .as_ref()
                    .is_some_and(|f| f.0.pointer("/f:spec/f:replicas").is_some())
        })
}

/// What a Deployment whose count is the autoscaler's needs before it is applied.
enum Count {
    /// Nothing: the controller holds no count, or hands none over.
    Left,
    /// The hand-over manager now holds the running count (`true`: the object changed).
    HandedOver(bool),
    /// There is no Deployment yet: it starts at this count (the autoscaler's floor) rather
    /// than at the API server's default of one until the autoscaler's first pass.
    Start(i32),
}

/// Before a Deployment is applied without `spec.replicas` (its autoscaler sets it): when the
/// controller still owns the live count, the hand-over manager applies that same count, so it
/// stays when the controller drops the field. A conflict means another writer holds the field
/// already: nothing to hand over. A count of zero is not handed over: an autoscaler leaves a
/// Deployment at zero alone, while the default of one lets it scale to its floor.
async fn hand_replicas_over(
    client: &Client,
    deployment: &Deployment,
    floor: i32,
    uid: &str,
    field_manager: &str,
) -> Result<Count, String> {
    let namespace = deployment.namespace().unwrap_or_default();
    let name = deployment.name_any();
    let api: Api<Deployment> = Api::namespaced(client.clone(), &namespace);
    let live = api
        .get_opt(&name)
        .await
        .map_err(|e| format!("reading Deployment {namespace}/{name}: {e}"))?;
    let Some(live) = live else {
        return Ok(Count::Start(floor));
    };
    let replicas = live.spec.as_ref().and_then(|s| s.replicas);
    let (Some(replicas @ 1..), true, true) = (
        replicas,
        controlled_by(live.owner_references(), uid),
        applies_replicas(&live, field_manager),
    ) else {
        return Ok(Count::Left);
    };
    let count = serde_json::json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"replicas": replicas},
    });
    match api
        .patch(
            &name,
            &PatchParams::apply(REPLICAS_HANDOVER_MANAGER),
            &Patch::Apply(&count),
        )
        .await
    {
        Ok(applied) => Ok(Count::HandedOver(
            live.resource_version() != applied.resource_version(),
        )),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(Count::Left),
        Err(e) => Err(format!(
            "handing spec.replicas of Deployment {namespace}/{name} to its autoscaler: {e}"
        )),
    }
}

/// Deletes the object `name` if `uid` controls it. Returns whether it deleted.
async fn delete_owned<K>(
    client: &Client,
    namespace: &str,
    name: &str,
    uid: &str,
) -> Result<bool, String>
where
    K: Resource<Scope = NamespaceResourceScope> + Clone + Debug + DeserializeOwned,
    K::DynamicType: Default,
{
    let kind = K::kind(&K::DynamicType::default()).into_owned();
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    match api.get_opt(name).await {
        Ok(Some(existing)) if controlled_by(existing.owner_references(), uid) => {
            // Only the object read: not one created under the same name meanwhile.
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: existing.uid(),
                    resource_version: None,
                }),
                ..DeleteParams::background()
            };
            api.delete(name, &params)
                .await
                .map(|_| true)
                .map_err(|e| format!("deleting {kind} {namespace}/{name}: {e}"))
        }
        Ok(_) => Ok(false),
        Err(e) => Err(format!("reading {kind} {namespace}/{name}: {e}")),
    }
}

/// A new config-API token for a generated Secret: 32 bytes of the system random source, hex.
/// [`render::resolve`] renders with it when the Secret does not exist yet.
///
/// # Errors
/// The random source failed.
pub fn fresh_token() -> Result<String, RenderError> {
    let mut bytes = [0u8; 32];
    aws_lc_rs::rand::fill(&mut bytes).map_err(|_| RenderError::Random)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// A fresh token for each Gateway of `snapshot` that names a `GatewayConfig`, for
/// [`render::plan`]: only those whose generated Secret does not exist yet use theirs. A Gateway
/// the random source gave none is left out (its plan then says why, if it needed one).
pub fn fresh_tokens(snapshot: &Snapshot) -> BTreeMap<ObjectKey, String> {
    snapshot
        .gateways
        .iter()
        .filter(|gw| render::config_name(gw).is_some())
        .filter_map(|gw| {
            let key = ObjectKey::new(
                gw.metadata.namespace.as_deref()?,
                gw.metadata.name.as_deref()?,
            );
            Some((key, fresh_token().ok()?))
        })
        .collect()
}

/// Creates the generated config-API token Secret when it is missing and never changes an
/// existing one: the token is never rotated, even when the caller's cached view of the Secret
/// lags and it rendered a fresh token. Returns the token the cluster's Secret holds.
pub async fn ensure_auth_secret(
    client: &Client,
    secret: &Secret,
    uid: &str,
) -> Result<String, String> {
    let namespace = secret.namespace().unwrap_or_default();
    let name = secret.name_any();
    let api: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    let held = |s: &Secret| {
        s.data
            .as_ref()
            .and_then(|d| d.get(DEFAULT_AUTH_TOKEN_KEY))
            .and_then(|b| std::str::from_utf8(&b.0).ok())
            .map(|t| t.trim().to_owned())
            .filter(|t| !t.is_empty())
            .ok_or_else(|| format!("Secret {namespace}/{name} holds no {DEFAULT_AUTH_TOKEN_KEY:?}"))
    };
    let existing = match api.get_opt(&name).await {
        Ok(existing) => existing,
        Err(e) => return Err(format!("reading Secret {namespace}/{name}: {e}")),
    };
    let existing = match existing {
        Some(existing) => existing,
        None => match api.create(&PostParams::default(), secret).await {
            Ok(created) => created,
            // Created meanwhile (another round, another replica): use that one.
            Err(kube::Error::Api(e)) if e.code == 409 => api
                .get(&name)
                .await
                .map_err(|e| format!("reading Secret {namespace}/{name}: {e}"))?,
            Err(e) => return Err(format!("creating Secret {namespace}/{name}: {e}")),
        },
    };
    if !controlled_by(existing.owner_references(), uid) {
        return Err(format!(
            "Secret {namespace}/{name} exists and is not owned by this Gateway; rename or remove it"
        ));
    }
    // The Gateway's infrastructure labels and annotations reach the Secret when they are
    // added or changed (one it drops stays on the Secret, which was created, not applied,
    // with its first ones); its data is never written again.
    let lacks = |want: &Option<BTreeMap<String, String>>,
                 have: &Option<BTreeMap<String, String>>| {
        want.iter()
            .flatten()
            .any(|(k, v)| have.as_ref().and_then(|h| h.get(k)) != Some(v))
    };
    if lacks(&secret.metadata.labels, &existing.metadata.labels)
        || lacks(&secret.metadata.annotations, &existing.metadata.annotations)
    {
        let metadata = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": secret.metadata.labels,
                "annotations": secret.metadata.annotations,
            },
        });
        api.patch(
            &name,
            &PatchParams::apply(super::FIELD_MANAGER).force(),
            &Patch::Apply(&metadata),
        )
        .await
        .map_err(|e| format!("labelling Secret {namespace}/{name}: {e}"))?;
    }
    held(&existing)
}

/// Applies a rendered plane in dependency order (the Service before the Deployment that uses
/// it, the autoscaler after its target). An autoscaler the plane no longer has goes before
/// the Deployment takes its count back, so it cannot write a count of its own in between.
/// A Deployment whose count passes to the autoscaler keeps its running count meanwhile, and a
/// new one starts at the autoscaler's floor. The generated token Secret is
/// [`ensure_auth_secret`]'s. Returns whether anything changed.
pub async fn apply_plane(
    client: &Client,
    plane: &DataPlane,
    namespace: &str,
    uid: &str,
    field_manager: &str,
) -> Result<bool, String> {
    let mut changed = false;
    changed |= apply_one(client, &plane.service, uid, field_manager).await?;
    changed |= apply_one(client, &plane.network_policy, uid, field_manager).await?;
    let Some(hpa) = &plane.autoscaler else {
        changed |= delete_owned::<HorizontalPodAutoscaler>(
            client,
            namespace,
            &plane.names.autoscaler,
            uid,
        )
        .await?;
        changed |= apply_one(client, &plane.deployment, uid, field_manager).await?;
        return Ok(changed);
    };
    let uncounted = plane
        .deployment
        .spec
        .as_ref()
        .is_some_and(|s| s.replicas.is_none());
    let count = if uncounted {
        let floor = hpa.spec.min_replicas.unwrap_or(1);
        hand_replicas_over(client, &plane.deployment, floor, uid, field_manager).await?
    } else {
        Count::Left
    };
    changed |= match count {
        Count::Start(floor) => {
            let mut first = plane.deployment.clone();
            if let Some(spec) = first.spec.as_mut() {
                spec.replicas = Some(floor);
            }
            apply_one(client, &first, uid, field_manager).await?
        }
        Count::HandedOver(handed) => {
            handed | apply_one(client, &plane.deployment, uid, field_manager).await?
        }
        Count::Left => apply_one(client, &plane.deployment, uid, field_manager).await?,
    };
    changed |= apply_one(client, hpa, uid, field_manager).await?;
    Ok(changed)
}

/// Removes every object of a Gateway's plane that the Gateway controls (its `parametersRef` is
/// gone: it is back on the shared plane). Returns whether anything was deleted.
pub async fn remove_plane(
    client: &Client,
    names: &PlaneNames,
    namespace: &str,
    uid: &str,
) -> Result<bool, String> {
    // The Deployment last: it is what tells the next round a plane is left to remove.
    let mut deleted = false;
    deleted |=
        delete_owned::<HorizontalPodAutoscaler>(client, namespace, &names.autoscaler, uid).await?;
    deleted |= delete_owned::<NetworkPolicy>(client, namespace, &names.network_policy, uid).await?;
    deleted |= delete_owned::<Service>(client, namespace, &names.service, uid).await?;
    deleted |= delete_owned::<Secret>(client, namespace, &names.auth_secret, uid).await?;
    deleted |= delete_owned::<Deployment>(client, namespace, &names.deployment, uid).await?;
    Ok(deleted)
}
