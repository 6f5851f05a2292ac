//! A rule's Cloudflare Access requirement, checked: a team name that can be the first label of
//! a domain, and audience tags a header can compare against.

use super::Invalid;
use crate::document as doc;

/// The most audiences one requirement may list: an Access application has one AUD tag, and a
/// token is compared against each of them.
pub const MAX_AUDIENCES: usize = 64;
/// The longest audience tag accepted (Cloudflare's are 64 hexadecimal characters).
pub const MAX_AUDIENCE_LEN: usize = 256;

/// A checked Access requirement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Access {
    /// Lower-case, one DNS label: the team domain is `<team>.cloudflareaccess.com`.
    pub team: Box<str>,
    /// Never empty, without duplicates, in document order.
    pub audiences: Vec<Box<str>>,
}

/// Checks an Access requirement. Fields in the error are relative to the rule
/// (`access.teamName`).
///
/// # Errors
/// A team name that is not one DNS label, no audience, or an audience that is empty, too long
/// or not printable ASCII.
pub fn access(a: &doc::Access) -> Result<Access, Invalid> {
    let team = team_name(&a.team_name).map_err(|m| Invalid::new("access.teamName", m))?;
    if a.audiences.is_empty() {
        return Err(Invalid::new(
            "access.audiences",
            "at least one audience (AUD tag) is required",
        ));
    }
    if a.audiences.len() > MAX_AUDIENCES {
        return Err(Invalid::new(
            "access.audiences",
            format!("at most {MAX_AUDIENCES} audiences"),
        ));
    }
    let mut audiences: Vec<Box<str>> = Vec::with_capacity(a.audiences.len());
    for (i, aud) in a.audiences.iter().enumerate() {
        audience(aud).map_err(|m| Invalid::new(format!("access.audiences[{i}]"), m))?;
        if !audiences.iter().any(|x| **x == **aud) {
            audiences.push(aud.as_str().into());
        }
    }
    Ok(Access { team, audiences })
}

/// A Zero Trust team name: one DNS label (letters, digits, `-`, at most 63), any case;
/// returned lower-case.
///
/// # Errors
/// Why it is not one.
pub fn team_name(name: &str) -> Result<Box<str>, String> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if ok {
        Ok(name.to_ascii_lowercase().into())
    } else {
        Err(format!(
            "{name:?} is not a team name: one DNS label (letters, digits and '-', at most 63)"
        ))
    }
}

/// An audience (AUD) tag: 1 to [`MAX_AUDIENCE_LEN`] printable ASCII characters, no space.
///
/// # Errors
/// Why it is not one.
pub fn audience(aud: &str) -> Result<(), String> {
    if aud.is_empty() || aud.len() > MAX_AUDIENCE_LEN {
        return Err(format!("must be 1 to {MAX_AUDIENCE_LEN} characters"));
    }
    if !aud.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("must be printable ASCII without spaces".to_owned());
    }
    Ok(())
}
