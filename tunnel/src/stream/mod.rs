//! Request-stream framing: the preamble (signature and version), the
//! Cap'n Proto `ConnectRequest` / `ConnectResponse` messages, and the
//! HTTP/2 transport's serialised response headers.
//!
//! Everything here is pure: bytes in, values out. The async helpers only
//! read exact lengths with hard caps.

mod flat;
pub mod headers;
pub mod http_map;
pub mod origin;

use capnp::message::{Builder, HeapAllocator, ReaderOptions};
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::quic_metadata_protocol_capnp as proto;

/// First six bytes of an edge-opened request stream.
pub const DATA_SIGNATURE: [u8; 6] = [0x0A, 0x36, 0xCD, 0x12, 0xA1, 0x3E];
/// First six bytes of an RPC stream (configuration push); no version follows.
pub const RPC_SIGNATURE: [u8; 6] = [0x52, 0xBB, 0x82, 0x5C, 0xDB, 0x65];
/// Protocol version written after [`DATA_SIGNATURE`].
pub const DATA_VERSION: [u8; 2] = *b"01";

/// Largest framed `ConnectRequest`/`ConnectResponse` accepted (headers included).
pub const MAX_MESSAGE_BYTES: usize = 1024 * 1024;
const MAX_SEGMENTS: usize = 64;
/// Largest segment the heap allocator accepts.
const MAX_SEGMENT_WORDS: u32 = 1 << 29;

/// What an edge-opened stream carries, by its signature.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamKind {
    /// An HTTP/WebSocket/TCP request ([`DATA_SIGNATURE`] then version `"01"`).
    Data,
    /// A Cap'n Proto RPC session ([`RPC_SIGNATURE`]).
    Rpc,
}

/// Errors while reading or decoding a stream preamble.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// The first six bytes are neither signature.
    #[error("unknown stream signature")]
    UnknownSignature,
    /// The version after the data signature is not `"01"`.
    #[error("unsupported data stream version")]
    UnsupportedVersion,
    /// The Cap'n Proto framing header is malformed or over the size caps.
    #[error("malformed message framing")]
    Framing,
    /// The message is too large.
    #[error("message larger than {MAX_MESSAGE_BYTES} bytes")]
    TooLarge,
    /// The message does not decode as the expected struct.
    #[error("malformed message: {0}")]
    Decode(String),
    /// The stream ended before a complete preamble.
    #[error("stream ended inside the preamble")]
    Truncated,
    /// Reading the stream failed.
    #[error("stream read failed: {0}")]
    Io(String),
}

/// `ConnectRequest.type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectionType {
    /// Plain HTTP request.
    Http,
    /// WebSocket upgrade: raw bytes both ways after the 101.
    Websocket,
    /// Raw TCP stream (private networking).
    Tcp,
}

/// One metadata entry (`key`, `val`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Metadata {
    /// Key such as `HttpMethod` or `HttpHeader:Content-Type`.
    pub key: String,
    /// Value.
    pub val: String,
}

impl Metadata {
    /// Convenience constructor.
    pub fn new(key: impl Into<String>, val: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            val: val.into(),
        }
    }
}

/// The edge's description of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectRequest {
    /// Absolute eyeball URL (`https://host/path?q`), a path, or `IP:port` for TCP.
    pub dest: String,
    /// Stream type.
    pub kind: ConnectionType,
    /// Method, host and headers.
    pub metadata: Vec<Metadata>,
}

/// The connector's answer before the response body.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ConnectResponse {
    /// Non-empty when the request failed before any response.
    pub error: String,
    /// `HttpStatus` and `HttpHeader:*` entries.
    pub metadata: Vec<Metadata>,
}

impl From<proto::ConnectionType> for ConnectionType {
    fn from(kind: proto::ConnectionType) -> Self {
        match kind {
            proto::ConnectionType::Http => Self::Http,
            proto::ConnectionType::Websocket => Self::Websocket,
            proto::ConnectionType::Tcp => Self::Tcp,
        }
    }
}

impl From<ConnectionType> for proto::ConnectionType {
    fn from(kind: ConnectionType) -> Self {
        match kind {
            ConnectionType::Http => Self::Http,
            ConnectionType::Websocket => Self::Websocket,
            ConnectionType::Tcp => Self::Tcp,
        }
    }
}

/// Classifies a stream by its first six bytes.
pub fn classify(signature: &[u8; 6]) -> Result<StreamKind, FrameError> {
    match *signature {
        DATA_SIGNATURE => Ok(StreamKind::Data),
        RPC_SIGNATURE => Ok(StreamKind::Rpc),
        _ => Err(FrameError::UnknownSignature),
    }
}

/// Total byte length of the framed message whose framing header starts `buf`,
/// or `Ok(None)` when more bytes are needed to tell.
pub fn framed_len(buf: &[u8]) -> Result<Option<usize>, FrameError> {
    let Some(first) = buf.get(..4) else {
        return Ok(None);
    };
    let count = u32::from_le_bytes([first[0], first[1], first[2], first[3]]) as usize + 1;
    if count > MAX_SEGMENTS {
        return Err(FrameError::Framing);
    }
    // Header words: one u32 count, one u32 per segment, padded to 8 bytes.
    let header = (4 + 4 * count).div_ceil(8) * 8;
    let Some(sizes) = buf.get(4..4 + 4 * count) else {
        return Ok(None);
    };
    let mut total = header;
    for chunk in sizes.chunks_exact(4) {
        let words = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]) as usize;
        total = total
            .checked_add(words.checked_mul(8).ok_or(FrameError::TooLarge)?)
            .ok_or(FrameError::TooLarge)?;
        if total > MAX_MESSAGE_BYTES {
            return Err(FrameError::TooLarge);
        }
    }
    Ok(Some(total))
}

/// Words a message may make its reader visit: twice its size, so pointers
/// that share data cannot multiply the work of reading it.
const TRAVERSAL_LIMIT_WORDS: u64 = (MAX_MESSAGE_BYTES / 8 * 2) as u64;

fn reader_options() -> ReaderOptions {
    let mut opts = ReaderOptions::new();
    opts.traversal_limit_in_words(Some(TRAVERSAL_LIMIT_WORDS as usize))
        .nesting_limit(16);
    opts
}

fn decode_err(e: impl std::fmt::Display) -> FrameError {
    FrameError::Decode(e.to_string())
}

/// Reads one framed message from `bytes`, copying its segments into
/// word-aligned memory: Cap'n Proto reads words in place, and a borrowed
/// slice (a sub-slice of a larger buffer) need not be 8-byte aligned.
fn read_message(
    mut bytes: &[u8],
) -> Result<capnp::message::Reader<capnp::serialize::OwnedSegments>, FrameError> {
    capnp::serialize::read_message(&mut bytes, reader_options()).map_err(decode_err)
}

/// Reads one framed message where it lies when `bytes` is word-aligned (a
/// frame read into a buffer of its own is), so its texts borrow from `bytes`;
/// otherwise from a word-aligned copy made in `copy`.
fn read_message_in_place<'a>(
    bytes: &'a [u8],
    copy: &'a mut Vec<capnp::Word>,
) -> Result<capnp::message::Reader<capnp::serialize::NoAllocSliceSegments<'a>>, FrameError> {
    let mut slice = if (bytes.as_ptr() as usize).is_multiple_of(8) {
        bytes
    } else {
        *copy = capnp::Word::allocate_zeroed_vec(bytes.len().div_ceil(8));
        capnp::Word::words_to_bytes_mut(copy)[..bytes.len()].copy_from_slice(bytes);
        let copy: &'a Vec<capnp::Word> = copy;
        &capnp::Word::words_to_bytes(copy)[..bytes.len()]
    };
    capnp::serialize::read_message_from_flat_slice_no_alloc(&mut slice, reader_options())
        .map_err(decode_err)
}

fn read_metadata(
    list: capnp::struct_list::Reader<'_, proto::metadata::Owned>,
) -> Result<Vec<Metadata>, FrameError> {
    let mut out = Vec::with_capacity(list.len() as usize);
    for m in list.iter() {
        let key = m
            .get_key()
            .map_err(decode_err)?
            .to_str()
            .map_err(decode_err)?;
        let val = m
            .get_val()
            .map_err(decode_err)?
            .to_str()
            .map_err(decode_err)?;
        out.push(Metadata::new(key, val));
    }
    Ok(out)
}

/// Decodes one framed `ConnectRequest` (exactly the bytes of [`framed_len`]).
pub fn decode_connect_request(bytes: &[u8]) -> Result<ConnectRequest, FrameError> {
    let msg = read_message(bytes)?;
    let root: proto::connect_request::Reader<'_> = msg.get_root().map_err(decode_err)?;
    let dest = root
        .get_dest()
        .map_err(decode_err)?
        .to_str()
        .map_err(decode_err)?
        .to_owned();
    let kind = root.get_type().map_err(decode_err)?.into();
    let metadata = read_metadata(root.get_metadata().map_err(decode_err)?)?;
    Ok(ConnectRequest {
        dest,
        kind,
        metadata,
    })
}

/// Decodes one framed `ConnectResponse`.
pub fn decode_connect_response(bytes: &[u8]) -> Result<ConnectResponse, FrameError> {
    let msg = read_message(bytes)?;
    let root: proto::connect_response::Reader<'_> = msg.get_root().map_err(decode_err)?;
    let error = root
        .get_error()
        .map_err(decode_err)?
        .to_str()
        .map_err(decode_err)?
        .to_owned();
    let metadata = read_metadata(root.get_metadata().map_err(decode_err)?)?;
    Ok(ConnectResponse { error, metadata })
}

fn set_metadata(
    mut list: capnp::struct_list::Builder<'_, proto::metadata::Owned>,
    metadata: &[Metadata],
) {
    for (i, m) in metadata.iter().enumerate() {
        let mut e = list.reborrow().get(i as u32);
        e.set_key(m.key.as_str());
        e.set_val(m.val.as_str());
    }
}

/// Words a text field takes: its bytes and a NUL, padded to whole words.
fn text_words(s: &str) -> usize {
    (s.len() + 1).div_ceil(8)
}

/// Words a metadata list takes: the list tag, two pointers per entry and
/// the texts.
fn metadata_words(metadata: &[Metadata]) -> usize {
    metadata.iter().fold(1, |acc, m| {
        acc.saturating_add(2 + text_words(&m.key) + text_words(&m.val))
    })
}

/// A builder whose first segment holds `words`, so that the message is
/// written as one segment without far pointers (as `cloudflared` writes it).
fn builder(words: usize) -> Builder<HeapAllocator> {
    let words = u32::try_from(words)
        .unwrap_or(u32::MAX)
        .min(MAX_SEGMENT_WORDS);
    Builder::new(HeapAllocator::new().first_segment_words(words))
}

fn frame(builder: &Builder<HeapAllocator>, prefix: &[u8]) -> Vec<u8> {
    let words = capnp::serialize::compute_serialized_size_in_words(builder);
    let mut out = Vec::with_capacity(prefix.len() + words * 8);
    out.extend_from_slice(prefix);
    capnp::serialize::write_message(&mut out, builder)
        .unwrap_or_else(|_| unreachable!("writing to a Vec cannot fail"));
    out
}

/// Encodes signature, version and a framed `ConnectRequest`: the whole
/// edge-side preamble of a request stream.
pub fn encode_connect_request(req: &ConnectRequest) -> Vec<u8> {
    // Root pointer, one data word and two pointers, then the dest and the list.
    let words = (4 + text_words(&req.dest)).saturating_add(metadata_words(&req.metadata));
    let mut builder = builder(words);
    {
        let mut root: proto::connect_request::Builder<'_> = builder.init_root();
        root.set_dest(req.dest.as_str());
        root.set_type(req.kind.into());
        set_metadata(root.init_metadata(req.metadata.len() as u32), &req.metadata);
    }
    frame(&builder, &preamble())
}

/// Encodes signature, version and a framed `ConnectResponse`: the whole
/// connector-side preamble of a response.
pub fn encode_connect_response(resp: &ConnectResponse) -> Vec<u8> {
    // Root pointer and two pointers, then the error and the list.
    let words = (3 + text_words(&resp.error)).saturating_add(metadata_words(&resp.metadata));
    let mut builder = builder(words);
    {
        let mut root: proto::connect_response::Builder<'_> = builder.init_root();
        root.set_error(resp.error.as_str());
        set_metadata(
            root.init_metadata(resp.metadata.len() as u32),
            &resp.metadata,
        );
    }
    frame(&builder, &preamble())
}

fn preamble() -> [u8; 8] {
    let mut p = [0u8; 8];
    p[..6].copy_from_slice(&DATA_SIGNATURE);
    p[6..].copy_from_slice(&DATA_VERSION);
    p
}

/// Where the data-stream preamble (signature, version, one framed message) at the start
/// of `buf` ends, or `Ok(None)` while more bytes are needed. A wrong signature, version or
/// framing fails as soon as its bytes are there.
pub fn data_preamble_len(buf: &[u8]) -> Result<Option<usize>, FrameError> {
    let signature = &buf[..buf.len().min(DATA_SIGNATURE.len())];
    if signature != &DATA_SIGNATURE[..signature.len()] {
        return Err(FrameError::UnknownSignature);
    }
    let Some(version) = buf.get(DATA_SIGNATURE.len()..8) else {
        return Ok(None);
    };
    if version != DATA_VERSION {
        return Err(FrameError::UnsupportedVersion);
    }
    let Some(len) = framed_len(&buf[8..])? else {
        return Ok(None);
    };
    Ok((buf.len() >= 8 + len).then_some(8 + len))
}

/// Parses a complete data-stream preamble held in memory: signature,
/// version, one framed `ConnectRequest`. Returns the request and the number
/// of bytes consumed (body bytes follow).
pub fn parse_request_preamble(buf: &[u8]) -> Result<(ConnectRequest, usize), FrameError> {
    let sig: [u8; 6] = buf
        .get(..6)
        .and_then(|s| s.try_into().ok())
        .ok_or(FrameError::Truncated)?;
    if classify(&sig)? != StreamKind::Data {
        return Err(FrameError::UnknownSignature);
    }
    let end = data_preamble_len(buf)?.ok_or(FrameError::Truncated)?;
    Ok((decode_connect_request(&buf[8..end])?, end))
}

fn io_err(e: std::io::Error) -> FrameError {
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        FrameError::Truncated
    } else {
        FrameError::Io(e.to_string())
    }
}

/// Reads the six-byte signature of an edge-opened stream.
pub async fn read_signature<R: AsyncRead + Unpin>(r: &mut R) -> Result<StreamKind, FrameError> {
    let mut sig = [0u8; 6];
    r.read_exact(&mut sig).await.map_err(io_err)?;
    classify(&sig)
}

/// Reads exactly two version bytes and checks them.
pub async fn read_version<R: AsyncRead + Unpin>(r: &mut R) -> Result<(), FrameError> {
    let mut v = [0u8; 2];
    r.read_exact(&mut v).await.map_err(io_err)?;
    if v != DATA_VERSION {
        return Err(FrameError::UnsupportedVersion);
    }
    Ok(())
}

/// Reads one framed Cap'n Proto message, bounded by [`MAX_MESSAGE_BYTES`].
pub async fn read_frame<R: AsyncRead + Unpin>(r: &mut R) -> Result<Vec<u8>, FrameError> {
    let mut buf = vec![0u8; 4];
    r.read_exact(&mut buf).await.map_err(io_err)?;
    Ok(read_frame_rest(r, buf, None).await?.0)
}

/// After a data stream's signature: the version and the framed
/// `ConnectRequest`. A single-segment message (what edges send) takes two
/// reads, where [`read_version`] and [`read_frame`] take four; every read of a
/// QUIC stream takes the connection's lock.
pub async fn read_data_preamble<R: AsyncRead + Unpin>(r: &mut R) -> Result<Vec<u8>, FrameError> {
    // Version, segment count, first segment's size.
    let mut head = [0u8; 10];
    r.read_exact(&mut head).await.map_err(io_err)?;
    if head[..2] != DATA_VERSION {
        return Err(FrameError::UnsupportedVersion);
    }
    Ok(read_frame_rest(r, head[2..].to_vec(), None).await?.0)
}

/// Completes a framed message of which `buf` holds the first bytes (at least
/// the segment count, at most the segment table), within `budget` when one is given.
pub(crate) async fn read_frame_rest<R: AsyncRead + Unpin>(
    r: &mut R,
    mut buf: Vec<u8>,
    budget: Option<&PreambleBudget>,
) -> Result<(Vec<u8>, BudgetShare), FrameError> {
    let count = match buf.get(..4) {
        Some(&[a, b, c, d]) => u32::from_le_bytes([a, b, c, d]) as usize + 1,
        _ => return Err(FrameError::Framing),
    };
    if count > MAX_SEGMENTS {
        return Err(FrameError::Framing);
    }
    let table = 4 + 4 * count;
    let have = buf.len();
    if have < table {
        buf.resize(table, 0);
        r.read_exact(&mut buf[have..]).await.map_err(io_err)?;
    }
    let total = framed_len(&buf)?.ok_or(FrameError::Framing)?;
    let share = BudgetShare::reserve(budget, total).await;
    Ok((read_frame_tail(r, buf, total).await?, share))
}

/// Completes a framed message `total` bytes long of which `buf` holds the first bytes,
/// its share of the budget already reserved.
pub(crate) async fn read_frame_tail<R: AsyncRead + Unpin>(
    r: &mut R,
    mut buf: Vec<u8>,
    total: usize,
) -> Result<Vec<u8>, FrameError> {
    // Memory follows the bytes that arrive: a frame header announcing a large
    // message commits at most twice what has come (and one first step),
    // not the whole cap, while the rest is awaited. A usual head takes one read.
    while buf.len() < total {
        let have = buf.len();
        let next = total.min(have.saturating_mul(2).max(FIRST_READ));
        buf.resize(next, 0);
        r.read_exact(&mut buf[have..]).await.map_err(io_err)?;
    }
    Ok(buf)
}

/// Memory one connection's request preambles may hold between them while they
/// arrive. Each preamble is capped at [`MAX_MESSAGE_BYTES`], but a connection
/// carries thousands of streams at once: without a shared bound, an edge that
/// opened them all with large heads arriving slowly would have the connector
/// hold gigabytes. A preamble reserves the size its frame announces before
/// reading it (its buffer still grows only with what arrives) and gives it back
/// once decoded. One that finds the budget spent waits, holding nothing: only
/// preambles with their whole size reserved hold any, and they need no more, so
/// the waits always end (at the latest with their streams' preamble timeout).
#[derive(Clone, Debug)]
pub struct PreambleBudget(std::sync::Arc<tokio::sync::Semaphore>);

impl PreambleBudget {
    /// A budget of `bytes` (at least one largest message, so any single preamble fits).
    pub fn new(bytes: usize) -> Self {
        let bytes = bytes.clamp(MAX_MESSAGE_BYTES, tokio::sync::Semaphore::MAX_PERMITS);
        Self(std::sync::Arc::new(tokio::sync::Semaphore::new(bytes)))
    }

    /// Bytes not reserved by any preamble now.
    pub fn available(&self) -> usize {
        self.0.available_permits()
    }
}

/// The part of a [`PreambleBudget`] one preamble holds; returned on drop.
#[derive(Debug)]
pub struct BudgetShare {
    /// Held only to be given back when dropped.
    _permit: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl BudgetShare {
    /// Reserves `bytes` of `budget`, waiting while it is spent; nothing without a budget.
    pub(crate) async fn reserve(budget: Option<&PreambleBudget>, bytes: usize) -> Self {
        let Some(budget) = budget else {
            return Self { _permit: None };
        };
        // framed_len caps a frame at MAX_MESSAGE_BYTES, which fits a u32. The semaphore
        // is never closed, so the acquire ends only with the bytes reserved.
        let Ok(bytes) = u32::try_from(bytes) else {
            return Self { _permit: None };
        };
        Self {
            _permit: budget.0.clone().acquire_many_owned(bytes).await.ok(),
        }
    }
}

/// Bytes of a message read at once before its buffer grows with what arrives.
const FIRST_READ: usize = 16 * 1024;

/// Reads a response stream's preamble (signature, version) and returns its
/// framed `ConnectResponse` message, undecoded.
pub async fn read_response_frame<R: AsyncRead + Unpin>(r: &mut R) -> Result<Vec<u8>, FrameError> {
    if read_signature(r).await? != StreamKind::Data {
        return Err(FrameError::UnknownSignature);
    }
    read_data_preamble(r).await
}

/// Reads a full response preamble (signature, version, `ConnectResponse`).
pub async fn read_response_preamble<R: AsyncRead + Unpin>(
    r: &mut R,
) -> Result<ConnectResponse, FrameError> {
    decode_connect_response(&read_response_frame(r).await?)
}

#[cfg(test)]
mod tests;
