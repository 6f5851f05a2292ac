//! The transcribed conformance case format (`shared/gwapi/README.md`, "Case file format", and
//! "GRPCRoute cases" for the rows of `grpc-cases/`).

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_yaml_ng::Value;

/// A case whose rows are `R`: HTTP rows and steps ([`Item`]) or gRPC rows ([`GrpcItem`]).
#[derive(Debug, Deserialize)]
pub struct Case<R = Item> {
    pub name: String,
    /// The Gateway API features the Go test lists (`SupportedFeature` names, verbatim).
    pub features: Vec<String>,
    /// Capabilities beyond plain HTTP/1.1 and echo backends the case needs.
    #[serde(default)]
    pub requires: Vec<String>,
    pub gateway: Vec<CaseGateway>,
    #[serde(default)]
    pub routes: Vec<Value>,
    #[serde(default)]
    pub extra_objects: Vec<Value>,
    #[serde(default)]
    pub status_checks: Vec<StatusCheck>,
    pub requests: Vec<R>,
}

/// A GRPCRoute case.
pub type GrpcCase = Case<GrpcItem>;

/// A status the Go test asserts: a route condition towards a parent, or a listener's
/// attached-route count and conditions.
#[derive(Debug, Deserialize)]
pub struct StatusCheck {
    pub kind: String,
    pub name: String,
    #[serde(default)]
    pub parent: Option<String>,
    #[serde(default, rename = "type")]
    pub condition: Option<String>,
    #[serde(default)]
    pub status: Option<String>,
    #[serde(default)]
    pub reason: Option<String>,
    #[serde(default)]
    pub listener: Option<String>,
    #[serde(default, rename = "attachedRoutes")]
    pub attached_routes: Option<i32>,
    #[serde(default)]
    pub conditions: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
pub struct CaseGateway {
    pub name: String,
    pub namespace: String,
    pub listeners: Vec<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Item {
    Step { step: Step },
    Request(Box<RequestItem>),
}

#[derive(Debug, Deserialize)]
pub struct Step {
    pub action: String,
    pub kind: String,
    pub namespace: String,
    pub name: String,
}

#[derive(Debug, Deserialize)]
pub struct RequestItem {
    pub id: usize,
    #[serde(default)]
    pub name: Option<String>,
    pub request: Request,
    pub expect: Expect,
    #[serde(default)]
    pub distribution: Option<Distribution>,
    #[serde(default)]
    pub mirror_distribution: Option<MirrorDistribution>,
    #[serde(default)]
    pub repeat: Option<Repeat>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Request {
    pub gateway: String,
    /// The listener port to connect to; absent = the scheme's default.
    #[serde(default)]
    pub port: Option<u16>,
    pub scheme: String,
    pub protocol: String,
    pub host: Option<String>,
    #[serde(default = "get")]
    pub method: String,
    pub path: String,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    #[serde(default)]
    pub backend_set_response_headers: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub add_request_id_query: bool,
    #[serde(default)]
    pub uuid_query_param: bool,
    /// TLS parameters (SNI, CA), only on rows sent to TLS listeners.
    #[serde(default)]
    pub tls: Option<Value>,
}

fn get() -> String {
    "GET".to_owned()
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    One(u16),
    Many(Vec<u16>),
}

impl OneOrMany {
    pub fn codes(&self) -> Vec<u16> {
        match self {
            Self::One(c) => vec![*c],
            Self::Many(v) => v.clone(),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum HeaderExpect {
    Exact(String),
    OneOf { one_of: Vec<String> },
}

#[derive(Debug, Clone, Deserialize)]
pub struct Expect {
    pub status: OneOrMany,
    #[serde(default)]
    pub forwarded: Option<bool>,
    #[serde(default)]
    pub backend: Option<String>,
    #[serde(default)]
    pub request_seen: Option<RequestSeen>,
    #[serde(default)]
    pub response_headers: BTreeMap<String, HeaderExpect>,
    #[serde(default)]
    pub response_headers_ignore_whitespace: bool,
    #[serde(default)]
    pub absent_response_headers: Vec<String>,
    #[serde(default)]
    pub redirect: Option<Redirect>,
    #[serde(default)]
    pub mirrored_to: Vec<Mirrored>,
    #[serde(default)]
    pub websocket_exchange: Vec<WsFrame>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct RequestSeen {
    pub path: String,
    #[serde(default)]
    pub host: Option<String>,
    pub method: String,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    #[serde(default)]
    pub absent_headers: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Redirect {
    pub scheme: String,
    #[serde(default)]
    pub host: Option<String>,
    #[serde(default)]
    pub port: Option<String>,
    pub path: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Mirrored {
    pub backend: String,
    #[serde(default)]
    pub percent: Option<u32>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct WsFrame {
    #[serde(default)]
    pub send_text: Option<String>,
    #[serde(default)]
    pub expect_text: Option<String>,
    #[serde(default)]
    pub send_binary: Option<Vec<u8>>,
    #[serde(default)]
    pub expect_binary: Option<Vec<u8>>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Distribution {
    pub requests: usize,
    pub concurrency: usize,
    pub expected_fraction: BTreeMap<String, f64>,
    pub tolerance_abs: f64,
    pub max_attempts: usize,
}

#[derive(Debug, Clone, Deserialize)]
pub struct MirrorDistribution {
    pub requests: usize,
    pub concurrency: usize,
    pub backend: String,
    pub percent: u32,
    pub accept_range: [f64; 2],
    pub max_attempts: usize,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Repeat {
    pub count: usize,
}

/// One row of a GRPCRoute case: a unary call.
#[derive(Debug, Deserialize)]
pub struct GrpcItem {
    pub id: usize,
    #[serde(default)]
    pub name: Option<String>,
    pub request: GrpcRequest,
    pub expect: GrpcExpect,
    /// What the manifest implies beyond the upstream assertions (README rule 6).
    #[serde(default)]
    pub derived_not_upstream: Option<Derived>,
    #[serde(default)]
    pub distribution: Option<Distribution>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct GrpcRequest {
    pub gateway: String,
    #[serde(default)]
    pub port: Option<u16>,
    pub scheme: String,
    pub protocol: String,
    /// `:authority`; `None` = the Gateway address as dialled, `IP:port`.
    pub authority: Option<String>,
    pub service: String,
    pub method: String,
    pub path: String,
    /// The request message: `EchoRequest` has no fields, so it must be empty.
    #[serde(default)]
    pub message: BTreeMap<String, Value>,
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct GrpcExpect {
    pub code: i32,
    pub code_name: String,
    #[serde(default)]
    pub backend: Option<String>,
    #[serde(default)]
    pub fully_qualified_method: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Derived {
    pub matched_rule: usize,
    #[serde(default)]
    pub request_metadata_seen: BTreeMap<String, String>,
    #[serde(default)]
    pub absent_metadata: Vec<String>,
}
