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
/// among them, stay escapes: they do not name the same path. Bytes a path may not carry as
/// they are (§3.3: anything past ASCII, `"`, `<`, `>`, `\`, `^`, `` ` ``, `{`, `|`, `}` and the
/// like) are encoded, as browsers send them: `/été` and `/%C3%A9t%C3%A9` are one path.
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

/// `path` with each escape as the canonical form writes it (an unreserved character as
/// itself, any other byte with upper-case hex digits) and each byte a path may not carry as it
/// is encoded; `None` when nothing changes, as in nearly every path. Every `%` of `path` must
/// start an escape ([`escapes_are_whole`]).
fn canonical_escapes(path: &str) -> Option<String> {
    const UPPER_HEX: &[u8; 16] = b"0123456789ABCDEF";
    let bytes = path.as_bytes();
    let (mut at, mut rewrite) = next_rewrite(bytes, 0)?;
    // Bytes, not a `String`: a byte past ASCII is cut out of the middle of its character. All
    // such bytes are encoded, so what is written is ASCII.
    let mut out = Vec::with_capacity(path.len() + 8);
    let mut copied = 0;
    loop {
        out.extend_from_slice(bytes.get(copied..at).unwrap_or_default());
        let (byte, len) = match rewrite {
            Rewrite::Escape(byte) => (byte, 3),
            Rewrite::Raw(byte) => (byte, 1),
        };
        if len == 3 && is_unreserved(byte) {
            out.push(byte);
        } else {
            out.extend_from_slice(&[
                b'%',
                UPPER_HEX[usize::from(byte >> 4)],
                UPPER_HEX[usize::from(byte & 0xf)],
            ]);
        }
        copied = at + len;
        match next_rewrite(bytes, copied) {
            Some(next) => (at, rewrite) = next,
            None => break,
        }
    }
    out.extend_from_slice(bytes.get(copied..).unwrap_or_default());
    Some(String::from_utf8(out).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into()))
}

/// What the canonical form writes otherwise at one place of a path.
#[derive(Clone, Copy)]
enum Rewrite {
    /// An escape of this byte, of an unreserved character or with a lower-case hex digit.
    Escape(u8),
    /// This byte, which a path may not carry as it is.
    Raw(u8),
}

/// The first place at or after `from` that the canonical form writes otherwise, and what is
/// there.
fn next_rewrite(bytes: &[u8], from: usize) -> Option<(usize, Rewrite)> {
    let mut i = from;
    while let Some(offset) = bytes
        .get(i..)?
        .iter()
        .position(|&b| b == b'%' || !RAW_IN_PATH[usize::from(b)])
    {
        let at = i + offset;
        let byte = bytes.get(at).copied()?;
        if byte != b'%' {
            return Some((at, Rewrite::Raw(byte)));
        }
        if let Some(&[hi, lo]) = bytes.get(at + 1..at + 3) {
            if let (Some(h), Some(l)) = (hex(hi), hex(lo)) {
                let byte = h << 4 | l;
                if is_unreserved(byte) || hi.is_ascii_lowercase() || lo.is_ascii_lowercase() {
                    return Some((at, Rewrite::Escape(byte)));
                }
            }
        }
        i = at + 1;
    }
    None
}

/// The bytes a path carries as they are (RFC 3986 §3.3: unreserved, sub-delims, `:`, `@`, `/`
/// and `%`), and `[` and `]`, which Go's URL parser leaves alone in a path too.
const RAW_IN_PATH: [bool; 256] = crate::bytes::alphanumeric_and(b"-._~!$&'()*+,;=:@/%[]");

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
        assert_eq!(normal("/é%41").as_deref(), Some("/%C3%A9A"));
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

    /// What a path may not carry as it is gets encoded, as a browser sends it, so a rule
    /// written one way matches a request sent the other.
    #[test]
    fn bytes_a_path_may_not_carry_are_encoded() {
        assert_eq!(normal("/été/x").as_deref(), Some("/%C3%A9t%C3%A9/x"));
        assert_eq!(normal("/%C3%A9t%C3%A9/x"), None);
        assert_eq!(
            normal("/a{b}|\"^`<>").as_deref(),
            Some("/a%7Bb%7D%7C%22%5E%60%3C%3E")
        );
        assert_eq!(normal("/a b").as_deref(), Some("/a%20b"));
        assert_eq!(
            normal("/é/./%7e/../%c3%a9").as_deref(),
            Some("/%C3%A9/%C3%A9"),
            "encoded, then dot segments removed"
        );
        for kept in ["/a:b@c!$&'()*+,;=", "/[::1]", "/a-b._~"] {
            assert_eq!(normal(kept), None, "{kept}");
        }
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
