//! Rules compiled by an earlier push, shared with the next table when pushed again unchanged.
//!
//! A controller pushes the whole document on every change, so almost every rule of a push is
//! one the table in service already holds, and the new table shares its compiled matches and
//! payload instead of checking and building it again: a push costs the work of the rules it
//! changes, and the memory of a rule both tables hold is held once.
//!
//! A rule read from JSON text is recognised by its text, compared whole (the map hashes it
//! with foldhash first), so nothing but the very same text can be taken for it. A parsed rule
//! is recognised by a keyed 128-bit hash of its wire form, every field included (SipHash-1-3,
//! keys drawn when the proxy starts, so no document can be crafted to make two different
//! rules collide).

use crate::forward::Upstream;
use crate::route::{MatchSpec, Pattern};
use crate::rule::Rule;
use cftunnel_config::{valid, Rule as WireRule};
use siphasher::sip128::{Hasher128, SipHasher13};
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::sync::Arc;

/// A rule as compiled into a table.
#[derive(Debug)]
pub(crate) struct Compiled {
    /// Checked and lower-cased; empty: any host.
    pub(crate) hostnames: Box<[Box<str>]>,
    pub(crate) matches: Arc<[MatchSpec]>,
    pub(crate) rule: Arc<Rule>,
    /// The parsed targets and backend clients the rule holds, and its compiled patterns: what
    /// the other caches must keep while the rule is in use, so a changed rule naming the same
    /// backend gets the same client (one connection pool and limit per backend).
    pub(crate) targets: Box<[(Arc<valid::Target>, Arc<Upstream>)]>,
    pub(crate) patterns: Box<[Pattern]>,
}

/// The compiled rules of the table in service and of the table being compiled, by
/// fingerprint (parsed rules) and by text (rules read from JSON).
#[derive(Debug)]
pub(crate) struct Rules {
    keys: (u64, u64),
    old: Map,
    used: Map,
    old_text: TextMap,
    used_text: TextMap,
}

/// What a rule is recognised by.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Key<'t> {
    /// [`Rules::fingerprint`] of a parsed rule.
    Parsed(u128),
    /// A rule's JSON text. Equal text is an equal rule; text that differs only in spacing or
    /// field order is another text, and its rule is just compiled again.
    Text(&'t str),
}

/// Fingerprints are uniformly distributed already: the map uses them as they are.
type Map = HashMap<u128, Arc<Compiled>, BuildHasherDefault<Fingerprint>>;

/// The text is shared by both generations' maps, not copied.
type TextMap = foldhash::HashMap<Arc<str>, Arc<Compiled>>;

impl Default for Rules {
    fn default() -> Self {
        Self {
            keys: (rand::random(), rand::random()),
            old: Map::default(),
            used: Map::default(),
            old_text: TextMap::default(),
            used_text: TextMap::default(),
        }
    }
}

impl Rules {
    /// The fingerprint of a rule as pushed.
    pub(crate) fn fingerprint(&self, rule: &WireRule) -> u128 {
        let mut hasher = SipHasher13::new_with_keys(self.keys.0, self.keys.1);
        rule.hash(&mut hasher);
        hasher.finish128().as_u128()
    }

    /// The rule compiled under `key` by this compile or by the one of the table in service,
    /// now counted as used.
    pub(crate) fn get(&mut self, key: Key<'_>) -> Option<Arc<Compiled>> {
        match key {
            Key::Parsed(fingerprint) => {
                if let Some(c) = self.used.get(&fingerprint) {
                    return Some(c.clone());
                }
                let c = self.old.get(&fingerprint)?.clone();
                self.used.insert(fingerprint, c.clone());
                Some(c)
            }
            Key::Text(text) => {
                if let Some(c) = self.used_text.get(text) {
                    return Some(c.clone());
                }
                let (text, c) = self.old_text.get_key_value(text)?;
                let c = c.clone();
                self.used_text.insert(text.clone(), c.clone());
                Some(c)
            }
        }
    }

    pub(crate) fn insert(&mut self, key: Key<'_>, compiled: Arc<Compiled>) {
        match key {
            Key::Parsed(fingerprint) => {
                self.used.insert(fingerprint, compiled);
            }
            Key::Text(text) => {
                self.used_text.insert(text.into(), compiled);
            }
        }
    }

    /// The rules used since the last call are the ones in service: keep them, forget the rest.
    pub(crate) fn keep_used(&mut self) {
        std::mem::swap(&mut self.old, &mut self.used);
        self.used.clear();
        std::mem::swap(&mut self.old_text, &mut self.used_text);
        self.used_text.clear();
    }

    /// The document was refused: forget what it compiled.
    pub(crate) fn drop_used(&mut self) {
        self.used.clear();
        self.used_text.clear();
    }
}

/// Hashes a fingerprint to its low 64 bits.
#[derive(Debug, Default)]
pub(crate) struct Fingerprint(u64);

impl Hasher for Fingerprint {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u128(&mut self, n: u128) {
        self.0 = n as u64;
    }
}
