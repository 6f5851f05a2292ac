//! Backend TLS: custom CA bundle, SNI override, accepted subject alternative names (DNS, IP
//! or URI) and a client certificate for backends that ask for one.

use cftunnel_config::valid::{self, SubjectAltName};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
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
    let mut roots = RootCertStore::empty();
    match &tls.roots {
        // The contract has checked that each is a trust anchor.
        Some(certs) => {
            for cert in certs {
                roots
                    .add(cert.clone())
                    .map_err(|e| err(format!("caBundle: {e}")))?;
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    let roots = Arc::new(roots);
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| err(e.to_string()))?;
    let builder = if tls.subject_alt_names.is_empty() {
        builder.with_root_certificates(roots)
    } else {
        let inner = WebPkiServerVerifier::builder_with_provider(roots.clone(), provider.clone())
            .build()
            .map_err(|e| err(e.to_string()))?;
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(SanVerifier {
                inner,
                roots,
                provider,
                names: tls.subject_alt_names.clone(),
            }))
    };
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

/// Accepts a chain that is valid for any of the configured names, and only those: the server
/// name is then sent as SNI but not verified (Gateway API `BackendTLSPolicy`:
/// `subjectAltNames`, when set, replace `hostname` for authentication). Full WebPKI path
/// validation against the configured roots still applies.
#[derive(Debug)]
struct SanVerifier {
    inner: Arc<WebPkiServerVerifier>,
    roots: Arc<RootCertStore>,
    provider: Arc<CryptoProvider>,
    names: Vec<SubjectAltName>,
}

impl ServerCertVerifier for SanVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let cert = ParsedCertificate::try_from(end_entity)?;
        rustls::client::verify_server_cert_signed_by_trust_anchor(
            &cert,
            &self.roots,
            intermediates,
            now,
            self.provider.signature_verification_algorithms.all,
        )?;
        let mut uris: Option<Vec<String>> = None;
        for name in &self.names {
            let matched = match name {
                SubjectAltName::Name(name) => {
                    rustls::client::verify_server_name(&cert, name).is_ok()
                }
                SubjectAltName::Uri(uri) => uris
                    .get_or_insert_with(|| uri_names(end_entity))
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
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// The URI subject alternative names of a certificate (none when it cannot be read: the chain
/// check has parsed it already, so that does not happen in practice).
fn uri_names(cert: &CertificateDer<'_>) -> Vec<String> {
    use x509_parser::extensions::GeneralName;
    let Ok((_, parsed)) = x509_parser::parse_x509_certificate(cert) else {
        return Vec::new();
    };
    let Ok(Some(san)) = parsed.subject_alternative_name() else {
        return Vec::new();
    };
    san.value
        .general_names
        .iter()
        .filter_map(|n| match n {
            GeneralName::URI(uri) => Some((*uri).to_owned()),
            _ => None,
        })
        .collect()
}
