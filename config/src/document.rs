//! The wire types of the config document. Field names are camelCase; unknown fields are
//! ignored, as the proxy contract requires. What a document must satisfy beyond its shape is
//! [`crate::valid`]'s.

use crate::Duration;
use serde::{Deserialize, Deserializer, Serialize};

/// Reads a list that Go may send as `null` (how it encodes a nil slice, e.g. the rules of a
/// cluster with no routes or the backends of a redirect-only rule) as empty.
pub(crate) fn null_as_empty<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<Vec<T>>::deserialize(d).map(Option::unwrap_or_default)
}

/// Reads a scalar Go may send as `null` (its encoder never does, other clients might) as
/// absent: its default.
fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Option::<T>::deserialize(d).map(Option::unwrap_or_default)
}

/// A whole config document; every push replaces the previous one.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Config {
    /// Monotonic version; 0 means unversioned (always accepted).
    #[serde(default, deserialize_with = "null_as_default")]
    pub version: i64,
    #[serde(default, deserialize_with = "null_as_empty")]
    pub rules: Vec<Rule>,
    /// Set when any GRPCRoute contributed rules: unmatched gRPC requests then get `grpc-status: 12`.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "is_false"
    )]
    pub has_grpc_route: bool,
}

/// One routing rule: where it applies (hostnames, matches) and what it does (filters, backends).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Rule {
    #[serde(
        default,
        deserialize_with = "null_as_empty",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub hostnames: Vec<String>,
    #[serde(
        default,
        deserialize_with = "null_as_empty",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub matches: Vec<Match>,
    #[serde(
        default,
        deserialize_with = "null_as_empty",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub filters: Vec<Filter>,
    #[serde(default, deserialize_with = "null_as_empty")]
    pub backends: Vec<Backend>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeouts: Option<Timeouts>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unavailable_status: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<Retry>,
    /// Requests must carry a valid Cloudflare Access token for this team and one of these
    /// audiences; others are answered 403 and never forwarded. Absent: no check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access: Option<Access>,
    /// `<namespace>/<route>/<rule>`, used in logs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Timeouts {
    /// Bounds the whole exchange, retries included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<Duration>,
    /// Bounds each try against a backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<Duration>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Retry {
    #[serde(
        default,
        deserialize_with = "null_as_empty",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub codes: Vec<u16>,
    /// Retries after the first try.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempts: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff: Option<Duration>,
}

/// A Cloudflare Access requirement (as cloudflared's `originRequest.access`): the request's
/// `Cf-Access-Jwt-Assertion` header must hold a token signed by the team's keys, issued by the
/// team's domain, unexpired, whose `aud` names one of `audiences` (application AUD tags).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Access {
    /// The Zero Trust team name: `<teamName>.cloudflareaccess.com` is the team domain.
    #[serde(default, deserialize_with = "null_as_default")]
    pub team_name: String,
    /// Application audience (AUD) tags; a token for any of them is accepted.
    #[serde(default, deserialize_with = "null_as_empty")]
    pub audiences: Vec<String>,
}

/// Matches are ORed within a rule; the fields inside one match are ANDed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Match {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathMatch>,
    #[serde(
        default,
        deserialize_with = "null_as_empty",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub headers: Vec<ValueMatch>,
    #[serde(
        default,
        deserialize_with = "null_as_empty",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub query_params: Vec<ValueMatch>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum PathMatchType {
    Exact,
    #[default]
    PathPrefix,
    RegularExpression,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PathMatch {
    #[serde(default, rename = "type")]
    pub kind: PathMatchType,
    #[serde(default, deserialize_with = "null_as_default")]
    pub value: String,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ValueMatchType {
    #[default]
    Exact,
    RegularExpression,
}

/// A header or query-parameter match.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ValueMatch {
    #[serde(default, rename = "type")]
    pub kind: ValueMatchType,
    pub name: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub value: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum FilterType {
    RequestHeaderModifier,
    ResponseHeaderModifier,
    RequestRedirect,
    URLRewrite,
    RequestMirror,
    #[serde(rename = "CORS")]
    Cors,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Filter {
    #[serde(rename = "type")]
    pub kind: FilterType,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_header_modifier: Option<HeaderModifier>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_header_modifier: Option<HeaderModifier>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_redirect: Option<RequestRedirect>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url_rewrite: Option<UrlRewrite>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_mirror: Option<RequestMirror>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cors: Option<Cors>,
}

impl Filter {
    /// A filter of `kind` with no payload; fill the matching field afterwards.
    pub fn new(kind: FilterType) -> Self {
        Self {
            kind,
            request_header_modifier: None,
            response_header_modifier: None,
            request_redirect: None,
            url_rewrite: None,
            request_mirror: None,
            cors: None,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HeaderModifier {
    #[serde(
        default,
        deserialize_with = "null_as_empty",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub set: Vec<Header>,
    #[serde(
        default,
        deserialize_with = "null_as_empty",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub add: Vec<Header>,
    #[serde(
        default,
        deserialize_with = "null_as_empty",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub remove: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Header {
    pub name: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub value: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum PathModifierType {
    ReplaceFullPath,
    ReplacePrefixMatch,
}

/// Redirect path: `value` carries the replacement for either type.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RedirectPath {
    #[serde(rename = "type")]
    pub kind: PathModifierType,
    #[serde(default, deserialize_with = "null_as_default")]
    pub value: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestRedirect {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheme: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<RedirectPath>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_code: Option<u16>,
}

/// Rewrite path, in Gateway API shape: the value sits in the field named after the type.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RewritePath {
    #[serde(rename = "type")]
    pub kind: PathModifierType,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replace_full_path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replace_prefix_match: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UrlRewrite {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<RewritePath>,
}

/// `numerator` in `denominator`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Fraction {
    pub numerator: u32,
    pub denominator: u32,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestMirror {
    pub backend_url: String,
    /// 0..=100; absent means every request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percent: Option<u32>,
    /// The share of requests copied, finer than `percent` (Gateway API's `fraction`: 1 in
    /// 1,000 is no whole percent); it takes precedence. Proxies that predate it read
    /// `percent`, which a controller sets beside it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fraction: Option<Fraction>,
    /// How the mirror is spoken to, as a backend's `protocol`: a gRPC or h2c mirror takes
    /// HTTP/2 only.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "BackendProtocol::is_default"
    )]
    pub protocol: BackendProtocol,
    /// As a backend's `publicOnly`: copies go only to public addresses of the URL's host, so a
    /// name its owner picked cannot send them into the cluster or the node. Absent: false.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "is_false"
    )]
    pub public_only: bool,
    /// As a backend's `tls`, for an `https` mirror; absent: the platform's web roots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<BackendTls>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Cors {
    #[serde(
        default,
        deserialize_with = "null_as_empty",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub allow_origins: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_credentials: Option<bool>,
    #[serde(
        default,
        deserialize_with = "null_as_empty",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub allow_methods: Vec<String>,
    #[serde(
        default,
        deserialize_with = "null_as_empty",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub allow_headers: Vec<String>,
    #[serde(
        default,
        deserialize_with = "null_as_empty",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub expose_headers: Vec<String>,
    /// Seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_age: Option<u32>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum BackendProtocol {
    /// HTTP/1.1, or HTTP/2 negotiated by ALPN over TLS.
    #[default]
    #[serde(rename = "")]
    Http1,
    /// HTTP/2 with prior knowledge over cleartext.
    #[serde(rename = "h2c")]
    H2c,
}

impl BackendProtocol {
    fn is_default(&self) -> bool {
        *self == Self::Http1
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Backend {
    #[serde(default, deserialize_with = "null_as_default")]
    pub url: String,
    /// Relative share of requests; 0 never receives traffic. Absent means 1, as in Gateway API.
    #[serde(default = "default_weight")]
    pub weight: u32,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "BackendProtocol::is_default"
    )]
    pub protocol: BackendProtocol,
    #[serde(
        default,
        deserialize_with = "null_as_empty",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub filters: Vec<Filter>,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "is_false"
    )]
    pub websocket: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unavailable_status: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<BackendTls>,
    /// Dial only public addresses ([`crate::address::is_public`]) of the URL's host, checked at
    /// every dial: a name its owner picked (an ExternalName Service) cannot then reach the
    /// cluster or the node through a DNS record pointing at a private address. Absent: false.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "is_false"
    )]
    pub public_only: bool,
}

impl Default for Backend {
    fn default() -> Self {
        Self {
            url: String::new(),
            weight: default_weight(),
            protocol: BackendProtocol::default(),
            filters: Vec::new(),
            websocket: false,
            unavailable_status: None,
            tls: None,
            public_only: false,
        }
    }
}

/// Read also in the Go implementation's spelling, which its controller pushes: URI names in
/// `subjectAltNameUris`, and the client certificate as `clientCertPem` and `clientKeyPem`
/// (PEM, base64 as JSON carries bytes). Written in this crate's own.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", try_from = "BackendTlsWire")]
pub struct BackendTls {
    /// PEM bundle of CA certificates; absent: the platform's web roots; empty (`""`): no
    /// certificate is trusted, so every handshake fails (what the Go implementation means by a
    /// block without a bundle; a block in its spelling reads so).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_bundle: Option<String>,
    /// SNI and the name verified; absent: the URL's host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_name: Option<String>,
    /// Names accepted in the certificate instead of `serverName`: DNS names, IP addresses, or
    /// URIs (`spiffe://cluster.local/ns/shop/sa/api`), an entry that is neither a DNS name nor
    /// an IP address being read as a URI. The certificate must carry one of them as a subject
    /// alternative name of that type.
    #[serde(
        default,
        deserialize_with = "null_as_empty",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub subject_alt_names: Vec<String>,
    /// The certificate presented when the backend asks for one (mutual TLS); absent: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_certificate: Option<ClientCertificate>,
}

/// A client certificate and its private key, both PEM.
#[derive(Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClientCertificate {
    /// The certificate, then any intermediates it needs (`tls.crt` of a `kubernetes.io/tls`
    /// Secret).
    #[serde(default, deserialize_with = "null_as_default")]
    pub certificate_chain: String,
    /// The private key of the first certificate: PKCS#8, PKCS#1 (RSA) or SEC1 (EC) (`tls.key`).
    #[serde(default, deserialize_with = "null_as_default")]
    pub private_key: String,
}

/// [`BackendTls`] as either implementation writes it.
///
/// The two spellings share `caBundle`, `serverName` and `subjectAltNames`, and mean different
/// things by a block without `caBundle`: here the platform's web roots, in the Go
/// implementation an empty trust pool. Its controller writes such a block on purpose when a
/// BackendTLSPolicy's CA cannot be used, so that every handshake fails (502) rather than the
/// backend being reached unverified. A block that carries a field only Go writes
/// (`subjectAltNameUris`, `clientCertPem`, `clientKeyPem`) is therefore read as trusting
/// nothing when it has no bundle. One with none of them is the same text in both spellings
/// and keeps this crate's meaning.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct BackendTlsWire {
    #[serde(default)]
    ca_bundle: Option<String>,
    #[serde(default)]
    server_name: Option<String>,
    #[serde(default, deserialize_with = "null_as_empty")]
    subject_alt_names: Vec<String>,
    #[serde(default, deserialize_with = "null_as_empty")]
    subject_alt_name_uris: Vec<String>,
    #[serde(default)]
    client_certificate: Option<ClientCertificate>,
    #[serde(default)]
    client_cert_pem: Option<String>,
    #[serde(default)]
    client_key_pem: Option<String>,
}

impl TryFrom<BackendTlsWire> for BackendTls {
    type Error = String;

    fn try_from(w: BackendTlsWire) -> Result<Self, String> {
        use base64::Engine as _;
        let pem = |field: &str, text: &str| {
            base64::engine::general_purpose::STANDARD
                .decode(text)
                .ok()
                .and_then(|bytes| String::from_utf8(bytes).ok())
                .ok_or_else(|| format!("{field}: not base64-encoded PEM"))
        };
        let go_pair = match (&w.client_cert_pem, &w.client_key_pem) {
            (None, None) => None,
            (Some(cert), Some(key)) => Some(ClientCertificate {
                certificate_chain: pem("clientCertPem", cert)?,
                private_key: pem("clientKeyPem", key)?,
            }),
            _ => return Err("clientCertPem and clientKeyPem: set both or neither".to_owned()),
        };
        let go_spelled = !w.subject_alt_name_uris.is_empty() || go_pair.is_some();
        let client_certificate = match (w.client_certificate, go_pair) {
            (Some(_), Some(_)) => {
                return Err(
                    "clientCertificate and clientCertPem: one client certificate, not two"
                        .to_owned(),
                )
            }
            (ours, go) => ours.or(go),
        };
        let ca_bundle = match w.ca_bundle {
            None if go_spelled => Some(String::new()),
            bundle => bundle,
        };
        let mut subject_alt_names = w.subject_alt_names;
        subject_alt_names.extend(w.subject_alt_name_uris);
        Ok(Self {
            ca_bundle,
            server_name: w.server_name,
            subject_alt_names,
            client_certificate,
        })
    }
}

/// The key is left out: documents are logged at debug level.
impl std::fmt::Debug for ClientCertificate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientCertificate")
            .field("certificate_chain", &self.certificate_chain)
            .field("private_key", &"<redacted>")
            .finish()
    }
}

fn default_weight() -> u32 {
    1
}

fn is_false(b: &bool) -> bool {
    !*b
}
