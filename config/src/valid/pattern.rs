//! Regular expressions as the proxy matches them: `regex` crate syntax, anchored at both ends,
//! compiled with the engine and size limit of the proxy's matcher.

use regex_automata::meta;
use regex_automata::nfa::thompson::{self, WhichCaptures};
use regex_syntax::hir::{Hir, Look};
use std::sync::{Arc, OnceLock};

/// Bound on a compiled pattern's NFA: the `regex` crate's own default (10 MiB), so every
/// pattern that compiles with `regex` is taken, as the config's contract says. A pattern such
/// as `\w{500}` (Unicode word characters, 500 times) is over it and refused.
pub const PATTERN_SIZE_LIMIT: usize = 10 * (1 << 20);

/// An anchored regular expression (`regex` crate syntax) that must span the whole value.
///
/// Checked when made: parsed, and its NFAs compiled under [`PATTERN_SIZE_LIMIT`], so a pattern
/// the engine would refuse is refused then. The matcher itself (the `regex` crate's own
/// engine, with the capture-oriented engines left out) is built when the pattern is first
/// matched: checking costs about three quarters of building, only the patterns requests
/// reach hold a matcher's memory, and a pattern only checked (as the controller's are) is
/// never built at all. Clones share the one matcher.
#[derive(Debug, Clone)]
pub struct Pattern(Arc<Lazy>);

#[derive(Debug)]
struct Lazy {
    source: Box<str>,
    /// `None` only if the engine refused a pattern whose NFAs passed the check, which it does
    /// not; such a pattern would match nothing.
    re: OnceLock<Option<meta::Regex>>,
}

impl Pattern {
    /// Checks `source` anchored at both ends; the matcher is built on first use.
    ///
    /// # Errors
    /// A pattern that does not parse on its own, or whose compiled form exceeds
    /// [`PATTERN_SIZE_LIMIT`]; the message is the engine's, on one line.
    pub fn new(source: &str) -> Result<Self, String> {
        let hir = anchored(source)?;
        // The NFAs the engine compiles, forward and (for its lazy DFA) reverse: the sizes it
        // checks. The reverse one is the larger for Unicode classes.
        for config in [nfa(), nfa().reverse(true)] {
            thompson::Compiler::new()
                .configure(config)
                .build_from_hir(&hir)
                .map_err(|e| match e.size_limit() {
                    Some(limit) => format!(
                        "compiled, it would exceed the size limit of {} KiB (a repetition of a \
                         large class, such as `\\w{{500}}`, multiplies its size)",
                        limit / 1024
                    ),
                    None => one_line(&e.to_string()),
                })?;
        }
        Ok(Self(Arc::new(Lazy {
            source: source.into(),
            re: OnceLock::new(),
        })))
    }

    pub fn is_match(&self, value: &str) -> bool {
        self.0
            .re
            .get_or_init(|| build(&self.0.source))
            .as_ref()
            .is_some_and(|re| re.is_match(value))
    }

    /// The pattern as written.
    pub fn source(&self) -> &str {
        &self.0.source
    }
}

/// The matcher of a checked pattern.
fn build(source: &str) -> Option<meta::Regex> {
    let hir = anchored(source).ok()?;
    meta::Regex::builder()
        .configure(engine())
        .build_from_hir(&hir)
        .ok()
}

/// The NFA configuration [`engine`] compiles a pattern with.
fn nfa() -> thompson::Config {
    thompson::Config::new()
        .nfa_size_limit(Some(PATTERN_SIZE_LIMIT))
        .shrink(false)
        .which_captures(WhichCaptures::None)
}

/// The engine configuration every pattern is compiled with; a caller that compiles several
/// patterns into one automaton starts from it.
pub fn engine() -> meta::Config {
    meta::Config::new()
        .onepass(false)
        .backtrack(false)
        .dfa(false)
        .which_captures(WhichCaptures::None)
        .nfa_size_limit(Some(PATTERN_SIZE_LIMIT))
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
