//! The tools the chart's tests run: Helm, the newest release the chart supports and the oldest,
//! and `kubernetes-validate` (the Kubernetes OpenAPI schemas).
//!
//! Found and required as [`cftunnel_testkit::tools`] says (`.ci/tools` installs them).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

pub struct Tools {
    /// The newest Helm the chart supports.
    pub helm: Helm,
    /// The oldest.
    pub helm_oldest: Helm,
    validate: PathBuf,
}

/// The tools, or `None` (the test skips) when one is missing and CI does not require them.
///
/// # Panics
/// When a tool is missing and `CFTUNNEL_REQUIRE_TOOLS` is set.
pub fn tools(test: &str) -> Option<&'static Tools> {
    static TOOLS: OnceLock<Result<Tools, String>> = OnceLock::new();
    cftunnel_testkit::tools::required(
        test,
        TOOLS.get_or_init(locate).as_ref().map_err(Clone::clone),
    )
}

fn locate() -> Result<Tools, String> {
    use cftunnel_testkit::tools::find;
    Ok(Tools {
        helm: Helm::new(find("CFTUNNEL_HELM", "helm-4/helm")?)?,
        helm_oldest: Helm::new(find("CFTUNNEL_HELM_OLDEST", "helm-3.9/helm")?)?,
        validate: find(
            "CFTUNNEL_KUBERNETES_VALIDATE",
            "venv/bin/kubernetes-validate",
        )?,
    })
}

/// Runs `program` with `args`, `stdin` on its standard input; its stdout, or what it said
/// when it failed.
fn run(program: &Path, args: &[&str], stdin: &str) -> Result<String, String> {
    let mut child = Command::new(program)
        .args(args)
        // No cluster: `lookup` finds nothing, as under `helm template` anywhere.
        .env("KUBECONFIG", "/nonexistent")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e}", program.display()));
    child
        .stdin
        .take()
        .expect("stdin is piped")
        .write_all(stdin.as_bytes())
        .expect("stdin takes the values");
    let out = child.wait_with_output().expect("the tool runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.success() {
        Ok(stdout)
    } else {
        Err(format!(
            "{} {}: {}\n{stdout}{}",
            program.display(),
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// One Helm binary.
pub struct Helm {
    path: PathBuf,
    /// `v3.9.4`, `v4.1.4`.
    pub version: String,
}

/// What a chart is rendered with: values files, then YAML given inline, over the chart's.
pub struct Release<'a> {
    pub name: &'a str,
    pub namespace: &'a str,
    pub values_files: Vec<PathBuf>,
    pub values: &'a str,
    pub kube_version: &'a str,
}

impl Helm {
    fn new(path: PathBuf) -> Result<Self, String> {
        let version = run(&path, &["version", "--template", "{{.Version}}"], "")?;
        Ok(Self { path, version })
    }

    /// `major.minor` of this Helm.
    pub fn minor(&self) -> String {
        let v = self.version.trim_start_matches('v');
        v.split('.').take(2).collect::<Vec<_>>().join(".")
    }

    fn values_args<'a>(release: &'a Release<'_>, args: &mut Vec<&'a str>) {
        for file in &release.values_files {
            args.extend(["--values", file.to_str().expect("a UTF-8 path")]);
        }
        // The inline values on stdin, last: they win.
        args.extend(["--values", "-"]);
    }

    /// `helm template` of `chart` (its CRDs included).
    pub fn template(&self, chart: &Path, release: &Release<'_>) -> Result<String, String> {
        self.template_with(chart, release, &[])
    }

    /// `helm template` as [`Self::template`], then `set` (`--set=KEY=VALUE`,
    /// `--set-string=KEY=VALUE`), which wins over the values as on a command line.
    pub fn template_with(
        &self,
        chart: &Path,
        release: &Release<'_>,
        set: &[&str],
    ) -> Result<String, String> {
        let mut args = vec![
            "template",
            release.name,
            chart.to_str().expect("a UTF-8 path"),
            "--namespace",
            release.namespace,
            "--kube-version",
            release.kube_version,
            "--include-crds",
        ];
        Self::values_args(release, &mut args);
        args.extend_from_slice(set);
        run(&self.path, &args, release.values)
    }

    /// The notes an install prints (`helm install --dry-run=client`, for the Kubernetes
    /// release this Helm assumes: `install` takes no other).
    pub fn notes(&self, chart: &Path, release: &Release<'_>) -> Result<String, String> {
        let mut args = vec![
            "install",
            release.name,
            chart.to_str().expect("a UTF-8 path"),
            "--namespace",
            release.namespace,
            "--dry-run=client",
        ];
        Self::values_args(release, &mut args);
        let out = run(&self.path, &args, release.values)?;
        out.split_once("\nNOTES:\n")
            .map(|(_, notes)| notes.to_owned())
            .ok_or_else(|| format!("no NOTES in:\n{out}"))
    }

    /// `helm lint --strict` of `chart` (warnings fail), and against `kube_version` where this
    /// Helm can lint for one (3.15 and later).
    pub fn lint(
        &self,
        chart: &Path,
        values_file: &Path,
        kube_version: Option<&str>,
    ) -> Result<String, String> {
        let mut args = vec![
            "lint",
            "--strict",
            chart.to_str().expect("a UTF-8 path"),
            "--values",
            values_file.to_str().expect("a UTF-8 path"),
        ];
        if let Some(kube_version) = kube_version {
            args.extend(["--kube-version", kube_version]);
        }
        run(&self.path, &args, "")
    }
}

impl Tools {
    /// What `kubernetes-validate --strict` says of `manifests` (multi-document YAML) for
    /// Kubernetes `kube_version`: the objects it found no schema for (their kinds, as
    /// `Kind apiVersion`), or its failures.
    pub fn validate(&self, manifests: &str, kube_version: &str) -> Result<Vec<String>, String> {
        static SEQ: AtomicUsize = AtomicUsize::new(0);
        let file = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
            "chart-{}-{}.yaml",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::write(&file, manifests).expect("the manifests are written");
        let result = run(
            &self.validate,
            &[
                "--strict",
                "--quiet",
                "--kubernetes-version",
                kube_version,
                file.to_str().expect("a UTF-8 path"),
            ],
            "",
        );
        let _ = std::fs::remove_file(&file);
        let out = result?;
        let re = regex::Regex::new(r"Couldn't find schema for kind (\S+) with api version (\S+)")
            .expect("regex");
        let mut unknown = Vec::new();
        for line in out.lines().filter(|l| !l.trim().is_empty()) {
            let Some(c) = re.captures(line) else {
                return Err(format!("kubernetes-validate {kube_version}: {line}\n{out}"));
            };
            unknown.push(format!("{} {}", &c[1], &c[2]));
        }
        Ok(unknown)
    }
}
