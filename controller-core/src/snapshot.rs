//! The input of the core: a snapshot of the objects the controller watches, as the API server
//! returns them (or as manifests hold them, see [`crate::manifest`]), and how objects are named.
//! [`crate::render::plan`] renders the dedicated data planes it asks for and
//! [`crate::translate`] translates it.

use std::fmt;
use std::sync::Arc;

use gateway_api::backendtlspolicies::BackendTlsPolicy;
use gateway_api::experimental::gatewayclasses::GatewayClass;
use gateway_api::experimental::gateways::Gateway;
use gateway_api::experimental::grpcroutes::GrpcRoute;
use gateway_api::experimental::httproutes::HttpRoute;
use gateway_api::experimental::listenersets::ListenerSet;
use gateway_api::experimental::referencegrants::ReferenceGrant;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Serialize, Serializer};

use crate::access_policy::AccessPolicy;
use crate::external_backend::ExternalBackend;
use crate::gateway_class_config::GatewayClassConfig;
use crate::gateway_config::GatewayConfig;
use crate::service_import::ServiceImport;

/// The API group of every Gateway API kind.
pub const GATEWAY_API_GROUP: &str = "gateway.networking.k8s.io";
/// The API group of `GatewayConfig`, the per-Gateway data-plane parameters.
pub const GATEWAY_CONFIG_GROUP: &str = "cf.k8s.lex.la";
/// The kind a Gateway's `infrastructure.parametersRef` names to get a dedicated data plane.
pub const GATEWAY_CONFIG_KIND: &str = "GatewayConfig";
/// The API group of the experimental `XListenerSet`, the `ListenerSet` of Gateway API CRDs
/// before v1.5.
pub const EXPERIMENTAL_GATEWAY_API_GROUP: &str = "gateway.networking.x-k8s.io";

/// An object left out of a [`Snapshot`] because the controller could not read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnreadableObject {
    pub namespace: String,
    pub name: String,
    /// Why, as the decoder said.
    pub error: String,
}

/// Everything the core reads: the objects as the API server returns them, shared with the
/// watch caches that hold them (a round copies none).
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub gateway_classes: Vec<Arc<GatewayClass>>,
    pub gateways: Vec<Arc<Gateway>>,
    /// Gateways the controller could not read (left out of `gateways`): they exist, and a
    /// ListenerSet naming one is not told that its Gateway is gone.
    pub unreadable_gateways: Vec<UnreadableObject>,
    pub http_routes: Vec<Arc<HttpRoute>>,
    pub grpc_routes: Vec<Arc<GrpcRoute>>,
    pub reference_grants: Vec<Arc<ReferenceGrant>>,
    /// Listeners attached to Gateways from outside them (`ListenerSet`, or the experimental
    /// `XListenerSet` read as one: see [`crate::translate`]'s listener sets).
    pub listener_sets: Vec<Arc<ListenerSet>>,
    /// TLS from the data plane to the Service ports they target (see
    /// [`crate::translate`]'s backend TLS).
    pub backend_tls_policies: Vec<Arc<BackendTlsPolicy>>,
    /// Read for the CA certificates BackendTLSPolicies name (`ca.crt`).
    pub config_maps: Vec<Arc<ConfigMap>>,
    pub namespaces: Vec<Arc<Namespace>>,
    pub services: Vec<Arc<Service>>,
    pub endpoint_slices: Vec<Arc<EndpointSlice>>,
    /// The cluster set's Services (`multicluster.x-k8s.io` ServiceImports) backendRefs may
    /// name; `None` where the API server does not serve that API, whose backendRefs are then
    /// of a kind not supported (`InvalidKind`).
    pub service_imports: Option<Vec<Arc<ServiceImport>>>,
    /// Read by [`crate::render::plan`]; the translation sees them through its plans.
    pub gateway_configs: Vec<Arc<GatewayConfig>>,
    /// GatewayConfigs the controller could not read (left out of `gateway_configs`): a
    /// Gateway naming one is told why, not that it does not exist.
    pub unreadable_gateway_configs: Vec<UnreadableObject>,
    /// The class-level settings GatewayClasses name ([`crate::gateway_class_config`]).
    pub gateway_class_configs: Vec<Arc<GatewayClassConfig>>,
    /// Read by [`crate::render::plan`] for the tokens a `GatewayConfig` names, and by the
    /// translation for Gateways' backend client certificates and BackendTLSPolicies' CAs.
    pub secrets: Vec<Arc<Secret>>,
    /// Origins outside the cluster that route backendRefs name.
    pub external_backends: Vec<Arc<ExternalBackend>>,
    /// The Cloudflare Access requirements route rules name through ExtensionRef filters.
    pub access_policies: Vec<Arc<AccessPolicy>>,
    /// The metadata of the cluster's CustomResourceDefinitions: the Gateway API ones' names and
    /// bundle-version annotations make the GatewayClass condition `SupportedVersion` (see
    /// [`crate::translate::bundle_version`]); others are ignored.
    ///
    /// `None`: they cannot be read (yet), as when the runtime's CRD watch has not listed them
    /// (its RBAC rule is missing, or the list is slow); the condition says so. `Some` of an
    /// empty list is a snapshot without CRDs, such as manifests that leave them out.
    pub custom_resource_definitions: Option<Vec<ObjectMeta>>,
}

/// Namespace and name of a namespaced object.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey {
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

impl Serialize for ObjectKey {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}
