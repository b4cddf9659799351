//! The agent's computed PodStatus (`observer status -o pod-json --kubeconfig`, what
//! `--status-mode full` would write) beside what kubelet wrote, for pods of every shape the
//! containerd suites exercise (tests/tests/shapes.rs) and the common end states. Every field that
//! differs is listed; each must be one the README names as what the agent cannot know.
use std::collections::BTreeMap;
use std::time::Duration;

use observer_tests::cluster::{
    agent_shared, apply, condition, emulated, get_json, pod_level_oom, require_cluster, test_guest,
    wait_pod, Cluster, Namespace, TestPod, NODE_NAME, POLL, SHARED_DIR,
};
use observer_tests::prereq;
use serde_json::Value;

/// How long a pod may take to reach the state to compare: under software emulation (a guest
/// node) kubelet starts ten pods together minutes after their creation, where the host takes
/// seconds.
fn settle() -> Duration {
    Duration::from_secs(if emulated() { 900 } else { 180 })
}

/// When a pod has reached the state to compare.
type Settled = fn(&Value) -> bool;

/// The pods, and when each has reached the state to compare.
fn shapes(ns: &str) -> Vec<(TestPod, Settled)> {
    let running = |p: &Value| {
        p["status"]["phase"] == "Running"
            && condition(p, "Ready").is_some_and(|r| r["status"] == "True")
    };
    let terminal =
        |p: &Value| matches!(p["status"]["phase"].as_str(), Some("Succeeded" | "Failed"));
    let restarted_and_running = |p: &Value| {
        p["status"]["containerStatuses"][0]["restartCount"].as_i64() >= Some(1)
            && p["status"]["containerStatuses"][0]["state"]["running"].is_object()
    };
    let crash_looping = |p: &Value| {
        p["status"]["containerStatuses"][0]["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    };
    let holder_dead = |p: &Value| {
        p["status"]["containerStatuses"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|s| s["name"] == "holder" && s["state"]["terminated"].is_object())
    };
    vec![
        (TestPod::new("running", ns, "Always").container("main", "exec sleep 3600"), running),
        (TestPod::new("completed", ns, "Never").container("main", "exit 0"), terminal),
        (TestPod::new("failed", ns, "Never").container("main", "exit 3"), terminal),
        (
            TestPod::new("init-then-main", ns, "Always")
                .init_container("first", "exit 0", None)
                .init_container("second", "exit 0", None)
                .container("main", "exec sleep 3600"),
            running,
        ),
        (
            TestPod::new("sidecar", ns, "Always")
                .sidecar("proxy", "exec sleep 3600")
                .container("main", "exec sleep 3600"),
            running,
        ),
        (
            TestPod::new("restarted", ns, "Always").shared_dir().container(
                "main",
                &format!("if [ -e {SHARED_DIR}/once ]; then exec sleep 3600; fi; touch {SHARED_DIR}/once; exit 1"),
            ),
            restarted_and_running,
        ),
        (
            TestPod::new("crash-loop", ns, "Always").container("main", "exit 1"),
            crash_looping,
        ),
        (
            TestPod::new("shared-pid", ns, "Always")
                .share_process_namespace()
                .container("a", "exec sleep 3600")
                .container("b", "exec sleep 3600"),
            running,
        ),
        (
            TestPod::new("host-pid", ns, "Always")
                .host_pid()
                .container("main", "exec sleep 3600"),
            running,
        ),
        (
            pod_level_oom("pod-limit", ns, "exec sleep 3600"),
            holder_dead,
        ),
    ]
}

fn waiting_for(p: &Value, reason: &str) -> bool {
    p["status"]["containerStatuses"][0]["state"]["waiting"]["reason"] == reason
}

/// The states only kubelet or the node's files can tell, and the other end states and reasons
/// kubelet documents (issue of the status diff: every state a container can be in). Host node
/// only: under emulation each pod costs the guest's suite a minute.
fn more_shapes(ns: &str) -> Vec<(TestPod, Settled)> {
    let terminal =
        |p: &Value| matches!(p["status"]["phase"].as_str(), Some("Succeeded" | "Failed"));
    let started_not_ready = |p: &Value| {
        p["status"]["containerStatuses"][0]["state"]["running"].is_object()
            && p["status"]["containerStatuses"][0]["ready"] == false
    };
    let sidecar_restarted = |p: &Value| {
        p["status"]["initContainerStatuses"][0]["restartCount"].as_i64() >= Some(1)
            && p["status"]["containerStatuses"][0]["state"]["running"].is_object()
    };
    vec![
        (
            TestPod::new("image-never", ns, "Always")
                .container("main", "exec sleep 3600")
                .edit_last(|c| c["image"] = Value::from("localhost/absent:1")),
            |p| waiting_for(p, "ErrImageNeverPull"),
        ),
        (
            TestPod::new("config-error", ns, "Always")
                .container("main", "exec sleep 3600")
                .edit_last(|c| {
                    c["env"] = serde_json::json!([{"name": "X", "valueFrom":
                        {"configMapKeyRef": {"name": "absent", "key": "x"}}}])
                }),
            |p| waiting_for(p, "CreateContainerConfigError"),
        ),
        (
            TestPod::new("term-file", ns, "Never").container(
                "main",
                "echo wrote this before exit 2 > /dev/termination-log; exit 2",
            ),
            terminal,
        ),
        (
            TestPod::new("term-logs", ns, "Never")
                .container("main", "echo last words; exit 4")
                .edit_last(|c| {
                    c["terminationMessagePolicy"] = Value::from("FallbackToLogsOnError")
                }),
            terminal,
        ),
        (
            TestPod::new("no-binary", ns, "Never")
                .container("main", "")
                .edit_last(|c| c["command"] = serde_json::json!(["/no/such/binary"])),
            terminal,
        ),
        (
            TestPod::new("on-failure-ok", ns, "OnFailure").container("main", "exit 0"),
            terminal,
        ),
        (
            TestPod::new("init-fails", ns, "Never")
                .init_container("setup", "exit 1", None)
                .container("main", "exec sleep 3600"),
            terminal,
        ),
        (
            TestPod::new("not-ready", ns, "Always")
                .container("main", "exec sleep 3600")
                .edit_last(|c| {
                    c["readinessProbe"] = serde_json::json!({"exec": {"command": ["false"]},
                        "periodSeconds": 1})
                }),
            started_not_ready,
        ),
        (
            TestPod::new("sidecar-crash", ns, "Always")
                .sidecar("proxy", "sleep 1; exit 1")
                .container("main", "exec sleep 3600"),
            sidecar_restarted,
        ),
        (
            TestPod::new("startup-pending", ns, "Always")
                .container("main", "exec sleep 3600")
                .edit_last(|c| {
                    c["startupProbe"] = serde_json::json!({"exec": {"command": ["false"]},
                        "periodSeconds": 1, "failureThreshold": 100000})
                }),
            |p| {
                p["status"]["containerStatuses"][0]["state"]["running"].is_object()
                    && p["status"]["containerStatuses"][0]["started"] == false
            },
        ),
        (
            TestPod::new("terminating", ns, "Always")
                .container("main", "trap '' TERM; while true; do sleep 1; done")
                .spec_field("terminationGracePeriodSeconds", Value::from(120)),
            |p| {
                p["status"]["phase"] == "Running"
                    && condition(p, "Ready").is_some_and(|r| r["status"] == "True")
            },
        ),
        (
            TestPod::new("deadline", ns, "Always")
                .container("main", "exec sleep 3600")
                .spec_field("activeDeadlineSeconds", Value::from(5)),
            terminal,
        ),
    ]
}

/// Every leaf of a status, by path: lists of conditions by type, of container statuses by name.
fn leaves(v: &Value, path: String, out: &mut BTreeMap<String, Value>) {
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                leaves(v, format!("{path}.{k}"), out);
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                let key = item["type"]
                    .as_str()
                    .or(item["name"].as_str())
                    .or(item["ip"].as_str())
                    .map_or_else(|| i.to_string(), String::from);
                leaves(item, format!("{path}[{key}]"), out);
            }
        }
        // `null` and absent are the same to the API.
        Value::Null => {}
        other => {
            out.insert(path, other.clone());
        }
    }
}

/// Fields the README's "What the agent cannot know" names, as path patterns: the API's own
/// (resources, volume mounts, users, image digests, IPs, QoS), kubelet's allocation and kubelet's
/// bookkeeping of its own writes (observedGeneration).
fn documented(path: &str) -> bool {
    const FIELDS: [&str; 11] = [
        ".allocatedResources",
        ".resources",
        ".volumeMounts",
        ".user",
        ".imageID",
        ".hostIP",
        ".hostIPs",
        ".podIP",
        ".podIPs",
        ".qosClass",
        ".observedGeneration",
    ];
    FIELDS.iter().any(|f| path.contains(f))
}

#[test]
fn computed_status_beside_kubelets_for_every_shape() {
    let Some(c) = require_cluster() else { return };
    let _agent = agent_shared();
    let observer = match prereq::observer_release_binary() {
        Ok(b) => b,
        Err(e) => panic!("{e}"),
    };
    let ns = Namespace::new(c, "t-status-diff").unwrap();
    let mut shapes = shapes(&ns.name);
    if test_guest(c).is_none() {
        shapes.extend(more_shapes(&ns.name));
    }
    for (pod, _) in &shapes {
        apply(c, &pod.manifest()).unwrap();
    }
    for (pod, ready) in &shapes {
        wait_pod(c, &ns.name, &pod.name, settle(), |p| {
            ready(p) && condition(p, "observer.dev/ContainersAlive").is_some()
        })
        .unwrap();
    }
    let host = test_guest(c).is_none();
    if host {
        // A pod deleted while it runs: its container ignores SIGTERM, so it stays Terminating
        // for its grace period, which the comparison runs within.
        c.kubectl_ok(&[
            "delete",
            "pod",
            "-n",
            &ns.name,
            "terminating",
            "--wait=false",
        ])
        .unwrap();
        wait_pod(c, &ns.name, "terminating", settle(), |p| {
            p["metadata"]["deletionTimestamp"].is_string()
        })
        .unwrap();
        termination_messages_come_from_the_node(c, &observer, &ns.name);
    }
    // Both accounts read one after the other: kubelet's, then the agent's computation with the
    // same specs. A pod that changes meanwhile (a crash loop's next death, which the agent sees
    // first) differs for a moment; what differs for good stays through the retries.
    // Under emulation a round (the guest's `observer status`) takes seconds itself.
    let retries = Duration::from_secs(if emulated() { 180 } else { 60 });
    let kubelet_minor = observer_tests::cluster::test_kubelet_minor(c);
    let deadline = std::time::Instant::now() + retries;
    let (listed, undocumented) = loop {
        let api = get_json(c, &["get", "pods", "-n", &ns.name]).unwrap();
        let agent = computed(c, &observer);
        let (listed, undocumented) = diff(&api, &agent, kubelet_minor);
        if undocumented.is_empty() || std::time::Instant::now() > deadline {
            break (listed, undocumented);
        }
        std::thread::sleep(POLL);
    };
    eprintln!(
        "fields that differ, documented ({}):\n  {}",
        listed.len(),
        listed.join("\n  ")
    );
    assert!(
        undocumented.is_empty(),
        "fields that differ and the README does not name ({}):\n  {}",
        undocumented.len(),
        undocumented.join("\n  ")
    );
    if host {
        let _ = c.kubectl_ok(&[
            "delete",
            "pod",
            "-n",
            &ns.name,
            "terminating",
            "--grace-period=0",
            "--force",
        ]);
    }
}

/// The termination messages as the agent reads them from the node's files (the API left out),
/// beside kubelet's: the `File` policy's file, and `FallbackToLogsOnError`'s log tail.
fn termination_messages_come_from_the_node(c: &Cluster, observer: &std::path::Path, ns: &str) {
    let api = get_json(c, &["get", "pods", "-n", ns]).unwrap();
    let offline = computed_on_host(c, observer, false);
    for name in ["term-file", "term-logs", "no-binary"] {
        let pod = api["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["metadata"]["name"] == name)
            .unwrap();
        let kubelets = &pod["status"]["containerStatuses"][0]["state"]["terminated"]["message"];
        assert!(kubelets.is_string(), "{name}: kubelet wrote no message");
        let uid = &pod["metadata"]["uid"];
        let mine = offline
            .iter()
            .find(|p| &p["metadata"]["uid"] == uid)
            .unwrap_or_else(|| panic!("{name}: not in the agent's account without the API"));
        let ours = &mine["status"]["containerStatuses"][0]["state"]["terminated"]["message"];
        assert_eq!(
            ours, kubelets,
            "{name}: the agent's termination message from the node's files, without the API"
        );
    }
}

/// The fields of each pod's status that differ: (those the README names, the others).
fn diff(api: &Value, agent: &[Value], kubelet_minor: u32) -> (Vec<String>, Vec<String>) {
    let mut undocumented = Vec::new();
    let mut listed = Vec::new();
    for pod in api["items"].as_array().unwrap() {
        let name = pod["metadata"]["name"].as_str().unwrap();
        let uid = pod["metadata"]["uid"].as_str().unwrap();
        let mine = agent
            .iter()
            .find(|p| p["metadata"]["uid"] == uid)
            .unwrap_or_else(|| panic!("{name}: not in the agent's account"));
        let (mut theirs, mut ours) = (BTreeMap::new(), BTreeMap::new());
        leaves(&pod["status"], String::new(), &mut theirs);
        leaves(&mine["status"], String::new(), &mut ours);
        let paths: std::collections::BTreeSet<&String> = theirs.keys().chain(ours.keys()).collect();
        for path in paths {
            let (k, a) = (theirs.get(path), ours.get(path));
            // The agent's own conditions are in both by the agent's hand.
            if k == a || path.contains("[observer.dev/") {
                continue;
            }
            let line = format!(
                "{name}: status{path}: kubelet {} / agent {}",
                k.map_or("(absent)".into(), |v| v.to_string()),
                a.map_or("(absent)".into(), |v| v.to_string())
            );
            // containerd 2.x with the systemd driver loses a container's OOM kill now and then
            // (docs/second-node.md): kubelet writes Error / 137 where the kernel OOM-killed it.
            // The agent's OOMKilled comes from the kernel, which its own condition on the pod
            // shows; that difference is kubelet's runtime, listed, not held against the agent.
            let runtime_lost_oom = path.ends_with(".terminated.reason")
                && k == Some(&Value::from("Error"))
                && a == Some(&Value::from("OOMKilled"))
                && condition(pod, "observer.dev/OOMKilled").is_some_and(|c| c["status"] == "True");
            // kubelet before 1.37 writes PodReadyToStartContainers=False without a reason or
            // message; the agent writes 1.37's (PodSandboxNotReady and the sandbox's state).
            let older_kubelet = kubelet_minor < 37
                && path.starts_with(".conditions[PodReadyToStartContainers].")
                && (path.ends_with(".reason") || path.ends_with(".message"))
                && k.is_none();
            if documented(path)
                || runtime_lost_oom
                || older_kubelet
                || in_back_off(pod, mine, path)
                || attempt_ahead(pod, mine, path)
            {
                listed.push(line);
            } else {
                undocumented.push(line);
            }
        }
    }
    (listed, undocumented)
}

/// A restartable init container waiting out its back-off: the agent says so
/// (`waiting: CrashLoopBackOff`, the attempt that just ended as its last state) from the moment
/// it died; kubelet says it only once a sync of the pod has met the back-off (its reason cache,
/// docs/cannot-know.md) and shows the attempt `terminated` until then, which kubelet 1.35 does
/// for a sidecar through the whole back-off.
fn in_back_off(api: &Value, agent: &Value, path: &str) -> bool {
    let Some(rest) = path.strip_prefix(".initContainerStatuses[") else {
        return false;
    };
    let Some((name, field)) = rest.split_once(']') else {
        return false;
    };
    if !(field.starts_with(".state.") || field.starts_with(".lastState.")) {
        return false;
    }
    let of = |pod: &Value| {
        pod["status"]["initContainerStatuses"]
            .as_array()
            .and_then(|l| l.iter().find(|s| s["name"] == name))
            .cloned()
            .unwrap_or_default()
    };
    let (k, a) = (of(api), of(agent));
    a["state"]["waiting"]["reason"] == "CrashLoopBackOff"
        && k["state"]["terminated"].is_object()
        && a["lastState"]["terminated"]["containerID"] == k["state"]["terminated"]["containerID"]
}

/// A container's status by the path of one of its fields (`.containerStatuses[main].…`).
fn container_of<'p>(pod: &'p Value, path: &str) -> Option<&'p Value> {
    let (list, rest) = path.strip_prefix('.')?.split_once('[')?;
    if !list.ends_with("ontainerStatuses") {
        return None;
    }
    let name = rest.split_once(']')?.0;
    pod["status"][list]
        .as_array()?
        .iter()
        .find(|s| s["name"] == name)
}

/// The agent already shows the container's next attempt (one more restart, another container
/// ID) that kubelet has started but not yet written: a crash loop on a slow node, where kubelet
/// writes its account seconds after the runtime has the attempt. Listed, not held against the
/// agent: it is the same account, one attempt later.
fn attempt_ahead(api: &Value, agent: &Value, path: &str) -> bool {
    let (Some(k), Some(a)) = (container_of(api, path), container_of(agent, path)) else {
        return false;
    };
    let restarts = |s: &Value| s["restartCount"].as_i64();
    restarts(a) == restarts(k).map(|n| n + 1) && a["containerID"] != k["containerID"]
}

/// `observer status -o json --kubeconfig` on the node: the running agent's state and the
/// node's containerd, the specs from the API; read-only.
fn computed(c: &Cluster, observer: &std::path::Path) -> Vec<Value> {
    if let Some(guest) = test_guest(c) {
        return computed_in_guest(&guest, observer);
    }
    computed_on_host(c, observer, true)
}

/// `observer status -o pod-json` on the host node; `with_api: false` leaves the API out (no
/// specs, nothing of kubelet's), so that what remains is the runtime's, the kernel's and the
/// node's files.
fn computed_on_host(c: &Cluster, observer: &std::path::Path, with_api: bool) -> Vec<Value> {
    let mut cmd = std::process::Command::new(observer);
    cmd.args(["status", "-o", "json", "--node-name", NODE_NAME]);
    if with_api {
        cmd.arg("--kubeconfig").arg(c.kubeconfig());
    }
    let out = cmd
        .arg("--cri-endpoint")
        .arg(c.containerd_socket())
        .arg("--state-dir")
        .arg(std::path::Path::new(observer_cluster::RUN_DIR).join("agent-state"))
        // This node's kubelet keeps its pods under the cluster's own cgroup root, apart from the
        // /kubepods trees the host suites lay out (which detection would find first).
        .arg("--cgroup-root")
        .arg(format!("/{}", observer_cluster::CGROUP_ROOT))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "observer status: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let list: Value = serde_json::from_slice(&out.stdout).unwrap();
    list["items"].as_array().cloned().unwrap_or_default()
}

/// The same in a guest node, through its guest agent: the program copied in, the guest's
/// containerd, an admin kubeconfig reaching the API server through the guest's relay.
fn computed_in_guest(
    guest: &observer_cluster::Guest<'_>,
    observer: &std::path::Path,
) -> Vec<Value> {
    use std::sync::OnceLock;
    static INSTALLED: OnceLock<(String, String)> = OnceLock::new();
    let (program, kubeconfig) = INSTALLED.get_or_init(|| {
        (
            guest.install(observer).unwrap(),
            guest.admin_kubeconfig().unwrap(),
        )
    });
    let state_dir = format!("{}/agent-state", observer_cluster::RUN_DIR);
    let r = guest
        .exec(
            program,
            &[
                "status",
                "-o",
                "json",
                "--node-name",
                &guest.name,
                "--kubeconfig",
                kubeconfig,
                "--cri-endpoint",
                observer_cluster::guest::GUEST_CONTAINERD_SOCKET,
                "--state-dir",
                &state_dir,
            ],
            Duration::from_secs(300),
        )
        .unwrap();
    assert!(
        r.code == 0,
        "observer status in {}: {}",
        guest.name,
        r.stderr
    );
    let list: Value = serde_json::from_str(&r.stdout).unwrap();
    list["items"].as_array().cloned().unwrap_or_default()
}
