//! What the server serves: each resource's kind, API group, plural, scope and subresources, and
//! the versions it is served at. Those are the real ones, with Gateway API's as its CRDs serve
//! them ([`GatewayApiCrds`]: from v1.5 by default, or up to v1.4, whose ReferenceGrant is
//! `v1beta1` only, and others).
//!
//! Simplification: one stored version per resource, served as is under each version it is
//! served at (no conversion between versions).

use std::collections::BTreeMap;

/// A resource the server serves, as its discovery documents describe it.
pub(super) struct Served {
    pub(super) kind: &'static str,
    pub(super) group: &'static str,
    /// The versions it is served at, the preferred one first.
    versions: &'static [&'static str],
    pub(super) plural: &'static str,
    pub(super) namespaced: bool,
    pub(super) subresources: &'static [&'static str],
}

/// Every resource the tests use, each group's in the API server's order of preference of its
/// versions. ReferenceGrant's versions depend on [`GatewayApiCrds`].
#[rustfmt::skip]
pub(super) const SERVED: &[Served] = &[
    Served { kind: "GatewayClass", group: "gateway.networking.k8s.io", versions: &["v1", "v1beta1"], plural: "gatewayclasses", namespaced: false, subresources: &["status"] },
    Served { kind: "Gateway", group: "gateway.networking.k8s.io", versions: &["v1", "v1beta1"], plural: "gateways", namespaced: true, subresources: &["status"] },
    Served { kind: "HTTPRoute", group: "gateway.networking.k8s.io", versions: &["v1", "v1beta1"], plural: "httproutes", namespaced: true, subresources: &["status"] },
    Served { kind: "GRPCRoute", group: "gateway.networking.k8s.io", versions: &["v1"], plural: "grpcroutes", namespaced: true, subresources: &["status"] },
    Served { kind: "ReferenceGrant", group: "gateway.networking.k8s.io", versions: &["v1", "v1beta1"], plural: "referencegrants", namespaced: true, subresources: &[] },
    Served { kind: "ListenerSet", group: "gateway.networking.k8s.io", versions: &["v1"], plural: "listenersets", namespaced: true, subresources: &["status"] },
    Served { kind: "XListenerSet", group: "gateway.networking.x-k8s.io", versions: &["v1alpha1"], plural: "xlistenersets", namespaced: true, subresources: &["status"] },
    Served { kind: "BackendTLSPolicy", group: "gateway.networking.k8s.io", versions: &["v1"], plural: "backendtlspolicies", namespaced: true, subresources: &["status"] },
    Served { kind: "Namespace", group: "", versions: &["v1"], plural: "namespaces", namespaced: false, subresources: &["finalize", "status"] },
    Served { kind: "ConfigMap", group: "", versions: &["v1"], plural: "configmaps", namespaced: true, subresources: &[] },
    Served { kind: "Service", group: "", versions: &["v1"], plural: "services", namespaced: true, subresources: &["status"] },
    Served { kind: "Pod", group: "", versions: &["v1"], plural: "pods", namespaced: true, subresources: &["status"] },
    Served { kind: "EndpointSlice", group: "discovery.k8s.io", versions: &["v1"], plural: "endpointslices", namespaced: true, subresources: &[] },
    Served { kind: "GatewayConfig", group: "cf.k8s.lex.la", versions: &["v1alpha1"], plural: "gatewayconfigs", namespaced: true, subresources: &["status"] },
    Served { kind: "ExternalBackend", group: "cf.k8s.lex.la", versions: &["v1alpha1"], plural: "externalbackends", namespaced: true, subresources: &[] },
    Served { kind: "AccessPolicy", group: "cf.k8s.lex.la", versions: &["v1alpha1"], plural: "accesspolicies", namespaced: true, subresources: &[] },
    Served { kind: "GatewayClassConfig", group: "cf.k8s.lex.la", versions: &["v1alpha1"], plural: "gatewayclassconfigs", namespaced: false, subresources: &["status"] },
    Served { kind: "Secret", group: "", versions: &["v1"], plural: "secrets", namespaced: true, subresources: &[] },
    Served { kind: "Deployment", group: "apps", versions: &["v1"], plural: "deployments", namespaced: true, subresources: &["scale", "status"] },
    Served { kind: "NetworkPolicy", group: "networking.k8s.io", versions: &["v1"], plural: "networkpolicies", namespaced: true, subresources: &[] },
    Served { kind: "HorizontalPodAutoscaler", group: "autoscaling", versions: &["v2", "v1"], plural: "horizontalpodautoscalers", namespaced: true, subresources: &["status"] },
    Served { kind: "Event", group: "", versions: &["v1"], plural: "events", namespaced: true, subresources: &[] },
    Served { kind: "Event", group: "events.k8s.io", versions: &["v1"], plural: "events", namespaced: true, subresources: &[] },
    Served { kind: "Lease", group: "coordination.k8s.io", versions: &["v1"], plural: "leases", namespaced: true, subresources: &[] },
    Served { kind: "CustomResourceDefinition", group: "apiextensions.k8s.io", versions: &["v1"], plural: "customresourcedefinitions", namespaced: false, subresources: &["status"] },
    Served { kind: "ServiceImport", group: "multicluster.x-k8s.io", versions: &["v1alpha1"], plural: "serviceimports", namespaced: true, subresources: &[] },
];

/// Which Gateway API CRD release the server has installed, as far as the versions it serves
/// ReferenceGrant at go, and ListenerSet: `ListenerSet` from v1.5, the experimental
/// `XListenerSet` before (every other kind is served as in all).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum GatewayApiCrds {
    /// v1.5 on: ReferenceGrant at `v1` and `v1beta1`.
    #[default]
    V1_5,
    /// v1.1 to v1.4 (experimental channel): ReferenceGrant at `v1beta1` only, `XListenerSet`
    /// instead of `ListenerSet`.
    V1_4,
    /// Every kind but ReferenceGrant, whose CRD is not installed.
    WithoutReferenceGrant,
    /// ReferenceGrant at `v1` only, as from a release that no longer serves `v1beta1`.
    V1Only,
}

/// What is installed: a Gateway API CRD release, and the CRDs a test installed or removed
/// since ([`Installed::set_crd`]), which take precedence for their resource.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Installed {
    pub(super) gateway_api: GatewayApiCrds,
    /// By CRD name (`PLURAL.GROUP`): the versions its CRD serves (none: removed).
    crds: BTreeMap<String, Vec<String>>,
}

impl From<GatewayApiCrds> for Installed {
    fn from(gateway_api: GatewayApiCrds) -> Self {
        Self {
            gateway_api,
            crds: BTreeMap::new(),
        }
    }
}

impl Installed {
    /// The versions `s` is served at, the preferred one first; none when its CRD is not
    /// installed.
    pub(super) fn versions(&self, s: &Served) -> Vec<&'static str> {
        match self.crds.get(&format!("{}.{}", s.plural, s.group)) {
            Some(served) => s
                .versions
                .iter()
                .filter(|v| served.iter().any(|w| w == *v))
                .copied()
                .collect(),
            None => s.versions(self.gateway_api).to_vec(),
        }
    }

    /// From now on the resource of CRD `name` is served at `versions` (none: it is removed).
    pub(super) fn set_crd(&mut self, name: &str, versions: Vec<String>) {
        self.crds.insert(name.to_owned(), versions);
    }
}

/// The resource a CRD named `PLURAL.GROUP` serves, if the server knows it.
pub(super) fn served_by_crd(name: &str) -> Option<&'static Served> {
    SERVED
        .iter()
        .find(|s| !s.group.is_empty() && name == format!("{}.{}", s.plural, s.group))
}

/// A CustomResourceDefinition of `kind` (of `group`) serving `versions`, the first stored, as
/// `kubectl apply` would install it; its plural and scope are the server's.
///
/// # Panics
///
/// When the server serves no `kind` in `group`.
pub fn crd(group: &str, kind: &str, versions: &[&str]) -> serde_json::Value {
    let s = SERVED
        .iter()
        .find(|s| s.group == group && s.kind == kind)
        .unwrap_or_else(|| panic!("no {kind} in {group} is known"));
    serde_json::json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{}.{}", s.plural, s.group)},
        "spec": {
            "group": s.group,
            "names": {"kind": s.kind, "plural": s.plural},
            "scope": if s.namespaced { "Namespaced" } else { "Cluster" },
            "versions": versions.iter().enumerate().map(|(i, v)| serde_json::json!({
                "name": v, "served": true, "storage": i == 0,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
            })).collect::<Vec<_>>(),
        },
    })
}

impl Served {
    /// The versions it is served at with `crds` installed, the preferred one first; none when
    /// its CRD is not installed.
    fn versions(&self, crds: GatewayApiCrds) -> &'static [&'static str] {
        match (self.kind, crds) {
            ("ReferenceGrant", GatewayApiCrds::V1_4) => &["v1beta1"],
            ("ReferenceGrant", GatewayApiCrds::WithoutReferenceGrant) => &[],
            ("ReferenceGrant", GatewayApiCrds::V1Only) => &["v1"],
            ("ListenerSet", GatewayApiCrds::V1_4) => &[],
            ("XListenerSet", GatewayApiCrds::V1_4) => self.versions,
            ("XListenerSet", _) => &[],
            _ => self.versions,
        }
    }
}

/// The kind of a plural (the first served under it: `events` is `Event` in both its groups).
pub(super) fn kind_of(plural: &str) -> Option<&'static str> {
    SERVED.iter().find(|s| s.plural == plural).map(|s| s.kind)
}

/// The plural of a kind; `None` for a kind the server does not serve.
pub(super) fn plural_of(kind: &str) -> Option<&'static str> {
    SERVED.iter().find(|s| s.kind == kind).map(|s| s.plural)
}

/// Whether `group/version` serves `plural` with `installed`.
pub(super) fn serves(installed: &Installed, group: &str, version: &str, plural: &str) -> bool {
    SERVED
        .iter()
        .any(|s| s.group == group && s.plural == plural && installed.versions(s).contains(&version))
}

/// The group of an `apiVersion`: empty for the core group's `v1`.
pub(super) fn group_of(api_version: &str) -> &str {
    api_version.rsplit_once('/').map_or("", |(g, _)| g)
}

/// The `apiVersion` of `group` at `version`: the version alone for the core group.
pub(super) fn api_version(group: &str, version: &str) -> String {
    if group.is_empty() {
        version.to_owned()
    } else {
        format!("{group}/{version}")
    }
}

/// The short names a real API server lists for `plural` in discovery (`kubectl get crd`).
pub(super) fn short_names(plural: &str) -> Option<&'static [&'static str]> {
    Some(match plural {
        "customresourcedefinitions" => &["crd", "crds"],
        "deployments" => &["deploy"],
        "services" => &["svc"],
        "namespaces" => &["ns"],
        "networkpolicies" => &["netpol"],
        "horizontalpodautoscalers" => &["hpa"],
        "events" => &["ev"],
        "gatewayclasses" => &["gc"],
        "gateways" => &["gtw"],
        "gatewayconfigs" => &["gwconfig"],
        "accesspolicies" => &["cfaccess"],
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GATEWAY_API: &str = "gateway.networking.k8s.io";

    #[test]
    fn reference_grant_is_served_at_the_versions_of_the_installed_crds() {
        let at = |crds: GatewayApiCrds| {
            ["v1", "v1beta1"]
                .into_iter()
                .filter(|v| serves(&crds.into(), GATEWAY_API, v, "referencegrants"))
                .collect::<Vec<_>>()
        };
        assert_eq!(at(GatewayApiCrds::V1_5), ["v1", "v1beta1"]);
        assert_eq!(at(GatewayApiCrds::V1_4), ["v1beta1"]);
        assert_eq!(at(GatewayApiCrds::V1Only), ["v1"]);
        assert!(at(GatewayApiCrds::WithoutReferenceGrant).is_empty());
    }

    #[test]
    fn other_gateway_api_kinds_are_served_alike_whatever_crds_are_installed() {
        for crds in [
            GatewayApiCrds::V1_5,
            GatewayApiCrds::V1_4,
            GatewayApiCrds::WithoutReferenceGrant,
            GatewayApiCrds::V1Only,
        ] {
            let crds = crds.into();
            assert!(serves(&crds, GATEWAY_API, "v1beta1", "httproutes"));
            assert!(serves(&crds, GATEWAY_API, "v1", "grpcroutes"));
            assert!(!serves(&crds, GATEWAY_API, "v1beta1", "grpcroutes"));
        }
    }

    #[test]
    fn listener_sets_are_experimental_before_v1_5() {
        let x = "gateway.networking.x-k8s.io";
        assert!(serves(
            &GatewayApiCrds::V1_5.into(),
            GATEWAY_API,
            "v1",
            "listenersets"
        ));
        assert!(!serves(
            &GatewayApiCrds::V1_5.into(),
            x,
            "v1alpha1",
            "xlistenersets"
        ));
        assert!(!serves(
            &GatewayApiCrds::V1_4.into(),
            GATEWAY_API,
            "v1",
            "listenersets"
        ));
        assert!(serves(
            &GatewayApiCrds::V1_4.into(),
            x,
            "v1alpha1",
            "xlistenersets"
        ));
    }

    #[test]
    fn a_resource_is_served_in_its_own_group_only() {
        let crds = Installed::default();
        assert!(serves(&crds, "apps", "v1", "deployments"));
        assert!(!serves(&crds, "", "v1", "deployments"));
        assert!(serves(&crds, "", "v1", "events"));
        assert!(serves(&crds, "events.k8s.io", "v1", "events"));
        assert!(!serves(&crds, "apps", "v2", "deployments"));
    }

    #[test]
    fn a_crd_installed_or_removed_takes_precedence_for_its_resource() {
        let mut installed = Installed::default();
        let imports = "serviceimports.multicluster.x-k8s.io";
        assert!(serves(
            &installed,
            "multicluster.x-k8s.io",
            "v1alpha1",
            "serviceimports"
        ));
        installed.set_crd(imports, Vec::new());
        assert!(!serves(
            &installed,
            "multicluster.x-k8s.io",
            "v1alpha1",
            "serviceimports"
        ));
        installed.set_crd(imports, vec!["v1alpha1".to_owned()]);
        assert!(serves(
            &installed,
            "multicluster.x-k8s.io",
            "v1alpha1",
            "serviceimports"
        ));
        // Only versions the server knows are served.
        installed.set_crd(
            "httproutes.gateway.networking.k8s.io",
            vec!["v1".to_owned(), "v2".to_owned()],
        );
        assert!(serves(&installed, GATEWAY_API, "v1", "httproutes"));
        assert!(!serves(&installed, GATEWAY_API, "v1beta1", "httproutes"));
        assert!(!serves(&installed, GATEWAY_API, "v2", "httproutes"));
        assert_eq!(
            served_by_crd(imports).map(|s| s.kind),
            Some("ServiceImport")
        );
        assert!(served_by_crd("events.").is_none());
    }

    #[test]
    fn kinds_and_plurals_name_each_other() {
        for s in SERVED {
            assert_eq!(plural_of(s.kind), Some(s.plural));
            assert_eq!(kind_of(s.plural), Some(s.kind));
        }
        assert_eq!(plural_of("Node"), None);
        assert_eq!(kind_of("nodes"), None);
    }

    #[test]
    fn api_versions_split_into_group_and_back() {
        assert_eq!(group_of("v1"), "");
        assert_eq!(group_of("apps/v1"), "apps");
        assert_eq!(api_version("", "v1"), "v1");
        assert_eq!(api_version("apps", "v1"), "apps/v1");
    }
}
