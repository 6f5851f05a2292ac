use super::*;

/// wrk 4.1's output for `-t1 -c64 -d2s --latency` with the hook (trimmed to what is read).
const HOOKED: &str = "Running 2s test @ http://127.0.0.1:19180/
  1 threads and 64 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     4.18ms    3.41ms  17.32ms   76.16%
    Req/Sec    12.40k     1.62k   14.12k    85.00%
  Latency Distribution
     50%    3.43ms
     75%    6.50ms
     90%    9.15ms
     99%   15.32ms
  24982 requests in 2.03s, 3.50MB read
Requests/sec:  12285.86
Transfer/sec:      1.72MB
cftunnel-loadtest summary requests=24982 duration_us=2033394 connect=0 read=0 write=0 status=2 timeout=1
cftunnel-loadtest latency min_us=41 max_us=17320
cftunnel-loadtest percentile p=50 us=3433
cftunnel-loadtest percentile p=90 us=9152
cftunnel-loadtest percentile p=99 us=15320
cftunnel-loadtest percentile p=99.9 us=17217
";

#[test]
fn the_hook_lines_give_exact_totals_and_the_curve() {
    let run = parse(HOOKED).expect("parses");
    assert_eq!(run.requests, 24_980, "non-2xx answers are not successes");
    assert_eq!(run.errors, 3);
    assert!((run.seconds - 2.033394).abs() < 1e-9);
    assert_eq!((run.p50_us, run.p99_us, run.max_us), (3433, 15320, 17320));
    let curve: Vec<(f64, u64)> = run
        .percentiles
        .iter()
        .map(|p| (p.percentile, p.latency_us))
        .collect();
    assert_eq!(
        curve,
        [(50.0, 3433), (90.0, 9152), (99.0, 15320), (99.9, 17217)]
    );
    assert!((run.rps() - 24_980.0 / 2.033394).abs() < 1e-6);
}

#[test]
fn plain_output_is_read_from_the_latency_distribution() {
    let plain: String = HOOKED
        .lines()
        .filter(|l| !l.starts_with(MARK))
        .map(|l| format!("{l}\n"))
        .collect::<String>()
        + "  Socket errors: connect 0, read 12, write 0, timeout 3\n  Non-2xx or 3xx responses: 5\n";
    let run = parse(&plain).expect("parses");
    assert_eq!(run.requests, 24_977);
    assert_eq!(run.errors, 20);
    assert!((run.seconds - 2.03).abs() < 1e-9);
    assert_eq!((run.p50_us, run.p99_us, run.max_us), (3430, 15320, 17320));
    assert_eq!(run.percentiles.len(), 4);
}

#[test]
fn output_without_totals_or_latency_is_refused() {
    assert_eq!(parse(""), Err(ParseError::NoTotals));
    let no_latency = "  100 requests in 1.00s, 1.00MB read\n";
    assert_eq!(parse(no_latency), Err(ParseError::NoLatency));
    let broken = "cftunnel-loadtest summary requests=x duration_us=1\n";
    assert!(matches!(parse(broken), Err(ParseError::Line { .. })));
}

#[test]
fn wrk_times_carry_their_unit() {
    assert_eq!(parse_time_us("612.00us"), Some(612.0));
    assert_eq!(parse_time_us("3.43ms"), Some(3430.0));
    assert_eq!(parse_time_us("1.02s"), Some(1_020_000.0));
    assert_eq!(parse_time_us("1.50m"), Some(90_000_000.0));
    assert_eq!(parse_time_us("3.43"), None);
    assert_eq!(parse_time_us("3.43xs"), None);
}

#[test]
fn the_command_line_is_the_documented_one() {
    let args = args(
        1,
        64,
        Duration::from_secs(8),
        None,
        "http://127.0.0.1:8080/",
    );
    assert_eq!(
        args.join(" "),
        "-t1 -c64 -d8s --latency http://127.0.0.1:8080/"
    );
    let with_hook = super::args(
        1,
        32,
        Duration::from_secs(8),
        Some(Path::new("/tmp/r.lua")),
        "http://x/",
    );
    assert_eq!(
        with_hook.join(" "),
        "-t1 -c32 -d8s --latency -s /tmp/r.lua http://x/"
    );
}

#[test]
fn the_hook_samples_every_curve_percentile() {
    let script = report_script();
    assert!(script.contains("done = function(summary, latency, requests)"));
    assert!(!script.contains("request ="), "no request hook");
    assert!(!script.contains("response ="), "no response hook");
    assert!(
        script.contains("{ 1, 10, 25, 50, 75, 90, 95, 99, 99.5, 99.9, 99.99 }"),
        "{script}"
    );
}
