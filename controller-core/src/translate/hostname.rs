//! Hostname intersection (Gateway API Listener `hostname` and HTTPRoute/GRPCRoute
//! `spec.hostnames`): which hosts a route serves through a listener, and whether two sets of
//! hosts share one. Names are lower-cased; a wildcard `*.example.com` matches names with one or
//! more labels before `example.com`, never `example.com` itself.

use std::borrow::Cow;

/// The hosts a route serves through one listener, borrowed from the route's hostnames or the
/// listener's: a route's rules copy them once, into each rule.
#[derive(Debug, Clone)]
pub(super) enum Hosts<'h> {
    Any,
    /// One host: most routes name one hostname, which then takes no list.
    One(&'h str),
    Some(Vec<&'h str>),
}

/// The same hosts, however they are held.
impl PartialEq for Hosts<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.names() == other.names()
    }
}

impl Eq for Hosts<'_> {}

impl<'h> Hosts<'h> {
    /// The hosts; `None` for any host.
    pub(super) fn names(&self) -> Option<&[&'h str]> {
        match self {
            Self::Any => None,
            Self::One(name) => Some(std::slice::from_ref(name)),
            Self::Some(list) => Some(list),
        }
    }

    /// Whether the two share a host.
    pub(super) fn intersects(&self, other: &Self) -> bool {
        match (self.names(), other.names()) {
            (None, None) => true,
            (None, Some(list)) | (Some(list), None) => !list.is_empty(),
            (Some(a), Some(b)) => a
                .iter()
                .any(|x| b.iter().any(|y| intersect_one(x, y).is_some())),
        }
    }
}

/// Intersects a listener hostname with route hostnames (both lower-cased); `None` when they
/// share no host. The more specific of two intersecting names is kept.
pub(super) fn intersect<'h, S: AsRef<str>>(
    listener: Option<&'h str>,
    route: &'h [S],
) -> Option<Hosts<'h>> {
    match (listener, route) {
        (None, []) => Some(Hosts::Any),
        (None, [one]) => Some(Hosts::One(one.as_ref())),
        (None, _) => Some(Hosts::Some(route.iter().map(AsRef::as_ref).collect())),
        (Some(l), []) => Some(Hosts::One(l)),
        (Some(l), [one]) => intersect_one(l, one.as_ref()).map(Hosts::One),
        (Some(l), _) => {
            let hosts: Vec<&str> = route
                .iter()
                .filter_map(|r| intersect_one(l, r.as_ref()))
                .collect();
            (!hosts.is_empty()).then_some(Hosts::Some(hosts))
        }
    }
}

/// The more specific of two hostnames when one matches every host of the other (wildcards
/// included); `None` when they share no host.
pub(super) fn intersect_one<'h>(listener: &'h str, route: &'h str) -> Option<&'h str> {
    if listener == route {
        return Some(route);
    }
    match (listener.strip_prefix("*."), route.strip_prefix("*.")) {
        (Some(l), Some(r)) => {
            if is_subdomain(r, l) {
                Some(route)
            } else if is_subdomain(l, r) {
                Some(listener)
            } else {
                None
            }
        }
        (Some(l), None) => is_subdomain(route, l).then_some(route),
        (None, Some(r)) => is_subdomain(listener, r).then_some(listener),
        (None, None) => None,
    }
}

/// Every host `name` matches is also matched by `pattern`: what [`intersect_one`] keeps of the
/// two is `name` itself. Asked once per route hostname and listener, so it copies nothing.
pub(super) fn covered(name: &str, pattern: &str) -> bool {
    if name == pattern {
        return true;
    }
    match pattern.strip_prefix("*.") {
        // A wildcard covers the names (wildcards included) strictly under its domain.
        Some(domain) => is_subdomain(name.strip_prefix("*.").unwrap_or(name), domain),
        None => false,
    }
}

/// The hosts a route whose `spec.hostnames` are `route` serves through a listener with
/// hostname `listener` (`None` for one without), as the translation writes them under the
/// route's rules: `None` when the two share no host, an empty list for every host (neither has
/// a hostname), otherwise the hostnames and wildcards, lower-cased, the more specific of each
/// intersecting pair. So the hosts a rule gets through one Gateway's listeners can be told
/// apart from those it gets through another's. Case is ignored.
pub fn route_hosts_through<S: AsRef<str>>(
    listener: Option<&str>,
    route: &[S],
) -> Option<Vec<String>> {
    let listener = listener.map(lower);
    let route: Vec<Cow<'_, str>> = route.iter().map(|h| lower(h.as_ref())).collect();
    let hosts = intersect(listener.as_deref(), &route)?;
    Some(
        hosts
            .names()
            .unwrap_or_default()
            .iter()
            .map(|h| (*h).to_owned())
            .collect(),
    )
}

/// `name` lower-cased, copied only when it has an upper-case letter.
fn lower(name: &str) -> Cow<'_, str> {
    if name.bytes().any(|b| b.is_ascii_uppercase()) {
        Cow::Owned(name.to_ascii_lowercase())
    } else {
        Cow::Borrowed(name)
    }
}

/// `name` is a strict subdomain of `parent` (at least one more label).
pub(super) fn is_subdomain(name: &str, parent: &str) -> bool {
    name.len() > parent.len() + 1
        && name.ends_with(parent)
        && name.as_bytes().get(name.len() - parent.len() - 1) == Some(&b'.')
}

#[cfg(test)]
pub(super) mod tests {
    use super::{covered, intersect_one};
    use crate::translate::route_hosts_through;
    use proptest::prelude::*;

    /// Hostnames, wildcards among them, of one to three labels drawn from `labels`: few
    /// labels, so that generated names often nest and coincide.
    pub(in crate::translate) fn names(
        labels: &'static [&'static str],
    ) -> impl Strategy<Value = String> {
        (
            any::<bool>(),
            proptest::collection::vec(proptest::sample::select(labels), 1..4),
        )
            .prop_map(|(wild, labels)| {
                let name = labels.join(".");
                if wild {
                    format!("*.{name}")
                } else {
                    name
                }
            })
    }

    fn name() -> impl Strategy<Value = String> {
        names(&["a", "b", "ab"])
    }

    proptest! {
        /// A name is covered exactly when intersecting it with the pattern keeps the name.
        #[test]
        fn covered_is_what_the_intersection_keeps(name in name(), pattern in name()) {
            prop_assert_eq!(
                covered(&name, &pattern),
                intersect_one(&pattern, &name) == Some(name.as_str())
            );
        }
    }

    #[test]
    fn a_route_gets_the_intersection_of_its_hostnames_and_the_listeners() {
        let none: [&str; 0] = [];
        assert_eq!(route_hosts_through(None, &none), Some(vec![]));
        assert_eq!(
            route_hosts_through(Some("*.Example.com"), &none),
            Some(vec!["*.example.com".to_owned()])
        );
        assert_eq!(
            route_hosts_through(None, &["Shop.example.com", "*.example.com"]),
            Some(vec![
                "shop.example.com".to_owned(),
                "*.example.com".to_owned()
            ])
        );
        assert_eq!(
            route_hosts_through(
                Some("*.example.com"),
                &["shop.example.com", "example.com", "*.blog.example.com"]
            ),
            Some(vec![
                "shop.example.com".to_owned(),
                "*.blog.example.com".to_owned()
            ])
        );
        assert_eq!(
            route_hosts_through(Some("shop.example.com"), &["*.example.com"]),
            Some(vec!["shop.example.com".to_owned()])
        );
        assert_eq!(
            route_hosts_through(Some("shop.example.com"), &["blog.example.com"]),
            None
        );
    }
}
