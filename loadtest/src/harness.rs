//! The load harness: starts the echo backend, then for each scenario starts the server under
//! test, checks one request end to end, drives closed-loop load at it, records latency
//! percentiles, throughput, errors, the server's memory and CPU time, and stops it again.
//!
//! Fairness: the server under test is pinned to its own CPUs (`server_cpus`), the load
//! generator and the echo backend share the others, and the proxy gets as many worker
//! threads as nginx gets worker processes. The `direct` baseline therefore measures what the
//! client side plus origin can do on their CPUs alone; the other scenarios add one hop on a
//! CPU of its own. In the tunnel scenarios the mock edge plays Cloudflare's network, so it
//! runs with the load generator on `load_cpus`, and only the proxy is on `server_cpus`.

pub mod chart;
pub mod load;
pub mod machine;
pub mod memory;
pub mod process;
pub mod procfs;
pub mod progress;
pub mod report;
pub mod report_files;
pub mod results;
pub mod scenario;
pub mod stats;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cftunnel_testkit::echo::{EchoConfig, EchoIdentity, EchoServer};
use cftunnel_testkit::ports::free_port;
use load::LoadSpec;
use process::{CpuList, ProcessError, ScratchDir, ServerProcess};
use procfs::Memory;
use progress::{status_line, Progress, RateMeter};
use report::{Report, ScenarioReport, ServerCpu, Settings};
use results::Outcome;
use scenario::{Scenario, ScenarioEnv, LOAD_HOST};

const ECHO_READY_TIMEOUT: Duration = Duration::from_secs(10);

/// Everything one run needs.
#[derive(Debug, Clone)]
pub struct RunConfig {
    pub scenarios: Vec<Scenario>,
    pub duration: Duration,
    pub warmup: Duration,
    pub connections: usize,
    /// Total offered requests per second, paced over the connections; `None`: closed loop.
    pub rate: Option<f64>,
    /// Times the whole scenario list is run; each scenario reports its median round (by
    /// req/s, or by p50 when paced).
    pub rounds: usize,
    /// Proxy worker threads and nginx worker processes.
    pub workers: usize,
    /// Tunnel connections the proxy opens to the mock edge in the tunnel scenarios (its HA
    /// connections; the edge spreads requests over them).
    pub tunnel_connections: usize,
    /// Request target of the load, e.g. `/loadtest`.
    pub path: String,
    pub proxy_bin: PathBuf,
    /// The `cftunnel-mock-edge` binary, for the tunnel scenarios.
    pub edge_bin: PathBuf,
    /// The `cftunnel-echo` binary; when missing, the echo backend runs inside the harness.
    pub echo_bin: Option<PathBuf>,
    pub nginx_bin: Option<PathBuf>,
    /// A `cloudflared` binary, for the `cloudflared-*` scenarios.
    pub cloudflared_bin: Option<PathBuf>,
    /// CPUs for the server under test and for the echo backend; `None`: no pinning.
    pub server_cpus: Option<CpuList>,
    pub echo_cpus: Option<CpuList>,
    /// The harness pins itself to these before its runtime starts; the mock edge is pinned
    /// to them too.
    pub load_cpus: Option<CpuList>,
    /// Keep the scratch directory (configs, logs) after the run.
    pub keep_scratch: bool,
    /// Send only `Host` on the plain paths too, instead of the headers a tunnel path adds
    /// ([`Scenario::edge_headers`]).
    pub bare_requests: bool,
}

/// A failure that stops the whole run (scenario failures are reported, not raised).
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("creating the scratch directory: {0}")]
    Scratch(std::io::Error),
    #[error("starting the echo backend: {0}")]
    EchoProcess(#[from] ProcessError),
    #[error("starting the in-process echo backend: {0}")]
    EchoInProcess(std::io::Error),
    #[error("no free port for the echo backend: {0}")]
    Port(std::io::Error),
}

/// The origin all scenarios forward to.
enum EchoBackend {
    Process(ServerProcess, SocketAddr),
    InProcess(EchoServer),
}

impl EchoBackend {
    fn addr(&self) -> SocketAddr {
        match self {
            Self::Process(_, addr) => *addr,
            Self::InProcess(server) => server.http_addr(),
        }
    }

    async fn stop(self) {
        match self {
            Self::Process(process, _) => process.stop().await,
            Self::InProcess(server) => server.shutdown().await,
        }
    }
}

async fn start_echo(cfg: &RunConfig, scratch: &ScratchDir) -> Result<EchoBackend, RunError> {
    let identity = EchoIdentity {
        namespace: "loadtest".to_owned(),
        pod: "echo-loadtest-0".to_owned(),
    };
    let Some(bin) = cfg.echo_bin.as_ref().filter(|b| b.is_file()) else {
        let server = EchoServer::start(EchoConfig {
            http_addr: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
            h2c_addr: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
            identity,
            record_log: false,
            print_log: false,
        })
        .await
        .map_err(RunError::EchoInProcess)?;
        return Ok(EchoBackend::InProcess(server));
    };
    let http = free_port().map_err(RunError::Port)?;
    let h2c = free_port().map_err(RunError::Port)?;
    let threads = cfg.echo_cpus.as_ref().map_or(1, CpuList::count).max(1);
    let args = vec![
        "--http-addr".to_owned(),
        http.to_string(),
        "--h2c-addr".to_owned(),
        h2c.to_string(),
        "--quiet".to_owned(),
        "--worker-threads".to_owned(),
        threads.to_string(),
    ];
    let env = vec![
        ("NAMESPACE".to_owned(), identity.namespace),
        ("POD_NAME".to_owned(), identity.pod),
    ];
    let mut process = ServerProcess::spawn(
        "echo",
        bin,
        &args,
        &env,
        &[],
        cfg.echo_cpus.as_ref(),
        scratch.path(),
    )?;
    process
        .wait_ready(http, &http.to_string(), "/health", ECHO_READY_TIMEOUT)
        .await?;
    Ok(EchoBackend::Process(process, http))
}

/// Runs every configured scenario in order. `progress` gets one line per step and, on a
/// terminal, a live status line while the load runs.
pub async fn run(cfg: &RunConfig, progress: &Progress) -> Result<Report, RunError> {
    let scratch = ScratchDir::create(cfg.keep_scratch).map_err(RunError::Scratch)?;
    let echo = start_echo(cfg, &scratch).await?;
    progress.line(&format!(
        "echo backend on {} ({})",
        echo.addr(),
        match &echo {
            EchoBackend::Process(..) => "child process",
            EchoBackend::InProcess(_) => "in-process: cftunnel-echo binary not found",
        }
    ));
    if cfg.keep_scratch {
        progress.line(&format!("configs and logs in {}", scratch.path().display()));
    }
    let env = ScenarioEnv {
        echo_addr: echo.addr(),
        workers: cfg.workers,
        tunnel_connections: cfg.tunnel_connections,
        server_cpus: cfg.server_cpus.as_ref(),
        proxy_bin: &cfg.proxy_bin,
        edge_bin: &cfg.edge_bin,
        client_cpus: cfg.load_cpus.as_ref(),
        nginx_bin: cfg.nginx_bin.as_ref(),
        cloudflared_bin: cfg.cloudflared_bin.as_deref(),
        scratch: scratch.path(),
    };
    // rounds[i] holds every round's report of cfg.scenarios[i]
    let mut rounds: Vec<Vec<ScenarioReport>> = vec![Vec::new(); cfg.scenarios.len()];
    let total = cfg.rounds.max(1);
    for round in 1..=total {
        for (i, &scenario) in cfg.scenarios.iter().enumerate() {
            // A skipped scenario stays skipped; do not retry it every round.
            if rounds[i]
                .first()
                .is_some_and(|r| r.outcome == Outcome::Skipped)
            {
                continue;
            }
            let name = scenario.name();
            progress.status(&format!("{name}: starting (round {round}/{total})"));
            let label = format!("round {round}/{total} · {name}");
            let report = run_scenario(scenario, &env, cfg, progress, &label).await;
            match (&report.outcome, &report.reason, &report.load) {
                (Outcome::Ok, _, Some(load)) => {
                    progress.line(&format!(
                        "{label}: {} req/s, p50 {:.3} ms, p99 {:.3} ms",
                        stats::format_thousands(load.rps),
                        load.p50_us as f64 / 1000.0,
                        load.p99_us as f64 / 1000.0
                    ));
                }
                (outcome, reason, _) => progress.line(&format!(
                    "{name}: {}: {}",
                    outcome.as_str(),
                    reason.as_deref().unwrap_or("")
                )),
            }
            rounds[i].push(report);
        }
    }
    progress.clear();
    echo.stop().await;
    let scenarios = rounds
        .into_iter()
        .filter_map(|r| report::median_round(r, cfg.rate.is_some()))
        .collect();
    Ok(Report::new(settings(cfg), scenarios))
}

fn settings(cfg: &RunConfig) -> Settings {
    let cpus = |c: &Option<CpuList>| c.as_ref().map(|c| c.to_string());
    Settings {
        duration_s: cfg.duration.as_secs_f64(),
        warmup_s: cfg.warmup.as_secs_f64(),
        connections: cfg.connections,
        rate: cfg.rate,
        rounds: cfg.rounds.max(1),
        workers: cfg.workers,
        tunnel_connections: cfg.tunnel_connections,
        path: cfg.path.clone(),
        bare_requests: cfg.bare_requests,
        load_cpus: cpus(&cfg.load_cpus),
        server_cpus: cpus(&cfg.server_cpus),
        echo_cpus: cpus(&cfg.echo_cpus),
    }
}

async fn run_scenario(
    scenario: Scenario,
    env: &ScenarioEnv<'_>,
    cfg: &RunConfig,
    progress: &Progress,
    label: &str,
) -> ScenarioReport {
    let mut report = ScenarioReport::new(scenario);
    let target = match scenario.start(env).await {
        Ok(target) => target,
        Err(e) => {
            report.outcome = if e.is_skip() {
                Outcome::Skipped
            } else {
                Outcome::Failed
            };
            report.reason = Some(e.to_string());
            return report;
        }
    };
    let pid = target.server.as_ref().and_then(ServerProcess::pid);
    let edge_pid = target.helpers.first().and_then(ServerProcess::pid);
    let headers = if cfg.bare_requests {
        Vec::new()
    } else {
        scenario.edge_headers()
    };
    let spec = LoadSpec {
        target: target.addr,
        host: LOAD_HOST.to_owned(),
        path: cfg.path.clone(),
        headers,
        connections: cfg.connections,
        warmup: cfg.warmup,
        duration: cfg.duration,
        rate: cfg.rate,
        edge: target.edge.clone(),
        answered: Arc::new(AtomicU64::new(0)),
    };
    match load::send_one(&spec).await {
        Ok((status, body)) if status == http::StatusCode::OK => {
            report.origin_headers = echoed_header_names(&body);
        }
        other => {
            report.outcome = Outcome::Failed;
            report.reason = Some(match other {
                Ok((status, _)) => format!("first request answered {status}, expected 200"),
                Err(e) => format!("first request failed: {e}"),
            });
            target.stop().await;
            return report;
        }
    }
    report.memory_idle = read_memory(pid).await;
    let load_cpus = cfg.load_cpus.as_ref().map(CpuList::cpus);
    let measured = async {
        tokio::join!(
            load::run(&spec),
            server_cpu_in_window(pid, cfg.warmup, cfg.duration),
            server_cpu_in_window(edge_pid, cfg.warmup, cfg.duration),
            cpus_busy_in_window(load_cpus.as_deref(), cfg.warmup, cfg.duration)
        )
    };
    let (load, cpu, edge_cpu, load_cpus_busy) = tokio::select! {
        done = measured => done,
        never = show_live_rate(progress, label, &spec.answered, cfg.warmup + cfg.duration) => match never {},
    };
    report.server_cpu = cpu.map(|cpu| ServerCpu::new(cpu, cfg.duration, load.requests));
    report.edge_cpu = edge_cpu.map(|cpu| ServerCpu::new(cpu, cfg.duration, load.requests));
    report.load_cpus_busy = load_cpus_busy;
    report.load = Some(load);
    report.memory_after = read_memory(pid).await;
    report.outcome = Outcome::Ok;
    target.stop().await;
    report
}

/// Redraws the status line with the elapsed time and the live rate until dropped.
async fn show_live_rate(
    progress: &Progress,
    label: &str,
    answered: &AtomicU64,
    total: Duration,
) -> std::convert::Infallible {
    let started = std::time::Instant::now();
    let mut meter = RateMeter::default();
    loop {
        let now = std::time::Instant::now();
        let rps = meter.sample(now, answered.load(Ordering::Relaxed));
        if progress.is_live() {
            progress.status(&status_line(label, now - started, total, rps));
        }
        tokio::time::sleep(progress::REDRAW).await;
    }
}

/// The header names in an echo backend's answer (`{"headers": {"Name": [...]}}`), lower-cased
/// and sorted; empty when the body is not such an answer.
fn echoed_header_names(body: &[u8]) -> Vec<String> {
    let Ok(answer) = serde_json::from_slice::<serde_json::Value>(body) else {
        return Vec::new();
    };
    let mut names: Vec<String> = answer
        .get("headers")
        .and_then(serde_json::Value::as_object)
        .map(|h| h.keys().map(|k| k.to_ascii_lowercase()).collect())
        .unwrap_or_default();
    names.sort();
    names
}

async fn read_memory(pid: Option<u32>) -> Option<Memory> {
    procfs::memory(pid?).await
}

/// Reads `sample` when the measurement window opens (after `warmup`) and when it closes
/// (`duration` later).
async fn window_samples<T, F, Fut>(
    warmup: Duration,
    duration: Duration,
    mut sample: F,
) -> Option<(T, T)>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    tokio::time::sleep(warmup).await;
    let before = sample().await?;
    tokio::time::sleep(duration).await;
    Some((before, sample().await?))
}

/// How busy the load CPUs are inside the measurement window, counting every process on
/// them: the load generator, the in-process or child mock edge and the echo backend when it
/// shares them. Near 1.0 the peers queue behind each other and latency measures the load
/// machine, not the server under test.
async fn cpus_busy_in_window(
    cpus: Option<&[usize]>,
    warmup: Duration,
    duration: Duration,
) -> Option<f64> {
    let cpus = cpus?;
    let ticks = procfs::ticks_per_second().await;
    let (before, after) =
        window_samples(warmup, duration, || procfs::cpu_idle(cpus, ticks)).await?;
    after.busy_since(before)
}

/// CPU time the server under test spends inside the measurement window (starting after
/// `warmup`, lasting `duration`).
async fn server_cpu_in_window(
    pid: Option<u32>,
    warmup: Duration,
    duration: Duration,
) -> Option<Duration> {
    let pid = pid?;
    let ticks = procfs::ticks_per_second().await;
    let (before, after) = window_samples(warmup, duration, || procfs::cpu_time(pid, ticks)).await?;
    after.checked_sub(before)
}
