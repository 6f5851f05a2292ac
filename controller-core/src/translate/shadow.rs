//! Shadowed matches: a route whose rule repeats, on the same host, a match an older route
//! already placed on the plane is accepted, but the older route serves that match (Gateway API
//! precedence: the oldest route first). Nothing in the spec tells the newer route's owner, who
//! sees `Accepted=True` and no traffic; the `cf.k8s.lex.la/RouteShadowed` condition says it.
//!
//! Only identical matches count (the same path, headers, query parameters and method, on the
//! same hostname or wildcard): a match that differs in any field may still be served, so
//! claiming it is shadowed would be a guess.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::BuildHasher;

use cftunnel_config::Rule;
use hashbrown::hash_table::Entry;
use hashbrown::HashTable;
use rustc_hash::FxBuildHasher;

use super::RouteKey;

/// The host a rule of any host is placed on.
const ANY_HOST: &str = "*";

/// Per host of one plane (or `*`, for rules of any host): the route that first placed each
/// match there. Every rule stays placed, so claims refer to the plane's placed rules by
/// position: no host, match or route key is copied to claim it.
#[derive(Debug, Default)]
pub(super) struct FirstClaims {
    hosts: HashTable<HostClaims>,
    /// The matches placed on every host, by the placed rule and match that claimed each
    /// first: one table for the plane, where most hosts hold a match or two and a table each
    /// cost an allocation per host.
    matches: HashTable<MatchClaim>,
}

/// The host of one plane a rule was placed on.
#[derive(Debug)]
struct HostClaims {
    hash: u64,
    /// The host's number on the plane, which its matches' claims carry.
    id: usize,
    /// Where the host is written: the first rule placed on it and the host's position among
    /// that rule's hostnames (`None`: `*`).
    rule: usize,
    host: Option<usize>,
    /// The placed rule without matches that came first.
    matchless: Option<usize>,
}

/// A match claimed on a host: the host's number, the placed rule the match is in and its
/// position there, and the hash of the host's number and the match.
#[derive(Debug)]
struct MatchClaim {
    hash: u64,
    host: usize,
    rule: usize,
    matched: usize,
}

/// What an entry of [`HostClaims`] refers to: host `host` of placed rule `rule`.
fn host_of(rules: &[Rule], rule: usize, host: Option<usize>) -> &str {
    match host {
        None => ANY_HOST,
        Some(h) => rules[rule].hostnames[h].as_str(),
    }
}

/// What one route lost: per older route, the hosts and rules whose matches it holds.
#[derive(Debug, Default)]
pub(super) struct Shadowed {
    by: BTreeMap<RouteKey, (BTreeSet<String>, BTreeSet<String>)>,
}

impl FirstClaims {
    /// Room for the claims of `rules` rules of a host and a match or so each.
    pub(super) fn with_capacity(rules: usize) -> Self {
        Self {
            hosts: HashTable::with_capacity(rules),
            matches: HashTable::with_capacity(rules),
        }
    }

    /// Records the rule placed at `at` in `rules`, from the route at `at` in `routes`, whose
    /// matches hash to `match_hashes`, noting in `shadowed` each of its (host, match) pairs
    /// another route placed there first.
    pub(super) fn place(
        &mut self,
        rules: &[Rule],
        routes: &[RouteKey],
        at: usize,
        match_hashes: &[u64],
        shadowed: &mut Shadowed,
    ) {
        let (rule, route) = (&rules[at], &routes[at]);
        let Self { hosts, matches } = self;
        let any = rule.hostnames.is_empty();
        for h in 0..rule.hostnames.len().max(1) {
            let host_at = (!any).then_some(h);
            let host = host_of(rules, at, host_at);
            let hash = FxBuildHasher.hash_one(host);
            let id = hosts.len();
            let on_host = hosts
                .entry(
                    hash,
                    |c| c.hash == hash && host_of(rules, c.rule, c.host) == host,
                    |c| c.hash,
                )
                .or_insert_with(|| HostClaims {
                    hash,
                    id,
                    rule: at,
                    host: host_at,
                    matchless: None,
                })
                .into_mut();
            if rule.matches.is_empty() {
                match on_host.matchless {
                    Some(first) if routes[first] != *route => {
                        shadowed.lost(&routes[first], host, rule);
                    }
                    Some(_) => {}
                    None => on_host.matchless = Some(at),
                }
            }
            let id = on_host.id;
            for (j, (m, &match_hash)) in rule.matches.iter().zip(match_hashes).enumerate() {
                let hash = FxBuildHasher.hash_one((id, match_hash));
                let claim = matches.entry(
                    hash,
                    |c| c.hash == hash && c.host == id && rules[c.rule].matches[c.matched] == *m,
                    |c| c.hash,
                );
                match claim {
                    Entry::Occupied(first) => {
                        let first = &routes[first.get().rule];
                        if first != route {
                            shadowed.lost(first, host, rule);
                        }
                    }
                    Entry::Vacant(free) => {
                        free.insert(MatchClaim {
                            hash,
                            host: id,
                            rule: at,
                            matched: j,
                        });
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
