//! Settings that do not parse stop the binary at start with a message naming the setting as the
//! operator wrote it: the environment variable when the value came from one, the flag when it
//! came from the command line.

use std::time::Duration;

struct Exit {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Runs the proxy binary with only `env` in its environment and `args`; it must exit by itself.
async fn run(env: &[(&str, &str)], args: &[&str]) -> Exit {
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_cftunnel-proxy"))
        .env_clear()
        .envs(env.iter().copied())
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("proxy binary starts");
    let out = tokio::time::timeout(Duration::from_secs(20), child.wait_with_output())
        .await
        .expect("the binary exits by itself")
        .expect("its output is read");
    Exit {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

#[tokio::test]
async fn a_bad_environment_value_is_reported_under_its_variable() {
    for (var, value, says) in [
        ("PROXY_GRACE_PERIOD", "30", "--grace-period"),
        ("PROXY_TUNNEL_PROTOCOL", "udp", "auto, quic, http2"),
        ("PROXY_METRICS_ENABLED", "maybe", "not a boolean"),
        (
            "PROXY_CLUSTER_CIDRS",
            "10.96.0.0/12,34.118.224.10/20",
            "the range is 34.118.224.0/20",
        ),
        ("PROXY_CLUSTER_CIDRS", "2600::/129", "0 to 128"),
    ] {
        let exit = run(&[(var, value)], &[]).await;
        assert_eq!(exit.code, Some(2), "{var}: usage error: {}", exit.stderr);
        let first = exit.stderr.lines().next().unwrap_or_default();
        assert!(
            first.starts_with(&format!("error: {var}={value}: ")) && first.contains(says),
            "{var}: the message names the variable and says why: {}",
            exit.stderr
        );
        let flag = format!(
            "--{}",
            var["PROXY_".len()..].to_lowercase().replace('_', "-")
        );
        assert!(
            first.contains(&flag),
            "{var}: the flag is named too: {first}"
        );
    }
}

#[tokio::test]
async fn a_bad_flag_is_reported_under_the_flag() {
    let exit = run(&[], &["--grace-period", "30"]).await;
    assert_eq!(exit.code, Some(2), "{}", exit.stderr);
    assert!(
        exit.stderr
            .starts_with("error: invalid value '30' for '--grace-period <GRACE_PERIOD>'"),
        "{}",
        exit.stderr
    );
    // The flag's value is the one refused, whatever the variable says.
    let both = run(&[("PROXY_GRACE_PERIOD", "5s")], &["--grace-period=30"]).await;
    assert_eq!(both.code, Some(2), "{}", both.stderr);
    assert!(
        both.stderr
            .starts_with("error: invalid value '30' for '--grace-period"),
        "{}",
        both.stderr
    );
}

#[tokio::test]
async fn help_and_version_still_exit_zero() {
    let help = run(&[("PROXY_GRACE_PERIOD", "30")], &["--help"]).await;
    assert_eq!(help.code, Some(0), "{}", help.stderr);
    assert!(
        help.stdout.contains("PROXY_GRACE_PERIOD"),
        "{}",
        help.stdout
    );
    let version = run(&[], &["--version"]).await;
    assert_eq!(version.code, Some(0), "{}", version.stderr);
    assert!(
        version.stdout.starts_with("cftunnel-proxy "),
        "{}",
        version.stdout
    );
}
