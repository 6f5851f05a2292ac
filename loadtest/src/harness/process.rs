//! Child processes under test (echo backend, proxy, nginx): CPU pinning with `taskset`,
//! logs captured to files, readiness polling and an orderly stop.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::process::{Child, Command};

/// How long a stopped process gets after SIGTERM before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(5);
/// Poll interval while waiting for readiness.
const READY_POLL: Duration = Duration::from_millis(50);

/// A CPU list as `taskset -c` takes it (`0`, `1-3`, `0,2`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuList(String);

impl CpuList {
    /// Number of CPUs in the list.
    pub fn count(&self) -> usize {
        self.0
            .split(',')
            .map(|part| match part.split_once('-') {
                Some((a, b)) => match (a.trim().parse::<usize>(), b.trim().parse::<usize>()) {
                    (Ok(a), Ok(b)) if b >= a => b - a + 1,
                    _ => 0,
                },
                None => usize::from(part.trim().parse::<usize>().is_ok()),
            })
            .sum()
    }

    /// Highest CPU number in the list.
    pub fn max_cpu(&self) -> Option<usize> {
        self.0
            .split([',', '-'])
            .filter_map(|c| c.trim().parse::<usize>().ok())
            .max()
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The CPU numbers in the list, ascending; malformed parts are left out.
    pub fn cpus(&self) -> Vec<usize> {
        let mut out: Vec<usize> = self
            .0
            .split(',')
            .flat_map(|part| match part.split_once('-') {
                Some((a, b)) => match (a.trim().parse::<usize>(), b.trim().parse::<usize>()) {
                    (Ok(a), Ok(b)) if b >= a => (a..=b).collect(),
                    _ => Vec::new(),
                },
                None => part.trim().parse::<usize>().into_iter().collect(),
            })
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }
}

impl std::str::FromStr for CpuList {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let list = Self(s.trim().to_owned());
        let valid = !list.0.is_empty()
            && list
                .0
                .split(',')
                .all(|p| !p.is_empty() && p.split('-').all(|n| n.trim().parse::<usize>().is_ok()));
        if valid && list.count() > 0 {
            Ok(list)
        } else {
            Err(format!(
                "invalid CPU list {s:?} (expected e.g. 0, 1-3 or 0,2)"
            ))
        }
    }
}

impl std::fmt::Display for CpuList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Errors starting or waiting for a child process.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error("starting {program}: {source}")]
    Spawn {
        program: String,
        source: std::io::Error,
    },
    #[error("{program} exited during start-up ({status}); last log lines:\n{log_tail}")]
    Exited {
        program: String,
        status: String,
        log_tail: String,
    },
    #[error("{program} was not ready after {waited:?} ({probe}); last log lines:\n{log_tail}")]
    NotReady {
        program: String,
        waited: Duration,
        probe: String,
        log_tail: String,
    },
}

/// A running child. Killed when dropped; [`ServerProcess::stop`] stops it politely.
pub struct ServerProcess {
    name: String,
    child: Child,
    log: PathBuf,
}

impl ServerProcess {
    /// Starts `program args` with `env`, pinned to `cpus` when given, stdout and stderr going
    /// to `<log_dir>/<name>.log`.
    pub fn spawn(
        name: &str,
        program: &Path,
        args: &[String],
        env: &[(String, String)],
        env_remove: &[&str],
        cpus: Option<&CpuList>,
        log_dir: &Path,
    ) -> Result<Self, ProcessError> {
        let log = log_dir.join(format!("{name}.log"));
        let spawn_err = |source| ProcessError::Spawn {
            program: program.display().to_string(),
            source,
        };
        let out = std::fs::File::create(&log).map_err(spawn_err)?;
        let err = out.try_clone().map_err(spawn_err)?;
        let mut cmd = match cpus {
            Some(cpus) => {
                let mut cmd = Command::new("taskset");
                cmd.arg("-c").arg(cpus.as_str()).arg(program);
                cmd
            }
            None => Command::new(program),
        };
        cmd.args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .kill_on_drop(true);
        for key in env_remove {
            cmd.env_remove(key);
        }
        let child = cmd.spawn().map_err(spawn_err)?;
        Ok(Self {
            name: name.to_owned(),
            child,
            log,
        })
    }

    /// Process id (taskset execs the program, so this is the program's own pid).
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Waits until `GET http://<addr><path>` answers 200, the process exits, or `timeout`.
    pub async fn wait_ready(
        &mut self,
        addr: std::net::SocketAddr,
        host: &str,
        path: &str,
        timeout: Duration,
    ) -> Result<(), ProcessError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut last = String::from("no attempt");
        while tokio::time::Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(ProcessError::Exited {
                    program: self.name.clone(),
                    status: status.to_string(),
                    log_tail: self.log_tail().await,
                });
            }
            match probe(addr, host, path).await {
                Ok(200) => return Ok(()),
                Ok(status) => last = format!("GET {path} answered {status}"),
                Err(e) => last = format!("GET {path}: {e}"),
            }
            tokio::time::sleep(READY_POLL).await;
        }
        Err(ProcessError::NotReady {
            program: self.name.clone(),
            waited: timeout,
            probe: last,
            log_tail: self.log_tail().await,
        })
    }

    /// The last lines of the process's log file.
    pub async fn log_tail(&self) -> String {
        let text = tokio::fs::read_to_string(&self.log)
            .await
            .unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }

    /// SIGTERM, then SIGKILL if the process is still there after a grace period.
    pub async fn stop(mut self) {
        if let Some(pid) = self.child.id() {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(pid.to_string())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .await;
            if tokio::time::timeout(STOP_GRACE, self.child.wait())
                .await
                .is_ok()
            {
                return;
            }
        }
        let _ = self.child.kill().await;
    }
}

/// One `GET` on a fresh connection; returns the status code.
pub async fn probe(addr: std::net::SocketAddr, host: &str, path: &str) -> Result<u16, String> {
    exchange(addr, http::Method::GET, host, path, None)
        .await
        .map(|(status, _)| status)
}

/// One request on a fresh connection, with a JSON body when `json` is given; returns the
/// status code and the body. Bounded by a 2 s timeout.
pub async fn exchange(
    addr: std::net::SocketAddr,
    method: http::Method,
    host: &str,
    path: &str,
    json: Option<String>,
) -> Result<(u16, Bytes), String> {
    let attempt = async {
        let stream = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        let mut req = http::Request::builder()
            .method(method)
            .uri(path)
            .header(http::header::HOST, host);
        if json.is_some() {
            req = req.header(http::header::CONTENT_TYPE, "application/json");
        }
        let req = req
            .body(Full::new(Bytes::from(json.unwrap_or_default())))
            .map_err(|e| e.to_string())?;
        let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
        let status = resp.status().as_u16();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok((status, body))
    };
    tokio::time::timeout(Duration::from_secs(2), attempt)
        .await
        .map_err(|_| "timed out".to_owned())?
}

/// Pins every thread of the current process to `cpus` with `taskset -a -p`. Call it before
/// starting the async runtime so its threads inherit the mask.
pub fn pin_current_process(cpus: &CpuList) -> std::io::Result<()> {
    let status = std::process::Command::new("taskset")
        .args([
            "-a",
            "-c",
            "-p",
            cpus.as_str(),
            &std::process::id().to_string(),
        ])
        .stdout(Stdio::null())
        .status()?;
    if status.success() {
        Ok(())
    } else {
        Err(std::io::Error::other(format!(
            "taskset exited with {status}"
        )))
    }
}

/// A temporary directory for generated configs and logs, removed on drop unless kept.
pub struct ScratchDir {
    path: PathBuf,
    keep: bool,
}

impl ScratchDir {
    pub fn create(keep: bool) -> std::io::Result<Self> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let path = std::env::temp_dir().join(format!(
            "cftunnel-loadtest-{}-{nanos:x}",
            std::process::id()
        ));
        std::fs::create_dir_all(&path)?;
        Ok(Self { path, keep })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// Looks `name` up on `PATH` (plus the sbin directories, where nginx lives).
pub fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/usr/local/sbin", "/sbin"].map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_parse_and_count() {
        let l: CpuList = "0".parse().expect("valid");
        assert_eq!((l.count(), l.max_cpu()), (1, Some(0)));
        let l: CpuList = "1-3,5".parse().expect("valid");
        assert_eq!((l.count(), l.max_cpu()), (4, Some(5)));
        assert_eq!(l.cpus(), [1, 2, 3, 5]);
        assert!("".parse::<CpuList>().is_err());
        assert!("a".parse::<CpuList>().is_err());
        assert!("3-1".parse::<CpuList>().is_err());
    }
}
