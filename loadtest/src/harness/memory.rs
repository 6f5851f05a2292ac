//! The proxy's memory with a large table: idle, right after the first push of a document,
//! while the same document is pushed again and again (each push builds a new table while the
//! old one still serves), and once the pushes stop.

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use cftunnel_testkit::ports::free_port;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde::Serialize;
use tokio::net::TcpStream;

use super::process::{CpuList, ProcessError, ServerProcess};
use super::procfs::{self, Memory};

const READY_TIMEOUT: Duration = Duration::from_secs(20);
const PUSH_TIMEOUT: Duration = Duration::from_secs(60);
/// How long after the last push the settled figure is read: the proxy frees a replaced
/// table once its last request is done, polling every 100 ms.
const SETTLE: Duration = Duration::from_secs(2);
const TOKEN: &str = "memory-check";

/// Resident set sizes in KiB, and how long each push took.
#[derive(Debug, Clone, Serialize)]
pub struct MemoryReport {
    pub rules: usize,
    pub pushes: usize,
    pub idle_kib: u64,
    pub first_push_kib: u64,
    /// The largest resident set seen between pushes.
    pub during_pushes_kib: u64,
    /// The process's peak (`VmHWM`) over the whole run.
    pub peak_kib: u64,
    pub settled_kib: u64,
    pub push_ms: Vec<u64>,
}

#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} is not a config document: {source}")]
    Document {
        path: String,
        source: serde_json::Error,
    },
    #[error("no free port: {0}")]
    Port(std::io::Error),
    #[error(transparent)]
    Process(#[from] ProcessError),
    #[error("push {n}: {reason}")]
    Push { n: usize, reason: String },
    #[error("cannot read the proxy's memory from /proc")]
    Procfs,
}

/// Starts `proxy_bin`, pushes the document at `doc_path` `pushes` times (versions 1, 2, ...)
/// and reads the proxy's memory along the way.
pub async fn run(
    proxy_bin: &Path,
    doc_path: &Path,
    pushes: usize,
    workers: usize,
    cpus: Option<&CpuList>,
    scratch: &Path,
) -> Result<MemoryReport, MemoryError> {
    let path = doc_path.display().to_string();
    let text = tokio::fs::read(doc_path)
        .await
        .map_err(|source| MemoryError::Read {
            path: path.clone(),
            source,
        })?;
    let mut doc: serde_json::Value =
        serde_json::from_slice(&text).map_err(|source| MemoryError::Document {
            path: path.clone(),
            source,
        })?;
    let rules = doc["rules"].as_array().map_or(0, Vec::len);

    let data = free_port().map_err(MemoryError::Port)?;
    let admin = free_port().map_err(MemoryError::Port)?;
    let env = vec![
        ("PROXY_ADDR".to_owned(), data.to_string()),
        ("PROXY_CONFIG_ADDR".to_owned(), admin.to_string()),
        ("PROXY_AUTH_TOKEN".to_owned(), TOKEN.to_owned()),
        ("PROXY_WORKER_THREADS".to_owned(), workers.to_string()),
        ("PROXY_GRACE_PERIOD".to_owned(), "1s".to_owned()),
    ];
    let mut proxy = ServerProcess::spawn(
        "proxy-memory",
        proxy_bin,
        &[],
        &env,
        &["TUNNEL_TOKEN", "PROXY_CONFIG_FILE"],
        cpus,
        scratch,
    )?;
    // Not ready until a table is loaded: wait for liveness.
    proxy
        .wait_ready(admin, &admin.to_string(), "/healthz", READY_TIMEOUT)
        .await?;
    let pid = proxy.pid().ok_or(MemoryError::Procfs)?;
    let read = || async { procfs::memory(pid).await.ok_or(MemoryError::Procfs) };

    tokio::time::sleep(Duration::from_millis(200)).await;
    let idle = read().await?;
    let mut first = Memory::default();
    let mut during = 0;
    let mut push_ms = Vec::with_capacity(pushes);
    for n in 1..=pushes {
        doc["version"] = serde_json::Value::from(n);
        let body = Bytes::from(doc.to_string());
        let started = std::time::Instant::now();
        put_config(admin, body)
            .await
            .map_err(|reason| MemoryError::Push { n, reason })?;
        push_ms.push(u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX));
        let m = read().await?;
        if n == 1 {
            first = m;
        }
        during = during.max(m.rss_kib);
    }
    tokio::time::sleep(SETTLE).await;
    let settled = read().await?;
    proxy.stop().await;
    Ok(MemoryReport {
        rules,
        pushes,
        idle_kib: idle.rss_kib,
        first_push_kib: first.rss_kib,
        during_pushes_kib: during,
        peak_kib: settled.hwm_kib,
        settled_kib: settled.rss_kib,
        push_ms,
    })
}

impl MemoryReport {
    pub fn render(&self) -> String {
        let mib = |kib: u64| kib as f64 / 1024.0;
        let mut ms = self.push_ms.clone();
        ms.sort_unstable();
        let median = ms.get(ms.len() / 2).copied().unwrap_or(0);
        format!(
            "proxy memory with a {} rule table, {} pushes (RSS, MiB)\n\
             idle {:.1} | after first push {:.1} | during pushes max {:.1} | peak (VmHWM) {:.1} | settled {:.1}\n\
             push round trip: median {median} ms\n",
            self.rules,
            self.pushes,
            mib(self.idle_kib),
            mib(self.first_push_kib),
            mib(self.during_pushes_kib),
            mib(self.peak_kib),
            mib(self.settled_kib),
        )
    }
}

async fn put_config(admin: std::net::SocketAddr, body: Bytes) -> Result<(), String> {
    let attempt = async {
        let stream = TcpStream::connect(admin).await.map_err(|e| e.to_string())?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        let req = http::Request::put("/config")
            .header(http::header::HOST, admin.to_string())
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(http::header::AUTHORIZATION, format!("Bearer {TOKEN}"))
            .body(Full::new(body))
            .map_err(|e| e.to_string())?;
        let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
        let status = resp.status();
        let text = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        if status.is_success() {
            Ok(())
        } else {
            Err(format!(
                "{status}: {}",
                String::from_utf8_lossy(&text).trim_end()
            ))
        }
    };
    tokio::time::timeout(PUSH_TIMEOUT, attempt)
        .await
        .map_err(|_| "timed out".to_owned())?
}
