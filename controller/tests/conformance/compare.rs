//! The comparison rules of `shared/gwapi/README.md` ("Comparison rules", mirroring the Go
//! suite's `CompareRoundTrip`).

use super::case::{Expect, HeaderExpect, Redirect};
use super::client::{Echo, Response};

/// The request as actually sent (after `{uuid}` and request-id substitution).
pub struct Sent<'a> {
    pub method: &'a str,
    /// What `{uuid}` was replaced with, and the request-id query appended, if any.
    pub uuid: Option<&'a str>,
    pub request_id: Option<&'a str>,
}

/// Applies the per-request substitutions to an expected path.
pub fn expected_path(path: &str, sent: &Sent<'_>) -> String {
    let mut path = match sent.uuid {
        Some(uuid) => path.replace("{uuid}", uuid),
        None => path.to_owned(),
    };
    if let Some(id) = sent.request_id {
        path = with_request_id(&path, id);
    }
    path
}

pub fn with_request_id(path: &str, id: &str) -> String {
    let sep = if path.contains('?') { '&' } else { '?' };
    format!("{path}{sep}gateway-api-conformance-request-id={id}")
}

pub fn status_ok(expected: &[u16], actual: u16) -> bool {
    let timeout = |c: u16| c == 408 || c == 504;
    expected.contains(&actual) || (timeout(actual) && expected.iter().any(|c| timeout(*c)))
}

pub fn compare(expect: &Expect, sent: &Sent<'_>, resp: &Response) -> Result<(), String> {
    let codes = expect.status.codes();
    if !status_ok(&codes, resp.status) {
        return Err(format!("status {} not in {codes:?}", resp.status));
    }
    if resp.status == 200 || resp.status == 204 {
        let captured = resp.echo.clone().unwrap_or_else(|| Echo {
            method: sent.method.to_owned(),
            ..Echo::default()
        });
        if expect.forwarded == Some(false)
            && (!captured.namespace.is_empty() || !captured.path.is_empty())
        {
            return Err(format!(
                "answered by backend pod {:?}, expected the gateway to answer",
                captured.pod
            ));
        }
        if let Some(backend) = &expect.backend {
            let (ns, svc) = backend.split_once('/').unwrap_or(("", backend));
            if captured.namespace != ns {
                return Err(format!(
                    "backend namespace {:?}, expected {ns:?}",
                    captured.namespace
                ));
            }
            if svc != "*" && !captured.pod.starts_with(svc) {
                return Err(format!(
                    "backend pod {:?}, expected one of {svc}",
                    captured.pod
                ));
            }
        }
        if let Some(seen) = &expect.request_seen {
            let path = expected_path(&seen.path, sent);
            if captured.path != path {
                return Err(format!(
                    "backend saw path {:?}, expected {path:?}",
                    captured.path
                ));
            }
            if let Some(host) = &seen.host {
                if &captured.host != host {
                    return Err(format!(
                        "backend saw host {:?}, expected {host:?}",
                        captured.host
                    ));
                }
            }
            if captured.method != seen.method {
                return Err(format!(
                    "backend saw method {:?}, expected {:?}",
                    captured.method, seen.method
                ));
            }
            for (name, want) in &seen.headers {
                let got = captured
                    .headers
                    .iter()
                    .find(|(k, _)| k.eq_ignore_ascii_case(name))
                    .map(|(_, v)| v.join(","));
                match got {
                    Some(got) if &got == want => {}
                    Some(got) => {
                        return Err(format!(
                            "backend saw header {name}: {got:?}, expected {want:?}"
                        ))
                    }
                    None => {
                        return Err(format!(
                            "backend did not see header {name} (expected {want:?})"
                        ))
                    }
                }
            }
            for name in &seen.absent_headers {
                if captured
                    .headers
                    .keys()
                    .any(|k| k.eq_ignore_ascii_case(name))
                {
                    return Err(format!("backend saw header {name}, expected it removed"));
                }
            }
        }
        for (name, want) in &expect.response_headers {
            let Some(got) = resp.header_joined(name) else {
                return Err(format!("response header {name} missing"));
            };
            let norm = |s: &str| {
                if expect.response_headers_ignore_whitespace {
                    s.replace(' ', "")
                } else {
                    s.to_owned()
                }
            };
            let ok = match want {
                HeaderExpect::Exact(v) => norm(v) == norm(&got),
                HeaderExpect::OneOf { one_of } => one_of.iter().any(|v| norm(v) == norm(&got)),
            };
            if !ok {
                return Err(format!(
                    "response header {name}: {got:?}, expected {want:?}"
                ));
            }
        }
        for name in &expect.absent_response_headers {
            if resp.header_joined(name).is_some() {
                return Err(format!("response header {name} present, expected absent"));
            }
        }
    }
    if (300..400).contains(&resp.status) {
        if let Some(redirect) = &expect.redirect {
            let location = resp
                .header_joined("location")
                .ok_or_else(|| "redirect without Location".to_owned())?;
            check_redirect(redirect, &location)?;
        }
    }
    Ok(())
}

fn check_redirect(want: &Redirect, location: &str) -> Result<(), String> {
    let (scheme, rest) = location.split_once("://").unwrap_or(("", location));
    let (authority, path_and_query) = match rest.find('/') {
        Some(i) if !scheme.is_empty() => (&rest[..i], &rest[i..]),
        None if !scheme.is_empty() => (rest, "/"),
        _ => ("", rest),
    };
    let path = path_and_query.split(['?', '#']).next().unwrap_or_default();
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || authority.starts_with('[') => (h, p),
        _ => (authority, ""),
    };
    if scheme != want.scheme {
        return Err(format!(
            "redirect scheme {scheme:?} in {location:?}, expected {:?}",
            want.scheme
        ));
    }
    if let Some(h) = &want.host {
        if host != h {
            return Err(format!(
                "redirect host {host:?} in {location:?}, expected {h:?}"
            ));
        }
    }
    match &want.port {
        Some(p) if port != p => {
            return Err(format!(
                "redirect port {port:?} in {location:?}, expected {p:?}"
            ));
        }
        None => {
            let default = match scheme {
                "http" => "80",
                "https" => "443",
                _ => "",
            };
            if !port.is_empty() && port != default {
                return Err(format!(
                    "redirect port {port:?} in {location:?}, expected none or {default}"
                ));
            }
        }
        Some(_) => {}
    }
    if path != want.path {
        return Err(format!(
            "redirect path {path:?} in {location:?}, expected {:?}",
            want.path
        ));
    }
    Ok(())
}
