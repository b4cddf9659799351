//! Two agents, one per node (the host's and a guest's: `cargo xtask cluster up --nodes 2`), each
//! with its own real pod-bound token: deploy/'s ValidatingAdmissionPolicy refuses each writing a
//! status of a pod bound to the other's node and accepts its own node's. Ignored in the default
//! suite (the host node's alone): run with `--ignored` once a guest node runs.
use std::time::Duration;

use observer_tests::cluster::{
    agent_shared, apply, condition, get_json, require_cluster, wait_pod, Cluster, Namespace,
    TestPod, AGENT_NAMESPACE, NODE_NAME, POLL,
};
use observer_tests::wait::poll_every;
use serde_json::Value;

const READY: Duration = Duration::from_secs(300);

/// The live agent pod on `node`, once Ready.
fn agent_on(c: &Cluster, node: &str) -> Value {
    poll_every(POLL, READY, || {
        let list = get_json(
            c,
            &[
                "get",
                "pods",
                "-n",
                AGENT_NAMESPACE,
                "-l",
                "app.kubernetes.io/name=observer",
            ],
        )
        .ok()?;
        list["items"].as_array()?.iter().find_map(|p| {
            (p["spec"]["nodeName"] == node
                && p["metadata"]["deletionTimestamp"].is_null()
                && condition(p, "Ready").is_some_and(|r| r["status"] == "True"))
            .then(|| p.clone())
        })
    })
    .unwrap_or_else(|| panic!("no Ready agent pod on {node}"))
}

/// The token kubelet projected into the agent's pod, read on the node that holds it.
fn token(c: &Cluster, node: &str, pod: &Value) -> String {
    let uid = pod["metadata"]["uid"].as_str().unwrap();
    let rel = format!("pods/{uid}/volumes/kubernetes.io~projected");
    if node == NODE_NAME {
        let dir = c.dir().join("state/kubelet").join(&rel);
        let vol = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .flatten()
            .find(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with("kube-api-access-")
            })
            .expect("the agent's kube-api-access volume");
        return std::fs::read_to_string(vol.path().join("token"))
            .unwrap()
            .trim()
            .to_string();
    }
    let g = observer_cluster::Guest::new(c, node);
    let r = g
        .exec(
            "/bin/sh",
            &[
                "-c",
                &format!("cat /var/lib/kubelet/{rel}/kube-api-access-*/token"),
            ],
            Duration::from_secs(60),
        )
        .unwrap();
    assert_eq!(r.code, 0, "reading the token on {node}: {}", r.stderr);
    r.stdout.trim().to_string()
}

/// A status write with `token`, as the agent makes it (kube's patch_status, a strategic merge
/// patch of one condition of its own).
fn write_as(c: &Cluster, token: &str, ns: &str, pod: &str) -> Result<(), kube::Error> {
    let kubeconfig = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:{}\n    certificate-authority: {}\nusers:\n- name: agent\n  user:\n    token: {token}\ncontexts:\n- name: c\n  context: {{cluster: c, user: agent}}\ncurrent-context: c\n",
        observer_cluster::APISERVER_PORT,
        c.dir().join("pki/ca.crt").display(),
    );
    let patch: Value = serde_json::from_str(
        r#"{"status":{"conditions":[{"type":"observer.dev/AdmissionProbe","status":"True"}]}}"#,
    )
    .unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let kc = kube::config::Kubeconfig::from_yaml(&kubeconfig).unwrap();
        let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .unwrap();
        let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
            kube::Api::namespaced(kube::Client::try_from(config).unwrap(), ns);
        pods.patch_status(
            pod,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Strategic(patch),
        )
        .await
        .map(|_| ())
    })
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
        let token = token(c, writer, &agent_on(c, writer));
        for target in &nodes {
            let pod = format!("on-{target}");
            let r = write_as(c, &token, &ns.name, &pod);
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
                match r {
                    Ok(()) => panic!("the agent of {writer} wrote the status of {pod}"),
                    Err(kube::Error::Api(status)) => {
                        assert_eq!(status.code, 403, "{status:?}");
                        assert!(
                            status.message.contains("observer-own-node")
                                && status.message.contains(&format!(
                                    "the observer agent of node {writer} may only change pods bound to that node"
                                )),
                            "refused, but not by the admission policy: {status:?}"
                        );
                        eprintln!("{writer} → {pod}: refused ({})", status.message);
                    }
                    Err(other) => panic!("the write failed, not refused: {other}"),
                }
            }
        }
    }
}
