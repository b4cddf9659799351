//! Memory warnings on the real cluster, beside kubelet: a container leaking into its 64 MiB limit
//! gets the agent's `MemoryNearLimit` Event and `observer.dev/MemoryPressure=True` before kubelet
//! reports its OOM kill; a container reading a file larger than its limit, at the limit the whole
//! time (the agent counts the kernel's limit hits), gets neither. On the host node (v1 memory) and
//! on the guest node (cgroup v2: scripts/cluster-test.sh runs it there too).
use std::time::Duration;

use observer_tests::cluster::{
    agent_metrics, agent_shared, apply, condition, get_json, require_cluster, test_node, wait_pod,
    Cluster, Namespace, TestPod, Watch,
};

/// A guest node under emulation is slow to start pods and to fill memory.
const WAIT: Duration = Duration::from_secs(600);
const CONDITION: &str = "observer.dev/MemoryPressure";

/// 24 MiB of page cache written to the container's filesystem, then 256 KiB of anonymous memory
/// every 20 ms as the container's init: the limit is met while the cache gives way, so the warning
/// comes with time to spare (a leak with nothing reclaimable beside it is warned milliseconds
/// before its kill: BENCHMARKS.md). busybox awk, each string its own array element: a string
/// grown by concatenation is copied whole each time, a sudden allocation of half the limit.
const LEAK: &str = r#"dd if=/dev/zero of=/tmp/f bs=1M count=24 2>/dev/null; exec awk 'BEGIN { while (1) { a[n++] = sprintf("%262144s", ""); system("usleep 20000") } }'"#;
/// 160 MiB written to the container's own filesystem (the node's disk), then read for 40 s.
const CACHE: &str = "dd if=/dev/zero of=/tmp/f bs=1M count=160 2>/dev/null && \
     end=$(( $(date +%s) + 40 )); while [ $(date +%s) -lt $end ]; do cat /tmp/f >/dev/null; done";

fn events(c: &Cluster, ns: &str, pod: &str) -> Vec<serde_json::Value> {
    get_json(
        c,
        &[
            "get",
            "events",
            "-n",
            ns,
            "--field-selector",
            &format!("involvedObject.name={pod}"),
        ],
    )
    .map(|v| v["items"].as_array().cloned().unwrap_or_default())
    .unwrap_or_default()
}

fn event_time(e: &serde_json::Value) -> String {
    e["eventTime"]
        .as_str()
        .or(e["firstTimestamp"].as_str())
        .unwrap_or_default()
        .to_string()
}

#[test]
fn a_leak_is_warned_before_its_oom_kill_and_a_cache_loop_never() {
    let Some(c) = require_cluster() else { return };
    let _agent = agent_shared();
    let ns = Namespace::new(c, "t-memory").unwrap();
    let node = test_node();
    // A list watch: it starts before the pod exists.
    let watch = Watch::start(
        c,
        &[
            "pods",
            "-n",
            &ns.name,
            "--field-selector",
            "metadata.name=leak",
        ],
    )
    .unwrap();
    for (name, script) in [("leak", LEAK), ("cache", CACHE)] {
        apply(
            c,
            &TestPod::new(name, &ns.name, "Never")
                .limited("main", script, "64Mi")
                .node_name(&node)
                .manifest(),
        )
        .unwrap();
    }
    // kubelet's own account of the death. Its reason is the runtime's, which can be Error for an
    // OOM kill (seen on the guest node's containerd: the exit read before the kill's event, with
    // the pod's limit hit and the whole group killed) — the miss the agent's account is for.
    let leak = wait_pod(c, &ns.name, "leak", WAIT, |p| {
        p["status"]["containerStatuses"][0]["state"]["terminated"].is_object()
    })
    .unwrap_or_else(|e| panic!("kubelet never reported the leak's death: {e}"));
    let terminated = &leak["status"]["containerStatuses"][0]["state"]["terminated"];
    assert_eq!(
        terminated["exitCode"], 137,
        "killed by SIGKILL: {terminated:#}"
    );
    if terminated["reason"] != "OOMKilled" {
        eprintln!(
            "kubelet's reason for the leak's OOM kill: {} (the runtime missed the kill)",
            terminated["reason"]
        );
    }
    let kubelet_done = terminated["finishedAt"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    // The agent's account: the kill, whatever kubelet said.
    wait_pod(c, &ns.name, "leak", Duration::from_secs(60), |p| {
        condition(p, "observer.dev/OOMKilled").is_some_and(|c| c["status"] == "True")
    })
    .unwrap_or_else(|e| panic!("the agent never said OOMKilled: {e}"));
    // The warning, then the kill, in the pod's Events.
    let evs =
        observer_tests::wait::poll_every(Duration::from_secs(1), Duration::from_secs(60), || {
            let evs = events(c, &ns.name, "leak");
            evs.iter()
                .any(|e| e["reason"] == "OOMKilled" || e["reason"] == "ProcessOOMKilled")
                .then_some(evs)
        })
        .expect("no OOM Event from the agent");
    let reasons: Vec<(String, String)> = evs
        .iter()
        .map(|e| {
            (
                event_time(e),
                e["reason"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    let warning = evs
        .iter()
        .find(|e| e["reason"] == "MemoryNearLimit")
        .unwrap_or_else(|| panic!("no MemoryNearLimit Event: {reasons:?}"));
    let note = warning["note"]
        .as_str()
        .or(warning["message"].as_str())
        .unwrap_or_default();
    eprintln!("warning: {note}");
    // A one-container pod's limit is its container's: which counter the kernel found full first
    // is the one named (on cgroup v1 the pod's also holds the pause container's memory).
    assert!(
        note.starts_with("container main is about to be OOM-killed: ")
            && (note.contains("64.0 MiB container limit cannot be reclaimed")
                || note.contains("64.0 MiB pod limit cannot be reclaimed")),
        "{note}"
    );
    let kill = evs
        .iter()
        .find(|e| e["reason"] == "OOMKilled" || e["reason"] == "ProcessOOMKilled")
        .unwrap();
    // RFC 3339 with the same precision and zone sort as text.
    assert!(
        event_time(warning) <= event_time(kill),
        "the warning came after the kill: {reasons:?}"
    );
    // The condition was True on the pod while the container ran, beside kubelet's status.
    let said = watch.seen().iter().any(|(_, p)| {
        condition(p, CONDITION)
            .is_some_and(|c| c["status"] == "True" && c["reason"] == "MemoryNearLimit")
            && p["status"]["containerStatuses"][0]["state"]["running"].is_object()
    });
    let seen: Vec<_> = watch
        .seen()
        .iter()
        .map(|(_, p)| {
            (
                condition(p, CONDITION).cloned(),
                p["status"]["containerStatuses"][0]["state"].clone(),
            )
        })
        .collect();
    assert!(
        said,
        "MemoryPressure=True never seen while the container ran (kubelet: finished {kubelet_done}): {seen:#?}"
    );

    // The cache loop: at its limit for 40 s, never warned.
    let cache = wait_pod(c, &ns.name, "cache", WAIT, |p| {
        p["status"]["phase"] != "Pending" && p["status"]["phase"] != "Running"
    })
    .unwrap_or_else(|e| panic!("the cache loop did not end: {e}"));
    assert_eq!(cache["status"]["phase"], "Succeeded", "{cache:#}");
    let hits: f64 = agent_metrics(c)
        .unwrap()
        .lines()
        .filter(|l| {
            l.starts_with("observer_memory_limit_hits_total{")
                && l.contains(&format!("namespace=\"{}\"", ns.name))
                && l.contains("pod=\"cache\"")
        })
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum();
    assert!(
        hits > 0.0,
        "the cache loop never met its limit: the test proves nothing"
    );
    eprintln!("cache loop: {hits} limit hits");
    let evs = events(c, &ns.name, "cache");
    assert!(
        !evs.iter().any(|e| e["reason"] == "MemoryNearLimit"),
        "the cache loop was warned: {evs:#?}"
    );
    assert!(condition(&cache, CONDITION).is_none(), "{cache:#}");
}
