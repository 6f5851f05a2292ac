//! What a request names: from its path, the resource (group, version, plural), the namespace,
//! the object and the subresource; from its query, the parameters (`watch`, `labelSelector`,
//! `fieldManager`, …).

use std::collections::BTreeMap;

/// A request's query parameters.
pub(super) type Params = BTreeMap<String, String>;

/// What a request path names.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Target {
    pub(super) group: String,
    pub(super) version: String,
    pub(super) plural: String,
    pub(super) namespace: Option<String>,
    pub(super) name: Option<String>,
    /// The `status` subresource.
    pub(super) status: bool,
    /// The `scale` subresource (Deployments).
    pub(super) scale: bool,
}

/// What `path` names; `None` for a path that names no resource (nor a subresource served
/// here).
pub(super) fn parse_path(path: &str) -> Option<Target> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match segments.as_slice() {
        ["api", version, rest @ ..] => (String::new(), (*version).to_owned(), rest),
        ["apis", group, version, rest @ ..] => ((*group).to_owned(), (*version).to_owned(), rest),
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, plural, tail @ ..] => {
            (Some((*ns).to_owned()), [&[*plural][..], tail].concat())
        }
        other => (None, other.to_vec()),
    };
    let (plural, name, sub) = match rest.as_slice() {
        [plural] => ((*plural).to_owned(), None, None),
        [plural, name] => ((*plural).to_owned(), Some((*name).to_owned()), None),
        [plural, name, sub @ ("status" | "scale")] => {
            ((*plural).to_owned(), Some((*name).to_owned()), Some(*sub))
        }
        _ => return None,
    };
    Some(Target {
        group,
        version,
        plural,
        namespace,
        name,
        status: sub == Some("status"),
        scale: sub == Some("scale"),
    })
}

/// The parameters of a query string (percent-decoded).
pub(super) fn parse_query(query: Option<&str>) -> Params {
    query
        .map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
        .unwrap_or_default()
}

/// Whether the parameters ask for a watch (`watch=true` or `watch=1`).
pub(super) fn is_watch(params: &Params) -> bool {
    params.get("watch").is_some_and(|w| w == "true" || w == "1")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(
        group: &str,
        version: &str,
        plural: &str,
        namespace: Option<&str>,
        name: Option<&str>,
    ) -> Target {
        Target {
            group: group.to_owned(),
            version: version.to_owned(),
            plural: plural.to_owned(),
            namespace: namespace.map(str::to_owned),
            name: name.map(str::to_owned),
            status: false,
            scale: false,
        }
    }

    #[test]
    fn core_and_group_paths_name_collections_and_objects() {
        assert_eq!(
            parse_path("/api/v1/namespaces"),
            Some(target("", "v1", "namespaces", None, None))
        );
        assert_eq!(
            parse_path("/api/v1/namespaces/ns"),
            Some(target("", "v1", "namespaces", None, Some("ns")))
        );
        assert_eq!(
            parse_path("/api/v1/namespaces/ns/secrets"),
            Some(target("", "v1", "secrets", Some("ns"), None))
        );
        assert_eq!(
            parse_path("/apis/apps/v1/namespaces/ns/deployments/web"),
            Some(target("apps", "v1", "deployments", Some("ns"), Some("web")))
        );
        assert_eq!(
            parse_path("/apis/gateway.networking.k8s.io/v1/gateways"),
            Some(target(
                "gateway.networking.k8s.io",
                "v1",
                "gateways",
                None,
                None
            ))
        );
    }

    #[test]
    fn status_and_scale_are_the_subresources_served() {
        let status =
            parse_path("/apis/gateway.networking.k8s.io/v1/namespaces/ns/gateways/g/status")
                .expect("status is served");
        assert!(status.status && !status.scale);
        assert_eq!(status.name.as_deref(), Some("g"));
        let scale = parse_path("/apis/apps/v1/namespaces/ns/deployments/web/scale")
            .expect("scale is served");
        assert!(scale.scale && !scale.status);
        assert_eq!(
            parse_path("/apis/apps/v1/namespaces/ns/deployments/web/rollback"),
            None
        );
    }

    #[test]
    fn paths_outside_the_api_name_nothing() {
        assert_eq!(parse_path("/healthz"), None);
        assert_eq!(parse_path("/apis/apps"), None);
    }

    #[test]
    fn query_parameters_are_decoded_and_watch_takes_true_or_one() {
        let params = parse_query(Some("labelSelector=app%3Dweb%2Ctier&watch=1"));
        assert_eq!(
            params.get("labelSelector").map(String::as_str),
            Some("app=web,tier")
        );
        assert!(is_watch(&params));
        assert!(is_watch(&parse_query(Some("watch=true"))));
        assert!(!is_watch(&parse_query(Some("watch=false"))));
        assert!(!is_watch(&parse_query(None)));
    }
}
