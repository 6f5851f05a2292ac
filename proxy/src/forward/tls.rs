//! Backend TLS: custom CA bundle, SNI override, and accepted subject alternative names.

use cftunnel_config::valid;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use std::sync::Arc;
use tokio_rustls::TlsConnector;

/// Why a backend client could not be built. The contract ([`cftunnel_config::valid`]) has
/// already accepted the target, so only the TLS library's own setup is left to fail.
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

/// Builds the client TLS settings for one checked backend target.
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
    let mut config = if tls.subject_alt_names.is_empty() {
        builder.with_root_certificates(roots).with_no_client_auth()
    } else {
        let inner = WebPkiServerVerifier::builder_with_provider(roots, provider)
            .build()
            .map_err(|e| err(e.to_string()))?;
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(SanVerifier {
                inner,
                names: tls.subject_alt_names.clone(),
            }))
            .with_no_client_auth()
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

/// Accepts a chain that is valid for any of the configured names (full WebPKI validation
/// against the configured roots still applies; only the name check is widened).
#[derive(Debug)]
struct SanVerifier {
    inner: Arc<WebPkiServerVerifier>,
    names: Vec<ServerName<'static>>,
}

impl ServerCertVerifier for SanVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let mut last = rustls::Error::General("no subject alternative name configured".into());
        for name in &self.names {
            match self
                .inner
                .verify_server_cert(end_entity, intermediates, name, ocsp, now)
            {
                Ok(ok) => return Ok(ok),
                Err(e) => last = e,
            }
        }
        Err(last)
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
