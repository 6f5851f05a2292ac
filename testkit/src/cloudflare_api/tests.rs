use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use serde_json::{json, Value};

use super::{CloudflareApi, PutEvent};

const ACCOUNT: &str = "acct";
const TUNNEL: &str = "3b1f5c2e-8d4a-4e6b-9f0a-7c2d1e5b4a39";
const TOKEN: &str = "cf-token";

/// What a request got back: the status, `Retry-After` if any, and the body as JSON.
struct Answer {
    status: StatusCode,
    retry_after: Option<String>,
    body: Value,
}

/// Sends one request over a connection of its own, bearing `token` if any.
async fn send(
    api: &CloudflareApi,
    method: Method,
    path: &str,
    token: Option<&str>,
    body: &Value,
) -> Answer {
    let stream = tokio::net::TcpStream::connect(api.addr)
        .await
        .expect("the stand-in accepts connections");
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .expect("HTTP/1 handshake");
    tokio::spawn(connection);
    let mut request = Request::builder()
        .method(method)
        .uri(format!("{}{path}", api.base()))
        .header(hyper::header::HOST, api.addr.to_string());
    if let Some(token) = token {
        request = request.header(hyper::header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let body = if body.is_null() {
        Bytes::new()
    } else {
        Bytes::from(body.to_string())
    };
    let response = sender
        .send_request(request.body(Full::new(body)).expect("a valid request"))
        .await
        .expect("an answer");
    let status = response.status();
    let retry_after = response
        .headers()
        .get(hyper::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let bytes = response
        .into_body()
        .collect()
        .await
        .expect("the whole body")
        .to_bytes();
    Answer {
        status,
        retry_after,
        body: serde_json::from_slice(&bytes).expect("a JSON envelope"),
    }
}

fn configurations() -> String {
    format!("/accounts/{ACCOUNT}/cfd_tunnel/{TUNNEL}/configurations")
}

fn ingress(rules: Value) -> Value {
    json!({"config": {"ingress": rules}})
}

fn catch_all() -> Value {
    json!({"service": "http_status:404"})
}

async fn allowed() -> CloudflareApi {
    let api = CloudflareApi::start().await;
    api.allow(ACCOUNT, TOKEN);
    api
}

#[tokio::test]
async fn accepted_configurations_are_versioned_from_one_and_read_back() {
    let api = allowed().await;
    let first = ingress(json!([{"hostname": "a.example.com", "service": "http://a"}, catch_all()]));
    let put = send(&api, Method::PUT, &configurations(), Some(TOKEN), &first).await;
    assert_eq!(put.status, StatusCode::OK);
    assert_eq!(put.body["success"], json!(true));
    assert_eq!(put.body["result"]["version"], json!(1));

    let second = ingress(json!([catch_all()]));
    let put = send(&api, Method::PUT, &configurations(), Some(TOKEN), &second).await;
    assert_eq!(put.body["result"]["version"], json!(2));

    let got = send(
        &api,
        Method::GET,
        &configurations(),
        Some(TOKEN),
        &Value::Null,
    )
    .await;
    assert_eq!(got.status, StatusCode::OK);
    assert_eq!(
        got.body["result"],
        json!({"tunnel_id": TUNNEL, "account_id": ACCOUNT, "version": 2,
               "config": second["config"], "source": "cloudflare"})
    );
    assert_eq!(
        api.config(ACCOUNT, TUNNEL),
        Some((2, second["config"].clone()))
    );
    assert_eq!((api.requests(), api.writes()), (3, 2));
}

#[tokio::test]
async fn an_ingress_list_without_a_final_catch_all_is_refused_with_1056_and_not_stored() {
    let api = allowed().await;
    let last_has_a_path = ingress(json!([{"path": "/api", "service": "http://a"}]));
    let put = send(
        &api,
        Method::PUT,
        &configurations(),
        Some(TOKEN),
        &last_has_a_path,
    )
    .await;
    assert_eq!(put.status, StatusCode::BAD_REQUEST);
    assert_eq!(put.body["success"], json!(false));
    assert_eq!(put.body["errors"][0]["code"], json!(1056));

    let no_ingress = json!({"config": {}});
    let put = send(
        &api,
        Method::PUT,
        &configurations(),
        Some(TOKEN),
        &no_ingress,
    )
    .await;
    assert_eq!(put.body["errors"][0]["code"], json!(1001));

    let got = send(
        &api,
        Method::GET,
        &configurations(),
        Some(TOKEN),
        &Value::Null,
    )
    .await;
    assert_eq!(got.status, StatusCode::NOT_FOUND);
    assert_eq!(api.config(ACCOUNT, TUNNEL), None);
    assert_eq!(api.writes(), 0);
}

#[tokio::test]
async fn a_missing_or_another_accounts_token_is_an_authentication_error() {
    let api = allowed().await;
    api.allow("other", "other-token");
    let body = ingress(json!([catch_all()]));
    for token in [None, Some("other-token")] {
        let put = send(&api, Method::PUT, &configurations(), token, &body).await;
        assert_eq!(put.status, StatusCode::FORBIDDEN, "token {token:?}");
        assert_eq!(
            put.body["errors"],
            json!([{"code": 10000, "message": "Authentication error"}])
        );
    }
    assert_eq!((api.requests(), api.writes()), (2, 0));
}

#[tokio::test]
async fn a_rate_limit_answers_the_next_request_only_with_429_and_retry_after() {
    let api = allowed().await;
    api.rate_limit_next(7);
    let body = ingress(json!([catch_all()]));
    let limited = send(&api, Method::PUT, &configurations(), Some(TOKEN), &body).await;
    assert_eq!(limited.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(limited.retry_after.as_deref(), Some("7"));
    assert_eq!(limited.body["errors"][0]["code"], json!(10429));

    let served = send(&api, Method::PUT, &configurations(), Some(TOKEN), &body).await;
    assert_eq!(served.status, StatusCode::OK);
    assert_eq!(served.retry_after, None);
    assert_eq!((api.requests(), api.writes()), (2, 1));
}

#[tokio::test]
async fn the_token_endpoint_answers_a_known_tunnels_connector_token_and_1003_otherwise() {
    let api = allowed().await;
    api.add_tunnel(ACCOUNT, TUNNEL, "eyJh...");
    let path = format!("/accounts/{ACCOUNT}/cfd_tunnel/{TUNNEL}/token");
    let got = send(&api, Method::GET, &path, Some(TOKEN), &Value::Null).await;
    assert_eq!(got.status, StatusCode::OK);
    assert_eq!(got.body["result"], json!("eyJh..."));

    let unknown = format!("/accounts/{ACCOUNT}/cfd_tunnel/unknown/token");
    let got = send(&api, Method::GET, &unknown, Some(TOKEN), &Value::Null).await;
    assert_eq!(got.status, StatusCode::NOT_FOUND);
    assert_eq!(got.body["errors"][0]["code"], json!(1003));
}

#[tokio::test]
async fn a_path_outside_the_tunnel_endpoints_is_not_routed() {
    let api = allowed().await;
    let got = send(&api, Method::GET, "/zones", Some(TOKEN), &Value::Null).await;
    assert_eq!(got.status, StatusCode::NOT_FOUND);
    assert_eq!(got.body["errors"][0]["code"], json!(7003));
}

/// A slow `PUT` whose client gives up still lands, after a later one: what a request already
/// sent does at a real API server.
#[tokio::test]
async fn a_slow_put_lands_even_if_its_client_goes_away() {
    let api = allowed().await;
    api.slow_next_put(std::time::Duration::from_millis(300));
    let older =
        ingress(json!([{"hostname": "old.example.com", "service": "http://a"}, catch_all()]));
    let gave_up = tokio::time::timeout(
        std::time::Duration::from_millis(100),
        send(&api, Method::PUT, &configurations(), Some(TOKEN), &older),
    )
    .await;
    assert!(gave_up.is_err(), "not answered yet");
    let newer = ingress(json!([catch_all()]));
    let put = send(&api, Method::PUT, &configurations(), Some(TOKEN), &newer).await;
    assert_eq!(put.status, StatusCode::OK);
    let by = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    while api.put_events().len() < 4 {
        assert!(tokio::time::Instant::now() < by, "{:?}", api.put_events());
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(
        api.put_events(),
        [
            PutEvent::Arrived(1),
            PutEvent::Arrived(2),
            PutEvent::Answered(2),
            PutEvent::Answered(1)
        ]
    );
    assert_eq!(
        api.config(ACCOUNT, TUNNEL),
        Some((2, older["config"].clone())),
        "the older document, applied last"
    );
}
