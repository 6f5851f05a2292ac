//! `GatewayConfig` (`cf.k8s.lex.la/v1alpha1`): the parameters of a Gateway's dedicated data
//! plane, named by the Gateway's `spec.infrastructure.parametersRef`.
//!
//! Every Secret it names lives in the GatewayConfig's own namespace (the Gateway's): a reference
//! carries no namespace field, so a Gateway cannot point at another tenant's credentials.
//!
//! The CustomResourceDefinition is generated from these types (`cftunnel-controller crd`). Its
//! validation accepts every object the CRD of the Go controller of the same API group accepts,
//! so a cluster moving from that controller keeps its objects as they are: each bound here is
//! that CRD's or wider, and `autoscaling.metricName`, the one field of its that had no
//! counterpart here, is honoured.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, LocalObjectReference, ResourceRequirements, Toleration,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};

use crate::access_policy::AccessPolicySpec;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Key of the connector token in `tunnelTokenSecretRef` unless the reference names another.
pub const DEFAULT_TUNNEL_TOKEN_KEY: &str = "tunnel-token";
/// Key of the config-API bearer token in `authTokenSecretRef` and in the generated Secret.
pub const DEFAULT_AUTH_TOKEN_KEY: &str = "token";
/// The key the Go controller gives the config-API token, in the Secret it generates and as
/// its `authTokenSecretRef` default: read where no key is named and [`DEFAULT_AUTH_TOKEN_KEY`]
/// is absent, so its Secrets serve unchanged.
pub const LEGACY_AUTH_TOKEN_KEY: &str = "auth-token";
/// Key of the Cloudflare API token in `cloudflareCredentialsSecretRef`.
pub const DEFAULT_API_TOKEN_KEY: &str = "api-token";
/// The most proxy replicas a GatewayConfig may ask for, fixed or autoscaled: replica counts are
/// tenant input on a shared cluster (the Go controller's CRD caps them the same).
pub const MAX_REPLICAS: i32 = 100;
/// Status condition: which Gateways of the controller name the GatewayConfig.
pub const IN_USE_CONDITION: &str = "InUse";
/// Status condition: whether the data plane renders for every Gateway using the GatewayConfig,
/// and if not, the error each such Gateway's `Accepted=False` (`InvalidParameters`) carries.
pub const RENDERED_CONDITION: &str = "Rendered";

/// A dedicated data plane for the Gateways that reference this object: its own proxy
/// Deployment and its own Cloudflare Tunnel.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "cf.k8s.lex.la",
    version = "v1alpha1",
    kind = "GatewayConfig",
    derive = "Default",
    namespaced,
    status = "GatewayConfigStatus",
    shortname = "gwconfig",
    // Each column as JSON: several in the list form would repeat `type_ = ..` arguments.
    printcolumn = r#"{"name": "Tunnel Token Secret", "type": "string", "jsonPath": ".spec.tunnelTokenSecretRef.name"}"#,
    printcolumn = r#"{"name": "Replicas", "type": "integer", "description": "Fixed proxy replicas (2 when neither this nor autoscaling is set)", "jsonPath": ".spec.replicas"}"#,
    printcolumn = r#"{"name": "Min", "type": "integer", "description": "Autoscaling floor (2, or maxReplicas if lower, when unset)", "jsonPath": ".spec.autoscaling.minReplicas"}"#,
    printcolumn = r#"{"name": "Max", "type": "integer", "description": "Autoscaling ceiling", "jsonPath": ".spec.autoscaling.maxReplicas"}"#,
    printcolumn = r#"{"name": "In Use", "type": "string", "description": "Whether a Gateway of the controller names it", "jsonPath": ".status.conditions[?(@.type==\"InUse\")].status"}"#,
    printcolumn = r#"{"name": "Rendered", "type": "string", "description": "Whether its data plane renders for every Gateway using it", "jsonPath": ".status.conditions[?(@.type==\"Rendered\")].status"}"#,
    printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#,
    doc = "Parameters of a Gateway's dedicated Cloudflare Tunnel data plane."
)]
#[serde(rename_all = "camelCase")]
pub struct GatewayConfigSpec {
    /// The Secret holding the tunnel's connector token (key default `tunnel-token`). The tunnel
    /// identity is read from the token itself, so there is no tunnel id that could drift from it.
    pub tunnel_token_secret_ref: SecretKeyRef,
    /// Proxy replicas when `autoscaling` is not set, at most 100. Default 2: one pod can drain
    /// while the other keeps the tunnel served. Kept but not used while `autoscaling` is set (the
    /// autoscaler owns the count then), so autoscaling can be switched on and off by adding and
    /// removing that block alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = MAX_REPLICAS))]
    pub replicas: Option<i32>,
    /// The proxy image (`registry[:port]/repository[:tag][@digest]`); default: the
    /// controller's `--proxy-image`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1), pattern(r"^[a-zA-Z0-9][a-zA-Z0-9._/:@-]*$"))]
    pub image: Option<String>,
    /// Scale the proxy on its in-flight request gauge instead of a fixed replica count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaling: Option<Autoscaling>,
    /// Bring-your-own bearer token for the proxy's config API (key default `token`, else
    /// `auth-token`). Without it the controller generates one (`cf-proxy-<gateway>-auth`) and
    /// never rotates it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth_token_secret_ref: Option<SecretKeyRef>,
    /// The Cloudflare API token the controller writes this tunnel's ingress document with,
    /// instead of the controller's own (key default `api-token`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cloudflare_credentials_secret_ref: Option<SecretKeyRef>,
    /// Compute resources of the proxy container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Secrets in the Gateway's namespace for pulling the proxy image from a private registry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_secrets: Option<Vec<LocalObjectReference>>,
    /// Nodes the proxy pods may run on (a dedicated node pool, say).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,
    /// Taints the proxy pods tolerate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerations: Option<Vec<Toleration>>,
    /// Node and pod affinity of the proxy pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    /// Priority class of the proxy pods, so the data path is not the first preempted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
    /// Require a Cloudflare Access token (as cloudflared's `originRequest.access`) on every
    /// request this Gateway's routes serve: requests without a valid token of `teamName` for
    /// one of `audiences` are answered 403 and never reach a backend. A rule that names an
    /// `AccessPolicy` through an ExtensionRef filter takes that policy instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access: Option<AccessPolicySpec>,
}

/// A key of a Secret in the referencing object's namespace.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    /// The Secret's name.
    #[schemars(length(min = 1))]
    pub name: String,
    /// The key within the Secret; each reference names its default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

impl SecretKeyRef {
    /// The key, or `default` when the reference names none.
    pub fn key_or<'a>(&'a self, default: &'a str) -> &'a str {
        self.key
            .as_deref()
            .filter(|k| !k.is_empty())
            .unwrap_or(default)
    }
}

/// Horizontal autoscaling on `cftunnel_proxy_requests_in_flight`, a Pods-type custom metric:
/// concurrency is what saturates an I/O-bound L7 hop, not CPU.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[x_kube(
    validation = Rule::new("!has(self.minReplicas) || self.minReplicas <= self.maxReplicas")
        .message("minReplicas must not be above maxReplicas")
)]
#[serde(rename_all = "camelCase")]
pub struct Autoscaling {
    /// Default 2, or `maxReplicas` when that is lower.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_REPLICAS))]
    pub min_replicas: Option<i32>,
    /// At most 100.
    #[schemars(range(min = 1, max = MAX_REPLICAS))]
    pub max_replicas: i32,
    /// Average in-flight requests per pod the autoscaler aims for, at most 1,000,000. Default 50.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1_000_000))]
    pub target_inflight_per_pod: Option<i32>,
    /// The Pods-type custom metric the autoscaler reads, where the metrics adapter serves the
    /// in-flight gauge under another name. Default `cftunnel_proxy_requests_in_flight`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub metric_name: Option<String>,
}

/// What the controller last observed of a GatewayConfig, written through the status
/// subresource.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GatewayConfigStatus {
    /// The `metadata.generation` the conditions describe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `InUse`: whether Gateways of the controller name this GatewayConfig, and which.
    /// `Rendered`: whether their data planes render from it; if not, why (the message their
    /// `Accepted=False` condition carries).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}
