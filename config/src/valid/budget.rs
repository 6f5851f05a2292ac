//! What a document's regular expressions may take together.
//!
//! Each pattern is bounded on its own ([`super::PATTERN_SIZE_LIMIT`]), but a proxy holds every
//! pattern of its document at once, and a few dozen patterns that each pass (a repetition of
//! a Unicode class, `\w{1,64}`, compiles to megabytes) would take hundreds of megabytes
//! together. So the distinct patterns of the rules of a document, each counted once however
//! many rules name it, may take [`PATTERN_BUDGET`] together, measured as [`Pattern::cost`];
//! the rule whose patterns would go past it is refused, at the field of the pattern that does.
//!
//! Counted in the [`Cache`](super::Cache) the checks share, from one
//! [`keep_used`](super::Cache::keep_used) to the next, by the proxy, which builds one
//! document in such a span ([`rule`](super::rule)). The controller's checks
//! ([`check`](super::check)) do not count it: they span every rule of a translation, whatever
//! plane's document the rule goes to, and one tenant's patterns must not take another plane's
//! budget. It weighs each plane's document apart before pushing it ([`Costs`](super::Costs))
//! and keeps it within the budget by choosing which rules go (those naming a regex no proxy
//! holds yet first, then those whose going frees most), where a proxy can only refuse
//! whichever rule crosses it in document order, which may be another tenant's serving one. A
//! rule a proxy refuses all the same (one of another release) is left out of that plane's
//! document too.

use super::{Invalid, Pattern};
use std::fmt;

/// Bound on the cost ([`Pattern::cost`], the heap of a pattern's NFA) of a document's distinct
/// patterns together. A proxy holds each pattern's NFA and, per thread that has matched it, a
/// lazy DFA cache that starts at about half the NFA's size, plus a few KiB: measured, a
/// document at the budget takes 30 to 40 MiB of a proxy's memory once each pattern has been
/// matched on one worker thread, and up to about 9 MiB more per further worker. Everyday
/// patterns (`/api/v[0-9]+/.*`, `[^/]+`) take a kilobyte or two, and `\w+` about 18 KiB, so
/// thousands fit; a repetition of a large class is what fills it (`\w{3,32}` takes 550 KiB,
/// `\w{1,64}/[\w.-]{1,64}` 2.2 MiB).
pub const PATTERN_BUDGET: usize = 16 * (1 << 20);

/// Where a pattern sits in its rule: the position style of [`Invalid::field`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Site {
    /// `matches[m].path`.
    Path { m: usize },
    /// `matches[m].headers[k].value`.
    Header { m: usize, k: usize },
    /// `matches[m].queryParams[k].value`.
    Query { m: usize, k: usize },
}

impl fmt::Display for Site {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Path { m } => write!(f, "matches[{m}].path"),
            Self::Header { m, k } => write!(f, "matches[{m}].headers[{k}].value"),
            Self::Query { m, k } => write!(f, "matches[{m}].queryParams[{k}].value"),
        }
    }
}

/// The refusal of the pattern at `site`, which takes `cost` past the budget. What the patterns
/// counted before it take is left out of the reason, as it moves with the other rules: a
/// refusal reported to a route's owner changes only with the rule.
pub(super) fn over(site: Site, cost: usize) -> Invalid {
    Invalid::new(
        site.to_string(),
        format!(
            "regex takes {} compiled, and with it the document's regexes take more than the {} \
             they may take together (a repetition of a large class, such as `\\w{{1,64}}`, \
             multiplies a regex's size; `\\w+`, or an ASCII class such as \
             `[a-zA-Z0-9_]{{1,64}}`, takes far less)",
            size(cost),
            size(PATTERN_BUDGET)
        ),
    )
}

/// `bytes` for a reader: KiB below a MiB, else MiB to one decimal (none if whole).
pub(super) fn size(bytes: usize) -> String {
    const MIB: usize = 1 << 20;
    if bytes < MIB {
        format!("{} KiB", bytes.div_ceil(1024))
    } else if bytes.is_multiple_of(MIB) {
        format!("{} MiB", bytes / MIB)
    } else {
        format!("{:.1} MiB", bytes as f64 / MIB as f64)
    }
}

/// The patterns of one rule with where each sits, in the order the checks met them: counted
/// against the budget once every other check of the rule passed.
#[derive(Debug, Default)]
pub(super) struct Named(Vec<(Pattern, Site)>);

impl Named {
    pub(super) fn push(&mut self, pattern: Pattern, site: Site) {
        self.0.push((pattern, site));
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &(Pattern, Site)> {
        self.0.iter()
    }

    /// Whether a pattern before position `i` is the one at `i`: a pattern named twice in a
    /// rule counts once.
    pub(super) fn repeats(&self, i: usize) -> bool {
        match (self.0.get(..i), self.0.get(i)) {
            (Some(before), Some((p, _))) => before.iter().any(|(q, _)| q.source() == p.source()),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests;
