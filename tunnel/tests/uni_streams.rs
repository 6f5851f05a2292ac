//! Unidirectional streams the edge opens on a QUIC connection: nothing the connector serves
//! comes on one, and the data sent on them must not take the connection's flow-control credit
//! from the requests that follow.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use cftunnel_testkit::edge::MockEdge;
use cftunnel_tunnel::Protocol;
use http::StatusCode;

use crate::support::*;

const MIB: usize = 1024 * 1024;

/// An edge that sends 30 MiB on unidirectional streams (the connection's whole receive
/// window, 6 MiB on each of five streams, each stream's whole own) has them all taken, and a
/// request through the same connection served afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_on_unidirectional_streams_from_the_edge_leaves_credit_for_requests() {
    trace_init();
    tokio::time::timeout(LIMIT, async {
        let edge = Arc::new(MockEdge::start().await.unwrap());
        let handle = serving_connector(&edge, Protocol::Quic, 1).await;
        let sending = tokio::spawn({
            let edge = edge.clone();
            async move {
                for _ in 0..5 {
                    let sent = edge.send_quic_uni_stream(6 * MIB).await.unwrap();
                    assert!(sent <= 6 * MIB);
                }
            }
        });
        let sent = tokio::time::timeout(Duration::from_secs(5), sending).await;
        let served = tokio::time::timeout(
            Duration::from_secs(8),
            get(&pooled(), edge.http_addr(), "/hello"),
        )
        .await;
        let Ok((status, _, body)) = served else {
            panic!("the request waits: the connection has no credit left for it");
        };
        assert_eq!((status, &body[..]), (StatusCode::OK, &b"hello"[..]));
        sent.expect("every stream was taken").unwrap();
        assert_eq!(handle.registered(), 1);

        handle.shutdown().await;
        if let Ok(edge) = Arc::try_unwrap(edge) {
            edge.shutdown().await;
        }
    })
    .await
    .expect("test finished in time");
}
