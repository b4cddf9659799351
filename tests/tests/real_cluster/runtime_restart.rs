//! The host node's containerd SIGKILLed and started again, as an upgrade or a crash does. The
//! agent's mount of the CRI socket alone (not its directory) shows the dead socket, so the agent
//! fails /healthz and kubelet restarts it onto the new one. Through that: a container that died
//! while containerd was away is told once, and a death told before the restart is not told again
//! by the agent started after it, though containerd's restarted record of a death during its
//! absence says exit 255 `Unknown`, finished at its restart.
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use observer_cluster::Component;
use observer_tests::cluster::{
    agent_exclusive, agent_pod, apply, container_pid, get_json, require_cluster, set_agent_mode,
    test_guest, wait_pod, Namespace, TestPod, POLL,
};
use observer_tests::wait::poll_every;
use serde_json::Value;

/// The running container `main`'s id and restart count in a pod.
fn main_container(pod: &Value) -> Option<(String, i64)> {
    let s = pod["status"]["containerStatuses"]
        .as_array()?
        .iter()
        .find(|s| s["name"] == "main")?;
    s["state"]["running"].is_object().then_some(())?;
    Some((
        s["containerID"].as_str()?.to_string(),
        s["restartCount"].as_i64()?,
    ))
}

/// The agent's death Events (a series counts its deaths) by pod.
fn deaths_told(c: &observer_cluster::Cluster, ns: &str) -> BTreeMap<String, i64> {
    let events = get_json(c, &["get", "events.events.k8s.io", "-n", ns]).unwrap();
    let mut told = BTreeMap::new();
    for e in events["items"].as_array().unwrap() {
        let death = e["reason"]
            .as_str()
            .is_some_and(|r| r.starts_with("ContainerDied") || r == "ContainerCompleted");
        if e["reportingController"] != "observer" || !death {
            continue;
        }
        let n = e["series"]["count"].as_i64().unwrap_or(1);
        *told
            .entry(e["regarding"]["name"].as_str().unwrap().to_string())
            .or_default() += n;
    }
    told
}

/// The agent's Events, in short (pod, reason, action, note).
fn agent_events(c: &observer_cluster::Cluster, ns: &str) -> Vec<String> {
    let events = get_json(c, &["get", "events.events.k8s.io", "-n", ns]).unwrap();
    events["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["reportingController"] == "observer")
        .map(|e| {
            format!(
                "{} {} {} {} {}",
                e["eventTime"], e["regarding"]["name"], e["reason"], e["action"], e["note"]
            )
        })
        .collect()
}

/// The agent's container: its id and restart count.
fn agent_container(c: &observer_cluster::Cluster) -> (String, i64) {
    let pod = agent_pod(c).unwrap();
    let s = &pod["status"]["containerStatuses"][0];
    (
        s["containerID"].as_str().unwrap().to_string(),
        s["restartCount"].as_i64().unwrap(),
    )
}

#[test]
fn containerd_killed_and_restarted_each_death_is_told_once_through_the_agents_restart() {
    let Some(c) = require_cluster() else { return };
    assert!(
        test_guest(c).is_none(),
        "this test kills the host node's containerd: run it on the host's node"
    );
    let _agent = agent_exclusive();
    set_agent_mode(c, None).unwrap();
    let ns = Namespace::new(c, "t-runtime").unwrap();
    let names = ["before", "during", "untouched"];
    for name in names {
        let pod = TestPod::new(name, &ns.name, "Always").container("main", "sleep 3600");
        apply(c, &pod.manifest()).unwrap();
    }
    let running = |name: &str| {
        wait_pod(c, &ns.name, name, Duration::from_secs(120), |p| {
            main_container(p).is_some()
        })
        .and_then(|p| main_container(&p).ok_or_else(|| anyhow::anyhow!("not running")))
        .unwrap()
    };
    let ids: BTreeMap<&str, (String, i64)> = names.iter().map(|n| (*n, running(n))).collect();
    let agent = agent_container(c);

    // A death the agent tells live, before the fault.
    let pid = container_pid(&ids["before"].0).unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::SIGKILL,
    )
    .unwrap();
    poll_every(POLL, Duration::from_secs(60), || {
        (deaths_told(c, &ns.name).get("before") == Some(&1)).then_some(())
    })
    .expect("the death before the fault told");

    // containerd away for 8 s (the fault's span, not a wait for a condition); a container dies
    // meanwhile.
    c.kill_component(Component::Containerd).unwrap();
    let down = Instant::now();
    let pid = container_pid(&ids["during"].0).unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::SIGKILL,
    )
    .unwrap();
    std::thread::sleep(Duration::from_secs(8).saturating_sub(down.elapsed()));
    c.start_component(Component::Containerd).unwrap();

    // kubelet starts both again once containerd is back; the agent tells the death during the
    // fault (from the kernel, or from the runtime's record).
    for name in ["before", "during"] {
        wait_pod(c, &ns.name, name, Duration::from_secs(180), |p| {
            main_container(p).is_some_and(|(id, n)| id != ids[name].0 && n >= 1)
        })
        .unwrap();
    }
    // The agent restarted onto the new socket, once, and serves again.
    let restarted = poll_every(POLL, Duration::from_secs(180), || {
        let pod = agent_pod(c).ok()?;
        let s = &pod["status"]["containerStatuses"][0];
        let ready = s["ready"] == true;
        let now = (
            s["containerID"].as_str()?.to_string(),
            s["restartCount"].as_i64()?,
        );
        (ready && now != agent).then_some(now)
    })
    .expect("the agent restarted onto containerd's new socket and Ready");
    // Settled: the agent's account unchanged for 20 s (containerd's restarted records read, a
    // late tell decided), within 2 minutes.
    let mut last = (BTreeMap::new(), Instant::now());
    let told = poll_every(POLL, Duration::from_secs(120), || {
        let now = deaths_told(c, &ns.name);
        if now != last.0 {
            last = (now, Instant::now());
        }
        (last.1.elapsed() > Duration::from_secs(20)).then(|| last.0.clone())
    })
    .expect("the agent's Events settle");
    assert_eq!(
        told,
        BTreeMap::from([("before".to_string(), 1), ("during".to_string(), 1)]),
        "each death told once, the untouched pod's none; the agent's Events: {:#?}",
        agent_events(c, &ns.name)
    );
    assert_eq!(
        agent_container(c),
        restarted,
        "the agent restarted once, and ran on"
    );
}
