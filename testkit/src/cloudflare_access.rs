//! Cloudflare Access as an origin meets it: a team's signing keys published as JWKS at
//! `<team domain>/cdn-cgi/access/certs` ([`JwksServer`], plain HTTP on loopback, with
//! `http://127.0.0.1:<port>/<team>` standing for `https://<team>.cloudflareaccess.com`), and
//! the application tokens Access puts in `Cf-Access-Jwt-Assertion`, signed with keys the test
//! holds ([`SigningKey`], RS256 or ES256).
//!
//! The test decides what the server publishes, and may take it down (it then answers 503), so
//! key rotation and an unreachable endpoint can be played. Left out: the `public_cert(s)` PEM
//! fields of Cloudflare's document, which validators do not need.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::rsa::{KeyPair as RsaKeyPair, KeySize};
use aws_lc_rs::signature::{
    EcdsaKeyPair, KeyPair as _, ECDSA_P256_SHA256_FIXED_SIGNING, RSA_PKCS1_SHA256,
};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// The header Access puts the application token in.
pub const TOKEN_HEADER: &str = "Cf-Access-Jwt-Assertion";

enum Pair {
    Rsa(RsaKeyPair),
    Ec(EcdsaKeyPair),
}

/// A signing key of the team, with its key id.
pub struct SigningKey {
    kid: String,
    pair: Pair,
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningKey")
            .field("kid", &self.kid)
            .field("alg", &self.alg())
            .finish()
    }
}

impl SigningKey {
    /// A fresh RSA 2048 key (RS256), as Cloudflare's.
    pub fn rs256(kid: &str) -> Self {
        let pair = RsaKeyPair::generate(KeySize::Rsa2048).expect("RSA key generates");
        Self {
            kid: kid.to_owned(),
            pair: Pair::Rsa(pair),
        }
    }

    /// A fresh P-256 key (ES256).
    pub fn es256(kid: &str) -> Self {
        let pair =
            EcdsaKeyPair::generate(&ECDSA_P256_SHA256_FIXED_SIGNING).expect("EC key generates");
        Self {
            kid: kid.to_owned(),
            pair: Pair::Ec(pair),
        }
    }

    pub fn kid(&self) -> &str {
        &self.kid
    }

    pub fn alg(&self) -> &'static str {
        match self.pair {
            Pair::Rsa(_) => "RS256",
            Pair::Ec(_) => "ES256",
        }
    }

    /// The public key as a JWK, as the certs document lists it.
    pub fn jwk(&self) -> Value {
        match &self.pair {
            Pair::Rsa(pair) => {
                let public = pair.public_key();
                json!({
                    "kid": self.kid, "kty": "RSA", "alg": "RS256", "use": "sig",
                    "n": URL_SAFE_NO_PAD.encode(public.modulus().big_endian_without_leading_zero()),
                    "e": URL_SAFE_NO_PAD.encode(public.exponent().big_endian_without_leading_zero()),
                })
            }
            Pair::Ec(pair) => {
                // Uncompressed point: 0x04, then x and y, 32 bytes each.
                let point = pair.public_key().as_ref();
                let (x, y) = point[1..].split_at(32);
                json!({
                    "kid": self.kid, "kty": "EC", "alg": "ES256", "use": "sig", "crv": "P-256",
                    "x": URL_SAFE_NO_PAD.encode(x),
                    "y": URL_SAFE_NO_PAD.encode(y),
                })
            }
        }
    }

    /// A compact JWS of `claims`, its header naming this key's id.
    pub fn sign(&self, claims: &Value) -> String {
        self.sign_with_header(
            json!({"alg": self.alg(), "kid": self.kid, "typ": "JWT"}),
            claims,
        )
    }

    /// A compact JWS of `claims` under `header` as given (any `alg` or `kid`), signed with
    /// this key.
    pub fn sign_with_header(&self, header: Value, claims: &Value) -> String {
        let head = URL_SAFE_NO_PAD.encode(header.to_string());
        let body = URL_SAFE_NO_PAD.encode(claims.to_string());
        let message = format!("{head}.{body}");
        let rng = SystemRandom::new();
        let signature = match &self.pair {
            Pair::Rsa(pair) => {
                let mut sig = vec![0u8; pair.public_modulus_len()];
                pair.sign(&RSA_PKCS1_SHA256, &rng, message.as_bytes(), &mut sig)
                    .expect("RSA signs");
                sig
            }
            Pair::Ec(pair) => pair
                .sign(&rng, message.as_bytes())
                .expect("EC signs")
                .as_ref()
                .to_vec(),
        };
        format!("{message}.{}", URL_SAFE_NO_PAD.encode(signature))
    }
}

/// Seconds since the epoch, now.
pub fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// The claims of an application token as Access issues one: issued by `issuer` for `aud`,
/// valid from `nbf` to `exp` (seconds from now; negative is in the past).
pub fn claims(issuer: &str, aud: &[&str], nbf: i64, exp: i64) -> Value {
    let now = now();
    json!({
        "aud": aud,
        "email": "user@example.com",
        "exp": now + exp,
        "iat": now + nbf,
        "nbf": now + nbf,
        "iss": issuer,
        "type": "app",
        "identity_nonce": "nonce",
        "sub": "6a8b1c2d-0000-4000-8000-000000000000",
        "country": "NL",
    })
}

#[derive(Debug, Default)]
struct State {
    keys: Vec<Value>,
    down: bool,
    fetches: usize,
}

/// Teams' certs endpoints on loopback, all publishing the keys the test set.
#[derive(Debug)]
pub struct JwksServer {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    task: JoinHandle<()>,
}

impl Drop for JwksServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl JwksServer {
    /// Listens on `127.0.0.1`, publishing no keys until [`JwksServer::publish`].
    pub async fn start() -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(Mutex::new(State::default()));
        let shared = state.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let state = shared.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        let state = state.clone();
                        async move { Ok::<_, Infallible>(answer(&req, &state)) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(Self { addr, state, task })
    }

    /// The team-domain template a proxy is given: `http://127.0.0.1:<port>/{team}`.
    pub fn team_domain(&self) -> String {
        format!("http://{}/{{team}}", self.addr)
    }

    /// The issuer of `team`'s tokens (its team domain).
    pub fn issuer(&self, team: &str) -> String {
        format!("http://{}/{team}", self.addr)
    }

    /// Publishes exactly `keys` from now on.
    pub fn publish(&self, keys: &[&SigningKey]) {
        self.state().keys = keys.iter().map(|k| k.jwk()).collect();
    }

    /// Down: every request is answered 503, as an unreachable endpoint fails.
    pub fn set_down(&self, down: bool) {
        self.state().down = down;
    }

    /// Requests for a certs document so far, answered or not.
    pub fn fetches(&self) -> usize {
        self.state().fetches
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn answer<B>(req: &Request<B>, state: &Mutex<State>) -> Response<Full<Bytes>> {
    let mut state = state.lock().unwrap_or_else(PoisonError::into_inner);
    let path = req.uri().path();
    let is_certs = path
        .strip_prefix('/')
        .and_then(|p| p.split_once('/'))
        .is_some_and(|(team, rest)| !team.is_empty() && rest == "cdn-cgi/access/certs");
    let (status, body) = if !is_certs {
        (StatusCode::NOT_FOUND, Bytes::new())
    } else {
        state.fetches += 1;
        if state.down {
            (StatusCode::SERVICE_UNAVAILABLE, Bytes::new())
        } else {
            let doc = json!({"keys": state.keys});
            (StatusCode::OK, Bytes::from(doc.to_string()))
        }
    };
    let mut response = Response::new(Full::new(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        "content-type",
        http::HeaderValue::from_static("application/json"),
    );
    response
}
