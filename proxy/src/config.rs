//! From a config document to a live route table: validation, compilation, versioned swap.
//!
//! Everything that can fail is done here, before the swap: each rule is checked by the
//! contract the controller checks it with too ([`cftunnel_config::valid`]: regexes compiled,
//! header names and values parsed, backend URLs and TLS settings read), then built into the
//! table and backend clients. A failed push leaves the table being served untouched.

mod compile;
mod error;
mod reuse;
mod stream;

pub use compile::{compile, compile_json};
pub use error::ConfigError;

use crate::forward::Upstream;
use crate::proxy::Proxy;
use crate::route::RegexSets;
use crate::routes::Routes;
use bytes::Bytes;
use cftunnel_config::{valid, Config};
use foldhash::{HashMap, HashMapExt};
use std::sync::Arc;

/// What one compile hands to the next: backend clients, by their target (so connection pools
/// survive a reload), the contract's compiled patterns and parsed targets and the table's
/// multi-pattern automatons (so an unchanged regex is not compiled again), and the compiled
/// rules (so an unchanged rule is neither checked nor built again).
#[derive(Debug)]
pub struct Cache {
    pub(crate) upstreams: HashMap<TargetId, Arc<Upstream>>,
    pub(crate) checked: valid::Cache,
    /// The route table's multi-pattern automatons.
    pub(crate) regex_sets: RegexSets,
    /// The compiled rules of the table in service.
    pub(crate) rules: reuse::Rules,
    /// Rules, and exact and wildcard hostnames, of the table in service: about as many as the
    /// next one has.
    pub(crate) last_rules: usize,
    pub(crate) last_hosts: (usize, usize),
    /// How each new backend client speaks to its backend.
    pub(crate) backends: crate::forward::BackendOptions,
    /// The keys of each Cloudflare Access team the table names, kept across pushes.
    pub(crate) access: crate::access::Teams,
}

/// A checked target, compared by identity: the contract's cache hands out the same `Arc` for an
/// unchanged target push after push, so finding its client costs no string hashing. Holding
/// the `Arc` keeps its address from being reused by another target.
#[derive(Debug, Clone)]
pub(crate) struct TargetId(pub(crate) Arc<valid::Target>);

impl PartialEq for TargetId {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for TargetId {}

impl std::hash::Hash for TargetId {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        std::ptr::hash(Arc::as_ptr(&self.0), state);
    }
}

impl Default for Cache {
    fn default() -> Self {
        Self::with_backends(crate::forward::BackendOptions::default())
    }
}

impl Cache {
    /// An empty cache whose backend clients speak to their backends as `backends` say.
    pub fn with_backends(backends: crate::forward::BackendOptions) -> Self {
        Self {
            upstreams: HashMap::new(),
            checked: valid::Cache::default(),
            regex_sets: RegexSets::default(),
            rules: reuse::Rules::default(),
            last_rules: 0,
            last_hosts: (0, 0),
            backends,
            access: crate::access::Teams::default(),
        }
    }

    /// The same cache, fetching Cloudflare Access keys as `settings` say and counting checks
    /// and fetches in `metrics`.
    pub fn with_access(
        mut self,
        settings: crate::access::AccessSettings,
        metrics: crate::access::AccessMetrics,
    ) -> Self {
        self.access = crate::access::Teams::new(settings).with_metrics(metrics);
        self
    }
}

/// Applies config documents to a [`Proxy`], one at a time.
///
/// A push runs to its end once its document is in: the compile, the swap and the cache it
/// leaves for the next push belong to a thread of its own that holds the state, not to the caller's
/// future, so a pusher that hangs up mid-compile (its own timeout) costs nothing: the next push
/// waits for this one and finds the cache, and the settings in it, as this one left them.
#[derive(Debug)]
pub struct Reloader {
    proxy: Proxy,
    state: Arc<tokio::sync::Mutex<State>>,
}

#[derive(Debug, Default)]
struct State {
    /// Version of the document being served (0 after an unversioned push): what a
    /// stale push is measured against, as `GET /config` reports it, so a pusher that
    /// reads it after a 409 can always get past it.
    version: i64,
    /// The JSON text of the document being served, as `GET /config/document` answers it: a
    /// controller that lost what it pushed (a restart, a new leader) reads it back from here.
    document: Option<Bytes>,
    cache: Cache,
}

/// Whether a document at version `pushed` is stale against `current`, the version in service:
/// older, and versioned (version 0 is always accepted; the same version is applied again).
pub(crate) fn is_stale(pushed: i64, current: i64) -> bool {
    pushed > 0 && pushed < current
}

/// Reads a document's JSON text into the config type with the reader a push's text goes through
/// ([`Reloader::apply_json`]), so the same document is refused with the same message.
///
/// # Errors
/// [`ConfigError::Json`], naming the path of the value at fault.
pub(crate) fn read_document(text: &[u8]) -> Result<Config, ConfigError> {
    stream::read_document(text).map_err(ConfigError::Json)
}

/// Documents with more rules than this (or, as text, more bytes) give the memory they were
/// parsed into back to the system once compiled.
const LARGE_DOCUMENT_RULES: usize = 500;
const LARGE_DOCUMENT_BYTES: usize = 100 * 1024;

impl Reloader {
    pub fn new(proxy: Proxy) -> Self {
        Self::with_cache(proxy, Cache::default())
    }

    /// A reloader that compiles with `cache` (its connection limit, and anything in it).
    pub fn with_cache(proxy: Proxy, cache: Cache) -> Self {
        Self {
            proxy,
            state: Arc::new(tokio::sync::Mutex::new(State {
                version: 0,
                document: None,
                cache,
            })),
        }
    }

    pub fn proxy(&self) -> &Proxy {
        &self.proxy
    }

    /// The version being served: read from the table in service, so it never waits for a push
    /// being compiled.
    pub fn version(&self) -> i64 {
        self.proxy.routes().version()
    }

    /// The JSON text of the document being served, if one was applied.
    pub async fn document(&self) -> Option<Bytes> {
        self.state.lock().await.document.clone()
    }

    /// Validates, compiles and swaps in `doc`.
    ///
    /// Versions: `0 < version < current` is stale (409); `version == current` is re-applied;
    /// version 0 is always accepted.
    pub async fn apply(&self, doc: Config) -> Result<i64, ConfigError> {
        let state = self.state.clone().lock_owned().await;
        if is_stale(doc.version, state.version) {
            self.proxy.metrics().reload("stale");
            return Err(ConfigError::Stale {
                pushed: doc.version,
                current: state.version,
            });
        }
        let proxy = self.proxy.clone();
        // Off the async workers whatever its size: a few hundred patterns take tens of
        // milliseconds to compile, which requests on this worker would otherwise wait out.
        let big = doc.rules.len() > LARGE_DOCUMENT_RULES;
        run_to_end(state, move |state| {
            let text = serde_json::to_vec(&doc).ok().map(Bytes::from);
            let compiled = compile(&doc, proxy.metrics(), &mut state.cache);
            if big {
                // The parsed document is as large as the table; give its memory back now.
                drop(doc);
                crate::memory::release_freed();
            }
            swap_in(&proxy, state, compiled, text)
        })
        .await
    }

    /// [`Reloader::apply`] of a document's JSON text, read and compiled together off the async
    /// workers: each rule is compiled as soon as it is read and dropped, so a push never holds
    /// the whole parsed document beside the table being built.
    ///
    /// # Errors
    /// As [`Reloader::apply`], and first [`ConfigError::Json`] for text that is not one config
    /// document: a malformed document is refused as such, whatever its version or rules.
    pub async fn apply_json(&self, text: Bytes) -> Result<i64, ConfigError> {
        let state = self.state.clone().lock_owned().await;
        let proxy = self.proxy.clone();
        let big = text.len() > LARGE_DOCUMENT_BYTES;
        run_to_end(state, move |state| {
            let compiled =
                compile::compile_json(&text, state.version, proxy.metrics(), &mut state.cache);
            if big {
                // Parsing took as much as a fifth of the table; give that memory back now (the
                // text itself is kept, for `GET /config/document`).
                crate::memory::release_freed();
            }
            match compiled {
                Err(e @ ConfigError::Stale { .. }) => {
                    proxy.metrics().reload("stale");
                    Err(e)
                }
                Err(e @ ConfigError::Json(_)) => {
                    proxy.metrics().reload("rejected");
                    Err(e)
                }
                compiled => swap_in(&proxy, state, compiled, Some(text)),
            }
        })
        .await
    }
}

/// Runs `push` with the state it holds on a thread of its own, to its end even if the caller
/// stops waiting.
///
/// Not on the runtime's blocking pool: that pool also runs backend name lookups, which hold a
/// thread each for as long as DNS takes to fail (about 20 s when it does not answer), and a
/// push queued behind them is the fix for that incident arriving too late. Pushes are rare, so
/// a thread each costs nothing. The thread enters the runtime, as a blocking task would, for
/// what the swap starts (Access key refreshes, retiring the old table).
async fn run_to_end<F>(
    mut state: tokio::sync::OwnedMutexGuard<State>,
    push: F,
) -> Result<i64, ConfigError>
where
    F: FnOnce(&mut State) -> Result<i64, ConfigError> + Send + 'static,
{
    let runtime = tokio::runtime::Handle::try_current().ok();
    let (done, result) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("config-compile".into())
        .spawn(move || {
            let _entered = runtime.as_ref().map(tokio::runtime::Handle::enter);
            let _ = done.send(push(&mut state));
        })
        .map_err(|_| ConfigError::Internal("cannot start the compiler thread"))?;
    result
        .await
        .map_err(|_| ConfigError::Internal("compiler task failed"))?
}

/// Serves a compiled table, or counts and logs why there is none.
fn swap_in(
    proxy: &Proxy,
    state: &mut State,
    compiled: Result<Routes, ConfigError>,
    document: Option<Bytes>,
) -> Result<i64, ConfigError> {
    state.cache.access.start();
    match compiled {
        Ok(routes) => {
            let version = routes.version();
            let rules = routes.rule_count();
            proxy.swap(routes);
            state.version = version;
            state.document = document;
            proxy.metrics().reload("success");
            tracing::info!(version, rules, "config applied");
            Ok(version)
        }
        Err(e) => {
            proxy.metrics().reload("rejected");
            tracing::warn!(error = %e, "config rejected");
            Err(e)
        }
    }
}
