//! Resident memory of a server under test, from `/proc/<pid>/status`.

use serde::Serialize;

/// `VmRSS` (current) and `VmHWM` (peak) in KiB, summed over a process and its direct
/// children (nginx's workers; the proxy is a single process).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Memory {
    pub rss_kib: u64,
    pub hwm_kib: u64,
    /// Processes summed.
    pub processes: u32,
}

/// Reads the memory of `pid` and its direct children; `None` if the process is gone or
/// `/proc` is unavailable.
pub async fn read(pid: u32) -> Option<Memory> {
    let mut total = read_one(pid).await?;
    total.processes = 1;
    for child in children(pid).await {
        if let Some(m) = read_one(child).await {
            total.rss_kib += m.rss_kib;
            total.hwm_kib += m.hwm_kib;
            total.processes += 1;
        }
    }
    Some(total)
}

async fn read_one(pid: u32) -> Option<Memory> {
    let status = tokio::fs::read_to_string(format!("/proc/{pid}/status"))
        .await
        .ok()?;
    Some(parse_status(&status))
}

/// Extracts `VmRSS` and `VmHWM` (both in kB) from a `/proc/<pid>/status` text.
pub fn parse_status(status: &str) -> Memory {
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    };
    Memory {
        rss_kib: field("VmRSS:"),
        hwm_kib: field("VmHWM:"),
        processes: 1,
    }
}

/// Direct children of `pid`, found by scanning `/proc/*/stat` (bounded by the process table).
async fn children(pid: u32) -> Vec<u32> {
    let mut found = Vec::new();
    let Ok(mut dir) = tokio::fs::read_dir("/proc").await else {
        return found;
    };
    for _ in 0..1_000_000 {
        let Ok(Some(entry)) = dir.next_entry().await else {
            break;
        };
        let Some(child) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = tokio::fs::read_to_string(format!("/proc/{child}/stat")).await else {
            continue;
        };
        // Fields after the parenthesised command name: state, ppid, ...
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(pid) {
            found.push(child);
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_fields_are_parsed_in_kib() {
        let status =
            "Name:\tcftunnel-proxy\nVmHWM:\t   10240 kB\nVmRSS:\t    8192 kB\nThreads:\t3\n";
        assert_eq!(
            parse_status(status),
            Memory {
                rss_kib: 8192,
                hwm_kib: 10240,
                processes: 1
            }
        );
    }
}
