//! Which ExternalName Services a route may use as backends (`--external-name-backends`), and
//! the host the proxy dials for them. Dialled as written, a name its owner picks reaches
//! Services of other namespaces without a ReferenceGrant (the CVE-2021-25740 class), so names
//! are judged as written here and the proxy checks where they resolve (`publicOnly`).
//! See docs/design/external-name-backends.md.

use std::fmt;
use std::str::FromStr;

/// Which ExternalName Services are admitted as backends (`--external-name-backends`), spelled
/// `deny`, `external` or `any` ([`Self::as_str`], [`FromStr`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ExternalNameBackends {
    /// None: every backendRef to an ExternalName Service is refused.
    Deny,
    /// Names that do not mean the cluster as written, dialled as absolute names so that the
    /// proxy pod's search domains never apply; names under the cluster domain or
    /// `clusterset.local`, IP addresses, single labels and `localhost` are refused, and the
    /// proxy dials only public addresses of the rest (`publicOnly`).
    #[default]
    External,
    /// Any name, dialled as written (search domains apply): a route can reach any Service of
    /// the cluster through one.
    Any,
}

impl ExternalNameBackends {
    /// Every value, in the order the flag's help lists them.
    pub const ALL: [Self; 3] = [Self::Deny, Self::External, Self::Any];

    /// The flag's spelling of the value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Deny => "deny",
            Self::External => "external",
            Self::Any => "any",
        }
    }
}

impl fmt::Display for ExternalNameBackends {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A spelling of [`ExternalNameBackends`] that names none of its values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not one of deny, external, any")]
pub struct ParseExternalNameBackendsError(pub String);

impl FromStr for ExternalNameBackends {
    type Err = ParseExternalNameBackendsError;

    /// The flag's spellings, exactly (no other case, no surrounding space).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|v| v.as_str() == s)
            .ok_or_else(|| ParseExternalNameBackendsError(s.to_owned()))
    }
}

/// Why an ExternalName Service, or an ExternalBackend judged as one, is not admitted as a
/// backend. Each names the host and the field it was read from.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("ExternalName backends are not admitted (--external-name-backends=deny)")]
    Denied,
    #[error("{0} is not a DNS name")]
    NotADnsName(Written),
    #[error(
        "{name} is under the cluster domain {domain}, inside the cluster; only names outside \
         it are admitted (--external-name-backends=external)"
    )]
    ClusterDomain { name: Written, domain: Box<str> },
    #[error(
        "{0} is under {CLUSTER_SET_DOMAIN}, the multi-cluster Services domain, which reaches \
         Services of the cluster set; only names outside the cluster are admitted \
         (--external-name-backends=external)"
    )]
    ClusterSet(Written),
    #[error(
        "{0} is an IP address, which may be inside the cluster; only names outside it are \
         admitted (--external-name-backends=external)"
    )]
    IpAddress(Written),
    #[error(
        "{0} is an IP address that is not public (loopback, private, link-local, a cloud's \
         metadata or host endpoint, ...), which the proxy does not dial; only public addresses \
         are admitted (--external-name-backends=external)"
    )]
    NotPublic(Written),
    #[error(
        "{host} is an IP address in {range}, one of the cluster's own address ranges \
         (--cluster-cidrs), which the proxy does not dial; only addresses outside the cluster \
         are admitted (--external-name-backends=external)"
    )]
    ClusterRange { host: Written, range: Box<str> },
    #[error(
        "{0} names the proxy's own host; only names outside the cluster are admitted \
         (--external-name-backends=external)"
    )]
    Loopback(Written),
    #[error(
        "{0} is a single label, which resolves through the proxy pod's search domains; only \
         fully qualified names outside the cluster are admitted \
         (--external-name-backends=external)"
    )]
    SingleLabel(Written),
}

/// A host and the field it was read from: refusals quote it as `field "host"`, in the terms of
/// the object its owner wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    pub field: HostField,
    pub host: Box<str>,
}

impl fmt::Display for Written {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {:?}", self.field.as_str(), self.host)
    }
}

/// The field a dialled host is read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostField {
    /// An ExternalName Service's `spec.externalName`.
    ExternalName,
    /// An ExternalBackend's `spec.host`.
    ExternalBackendHost,
}

impl HostField {
    /// The field's name in refusals, as the object's owner knows it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ExternalName => "externalName",
            Self::ExternalBackendHost => "spec.host",
        }
    }

    /// `host`, as written in this field.
    pub(super) fn written(self, host: &str) -> Written {
        Written {
            field: self,
            host: host.into(),
        }
    }
}

/// The domain of multi-cluster Services (KEP-1645): its names resolve, through the cluster's
/// DNS, to Services of this cluster and its peers.
const CLUSTER_SET_DOMAIN: &str = "clusterset.local";

/// The host the proxy dials for an ExternalName Service whose `spec.externalName` is
/// `external_name` (or an ExternalBackend whose `spec.host` is, as `field` says), or why it is
/// refused under `admitted`.
///
/// With [`ExternalNameBackends::External`] the host ends with a dot: an absolute name, which
/// the resolver looks up as it is, never with the pod's search domains appended (the proxy
/// sends the client's host, not this one, in `Host`).
pub(super) fn dial_host(
    external_name: &str,
    field: HostField,
    admitted: ExternalNameBackends,
    cluster_domain: &str,
) -> Result<String, Refusal> {
    if admitted == ExternalNameBackends::Deny {
        return Err(Refusal::Denied);
    }
    // The API server takes a DNS-1123 subdomain with an optional trailing dot; anything else
    // (from manifests) would make the proxy refuse the whole push.
    let name = external_name.strip_suffix('.').unwrap_or(external_name);
    if !is_dns_subdomain(name) {
        return Err(Refusal::NotADnsName(field.written(external_name)));
    }
    if admitted == ExternalNameBackends::Any {
        return Ok(external_name.to_owned());
    }
    let labels: Vec<&str> = name.split('.').collect();
    // The resolver takes the legacy IPv4 forms too (`10.7`, `167772167`, `0x7f000001`,
    // `0177.0.0.1`), and a top-level domain is never numeric (RFC 3696 §2).
    if labels.last().is_some_and(|tld| is_ipv4_part(tld)) {
        return Err(Refusal::IpAddress(field.written(external_name)));
    }
    // RFC 6761 §6.3: `localhost` and names under it are the loopback interface.
    if labels.last() == Some(&"localhost") {
        return Err(Refusal::Loopback(field.written(external_name)));
    }
    if labels.len() < 2 {
        return Err(Refusal::SingleLabel(field.written(external_name)));
    }
    let domain = cluster_domain.trim_matches('.').to_ascii_lowercase();
    if !domain.is_empty() && is_under(name, &domain) {
        return Err(Refusal::ClusterDomain {
            name: field.written(external_name),
            domain: domain.into(),
        });
    }
    if is_under(name, CLUSTER_SET_DOMAIN) {
        return Err(Refusal::ClusterSet(field.written(external_name)));
    }
    Ok(format!("{name}."))
}

/// `name` is `domain` or a name under it (both without a trailing dot).
fn is_under(name: &str, domain: &str) -> bool {
    name == domain
        || name
            .strip_suffix(domain)
            .is_some_and(|rest| rest.ends_with('.'))
}

/// A DNS-1123 subdomain: at most 253 characters, dot-separated labels of lowercase letters,
/// digits and `-`, each starting and ending with a letter or digit.
fn is_dns_subdomain(name: &str) -> bool {
    let label_ok = |l: &str| {
        (1..=63).contains(&l.len())
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    (1..=253).contains(&name.len()) && name.split('.').all(label_ok)
}

/// A part of an IPv4 address as `inet_aton` reads it: decimal, octal or `0x` hexadecimal.
fn is_ipv4_part(label: &str) -> bool {
    let digits = label.strip_prefix("0x").unwrap_or(label);
    if digits.len() == label.len() {
        label.bytes().all(|b| b.is_ascii_digit())
    } else {
        digits.bytes().all(|b| b.is_ascii_hexdigit())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_parses_from_its_flag_spelling_and_nothing_else_does() {
        for value in ExternalNameBackends::ALL {
            assert_eq!(value.to_string().parse(), Ok(value));
        }
        for other in ["", "Deny", " any", "external.", "all"] {
            assert_eq!(
                other.parse::<ExternalNameBackends>(),
                Err(ParseExternalNameBackendsError(other.to_owned())),
                "{other:?}"
            );
        }
    }
}
