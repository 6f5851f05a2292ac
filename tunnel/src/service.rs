//! Type-erased service the connector hands requests to.

use std::future::Future;
use std::pin::Pin;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::BodyExt as _;

use crate::body::{Body, BoxError};

pub(crate) type ResponseBody = UnsyncBoxBody<Bytes, BoxError>;
pub(crate) type HandlerFuture =
    Pin<Box<dyn Future<Output = Result<Response<ResponseBody>, BoxError>> + Send>>;

pub(crate) trait Handler: Send + Sync + 'static {
    fn call(&self, req: Request<Body>) -> HandlerFuture;
}

pub(crate) struct ServiceHandler<S>(pub(crate) S);

impl<S, B> Handler for ServiceHandler<S>
where
    S: hyper::service::Service<Request<Body>, Response = Response<B>> + Send + Sync + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    fn call(&self, req: Request<Body>) -> HandlerFuture {
        let fut = self.0.call(req);
        Box::pin(async move {
            let resp = fut.await.map_err(Into::into)?;
            Ok(resp.map(|b| b.map_err(Into::into).boxed_unsync()))
        })
    }
}
