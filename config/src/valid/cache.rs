//! What one check hands to the next: compiled patterns and parsed targets, by their source.

use super::pattern::Pattern;
use super::target::{Target, TargetError};
use crate::{BackendProtocol, BackendTls};
use foldhash::{HashMap, HashMapExt};
use std::sync::Arc;

/// Compiled patterns and parsed targets, reused when a later document names them again, so an
/// unchanged regex is compiled once however often the document is pushed or re-translated.
///
/// Entries live in two generations: those the checks since [`Cache::keep_used`] asked for, and
/// those from before. `keep_used` drops what the last document no longer names, so the cache
/// holds no more than one document's worth; [`Cache::drop_used`] forgets what a refused
/// document added and keeps the previous generation.
#[derive(Debug, Default)]
pub struct Cache {
    patterns: Generations<Box<str>, Pattern>,
    /// By URL, then by the rest of the settings (almost always one target per URL).
    targets: Generations<Box<str>, Vec<Arc<Target>>>,
}

#[derive(Debug)]
struct Generations<K, V> {
    old: HashMap<K, V>,
    used: HashMap<K, V>,
}

impl<K, V> Default for Generations<K, V> {
    fn default() -> Self {
        Self {
            old: HashMap::new(),
            used: HashMap::new(),
        }
    }
}

impl<V: Clone> Generations<Box<str>, V> {
    fn get_or_try<E>(&mut self, key: &str, make: impl FnOnce() -> Result<V, E>) -> Result<V, E> {
        if let Some(v) = self.used.get(key) {
            return Ok(v.clone());
        }
        let v = match self.old.get(key) {
            Some(v) => v.clone(),
            None => make()?,
        };
        self.used.insert(key.into(), v.clone());
        Ok(v)
    }
}

impl<K, V> Generations<K, V> {
    /// The entries used become the old generation; the emptied map keeps its capacity for the
    /// next document, which usually names as many.
    fn keep_used(&mut self) {
        std::mem::swap(&mut self.old, &mut self.used);
        self.used.clear();
    }

    fn drop_used(&mut self) {
        self.used.clear();
    }
}

impl Cache {
    /// `source` compiled as [`Pattern::new`] compiles it.
    ///
    /// # Errors
    /// As [`Pattern::new`]; a refused pattern is not remembered.
    pub fn pattern(&mut self, source: &str) -> Result<Pattern, String> {
        self.patterns.get_or_try(source, || Pattern::new(source))
    }

    /// A target parsed as [`Target::new`] parses it.
    ///
    /// # Errors
    /// As [`Target::new`].
    pub fn target(
        &mut self,
        url: &str,
        protocol: BackendProtocol,
        websocket: bool,
        tls: Option<&BackendTls>,
        public_only: bool,
    ) -> Result<Arc<Target>, TargetError> {
        let find = |list: Option<&Vec<Arc<Target>>>| {
            list.into_iter()
                .flatten()
                .find(|t| t.made_of(protocol, websocket, tls, public_only))
                .cloned()
        };
        let targets = &mut self.targets;
        if let Some(t) = find(targets.used.get(url)) {
            return Ok(t);
        }
        let target = match find(targets.old.get(url)) {
            Some(t) => t,
            None => Arc::new(Target::new(url, protocol, websocket, tls, public_only)?),
        };
        match targets.used.get_mut(url) {
            Some(list) => list.push(target.clone()),
            None => {
                targets.used.insert(url.into(), vec![target.clone()]);
            }
        }
        Ok(target)
    }

    /// Counts `pattern`, held by a rule checked before, as used: kept by the next
    /// [`Cache::keep_used`] as if a check had asked for it.
    pub fn keep_pattern(&mut self, pattern: &Pattern) {
        let used = &mut self.patterns.used;
        if !used.contains_key(pattern.source()) {
            used.insert(pattern.source().into(), pattern.clone());
        }
    }

    /// Counts `target`, held by a rule checked before, as used (see [`Cache::keep_pattern`]).
    pub fn keep_target(&mut self, target: &Arc<Target>) {
        let used = &mut self.targets.used;
        match used.get_mut(&*target.url) {
            Some(list) => {
                if !list.iter().any(|t| Arc::ptr_eq(t, target)) {
                    list.push(target.clone());
                }
            }
            None => {
                used.insert(target.url.clone(), vec![target.clone()]);
            }
        }
    }

    /// Keeps what the checks since the last call used and forgets the rest: call it once a
    /// document passed and is in use.
    pub fn keep_used(&mut self) {
        self.patterns.keep_used();
        self.targets.keep_used();
    }

    /// Forgets what the checks since the last call added: call it when a document was refused.
    pub fn drop_used(&mut self) {
        self.patterns.drop_used();
        self.targets.drop_used();
    }
}
