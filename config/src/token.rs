//! Tunnel token: standard base64 (with padding) of a compact JSON object
//! `{"a": account tag, "s": base64 secret, "t": tunnel UUID, "e"?: endpoint}`.

use std::fmt;
use std::str::FromStr;

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use uuid::Uuid;

/// Credentials a connector presents in `registerConnection`.
///
/// `Debug` never prints the secret.
#[derive(Clone, PartialEq, Eq)]
pub struct Token {
    account_tag: String,
    tunnel_secret: Vec<u8>,
    tunnel_id: Uuid,
    endpoint: Option<String>,
}

/// Why a token was rejected. Each variant names the offending part.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TokenError {
    /// The token is empty or only whitespace (a variable set to nothing).
    #[error("tunnel token is empty")]
    Empty,
    /// The token is not standard base64.
    #[error("tunnel token is not valid base64")]
    Base64,
    /// The decoded token is not well-formed JSON or not a JSON object.
    #[error("tunnel token is not a valid JSON object: {0}")]
    Json(String),
    /// `a` (account tag) is missing, not a string, or not an account tag
    /// ([`check_account_tag`]).
    #[error(
        "tunnel token field `a` (account tag) is missing, not a string or not {ACCOUNT_TAG_RULE}"
    )]
    AccountTag,
    /// `s` (tunnel secret) is missing, empty or not a base64 string.
    #[error("tunnel token field `s` (tunnel secret) is missing, empty or not a base64 string")]
    Secret,
    /// `t` (tunnel id) is missing or not a UUID string.
    #[error("tunnel token field `t` (tunnel id) is missing or not a UUID string")]
    TunnelId,
    /// `e` (endpoint) is present but not a string holding a region name
    /// ([`is_region_label`]).
    #[error("tunnel token field `e` (endpoint) is not a string of {REGION_RULE}")]
    Endpoint,
}

/// What an account tag may be, as a phrase: what [`check_account_tag`] accepts.
pub const ACCOUNT_TAG_RULE: &str = "1 to 64 ASCII letters, digits, '-' or '_'";

/// What an edge region may be, as a phrase: what [`is_region_label`] accepts.
pub const REGION_RULE: &str =
    "1 to 63 ASCII letters, digits or '-', not starting or ending with '-'";

/// Whether `region` may name an edge region ([`REGION_RULE`]): a token's endpoint or a
/// configured region, which discovery places in a DNS name (`_<region>-v2-origintunneld...`),
/// so it must be one DNS label.
pub fn is_region_label(region: &str) -> bool {
    (1..=63).contains(&region.len())
        && region
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        && !region.starts_with('-')
        && !region.ends_with('-')
}

/// The longest account tag accepted, in bytes.
const MAX_ACCOUNT_TAG: usize = 64;

/// Whether `tag` may be an account tag ([`ACCOUNT_TAG_RULE`]). Cloudflare's are 32 lowercase
/// hex digits; the rule is looser, but the tag is placed in API paths
/// (`/accounts/{tag}/...`), so nothing that could end a path segment or start a query or
/// fragment is allowed.
///
/// # Errors
/// [`TokenError::AccountTag`] when it is empty, longer than 64 bytes, or holds anything else.
pub fn check_account_tag(tag: &str) -> Result<(), TokenError> {
    let allowed = |b: u8| b.is_ascii_alphanumeric() || b == b'-' || b == b'_';
    if tag.is_empty() || tag.len() > MAX_ACCOUNT_TAG || !tag.bytes().all(allowed) {
        return Err(TokenError::AccountTag);
    }
    Ok(())
}

/// The token's fields as strings. Each is read from the raw JSON object on
/// its own, so a value of the wrong type is reported as that field's error
/// rather than as a generic JSON error. `null` counts as absent and a
/// repeated key keeps its last value, as `cloudflared`'s Go decoder does.
struct Wire {
    a: Option<String>,
    s: Option<String>,
    t: Option<String>,
    e: Option<String>,
}

impl Wire {
    fn from_json(raw: &[u8]) -> Result<Self, TokenError> {
        let obj: serde_json::Map<String, serde_json::Value> =
            serde_json::from_slice(raw).map_err(|e| TokenError::Json(e.to_string()))?;
        Ok(Self {
            a: string_field(&obj, "a", TokenError::AccountTag)?,
            s: string_field(&obj, "s", TokenError::Secret)?,
            t: string_field(&obj, "t", TokenError::TunnelId)?,
            e: string_field(&obj, "e", TokenError::Endpoint)?,
        })
    }
}

fn string_field(
    obj: &serde_json::Map<String, serde_json::Value>,
    key: &str,
    wrong_type: TokenError,
) -> Result<Option<String>, TokenError> {
    match obj.get(key) {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(wrong_type),
    }
}

impl Token {
    /// Builds a token from its parts (used by tests and the mock edge).
    pub fn new(account_tag: impl Into<String>, tunnel_secret: Vec<u8>, tunnel_id: Uuid) -> Self {
        Self {
            account_tag: account_tag.into(),
            tunnel_secret,
            tunnel_id,
            endpoint: None,
        }
    }

    /// The account tag (`a`).
    pub fn account_tag(&self) -> &str {
        &self.account_tag
    }

    /// The raw tunnel secret (`s`, base64-decoded).
    pub fn tunnel_secret(&self) -> &[u8] {
        &self.tunnel_secret
    }

    /// The tunnel id (`t`).
    pub fn tunnel_id(&self) -> Uuid {
        self.tunnel_id
    }

    /// The endpoint / region (`e`), used as the SRV discovery region.
    pub fn endpoint(&self) -> Option<&str> {
        self.endpoint.as_deref()
    }

    /// Encodes the token in the same form `cloudflared` accepts.
    pub fn encode(&self) -> String {
        let mut obj = serde_json::Map::new();
        obj.insert("a".into(), self.account_tag.clone().into());
        obj.insert("s".into(), STANDARD.encode(&self.tunnel_secret).into());
        obj.insert("t".into(), self.tunnel_id.to_string().into());
        if let Some(e) = &self.endpoint {
            obj.insert("e".into(), e.clone().into());
        }
        STANDARD.encode(serde_json::Value::Object(obj).to_string())
    }
}

impl FromStr for Token {
    type Err = TokenError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if s.is_empty() {
            return Err(TokenError::Empty);
        }
        let raw = decode_base64(s).ok_or(TokenError::Base64)?;
        let wire = Wire::from_json(&raw)?;
        let account_tag = wire.a.ok_or(TokenError::AccountTag)?;
        check_account_tag(&account_tag)?;
        let tunnel_secret = wire
            .s
            .and_then(|s| decode_base64(&s))
            .filter(|s| !s.is_empty())
            .ok_or(TokenError::Secret)?;
        let tunnel_id = wire
            .t
            .and_then(|t| Uuid::parse_str(&t).ok())
            .ok_or(TokenError::TunnelId)?;
        let endpoint = match wire.e {
            None => None,
            Some(e) if e.is_empty() => None,
            Some(e) if is_region_label(&e) => Some(e),
            Some(_) => return Err(TokenError::Endpoint),
        };
        Ok(Self {
            account_tag,
            tunnel_secret,
            tunnel_id,
            endpoint,
        })
    }
}

/// Standard base64 as Go's `StdEncoding` (and so `cloudflared`) reads it: line breaks
/// anywhere are skipped, so a token wrapped over several lines (GNU `base64` output) is read
/// whole. Other whitespace inside is an error, as it is there.
fn decode_base64(s: &str) -> Option<Vec<u8>> {
    if !s.contains(['\r', '\n']) {
        return STANDARD.decode(s.as_bytes()).ok();
    }
    let joined: Vec<u8> = s.bytes().filter(|b| !matches!(b, b'\r' | b'\n')).collect();
    STANDARD.decode(joined).ok()
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Token")
            .field("account_tag", &self.account_tag)
            .field("tunnel_secret", &"<redacted>")
            .field("tunnel_id", &self.tunnel_id)
            .field("endpoint", &self.endpoint)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(json: &str) -> String {
        STANDARD.encode(json)
    }

    const ID: &str = "6ff42ae2-765d-4adf-8112-31c55c1551ef";

    #[test]
    fn valid_token_round_trips_and_hides_secret() {
        let tok = Token::new("acct", vec![7; 32], Uuid::parse_str(ID).unwrap());
        let parsed: Token = tok.encode().parse().unwrap();
        assert_eq!(parsed, tok);
        let dbg = format!("{parsed:?}");
        assert!(dbg.contains("<redacted>"));
        assert!(!dbg.contains(&STANDARD.encode([7u8; 32])));
    }

    #[test]
    fn endpoint_is_optional_and_kept() {
        let s = enc(&format!(r#"{{"a":"x","s":"AAEC","t":"{ID}","e":"fed"}}"#));
        let t: Token = s.parse().unwrap();
        assert_eq!(t.endpoint(), Some("fed"));
        assert_eq!(t.tunnel_secret(), &[0, 1, 2]);
    }

    #[test]
    fn each_bad_field_is_named() {
        let cases = [
            ("%%%".to_string(), TokenError::Base64),
            (
                enc(&format!(r#"{{"s":"AAEC","t":"{ID}"}}"#)),
                TokenError::AccountTag,
            ),
            (
                enc(&format!(r#"{{"a":"x","s":"@@","t":"{ID}"}}"#)),
                TokenError::Secret,
            ),
            (
                enc(r#"{"a":"x","s":"AAEC","t":"nope"}"#),
                TokenError::TunnelId,
            ),
            (
                enc(&format!(r#"{{"a":"x","s":"AAEC","t":"{ID}","e":"a/b"}}"#)),
                TokenError::Endpoint,
            ),
        ];
        // Not one DNS label, so discovery could never find the region's edge.
        let long = "r".repeat(64);
        for e in ["-x", "x-", "a_b", "us.evil", long.as_str()] {
            let input = enc(&format!(r#"{{"a":"x","s":"AAEC","t":"{ID}","e":"{e}"}}"#));
            assert_eq!(
                input.parse::<Token>().unwrap_err(),
                TokenError::Endpoint,
                "{e}"
            );
        }
        let longest = "r".repeat(63);
        let input = enc(&format!(
            r#"{{"a":"x","s":"AAEC","t":"{ID}","e":"{longest}"}}"#
        ));
        assert_eq!(
            input
                .parse::<Token>()
                .ok()
                .as_ref()
                .and_then(Token::endpoint),
            Some(longest.as_str())
        );
        for (input, want) in cases {
            assert_eq!(input.parse::<Token>().unwrap_err(), want, "{input}");
        }
        assert!(matches!(
            enc("[1]").parse::<Token>(),
            Err(TokenError::Json(_))
        ));
        assert!(TokenError::Secret.to_string().contains("`s`"));
    }

    #[test]
    fn a_field_of_the_wrong_type_is_named() {
        let cases = [
            (
                format!(r#"{{"a":5,"s":"AAEC","t":"{ID}"}}"#),
                TokenError::AccountTag,
            ),
            (
                format!(r#"{{"a":{{}},"s":"AAEC","t":"{ID}"}}"#),
                TokenError::AccountTag,
            ),
            (
                format!(r#"{{"a":"x","s":[],"t":"{ID}"}}"#),
                TokenError::Secret,
            ),
            (
                format!(r#"{{"a":"x","s":true,"t":"{ID}"}}"#),
                TokenError::Secret,
            ),
            (
                r#"{"a":"x","s":"AAEC","t":null}"#.to_string(),
                TokenError::TunnelId,
            ),
            (
                r#"{"a":"x","s":"AAEC","t":7}"#.to_string(),
                TokenError::TunnelId,
            ),
            (
                r#"{"a":"x","s":"AAEC","t":"not-a-uuid"}"#.to_string(),
                TokenError::TunnelId,
            ),
            (
                format!(r#"{{"a":"x","s":"AAEC","t":"{ID}","e":5}}"#),
                TokenError::Endpoint,
            ),
            (
                format!(r#"{{"a":"x","s":"AAEC","t":"{ID}","e":["fed"]}}"#),
                TokenError::Endpoint,
            ),
        ];
        for (json, want) in cases {
            let err = enc(&json).parse::<Token>().unwrap_err();
            assert_eq!(err, want, "{json}");
        }
        let msg = enc(&format!(r#"{{"a":5,"s":"AAEC","t":"{ID}"}}"#))
            .parse::<Token>()
            .unwrap_err()
            .to_string();
        assert!(msg.contains("`a`"), "{msg}");
    }

    /// The account tag is placed in API paths: nothing that could leave its path segment
    /// (a '/', a query, a fragment, an escape, a dot segment) nor an overlong one is read.
    #[test]
    fn an_account_tag_that_could_leave_its_path_segment_is_refused() {
        let long = "a".repeat(65);
        for bad in [
            "acct/cfd_tunnel/x/configurations#",
            "acct#",
            "acct?x=1",
            "acct%2F",
            "..",
            "ac.ct",
            "ac ct",
            "",
            long.as_str(),
        ] {
            let json = serde_json::json!({"a": bad, "s": "AAEC", "t": ID}).to_string();
            assert_eq!(
                enc(&json).parse::<Token>(),
                Err(TokenError::AccountTag),
                "{bad:?}"
            );
            assert_eq!(
                check_account_tag(bad),
                Err(TokenError::AccountTag),
                "{bad:?}"
            );
        }
        let msg = TokenError::AccountTag.to_string();
        assert!(msg.contains(ACCOUNT_TAG_RULE), "{msg}");
        let longest = "a".repeat(64);
        for good in [
            "0123456789abcdef0123456789abcdef",
            "acct",
            "acct-c",
            "test-account",
            "file_account",
            "LoadTest9",
            longest.as_str(),
        ] {
            let tok = Token::new(good, vec![7; 32], Uuid::parse_str(ID).unwrap());
            assert_eq!(tok.encode().parse::<Token>(), Ok(tok.clone()), "{good:?}");
            assert_eq!(check_account_tag(good), Ok(()), "{good:?}");
        }
    }

    #[test]
    fn null_endpoint_counts_as_absent() {
        let t: Token = enc(&format!(r#"{{"a":"x","s":"AAEC","t":"{ID}","e":null}}"#))
            .parse()
            .unwrap();
        assert_eq!(t.endpoint(), None);
    }

    #[test]
    fn malformed_json_and_base64_keep_their_own_errors() {
        for json in [r#"{"a":"x","#, "not json", r#""a string""#, "[1]"] {
            assert!(
                matches!(enc(json).parse::<Token>(), Err(TokenError::Json(_))),
                "{json}"
            );
        }
        assert_eq!("@@@@".parse::<Token>().unwrap_err(), TokenError::Base64);
    }

    /// GNU `base64` wraps its output at 76 columns; `cloudflared` (Go's `StdEncoding`) skips
    /// the line breaks, LF or CRLF, wherever they fall.
    #[test]
    fn a_token_wrapped_over_several_lines_is_read_whole() {
        let tok = Token::new("acct", vec![7; 32], Uuid::parse_str(ID).unwrap());
        let flat = tok.encode();
        assert!(flat.len() > 76, "long enough to wrap");
        let lines: Vec<&str> = flat
            .as_bytes()
            .chunks(76)
            .map(|c| std::str::from_utf8(c).unwrap())
            .collect();
        for wrapped in [
            format!("{}\n", lines.join("\n")),
            lines.join("\r\n"),
            // A break inside a four-character group.
            format!("{}\n{}", &flat[..5], &flat[5..]),
        ] {
            assert_eq!(wrapped.parse::<Token>(), Ok(tok.clone()), "{wrapped:?}");
        }
        // Other whitespace inside stays an error, as in Go.
        let spaced = format!("{} {}", &flat[..8], &flat[8..]);
        assert_eq!(spaced.parse::<Token>(), Err(TokenError::Base64));
    }

    #[test]
    fn an_empty_token_is_refused_as_empty() {
        for empty in ["", " ", "\n", " \r\n\t "] {
            let err = empty.parse::<Token>().unwrap_err();
            assert_eq!(err, TokenError::Empty, "{empty:?}");
            assert_eq!(err.to_string(), "tunnel token is empty");
        }
    }
}
