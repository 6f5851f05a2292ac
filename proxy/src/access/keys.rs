//! One team's signing keys: fetched from its JWKS endpoint by a background task, swapped in
//! whole, read by requests without a lock. Requests never fetch; the first request of a team,
//! and one naming a key the set lacks, wake the task and wait (bounded) for its next fetch.

use super::metrics::{AccessMetrics, TeamLabels, TeamOutcomeLabels};
use super::token::{self, Candidate, Key, Verified, VerifiedCache};
use super::{AccessError, AccessSettings, CERTS_PATH};
use crate::forward::{empty_body, Upstream};
use arc_swap::ArcSwapOption;
use cftunnel_config::{valid, BackendProtocol};
use http::{header, HeaderValue, Request, StatusCode};
use http_body_util::{BodyExt, Limited};
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, KeyAlgorithm, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

/// The largest key-set document read (Cloudflare's is a few kilobytes).
const MAX_JWKS_BYTES: usize = 1 << 20;
/// Wait before the first retry of a failed fetch; doubled per failure up to the refresh period.
const FIRST_RETRY: Duration = Duration::from_secs(1);

/// The keys of one successful fetch.
#[derive(Debug)]
pub(super) struct KeySet {
    pub(super) keys: Vec<Key>,
    /// Changes only when the keys do: what a remembered token was verified against.
    pub(super) version: u64,
    /// The raw `keys` array, to tell a changed set from the same one fetched again.
    raw: String,
    /// When it was fetched; the set serves until `max_stale` after this.
    fetched: Instant,
}

/// The keys of one team and the task keeping them fresh. Dropping it ends the task and
/// removes the team's series from `/metrics`.
#[derive(Debug)]
pub struct TeamKeys {
    team: Box<str>,
    shared: Arc<Shared>,
    metrics: AccessMetrics,
}

/// The team's series, fetched once when the team is first named: the refresh task only
/// touches atomics.
#[derive(Debug)]
struct TeamMetrics {
    fetched: Counter,
    failed: Counter,
    age: Gauge<f64, AtomicU64>,
}

impl TeamMetrics {
    fn new(team: &str, metrics: &AccessMetrics) -> Self {
        if let Ok(mut live) = metrics.live_teams.lock() {
            *live.entry(team.to_owned()).or_default() += 1;
        }
        let fetches = |outcome| {
            metrics
                .key_fetches
                .get_or_create(&TeamOutcomeLabels {
                    team: team.to_owned(),
                    outcome,
                })
                .clone()
        };
        Self {
            fetched: fetches(FETCH_OK),
            failed: fetches(FETCH_ERROR),
            age: metrics
                .keys_age
                .get_or_create(&TeamLabels {
                    team: team.to_owned(),
                })
                .clone(),
        }
    }
}

/// The `outcome` label values of `cftunnel_proxy_access_key_fetches_total`.
const FETCH_OK: &str = "ok";
const FETCH_ERROR: &str = "error";

#[derive(Debug)]
struct Shared {
    settings: Arc<AccessSettings>,
    issuer: Box<str>,
    upstream: Upstream,
    keys: ArcSwapOption<KeySet>,
    /// Counts finished fetch attempts, for requests waiting on one.
    attempts: watch::Sender<u64>,
    /// Milliseconds from `epoch` to the start of the last attempt; `u64::MAX`: none yet.
    last_attempt: AtomicU64,
    /// An attempt is under way: a request asking for one waits for it instead.
    fetching: AtomicBool,
    epoch: Instant,
    wake: Notify,
    started: AtomicBool,
    closed: AtomicBool,
    verified: VerifiedCache,
    validations: token::Validations,
    metrics: TeamMetrics,
}

impl TeamKeys {
    /// The keys of `team`, not fetched yet (see [`TeamKeys::start`]).
    ///
    /// # Errors
    /// The team domain is not a URL a client can be built for.
    pub fn new(
        team: &str,
        settings: Arc<AccessSettings>,
        metrics: &AccessMetrics,
    ) -> Result<Self, String> {
        let domain = settings.domain_of(team);
        let target = valid::Target::new(&domain, BackendProtocol::Http1, false, None, false)
            .map_err(|e| format!("team domain {domain:?}: {}", e.message))?;
        let options = crate::forward::BackendOptions {
            max_connections: 4,
            ..Default::default()
        };
        let upstream =
            Upstream::new(&target, &options).map_err(|e| format!("team domain {domain:?}: {e}"))?;
        let issuer: Box<str> = domain.trim_end_matches('/').into();
        Ok(Self {
            team: team.into(),
            shared: Arc::new(Shared {
                validations: token::Validations::new(&issuer),
                issuer,
                settings,
                upstream,
                keys: ArcSwapOption::empty(),
                attempts: watch::Sender::new(0),
                last_attempt: AtomicU64::new(u64::MAX),
                fetching: AtomicBool::new(false),
                epoch: Instant::now(),
                wake: Notify::new(),
                started: AtomicBool::new(false),
                closed: AtomicBool::new(false),
                verified: VerifiedCache::default(),
                metrics: TeamMetrics::new(team, metrics),
            }),
            metrics: metrics.clone(),
        })
    }

    pub fn team(&self) -> &str {
        &self.team
    }

    /// Counts a request this team's requirement refused.
    pub(super) fn refused(&self, reason: AccessError) {
        self.metrics.refused(reason);
    }

    /// Starts the refresh task, once; without a tokio runtime it does nothing (a later call
    /// from one starts it).
    pub fn start(&self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.shared.started.swap(true, Ordering::AcqRel) {
            return;
        }
        let shared = self.shared.clone();
        let team = self.team.clone();
        runtime.spawn(refresh(shared, team));
    }

    /// Verifies `token` for a rule accepting `audiences`; what passes gives the user's address
    /// the token vouches for, as a header value (`None`: it names none, as a service token).
    pub(super) async fn verify(
        &self,
        token: &str,
        audiences: &[Box<str>],
    ) -> Result<Option<HeaderValue>, AccessError> {
        let shared = &self.shared;
        let digest = token::digest(token);
        let mut set = self.fresh_keys().await?;
        if let Some(verdict) = shared.verified.get(&digest, set.version, audiences) {
            return verdict;
        }
        let header = token::header(token)?;
        let mut keys = token::candidates(&set.keys, &header);
        if matches!(keys, Candidate::UnknownKid) {
            if let Some(newer) = self.refetch(true).await {
                set = newer;
                keys = token::candidates(&set.keys, &header);
            }
        }
        let claims = token::verify(token, &header, keys, &shared.validations)?;
        let verdict =
            token::audience_matches(&claims.aud, audiences).map(|()| claims.email_header());
        shared
            .verified
            .insert(digest, Verified::new(set.version, claims));
        verdict
    }

    /// The current keys while fresh; with none yet, those of the first fetch or of one asked
    /// for now (see [`TeamKeys::refetch`]).
    async fn fresh_keys(&self) -> Result<Arc<KeySet>, AccessError> {
        let shared = &self.shared;
        if let Some(set) = shared.keys.load_full() {
            return if set.fetched.elapsed() <= shared.settings.max_stale {
                Ok(set)
            } else {
                Err(AccessError::KeysUnavailable)
            };
        }
        self.start();
        let mut attempts = shared.attempts.subscribe();
        attempts.borrow_and_update();
        if let Some(set) = shared.keys.load_full() {
            return Ok(set);
        }
        if *shared.attempts.borrow() == 0 {
            // The first fetch is under way: wait for it.
            let _ = tokio::time::timeout(shared.settings.fetch_timeout, attempts.changed()).await;
            if let Some(set) = shared.keys.load_full() {
                return Ok(set);
            }
        }
        // Every fetch so far failed: ask for another, as an unknown key id does.
        self.refetch(false)
            .await
            .ok_or(AccessError::KeysUnavailable)
    }

    /// Waits for a fetch that ends after this call, up to `fetch_timeout`: the one under way,
    /// else one asked for now. Within `min_refetch` of the last one's start (so tokens naming
    /// made-up keys cannot make the proxy fetch without pause) it asks once that pause is over
    /// when `wait_out_pause` (a key id the set lacks: a key rotated in just after a fetch still
    /// passes), and gives up at once otherwise. `None`: no fetch ended in time.
    async fn refetch(&self, wait_out_pause: bool) -> Option<Arc<KeySet>> {
        let shared = &self.shared;
        let mut attempts = shared.attempts.subscribe();
        attempts.borrow_and_update();
        if !shared.fetching.load(Ordering::Acquire) {
            let last = shared.last_attempt.load(Ordering::Acquire);
            let since = shared.millis().saturating_sub(last);
            let min = u64::try_from(shared.settings.min_refetch.as_millis()).unwrap_or(u64::MAX);
            if last != u64::MAX && since < min {
                if !wait_out_pause {
                    return None;
                }
                tokio::time::sleep(Duration::from_millis(min - since)).await;
            }
            // Another request's fetch may have started or ended meanwhile: that one does.
            if !shared.fetching.load(Ordering::Acquire) && !attempts.has_changed().unwrap_or(true) {
                shared.wake.notify_one();
            }
        }
        tokio::time::timeout(shared.settings.fetch_timeout, attempts.changed())
            .await
            .ok()?
            .ok()?;
        shared.keys.load_full()
    }
}

impl Drop for TeamKeys {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::Release);
        self.shared.wake.notify_one();
        let team = self.team.to_string();
        // Another key set of the team, made for a newer table while this one's was still in
        // use, reports into the same series: they stay until it goes too.
        if let Ok(mut live) = self.metrics.live_teams.lock() {
            match live.get_mut(&team) {
                Some(count) if *count > 1 => {
                    *count -= 1;
                    return;
                }
                _ => {
                    live.remove(&team);
                }
            }
        }
        for outcome in [FETCH_OK, FETCH_ERROR] {
            self.metrics.key_fetches.remove(&TeamOutcomeLabels {
                team: team.clone(),
                outcome,
            });
        }
        self.metrics.keys_age.remove(&TeamLabels { team });
    }
}

impl Shared {
    fn millis(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX - 1)
    }
}

/// Fetches the team's keys now, then every `refresh` (sooner after a failure, and at once when
/// woken), until the [`TeamKeys`] is dropped.
async fn refresh(shared: Arc<Shared>, team: Box<str>) {
    let mut failures: u32 = 0;
    let mut version = 0u64;
    loop {
        if shared.closed.load(Ordering::Acquire) {
            return;
        }
        shared
            .last_attempt
            .store(shared.millis(), Ordering::Release);
        shared.fetching.store(true, Ordering::Release);
        let result = tokio::time::timeout(shared.settings.fetch_timeout, fetch(&shared)).await;
        let result = result.unwrap_or_else(|_| Err("timed out".to_owned()));
        match result {
            Ok((keys, raw)) => {
                let current = shared.keys.load_full();
                let same = current.as_ref().is_some_and(|c| c.raw == raw);
                if !same {
                    version += 1;
                    tracing::info!(team = %team, keys = keys.len(), "Access keys loaded");
                }
                if failures > 0 {
                    tracing::info!(team = %team, failures, "Access keys fetched again");
                }
                failures = 0;
                shared.metrics.fetched.inc();
                shared.metrics.age.set(0.0);
                shared.keys.store(Some(Arc::new(KeySet {
                    keys,
                    version: if same {
                        current.map_or(version, |c| c.version)
                    } else {
                        version
                    },
                    raw,
                    fetched: Instant::now(),
                })));
            }
            Err(error) => {
                failures = failures.saturating_add(1);
                let fetched = shared.keys.load().as_ref().map(|set| set.fetched);
                shared.metrics.failed.inc();
                shared
                    .metrics
                    .age
                    .set(fetched.unwrap_or(shared.epoch).elapsed().as_secs_f64());
                let fresh_until = fetched.map(|at| at + shared.settings.max_stale);
                // Logged on the first failure of a run and then at each doubling, so a long
                // outage does not flood the log.
                if failures.is_power_of_two() {
                    tracing::warn!(
                        team = %team,
                        error = %error,
                        failures,
                        serving_cached_keys = fresh_until.is_some_and(|t| t > Instant::now()),
                        "fetching Access keys failed"
                    );
                }
            }
        }
        shared.fetching.store(false, Ordering::Release);
        shared.attempts.send_modify(|n| *n += 1);
        let wait = if failures == 0 {
            shared.settings.refresh
        } else {
            FIRST_RETRY
                .saturating_mul(1 << failures.min(16).saturating_sub(1))
                .min(shared.settings.refresh)
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = shared.wake.notified() => {}
        }
    }
}

/// One fetch of the key set: its usable keys and the raw `keys` array.
async fn fetch(shared: &Shared) -> Result<(Vec<Key>, String), String> {
    let mut req = Request::new(empty_body());
    let path = format!("{}{CERTS_PATH}", shared.upstream.base_path().unwrap_or(""));
    *req.uri_mut() = http::Uri::try_from(path).map_err(|e| e.to_string())?;
    let host =
        HeaderValue::from_str(shared.upstream.authority().as_str()).map_err(|e| e.to_string())?;
    req.headers_mut().insert(header::HOST, host);
    req.headers_mut()
        .insert(header::ACCEPT, HeaderValue::from_static("application/json"));
    let (response, _) = shared
        .upstream
        .send(
            req,
            crate::forward::TryBounds::same(Some(shared.settings.fetch_timeout)),
            crate::forward::TryBody::Held(bytes::Bytes::new()),
        )
        .await
        .map_err(|e| e.to_string())?;
    if response.status() != StatusCode::OK {
        return Err(format!("{} answered {}", shared.issuer, response.status()));
    }
    let body = Limited::new(response.into_body(), MAX_JWKS_BYTES)
        .collect()
        .await
        .map_err(|e| format!("reading the key set: {e}"))?
        .to_bytes();
    parse(&body)
}

/// The usable keys of a JWKS document: RSA and P-256 keys for signatures, with an `alg` of
/// RS256 or ES256 when they name one. Keys of other kinds are skipped, not fatal, so a set
/// that also publishes them still serves.
pub(super) fn parse(body: &[u8]) -> Result<(Vec<Key>, String), String> {
    #[derive(serde::Deserialize)]
    struct Set {
        keys: Vec<serde_json::Value>,
    }
    let set: Set =
        serde_json::from_slice(body).map_err(|e| format!("the key set is not JWKS: {e}"))?;
    let raw = serde_json::to_string(&set.keys).unwrap_or_default();
    let keys: Vec<Key> = set
        .keys
        .into_iter()
        .filter_map(|value| serde_json::from_value::<Jwk>(value).ok())
        .filter_map(|jwk| usable(&jwk))
        .collect();
    if keys.is_empty() {
        return Err("the key set has no RS256 or ES256 signing key".to_owned());
    }
    Ok((keys, raw))
}

fn usable(jwk: &Jwk) -> Option<Key> {
    if matches!(&jwk.common.public_key_use, Some(u) if *u != PublicKeyUse::Signature) {
        return None;
    }
    let alg = match (&jwk.algorithm, jwk.common.key_algorithm) {
        (AlgorithmParameters::RSA(_), None | Some(KeyAlgorithm::RS256)) => Algorithm::RS256,
        (AlgorithmParameters::EllipticCurve(ec), None | Some(KeyAlgorithm::ES256))
            if ec.curve == EllipticCurve::P256 =>
        {
            Algorithm::ES256
        }
        _ => return None,
    };
    let key = DecodingKey::from_jwk(jwk).ok()?;
    Some(Key {
        kid: jwk.common.key_id.as_deref().map(Into::into),
        alg,
        key,
    })
}
