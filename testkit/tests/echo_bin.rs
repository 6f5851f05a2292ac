//! The `cftunnel-echo` binary: configured from flags and environment, prints its request log.

use std::process::Stdio;
use std::time::Duration;

use bytes::Bytes;
use cftunnel_testkit::client::connect_http1;
use http_body_util::{BodyExt, Empty};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

#[tokio::test]
async fn binary_echoes_its_identity_and_prints_the_request_log() {
    tokio::time::timeout(Duration::from_secs(20), async {
        let mut child = Command::new(env!("CARGO_BIN_EXE_cftunnel-echo"))
            .args(["--http-addr", "127.0.0.1:0", "--h2c-addr", "127.0.0.1:0"])
            .env("NAMESPACE", "gateway-conformance-infra")
            .env("POD_NAME", "infra-backend-v2-1-2")
            .env_remove("HTTP_PORT")
            .env_remove("H2C_PORT")
            .env_remove("ECHO_QUIET")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("cftunnel-echo starts");
        let stderr = child.stderr.take().expect("stderr is piped");
        let banner = BufReader::new(stderr)
            .lines()
            .next_line()
            .await
            .expect("stderr readable")
            .expect("a start-up line");
        // "cftunnel-echo listening: http <addr> h2c <addr>"
        let http_addr: std::net::SocketAddr = banner
            .split_whitespace()
            .skip_while(|w| *w != "http")
            .nth(1)
            .expect("banner names the http address")
            .parse()
            .expect("a socket address");

        let (mut sender, _conn) = connect_http1(http_addr).await.expect("h1 connection");
        let req = http::Request::get("/bin?x=1")
            .header("host", "bin.example")
            .body(Empty::<Bytes>::new())
            .expect("valid request");
        let resp = sender.send_request(req).await.expect("response");
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        let json: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
        assert_eq!(json["namespace"], "gateway-conformance-infra");
        assert_eq!(json["pod"], "infra-backend-v2-1-2");
        assert_eq!(json["httpPort"], http_addr.port().to_string());

        let stdout = child.stdout.take().expect("stdout is piped");
        let line = BufReader::new(stdout)
            .lines()
            .next_line()
            .await
            .expect("stdout readable")
            .expect("a log line");
        assert!(
            line.starts_with("Echoing back request made to /bin?x=1 to client (127.0.0.1:"),
            "{line}"
        );
        let _ = child.kill().await;
    })
    .await
    .expect("test finished within its time bound");
}
