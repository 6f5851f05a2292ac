//! HTTP and HTTPS listeners behind one tunnel, whose scheme reaches the proxy only as
//! `X-Forwarded-Proto`: where listeners of both schemes could take a request for the same host,
//! a rule also requires its listeners' scheme there, so an HTTP listener's redirect to https
//! never catches the HTTPS listener's requests. See docs/design/listeners-and-schemes.md.

use std::collections::{BTreeMap, BTreeSet};

use cftunnel_config::{Match, Rule, ValueMatch, ValueMatchType};

use super::hostname;

/// The header carrying the scheme a request reached the edge with.
const FORWARDED_PROTO: &str = "X-Forwarded-Proto";

/// The listeners of each scheme on one data plane: their hostnames, `None` for a listener
/// without one. A plane gets the usable listeners of every Gateway whose routes it serves: its
/// own Gateways and those of the other planes on its tunnel, which serve the union of the
/// tunnel's routes (see `super::scheme_listeners`), so planes on one tunnel hold the same
/// listeners, those of their route table.
#[derive(Debug, Default)]
pub(super) struct SchemeListeners {
    hosts: BTreeMap<&'static str, Vec<Option<String>>>,
}

impl SchemeListeners {
    pub(super) fn add(&mut self, scheme: &'static str, hostname: Option<String>) {
        self.hosts.entry(scheme).or_default().push(hostname);
    }

    /// Whether a listener of another scheme than `scheme` could take a request for `host`
    /// (`None`: a rule for any host).
    fn contested(&self, scheme: &str, host: Option<&str>) -> bool {
        self.hosts
            .iter()
            .filter(|(s, _)| **s != scheme)
            .flat_map(|(_, listeners)| listeners)
            .any(|listener| match (listener.as_deref(), host) {
                (None, _) => true,
                (Some(_), None) => false,
                (Some(l), Some(h)) => hostname::intersect_one(l, h).is_some(),
            })
    }

    /// The hostnames of the plane's listeners of `scheme` more specific than `hostname`, a
    /// listener's hostname (`None`: any host; an equal hostname is not more specific). Listener
    /// isolation across the route table, of any Gateway and port: route hostnames inside them
    /// are left out of the rules of routes attached through that listener, so another tenant's
    /// route cannot place rules under them. See docs/design/listeners-and-schemes.md.
    pub(super) fn more_specific_than<'a>(
        &'a self,
        scheme: &str,
        hostname: Option<&'a str>,
    ) -> impl Iterator<Item = &'a str> + 'a {
        self.hosts
            .get(scheme)
            .into_iter()
            .flatten()
            .filter_map(Option::as_deref)
            .filter(move |h| match hostname {
                None => true,
                Some(mine) => *h != mine && hostname::covered(h, mine),
            })
    }

    /// `rule`, served through listeners of `schemes`, as the plane serves it: split by host
    /// into the part no other scheme contests, as it is, and the part another does, which
    /// requires its listeners' scheme (either, for a route on listeners of both, which keeps
    /// its header count in step with the rules it shares those hosts with).
    pub(super) fn scope(&self, rule: Rule, schemes: &BTreeSet<&'static str>) -> Vec<Rule> {
        let contested = |host: Option<&str>| schemes.iter().any(|s| self.contested(s, host));
        if rule.hostnames.is_empty() {
            let mut rule = rule;
            if contested(None) {
                require(&mut rule, schemes);
            }
            return vec![rule];
        }
        let (contested, free): (Vec<String>, Vec<String>) = rule
            .hostnames
            .iter()
            .cloned()
            .partition(|h| contested(Some(h)));
        if contested.is_empty() {
            return vec![rule];
        }
        let mut scoped = rule;
        let rest = (!free.is_empty()).then(|| Rule {
            hostnames: free,
            ..scoped.clone()
        });
        scoped.hostnames = contested;
        require(&mut scoped, schemes);
        rest.into_iter().chain([scoped]).collect()
    }

    /// The listener-isolation rule of `hostname`, whose listeners there have `schemes`.
    pub(super) fn scope_isolation(
        &self,
        mut rule: Rule,
        hostname: &str,
        schemes: &BTreeSet<&'static str>,
    ) -> Rule {
        if schemes.iter().any(|s| self.contested(s, Some(hostname))) {
            require(&mut rule, schemes);
        }
        rule
    }
}

/// Adds to each of `rule`'s matches (to a match-all rule, one match) `X-Forwarded-Proto`
/// matching one of `schemes`.
fn require(rule: &mut Rule, schemes: &BTreeSet<&'static str>) {
    let header = match (schemes.len(), schemes.first()) {
        (1, Some(scheme)) => ValueMatch {
            kind: ValueMatchType::Exact,
            name: FORWARDED_PROTO.to_owned(),
            value: (*scheme).to_owned(),
        },
        _ => ValueMatch {
            kind: ValueMatchType::RegularExpression,
            name: FORWARDED_PROTO.to_owned(),
            value: schemes.iter().copied().collect::<Vec<_>>().join("|"),
        },
    };
    if rule.matches.is_empty() {
        rule.matches.push(Match::default());
    }
    for m in &mut rule.matches {
        m.headers.push(header.clone());
    }
}
