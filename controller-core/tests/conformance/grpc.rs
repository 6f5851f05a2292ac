//! The GRPCRoute rows (`shared/gwapi/grpc-cases`): each is one unary call, sent by a client
//! that behaves as grpc-go's (`cftunnel_testkit::grpc_echo::client`) over h2c to the Gateway's
//! proxy, which forwards it to the gRPC echo pods; the README's gRPC comparison rules decide
//! ("GRPCRoute cases", mirroring the Go suite's `compareResponse`).

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use cftunnel_testkit::grpc_echo::client::{self, Call, Client, Outcome};
use cftunnel_testkit::grpc_echo::proto::Assertions;
use tokio::time::Instant;
use tonic::Code;

use super::case::{Derived, GrpcCase, GrpcExpect, GrpcItem, GrpcRequest};

/// The one protocol of the gRPC rows: a unary call over cleartext HTTP/2 with prior knowledge.
pub const PROTOCOL: &str = "grpc-h2c";

/// grpc-go's name of a code (`codes.Code.String()`), as the case files spell it.
pub fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "Canceled",
        Code::Unknown => "Unknown",
        Code::InvalidArgument => "InvalidArgument",
        Code::DeadlineExceeded => "DeadlineExceeded",
        Code::NotFound => "NotFound",
        Code::AlreadyExists => "AlreadyExists",
        Code::PermissionDenied => "PermissionDenied",
        Code::ResourceExhausted => "ResourceExhausted",
        Code::FailedPrecondition => "FailedPrecondition",
        Code::Aborted => "Aborted",
        Code::OutOfRange => "OutOfRange",
        Code::Unimplemented => "Unimplemented",
        Code::Internal => "Internal",
        Code::Unavailable => "Unavailable",
        Code::DataLoss => "DataLoss",
        Code::Unauthenticated => "Unauthenticated",
    }
}

/// Refuses a row the replay cannot send as written, or one with checks that would never run:
/// another protocol, a `:path` that is not `/<service>/<method>`, a request message (the
/// `EchoRequest` has no fields), a code the name contradicts, backend or method checks on a
/// row whose code is not OK (rule 3 runs them on OK only), or an OK row without them.
pub fn check_row(case: &GrpcCase, item: &GrpcItem) -> anyhow::Result<()> {
    let r = &item.request;
    let e = &item.expect;
    if r.protocol != PROTOCOL {
        bail!(
            "protocol {:?} is not one the replay's gRPC client speaks ({PROTOCOL})",
            r.protocol
        );
    }
    if r.scheme != "http" {
        bail!(
            "scheme {:?}: the replay sends gRPC over cleartext h2c only",
            r.scheme
        );
    }
    let path = format!("/{}/{}", r.service, r.method);
    if r.path != path {
        bail!("path {:?} is not /<service>/<method> ({path:?})", r.path);
    }
    if !r.message.is_empty() {
        bail!("EchoRequest has no fields, the row sets {:?}", r.message);
    }
    super::check_gateway_port(&case.gateway, &r.gateway, r.port)?;
    let code = Code::from_i32(e.code);
    if code as i32 != e.code || code_name(code) != e.code_name {
        bail!(
            "code {} does not go with the name {:?}",
            e.code,
            e.code_name
        );
    }
    let ok = code == Code::Ok;
    for (field, set) in [
        ("backend", e.backend.is_some()),
        ("fully_qualified_method", e.fully_qualified_method.is_some()),
    ] {
        if set != ok {
            bail!(
                "code {}: {field} is checked on OK rows only, and every OK row checks it",
                e.code_name
            );
        }
    }
    if let Some(derived) = &item.derived_not_upstream {
        rule_backends(case, derived.matched_rule)?;
    }
    if !ok && (item.derived_not_upstream.is_some() || item.distribution.is_some()) {
        bail!(
            "derived or distribution checks on a row that expects {}",
            e.code_name
        );
    }
    Ok(())
}

/// The `:authority` of a row: its own, or the address as dialled, `IP:port` with the
/// listener port (grpc-go's default is its dial target), never the local socket's port.
pub fn authority(r: &GrpcRequest, addr: SocketAddr) -> String {
    r.authority
        .clone()
        .unwrap_or_else(|| SocketAddr::new(addr.ip(), r.port.unwrap_or(80)).to_string())
}

/// The call of a row with `extra` metadata and the deadline left.
fn call(r: &GrpcRequest, authority: &str, extra: &[(String, String)], timeout: Duration) -> Call {
    let mut metadata: Vec<(String, String)> = r
        .metadata
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    metadata.extend(extra.iter().cloned());
    Call {
        authority: authority.to_owned(),
        path: r.path.clone(),
        metadata,
        timeout,
    }
}

fn assertions(outcome: &Outcome) -> Option<&Assertions> {
    outcome
        .response
        .as_ref()
        .and_then(|r| r.assertions.as_ref())
}

/// Rules 2 and 3: the code exactly; on OK, the fully qualified method, the namespace and the
/// pod-name prefix (a response without assertions reads as empty strings, as in Go).
pub fn compare(expect: &GrpcExpect, outcome: &Outcome) -> Result<(), String> {
    if outcome.code as i32 != expect.code {
        return Err(format!(
            "code {} ({}) {:?}, expected {} ({})",
            code_name(outcome.code),
            outcome.code as i32,
            outcome.message,
            expect.code_name,
            expect.code
        ));
    }
    if outcome.code != Code::Ok {
        return Ok(());
    }
    let assertions = assertions(outcome);
    if let Some(want) = &expect.fully_qualified_method {
        let got = assertions.map_or("", |a| a.fully_qualified_method.as_str());
        if got != want {
            return Err(format!("backend ran {got:?}, expected {want:?}"));
        }
    }
    if let Some(backend) = &expect.backend {
        let (ns, svc) = backend.split_once('/').unwrap_or(("", backend));
        let context = assertions.and_then(|a| a.context.as_ref());
        let namespace = context.map_or("", |c| c.namespace.as_str());
        let pod = context.map_or("", |c| c.pod.as_str());
        if namespace != ns {
            return Err(format!("backend namespace {namespace:?}, expected {ns:?}"));
        }
        if svc != "*" && !pod.starts_with(svc) {
            return Err(format!("backend pod {pod:?}, expected one of {svc}"));
        }
    }
    Ok(())
}

/// The Services the backends of rule `index` of the case's route name: where a call that
/// matched that rule lands. A derived check needs the case to hold exactly one route.
pub fn rule_backends(case: &GrpcCase, index: usize) -> anyhow::Result<Vec<String>> {
    let [route] = &case.routes[..] else {
        bail!(
            "matched_rule needs exactly one route in the case, it has {}",
            case.routes.len()
        );
    };
    let rule = route
        .get("spec")
        .and_then(|s| s.get("rules"))
        .and_then(|r| r.get(index))
        .with_context(|| format!("matched_rule {index}: the route has no such rule"))?;
    let backends: Vec<String> = rule
        .get("backendRefs")
        .and_then(serde_yaml_ng::Value::as_sequence)
        .into_iter()
        .flatten()
        .filter_map(|b| b.get("name").and_then(serde_yaml_ng::Value::as_str))
        .map(str::to_owned)
        .collect();
    if backends.is_empty() {
        bail!("matched_rule {index}: the rule has no backendRefs to tell it by");
    }
    Ok(backends)
}

/// Rule 6, the manifest's implications the upstream test does not assert: the call was served
/// by a backend of the rule it should have matched (`rule_backends`), the metadata the backend
/// saw, each key's values (case-insensitive) joined with `,`, and the keys it must not have
/// seen. Where several rules share a backend, the metadata tells their filters apart.
pub fn check_derived(
    derived: &Derived,
    rule_backends: &[String],
    outcome: &Outcome,
) -> Result<(), String> {
    let pod = assertions(outcome)
        .and_then(|a| a.context.as_ref())
        .map_or("", |c| c.pod.as_str());
    if !rule_backends
        .iter()
        .any(|svc| pod.starts_with(svc.as_str()))
    {
        return Err(format!(
            "served by pod {pod:?}, not by a backend of rule {} ({rule_backends:?})",
            derived.matched_rule
        ));
    }
    let headers = assertions(outcome)
        .map(|a| a.headers.as_slice())
        .unwrap_or_default();
    let values = |key: &str| -> Vec<&str> {
        headers
            .iter()
            .filter(|h| h.key.eq_ignore_ascii_case(key))
            .map(|h| h.value.as_str())
            .collect()
    };
    for (key, want) in &derived.request_metadata_seen {
        let got = values(key);
        if got.is_empty() {
            return Err(format!("backend did not see {key} (expected {want:?})"));
        }
        if got.join(",") != *want {
            return Err(format!(
                "backend saw {key}: {:?}, expected {want:?}",
                got.join(",")
            ));
        }
    }
    for key in &derived.absent_metadata {
        let got = values(key);
        if !got.is_empty() {
            return Err(format!("backend saw {key}: {got:?}, expected it removed"));
        }
    }
    Ok(())
}

/// What a row left beyond its verdict: the outcome of its derived check, if it has one.
pub type DerivedVerdict = Option<Result<(), String>>;

/// Runs one row: rule 1 (eventually consistent, three passes in a row) over one connection,
/// redialled after an INTERNAL result as the Go test does, every call with the deadline left
/// of the row's 30 s; then the derived check on the last passing call, and the distribution.
pub async fn run_item(
    case: &GrpcCase,
    item: &GrpcItem,
    addr: SocketAddr,
) -> anyhow::Result<DerivedVerdict> {
    let r = &item.request;
    let matched = match &item.derived_not_upstream {
        Some(derived) => rule_backends(case, derived.matched_rule)?,
        None => Vec::new(),
    };
    let authority = authority(r, addr);
    let started = Instant::now();
    let state = tokio::sync::Mutex::new((Client::new(addr), None::<Outcome>));
    super::eventually(|| async {
        let mut state = state.lock().await;
        let (client, last) = &mut *state;
        let left = super::CONSISTENT
            .deadline
            .saturating_sub(started.elapsed())
            .max(Duration::from_millis(1));
        let outcome = client.unary(&call(r, &authority, &[], left)).await;
        if outcome.code == Code::Internal {
            client.disconnect();
        }
        compare(&item.expect, &outcome).map_err(|e| anyhow!(e))?;
        *last = Some(outcome);
        Ok(())
    })
    .await?;
    let (_, last) = state.into_inner();
    let derived = item.derived_not_upstream.as_ref().map(|derived| {
        last.as_ref()
            .ok_or_else(|| "no passing call".to_owned())
            .and_then(|outcome| check_derived(derived, &matched, outcome))
    });
    if let Some(d) = &item.distribution {
        super::distribution(d, || async {
            let call = call(r, &authority, &super::jitter(), super::CONSISTENT.deadline);
            let outcome = client::call_once(addr, &call).await;
            if outcome.code != Code::Ok {
                bail!(
                    "a call ended with {} ({}): {}",
                    code_name(outcome.code),
                    outcome.code as i32,
                    outcome.message
                );
            }
            Ok(assertions(&outcome)
                .and_then(|a| a.context.as_ref())
                .map(|c| c.pod.clone())
                .unwrap_or_default())
        })
        .await
        .context("distribution")?;
    }
    Ok(derived)
}

#[cfg(test)]
mod tests {
    use cftunnel_testkit::grpc_echo::proto::{Context, EchoResponse, Header};

    use super::*;

    fn served(pod: &str, headers: &[(&str, &str)]) -> Outcome {
        Outcome {
            code: Code::Ok,
            message: String::new(),
            response: Some(EchoResponse {
                assertions: Some(Assertions {
                    headers: headers
                        .iter()
                        .map(|(k, v)| Header {
                            key: (*k).to_owned(),
                            value: (*v).to_owned(),
                        })
                        .collect(),
                    context: Some(Context {
                        pod: pod.to_owned(),
                        ..Context::default()
                    }),
                    ..Assertions::default()
                }),
                request: None,
            }),
        }
    }

    #[test]
    fn a_derived_check_reads_the_rules_backend_and_the_metadata_seen() {
        let case: GrpcCase = serde_yaml_ng::from_str(
            r"
name: c
features: []
gateway: []
routes:
- spec:
    rules:
    - backendRefs: [{name: grpc-infra-backend-v1, port: 8080}]
    - backendRefs: [{name: grpc-infra-backend-v2, port: 8080}]
requests: []
",
        )
        .expect("a case");
        let derived = Derived {
            matched_rule: 1,
            request_metadata_seen: [("x-add".to_owned(), "a,b".to_owned())].into(),
            absent_metadata: vec!["x-removed".to_owned()],
        };
        let backends = rule_backends(&case, 1).expect("rule 1 exists");
        assert_eq!(backends, ["grpc-infra-backend-v2"]);
        assert!(rule_backends(&case, 2).is_err());

        let v2 = "grpc-infra-backend-v2-5d8f7c9b4-k7x7q0";
        let check = |outcome: Outcome| check_derived(&derived, &backends, &outcome);
        assert_eq!(check(served(v2, &[("X-Add", "a"), ("x-add", "b")])), Ok(()));
        assert!(check(served(
            "grpc-infra-backend-v1-5d8f7c9b4-k7x6q0",
            &[("x-add", "a,b")]
        ))
        .is_err());
        assert!(check(served(v2, &[("x-add", "b"), ("x-add", "a")])).is_err());
        assert!(check(served(v2, &[("x-add", "a,b"), ("x-removed", "1")])).is_err());
        assert!(check(served(v2, &[])).is_err());
    }
}
