//! What a run was measured on, for the results file: CPU model and count, memory, kernel,
//! load average, the source revision and the versions of the external programs used. Read
//! from `/proc` and by asking each program; anything unreadable is left out, never fatal.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};

use super::results::Machine;

/// Describes this machine; `cpus` is counted before any pinning narrows what the process
/// sees. `tools` names each program and the arguments that print its version.
pub fn describe(cpus: usize, tools: &[(&str, &Path, &[&str])]) -> Machine {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    Machine {
        cpu_model: cpu_model(&cpuinfo).unwrap_or_else(|| "unknown CPU".to_owned()),
        cpus,
        memory_mib: memory_mib(&meminfo),
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_owned())
            .unwrap_or_else(|_| "unknown".to_owned()),
        load_average: std::fs::read_to_string("/proc/loadavg")
            .ok()
            .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" ")),
        revision: output_line(
            Path::new("git"),
            &["describe", "--always", "--dirty", "--abbrev=10"],
        ),
        tools: tools
            .iter()
            .filter_map(|(name, bin, args)| output_line(bin, args).map(|v| ((*name).to_owned(), v)))
            .collect::<BTreeMap<_, _>>(),
    }
}

/// The first `model name` of a `/proc/cpuinfo` text.
pub fn cpu_model(cpuinfo: &str) -> Option<String> {
    cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_owned())
        .filter(|v| !v.is_empty())
}

/// `MemTotal` of a `/proc/meminfo` text, in MiB.
pub fn memory_mib(meminfo: &str) -> Option<u64> {
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|kib| kib.parse::<u64>().ok())
        .map(|kib| kib / 1024)
}

/// The first non-empty line a program prints (stdout, else stderr: nginx and wrk print their
/// versions there), or `None` if it cannot be run.
fn output_line(bin: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new(bin)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .ok()?;
    let first = |bytes: &[u8]| {
        String::from_utf8_lossy(bytes)
            .lines()
            .map(str::trim)
            .find(|l| !l.is_empty())
            .map(str::to_owned)
    };
    first(&out.stdout).or_else(|| first(&out.stderr))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_and_memory_come_from_proc_texts() {
        let cpuinfo = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13\n";
        assert_eq!(cpu_model(cpuinfo).as_deref(), Some("AMD EPYC 7B13"));
        assert_eq!(cpu_model("processor : 0\n"), None);
        let meminfo = "MemTotal:       24590512 kB\nMemFree:  1 kB\n";
        assert_eq!(memory_mib(meminfo), Some(24_014));
        assert_eq!(memory_mib(""), None);
    }

    #[test]
    fn a_missing_tool_is_left_out() {
        let m = describe(
            2,
            &[("nothing", Path::new("/nonexistent/tool"), &["--version"])],
        );
        assert_eq!(m.cpus, 2);
        assert!(m.tools.is_empty());
    }
}
