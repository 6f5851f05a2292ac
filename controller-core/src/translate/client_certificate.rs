//! A Gateway's backend client certificate (`spec.tls.backend.clientCertificateRef`): the
//! Secret it names, resolved and checked with the config contract, and the Gateway's
//! `ResolvedRefs` condition about it; and how any Secret reference of a Gateway to a
//! certificate and key resolves ([`resolve_tls_secret`], also for listeners' certificates).
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
/// The type of a Secret holding a certificate and its key.
const TLS_SECRET_TYPE: &str = "kubernetes.io/tls";

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
    let r = gw
        .spec
        .tls
        .as_ref()?
        .backend
        .as_ref()?
        .client_certificate_ref
        .as_ref()?;
    Some(resolve_tls_secret(
        &SecretRef {
            field: "spec.tls.backend.clientCertificateRef",
            from_kind: "Gateway",
            group: r.group.as_deref(),
            kind: r.kind.as_deref(),
            name: &r.name,
            namespace: r.namespace.as_deref(),
        },
        namespace,
        Reason::InvalidClientCertificateRef,
        false,
        index,
    ))
}

/// A Gateway's reference to a Secret holding a certificate and its key (a listener's
/// `tls.certificateRefs[]`, `tls.backend.clientCertificateRef`).
pub(super) struct SecretRef<'a> {
    /// Where the reference is written, for messages.
    pub(super) field: &'a str,
    /// The kind of the object it is written in (`Gateway`, `ListenerSet`), as ReferenceGrants
    /// name where a reference comes from.
    pub(super) from_kind: &'a str,
    pub(super) group: Option<&'a str>,
    pub(super) kind: Option<&'a str>,
    pub(super) name: &'a str,
    pub(super) namespace: Option<&'a str>,
}

/// The certificate and key a Gateway in `namespace` names, or the `ResolvedRefs` reason and
/// message of why they cannot be used: `invalid` for a kind other than a core Secret, a Secret
/// that is missing, lacks `tls.crt` or `tls.key`, or holds a chain and key the proxy would
/// refuse (the config contract's check); with `tls_type`, also for a Secret not of type
/// `kubernetes.io/tls`. A Secret of another namespace needs a ReferenceGrant from the
/// Gateway's (`RefNotPermitted`), checked before it is looked up, so a Gateway learns nothing
/// of Secrets it may not use.
pub(super) fn resolve_tls_secret(
    r: &SecretRef<'_>,
    namespace: &str,
    invalid: Reason,
    tls_type: bool,
    index: &Index<'_>,
) -> Result<GatewayClientCertificate, (Reason, String)> {
    let field = r.field;
    let fail = |message: String| Err((invalid, message));
    let group = r.group.unwrap_or("");
    let kind = r.kind.unwrap_or("Secret");
    if !group.is_empty() || kind != "Secret" {
        let group = if group.is_empty() { "core" } else { group };
        return fail(format!(
            "{field}: unsupported kind {group}/{kind} (a core Secret)"
        ));
    }
    let target_ns = r.namespace.unwrap_or(namespace);
    if target_ns != namespace
        && !index.reference_granted(r.from_kind, namespace, "", "Secret", target_ns, r.name)
    {
        return Err((
            Reason::RefNotPermitted,
            format!(
                "{field}: reference to Secret {target_ns}/{} is not permitted by a ReferenceGrant",
                r.name
            ),
        ));
    }
    let Some(secret) = index.secrets.get(&(target_ns, r.name)) else {
        return fail(format!("{field}: Secret {target_ns}/{} not found", r.name));
    };
    if tls_type && secret.type_.as_deref() != Some(TLS_SECRET_TYPE) {
        return fail(format!(
            "{field}: Secret {target_ns}/{} is not of type {TLS_SECRET_TYPE}",
            r.name
        ));
    }
    let text = |key: &str| {
        crate::render::secret_value(secret, key)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .filter(|s| !s.is_empty())
    };
    let (Some(chain), Some(key)) = (text(CERT_KEY), text(KEY_KEY)) else {
        return fail(format!(
            "{field}: Secret {target_ns}/{} lacks {CERT_KEY} or {KEY_KEY}",
            r.name
        ));
    };
    let certificate = ClientCertificate {
        certificate_chain: chain,
        private_key: key,
    };
    // The check the proxy makes before it uses a certificate.
    if let Err(e) = valid::ClientIdentity::new(&certificate) {
        let key = if e.field.ends_with("privateKey") {
            KEY_KEY
        } else {
            CERT_KEY
        };
        return fail(format!(
            "{field}: {key} of Secret {target_ns}/{}: {}",
            r.name, e.message
        ));
    }
    Ok(GatewayClientCertificate {
        secret: ObjectKey::new(target_ns, r.name),
        certificate,
    })
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
