//! Tunnel token: standard base64 (with padding) of a compact JSON object
//! `{"a": account tag, "s": base64 secret, "t": tunnel UUID, "e"?: endpoint}`.

use std::fmt;
use std::str::FromStr;

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use serde::Deserialize;
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
    /// The token is not standard base64.
    #[error("tunnel token is not valid base64")]
    Base64,
    /// The decoded token is not a JSON object of the expected shape.
    #[error("tunnel token is not a valid JSON object: {0}")]
    Json(String),
    /// `a` (account tag) is missing or empty.
    #[error("tunnel token field `a` (account tag) is missing or empty")]
    AccountTag,
    /// `s` (tunnel secret) is missing, empty or not base64.
    #[error("tunnel token field `s` (tunnel secret) is missing, empty or not base64")]
    Secret,
    /// `t` (tunnel id) is missing or not a UUID.
    #[error("tunnel token field `t` (tunnel id) is missing or not a UUID")]
    TunnelId,
    /// `e` (endpoint) is present but not a plain region name.
    #[error("tunnel token field `e` (endpoint) is not a valid region name")]
    Endpoint,
}

#[derive(Deserialize)]
struct Wire {
    #[serde(default)]
    a: Option<String>,
    #[serde(default)]
    s: Option<String>,
    #[serde(default)]
    t: Option<String>,
    #[serde(default)]
    e: Option<String>,
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
        let raw = STANDARD
            .decode(s.trim().as_bytes())
            .map_err(|_| TokenError::Base64)?;
        let wire: Wire =
            serde_json::from_slice(&raw).map_err(|e| TokenError::Json(e.to_string()))?;
        let account_tag = wire
            .a
            .filter(|a| !a.is_empty())
            .ok_or(TokenError::AccountTag)?;
        let tunnel_secret = wire
            .s
            .and_then(|s| STANDARD.decode(s.as_bytes()).ok())
            .filter(|s| !s.is_empty())
            .ok_or(TokenError::Secret)?;
        let tunnel_id = wire
            .t
            .and_then(|t| Uuid::parse_str(&t).ok())
            .ok_or(TokenError::TunnelId)?;
        let endpoint = match wire.e {
            None => None,
            Some(e) if e.is_empty() => None,
            Some(e) => {
                if !e
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                {
                    return Err(TokenError::Endpoint);
                }
                Some(e)
            }
        };
        Ok(Self {
            account_tag,
            tunnel_secret,
            tunnel_id,
            endpoint,
        })
    }
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
        for (input, want) in cases {
            assert_eq!(input.parse::<Token>().unwrap_err(), want, "{input}");
        }
        assert!(matches!(
            enc("[1]").parse::<Token>(),
            Err(TokenError::Json(_))
        ));
        assert!(TokenError::Secret.to_string().contains("`s`"));
    }
}
