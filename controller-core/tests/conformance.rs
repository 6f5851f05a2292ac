//! Replays the transcribed Gateway API HTTPRoute and GRPCRoute conformance cases
//! (`shared/gwapi/cases`, `shared/gwapi/grpc-cases`) against the real pipeline: the case's
//! objects plus the base topology are translated, one in-process proxy per Gateway is started
//! with the result, every request is sent with a real client (HTTP/1.1, h2c, WebSocket, or a
//! gRPC client over h2c) to echo backends on distinct loopback addresses, and the README's
//! comparison rules decide. Cases run in parallel, a few at a time.
//!
//! Every Gateway of a case gets its own data plane: a GatewayConfig with its own tunnel token
//! (`topology.rs`). A Gateway's address is its tunnel; Gateways without a GatewayConfig share
//! the class's one tunnel and proxy pool, and so one address, while the suite gives every
//! Gateway an address of its own (`multiple-gateways`).
//!
//! Where the replay deliberately judges differently from the Go suite:
//! - a percentage mirror is counted once the count has stopped moving for 300 ms (at most
//!   3 s), where Go reads the pod logs once after the batch: our echo log is in memory, with
//!   none of the log API's latency to absorb;
//! - the echo JSON is decoded with exact field names and a `null` field is an error, where
//!   Go's `encoding/json` matches names case-insensitively and leaves a field at `null` empty.

#[path = "conformance/case.rs"]
mod case;
#[path = "conformance/client.rs"]
mod client;
#[path = "conformance/compare.rs"]
mod compare;
#[path = "conformance/grpc.rs"]
mod grpc;
#[path = "conformance/topology.rs"]
mod topology;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use cftunnel_controller_core::translate::{
    self, ObjectKey, Options, Output, RouteKey, RouteKind, Snapshot,
};
use cftunnel_proxy::{Server, ServerOptions};
use futures_util::StreamExt as _;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;

use case::{Case, CaseGateway, GrpcCase, Item, RequestItem};
use compare::{compare, expected_path, with_request_id, Sent};
use topology::Fleet;

const CASES_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/gwapi/cases");
const GRPC_CASES_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/gwapi/grpc-cases");
/// Cases that need TLS listeners or listeners on several ports: listed, never run.
const DEFERRED_DIR: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../shared/gwapi/cases-deferred"
);
const CLASS: &str = "cftunnel-conformance";
const CONTROLLER: &str = "cf.k8s.lex.la/tunnel-controller";

/// Cases run at once.
const PARALLEL: usize = 4;
/// Go suite: 3 consecutive passes, polling every 100 ms after a failure, failing after 30 s
/// (`MaxTimeToConsistency`). A row that passes returns as soon as it is consistent, so the
/// deadline only bounds how long a failing row takes to fail.
const CONSISTENT: Convergence = Convergence {
    passes: 3,
    deadline: Duration::from_secs(30),
    poll: Duration::from_millis(100),
};
/// Each request of a percentage-mirror batch: one pass is enough
/// (`RequiredConsecutiveSuccesses = 1`), within the same deadline.
const ONE_PASS: Convergence = Convergence {
    passes: 1,
    ..CONSISTENT
};
/// Go's `ExpectMirroredRequest`: starting before the request is sent, the mirror's log is
/// read at once and then every second, for at most the request timeout.
const MIRROR_LOG_TICK: Duration = Duration::from_secs(1);
const MIRROR_LOG_TIMEOUT: Duration = Duration::from_secs(10);
/// After a percentage-mirror batch whose count is off, the Go test waits before the next.
const MIRROR_BATCH_PAUSE: Duration = Duration::from_secs(2);
/// The Go test function running the suite (`conformance_test.go`), the first part of every
/// test name (`t.Name()`), which the WebSocket test sends in its `Origin`.
const GO_TEST_FUNCTION: &str = "TestConformance";
/// The placeholder for that name in the WebSocket row's `Origin`.
const GO_TEST_NAME: &str = "<go test name>";
/// Upper bound for one case, statistical ones included.
const CASE_TIMEOUT: Duration = Duration::from_secs(120);

/// Cases that cannot pass yet, with the reason. They still run and their outcome is printed,
/// but they do not fail the test.
const SKIP: &[(&str, &str)] = &[];

#[test]
fn conformance_replay() {
    let dir = Path::new(CASES_DIR);
    if !dir.is_dir() {
        report(&format!(
            "conformance replay skipped: {} is absent (the shared conformance data sits beside the checkout in CI)\n",
            dir.display()
        ));
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("the test runtime starts");
    let mut files: Vec<(Suite, PathBuf)> = case_files(dir)
        .into_iter()
        .map(|path| (Suite::Http, path))
        .collect();
    assert!(!files.is_empty(), "no case in {}", dir.display());
    let grpc_dir = Path::new(GRPC_CASES_DIR);
    if grpc_dir.is_dir() {
        files.extend(
            case_files(grpc_dir)
                .into_iter()
                .map(|path| (Suite::Grpc, path)),
        );
    } else {
        report(&format!(
            "GRPCRoute cases skipped: {} is absent\n",
            grpc_dir.display()
        ));
    }
    let deferred_dir = Path::new(DEFERRED_DIR);
    let deferred: Vec<(String, usize, Vec<String>, String)> = if deferred_dir.is_dir() {
        case_files(deferred_dir)
            .iter()
            .map(|path| deferred_case(path).unwrap_or_else(|e| panic!("{}: {e:#}", path.display())))
            .collect()
    } else {
        Vec::new()
    };
    let results = runtime.block_on(run_all(files));
    let mut failed = Vec::new();
    let mut derived_failed = Vec::new();
    let mut lines = String::new();
    // Per suite: cases passed, cases run, requests of the cases run.
    let mut tally: BTreeMap<Suite, (usize, usize, usize)> = BTreeMap::new();
    for (suite, name, result) in &results {
        let skip = SKIP.iter().find(|(n, _)| n == name).map(|(_, why)| *why);
        let counts = tally.entry(*suite).or_default();
        counts.1 += 1;
        match (result, skip) {
            (Ok(ran), None) => {
                counts.0 += 1;
                counts.2 += ran.requests;
                lines.push_str(&format!("PASS {name} ({ran})\n"));
            }
            (Ok(ran), Some(_)) => {
                counts.0 += 1;
                counts.2 += ran.requests;
                lines.push_str(&format!(
                    "PASS {name} ({ran}; on the skip list: remove it)\n"
                ));
            }
            (Err(e), None) => {
                failed.push(name.clone());
                lines.push_str(&format!("FAIL {name}: {e:#}\n"));
            }
            (Err(e), Some(why)) => lines.push_str(&format!("SKIP {name}: {why} (now: {e:#})\n")),
        }
        if let Ok(ran) = result {
            for (id, verdict) in &ran.derived {
                if let Err(why) = verdict {
                    derived_failed.push(format!("{name} request {id}: {why}"));
                }
            }
        }
    }
    for (name, requests, requires, why) in &deferred {
        lines.push_str(&format!(
            "NOT RUN {name} (deferred, {requests} requests; requires {}): {why}\n",
            requires.join(", ")
        ));
    }
    let passed: Vec<String> = tally
        .iter()
        .map(|(suite, (passed, run, requests))| {
            format!("{passed}/{run} {suite} cases pass ({requests} requests)")
        })
        .collect();
    lines.push_str(&format!(
        "conformance replay: {}; {} deferred cases ({} requests) not run; skip list ({}):\n",
        passed.join(", "),
        deferred.len(),
        deferred.iter().map(|d| d.1).sum::<usize>(),
        SKIP.len()
    ));
    for (name, why) in SKIP {
        lines.push_str(&format!("  - {name}: {why}\n"));
    }
    let derived: usize = results
        .iter()
        .filter_map(|(_, _, r)| r.as_ref().ok())
        .map(|ran| ran.derived.len())
        .sum();
    if derived > 0 {
        lines.push_str(&format!(
            "derived checks (implied by the manifests, not asserted upstream): {}/{derived} hold\n",
            derived - derived_failed.len()
        ));
        for failure in &derived_failed {
            lines.push_str(&format!("  - {failure}\n"));
        }
    }
    report(&lines);
    assert!(failed.is_empty(), "conformance cases failed: {failed:?}");
    assert!(
        derived_failed.is_empty(),
        "derived checks failed: {derived_failed:?}"
    );
}

/// Which suite a case comes from, and so how its rows are sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Suite {
    Http,
    Grpc,
}

impl std::fmt::Display for Suite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Http => "HTTPRoute",
            Self::Grpc => "GRPCRoute",
        })
    }
}

/// What a case that passed ran.
struct Ran {
    requests: usize,
    took: Duration,
    /// The derived checks of its rows (gRPC rule 6), by row id.
    derived: Vec<(usize, Result<(), String>)>,
}

impl std::fmt::Display for Ran {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} requests, {} ms",
            self.requests,
            self.took.as_millis()
        )?;
        if !self.derived.is_empty() {
            let held = self.derived.iter().filter(|(_, v)| v.is_ok()).count();
            write!(f, "; derived checks {held}/{} hold", self.derived.len())?;
        }
        Ok(())
    }
}

/// Features a case in `cases/` lists without exercising them, so they count neither way, with
/// the port the case must then not use (checked): the Go test `HTTPRouteRedirectPortAndScheme`
/// lists `GatewayPort8080` for its listener on port 8080, whose rows are in `cases-deferred/`;
/// its part in `cases/` has no listener and sends no request on port 8080.
const LISTED_NOT_EXERCISED: &[(&str, &str, u16)] =
    &[("HTTPRouteRedirectPortAndScheme", "GatewayPort8080", 8080)];

/// The features a GatewayClass publishes (`translate::SUPPORTED_FEATURES`) are exactly those of
/// the cases this replay runs, HTTPRoute and GRPCRoute: a case using a feature the list lacks
/// fails it, and so does a listed feature that no case exercises but cases on the skip list.
#[test]
fn supported_features_are_the_ones_the_replayed_cases_exercise() {
    let dir = Path::new(CASES_DIR);
    if !dir.is_dir() {
        report(&format!(
            "supported features check skipped: {} is absent (the shared conformance data sits beside the checkout in CI)\n",
            dir.display()
        ));
        return;
    }
    // Feature → the cases exercising it, of those on the skip list or not.
    let mut run: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut skipped: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for path in case_files(dir) {
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let case: Case =
            serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let on_skip_list = SKIP.iter().any(|(n, _)| *n == case.name);
        for feature in &case.features {
            let exempt = LISTED_NOT_EXERCISED
                .iter()
                .find(|(c, f, _)| *c == case.name && f == feature);
            if let Some((_, _, port)) = exempt {
                assert!(
                    !uses_port(&case, *port),
                    "{}: {feature} counts as listed but not exercised, yet the case uses port {port}",
                    case.name
                );
                continue;
            }
            let by = if on_skip_list { &mut skipped } else { &mut run };
            by.entry(feature.clone())
                .or_default()
                .push(case.name.clone());
        }
    }
    let grpc_dir = Path::new(GRPC_CASES_DIR);
    let grpc_files = if grpc_dir.is_dir() {
        case_files(grpc_dir)
    } else {
        Vec::new()
    };
    for path in grpc_files {
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let case: GrpcCase =
            serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let on_skip_list = SKIP.iter().any(|(n, _)| *n == case.name);
        for feature in &case.features {
            let by = if on_skip_list { &mut skipped } else { &mut run };
            by.entry(feature.clone())
                .or_default()
                .push(case.name.clone());
        }
    }
    let published: BTreeSet<&str> = translate::SUPPORTED_FEATURES.iter().copied().collect();
    let unpublished: Vec<String> = run
        .iter()
        .filter(|(f, _)| !published.contains(f.as_str()))
        .map(|(f, cases)| format!("{f} (used by {})", cases.join(", ")))
        .collect();
    let undemonstrated: Vec<String> = published
        .iter()
        .filter(|f| !run.contains_key(**f))
        .map(|f| match skipped.get(*f) {
            Some(cases) => format!("{f} (only by skipped {})", cases.join(", ")),
            None => (*f).to_owned(),
        })
        .collect();
    assert!(
        unpublished.is_empty(),
        "replayed cases use features translate::SUPPORTED_FEATURES lacks: {unpublished:?}"
    );
    assert!(
        undemonstrated.is_empty(),
        "translate::SUPPORTED_FEATURES lists features no replayed case exercises: {undemonstrated:?}"
    );
}

/// Whether a case has a listener on `port` or sends a request to it (a request without a port
/// goes to its scheme's default).
fn uses_port(case: &Case, port: u16) -> bool {
    let listener = case.gateway.iter().flat_map(|g| &g.listeners).any(|l| {
        l.get("port")
            .and_then(serde_yaml_ng::Value::as_u64)
            .is_some_and(|p| p == u64::from(port))
    });
    let request = case.requests.iter().any(|item| match item {
        Item::Request(r) => listener_port(&r.request) == port,
        Item::Step { .. } => false,
    });
    listener || request
}

/// The listener port a request goes to: a request without a port goes to its scheme's default.
fn listener_port(request: &case::Request) -> u16 {
    request.port.unwrap_or(match request.scheme.as_str() {
        "https" | "wss" => 443,
        _ => 80,
    })
}

/// The `.yaml` files of a case folder, sorted.
fn case_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{} is not readable: {e}", dir.display()))
        .map(|entry| entry.expect("the case folder lists").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

/// Why the replay cannot run a deferred case, from its `requires` tags; `None` for a tag the
/// replay handles.
fn deferred_reason(tag: &str) -> Option<&'static str> {
    match tag {
        "tls-listener" | "h2-client" => Some(
            "needs TLS listeners: TLS terminates at Cloudflare's edge and the proxy serves HTTPS \
             listeners as plain HTTP, so the suite's TLS handshake with the Gateway (SNI, \
             certificate, ALPN h2) has no counterpart here",
        ),
        "listener-port-8080" | "multiple-listener-ports" => Some(
            "needs listeners on several ports: the replay maps one listener port to each Gateway's proxy",
        ),
        _ => None,
    }
}

/// A deferred case as listed: name, request count, `requires` tags and why it is not run.
fn deferred_case(path: &Path) -> anyhow::Result<(String, usize, Vec<String>, String)> {
    let text = std::fs::read_to_string(path)?;
    let case: Case = serde_yaml_ng::from_str(&text).context("parsing the case")?;
    let mut reasons: Vec<&str> = Vec::new();
    for reason in case.requires.iter().filter_map(|t| deferred_reason(t)) {
        if !reasons.contains(&reason) {
            reasons.push(reason);
        }
    }
    if reasons.is_empty() {
        bail!(
            "deferred case {} requires {:?}, nothing the replay lacks: it belongs in cases/",
            case.name,
            case.requires
        );
    }
    let requests = case
        .requests
        .iter()
        .filter(|i| matches!(i, Item::Request(_)))
        .count();
    Ok((case.name, requests, case.requires, reasons.join("; ")))
}

/// Writes past the test harness's output capture, so the per-case report shows in CI logs.
fn report(text: &str) {
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(text.as_bytes());
    let _ = err.flush();
}

async fn run_all(files: Vec<(Suite, PathBuf)>) -> Vec<(Suite, String, anyhow::Result<Ran>)> {
    let limit = Arc::new(Semaphore::new(PARALLEL));
    let mut tasks = JoinSet::new();
    let mut names = BTreeMap::new();
    for (slot, (suite, path)) in files.into_iter().enumerate() {
        let limit = limit.clone();
        let name = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let task = tasks.spawn(async move {
            let _permit = limit.acquire_owned().await;
            let started = Instant::now();
            let result =
                match tokio::time::timeout(CASE_TIMEOUT, run_file(suite, &path, slot)).await {
                    Ok(r) => r,
                    Err(_) => Err(anyhow!("case did not finish within {CASE_TIMEOUT:?}")),
                };
            result.map(|(requests, derived)| Ran {
                requests,
                took: started.elapsed(),
                derived,
            })
        });
        names.insert(task.id(), (suite, name));
    }
    let mut results = Vec::new();
    while let Some(r) = tasks.join_next_with_id().await {
        let (id, result) = match r {
            Ok((id, result)) => (id, result),
            Err(e) => (e.id(), Err(anyhow!("the case panicked: {e}"))),
        };
        let (suite, name) = names
            .remove(&id)
            .unwrap_or((Suite::Http, "<unknown case>".to_owned()));
        results.push((suite, name, result));
    }
    results.sort_by(|a, b| a.1.cmp(&b.1));
    results
}

/// The derived checks of a case's rows, by row id.
type DerivedChecks = Vec<(usize, Result<(), String>)>;

/// Runs one case file; the requests it sent and its derived checks.
async fn run_file(
    suite: Suite,
    path: &Path,
    slot: usize,
) -> anyhow::Result<(usize, DerivedChecks)> {
    let text = tokio::fs::read_to_string(path).await?;
    let slot = u8::try_from(slot).context("too many cases for the address plan")?;
    match suite {
        Suite::Http => {
            let case: Case = serde_yaml_ng::from_str(&text).context("parsing the case")?;
            let fleet = Fleet::spawn(slot).await?;
            let result = run_case(&case, &fleet).await;
            fleet.shutdown().await;
            result.map(|n| (n, Vec::new()))
        }
        Suite::Grpc => {
            let case: GrpcCase = serde_yaml_ng::from_str(&text).context("parsing the case")?;
            let fleet = Fleet::spawn(slot).await?;
            let result = run_grpc_case(&case, &fleet).await;
            fleet.shutdown().await;
            result
        }
    }
}

fn options() -> Options {
    Options {
        controller_name: CONTROLLER.to_owned(),
        proxy_image: Some("cftunnel-proxy:conformance".to_owned()),
        ..Options::default()
    }
}

/// The config of each of the case's Gateways, keyed `namespace/name`.
fn gateway_configs<R>(
    case: &Case<R>,
    output: &Output,
) -> anyhow::Result<BTreeMap<String, cftunnel_config::Config>> {
    let mut out = BTreeMap::new();
    for gw in &case.gateway {
        let key = ObjectKey::new(&gw.namespace, &gw.name);
        let plane = output.planes.get(&key).with_context(|| {
            format!(
                "Gateway {key} is not accepted: {:?}",
                output.statuses.gateways.get(&key)
            )
        })?;
        let config = output
            .configs
            .get(plane)
            .context("no config for the plane")?;
        out.insert(key.to_string(), config.clone());
    }
    Ok(out)
}

struct Gateways {
    servers: BTreeMap<String, Server>,
}

impl Gateways {
    async fn start(configs: BTreeMap<String, cftunnel_config::Config>) -> anyhow::Result<Self> {
        let mut servers = BTreeMap::new();
        for (name, config) in configs {
            let options = ServerOptions {
                data_addr: Some(SocketAddr::from(([127, 0, 0, 1], 0))),
                admin_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
                grace: Duration::from_secs(1),
                ..ServerOptions::default()
            };
            let server = Server::start(options, Some(config))
                .await
                .with_context(|| format!("starting the proxy of Gateway {name}"))?;
            servers.insert(name, server);
        }
        Ok(Self { servers })
    }

    async fn apply(
        &self,
        configs: BTreeMap<String, cftunnel_config::Config>,
    ) -> anyhow::Result<()> {
        for (name, config) in configs {
            let server = self
                .servers
                .get(&name)
                .context("no proxy for the Gateway")?;
            server
                .apply(config)
                .await
                .map_err(|e| anyhow!("pushing to Gateway {name}: {e}"))?;
        }
        Ok(())
    }

    fn addr(&self, gateway: &str) -> anyhow::Result<SocketAddr> {
        Ok(self
            .servers
            .get(gateway)
            .with_context(|| format!("no proxy for Gateway {gateway}"))?
            .data_addr())
    }

    async fn shutdown(self) {
        for (_, server) in self.servers {
            server.shutdown().await;
        }
    }
}

fn translate_case<R>(
    case: &Case<R>,
    fleet: &Fleet,
    deleted: &[(String, String, String)],
) -> anyhow::Result<(Snapshot, Output)> {
    let snapshot = topology::snapshot(case, fleet, CLASS, CONTROLLER, deleted)?;
    let output = translate::translate(&snapshot, &options());
    Ok((snapshot, output))
}

async fn run_case(case: &Case, fleet: &Fleet) -> anyhow::Result<usize> {
    for item in &case.requests {
        if let Item::Request(item) = item {
            check_row(case, item)
                .with_context(|| format!("request {} cannot be replayed as written", item.id))?;
        }
    }
    let mut deleted = Vec::new();
    let (_, output) = translate_case(case, fleet, &deleted)?;
    check_statuses(case, &output)?;
    let gateways = Gateways::start(gateway_configs(case, &output)?).await?;
    let mut count = 0;
    let mut result = Ok(());
    for item in &case.requests {
        match item {
            Item::Step { step } => {
                if step.action != "delete" {
                    result = Err(anyhow!("unknown step action {}", step.action));
                    break;
                }
                // The controller's reaction to the deletion: re-translate and re-push.
                deleted.push((step.kind.clone(), step.namespace.clone(), step.name.clone()));
                let pushed = match translate_case(case, fleet, &deleted) {
                    Ok((_, output)) => match gateway_configs(case, &output) {
                        Ok(configs) => gateways.apply(configs).await,
                        Err(e) => Err(e),
                    },
                    Err(e) => Err(e),
                };
                if let Err(e) = pushed {
                    result = Err(e);
                    break;
                }
            }
            Item::Request(item) => {
                count += 1;
                if let Err(e) = run_item(&case.name, item, &gateways, fleet).await {
                    let label = item.name.as_deref().unwrap_or_default();
                    result = Err(
                        e.context(format!("request {} {} {label}", item.id, item.request.path))
                    );
                    break;
                }
            }
        }
    }
    gateways.shutdown().await;
    result.map(|()| count)
}

/// Runs a GRPCRoute case: its rows in order, each on its own connection (rule 4).
async fn run_grpc_case(case: &GrpcCase, fleet: &Fleet) -> anyhow::Result<(usize, DerivedChecks)> {
    for item in &case.requests {
        grpc::check_row(case, item)
            .with_context(|| format!("request {} cannot be replayed as written", item.id))?;
    }
    let (_, output) = translate_case(case, fleet, &[])?;
    check_statuses(case, &output)?;
    let gateways = Gateways::start(gateway_configs(case, &output)?).await?;
    let mut derived = Vec::new();
    let mut result = Ok(());
    for item in &case.requests {
        let run = match gateways.addr(&item.request.gateway) {
            Ok(addr) => grpc::run_item(case, item, addr).await,
            Err(e) => Err(e),
        };
        match run {
            Ok(verdict) => derived.extend(verdict.map(|v| (item.id, v))),
            Err(e) => {
                let label = item.name.as_deref().unwrap_or_default();
                result = Err(e.context(format!("request {} {label}", item.id)));
                break;
            }
        }
    }
    gateways.shutdown().await;
    result.map(|()| (case.requests.len(), derived))
}

/// Protocols the client speaks: HTTP/1.1, HTTP/2 with prior knowledge (cleartext) and a
/// WebSocket upgrade over HTTP/1.1.
const HTTP1: &str = "HTTP/1.1";
const H2C: &str = "h2c-prior-knowledge";
const WEBSOCKET: &str = "websocket";

/// Refuses a row the replay cannot send as written, instead of sending something else: a
/// protocol the client does not speak, a scheme that does not go with it (TLS included), a
/// port other than the one listener port mapped to the Gateway's proxy, a non-HTTP listener,
/// and checks that contradict each other or would be skipped.
fn check_row(case: &Case, item: &RequestItem) -> anyhow::Result<()> {
    let r = &item.request;
    let e = &item.expect;
    let scheme = match r.protocol.as_str() {
        HTTP1 | H2C => "http",
        WEBSOCKET => "ws",
        other => bail!(
            "protocol {other:?} is not one the replay client speaks ({HTTP1}, {H2C}, {WEBSOCKET})"
        ),
    };
    if r.scheme != scheme {
        bail!(
            "scheme {:?} with protocol {}: the replay sends {} as {scheme}:// only",
            r.scheme,
            r.protocol,
            r.protocol
        );
    }
    if r.tls.is_some() {
        bail!("the row asks for TLS; the replay client sends cleartext only");
    }
    check_gateway_port(&case.gateway, &r.gateway, r.port)?;
    if r.protocol == WEBSOCKET {
        if r.method != "GET" {
            bail!("a WebSocket handshake is a GET, the row says {}", r.method);
        }
        if e.status.codes() != [101] {
            bail!(
                "a WebSocket row expects status 101, the row says {:?}",
                e.status
            );
        }
        if e.websocket_exchange.is_empty() {
            bail!("the WebSocket row has no frame to exchange");
        }
        for (i, frame) in e.websocket_exchange.iter().enumerate() {
            client::ws_frame(frame).with_context(|| format!("websocket_exchange[{i}]"))?;
        }
        let unchecked = [
            ("forwarded", e.forwarded.is_some()),
            ("backend", e.backend.is_some()),
            ("request_seen", e.request_seen.is_some()),
            ("response_headers", !e.response_headers.is_empty()),
            (
                "absent_response_headers",
                !e.absent_response_headers.is_empty(),
            ),
            ("redirect", e.redirect.is_some()),
            ("mirrored_to", !e.mirrored_to.is_empty()),
            ("distribution", item.distribution.is_some()),
            ("mirror_distribution", item.mirror_distribution.is_some()),
            ("repeat", item.repeat.is_some()),
            ("add_request_id_query", r.add_request_id_query),
            ("uuid_query_param", r.uuid_query_param),
        ];
        if let Some((field, _)) = unchecked.iter().find(|(_, set)| *set) {
            bail!("a WebSocket row checks its frames only, yet sets {field}");
        }
        // The Go test's dialer takes a URL and an origin: it sends an Origin, no other header.
        let names: Vec<&String> = r.headers.keys().collect();
        if !matches!(names[..], [name] if name.eq_ignore_ascii_case("origin")) {
            bail!("a WebSocket handshake carries an Origin and no other header, the row has {names:?}");
        }
        if r.headers.values().any(|v| v.contains(GO_TEST_NAME)) && item.name.is_none() {
            bail!("the WebSocket row's Origin names the Go test, yet the row has no name");
        }
        if r.backend_set_response_headers.is_some() {
            bail!("a WebSocket handshake carries no X-Echo-Set-Header");
        }
    } else if !e.websocket_exchange.is_empty() {
        bail!("websocket_exchange on a {} row", r.protocol);
    }
    // A percentage mirror is checked by counting, never per request: each needs its count.
    for m in &e.mirrored_to {
        let Some(percent) = m.percent else { continue };
        match &item.mirror_distribution {
            Some(d) if d.backend == m.backend && d.percent == percent => {}
            Some(d) => bail!(
                "mirrored_to {} at {percent} %, but mirror_distribution counts {} at {} %",
                m.backend,
                d.backend,
                d.percent
            ),
            None => bail!(
                "mirrored_to {} at {percent} % without a mirror_distribution to count it",
                m.backend
            ),
        }
    }
    if let Some(d) = &item.mirror_distribution {
        if !e
            .mirrored_to
            .iter()
            .any(|m| m.backend == d.backend && m.percent == Some(d.percent))
        {
            bail!(
                "mirror_distribution counts {} at {} %, which no mirrored_to entry names",
                d.backend,
                d.percent
            );
        }
    }
    Ok(())
}

/// Refuses a row sent to a Gateway that is not one of the case's, that has a listener other
/// than plain HTTP or listeners on several ports (the replay maps one listener port to each
/// Gateway's proxy), or to a port (absent: 80) other than that one.
fn check_gateway_port(
    gateways: &[CaseGateway],
    gateway: &str,
    port: Option<u16>,
) -> anyhow::Result<()> {
    let (ns, name) = gateway
        .split_once('/')
        .context("request.gateway is not <namespace>/<name>")?;
    let listeners = &gateways
        .iter()
        .find(|g| g.namespace == ns && g.name == name)
        .with_context(|| format!("Gateway {gateway} is not one of the case's"))?
        .listeners;
    let mut ports = Vec::new();
    for listener in listeners {
        let listens_on = listener
            .get("port")
            .and_then(serde_yaml_ng::Value::as_u64)
            .context("a listener without a port")?;
        let protocol = listener
            .get("protocol")
            .and_then(serde_yaml_ng::Value::as_str)
            .unwrap_or_default();
        if protocol != "HTTP" {
            bail!(
                "Gateway {gateway} has a {protocol:?} listener; the replay serves plain HTTP listeners only"
            );
        }
        if !ports.contains(&listens_on) {
            ports.push(listens_on);
        }
    }
    let [mapped] = ports[..] else {
        bail!(
            "Gateway {gateway} listens on ports {ports:?}; the replay maps one listener port to the Gateway's proxy"
        );
    };
    let port = port.unwrap_or(80);
    if u64::from(port) != mapped {
        bail!("port {port}: Gateway {gateway} listens on {mapped}, the only port the replay maps");
    }
    Ok(())
}

/// The statuses the Go test asserts before sending traffic.
fn check_statuses<R>(case: &Case<R>, output: &Output) -> anyhow::Result<()> {
    let as_bool = |s: &str| s == "True";
    for check in &case.status_checks {
        let (ns, name) = check.name.split_once('/').context("status check name")?;
        let key = ObjectKey::new(ns, name);
        match check.kind.as_str() {
            kind @ ("HTTPRoute" | "GRPCRoute") => {
                let route_kind = if kind == "HTTPRoute" {
                    RouteKind::Http
                } else {
                    RouteKind::Grpc
                };
                let parents = output
                    .statuses
                    .routes
                    .get(&RouteKey {
                        kind: route_kind,
                        key,
                    })
                    .with_context(|| format!("no status for {kind} {}", check.name))?;
                let parent = check
                    .parent
                    .as_deref()
                    .with_context(|| format!("status check of {} names no parent", check.name))?;
                let listener = check.listener.as_deref();
                // With a listener, the entry of the parentRef naming that section; without,
                // every entry towards the Gateway.
                let entries: Vec<_> = parents
                    .iter()
                    .filter(|p| {
                        format!("{}/{}", p.parent_ref.namespace, p.parent_ref.name) == parent
                            && listener
                                .is_none_or(|l| p.parent_ref.section_name.as_deref() == Some(l))
                    })
                    .collect();
                let towards = match listener {
                    Some(l) => format!("{parent} listener {l}"),
                    None => parent.to_owned(),
                };
                if entries.is_empty() {
                    bail!("{kind} {} has no status for parent {towards}", check.name);
                }
                let wanted = check
                    .condition
                    .as_deref()
                    .with_context(|| format!("status check of {} names no type", check.name))?;
                let status =
                    as_bool(check.status.as_deref().with_context(|| {
                        format!("status check of {} has no status", check.name)
                    })?);
                let reason = check.reason.as_deref().unwrap_or_default();
                for entry in entries {
                    let got = entry
                        .conditions
                        .iter()
                        .find(|c| c.kind.as_str() == wanted)
                        .with_context(|| {
                            format!(
                                "{kind} {} parent {}: no {wanted} condition",
                                check.name, entry.parent_ref
                            )
                        })?;
                    if got.status != status || got.reason.as_str() != reason {
                        bail!(
                            "{kind} {} parent {}: {got}, expected {wanted}={status} ({reason})",
                            check.name,
                            entry.parent_ref
                        );
                    }
                }
            }
            "Gateway" => {
                let gw = output
                    .statuses
                    .gateways
                    .get(&key)
                    .with_context(|| format!("no status for Gateway {}", check.name))?;
                let wanted = check.listener.as_deref().unwrap_or_default();
                let listener = gw
                    .listeners
                    .iter()
                    .find(|l| l.name == wanted)
                    .with_context(|| format!("Gateway {} has no listener {wanted}", check.name))?;
                if let Some(n) = check.attached_routes {
                    if listener.attached_routes != n {
                        bail!(
                            "Gateway {} listener {wanted}: attachedRoutes {}, expected {n}",
                            check.name,
                            listener.attached_routes
                        );
                    }
                }
                for (kind, status) in &check.conditions {
                    let got = listener.conditions.iter().find(|c| c.kind.as_str() == kind);
                    if got.map(|c| c.status) != Some(as_bool(status)) {
                        bail!(
                            "Gateway {} listener {wanted}: {kind} is {got:?}, expected {status}",
                            check.name
                        );
                    }
                }
            }
            other => bail!("unknown status check kind {other}"),
        }
    }
    Ok(())
}

fn random_id() -> String {
    format!(
        "{:016x}{:016x}",
        rand::random::<u64>(),
        rand::random::<u64>()
    )
}

/// Go's `CalculateHost`: the Host a request without one carries, and the host of the request
/// URL: the gateway's IP alone when the listener port is the scheme's default (80 for http,
/// 443 for https), else `ip:port` (an IPv6 address in brackets either way).
fn calculate_host(ip: IpAddr, port: u16, scheme: &str) -> String {
    let default = match scheme.to_ascii_lowercase().as_str() {
        "http" => Some(80),
        "https" => Some(443),
        _ => None,
    };
    match ip {
        _ if default != Some(port) => SocketAddr::new(ip, port).to_string(),
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => format!("[{v6}]"),
    }
}

/// The Host of a row's request: its own, or the gateway's as the Go suite computes it from the
/// gateway address and the listener port (never the local socket's port).
fn request_host(r: &case::Request, addr: SocketAddr) -> String {
    r.host
        .clone()
        .unwrap_or_else(|| calculate_host(addr.ip(), listener_port(r), &r.scheme))
}

/// Builds the request of a row; `request_id` is appended to the path when given.
fn outgoing(
    item: &RequestItem,
    addr: SocketAddr,
    uuid: Option<&str>,
    request_id: Option<&str>,
    extra: &[(String, String)],
) -> client::Outgoing {
    let r = &item.request;
    let mut path = match uuid {
        Some(u) => r.path.replace("{uuid}", u),
        None => r.path.clone(),
    };
    if let Some(id) = request_id {
        path = with_request_id(&path, id);
    }
    let echo_set = r
        .backend_set_response_headers
        .iter()
        .flatten()
        .map(|(k, v)| format!("{k}:{v}"))
        .collect::<Vec<_>>()
        .join(",");
    let mut headers = vec![("X-Echo-Set-Header".to_owned(), echo_set)];
    headers.extend(r.headers.iter().map(|(k, v)| (k.clone(), v.clone())));
    headers.extend(extra.iter().cloned());
    client::Outgoing {
        addr,
        h2c: r.protocol == H2C,
        method: r.method.clone(),
        host: request_host(r, addr),
        path,
        headers,
    }
}

/// The WebSocket handshake of a row as the Go test dials it (`x/net/websocket`): to
/// `ws://<gateway address>/<path>`, whose Host keeps the listener port even when it is the
/// default (the address is not passed through `CalculateHost`), with only an `Origin`:
/// `ws://gateway/<t.Name()>`, lower-cased as the dialer writes it. No `X-Echo-Set-Header`.
fn websocket_outgoing(case: &str, item: &RequestItem, addr: SocketAddr) -> client::Outgoing {
    let r = &item.request;
    let subtest = item.name.as_deref().unwrap_or_default().replace(' ', "_");
    let test_name = format!("{GO_TEST_FUNCTION}/{case}/{subtest}");
    let headers = r
        .headers
        .iter()
        .map(|(k, v)| {
            let v = v.replace(GO_TEST_NAME, &test_name);
            let v = if k.eq_ignore_ascii_case("origin") {
                v.to_lowercase()
            } else {
                v
            };
            (k.clone(), v)
        })
        .collect();
    client::Outgoing {
        addr,
        h2c: false,
        method: r.method.clone(),
        host: r
            .host
            .clone()
            .unwrap_or_else(|| SocketAddr::new(addr.ip(), listener_port(r)).to_string()),
        path: r.path.clone(),
        headers,
    }
}

/// Sends one probe of a row and compares; returns the response for further checks.
async fn probe(
    item: &RequestItem,
    addr: SocketAddr,
    request_id: Option<&str>,
    extra: &[(String, String)],
) -> anyhow::Result<client::Response> {
    let uuid = item.request.uuid_query_param.then(random_id);
    let req = outgoing(item, addr, uuid.as_deref(), request_id, extra);
    let resp = client::send(&req).await?;
    // As the Go suite's: the scheme, `CalculateHost` of the gateway address, then the path.
    let url = format!(
        "{}://{}{}",
        item.request.scheme,
        calculate_host(
            addr.ip(),
            listener_port(&item.request),
            &item.request.scheme
        ),
        req.path
    );
    let sent = Sent {
        method: &item.request.method,
        uuid: uuid.as_deref(),
        request_id,
        url: &url,
    };
    compare(&item.expect, &sent, &resp).map_err(|e| anyhow!(e))?;
    Ok(resp)
}

/// How the probes of a row converge (the parts of Go's `TimeoutConfig` that
/// `AwaitConvergence` reads).
#[derive(Debug, Clone, Copy)]
struct Convergence {
    /// Passes in a row that make the row consistent.
    passes: usize,
    /// From the first attempt; checked before every attempt.
    deadline: Duration,
    /// The wait after a failed attempt (none after a pass).
    poll: Duration,
}

/// Time as the convergence loops read it, so their tests can run on a clock of their own.
trait Clock {
    /// Time since the clock's origin.
    fn elapsed(&self) -> Duration;
    fn sleep(&self, duration: Duration) -> impl std::future::Future<Output = ()>;
}

/// The wall clock, from its creation.
struct RealClock(Instant);

impl RealClock {
    fn start() -> Self {
        Self(Instant::now())
    }
}

impl Clock for RealClock {
    fn elapsed(&self) -> Duration {
        self.0.elapsed()
    }

    fn sleep(&self, duration: Duration) -> impl std::future::Future<Output = ()> {
        tokio::time::sleep(duration)
    }
}

/// Rule 1, as Go's `AwaitConvergence`: repeat until the row passes `passes` times in a row; a
/// failed round trip is "not yet". The deadline is checked before every attempt, a run of
/// passes included; only a failure waits, for the poll interval or until the deadline.
async fn converge<C, F, Fut>(clock: &C, rule: Convergence, mut attempt: F) -> anyhow::Result<()>
where
    C: Clock,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let deadline = clock.elapsed() + rule.deadline;
    let mut passes = 0;
    let mut attempts = 0;
    let mut last = None;
    let timed_out = |last: Option<anyhow::Error>, attempts: usize, passes: usize| {
        let why = format!(
            "not consistent within {:?}: {attempts} attempts, {passes}/{} passes in a row at the end",
            rule.deadline, rule.passes
        );
        match last {
            Some(e) => e.context(why),
            None => anyhow!(why),
        }
    };
    loop {
        if clock.elapsed() >= deadline {
            return Err(timed_out(last, attempts, passes));
        }
        attempts += 1;
        match attempt().await {
            Ok(()) => {
                passes += 1;
                if passes >= rule.passes {
                    return Ok(());
                }
            }
            Err(e) => {
                passes = 0;
                last = Some(e);
                let left = deadline.saturating_sub(clock.elapsed());
                if left <= rule.poll {
                    clock.sleep(left).await;
                    return Err(timed_out(last, attempts, passes));
                }
                clock.sleep(rule.poll).await;
            }
        }
    }
}

/// Rule 1 with the suite's settings, on the wall clock.
async fn eventually<F, Fut>(attempt: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    converge(&RealClock::start(), CONSISTENT, attempt).await
}

/// Go's `ExpectMirroredRequest` for one mirror backend: `logged` is asked at once, then on
/// every tick, until it answers yes or the timeout is up. It starts before the request is
/// sent, so the timeout runs from there.
async fn await_mirror_log<C: Clock>(
    clock: &C,
    mut logged: impl FnMut() -> bool,
) -> Result<(), Duration> {
    let start = clock.elapsed();
    let mut tick = start;
    loop {
        if logged() {
            return Ok(());
        }
        tick += MIRROR_LOG_TICK;
        if tick >= start + MIRROR_LOG_TIMEOUT {
            clock
                .sleep((start + MIRROR_LOG_TIMEOUT).saturating_sub(clock.elapsed()))
                .await;
            return Err(MIRROR_LOG_TIMEOUT);
        }
        clock.sleep(tick.saturating_sub(clock.elapsed())).await;
    }
}

async fn run_item(
    case: &str,
    item: &RequestItem,
    gateways: &Gateways,
    fleet: &Fleet,
) -> anyhow::Result<()> {
    let addr = gateways.addr(&item.request.gateway)?;
    if item.request.protocol == WEBSOCKET {
        let req = websocket_outgoing(case, item, addr);
        return eventually(|| client::websocket(&req, &item.expect.websocket_exchange)).await;
    }
    let statistical = item.mirror_distribution.is_some();
    let request_id = (item.request.add_request_id_query && !statistical).then(random_id);
    let requests = eventually(|| async {
        probe(item, addr, request_id.as_deref(), &[])
            .await
            .map(|_| ())
    });
    // Mirrors with a percent are counted by `mirror_distribution` (`check_row` pairs them);
    // the others are watched from before the first request is sent, each on its own.
    let path = expected_path(
        &item.request.path,
        &Sent {
            method: "",
            uuid: None,
            request_id: request_id.as_deref(),
            url: "",
        },
    );
    let clock = RealClock::start();
    let mirrors = futures_util::future::try_join_all(
        item.expect
            .mirrored_to
            .iter()
            .filter(|m| m.percent.is_none())
            .map(|mirror| {
                let pods = fleet.pods_of(&mirror.backend);
                let path = &path;
                let clock = &clock;
                async move {
                    let logged = || {
                        pods.iter()
                            .any(|p| p.echo().is_some_and(|e| e.count_echoed(path) > 0))
                    };
                    await_mirror_log(clock, logged).await.map_err(|waited| {
                        anyhow!(
                            "no mirrored request {path} logged by {} within {waited:?}",
                            mirror.backend
                        )
                    })
                }
            }),
    );
    tokio::try_join!(mirrors, requests)?;

    if let Some(d) = &item.distribution {
        distribution(d, || async {
            let resp = probe(item, addr, None, &jitter()).await?;
            // A response that is not echo JSON has no pod, as in Go.
            Ok(resp.echo.map(|e| e.pod).unwrap_or_default())
        })
        .await?;
    }
    if let Some(m) = &item.mirror_distribution {
        mirror_distribution(item, m, addr, fleet).await?;
    }
    if let Some(r) = &item.repeat {
        for _ in 0..r.count {
            let resp = probe(item, addr, None, &[]).await?;
            let echo = resp.echo.context("no echo")?;
            let values: Vec<&String> = echo
                .headers
                .iter()
                .filter(|(k, _)| k.eq_ignore_ascii_case("Backend"))
                .flat_map(|(_, v)| v)
                .collect();
            match values.as_slice() {
                [v] if echo.pod.starts_with(v.as_str()) => {}
                other => bail!("pod {} saw Backend headers {other:?}", echo.pod),
            }
        }
    }
    Ok(())
}

/// Runs `n` requests, `concurrency` at a time, every one of them whatever the others' outcome;
/// returns each outcome.
async fn batch<T, F, Fut>(n: usize, concurrency: usize, request: F) -> Vec<anyhow::Result<T>>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<T>>,
{
    futures_util::stream::iter(0..n)
        .map(|_| request())
        .buffer_unordered(concurrency)
        .collect()
        .await
}

/// With a one-in-two chance, the `X-Jitter` header Go's `AddEntropy` adds (a random value
/// below 10000).
fn jitter() -> Vec<(String, String)> {
    if rand::random_bool(0.5) {
        vec![(
            "X-Jitter".to_owned(),
            rand::random_range(0..10_000u32).to_string(),
        )]
    } else {
        Vec::new()
    }
}

/// Go's `extractBackendName`: a pod name without its last two `-` parts (the ReplicaSet and
/// pod hashes), or the whole name when it has fewer than three parts.
fn backend_of_pod(pod: &str) -> &str {
    let parts: Vec<&str> = pod.split('-').collect();
    if parts.len() < 3 {
        return pod;
    }
    let kept: usize = parts[..parts.len() - 2].iter().map(|p| p.len() + 1).sum();
    &pod[..kept - 1]
}

/// Go's `TestWeightedDistribution` verdict on one attempt's serving pods, with the weights
/// keyed by Service name (no namespace: the per-request comparison has checked that): a pod
/// of another backend fails, so do a count of backends served other than the number of
/// positive weights, a positive weight without traffic, and a share off its weight by more
/// than the tolerance (shares of `total`).
fn judge_distribution(
    pods: &[String],
    weights: &BTreeMap<String, f64>,
    total: usize,
    tolerance: f64,
) -> Result<(), String> {
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for pod in pods {
        let backend = backend_of_pod(pod);
        if !weights.contains_key(backend) {
            return Err(format!(
                "request was handled by an unexpected pod {pod:?} (backend {backend:?})"
            ));
        }
        *seen.entry(backend).or_default() += 1;
    }
    let active = weights.values().filter(|w| **w > 0.0).count();
    let mut problems = Vec::new();
    if seen.len() != active {
        problems.push(format!(
            "{active} backends should receive traffic, {} did",
            seen.len()
        ));
    }
    for (backend, want) in weights {
        let Some(got) = seen.get(backend.as_str()) else {
            if *want != 0.0 {
                problems.push(format!("{backend} received no request"));
            }
            continue;
        };
        let share = *got as f64 / total as f64;
        if (share - want).abs() > tolerance {
            problems.push(format!(
                "{backend} got {share:.3} of the traffic, expected {want} (±{tolerance})"
            ));
        }
    }
    problems.sort();
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!("distribution {seen:?}: {}", problems.join("; ")))
    }
}

/// The weighted-distribution check: up to `max_attempts` batches of `sample`, which sends one
/// request and names the pod that served it; a batch fails as an attempt, whether a request
/// failed (round trip or comparison) or the distribution is off.
async fn distribution<F, Fut>(d: &case::Distribution, sample: F) -> anyhow::Result<()>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<String>>,
{
    let weights: BTreeMap<String, f64> = d
        .expected_fraction
        .iter()
        .map(|(backend, w)| {
            let service = backend
                .rsplit_once('/')
                .map_or(backend.as_str(), |(_, s)| s);
            (service.to_owned(), *w)
        })
        .collect();
    let mut last = anyhow!("no attempt");
    for attempt in 1..=d.max_attempts {
        let outcomes = batch(d.requests, d.concurrency, &sample).await;
        let verdict = match outcomes
            .into_iter()
            .collect::<anyhow::Result<Vec<String>>>()
        {
            Ok(pods) => judge_distribution(&pods, &weights, d.requests, d.tolerance_abs)
                .map_err(|e| anyhow!(e)),
            Err(e) => Err(e.context("a request of the batch failed")),
        };
        match verdict {
            Ok(()) => return Ok(()),
            Err(e) => last = e.context(format!("attempt {attempt}/{}", d.max_attempts)),
        }
    }
    Err(last)
}

/// The percentage-mirror check: up to `max_attempts` batches, each with a request id of its
/// own; every request of a batch is retried until it passes once (within the consistency
/// deadline, else the case fails), then the mirror's log is counted.
async fn mirror_distribution(
    item: &RequestItem,
    m: &case::MirrorDistribution,
    addr: SocketAddr,
    fleet: &Fleet,
) -> anyhow::Result<()> {
    let pods = fleet.pods_of(&m.backend);
    let mut last = anyhow!("no attempt");
    for attempt in 1..=m.max_attempts {
        let id = random_id();
        let outcomes = batch(m.requests, m.concurrency, || async {
            converge(&RealClock::start(), ONE_PASS, || async {
                probe(item, addr, Some(&id), &[]).await.map(|_| ())
            })
            .await
        })
        .await;
        for outcome in outcomes {
            outcome.context("a request of the mirror batch never passed")?;
        }
        let path = with_request_id(&item.request.path, &id);
        // Mirrors are fire-and-forget: wait until the count stops moving.
        let mut count = 0;
        let mut stable_since = Instant::now();
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline && stable_since.elapsed() < Duration::from_millis(300) {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let now: usize = pods
                .iter()
                .filter_map(|p| p.echo())
                .map(|e| e.count_echoed(&path))
                .sum();
            if now != count {
                count = now;
                stable_since = Instant::now();
            }
        }
        let [low, high] = m.accept_range;
        if (low..=high).contains(&(count as f64)) {
            return Ok(());
        }
        last = anyhow!(
            "attempt {attempt}/{}: {count} of {} requests mirrored to {}, expected {low}..{high}",
            m.max_attempts,
            m.requests,
            m.backend
        );
        if attempt < m.max_attempts {
            tokio::time::sleep(MIRROR_BATCH_PAUSE).await;
        }
    }
    Err(last)
}

/// A clock that only moves when slept on or told to.
#[cfg(test)]
struct FakeClock(std::cell::Cell<Duration>);

#[cfg(test)]
impl FakeClock {
    fn new() -> Self {
        Self(std::cell::Cell::new(Duration::ZERO))
    }

    fn advance(&self, by: Duration) {
        self.0.set(self.0.get() + by);
    }
}

#[cfg(test)]
impl Clock for FakeClock {
    fn elapsed(&self) -> Duration {
        self.0.get()
    }

    fn sleep(&self, duration: Duration) -> impl std::future::Future<Output = ()> {
        self.advance(duration);
        std::future::ready(())
    }
}

#[cfg(test)]
fn block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a test runtime")
        .block_on(future)
}

/// Runs `converge` on a fake clock with attempts that take `latency` each and give the
/// outcomes in turn (then fail); returns its result, the attempts made and the time taken.
#[cfg(test)]
fn converge_on(
    rule: Convergence,
    latency: Duration,
    outcomes: &[bool],
) -> (anyhow::Result<()>, usize, Duration) {
    let clock = FakeClock::new();
    let attempts = std::cell::Cell::new(0);
    let result = block_on(converge(&clock, rule, || {
        let n = attempts.get();
        attempts.set(n + 1);
        clock.advance(latency);
        let pass = outcomes.get(n).copied().unwrap_or(false);
        std::future::ready(if pass {
            Ok(())
        } else {
            Err(anyhow!("attempt {n} failed"))
        })
    }));
    (result, attempts.get(), clock.elapsed())
}

#[test]
fn convergence_waits_after_failures_only() {
    let (result, attempts, took) = converge_on(
        CONSISTENT,
        Duration::ZERO,
        &[false, false, true, true, true],
    );
    assert!(result.is_ok(), "{result:?}");
    assert_eq!(attempts, 5);
    assert_eq!(took, 2 * CONSISTENT.poll, "no wait after a pass");

    // A failure breaks the run of passes.
    let (result, attempts, _) = converge_on(
        CONSISTENT,
        Duration::ZERO,
        &[true, true, false, true, true, true],
    );
    assert!(result.is_ok(), "{result:?}");
    assert_eq!(attempts, 6);

    // One pass is enough for a percentage-mirror request.
    let (result, attempts, took) = converge_on(ONE_PASS, Duration::ZERO, &[false, true]);
    assert!(result.is_ok(), "{result:?}");
    assert_eq!((attempts, took), (2, ONE_PASS.poll));
}

#[test]
fn convergence_checks_the_deadline_before_every_attempt() {
    // Attempts that take 10 s each, a failure then passes: the second pass ends past the
    // deadline, so the third is never attempted.
    let clock_latency = Duration::from_secs(10);
    let (result, attempts, took) =
        converge_on(CONSISTENT, clock_latency, &[false, true, true, true]);
    let err = result.expect_err("the deadline passes during a run of passes");
    assert!(format!("{err:#}").contains("2/3 passes"), "{err:#}");
    assert_eq!(attempts, 3);
    assert_eq!(took, 3 * clock_latency + CONSISTENT.poll);

    // Failing throughout: attempts every 100 ms, the last wait cut to the deadline.
    let (result, attempts, took) = converge_on(CONSISTENT, Duration::ZERO, &[]);
    let err = result.expect_err("never passes");
    assert!(format!("{err:#}").contains("attempt 299 failed"), "{err:#}");
    assert_eq!(attempts, 300);
    assert_eq!(took, CONSISTENT.deadline);

    // A failure whose wait would cross the deadline fails at the deadline.
    let (result, attempts, took) = converge_on(CONSISTENT, Duration::from_millis(29_950), &[]);
    assert!(result.is_err());
    assert_eq!((attempts, took), (1, CONSISTENT.deadline));
}

#[test]
fn a_mirror_log_is_read_at_once_then_every_second_for_ten_seconds() {
    let run = |found_at: Option<usize>| {
        let clock = FakeClock::new();
        let mut reads = Vec::new();
        let result = block_on(await_mirror_log(&clock, || {
            reads.push(clock.elapsed());
            found_at == Some(reads.len() - 1)
        }));
        (result, reads, clock.elapsed())
    };
    let (result, reads, took) = run(Some(0));
    assert_eq!((result, reads.len(), took), (Ok(()), 1, Duration::ZERO));
    let (result, reads, _) = run(Some(9));
    assert_eq!(result, Ok(()));
    assert_eq!(reads, (0..10).map(Duration::from_secs).collect::<Vec<_>>());
    let (result, reads, took) = run(None);
    assert_eq!(result, Err(MIRROR_LOG_TIMEOUT));
    assert_eq!((reads.len(), took), (10, MIRROR_LOG_TIMEOUT));
}

#[test]
fn the_host_is_calculated_as_go_calculates_it() {
    let v4: IpAddr = [10, 0, 0, 1].into();
    let v6: IpAddr = "fd00::1".parse().expect("an IPv6 address");
    assert_eq!(calculate_host(v4, 80, "http"), "10.0.0.1");
    assert_eq!(calculate_host(v4, 80, "HTTP"), "10.0.0.1");
    assert_eq!(calculate_host(v4, 443, "https"), "10.0.0.1");
    assert_eq!(calculate_host(v4, 443, "http"), "10.0.0.1:443");
    assert_eq!(calculate_host(v4, 80, "https"), "10.0.0.1:80");
    assert_eq!(calculate_host(v4, 8080, "http"), "10.0.0.1:8080");
    assert_eq!(calculate_host(v4, 80, "ws"), "10.0.0.1:80");
    assert_eq!(calculate_host(v6, 80, "http"), "[fd00::1]");
    assert_eq!(calculate_host(v6, 8080, "http"), "[fd00::1]:8080");

    // A row without a host: the listener's port counts, not the local socket's.
    let row = |host: &str, port: u16| {
        let yaml = format!(
            "{{gateway: ns/gw, port: {port}, scheme: http, protocol: HTTP/1.1, host: {host}, path: /}}"
        );
        serde_yaml_ng::from_str::<case::Request>(&yaml).expect("a request")
    };
    let socket = SocketAddr::from(([127, 0, 0, 1], 41_234));
    assert_eq!(request_host(&row("null", 80), socket), "127.0.0.1");
    assert_eq!(request_host(&row("null", 8080), socket), "127.0.0.1:8080");
    assert_eq!(request_host(&row("example.com", 80), socket), "example.com");
}

#[test]
fn the_websocket_handshake_is_the_go_dialers() {
    let item: RequestItem = serde_yaml_ng::from_str(
        "{id: 0, name: websocket connection should reach backend, \
          request: {gateway: ns/gw, port: 80, scheme: ws, protocol: websocket, host: null, \
                    path: /ws, headers: {Origin: 'ws://gateway/<go test name>'}}, \
          expect: {status: 101}}",
    )
    .expect("a row");
    let socket = SocketAddr::from(([127, 0, 0, 1], 41_234));
    let req = websocket_outgoing("HTTPRouteBackendProtocolWebSocket", &item, socket);
    assert_eq!(
        req.host, "127.0.0.1:80",
        "the address as dialled, port included"
    );
    assert_eq!(req.path, "/ws");
    assert_eq!(
        req.headers,
        [(
            "Origin".to_owned(),
            "ws://gateway/testconformance/httproutebackendprotocolwebsocket/websocket_connection_should_reach_backend"
                .to_owned()
        )]
    );
}

#[test]
fn a_weighted_distribution_is_judged_by_service_name() {
    assert_eq!(
        backend_of_pod("infra-backend-v1-5d8f7c9b4-k7x0q1"),
        "infra-backend-v1"
    );
    assert_eq!(backend_of_pod("a-b-c"), "a");
    assert_eq!(backend_of_pod("a-b"), "a-b");
    assert_eq!(backend_of_pod(""), "");

    let weights: BTreeMap<String, f64> = [
        ("infra-backend-v1", 0.7),
        ("infra-backend-v2", 0.3),
        ("infra-backend-v3", 0.0),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    let pods = |v1: usize, v2: usize, v3: usize, other: &[&str]| {
        let mut pods = Vec::new();
        for (svc, n) in [
            ("infra-backend-v1", v1),
            ("infra-backend-v2", v2),
            ("infra-backend-v3", v3),
        ] {
            pods.extend((0..n).map(|i| format!("{svc}-5d8f7c9b4-p{}", i % 2)));
        }
        pods.extend(other.iter().map(|p| (*p).to_owned()));
        pods
    };
    let judge = |pods: &[String]| judge_distribution(pods, &weights, 500, 0.05);
    assert_eq!(judge(&pods(350, 150, 0, &[])), Ok(()));
    assert_eq!(judge(&pods(370, 130, 0, &[])), Ok(()), "within 0.05");
    assert!(judge(&pods(380, 120, 0, &[])).is_err(), "off by 0.06");
    let err = judge(&pods(349, 150, 1, &[])).unwrap_err();
    assert!(
        err.contains("2 backends should receive traffic, 3 did"),
        "{err}"
    );
    assert!(judge(&pods(500, 0, 0, &[])).is_err(), "v2 got nothing");
    let err = judge(&pods(349, 150, 0, &["web-backend-5d8f7c9b4-p0"])).unwrap_err();
    assert!(err.contains("unexpected pod"), "{err}");
    assert!(
        judge(&pods(349, 150, 0, &[""])).is_err(),
        "a response without a pod is an unexpected pod"
    );
}
