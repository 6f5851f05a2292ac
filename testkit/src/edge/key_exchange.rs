//! The key-exchange groups the test edge accepts: all of rustls' (aws-lc-rs) by default, or
//! a chosen few, to stand for an edge without post-quantum key exchange.

use std::sync::Arc;

use crate::pki::PkiError;

/// A key-exchange group rustls implements, by its name as rustls prints it
/// (`X25519MLKEM768`, `X25519`, `secp256r1`, ...; case-insensitive).
pub fn key_exchange_group_by_name(name: &str) -> Option<rustls::NamedGroup> {
    rustls::crypto::aws_lc_rs::ALL_KX_GROUPS
        .iter()
        .map(|g| g.name())
        .find(|g| format!("{g:?}").eq_ignore_ascii_case(name))
}

/// The provider restricted to `groups`, in that order; every group must be
/// one aws-lc-rs implements.
pub(super) fn provider_with_groups(
    groups: &[rustls::NamedGroup],
) -> Result<Arc<rustls::crypto::CryptoProvider>, PkiError> {
    let kx_groups = groups
        .iter()
        .map(|name| {
            rustls::crypto::aws_lc_rs::ALL_KX_GROUPS
                .iter()
                .find(|g| g.name() == *name)
                .copied()
                .ok_or_else(|| PkiError::Config(format!("unsupported key-exchange group {name:?}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    if kx_groups.is_empty() {
        return Err(PkiError::Config("no key-exchange group".into()));
    }
    Ok(Arc::new(rustls::crypto::CryptoProvider {
        kx_groups,
        ..rustls::crypto::aws_lc_rs::default_provider()
    }))
}
