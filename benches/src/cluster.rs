//! A synthetic cluster for the controller's benchmarks: many tenants, each with its own
//! namespace, Gateway and routes, all on the shared data plane.

use cftunnel_controller_core::snapshot::Snapshot;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use std::sync::Arc;

/// `gateways` tenants, each a namespace `t<g>` holding Gateway `gw` (an HTTP and an HTTPS
/// listener for `*.t<g>.example.com`, routes from the same namespace) and `routes` HTTPRoutes
/// `r<k>` for `r<k>.t<g>.example.com`, each to its own Service `s<k>` with two ready endpoints.
/// Every route has one rule with a prefix match; one in five also matches a header, one in ten
/// has a second, regex path match. Listeners of both schemes on every host make each rule
/// carry the scheme check, as a cluster that serves HTTP and HTTPS does.
pub fn snapshot(gateways: usize, routes: usize) -> Snapshot {
    let mut snapshot = Snapshot {
        gateway_classes: vec![object(json!({
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "GatewayClass",
            "metadata": {"name": "cf"},
            "spec": {"controllerName": "cf.k8s.lex.la/tunnel-controller"}
        }))],
        custom_resource_definitions: Some(Vec::new()),
        ..Snapshot::default()
    };
    for g in 0..gateways {
        let ns = format!("t{g}");
        let domain = format!("*.t{g}.example.com");
        snapshot.namespaces.push(object(json!({
            "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}
        })));
        let listener = |name: &str, protocol: &str, port: u16| {
            json!({"name": name, "protocol": protocol, "port": port, "hostname": domain,
                   "allowedRoutes": {"namespaces": {"from": "Same"}}})
        };
        snapshot.gateways.push(object(json!({
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "Gateway",
            "metadata": {"name": "gw", "namespace": ns},
            "spec": {
                "gatewayClassName": "cf",
                "listeners": [listener("http", "HTTP", 80), listener("https", "HTTPS", 443)]
            }
        })));
        for k in 0..routes {
            let service = format!("s{k}");
            let mut matches =
                vec![json!({"path": {"type": "PathPrefix", "value": format!("/api{k}")}})];
            if k % 5 == 1 {
                matches[0]["headers"] = json!([{"name": "x-version", "value": "v2"}]);
            }
            if k % 10 == 9 {
                matches.push(json!({"path": {"type": "RegularExpression", "value": format!("/v[0-9]+/r{k}/.*")}}));
            }
            snapshot.http_routes.push(object(json!({
                "apiVersion": "gateway.networking.k8s.io/v1",
                "kind": "HTTPRoute",
                "metadata": {"name": format!("r{k}"), "namespace": ns},
                "spec": {
                    "parentRefs": [{"name": "gw"}],
                    "hostnames": [format!("r{k}.t{g}.example.com")],
                    "rules": [{
                        "matches": matches,
                        "backendRefs": [{"name": service, "port": 8080}]
                    }]
                }
            })));
            snapshot.services.push(object(json!({
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": service, "namespace": ns},
                "spec": {"ports": [{"name": "http", "port": 8080, "targetPort": 3000}]}
            })));
            let ip = |n: usize| format!("10.{}.{}.{}", g % 250, k % 250, n);
            snapshot.endpoint_slices.push(object(json!({
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {"name": format!("{service}-a"), "namespace": ns,
                             "labels": {"kubernetes.io/service-name": service}},
                "addressType": "IPv4",
                "ports": [{"name": "http", "port": 3000}],
                "endpoints": [{"addresses": [ip(1)]}, {"addresses": [ip(2)], "conditions": {"ready": true}}]
            })));
        }
    }
    snapshot
}

/// `value` as a typed object.
///
/// # Panics
/// When the fixture writes an object that does not match its schema: a bug in the fixture.
fn object<T: DeserializeOwned>(value: Value) -> Arc<T> {
    Arc::new(serde_json::from_value(value).expect("fixture objects match their schema"))
}
