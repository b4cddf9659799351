//! The real one-node cluster (observer-cluster) as the suites use it: started once per machine by
//! the first suite that needs it (`cargo xtask cluster up` does the same; `cargo xtask cluster
//! down` stops it), with the agent deployed from `deploy/` once per test process, built from the
//! release binary under test. Waits poll kubectl at [`POLL`] with a deadline.
use std::path::{Path, PathBuf};
use std::sync::{OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
pub use observer_cluster::{Cluster, GUEST_NODE_NAME, NODE_NAME};
use serde_json::Value;

use crate::prereq;
use crate::wait::poll_every;

/// How often a wait asks the API server again.
pub const POLL: Duration = Duration::from_millis(200);
/// The agent's namespace and DaemonSet (deploy/kustomization.yaml).
pub const AGENT_NAMESPACE: &str = "observer-system";
/// The agent's service account, as the API server names its user.
pub const AGENT_USER: &str = "system:serviceaccount:observer-system:observer";
/// Where the overlay has the agent serve (host network, loopback).
pub const AGENT_ADDR: &str = "127.0.0.1:9891";

/// The node the suites' pods run on: the host's (`observer-node`), or a guest node named by
/// `OBSERVER_CLUSTER_NODE` (`observer-node-2`: Debian guest, cgroup v2, containerd 2.x, systemd
/// driver), which the cluster is then started with.
pub fn test_node() -> String {
    std::env::var("OBSERVER_CLUSTER_NODE")
        .ok()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| NODE_NAME.to_string())
}

/// The guest of the test node, when it is one.
pub fn test_guest(c: &Cluster) -> Option<observer_cluster::Guest<'_>> {
    let node = test_node();
    (node != NODE_NAME).then(|| observer_cluster::Guest::new(c, &node))
}

/// Whether the test node is a guest under software emulation, where kubelet starts pods and
/// reports deaths tens of seconds later than on the host: the suites' deadlines (never their
/// assertions) are longer there.
pub fn emulated() -> bool {
    test_node() != NODE_NAME
}

static CLUSTER: OnceLock<Result<Cluster, String>> = OnceLock::new();
/// Tests that restart the agent take it exclusively; the others share it.
static AGENT: RwLock<()> = RwLock::new(());

/// The cluster with the agent deployed and Ready, or None when a prerequisite is truly absent
/// (not root, no Go, no containerd), said once as SKIPPED (a failure under CI=true). A cluster
/// that fails to start fails the test.
pub fn require_cluster() -> Option<&'static Cluster> {
    if !prereq::require_containerd() {
        return None;
    }
    let c = Cluster::of_workspace();
    let built = c.bin("kubelet").exists() && c.bin("etcd").exists();
    if !built && observer_cluster::which("go").is_none() {
        prereq::require(
            "the real-cluster suite",
            &["Go on PATH (to build Kubernetes)".into()],
        );
        return None;
    }
    let binary = match prereq::observer_release_binary() {
        Ok(b) => b,
        Err(e) => {
            prereq::require("the real-cluster suite", &[e]);
            return None;
        }
    };
    let r = CLUSTER.get_or_init(|| start(c, &binary).map_err(|e| format!("{e:#}")));
    match r {
        Ok(c) => Some(c),
        Err(e) => panic!("the test cluster did not start: {e}"),
    }
}

fn start(c: Cluster, binary: &Path) -> Result<Cluster> {
    let node = test_node();
    if node == NODE_NAME {
        c.up()?;
    } else {
        let n: usize = node
            .strip_prefix("observer-node-")
            .and_then(|n| n.parse().ok())
            .with_context(|| format!("OBSERVER_CLUSTER_NODE={node}: not observer-node-<N>"))?;
        c.up_nodes(n)?;
    }
    let archive = c.dir().join("observer-image.tar");
    observer_image::agent::AgentImage::build(binary)?.write_archive(&archive)?;
    c.deploy(&archive)?;
    Ok(c)
}

/// Shared use of the deployed agent (it is not restarted meanwhile).
pub fn agent_shared() -> RwLockReadGuard<'static, ()> {
    AGENT.read().unwrap_or_else(|p| p.into_inner())
}

/// Exclusive use of the deployed agent (restarts, redeploys).
pub fn agent_exclusive() -> RwLockWriteGuard<'static, ()> {
    AGENT.write().unwrap_or_else(|p| p.into_inner())
}

/// `kubectl ... -o json`, parsed.
pub fn get_json(c: &Cluster, args: &[&str]) -> Result<Value> {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    let out = c.kubectl_ok(&all)?;
    serde_json::from_str(&out).with_context(|| format!("kubectl {}: not JSON", args.join(" ")))
}

/// `kubectl apply -f -` of a manifest.
pub fn apply(c: &Cluster, manifest: &str) -> Result<()> {
    use std::io::Write;
    let mut child = c
        .kubectl()
        .args(["apply", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    child
        .stdin
        .take()
        .ok_or_else(|| anyhow!("no stdin"))?
        .write_all(manifest.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "kubectl apply failed: {}\n{manifest}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// A namespace of the test's own, deleted (without waiting) when dropped.
pub struct Namespace<'a> {
    pub name: String,
    cluster: &'a Cluster,
}

impl<'a> Namespace<'a> {
    pub fn new(cluster: &'a Cluster, name: &str) -> Result<Self> {
        // A namespace left by an earlier run is finishing its deletion: wait it out.
        let gone = poll_every(POLL, Duration::from_secs(120), || {
            cluster
                .kubectl_ok(&["get", "namespace", name])
                .is_err()
                .then_some(())
        });
        if gone.is_none() {
            bail!("namespace {name} from an earlier run is still there after 120 s");
        }
        cluster.kubectl_ok(&["create", "namespace", name])?;
        poll_every(POLL, Duration::from_secs(60), || {
            cluster
                .kubectl_ok(&["get", "serviceaccount", "default", "-n", name])
                .ok()
        })
        .ok_or_else(|| anyhow!("no default service account in {name} after 60 s"))?;
        Ok(Self {
            name: name.into(),
            cluster,
        })
    }
}

impl Drop for Namespace<'_> {
    fn drop(&mut self) {
        let _ = self
            .cluster
            .kubectl_ok(&["delete", "namespace", &self.name, "--wait=false"]);
    }
}

/// A host-network busybox pod (the node has no CNI) running `script`, tolerating the node's
/// NotReady, with the test images' pull policy (imported, never pulled).
pub fn busybox_pod(name: &str, namespace: &str, restart_policy: &str, script: &str) -> String {
    TestPod::new(name, namespace, restart_policy)
        .container("main", script)
        .manifest()
}

/// A test pod of busybox containers, as JSON for `kubectl apply`: host network (the node has no
/// CNI), every taint tolerated (the node stays NotReady), images imported (never pulled), a
/// one-second grace period.
#[derive(Clone, Debug)]
pub struct TestPod {
    pub name: String,
    namespace: String,
    restart_policy: String,
    labels: Vec<(String, String)>,
    pod_memory_limit: Option<String>,
    init_containers: Vec<Value>,
    containers: Vec<Value>,
    shared_dir: bool,
    readiness_gates: Vec<String>,
    node_name: Option<String>,
    share_process_namespace: bool,
    host_pid: bool,
    /// More fields of the pod's spec (activeDeadlineSeconds, ...).
    spec_extra: serde_json::Map<String, Value>,
}

/// Where [`TestPod::shared_dir`] mounts its emptyDir in every container.
pub const SHARED_DIR: &str = "/shared";

impl TestPod {
    pub fn new(name: &str, namespace: &str, restart_policy: &str) -> Self {
        Self {
            name: name.into(),
            namespace: namespace.into(),
            restart_policy: restart_policy.into(),
            labels: Vec::new(),
            pod_memory_limit: None,
            init_containers: Vec::new(),
            containers: Vec::new(),
            shared_dir: false,
            readiness_gates: Vec::new(),
            node_name: None,
            share_process_namespace: false,
            host_pid: false,
            spec_extra: serde_json::Map::new(),
        }
    }

    /// Changes the container added last (its image, command, probes, termination message
    /// policy, environment): shapes the builders above do not make.
    pub fn edit_last(mut self, edit: impl FnOnce(&mut Value)) -> Self {
        if let Some(c) = self.containers.last_mut() {
            edit(c);
        }
        self
    }

    /// A field of the pod's spec as given (`activeDeadlineSeconds`: 5).
    pub fn spec_field(mut self, key: &str, value: Value) -> Self {
        self.spec_extra.insert(key.into(), value);
        self
    }

    fn busybox(name: &str, script: &str, memory_limit: Option<&str>) -> Value {
        let mut c = serde_json::json!({
            "name": name,
            "image": observer_image::busybox::BUSYBOX_IMAGE,
            "imagePullPolicy": "Never",
            "command": ["/bin/sh", "-c", script],
        });
        if let Some(m) = memory_limit {
            c["resources"] = serde_json::json!({"limits": {"memory": m}});
        }
        c
    }

    pub fn container(mut self, name: &str, script: &str) -> Self {
        self.containers.push(Self::busybox(name, script, None));
        self
    }

    /// A container with a memory limit (`32Mi`).
    pub fn limited(mut self, name: &str, script: &str, memory: &str) -> Self {
        self.containers
            .push(Self::busybox(name, script, Some(memory)));
        self
    }

    pub fn init_container(mut self, name: &str, script: &str, memory: Option<&str>) -> Self {
        self.init_containers
            .push(Self::busybox(name, script, memory));
        self
    }

    /// A pod-level memory limit (`spec.resources`, Kubernetes 1.34's PodLevelResources).
    /// The pod's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn pod_memory_limit(mut self, memory: &str) -> Self {
        self.pod_memory_limit = Some(memory.into());
        self
    }

    /// A restart rule of `action` on the exit codes `codes` (In) for the regular container added
    /// last, with its own `restartPolicy` (Kubernetes 1.35+, KEP-5307).
    pub fn restart_rule(self, policy: &str, action: &str, codes: &[i32]) -> Self {
        let rule = Self::rule(action, codes);
        let policy = policy.to_string();
        self.edit_last(move |c| {
            c["restartPolicy"] = policy.into();
            c["restartPolicyRules"] = rule;
        })
    }

    /// The same on the sidecar added last (its policy stays Always).
    pub fn sidecar_rule(mut self, action: &str, codes: &[i32]) -> Self {
        if let Some(c) = self.init_containers.last_mut() {
            c["restartPolicyRules"] = Self::rule(action, codes);
        }
        self
    }

    fn rule(action: &str, codes: &[i32]) -> Value {
        serde_json::json!([{"action": action, "exitCodes": {"operator": "In", "values": codes}}])
    }

    /// An emptyDir at [`SHARED_DIR`] in every container (for a container to wait on another, or
    /// to remember a first run across restarts).
    pub fn shared_dir(mut self) -> Self {
        self.shared_dir = true;
        self
    }

    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.labels.push((key.into(), value.into()));
        self
    }

    pub fn readiness_gate(mut self, condition_type: &str) -> Self {
        self.readiness_gates.push(condition_type.into());
        self
    }

    /// A native sidecar: an init container that restarts always and runs beside the others.
    pub fn sidecar(mut self, name: &str, script: &str) -> Self {
        let mut c = Self::busybox(name, script, None);
        c["restartPolicy"] = Value::from("Always");
        self.init_containers.push(c);
        self
    }

    /// One pid namespace for the pod's containers.
    pub fn share_process_namespace(mut self) -> Self {
        self.share_process_namespace = true;
        self
    }

    /// The node's pid namespace.
    pub fn host_pid(mut self) -> Self {
        self.host_pid = true;
        self
    }

    /// Bound to a node by name, past the scheduler.
    pub fn node_name(mut self, node: &str) -> Self {
        self.node_name = Some(node.into());
        self
    }

    pub fn manifest(&self) -> String {
        let mount = |mut c: Value| {
            if self.shared_dir {
                c["volumeMounts"] =
                    serde_json::json!([{"name": "shared", "mountPath": SHARED_DIR}]);
            }
            c
        };
        let mut spec = serde_json::json!({
            "hostNetwork": true,
            "restartPolicy": self.restart_policy,
            "terminationGracePeriodSeconds": 1,
            "tolerations": [{"operator": "Exists"}],
            "containers": self.containers.iter().cloned().map(mount).collect::<Vec<_>>(),
        });
        if !self.init_containers.is_empty() {
            spec["initContainers"] = self.init_containers.iter().cloned().map(mount).collect();
        }
        if let Some(m) = &self.pod_memory_limit {
            spec["resources"] = serde_json::json!({"limits": {"memory": m}});
        }
        if let Some(n) = &self.node_name {
            spec["nodeName"] = Value::from(n.as_str());
        } else {
            // With guest nodes in the cluster, the scheduler must place the pod on the test's.
            spec["nodeSelector"] = serde_json::json!({"kubernetes.io/hostname": test_node()});
        }
        if self.share_process_namespace {
            spec["shareProcessNamespace"] = Value::from(true);
        }
        if self.host_pid {
            spec["hostPID"] = Value::from(true);
        }
        for (k, v) in &self.spec_extra {
            spec[k] = v.clone();
        }
        if self.shared_dir {
            spec["volumes"] = serde_json::json!([{"name": "shared", "emptyDir": {}}]);
        }
        if !self.readiness_gates.is_empty() {
            spec["readinessGates"] = self
                .readiness_gates
                .iter()
                .map(|t| serde_json::json!({"conditionType": t}))
                .collect();
        }
        let labels: serde_json::Map<String, Value> = self
            .labels
            .iter()
            .map(|(k, v)| (k.clone(), Value::from(v.as_str())))
            .collect();
        serde_json::json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": self.name, "namespace": self.namespace, "labels": labels},
            "spec": spec,
        })
        .to_string()
    }
}

/// Waits until the pod's JSON satisfies `pred`; the error shows the last JSON seen.
pub fn wait_pod(
    c: &Cluster,
    namespace: &str,
    name: &str,
    timeout: Duration,
    mut pred: impl FnMut(&Value) -> bool,
) -> Result<Value> {
    let mut last = Value::Null;
    poll_every(POLL, timeout, || {
        let v = get_json(c, &["get", "pod", name, "-n", namespace]).ok()?;
        let hit = pred(&v);
        last = v;
        hit.then(|| last.clone())
    })
    .ok_or_else(|| {
        anyhow!(
            "pod {namespace}/{name}: condition not met within {timeout:?}; last status: {}",
            serde_json::to_string_pretty(&last["status"]).unwrap_or_default()
        )
    })
}

/// The pod's condition of `type`, if present.
pub fn condition<'v>(pod: &'v Value, kind: &str) -> Option<&'v Value> {
    pod["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
}

/// The agent's pod (the DaemonSet's one pod on the test's node).
pub fn agent_pod(c: &Cluster) -> Result<Value> {
    agent_pod_on(c, &test_node())
}

/// The DaemonSet's one live pod on `node`.
pub fn agent_pod_on(c: &Cluster, node: &str) -> Result<Value> {
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
    )?;
    let items = list["items"].as_array().cloned().unwrap_or_default();
    let live: Vec<Value> = items
        .into_iter()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .filter(|p| p["spec"]["nodeName"] == node)
        .collect();
    match live.as_slice() {
        [one] => Ok(one.clone()),
        other => bail!(
            "expected one live agent pod on {node}, found {}",
            other.len()
        ),
    }
}

/// The scrapers' account: `prometheus` in [`SCRAPER_NAMESPACE`], bound to deploy/'s ClusterRole
/// observer-metrics-reader, as an operator binds their Prometheus's (deploy/README.md).
pub const SCRAPER_NAMESPACE: &str = "observer-scrapers";

static SCRAPER_TOKEN: OnceLock<Result<String, String>> = OnceLock::new();

/// A token of the scrapers' account (made once per test process, valid for an hour).
pub fn scraper_token(c: &Cluster) -> Result<String> {
    SCRAPER_TOKEN
        .get_or_init(|| make_scraper_token(c).map_err(|e| format!("{e:#}")))
        .clone()
        .map_err(|e| anyhow!("the scrapers' token: {e}"))
}

fn make_scraper_token(c: &Cluster) -> Result<String> {
    apply(
        c,
        &format!(
            r#"apiVersion: v1
kind: Namespace
metadata:
  name: {SCRAPER_NAMESPACE}
---
apiVersion: v1
kind: ServiceAccount
metadata:
  name: prometheus
  namespace: {SCRAPER_NAMESPACE}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: observer-tests-prometheus
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: observer-metrics-reader
subjects:
  - kind: ServiceAccount
    name: prometheus
    namespace: {SCRAPER_NAMESPACE}
"#
        ),
    )?;
    Ok(c.kubectl_ok(&[
        "create",
        "token",
        "prometheus",
        "-n",
        SCRAPER_NAMESPACE,
        "--duration=1h",
    ])?
    .trim()
    .to_string())
}

/// The `/metrics` text of the agent on the test's node, asked as the scrapers' account: on the
/// host at [`AGENT_ADDR`], in a guest the same address on the guest's loopback, asked by a shell
/// there through the guest agent (nothing is forwarded into the guest).
pub fn agent_metrics(c: &Cluster) -> Result<String> {
    let token = scraper_token(c)?;
    let Some(guest) = test_guest(c) else {
        let addr = AGENT_ADDR.parse()?;
        let (code, body) = crate::endpoint::http_get_as(addr, "/metrics", Some(&token))
            .ok_or_else(|| anyhow!("the agent at {AGENT_ADDR} does not answer"))?;
        if code != 200 {
            bail!("the agent's /metrics answered {code}");
        }
        return Ok(body);
    };
    let (host, port) = AGENT_ADDR
        .rsplit_once(':')
        .ok_or_else(|| anyhow!("{AGENT_ADDR}: no port"))?;
    let script = format!(
        r#"exec 3<>/dev/tcp/{host}/{port} && printf 'GET /metrics HTTP/1.0\r\nHost: agent\r\nAuthorization: Bearer {token}\r\n\r\n' >&3 && cat <&3"#
    );
    let r = guest.exec("/bin/bash", &["-c", &script], Duration::from_secs(60))?;
    let (head, body) = r.stdout.split_once("\r\n\r\n").ok_or_else(|| {
        anyhow!(
            "the agent in {} answered {:?}{}",
            guest.name,
            r.stdout,
            r.stderr
        )
    })?;
    if head.split_whitespace().nth(1) != Some("200") {
        bail!("the agent's /metrics in {} answered {head}", guest.name);
    }
    Ok(body.to_string())
}

/// One sample of [`agent_metrics`] (None: not exported, or the agent did not answer).
pub fn agent_metric(c: &Cluster, name: &str) -> Option<f64> {
    crate::endpoint::sample(&agent_metrics(c).ok()?, name)
}

/// The host pid of a running container, from its id in the pod's status
/// (`containerd://<id>`): the process in its cgroup whose pid namespace is the container's own
/// or, for the agent (hostPID), the first one listed.
pub fn container_pid(container_id: &str) -> Result<u32> {
    let id = container_id
        .rsplit_once("://")
        .map_or(container_id, |(_, id)| id);
    for entry in std::fs::read_dir("/proc")?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cg) = std::fs::read_to_string(format!("/proc/{pid}/cgroup")) else {
            continue;
        };
        if cg.lines().any(|l| l.ends_with(id)) {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            // runc's helpers pass through the cgroup before the entrypoint: skip them.
            if !cmdline.starts_with(b"runc") {
                return Ok(pid);
            }
        }
    }
    bail!("no process of container {id} found in /proc")
}

/// The minor release of the kubelet on the node the tests run on ([`test_node`]).
pub fn test_kubelet_minor(c: &Cluster) -> u32 {
    let v = c.versions();
    if test_node() == NODE_NAME {
        v.host_kubelet.minor()
    } else {
        v.guest_kubelet.minor()
    }
}

/// A running container's init, where the test can signal it: a pid of this machine, or of the
/// guest whose node runs the container.
pub enum ContainerInit<'c> {
    Host(u32),
    Guest(observer_cluster::Guest<'c>, u32),
}

/// The init of a running container on whichever node the test runs (`containerd://<id>` from
/// the pod's status): on the host by [`container_pid`], in a guest by a shell there, through its
/// guest agent, that finds it by its cgroup.
pub fn container_init<'c>(c: &'c Cluster, container_id: &str) -> Result<ContainerInit<'c>> {
    let id = container_id
        .rsplit_once("://")
        .map_or(container_id, |(_, id)| id);
    let Some(guest) = test_guest(c) else {
        return Ok(ContainerInit::Host(container_pid(container_id)?));
    };
    // The container's processes are in its scope (cri-containerd-<id>.scope); its init is the
    // one whose parent is outside it (the shim).
    let script = format!(
        r#"for p in $(cat /sys/fs/cgroup/kubepods.slice/*/*/cri-containerd-{id}.scope/cgroup.procs /sys/fs/cgroup/kubepods.slice/*/cri-containerd-{id}.scope/cgroup.procs 2>/dev/null); do
  pp=$(awk '{{print $4}}' /proc/$p/stat)
  grep -q 'cri-containerd-{id}.scope' /proc/$pp/cgroup || {{ echo $p; exit 0; }}
done
exit 1"#
    );
    let r = guest.exec("/bin/sh", &["-c", &script], Duration::from_secs(60))?;
    let pid = r.stdout.trim().parse().ok().filter(|_| r.code == 0);
    let Some(pid) = pid else {
        bail!(
            "no init of container {id} found in {}: {}",
            guest.name,
            r.stderr
        );
    };
    Ok(ContainerInit::Guest(guest, pid))
}

impl ContainerInit<'_> {
    /// SIGKILL, and the moment it was sent: on the host just before kill(2); in a guest just
    /// before the guest agent is asked to run `kill -9` there (its shell's own start comes
    /// between, a few milliseconds under emulation). Returns once the signal was sent.
    pub fn kill(&self) -> Result<std::time::Instant> {
        self.signal(nix::sys::signal::Signal::SIGKILL)
    }

    /// `sig` to the init, and the moment it was sent (as [`ContainerInit::kill`]).
    pub fn signal(&self, sig: nix::sys::signal::Signal) -> Result<std::time::Instant> {
        match self {
            ContainerInit::Host(pid) => {
                let sent = std::time::Instant::now();
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(*pid as i32), sig)?;
                Ok(sent)
            }
            ContainerInit::Guest(guest, pid) => {
                let mut agent = guest.agent()?;
                let sent = std::time::Instant::now();
                let number = sig as i32;
                let r = agent.exec(
                    "/bin/sh",
                    &["-c", &format!("kill -{number} {pid}")],
                    Duration::from_secs(60),
                )?;
                if r.code != 0 {
                    bail!("kill -{number} {pid} in {}: {}", guest.name, r.stderr);
                }
                Ok(sent)
            }
        }
    }
}

/// SIGKILL to a running container's init, on whichever node the test runs ([`container_init`]).
pub fn kill_container(c: &Cluster, container_id: &str) -> Result<()> {
    container_init(c, container_id)?.kill().map(|_| ())
}

/// The kubelet directory of a pod's volumes (for its projected service-account token).
pub fn pod_volumes(c: &Cluster, uid: &str) -> PathBuf {
    c.dir().join("state/kubelet/pods").join(uid).join("volumes")
}

/// The mode deploy/config.yaml ships.
const DEFAULT_MODE: &str = "conditions";

/// Sets the deployed agents' `--status-mode` (None: deploy/'s) where deploy/ keeps it: the
/// ConfigMap `observer`, which the DaemonSet's OBSERVER_STATUS_MODE reads, and the mode written
/// into the admission policy observer-status-mode, as `kubectl apply -k` of a changed config.yaml
/// writes it; then restarts the agents (an env from a ConfigMap is read at container start) and
/// waits for the rollout and a Ready agent. A no-op when unchanged.
pub fn set_agent_mode(c: &Cluster, mode: Option<&str>) -> Result<()> {
    let mode = mode.unwrap_or(DEFAULT_MODE);
    let cm = get_json(c, &["-n", AGENT_NAMESPACE, "get", "configmap", "observer"])?;
    let policy_mode = policy_mode(c)?;
    if cm["data"]["statusMode"].as_str() == Some(mode) && policy_mode.1 == mode {
        return Ok(());
    }
    let patch = serde_json::json!({"data": {"statusMode": mode}}).to_string();
    c.kubectl_ok(&[
        "-n",
        AGENT_NAMESPACE,
        "patch",
        "configmap",
        "observer",
        "--type=merge",
        "-p",
        &patch,
    ])?;
    let patch = serde_json::json!([{"op": "replace",
        "path": format!("/spec/variables/{}/expression", policy_mode.0),
        "value": format!("'{mode}'")}])
    .to_string();
    c.kubectl_ok(&[
        "patch",
        "validatingadmissionpolicy",
        "observer-status-mode",
        "--type=json",
        "-p",
        &patch,
    ])?;
    restart_agents(c, &format!("statusMode {mode}"))
}

/// The admission policy's mode variable: its index and the mode written in it.
fn policy_mode(c: &Cluster) -> Result<(usize, String)> {
    let p = get_json(
        c,
        &["get", "validatingadmissionpolicy", "observer-status-mode"],
    )?;
    let vars = p["spec"]["variables"]
        .as_array()
        .context("the policy's variables")?;
    let i = vars
        .iter()
        .position(|v| v["name"] == "mode")
        .context("the policy's mode variable")?;
    let expr = vars[i]["expression"].as_str().unwrap_or_default();
    Ok((i, expr.split('\'').nth(1).unwrap_or_default().to_string()))
}

/// `kubectl rollout restart` of the agents' DaemonSet, waited for until the agent is Ready
/// (`why`: what the error names).
pub fn restart_agents(c: &Cluster, why: &str) -> Result<()> {
    c.kubectl_ok(&[
        "-n",
        AGENT_NAMESPACE,
        "rollout",
        "restart",
        "daemonset/observer",
    ])?;
    wait_agent_ready(c, why)
}

/// The rollout done and the agent Ready (after `what`).
fn wait_agent_ready(c: &Cluster, what: &str) -> Result<()> {
    c.wait_rollout()?;
    poll_every(POLL, Duration::from_secs(120), || {
        agent_pod(c).ok().filter(|p| {
            p["status"]["conditions"].as_array().is_some_and(|cs| {
                cs.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            })
        })
    })
    .map(|_| ())
    .ok_or_else(|| anyhow!("the agent is not Ready after switching to {what}"))
}

/// Sets the deployed agent's environment variable `name` (None: removed, the manifest's or the
/// binary's default) and waits for the rollout and a Ready agent. A no-op when unchanged.
pub fn set_agent_env(c: &Cluster, name: &str, value: Option<&str>) -> Result<()> {
    let env = match value {
        Some(v) => format!("{name}={v}"),
        None => format!("{name}-"),
    };
    // `kubectl set env` makes a new revision, and so a rollout, even when nothing changes (a
    // rollout takes minutes on an emulated guest node): asked only for a change.
    let ds = get_json(c, &["-n", AGENT_NAMESPACE, "get", "daemonset", "observer"])?;
    let current = ds["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .and_then(|env| env.iter().find(|e| e["name"] == name))
        .map(|e| e["value"].as_str().unwrap_or_default().to_string());
    if current.as_deref() != value {
        c.kubectl_ok(&[
            "-n",
            AGENT_NAMESPACE,
            "set",
            "env",
            "daemonset/observer",
            &env,
        ])?;
    }
    wait_agent_ready(c, &env)
}

/// `kubectl get <what> -w -o json` in a thread: every object as it arrives, with the moment it
/// arrived (what a client of the API sees, and when). Stopped when dropped.
pub struct Watch {
    child: std::process::Child,
    seen: std::sync::Arc<std::sync::Mutex<Vec<(std::time::Instant, Value)>>>,
}

impl Watch {
    pub fn start(c: &Cluster, args: &[&str]) -> Result<Self> {
        let mut child = c
            .kubectl()
            .args(["get", "-w", "-o", "json"])
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()?;
        let out = child.stdout.take().ok_or_else(|| anyhow!("no stdout"))?;
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = seen.clone();
        std::thread::spawn(move || {
            let reader = std::io::BufReader::new(out);
            for v in serde_json::Deserializer::from_reader(reader).into_iter::<Value>() {
                let Ok(v) = v else { break };
                let now = std::time::Instant::now();
                sink.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((now, v));
            }
        });
        Ok(Self { child, seen })
    }

    /// Everything seen so far, in arrival order.
    pub fn seen(&self) -> Vec<(std::time::Instant, Value)> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The first object seen at or after `since` that satisfies `pred`, and when it came.
    pub fn first_since(
        &self,
        since: std::time::Instant,
        mut pred: impl FnMut(&Value) -> bool,
    ) -> Option<(std::time::Instant, Value)> {
        let seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.iter()
            .filter(|(t, _)| *t >= since)
            .find(|(_, v)| pred(v))
            .cloned()
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The API server's audit log, every file of it (one JSON event per line), the events received
/// at or after `since`, parsed.
pub fn audit_events(c: &Cluster, since: std::time::SystemTime) -> Result<Vec<Value>> {
    let mut text = String::new();
    for f in c.audit_logs() {
        text.push_str(&std::fs::read_to_string(&f).with_context(|| format!("{}", f.display()))?);
    }
    let since = time::OffsetDateTime::from(since);
    Ok(text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| {
            e["requestReceivedTimestamp"].as_str().is_some_and(|t| {
                time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339)
                    .is_ok_and(|t| t >= since)
            })
        })
        .collect())
}

/// The audit log's events about `namespace`'s pods' status writes that completed, received at or
/// after `since` (a namespace of the same name from an earlier run is in the log too).
pub fn status_writes(
    c: &Cluster,
    namespace: &str,
    since: std::time::SystemTime,
) -> Result<Vec<Value>> {
    Ok(audit_events(c, since)?
        .into_iter()
        .filter(|e| {
            e["stage"] == "ResponseComplete"
                && e["objectRef"]["resource"] == "pods"
                && e["objectRef"]["subresource"] == "status"
                && e["objectRef"]["namespace"] == namespace
        })
        .collect())
}

/// A pod-level OOM whose victim is a sibling of the allocation: the holder's init (awk) keeps
/// 70 MiB, then the grower reads 100 MiB into tail. Past the pod's 128 MiB the holder has the
/// most memory (kubelet gives every container of the pod the same oom_score_adj, so size
/// decides), and the OOM killer takes it for the grower's allocation; with the holder gone, the
/// grower fits and runs `then`.
pub fn pod_level_oom(name: &str, namespace: &str, then: &str) -> TestPod {
    let held = format!("{SHARED_DIR}/held");
    TestPod::new(name, namespace, "Never")
        .pod_memory_limit("128Mi")
        .shared_dir()
        .container(
            "holder",
            &format!("exec awk 'BEGIN {{ s = sprintf(\"%70000000s\", \"\"); system(\"touch {held}; sleep 3600\") }}'"),
        )
        .container(
            "grower",
            &format!("while [ ! -e {held} ]; do sleep 0.1; done; head -c 100m /dev/zero | tail > /dev/null; {then}"),
        )
}
