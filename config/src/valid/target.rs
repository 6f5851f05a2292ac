//! Backend and mirror targets: the URL, how it is spoken to, and its TLS settings.

use super::client_certificate::ClientIdentity;
use super::Invalid;
use crate::{BackendProtocol, BackendTls};
use http::uri::{Authority, Scheme};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};

/// Where requests to a backend go, parsed: every way the URL or its TLS settings could fail
/// has failed here, so the proxy only builds a client from it.
#[derive(Clone)]
pub struct Target {
    /// The URL as written.
    pub url: Box<str>,
    /// `http` or `https`.
    pub scheme: Scheme,
    /// Host and port as written in the URL (what a request with no host of its own carries).
    pub authority: Authority,
    /// The host to dial, without the brackets of an IPv6 literal.
    pub host: Box<str>,
    /// The URL's port, else the scheme's.
    pub port: u16,
    /// The URL's path without its trailing `/`, prepended to request paths; `None` for `/`.
    pub base_path: Option<Box<str>>,
    /// The URL's query, merged into every request's (the request's parameters win a name
    /// both have); `None` when it has none.
    pub base_query: Option<Box<str>>,
    pub protocol: BackendProtocol,
    /// WebSocket upgrades are expected: a TLS handshake offers HTTP/1.1 only.
    pub websocket: bool,
    /// Dial only public addresses of `host` (see [`crate::Backend::public_only`]).
    pub public_only: bool,
    /// Present exactly when the scheme is `https`.
    pub tls: Option<Tls>,
    /// The TLS settings as written, which with the fields above identify the target.
    tls_settings: Option<BackendTls>,
}

/// The key (which holds a client certificate's private key) is left out.
impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("url", &self.url)
            .field("protocol", &self.protocol)
            .field("websocket", &self.websocket)
            .field("public_only", &self.public_only)
            .field("tls", &self.tls)
            .finish_non_exhaustive()
    }
}

/// TLS to a backend.
#[derive(Debug, Clone)]
pub struct Tls {
    /// The certificates to trust; `None`: the platform's web roots; empty: none, so every
    /// handshake fails.
    pub roots: Option<Vec<CertificateDer<'static>>>,
    /// The name sent as SNI and verified, unless `subject_alt_names` replaces the check.
    pub server_name: ServerName<'static>,
    /// Names accepted in the certificate instead of `server_name`: it must carry one of them.
    pub subject_alt_names: Vec<SubjectAltName>,
    /// Presented when the backend asks for a client certificate.
    pub client_identity: Option<ClientIdentity>,
}

/// A name a backend's certificate may carry as a subject alternative name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubjectAltName {
    /// A DNS name or an IP address.
    Name(ServerName<'static>),
    /// A DNS name whose first label is `*` (Gateway API's `Hostname` type allows it): the
    /// name after `*.`, lower-cased. See [`SubjectAltName::wildcard_matches`].
    Wildcard(Box<str>),
    /// A URI (`spiffe://cluster.local/ns/shop/sa/api`), compared as written.
    Uri(Box<str>),
}

impl SubjectAltName {
    /// A DNS name or IP address, a DNS name under a `*.` first label, else a URI
    /// (`scheme:rest`, RFC 3986 scheme, no spaces).
    fn parse(s: &str) -> Option<Self> {
        if let Ok(name) = ServerName::try_from(s.to_owned()) {
            return Some(Self::Name(name));
        }
        if let Some(parent) = s.strip_prefix("*.") {
            let parent = parent.strip_suffix('.').unwrap_or(parent);
            return match ServerName::try_from(parent) {
                Ok(ServerName::DnsName(_)) => {
                    Some(Self::Wildcard(parent.to_ascii_lowercase().into()))
                }
                _ => None,
            };
        }
        let (scheme, rest) = s.split_once(':')?;
        let scheme_ok = scheme.starts_with(|c: char| c.is_ascii_alphabetic())
            && scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
        let rest_ok = !rest.is_empty() && rest.chars().all(|c| c.is_ascii_graphic());
        (scheme_ok && rest_ok).then(|| Self::Uri(s.into()))
    }

    /// Whether a DNS name a certificate carries satisfies the wildcard name `*.{parent}`
    /// ([`SubjectAltName::Wildcard`]): it is that wildcard itself, or `parent` under exactly
    /// one more label that is no wildcard (RFC 6125 section 6.4.3, without partial-label
    /// wildcards). Compared case-insensitively.
    pub fn wildcard_matches(parent: &str, presented: &str) -> bool {
        let presented = presented.strip_suffix('.').unwrap_or(presented);
        let Some((first, rest)) = presented.split_once('.') else {
            return false;
        };
        rest.eq_ignore_ascii_case(parent)
            && !first.is_empty()
            && (first == "*" || !first.contains('*'))
    }
}

/// Why a target was refused: the field of the backend (or mirror) at fault, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetError {
    /// `url`, or a field under `tls` (`tls.caBundle`, `tls.serverName`, `tls.subjectAltNames[1]`).
    pub field: String,
    pub message: String,
}

/// A client certificate's fault, named under the backend's `tls`.
impl From<Invalid> for TargetError {
    fn from(e: Invalid) -> Self {
        Self {
            field: e.field,
            message: e.message,
        }
    }
}

impl TargetError {
    pub(super) fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }

    fn url(message: impl std::fmt::Display) -> Self {
        Self::new("url", format!("invalid URL: {message}"))
    }
}

impl Target {
    /// Checks a backend's (or mirror's) URL and TLS settings.
    ///
    /// # Errors
    /// A URL that is not absolute `http` or `https` with a host and no user info; TLS settings
    /// on an `http` URL; a CA bundle that is neither empty (trust nothing) nor PEM certificates
    /// that are each a valid trust anchor; a server name that is neither a DNS name nor an IP
    /// address; an accepted name that is none of those, a `*.` wildcard DNS name or a URI.
    pub fn new(
        url: &str,
        protocol: BackendProtocol,
        websocket: bool,
        tls: Option<&BackendTls>,
        public_only: bool,
    ) -> Result<Self, TargetError> {
        let uri: http::Uri = url
            .parse()
            .map_err(|e: http::uri::InvalidUri| TargetError::url(e.to_string()))?;
        let scheme = uri
            .scheme()
            .cloned()
            .ok_or_else(|| TargetError::url("missing scheme"))?;
        let authority = uri
            .authority()
            .cloned()
            .ok_or_else(|| TargetError::url("missing host"))?;
        if authority.as_str().contains('@') {
            return Err(TargetError::url("user info is not allowed"));
        }
        let secure = match scheme.as_str() {
            "http" => false,
            "https" => true,
            other => {
                return Err(TargetError::new(
                    "url",
                    format!("unsupported scheme {other:?} (want http or https)"),
                ))
            }
        };
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']');
        if host.is_empty() {
            return Err(TargetError::url("missing host"));
        }
        // `Authority::port` reads only ports that fit 16 bits: a larger one would be dropped
        // and the scheme's port dialled instead, so the text after the host is read here.
        let port_text = authority
            .as_str()
            .rsplit_once(':')
            .map(|(_, p)| p)
            .filter(|p| !p.contains(']') && !p.is_empty());
        let port = match port_text {
            None => {
                if secure {
                    443
                } else {
                    80
                }
            }
            Some(text) => match text.parse::<u16>() {
                Ok(port) if port > 0 => port,
                _ => {
                    return Err(TargetError::url(format!(
                        "port {text} is not between 1 and 65535"
                    )))
                }
            },
        };
        let tls_settings = tls.cloned();
        let tls = match (secure, tls) {
            (true, tls) => Some(Tls::new(host, tls)?),
            (false, Some(_)) => {
                return Err(TargetError::new("tls", "TLS settings need an https URL"))
            }
            (false, None) => None,
        };
        let base_path = match uri.path() {
            "" | "/" => None,
            p => Some(p.trim_end_matches('/').into()),
        };
        let base_query = uri.query().filter(|q| !q.is_empty()).map(Into::into);
        Ok(Self {
            url: url.into(),
            scheme,
            host: host.into(),
            authority,
            port,
            base_path,
            base_query,
            protocol,
            websocket,
            public_only,
            tls,
            tls_settings,
        })
    }

    /// Whether this is the target [`Target::new`] makes of these settings (the URL compared by
    /// the caller).
    pub(super) fn made_of(
        &self,
        protocol: BackendProtocol,
        websocket: bool,
        tls: Option<&BackendTls>,
        public_only: bool,
    ) -> bool {
        self.protocol == protocol
            && self.websocket == websocket
            && self.public_only == public_only
            && self.tls_settings.as_ref() == tls
    }
}

impl Tls {
    fn new(host: &str, tls: Option<&BackendTls>) -> Result<Self, TargetError> {
        // An empty bundle trusts nothing (see `BackendTls::ca_bundle`).
        let roots = tls
            .and_then(|t| t.ca_bundle.as_deref())
            .map(|pem| match pem {
                "" => Ok(Vec::new()),
                pem => ca_bundle(pem),
            })
            .transpose()
            .map_err(|e| TargetError::new("tls.caBundle", e))?;
        // Without a server name of its own, the URL's host is the name verified.
        let (name, field) = match tls.and_then(|t| t.server_name.as_deref()) {
            Some(name) => (name, "tls.serverName"),
            None => (host, "url"),
        };
        let server_name = ServerName::try_from(name.to_owned()).map_err(|_| {
            TargetError::new(field, format!("{name:?} is not a valid DNS name or IP"))
        })?;
        let subject_alt_names = tls
            .map(|t| t.subject_alt_names.as_slice())
            .unwrap_or_default()
            .iter()
            .enumerate()
            .map(|(i, s)| {
                SubjectAltName::parse(s).ok_or_else(|| {
                    TargetError::new(
                        format!("tls.subjectAltNames[{i}]"),
                        format!("{s:?} is not a valid DNS name, IP or URI"),
                    )
                })
            })
            .collect::<Result<_, _>>()?;
        let client_identity = tls
            .and_then(|t| t.client_certificate.as_ref())
            .map(ClientIdentity::new)
            .transpose()?;
        Ok(Self {
            roots,
            server_name,
            subject_alt_names,
            client_identity,
        })
    }
}

/// The certificates of a PEM CA bundle, each checked as a trust anchor (what a root store does
/// with it, done here rather than when the first request dials).
///
/// # Errors
/// PEM that does not parse, a certificate that is not a valid trust anchor, or no certificate.
pub fn ca_bundle(pem: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let mut certs = Vec::new();
    for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
        let cert = cert.map_err(|e| e.to_string())?;
        webpki::anchor_from_trusted_cert(&cert).map_err(|e| e.to_string())?;
        certs.push(cert);
    }
    if certs.is_empty() {
        return Err("no PEM certificate found".to_owned());
    }
    Ok(certs)
}
