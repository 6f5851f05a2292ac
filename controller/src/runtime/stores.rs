//! Watch caches of every kind the controller reads, and one signal that any of them changed.
//!
//! CustomResourceDefinitions are watched by metadata only (their schemas are large and unread),
//! and only Gateway API's are kept.
//!
//! The Pods of the rendered planes are watched too, their state only, and may be refused (an
//! older ClusterRole): nothing waits for them, and their changes start no round.
//!
//! ReferenceGrant, ListenerSet and ServiceImport are read where and as the API server serves
//! them, which may change while the controller runs ([`optional_apis`](super::optional_apis)):
//! the CRD watch tells their watches when one of their CRDs changes.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{future, FutureExt, Stream, StreamExt, TryStreamExt};
use gateway_api::backendtlspolicies::BackendTlsPolicy;
use gateway_api::experimental::gatewayclasses::{GatewayClass, GatewayClassStatus};
use gateway_api::experimental::gateways::Gateway;
use gateway_api::experimental::grpcroutes::GrpcRoute;
use gateway_api::experimental::httproutes::HttpRoute;
use gateway_api::experimental::listenersets::ListenerSet;
use gateway_api::experimental::referencegrants::ReferenceGrant;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::core::{ApiResource, DynamicObject, PartialObjectMeta};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, Resource};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use serde::de::DeserializeOwned;
use tokio::sync::{watch as signal, Notify};
use tokio::task::JoinSet;

use crate::access_policy::AccessPolicy;
use crate::external_backend::ExternalBackend;
use crate::gateway_class_config::GatewayClassConfig;
use crate::gateway_config::GatewayConfig;
use crate::service_import::ServiceImport;
use crate::translate::bundle_version::{is_gateway_api_crd, CRD_ACCESS};
use crate::translate::{ObjectKey, RouteKey, RouteKind, Snapshot};

use super::health::{Health, WatchLabel};
use super::optional_apis::{self, readable, ApiDiscovery, CrdTriggers, Noted, Served, Unreadable};

/// How long the Gateway API CRDs' first list may lag the other caches' before the controller
/// reconciles without it. It feeds only GatewayClass `SupportedVersion` and needs an RBAC rule
/// an older ClusterRole lacks, so it must gate nothing for long; waiting a little keeps the
/// first status written from saying False only because that list came a moment late.
pub const CRD_WAIT: Duration = Duration::from_secs(5);

/// How long the first list of an optional kind (BackendTLSPolicy, ExternalBackend,
/// GatewayClassConfig, ServiceImport, AccessPolicy) is waited for, past `crd_wait`, while its
/// watch fails but not because the kind is absent (not served, or not permitted): a 5xx or a
/// 429 that kube's backoff retries. An empty cache reads as "none exist", and a round on it
/// would push configs without the kind (rules an AccessPolicy protects answering 500), so the
/// controller stays unready (and the elector unstarted) meanwhile; past this it goes on
/// without the kind, as a cluster must not be left with no controller for good.
pub const LATE_LIST_CAP: Duration = Duration::from_secs(120);

/// The label every rendered object carries, and the pods of rendered Deployments; only such
/// Deployments, NetworkPolicies and autoscalers are watched.
pub const MANAGED_BY_SELECTOR: &str = "app.kubernetes.io/managed-by=cftunnel-controller";

/// The proxy pods, of rendered planes and of the chart's shared pool alike
/// ([`crate::render::PROXY_POD_LABEL`]); only they are watched of Pods.
fn proxy_pods_selector() -> String {
    let (name, value) = crate::render::PROXY_POD_LABEL;
    format!("{name}={value}")
}

/// The RBAC rule the Pod watch needs, named when it is refused: a ClusterRole from before the
/// controller read its planes' pods lacks it.
pub const POD_ACCESS: &str = "list and watch on pods (API group \"\")";

/// Secrets of every type but Helm's release records, which no Gateway, GatewayConfig or
/// policy names and which hold a release's whole manifest each (up to 1 MiB, one per
/// revision): in a cluster of Helm releases most of the Secrets' bytes.
pub const NOT_HELM_RELEASES: &str = "type!=helm.sh/release.v1";

/// A route this build cannot read (see [`Stores::unreadable_routes`]).
#[derive(Debug, Clone)]
pub struct UnreadableRoute {
    pub key: RouteKey,
    pub noted: Noted,
}

/// Read-only views of the watch caches.
#[derive(Clone)]
pub struct Stores {
    pub gateway_classes: Store<GatewayClass>,
    pub gateways: Store<Gateway>,
    pub http_routes: Store<HttpRoute>,
    pub grpc_routes: Store<GrpcRoute>,
    /// The routes left out of `http_routes` and `grpc_routes` because this build cannot read
    /// them: their status says so, rather than what it said before they changed.
    pub unreadable_http_routes: Arc<Unreadable>,
    pub unreadable_grpc_routes: Arc<Unreadable>,
    pub reference_grants: Store<ReferenceGrant>,
    /// ListenerSets, of whichever kind is served ([`optional_apis::LISTENER_SETS`]).
    pub listener_sets: Store<ListenerSet>,
    /// The resource `listener_sets` holds the objects of: where their statuses are written.
    pub listener_set_resource: Served,
    /// Served from Gateway API v1.4 on: its first list gates rounds for [`CRD_WAIT`], then
    /// only while its watch has not shown it absent ([`LATE_LIST_CAP`]), so a cluster whose CRDs
    /// predate it (or an RBAC rule missing for it) does not keep the controller from serving.
    pub backend_tls_policies: Store<BackendTlsPolicy>,
    /// For the CA certificates BackendTLSPolicies name.
    pub config_maps: Store<ConfigMap>,
    pub namespaces: Store<Namespace>,
    pub services: Store<Service>,
    pub endpoint_slices: Store<EndpointSlice>,
    pub gateway_configs: Store<GatewayConfig>,
    /// The GatewayConfigs left out of `gateway_configs` because this build cannot read them:
    /// a Gateway naming one is told why.
    pub unreadable_gateway_configs: Arc<Unreadable>,
    /// Gateways this build cannot read: they exist all the same.
    pub unreadable_gateways: Arc<Unreadable>,
    /// Gates readiness as BackendTLSPolicies do, as a cluster upgraded without its CRD has none.
    pub gateway_class_configs: Store<GatewayClassConfig>,
    /// Empty where the API server does not serve ServiceImport
    /// ([`optional_apis::SERVICE_IMPORTS`]); `service_imports_served` tells that apart from
    /// none existing.
    pub service_imports: Store<ServiceImport>,
    pub service_imports_served: Served,
    /// The AccessPolicies route rules name; gates readiness as BackendTLSPolicies do, as a
    /// cluster upgraded without its CRD has none to list.
    pub access_policies: Store<AccessPolicy>,
    /// The ExternalBackends routes name; gates readiness as AccessPolicies do.
    pub external_backends: Store<ExternalBackend>,
    pub secrets: Store<Secret>,
    /// The rendered proxy Deployments (their ready replicas gate `Programmed`; one deleted or
    /// edited away from its render is put back at once).
    pub deployments: Store<Deployment>,
    /// The shared pool's Deployment (the chart's, so no label selects it), when the controller
    /// points it at the class tunnel's token: a `helm upgrade` that writes the chart's token
    /// back starts a round that points it again.
    pub pool: Option<Store<Deployment>>,
    /// The pods of the rendered Deployments, their specs left out: their state tells why a
    /// plane whose pods are all down takes no config ([`super::pod_states`]). Gates nothing:
    /// empty while the Pod list is refused (an older ClusterRole), and the push failures are
    /// then reported without it. Nor does a change of it start a round.
    pub pods: Store<Pod>,
    /// The rendered NetworkPolicies (likewise put back).
    pub network_policies: Store<NetworkPolicy>,
    /// The rendered autoscalers (likewise put back).
    pub autoscalers: Store<HorizontalPodAutoscaler>,
    /// Gateway API's CustomResourceDefinitions, metadata only (their bundle versions).
    pub gateway_api_crds: Store<PartialObjectMeta<CustomResourceDefinition>>,
    /// The kinds whose watch last failed as absent: not served (404) or not permitted (403).
    absent: signal::Receiver<BTreeSet<String>>,
}

/// What every cache's task reports to.
struct Shared {
    /// Notified on each event of every cache that wakes rounds ([`Wakes::Rounds`]), including
    /// the first list.
    changed: Arc<Notify>,
    /// Failed attempts of each kind's watch (`/metrics`).
    failures: Family<WatchLabel, Counter>,
    /// The kinds whose watch last failed as absent.
    absent: Arc<signal::Sender<BTreeSet<String>>>,
}

/// Whether a watch failed because its kind is absent: not served (404, no such resource or
/// CRD) or not permitted (403, an RBAC rule missing). Any other failure (a 5xx, a 429, a
/// timeout) says nothing of whether objects exist.
fn failed_as_absent(e: &watcher::Error) -> bool {
    matches!(failure_code(e), Some(404 | 403))
}

/// The status the API server answered a failed watch with, if it answered.
fn failure_code(e: &watcher::Error) -> Option<u16> {
    match e {
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status))
        | watcher::Error::WatchFailed(kube::Error::Api(status)) => Some(status.code),
        watcher::Error::WatchError(status) => Some(status.code),
        _ => None,
    }
}

/// How a cache's failed watch is logged.
#[derive(Debug, Clone, Copy)]
enum Logged {
    /// Every failed attempt, as a warning.
    Each,
    /// Every failed attempt, but a refusal (403) only once while it lasts, naming the RBAC
    /// rule (`needs`) and what goes without it (`meanwhile`): a kind an older ClusterRole may
    /// lack, whose refusal is expected there and would otherwise be logged at each retry for
    /// good.
    RefusalOnce {
        needs: &'static str,
        meanwhile: &'static str,
    },
}

/// Whether a cache's events start a round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wakes {
    /// Each one notifies [`Shared::changed`].
    Rounds,
    /// None does: a cache that only words what rounds report, read by the rounds something
    /// else starts. The Pods': the kubelet updates a pod's status at each step of its start
    /// and each retry of a failing container, and a plane whose push fails already has rounds
    /// retrying it ([`super::schedule`]).
    Nothing,
}

/// A GatewayClass watch event, each class with what this build can read of its status: a field
/// of the status it cannot read (`supportedFeatures` as plain names, as Gateway API v1.1 wrote
/// them, or another implementation's values) is left out, rather than the class, as
/// [`readable`] leaves out an object it cannot read. A class left out is taken for deleted, and
/// after a while the planes of its Gateways go with it; yet all the controller reads of a class
/// is its spec, and it writes the status of its own classes whole, over what it left out.
fn class_status_readable(class: &mut DynamicObject) {
    let Some(status) = class.data.get("status") else {
        return;
    };
    if serde_json::from_value::<GatewayClassStatus>(status.clone()).is_ok() {
        return;
    }
    let mut left_out = Vec::new();
    match class.data.get_mut("status").and_then(|s| s.as_object_mut()) {
        Some(fields) => fields.retain(|field, value| {
            let one = serde_json::json!({ field.as_str(): value });
            let reads = serde_json::from_value::<GatewayClassStatus>(one).is_ok();
            if !reads {
                left_out.push(field.clone());
            }
            reads
        }),
        None => {
            if let Some(data) = class.data.as_object_mut() {
                data.remove("status");
            }
            left_out.push("status".to_owned());
        }
    }
    tracing::info!(
        class = class.metadata.name.as_deref().unwrap_or_default(),
        fields = ?left_out,
        "GatewayClass status fields unreadable by this build; the class is read without them"
    );
}

/// The rendered NetworkPolicies and autoscalers there are now, by namespace and name.
#[derive(Debug, Default)]
pub struct PlaneObjects {
    network_policies: BTreeMap<(String, String), Arc<NetworkPolicy>>,
    autoscalers: BTreeMap<(String, String), Arc<HorizontalPodAutoscaler>>,
}

impl PlaneObjects {
    pub fn network_policy(&self, namespace: &str, name: &str) -> Option<&NetworkPolicy> {
        self.network_policies
            .get(&(namespace.to_owned(), name.to_owned()))
            .map(|p| &**p)
    }

    pub fn autoscaler(&self, namespace: &str, name: &str) -> Option<&HorizontalPodAutoscaler> {
        self.autoscalers
            .get(&(namespace.to_owned(), name.to_owned()))
            .map(|a| &**a)
    }
}

/// What a cache keeps of its objects' metadata.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kept {
    /// All but the fields the API server keeps of each writer: often the bulk of an object,
    /// and read by nothing but the apply of the controller's own objects.
    Read,
    /// Everything, managed fields included: the objects the controller applies, whose
    /// `spec.replicas` owner is read from them.
    Applied,
}

impl Stores {
    /// Starts a watch per kind, the optional APIs' at what `discovery` finds served
    /// ([`optional_apis`]); each event, including the first list, notifies `changed` (but the
    /// Pods', which start no round), and each failed attempt of a watch counts in `health`'s
    /// watch failures. The tasks stop when `tasks` is dropped.
    pub fn start(
        client: &Client,
        discovery: ApiDiscovery,
        pool: Option<&ObjectKey>,
        changed: Arc<Notify>,
        health: &Health,
        tasks: &mut JoinSet<()>,
    ) -> Self {
        fn watch<K>(
            api: Api<K>,
            config: watcher::Config,
            kept: Kept,
            shared: &Shared,
            tasks: &mut JoinSet<()>,
        ) -> Store<K>
        where
            K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
            K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
        {
            cache(watcher(api, config), kept, shared, tasks)
        }
        /// [`watch`] of a kind tenants write, read object by object: one object this build
        /// cannot read (a value its types do not know, from a newer bundle than it was
        /// generated from, or a number past its field's range that the API server stored) is
        /// left out, logged, instead of failing the list and the watch of every object of the
        /// kind (each tenant's routes or data planes would stop being seen, and a restarted
        /// controller would wait for the first list for ever).
        fn watch_each<K>(
            client: &Client,
            config: watcher::Config,
            unreadable: Arc<Unreadable>,
            shared: &Shared,
            tasks: &mut JoinSet<()>,
        ) -> Store<K>
        where
            K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Default + Debug,
            K: Send + Sync + 'static,
        {
            let events = readable_events(client, config, unreadable, |_| {});
            cache(events, Kept::Read, shared, tasks)
        }
        /// The events of `K` as [`watch_each`] reads them, each object passed through `prepare`
        /// as it comes, before it is read as a `K`.
        fn readable_events<K>(
            client: &Client,
            config: watcher::Config,
            unreadable: Arc<Unreadable>,
            prepare: impl FnMut(&mut DynamicObject) + Send + 'static,
        ) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static
        where
            K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Default + Debug,
            K: Send + Sync + 'static,
        {
            let resource = ApiResource::erase::<K>(&());
            let api = Api::<DynamicObject>::all_with(client.clone(), &resource);
            watcher(api, config)
                .modify(prepare)
                .try_filter_map(move |event| future::ready(Ok(readable(event, &unreadable))))
        }
        /// Caches `events`, keeping what `kept` says of them (retrying a failed watch with
        /// backoff, each failure counted, noted as absent or not, and logged).
        fn cache<K>(
            events: impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
            kept: Kept,
            shared: &Shared,
            tasks: &mut JoinSet<()>,
        ) -> Store<K>
        where
            K: Resource + Clone + Debug + Send + Sync + 'static,
            K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
        {
            cache_logged(events, kept, Logged::Each, Wakes::Rounds, shared, tasks)
        }
        /// [`cache`], its failures logged as `logged` says, its events starting rounds as
        /// `wakes` says.
        fn cache_logged<K>(
            events: impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
            kept: Kept,
            logged: Logged,
            wakes: Wakes,
            shared: &Shared,
            tasks: &mut JoinSet<()>,
        ) -> Store<K>
        where
            K: Resource + Clone + Debug + Send + Sync + 'static,
            K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
        {
            let (store, writer) = reflector::store();
            let kind = K::kind(&K::DynamicType::default()).into_owned();
            let failures = shared
                .failures
                .get_or_create(&WatchLabel { kind: kind.clone() })
                .clone();
            let absent = Arc::clone(&shared.absent);
            let changed = Arc::clone(&shared.changed);
            let stream = events
                .modify(move |object: &mut K| {
                    if kept == Kept::Read {
                        object.meta_mut().managed_fields = None;
                    }
                })
                .default_backoff()
                .reflect(writer);
            tasks.spawn(async move {
                let mut stream = std::pin::pin!(stream);
                // A refusal logged, while it lasts (`Logged::RefusalOnce`).
                let mut refused = false;
                while let Some(event) = stream.next().await {
                    match event {
                        // A failed watch changes nothing in the cache: no round for it.
                        Err(e) => {
                            failures.inc();
                            let is_absent = failed_as_absent(&e);
                            absent.send_if_modified(|kinds| {
                                if is_absent {
                                    kinds.insert(kind.clone())
                                } else {
                                    kinds.remove(&kind)
                                }
                            });
                            match logged {
                                Logged::RefusalOnce { needs, meanwhile }
                                    if failure_code(&e) == Some(403) =>
                                {
                                    if !refused {
                                        tracing::warn!(
                                            kind,
                                            needs,
                                            error = %e,
                                            "watch not permitted; retrying without logging \
                                             each refusal (the controller's RBAC must grant \
                                             `needs`): {meanwhile}"
                                        );
                                    }
                                    refused = true;
                                }
                                _ => tracing::warn!(kind, error = %e, "watch failed; retrying"),
                            }
                        }
                        Ok(_) => {
                            if std::mem::take(&mut refused) {
                                tracing::info!(kind, "watch permitted now");
                            }
                            if wakes == Wakes::Rounds {
                                changed.notify_one();
                            }
                        }
                    }
                }
            });
            store
        }
        let (absent, absent_kinds) = signal::channel(BTreeSet::new());
        let shared = Shared {
            changed,
            failures: health.watch_failures.clone(),
            absent: Arc::new(absent),
        };
        let all = watcher::Config::default;
        let mut triggers = CrdTriggers::default();
        let (reference_grants, _) = optional_apis::watch(
            client,
            &optional_apis::REFERENCE_GRANTS,
            discovery,
            &mut triggers,
        );
        let (listener_sets, listener_set_resource) = optional_apis::watch(
            client,
            &optional_apis::LISTENER_SETS,
            discovery,
            &mut triggers,
        );
        let (service_imports, service_imports_served) = optional_apis::watch(
            client,
            &optional_apis::SERVICE_IMPORTS,
            discovery,
            &mut triggers,
        );
        // No selector can pick a CRD's group on the server (CRDs take field selectors on their
        // name only, and Gateway API's carry no common label): filtered here, once the optional
        // APIs are told of changes to theirs.
        let crds = watcher(Api::all(client.clone()), all())
            .inspect_ok(move |event| triggers.crd_event(event))
            .try_filter(|event| {
                let keep = |crd: &PartialObjectMeta<CustomResourceDefinition>| {
                    crd.metadata.name.as_deref().is_some_and(is_gateway_api_crd)
                };
                future::ready(match event {
                    watcher::Event::Apply(o)
                    | watcher::Event::Delete(o)
                    | watcher::Event::InitApply(o) => keep(o),
                    watcher::Event::Init | watcher::Event::InitDone => true,
                })
            });
        // Read as [`watch_each`] reads, each class with the status it can read.
        let gateway_classes = {
            let unreadable = Arc::default();
            let events =
                readable_events::<GatewayClass>(client, all(), unreadable, class_status_readable);
            cache(events, Kept::Read, &shared, tasks)
        };
        // Read as [`watch_each`] reads (a pod this build cannot read is left out, not every
        // plane's), without their specs: only their state is read, and a pod's spec is most of
        // it.
        let pods = {
            let selector = proxy_pods_selector();
            let events =
                readable_events::<Pod>(client, all().labels(&selector), Arc::default(), |pod| {
                    if let Some(data) = pod.data.as_object_mut() {
                        data.remove("spec");
                    }
                });
            let logged = Logged::RefusalOnce {
                needs: POD_ACCESS,
                meanwhile: "a plane whose pods are all down is reported without what their \
                            state says, and while they are still starting too",
            };
            cache_logged(events, Kept::Read, logged, Wakes::Nothing, &shared, tasks)
        };
        let unreadable_gateway_configs = Arc::new(Unreadable::default());
        let unreadable_gateways = Arc::new(Unreadable::default());
        let unreadable_http_routes = Arc::new(Unreadable::keeping_status());
        let unreadable_grpc_routes = Arc::new(Unreadable::keeping_status());
        Self {
            gateway_classes,
            gateways: watch_each(
                client,
                all(),
                Arc::clone(&unreadable_gateways),
                &shared,
                tasks,
            ),
            unreadable_gateways,
            http_routes: watch_each(
                client,
                all(),
                Arc::clone(&unreadable_http_routes),
                &shared,
                tasks,
            ),
            grpc_routes: watch_each(
                client,
                all(),
                Arc::clone(&unreadable_grpc_routes),
                &shared,
                tasks,
            ),
            unreadable_http_routes,
            unreadable_grpc_routes,
            reference_grants: cache(reference_grants, Kept::Read, &shared, tasks),
            listener_sets: cache(listener_sets, Kept::Read, &shared, tasks),
            listener_set_resource,
            backend_tls_policies: watch_each(client, all(), Arc::default(), &shared, tasks),
            config_maps: watch(Api::all(client.clone()), all(), Kept::Read, &shared, tasks),
            namespaces: watch(Api::all(client.clone()), all(), Kept::Read, &shared, tasks),
            services: watch(Api::all(client.clone()), all(), Kept::Read, &shared, tasks),
            endpoint_slices: watch(Api::all(client.clone()), all(), Kept::Read, &shared, tasks),
            gateway_configs: watch_each(
                client,
                all(),
                Arc::clone(&unreadable_gateway_configs),
                &shared,
                tasks,
            ),
            unreadable_gateway_configs,
            gateway_class_configs: watch_each(client, all(), Arc::default(), &shared, tasks),
            service_imports: cache(service_imports, Kept::Read, &shared, tasks),
            service_imports_served,
            access_policies: watch_each(client, all(), Arc::default(), &shared, tasks),
            external_backends: watch_each(client, all(), Arc::default(), &shared, tasks),
            secrets: watch(
                Api::all(client.clone()),
                all().fields(NOT_HELM_RELEASES),
                Kept::Read,
                &shared,
                tasks,
            ),
            deployments: watch(
                Api::all(client.clone()),
                all().labels(MANAGED_BY_SELECTOR),
                Kept::Applied,
                &shared,
                tasks,
            ),
            pool: pool.map(|pool| {
                watch(
                    Api::namespaced(client.clone(), &pool.namespace),
                    all().fields(&format!("metadata.name={}", pool.name)),
                    Kept::Read,
                    &shared,
                    tasks,
                )
            }),
            pods,
            network_policies: watch(
                Api::all(client.clone()),
                all().labels(MANAGED_BY_SELECTOR),
                Kept::Applied,
                &shared,
                tasks,
            ),
            autoscalers: watch(
                Api::all(client.clone()),
                all().labels(MANAGED_BY_SELECTOR),
                Kept::Applied,
                &shared,
                tasks,
            ),
            gateway_api_crds: cache(crds, Kept::Read, &shared, tasks),
            absent: absent_kinds,
        }
    }

    /// How many objects each cache holds, by kind (for `/metrics`).
    pub fn counts(&self) -> [(&'static str, usize); 16] {
        [
            ("GatewayClass", self.gateway_classes.state().len()),
            ("Gateway", self.gateways.state().len()),
            ("HTTPRoute", self.http_routes.state().len()),
            ("GRPCRoute", self.grpc_routes.state().len()),
            ("ReferenceGrant", self.reference_grants.state().len()),
            ("ListenerSet", self.listener_sets.state().len()),
            ("Namespace", self.namespaces.state().len()),
            ("Service", self.services.state().len()),
            ("EndpointSlice", self.endpoint_slices.state().len()),
            ("GatewayConfig", self.gateway_configs.state().len()),
            ("Secret", self.secrets.state().len()),
            ("Deployment", self.deployments.state().len()),
            ("Pod", self.pods.state().len()),
            ("NetworkPolicy", self.network_policies.state().len()),
            ("HorizontalPodAutoscaler", self.autoscalers.state().len()),
            (
                "CustomResourceDefinition",
                self.gateway_api_crds.state().len(),
            ),
        ]
    }

    /// The rendered NetworkPolicies and autoscalers the caches hold now.
    pub fn plane_objects(&self) -> PlaneObjects {
        fn by_key<K: Resource>(objects: Vec<Arc<K>>) -> BTreeMap<(String, String), Arc<K>> {
            objects
                .into_iter()
                .filter_map(|o| {
                    let key = (o.meta().namespace.clone()?, o.meta().name.clone()?);
                    Some((key, o))
                })
                .collect()
        }
        PlaneObjects {
            network_policies: by_key(self.network_policies.state()),
            autoscalers: by_key(self.autoscalers.state()),
        }
    }

    /// Waits for the first full list of every cache but the CRDs', the optional kinds' and the
    /// Pods', then for the first two; whether the other caches are filled (false: a watch task
    /// stopped first). The Pods' is not waited for at all: it only words the push failures,
    /// which take rounds to come.
    ///
    /// The CRDs gate nothing past `crd_wait` (see [`CRD_WAIT`]): rounds run without them,
    /// their snapshot says they cannot be read, and their first list, whenever it comes,
    /// starts a round like any change. Not having them by then is logged once, with the RBAC
    /// rule their watch needs (each failed retry of the watch is logged too, as for any watch).
    ///
    /// The optional kinds (BackendTLSPolicy, ExternalBackend, GatewayClassConfig,
    /// ServiceImport, AccessPolicy) are waited for together: past `crd_wait` only while their
    /// watch has not shown the kind absent, and no longer than [`LATE_LIST_CAP`] (logged as
    /// the CRDs' are).
    pub async fn wait_until_ready(&self, crd_wait: Duration) -> bool {
        let results = [
            self.gateway_classes.wait_until_ready().await,
            self.gateways.wait_until_ready().await,
            self.http_routes.wait_until_ready().await,
            self.grpc_routes.wait_until_ready().await,
            self.reference_grants.wait_until_ready().await,
            self.listener_sets.wait_until_ready().await,
            self.config_maps.wait_until_ready().await,
            self.namespaces.wait_until_ready().await,
            self.services.wait_until_ready().await,
            self.endpoint_slices.wait_until_ready().await,
            self.gateway_configs.wait_until_ready().await,
            self.secrets.wait_until_ready().await,
            self.deployments.wait_until_ready().await,
            self.network_policies.wait_until_ready().await,
            self.autoscalers.wait_until_ready().await,
        ];
        if !results.iter().all(Result::is_ok) {
            return false;
        }
        let crds = async {
            let crds =
                tokio::time::timeout(crd_wait, self.gateway_api_crds.wait_until_ready()).await;
            if !matches!(crds, Ok(Ok(()))) {
                tracing::warn!(
                    waited = ?crd_wait,
                    needs = CRD_ACCESS,
                    "Gateway API CRDs not listed in time; reconciling without them, GatewayClass \
                     SupportedVersion=False until they are (the controller's RBAC must grant `needs`)"
                );
            }
        };
        future::join(
            crds,
            future::join5(
                self.wait_for_optional(
                    &self.backend_tls_policies,
                    crd_wait,
                    "the CRD is served from Gateway API v1.4 on, and the controller's RBAC must \
                     let it list and watch them; reconciling without them until they are: \
                     backends they cover are dialled as their Service ports say",
                ),
                self.wait_for_optional(
                    &self.external_backends,
                    crd_wait,
                    "is the externalbackends.cf.k8s.lex.la CRD installed, and may the controller \
                     list and watch them? reconciling without them: backendRefs naming one \
                     resolve to nothing (500) until they are listed",
                ),
                self.wait_for_optional(
                    &self.gateway_class_configs,
                    crd_wait,
                    "is the gatewayclassconfigs.cf.k8s.lex.la CRD installed, and may the \
                     controller list and watch them? reconciling without them: a GatewayClass \
                     naming one is not accepted until they are",
                ),
                self.wait_for_optional(
                    &self.service_imports,
                    crd_wait,
                    "they are served, but may the controller list and watch them? reconciling \
                     without them: backendRefs naming one resolve to nothing until they are \
                     listed",
                ),
                self.wait_for_optional(
                    &self.access_policies,
                    crd_wait,
                    "is the accesspolicies.cf.k8s.lex.la CRD installed, and may the controller \
                     list and watch them? reconciling without them: rules naming one answer 500 \
                     until they are listed",
                ),
            ),
        )
        .await;
        true
    }

    /// Waits for the first list of an optional kind: `crd_wait`, then on while its watch fails
    /// other than as absent, up to [`LATE_LIST_CAP`]. Going on without it is logged with
    /// `hint` (what it takes, and what is missed meanwhile).
    async fn wait_for_optional<K>(&self, store: &Store<K>, crd_wait: Duration, hint: &str)
    where
        K: Resource<DynamicType = ()> + Clone + 'static,
    {
        let kind = K::kind(&());
        let listed = |r: Result<(), _>| r.is_ok();
        if tokio::time::timeout(crd_wait, store.wait_until_ready())
            .await
            .is_ok_and(listed)
        {
            return;
        }
        let mut absent = self.absent.clone();
        let shown_absent = |kinds: &BTreeSet<String>| kinds.contains(kind.as_ref());
        if !shown_absent(&absent.borrow_and_update()) {
            tracing::info!(
                kind = %kind,
                waited = ?crd_wait,
                "first list not in yet, and the kind not shown absent (not served or not \
                 permitted); not ready until it is listed, for {:?} at most",
                LATE_LIST_CAP
            );
            let late = LATE_LIST_CAP.saturating_sub(crd_wait);
            let outcome = tokio::time::timeout(late, async {
                tokio::select! {
                    ready = store.wait_until_ready() => ready.is_ok(),
                    _ = absent.wait_for(shown_absent) => false,
                }
            })
            .await;
            if outcome == Ok(true) {
                return;
            }
        }
        let waited = if shown_absent(&self.absent.borrow()) {
            crd_wait
        } else {
            LATE_LIST_CAP.max(crd_wait)
        };
        tracing::warn!(
            kind = %kind,
            ?waited,
            "not listed in time ({hint})"
        );
    }

    /// The routes this build cannot read, with what their status is written against.
    pub fn unreadable_routes(&self) -> Vec<UnreadableRoute> {
        [
            (RouteKind::Http, &self.unreadable_http_routes),
            (RouteKind::Grpc, &self.unreadable_grpc_routes),
        ]
        .into_iter()
        .flat_map(|(kind, unreadable)| {
            unreadable
                .noted()
                .into_iter()
                .map(move |(namespace, name, noted)| UnreadableRoute {
                    key: RouteKey {
                        kind,
                        key: ObjectKey::new(&namespace, &name),
                    },
                    noted,
                })
        })
        .collect()
    }

    /// The translation's input, as the caches hold it now. The CRDs are `None` until their
    /// cache has had its first full list (their watch may lack RBAC: it gates nothing).
    pub fn snapshot(&self) -> Snapshot {
        let crds_listed = self
            .gateway_api_crds
            .wait_until_ready()
            .now_or_never()
            .is_some_and(|ready| ready.is_ok());
        Snapshot {
            gateway_classes: self.gateway_classes.state(),
            gateways: self.gateways.state(),
            unreadable_gateways: self.unreadable_gateways.list(),
            http_routes: self.http_routes.state(),
            grpc_routes: self.grpc_routes.state(),
            reference_grants: self.reference_grants.state(),
            listener_sets: self.listener_sets.state(),
            backend_tls_policies: self.backend_tls_policies.state(),
            config_maps: self.config_maps.state(),
            namespaces: self.namespaces.state(),
            services: self.services.state(),
            endpoint_slices: self.endpoint_slices.state(),
            gateway_configs: self.gateway_configs.state(),
            unreadable_gateway_configs: self.unreadable_gateway_configs.list(),
            gateway_class_configs: self.gateway_class_configs.state(),
            service_imports: self
                .service_imports_served
                .borrow()
                .is_some()
                .then(|| self.service_imports.state()),
            access_policies: self.access_policies.state(),
            external_backends: self.external_backends.state(),
            secrets: self.secrets.state(),
            custom_resource_definitions: crds_listed.then(|| {
                self.gateway_api_crds
                    .state()
                    .iter()
                    .map(|crd| crd.metadata.clone())
                    .collect()
            }),
        }
    }
}
