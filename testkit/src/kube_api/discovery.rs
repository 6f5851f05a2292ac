//! Discovery, served as by a real API server: `/api` (`APIVersions`), `/api/v1`, `/apis`
//! (`APIGroupList`), `/apis/GROUP` (`APIGroup`) and `/apis/GROUP/VERSION` (`APIResourceList`),
//! listing what [`SERVED`] serves with the CRDs installed. Each resource lists every verb; its
//! subresources `get`, `patch` and `update` (a Namespace's `finalize` only `update`), and
//! `scale` is an `autoscaling/v1` `Scale`.

use serde_json::{json, Value};

use super::served::{api_version, Installed, SERVED};

/// The versions of `group` any resource is served at, the preferred one first ([`SERVED`]
/// lists each group's resources' versions in the API server's order of preference).
fn group_versions(crds: &Installed, group: &str) -> Vec<&'static str> {
    let mut versions: Vec<&'static str> = Vec::new();
    for s in SERVED.iter().filter(|s| s.group == group) {
        for v in crds.versions(s) {
            if !versions.contains(&v) {
                versions.push(v);
            }
        }
    }
    versions
}

/// The groups served (the core group is not one), in order of first appearance.
fn groups(crds: &Installed) -> Vec<&'static str> {
    let mut groups: Vec<&'static str> = Vec::new();
    for s in SERVED {
        if !s.group.is_empty() && !groups.contains(&s.group) && !crds.versions(s).is_empty() {
            groups.push(s.group);
        }
    }
    groups
}

/// A `GroupVersionForDiscovery`.
fn group_version(group: &str, version: &str) -> Value {
    json!({"groupVersion": format!("{group}/{version}"), "version": version})
}

/// An `APIGroup`, as in an `APIGroupList` (without `kind` and `apiVersion`) or alone.
fn api_group(crds: &Installed, group: &str) -> Value {
    let versions = group_versions(crds, group);
    json!({
        "name": group,
        "versions": versions.iter().map(|v| group_version(group, v)).collect::<Vec<_>>(),
        "preferredVersion": versions.first().map(|v| group_version(group, v)),
    })
}

/// The `APIResourceList` of `group/version` (`version` alone for the core group); `None` when
/// nothing is served there.
fn api_resource_list(crds: &Installed, group: &str, version: &str) -> Option<Value> {
    const VERBS: [&str; 8] = [
        "create",
        "delete",
        "deletecollection",
        "get",
        "list",
        "patch",
        "update",
        "watch",
    ];
    let mut resources = Vec::new();
    for s in SERVED
        .iter()
        .filter(|s| s.group == group && crds.versions(s).contains(&version))
    {
        let mut resource = json!({
            "name": s.plural,
            "singularName": s.kind.to_lowercase(),
            "namespaced": s.namespaced,
            "kind": s.kind,
            "verbs": VERBS,
        });
        if let Some(short) = super::served::short_names(s.plural) {
            resource["shortNames"] = json!(short);
        }
        resources.push(resource);
        for sub in s.subresources {
            let mut resource = json!({
                "name": format!("{}/{sub}", s.plural),
                "singularName": "",
                "namespaced": s.namespaced,
                "kind": s.kind,
                "verbs": ["get", "patch", "update"],
            });
            match *sub {
                "scale" => {
                    resource["group"] = "autoscaling".into();
                    resource["version"] = "v1".into();
                    resource["kind"] = "Scale".into();
                }
                "finalize" => resource["verbs"] = json!(["update"]),
                _ => {}
            }
            resources.push(resource);
        }
    }
    if resources.is_empty() {
        return None;
    }
    Some(json!({"kind": "APIResourceList", "apiVersion": "v1",
                "groupVersion": api_version(group, version), "resources": resources}))
}

/// The discovery document a path names, by kind: `Some((kind, None))` for a path of that
/// shape naming nothing served (404); `None` for a path that is not discovery's.
pub(super) fn discovery(crds: &Installed, path: &str) -> Option<(&'static str, Option<Value>)> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    Some(match segments.as_slice() {
        ["api"] => (
            "APIVersions",
            Some(json!({"kind": "APIVersions", "versions": ["v1"],
                        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1:6443"}]})),
        ),
        ["api", version] => ("APIResourceList", api_resource_list(crds, "", version)),
        ["apis"] => (
            "APIGroupList",
            Some(json!({"kind": "APIGroupList", "apiVersion": "v1",
                        "groups": groups(crds).iter().map(|g| api_group(crds, g)).collect::<Vec<_>>()})),
        ),
        ["apis", group] => (
            "APIGroup",
            groups(crds).contains(group).then(|| {
                let mut document = api_group(crds, group);
                document["kind"] = "APIGroup".into();
                document["apiVersion"] = "v1".into();
                document
            }),
        ),
        ["apis", group, version] => ("APIResourceList", api_resource_list(crds, group, version)),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube_api::GatewayApiCrds;

    const GATEWAY_API: &str = "gateway.networking.k8s.io";

    fn document(crds: GatewayApiCrds, path: &str) -> (&'static str, Option<Value>) {
        discovery(&crds.into(), path).expect("a discovery path")
    }

    /// The resource names an `APIResourceList` lists.
    fn names(list: &Value) -> Vec<&str> {
        list["resources"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| r["name"].as_str())
            .collect()
    }

    #[test]
    fn paths_below_a_group_version_are_not_discovery() {
        let crds = Installed::default();
        assert!(discovery(&crds, "/api/v1/namespaces").is_none());
        assert!(discovery(&crds, "/apis/apps/v1/deployments").is_none());
        assert!(discovery(&crds, "/healthz").is_none());
    }

    #[test]
    fn the_group_list_names_every_group_with_its_preferred_version_first() {
        let (kind, list) = document(GatewayApiCrds::default(), "/apis");
        assert_eq!(kind, "APIGroupList");
        let list = list.expect("always served");
        let groups = list["groups"].as_array().expect("groups");
        let names: Vec<&str> = groups.iter().filter_map(|g| g["name"].as_str()).collect();
        assert_eq!(
            names,
            [
                GATEWAY_API,
                "discovery.k8s.io",
                "cf.k8s.lex.la",
                "apps",
                "networking.k8s.io",
                "autoscaling",
                "events.k8s.io",
                "coordination.k8s.io",
                "apiextensions.k8s.io",
                "multicluster.x-k8s.io",
            ]
        );
        let autoscaling = &groups[5];
        assert_eq!(
            autoscaling["preferredVersion"],
            json!({"groupVersion": "autoscaling/v2", "version": "v2"})
        );
        assert_eq!(autoscaling["versions"][1]["groupVersion"], "autoscaling/v1");
    }

    #[test]
    fn a_group_alone_is_an_api_group_and_an_unknown_one_is_not_found() {
        let (kind, group) = document(GatewayApiCrds::V1_4, "/apis/gateway.networking.k8s.io");
        assert_eq!(kind, "APIGroup");
        assert_eq!(
            group,
            Some(json!({
                "kind": "APIGroup", "apiVersion": "v1", "name": GATEWAY_API,
                "versions": [
                    {"groupVersion": "gateway.networking.k8s.io/v1", "version": "v1"},
                    {"groupVersion": "gateway.networking.k8s.io/v1beta1", "version": "v1beta1"},
                ],
                "preferredVersion": {"groupVersion": "gateway.networking.k8s.io/v1", "version": "v1"},
            }))
        );
        assert_eq!(
            document(GatewayApiCrds::default(), "/apis/example.com"),
            ("APIGroup", None)
        );
    }

    #[test]
    fn reference_grant_is_listed_at_the_versions_its_crd_serves() {
        let at = |crds, version: &str| {
            let (_, list) = document(crds, &format!("/apis/{GATEWAY_API}/{version}"));
            names(&list.expect("the group version is served")).contains(&"referencegrants")
        };
        assert!(at(GatewayApiCrds::V1_5, "v1") && at(GatewayApiCrds::V1_5, "v1beta1"));
        assert!(!at(GatewayApiCrds::V1_4, "v1") && at(GatewayApiCrds::V1_4, "v1beta1"));
        assert!(at(GatewayApiCrds::V1Only, "v1") && !at(GatewayApiCrds::V1Only, "v1beta1"));
        assert!(!at(GatewayApiCrds::WithoutReferenceGrant, "v1"));
    }

    #[test]
    fn a_group_version_serving_nothing_is_not_found() {
        assert_eq!(
            document(GatewayApiCrds::default(), "/apis/apps/v2"),
            ("APIResourceList", None)
        );
        assert_eq!(
            document(GatewayApiCrds::default(), "/api/v2"),
            ("APIResourceList", None)
        );
    }

    #[test]
    fn subresources_are_listed_with_their_verbs_and_scale_as_autoscaling_v1() {
        let (_, apps) = document(GatewayApiCrds::default(), "/apis/apps/v1");
        let apps = apps.expect("apps/v1 is served");
        assert_eq!(apps["groupVersion"], "apps/v1");
        assert_eq!(
            names(&apps),
            ["deployments", "deployments/scale", "deployments/status"]
        );
        let scale = &apps["resources"][1];
        assert_eq!(
            (&scale["group"], &scale["version"], &scale["kind"]),
            (&json!("autoscaling"), &json!("v1"), &json!("Scale"))
        );
        assert_eq!(
            apps["resources"][0]["verbs"].as_array().map(Vec::len),
            Some(8)
        );

        let (_, core) = document(GatewayApiCrds::default(), "/api/v1");
        let core = core.expect("v1 is served");
        assert_eq!(core["groupVersion"], "v1");
        let finalize = core["resources"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|r| r["name"] == "namespaces/finalize")
            .expect("namespaces/finalize is listed");
        assert_eq!(finalize["verbs"], json!(["update"]));
    }
}
