//! The config API's bearer token (`PROXY_AUTH_TOKEN`): what one may hold.
//!
//! The proxy reads a pusher's `Authorization` header as ASCII text, so a token with any other
//! character (`pässword`, a control character) could never be presented: a proxy started with
//! one would refuse every push and stay unready without a word. [`check`] is the rule, so it is
//! refused where it is set instead.

/// Why a string cannot be a config-API token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AuthTokenError {
    /// Nothing but whitespace.
    #[error("the token is empty")]
    Empty,
    /// A character that is neither printable ASCII nor a space or tab.
    #[error(
        "the token holds a character that is not printable ASCII (only letters, digits, \
         punctuation, and spaces or tabs between them, can be sent in an Authorization header)"
    )]
    NotPrintableAscii,
}

/// The token as it is sent and compared: `token` without surrounding whitespace (a token read
/// from a Secret file often ends in a newline, which no header carries).
///
/// Spaces and tabs inside are kept: the header carries them, and the proxy compares what
/// follows the scheme whole.
///
/// # Errors
/// [`AuthTokenError::Empty`] for nothing but whitespace; [`AuthTokenError::NotPrintableAscii`]
/// for any character outside printable ASCII (0x21 to 0x7E) but a space or tab inside.
pub fn check(token: &str) -> Result<&str, AuthTokenError> {
    let token = token.trim();
    if token.is_empty() {
        return Err(AuthTokenError::Empty);
    }
    if !token
        .bytes()
        .all(|b| b.is_ascii_graphic() || b == b' ' || b == b'\t')
    {
        return Err(AuthTokenError::NotPrintableAscii);
    }
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_trimmed_and_must_be_printable_ascii() {
        assert_eq!(check(" s3cr3t-token\n"), Ok("s3cr3t-token"));
        assert_eq!(check("a b\tc"), Ok("a b\tc"));
        assert_eq!(
            check("~!@#$%^&*()_+={}[]|:;\"'<>,.?/`"),
            Ok("~!@#$%^&*()_+={}[]|:;\"'<>,.?/`")
        );
        for empty in ["", " ", "\r\n\t"] {
            assert_eq!(check(empty), Err(AuthTokenError::Empty), "{empty:?}");
        }
        for bad in [
            "pässword",
            "tok\u{1}en",
            "tok\u{7f}en",
            "tok\nen",
            "tok\u{a0}en",
            "🔑",
        ] {
            assert_eq!(
                check(bad),
                Err(AuthTokenError::NotPrintableAscii),
                "{bad:?}"
            );
        }
    }

    /// What the check accepts is what an `Authorization` header carries as text, the way the
    /// proxy reads it.
    #[test]
    fn an_accepted_token_reads_back_from_a_header_as_sent() {
        for token in ["s3cr3t", "a b", "x\ty", "~!\"#"] {
            let token = check(token).expect("accepted");
            let header = http::HeaderValue::from_str(&format!("Bearer {token}")).expect("a header");
            let read = header.to_str().expect("read as text");
            assert_eq!(read.split_once(' ').map(|(_, t)| t.trim()), Some(token));
        }
        let refused = http::HeaderValue::from_str("Bearer pässword").expect("sent as bytes");
        assert!(refused.to_str().is_err(), "not read as text");
    }
}
