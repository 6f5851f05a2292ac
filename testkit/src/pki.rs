//! The test edge's TLS identity: a generated CA and an edge certificate for the names
//! connectors verify, kept as one PEM document across restarts.
//!
//! Left out: revocation, intermediates and expiry handling; the CA signs the one leaf and
//! nothing else. Connectors trust it only through their CA override (`cloudflared
//! --cacert`, `ConnectorOptions::edge_ca_pem`).

use std::sync::Arc;

use cftunnel_tunnel::tls;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// Errors making, reading or using the test PKI.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PkiError {
    /// Generating the certificates failed.
    #[error("generating test certificates: {0}")]
    Generate(String),
    /// A PEM document could not be parsed, or lacks a part.
    #[error("test PKI file is not valid PEM: {0}")]
    Pem(String),
    /// rustls refused a configuration built from it.
    #[error("tls configuration: {0}")]
    Config(String),
}

/// `der` as a PEM block of `tag`.
pub(crate) fn encode_pem(tag: &str, der: &[u8]) -> String {
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

/// A generated CA and a leaf certificate it signed: by default the edge's, for
/// `quic.cftunnel.com`, `h2.cftunnel.com` and `probe.cftunnel.com`.
#[derive(Clone)]
pub struct TestPki {
    ca_pem: String,
    leaf_der: CertificateDer<'static>,
    key_der: Vec<u8>,
    /// The CA's certificate and key, to sign more leaves ([`TestPki::issue`]); absent when
    /// read back with [`TestPki::from_pem`].
    ca: Option<Arc<(rcgen::Certificate, rcgen::KeyPair)>>,
}

impl std::fmt::Debug for TestPki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestPki").finish_non_exhaustive()
    }
}

impl TestPki {
    /// Generates a fresh CA and an edge leaf.
    pub fn generate() -> Result<Self, PkiError> {
        Self::for_names(&[
            tls::QUIC_SERVER_NAME,
            tls::H2_SERVER_NAME,
            tls::PROBE_SERVER_NAME,
        ])
    }

    /// Generates a fresh CA and a leaf for `names` (DNS names or IP addresses, and URIs such
    /// as `spiffe://cluster.local/ns/a/sa/b`: a name with `://` is a URI subject alternative
    /// name), as a backend with a private CA has.
    pub fn for_names(names: &[&str]) -> Result<Self, PkiError> {
        let gen = |e: rcgen::Error| PkiError::Generate(e.to_string());
        let ca_key = rcgen::KeyPair::generate().map_err(gen)?;
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(gen)?;
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "cftunnel mock edge CA");
        let ca = ca_params.self_signed(&ca_key).map_err(gen)?;
        let ca = Arc::new((ca, ca_key));
        let mut pki = Self {
            ca_pem: ca.0.pem(),
            leaf_der: CertificateDer::from(Vec::new()),
            key_der: Vec::new(),
            ca: Some(ca),
        };
        pki = pki.issue(names)?;
        Ok(pki)
    }

    /// Another leaf for `names` (as [`TestPki::for_names`] reads them), signed by the same CA:
    /// a rotated certificate, or a client certificate the same CA vouches for.
    ///
    /// # Errors
    /// [`PkiError::Generate`] when this CA was read back with [`TestPki::from_pem`] (its key is
    /// not kept) or signing fails.
    pub fn issue(&self, names: &[&str]) -> Result<Self, PkiError> {
        let gen = |e: rcgen::Error| PkiError::Generate(e.to_string());
        let Some(ca) = &self.ca else {
            return Err(PkiError::Generate(
                "the CA key is not kept once read from PEM".into(),
            ));
        };
        let leaf_key = rcgen::KeyPair::generate().map_err(gen)?;
        let mut leaf_params = rcgen::CertificateParams::new(
            names
                .iter()
                .filter(|n| !n.contains("://"))
                .map(|n| (*n).to_owned())
                .collect::<Vec<_>>(),
        )
        .map_err(gen)?;
        for uri in names.iter().filter(|n| n.contains("://")) {
            let uri = rcgen::Ia5String::try_from(*uri).map_err(gen)?;
            leaf_params.subject_alt_names.push(rcgen::SanType::URI(uri));
        }
        leaf_params.distinguished_name.push(
            rcgen::DnType::CommonName,
            names.first().copied().unwrap_or("leaf"),
        );
        let leaf = leaf_params
            .signed_by(&leaf_key, &ca.0, &ca.1)
            .map_err(gen)?;
        Ok(Self {
            ca_pem: self.ca_pem.clone(),
            leaf_der: leaf.der().clone(),
            key_der: leaf_key.serialize_der(),
            ca: self.ca.clone(),
        })
    }

    /// The leaf certificate as PEM (`tls.crt` of a `kubernetes.io/tls` Secret).
    pub fn leaf_pem(&self) -> String {
        encode_pem("CERTIFICATE", &self.leaf_der)
    }

    /// The leaf's key as PKCS#8 PEM (`tls.key`).
    pub fn key_pem(&self) -> String {
        encode_pem("PRIVATE KEY", &self.key_der)
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
    pub fn from_pem(pem: &str) -> Result<Self, PkiError> {
        let pem_err = |e: std::io::Error| PkiError::Pem(e.to_string());
        let certs = rustls_pemfile::certs(&mut pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(pem_err)?;
        let [ca, leaf]: [CertificateDer<'static>; 2] = certs.try_into().map_err(|_| {
            PkiError::Pem("expected exactly the CA and the edge certificate".into())
        })?;
        let key = rustls_pemfile::pkcs8_private_keys(&mut pem.as_bytes())
            .next()
            .ok_or_else(|| PkiError::Pem("no PKCS#8 private key".into()))?
            .map_err(pem_err)?;
        let pki = Self {
            ca_pem: encode_pem("CERTIFICATE", &ca),
            leaf_der: leaf,
            key_der: key.secret_pkcs8_der().to_vec(),
            ca: None,
        };
        // Fails early on a key that does not match the certificate.
        pki.tcp_server(tls::provider())?;
        Ok(pki)
    }

    /// The CA certificate as PEM (give it to connectors as the CA override).
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    fn key(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key_der.clone()))
    }

    /// Server config for the QUIC side: TLS 1.3, ALPN `argotunnel`, quinn's default
    /// transport (set another with `transport_config`).
    pub fn quic_server(
        &self,
        provider: Arc<rustls::crypto::CryptoProvider>,
    ) -> Result<quinn::ServerConfig, PkiError> {
        let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| PkiError::Config(e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(vec![self.leaf_der.clone()], self.key())
            .map_err(|e| PkiError::Config(e.to_string()))?;
        cfg.alpn_protocols = vec![tls::QUIC_ALPN.to_vec()];
        let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(cfg)
            .map_err(|e| PkiError::Config(e.to_string()))?;
        Ok(quinn::ServerConfig::with_crypto(Arc::new(crypto)))
    }

    /// Server config for the TLS/TCP side that requires a client certificate signed by the CA
    /// of `clients` (PEM): a client without one fails the handshake. No ALPN.
    pub fn tcp_server_requiring_clients(
        &self,
        provider: Arc<rustls::crypto::CryptoProvider>,
        clients: &str,
    ) -> Result<rustls::ServerConfig, PkiError> {
        let config = |e: &dyn std::fmt::Display| PkiError::Config(e.to_string());
        let mut roots = rustls::RootCertStore::empty();
        for cert in rustls_pemfile::certs(&mut clients.as_bytes()) {
            roots
                .add(cert.map_err(|e| PkiError::Pem(e.to_string()))?)
                .map_err(|e| config(&e))?;
        }
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            provider.clone(),
        )
        .build()
        .map_err(|e| config(&e))?;
        rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| config(&e))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(vec![self.leaf_der.clone()], self.key())
            .map_err(|e| config(&e))
    }

    /// Server config for the TLS/TCP side: no ALPN.
    pub fn tcp_server(
        &self,
        provider: Arc<rustls::crypto::CryptoProvider>,
    ) -> Result<rustls::ServerConfig, PkiError> {
        rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| PkiError::Config(e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(vec![self.leaf_der.clone()], self.key())
            .map_err(|e| PkiError::Config(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        back.quic_server(tls::provider()).unwrap();
        assert!(matches!(
            TestPki::from_pem(pki.ca_pem()),
            Err(PkiError::Pem(_))
        ));
    }
}
