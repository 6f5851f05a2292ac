//! Start-up of the real binary refused for its config file or its config-API token, with a
//! message naming what is at fault.

use crate::support::*;
use std::time::Duration;

/// How long a proxy refusing its settings may take to exit.
const EXIT_WAIT: Duration = Duration::from_secs(20);

/// Runs the proxy binary in standalone mode with `env` and `args` until it exits; its exit code
/// and stderr. One still running after [`EXIT_WAIT`] (it took the settings) fails the test.
async fn exit_of(env: &[(&str, &str)], args: &[&str]) -> (Option<i32>, String) {
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_cftunnel-proxy"))
        .env_remove("TUNNEL_TOKEN")
        .env_remove("PROXY_AUTH_TOKEN")
        .env_remove("PROXY_CONFIG_FILE")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .env("PROXY_ADDR", format!("127.0.0.1:{}", free_port()))
        .env("PROXY_CONFIG_ADDR", format!("127.0.0.1:{}", free_port()))
        .envs(env.iter().copied())
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("proxy binary starts");
    let out = tokio::time::timeout(EXIT_WAIT, child.wait_with_output())
        .await
        .expect("the proxy exits at start")
        .expect("its output is read");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A config file is read and compiled as a push's body is: the process exits non-zero, its
/// message naming the file and then saying what a push of the same document is answered.
#[tokio::test]
async fn a_config_file_is_refused_with_the_message_a_push_of_it_gets() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let backend = |weight: i64| {
            serde_json::json!({"backends": [{"url": "http://127.0.0.1:9", "weight": weight}]})
        };
        let malformed = serde_json::json!({"version": 1, "rules": [backend(1), backend(1), backend(-1)]});
        let refused = serde_json::json!({"version": 1, "rules": [
            backend(1),
            {"matches": [{"path": {"type": "RegularExpression", "value": "(["}}], "backends": []},
        ]});
        let dir = std::env::temp_dir().join(format!("cftunnel-start-up-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let proxy = proxy().await;
        let http = client();
        for (name, doc, field) in [
            ("malformed", malformed, "rules[2].backends[0].weight: "),
            ("refused", refused, "rules[1].matches[0].path: "),
        ] {
            let pushed = push(&http, proxy.admin_addr(), &doc).await;
            assert_eq!(pushed.status, 400, "{name}");
            let message = pushed.json()["error"]
                .as_str()
                .expect("the 400 says why")
                .to_owned();
            assert!(message.contains(field), "{name}: {message}");
            let file = dir.join(format!("{name}.json"));
            std::fs::write(&file, doc.to_string()).expect("write the file");
            let path = file.to_str().expect("a UTF-8 path");
            for args in [
                &["--config-file", path][..],
                &["--check", "--config-file", path][..],
            ] {
                let (code, stderr) = exit_of(&[], args).await;
                assert_ne!(code, Some(0), "{name} {args:?}: {stderr}");
                assert!(
                    stderr.contains(&format!("PROXY_CONFIG_FILE ({path}): ")),
                    "{name} {args:?} names the file: {stderr}"
                );
                assert!(
                    stderr.contains(&message),
                    "{name} {args:?} says what the push is answered ({message}): {stderr}"
                );
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await
    .expect("test finished in time");
}

/// A token no `Authorization` header can carry as text would refuse every push: the proxy
/// refuses it at start, naming the setting and the problem, and never showing the token.
#[tokio::test]
async fn an_auth_token_outside_printable_ascii_is_refused_at_start() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        for token in ["pässword", "tok\u{1}en"] {
            let (code, stderr) = exit_of(&[("PROXY_AUTH_TOKEN", token)], &[]).await;
            assert_ne!(code, Some(0), "{token:?}: {stderr}");
            assert!(
                stderr.contains("PROXY_AUTH_TOKEN: ") && stderr.contains("printable ASCII"),
                "{token:?}: {stderr}"
            );
            assert!(!stderr.contains(token), "the token is not shown: {stderr}");
        }
    })
    .await
    .expect("test finished in time");
}
