//! A listener's `tls.certificateRefs`, judged as the spec asks although the Cloudflare edge
//! terminates TLS and the data plane never uses the certificates: a listener naming a
//! certificate that cannot be used reports `ResolvedRefs=False` (`InvalidCertificateRef`, or
//! `RefNotPermitted` for a Secret of another namespace no ReferenceGrant allows) and is not
//! programmed, so its routes are not served through it (Gateway API conformance
//! `GatewayInvalidTLSConfiguration`, `GatewaySecretMissingReferenceGrant`).
//!
//! The Secret is resolved by the rule every certificate reference of a Gateway follows
//! ([`client_certificate::resolve_tls_secret`]): a core Secret of type `kubernetes.io/tls`
//! whose `tls.crt` and `tls.key` the config contract accepts as a pair.

use gateway_api::experimental::gateways::GatewayListeners;

use super::client_certificate::{self, SecretRef};
use super::status::Reason;
use super::Index;

/// Why the listener at `position` of a Gateway or ListenerSet (`from_kind`) in `namespace`
/// cannot use its certificates: the first reference that does not resolve, with the
/// `ResolvedRefs` reason. `None` when all resolve, or when it names none (as an HTTP listener
/// does).
pub(super) fn problem(
    listener: &GatewayListeners,
    position: usize,
    namespace: &str,
    from_kind: &str,
    index: &Index<'_>,
) -> Option<(Reason, String)> {
    let refs = listener.tls.as_ref()?.certificate_refs.as_ref()?;
    refs.iter().enumerate().find_map(|(i, r)| {
        let field = format!("spec.listeners[{position}].tls.certificateRefs[{i}]");
        client_certificate::resolve_tls_secret(
            &SecretRef {
                field: &field,
                from_kind,
                group: r.group.as_deref(),
                kind: r.kind.as_deref(),
                name: &r.name,
                namespace: r.namespace.as_deref(),
            },
            namespace,
            Reason::InvalidCertificateRef,
            true,
            index,
        )
        .err()
    })
}
