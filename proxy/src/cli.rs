//! Command line and environment (every setting is both a flag and an env var).

use clap::builder::BoolishValueParser;
use clap::error::{ContextKind, ContextValue};
use clap::{CommandFactory, Parser, ValueEnum};
use std::ffi::{OsStr, OsString};
use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

/// Longest drain window accepted.
pub const MAX_GRACE: Duration = Duration::from_secs(180);

/// Gateway API proxy for Cloudflare Tunnel.
#[derive(Debug, Parser)]
#[command(name = "cftunnel-proxy", version)]
pub struct Args {
    /// Connector token (base64 JSON). Set: tunnel mode. Unset: standalone HTTP listener.
    #[arg(long, env = "TUNNEL_TOKEN", hide_env_values = true)]
    pub tunnel_token: Option<String>,

    /// File holding the connector token, e.g. a mounted Secret (as `cloudflared --token-file`);
    /// a non-empty `TUNNEL_TOKEN` takes precedence. Surrounding whitespace is ignored.
    #[arg(long, env = "TUNNEL_TOKEN_FILE")]
    pub tunnel_token_file: Option<PathBuf>,

    /// Data listener (standalone mode), e.g. `:8080` or `127.0.0.1:8080`.
    #[arg(long = "addr", env = "PROXY_ADDR", default_value = ":8080")]
    pub addr: ListenAddr,

    /// Client connections open at once on the data listener (standalone mode); at the limit,
    /// accepting pauses until one closes.
    #[arg(long, env = "PROXY_MAX_CONNECTIONS", default_value_t = 16384, value_parser = clap::value_parser!(u32).range(1..=1_048_576))]
    pub max_connections: u32,

    /// Config API, health and metrics listener.
    #[arg(
        long = "config-addr",
        env = "PROXY_CONFIG_ADDR",
        default_value = ":8081"
    )]
    pub config_addr: ListenAddr,

    /// Bearer token required by `/config`. Set but empty: refused. Unset: the API is open.
    #[arg(long, env = "PROXY_AUTH_TOKEN", hide_env_values = true)]
    pub auth_token: Option<String>,

    /// Drain window after the first SIGTERM (at most 3m).
    #[arg(long, env = "PROXY_GRACE_PERIOD", default_value = "30s")]
    pub grace_period: GracePeriod,

    /// Tunnel transport.
    #[arg(
        long,
        env = "PROXY_TUNNEL_PROTOCOL",
        value_enum,
        default_value = "auto"
    )]
    pub tunnel_protocol: TunnelProtocol,

    /// Strict post-quantum key exchange with the edge (as `cloudflared --post-quantum`):
    /// offer only X25519MLKEM768 and announce the `postquantum` feature.
    #[arg(long, env = "PROXY_TUNNEL_POST_QUANTUM", default_value = "false", value_parser = BoolishValueParser::new(), action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub tunnel_post_quantum: bool,

    /// Concurrent requests the edge may open on one tunnel connection, QUIC or HTTP/2; more wait
    /// at the edge. Each stream of credit a busy QUIC connection has used holds a few hundred bytes.
    #[arg(long, env = "PROXY_TUNNEL_QUIC_MAX_STREAMS", default_value_t = cftunnel_tunnel::DEFAULT_QUIC_MAX_STREAMS, value_parser = clap::value_parser!(u32).range(1..=1_048_576))]
    pub tunnel_quic_max_streams: u32,

    /// Serve Prometheus metrics on `/metrics`.
    #[arg(long, env = "PROXY_METRICS_ENABLED", default_value = "true", value_parser = BoolishValueParser::new(), action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub metrics_enabled: bool,

    /// Write one JSON line per request to stdout.
    #[arg(long, env = "PROXY_ACCESS_LOG_ENABLED", default_value = "false", value_parser = BoolishValueParser::new(), action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub access_log_enabled: bool,

    /// Access log lines carry the query string (`query`); it may hold tokens or personal data.
    #[arg(long, env = "PROXY_ACCESS_LOG_QUERY", default_value = "false", value_parser = BoolishValueParser::new(), action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub access_log_query: bool,

    /// Write the access log line of one request in N; failures (5xx, answers the proxy gave
    /// because it could not serve the request, responses cut off) are always written.
    #[arg(long, env = "PROXY_ACCESS_LOG_SAMPLE", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub access_log_sample: u32,

    /// Log lines on stderr: `json` (one object per line) or `text`.
    #[arg(long, env = "PROXY_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: cftunnel_telemetry::LogFormat,

    /// Largest config document `PUT /config` accepts, in bytes (1 KiB to 1 GiB); larger pushes
    /// get 413.
    #[arg(long, env = "PROXY_MAX_CONFIG_BYTES", default_value_t = crate::admin::DEFAULT_MAX_CONFIG_BYTES as u64, value_parser = clap::value_parser!(u64).range(1024..=1 << 30))]
    pub max_config_bytes: u64,

    /// Config document (the `PUT /config` JSON) to load at start.
    #[arg(long, env = "PROXY_CONFIG_FILE")]
    pub config_file: Option<PathBuf>,

    /// Runtime worker threads (default: one per CPU the process may use, its affinity capped by
    /// its cgroup CPU quota).
    #[arg(long, env = "PROXY_WORKER_THREADS")]
    pub worker_threads: Option<NonZeroUsize>,

    /// How long to wait for a backend's response head when a rule sets no backend timeout.
    #[arg(long, env = "PROXY_BACKEND_HEADER_TIMEOUT", default_value = "60s")]
    pub backend_header_timeout: GoDuration,

    /// How long a request body may send nothing, while no response has come, before the
    /// request is answered 408: a client that stalls mid-upload frees what it holds.
    #[arg(long, env = "PROXY_REQUEST_BODY_TIMEOUT", default_value = "60s")]
    pub request_body_timeout: GoDuration,

    /// How long a write to a client may stay blocked (it reads nothing of its response) before
    /// the response is dropped and its backend connection let go, as nginx's `send_timeout`:
    /// on the data listener, and on the tunnel, where that stream is reset. A response slow to
    /// come from its backend, or one the client reads slowly but steadily, is not cut.
    #[arg(long, env = "PROXY_SEND_TIMEOUT", default_value = "60s")]
    pub send_timeout: GoDuration,

    /// How long an upgraded (WebSocket) session may go with no bytes either way before it is
    /// closed; 0: never. Applications that ping their sockets are never cut by the default.
    #[arg(long, env = "PROXY_WEBSOCKET_IDLE_TIMEOUT", default_value = "1h")]
    pub websocket_idle_timeout: GoDuration,

    /// Connections open at once to one backend, HTTP/1.1 and HTTP/2 together; a request that
    /// finds them all busy waits for one within its backend timeout, then gets 503.
    #[arg(long, env = "PROXY_BACKEND_MAX_CONNECTIONS", default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..=1_048_576))]
    pub backend_max_connections: u32,

    /// The cluster's own address ranges (CIDRs, IPv4 and IPv6, comma-separated) that are
    /// globally routable: Service, pod or node ranges that are not private (GKE's
    /// Google-managed Service range, EKS's IPv6 pods, nodes with public IPs). `publicOnly`
    /// backends are never dialled there, as at loopback or private addresses.
    #[arg(long, env = "PROXY_CLUSTER_CIDRS", default_value = "")]
    pub cluster_cidrs: cftunnel_config::address::ClusterRanges,

    /// Cloudflare Access team domain, `{team}` standing for a rule's team name: the issuer its
    /// tokens must name, and where its signing keys are fetched
    /// (`<domain>/cdn-cgi/access/certs`).
    #[arg(long, env = "PROXY_ACCESS_TEAM_DOMAIN", default_value = crate::access::DEFAULT_TEAM_DOMAIN)]
    pub access_team_domain: String,

    /// How often a Cloudflare Access team's signing keys are fetched again.
    #[arg(long, env = "PROXY_ACCESS_KEYS_REFRESH", default_value = "5m")]
    pub access_keys_refresh: GoDuration,

    /// How long a team's last fetched keys keep serving while fetching them fails; after
    /// that, requests to its rules are refused (403) until a fetch succeeds.
    #[arg(long, env = "PROXY_ACCESS_KEYS_MAX_STALE", default_value = "24h")]
    pub access_keys_max_stale: GoDuration,

    /// Static edge address for the tunnel (repeatable); default: discovered via DNS.
    #[arg(long = "edge", env = "TUNNEL_EDGE", value_delimiter = ',')]
    pub edge: Vec<String>,

    /// Address family of the discovered edge: `4`, `6`, or `auto` (both; each region prefers
    /// the family the system orders first and moves to the other while that one fails).
    #[arg(
        long = "edge-ip-version",
        env = "TUNNEL_EDGE_IP_VERSION",
        default_value = "auto"
    )]
    pub edge_ip_version: cftunnel_tunnel::EdgeIpVersion,

    /// Edge region to connect to (as `cloudflared --region`, e.g. `us`); empty or unset: the
    /// global edge, or the token's own endpoint. Refused with a token that has an endpoint.
    #[arg(long = "region", env = "TUNNEL_REGION")]
    pub region: Option<String>,

    /// CA bundle (PEM) that edge certificates must chain to, for private test edges.
    #[arg(long = "edge-ca-file", env = "TUNNEL_CACERT")]
    pub edge_ca_file: Option<PathBuf>,

    /// Validate the config file and exit.
    #[arg(long)]
    pub check: bool,

    #[command(flatten)]
    pub traces: cftunnel_telemetry::TraceArgs,
}

/// The `service.name` of the proxy's spans unless `OTEL_SERVICE_NAME` says otherwise.
pub const SERVICE_NAME: &str = "cftunnel-proxy";

impl Args {
    /// Cross-field checks that clap cannot express.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(token) = &self.auth_token {
            // A token no pusher could present would leave the proxy unready without a word.
            match cftunnel_config::auth_token::check(token) {
                Ok(_) => {}
                Err(cftunnel_config::auth_token::AuthTokenError::Empty) => {
                    return Err("PROXY_AUTH_TOKEN is set but empty: set a token or unset it".into())
                }
                Err(e) => return Err(format!("PROXY_AUTH_TOKEN: {e}")),
            }
        }
        self.access_settings()
            .check()
            .map_err(|e| format!("PROXY_ACCESS_TEAM_DOMAIN: {e}"))?;
        if self.access_keys_refresh.0.is_zero() {
            return Err("PROXY_ACCESS_KEYS_REFRESH must be above 0".into());
        }
        if self.access_keys_max_stale.0 <= self.access_keys_refresh.0 {
            return Err(format!(
                "PROXY_ACCESS_KEYS_MAX_STALE ({:?}) must be longer than PROXY_ACCESS_KEYS_REFRESH ({:?}): \
                 keys are fetched again every refresh period, so shorter would refuse every Access \
                 token part of the time",
                self.access_keys_max_stale.0, self.access_keys_refresh.0
            ));
        }
        if self.backend_header_timeout.0.is_zero() {
            return Err(
                "PROXY_BACKEND_HEADER_TIMEOUT must be above 0 (at 0 every request would time out)"
                    .into(),
            );
        }
        if self.request_body_timeout.0.is_zero() {
            return Err(
                "PROXY_REQUEST_BODY_TIMEOUT must be above 0 (at 0 every request with a body would time out)"
                    .into(),
            );
        }
        if self.send_timeout.0.is_zero() {
            return Err(
                "PROXY_SEND_TIMEOUT must be above 0 (at 0 every response that waits for its client would be cut)"
                    .into(),
            );
        }
        if self.check && self.config_file.is_none() {
            return Err("--check needs --config-file".into());
        }
        self.traces
            .settings(SERVICE_NAME)
            .map_err(|e| e.to_string())?;
        Ok(())
    }
}

impl Args {
    /// How Cloudflare Access keys are fetched and kept, as the settings say.
    pub fn access_settings(&self) -> crate::access::AccessSettings {
        crate::access::AccessSettings {
            team_domain: self.access_team_domain.clone(),
            refresh: self.access_keys_refresh.0,
            max_stale: self.access_keys_max_stale.0,
            ..crate::access::AccessSettings::default()
        }
    }
}

impl Args {
    /// Reads the settings from the command line and the environment. A value that does not
    /// parse is printed and the process exits 2 (`--help` and `--version` print and exit 0);
    /// one that came from an environment variable is reported under the variable's name.
    pub fn parse_or_exit() -> Self {
        Self::try_parse().unwrap_or_else(|e| {
            let argv: Vec<OsString> = std::env::args_os().collect();
            name_the_variable(e, &mut Self::command(), &argv, |var| std::env::var_os(var)).exit()
        })
    }
}

/// `error` about a value that did not parse, reported under the environment variable the value
/// came from, if it came from one (clap names only the flag, and operators set variables):
/// `PROXY_GRACE_PERIOD=30: invalid duration "30": … (flag --grace-period)`. The value of a
/// setting whose value is secret is left out. Any other error is returned as it is.
fn name_the_variable(
    error: clap::Error,
    cmd: &mut clap::Command,
    argv: &[OsString],
    env: impl Fn(&OsStr) -> Option<OsString>,
) -> clap::Error {
    let (Some(ContextValue::String(invalid_arg)), Some(ContextValue::String(value))) = (
        error.get(ContextKind::InvalidArg),
        error.get(ContextKind::InvalidValue),
    ) else {
        return error;
    };
    // The built command renders each argument as clap's error names it.
    cmd.build();
    let Some(arg) = cmd.get_arguments().find(|a| a.to_string() == *invalid_arg) else {
        return error;
    };
    let (Some(var), Some(long)) = (arg.get_env(), arg.get_long()) else {
        return error;
    };
    let flag = format!("--{long}");
    // A flag on the command line wins over the variable: its value is the one refused.
    let on_command_line = argv.iter().skip(1).filter_map(|a| a.to_str()).any(|a| {
        a.strip_prefix(flag.as_str())
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('='))
    });
    if on_command_line || env(var).as_deref() != Some(OsStr::new(value)) {
        return error;
    }
    let reason = match error.get(ContextKind::ValidValue) {
        Some(ContextValue::Strings(valid)) if !valid.is_empty() => {
            match error.get(ContextKind::SuggestedValue) {
                Some(ContextValue::String(near)) => {
                    format!("not one of {} (did you mean {near}?)", valid.join(", "))
                }
                _ => format!("not one of {}", valid.join(", ")),
            }
        }
        _ => match std::error::Error::source(&error) {
            Some(source) => source.to_string(),
            None => return error,
        },
    };
    let var = var.to_string_lossy();
    let setting = if arg.is_hide_env_values_set() {
        var.into_owned()
    } else {
        format!("{var}={value}")
    };
    clap::Error::raw(error.kind(), format!("{setting}: {reason} (flag {flag})")).format(cmd)
}

/// A listen address, as Go's `net.Listen` takes it: `:PORT` means every address of both
/// families, and a host name (`localhost:8081`) its first address, IPv4 first.
#[derive(Debug, Clone, Copy)]
pub struct ListenAddr(pub SocketAddr);

impl FromStr for ListenAddr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(port) = s.strip_prefix(':') {
            return format!("[::]:{port}")
                .parse()
                .map(Self)
                .map_err(|_| format!("{s:?} is not an address like `:8080` or `127.0.0.1:8080`"));
        }
        if let Ok(addr) = s.parse() {
            return Ok(Self(addr));
        }
        // Resolved once, at start-up.
        let found: Vec<SocketAddr> = std::net::ToSocketAddrs::to_socket_addrs(s)
            .map_err(|e| {
                format!(
                    "{s:?} is not an address like `:8080` or `127.0.0.1:8080`, nor a host name \
                     and port that resolves: {e}"
                )
            })?
            .collect();
        found
            .iter()
            .find(|a| a.is_ipv4())
            .or(found.first())
            .copied()
            .map(Self)
            .ok_or_else(|| format!("{s:?} resolves to no address"))
    }
}

/// A Go-style duration (`30s`, `1m30s`).
#[derive(Debug, Clone, Copy)]
pub struct GoDuration(pub Duration);

impl FromStr for GoDuration {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.parse::<cftunnel_config::Duration>()
            .map(|d| Self(d.0))
            .map_err(|e| e.to_string())
    }
}

/// The drain window, capped at [`MAX_GRACE`]: a longer one is cut to it (the second field
/// keeps what was asked, so start-up can say so), as the Go proxy caps it.
#[derive(Debug, Clone, Copy)]
pub struct GracePeriod(pub Duration, pub Option<Duration>);

impl FromStr for GracePeriod {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let d = s.parse::<GoDuration>()?.0;
        if d > MAX_GRACE {
            return Ok(Self(MAX_GRACE, Some(d)));
        }
        Ok(Self(d, None))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TunnelProtocol {
    Auto,
    Quic,
    Http2,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        Args::try_parse_from(std::iter::once("cftunnel-proxy").chain(args.iter().copied()))
    }

    #[test]
    fn flags_parse_and_validate() {
        let a = parse(&[
            "--addr",
            ":9000",
            "--grace-period",
            "5s",
            "--tunnel-protocol",
            "quic",
        ])
        .expect("valid flags");
        assert_eq!(a.addr.0, "[::]:9000".parse().expect("addr"));
        assert_eq!(a.grace_period.0, Duration::from_secs(5));
        assert_eq!(a.tunnel_protocol, TunnelProtocol::Quic);
        assert!(!a.tunnel_post_quantum, "post-quantum is off by default");
        assert!(
            parse(&["--tunnel-post-quantum", "true"])
                .expect("bool flag")
                .tunnel_post_quantum
        );
        assert!(parse(&["--tunnel-post-quantum", "maybe"]).is_err());
        assert_eq!(a.tunnel_quic_max_streams, 16_384);
        assert_eq!(a.backend_max_connections, 1024);
        assert_eq!(a.max_connections, 16_384);
        assert_eq!(
            parse(&["--max-connections", "10"])
                .expect("in range")
                .max_connections,
            10
        );
        assert!(parse(&["--max-connections", "0"]).is_err());
        assert_eq!(
            parse(&["--backend-max-connections", "2"])
                .expect("in range")
                .backend_max_connections,
            2
        );
        assert!(parse(&["--backend-max-connections", "0"]).is_err());
        assert_eq!(
            parse(&["--tunnel-quic-max-streams", "1024"])
                .expect("in range")
                .tunnel_quic_max_streams,
            1024
        );
        assert!(parse(&["--tunnel-quic-max-streams", "0"]).is_err());
        assert!(parse(&["--tunnel-quic-max-streams", "1048577"]).is_err());
        let capped = parse(&["--grace-period", "4m"]).expect("grace over 3m is capped");
        assert_eq!(
            (capped.grace_period.0, capped.grace_period.1),
            (MAX_GRACE, Some(Duration::from_secs(240)))
        );
        assert_eq!(a.grace_period.1, None);
        // Boolean flags also stand alone, as Go's do.
        let bare = parse(&["--access-log-enabled", "--metrics-enabled", "--addr", ":1"])
            .expect("bare boolean flags");
        assert!(bare.access_log_enabled && bare.metrics_enabled);
        assert!(
            !parse(&["--metrics-enabled", "false"])
                .expect("explicit false")
                .metrics_enabled
        );
        assert!(parse(&["--tunnel-protocol", "udp"]).is_err());
        assert_eq!(a.edge_ip_version, cftunnel_tunnel::EdgeIpVersion::Auto);
        assert_eq!(
            parse(&["--edge-ip-version", "6"])
                .expect("edge ip version")
                .edge_ip_version,
            cftunnel_tunnel::EdgeIpVersion::V6
        );
        assert!(parse(&["--edge-ip-version", "ipv6"]).is_err());
        assert!(parse(&["--metrics-enabled", "maybe"]).is_err());
        assert!(parse(&["--addr", "nonsense"]).is_err());
        let empty = parse(&["--auth-token", ""]).expect("parses");
        assert!(empty.validate().is_err(), "empty token is refused");
        let unsendable = parse(&["--auth-token", "pässword"]).expect("parses");
        let err = unsendable
            .validate()
            .expect_err("a token no header carries is refused");
        assert!(err.starts_with("PROXY_AUTH_TOKEN: "), "{err}");
        assert!(!err.contains("pässword"), "the token is not shown: {err}");
        assert_eq!(a.access_log_sample, 1);
        assert_eq!(a.send_timeout.0, Duration::from_secs(60));
        let zero = parse(&["--send-timeout", "0"]).expect("parses");
        assert!(zero.validate().is_err(), "a send timeout of 0 is refused");
        assert_eq!(a.websocket_idle_timeout.0, Duration::from_secs(3600));
        let off = parse(&["--websocket-idle-timeout", "0"]).expect("0 switches it off");
        assert!(off.websocket_idle_timeout.0.is_zero());
        off.validate()
            .expect("a session idle timeout of 0 is valid");
        assert!(!a.access_log_query);
        assert!(parse(&["--access-log-sample", "0"]).is_err());
        let sampled = parse(&["--access-log-sample", "100", "--access-log-query"])
            .expect("access log settings");
        assert_eq!(
            (sampled.access_log_sample, sampled.access_log_query),
            (100, true)
        );
    }

    #[test]
    fn trace_settings_are_checked_with_the_rest() {
        let off = parse(&[]).expect("parses");
        assert_eq!(off.traces.settings(SERVICE_NAME), Ok(None));
        let on = parse(&[
            "--otel-endpoint",
            "http://collector:4318",
            "--otel-traces-sampler",
            "parentbased_traceidratio",
            "--otel-traces-sampler-arg",
            "0.1",
        ])
        .expect("parses");
        on.validate().expect("valid");
        let settings = on
            .traces
            .settings(SERVICE_NAME)
            .expect("valid")
            .expect("on");
        assert_eq!(settings.service_name, "cftunnel-proxy");
        assert_eq!(settings.endpoint, "http://collector:4318/v1/traces");
        let bad = parse(&[
            "--otel-endpoint",
            "http://c",
            "--otel-traces-sampler-arg",
            "x",
        ])
        .expect("parses");
        let err = bad.validate().expect_err("refused");
        assert!(err.starts_with("OTEL_TRACES_SAMPLER_ARG: "), "{err}");
    }
}
