//! Shadowed matches: a route whose rule repeats, on the same host, a match an older route
//! already placed on the plane is accepted, but the older route serves that match (Gateway API
//! precedence: the oldest route first). Nothing in the spec tells the newer route's owner, who
//! sees `Accepted=True` and no traffic; the `cf.k8s.lex.la/RouteShadowed` condition says it.
//!
//! Only identical matches count (the same path, headers, query parameters and method, on the
//! same hostname or wildcard): a match that differs in any field may still be served, so
//! claiming it is shadowed would be a guess.

use std::collections::{BTreeMap, BTreeSet};

use cftunnel_config::{Match, Rule};
use rustc_hash::FxHashMap;

use super::RouteKey;

/// Per plane and host: the route that first placed each match there.
#[derive(Debug, Default)]
pub(super) struct FirstClaims {
    planes: BTreeMap<super::PlaneKey, FxHashMap<String, HostClaims>>,
}

/// The matches placed on one host (or `*`, for rules of any host), keyed by the match itself:
/// every rule is placed, so its matches are hashed as they are rather than encoded first.
#[derive(Debug, Default)]
struct HostClaims {
    /// The route that placed a rule without matches.
    matchless: Option<RouteKey>,
    matches: FxHashMap<Match, RouteKey>,
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
        if !self.planes.contains_key(plane) {
            self.planes.insert(plane.clone(), FxHashMap::default());
        }
        let Some(claims) = self.planes.get_mut(plane) else {
            return;
        };
        let any = [String::from("*")];
        let hosts = if rule.hostnames.is_empty() {
            &any[..]
        } else {
            &rule.hostnames[..]
        };
        for host in hosts {
            if !claims.contains_key(host) {
                claims.insert(host.clone(), HostClaims::default());
            }
            let Some(on_host) = claims.get_mut(host) else {
                continue;
            };
            if rule.matches.is_empty() {
                match &on_host.matchless {
                    Some(first) if first != route => shadowed.lost(first, host, rule),
                    Some(_) => {}
                    None => on_host.matchless = Some(route.clone()),
                }
            }
            for m in &rule.matches {
                match on_host.matches.get(m) {
                    Some(first) if first != route => shadowed.lost(first, host, rule),
                    Some(_) => {}
                    None => {
                        on_host.matches.insert(m.clone(), route.clone());
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
    /// Notes that `first` placed a match of `rule` on `host` before this route.
    fn lost(&mut self, first: &RouteKey, host: &str, rule: &Rule) {
        let (lost_hosts, rules) = self.by.entry(first.clone()).or_default();
        lost_hosts.insert(host.to_owned());
        if let Some(name) = rule_number(rule) {
            rules.insert(name.to_owned());
        }
    }

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
