use super::*;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status};

fn string(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.to_owned())),
        }),
        ..Default::default()
    }
}

fn export() -> ExportTraceServiceRequest {
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![string("service.name", "svc")],
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: "scope".into(),
                    ..Default::default()
                }),
                spans: vec![Span {
                    trace_id: vec![0xab; 16],
                    span_id: vec![1, 2, 3, 4, 5, 6, 7, 8],
                    name: "GET".into(),
                    kind: 2,
                    attributes: vec![
                        string("http.request.method", "GET"),
                        KeyValue {
                            key: "http.response.status_code".into(),
                            value: Some(AnyValue {
                                value: Some(any_value::Value::IntValue(503)),
                            }),
                            ..Default::default()
                        },
                    ],
                    status: Some(Status {
                        code: 2,
                        message: String::new(),
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

fn expected() -> RecordedSpan {
    RecordedSpan {
        trace_id: "ab".repeat(16),
        span_id: "0102030405060708".into(),
        parent_span_id: String::new(),
        trace_state: String::new(),
        name: "GET".into(),
        kind: SpanKind::Server,
        status: SpanStatus::Error,
        status_message: String::new(),
        attributes: BTreeMap::from([
            ("http.request.method".into(), AttrValue::Str("GET".into())),
            ("http.response.status_code".into(), AttrValue::Int(503)),
        ]),
        resource: BTreeMap::from([("service.name".into(), AttrValue::Str("svc".into()))]),
        scope: "scope".into(),
        start_unix_nanos: 0,
        end_unix_nanos: 0,
        events: Vec::new(),
    }
}

#[tokio::test]
async fn spans_posted_over_otlp_http_are_recorded() {
    let receiver = OtlpReceiver::start().await.expect("receiver starts");
    let client = crate::client::pooled::<Full<Bytes>>();
    let req = Request::post(format!("{}{HTTP_EXPORT_PATH}", receiver.endpoint()))
        .header("content-type", "application/x-protobuf")
        .body(Full::new(Bytes::from(export().encode_to_vec())))
        .expect("request");
    let res = client.request(req).await.expect("answered");
    assert_eq!(res.status(), StatusCode::OK);
    let body = res.into_body().collect().await.expect("body").to_bytes();
    ExportTraceServiceResponse::decode(body).expect("an OTLP answer");
    assert_eq!(
        receiver.wait_for(1, Duration::from_secs(5)).await,
        [expected()]
    );
    assert_eq!(receiver.exports(), (1, 0));
}

#[tokio::test]
async fn spans_exported_over_grpc_are_recorded_and_answered_with_status_0() {
    let receiver = OtlpReceiver::start().await.expect("receiver starts");
    let (mut send, _conn) = crate::client::connect_h2c::<Full<Bytes>>(receiver.addr())
        .await
        .expect("h2c connection");
    let message = export().encode_to_vec();
    let mut framed = BytesMut::new();
    framed.put_u8(0);
    framed.put_u32(message.len() as u32);
    framed.put_slice(&message);
    let req = Request::post(format!("{}{GRPC_EXPORT_PATH}", receiver.endpoint()))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Full::new(framed.freeze()))
        .expect("request");
    let res = send.send_request(req).await.expect("answered");
    assert_eq!(res.status(), StatusCode::OK);
    let collected = res.into_body().collect().await.expect("body");
    let trailers = collected.trailers().cloned().expect("trailers");
    assert_eq!(trailers["grpc-status"], "0");
    assert_eq!(
        receiver.wait_for(1, Duration::from_secs(5)).await,
        [expected()]
    );
    assert_eq!(receiver.exports(), (0, 1));
}

#[tokio::test]
async fn a_stalled_receiver_never_answers() {
    let receiver = OtlpReceiver::stalled().await.expect("receiver starts");
    let client = crate::client::pooled::<Full<Bytes>>();
    let req = Request::post(format!("{}{HTTP_EXPORT_PATH}", receiver.endpoint()))
        .body(Full::new(Bytes::from(export().encode_to_vec())))
        .expect("request");
    assert!(
        tokio::time::timeout(Duration::from_millis(300), client.request(req))
            .await
            .is_err(),
        "no answer"
    );
    assert!(receiver.spans().is_empty());
}
