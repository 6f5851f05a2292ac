//! Backends of kind `ServiceImport` (`multicluster.x-k8s.io`): dialled at the import's
//! cluster-set name, `name.namespace.svc.clusterset.local`, on the port the backendRef names,
//! which the import must export, as the Go controller does. Where the API server does not
//! serve the Multi-Cluster Services API the kind is not supported (`InvalidKind`), and a
//! reference from another namespace needs a ReferenceGrant to `ServiceImport` objects, as
//! one to a Service does.
//!
//! Ports speak HTTPS, HTTP/2 or WebSocket as a Service's do (their `appProtocol`, or port
//! 443); BackendTLSPolicies target Services, so none applies here.

use cftunnel_config::BackendTls;

use super::backend_ref::{AppProtocol, BackendRefError, BackendRefView, Resolved, ServiceUrl};
use super::field::Field;
use super::{Index, RouteKind};
use crate::service_import::{CLUSTERSET_DOMAIN, MULTICLUSTER_GROUP, SERVICE_IMPORT_KIND};

/// Whether a backendRef names a ServiceImport.
pub(super) fn is_service_import(r: &BackendRefView<'_>) -> bool {
    r.group == Some(MULTICLUSTER_GROUP) && r.kind == Some(SERVICE_IMPORT_KIND)
}

/// Resolves a backendRef naming a ServiceImport, of a route of `from` kind in
/// `from_namespace`.
pub(super) fn resolve(
    r: BackendRefView<'_>,
    from: RouteKind,
    from_namespace: &str,
    field: Field<'_>,
    index: &Index<'_>,
) -> Result<Resolved<'static>, BackendRefError> {
    let Some(imports) = &index.service_imports else {
        return Err(BackendRefError::InvalidKind {
            field: field.to_string(),
            group: MULTICLUSTER_GROUP.to_owned(),
            kind: format!(
                "{SERVICE_IMPORT_KIND} (the API server does not serve {MULTICLUSTER_GROUP}/v1alpha1)"
            ),
        });
    };
    let namespace = r.namespace.unwrap_or(from_namespace);
    if namespace != from_namespace
        && !index.reference_granted(
            from.as_str(),
            from_namespace,
            MULTICLUSTER_GROUP,
            SERVICE_IMPORT_KIND,
            namespace,
            r.name,
        )
    {
        return Err(BackendRefError::ServiceImportRefNotPermitted {
            field: field.to_string(),
            namespace: namespace.to_owned(),
            name: r.name.to_owned(),
        });
    }
    let Some(import) = imports.get(&(namespace, r.name)).copied() else {
        return Err(BackendRefError::ServiceImportNotFound {
            field: field.to_string(),
            namespace: namespace.to_owned(),
            name: r.name.to_owned(),
            port: None,
        });
    };
    let Some(port) = r.port else {
        return Err(BackendRefError::MissingPort {
            field: field.to_string(),
        });
    };
    let Some(exported) = import.spec.ports.iter().find(|p| p.port == port) else {
        return Err(BackendRefError::ServiceImportNotFound {
            field: field.to_string(),
            namespace: namespace.to_owned(),
            name: r.name.to_owned(),
            port: Some(port),
        });
    };
    let host = format!("{}.{namespace}.svc.{CLUSTERSET_DOMAIN}", r.name);
    let app_protocol = exported.app_protocol.as_deref();
    let app = AppProtocol::of(app_protocol);
    let tls = app.asks_tls(port).then(|| {
        Box::new(BackendTls {
            server_name: Some(host.clone()),
            ..BackendTls::default()
        })
    });
    let scheme = if tls.is_some() { "https" } else { "http" };
    let url = format!("{scheme}://{host}:{port}");
    // A GRPCRoute speaks h2c to every backend, whatever its port says.
    let notice = (app == AppProtocol::Unrecognised && from == RouteKind::Http).then(|| {
        BackendRefError::unrecognised_protocol(
            field,
            SERVICE_IMPORT_KIND,
            namespace,
            r.name,
            port,
            app_protocol,
        )
    });
    Ok(Resolved {
        urls: vec![url],
        service_url: ServiceUrl::Dialled,
        protocol: app.protocol(port),
        websocket: app.websocket(),
        public_only: false,
        tls,
        tls_refused: false,
        port: None,
        notice,
    })
}
