//! The exact status patches, as kubelet makes them: a strategic merge patch on the `status`
//! subresource, computed two-way from the pod as last read, with the pod's UID as the only
//! precondition (`metadata.uid` in the body; no resourceVersion). A pod deleted and re-created
//! under the same name answers 409 and never receives its predecessor's status.
//!
//! `status.conditions` is a map list keyed by `type` (patch strategy merge): the patch carries
//! only the conditions that changed, each with its `type`, so kubelet's own conditions are never
//! touched. A JSON merge patch would replace the whole list: never used.
//!
//! Equality is kubelet's `isPodStatusByKubeletEqual` after `normalizeStatus`: times to whole
//! seconds (what the API stores), container statuses in a fixed order.
use k8s_openapi::api::core::v1::{PodCondition, PodStatus};
use serde_json::{json, Map, Value};

use super::KubeError;

pub const CONTENT_TYPE: &str = "application/strategic-merge-patch+json";

/// Lists of `PodStatus` with patch strategy merge, and their merge keys. Every other list is
/// atomic: replaced whole when it differs (containerStatuses, initContainerStatuses).
const MERGE_LISTS: &[(&str, &str)] = &[
    ("conditions", "type"),
    ("podIPs", "ip"),
    ("hostIPs", "ip"),
    ("resourceClaimStatuses", "name"),
];

/// kubelet's `normalizeStatus`: the JSON form (times are whole seconds there), regular container
/// statuses sorted by name so that order never makes two statuses differ.
pub fn normalize(status: &PodStatus) -> Result<Value, KubeError> {
    let mut s = status.clone();
    if let Some(cs) = s.container_statuses.as_mut() {
        cs.sort_by(|a, b| a.name.cmp(&b.name));
    }
    Ok(serde_json::to_value(&s)?)
}

/// Normalized equality of two statuses (kubelet's no-op check).
pub fn same_status(a: &PodStatus, b: &PodStatus) -> bool {
    match (normalize(a), normalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// Normalized equality of two sets of conditions, by type (order does not matter).
pub fn same_conditions(a: &[PodCondition], b: &[PodCondition]) -> bool {
    a.len() == b.len()
        && a.iter().all(|x| {
            b.iter().any(|y| {
                y.type_ == x.type_ && serde_json::to_value(x).ok() == serde_json::to_value(y).ok()
            })
        })
}

/// The body of a status patch: the UID precondition and the status part.
pub fn body(uid: &str, status: Value) -> Value {
    json!({ "metadata": { "uid": uid }, "status": status })
}

/// `conditions` mode: the observer's conditions that differ from `base` (the pod's conditions
/// as last read), as a strategic merge patch. `None`: nothing to write.
///
/// Only types in `desired` are compared: the agent never deletes a condition (its OOMKilled is
/// history) and never names kubelet's.
pub fn conditions_patch(
    uid: &str,
    base: &[PodCondition],
    desired: &[PodCondition],
) -> Result<Option<Value>, KubeError> {
    let base: Vec<&PodCondition> = base
        .iter()
        .filter(|c| desired.iter().any(|d| d.type_ == c.type_))
        .collect();
    let old = json!({ "conditions": serde_json::to_value(&base)? });
    let new = json!({ "conditions": serde_json::to_value(desired)? });
    // No $setElementOrder: it would name only the observer's types; without it the server
    // keeps the list's order and appends new types.
    Ok(diff(&old, &new, false).map(|status| body(uid, status)))
}

/// `full` mode: the two-way strategic merge patch from `base` (the status in the API) to
/// `desired`, kubelet's `CreateTwoWayMergePatch(Pod{status: old}, Pod{uid, status: new})`.
pub fn status_patch(
    uid: &str,
    base: &PodStatus,
    desired: &PodStatus,
) -> Result<Option<Value>, KubeError> {
    let old = normalize(base)?;
    let new = normalize(desired)?;
    Ok(diff(&old, &new, true).map(|status| body(uid, status)))
}

/// Two-way diff of JSON objects with strategic-merge semantics for `MERGE_LISTS`.
fn diff(old: &Value, new: &Value, set_order: bool) -> Option<Value> {
    match (old, new) {
        (Value::Object(o), Value::Object(n)) => {
            let mut out = Map::new();
            for (k, nv) in n {
                let ov = o.get(k).unwrap_or(&Value::Null);
                if let Some(key) = merge_key(k) {
                    if let (Some(ol), Some(nl)) = (list(ov), nv.as_array()) {
                        if let Some((patch, order)) = diff_merge_list(ol, nl, key) {
                            out.insert(k.clone(), Value::Array(patch));
                            if set_order {
                                out.insert(format!("$setElementOrder/{k}"), Value::Array(order));
                            }
                        } else if set_order && !same_order(ol, nl, key) {
                            out.insert(
                                format!("$setElementOrder/{k}"),
                                Value::Array(order_of(nl, key)),
                            );
                        }
                        continue;
                    }
                }
                if ov == nv {
                    continue;
                }
                match (ov, nv) {
                    (Value::Object(_), Value::Object(_)) => {
                        if let Some(d) = diff(ov, nv, set_order) {
                            out.insert(k.clone(), d);
                        }
                    }
                    _ => {
                        out.insert(k.clone(), nv.clone());
                    }
                }
            }
            for k in o.keys() {
                if !n.contains_key(k) {
                    out.insert(k.clone(), Value::Null);
                }
            }
            (!out.is_empty()).then_some(Value::Object(out))
        }
        _ => (old != new).then(|| new.clone()),
    }
}

fn merge_key(field: &str) -> Option<&'static str> {
    MERGE_LISTS
        .iter()
        .find(|(f, _)| *f == field)
        .map(|(_, k)| *k)
}

fn list(v: &Value) -> Option<&Vec<Value>> {
    static EMPTY: Vec<Value> = Vec::new();
    match v {
        Value::Null => Some(&EMPTY),
        Value::Array(a) => Some(a),
        _ => None,
    }
}

fn order_of(list: &[Value], key: &str) -> Vec<Value> {
    list.iter()
        .filter_map(|e| e.get(key).map(|v| json!({ key: v })))
        .collect()
}

fn same_order(a: &[Value], b: &[Value], key: &str) -> bool {
    order_of(a, key) == order_of(b, key)
}

/// A merge list's patch: changed elements as their diff with the key, new ones whole, removed
/// ones as `{"$patch": "delete", key: …}`; and the new order.
fn diff_merge_list(old: &[Value], new: &[Value], key: &str) -> Option<(Vec<Value>, Vec<Value>)> {
    let mut patch = Vec::new();
    for n in new {
        let id = n.get(key);
        match old.iter().find(|o| o.get(key) == id) {
            Some(o) => {
                if let Some(Value::Object(mut d)) = diff(o, n, true) {
                    if let Some(id) = id {
                        d.insert(key.to_string(), id.clone());
                    }
                    patch.push(Value::Object(d));
                }
            }
            None => patch.push(n.clone()),
        }
    }
    for o in old {
        let id = o.get(key);
        if !new.iter().any(|n| n.get(key) == id) {
            if let Some(id) = id {
                patch.push(json!({ "$patch": "delete", key: id }));
            }
        }
    }
    (!patch.is_empty()).then(|| (patch, order_of(new, key)))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{ContainerState, ContainerStateRunning, ContainerStatus};

    use super::*;
    use crate::kube::compute::to_time;
    use crate::kube::testkit::t;

    fn c(type_: &str, status: &str, at: u64, message: Option<&str>) -> PodCondition {
        PodCondition {
            type_: type_.into(),
            status: status.into(),
            last_transition_time: Some(to_time(t(at))),
            message: message.map(str::to_string),
            ..Default::default()
        }
    }

    #[test]
    fn conditions_patch_carries_only_changed_observer_conditions_with_the_uid() {
        let base = [
            c("Ready", "True", 1, None),
            c("observer.dev/ContainersAlive", "True", 1, Some("all up")),
        ];
        let desired = [c("observer.dev/ContainersAlive", "False", 9, None)];
        let p = conditions_patch("u-1", &base, &desired).unwrap().unwrap();
        assert_eq!(
            p,
            json!({
                "metadata": {"uid": "u-1"},
                "status": {"conditions": [{
                    "type": "observer.dev/ContainersAlive",
                    "status": "False",
                    "lastTransitionTime": "2023-11-14T22:13:29Z",
                    "message": null
                }]}
            })
        );
    }

    #[test]
    fn no_patch_when_equal_up_to_sub_second_times() {
        let mut a = c("observer.dev/ContainersAlive", "True", 1, None);
        let base = [a.clone()];
        a.last_transition_time = Some(to_time(t(1) + std::time::Duration::from_millis(700)));
        assert!(conditions_patch("u", &base, &[a.clone()])
            .unwrap()
            .is_none());
        assert!(same_conditions(&base, &[a]));
    }

    #[test]
    fn a_new_condition_is_sent_whole_and_nothing_is_ever_deleted() {
        let base = [c("observer.dev/OOMKilled", "True", 1, Some("old victim"))];
        let desired = [c("observer.dev/ContainersAlive", "True", 2, None)];
        let p = conditions_patch("u", &base, &desired).unwrap().unwrap();
        let list = p["status"]["conditions"].as_array().unwrap();
        assert_eq!(list.len(), 1);
        assert_eq!(list[0]["type"], "observer.dev/ContainersAlive");
        assert!(!p.to_string().contains("$patch"));
    }

    fn running(name: &str) -> ContainerStatus {
        ContainerStatus {
            name: name.into(),
            state: Some(ContainerState {
                running: Some(ContainerStateRunning {
                    started_at: Some(to_time(t(1))),
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn status_patch_is_two_way_strategic() {
        let base = PodStatus {
            phase: Some("Running".into()),
            message: Some("stale".into()),
            conditions: Some(vec![
                c("Ready", "True", 1, None),
                c("PodScheduled", "True", 1, None),
            ]),
            container_statuses: Some(vec![running("a"), running("b")]),
            ..Default::default()
        };
        let mut b2 = running("b");
        b2.ready = true;
        let desired = PodStatus {
            phase: Some("Running".into()),
            conditions: Some(vec![
                c("Ready", "False", 5, None),
                c("PodScheduled", "True", 1, None),
            ]),
            // Order alone never makes a difference (kubelet sorts by name).
            container_statuses: Some(vec![b2, running("a")]),
            ..Default::default()
        };
        let p = status_patch("u", &base, &desired).unwrap().unwrap();
        assert_eq!(p["metadata"], json!({"uid": "u"}));
        let s = &p["status"];
        assert_eq!(s["message"], Value::Null);
        assert!(
            s.as_object().unwrap().contains_key("message"),
            "deleted with null"
        );
        assert!(s.get("phase").is_none(), "unchanged fields are left out");
        assert_eq!(
            s["conditions"],
            json!([{"type": "Ready", "status": "False", "lastTransitionTime": "2023-11-14T22:13:25Z"}])
        );
        assert_eq!(
            s["$setElementOrder/conditions"],
            json!([{"type": "Ready"}, {"type": "PodScheduled"}])
        );
        // containerStatuses is atomic: the whole list, sorted.
        let names: Vec<&str> = s["containerStatuses"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["a", "b"]);
        assert!(status_patch("u", &desired, &desired).unwrap().is_none());
        assert!(same_status(&desired, &{
            let mut d = desired.clone();
            d.container_statuses.as_mut().unwrap().reverse();
            d
        }));
    }

    #[test]
    fn a_removed_merge_list_element_is_a_delete_directive() {
        let base = PodStatus {
            conditions: Some(vec![c("Ready", "True", 1, None), c("X", "True", 1, None)]),
            ..Default::default()
        };
        let desired = PodStatus {
            conditions: Some(vec![c("Ready", "True", 1, None)]),
            ..Default::default()
        };
        let p = status_patch("u", &base, &desired).unwrap().unwrap();
        assert_eq!(
            p["status"]["conditions"],
            json!([{"$patch": "delete", "type": "X"}])
        );
    }
}
