//! The OTLP span exporter: gRPC through tonic, or HTTP/protobuf through a hyper client whose
//! requests run on the process's runtime. The batch processor calls either from its own thread.

use super::settings::{Protocol, TraceSettings};
use super::StartError;
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, Limited};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use opentelemetry_http::{HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _, WithTonicConfig as _};
use std::time::Duration;

/// Longest collector answer read: an OTLP answer is a small protobuf message.
const MAX_ANSWER: usize = 64 * 1024;

pub(super) fn build(
    settings: &TraceSettings,
    runtime: tokio::runtime::Handle,
) -> Result<opentelemetry_otlp::SpanExporter, StartError> {
    let endpoint = settings.endpoint.to_string();
    let secure = settings.endpoint.scheme_str() == Some("https");
    match settings.protocol {
        Protocol::Grpc => {
            let mut metadata = http::HeaderMap::new();
            for (key, value) in &settings.headers {
                if let (Ok(k), Ok(v)) = (
                    http::HeaderName::from_bytes(key.as_bytes()),
                    http::HeaderValue::from_str(value),
                ) {
                    metadata.insert(k, v);
                }
            }
            let mut builder = opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(endpoint)
                .with_timeout(settings.timeout)
                .with_metadata(
                    opentelemetry_otlp::tonic_types::metadata::MetadataMap::from_headers(metadata),
                );
            if secure {
                builder = builder.with_tls_config(
                    opentelemetry_otlp::tonic_types::transport::ClientTlsConfig::new()
                        .with_webpki_roots(),
                );
            }
            // tonic's channel starts its connection task on the current runtime.
            let _entered = runtime.enter();
            Ok(builder.build()?)
        }
        Protocol::HttpProtobuf => {
            let client = ExportClient::new(runtime, settings.timeout)?;
            Ok(opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                .with_endpoint(endpoint)
                .with_timeout(settings.timeout)
                .with_headers(settings.headers.iter().cloned().collect())
                .with_http_client(client)
                .build()?)
        }
    }
}

/// OTLP/HTTP exports: each request runs as a task on the process's runtime, awaited from the
/// batch processor's thread, bounded by the export timeout.
#[derive(Debug)]
struct ExportClient {
    client: Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>,
    runtime: tokio::runtime::Handle,
    timeout: Duration,
}

impl ExportClient {
    fn new(runtime: tokio::runtime::Handle, timeout: Duration) -> Result<Self, StartError> {
        // An explicit provider: the process may have several compiled in, and then none is
        // the default.
        let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_webpki_roots(provider)
            .map_err(|e| StartError::Tls(e.to_string()))?
            .https_or_http()
            .enable_http1()
            .build();
        Ok(Self {
            client: Client::builder(hyper_util::rt::TokioExecutor::new()).build(https),
            runtime,
            timeout,
        })
    }
}

#[async_trait::async_trait]
impl HttpClient for ExportClient {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let client = self.client.clone();
        let timeout = self.timeout;
        let exchange = async move {
            let res = client.request(request.map(Full::new)).await?;
            let (parts, body) = res.into_parts();
            let body = Limited::new(body, MAX_ANSWER).collect().await?.to_bytes();
            Ok::<_, HttpError>(Response::from_parts(parts, body))
        };
        let task = self
            .runtime
            .spawn(async move { tokio::time::timeout(timeout, exchange).await });
        match task.await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(format!("no answer within {timeout:?}").into()),
            Err(e) => Err(Box::new(e)),
        }
    }
}
