//! The demo as a user runs it: one command, a request through the mock edge and the tunnel to
//! the echo backend, and a clean exit.

use std::process::Command;

fn free_port() -> u16 {
    cftunnel_testkit::ports::free_port()
        .expect("a free port")
        .port()
}

#[test]
fn one_command_sends_a_request_through_the_tunnel_over_both_transports() {
    for protocol in ["quic", "http2"] {
        let out = Command::new(env!("CARGO_BIN_EXE_cftunnel-demo"))
            .args(["--once", "--protocol", protocol, "--http"])
            .arg(format!("127.0.0.1:{}", free_port()))
            .env_remove("RUST_LOG")
            .output()
            .expect("the demo runs");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{protocol}: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.contains("(Host: demo.localhost) -> 200"), "{stdout}");
        // The echo backend's answer: the request as it reached it, through the edge.
        let body = stdout
            .find('{')
            .zip(stdout.rfind('}'))
            .map(|(from, to)| &stdout[from..=to])
            .unwrap_or_else(|| panic!("no answer body in {stdout}"));
        let echoed: serde_json::Value = serde_json::from_str(body).expect("JSON");
        assert_eq!(echoed["pod"], "echo-1");
        assert_eq!(echoed["path"], "/hello");
        assert!(
            echoed["headers"]["Cf-Ray"].is_array() || echoed["headers"]["Cf-Ray"].is_string(),
            "the edge's headers reached the backend: {echoed}"
        );
    }
}
