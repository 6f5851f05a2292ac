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

/// The parts of a `Location` the Go suite compares, as Go's `url.URL` gives them: `Scheme`
/// (lower-cased), `Hostname()` (an IPv6 literal without its brackets), `Port()` (empty when
/// absent) and `Path` (percent-decoded; empty when the URI has none).
#[derive(Debug, PartialEq, Eq)]
struct Location {
    scheme: String,
    host: String,
    port: String,
    path: Vec<u8>,
}

/// Parses an absolute `Location`; a relative one has no scheme to compare and fails.
fn parse_location(location: &str) -> Result<Location, String> {
    let uri: http::Uri = location
        .parse()
        .map_err(|e| format!("Location {location:?} is not a URI: {e}"))?;
    let (Some(scheme), Some(authority)) = (uri.scheme_str(), uri.authority()) else {
        return Err(format!("Location {location:?} is not an absolute URI"));
    };
    let host = authority.host();
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let port = authority
        .port()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_default();
    // `Uri` reports "/" for "http://host"; Go's `Path` is empty there.
    let after_authority = location
        .find("://")
        .and_then(|i| location.get(i + 3 + authority.as_str().len()..))
        .unwrap_or_default();
    let path = if after_authority.starts_with('/') {
        percent_decode(uri.path())
            .ok_or_else(|| format!("Location {location:?} has an invalid percent escape"))?
    } else {
        Vec::new()
    };
    Ok(Location {
        scheme: scheme.to_ascii_lowercase(),
        host: host.to_owned(),
        port,
        path,
    })
}

/// Decodes `%XX` escapes as Go's `url.PathUnescape` does: `None` for a `%` not followed by two
/// hex digits; `+` stays `+`.
fn percent_decode(s: &str) -> Option<Vec<u8>> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3)?;
            if !hex.iter().all(u8::is_ascii_hexdigit) {
                return None;
            }
            out.push(u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    Some(out)
}

fn check_redirect(want: &Redirect, location: &str) -> Result<(), String> {
    let got = parse_location(location)?;
    if got.scheme != want.scheme {
        return Err(format!(
            "redirect scheme {:?} in {location:?}, expected {:?}",
            got.scheme, want.scheme
        ));
    }
    if let Some(h) = &want.host {
        if &got.host != h {
            return Err(format!(
                "redirect host {:?} in {location:?}, expected {h:?}",
                got.host
            ));
        }
    }
    let port = got.port.as_str();
    match &want.port {
        Some(p) if port != p => {
            return Err(format!(
                "redirect port {port:?} in {location:?}, expected {p:?}"
            ));
        }
        None => {
            let default = match got.scheme.as_str() {
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
    if got.path != want.path.as_bytes() {
        return Err(format!(
            "redirect path {:?} in {location:?}, expected {:?}",
            String::from_utf8_lossy(&got.path),
            want.path
        ));
    }
    Ok(())
}

#[test]
fn location_parts_as_go_reads_them() {
    let parts = |l: &str| parse_location(l).map(|p| (p.scheme, p.host, p.port, p.path));
    let ok = |scheme: &str, host: &str, port: &str, path: &[u8]| {
        Ok((
            scheme.to_owned(),
            host.to_owned(),
            port.to_owned(),
            path.to_vec(),
        ))
    };
    assert_eq!(
        parts("HTTPS://Example.org:8443/a%20b%2Fc+d?x=%41#f"),
        ok("https", "Example.org", "8443", b"/a b/c+d")
    );
    assert_eq!(parts("http://[::1]/p"), ok("http", "::1", "", b"/p"));
    assert_eq!(
        parts("http://[::1]:8080/p"),
        ok("http", "::1", "8080", b"/p")
    );
    assert_eq!(parts("http://u@h:/"), ok("http", "h", "", b"/"));
    assert_eq!(
        parts("http://example.org"),
        ok("http", "example.org", "", b"")
    );
    assert_eq!(
        parts("http://example.org?q=1"),
        ok("http", "example.org", "", b"")
    );
    assert!(parts("http://h/%zz").is_err());
    assert!(parts("http://h/%+1").is_err());
    assert!(parts("http://h/%4").is_err());
    assert!(parts("/relative").is_err());
}
