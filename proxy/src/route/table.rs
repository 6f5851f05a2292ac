//! Host-indexed, precedence-sorted rule table.

use super::matcher::{MatchSpec, PathMatcher, Pattern, RequestView};
use cftunnel_config::valid::{anchored, engine};
use foldhash::{HashMap, HashMapExt};
use regex_automata::{meta, Input, MatchKind, PatternSet};
use std::sync::Arc;

/// A (rule index, match index) pair.
type Entry = (u32, u32);

/// Buckets with at least this many regex paths match them in one pass of a multi-pattern
/// automaton instead of one pattern at a time.
const REGEX_SET_MIN: usize = 16;

/// Patterns that take more than this ([`Pattern::cost`]) are matched on their own, never in a
/// bucket's automaton: it would hold them again, forward and reverse (three times their cost
/// for a Unicode class), or fail to build over its size limit after compiling for a while,
/// on every push. Everyday patterns take a kilobyte or two, `\w+` about 18 KiB.
const SET_PATTERN_MAX: usize = 64 << 10;

/// Bound on the cost of the patterns one automaton matches together: it holds them forward and
/// reverse, about three times this for Unicode classes, and past the engine's size limit it
/// would not build at all, after compiling for a while on every push. A bucket's patterns past
/// it (in precedence order) are matched one at a time; everyday patterns, a kilobyte or two
/// each, fit by the thousand.
const SET_COST_MAX: usize = 2 << 20;

/// About how much the multi-pattern automatons of one table may take together. Each holds
/// its patterns again, and a bucket is one hostname, so without a bound a document could
/// make the same patterns take memory once per hostname (a distinct set of patterns for
/// each). Once a table's automatons take this much, further buckets match one pattern at a
/// time, which is slower but holds nothing more.
const SETS_MAX: usize = 16 << 20;

/// Up to this many distinct paths of one kind, a bucket compares them in turn; past it, it
/// looks them up in a hash map.
const FEW_PATHS: usize = 8;

/// The rules that apply to one hostname pattern, indexed by path.
///
/// Exact paths and prefixes are looked up by path (a prefix lookup tries each `/` boundary of
/// the request path, longest first, starting at the length of the longest prefix the bucket
/// holds), so lookup cost grows with the depth of the path within that length, not with the
/// rule count or the path's own length. Entries under one path are sorted by the rest of the
/// precedence key. Most buckets (one per hostname) hold a rule or two, so they keep their
/// paths in a short list rather than a hash map.
#[derive(Debug)]
pub struct Bucket {
    /// Dense id of this bucket, used to index per-hostname metrics.
    pub id: usize,
    /// The hostname pattern as written (`a.example.com`, `*.example.com`, or `*` for host-less rules).
    pub pattern: Box<str>,
    exact: Paths,
    prefix: Paths,
    /// The length of the longest prefix in `prefix`: a candidate longer than that cannot be
    /// one, so a long path costs no hashing of its far end.
    prefix_reach: usize,
    /// Regex-path entries in precedence order.
    regex: Box<[Entry]>,
    /// The entries of `regex` matched in one pass; the others are matched one at a time.
    regex_set: Option<Box<RegexSet>>,
}

impl Bucket {
    /// How many regex paths the bucket matches in one pass and how many one at a time, if it
    /// has an automaton.
    #[cfg(test)]
    pub(crate) fn regex_set_sizes(&self) -> Option<(usize, usize)> {
        let set = self.regex_set.as_ref()?;
        Some((set.members.len(), set.alone.len()))
    }
}

/// A multi-pattern automaton over some of a bucket's regex paths.
#[derive(Debug)]
struct RegexSet {
    automaton: meta::Regex,
    /// Position in the bucket's `regex` of each pattern of `automaton`, ascending.
    members: Box<[u32]>,
    /// Positions of the entries matched one at a time, ascending.
    alone: Box<[u32]>,
}

/// The entries of one path kind of a bucket, by path.
#[derive(Debug)]
enum Paths {
    /// Grouped by path, in precedence order inside a group. Paths are the matchers' own text,
    /// shared, so a table built again (every push) copies no strings.
    Few(Box<[(Arc<str>, Entry)]>),
    /// Boxed: most buckets are `Few`, and a bare map would make every `Paths` three words
    /// larger, times two per bucket, times every hostname.
    #[allow(clippy::box_collection)]
    Many(Box<HashMap<Arc<str>, Box<[Entry]>>>),
}

impl Paths {
    /// Indexes `entries`, given in precedence order, by the path each one's match names.
    fn new(entries: &[(&Arc<str>, Entry)]) -> Self {
        // Most buckets hold no path of a kind, or one: nothing to group.
        match entries {
            [] => return Self::Few(Box::default()),
            [(path, entry)] => return Self::Few(Box::new([(Arc::clone(path), *entry)])),
            _ => {}
        }
        let mut groups: Vec<(&Arc<str>, Vec<Entry>)> = Vec::new();
        let mut many: HashMap<&str, usize> = HashMap::new();
        for &(path, entry) in entries {
            let group = if groups.len() < FEW_PATHS {
                groups.iter().position(|(p, _)| **p == *path)
            } else {
                if many.is_empty() {
                    many.extend(groups.iter().enumerate().map(|(i, (p, _))| (&***p, i)));
                }
                many.get(&**path).copied()
            };
            match group {
                Some(i) => groups[i].1.push(entry),
                None => {
                    if !many.is_empty() {
                        many.insert(&**path, groups.len());
                    }
                    groups.push((path, vec![entry]));
                }
            }
        }
        if groups.len() <= FEW_PATHS {
            Self::Few(
                groups
                    .into_iter()
                    .flat_map(|(path, list)| list.into_iter().map(move |e| (path.clone(), e)))
                    .collect(),
            )
        } else {
            Self::Many(Box::new(
                groups
                    .into_iter()
                    .map(|(path, list)| (path.clone(), list.into_boxed_slice()))
                    .collect(),
            ))
        }
    }

    /// The first of the entries under `path` that `f` accepts.
    fn find<T>(&self, path: &str, mut f: impl FnMut(Entry) -> Option<T>) -> Option<T> {
        match self {
            Self::Few(list) => list
                .iter()
                .filter(|(p, _)| **p == *path)
                .find_map(|&(_, e)| f(e)),
            Self::Many(map) => map.get(path)?.iter().find_map(|&e| f(e)),
        }
    }

    fn is_empty(&self) -> bool {
        matches!(self, Self::Few(list) if list.is_empty())
    }
}

/// A rule as the table sees it: its matches plus an opaque payload, both shared with the next
/// table when the rule is pushed again unchanged.
#[derive(Debug)]
struct Routed<R> {
    matches: Arc<[MatchSpec]>,
    value: Arc<R>,
}

/// An immutable routing table over rule payloads `R`.
#[derive(Debug)]
pub struct Table<R> {
    rules: Vec<Routed<R>>,
    /// Indexed by [`Bucket::id`]; the first is the bucket of rules without hostnames.
    buckets: Box<[Bucket]>,
    exact: HashMap<Box<str>, u32>,
    /// Keyed by the suffix after `*`, leading dot included (`.example.com`).
    wildcard: HashMap<Box<str>, u32>,
    /// The length of the longest key in `wildcard`: only a host's suffixes up to that long
    /// are looked up, so a long host costs no hashing of suffixes no wildcard could be.
    wildcard_reach: usize,
}

/// A lookup result: the rule, which of its matches hit, and the bucket it was found in.
#[derive(Debug)]
pub struct Hit<'t, R> {
    pub rule: &'t Arc<R>,
    pub matched: &'t MatchSpec,
    pub bucket: &'t Bucket,
}

impl<R> Table<R> {
    /// Finds the rule for a request. `host` must already be lower-case with any port removed.
    pub fn find(&self, host: &str, req: &RequestView<'_>) -> Option<Hit<'_, R>> {
        if let Some(&b) = self.exact.get(host) {
            if let Some(hit) = self.scan(b, req) {
                return Some(hit);
            }
        }
        if !self.wildcard.is_empty() {
            // Longest suffix first, from the longest a wildcard has; a wildcard needs at least
            // one label in front of it. `.` is ASCII, so every dot is a char boundary.
            let from = host.len().saturating_sub(self.wildcard_reach).max(1);
            let dots = host.as_bytes().iter().enumerate().skip(from);
            for (i, _) in dots.filter(|&(_, &b)| b == b'.') {
                let Some(&b) = host.get(i..).and_then(|suffix| self.wildcard.get(suffix)) else {
                    continue;
                };
                if let Some(hit) = self.scan(b, req) {
                    return Some(hit);
                }
            }
        }
        self.scan(0, req)
    }

    fn scan<'t>(&'t self, bucket: u32, req: &RequestView<'_>) -> Option<Hit<'t, R>> {
        let bucket = self.buckets.get(bucket as usize)?;
        let path = req.path;
        let hit = |(r, m): Entry, whole: bool| {
            let rule = self.rules.get(r as usize)?;
            let spec = rule.matches.get(m as usize)?;
            let matched = if whole {
                spec.matches(req)
            } else {
                spec.matches_besides_path(req)
            };
            matched.then_some(Hit {
                rule: &rule.value,
                matched: spec,
                bucket,
            })
        };
        // 1. Exact paths.
        if let Some(hit) = bucket.exact.find(path, |e| hit(e, true)) {
            return Some(hit);
        }
        // 2. Prefixes, longest first: the path itself, then each `/` boundary, then `/`;
        // those longer than the bucket's longest prefix are skipped.
        if !bucket.prefix.is_empty() {
            let mut candidate = path.trim_end_matches('/');
            if candidate.len() > bucket.prefix_reach {
                // The longest boundary within reach: a `/` at most `prefix_reach` bytes in,
                // so the candidate before it is no longer than that. `/` is ASCII, so it is a
                // char boundary.
                let window = candidate.as_bytes().get(..=bucket.prefix_reach);
                candidate = match window.and_then(|w| w.iter().rposition(|&b| b == b'/')) {
                    Some(0) | None => "/",
                    Some(i) => candidate.get(..i).unwrap_or("/"),
                };
            }
            loop {
                if candidate.is_empty() {
                    candidate = "/";
                }
                if let Some(hit) = bucket.prefix.find(candidate, |e| hit(e, true)) {
                    return Some(hit);
                }
                if candidate == "/" {
                    break;
                }
                candidate = match candidate.rfind('/') {
                    Some(0) | None => "/",
                    Some(i) => &candidate[..i],
                };
            }
        }
        // 3. Regular expressions.
        match &bucket.regex_set {
            Some(set) => {
                let mut hits = PatternSet::new(set.automaton.pattern_len());
                set.automaton
                    .which_overlapping_matches(&Input::new(path), &mut hits);
                // The entries whose path the automaton matched and those it does not hold, in
                // precedence order.
                let mut matched = hits
                    .iter()
                    .filter_map(|p| set.members.get(p.as_usize()))
                    .peekable();
                let mut alone = set.alone.iter().peekable();
                loop {
                    let (at, whole) = match (matched.peek(), alone.peek()) {
                        (Some(&&m), Some(&&a)) if a < m => (alone.next(), true),
                        (Some(_), _) => (matched.next(), false),
                        (None, Some(_)) => (alone.next(), true),
                        (None, None) => return None,
                    };
                    let entry = at.and_then(|&i| bucket.regex.get(i as usize));
                    if let Some(found) = entry.and_then(|&e| hit(e, whole)) {
                        return Some(found);
                    }
                }
            }
            None => bucket.regex.iter().find_map(|&e| hit(e, true)),
        }
    }

    /// The regular expressions of every rule's matches, for diagnostics and tests.
    pub fn patterns(&self) -> impl Iterator<Item = &Pattern> {
        self.rules
            .iter()
            .flat_map(|r| r.matches.iter())
            .flat_map(MatchSpec::patterns)
    }

    /// Every bucket, for building per-hostname state indexed by [`Bucket::id`].
    pub fn buckets(&self) -> impl Iterator<Item = &Bucket> {
        self.buckets.iter()
    }

    /// The bucket with this [`Bucket::id`].
    pub fn bucket(&self, id: usize) -> Option<&Bucket> {
        self.buckets.get(id)
    }

    pub fn bucket_count(&self) -> usize {
        self.buckets.len()
    }

    /// Buckets of exact and of wildcard hostnames: what [`TableBuilder::with_capacity`] takes
    /// to build a table like this one.
    pub fn host_buckets(&self) -> (usize, usize) {
        (self.exact.len(), self.wildcard.len())
    }

    pub fn rule_count(&self) -> usize {
        self.rules.len()
    }
}

/// The multi-pattern automatons of the last table, by the patterns they match, so a push that
/// leaves a bucket's regular expressions as they were reuses its automaton instead of parsing
/// and compiling every pattern again.
#[derive(Debug, Default)]
pub struct RegexSets {
    sets: Automatons,
}

/// Multi-pattern automatons by [`RegexSets::key`].
type Automatons = HashMap<String, meta::Regex>;

impl RegexSets {
    /// The identity of a set: its patterns in order, each prefixed with its length so no two
    /// lists give the same key.
    fn key<'p>(patterns: impl Iterator<Item = &'p str>) -> String {
        let mut key = String::new();
        for p in patterns {
            key.push_str(&p.len().to_string());
            key.push(':');
            key.push_str(p);
        }
        key
    }
}

/// Collects rules in document order, then sorts each bucket once.
#[derive(Debug)]
pub struct TableBuilder<R> {
    rules: Vec<Routed<R>>,
    /// Each bucket's hostname pattern and entries, in document order; the first is the
    /// bucket of rules without hostnames.
    buckets: Vec<(Box<str>, Vec<Entry>)>,
    exact: HashMap<Box<str>, u32>,
    wildcard: HashMap<Box<str>, u32>,
}

impl<R> Default for TableBuilder<R> {
    fn default() -> Self {
        Self {
            rules: Vec::new(),
            buckets: vec![("*".into(), Vec::new())],
            exact: HashMap::new(),
            wildcard: HashMap::new(),
        }
    }
}

impl<R> TableBuilder<R> {
    /// A builder for about `rules` rules in about `hosts` hostname buckets (exact, wildcard),
    /// as the last table had, so its maps are allocated once.
    pub fn with_capacity(rules: usize, hosts: (usize, usize)) -> Self {
        let mut builder = Self::default();
        builder.rules.reserve(rules);
        builder.buckets.reserve(hosts.0 + hosts.1);
        builder.exact.reserve(hosts.0);
        builder.wildcard.reserve(hosts.1);
        builder
    }

    /// Adds a rule. `hostnames` must be validated and lower-case (`a.b`, `*.b`); empty means any host.
    /// A rule without matches must be given one match-all [`MatchSpec`].
    pub fn push(&mut self, hostnames: &[Box<str>], matches: Vec<MatchSpec>, value: R) {
        self.push_shared(hostnames, matches.into(), Arc::new(value));
    }

    /// [`TableBuilder::push`] of a rule this table shares with another (an earlier table that
    /// had the same rule).
    pub fn push_shared(
        &mut self,
        hostnames: &[Box<str>],
        matches: Arc<[MatchSpec]>,
        value: Arc<R>,
    ) {
        let idx = self.rules.len() as u32;
        let entries = || (0..matches.len() as u32).map(|m| (idx, m));
        if hostnames.is_empty() {
            self.buckets[0].1.extend(entries());
        }
        for host in hostnames {
            let next = self.buckets.len() as u32;
            let (map, key) = match host.strip_prefix('*') {
                Some(suffix) => (&mut self.wildcard, suffix),
                None => (&mut self.exact, &**host),
            };
            // Looked up before inserting, so a known host costs no key allocation.
            let b = match map.get(key) {
                Some(&b) => b,
                None => {
                    map.insert(key.into(), next);
                    self.buckets.push((host.clone(), Vec::new()));
                    next
                }
            };
            let bucket = &mut self.buckets[b as usize].1;
            // A rule naming the same host twice is routed once.
            if bucket.last().map(|e| e.0) != Some(idx) {
                bucket.extend(entries());
            }
        }
        self.rules.push(Routed { matches, value });
    }

    /// Sorts and indexes every bucket.
    pub fn build(self) -> Table<R> {
        self.build_with(&mut RegexSets::default())
    }

    /// [`TableBuilder::build`], taking the multi-pattern automatons from `sets` where a bucket
    /// has the same regular expressions as one of the last table, and leaving this table's
    /// there.
    pub fn build_with(self, sets: &mut RegexSets) -> Table<R> {
        let rules = &self.rules;
        let mut old = std::mem::take(&mut sets.sets);
        let used = &mut sets.sets;
        // What the automatons this table holds take, each counted once (against `SETS_MAX`).
        let mut sets_size = 0;
        let mut exact = Vec::new();
        let mut prefix = Vec::new();
        let buckets = self
            .buckets
            .into_iter()
            .enumerate()
            .map(|(id, (pattern, mut entries))| {
                let spec = |(r, m): Entry| &rules[r as usize].matches[m as usize];
                // Stable: equal precedence keeps document order (rule, then match).
                if entries.len() > 1 {
                    entries.sort_by_cached_key(|&e| spec(e).precedence());
                }
                exact.clear();
                prefix.clear();
                let mut regex = Vec::new();
                for e in entries {
                    match &spec(e).path {
                        PathMatcher::Exact(p) => exact.push((p, e)),
                        PathMatcher::Prefix(p) => prefix.push((p, e)),
                        PathMatcher::Regex(_) => regex.push(e),
                    }
                }
                let regex_set = regex_set(&regex, spec, (&mut old, &mut *used), &mut sets_size);
                Bucket {
                    id,
                    pattern,
                    exact: Paths::new(&exact),
                    prefix_reach: prefix.iter().map(|(p, _)| p.len()).max().unwrap_or(0),
                    prefix: Paths::new(&prefix),
                    regex: regex.into_boxed_slice(),
                    regex_set: regex_set.map(Box::new),
                }
            })
            .collect();
        Table {
            rules: self.rules,
            buckets,
            exact: self.exact,
            wildcard_reach: self.wildcard.keys().map(|k| k.len()).max().unwrap_or(0),
            wildcard: self.wildcard,
        }
    }
}

/// The automaton of a bucket whose regex-path entries (in precedence order) are `regex`, over
/// the patterns of them that are small enough ([`SET_PATTERN_MAX`]) as long as they take
/// little enough together ([`SET_COST_MAX`]), if there are enough of those: taken from the
/// last table's (`old`) or this table's (`used`) where they match the same patterns, else
/// built while this table's automatons take less than [`SETS_MAX`] (`size`).
fn regex_set<'r>(
    regex: &[Entry],
    spec: impl Fn(Entry) -> &'r MatchSpec,
    (old, used): (&mut Automatons, &mut Automatons),
    size: &mut usize,
) -> Option<RegexSet> {
    if regex.len() < REGEX_SET_MIN {
        return None;
    }
    let path = |e: Entry| match &spec(e).path {
        PathMatcher::Regex(p) => Some(p),
        _ => None,
    };
    let (mut members, mut alone) = (Vec::new(), Vec::new());
    let mut cost = 0;
    for (i, &e) in regex.iter().enumerate() {
        let c = path(e).map_or(usize::MAX, Pattern::cost);
        if c <= SET_PATTERN_MAX && cost + c <= SET_COST_MAX {
            cost += c;
            members.push(i as u32);
        } else {
            alone.push(i as u32);
        }
    }
    if members.len() < REGEX_SET_MIN {
        return None;
    }
    let patterns = || {
        members
            .iter()
            .filter_map(|&i| path(*regex.get(i as usize)?))
    };
    let key = RegexSets::key(patterns().map(Pattern::source));
    let automaton = match used.get(&key) {
        // Another bucket of this table has the same patterns: one automaton, counted once.
        Some(shared) => shared.clone(),
        None if *size >= SETS_MAX => return None,
        None => {
            let automaton = match old.remove(&key) {
                Some(kept) => kept,
                None => build_set(patterns())?,
            };
            *size += automaton.memory_usage();
            used.insert(key, automaton.clone());
            automaton
        }
    };
    Some(RegexSet {
        automaton,
        members: members.into_boxed_slice(),
        alone: alone.into_boxed_slice(),
    })
}

/// One automaton matching all of `patterns`, reporting each that matches. Each pattern compiled
/// on its own already, so this can only fail on size; the bucket then matches one pattern at
/// a time.
fn build_set<'p>(patterns: impl Iterator<Item = &'p Pattern>) -> Option<meta::Regex> {
    let hirs = patterns
        .map(|p| anchored(p.source()))
        .collect::<Result<Vec<_>, _>>()
        .ok()?;
    meta::Regex::builder()
        .configure(engine().match_kind(MatchKind::All))
        .build_many_from_hir(&hirs)
        .ok()
}
