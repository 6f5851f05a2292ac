//! The Gateway API features this implementation supports (GEP-2162), published in every owned
//! GatewayClass's `status.supportedFeatures`.
//!
//! Conformance runners read that list to decide which tests to run, so it claims only what we
//! demonstrate: the features of the cases the conformance replay (`tests/conformance.rs`) runs
//! and passes, HTTPRoute and GRPCRoute cases alike, whose
//! `supported_features_are_the_ones_the_replayed_cases_exercise` test holds this list equal to
//! them.

/// Feature names exactly as the Go conformance suite spells them (`pkg/features` at
/// `kubernetes-sigs/gateway-api` `4564255ac2c3`, the commit the replayed cases come from; those
/// of its cases v1.6.1 lacks bring names a v1.6.1 runner does not know, and ignores), sorted
/// ascending: the spec requires `supportedFeatures` sorted by name.
///
/// Deliberately absent, because behind a tunnel every request arrives through the tunnel, so
/// a listener's port does not tell it apart and there is no TLS handshake with the Gateway:
/// `GatewayPort8080` (traffic to a listener on port 8080), `HTTPRouteParentRefPort` and
/// `HTTPRouteDestinationPortMatching` (routes bound or matched by listener port, which need
/// several listener ports) and `GatewayHTTPSListenerDetectMisdirectedRequests` (TLS listeners
/// and SNI, which terminate at Cloudflare's edge).
pub const SUPPORTED_FEATURES: &[&str] = &[
    "GRPCRoute",
    "GRPCRouteNamedRouteRule",
    "GRPCRouteRequestHeaderModifier",
    "Gateway",
    "GatewayHTTPListenerIsolation",
    "HTTPRoute",
    "HTTPRoute303RedirectStatusCode",
    "HTTPRoute307RedirectStatusCode",
    "HTTPRoute308RedirectStatusCode",
    "HTTPRouteBackendProtocolH2C",
    "HTTPRouteBackendProtocolWebSocket",
    "HTTPRouteBackendRequestHeaderModification",
    "HTTPRouteBackendRequestRedirect",
    "HTTPRouteBackendTimeout",
    "HTTPRouteBackendURLRewrite",
    "HTTPRouteCORS",
    "HTTPRouteHostRewrite",
    "HTTPRouteMethodMatching",
    "HTTPRouteNamedRouteRule",
    "HTTPRoutePathRedirect",
    "HTTPRoutePathRewrite",
    "HTTPRoutePortRedirect",
    "HTTPRouteQueryParamMatching",
    "HTTPRouteRequestMirror",
    "HTTPRouteRequestMultipleMirrors",
    "HTTPRouteRequestPercentageMirror",
    "HTTPRouteRequestTimeout",
    "HTTPRouteResponseHeaderModification",
    "HTTPRouteRetry",
    "HTTPRouteRetryBackendTimeout",
    "HTTPRouteRetryConnectionError",
    "HTTPRouteSchemeRedirect",
    "ReferenceGrant",
];

#[cfg(test)]
mod tests {
    use super::SUPPORTED_FEATURES;

    #[test]
    fn supported_features_are_sorted_by_name_without_repeats() {
        let mut sorted = SUPPORTED_FEATURES.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(SUPPORTED_FEATURES, sorted.as_slice());
    }
}
