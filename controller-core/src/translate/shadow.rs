//! Shadowed matches: a route whose rule repeats, on the same host, a match an older route
//! already placed on the plane is accepted, but the older route serves that match (Gateway API
//! precedence: the oldest route first). Nothing in the spec tells the newer route's owner, who
//! sees `Accepted=True` and no traffic; the `cf.k8s.lex.la/RouteShadowed` condition says it.
//!
//! Only identical matches count (the same path, headers, query parameters and method, on the
//! same hostname or wildcard): a match that differs in any field may still be served, so
//! claiming it is shadowed would be a guess.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use cftunnel_config::Rule;

use super::RouteKey;

/// Per plane: the route that first placed each (host, match).
#[derive(Debug, Default)]
pub(super) struct FirstClaims {
    planes: BTreeMap<super::PlaneKey, HashMap<(String, String), RouteKey>>,
}

/// What one route lost: per older route, the hosts and rules whose matches it holds.
#[derive(Debug, Default)]
pub(super) struct Shadowed {
    by: BTreeMap<RouteKey, (BTreeSet<String>, BTreeSet<String>)>,
}

impl FirstClaims {
    /// Records `rule` of `route` on `plane`, noting in `shadowed` each of its (host, match)
    /// pairs another route placed there first.
    pub(super) fn place(
        &mut self,
        plane: &super::PlaneKey,
        rule: &Rule,
        route: &RouteKey,
        shadowed: &mut Shadowed,
    ) {
        let claims = self.planes.entry(plane.clone()).or_default();
        let matches: Vec<String> = if rule.matches.is_empty() {
            vec![String::new()]
        } else {
            rule.matches
                .iter()
                .map(|m| serde_json::to_string(m).unwrap_or_default())
                .collect()
        };
        let any = [String::from("*")];
        let hosts = if rule.hostnames.is_empty() {
            &any[..]
        } else {
            &rule.hostnames[..]
        };
        for host in hosts {
            for m in &matches {
                match claims.get(&(host.clone(), m.clone())) {
                    Some(first) if first != route => {
                        let (lost_hosts, rules) = shadowed.by.entry(first.clone()).or_default();
                        lost_hosts.insert(host.clone());
                        if let Some(name) = rule_number(rule) {
                            rules.insert(name.to_owned());
                        }
                    }
                    Some(_) => {}
                    None => {
                        claims.insert((host.clone(), m.clone()), route.clone());
                    }
                }
            }
        }
    }
}

/// The rule's index in its route, from its `<namespace>/<route>/<rule>` name.
fn rule_number(rule: &Rule) -> Option<&str> {
    rule.name.as_deref()?.rsplit('/').next()
}

impl Shadowed {
    pub(super) fn is_empty(&self) -> bool {
        self.by.is_empty()
    }

    /// The condition's message: which older routes serve which of this route's matches.
    pub(super) fn message(&self) -> String {
        let parts: Vec<String> = self
            .by
            .iter()
            .map(|(older, (hosts, rules))| {
                let hosts: Vec<&str> = hosts.iter().map(String::as_str).collect();
                let rules: Vec<&str> = rules.iter().map(String::as_str).collect();
                format!(
                    "{older} serves the same matches first on {} (rules {} of this route)",
                    hosts.join(", "),
                    rules.join(", ")
                )
            })
            .collect();
        format!(
            "an older route takes these matches: {}; they are not served by this route",
            parts.join("; ")
        )
    }
}
