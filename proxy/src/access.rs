//! Cloudflare Access enforced at the origin, as cloudflared's `originRequest.access` does: a
//! rule with an `access` requirement lets a request through only when its
//! `Cf-Access-Jwt-Assertion` header holds a token that the team's current signing keys verify
//! (RS256 or ES256), issued by the team domain, within its `exp`/`nbf` (with [`LEEWAY`]), whose
//! `aud` names one of the rule's audiences. Anything else is answered 403 by
//! [`crate::error`], and the backend never sees the request. Like cloudflared, only the header
//! is read: the `CF_Authorization` cookie is the browser's copy of the same token, and the edge
//! puts the header on every request Access let through; the cookie is forwarded as sent.
//!
//! The keys of each team are fetched from `<team domain>/cdn-cgi/access/certs` off the
//! request path ([`keys`]): when a config first names the team, then every
//! [`AccessSettings::refresh`], and soon (at most every [`AccessSettings::min_refetch`]) when
//! a token names a key id the set lacks, which is how a key rotation is picked up, or when a
//! request is refused for want of fresh keys. A request never fetches keys itself: the team's
//! first waits (asynchronously, bounded) for the first fetch, and one naming an unknown key id
//! for a fetch that began after it asked. When fetches fail, the last keys keep serving for
//! [`AccessSettings::max_stale`] after the last success; after that, and for a team whose keys
//! were never fetched once a fetch has failed, every check fails closed at once until a fetch
//! succeeds.
//!
//! Verifying a signature costs tens of microseconds, so a token that passed is remembered by
//! its SHA-256 ([`token::Verified`]) until the earlier of its `exp` and [`token::REMEMBER`],
//! and only while the key set it was verified with is unchanged and fresh; each request still
//! compares its audiences with the rule's.

pub(crate) mod keys;
mod metrics;
mod token;

#[cfg(test)]
mod tests;

use cftunnel_config::valid;
use foldhash::{HashMap, HashMapExt};
use http::HeaderMap;
use std::sync::Arc;
use std::time::Duration;

pub use keys::TeamKeys;
pub use metrics::AccessMetrics;

/// The header Cloudflare Access puts the application token in (cloudflared reads this one).
pub const TOKEN_HEADER: &str = "cf-access-jwt-assertion";
/// The header Access puts the user's address in: a service behind it may read the identity
/// from it, so on a rule with a requirement it holds what the verified token says, never what
/// the client sent (in this spelling or with `_` for `-`).
pub const EMAIL_HEADER: &str = "cf-access-authenticated-user-email";
/// Clock skew tolerated on `exp` and `nbf`.
pub const LEEWAY: Duration = Duration::from_secs(60);
/// The team-domain template used unless configured otherwise.
pub const DEFAULT_TEAM_DOMAIN: &str = "https://{team}.cloudflareaccess.com";
/// Where, under a team domain, its signing keys (JWKS) are published.
pub const CERTS_PATH: &str = "/cdn-cgi/access/certs";

/// How team keys are found and kept. Shared by every team.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessSettings {
    /// The team domain, with `{team}` standing for the team name: the issuer tokens must
    /// name, and the base the keys are fetched under. A private setup or a test points it
    /// elsewhere (`http://127.0.0.1:8443/{team}`).
    pub team_domain: String,
    /// Keys are fetched again this long after the last fetch.
    pub refresh: Duration,
    /// How long after the last successful fetch the keys keep serving while fetches fail;
    /// then every token is refused until a fetch succeeds.
    pub max_stale: Duration,
    /// The shortest time between the start of a fetch and one asked for by a request (a
    /// token naming a key id the set lacks, or a refusal for want of fresh keys), so tokens
    /// naming made-up keys cannot make the proxy fetch without pause.
    pub min_refetch: Duration,
    /// Bounds one fetch, and the wait of a team's first request for its first fetch. A
    /// request naming a key id the set lacks waits up to `min_refetch` plus this.
    pub fetch_timeout: Duration,
}

impl Default for AccessSettings {
    fn default() -> Self {
        Self {
            team_domain: DEFAULT_TEAM_DOMAIN.to_owned(),
            refresh: Duration::from_secs(300),
            max_stale: Duration::from_secs(24 * 3600),
            min_refetch: Duration::from_secs(5),
            fetch_timeout: Duration::from_secs(5),
        }
    }
}

impl AccessSettings {
    /// The domain of `team`: `team_domain` with the team name in place of `{team}`.
    pub fn domain_of(&self, team: &str) -> String {
        self.team_domain.replace("{team}", team)
    }

    /// Checks the team-domain template: an `http` or `https` URL once a team is put in.
    ///
    /// # Errors
    /// Why it is not one, for the start-up message.
    pub fn check(&self) -> Result<(), String> {
        let url = self.domain_of("team");
        if !(url.starts_with("https://") || url.starts_with("http://")) {
            return Err(format!(
                "{:?} is not an http or https URL",
                self.team_domain
            ));
        }
        valid::Target::new(
            &url,
            cftunnel_config::BackendProtocol::Http1,
            false,
            None,
            false,
        )
        .map(|_| ())
        .map_err(|e| format!("{:?}: {}", self.team_domain, e.message))
    }
}

/// Why a request was refused. Each kind is one the operator can act on; the client is told
/// only that a valid token is required.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AccessError {
    #[error("no Cf-Access-Jwt-Assertion header")]
    Missing,
    #[error("the token is not a well-formed JWT")]
    Malformed,
    #[error("the token is not signed with RS256 or ES256")]
    UnsupportedAlgorithm,
    #[error("the token's key is not among the team's keys")]
    UnknownKey,
    #[error("the team's keys could not be fetched recently enough")]
    KeysUnavailable,
    #[error("the token's signature does not verify")]
    BadSignature,
    #[error("the token has expired")]
    Expired,
    #[error("the token is not valid yet")]
    NotYetValid,
    #[error("the token was issued for another team")]
    WrongIssuer,
    #[error("the token is for another application (audience)")]
    WrongAudience,
}

impl AccessError {
    /// Every reason, in [`AccessError::index`] order: the label values of
    /// `cftunnel_proxy_access_refusals_total`.
    pub const ALL: [Self; 10] = [
        Self::Missing,
        Self::Malformed,
        Self::UnsupportedAlgorithm,
        Self::UnknownKey,
        Self::KeysUnavailable,
        Self::BadSignature,
        Self::Expired,
        Self::NotYetValid,
        Self::WrongIssuer,
        Self::WrongAudience,
    ];

    /// The position in [`AccessError::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// A stable label for logs and metrics.
    pub fn label(self) -> &'static str {
        match self {
            Self::Missing => "missing",
            Self::Malformed => "malformed",
            Self::UnsupportedAlgorithm => "algorithm",
            Self::UnknownKey => "unknown_key",
            Self::KeysUnavailable => "keys_unavailable",
            Self::BadSignature => "signature",
            Self::Expired => "expired",
            Self::NotYetValid => "not_yet_valid",
            Self::WrongIssuer => "issuer",
            Self::WrongAudience => "audience",
        }
    }
}

/// The identity a verified token vouches for: the user's address, or none (a service token).
#[derive(Debug)]
pub struct Identity(Option<http::HeaderValue>);

impl Identity {
    /// Puts the address in [`EMAIL_HEADER`] in place of whatever the client sent there, and
    /// removes the client's other spellings of the Access headers ([`remove_respellings`]).
    pub fn forward(self, headers: &mut HeaderMap) {
        remove_respellings(headers);
        headers.remove(EMAIL_HEADER);
        if let Some(email) = self.0 {
            headers.insert(EMAIL_HEADER, email);
        }
    }
}

/// Removes every header that reads as [`TOKEN_HEADER`] or [`EMAIL_HEADER`] once `_` is taken
/// for `-` but is not spelled with hyphens: servers that map both to one CGI/WSGI key
/// (Werkzeug, older gunicorn and Puma) would read a client's
/// `cf_access_authenticated_user_email` as the address the proxy vouches for, or
/// `cf_access_jwt_assertion` as the token. nginx drops header names with `_` by default for
/// the same reason. Only names holding a `_` are compared, and only on rules with a
/// requirement, so other requests pay nothing.
fn remove_respellings(headers: &mut HeaderMap) {
    while let Some(name) = headers.keys().find(|n| is_respelling(n.as_str())).cloned() {
        headers.remove(&name);
    }
}

fn is_respelling(name: &str) -> bool {
    name.contains('_')
        && [TOKEN_HEADER, EMAIL_HEADER].iter().any(|access| {
            access.len() == name.len()
                && access
                    .bytes()
                    .zip(name.bytes())
                    .all(|(a, n)| a.eq_ignore_ascii_case(&n) || (a == b'-' && n == b'_'))
        })
}

/// A rule's requirement, compiled: its team's keys and the audiences it accepts.
#[derive(Debug)]
pub struct AccessCheck {
    team: Arc<TeamKeys>,
    audiences: Box<[Box<str>]>,
}

impl AccessCheck {
    /// Lets the request through, or says why not. Never fetches keys itself; may wait for the
    /// team's first fetch (up to [`AccessSettings::fetch_timeout`]) or one an unknown key id
    /// asked for (up to [`AccessSettings::min_refetch`] more). What a request let through
    /// forwards of the identity is the [`Identity`] returned.
    pub async fn check(&self, headers: &HeaderMap) -> Result<Identity, AccessError> {
        let mut values = headers.get_all(TOKEN_HEADER).iter();
        let verdict = match (values.next().map(|v| v.to_str()), values.next()) {
            // Two tokens: only one would be verified, and the backend might read the other.
            (_, Some(_)) => Err(AccessError::Malformed),
            (Some(Ok(t)), None) if !t.trim().is_empty() => {
                self.team.verify(t.trim(), &self.audiences).await
            }
            (Some(Ok(_)) | None, None) => Err(AccessError::Missing),
            (Some(Err(_)), None) => Err(AccessError::Malformed),
        };
        match verdict {
            Ok(email) => Ok(Identity(email)),
            Err(e) => {
                self.team.refused(e);
                tracing::debug!(
                    team = self.team.team(),
                    reason = e.label(),
                    "Access token refused"
                );
                Err(e)
            }
        }
    }

    /// The team name, for logs.
    pub fn team(&self) -> &str {
        self.team.team()
    }
}

/// The teams of the table in service and its settings: what one compile hands to the next, so
/// the keys of a team that stays named are neither fetched again nor forgotten on a push.
#[derive(Debug, Default)]
pub struct Teams {
    settings: Arc<AccessSettings>,
    teams: HashMap<Box<str>, Arc<TeamKeys>>,
    metrics: AccessMetrics,
}

impl Teams {
    pub fn new(settings: AccessSettings) -> Self {
        Self {
            settings: Arc::new(settings),
            teams: HashMap::new(),
            metrics: AccessMetrics::default(),
        }
    }

    /// The same teams, counting in `metrics` (the proxy's registered ones).
    pub fn with_metrics(mut self, metrics: AccessMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// The check of a rule's requirement, reusing the team's keys of `self` when it has them.
    /// The team is recorded in `used`, which becomes the next `Teams` once the table is in.
    pub(crate) fn check(
        &self,
        access: valid::Access,
        used: &mut HashMap<Box<str>, Arc<TeamKeys>>,
    ) -> Result<AccessCheck, String> {
        let team = match used
            .get(&access.team)
            .or_else(|| self.teams.get(&access.team))
        {
            Some(t) => t.clone(),
            None => Arc::new(TeamKeys::new(
                &access.team,
                self.settings.clone(),
                &self.metrics,
            )?),
        };
        used.insert(access.team, team.clone());
        Ok(AccessCheck {
            team,
            audiences: access.audiences.into_boxed_slice(),
        })
    }

    /// Counts the team of a rule compiled for an earlier table as used by the new one.
    pub(crate) fn keep(check: &AccessCheck, used: &mut HashMap<Box<str>, Arc<TeamKeys>>) {
        if !used.contains_key(check.team.team()) {
            used.insert(check.team.team().into(), check.team.clone());
        }
    }

    /// Replaces the teams with those the new table uses; the others' refresh tasks end.
    pub(crate) fn replace(&mut self, used: HashMap<Box<str>, Arc<TeamKeys>>) {
        self.teams = used;
    }

    /// Starts fetching the keys of every team not started yet (after a push is applied, so
    /// the first request of a team rarely waits). Needs a tokio runtime; without one, each
    /// team starts at its first request.
    pub fn start(&self) {
        for team in self.teams.values() {
            team.start();
        }
    }
}
