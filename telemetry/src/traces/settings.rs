//! The trace settings: the variables every OpenTelemetry SDK reads, each also a `--otel-*`
//! flag, checked and turned into [`TraceSettings`] before anything starts. Pure: nothing here
//! reads the environment (clap does) or opens a connection.

use clap::builder::BoolishValueParser;
use opentelemetry::KeyValue;
use std::str::FromStr;
use std::time::Duration;

/// The standard OpenTelemetry variables, as flags. Set either endpoint to turn tracing on.
#[derive(Debug, Clone, Default, clap::Args)]
#[command(next_help_heading = "Tracing (OpenTelemetry; off unless an OTLP endpoint is set)")]
pub struct TraceArgs {
    /// OTLP collector base URL (`http://collector:4318` for HTTP, `http://collector:4317` for
    /// gRPC); HTTP sends to its `/v1/traces`. Set: tracing on.
    #[arg(
        long = "otel-endpoint",
        env = "OTEL_EXPORTER_OTLP_ENDPOINT",
        value_name = "URL"
    )]
    pub endpoint: Option<String>,

    /// Full URL spans are sent to, used as given; takes precedence over `--otel-endpoint`.
    #[arg(
        long = "otel-traces-endpoint",
        env = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        value_name = "URL"
    )]
    pub traces_endpoint: Option<String>,

    /// OTLP transport: `http/protobuf` (default) or `grpc`.
    #[arg(long = "otel-protocol", env = "OTEL_EXPORTER_OTLP_PROTOCOL")]
    pub protocol: Option<String>,

    /// As `--otel-protocol`, for traces only; takes precedence.
    #[arg(
        long = "otel-traces-protocol",
        env = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
    )]
    pub traces_protocol: Option<String>,

    /// Headers sent with every export, `key=value,key2=value2` (values URL-encoded), e.g. a
    /// collector's API key.
    #[arg(
        long = "otel-headers",
        env = "OTEL_EXPORTER_OTLP_HEADERS",
        hide_env_values = true
    )]
    pub headers: Option<String>,

    /// As `--otel-headers`, for traces only; a key set in both takes this value.
    #[arg(
        long = "otel-traces-headers",
        env = "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
        hide_env_values = true
    )]
    pub traces_headers: Option<String>,

    /// How long one export may take, in milliseconds (default 10000).
    #[arg(
        long = "otel-timeout",
        env = "OTEL_EXPORTER_OTLP_TIMEOUT",
        value_name = "MS"
    )]
    pub timeout: Option<String>,

    /// As `--otel-timeout`, for traces only; takes precedence.
    #[arg(
        long = "otel-traces-timeout",
        env = "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
        value_name = "MS"
    )]
    pub traces_timeout: Option<String>,

    /// Which traces are recorded: `always_on`, `always_off`, `traceidratio`,
    /// `parentbased_always_on` (default), `parentbased_always_off`, `parentbased_traceidratio`.
    #[arg(long = "otel-traces-sampler", env = "OTEL_TRACES_SAMPLER")]
    pub sampler: Option<String>,

    /// The ratio of the `traceidratio` samplers, from 0 to 1 (default 1).
    #[arg(long = "otel-traces-sampler-arg", env = "OTEL_TRACES_SAMPLER_ARG")]
    pub sampler_arg: Option<String>,

    /// `service.name` of the spans (default: the program's name).
    #[arg(long = "otel-service-name", env = "OTEL_SERVICE_NAME")]
    pub service_name: Option<String>,

    /// More resource attributes, `key=value,key2=value2` (values URL-encoded), e.g.
    /// `deployment.environment.name=prod,k8s.cluster.name=eu1`.
    #[arg(long = "otel-resource-attributes", env = "OTEL_RESOURCE_ATTRIBUTES")]
    pub resource_attributes: Option<String>,

    /// `otlp` (default) or `none` (tracing off).
    #[arg(long = "otel-traces-exporter", env = "OTEL_TRACES_EXPORTER")]
    pub exporter: Option<String>,

    /// `true`: tracing off whatever else is set.
    #[arg(long = "otel-sdk-disabled", env = "OTEL_SDK_DISABLED", default_value = "false", value_parser = BoolishValueParser::new(), action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub sdk_disabled: bool,

    /// Finished spans waiting for export; beyond it spans are dropped (default 2048).
    #[arg(long = "otel-bsp-max-queue-size", env = "OTEL_BSP_MAX_QUEUE_SIZE")]
    pub max_queue_size: Option<String>,

    /// Spans per export, at most the queue size (default 512).
    #[arg(
        long = "otel-bsp-max-export-batch-size",
        env = "OTEL_BSP_MAX_EXPORT_BATCH_SIZE"
    )]
    pub max_export_batch_size: Option<String>,

    /// Milliseconds between two exports (default 5000).
    #[arg(
        long = "otel-bsp-schedule-delay",
        env = "OTEL_BSP_SCHEDULE_DELAY",
        value_name = "MS"
    )]
    pub schedule_delay: Option<String>,

    /// Milliseconds an export may take before the batch is given up (default 30000); an
    /// export is bounded by the shorter of this and `--otel-timeout`.
    #[arg(
        long = "otel-bsp-export-timeout",
        env = "OTEL_BSP_EXPORT_TIMEOUT",
        value_name = "MS"
    )]
    pub export_timeout: Option<String>,
}

/// A setting that cannot be used; its message names the variable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{setting}: {message}")]
pub struct SettingError {
    pub setting: &'static str,
    pub message: String,
}

fn bad(setting: &'static str, message: impl Into<String>) -> SettingError {
    SettingError {
        setting,
        message: message.into(),
    }
}

/// The OTLP transport (`OTEL_EXPORTER_OTLP_PROTOCOL`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Protocol {
    /// OTLP over gRPC (tonic).
    Grpc,
    /// OTLP over HTTP, protobuf bodies: the specification's default.
    #[default]
    HttpProtobuf,
}

impl FromStr for Protocol {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "grpc" => Ok(Self::Grpc),
            "http/protobuf" => Ok(Self::HttpProtobuf),
            "http/json" => Err("http/json is not supported: use http/protobuf or grpc".into()),
            other => Err(format!("{other:?} is not grpc or http/protobuf")),
        }
    }
}

/// `OTEL_TRACES_EXPORTER`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TracesExporter {
    #[default]
    Otlp,
    None,
}

/// The sampler names of `OTEL_TRACES_SAMPLER` this process knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SamplerName {
    AlwaysOn,
    AlwaysOff,
    TraceIdRatio,
    ParentBasedAlwaysOn,
    ParentBasedAlwaysOff,
    ParentBasedTraceIdRatio,
}

impl FromStr for SamplerName {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s.trim() {
            "always_on" => Self::AlwaysOn,
            "always_off" => Self::AlwaysOff,
            "traceidratio" => Self::TraceIdRatio,
            "parentbased_always_on" => Self::ParentBasedAlwaysOn,
            "parentbased_always_off" => Self::ParentBasedAlwaysOff,
            "parentbased_traceidratio" => Self::ParentBasedTraceIdRatio,
            other => {
                return Err(format!(
                    "{other:?} is not one of always_on, always_off, traceidratio, \
                     parentbased_always_on, parentbased_always_off, parentbased_traceidratio"
                ))
            }
        })
    }
}

/// Which traces are recorded: the decision for a trace that starts here (`root`), and whether
/// a caller's decision, from an incoming `traceparent`, is followed instead.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampler {
    pub parent_based: bool,
    /// The share of new traces recorded, 0 to 1 (`always_on` is 1, `always_off` 0).
    pub ratio: f64,
}

impl Sampler {
    pub(crate) fn to_sdk(self) -> opentelemetry_sdk::trace::Sampler {
        use opentelemetry_sdk::trace::Sampler as S;
        let root = if self.ratio >= 1.0 {
            S::AlwaysOn
        } else if self.ratio <= 0.0 {
            S::AlwaysOff
        } else {
            S::TraceIdRatioBased(self.ratio)
        };
        if self.parent_based {
            S::ParentBased(Box::new(root))
        } else {
            root
        }
    }
}

/// Batching of finished spans (`OTEL_BSP_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batch {
    pub max_queue_size: usize,
    pub max_export_batch_size: usize,
    pub schedule_delay: Duration,
}

/// Checked trace settings: where spans go, how, which are recorded, and as what service.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceSettings {
    /// The URL spans are sent to: for HTTP the full `/v1/traces` URL, for gRPC the collector.
    pub endpoint: http::Uri,
    pub protocol: Protocol,
    /// Sent with every export (lower-case names).
    pub headers: Vec<(String, String)>,
    /// How long one export may take: the shorter of the OTLP and the batch export timeouts.
    pub timeout: Duration,
    pub sampler: Sampler,
    pub service_name: String,
    /// `OTEL_RESOURCE_ATTRIBUTES`, `service.name` left out (it is [`TraceSettings::service_name`]).
    pub resource_attributes: Vec<(String, String)>,
    pub batch: Batch,
}

impl TraceSettings {
    pub(crate) fn resource(&self) -> opentelemetry_sdk::Resource {
        opentelemetry_sdk::Resource::builder_empty()
            .with_detector(Box::new(
                opentelemetry_sdk::resource::TelemetryResourceDetector,
            ))
            .with_attributes(
                self.resource_attributes
                    .iter()
                    .map(|(k, v)| KeyValue::new(k.clone(), v.clone())),
            )
            .with_service_name(self.service_name.clone())
            .build()
    }
}

/// A set value, surrounding whitespace removed; set but empty counts as unset, as the
/// specification says.
fn set(value: &Option<String>) -> Option<&str> {
    value.as_deref().map(str::trim).filter(|v| !v.is_empty())
}

fn millis(
    setting: &'static str,
    value: &Option<String>,
    default: u64,
) -> Result<Duration, SettingError> {
    match set(value) {
        None => Ok(Duration::from_millis(default)),
        Some(v) => v.parse::<u64>().map(Duration::from_millis).map_err(|_| {
            bad(
                setting,
                format!("{v:?} is not a whole number of milliseconds"),
            )
        }),
    }
}

fn count(
    setting: &'static str,
    value: &Option<String>,
    default: usize,
) -> Result<usize, SettingError> {
    match set(value) {
        None => Ok(default),
        Some(v) => match v.parse::<usize>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(bad(
                setting,
                format!("{v:?} is not a positive whole number"),
            )),
        },
    }
}

/// `key=value,key2=value2` with URL-encoded values (the W3C Baggage format the specification
/// uses for headers and resource attributes).
pub(crate) fn pairs(
    setting: &'static str,
    value: &str,
) -> Result<Vec<(String, String)>, SettingError> {
    let mut out = Vec::new();
    for item in value.split(',') {
        let item = item.trim();
        if item.is_empty() {
            continue;
        }
        let Some((key, val)) = item.split_once('=') else {
            return Err(bad(setting, format!("{item:?} is not key=value")));
        };
        let key = key.trim();
        if key.is_empty() {
            return Err(bad(setting, format!("{item:?} has no key")));
        }
        let val = percent_encoding::percent_decode_str(val.trim())
            .decode_utf8()
            .map_err(|_| {
                bad(
                    setting,
                    format!("{item:?}: the value is not URL-encoded UTF-8"),
                )
            })?;
        out.push((key.to_owned(), val.into_owned()));
    }
    Ok(out)
}

/// Whether a resource attribute names the process that carries it (its service, instance,
/// version, pod, container, host, node, namespace or workload) rather than the deployment it is
/// part of. What the OpenTelemetry Operator injects into a pod is mostly of this kind.
fn names_this_process(key: &str) -> bool {
    const KEYS: &[&str] = &[
        "service.name",
        "service.instance.id",
        "service.version",
        "cloud.availability_zone",
    ];
    const PREFIXES: &[&str] = &[
        "process.",
        "host.",
        "container.",
        "k8s.pod.",
        "k8s.container.",
        "k8s.node.",
        "k8s.namespace.",
        "k8s.deployment.",
        "k8s.replicaset.",
        "k8s.statefulset.",
        "k8s.daemonset.",
        "k8s.job.",
        "k8s.cronjob.",
    ];
    KEYS.contains(&key) || PREFIXES.iter().any(|p| key.starts_with(p))
}

/// `OTEL_RESOURCE_ATTRIBUTES` without the attributes that name this process, the others as
/// written (still URL-encoded).
fn deployment_attributes(value: &str) -> String {
    value
        .split(',')
        .map(str::trim)
        .filter(|item| {
            let key = item.split_once('=').map_or(*item, |(key, _)| key).trim();
            !item.is_empty() && !names_this_process(key)
        })
        .collect::<Vec<_>>()
        .join(",")
}

impl TraceArgs {
    /// The checked settings, or `None` when tracing is off (no endpoint, `OTEL_SDK_DISABLED`,
    /// or `OTEL_TRACES_EXPORTER=none`). `program` is the default `service.name`.
    ///
    /// # Errors
    /// A setting that is malformed or not supported, naming its variable.
    pub fn settings(&self, program: &str) -> Result<Option<TraceSettings>, SettingError> {
        let exporter = match set(&self.exporter) {
            None | Some("otlp") => TracesExporter::Otlp,
            Some("none") => TracesExporter::None,
            Some(other) => {
                return Err(bad(
                    "OTEL_TRACES_EXPORTER",
                    format!("{other:?} is not otlp or none"),
                ))
            }
        };
        if self.sdk_disabled || exporter == TracesExporter::None {
            return Ok(None);
        }
        let protocol = match (set(&self.traces_protocol), set(&self.protocol)) {
            (Some(p), _) => p
                .parse()
                .map_err(|e| bad("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", e))?,
            (None, Some(p)) => p
                .parse()
                .map_err(|e| bad("OTEL_EXPORTER_OTLP_PROTOCOL", e))?,
            (None, None) => Protocol::default(),
        };
        let (setting, endpoint) = match (set(&self.traces_endpoint), set(&self.endpoint)) {
            (Some(url), _) => ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", url.to_owned()),
            // The base URL: HTTP appends the signal's path, gRPC takes it as it is.
            (None, Some(base)) => (
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                match protocol {
                    Protocol::HttpProtobuf => format!("{}/v1/traces", base.trim_end_matches('/')),
                    Protocol::Grpc => base.to_owned(),
                },
            ),
            (None, None) => return Ok(None),
        };
        let endpoint: http::Uri = endpoint
            .parse()
            .map_err(|e| bad(setting, format!("{endpoint:?} is not a URL: {e}")))?;
        if !matches!(endpoint.scheme_str(), Some("http" | "https")) || endpoint.host().is_none() {
            return Err(bad(
                setting,
                format!("{endpoint} is not an http:// or https:// URL with a host"),
            ));
        }
        let mut headers = match set(&self.headers) {
            Some(h) => pairs("OTEL_EXPORTER_OTLP_HEADERS", h)?,
            None => Vec::new(),
        };
        if let Some(h) = set(&self.traces_headers) {
            for (key, value) in pairs("OTEL_EXPORTER_OTLP_TRACES_HEADERS", h)? {
                headers.retain(|(k, _)| !k.eq_ignore_ascii_case(&key));
                headers.push((key, value));
            }
        }
        for (key, value) in &mut headers {
            key.make_ascii_lowercase();
            if http::HeaderName::from_bytes(key.as_bytes()).is_err()
                || http::HeaderValue::from_str(value).is_err()
            {
                return Err(bad(
                    "OTEL_EXPORTER_OTLP_HEADERS",
                    format!("{key:?} is not a valid header"),
                ));
            }
        }
        let timeout = match set(&self.traces_timeout) {
            Some(_) => millis("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", &self.traces_timeout, 0)?,
            None => millis("OTEL_EXPORTER_OTLP_TIMEOUT", &self.timeout, 10_000)?,
        };
        let sampler = self.sampler()?;
        let mut resource_attributes = match set(&self.resource_attributes) {
            Some(attrs) => pairs("OTEL_RESOURCE_ATTRIBUTES", attrs)?,
            None => Vec::new(),
        };
        // `OTEL_SERVICE_NAME` wins over a `service.name` among the attributes.
        let named = resource_attributes
            .iter()
            .rposition(|(k, _)| k == "service.name")
            .map(|i| resource_attributes.remove(i).1);
        resource_attributes.retain(|(k, _)| k != "service.name");
        let service_name = set(&self.service_name)
            .map(str::to_owned)
            .or(named)
            .unwrap_or_else(|| program.to_owned());
        let max_queue_size = count("OTEL_BSP_MAX_QUEUE_SIZE", &self.max_queue_size, 2048)?;
        let max_export_batch_size = count(
            "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
            &self.max_export_batch_size,
            512,
        )?
        .min(max_queue_size);
        let batch = Batch {
            max_queue_size,
            max_export_batch_size,
            schedule_delay: millis("OTEL_BSP_SCHEDULE_DELAY", &self.schedule_delay, 5_000)?,
        };
        let timeout = timeout.min(millis(
            "OTEL_BSP_EXPORT_TIMEOUT",
            &self.export_timeout,
            30_000,
        )?);
        Ok(Some(TraceSettings {
            endpoint,
            protocol,
            headers,
            timeout,
            sampler,
            service_name,
            resource_attributes,
            batch,
        }))
    }

    /// The settings as the variables that set them, for the proxies a program starts or
    /// renders, so they trace as it does; empty while tracing is off. The export headers are
    /// left out (they may hold a credential, which a variable's value would show to whoever
    /// reads the pod), and so is the service name (each program has its own). Of the resource
    /// attributes only those that describe the deployment pass on: the ones that name this
    /// process (its service, pod, container, host, ...) would be wrong on a proxy.
    pub fn to_env(&self) -> Vec<(&'static str, String)> {
        if !matches!(self.settings("-"), Ok(Some(_))) {
            return Vec::new();
        }
        let given = |value: &Option<String>| set(value).map(str::to_owned);
        [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", given(&self.endpoint)),
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                given(&self.traces_endpoint),
            ),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", given(&self.protocol)),
            (
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
                given(&self.traces_protocol),
            ),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", given(&self.timeout)),
            (
                "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
                given(&self.traces_timeout),
            ),
            ("OTEL_TRACES_SAMPLER", given(&self.sampler)),
            ("OTEL_TRACES_SAMPLER_ARG", given(&self.sampler_arg)),
            (
                "OTEL_RESOURCE_ATTRIBUTES",
                set(&self.resource_attributes)
                    .map(deployment_attributes)
                    .filter(|a| !a.is_empty()),
            ),
            ("OTEL_BSP_MAX_QUEUE_SIZE", given(&self.max_queue_size)),
            (
                "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
                given(&self.max_export_batch_size),
            ),
            ("OTEL_BSP_SCHEDULE_DELAY", given(&self.schedule_delay)),
            ("OTEL_BSP_EXPORT_TIMEOUT", given(&self.export_timeout)),
        ]
        .into_iter()
        .filter_map(|(name, value)| value.map(|v| (name, v)))
        .collect()
    }

    fn sampler(&self) -> Result<Sampler, SettingError> {
        let name = match set(&self.sampler) {
            Some(name) => name
                .parse::<SamplerName>()
                .map_err(|e| bad("OTEL_TRACES_SAMPLER", e))?,
            None => SamplerName::ParentBasedAlwaysOn,
        };
        let ratio = match set(&self.sampler_arg) {
            None => 1.0,
            Some(arg) => match arg.parse::<f64>() {
                Ok(r) if (0.0..=1.0).contains(&r) => r,
                _ => {
                    return Err(bad(
                        "OTEL_TRACES_SAMPLER_ARG",
                        format!("{arg:?} is not a ratio from 0 to 1"),
                    ))
                }
            },
        };
        Ok(match name {
            SamplerName::AlwaysOn => Sampler {
                parent_based: false,
                ratio: 1.0,
            },
            SamplerName::AlwaysOff => Sampler {
                parent_based: false,
                ratio: 0.0,
            },
            SamplerName::TraceIdRatio => Sampler {
                parent_based: false,
                ratio,
            },
            SamplerName::ParentBasedAlwaysOn => Sampler {
                parent_based: true,
                ratio: 1.0,
            },
            SamplerName::ParentBasedAlwaysOff => Sampler {
                parent_based: true,
                ratio: 0.0,
            },
            SamplerName::ParentBasedTraceIdRatio => Sampler {
                parent_based: true,
                ratio,
            },
        })
    }
}
