//! The real tools some tests check our artefacts with (Helm, kubernetes-validate, kubectl):
//! where to find them, and what a test does when one is missing.
//!
//! `.ci/tools` installs them and prints `CFTUNNEL_*` variables naming each; where a variable
//! is unset, a tool is looked for where that script installs it (`$CFTUNNEL_TOOLS_DIR`, else
//! `${XDG_CACHE_HOME:-~/.cache}/cftunnel/tools`). A missing tool skips the tests that need it,
//! saying so on stderr, unless `CFTUNNEL_REQUIRE_TOOLS` is set (CI sets it): then they fail.

use std::io::Write as _;
use std::path::{Path, PathBuf};

/// The tool `var` names, else `installed` (a path) under the install directory.
///
/// # Errors
/// Neither is a file; the message says which was looked at.
pub fn find(var: &str, installed: &str) -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os(var).filter(|v| !v.is_empty()) {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!("{var}={} is not a file", path.display()))
        };
    }
    let path = install_dir()
        .map(|dir| dir.join(installed))
        .ok_or_else(|| format!("{var} is unset and there is no HOME to look in"))?;
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!("{var} is unset and {} is absent", path.display()))
    }
}

/// `found`, or `None` when it is an error and the tools are not required (the test then skips,
/// saying why on stderr).
///
/// # Panics
/// When `found` is an error and `CFTUNNEL_REQUIRE_TOOLS` is set.
pub fn required<T>(test: &str, found: Result<T, String>) -> Option<T> {
    match found {
        Ok(tool) => Some(tool),
        Err(why) if std::env::var_os("CFTUNNEL_REQUIRE_TOOLS").is_some_and(|v| !v.is_empty()) => {
            panic!("{test}: {why}; `.ci/tools` installs the tools")
        }
        Err(why) => {
            report(&format!(
                "{test} skipped: {why}; run `eval \"$(.ci/tools)\"` to install the tools\n"
            ));
            None
        }
    }
}

/// Written past the test harness's capture, so a skip shows in a plain `cargo test`.
pub fn report(text: &str) {
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(text.as_bytes());
}

fn install_dir() -> Option<PathBuf> {
    let env = |name| std::env::var_os(name).filter(|v| !v.is_empty());
    env("CFTUNNEL_TOOLS_DIR").map(PathBuf::from).or_else(|| {
        env("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| env("HOME").map(|home| Path::new(&home).join(".cache")))
            .map(|cache| cache.join("cftunnel/tools"))
    })
}
