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
    old: HashMap<K, Entry<V>>,
    used: HashMap<K, Entry<V>>,
}

/// A value and how much of it the used generation took from the old one: an entry asked for
/// again is moved across with its key rather than copied, and [`Generations::drop_used`] puts
/// that part back.
#[derive(Debug)]
struct Entry<V> {
    value: V,
    /// For a list, its first `from_old` items; for one value, 1 when it came from `old`.
    from_old: usize,
}

impl<V> Entry<V> {
    fn new(value: V) -> Self {
        Self { value, from_old: 0 }
    }
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
        if let Some(e) = self.used.get(key) {
            return Ok(e.value.clone());
        }
        if let Some((key, mut e)) = self.old.remove_entry(key) {
            let value = e.value.clone();
            e.from_old = 1;
            self.used.insert(key, e);
            return Ok(value);
        }
        let value = make()?;
        self.used.insert(key.into(), Entry::new(value.clone()));
        Ok(value)
    }
}

impl<K: Eq + std::hash::Hash, V> Generations<K, V> {
    /// The entries used become the old generation; the emptied map keeps its capacity for the
    /// next document, which usually names as many.
    fn keep_used(&mut self) {
        std::mem::swap(&mut self.old, &mut self.used);
        self.used.clear();
    }

    /// Forgets what was added since [`Generations::keep_used`]: what was moved from the old
    /// generation goes back there, cut by `restore` to the part that came from it.
    fn drop_used(&mut self, restore: impl Fn(&mut V, usize)) {
        for (key, mut e) in self.used.drain() {
            if e.from_old > 0 {
                restore(&mut e.value, e.from_old);
                self.old.insert(key, e);
            }
        }
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
        let made_of = |t: &&Arc<Target>| t.made_of(protocol, websocket, tls, public_only);
        let targets = &mut self.targets;
        let used = targets.used.get(url);
        if let Some(t) = used.and_then(|e| e.value.iter().find(made_of)) {
            return Ok(t.clone());
        }
        // A URL of one target, that target (almost every URL): moved to the used generation
        // with its key, not copied.
        if used.is_none() {
            if let Some((key, mut e)) = targets.old.remove_entry(url) {
                if let [target] = &e.value[..] {
                    if made_of(&target) {
                        let target = target.clone();
                        e.from_old = 1;
                        targets.used.insert(key, e);
                        return Ok(target);
                    }
                }
                // Put back: a URL of several targets, or one of other settings.
                targets.old.insert(key, e);
            }
        }
        let old = targets.old.get(url);
        let target = match old.and_then(|e| e.value.iter().find(made_of)) {
            Some(t) => t.clone(),
            None => Arc::new(Target::new(url, protocol, websocket, tls, public_only)?),
        };
        match targets.used.get_mut(url) {
            Some(e) => e.value.push(target.clone()),
            None => {
                targets
                    .used
                    .insert(url.into(), Entry::new(vec![target.clone()]));
            }
        }
        Ok(target)
    }

    /// Counts `pattern`, held by a rule checked before, as used: kept by the next
    /// [`Cache::keep_used`] as if a check had asked for it.
    pub fn keep_pattern(&mut self, pattern: &Pattern) {
        let used = &mut self.patterns.used;
        if !used.contains_key(pattern.source()) {
            used.insert(pattern.source().into(), Entry::new(pattern.clone()));
        }
    }

    /// Counts `target`, held by a rule checked before, as used (see [`Cache::keep_pattern`]).
    pub fn keep_target(&mut self, target: &Arc<Target>) {
        let used = &mut self.targets.used;
        match used.get_mut(&*target.url) {
            Some(e) => {
                if !e.value.iter().any(|t| Arc::ptr_eq(t, target)) {
                    e.value.push(target.clone());
                }
            }
            None => {
                used.insert(target.url.clone(), Entry::new(vec![target.clone()]));
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
        self.patterns.drop_used(|_, _| {});
        self.targets
            .drop_used(|list, from_old| list.truncate(from_old));
    }
}
