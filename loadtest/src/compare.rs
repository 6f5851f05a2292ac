//! The side-by-side comparison (`cftunnel-loadtest compare`, `loadtest/compare.sh`): `wrk`
//! on the load CPU against the same nginx backend, directly and through each reverse proxy
//! alone on the server CPU (`cftunnel-proxy` with its defaults, nginx and HAProxy, one
//! worker each), and optionally through the mock edge's tunnel to the proxy's connector and
//! to `cloudflared`. Every row runs in every round, rounds rotate the order so no row always
//! follows the same neighbour, and each row reports its median round, with ratios against
//! nginx as the reverse proxy.
//!
//! Every server starts once, before the first round, and stays up (idle between its turns);
//! a row whose program is missing is skipped with the reason.

pub mod servers;
pub mod wrk;

use std::path::Path;
use std::time::Duration;

use crate::harness::process::{CpuList, ScratchDir};
use crate::harness::procfs;
use crate::harness::progress::{status_line, Progress, RateMeter};
use crate::harness::results::{Group, Machine, Measured, Outcome, Results, Series, SCHEMA};
use crate::harness::scenario::tunnel::Connector;
pub use crate::harness::scenario::tunnel::Transport;
use crate::harness::scenario::{StartError, Target};
use crate::harness::stats::format_thousands;
use servers::{Backend, Programs, RowEnv};

/// The row every ratio is taken against: nginx as the reverse proxy.
pub const BASELINE: Row = Row::Nginx;
/// Extra time wrk gets beyond its duration before it is killed.
const WRK_GRACE: Duration = Duration::from_secs(30);

/// One arrangement in front of the backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum Row {
    /// wrk straight to the backend.
    Direct,
    /// `cftunnel-proxy`, defaults, routed to the backend by its config API.
    CftunnelProxy,
    /// nginx as the reverse proxy.
    Nginx,
    /// HAProxy as the reverse proxy.
    Haproxy,
    /// The mock edge's HTTP listener, a tunnel, and the proxy's connector.
    TunnelConnector,
    /// The mock edge's HTTP listener, a tunnel, and `cloudflared`.
    TunnelCloudflared,
}

impl Row {
    pub fn name(self) -> &'static str {
        match self {
            Self::Direct => "direct",
            Self::CftunnelProxy => "cftunnel-proxy",
            Self::Nginx => "nginx",
            Self::Haproxy => "haproxy",
            Self::TunnelConnector => "tunnel: cftunnel-proxy",
            Self::TunnelCloudflared => "tunnel: cloudflared",
        }
    }

    /// What runs on the server CPU, for the table's legend.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Direct => "wrk to the backend, nothing in between",
            Self::CftunnelProxy => "cftunnel-proxy, defaults, config pushed with PUT /config",
            Self::Nginx => "nginx, 1 worker, keep-alive upstream",
            Self::Haproxy => "HAProxy, nbthread 1, http-reuse always",
            Self::TunnelConnector => {
                "cftunnel-mock-edge (load CPU) -> tunnel -> cftunnel-proxy's connector"
            }
            Self::TunnelCloudflared => {
                "cftunnel-mock-edge (load CPU) -> tunnel -> cloudflared (GOMAXPROCS=1)"
            }
        }
    }
}

/// The rows run by default; the tunnel rows are added when a `cloudflared` is given.
pub const DEFAULT_ROWS: [Row; 4] = [Row::Direct, Row::CftunnelProxy, Row::Nginx, Row::Haproxy];
pub const TUNNEL_ROWS: [Row; 2] = [Row::TunnelConnector, Row::TunnelCloudflared];

/// Everything one comparison needs.
#[derive(Debug, Clone)]
pub struct CompareConfig {
    pub rows: Vec<Row>,
    pub rounds: usize,
    /// wrk `-d`, whole seconds.
    pub duration: Duration,
    /// wrk `-c`, one group per value, in this order.
    pub connections: Vec<usize>,
    /// wrk `-t`.
    pub threads: usize,
    /// An unrecorded wrk run per row before the first round (zero: none).
    pub warmup: Duration,
    /// wrk, the backend and the mock edge; `None`: no pinning.
    pub load_cpus: Option<CpuList>,
    /// The proxy under test (and the connector of a tunnel row).
    pub server_cpus: Option<CpuList>,
    pub tunnel: Transport,
    pub tunnel_connections: usize,
    pub programs: Programs,
    pub keep_scratch: bool,
}

/// One wrk run of the plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    /// From 1.
    pub round: usize,
    pub connections: usize,
    pub row: Row,
}

/// The order of the runs: each round runs every connection count, and within it every row;
/// round `r` starts `r - 1` rows further down the list, so each row runs early in one round
/// and late in another.
pub fn plan(rows: &[Row], connections: &[usize], rounds: usize) -> Vec<Step> {
    let n = rows.len();
    (1..=rounds.max(1))
        .flat_map(|round| {
            connections.iter().flat_map(move |&c| {
                (0..n).map(move |i| Step {
                    round,
                    connections: c,
                    row: rows[(i + round - 1) % n],
                })
            })
        })
        .collect()
}

/// `taskset -c <cpus> ` when pinned.
fn pin_prefix(cpus: Option<&CpuList>) -> String {
    cpus.map_or(String::new(), |c| format!("taskset -c {c} "))
}

/// The exact command of one step, as run (the hook script and the target's port vary).
pub fn wrk_command(cfg: &CompareConfig, connections: usize, script: &Path, url: &str) -> String {
    let wrk = cfg
        .programs
        .wrk
        .as_ref()
        .map_or("wrk".to_owned(), |p| p.display().to_string());
    format!(
        "{}{wrk} {}",
        pin_prefix(cfg.load_cpus.as_ref()),
        wrk::args(cfg.threads, connections, cfg.duration, Some(script), url).join(" ")
    )
}

/// The group name for a connection count: the wrk flags that made its load.
pub fn group_name(cfg: &CompareConfig, connections: usize) -> String {
    format!(
        "wrk -t{} -c{connections} -d{}s",
        cfg.threads,
        cfg.duration.as_secs().max(1)
    )
}

/// What a run would do, without doing it: rows, commands, order and length.
pub fn describe_plan(cfg: &CompareConfig) -> String {
    use std::fmt::Write as _;
    let steps = plan(&cfg.rows, &cfg.connections, cfg.rounds);
    let secs =
        steps.len() as u64 * cfg.duration.as_secs() + cfg.rows.len() as u64 * cfg.warmup.as_secs();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} rounds x {} connection count(s) x {} rows = {} wrk runs of {} s, about {} min with warm-up",
        cfg.rounds,
        cfg.connections.len(),
        cfg.rows.len(),
        steps.len(),
        cfg.duration.as_secs(),
        secs.div_ceil(60)
    );
    let _ = writeln!(out, "\nrows (ratios against {}):", BASELINE.name());
    let w = cfg.rows.iter().map(|r| r.name().len()).max().unwrap_or(0);
    for row in &cfg.rows {
        let _ = writeln!(out, "  {:<w$}  {}", row.name(), row.describe());
    }
    let load = pin_prefix(cfg.load_cpus.as_ref());
    let server = pin_prefix(cfg.server_cpus.as_ref());
    let _ = writeln!(out, "\ncommands:");
    let _ = writeln!(
        out,
        "  backend:  {load}nginx -c <scratch>/backend.conf  (1 worker, return 200)"
    );
    for &c in &cfg.connections {
        let _ = writeln!(
            out,
            "  load:     {}",
            wrk_command(
                cfg,
                c,
                Path::new("<scratch>/report.lua"),
                "http://127.0.0.1:<port>/"
            )
        );
    }
    for row in &cfg.rows {
        let cmd = match row {
            Row::Direct => continue,
            Row::CftunnelProxy => format!(
                "{server}{} (PROXY_ADDR, PROXY_CONFIG_ADDR on free ports; then PUT /config)",
                cfg.programs.proxy.display()
            ),
            Row::Nginx => format!("{server}nginx -c <scratch>/nginx-proxy.conf"),
            Row::Haproxy => format!("{server}haproxy -f <scratch>/haproxy.cfg -db"),
            Row::TunnelConnector => format!(
                "{load}{} --listen <edge> --http <port>; {server}{} (TUNNEL_TOKEN, PROXY_TUNNEL_PROTOCOL={})",
                cfg.programs.mock_edge.display(),
                cfg.programs.proxy.display(),
                cfg.tunnel.as_str()
            ),
            Row::TunnelCloudflared => format!(
                "{load}{} --listen <edge> --http <port>; {server}{} tunnel --protocol {} ... run",
                cfg.programs.mock_edge.display(),
                cfg.programs
                    .cloudflared
                    .as_ref()
                    .map_or("cloudflared (not given: skipped)".to_owned(), |p| p.display().to_string()),
                cfg.tunnel.as_str()
            ),
        };
        let _ = writeln!(out, "  {:<w$}  {cmd}", row.name());
    }
    let _ = writeln!(out, "\norder:");
    for round in 1..=cfg.rounds {
        let parts: Vec<String> = cfg
            .connections
            .iter()
            .map(|&c| {
                let names: Vec<&str> = steps
                    .iter()
                    .filter(|s| s.round == round && s.connections == c)
                    .map(|s| s.row.name())
                    .collect();
                format!("c{c}: {}", names.join(", "))
            })
            .collect();
        let _ = writeln!(out, "  round {round}: {}", parts.join("; "));
    }
    out
}

/// One measured wrk run.
#[derive(Debug, Clone)]
struct RoundResult {
    run: wrk::WrkRun,
    /// The server's CPU per request: all of it, and in user space.
    cpu_us_per_request: Option<(f64, f64)>,
}

/// A row's state through the run.
enum RowState {
    Running(Box<Target>),
    Skipped(String),
    Failed(String),
}

#[derive(Debug, thiserror::Error)]
pub enum CompareError {
    #[error("wrk is not installed (apt-get install -y wrk)")]
    NoWrk,
    #[error("nginx is not installed (apt-get install -y nginx); it is the backend of every row")]
    NoBackend,
    #[error("creating the scratch directory: {0}")]
    Scratch(std::io::Error),
    #[error("writing {path}: {source}")]
    Write {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("starting the backend: {0}")]
    Backend(StartError),
}

/// Runs the comparison and returns its results file (the table is [`render_table`]).
pub async fn run(
    cfg: &CompareConfig,
    machine: Machine,
    command: String,
    progress: &Progress,
) -> Result<Results, CompareError> {
    let wrk_bin = cfg.programs.wrk.clone().ok_or(CompareError::NoWrk)?;
    let nginx = cfg.programs.nginx.clone().ok_or(CompareError::NoBackend)?;
    let scratch = ScratchDir::create(cfg.keep_scratch).map_err(CompareError::Scratch)?;
    let dir = scratch.path();
    if cfg.keep_scratch {
        progress.line(&format!("configs and logs in {}", dir.display()));
    }
    let script = dir.join("report.lua");
    std::fs::write(&script, wrk::report_script()).map_err(|source| CompareError::Write {
        path: script.clone(),
        source,
    })?;
    let backend = servers::start_backend(&nginx, cfg.load_cpus.as_ref(), dir)
        .await
        .map_err(CompareError::Backend)?;
    progress.line(&format!(
        "backend: nginx `return 200` on {} (CPU {})",
        backend.addr,
        cfg.load_cpus
            .as_ref()
            .map_or("any".to_owned(), CpuList::to_string)
    ));
    let row_env = RowEnv {
        programs: &cfg.programs,
        backend: backend.addr,
        load_cpus: cfg.load_cpus.as_ref(),
        server_cpus: cfg.server_cpus.as_ref(),
        tunnel: cfg.tunnel,
        tunnel_connections: cfg.tunnel_connections,
        dir,
    };
    let mut states = Vec::new();
    for &row in &cfg.rows {
        progress.status(&format!("starting {}", row.name()));
        let state = match start_row(row, &row_env, &backend).await {
            Ok(target) => {
                progress.line(&format!(
                    "{}: up on {}{}",
                    row.name(),
                    target.addr,
                    target
                        .server
                        .as_ref()
                        .and_then(|s| s.pid())
                        .map_or(String::new(), |p| format!(" (pid {p})"))
                ));
                RowState::Running(Box::new(target))
            }
            Err(e) if e.is_skip() => {
                progress.line(&format!("{}: skipped: {e}", row.name()));
                RowState::Skipped(e.to_string())
            }
            Err(e) => {
                progress.line(&format!("{}: failed to start: {e}", row.name()));
                RowState::Failed(e.to_string())
            }
        };
        states.push((row, state));
    }
    let ticks = procfs::ticks_per_second().await;
    let live = Live {
        progress,
        status_addr: backend.status_addr,
    };
    if !cfg.warmup.is_zero() {
        for (row, state) in &states {
            if let RowState::Running(target) = state {
                let args = wrk::args(
                    cfg.threads,
                    cfg.connections.first().copied().unwrap_or(64),
                    cfg.warmup,
                    None,
                    &url(target),
                );
                let label = format!("warm-up · {}", row.name());
                let _ = run_wrk(&wrk_bin, &args, cfg, &live, &label, cfg.warmup).await;
            }
        }
    }
    let running: Vec<Row> = states
        .iter()
        .filter(|(_, state)| matches!(state, RowState::Running(_)))
        .map(|(row, _)| *row)
        .collect();
    let steps = plan(&running, &cfg.connections, cfg.rounds);
    let mut measured: Vec<(Step, Result<RoundResult, String>)> = Vec::new();
    for (i, step) in steps.iter().enumerate() {
        let Some((_, RowState::Running(target))) = states.iter().find(|(r, _)| *r == step.row)
        else {
            continue;
        };
        let label = format!(
            "[{}/{}] round {}/{} · c{} · {}",
            i + 1,
            steps.len(),
            step.round,
            cfg.rounds,
            step.connections,
            step.row.name()
        );
        let args = wrk::args(
            cfg.threads,
            step.connections,
            cfg.duration,
            Some(&script),
            &url(target),
        );
        let pid = target.server.as_ref().and_then(|s| s.pid());
        let cpu_before = match pid {
            Some(pid) => procfs::cpu_times(pid, ticks).await,
            None => None,
        };
        let outcome = run_wrk(&wrk_bin, &args, cfg, &live, &label, cfg.duration).await;
        let cpu_after = match pid {
            Some(pid) => procfs::cpu_times(pid, ticks).await,
            None => None,
        };
        let result = outcome.and_then(|text| {
            wrk::parse(&text).map_err(|e| e.to_string()).map(|run| {
                let per_request =
                    |d: std::time::Duration| d.as_secs_f64() * 1e6 / run.requests as f64;
                let cpu = cpu_before
                    .zip(cpu_after)
                    .and_then(|(b, a)| a.since(b))
                    .filter(|_| run.requests > 0)
                    .map(|d| (per_request(d.total()), per_request(d.user)));
                RoundResult {
                    run,
                    cpu_us_per_request: cpu,
                }
            })
        });
        match &result {
            Ok(r) => progress.line(&format!(
                "{label}: {} req/s, p50 {:.3} ms, p99 {:.3} ms{}{}",
                format_thousands(r.run.rps()),
                r.run.p50_us as f64 / 1000.0,
                r.run.p99_us as f64 / 1000.0,
                r.cpu_us_per_request
                    .map_or(String::new(), |(all, user)| format!(
                        ", {all:.1} CPU us/req ({user:.1} in user space)"
                    )),
                if r.run.errors > 0 {
                    format!(", {} errors", r.run.errors)
                } else {
                    String::new()
                }
            )),
            Err(e) => progress.line(&format!("{label}: failed: {e}")),
        }
        measured.push((*step, result));
    }
    progress.clear();
    let mut setup = vec![
        format!(
            "load: {}wrk -t{} -c<N> -d{}s --latency <url> (a done hook prints the latency curve), {} rounds, order rotated each round, median round by req/s",
            pin_prefix(cfg.load_cpus.as_ref()),
            cfg.threads,
            cfg.duration.as_secs().max(1),
            cfg.rounds
        ),
        format!(
            "backend: nginx, 1 worker, `return 200`, {}; proxies alone on {}",
            cfg.load_cpus.as_ref().map_or("unpinned".to_owned(), |c| format!("CPU {c}")),
            cfg.server_cpus.as_ref().map_or("unpinned CPUs".to_owned(), |c| format!("CPU {c}")),
        ),
    ];
    if cfg.rows.iter().any(|r| TUNNEL_ROWS.contains(r)) {
        setup.push(format!(
            "tunnel rows: wrk -> cftunnel-mock-edge's HTTP listener (load CPU) -> {} tunnel, {} connection(s) -> connector (server CPU) -> backend",
            cfg.tunnel.as_str(),
            cfg.tunnel_connections
        ));
    }
    let groups = cfg
        .connections
        .iter()
        .map(|&c| {
            let series = states
                .iter()
                .map(|(row, state)| series(*row, state, c, &measured))
                .collect();
            Group {
                name: group_name(cfg, c),
                baseline: None,
                series,
            }
            .with_baseline(BASELINE.name())
        })
        .collect();
    for (_, state) in states {
        if let RowState::Running(target) = state {
            target.stop().await;
        }
    }
    backend.process.stop().await;
    drop(scratch);
    Ok(Results {
        schema: SCHEMA.to_owned(),
        kind: "compare".to_owned(),
        title: "Side by side: cftunnel-proxy, nginx and HAProxy as reverse proxies (wrk)"
            .to_owned(),
        generated_at: crate::harness::results::now_rfc3339(),
        command,
        machine,
        setup,
        groups,
        details: None,
    })
}

async fn start_row(row: Row, env: &RowEnv<'_>, backend: &Backend) -> Result<Target, StartError> {
    match row {
        Row::Direct => Ok(Target {
            addr: backend.addr,
            host: String::new(),
            server: None,
            helpers: Vec::new(),
            edge: None,
        }),
        Row::CftunnelProxy => servers::start_proxy(env).await,
        Row::Nginx => servers::start_nginx(env).await,
        Row::Haproxy => servers::start_haproxy(env).await,
        Row::TunnelConnector => servers::start_tunnel(env, Connector::Proxy).await,
        Row::TunnelCloudflared => servers::start_tunnel(env, Connector::Cloudflared).await,
    }
}

fn url(target: &Target) -> String {
    format!("http://{}/", target.addr)
}

/// The live status line's inputs.
struct Live<'a> {
    progress: &'a Progress,
    status_addr: std::net::SocketAddr,
}

/// Runs wrk pinned to the load CPUs and returns its stdout; on a terminal, redraws the
/// status line with the backend's live request rate meanwhile.
async fn run_wrk(
    wrk: &Path,
    args: &[String],
    cfg: &CompareConfig,
    live: &Live<'_>,
    label: &str,
    duration: Duration,
) -> Result<String, String> {
    let mut cmd = match &cfg.load_cpus {
        Some(cpus) => {
            let mut cmd = tokio::process::Command::new("taskset");
            cmd.arg("-c").arg(cpus.as_str()).arg(wrk);
            cmd
        }
        None => tokio::process::Command::new(wrk),
    };
    cmd.args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let child = cmd.spawn().map_err(|e| format!("starting wrk: {e}"))?;
    let output = child.wait_with_output();
    let watched = async {
        tokio::select! {
            out = tokio::time::timeout(duration + WRK_GRACE, output) => out,
            never = show_backend_rate(live, label, duration) => match never {},
        }
    };
    let out = watched
        .await
        .map_err(|_| format!("wrk did not finish within {:?}", duration + WRK_GRACE))?
        .map_err(|e| format!("waiting for wrk: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "wrk exited with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

async fn show_backend_rate(
    live: &Live<'_>,
    label: &str,
    total: Duration,
) -> std::convert::Infallible {
    let started = std::time::Instant::now();
    let mut meter = RateMeter::default();
    loop {
        if live.progress.is_live() {
            let rps = match servers::backend_requests(live.status_addr).await {
                Some(n) => meter.sample(std::time::Instant::now(), n),
                None => None,
            };
            live.progress
                .status(&status_line(label, started.elapsed(), total, rps));
        }
        tokio::time::sleep(crate::harness::progress::REDRAW).await;
    }
}

/// A row's series in the group of `connections`: its median round by req/s, with every
/// round's req/s and p99.
fn series(
    row: Row,
    state: &RowState,
    connections: usize,
    measured: &[(Step, Result<RoundResult, String>)],
) -> Series {
    let name = row.name().to_owned();
    match state {
        RowState::Skipped(reason) => {
            return Series {
                name,
                outcome: Outcome::Skipped,
                reason: Some(reason.clone()),
                measured: None,
            }
        }
        RowState::Failed(reason) => {
            return Series {
                name,
                outcome: Outcome::Failed,
                reason: Some(reason.clone()),
                measured: None,
            }
        }
        RowState::Running(_) => {}
    }
    let rounds: Vec<&Result<RoundResult, String>> = measured
        .iter()
        .filter(|(s, _)| s.row == row && s.connections == connections)
        .map(|(_, r)| r)
        .collect();
    let ok: Vec<&RoundResult> = rounds.iter().filter_map(|r| r.as_ref().ok()).collect();
    let Some(median) = median_round(&ok) else {
        let reason = rounds
            .iter()
            .find_map(|r| r.as_ref().err().cloned())
            .unwrap_or_else(|| "not run".to_owned());
        return Series {
            name,
            outcome: Outcome::Failed,
            reason: Some(reason),
            measured: None,
        };
    };
    let mut m: Measured = median.run.clone().into_measured(median.cpu_us_per_request);
    m.rounds_rps = ok.iter().map(|r| r.run.rps()).collect();
    m.rounds_p99_us = ok.iter().map(|r| r.run.p99_us).collect();
    let failed = rounds.len() - ok.len();
    Series {
        name,
        outcome: Outcome::Ok,
        reason: (failed > 0).then(|| format!("{failed} of {} rounds failed", rounds.len())),
        measured: Some(m),
    }
}

/// The median round by req/s (the lower middle one for an even count).
fn median_round<'a>(rounds: &[&'a RoundResult]) -> Option<&'a RoundResult> {
    let mut sorted = rounds.to_vec();
    sorted.sort_by(|a, b| a.run.rps().total_cmp(&b.run.rps()));
    sorted.get(sorted.len().checked_sub(1)? / 2).copied()
}

/// The comparison as a Markdown table (one row per group and series), ratios against the
/// group's baseline, then the tunnel rows against each other when both were measured.
pub fn render_table(results: &Results) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let fmt = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.2}"));
    let baseline = BASELINE.name();
    let _ = writeln!(
        out,
        "| load | row | req/s | p50 ms | p99 ms | errors | CPU µs/req | req/s vs {baseline} | p99 vs {baseline} | CPU vs {baseline} | rounds req/s |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|");
    for group in &results.groups {
        for s in &group.series {
            let Some(m) = &s.measured else {
                let _ = writeln!(
                    out,
                    "| {} | {} | {}: {} | | | | | | | | |",
                    group.name,
                    s.name,
                    s.outcome.as_str(),
                    s.reason
                        .as_deref()
                        .and_then(|r| r.lines().next())
                        .unwrap_or("")
                );
                continue;
            };
            let vs = m.vs_baseline;
            let (rps, p99, cpu) = if s.name == baseline {
                ("1.00".to_owned(), "1.00".to_owned(), "1.00".to_owned())
            } else {
                (
                    fmt(vs.and_then(|r| r.rps)),
                    fmt(vs.and_then(|r| r.p99)),
                    fmt(vs.and_then(|r| r.cpu_per_request)),
                )
            };
            let rounds: Vec<String> = m.rounds_rps.iter().map(|r| format_thousands(*r)).collect();
            let _ = writeln!(
                out,
                "| {} | {} | {} | {:.3} | {:.3} | {} | {} | {rps} | {p99} | {cpu} | {} |",
                group.name,
                s.name,
                format_thousands(m.rps),
                m.p50_us as f64 / 1000.0,
                m.p99_us as f64 / 1000.0,
                m.errors,
                match (m.server_cpu_us_per_request, m.server_user_us_per_request) {
                    (Some(all), Some(user)) => format!("{all:.1} ({user:.1} user)"),
                    (Some(all), None) => format!("{all:.1}"),
                    _ => "-".to_owned(),
                },
                rounds.join(" / ")
            );
        }
    }
    let pairs: Vec<String> = results
        .groups
        .iter()
        .filter_map(|g| {
            let find = |row: Row| {
                g.series
                    .iter()
                    .find(|s| s.name == row.name())
                    .and_then(|s| s.measured.as_ref())
            };
            let (ours, theirs) = (find(Row::TunnelConnector)?, find(Row::TunnelCloudflared)?);
            let r = crate::harness::results::Ratios::between(ours, theirs);
            Some(format!(
                "{}: tunnel cftunnel-proxy / cloudflared: req/s {}, p99 {}, CPU per request {}",
                g.name,
                fmt(r.rps),
                fmt(r.p99),
                fmt(r.cpu_per_request)
            ))
        })
        .collect();
    if !pairs.is_empty() {
        out.push('\n');
        for p in pairs {
            let _ = writeln!(out, "{p}");
        }
    }
    out
}

#[cfg(test)]
mod tests;
