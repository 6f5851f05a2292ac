//! The controller's push of one plane's document to many proxy pods: N real proxies in this
//! process, each with its own authenticated config listener on 127.0.0.1, brought to a document
//! of R rules by the controller's own [`Pusher`] (version probe, one encoding, concurrent
//! `PUT /config`, every answer read). Prints the time of the first push, of a push of a changed
//! document, and of a round that finds every pod current.
//!
//! `cargo run --release -p cftunnel-benches --example push_fanout -- 100 1000`
//! (pods, rules). Every proxy compiles the document itself, so with many rules the time is
//! the proxies' compile spread over the machine's CPUs, not the controller's.

use cftunnel_controller::push::Pusher;
use cftunnel_controller::translate::PlaneKey;
use cftunnel_proxy::{Server, ServerOptions};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

const TOKEN: &str = "bench-token";

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let pods: usize = args
        .next()
        .map_or(100, |a| a.parse().expect("number of pods"));
    let rules: usize = args
        .next()
        .map_or(1_000, |a| a.parse().expect("number of rules"));
    let mut servers = Vec::with_capacity(pods);
    for _ in 0..pods {
        let server = Server::start(
            ServerOptions {
                auth_token: Some(TOKEN.to_owned()),
                ..ServerOptions::default()
            },
            None,
        )
        .await
        .expect("proxy");
        servers.push(server);
    }
    let addrs: Vec<SocketAddr> = servers.iter().map(Server::admin_addr).collect();
    let plane = PlaneKey::Shared;
    let mut pusher = Pusher::new(Duration::from_secs(30), 3);
    let doc = cftunnel_benches::config(rules);
    let mut changed = doc.clone();
    if let Some(rule) = changed.rules.first_mut() {
        rule.name = Some("changed".to_owned());
    }

    let mut timed = async |doc: &cftunnel_config::Config| {
        let started = Instant::now();
        let outcome = pusher.sync(&plane, doc, TOKEN, &addrs).await;
        let took = started.elapsed();
        assert!(outcome.all_current(), "every pod took it: {outcome:?}");
        took
    };
    let first = timed(&doc).await;
    let again = timed(&changed).await;
    let current = timed(&changed).await;
    println!(
        "{pods} pods, {rules} rules: first push {:.1} ms, changed document {:.1} ms, all current {:.1} ms",
        ms(first),
        ms(again),
        ms(current)
    );
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
