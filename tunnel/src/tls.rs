//! TLS settings for edge connections, on the connector's side.

use std::sync::Arc;

use rustls::crypto::SupportedKxGroup;
use rustls::RootCertStore;

/// Server name verified on QUIC edge connections.
pub const QUIC_SERVER_NAME: &str = "quic.cftunnel.com";
/// Server name verified on HTTP/2 edge connections.
pub const H2_SERVER_NAME: &str = "h2.cftunnel.com";
/// Server name of edge pre-check probes.
pub const PROBE_SERVER_NAME: &str = "probe.cftunnel.com";
/// ALPN of the QUIC transport (HTTP/2 offers none).
pub const QUIC_ALPN: &[u8] = b"argotunnel";

/// TLS configuration errors.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// The CA override holds no usable certificate.
    #[error("edge CA file contains no usable PEM certificate")]
    NoCertificates,
    /// A PEM block could not be parsed.
    #[error("edge CA file is not valid PEM: {0}")]
    Pem(String),
    /// rustls refused the configuration.
    #[error("tls configuration: {0}")]
    Config(String),
}

/// rustls' aws-lc-rs provider with its defaults: every group and suite it implements. For
/// the edge's side of a connection (a test edge's server configuration); connections the
/// connector dials use the narrower provider of [`edge_key_exchange_groups`].
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// Key-exchange groups the connector offers on edge connections, in order
/// of preference, as `cloudflared` does: hybrid post-quantum X25519MLKEM768,
/// then P-256 in the default mode, and only X25519MLKEM768 in strict
/// post-quantum mode. Plain X25519 is never offered. (`cloudflared` also
/// offers P256Kyber768Draft00, which rustls does not implement.)
pub fn edge_key_exchange_groups(post_quantum: bool) -> Vec<rustls::NamedGroup> {
    edge_kx_groups(post_quantum)
        .iter()
        .map(|g| g.name())
        .collect()
}

fn edge_kx_groups(post_quantum: bool) -> Vec<&'static dyn SupportedKxGroup> {
    use rustls::crypto::aws_lc_rs::kx_group;
    if post_quantum {
        vec![kx_group::X25519MLKEM768]
    } else {
        vec![kx_group::X25519MLKEM768, kx_group::SECP256R1]
    }
}

/// The provider for edge connections: aws-lc-rs restricted to
/// [`edge_key_exchange_groups`], offering [`edge_cipher_suites`].
fn edge_provider(post_quantum: bool) -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::CryptoProvider {
        kx_groups: edge_kx_groups(post_quantum),
        cipher_suites: edge_cipher_suites(),
        ..rustls::crypto::aws_lc_rs::default_provider()
    })
}

/// Cipher suites in the order `cloudflared` offers them (Go's TLS defaults): AES-128-GCM
/// first where the CPU has AES-GCM instructions, ChaCha20-Poly1305 first where it has not;
/// AES-256-GCM, which rustls would put first, is never preferred (and costs four more AES
/// rounds per block on every packet). TLS 1.2 suites, for the HTTP/2 transport only, follow
/// in rustls' order.
fn edge_cipher_suites() -> Vec<rustls::SupportedCipherSuite> {
    use rustls::crypto::aws_lc_rs::cipher_suite::{
        TLS13_AES_128_GCM_SHA256 as AES_128, TLS13_AES_256_GCM_SHA384 as AES_256,
        TLS13_CHACHA20_POLY1305_SHA256 as CHACHA,
    };
    let tls13 = if aes_gcm_in_hardware() {
        [AES_128, AES_256, CHACHA]
    } else {
        [CHACHA, AES_128, AES_256]
    };
    let tls12 = rustls::crypto::aws_lc_rs::DEFAULT_CIPHER_SUITES
        .iter()
        .filter(|s| s.tls13().is_none())
        .copied();
    tls13.into_iter().chain(tls12).collect()
}

/// Whether AES-GCM runs on dedicated instructions, as Go decides it for its defaults.
fn aes_gcm_in_hardware() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("aes")
            && std::arch::is_x86_feature_detected!("pclmulqdq")
    }
    #[cfg(target_arch = "aarch64")]
    {
        std::arch::is_aarch64_feature_detected!("aes")
            && std::arch::is_aarch64_feature_detected!("pmull")
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        false
    }
}

/// Cloudflare's origin CA roots, which edge certificates chain to.
const CLOUDFLARE_ROOTS: &[u8] = include_bytes!("../certs/cloudflare-edge-roots.pem");

fn add_pem(roots: &mut RootCertStore, pem: &[u8]) -> Result<(), TlsError> {
    let mut rd = pem;
    for cert in rustls_pemfile::certs(&mut rd) {
        let cert = cert.map_err(|e| TlsError::Pem(e.to_string()))?;
        roots.add(cert).map_err(|e| TlsError::Pem(e.to_string()))?;
    }
    Ok(())
}

/// Roots trusted for the edge: only the PEM override when given (as
/// `cloudflared --cacert` does), else the web PKI roots plus Cloudflare's
/// origin CA roots.
pub(crate) fn root_store(ca_pem: Option<&[u8]>) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    match ca_pem {
        Some(pem) => {
            add_pem(&mut roots, pem)?;
            if roots.is_empty() {
                return Err(TlsError::NoCertificates);
            }
        }
        None => {
            roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
            add_pem(&mut roots, CLOUDFLARE_ROOTS)?;
        }
    }
    Ok(roots)
}

/// Client config for the QUIC transport: TLS 1.3, ALPN `argotunnel`, the
/// groups of [`edge_key_exchange_groups`].
pub(crate) fn quic_client(
    roots: RootCertStore,
    post_quantum: bool,
) -> Result<quinn::ClientConfig, TlsError> {
    let mut cfg = rustls::ClientConfig::builder_with_provider(edge_provider(post_quantum))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![QUIC_ALPN.to_vec()];
    let quic = quinn::crypto::rustls::QuicClientConfig::try_from(Arc::new(cfg))
        .map_err(|e| TlsError::Config(e.to_string()))?;
    Ok(quinn::ClientConfig::new(Arc::new(quic)))
}

/// Client config for the HTTP/2 transport: no ALPN (prior knowledge), the
/// groups of [`edge_key_exchange_groups`].
pub(crate) fn h2_client(
    roots: RootCertStore,
    post_quantum: bool,
) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    let cfg = rustls::ClientConfig::builder_with_provider(edge_provider(post_quantum))
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(cfg))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_roots_include_the_cloudflare_origin_cas() {
        let mut only_cf = RootCertStore::empty();
        add_pem(&mut only_cf, CLOUDFLARE_ROOTS).unwrap();
        assert_eq!(only_cf.len(), 3);
        let all = root_store(None).unwrap();
        assert_eq!(all.len(), webpki_roots::TLS_SERVER_ROOTS.len() + 3);
    }

    #[test]
    fn ca_override_replaces_all_roots_and_must_not_be_empty() {
        // One certificate of the bundle stands for the CA of an edge the connector is told
        // to trust instead.
        let bundle = std::str::from_utf8(CLOUDFLARE_ROOTS).unwrap();
        let end = "-----END CERTIFICATE-----";
        let one = &bundle[..bundle.find(end).unwrap() + end.len()];
        assert_eq!(root_store(Some(one.as_bytes())).unwrap().len(), 1);
        assert_eq!(
            root_store(Some(b"nothing")).unwrap_err(),
            TlsError::NoCertificates
        );
    }
}
