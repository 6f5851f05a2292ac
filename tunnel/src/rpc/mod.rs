//! Cap'n Proto RPC: the registration client and configuration server a
//! connector runs, and the session plumbing ([`LocalWorker`], [`RpcStream`]) that an
//! edge's registration server and configuration client run on as well.
//!
//! `capnp-rpc`'s `RpcSystem` is `!Send`, so every RPC session runs on one
//! dedicated thread (`LocalWorker`) inside a `LocalSet`; callers talk to it
//! through channels. Request streams never touch that thread.

mod backpressure;
mod calls;
pub(crate) mod control;
pub(crate) mod remote_config;

use std::future::Future;
use std::pin::Pin;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio_util::compat::{TokioAsyncReadCompatExt as _, TokioAsyncWriteCompatExt as _};

type Job = Box<dyn FnOnce() -> Pin<Box<dyn Future<Output = ()>>> + Send>;

/// Errors of RPC sessions.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RpcError {
    /// The RPC thread is gone (the owner shut down).
    #[error("rpc worker stopped")]
    WorkerGone,
    /// The call did not complete within its timeout.
    #[error("rpc call timed out")]
    Timeout,
    /// The peer answered with an exception or the session broke.
    #[error("rpc failed: {0}")]
    Failed(String),
}

impl From<capnp::Error> for RpcError {
    fn from(e: capnp::Error) -> Self {
        Self::Failed(e.to_string())
    }
}

impl From<capnp::NotInSchema> for RpcError {
    fn from(e: capnp::NotInSchema) -> Self {
        Self::Failed(e.to_string())
    }
}

impl From<std::str::Utf8Error> for RpcError {
    fn from(e: std::str::Utf8Error) -> Self {
        Self::Failed(e.to_string())
    }
}

/// A thread running `!Send` RPC sessions: the connector's, and an edge's.
#[derive(Clone)]
pub struct LocalWorker {
    tx: mpsc::Sender<Job>,
}

impl LocalWorker {
    /// Starts the worker thread. It stops once every handle is dropped.
    pub fn start(name: &str) -> std::io::Result<Self> {
        let (tx, mut rx) = mpsc::channel::<Job>(256);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || {
                let local = tokio::task::LocalSet::new();
                local.block_on(&rt, async move {
                    while let Some(job) = rx.recv().await {
                        tokio::task::spawn_local(job());
                    }
                });
            })?;
        Ok(Self { tx })
    }

    /// Runs `f()` on the worker thread; an `RpcSystem` made inside it runs there.
    pub async fn spawn<F, Fut>(&self, f: F) -> Result<(), RpcError>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = ()> + 'static,
    {
        let job: Job = Box::new(move || Box::pin(f()));
        self.tx.send(job).await.map_err(|_| RpcError::WorkerGone)
    }
}

/// A byte stream pair an RPC session runs over.
pub struct RpcStream<R, W> {
    /// The half the session reads.
    pub reader: R,
    /// The half the session writes.
    pub writer: W,
}

impl<R, W> RpcStream<R, W>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    /// The session's network as an edge runs it: it reads and writes freely, which only
    /// one end of a session may do (see `gated_network`).
    pub fn network(
        self,
        side: capnp_rpc::rpc_twoparty_capnp::Side,
    ) -> capnp_rpc::twoparty::VatNetwork<tokio_util::compat::Compat<R>> {
        capnp_rpc::twoparty::VatNetwork::new(
            self.reader.compat(),
            self.writer.compat_write(),
            side,
            reader_options(),
        )
    }

    /// The session's network as the connector runs it: it stops reading while
    /// a write waits for the edge ([`backpressure`]). Only one end of a session
    /// may do that: two ends that both stopped reading while their writes
    /// waited would wait for each other.
    fn gated_network(
        self,
        side: capnp_rpc::rpc_twoparty_capnp::Side,
    ) -> capnp_rpc::twoparty::VatNetwork<tokio_util::compat::Compat<backpressure::GatedReader<R>>>
    {
        let (reader, writer) = backpressure::gate(self.reader, self.writer);
        capnp_rpc::twoparty::VatNetwork::new(
            reader.compat(),
            writer.compat_write(),
            side,
            reader_options(),
        )
    }
}

/// What a session reads of one message at most: 2^20 words (8 MiB).
fn reader_options() -> capnp::message::ReaderOptions {
    let mut opts = capnp::message::ReaderOptions::new();
    opts.traversal_limit_in_words(Some(1 << 20));
    opts
}
