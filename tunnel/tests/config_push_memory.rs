//! What a configuration push costs the connector in memory, measured by an allocator that
//! counts every thread's allocations: a binary of its own, so that no other test allocates
//! while it measures.
#![allow(clippy::unwrap_used)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use cftunnel_testkit::connector::{options, token};
use cftunnel_testkit::edge::MockEdge;
use cftunnel_tunnel::{Connector, Protocol, TunnelMetrics};
use http_body_util::Empty;

/// The system allocator, keeping count of the bytes allocated now and at most.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grown(bytes: usize) {
    let live = LIVE.fetch_add(bytes, Ordering::Relaxed) + bytes;
    PEAK.fetch_max(live, Ordering::Relaxed);
}

fn shrunk(bytes: usize) {
    LIVE.fetch_sub(bytes, Ordering::Relaxed);
}

// SAFETY: every call is passed on to the system allocator unchanged; only counters change.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grown(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grown(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        shrunk(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            // Growth first, so the peak counts the larger block before the smaller goes.
            grown(new_size);
            shrunk(layout.size());
        }
        p
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// A document of about `bytes` that is mostly values: `{"a":[0,0,...]}`.
fn many_values(bytes: usize) -> Vec<u8> {
    let mut doc = b"{\"a\":[".to_vec();
    while doc.len() < bytes {
        doc.extend_from_slice(b"0,");
    }
    doc.extend_from_slice(b"0]}");
    doc
}

/// The most the heap grew while the mock edge pushed `doc` to one connection of `protocol`.
async fn push_growth(protocol: Protocol, doc: &[u8]) -> usize {
    let edge = MockEdge::start().await.unwrap();
    let mut registry = prometheus_client::registry::Registry::default();
    let service = hyper::service::service_fn(|_req| async {
        Ok::<_, Infallible>(http::Response::new(Empty::<Bytes>::new()))
    });
    let handle = Connector::new(token(), options(&edge, protocol, 1))
        .unwrap()
        .start(service, TunnelMetrics::register(&mut registry))
        .unwrap();
    handle.wait_registered(1).await;
    edge.wait_serving(1).await;

    let before = LIVE.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let applied = edge.push_config(1, doc).await;
    let growth = PEAK.load(Ordering::Relaxed).saturating_sub(before);
    assert!(
        matches!(applied[..], [Ok(1)]),
        "{protocol:?}: the push applies: {applied:?}"
    );
    assert_eq!(
        &handle.remote_config().borrow().config[..],
        doc,
        "{protocol:?}: the document is kept as pushed"
    );
    handle.shutdown().await;
    edge.shutdown().await;
    growth
}

/// A document of many small values is checked without a tree of them: decoding each
/// `0` into a value of its own made a push cost about twenty times its size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_of_many_values_costs_a_few_times_its_size() {
    tokio::time::timeout(Duration::from_secs(120), async {
        let doc = many_values(4 << 20);
        for protocol in [Protocol::Quic, Protocol::Http2] {
            let growth = push_growth(protocol, &doc).await;
            // The edge's copies and the connector's (the message or body read, the
            // document kept), each the document's size, and buffers of the transports.
            assert!(
                growth < 10 * doc.len(),
                "{protocol:?}: the heap grew by {} MiB for a {} MiB document",
                growth >> 20,
                doc.len() >> 20
            );
            println!(
                "{protocol:?}: the heap grew by {} KiB for a {} KiB document",
                growth >> 10,
                doc.len() >> 10
            );
        }
    })
    .await
    .expect("test finished in time");
}
