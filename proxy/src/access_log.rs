//! The opt-in JSON access log: one line per request on stdout, written by its own task so a
//! slow terminal never blocks a request. Lines are dropped, and counted, when the queue is full.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

const QUEUE: usize = 8192;

#[derive(Debug)]
pub(crate) struct Fields {
    pub method: String,
    pub host: String,
    pub path: String,
    pub route: Option<String>,
}

#[derive(Debug)]
pub(crate) struct AccessLog {
    tx: mpsc::Sender<String>,
    dropped: Arc<AtomicU64>,
}

#[derive(serde::Serialize)]
struct Line<'a> {
    /// When the request ended, RFC 3339 in UTC.
    time: &'a str,
    method: &'a str,
    host: &'a str,
    path: &'a str,
    status: u16,
    bytes: u64,
    duration_ms: f64,
    route: Option<&'a str>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    aborted: bool,
}

impl AccessLog {
    pub(crate) fn spawn() -> Self {
        let (tx, mut rx) = mpsc::channel::<String>(QUEUE);
        let dropped = Arc::new(AtomicU64::new(0));
        tokio::spawn(async move {
            let mut out = tokio::io::stdout();
            while let Some(line) = rx.recv().await {
                if out.write_all(line.as_bytes()).await.is_err() {
                    break;
                }
                if rx.is_empty() {
                    let _ = out.flush().await;
                }
            }
        });
        Self { tx, dropped }
    }

    pub(crate) fn write(
        &self,
        f: &Fields,
        status: u16,
        bytes: u64,
        elapsed: Duration,
        aborted: bool,
    ) {
        let now = time::OffsetDateTime::now_utc()
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default();
        let line = Line {
            time: &now,
            method: &f.method,
            host: &f.host,
            path: &f.path,
            status,
            bytes,
            duration_ms: elapsed.as_secs_f64() * 1000.0,
            route: f.route.as_deref(),
            aborted,
        };
        let Ok(mut text) = serde_json::to_string(&line) else {
            return;
        };
        text.push('\n');
        if self.tx.try_send(text).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}
