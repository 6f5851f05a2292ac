//! Hostname ownership (opt-in, `--hostname-ownership`): on a cluster shared by tenants, a
//! namespace publishes only hostnames under the suffixes it is labelled for, so one tenant
//! cannot claim another's hostnames on a shared Gateway or tunnel.
//!
//! A namespace labelled `hostnames.cf.k8s.lex.la/example.com: "true"` may publish
//! `example.com`, any name under it and wildcards under it (`*.example.com`), nothing else. The
//! check applies to every name in a route's `spec.hostnames`, served or not, and to the hosts
//! the route serves on each listener (its hostnames intersected with the listener's), so a
//! route without hostnames takes its listener's, and one on a listener without a hostname
//! (every host) is never permitted. The chart's ValidatingAdmissionPolicy enforces the same rule
//! on `spec.hostnames` at admission ([`ADMISSION_EXPRESSION`]; its tests evaluate that
//! expression against [`permitted`]).

use std::collections::BTreeMap;

use super::hostname::Hosts;

/// The prefix of the namespace labels naming the suffixes it may publish.
pub const LABEL_PREFIX: &str = "hostnames.cf.k8s.lex.la/";

/// The value that turns a suffix label on; any other value leaves it off.
pub const LABEL_VALUE: &str = "true";

/// The CEL expression the chart's ValidatingAdmissionPolicy evaluates on an HTTPRoute or
/// GRPCRoute: [`permitted`], for every hostname of `spec.hostnames` (lower-case, as the
/// Gateway API CRDs require), with the labels of the route's namespace. The chart carries it
/// as text; its tests compare the two and evaluate the rendered one against [`permitted`].
pub const ADMISSION_EXPRESSION: &str = "!has(object.spec.hostnames) || \
object.spec.hostnames.all(h, has(namespaceObject.metadata.labels) && \
namespaceObject.metadata.labels.exists(k, k.startsWith('hostnames.cf.k8s.lex.la/') && \
namespaceObject.metadata.labels[k] == 'true' && \
(h == k.substring(24) || h.endsWith('.' + k.substring(24)))))";

/// Whether a namespace with `labels` may publish `host` (a hostname or a wildcard, any case).
pub fn permitted(host: &str, labels: Option<&BTreeMap<String, String>>) -> bool {
    let host = host.to_ascii_lowercase();
    suffixes(labels).any(|suffix| {
        host == suffix
            || host
                .strip_suffix(suffix)
                .is_some_and(|rest| rest.ends_with('.'))
    })
}

/// The suffixes `labels` turn on.
fn suffixes(labels: Option<&BTreeMap<String, String>>) -> impl Iterator<Item = &str> {
    labels
        .into_iter()
        .flatten()
        .filter(|(_, v)| v.as_str() == LABEL_VALUE)
        .filter_map(|(k, _)| k.strip_prefix(LABEL_PREFIX))
        .filter(|suffix| !suffix.is_empty())
}

/// Why a route in a namespace with `labels` may not serve `hosts`; `None` when it may.
pub(super) fn refusal(
    hosts: &Hosts<'_>,
    namespace: &str,
    labels: Option<&BTreeMap<String, String>>,
) -> Option<String> {
    match hosts {
        Hosts::Any => Some(format!(
            "namespace {namespace} may publish only hostnames under the suffixes it is labelled \
             for ({LABEL_PREFIX}<suffix>: \"true\"), and this route would serve every host: \
             give it spec.hostnames"
        )),
        Hosts::One(name) => names_refusal(&[name], namespace, labels),
        Hosts::Some(list) => names_refusal(list, namespace, labels),
    }
}

/// Why a route in a namespace with `labels` may not claim `names` (its `spec.hostnames`,
/// served or not); `None` when it may.
pub(super) fn names_refusal<S: AsRef<str>>(
    names: &[S],
    namespace: &str,
    labels: Option<&BTreeMap<String, String>>,
) -> Option<String> {
    names
        .iter()
        .map(AsRef::as_ref)
        .find(|h| !permitted(h, labels))
        .map(|h| {
            format!(
                "namespace {namespace} may not publish {h}: it carries no label \
             {LABEL_PREFIX}<suffix>: \"true\" for {h} or a domain above it"
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn a_suffix_permits_itself_names_and_wildcards_under_it_and_nothing_else() {
        let ns = labels(&[
            ("hostnames.cf.k8s.lex.la/example.com", "true"),
            ("hostnames.cf.k8s.lex.la/off.example.org", "false"),
            ("team", "a"),
        ]);
        for (host, allowed) in [
            ("example.com", true),
            ("Shop.Example.COM", true),
            ("a.b.example.com", true),
            ("*.example.com", true),
            ("*.b.example.com", true),
            ("badexample.com", false),
            ("example.com.evil.net", false),
            ("*.com", false),
            ("com", false),
            ("off.example.org", false),
            ("x.off.example.org", false),
        ] {
            assert_eq!(permitted(host, Some(&ns)), allowed, "{host}");
        }
        assert!(!permitted("example.com", None));
    }

    #[test]
    fn the_admission_expression_cuts_the_label_prefix_off_where_it_ends() {
        let cut = format!("k.substring({})", LABEL_PREFIX.len());
        assert_eq!(ADMISSION_EXPRESSION.matches(&cut).count(), 2);
        assert!(ADMISSION_EXPRESSION.contains(&format!("k.startsWith('{LABEL_PREFIX}')")));
        assert!(ADMISSION_EXPRESSION.contains(&format!("== '{LABEL_VALUE}'")));
    }

    #[test]
    fn the_refusal_names_the_first_host_not_permitted_and_every_host_is_never_permitted() {
        let ns = labels(&[("hostnames.cf.k8s.lex.la/example.com", "true")]);
        let hosts = Hosts::Some(vec!["a.example.com", "b.other.net"]);
        let why = refusal(&hosts, "team-a", Some(&ns)).unwrap_or_default();
        assert!(why.contains("may not publish b.other.net"), "{why}");
        assert_eq!(
            refusal(&Hosts::Some(vec!["a.example.com"]), "team-a", Some(&ns)),
            None
        );
        assert!(refusal(&Hosts::Any, "team-a", Some(&ns)).is_some());
    }
}
