use serde_json::{json, Value};

use super::{apply, update, update_subresource};

fn config(data: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}, "data": data})
}

/// Each manager's entry as `(manager, operation, fieldsV1)`.
fn managers(object: &Value) -> Vec<(String, String, Value)> {
    object["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            (
                e["manager"].as_str().unwrap_or_default().to_owned(),
                e["operation"].as_str().unwrap_or_default().to_owned(),
                e["fieldsV1"].clone(),
            )
        })
        .collect()
}

fn entry(manager: &str, operation: &str, fields: Value) -> (String, String, Value) {
    (manager.to_owned(), operation.to_owned(), fields)
}

/// `object` after `manager` applies `applied` to it, unforced.
fn applied(mut object: Value, applied: &Value, manager: &str) -> Value {
    apply(&mut object, applied, manager, false).expect("the apply does not conflict");
    object
}

#[test]
fn an_apply_records_the_fields_it_sets_as_fields_v1() {
    let sent = json!({"apiVersion": "v1", "kind": "ConfigMap",
                      "metadata": {"name": "a", "labels": {"app": "web"}, "resourceVersion": "7"},
                      "data": {"k": "v"}, "status": {"ready": true}});
    let object = applied(sent.clone(), &sent, "ctl");
    assert_eq!(
        object["metadata"]["managedFields"],
        json!([{
            "manager": "ctl", "operation": "Apply", "apiVersion": "v1", "fieldsType": "FieldsV1",
            "fieldsV1": {"f:data": {"f:k": {}}, "f:metadata": {"f:labels": {"f:app": {}}}},
        }])
    );
}

#[test]
fn fields_an_applier_no_longer_sends_are_removed_with_the_maps_they_emptied() {
    let object = applied(
        config(json!({})),
        &config(json!({"k": "1", "k2": "2"})),
        "ctl",
    );
    let object = applied(object, &config(json!({"k": "1"})), "ctl");
    assert_eq!(object["data"], json!({"k": "1"}));

    let without_data = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}});
    let object = applied(object, &without_data, "ctl");
    assert_eq!(object.get("data"), None);
    assert_eq!(object["metadata"].get("managedFields"), None);
}

#[test]
fn a_field_another_manager_also_owns_stays_when_one_drops_it() {
    let object = applied(config(json!({})), &config(json!({"k": "1"})), "a");
    // The same value: no conflict, both own it.
    let object = applied(object, &config(json!({"k": "1"})), "b");
    assert_eq!(
        managers(&object),
        [
            entry("a", "Apply", json!({"f:data": {"f:k": {}}})),
            entry("b", "Apply", json!({"f:data": {"f:k": {}}})),
        ]
    );
    let object = applied(object, &config(json!({"other": "x"})), "a");
    assert_eq!(object["data"], json!({"k": "1", "other": "x"}));
}

#[test]
fn another_managers_field_with_a_different_value_conflicts_unless_forced() {
    let before = applied(config(json!({})), &config(json!({"k": "1", "j": "1"})), "a");
    let mut object = before.clone();
    let conflict = apply(&mut object, &config(json!({"k": "2"})), "b", false);
    assert_eq!(
        conflict,
        Err("Apply failed with 1 conflict(s): conflict with \"a\": .data.k".to_owned())
    );
    assert_eq!(object, before, "a refused apply changes nothing");

    apply(&mut object, &config(json!({"k": "2"})), "b", true).expect("a forced apply");
    assert_eq!(object["data"], json!({"k": "2", "j": "1"}));
    assert_eq!(
        managers(&object),
        [
            entry("a", "Apply", json!({"f:data": {"f:j": {}}})),
            entry("b", "Apply", json!({"f:data": {"f:k": {}}})),
        ]
    );
}

#[test]
fn an_update_takes_the_fields_it_changes_and_the_applier_then_conflicts() {
    let object = applied(
        config(json!({})),
        &config(json!({"k": "1", "j": "1"})),
        "ctl",
    );
    let mut edited = object.clone();
    edited["data"]["k"] = json!("2");
    update(Some(&object), &mut edited, "kubectl-edit");
    assert_eq!(
        managers(&edited),
        [
            entry("ctl", "Apply", json!({"f:data": {"f:j": {}}})),
            entry("kubectl-edit", "Update", json!({"f:data": {"f:k": {}}})),
        ]
    );
    let mut object = edited;
    let conflict = apply(
        &mut object,
        &config(json!({"k": "1", "j": "1"})),
        "ctl",
        false,
    );
    assert_eq!(
        conflict,
        Err("Apply failed with 1 conflict(s): conflict with \"kubectl-edit\": .data.k".to_owned())
    );
}

#[test]
fn an_appliers_own_earlier_update_is_another_managers_fields() {
    let mut object = config(json!({"k": "1"}));
    update(None, &mut object, "ctl");
    assert_eq!(
        managers(&object),
        [entry("ctl", "Update", json!({"f:data": {"f:k": {}}}))]
    );
    let conflict = apply(&mut object, &config(json!({"k": "2"})), "ctl", false);
    assert_eq!(
        conflict,
        Err("Apply failed with 1 conflict(s): conflict with \"ctl\": .data.k".to_owned())
    );
}

#[test]
fn fields_a_write_removes_are_no_ones() {
    let object = applied(
        config(json!({})),
        &config(json!({"k": "1", "j": "1"})),
        "ctl",
    );
    let mut edited = object.clone();
    if let Some(data) = edited["data"].as_object_mut() {
        data.remove("j");
    }
    update(Some(&object), &mut edited, "user");
    assert_eq!(
        managers(&edited),
        [entry("ctl", "Apply", json!({"f:data": {"f:k": {}}}))]
    );
}

#[test]
fn a_write_through_the_scale_subresource_is_recorded_as_such() {
    let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment",
                            "metadata": {"name": "web"}, "spec": {"replicas": 1}});
    let object = applied(deployment.clone(), &deployment, "ctl");
    let mut scaled = object.clone();
    scaled["spec"]["replicas"] = json!(3);
    update_subresource(Some(&object), &mut scaled, "hpa", Some("scale"));
    let entries = scaled["metadata"]["managedFields"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        entries.len(),
        1,
        "ctl owned only spec.replicas: {entries:?}"
    );
    assert_eq!(
        (
            &entries[0]["manager"],
            &entries[0]["operation"],
            &entries[0]["subresource"]
        ),
        (&json!("hpa"), &json!("Update"), &json!("scale"))
    );
    // The same manager writing the object itself is another entry.
    let mut edited = scaled.clone();
    edited["spec"]["paused"] = json!(true);
    update(Some(&scaled), &mut edited, "hpa");
    assert_eq!(
        managers(&edited)
            .into_iter()
            .map(|(m, op, _)| (m, op))
            .collect::<Vec<_>>(),
        [
            ("hpa".to_owned(), "Update".to_owned()),
            ("hpa".to_owned(), "Update".to_owned())
        ]
    );
}

fn pod_template(env: Value) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
           "spec": {"template": {"spec": {"containers": [{"name": "proxy", "env": env}]}}}})
}

fn env_of(object: &Value) -> Value {
    object["spec"]["template"]["spec"]["containers"][0]["env"].clone()
}

/// `object` edited by `edit` under the update of `manager`.
fn edited(object: &Value, manager: &str, edit: impl FnOnce(&mut Value)) -> Value {
    let mut after = object.clone();
    edit(&mut after);
    update(Some(object), &mut after, manager);
    after
}

#[test]
fn items_of_keyed_lists_are_owned_field_by_field() {
    let token = json!({"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}});
    let ours = pod_template(json!([token, {"name": "GRACE", "value": "30s"}]));
    let object = applied(ours.clone(), &ours, "ctl");
    let literal = edited(&object, "kubectl-set", |o| {
        o["spec"]["template"]["spec"]["containers"][0]["env"][0] =
            json!({"name": "TOKEN", "value": "literal"});
    });
    let owned = &managers(&literal)[1];
    assert_eq!(
        owned,
        &entry(
            "kubectl-set",
            "Update",
            json!({"f:spec": {"f:template": {"f:spec": {"f:containers": {
                "k:{\"name\":\"proxy\"}": {".": {}, "f:env": {
                    "k:{\"name\":\"TOKEN\"}": {".": {}, "f:value": {}},
                }},
            }}}}})
        )
    );
    // A forced apply sets `valueFrom` again and keeps the `value` it does not own, as a real
    // server does (its validation then refuses the result).
    let mut object = literal;
    apply(&mut object, &ours, "ctl", true).expect("no conflict");
    assert_eq!(
        env_of(&object),
        json!([{"name": "TOKEN", "value": "literal",
                "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
               {"name": "GRACE", "value": "30s"}])
    );
}

#[test]
fn an_item_the_applier_drops_goes_and_one_another_manager_added_stays() {
    let both = pod_template(json!([{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]));
    let object = applied(both.clone(), &both, "ctl");
    let added = edited(&object, "user", |o| {
        if let Some(env) = o["spec"]["template"]["spec"]["containers"][0]["env"].as_array_mut() {
            env.push(json!({"name": "C", "value": "3"}));
        }
    });
    let object = applied(
        added,
        &pod_template(json!([{"name": "A", "value": "1"}])),
        "ctl",
    );
    assert_eq!(
        env_of(&object),
        json!([{"name": "A", "value": "1"}, {"name": "C", "value": "3"}])
    );
    // A field another manager changed in the item keeps it when the applier drops the item.
    let changed = edited(&object, "user", |o| {
        o["spec"]["template"]["spec"]["containers"][0]["env"][0]["value"] = json!("9");
    });
    let without_env = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
                             "spec": {"template": {"spec": {"containers": [{"name": "proxy"}]}}}});
    let object = applied(changed, &without_env, "ctl");
    assert_eq!(
        env_of(&object),
        json!([{"name": "A", "value": "9"}, {"name": "C", "value": "3"}])
    );
}

#[test]
fn a_label_selector_is_one_field() {
    let policy = |labels: Value| {
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
               "metadata": {"name": "p"}, "spec": {"podSelector": {"matchLabels": labels}}})
    };
    let ours = policy(json!({"app": "proxy"}));
    let object = applied(ours.clone(), &ours, "ctl");
    assert_eq!(
        managers(&object),
        [entry(
            "ctl",
            "Apply",
            json!({"f:spec": {"f:podSelector": {}}})
        )]
    );
    let narrowed = edited(&object, "user", |o| {
        o["spec"]["podSelector"]["matchLabels"]["extra"] = json!("x");
    });
    let mut object = narrowed;
    let conflict = apply(&mut object, &ours, "ctl", false);
    assert_eq!(
        conflict,
        Err(
            "Apply failed with 1 conflict(s): conflict with \"user\": .spec.podSelector".to_owned()
        )
    );
    apply(&mut object, &ours, "ctl", true).expect("a forced apply");
    assert_eq!(
        object["spec"], ours["spec"],
        "the selector taken back whole"
    );
}
