//! Status codes a rule answers with or retries on.

use http::StatusCode;

/// A status code between 100 and 599.
///
/// # Errors
/// Any other number.
pub fn status(code: u16) -> Result<StatusCode, String> {
    if !(100..=599).contains(&code) {
        return Err(format!("status {code} is not between 100 and 599"));
    }
    StatusCode::from_u16(code).map_err(|e| e.to_string())
}

/// A status a response can end with: an informational one (1xx) is never a final answer.
///
/// # Errors
/// An informational status, or anything [`status`] refuses.
pub fn final_status(code: u16) -> Result<StatusCode, String> {
    if code < 200 {
        return Err(format!(
            "status {code} is informational, not a final answer"
        ));
    }
    status(code)
}

/// The status of a redirect: 301, 302, 303, 307 or 308 (Gateway API's set).
///
/// # Errors
/// Any other code.
pub fn redirect_status(code: u16) -> Result<StatusCode, String> {
    if ![301, 302, 303, 307, 308].contains(&code) {
        return Err(format!("{code} is not a redirect status"));
    }
    status(code)
}
