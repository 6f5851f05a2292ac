//! `loadtest/compare.sh` and `cftunnel-loadtest compare`: the script's syntax, its arguments
//! as the binary reads them (the plan it prints), and, where wrk and nginx are installed, a
//! one-round run end to end with its results file and chart read back.

use std::path::{Path, PathBuf};
use std::process::Command;

use cftunnel_loadtest::harness::results::{Outcome, Results};

const BIN: &str = env!("CARGO_BIN_EXE_cftunnel-loadtest");

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn script() -> PathBuf {
    repo().join("loadtest/compare.sh")
}

/// Runs `compare.sh` with this test build of the binary and no cargo build.
fn compare_sh(args: &[&str]) -> std::process::Output {
    Command::new("bash")
        .arg(script())
        .args(args)
        .env("NO_BUILD", "1")
        .env("CFTUNNEL_LOADTEST", BIN)
        .env_remove("CLOUDFLARED")
        .output()
        .expect("bash runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn the_script_parses_and_is_executable() {
    let out = Command::new("bash")
        .arg("-n")
        .arg(script())
        .output()
        .expect("bash runs");
    assert!(out.status.success(), "{}", text(&out.stderr));
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(script())
            .expect("exists")
            .permissions()
            .mode();
        assert!(mode & 0o111 != 0, "compare.sh is executable");
    }
}

#[test]
fn a_dry_run_prints_the_documented_comparison() {
    let out = compare_sh(&["--dry-run", "--wrk", "/usr/bin/wrk", "--no-pin"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}{stdout}", text(&out.stderr));
    assert!(
        stdout.starts_with("3 rounds x 2 connection count(s) x 4 rows = 24 wrk runs of 8 s"),
        "{stdout}"
    );
    for line in [
        "/usr/bin/wrk -t1 -c64 -d8s --latency -s <scratch>/report.lua http://127.0.0.1:<port>/",
        "/usr/bin/wrk -t1 -c32 -d8s --latency",
        "round 1: c64: direct, cftunnel-proxy, nginx, haproxy; c32: direct, cftunnel-proxy, nginx, haproxy",
        "round 2: c64: cftunnel-proxy, nginx, haproxy, direct;",
        "round 3: c64: nginx, haproxy, direct, cftunnel-proxy;",
        "rows (ratios against nginx):",
    ] {
        assert!(stdout.contains(line), "missing {line:?} in\n{stdout}");
    }
    // Without a cloudflared the tunnel rows are left out, and it says how to add them.
    assert!(!stdout.contains("tunnel:"), "{stdout}");
    assert!(
        text(&out.stderr).contains("tunnel rows skipped: set CLOUDFLARED=/path/to/cloudflared"),
        "{}",
        text(&out.stderr)
    );
}

fn taskset_installed() -> bool {
    ["/usr/bin/taskset", "/bin/taskset"]
        .iter()
        .any(|p| Path::new(p).is_file())
}

#[test]
fn a_dry_run_pins_wrk_and_the_proxies_and_adds_the_tunnel_rows_on_request() {
    if !taskset_installed() {
        eprintln!("skipped: taskset is not installed");
        return;
    }
    let out = compare_sh(&[
        "--dry-run",
        "--wrk",
        "/usr/bin/wrk",
        "--tunnel",
        "--rounds",
        "2",
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}{stdout}", text(&out.stderr));
    assert!(
        stdout.contains("load:     taskset -c 0 /usr/bin/wrk -t1 -c64 -d8s --latency"),
        "{stdout}"
    );
    assert!(stdout.contains("  taskset -c 1 nginx -c"), "{stdout}");
    assert!(stdout.contains("  taskset -c 1 haproxy -f"), "{stdout}");
    let cloudflared = stdout
        .lines()
        .filter(|l| l.trim_start().starts_with("tunnel: cloudflared"))
        .find(|l| l.contains("cftunnel-mock-edge --listen"))
        .unwrap_or_default();
    assert!(
        cloudflared.contains("taskset -c 0 ") && cloudflared.contains("; taskset -c 1 "),
        "the mock edge on the load CPU, the connector on the server CPU: {stdout}"
    );
    assert!(
        stdout.contains("cloudflared (not given: skipped)"),
        "{stdout}"
    );
    assert!(
        stdout.starts_with("2 rounds x 2 connection count(s) x 6 rows"),
        "{stdout}"
    );
}

#[test]
fn bad_arguments_are_refused_with_the_flag_named() {
    for (args, expected) in [
        (
            &["--duration", "1500ms"][..],
            "--duration must be whole seconds",
        ),
        (&["--connections", "64,0"][..], "--connections"),
        (&["--rounds", "0"][..], "--rounds"),
        (
            &["--rows", "squid"][..],
            "invalid value 'squid' for '--rows",
        ),
        (&["--server-cpus", "4096"][..], "--server-cpus 4096"),
    ] {
        if args[0] == "--server-cpus" && !taskset_installed() {
            continue; // only checked when pinning
        }
        let out = compare_sh(&[&["--dry-run"][..], args].concat());
        assert!(!out.status.success(), "{args:?} accepted");
        let stderr = text(&out.stderr);
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
}

/// `cftunnel-proxy` from the workspace's target directory, when it has been built.
fn built_proxy() -> Option<PathBuf> {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target"));
    ["release", "debug"]
        .iter()
        .map(|profile| target.join(profile).join("cftunnel-proxy"))
        .find(|p| p.is_file())
}

fn installed(name: &str) -> Option<PathBuf> {
    ["/usr/bin", "/usr/sbin", "/usr/local/bin", "/usr/local/sbin"]
        .iter()
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

#[test]
fn one_short_round_measures_every_installed_row_and_writes_its_report() {
    let (Some(wrk), Some(nginx)) = (installed("wrk"), installed("nginx")) else {
        eprintln!("skipped: wrk and nginx are needed (apt-get install -y wrk nginx haproxy)");
        return;
    };
    let reports =
        std::env::temp_dir().join(format!("cftunnel-compare-test-{}", std::process::id()));
    let mut rows = vec!["direct", "nginx", "haproxy"];
    let mut args: Vec<String> = vec!["compare".to_owned()];
    if let Some(proxy) = built_proxy() {
        rows.push("cftunnel-proxy");
        args.extend(["--proxy-bin".to_owned(), proxy.display().to_string()]);
    }
    let rows = rows.join(",");
    args.extend(
        [
            "--no-pin",
            "--rounds",
            "1",
            "--duration",
            "1s",
            "--connections",
            "4",
            "--warmup",
            "0s",
            "--rows",
            &rows,
        ]
        .map(str::to_owned),
    );
    args.extend([
        "--wrk".to_owned(),
        wrk.display().to_string(),
        "--nginx".to_owned(),
        nginx.display().to_string(),
        "--report-dir".to_owned(),
        reports.display().to_string(),
    ]);
    if let Some(haproxy) = installed("haproxy") {
        args.extend(["--haproxy".to_owned(), haproxy.display().to_string()]);
    } else {
        // Named where it is not, so the row is skipped rather than found elsewhere.
        args.extend(["--haproxy".to_owned(), "/nonexistent/haproxy".to_owned()]);
    }
    let out = Command::new(BIN)
        .args(&args)
        .env_remove("CLOUDFLARED")
        .output()
        .expect("runs");
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stderr}\n{stdout}");
    assert!(stdout.contains("| wrk -t1 -c4 -d1s | nginx |"), "{stdout}");
    let json = std::fs::read_dir(&reports)
        .expect("report dir")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "json"))
        .expect("a results file");
    let results = Results::read(&json).expect("reads back");
    assert_eq!(results.kind, "compare");
    assert!(
        results.machine.tools.contains_key("wrk"),
        "{:?}",
        results.machine
    );
    let group = &results.groups[0];
    assert_eq!(group.name, "wrk -t1 -c4 -d1s");
    for s in &group.series {
        if s.name == "haproxy" && installed("haproxy").is_none() {
            assert_eq!(s.outcome, Outcome::Skipped, "{s:?}");
            continue;
        }
        assert_eq!(s.outcome, Outcome::Ok, "{}: {:?}", s.name, s.reason);
        let m = s.measured.as_ref().expect("measured");
        assert!(m.requests > 0 && m.errors == 0, "{}: {m:?}", s.name);
        assert!(
            m.p50_us <= m.p99_us && m.p99_us <= m.max_us,
            "{}: {m:?}",
            s.name
        );
        assert_eq!(
            m.percentiles.len(),
            11,
            "{}: the hook's whole curve",
            s.name
        );
        if s.name != "direct" {
            assert!(
                m.server_cpu_us_per_request.is_some(),
                "{}: server CPU",
                s.name
            );
        }
    }
    assert_eq!(group.baseline.as_deref(), Some("nginx"));
    let svg = std::fs::read_to_string(json.with_extension("svg")).expect("a chart beside it");
    assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(80)]);
    // `chart` draws the same picture again from the file alone.
    std::fs::remove_file(json.with_extension("svg")).expect("remove the chart");
    let redraw = Command::new(BIN)
        .arg("chart")
        .arg(&json)
        .output()
        .expect("runs");
    assert!(redraw.status.success(), "{}", text(&redraw.stderr));
    assert_eq!(
        std::fs::read_to_string(json.with_extension("svg")).expect("drawn again"),
        svg
    );
    let _ = std::fs::remove_dir_all(&reports);
}
