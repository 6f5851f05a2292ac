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
//! budget. It weighs each plane's document apart before pushing it ([`Costs`]) and keeps it
//! within the budget by choosing which rules go (those naming a regex no proxy holds yet
//! first, then those whose going frees most), where a proxy can only refuse whichever rule
//! crosses it in document order, which may be another tenant's serving one. A rule a proxy
//! refuses all the same (one of another release) is left out of that plane's document too.

use super::{rule, Cache, Invalid, Pattern};
use crate::document as doc;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
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

/// The refusal of the pattern at `site`, which takes `cost` where the patterns counted before
/// it took `spent` already.
pub(super) fn over(site: Site, cost: usize, spent: usize) -> Invalid {
    Invalid::new(
        site.to_string(),
        format!(
            "regex takes {} compiled, and the regexes counted before it {}: over the {} a \
             document's regexes may take together (a repetition of a large class, such as \
             `\\w{{1,64}}`, multiplies a regex's size; `\\w+`, or an ASCII class such as \
             `[a-zA-Z0-9_]{{1,64}}`, takes far less)",
            size(cost),
            size(spent),
            size(PATTERN_BUDGET)
        ),
    )
}

/// Why a rule was left out of a document past the budget: its costliest pattern, at `site`;
/// `own` is what its patterns take, `total` what the document's took with every rule kept.
fn cut(site: Site, own: usize, total: usize) -> Invalid {
    Invalid::new(
        site.to_string(),
        format!(
            "the document's regexes take {} compiled together, over the {} they may take, and \
             rules naming a regex the proxies do not hold yet go first, then those whose going \
             frees most (this rule's take {}; a repetition of a large class, such as \
             `\\w{{1,64}}`, multiplies a regex's size, and an ASCII class such as \
             `[a-zA-Z0-9_]{{1,64}}` takes far less)",
            size(total),
            size(PATTERN_BUDGET),
            size(own)
        ),
    )
}

/// `bytes` for a reader: KiB below a MiB, else MiB to one decimal (none if whole).
fn size(bytes: usize) -> String {
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

/// What the patterns of each rule of a document take of [`PATTERN_BUDGET`], each distinct
/// pattern counted once as a proxy counts it: for a caller that places rules on several
/// documents (the controller, one per data plane) and keeps each within the budget by choosing
/// which rules go ([`Costs::cut`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Costs {
    /// The cost of each distinct pattern, by first appearance.
    costs: Vec<usize>,
    /// The rules that name patterns, in document order.
    rules: Vec<RuleCost>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct RuleCost {
    /// Position in the document.
    at: usize,
    /// Its distinct patterns (positions in [`Costs::costs`]), each where it sits first.
    patterns: Vec<(usize, Site)>,
    /// What they take together.
    own: usize,
    /// It may be left out ([`Costs::of`]).
    may_go: bool,
}

impl Costs {
    /// No rule names a pattern.
    pub const NONE: &'static Costs = &Costs {
        costs: Vec::new(),
        rules: Vec::new(),
    };

    /// The costs of `rules`, a document's, each checked as [`super::check`] checks it: a rule
    /// that fails counts nothing (it is not pushed). The patterns come from `cache`, where the
    /// checks that passed the rules compiled them. A rule at a position `may_go` refuses is
    /// never left out by [`Costs::cut`] (a rule the document cannot do without); its patterns
    /// count all the same.
    ///
    /// Empty, with nothing checked again, when every pattern the document names, each once,
    /// takes no more than the budget together: what a proxy counts cannot be more.
    pub fn of(rules: &[doc::Rule], cache: &mut Cache, may_go: impl Fn(usize) -> bool) -> Self {
        if named_at_most(rules, cache) <= PATTERN_BUDGET {
            return Self::default();
        }
        let mut ids: hashbrown::HashMap<Box<str>, usize, foldhash::fast::RandomState> =
            hashbrown::HashMap::default();
        let mut costs = Costs::default();
        for (at, r) in rules.iter().enumerate() {
            // Most rules name no pattern, and are not checked again for none.
            if !names_pattern(r) {
                continue;
            }
            let named = rule::named(r, cache);
            let mut patterns = Vec::new();
            let mut own = 0;
            for (i, (pattern, site)) in named.iter().enumerate() {
                if named.repeats(i) {
                    continue;
                }
                let id = match ids.get(pattern.source()) {
                    Some(&id) => id,
                    None => {
                        costs.costs.push(pattern.cost());
                        ids.insert(pattern.source().into(), costs.costs.len() - 1);
                        costs.costs.len() - 1
                    }
                };
                own += pattern.cost();
                patterns.push((id, *site));
            }
            if !patterns.is_empty() {
                costs.rules.push(RuleCost {
                    at,
                    patterns,
                    own,
                    may_go: may_go(at),
                });
            }
        }
        costs
    }

    /// Whether no rule names a pattern.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// What the patterns of the rules at `kept` (positions in the document, ascending) take
    /// together, each distinct pattern once.
    pub fn total(&self, kept: &[usize]) -> usize {
        let mut named = vec![false; self.costs.len()];
        for r in self.kept(kept) {
            for &(id, _) in &r.patterns {
                named[id] = true;
            }
        }
        named
            .iter()
            .zip(&self.costs)
            .filter_map(|(&named, &cost)| named.then_some(cost))
            .sum()
    }

    /// The rules of `kept` (positions in the document, ascending) to leave out so that what
    /// the patterns of the rest take fits [`PATTERN_BUDGET`], each with why, at the field of
    /// its costliest pattern. Those `served` says are not served yet go first (for the budget:
    /// a rule whose patterns the proxies hold already adds nothing), then the others; within
    /// each, the rule whose going frees most first (rules kept may name its patterns too), the
    /// costliest and then the later in the document first among equals. A rule cut on the way
    /// that fits back beside the rest is kept.
    /// What cannot be cut ([`Costs::of`]) stays, and so might leave the document past the
    /// budget.
    pub fn cut(&self, kept: &[usize], served: impl Fn(usize) -> bool) -> Vec<(usize, Invalid)> {
        let total = self.total(kept);
        if total <= PATTERN_BUDGET {
            return Vec::new();
        }
        let mut users = vec![0_usize; self.costs.len()];
        let mut order: Vec<(bool, &RuleCost)> = self.kept(kept).map(|r| (false, r)).collect();
        for (_, r) in &order {
            for &(id, _) in &r.patterns {
                users[id] += 1;
            }
        }
        order.retain(|(_, r)| r.may_go);
        for (is_served, r) in &mut order {
            *is_served = served(r.at);
        }
        order.sort_by_key(|&(is_served, r)| (is_served, Reverse(r.own), Reverse(r.at)));
        let frees = |r: &RuleCost, users: &[usize]| -> usize {
            r.patterns
                .iter()
                .filter(|&&(id, _)| users[id] == 1)
                .map(|&(id, _)| self.costs[id])
                .sum()
        };
        // The candidates naming each pattern, by position in `order`.
        let mut named_by: Vec<Vec<usize>> = vec![Vec::new(); self.costs.len()];
        for (k, (_, r)) in order.iter().enumerate() {
            for &(id, _) in &r.patterns {
                named_by[id].push(k);
            }
        }
        // Each candidate by (not served, what its going frees, its place in `order`): the
        // first class left, the one that frees most, the costliest among equals; where none
        // of the class frees anything alone (they share their patterns), its first. What a
        // rule frees only grows as others go, and each growth adds an entry: one whose value
        // is no longer the rule's is stale.
        let mut heap: BinaryHeap<(bool, usize, Reverse<usize>)> = order
            .iter()
            .enumerate()
            .map(|(k, &(is_served, r))| (!is_served, frees(r, &users), Reverse(k)))
            .collect();
        let mut went = vec![false; order.len()];
        let mut spent = total;
        let mut gone: Vec<(bool, &RuleCost)> = Vec::new();
        while spent > PATTERN_BUDGET {
            let Some((_, freed, Reverse(k))) = heap.pop() else {
                break;
            };
            let (is_served, r) = order[k];
            if went[k] || freed != frees(r, &users) {
                continue;
            }
            went[k] = true;
            spent -= freed;
            for &(id, _) in &r.patterns {
                users[id] -= 1;
                if users[id] == 1 {
                    // The one rule left naming it, if it may go, now frees it too.
                    if let Some(&other) = named_by[id].iter().find(|&&o| !went[o]) {
                        let (other_served, other_rule) = order[other];
                        heap.push((!other_served, frees(other_rule, &users), Reverse(other)));
                    }
                }
            }
            gone.push((is_served, r));
        }
        // A rule cut on the way (sharing its patterns) may fit back beside the rest: served
        // ones first, then the cheapest.
        gone.sort_by_key(|&(is_served, r)| (Reverse(is_served), r.own, r.at));
        let mut out = Vec::new();
        for (_, r) in gone {
            let adds: usize = r
                .patterns
                .iter()
                .filter(|&&(id, _)| users[id] == 0)
                .map(|&(id, _)| self.costs[id])
                .sum();
            // One that adds nothing stays, even where what may not go is past the budget.
            if adds == 0 || spent + adds <= PATTERN_BUDGET {
                spent += adds;
                for &(id, _) in &r.patterns {
                    users[id] += 1;
                }
                continue;
            }
            let costliest = r
                .patterns
                .iter()
                .max_by_key(|&&(id, _)| self.costs[id])
                .map(|&(_, site)| site);
            if let Some(site) = costliest {
                out.push((r.at, cut(site, r.own, total)));
            }
        }
        out.sort_by_key(|&(at, _)| at);
        out
    }

    /// The rules of `kept` that name patterns.
    fn kept<'a>(&'a self, kept: &'a [usize]) -> impl Iterator<Item = &'a RuleCost> {
        debug_assert!(kept.is_sorted(), "positions ascending");
        self.rules
            .iter()
            .filter(move |r| kept.binary_search(&r.at).is_ok())
    }
}

/// Whether `rule` names a regular expression.
fn names_pattern(rule: &doc::Rule) -> bool {
    regex_values(rule).next().is_some()
}

/// The values of `rule`'s matches written as regular expressions, as written (a pattern
/// named twice, twice): what a proxy holds a pattern for, if it takes the rule.
pub fn regex_values(rule: &doc::Rule) -> impl Iterator<Item = &str> {
    rule.matches.iter().flat_map(regexes)
}

/// The values of `m` written as regular expressions: the only values checked into a
/// [`Pattern`], though a check may not get to each (a rule that fails first, a header named
/// twice).
fn regexes(m: &doc::Match) -> impl Iterator<Item = &str> {
    let path = m
        .path
        .as_ref()
        .filter(|p| p.kind == doc::PathMatchType::RegularExpression);
    let values = m
        .headers
        .iter()
        .chain(&m.query_params)
        .filter(|v| v.kind == doc::ValueMatchType::RegularExpression);
    path.map(|p| p.value.as_str())
        .into_iter()
        .chain(values.map(|v| v.value.as_str()))
}

/// What every pattern `rules` name takes, each once: no less than a proxy counts for them.
/// The patterns come from `cache`; one that does not compile counts nothing (its rule is
/// refused).
fn named_at_most(rules: &[doc::Rule], cache: &mut Cache) -> usize {
    let mut seen: hashbrown::HashSet<&str, foldhash::fast::RandomState> =
        hashbrown::HashSet::default();
    let mut total = 0;
    for source in rules.iter().flat_map(|r| &r.matches).flat_map(regexes) {
        if seen.insert(source) {
            total += cache.pattern(source).map_or(0, |p| p.cost());
        }
    }
    total
}

#[cfg(test)]
mod tests;
