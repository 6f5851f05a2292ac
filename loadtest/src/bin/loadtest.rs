//! `cftunnel-loadtest`: requests/s, p50/p99 latency, errors and memory of the echo backend
//! direct, through `cftunnel-proxy`, through the proxy behind the mock edge's QUIC or HTTP/2
//! tunnel, and through nginx, in one run, with ratios. `cftunnel-loadtest compare`: the
//! side-by-side comparison with wrk against nginx and HAProxy. Both write a results file and
//! a chart beside their table.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use cftunnel_loadtest::compare::{self, CompareConfig, Row};
use cftunnel_loadtest::harness::process::{find_program, pin_current_process, CpuList};
use cftunnel_loadtest::harness::progress::Progress;
use cftunnel_loadtest::harness::report_files;
use cftunnel_loadtest::harness::results::{self, Outcome, Results};
use cftunnel_loadtest::harness::scenario::Scenario;
use cftunnel_loadtest::harness::{self, machine, RunConfig};
use cftunnel_testkit::echo::parse_go_duration;
use clap::{Parser, Subcommand};

/// mimalloc, as the proxy uses: the load generator (and the in-process mock edge) allocate per request, and glibc's malloc would
/// cost several times more there, on the same cores as the server under test.
#[global_allocator]
static ALLOC: cftunnel_alloc::Mimalloc = cftunnel_alloc::Mimalloc;

/// Load harness: echo backend direct vs. through cftunnel-proxy (standalone or behind the mock
/// edge's tunnel) vs. through nginx, or through cloudflared behind the same mock edge.
///
/// CPU pinning (defaults for a 2-CPU machine): the server under test (proxy, nginx or
/// cloudflared, whose GOMAXPROCS is --workers) runs
/// alone on --server-cpus; the load generator and the echo backend share --load-cpus and
/// --echo-cpus, and the mock edge of the tunnel scenarios runs on --load-cpus. The proxy's
/// worker threads equal nginx's worker processes (--workers).
///
/// All scenarios: --scenarios direct,proxy,tunnel-quic,tunnel-http2,tunnel-quic-edge,tunnel-http2-edge,cloudflared-quic-edge,cloudflared-http2-edge,nginx
#[derive(Parser, Debug)]
#[command(
    name = "cftunnel-loadtest",
    version,
    args_conflicts_with_subcommands = true
)]
struct Args {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Subcommand, Debug)]
// Parsed once at start; the size of the larger variant costs nothing.
#[allow(clippy::large_enum_variant)]
enum Command {
    /// Side by side with wrk: the nginx backend direct and through cftunnel-proxy, nginx
    /// and HAProxy (one worker each, alone on --server-cpus), wrk and the backend on
    /// --load-cpus; with CLOUDFLARED set, also the proxy's connector against cloudflared
    /// behind cftunnel-mock-edge. Rounds rotate the order; each row reports its median
    /// round and its ratios against nginx.
    Compare(CompareArgs),
    /// Draws a results file's chart again, as an SVG beside it (e.g. after a change to the
    /// chart, or for a file from another machine).
    Chart {
        /// A results JSON written by this binary.
        results: PathBuf,
    },
}

/// Where the results file and the chart go.
#[derive(clap::Args, Debug)]
struct ReportArgs {
    /// Directory for the results JSON and the SVG chart (named <kind>-<UTC time>).
    #[arg(long, default_value = "target/loadtest-reports")]
    report_dir: PathBuf,
    /// Write no results file or chart.
    #[arg(long)]
    no_report: bool,
}

#[derive(clap::Args, Debug)]
struct RunArgs {
    /// Scenarios to run, in order.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "direct,proxy,nginx"
    )]
    scenarios: Vec<Scenario>,
    /// Measurement window per scenario (Go duration: 10s, 1m).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    duration: Duration,
    /// Load before the measurement window, not recorded.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    warmup: Duration,
    /// Concurrent keep-alive HTTP/1.1 connections, one request in flight on each.
    #[arg(long, default_value_t = 32)]
    connections: usize,
    /// Offer this many requests per second in total, paced evenly over the connections, to
    /// compare scenarios at equal load [default: unpaced closed loop].
    #[arg(long)]
    rate: Option<f64>,
    /// Run the scenario list this many times (interleaved); report each scenario's median
    /// round: by p50 with --rate, else by req/s. Helps on a noisy machine.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// Proxy worker threads (PROXY_WORKER_THREADS) and nginx worker_processes.
    #[arg(long, default_value_t = 1)]
    workers: usize,
    /// Tunnel connections from the proxy to the mock edge in the tunnel scenarios, 1 to 4
    /// (the connector's HA connections; the edge spreads requests over them).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u8).range(1..=4))]
    tunnel_connections: u8,
    /// Request target of every load request.
    #[arg(long, default_value = "/loadtest")]
    path: String,
    /// Send only Host on the plain paths (direct, proxy, nginx). By default they carry the
    /// headers a tunnel path adds on the way (the edge's Cf-Connecting-Ip, X-Forwarded-For and
    /// -Proto (which the proxy sets itself), Cf-Visitor, Cf-Ray and CDN-Loop, the connector's
    /// Cf-Warp-Tag-Id), so the origin gets the same header names on every path; with this
    /// flag a tunnel path's origin gets more headers, and the echo backend answers it with a
    /// longer body.
    #[arg(long)]
    bare_requests: bool,
    /// cftunnel-proxy binary [default: next to this binary, i.e. target/release/cftunnel-proxy].
    #[arg(long)]
    proxy_bin: Option<PathBuf>,
    /// cftunnel-mock-edge binary for the tunnel scenarios [default: next to --proxy-bin].
    #[arg(long)]
    edge_bin: Option<PathBuf>,
    /// cftunnel-echo binary [default: next to this binary]; if absent the echo backend runs
    /// inside the harness process.
    #[arg(long)]
    echo_bin: Option<PathBuf>,
    /// nginx binary [default: looked up on PATH and in /usr/sbin].
    #[arg(long)]
    nginx_bin: Option<PathBuf>,
    /// cloudflared binary for the cloudflared-* scenarios [default: $CLOUDFLARED, else
    /// looked up on PATH].
    #[arg(long, env = "CLOUDFLARED")]
    cloudflared_bin: Option<PathBuf>,
    /// CPUs of the load generator (this process) and of the mock edge.
    #[arg(long, default_value = "0")]
    load_cpus: CpuList,
    /// CPUs of the server under test (proxy, nginx).
    #[arg(long, default_value = "1")]
    server_cpus: CpuList,
    /// CPUs of the echo backend.
    #[arg(long, default_value = "0")]
    echo_cpus: CpuList,
    /// Do not pin anything with taskset.
    #[arg(long)]
    no_pin: bool,
    /// Print the report as JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Keep the generated configs and server logs (path printed at start).
    #[arg(long)]
    keep_scratch: bool,
    /// Instead of load: measure the proxy's memory while this config document is pushed
    /// --pushes times (e.g. the 10,000-rule document from
    /// `cargo run -p cftunnel-benches --example synthetic -- 10000`).
    #[arg(long, value_name = "FILE")]
    memory_config: Option<PathBuf>,
    /// Pushes of the --memory-config document.
    #[arg(long, default_value_t = 10)]
    pushes: usize,
    #[command(flatten)]
    report: ReportArgs,
}

#[derive(clap::Args, Debug)]
struct CompareArgs {
    /// Rounds; each runs every row at every connection count, the order rotated by one row
    /// per round.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// wrk -d, whole seconds (Go duration: 8s, 1m).
    #[arg(long, default_value = "8s", value_parser = parse_duration)]
    duration: Duration,
    /// wrk -c values, one table group each.
    #[arg(long, value_delimiter = ',', default_value = "64,32")]
    connections: Vec<usize>,
    /// wrk -t.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// An unrecorded wrk run per row before the first round (0s: none).
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    warmup: Duration,
    /// Rows to run, in order [default: direct,cftunnel-proxy,nginx,haproxy, plus the
    /// tunnel rows with --tunnel or a cloudflared binary].
    #[arg(long, value_enum, value_delimiter = ',')]
    rows: Vec<Row>,
    /// Add the tunnel rows (cftunnel-proxy's connector and cloudflared behind
    /// cftunnel-mock-edge) even without a cloudflared binary; its row is then skipped.
    #[arg(long)]
    tunnel: bool,
    /// Tunnel transport of the tunnel rows.
    #[arg(long, value_enum, default_value = "quic")]
    tunnel_protocol: TunnelProtocol,
    /// Tunnel connections of each connector (the edge spreads requests over them).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u8).range(1..=4))]
    tunnel_connections: u8,
    /// CPUs of wrk, the nginx backend and the mock edge.
    #[arg(long, default_value = "0")]
    load_cpus: CpuList,
    /// CPUs of the proxy under test.
    #[arg(long, default_value = "1")]
    server_cpus: CpuList,
    /// Do not pin anything with taskset.
    #[arg(long)]
    no_pin: bool,
    /// wrk binary [default: looked up on PATH].
    #[arg(long)]
    wrk: Option<PathBuf>,
    /// nginx binary, for the backend and the nginx row [default: looked up on PATH and in
    /// /usr/sbin].
    #[arg(long)]
    nginx: Option<PathBuf>,
    /// haproxy binary [default: looked up on PATH and in /usr/sbin].
    #[arg(long)]
    haproxy: Option<PathBuf>,
    /// cftunnel-proxy binary [default: next to this binary].
    #[arg(long)]
    proxy_bin: Option<PathBuf>,
    /// cftunnel-mock-edge binary [default: next to --proxy-bin].
    #[arg(long)]
    edge_bin: Option<PathBuf>,
    /// cloudflared binary for the tunnel rows [default: $CLOUDFLARED].
    #[arg(long, env = "CLOUDFLARED")]
    cloudflared: Option<PathBuf>,
    /// Print the plan (rows, commands, order) and exit without running anything.
    #[arg(long)]
    dry_run: bool,
    /// Keep the generated configs and server logs (path printed at start).
    #[arg(long)]
    keep_scratch: bool,
    #[command(flatten)]
    report: ReportArgs,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum TunnelProtocol {
    Quic,
    Http2,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    parse_go_duration(s).map_err(|e| e.to_string())
}

fn main() -> anyhow::Result<()> {
    let Args { command, run } = Args::parse();
    match command {
        Some(Command::Compare(args)) => run_compare(args),
        Some(Command::Chart { results }) => redraw_chart(&results),
        None => run_harness(run),
    }
}

fn redraw_chart(path: &Path) -> anyhow::Result<()> {
    let results = Results::read(path)?;
    let svg = path.with_extension("svg");
    let text = harness::chart::render_svg(&results).context("drawing the chart")?;
    std::fs::write(&svg, text).with_context(|| format!("writing {}", svg.display()))?;
    eprintln!("chart: {}", svg.display());
    Ok(())
}

/// The command line as typed, for the results file.
fn command_line() -> String {
    std::env::args()
        .map(|a| {
            if a.is_empty() || a.contains(|c: char| c.is_whitespace() || "'\"$".contains(c)) {
                format!("'{}'", a.replace('\'', r"'\''"))
            } else {
                a
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Writes the results file and chart unless told not to, and says where.
fn write_report(results: &Results, report: &ReportArgs) -> anyhow::Result<()> {
    if report.no_report {
        return Ok(());
    }
    let stem = results::file_stem(&results.kind, &results.generated_at);
    let files =
        report_files::write(results, &report.report_dir, &stem).context("writing the report")?;
    eprintln!(
        "results: {}\nchart:   {}",
        files.json.display(),
        files.svg.display()
    );
    Ok(())
}

/// The directory this binary lives in (`target/release`), where its siblings are built.
fn own_dir() -> Option<PathBuf> {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(PathBuf::from))
}

fn check_cpus(lists: &[(&str, &CpuList)], cpus: usize) -> anyhow::Result<()> {
    for (flag, list) in lists {
        if list.max_cpu().is_some_and(|c| c >= cpus) {
            bail!("{flag} {list}: this machine has CPUs 0-{}", cpus - 1);
        }
    }
    Ok(())
}

fn run_compare(args: CompareArgs) -> anyhow::Result<()> {
    let CompareArgs {
        rounds,
        duration,
        connections,
        threads,
        warmup,
        rows,
        tunnel,
        tunnel_protocol,
        tunnel_connections,
        load_cpus,
        server_cpus,
        no_pin,
        wrk,
        nginx,
        haproxy,
        proxy_bin,
        edge_bin,
        cloudflared,
        dry_run,
        keep_scratch,
        report,
    } = args;
    if rounds == 0 || threads == 0 || connections.is_empty() || connections.contains(&0) {
        bail!("--rounds, --threads and every --connections value must be at least 1");
    }
    if duration.as_secs() == 0 || duration.subsec_nanos() != 0 {
        bail!("--duration must be whole seconds (wrk -d), e.g. 8s");
    }
    let proxy_bin = proxy_bin
        .or_else(|| own_dir().map(|d| d.join("cftunnel-proxy")))
        .unwrap_or_else(|| PathBuf::from("target/release/cftunnel-proxy"));
    let edge_bin = edge_bin.unwrap_or_else(|| proxy_bin.with_file_name("cftunnel-mock-edge"));
    let rows = if rows.is_empty() {
        let mut rows = compare::DEFAULT_ROWS.to_vec();
        if tunnel || cloudflared.is_some() {
            rows.extend(compare::TUNNEL_ROWS);
        }
        rows
    } else {
        rows
    };
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    let pin = !no_pin && find_program("taskset").is_some();
    if !no_pin && !pin {
        eprintln!("taskset not found: running unpinned");
    }
    if pin {
        check_cpus(
            &[("--load-cpus", &load_cpus), ("--server-cpus", &server_cpus)],
            cpus,
        )?;
    }
    let programs = compare::servers::Programs {
        wrk: wrk.or_else(|| find_program("wrk")),
        nginx: nginx.or_else(|| find_program("nginx")),
        haproxy: haproxy.or_else(|| find_program("haproxy")),
        proxy: proxy_bin,
        mock_edge: edge_bin,
        cloudflared,
    };
    let cfg = CompareConfig {
        rows,
        rounds,
        duration,
        connections,
        threads,
        warmup,
        load_cpus: pin.then_some(load_cpus),
        server_cpus: pin.then_some(server_cpus),
        tunnel: match tunnel_protocol {
            TunnelProtocol::Quic => compare::Transport::Quic,
            TunnelProtocol::Http2 => compare::Transport::Http2,
        },
        tunnel_connections: usize::from(tunnel_connections),
        programs,
        keep_scratch,
    };
    if !cfg.rows.iter().any(|r| compare::TUNNEL_ROWS.contains(r)) {
        eprintln!(
            "tunnel rows skipped: set CLOUDFLARED=/path/to/cloudflared (or pass --tunnel) to \
             compare the proxy's connector with cloudflared through cftunnel-mock-edge"
        );
    }
    if dry_run {
        print!("{}", compare::describe_plan(&cfg));
        return Ok(());
    }
    let tool = |name: &'static str, bin: &Option<PathBuf>, flag: &'static [&'static str]| {
        bin.clone().map(|b| (name, b, flag))
    };
    let tools: Vec<(&str, PathBuf, &[&str])> = [
        tool("wrk", &cfg.programs.wrk, &["-v"]),
        tool("nginx", &cfg.programs.nginx, &["-v"]),
        tool("haproxy", &cfg.programs.haproxy, &["-v"]),
        tool("cloudflared", &cfg.programs.cloudflared, &["--version"]),
        tool(
            "cftunnel-proxy",
            &Some(cfg.programs.proxy.clone()),
            &["--version"],
        ),
    ]
    .into_iter()
    .flatten()
    .collect();
    let tool_refs: Vec<(&str, &Path, &[&str])> = tools
        .iter()
        .map(|(n, b, a)| (*n, b.as_path(), *a))
        .collect();
    let machine = machine::describe(cpus, &tool_refs);
    if let Some(cpus) = &cfg.load_cpus {
        // The driver only waits on wrk and reads the backend's counter: keep it off the
        // server CPU.
        pin_current_process(cpus).context("pinning the driver to the load CPUs")?;
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("building the runtime")?;
    let progress = Progress::stderr();
    let results = runtime
        .block_on(compare::run(&cfg, machine, command_line(), &progress))
        .context("comparison")?;
    print!("{}", compare::render_table(&results));
    write_report(&results, &report)?;
    Ok(())
}

fn run_harness(args: RunArgs) -> anyhow::Result<()> {
    let RunArgs {
        scenarios,
        duration,
        warmup,
        connections,
        rate,
        rounds,
        workers,
        tunnel_connections,
        path,
        bare_requests,
        proxy_bin,
        edge_bin,
        echo_bin,
        nginx_bin,
        cloudflared_bin,
        load_cpus,
        server_cpus,
        echo_cpus,
        no_pin,
        json,
        keep_scratch,
        memory_config,
        pushes,
        report,
    } = args;
    if !path.starts_with('/') {
        bail!("--path must start with '/'");
    }
    if connections == 0 || workers == 0 || rounds == 0 {
        bail!("--connections, --workers and --rounds must be at least 1");
    }
    if rate.is_some_and(|r| !(r.is_finite() && r > 0.0)) {
        bail!("--rate must be a positive number of requests per second");
    }
    let own_dir = own_dir();
    let sibling = |name: &str| own_dir.as_ref().map(|d| d.join(name));
    let proxy_bin = proxy_bin
        .or_else(|| sibling("cftunnel-proxy"))
        .unwrap_or_else(|| PathBuf::from("target/release/cftunnel-proxy"));
    let edge_bin = edge_bin.unwrap_or_else(|| proxy_bin.with_file_name("cftunnel-mock-edge"));
    let echo_bin = echo_bin.or_else(|| sibling("cftunnel-echo"));
    let nginx_bin = nginx_bin.or_else(|| find_program("nginx"));
    let cloudflared_bin = cloudflared_bin.or_else(|| find_program("cloudflared"));

    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    let pin = !no_pin && find_program("taskset").is_some();
    if !no_pin && !pin {
        eprintln!("taskset not found: running unpinned");
    }
    let machine = (!report.no_report).then(|| {
        let nginx = nginx_bin.clone();
        let tools: Vec<(&str, &Path, &[&str])> = [
            Some(("cftunnel-proxy", proxy_bin.as_path(), &["--version"][..])),
            nginx.as_deref().map(|n| ("nginx", n, &["-v"][..])),
            cloudflared_bin
                .as_deref()
                .map(|c| ("cloudflared", c, &["--version"][..])),
        ]
        .into_iter()
        .flatten()
        .collect();
        machine::describe(cpus, &tools)
    });
    if pin {
        check_cpus(
            &[
                ("--load-cpus", &load_cpus),
                ("--server-cpus", &server_cpus),
                ("--echo-cpus", &echo_cpus),
            ],
            cpus,
        )?;
        pin_current_process(&load_cpus).context("pinning the load generator")?;
    }
    let pinned = |list: CpuList| pin.then_some(list);
    if let Some(doc) = memory_config {
        if pushes == 0 {
            bail!("--pushes must be at least 1");
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("building the runtime")?;
        let scratch = harness::process::ScratchDir::create(keep_scratch)
            .context("creating the scratch directory")?;
        let server_cpus = pinned(server_cpus);
        let report = runtime
            .block_on(harness::memory::run(
                &proxy_bin,
                &doc,
                pushes,
                workers,
                server_cpus.as_ref(),
                scratch.path(),
            ))
            .context("memory run")?;
        if json {
            println!(
                "{}",
                serde_json::to_string_pretty(&report).context("encoding the report")?
            );
        } else {
            print!("{}", report.render());
        }
        return Ok(());
    }
    let load_threads = if pin { load_cpus.count() } else { cpus };
    let config = RunConfig {
        scenarios,
        duration,
        warmup,
        connections,
        rate,
        rounds,
        workers,
        tunnel_connections: usize::from(tunnel_connections),
        path,
        proxy_bin,
        edge_bin,
        echo_bin,
        nginx_bin,
        cloudflared_bin,
        server_cpus: pinned(server_cpus),
        echo_cpus: pinned(echo_cpus),
        load_cpus: pinned(load_cpus),
        keep_scratch,
        bare_requests,
    };

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(load_threads.max(1))
        .enable_all()
        .build()
        .context("building the load generator runtime")?;
    let progress = Progress::stderr();
    let outcome = runtime
        .block_on(harness::run(&config, &progress))
        .context("load run")?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&outcome).context("encoding the report")?
        );
    } else {
        print!("{}", outcome.render_table());
    }
    if let Some(machine) = machine {
        let results = outcome.results(machine, command_line(), results::now_rfc3339());
        write_report(&results, &report)?;
    }
    let report = outcome;
    if report
        .scenarios
        .iter()
        .any(|s| s.outcome == Outcome::Failed)
    {
        std::process::exit(2);
    }
    Ok(())
}
