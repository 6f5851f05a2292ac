//! Each tunnel's ingress document, written through the Cloudflare API
//! (`PUT /accounts/{account}/cfd_tunnel/{tunnel}/configurations`).
//!
//! The proxy is the tunnel's connector and routes every request itself, so the document does
//! not route: it lists the hostnames the tunnel serves (what the dashboard shows as the
//! tunnel's public hostnames) and sends them to the proxy's own data port, which is where a
//! `cloudflared` beside the proxy would deliver them. Several data planes on one tunnel get one
//! document, the union of their hostnames.
//!
//! A document edited elsewhere (the dashboard's public hostnames, another tool writing the
//! tunnel's configuration) routes the edge by itself until the controller's own next changes.
//! So each tunnel's document is read back now and then ([`TunnelSync::reading_back`]), and
//! written again when it no longer carries what was written.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use aws_lc_rs::digest;
use bytes::Bytes;
use cftunnel_config::{check_account_tag, Config, ACCOUNT_TAG_RULE};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use serde_json::{json, Value};
use tokio::sync::{Notify, Semaphore};
use tokio::time::Instant;
use tracing::Instrument as _;
use uuid::Uuid;

use crate::alarm::Alarm;
use crate::held::Held;
use crate::in_flight::{Finished, InFlight};

/// The Cloudflare API's base URL.
pub const DEFAULT_API_BASE: &str = "https://api.cloudflare.com/client/v4";
/// Where the document sends a served hostname: the proxy's data port, next to the connector.
pub const ORIGIN: &str = "http://localhost:8080";
const MAX_ANSWER: usize = 1024 * 1024;

/// The ingress document of a tunnel served by the data planes with `configs`: one rule per
/// hostname (sorted, so the document is stable), then the catch-all the API requires: the
/// proxy when some route matches every host, else 404.
pub fn ingress_document(configs: &[&Config]) -> Value {
    Carried::of(configs).document()
}

/// What a tunnel's ingress document sends to the proxies: its hostnames, and whether every
/// other hostname goes to them too (a rule without hostnames), or is answered 404 at the edge.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Carried {
    hostnames: BTreeSet<String>,
    any_host: bool,
}

impl Carried {
    /// What the document of the planes serving `configs` carries.
    fn of(configs: &[&Config]) -> Self {
        let mut carried = Self::default();
        for config in configs {
            for rule in &config.rules {
                if rule.hostnames.is_empty() {
                    carried.any_host = true;
                }
                carried.hostnames.extend(rule.hostnames.iter().cloned());
            }
        }
        carried
    }

    /// What an ingress document as [`Carried::document`] writes it carries. A hostname is
    /// carried by a rule that sends all of it to the proxies: one edited elsewhere to another
    /// service, or to some paths only, is not. A `hostname` or `path` that is empty or `null`
    /// is absent, as `cloudflared` reads it (other tools and the API may hand rules back so).
    fn of_document(document: &Value) -> Self {
        let mut carried = Self::default();
        for entry in document["ingress"].as_array().into_iter().flatten() {
            let to_proxies = entry["service"] == ORIGIN && unset(entry.get("path"));
            let hostname = entry.get("hostname");
            if unset(hostname) {
                carried.any_host |= to_proxies;
            } else if let (Some(Value::String(hostname)), true) = (hostname, to_proxies) {
                carried.hostnames.insert(hostname.clone());
            }
        }
        carried
    }

    /// How `found`, read back from a tunnel, differs from `self`, what was written to it;
    /// `None` when it carries the same.
    fn drift(&self, found: &Self) -> Option<Drift> {
        let drift = Drift {
            missing: self
                .hostnames
                .difference(&found.hostnames)
                .cloned()
                .collect(),
            unexpected: found
                .hostnames
                .difference(&self.hostnames)
                .cloned()
                .collect(),
            catch_all: (self.any_host != found.any_host).then_some(found.any_host),
        };
        (drift != Drift::default()).then_some(drift)
    }

    /// Whether a rule with `hostnames` is sent to the proxies by this document.
    pub fn carries(&self, hostnames: &[String]) -> bool {
        if hostnames.is_empty() {
            return self.any_host;
        }
        self.any_host || hostnames.iter().all(|h| self.hostnames.contains(h))
    }

    /// The ingress document that carries this.
    fn document(&self) -> Value {
        let mut ingress: Vec<Value> = self
            .hostnames
            .iter()
            .map(|h| json!({"hostname": h, "service": ORIGIN}))
            .collect();
        ingress.push(json!({"service": if self.any_host { ORIGIN } else { "http_status:404" }}));
        json!({ "ingress": ingress })
    }
}

/// Whether an ingress rule's field is absent: missing, `null` or empty.
fn unset(field: Option<&Value>) -> bool {
    match field {
        None | Some(Value::Null) => true,
        Some(Value::String(s)) => s.is_empty(),
        Some(_) => false,
    }
}

/// How a tunnel's document, read back, differs from what the controller wrote to it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Drift {
    /// Hostnames written that it no longer sends to the proxies.
    missing: Vec<String>,
    /// Hostnames it sends to the proxies that were not written.
    unexpected: Vec<String>,
    /// When the catch-all changed: whether it now sends every other hostname to the proxies.
    catch_all: Option<bool>,
}

/// Hostnames named in a log line, at most this many of each kind.
const LOGGED_HOSTNAMES: usize = 10;

/// `hostnames` for a log line: the first [`LOGGED_HOSTNAMES`], and how many more.
fn listed(hostnames: &[String]) -> String {
    let mut out = hostnames
        .iter()
        .take(LOGGED_HOSTNAMES)
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(", ");
    if hostnames.len() > LOGGED_HOSTNAMES {
        out.push_str(&format!(" and {} more", hostnames.len() - LOGGED_HOSTNAMES));
    }
    out
}

/// A failed API call: why, and whether the API may have carried it out all the same (no
/// answer in time, the connection lost once the request was out, a 5xx), which matters for a
/// write: the tunnel then holds either its new document or the one before.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ApiError {
    message: String,
    maybe_applied: bool,
}

impl ApiError {
    /// A call the API did not carry out: refused, or never sent.
    fn refused(message: String) -> Self {
        Self {
            message,
            maybe_applied: false,
        }
    }

    /// A call whose outcome is not known.
    fn unsure(message: String) -> Self {
        Self {
            message,
            maybe_applied: true,
        }
    }
}

impl From<String> for ApiError {
    fn from(message: String) -> Self {
        Self::refused(message)
    }
}

impl From<ApiError> for String {
    fn from(e: ApiError) -> Self {
        e.message
    }
}

impl Carried {
    /// What both `self` and `other` carry: what a tunnel surely serves when it holds one of
    /// the two.
    fn both(&self, other: &Self) -> Self {
        Self {
            hostnames: self
                .hostnames
                .intersection(&other.hostnames)
                .cloned()
                .collect(),
            any_host: self.any_host && other.any_host,
        }
    }
}

/// Where and as whom a tunnel's document is written.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct TunnelTarget {
    pub account: String,
    pub tunnel: Uuid,
    /// The API token (`cloudflareCredentialsSecretRef`, or the controller's own).
    pub api_token: String,
    /// With the controller's own token, the tunnel secret the tenant's connector token holds:
    /// the tunnel's real token must hold the same before the controller writes for it, or a
    /// tenant could name any tunnel the controller's token reaches.
    pub verify_secret: Option<Vec<u8>>,
}

/// Counts of the calls made to the Cloudflare API, for `/metrics`: by call and by the HTTP
/// status answered (`unreachable` or `timeout` when there was no answer; `rate_limited` for
/// calls not sent while a 429's `Retry-After` runs). And of the tunnel documents read back
/// changed by someone else ([`TunnelSync::reading_back`]).
#[derive(Clone, Default)]
pub struct ApiCalls {
    requests: Family<CallLabels, Counter>,
    errors: Family<CallLabels, Counter>,
    drifts: Counter,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    call: &'static str,
    status: String,
}

impl ApiCalls {
    /// Registers the counters (`cloudflare_api_requests`, `cloudflare_api_errors`,
    /// `cloudflare_tunnel_document_drifts`).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "cloudflare_api_requests",
            "Calls sent to the Cloudflare API, by call and HTTP status (unreachable, timeout)",
            self.requests.clone(),
        );
        registry.register(
            "cloudflare_api_errors",
            "Cloudflare API calls that failed, by call and HTTP status (unreachable, timeout, \
             rate_limited: not sent while a 429 lasts)",
            self.errors.clone(),
        );
        registry.register(
            "cloudflare_tunnel_document_drifts",
            "Tunnel ingress documents read back from the Cloudflare API that no longer carry \
             what the controller wrote (edited in the dashboard or by another tool); each is \
             written again",
            self.drifts.clone(),
        );
    }

    fn count(&self, call: &'static str, status: &str, sent: bool, failed: bool) {
        let labels = CallLabels {
            call,
            status: status.to_owned(),
        };
        if sent {
            self.requests.get_or_create(&labels).inc();
        }
        if failed {
            self.errors.get_or_create(&labels).inc();
        }
    }
}

/// A Cloudflare API client for tunnel configurations.
#[derive(Clone)]
pub struct TunnelApi {
    base: String,
    client: Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>,
    timeout: Duration,
    calls: ApiCalls,
    /// Per API token (by digest): no calls before this, after the API answered 429, and the
    /// wait it asked for. The limit is the token's, whichever tunnel it writes.
    limited: std::sync::Arc<std::sync::Mutex<RateLimits>>,
    /// Spaces each token's calls, so the controller stays under the API's limit.
    pace: Pace,
}

/// See [`TunnelApi`]'s `limited`.
type RateLimits = HashMap<Vec<u8>, (tokio::time::Instant, Duration)>;

/// Spaces each API token's calls: a burst of `burst`, then one every `every` (the generic cell
/// rate algorithm). The API allows 1,200 calls per five minutes per user, whatever the token,
/// and the user's dashboard and other tools share them. A new leader writes every tunnel: with
/// hundreds, unpaced, it would spend the whole limit at once, and the 429 that follows stops
/// every call with the token, the operator's own too, for minutes.
#[derive(Clone)]
struct Pace {
    every: Duration,
    burst: u32,
    /// Per token (by digest): when its next call would go out with no burst left.
    next: std::sync::Arc<std::sync::Mutex<HashMap<Vec<u8>, tokio::time::Instant>>>,
}

/// Calls with one token, at most, once a burst is spent: 3 a second, three quarters of the
/// API's limit, the rest left to the user's other tools.
const PACE_EVERY: Duration = Duration::from_millis(334);
/// Calls with one token that go out at once before they are spaced.
const PACE_BURST: u32 = 60;

impl Pace {
    fn new(every: Duration, burst: u32) -> Self {
        Self {
            every,
            burst: burst.max(1),
            next: std::sync::Arc::default(),
        }
    }

    /// Takes a place for a call with `token` at `now`, or says how long until one is free.
    /// Nothing is held while a call waits: one dropped meanwhile (its write superseded or
    /// stopped) leaves no place taken.
    fn take(&self, token: &[u8], now: tokio::time::Instant) -> Result<(), Duration> {
        let Ok(mut next) = self.next.lock() else {
            return Ok(());
        };
        // A token whose next call is due is as one never used.
        next.retain(|_, at| *at > now);
        let due = next.get(token).copied().unwrap_or(now);
        let tolerance = self.every.saturating_mul(self.burst - 1);
        let start = due.checked_sub(tolerance).map_or(now, |s| s.max(now));
        if start > now {
            return Err(start - now);
        }
        next.insert(token.to_vec(), due + self.every);
        Ok(())
    }
}

/// How long to wait after a 429 that names no `Retry-After`.
const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(60);

/// The longest a 429 stops a token's calls: the API's limits run over five-minute windows, and
/// an answer naming more (a misbehaving proxy in between, a typo) must neither overflow the
/// clock nor stop every write with the token until the controller restarts.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(600);

impl TunnelApi {
    /// A client for the API at `base` (HTTPS, Mozilla's roots; plain HTTP only if `base` says
    /// so, for test doubles).
    ///
    /// # Errors
    /// The TLS configuration cannot be built.
    pub fn new(base: &str, timeout: Duration) -> Result<Self, String> {
        // An explicit provider: the process may have several compiled in, and then none is
        // the default.
        let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_webpki_roots(provider)
            .map_err(|e| format!("TLS for the Cloudflare API: {e}"))?
            .https_or_http()
            .enable_http1()
            .build();
        Ok(Self {
            base: base.trim_end_matches('/').to_owned(),
            client: Client::builder(hyper_util::rt::TokioExecutor::new()).build(https),
            timeout,
            calls: ApiCalls::default(),
            limited: std::sync::Arc::default(),
            pace: Pace::new(PACE_EVERY, PACE_BURST),
        })
    }

    /// Spaces each API token's calls `every` apart once `burst` have gone out at once.
    #[must_use]
    pub fn paced(mut self, every: Duration, burst: u32) -> Self {
        self.pace = Pace::new(every, burst);
        self
    }

    /// Counts this client's calls in `calls`.
    #[must_use]
    pub fn counted(mut self, calls: ApiCalls) -> Self {
        self.calls = calls;
        self
    }

    /// The URL of the target tunnel's `tail`:
    /// `{base}/accounts/{account}/cfd_tunnel/{tunnel}/{tail}`.
    ///
    /// # Errors
    /// The account is not an account tag. It is placed in the path as it is, and one that
    /// leaves its segment (a '/', a '?', a '#') would send the call, with the target's API
    /// token, for whatever tunnel it names instead.
    fn tunnel_uri(&self, target: &TunnelTarget, tail: &str) -> Result<String, String> {
        check_account_tag(&target.account).map_err(|_| {
            format!(
                "the account {:?} of tunnel {} is not an account tag ({ACCOUNT_TAG_RULE}): no Cloudflare API call is made with it",
                target.account, target.tunnel
            )
        })?;
        Ok(format!(
            "{}/accounts/{}/cfd_tunnel/{}/{tail}",
            self.base, target.account, target.tunnel
        ))
    }

    /// The tunnel's connector token, as the API hands it to the tunnel's owner
    /// (`GET .../cfd_tunnel/{tunnel}/token`).
    ///
    /// # Errors
    /// As [`TunnelApi::put_configuration`].
    pub async fn tunnel_token(&self, target: &TunnelTarget) -> Result<String, String> {
        let uri = self.tunnel_uri(target, "token")?;
        let envelope = self
            .call(
                "tunnel_token",
                hyper::Method::GET,
                "/accounts/{account_id}/cfd_tunnel/{tunnel_id}/token",
                &uri,
                target,
                Bytes::new(),
            )
            .await
            .map_err(String::from)?;
        envelope["result"]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| format!("GET {uri}: the answer holds no token"))
    }

    /// Writes `document` as the tunnel's configuration; returns the version the API assigned.
    ///
    /// # Errors
    /// The API could not be reached, refused the token, or answered without success; the
    /// message carries the API's own error text.
    pub async fn put_configuration(
        &self,
        target: &TunnelTarget,
        document: &Value,
    ) -> Result<i64, String> {
        self.put(target, document).await.map_err(String::from)
    }

    /// [`TunnelApi::put_configuration`], saying whether a failed write may have landed.
    async fn put(&self, target: &TunnelTarget, document: &Value) -> Result<i64, ApiError> {
        let uri = self.tunnel_uri(target, "configurations")?;
        let body = serde_json::to_vec(&json!({ "config": document }))
            .map_err(|e| format!("encoding the document: {e}"))?;
        let envelope = self
            .call(
                "put_configuration",
                hyper::Method::PUT,
                "/accounts/{account_id}/cfd_tunnel/{tunnel_id}/configurations",
                &uri,
                target,
                Bytes::from(body),
            )
            .await?;
        Ok(envelope["result"]["version"].as_i64().unwrap_or(0))
    }

    /// The tunnel's configuration as the API holds it (`GET .../configurations`): its ingress
    /// document, whoever wrote it last.
    ///
    /// # Errors
    /// As [`TunnelApi::put_configuration`]; and an answer that holds no configuration
    /// (`result.config` missing or `null`), which tells nothing of what the tunnel carries.
    pub async fn get_configuration(&self, target: &TunnelTarget) -> Result<Value, String> {
        let uri = self.tunnel_uri(target, "configurations")?;
        let envelope = self
            .call(
                "get_configuration",
                hyper::Method::GET,
                "/accounts/{account_id}/cfd_tunnel/{tunnel_id}/configurations",
                &uri,
                target,
                Bytes::new(),
            )
            .await
            .map_err(String::from)?;
        configuration_in(envelope)
            .ok_or_else(|| format!("GET {uri}: the answer holds no configuration"))
    }

    /// One API call (`route`: its path with the ids left as names), traced as a client span;
    /// the envelope of a successful answer, else the API's errors.
    async fn call(
        &self,
        name: &'static str,
        method: hyper::Method,
        route: &'static str,
        uri: &str,
        target: &TunnelTarget,
        body: Bytes,
    ) -> Result<Value, ApiError> {
        let span = tracing::info_span!(
            "cloudflare.api",
            otel.name = %format_args!("{method} {route}"),
            otel.kind = "client",
            otel.status_code = tracing::field::Empty,
            otel.status_description = tracing::field::Empty,
            http.request.method = %method,
            url.full = uri,
            url.template = route,
            cloudflare.tunnel_id = %target.tunnel,
            http.response.status_code = tracing::field::Empty,
        );
        let result = self
            .exchange(name, method, uri, target, body, &span)
            .instrument(span.clone())
            .await;
        if let Err(reason) = &result {
            span.record("otel.status_code", "error");
            span.record("otel.status_description", reason.message.as_str());
        }
        result
    }

    /// The 429 the token `token_key` waits out: when its wait ends, and how long it is.
    fn waiting(&self, token_key: &[u8]) -> Option<(Instant, Duration)> {
        let now = Instant::now();
        self.limited
            .lock()
            .ok()
            .and_then(|l| l.get(token_key).copied())
            .filter(|(until, _)| *until > now)
    }

    /// When the 429 `api_token` waits out ends; `None` while it waits for none.
    fn held_off_until(&self, api_token: &str) -> Option<Instant> {
        let token_key = digest::digest(&digest::SHA256, api_token.as_bytes());
        self.waiting(token_key.as_ref()).map(|(until, _)| until)
    }

    /// The error a call with the token `token_key` fails with while a 429's wait runs.
    fn rate_limited(&self, name: &'static str, token_key: &[u8]) -> Result<(), String> {
        let Some((_, wait)) = self.waiting(token_key) else {
            return Ok(());
        };
        self.calls.count(name, "rate_limited", false, true);
        // The same text for the whole wait: it reaches route conditions, and a countdown would
        // rewrite them every round.
        Err(format!(
            "the Cloudflare API answered 429 (its rate limit): no call with this token for {}s",
            wait.as_secs()
        ))
    }

    async fn exchange(
        &self,
        name: &'static str,
        method: hyper::Method,
        uri: &str,
        target: &TunnelTarget,
        body: Bytes,
        span: &tracing::Span,
    ) -> Result<Value, ApiError> {
        let token_key = digest::digest(&digest::SHA256, target.api_token.as_bytes())
            .as_ref()
            .to_vec();
        // Before the call waits its turn, and again once it may go: a 429 may have come
        // meanwhile.
        self.rate_limited(name, &token_key)?;
        // Calls run in tasks of their own (see `TunnelSync`): a paced one holds up no round.
        while let Err(wait) = self.pace.take(&token_key, tokio::time::Instant::now()) {
            tokio::time::sleep(wait).await;
            self.rate_limited(name, &token_key)?;
        }
        let req = hyper::Request::builder()
            .method(method.clone())
            .uri(uri)
            .header(
                hyper::header::AUTHORIZATION,
                format!("Bearer {}", target.api_token),
            )
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(body))
            .map_err(|e| format!("building the request: {e}"))?;
        let exchange = async {
            let res = self.client.request(req).await.map_err(|e| {
                let message = format!("{method} {uri}: {e}");
                // Not connected: nothing was sent.
                if e.is_connect() {
                    ApiError::refused(message)
                } else {
                    ApiError::unsure(message)
                }
            })?;
            let status = res.status();
            span.record("http.response.status_code", i64::from(status.as_u16()));
            if status == hyper::StatusCode::TOO_MANY_REQUESTS {
                let wait = res
                    .headers()
                    .get(hyper::header::RETRY_AFTER)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .map_or(DEFAULT_RETRY_AFTER, |s| {
                        Duration::from_secs(s).min(MAX_RETRY_AFTER)
                    });
                if let Ok(mut limited) = self.limited.lock() {
                    let now = tokio::time::Instant::now();
                    // Waits over are forgotten, so rotated tokens leave nothing behind.
                    limited.retain(|_, (until, _)| *until > now);
                    limited.insert(token_key.clone(), (now + wait, wait));
                }
            }
            let body = Limited::new(res.into_body(), MAX_ANSWER)
                .collect()
                .await
                .map_err(|e| ApiError::unsure(format!("{method} {uri}: reading the answer: {e}")))?
                .to_bytes();
            Ok::<_, ApiError>((status, body))
        };
        let (status, body) = match tokio::time::timeout(self.timeout, exchange).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(e)) => {
                self.calls.count(name, "unreachable", true, true);
                return Err(e);
            }
            Err(_) => {
                self.calls.count(name, "timeout", true, true);
                return Err(ApiError::unsure(format!(
                    "{method} {uri}: no answer within {:?}",
                    self.timeout
                )));
            }
        };
        // The API's own failure may come after it carried the call out.
        let failed = |message: String| {
            if status.is_server_error() {
                ApiError::unsure(message)
            } else {
                ApiError::refused(message)
            }
        };
        let envelope = serde_json::from_slice::<Value>(&body).ok();
        let succeeded = status.is_success()
            && envelope
                .as_ref()
                .is_some_and(|e| e["success"] == Value::Bool(true));
        self.calls.count(name, status.as_str(), true, !succeeded);
        let envelope = envelope.ok_or_else(|| {
            failed(format!(
                "the Cloudflare API answered {status} without a JSON body"
            ))
        })?;
        if succeeded {
            return Ok(envelope);
        }
        let errors: Vec<String> = envelope["errors"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|e| format!("{} ({})", e["message"].as_str().unwrap_or("?"), e["code"]))
            .collect();
        Err(failed(format!(
            "the Cloudflare API refused {method} for tunnel {} ({status}): {}",
            target.tunnel,
            if errors.is_empty() {
                "no error given".to_owned()
            } else {
                errors.join("; ")
            }
        )))
    }
}

/// The configuration a successful answer of `GET .../configurations` holds
/// (`result.config`); `None` when it holds none, whatever the shape around it.
fn configuration_in(mut envelope: Value) -> Option<Value> {
    envelope
        .pointer_mut("/result/config")
        .map(Value::take)
        .filter(|config| !config.is_null())
}

/// What identifies a write: the document, and whom it is written as.
fn sync_digest(target: &TunnelTarget, document: &Value) -> Vec<u8> {
    let mut ctx = digest::Context::new(&digest::SHA256);
    for part in [
        document.to_string().as_str(),
        &target.account,
        &target.api_token,
    ] {
        ctx.update(&(part.len() as u64).to_be_bytes());
        ctx.update(part.as_bytes());
    }
    ctx.finish().as_ref().to_vec()
}

/// Verifies the tenant's claim on the tunnel when asked to (unless `verified` already holds
/// the claimed secret's digest), then writes. Returns the digest of a secret newly verified.
async fn write(
    api: &TunnelApi,
    target: &TunnelTarget,
    document: &Value,
    verified: Option<&[u8]>,
) -> Result<Option<Vec<u8>>, ApiError> {
    let mut newly_verified = None;
    if let Some(secret) = &target.verify_secret {
        let claimed = digest::digest(&digest::SHA256, secret).as_ref().to_vec();
        if verified != Some(claimed.as_slice()) {
            let real = api.tunnel_token(target).await?;
            let real = real.parse::<cftunnel_config::Token>().map_err(|e| {
                format!(
                    "the Cloudflare API's token for tunnel {}: {e}",
                    target.tunnel
                )
            })?;
            if real.tunnel_secret() != secret.as_slice() {
                return Err(ApiError::refused(format!(
                    "the connector token does not hold tunnel {}'s secret; its configuration is not written with the controller's API token",
                    target.tunnel
                )));
            }
            newly_verified = Some(claimed);
        }
    }
    api.put(target, document).await?;
    Ok(newly_verified)
}

/// Writes each tunnel's document when it changes, and again after a failure: at once when the
/// document or the writer's credentials change, else after a wait that doubles with each
/// failure in a row. Rounds come with every change in the cluster, and a write that fails at
/// each (a tunnel deleted in the dashboard) would spend the API token's rate limit, which the
/// other tunnels it writes share.
///
/// Each write runs as a task of its own ([`InFlight`]), and a call waits for the writes it
/// starts at most as long as it is told ([`TunnelSync::waiting_at_most`]): an API that never
/// answers (egress to it blackholed) holds up no round, and so no push, for its timeout.
/// Reads back ([`TunnelSync::reading_back`]) run the same way.
pub struct TunnelSync {
    /// Per tunnel and writer (account, token, claimed secret): the last document written. A
    /// second writer naming the same tunnel (a forged or stale token) cannot erase the first's.
    written: HashMap<WriterKey, Vec<u8>>,
    /// Per tunnel and writer (account, token, claimed secret): the secret (by digest) the
    /// tunnel's real token was seen to hold, read with that account and token. A check made
    /// for one writer lets no other skip its own: another account or token may reach another
    /// tunnel of the same id, or none.
    verified: HashMap<WriterKey, Vec<u8>>,
    /// Per tunnel, what its document carries as far as this process knows: what the last
    /// document written to it carries, or what a read back found there since.
    landed: HashMap<Uuid, Carried>,
    /// Per tunnel and writer: the write that failed last, answered from here until its wait
    /// is over.
    failed: Held<WriterKey>,
    /// The writes running.
    writes: InFlight<WriterKey, Wrote>,
    /// How long a call waits for the writes it starts; `None`: until they finish.
    wait: Option<Duration>,
    /// When each tunnel's document is next read back; `None`: never
    /// ([`TunnelSync::reading_back`]).
    read_back: Option<ReadBackClock>,
    /// The reads back outstanding (waiting for a place, or reading), by tunnel. Each is
    /// tracked under its own number ([`TunnelSync::reads_started`]) rather than a digest, so
    /// that an end it told ([`TunnelSync::reads_ended`]) is known for its own. The tracker's
    /// wake is its own: a read tells the caller's wake only when it finds a drift.
    read_backs: InFlight<Uuid, ReadBack>,
    /// Reads back started so far: the last one's number.
    reads_started: u64,
    /// The reads back that have ended, by tunnel and number, told before their ends wake
    /// anyone: a task that has told the wake may not have finished yet, and the call it
    /// brings waits for it ([`TunnelSync::sync_all`]) rather than miss what it found.
    reads_ended: Arc<std::sync::Mutex<Vec<(Uuid, u64)>>>,
    /// The places of the reads back that call the API at once ([`CONCURRENT_READ_BACKS`]).
    read_places: Arc<Semaphore>,
    /// Held by every read back outstanding ([`ReadBatch`]), and by a call while it starts
    /// them; dangling when none is.
    read_batch: Weak<ReadBatch>,
    /// The wake calls are told of ([`TunnelSync::waiting_at_most`]).
    wake: Option<Arc<Notify>>,
    /// Tells the wake as the next read back falls due.
    alarm: Option<Alarm>,
}

/// A tunnel's document read back, as the task that read it leaves it.
struct ReadBack {
    /// Who wrote the document it was compared with, and that document's digest.
    writer: WriterKey,
    digest: Vec<u8>,
    /// What the tunnel carries now, and how that differs from what was written; or why it
    /// could not be read.
    found: Result<(Carried, Option<Drift>), String>,
}

/// Tunnel documents read from the API at once: a check that can wait, and each read spends
/// the API token's rate limit, which writes share.
const CONCURRENT_READ_BACKS: usize = 2;

/// Reads back outstanding at most, most of them waiting for one of the
/// [`CONCURRENT_READ_BACKS`] places: a new leader writes every tunnel within seconds, so all
/// fall due together, and thousands of tunnels would otherwise be as many tasks at once.
const OUTSTANDING_READ_BACKS: usize = 64;

/// After reads back in a row that found the document changed, the wait before the next is
/// the period doubled for each, up to this many periods (an hour at the default period).
const MAX_READ_BACK_PERIODS: u32 = 12;

/// Steps of a tunnel's share of the period ([`jitter`]).
const JITTER_STEPS: u32 = 1000;

/// Held by every read back outstanding, one for all of them, and by a call while it starts
/// them: the last to let go tells the wake when due reads were left for lack of room
/// meanwhile, so the call it brings starts them. One wake for a batch of reads, where one per
/// read would run a round for each.
struct ReadBatch {
    wake: Option<Arc<Notify>>,
    /// Due reads were left unstarted.
    left: AtomicBool,
}

impl Drop for ReadBatch {
    fn drop(&mut self) {
        if *self.left.get_mut() {
            if let Some(wake) = &self.wake {
                wake.notify_one();
            }
        }
    }
}

/// When each tunnel's document is next read back. No clock here: the caller says when it is.
///
/// A tunnel falls due a wait after its document was last written or a read of it started: the
/// period, doubled for each read back in a row that found the document changed ([`backoff`]),
/// plus a share of the period of its own ([`jitter`]). Something else that keeps writing the
/// tunnel (another tool, another cluster) would otherwise have its document and the
/// controller's replace each other every period; and tunnels written together would be read
/// together, every period.
#[derive(Debug)]
struct ReadBackClock {
    period: Duration,
    /// Per tunnel: when its document was last written, or a read back of it started.
    last: HashMap<Uuid, Instant>,
    /// Per tunnel: the reads back in a row that found its document changed, and the digest of
    /// the controller's document they found changed.
    drifts: HashMap<Uuid, (u32, Vec<u8>)>,
}

impl ReadBackClock {
    fn new(period: Duration) -> Self {
        Self {
            period,
            last: HashMap::new(),
            drifts: HashMap::new(),
        }
    }

    /// A read back of the tunnel's document started at `now`.
    fn reset(&mut self, tunnel: Uuid, now: Instant) {
        self.last.insert(tunnel, now);
    }

    /// The controller's document `digest` landed on the tunnel at `now`. Another document
    /// than the one found changed before starts the count of drifts again.
    fn wrote(&mut self, tunnel: Uuid, digest: &[u8], now: Instant) {
        self.last.insert(tunnel, now);
        if self.drifts.get(&tunnel).is_some_and(|(_, d)| d != digest) {
            self.drifts.remove(&tunnel);
        }
    }

    /// A read back found the document as written.
    fn held(&mut self, tunnel: &Uuid) {
        self.drifts.remove(tunnel);
    }

    /// A read back found the document `digest` changed; returns how many reads in a row did.
    fn drifted(&mut self, tunnel: Uuid, digest: &[u8]) -> u32 {
        let count = match self.drifts.get(&tunnel) {
            Some((count, d)) if d == digest => count.saturating_add(1),
            _ => 1,
        };
        self.drifts.insert(tunnel, (count, digest.to_vec()));
        count
    }

    /// How long after its last write, or read started, the tunnel falls due.
    fn wait(&self, tunnel: &Uuid) -> Duration {
        let drifts = self.drifts.get(tunnel).map_or(0, |(count, _)| *count);
        backoff(self.period, drifts).saturating_add(jitter(self.period, tunnel))
    }

    /// Whether the tunnel's document is due to be read back at `now`: one this clock has not
    /// seen written nor read is.
    fn due(&self, tunnel: &Uuid, now: Instant) -> bool {
        self.last
            .get(tunnel)
            .is_none_or(|at| now.saturating_duration_since(*at) >= self.wait(tunnel))
    }

    /// When the tunnel's document falls due, if this clock has seen it (and the instant can
    /// be told).
    fn next(&self, tunnel: &Uuid) -> Option<Instant> {
        self.last.get(tunnel)?.checked_add(self.wait(tunnel))
    }

    /// When the tunnel's document falls due if the read back of it running finds it as
    /// written: a period and its share after that read started, however many reads before
    /// found it changed ([`ReadBackClock::held`]).
    fn next_if_held(&self, tunnel: &Uuid) -> Option<Instant> {
        let wait = self.period.saturating_add(jitter(self.period, tunnel));
        self.last.get(tunnel)?.checked_add(wait)
    }

    /// Forgets the tunnels `keep` does not keep.
    fn retain(&mut self, keep: impl Fn(&Uuid) -> bool) {
        self.last.retain(|t, _| keep(t));
        self.drifts.retain(|t, _| keep(t));
    }
}

/// The wait before a read back after `drifts` reads in a row found the document changed:
/// `period` doubled for each, at most [`MAX_READ_BACK_PERIODS`] periods.
fn backoff(period: Duration, drifts: u32) -> Duration {
    let periods = 1u32
        .checked_shl(drifts)
        .unwrap_or(u32::MAX)
        .min(MAX_READ_BACK_PERIODS);
    period.saturating_mul(periods)
}

/// How late a tunnel's reads back come: a share of a tenth of `period`, the same for the
/// tunnel every time, spread over tunnels by their ids.
fn jitter(period: Duration, tunnel: &Uuid) -> Duration {
    // Hashed with fixed keys: the same share on every call and in every process, and
    // neighbouring ids spread as well as random ones.
    use std::hash::{BuildHasher as _, BuildHasherDefault, DefaultHasher};
    let h = BuildHasherDefault::<DefaultHasher>::default().hash_one(tunnel);
    let share = u32::try_from(h % u64::from(JITTER_STEPS)).unwrap_or(0);
    (period / 10 / JITTER_STEPS).saturating_mul(share)
}

/// A tunnel and who writes its document (a digest of account, API token and claimed secret).
type WriterKey = (Uuid, Vec<u8>);

/// What a write returns: the secret it verified the tunnel's token holds, if it did, and the
/// document it wrote; or why it failed, with the document when it may have landed all the same.
type Wrote = Result<(Option<Vec<u8>>, Value), (String, Option<Value>)>;

/// What became of a tunnel's document in a call that did not fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Synced {
    /// Written by this call.
    Wrote,
    /// Written before, and unchanged since.
    Held,
    /// Not written yet: a write of it, or one before it, is still running or waits for a
    /// place. The tunnel holds what the last write left.
    Behind,
}

/// The wait before a failed write is tried again, doubled with each failure in a row.
pub const RETRY_FIRST: Duration = Duration::from_secs(5);
/// The longest wait before a failed write is tried again.
pub const RETRY_MAX: Duration = Duration::from_secs(300);

impl Default for TunnelSync {
    fn default() -> Self {
        Self::with_retry(RETRY_FIRST, RETRY_MAX)
    }
}

/// Tunnel writes in flight at once: a new leader writes every tunnel, and the API rate-limits.
const CONCURRENT_WRITES: usize = 8;

/// Who writes a tunnel's document, as a key.
fn writer_key(target: &TunnelTarget) -> WriterKey {
    let mut ctx = digest::Context::new(&digest::SHA256);
    for part in [
        target.account.as_bytes(),
        target.api_token.as_bytes(),
        target.verify_secret.as_deref().unwrap_or_default(),
    ] {
        ctx.update(&(part.len() as u64).to_be_bytes());
        ctx.update(part);
    }
    (target.tunnel, ctx.finish().as_ref().to_vec())
}

impl TunnelSync {
    /// Tries a failed write again after `first`, doubling up to `max`. Calls wait for their
    /// writes to finish (see [`TunnelSync::waiting_at_most`]).
    pub fn with_retry(first: Duration, max: Duration) -> Self {
        Self {
            written: HashMap::new(),
            verified: HashMap::new(),
            landed: HashMap::new(),
            failed: Held::new(first, max),
            writes: InFlight::new(CONCURRENT_WRITES, Arc::new(Notify::new())),
            wait: None,
            read_back: None,
            read_backs: InFlight::new(OUTSTANDING_READ_BACKS, Arc::new(Notify::new())),
            reads_started: 0,
            reads_ended: Arc::default(),
            read_places: Arc::new(Semaphore::new(CONCURRENT_READ_BACKS)),
            read_batch: Weak::new(),
            wake: None,
            alarm: None,
        }
    }

    /// A call waits at most `wait` for the writes it starts; `wake` is told as each finishes,
    /// so a later call reports it, and as a failed write's wait ends, so a later call tries it
    /// again then.
    #[must_use]
    pub fn waiting_at_most(self, wait: Duration, wake: Arc<Notify>) -> Self {
        Self {
            failed: self.failed.waking(Arc::clone(&wake)),
            writes: InFlight::new(CONCURRENT_WRITES, Arc::clone(&wake)),
            wake: Some(wake),
            wait: Some(wait),
            ..self
        }
    }

    /// Reads each tunnel's document back at most once every `period` after it was written
    /// (plus up to a tenth of it, the same for each tunnel, so that tunnels written together
    /// are not read together), in the background, through the caller's (paced) client; a call
    /// waits for none. A call starts every read due (up to 64 outstanding), and they call the
    /// API two at a time. One that finds the document no longer carrying what was written
    /// (edited in the dashboard, written by another tool) wakes the caller
    /// ([`TunnelSync::waiting_at_most`]), and the next call logs it, counts it
    /// (`cloudflare_tunnel_document_drifts`) and writes the document again; a read that finds
    /// nothing wakes nobody. The next read falling due wakes the caller (one timer), and so
    /// does the end of the last read outstanding when due ones were left for lack of room.
    /// A read that fails is tried at the next period: it reaches no call's results.
    ///
    /// After a read that found the document changed, the next waits twice as long, doubling
    /// with each such read in a row up to 12 periods: something else that keeps writing the
    /// tunnel would otherwise have its document and the controller's replace each other every
    /// period. A read that finds the document as written starts again from one period (the
    /// next read comes a period after it started), and so does another document written by the
    /// controller.
    ///
    /// Only tunnels with one writer in a call are read: two writers of one tunnel would each
    /// find the other's document and write theirs again at every period.
    #[must_use]
    pub fn reading_back(mut self, period: Duration) -> Self {
        self.read_back = Some(ReadBackClock::new(period));
        self
    }

    /// Brings the tunnel of `target` to `document`; `Ok(true)` when it wrote. A new API token
    /// writes again, so a rotated credential is proven at once rather than at the next change.
    /// As [`TunnelSync::sync_all`] with this one tunnel.
    ///
    /// # Errors
    /// As [`TunnelApi::put_configuration`]; the next call tries again.
    pub async fn sync(
        &mut self,
        api: &TunnelApi,
        target: &TunnelTarget,
        document: &Value,
    ) -> Result<bool, String> {
        let mut results = self
            .sync_all(api, vec![(target.clone(), document.clone())])
            .await;
        results
            .pop()
            .unwrap_or(Ok(Synced::Behind))
            .map(|synced| synced == Synced::Wrote)
    }

    /// Whether read back number `n` of `tunnel` is the one still outstanding for it.
    fn reading(&self, &(tunnel, n): &(Uuid, u64)) -> bool {
        self.read_backs.running(&tunnel) == Some(&n.to_be_bytes()[..])
    }

    /// [`TunnelSync::sync`] for several tunnels at once: an API call that hangs for one tunnel
    /// does not hold up the others. A write still running when the call stops waiting goes on;
    /// meanwhile its tunnel answers with the writer's last failure, if its last write failed,
    /// and `Ok(false)` if not, and the first call after it finishes reports it.
    ///
    /// Writes to one tunnel go out one at a time, whoever writes them: a document that changes
    /// while a write to its tunnel runs waits for that write to end (answered, failed or timed
    /// out), and the call after it writes the newest document. Stopping a write would not
    /// stop a request already sent, which the API could apply after the newer one, leaving
    /// the tunnel with the older document while its routes said it was written. A call bounded
    /// by [`TunnelSync::waiting_at_most`] waits for no write it did not start: one that hangs
    /// holds up no round, and the wake its end gives brings the next.
    pub async fn sync_all(
        &mut self,
        api: &TunnelApi,
        work: Vec<(TunnelTarget, Value)>,
    ) -> Vec<Result<Synced, String>> {
        let deadline = self.wait.map(|wait| Instant::now() + wait);
        let done = self.writes.finished();
        let mut wrote = self.settle(done);
        // Reads that have ended are waited for (their tasks are returning), so that a call
        // their wake brings takes in what they found.
        let ended: Vec<(Uuid, u64)> = self
            .reads_ended
            .lock()
            .map(|mut ended| std::mem::take(&mut *ended))
            .unwrap_or_default()
            .into_iter()
            .filter(|read| self.reading(read))
            .collect();
        let tunnels: Vec<Uuid> = ended.iter().map(|(tunnel, _)| *tunnel).collect();
        let read = self.read_backs.finished_by(&tunnels, deadline).await;
        self.settle_read_backs(&api.calls, read);
        // Those the deadline cut short stay listed for the next call.
        let unread: Vec<(Uuid, u64)> = ended
            .into_iter()
            .filter(|read| self.reading(read))
            .collect();
        if !unread.is_empty() {
            if let Ok(mut listed) = self.reads_ended.lock() {
                listed.extend(unread);
            }
        }
        let asked: Vec<(TunnelTarget, Value, WriterKey, Vec<u8>)> = work
            .into_iter()
            .map(|(target, document)| {
                let digest = sync_digest(&target, &document);
                let key = writer_key(&target);
                (target, document, key, digest)
            })
            .collect();
        // A writer's own record may say its document is written while another writer's has
        // replaced it since (a GatewayConfig's API token, then the class's again): where one
        // document is asked for its tunnel, it goes out again. Two writers of one tunnel in one
        // call are not made to take turns: each keeps to its own record.
        let mut per_tunnel: HashMap<Uuid, usize> = HashMap::new();
        for (target, ..) in &asked {
            *per_tunnel.entry(target.tunnel).or_default() += 1;
        }
        let replaced: Vec<bool> = asked
            .iter()
            .map(|(target, document, ..)| {
                per_tunnel.get(&target.tunnel) == Some(&1)
                    && self
                        .landed
                        .get(&target.tunnel)
                        .is_some_and(|landed| *landed != Carried::of_document(document))
            })
            .collect();
        // Each document is sent at most once a call.
        let mut sent = vec![false; asked.len()];
        loop {
            let mut started = Vec::new();
            let mut behind = HashSet::new();
            for (((target, document, key, digest), sent), replaced) in
                asked.iter().zip(&mut sent).zip(&replaced)
            {
                if *sent {
                    continue;
                }
                // The same error, word for word, until the wait is over: it reaches route
                // conditions, which would otherwise be rewritten.
                let due = (self.written.get(key) != Some(digest) || *replaced)
                    && self.failed.error(key, digest).is_none()
                    && self.writes.running(key) != Some(digest.as_slice());
                if !due {
                    continue;
                }
                if self.writes.running_keys().any(|(t, _)| *t == target.tunnel) {
                    behind.insert(target.tunnel);
                    continue;
                }
                if self.writes.is_full() {
                    continue;
                }
                let api = api.clone();
                let target = target.clone();
                let document = document.clone();
                let verified = self.verified.get(key).cloned();
                // Its calls stay in the caller's trace, however long they outlive the call.
                let write = async move {
                    match write(&api, &target, &document, verified.as_deref()).await {
                        Ok(verified) => Ok((verified, document)),
                        Err(e) if e.maybe_applied => Err((e.message, Some(document))),
                        Err(e) => Err((e.message, None)),
                    }
                }
                .instrument(tracing::Span::current());
                // What a read running finds may predate this write.
                self.read_backs.abort(&key.0);
                self.writes.start(key.clone(), digest.clone(), write);
                started.push(key.clone());
                *sent = true;
            }
            let mut waited = started;
            if deadline.is_none() {
                waited.extend(
                    self.writes
                        .running_keys()
                        .filter(|(t, _)| behind.contains(t))
                        .cloned(),
                );
            }
            if waited.is_empty() {
                break;
            }
            let done = self.writes.finished_by(&waited, deadline).await;
            wrote.extend(self.settle(done));
            // A document behind a write that ended meanwhile goes out now.
            if behind.is_empty() || deadline.is_some_and(|d| Instant::now() >= d) {
                break;
            }
        }
        self.start_read_backs(api, &asked, &per_tunnel);
        asked
            .into_iter()
            .map(|(_, _, key, digest)| {
                if let Some(error) = self.failed.error(&key, &digest) {
                    Err(error.to_owned())
                } else if self.written.get(&key) == Some(&digest) {
                    Ok(if wrote.contains(&(key, digest)) {
                        Synced::Wrote
                    } else {
                        Synced::Held
                    })
                } else {
                    // Running, or waiting for a place: what the tunnel holds is still what
                    // the last write left.
                    self.failed
                        .last_error(&key)
                        .map_or(Ok(Synced::Behind), |e| Err(e.to_owned()))
                }
            })
            .collect()
    }

    /// Takes in finished writes; returns those that wrote.
    fn settle(&mut self, done: Vec<Finished<WriterKey, Wrote>>) -> HashSet<(WriterKey, Vec<u8>)> {
        let mut wrote = HashSet::new();
        for (key, digest, outcome) in done {
            let outcome =
                outcome.unwrap_or_else(|| Err(("the write failed unexpectedly".to_owned(), None)));
            match outcome {
                Ok((verified, document)) => {
                    self.failed.succeeded(&key);
                    if let Some(v) = verified {
                        self.verified.insert(key.clone(), v);
                    }
                    self.landed.insert(key.0, Carried::of_document(&document));
                    if let Some(clock) = &mut self.read_back {
                        clock.wrote(key.0, &digest, Instant::now());
                    }
                    self.written.insert(key.clone(), digest.clone());
                    wrote.insert((key, digest));
                }
                Err((error, maybe_landed)) => {
                    // The tunnel holds this document or the one before: it surely serves only
                    // what both carry, until a write is answered.
                    if let (Some(document), Some(landed)) =
                        (maybe_landed, self.landed.get_mut(&key.0))
                    {
                        *landed = landed.both(&Carried::of_document(&document));
                    }
                    self.written.remove(&key);
                    self.failed.failed(key, digest, error);
                }
            }
        }
        wrote
    }

    /// Starts reading back the documents of `asked` due, as many as there is room for, and
    /// sets the alarm for the next to fall due. `asked` as in [`TunnelSync::sync_all`],
    /// `per_tunnel` the writers it names for each tunnel.
    fn start_read_backs(
        &mut self,
        api: &TunnelApi,
        asked: &[(TunnelTarget, Value, WriterKey, Vec<u8>)],
        per_tunnel: &HashMap<Uuid, usize>,
    ) {
        let Some(clock) = &mut self.read_back else {
            return;
        };
        let now = Instant::now();
        let mut next: Option<Instant> = None;
        let mut left = false;
        // Held until the loop ends: reads it starts may all end before then, and the last
        // holder must see whether due ones were left.
        let batch = self.read_batch.upgrade().unwrap_or_else(|| {
            let batch = Arc::new(ReadBatch {
                wake: self.wake.clone(),
                left: AtomicBool::new(false),
            });
            self.read_batch = Arc::downgrade(&batch);
            batch
        });
        for (target, document, key, digest) in asked {
            // A document not written yet, or being written, is not read: the write's end
            // brings the next call.
            let readable = per_tunnel.get(&target.tunnel) == Some(&1)
                && self.written.get(key) == Some(digest)
                && !self.writes.running_keys().any(|(t, _)| *t == target.tunnel);
            if !readable {
                continue;
            }
            // The timer is for the next read of each, one running included: its end, finding
            // the document as written, wakes nobody, and the next read comes a period after it
            // started, whatever drifts came before. One that finds a drift wakes the caller
            // itself; after one that fails, the call the timer brings sets it again.
            let mut fall_due = |at: Option<Instant>| {
                if let Some(at) = at.filter(|at| *at > now) {
                    next = Some(next.map_or(at, |n| n.min(at)));
                }
            };
            if self.read_backs.running(&target.tunnel).is_some() {
                fall_due(clock.next_if_held(&target.tunnel));
                continue;
            }
            if !clock.due(&target.tunnel, now) {
                fall_due(clock.next(&target.tunnel));
                continue;
            }
            // While the token waits out a 429, a read would fail at once, sending nothing, and
            // the batch's end would bring a round for the next, back to back through every
            // tunnel due: they wait for the 429's end instead.
            if let Some(until) = api.held_off_until(&target.api_token) {
                fall_due(Some(until));
                continue;
            }
            if self.read_backs.is_full() {
                left = true;
                continue;
            }
            clock.reset(target.tunnel, now);
            let due_again = clock.next_if_held(&target.tunnel);
            fall_due(due_again);
            let batch = Arc::clone(&batch);
            self.reads_started += 1;
            let n = self.reads_started;
            let ended = Arc::clone(&self.reads_ended);
            let api = api.clone();
            let target = target.clone();
            let writer = key.clone();
            let digest = digest.clone();
            let written = Carried::of_document(document);
            let places = Arc::clone(&self.read_places);
            let wake = self.wake.clone();
            // Compared here: only a drift needs a call, and so a wake (or a read that ends
            // when the next is due).
            let read = async move {
                let found = async {
                    let _place = places
                        .acquire_owned()
                        .await
                        .map_err(|_| "no place to read from".to_owned())?;
                    let config = api.get_configuration(&target).await?;
                    let found = Carried::of_document(&config);
                    let drift = written.drift(&found);
                    Ok((found, drift))
                }
                .await;
                if let Ok(mut ended) = ended.lock() {
                    ended.push((target.tunnel, n));
                }
                // One that ran past the time the next falls due outlived that one's timer.
                let overdue = due_again.is_some_and(|at| Instant::now() >= at);
                if overdue || matches!(found, Ok((_, Some(_)))) {
                    if let Some(wake) = &wake {
                        wake.notify_one();
                    }
                }
                drop(batch);
                ReadBack {
                    writer,
                    digest,
                    found,
                }
            }
            .instrument(tracing::Span::current());
            self.read_backs.start(key.0, n.to_be_bytes().to_vec(), read);
        }
        // Due reads left wait for the end of those outstanding, all of them: one wake then,
        // at once if all have ended already.
        if left {
            batch.left.store(true, Ordering::Relaxed);
        }
        drop(batch);
        let kept = self
            .alarm
            .as_ref()
            .is_some_and(|alarm| Some(alarm.when()) == next);
        if !kept {
            self.alarm = next
                .zip(self.wake.as_ref())
                .and_then(|(at, wake)| Alarm::at(at, wake));
        }
    }

    /// Takes in finished reads back: a document that no longer carries what was written is
    /// written again by this call.
    fn settle_read_backs(&mut self, calls: &ApiCalls, done: Vec<Finished<Uuid, ReadBack>>) {
        for (tunnel, _, outcome) in done {
            // A read that panicked tells nothing; the next period reads again.
            let Some(ReadBack {
                writer,
                digest,
                found,
            }) = outcome
            else {
                continue;
            };
            // Written again since, or forgotten: the read compared another document.
            if self.written.get(&writer) != Some(&digest) {
                continue;
            }
            let (found, drift) = match found {
                Ok(found) => found,
                Err(error) => {
                    tracing::debug!(%tunnel, %error, "reading the tunnel's ingress document back failed; it is read again at the next period");
                    continue;
                }
            };
            let Some(clock) = &mut self.read_back else {
                continue;
            };
            let Some(drift) = drift else {
                clock.held(&tunnel);
                continue;
            };
            let in_a_row = clock.drifted(tunnel, &digest);
            let catch_all = match drift.catch_all {
                None => "unchanged",
                Some(true) => "now sends every other hostname to the proxies",
                Some(false) => "no longer sends every other hostname to the proxies",
            };
            let (missing, unexpected) = (listed(&drift.missing), listed(&drift.unexpected));
            if in_a_row > 1 {
                tracing::warn!(
                    %tunnel,
                    %missing,
                    %unexpected,
                    catch_all,
                    times_in_a_row = in_a_row,
                    next_read_back_in = ?clock.wait(&tunnel),
                    "the tunnel's ingress document was changed outside the controller again; something else writes this tunnel's configuration; writing it again, and reading it back less often"
                );
            } else {
                tracing::warn!(
                    %tunnel,
                    %missing,
                    %unexpected,
                    catch_all,
                    "the tunnel's ingress document was changed outside the controller; writing it again"
                );
            }
            calls.drifts.inc();
            self.written.remove(&writer);
            // What the tunnel serves until the write lands.
            self.landed.insert(tunnel, found);
        }
    }

    /// What `tunnel`'s document carries as far as this process knows, whichever of its
    /// writers wrote last and whichever call that finished in: what the last document written
    /// to it carries, or what a read back found there since (changed elsewhere, until the
    /// controller's document lands again). What the tunnel serves while newer documents fail.
    /// `None` before the first write that succeeded.
    pub fn landed(&self, tunnel: &Uuid) -> Option<&Carried> {
        self.landed.get(tunnel)
    }

    /// Stops every write running, each tried again by the next call that asks for it, and
    /// every read back.
    pub fn abort_all(&mut self) {
        self.writes.abort_all();
        // Their ends bring no call: nothing is left to start.
        if let Some(batch) = self.read_batch.upgrade() {
            batch.left.store(false, Ordering::Relaxed);
        }
        self.read_backs.abort_all();
        self.alarm = None;
    }

    /// The error `target`'s last write failed with, while it waits to be tried again: a
    /// tunnel with other writers is given to one of those meanwhile.
    pub fn failing(&self, target: &TunnelTarget) -> Option<&str> {
        self.failed.waiting(&writer_key(target))
    }

    /// Keeps the records of the writers asked for now (`writers`) and forgets every other's,
    /// old credentials included (each rotated token would leave one behind): a writer that
    /// comes back writes again, whatever was done to its tunnel meanwhile. Keeps what landed
    /// on the tunnels a plane still serves (`served`), and their reads back; the others'
    /// stop. A write still running ends by itself: stopped, its request could still land
    /// after a later write to the tunnel.
    pub fn retain<'t>(
        &mut self,
        writers: impl IntoIterator<Item = &'t TunnelTarget>,
        served: impl Fn(&Uuid) -> bool,
    ) {
        let asked: HashSet<WriterKey> = writers.into_iter().map(writer_key).collect();
        self.landed.retain(|t, _| served(t));
        self.read_backs.retain(|t| served(t));
        if let Some(clock) = &mut self.read_back {
            clock.retain(&served);
        }
        self.written.retain(|key, _| asked.contains(key));
        self.verified.retain(|key, _| asked.contains(key));
        self.failed.retain(|key| asked.contains(key));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cftunnel_config::Rule;

    #[test]
    fn a_tokens_calls_go_out_in_a_burst_then_spaced() {
        let pace = Pace::new(Duration::from_millis(100), 3);
        let t0 = tokio::time::Instant::now();
        let ms = Duration::from_millis;
        let taken: Vec<_> = (0..5).map(|_| pace.take(b"a", t0)).collect();
        assert_eq!(taken, [Ok(()), Ok(()), Ok(()), Err(ms(100)), Err(ms(100))]);
        assert_eq!(pace.take(b"b", t0), Ok(()), "another token has its own");
        // A call that waited and went away took no place.
        assert_eq!(pace.take(b"a", t0 + ms(100)), Ok(()));
        assert_eq!(pace.take(b"a", t0 + ms(150)), Err(ms(50)));
        assert_eq!(pace.take(b"a", t0 + ms(200)), Ok(()));
        // Spaced out, the burst comes back.
        let later = t0 + Duration::from_secs(1);
        assert_eq!(
            (0..3).map(|_| pace.take(b"a", later)).collect::<Vec<_>>(),
            [Ok(()), Ok(()), Ok(())]
        );
    }

    fn carried(hostnames: &[&str], any_host: bool) -> Carried {
        Carried {
            hostnames: hostnames.iter().map(|h| (*h).to_owned()).collect(),
            any_host,
        }
    }

    fn hosts(hostnames: &[&str]) -> Vec<String> {
        hostnames.iter().map(|h| (*h).to_owned()).collect()
    }

    #[test]
    fn a_document_read_back_differs_by_what_it_sends_to_the_proxies() {
        let written = carried(&["a.example.com", "b.example.com"], false);
        let cases = [
            (carried(&["a.example.com", "b.example.com"], false), None),
            (
                carried(&["a.example.com", "c.example.com"], false),
                Some(Drift {
                    missing: hosts(&["b.example.com"]),
                    unexpected: hosts(&["c.example.com"]),
                    catch_all: None,
                }),
            ),
            (
                carried(&["a.example.com", "b.example.com"], true),
                Some(Drift {
                    catch_all: Some(true),
                    ..Drift::default()
                }),
            ),
            (
                carried(&[], false),
                Some(Drift {
                    missing: hosts(&["a.example.com", "b.example.com"]),
                    ..Drift::default()
                }),
            ),
        ];
        for (found, drift) in cases {
            assert_eq!(written.drift(&found), drift, "{found:?}");
        }
        assert_eq!(
            carried(&[], true).drift(&carried(&[], false)),
            Some(Drift {
                catch_all: Some(false),
                ..Drift::default()
            })
        );
    }

    #[test]
    fn a_document_read_back_carries_only_hostnames_sent_whole_to_the_proxies() {
        // As the API hands a document back: with fields of its own beside ours.
        let found = json!({
            "ingress": [
                {"hostname": "a.example.com", "service": ORIGIN, "originRequest": {}},
                {"hostname": "b.example.com", "service": "http://elsewhere:80"},
                {"hostname": "c.example.com", "path": "/only", "service": ORIGIN},
                {"service": "http_status:404"},
            ],
            "warp-routing": {"enabled": false},
        });
        assert_eq!(
            Carried::of_document(&found),
            carried(&["a.example.com"], false)
        );
        assert_eq!(
            Carried::of_document(&json!({"ingress": [{"service": ORIGIN}]})),
            carried(&[], true)
        );
        assert_eq!(Carried::of_document(&Value::Null), Carried::default());
        // Empty or null fields, as other tools may write them, are absent.
        let found = json!({
            "ingress": [
                {"hostname": "a.example.com", "path": "", "service": ORIGIN},
                {"hostname": "b.example.com", "path": null, "service": ORIGIN},
                {"hostname": "c.example.com", "path": "/only", "service": ORIGIN},
                {"hostname": 7, "service": ORIGIN},
                {"hostname": "", "service": "http_status:404"},
            ],
        });
        assert_eq!(
            Carried::of_document(&found),
            carried(&["a.example.com", "b.example.com"], false)
        );
        for catch_all in [
            json!({"hostname": "", "service": ORIGIN}),
            json!({"hostname": null, "path": "", "service": ORIGIN}),
            json!({"hostname": null, "path": null, "service": ORIGIN}),
        ] {
            assert_eq!(
                Carried::of_document(&json!({"ingress": [catch_all]})),
                carried(&[], true),
                "{catch_all}"
            );
        }
        // What the controller writes, it reads as written.
        let written = carried(&["a.example.com", "*.example.org"], true);
        assert_eq!(Carried::of_document(&written.document()), written);
    }

    #[test]
    fn a_log_line_names_a_few_hostnames_and_counts_the_rest() {
        assert_eq!(listed(&[]), "");
        assert_eq!(listed(&hosts(&["a", "b"])), "a, b");
        let many: Vec<String> = (0..13).map(|i| format!("h{i}")).collect();
        assert_eq!(
            listed(&many),
            "h0, h1, h2, h3, h4, h5, h6, h7, h8, h9 and 3 more"
        );
    }

    #[test]
    fn a_tunnel_is_read_back_a_period_and_its_share_after_it_was_last_written_or_read() {
        let s = Duration::from_secs;
        let mut clock = ReadBackClock::new(s(300));
        let (a, b) = (Uuid::from_u128(1), Uuid::from_u128(2));
        let late = jitter(s(300), &a);
        let t0 = Instant::now();
        assert!(clock.due(&a, t0), "one never seen is due at once");
        assert_eq!(clock.next(&a), None);
        clock.wrote(a, b"doc", t0);
        assert!(!clock.due(&a, t0));
        assert!(!clock.due(&a, t0 + s(299)));
        assert!(clock.due(&a, t0 + s(300) + late));
        assert_eq!(clock.next(&a), Some(t0 + s(300) + late));
        assert!(clock.due(&b, t0), "each tunnel has its own");
        // Read (or written) again: a period from then.
        clock.reset(a, t0 + s(310));
        assert!(!clock.due(&a, t0 + s(600)));
        assert!(clock.due(&a, t0 + s(610) + late));
        // A period no instant can be told for never falls due.
        let mut never = ReadBackClock::new(Duration::MAX);
        never.wrote(a, b"doc", t0);
        assert!(!never.due(&a, t0 + s(86_400)));
        assert_eq!(never.next(&a), None);
    }

    #[test]
    fn reads_back_finding_a_drift_in_a_row_wait_longer_until_one_does_not() {
        let s = Duration::from_secs;
        let mut clock = ReadBackClock::new(s(300));
        let a = Uuid::from_u128(7);
        let late = jitter(s(300), &a);
        let t0 = Instant::now();
        clock.wrote(a, b"doc", t0);
        clock.reset(a, t0 + s(300));
        assert_eq!(clock.drifted(a, b"doc"), 1);
        // Written again: twice the period from then.
        clock.wrote(a, b"doc", t0 + s(301));
        assert_eq!(clock.next(&a), Some(t0 + s(301 + 600) + late));
        assert_eq!(clock.drifted(a, b"doc"), 2);
        clock.wrote(a, b"doc", t0 + s(1000));
        assert_eq!(clock.next(&a), Some(t0 + s(1000 + 1200) + late));
        // A read running then that finds it as written: due a period after it started.
        assert_eq!(clock.next_if_held(&a), Some(t0 + s(1000 + 300) + late));
        // Found as written: a period again.
        clock.held(&a);
        assert_eq!(clock.next(&a), Some(t0 + s(1000 + 300) + late));
        assert_eq!(clock.drifted(a, b"doc"), 1, "counted from one again");
        // The controller's own document changes: so does what the other writer fights over.
        clock.wrote(a, b"another doc", t0 + s(2000));
        assert_eq!(clock.next(&a), Some(t0 + s(2000 + 300) + late));
        assert_eq!(clock.drifted(a, b"another doc"), 1);
        // Forgotten with its tunnel.
        clock.retain(|_| false);
        assert_eq!(clock.next(&a), None);
        assert_eq!(clock.drifted(a, b"another doc"), 1);
    }

    #[test]
    fn the_wait_after_drifts_in_a_row_doubles_up_to_twelve_periods() {
        let s = Duration::from_secs;
        let waits: Vec<Duration> = (0..7).map(|n| backoff(s(300), n)).collect();
        assert_eq!(
            waits,
            [s(300), s(600), s(1200), s(2400), s(3600), s(3600), s(3600)]
        );
        assert_eq!(backoff(s(300), 40), s(3600), "no shift out of range");
        assert_eq!(backoff(s(300), u32::MAX), s(3600));
        assert_eq!(backoff(Duration::MAX, 3), Duration::MAX, "saturates");
    }

    #[test]
    fn a_tunnels_share_of_the_period_is_its_own_and_spread_over_a_tenth() {
        let period = Duration::from_secs(300);
        let tenth = period / 10;
        let ids: Vec<Uuid> = (0..1000u128)
            .map(Uuid::from_u128)
            .chain((0..1000u128).map(|i| Uuid::from_u128(i << 64)))
            .chain(["3b1f5c2e-8d4a-4e6b-9f0a-7c2d1e5b4a39"
                .parse()
                .expect("uuid")])
            .collect();
        let mut buckets = [0usize; 10];
        for id in &ids {
            let late = jitter(period, id);
            assert!(late < tenth, "{id}: {late:?}");
            assert_eq!(jitter(period, id), late, "the same every time");
            let bucket = usize::try_from(late.as_nanos() * 10 / tenth.as_nanos()).expect("small");
            buckets[bucket] += 1;
        }
        // Neighbouring ids (as tests and tools number them) are spread too, evenly enough.
        for (i, n) in buckets.iter().enumerate() {
            assert!((120..=280).contains(n), "bucket {i}: {buckets:?}");
        }
        let distinct: HashSet<Duration> = ids.iter().map(|id| jitter(period, id)).collect();
        assert!(distinct.len() > 800, "{}", distinct.len());
        assert_eq!(jitter(Duration::ZERO, &ids[5]), Duration::ZERO);
        assert!(jitter(Duration::MAX, &ids[5]) < Duration::MAX / 10);
    }

    #[test]
    fn a_read_back_holds_a_configuration_only_if_its_answer_names_one() {
        let config = json!({"ingress": [{"service": "http_status:404"}]});
        let answer = |result: Value| json!({"success": true, "errors": [], "result": result});
        assert_eq!(
            configuration_in(answer(json!({"version": 3, "config": config}))),
            Some(config)
        );
        for result in [
            json!({"version": 3, "config": null}),
            json!({"version": 3}),
            Value::Null,
            json!("a string"),
            json!([1, 2]),
        ] {
            assert_eq!(configuration_in(answer(result.clone())), None, "{result}");
        }
        assert_eq!(configuration_in(json!({"success": true})), None);
        assert_eq!(configuration_in(json!(["not", "an", "envelope"])), None);
    }

    fn rule(hosts: &[&str]) -> Rule {
        Rule {
            hostnames: hosts.iter().map(|h| (*h).to_owned()).collect(),
            ..Rule::default()
        }
    }

    #[test]
    fn the_document_lists_every_hostname_once_and_ends_with_a_catch_all() {
        let a = Config {
            rules: vec![
                rule(&["shop.example.com", "*.example.com"]),
                rule(&["shop.example.com"]),
            ],
            ..Config::default()
        };
        let b = Config {
            rules: vec![rule(&["api.example.org"])],
            ..Config::default()
        };
        assert_eq!(
            ingress_document(&[&a, &b]),
            json!({"ingress": [
                {"hostname": "*.example.com", "service": ORIGIN},
                {"hostname": "api.example.org", "service": ORIGIN},
                {"hostname": "shop.example.com", "service": ORIGIN},
                {"service": "http_status:404"},
            ]})
        );
        let any = Config {
            rules: vec![rule(&[])],
            ..Config::default()
        };
        assert_eq!(
            ingress_document(&[&any]),
            json!({"ingress": [{"service": ORIGIN}]})
        );
        assert_eq!(
            ingress_document(&[]),
            json!({"ingress": [{"service": "http_status:404"}]})
        );
    }
}
