//! What the translation of a route's rules yields, whichever its kind: the rule templates
//! placed into planes, the rules refused and why, and where a GRPCRoute match ranks. The
//! HTTPRoute and GRPCRoute translations produce these ([`super::http_route`],
//! [`super::grpc_route`]); attachment and the planes read them.

use std::cmp::Reverse;
use std::collections::BTreeSet;

use cftunnel_config::{valid, RequestRedirect, Rule};

use super::backend_ref::BackendRefError;
use super::backend_tls::PortKey;
use super::status::{Condition, ConditionType, Reason};

/// Why a rule is refused (dropped from the config; the route reports `PartiallyInvalid`, or
/// `Accepted=False` when no rule is left).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    #[error("{field}: regular expression does not compile: {message}")]
    InvalidRegex { field: String, message: String },
    #[error("{field}: invalid duration: {source}")]
    InvalidDuration {
        field: String,
        source: cftunnel_config::ParseDurationError,
    },
    #[error("{field}: {message}")]
    UnsupportedValue { field: String, message: String },
    /// The translated rule breaks a rule of the config contract, which the proxy would refuse
    /// (`invalid` names the field of the config rule).
    #[error("{field}: the proxy cannot take this rule: {invalid}")]
    Refused {
        field: String,
        invalid: valid::Invalid,
    },
}

impl RuleError {
    pub(super) fn unsupported(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::UnsupportedValue {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// A translated rule before it is placed in a plane: hostnames and listener-derived redirect
/// ports are filled per attachment ([`super::attachment::Attachment::place`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RuleTemplate {
    /// Boxed from here until it is placed in a plane's list: a rule is a few hundred bytes,
    /// and each step between (attachment, the scheme split, placement) moved it whole.
    pub(super) rule: Box<Rule>,
    /// Position of the rule in the route's `spec.rules`.
    pub(super) index: usize,
    /// Set for GRPCRoute rules, which hold one match each: where the match ranks in the
    /// GRPCRoute precedence order (see [`super::grpc_route`]).
    pub(super) grpc: Option<MatchRank>,
}

/// The `RequestRedirect`s of `rule` (its own and its backends') that set neither scheme nor
/// port: Gateway API gives them the port of the listener the request came through.
fn listener_port_redirects(rule: &mut Rule) -> impl Iterator<Item = &mut RequestRedirect> {
    rule.filters
        .iter_mut()
        .chain(rule.backends.iter_mut().flat_map(|b| b.filters.iter_mut()))
        .filter_map(|f| f.request_redirect.as_mut())
        .filter(|r| sets_no_port(r))
}

fn sets_no_port(redirect: &RequestRedirect) -> bool {
    redirect.port.is_none() && redirect.scheme.is_none()
}

/// Whether `rule` has a redirect that takes its listener's port ([`set_listener_port`]).
pub(super) fn takes_listener_port(rule: &Rule) -> bool {
    rule.filters
        .iter()
        .chain(rule.backends.iter().flat_map(|b| b.filters.iter()))
        .filter_map(|f| f.request_redirect.as_ref())
        .any(sets_no_port)
}

/// Gives `rule`'s redirects that set neither scheme nor port the port of the listeners it is
/// served through, `port`: `None` when they do not agree on one, or when it is the well-known
/// port of their protocol.
///
/// Gateway API RequestRedirect: with neither scheme nor port, the port is the listener's, and
/// it SHOULD NOT appear in `Location` when it is the well-known port of the listener's
/// protocol. Such a redirect keeps its port unset: the proxy then keeps the request's scheme
/// and adds no port. That matters here, since every request arrives through the tunnel as
/// https: port 80 would give `https://host:80/`. A redirect that sets a scheme but no port
/// also stays unset, and the proxy uses that scheme's well-known port.
pub(super) fn set_listener_port(rule: &mut Rule, port: Option<u16>) {
    if port.is_some() {
        for redirect in listener_port_redirects(rule) {
            redirect.port = port;
        }
    }
}

/// The rules of one route and what went wrong translating them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct TranslatedRoute {
    pub(crate) rules: Vec<RuleTemplate>,
    pub(crate) dropped: Vec<RuleError>,
    pub(crate) ref_errors: Vec<BackendRefError>,
    /// The Service ports its backends use.
    pub(crate) ports: BTreeSet<PortKey>,
}

impl TranslatedRoute {
    /// Whether every rule was dropped: the route is not accepted, wherever it is attached.
    pub(super) fn serves_nothing(&self) -> bool {
        self.rules.is_empty() && !self.dropped.is_empty()
    }

    pub(super) fn dropped_message(&self) -> String {
        let parts: Vec<String> = self.dropped.iter().map(ToString::to_string).collect();
        format!("dropped rules: {}", parts.join("; "))
    }

    pub(super) fn resolved_refs(&self, generation: Option<i64>) -> Condition {
        match self.ref_errors.first() {
            None => Condition::new(
                ConditionType::ResolvedRefs,
                true,
                Reason::ResolvedRefs,
                "",
                generation,
            ),
            Some(first) => {
                let parts: Vec<String> = self.ref_errors.iter().map(ToString::to_string).collect();
                // A reference that fails its backend outranks one still dialled.
                let worst = self
                    .ref_errors
                    .iter()
                    .find(|e| !e.still_dialled())
                    .unwrap_or(first);
                Condition::new(
                    ConditionType::ResolvedRefs,
                    false,
                    worst.reason(),
                    parts.join("; "),
                    generation,
                )
            }
        }
    }
}

/// Where a GRPCRoute match ranks among the matches of other rules for the same hostname
/// (GRPCRoute precedence, see [`super::grpc_route`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MatchRank {
    /// Characters of the service (pattern) the match names; 0 without one.
    pub(super) service: usize,
    /// Characters of the method (pattern) the match names; 0 without one.
    pub(super) method: usize,
    /// Header matches.
    pub(super) headers: usize,
    /// Position of the rule in the route, and of the match in the rule.
    pub(super) rule: usize,
    pub(super) matched: usize,
}

impl MatchRank {
    /// The document position key of the match, for a route at `route` in route precedence
    /// order: smaller comes first.
    pub(super) fn placement(self, route: usize) -> Placement {
        (
            Reverse(self.service),
            Reverse(self.method),
            Reverse(self.headers),
            route,
            self.rule,
            self.matched,
        )
    }
}

/// See [`MatchRank::placement`].
pub(super) type Placement = (
    Reverse<usize>,
    Reverse<usize>,
    Reverse<usize>,
    usize,
    usize,
    usize,
);
