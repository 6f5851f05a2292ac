//! A bound on the calls the edge leaves open on one RPC stream.

use std::cell::RefCell;
use std::collections::HashSet;
use std::rc::Rc;

use capnp::capability::Promise;
use capnp_rpc::rpc_capnp::message;
use capnp_rpc::rpc_twoparty_capnp::Side;
use capnp_rpc::{Connection, IncomingMessage, VatNetwork};
use futures_util::{FutureExt as _, TryFutureExt as _};

/// The calls (bootstraps included) the edge may have open at once on one RPC stream. On the
/// control stream the connector serves nothing, so the edge has nothing to call; on a
/// configuration stream it makes one bootstrap and one call. But every call it makes leaves
/// an answer that the session keeps until the edge finishes the call, so an edge that never
/// did would grow the connection's memory for as long as the stream lasted.
const EDGE_CALLS: usize = 16;

/// An RPC stream's network, ending the session once the edge has more than [`EDGE_CALLS`]
/// calls open on it.
pub(crate) struct Questioned<N> {
    inner: N,
    open: Rc<RefCell<OpenCalls>>,
}

impl<N> Questioned<N> {
    /// `stream` names the stream in the error and the log: "the control stream".
    pub(crate) fn new(inner: N, stream: &'static str) -> Self {
        Self {
            inner,
            open: Rc::new(RefCell::new(OpenCalls {
                ids: HashSet::new(),
                stream,
            })),
        }
    }
}

/// The edge's calls not finished yet on one stream.
struct OpenCalls {
    ids: HashSet<u32>,
    stream: &'static str,
}

impl<N: VatNetwork<Side>> VatNetwork<Side> for Questioned<N> {
    fn connect(&mut self, host: Side) -> Option<Box<dyn Connection<Side>>> {
        let open = self.open.clone();
        self.inner.connect(host).map(|inner| {
            Box::new(QuestionedConnection { inner, open }) as Box<dyn Connection<Side>>
        })
    }

    fn accept(&mut self) -> Promise<Box<dyn Connection<Side>>, capnp::Error> {
        let open = self.open.clone();
        Promise::from_future(self.inner.accept().map_ok(move |inner| {
            Box::new(QuestionedConnection { inner, open }) as Box<dyn Connection<Side>>
        }))
    }

    fn drive_until_shutdown(&mut self) -> Promise<(), capnp::Error> {
        self.inner.drive_until_shutdown()
    }
}

struct QuestionedConnection {
    inner: Box<dyn Connection<Side>>,
    open: Rc<RefCell<OpenCalls>>,
}

impl Connection<Side> for QuestionedConnection {
    fn get_peer_vat_id(&self) -> Side {
        self.inner.get_peer_vat_id()
    }

    fn new_outgoing_message(
        &mut self,
        first_segment_word_size: u32,
    ) -> Box<dyn capnp_rpc::OutgoingMessage> {
        self.inner.new_outgoing_message(first_segment_word_size)
    }

    fn receive_incoming_message(
        &mut self,
    ) -> Promise<Option<Box<dyn IncomingMessage>>, capnp::Error> {
        let open = self.open.clone();
        Promise::from_future(self.inner.receive_incoming_message().map(move |received| {
            let msg = received?;
            if let Some(msg) = &msg {
                note_call(&mut open.borrow_mut(), msg.as_ref())?;
            }
            Ok(msg)
        }))
    }

    fn new_stream(
        &mut self,
    ) -> (
        Box<dyn capnp_rpc::FlowController>,
        Promise<(), capnp::Error>,
    ) {
        self.inner.new_stream()
    }

    fn shutdown(&mut self, result: capnp::Result<()>) -> Promise<(), capnp::Error> {
        self.inner.shutdown(result)
    }
}

/// Keeps `open` up to date with a message from the edge; an error, which ends the session,
/// once more than [`EDGE_CALLS`] are open. A message that does not decode is left to the
/// session, which refuses it.
fn note_call(open: &mut OpenCalls, msg: &dyn IncomingMessage) -> capnp::Result<()> {
    let Ok(which) = msg
        .get_body()
        .and_then(|body| body.get_as::<message::Reader<'_>>())
        .map(|m| m.which())
    else {
        return Ok(());
    };
    match which {
        Ok(message::Bootstrap(Ok(b))) => {
            open.ids.insert(b.get_question_id());
        }
        Ok(message::Call(Ok(c))) => {
            open.ids.insert(c.get_question_id());
        }
        Ok(message::Finish(Ok(f))) => {
            open.ids.remove(&f.get_question_id());
        }
        _ => {}
    }
    if open.ids.len() > EDGE_CALLS {
        let stream = open.stream;
        tracing::warn!(
            open = open.ids.len(),
            "the edge left too many calls open on {stream}; ending it"
        );
        return Err(capnp::Error::failed(format!(
            "protocol violation: the edge left more than {EDGE_CALLS} calls open on {stream}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rpc_message(build: impl FnOnce(message::Builder<'_>)) -> Box<dyn IncomingMessage> {
        struct Received(capnp::message::Reader<capnp::serialize::OwnedSegments>);
        impl IncomingMessage for Received {
            fn get_body(&self) -> capnp::Result<capnp::any_pointer::Reader<'_>> {
                self.0.get_root()
            }
        }
        let mut m = capnp::message::Builder::new_default();
        build(m.init_root());
        let words = capnp::serialize::write_message_to_words(&m);
        let read = capnp::serialize::read_message(&mut &words[..], Default::default())
            .expect("a framed message");
        Box::new(Received(read))
    }

    #[test]
    fn calls_the_edge_leaves_open_are_bounded() {
        let mut open = OpenCalls {
            ids: HashSet::new(),
            stream: "the control stream",
        };
        let bootstrap = |id| rpc_message(|m| m.init_bootstrap().set_question_id(id));
        let finish = |id| rpc_message(|m| m.init_finish().set_question_id(id));
        // Calls the edge finishes do not add up.
        for id in 0..100 {
            note_call(&mut open, bootstrap(id).as_ref()).expect("one call open");
            note_call(&mut open, finish(id).as_ref()).expect("none open");
        }
        assert!(open.ids.is_empty());
        // Nor do other messages.
        let release = rpc_message(|m| m.init_release().set_id(1));
        for _ in 0..100 {
            note_call(&mut open, release.as_ref()).expect("no call");
        }
        for id in 0..EDGE_CALLS as u32 {
            let call = rpc_message(|m| m.init_call().set_question_id(1000 + id));
            note_call(&mut open, call.as_ref()).expect("within the bound");
        }
        let err = note_call(&mut open, bootstrap(5000).as_ref()).expect_err("one too many");
        assert!(err.to_string().contains("protocol violation"), "{err}");
    }
}
