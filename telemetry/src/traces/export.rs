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

/// The `user-agent` of exports unless the headers set one: the exporter, its language, and
/// this program's version.
const USER_AGENT: &str = concat!(
    "OTel-OTLP-Exporter-Rust cftunnel/",
    env!("CARGO_PKG_VERSION")
);

/// The headers every export carries: exactly the settings' (checked when they were read), and
/// a `user-agent`.
///
/// `opentelemetry-otlp` adds `OTEL_EXPORTER_OTLP_HEADERS` / `OTEL_EXPORTER_OTLP_TRACES_HEADERS`
/// from the environment to whatever it is given, over same-named keys, so a flag would lose to
/// the variable it replaces. Both transports therefore set these headers last, where the
/// exporter reads nothing more: the gRPC interceptor and the HTTP client.
fn export_headers(settings: &TraceSettings) -> http::HeaderMap {
    let mut headers = http::HeaderMap::new();
    headers.insert(
        http::header::USER_AGENT,
        http::HeaderValue::from_static(USER_AGENT),
    );
    for (key, value) in &settings.headers {
        if let (Ok(k), Ok(v)) = (
            http::HeaderName::from_bytes(key.as_bytes()),
            http::HeaderValue::from_str(value),
        ) {
            headers.insert(k, v);
        }
    }
    headers
}

pub(super) fn build(
    settings: &TraceSettings,
    runtime: tokio::runtime::Handle,
) -> Result<opentelemetry_otlp::SpanExporter, StartError> {
    let endpoint = settings.endpoint.to_string();
    let secure = settings.endpoint.scheme_str() == Some("https");
    let headers = export_headers(settings);
    match settings.protocol {
        Protocol::Grpc => {
            let metadata = tonic::metadata::MetadataMap::from_headers(headers);
            let interceptor = move |mut call: tonic::Request<()>| {
                *call.metadata_mut() = metadata.clone();
                Ok(call)
            };
            // tonic bounds the call by `timeout`, not the connection it waits for first: the
            // TCP connect and the TLS handshake get the export timeout of their own.
            let mut channel = tonic::transport::Endpoint::from_shared(endpoint)
                .map_err(|e| StartError::Channel(e.to_string()))?
                .connect_timeout(settings.timeout)
                .timeout(settings.timeout);
            if secure {
                channel = channel
                    .tls_config(
                        tonic::transport::ClientTlsConfig::new()
                            .with_webpki_roots()
                            .timeout(settings.timeout),
                    )
                    .map_err(|e| StartError::Tls(e.to_string()))?;
            }
            // The channel starts its connection task on the current runtime.
            let channel = {
                let _entered = runtime.enter();
                channel.connect_lazy()
            };
            Ok(opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_channel(channel)
                .with_timeout(settings.timeout)
                .with_interceptor(interceptor)
                .build()?)
        }
        Protocol::HttpProtobuf => {
            let client = ExportClient::new(runtime, settings.timeout, headers)?;
            Ok(opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                .with_endpoint(endpoint)
                .with_timeout(settings.timeout)
                .with_http_client(client)
                .build()?)
        }
    }
}

/// OTLP/HTTP exports: each request runs as a task on the process's runtime, awaited from the
/// batch processor's thread, bounded by the export timeout. Requests carry the body's own
/// headers and `headers`, nothing else the exporter added.
#[derive(Debug)]
struct ExportClient {
    client: Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>,
    runtime: tokio::runtime::Handle,
    timeout: Duration,
    headers: http::HeaderMap,
}

impl ExportClient {
    fn new(
        runtime: tokio::runtime::Handle,
        timeout: Duration,
        headers: http::HeaderMap,
    ) -> Result<Self, StartError> {
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
            headers,
        })
    }
}

#[async_trait::async_trait]
impl HttpClient for ExportClient {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let (mut parts, body) = request.into_parts();
        let mut headers = self.headers.clone();
        for name in [http::header::CONTENT_TYPE, http::header::CONTENT_ENCODING] {
            if let Some(value) = parts.headers.remove(&name) {
                headers.insert(name, value);
            }
        }
        parts.headers = headers;
        let request = Request::from_parts(parts, body);
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
