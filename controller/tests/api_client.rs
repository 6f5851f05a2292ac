//! The controller's Kubernetes client (`runtime::api_client`) over HTTP on loopback, against
//! the test API server and against a peer that stops mid-body: a call fails once it has waited
//! the bound for its whole response, a watch once it has waited it for its response head, with
//! an error naming the call and the bound; a watch whose head came stays open however quiet.

use std::time::{Duration, Instant};

use cftunnel_controller::cli::{Cli, Command};
use cftunnel_controller::runtime::api_client::{self, Awaited, RequestTimeoutError};
use cftunnel_controller::runtime::REQUIRED_RBAC;
use cftunnel_testkit::kube_api::ApiServer;
use clap::Parser;
use futures_util::{FutureExt, StreamExt, TryStreamExt};
use http::Method;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{Api, Patch, PatchParams, WatchEvent, WatchParams};
use kube::ResourceExt;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The bound of the clients here.
const BOUND: Duration = Duration::from_millis(500);
/// How much later than the bound a call may end: a busy machine is slow to wake a timer.
const MARGIN: Duration = Duration::from_secs(3);
/// How long a test may wait for something that must happen.
const PATIENCE: Duration = Duration::from_secs(5);

const SEED: &str = "\
apiVersion: v1
kind: Namespace
metadata: {name: tenant-a}
---
apiVersion: v1
kind: Secret
metadata: {name: token, namespace: tenant-a}
stringData: {token: t}
";

/// A client for `url` as the controller builds one, with [`BOUND`].
fn client(url: &str) -> kube::Client {
    let config = kube::Config::new(url.parse().expect("url"));
    api_client::from_config(config, BOUND).expect("client")
}

/// The bound's error inside a failed call's, if that is why it failed.
fn timed_out(e: &kube::Error) -> Option<&RequestTimeoutError> {
    match e {
        kube::Error::Service(e) => e.downcast_ref(),
        _ => None,
    }
}

/// The bound's error for a call but a watch.
fn timeout_of(method: Method, path: &str) -> RequestTimeoutError {
    RequestTimeoutError {
        method,
        path: path.to_owned(),
        awaited: Awaited::WholeResponse,
        bound: BOUND,
    }
}

/// Runs a call that must fail on the bound; checks it took the bound, and no more than
/// [`MARGIN`] longer.
async fn fails_on_the_bound<T: std::fmt::Debug>(
    call: impl std::future::Future<Output = kube::Result<T>>,
) -> kube::Error {
    let started = Instant::now();
    let err = tokio::time::timeout(BOUND + MARGIN, call)
        .await
        .expect("the call ends within the bound and the margin")
        .expect_err("the call fails");
    let waited = started.elapsed();
    assert!(waited >= BOUND, "failed after {waited:?}, before the bound");
    err
}

#[tokio::test]
async fn a_call_the_api_server_does_not_answer_fails_after_the_bound() {
    let api = ApiServer::builder()
        .rbac(REQUIRED_RBAC)
        .seed(SEED)
        .start()
        .await;
    let secrets: Api<Secret> = Api::namespaced(client(&api.base_url()), "tenant-a");
    secrets.get("token").await.expect("an answered call");

    let hold = api.hold(|c| c.kind == "Secret" && matches!(c.method, "GET" | "PATCH"));
    let err = fails_on_the_bound(secrets.get("token")).await;
    assert_eq!(
        timed_out(&err),
        Some(&timeout_of(
            Method::GET,
            "/api/v1/namespaces/tenant-a/secrets/token"
        )),
        "{err}"
    );
    let text = err.to_string();
    assert!(
        text.contains("GET /api/v1/namespaces/tenant-a/secrets/token") && text.contains("500ms"),
        "{text}"
    );
    let patch = json!({"metadata": {"labels": {"a": "b"}}});
    let err =
        fails_on_the_bound(secrets.patch("token", &PatchParams::default(), &Patch::Merge(&patch)))
            .await;
    assert_eq!(
        timed_out(&err),
        Some(&timeout_of(
            Method::PATCH,
            "/api/v1/namespaces/tenant-a/secrets/token"
        )),
        "{err}"
    );
    hold.arrived(2).await;

    // Once the API server answers again, so do calls on the same client.
    hold.release();
    let secret = tokio::time::timeout(PATIENCE, secrets.get("token"))
        .await
        .expect("in time")
        .expect("answered again");
    assert_eq!(secret.name_any(), "token");
}

/// The response head arrives, its body stops halfway: the call fails on the bound all the same,
/// and the client closes the connection rather than keep it for another call.
#[tokio::test]
async fn a_response_whose_body_stops_fails_after_the_bound() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let peer = tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.expect("accept");
        let mut request = Vec::new();
        let mut buf = [0u8; 4096];
        while !request.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = stream.read(&mut buf).await.expect("read");
            assert!(n > 0, "the request head");
            request.extend_from_slice(&buf[..n]);
        }
        stream
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 200\r\n\r\n{\"apiVersion\": \"v1\", ")
            .await
            .expect("write");
        // Nothing more, until the client closes the connection.
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    });
    let secrets: Api<Secret> = Api::namespaced(client(&format!("http://{addr}")), "tenant-a");
    let err = fails_on_the_bound(secrets.get("token")).await;
    assert_eq!(
        timed_out(&err),
        Some(&timeout_of(
            Method::GET,
            "/api/v1/namespaces/tenant-a/secrets/token"
        )),
        "{err}"
    );
    tokio::time::timeout(PATIENCE, peer)
        .await
        .expect("the client closes the connection")
        .expect("the peer");
}

/// A watch whose response head does not come (a pooled connection that went silent) fails on
/// the bound like any call, naming it; once the API server answers again, a watch starts.
#[tokio::test]
async fn a_watch_whose_response_head_does_not_come_fails_after_the_bound() {
    let api = ApiServer::builder()
        .rbac(REQUIRED_RBAC)
        .seed(SEED)
        .start()
        .await;
    let namespaces: Api<Namespace> = Api::all(client(&api.base_url()));
    let since = api.resource_version().to_string();
    let params = WatchParams::default().timeout(60);

    // The only namespace GETs here are the watches.
    let hold = api.hold(|c| c.method == "GET" && c.kind == "Namespace");
    let err = fails_on_the_bound(namespaces.watch(&params, &since).map(|r| r.map(|_| ()))).await;
    hold.arrived(1).await;
    assert_eq!(
        timed_out(&err),
        Some(&RequestTimeoutError {
            awaited: Awaited::Head,
            ..timeout_of(Method::GET, "/api/v1/namespaces")
        }),
        "{err}"
    );
    let text = err.to_string();
    assert!(
        text.contains("GET /api/v1/namespaces: no response head") && text.contains("500ms"),
        "{text}"
    );

    hold.release();
    let mut events = tokio::time::timeout(PATIENCE, namespaces.watch(&params, &since))
        .await
        .expect("in time")
        .expect("the watch starts")
        .boxed();
    api.put(json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": "tenant-b"},
    }));
    let event = tokio::time::timeout(PATIENCE, events.try_next())
        .await
        .expect("the change in time")
        .expect("no error on the watch")
        .expect("the watch is open");
    assert!(matches!(event, WatchEvent::Added(_)), "{event:?}");
}

/// A watch that sees no event for longer than the bound (while a call on the same client fails
/// on it) stays open: the next change arrives on it.
#[tokio::test]
async fn a_watch_quiet_for_longer_than_the_bound_stays_open() {
    let api = ApiServer::builder()
        .rbac(REQUIRED_RBAC)
        .seed(SEED)
        .start()
        .await;
    let client = client(&api.base_url());
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let since = api.resource_version().to_string();
    let started = Instant::now();
    let mut events = namespaces
        .watch(&WatchParams::default().timeout(60), &since)
        .await
        .expect("the watch starts")
        .boxed();

    let hold = api.hold(|c| c.method == "GET" && c.kind == "Secret");
    let secrets: Api<Secret> = Api::namespaced(client, "tenant-a");
    let err = fails_on_the_bound(secrets.get("token")).await;
    assert!(timed_out(&err).is_some(), "{err}");
    drop(hold);
    let quiet = 2 * BOUND;
    tokio::time::sleep(quiet.saturating_sub(started.elapsed())).await;
    assert!(
        events.next().now_or_never().is_none(),
        "nothing on the watch, not even an error"
    );

    api.put(json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": "tenant-b"},
    }));
    let event = tokio::time::timeout(PATIENCE, events.try_next())
        .await
        .expect("the change in time")
        .expect("no error on the watch")
        .expect("the watch is open");
    match event {
        WatchEvent::Added(namespace) => assert_eq!(namespace.name_any(), "tenant-b"),
        other => panic!("expected the namespace added, got {other:?}"),
    }
    assert!(started.elapsed() >= quiet);
}

#[test]
fn the_bound_is_a_run_flag_of_whole_seconds() {
    let timeout = |args: &[&str]| {
        let line = ["cftunnel-controller", "run"].iter().chain(args);
        Cli::try_parse_from(line).map(|cli| match cli.command {
            Command::Run(run) => run.api_request_timeout_seconds,
            _ => panic!("not the run command"),
        })
    };
    assert_eq!(
        timeout(&[]).expect("the default"),
        api_client::DEFAULT_REQUEST_TIMEOUT.as_secs()
    );
    assert_eq!(
        timeout(&["--api-request-timeout-seconds", "5"]).expect("5 s"),
        5
    );
    assert!(timeout(&["--api-request-timeout-seconds", "0"]).is_err());
}
