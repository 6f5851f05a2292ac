//! The per-request head codecs of the tunnel: what the connector does to every request and
//! response head (QUIC metadata in and out, HTTP/2 serialised response headers), and what the
//! edge side does to them, for the head of a typical proxied GET.

use cftunnel_tunnel::stream::{self, headers, http_map, ConnectionType};
use criterion::{criterion_group, criterion_main, Criterion};
use http::{HeaderMap, HeaderValue, Request, StatusCode};
use std::hint::black_box;

/// The allocator the proxy binary uses, so the numbers are the binary's.
#[global_allocator]
static ALLOC: cftunnel_alloc::Mimalloc = cftunnel_alloc::Mimalloc;

/// An eyeball GET as the edge forwards it: the client's headers plus the edge's own.
fn eyeball_request() -> http::request::Parts {
    let (parts, ()) = Request::get("https://app.example.com/api/items?page=2")
        .header("host", "app.example.com")
        .header(
            "user-agent",
            "Mozilla/5.0 (X11; Linux x86_64) Gecko/20100101 Firefox/140.0",
        )
        .header("accept", "application/json")
        .header("accept-encoding", "gzip, br")
        .header("cf-connecting-ip", "203.0.113.7")
        .header("x-forwarded-for", "203.0.113.7")
        .header("x-forwarded-proto", "https")
        .header("cf-visitor", r#"{"scheme":"https"}"#)
        .header("cf-ray", "8f2c3a9e1b7d4c21-MCK")
        .header("cdn-loop", "cloudflare")
        .body(())
        .expect("valid request")
        .into_parts();
    parts
}

/// An origin's answer to it.
fn origin_response() -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert("content-type", HeaderValue::from_static("application/json"));
    h.insert("content-length", HeaderValue::from_static("1432"));
    h.insert(
        "date",
        HeaderValue::from_static("Mon, 30 Nov 2026 06:00:00 GMT"),
    );
    h.insert("cache-control", HeaderValue::from_static("no-store"));
    h.insert(
        "x-request-id",
        HeaderValue::from_static("3f1e9b0c-5a7d-4e2b-9c61-0d8a4f7e2b13"),
    );
    h
}

fn connector(c: &mut Criterion) {
    let mut group = c.benchmark_group("connector");
    let connect = http_map::connect_from_request(&eyeball_request(), ConnectionType::Http);
    let request_frame = stream::encode_connect_request(&connect);
    // After the 6-byte signature and 2-byte version.
    let body = bytes::Bytes::copy_from_slice(&request_frame[8..]);
    assert!(matches!(http_map::decode_request_head(&body), Ok(Ok(_))));
    group.bench_function("quic_request_head_decode", |b| {
        b.iter(|| black_box(http_map::decode_request_head(black_box(&body)).is_ok()))
    });
    let response = origin_response();
    group.bench_function("quic_response_head_encode", |b| {
        b.iter(|| {
            black_box(http_map::encode_response_head(StatusCode::OK, black_box(&response)).len())
        })
    });
    group.bench_function("http2_response_headers_serialise", |b| {
        b.iter(|| black_box(headers::serialise_value(black_box(&response), false).is_some()))
    });
    group.finish();
}

fn edge(c: &mut Criterion) {
    let mut group = c.benchmark_group("edge");
    let parts = eyeball_request();
    group.bench_function("quic_request_head_encode", |b| {
        b.iter(|| {
            black_box(http_map::encode_request_head(black_box(&parts), ConnectionType::Http).len())
        })
    });
    let response_frame = http_map::encode_response_head(StatusCode::OK, &origin_response());
    let body = bytes::Bytes::copy_from_slice(&response_frame[8..]);
    assert!(matches!(http_map::decode_response_head(&body), Ok(Ok(_))));
    group.bench_function("quic_response_head_decode", |b| {
        b.iter(|| black_box(http_map::decode_response_head(black_box(&body)).is_ok()))
    });
    let serialised = headers::serialise(&origin_response(), false);
    group.bench_function("http2_response_headers_deserialise", |b| {
        b.iter(|| black_box(headers::deserialise(black_box(&serialised)).map(|h| h.len())))
    });
    group.finish();
}

criterion_group!(benches, connector, edge);
criterion_main!(benches);
