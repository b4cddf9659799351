//! deploy/ under test. The manifests are read into k8s-openapi types (strictly: no field the API
//! does not have) and their invariants checked; then the agent's image, built by the same code as
//! `cargo xtask image`, is imported into a private containerd and started from the DaemonSet's
//! own pod template, translated to CRI the way kubelet does it, with `observer check` as its
//! command: every requirement must be met, the probes really loaded and attached. Each added
//! capability and each host mount is then taken away in turn, and the check must fail for the
//! reason the manifest gives for it: the set is sufficient and nothing in it is spare.
#![allow(unused_crate_dependencies)] // a test/bench/bin target sees its package's whole dependency list
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, Namespace, Pod, PodSpec, Service, ServiceAccount,
};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use observer::cri::api;
use observer_image::agent::{self, AgentImage};
use observer_tests::apiserver::Recorded;
use observer_tests::containerd::read_container_log;
use observer_tests::endpoint::{free_listen, http_get};
use observer_tests::kubelet::{self, quantity_milli, KubeletPod, Node};
use observer_tests::manifests::{deploy_dir, documents, read_one, strict};
use observer_tests::{init_tracing, poll_until_async, prereq, require_containerd, Containerd, Qos};
use serde_json::Value;

/// The capabilities the agent is given, each with the `observer check` row that fails without it.
const CAPABILITIES: &[(&str, &str)] = &[
    ("BPF", "ring buffer maps"),
    ("PERFMON", "load and attach probes"),
    ("SYSLOG", "kernel log"),
    ("SYS_NICE", "real-time scheduling"),
];
/// The host mounts `observer check` can prove (volume name, the row that fails without it). The
/// CRI socket's is proven by `observer status` in the same container.
const CHECKED_MOUNTS: &[(&str, &str)] = &[("tracefs", "tracefs"), ("cgroup-root", "cgroup mode")];
/// Every row `observer check` prints for a node that has everything.
const CHECK_ROWS: &[&str] = &[
    "privileges",
    "kernel version >= 5.15",
    "kernel BTF",
    "tracefs",
    "tp_btf/sched_process_exec",
    "tp_btf/sched_process_exit",
    "tracepoint oom/mark_victim",
    "tracepoints cgroup/*",
    "cgroup mode",
    "cgroup id -> path",
    "kernel log",
    "ring buffer maps",
    "load and attach probes",
    // A requirement because the manifest sets OBSERVER_REALTIME_PRIORITY.
    "real-time scheduling",
];
const AGENT_MEMORY_BUDGET: i128 = 64 << 20;
const CHECK_TIMEOUT: Duration = Duration::from_secs(90);

fn ds() -> DaemonSet {
    read_one(&deploy_dir().join("daemonset.yaml")).unwrap()
}

fn pod_spec(ds: &DaemonSet) -> &PodSpec {
    ds.spec.template.spec.as_ref().unwrap()
}

fn agent_container(ds: &DaemonSet) -> &Container {
    let spec = pod_spec(ds);
    assert_eq!(spec.containers.len(), 1, "one container: the agent");
    &spec.containers[0]
}

fn env<'a>(c: &'a Container, name: &str) -> Option<&'a k8s_openapi::api::core::v1::EnvVar> {
    c.env.iter().flatten().find(|e| e.name == name)
}

/// The agent's status-manager settings where the manifest does not set them.
fn agent_defaults() -> observer::status::StatusConfig {
    observer::status::StatusConfig::new("node", observer::status::StatusMode::default())
}

/// config.yaml's data: the mode and the prefix the DaemonSet and the admission policy read.
fn config() -> std::collections::BTreeMap<String, String> {
    let cm: ConfigMap = read_one(&deploy_dir().join("config.yaml")).unwrap();
    cm.data.unwrap()
}

/// What the agent's container gets for `name`: its value, or the ConfigMap key it names.
fn env_value(c: &Container, name: &str) -> Option<String> {
    let e = env(c, name)?;
    if let Some(v) = &e.value {
        return Some(v.clone());
    }
    let r = e.value_from.as_ref()?.config_map_key_ref.as_ref()?;
    assert_eq!(r.name, "observer", "{name} reads config.yaml's ConfigMap");
    config().get(&r.key).cloned()
}

fn kustomization() -> Value {
    let docs = documents(&deploy_dir().join("kustomization.yaml")).unwrap();
    docs.into_iter().next().unwrap()
}

fn namespace() -> String {
    kustomization()["namespace"].as_str().unwrap().to_string()
}

/// Every manifest kustomization.yaml installs, and the example, read strictly into its type.
#[test]
fn every_manifest_reads_strictly_into_its_api_type() {
    let dir = deploy_dir();
    let listed: BTreeSet<String> = kustomization()["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap().to_string())
        .collect();
    let on_disk: BTreeSet<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml") && n != "kustomization.yaml")
        .collect();
    assert_eq!(
        listed, on_disk,
        "kustomization.yaml installs every manifest in deploy/"
    );

    let mut kinds = BTreeMap::<String, usize>::new();
    let mut files: Vec<PathBuf> = on_disk.iter().map(|n| dir.join(n)).collect();
    files.push(dir.join("examples/readiness-gate.yaml"));
    for file in files {
        for doc in documents(&file).unwrap() {
            let kind = doc["kind"].as_str().unwrap_or_default().to_string();
            let r = match kind.as_str() {
                "Namespace" => strict::<Namespace>(&doc).map(drop),
                "ServiceAccount" => strict::<ServiceAccount>(&doc).map(drop),
                "ClusterRole" => strict::<ClusterRole>(&doc).map(drop),
                "CustomResourceDefinition" => strict::<CustomResourceDefinition>(&doc).map(drop),
                "ConfigMap" => strict::<ConfigMap>(&doc).map(drop),
                "NetworkPolicy" => strict::<NetworkPolicy>(&doc).map(drop),
                "ClusterRoleBinding" => strict::<ClusterRoleBinding>(&doc).map(drop),
                "ValidatingAdmissionPolicy" => strict::<ValidatingAdmissionPolicy>(&doc).map(drop),
                "ValidatingAdmissionPolicyBinding" => {
                    strict::<ValidatingAdmissionPolicyBinding>(&doc).map(drop)
                }
                "PriorityClass" => strict::<PriorityClass>(&doc).map(drop),
                "DaemonSet" => strict::<DaemonSet>(&doc).map(drop),
                "Service" => strict::<Service>(&doc).map(drop),
                "Pod" => strict::<Pod>(&doc).map(drop),
                other => panic!("{}: unexpected kind {other:?}", file.display()),
            };
            r.unwrap_or_else(|e| panic!("{}: {e:#}", file.display()));
            *kinds.entry(kind).or_default() += 1;
        }
    }
    for kind in [
        // PodReport's.
        "CustomResourceDefinition",
        "ConfigMap",
        "NetworkPolicy",
        "Namespace",
        "ServiceAccount",
        "ClusterRoleBinding",
        "PriorityClass",
        "DaemonSet",
        "Service",
        "Pod",
    ] {
        assert_eq!(kinds.get(kind), Some(&1), "exactly one {kind}: {kinds:?}");
    }
    // The agent's, and the readers' of reports and of /metrics.
    assert_eq!(kinds.get("ClusterRole"), Some(&3), "{kinds:?}");
    // The node's policy and the mode's, each bound.
    for kind in [
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ] {
        assert_eq!(kinds.get(kind), Some(&2), "two of {kind}: {kinds:?}");
    }
}

#[test]
fn daemonset_runs_everywhere_with_named_privileges_only() {
    let ds = ds();
    let spec = pod_spec(&ds);
    let c = agent_container(&ds);
    let ns = namespace();
    assert_eq!(ds.metadata.namespace.as_deref(), Some(ns.as_str()));

    assert_eq!(
        spec.host_pid,
        Some(true),
        "hostPID: /proc of every container"
    );
    assert_ne!(spec.host_network, Some(true), "no host network");
    assert_ne!(spec.host_ipc, Some(true), "no host IPC");
    // Tolerates every taint: one toleration, no key, operator Exists, any effect.
    let tolerations = spec.tolerations.as_deref().unwrap_or_default();
    assert!(
        tolerations.iter().any(|t| t.key.is_none()
            && t.operator.as_deref() == Some("Exists")
            && t.effect.is_none()),
        "{tolerations:?}"
    );
    let pc: PriorityClass = read_one(&deploy_dir().join("priorityclass.yaml")).unwrap();
    assert_eq!(spec.priority_class_name, pc.metadata.name);
    assert!(pc.value.is_some_and(|v| v >= 1_000_000) && pc.global_default != Some(true));
    let sa: ServiceAccount = read_one(&deploy_dir().join("serviceaccount.yaml")).unwrap();
    assert_eq!(spec.service_account_name, sa.metadata.name);
    assert_ne!(spec.automount_service_account_token, Some(false));

    // The image users get from `cargo xtask image`.
    assert_eq!(c.image.as_deref(), Some(agent::NAME));
    assert_eq!(c.command.as_deref(), Some(&[agent::BINARY.to_string()][..]));
    assert_eq!(c.args.as_deref(), Some(&["run".to_string()][..]));

    // The node name from the downward API.
    let node = env(c, "NODE_NAME").expect("NODE_NAME");
    let field = node.value_from.as_ref().and_then(|v| v.field_ref.as_ref());
    assert_eq!(field.map(|f| f.field_path.as_str()), Some("spec.nodeName"));
    // The cgroup view: --cgroupfs names the mount of the host's /sys/fs/cgroup.
    let cgroupfs = env(c, "OBSERVER_CGROUPFS").and_then(|e| e.value.clone());
    let cgroup_mount = c
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| Some(&m.mount_path) == cgroupfs.as_ref())
        .expect("OBSERVER_CGROUPFS is a volume mount");
    let volume = spec
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == cgroup_mount.name)
        .unwrap();
    assert_eq!(
        volume.host_path.as_ref().map(|h| h.path.as_str()),
        Some("/sys/fs/cgroup")
    );

    // Security context: no privileged mode, every capability dropped but the proven ones.
    let sc = c.security_context.as_ref().unwrap();
    assert_eq!(sc.privileged, Some(false));
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    let caps = sc.capabilities.as_ref().unwrap();
    assert_eq!(caps.drop.as_deref(), Some(&["ALL".to_string()][..]));
    let added: BTreeSet<&str> = caps.add.iter().flatten().map(String::as_str).collect();
    let proven: BTreeSet<&str> = CAPABILITIES.iter().map(|(c, _)| *c).collect();
    assert_eq!(added, proven, "the capabilities the container test proves");
    // CAP_SYS_NICE is there for the real-time reader thread, and only with it.
    let priority = env(c, "OBSERVER_REALTIME_PRIORITY")
        .and_then(|e| e.value.as_deref())
        .map(|v| {
            v.parse::<u8>()
                .expect("OBSERVER_REALTIME_PRIORITY is a number")
        });
    assert!(
        priority.is_some_and(|p| (1..=99).contains(&p)),
        "OBSERVER_REALTIME_PRIORITY in 1..=99: {priority:?}"
    );
    assert!(added.contains("SYS_NICE"), "CAP_SYS_NICE with the priority");
    let seccomp = spec
        .security_context
        .as_ref()
        .and_then(|s| s.seccomp_profile.as_ref())
        .or(sc.seccomp_profile.as_ref());
    assert_eq!(seccomp.map(|s| s.type_.as_str()), Some("RuntimeDefault"));

    // Every hostPath is one deploy/README.md explains, mounted read-only but the agent's state
    // (the one file it writes), which is the host's /run/observer.
    let readme = std::fs::read_to_string(deploy_dir().join("README.md")).unwrap();
    for v in spec.volumes.iter().flatten() {
        if v.name == "state" {
            assert_eq!(
                v.host_path.as_ref().map(|h| h.path.as_str()),
                Some("/run/observer")
            );
            assert_eq!(
                env(c, "OBSERVER_STATE_DIR").and_then(|e| e.value.as_deref()),
                Some("/run/observer")
            );
            assert!(
                readme.contains("/run/observer"),
                "deploy/README.md explains the state volume"
            );
            continue;
        }
        let hp = v.host_path.as_ref().expect("only hostPath volumes");
        assert!(
            readme.contains(&hp.path),
            "deploy/README.md explains {}",
            hp.path
        );
        let m = c
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| m.name == v.name)
            .unwrap();
        assert_eq!(m.read_only, Some(true), "{} is read-only", v.name);
        assert_eq!(
            m.recursive_read_only.as_deref(),
            Some("IfPossible"),
            "{}",
            v.name
        );
    }
    // Each added capability and each host mount has its reason next to it in the manifest.
    let text = std::fs::read_to_string(deploy_dir().join("daemonset.yaml")).unwrap();
    for cap in &added {
        assert_commented(&text, &format!("- {cap}"));
    }
    for m in c.volume_mounts.iter().flatten() {
        assert_commented(&text, &format!("- name: {}", m.name));
    }
}

/// The line holding `item` (its first occurrence) follows a comment line.
fn assert_commented(text: &str, item: &str) {
    let lines: Vec<&str> = text.lines().collect();
    let i = lines
        .iter()
        .position(|l| l.trim() == item)
        .unwrap_or_else(|| panic!("{item:?} not in daemonset.yaml"));
    assert!(
        i > 0 && lines[i - 1].trim_start().starts_with('#'),
        "{item:?} needs its reason in a comment above it"
    );
}

#[test]
fn daemonset_resources_probes_and_service_agree() {
    let ds = ds();
    let c = agent_container(&ds);
    let r = c.resources.as_ref().unwrap();
    let get = |m: &Option<BTreeMap<String, _>>, k: &str| {
        let q: &k8s_openapi::apimachinery::pkg::api::resource::Quantity = m
            .as_ref()
            .and_then(|m| m.get(k))
            .unwrap_or_else(|| panic!("{k}"));
        quantity_milli(&q.0).unwrap()
    };
    for res in ["cpu", "memory"] {
        assert_eq!(
            get(&r.requests, res),
            get(&r.limits, res),
            "{res}: requests == limits (Guaranteed QoS, oom_score_adj -997)"
        );
    }
    assert_eq!(kubelet::qos_class(std::slice::from_ref(c)), Qos::Guaranteed);
    // The budget (64 MiB peak RSS at 1000 pods) fits with room for the BPF maps and page cache.
    let limit = get(&r.limits, "memory") / 1000;
    assert!(
        limit >= AGENT_MEMORY_BUDGET * 3 / 2,
        "memory limit {limit} leaves headroom over the 64 MiB budget"
    );

    // Probes on the port the agent listens on.
    let listen = env(c, "OBSERVER_LISTEN")
        .and_then(|e| e.value.clone())
        .unwrap_or_else(|| "0.0.0.0:9891".into());
    let port: i32 = listen.rsplit(':').next().unwrap().parse().unwrap();
    let named = c
        .ports
        .iter()
        .flatten()
        .find(|p| p.container_port == port)
        .expect("the listen port is a container port");
    let port_name = named.name.clone().expect("a named port");
    let probe_path = |p: Option<&k8s_openapi::api::core::v1::Probe>| {
        let h = p.and_then(|p| p.http_get.as_ref()).expect("httpGet probe");
        assert_eq!(h.port, IntOrString::String(port_name.clone()));
        h.path.clone().unwrap()
    };
    assert_eq!(probe_path(c.liveness_probe.as_ref()), "/healthz");
    assert_eq!(probe_path(c.readiness_probe.as_ref()), "/readyz");

    let svc: Service = read_one(&deploy_dir().join("service.yaml")).unwrap();
    let spec = svc.spec.unwrap();
    assert_eq!(
        spec.cluster_ip.as_deref(),
        Some("None"),
        "headless: every agent"
    );
    let pod_labels = ds
        .spec
        .template
        .metadata
        .as_ref()
        .unwrap()
        .labels
        .clone()
        .unwrap();
    for (k, v) in spec.selector.as_ref().unwrap() {
        assert_eq!(pod_labels.get(k), Some(v), "Service selects the agent pods");
    }
    let sport = &spec.ports.as_ref().unwrap()[0];
    assert_eq!(sport.port, port);
    assert_eq!(sport.target_port, Some(IntOrString::String(port_name)));
}

#[test]
fn rbac_is_exactly_what_the_agent_does() {
    let docs = documents(&deploy_dir().join("rbac.yaml")).unwrap();
    let role: ClusterRole = strict(&docs[0]).unwrap();
    let binding: ClusterRoleBinding = strict(&docs[1]).unwrap();
    let mut got = BTreeSet::new();
    for rule in role.rules.iter().flatten() {
        assert!(rule.resource_names.is_none() && rule.non_resource_urls.is_none());
        for g in rule.api_groups.iter().flatten() {
            for r in rule.resources.iter().flatten() {
                for v in &rule.verbs {
                    got.insert(format!("{g}/{r}:{v}"));
                }
            }
        }
    }
    let want: BTreeSet<String> = [
        "/pods:get",
        "/pods:list",
        "/pods:watch",
        "/pods/status:patch",
        "events.k8s.io/events:create",
        "events.k8s.io/events:list",
        "events.k8s.io/events:patch",
        "observer.dev/podreports:get",
        "observer.dev/podreports:create",
        "observer.dev/podreports:patch",
        "authentication.k8s.io/tokenreviews:create",
        "authorization.k8s.io/subjectaccessreviews:create",
    ]
    .map(String::from)
    .into();
    assert_eq!(
        got, want,
        "pods get/list/watch, pods/status patch, events create/patch/list, podreports \
         get/create/patch (never delete), the reviews of /metrics' callers"
    );
    assert_eq!(binding.role_ref.name, role.metadata.name.unwrap());
    let subjects = binding.subjects.unwrap();
    assert_eq!(subjects.len(), 1);
    assert_eq!(subjects[0].kind, "ServiceAccount");
    assert_eq!(subjects[0].name, "observer");
    assert_eq!(subjects[0].namespace.as_deref(), Some(namespace().as_str()));
}

/// admission-policy.yaml's policies, and their bindings, by name.
fn policies() -> (
    Vec<ValidatingAdmissionPolicy>,
    BTreeMap<String, ValidatingAdmissionPolicyBinding>,
) {
    let docs = documents(&deploy_dir().join("admission-policy.yaml")).unwrap();
    let mut policies = Vec::new();
    let mut bindings = BTreeMap::new();
    for d in &docs {
        match d["kind"].as_str() {
            Some("ValidatingAdmissionPolicy") => policies.push(strict(d).unwrap()),
            Some("ValidatingAdmissionPolicyBinding") => {
                let b: ValidatingAdmissionPolicyBinding = strict(d).unwrap();
                bindings.insert(b.spec.policy_name.clone(), b);
            }
            other => panic!("unexpected {other:?} in admission-policy.yaml"),
        }
    }
    (policies, bindings)
}

fn policy_named(name: &str) -> ValidatingAdmissionPolicy {
    policies()
        .0
        .into_iter()
        .find(|p| p.metadata.name.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("no policy {name}"))
}

#[test]
fn admission_policy_keeps_each_agent_to_its_node() {
    let (all, bindings) = policies();
    assert_eq!(all.len(), 2, "the node's policy and the mode's");
    // Each policy is bound, to deny.
    for p in &all {
        let name = p.metadata.name.clone().unwrap();
        let b = bindings
            .get(&name)
            .unwrap_or_else(|| panic!("{name} unbound"));
        assert_eq!(b.spec.validation_actions, vec!["Deny".to_string()]);
        let spec = p.spec.as_ref().unwrap();
        assert_eq!(spec.failure_policy.as_deref(), Some("Fail"));
        let user = format!("system:serviceaccount:{}:observer", namespace());
        assert!(
            spec.match_conditions
                .iter()
                .flatten()
                .any(|c| c.expression == format!("request.userInfo.username == '{user}'")),
            "{name}: only the agent's account"
        );
    }
    let policy = policy_named("observer-own-node");
    let binding = bindings["observer-own-node"].clone();
    let spec = policy.spec.unwrap();
    // The node's policy needs no parameter: it holds whatever becomes of the ConfigMap.
    assert!(spec.param_kind.is_none());
    assert!(binding.spec.param_ref.is_none());
    assert_eq!(spec.failure_policy.as_deref(), Some("Fail"));

    // Only the agent's service account, in the namespace kustomize installs it to.
    let conditions = spec.match_conditions.unwrap();
    let user = format!("system:serviceaccount:{}:observer", namespace());
    assert!(
        conditions
            .iter()
            .any(|c| c.expression == format!("request.userInfo.username == '{user}'")),
        "{conditions:?}"
    );
    // UPDATE (PATCH) of pods/status and CREATE/UPDATE of events are matched.
    let rules = spec
        .match_constraints
        .unwrap()
        .resource_rules
        .unwrap_or_default();
    let covers = |group: &str, resource: &str, op: &str| {
        rules.iter().any(|r| {
            r.api_groups.iter().flatten().any(|g| g == group)
                && r.resources.iter().flatten().any(|x| x == resource)
                && r.operations.iter().flatten().any(|o| o == op)
        })
    };
    assert!(covers("", "pods/status", "UPDATE"));
    assert!(covers("events.k8s.io", "events", "CREATE"));
    assert!(covers("events.k8s.io", "events", "UPDATE"));

    // The node claim against the stored pod's spec.nodeName.
    let claim = "request.userInfo.extra['authentication.kubernetes.io/node-name'][0]";
    let variables = spec.variables.unwrap();
    let node = variables.iter().find(|v| v.name == "node").unwrap();
    assert!(node.expression.contains(claim), "{}", node.expression);
    let validations = spec.validations.unwrap();
    assert!(validations.iter().any(|v| v
        .expression
        .contains("oldObject.spec.nodeName == variables.node")));
    assert!(validations.iter().any(|v| v
        .expression
        .contains("object.reportingInstance == variables.node")));

    assert_eq!(Some(binding.spec.policy_name), policy.metadata.name);
    // Neither has a parameter: the mode's policy carries config.yaml's mode and prefix itself
    // (kustomization.yaml's replacements write them in), so that a deleted or edited ConfigMap
    // widens nothing and kubelet's writes are never in the way.
    let mode = policy_named("observer-status-mode").spec.unwrap();
    assert!(mode.param_kind.is_none());
    assert!(bindings["observer-status-mode"].spec.param_ref.is_none());
    let cm: ConfigMap = read_one(&deploy_dir().join("config.yaml")).unwrap();
    let data = cm.data.unwrap();
    let literal = |name: &str| {
        let v = mode
            .variables
            .iter()
            .flatten()
            .find(|v| v.name == name)
            .unwrap();
        v.expression.split('\'').nth(1).unwrap().to_string()
    };
    assert_eq!(
        literal("mode"),
        data["statusMode"],
        "the policy's mode is config.yaml's"
    );
    assert_eq!(
        literal("prefix"),
        data["conditionPrefix"],
        "the policy's prefix is config.yaml's"
    );
    // The replacements that keep them so, from the ConfigMap into the policy.
    let replacements = kustomization()["replacements"].clone();
    for (key, variable) in [("statusMode", "mode"), ("conditionPrefix", "prefix")] {
        let r = replacements
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["source"]["fieldPath"] == format!("data.{key}"))
            .unwrap_or_else(|| panic!("a replacement of {key}"));
        assert_eq!(
            r["source"]["name"],
            cm.metadata.name.clone().unwrap().as_str()
        );
        let t = &r["targets"][0];
        assert_eq!(t["select"]["name"], "observer-status-mode");
        assert_eq!(
            t["fieldPaths"][0],
            format!("spec.variables.[name={variable}].expression")
        );
        assert_eq!(t["options"]["delimiter"], "'");
        assert_eq!(t["options"]["index"], 1);
    }
}

/// The admission request as the policy's CEL sees it.
struct Admission {
    user: String,
    node_claim: Option<&'static str>,
    resource: &'static str,
    sub_resource: &'static str,
    operation: &'static str,
    object: Value,
    old_object: Value,
    /// The mode written into the mode's policy (config.yaml's, unless a test sets another).
    mode: String,
}

impl Admission {
    fn agent(node_claim: Option<&'static str>) -> Self {
        Admission {
            user: format!("system:serviceaccount:{}:observer", namespace()),
            node_claim,
            resource: "pods",
            sub_resource: "status",
            operation: "UPDATE",
            object: Value::Null,
            old_object: Value::Null,
            mode: config()["statusMode"].clone(),
        }
    }

    fn mode(mut self, mode: &str) -> Self {
        self.mode = mode.into();
        self
    }

    /// The stored pod's metadata (the patched one's follows unless `edit` changes it).
    fn metadata(mut self, edit: impl FnOnce(&mut Value)) -> Self {
        edit(&mut self.object["metadata"]);
        self
    }

    /// The stored pod (before the patch): `edit` applied to both it and the patched one.
    fn stored(mut self, edit: impl Fn(&mut Value)) -> Self {
        edit(&mut self.old_object);
        edit(&mut self.object);
        self
    }

    /// A running pod on `node`, its status as kubelet and the agent left it.
    fn pod_on(mut self, node: &str) -> Self {
        let pod = serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"nodeName": node, "containers": [{"name": "web"}]},
            "status": {
                "phase": "Running", "hostIP": "10.0.0.7", "podIP": "10.1.0.9",
                "podIPs": [{"ip": "10.1.0.9"}], "qosClass": "Burstable",
                "startTime": "2026-12-03T10:00:00Z",
                "conditions": [
                    {"type": "Ready", "status": "True"},
                    {"type": "observer.dev/ContainersAlive", "status": "True"},
                    {"type": "ContainersReady", "status": "True"},
                ],
                "containerStatuses": [{"name": "web", "ready": true, "restartCount": 0,
                                       "image": "x", "imageID": "", "state": {"running": {}}}],
            },
        });
        self.object = pod.clone();
        self.old_object = pod;
        self
    }

    /// The status after the patch: `edit` applied to the stored one.
    fn status(mut self, edit: impl FnOnce(&mut Value)) -> Self {
        edit(&mut self.object["status"]);
        self
    }

    fn event(mut self, op: &'static str, kind: &str, controller: &str, instance: &str) -> Self {
        self.resource = "events";
        self.sub_resource = "";
        self.operation = op;
        self.object = serde_json::json!({
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": "web.1", "namespace": "default"},
            "regarding": {"apiVersion": "v1", "kind": kind, "name": "web", "namespace": "default"},
            "reportingController": controller,
            "reportingInstance": instance,
            "reason": "ContainerDied", "action": "Observed", "type": "Warning",
        });
        self.old_object = if op == "UPDATE" {
            self.object.clone()
        } else {
            Value::Null
        };
        self
    }

    /// A PodReport naming `node` (the stored one naming `stored`, for an UPDATE).
    fn report(mut self, op: &'static str, node: &str, stored: Option<&str>) -> Self {
        self.resource = "podreports";
        self.sub_resource = "";
        self.operation = op;
        self.object = serde_json::json!({
            "apiVersion": "observer.dev/v1alpha1", "kind": "PodReport",
            "metadata": {"name": "web", "namespace": "default"},
            "nodeName": node, "podUID": "u-1", "summary": {}, "explanation": {},
        });
        self.old_object = match stored {
            Some(n) => {
                let mut o = self.object.clone();
                o["nodeName"] = n.into();
                o
            }
            None => Value::Null,
        };
        self
    }

    fn old_instance(mut self, instance: &str) -> Self {
        self.old_object["reportingInstance"] = instance.into();
        self
    }

    /// What the policy decides: not matched (None), allowed, or the failing validations. As the
    /// API server does, a variable is evaluated when used (one that fails for this request, the
    /// pod-status ones on an event, fails only the validations that use it), and a validation
    /// that fails to evaluate denies (failurePolicy Fail).
    fn evaluate(&self, policies: &[ValidatingAdmissionPolicy]) -> Option<Result<(), Vec<String>>> {
        let results: Vec<_> = policies
            .iter()
            .map(|p| with_mode(p, &self.mode))
            .filter_map(|p| self.evaluate_one(&p))
            .collect();
        if results.is_empty() {
            return None;
        }
        let failed: Vec<String> = results
            .into_iter()
            .filter_map(Result::err)
            .flatten()
            .collect();
        Some(if failed.is_empty() {
            Ok(())
        } else {
            Err(failed)
        })
    }

    fn evaluate_one(&self, policy: &ValidatingAdmissionPolicy) -> Option<Result<(), Vec<String>>> {
        let spec = policy.spec.as_ref().unwrap();
        let mut extra = serde_json::Map::new();
        if let Some(node) = self.node_claim {
            extra.insert(
                "authentication.kubernetes.io/node-name".into(),
                serde_json::json!([node]),
            );
        }
        let request = serde_json::json!({
            "operation": self.operation,
            "resource": {"group": if self.resource == "events" { "events.k8s.io" } else { "" },
                         "version": "v1", "resource": self.resource},
            "subResource": self.sub_resource,
            "userInfo": {"username": self.user, "extra": extra},
        });
        let eval = |expr: &str,
                    variables: &std::collections::HashMap<String, cel::Value>|
         -> Result<cel::Value, String> {
            // Kubernetes' CEL has the strings library (`join` in the messages) beside the
            // standard one.
            let env = std::sync::Arc::new({
                let mut env = cel::Env::stdlib();
                env.add_extension(cel::extensions::strings).unwrap();
                env
            });
            let program = env
                .compile(expr)
                .unwrap_or_else(|e| panic!("CEL does not compile: {expr}: {e}"));
            let mut ctx = cel::Context::with_env(env);
            ctx.add_variable_from_value("request", cel::to_value(&request).unwrap());
            ctx.add_variable_from_value("object", cel::to_value(&self.object).unwrap());
            ctx.add_variable_from_value("oldObject", cel::to_value(&self.old_object).unwrap());
            ctx.add_variable_from_value("variables", cel::Value::from(variables.clone()));
            program.execute(&ctx).map_err(|e| format!("{expr}: {e}"))
        };
        let none = std::collections::HashMap::new();
        for c in spec.match_conditions.iter().flatten() {
            if eval(&c.expression, &none) != Ok(cel::Value::Bool(true)) {
                return None;
            }
        }
        let mut variables = std::collections::HashMap::new();
        for v in spec.variables.iter().flatten() {
            // A variable that cannot be evaluated here is left out: an expression using it fails.
            if let Ok(value) = eval(&v.expression, &variables) {
                variables.insert(v.name.clone(), value);
            }
        }
        let failed: Vec<String> = spec
            .validations
            .iter()
            .flatten()
            .filter(|v| eval(&v.expression, &variables) != Ok(cel::Value::Bool(true)))
            .map(|v| match &v.message_expression {
                // What the API server answers: the expression's value, else its text.
                Some(e) => match eval(e, &variables) {
                    Ok(cel::Value::String(m)) => m.to_string(),
                    _ => e.clone(),
                },
                None => v.message.clone().unwrap_or_default(),
            })
            .collect();
        Some(if failed.is_empty() {
            Ok(())
        } else {
            Err(failed)
        })
    }
}

/// The policy with `mode` written in, as kustomization.yaml's replacement writes config.yaml's:
/// the text between the mode variable's first two quotes.
fn with_mode(policy: &ValidatingAdmissionPolicy, mode: &str) -> ValidatingAdmissionPolicy {
    let mut p = policy.clone();
    for v in p.spec.as_mut().unwrap().variables.iter_mut().flatten() {
        if v.name == "mode" {
            let mut parts: Vec<&str> = v.expression.split('\'').collect();
            parts[1] = mode;
            v.expression = parts.join("'");
        }
    }
    p
}

/// The policy's CEL, evaluated on the requests an agent makes and on the ones it must not make.
#[test]
fn admission_policy_decides_as_documented() {
    let policy = policies().0;
    let allowed = |a: Admission| {
        let r = a.evaluate(&policy);
        assert_eq!(r, Some(Ok(())), "not allowed");
    };
    let denied = |a: Admission, why: &str| match a.evaluate(&policy) {
        Some(Err(messages)) => assert!(
            messages.iter().any(|m| m.contains(why)),
            "denied, but not for {why:?}: {messages:?}"
        ),
        other => panic!("not denied ({why}): {other:?}"),
    };
    let agent = || Admission::agent(Some("node-a"));
    // The agent's own Reporter: its StatusConfig's reporter, with the node name as the instance.
    let reporter = agent_defaults().reporter;
    let agent_id = reporter.as_str();
    let own = |status: &mut Value, s: &str| {
        status["conditions"][1]["status"] = s.into();
    };

    // Pods: only those bound to the token's node, and only the status.
    allowed(agent().pod_on("node-a").status(|s| own(s, "False")));
    denied(
        agent().pod_on("node-b").status(|s| own(s, "False")),
        "may only change pods bound to that node",
    );
    denied(
        Admission::agent(None).pod_on("node-a"),
        "must use its pod-bound token",
    );
    let mut spec = agent().pod_on("node-a");
    spec.sub_resource = "";
    denied(spec, "never changes a pod's spec or metadata");
    // Anyone else is not this policy's business.
    let mut kubelet = agent().pod_on("node-b");
    kubelet.user = "system:node:node-b".into();
    assert_eq!(kubelet.evaluate(&policy), None);

    // conditions mode: a condition under the prefix, added or changed; nothing else.
    allowed(agent().pod_on("node-a").status(|s| {
        s["conditions"]
            .as_array_mut()
            .unwrap()
            .push(serde_json::json!({"type": "observer.dev/OOMKilled", "status": "True"}))
    }));
    let only_prefixed = "in statusMode conditions the observer agent may only change conditions";
    denied(
        agent()
            .pod_on("node-a")
            .status(|s| s["phase"] = "Failed".into()),
        only_prefixed,
    );
    denied(
        agent()
            .pod_on("node-a")
            .status(|s| s["conditions"][0]["status"] = "False".into()),
        only_prefixed,
    );
    denied(
        agent().pod_on("node-a").status(|s| {
            s["conditions"].as_array_mut().unwrap().remove(0);
        }),
        only_prefixed,
    );
    denied(
        agent()
            .pod_on("node-a")
            .status(|s| s["containerStatuses"][0]["ready"] = false.into()),
        only_prefixed,
    );
    denied(
        agent()
            .pod_on("node-a")
            .status(|s| s["podIPs"] = serde_json::json!([])),
        only_prefixed,
    );
    denied(
        agent().pod_on("node-a").status(|s| {
            s.as_object_mut().unwrap().remove("hostIP");
        }),
        only_prefixed,
    );
    denied(
        agent()
            .pod_on("node-a")
            .status(|s| s["nominatedNodeName"] = "node-c".into()),
        only_prefixed,
    );

    // full mode: what `full` computes, and nothing the agent does not compute.
    allowed(agent().mode("full").pod_on("node-a").status(|s| {
        s["phase"] = "Failed".into();
        s["reason"] = "Evicted".into();
        s["conditions"][0]["status"] = "False".into();
        s["containerStatuses"][0]["ready"] = false.into();
    }));
    let full = "in statusMode full the observer agent may not change";
    denied(
        agent()
            .mode("full")
            .pod_on("node-a")
            .status(|s| s["podIP"] = "10.9.9.9".into()),
        full,
    );
    denied(
        agent()
            .mode("full")
            .pod_on("node-a")
            .status(|s| s["qosClass"] = "Guaranteed".into()),
        full,
    );
    denied(
        agent()
            .mode("full")
            .pod_on("node-a")
            .status(|s| s["ephemeralContainerStatuses"] = serde_json::json!([])),
        full,
    );

    // The pod's metadata, which the status subresource keeps from the request: in every mode,
    // beside a change the mode allows.
    let no_metadata = "the observer agent never changes a pod's metadata";
    for mode in ["conditions", "full"] {
        for (what, edit) in [
            (
                "labels",
                serde_json::json!({"labels": {"app": "elsewhere"}}),
            ),
            (
                "annotations",
                serde_json::json!({"annotations": {"a": "b"}}),
            ),
            (
                "finalizers",
                serde_json::json!({"finalizers": ["example.com/never"]}),
            ),
            (
                "ownerReferences",
                serde_json::json!({"ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "n", "uid": "u"}]}),
            ),
        ] {
            let changed = agent()
                .mode(mode)
                .pod_on("node-a")
                .status(|s| own(s, "False"))
                .metadata(|m| {
                    for (k, v) in edit.as_object().unwrap() {
                        m[k] = v.clone();
                    }
                });
            match changed.evaluate(&policy) {
                Some(Err(m)) => {
                    assert!(
                        m.iter()
                            .any(|m| m.contains(no_metadata)
                                && m.contains(&format!("metadata.{what}"))),
                        "{mode}: {what} denied, but not named: {m:?}"
                    )
                }
                other => panic!("{mode}: a change of metadata.{what} not denied: {other:?}"),
            }
        }
    }
    // Labels the pod already has are not a change.
    allowed(
        agent()
            .pod_on("node-a")
            .stored(|p| p["metadata"]["labels"] = serde_json::json!({"app": "web"}))
            .status(|s| own(s, "False")),
    );

    // full mode within kubelet's own rules (its status manager's checks).
    let terminated =
        |code: i64| serde_json::json!({"terminated": {"exitCode": code, "reason": "Error"}});
    let with_policy = |a: Admission, policy: &'static str| {
        a.stored(move |p| p["spec"]["restartPolicy"] = policy.into())
    };
    // A terminal phase never changes.
    for phase in ["Succeeded", "Failed"] {
        denied(
            agent()
                .mode("full")
                .pod_on("node-a")
                .stored(|p| p["status"]["phase"] = phase.into())
                .status(|s| s["phase"] = "Running".into()),
            "may not move a pod out of its terminal phase",
        );
    }
    // A terminated container runs again only where the spec restarts it.
    let revive = |a: Admission, code: i64| {
        a.mode("full")
            .stored(move |p| p["status"]["containerStatuses"][0]["state"] = terminated(code))
            .status(|s| s["containerStatuses"][0]["state"] = serde_json::json!({"running": {}}))
    };
    denied(
        revive(with_policy(agent().pod_on("node-a"), "Never"), 1),
        "may not make a terminated container run again",
    );
    denied(
        revive(with_policy(agent().pod_on("node-a"), "OnFailure"), 0),
        "may not make a terminated container run again",
    );
    allowed(revive(
        with_policy(agent().pod_on("node-a"), "OnFailure"),
        1,
    ));
    allowed(revive(with_policy(agent().pod_on("node-a"), "Always"), 0));
    // Container restart rules (KEP-5307): a matching rule restarts under a Never pod; one that
    // does not match falls back to the container's own policy.
    let rules = |a: Admission, action: &'static str| {
        a.stored(move |p| {
            p["spec"]["containers"][0]["restartPolicy"] = "Never".into();
            p["spec"]["containers"][0]["restartPolicyRules"] = serde_json::json!([
                {"action": action, "exitCodes": {"operator": "In", "values": [42]}}
            ]);
        })
    };
    allowed(revive(
        rules(with_policy(agent().pod_on("node-a"), "Never"), "Restart"),
        42,
    ));
    denied(
        revive(
            rules(with_policy(agent().pod_on("node-a"), "Never"), "Restart"),
            1,
        ),
        "may not make a terminated container run again",
    );
    // RestartAllContainers (KEP-5532): every container may leave its terminated state.
    allowed(revive(
        rules(
            with_policy(agent().pod_on("node-a"), "Never"),
            "RestartAllContainers",
        ),
        1,
    ));
    // Succeeded only when every container ended with 0.
    let succeed = |a: Admission, code: i64| {
        a.mode("full").status(move |s| {
            s["phase"] = "Succeeded".into();
            s["containerStatuses"][0]["state"] = terminated(code);
        })
    };
    denied(
        succeed(with_policy(agent().pod_on("node-a"), "Never"), 1),
        "may set phase Succeeded only when every container terminated with exit code 0",
    );
    allowed(succeed(with_policy(agent().pod_on("node-a"), "Never"), 0));
    // observedGeneration: only the pod's own generation.
    let generation = |a: Admission, g: i64| {
        a.mode("full")
            .stored(|p| p["metadata"]["generation"] = 3.into())
            .status(move |s| s["observedGeneration"] = g.into())
    };
    allowed(generation(agent().pod_on("node-a"), 3));
    denied(
        generation(agent().pod_on("node-a"), 7),
        "may set status.observedGeneration only to the pod's metadata.generation",
    );

    // audit and off: no status at all.
    for mode in ["audit", "off"] {
        denied(
            agent()
                .mode(mode)
                .pod_on("node-a")
                .status(|s| own(s, "False")),
            "the observer agent writes no pod status",
        );
    }
    // A policy written without a mode: everything refused.
    denied(
        agent()
            .mode("")
            .pod_on("node-a")
            .status(|s| own(s, "False")),
        "must name a statusMode",
    );

    // Events: about pods, as the agent, from its own node; series only of its own events; in
    // every mode that reaches the API but off.
    for mode in ["conditions", "audit", "full"] {
        allowed(
            agent()
                .mode(mode)
                .event("CREATE", "Pod", agent_id, "node-a"),
        );
    }
    allowed(agent().event("UPDATE", "Pod", agent_id, "node-a"));
    denied(
        agent()
            .mode("off")
            .event("CREATE", "Pod", agent_id, "node-a"),
        "in statusMode off the observer agent writes no events",
    );
    let only_pods = "may only write events about pods";
    denied(
        agent().event("CREATE", "Pod", agent_id, "node-b"),
        only_pods,
    );
    denied(
        agent().event("CREATE", "Node", agent_id, "node-a"),
        only_pods,
    );
    denied(
        agent().event("CREATE", "Pod", "kubelet", "node-a"),
        only_pods,
    );
    denied(
        agent()
            .event("UPDATE", "Pod", agent_id, "node-a")
            .old_instance("node-b"),
        "may only update events its own node wrote",
    );

    // PodReports: only those naming its own node, created or updated; none in off.
    for mode in ["conditions", "audit", "full"] {
        allowed(agent().mode(mode).report("CREATE", "node-a", None));
    }
    allowed(agent().report("UPDATE", "node-a", Some("node-a")));
    let own_reports = "may only write PodReports naming node node-a";
    denied(agent().report("CREATE", "node-b", None), own_reports);
    denied(
        agent().report("UPDATE", "node-a", Some("node-b")),
        own_reports,
    );
    denied(
        agent().mode("off").report("CREATE", "node-a", None),
        "writes no events and no PodReports",
    );
}

/// The policy's list of the pod status's fields is the whole of `PodStatus`: the struct literal
/// below names every field without `..`, so a k8s-openapi that adds one does not compile until
/// the field is added here, and the assertion then fails until the policy lists it too.
#[test]
fn admission_policy_lists_every_field_of_the_pod_status() {
    let policy = policy_named("observer-status-mode");
    use k8s_openapi::api::core::v1::PodStatus;
    let every = PodStatus {
        allocated_resources: Some(Default::default()),
        conditions: Some(vec![]),
        container_statuses: Some(vec![]),
        ephemeral_container_statuses: Some(vec![]),
        extended_resource_claim_status: Some(Default::default()),
        host_ip: Some(String::new()),
        host_ips: Some(vec![]),
        init_container_statuses: Some(vec![]),
        message: Some(String::new()),
        node_allocatable_resource_claim_statuses: Some(vec![]),
        nominated_node_name: Some(String::new()),
        observed_generation: Some(0),
        phase: Some(String::new()),
        pod_ip: Some(String::new()),
        pod_ips: Some(vec![]),
        qos_class: Some(String::new()),
        reason: Some(String::new()),
        resize: Some(String::new()),
        resource_claim_statuses: Some(vec![]),
        resources: Some(Default::default()),
        start_time: None,
        volume_health: Some(vec![]),
    };
    let mut fields: BTreeSet<String> = serde_json::to_value(&every)
        .unwrap()
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    fields.insert("startTime".into());
    let unchanged = policy
        .spec
        .unwrap()
        .variables
        .unwrap()
        .into_iter()
        .find(|v| v.name == "unchanged")
        .unwrap()
        .expression;
    let listed: BTreeSet<String> = unchanged
        .split('\'')
        .skip(1)
        .step_by(2)
        .map(String::from)
        .collect();
    assert_eq!(
        listed, fields,
        "the policy's `unchanged` names every PodStatus field"
    );
    // Each mode's validation keeps every field but what the mode writes: `conditions` its
    // conditions, `full` what its patch computes (status::patch::COMPUTED_KEYS).
    let kept_by = |mode: &str| -> BTreeSet<String> {
        let v = policy_validations()
            .into_iter()
            .find(|v| {
                v.expression
                    .contains(&format!("variables.mode != '{mode}'"))
            })
            .unwrap_or_else(|| panic!("a validation for mode {mode}"));
        // The first list literal of the expression: the fields kept.
        let list = v.expression.split_once('[').unwrap().1;
        let list = list.split_once(']').unwrap().0;
        list.split('\'')
            .skip(1)
            .step_by(2)
            .map(String::from)
            .collect()
    };
    let all_but = |written: &[&str]| -> BTreeSet<String> {
        fields
            .iter()
            .filter(|f| !written.contains(&f.as_str()))
            .cloned()
            .collect()
    };
    assert_eq!(kept_by("conditions"), all_but(&["conditions"]));
    assert_eq!(
        kept_by("full"),
        all_but(observer::status::patch::COMPUTED_KEYS)
    );
}

fn policy_validations() -> Vec<k8s_openapi::api::admissionregistration::v1::Validation> {
    policies()
        .0
        .into_iter()
        .flat_map(|p| p.spec.unwrap().validations.unwrap())
        .collect()
}

#[test]
fn namespace_admits_the_agent_and_the_example_uses_its_gate() {
    let ns: Namespace = read_one(&deploy_dir().join("namespace.yaml")).unwrap();
    assert_eq!(ns.metadata.name.as_deref(), Some(namespace().as_str()));
    assert_eq!(
        ns.metadata
            .labels
            .unwrap()
            .get("pod-security.kubernetes.io/enforce")
            .map(String::as_str),
        Some("privileged"),
        "hostPID, hostPath and capabilities are outside the baseline profile"
    );

    let prefix = env_value(agent_container(&ds()), "OBSERVER_CONDITION_PREFIX")
        .unwrap_or_else(|| agent_defaults().condition_prefix);
    let pod: Pod = read_one(&deploy_dir().join("examples/readiness-gate.yaml")).unwrap();
    let gates = pod.spec.unwrap().readiness_gates.unwrap();
    assert_eq!(gates[0].condition_type, format!("{prefix}/ContainersAlive"));
}

/// The readers' ClusterRoles: reports, read only, aggregated into `view` (what
/// `present::remote` and `kubectl observer status` read); `/metrics` for the scrapers; nothing
/// that reaches an agent, and bound to nobody by deploy/.
#[test]
fn plugin_role_is_exactly_what_the_plugin_does() {
    /// A rule as (API groups, resources, non-resource URLs, verbs).
    type Rule = (Vec<String>, Vec<String>, Vec<String>, Vec<String>);
    let docs = documents(&deploy_dir().join("plugin-rbac.yaml")).unwrap();
    let roles: Vec<ClusterRole> = docs.iter().map(|d| strict(d).unwrap()).collect();
    let rules = |r: &ClusterRole| -> Vec<Rule> {
        r.rules
            .clone()
            .unwrap()
            .into_iter()
            .map(|r| {
                (
                    r.api_groups.unwrap_or_default(),
                    r.resources.unwrap_or_default(),
                    r.non_resource_urls.unwrap_or_default(),
                    r.verbs,
                )
            })
            .collect()
    };
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    // Reading reports, aggregated into `view`: nothing but the reports, read only.
    let reader = &roles[0];
    assert_eq!(
        reader.metadata.name.as_deref(),
        Some("observer-reports-reader")
    );
    assert_eq!(
        reader.metadata.labels.as_ref().unwrap()["rbac.authorization.k8s.io/aggregate-to-view"],
        "true"
    );
    assert_eq!(
        rules(reader),
        vec![(
            s(&["observer.dev"]),
            s(&["podreports"]),
            vec![],
            s(&["get", "list", "watch"])
        )]
    );
    // Scraping /metrics: the one non-resource URL, bound by the operator to its scraper.
    let metrics = &roles[1];
    assert_eq!(
        metrics.metadata.name.as_deref(),
        Some("observer-metrics-reader")
    );
    assert_eq!(
        rules(metrics),
        vec![(vec![], vec![], s(&["/metrics"]), s(&["get"]))]
    );
    assert_eq!(roles.len(), 2);
    // Nothing that reaches an agent: no pods/proxy, no pods list in the agents' namespace.
    let text = std::fs::read_to_string(deploy_dir().join("plugin-rbac.yaml")).unwrap();
    assert!(!text.contains("pods/proxy"));
    let binding: ClusterRoleBinding =
        strict(&documents(&deploy_dir().join("rbac.yaml")).unwrap()[1]).unwrap();
    assert_eq!(
        binding.role_ref.name, "observer",
        "deploy/ binds only the agent's role"
    );
}

/// The NetworkPolicy holds the agents' port, and only it: scrapers by namespace label, and no
/// address block the user did not give (nothing but scrapers needs the port).
#[test]
fn network_policy_admits_only_the_scrapers_to_the_port() {
    let np: NetworkPolicy = read_one(&deploy_dir().join("networkpolicy.yaml")).unwrap();
    let spec = np.spec.unwrap();
    let labels = spec.pod_selector.unwrap().match_labels.unwrap();
    let ds = ds();
    let template_labels = ds
        .spec
        .template
        .metadata
        .as_ref()
        .unwrap()
        .labels
        .clone()
        .unwrap();
    for (k, v) in &labels {
        assert_eq!(
            template_labels.get(k),
            Some(v),
            "the policy selects the agents"
        );
    }
    assert_eq!(spec.policy_types, Some(vec!["Ingress".to_string()]));
    let rules = spec.ingress.unwrap();
    assert_eq!(rules.len(), 1);
    let port = agent_container(&ds).ports.as_ref().unwrap()[0].container_port;
    let ports = rules[0].ports.clone().unwrap();
    assert_eq!(ports.len(), 1);
    assert_eq!(ports[0].port, Some(IntOrString::Int(port)));
    let from = rules[0].from.clone().unwrap();
    assert!(from.iter().any(|p| p
        .namespace_selector
        .as_ref()
        .and_then(|s| s.match_labels.as_ref())
        .is_some_and(|l| l.get("observer.dev/scrape").map(String::as_str) == Some("true"))));
    assert!(
        from.iter().all(|p| p.ip_block.is_none()),
        "no address block is shipped: {from:?}"
    );
    assert!(
        from.iter()
            .all(|p| p.pod_selector.is_none() && p.namespace_selector.is_some()),
        "no peer admits every pod of a namespace by an empty selector: {from:?}"
    );
}

/// `kubectl kustomize deploy/` renders, into the same objects, all in the agent's namespace, the
/// mode and the prefix written into the mode's admission policy.
#[test]
fn kustomization_renders() {
    let Some(kubectl) = prereq::which("kubectl") else {
        prereq::require("kustomization_renders", &["kubectl on PATH".into()]);
        return;
    };
    let out = std::process::Command::new(kubectl)
        .arg("kustomize")
        .arg(deploy_dir())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dir = tempfile::tempdir().unwrap();
    let rendered = dir.path().join("rendered.yaml");
    std::fs::write(&rendered, &out.stdout).unwrap();
    let docs = documents(&rendered).unwrap();
    assert_eq!(docs.len(), 16, "every object of deploy/ but the example");
    let ns = namespace();
    for d in &docs {
        let cluster_scoped = matches!(
            d["kind"].as_str().unwrap(),
            "Namespace"
                | "CustomResourceDefinition"
                | "ClusterRole"
                | "ClusterRoleBinding"
                | "PriorityClass"
                | "ValidatingAdmissionPolicy"
                | "ValidatingAdmissionPolicyBinding"
        );
        if !cluster_scoped {
            assert_eq!(d["metadata"]["namespace"], ns.as_str(), "{d}");
        }
        assert_eq!(
            d["metadata"]["labels"]["app.kubernetes.io/part-of"], "observer",
            "{d}"
        );
    }
    let ds = docs.iter().find(|d| d["kind"] == "DaemonSet").unwrap();
    strict::<DaemonSet>(ds).unwrap();
    // config.yaml's mode and prefix, written into the mode's policy by the replacements.
    let policy = docs
        .iter()
        .find(|d| {
            d["metadata"]["name"] == "observer-status-mode"
                && d["kind"] == "ValidatingAdmissionPolicy"
        })
        .unwrap();
    let variable = |name: &str| {
        policy["spec"]["variables"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == name)
            .unwrap()["expression"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let config = config();
    assert_eq!(variable("mode"), format!("'{}'", config["statusMode"]));
    assert_eq!(
        variable("prefix"),
        format!("'{}' + '/'", config["conditionPrefix"])
    );
}

/// A node as the harness provides it, with the DaemonSet's hostPaths where they are here.
fn test_node(pods_dir: &Path, containerd_dir: &Path) -> Node {
    let mut node = Node::this_machine("node-under-test", pods_dir).unwrap();
    node.config_maps.insert("observer".into(), config());
    // The DaemonSet mounts /run/containerd/containerd.sock alone: the harness's socket is
    // containerd.sock in its own dir.
    node.host_paths.insert(
        "/run/containerd/containerd.sock".into(),
        containerd_dir.join("containerd.sock"),
    );
    node
}

#[test]
fn kubelet_translation_of_the_daemonset() {
    let dir = tempfile::tempdir().unwrap();
    let mut node = test_node(&dir.path().join("pods"), dir.path());
    // A socket where the runtime's is: kubelet checks the hostPath's type (Socket).
    let _socket =
        std::os::unix::net::UnixListener::bind(dir.path().join("containerd.sock")).unwrap();
    // Not every machine running unit tests has these; kubelet's type checks need the right kind.
    for (src, make_dir) in [("/sys/kernel/tracing", true), ("/sys/fs/cgroup", true)] {
        let p = dir.path().join(src.trim_start_matches('/'));
        if make_dir {
            std::fs::create_dir_all(&p).unwrap();
        }
        node.host_paths.insert(src.into(), p);
    }
    let kp: KubeletPod = kubelet::pod_for_node(&ds(), &node, "observer-abcde", dir.path()).unwrap();

    let sb_linux = kp.sandbox.linux.as_ref().unwrap();
    assert_eq!(
        sb_linux.cgroup_parent,
        format!("/kubepods/pod{}", kp.spec.uid)
    );
    let sb_sc = sb_linux.security_context.as_ref().unwrap();
    let ns = sb_sc.namespace_options.as_ref().unwrap();
    assert_eq!(ns.pid, api::NamespaceMode::Node as i32, "hostPID");
    assert_eq!(ns.network, api::NamespaceMode::Pod as i32);
    assert!(!sb_sc.privileged);
    assert_eq!(kp.sandbox.hostname, "observer-abcde");
    assert_eq!(kp.sandbox.metadata.as_ref().unwrap().namespace, namespace());

    let c = kp.container("observer").unwrap();
    assert_eq!(c.command, [agent::BINARY]);
    assert_eq!(c.args, ["run"]);
    let envs: BTreeMap<&str, &str> = c
        .envs
        .iter()
        .map(|kv| (kv.key.as_str(), kv.value.as_str()))
        .collect();
    assert_eq!(
        envs["NODE_NAME"], "node-under-test",
        "downward API resolved"
    );
    assert_eq!(envs["OBSERVER_CGROUPFS"], "/host/sys/fs/cgroup");
    let linux = c.linux.as_ref().unwrap();
    let r = linux.resources.as_ref().unwrap();
    assert_eq!(
        (r.cpu_period, r.cpu_quota, r.cpu_shares),
        (100_000, 25_000, 256)
    );
    assert_eq!(r.memory_limit_in_bytes, 128 << 20);
    assert_eq!(r.oom_score_adj, -997);
    let sc = linux.security_context.as_ref().unwrap();
    assert!(!sc.privileged && sc.readonly_rootfs && sc.no_new_privs);
    assert_eq!(sc.run_as_user.as_ref().unwrap().value, 0);
    let caps = sc.capabilities.as_ref().unwrap();
    assert_eq!(caps.drop_capabilities, ["ALL"]);
    assert_eq!(
        kubelet::capability_names(c),
        CAPABILITIES
            .iter()
            .map(|(c, _)| format!("CAP_{c}"))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        sc.seccomp.as_ref().unwrap().profile_type,
        api::security_profile::ProfileType::RuntimeDefault as i32
    );
    assert_eq!(sc.masked_paths, kubelet::DEFAULT_MASKED_PATHS);
    assert_eq!(
        sc.namespace_options.as_ref().unwrap().pid,
        api::NamespaceMode::Node as i32
    );
    let mount = |path: &str| c.mounts.iter().find(|m| m.container_path == path).unwrap();
    let socket = mount("/run/containerd/containerd.sock");
    assert_eq!(
        socket.host_path,
        dir.path().join("containerd.sock").to_string_lossy()
    );
    assert!(socket.readonly);
    // The socket alone: nothing else of the runtime's directory.
    assert!(c
        .mounts
        .iter()
        .all(|m| m.container_path != "/run/containerd"));
    assert!(mount("/dev/termination-log")
        .host_path
        .starts_with(&*dir.path().to_string_lossy()));

    // kubelet refuses a hostPath of the wrong type before it starts anything.
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, "").unwrap();
    node.host_paths.insert("/sys/kernel/tracing".into(), file);
    let err = kubelet::pod_for_node(&ds(), &node, "x", dir.path()).unwrap_err();
    assert!(format!("{err:#}").contains("is not a Directory"), "{err:#}");
}

/// `observer check`'s verdict per row: name → ok.
fn check_rows(output: &str) -> BTreeMap<String, bool> {
    let mut rows = BTreeMap::new();
    for line in output.lines() {
        let (status, rest) = match line.split_once(' ') {
            Some(x) => x,
            None => continue,
        };
        let ok = match status {
            "ok" => true,
            "MISSING" => false,
            _ => continue,
        };
        // Row names are padded to 34 columns and may contain single spaces.
        let name = rest.trim_start();
        let name = name.split("  ").next().unwrap_or(name).trim().to_string();
        rows.insert(name, ok);
    }
    rows
}

struct Run {
    exit_code: i32,
    /// stdout and stderr, interleaved.
    output: String,
    info: Value,
}

/// The agent's container of `kp` as kubelet would make it if it were named `name` (metadata, the
/// name label, the log) with `args` in place of `run` (their `$(VAR)`s expanded from the
/// container's env, as kubelet does), changed by `edit`.
fn agent_config(
    kp: &KubeletPod,
    name: &str,
    args: &[&str],
    edit: impl FnOnce(&mut api::ContainerConfig),
) -> api::ContainerConfig {
    let mut config = kp.container("observer").unwrap().clone();
    config.metadata.as_mut().unwrap().name = name.into();
    config
        .labels
        .insert(observer::cri::keys::CONTAINER_NAME.into(), name.into());
    config.log_path = format!("{name}/0.log");
    let vars: std::collections::HashMap<&str, &str> = config
        .envs
        .iter()
        .map(|kv| (kv.key.as_str(), kv.value.as_str()))
        .collect();
    config.args = args.iter().map(|a| kubelet::expand(a, &vars)).collect();
    edit(&mut config);
    config
}

/// Runs [`agent_config`]'s container in `pod` and waits for it to exit.
async fn run_agent(
    ctrd: &Containerd,
    pod: &mut observer_tests::Pod,
    kp: &KubeletPod,
    name: &str,
    args: &[&str],
    edit: impl FnOnce(&mut api::ContainerConfig),
) -> Run {
    let config = agent_config(kp, name, args, edit);
    let id = ctrd.add_container_with(pod, config.clone()).await.unwrap();
    let info = ctrd.container_info(&id).await.unwrap_or_default();
    let status = ctrd.wait_exited(&id, CHECK_TIMEOUT).await.unwrap();
    let log = read_container_log(pod, &config.log_path);
    Run {
        exit_code: status.exit_code,
        output: log.all,
        info,
    }
}

/// [`run_agent`] with `observer check`.
async fn run_check(
    ctrd: &Containerd,
    pod: &mut observer_tests::Pod,
    kp: &KubeletPod,
    name: &str,
    edit: impl FnOnce(&mut api::ContainerConfig),
) -> Run {
    run_agent(ctrd, pod, kp, name, &["check"], edit).await
}

/// `observer status` in the agent's container, configured by the manifest's own variables: the
/// whole pipeline (probes, the start-up walk through the host's /proc and cgroup tree, CRI over
/// the mounted socket, the kernel log).
const STATUS_ARGS: &[&str] = &[
    "status",
    "-o",
    "account",
    "--cgroupfs",
    "$(OBSERVER_CGROUPFS)",
    "--cri-endpoint",
    "$(OBSERVER_CRI_ENDPOINT)",
];

/// From one `observer status -o account --watch` line: the agent's own pod, if it shows the `status`
/// container running with its init pid (found in the host's /proc).
fn own_pod_running(line: &str) -> Option<Value> {
    let pods: Value = serde_json::from_str(line).ok()?;
    let own = pods
        .as_array()?
        .iter()
        .find(|p| p["name"] == "observer-test")?
        .clone();
    let running = own["containers"].as_array()?.iter().any(|c| {
        c["name"] == "status"
            && c["state"] == "running"
            && c["init_pid"].as_u64().is_some_and(|p| p > 0)
    });
    running.then_some(own)
}

fn security(config: &mut api::ContainerConfig) -> &mut api::LinuxContainerSecurityContext {
    config
        .linux
        .as_mut()
        .unwrap()
        .security_context
        .as_mut()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemonset_gives_the_agent_what_it_needs() {
    if !require_containerd() {
        return;
    }
    let bin = match prereq::observer_release_binary() {
        Ok(b) => b,
        Err(missing) => {
            prereq::require("the DaemonSet container test", &[missing]);
            return;
        }
    };
    init_tracing();
    let ctrd = Containerd::start().await.unwrap();

    // The image, from the same recipe as `cargo xtask image`, into the runtime.
    let image = AgentImage::build(&bin).unwrap();
    let archive = ctrd.dir().join("observer-image.tar");
    image.write_archive(&archive).unwrap();
    ctrd.import_archive(&archive).await.unwrap();

    // The DaemonSet's pod for this node, as kubelet would run it; only the network differs (no CNI).
    let node = test_node(&ctrd.dir().join("kubelet-pods"), ctrd.dir());
    let mut kp = kubelet::pod_for_node(&ds(), &node, "observer-test", &ctrd.logs_root()).unwrap();
    kp.use_node_network();
    let mut pod = ctrd
        .run_sandbox_with(&kp.spec, kp.sandbox.clone())
        .await
        .unwrap();

    // 1. As the manifest says: everything is there, the probes load and attach.
    let full = run_check(&ctrd, &mut pod, &kp, "observer", |_| {}).await;
    let rows = check_rows(&full.output);
    let spec = &full.info["runtimeSpec"];
    eprintln!(
        "observer check in the DaemonSet's container (exit {}):\n{}\n\ncgroup namespace: {}\neffective capabilities: {}",
        full.exit_code,
        full.output,
        spec["linux"]["namespaces"]
            .as_array()
            .is_some_and(|n| n.iter().any(|n| n["type"] == "cgroup")),
        spec["process"]["capabilities"]["effective"]
    );
    for row in CHECK_ROWS {
        assert_eq!(rows.get(*row), Some(&true), "{row} ok:\n{}", full.output);
    }
    assert!(
        full.output.contains("all requirements met"),
        "{}",
        full.output
    );
    assert_eq!(full.exit_code, 0, "{}", full.output);
    // The runtime really applied the manifest's restrictions.
    let effective: BTreeSet<&str> = spec["process"]["capabilities"]["effective"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    let want: BTreeSet<String> = CAPABILITIES
        .iter()
        .map(|(c, _)| format!("CAP_{c}"))
        .collect();
    assert_eq!(
        effective,
        want.iter().map(String::as_str).collect(),
        "the container has exactly the manifest's capabilities"
    );
    assert!(
        spec["linux"]["seccomp"].is_object(),
        "RuntimeDefault seccomp applied"
    );
    assert_eq!(spec["root"]["readonly"], true);
    assert_eq!(spec["process"]["noNewPrivileges"], true);

    // 2. Each capability taken away: the check fails at the requirement it is there for.
    let dmesg_restrict =
        std::fs::read_to_string("/proc/sys/kernel/dmesg_restrict").is_ok_and(|v| v.trim() == "1");
    for (cap, row) in CAPABILITIES {
        if *cap == "SYSLOG" && !dmesg_restrict {
            eprintln!("CAP_SYSLOG not exercised: kernel.dmesg_restrict is 0 on this host");
            continue;
        }
        let name = format!("without-{}", cap.to_lowercase().replace('_', "-"));
        let run = run_check(&ctrd, &mut pod, &kp, &name, |c| {
            security(c)
                .capabilities
                .as_mut()
                .unwrap()
                .add_capabilities
                .retain(|c| c != cap);
        })
        .await;
        let rows = check_rows(&run.output);
        eprintln!("without CAP_{cap}: {row} -> {:?}", rows.get(*row));
        assert_ne!(run.exit_code, 0, "without CAP_{cap}:\n{}", run.output);
        assert_eq!(
            rows.get(*row),
            Some(&false),
            "without CAP_{cap}, {row} fails:\n{}",
            run.output
        );
    }

    // 2b. The pipeline `observer run` starts, in the same container: it lists the pod it runs in,
    // found through the CRI socket mount and matched to the kernel's view of its cgroups. With
    // --watch it prints the view at every change, until the pod shows with this container
    // running.
    let watch_args: Vec<&str> = STATUS_ARGS.iter().copied().chain(["--watch"]).collect();
    let config = agent_config(&kp, "status", &watch_args, |_| {});
    let id = ctrd
        .add_container_with(&mut pod, config.clone())
        .await
        .unwrap();
    let seen = poll_until_async(CHECK_TIMEOUT, || {
        let log = read_container_log(&pod, &config.log_path);
        log.stdout.lines().rev().find_map(own_pod_running)
    })
    .await;
    let log = read_container_log(&pod, &config.log_path);
    ctrd.stop_container(&id, Duration::from_secs(5))
        .await
        .unwrap();
    let own = seen.unwrap_or_else(|| {
        panic!(
            "observer status never listed its own pod with its container running:\n{}",
            log.all
        )
    });
    assert_eq!(own["namespace"], namespace().as_str());
    let check = own["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "observer")
        .unwrap_or_else(|| panic!("the first check container: {own}"));
    assert_eq!(check["exit_code"], 0, "{own}");
    eprintln!(
        "observer status --watch in the DaemonSet's container: its own pod {} {}",
        own["status"], own["ready"]
    );

    // 3. Each host mount taken away: the check fails at the requirement it is there for.
    let template = kubelet::template(&ds()).unwrap().clone();
    let mount_path = |volume: &str| {
        template.spec.as_ref().unwrap().containers[0]
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| m.name == volume)
            .unwrap()
            .mount_path
            .clone()
    };
    for (volume, row) in CHECKED_MOUNTS {
        let path = mount_path(volume);
        let run = run_check(&ctrd, &mut pod, &kp, &format!("without-{volume}"), |c| {
            c.mounts.retain(|m| m.container_path != path);
        })
        .await;
        let rows = check_rows(&run.output);
        eprintln!("without the {volume} mount: {row} -> {:?}", rows.get(*row));
        assert_ne!(run.exit_code, 0, "without {volume}:\n{}", run.output);
        assert_eq!(
            rows.get(*row),
            Some(&false),
            "without the {volume} mount, {row} fails:\n{}",
            run.output
        );
    }
    let cri = mount_path("cri-socket");
    let run = run_agent(&ctrd, &mut pod, &kp, "without-cri", STATUS_ARGS, |c| {
        c.mounts.retain(|m| m.container_path != cri);
    })
    .await;
    eprintln!(
        "without the cri-socket mount: status exits {}",
        run.exit_code
    );
    assert_ne!(
        run.exit_code, 0,
        "status without the CRI socket:\n{}",
        run.output
    );
    assert!(run.output.contains("does not answer"), "{}", run.output);
}

/// The Containerfile's image is configured like `cargo xtask image`'s (its files are the same by
/// construction: it copies what `cargo xtask image --rootfs` lays out).
#[test]
fn containerfile_matches_the_xtask_image() {
    let text = std::fs::read_to_string(deploy_dir().join("Containerfile")).unwrap();
    let last_stage = text.rsplit("\nFROM ").next().unwrap();
    assert!(
        last_stage.starts_with("scratch"),
        "the image starts from scratch"
    );
    let json = |v: &[&str]| serde_json::to_string(v).unwrap().replace(',', ", ");
    assert!(last_stage.contains(&format!("ENTRYPOINT {}", json(agent::ENTRYPOINT))));
    assert!(last_stage.contains(&format!("CMD {}", json(agent::CMD))));
    for env in agent::ENV {
        assert!(last_stage.contains(&format!("ENV {env}")), "{env}");
    }
    assert!(text.contains("cargo xtask image --rootfs /rootfs"));
    assert!(last_stage.contains("COPY --from=build /rootfs/ /"));
}

/// `GET path` over plain HTTP/1.0 (the agent's endpoint on the node network): status and body.
/// The agent itself, `observer run` as the manifest starts it, in the DaemonSet's container: it
/// sees another pod's container OOM-killed through the host's cgroups, /proc and CRI socket, and
/// reports it to the API (a recording stand-in) as the condition and the Event. Two deviations
/// from the manifest, both for the test's node: the node network (no CNI here), and the API
/// server reached through a mounted kubeconfig (the stand-in speaks plain HTTP on 127.0.0.1, which
/// the in-cluster config's https service address cannot be), on a free port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_runs_as_the_daemonset_says() {
    use observer_tests::{
        apiserver::{pod_object, ApiStandIn},
        eventually_async, ContainerSpec, PodSpec,
    };
    if !require_containerd() || !observer_tests::kernel::require_kernel() {
        return;
    }
    let bin = match prereq::observer_release_binary() {
        Ok(b) => b,
        Err(missing) => {
            prereq::require("the DaemonSet agent test", &[missing]);
            return;
        }
    };
    init_tracing();
    let ctrd = Containerd::start().await.unwrap();
    let image = AgentImage::build(&bin).unwrap();
    let archive = ctrd.dir().join("observer-image.tar");
    image.write_archive(&archive).unwrap();
    ctrd.import_archive(&archive).await.unwrap();

    let mut node = test_node(&ctrd.dir().join("kubelet-pods"), ctrd.dir());
    let state = ctrd.dir().join("observer-state");
    std::fs::create_dir_all(&state).unwrap();
    node.host_paths
        .insert("/run/observer".into(), state.clone());
    let mut kp = kubelet::pod_for_node(&ds(), &node, "observer-test", &ctrd.logs_root()).unwrap();
    kp.use_node_network();
    let mut pod = ctrd
        .run_sandbox_with(&kp.spec, kp.sandbox.clone())
        .await
        .unwrap();

    let api = ApiStandIn::start().await.unwrap();
    let alive = "observer.dev/ContainersAlive";
    api.add_pod(pod_object(
        &kp.spec.name,
        &kp.spec.namespace,
        &kp.spec.uid,
        &node.name,
        &[("observer", None)],
        None,
    ));
    let victim = PodSpec::new("victim");
    api.add_pod(pod_object(
        &victim.name,
        &victim.namespace,
        &victim.uid,
        &node.name,
        &[("app", Some("32Mi"))],
        Some(alive),
    ));
    api.kubeconfig().unwrap();
    let listen = free_listen();
    let config = agent_config(&kp, "observer", &["run"], |c| {
        c.envs.push(api::KeyValue {
            key: "KUBECONFIG".into(),
            value: "/etc/observer-test/kubeconfig".into(),
        });
        for kv in c.envs.iter_mut().filter(|kv| kv.key == "OBSERVER_LISTEN") {
            kv.value = listen.to_string();
        }
        // The stand-in API reviews no tokens: scraped here on loopback, as a test may.
        for kv in c
            .envs
            .iter_mut()
            .filter(|kv| kv.key == "OBSERVER_METRICS_ACCESS")
        {
            kv.value = "open".into();
        }
        c.mounts.push(api::Mount {
            container_path: "/etc/observer-test".into(),
            host_path: api.dir().display().to_string(),
            readonly: true,
            ..Default::default()
        });
    });
    let agent_id = ctrd
        .add_container_with(&mut pod, config.clone())
        .await
        .unwrap();
    let log = || read_container_log(&pod, &config.log_path).all;
    assert!(
        eventually_async(CHECK_TIMEOUT, || http_get(listen, "/readyz")
            .is_some_and(|(c, _)| c == 200))
        .await,
        "the agent never became ready: {:?}\n{}",
        http_get(listen, "/readyz"),
        log()
    );

    // Another pod's init is OOM-killed.
    let victim_pod = ctrd
        .run_pod(victim.container(
            ContainerSpec::sh(
                "app",
                "while [ ! -e /tmp/go ]; do sleep 0.05; done; x=$(head -c 64m /dev/zero | tr '\\0' a); echo ${#x}",
            )
            .memory_limit_mib(32),
        ))
        .await
        .unwrap();
    let pid = ctrd
        .container_pid(victim_pod.container_id("app"))
        .await
        .unwrap();
    std::fs::write(format!("/proc/{pid}/root/tmp/go"), "").unwrap();
    // The fast path writes ContainersAlive=False alone; the manager's patch then carries only what
    // the fast path did not (OOMKilled): each must reach the API, in whichever patch.
    let victim_sets = |ty: &'static str, status: &'static str| {
        move |r: &Recorded| {
            r.method == "PATCH"
                && r.path().ends_with("/namespaces/default/pods/victim/status")
                && r.body["status"]["conditions"]
                    .as_array()
                    .is_some_and(|cs| cs.iter().any(|c| c["type"] == ty && c["status"] == status))
        }
    };
    for (ty, status) in [(alive, "False"), ("observer.dev/OOMKilled", "True")] {
        let patched = api.wait_for(CHECK_TIMEOUT, victim_sets(ty, status)).await;
        assert!(
            patched.is_some(),
            "no patch set {ty}={status} for the victim: {:#?}\n{}",
            api.recorded(),
            log()
        );
    }
    let event = api
        .wait_for(CHECK_TIMEOUT, |r| {
            r.method == "POST"
                && r.body["reason"] == "OOMKilled"
                && r.body["regarding"]["name"] == "victim"
        })
        .await;
    let note = event.map(|e| e.body["note"].as_str().unwrap_or_default().to_string());
    assert!(
        note.as_deref()
            .is_some_and(|n| n.contains(&format!("pid {pid}"))),
        "the OOM event names the victim: {note:?}\n{}",
        log()
    );
    let (code, metrics) = http_get(listen, "/metrics").unwrap();
    assert_eq!(code, 200);
    assert!(
        metrics.contains(
            r#"observer_oom_kills_total{namespace="default",pod="victim",container="app",scope="container"} 1"#
        ),
        "{metrics}"
    );
    // Its state: the inits it saw start, on the node's volume.
    let inits = std::fs::read_to_string(state.join("inits")).unwrap_or_default();
    assert!(inits.contains(victim_pod.container_id("app")), "{inits}");
    // The log pipeline reads JSON lines.
    let first = log()
        .lines()
        .find(|l| l.contains('{'))
        .unwrap_or_default()
        .to_string();
    assert!(
        first
            .split_once('{')
            .is_some_and(|(_, j)| serde_json::from_str::<Value>(&format!("{{{j}")).is_ok()),
        "JSON logs: {first}"
    );
    ctrd.stop_container(&agent_id, Duration::from_secs(10))
        .await
        .unwrap();
    let exited = ctrd.wait_exited(&agent_id, CHECK_TIMEOUT).await.unwrap();
    assert_eq!(exited.exit_code, 0, "SIGTERM is a clean exit:\n{}", log());
}
