//! How a route is attached within one data plane, host by host: for each host it serves there,
//! the schemes and redirect ports of the listeners it is attached through for that host, and
//! the rules it places there. A host reached through the HTTPS listener alone is served over
//! https alone, whatever other hosts of the route an HTTP listener takes (see
//! docs/design/listeners-and-schemes.md, decision 1).

use cftunnel_config::Rule;

use super::hostname::Hosts;
use super::rule;
use super::scheme::{Scheme, SchemeListeners, Schemes};

/// The listeners a route serves a host through: their schemes and redirect ports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Through {
    schemes: Schemes,
    ports: RedirectPorts,
}

impl Through {
    fn of(scheme: Scheme, port: Option<u16>) -> Self {
        let mut through = Self::default();
        through.schemes.insert(scheme);
        through.ports.insert(port);
        through
    }

    fn merge(&mut self, other: Self) {
        self.schemes.union(other.schemes);
        self.ports.merge(other.ports);
    }
}

/// How a route is attached within one data plane: the hosts it serves there, each with the
/// listeners it is attached through for that host.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Attachment<'h> {
    /// The attached listeners without a hostname, for a route without hostnames: they serve
    /// its rules for any host, which their schemes alone scope. A scheme only a listener with
    /// a hostname has would add a header match there, and Gateway API precedence counts
    /// header matches, so those rules would outrank older ones for the same path. `hosts`
    /// still counts then: the hosts of more specific listeners are served by their
    /// listeners' rules alone (listener isolation), so the route's rules go under them too.
    any: Option<Through>,
    /// The hosts served through listeners with a hostname, or through listeners without one
    /// for a route with hostnames (borrowed from the route's hostnames or its listeners'),
    /// each with the listeners it is attached through. In order and each once after
    /// [`Attachment::settle`].
    hosts: Vec<(&'h str, Through)>,
}

impl<'h> Attachment<'h> {
    /// Adds a listener of `scheme` and redirect port `port` (see [`RedirectPorts`]) through
    /// which the route serves `hosts`.
    pub(super) fn add(&mut self, hosts: &Hosts<'h>, scheme: Scheme, port: Option<u16>) {
        let through = Through::of(scheme, port);
        let Some(names) = hosts.names() else {
            self.any.get_or_insert_default().merge(through);
            return;
        };
        let same_hosts = self.hosts.len() == names.len()
            && self.hosts.iter().zip(names).all(|((h, _), n)| h == n);
        if same_hosts {
            // The route's listeners of both schemes most often give it the same hosts: each
            // takes the listener here, with no entry to merge when the attachment settles.
            for (_, t) in &mut self.hosts {
                t.merge(through);
            }
        } else if self.hosts.is_empty() {
            // Allocated at its length, without the growth path.
            self.hosts = names.iter().map(|n| (*n, through)).collect();
        } else {
            self.hosts.extend(names.iter().map(|n| (*n, through)));
        }
    }

    /// Adds `other`'s hosts and listeners.
    pub(super) fn merge(&mut self, other: Self) {
        if let Some(any) = other.any {
            self.any.get_or_insert_default().merge(any);
        }
        if self.hosts.is_empty() {
            self.hosts = other.hosts;
        } else {
            self.hosts.extend(other.hosts);
        }
    }

    /// Puts the hosts in order, each once with every listener it is attached through, as the
    /// rules carry them.
    pub(super) fn settle(&mut self) {
        self.hosts.sort_unstable_by(|a, b| a.0.cmp(b.0));
        self.hosts.dedup_by(|later, kept| {
            let same = later.0 == kept.0;
            if same {
                kept.1.merge(later.1);
            }
            same
        });
    }

    /// Whether the route serves any host through the attachment: not when every one of its
    /// hostnames belongs to more specific listeners.
    pub(super) fn serves(&self) -> bool {
        self.any.is_some() || !self.hosts.is_empty()
    }

    /// Places `rule`, a route rule without hostnames, as the attachment serves it on a plane
    /// whose listeners are `listeners`: for any host through the listeners without a
    /// hostname, and under the hosts, each for the schemes of its own listeners (see
    /// [`SchemeListeners::scope`]) and, for a redirect that sets neither scheme nor port,
    /// with their port. Each rule is handed to `place`, the one for any host first.
    pub(super) fn place(
        &self,
        rule: Box<Rule>,
        listeners: Option<&SchemeListeners<'_>>,
        mut place: impl FnMut(Box<Rule>),
    ) {
        let takes_port = rule::takes_listener_port(&rule);
        let rule = match self.any {
            None => rule,
            Some(any) => {
                let (mut for_any, rest) = if self.hosts.is_empty() {
                    (rule, None)
                } else {
                    (rule.clone(), Some(rule))
                };
                if takes_port {
                    rule::set_listener_port(&mut for_any, any.ports.shared());
                }
                match listeners {
                    Some(listeners) => listeners.scope_any(for_any, any.schemes, &mut place),
                    None => place(for_any),
                }
                match rest {
                    Some(rule) => rule,
                    None => return,
                }
            }
        };
        // Under no host it would be a rule for any host: none is placed.
        if self.hosts.is_empty() {
            return;
        }
        let port = |h: &(&str, Through)| h.1.ports.shared();
        let first_port = self.hosts.first().and_then(port);
        if !takes_port || self.hosts.iter().all(|h| port(h) == first_port) {
            return place_under(rule, &self.hosts, takes_port, listeners, &mut place);
        }
        // Listeners of different ports for different hosts: a rule per port, each under the
        // hosts of its listeners.
        let mut ports: Vec<Option<u16>> = self.hosts.iter().map(port).collect();
        ports.sort_unstable();
        ports.dedup();
        let Some((last, others)) = ports.split_last() else {
            return;
        };
        let hosts_of = |p: Option<u16>| -> Vec<(&str, Through)> {
            self.hosts
                .iter()
                .filter(|h| port(h) == p)
                .copied()
                .collect()
        };
        for p in others {
            place_under(rule.clone(), &hosts_of(*p), true, listeners, &mut place);
        }
        place_under(rule, &hosts_of(*last), true, listeners, &mut place);
    }
}

/// Places `rule` under `hosts`, which share one redirect port: with `takes_port`, its
/// redirects carry it.
fn place_under(
    mut rule: Box<Rule>,
    hosts: &[(&str, Through)],
    takes_port: bool,
    listeners: Option<&SchemeListeners<'_>>,
    mut place: impl FnMut(Box<Rule>),
) {
    rule.hostnames = hosts.iter().map(|(h, _)| (*h).to_owned()).collect();
    if takes_port {
        let port = hosts.first().and_then(|h| h.1.ports.shared());
        rule::set_listener_port(&mut rule, port);
    }
    match listeners {
        Some(listeners) => listeners.scope(
            rule,
            |i| hosts.get(i).map_or_else(Schemes::default, |h| h.1.schemes),
            place,
        ),
        None => place(rule),
    }
}

/// For the listeners a route serves a host through, the port a `RequestRedirect` that sets
/// neither scheme nor port carries: the listener's, or `None` when that is the well-known port
/// of the listener's protocol (left out of `Location`). Only whether they all agree on one
/// port is needed, so that is all that is kept.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum RedirectPorts {
    #[default]
    None,
    /// Every listener so far carries this one.
    One(Option<u16>),
    /// They differ.
    Several,
}

impl RedirectPorts {
    fn insert(&mut self, port: Option<u16>) {
        *self = match *self {
            Self::None => Self::One(port),
            Self::One(one) if one == port => Self::One(one),
            _ => Self::Several,
        };
    }

    fn merge(&mut self, other: Self) {
        match other {
            Self::None => {}
            Self::One(port) => self.insert(port),
            Self::Several => *self = Self::Several,
        }
    }

    /// The port every listener carries, when they agree on one that is not left out.
    fn shared(self) -> Option<u16> {
        match self {
            Self::One(port) => port,
            _ => None,
        }
    }
}
