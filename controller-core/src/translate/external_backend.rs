//! backendRefs to an `ExternalBackend` ([`crate::external_backend`]): the URL its spec makes,
//! admitted as ExternalName Services are (`--external-name-backends`): refused under `deny`;
//! under `external` a name that means the cluster is refused ([`external_name::dial_host`]) and
//! the proxy dials only public addresses (`publicOnly`, also for IP literals); under `any`
//! dialled as written. Another namespace's needs a ReferenceGrant there.

use cftunnel_config::{BackendProtocol, BackendTls};

use super::backend::{BackendRefError, BackendRefView, Resolved};
use super::external_name::{self, ExternalNameBackends};
use super::status::Reason;
use super::{Index, Options, RouteKind, GATEWAY_CONFIG_GROUP};
use crate::external_backend::{ExternalBackendScheme, EXTERNAL_BACKEND_KIND};

pub(super) fn resolve(
    r: BackendRefView<'_>,
    from: RouteKind,
    from_namespace: &str,
    field: &str,
    index: &Index<'_>,
    options: &Options,
) -> Result<Resolved, BackendRefError> {
    let namespace = r.namespace.unwrap_or(from_namespace);
    let refuse = |reason: Reason, message: String| BackendRefError::ExternalBackend {
        field: field.to_owned(),
        namespace: namespace.to_owned(),
        name: r.name.to_owned(),
        reason,
        message,
    };
    if namespace != from_namespace
        && !index.reference_granted(
            from.as_str(),
            from_namespace,
            GATEWAY_CONFIG_GROUP,
            EXTERNAL_BACKEND_KIND,
            namespace,
            r.name,
        )
    {
        return Err(refuse(
            Reason::RefNotPermitted,
            "is in another namespace and no ReferenceGrant there permits the reference".to_owned(),
        ));
    }
    let Some(backend) = index.external_backends.get(&(namespace, r.name)) else {
        return Err(refuse(Reason::BackendNotFound, "not found".to_owned()));
    };
    let spec = &backend.spec;
    let url = spec
        .url()
        .map_err(|e| refuse(Reason::InvalidKind, format!("cannot be used: spec.{e}")))?;
    let mode = options.external_name_backends;
    let host = spec.dial_host();
    let is_ip = host.parse::<std::net::IpAddr>().is_ok();
    let url = match mode {
        ExternalNameBackends::Deny => {
            return Err(refuse(
                Reason::InvalidKind,
                "is refused: external backends are not admitted (--external-name-backends=deny)"
                    .to_owned(),
            ))
        }
        ExternalNameBackends::External if !is_ip => {
            // The same judgement as an ExternalName Service's name, and the absolute name it
            // makes, so that the proxy pod's search domains never apply.
            let absolute = external_name::dial_host(host, mode, &options.cluster_domain)
                .map_err(|refusal| refuse(Reason::InvalidKind, format!("is refused: {refusal}")))?;
            url.replacen(&format!("://{host}:"), &format!("://{absolute}:"), 1)
        }
        _ => url,
    };
    // An absolute name keeps its trailing dot out of SNI and the name verified.
    let tls = (spec.scheme == ExternalBackendScheme::Https
        && url.contains(&format!("://{host}.:")))
    .then(|| BackendTls {
        server_name: Some(host.to_owned()),
        ..BackendTls::default()
    });
    Ok(Resolved {
        urls: vec![url.clone()],
        service_url: url,
        protocol: BackendProtocol::Http1,
        websocket: false,
        public_only: mode == ExternalNameBackends::External,
        tls,
        tls_refused: false,
        port: None,
    })
}
