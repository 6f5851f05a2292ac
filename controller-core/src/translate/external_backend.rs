//! backendRefs to an `ExternalBackend` ([`crate::external_backend`]): the URL its spec makes,
//! admitted as ExternalName Services are (`--external-name-backends`): refused under `deny`;
//! under `external` a name that means the cluster is refused ([`external_name::dial_host`]), as
//! is an IP literal that is not public ([`address::is_public`], the proxy's own rule) or is in
//! one of the cluster's own ranges (`--cluster-cidrs`, [`address::ClusterRanges`]), and the
//! proxy dials only public addresses outside those ranges of the rest (`publicOnly`); under
//! `any` dialled as
//! written. The host is read in lower case in every mode. Another namespace's needs a
//! ReferenceGrant there.
//!
//! An `https` one's `tls` is read with BackendTLSPolicy's code ([`backend_tls::settings`],
//! [`backend_tls::ca_certificates`]), with one difference: any CA reference that cannot be
//! used refuses the backendRef (the route's `ResolvedRefs` says why; requests get 500) rather
//! than the usable ones being kept, as nothing else reports on an ExternalBackend.
//!
//! A GRPCRoute's backends are all dialled over HTTP/2, this kind's too (the route forces the
//! protocol): h2c for `http`, HTTP/2 by ALPN for `https`.

use std::net::IpAddr;

use cftunnel_config::{address, BackendProtocol, BackendTls};

use super::backend_ref::{BackendRefError, BackendRefView, Resolved, ServiceUrl};
use super::backend_tls::{self, CaRef};
use super::external_name::{self, ExternalNameBackends, HostField, Refusal};
use super::field::Field;
use super::status::Reason;
use super::{Index, Options, RouteKind, GATEWAY_CONFIG_GROUP};
use crate::external_backend::{
    ExternalBackendScheme, ExternalBackendTls, SubjectAltNameType, EXTERNAL_BACKEND_KIND,
};

/// Why every ExternalBackend is refused under `--external-name-backends=deny`.
const DENIED: &str =
    "is refused: external backends are not admitted (--external-name-backends=deny)";

pub(super) fn resolve(
    r: BackendRefView<'_>,
    from: RouteKind,
    from_namespace: &str,
    field: Field<'_>,
    index: &Index<'_>,
    options: &Options,
) -> Result<Resolved<'static>, BackendRefError> {
    let namespace = r.namespace.unwrap_or(from_namespace);
    let refuse = |reason: Reason, message: String| BackendRefError::ExternalBackend {
        field: field.to_string(),
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
    // In lower case, as `url` writes it (DNS names are case-insensitive): one spelling for
    // every mode and check.
    let host = spec.dial_host();
    let host = host.as_str();
    let url = match mode {
        ExternalNameBackends::Deny => return Err(refuse(Reason::InvalidKind, DENIED.to_owned())),
        ExternalNameBackends::External => {
            let refused = |r| refuse(Reason::InvalidKind, format!("is refused: {r}"));
            external_url(url, host, options).map_err(refused)?
        }
        ExternalNameBackends::Any => url,
    };
    let tls = match (spec.scheme, &spec.tls) {
        (ExternalBackendScheme::Http, None) => None,
        (ExternalBackendScheme::Http, Some(_)) => {
            return Err(refuse(
                Reason::InvalidKind,
                "cannot be used: spec.tls: TLS settings need scheme https".to_owned(),
            ))
        }
        (ExternalBackendScheme::Https, settings) => {
            let mut tls = match settings {
                None => BackendTls::default(),
                Some(settings) => verification(settings, namespace, index)
                    .map_err(|(reason, message)| refuse(reason, message))?,
            };
            // An absolute name keeps its trailing dot out of SNI and the name verified.
            if tls.server_name.is_none() && url.contains(&format!("://{host}.:")) {
                tls.server_name = Some(host.to_owned());
            }
            Some(Box::new(tls))
        }
    };
    Ok(Resolved {
        urls: vec![url],
        service_url: ServiceUrl::Dialled,
        protocol: BackendProtocol::Http1,
        websocket: false,
        public_only: mode == ExternalNameBackends::External,
        tls,
        tls_refused: false,
        port: None,
        notice: None,
    })
}

/// The URL dialled under `--external-name-backends=external` for `url`, whose host is `host`,
/// or why it is refused.
fn external_url(url: String, host: &str, options: &Options) -> Result<String, Refusal> {
    let cluster_domain = &options.cluster_domain;
    match host.parse::<IpAddr>() {
        // The proxy would refuse every dial to it (`publicOnly`): refused here, with the reason,
        // rather than admitted with every request failing.
        Ok(ip) if !address::is_public(ip) => Err(Refusal::NotPublic(
            HostField::ExternalBackendHost.written(host),
        )),
        Ok(ip) => match options.cluster_ranges.containing(ip) {
            Some(range) => Err(Refusal::ClusterRange {
                host: HostField::ExternalBackendHost.written(host),
                range: range.to_string().into(),
            }),
            None => Ok(url),
        },
        Err(_) => {
            // The same judgement as an ExternalName Service's name, and the absolute name it
            // makes, so that the proxy pod's search domains never apply.
            let absolute = external_name::dial_host(
                host,
                HostField::ExternalBackendHost,
                ExternalNameBackends::External,
                cluster_domain,
            )?;
            Ok(url.replacen(&format!("://{host}:"), &format!("://{absolute}:"), 1))
        }
    }
}

/// The TLS settings `spec.tls` gives, or the reason and message refusing the backendRef.
fn verification(
    settings: &ExternalBackendTls,
    namespace: &str,
    index: &Index<'_>,
) -> Result<BackendTls, (Reason, String)> {
    let refs = settings.ca_certificate_refs.iter().map(|r| CaRef {
        group: &r.group,
        kind: &r.kind,
        name: &r.name,
    });
    let cas = backend_tls::ca_certificates(
        "spec.tls.caCertificateRefs",
        refs,
        namespace,
        &index.ca_sources(),
    );
    if let Some((reason, _)) = cas.problems.first() {
        let problems: Vec<&str> = cas.problems.iter().map(|(_, m)| m.as_str()).collect();
        return Err((*reason, format!("cannot be used: {}", problems.join("; "))));
    }
    let ca_bundle = (!settings.ca_certificate_refs.is_empty()).then_some(cas.bundle);
    let subject_alt_names = settings.subject_alt_names.iter().map(|san| match san.kind {
        SubjectAltNameType::Hostname => san.hostname.as_deref(),
        SubjectAltNameType::Uri => san.uri.as_deref(),
    });
    backend_tls::settings(
        "spec.tls",
        ca_bundle,
        settings.hostname.as_deref(),
        subject_alt_names,
    )
    .map_err(|message| (Reason::InvalidKind, format!("cannot be used: {message}")))
}
