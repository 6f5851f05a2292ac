//! Checks of the chart's files as text and data, no tool needed: the `.Values` paths the
//! templates read, the arguments of their `and` and `or`, and the CRD's schema against the API
//! server's structural-schema rules.

use serde_yaml_ng::Value;

/// The `.Values` paths `text` reads (`a.b.c` for `.Values.a.b.c`).
pub fn values_read(text: &str) -> Vec<String> {
    let re = regex::Regex::new(r"\.Values\.([A-Za-z0-9_]+(?:\.[A-Za-z0-9_]+)*)").expect("regex");
    re.captures_iter(text).map(|c| c[1].to_owned()).collect()
}

/// The text of every action of a template, comments dropped and string literals emptied.
fn actions(text: &str) -> Vec<String> {
    let re = regex::Regex::new(r"(?s)\{\{-?(.*?)-?\}\}").expect("regex");
    let comment = regex::Regex::new(r"(?s)/\*.*?\*/").expect("regex");
    let string = regex::Regex::new(r#""(?:[^"\\]|\\.)*""#).expect("regex");
    re.captures_iter(text)
        .map(|c| {
            let action = comment.replace_all(&c[1], "");
            string.replace_all(&action, r#""""#).trim().to_owned()
        })
        .filter(|a| !a.is_empty())
        .collect()
}

/// The arguments of a call whose text starts at `rest` (after its name), up to the closing
/// parenthesis of an enclosing group or the end of the pipeline stage.
fn arguments(rest: &str) -> Vec<String> {
    let mut args = Vec::new();
    let mut depth = 0usize;
    let mut current = String::new();
    let mut quoted = false;
    for c in rest.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                current.push(c);
            }
            _ if quoted => current.push(c),
            '(' => {
                depth += 1;
                current.push(c);
            }
            ')' if depth == 0 => break,
            ')' => {
                depth -= 1;
                current.push(c);
            }
            '|' if depth == 0 => break,
            c if c.is_whitespace() && depth == 0 => {
                if !current.is_empty() {
                    args.push(std::mem::take(&mut current));
                }
            }
            c => current.push(c),
        }
    }
    if !current.is_empty() {
        args.push(current);
    }
    args
}

/// Calls of `and` and `or` in `text` whose result would differ, or fail, where every argument
/// is evaluated: Go before 1.18 (Helm 3.9 and older) evaluates them all, later Go stops at the
/// first that decides. An argument is safe when it is a variable, a field or a literal, or
/// `(not` one of those`)`, and does not reach into an earlier argument (`$x` then `$x.data`,
/// which fails where `$x` is empty).
pub fn short_circuit_reliance(text: &str) -> Vec<String> {
    let call = regex::Regex::new(r"(?:^|[\s(])(and|or)\s").expect("regex");
    let simple =
        regex::Regex::new(r#"^(\$[A-Za-z0-9_]*|\.)?[A-Za-z0-9_.$]*$|^"[^"]*"$"#).expect("regex");
    let negated = regex::Regex::new(r"^\(not\s+(\S+)\)$").expect("regex");
    let mut faults = Vec::new();
    for action in actions(text) {
        for m in call.captures_iter(&action) {
            let start = m.get(0).expect("match").end();
            let args = arguments(&action[start..]);
            let mut chains: Vec<String> = Vec::new();
            for arg in &args {
                let chain = match negated.captures(arg) {
                    Some(c) => c[1].to_owned(),
                    None => arg.clone(),
                };
                if !simple.is_match(&chain) {
                    faults.push(format!("{{{{ {action} }}}}: `{arg}` is evaluated anyway"));
                } else if chains
                    .iter()
                    .any(|earlier| chain.starts_with(&format!("{earlier}.")))
                {
                    faults.push(format!(
                        "{{{{ {action} }}}}: `{arg}` is evaluated even where the argument before it is empty"
                    ));
                }
                chains.push(chain);
            }
        }
    }
    faults
}

/// Where `schema` (a CRD version's `openAPIV3Schema`) breaks the API server's rules for a
/// structural schema: every node (the root, each property, additional property and item)
/// states its `type`, unless it is `x-kubernetes-int-or-string` or
/// `x-kubernetes-preserve-unknown-fields`; inside `allOf`, `anyOf`, `oneOf` and `not`, no
/// `type`, `default`, `additionalProperties`, `nullable` or `description`, but for the
/// `anyOf: [{type: integer}, {type: string}]` of an int-or-string; `metadata` at the root
/// holds at most `name` and `generateName`.
pub fn structural_faults(schema: &Value) -> Vec<String> {
    let mut faults = Vec::new();
    node(schema, "openAPIV3Schema", &mut faults);
    if let Some(metadata) = schema.get("properties").and_then(|p| p.get("metadata")) {
        let fields: Vec<&str> = metadata
            .get("properties")
            .and_then(Value::as_mapping)
            .into_iter()
            .flatten()
            .filter_map(|(k, _)| k.as_str())
            .collect();
        if fields.iter().any(|f| *f != "name" && *f != "generateName") {
            faults.push(format!("openAPIV3Schema.properties.metadata: {fields:?}"));
        }
    }
    faults
}

fn flag(schema: &Value, key: &str) -> bool {
    schema.get(key).and_then(Value::as_bool) == Some(true)
}

fn node(schema: &Value, path: &str, faults: &mut Vec<String>) {
    let int_or_string = flag(schema, "x-kubernetes-int-or-string");
    if schema.get("type").is_none()
        && !int_or_string
        && !flag(schema, "x-kubernetes-preserve-unknown-fields")
    {
        faults.push(format!("{path}: no type"));
    }
    if let Some(properties) = schema.get("properties").and_then(Value::as_mapping) {
        for (name, property) in properties {
            let name = name.as_str().unwrap_or_default();
            node(property, &format!("{path}.properties.{name}"), faults);
        }
    }
    if let Some(additional) = schema
        .get("additionalProperties")
        .filter(|a| a.is_mapping())
    {
        node(additional, &format!("{path}.additionalProperties"), faults);
    }
    if let Some(items) = schema.get("items") {
        node(items, &format!("{path}.items"), faults);
    }
    for junctor in ["allOf", "anyOf", "oneOf", "not"] {
        let Some(value) = schema.get(junctor) else {
            continue;
        };
        let branches: Vec<&Value> = match value {
            Value::Sequence(s) => s.iter().collect(),
            other => vec![other],
        };
        for (i, branch) in branches.into_iter().enumerate() {
            let int_or_string_branch = int_or_string
                && junctor == "anyOf"
                && branch.as_mapping().is_some_and(|m| m.len() == 1)
                && matches!(
                    branch.get("type").and_then(Value::as_str),
                    Some("integer" | "string")
                );
            if int_or_string_branch {
                continue;
            }
            junctor_node(branch, &format!("{path}.{junctor}[{i}]"), faults);
        }
    }
}

/// A schema inside a logical junctor: no fields that would give it a structure of its own.
fn junctor_node(schema: &Value, path: &str, faults: &mut Vec<String>) {
    for key in [
        "type",
        "default",
        "additionalProperties",
        "nullable",
        "description",
    ] {
        if schema.get(key).is_some() {
            faults.push(format!("{path}: {key} inside a logical junctor"));
        }
    }
    for key in ["properties", "items"] {
        let children: Vec<(String, &Value)> = match (key, schema.get(key)) {
            ("properties", Some(Value::Mapping(m))) => m
                .iter()
                .map(|(k, v)| (k.as_str().unwrap_or_default().to_owned(), v))
                .collect(),
            ("items", Some(v)) => vec![(String::new(), v)],
            _ => Vec::new(),
        };
        for (name, child) in children {
            junctor_node(child, &format!("{path}.{key}.{name}"), faults);
        }
    }
}

#[test]
fn the_short_circuit_check_finds_what_go_1_17_would_fail_on() {
    let faults = |t: &str| short_circuit_reliance(t);
    // The pattern Helm 3.9 fails on, with `lookup` finding nothing.
    assert_eq!(
        faults("{{- if and $existing $existing.data (index $existing.data .Values.k) }}").len(),
        2
    );
    assert_eq!(faults("{{ if or .Values.a (include \"x\" .) }}").len(), 1);
    assert!(faults("{{- if and (not $token) (not .Values.a.b) }}").is_empty());
    assert!(faults("{{- /* and $x $x.y in a comment */}}").is_empty());
    assert!(faults("{{ .Values.brand | default \"x\" }}").is_empty());
    assert!(faults("{{- fail \"set this or that, and not both\" }}").is_empty());
}

#[test]
fn the_structural_check_finds_an_untyped_node() {
    let schema: Value = serde_yaml_ng::from_str(
        "type: object\nproperties:\n  spec:\n    properties:\n      n: {x-kubernetes-int-or-string: true, anyOf: [{type: integer}, {type: string}]}\n      m: {anyOf: [{type: string}]}\n",
    )
    .expect("YAML");
    assert_eq!(
        structural_faults(&schema),
        [
            "openAPIV3Schema.properties.spec: no type",
            "openAPIV3Schema.properties.spec.properties.m: no type",
            "openAPIV3Schema.properties.spec.properties.m.anyOf[0]: type inside a logical junctor",
        ]
    );
}
