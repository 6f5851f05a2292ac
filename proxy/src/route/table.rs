//! Host-indexed, precedence-sorted rule table.

use super::matcher::{MatchSpec, RequestView};
use std::collections::HashMap;
use std::sync::Arc;

/// The rules that apply to one hostname pattern, sorted by precedence.
#[derive(Debug)]
pub struct Bucket {
    /// Dense id of this bucket, used to index per-hostname metrics.
    pub id: usize,
    /// The hostname pattern as written (`a.example.com`, `*.example.com`, or `*` for host-less rules).
    pub pattern: Box<str>,
    entries: Vec<(u32, u32)>,
}

/// A rule as the table sees it: its matches plus an opaque payload.
#[derive(Debug)]
struct Routed<R> {
    matches: Box<[MatchSpec]>,
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
        bucket.entries.iter().find_map(|&(r, m)| {
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
                default: Bucket {
                    id: 0,
                    pattern: "*".into(),
                    entries: Vec::new(),
                },
            },
        }
    }
}

impl<R> TableBuilder<R> {
    /// Adds a rule. `hostnames` must be validated and lower-case (`a.b`, `*.b`); empty means any host.
    /// A rule without matches must be given one match-all [`MatchSpec`].
    pub fn push(&mut self, hostnames: &[Box<str>], matches: Vec<MatchSpec>, value: R) {
        let t = &mut self.table;
        let idx = t.rules.len() as u32;
        let entries = (0..matches.len() as u32).map(|m| (idx, m));
        if hostnames.is_empty() {
            t.default.entries.extend(entries);
        } else {
            let entries: Vec<_> = entries.collect();
            let mut next_id = 1 + t.exact.len() + t.wildcard.len();
            for host in hostnames {
                let (map, key) = match host.strip_prefix('*') {
                    Some(suffix) => (&mut t.wildcard, suffix),
                    None => (&mut t.exact, &**host),
                };
                let bucket = map.entry(key.into()).or_insert_with(|| {
                    next_id += 1;
                    Bucket {
                        id: next_id - 1,
                        pattern: host.clone(),
                        entries: Vec::new(),
                    }
                });
                // A rule naming the same host twice is routed once.
                if bucket.entries.last().map(|e| e.0) != Some(idx) {
                    bucket.entries.extend_from_slice(&entries);
                }
            }
        }
        t.rules.push(Routed {
            matches: matches.into_boxed_slice(),
            value: Arc::new(value),
        });
    }

    pub fn build(mut self) -> Table<R> {
        let rules = &self.table.rules;
        let sort = |bucket: &mut Bucket| {
            // Stable: equal precedence keeps document order (rule, then match).
            bucket
                .entries
                .sort_by_cached_key(|&(r, m)| rules[r as usize].matches[m as usize].precedence());
        };
        sort(&mut self.table.default);
        self.table.exact.values_mut().for_each(sort);
        self.table.wildcard.values_mut().for_each(sort);
        self.table
    }
}
