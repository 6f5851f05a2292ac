//! `ExternalBackend` (`cf.k8s.lex.la/v1alpha1`): an origin outside the cluster, reached over
//! `http` or `https`, that an HTTPRoute or GRPCRoute names as a backendRef (group
//! `cf.k8s.lex.la`, kind `ExternalBackend`) instead of standing up an ExternalName Service.
//! The fields are those of the Go implementation's kind of the same group, so its objects apply
//! unchanged. `path` is a base path put before every request's path, and may carry a query
//! whose parameters are added to every request's (the request's own win a name both use).
//!
//! Its host is its owner's to point anywhere, as an ExternalName Service's name is, so it is
//! judged the same way (`--external-name-backends`, see
//! [`crate::translate::external_name`]): refused under `deny`, dialled only at public addresses
//! under `external`, as written under `any`.
//!
//! `tls` (an addition of ours, absent from the Go kind) says how an `https` one is verified,
//! with BackendTLSPolicy's vocabulary: CA certificates from ConfigMaps or Secrets of its own
//! namespace (key `ca.crt`) instead of the web roots, the name sent as SNI and verified, and
//! subject alternative names accepted instead of it. There is no way to skip verification: a
//! CA reference is how a private origin is trusted.

use cftunnel_config::{valid, BackendProtocol};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub const EXTERNAL_BACKEND_KIND: &str = "ExternalBackend";

/// The protocol an external backend is dialled with.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ExternalBackendScheme {
    #[default]
    Http,
    Https,
}

#[derive(
    CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema,
)]
#[kube(
    group = "cf.k8s.lex.la",
    version = "v1alpha1",
    kind = "ExternalBackend",
    derive = "Default",
    namespaced,
    shortname = "extbackend",
    printcolumn = r#"{"name": "Scheme", "type": "string", "jsonPath": ".spec.scheme"}"#,
    printcolumn = r#"{"name": "Host", "type": "string", "jsonPath": ".spec.host"}"#,
    printcolumn = r#"{"name": "Port", "type": "integer", "jsonPath": ".spec.port"}"#,
    printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#,
    doc = "An HTTP(S) origin outside the cluster that HTTPRoute and GRPCRoute backendRefs may name."
)]
#[serde(rename_all = "camelCase")]
pub struct ExternalBackendSpec {
    /// `http` or `https` (verified against the platform's web roots, or as `tls` says).
    pub scheme: ExternalBackendScheme,
    /// Hostname or IP address, without scheme, port or path; IPv6 literals bracketed
    /// (`[2001:db8::1]`).
    #[schemars(length(min = 1, max = 253), pattern(r"^[a-zA-Z0-9._:\[\]-]+$"))]
    pub host: String,
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
    /// Base path put before every request's path (`/v1`); it may end with a query
    /// (`/v1?token=abc`) whose parameters are added to every request's, the request's own
    /// winning a name both use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(r"^/.*$"))]
    pub path: Option<String>,
    /// How an `https` backend's certificate is verified (refused with `http`). Absent: against
    /// the platform's web roots, for `host`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<ExternalBackendTls>,
}

/// TLS verification of an `https` ExternalBackend, as a BackendTLSPolicy's `validation` says
/// it for a Service.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExternalBackendTls {
    /// ConfigMaps or Secrets of this namespace whose `ca.crt` holds PEM CA certificates; the
    /// certificate must chain to one of them. Absent or empty: the platform's web roots. One
    /// that is missing or holds no usable certificate makes the backend unusable (its share of
    /// requests gets 500), never a fallback to the web roots.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    pub ca_certificate_refs: Vec<CaCertificateRef>,
    /// The name sent as SNI and verified in the certificate. Absent: `host`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 253),
        pattern(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub hostname: Option<String>,
    /// Names accepted in the certificate instead of `hostname` (which is then the SNI only):
    /// the certificate must carry one of them as a subject alternative name of its type.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 5))]
    pub subject_alt_names: Vec<SubjectAltName>,
}

/// A ConfigMap or Secret of the ExternalBackend's namespace, as BackendTLSPolicy's
/// `caCertificateRefs` name them.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CaCertificateRef {
    /// The core group: empty.
    #[serde(default)]
    #[schemars(pattern(r"^$"))]
    pub group: String,
    /// `ConfigMap` or `Secret`.
    #[schemars(pattern(r"^(ConfigMap|Secret)$"))]
    pub kind: String,
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// A subject alternative name, as BackendTLSPolicy's `subjectAltNames` write one: `type`
/// `Hostname` with `hostname`, or `URI` with `uri`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SubjectAltName {
    /// `Hostname` or `URI`: which of the fields below holds the name.
    #[serde(rename = "type")]
    pub kind: SubjectAltNameType,
    /// With `type: Hostname`: a DNS name (a wildcard `*.` first label allowed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 253),
        pattern(r"^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub hostname: Option<String>,
    /// With `type: URI`: an absolute URI (`spiffe://cluster.local/ns/shop/sa/api`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 253),
        pattern(r"^(([^:/?#]+):)(//([^/?#]*))([^?#]*)(\?([^#]*))?(#(.*))?")
    )]
    pub uri: Option<String>,
}

/// Which kind of subject alternative name one is: a DNS name or a URI.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum SubjectAltNameType {
    #[default]
    Hostname,
    #[serde(rename = "URI")]
    Uri,
}

impl ExternalBackendSpec {
    /// The backend URL the proxy dials, or why there is none (the field named). The host is
    /// written in lower case: DNS names are case-insensitive, and lower case is the form the
    /// admission checks read.
    ///
    /// # Errors
    /// A port out of range, a path not starting with `/`, or a host that does not make a
    /// URL with them (one with a port or scheme of its own, an unbracketed IPv6 literal).
    pub fn url(&self) -> Result<String, String> {
        if !(1..=65535).contains(&self.port) {
            return Err(format!("port: {} is not between 1 and 65535", self.port));
        }
        let path = self.path.as_deref().unwrap_or_default();
        if !path.is_empty() && !path.starts_with('/') {
            return Err(format!("path: {path:?} does not start with /"));
        }
        let valid_host = !self.host.is_empty()
            && self.host.chars().all(|c| {
                c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':' | '[' | ']')
            });
        let scheme = match self.scheme {
            ExternalBackendScheme::Http => "http",
            ExternalBackendScheme::Https => "https",
        };
        let url = format!(
            "{scheme}://{}:{}{path}",
            self.host.to_ascii_lowercase(),
            self.port
        );
        // The config contract's reading of the URL: the host must come back as written.
        let target = valid::Target::new(&url, BackendProtocol::Http1, false, None, false).ok();
        let read_back =
            target.is_some_and(|t| *t.host == self.dial_host() && i32::from(t.port) == self.port);
        if !valid_host || !read_back {
            return Err(format!(
                "host: {:?} is not a hostname or IP address (no scheme, port or path; IPv6 bracketed)",
                self.host
            ));
        }
        Ok(url)
    }

    /// The host dialled, in lower case and without the brackets of an IPv6 literal.
    pub fn dial_host(&self) -> String {
        self.host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_ascii_lowercase()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(
        scheme: ExternalBackendScheme,
        host: &str,
        port: i32,
        path: Option<&str>,
    ) -> ExternalBackendSpec {
        ExternalBackendSpec {
            scheme,
            host: host.to_owned(),
            port,
            path: path.map(str::to_owned),
            tls: None,
        }
    }

    #[test]
    fn a_spec_makes_the_url_the_proxy_dials() {
        use ExternalBackendScheme::{Http, Https};
        assert_eq!(
            spec(Https, "api.example.com", 443, None).url().as_deref(),
            Ok("https://api.example.com:443")
        );
        assert_eq!(
            spec(Http, "api.example.com", 8080, Some("/v1?token=abc"))
                .url()
                .as_deref(),
            Ok("http://api.example.com:8080/v1?token=abc")
        );
        assert_eq!(
            spec(Http, "[2001:db8::1]", 80, None).url().as_deref(),
            Ok("http://[2001:db8::1]:80")
        );
        assert_eq!(
            spec(Http, "[2001:db8::1]", 80, None).dial_host(),
            "2001:db8::1"
        );
        // DNS names and IPv6 hex digits are case-insensitive: written in lower case.
        assert_eq!(
            spec(Https, "API.Example.com", 443, None).url().as_deref(),
            Ok("https://api.example.com:443")
        );
        assert_eq!(
            spec(Http, "[2001:DB8::A]", 80, None).dial_host(),
            "2001:db8::a"
        );
    }

    #[test]
    fn a_spec_that_makes_no_url_names_its_field() {
        use ExternalBackendScheme::Http;
        for (s, field) in [
            (spec(Http, "api.example.com", 0, None), "port:"),
            (spec(Http, "api.example.com", 70000, None), "port:"),
            (spec(Http, "api.example.com", 80, Some("v1")), "path:"),
            (spec(Http, "api.example.com:8080", 80, None), "host:"),
            (spec(Http, "2001:db8::1", 80, None), "host:"),
            (spec(Http, "", 80, None), "host:"),
            (spec(Http, "http://x", 80, None), "host:"),
        ] {
            let e = s.url().expect_err("refused");
            assert!(e.starts_with(field), "{e}");
        }
    }

    #[test]
    fn the_go_implementations_objects_read_unchanged() {
        let object: ExternalBackend = serde_json::from_value(serde_json::json!({
            "apiVersion": "cf.k8s.lex.la/v1alpha1",
            "kind": "ExternalBackend",
            "metadata": {"name": "legacy", "namespace": "shop"},
            "spec": {"scheme": "https", "host": "legacy.example.com", "port": 8443, "path": "/api"}
        }))
        .expect("reads");
        assert_eq!(
            object.spec.url().as_deref(),
            Ok("https://legacy.example.com:8443/api")
        );
    }
}
