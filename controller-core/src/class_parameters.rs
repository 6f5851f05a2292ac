//! The class-level settings the shared data plane runs with: the controller's flags, overridden
//! by the `GatewayClassConfig` ([`crate::gateway_class_config`]) an owned GatewayClass's
//! `spec.parametersRef` names.
//!
//! [`settle`] is the pure part: which config the shared plane takes, whether it resolves, the
//! conditions of every config, and the `InvalidParameters` of every class that cannot be
//! accepted. There is one shared plane per controller, so its classes must agree: the oldest
//! class naming a config picks it; one naming another is refused.

use std::collections::BTreeMap;
use std::sync::Arc;

use cftunnel_config::{check_account_tag, Token, ACCOUNT_TAG_RULE};
use gateway_api::experimental::gatewayclasses::GatewayClass;
use k8s_openapi::api::core::v1::Secret;

use crate::gateway_class_config::{
    GatewayClassConfig, SecretReference, ACCOUNT_ID_KEY, GATEWAY_CLASS_CONFIG_KIND,
    SECRETS_RESOLVED_CONDITION, VALID_CONDITION,
};
use crate::gateway_config::{DEFAULT_API_TOKEN_KEY, DEFAULT_TUNNEL_TOKEN_KEY};
use crate::snapshot::{ObjectKey, Snapshot, GATEWAY_CONFIG_GROUP};

/// What the flags give when no class config overrides them.
#[derive(Debug, Clone, Default)]
pub struct ClassDefaults {
    /// Where Secret references without a namespace point: the controller's namespace.
    pub namespace: String,
    /// `--shared-tunnel-secret`: the Secret and key of the class tunnel's connector token.
    pub tunnel_secret: Option<(ObjectKey, String)>,
    /// `--cloudflare-api-token`.
    pub api_token: Option<String>,
    /// The namespace of the shared pool the controller points at the class tunnel's token
    /// Secret (`--shared-deployment`): its pods read only Secrets of their own namespace, so a
    /// `tunnelTokenSecretRef` elsewhere cannot be used.
    pub pool_namespace: Option<String>,
}

/// The class tunnel and credentials the shared plane runs with.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClassSettings {
    /// The GatewayClassConfig they come from, if one is in use.
    pub config: Option<String>,
    /// The class tunnel's connector token: its identity and the shared Gateways' address.
    pub tunnel_token: Option<Token>,
    /// The Secret and key that token is read from: the class config's
    /// `tunnelTokenSecretRef`, else `--shared-tunnel-secret`. The shared pool's pods read
    /// their token there.
    pub tunnel_secret: Option<(ObjectKey, String)>,
    /// The class tunnel, from `tunnelID` or the token.
    pub tunnel_id: Option<uuid::Uuid>,
    /// Its account, from `accountId`, the credentials Secret or the token.
    pub account_id: Option<String>,
    /// The Cloudflare API token for the class tunnel and dedicated planes naming none.
    pub api_token: Option<String>,
    /// Why the class config in use does not resolve: nothing is written with the flags'
    /// settings instead, as they may name another account or tunnel.
    pub held: Option<String>,
}

/// One GatewayClassConfig's verdict, for its status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigVerdict {
    pub generation: Option<i64>,
    /// Why a Secret it names cannot be read; empty when all can.
    pub secret_problems: Vec<String>,
    /// Every problem, Secrets' included; empty when valid.
    pub problems: Vec<String>,
}

impl ConfigVerdict {
    /// Its `SecretsResolved` and `Valid` conditions (type, status, reason, message), as the
    /// Go controller reports them.
    pub fn conditions(&self) -> [(&'static str, bool, &'static str, String); 2] {
        let secrets = match self.secret_problems.as_slice() {
            [] => (
                SECRETS_RESOLVED_CONDITION,
                true,
                "SecretsFound",
                "All referenced secrets exist and contain required keys".to_owned(),
            ),
            problems => (
                SECRETS_RESOLVED_CONDITION,
                false,
                "SecretsMissing",
                problems.join("; "),
            ),
        };
        let valid = match self.problems.as_slice() {
            [] => (
                VALID_CONDITION,
                true,
                "Valid",
                "Configuration is valid".to_owned(),
            ),
            [one] => (VALID_CONDITION, false, "Invalid", one.clone()),
            [first, rest @ ..] => (
                VALID_CONDITION,
                false,
                "Invalid",
                format!("{first} (and {} more errors)", rest.len()),
            ),
        };
        [secrets, valid]
    }
}

/// What [`settle`] decides.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClassParameters {
    /// The shared plane's settings.
    pub shared: ClassSettings,
    /// Owned GatewayClasses whose `parametersRef` cannot be used, with why: their `Accepted`
    /// is False (`InvalidParameters`).
    pub refused: BTreeMap<String, String>,
    /// Every GatewayClassConfig of the snapshot by name, with its verdict.
    pub configs: BTreeMap<String, ConfigVerdict>,
}

/// Settles the class-level settings of the controller named `controller_name`: see the module
/// docs. Pure; the Secrets are the snapshot's.
pub fn settle(
    snapshot: &Snapshot,
    controller_name: &str,
    defaults: &ClassDefaults,
) -> ClassParameters {
    let configs: BTreeMap<&str, &GatewayClassConfig> = snapshot
        .gateway_class_configs
        .iter()
        .map(Arc::as_ref)
        .filter_map(|c| Some((c.metadata.name.as_deref()?, c)))
        .collect();
    let resolved: BTreeMap<&str, (ConfigVerdict, ClassSettings)> = configs
        .iter()
        .map(|(name, config)| (*name, resolve(config, &snapshot.secrets, defaults)))
        .collect();

    let mut classes: Vec<&GatewayClass> = snapshot
        .gateway_classes
        .iter()
        .map(Arc::as_ref)
        .filter(|c| c.spec.controller_name == controller_name && c.metadata.name.is_some())
        .collect();
    classes.sort_by(|a, b| {
        let key = |c: &GatewayClass| {
            let created = c.metadata.creation_timestamp.clone();
            (created.is_none(), created, c.metadata.name.clone())
        };
        key(a).cmp(&key(b))
    });

    let mut refused = BTreeMap::new();
    let mut chosen: Option<(&str, &str)> = None;
    for class in classes {
        let class_name = class.metadata.name.as_deref().unwrap_or_default();
        let Some(p) = &class.spec.parameters_ref else {
            continue;
        };
        if p.group != GATEWAY_CONFIG_GROUP || p.kind != GATEWAY_CLASS_CONFIG_KIND {
            refused.insert(
                class_name.to_owned(),
                format!(
                    "spec.parametersRef must name a {GATEWAY_CONFIG_GROUP}/{GATEWAY_CLASS_CONFIG_KIND}, not {}/{}",
                    if p.group.is_empty() { "core" } else { &p.group },
                    p.kind
                ),
            );
            continue;
        }
        match chosen {
            Some((config, by)) if config != p.name => {
                refused.insert(
                    class_name.to_owned(),
                    format!(
                        "spec.parametersRef names {GATEWAY_CLASS_CONFIG_KIND} {}, but the shared data plane takes its settings from {config}, named by GatewayClass {by} (older, or first by name): the classes of one controller share one data plane and must name the same {GATEWAY_CLASS_CONFIG_KIND} or none",
                        p.name
                    ),
                );
                continue;
            }
            Some(_) => {}
            None => chosen = Some((p.name.as_str(), class_name)),
        }
        match resolved.get(p.name.as_str()) {
            None => {
                refused.insert(
                    class_name.to_owned(),
                    format!(
                        "{GATEWAY_CLASS_CONFIG_KIND} {} (spec.parametersRef) not found",
                        p.name
                    ),
                );
            }
            Some((verdict, _)) if !verdict.problems.is_empty() => {
                refused.insert(
                    class_name.to_owned(),
                    format!(
                        "{GATEWAY_CLASS_CONFIG_KIND} {} (spec.parametersRef) is not valid: {}",
                        p.name,
                        verdict.problems.join("; ")
                    ),
                );
            }
            Some(_) => {}
        }
    }

    let shared = match chosen {
        None => ClassSettings {
            tunnel_secret: defaults.tunnel_secret.clone(),
            tunnel_token: defaults
                .tunnel_secret
                .as_ref()
                .and_then(|(key, field)| secret_text(&snapshot.secrets, key, field))
                .and_then(|t| t.parse::<Token>().ok()),
            api_token: defaults.api_token.clone(),
            ..ClassSettings::default()
        }
        .completed(),
        Some((name, by)) => match resolved.get(name) {
            Some((verdict, settings)) if verdict.problems.is_empty() => settings.clone(),
            Some((verdict, _)) => ClassSettings {
                config: Some(name.to_owned()),
                held: Some(format!(
                    "{GATEWAY_CLASS_CONFIG_KIND} {name} of GatewayClass {by} is not valid: {}",
                    verdict.problems.join("; ")
                )),
                ..ClassSettings::default()
            },
            None => ClassSettings {
                config: Some(name.to_owned()),
                held: Some(format!(
                    "{GATEWAY_CLASS_CONFIG_KIND} {name} of GatewayClass {by} not found"
                )),
                ..ClassSettings::default()
            },
        },
    };
    ClassParameters {
        shared,
        refused,
        configs: resolved
            .into_iter()
            .map(|(name, (verdict, _))| (name.to_owned(), verdict))
            .collect(),
    }
}

impl ClassSettings {
    /// Fills the tunnel id and account from the connector token where unset.
    fn completed(mut self) -> Self {
        if let Some(token) = &self.tunnel_token {
            self.tunnel_id.get_or_insert(token.tunnel_id());
            self.account_id
                .get_or_insert_with(|| token.account_tag().to_owned());
        }
        self
    }
}

/// A Secret key's text, trimmed as tokens are.
fn secret_text(secrets: &[Arc<Secret>], key: &ObjectKey, field: &str) -> Option<String> {
    crate::render::secret_text(secrets, &key.namespace, &key.name, field)
}

/// Where a Secret reference points: its namespace (the class default when unset or empty) and
/// its key (`default_key` when unset or empty).
fn located<'a>(
    r: &'a SecretReference,
    defaults: &'a ClassDefaults,
    default_key: &'a str,
) -> (&'a str, &'a str) {
    let namespace = r
        .namespace
        .as_deref()
        .filter(|n| !n.is_empty())
        .unwrap_or(&defaults.namespace);
    let key = r
        .key
        .as_deref()
        .filter(|k| !k.is_empty())
        .unwrap_or(default_key);
    (namespace, key)
}

/// One config's verdict, and the settings it gives over `defaults` when valid.
fn resolve(
    config: &GatewayClassConfig,
    secrets: &[Arc<Secret>],
    defaults: &ClassDefaults,
) -> (ConfigVerdict, ClassSettings) {
    let spec = &config.spec;
    let mut secret_problems = Vec::new();
    let mut problems = Vec::new();
    let mut read = |field: &str, r: &SecretReference, default_key: &str| -> Option<String> {
        let (namespace, key) = located(r, defaults, default_key);
        match crate::render::read_secret_text(secrets, namespace, &r.name, key) {
            Ok(text) => return Some(text),
            Err(e) => secret_problems.push(format!("spec.{field}: {e}")),
        }
        None
    };
    let credentials = spec.cloudflare_credentials_secret_ref.as_ref();
    let api_token =
        credentials.and_then(|r| read("cloudflareCredentialsSecretRef", r, DEFAULT_API_TOKEN_KEY));
    let tunnel_text = spec
        .tunnel_token_secret_ref
        .as_ref()
        .and_then(|r| read("tunnelTokenSecretRef", r, DEFAULT_TUNNEL_TOKEN_KEY));
    problems.extend(secret_problems.iter().cloned());
    let tunnel_secret = match &spec.tunnel_token_secret_ref {
        Some(r) => {
            let (namespace, key) = located(r, defaults, DEFAULT_TUNNEL_TOKEN_KEY);
            if let Some(pool) = defaults
                .pool_namespace
                .as_deref()
                .filter(|p| *p != namespace)
            {
                problems.push(format!(
                    "spec.tunnelTokenSecretRef: Secret {namespace}/{} is not in namespace {pool}, \
                     whose Secrets alone the shared proxy pool's pods can read",
                    r.name
                ));
            }
            Some((ObjectKey::new(namespace, &r.name), key.to_owned()))
        }
        None => defaults.tunnel_secret.clone(),
    };
    let secret_account = credentials.and_then(|r| {
        let (namespace, _) = located(r, defaults, ACCOUNT_ID_KEY);
        let account = secret_text(secrets, &ObjectKey::new(namespace, &r.name), ACCOUNT_ID_KEY)?;
        Some((
            account,
            format!(
                "spec.cloudflareCredentialsSecretRef: the {ACCOUNT_ID_KEY:?} key of Secret {namespace}/{}",
                r.name
            ),
        ))
    });
    let tunnel_token = match tunnel_text.map(|t| t.parse::<Token>()) {
        Some(Ok(token)) => Some(token),
        Some(Err(e)) => {
            problems.push(format!(
                "spec.tunnelTokenSecretRef: not a tunnel connector token: {e}"
            ));
            None
        }
        None if spec.tunnel_token_secret_ref.is_none() => defaults
            .tunnel_secret
            .as_ref()
            .and_then(|(key, field)| secret_text(secrets, key, field))
            .and_then(|t| t.parse::<Token>().ok()),
        None => None,
    };
    let tunnel_id = match spec.tunnel_id.as_deref().filter(|t| !t.is_empty()) {
        None => None,
        Some(id) => match id.parse::<uuid::Uuid>() {
            Ok(id) => Some(id),
            Err(e) => {
                problems.push(format!("spec.tunnelID: {id:?} is not a UUID: {e}"));
                None
            }
        },
    };
    let (account_id, account_field) = match spec.account_id.clone().filter(|a| !a.is_empty()) {
        Some(account) => (Some(account), Some("spec.accountId".to_owned())),
        None => secret_account.unzip(),
    };
    // The account is placed in the Cloudflare API's paths.
    if let (Some(account), Some(field)) = (&account_id, &account_field) {
        if check_account_tag(account).is_err() {
            problems.push(format!(
                "{field}: {account:?} is not an account tag ({ACCOUNT_TAG_RULE})"
            ));
        }
    }
    if let Some(token) = &tunnel_token {
        if let Some(id) = tunnel_id.filter(|id| *id != token.tunnel_id()) {
            problems.push(format!(
                "spec.tunnelID {id} is not the tunnel of the connector token ({})",
                token.tunnel_id()
            ));
        }
        if let Some(account) = account_id.as_deref().filter(|a| *a != token.account_tag()) {
            problems.push(format!(
                "the account {account} is not that of the connector token ({})",
                token.account_tag()
            ));
        }
    } else if tunnel_id.is_some() && account_id.is_none() {
        problems.push(format!(
            "spec.tunnelID is set without an account: set spec.accountId, the {ACCOUNT_ID_KEY:?} key of the credentials Secret, or spec.tunnelTokenSecretRef"
        ));
    }
    let settings = ClassSettings {
        config: config.metadata.name.clone(),
        tunnel_token,
        tunnel_secret,
        tunnel_id,
        account_id,
        api_token: api_token.or_else(|| {
            credentials
                .is_none()
                .then(|| defaults.api_token.clone())
                .flatten()
        }),
        held: None,
    }
    .completed();
    (
        ConfigVerdict {
            generation: config.metadata.generation,
            secret_problems,
            problems,
        },
        settings,
    )
}

#[cfg(test)]
mod tests;
