//! Two agents, one per node (the host's and a guest's: `cargo xtask cluster up --nodes 2`), each
//! with its own real pod-bound token: deploy/'s ValidatingAdmissionPolicy refuses each writing a
//! status of a pod bound to the other's node and accepts its own node's. Ignored in the default
//! suite (the host node's alone): run with `--ignored` once a guest node runs.
use std::time::Duration;

use observer_tests::cluster::{
    agent_pod_on, agent_shared, apply, condition, get_json, require_cluster, wait_pod, Cluster,
    Namespace, TestPod, NODE_NAME, POLL,
};
use observer_tests::wait::poll_every;
use serde_json::Value;

use super::{agent_token, refused_by_policy, write_status_as};

/// A guest node is under software emulation: kubelet there has started a pod minutes after its
/// creation when other pods were starting.
const READY: Duration = Duration::from_secs(900);

/// The live agent pod on `node`, once Ready.
fn agent_on(c: &Cluster, node: &str) -> Value {
    poll_every(POLL, READY, || {
        agent_pod_on(c, node)
            .ok()
            .filter(|p| condition(p, "Ready").is_some_and(|r| r["status"] == "True"))
    })
    .unwrap_or_else(|| panic!("no Ready agent pod on {node}"))
}

#[test]
#[ignore = "needs a guest node: cargo xtask cluster up --nodes 2, then --ignored"]
fn each_agents_token_writes_only_its_own_nodes_pods() {
    let Some(c) = require_cluster() else { return };
    let guest = c
        .guests()
        .into_iter()
        .next()
        .expect("a guest node runs (cargo xtask cluster up --nodes 2)");
    let _agent = agent_shared();
    let ns = Namespace::new(c, "t-two-nodes").unwrap();
    let nodes = [NODE_NAME.to_string(), guest.name.clone()];
    for node in &nodes {
        apply(
            c,
            &TestPod::new(&format!("on-{node}"), &ns.name, "Never")
                .container("main", "sleep 3600")
                .node_name(node)
                .manifest(),
        )
        .unwrap();
        wait_pod(c, &ns.name, &format!("on-{node}"), READY, |p| {
            p["status"]["phase"] == "Running"
        })
        .unwrap();
    }
    for writer in &nodes {
        let token = agent_token(c, writer, &agent_on(c, writer));
        for target in &nodes {
            let pod = format!("on-{target}");
            let r = write_status_as(c, &token, &ns.name, &pod);
            if writer == target {
                if let Err(e) = r {
                    panic!("the agent of {writer} was refused writing its own node's pod: {e}");
                }
                let p = get_json(c, &["get", "pod", &pod, "-n", &ns.name]).unwrap();
                assert!(
                    condition(&p, "observer.dev/AdmissionProbe")
                        .is_some_and(|c| c["status"] == "True"),
                    "{pod}: the write is not there"
                );
            } else {
                let message = refused_by_policy(r, writer, &pod);
                eprintln!("{writer} → {pod}: refused ({message})");
            }
        }
    }
}
