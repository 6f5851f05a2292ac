//! A pod's config API as the pushes speak to it: its version and token, a push of the
//! document, the rule a refusal names, and the document it serves.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use cftunnel_config::Config;
use http_body_util::{BodyExt, Full, Limited};
use hyper::StatusCode;
use tracing::Instrument as _;

/// Longest answer read from a pod (the proxy answers with small JSON objects).
const MAX_ANSWER: usize = 64 * 1024;
/// Longest document read back from a pod: the proxy's default limit on what it takes.
const MAX_DOCUMENT: usize = 32 * 1024 * 1024;

/// The document `pod` serves, as it was pushed (`GET /config/document`), its config API behind
/// `token`: for a plane whose last config this controller never saw pushed (it started, or
/// took the lead, after the plane's configuration broke).
///
/// # Errors
/// The pod does not answer, refuses, has no document, or answers something else.
pub async fn served_document(
    pod: SocketAddr,
    token: &str,
    timeout: Duration,
) -> Result<Config, String> {
    let client = Client {
        token,
        previous_token: None,
        timeout,
    };
    let (status, body) = client
        .call(
            pod,
            hyper::Method::GET,
            "/config/document",
            Bytes::new(),
            token,
        )
        .await?;
    if status != StatusCode::OK {
        return Err(refusal("GET /config/document", status, &body));
    }
    serde_json::from_slice(&body).map_err(|e| format!("GET /config/document: unreadable: {e}"))
}

/// What one pod did with one push.
pub(super) enum Put {
    Current,
    Pushed,
    Failed(String),
    /// It refused the rule at this position of the document it was pushed.
    Refused {
        rule: usize,
        reason: String,
    },
    /// The document is larger than it takes (413): at most `limit` bytes, when it says.
    TooLarge {
        limit: Option<usize>,
        reason: String,
    },
}

/// One request at a time to a pod's config API, each on its own connection: pushes are rare,
/// and a fresh connection never hits one the pod has half-closed.
pub(super) struct Client<'a> {
    pub(super) token: &'a str,
    pub(super) previous_token: Option<&'a str>,
    pub(super) timeout: Duration,
}

/// Why a pod's version could not be read.
pub(super) struct Unreached {
    pub(super) reason: String,
    /// It refused every token the plane has.
    pub(super) token_refused: bool,
    /// Its config port refused the connection: nothing listens there.
    pub(super) down: bool,
}

impl Unreached {
    fn other(reason: String) -> Self {
        Self {
            reason,
            token_refused: false,
            down: false,
        }
    }
}

/// Why a call to a pod got no answer.
struct CallFailed {
    reason: String,
    /// The connection was refused: nothing listens on the pod's config port.
    refused: bool,
}

impl From<String> for CallFailed {
    fn from(reason: String) -> Self {
        Self {
            reason,
            refused: false,
        }
    }
}

impl From<CallFailed> for String {
    fn from(failed: CallFailed) -> Self {
        failed.reason
    }
}

impl From<CallFailed> for Unreached {
    fn from(failed: CallFailed) -> Self {
        Self {
            reason: failed.reason,
            token_refused: false,
            down: failed.refused,
        }
    }
}

impl<'a> Client<'a> {
    /// The pod's version, and the token it takes: the current one, else the one before the
    /// last rotation.
    pub(super) async fn version(&self, pod: SocketAddr) -> Result<(i64, &'a str), Unreached> {
        let mut token = self.token;
        let (mut status, mut body) = self
            .call(pod, hyper::Method::GET, "/config", Bytes::new(), token)
            .await
            .map_err(Unreached::from)?;
        if let (StatusCode::UNAUTHORIZED, Some(previous)) = (status, self.previous_token) {
            token = previous;
            (status, body) = self
                .call(pod, hyper::Method::GET, "/config", Bytes::new(), token)
                .await
                .map_err(Unreached::from)?;
        }
        if status != StatusCode::OK {
            return Err(Unreached {
                reason: refusal("GET /config", status, &body),
                token_refused: status == StatusCode::UNAUTHORIZED,
                down: false,
            });
        }
        serde_json::from_slice::<cftunnel_config::api::ConfigState>(&body)
            .map(|s| (s.version, token))
            .map_err(|e| Unreached::other(format!("GET /config: unreadable answer: {e}")))
    }

    pub(super) async fn put(&self, pod: SocketAddr, body: Bytes, token: &str, doc: &Config) -> Put {
        match self
            .call(pod, hyper::Method::PUT, "/config", body, token)
            .await
        {
            Err(failed) => Put::Failed(failed.reason),
            Ok((StatusCode::OK, _)) => Put::Pushed,
            Ok((StatusCode::BAD_REQUEST, answer)) => match refused_rule(&answer, doc) {
                Some((rule, reason)) => Put::Refused {
                    rule,
                    reason: format!("PUT /config: {reason}"),
                },
                None => Put::Failed(refusal("PUT /config", StatusCode::BAD_REQUEST, &answer)),
            },
            Ok((StatusCode::PAYLOAD_TOO_LARGE, answer)) => Put::TooLarge {
                limit: stated_limit(&answer),
                reason: refusal("PUT /config", StatusCode::PAYLOAD_TOO_LARGE, &answer),
            },
            Ok((status, answer)) => Put::Failed(refusal("PUT /config", status, &answer)),
        }
    }

    async fn call(
        &self,
        pod: SocketAddr,
        method: hyper::Method,
        path: &'static str,
        body: Bytes,
        token: &str,
    ) -> Result<(StatusCode, Bytes), CallFailed> {
        let span = tracing::info_span!(
            "config.api",
            otel.name = %format_args!("{method} {path}"),
            otel.kind = "client",
            otel.status_code = tracing::field::Empty,
            otel.status_description = tracing::field::Empty,
            http.request.method = %method,
            server.address = %pod.ip(),
            server.port = i64::from(pod.port()),
            http.response.status_code = tracing::field::Empty,
        );
        let result = self
            .exchange(pod, method, path, body, token)
            .instrument(span.clone())
            .await;
        match &result {
            Ok((status, _)) => {
                span.record("http.response.status_code", i64::from(status.as_u16()));
                if status.as_u16() >= 400 {
                    span.record("otel.status_code", "error");
                }
            }
            Err(failed) => {
                span.record("otel.status_code", "error");
                span.record("otel.status_description", failed.reason.as_str());
            }
        }
        result
    }

    async fn exchange(
        &self,
        pod: SocketAddr,
        method: hyper::Method,
        path: &'static str,
        body: Bytes,
        token: &str,
    ) -> Result<(StatusCode, Bytes), CallFailed> {
        // Answers are small JSON objects, but for the document itself.
        let limit = if path == "/config/document" {
            MAX_DOCUMENT
        } else {
            MAX_ANSWER
        };
        let exchange = async {
            let stream = tokio::net::TcpStream::connect(pod)
                .await
                .map_err(|e| CallFailed {
                    reason: format!("connecting to {pod}: {e}"),
                    refused: e.kind() == std::io::ErrorKind::ConnectionRefused,
                })?;
            let (mut sender, conn) =
                hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                    .await
                    .map_err(|e| CallFailed::from(format!("{pod}: {e}")))?;
            tokio::spawn(conn);
            let req = hyper::Request::builder()
                .method(method)
                .uri(path)
                .header(hyper::header::HOST, pod.to_string())
                .header(hyper::header::AUTHORIZATION, format!("Bearer {token}"))
                .header(hyper::header::CONTENT_TYPE, "application/json")
                .body(Full::new(body))
                .map_err(|e| CallFailed::from(format!("building the request: {e}")))?;
            let res = sender
                .send_request(req)
                .await
                .map_err(|e| CallFailed::from(format!("{pod}: {e}")))?;
            let status = res.status();
            let body = Limited::new(res.into_body(), limit)
                .collect()
                .await
                .map_err(|e| CallFailed::from(format!("{pod}: reading the answer: {e}")))?
                .to_bytes();
            Ok((status, body))
        };
        tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| CallFailed::from(format!("{pod}: no answer within {:?}", self.timeout)))?
    }
}

/// The rule a 400 names, by its position in `doc`, and the pod's reason. The proxy names it
/// in `rule` (and `name`, checked against the document, so an answer about another document is
/// not taken for one about this); a proxy of an earlier release, or one that could not read a
/// rule at all (an unknown filter type), names it only at the start of `error`
/// (`rules[3].filters[0].type: ...`, possibly after `invalid JSON: `).
///
/// The reason goes without the JSON reader's position (` at line 1 column 5120`): that is the
/// rule's place in the document pushed, which moves with every rule before it, not part of why
/// the rule is refused.
fn refused_rule(answer: &[u8], doc: &Config) -> Option<(usize, String)> {
    let answer: serde_json::Value = serde_json::from_slice(answer).ok()?;
    let error = without_position(answer.get("error")?.as_str()?).to_owned();
    let rule = match answer.get("rule").and_then(serde_json::Value::as_u64) {
        Some(rule) => usize::try_from(rule).ok()?,
        None => {
            let field = error.strip_prefix("invalid JSON: ").unwrap_or(&error);
            let index = field.strip_prefix("rules[")?.split_once(']')?.0;
            index.parse().ok()?
        }
    };
    let pushed = doc.rules.get(rule)?;
    if let Some(name) = answer.get("name").and_then(serde_json::Value::as_str) {
        if pushed.name.as_deref() != Some(name) {
            return None;
        }
    }
    Some((rule, error))
}

/// `error` without the position a JSON reader appends to its message (` at line N column M`).
fn without_position(error: &str) -> &str {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    error
        .rsplit_once(" at line ")
        .filter(|(_, at)| {
            at.split_once(" column ")
                .is_some_and(|(line, column)| digits(line) && digits(column))
        })
        .map_or(error, |(said, _)| said)
}

/// The limit a 413 states (`{"error": "config larger than N bytes"}`), if it does.
fn stated_limit(answer: &[u8]) -> Option<usize> {
    let answer: serde_json::Value = serde_json::from_slice(answer).ok()?;
    let error = answer.get("error")?.as_str()?;
    let n = error
        .strip_prefix("config larger than ")?
        .strip_suffix(" bytes")?;
    n.parse().ok()
}

fn refusal(what: &str, status: StatusCode, body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    match status {
        StatusCode::UNAUTHORIZED => format!("{what}: the pod refused the config-API token (401)"),
        _ if text.is_empty() => format!("{what}: {status}"),
        _ => format!("{what}: {status}: {text}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cftunnel_config::Rule;

    #[test]
    fn a_refusal_names_its_rule_by_position_and_name_or_by_the_field_alone() {
        let rule = |name: &str| Rule {
            name: Some(name.to_owned()),
            ..Rule::default()
        };
        let doc = Config {
            rules: vec![rule("a/r/0"), rule("a/r/1")],
            ..Config::default()
        };
        let named = br#"{"error": "rules[1].matches[0].path: regex does not compile", "field": "rules[1].matches[0].path", "rule": 1, "name": "a/r/1"}"#;
        assert_eq!(
            refused_rule(named, &doc),
            Some((
                1,
                "rules[1].matches[0].path: regex does not compile".to_owned()
            ))
        );
        // An answer about another document is not taken for one about this.
        let other = br#"{"error": "rules[1].x: y", "rule": 1, "name": "b/r/1"}"#;
        assert_eq!(refused_rule(other, &doc), None);
        // An earlier release names the rule only in its message, also for a rule it could
        // not read at all.
        let older =
            br#"{"error": "invalid JSON: rules[0].filters[0].type: unknown variant `CORS`"}"#;
        assert_eq!(refused_rule(older, &doc).map(|(i, _)| i), Some(0));
        for unnamed in [
            &br#"{"error": "invalid JSON: expected value at line 1"}"#[..],
            br#"{"error": "rules[7].x: beyond the document"}"#,
            br#"not json"#,
        ] {
            assert_eq!(refused_rule(unnamed, &doc), None);
        }
    }

    /// A rule a proxy could not read is named by the JSON reader, which ends its message with
    /// the rule's position in the document pushed: that goes (the same refusal reads the same
    /// whatever comes before the rule), and the rest of the reason stays.
    #[test]
    fn a_refusals_reason_goes_without_the_readers_position() {
        let answer = |first: &str| {
            let text = format!(
                r#"{{"rules": [{{"name": "{first}"}}, {{"filters": [{{"type": "Teleport"}}]}}]}}"#
            );
            let read = serde_json::from_str::<Config>(&text).expect_err("an unknown filter type");
            assert!(read.to_string().contains(" at line 1 column "), "{read}");
            let error = format!("invalid JSON: rules[1].filters[0].type: {read}");
            let doc = Config {
                rules: vec![Rule::default(), Rule::default()],
                ..Config::default()
            };
            let body = serde_json::json!({ "error": error }).to_string();
            refused_rule(body.as_bytes(), &doc).expect("the rule named")
        };
        let (rule, reason) = answer("a/r/0");
        assert_eq!(rule, 1);
        assert!(
            reason
                .starts_with("invalid JSON: rules[1].filters[0].type: unknown variant `Teleport`")
                && reason.ends_with("`CORS`"),
            "{reason}"
        );
        assert_eq!(answer(&"a".repeat(300)), (rule, reason));
        // Only a position at the very end is the reader's.
        for kept in [
            "rules[0].x: seen at line 3",
            "rules[0].x: at line 1 column 4 of the regex, and more",
            "rules[0].x: at line one column 4",
        ] {
            assert_eq!(without_position(kept), kept);
        }
    }
}
