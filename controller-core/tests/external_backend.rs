//! ExternalBackends end to end: an ExternalBackend with a base path and a query is translated,
//! the document applied to an in-process proxy, and requests go through it over real sockets
//! to an echo backend on loopback. Under `--external-name-backends=any` the backend gets the
//! base path before the request's path and the ExternalBackend's query parameters beside the
//! request's (which win a name both use); under `external`, the default, the loopback address
//! is refused by the controller, by the rule the proxy dials by, and the proxy answers 500
//! without dialling it.

use std::net::SocketAddr;
use std::time::Duration;

use cftunnel_controller_core::manifest;
use cftunnel_controller_core::translate::{
    self, ConditionType, ExternalNameBackends, ObjectKey, Options, PlaneKey, Reason, RouteKey,
    RouteKind, Snapshot,
};
use cftunnel_proxy::{Server, ServerOptions};
use cftunnel_testkit::echo::{EchoConfig, EchoIdentity, EchoServer};

fn manifests(backend: SocketAddr) -> String {
    manifests_at(&backend.ip().to_string(), backend.port())
}

/// The manifests with the ExternalBackend at `host` (an IPv6 address bracketed) and `port`.
fn manifests_at(host: &str, port: u16) -> String {
    format!(
        r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {{name: cf}}
spec: {{controllerName: cf.k8s.lex.la/tunnel-controller}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: edge, namespace: shop}}
spec:
  gatewayClassName: cf
  listeners: [{{name: http, port: 80, protocol: HTTP}}]
---
apiVersion: cf.k8s.lex.la/v1alpha1
kind: ExternalBackend
metadata: {{name: legacy, namespace: shop}}
spec: {{scheme: http, host: "{ip}", port: {port}, path: "/v1?token=abc&region=eu"}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: shop, namespace: shop}}
spec:
  parentRefs: [{{name: edge}}]
  rules: [{{backendRefs: [{{group: cf.k8s.lex.la, kind: ExternalBackend, name: legacy}}]}}]
"#,
        ip = host,
    )
}

/// The shared plane's document and the route's `ResolvedRefs` (status, reason, message).
fn translated(
    manifests: &str,
    mode: ExternalNameBackends,
) -> (cftunnel_config::Config, (bool, Reason, String)) {
    translated_with(
        manifests,
        &Options {
            external_name_backends: mode,
            ..Options::default()
        },
    )
}

/// [`translated`] under `options`.
fn translated_with(
    manifests: &str,
    options: &Options,
) -> (cftunnel_config::Config, (bool, Reason, String)) {
    let mut snapshot = Snapshot::default();
    manifest::load_into(&mut snapshot, manifests, "external-backend.yaml").expect("parses");
    let output = translate::translate(&snapshot, options);
    let parents = &output.statuses.routes[&RouteKey {
        kind: RouteKind::Http,
        key: ObjectKey::new("shop", "shop"),
    }];
    let resolved = parents[0]
        .condition(ConditionType::ResolvedRefs)
        .expect("ResolvedRefs");
    (
        output.configs[&PlaneKey::Shared].clone(),
        (resolved.status, resolved.reason, resolved.message.clone()),
    )
}

async fn get(proxy: SocketAddr, path: &str) -> (u16, serde_json::Value) {
    cftunnel_testkit::client::get_json(proxy, "shop.example.com", path).await
}

#[tokio::test]
async fn an_external_backend_gets_its_base_path_and_query_and_is_dialled_only_where_admitted() {
    tokio::time::timeout(Duration::from_secs(20), async {
        let echo = EchoServer::start(EchoConfig {
            http_addr: "127.0.0.1:0".parse().expect("address"),
            h2c_addr: "127.0.0.1:0".parse().expect("address"),
            identity: EchoIdentity {
                namespace: "legacy".to_owned(),
                pod: "legacy-1".to_owned(),
            },
            record_log: true,
            print_log: false,
        })
        .await
        .expect("echo starts");
        let manifests = manifests(echo.http_addr());

        let (config, (status, reason, message)) = translated(&manifests, ExternalNameBackends::Any);
        assert_eq!((status, reason), (true, Reason::ResolvedRefs), "{message}");
        let proxy = Server::start(ServerOptions::default(), Some(config))
            .await
            .expect("the proxy starts with the translated document");
        let (status, body) = get(proxy.data_addr(), "/orders?q=1").await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(echo.count_echoed("/v1/orders?q=1&token=abc&region=eu"), 1);
        // The request's own parameter wins the name both use.
        let (status, _) = get(proxy.data_addr(), "/orders?token=mine").await;
        assert_eq!(status, 200);
        assert_eq!(echo.count_echoed("/v1/orders?token=mine&region=eu"), 1);
        let (status, _) = get(proxy.data_addr(), "/").await;
        assert_eq!(status, 200);
        assert_eq!(echo.count_echoed("/v1/?token=abc&region=eu"), 1);

        // `external`: the loopback address is not public. The controller refuses it by the
        // rule the proxy dials by, saying so on the route, and the proxy answers 500 for it
        // without dialling.
        let before = echo.log_lines().len();
        let (config, (status, reason, message)) =
            translated(&manifests, ExternalNameBackends::External);
        assert_eq!((status, reason), (false, Reason::InvalidKind), "{message}");
        assert!(
            message.contains(&format!(
                "ExternalBackend shop/legacy is refused: spec.host \"{}\" is an IP address \
                 that is not public",
                echo.http_addr().ip()
            )),
            "{message}"
        );
        let refusing = Server::start(ServerOptions::default(), Some(config))
            .await
            .expect("the proxy starts");
        let (status, _) = get(refusing.data_addr(), "/orders").await;
        assert_eq!(status, 500, "refused, not proxied");
        assert_eq!(echo.log_lines().len(), before, "the backend saw nothing");
    })
    .await
    .expect("in time");
}

/// Under `external`, an ExternalBackend whose host is a public address of one of the cluster's
/// own ranges (`--cluster-cidrs`: here GKE's Google-managed Service range, and an IPv6 pod
/// range) is refused, naming the range, in any form that reaches it; with no range listed, or
/// outside them, it is admitted and dialled `publicOnly`.
#[test]
fn an_external_backend_in_the_clusters_own_ranges_is_refused() {
    let ranges = "34.118.224.0/20,2600:1f14:abc::/56";
    let options = |ranges: &str| Options {
        external_name_backends: ExternalNameBackends::External,
        cluster_ranges: ranges.parse().expect("ranges parse"),
        ..Options::default()
    };
    for (host, range) in [
        ("34.118.224.10", "34.118.224.0/20"),
        ("::ffff:34.118.230.1", "34.118.224.0/20"),
        ("2600:1f14:abc:12::7", "2600:1f14:abc::/56"),
    ] {
        let written = match host.parse().expect("address") {
            std::net::IpAddr::V6(_) => format!("[{host}]"),
            std::net::IpAddr::V4(_) => host.to_owned(),
        };
        let manifests = manifests_at(&written, 80);
        let (config, (status, reason, message)) = translated_with(&manifests, &options(ranges));
        assert_eq!(
            (status, reason),
            (false, Reason::InvalidKind),
            "{host}: {message}"
        );
        assert!(
            message.contains(&format!(
                "ExternalBackend shop/legacy is refused: spec.host \"{host}\" is an IP address \
                 in {range}, one of the cluster's own address ranges (--cluster-cidrs)"
            )),
            "{host}: {message}"
        );
        assert!(
            !serde_json::to_string(&config)
                .expect("json")
                .contains("publicOnly\":true"),
            "{host}: no backend is emitted for it"
        );

        let (config, (status, reason, message)) = translated_with(&manifests, &options(""));
        assert_eq!(
            (status, reason),
            (true, Reason::ResolvedRefs),
            "{host}: {message}"
        );
        assert!(
            serde_json::to_string(&config)
                .expect("json")
                .contains("publicOnly\":true"),
            "{host}: admitted, dialled publicOnly"
        );
    }
    let outside = manifests("34.118.240.1:80".parse().expect("address"));
    let (_, (status, _, message)) = translated_with(&outside, &options(ranges));
    assert!(status, "outside every range: {message}");
}
