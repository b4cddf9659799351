//! The components' configuration files, and the host state `down` has to clear (mounts under
//! the state directories, the pods' cgroups).
use std::fs;
use std::path::{Path, PathBuf};

use std::os::unix::ffi::OsStringExt;

use crate::{Cluster, Error, Result, APISERVER_PORT, CGROUP_ROOT, RUN_DIR};

/// Paths of the files `write` produced.
pub struct Files {
    pub audit_policy: PathBuf,
    pub controller_manager: PathBuf,
    pub scheduler: PathBuf,
    pub kubelet: PathBuf,
    pub kubelet_kubeconfig: PathBuf,
    pub containerd: PathBuf,
}

pub fn write(c: &Cluster) -> Result<Files> {
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

/// Who wrote each pod status and Event, at the Metadata level (user, verb, object, code):
/// what the suites count requests by writer from.
const AUDIT_POLICY: &str = r#"apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Metadata
    verbs: ["patch", "update", "create"]
    resources:
      - group: ""
        resources: ["pods/status"]
      - group: "events.k8s.io"
        resources: ["events"]
      - group: ""
        resources: ["events"]
  - level: None
"#;

/// A kubeconfig for the client certificate `<user>.crt` of the cluster's CA.
fn kubeconfig(pki: &Path, user: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Config
clusters:
  - name: observer
    cluster:
      server: https://127.0.0.1:{APISERVER_PORT}
      certificate-authority: {ca}
users:
  - name: {user}
    user:
      client-certificate: {crt}
      client-key: {key}
contexts:
  - name: observer
    context:
      cluster: observer
      user: {user}
current-context: observer
"#,
        ca = pki.join("ca.crt").display(),
        crt = pki.join(format!("{user}.crt")).display(),
        key = pki.join(format!("{user}.key")).display(),
    )
}

fn kubelet_config(c: &Cluster) -> String {
    let pki = c.pki();
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
    clientCAFile: {ca}
authorization:
  mode: Webhook
tlsCertFile: {pki}/kubelet-serving.crt
tlsPrivateKeyFile: {pki}/kubelet-serving.key
containerRuntimeEndpoint: unix://{socket}
# containerd 1.6 lacks the RuntimeConfig call that would tell kubelet its driver.
cgroupDriver: cgroupfs
cgroupRoot: /{CGROUP_ROOT}
# Hybrid hosts are cgroup v1 to kubelet (1.35 and newer refuse it unless told).
failCgroupV1: false
failSwapOn: false
podLogsDir: {logs}
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
        ca = pki.join("ca.crt").display(),
        pki = pki.display(),
        socket = c.containerd_socket().display(),
        logs = c.pod_logs().display(),
    )
}

fn containerd_config(c: &Cluster) -> String {
    // restrict_oom_score_adj: without CAP_SYS_RESOURCE (a nested sandbox) runc cannot lower a
    // sandbox's oom_score_adj and every RunPodSandbox fails. No CNI: host-network pods only.
    format!(
        r#"version = 2
root = "{state}/containerd"
state = "{run}/containerd-state"

[grpc]
  address = "{socket}"

[ttrpc]
  address = "{socket}.ttrpc"

[debug]
  address = ""

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "{state}/containerd-opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{run}/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{state}/cni/bin"
    conf_dir = "{state}/cni/conf"
"#,
        state = c.state().display(),
        run = RUN_DIR,
        socket = c.containerd_socket().display(),
        pause = observer_image::busybox::PAUSE_IMAGE,
    )
}

/// Every cgroup hierarchy mounted (v1 controllers, named v1 hierarchies and cgroup2).
fn hierarchies() -> Vec<PathBuf> {
    let Ok(mounts) = fs::read_to_string("/proc/self/mounts") else {
        return Vec::new();
    };
    mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_, dir, kind) = (f.next()?, f.next()?, f.next()?);
            // Named v1 hierarchies (name=systemd) too: kubelet checks every one.
            (kind == "cgroup2" || kind == "cgroup").then(|| PathBuf::from(dir))
        })
        .collect()
}

/// kubelet refuses a `cgroupRoot` that does not exist in every hierarchy it uses.
pub fn make_cgroup_root() -> Result<()> {
    for h in hierarchies() {
        let d = h.join(CGROUP_ROOT);
        fs::create_dir_all(&d).map_err(Error::io(&d))?;
    }
    Ok(())
}

/// SIGKILLs every process left in the pods' cgroups and removes the cgroups, deepest first.
pub fn kill_and_remove_cgroups() {
    for h in hierarchies() {
        let root = h.join(CGROUP_ROOT);
        if !root.exists() {
            continue;
        }
        let mut dirs = Vec::new();
        collect_dirs(&root, &mut dirs);
        for _ in 0..50 {
            let mut left = false;
            for d in dirs.iter().rev() {
                if let Ok(procs) = fs::read_to_string(d.join("cgroup.procs")) {
                    for pid in procs.lines().filter_map(|p| p.parse::<i32>().ok()) {
                        left = true;
                        let _ = nix::sys::signal::kill(
                            nix::unistd::Pid::from_raw(pid),
                            nix::sys::signal::Signal::SIGKILL,
                        );
                    }
                }
                let _ = fs::remove_dir(d);
            }
            if !left && !root.exists() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
}

fn collect_dirs(d: &Path, out: &mut Vec<PathBuf>) {
    out.push(d.to_path_buf());
    if let Ok(entries) = fs::read_dir(d) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                collect_dirs(&e.path(), out);
            }
        }
    }
}

/// Detaches every mount at or below `dir` (kubelet's volumes, containerd's rootfs and shm
/// mounts), deepest first.
pub fn unmount_below(dir: &Path) {
    let Ok(info) = fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let mut points: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split_whitespace().nth(4))
        .map(unescape)
        .filter(|p| p.starts_with(dir))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for p in points {
        let _ = nix::mount::umount2(&p, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape(s: &str) -> PathBuf {
    let mut out = Vec::with_capacity(s.len());
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(u8::is_ascii_digit) {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    PathBuf::from(std::ffi::OsString::from_vec(out))
}

/// The last `n` lines of a log, for an error.
pub fn tail(path: &Path, n: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
