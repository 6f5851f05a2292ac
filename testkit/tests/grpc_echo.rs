//! The gRPC echo over real sockets: driven by the grpc-go-like client of `grpc_echo::client`,
//! by tonic's client, and by raw HTTP/2 and HTTP/1.1 requests.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use bytes::Bytes;
use cftunnel_testkit::client::connect_h2c;
use cftunnel_testkit::echo::EchoIdentity;
use cftunnel_testkit::grpc_echo::client::{self, Call, Connection, Outcome};
use cftunnel_testkit::grpc_echo::proto::{
    Context, EchoRequest, EchoResponse, Header, ECHO, ECHO_THREE, ECHO_TWO, SERVICE,
};
use cftunnel_testkit::grpc_echo::GrpcEchoServer;
use http::StatusCode;
use http_body_util::Full;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tonic::Code;

const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
const TEST_TIMEOUT: Duration = Duration::from_secs(10);
const POD: &str = "grpc-infra-backend-v1-5d8f7c9b4-k7x6q0";
const NAMESPACE: &str = "gateway-conformance-infra";

async fn echo() -> GrpcEchoServer {
    GrpcEchoServer::spawn(
        LOCALHOST,
        EchoIdentity {
            namespace: NAMESPACE.into(),
            pod: POD.into(),
        },
    )
    .await
    .expect("the gRPC echo binds on 127.0.0.1:0")
}

fn call(authority: &str, path: &str, metadata: &[(&str, &str)]) -> Call {
    Call {
        authority: authority.to_owned(),
        path: path.to_owned(),
        metadata: metadata
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        timeout: Duration::from_secs(5),
    }
}

async fn bounded<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(TEST_TIMEOUT, f)
        .await
        .expect("test finished within its time bound")
}

fn pairs(headers: &[Header]) -> Vec<(&str, &str)> {
    headers
        .iter()
        .map(|h| (h.key.as_str(), h.value.as_str()))
        .collect()
}

#[tokio::test]
async fn echo_reports_the_method_the_metadata_and_the_pod() {
    bounded(async {
        let server = echo().await;
        let authority = server.addr().to_string();
        let outcome = client::call_once(
            server.addr(),
            &call(
                &authority,
                ECHO,
                &[("Version", "one"), ("x-twice", "a"), ("x-twice", "b")],
            ),
        )
        .await;
        assert_eq!((outcome.code, outcome.message.as_str()), (Code::Ok, ""));
        let assertions = outcome
            .response
            .and_then(|r| r.assertions)
            .expect("Echo answers with assertions");
        assert_eq!(assertions.fully_qualified_method, ECHO);
        assert_eq!(assertions.authority, authority);
        assert_eq!(
            assertions.context,
            Some(Context {
                namespace: NAMESPACE.to_owned(),
                ingress: String::new(),
                service_name: String::new(),
                pod: POD.to_owned(),
            })
        );
        assert_eq!(assertions.tls_assertions, None);
        // No te, no grpc-timeout: grpc-go keeps those to the transport.
        assert_eq!(
            pairs(&assertions.headers),
            [
                (":authority", authority.as_str()),
                ("content-type", "application/grpc"),
                ("user-agent", client::USER_AGENT),
                ("version", "one"),
                ("x-twice", "a"),
                ("x-twice", "b"),
            ]
        );
    })
    .await;
}

#[tokio::test]
async fn echo_two_names_itself_and_echo_three_is_unimplemented() {
    bounded(async {
        let server = echo().await;
        let mut conn = Connection::connect(server.addr())
            .await
            .expect("connects");
        let two = conn.unary(&call("gw", ECHO_TWO, &[])).await;
        assert_eq!(two.code, Code::Ok);
        assert_eq!(
            two.response
                .and_then(|r| r.assertions)
                .map(|a| a.fully_qualified_method),
            Some(ECHO_TWO.to_owned())
        );
        // The same connection serves the next calls.
        assert_eq!(
            conn.unary(&call("gw", ECHO_THREE, &[])).await,
            Outcome {
                code: Code::Unimplemented,
                message: "method EchoThree not implemented".to_owned(),
                response: None,
            }
        );
        let unknown_method = conn
            .unary(&call("gw", &format!("/{SERVICE}/EchoFour"), &[]))
            .await;
        assert_eq!(
            (unknown_method.code, unknown_method.message.as_str()),
            (
                Code::Unimplemented,
                "unknown method EchoFour for service gateway_api_conformance.echo_basic.grpcecho.GrpcEcho"
            )
        );
        let unknown_service = conn
            .unary(&call("gw", "/grpc.health.v1.Health/Check", &[]))
            .await;
        assert_eq!(
            (unknown_service.code, unknown_service.message.as_str()),
            (Code::Unimplemented, "unknown service grpc.health.v1.Health")
        );
        assert!(!conn.is_closed());
    })
    .await;
}

#[tokio::test]
async fn an_authority_that_is_not_a_host_name_is_echoed_as_sent() {
    bounded(async {
        let server = echo().await;
        let outcome = client::call_once(server.addr(), &call(SERVICE, ECHO, &[])).await;
        assert_eq!(outcome.code, Code::Ok, "{}", outcome.message);
        let assertions = outcome
            .response
            .and_then(|r| r.assertions)
            .expect("assertions");
        assert_eq!(assertions.authority, SERVICE);
    })
    .await;
}

#[tokio::test]
async fn requests_that_are_not_grpc_get_an_http_status() {
    bounded(async {
        let server = echo().await;
        let (mut sender, _conn) = connect_h2c::<Full<Bytes>>(server.addr())
            .await
            .expect("h2c connection");
        let get = http::Request::get(format!("http://gw{ECHO}"))
            .header("content-type", "application/grpc")
            .body(Full::default())
            .expect("a request");
        let resp = sender.send_request(get).await.expect("a response");
        assert_eq!(resp.status(), StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(resp.headers()["grpc-status"], "13");

        let json = http::Request::post(format!("http://gw{ECHO}"))
            .header("content-type", "application/json")
            .body(Full::new(client::frame(&EchoRequest {})))
            .expect("a request");
        let resp = sender.send_request(json).await.expect("a response");
        assert_eq!(resp.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
        assert_eq!(resp.headers()["grpc-status"], "3");
    })
    .await;
}

#[tokio::test]
async fn http1_is_not_served() {
    bounded(async {
        let server = echo().await;
        let mut tcp = TcpStream::connect(server.addr()).await.expect("connects");
        tcp.write_all(b"POST / HTTP/1.1\r\nHost: gw\r\nContent-Length: 0\r\n\r\n")
            .await
            .expect("writes");
        let mut got = Vec::new();
        let _ = tcp.read_to_end(&mut got).await;
        assert!(
            !got.starts_with(b"HTTP/1.1"),
            "answered HTTP/1.1: {:?}",
            String::from_utf8_lossy(&got)
        );
    })
    .await;
}

#[tokio::test]
async fn tonic_reads_the_echo_as_a_grpc_server() {
    bounded(async {
        let server = echo().await;
        let channel = tonic::transport::Channel::from_shared(format!("http://{}", server.addr()))
            .expect("an endpoint")
            .connect()
            .await
            .expect("connects");
        let mut grpc = tonic::client::Grpc::new(channel);
        let mut unary = async |path: &'static str| {
            grpc.ready().await.expect("ready");
            grpc.unary(
                tonic::Request::new(EchoRequest {}),
                http::uri::PathAndQuery::from_static(path),
                tonic_prost::ProstCodec::<EchoRequest, EchoResponse>::default(),
            )
            .await
        };
        let response = unary(ECHO).await.expect("Echo answers OK").into_inner();
        let assertions = response.assertions.expect("assertions");
        assert_eq!(assertions.fully_qualified_method, ECHO);
        assert_eq!(assertions.context.map(|c| c.pod), Some(POD.to_owned()));
        let status = unary(ECHO_THREE).await.expect_err("EchoThree fails");
        assert_eq!(status.code(), Code::Unimplemented);
        assert_eq!(status.message(), "method EchoThree not implemented");
    })
    .await;
}

#[tokio::test]
async fn calls_that_fail_on_the_wire_end_with_a_code() {
    bounded(async {
        // Nothing listens there.
        let (closed, _held) =
            cftunnel_testkit::ports::refusing_addr().expect("an address that refuses connections");
        let refused = client::call_once(closed, &call("gw", ECHO, &[])).await;
        assert_eq!(refused.code, Code::Unavailable, "{}", refused.message);

        // A peer that accepts and never answers: the deadline ends the call.
        let silent = TcpListener::bind((LOCALHOST, 0)).await.expect("binds");
        let addr: SocketAddr = silent.local_addr().expect("an address");
        let _accepting = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = silent.accept().await {
                held.push(stream);
            }
        });
        let mut short = call("gw", ECHO, &[]);
        short.timeout = Duration::from_millis(200);
        let timed_out = client::call_once(addr, &short).await;
        assert_eq!(timed_out.code, Code::DeadlineExceeded);
    })
    .await;
}

#[tokio::test]
async fn shutdown_closes_the_listener() {
    bounded(async {
        let server = echo().await;
        let addr = server.addr();
        server.shutdown().await;
        assert!(TcpStream::connect(addr).await.is_err());
    })
    .await;
}
