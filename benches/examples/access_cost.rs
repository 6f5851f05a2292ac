//! What the Cloudflare Access check costs a request: one proxy, one echo backend, two rules
//! that differ only in the check (`open.example` without, `app.example` with), measured in the
//! same run, in alternating rounds over one keep-alive connection each.
//!
//! Three paths: no check; the check with a token already verified (remembered by digest, the
//! steady state of a browser session); the check with a new token on every request (a full
//! RS256 or ES256 signature verification). Prints the median time per request of each and
//! their ratios.
//!
//! `cargo run --release -p cftunnel-benches --example access_cost [requests per round]`

use bytes::Bytes;
use cftunnel_proxy::access::AccessSettings;
use cftunnel_proxy::{Server, ServerOptions};
use cftunnel_testkit::cloudflare_access::{claims, JwksServer, SigningKey, TOKEN_HEADER};
use cftunnel_testkit::echo::{EchoIdentity, EchoServer};
use http_body_util::{BodyExt, Empty};
use std::time::{Duration, Instant};

#[global_allocator]
static GLOBAL: cftunnel_alloc::Mimalloc = cftunnel_alloc::Mimalloc;

const ROUNDS: usize = 7;

type Sender = hyper::client::conn::http1::SendRequest<Empty<Bytes>>;

async fn round(sender: &mut Sender, host: &str, tokens: &[String], n: usize) -> Duration {
    let start = Instant::now();
    for i in 0..n {
        let mut req = http::Request::get("/bench").header("host", host);
        if !tokens.is_empty() {
            req = req.header(TOKEN_HEADER, &tokens[i % tokens.len()]);
        }
        let req = req.body(Empty::new()).expect("request");
        sender.ready().await.expect("connection ready");
        let resp = sender.send_request(req).await.expect("response");
        assert_eq!(resp.status(), 200, "{host}");
        resp.into_body().collect().await.expect("body");
    }
    start.elapsed() / u32::try_from(n).expect("fits")
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .map_or(20_000, |a| a.parse().expect("requests per round"));
    let rsa = SigningKey::rs256("rsa");
    let ec = SigningKey::es256("ec");
    let jwks = JwksServer::start().await.expect("key endpoint");
    jwks.publish(&[&rsa, &ec]);
    let backend = EchoServer::spawn(
        "127.0.0.1".parse().expect("ip"),
        EchoIdentity {
            namespace: "bench".into(),
            pod: "echo".into(),
        },
    )
    .await
    .expect("echo");
    let proxy = Server::start(
        ServerOptions {
            access: AccessSettings {
                team_domain: jwks.team_domain(),
                ..AccessSettings::default()
            },
            ..ServerOptions::default()
        },
        None,
    )
    .await
    .expect("proxy");
    let url = format!("http://{}", backend.http_addr());
    let doc = serde_json::json!({"rules": [
        {"hostnames": ["open.example"], "backends": [{"url": url}]},
        {"hostnames": ["app.example"], "backends": [{"url": url}],
         "access": {"teamName": "acme", "audiences": ["aud"]}},
    ]});
    proxy
        .apply(serde_json::from_value(doc).expect("document"))
        .await
        .expect("applied");
    let issuer = jwks.issuer("acme");
    let token = |key: &SigningKey, i: i64| key.sign(&claims(&issuer, &["aud"], -i, 3600));
    let remembered = vec![token(&rsa, 1)];
    // Distinct tokens (their `nbf` differs), each verified once.
    let fresh = |key: &SigningKey| (0..n as i64).map(|i| token(key, i + 2)).collect::<Vec<_>>();
    let fresh_rsa = fresh(&rsa);
    let fresh_ec = fresh(&ec);

    let (mut open, _a) = cftunnel_testkit::client::connect_http1(proxy.data_addr())
        .await
        .expect("connect");
    let (mut app, _b) = cftunnel_testkit::client::connect_http1(proxy.data_addr())
        .await
        .expect("connect");
    // Warm up both connections, the backend pool and the remembered token.
    round(&mut open, "open.example", &[], 2_000).await;
    round(&mut app, "app.example", &remembered, 2_000).await;

    let (mut none, mut hit) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        none.push(round(&mut open, "open.example", &[], n).await);
        hit.push(round(&mut app, "app.example", &remembered, n).await);
    }
    // Each fresh token once: every request verifies a signature.
    let miss_rsa = round(&mut app, "app.example", &fresh_rsa, n).await;
    let miss_ec = round(&mut app, "app.example", &fresh_ec, n).await;
    let none = median(none);
    let hit = median(hit);
    let ratio = |d: Duration| d.as_secs_f64() / none.as_secs_f64();
    println!("requests per round: {n}, rounds: {ROUNDS} (medians)");
    println!(
        "no check:                 {:>7.2} us/request",
        none.as_secs_f64() * 1e6
    );
    println!(
        "check, remembered token:  {:>7.2} us/request ({:.3}x)",
        hit.as_secs_f64() * 1e6,
        ratio(hit)
    );
    println!(
        "check, new RS256 token:   {:>7.2} us/request ({:.3}x)",
        miss_rsa.as_secs_f64() * 1e6,
        ratio(miss_rsa)
    );
    println!(
        "check, new ES256 token:   {:>7.2} us/request ({:.3}x)",
        miss_ec.as_secs_f64() * 1e6,
        ratio(miss_ec)
    );
}
