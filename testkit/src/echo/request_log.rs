//! The echo server's request log: the `Echoing back request made to <RequestURI> to client
//! (<remote addr>)` lines that the mirror conformance checks read.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

/// Lines kept in memory; older ones are dropped first. Counts per URI are kept separately so
/// `count_echoed` stays exact for the URIs it has seen.
const MAX_LINES: usize = 100_000;
/// Distinct URIs counted; a load run with unique URIs must not grow memory without bound.
const MAX_COUNTED_URIS: usize = 100_000;

#[derive(Debug, Default)]
pub(crate) struct RequestLog {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    lines: VecDeque<String>,
    counts: HashMap<String, usize>,
}

impl RequestLog {
    pub(crate) fn record(&self, line: String, request_uri: &str) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if inner.lines.len() >= MAX_LINES {
            inner.lines.pop_front();
        }
        inner.lines.push_back(line);
        if let Some(n) = inner.counts.get_mut(request_uri) {
            *n += 1;
        } else if inner.counts.len() < MAX_COUNTED_URIS {
            inner.counts.insert(request_uri.to_owned(), 1);
        }
    }

    pub(crate) fn lines(&self) -> Vec<String> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.lines.iter().cloned().collect()
    }

    pub(crate) fn count(&self, request_uri: &str) -> usize {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.counts.get(request_uri).copied().unwrap_or(0)
    }
}

/// The log line echo-basic prints for every echoed request.
pub(crate) fn line(request_uri: &str, remote: std::net::SocketAddr) -> String {
    format!("Echoing back request made to {request_uri} to client ({remote})")
}
