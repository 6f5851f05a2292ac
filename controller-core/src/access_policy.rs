//! `AccessPolicy` (`cf.k8s.lex.la/v1alpha1`): a Cloudflare Access requirement a route rule
//! names through an `ExtensionRef` filter, and the same fields as a Gateway-wide requirement
//! (`GatewayConfig.spec.access`). Requests the rule (or Gateway) serves must then carry a
//! valid Access token of the team for one of the audiences; the proxy answers others 403
//! without forwarding them (as cloudflared's `originRequest.access`).
//!
//! A rule's policy replaces its Gateway's: a route owner can name another team or audience
//! for their own rules, never none. The schema's bounds are the config contract's
//! ([`cftunnel_config::valid::access`]), so an object the API server admits is one the
//! proxy takes.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use cftunnel_config::valid;

/// The kind an `ExtensionRef` filter names to require Cloudflare Access on a rule.
pub const ACCESS_POLICY_KIND: &str = "AccessPolicy";

/// A Cloudflare Access requirement: a token of `teamName`'s Access for one of `audiences`.
#[derive(
    CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema,
)]
#[kube(
    group = "cf.k8s.lex.la",
    version = "v1alpha1",
    kind = "AccessPolicy",
    derive = "Default",
    namespaced,
    shortname = "cfaccess",
    printcolumn = r#"{"name": "Team", "type": "string", "jsonPath": ".spec.teamName"}"#,
    printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#,
    doc = "A Cloudflare Access requirement that HTTPRoute and GRPCRoute rules name with an ExtensionRef filter."
)]
#[serde(rename_all = "camelCase")]
pub struct AccessPolicySpec {
    /// The Zero Trust team name: tokens are issued by `https://<teamName>.cloudflareaccess.com`
    /// and verified with its published keys.
    #[schemars(
        length(min = 1, max = 63),
        pattern(r"^[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?$")
    )]
    pub team_name: String,
    /// Application audience (AUD) tags, as cloudflared's `audTag`: a token for any of them is
    /// accepted.
    #[schemars(length(min = 1, max = 64), inner(pattern(r"^[!-~]{1,256}$")))]
    pub audiences: Vec<String>,
}

impl AccessPolicySpec {
    /// The requirement as the config document carries it, checked by the contract the proxy
    /// applies.
    ///
    /// # Errors
    /// The field that breaks it (`teamName`, `audiences[1]`) and why.
    pub fn to_document(&self) -> Result<cftunnel_config::Access, valid::Invalid> {
        let doc = cftunnel_config::Access {
            team_name: self.team_name.clone(),
            audiences: self.audiences.clone(),
        };
        valid::access(&doc).map_err(|mut e| {
            e.field = e.field.trim_start_matches("access.").to_owned();
            e
        })?;
        Ok(doc)
    }
}
