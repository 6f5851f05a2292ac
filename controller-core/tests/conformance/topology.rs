//! The base topology of the conformance suite (`conformance/base/manifests.yaml`, as tabled in
//! `shared/gwapi/README.md`), with every pod played by an in-process echo server on its own
//! loopback address (the HTTP echo, or the gRPC echo for the `grpc-infra-backend-*`
//! Deployments), and the snapshot a case translates.

use std::net::{IpAddr, Ipv4Addr};

use anyhow::Context;
use cftunnel_controller_core::manifest;
use cftunnel_controller_core::translate::Snapshot;
use cftunnel_testkit::echo::{EchoIdentity, EchoServer};
use cftunnel_testkit::grpc_echo::GrpcEchoServer;
use serde_json::{json, Value};

use super::case::Case;

pub const INFRA: &str = "gateway-conformance-infra";
const APP: &str = "gateway-conformance-app-backend";
const WEB: &str = "gateway-conformance-web-backend";

/// The echo port a Service `targetPort` lands on: 3001 is echo-basic's h2c port.
const H2C_TARGET_PORT: i64 = 3001;

struct BaseService {
    namespace: &'static str,
    name: &'static str,
    /// The echo-basic mode of its pods: the gRPC echo (`GRPC_ECHO_SERVER` set) or HTTP.
    grpc: bool,
    replicas: u8,
    /// (port name, port, targetPort, appProtocol)
    ports: &'static [(Option<&'static str>, i64, i64, Option<&'static str>)],
}

const SINGLE_PORT: &[(Option<&str>, i64, i64, Option<&str>)] = &[(None, 8080, 3000, None)];
/// The gRPC echo's port, which the gateway must speak h2c to.
const GRPC_PORT: &[(Option<&str>, i64, i64, Option<&str>)] =
    &[(None, 8080, 3000, Some("kubernetes.io/h2c"))];

const BASE_SERVICES: &[BaseService] = &[
    BaseService {
        namespace: INFRA,
        name: "infra-backend-v1",
        grpc: false,
        replicas: 2,
        ports: &[
            (Some("first-port"), 8080, 3000, None),
            (Some("second-port"), 8081, 3001, Some("kubernetes.io/h2c")),
            (Some("third-port"), 8082, 3000, Some("kubernetes.io/ws")),
        ],
    },
    BaseService {
        namespace: INFRA,
        name: "infra-backend-v2",
        grpc: false,
        replicas: 2,
        ports: SINGLE_PORT,
    },
    BaseService {
        namespace: INFRA,
        name: "infra-backend-v3",
        grpc: false,
        replicas: 1,
        ports: SINGLE_PORT,
    },
    BaseService {
        namespace: APP,
        name: "app-backend-v1",
        grpc: false,
        replicas: 2,
        ports: SINGLE_PORT,
    },
    BaseService {
        namespace: APP,
        name: "app-backend-v2",
        grpc: false,
        replicas: 2,
        ports: SINGLE_PORT,
    },
    BaseService {
        namespace: WEB,
        name: "web-backend",
        grpc: false,
        replicas: 2,
        ports: SINGLE_PORT,
    },
    // Unlike infra-backend-v3, grpc-infra-backend-v3 has two replicas.
    BaseService {
        namespace: INFRA,
        name: "grpc-infra-backend-v1",
        grpc: true,
        replicas: 2,
        ports: GRPC_PORT,
    },
    BaseService {
        namespace: INFRA,
        name: "grpc-infra-backend-v2",
        grpc: true,
        replicas: 2,
        ports: GRPC_PORT,
    },
    BaseService {
        namespace: INFRA,
        name: "grpc-infra-backend-v3",
        grpc: true,
        replicas: 2,
        ports: GRPC_PORT,
    },
];

/// One echo server playing one pod of a Deployment.
pub struct Pod {
    pub namespace: &'static str,
    /// The Deployment (and Service) the pod belongs to.
    pub app: &'static str,
    pub name: String,
    pub ip: IpAddr,
    pub server: PodServer,
}

/// The echo a pod runs.
pub enum PodServer {
    Http(EchoServer),
    Grpc(GrpcEchoServer),
}

impl Pod {
    /// The HTTP echo, whose request log the mirror checks read; `None` for a gRPC pod.
    pub fn echo(&self) -> Option<&EchoServer> {
        match &self.server {
            PodServer::Http(echo) => Some(echo),
            PodServer::Grpc(_) => None,
        }
    }

    /// The port a Service `targetPort` lands on: 3001 is the HTTP echo's h2c port, any
    /// other its HTTP port; the gRPC echo has one port.
    fn port(&self, target: i64) -> u16 {
        match &self.server {
            PodServer::Http(echo) if target == H2C_TARGET_PORT => echo.h2c_addr().port(),
            PodServer::Http(echo) => echo.http_addr().port(),
            PodServer::Grpc(echo) => echo.addr().port(),
        }
    }
}

/// Every pod of the base topology, for one case.
pub struct Fleet {
    pub pods: Vec<Pod>,
}

impl Fleet {
    /// Starts one echo per pod on `127.<64 + slot>.<service>.<replica + 1>`.
    pub async fn spawn(slot: u8) -> anyhow::Result<Self> {
        let mut pods = Vec::new();
        for (s, svc) in BASE_SERVICES.iter().enumerate() {
            for r in 0..svc.replicas {
                let service_octet = u8::try_from(s).context("service index")?;
                let second = 64u8
                    .checked_add(slot)
                    .context("too many cases for the address plan")?;
                let ip = IpAddr::V4(Ipv4Addr::new(127, second, service_octet, r + 1));
                // Deployment pod naming: <deployment>-<replicaset hash>-<pod hash>.
                let name = format!("{}-5d8f7c9b4-{}x{}q{}", svc.name, "k7", s, r);
                let identity = EchoIdentity {
                    namespace: svc.namespace.to_owned(),
                    pod: name.clone(),
                };
                let server = if svc.grpc {
                    GrpcEchoServer::spawn(ip, identity)
                        .await
                        .map(PodServer::Grpc)
                } else {
                    EchoServer::spawn(ip, identity).await.map(PodServer::Http)
                }
                .with_context(|| format!("starting echo {name} on {ip}"))?;
                pods.push(Pod {
                    namespace: svc.namespace,
                    app: svc.name,
                    name,
                    ip,
                    server,
                });
            }
        }
        Ok(Self { pods })
    }

    /// The pods behind `<namespace>/<service>`.
    pub fn pods_of(&self, backend: &str) -> Vec<&Pod> {
        let (ns, svc) = backend.split_once('/').unwrap_or(("", backend));
        self.pods
            .iter()
            .filter(|p| p.namespace == ns && p.app == svc)
            .collect()
    }

    pub async fn shutdown(self) {
        for pod in self.pods {
            match pod.server {
                PodServer::Http(echo) => echo.shutdown().await,
                PodServer::Grpc(echo) => echo.shutdown().await,
            }
        }
    }
}

/// One EndpointSlice per pod: each echo listens on its own ports, and a slice's port numbers
/// are shared by all its endpoints.
fn pod_slices(
    namespace: &str,
    service: &str,
    ports: &[(Option<String>, i64)],
    pods: &[&Pod],
) -> Vec<Value> {
    pods.iter()
        .map(|pod| {
            let ports: Vec<Value> = ports
                .iter()
                .map(|(name, target)| {
                    json!({"name": name, "port": pod.port(*target), "protocol": "TCP"})
                })
                .collect();
            let suffix = pod.name.rsplit('-').next().unwrap_or("pod");
            json!({
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {
                    "name": format!("{service}-{suffix}"),
                    "namespace": namespace,
                    "labels": {"kubernetes.io/service-name": service},
                },
                "addressType": "IPv4",
                "ports": ports,
                "endpoints": [{
                    "addresses": [pod.ip.to_string()],
                    "conditions": {"ready": true},
                    "targetRef": {"kind": "Pod", "namespace": pod.namespace, "name": pod.name},
                }],
            })
        })
        .collect()
}

fn target_port(port: &Value) -> i64 {
    port.get("targetPort")
        .and_then(Value::as_i64)
        .or_else(|| port.get("port").and_then(Value::as_i64))
        .unwrap_or(0)
}

/// Names objects are created with, in creation order.
const EPOCH: &str = "2026-01-01T00:00:";

/// The snapshot of a case: base objects, the case's Gateways (each with its own data plane,
/// since the suite gives every Gateway its own address), routes and extra objects.
pub fn snapshot<R>(
    case: &Case<R>,
    fleet: &Fleet,
    class: &str,
    controller: &str,
    deleted: &[(String, String, String)],
) -> anyhow::Result<Snapshot> {
    let mut items: Vec<Value> = vec![json!({
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "GatewayClass",
        "metadata": {"name": class},
        "spec": {"controllerName": controller},
    })];
    for (ns, role) in [(INFRA, "infra"), (APP, "backend"), (WEB, "backend")] {
        items.push(json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": ns, "labels": {"gateway-conformance": role}},
        }));
    }
    for svc in BASE_SERVICES {
        let ports: Vec<Value> = svc
            .ports
            .iter()
            .map(|(name, port, target, app)| {
                json!({"name": name, "port": port, "targetPort": target, "appProtocol": app, "protocol": "TCP"})
            })
            .collect();
        items.push(json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": svc.name, "namespace": svc.namespace},
            "spec": {"selector": {"app": svc.name}, "ports": ports},
        }));
        let slice_ports: Vec<(Option<String>, i64)> = svc
            .ports
            .iter()
            .map(|(name, _, target, _)| (name.map(str::to_owned), *target))
            .collect();
        items.extend(pod_slices(
            svc.namespace,
            svc.name,
            &slice_ports,
            &fleet.pods_of(&format!("{}/{}", svc.namespace, svc.name)),
        ));
    }
    for (i, gw) in case.gateway.iter().enumerate() {
        let listeners = serde_json::to_value(&gw.listeners)?;
        items.push(json!({
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "Gateway",
            "metadata": {"name": gw.name, "namespace": gw.namespace, "creationTimestamp": format!("{EPOCH}{i:02}Z")},
            "spec": {
                "gatewayClassName": class,
                "infrastructure": {"parametersRef": {"group": "cf.k8s.lex.la", "kind": "GatewayConfig", "name": gw.name}},
                "listeners": listeners,
            },
        }));
        // Each Gateway's own data plane, as an operator sets one up: its GatewayConfig and the
        // Secret with its tunnel's connector token.
        let token = cftunnel_config::Token::new(
            "conformance",
            gw.name.as_bytes().to_vec(),
            uuid::Uuid::from_u128(i as u128 + 1),
        )
        .encode();
        items.push(json!({
            "apiVersion": "cf.k8s.lex.la/v1alpha1",
            "kind": "GatewayConfig",
            "metadata": {"name": gw.name, "namespace": gw.namespace},
            "spec": {"tunnelTokenSecretRef": {"name": format!("{}-tunnel", gw.name)}},
        }));
        items.push(json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": format!("{}-tunnel", gw.name), "namespace": gw.namespace},
            "stringData": {"tunnel-token": token},
        }));
    }
    for (i, route) in case.routes.iter().enumerate() {
        let mut route = serde_json::to_value(route)?;
        if let Some(meta) = route.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.insert(
                "creationTimestamp".to_owned(),
                json!(format!("{EPOCH}{:02}Z", i + 10)),
            );
        }
        items.push(route);
    }
    let infra_v1 = fleet.pods_of(&format!("{INFRA}/infra-backend-v1"));
    for object in &case.extra_objects {
        let object = serde_json::to_value(object)?;
        let kind = object
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let ns = object
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let name = object
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if deleted
            .iter()
            .any(|(k, n, m)| k == kind && n == ns && m == name)
        {
            continue;
        }
        match kind {
            // A Service selecting a base Deployment gets that Deployment's endpoints.
            "Service" => {
                if let Some(app) = object.pointer("/spec/selector/app").and_then(Value::as_str) {
                    let ports: Vec<(Option<String>, i64)> = object
                        .pointer("/spec/ports")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                        .map(|p| {
                            (
                                p.get("name").and_then(Value::as_str).map(str::to_owned),
                                target_port(p),
                            )
                        })
                        .collect();
                    let pods: Vec<&Pod> = fleet.pods.iter().filter(|p| p.app == app).collect();
                    items.extend(pod_slices(ns, name, &ports, &pods));
                }
                items.push(object);
            }
            // Manual IPv4 EndpointSlices are filled by the Go test with infra-backend-v1's pod
            // addresses; here they become one slice per infra-backend-v1 pod.
            "EndpointSlice"
                if object.get("addressType").and_then(Value::as_str) == Some("IPv4")
                    && object.get("endpoints").is_none() =>
            {
                let service = object
                    .pointer("/metadata/labels/kubernetes.io~1service-name")
                    .and_then(Value::as_str)
                    .unwrap_or(name);
                let ports: Vec<(Option<String>, i64)> = object
                    .get("ports")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .map(|p| {
                        (
                            p.get("name").and_then(Value::as_str).map(str::to_owned),
                            p.get("port").and_then(Value::as_i64).unwrap_or(0),
                        )
                    })
                    .collect();
                items.extend(pod_slices(ns, service, &ports, &infra_v1));
            }
            _ => items.push(object),
        }
    }
    let list = json!({"apiVersion": "v1", "kind": "List", "items": items});
    let mut snapshot = Snapshot::default();
    manifest::load_into(&mut snapshot, &serde_json::to_string(&list)?, &case.name)?;
    Ok(snapshot)
}
