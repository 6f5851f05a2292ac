//! What one check hands to the next: compiled patterns and parsed targets, by their source.

use super::pattern::Pattern;
use super::target::{Target, TargetError};
use crate::{BackendProtocol, BackendTls};
use hashbrown::hash_map::EntryRef;
use std::sync::Arc;

/// Fold hashing, as the rest of the contract's maps: the keys are the controller's and the
/// operator's own URLs and patterns.
type HashMap<K, V> = hashbrown::HashMap<K, V, foldhash::fast::RandomState>;

/// Compiled patterns and parsed targets, reused when a later document names them again, so an
/// unchanged regex is compiled once however often the document is pushed or re-translated.
///
/// Entries live in two generations: those the checks since [`Cache::keep_used`] asked for, and
/// those from before. `keep_used` drops what the last document no longer names, so the cache
/// holds no more than one document's worth; [`Cache::drop_used`] forgets what a refused
/// document added and keeps the previous generation.
///
/// Each entry carries the generation that last asked for it, in one map: a lookup finds it and
/// counts it as used, with nothing moved between maps.
#[derive(Debug)]
pub struct Cache {
    patterns: HashMap<Box<str>, Stamped<Pattern>>,
    /// By URL, then by the rest of the settings (almost always one target per URL).
    targets: HashMap<Box<str>, Vec<Stamped<Arc<Target>>>>,
    /// The generation the checks since [`Cache::keep_used`] belong to; every entry's is this
    /// or older.
    generation: u64,
}

/// A value with the generations it was added in and last asked for.
#[derive(Debug)]
struct Stamped<V> {
    value: V,
    added: u64,
    used: u64,
}

impl<V> Stamped<V> {
    fn new(value: V, generation: u64) -> Self {
        Self {
            value,
            added: generation,
            used: generation,
        }
    }

    /// Keeps the entry for a used one: called by [`Cache::keep_used`].
    fn used_in(&self, generation: u64) -> bool {
        self.used == generation
    }

    /// Forgets this generation: `false` for an entry it added; one it asked for again goes
    /// back to the old generation. Called by [`Cache::drop_used`].
    fn undo(&mut self, generation: u64) -> bool {
        if self.added == generation {
            return false;
        }
        if self.used == generation {
            self.used = generation - 1;
        }
        true
    }
}

impl Default for Cache {
    fn default() -> Self {
        Self {
            patterns: HashMap::default(),
            targets: HashMap::default(),
            // Above every entry's `used - 1`, so `undo` never goes below zero.
            generation: 1,
        }
    }
}

impl Cache {
    /// `source` compiled as [`Pattern::new`] compiles it.
    ///
    /// # Errors
    /// As [`Pattern::new`]; a refused pattern is not remembered.
    pub fn pattern(&mut self, source: &str) -> Result<Pattern, String> {
        let generation = self.generation;
        if let Some(e) = self.patterns.get_mut(source) {
            e.used = generation;
            return Ok(e.value.clone());
        }
        let pattern = Pattern::new(source)?;
        self.patterns
            .insert(source.into(), Stamped::new(pattern.clone(), generation));
        Ok(pattern)
    }

    /// A target parsed as [`Target::new`] parses it, lent: a check that keeps nothing takes
    /// no reference, and one that keeps it clones the `Arc`.
    ///
    /// # Errors
    /// As [`Target::new`].
    pub(super) fn target(
        &mut self,
        url: &str,
        protocol: BackendProtocol,
        websocket: bool,
        tls: Option<&BackendTls>,
        public_only: bool,
    ) -> Result<&Arc<Target>, TargetError> {
        let generation = self.generation;
        let made_of =
            |t: &Stamped<Arc<Target>>| t.value.made_of(protocol, websocket, tls, public_only);
        let parse = || Target::new(url, protocol, websocket, tls, public_only).map(Arc::new);
        let entry = match self.targets.entry_ref(url) {
            EntryRef::Occupied(e) => {
                let list = e.into_mut();
                match list.iter().position(made_of) {
                    Some(at) => &mut list[at],
                    // A URL named with other settings too.
                    None => {
                        list.push(Stamped::new(parse()?, generation));
                        let at = list.len() - 1;
                        &mut list[at]
                    }
                }
            }
            EntryRef::Vacant(e) => &mut e.insert(vec![Stamped::new(parse()?, generation)])[0],
        };
        entry.used = generation;
        Ok(&entry.value)
    }

    /// Counts `pattern`, held by a rule checked before, as used: kept by the next
    /// [`Cache::keep_used`] as if a check had asked for it.
    pub fn keep_pattern(&mut self, pattern: &Pattern) {
        let generation = self.generation;
        match self.patterns.entry_ref(pattern.source()) {
            EntryRef::Occupied(e) => e.into_mut().used = generation,
            EntryRef::Vacant(e) => {
                e.insert(Stamped::new(pattern.clone(), generation));
            }
        }
    }

    /// Counts `target`, held by a rule checked before, as used (see [`Cache::keep_pattern`]).
    pub fn keep_target(&mut self, target: &Arc<Target>) {
        let generation = self.generation;
        let list = self.targets.entry_ref(&*target.url).or_default();
        match list.iter_mut().find(|t| Arc::ptr_eq(&t.value, target)) {
            Some(t) => t.used = generation,
            None => list.push(Stamped::new(target.clone(), generation)),
        }
    }

    /// Keeps what the checks since the last call used and forgets the rest: call it once a
    /// document passed and is in use.
    pub fn keep_used(&mut self) {
        let generation = self.generation;
        self.patterns.retain(|_, e| e.used_in(generation));
        self.targets.retain(|_, list| {
            list.retain(|t| t.used_in(generation));
            !list.is_empty()
        });
        self.generation += 1;
    }

    /// Forgets what the checks since the last call added: call it when a document was refused.
    pub fn drop_used(&mut self) {
        let generation = self.generation;
        self.patterns.retain(|_, e| e.undo(generation));
        self.targets.retain(|_, list| {
            list.retain_mut(|t| t.undo(generation));
            !list.is_empty()
        });
    }
}
