//! The components' configuration files and kubelet's cgroup root.
use std::fs;
use std::path::{Path, PathBuf};

use crate::{Cluster, Error, Result, APISERVER_PORT, CGROUP_ROOT, RUN_DIR};

/// Paths of the files `write` produced.
pub(crate) struct Files {
    pub audit_policy: PathBuf,
    pub controller_manager: PathBuf,
    pub scheduler: PathBuf,
    pub kubelet: PathBuf,
    pub kubelet_kubeconfig: PathBuf,
    pub containerd: PathBuf,
}

pub(crate) fn write(c: &Cluster) -> Result<Files> {
    let conf = c.dir().join("config");
    fs::create_dir_all(&conf).map_err(Error::io(&conf))?;
    let put = |name: &str, text: String| -> Result<PathBuf> {
        let p = conf.join(name);
        fs::write(&p, text).map_err(Error::io(&p))?;
        Ok(p)
    };
    let pki = c.pki();
    fs::write(c.kubeconfig(), kubeconfig(&pki, "admin")).map_err(Error::io(c.kubeconfig()))?;
    Ok(Files {
        audit_policy: put("audit-policy.yaml", AUDIT_POLICY.into())?,
        controller_manager: put(
            "controller-manager.kubeconfig",
            kubeconfig(&pki, "controller-manager"),
        )?,
        scheduler: put("scheduler.kubeconfig", kubeconfig(&pki, "scheduler"))?,
        kubelet_kubeconfig: put("kubelet.kubeconfig", kubeconfig(&pki, "kubelet"))?,
        kubelet: put("kubelet.yaml", kubelet_config(c))?,
        containerd: put("containerd.toml", containerd_config(c))?,
    })
}

/// Who wrote each pod status and Event, and what the nodes' kubelets and the agent ask of the
/// API server: what the suites count requests by writer from. Status writes at the Request level
/// (their bodies: which condition types each writer touched), Events at the Metadata level (user,
/// verb, object, code); every other request of a kubelet (group `system:nodes`) or of the agent's
/// service account at the Metadata level, lists of pods at the Response level (a list's size is
/// what a relist costs). Watches are logged when they start and when they end.
const AUDIT_POLICY: &str = r#"apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Request
    verbs: ["patch", "update", "create"]
    resources:
      - group: ""
        resources: ["pods/status"]
  - level: Metadata
    verbs: ["patch", "update", "create"]
    resources:
      - group: "events.k8s.io"
        resources: ["events"]
      - group: ""
        resources: ["events"]
  - level: RequestResponse
    verbs: ["list"]
    userGroups: ["system:nodes", "system:serviceaccounts:observer-system"]
    resources:
      - group: ""
        resources: ["pods"]
  - level: Metadata
    userGroups: ["system:nodes", "system:serviceaccounts:observer-system"]
  - level: None
"#;

/// A kubeconfig for the client certificate `<pki>/<user>.{crt,key}` of the cluster's CA
/// (`<pki>/ca.crt`), the API server at 127.0.0.1 (a guest's relays there too).
pub(crate) fn kubeconfig(pki: &Path, user: &str) -> String {
    kubeconfig_of(
        user,
        "",
        &pki.join("ca.crt").display().to_string(),
        &pki.join(format!("{user}.crt")).display().to_string(),
        &pki.join(format!("{user}.key")).display().to_string(),
    )
}

/// The same with the CA, certificate and key inline (`-data`, base64), for a machine that has
/// not the files.
pub(crate) fn kubeconfig_inline(user: &str, ca: &[u8], crt: &[u8], key: &[u8]) -> String {
    use crate::guest::qga::base64_encode;
    kubeconfig_of(
        user,
        "-data",
        &base64_encode(ca),
        &base64_encode(crt),
        &base64_encode(key),
    )
}

/// `suffix`: "" (the values are paths) or "-data" (the values are the contents, base64).
fn kubeconfig_of(user: &str, suffix: &str, ca: &str, crt: &str, key: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Config
clusters:
  - name: observer
    cluster:
      server: https://127.0.0.1:{APISERVER_PORT}
      certificate-authority{suffix}: {ca}
users:
  - name: {user}
    user:
      client-certificate{suffix}: {crt}
      client-key{suffix}: {key}
contexts:
  - name: observer
    context:
      cluster: observer
      user: {user}
current-context: observer
"#
    )
}

fn kubelet_config(c: &Cluster) -> String {
    let mut node = format!(
        r#"# What containerd's runc options say (SystemdCgroup = false); containerd 1.7 does not
# answer the RuntimeConfig call that would tell kubelet.
cgroupDriver: cgroupfs
cgroupRoot: /{CGROUP_ROOT}
# Hybrid hosts are cgroup v1 to kubelet (1.35 and newer refuse it unless told).
failCgroupV1: false
podLogsDir: {logs}
# Room for a large node: 250 pods and the agent's (kubelet's default is 110).
maxPods: 260
"#,
        logs = c.pod_logs().display(),
    );
    // Feature gates a bench set ([`Cluster::restart_kubelet_with_gates`]), one `name: bool` a line.
    let gates = fs::read_to_string(c.kubelet_gates_file()).unwrap_or_default();
    if !gates.trim().is_empty() {
        node.push_str("featureGates:\n");
        for l in gates.lines() {
            node.push_str(&format!("  {l}\n"));
        }
    }
    kubelet_yaml(
        &c.pki(),
        &format!("unix://{}", c.containerd_socket().display()),
        &node,
    )
}

/// kubelet's configuration on every node of the test cluster: serving on the node's loopback
/// only, client certificates of the cluster's CA (`<pki>/ca.crt`, its serving pair
/// `<pki>/kubelet-serving.{crt,key}`), images never collected, and `node`'s own lines (the cgroup
/// driver and root, where pod logs go).
pub(crate) fn kubelet_yaml(pki: &Path, runtime_endpoint: &str, node: &str) -> String {
    format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# Loopback only: the API server never dials kubelet in the tests (no logs, exec or proxy).
address: 127.0.0.1
healthzBindAddress: 127.0.0.1
readOnlyPort: 0
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: {pki}/ca.crt
authorization:
  mode: Webhook
tlsCertFile: {pki}/kubelet-serving.crt
tlsPrivateKeyFile: {pki}/kubelet-serving.key
containerRuntimeEndpoint: {runtime_endpoint}
{node}failSwapOn: false
clusterDomain: cluster.local
# The images are imported, never pulled: none may be collected, and no pod evicted for a disk
# the host's other tests fill.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: "100Mi"
  nodefs.available: "1%"
  nodefs.inodesFree: "1%"
  imagefs.available: "1%"
serializeImagePulls: false
"#,
        pki = pki.display(),
    )
}

fn containerd_config(c: &Cluster) -> String {
    let state = c.state();
    let run = Path::new(RUN_DIR);
    containerd_toml(&ContainerdPaths {
        root: &state.join("containerd"),
        state: &run.join("containerd-state"),
        socket: &c.containerd_socket(),
        opt: &state.join("containerd-opt"),
        runc_root: &run.join("runc"),
        cni: &state.join("cni"),
        snapshotter: "overlayfs",
    })
}

/// Where a containerd keeps its things, for [`containerd_toml`].
pub struct ContainerdPaths<'a> {
    pub root: &'a Path,
    pub state: &'a Path,
    pub socket: &'a Path,
    pub opt: &'a Path,
    /// runc's `--root`: private, so a crashed run leaves nothing in /run/containerd/runc.
    pub runc_root: &'a Path,
    /// `bin/` and `conf/` for CNI, which stay empty: host-network pods only.
    pub cni: &'a Path,
    pub snapshotter: &'a str,
}

/// A containerd configuration (version 2: what containerd 1.6 and 1.7 read, and 2.x migrates)
/// for CRI with the locally built pause image, shared by the test cluster's host node
/// (containerd 1.7) and the host suites' private containerds (Debian's 1.6).
pub fn containerd_toml(p: &ContainerdPaths<'_>) -> String {
    // restrict_oom_score_adj: without CAP_SYS_RESOURCE (a nested sandbox) runc cannot lower a
    // sandbox's oom_score_adj and every RunPodSandbox fails. stream_server_port 0: several
    // containerds may run at once.
    format!(
        r#"version = 2
root = "{root}"
state = "{state}"

[grpc]
  address = "{socket}"

[ttrpc]
  address = "{socket}.ttrpc"

[debug]
  address = ""

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "{opt}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "{snap}"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{runc}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{cni}/bin"
    conf_dir = "{cni}/conf"
"#,
        root = p.root.display(),
        state = p.state.display(),
        socket = p.socket.display(),
        opt = p.opt.display(),
        runc = p.runc_root.display(),
        cni = p.cni.display(),
        snap = p.snapshotter,
        pause = observer_image::busybox::PAUSE_IMAGE,
    )
}

/// kubelet refuses a `cgroupRoot` that does not exist in every hierarchy it checks (the named
/// name=systemd one included).
pub(crate) fn make_cgroup_root() -> Result<()> {
    for h in crate::host::cgroup_mounts() {
        let d = h.join(CGROUP_ROOT);
        fs::create_dir_all(&d).map_err(Error::io(&d))?;
    }
    Ok(())
}

/// The last `n` lines of a log, for an error.
pub(crate) fn tail(path: &Path, n: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
