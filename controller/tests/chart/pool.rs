//! The shared proxy pool: its autoscaler and ServiceMonitor.

use super::*;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;

#[test]
fn the_pools_autoscaler_and_service_monitor_follow_the_values() {
    let Some(tools) = tools("the_pools_autoscaler_and_service_monitor_follow_the_values") else {
        return;
    };
    for file in values_files() {
        let values = values(&file, "");
        let rendered = render(tools, &file, "");
        let pool: Deployment = rendered.one("Deployment", &pool_name(RELEASE));
        let service: Service = rendered.one("Service", &pool_name(RELEASE));
        let autoscaling = at(&values, "proxy.autoscaling");
        let hpa =
            rendered.get::<HorizontalPodAutoscaler>("HorizontalPodAutoscaler", &pool_name(RELEASE));
        assert_eq!(
            hpa.is_some(),
            autoscaling["enabled"].as_bool() == Some(true),
            "{file}"
        );
        let replicas = pool.spec.as_ref().and_then(|s| s.replicas);
        if let Some(hpa) = hpa {
            // Without a cluster to look up, the count is the autoscaler's alone.
            assert_eq!(replicas, None, "{file}");
            let spec = hpa.spec;
            assert_eq!(spec.scale_target_ref.name, pool_name(RELEASE));
            assert_eq!(spec.scale_target_ref.kind, "Deployment");
            assert_eq!(
                spec.min_replicas.map(|n| n.to_string()),
                Some(string(&values, "proxy.autoscaling.minReplicas"))
            );
            assert_eq!(
                spec.max_replicas.to_string(),
                string(&values, "proxy.autoscaling.maxReplicas")
            );
            // The same metric as a dedicated plane's autoscaler, at the values' target.
            let run = controller_run(&rendered.one("Deployment", &controller_name(RELEASE)));
            let plane_hpa = plane(&options(&run))
                .autoscaler
                .expect("the fixture's plane autoscales");
            let metric = |spec: &k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscalerSpec| {
                let metrics = spec.metrics.clone().expect("metrics");
                assert_eq!(metrics.len(), 1);
                let pods = metrics[0].pods.clone().expect("a Pods metric");
                (
                    metrics[0].type_.clone(),
                    pods.metric.name,
                    pods.target.type_,
                    pods.target.average_value,
                )
            };
            let (kind, name, target, average) = metric(&spec);
            let (plane_kind, plane_name, plane_target, _) = metric(&plane_hpa.spec);
            assert_eq!((kind, name, target), (plane_kind, plane_name, plane_target));
            assert_eq!(
                average.map(|q| q.0),
                Some(string(&values, "proxy.autoscaling.targetInflightPerPod"))
            );
        } else {
            assert_eq!(
                replicas.map(|n| n.to_string()),
                Some(string(&values, "proxy.replicas")),
                "{file}"
            );
        }

        let monitor = rendered
            .docs
            .iter()
            .find(|d| d["kind"].as_str() == Some("ServiceMonitor"));
        let wanted = at(&values, "proxy.serviceMonitor.enabled").as_bool() == Some(true);
        assert_eq!(monitor.is_some(), wanted, "{file}");
        if let Some(monitor) = monitor {
            // It selects the pool's Service, in the release namespace, on a port it has.
            let selects = label_map(&monitor["spec"]["selector"]["matchLabels"]);
            let labels = service.metadata.labels.clone().unwrap_or_default();
            assert!(!selects.is_empty(), "{file}");
            assert!(
                selects.iter().all(|(k, v)| labels.get(k) == Some(v)),
                "{file}: {selects:?} of {labels:?}"
            );
            assert_eq!(
                service.spec.as_ref().and_then(|s| s.selector.clone()),
                Some(selector_labels(&pool))
            );
            assert_eq!(
                monitor["spec"]["namespaceSelector"]["matchNames"],
                Value::Sequence(vec![NAMESPACE.into()])
            );
            let endpoint = &monitor["spec"]["endpoints"][0];
            let port = endpoint["port"].as_str().expect("a port name");
            assert!(
                service
                    .spec
                    .as_ref()
                    .and_then(|s| s.ports.as_ref())
                    .into_iter()
                    .flatten()
                    .any(|p| p.name.as_deref() == Some(port)),
                "{file}: the Service has port {port}"
            );
            assert_eq!(
                endpoint["interval"],
                *at(&values, "proxy.serviceMonitor.interval")
            );
            let labels = label_map(&monitor["metadata"]["labels"]);
            for (k, v) in label_map(at(&values, "proxy.serviceMonitor.labels")) {
                assert_eq!(labels.get(&k), Some(&v), "{file}");
            }
        }
    }
}
