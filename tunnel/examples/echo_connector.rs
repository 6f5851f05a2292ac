//! A connector that answers every tunnelled request with its own method,
//! host and path. Run against a mock edge:
//!
//! ```text
//! cargo run -p cftunnel-testkit --bin cftunnel-mock-edge -- --ca-out /tmp/ca.pem
//! TUNNEL_TOKEN=$(...) cargo run -p cftunnel-tunnel --example echo_connector -- \
//!     127.0.0.1:7844 /tmp/ca.pem quic
//! curl -H 'Host: app.example.com' http://127.0.0.1:8080/hello
//! ```

use std::convert::Infallible;

use anyhow::Context as _;
use bytes::Bytes;
use cftunnel_tunnel::{Body, Connector, ConnectorOptions, Token, TunnelMetrics};
use http::{Request, Response};
use http_body_util::Full;

async fn answer(req: Request<Body>) -> Result<Response<Full<Bytes>>, Infallible> {
    let host = req
        .headers()
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("-");
    let text = format!("{} {} {}\n", req.method(), host, req.uri().path());
    Ok(Response::new(Full::new(Bytes::from(text))))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let mut args = std::env::args().skip(1);
    let edge = args
        .next()
        .context("usage: echo_connector EDGE CA_PEM [auto|quic|http2]")?;
    let ca = args.next().context("missing CA_PEM")?;
    let protocol = args.next().unwrap_or_else(|| "auto".into());
    let token: Token = std::env::var("TUNNEL_TOKEN")
        .context("TUNNEL_TOKEN is not set")?
        .parse()?;
    let opts = ConnectorOptions {
        protocol: protocol.parse()?,
        edges: vec![edge.parse()?; 2],
        edge_ca_pem: Some(tokio::fs::read(&ca).await?),
        ..ConnectorOptions::default()
    };
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = TunnelMetrics::register(&mut registry);
    let handle = Connector::new(token, opts)?.start(hyper::service::service_fn(answer), metrics)?;
    tokio::signal::ctrl_c().await?;
    tracing::info!("draining");
    handle.drain().await;
    Ok(())
}
