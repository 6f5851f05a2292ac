//! The canonical form of a request path (RFC 3986 §6.2.2), written once for both sides of a
//! path match: the proxy routes, and forwards, each request on its path's canonical form, and
//! rule validation ([`valid::rule`](crate::valid::rule)) writes `Exact` and `PathPrefix` values
//! in the same form, so a value matches the requests that name the same path however either is
//! spelled (`/%7Ebob`, `/%7ebob` and `/~bob` are one path).

/// A `%` not followed by two hex digits: such a path has no canonical form, since decoding
/// beside it could make a new escape (`%2%65` reads `%2e` once `%65` is decoded). The proxy
/// refuses a request with one (400), as Go's server does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a `%` not followed by two hex digits")]
pub struct StrayPercent;

/// The canonical form of `path`; `Ok(None)` when it already is, as nearly every path is.
///
/// Percent-encoded unreserved characters (letters, digits, `-._~`) are decoded (§6.2.2.2) and
/// the hex digits of every other escape upper-cased (§6.2.2.1), then `.` and `..` segments are
/// removed and repeated slashes merged (§5.2.4), so a rule on `/admin` cannot be sidestepped by
/// a path a backend reads as `/admin` (`/%61dmin`, `/x/%2e%2e/admin`). Other escapes, `%2F`
/// among them, stay escapes: they do not name the same path.
///
/// # Errors
/// [`StrayPercent`] when a `%` starts no escape.
pub fn canonical(path: &str) -> Result<Option<String>, StrayPercent> {
    if !escapes_are_whole(path.as_bytes()) {
        return Err(StrayPercent);
    }
    Ok(without_dot_segments(path, canonical_escapes(path)))
}

/// Whether every `%` in `path` starts an escape: two hex digits follow it.
fn escapes_are_whole(path: &[u8]) -> bool {
    let mut rest = path;
    while let Some(at) = rest.iter().position(|&b| b == b'%') {
        match rest.get(at + 1..at + 3) {
            Some(&[hi, lo]) if hi.is_ascii_hexdigit() && lo.is_ascii_hexdigit() => {
                rest = rest.get(at + 3..).unwrap_or_default();
            }
            _ => return false,
        }
    }
    true
}

/// `path` with each escape as the canonical form writes it: an unreserved character as itself,
/// any other byte with upper-case hex digits; `None` when every escape already is, as in nearly
/// every path. Every `%` of `path` must start an escape ([`escapes_are_whole`]).
fn canonical_escapes(path: &str) -> Option<String> {
    const UPPER_HEX: &[u8; 16] = b"0123456789ABCDEF";
    let bytes = path.as_bytes();
    let (mut at, mut byte) = next_rewritten_escape(bytes, 0)?;
    let mut out = String::with_capacity(path.len());
    let mut copied = 0;
    loop {
        // `at` is at an ASCII `%` and escapes are three ASCII bytes: every cut is on a char
        // boundary.
        out.push_str(&path[copied..at]);
        if is_unreserved(byte) {
            out.push(char::from(byte));
        } else {
            out.push('%');
            out.push(char::from(UPPER_HEX[usize::from(byte >> 4)]));
            out.push(char::from(UPPER_HEX[usize::from(byte & 0xf)]));
        }
        copied = at + 3;
        match next_rewritten_escape(bytes, copied) {
            Some(next) => (at, byte) = next,
            None => break,
        }
    }
    out.push_str(&path[copied..]);
    Some(out)
}

/// The first escape at or after `from` that the canonical form writes otherwise (one of an
/// unreserved character, or with a lower-case hex digit): where it starts, and its byte.
fn next_rewritten_escape(bytes: &[u8], from: usize) -> Option<(usize, u8)> {
    let mut i = from;
    while let Some(offset) = bytes.get(i..)?.iter().position(|&b| b == b'%') {
        let at = i + offset;
        if let Some(&[hi, lo]) = bytes.get(at + 1..at + 3) {
            if let (Some(h), Some(l)) = (hex(hi), hex(lo)) {
                let byte = h << 4 | l;
                if is_unreserved(byte) || hi.is_ascii_lowercase() || lo.is_ascii_lowercase() {
                    return Some((at, byte));
                }
            }
        }
        i = at + 1;
    }
    None
}

fn hex(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        b'A'..=b'F' => Some(digit - b'A' + 10),
        _ => None,
    }
}

/// RFC 3986 §2.3.
fn is_unreserved(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~')
}

/// `path`, or `rewritten` (`path` with its escapes rewritten, when any were), with `.` and `..`
/// segments removed and repeated slashes merged; `None` when that changes nothing.
fn without_dot_segments(path: &str, rewritten: Option<String>) -> Option<String> {
    let path = match &rewritten {
        Some(rewritten) => rewritten.as_str(),
        None if is_normal(path.as_bytes()) => return None,
        None => path,
    };
    if is_normal(path.as_bytes()) {
        return rewritten;
    }
    let mut out: Vec<&str> = Vec::new();
    for seg in path.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                out.pop();
            }
            s => out.push(s),
        }
    }
    let trailing = path.ends_with('/') || path.ends_with("/.") || path.ends_with("/..");
    let mut normal = String::with_capacity(path.len());
    for seg in &out {
        normal.push('/');
        normal.push_str(seg);
    }
    if normal.is_empty() || (trailing && !out.is_empty()) {
        normal.push('/');
    }
    Some(normal)
}

/// Whether a path starts with `/` and has no empty, `.` or `..` segment: one pass over the
/// bytes, as nearly every request path is already normal.
fn is_normal(path: &[u8]) -> bool {
    if path.first() != Some(&b'/') {
        return false;
    }
    let mut i = 0;
    while i < path.len() {
        // `i` is at a `/`; look at the segment after it.
        let rest = &path[i + 1..];
        let seg_len = rest.iter().position(|&b| b == b'/').unwrap_or(rest.len());
        let seg = &rest[..seg_len];
        let last = i + 1 + seg_len == path.len();
        if (seg.is_empty() && !last) || seg == b"." || seg == b".." {
            return false;
        }
        i += 1 + seg_len;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn normal(path: &str) -> Option<String> {
        canonical(path).expect("every `%` starts an escape")
    }

    #[test]
    fn canonical_paths_follow_rfc_3986() {
        assert_eq!(normal("/a/b"), None);
        assert_eq!(normal("/a/./b").as_deref(), Some("/a/b"));
        assert_eq!(normal("/a/../b").as_deref(), Some("/b"));
        assert_eq!(
            normal("/../../b").as_deref(),
            Some("/b"),
            "never above the root"
        );
        assert_eq!(normal("//a///b/").as_deref(), Some("/a/b/"));
        assert_eq!(normal("/a/b/..").as_deref(), Some("/a/"));
        assert_eq!(normal("/..").as_deref(), Some("/"));
        assert_eq!(normal("/%61/%2e%2E/b").as_deref(), Some("/b"));
        assert_eq!(normal("/%7e%5F%2d%30").as_deref(), Some("/~_-0"));
        assert_eq!(normal("/é%41").as_deref(), Some("/éA"));
        for normal_path in ["/", "/a/", "/.a", "/..a/b.", "/a/.b/..c", "/a.../"] {
            assert_eq!(normal(normal_path), None, "{normal_path}");
        }
        assert_eq!(normal("/a//").as_deref(), Some("/a/"));
        assert_eq!(normal("/a/.").as_deref(), Some("/a/"));
        assert_eq!(normal("a/b").as_deref(), Some("/a/b"));
        assert_eq!(normal("").as_deref(), Some("/"));
    }

    #[test]
    fn other_escapes_stay_escapes_in_upper_case() {
        assert_eq!(normal("/a%2Fb%20c%C3%A9"), None, "already canonical");
        assert_eq!(normal("/a%2fb%20c").as_deref(), Some("/a%2Fb%20c"));
        assert_eq!(normal("/%c3%a9/%7e").as_deref(), Some("/%C3%A9/~"));
        assert_eq!(
            normal("/x/%2f%2e%2e/y").as_deref(),
            Some("/x/%2F../y"),
            "an encoded `/` separates no segment, so `%2F..` is no `..`"
        );
    }

    #[test]
    fn a_percent_that_starts_no_escape_has_no_canonical_form() {
        assert_eq!(canonical("/%6"), Err(StrayPercent), "a cut-off escape");
        assert_eq!(canonical("/%zz%"), Err(StrayPercent));
        assert_eq!(
            canonical("/x/%2%65"),
            Err(StrayPercent),
            "decoding `%65` would make `%2e`"
        );
        assert_eq!(canonical("/a%2Fb%7e").map(|p| p.is_some()), Ok(true));
    }
}
