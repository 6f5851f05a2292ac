//! `cftunnel-loadtest`: requests/s, p50/p99 latency, errors and memory of the echo backend
//! direct, through `cftunnel-proxy`, through the proxy behind the mock edge's QUIC or HTTP/2
//! tunnel, and through nginx, in one run, with ratios.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use cftunnel_loadtest::harness::process::{find_program, pin_current_process, CpuList};
use cftunnel_loadtest::harness::report::Outcome;
use cftunnel_loadtest::harness::scenario::Scenario;
use cftunnel_loadtest::harness::{self, RunConfig};
use cftunnel_testkit::echo::parse_go_duration;
use clap::Parser;

/// mimalloc, as the proxy uses: the load generator (and the in-process mock edge) allocate per request, and glibc's malloc would
/// cost several times more there, on the same cores as the server under test.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
#[command(name = "cftunnel-loadtest", version)]
struct Args {
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
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    parse_go_duration(s).map_err(|e| e.to_string())
}

fn main() -> anyhow::Result<()> {
    let Args {
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
    } = Args::parse();
    if !path.starts_with('/') {
        bail!("--path must start with '/'");
    }
    if connections == 0 || workers == 0 || rounds == 0 {
        bail!("--connections, --workers and --rounds must be at least 1");
    }
    if rate.is_some_and(|r| !(r.is_finite() && r > 0.0)) {
        bail!("--rate must be a positive number of requests per second");
    }
    let own_dir = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(PathBuf::from));
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
    if pin {
        for (flag, list) in [
            ("--load-cpus", &load_cpus),
            ("--server-cpus", &server_cpus),
            ("--echo-cpus", &echo_cpus),
        ] {
            if list.max_cpu().is_some_and(|c| c >= cpus) {
                bail!("{flag} {list}: this machine has CPUs 0-{}", cpus - 1);
            }
        }
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
    let report = runtime
        .block_on(harness::run(&config, &|line| eprintln!("{line}")))
        .context("load run")?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).context("encoding the report")?
        );
    } else {
        print!("{}", report.render_table());
    }
    if report
        .scenarios
        .iter()
        .any(|s| s.outcome == Outcome::Failed)
    {
        std::process::exit(2);
    }
    Ok(())
}
