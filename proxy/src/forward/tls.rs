//! Backend TLS: custom CA bundle, SNI override, accepted subject alternative names (DNS, a
//! `*.` wildcard, IP or URI) and a client certificate for backends that ask for one.

use cftunnel_config::valid::{self, SubjectAltName};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::ParsedCertificate;
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use std::sync::Arc;
use tokio_rustls::TlsConnector;

/// Why a backend client could not be built. The contract ([`cftunnel_config::valid`]) has
/// already accepted the target, so only the TLS library's own setup is left to fail (a client
/// key it cannot use, or that does not belong to its certificate).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UpstreamError {
    #[error("tls: {0}")]
    Tls(String),
}

pub(crate) struct TlsTarget {
    connector: TlsConnector,
    server_name: ServerName<'static>,
}

impl std::fmt::Debug for TlsTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsTarget")
            .field("server_name", &self.server_name)
            .finish()
    }
}

impl TlsTarget {
    pub(crate) fn connector(&self) -> &TlsConnector {
        &self.connector
    }

    pub(crate) fn server_name(&self) -> &ServerName<'static> {
        &self.server_name
    }

    /// The same target offering only HTTP/1.1 through ALPN.
    pub(crate) fn http1_only(&self) -> Self {
        let mut config = ClientConfig::clone(self.connector.config());
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Self {
            connector: TlsConnector::from(Arc::new(config)),
            server_name: self.server_name.clone(),
        }
    }
}

/// Builds the client TLS settings for one checked backend target. The client certificate is
/// part of the target, so a rotated one makes a new target and a new client: connections
/// opened from then on present it, while those already open finish on the old one.
pub(crate) fn target(tls: &valid::Tls, alpn_h2: bool) -> Result<TlsTarget, UpstreamError> {
    let err = |m: String| UpstreamError::Tls(m);
    let provider = rustls::crypto::aws_lc_rs::default_provider();
    let verifier = BackendVerifier::new(tls, provider.signature_verification_algorithms)?;
    let builder = ClientConfig::builder_with_provider(Arc::new(provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| err(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier));
    let mut config = match &tls.client_identity {
        None => builder.with_no_client_auth(),
        Some(identity) => builder
            .with_client_auth_cert(identity.chain.clone(), identity.key())
            .map_err(|e| err(format!("clientCertificate: {e}")))?,
    };
    config.alpn_protocols = if alpn_h2 {
        vec![b"h2".to_vec(), b"http/1.1".to_vec()]
    } else {
        vec![b"http/1.1".to_vec()]
    };
    Ok(TlsTarget {
        connector: TlsConnector::from(Arc::new(config)),
        server_name: tls.server_name.clone(),
    })
}

/// Checks a backend's certificate: WebPKI path validation against the configured roots (or
/// the web roots), then its name.
///
/// - The name: the server name, unless accepted names are set; then the certificate must be
///   valid for one of them, and only those, the server name being sent as SNI only (Gateway
///   API `BackendTLSPolicy`: `subjectAltNames`, when set, replace `hostname` for
///   authentication). A wildcard name is matched by [`SubjectAltName::wildcard_matches`].
/// - A certificate that is byte for byte one of the configured bundle's is accepted as its own
///   trust anchor even where path validation refuses it, as the Go implementation (whose root
///   pool holds it) does: a self-signed certificate made by `openssl req -x509` is marked as a
///   CA, which WebPKI refuses as an end entity. Its validity period, its extended key usage
///   and its name are still checked; any other certificate goes through path validation only.
#[derive(Debug)]
struct BackendVerifier {
    roots: Arc<RootCertStore>,
    /// The configured CA bundle as given (empty with the web roots).
    bundle: Vec<CertificateDer<'static>>,
    algorithms: WebPkiSupportedAlgorithms,
    names: Vec<SubjectAltName>,
}

impl BackendVerifier {
    fn new(tls: &valid::Tls, algorithms: WebPkiSupportedAlgorithms) -> Result<Self, UpstreamError> {
        let mut roots = RootCertStore::empty();
        match &tls.roots {
            // The contract has checked that each is a trust anchor. None at all: nothing is
            // trusted and every handshake fails.
            Some(certs) => {
                for cert in certs {
                    roots
                        .add(cert.clone())
                        .map_err(|e| UpstreamError::Tls(format!("caBundle: {e}")))?;
                }
            }
            None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
        }
        Ok(Self {
            roots: Arc::new(roots),
            bundle: tls.roots.clone().unwrap_or_default(),
            algorithms,
            names: tls.subject_alt_names.clone(),
        })
    }
}

impl ServerCertVerifier for BackendVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        _ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let cert = ParsedCertificate::try_from(end_entity)?;
        if let Err(e) = rustls::client::verify_server_cert_signed_by_trust_anchor(
            &cert,
            &self.roots,
            intermediates,
            now,
            self.algorithms.all,
        ) {
            if !self
                .bundle
                .iter()
                .any(|c| c.as_ref() == end_entity.as_ref())
            {
                return Err(e);
            }
            usable_as_given(end_entity, now)?;
        }
        if self.names.is_empty() {
            rustls::client::verify_server_name(&cert, server_name)?;
            return Ok(ServerCertVerified::assertion());
        }
        let mut presented: Option<Presented> = None;
        for name in &self.names {
            let matched = match name {
                SubjectAltName::Name(name) => {
                    rustls::client::verify_server_name(&cert, name).is_ok()
                }
                SubjectAltName::Wildcard(parent) => presented
                    .get_or_insert_with(|| Presented::of(end_entity))
                    .dns
                    .iter()
                    .any(|d| SubjectAltName::wildcard_matches(parent, d)),
                SubjectAltName::Uri(uri) => presented
                    .get_or_insert_with(|| Presented::of(end_entity))
                    .uris
                    .iter()
                    .any(|u| u == &**uri),
            };
            if matched {
                return Ok(ServerCertVerified::assertion());
            }
        }
        Err(rustls::Error::InvalidCertificate(
            rustls::CertificateError::NotValidForName,
        ))
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// What path validation would still have checked of a certificate trusted as given: that it
/// is within its validity period at `now` and, if it limits its extended key usage, that
/// server authentication is among them.
fn usable_as_given(cert: &CertificateDer<'_>, now: UnixTime) -> Result<(), rustls::Error> {
    use rustls::CertificateError;
    let bad = |e: CertificateError| rustls::Error::InvalidCertificate(e);
    let Ok((_, parsed)) = x509_parser::parse_x509_certificate(cert) else {
        return Err(bad(CertificateError::BadEncoding));
    };
    let now_secs = i64::try_from(now.as_secs()).unwrap_or(i64::MAX);
    let validity = parsed.validity();
    if now_secs < validity.not_before.timestamp() {
        return Err(bad(CertificateError::NotValidYet));
    }
    if now_secs > validity.not_after.timestamp() {
        return Err(bad(CertificateError::Expired));
    }
    match parsed.extended_key_usage() {
        Ok(None) => Ok(()),
        Ok(Some(eku)) if eku.value.server_auth || eku.value.any => Ok(()),
        Ok(Some(_)) => Err(bad(CertificateError::InvalidPurpose)),
        Err(_) => Err(bad(CertificateError::BadEncoding)),
    }
}

/// The DNS and URI subject alternative names of a certificate, which the wildcard and URI
/// names are matched against (none when it cannot be read: the chain check has parsed it
/// already, so that does not happen in practice).
#[derive(Default)]
struct Presented {
    dns: Vec<String>,
    uris: Vec<String>,
}

impl Presented {
    fn of(cert: &CertificateDer<'_>) -> Self {
        use x509_parser::extensions::GeneralName;
        let mut out = Self::default();
        let Ok((_, parsed)) = x509_parser::parse_x509_certificate(cert) else {
            return out;
        };
        let Ok(Some(san)) = parsed.subject_alternative_name() else {
            return out;
        };
        for name in &san.value.general_names {
            match name {
                GeneralName::DNSName(dns) => out.dns.push((*dns).to_owned()),
                GeneralName::URI(uri) => out.uris.push((*uri).to_owned()),
                _ => {}
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verifier(tls: serde_json::Value) -> BackendVerifier {
        let tls: cftunnel_config::BackendTls = serde_json::from_value(tls).expect("reads");
        let target = valid::Target::new(
            "https://api.example.com",
            cftunnel_config::BackendProtocol::Http1,
            false,
            Some(&tls),
            false,
        )
        .expect("a valid target");
        let algorithms =
            rustls::crypto::aws_lc_rs::default_provider().signature_verification_algorithms;
        BackendVerifier::new(&target.tls.expect("https"), algorithms).expect("verifier")
    }

    /// The Go implementation's block without a CA bundle (its fail-closed block, here with the
    /// Gateway's client certificate) trusts no root at all, where this crate's spelling of the
    /// same settings trusts the web roots.
    #[test]
    fn a_go_block_without_a_ca_bundle_trusts_no_root() {
        use base64::Engine as _;
        let pki = cftunnel_testkit::pki::TestPki::for_names(&["client.test"]).expect("PKI");
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let go = verifier(serde_json::json!({"serverName": "api.example.com",
            "clientCertPem": b64(&pki.leaf_pem()), "clientKeyPem": b64(&pki.key_pem())}));
        assert!(go.roots.is_empty());
        assert!(go.bundle.is_empty());
        let ours = verifier(serde_json::json!({"serverName": "api.example.com",
            "clientCertificate": {"certificateChain": pki.leaf_pem(), "privateKey": pki.key_pem()}}));
        assert_eq!(ours.roots.len(), webpki_roots::TLS_SERVER_ROOTS.len());
    }
}
