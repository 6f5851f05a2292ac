//! The mock's admin API on its HTTP listener, for demos and load tests:
//!
//! - `GET /__mock-edge/connections`: JSON list of connector connections;
//! - `PUT /__mock-edge/config?version=N` with a JSON body: make it the
//!   tunnel's configuration, pushed to every serving connection and to every
//!   connection that registers later (409 for a locally managed tunnel, whose
//!   connectors bring their own configuration);
//! - `PUT /__mock-edge/registration-error?cause=TEXT` (empty cause: accept
//!   registrations again).

use std::time::Duration;

use http::{Request, StatusCode};
use http_body_util::{BodyExt as _, Limited};
use hyper::body::Incoming;

use super::answer::EdgeBody;
use super::forward::full;
use super::Inner;
use cftunnel_tunnel::EdgeRefusal;

pub(super) const PREFIX: &str = "/__mock-edge/";
const MAX_CONFIG: usize = 8 * 1024 * 1024;

fn query_param(req: &Request<Incoming>, key: &str) -> Option<String> {
    req.uri().query()?.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        (k == key).then(|| v.replace("%20", " ").replace('+', " "))
    })
}

pub(super) async fn handle(inner: &Inner, req: Request<Incoming>) -> http::Response<EdgeBody> {
    let path = req.uri().path().trim_start_matches(PREFIX).to_owned();
    match (req.method().as_str(), path.as_str()) {
        ("GET", "connections") => {
            let list = inner
                .with_state(|s| {
                    s.conns
                        .values()
                        .map(|c| {
                            serde_json::json!({
                                "id": c.info.id,
                                "protocol": format!("{:?}", c.info.protocol),
                                "connIndex": c.info.conn_index,
                                "registered": c.info.registered,
                                "draining": c.info.draining,
                                "requests": c.info.requests,
                                "keyExchangeGroup": c
                                    .info
                                    .key_exchange_group
                                    .map(|g| format!("{g:?}")),
                            })
                        })
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default();
            full(StatusCode::OK, serde_json::Value::from(list).to_string())
        }
        ("PUT", "config") if !inner.remotely_managed => full(
            StatusCode::CONFLICT,
            "the tunnel is locally managed: its connectors bring their own configuration\n",
        ),
        ("PUT", "config") => {
            let Some(version) = query_param(&req, "version").and_then(|v| v.parse::<i32>().ok())
            else {
                return full(
                    StatusCode::BAD_REQUEST,
                    "version query parameter required\n",
                );
            };
            let body = match Limited::new(req.into_body(), MAX_CONFIG).collect().await {
                Ok(b) => b.to_bytes(),
                Err(_) => return full(StatusCode::PAYLOAD_TOO_LARGE, "config too large\n"),
            };
            if let Err(e) = serde_json::from_slice::<serde::de::IgnoredAny>(&body) {
                return full(
                    StatusCode::BAD_REQUEST,
                    format!("the configuration is not JSON: {e}\n"),
                );
            }
            let results: Vec<_> = inner
                .set_remote_config(version, body)
                .await
                .into_iter()
                .map(|(id, r)| match r {
                    Ok(v) => serde_json::json!({"id": id, "lastAppliedVersion": v}),
                    Err(e) => serde_json::json!({"id": id, "error": e.to_string()}),
                })
                .collect();
            full(StatusCode::OK, serde_json::Value::from(results).to_string())
        }
        ("PUT", "registration-error") => {
            let cause = query_param(&req, "cause").unwrap_or_default();
            let err = if cause.is_empty() {
                None
            } else {
                Some(EdgeRefusal {
                    cause,
                    retry_after: Duration::ZERO,
                    should_retry: true,
                })
            };
            inner.with_state(|s| s.registration_error = err);
            full(StatusCode::NO_CONTENT, "")
        }
        _ => full(StatusCode::NOT_FOUND, "unknown mock edge admin path\n"),
    }
}
