//! `GatewayClassConfig` (`cf.k8s.lex.la/v1alpha1`, cluster-scoped): the class-level settings a
//! GatewayClass's `spec.parametersRef` names, which otherwise come from the controller's flags:
//! the Cloudflare API credentials, and the class tunnel (its connector token, or its id and
//! account) that the shared data plane serves and whose ingress document the controller writes.
//!
//! The flags stay the defaults; a class config overrides what it sets. Dedicated planes
//! (`GatewayConfig`) override the class in turn: a GatewayConfig without its own
//! `cloudflareCredentialsSecretRef` writes its tunnel's document with the class's token.
//!
//! Field names and bounds are those of the Go controller's CRD of the same group, so its
//! objects apply unchanged (its required `tunnelID` and `cloudflareCredentialsSecretRef` are
//! optional here, as a connector token or the flags can supply them); `tunnelTokenSecretRef`
//! is ours. A Secret reference without a namespace names the controller's namespace, as there.
//!
//! What the controller makes of these objects, and of the flags, is
//! [`crate::class_parameters`]'s.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The kind a GatewayClass's `parametersRef` names.
pub const GATEWAY_CLASS_CONFIG_KIND: &str = "GatewayClassConfig";
/// Key of the Cloudflare account id in the credentials Secret, read when `accountId` is unset.
pub const ACCOUNT_ID_KEY: &str = "account-id";
/// Status condition: whether every Secret the config names exists with its key.
pub const SECRETS_RESOLVED_CONDITION: &str = "SecretsResolved";
/// Status condition: whether the config can be used, and if not the first problem.
pub const VALID_CONDITION: &str = "Valid";

/// Class-level settings of the Cloudflare Tunnel Gateway controller, named by a GatewayClass's
/// `spec.parametersRef`.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "cf.k8s.lex.la",
    version = "v1alpha1",
    kind = "GatewayClassConfig",
    derive = "Default",
    status = "GatewayClassConfigStatus",
    shortname = "gcconfig",
    printcolumn = r#"{"name": "Tunnel ID", "type": "string", "jsonPath": ".spec.tunnelID"}"#,
    printcolumn = r#"{"name": "Valid", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Valid\")].status"}"#,
    printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#,
    doc = "Class-level settings of the Cloudflare Tunnel Gateway controller: its Cloudflare API credentials and the class tunnel."
)]
#[serde(rename_all = "camelCase")]
pub struct GatewayClassConfigSpec {
    /// The Secret holding the Cloudflare API token (key default `api-token`) the controller
    /// writes the class tunnel's ingress document with, and that of dedicated planes whose
    /// GatewayConfig names none. Its `account-id` key, when present, is the account.
    /// Default: the controller's `--cloudflare-api-token`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cloudflare_credentials_secret_ref: Option<SecretReference>,
    /// The Cloudflare account id (32 lowercase hex digits). Default: the credentials Secret's
    /// `account-id` key, else the account of the connector token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([a-f0-9]{32})?$"))]
    pub account_id: Option<String>,
    /// The class tunnel's UUID. Default: the tunnel of the connector token; when both are set
    /// they must agree.
    #[serde(default, rename = "tunnelID", skip_serializing_if = "Option::is_none")]
    #[schemars(regex(
        pattern = r"^[a-f0-9]{8}-[a-f0-9]{4}-[a-f0-9]{4}-[a-f0-9]{4}-[a-f0-9]{12}$"
    ))]
    pub tunnel_id: Option<String>,
    /// The Secret holding the class tunnel's connector token (key default `tunnel-token`): the
    /// shared Gateways' address, and the tunnel dedicated Gateways may share. Default: the
    /// controller's `--shared-tunnel-secret`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tunnel_token_secret_ref: Option<SecretReference>,
}

/// A key of a Secret; the namespace defaults to the controller's.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretReference {
    /// The Secret's name.
    #[schemars(length(min = 1))]
    pub name: String,
    /// The Secret's namespace. Default: the controller's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// The key within the Secret; each reference names its default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

/// What the controller last observed of a GatewayClassConfig.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GatewayClassConfigStatus {
    /// `SecretsResolved`: whether the Secrets it names exist with their keys. `Valid`: whether
    /// it can be used; if not, why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}
