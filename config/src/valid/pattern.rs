//! Regular expressions as the proxy matches them: `regex` crate syntax, anchored at both ends,
//! compiled under a size limit, and what each one costs to hold.

use regex_automata::hybrid::dfa::{self as lazy, DFA};
use regex_automata::meta;
use regex_automata::nfa::thompson::pikevm::{self, PikeVM};
use regex_automata::nfa::thompson::{self, WhichCaptures, NFA};
use regex_automata::util::pool::Pool;
use regex_automata::{Anchored, Input};
use regex_syntax::hir::{Hir, Look};
use std::fmt;
use std::panic::{RefUnwindSafe, UnwindSafe};
use std::sync::{Arc, OnceLock};

/// Bound on a compiled pattern's NFA ([`Pattern::cost`]). A pattern such as `\w{500}`
/// (Unicode word characters, 500 times: about 8 MiB) is over it and refused.
///
/// The `regex` crate bounds each of the two NFAs it compiles, forward and reverse, at 10 MiB;
/// for a repeated Unicode class the reverse one is about 2.2 times the forward one, so its
/// bound is a forward NFA of about 4.5 MiB, and this one takes about the patterns `regex`
/// takes. Only the forward NFA is compiled and held here, and a quarter of
/// [`PATTERN_BUDGET`](super::PATTERN_BUDGET) leaves room for the others of a document: what
/// they take together is bounded by that.
pub const PATTERN_SIZE_LIMIT: usize = 4 * (1 << 20);

/// Room each thread's lazy DFA has for the states it adds as it meets new input, beside the
/// working sets that grow with the pattern's NFA ([`LAZY_DFA_PER_STATE`]). Paths and header
/// values keep a pattern's DFA to a few dozen states, well inside it; a pattern whose DFA
/// outgrows it (one with many states per input byte) clears and refills it, and falls back to
/// the NFA when that happens too often, so a stream of crafted requests holds no more than
/// this per pattern and thread. The `regex` crate's default is 2 MiB.
const LAZY_DFA_ROOM: usize = 256 << 10;

/// Bytes of a thread's lazy DFA cache per NFA state, for the sets it tracks states in: enough
/// that a pattern near [`PATTERN_SIZE_LIMIT`] still gets a lazy DFA instead of matching on its
/// NFA alone, as the `regex` crate's flat 2 MiB would leave it.
const LAZY_DFA_PER_STATE: usize = 32;

/// An anchored regular expression (`regex` crate syntax) that must span the whole value.
///
/// Checked when made: parsed and compiled under [`PATTERN_SIZE_LIMIT`], so a pattern the
/// engine would refuse is refused then. The matcher is a lazy DFA over the compiled NFA, with
/// the NFA simulated where the lazy DFA gives up (a Unicode word boundary next to non-ASCII
/// text, a DFA that keeps outgrowing its cache): a match needs no more than a forward search,
/// since a pattern spans the whole value, so no reverse automaton is compiled or held. What a
/// pattern holds is its NFA, [`Pattern::cost`], plus each matching thread's lazy DFA cache.
///
/// [`Pattern::new`] builds the matcher at once, from the NFA the check compiled, so no match
/// ever waits for it. A pattern only checked (as the controller's are, [`super::check`]) holds
/// no matcher and no NFA; matched anyway, it builds its matcher on first use. Clones share the
/// one matcher.
#[derive(Clone)]
pub struct Pattern(Arc<Compiled>);

struct Compiled {
    source: Box<str>,
    /// Bytes of heap its NFA takes.
    cost: usize,
    /// `None` only if the engine refused a pattern whose NFA passed the check, which it does
    /// not; such a pattern would match nothing.
    matcher: OnceLock<Option<Matcher>>,
}

/// A pattern's matcher: its engines, and the caches they search with, one per thread matching.
struct Matcher {
    /// Shared with the pool, which makes each thread's caches from them.
    engines: Arc<Engines>,
    caches: Pool<Caches, NewCaches>,
}

/// The lazy DFA (absent only if it could not be built) and the NFA simulation it falls back
/// to.
struct Engines {
    dfa: Option<DFA>,
    pikevm: PikeVM,
}

type NewCaches = Box<dyn Fn() -> Caches + Send + Sync + UnwindSafe + RefUnwindSafe>;

struct Caches {
    dfa: Option<lazy::Cache>,
    pikevm: pikevm::Cache,
}

impl Pattern {
    /// Checks `source` anchored at both ends and builds its matcher.
    ///
    /// # Errors
    /// A pattern that does not parse on its own, or whose compiled form exceeds
    /// [`PATTERN_SIZE_LIMIT`]; the message is the engine's, on one line.
    pub fn new(source: &str) -> Result<Self, String> {
        let (nfa, cost) = compile(source)?;
        let matcher = OnceLock::from(Matcher::new(nfa));
        Ok(Self::with(source, cost, matcher))
    }

    /// [`Pattern::new`]'s check alone: the NFA is compiled, measured and dropped.
    ///
    /// # Errors
    /// As [`Pattern::new`].
    pub(super) fn checked(source: &str) -> Result<Self, String> {
        let (_, cost) = compile(source)?;
        Ok(Self::with(source, cost, OnceLock::new()))
    }

    fn with(source: &str, cost: usize, matcher: OnceLock<Option<Matcher>>) -> Self {
        Self(Arc::new(Compiled {
            source: source.into(),
            cost,
            matcher,
        }))
    }

    pub fn is_match(&self, value: &str) -> bool {
        self.matcher().is_some_and(|m| m.is_match(value))
    }

    /// Builds the matcher of a pattern only checked, if it has none yet.
    pub fn build(&self) {
        self.matcher();
    }

    /// Whether the matcher is built: always, for a pattern made by [`Pattern::new`] or
    /// checked for a rule that is built ([`super::rule`]).
    pub fn is_built(&self) -> bool {
        self.0.matcher.get().is_some()
    }

    /// Bytes of heap the compiled NFA takes, which the matcher holds: the measure of
    /// [`PATTERN_SIZE_LIMIT`] and [`super::PATTERN_BUDGET`]. The same on every build of this
    /// crate, so the controller and the proxy agree on it.
    pub fn cost(&self) -> usize {
        self.0.cost
    }

    /// The pattern as written.
    pub fn source(&self) -> &str {
        &self.0.source
    }

    fn matcher(&self) -> Option<&Matcher> {
        self.0
            .matcher
            .get_or_init(|| {
                let (nfa, _) = compile(&self.0.source).ok()?;
                Matcher::new(nfa)
            })
            .as_ref()
    }
}

impl fmt::Debug for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pattern")
            .field("source", &self.source())
            .field("cost", &self.cost())
            .field("built", &self.is_built())
            .finish()
    }
}

impl Matcher {
    fn new(nfa: NFA) -> Option<Self> {
        let capacity = LAZY_DFA_ROOM + LAZY_DFA_PER_STATE * nfa.states().len();
        let config = DFA::config()
            .cache_capacity(capacity)
            // A capacity below what the NFA needs is raised to it rather than failing.
            .skip_cache_capacity_check(true)
            // With these, the DFA can give up at match time, and the NFA answers instead.
            .unicode_word_boundary(true)
            .minimum_cache_clear_count(Some(3))
            .minimum_bytes_per_state(Some(10));
        let dfa = DFA::builder()
            .configure(config)
            .build_from_nfa(nfa.clone())
            .ok();
        let pikevm = PikeVM::new_from_nfa(nfa).ok()?;
        let engines = Arc::new(Engines { dfa, pikevm });
        let shared = Arc::clone(&engines);
        let new: NewCaches = Box::new(move || Caches {
            dfa: shared.dfa.as_ref().map(DFA::create_cache),
            pikevm: shared.pikevm.create_cache(),
        });
        Some(Self {
            engines,
            caches: Pool::new(new),
        })
    }

    fn is_match(&self, value: &str) -> bool {
        let input = Input::new(value).anchored(Anchored::Yes).earliest(true);
        let mut caches = self.caches.get();
        let Caches { dfa: cache, pikevm } = &mut *caches;
        if let (Some(dfa), Some(cache)) = (&self.engines.dfa, cache) {
            if let Ok(found) = dfa.try_search_fwd(cache, &input) {
                return found.is_some();
            }
        }
        self.engines.pikevm.is_match(pikevm, input)
    }
}

#[cfg(test)]
thread_local! {
    /// How many times this thread compiled a pattern, refused or not: a test's checks run on
    /// its own thread, so tests running beside it do not move the count.
    static COMPILES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// How many patterns this thread compiled so far (see [`COMPILES`]).
#[cfg(test)]
pub(super) fn compiles() -> usize {
    COMPILES.with(std::cell::Cell::get)
}

/// `source` anchored and compiled into the NFA the matcher runs on, and the heap it takes.
fn compile(source: &str) -> Result<(NFA, usize), String> {
    #[cfg(test)]
    COMPILES.with(|c| c.set(c.get() + 1));
    let hir = anchored(source)?;
    let nfa = thompson::Compiler::new()
        .configure(nfa())
        .build_from_hir(&hir)
        .map_err(|e| match e.size_limit() {
            Some(limit) => format!(
                "compiled, it would exceed the size limit of {} KiB (a repetition of a large \
                 class, such as `\\w{{500}}`, multiplies its size)",
                limit / 1024
            ),
            None => one_line(&e.to_string()),
        })?;
    let cost = nfa.memory_usage();
    Ok((nfa, cost))
}

/// The NFA configuration a pattern is compiled with.
fn nfa() -> thompson::Config {
    thompson::Config::new()
        .nfa_size_limit(Some(PATTERN_SIZE_LIMIT))
        .shrink(false)
        .which_captures(WhichCaptures::None)
}

/// The engine configuration for a caller that compiles several patterns into one automaton,
/// with the `regex` crate's own size limit (10 MiB per NFA): such an automaton is one more
/// way of matching patterns that passed their checks, not a check.
pub fn engine() -> meta::Config {
    meta::Config::new()
        .onepass(false)
        .backtrack(false)
        .dfa(false)
        .which_captures(WhichCaptures::None)
        .nfa_size_limit(Some(10 * (1 << 20)))
}

/// `source` parsed on its own, then anchored at both ends. Anchoring the parsed pattern, not
/// its text, keeps the pattern's meaning: `a)|(b` is refused instead of becoming the valid
/// `^(?:a)|(b)$`, which would match anything containing `b`.
///
/// # Errors
/// The pattern does not parse; the message is the parser's cause, on one line.
pub fn anchored(source: &str) -> Result<Hir, String> {
    let hir = regex_syntax::Parser::new()
        .parse(source)
        .map_err(|e| one_line(&e.to_string()))?;
    Ok(Hir::concat(vec![
        Hir::look(Look::Start),
        hir,
        Hir::look(Look::End),
    ]))
}

/// `text` with every character that has a meaning in a pattern escaped, so it matches itself.
pub fn escape(text: &str) -> String {
    regex_syntax::escape(text)
}

/// Syntax errors render as several lines (pattern, caret, cause): a field's message keeps the
/// cause, so it reads well in a 400 body and in a route condition alike.
fn one_line(message: &str) -> String {
    message
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or_default()
        .trim()
        .to_owned()
}
