//! What the patterns of each rule of a document take of the budget
//! ([`PATTERN_BUDGET`]), for a caller that keeps a document within it by choosing which rules
//! go: the controller, one document per data plane (see [`budget`](super::budget)).

use super::budget::{size, Site, PATTERN_BUDGET};
use super::{rule, Cache, Invalid};
use crate::document as doc;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Why a rule was left out of a document past the budget: its costliest pattern, at `site`;
/// `own` is what its patterns take. What the document's take in all is left out: it moves
/// with every other rule of the document (another tenant's), and the reason is told again
/// whenever it changes.
fn cut(site: Site, own: usize) -> Invalid {
    Invalid::new(
        site.to_string(),
        format!(
            "the document's regexes take more than the {} they may take compiled together, and \
             rules naming a regex the proxies do not hold yet go first, then those whose going \
             frees most (this rule's take {}; a repetition of a large class, such as \
             `\\w{{1,64}}`, multiplies a regex's size, and an ASCII class such as \
             `[a-zA-Z0-9_]{{1,64}}` takes far less)",
            size(PATTERN_BUDGET),
            size(own)
        ),
    )
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

    /// Whether there is nothing to weigh: no rule names a pattern, or what they name fits the
    /// budget by far ([`Costs::of`]).
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
    ///
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
                out.push((r.at, cut(site, r.own)));
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
