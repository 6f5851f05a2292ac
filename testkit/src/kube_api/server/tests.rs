//! The server over HTTP, through kube's client as the controller uses it.

use std::time::Duration;

use futures_util::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use serde_json::json;

use super::*;

const SEED: &str = "\
apiVersion: v1
kind: Namespace
metadata: {name: tenant-a, labels: {team: a}}
---
apiVersion: v1
kind: Namespace
metadata: {name: tenant-b, labels: {team: b}}
---
apiVersion: v1
kind: Secret
metadata: {name: token, namespace: tenant-a}
stringData: {token: s3cr3t}
";

const NAMESPACE_READER: &[Rule] = &[("", "namespaces", &["list", "watch"])];

/// How long a test may wait for something that must happen.
const PATIENCE: Duration = Duration::from_secs(5);

async fn seeded() -> ApiServer {
    ApiServer::builder()
        .rbac(NAMESPACE_READER)
        .seed(SEED)
        .start()
        .await
}

fn api_code(result: Result<impl std::fmt::Debug, kube::Error>) -> (u16, String) {
    match result {
        Err(kube::Error::Api(e)) => (e.code, e.reason),
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test]
async fn the_seed_is_stored_as_written_by_a_user() {
    let api = seeded().await;
    let secret = api
        .get("v1", "Secret", "tenant-a", "token")
        .expect("the seeded Secret");
    assert_eq!(secret["data"], json!({"token": "czNjcjN0"}));
    assert_eq!(secret.get("stringData"), None);
    assert_eq!(secret["metadata"]["managedFields"][0]["manager"], "test");
    assert_eq!(api.list("Namespace").len(), 2);
    assert_eq!(api.resource_version(), 3);
    assert_eq!(
        api.writes_since(1),
        ["ADDED namespaces /tenant-b", "ADDED secrets tenant-a/token"]
    );
}

#[tokio::test]
async fn the_service_account_gets_only_what_its_rules_grant_and_the_user_everything() {
    let api = seeded().await;
    let namespaces: Api<Namespace> = Api::all(api.client());
    let listed = namespaces
        .list(&ListParams::default().labels("team=a"))
        .await
        .expect("list is granted");
    assert_eq!(listed.items.len(), 1);
    assert_eq!(
        api_code(namespaces.get("tenant-a").await),
        (403, "Forbidden".to_owned())
    );
    let secrets: Api<Secret> = Api::namespaced(api.client(), "tenant-a");
    assert_eq!(api_code(secrets.get("token").await).0, 403);

    // Discovery is every client's.
    let groups = api.client().list_api_groups().await.expect("discovery");
    assert!(groups.groups.iter().any(|g| g.name == "apps"));

    let as_user: Api<Namespace> = Api::all(api.user_client());
    as_user.get("tenant-a").await.expect("a user gets anything");

    let nothing = ApiServer::builder().seed(SEED).start().await;
    let namespaces: Api<Namespace> = Api::all(nothing.client());
    assert_eq!(
        api_code(namespaces.list(&ListParams::default()).await).0,
        403,
        "without rules the service account is granted nothing"
    );
}

#[tokio::test]
async fn a_watch_from_a_resource_version_sees_only_the_writes_after_it() {
    let api = seeded().await;
    let namespaces: Api<Namespace> = Api::all(api.client());
    let from = api.resource_version();
    api.put(json!({"apiVersion": "v1", "kind": "Namespace",
                   "metadata": {"name": "tenant-c", "labels": {"team": "a"}}}));
    api.put(json!({"apiVersion": "v1", "kind": "Namespace",
                   "metadata": {"name": "tenant-a", "labels": {"team": "b"}}}));
    let events = namespaces
        .watch(&WatchParams::default().labels("team=a"), &from.to_string())
        .await
        .expect("watch is granted")
        .take(2)
        .try_collect::<Vec<_>>();
    let events = tokio::time::timeout(PATIENCE, events)
        .await
        .expect("two events come")
        .expect("the events decode");
    let seen: Vec<(&str, String)> = events
        .iter()
        .map(|e| match e {
            WatchEvent::Added(n) => ("ADDED", n.metadata.name.clone().unwrap_or_default()),
            WatchEvent::Deleted(n) => ("DELETED", n.metadata.name.clone().unwrap_or_default()),
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    // tenant-a left the selection: deleted, as it was in it.
    assert_eq!(
        seen,
        [
            ("ADDED", "tenant-c".to_owned()),
            ("DELETED", "tenant-a".to_owned())
        ]
    );
    if let WatchEvent::Deleted(n) = &events[1] {
        let labels = n.metadata.labels.clone().unwrap_or_default();
        assert_eq!(labels.get("team").map(String::as_str), Some("a"));
    }
}

#[tokio::test]
async fn a_metadata_only_list_answers_partial_object_metadata() {
    let api = seeded().await;
    let secrets: Api<Secret> = Api::namespaced(api.user_client(), "tenant-a");
    let listed = secrets
        .list_metadata(&ListParams::default())
        .await
        .expect("a metadata list");
    assert_eq!(listed.items.len(), 1);
    assert_eq!(listed.items[0].metadata.name.as_deref(), Some("token"));
    let accepts = api.accepts("Secret");
    assert_eq!(accepts.len(), 1);
    assert!(
        accepts[0].contains("as=PartialObjectMetadataList"),
        "{accepts:?}"
    );
}

#[tokio::test]
async fn server_side_apply_conflicts_with_another_managers_value_unless_forced() {
    let api = seeded().await;
    let namespaces: Api<Namespace> = Api::all(api.user_client());
    let labelled = |team: &str| {
        json!({"apiVersion": "v1", "kind": "Namespace",
               "metadata": {"name": "applied", "labels": {"team": team}}})
    };
    let created = namespaces
        .patch(
            "applied",
            &PatchParams::apply("one"),
            &Patch::Apply(labelled("x")),
        )
        .await
        .expect("an apply creates");
    assert_eq!(created.metadata.resource_version.as_deref(), Some("4"));
    assert_eq!(
        api_code(
            namespaces
                .patch(
                    "applied",
                    &PatchParams::apply("two"),
                    &Patch::Apply(labelled("y"))
                )
                .await
        ),
        (409, "Conflict".to_owned())
    );
    let forced = namespaces
        .patch(
            "applied",
            &PatchParams::apply("two").force(),
            &Patch::Apply(labelled("y")),
        )
        .await
        .expect("a forced apply");
    let managers: Vec<String> = forced
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter_map(|m| m.manager)
        .collect();
    assert_eq!(managers, ["two"]);

    // Applying the same again changes nothing: no new resourceVersion.
    let rv = api.resource_version();
    namespaces
        .patch(
            "applied",
            &PatchParams::apply("two"),
            &Patch::Apply(labelled("y")),
        )
        .await
        .expect("an idempotent apply");
    assert_eq!(api.resource_version(), rv);
}

#[tokio::test]
async fn a_write_naming_a_stale_resource_version_is_a_conflict() {
    let api = seeded().await;
    let secrets: Api<Secret> = Api::namespaced(api.user_client(), "tenant-a");
    let mut secret = secrets.get("token").await.expect("the Secret");
    api.set_status("v1", "Secret", "tenant-a", "token", json!({"seen": true}));
    secret.data = None;
    assert_eq!(
        api_code(
            secrets
                .replace("token", &PostParams::default(), &secret)
                .await
        ),
        (409, "Conflict".to_owned())
    );
    assert_eq!(
        api_code(secrets.create(&PostParams::default(), &secret).await),
        (409, "AlreadyExists".to_owned())
    );
}

#[tokio::test]
async fn the_scale_subresource_sets_replicas_for_its_field_manager() {
    let api = ApiServer::builder()
        .seed(
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web, namespace: tenant-a}\nspec: {selector: {matchLabels: {app: web}}}\n",
        )
        .start()
        .await;
    let stored = api
        .get("apps/v1", "Deployment", "tenant-a", "web")
        .expect("the Deployment");
    assert_eq!(stored["spec"]["replicas"], 1, "defaulted");
    let deployments: Api<Deployment> = Api::namespaced(api.user_client(), "tenant-a");
    let scale = deployments
        .patch_scale(
            "web",
            &PatchParams {
                field_manager: Some("hpa".to_owned()),
                ..PatchParams::default()
            },
            &Patch::Merge(json!({"spec": {"replicas": 3}})),
        )
        .await
        .expect("scaled");
    assert_eq!(scale.spec.and_then(|s| s.replicas), Some(3));
    let stored = api
        .get("apps/v1", "Deployment", "tenant-a", "web")
        .expect("the Deployment");
    assert_eq!(stored["metadata"]["generation"], 2);
    let scaler = stored["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| m["manager"] == "hpa")
        .cloned()
        .expect("the scaler's entry");
    assert_eq!(scaler["subresource"], "scale");
}

#[tokio::test]
async fn a_held_request_is_served_on_release_against_the_objects_as_they_are_then() {
    let api = seeded().await;
    let secrets: Api<Secret> = Api::namespaced(api.user_client(), "tenant-a");
    let hold = api.hold(|c| c.method == "GET" && c.kind == "Secret");
    let reading = tokio::spawn(async move { secrets.get("token").await });
    tokio::time::timeout(PATIENCE, hold.arrived(1))
        .await
        .expect("the read is held");
    api.set_status("v1", "Secret", "tenant-a", "token", json!({"late": true}));
    hold.release();
    let secret = reading
        .await
        .expect("the reader ends")
        .expect("the read is served");
    assert_eq!(secret.metadata.resource_version.as_deref(), Some("4"));
    assert_eq!(hold.answered(1).await, [200]);
}

#[tokio::test]
async fn refused_and_failed_requests_get_their_status_until_lifted() {
    let api = seeded().await;
    let namespaces: Api<Namespace> = Api::all(api.user_client());
    let forbid = api.forbid(|c| c.kind == "Namespace");
    assert_eq!(
        api_code(namespaces.get("tenant-a").await),
        (403, "Forbidden".to_owned())
    );
    forbid.refused(1).await;
    drop(forbid);
    let failing = api.fail(500, |c| c.kind == "Namespace");
    assert_eq!(
        api_code(namespaces.get("tenant-a").await),
        (500, "InternalError".to_owned())
    );
    failing.lift();
    namespaces.get("tenant-a").await.expect("served again");
}

#[tokio::test]
async fn a_version_the_crds_no_longer_serve_is_not_found_and_its_watch_ends() {
    let api = ApiServer::builder().start().await;
    let grants = |version: &str| {
        let gvk = GroupVersionKind::gvk("gateway.networking.k8s.io", version, "ReferenceGrant");
        Api::<DynamicObject>::all_with(api.user_client(), &ApiResource::from_gvk(&gvk))
    };
    let watch = grants("v1")
        .watch(&WatchParams::default(), "0")
        .await
        .expect("v1 is served");
    api.serve_gateway_api_crds(GatewayApiCrds::V1_4);
    let ended = tokio::time::timeout(PATIENCE, watch.boxed().count())
        .await
        .expect("the watch ends");
    assert_eq!(ended, 0);
    assert_eq!(
        api_code(grants("v1").list(&ListParams::default()).await).0,
        404
    );
    grants("v1beta1")
        .list(&ListParams::default())
        .await
        .expect("v1beta1 is served");
}

#[tokio::test]
async fn a_crd_removed_and_installed_again_decides_whether_its_resource_is_served() {
    const NAME: &str = "serviceimports.multicluster.x-k8s.io";
    let api = ApiServer::builder().start().await;
    let gvk = GroupVersionKind::gvk("multicluster.x-k8s.io", "v1alpha1", "ServiceImport");
    let imports = Api::<DynamicObject>::all_with(api.user_client(), &ApiResource::from_gvk(&gvk));
    let discovered = || async {
        api.user_client()
            .list_api_group_resources("multicluster.x-k8s.io/v1alpha1")
            .await
            .map(|list| list.resources.iter().any(|r| r.name == "serviceimports"))
    };
    api.put(json!({"apiVersion": "multicluster.x-k8s.io/v1alpha1", "kind": "ServiceImport",
                   "metadata": {"name": "web", "namespace": "tenant-a"}, "spec": {"ports": [{"port": 80}]}}));
    let watch = imports
        .watch(&WatchParams::default(), &api.resource_version().to_string())
        .await
        .expect("served");

    api.remove_crd(NAME);
    let ended = tokio::time::timeout(PATIENCE, watch.boxed().count())
        .await
        .expect("the watch ends");
    assert_eq!(ended, 0);
    assert_eq!(api_code(imports.list(&ListParams::default()).await).0, 404);
    assert!(discovered().await.is_err(), "nothing served in the group");

    let installed = api.install_crd(super::super::crd(
        "multicluster.x-k8s.io",
        "ServiceImport",
        &["v1alpha1"],
    ));
    assert_eq!(installed["metadata"]["name"], NAME);
    assert!(discovered().await.expect("discovery"));
    let listed = imports
        .list(&ListParams::default())
        .await
        .expect("served again");
    assert!(listed.items.is_empty(), "its objects went with the CRD");

    // A CRD that stops serving its version.
    api.install_crd(super::super::crd(
        "multicluster.x-k8s.io",
        "ServiceImport",
        &["v1beta1"],
    ));
    assert_eq!(api_code(imports.list(&ListParams::default()).await).0, 404);
}
