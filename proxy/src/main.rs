use cftunnel_proxy::cli::Args;

/// mimalloc: a config push allocates and frees tens of thousands of small objects, and the
/// request path allocates per connection; both are several times cheaper than with glibc's malloc.
#[global_allocator]
static ALLOC: cftunnel_alloc::Mimalloc = cftunnel_alloc::Mimalloc;

fn main() -> std::process::ExitCode {
    cftunnel_proxy::memory::disable_huge_pages();
    let args = Args::parse_or_exit();
    if let Err(e) = cftunnel_telemetry::init_logs(args.log_format) {
        eprintln!("error: installing the log subscriber: {e}");
        return std::process::ExitCode::FAILURE;
    }
    if let Err(e) = args.validate() {
        eprintln!("error: {e}");
        return std::process::ExitCode::from(2);
    }
    if let Some(asked) = args.grace_period.1 {
        tracing::warn!(asked = ?asked, capped = ?args.grace_period.0, "grace period capped at its maximum");
    }
    if !args.check {
        cftunnel_proxy::process::seed_random();
    }
    let workers = args
        .worker_threads
        .map_or_else(cftunnel_proxy::process::default_worker_threads, |n| n.get());
    // One worker: a current-thread runtime, which skips the work-stealing machinery entirely.
    let mut runtime = if workers == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(workers);
        b
    };
    runtime.enable_all();
    let runtime = match runtime.build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: starting the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    // What the runtime settled on: `--worker-threads`, or one per CPU the process may use (the
    // whole node's when the pod has neither a CPU limit nor a cpuset).
    let worker_threads = runtime.metrics().num_workers();
    let run = async {
        let signals = cftunnel_proxy::process::Signals::new()?;
        cftunnel_proxy::process::run(args, worker_threads, signals).await
    };
    let result = runtime.block_on(run);
    // Dropping the runtime would wait, without limit, for blocking calls still running (a
    // backend name lookup holds its thread for as long as DNS takes to fail, about 20 s when
    // it does not answer): the process would outlive its drain, and the pod's grace period.
    runtime.shutdown_timeout(RUNTIME_SHUTDOWN_WAIT);
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// How long blocking calls still running once the proxy has drained get before the process
/// exits without them. The access log's writer is among them when the last handle on the log
/// goes with the runtime's tasks: it gets its whole flush wait, and lines queued on a slow
/// stdout are not lost.
const RUNTIME_SHUTDOWN_WAIT: std::time::Duration =
    cftunnel_proxy::access_log::FLUSH_WAIT.saturating_add(std::time::Duration::from_millis(500));
