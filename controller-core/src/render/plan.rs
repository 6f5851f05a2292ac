//! Every dedicated data plane of a snapshot, rendered once: the translation accepts a Gateway,
//! and takes its tunnel, from this render ([`crate::translate::translate_with`]), and the
//! runtime applies the same objects, so the two cannot disagree.
//! See docs/design/one-render-per-round.md.

use std::collections::BTreeMap;

use gateway_api::experimental::gateways::Gateway;

use super::{render, resolve_with, Credentials, DataPlane, RenderError, RenderSettings};
use crate::snapshot::{ObjectKey, Snapshot, GATEWAY_CONFIG_GROUP, GATEWAY_CONFIG_KIND};

/// A Gateway's dedicated data plane as rendered from one snapshot: the credentials it was
/// rendered with and its objects.
#[derive(Debug, Clone, PartialEq)]
pub struct Rendered {
    pub credentials: Credentials,
    pub plane: DataPlane,
    /// `spec.access` of the GatewayConfig, checked: the requirement every rule of the
    /// Gateway's routes carries unless the rule names its own.
    pub access: Option<cftunnel_config::Access>,
}

/// The dedicated data planes of one snapshot, by Gateway: every Gateway whose
/// `infrastructure.parametersRef` names a `GatewayConfig`, rendered or with why it cannot be.
pub type Plans = BTreeMap<ObjectKey, Result<Rendered, RenderError>>;

/// Renders the dedicated data plane of every Gateway in `snapshot` whose
/// `infrastructure.parametersRef` names a `GatewayConfig`, with `settings`, each once.
///
/// `fresh_token` gives a new config-API token for a Gateway, drawn by the caller (this crate
/// has no random source); it is asked only for a Gateway whose generated token Secret holds no
/// token yet, so what it is asked for says which those are.
///
/// Gateways of classes the controller does not own are rendered too when they name a
/// `GatewayConfig` (nothing reads those renders): ownership is the translation's to judge.
///
/// # Errors
/// Per Gateway, in its entry: the `GatewayConfig` is not in the snapshot, or [`resolve`] or
/// [`render`] fails; a Gateway whose generated token Secret does not exist yet, and for which
/// `fresh_token` gives none, fails with [`RenderError::Random`].
///
/// [`resolve`]: super::resolve
pub fn plan(
    snapshot: &Snapshot,
    settings: &RenderSettings,
    fresh_token: impl FnMut(&ObjectKey) -> Option<String>,
) -> Plans {
    plan_by(snapshot, settings, fresh_token)
}

/// [`plan`] for planes that are looked at, never applied (the offline translation): a
/// generated token Secret that does not exist yet is rendered with an empty token, whose value
/// decides nothing the translation reads.
pub(crate) fn plan_unapplied(snapshot: &Snapshot, settings: &RenderSettings) -> Plans {
    plan_by(snapshot, settings, |_| Some(String::new()))
}

fn plan_by(
    snapshot: &Snapshot,
    settings: &RenderSettings,
    mut fresh_token: impl FnMut(&ObjectKey) -> Option<String>,
) -> Plans {
    snapshot
        .gateways
        .iter()
        .filter_map(|gw| {
            let key = ObjectKey::new(
                gw.metadata.namespace.as_deref()?,
                gw.metadata.name.as_deref()?,
            );
            let config = config_name(gw)?;
            let rendered = plan_one(gw, &key, config, snapshot, settings, || fresh_token(&key));
            Some((key, rendered))
        })
        .collect()
}

/// The `GatewayConfig` a Gateway's `infrastructure.parametersRef` names, if it names one.
pub fn config_name(gateway: &Gateway) -> Option<&str> {
    gateway
        .spec
        .infrastructure
        .as_ref()
        .and_then(|i| i.parameters_ref.as_ref())
        .filter(|r| r.group == GATEWAY_CONFIG_GROUP && r.kind == GATEWAY_CONFIG_KIND)
        .map(|r| r.name.as_str())
}

fn plan_one(
    gateway: &Gateway,
    key: &ObjectKey,
    config_name: &str,
    snapshot: &Snapshot,
    settings: &RenderSettings,
    fresh_token: impl FnOnce() -> Option<String>,
) -> Result<Rendered, RenderError> {
    let config = snapshot
        .gateway_configs
        .iter()
        .find(|c| {
            c.metadata.namespace.as_deref() == Some(key.namespace.as_str())
                && c.metadata.name.as_deref() == Some(config_name)
        })
        .ok_or_else(|| {
            let (namespace, name) = (key.namespace.clone(), config_name.to_owned());
            match snapshot
                .unreadable_gateway_configs
                .iter()
                .find(|u| u.namespace == namespace && u.name == name)
            {
                Some(unreadable) => RenderError::ConfigUnreadable {
                    namespace,
                    name,
                    error: unreadable.error.clone(),
                },
                None => RenderError::ConfigNotFound { namespace, name },
            }
        })?;
    let access = config
        .spec
        .access
        .as_ref()
        .map(|a| {
            a.to_document()
                .map_err(|invalid| RenderError::InvalidAccess {
                    config: format!("{}/{config_name}", key.namespace),
                    field: invalid.field,
                    message: invalid.message,
                })
        })
        .transpose()?;
    let credentials = resolve_with(gateway, config, &snapshot.secrets, fresh_token)?;
    let plane = render(gateway, config, &credentials, settings)?;
    Ok(Rendered {
        credentials,
        plane,
        access,
    })
}
