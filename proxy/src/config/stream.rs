//! Reading a config document from its JSON text straight into a [`RuleSink`] (the compiler): each rule is
//! compiled as soon as it is read and then dropped, so a push never holds the whole parsed
//! document beside the table being built (tens of megabytes at 50,000 rules).
//!
//! The document is read exactly as [`cftunnel_config::Config`]'s own deserializer reads it
//! (same fields, defaults, `null` rules, unknown fields ignored, same errors), with the path of
//! a malformed value named as `serde_path_to_error` names it.
//!
//! Each rule is first taken as its JSON text: a controller pushes the whole document on every
//! change, so nearly every rule is one the table in service holds, recognised by its text
//! ([`RuleSink::push_text`]) and never parsed again. Only a rule not seen before is read into
//! the config type. A document that turns out malformed is read a second time, each rule typed
//! as it comes, for the error the config type's own reader gives (the first pass can only
//! name a fault as deep as the rule, and the position inside it).
//!
//! A document whose `version` comes before its `rules` (as the controller writes it) and is
//! stale against the version in service hands no rule to the compiler: each is only read into
//! the config type, so a malformed one still refuses the document as malformed, and the stale
//! push is answered without compiling the table it would have built.

use cftunnel_config::{Config, Rule};
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use std::fmt;

/// What takes a document's rules in order, each as its JSON text, as they are read.
pub(crate) trait RuleSink {
    /// Takes one rule; an error refuses the document (the reader names where).
    fn push_text(&mut self, text: &str) -> Result<(), serde_json::Error>;
}

/// What a document says besides its rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Header {
    pub(crate) version: i64,
    pub(crate) has_grpc_route: bool,
}

/// Reads the document in `text`, handing its rules to `compiler` in order, unless a `version`
/// read before them is stale against `current`, the version in service
/// ([`super::is_stale`]): then no rule reaches the compiler, and the caller refuses the
/// document on its [`Header::version`].
///
/// # Errors
/// Text that is not one config document (and nothing after it but white space); the message
/// names the path of the value at fault (`rules[2].backends[0].weight: ...`).
pub(crate) fn read(
    text: &[u8],
    current: i64,
    compiler: &mut dyn RuleSink,
) -> Result<Header, String> {
    read_with(text, current, Some(compiler)).map_err(|first| match read_with(text, current, None) {
        Err(precise) => precise,
        Ok(_) => first,
    })
}

/// Reads the document in `text` whole into the config type, as a push's text is read: the
/// same document is refused with the same message.
///
/// # Errors
/// As [`read`].
pub(crate) fn read_document(text: &[u8]) -> Result<Config, String> {
    let mut rules = Collect(Vec::new());
    let header = read(text, 0, &mut rules)?;
    Ok(Config {
        version: header.version,
        rules: rules.0,
        has_grpc_route: header.has_grpc_route,
    })
}

/// Takes each rule into the config type.
struct Collect(Vec<Rule>);

impl RuleSink for Collect {
    fn push_text(&mut self, text: &str) -> Result<(), serde_json::Error> {
        self.0.push(serde_json::from_str(text)?);
        Ok(())
    }
}

/// One pass over the document: rules handed to `compiler` as their text, or, without one,
/// each read into the config type and dropped.
///
/// Text that is UTF-8 (as any document is) is checked as such once, whole, rather than value
/// by value as each rule's text is taken; other text is read as bytes, for the reader's own
/// error.
fn read_with(
    text: &[u8],
    current: i64,
    compiler: Option<&mut dyn RuleSink>,
) -> Result<Header, String> {
    match std::str::from_utf8(text) {
        Ok(text) => read_from(serde_json::Deserializer::from_str(text), current, compiler),
        Err(_) => read_from(
            serde_json::Deserializer::from_slice(text),
            current,
            compiler,
        ),
    }
}

/// Only the second pass tracks the path of each value: the first, over a well-formed
/// document (nearly every push), need not pay for it.
fn read_from<'de, R: serde_json::de::Read<'de>>(
    mut de: serde_json::Deserializer<R>,
    current: i64,
    compiler: Option<&mut dyn RuleSink>,
) -> Result<Header, String> {
    let header = match compiler {
        Some(compiler) => Document {
            current,
            compiler: Some(compiler),
        }
        .deserialize(&mut de)
        .map_err(|e| e.to_string())?,
        None => {
            let mut track = serde_path_to_error::Track::new();
            Document {
                current,
                compiler: None,
            }
            .deserialize(serde_path_to_error::Deserializer::new(&mut de, &mut track))
            .map_err(|e| serde_path_to_error::Error::new(track.path(), e).to_string())?
        }
    };
    de.end().map_err(|e| e.to_string())?;
    Ok(header)
}

struct Document<'a, 'c> {
    /// The version in service: a document stale against it hands its rules to no compiler.
    current: i64,
    compiler: Option<&'a mut (dyn RuleSink + 'c)>,
}

const FIELDS: &[&str] = &["version", "rules", "hasGrpcRoute"];

impl<'de> DeserializeSeed<'de> for Document<'_, '_> {
    type Value = Header;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Header, D::Error> {
        deserializer.deserialize_struct("Config", FIELDS, self)
    }
}

impl<'de> Visitor<'de> for Document<'_, '_> {
    type Value = Header;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("struct Config")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Header, A::Error> {
        let version = seq
            .next_element::<Option<i64>>()?
            .flatten()
            .unwrap_or_default();
        let compiler = self
            .compiler
            .filter(|_| !super::is_stale(version, self.current));
        seq.next_element_seed(Rules { compiler })?;
        let has_grpc_route = seq
            .next_element::<Option<bool>>()?
            .flatten()
            .unwrap_or_default();
        Ok(Header {
            version,
            has_grpc_route,
        })
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<Header, A::Error> {
        let mut version = None;
        let mut rules = false;
        let mut has_grpc_route = None;
        while let Some(key) = map.next_key::<Field>()? {
            match key {
                Field::Version => {
                    if version.is_some() {
                        return Err(de::Error::duplicate_field("version"));
                    }
                    // `null` is absent, as Go reads it.
                    version = Some(map.next_value::<Option<i64>>()?.unwrap_or_default());
                }
                Field::Rules => {
                    if rules {
                        return Err(de::Error::duplicate_field("rules"));
                    }
                    rules = true;
                    // A stale version read so far: the rules are only read.
                    let stale = version.is_some_and(|v| super::is_stale(v, self.current));
                    let compiler = self.compiler.as_deref_mut().filter(|_| !stale);
                    map.next_value_seed(Rules { compiler })?;
                }
                Field::HasGrpcRoute => {
                    if has_grpc_route.is_some() {
                        return Err(de::Error::duplicate_field("hasGrpcRoute"));
                    }
                    has_grpc_route = Some(map.next_value::<Option<bool>>()?.unwrap_or_default());
                }
                Field::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(Header {
            version: version.unwrap_or_default(),
            has_grpc_route: has_grpc_route.unwrap_or_default(),
        })
    }
}

enum Field {
    Version,
    Rules,
    HasGrpcRoute,
    Other,
}

impl<'de> de::Deserialize<'de> for Field {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_identifier(FieldVisitor)
    }
}

struct FieldVisitor;

impl Visitor<'_> for FieldVisitor {
    type Value = Field;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("field identifier")
    }

    fn visit_u64<E: de::Error>(self, index: u64) -> Result<Field, E> {
        Ok(match index {
            0 => Field::Version,
            1 => Field::Rules,
            2 => Field::HasGrpcRoute,
            _ => Field::Other,
        })
    }

    fn visit_str<E: de::Error>(self, name: &str) -> Result<Field, E> {
        self.visit_bytes(name.as_bytes())
    }

    fn visit_bytes<E: de::Error>(self, name: &[u8]) -> Result<Field, E> {
        Ok(match name {
            b"version" => Field::Version,
            b"rules" => Field::Rules,
            b"hasGrpcRoute" => Field::HasGrpcRoute,
            _ => Field::Other,
        })
    }
}

/// `rules`: a list, or `null` for none (as Go encodes an empty slice).
struct Rules<'a, 'c> {
    compiler: Option<&'a mut (dyn RuleSink + 'c)>,
}

impl<'de> DeserializeSeed<'de> for Rules<'_, '_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_option(self)
    }
}

impl<'de> Visitor<'de> for Rules<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("option")
    }

    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_seq(List {
            compiler: self.compiler,
        })
    }
}

struct List<'a, 'c> {
    compiler: Option<&'a mut (dyn RuleSink + 'c)>,
}

impl<'de> Visitor<'de> for List<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a sequence")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        match self.compiler {
            Some(compiler) => {
                while let Some(text) = seq.next_element::<&RawValue>()? {
                    compiler.push_text(text.get()).map_err(de::Error::custom)?;
                }
            }
            None => while seq.next_element::<Rule>()?.is_some() {},
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
