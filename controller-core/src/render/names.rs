//! Names and labels of a Gateway's rendered objects.

use std::collections::BTreeMap;

use gateway_api::experimental::gateways::Gateway;

use sha2::{Digest, Sha256};

use super::{RenderError, GATEWAY_LABEL, PROXY_POD_LABEL};

/// Longest DNS-1035 label: the limit on Service names.
const MAX_LABEL: usize = 63;
const PREFIX: &str = "cf-proxy-";
const SERVICE_SUFFIX: &str = "-config";

/// The names of one Gateway's data-plane objects, all in the Gateway's namespace.
///
/// For a Gateway `edge` they are `cf-proxy-edge` (Deployment, NetworkPolicy, autoscaler),
/// `cf-proxy-edge-config` (Service) and `cf-proxy-edge-auth` (generated Secret). A Gateway name
/// that would make an invalid Service name (dots, or too long) is shortened and given a hash
/// of the full name, so two Gateways never share a plane by accident.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlaneNames {
    pub deployment: String,
    pub service: String,
    pub network_policy: String,
    pub autoscaler: String,
    pub auth_secret: String,
    /// Value of the [`GATEWAY_LABEL`] label.
    pub gateway_label: String,
    /// Value of Gateway API's `gateway-name` label: the Gateway's own name when it is a valid
    /// label value (dots are), else the shortened [`Self::gateway_label`].
    pub gateway_name_label: String,
}

impl PlaneNames {
    /// # Errors
    /// The Gateway has no name.
    pub fn for_gateway(gateway: &Gateway) -> Result<Self, RenderError> {
        let name = gateway
            .metadata
            .name
            .as_deref()
            .filter(|n| !n.is_empty())
            .ok_or(RenderError::GatewayMetadata("name"))?;
        Ok(Self::for_name(name))
    }

    fn for_name(name: &str) -> Self {
        let plain = format!("{PREFIX}{name}");
        let (base, gateway_label) = if is_dns_label(&format!("{plain}{SERVICE_SUFFIX}")) {
            (plain, name.to_owned())
        } else {
            let hash = short_hash(name);
            let room = MAX_LABEL - PREFIX.len() - SERVICE_SUFFIX.len() - 1 - hash.len();
            let mut stem: String = name
                .chars()
                .map(|c| match c.to_ascii_lowercase() {
                    c @ ('a'..='z' | '0'..='9') => c,
                    _ => '-',
                })
                .take(room)
                .collect();
            while stem.ends_with('-') {
                stem.pop();
            }
            let short = if stem.is_empty() {
                hash
            } else {
                format!("{stem}-{hash}")
            };
            (format!("{PREFIX}{short}"), short)
        };
        Self {
            gateway_name_label: if is_label_value(name) {
                name.to_owned()
            } else {
                gateway_label.clone()
            },
            service: format!("{base}{SERVICE_SUFFIX}"),
            auth_secret: format!("{base}-auth"),
            network_policy: base.clone(),
            autoscaler: base.clone(),
            deployment: base,
            gateway_label,
        }
    }

    /// The labels that select the plane's pods. A Deployment's selector cannot change, so
    /// nothing else goes in here.
    pub fn selector_labels(&self) -> BTreeMap<String, String> {
        let (name, value) = PROXY_POD_LABEL;
        BTreeMap::from([
            (name.to_owned(), value.to_owned()),
            (GATEWAY_LABEL.to_owned(), self.gateway_label.clone()),
        ])
    }

    /// The labels every rendered object and pod carries, besides the selector's: Gateway API's
    /// well-known labels for a Gateway's infrastructure (GEP-1762) among them, the class's
    /// as [`class_label`] gives it.
    pub fn object_labels(&self, class: &str) -> BTreeMap<String, String> {
        let mut labels = self.selector_labels();
        labels.insert(
            "app.kubernetes.io/managed-by".to_owned(),
            "cftunnel-controller".to_owned(),
        );
        labels.insert(
            "gateway.networking.k8s.io/gateway-name".to_owned(),
            self.gateway_name_label.clone(),
        );
        labels.insert(super::CLASS_LABEL.to_owned(), class_label(class));
        labels
    }
}

/// The value of the [`super::CLASS_LABEL`] label for the GatewayClass `class`: its name when
/// that is a valid label value, else (a class name may run to 253 characters) the name cut
/// short and given `-` and a hash of the whole name.
///
/// Every plane carries one, so that which class a plane was rendered for, and so which
/// installation rendered it, can be read off it whatever the class is called: a plane
/// without one can be told from no other installation's.
pub fn class_label(class: &str) -> String {
    if is_label_value(class) {
        return class.to_owned();
    }
    let hash = short_hash(class);
    // Class names are DNS subdomains, whose characters are all label-value characters;
    // anything else is made `-` all the same.
    let stem: String = class
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '-'
            }
        })
        .take(MAX_LABEL - 1 - hash.len())
        .collect();
    let stem = stem.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    if stem.is_empty() {
        hash
    } else {
        format!("{stem}-{hash}")
    }
}

/// The names the Go controller of the same API group gives a Gateway's data-plane objects, so
/// that a plane it rendered can be taken over or removed.
///
/// Its rule: the name (`cf-proxy-<gateway>`, with `-config` for the Service, `-netpol` for the
/// NetworkPolicy, `-auth` for the generated Secret; the autoscaler shares the Deployment's) is
/// kept when it is already a valid DNS label that does not end like a hash suffix (`-` and
/// eight lower-case hex digits); otherwise it is lower-cased, each other character made `-`,
/// cut to 54 characters, trimmed of `-` at both ends, and given `-` and the first eight hex
/// digits of the SHA-256 of the full name. For most Gateways only the NetworkPolicy's name
/// differs from ours.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GoControllerNames {
    pub deployment: String,
    pub service: String,
    pub network_policy: String,
    pub autoscaler: String,
    pub auth_secret: String,
}

impl GoControllerNames {
    /// # Errors
    /// The Gateway has no name.
    pub fn for_gateway(gateway: &Gateway) -> Result<Self, RenderError> {
        let name = gateway
            .metadata
            .name
            .as_deref()
            .filter(|n| !n.is_empty())
            .ok_or(RenderError::GatewayMetadata("name"))?;
        Ok(Self::for_name(name))
    }

    fn for_name(name: &str) -> Self {
        let deployment = go_object_name(&format!("{PREFIX}{name}"));
        Self {
            service: go_object_name(&format!("{PREFIX}{name}{SERVICE_SUFFIX}")),
            network_policy: go_object_name(&format!("{PREFIX}{name}-netpol")),
            auth_secret: go_object_name(&format!("{PREFIX}{name}-auth")),
            autoscaler: deployment.clone(),
            deployment,
        }
    }
}

/// An object name by the Go controller's rule ([`GoControllerNames`]).
fn go_object_name(name: &str) -> String {
    const HASH_HEX: usize = 8;
    let sanitized: String = name
        .to_lowercase()
        .chars()
        .map(|c| match c {
            'a'..='z' | '0'..='9' | '-' => c,
            _ => '-',
        })
        .collect();
    let b = name.as_bytes();
    let alphanumeric = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    let hash_shaped = b.len() > HASH_HEX
        && b[b.len() - HASH_HEX - 1] == b'-'
        && b[b.len() - HASH_HEX..]
            .iter()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c));
    if sanitized == name
        && b.len() <= MAX_LABEL
        && b.first().is_some_and(|c| alphanumeric(*c))
        && b.last().is_some_and(|c| alphanumeric(*c))
        && !hash_shaped
    {
        return name.to_owned();
    }
    let hash: String = Sha256::digest(name.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .take(HASH_HEX / 2)
        .collect();
    let body: String = sanitized.chars().take(MAX_LABEL - HASH_HEX - 1).collect();
    let body = body.trim_matches('-');
    if body.is_empty() {
        hash
    } else {
        format!("{body}-{hash}")
    }
}

/// A label value as Kubernetes checks it: at most 63 characters, alphanumerics, `-`, `_` and
/// `.`, starting and ending with an alphanumeric.
fn is_label_value(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_LABEL
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// RFC 1035 label as Kubernetes checks Service names: lower-case alphanumerics and `-`,
/// starting with a letter, ending with an alphanumeric, at most 63 characters.
fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_LABEL
        && b[0].is_ascii_lowercase()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

fn short_hash(name: &str) -> String {
    Sha256::digest(name.as_bytes())[..4]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_name_keeps_the_documented_names() {
        let n = PlaneNames::for_name("edge");
        assert_eq!(n.deployment, "cf-proxy-edge");
        assert_eq!(n.service, "cf-proxy-edge-config");
        assert_eq!(n.auth_secret, "cf-proxy-edge-auth");
        assert_eq!(n.gateway_label, "edge");
    }

    #[test]
    fn names_that_make_no_valid_service_name_are_shortened_with_a_hash() {
        let long = "a".repeat(60);
        for name in ["edge.example.com", long.as_str()] {
            let n = PlaneNames::for_name(name);
            assert!(is_dns_label(&n.service), "{name}: {}", n.service);
            assert!(n.gateway_label.len() <= MAX_LABEL, "{name}");
            assert!(n.service.ends_with("-config"));
            assert_ne!(n, PlaneNames::for_name(&format!("{name}x")), "{name}");
        }
        assert!(PlaneNames::for_name("edge.example.com")
            .deployment
            .starts_with("cf-proxy-edge-example-com-"));
        // The longest plain name that still fits is used as it is.
        let fits = "b".repeat(MAX_LABEL - PREFIX.len() - SERVICE_SUFFIX.len());
        assert_eq!(PlaneNames::for_name(&fits).gateway_label, fits);
    }

    /// The Go controller's names: ours but for the NetworkPolicy's for a plain name; hashed
    /// its own way for a name that is no DNS label or ends like its hash suffix.
    #[test]
    fn the_go_controllers_names_follow_its_rule() {
        assert_eq!(
            GoControllerNames::for_name("edge"),
            GoControllerNames {
                deployment: "cf-proxy-edge".to_owned(),
                service: "cf-proxy-edge-config".to_owned(),
                network_policy: "cf-proxy-edge-netpol".to_owned(),
                autoscaler: "cf-proxy-edge".to_owned(),
                auth_secret: "cf-proxy-edge-auth".to_owned(),
            }
        );
        let dotted = GoControllerNames::for_name("edge.example.com");
        let hash = |s: &str| -> String {
            Sha256::digest(s.as_bytes())[..4]
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect()
        };
        assert_eq!(
            dotted.deployment,
            format!(
                "cf-proxy-edge-example-com-{}",
                hash("cf-proxy-edge.example.com")
            )
        );
        assert_eq!(
            dotted.service,
            format!(
                "cf-proxy-edge-example-com-config-{}",
                hash("cf-proxy-edge.example.com-config")
            )
        );
        let shaped = GoControllerNames::for_name("edge-deadbeef");
        assert_eq!(
            shaped.deployment,
            format!("cf-proxy-edge-deadbeef-{}", hash("cf-proxy-edge-deadbeef"))
        );
        let long = GoControllerNames::for_name(&"a".repeat(70));
        assert_eq!(long.deployment.len(), MAX_LABEL);
        assert!(long.deployment.starts_with("cf-proxy-aaa"));
    }

    /// Gateway API's well-known labels name the Gateway and its class as they are; the
    /// selector carries neither, since a Deployment's selector cannot change.
    #[test]
    fn well_known_labels_carry_the_gateway_and_class_names() {
        let dotted = PlaneNames::for_name("edge.example.com");
        let labels = dotted.object_labels("cloudflare-tunnel");
        let get = |k: &str| labels.get(k).map(String::as_str);
        assert_eq!(
            get("gateway.networking.k8s.io/gateway-name"),
            Some("edge.example.com")
        );
        assert_eq!(
            get("gateway.networking.k8s.io/gateway-class-name"),
            Some("cloudflare-tunnel")
        );
        assert_ne!(
            get(GATEWAY_LABEL),
            Some("edge.example.com"),
            "shortened for names"
        );
        let selector = dotted.selector_labels();
        assert!(selector
            .keys()
            .all(|k| !k.starts_with("gateway.networking.k8s.io/")));

        let long = "g".repeat(70);
        let n = PlaneNames::for_name(&long);
        let labels = n.object_labels(&long);
        assert_eq!(
            labels.get("gateway.networking.k8s.io/gateway-name"),
            Some(&n.gateway_label),
            "too long for a label value: the shortened name"
        );
        assert_eq!(
            labels.get("gateway.networking.k8s.io/gateway-class-name"),
            Some(&class_label(&long))
        );
        assert!(labels.values().all(|v| is_label_value(v)));
    }

    /// A class name too long for a label value still gives its planes a class label: cut
    /// short, with a hash of the whole name, so two long names that start alike differ.
    #[test]
    fn a_class_name_too_long_for_a_label_value_is_shortened_with_a_hash() {
        assert_eq!(class_label("cloudflare-tunnel"), "cloudflare-tunnel");
        let fits = "c".repeat(MAX_LABEL);
        assert_eq!(class_label(&fits), fits);

        let long = format!("{}.example.com", "tenant-isolation-class".repeat(10));
        let label = class_label(&long);
        assert!(is_label_value(&label), "{label}");
        assert_eq!(label.len(), MAX_LABEL);
        assert!(label.starts_with("tenant-isolation-class"), "{label}");
        assert!(
            label.ends_with(&format!("-{}", short_hash(&long))),
            "{label}"
        );
        assert_ne!(label, class_label(&format!("{long}x")));
        // A stem ending in a dot is trimmed to a valid value.
        let dotted = format!("{}.{}", "d".repeat(53), "e".repeat(20));
        assert_eq!(
            class_label(&dotted),
            format!("{}-{}", "d".repeat(53), short_hash(&dotted))
        );
    }
}
