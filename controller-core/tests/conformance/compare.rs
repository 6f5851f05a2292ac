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
    /// The request URL as the Go suite forms it, `<scheme>://<host><path>` with the host of
    /// `CalculateHost` (the gateway address, with the listener port unless it is the scheme's
    /// default): a relative `Location` is resolved against it.
    pub url: &'a str,
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

/// The status codes after which the Go client reads `Location` (`roundtripper.IsRedirect`):
/// 306 and codes past 308 are not among them.
pub fn is_redirect(status: u16) -> bool {
    matches!(status, 300..=305 | 307 | 308)
}

/// The redirect target of a response with a redirect code, as the Go client reads it on every
/// such response, expected or not (`Response.Location`): the first `Location` value, which
/// must be there and not be empty, resolved against the request URL. An error fails the round
/// trip before any comparison, so in a convergence loop it is one more failed attempt.
fn redirect_location(resp: &Response, url: &str) -> Result<(String, Location), String> {
    let first = resp
        .headers
        .get("location")
        .and_then(|values| values.first())
        .filter(|v| !v.is_empty())
        .ok_or_else(|| format!("status {} without a Location", resp.status))?;
    let resolved = resolve_location(url, first);
    let parsed = parse_location(&resolved)?;
    Ok((resolved, parsed))
}

pub fn compare(expect: &Expect, sent: &Sent<'_>, resp: &Response) -> Result<(), String> {
    let location = if is_redirect(resp.status) {
        Some(redirect_location(resp, sent.url)?)
    } else {
        None
    };
    let codes = expect.status.codes();
    if !status_ok(&codes, resp.status) {
        return Err(format!("status {} not in {codes:?}", resp.status));
    }
    if resp.status == 200 || resp.status == 204 {
        let captured = resp.echo.clone().unwrap_or_else(|| Echo {
            method: sent.method.to_owned(),
            ..Echo::default()
        });
        if expect.forwarded == Some(false) {
            if !captured.namespace.is_empty() || !captured.path.is_empty() {
                return Err(format!(
                    "answered by backend pod {:?}, expected the gateway to answer",
                    captured.pod
                ));
            }
            // The Go row's expected request still carries the method, which a JSON body must
            // echo (a body that is not JSON counts as the method sent); `request_seen`, when
            // present, compares it below.
            if expect.request_seen.is_none() && captured.method != sent.method {
                return Err(format!(
                    "answer echoes method {:?}, expected {:?}",
                    captured.method, sent.method
                ));
            }
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
    if let (Some((raw, got)), Some(redirect)) = (&location, &expect.redirect) {
        check_redirect(redirect, got, raw)?;
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

/// What Go's `Response.Location` makes of a `Location` header sent in answer to `base`: a
/// reference without a scheme is resolved against the request URL (`URL.ResolveReference`,
/// RFC 3986 section 5.2), so `/p`, `p`, `?q` and `//host/p` all name a full URL. An absolute
/// one is kept; its dot segments go in [`parse_location`], as Go removes them from both.
fn resolve_location(base: &str, location: &str) -> String {
    if has_scheme(location) {
        return location.to_owned();
    }
    let Some((scheme, rest)) = base.split_once("://") else {
        return location.to_owned();
    };
    if location.starts_with("//") {
        return format!("{scheme}:{location}");
    }
    let (authority, base_path) = rest.find('/').map_or((rest, ""), |i| rest.split_at(i));
    let base_path = base_path.split(['?', '#']).next().unwrap_or_default();
    let end = location.find(['?', '#']).unwrap_or(location.len());
    let (ref_path, suffix) = location.split_at(end);
    let path = if ref_path.is_empty() {
        base_path.to_owned()
    } else if ref_path.starts_with('/') {
        ref_path.to_owned()
    } else {
        // Merged with the base path up to its last `/`.
        let dir = base_path.rfind('/').map_or("", |i| &base_path[..=i]);
        format!("{dir}{ref_path}")
    };
    format!(
        "{scheme}://{authority}{}{suffix}",
        remove_dot_segments(&path)
    )
}

/// Whether a URI reference starts with a scheme (Go's `getScheme`): a letter, then letters,
/// digits, `+`, `-` or `.`, then `:`.
fn has_scheme(reference: &str) -> bool {
    let Some((scheme, _)) = reference.split_once(':') else {
        return false;
    };
    let mut chars = scheme.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
}

/// RFC 3986's `remove_dot_segments` on an escaped path, as Go's `resolvePath` applies it:
/// the result starts with `/` unless empty, and a final `.` or `..` leaves a trailing `/`.
/// Escaped dots (`%2e`) are not dot segments.
fn remove_dot_segments(path: &str) -> String {
    if path.is_empty() {
        return String::new();
    }
    let mut kept: Vec<&str> = Vec::new();
    let segments = path.strip_prefix('/').unwrap_or(path).split('/');
    let mut ends_in_dots = false;
    for segment in segments {
        ends_in_dots = matches!(segment, "." | "..");
        match segment {
            "." => {}
            ".." => {
                kept.pop();
            }
            s => kept.push(s),
        }
    }
    let mut out = format!("/{}", kept.join("/"));
    if ends_in_dots && !out.ends_with('/') {
        out.push('/');
    }
    out
}

/// Parses an absolute `Location` (see [`resolve_location`] for relative ones); a `Location`
/// still without a scheme fails.
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
        percent_decode(&remove_dot_segments(uri.path()))
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

/// Compares a parsed `Location` (`location` is its resolved text, for the messages).
fn check_redirect(want: &Redirect, got: &Location, location: &str) -> Result<(), String> {
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
    // Go removes dot segments from an absolute `Location` too; escaped dots stay.
    assert_eq!(parts("http://h/a/./b/../c"), ok("http", "h", "", b"/a/c"));
    assert_eq!(
        parts("http://h/a/%2e%2e/c"),
        ok("http", "h", "", b"/a/../c")
    );
}

#[test]
fn relative_locations_resolve_against_the_request_as_go_resolves_them() {
    let base = "http://10.0.0.1:80/dir/page?q=1";
    let resolved = |l: &str| resolve_location(base, l);
    assert_eq!(resolved("https://other/x"), "https://other/x");
    assert_eq!(resolved("/abs"), "http://10.0.0.1:80/abs");
    assert_eq!(resolved("rel"), "http://10.0.0.1:80/dir/rel");
    assert_eq!(resolved("../up?z"), "http://10.0.0.1:80/up?z");
    assert_eq!(resolved("./"), "http://10.0.0.1:80/dir/");
    assert_eq!(resolved(".."), "http://10.0.0.1:80/");
    assert_eq!(resolved("../../.."), "http://10.0.0.1:80/");
    assert_eq!(resolved("?other"), "http://10.0.0.1:80/dir/page?other");
    assert_eq!(resolved(""), "http://10.0.0.1:80/dir/page");
    assert_eq!(resolved("//cdn.example/p"), "http://cdn.example/p");
    assert_eq!(resolved("a:b"), "a:b", "a scheme: kept");
    assert_eq!(
        resolved("a/b:c"),
        "http://10.0.0.1:80/dir/a/b:c",
        "no scheme"
    );
    // As Go's `resolvePath`: empty segments are kept, `..` removes one of them.
    assert_eq!(resolved("/a//../b"), "http://10.0.0.1:80/a/b");

    // The parts the comparison then reads: the request URL has the gateway's host, and the
    // listener's port unless it is the scheme's default (`CalculateHost`).
    let redirect = |location: &str, port: Option<&str>| {
        let mut e = expect("status: 302");
        e.redirect = Some(Redirect {
            scheme: "http".to_owned(),
            host: None,
            port: port.map(str::to_owned),
            path: "/new".to_owned(),
        });
        (e, response(302, &[("location", location)], None))
    };
    let judge = |url: &str, (e, resp): (Expect, Response)| compare(&e, &sent("GET", url), &resp);
    assert_eq!(
        judge("http://127.0.0.1/old", redirect("/new", None)),
        Ok(())
    );
    assert!(judge("http://127.0.0.1/old", redirect("/other", None)).is_err());
    assert!(
        judge("http://127.0.0.1/old", redirect("/new", Some("80"))).is_err(),
        "a relative Location on port 80 has no port, and an expected 80 is compared as is"
    );
    assert!(
        judge("http://127.0.0.1:8080/old", redirect("/new", None)).is_err(),
        "a relative Location keeps the listener's port, which is not the default"
    );
    assert_eq!(
        judge("http://127.0.0.1:8080/old", redirect("/new", Some("8080"))),
        Ok(())
    );
}

#[cfg(test)]
fn expect(yaml: &str) -> Expect {
    serde_yaml_ng::from_str(yaml).expect("a valid expectation")
}

#[cfg(test)]
fn response(status: u16, headers: &[(&str, &str)], echo: Option<Echo>) -> Response {
    let mut map = std::collections::BTreeMap::<String, Vec<String>>::new();
    for (name, value) in headers {
        map.entry(name.to_ascii_lowercase())
            .or_default()
            .push((*value).to_owned());
    }
    Response {
        status,
        headers: map,
        echo,
    }
}

#[cfg(test)]
fn sent<'a>(method: &'a str, url: &'a str) -> Sent<'a> {
    Sent {
        method,
        uuid: None,
        request_id: None,
        url,
    }
}

#[test]
fn a_preflight_answer_must_not_echo_another_method() {
    let preflight = expect("status: [200, 204]\nforwarded: false");
    let url = "http://127.0.0.1/cors-1";
    let judge = |resp: &Response| compare(&preflight, &sent("OPTIONS", url), resp);
    // Not JSON: the captured method is the one sent.
    assert_eq!(judge(&response(204, &[], None)), Ok(()));
    // JSON `{}`: path and namespace are empty as expected, the method is empty, not OPTIONS.
    assert!(judge(&response(200, &[], Some(Echo::default()))).is_err());
    let gateway_echo = Echo {
        method: "OPTIONS".to_owned(),
        ..Echo::default()
    };
    assert_eq!(judge(&response(200, &[], Some(gateway_echo))), Ok(()));
    let backend = Echo {
        method: "OPTIONS".to_owned(),
        path: "/cors-1".to_owned(),
        namespace: "gateway-conformance-infra".to_owned(),
        pod: "infra-backend-v1-abc-def".to_owned(),
        ..Echo::default()
    };
    assert!(judge(&response(200, &[], Some(backend))).is_err());

    // A forwarded row compares the method once, through `request_seen`.
    let forwarded = expect("status: 200\nrequest_seen: {path: /p, method: GET}");
    let echo = Echo {
        method: "POST".to_owned(),
        path: "/p".to_owned(),
        ..Echo::default()
    };
    let err = compare(
        &forwarded,
        &sent("GET", url),
        &response(200, &[], Some(echo)),
    )
    .unwrap_err();
    assert!(err.contains("backend saw method"), "{err}");
}

#[test]
fn location_is_read_on_every_redirect_code_as_go_reads_it() {
    let url = "http://127.0.0.1/old";
    let judge = |status: u16, headers: &[(&str, &str)]| {
        compare(
            &expect(&format!("status: {status}")),
            &sent("GET", url),
            &response(status, headers, None),
        )
    };
    for status in [300, 301, 302, 303, 304, 305, 307, 308] {
        assert!(
            judge(status, &[]).is_err(),
            "{status} without a Location fails even with no redirect expected"
        );
        assert!(judge(status, &[("location", "")]).is_err(), "{status}");
        assert!(
            judge(status, &[("location", "http://h/%zz")]).is_err(),
            "{status}"
        );
        assert_eq!(
            judge(status, &[("location", "/elsewhere")]),
            Ok(()),
            "{status}"
        );
    }
    for status in [306, 309, 399, 200, 404] {
        assert_eq!(
            judge(status, &[]),
            Ok(()),
            "{status} is not a redirect code"
        );
    }
    // The status check does not save a bad Location: the round trip itself fails.
    assert!(compare(
        &expect("status: 404"),
        &sent("GET", url),
        &response(302, &[], None)
    )
    .is_err());

    // The first value counts, as `Header.Get` reads it.
    let mut e = expect("status: 302");
    e.redirect = Some(Redirect {
        scheme: "http".to_owned(),
        host: Some("a.example".to_owned()),
        port: None,
        path: "/new".to_owned(),
    });
    let two = response(
        302,
        &[
            ("location", "http://a.example/new"),
            ("location", "http://b.example/x"),
        ],
        None,
    );
    assert_eq!(compare(&e, &sent("GET", url), &two), Ok(()));
    let bad_first = response(
        302,
        &[
            ("location", "http://h/%zz"),
            ("location", "http://a.example/new"),
        ],
        None,
    );
    assert!(compare(&e, &sent("GET", url), &bad_first).is_err());
}
