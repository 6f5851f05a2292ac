//! What the connector hands requests to: a [`Handler`], whose future is boxed once per
//! request, or any `hyper` service through [`Connector::start`](crate::Connector::start).

use std::future::Future;
use std::pin::Pin;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::BodyExt as _;

use crate::body::{Body, BoxError};

/// The body of a response handed back to the connector.
pub type ResponseBody = UnsyncBoxBody<Bytes, BoxError>;

/// A request's future as the connector holds it: one box per request.
pub type HandlerFuture =
    Pin<Box<dyn Future<Output = Result<Response<ResponseBody>, BoxError>> + Send>>;

/// Serves the requests arriving through the tunnel.
///
/// The connector keeps handlers of any type behind one pointer, so each request's future
/// is boxed: a service that boxes its own future implements this directly, for one box per
/// request instead of two ([`Connector::start`](crate::Connector::start) wraps a `hyper`
/// service's future in a box of its own).
pub trait Handler: Send + Sync + 'static {
    /// Starts serving `req`; an error ends the stream with an error answer to the edge.
    fn call(&self, req: Request<Body>) -> HandlerFuture;
}

/// A `hyper` service as a [`Handler`].
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
