//! TLS settings for edge connections (connector side) and the mock edge's
//! test PKI.

use std::sync::Arc;

use rustls::crypto::SupportedKxGroup;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
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
    /// Generating the test PKI failed.
    #[error("generating test certificates: {0}")]
    Generate(String),
}

pub(crate) fn provider() -> Arc<rustls::crypto::CryptoProvider> {
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
pub(crate) fn provider_with_groups(
    groups: &[rustls::NamedGroup],
) -> Result<Arc<rustls::crypto::CryptoProvider>, TlsError> {
    let kx_groups = groups
        .iter()
        .map(|name| {
            rustls::crypto::aws_lc_rs::ALL_KX_GROUPS
                .iter()
                .find(|g| g.name() == *name)
                .copied()
                .ok_or_else(|| TlsError::Config(format!("unsupported key-exchange group {name:?}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    if kx_groups.is_empty() {
        return Err(TlsError::Config("no key-exchange group".into()));
    }
    Ok(Arc::new(rustls::crypto::CryptoProvider {
        kx_groups,
        ..rustls::crypto::aws_lc_rs::default_provider()
    }))
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

fn encode_pem(tag: &str, der: &[u8]) -> String {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {tag}-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(line).unwrap_or_default());
        out.push('\n');
    }
    out.push_str(&format!("-----END {tag}-----\n"));
    out
}

/// A generated CA and an edge leaf certificate for
/// `quic.cftunnel.com`, `h2.cftunnel.com` and `probe.cftunnel.com`.
#[derive(Clone)]
pub struct TestPki {
    ca_pem: String,
    leaf_der: CertificateDer<'static>,
    key_der: Vec<u8>,
}

impl std::fmt::Debug for TestPki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestPki").finish_non_exhaustive()
    }
}

impl TestPki {
    /// Generates a fresh CA and leaf.
    pub fn generate() -> Result<Self, TlsError> {
        let gen = |e: rcgen::Error| TlsError::Generate(e.to_string());
        let ca_key = rcgen::KeyPair::generate().map_err(gen)?;
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(gen)?;
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "cftunnel mock edge CA");
        let ca = ca_params.self_signed(&ca_key).map_err(gen)?;
        let leaf_key = rcgen::KeyPair::generate().map_err(gen)?;
        let leaf_params = rcgen::CertificateParams::new(vec![
            QUIC_SERVER_NAME.to_owned(),
            H2_SERVER_NAME.to_owned(),
            PROBE_SERVER_NAME.to_owned(),
        ])
        .map_err(gen)?;
        let leaf = leaf_params
            .signed_by(&leaf_key, &ca, &ca_key)
            .map_err(gen)?;
        Ok(Self {
            ca_pem: ca.pem(),
            leaf_der: leaf.der().clone(),
            key_der: leaf_key.serialize_der(),
        })
    }

    /// The CA certificate, the edge certificate and its key as one PEM
    /// document. A mock edge restarted with [`from_pem`](Self::from_pem) of
    /// it keeps the identity that running connectors already trust, as the
    /// real edge does across restarts.
    pub fn to_pem(&self) -> String {
        format!(
            "{}{}{}",
            self.ca_pem,
            encode_pem("CERTIFICATE", &self.leaf_der),
            encode_pem("PRIVATE KEY", &self.key_der)
        )
    }

    /// Parses a document written by [`to_pem`](Self::to_pem): the CA
    /// certificate, then the edge certificate, and a PKCS#8 key.
    pub fn from_pem(pem: &str) -> Result<Self, TlsError> {
        let pem_err = |e: std::io::Error| TlsError::Pem(e.to_string());
        let certs = rustls_pemfile::certs(&mut pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(pem_err)?;
        let [ca, leaf]: [CertificateDer<'static>; 2] = certs.try_into().map_err(|_| {
            TlsError::Pem("expected exactly the CA and the edge certificate".into())
        })?;
        let key = rustls_pemfile::pkcs8_private_keys(&mut pem.as_bytes())
            .next()
            .ok_or_else(|| TlsError::Pem("no PKCS#8 private key".into()))?
            .map_err(pem_err)?;
        let pki = Self {
            ca_pem: encode_pem("CERTIFICATE", &ca),
            leaf_der: leaf,
            key_der: key.secret_pkcs8_der().to_vec(),
        };
        // Fails early on a key that does not match the certificate.
        pki.tcp_server(provider())?;
        Ok(pki)
    }

    /// The CA certificate as PEM (give it to connectors as the CA override).
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    fn key(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key_der.clone()))
    }

    /// Server config for the QUIC side: TLS 1.3, ALPN `argotunnel`.
    pub(crate) fn quic_server(
        &self,
        provider: Arc<rustls::crypto::CryptoProvider>,
    ) -> Result<rustls::ServerConfig, TlsError> {
        let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| TlsError::Config(e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(vec![self.leaf_der.clone()], self.key())
            .map_err(|e| TlsError::Config(e.to_string()))?;
        cfg.alpn_protocols = vec![QUIC_ALPN.to_vec()];
        Ok(cfg)
    }

    /// Server config for the TLS/TCP side: no ALPN.
    pub(crate) fn tcp_server(
        &self,
        provider: Arc<rustls::crypto::CryptoProvider>,
    ) -> Result<rustls::ServerConfig, TlsError> {
        rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(vec![self.leaf_der.clone()], self.key())
            .map_err(|e| TlsError::Config(e.to_string()))
    }
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
    fn test_pki_survives_a_pem_round_trip() {
        let pki = TestPki::generate().unwrap();
        let back = TestPki::from_pem(&pki.to_pem()).unwrap();
        assert_eq!(back.leaf_der, pki.leaf_der);
        assert_eq!(back.key_der, pki.key_der);
        let roots = |p: &TestPki| {
            rustls_pemfile::certs(&mut p.ca_pem().as_bytes())
                .collect::<Result<Vec<_>, _>>()
                .unwrap()
        };
        assert_eq!(roots(&back), roots(&pki));
        assert_eq!(
            TestPki::from_pem(&back.to_pem()).unwrap().to_pem(),
            back.to_pem()
        );
        back.quic_server(provider()).unwrap();
        assert!(matches!(
            TestPki::from_pem(pki.ca_pem()),
            Err(TlsError::Pem(_))
        ));
    }

    #[test]
    fn ca_override_replaces_all_roots_and_must_not_be_empty() {
        let pki = TestPki::generate().unwrap();
        assert_eq!(root_store(Some(pki.ca_pem().as_bytes())).unwrap().len(), 1);
        assert_eq!(
            root_store(Some(b"nothing")).unwrap_err(),
            TlsError::NoCertificates
        );
    }

    /// The connector offers the suites in `cloudflared`'s order, and a server that follows
    /// the client's order (as the mock edge does) settles on its first choice.
    #[test]
    fn edge_connections_prefer_the_suites_cloudflared_prefers() {
        use rustls::CipherSuite::{
            TLS13_AES_128_GCM_SHA256, TLS13_AES_256_GCM_SHA384, TLS13_CHACHA20_POLY1305_SHA256,
        };
        let offered: Vec<_> = edge_provider(false)
            .cipher_suites
            .iter()
            .filter(|s| s.tls13().is_some())
            .map(|s| s.suite())
            .collect();
        let expected = if aes_gcm_in_hardware() {
            [
                TLS13_AES_128_GCM_SHA256,
                TLS13_AES_256_GCM_SHA384,
                TLS13_CHACHA20_POLY1305_SHA256,
            ]
        } else {
            [
                TLS13_CHACHA20_POLY1305_SHA256,
                TLS13_AES_128_GCM_SHA256,
                TLS13_AES_256_GCM_SHA384,
            ]
        };
        assert_eq!(offered, expected);
        assert!(
            edge_provider(false)
                .cipher_suites
                .iter()
                .any(|s| s.tls13().is_none()),
            "TLS 1.2 suites stay for the HTTP/2 transport"
        );

        let pki = TestPki::generate().unwrap();
        let roots = root_store(Some(pki.ca_pem().as_bytes())).unwrap();
        let name = rustls::pki_types::ServerName::try_from(H2_SERVER_NAME).unwrap();
        let mut client =
            rustls::ClientConnection::new(h2_client(roots, false).unwrap(), name).unwrap();
        let mut server =
            rustls::ServerConnection::new(Arc::new(pki.tcp_server(provider()).unwrap())).unwrap();
        let mut wire = Vec::new();
        // A TLS 1.3 handshake takes two flights each way; a stalled one fails, not hangs.
        for _ in 0..8 {
            if !client.is_handshaking() && !server.is_handshaking() {
                break;
            }
            wire.clear();
            client.write_tls(&mut wire).unwrap();
            server.read_tls(&mut wire.as_slice()).unwrap();
            server.process_new_packets().unwrap();
            wire.clear();
            server.write_tls(&mut wire).unwrap();
            client.read_tls(&mut wire.as_slice()).unwrap();
            client.process_new_packets().unwrap();
        }
        assert!(!client.is_handshaking() && !server.is_handshaking());
        assert_eq!(
            server.negotiated_cipher_suite().map(|s| s.suite()),
            Some(expected[0])
        );
    }
}
