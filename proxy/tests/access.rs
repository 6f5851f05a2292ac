//! Cloudflare Access enforced at the origin: a rule with an `access` requirement passes only
//! requests whose `Cf-Access-Jwt-Assertion` verifies against the team's keys, fetched from a
//! key endpoint the test controls. Everything runs through a real proxy to a real echo
//! backend, which must never see a refused request.

use crate::support::*;
use cftunnel_proxy::access::AccessSettings;
use cftunnel_proxy::{Server, ServerOptions};
use cftunnel_testkit::cloudflare_access::{claims, JwksServer, SigningKey, TOKEN_HEADER};
use cftunnel_testkit::echo::EchoServer;
use cftunnel_testkit::wait::wait_until;
use http::StatusCode;
use serde_json::json;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

const TEAM: &str = "acme";
const AUD: &str = "4714c1358e65fe4b408ad6d432a5f878f08194bdb4752441fd56faefa9b2b6f2";
const DENIED: &str = "a valid Cloudflare Access token is required\n";

struct Setup {
    jwks: JwksServer,
    /// What the proxy fetches keys through: `jwks`, its answers held back on demand.
    front: SlowFront,
    proxy: Server,
    backend: EchoServer,
    http: TestClient,
}

/// A proxy whose `app.example.com` requires tokens of team `acme` for [`AUD`] (or another
/// audience), and whose `open.example.com` requires nothing; keys come from a local endpoint.
async fn setup(keys: &[&SigningKey], settings: impl FnOnce(&mut AccessSettings)) -> Setup {
    let jwks = JwksServer::start().await.expect("key endpoint starts");
    jwks.publish(keys);
    let front = SlowFront::start(&jwks).await;
    let mut access = AccessSettings {
        team_domain: front.team_domain(),
        min_refetch: Duration::ZERO,
        ..AccessSettings::default()
    };
    settings(&mut access);
    let proxy = proxy_with(ServerOptions {
        auth_token: Some(TOKEN.into()),
        access,
        ..ServerOptions::default()
    })
    .await;
    let backend = echo("backend").await;
    let http = client();
    let doc = json!({"rules": [
        {"hostnames": ["app.example.com"], "name": "team/app/0",
         "backends": [{"url": url(backend.http_addr())}],
         "access": {"teamName": TEAM, "audiences": ["another-app", AUD]}},
        {"hostnames": ["open.example.com"], "backends": [{"url": url(backend.http_addr())}]},
    ]});
    assert_eq!(
        push(&http, proxy.admin_addr(), &doc).await.status,
        StatusCode::OK
    );
    Setup {
        jwks,
        front,
        proxy,
        backend,
        http,
    }
}

impl Setup {
    async fn call(&self, path: &str, token: Option<&str>) -> Reply {
        let headers: Vec<(&str, &str)> = token.map(|t| (TOKEN_HEADER, t)).into_iter().collect();
        get(
            &self.http,
            self.proxy.data_addr(),
            "app.example.com",
            path,
            &headers,
        )
        .await
    }

    fn issuer(&self) -> String {
        self.front.issuer(TEAM)
    }

    /// A token of the team for [`AUD`], valid for an hour.
    fn token(&self, key: &SigningKey) -> String {
        key.sign(&claims(&self.issuer(), &[AUD], -10, 3600))
    }
}

/// A relay in front of a key endpoint that can hold back its answers: the endpoint reads the
/// set when asked, and the proxy gets it a delay later, as from a slow endpoint in the middle
/// of a key rotation.
struct SlowFront {
    addr: SocketAddr,
    delay_ms: Arc<AtomicU64>,
    accept: tokio::task::JoinHandle<()>,
}

impl Drop for SlowFront {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

impl SlowFront {
    async fn start(jwks: &JwksServer) -> Self {
        let to: SocketAddr = jwks
            .team_domain()
            .trim_start_matches("http://")
            .trim_end_matches("/{team}")
            .parse()
            .expect("the key endpoint's address");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("binds");
        let addr = listener.local_addr().expect("address");
        let delay_ms = Arc::new(AtomicU64::new(0));
        let delay = delay_ms.clone();
        let task = tokio::spawn(async move {
            // Dropped with the accept loop, so aborting it ends every relayed connection.
            let mut relays = JoinSet::new();
            while let Ok((client, _)) = listener.accept().await {
                relays.spawn(relay(client, to, delay.clone()));
            }
        });
        Self {
            addr,
            delay_ms,
            accept: task,
        }
    }

    /// Answers from now on reach the proxy this long after the endpoint gave them.
    fn set_delay(&self, delay: Duration) {
        let ms = u64::try_from(delay.as_millis()).expect("a short delay");
        self.delay_ms.store(ms, Ordering::SeqCst);
    }

    fn team_domain(&self) -> String {
        format!("http://{}/{{team}}", self.addr)
    }

    fn issuer(&self, team: &str) -> String {
        format!("http://{}/{team}", self.addr)
    }
}

/// Copies one connection both ways, holding back the first bytes of each answer.
async fn relay(client: TcpStream, to: SocketAddr, delay_ms: Arc<AtomicU64>) {
    let Ok(server) = TcpStream::connect(to).await else {
        return;
    };
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    // A request went out whose answer has not started yet.
    let asked = AtomicBool::new(false);
    let up = async {
        let mut buf = vec![0u8; 16 * 1024];
        while let Ok(n @ 1..) = client_read.read(&mut buf).await {
            asked.store(true, Ordering::SeqCst);
            if server_write.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        let _ = server_write.shutdown().await;
    };
    let down = async {
        let mut buf = vec![0u8; 16 * 1024];
        while let Ok(n @ 1..) = server_read.read(&mut buf).await {
            if asked.swap(false, Ordering::SeqCst) {
                let ms = delay_ms.load(Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            if client_write.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        let _ = client_write.shutdown().await;
    };
    tokio::join!(up, down);
}

fn assert_denied(reply: &Reply, case: &str) {
    assert_eq!(
        (reply.status, String::from_utf8_lossy(&reply.body).as_ref()),
        (StatusCode::FORBIDDEN, DENIED),
        "{case}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valid_rs256_and_es256_tokens_reach_the_backend_with_the_token() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let rsa = SigningKey::rs256("rsa-1");
        let ec = SigningKey::es256("ec-1");
        let s = setup(&[&rsa, &ec], |_| {}).await;
        for (key, path) in [(&rsa, "/rs256"), (&ec, "/es256")] {
            let token = s.token(key);
            let reply = s.call(path, Some(&token)).await;
            assert_eq!(reply.status, StatusCode::OK, "{}", key.alg());
            // The backend gets the token, as behind cloudflared, to read the identity from.
            assert_eq!(
                reply.seen_header(TOKEN_HEADER).as_deref(),
                Some(token.as_str())
            );
            // Once verified it is remembered: the same token passes again.
            assert_eq!(s.call(path, Some(&token)).await.status, StatusCode::OK);
            assert_eq!(s.backend.count_echoed(path), 2, "{}", key.alg());
        }
        // A token whose `aud` is a single string, for the rule's other audience.
        let single = json!({"aud": "another-app"});
        let mut c = claims(&s.issuer(), &[], -10, 3600);
        c["aud"] = single["aud"].clone();
        assert_eq!(
            s.call("/single-aud", Some(&rsa.sign(&c))).await.status,
            StatusCode::OK
        );
        // The user's address the backend reads is the one the verified token states, not one
        // the client sent; a token with none (a service token) forwards none. Twice each: a
        // remembered token forwards the same.
        let email = "cf-access-authenticated-user-email";
        let mut service = claims(&s.issuer(), &[AUD], -10, 3600);
        service.as_object_mut().map(|c| c.remove("email"));
        for (token, expected) in [
            (s.token(&rsa), Some("user@example.com")),
            (rsa.sign(&service), None),
        ] {
            for path in ["/identity", "/identity-again"] {
                let reply = get(
                    &s.http,
                    s.proxy.data_addr(),
                    "app.example.com",
                    path,
                    &[(TOKEN_HEADER, token.as_str()), (email, "admin@example.com")],
                )
                .await;
                assert_eq!(reply.status, StatusCode::OK);
                assert_eq!(reply.seen_header(email).as_deref(), expected, "{path}");
            }
        }
        // A rule without a requirement needs no token.
        let open = get(
            &s.http,
            s.proxy.data_addr(),
            "open.example.com",
            "/open",
            &[],
        )
        .await;
        assert_eq!(open.status, StatusCode::OK);
    })
    .await
    .expect("test finishes in time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_failing_a_check_get_403_and_never_reach_the_backend() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let key = SigningKey::rs256("current");
        let s = setup(&[&key], |_| {}).await;
        let issuer = s.issuer();
        // Same key id as the published key, other key material: a forged signature.
        let impostor = SigningKey::rs256("current");
        let unpublished = SigningKey::es256("unpublished");
        let hs256 = {
            let real = s.token(&key);
            let mut parts = real.splitn(2, '.');
            let _ = parts.next();
            // `{"alg":"HS256","kid":"current"}` over the real claims and signature.
            format!(
                "eyJhbGciOiJIUzI1NiIsImtpZCI6ImN1cnJlbnQifQ.{}",
                parts.next().unwrap_or("")
            )
        };
        let cases: Vec<(&str, Option<String>)> = vec![
            ("/missing", None),
            ("/empty", Some(String::new())),
            ("/garbage", Some("not-a-jwt".to_owned())),
            (
                "/expired",
                Some(key.sign(&claims(&issuer, &[AUD], -7200, -600))),
            ),
            (
                "/not-yet-valid",
                Some(key.sign(&claims(&issuer, &[AUD], 600, 7200))),
            ),
            (
                "/wrong-audience",
                Some(key.sign(&claims(&issuer, &["other"], -10, 3600))),
            ),
            (
                "/wrong-issuer",
                Some(key.sign(&claims(
                    "https://evil.cloudflareaccess.com",
                    &[AUD],
                    -10,
                    3600,
                ))),
            ),
            (
                "/wrong-key",
                Some(impostor.sign(&claims(&issuer, &[AUD], -10, 3600))),
            ),
            (
                "/unknown-key",
                Some(unpublished.sign(&claims(&issuer, &[AUD], -10, 3600))),
            ),
            ("/hs256", Some(hs256)),
        ];
        for (path, token) in &cases {
            let reply = s.call(path, token.as_deref()).await;
            assert_denied(&reply, path);
        }
        // Refused twice over: a refused token is not remembered as good.
        for (path, token) in &cases {
            assert_denied(&s.call(path, token.as_deref()).await, path);
        }
        for (path, _) in &cases {
            assert_eq!(
                s.backend.count_echoed(path),
                0,
                "{path} reached the backend"
            );
        }
        // Two tokens, a good one first: only one would be verified, and the backend might
        // read the other.
        let good = s.token(&key);
        let forged = impostor.sign(&claims(&issuer, &[AUD], -10, 3600));
        let twice = get(
            &s.http,
            s.proxy.data_addr(),
            "app.example.com",
            "/twice",
            &[
                (TOKEN_HEADER, good.as_str()),
                (TOKEN_HEADER, forged.as_str()),
            ],
        )
        .await;
        assert_denied(&twice, "two tokens");
        assert_eq!(s.backend.count_echoed("/twice"), 0);
        // The real key still passes: nothing above disturbed the team's keys.
        assert_eq!(
            s.call("/ok", Some(&s.token(&key))).await.status,
            StatusCode::OK
        );
    })
    .await
    .expect("test finishes in time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_key_id_is_fetched_and_a_removed_key_stops_passing() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let old = SigningKey::rs256("old");
        let new = SigningKey::es256("new");
        let s = setup(&[&old], |_| {}).await;
        let old_token = s.token(&old);
        assert_eq!(
            s.call("/before", Some(&old_token)).await.status,
            StatusCode::OK
        );
        let fetched = s.jwks.fetches();

        // Rotation: the endpoint lists a new key; a token naming it makes the proxy fetch the
        // set at once (the refresh period is minutes), and passes.
        s.jwks.publish(&[&old, &new]);
        assert_eq!(
            s.call("/rotated", Some(&s.token(&new))).await.status,
            StatusCode::OK
        );
        assert!(s.jwks.fetches() > fetched, "the set was fetched again");
        assert_eq!(
            s.call("/old-still", Some(&old_token)).await.status,
            StatusCode::OK
        );

        // The old key is withdrawn. Once the proxy has the new set, the old key's token, which
        // it had verified before, is refused: remembered tokens do not outlive their key.
        s.jwks.publish(&[&new]);
        let probe = SigningKey::rs256("probe");
        // A token naming an unknown key makes the proxy fetch the set again.
        assert_denied(&s.call("/probe", Some(&s.token(&probe))).await, "probe");
        assert_denied(
            &s.call("/withdrawn", Some(&old_token)).await,
            "withdrawn key",
        );
        assert_eq!(s.backend.count_echoed("/withdrawn"), 0);
        assert_eq!(
            s.call("/after", Some(&s.token(&new))).await.status,
            StatusCode::OK
        );
    })
    .await
    .expect("test finishes in time");
}

/// A key rotated in moments after a fetch: tokens naming it, many at once, wait for the next
/// fetch the pause between fetches allows (or the one under way) instead of being refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_naming_a_new_key_just_after_a_fetch_wait_for_the_next_one() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let old = SigningKey::rs256("old");
        let new = SigningKey::es256("new");
        // The defaults: a pause between fetches as long as the wait for one.
        let s = setup(&[&old], |a| {
            a.min_refetch = AccessSettings::default().min_refetch
        })
        .await;
        assert_eq!(
            s.call("/before", Some(&s.token(&old))).await.status,
            StatusCode::OK
        );
        s.jwks.publish(&[&old, &new]);
        let token = s.token(&new);
        let calls = (0..10).map(|i| {
            let (s, token) = (&s, &token);
            async move { s.call(&format!("/rotated/{i}"), Some(token)).await.status }
        });
        let statuses = futures_util::future::join_all(calls).await;
        assert_eq!(statuses, vec![StatusCode::OK; 10]);
        // One fetch served them all. A request on the other worker that looks just after that
        // fetch began asks for the one after it (it passes as soon as the key is stored, but
        // the task still makes the fetch asked for), so at most one more fetch follows, never
        // one per token.
        let fetches = s.jwks.fetches();
        assert!((2..=3).contains(&fetches), "{fetches} fetches");
    })
    .await
    .expect("test finishes in time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_key_endpoint_down_cached_keys_serve_until_the_stale_period_ends() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let key = SigningKey::es256("k");
        let s = setup(&[&key], |a| {
            a.refresh = Duration::from_millis(100);
            a.max_stale = Duration::from_secs(3);
        })
        .await;
        assert_eq!(
            s.call("/up", Some(&s.token(&key))).await.status,
            StatusCode::OK
        );

        s.jwks.set_down(true);
        let before = s.jwks.fetches();
        wait_until(|| s.jwks.fetches() > before + 1).await;
        // Fetches fail now, yet a token never seen before verifies against the cached keys.
        let fresh = key.sign(&claims(&s.issuer(), &[AUD], -5, 3000));
        assert_eq!(s.call("/down", Some(&fresh)).await.status, StatusCode::OK);

        // Past the stale period every request is refused, remembered tokens too.
        let denied = loop {
            let reply = s.call("/stale", Some(&fresh)).await;
            if reply.status != StatusCode::OK {
                break reply;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert_denied(&denied, "stale keys");
        let served = s.backend.count_echoed("/stale");
        assert_denied(&s.call("/stale", Some(&fresh)).await, "stale keys");
        assert_eq!(s.backend.count_echoed("/stale"), served);

        // The endpoint comes back: the next fetch restores service.
        s.jwks.set_down(false);
        loop {
            if s.call("/back", Some(&fresh)).await.status == StatusCode::OK {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("test finishes in time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_team_whose_keys_were_never_fetched_fails_closed() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let key = SigningKey::rs256("k");
        let s = setup(&[&key], |a| a.fetch_timeout = Duration::from_secs(2)).await;
        // Another proxy whose team domain answers nothing useful: no keys, ever.
        let down = JwksServer::start().await.expect("starts");
        down.set_down(true);
        let proxy = proxy_with(ServerOptions {
            auth_token: Some(TOKEN.into()),
            access: AccessSettings {
                team_domain: down.team_domain(),
                ..AccessSettings::default()
            },
            ..ServerOptions::default()
        })
        .await;
        let doc = json!({"rules": [{"backends": [{"url": url(s.backend.http_addr())}],
            "access": {"teamName": TEAM, "audiences": [AUD]}}]});
        assert_eq!(
            push(&s.http, proxy.admin_addr(), &doc).await.status,
            StatusCode::OK
        );
        let token = key.sign(&claims(&down.issuer(TEAM), &[AUD], -10, 3600));
        let reply = get(
            &s.http,
            proxy.data_addr(),
            "any.example.com",
            "/never",
            &[(TOKEN_HEADER, &token)],
        )
        .await;
        assert_denied(&reply, "no keys");
        assert_eq!(s.backend.count_echoed("/never"), 0);
    })
    .await
    .expect("test finishes in time");
}

/// `/metrics` counts each refused request under its reason, the team's key fetches by
/// outcome, and the age of the team's keys: zero after a fetch, growing while fetches fail,
/// until the stale keys stop serving and requests are refused as `keys_unavailable`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_key_fetches_and_key_age_are_on_metrics() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let key = SigningKey::rs256("current");
        let s = setup(&[&key], |a| {
            a.refresh = Duration::from_millis(200);
            a.max_stale = Duration::from_secs(2);
        })
        .await;
        let issuer = s.issuer();
        let admin = s.proxy.admin_addr();
        let refusals = |reason: &str| {
            let series = format!("cftunnel_proxy_access_refusals_total{{reason=\"{reason}\"}}");
            let http = s.http.clone();
            async move { metric(&http, admin, &series).await }
        };
        let fetches = |outcome: &str| {
            let series = format!(
                "cftunnel_proxy_access_key_fetches_total{{team=\"{TEAM}\",outcome=\"{outcome}\"}}"
            );
            let http = s.http.clone();
            async move { metric(&http, admin, &series).await }
        };
        let age_series = format!("cftunnel_proxy_access_keys_age_seconds{{team=\"{TEAM}\"}}");
        // Every reason is listed from the start, at zero.
        assert_eq!(refusals("expired").await, Some(0.0));

        assert_eq!(
            s.call("/ok", Some(&s.token(&key))).await.status,
            StatusCode::OK
        );
        let impostor = SigningKey::rs256("current");
        let cases: [(&str, Option<String>, &str); 5] = [
            ("/missing", None, "missing"),
            ("/garbage", Some("not-a-jwt".to_owned()), "malformed"),
            (
                "/expired",
                Some(key.sign(&claims(&issuer, &[AUD], -7200, -600))),
                "expired",
            ),
            (
                "/audience",
                Some(key.sign(&claims(&issuer, &["other"], -10, 3600))),
                "audience",
            ),
            (
                "/forged",
                Some(impostor.sign(&claims(&issuer, &[AUD], -10, 3600))),
                "signature",
            ),
        ];
        for (path, token, _) in &cases {
            assert_denied(&s.call(path, token.as_deref()).await, path);
        }
        // The audience refusal twice: the second from the remembered verdict, counted too.
        assert_denied(&s.call("/audience", cases[3].1.as_deref()).await, "again");
        for (path, _, reason) in &cases {
            let times = if *path == "/audience" { 2.0 } else { 1.0 };
            assert_eq!(refusals(reason).await, Some(times), "{reason}");
        }
        assert_eq!(refusals("keys_unavailable").await, Some(0.0));
        assert!(fetches("ok").await.is_some_and(|n| n >= 1.0));
        assert_eq!(fetches("error").await, Some(0.0));
        assert_eq!(metric(&s.http, admin, &age_series).await, Some(0.0));

        // The key endpoint goes down: failed fetches are counted and the keys age.
        s.jwks.set_down(true);
        loop {
            let failed = fetches("error").await.unwrap_or(0.0);
            let age = metric(&s.http, admin, &age_series).await.unwrap_or(0.0);
            if failed >= 1.0 && age > 0.0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Past the stale period the team's requests are refused as keys_unavailable.
        let fresh = key.sign(&claims(&issuer, &[AUD], -5, 3000));
        loop {
            if s.call("/stale", Some(&fresh)).await.status == StatusCode::FORBIDDEN {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(refusals("keys_unavailable").await.is_some_and(|n| n >= 1.0));
        let age = metric(&s.http, admin, &age_series).await;
        assert!(age.is_some_and(|a| a >= 1.0), "{age:?}");
    })
    .await
    .expect("test finishes in time");
}

/// Servers that map `_` and `-` in header names to one CGI/WSGI key (Werkzeug, older gunicorn
/// and Puma) would read a client's `cf_access_authenticated_user_email` as the address the
/// proxy vouches for, and `cf_access_jwt_assertion` as the token: on a rule with a
/// requirement no spelling of the Access headers but the hyphenated one reaches the backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn underscore_spellings_of_the_access_headers_never_reach_the_backend() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let key = SigningKey::rs256("k");
        let s = setup(&[&key], |_| {}).await;
        let email = "cf-access-authenticated-user-email";
        let mut service = claims(&s.issuer(), &[AUD], -10, 3600);
        service.as_object_mut().map(|c| c.remove("email"));
        let mut ceo = claims(&s.issuer(), &[AUD], -10, 3600);
        ceo["email"] = json!("ceo@example.com");
        let forged = SigningKey::rs256("k").sign(&ceo);
        let spoofed = [
            "cf_access_authenticated_user_email",
            "CF_Access_Authenticated_User_Email",
            "cf-access_authenticated-user_email",
            "cf_access_jwt_assertion",
        ];
        for (path, token, expected) in [
            ("/service", key.sign(&service), None),
            ("/user", s.token(&key), Some("user@example.com")),
        ] {
            let mut headers = vec![(TOKEN_HEADER, token.as_str())];
            for name in &spoofed[..3] {
                headers.push((name, "ceo@example.com"));
            }
            headers.push((spoofed[3], forged.as_str()));
            let reply = get(
                &s.http,
                s.proxy.data_addr(),
                "app.example.com",
                path,
                &headers,
            )
            .await;
            assert_eq!(reply.status, StatusCode::OK, "{path}");
            assert_eq!(reply.seen_header(email).as_deref(), expected, "{path}");
            assert_eq!(
                reply.seen_header(TOKEN_HEADER).as_deref(),
                Some(token.as_str()),
                "{path}"
            );
            for name in spoofed {
                assert_eq!(reply.seen_header(name), None, "{path}: {name}");
            }
        }
    })
    .await
    .expect("test finishes in time");
}

/// A key rotated in while a fetch is under way that read the set before it: a token naming
/// the new key does not settle for that fetch's answer, it waits for one that began after it
/// asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_naming_a_key_published_during_a_fetch_waits_for_the_next_fetch() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let old = SigningKey::rs256("old");
        let new = SigningKey::es256("new");
        let s = setup(&[&old], |_| {}).await;
        assert_eq!(
            s.call("/before", Some(&s.token(&old))).await.status,
            StatusCode::OK
        );
        // Each answer of the endpoint now reaches the proxy well within the fetch bound (5 s),
        // yet late enough for the steps below to happen while a fetch is under way.
        s.front.set_delay(Duration::from_millis(1500));
        let probe = s.token(&SigningKey::rs256("probe"));
        let rotated = s.token(&new);
        let before = s.jwks.fetches();
        let (probed, rotated) = futures_util::future::join(
            // An unknown key id starts a fetch, which reads the set without the new key...
            s.call("/probe", Some(&probe)),
            async {
                wait_until(|| s.jwks.fetches() > before).await;
                // ...then the new key is published, and a token naming it arrives while that
                // fetch's answer is still on its way.
                s.jwks.publish(&[&old, &new]);
                s.call("/rotated", Some(&rotated)).await
            },
        )
        .await;
        assert_denied(&probed, "probe");
        assert_eq!(rotated.status, StatusCode::OK);
        assert_eq!(s.backend.count_echoed("/rotated"), 1);
    })
    .await
    .expect("test finishes in time");
}

/// A rule's request timeout counts from the request's arrival, so a check waiting for the
/// team's keys (a token naming a key id not yet fetched, the key endpoint slow) is cut off at
/// it with 504, rather than holding the request for as long as the fetch takes.
#[tokio::test]
async fn the_request_timeout_bounds_a_check_waiting_for_keys() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let key = SigningKey::rs256("key");
        let s = setup(&[&key], |_| {}).await;
        let doc = json!({"rules": [
            {"hostnames": ["app.example.com"], "name": "team/app/0",
             "backends": [{"url": url(s.backend.http_addr())}],
             "access": {"teamName": TEAM, "audiences": [AUD]},
             "timeouts": {"request": "300ms"}},
        ]});
        assert_eq!(
            push(&s.http, s.proxy.admin_addr(), &doc).await.status,
            StatusCode::OK
        );
        s.front.set_delay(Duration::from_millis(3000));
        let unknown = s.token(&SigningKey::rs256("not-yet-fetched"));
        let started = std::time::Instant::now();
        let reply = s.call("/slow-keys", Some(&unknown)).await;
        assert_eq!(reply.status, StatusCode::GATEWAY_TIMEOUT);
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(s.backend.count_echoed("/slow-keys"), 0);
    })
    .await
    .expect("test finishes in time");
}

/// Past the stale period a request does not wait for the fetch task's next retry, which after a
/// long outage is a whole refresh period away: it asks for a fetch (at most one per pause), so
/// the endpoint's return is seen within moments.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_keys_are_fetched_again_soon_after_the_endpoint_returns() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let key = SigningKey::es256("k");
        let s = setup(&[&key], |a| {
            // The next scheduled fetch is a minute away, as when retries have backed off to
            // the refresh period.
            a.refresh = Duration::from_secs(60);
            a.max_stale = Duration::from_secs(2);
        })
        .await;
        let token = s.token(&key);
        assert_eq!(s.call("/up", Some(&token)).await.status, StatusCode::OK);
        s.jwks.set_down(true);
        loop {
            let reply = s.call("/stale", Some(&token)).await;
            if reply.status != StatusCode::OK {
                assert_denied(&reply, "stale keys");
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        s.jwks.set_down(false);
        tokio::time::timeout(Duration::from_secs(5), async {
            while s.call("/back", Some(&token)).await.status != StatusCode::OK {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await
        .expect("served again within seconds of the endpoint's return");
    })
    .await
    .expect("test finishes in time");
}

/// A key endpoint that takes connections and never answers: each fetch runs to its bound
/// (5 s). Once one has failed, with no keys ever fetched, requests are refused at once
/// rather than each held for another fetch likely to fail the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_key_endpoint_silent_requests_are_refused_at_once_after_a_failed_fetch() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let key = SigningKey::rs256("k");
        let silent = TcpListener::bind("127.0.0.1:0").await.expect("binds");
        let addr = silent.local_addr().expect("address");
        let _silent = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((conn, _)) = silent.accept().await {
                held.push(conn);
            }
        });
        let bound = AccessSettings::default().fetch_timeout;
        assert_eq!(bound, Duration::from_secs(5));
        let proxy = proxy_with(ServerOptions {
            auth_token: Some(TOKEN.into()),
            access: AccessSettings {
                team_domain: format!("http://{addr}/{{team}}"),
                ..AccessSettings::default()
            },
            ..ServerOptions::default()
        })
        .await;
        let backend = echo("backend").await;
        let http = client();
        let doc = json!({"rules": [{"backends": [{"url": url(backend.http_addr())}],
            "access": {"teamName": TEAM, "audiences": [AUD]}}]});
        assert_eq!(
            push(&http, proxy.admin_addr(), &doc).await.status,
            StatusCode::OK
        );
        let token = key.sign(&claims(&format!("http://{addr}/{TEAM}"), &[AUD], -10, 3600));
        let data = proxy.data_addr();
        let call = |path: &'static str| {
            let (http, token) = (&http, &token);
            async move {
                get(
                    http,
                    data,
                    "any.example.com",
                    path,
                    &[(TOKEN_HEADER, token)],
                )
                .await
            }
        };
        // The first request waits for the team's first fetch, which runs out of time.
        assert_denied(&call("/first").await, "first fetch");
        // Then each is refused well within the bound: a generous limit, far from it.
        for path in ["/again/1", "/again/2", "/again/3"] {
            let started = tokio::time::Instant::now();
            let reply = call(path).await;
            let took = started.elapsed();
            assert_denied(&reply, path);
            assert!(took < Duration::from_secs(2), "{path} took {took:?}");
        }
        assert_eq!(backend.count_echoed("/first"), 0);
    })
    .await
    .expect("test finishes in time");
}
