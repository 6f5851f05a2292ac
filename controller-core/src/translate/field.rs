//! Where a value sits in a route (`spec.rules[2].matches[0].path`), for the errors that name
//! it. Every rule passes its fields down, but only an error writes one out, so a field is a
//! chain of borrowed parts, copied freely and rendered by [`fmt::Display`] when needed.

use std::fmt;

/// A field path, rendered only on demand.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Field<'a> {
    /// The first part, as written (`spec`).
    Root(&'a str),
    /// `<parent>.<name>`.
    Child(&'a Field<'a>, &'static str),
    /// `<parent>.<name>[<index>]`.
    Item(&'a Field<'a>, &'static str, usize),
}

impl<'a> Field<'a> {
    /// `self.name`.
    pub(crate) fn child(&'a self, name: &'static str) -> Self {
        Self::Child(self, name)
    }

    /// `self.name[index]`.
    pub(crate) fn item(&'a self, name: &'static str, index: usize) -> Self {
        Self::Item(self, name, index)
    }
}

impl fmt::Display for Field<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Root(root) => f.write_str(root),
            Self::Child(parent, name) => write!(f, "{parent}.{name}"),
            Self::Item(parent, name, index) => write!(f, "{parent}.{name}[{index}]"),
        }
    }
}

impl From<Field<'_>> for String {
    fn from(field: Field<'_>) -> Self {
        field.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::Field;

    #[test]
    fn a_field_renders_as_its_path_from_the_root() {
        let spec = Field::Root("spec");
        let rule = spec.item("rules", 2);
        let matched = rule.item("matches", 0);
        assert_eq!(
            matched.child("path").to_string(),
            "spec.rules[2].matches[0].path"
        );
        assert_eq!(String::from(rule), "spec.rules[2]");
    }
}
