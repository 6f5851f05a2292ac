//! One team's signing keys: fetched from its JWKS endpoint by a background task, swapped in
//! whole, read by requests without a lock. Requests never fetch; the first request of a team
//! waits (bounded) for the task's first fetch, and one naming a key the set lacks asks for a
//! fetch that begins after it asked and waits (bounded) for it. A request refused because the
//! keys are missing or stale asks for a fetch without waiting. The task keeps the pause between
//! fetches asked for ([`AccessSettings::min_refetch`]), however many requests ask.

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
    /// Counts begun fetch attempts: one more than `attempts` while one is under way. Attempt
    /// `n` begins only after attempt `n - 1` ended, so a request that read `begun == n` knows
    /// attempt `n + 1` reads the endpoint after it looked.
    begun: AtomicU64,
    /// The highest attempt number a request asked for; the task starts one (after the pause)
    /// while this is ahead of `begun`.
    wanted: AtomicU64,
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
                begun: AtomicU64::new(0),
                wanted: AtomicU64::new(0),
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
            let names_kid =
                |s: &KeySet| matches!(token::candidates(&s.keys, &header), Candidate::Keys(_));
            if let Some(newer) = self.refetch(names_kid).await {
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

    /// The current keys while fresh; with none yet, those of the team's first fetch, waited
    /// for up to `fetch_timeout`. Once a fetch has failed with none ever fetched, or past
    /// `max_stale`, the request is refused at once rather than held for a fetch that likely
    /// fails the same way; it asks for one, so the endpoint's return is seen within the pause
    /// between fetches rather than at the next retry of a long backoff.
    async fn fresh_keys(&self) -> Result<Arc<KeySet>, AccessError> {
        let shared = &self.shared;
        if let Some(set) = shared.keys.load_full() {
            if set.fetched.elapsed() <= shared.settings.max_stale {
                return Ok(set);
            }
            shared.ask_for_news();
            return Err(AccessError::KeysUnavailable);
        }
        self.start();
        let mut attempts = shared.attempts.subscribe();
        let first = *attempts.borrow_and_update() == 0;
        if let Some(set) = shared.keys.load_full() {
            return Ok(set);
        }
        if first {
            // The first fetch is under way: wait for it.
            let _ = tokio::time::timeout(shared.settings.fetch_timeout, attempts.changed()).await;
            if let Some(set) = shared.keys.load_full() {
                return Ok(set);
            }
        }
        shared.ask_for_news();
        Err(AccessError::KeysUnavailable)
    }

    /// The keys once `usable` accepts them (they name the token's key id), or once a fetch
    /// that began after this call ended: one under way may have read the endpoint before the
    /// key was published. The current set is looked at first, since a fetch may have stored
    /// one since the caller read its own. Waits at most `min_refetch` (the pause the task
    /// keeps between fetches asked for, so tokens naming made-up keys cannot make the proxy
    /// fetch without pause) plus `fetch_timeout`. `None`: no such fetch ended in time.
    async fn refetch(&self, usable: impl Fn(&KeySet) -> bool) -> Option<Arc<KeySet>> {
        let shared = &self.shared;
        let mut attempts = shared.attempts.subscribe();
        let wanted = shared.begun.load(Ordering::Acquire) + 1;
        let current = shared.keys.load_full();
        if current.as_deref().is_some_and(&usable) {
            return current;
        }
        shared.ask(wanted);
        let bound = shared
            .settings
            .min_refetch
            .saturating_add(shared.settings.fetch_timeout);
        let answered = async {
            loop {
                let ended = *attempts.borrow_and_update() >= wanted;
                let set = shared.keys.load_full();
                if ended || set.as_deref().is_some_and(&usable) {
                    return set;
                }
                attempts.changed().await.ok()?;
            }
        };
        tokio::time::timeout(bound, answered).await.ok()?
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
    /// Asks the task for attempt `n` (or a later one) and wakes it; the task starts it once
    /// the pause since its last attempt is over.
    fn ask(&self, n: u64) {
        self.wanted.fetch_max(n, Ordering::AcqRel);
        self.wake.notify_one();
    }

    /// Asks for a fetch without waiting for it: the one under way, if any, else the next.
    fn ask_for_news(&self) {
        self.ask(*self.attempts.borrow() + 1);
    }
}

/// Fetches the team's keys now, then every `refresh` (sooner after a failure, and when a
/// request asks for a fetch, at most once per `min_refetch`), until the [`TeamKeys`] is
/// dropped.
async fn refresh(shared: Arc<Shared>, team: Box<str>) {
    let mut failures: u32 = 0;
    let mut version = 0u64;
    loop {
        if shared.closed.load(Ordering::Acquire) {
            return;
        }
        let began = Instant::now();
        shared.begun.fetch_add(1, Ordering::AcqRel);
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
        shared.attempts.send_modify(|n| *n += 1);
        let wait = if failures == 0 {
            shared.settings.refresh
        } else {
            FIRST_RETRY
                .saturating_mul(1 << failures.min(16).saturating_sub(1))
                .min(shared.settings.refresh)
        };
        let due = tokio::time::sleep(wait);
        tokio::pin!(due);
        // Until the next fetch is due, or a request asks for one this attempt cannot answer
        // (it began before the request asked). A wake-up with nothing asked for (a request
        // that asked while this attempt was under way) changes nothing.
        loop {
            tokio::select! {
                () = &mut due => break,
                () = shared.wake.notified() => {
                    if shared.closed.load(Ordering::Acquire) {
                        return;
                    }
                    if shared.wanted.load(Ordering::Acquire) > shared.begun.load(Ordering::Acquire) {
                        let pause = shared.settings.min_refetch.saturating_sub(began.elapsed());
                        tokio::select! {
                            () = &mut due => {}
                            () = tokio::time::sleep(pause) => {}
                        }
                        break;
                    }
                }
            }
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
