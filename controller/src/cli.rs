//! The command line: `cftunnel-controller translate` prints the proxy config a cluster state
//! would produce, `render` the objects of a Gateway's dedicated data plane, `crd` the
//! CustomResourceDefinitions of the `cf.k8s.lex.la` kinds; none needs a cluster.

use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use anyhow::{bail, Context};
use cftunnel_config::address::ClusterRanges;
use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use clap::{Args, Parser, Subcommand};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::CustomResourceExt;

use crate::access_policy::AccessPolicy;
use crate::class_parameters::{self, ClassDefaults};
use crate::external_backend::ExternalBackend;
use crate::gateway_class_config::GatewayClassConfig;
use crate::gateway_config::GatewayConfig;
use crate::manifest;
use crate::render::{self, RenderSettings};
use crate::runtime::lease::LeaseOptions;
use crate::runtime::{RuntimeOptions, SharedPlane};
use crate::translate::{
    self, ExternalNameBackends, ObjectKey, Options, Output, PlaneKey, Snapshot, Statuses,
    TunnelIdentity, DEFAULT_CLUSTER_DOMAIN, DEFAULT_CONTROLLER_NAME,
};

/// Gateway API controller for Cloudflare Tunnel data planes.
#[derive(Debug, Parser)]
#[command(name = "cftunnel-controller", version)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the controller against the cluster of the current kubeconfig (in a pod: its service
    /// account).
    Run(Box<RunArgs>),
    /// Print the proxy config a set of manifests produces (stdout, JSON) and the conditions
    /// every owned object would get (stderr).
    Translate(TranslateArgs),
    /// Print the objects of a Gateway's dedicated data plane (stdout, multi-document YAML, in
    /// apply order) and its status address (stderr).
    Render(RenderArgs),
    /// Print the CustomResourceDefinitions of GatewayConfig, AccessPolicy, ExternalBackend and
    /// GatewayClassConfig (multi-document YAML), or of the one kind named.
    Crd(CrdArgs),
}

/// Which CustomResourceDefinitions `crd` prints.
#[derive(Debug, Args)]
pub struct CrdArgs {
    /// Only this kind's (as each file of the chart's `crds/` holds one).
    #[arg(value_enum)]
    pub kind: Option<CrdKind>,
}

/// The kinds of the `cf.k8s.lex.la` API group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CrdKind {
    #[value(name = "GatewayConfig")]
    GatewayConfig,
    #[value(name = "AccessPolicy")]
    AccessPolicy,
    #[value(name = "ExternalBackend")]
    ExternalBackend,
    #[value(name = "GatewayClassConfig")]
    GatewayClassConfig,
}

impl CrdKind {
    /// The kind's CustomResourceDefinition as YAML.
    ///
    /// # Errors
    /// Only if it cannot be encoded.
    pub fn yaml(self) -> anyhow::Result<String> {
        let crd = match self {
            Self::GatewayConfig => GatewayConfig::crd(),
            Self::AccessPolicy => AccessPolicy::crd(),
            Self::ExternalBackend => ExternalBackend::crd(),
            Self::GatewayClassConfig => GatewayClassConfig::crd(),
        };
        serde_yaml_ng::to_string(&crd).context("encoding the CRD")
    }
}

/// What `run` and `translate` share: which Gateways are ours and what their planes run.
#[derive(Debug, Args)]
pub struct ClassArgs {
    /// GatewayClasses with this controllerName are ours.
    #[arg(long, default_value = DEFAULT_CONTROLLER_NAME)]
    pub controller_name: String,
    /// Cluster DNS domain used for Services without EndpointSlices, and the domain
    /// ExternalName backends may not be under (`--external-name-backends=external`).
    #[arg(long, default_value = DEFAULT_CLUSTER_DOMAIN)]
    pub cluster_domain: String,
    /// Which ExternalName Services routes may use as backends: `deny` none (for untrusted
    /// route authors); `external` names that do not mean the cluster as written (not under
    /// `--cluster-domain` or `clusterset.local`, not IP addresses, single labels or
    /// `localhost`), dialled as absolute names and, at dial time, only at public addresses (a
    /// name resolving to loopback, private, link-local, CGNAT or other non-public addresses
    /// is refused); `any` every name as written, also on private networks, which lets a route
    /// reach any Service of the cluster without a ReferenceGrant.
    #[arg(
        long,
        env = "EXTERNAL_NAME_BACKENDS",
        value_parser = external_name_backends(),
        default_value_t = ExternalNameBackends::External
    )]
    pub external_name_backends: ExternalNameBackends,
    /// The cluster's own address ranges (CIDRs, IPv4 and IPv6, comma-separated) that are
    /// globally routable: Service, pod or node ranges that are not private (GKE's
    /// Google-managed Service range, EKS's IPv6 pods, nodes with public IPs). Under
    /// `--external-name-backends=external` an ExternalBackend whose host is an address in one
    /// is refused, and every dedicated plane's proxy is given them (`PROXY_CLUSTER_CIDRS`) so
    /// that no name of such a backend is dialled there either.
    #[arg(long, env = "CLUSTER_CIDRS", default_value = "")]
    pub cluster_cidrs: ClusterRanges,
    /// Routes publish only hostnames under the suffixes their namespace is labelled for
    /// (`hostnames.cf.k8s.lex.la/<suffix>: "true"`); others are refused
    /// (`Accepted=False`, `HostnameNotPermitted`).
    #[arg(long, env = "HOSTNAME_OWNERSHIP", default_value_t = false, action = clap::ArgAction::Set)]
    pub hostname_ownership: bool,
    /// The proxy image of dedicated data planes whose GatewayConfig names none. Without
    /// either, such a Gateway is not accepted.
    #[arg(long, env = "PROXY_IMAGE")]
    pub proxy_image: Option<String>,
    /// When the kubelet pulls `--proxy-image` (`Always`, `IfNotPresent`, `Never`); unset:
    /// Kubernetes' default for its tag. An image a GatewayConfig names gets that default.
    #[arg(long, env = "PROXY_IMAGE_PULL_POLICY", value_parser = PULL_POLICIES)]
    pub proxy_image_pull_policy: Option<String>,
}

/// The values of a container's `imagePullPolicy`.
const PULL_POLICIES: [&str; 3] = ["Always", "IfNotPresent", "Never"];

/// `--external-name-backends`: the values' spellings with what each admits, for the help.
fn external_name_backends() -> impl TypedValueParser<Value = ExternalNameBackends> {
    let values = ExternalNameBackends::ALL.map(|value| {
        PossibleValue::new(value.as_str()).help(match value {
            ExternalNameBackends::Deny => {
                "None: every backendRef to an ExternalName Service is refused"
            }
            ExternalNameBackends::External => {
                "Names that do not mean the cluster as written, dialled as absolute names so \
                 that the proxy pod's search domains never apply; names under the cluster \
                 domain or `clusterset.local`, IP addresses, single labels and `localhost` are \
                 refused, and the proxy dials only public addresses of the rest (`publicOnly`)"
            }
            ExternalNameBackends::Any => {
                "Any name, dialled as written (search domains apply): a route can reach any \
                 Service of the cluster through one"
            }
        })
    });
    // Only the spellings above get past the first parser, and each parses.
    PossibleValuesParser::new(values).try_map(|s| s.parse::<ExternalNameBackends>())
}

#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub class: ClassArgs,
    /// Log lines on stderr: `json` (one object per line) or `text`.
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: cftunnel_telemetry::LogFormat,
    /// The controller's namespace, where the data planes' config API admits the controller's
    /// pods.
    #[arg(long, env = "POD_NAMESPACE", default_value = "cftunnel-system")]
    pub controller_namespace: String,
    /// A label (KEY=VALUE) of the controller's pods, the only pods of its namespace the data
    /// planes' config API admits; repeated, or comma-separated: pods with all of them.
    #[arg(
        long,
        env = "CONTROLLER_POD_LABELS",
        value_delimiter = ',',
        default_value = render::DEFAULT_CONTROLLER_POD_LABEL,
        value_parser = parse_label
    )]
    pub controller_pod_label: Vec<(String, String)>,
    /// Also admit namespaces with this label (KEY=VALUE) to the config API, for scraping;
    /// repeated: namespaces with all of them.
    #[arg(long, value_parser = parse_label)]
    pub monitoring_namespace_label: Vec<(String, String)>,
    /// Also admit the pods of the controller's namespace with this label (KEY=VALUE) to the
    /// config API: a Prometheus running there; repeated, or comma-separated: pods with all of
    /// them.
    #[arg(
        long,
        env = "MONITORING_POD_LABELS",
        value_delimiter = ',',
        value_parser = parse_label
    )]
    pub monitoring_pod_label: Vec<(String, String)>,
    #[command(flatten)]
    pub plane_env: PlaneEnv,
    /// The proxy's drain window after SIGTERM, in seconds (at most 180).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(0..=180))]
    pub grace_period_seconds: u32,
    /// Give every dedicated plane a NetworkPolicy admitting only the controller's (and the
    /// monitoring's) pods to its config port. `false` where the CNI enforces no NetworkPolicy or
    /// you write the planes' policies yourself: none is rendered, and the ones rendered before
    /// are removed.
    #[arg(long, env = "PLANE_NETWORK_POLICY", default_value_t = true, action = clap::ArgAction::Set)]
    pub plane_network_policy: bool,
    /// The shared proxy pool's headless Service (NAMESPACE/NAME); without it only dedicated
    /// planes get configs.
    #[arg(long)]
    pub shared_service: Option<GatewayName>,
    /// The Secret (`NAMESPACE/NAME[:KEY]`, key default `token`) with the shared pool's
    /// config-API token.
    #[arg(long, requires = "shared_service")]
    pub shared_auth_secret: Option<SecretArg>,
    /// The Secret (`NAMESPACE/NAME[:KEY]`, key default `tunnel-token`) with the class tunnel's
    /// connector token, for the shared Gateways' addresses.
    #[arg(long, requires = "shared_service")]
    pub shared_tunnel_secret: Option<SecretArg>,
    /// The shared pool's Deployment (NAMESPACE/NAME). Its pod template is kept stamped with
    /// the SHA-256 of the token in `--shared-tunnel-secret`, so a new token there rolls the
    /// pool (its pods read the token at start).
    #[arg(long, requires = "shared_tunnel_secret")]
    pub shared_deployment: Option<GatewayName>,
    /// A ConfigMap of the controller's namespace in which to list its Gateways and their
    /// ListenerSets, for a hostname-ownership admission policy that judges only the routes
    /// naming one (the chart's, whose parameter it is).
    #[arg(long)]
    pub ownership_parents_configmap: Option<String>,
    /// Seconds between rounds when nothing changes.
    #[arg(long, default_value_t = 30)]
    pub resync_seconds: u64,
    /// Seconds, at least, between reads of a tunnel's ingress document back from the
    /// Cloudflare API; one changed there (the dashboard, another tool) is written again.
    #[arg(
        long,
        default_value_t = crate::runtime::DEFAULT_TUNNEL_READ_BACK.as_secs(),
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub tunnel_read_back_seconds: u64,
    /// Seconds a Kubernetes API call may wait for its whole response (a watch: for its response
    /// head) before it fails like any other failed call (1 to 3600).
    #[arg(
        long,
        default_value_t = crate::runtime::api_client::DEFAULT_REQUEST_TIMEOUT.as_secs(),
        value_parser = clap::value_parser!(u64).range(1..=3600)
    )]
    pub api_request_timeout_seconds: u64,
    /// The Cloudflare API token for tunnels whose GatewayConfig names none, and the shared
    /// plane's. Without it those tunnels' ingress documents are not written.
    #[arg(long, env = "CLOUDFLARE_API_TOKEN", hide_env_values = true)]
    pub cloudflare_api_token: Option<String>,
    /// The Cloudflare API's base URL.
    #[arg(long, default_value = crate::cloudflare::DEFAULT_API_BASE)]
    pub cloudflare_api: String,
    /// Elect one leader among replicas on a Lease (`--leader-election-id`) in the controller's
    /// namespace; only the leader writes.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_election: bool,
    /// The Lease's name: one per controller installation sharing a namespace.
    #[arg(long, default_value = "cftunnel-controller")]
    pub leader_election_id: String,
    /// Where `/healthz`, `/readyz` and `/metrics` are served (`[::]`: IPv6 and IPv4, or IPv4
    /// alone where IPv6 is off).
    #[arg(long, default_value = "[::]:8082")]
    pub health_addr: std::net::SocketAddr,
    #[command(flatten)]
    pub traces: cftunnel_telemetry::TraceArgs,
}

/// The `service.name` of the controller's spans unless `OTEL_SERVICE_NAME` says otherwise.
pub const SERVICE_NAME: &str = "cftunnel-controller";

/// The modules whose spans the controller exports: a round's sync of configs, its
/// Cloudflare API calls and its config pushes.
pub const TRACED_TARGETS: &[&str] = &[
    "cftunnel_controller::runtime",
    "cftunnel_controller::cloudflare",
    "cftunnel_controller::push",
];

/// `NAMESPACE/NAME[:KEY]` of a Secret key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretArg {
    pub secret: ObjectKey,
    pub key: Option<String>,
}

impl FromStr for SecretArg {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (name, key) = match s.split_once(':') {
            Some((name, key)) if !key.is_empty() => (name, Some(key.to_owned())),
            Some(_) => return Err(format!("expected NAMESPACE/NAME[:KEY], got {s:?}")),
            None => (s, None),
        };
        let GatewayName(secret) = name.parse()?;
        Ok(Self { secret, key })
    }
}

impl RunArgs {
    /// The runtime's options.
    ///
    /// # Errors
    /// `--shared-service` without `--shared-auth-secret`, no `--controller-pod-label`, or a
    /// label flag giving one key two values.
    pub fn options(&self) -> anyhow::Result<RuntimeOptions> {
        let shared = match (&self.shared_service, &self.shared_auth_secret) {
            (None, _) => None,
            (Some(_), None) => bail!("--shared-service needs --shared-auth-secret"),
            (Some(GatewayName(service)), Some(auth)) => Some(SharedPlane {
                service: service.clone(),
                auth_secret: auth.secret.clone(),
                auth_key: auth.key.clone().unwrap_or_else(|| "token".to_owned()),
                tunnel_secret: self.shared_tunnel_secret.as_ref().map(|t| {
                    (
                        t.secret.clone(),
                        t.key.clone().unwrap_or_else(|| "tunnel-token".to_owned()),
                    )
                }),
                deployment: self
                    .shared_deployment
                    .as_ref()
                    .map(|GatewayName(key)| key.clone()),
            }),
        };
        Ok(RuntimeOptions {
            translate: Options {
                controller_name: self.class.controller_name.clone(),
                gateway_class_name: None,
                cluster_domain: self.class.cluster_domain.clone(),
                external_name_backends: self.class.external_name_backends,
                cluster_ranges: self.class.cluster_cidrs.clone(),
                proxy_image: self.class.proxy_image.clone(),
                // Read from the shared tunnel's Secret every round.
                shared_tunnel: None,
                // Read from the planes' Deployments every round.
                running_tunnels: std::collections::BTreeMap::new(),
                hostname_ownership: self.class.hostname_ownership,
                // Settled from the GatewayClassConfigs every round.
                refused_classes: std::collections::BTreeMap::new(),
            },
            render: render_settings(PlaneFlags {
                proxy_image: &self.class.proxy_image,
                proxy_image_pull_policy: &self.class.proxy_image_pull_policy,
                controller_namespace: &self.controller_namespace,
                controller_pod_label: &self.controller_pod_label,
                monitoring_namespace_label: &self.monitoring_namespace_label,
                monitoring_pod_label: &self.monitoring_pod_label,
                grace_period_seconds: self.grace_period_seconds,
                network_policy: self.plane_network_policy,
                plane_env: &self.plane_env,
                cluster_cidrs: &self.class.cluster_cidrs,
            })
            .map(|render| RenderSettings {
                // Tracing as the controller's own, then the settings.
                proxy_env: self
                    .traces
                    .to_env()
                    .into_iter()
                    .map(|(name, value)| (name.to_owned(), value))
                    .chain(render.proxy_env.iter().cloned())
                    .collect(),
                ..render
            })?,
            shared,
            resync: std::time::Duration::from_secs(self.resync_seconds.max(1)),
            tunnel_read_back: std::time::Duration::from_secs(self.tunnel_read_back_seconds),
            instance: std::env::var("POD_NAME").ok(),
            lease: self.leader_election.then(|| LeaseOptions {
                namespace: self.controller_namespace.clone(),
                name: self.leader_election_id.clone(),
                identity: lease_identity(),
                duration: std::time::Duration::from_secs(15),
                renew: std::time::Duration::from_secs(5),
            }),
            cloudflare_api_base: self.cloudflare_api.clone(),
            cloudflare_api_token: self
                .cloudflare_api_token
                .as_deref()
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .map(str::to_owned),
            ownership_parents: self
                .ownership_parents_configmap
                .as_ref()
                .map(|name| ObjectKey::new(&self.controller_namespace, name)),
            ..RuntimeOptions::default()
        })
    }
}

/// This replica in the Lease: its pod name (or host name), and a random suffix so a restarted
/// pod of the same name is a new holder.
fn lease_identity() -> String {
    let base = std::env::var("POD_NAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|n| n.trim().to_owned())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "cftunnel-controller".to_owned());
    let mut suffix = [0u8; 4];
    let _ = aws_lc_rs::rand::fill(&mut suffix);
    format!(
        "{base}_{}",
        suffix
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    )
}

/// The flags `run` and `render` both take to shape a data plane (declared on each but
/// `--plane-env`, as only `run` reads them from the environment too).
struct PlaneFlags<'a> {
    proxy_image: &'a Option<String>,
    proxy_image_pull_policy: &'a Option<String>,
    controller_namespace: &'a str,
    controller_pod_label: &'a [(String, String)],
    monitoring_namespace_label: &'a [(String, String)],
    monitoring_pod_label: &'a [(String, String)],
    grace_period_seconds: u32,
    network_policy: bool,
    plane_env: &'a PlaneEnv,
    cluster_cidrs: &'a ClusterRanges,
}

/// `--plane-env`, which `run` and `render` take alike: `render` prints the plane `run` applies.
#[derive(Debug, Clone, Default, Args)]
pub struct PlaneEnv {
    /// A proxy setting (NAME=VALUE, as the proxy's environment variable: `TUNNEL_REGION=us`,
    /// `PROXY_TUNNEL_POST_QUANTUM=true`, `RUST_LOG=info`) for every dedicated plane; repeated.
    /// The chart passes the shared pool's settings, so every plane runs as the pool does.
    /// The tokens, the drain window and the config port are the controller's to set, and
    /// tracing's `OTEL_*` comes from the controller's own.
    #[arg(
        long = "plane-env",
        id = "plane_env",
        value_name = "NAME=VALUE",
        value_parser = parse_plane_env
    )]
    pub settings: Vec<(String, String)>,
}

/// The render settings those flags give.
fn render_settings(flags: PlaneFlags<'_>) -> anyhow::Result<RenderSettings> {
    Ok(RenderSettings {
        proxy_image: flags.proxy_image.clone(),
        proxy_image_pull_policy: flags.proxy_image_pull_policy.clone(),
        controller_namespace: flags.controller_namespace.to_owned(),
        controller_pod_labels: controller_pod_labels(flags.controller_pod_label)?,
        monitoring_namespace_selector: monitoring_selector(
            "--monitoring-namespace-label",
            flags.monitoring_namespace_label,
        )?,
        monitoring_pod_selector: monitoring_selector(
            "--monitoring-pod-label",
            flags.monitoring_pod_label,
        )?,
        grace_period_seconds: flags.grace_period_seconds,
        // The planes' proxies dial by the ranges the controller admits backends by.
        proxy_env: flags
            .plane_env
            .settings
            .iter()
            .cloned()
            .chain((!flags.cluster_cidrs.is_empty()).then(|| {
                (
                    CLUSTER_CIDRS_ENV.to_owned(),
                    flags.cluster_cidrs.to_string(),
                )
            }))
            .collect(),
        network_policy: flags.network_policy,
    })
}

/// The controller pods' labels; none would admit every pod of the controller's namespace.
fn controller_pod_labels(
    labels: &[(String, String)],
) -> anyhow::Result<std::collections::BTreeMap<String, String>> {
    if labels.is_empty() {
        bail!("--controller-pod-label: at least one label of the controller's pods is needed");
    }
    label_map("--controller-pod-label", labels)
}

/// The selector of a repeated label `flag`; none without labels.
fn monitoring_selector(
    flag: &str,
    labels: &[(String, String)],
) -> anyhow::Result<Option<LabelSelector>> {
    let labels = label_map(flag, labels)?;
    Ok((!labels.is_empty()).then_some(LabelSelector {
        match_labels: Some(labels),
        match_expressions: None,
    }))
}

#[derive(Debug, Args)]
pub struct RenderArgs {
    /// Manifest file or folder of manifests (*.yaml, *.yml, *.json); repeatable. They must hold
    /// the Gateway, its GatewayConfig and the Secrets that names.
    #[arg(short = 'f', long = "filename", required = true)]
    pub files: Vec<PathBuf>,
    /// The Gateway (NAMESPACE/NAME) whose data plane to render.
    #[arg(long)]
    pub gateway: GatewayName,
    /// The proxy image when the GatewayConfig names none.
    #[arg(long, env = "PROXY_IMAGE")]
    pub proxy_image: Option<String>,
    /// When the kubelet pulls `--proxy-image`; unset: Kubernetes' default for its tag.
    #[arg(long, env = "PROXY_IMAGE_PULL_POLICY", value_parser = PULL_POLICIES)]
    pub proxy_image_pull_policy: Option<String>,
    /// The controller's namespace, where the config API admits the controller's pods.
    #[arg(long, default_value = "cftunnel-system")]
    pub controller_namespace: String,
    /// A label (KEY=VALUE) of the controller's pods, the only pods of its namespace the config
    /// API admits; repeated, or comma-separated: pods with all of them.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = render::DEFAULT_CONTROLLER_POD_LABEL,
        value_parser = parse_label
    )]
    pub controller_pod_label: Vec<(String, String)>,
    /// Also admit namespaces with this label (KEY=VALUE) to the config API, for scraping;
    /// repeated: namespaces with all of them.
    #[arg(long, value_parser = parse_label)]
    pub monitoring_namespace_label: Vec<(String, String)>,
    /// Also admit the pods of the controller's namespace with this label (KEY=VALUE) to the
    /// config API; repeated, or comma-separated: pods with all of them.
    #[arg(long, value_delimiter = ',', value_parser = parse_label)]
    pub monitoring_pod_label: Vec<(String, String)>,
    /// The proxy's drain window after SIGTERM, in seconds (at most 180).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(0..=180))]
    pub grace_period_seconds: u32,
    /// Render the plane's config-port NetworkPolicy (`false`: none, as `run` then applies).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub plane_network_policy: bool,
    #[command(flatten)]
    pub plane_env: PlaneEnv,
    /// The cluster's own globally routable address ranges (comma-separated CIDRs), given to
    /// the plane's proxy as `run --cluster-cidrs` gives them.
    #[arg(long, default_value = "")]
    pub cluster_cidrs: ClusterRanges,
}

/// The proxy setting carrying `--cluster-cidrs` to the planes.
const CLUSTER_CIDRS_ENV: &str = "PROXY_CLUSTER_CIDRS";

/// `NAME=VALUE` of `--plane-env`.
fn parse_plane_env(s: &str) -> Result<(String, String), String> {
    let Some((name, value)) = s.split_once('=') else {
        return Err(format!("expected NAME=VALUE, got {s:?}"));
    };
    let well_formed = name
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if !well_formed {
        return Err(format!(
            "{name:?} is not an environment variable name (letters, digits and `_`, not first a digit)"
        ));
    }
    if render::RENDERED_ENV.contains(&name) {
        return Err(format!("{name} is set by the controller for each plane"));
    }
    if name == CLUSTER_CIDRS_ENV {
        return Err(format!(
            "{name}: the planes take the controller's own ranges (--cluster-cidrs)"
        ));
    }
    if name.starts_with("OTEL_") {
        return Err(format!(
            "{name}: the planes trace as the controller does, from its own OTEL_* variables"
        ));
    }
    Ok((name.to_owned(), value.to_owned()))
}

/// A `KEY=VALUE` label of a selector, in Kubernetes' label syntax: the API server would refuse
/// the NetworkPolicy of every data plane otherwise, so it is refused at start instead.
fn parse_label(s: &str) -> Result<(String, String), String> {
    let Some((key, value)) = s.split_once('=') else {
        return Err(format!("expected KEY=VALUE, got {s:?}"));
    };
    check_label_key(key)?;
    if !value.is_empty() {
        check_label_name(value).map_err(|rule| format!("label value {value:?}: {rule}"))?;
    }
    Ok((key.to_owned(), value.to_owned()))
}

/// `[PREFIX/]NAME`: PREFIX a DNS subdomain, NAME a label name.
fn check_label_key(key: &str) -> Result<(), String> {
    if key.is_empty() {
        return Err("empty label key (expected KEY=VALUE)".to_owned());
    }
    let name = match key.split_once('/') {
        None => key,
        Some((_, name)) if name.contains('/') => {
            return Err(format!(
                "label key {key:?}: at most one '/', between a DNS-subdomain prefix and a name"
            ))
        }
        Some((prefix, name)) => {
            check_dns_subdomain(prefix)
                .map_err(|rule| format!("label key prefix {prefix:?} (in {key:?}): {rule}"))?;
            name
        }
    };
    check_label_name(name).map_err(|rule| {
        if name.len() == key.len() {
            format!("label key {key:?}: {rule}")
        } else {
            format!("label key name {name:?} (in {key:?}): {rule}")
        }
    })
}

/// A label key's name, or a non-empty label value.
fn check_label_name(name: &str) -> Result<(), &'static str> {
    const RULE: &str = "must be letters, digits, '-', '_' and '.', starting and ending with a \
                        letter or digit";
    let edges_ok = name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    let chars_ok = name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    match name.len() {
        0 => Err("is empty"),
        64.. => Err("is longer than 63 characters"),
        _ if !(edges_ok && chars_ok) => Err(RULE),
        _ => Ok(()),
    }
}

/// A label key's prefix: a DNS subdomain (RFC 1123).
fn check_dns_subdomain(prefix: &str) -> Result<(), &'static str> {
    let part_ok = |p: &str| {
        p.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
            && p.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
            && p.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    };
    match prefix.len() {
        0 => Err("is empty; drop the '/' or name a DNS subdomain before it"),
        254.. => Err("is longer than 253 characters"),
        _ if !prefix.split('.').all(part_ok) => Err(
            "must be a DNS subdomain: lowercase letters, digits, '-' and '.', \
             each dot-separated part starting and ending with a letter or digit",
        ),
        _ => Ok(()),
    }
}

/// The labels of a repeated `flag`, one value per key: the same key with two values is a
/// mistake to report, not one for the order of the flags to settle.
fn label_map(
    flag: &str,
    labels: &[(String, String)],
) -> anyhow::Result<std::collections::BTreeMap<String, String>> {
    let mut map = std::collections::BTreeMap::new();
    for (key, value) in labels {
        match map.insert(key.clone(), value.clone()) {
            Some(other) if other != *value => {
                bail!("{flag}: label {key:?} is given twice, as {other:?} and as {value:?}")
            }
            _ => {}
        }
    }
    Ok(map)
}

#[derive(Debug, Args)]
pub struct TranslateArgs {
    /// Manifest file or folder of manifests (*.yaml, *.yml, *.json); repeatable.
    #[arg(short = 'f', long = "filename", required = true)]
    pub files: Vec<PathBuf>,
    /// Print the data plane of this Gateway (NAMESPACE/NAME). Default: the shared plane.
    #[arg(long, conflicts_with = "all_planes")]
    pub gateway: Option<GatewayName>,
    /// Print every data plane, as a JSON object keyed by plane (`shared`, `gateway NS/NAME`).
    #[arg(long)]
    pub all_planes: bool,
    /// Treat Gateways of this class as ours even without a GatewayClass object.
    #[arg(long)]
    pub gateway_class_name: Option<String>,
    #[command(flatten)]
    pub class: ClassArgs,
    /// The shared plane's connector token (the class tunnel), to see which dedicated Gateways
    /// share it; a GatewayClassConfig's connector token in the manifests overrides it.
    #[arg(long, env = "SHARED_TUNNEL_TOKEN", hide_env_values = true)]
    pub shared_tunnel_token: Option<cftunnel_config::Token>,
    /// Where the Secrets a GatewayClassConfig names without a namespace are.
    #[arg(long, default_value = "cftunnel-system")]
    pub controller_namespace: String,
}

/// `NAMESPACE/NAME` of a Gateway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewayName(pub ObjectKey);

impl FromStr for GatewayName {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.split_once('/') {
            Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
                Ok(Self(ObjectKey::new(ns, name)))
            }
            _ => Err(format!("expected NAMESPACE/NAME, got {s:?}")),
        }
    }
}

impl fmt::Display for GatewayName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Runs `translate`: config JSON to `out`, conditions to `err`.
///
/// # Errors
/// Unreadable or invalid manifests, an unknown `--gateway`, or no way to tell which Gateways
/// are ours.
pub fn run_translate(
    args: &TranslateArgs,
    out: &mut impl Write,
    err: &mut impl Write,
) -> anyhow::Result<()> {
    let snapshot = load_paths(&args.files)?;

    let mut class = args.gateway_class_name.clone();
    if let Some(GatewayName(key)) = &args.gateway {
        let Some(gw) = snapshot.gateways.iter().find(|g| {
            g.metadata.namespace.as_deref() == Some(key.namespace.as_str())
                && g.metadata.name.as_deref() == Some(key.name.as_str())
        }) else {
            bail!("Gateway {key} is not in the manifests");
        };
        match &class {
            Some(c) if *c != gw.spec.gateway_class_name => bail!(
                "Gateway {key} is of class {}, not {c}",
                gw.spec.gateway_class_name
            ),
            _ => class = Some(gw.spec.gateway_class_name.clone()),
        }
    } else if class.is_none()
        && !snapshot
            .gateway_classes
            .iter()
            .any(|c| c.spec.controller_name == args.class.controller_name)
    {
        bail!(
            "no GatewayClass with controllerName {} in the manifests; pass --gateway-class-name or --gateway",
            args.class.controller_name
        );
    }

    let parameters = class_parameters::settle(
        &snapshot,
        &args.class.controller_name,
        &ClassDefaults {
            namespace: args.controller_namespace.clone(),
            ..ClassDefaults::default()
        },
    );
    let options = Options {
        controller_name: args.class.controller_name.clone(),
        gateway_class_name: class,
        cluster_domain: args.class.cluster_domain.clone(),
        external_name_backends: args.class.external_name_backends,
        cluster_ranges: args.class.cluster_cidrs.clone(),
        proxy_image: args.class.proxy_image.clone(),
        shared_tunnel: parameters
            .shared
            .tunnel_token
            .as_ref()
            .or(args.shared_tunnel_token.as_ref())
            .map(TunnelIdentity::of),
        // Offline, planes are taken as rendered.
        running_tunnels: std::collections::BTreeMap::new(),
        hostname_ownership: args.class.hostname_ownership,
        refused_classes: parameters.refused,
    };
    let output = translate::translate(&snapshot, &options);
    write_statuses(err, &output)?;

    if args.all_planes {
        serde_json::to_writer_pretty(&mut *out, &output.configs).context("writing the configs")?;
        writeln!(out)?;
        return Ok(());
    }
    let plane = match &args.gateway {
        None => PlaneKey::Shared,
        Some(GatewayName(key)) => match output.planes.get(key) {
            Some(plane) => plane.clone(),
            None => bail!("Gateway {key} is not accepted, so no data plane serves it"),
        },
    };
    let config = output
        .configs
        .get(&plane)
        .with_context(|| format!("no config for the {plane} plane"))?;
    serde_json::to_writer_pretty(&mut *out, config).context("writing the config")?;
    writeln!(out)?;
    Ok(())
}

/// Runs `render`: the data plane's objects to `out`, its address to `err`.
///
/// # Errors
/// Unreadable manifests, an unknown Gateway or one without a GatewayConfig, and every reason
/// the controller would give in the Gateway's `InvalidParameters` condition.
pub fn run_render(
    args: &RenderArgs,
    out: &mut impl Write,
    err: &mut impl Write,
) -> anyhow::Result<()> {
    let snapshot = load_paths(&args.files)?;
    let GatewayName(key) = &args.gateway;
    let Some(gateway) = snapshot.gateways.iter().find(|g| {
        g.metadata.namespace.as_deref() == Some(key.namespace.as_str())
            && g.metadata.name.as_deref() == Some(key.name.as_str())
    }) else {
        bail!("Gateway {key} is not in the manifests");
    };
    let Some(config_name) = gateway
        .spec
        .infrastructure
        .as_ref()
        .and_then(|i| i.parameters_ref.as_ref())
        .filter(|r| {
            r.group == translate::GATEWAY_CONFIG_GROUP && r.kind == translate::GATEWAY_CONFIG_KIND
        })
        .map(|r| r.name.as_str())
    else {
        bail!("Gateway {key} names no GatewayConfig in spec.infrastructure.parametersRef: the shared data plane serves it");
    };
    let Some(config) = snapshot.gateway_configs.iter().find(|c| {
        c.metadata.namespace.as_deref() == Some(key.namespace.as_str())
            && c.metadata.name.as_deref() == Some(config_name)
    }) else {
        bail!(
            "GatewayConfig {}/{config_name}, which Gateway {key} names, is not in the manifests",
            key.namespace
        );
    };
    let credentials = render::resolve(
        gateway,
        config,
        &snapshot.secrets,
        &crate::runtime::fresh_token()?,
    )?;
    let settings = render_settings(PlaneFlags {
        proxy_image: &args.proxy_image,
        proxy_image_pull_policy: &args.proxy_image_pull_policy,
        controller_namespace: &args.controller_namespace,
        controller_pod_label: &args.controller_pod_label,
        monitoring_namespace_label: &args.monitoring_namespace_label,
        monitoring_pod_label: &args.monitoring_pod_label,
        grace_period_seconds: args.grace_period_seconds,
        network_policy: args.plane_network_policy,
        plane_env: &args.plane_env,
        cluster_cidrs: &args.cluster_cidrs,
    })?;
    let plane = render::render(gateway, config, &credentials, &settings)?;
    let mut documents = Vec::new();
    if let Some(secret) = &plane.auth_secret {
        documents.push(serde_yaml_ng::to_string(secret)?);
    }
    documents.push(serde_yaml_ng::to_string(&plane.service)?);
    if let Some(policy) = &plane.network_policy {
        documents.push(serde_yaml_ng::to_string(policy)?);
    }
    documents.push(serde_yaml_ng::to_string(&plane.deployment)?);
    if let Some(autoscaler) = &plane.autoscaler {
        documents.push(serde_yaml_ng::to_string(autoscaler)?);
    }
    for (i, doc) in documents.iter().enumerate() {
        if i > 0 {
            writeln!(out, "---")?;
        }
        writeln!(out, "{}", doc.trim_end()).context("writing the objects")?;
    }
    writeln!(err, "Gateway {key}: address {}", plane.address)?;
    Ok(())
}

/// Runs `crd`: the CustomResourceDefinitions `args` asks for, as YAML documents.
///
/// # Errors
/// Only if `out` cannot be written.
pub fn run_crd(args: &CrdArgs, out: &mut impl Write) -> anyhow::Result<()> {
    let kinds = match args.kind {
        Some(kind) => vec![kind],
        None => vec![
            CrdKind::GatewayConfig,
            CrdKind::AccessPolicy,
            CrdKind::ExternalBackend,
            CrdKind::GatewayClassConfig,
        ],
    };
    for (i, kind) in kinds.into_iter().enumerate() {
        if i > 0 {
            out.write_all(b"---\n").context("writing the CRD")?;
        }
        out.write_all(kind.yaml()?.as_bytes())
            .context("writing the CRD")?;
    }
    Ok(())
}

/// Every manifest of `paths` (files or folders) in one snapshot.
fn load_paths(paths: &[PathBuf]) -> anyhow::Result<Snapshot> {
    let mut snapshot = Snapshot::default();
    for path in paths {
        load_path(&mut snapshot, path)?;
    }
    Ok(snapshot)
}

fn load_path(snapshot: &mut Snapshot, path: &Path) -> anyhow::Result<()> {
    let meta = std::fs::metadata(path).with_context(|| format!("reading {}", path.display()))?;
    if meta.is_dir() {
        let mut entries = Vec::new();
        for entry in
            std::fs::read_dir(path).with_context(|| format!("reading {}", path.display()))?
        {
            let p = entry?.path();
            let manifest = p
                .extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| matches!(e, "yaml" | "yml" | "json"));
            if manifest || p.is_dir() {
                entries.push(p);
            }
        }
        entries.sort();
        for p in entries {
            load_path(snapshot, &p)?;
        }
        return Ok(());
    }
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    manifest::load_into(snapshot, &text, &path.display().to_string())?;
    Ok(())
}

/// Human-readable conditions, one object per line and one listener or parent per indented line.
pub fn write_statuses(w: &mut impl Write, output: &Output) -> std::io::Result<()> {
    let Statuses {
        gateway_classes,
        gateways,
        routes,
        backend_tls_policies,
        listener_sets,
    } = &output.statuses;
    let join = |conditions: &[translate::Condition]| {
        conditions
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ")
    };
    for (name, conditions) in gateway_classes {
        writeln!(w, "GatewayClass {name}: {}", join(conditions))?;
    }
    for (key, status) in gateways {
        let plane = output
            .planes
            .get(key)
            .map_or_else(|| "no plane".to_owned(), ToString::to_string);
        writeln!(w, "Gateway {key} ({plane}): {}", join(&status.conditions))?;
        for l in &status.listeners {
            writeln!(
                w,
                "  listener {}: attachedRoutes={}; {}",
                l.name,
                l.attached_routes,
                join(&l.conditions)
            )?;
        }
    }
    for (key, status) in listener_sets {
        writeln!(
            w,
            "ListenerSet {key} (Gateway {}): {}",
            status.gateway,
            join(&status.conditions)
        )?;
        for l in &status.listeners {
            writeln!(
                w,
                "  listener {}: attachedRoutes={}; {}",
                l.name,
                l.attached_routes,
                join(&l.conditions)
            )?;
        }
    }
    for (key, parents) in routes {
        writeln!(w, "{key}")?;
        for p in parents {
            writeln!(w, "  parent {}: {}", p.parent_ref, join(&p.conditions))?;
        }
    }
    for (key, ancestors) in backend_tls_policies {
        if ancestors.is_empty() {
            continue;
        }
        writeln!(w, "BackendTLSPolicy {key}")?;
        for a in ancestors {
            writeln!(w, "  ancestor {}: {}", a.ancestor_ref, join(&a.conditions))?;
        }
    }
    Ok(())
}
