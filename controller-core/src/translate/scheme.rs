//! HTTP and HTTPS listeners behind one tunnel, whose scheme reaches the proxy only as
//! `X-Forwarded-Proto`: where listeners of both schemes could take a request for the same host,
//! a rule also requires its listeners' scheme there, so an HTTP listener's redirect to https
//! never catches the HTTPS listener's requests. See docs/design/listeners-and-schemes.md.

use std::fmt;

use cftunnel_config::{Match, Rule, ValueMatch, ValueMatchType};
use rustc_hash::FxHashSet;

use super::hostname;

/// The header carrying the scheme a request reached the edge with.
const FORWARDED_PROTO: &str = "X-Forwarded-Proto";

/// The scheme a listener's clients use: `https` for an HTTPS listener, else `http`. Ordered as
/// their names are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) enum Scheme {
    Http,
    Https,
}

impl Scheme {
    const ALL: [Self; 2] = [Self::Http, Self::Https];

    pub(super) fn as_str(self) -> &'static str {
        match self {
            Self::Http => "http",
            Self::Https => "https",
        }
    }

    fn bit(self) -> u8 {
        1 << self as u8
    }
}

impl fmt::Display for Scheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A set of schemes, iterated in their order: those of the listeners a route serves a host
/// through, or of the listeners of one hostname. Two bits, where an ordered set cost an
/// allocation per host. Ordered `http`, `https`, both.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Schemes(u8);

impl Schemes {
    pub(super) fn insert(&mut self, scheme: Scheme) {
        self.0 |= scheme.bit();
    }

    pub(super) fn union(&mut self, other: Self) {
        self.0 |= other.0;
    }

    pub(super) fn iter(self) -> impl Iterator<Item = Scheme> {
        Scheme::ALL
            .into_iter()
            .filter(move |s| self.0 & s.bit() != 0)
    }

    fn len(self) -> u32 {
        self.0.count_ones()
    }
}

/// The listeners of each scheme on one data plane: their hostnames, `None` for a listener
/// without one. A plane gets the usable listeners of every Gateway whose routes it serves: its
/// own Gateways and those of the other planes on its tunnel, which serve the union of the
/// tunnel's routes (see `super::scheme_listeners`), so planes on one tunnel hold the same
/// listeners, those of their route table.
///
/// Asked once per route hostname and listener, so answers come from hash lookups over the
/// labels of the name asked about, not a scan of every listener: a plane may hold thousands.
///
/// The names are borrowed from the listeners: copying each name and each of its parent domains
/// cost an allocation apiece, per listener and round.
#[derive(Debug, Default)]
pub(super) struct SchemeListeners<'g> {
    /// By [`Scheme`]; empty where a scheme has no listener.
    schemes: [Listeners<'g>; 2],
}

/// The hostnames of one scheme's listeners, indexed.
#[derive(Debug, Default)]
struct Listeners<'g> {
    /// A listener without a hostname: it takes every host.
    any: bool,
    /// Names without a wildcard.
    exact: FxHashSet<&'g str>,
    /// `example.com` for each `*.example.com`.
    wildcard: FxHashSet<&'g str>,
    /// Every domain an exact name is a strict subdomain of.
    exact_parents: FxHashSet<&'g str>,
    /// Every domain a wildcard's domain is a strict subdomain of.
    wildcard_parents: FxHashSet<&'g str>,
}

/// The domains `name` is a strict subdomain of (one label or more shorter), longest first.
fn parents(name: &str) -> impl Iterator<Item = &str> {
    // A byte scan: `.` is ASCII, so every `.` byte is a whole character (and a short name is
    // scanned faster this way than by the general substring search).
    name.bytes()
        .enumerate()
        .skip(1)
        .filter(|&(_, b)| b == b'.')
        .map(move |(i, _)| &name[i + 1..])
}

impl<'g> Listeners<'g> {
    fn add(&mut self, hostname: Option<&'g str>) {
        let Some(name) = hostname else {
            self.any = true;
            return;
        };
        match name.strip_prefix("*.") {
            Some(domain) => {
                self.wildcard_parents.extend(parents(domain));
                self.wildcard.insert(domain);
            }
            None => {
                self.exact_parents.extend(parents(name));
                self.exact.insert(name);
            }
        }
    }

    /// Whether a listener could take a request for `host` (`None`: a rule for any host), as
    /// [`hostname::intersect_one`] decides for each listener.
    fn intersect(&self, host: Option<&str>) -> bool {
        if self.any {
            return true;
        }
        let Some(host) = host else { return false };
        match host.strip_prefix("*.") {
            None => self.exact.contains(host) || parents(host).any(|p| self.wildcard.contains(p)),
            Some(domain) => {
                self.exact_parents.contains(domain)
                    || self.wildcard.contains(domain)
                    || self.wildcard_parents.contains(domain)
                    || parents(domain).any(|p| self.wildcard.contains(p))
            }
        }
    }

    /// The listener hostnames that match every host of `host` ([`hostname::covered`]): `host`
    /// itself, then the wildcards `*.<domain>` over it, each given as its domain, of those
    /// domains only the ones at least `shortest` bytes long (no shorter one is looked up).
    fn covering<'a>(
        &'a self,
        host: &'a str,
        shortest: usize,
    ) -> impl Iterator<Item = Covering<'a>> + 'a {
        // `host` itself, as an exact name or as a wildcard.
        let (own, domain) = match host.strip_prefix("*.") {
            None => (self.exact.contains(host), host),
            Some(domain) => (self.wildcard.contains(domain), domain),
        };
        own.then_some(Covering::Itself(host)).into_iter().chain(
            // Longest first: past the first too short, every one is.
            parents(domain)
                .take_while(move |p| p.len() >= shortest)
                .filter(|p| self.wildcard.contains(*p))
                .map(Covering::Wildcard),
        )
    }
}

impl<'g> SchemeListeners<'g> {
    pub(super) fn add(&mut self, scheme: Scheme, hostname: Option<&'g str>) {
        self.schemes[scheme as usize].add(hostname);
    }

    fn of(&self, scheme: Scheme) -> &Listeners<'g> {
        &self.schemes[scheme as usize]
    }

    /// Whether a listener of another scheme than `scheme` could take a request for `host`
    /// (`None`: a rule for any host).
    fn contested(&self, scheme: Scheme, host: Option<&str>) -> bool {
        Scheme::ALL
            .into_iter()
            .filter(|s| *s != scheme)
            .any(|s| self.of(s).intersect(host))
    }

    /// Whether `host`, served through a listener of `scheme` with `hostname` (`None`: any
    /// host), is left to a more specific listener of the plane: one of `scheme` whose hostname
    /// matches every host of `host` and is itself more specific than `hostname` (an equal
    /// hostname is not). Listener isolation across the route table, of any Gateway and port:
    /// such hostnames are left out of the rules of routes attached through the less specific
    /// listener, so another tenant's route cannot place rules under them. See
    /// docs/design/listeners-and-schemes.md.
    pub(super) fn taken_by_more_specific(
        &self,
        scheme: Scheme,
        hostname: Option<&str>,
        host: &str,
    ) -> bool {
        // Only a wildcard over a strict subdomain of a wildcard `hostname`'s domain can be
        // more specific than it, and none than an exact `hostname`: shorter domains are not
        // looked up (a route hostname has a few parents, asked about on every listener).
        let shortest = match hostname.map(|mine| mine.strip_prefix("*.")) {
            None => 0,
            Some(Some(parent)) => parent.len() + 2,
            Some(None) => usize::MAX,
        };
        self.of(scheme)
            .covering(host, shortest)
            .any(|s| match hostname {
                None => true,
                Some(mine) => s.more_specific_than(mine),
            })
    }

    /// `rule`, a rule for any host served through listeners of `schemes`, as the plane serves
    /// it: it requires their scheme where a listener of another scheme without a hostname
    /// could take its requests too, and is handed to `place`.
    pub(super) fn scope_any(
        &self,
        mut rule: Box<Rule>,
        schemes: Schemes,
        place: impl FnOnce(Box<Rule>),
    ) {
        if self.requires(schemes, None) {
            require(&mut rule, schemes);
        }
        place(rule)
    }

    /// `rule`, served under its hostnames, the one at position `i` through listeners of
    /// `schemes_of(i)`, as the plane serves it: split by host into the part no other scheme
    /// contests, as it is, and the parts another does, which require their listeners' scheme
    /// there (either, for a host served through listeners of both, which keeps its header
    /// count in step with the rules it shares that host with). A host takes the schemes of
    /// the listeners it is attached through, not those of the route's other hosts: one
    /// attached through the HTTPS listener alone is not served over http because another
    /// host of the route is. Each part is handed to `place`, the uncontested one first, then
    /// by the schemes required.
    pub(super) fn scope(
        &self,
        mut rule: Box<Rule>,
        schemes_of: impl Fn(usize) -> Schemes,
        mut place: impl FnMut(Box<Rule>),
    ) {
        // What a host requires: its schemes where another scheme contests it, else nothing.
        let required = |i: usize, host: &str| {
            let schemes = schemes_of(i);
            self.requires(schemes, Some(host)).then_some(schemes)
        };
        let Some((first, others)) = rule.hostnames.split_first() else {
            return place(rule);
        };
        // Almost always every host requires the same, most often nothing: the rule stays
        // whole.
        let first = required(0, first);
        if others
            .iter()
            .enumerate()
            .all(|(i, h)| required(i + 1, h) == first)
        {
            if let Some(schemes) = first {
                require(&mut rule, schemes);
            }
            return place(rule);
        }
        let mut parts: Vec<(Option<Schemes>, Vec<String>)> = Vec::new();
        for (i, host) in std::mem::take(&mut rule.hostnames).into_iter().enumerate() {
            let required = required(i, &host);
            match parts.iter_mut().find(|(r, _)| *r == required) {
                Some((_, hosts)) => hosts.push(host),
                None => parts.push((required, vec![host])),
            }
        }
        parts.sort_unstable_by_key(|(required, _)| *required);
        let Some((last_required, last_hosts)) = parts.pop() else {
            return;
        };
        for (required, hostnames) in parts {
            let mut part = Box::new(Rule {
                hostnames,
                ..Rule::clone(&rule)
            });
            if let Some(schemes) = required {
                require(&mut part, schemes);
            }
            place(part);
        }
        rule.hostnames = last_hosts;
        if let Some(schemes) = last_required {
            require(&mut rule, schemes);
        }
        place(rule);
    }

    /// Whether a rule for `host` (`None`: any host) served through listeners of `schemes`
    /// must require them: where a listener of another scheme could take its requests.
    fn requires(&self, schemes: Schemes, host: Option<&str>) -> bool {
        schemes.iter().any(|s| self.contested(s, host))
    }

    /// The listener-isolation rule of `hostname`, whose listeners there have `schemes`.
    pub(super) fn scope_isolation(&self, mut rule: Rule, hostname: &str, schemes: Schemes) -> Rule {
        if self.requires(schemes, Some(hostname)) {
            require(&mut rule, schemes);
        }
        rule
    }
}

/// A listener hostname that covers a name ([`Listeners::covering`]), without writing out the
/// wildcard: asked once per route hostname and listener.
#[derive(Debug, Clone, Copy)]
enum Covering<'a> {
    /// The name itself.
    Itself(&'a str),
    /// `*.<domain>`.
    Wildcard(&'a str),
}

impl Covering<'_> {
    /// Whether this hostname differs from `mine` and matches only hosts `mine` matches
    /// ([`hostname::covered`]).
    fn more_specific_than(self, mine: &str) -> bool {
        match self {
            Self::Itself(name) => name != mine && hostname::covered(name, mine),
            // `*.<domain>` is covered by another name only when that is a wildcard over a
            // strict parent of `domain`.
            Self::Wildcard(domain) => mine
                .strip_prefix("*.")
                .is_some_and(|parent| hostname::is_subdomain(domain, parent)),
        }
    }
}

/// Adds to each of `rule`'s matches (to a match-all rule, one match) `X-Forwarded-Proto`
/// matching one of `schemes`.
fn require(rule: &mut Rule, schemes: Schemes) {
    let header = match (schemes.len(), schemes.iter().next()) {
        (1, Some(scheme)) => ValueMatch {
            kind: ValueMatchType::Exact,
            name: FORWARDED_PROTO.to_owned(),
            value: scheme.as_str().to_owned(),
        },
        _ => ValueMatch {
            kind: ValueMatchType::RegularExpression,
            name: FORWARDED_PROTO.to_owned(),
            value: {
                let mut value =
                    String::with_capacity(schemes.iter().map(|s| s.as_str().len() + 1).sum());
                for scheme in schemes.iter() {
                    if !value.is_empty() {
                        value.push('|');
                    }
                    value.push_str(scheme.as_str());
                }
                value
            },
        },
    };
    if rule.matches.is_empty() {
        rule.matches.push(Match::default());
    }
    if let Some((last, others)) = rule.matches.split_last_mut() {
        for m in others {
            add_header(&mut m.headers, header.clone());
        }
        add_header(&mut last.headers, header);
    }
}

/// Pushes `header`; to a match without headers, most of them, as a list of one.
fn add_header(headers: &mut Vec<ValueMatch>, header: ValueMatch) {
    super::push_first_alone(headers, header);
}

#[cfg(test)]
mod tests {
    use super::{hostname, Scheme, SchemeListeners};
    use crate::translate::hostname::tests::names;
    use proptest::prelude::*;

    fn name() -> impl Strategy<Value = String> {
        names(&["a", "b", "c"])
    }

    fn listeners() -> impl Strategy<Value = Vec<(bool, Option<String>)>> {
        proptest::collection::vec(
            (any::<bool>(), proptest::option::weighted(0.9, name())),
            0..8,
        )
    }

    fn scheme(https: bool) -> Scheme {
        if https {
            Scheme::Https
        } else {
            Scheme::Http
        }
    }

    proptest! {
        /// The index answers exactly as asking every listener would.
        #[test]
        fn the_index_answers_as_a_scan_of_every_listener(
            listed in listeners(),
            host in proptest::option::weighted(0.9, name()),
            mine in proptest::option::weighted(0.8, name()),
            https in any::<bool>(),
        ) {
            let mut table = SchemeListeners::default();
            for (s, h) in &listed {
                table.add(scheme(*s), h.as_deref());
            }
            let asked = scheme(https);
            let contested = listed.iter().filter(|(s, _)| scheme(*s) != asked).any(|(_, l)| {
                match (l.as_deref(), host.as_deref()) {
                    (None, _) => true,
                    (Some(_), None) => false,
                    (Some(l), Some(h)) => hostname::intersect_one(l, h).is_some(),
                }
            });
            prop_assert_eq!(table.contested(asked, host.as_deref()), contested);
            if let Some(host) = &host {
                let taken = listed
                    .iter()
                    .filter(|(s, _)| scheme(*s) == asked)
                    .filter_map(|(_, l)| l.as_deref())
                    .filter(|l| match mine.as_deref() {
                        None => true,
                        Some(m) => *l != m && hostname::covered(l, m),
                    })
                    .any(|l| hostname::covered(host, l));
                prop_assert_eq!(
                    table.taken_by_more_specific(asked, mine.as_deref(), host),
                    taken
                );
            }
        }
    }
}
