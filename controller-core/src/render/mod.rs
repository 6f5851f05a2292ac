//! Pure rendering of a Gateway's dedicated data plane: the proxy Deployment, its headless
//! Service, the config-API NetworkPolicy, the autoscaler and the generated config-API token.
//!
//! [`resolve`] reads the Secrets a `GatewayConfig` names; [`render`] turns a Gateway, its
//! `GatewayConfig` and those values into the objects to apply; [`plan()`] does both for every
//! dedicated plane of a snapshot, once, for the translation and the runtime to share. None of
//! them does I/O or reads a clock: the caller supplies the Secrets it listed and a fresh token
//! in case one must be generated, so the same inputs always render the same objects. Applying
//! them, with the ownership guards that keep the controller off objects it did not create, is
//! the runtime's.

mod names;
mod owned;
mod plan;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::sync::Arc;

use cftunnel_config::{Token, TokenError};
use gateway_api::experimental::gateways::Gateway;
use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment,
};
use k8s_openapi::api::autoscaling::v2::{
    CrossVersionObjectReference, HorizontalPodAutoscaler, HorizontalPodAutoscalerSpec,
    MetricIdentifier, MetricSpec, MetricTarget, PodsMetricSource,
};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EnvVar, EnvVarSource, HTTPGetAction,
    PodSecurityContext, PodSpec, PodTemplateSpec, Probe, ResourceRequirements, SeccompProfile,
    Secret, SecretKeySelector, SecurityContext, Service, ServicePort, ServiceSpec,
    TopologySpreadConstraint,
};
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
    NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::ByteString;
use sha2::{Digest, Sha256};

use crate::gateway_config::{
    GatewayConfig, SecretKeyRef, DEFAULT_AUTH_TOKEN_KEY, DEFAULT_TUNNEL_TOKEN_KEY,
    LEGACY_AUTH_TOKEN_KEY,
};
pub use names::{class_label, GoControllerNames, PlaneNames};
pub use owned::owned_fields;
pub(crate) use plan::plan_unapplied;
pub use plan::{config_name, plan, Plans, Rendered};

/// Label on every rendered object, valued with the Gateway's name (or its hashed short form).
pub const GATEWAY_LABEL: &str = "cf.k8s.lex.la/gateway";
/// The label, and its value, every proxy pod carries: a rendered plane's (its selector) and the
/// chart's shared pool's alike. The controller reads the pods' state by it.
pub const PROXY_POD_LABEL: (&str, &str) = ("app.kubernetes.io/name", "cftunnel-proxy");
/// The environment variable the proxy reads its connector token from.
pub const TUNNEL_TOKEN_ENV: &str = "TUNNEL_TOKEN";
/// The environment variable the proxy reads its config-API token from.
pub const AUTH_TOKEN_ENV: &str = "PROXY_AUTH_TOKEN";
/// The proxy's drain window.
pub const GRACE_PERIOD_ENV: &str = "PROXY_GRACE_PERIOD";
/// Where the proxy serves its config API.
pub const CONFIG_ADDR_ENV: &str = "PROXY_CONFIG_ADDR";
/// The proxy's environment the render sets itself: no plane setting may name one.
pub const RENDERED_ENV: [&str; 4] = [
    TUNNEL_TOKEN_ENV,
    AUTH_TOKEN_ENV,
    GRACE_PERIOD_ENV,
    CONFIG_ADDR_ENV,
];
/// The topology keys a plane's replicas spread over: nodes, then zones.
const SPREAD_TOPOLOGY_KEYS: [&str; 2] = ["kubernetes.io/hostname", "topology.kubernetes.io/zone"];
/// Gateway API's well-known label naming the GatewayClass a Gateway's infrastructure was made
/// for (GEP-1762).
pub const CLASS_LABEL: &str = "gateway.networking.k8s.io/gateway-class-name";
/// Pod-template annotation: a digest of the tokens the pods read at start, so that rotating
/// either Secret rolls the pods.
pub const CREDENTIALS_HASH_ANNOTATION: &str = "cf.k8s.lex.la/credentials-hash";
/// Deployment annotation: the tunnel the plane's pods run on, `<account tag>/<tunnel id>`,
/// never its secret. On the Deployment's metadata, not its pod template: writing it rolls no
/// pod. With [`TUNNEL_PROOF_ANNOTATION`] it tells a controller that starts while the
/// connector token's Secret cannot be read which tunnel the plane serves.
pub const TUNNEL_ANNOTATION: &str = "cf.k8s.lex.la/tunnel";
/// Deployment annotation: [`tunnel_proof`] of the plane's tunnel for its Gateway. Whoever may
/// edit the Deployment may write [`TUNNEL_ANNOTATION`], but cannot write this for a tunnel
/// whose secret they do not hold, nor copy it to another Gateway's plane.
pub const TUNNEL_PROOF_ANNOTATION: &str = "cf.k8s.lex.la/tunnel-proof";
/// Pod-template annotation of the shared pool's Deployment: the SHA-256 (hex) of the class
/// tunnel's connector token the pods read at start ([`token_digest`]). The chart writes it at
/// install and upgrade, the controller whenever the token's Secret changes: either rolls the
/// pool onto the new token.
pub const TUNNEL_TOKEN_HASH_ANNOTATION: &str = "cf.k8s.lex.la/tunnel-token-hash";
/// Pod-template annotation of the shared pool's Deployment: the SHA-256 (hex) of the
/// config-API token the controller pushes with, stamped when a pool pod refuses it. Pods read
/// the token once, at start: after the Secret changed outside Helm they take only the token
/// before, which a controller that took the lead since does not know, so the pool is rolled.
pub const AUTH_TOKEN_HASH_ANNOTATION: &str = "cf.k8s.lex.la/config-api-token-hash";
/// The metric the rendered autoscaler scales on unless `autoscaling.metricName` names another.
pub const IN_FLIGHT_METRIC: &str = "cftunnel_proxy_requests_in_flight";
/// The proxy's config API, health and metrics port (proxy contract).
pub const CONFIG_PORT: i32 = 8081;
/// Replicas without `spec.replicas` or autoscaling, and the autoscaler's default floor.
pub const DEFAULT_REPLICAS: i32 = 2;
/// The autoscaler's default target of in-flight requests per pod.
pub const DEFAULT_TARGET_INFLIGHT: i32 = 50;
/// Time the kubelet allows beyond the proxy's drain window for unregistering and exit.
const SHUTDOWN_MARGIN_SECONDS: i64 = 15;
/// The proxy's drain window cap (proxy contract).
const MAX_GRACE_SECONDS: u32 = 180;
/// The controller pods' label (`KEY=VALUE`) the config API admits when none is configured: the
/// one the chart gives them.
pub const DEFAULT_CONTROLLER_POD_LABEL: &str = "app.kubernetes.io/name=cftunnel-controller";

/// What the controller itself contributes to every data plane.
#[derive(Debug, Clone, PartialEq)]
pub struct RenderSettings {
    /// `--proxy-image`: the image when the GatewayConfig names none.
    pub proxy_image: Option<String>,
    /// `--proxy-image-pull-policy`: when the kubelet pulls `proxy_image` (the chart gives the
    /// pool's, so a re-pushed mutable tag reaches the planes as it reaches the pool). An image
    /// a GatewayConfig names is pulled as Kubernetes' default for its tag says.
    pub proxy_image_pull_policy: Option<String>,
    /// The controller's namespace, where the config API admits the controller's pods.
    pub controller_namespace: String,
    /// Labels of the controller's pods, the only pods of its namespace the config API admits:
    /// other pods there (the shared proxy pool, which forwards to any backend a route names)
    /// must not reach it. Never empty: no labels would select every pod of the namespace.
    pub controller_pod_labels: BTreeMap<String, String>,
    /// Further namespaces admitted to the config API (where Prometheus scrapes `/metrics`).
    pub monitoring_namespace_selector: Option<LabelSelector>,
    /// Further pods of the controller's namespace admitted to the config API: a Prometheus
    /// running there. Selecting that namespace with `monitoring_namespace_selector` instead
    /// would admit every pod in it, the shared proxy pool included.
    pub monitoring_pod_selector: Option<LabelSelector>,
    /// The proxy's drain window after SIGTERM (`PROXY_GRACE_PERIOD`), in seconds.
    pub grace_period_seconds: u32,
    /// More environment of every plane's proxy: the controller's own tracing settings
    /// (`OTEL_*`), so the planes trace to the same collector, and the proxy settings it was
    /// given for them (the chart's, which the shared pool runs with too).
    pub proxy_env: Vec<(String, String)>,
    /// Whether every plane gets its config-port NetworkPolicy. Off where the CNI enforces no
    /// NetworkPolicy or the operator writes the planes' policies: the plane then has none, and
    /// one rendered earlier is removed.
    pub network_policy: bool,
}

impl Default for RenderSettings {
    fn default() -> Self {
        Self {
            proxy_image: None,
            proxy_image_pull_policy: None,
            controller_namespace: "cftunnel-system".to_owned(),
            controller_pod_labels: DEFAULT_CONTROLLER_POD_LABEL
                .split_once('=')
                .map(|(k, v)| BTreeMap::from([(k.to_owned(), v.to_owned())]))
                .unwrap_or_default(),
            monitoring_namespace_selector: None,
            monitoring_pod_selector: None,
            grace_period_seconds: 30,
            proxy_env: Vec::new(),
            network_policy: true,
        }
    }
}

/// Why a data plane cannot be rendered. The message is written for the Gateway's
/// `Accepted=False` (`InvalidParameters`) condition: it names what to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    #[error("GatewayConfig {namespace}/{name} (infrastructure.parametersRef) not found")]
    ConfigNotFound { namespace: String, name: String },
    #[error("GatewayConfig {namespace}/{name} (infrastructure.parametersRef) cannot be read by this controller: {error}")]
    ConfigUnreadable {
        namespace: String,
        name: String,
        error: String,
    },
    #[error("no proxy image: set spec.image of GatewayConfig {config} or the controller's --proxy-image")]
    NoImage { config: String },
    #[error("Secret {namespace}/{name} (spec.{field} of GatewayConfig {config}) does not exist")]
    SecretNotFound {
        namespace: String,
        name: String,
        field: &'static str,
        config: String,
    },
    #[error(
        "Secret {namespace}/{name} has no key {key:?} (spec.{field} of GatewayConfig {config})"
    )]
    SecretKeyMissing {
        namespace: String,
        name: String,
        key: String,
        field: &'static str,
        config: String,
    },
    /// A config-API token Secret referenced without a key holds neither the default key nor
    /// the Go controller's.
    #[error(
        "Secret {namespace}/{name} has neither key {DEFAULT_AUTH_TOKEN_KEY:?} nor {LEGACY_AUTH_TOKEN_KEY:?} (spec.authTokenSecretRef of GatewayConfig {config})"
    )]
    AuthTokenKeyMissing {
        namespace: String,
        name: String,
        config: String,
    },
    #[error("key {key:?} of Secret {namespace}/{name} is empty or not UTF-8 text")]
    SecretNotText {
        namespace: String,
        name: String,
        key: String,
    },
    /// A config-API token no proxy can be pushed with: its pods would refuse it at start.
    #[error("key {key:?} of Secret {namespace}/{name} (spec.authTokenSecretRef): {error}")]
    BadAuthToken {
        namespace: String,
        name: String,
        key: String,
        error: cftunnel_config::auth_token::AuthTokenError,
    },
    #[error("key {key:?} of Secret {namespace}/{name}: {error}")]
    BadTunnelToken {
        namespace: String,
        name: String,
        key: String,
        error: TokenError,
    },
    #[error(
        "spec.autoscaling of GatewayConfig {config}: minReplicas {min} is above maxReplicas {max}"
    )]
    AutoscalingBounds { config: String, min: i32, max: i32 },
    #[error("spec.access.{field} of GatewayConfig {config}: {message}")]
    InvalidAccess {
        config: String,
        field: String,
        message: String,
    },
    #[error("spec.replicas of GatewayConfig {config} is negative ({replicas})")]
    NegativeReplicas { config: String, replicas: i32 },
    /// A generated token Secret does not exist yet and no fresh token was given for it: the
    /// caller's random source failed.
    #[error("the system random source failed")]
    Random,
    #[error("Gateway has no {0}")]
    GatewayMetadata(&'static str),
}

/// The credentials a data plane's pods need, read from the Secrets the GatewayConfig names.
#[derive(Debug, Clone, PartialEq)]
pub struct Credentials {
    /// The parsed connector token.
    pub tunnel: Token,
    /// Where the pods read the connector token from.
    pub tunnel_ref: SecretKeySelector,
    /// The config-API bearer token the controller authenticates its pushes with.
    pub auth_token: String,
    /// Where the pods read it from: the operator's Secret, or the generated one.
    pub auth_ref: SecretKeySelector,
    /// Whether the controller owns the auth Secret (and must render it).
    pub auth_generated: bool,
    tunnel_text: String,
    digest: String,
}

impl Credentials {
    /// The same credentials with another config-API token, read from `key` of the same Secret:
    /// the one the generated Secret holds in the cluster, when the caller's view of it was
    /// stale.
    pub fn with_auth_token(&self, auth_token: String, key: &str) -> Self {
        Self {
            digest: credentials_digest(&self.tunnel_text, &auth_token),
            auth_token,
            auth_ref: SecretKeySelector {
                key: key.to_owned(),
                ..self.auth_ref.clone()
            },
            ..self.clone()
        }
    }
}

/// Reads the Secrets `config` names out of `secrets` (the Secrets of the Gateway's namespace).
///
/// Without `authTokenSecretRef`, the token is taken from the generated Secret when it already
/// exists (it is never rotated) and is `fresh_token` otherwise: a new random token the caller
/// draws, as this crate has no random source.
///
/// # Errors
/// A named Secret or key that is missing, a value that is not text, a malformed connector token.
pub fn resolve(
    gateway: &Gateway,
    config: &GatewayConfig,
    secrets: &[Arc<Secret>],
    fresh_token: &str,
) -> Result<Credentials, RenderError> {
    resolve_with(gateway, config, secrets, || Some(fresh_token.to_owned()))
}

/// [`resolve`], with `fresh_token` asked only when a token must be generated (the generated
/// Secret holds none yet), failing with [`RenderError::Random`] when it gives none.
fn resolve_with(
    gateway: &Gateway,
    config: &GatewayConfig,
    secrets: &[Arc<Secret>],
    fresh_token: impl FnOnce() -> Option<String>,
) -> Result<Credentials, RenderError> {
    let namespace = gateway
        .metadata
        .namespace
        .as_deref()
        .ok_or(RenderError::GatewayMetadata("namespace"))?;
    let names = PlaneNames::for_gateway(gateway)?;
    let config_name = format!(
        "{namespace}/{}",
        config.metadata.name.as_deref().unwrap_or_default()
    );
    // The key a reference names, else the first of `default_keys` the Secret holds.
    let lookup = |r: &SecretKeyRef, default_keys: &[&str], field: &'static str| {
        let secret = secrets
            .iter()
            .find(|s| {
                s.metadata.namespace.as_deref() == Some(namespace)
                    && s.metadata.name.as_deref() == Some(r.name.as_str())
            })
            .ok_or_else(|| RenderError::SecretNotFound {
                namespace: namespace.to_owned(),
                name: r.name.clone(),
                field,
                config: config_name.clone(),
            })?;
        let named;
        let candidates: &[&str] = match r.key.as_deref().filter(|k| !k.is_empty()) {
            Some(key) => {
                named = [key];
                &named
            }
            None => default_keys,
        };
        let (key, value) = candidates
            .iter()
            .find_map(|k| Some(((*k).to_owned(), secret_value(secret, k)?)))
            .ok_or_else(|| match candidates {
                [_, _, ..] => RenderError::AuthTokenKeyMissing {
                    namespace: namespace.to_owned(),
                    name: r.name.clone(),
                    config: config_name.clone(),
                },
                _ => RenderError::SecretKeyMissing {
                    namespace: namespace.to_owned(),
                    name: r.name.clone(),
                    key: candidates.first().copied().unwrap_or_default().to_owned(),
                    field,
                    config: config_name.clone(),
                },
            })?;
        let text = text_value(&value).ok_or_else(|| RenderError::SecretNotText {
            namespace: namespace.to_owned(),
            name: r.name.clone(),
            key: key.clone(),
        })?;
        Ok::<_, RenderError>((
            text,
            SecretKeySelector {
                name: r.name.clone(),
                key,
                optional: None,
            },
        ))
    };

    let tunnel_spec = &config.spec.tunnel_token_secret_ref;
    let (tunnel_text, tunnel_ref) = lookup(
        tunnel_spec,
        &[DEFAULT_TUNNEL_TOKEN_KEY],
        "tunnelTokenSecretRef",
    )?;
    // Where no key is named, the config-API token is read from `token`, else from the key the
    // Go controller used, so the Secrets it generated or was given serve unchanged.
    let auth_keys = [DEFAULT_AUTH_TOKEN_KEY, LEGACY_AUTH_TOKEN_KEY];
    let tunnel: Token = tunnel_text
        .parse()
        .map_err(|error| RenderError::BadTunnelToken {
            namespace: namespace.to_owned(),
            name: tunnel_ref.name.clone(),
            key: tunnel_ref.key.clone(),
            error,
        })?;

    let (auth_token, auth_ref, auth_generated) = match &config.spec.auth_token_secret_ref {
        Some(r) => {
            let (text, selector) = lookup(r, &auth_keys, "authTokenSecretRef")?;
            // The rule the proxy starts by: a token it refuses would crash-loop every pod.
            if let Err(error) = cftunnel_config::auth_token::check(&text) {
                return Err(RenderError::BadAuthToken {
                    namespace: namespace.to_owned(),
                    name: r.name.clone(),
                    key: selector.key.clone(),
                    error,
                });
            }
            (text, selector, false)
        }
        None => {
            let generated = SecretKeyRef {
                name: names.auth_secret.clone(),
                key: None,
            };
            // A generated Secret edited to hold a token no proxy takes is written anew.
            let existing = secrets
                .iter()
                .find(|s| {
                    s.metadata.namespace.as_deref() == Some(namespace)
                        && s.metadata.name.as_deref() == Some(generated.name.as_str())
                })
                .and_then(|s| generated_token(s));
            let (token, selector) = match existing {
                Some((token, key)) => (
                    token,
                    SecretKeySelector {
                        name: generated.name.clone(),
                        key: key.to_owned(),
                        optional: None,
                    },
                ),
                None => (
                    fresh_token().ok_or(RenderError::Random)?,
                    SecretKeySelector {
                        name: names.auth_secret.clone(),
                        key: DEFAULT_AUTH_TOKEN_KEY.to_owned(),
                        optional: None,
                    },
                ),
            };
            (token, selector, true)
        }
    };

    let digest = credentials_digest(&tunnel_text, &auth_token);
    Ok(Credentials {
        tunnel,
        tunnel_ref,
        auth_token,
        auth_ref,
        auth_generated,
        tunnel_text,
        digest,
    })
}

/// The text of key `key` of Secret `namespace/name` in `secrets`, as a pod reads a token from it.
pub fn secret_text(
    secrets: &[Arc<Secret>],
    namespace: &str,
    name: &str,
    key: &str,
) -> Option<String> {
    read_secret_text(secrets, namespace, name, key).ok()
}

/// Why a Secret key gives no token. The message names the Secret and key, for a condition
/// that says what to fix; the caller adds which field referenced it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretTextError {
    #[error("Secret {namespace}/{name} not found")]
    NotFound { namespace: String, name: String },
    #[error("Secret {namespace}/{name} has no key {key:?}")]
    NoKey {
        namespace: String,
        name: String,
        key: String,
    },
    #[error("key {key:?} of Secret {namespace}/{name} is empty")]
    Empty {
        namespace: String,
        name: String,
        key: String,
    },
    #[error("key {key:?} of Secret {namespace}/{name} is not UTF-8 text")]
    NotText {
        namespace: String,
        name: String,
        key: String,
    },
}

/// [`secret_text`], saying why there is none: no such Secret, no such key, or a value that is
/// empty (whitespace only) or not text.
///
/// # Errors
/// See [`SecretTextError`].
pub fn read_secret_text(
    secrets: &[Arc<Secret>],
    namespace: &str,
    name: &str,
    key: &str,
) -> Result<String, SecretTextError> {
    let Some(secret) = secrets.iter().find(|s| {
        s.metadata.namespace.as_deref() == Some(namespace)
            && s.metadata.name.as_deref() == Some(name)
    }) else {
        return Err(SecretTextError::NotFound {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        });
    };
    let which = || (namespace.to_owned(), name.to_owned(), key.to_owned());
    let Some(value) = secret_value(secret, key) else {
        let (namespace, name, key) = which();
        return Err(SecretTextError::NoKey {
            namespace,
            name,
            key,
        });
    };
    let Ok(text) = std::str::from_utf8(&value) else {
        let (namespace, name, key) = which();
        return Err(SecretTextError::NotText {
            namespace,
            name,
            key,
        });
    };
    // Trimmed as `text_value` trims it.
    match text.trim() {
        "" => {
            let (namespace, name, key) = which();
            Err(SecretTextError::Empty {
                namespace,
                name,
                key,
            })
        }
        text => Ok(text.to_owned()),
    }
}

/// The token a generated config-API token Secret holds, and its key: the first of its keys
/// the Secret has, as text a proxy takes; `None` where it holds none, so that one is drawn and
/// written into it. The render and the apply that writes the Secret read it alike, or a plane
/// would be applied again at every round.
pub fn generated_token(secret: &Secret) -> Option<(String, &'static str)> {
    let (key, value) = [DEFAULT_AUTH_TOKEN_KEY, LEGACY_AUTH_TOKEN_KEY]
        .into_iter()
        .find_map(|key| Some((key, secret_value(secret, key)?)))?;
    let text = text_value(&value)?;
    let token = cftunnel_config::auth_token::check(&text).ok()?;
    Some((token.to_owned(), key))
}

/// The bytes of `key` in a Secret: `stringData` (as manifests carry it) over `data`.
pub(crate) fn secret_value(secret: &Secret, key: &str) -> Option<Vec<u8>> {
    // `stringData` is write-only on the API server, but manifests carry it; it wins over `data`
    // as it does when the API server merges the two.
    if let Some(v) = secret.string_data.as_ref().and_then(|d| d.get(key)) {
        return Some(v.as_bytes().to_vec());
    }
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|ByteString(b)| b.clone())
}

/// A token as the pod will see it in its environment: UTF-8, surrounding whitespace (the
/// trailing newline `echo` leaves in a file) removed, as the proxy removes it.
fn text_value(value: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(value).ok()?.trim();
    (!text.is_empty()).then(|| text.to_owned())
}

/// The SHA-256 of a token as the pods read it (trimmed), in hex: what Helm's `sha256sum` of
/// the same text gives, so that the chart and the controller stamp the same value. Never the
/// token itself: the digest of a random token does not give it away.
pub fn token_digest(token: &str) -> String {
    Sha256::digest(token.trim().as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Proof that the plane of the Gateway `gateway_uid` was rendered with a connector token of
/// the tunnel whose secret has SHA-256 `secret_digest` ([`TUNNEL_PROOF_ANNOTATION`]): a
/// SHA-256 (hex) over both, the uid first. It gives neither the secret nor its digest away,
/// and the proof for one Gateway is not that for another.
pub fn tunnel_proof(secret_digest: &[u8; 32], gateway_uid: &str) -> String {
    let mut ctx = Sha256::new();
    ctx.update(b"cftunnel plane tunnel\0");
    ctx.update((gateway_uid.len() as u64).to_be_bytes());
    ctx.update(gateway_uid.as_bytes());
    ctx.update(secret_digest);
    ctx.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// The tunnel a Deployment of a plane says it runs on: the id of [`TUNNEL_ANNOTATION`] and the
/// [`tunnel_proof`] of [`TUNNEL_PROOF_ANNOTATION`], both as the render wrote them.
pub fn annotated_tunnel(deployment: &Deployment) -> Option<(uuid::Uuid, &str)> {
    let annotations = deployment.metadata.annotations.as_ref()?;
    let (_, id) = annotations.get(TUNNEL_ANNOTATION)?.rsplit_once('/')?;
    let proof = annotations.get(TUNNEL_PROOF_ANNOTATION)?;
    Some((id.parse().ok()?, proof.as_str()))
}

fn credentials_digest(tunnel_token: &str, auth_token: &str) -> String {
    let mut ctx = Sha256::new();
    for part in [tunnel_token, auth_token] {
        ctx.update((part.len() as u64).to_be_bytes());
        ctx.update(part.as_bytes());
    }
    ctx.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// The hostname a tunnel is reached at, a Gateway's status address: `<id>.cfargotunnel.com`.
pub fn tunnel_hostname(id: uuid::Uuid) -> String {
    format!("{id}.cfargotunnel.com")
}

/// The objects of one dedicated data plane, ready to apply in the Gateway's namespace.
#[derive(Debug, Clone, PartialEq)]
pub struct DataPlane {
    pub names: PlaneNames,
    /// The Gateway's status address ([`tunnel_hostname`]).
    pub address: String,
    pub deployment: Deployment,
    /// Headless: the controller pushes config to each pod's address.
    pub service: Service,
    /// Present unless [`RenderSettings::network_policy`] is off.
    pub network_policy: Option<NetworkPolicy>,
    /// Present when the GatewayConfig asks for autoscaling.
    pub autoscaler: Option<HorizontalPodAutoscaler>,
    /// Present when the controller generates the config-API token.
    pub auth_secret: Option<Secret>,
}

/// Renders the data plane of `gateway` as `config` describes it.
///
/// # Errors
/// No image to run, or autoscaling bounds that contradict each other.
pub fn render(
    gateway: &Gateway,
    config: &GatewayConfig,
    credentials: &Credentials,
    settings: &RenderSettings,
) -> Result<DataPlane, RenderError> {
    let namespace = gateway
        .metadata
        .namespace
        .clone()
        .ok_or(RenderError::GatewayMetadata("namespace"))?;
    let names = PlaneNames::for_gateway(gateway)?;
    let config_name = format!(
        "{namespace}/{}",
        config.metadata.name.as_deref().unwrap_or_default()
    );
    let (image, image_pull_policy) = match config.spec.image.as_ref() {
        Some(own) if !own.trim().is_empty() => (Some(own.clone()), None),
        _ => (
            settings
                .proxy_image
                .clone()
                .filter(|i| !i.trim().is_empty()),
            settings.proxy_image_pull_policy.clone(),
        ),
    };
    let image = image.ok_or_else(|| RenderError::NoImage {
        config: config_name.clone(),
    })?;
    let autoscaling = match &config.spec.autoscaling {
        None => None,
        Some(a) => {
            let min = a
                .min_replicas
                .unwrap_or(DEFAULT_REPLICAS.min(a.max_replicas));
            if min > a.max_replicas || min < 1 {
                return Err(RenderError::AutoscalingBounds {
                    config: config_name,
                    min,
                    max: a.max_replicas,
                });
            }
            Some((
                min,
                a.max_replicas,
                a.target_inflight_per_pod.unwrap_or(DEFAULT_TARGET_INFLIGHT),
                a.metric_name
                    .clone()
                    .filter(|m| !m.is_empty())
                    .unwrap_or_else(|| IN_FLIGHT_METRIC.to_owned()),
            ))
        }
    };
    let replicas = config.spec.replicas.unwrap_or(DEFAULT_REPLICAS);
    if replicas < 0 {
        return Err(RenderError::NegativeReplicas {
            config: config_name,
            replicas,
        });
    }

    let infrastructure = gateway.spec.infrastructure.as_ref();
    let extra_labels = infrastructure
        .and_then(|i| i.labels.clone())
        .map(tenant_labels)
        .unwrap_or_default();
    let extra_annotations = infrastructure
        .and_then(|i| i.annotations.clone())
        .map(tenant_keys)
        .unwrap_or_default();
    let selector = names.selector_labels();
    // Infrastructure labels go first so that ours win a clash: the selector must stay ours.
    let mut labels = extra_labels;
    labels.extend(names.object_labels(&gateway.spec.gateway_class_name));
    let meta = |name: &str| ObjectMeta {
        name: Some(name.to_owned()),
        namespace: Some(namespace.clone()),
        labels: Some(labels.clone()),
        annotations: (!extra_annotations.is_empty()).then(|| extra_annotations.clone()),
        owner_references: owner_reference(gateway).map(|o| vec![o]),
        ..ObjectMeta::default()
    };

    let mut pod_annotations = extra_annotations.clone();
    pod_annotations.insert(
        CREDENTIALS_HASH_ANNOTATION.to_owned(),
        credentials.digest.clone(),
    );
    let grace = settings.grace_period_seconds.min(MAX_GRACE_SECONDS);
    let mut deployment_meta = meta(&names.deployment);
    // The Gateway's uid is what the proof is bound to: a Gateway read from a manifest has none.
    if let Some(uid) = gateway.metadata.uid.as_deref().filter(|u| !u.is_empty()) {
        let tunnel = &credentials.tunnel;
        let secret_digest: [u8; 32] = Sha256::digest(tunnel.tunnel_secret()).into();
        deployment_meta
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .extend([
                (
                    TUNNEL_ANNOTATION.to_owned(),
                    format!("{}/{}", tunnel.account_tag(), tunnel.tunnel_id()),
                ),
                (
                    TUNNEL_PROOF_ANNOTATION.to_owned(),
                    tunnel_proof(&secret_digest, uid),
                ),
            ]);
    }
    let deployment = Deployment {
        metadata: deployment_meta,
        spec: Some(DeploymentSpec {
            // The autoscaler owns the count when there is one; writing it here would fight it.
            replicas: autoscaling.is_none().then_some(replicas),
            selector: LabelSelector {
                match_labels: Some(selector.clone()),
                match_expressions: None,
            },
            // A rollout never takes a registered connector away before its successor is ready.
            strategy: Some(DeploymentStrategy {
                type_: Some("RollingUpdate".to_owned()),
                rolling_update: Some(RollingUpdateDeployment {
                    max_surge: Some(IntOrString::Int(1)),
                    max_unavailable: Some(IntOrString::Int(0)),
                }),
            }),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels.clone()),
                    annotations: Some(pod_annotations),
                    ..ObjectMeta::default()
                }),
                spec: Some(pod_spec(
                    image,
                    image_pull_policy,
                    credentials,
                    config,
                    grace,
                    &settings.proxy_env,
                    &selector,
                )),
            },
            ..DeploymentSpec::default()
        }),
        status: None,
    };

    let service = Service {
        metadata: meta(&names.service),
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".to_owned()),
            selector: Some(selector.clone()),
            // A pod is ready only once it has a config, so pushes must reach it before.
            publish_not_ready_addresses: Some(true),
            ports: Some(vec![ServicePort {
                name: Some("config".to_owned()),
                port: CONFIG_PORT,
                target_port: Some(IntOrString::String("config".to_owned())),
                protocol: Some("TCP".to_owned()),
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        status: None,
    };

    // The controller's pods: both selectors in one peer, so a pod must be in the controller's
    // namespace AND carry its labels. The namespace alone would admit the shared proxy pool
    // running there, and through it any tenant whose route names this Service as a backend.
    let controller_namespace = LabelSelector {
        match_labels: Some(BTreeMap::from([(
            "kubernetes.io/metadata.name".to_owned(),
            settings.controller_namespace.clone(),
        )])),
        match_expressions: None,
    };
    let mut peers = vec![NetworkPolicyPeer {
        namespace_selector: Some(controller_namespace.clone()),
        pod_selector: Some(LabelSelector {
            match_labels: Some(settings.controller_pod_labels.clone()),
            match_expressions: None,
        }),
        ..NetworkPolicyPeer::default()
    }];
    // A Prometheus in the controller's namespace: its pods there, the same way.
    if let Some(monitoring) = &settings.monitoring_pod_selector {
        peers.push(NetworkPolicyPeer {
            namespace_selector: Some(controller_namespace),
            pod_selector: Some(monitoring.clone()),
            ..NetworkPolicyPeer::default()
        });
    }
    if let Some(monitoring) = &settings.monitoring_namespace_selector {
        peers.push(NetworkPolicyPeer {
            namespace_selector: Some(monitoring.clone()),
            ..NetworkPolicyPeer::default()
        });
    }
    let network_policy = settings.network_policy.then(|| NetworkPolicy {
        metadata: meta(&names.network_policy),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some(selector.clone()),
                match_expressions: None,
            }),
            policy_types: Some(vec!["Ingress".to_owned()]),
            // One rule, for the config port only: the data port takes no in-cluster traffic,
            // requests arrive through the outbound tunnel.
            ingress: Some(vec![NetworkPolicyIngressRule {
                from: Some(peers),
                ports: Some(vec![NetworkPolicyPort {
                    port: Some(IntOrString::Int(CONFIG_PORT)),
                    protocol: Some("TCP".to_owned()),
                    end_port: None,
                }]),
            }]),
            egress: None,
        }),
    });

    let autoscaler = autoscaling.map(|(min, max, target, metric)| HorizontalPodAutoscaler {
        metadata: meta(&names.autoscaler),
        spec: HorizontalPodAutoscalerSpec {
            scale_target_ref: CrossVersionObjectReference {
                api_version: Some("apps/v1".to_owned()),
                kind: "Deployment".to_owned(),
                name: names.deployment.clone(),
            },
            min_replicas: Some(min),
            max_replicas: max,
            metrics: Some(vec![MetricSpec {
                type_: "Pods".to_owned(),
                pods: Some(PodsMetricSource {
                    metric: MetricIdentifier {
                        name: metric,
                        selector: None,
                    },
                    target: MetricTarget {
                        type_: "AverageValue".to_owned(),
                        average_value: Some(Quantity(target.to_string())),
                        ..MetricTarget::default()
                    },
                }),
                ..MetricSpec::default()
            }]),
            behavior: None,
        },
        status: None,
    });

    let auth_secret = credentials.auth_generated.then(|| Secret {
        metadata: meta(&names.auth_secret),
        type_: Some("Opaque".to_owned()),
        data: Some(BTreeMap::from([(
            credentials.auth_ref.key.clone(),
            ByteString(credentials.auth_token.as_bytes().to_vec()),
        )])),
        ..Secret::default()
    });

    Ok(DataPlane {
        address: tunnel_hostname(credentials.tunnel.tunnel_id()),
        names,
        deployment,
        service,
        network_policy,
        autoscaler,
        auth_secret,
    })
}

fn pod_spec(
    image: String,
    image_pull_policy: Option<String>,
    credentials: &Credentials,
    config: &GatewayConfig,
    grace: u32,
    extra_env: &[(String, String)],
    selector: &BTreeMap<String, String>,
) -> PodSpec {
    let env = |name: &str, value: &str| EnvVar {
        name: name.to_owned(),
        value: Some(value.to_owned()),
        value_from: None,
    };
    let from_secret = |name: &str, selector: &SecretKeySelector| EnvVar {
        name: name.to_owned(),
        value: None,
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(selector.clone()),
            ..EnvVarSource::default()
        }),
    };
    let probe = |path: &str, period: i32, failures: i32| Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.to_owned()),
            port: IntOrString::String("config".to_owned()),
            scheme: Some("HTTP".to_owned()),
            ..HTTPGetAction::default()
        }),
        period_seconds: Some(period),
        failure_threshold: Some(failures),
        timeout_seconds: Some(2),
        ..Probe::default()
    };
    PodSpec {
        // The proxy never talks to the API server; the controller pushes to it.
        automount_service_account_token: Some(false),
        termination_grace_period_seconds: Some(i64::from(grace) + SHUTDOWN_MARGIN_SECONDS),
        // The image's own non-root user (a numeric USER, which the kubelet checks against
        // runAsNonRoot), with no UID or GID of ours: OpenShift's restricted-v2 SCC refuses pods
        // asking for one outside the namespace's range and assigns its own.
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".to_owned(),
                localhost_profile: None,
            }),
            ..PodSecurityContext::default()
        }),
        containers: vec![Container {
            name: "proxy".to_owned(),
            image: Some(image),
            image_pull_policy,
            env: Some(
                [
                    from_secret(TUNNEL_TOKEN_ENV, &credentials.tunnel_ref),
                    from_secret(AUTH_TOKEN_ENV, &credentials.auth_ref),
                    env(GRACE_PERIOD_ENV, &format!("{grace}s")),
                    env(CONFIG_ADDR_ENV, &format!(":{CONFIG_PORT}")),
                ]
                .into_iter()
                .chain(extra_env.iter().map(|(name, value)| env(name, value)))
                .collect(),
            ),
            ports: Some(vec![ContainerPort {
                name: Some("config".to_owned()),
                container_port: CONFIG_PORT,
                protocol: Some("TCP".to_owned()),
                ..ContainerPort::default()
            }]),
            // Ready means: a config is loaded and a tunnel connection is registered now.
            readiness_probe: Some(probe("/readyz", 5, 2)),
            liveness_probe: Some(probe("/healthz", 10, 3)),
            resources: Some(
                config
                    .spec
                    .resources
                    .clone()
                    .unwrap_or_else(default_resources),
            ),
            security_context: Some(SecurityContext {
                allow_privilege_escalation: Some(false),
                read_only_root_filesystem: Some(true),
                capabilities: Some(Capabilities {
                    drop: Some(vec!["ALL".to_owned()]),
                    add: None,
                }),
                ..SecurityContext::default()
            }),
            ..Container::default()
        }],
        image_pull_secrets: config.spec.image_pull_secrets.clone(),
        node_selector: config.spec.node_selector.clone(),
        tolerations: config.spec.tolerations.clone(),
        affinity: config.spec.affinity.clone(),
        priority_class_name: config.spec.priority_class_name.clone(),
        topology_spread_constraints: Some(topology_spread(selector)),
        ..PodSpec::default()
    }
}

/// Replicas on different nodes, and zones, where the scheduler can: one going away takes one
/// connector of the tunnel, not all. The chart's default for the shared pool
/// (`spreadAcrossNodes`), key for key: never leaves a pod unscheduled (`ScheduleAnyway`), counts
/// the plane's own pods (`selector`) per ReplicaSet, so a rollout's old pods do not skew where
/// the new ones go. Constraints replace the scheduler's own spreading, which covers both keys.
fn topology_spread(selector: &BTreeMap<String, String>) -> Vec<TopologySpreadConstraint> {
    SPREAD_TOPOLOGY_KEYS
        .iter()
        .map(|key| TopologySpreadConstraint {
            max_skew: 1,
            topology_key: (*key).to_owned(),
            when_unsatisfiable: "ScheduleAnyway".to_owned(),
            match_label_keys: Some(vec!["pod-template-hash".to_owned()]),
            label_selector: Some(LabelSelector {
                match_labels: Some(selector.clone()),
                match_expressions: None,
            }),
            ..TopologySpreadConstraint::default()
        })
        .collect()
}

/// The Gateway as controlling owner, so the rendered objects are deleted with it. A Gateway
/// read from a manifest has no uid yet; its objects then carry no owner.
fn owner_reference(gateway: &Gateway) -> Option<OwnerReference> {
    Some(OwnerReference {
        api_version: "gateway.networking.k8s.io/v1".to_owned(),
        kind: "Gateway".to_owned(),
        name: gateway.metadata.name.clone()?,
        uid: gateway.metadata.uid.clone().filter(|u| !u.is_empty())?,
        controller: Some(true),
        block_owner_deletion: Some(true),
    })
}

/// The proxy container's resources where the GatewayConfig sets none: requests, so the pods are
/// not the first a node under memory pressure evicts (as with none at all), and no limits,
/// since a CPU limit throttles a proxy under load and a memory limit depends on its routes and
/// streams. The Go controller requested the same (and limited to 500m and 512Mi).
fn default_resources() -> ResourceRequirements {
    ResourceRequirements {
        requests: Some(BTreeMap::from([
            ("cpu".to_owned(), Quantity("100m".to_owned())),
            ("memory".to_owned(), Quantity("128Mi".to_owned())),
        ])),
        ..ResourceRequirements::default()
    }
}

/// Of a Gateway's infrastructure labels, those its plane's objects and pods carry: the
/// [`tenant_keys`], less the two the Helm chart selects its shared proxy pool by (its Service,
/// disruption budget, network policies, Deployment and ServiceMonitor). A plane's pods carry
/// the pool's `app.kubernetes.io/name` ([`PROXY_POD_LABEL`]), which wins a clash; given the
/// release's `app.kubernetes.io/instance` too, a plane in the release namespace would join the
/// pool: pushed the pool's config with the pool's token, counted by its budget and autoscaler,
/// held to its policies.
fn tenant_labels(labels: BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut labels = tenant_keys(labels);
    labels.retain(|key, _| key != "app.kubernetes.io/instance" && key != PROXY_POD_LABEL.0);
    labels
}

/// Of a Gateway's infrastructure labels or annotations, those its plane's objects carry: not
/// keys of this controller's own (`cf.k8s.lex.la/...`: the tunnel a plane runs on, its proof,
/// a move under way), which only the controller writes and reads back, nor keys the
/// Deployment controller writes on the objects (`deployment.kubernetes.io/...`: set by the
/// render, they would be written back by each in turn, every time taken for drift).
fn tenant_keys(mut keys: BTreeMap<String, String>) -> BTreeMap<String, String> {
    keys.retain(|key, _| {
        let prefix = key.split_once('/').map_or("", |(prefix, _)| prefix);
        let group = crate::snapshot::GATEWAY_CONFIG_GROUP;
        let ours = prefix == group
            || prefix
                .strip_suffix(group)
                .is_some_and(|sub| sub.ends_with('.'));
        !ours && prefix != "deployment.kubernetes.io"
    });
    keys
}
