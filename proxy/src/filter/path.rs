/// Path replacement shared by redirects and rewrites.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathModifier {
    Full(Box<str>),
    /// Replaces the matched prefix, keeping the rest of the path.
    Prefix(Box<str>),
}

impl PathModifier {
    /// The new path for `path`, given the prefix the rule matched on.
    pub fn apply(&self, path: &str, matched_prefix: Option<&str>) -> String {
        match self {
            Self::Full(p) => p.to_string(),
            Self::Prefix(replacement) => {
                let rest = match matched_prefix {
                    // Everything matched `/`: a bare `/` leaves nothing to keep.
                    Some("/") | None if path == "/" => "",
                    Some("/") | None => path,
                    Some(prefix) => path.strip_prefix(prefix).unwrap_or(path),
                };
                join_prefix(replacement, rest)
            }
        }
    }
}

/// Joins a replacement prefix and the unmatched rest without doubling or losing the `/`.
fn join_prefix(replacement: &str, rest: &str) -> String {
    let base = replacement.trim_end_matches('/');
    let mut out = String::with_capacity(base.len() + rest.len() + 1);
    out.push_str(base);
    if rest.is_empty() {
        if out.is_empty() {
            out.push('/');
        }
    } else {
        if !rest.starts_with('/') {
            out.push('/');
        }
        out.push_str(rest);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_replacement_keeps_segments() {
        let p = |r: &str| PathModifier::Prefix(r.into());
        assert_eq!(
            p("/one").apply("/prefix/one/two", Some("/prefix/one")),
            "/one/two"
        );
        assert_eq!(
            p("/").apply("/strip-prefix/three", Some("/strip-prefix")),
            "/three"
        );
        assert_eq!(p("/").apply("/strip-prefix", Some("/strip-prefix")), "/");
        assert_eq!(
            p("/prefix").apply("/prefix/rewrite/one", Some("/prefix/rewrite")),
            "/prefix/one"
        );
        assert_eq!(p("/new").apply("/", Some("/")), "/new");
        assert_eq!(p("/new").apply("/a/b", Some("/")), "/new/a/b");
        assert_eq!(p("/new/").apply("/old/x", Some("/old")), "/new/x");
        assert_eq!(
            PathModifier::Full("/x".into()).apply("/a/b", Some("/a")),
            "/x"
        );
    }
}
