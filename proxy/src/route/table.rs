//! Host-indexed, precedence-sorted rule table.

use super::matcher::{MatchSpec, PathMatcher, RequestView};
use cftunnel_config::valid::{anchored, engine};
use regex_automata::{meta, Input, MatchKind, PatternSet};
use std::collections::HashMap;
use std::sync::Arc;

/// A (rule index, match index) pair.
type Entry = (u32, u32);

/// Buckets with at least this many regex paths match them all in one pass of a multi-pattern
/// automaton instead of one pattern at a time.
const REGEX_SET_MIN: usize = 16;

/// The rules that apply to one hostname pattern, indexed by path.
///
/// Exact paths and prefixes are hash lookups (a prefix lookup tries each `/` boundary of the
/// request path, longest first), so lookup cost grows with the path's depth, not the rule
/// count. Entries under one key are sorted by the rest of the precedence key.
#[derive(Debug)]
pub struct Bucket {
    /// Dense id of this bucket, used to index per-hostname metrics.
    pub id: usize,
    /// The hostname pattern as written (`a.example.com`, `*.example.com`, or `*` for host-less rules).
    pub pattern: Box<str>,
    /// Every entry, in document order until `build` indexes them.
    entries: Vec<Entry>,
    exact: HashMap<Box<str>, Vec<Entry>>,
    prefix: HashMap<Box<str>, Vec<Entry>>,
    /// Regex-path entries in precedence order.
    regex: Vec<Entry>,
    /// All of `regex`'s path patterns, pattern `i` being `regex[i]`'s.
    regex_set: Option<meta::Regex>,
}

impl Bucket {
    fn new(id: usize, pattern: Box<str>) -> Self {
        Self {
            id,
            pattern,
            entries: Vec::new(),
            exact: HashMap::new(),
            prefix: HashMap::new(),
            regex: Vec::new(),
            regex_set: None,
        }
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
    exact: HashMap<Box<str>, Bucket>,
    /// Keyed by the suffix after `*`, leading dot included (`.example.com`).
    wildcard: HashMap<Box<str>, Bucket>,
    default: Bucket,
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
        if let Some(bucket) = self.exact.get(host) {
            if let Some(hit) = self.scan(bucket, req) {
                return Some(hit);
            }
        }
        if !self.wildcard.is_empty() {
            // Longest suffix first; a wildcard needs at least one label in front of it.
            for (i, _) in host.match_indices('.') {
                if i == 0 {
                    continue;
                }
                if let Some(bucket) = self.wildcard.get(&host[i..]) {
                    if let Some(hit) = self.scan(bucket, req) {
                        return Some(hit);
                    }
                }
            }
        }
        self.scan(&self.default, req)
    }

    fn scan<'t>(&'t self, bucket: &'t Bucket, req: &RequestView<'_>) -> Option<Hit<'t, R>> {
        let path = req.path;
        // 1. Exact paths.
        if let Some(entries) = bucket.exact.get(path) {
            if let Some(hit) = self.first(bucket, entries, req) {
                return Some(hit);
            }
        }
        // 2. Prefixes, longest first: the path itself, then each `/` boundary, then `/`.
        if !bucket.prefix.is_empty() {
            let mut candidate = path.trim_end_matches('/');
            loop {
                if candidate.is_empty() {
                    candidate = "/";
                }
                if let Some(entries) = bucket.prefix.get(candidate) {
                    if let Some(hit) = self.first(bucket, entries, req) {
                        return Some(hit);
                    }
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
                let mut hits = PatternSet::new(set.pattern_len());
                set.which_overlapping_matches(&Input::new(path), &mut hits);
                hits.iter().find_map(|p| {
                    let &(r, m) = bucket.regex.get(p.as_usize())?;
                    let rule = self.rules.get(r as usize)?;
                    let spec = rule.matches.get(m as usize)?;
                    spec.matches_besides_path(req).then_some(Hit {
                        rule: &rule.value,
                        matched: spec,
                        bucket,
                    })
                })
            }
            None => self.first(bucket, &bucket.regex, req),
        }
    }

    fn first<'t>(
        &'t self,
        bucket: &'t Bucket,
        entries: &[Entry],
        req: &RequestView<'_>,
    ) -> Option<Hit<'t, R>> {
        entries.iter().find_map(|&(r, m)| {
            let rule = self.rules.get(r as usize)?;
            let spec = rule.matches.get(m as usize)?;
            spec.matches(req).then_some(Hit {
                rule: &rule.value,
                matched: spec,
                bucket,
            })
        })
    }

    /// Every bucket, for building per-hostname state indexed by [`Bucket::id`].
    pub fn buckets(&self) -> impl Iterator<Item = &Bucket> {
        std::iter::once(&self.default)
            .chain(self.exact.values())
            .chain(self.wildcard.values())
    }

    pub fn bucket_count(&self) -> usize {
        1 + self.exact.len() + self.wildcard.len()
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
    sets: HashMap<String, meta::Regex>,
}

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
    table: Table<R>,
}

impl<R> Default for TableBuilder<R> {
    fn default() -> Self {
        Self {
            table: Table {
                rules: Vec::new(),
                exact: HashMap::new(),
                wildcard: HashMap::new(),
                default: Bucket::new(0, "*".into()),
            },
        }
    }
}

impl<R> TableBuilder<R> {
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
        let t = &mut self.table;
        let idx = t.rules.len() as u32;
        let entries = || (0..matches.len() as u32).map(|m| (idx, m));
        if hostnames.is_empty() {
            t.default.entries.extend(entries());
        } else {
            for host in hostnames {
                let next_id = 1 + t.exact.len() + t.wildcard.len();
                let (map, key) = match host.strip_prefix('*') {
                    Some(suffix) => (&mut t.wildcard, suffix),
                    None => (&mut t.exact, &**host),
                };
                // Looked up before inserting, so a known host costs no key allocation.
                let bucket = match map.get_mut(key) {
                    Some(bucket) => bucket,
                    None => map
                        .entry(key.into())
                        .or_insert_with(|| Bucket::new(next_id, host.clone())),
                };
                // A rule naming the same host twice is routed once.
                if bucket.entries.last().map(|e| e.0) != Some(idx) {
                    bucket.entries.extend(entries());
                }
            }
        }
        t.rules.push(Routed { matches, value });
    }

    /// Sorts and indexes every bucket.
    pub fn build(self) -> Table<R> {
        self.build_with(&mut RegexSets::default())
    }

    /// [`TableBuilder::build`], taking the multi-pattern automatons from `sets` where a bucket
    /// has the same regular expressions as one of the last table, and leaving this table's
    /// there.
    pub fn build_with(mut self, sets: &mut RegexSets) -> Table<R> {
        let rules = &self.table.rules;
        let mut old = std::mem::take(&mut sets.sets);
        let used = &mut sets.sets;
        let mut index = |bucket: &mut Bucket| {
            let mut entries = std::mem::take(&mut bucket.entries);
            // Stable: equal precedence keeps document order (rule, then match).
            entries
                .sort_by_cached_key(|&(r, m)| rules[r as usize].matches[m as usize].precedence());
            for (r, m) in entries {
                match &rules[r as usize].matches[m as usize].path {
                    PathMatcher::Exact(p) => push(&mut bucket.exact, p, (r, m)),
                    PathMatcher::Prefix(p) => push(&mut bucket.prefix, p, (r, m)),
                    PathMatcher::Regex(_) => bucket.regex.push((r, m)),
                }
            }
            if bucket.regex.len() >= REGEX_SET_MIN {
                let patterns = || {
                    bucket.regex.iter().filter_map(|&(r, m)| {
                        match &rules[r as usize].matches[m as usize].path {
                            PathMatcher::Regex(p) => Some(p.source()),
                            _ => None,
                        }
                    })
                };
                let key = RegexSets::key(patterns());
                let set = match old.remove(&key).or_else(|| used.get(&key).cloned()) {
                    Some(set) => Some(set),
                    // Each pattern already compiled on its own, so the set can only fail on
                    // size; then the bucket falls back to one pattern at a time.
                    None => patterns()
                        .map(anchored)
                        .collect::<Result<Vec<_>, _>>()
                        .ok()
                        .and_then(|hirs| {
                            meta::Regex::builder()
                                .configure(engine().match_kind(MatchKind::All))
                                .build_many_from_hir(&hirs)
                                .ok()
                        }),
                };
                if let Some(set) = &set {
                    used.insert(key, set.clone());
                }
                bucket.regex_set = set;
            }
        };
        index(&mut self.table.default);
        self.table.exact.values_mut().for_each(&mut index);
        self.table.wildcard.values_mut().for_each(&mut index);
        self.table
    }
}

/// Adds `entry` under `path`, allocating a key only for a path not seen before.
fn push(map: &mut HashMap<Box<str>, Vec<Entry>>, path: &str, entry: Entry) {
    match map.get_mut(path) {
        Some(entries) => entries.push(entry),
        None => {
            map.insert(path.into(), vec![entry]);
        }
    }
}
