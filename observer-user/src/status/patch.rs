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
//!
//! `full` mode sends only the keys the agent computes ([`COMPUTED_KEYS`]): a key absent from a
//! strategic merge patch is left alone by the API server, so ephemeral container statuses, pod
//! IPs, resize and resource-claim statuses, and whatever a newer kubelet adds, are never erased.
//! Conditions are merged by type and never deleted; the atomic container status lists carry,
//! per container, the fields the agent does not model as the API has them.
use k8s_openapi::api::core::v1::{ContainerStatus, PodCondition, PodStatus};
use serde_json::{json, Map, Value};

use crate::kube::KubeError;

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
pub(crate) fn normalize(status: &PodStatus) -> Result<Value, KubeError> {
    let mut s = status.clone();
    if let Some(cs) = s.container_statuses.as_mut() {
        cs.sort_by(|a, b| a.name.cmp(&b.name));
    }
    Ok(serde_json::to_value(&s)?)
}

/// Normalized equality of two statuses (kubelet's no-op check).
#[cfg(test)]
pub(crate) fn same_status(a: &PodStatus, b: &PodStatus) -> bool {
    match (normalize(a), normalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// Normalized equality of two sets of conditions, by type (order does not matter).
#[cfg(test)]
pub(crate) fn same_conditions(a: &[PodCondition], b: &[PodCondition]) -> bool {
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
pub(crate) fn conditions_patch(
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
    Ok(diff(&old, &new).map(|status| body(uid, status)))
}

/// The `PodStatus` keys `full` mode writes: what `compute` derives from the runtime, the kernel
/// and the previous status. A computed key the computation leaves empty (a phase's reason that no
/// longer applies) is deleted; every other key is never named.
pub const COMPUTED_KEYS: &[&str] = &[
    "phase",
    "reason",
    "message",
    "startTime",
    "conditions",
    "containerStatuses",
    "initContainerStatuses",
];

/// The `ContainerStatus` fields the computation fills. The lists are atomic (the API server
/// replaces them whole), so every other field is carried over from the API's status of the same
/// container.
fn keep_unmodeled(base: &[ContainerStatus], desired: &mut [ContainerStatus]) {
    for d in desired {
        let Some(b) = base.iter().find(|b| b.name == d.name) else {
            continue;
        };
        let same_instance = b.container_id.is_some() && b.container_id == d.container_id;
        // Per instance: the runtime reports them for this container id.
        if same_instance {
            if d.image_id.is_empty() {
                d.image_id.clone_from(&b.image_id);
            }
            d.user = d.user.take().or_else(|| b.user.clone());
            d.stop_signal = d.stop_signal.take().or_else(|| b.stop_signal.clone());
            d.allocated_resources_status = d
                .allocated_resources_status
                .take()
                .or_else(|| b.allocated_resources_status.clone());
        }
        // Per container name: kubelet's allocation and the spec's mounts.
        d.resources = d.resources.take().or_else(|| b.resources.clone());
        d.allocated_resources = d
            .allocated_resources
            .take()
            .or_else(|| b.allocated_resources.clone());
        d.volume_mounts = d.volume_mounts.take().or_else(|| b.volume_mounts.clone());
    }
}

/// `desired` with the per-container fields the agent does not model taken from `base`.
pub(crate) fn with_unmodeled(base: &PodStatus, desired: &PodStatus) -> PodStatus {
    let mut d = desired.clone();
    let lists = [
        (&base.container_statuses, &mut d.container_statuses),
        (
            &base.init_container_statuses,
            &mut d.init_container_statuses,
        ),
    ];
    for (b, d) in lists {
        if let (Some(b), Some(d)) = (b, d.as_mut()) {
            keep_unmodeled(b, d);
        }
    }
    d
}

/// Only the keys of [`COMPUTED_KEYS`] of a normalized status.
fn computed_part(v: Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.into_iter()
                .filter(|(k, _)| COMPUTED_KEYS.contains(&k.as_str()))
                .collect(),
        ),
        v => v,
    }
}

/// `full` mode: the two-way strategic merge patch from `base` (the status in the API) to
/// `desired`, as kubelet's `CreateTwoWayMergePatch(Pod{status: old}, Pod{uid, status: new})`
/// but over [`COMPUTED_KEYS`] only, and with no delete directives in merge lists: a condition
/// the agent does not compute (a controller's, kubelet's resize conditions) is never touched.
pub fn status_patch(
    uid: &str,
    base: &PodStatus,
    desired: &PodStatus,
) -> Result<Option<Value>, KubeError> {
    let old = computed_part(normalize(base)?);
    let new = computed_part(normalize(&with_unmodeled(base, desired))?);
    Ok(diff(&old, &new).map(|status| body(uid, status)))
}

/// Two-way diff of JSON objects with strategic-merge semantics for `MERGE_LISTS`: a key `new`
/// lacks is deleted (null); an element of a merge list `new` lacks is left alone (the agent only
/// adds and changes elements, so no `$setElementOrder` either: the server keeps the list's
/// order and appends new elements).
fn diff(old: &Value, new: &Value) -> Option<Value> {
    match (old, new) {
        (Value::Object(o), Value::Object(n)) => {
            let mut out = Map::new();
            for (k, nv) in n {
                let ov = o.get(k).unwrap_or(&Value::Null);
                if let Some(key) = merge_key(k) {
                    if let (Some(ol), Some(nl)) = (list(ov), nv.as_array()) {
                        if let Some(patch) = diff_merge_list(ol, nl, key) {
                            out.insert(k.clone(), Value::Array(patch));
                        }
                        continue;
                    }
                }
                if ov == nv {
                    continue;
                }
                match (ov, nv) {
                    (Value::Object(_), Value::Object(_)) => {
                        if let Some(d) = diff(ov, nv) {
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

/// A merge list's patch: changed elements as their diff with the key, new ones whole. The
/// elements `new` lacks are not the agent's to remove.
fn diff_merge_list(old: &[Value], new: &[Value], key: &str) -> Option<Vec<Value>> {
    let mut patch = Vec::new();
    for n in new {
        let id = n.get(key);
        match old.iter().find(|o| o.get(key) == id) {
            Some(o) => {
                if let Some(Value::Object(mut d)) = diff(o, n) {
                    if let Some(id) = id {
                        d.insert(key.to_string(), id.clone());
                    }
                    patch.push(Value::Object(d));
                }
            }
            None => patch.push(n.clone()),
        }
    }
    (!patch.is_empty()).then_some(patch)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{ContainerState, ContainerStateRunning, ContainerStatus};

    use super::*;
    use crate::kube::testkit::t;
    use crate::status::compute::to_time;

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
        assert!(
            !p.to_string().contains("$setElementOrder"),
            "the server keeps its order"
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
    fn a_condition_the_agent_does_not_compute_is_never_deleted() {
        let base = PodStatus {
            conditions: Some(vec![c("Ready", "True", 1, None), c("X", "True", 1, None)]),
            ..Default::default()
        };
        let desired = PodStatus {
            conditions: Some(vec![c("Ready", "False", 2, None)]),
            ..Default::default()
        };
        let p = status_patch("u", &base, &desired).unwrap().unwrap();
        assert_eq!(
            p["status"]["conditions"],
            json!([{"type": "Ready", "status": "False", "lastTransitionTime": "2023-11-14T22:13:22Z"}])
        );
        assert!(!p.to_string().contains("$patch"), "{p}");
    }

    /// The API server's side of a strategic merge patch, for the shapes this module sends:
    /// objects merged key by key (null deletes), merge lists by their key, other lists replaced.
    fn apply(live: &mut Value, patch: &Value) {
        let (Value::Object(l), Value::Object(p)) = (&mut *live, patch) else {
            *live = patch.clone();
            return;
        };
        for (k, pv) in p {
            assert!(
                !k.starts_with('$'),
                "directive {k} not modelled by the test"
            );
            match (merge_key(k), pv) {
                (_, Value::Null) => {
                    l.remove(k);
                }
                (Some(key), Value::Array(items)) => {
                    let list = l.entry(k.clone()).or_insert_with(|| json!([]));
                    let list = list.as_array_mut().expect("a merge list");
                    for item in items {
                        match list.iter_mut().find(|e| e.get(key) == item.get(key)) {
                            Some(e) => apply(e, item),
                            None => list.push(item.clone()),
                        }
                    }
                }
                (None, Value::Object(_)) => apply(l.entry(k.clone()).or_insert(json!({})), pv),
                _ => {
                    l.insert(k.clone(), pv.clone());
                }
            }
        }
    }

    #[test]
    fn full_mode_keeps_what_the_agent_does_not_model() {
        use crate::kube::testkit::{container, cv, pod, spec, view};
        use crate::reconcile::ContainerPhase;
        use crate::status::compute::{compute_status, StatusInputs};
        use crate::status::ConditionTypes;
        use k8s_openapi::api::core::v1::{ContainerUser, LinuxContainerUser, ResourceRequirements};
        use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

        let view = view(vec![cv("app", 0, ContainerPhase::Running)]);
        let app_id = format!("containerd://{}", view.containers[0].id);
        let cpu = |v: &str| Some([("cpu".to_string(), Quantity(v.into()))].into());
        let mut app = running("app");
        app.container_id = Some(app_id);
        app.image_id = "sha256:feed".into();
        app.resources = Some(ResourceRequirements {
            requests: cpu("250m"),
            limits: cpu("500m"),
            ..Default::default()
        });
        app.allocated_resources = cpu("250m");
        app.user = Some(ContainerUser {
            linux: Some(LinuxContainerUser {
                uid: 1000,
                gid: 1000,
                supplemental_groups: Some(vec![1000]),
            }),
        });
        let api = PodStatus {
            phase: Some("Pending".into()),
            conditions: Some(vec![
                c("example.com/Synced", "True", 1, Some("a controller's")),
                c("PodResizePending", "True", 1, Some("kubelet's resize")),
            ]),
            container_statuses: Some(vec![app]),
            ephemeral_container_statuses: Some(vec![running("debugger")]),
            pod_ip: Some("10.0.0.10".into()),
            qos_class: Some("Burstable".into()),
            resize: Some("InProgress".into()),
            ..Default::default()
        };
        let pod = pod(
            spec("Always", vec![], vec![container("app")]),
            Some(api.clone()),
        );
        let computed = compute_status(&StatusInputs {
            pod: Some(&pod),
            view: &view,
            previous: None,
            now: t(100),
            runtime: "containerd",
            types: &ConditionTypes::default(),
        });
        let patch = status_patch("u", &api, &computed.status).unwrap().unwrap();
        let sent = patch["status"].as_object().unwrap();
        for k in sent.keys() {
            assert!(COMPUTED_KEYS.contains(&k.as_str()), "{k} sent: {patch}");
        }
        assert!(!patch.to_string().contains("$patch"), "{patch}");

        let mut live = serde_json::to_value(&api).unwrap();
        apply(&mut live, &patch["status"]);
        let before = serde_json::to_value(&api).unwrap();
        for key in ["ephemeralContainerStatuses", "podIP", "qosClass", "resize"] {
            assert_eq!(live[key], before[key], "{key} changed");
        }
        assert_eq!(live["phase"], "Running", "the agent's phase written");
        let kept = |t: &str| {
            live["conditions"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["type"] == t)
                .cloned()
        };
        assert_eq!(
            kept("example.com/Synced"),
            Some(before["conditions"][0].clone()),
            "a foreign condition"
        );
        assert_eq!(
            kept("PodResizePending"),
            Some(before["conditions"][1].clone()),
            "a kubelet condition the agent does not model"
        );
        assert_eq!(kept("Ready").unwrap()["status"], "True");
        let app = &live["containerStatuses"][0];
        let app_before = &before["containerStatuses"][0];
        for key in ["resources", "allocatedResources", "user", "imageID"] {
            assert_eq!(
                app[key], app_before[key],
                "containerStatuses[app].{key} changed"
            );
        }
        assert_eq!(app["ready"], true, "the agent's readiness written");
    }

    /// For every reason only kubelet knows, a `full` PATCH computed from a kubelet-written status
    /// leaves kubelet's reason and message as they were: the container that never started is
    /// not turned into a `ContainerCreating` guess.
    #[test]
    fn full_mode_never_drops_a_reason_only_kubelet_knows() {
        use crate::kube::testkit::{container, cv, pod, spec, view};
        use crate::reconcile::ContainerPhase;
        use crate::status::compute::{compute_status, StatusInputs, KUBELET_REASONS};
        use crate::status::ConditionTypes;
        use k8s_openapi::api::core::v1::{ContainerState, ContainerStateWaiting};

        // `app` runs; `side` was never created: kubelet says why.
        let view = view(vec![cv("app", 0, ContainerPhase::Running)]);
        for reason in KUBELET_REASONS {
            let message = format!("kubelet's words for {reason}");
            let mut app = running("app");
            app.container_id = Some(format!("containerd://{}", view.containers[0].id));
            let side = ContainerStatus {
                name: "side".into(),
                image: "example/side:1".into(),
                state: Some(ContainerState {
                    waiting: Some(ContainerStateWaiting {
                        reason: Some(reason.to_string()),
                        message: Some(message.clone()),
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            };
            let api = PodStatus {
                phase: Some("Pending".into()),
                container_statuses: Some(vec![app, side]),
                ..Default::default()
            };
            let pod = pod(
                spec("Always", vec![], vec![container("app"), container("side")]),
                Some(api.clone()),
            );
            let computed = compute_status(&StatusInputs {
                pod: Some(&pod),
                view: &view,
                previous: None,
                now: t(100),
                runtime: "containerd",
                types: &ConditionTypes::default(),
            });
            let mut live = serde_json::to_value(&api).unwrap();
            if let Some(patch) = status_patch("u", &api, &computed.status).unwrap() {
                apply(&mut live, &patch["status"]);
            }
            let side = live["containerStatuses"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["name"] == "side")
                .unwrap()
                .clone();
            assert_eq!(
                side["state"]["waiting"],
                json!({"reason": reason, "message": message}),
                "{reason}: {live:#}"
            );
        }
    }

    /// A termination message kubelet wrote (the container's termination-log file, which the
    /// agent does not read) survives a `full` PATCH of the same instance, and the runtime's
    /// message for a failed start is written where kubelet has none yet.
    #[test]
    fn full_mode_keeps_kubelets_termination_message() {
        use crate::kube::testkit::{container, exited, pod, spec, view};
        use crate::status::compute::{compute_status, StatusInputs};
        use crate::status::ConditionTypes;
        use k8s_openapi::api::core::v1::{ContainerState, ContainerStateTerminated};

        let mut dead = exited("app", 0, 2, "Error");
        let id = format!("containerd://{}", dead.id);
        let terminated = |message: Option<&str>| ContainerStatus {
            name: "app".into(),
            container_id: Some(id.clone()),
            state: Some(ContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: 2,
                    reason: Some("Error".into()),
                    message: message.map(str::to_string),
                    container_id: Some(id.clone()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let compute = |api: &PodStatus, v: &crate::reconcile::PodView| {
            let pod = pod(
                spec("Never", vec![], vec![container("app")]),
                Some(api.clone()),
            );
            compute_status(&StatusInputs {
                pod: Some(&pod),
                view: v,
                previous: None,
                now: t(100),
                runtime: "containerd",
                types: &ConditionTypes::default(),
            })
        };
        let message_of = |live: &serde_json::Value| {
            live["containerStatuses"][0]["state"]["terminated"]["message"].clone()
        };
        // kubelet's message from the file; the agent has none of its own.
        let api = PodStatus {
            phase: Some("Failed".into()),
            container_statuses: Some(vec![terminated(Some("wrote this before exit 2"))]),
            ..Default::default()
        };
        let v = view(vec![dead.clone()]);
        let computed = compute(&api, &v);
        let mut live = serde_json::to_value(&api).unwrap();
        if let Some(p) = status_patch("u", &api, &computed.status).unwrap() {
            apply(&mut live, &p["status"]);
        }
        assert_eq!(message_of(&live), json!("wrote this before exit 2"));

        // The runtime's message, where kubelet has written none yet.
        dead.message = Some("failed to create containerd task: boom".into());
        let v = view(vec![dead]);
        let api = PodStatus {
            phase: Some("Failed".into()),
            container_statuses: Some(vec![terminated(None)]),
            ..Default::default()
        };
        let computed = compute(&api, &v);
        let mut live = serde_json::to_value(&api).unwrap();
        if let Some(p) = status_patch("u", &api, &computed.status).unwrap() {
            apply(&mut live, &p["status"]);
        }
        assert_eq!(
            message_of(&live),
            json!("failed to create containerd task: boom")
        );
        // kubelet's, which holds the runtime's and more, is kept.
        let api = PodStatus {
            phase: Some("Failed".into()),
            container_statuses: Some(vec![terminated(Some(
                "failed to create containerd task: boom: and the log's tail",
            ))]),
            ..Default::default()
        };
        let computed = compute(&api, &v);
        let t = computed.status.container_statuses.unwrap()[0].clone();
        assert_eq!(
            t.state.unwrap().terminated.unwrap().message.as_deref(),
            Some("failed to create containerd task: boom: and the log's tail")
        );

        // The agent read the node's files itself: its message is written before kubelet's.
        let mut read = exited("app", 0, 2, "Error");
        read.message = Some("wrote this before exit 2".into());
        read.message_complete = true;
        let api = PodStatus {
            phase: Some("Failed".into()),
            container_statuses: Some(vec![terminated(None)]),
            ..Default::default()
        };
        let computed = compute(&api, &view(vec![read.clone()]));
        let mut live = serde_json::to_value(&api).unwrap();
        if let Some(p) = status_patch("u", &api, &computed.status).unwrap() {
            apply(&mut live, &p["status"]);
        }
        assert_eq!(message_of(&live), json!("wrote this before exit 2"));

        // No more than kubelet keeps: 12 KiB shared among the pod's container statuses.
        read.message = Some("m".repeat(20_000));
        let computed = compute(&api, &view(vec![read]));
        let t = computed.status.container_statuses.unwrap()[0].clone();
        let m = t.state.unwrap().terminated.unwrap().message.unwrap();
        assert_eq!(m.len(), 12 * 1024);
    }
}
