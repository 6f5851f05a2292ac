//! The tunnel-configuration endpoint of the Cloudflare API (v4), in memory:
//! `PUT` and `GET /client/v4/accounts/{account}/cfd_tunnel/{tunnel}/configurations`,
//! `GET .../cfd_tunnel/{tunnel}/token` (the tunnel's connector token), bearer
//! tokens per account, the API's response envelope (`success`, `errors`, `messages`, `result`
//! with an increasing `version`), and `cloudflared`'s rule that an ingress list must end with a
//! catch-all (no hostname, no path). Refusals carry the API's error objects
//! (`{"code", "message"}`).
//!
//! A request received is carried out even if its client goes away before the answer, as a
//! real API server does: a write stopped on the client's side may still land.

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{json, Value};

#[derive(Default)]
struct State {
    /// Accepted tokens per account.
    tokens: BTreeMap<String, BTreeSet<String>>,
    /// `(account, tunnel)` to (version, config).
    configs: BTreeMap<(String, String), (i64, Value)>,
    /// `(account, tunnel)` to the tunnel's connector token.
    tunnels: BTreeMap<(String, String), String>,
    /// Answer the next request 429 with this `Retry-After`.
    rate_limit_next: Option<u64>,
    /// Requests received.
    requests: usize,
    /// Requests waiting for the gate to open ([`CloudflareApi::hold`]).
    held: usize,
    writes: usize,
    /// Carry out the next `PUT` only this long after it arrives.
    slow_next_put: Option<Duration>,
    /// `PUT`s received so far, numbered from 1 as they arrive.
    puts: usize,
    /// When each `PUT` arrived and was answered, in order.
    put_events: Vec<PutEvent>,
    /// When each `GET` of a configuration was answered with one, in order.
    config_reads: Vec<std::time::Instant>,
}

/// A moment in a `PUT`'s life, the `PUT` numbered from 1 in the order they arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutEvent {
    /// Its request was read in full.
    Arrived(usize),
    /// It was carried out (or refused) and answered.
    Answered(usize),
}

/// The running stand-in, on a loopback port of its own. Dropping it stops serving.
pub struct CloudflareApi {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    /// Open: requests are answered; shut ([`CloudflareApi::hold`]): they wait.
    gate: Arc<tokio::sync::watch::Sender<bool>>,
    /// The same for `GET`s only ([`CloudflareApi::hold_reads`]).
    reads_gate: Arc<tokio::sync::watch::Sender<bool>>,
    task: tokio::task::JoinHandle<()>,
}

/// Requests wait unanswered while this lives ([`CloudflareApi::hold`],
/// [`CloudflareApi::hold_reads`]).
pub struct Hold {
    gate: Arc<tokio::sync::watch::Sender<bool>>,
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.gate.send_replace(true);
    }
}

impl Drop for CloudflareApi {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn envelope(
    status: StatusCode,
    success: bool,
    errors: Value,
    result: Value,
) -> Response<Full<Bytes>> {
    let body = json!({"success": success, "errors": errors, "messages": [], "result": result});
    let mut res = Response::new(Full::new(Bytes::from(body.to_string())));
    *res.status_mut() = status;
    res.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    res
}

fn refuse(status: StatusCode, code: u32, message: &str) -> Response<Full<Bytes>> {
    envelope(
        status,
        false,
        json!([{"code": code, "message": message}]),
        Value::Null,
    )
}

/// Reads `req`, then carries it out in a task of its own (after the gate opens, a `GET`'s
/// own gate too, and the wait [`CloudflareApi::slow_next_put`] set), which its client going
/// away does not stop.
async fn receive(
    state: Arc<Mutex<State>>,
    mut open: tokio::sync::watch::Receiver<bool>,
    mut reads_open: tokio::sync::watch::Receiver<bool>,
    req: Request<Incoming>,
) -> Response<Full<Bytes>> {
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let read = parts.method == Method::GET;
    let put = (parts.method == Method::PUT).then(|| {
        let mut state = state.lock().expect("state");
        state.puts += 1;
        let n = state.puts;
        state.put_events.push(PutEvent::Arrived(n));
        (n, state.slow_next_put.take())
    });
    let task = tokio::spawn(async move {
        if let Some((_, Some(wait))) = put {
            tokio::time::sleep(wait).await;
        }
        let held = !*open.borrow() || (read && !*reads_open.borrow());
        if held {
            state.lock().expect("state").held += 1;
        }
        let _ = open.wait_for(|open| *open).await;
        if read {
            let _ = reads_open.wait_for(|open| *open).await;
        }
        if held {
            state.lock().expect("state").held -= 1;
        }
        let res = handle(&state, parts, body);
        if let Some((n, _)) = put {
            state
                .lock()
                .expect("state")
                .put_events
                .push(PutEvent::Answered(n));
        }
        res
    });
    task.await.unwrap_or_else(|_| {
        refuse(
            StatusCode::INTERNAL_SERVER_ERROR,
            10001,
            "Internal server error",
        )
    })
}

fn handle(
    state: &Mutex<State>,
    parts: hyper::http::request::Parts,
    body: Bytes,
) -> Response<Full<Bytes>> {
    let path = parts.uri.path().to_owned();
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (account, tunnel, token_path) = match segments.as_slice() {
        ["client", "v4", "accounts", account, "cfd_tunnel", tunnel, "configurations"] => {
            (*account, *tunnel, false)
        }
        ["client", "v4", "accounts", account, "cfd_tunnel", tunnel, "token"] => {
            (*account, *tunnel, true)
        }
        _ => {
            return refuse(
                StatusCode::NOT_FOUND,
                7003,
                "Could not route to the requested path",
            )
        }
    };
    let (account, tunnel) = (account.to_owned(), tunnel.to_owned());
    let presented = parts
        .headers
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_owned);
    let method = parts.method.clone();
    let mut state = state.lock().expect("state");
    state.requests += 1;
    if let Some(seconds) = state.rate_limit_next.take() {
        let mut res = refuse(StatusCode::TOO_MANY_REQUESTS, 10429, "Too many requests");
        res.headers_mut().insert(
            hyper::header::RETRY_AFTER,
            hyper::header::HeaderValue::from(seconds),
        );
        return res;
    }
    let accepted = presented.as_ref().is_some_and(|token| {
        state
            .tokens
            .get(&account)
            .is_some_and(|t| t.contains(token))
    });
    if !accepted {
        return refuse(StatusCode::FORBIDDEN, 10000, "Authentication error");
    }
    if token_path {
        return match (
            method,
            state.tunnels.get(&(account.clone(), tunnel.clone())),
        ) {
            (Method::GET, Some(token)) => envelope(StatusCode::OK, true, json!([]), json!(token)),
            (Method::GET, None) => refuse(StatusCode::NOT_FOUND, 1003, "Tunnel not found"),
            _ => refuse(StatusCode::METHOD_NOT_ALLOWED, 10405, "Method not allowed"),
        };
    }
    match method {
        Method::GET => match state
            .configs
            .get(&(account.clone(), tunnel.clone()))
            .cloned()
        {
            Some((version, config)) => {
                state.config_reads.push(std::time::Instant::now());
                envelope(
                    StatusCode::OK,
                    true,
                    json!([]),
                    json!({"tunnel_id": tunnel, "account_id": account, "version": version, "config": config, "source": "cloudflare"}),
                )
            }
            None => refuse(StatusCode::NOT_FOUND, 1003, "Configuration not found"),
        },
        Method::PUT => {
            let Ok(doc) = serde_json::from_slice::<Value>(&body) else {
                return refuse(StatusCode::BAD_REQUEST, 1001, "Invalid request body");
            };
            let Some(ingress) = doc.pointer("/config/ingress").and_then(Value::as_array) else {
                return refuse(StatusCode::BAD_REQUEST, 1001, "config.ingress is required");
            };
            let catch_all = ingress.last().is_some_and(|r| {
                r.get("hostname").is_none() && r.get("path").is_none() && r.get("service").is_some()
            });
            if !catch_all {
                return refuse(
                    StatusCode::BAD_REQUEST,
                    1056,
                    "The last ingress rule must match all URLs (i.e. it should not have a hostname or path filter)",
                );
            }
            let key = (account.clone(), tunnel.clone());
            let version = state.configs.get(&key).map_or(1, |(v, _)| v + 1);
            state.configs.insert(key, (version, doc["config"].clone()));
            state.writes += 1;
            envelope(
                StatusCode::OK,
                true,
                json!([]),
                json!({"tunnel_id": tunnel, "account_id": account, "version": version, "config": doc["config"], "source": "cloudflare"}),
            )
        }
        _ => refuse(StatusCode::METHOD_NOT_ALLOWED, 10405, "Method not allowed"),
    }
}

impl CloudflareApi {
    /// Starts serving on `127.0.0.1:0`, with no account, tunnel or configuration: every
    /// request is refused until a test [`allow`](Self::allow)s a token.
    ///
    /// # Panics
    ///
    /// When no loopback port can be bound.
    pub async fn start() -> Self {
        let state = Arc::new(Mutex::new(State::default()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let serving = Arc::clone(&state);
        let gate = Arc::new(tokio::sync::watch::Sender::new(true));
        let gates = Arc::clone(&gate);
        let reads_gate = Arc::new(tokio::sync::watch::Sender::new(true));
        let reads_gates = Arc::clone(&reads_gate);
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let state = Arc::clone(&serving);
                let gate = Arc::clone(&gates);
                let reads_gate = Arc::clone(&reads_gates);
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        let state = Arc::clone(&state);
                        let open = gate.subscribe();
                        let reads_open = reads_gate.subscribe();
                        async move { Ok::<_, Infallible>(receive(state, open, reads_open, req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self {
            addr,
            state,
            gate,
            reads_gate,
            task,
        }
    }

    /// Leaves requests unanswered until the returned guard is dropped: an API that takes
    /// connections and does not answer (yet).
    pub fn hold(&self) -> Hold {
        self.gate.send_replace(false);
        Hold {
            gate: Arc::clone(&self.gate),
        }
    }

    /// Leaves `GET`s unanswered until the returned guard is dropped; writes are answered.
    pub fn hold_reads(&self) -> Hold {
        self.reads_gate.send_replace(false);
        Hold {
            gate: Arc::clone(&self.reads_gate),
        }
    }

    /// The API base URL (what `/client/v4` is under).
    pub fn base(&self) -> String {
        format!("http://{}/client/v4", self.addr)
    }

    /// Makes `token` the one accepted for `account`.
    pub fn allow(&self, account: &str, token: &str) {
        self.state
            .lock()
            .expect("state")
            .tokens
            .insert(account.to_owned(), BTreeSet::from([token.to_owned()]));
    }

    /// Accepts `token` for `account` too, beside those accepted already.
    pub fn also_allow(&self, account: &str, token: &str) {
        self.state
            .lock()
            .expect("state")
            .tokens
            .entry(account.to_owned())
            .or_default()
            .insert(token.to_owned());
    }

    /// Creates a tunnel of `account` whose connector token is `token`.
    pub fn add_tunnel(&self, account: &str, tunnel: &str, token: &str) {
        self.state
            .lock()
            .expect("state")
            .tunnels
            .insert((account.to_owned(), tunnel.to_owned()), token.to_owned());
    }

    /// The tunnel's stored configuration and its version.
    pub fn config(&self, account: &str, tunnel: &str) -> Option<(i64, Value)> {
        self.state
            .lock()
            .expect("state")
            .configs
            .get(&(account.to_owned(), tunnel.to_owned()))
            .cloned()
    }

    /// Stores `config` as the tunnel's configuration as it is, unchecked (a `null` one
    /// included), with the next version: what another writer, or the API itself, may leave.
    pub fn replace_config(&self, account: &str, tunnel: &str, config: Value) {
        let mut state = self.state.lock().expect("state");
        let key = (account.to_owned(), tunnel.to_owned());
        let version = state.configs.get(&key).map_or(1, |(v, _)| v + 1);
        state.configs.insert(key, (version, config));
    }

    /// Requests waiting unanswered now while [`CloudflareApi::hold`] holds them.
    pub fn held(&self) -> usize {
        self.state.lock().expect("state").held
    }

    /// Answers the next request 429 with `Retry-After: seconds`.
    pub fn rate_limit_next(&self, seconds: u64) {
        self.state.lock().expect("state").rate_limit_next = Some(seconds);
    }

    /// Requests received so far, refused ones included.
    pub fn requests(&self) -> usize {
        self.state.lock().expect("state").requests
    }

    /// Successful writes so far.
    pub fn writes(&self) -> usize {
        self.state.lock().expect("state").writes
    }

    /// Carries out the next `PUT` only `wait` after it arrives (its document stored, its
    /// answer sent then): a write that is slow to land.
    pub fn slow_next_put(&self, wait: Duration) {
        self.state.lock().expect("state").slow_next_put = Some(wait);
    }

    /// When each `PUT` so far arrived and was answered, in order.
    pub fn put_events(&self) -> Vec<PutEvent> {
        self.state.lock().expect("state").put_events.clone()
    }

    /// When each `GET` of a tunnel's configuration so far was answered with one, in order.
    pub fn config_reads(&self) -> Vec<std::time::Instant> {
        self.state.lock().expect("state").config_reads.clone()
    }
}

#[cfg(test)]
mod tests;
