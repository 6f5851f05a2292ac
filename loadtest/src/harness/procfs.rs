//! Memory and CPU time of a server under test, from `/proc/<pid>/status` and
//! `/proc/<pid>/stat`, summed over the process and its direct children.

use std::time::Duration;

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
pub async fn memory(pid: u32) -> Option<Memory> {
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

/// User plus system CPU time of `pid` (all its threads) and its direct children, with
/// `ticks_per_second` from `getconf CLK_TCK`. `None` if the process is gone.
pub async fn cpu_time(pid: u32, ticks_per_second: u64) -> Option<Duration> {
    cpu_times(pid, ticks_per_second).await.map(|t| t.total())
}

/// A process's CPU time, split by where it was spent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuTimes {
    pub user: Duration,
    /// In the kernel, on the process's behalf (system calls, the network stack).
    pub kernel: Duration,
}

impl CpuTimes {
    pub fn total(self) -> Duration {
        self.user + self.kernel
    }

    /// The time spent since `earlier`; `None` if either count went back.
    pub fn since(self, earlier: Self) -> Option<Self> {
        Some(Self {
            user: self.user.checked_sub(earlier.user)?,
            kernel: self.kernel.checked_sub(earlier.kernel)?,
        })
    }
}

/// [`cpu_time`], user and kernel apart.
pub async fn cpu_times(pid: u32, ticks_per_second: u64) -> Option<CpuTimes> {
    let (mut user, mut kernel) = read_ticks(pid).await?;
    for child in children(pid).await {
        let (u, k) = read_ticks(child).await.unwrap_or((0, 0));
        user += u;
        kernel += k;
    }
    let time = |ticks: u64| Duration::from_secs_f64(ticks as f64 / ticks_per_second.max(1) as f64);
    Some(CpuTimes {
        user: time(user),
        kernel: time(kernel),
    })
}

async fn read_ticks(pid: u32) -> Option<(u64, u64)> {
    let stat = tokio::fs::read_to_string(format!("/proc/{pid}/stat"))
        .await
        .ok()?;
    parse_stat_times(&stat)
}

/// `utime + stime` (fields 14 and 15 of `/proc/<pid>/stat`), in clock ticks.
pub fn parse_stat_ticks(stat: &str) -> Option<u64> {
    parse_stat_times(stat).map(|(user, kernel)| user + kernel)
}

/// `utime` and `stime` (fields 14 and 15 of `/proc/<pid>/stat`), in clock ticks.
pub fn parse_stat_times(stat: &str) -> Option<(u64, u64)> {
    // The command name (field 2) is parenthesised and may contain spaces; count after it.
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some((utime, stime))
}

/// Clock ticks per second for `/proc/<pid>/stat` times (`getconf CLK_TCK`; 100 if unknown).
pub async fn ticks_per_second() -> u64 {
    let out = tokio::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .await;
    out.ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .filter(|&t| t > 0)
        .unwrap_or(100)
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

/// Idle time of some CPUs at one moment, for the busy fraction of a window.
#[derive(Debug, Clone, Copy)]
pub struct CpuIdle {
    /// Summed over the CPUs.
    idle: Duration,
    at: std::time::Instant,
    cpus: usize,
}

impl CpuIdle {
    /// Fraction of the time between `earlier` and `self` that the CPUs were busy, 1.0 meaning
    /// all of them all the time.
    pub fn busy_since(self, earlier: CpuIdle) -> Option<f64> {
        let wall = self.at.checked_duration_since(earlier.at)?.as_secs_f64() * self.cpus as f64;
        let idle = self.idle.checked_sub(earlier.idle)?.as_secs_f64();
        (wall > 0.0).then(|| (1.0 - idle / wall).clamp(0.0, 1.0))
    }
}

/// Reads the idle time of `cpus`: from the cpuidle residency counters (microseconds, exact)
/// where the kernel has them, else from the idle and iowait ticks of `/proc/stat`, which the
/// scheduler tick samples and which a load paced on a timer can alias with.
pub async fn cpu_idle(cpus: &[usize], ticks_per_second: u64) -> Option<CpuIdle> {
    let idle = match cpuidle_residency(cpus).await {
        Some(idle) => idle,
        None => {
            let stat = tokio::fs::read_to_string("/proc/stat").await.ok()?;
            let ticks = parse_idle_ticks(&stat, cpus)?;
            Duration::from_secs_f64(ticks as f64 / ticks_per_second.max(1) as f64)
        }
    };
    Some(CpuIdle {
        idle,
        at: std::time::Instant::now(),
        cpus: cpus.len(),
    })
}

/// Sum of `/sys/devices/system/cpu/cpuN/cpuidle/state*/time` over `cpus`.
async fn cpuidle_residency(cpus: &[usize]) -> Option<Duration> {
    let mut total_us = 0u64;
    for cpu in cpus {
        let dir = format!("/sys/devices/system/cpu/cpu{cpu}/cpuidle");
        let mut states = tokio::fs::read_dir(&dir).await.ok()?;
        let mut any = false;
        while let Ok(Some(entry)) = states.next_entry().await {
            if !entry.file_name().to_string_lossy().starts_with("state") {
                continue;
            }
            let time = tokio::fs::read_to_string(entry.path().join("time"))
                .await
                .ok()?;
            total_us += time.trim().parse::<u64>().ok()?;
            any = true;
        }
        if !any {
            return None;
        }
    }
    Some(Duration::from_micros(total_us))
}

/// Idle plus iowait ticks of the `cpuN` lines of a `/proc/stat` text for the CPUs in `cpus`;
/// `None` when one of them is missing.
pub fn parse_idle_ticks(stat: &str, cpus: &[usize]) -> Option<u64> {
    let mut sum = 0;
    let mut found = 0;
    for line in stat.lines() {
        let mut fields = line.split_whitespace();
        let Some(n) = fields
            .next()
            .and_then(|name| name.strip_prefix("cpu"))
            .and_then(|n| n.parse::<usize>().ok())
        else {
            continue;
        };
        if !cpus.contains(&n) {
            continue;
        }
        // user nice system idle iowait ...
        let mut fields = fields.skip(3);
        let idle: u64 = fields.next()?.parse().ok()?;
        let iowait: u64 = fields.next()?.parse().ok()?;
        sum += idle + iowait;
        found += 1;
    }
    (found == cpus.len() && !cpus.is_empty()).then_some(sum)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_ticks_are_user_plus_system_time() {
        let stat = "4242 (nginx: worker) S 4241 4241 4241 0 -1 4194624 120 0 0 0 250 31 0 0 20 0 1 0 100 1000 200";
        assert_eq!(parse_stat_ticks(stat), Some(281));
        assert_eq!(parse_stat_times(stat), Some((250, 31)));
        assert_eq!(parse_stat_ticks("garbage"), None);
    }

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

    #[test]
    fn idle_ticks_sum_the_listed_cpus() {
        let stat = "cpu  30 0 30 100 10 0 0 0 0 0\n\
                    cpu0 10 0 10 50 5 0 0 0 0 0\n\
                    cpu1 20 0 20 45 5 3 2 0 0 0\n\
                    intr 1 2 3\n";
        assert_eq!(parse_idle_ticks(stat, &[1]), Some(50));
        assert_eq!(parse_idle_ticks(stat, &[0, 1]), Some(105));
        assert_eq!(parse_idle_ticks(stat, &[2]), None);
        assert_eq!(parse_idle_ticks(stat, &[]), None);
    }

    #[test]
    fn busy_is_the_share_of_wall_time_not_idle() {
        let t0 = std::time::Instant::now();
        let at = |ms: u64, idle_ms: u64| CpuIdle {
            idle: Duration::from_millis(idle_ms),
            at: t0 + Duration::from_millis(ms),
            cpus: 2,
        };
        assert_eq!(at(1000, 1500).busy_since(at(0, 500)), Some(0.5));
        assert_eq!(at(1000, 500).busy_since(at(0, 500)), Some(1.0));
        assert_eq!(at(0, 500).busy_since(at(0, 500)), None);
        assert_eq!(at(1000, 400).busy_since(at(0, 500)), None);
    }

    #[tokio::test]
    async fn this_machine_reports_the_idle_time_of_cpu_0() {
        let ticks = ticks_per_second().await;
        let a = cpu_idle(&[0], ticks).await.expect("cpu 0 idle time");
        tokio::time::sleep(Duration::from_millis(50)).await;
        let b = cpu_idle(&[0], ticks).await.expect("cpu 0 idle time");
        let busy = b.busy_since(a).expect("time passed");
        assert!((0.0..=1.0).contains(&busy), "{busy}");
    }
}
