//! The PrometheusRule: Prometheus' own `promtool` accepts its rules, and its unit tests show the
//! alerts fire on the series the controller, the proxies and the connectors serve, with the
//! thresholds the values set, and stay quiet below them.

use std::path::PathBuf;
use std::process::Command;

use super::{render, tools};

/// `promtool`, or `None` (the test skips) where it is missing and CI does not require it.
fn promtool(test: &str) -> Option<PathBuf> {
    use cftunnel_testkit::tools::{find, required};
    required(test, find("CFTUNNEL_PROMTOOL", "promtool/promtool"))
}

fn promtool_run(promtool: &PathBuf, args: &[&str], dir: &std::path::Path) -> String {
    let out = Command::new(promtool)
        .args(args)
        .current_dir(dir)
        .output()
        .expect("promtool runs");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {}: {said}", args.join(" "));
    said
}

/// Unit tests in promtool's format: one minute per sample. The values file sets
/// `targetInflightPerPod: 80`, so in-flight alerts fire above 0.8 * 80 = 64.
const UNIT_TESTS: &str = r#"
rule_files: [rules.yaml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'cftunnel_controller_leading{namespace="cf-system",app_kubernetes_io_instance="cf",pod="controller-1"}'
        values: '1x30'
      - series: 'cftunnel_controller_rounds_total{namespace="cf-system",app_kubernetes_io_instance="cf",pod="controller-1"}'
        values: '0+2x30'
      # Another release's controller, stalled and failing: not this release's alerts.
      - series: 'cftunnel_controller_rounds_total{namespace="other",app_kubernetes_io_instance="cf",pod="controller-1"}'
        values: '5x30'
      - series: 'cftunnel_controller_render_failing_gateways{namespace="other",app_kubernetes_io_instance="cf",pod="controller-1"}'
        values: '1x30'
      - series: 'cftunnel_controller_push_failing_planes{namespace="cf-system",app_kubernetes_io_instance="cf",pod="controller-1"}'
        values: '0 0 1x28'
      - series: 'cftunnel_controller_push_failures_total{namespace="cf-system",app_kubernetes_io_instance="cf",pod="controller-1",plane="tenant-a/edge"}'
        values: '0+3x30'
      - series: 'cftunnel_controller_push_failures_total{namespace="cf-system",app_kubernetes_io_instance="cf",pod="controller-1",plane="shared"}'
        values: '5x30'
      - series: 'cftunnel_tunnel_connections{namespace="tenant-a",pod="edge-1",cf_k8s_lex_la_gateway="edge",protocol="quic"}'
        values: '4 4 0x28'
      - series: 'cftunnel_tunnel_connections{namespace="tenant-b",pod="api-1",cf_k8s_lex_la_gateway="api",protocol="quic"}'
        values: '4x30'
      # A pod draining after SIGTERM with a long grace period: its connections go on purpose.
      - series: 'cftunnel_tunnel_connections{namespace="tenant-b",pod="api-2",cf_k8s_lex_la_gateway="api",protocol="quic"}'
        values: '4 4 0x5'
      - series: 'cftunnel_proxy_draining{namespace="tenant-b",pod="api-2",cf_k8s_lex_la_gateway="api"}'
        values: '0 0 1x5'
      # A plane's only pod draining (its Gateway deleted, the grace long): not a plane down.
      - series: 'cftunnel_tunnel_connections{namespace="tenant-d",pod="gone-1",cf_k8s_lex_la_gateway="gone",protocol="quic"}'
        values: '4 4 0x5'
      - series: 'cftunnel_proxy_draining{namespace="tenant-d",pod="gone-1",cf_k8s_lex_la_gateway="gone"}'
        values: '0 0 1x5'
      # A pod that never connected (its edge unreachable): each protocol it may use at 0.
      - series: 'cftunnel_tunnel_connections{namespace="tenant-c",pod="third-1",cf_k8s_lex_la_gateway="third",protocol="quic"}'
        values: '0x30'
      - series: 'cftunnel_tunnel_connections{namespace="tenant-c",pod="third-1",cf_k8s_lex_la_gateway="third",protocol="http2"}'
        values: '0x30'
      - series: 'cftunnel_proxy_requests_in_flight{namespace="tenant-a",pod="edge-1",cf_k8s_lex_la_gateway="edge"}'
        values: '70x30'
      - series: 'cftunnel_proxy_requests_in_flight{namespace="tenant-b",pod="api-1",cf_k8s_lex_la_gateway="api"}'
        values: '60x30'
      # shop: 1 of 11 requests a second answered 5xx; api: 1 of 101.
      - series: 'cftunnel_proxy_requests_total{namespace="tenant-a",pod="edge-1",hostname="shop.example.com",status_class="5xx"}'
        values: '0+60x30'
      - series: 'cftunnel_proxy_requests_total{namespace="tenant-a",pod="edge-1",hostname="shop.example.com",status_class="2xx"}'
        values: '0+600x30'
      - series: 'cftunnel_proxy_requests_total{namespace="tenant-b",pod="api-1",hostname="api.example.com",status_class="5xx"}'
        values: '0+60x30'
      - series: 'cftunnel_proxy_requests_total{namespace="tenant-b",pod="api-1",hostname="api.example.com",status_class="2xx"}'
        values: '0+6000x30'
      # First failures: the edge refuses a token at a pod's first registration, and two pods
      # refuse a push, one whose series was listed at 0 from the start and one whose series
      # appears with the refusal. Each fires for its window, then stops.
      - series: 'cftunnel_tunnel_registration_failures_total{namespace="tenant-b",pod="api-1",protocol="quic",cause="unauthorized"}'
        values: '_x5 1x24'
      - series: 'cftunnel_proxy_config_reloads_total{namespace="tenant-a",pod="edge-1",result="rejected"}'
        values: '0x5 1x24'
      - series: 'cftunnel_proxy_config_reloads_total{namespace="tenant-b",pod="api-1",result="rejected"}'
        values: '_x5 1x24'
      # Configs taken: edge-1 pushed one; api-1 loaded one whose version is 0 (a document
      # written by hand); third-1 was never given one.
      - series: 'cftunnel_proxy_config_reloads_total{namespace="tenant-a",pod="edge-1",result="success"}'
        values: '0 1x29'
      - series: 'cftunnel_proxy_config_version{namespace="tenant-a",pod="edge-1"}'
        values: '0 7x29'
      - series: 'cftunnel_proxy_config_reloads_total{namespace="tenant-b",pod="api-1",result="success"}'
        values: '1x30'
      - series: 'cftunnel_proxy_config_version{namespace="tenant-b",pod="api-1"}'
        values: '0x30'
      - series: 'cftunnel_proxy_config_reloads_total{namespace="tenant-c",pod="third-1",result="success"}'
        values: '0x30'
      - series: 'cftunnel_proxy_config_version{namespace="tenant-c",pod="third-1"}'
        values: '0x30'
    alert_rule_test:
      - eval_time: 4m
        alertname: CftunnelTunnelUnauthorized
        exp_alerts: []
      - eval_time: 8m
        alertname: CftunnelTunnelUnauthorized
        exp_alerts:
          - exp_labels: {severity: critical, team: edge, namespace: tenant-b, pod: api-1, protocol: quic, cause: unauthorized}
            exp_annotations:
              summary: "The edge refuses the connector token of tenant-b/api-1 (revoked or rotated tunnel secret?)."
      - eval_time: 20m
        alertname: CftunnelTunnelUnauthorized
        exp_alerts: []
      - eval_time: 8m
        alertname: CftunnelConfigRejected
        exp_alerts:
          - exp_labels: {severity: warning, team: edge, namespace: tenant-a, pod: edge-1, result: rejected}
            exp_annotations:
              summary: "tenant-a/edge-1 refused a config push; see routes with ProxyConfigPushed=False (RuleRefused)."
          - exp_labels: {severity: warning, team: edge, namespace: tenant-b, pod: api-1, result: rejected}
            exp_annotations:
              summary: "tenant-b/api-1 refused a config push; see routes with ProxyConfigPushed=False (RuleRefused)."
      - eval_time: 25m
        alertname: CftunnelConfigRejected
        exp_alerts: []
      - eval_time: 5m
        alertname: CftunnelConfigPushFailing
        exp_alerts: []
      - eval_time: 10m
        alertname: CftunnelConfigPushFailing
        exp_alerts:
          - exp_labels: {severity: warning, team: edge}
            exp_annotations:
              summary: "1 data plane(s) have not taken their config; see routes with ProxyConfigPushed=False."
      - eval_time: 25m
        alertname: CftunnelConfigPushErrors
        exp_alerts:
          - exp_labels: {severity: warning, team: edge, plane: tenant-a/edge}
            exp_annotations:
              summary: "Config pushes to pods of plane tenant-a/edge keep failing."
      - eval_time: 10m
        alertname: CftunnelNoLeader
        exp_alerts: []
      - eval_time: 6m
        alertname: CftunnelPlaneNotConnected
        exp_alerts:
          - exp_labels: {severity: critical, team: edge, namespace: tenant-a, cf_k8s_lex_la_gateway: edge}
            exp_annotations:
              summary: "No pod of the plane in tenant-a (edge) is connected to its tunnel: its hostnames are down."
          - exp_labels: {severity: critical, team: edge, namespace: tenant-c, cf_k8s_lex_la_gateway: third}
            exp_annotations:
              summary: "No pod of the plane in tenant-c (third) is connected to its tunnel: its hostnames are down."
      - eval_time: 6m
        alertname: CftunnelProxyNotConnected
        exp_alerts:
          - exp_labels: {severity: warning, team: edge, namespace: tenant-a, pod: edge-1}
            exp_annotations:
              summary: "tenant-a/edge-1 has no registered tunnel connection."
          - exp_labels: {severity: warning, team: edge, namespace: tenant-c, pod: third-1}
            exp_annotations:
              summary: "tenant-c/third-1 has no registered tunnel connection."
      - eval_time: 10m
        alertname: CftunnelProxyWithoutConfig
        exp_alerts:
          - exp_labels: {severity: warning, team: edge, namespace: tenant-c, pod: third-1, result: success}
            exp_annotations:
              summary: "tenant-c/third-1 has been given no config; it answers 502 to everything."
      - eval_time: 20m
        alertname: CftunnelReconcileStalled
        exp_alerts: []
      - eval_time: 20m
        alertname: CftunnelRenderFailing
        exp_alerts: []
      - eval_time: 20m
        alertname: CftunnelTunnelDegraded
        exp_alerts:
          - exp_labels: {severity: warning, team: edge, namespace: tenant-a, pod: edge-1}
            exp_annotations:
              summary: "tenant-a/edge-1 holds fewer than its 4 tunnel connections."
          - exp_labels: {severity: warning, team: edge, namespace: tenant-c, pod: third-1}
            exp_annotations:
              summary: "tenant-c/third-1 holds fewer than its 4 tunnel connections."
      - eval_time: 20m
        alertname: CftunnelInFlightNearTarget
        exp_alerts:
          - exp_labels: {severity: warning, team: edge, namespace: tenant-a, cf_k8s_lex_la_gateway: edge}
            exp_annotations:
              summary: "Proxies in tenant-a (edge) average 70 requests in flight, near the autoscaling target."
      - eval_time: 20m
        alertname: CftunnelHigh5xxRatio
        exp_alerts:
          - exp_labels: {severity: warning, team: edge, namespace: tenant-a, hostname: shop.example.com}
            exp_annotations:
              summary: "shop.example.com: more than 5% of requests answered 5xx; cftunnel_proxy_backend_errors_total{reason} says why."
  # Controllers of other releases lead (in another namespace, and in this one); this
  # release's does not, then is not scraped at all.
  - interval: 1m
    input_series:
      - series: 'cftunnel_controller_leading{namespace="other",app_kubernetes_io_instance="cf",pod="controller-1"}'
        values: '1x30'
      - series: 'cftunnel_controller_leading{namespace="cf-system",app_kubernetes_io_instance="edge",pod="edge-controller-1"}'
        values: '1x30'
      - series: 'cftunnel_controller_leading{namespace="cf-system",app_kubernetes_io_instance="cf",pod="controller-1"}'
        values: '0x10'
    alert_rule_test:
      - eval_time: 5m
        alertname: CftunnelNoLeader
        exp_alerts:
          - exp_labels: {severity: critical, team: edge}
            exp_annotations:
              summary: No cftunnel-controller replica leads; nothing is reconciled.
      - eval_time: 25m
        alertname: CftunnelNoLeader
        exp_alerts:
          - exp_labels: {severity: critical, team: edge, namespace: cf-system, app_kubernetes_io_instance: cf}
            exp_annotations:
              summary: No cftunnel-controller replica leads; nothing is reconciled.
"#;

#[test]
fn the_alerts_are_rules_prometheus_accepts_and_fire_as_documented() {
    let test = "the_alerts_are_rules_prometheus_accepts_and_fire_as_documented";
    let (Some(tools), Some(promtool)) = (tools(test), promtool(test)) else {
        return;
    };
    let rendered = render(tools, "autoscaling-values.yaml", "");
    let rule = rendered.raw("PrometheusRule", super::RELEASE);
    assert_eq!(
        rule["apiVersion"].as_str(),
        Some("monitoring.coreos.com/v1")
    );
    assert_eq!(
        rule["metadata"]["labels"]["release"].as_str(),
        Some("kube-prometheus-stack")
    );
    let dir = std::env::temp_dir().join(format!("cftunnel-alerts-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    let rules = serde_yaml_ng::to_string(&rule["spec"]).expect("YAML");
    std::fs::write(dir.join("rules.yaml"), rules).expect("rules written");
    std::fs::write(dir.join("tests.yaml"), UNIT_TESTS).expect("tests written");
    let checked = promtool_run(&promtool, &["check", "rules", "rules.yaml"], &dir);
    assert!(checked.contains("SUCCESS"), "{checked}");
    promtool_run(&promtool, &["test", "rules", "tests.yaml"], &dir);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_rule_comes_with_a_pod_monitor_scraping_this_releases_controllers_as_the_alerts_read_them() {
    let Some(tools) = tools(
        "the_rule_comes_with_a_pod_monitor_scraping_this_releases_controllers_as_the_alerts_read_them",
    ) else {
        return;
    };
    let name = super::controller_name(super::RELEASE);
    for (file, overrides) in [
        ("autoscaling-values.yaml", ""),
        (
            "default-values.yaml",
            "controller: {podMonitor: {enabled: true}}",
        ),
    ] {
        let rendered = render(tools, file, overrides);
        let monitor = rendered.raw("PodMonitor", &name);
        let spec = &monitor["spec"];
        assert_eq!(
            spec["namespaceSelector"]["matchNames"][0].as_str(),
            Some(super::NAMESPACE)
        );
        // It selects the controller's pods, on the port that serves /metrics.
        let controller: super::Deployment = rendered.one("Deployment", &name);
        let pod = &controller.spec.as_ref().expect("a spec").template;
        let pod_labels = pod
            .metadata
            .as_ref()
            .and_then(|m| m.labels.clone())
            .expect("pod labels");
        let selected = super::label_map(&spec["selector"]["matchLabels"]);
        assert!(!selected.is_empty());
        assert!(
            selected.iter().all(|(k, v)| pod_labels.get(k) == Some(v)),
            "{selected:?} of {pod_labels:?}"
        );
        assert_eq!(selected, super::selector_labels(&controller));
        let endpoint = &spec["podMetricsEndpoints"][0];
        assert_eq!(endpoint["path"].as_str(), Some("/metrics"));
        let port = super::container(&controller)
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == endpoint["port"].as_str())
            .unwrap_or_else(|| panic!("no container port {:?}", endpoint["port"]));
        let run = super::controller_run(&controller);
        assert_eq!(
            run.health_addr.port(),
            u16::try_from(port.container_port).expect("a port")
        );
        // The label the alerts select this release's series by is the pods' release name.
        assert_eq!(
            spec["podTargetLabels"][0].as_str(),
            Some("app.kubernetes.io/instance")
        );
        assert_eq!(
            pod_labels
                .get("app.kubernetes.io/instance")
                .map(String::as_str),
            Some(super::RELEASE)
        );
    }
    let rule = render(tools, "autoscaling-values.yaml", "");
    let rule = rule.raw("PrometheusRule", super::RELEASE);
    let no_leader = rule["spec"]["groups"][0]["rules"][0]["expr"]
        .as_str()
        .expect("an expression");
    let selector = format!(
        "{{namespace=\"{}\",app_kubernetes_io_instance=\"{}\"}}",
        super::NAMESPACE,
        super::RELEASE
    );
    assert_eq!(no_leader.matches(&selector).count(), 2, "{no_leader}");
}

#[test]
fn no_rule_is_rendered_unless_asked_for() {
    let Some(tools) = tools("no_rule_is_rendered_unless_asked_for") else {
        return;
    };
    let rendered = render(tools, "default-values.yaml", "");
    assert!(
        rendered
            .names()
            .iter()
            .all(|n| !n.starts_with("PrometheusRule ") && !n.starts_with("PodMonitor ")),
        "{:?}",
        rendered.names()
    );
}
