//! Every rule a config document must satisfy, written once.
//!
//! The proxy compiles a document only through [`rule`] (via [`document`]), and builds its route
//! table from what it returns; the controller calls [`check`], the same checks building
//! nothing, on every rule it emits and leaves out one that fails, reporting why on the route it
//! came from. Neither keeps a copy of these checks, so they cannot drift apart: a document the
//! controller pushes is one the proxy accepts.
//!
//! A checked [`Rule`] holds its values parsed (header names and values, methods, status codes,
//! backend URLs and TLS settings) and its regular expressions compiled with the engine and
//! limits the proxy matches with ([`Pattern`]), their matchers built. What a document's
//! regular expressions take together is bounded too ([`PATTERN_BUDGET`]), counted over the
//! checks between two [`Cache::keep_used`]. The leaf checks ([`hostname`], [`header_name`],
//! [`header_value`], [`replacement_path`], ...) are public too, for a caller that wants to name
//! a field in its own terms before it builds a rule (the controller names Gateway API fields).
//!
//! Pure: no I/O, no clock. [`Cache`] keeps compiled patterns and parsed targets between calls.

mod access;
mod at;
mod budget;
mod cache;
mod client_certificate;
mod costs;
mod filter;
mod name;
mod pattern;
mod rule;
mod status;
mod target;

pub use access::{access, audience, team_name, Access, MAX_AUDIENCES, MAX_AUDIENCE_LEN};
pub use budget::PATTERN_BUDGET;
pub use cache::Cache;
pub use client_certificate::ClientIdentity;
pub use costs::{regex_values, Costs};
pub use filter::{
    Allow, Cors, Filters, HeaderEdits, Mirror, PathEdit, Redirect, RequestEdit, Rewrite,
};
pub use name::{
    absolute_path, check_hostname, exact_hostname, header_name, header_value, hostname, method,
    replacement_path,
};
pub use pattern::{anchored, engine, escape, Pattern, PATTERN_SIZE_LIMIT};
pub use rule::{check, rule, Backend, Match, PathMatch, Retry, Rule, ValueMatch};
pub use status::{final_status, redirect_status, status};
pub use target::{ca_bundle, SubjectAltName, Target, TargetError, Tls};

use crate::Config;
use at::At;

/// Whether a check keeps the values it parses ([`rule`]) or only checks them ([`check`]): a
/// constant, so the form that keeps nothing compiles without the code that builds.
trait Keep {
    const BUILD: bool;
}

impl Keep for () {
    const BUILD: bool = false;
}

/// A value that breaks a rule of the contract: the field, relative to the rule
/// (`matches[0].path`), and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct Invalid {
    pub field: String,
    pub message: String,
}

impl Invalid {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }

    fn regex(field: impl Into<String>, message: impl std::fmt::Display) -> Self {
        Self::new(field, format!("regex does not compile: {message}"))
    }
}

/// A rule of a document that [`rule`] refused: where it is, its name, and why.
///
/// Displayed as the field from the document's root (`rules[3].matches[0].path: ...`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("rules[{index}].{invalid}")]
pub struct RuleRefused {
    /// Position in `rules`.
    pub index: usize,
    /// The rule's `name`, when it has one (`<namespace>/<route>/<rule>`).
    pub name: Option<String>,
    pub invalid: Invalid,
}

impl RuleRefused {
    /// The field from the document's root: `rules[3].matches[0].path`.
    pub fn field(&self) -> String {
        format!("rules[{}].{}", self.index, self.invalid.field)
    }
}

/// Checks every rule of `config`, in order, its patterns counted against the budget in
/// `cache` ([`PATTERN_BUDGET`]) with those of the checks since its last [`Cache::keep_used`].
///
/// # Errors
/// The first rule that fails, with its position and name.
pub fn document(config: &Config, cache: &mut Cache) -> Result<Vec<Rule>, RuleRefused> {
    config
        .rules
        .iter()
        .enumerate()
        .map(|(index, r)| {
            rule(r, cache).map_err(|invalid| RuleRefused {
                index,
                name: r.name.clone(),
                invalid,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests;
