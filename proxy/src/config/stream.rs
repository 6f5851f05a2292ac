//! Reading a config document from its JSON text straight into a [`Compiler`]: each rule is
//! compiled as soon as it is read and then dropped, so a push never holds the whole parsed
//! document beside the table being built (tens of megabytes at 50,000 rules).
//!
//! The document is read exactly as [`cftunnel_config::Config`]'s own deserializer reads it
//! (same fields, defaults, `null` rules, unknown fields ignored, same errors), with the path of
//! a malformed value named as `serde_path_to_error` names it.
//!
//! Each rule is first taken as its JSON text: a controller pushes the whole document on every
//! change, so nearly every rule is one the table in service holds, recognised by its text
//! ([`Compiler::push_text`]) and never parsed again. Only a rule not seen before is read into
//! the config type. A document that turns out malformed is read a second time, each rule typed
//! as it comes, for the error the config type's own reader gives (the first pass can only
//! name a fault as deep as the rule, and the position inside it).

use super::compile::Compiler;
use cftunnel_config::Rule;
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use std::fmt;

/// What a document says besides its rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Header {
    pub(crate) version: i64,
    pub(crate) has_grpc_route: bool,
}

/// Reads the document in `text`, handing its rules to `compiler` in order.
///
/// # Errors
/// Text that is not one config document (and nothing after it but white space); the message
/// names the path of the value at fault (`rules[2].backends[0].weight: ...`).
pub(crate) fn read(text: &[u8], compiler: &mut Compiler<'_>) -> Result<Header, String> {
    read_with(text, Some(compiler)).map_err(|first| match read_with(text, None) {
        Err(precise) => precise,
        Ok(_) => first,
    })
}

/// One pass over the document: rules handed to `compiler` as their text, or, without one,
/// each read into the config type and dropped.
///
/// Text that is UTF-8 (as any document is) is checked as such once, whole, rather than value
/// by value as each rule's text is taken; other text is read as bytes, for the reader's own
/// error.
fn read_with(text: &[u8], compiler: Option<&mut Compiler<'_>>) -> Result<Header, String> {
    match std::str::from_utf8(text) {
        Ok(text) => read_from(serde_json::Deserializer::from_str(text), compiler),
        Err(_) => read_from(serde_json::Deserializer::from_slice(text), compiler),
    }
}

/// Only the second pass tracks the path of each value: the first, over a well-formed
/// document (nearly every push), need not pay for it.
fn read_from<'de, R: serde_json::de::Read<'de>>(
    mut de: serde_json::Deserializer<R>,
    compiler: Option<&mut Compiler<'_>>,
) -> Result<Header, String> {
    let header = match compiler {
        Some(compiler) => Document {
            compiler: Some(compiler),
        }
        .deserialize(&mut de)
        .map_err(|e| e.to_string())?,
        None => {
            let mut track = serde_path_to_error::Track::new();
            Document { compiler: None }
                .deserialize(serde_path_to_error::Deserializer::new(&mut de, &mut track))
                .map_err(|e| serde_path_to_error::Error::new(track.path(), e).to_string())?
        }
    };
    de.end().map_err(|e| e.to_string())?;
    Ok(header)
}

struct Document<'a, 'c> {
    compiler: Option<&'a mut Compiler<'c>>,
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
        let version = seq.next_element()?.unwrap_or_default();
        seq.next_element_seed(Rules {
            compiler: self.compiler,
        })?;
        let has_grpc_route = seq.next_element()?.unwrap_or_default();
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
                    version = Some(map.next_value()?);
                }
                Field::Rules => {
                    if rules {
                        return Err(de::Error::duplicate_field("rules"));
                    }
                    rules = true;
                    map.next_value_seed(Rules {
                        compiler: self.compiler.as_deref_mut(),
                    })?;
                }
                Field::HasGrpcRoute => {
                    if has_grpc_route.is_some() {
                        return Err(de::Error::duplicate_field("hasGrpcRoute"));
                    }
                    has_grpc_route = Some(map.next_value()?);
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
    compiler: Option<&'a mut Compiler<'c>>,
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
    compiler: Option<&'a mut Compiler<'c>>,
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
mod tests {
    use super::*;
    use crate::config::{compile, Cache, ConfigError};
    use crate::metrics::ProxyMetrics;

    type Outcome = Result<(i64, bool, usize), String>;

    /// The text read rule by rule into a table: version, gRPC flag and rule count, or why not.
    fn streamed(text: &str) -> Outcome {
        let metrics = ProxyMetrics::register(&mut Default::default());
        let mut cache = Cache::default();
        let mut compiler = Compiler::new(&mut cache, None);
        let header = read(text.as_bytes(), &mut compiler)?;
        let routes = compiler
            .finish(&metrics, header.version, header.has_grpc_route)
            .map_err(|e| e.to_string())?;
        Ok((header.version, header.has_grpc_route, routes.rule_count()))
    }

    /// The same text parsed whole into the config type, then compiled.
    fn whole(text: &str) -> Outcome {
        let metrics = ProxyMetrics::register(&mut Default::default());
        let mut de = serde_json::Deserializer::from_slice(text.as_bytes());
        let doc: cftunnel_config::Config =
            serde_path_to_error::deserialize(&mut de).map_err(|e| e.to_string())?;
        de.end().map_err(|e| e.to_string())?;
        let routes = compile(&doc, &metrics, &mut Cache::default()).map_err(|e| e.to_string())?;
        Ok((doc.version, doc.has_grpc_route, routes.rule_count()))
    }

    #[test]
    fn a_document_reads_as_the_config_type_reads_it() {
        let bad_regex = r#"{"matches": [{"path": {"type": "RegularExpression", "value": "(["}}]}"#;
        let cases = [
            r#"{"version": 3, "rules": [{"backends": []}, {}], "hasGrpcRoute": true}"#.to_owned(),
            r#"{"hasGrpcRoute": false, "rules": [{}], "version": 9}"#.to_owned(),
            r#"{"rules": null}"#.to_owned(),
            r#"{}"#.to_owned(),
            r#"{"version": 1, "extra": {"a": [1, {"b": null}]}, "rules": []}"#.to_owned(),
            r#"[5, [{"backends": []}], true]"#.to_owned(),
            r#"[5]"#.to_owned(),
            r#"[]"#.to_owned(),
            r#"{"version": 1, "version": 2}"#.to_owned(),
            r#"{"rules": [], "rules": []}"#.to_owned(),
            r#"{"hasGrpcRoute": true, "hasGrpcRoute": false}"#.to_owned(),
            r#"{"version": "x"}"#.to_owned(),
            r#"{"rules": {}}"#.to_owned(),
            r#"{"rules": [{}, {"filters": [{"type": "Nope"}]}]}"#.to_owned(),
            r#"{"rules": [{}, {"backends": [{"url": "http://x", "weight": -1}]}]}"#.to_owned(),
            r#"{"rules": []} trailing"#.to_owned(),
            r#"{"rules": []}  "#.to_owned(),
            r#""string""#.to_owned(),
            "null".to_owned(),
            String::new(),
            r#"{"rules": ["#.to_owned(),
            format!(r#"{{"rules": [{{}}, {bad_regex}]}}"#),
            // A malformed rule after a refused one: the document is refused as malformed.
            format!(r#"{{"rules": [{bad_regex}, 7]}}"#),
        ];
        for text in &cases {
            assert_eq!(streamed(text), whole(text), "{text}");
        }
    }

    /// Bytes that are not UTF-8 are refused with the reader's own message and position.
    #[test]
    fn text_that_is_not_utf8_is_refused_as_the_config_type_refuses_it() {
        let text = b"{\"rules\": [{\"name\": \"a\xffb\"}]}";
        let mut cache = Cache::default();
        let mut compiler = Compiler::new(&mut cache, None);
        let refused = read(text, &mut compiler).expect_err("refused");
        let whole = serde_path_to_error::deserialize::<_, cftunnel_config::Config>(
            &mut serde_json::Deserializer::from_slice(text),
        )
        .expect_err("refused")
        .to_string();
        assert_eq!(refused, whole);
        assert!(refused.starts_with("rules[0].name: "), "{refused}");
    }

    /// The rule a request to `host` finds, by address: equal addresses are one shared rule.
    fn rule_at(routes: &crate::routes::Routes, host: &str) -> *const crate::rule::Rule {
        let headers = http::HeaderMap::new();
        let view = crate::route::RequestView {
            method: &http::Method::GET,
            path: "/",
            query: None,
            headers: &headers,
        };
        routes
            .table
            .find(host, &view)
            .map_or(std::ptr::null(), |hit| std::sync::Arc::as_ptr(hit.rule))
    }

    /// A push read from text shares each rule whose text the table in service was built from,
    /// compiles the others, and reads a rule spelled differently as the same rule.
    #[test]
    fn a_rule_pushed_again_with_the_same_text_is_shared_not_parsed_again() {
        let metrics = ProxyMetrics::register(&mut Default::default());
        let mut cache = Cache::default();
        let rule = |host: &str, port: u16| {
            format!(
                r#"{{"hostnames": ["{host}"], "backends": [{{"url": "http://127.0.0.1:{port}", "weight": 1}}]}}"#
            )
        };
        let doc = |rules: &[String]| format!(r#"{{"version": 1, "rules": [{}]}}"#, rules.join(","));
        let mut push = |text: String| {
            super::super::compile::compile_json(text.as_bytes(), 0, &metrics, &mut cache)
                .expect("compiles")
        };
        let first = push(doc(&[rule("a.test", 1), rule("b.test", 2)]));
        let second = push(doc(&[rule("a.test", 1), rule("b.test", 3)]));
        assert_eq!(rule_at(&first, "a.test"), rule_at(&second, "a.test"));
        assert_ne!(rule_at(&first, "b.test"), rule_at(&second, "b.test"));
        assert!(!rule_at(&second, "b.test").is_null());
        // The same rule with other spacing: compiled again, and served the same.
        let spaced = rule("a.test", 1).replace("\": ", "\" :  ");
        let third = push(doc(&[spaced, rule("b.test", 3)]));
        assert_ne!(rule_at(&second, "a.test"), rule_at(&third, "a.test"));
        assert!(!rule_at(&third, "a.test").is_null());
        assert_eq!(rule_at(&second, "b.test"), rule_at(&third, "b.test"));
    }

    /// A stale version is refused as stale, before any rule is looked at.
    #[test]
    fn a_stale_document_is_refused_as_stale_whatever_its_rules() {
        let metrics = ProxyMetrics::register(&mut Default::default());
        let text = br#"{"version": 4, "rules": [{"matches": [{"path": {"type": "RegularExpression", "value": "(["}}]}]}"#;
        let refused = super::super::compile::compile_json(text, 5, &metrics, &mut Cache::default());
        assert!(
            matches!(
                refused,
                Err(ConfigError::Stale {
                    pushed: 4,
                    current: 5
                })
            ),
            "{refused:?}"
        );
    }
}
