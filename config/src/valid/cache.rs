//! What one check hands to the next: checked patterns (refused ones with their message) and
//! parsed targets, by their source, and what the patterns of the rules passed so far take of
//! the document's budget.

use super::budget::{self, Named, PATTERN_BUDGET};
use super::pattern::Pattern;
use super::target::{Target, TargetError};
use super::Invalid;
use crate::{BackendProtocol, BackendTls};
use hashbrown::hash_map::EntryRef;
use std::sync::Arc;

/// Fold hashing, as the rest of the contract's maps: the keys are the controller's and the
/// operator's own URLs and patterns.
type HashMap<K, V> = hashbrown::HashMap<K, V, foldhash::fast::RandomState>;

/// Compiled patterns and parsed targets, reused when a later document names them again, so an
/// unchanged regex is compiled once however often the document is pushed or re-translated.
/// A refused pattern is remembered too, with its message, by the same generations: one over
/// the size limit costs as much to refuse as one within it costs to accept.
///
/// Entries live in two generations: those the checks since [`Cache::keep_used`] asked for, and
/// those from before. `keep_used` drops what the last document no longer names, so the cache
/// holds no more than one document's worth; [`Cache::drop_used`] forgets what a refused
/// document added and keeps the previous generation.
///
/// Each entry carries the generation that last asked for it, in one map: a lookup finds it and
/// counts it as used, with nothing moved between maps.
///
/// The checks since [`Cache::keep_used`] are one document's: the patterns of the rules that
/// passed them count against [`PATTERN_BUDGET`] (see [`budget`](super::budget)), each once.
#[derive(Debug)]
pub struct Cache {
    patterns: HashMap<Box<str>, Stamped<Checked>>,
    /// By URL, then by the rest of the settings (almost always one target per URL).
    targets: HashMap<Box<str>, Vec<Stamped<Arc<Target>>>>,
    /// The generation the checks since [`Cache::keep_used`] belong to; every entry's is this
    /// or older.
    generation: u64,
    /// What the patterns counted in this generation take together.
    spent: usize,
}

/// What checking a pattern's source gave.
#[derive(Debug)]
enum Checked {
    Passed(Counted),
    /// The message it was refused with: never a [`Pattern`], never counted.
    Refused(Box<str>),
}

/// A pattern, and the generation whose budget counted it last (0: none).
#[derive(Debug)]
struct Counted {
    pattern: Pattern,
    counted: u64,
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

impl Checked {
    /// A pattern that passed, counted by no generation yet.
    fn passed(pattern: &Pattern) -> Self {
        Self::Passed(Counted {
            pattern: pattern.clone(),
            counted: 0,
        })
    }
}

impl Default for Cache {
    fn default() -> Self {
        Self {
            patterns: HashMap::default(),
            targets: HashMap::default(),
            // Above every entry's `used - 1`, so `undo` never goes below zero.
            generation: 1,
            spent: 0,
        }
    }
}

impl Cache {
    /// `source` checked as [`Pattern::new`] checks it, without building a matcher (see
    /// [`Pattern`]).
    ///
    /// # Errors
    /// As [`Pattern::new`], with the same message when the refusal is remembered.
    pub fn pattern(&mut self, source: &str) -> Result<Pattern, String> {
        self.pattern_for(source, false)
    }

    /// [`Cache::pattern`], with its matcher built if `build`: the matcher is built from the
    /// NFA the check compiled, so building one costs little beside checking it.
    ///
    /// # Errors
    /// As [`Pattern::new`].
    pub(super) fn pattern_for(&mut self, source: &str, build: bool) -> Result<Pattern, String> {
        let generation = self.generation;
        if let Some(e) = self.patterns.get_mut(source) {
            e.used = generation;
            return match &e.value {
                Checked::Passed(c) => {
                    if build {
                        c.pattern.build();
                    }
                    Ok(c.pattern.clone())
                }
                Checked::Refused(message) => Err(message.as_ref().to_owned()),
            };
        }
        let checked = if build {
            Pattern::new(source)
        } else {
            Pattern::checked(source)
        };
        let value = match &checked {
            Ok(pattern) => Checked::passed(pattern),
            Err(message) => Checked::Refused(message.as_str().into()),
        };
        self.patterns
            .insert(source.into(), Stamped::new(value, generation));
        checked
    }

    /// Counts the patterns of a rule that passed every other check against the budget: those
    /// this document has not counted yet, in order.
    ///
    /// # Errors
    /// The first pattern that takes the document past [`PATTERN_BUDGET`], at its field;
    /// nothing of the rule is counted then.
    pub(super) fn count(&mut self, named: &Named) -> Result<(), Invalid> {
        let mut added = 0;
        for (i, (pattern, site)) in named.iter().enumerate() {
            if named.repeats(i) || self.counted(pattern) {
                continue;
            }
            added += pattern.cost();
            if self.spent + added > PATTERN_BUDGET {
                return Err(budget::over(*site, pattern.cost()));
            }
        }
        for (pattern, _) in named.iter() {
            self.mark(pattern);
        }
        self.spent += added;
        Ok(())
    }

    /// Counts `patterns`, held by a rule checked before, as used: kept by the next
    /// [`Cache::keep_used`] as if a check had asked for them, and counted against the budget
    /// as [`super::rule`] counts a rule's patterns.
    ///
    /// `false`, with nothing counted or kept, if they would take the document past
    /// [`PATTERN_BUDGET`]: the caller checks the rule again ([`super::rule`]), which refuses
    /// it at the field of the pattern that does.
    #[must_use]
    pub fn keep_patterns(&mut self, patterns: &[Pattern]) -> bool {
        let mut added = 0;
        for (i, pattern) in patterns.iter().enumerate() {
            let repeated = patterns
                .get(..i)
                .is_some_and(|b| b.iter().any(|q| q.source() == pattern.source()));
            if !repeated && !self.counted(pattern) {
                added += pattern.cost();
            }
        }
        if self.spent + added > PATTERN_BUDGET {
            return false;
        }
        for pattern in patterns {
            self.mark(pattern);
        }
        self.spent += added;
        true
    }

    /// Whether this generation's budget counted `pattern` already (by its source: the checks
    /// share one compiled pattern per source).
    fn counted(&self, pattern: &Pattern) -> bool {
        let generation = self.generation;
        self.patterns
            .get(pattern.source())
            .is_some_and(|e| match &e.value {
                Checked::Passed(c) => c.counted == generation,
                Checked::Refused(_) => false,
            })
    }

    /// Marks `pattern` used and counted in this generation.
    fn mark(&mut self, pattern: &Pattern) {
        let generation = self.generation;
        let entry = match self.patterns.entry_ref(pattern.source()) {
            EntryRef::Occupied(e) => e.into_mut(),
            EntryRef::Vacant(e) => e.insert(Stamped::new(Checked::passed(pattern), generation)),
        };
        entry.used = generation;
        match &mut entry.value {
            Checked::Passed(c) => c.counted = generation,
            // Not met: the engine refuses a source every time or never. Were it met, the
            // pattern in hand compiled, and is what a later check gets.
            refused @ Checked::Refused(_) => {
                *refused = Checked::Passed(Counted {
                    pattern: pattern.clone(),
                    counted: generation,
                });
            }
        }
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

    /// Counts `target`, held by a rule checked before, as used (see [`Cache::keep_patterns`]).
    pub fn keep_target(&mut self, target: &Arc<Target>) {
        let generation = self.generation;
        let list = self.targets.entry_ref(&*target.url).or_default();
        match list.iter_mut().find(|t| Arc::ptr_eq(&t.value, target)) {
            Some(t) => t.used = generation,
            None => list.push(Stamped::new(target.clone(), generation)),
        }
    }

    /// Keeps what the checks since the last call used and forgets the rest: call it once a
    /// document passed and is in use. The next checks are another document's, with the whole
    /// budget.
    pub fn keep_used(&mut self) {
        let generation = self.generation;
        self.patterns.retain(|_, e| e.used_in(generation));
        self.targets.retain(|_, list| {
            list.retain(|t| t.used_in(generation));
            !list.is_empty()
        });
        self.generation += 1;
        self.spent = 0;
    }

    /// Forgets what the checks since the last call added, and what they counted against the
    /// budget: call it when a document was refused.
    pub fn drop_used(&mut self) {
        let generation = self.generation;
        self.patterns.retain(|_, e| {
            if let Checked::Passed(c) = &mut e.value {
                if c.counted == generation {
                    c.counted = 0;
                }
            }
            e.undo(generation)
        });
        self.targets.retain(|_, list| {
            list.retain_mut(|t| t.undo(generation));
            !list.is_empty()
        });
        self.spent = 0;
    }
}
