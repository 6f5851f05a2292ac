//! The messages of the conformance gRPC echo, `grpcecho.proto` of the Gateway API conformance
//! echo (proto3 package `gateway_api_conformance.echo_basic.grpcecho`), written with prost's
//! derive instead of generated, so that building the tests needs no `protoc`. Field names and
//! numbers are the proto's; every field is a string or a message, so all are length-delimited
//! on the wire.

/// The full name of the echo service.
pub const SERVICE: &str = "gateway_api_conformance.echo_basic.grpcecho.GrpcEcho";
/// `:path` of `Echo`: answers with an [`EchoResponse`].
pub const ECHO: &str = "/gateway_api_conformance.echo_basic.grpcecho.GrpcEcho/Echo";
/// `:path` of `EchoTwo`: the same as `Echo`, so that the service has more than one method.
pub const ECHO_TWO: &str = "/gateway_api_conformance.echo_basic.grpcecho.GrpcEcho/EchoTwo";
/// `:path` of `EchoThree`: deliberately unimplemented (status UNIMPLEMENTED).
pub const ECHO_THREE: &str = "/gateway_api_conformance.echo_basic.grpcecho.GrpcEcho/EchoThree";

/// The request of every method: no fields.
#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct EchoRequest {}

/// What `Echo` and `EchoTwo` answer.
#[derive(Clone, PartialEq, prost::Message)]
pub struct EchoResponse {
    #[prost(message, optional, tag = "1")]
    pub assertions: Option<Assertions>,
    /// Left unset by the echo.
    #[prost(message, optional, tag = "2")]
    pub request: Option<EchoRequest>,
}

/// What the echo saw of the call.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Assertions {
    /// `/<service>/<method>` of the handler that ran.
    #[prost(string, tag = "1")]
    pub fully_qualified_method: String,
    /// The request metadata as received, one entry per header line.
    #[prost(message, repeated, tag = "2")]
    pub headers: Vec<Header>,
    /// `:authority` as received, empty if none.
    #[prost(string, tag = "3")]
    pub authority: String,
    #[prost(message, optional, tag = "4")]
    pub context: Option<Context>,
    /// Only on a TLS connection, which this echo does not serve.
    #[prost(message, optional, tag = "5")]
    pub tls_assertions: Option<TlsAssertions>,
}

/// One metadata entry.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct Header {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(string, tag = "2")]
    pub value: String,
}

/// The pod's identity (the echo's `NAMESPACE`, `INGRESS_NAME`, `SERVICE_NAME`, `POD_NAME`).
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct Context {
    #[prost(string, tag = "1")]
    pub namespace: String,
    #[prost(string, tag = "2")]
    pub ingress: String,
    #[prost(string, tag = "3")]
    pub service_name: String,
    #[prost(string, tag = "4")]
    pub pod: String,
}

/// The TLS connection's parameters, for the echo's TLS port.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct TlsAssertions {
    #[prost(string, tag = "1")]
    pub version: String,
    #[prost(string, tag = "2")]
    pub negotiated_protocol: String,
    #[prost(string, tag = "3")]
    pub server_name: String,
    #[prost(string, tag = "4")]
    pub cipher_suite: String,
    #[prost(string, repeated, tag = "5")]
    pub peer_certificates: Vec<String>,
}

#[cfg(test)]
mod tests {
    use prost::Message as _;

    use super::*;

    #[test]
    fn an_empty_request_encodes_as_zero_bytes() {
        assert!(EchoRequest {}.encode_to_vec().is_empty());
    }

    #[test]
    fn fields_have_the_proto_numbers() {
        let response = EchoResponse {
            assertions: Some(Assertions {
                fully_qualified_method: "/s/M".to_owned(),
                headers: vec![Header {
                    key: "k".to_owned(),
                    value: "v".to_owned(),
                }],
                authority: "a".to_owned(),
                context: Some(Context {
                    namespace: "n".to_owned(),
                    ingress: String::new(),
                    service_name: String::new(),
                    pod: "p".to_owned(),
                }),
                tls_assertions: None,
            }),
            request: None,
        };
        // Tag bytes: field number × 8 + 2 (length-delimited).
        let assertions = [
            &[0x0A, 4][..],
            b"/s/M",
            &[0x12, 6, 0x0A, 1, b'k', 0x12, 1, b'v'],
            &[0x1A, 1, b'a'],
            &[0x22, 6, 0x0A, 1, b'n', 0x22, 1, b'p'],
        ]
        .concat();
        let mut want = vec![0x0A, assertions.len() as u8];
        want.extend_from_slice(&assertions);
        assert_eq!(response.encode_to_vec(), want);
        assert_eq!(
            EchoResponse::decode(want.as_slice()).expect("decodes"),
            response
        );
    }
}
