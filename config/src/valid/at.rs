//! Where a checked value sits in its rule (`matches[0].headers[1].name`), written out only when
//! a check fails: a valid rule, the common case, costs no string.

use std::fmt;

/// A field path relative to a rule, built on the stack as the checks descend.
#[derive(Debug, Clone, Copy)]
pub(super) enum At<'a> {
    /// The rule itself.
    Rule,
    /// `parent.name`, or `name` under the rule.
    Field(&'a At<'a>, &'a str),
    /// `parent[index]`.
    Index(&'a At<'a>, usize),
}

impl<'a> At<'a> {
    pub(super) fn field(&'a self, name: &'a str) -> Self {
        Self::Field(self, name)
    }

    pub(super) fn index(&'a self, index: usize) -> Self {
        Self::Index(self, index)
    }
}

impl fmt::Display for At<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Rule => Ok(()),
            Self::Field(At::Rule, name) => f.write_str(name),
            Self::Field(parent, name) => write!(f, "{parent}.{name}"),
            Self::Index(parent, index) => write!(f, "{parent}[{index}]"),
        }
    }
}

impl From<At<'_>> for String {
    fn from(at: At<'_>) -> Self {
        at.to_string()
    }
}

impl From<&At<'_>> for String {
    fn from(at: &At<'_>) -> Self {
        at.to_string()
    }
}
