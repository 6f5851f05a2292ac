//! A Gateway's backend client certificate (`spec.tls.backend.clientCertificateRef`): the
//! Secret it names, resolved and checked with the config contract, and the Gateway's
//! `ResolvedRefs` condition about it.
//!
//! The certificate is presented to every backend the Gateway's routes reach over TLS (those a
//! BackendTLSPolicy covers, and Service ports that ask for TLS themselves) when the backend
//! asks for one.

use cftunnel_config::{valid, ClientCertificate};
use gateway_api::experimental::gateways::Gateway;

use super::status::{Condition, ConditionType, Reason};
use super::{Index, ObjectKey};

/// The keys of a `kubernetes.io/tls` Secret.
const CERT_KEY: &str = "tls.crt";
const KEY_KEY: &str = "tls.key";

/// The client certificate a Gateway presents, and the Secret it comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct GatewayClientCertificate {
    pub(super) secret: ObjectKey,
    pub(super) certificate: ClientCertificate,
}

/// The Gateway's client certificate (`None` when it names none), or the `ResolvedRefs`
/// reason and message of why it cannot be used. A cross-namespace Secret needs a
/// ReferenceGrant from the Gateway's namespace.
pub(super) fn resolve(
    gw: &Gateway,
    namespace: &str,
    index: &Index<'_>,
) -> Option<Result<GatewayClientCertificate, (Reason, String)>> {
    const FIELD: &str = "spec.tls.backend.clientCertificateRef";
    let r = gw
        .spec
        .tls
        .as_ref()?
        .backend
        .as_ref()?
        .client_certificate_ref
        .as_ref()?;
    let invalid = |message: String| Some(Err((Reason::InvalidClientCertificateRef, message)));
    let group = r.group.as_deref().unwrap_or("");
    let kind = r.kind.as_deref().unwrap_or("Secret");
    if !group.is_empty() || kind != "Secret" {
        let group = if group.is_empty() { "core" } else { group };
        return invalid(format!(
            "{FIELD}: unsupported kind {group}/{kind} (a core Secret)"
        ));
    }
    let target_ns = r.namespace.as_deref().unwrap_or(namespace);
    if target_ns != namespace
        && !index.reference_granted("Gateway", namespace, "", "Secret", target_ns, &r.name)
    {
        return Some(Err((
            Reason::RefNotPermitted,
            format!(
                "{FIELD}: reference to Secret {target_ns}/{} is not permitted by a ReferenceGrant",
                r.name
            ),
        )));
    }
    let Some(secret) = index.secrets.get(&(target_ns, r.name.as_str())) else {
        return invalid(format!("{FIELD}: Secret {target_ns}/{} not found", r.name));
    };
    let text = |key: &str| {
        crate::render::secret_value(secret, key)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .filter(|s| !s.is_empty())
    };
    let (Some(chain), Some(key)) = (text(CERT_KEY), text(KEY_KEY)) else {
        return invalid(format!(
            "{FIELD}: Secret {target_ns}/{} lacks {CERT_KEY} or {KEY_KEY}",
            r.name
        ));
    };
    let certificate = ClientCertificate {
        certificate_chain: chain,
        private_key: key,
    };
    // The check the proxy makes before it uses the certificate.
    if let Err(e) = valid::ClientIdentity::new(&certificate) {
        let key = if e.field.ends_with("privateKey") {
            KEY_KEY
        } else {
            CERT_KEY
        };
        return invalid(format!(
            "{FIELD}: {key} of Secret {target_ns}/{}: {}",
            r.name, e.message
        ));
    }
    Some(Ok(GatewayClientCertificate {
        secret: ObjectKey::new(target_ns, &r.name),
        certificate,
    }))
}

/// The Gateway's `ResolvedRefs` condition about its client certificate.
pub(super) fn condition(
    resolved: &Result<GatewayClientCertificate, (Reason, String)>,
    generation: Option<i64>,
) -> Condition {
    match resolved {
        Ok(_) => Condition::new(
            ConditionType::ResolvedRefs,
            true,
            Reason::ResolvedRefs,
            "",
            generation,
        ),
        Err((reason, message)) => Condition::new(
            ConditionType::ResolvedRefs,
            false,
            *reason,
            message.clone(),
            generation,
        ),
    }
}
