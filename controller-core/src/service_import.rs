//! `ServiceImport` (`multicluster.x-k8s.io/v1alpha1`, the Multi-Cluster Services API): a
//! Service exported from the clusters of a cluster set, usable as a route's backendRef (group
//! `multicluster.x-k8s.io`, kind `ServiceImport`). Only what the translation reads is typed;
//! other fields are ignored.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The API group of `ServiceImport`.
pub const MULTICLUSTER_GROUP: &str = "multicluster.x-k8s.io";
/// The kind a backendRef names to reach a ServiceImport.
pub const SERVICE_IMPORT_KIND: &str = "ServiceImport";
/// The DNS zone of cluster-set Services (MCS API, KEP-1645): a ServiceImport `name` in
/// `namespace` is `name.namespace.svc.clusterset.local`.
pub const CLUSTERSET_DOMAIN: &str = "clusterset.local";

/// A Service imported from the cluster set.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "multicluster.x-k8s.io",
    version = "v1alpha1",
    kind = "ServiceImport",
    namespaced,
    derive = "Default"
)]
#[serde(rename_all = "camelCase")]
pub struct ServiceImportSpec {
    /// The ports the cluster set exports.
    #[serde(default)]
    pub ports: Vec<ServiceImportPort>,
    /// The cluster-set IPs (`ClusterSetIP` imports); the translation dials the cluster-set DNS
    /// name instead, as clients of the import do.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ips: Option<Vec<String>>,
    /// `ClusterSetIP` or `Headless`.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
}

/// One exported port.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceImportPort {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub port: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app_protocol: Option<String>,
}
