//! One token against one key set: the header's algorithm and key id pick the keys, the
//! signature and the registered claims are checked by `jsonwebtoken`, the audience against the
//! rule. Pure but for the system clock `jsonwebtoken` reads `exp` and `nbf` against. Also the
//! memory of tokens that passed ([`VerifiedCache`]).

use super::{AccessError, LEEWAY};
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, Header, Validation};
use std::collections::HashMap;
use std::sync::{PoisonError, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::time::Instant;

/// One usable key of a team's set: what a token's header picks by algorithm and key id.
#[derive(Debug)]
pub(super) struct Key {
    pub(super) kid: Option<Box<str>>,
    pub(super) alg: Algorithm,
    pub(super) key: DecodingKey,
}

/// The longest a verified token is remembered, whatever its `exp`.
pub(super) const REMEMBER: Duration = Duration::from_secs(300);
/// Tokens remembered per team at most; past it, expired ones are dropped, then all.
const MAX_REMEMBERED: usize = 10_000;

/// The checks of a team's tokens, one per algorithm accepted: `jsonwebtoken` wants the key's
/// family to match every algorithm a [`Validation`] lists.
#[derive(Debug)]
pub(super) struct Validations {
    rs256: Validation,
    es256: Validation,
}

impl Validations {
    pub(super) fn new(issuer: &str) -> Self {
        let one = |alg| {
            let mut v = Validation::new(alg);
            v.set_issuer(&[issuer]);
            v.set_required_spec_claims(&["exp", "iss", "aud"]);
            v.validate_nbf = true;
            // The audience is compared per rule (`audience_matches`), so one verification
            // serves every rule of the team.
            v.validate_aud = false;
            v.leeway = LEEWAY.as_secs();
            v
        };
        Self {
            rs256: one(Algorithm::RS256),
            es256: one(Algorithm::ES256),
        }
    }

    fn of(&self, alg: Algorithm) -> Option<&Validation> {
        match alg {
            Algorithm::RS256 => Some(&self.rs256),
            Algorithm::ES256 => Some(&self.es256),
            _ => None,
        }
    }
}

/// The claims read once the signature holds.
#[derive(Debug, serde::Deserialize)]
pub(super) struct Claims {
    #[serde(deserialize_with = "one_or_many")]
    pub(super) aud: Box<[Box<str>]>,
    pub(super) exp: u64,
    /// The user's address; a service token's has none.
    #[serde(default)]
    pub(super) email: Option<String>,
}

impl Claims {
    /// The value of [`super::EMAIL_HEADER`] the token vouches for.
    pub(super) fn email_header(&self) -> Option<http::HeaderValue> {
        self.email
            .as_deref()
            .and_then(|e| http::HeaderValue::from_str(e).ok())
    }
}

fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Box<[Box<str>]>, D::Error> {
    #[derive(serde::Deserialize)]
    #[serde(untagged)]
    enum Aud {
        One(String),
        Many(Vec<String>),
    }
    Ok(match serde::Deserialize::deserialize(d)? {
        Aud::One(a) => vec![a.into_boxed_str()].into_boxed_slice(),
        Aud::Many(list) => list.into_iter().map(String::into_boxed_str).collect(),
    })
}

/// The token's header, with an algorithm we accept.
pub(super) fn header(token: &str) -> Result<Header, AccessError> {
    let header = jsonwebtoken::decode_header(token).map_err(|_| AccessError::Malformed)?;
    match header.alg {
        Algorithm::RS256 | Algorithm::ES256 => Ok(header),
        _ => Err(AccessError::UnsupportedAlgorithm),
    }
}

/// The keys a token may be signed with.
pub(super) enum Candidate<'k> {
    Keys(Vec<&'k Key>),
    /// The token names a key id the set lacks: the set may be out of date.
    UnknownKid,
}

/// The keys of `keys` for `header`: the one its `kid` names (of its algorithm), or without a
/// `kid` every key of its algorithm.
pub(super) fn candidates<'k>(keys: &'k [Key], header: &Header) -> Candidate<'k> {
    let of_alg = keys.iter().filter(|k| k.alg == header.alg);
    match header.kid.as_deref() {
        Some(kid) => {
            let named: Vec<&Key> = of_alg.filter(|k| k.kid.as_deref() == Some(kid)).collect();
            if named.is_empty() {
                Candidate::UnknownKid
            } else {
                Candidate::Keys(named)
            }
        }
        None => Candidate::Keys(of_alg.collect()),
    }
}

/// Verifies the signature with the first key that holds it, then `iss`, `exp` and `nbf`.
pub(super) fn verify(
    token: &str,
    header: &Header,
    keys: Candidate<'_>,
    validations: &Validations,
) -> Result<Claims, AccessError> {
    let Candidate::Keys(keys) = keys else {
        return Err(AccessError::UnknownKey);
    };
    let validation = validations
        .of(header.alg)
        .ok_or(AccessError::UnsupportedAlgorithm)?;
    let mut refused = AccessError::UnknownKey;
    for key in keys {
        match jsonwebtoken::decode::<Claims>(token, &key.key, validation) {
            Ok(data) => return Ok(data.claims),
            Err(e) => {
                refused = refusal(e.kind());
                // Another key of the set may hold the signature; any other failure is final.
                if refused != AccessError::BadSignature {
                    return Err(refused);
                }
            }
        }
    }
    Err(refused)
}

fn refusal(kind: &ErrorKind) -> AccessError {
    match kind {
        ErrorKind::InvalidSignature => AccessError::BadSignature,
        ErrorKind::ExpiredSignature => AccessError::Expired,
        ErrorKind::ImmatureSignature => AccessError::NotYetValid,
        ErrorKind::InvalidIssuer => AccessError::WrongIssuer,
        ErrorKind::InvalidAlgorithm | ErrorKind::InvalidAlgorithmName => {
            AccessError::UnsupportedAlgorithm
        }
        _ => AccessError::Malformed,
    }
}

/// Whether the token's audiences and the rule's share one.
pub(super) fn audience_matches(token: &[Box<str>], rule: &[Box<str>]) -> Result<(), AccessError> {
    if token.iter().any(|a| rule.contains(a)) {
        Ok(())
    } else {
        Err(AccessError::WrongAudience)
    }
}

/// SHA-256 of a token: what it is remembered by (collision-resistant, so no other string can
/// pass for a token that was verified, and the token itself is not kept).
pub(super) fn digest(token: &str) -> [u8; 32] {
    let d = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, token.as_bytes());
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

/// A token whose signature, issuer and times held.
#[derive(Debug)]
pub(super) struct Verified {
    /// The key set version it was verified against.
    version: u64,
    /// Until when it may be taken without verifying again.
    until: Instant,
    aud: Box<[Box<str>]>,
    email: Option<http::HeaderValue>,
}

impl Verified {
    /// `exp` in seconds since the epoch: remembered until then (without leeway) or for
    /// [`REMEMBER`], whichever ends first.
    pub(super) fn new(version: u64, claims: Claims) -> Self {
        let email = claims.email_header();
        let Claims { aud, exp, .. } = claims;
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let left = Duration::from_secs(exp.saturating_sub(now)).min(REMEMBER);
        Self {
            version,
            until: Instant::now() + left,
            aud,
            email,
        }
    }
}

/// Tokens that passed, by digest. Read under a shared lock on every request of a rule with a
/// requirement; written once per token.
#[derive(Debug, Default)]
pub(super) struct VerifiedCache {
    tokens: RwLock<HashMap<[u8; 32], Verified>>,
}

impl VerifiedCache {
    /// The verdict for a remembered token against a rule's audiences; `None` when it must be
    /// verified (not remembered, remembered too long, or for another key set).
    pub(super) fn get(
        &self,
        digest: &[u8; 32],
        version: u64,
        audiences: &[Box<str>],
    ) -> Option<Result<Option<http::HeaderValue>, AccessError>> {
        let tokens = self.tokens.read().unwrap_or_else(PoisonError::into_inner);
        let seen = tokens.get(digest)?;
        (seen.version == version && seen.until > Instant::now())
            .then(|| audience_matches(&seen.aud, audiences).map(|()| seen.email.clone()))
    }

    pub(super) fn insert(&self, digest: [u8; 32], verified: Verified) {
        if verified.until <= Instant::now() {
            return;
        }
        let mut tokens = self.tokens.write().unwrap_or_else(PoisonError::into_inner);
        if tokens.len() >= MAX_REMEMBERED {
            let now = Instant::now();
            tokens.retain(|_, v| v.until > now && v.version == verified.version);
            if tokens.len() >= MAX_REMEMBERED {
                tokens.clear();
            }
        }
        tokens.insert(digest, verified);
    }
}
