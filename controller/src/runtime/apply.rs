//! Applying and removing a Gateway's rendered objects, never touching one the Gateway does not
//! control: an object of the same name that someone else created is reported, not taken over.
//!
//! Objects the Gateway controls are taken over whoever rendered them, the Go controller of the
//! same API group included: server-side apply makes the rendered fields ours, a Deployment whose
//! selector (which the API server does not let change) is not ours is deleted and created anew,
//! and that controller's objects whose names ours do not share (its NetworkPolicy) go.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::{EnvVarSource, Secret, SecretKeySelector, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
use k8s_openapi::NamespaceResourceScope;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::core::{ApiResource, DynamicObject};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::gateway_config::{DEFAULT_AUTH_TOKEN_KEY, LEGACY_AUTH_TOKEN_KEY};
use crate::render::{DataPlane, GoControllerNames, PlaneNames, RenderError};
use crate::translate::ObjectKey;

/// Whether `owners` name the object with `uid` as controlling owner.
pub(super) fn controlled_by(
    owners: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference],
    uid: &str,
) -> bool {
    owners
        .iter()
        .any(|o| o.controller == Some(true) && o.uid == uid)
}

/// Whether `existing` is left over from a Gateway of the same name as `rendered`'s (its
/// controller), since deleted: a Gateway re-created under its name has another uid, and the
/// garbage collector may not have removed its predecessor's objects yet. Names are unique in
/// a namespace, so that Gateway is gone for sure.
fn left_by_predecessor<K: Resource>(existing: &K, rendered: &K) -> bool {
    let gateway = |o: &k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference| {
        o.controller == Some(true)
            && o.kind == "Gateway"
            && o.api_version.starts_with("gateway.networking.k8s.io/")
    };
    let ours = rendered.owner_references().iter().find(|o| gateway(o));
    let theirs = existing.owner_references().iter().find(|o| gateway(o));
    matches!((ours, theirs), (Some(o), Some(t)) if o.name == t.name && o.uid != t.uid)
}

/// The object named as `obj` is, if it exists; one left by a deleted Gateway of the same name
/// ([`left_by_predecessor`]) is deleted first, and reads as absent.
async fn read_taking_over<K>(client: &Client, obj: &K) -> Result<Option<K>, String>
where
    K: Resource<Scope = NamespaceResourceScope> + Clone + Debug + DeserializeOwned,
    K::DynamicType: Default,
{
    match read(client, obj).await? {
        Some(existing)
            if left_by_predecessor(&existing, obj) && gateway_is_ours(client, obj).await? =>
        {
            tracing::info!(
                kind = %K::kind(&K::DynamicType::default()),
                name = %format!("{}/{}", existing.namespace().unwrap_or_default(), existing.name_any()),
                "removing an object a deleted Gateway of the same name left"
            );
            delete_exactly(client, &existing).await?;
            Ok(None)
        }
        existing => Ok(existing),
    }
}

/// Whether the Gateway `rendered` was rendered for is, in the API server (not a cache that may
/// lag a re-creation), the one of that name: only then is another of that name a predecessor.
async fn gateway_is_ours<K: Resource>(client: &Client, rendered: &K) -> Result<bool, String> {
    let Some(ours) = rendered
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true) && o.kind == "Gateway")
    else {
        return Ok(false);
    };
    let namespace = rendered.namespace().unwrap_or_default();
    let api: Api<gateway_api::experimental::gateways::Gateway> =
        Api::namespaced(client.clone(), &namespace);
    // Listed by name: the controller may list Gateways, not get them.
    let params = kube::api::ListParams::default().fields(&format!("metadata.name={}", ours.name));
    let live = api
        .list_metadata(&params)
        .await
        .map_err(|e| format!("reading Gateway {namespace}/{}: {e}", ours.name))?;
    Ok(live
        .items
        .iter()
        .any(|g| g.metadata.uid.as_deref() == Some(ours.uid.as_str())))
}

/// The object named as `obj` is, if it exists.
async fn read<K>(client: &Client, obj: &K) -> Result<Option<K>, String>
where
    K: Resource<Scope = NamespaceResourceScope> + Clone + Debug + DeserializeOwned,
    K::DynamicType: Default,
{
    let namespace = obj.namespace().unwrap_or_default();
    let name = obj.name_any();
    let kind = K::kind(&K::DynamicType::default()).into_owned();
    let api: Api<K> = Api::namespaced(client.clone(), &namespace);
    api.get_opt(&name)
        .await
        .map_err(|e| format!("reading {kind} {namespace}/{name}: {e}"))
}

/// Refuses an existing object that `uid` does not control.
fn refuse_foreign<K>(existing: Option<&K>, uid: &str) -> Result<(), String>
where
    K: Resource,
    K::DynamicType: Default,
{
    match existing {
        Some(e) if !controlled_by(e.owner_references(), uid) => Err(format!(
            "{} {}/{} exists and is not owned by this Gateway; rename or remove it",
            K::kind(&K::DynamicType::default()),
            e.namespace().unwrap_or_default(),
            e.name_any()
        )),
        _ => Ok(()),
    }
}

/// Applies one object (server-side apply, forced: the controller owns every field it sets)
/// over `existing`, the object as read before. Returns whether the object was created or
/// changed, and the object as the API server holds it now.
async fn apply_over<K>(
    client: &Client,
    obj: &K,
    existing: Option<&K>,
    field_manager: &str,
) -> Result<(bool, K), String>
where
    K: Resource<Scope = NamespaceResourceScope> + Clone + Debug + DeserializeOwned + Serialize,
    K::DynamicType: Default,
{
    let applied = force_apply(client, obj, field_manager)
        .await
        .map_err(|e| applying(obj, &e))?;
    let changed = existing.and_then(|e| e.resource_version()) != applied.resource_version();
    Ok((changed, applied))
}

/// The server-side apply of [`apply_over`], its error as the API server answered.
async fn force_apply<K>(client: &Client, obj: &K, field_manager: &str) -> kube::Result<K>
where
    K: Resource<Scope = NamespaceResourceScope> + Clone + Debug + DeserializeOwned + Serialize,
    K::DynamicType: Default,
{
    let api: Api<K> = Api::namespaced(client.clone(), &obj.namespace().unwrap_or_default());
    api.patch(
        &obj.name_any(),
        &PatchParams::apply(field_manager).force(),
        &Patch::Apply(obj),
    )
    .await
}

/// What a failed apply of `obj` reports.
fn applying<K>(obj: &K, e: &kube::Error) -> String
where
    K: Resource,
    K::DynamicType: Default,
{
    format!(
        "applying {} {}/{}: {e}",
        K::kind(&K::DynamicType::default()),
        obj.namespace().unwrap_or_default(),
        obj.name_any()
    )
}

/// Applies a Deployment of `uid`'s ([`apply_over`]); when the API server refuses the result as
/// invalid (422), takes it back ([`take_back`]) and applies it again.
///
/// A forced apply takes over the fields it sets but leaves those it does not set to whoever
/// owns them. An edit that moved a field of ours to another branch of a union (an env var's
/// `valueFrom` turned into a literal `value` by `kubectl set env`, a probe's `httpGet` into a
/// `tcpSocket`) leaves its branch to its editor, and the rendered branch next to it is invalid:
/// every apply of the render would be refused until someone mended the Deployment by hand, a
/// token rotation or image upgrade included.
async fn apply_deployment(
    client: &Client,
    deployment: &Deployment,
    existing: Option<&Deployment>,
    uid: &str,
    field_manager: &str,
) -> Result<(bool, Deployment), String> {
    match force_apply(client, deployment, field_manager).await {
        Ok(applied) => {
            let changed = existing.and_then(|e| e.resource_version()) != applied.resource_version();
            Ok((changed, applied))
        }
        Err(kube::Error::Api(refused)) if refused.code == 422 => {
            let invalid = applying(deployment, &kube::Error::Api(refused));
            if !take_back(client, deployment, uid, field_manager).await? {
                return Err(invalid);
            }
            let key = format!(
                "{}/{}",
                deployment.namespace().unwrap_or_default(),
                deployment.name_any()
            );
            tracing::info!(
                deployment = %key,
                refused = %invalid,
                "took back a Deployment of this Gateway's whose edits left its render invalid"
            );
            let applied = force_apply(client, deployment, field_manager)
                .await
                .map_err(|e| applying(deployment, &e))?;
            Ok((true, applied))
        }
        Err(e) => Err(applying(deployment, &e)),
    }
}

/// Writes the fields `rendered` sets over the live Deployment of `uid`'s ([`taken_back`]): a
/// merge patch of the difference, sent under the field manager of the applies and naming the
/// resourceVersion read, so it applies only to that version. The fields it writes are no
/// longer another manager's, and the apply that follows takes them. The Deployment is not
/// deleted and created anew: that would take its pods down at once. Returns whether it wrote
/// (not when the Deployment is gone or not `uid`'s, or nothing the render sets differs).
async fn take_back(
    client: &Client,
    rendered: &Deployment,
    uid: &str,
    field_manager: &str,
) -> Result<bool, String> {
    let namespace = rendered.namespace().unwrap_or_default();
    let name = rendered.name_any();
    let failed =
        |e: &dyn std::fmt::Display| format!("taking back Deployment {namespace}/{name}: {e}");
    // Read untyped: the containers are written back whole, fields this client's API types
    // do not know (a newer cluster's) included.
    let resource = ApiResource::erase::<Deployment>(&());
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, &resource);
    let Some(live) = api.get_opt(&name).await.map_err(|e| failed(&e))? else {
        return Ok(false);
    };
    if !controlled_by(live.owner_references(), uid) {
        return Ok(false);
    }
    let live_value = serde_json::to_value(&live).map_err(|e| failed(&e))?;
    let target = taken_back(
        &live_value,
        &serde_json::to_value(rendered).map_err(|e| failed(&e))?,
    );
    let Some(serde_json::Value::Object(mut patch)) = merge_patch_between(&live_value, &target)
    else {
        return Ok(false);
    };
    patch.insert(
        "metadata".to_owned(),
        serde_json::json!({"resourceVersion": live.resource_version()}),
    );
    let params = PatchParams {
        field_manager: Some(field_manager.to_owned()),
        ..PatchParams::default()
    };
    api.patch(&name, &params, &Patch::Merge(&patch))
        .await
        .map_err(|e| failed(&e))?;
    Ok(true)
}

/// The JSON merge patch (RFC 7386) that turns `from` into `to`: `None` when they are equal.
fn merge_patch_between(
    from: &serde_json::Value,
    to: &serde_json::Value,
) -> Option<serde_json::Value> {
    use serde_json::{Map, Value};
    match (from, to) {
        _ if from == to => None,
        (Value::Object(from), Value::Object(to)) => {
            let mut patch = Map::new();
            for (key, was) in from {
                match to.get(key) {
                    None => {
                        patch.insert(key.clone(), Value::Null);
                    }
                    Some(now) => {
                        if let Some(p) = merge_patch_between(was, now) {
                            patch.insert(key.clone(), p);
                        }
                    }
                }
            }
            for (key, now) in to {
                if !from.contains_key(key) {
                    patch.insert(key.clone(), now.clone());
                }
            }
            Some(Value::Object(patch))
        }
        _ => Some(to.clone()),
    }
}

/// `live`, a Deployment, with what `ours`, its render, sets in its spec, each field replaced
/// whole, so no branch of a union that someone else set is left beside the rendered one: the
/// spec's fields, the pod spec's fields and, in each container the render has (matched by
/// name), the container's. A field is replaced with everything in it: entries others added to
/// a list the render sets (an env var set with `kubectl set env`, a toleration) go too, as
/// the price of a Deployment that could not be applied at all. What the render does not set
/// stays as `live` has it: the metadata,
/// the replica count when the render leaves it to an autoscaler, other containers and the
/// fields of ours the render leaves out, and the pod template's labels and annotations of
/// others (a `kubectl rollout restart` stamp), the rendered ones set.
fn taken_back(live: &serde_json::Value, ours: &serde_json::Value) -> serde_json::Value {
    use serde_json::{Map, Value};
    /// Field `key` of `object`, made a map first if it is not one.
    fn field<'a>(object: &'a mut Value, key: &str) -> &'a mut Value {
        if !object.is_object() {
            *object = Value::Object(Map::new());
        }
        match object {
            Value::Object(map) => map.entry(key).or_insert(Value::Null),
            other => other,
        }
    }
    /// Each field `rendered` has, set on `live` whole, but `except`.
    fn replace_fields(live: &mut Value, rendered: &Value, except: &str) {
        for (key, value) in rendered.as_object().into_iter().flatten() {
            if key != except {
                *field(live, key) = value.clone();
            }
        }
    }
    let mut object = live.clone();
    let spec = field(&mut object, "spec");
    replace_fields(spec, &ours["spec"], "template");
    let template = field(spec, "template");
    let metadata = field(template, "metadata");
    for map in ["labels", "annotations"] {
        let rendered = &ours["spec"]["template"]["metadata"][map];
        if rendered.is_object() {
            replace_fields(field(metadata, map), rendered, "");
        }
    }
    let pod = field(template, "spec");
    let rendered_pod = &ours["spec"]["template"]["spec"];
    replace_fields(pod, rendered_pod, "containers");
    let containers = field(pod, "containers");
    if !containers.is_array() {
        *containers = Value::Array(Vec::new());
    }
    if let Value::Array(containers) = containers {
        for container in rendered_pod["containers"].as_array().into_iter().flatten() {
            match containers
                .iter_mut()
                .find(|c| c.get("name") == container.get("name"))
            {
                Some(live) => replace_fields(live, container, ""),
                None => containers.push(container.clone()),
            }
        }
    }
    object
}

/// Applies one object ([`apply_over`]) unless an object of that name exists that `uid` does
/// not control.
async fn apply_one<K>(
    client: &Client,
    obj: &K,
    uid: &str,
    field_manager: &str,
) -> Result<(bool, K), String>
where
    K: Resource<Scope = NamespaceResourceScope> + Clone + Debug + DeserializeOwned + Serialize,
    K::DynamicType: Default,
{
    let existing = read_taking_over(client, obj).await?;
    refuse_foreign(existing.as_ref(), uid)?;
    apply_over(client, obj, existing.as_ref(), field_manager).await
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
/// Deployment at zero alone, while the default of one lets it scale to its floor. `live` is the
/// Deployment as read before, `uid`'s.
async fn hand_replicas_over(
    client: &Client,
    deployment: &Deployment,
    live: Option<&Deployment>,
    floor: i32,
    field_manager: &str,
) -> Result<Count, String> {
    let namespace = deployment.namespace().unwrap_or_default();
    let name = deployment.name_any();
    let api: Api<Deployment> = Api::namespaced(client.clone(), &namespace);
    let Some(live) = live else {
        return Ok(Count::Start(floor));
    };
    let replicas = live.spec.as_ref().and_then(|s| s.replicas);
    let (Some(replicas @ 1..), true) = (replicas, applies_replicas(live, field_manager)) else {
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

/// Reads the live Deployment `rendered` replaces. One `uid` controls whose selector is not the
/// rendered one (the Go controller's, or one of an earlier release) cannot be changed into it
/// (the API server refuses a new selector), so it is deleted, to be created anew: its pods go
/// and the new ones start. Returns the live Deployment left, and the replicas of the one
/// deleted, if one was.
async fn live_deployment(
    client: &Client,
    rendered: &Deployment,
    uid: &str,
) -> Result<(Option<Deployment>, Option<i32>), String> {
    let live = read_taking_over(client, rendered).await?;
    refuse_foreign(live.as_ref(), uid)?;
    let selector = |d: &Deployment| d.spec.as_ref().map(|s| s.selector.clone());
    match live {
        Some(old) if selector(&old) != selector(rendered) => {
            let namespace = old.namespace().unwrap_or_default();
            let name = old.name_any();
            tracing::info!(
                deployment = %format!("{namespace}/{name}"),
                "replacing a Deployment of this Gateway's whose selector is not the rendered one"
            );
            delete_exactly(client, &old).await?;
            let replicas = old.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0);
            Ok((None, Some(replicas)))
        }
        live => Ok((live, None)),
    }
}

/// Deletes `existing`, and no object created under its name meanwhile.
async fn delete_exactly<K>(client: &Client, existing: &K) -> Result<(), String>
where
    K: Resource<Scope = NamespaceResourceScope> + Clone + Debug + DeserializeOwned,
    K::DynamicType: Default,
{
    let namespace = existing.namespace().unwrap_or_default();
    let name = existing.name_any();
    let kind = K::kind(&K::DynamicType::default()).into_owned();
    let api: Api<K> = Api::namespaced(client.clone(), &namespace);
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: existing.uid(),
            resource_version: None,
        }),
        ..DeleteParams::background()
    };
    api.delete(&name, &params)
        .await
        .map(|_| ())
        .map_err(|e| format!("deleting {kind} {namespace}/{name}: {e}"))
}

/// Deletes the object `name` if `uid` controls it and it is not being deleted already (a
/// finalizer holds it: deleting it again changes nothing). Returns whether it deleted.
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
    let removal = remove_owned::<K>(client, namespace, name, uid).await?;
    Ok(matches!(removal, Removal::Deleted))
}

/// What [`remove_owned`] found and did.
enum Removal<K> {
    Deleted,
    /// The object, being deleted already: a finalizer holds it.
    Going(K),
    /// None that `uid` controls.
    Absent,
}

/// [`delete_owned`], telling an object being deleted already from one that is not there.
async fn remove_owned<K>(
    client: &Client,
    namespace: &str,
    name: &str,
    uid: &str,
) -> Result<Removal<K>, String>
where
    K: Resource<Scope = NamespaceResourceScope> + Clone + Debug + DeserializeOwned,
    K::DynamicType: Default,
{
    let kind = K::kind(&K::DynamicType::default()).into_owned();
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    match api.get_opt(name).await {
        Ok(Some(existing)) if controlled_by(existing.owner_references(), uid) => {
            if existing.meta().deletion_timestamp.is_some() {
                return Ok(Removal::Going(existing));
            }
            delete_exactly(client, &existing)
                .await
                .map(|()| Removal::Deleted)
        }
        Ok(_) => Ok(Removal::Absent),
        Err(e) => Err(format!("reading {kind} {namespace}/{name}: {e}")),
    }
}

/// Deletes the objects of `uid`'s plane the Go controller rendered under names ours do not
/// share: for most Gateways its NetworkPolicy alone, which admits every pod of the
/// controller's namespace to the config port and so would widen the rendered one. Returns
/// whether it deleted any.
async fn remove_go_controller_objects(
    client: &Client,
    names: &PlaneNames,
    go: &GoControllerNames,
    namespace: &str,
    uid: &str,
) -> Result<bool, String> {
    let mut deleted = false;
    if go.network_policy != names.network_policy {
        deleted |=
            delete_owned::<NetworkPolicy>(client, namespace, &go.network_policy, uid).await?;
    }
    if go.autoscaler != names.autoscaler {
        deleted |=
            delete_owned::<HorizontalPodAutoscaler>(client, namespace, &go.autoscaler, uid).await?;
    }
    if go.service != names.service {
        deleted |= delete_owned::<Service>(client, namespace, &go.service, uid).await?;
    }
    if go.auth_secret != names.auth_secret {
        deleted |= delete_owned::<Secret>(client, namespace, &go.auth_secret, uid).await?;
    }
    if go.deployment != names.deployment {
        deleted |= delete_owned::<Deployment>(client, namespace, &go.deployment, uid).await?;
    }
    Ok(deleted)
}

/// A new config-API token for a generated Secret: 32 bytes of the system random source, hex.
/// [`render::resolve`] renders with it when the Secret does not exist yet, or holds no token a
/// proxy takes.
///
/// # Errors
/// The random source failed.
pub fn fresh_token() -> Result<String, RenderError> {
    let mut bytes = [0u8; 32];
    aws_lc_rs::rand::fill(&mut bytes).map_err(|_| RenderError::Random)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// The generated config-API token Secret as [`ensure_auth_secret`] left it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthSecret {
    /// The token it holds.
    pub token: String,
    /// Its key: `token`, or `auth-token` in a Secret the Go controller generated.
    pub key: String,
    /// Labels or annotations the render no longer has are still on it: another write came
    /// between reading the Secret and removing them, and the next apply removes them.
    pub leftover: bool,
}

/// Creates the generated config-API token Secret when it is missing, and never changes the
/// token of an existing one that a proxy takes: that token is never rotated, even when the
/// caller's cached view of the Secret lags and it rendered a fresh token. One that holds no
/// token a proxy takes (edited to one the proxy refuses at start, or emptied) is given the
/// token `secret` holds, which the caller rendered, as the render does: otherwise the pods
/// would exit at start and every round would render a fresh token the Secret does not hold.
/// That write is made for the Secret as read; refused as outdated, the apply fails and the next
/// round tries again. Its labels and annotations are applied as the other plane objects' are;
/// those the render no longer has that were set when the Secret was created with them (as
/// earlier versions and the Go controller create it) are removed, unless someone else set them
/// too. Returns the token the cluster's Secret holds and its key.
pub async fn ensure_auth_secret(
    client: &Client,
    secret: &Secret,
    uid: &str,
) -> Result<AuthSecret, String> {
    let namespace = secret.namespace().unwrap_or_default();
    let name = secret.name_any();
    let api: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    let held =
        |s: &Secret| crate::render::generated_token(s).map(|(token, key)| (token, key.to_owned()));
    let existing = read_taking_over(client, secret).await?;
    let mut existing = match existing {
        Some(existing) => existing,
        None => {
            // Created without its labels and annotations, which are applied below: so they are
            // the controller's applied fields alone, and one it stops applying goes.
            let mut bare = secret.clone();
            bare.metadata.labels = None;
            bare.metadata.annotations = None;
            match api.create(&PostParams::default(), &bare).await {
                Ok(created) => created,
                // Created meanwhile (another round, another replica): use that one.
                Err(kube::Error::Api(e)) if e.code == 409 => api
                    .get(&name)
                    .await
                    .map_err(|e| format!("reading Secret {namespace}/{name}: {e}"))?,
                Err(e) => return Err(format!("creating Secret {namespace}/{name}: {e}")),
            }
        }
    };
    if !controlled_by(existing.owner_references(), uid) {
        return Err(format!(
            "Secret {namespace}/{name} exists and is not owned by this Gateway; rename or remove it"
        ));
    }
    let (token, key) = match held(&existing) {
        Some(held) => held,
        None => {
            let (token, key) = held(secret).ok_or_else(|| {
                format!("the render of Secret {namespace}/{name} holds no token a proxy takes")
            })?;
            existing = write_token(&api, &existing, &token, &key).await?;
            (token, key)
        }
    };
    // A label or annotation the render dropped that the Secret was created with (by an
    // earlier version, or the Go controller) is the create's field, which no apply of ours
    // removes: a merge patch does, made for the Secret as read (its resourceVersion) so that
    // nothing someone sets meanwhile goes with it. Refused as outdated, it waits for the next
    // apply.
    let (labels, annotations) = leftover_metadata(&existing, secret, &key, super::FIELD_MANAGER);
    let mut leftover = false;
    if !labels.is_empty() || !annotations.is_empty() {
        let removed = |keys: BTreeSet<String>| -> serde_json::Map<String, serde_json::Value> {
            keys.into_iter()
                .map(|k| (k, serde_json::Value::Null))
                .collect()
        };
        let mut metadata =
            serde_json::json!({ "resourceVersion": existing.metadata.resource_version });
        if !labels.is_empty() {
            metadata["labels"] = removed(labels).into();
        }
        if !annotations.is_empty() {
            metadata["annotations"] = removed(annotations).into();
        }
        let params = PatchParams {
            field_manager: Some(super::FIELD_MANAGER.to_owned()),
            ..PatchParams::default()
        };
        let patch = serde_json::json!({ "metadata": metadata });
        match api.patch(&name, &params, &Patch::Merge(&patch)).await {
            Ok(patched) => existing = patched,
            Err(kube::Error::Api(e)) if e.code == 409 => leftover = true,
            Err(e) => return Err(format!("unlabelling Secret {namespace}/{name}: {e}")),
        }
    }
    // Its labels and annotations (the plane's, and the Gateway's infrastructure ones) are
    // applied, its data not: an apply naming no data leaves it as it is. One the render no
    // longer has goes with the next apply, unless someone else set it too.
    let lacks = |want: &Option<BTreeMap<String, String>>,
                 have: &Option<BTreeMap<String, String>>| {
        want.iter()
            .flatten()
            .any(|(k, v)| have.as_ref().and_then(|h| h.get(k)) != Some(v))
    };
    let keys = |want: &Option<BTreeMap<String, String>>| -> BTreeSet<String> {
        want.iter().flatten().map(|(k, _)| k.clone()).collect()
    };
    let (labels, annotations) = applied_metadata(&existing, super::FIELD_MANAGER);
    if lacks(&secret.metadata.labels, &existing.metadata.labels)
        || lacks(&secret.metadata.annotations, &existing.metadata.annotations)
        || labels != keys(&secret.metadata.labels)
        || annotations != keys(&secret.metadata.annotations)
    {
        let mut metadata = serde_json::json!({ "name": name, "namespace": namespace });
        if let Some(labels) = &secret.metadata.labels {
            metadata["labels"] = serde_json::json!(labels);
        }
        if let Some(annotations) = &secret.metadata.annotations {
            metadata["annotations"] = serde_json::json!(annotations);
        }
        let applied = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": metadata,
        });
        api.patch(
            &name,
            &PatchParams::apply(super::FIELD_MANAGER).force(),
            &Patch::Apply(&applied),
        )
        .await
        .map_err(|e| format!("labelling Secret {namespace}/{name}: {e}"))?;
    }
    Ok(AuthSecret {
        token,
        key,
        leftover,
    })
}

/// Writes `token` under `key` into the generated Secret `existing`, which holds no token a
/// proxy takes, and returns it as written. The key the render reads before `key` goes, so that
/// the render reads `token`. A merge patch made for the Secret as read (its resourceVersion):
/// a token someone wrote meanwhile is not overwritten, and is read at the next round.
async fn write_token(
    api: &Api<Secret>,
    existing: &Secret,
    token: &str,
    key: &str,
) -> Result<Secret, String> {
    let namespace = existing.namespace().unwrap_or_default();
    let name = existing.name_any();
    let value = serde_json::to_value(k8s_openapi::ByteString(token.as_bytes().to_vec()))
        .map_err(|e| format!("encoding the token of Secret {namespace}/{name}: {e}"))?;
    let mut data: serde_json::Map<String, serde_json::Value> =
        [DEFAULT_AUTH_TOKEN_KEY, LEGACY_AUTH_TOKEN_KEY]
            .into_iter()
            .take_while(|k| *k != key)
            .map(|k| (k.to_owned(), serde_json::Value::Null))
            .collect();
    data.insert(key.to_owned(), value);
    let patch = serde_json::json!({
        "metadata": { "resourceVersion": existing.metadata.resource_version },
        "data": data,
    });
    let params = PatchParams {
        field_manager: Some(super::FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    };
    let written = api.patch(&name, &params, &Patch::Merge(&patch)).await;
    match written {
        Ok(written) => {
            tracing::info!(
                secret = %format!("{namespace}/{name}"),
                "wrote a new config-API token into a generated Secret that held none a proxy takes"
            );
            Ok(written)
        }
        Err(kube::Error::Api(e)) if e.code == 409 => Err(format!(
            "Secret {namespace}/{name} holds no config-API token a proxy takes and changed while a new one was written; it is read again at the next apply"
        )),
        Err(e) => Err(format!("writing a new token into Secret {namespace}/{name}: {e}")),
    }
}

/// Whether `entry` records the server-side applies of `manager`.
fn applies_of(entry: &ManagedFieldsEntry, manager: &str) -> bool {
    entry.manager.as_deref() == Some(manager)
        && entry.operation.as_deref() == Some("Apply")
        && entry.subresource.as_deref().unwrap_or_default().is_empty()
}

/// The label and annotation keys `entry` owns, as its `fieldsV1` say.
fn owned_metadata(entry: &ManagedFieldsEntry) -> (BTreeSet<String>, BTreeSet<String>) {
    let metadata = entry.fields_v1.as_ref().and_then(|f| f.0.get("f:metadata"));
    let keys = |field: &str| -> BTreeSet<String> {
        metadata
            .and_then(|m| m.get(field))
            .and_then(serde_json::Value::as_object)
            .into_iter()
            .flat_map(|m| m.keys())
            .filter_map(|k| k.strip_prefix("f:"))
            .map(str::to_owned)
            .collect()
    };
    (keys("f:labels"), keys("f:annotations"))
}

/// The label and annotation keys of `object` that the server-side applies of `manager` own,
/// as its `managedFields` say.
fn applied_metadata<K: Resource>(
    object: &K,
    manager: &str,
) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut labels = BTreeSet::new();
    let mut annotations = BTreeSet::new();
    for entry in object.meta().managed_fields.iter().flatten() {
        if applies_of(entry, manager) {
            let (l, a) = owned_metadata(entry);
            labels.extend(l);
            annotations.extend(a);
        }
    }
    (labels, annotations)
}

/// The label and annotation keys of the token Secret `existing` that `rendered` does not set
/// and that were set by the write that created it with its token (`key`) and owner
/// reference, an earlier version's or the Go controller's: the fields that write owns are
/// its own, which no apply of ours removes. A key another writer owns too (someone's
/// `kubectl label`) is someone else's, and is left; one the applies of `manager` own too is
/// ours as well.
fn leftover_metadata(
    existing: &Secret,
    rendered: &Secret,
    key: &str,
    manager: &str,
) -> (BTreeSet<String>, BTreeSet<String>) {
    let entries = existing
        .metadata
        .managed_fields
        .as_deref()
        .unwrap_or_default();
    let created = |entry: &ManagedFieldsEntry| {
        let fields = entry.fields_v1.as_ref().map(|f| &f.0);
        let owns = |pointer: &str| fields.and_then(|f| f.pointer(pointer)).is_some();
        owns(&format!("/f:data/f:{key}")) && owns("/f:metadata/f:ownerReferences")
    };
    let mut creator = (BTreeSet::new(), BTreeSet::new());
    let mut others = (BTreeSet::new(), BTreeSet::new());
    for entry in entries.iter().filter(|e| !applies_of(e, manager)) {
        let (labels, annotations) = owned_metadata(entry);
        let into = if created(entry) {
            &mut creator
        } else {
            &mut others
        };
        into.0.extend(labels);
        into.1.extend(annotations);
    }
    let left = |created: BTreeSet<String>,
                others: &BTreeSet<String>,
                want: &Option<BTreeMap<String, String>>,
                have: &Option<BTreeMap<String, String>>| {
        created
            .into_iter()
            .filter(|k| {
                !others.contains(k)
                    && !want.as_ref().is_some_and(|w| w.contains_key(k))
                    && have.as_ref().is_some_and(|h| h.contains_key(k))
            })
            .collect()
    };
    (
        left(
            creator.0,
            &others.0,
            &rendered.metadata.labels,
            &existing.metadata.labels,
        ),
        left(
            creator.1,
            &others.1,
            &rendered.metadata.annotations,
            &existing.metadata.annotations,
        ),
    )
}

/// A plane's objects as the API server returned them from their applies.
pub struct Applied {
    /// Whether any was created, changed or deleted.
    pub changed: bool,
    pub deployment: Deployment,
    pub service: Service,
    /// `None` when the plane has none (it is switched off, and one applied before is gone).
    /// Switched off, the Gateway's one that a finalizer holds while it is deleted.
    pub network_policy: Option<NetworkPolicy>,
    pub autoscaler: Option<HorizontalPodAutoscaler>,
}

/// Applies a rendered plane in dependency order (the Service before the Deployment that uses
/// it, the autoscaler after its target). An autoscaler the plane no longer has goes before
/// the Deployment takes its count back, so it cannot write a count of its own in between.
/// A Deployment whose count passes to the autoscaler keeps its running count meanwhile, and a
/// new one starts at the autoscaler's floor. A Deployment of the Gateway's whose selector is
/// not the rendered one is replaced ([`live_deployment`]), one an edit left invalid under the
/// render is taken back ([`apply_deployment`]), and the Go controller's objects
/// under other names go once the rendered NetworkPolicy is in place
/// ([`remove_go_controller_objects`]). A plane rendered without a NetworkPolicy loses the one
/// the Gateway controls, so switching the policies off leaves none behind. The generated token
/// Secret is [`ensure_auth_secret`]'s; one the plane no longer reads goes once the Deployment
/// has rolled out without it ([`generated_secret_unused`]).
pub async fn apply_plane(
    client: &Client,
    plane: &DataPlane,
    go: &GoControllerNames,
    namespace: &str,
    uid: &str,
    field_manager: &str,
) -> Result<Applied, String> {
    let (mut changed, service) = apply_one(client, &plane.service, uid, field_manager).await?;
    let network_policy = match &plane.network_policy {
        Some(policy) => {
            let (policy_changed, applied) = apply_one(client, policy, uid, field_manager).await?;
            changed |= policy_changed;
            Some(applied)
        }
        None => {
            let removal =
                remove_owned::<NetworkPolicy>(client, namespace, &plane.names.network_policy, uid)
                    .await?;
            match removal {
                Removal::Deleted => {
                    changed = true;
                    None
                }
                // Still there, as the watch cache holds it ([`super::drift`]).
                Removal::Going(policy) => Some(policy),
                Removal::Absent => None,
            }
        }
    };
    changed |= remove_go_controller_objects(client, &plane.names, go, namespace, uid).await?;
    let (live, replaced) = live_deployment(client, &plane.deployment, uid).await?;
    changed |= replaced.is_some();
    let Some(hpa) = &plane.autoscaler else {
        changed |= delete_owned::<HorizontalPodAutoscaler>(
            client,
            namespace,
            &plane.names.autoscaler,
            uid,
        )
        .await?;
        let (applied, deployment) =
            apply_deployment(client, &plane.deployment, live.as_ref(), uid, field_manager).await?;
        changed |= retire_generated_secret(client, plane, &deployment, namespace, uid).await?;
        return Ok(Applied {
            changed: changed | applied,
            deployment,
            service,
            network_policy,
            autoscaler: None,
        });
    };
    let uncounted = plane
        .deployment
        .spec
        .as_ref()
        .is_some_and(|s| s.replicas.is_none());
    let count = if uncounted {
        // A Deployment replaced starts where its predecessor ran, if above the floor: the
        // autoscaler had scaled it there.
        let floor = hpa
            .spec
            .min_replicas
            .unwrap_or(1)
            .max(replaced.unwrap_or(0));
        hand_replicas_over(
            client,
            &plane.deployment,
            live.as_ref(),
            floor,
            field_manager,
        )
        .await?
    } else {
        Count::Left
    };
    let (applied, deployment) = match count {
        Count::Start(floor) => {
            let mut first = plane.deployment.clone();
            if let Some(spec) = first.spec.as_mut() {
                spec.replicas = Some(floor);
            }
            apply_deployment(client, &first, live.as_ref(), uid, field_manager).await?
        }
        Count::HandedOver(handed) => {
            let (applied, deployment) =
                apply_deployment(client, &plane.deployment, live.as_ref(), uid, field_manager)
                    .await?;
            (handed | applied, deployment)
        }
        Count::Left => {
            apply_deployment(client, &plane.deployment, live.as_ref(), uid, field_manager).await?
        }
    };
    changed |= applied;
    changed |= retire_generated_secret(client, plane, &deployment, namespace, uid).await?;
    let (applied, autoscaler) = apply_one(client, hpa, uid, field_manager).await?;
    Ok(Applied {
        changed: changed | applied,
        deployment,
        service,
        network_policy,
        autoscaler: Some(autoscaler),
    })
}

/// Deletes the generated config-API token Secret of `uid`'s plane once
/// [`generated_secret_unused`] holds for `deployment`, the Deployment as just applied.
/// Returns whether it deleted.
async fn retire_generated_secret(
    client: &Client,
    plane: &DataPlane,
    deployment: &Deployment,
    namespace: &str,
    uid: &str,
) -> Result<bool, String> {
    if !generated_secret_unused(plane, deployment) {
        return Ok(false);
    }
    let deleted = delete_owned::<Secret>(client, namespace, &plane.names.auth_secret, uid).await?;
    if deleted {
        tracing::info!(
            secret = %format!("{namespace}/{}", plane.names.auth_secret),
            "removed the generated config-API token the plane no longer reads"
        );
    }
    Ok(deleted)
}

/// Whether the generated config-API token Secret is done with: the plane takes the operator's
/// token (`authTokenSecretRef`, naming another Secret) and `deployment`, the live one, has
/// rolled out onto that render ([`rolled_out`]): no pod started with the Secret's token is left
/// to push to, and no ReplicaSet of an older template runs pods that a restart would point at
/// the Secret. Until then it stays. Deleted then, the token cannot come back: dropping
/// `authTokenSecretRef` later generates a new one, where the Secret left would give the old
/// token (often the reason for bringing one's own) to new pods again.
pub(super) fn generated_secret_unused(plane: &DataPlane, deployment: &Deployment) -> bool {
    let reads_it = plane
        .deployment
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .into_iter()
        .flat_map(|s| &s.containers)
        .flat_map(|c| c.env.iter().flatten())
        .filter_map(|e| e.value_from.as_ref()?.secret_key_ref.as_ref())
        .any(|r| r.name == plane.names.auth_secret);
    plane.auth_secret.is_none() && !reads_it && rolled_out(deployment)
}

/// Whether a Deployment's rollout is complete, as `kubectl rollout status` tells it: its
/// controller has seen its current spec, and every replica runs the current pod template,
/// none of an older one left.
fn rolled_out(deployment: &Deployment) -> bool {
    let (Some(generation), Some(status)) =
        (deployment.metadata.generation, deployment.status.as_ref())
    else {
        return false;
    };
    let wanted = deployment
        .spec
        .as_ref()
        .and_then(|s| s.replicas)
        .unwrap_or(1);
    let updated = status.updated_replicas.unwrap_or(0);
    status.observed_generation.is_some_and(|g| g >= generation)
        && updated >= wanted
        && status.replicas.unwrap_or(0) == updated
}

/// How many of a Deployment's ready replicas run its current pod template, at least, as its
/// status tells: its controller has seen its current spec, and of the ready replicas, those
/// beyond the pods of older templates. (The status counts the ready ones of all templates
/// together: mid-rollout, a ready replica may be an old one.) 0 while the controller has not
/// seen the current spec, whose template its counts may not be of yet.
pub(super) fn ready_on_template(deployment: &Deployment) -> i32 {
    let (Some(generation), Some(status)) =
        (deployment.metadata.generation, deployment.status.as_ref())
    else {
        return 0;
    };
    if status.observed_generation.is_none_or(|g| g < generation) {
        return 0;
    }
    let ready = status.ready_replicas.unwrap_or(0);
    let updated = status.updated_replicas.unwrap_or(0);
    // Pods of older templates: every replica not updated (no fewer than the ready ones count).
    let older = status.replicas.unwrap_or(0).max(ready) - updated;
    (ready - older.max(0)).max(0)
}

/// Removes every object of a Gateway's plane that the Gateway controls (its `parametersRef` is
/// gone: it is back on the shared plane), the Go controller's under other names included, but
/// those being deleted already. Returns whether anything was deleted.
pub async fn remove_plane(
    client: &Client,
    names: &PlaneNames,
    go: &GoControllerNames,
    namespace: &str,
    uid: &str,
) -> Result<bool, String> {
    // The Deployment last: it is what tells the next round a plane is left to remove.
    let mut deleted = remove_go_controller_objects(client, names, go, namespace, uid).await?;
    deleted |=
        delete_owned::<HorizontalPodAutoscaler>(client, namespace, &names.autoscaler, uid).await?;
    deleted |= delete_owned::<NetworkPolicy>(client, namespace, &names.network_policy, uid).await?;
    deleted |= delete_owned::<Service>(client, namespace, &names.service, uid).await?;
    deleted |= delete_owned::<Secret>(client, namespace, &names.auth_secret, uid).await?;
    deleted |= delete_owned::<Deployment>(client, namespace, &names.deployment, uid).await?;
    Ok(deleted)
}

pub use crate::render::TUNNEL_TOKEN_ENV;

/// The Secret key `var` of the first container of `deployment`'s pods that reads `var` from a
/// Secret.
pub(super) fn env_secret_ref<'a>(
    deployment: &'a Deployment,
    var: &str,
) -> Option<&'a SecretKeySelector> {
    deployment
        .spec
        .as_ref()?
        .template
        .spec
        .as_ref()?
        .containers
        .iter()
        .flat_map(|c| c.env.iter().flatten())
        .find(|e| e.name == var)?
        .value_from
        .as_ref()?
        .secret_key_ref
        .as_ref()
}

/// Whether the pods of `live`, the shared pool's Deployment, take the connector token of
/// Secret `secret.0` key `secret.1` whose digest is `value`: its pod-template annotation `key`
/// holds the digest and every [`TUNNEL_TOKEN_ENV`] reads that key. A `helm upgrade` writes the
/// chart's own back, so the round checks the live Deployment with this.
pub fn pool_takes_token(
    live: &Deployment,
    key: &str,
    value: &str,
    secret: &(ObjectKey, String),
) -> bool {
    let template = live.spec.as_ref().map(|s| &s.template);
    template_annotation(live, key) == Some(value)
        && template
            .and_then(|t| t.spec.as_ref())
            .into_iter()
            .flat_map(|s| &s.containers)
            .flat_map(|c| c.env.iter().flatten())
            .filter(|v| v.name == TUNNEL_TOKEN_ENV)
            .all(|v| reads_token(v, secret))
}

/// Whether the shared pool as watched (`live`) needs rolling onto `value` of its pod
/// template's annotation `key`: it is there and does not carry it yet.
pub fn pool_needs_roll(live: Option<&Deployment>, key: &str, value: &str) -> bool {
    live.is_some_and(|live| template_annotation(live, key) != Some(value))
}

/// Rolls the shared pool's pods by stamping `value` on its pod template's annotation `key`
/// (see [`pool_needs_roll`]). A merge patch of that one annotation, as `kubectl rollout
/// restart` writes its own: the Deployment is the chart's.
pub async fn roll_pool(
    client: &Client,
    deployment: &ObjectKey,
    key: &str,
    value: &str,
) -> Result<(), String> {
    let api: Api<Deployment> = Api::namespaced(client.clone(), &deployment.namespace);
    merge_pool(&api, deployment, &stamp(key, value)).await
}

/// The pod-template annotation `key` of `deployment`.
pub(super) fn template_annotation<'a>(deployment: &'a Deployment, key: &str) -> Option<&'a str> {
    deployment
        .spec
        .as_ref()?
        .template
        .metadata
        .as_ref()?
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

/// A merge patch of one pod-template annotation of the pool.
fn stamp(key: &str, value: &str) -> serde_json::Value {
    serde_json::json!({
        "spec": {"template": {"metadata": {"annotations": {key: value}}}},
    })
}

/// Writes `patch` to the pool's Deployment as a merge patch, as `kubectl rollout restart`
/// writes its annotation: the Deployment is the chart's, and Helm keeps what it did not set.
async fn merge_pool(
    api: &Api<Deployment>,
    deployment: &ObjectKey,
    patch: &serde_json::Value,
) -> Result<(), String> {
    api.patch(
        &deployment.name,
        &PatchParams {
            field_manager: Some(super::FIELD_MANAGER.to_owned()),
            ..PatchParams::default()
        },
        &Patch::Merge(patch),
    )
    .await
    .map(drop)
    .map_err(|e| format!("patching Deployment {deployment}: {e}"))
}

/// Whether `var` reads key `secret.1` of Secret `secret.0`.
fn reads_token(
    var: &k8s_openapi::api::core::v1::EnvVar,
    (secret, key): &(ObjectKey, String),
) -> bool {
    var.value_from
        .as_ref()
        .and_then(|f| f.secret_key_ref.as_ref())
        .is_some_and(|r| r.name == secret.name && r.key == *key)
}

/// Points the shared pool's Deployment `deployment` at a connector token: sets pod-template
/// annotation `key` to `value` (the token's digest), and makes each container's
/// [`TUNNEL_TOKEN_ENV`] read key `secret.1` of Secret `secret.0` (which must be in
/// the Deployment's namespace). Either change rolls its pods; nothing is written when it holds
/// both already.
///
/// A merge patch, as `kubectl rollout restart` writes its annotation: the Deployment is the
/// chart's, and Helm keeps an annotation it did not set. A merge patch replaces lists whole, so
/// the containers are written back as read, only that variable changed, on the condition that
/// the Deployment is still as read (its resourceVersion; else 409, tried again next round).
/// Returns whether it changed the Deployment; a missing Deployment is left for a later round.
pub async fn point_pool_at_token(
    client: &Client,
    deployment: &ObjectKey,
    key: &str,
    value: &str,
    source: &(ObjectKey, String),
) -> Result<bool, String> {
    let (secret, secret_key) = source;
    let api: Api<Deployment> = Api::namespaced(client.clone(), &deployment.namespace);
    let live = api
        .get_opt(&deployment.name)
        .await
        .map_err(|e| format!("reading Deployment {deployment}: {e}"))?;
    let Some(live) = live else {
        return Ok(false);
    };
    if pool_takes_token(&live, key, value, source) {
        return Ok(false);
    }
    let template = live.spec.as_ref().map(|s| &s.template);
    let mut containers = template
        .and_then(|t| t.spec.as_ref())
        .map(|s| s.containers.clone())
        .unwrap_or_default();
    let mut repointed = false;
    for var in containers
        .iter_mut()
        .flat_map(|c| c.env.iter_mut().flatten())
        .filter(|v| v.name == TUNNEL_TOKEN_ENV)
    {
        if reads_token(var, source) {
            continue;
        }
        var.value = None;
        var.value_from = Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: secret.name.clone(),
                key: secret_key.clone(),
                optional: None,
            }),
            ..EnvVarSource::default()
        });
        repointed = true;
    }
    let mut patch = stamp(key, value);
    if repointed {
        patch["metadata"] = serde_json::json!({"resourceVersion": live.metadata.resource_version});
        patch["spec"]["template"]["spec"] = serde_json::json!({"containers": containers});
    }
    merge_pool(&api, deployment, &patch).await?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn deployment(replicas: Option<i32>, container: serde_json::Value) -> serde_json::Value {
        let mut spec = json!({
            "selector": {"matchLabels": {"app": "proxy"}},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1}},
            "template": {
                "metadata": {"labels": {"app": "proxy"}, "annotations": {"hash": "1"}},
                "spec": {"containers": [container], "automountServiceAccountToken": false},
            },
        });
        if let Some(replicas) = replicas {
            spec["replicas"] = replicas.into();
        }
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
               "metadata": {"name": "cf-proxy-edge", "namespace": "a"}, "spec": spec})
    }

    fn proxy(token: serde_json::Value, probe: serde_json::Value) -> serde_json::Value {
        json!({"name": "proxy", "image": "proxy:1",
               "env": [token, {"name": "GRACE", "value": "30s"}], "livenessProbe": probe})
    }

    #[test]
    fn a_deployment_taken_back_holds_the_rendered_fields_and_keeps_what_the_render_leaves() {
        let from_secret = json!({"name": "TUNNEL_TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}});
        let http = json!({"httpGet": {"port": "config"}, "periodSeconds": 10});
        let rendered = deployment(None, proxy(from_secret.clone(), http.clone()));

        // As a forced apply left it: both branches of each union, others' fields besides.
        let mut live = deployment(
            Some(4),
            proxy(
                json!({"name": "TUNNEL_TOKEN", "value": "literal",
                       "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}),
                json!({"httpGet": {"port": "config"}, "tcpSocket": {"port": 8081},
                       "periodSeconds": 10}),
            ),
        );
        live["metadata"]["resourceVersion"] = json!("7");
        live["metadata"]["labels"] = json!({"team": "a"});
        live["spec"]["revisionHistoryLimit"] = json!(10);
        live["spec"]["template"]["metadata"]["annotations"]["restartedAt"] = json!("now");
        live["spec"]["template"]["spec"]["containers"][0]["command"] = json!(["proxy"]);
        let sidecar = json!({"name": "sidecar", "image": "sidecar:1"});
        if let Some(containers) = live["spec"]["template"]["spec"]["containers"].as_array_mut() {
            containers.push(sidecar.clone());
        }
        live["status"] = json!({"replicas": 4});

        let target = taken_back(&live, &rendered);
        let mut expected = live.clone();
        let container = &mut expected["spec"]["template"]["spec"]["containers"][0];
        container["env"][0] = from_secret;
        container["livenessProbe"] = http;
        assert_eq!(target, expected);

        let patch = merge_patch_between(&live, &target).expect("a difference");
        let containers = [
            json!({"name": "proxy", "image": "proxy:1", "command": ["proxy"],
                   "env": [expected["spec"]["template"]["spec"]["containers"][0]["env"][0].clone(),
                           {"name": "GRACE", "value": "30s"}],
                   "livenessProbe": {"httpGet": {"port": "config"}, "periodSeconds": 10}}),
            sidecar,
        ];
        assert_eq!(
            patch,
            json!({"spec": {"template": {"spec": {"containers": containers}}}})
        );
        assert_eq!(merge_patch_between(&target, &target), None);
    }

    #[test]
    fn a_deployment_taken_back_takes_the_rendered_count_when_the_render_sets_one() {
        let container = json!({"name": "proxy", "image": "proxy:1"});
        let mut live = deployment(Some(4), container.clone());
        live["spec"]["strategy"] = json!({"type": "Recreate"});
        let target = taken_back(&live, &deployment(Some(2), container.clone()));
        assert_eq!(target["spec"]["replicas"], 2);
        assert_eq!(
            target["spec"]["strategy"],
            json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1}})
        );
        let kept = taken_back(&live, &deployment(None, container));
        assert_eq!(kept["spec"]["replicas"], 4, "the autoscaler's count stays");
        let patch = merge_patch_between(&live, &kept).expect("a difference");
        assert_eq!(
            patch,
            json!({"spec": {"strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1}}}})
        );
        let mut removed = kept.clone();
        if let Some(spec) = removed["spec"].as_object_mut() {
            spec.remove("strategy");
        }
        assert_eq!(
            merge_patch_between(&kept, &removed),
            Some(json!({"spec": {"strategy": null}})),
            "a field gone is null in the patch"
        );
    }
}
