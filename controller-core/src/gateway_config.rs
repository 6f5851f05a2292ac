//! `GatewayConfig` (`cf.k8s.lex.la/v1alpha1`): the parameters of a Gateway's dedicated data
//! plane, named by the Gateway's `spec.infrastructure.parametersRef`.
//!
//! Every Secret it names lives in the GatewayConfig's own namespace (the Gateway's): a reference
//! carries no namespace field, so a Gateway cannot point at another tenant's credentials.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, LocalObjectReference, ResourceRequirements, Toleration,
};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Key of the connector token in `tunnelTokenSecretRef` unless the reference names another.
pub const DEFAULT_TUNNEL_TOKEN_KEY: &str = "tunnel-token";
/// Key of the config-API bearer token in `authTokenSecretRef` and in the generated Secret.
pub const DEFAULT_AUTH_TOKEN_KEY: &str = "token";
/// Key of the Cloudflare API token in `cloudflareCredentialsSecretRef`.
pub const DEFAULT_API_TOKEN_KEY: &str = "api-token";

/// A dedicated data plane for the Gateways that reference this object: its own proxy
/// Deployment and its own Cloudflare Tunnel.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "cf.k8s.lex.la",
    version = "v1alpha1",
    kind = "GatewayConfig",
    namespaced,
    doc = "Parameters of a Gateway's dedicated Cloudflare Tunnel data plane."
)]
#[serde(rename_all = "camelCase")]
pub struct GatewayConfigSpec {
    /// The Secret holding the tunnel's connector token (key default `tunnel-token`). The tunnel
    /// identity is read from the token itself, so there is no tunnel id that could drift from it.
    pub tunnel_token_secret_ref: SecretKeyRef,
    /// Proxy replicas when `autoscaling` is not set. Default 2: one pod can drain while the
    /// other keeps the tunnel served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub replicas: Option<i32>,
    /// The proxy image; default: the controller's `--proxy-image`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Scale the proxy on its in-flight request gauge instead of a fixed replica count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaling: Option<Autoscaling>,
    /// Bring-your-own bearer token for the proxy's config API (key default `token`). Without it
    /// the controller generates one (`cf-proxy-<gateway>-auth`) and never rotates it.
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
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Autoscaling {
    /// Default 2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub min_replicas: Option<i32>,
    #[schemars(range(min = 1))]
    pub max_replicas: i32,
    /// Average in-flight requests per pod the autoscaler aims for. Default 50.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub target_inflight_per_pod: Option<i32>,
}
