//! Parsing of Kubernetes manifests (multi-document YAML or JSON, `kind: List` included) into a
//! [`Snapshot`]. Kinds the translation does not read are skipped; so are documents that are
//! empty. Parsing is pure: reading files is the caller's business.

use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_yaml_ng::Value;

use crate::access_policy::ACCESS_POLICY_KIND;
use crate::external_backend::EXTERNAL_BACKEND_KIND;
use crate::gateway_class_config::GATEWAY_CLASS_CONFIG_KIND;
use crate::service_import::{MULTICLUSTER_GROUP, SERVICE_IMPORT_KIND};
use crate::snapshot::{
    Snapshot, EXPERIMENTAL_GATEWAY_API_GROUP, GATEWAY_API_GROUP, GATEWAY_CONFIG_GROUP,
    GATEWAY_CONFIG_KIND,
};

/// The CustomResourceDefinition of ServiceImport.
const SERVICE_IMPORTS_CRD: &str = "serviceimports.multicluster.x-k8s.io";

/// Why a manifest could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("{source_name}: document {document}: invalid YAML: {error}")]
    Yaml {
        source_name: String,
        document: usize,
        error: serde_yaml_ng::Error,
    },
    #[error("{source_name}: document {document}: invalid {kind} {name}: {error}")]
    Object {
        source_name: String,
        document: usize,
        kind: String,
        name: String,
        error: serde_yaml_ng::Error,
    },
}

/// Adds every object of `text` (named `source_name` in errors) to `snapshot`; returns how many
/// objects were added. Manifests are the whole input, so the CustomResourceDefinitions among
/// them are all there are: after a load, `snapshot`'s CRDs are known (an empty list when none
/// were given), never unreadable.
///
/// # Errors
/// A document that is not YAML, or an object of a known kind that does not match its schema.
pub fn load_into(
    snapshot: &mut Snapshot,
    text: &str,
    source_name: &str,
) -> Result<usize, ManifestError> {
    snapshot
        .custom_resource_definitions
        .get_or_insert_with(Vec::new);
    let mut added = 0;
    for (i, doc) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        let document = i + 1;
        let value = Value::deserialize(doc).map_err(|error| ManifestError::Yaml {
            source_name: source_name.to_owned(),
            document,
            error,
        })?;
        added += add_value(snapshot, value, source_name, document)?;
    }
    Ok(added)
}

fn add_value(
    snapshot: &mut Snapshot,
    value: Value,
    source_name: &str,
    document: usize,
) -> Result<usize, ManifestError> {
    let kind = value
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let api_version = value
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let group = api_version.rsplit_once('/').map(|(g, _)| g).unwrap_or("");
    let name = value
        .get("metadata")
        .and_then(|m| m.get("name"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    fn object<T: DeserializeOwned>(
        value: Value,
        source_name: &str,
        document: usize,
        kind: &str,
        name: &str,
    ) -> Result<Arc<T>, ManifestError> {
        serde_yaml_ng::from_value(value)
            .map(Arc::new)
            .map_err(|error| ManifestError::Object {
                source_name: source_name.to_owned(),
                document,
                kind: kind.to_owned(),
                name: name.to_owned(),
                error,
            })
    }
    let gw = group == GATEWAY_API_GROUP;
    match (group, kind.as_str()) {
        (_, "List") => {
            let mut added = 0;
            if let Some(Value::Sequence(items)) = value.get("items").cloned() {
                for item in items {
                    added += add_value(snapshot, item, source_name, document)?;
                }
            }
            return Ok(added);
        }
        (_, "GatewayClass") if gw => {
            snapshot
                .gateway_classes
                .push(object(value, source_name, document, &kind, &name)?)
        }
        (_, "Gateway") if gw => {
            snapshot
                .gateways
                .push(object(value, source_name, document, &kind, &name)?)
        }
        (_, "HTTPRoute") if gw => {
            snapshot
                .http_routes
                .push(object(value, source_name, document, &kind, &name)?)
        }
        (_, "GRPCRoute") if gw => {
            snapshot
                .grpc_routes
                .push(object(value, source_name, document, &kind, &name)?)
        }
        (_, "BackendTLSPolicy") if gw => {
            snapshot
                .backend_tls_policies
                .push(object(value, source_name, document, &kind, &name)?)
        }
        ("", "ConfigMap") => {
            snapshot
                .config_maps
                .push(object(value, source_name, document, &kind, &name)?)
        }
        (_, "ReferenceGrant") if gw => {
            snapshot
                .reference_grants
                .push(object(value, source_name, document, &kind, &name)?)
        }
        (_, "ListenerSet") if gw => {
            snapshot
                .listener_sets
                .push(object(value, source_name, document, &kind, &name)?)
        }
        (EXPERIMENTAL_GATEWAY_API_GROUP, "XListenerSet") => {
            snapshot
                .listener_sets
                .push(object(value, source_name, document, &kind, &name)?)
        }
        ("", "Namespace") => {
            snapshot
                .namespaces
                .push(object(value, source_name, document, &kind, &name)?)
        }
        ("", "Service") => {
            snapshot
                .services
                .push(object(value, source_name, document, &kind, &name)?)
        }
        ("", "Secret") => {
            snapshot
                .secrets
                .push(object(value, source_name, document, &kind, &name)?)
        }
        (GATEWAY_CONFIG_GROUP, GATEWAY_CONFIG_KIND) => {
            snapshot
                .gateway_configs
                .push(object(value, source_name, document, &kind, &name)?)
        }
        (GATEWAY_CONFIG_GROUP, EXTERNAL_BACKEND_KIND) => {
            snapshot
                .external_backends
                .push(object(value, source_name, document, &kind, &name)?)
        }
        (GATEWAY_CONFIG_GROUP, GATEWAY_CLASS_CONFIG_KIND) => snapshot
            .gateway_class_configs
            .push(object(value, source_name, document, &kind, &name)?),
        (MULTICLUSTER_GROUP, SERVICE_IMPORT_KIND) => snapshot
            .service_imports
            .get_or_insert_with(Vec::new)
            .push(object(value, source_name, document, &kind, &name)?),
        (GATEWAY_CONFIG_GROUP, ACCESS_POLICY_KIND) => {
            snapshot
                .access_policies
                .push(object(value, source_name, document, &kind, &name)?)
        }
        ("discovery.k8s.io", "EndpointSlice") => {
            snapshot
                .endpoint_slices
                .push(object(value, source_name, document, &kind, &name)?)
        }
        // Only the metadata is read (the bundle version of Gateway API's CRDs).
        ("apiextensions.k8s.io", "CustomResourceDefinition") => {
            // Manifests holding the ServiceImport CRD serve that API.
            if name == SERVICE_IMPORTS_CRD {
                snapshot.service_imports.get_or_insert_with(Vec::new);
            }
            let metadata = value.get("metadata").cloned().unwrap_or(Value::Null);
            snapshot
                .custom_resource_definitions
                .get_or_insert_with(Vec::new)
                .push(Arc::unwrap_or_clone(object(
                    metadata,
                    source_name,
                    document,
                    &kind,
                    &name,
                )?))
        }
        _ => return Ok(0),
    }
    Ok(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multi_document_yaml_fills_the_snapshot_and_skips_other_kinds() {
        let text = r#"
apiVersion: v1
kind: Namespace
metadata: {name: apps, labels: {team: a}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: edge, namespace: apps}
spec:
  gatewayClassName: cloudflare-tunnel
  listeners: [{name: http, port: 80, protocol: HTTP}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: apps}
---
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Service
  metadata: {name: web, namespace: apps}
  spec: {ports: [{port: 80, targetPort: 8080}]}
- apiVersion: gateway.networking.k8s.io/v1beta1
  kind: ReferenceGrant
  metadata: {name: g, namespace: apps}
  spec:
    from: [{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: other}]
    to: [{group: "", kind: Service}]
"#;
        let mut snapshot = Snapshot::default();
        let added = load_into(&mut snapshot, text, "test.yaml").expect("manifest parses");
        assert_eq!(added, 4);
        assert_eq!(snapshot.namespaces.len(), 1);
        assert_eq!(snapshot.gateways.len(), 1);
        assert_eq!(snapshot.gateways[0].spec.listeners[0].port, 80);
        assert_eq!(snapshot.services.len(), 1);
        assert_eq!(snapshot.reference_grants.len(), 1);
        assert_eq!(
            snapshot.custom_resource_definitions,
            Some(Vec::new()),
            "no CRD among them: none, but not unreadable"
        );
    }

    #[test]
    fn a_custom_resource_definition_contributes_its_metadata() {
        let text = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: gateways.gateway.networking.k8s.io
  annotations: {gateway.networking.k8s.io/bundle-version: v1.6.1}
spec: {group: gateway.networking.k8s.io, names: {kind: Gateway, plural: gateways}, scope: Namespaced}
"#;
        let mut snapshot = Snapshot::default();
        assert_eq!(load_into(&mut snapshot, text, "crds.yaml").ok(), Some(1));
        let crds = snapshot
            .custom_resource_definitions
            .expect("read from the manifests");
        let meta = &crds[0];
        assert_eq!(
            meta.name.as_deref(),
            Some("gateways.gateway.networking.k8s.io")
        );
        assert_eq!(
            meta.annotations
                .as_ref()
                .and_then(|a| a.get("gateway.networking.k8s.io/bundle-version"))
                .map(String::as_str),
            Some("v1.6.1")
        );
    }

    #[test]
    fn an_object_that_does_not_match_its_schema_names_the_document() {
        let text = "kind: Namespace\napiVersion: v1\nmetadata: {name: a}\n---\napiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: edge}\nspec: {listeners: 3}\n";
        let mut snapshot = Snapshot::default();
        let err = load_into(&mut snapshot, text, "bad.yaml").expect_err("schema mismatch");
        let message = err.to_string();
        assert!(
            message.starts_with("bad.yaml: document 2: invalid Gateway edge:"),
            "{message}"
        );
    }
}
