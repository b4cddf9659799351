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
//! IPs, resources, resize, resource-claim statuses and volume health, and whatever a newer
//! kubelet adds, are never erased. Conditions are merged by type and never deleted; the atomic
//! container status lists carry, per container, the fields the agent does not model as the API
//! has them ([`keep_unmodeled`]).
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

/// The `PodStatus` keys `full` mode writes: what `compute` derives from the runtime, the kernel,
/// the pod and the previous status (`observedGeneration`: the pod's `metadata.generation`, the
/// only value the admission policy lets the agent write). A computed key the computation leaves
/// empty (a phase's reason that no longer applies) is deleted; every other key is never named.
pub const COMPUTED_KEYS: &[&str] = &[
    "phase",
    "reason",
    "message",
    "startTime",
    "conditions",
    "containerStatuses",
    "initContainerStatuses",
    "observedGeneration",
];

/// Per container, the fields the computation does not fill, taken from the API's status. The
/// lists are atomic (the API server replaces them whole): a field left out would be erased.
/// Every field of 1.37's `ContainerStatus` is decided (`every_container_status_field_is_decided`):
/// - computed: `name`, `image`, `containerID`, `state`, `lastState`, `restartCount`, `ready`,
///   `started`, and `imageID` where the agent has it;
/// - the runtime's report of one instance (CRI's ContainerStatus), carried only while the API's
///   status is of the same container id: `imageID`, `user` (SupplementalGroupsPolicy),
///   `stopSignal` (ContainerStopSignals, KEP-4960);
/// - kubelet's per container, whichever instance runs, carried by name: `resources` and
///   `allocatedResources` (its allocation of the spec, in-place resize), `allocatedResourcesStatus`
///   (KEP-4680: the device manager's and DRA's health, by pod and container name),
///   `volumeMounts` (the spec's, "immutable" in `convertContainerStatus`).
fn keep_unmodeled(base: &[ContainerStatus], desired: &mut [ContainerStatus]) {
    for d in desired {
        let Some(b) = base.iter().find(|b| b.name == d.name) else {
            continue;
        };
        let same_instance = b.container_id.is_some() && b.container_id == d.container_id;
        if same_instance {
            if d.image_id.is_empty() {
                d.image_id.clone_from(&b.image_id);
            }
            d.user = d.user.take().or_else(|| b.user.clone());
            d.stop_signal = d.stop_signal.take().or_else(|| b.stop_signal.clone());
        }
        d.resources = d.resources.take().or_else(|| b.resources.clone());
        d.allocated_resources = d
            .allocated_resources
            .take()
            .or_else(|| b.allocated_resources.clone());
        d.allocated_resources_status = d
            .allocated_resources_status
            .take()
            .or_else(|| b.allocated_resources_status.clone());
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

    /// Every field of 1.37's `ContainerStatus` has its rule in [`keep_unmodeled`]: struct
    /// literals without `..`, so a field k8s-openapi adds fails to compile here until it is
    /// decided (and listed there).
    #[test]
    fn every_container_status_field_is_decided() {
        use k8s_openapi::api::core::v1::{
            ContainerStateTerminated, ContainerUser, ImageVolumeStatus, LinuxContainerUser,
            ResourceHealth, ResourceRequirements, ResourceStatus, VolumeMountStatus, VolumeStatus,
        };
        use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

        let cpu = |v: &str| Some([("cpu".to_string(), Quantity(v.into()))].into());
        // The API's status, every field set (as a 1.37 kubelet with every gate on writes it).
        let api = ContainerStatus {
            allocated_resources: cpu("250m"),
            allocated_resources_status: Some(vec![ResourceStatus {
                name: "example.com/gpu".into(),
                resources: Some(vec![ResourceHealth {
                    resource_id: "gpu-0".into(),
                    health: Some("Healthy".into()),
                    message: None,
                }]),
            }]),
            container_id: Some("containerd://aaa".into()),
            image: "registry.local/app:1".into(),
            image_id: "sha256:feed".into(),
            last_state: None,
            name: "app".into(),
            ready: false,
            resources: Some(ResourceRequirements {
                requests: cpu("250m"),
                limits: cpu("500m"),
                ..Default::default()
            }),
            restart_count: 0,
            started: Some(false),
            state: Some(ContainerState {
                running: Some(ContainerStateRunning::default()),
                ..Default::default()
            }),
            stop_signal: Some("SIGUSR1".into()),
            user: Some(ContainerUser {
                linux: Some(LinuxContainerUser {
                    uid: 1000,
                    gid: 1000,
                    supplemental_groups: Some(vec![1000]),
                }),
            }),
            volume_mounts: Some(vec![VolumeMountStatus {
                mount_path: "/data".into(),
                name: "data".into(),
                read_only: Some(true),
                recursive_read_only: Some("Enabled".into()),
                volume_status: Some(VolumeStatus {
                    image: Some(ImageVolumeStatus {
                        image_ref: "sha256:beef".into(),
                    }),
                }),
            }]),
        };
        // What the computation fills, for an instance `id`; the rest is not the agent's.
        let computed = |id: &str| ContainerStatus {
            allocated_resources: None,
            allocated_resources_status: None,
            container_id: Some(id.into()),
            image: "registry.local/app:1".into(),
            image_id: String::new(),
            last_state: Some(ContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: 1,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            name: "app".into(),
            ready: true,
            resources: None,
            restart_count: 1,
            started: Some(true),
            state: Some(ContainerState {
                running: Some(ContainerStateRunning::default()),
                ..Default::default()
            }),
            stop_signal: None,
            user: None,
            volume_mounts: None,
        };
        // The same instance: every field the agent does not compute is the API's.
        let mut same = [computed("containerd://aaa")];
        keep_unmodeled(std::slice::from_ref(&api), &mut same);
        let want = ContainerStatus {
            last_state: computed("").last_state,
            ready: true,
            restart_count: 1,
            started: Some(true),
            ..api.clone()
        };
        assert_eq!(same[0], want);
        // A new instance: the runtime's report of the old one is not carried; kubelet's per
        // container values are.
        let mut new = [computed("containerd://bbb")];
        keep_unmodeled(std::slice::from_ref(&api), &mut new);
        let want = ContainerStatus {
            container_id: Some("containerd://bbb".into()),
            image_id: String::new(),
            stop_signal: None,
            user: None,
            ..want
        };
        assert_eq!(new[0], want);
        // What the agent computed is never overwritten.
        let mut own = [ContainerStatus {
            image_id: "sha256:mine".into(),
            ..computed("containerd://aaa")
        }];
        keep_unmodeled(std::slice::from_ref(&api), &mut own);
        assert_eq!(own[0].image_id, "sha256:mine");
    }

    /// A `full` PATCH computed from a status that carries every 1.37 field the agent does not
    /// compute (the literal without `..` fails to compile when k8s-openapi's PodStatus gains a
    /// field) leaves each as it was: pod-level fields never named, per-container fields carried,
    /// the conditions kubelet owns but the agent does not compute kept; `observedGeneration` is
    /// the pod's generation.
    #[test]
    fn full_mode_keeps_every_field_it_does_not_compute() {
        use crate::kube::testkit::{container, cv, pod, spec, view};
        use crate::reconcile::ContainerPhase;
        use crate::status::compute::{compute_status, StatusInputs};
        use crate::status::ConditionTypes;
        use k8s_openapi::api::core::v1::{
            ContainerExtendedResourceRequest, ContainerUser, HostIP, LinuxContainerUser,
            NodeAllocatableResourceClaimStatus, PodExtendedResourceClaimStatus, PodIP,
            PodResourceClaimStatus, PodVolumeHealth, ResourceHealth, ResourceRequirements,
            ResourceStatus, VolumeHealthCondition, VolumeMountStatus,
        };
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
        app.allocated_resources_status = Some(vec![ResourceStatus {
            name: "example.com/gpu".into(),
            resources: Some(vec![ResourceHealth {
                resource_id: "gpu-0".into(),
                health: Some("Unhealthy".into()),
                message: Some("ECC errors".into()),
            }]),
        }]);
        app.stop_signal = Some("SIGUSR1".into());
        app.user = Some(ContainerUser {
            linux: Some(LinuxContainerUser {
                uid: 1000,
                gid: 1000,
                supplemental_groups: Some(vec![1000]),
            }),
        });
        app.volume_mounts = Some(vec![VolumeMountStatus {
            mount_path: "/data".into(),
            name: "data".into(),
            read_only: Some(false),
            recursive_read_only: None,
            volume_status: None,
        }]);
        let kubelets = |t: &str, reason: &str| PodCondition {
            reason: Some(reason.into()),
            observed_generation: Some(2),
            ..c(t, "True", 1, Some("kubelet's"))
        };
        let api = PodStatus {
            allocated_resources: cpu("250m"),
            conditions: Some(vec![
                c("example.com/Synced", "True", 1, Some("a controller's")),
                kubelets("PodResizePending", "Deferred"),
                kubelets("PodResizeInProgress", "InProgress"),
                kubelets("AllContainersRestarting", "RestartAllContainersStarted"),
            ]),
            container_statuses: Some(vec![app]),
            ephemeral_container_statuses: Some(vec![running("debugger")]),
            extended_resource_claim_status: Some(PodExtendedResourceClaimStatus {
                request_mappings: vec![ContainerExtendedResourceRequest {
                    container_name: "app".into(),
                    request_name: "container-0-request-0".into(),
                    resource_name: "example.com/gpu".into(),
                }],
                resource_claim_name: "web-extended-resources-abcde".into(),
            }),
            host_ip: Some("192.0.2.1".into()),
            host_ips: Some(vec![HostIP {
                ip: "192.0.2.1".into(),
            }]),
            init_container_statuses: None,
            message: None,
            node_allocatable_resource_claim_statuses: Some(vec![
                NodeAllocatableResourceClaimStatus {
                    containers: Some(vec!["app".into()]),
                    mapping: None,
                    overhead: None,
                    resource_claim_name: "web-cpu-claim".into(),
                },
            ]),
            nominated_node_name: Some("node-2".into()),
            observed_generation: Some(2),
            phase: Some("Pending".into()),
            pod_ip: Some("10.0.0.10".into()),
            pod_ips: Some(vec![PodIP {
                ip: "10.0.0.10".into(),
            }]),
            qos_class: Some("Burstable".into()),
            reason: None,
            resize: Some("InProgress".into()),
            resource_claim_statuses: Some(vec![PodResourceClaimStatus {
                name: "gpu".into(),
                resource_claim_name: Some("web-gpu-abcde".into()),
            }]),
            resources: Some(ResourceRequirements {
                requests: cpu("250m"),
                ..Default::default()
            }),
            start_time: Some(to_time(t(0))),
            volume_health: Some(vec![PodVolumeHealth {
                name: "data".into(),
                health_conditions: Some(vec![VolumeHealthCondition {
                    status: "Degraded".into(),
                    reason: "SlowIO".into(),
                    message: None,
                }]),
                last_transition_time: Some(to_time(t(1))),
            }]),
        };
        let mut pod = pod(
            spec("Always", vec![], vec![container("app")]),
            Some(api.clone()),
        );
        pod.metadata.generation = Some(3);
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
        for (key, value) in before.as_object().unwrap() {
            if !COMPUTED_KEYS.contains(&key.as_str()) {
                assert_eq!(&live[key], value, "{key} changed");
            }
        }
        assert_eq!(live["phase"], "Running", "the agent's phase written");
        assert_eq!(live["observedGeneration"], 3, "the pod's generation");
        let kept = |t: &str| {
            live["conditions"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["type"] == t)
                .cloned()
        };
        for (i, t) in [
            "example.com/Synced",
            "PodResizePending",
            "PodResizeInProgress",
            // kubelet writes it only for a pod with a RestartAllContainers rule; never deleted.
            "AllContainersRestarting",
        ]
        .into_iter()
        .enumerate()
        {
            assert_eq!(kept(t), Some(before["conditions"][i].clone()), "{t}");
        }
        for t in [
            "Ready",
            "ContainersReady",
            "Initialized",
            "PodScheduled",
            "PodReadyToStartContainers",
            "observer.dev/ContainersAlive",
        ] {
            let c = kept(t).unwrap_or_else(|| panic!("{t} written"));
            assert_eq!(c["observedGeneration"], 3, "{t}: {c}");
        }
        let app = &live["containerStatuses"][0];
        let app_before = &before["containerStatuses"][0];
        for key in [
            "resources",
            "allocatedResources",
            "allocatedResourcesStatus",
            "stopSignal",
            "user",
            "volumeMounts",
            "imageID",
        ] {
            assert_eq!(app[key], app_before[key], "containerStatuses[app].{key}");
        }
        assert_eq!(app["ready"], true, "the agent's readiness written");

        // Written, the same computation sends nothing more (no dedup loop on the generation).
        let written: PodStatus = serde_json::from_value(live.clone()).unwrap();
        let mut pod = pod.clone();
        pod.status = Some(written.clone());
        let again = compute_status(&StatusInputs {
            pod: Some(&pod),
            view: &view,
            previous: Some(&computed.status),
            now: t(130),
            runtime: "containerd",
            types: &ConditionTypes::default(),
        });
        assert_eq!(status_patch("u", &written, &again.status).unwrap(), None);
        assert!(same_status(&computed.status, &again.status));
    }

    /// `conditions` mode names the observer's conditions alone: kubelet's (PodResize*,
    /// AllContainersRestarting, PodReadyToStartContainers) are neither written over nor dropped.
    #[test]
    fn conditions_mode_leaves_every_kubelet_condition() {
        let kubelets = [
            c("PodReadyToStartContainers", "True", 1, None),
            c("PodResizePending", "True", 1, Some("Deferred")),
            c("PodResizeInProgress", "True", 1, None),
            c("AllContainersRestarting", "True", 1, None),
            c("Ready", "True", 1, None),
        ];
        let mut base = kubelets.to_vec();
        base.push(c("observer.dev/ContainersAlive", "True", 1, None));
        let desired = [PodCondition {
            observed_generation: Some(4),
            ..c("observer.dev/ContainersAlive", "False", 9, Some("app died"))
        }];
        let p = conditions_patch("u", &base, &desired).unwrap().unwrap();
        let mut live = json!({ "conditions": base });
        apply(&mut live, &p["status"]);
        let list = live["conditions"].as_array().unwrap();
        for (i, k) in kubelets.iter().enumerate() {
            assert_eq!(list[i], serde_json::to_value(k).unwrap(), "{}", k.type_);
        }
        assert_eq!(list[5]["status"], "False");
        assert_eq!(list[5]["observedGeneration"], 4);
        assert_eq!(list.len(), 6);
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
