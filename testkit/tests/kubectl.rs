//! The in-memory API server against a real client: `kubectl` applies the GatewayConfig CRD and
//! a Gateway, gets and lists (with a label selector) through it, watches, and patches status,
//! as it does against a real API server. The controller's tests rely on the server behaving
//! so; this checks the double, not the controller.
//!
//! The server serves no OpenAPI documents, so kubectl's client-side validation is off.
//!
//! kubectl is found as [`cftunnel_testkit::tools`] says: `.ci/tools` installs it.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use cftunnel_testkit::kube_api::ApiServer;

fn kubectl(test: &str) -> Option<PathBuf> {
    cftunnel_testkit::tools::required(
        test,
        cftunnel_testkit::tools::find("CFTUNNEL_KUBECTL", "kubectl/kubectl"),
    )
}

/// A kubectl bound to `api` as a cluster admin, in a scratch directory.
struct Kubectl {
    bin: PathBuf,
    dir: PathBuf,
}

impl Kubectl {
    fn new(bin: PathBuf, api: &ApiServer, name: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("cftunnel-kubectl-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("scratch directory");
        std::fs::write(
            dir.join("kubeconfig"),
            format!(
                "apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{server: \"{}\"}}}}]\n\
                 contexts: [{{name: x, context: {{cluster: c, user: u, namespace: default}}}}]\n\
                 current-context: x\nusers: [{{name: u, user: {{token: cluster-admin}}}}]\n",
                api.base_url()
            ),
        )
        .expect("kubeconfig");
        Self { bin, dir }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.bin);
        c.env("KUBECONFIG", self.dir.join("kubeconfig"))
            .env("HOME", &self.dir)
            .args(["--request-timeout=10s"])
            .args(args);
        c
    }

    /// Runs `args` to completion and returns stdout; panics with stderr when it fails.
    fn run(&self, args: &[&str]) -> String {
        let Output {
            status,
            stdout,
            stderr,
        } = self.command(args).output().expect("kubectl runs");
        let stdout = String::from_utf8_lossy(&stdout).into_owned();
        assert!(
            status.success(),
            "kubectl {}: {}\n{stdout}",
            args.join(" "),
            String::from_utf8_lossy(&stderr)
        );
        stdout
    }

    /// Applies `manifest` from a file.
    fn apply(&self, manifest: &str, extra: &[&str]) -> String {
        let file = self.dir.join("manifest.yaml");
        std::fs::write(&file, manifest).expect("manifest");
        let file = file.to_string_lossy().into_owned();
        // The server serves no OpenAPI documents, which kubectl's client-side validation reads.
        let mut args = vec!["apply", "--validate=false", "-f", &file];
        args.extend_from_slice(extra);
        self.run(&args)
    }
}

impl Drop for Kubectl {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// What the test's kubectl does, as RBAC rules.
const KUBECTL_RBAC: &[(&str, &str, &[&str])] = &[
    (
        "apiextensions.k8s.io",
        "customresourcedefinitions",
        &["get", "list", "create", "patch"],
    ),
    (
        "gateway.networking.k8s.io",
        "gateways",
        &["get", "list", "watch", "create", "patch", "delete"],
    ),
    (
        "gateway.networking.k8s.io",
        "gateways/status",
        &["get", "patch"],
    ),
];

const GATEWAY: &str = "apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata:
  name: edge
  namespace: tenant-a
  labels: {team: a}
spec:
  gatewayClassName: cloudflare-tunnel
  listeners: [{name: http, port: 80, protocol: HTTP}]
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_applies_gets_lists_watches_and_patches_status() {
    let Some(bin) = kubectl("kubectl_applies_gets_lists_watches_and_patches_status") else {
        return;
    };
    // kubectl sends no bearer token over plain HTTP, so the server sees the service account:
    // grant it what the test does.
    let api = ApiServer::builder().rbac(KUBECTL_RBAC).start().await;
    let k = Kubectl::new(bin, &api, "crud");
    let run = |args: &[&str]| k.run(args);

    // The CRD the chart installs, as `cftunnel-controller crd` prints it.
    let crd = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../charts/cftunnel/crds/gatewayconfigs.cf.k8s.lex.la.yaml"
    ))
    .expect("the chart's CRD");
    let out = tokio::task::block_in_place(|| k.apply(&crd, &["--server-side"]));
    assert!(out.contains("gatewayconfigs.cf.k8s.lex.la"), "{out}");
    let got = tokio::task::block_in_place(|| {
        run(&[
            "get",
            "crd",
            "gatewayconfigs.cf.k8s.lex.la",
            "-o",
            "jsonpath={.spec.names.kind}",
        ])
    });
    assert_eq!(got, "GatewayConfig");

    // A Gateway, created, then changed: client-side apply (create, then a patch).
    tokio::task::block_in_place(|| k.apply(GATEWAY, &[]));
    let changed = GATEWAY.replace("port: 80", "port: 8080");
    tokio::task::block_in_place(|| k.apply(&changed, &[]));
    let port = tokio::task::block_in_place(|| {
        run(&[
            "get",
            "gateway",
            "edge",
            "-n",
            "tenant-a",
            "-o",
            "jsonpath={.spec.listeners[0].port}",
        ])
    });
    assert_eq!(port, "8080");
    let other = GATEWAY
        .replace("name: edge", "name: other")
        .replace("team: a", "team: b");
    tokio::task::block_in_place(|| k.apply(&other, &["--server-side"]));

    // A label-selected list.
    let names = tokio::task::block_in_place(|| {
        run(&[
            "get",
            "gateways",
            "-A",
            "-l",
            "team=b",
            "-o",
            "jsonpath={.items[*].metadata.name}",
        ])
    });
    assert_eq!(names, "other");

    // A watch sees a later change.
    let mut watch = k
        .command(&[
            "get",
            "gateway",
            "edge",
            "-n",
            "tenant-a",
            "--watch",
            "--output-watch-events",
            "-o",
            "json",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl watch starts");
    tokio::time::sleep(Duration::from_millis(500)).await;
    tokio::task::block_in_place(|| {
        run(&["label", "gateway", "edge", "-n", "tenant-a", "stage=two"])
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let _ = watch.kill();
    let out = watch.wait_with_output().expect("watch output");
    let events: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON event per line"))
        .collect();
    let seen: Vec<(&str, &str, Option<&str>)> = events
        .iter()
        .map(|e| {
            (
                e["type"].as_str().unwrap_or_default(),
                e["object"]["metadata"]["name"].as_str().unwrap_or_default(),
                e["object"]["metadata"]["labels"]["stage"].as_str(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [("ADDED", "edge", None), ("MODIFIED", "edge", Some("two"))],
        "the watch sees its object as it is, then the change, and nothing else"
    );

    // Status, through the status subresource.
    tokio::task::block_in_place(|| {
        run(&[
            "patch",
            "gateway",
            "edge",
            "-n",
            "tenant-a",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"conditions":[{"type":"Accepted","status":"True","reason":"Accepted","message":"","lastTransitionTime":"2026-01-01T00:00:00Z"}]}}"#,
        ])
    });
    let status = api
        .get(
            "gateway.networking.k8s.io/v1",
            "Gateway",
            "tenant-a",
            "edge",
        )
        .and_then(|g| g.pointer("/status/conditions/0/reason").cloned());
    assert_eq!(status, Some(serde_json::json!("Accepted")));

    tokio::task::block_in_place(|| run(&["delete", "gateway", "other", "-n", "tenant-a"]));
    assert!(api
        .get(
            "gateway.networking.k8s.io/v1",
            "Gateway",
            "tenant-a",
            "other"
        )
        .is_none());
}
