//! The components as detached processes (their own process group, so they outlive the command
//! that started them), each with a pid file holding its pid and start time (a reused pid is never
//! taken for the component) and a log in `target/cluster/logs`.
use std::fs;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::files::Files;
use crate::host::start_time;
use crate::{Cluster, Error, Result, APISERVER_PORT, ETCD_CLIENT_PORT, ETCD_PEER_PORT, NODE_NAME};

/// In start order; stopped in the reverse.
pub(crate) const COMPONENTS: &[&str] = &[
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "containerd",
    "kubelet",
];

fn pid_file(dir: &Path, name: &str) -> std::path::PathBuf {
    dir.join("run").join(format!("{name}.pid"))
}

/// The component's pid if the process it started still runs.
pub(crate) fn running(dir: &Path, name: &str) -> Option<u32> {
    let s = fs::read_to_string(pid_file(dir, name)).ok()?;
    let (pid, started) = s.trim().split_once(' ')?;
    let (pid, started): (u32, u64) = (pid.parse().ok()?, started.parse().ok()?);
    (start_time(pid) == Some(started)).then_some(pid)
}

/// A component that was started and is no longer running.
pub(crate) fn first_dead(dir: &Path) -> Option<&'static str> {
    COMPONENTS
        .iter()
        .find(|c| pid_file(dir, c).exists() && running(dir, c).is_none())
        .copied()
}

pub(crate) fn spawn(cluster: &Cluster, name: &str, mut cmd: Command) -> Result<()> {
    let logs = cluster.logs();
    let run = cluster.dir().join("run");
    fs::create_dir_all(&run).map_err(Error::io(&run))?;
    let log_path = logs.join(format!("{name}.log"));
    let log = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(Error::io(&log_path))?;
    let err = log.try_clone().map_err(Error::io(&log_path))?;
    let child = cmd
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(err)
        .process_group(0)
        .spawn()
        .map_err(|e| Error::Command {
            what: format!("starting {name} ({:?})", cmd.get_program()),
            detail: e.to_string(),
        })?;
    let pid = child.id();
    // Not waited for: init reaps it once this process exits (a zombie until then, which
    // `running` tells from a live one).
    drop(child);
    let started = start_time(pid).unwrap_or(0);
    let pf = pid_file(cluster.dir(), name);
    fs::write(&pf, format!("{pid} {started}\n")).map_err(Error::io(&pf))
}

pub(crate) fn start_etcd(c: &Cluster) -> Result<()> {
    let data = c.state().join("etcd");
    let client = format!("http://127.0.0.1:{ETCD_CLIENT_PORT}");
    let peer = format!("http://127.0.0.1:{ETCD_PEER_PORT}");
    let mut cmd = Command::new(c.bin("etcd"));
    cmd.arg("--name=observer")
        .arg(format!("--data-dir={}", data.display()))
        .arg(format!("--listen-client-urls={client}"))
        .arg(format!("--advertise-client-urls={client}"))
        .arg(format!("--listen-peer-urls={peer}"))
        .arg(format!("--initial-advertise-peer-urls={peer}"))
        .arg(format!("--initial-cluster=observer={peer}"))
        // A test cluster: losing etcd's last writes at a crash of the machine costs nothing.
        .arg("--unsafe-no-fsync")
        .arg("--log-level=warn");
    spawn(c, "etcd", cmd)
}

pub(crate) fn start_apiserver(c: &Cluster, f: &Files) -> Result<()> {
    let pki = c.pki();
    let p = |n: &str| pki.join(n).display().to_string();
    let mut cmd = Command::new(c.bin("kube-apiserver"));
    cmd.arg(format!(
        "--etcd-servers=http://127.0.0.1:{ETCD_CLIENT_PORT}"
    ))
    .arg("--bind-address=127.0.0.1")
    .arg(format!("--secure-port={APISERVER_PORT}"))
    .arg(format!("--tls-cert-file={}", p("apiserver.crt")))
    .arg(format!("--tls-private-key-file={}", p("apiserver.key")))
    .arg(format!("--client-ca-file={}", p("ca.crt")))
    .arg(format!(
        "--kubelet-client-certificate={}",
        p("apiserver-kubelet-client.crt")
    ))
    .arg(format!(
        "--kubelet-client-key={}",
        p("apiserver-kubelet-client.key")
    ))
    .arg("--service-cluster-ip-range=10.0.0.0/24")
    .arg("--service-account-issuer=https://kubernetes.default.svc.cluster.local")
    .arg(format!(
        "--service-account-key-file={}",
        p("service-account.pub")
    ))
    .arg(format!(
        "--service-account-signing-key-file={}",
        p("service-account.key")
    ))
    // Real security: the Node authorizer and NodeRestriction for kubelet, RBAC for the
    // rest, and deploy/'s ValidatingAdmissionPolicy (admission is on by default).
    .arg("--authorization-mode=Node,RBAC")
    .arg("--enable-admission-plugins=NodeRestriction")
    .arg("--allow-privileged=true")
    .arg(format!("--audit-policy-file={}", f.audit_policy.display()))
    .arg(format!("--audit-log-path={}", c.audit_log().display()))
    // Never rotated while a cluster lives (0 would mean lumberjack's 100 MB, which a large
    // node's run passes): readers take every file anyway (`Cluster::audit_logs`).
    .arg("--audit-log-maxsize=100000")
    .arg("--profiling=false");
    spawn(c, "kube-apiserver", cmd)
}

pub(crate) fn start_controller_manager(c: &Cluster, f: &Files) -> Result<()> {
    let pki = c.pki();
    let kc = f.controller_manager.display().to_string();
    let mut cmd = Command::new(c.bin("kube-controller-manager"));
    cmd.arg(format!("--kubeconfig={kc}"))
        .arg(format!("--authentication-kubeconfig={kc}"))
        .arg(format!("--authorization-kubeconfig={kc}"))
        .arg("--bind-address=127.0.0.1")
        .arg("--leader-elect=false")
        .arg("--use-service-account-credentials=true")
        .arg(format!(
            "--service-account-private-key-file={}",
            pki.join("service-account.key").display()
        ))
        // What kube-root-ca.crt carries into every namespace (projected token volumes).
        .arg(format!("--root-ca-file={}", pki.join("ca.crt").display()))
        // The node has no CNI and stays NotReady: the node-lifecycle controller would mark its
        // pods not ready and taint it, fighting every readiness test.
        .arg("--controllers=*,-node-lifecycle-controller");
    spawn(c, "kube-controller-manager", cmd)
}

pub(crate) fn start_scheduler(c: &Cluster, f: &Files) -> Result<()> {
    let kc = f.scheduler.display().to_string();
    let mut cmd = Command::new(c.bin("kube-scheduler"));
    cmd.arg(format!("--kubeconfig={kc}"))
        .arg(format!("--authentication-kubeconfig={kc}"))
        .arg(format!("--authorization-kubeconfig={kc}"))
        .arg("--bind-address=127.0.0.1")
        .arg("--leader-elect=false");
    spawn(c, "kube-scheduler", cmd)
}

pub(crate) fn start_containerd(c: &Cluster, f: &Files) -> Result<()> {
    let containerd = c.containerd_bin("containerd");
    let mut cmd = Command::new(&containerd);
    // Its own runc shim first (containerd looks the shim up on PATH); runc is Debian's.
    let dir = containerd.parent().unwrap_or(Path::new("/"));
    let path = std::env::var("PATH").unwrap_or_else(|_| "/usr/sbin:/usr/bin:/sbin:/bin".into());
    cmd.env("PATH", format!("{}:{path}", dir.display()))
        .arg("--config")
        .arg(&f.containerd);
    spawn(c, "containerd", cmd)?;
    let socket = c.containerd_socket();
    wait_for(c, "containerd", || socket.exists())?;
    // The socket appears before the CRI plugin serves: ask it.
    wait_for(c, "containerd's CRI plugin", || {
        Command::new(c.containerd_bin("ctr"))
            .arg("--address")
            .arg(&socket)
            .args(["-n", "k8s.io", "plugins", "ls"])
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

pub(crate) fn start_kubelet(c: &Cluster, f: &Files) -> Result<()> {
    let mut cmd = Command::new(c.bin("kubelet"));
    cmd.arg(format!("--config={}", f.kubelet.display()))
        .arg(format!("--kubeconfig={}", f.kubelet_kubeconfig.display()))
        .arg(format!(
            "--root-dir={}",
            c.state().join("kubelet").display()
        ))
        .arg(format!("--hostname-override={NODE_NAME}"));
    spawn(c, "kubelet", cmd)
}

fn wait_for(c: &Cluster, what: &str, mut ok: impl FnMut() -> bool) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ok() {
        if let Some(dead) = first_dead(c.dir()) {
            return Err(Error::Command {
                what: format!("{dead} (while waiting for {what})"),
                detail: crate::files::tail(&c.logs().join(format!("{dead}.log")), 40),
            });
        }
        if Instant::now() >= deadline {
            return Err(Error::Timeout {
                what: what.into(),
                after: Duration::from_secs(60),
                detail: String::new(),
            });
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// Forgets a component that exited (its pid file), so that `first_dead` does not take it for a
/// crash while a fault test holds it down.
pub(crate) fn forget(c: &Cluster, name: &str) {
    let _ = fs::remove_file(pid_file(c.dir(), name));
}

/// Stops every component, newest first.
pub(crate) fn stop_all(c: &Cluster) {
    for name in COMPONENTS.iter().rev() {
        stop(c, name);
    }
}

/// Stops one started process: TERM, then KILL after 10 s.
pub(crate) fn stop(c: &Cluster, name: &str) {
    if let Some(pid) = running(c.dir(), name) {
        let pid = Pid::from_raw(pid as i32);
        let _ = kill(pid, Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        while running(c.dir(), name).is_some() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        if running(c.dir(), name).is_some() {
            let _ = kill(pid, Signal::SIGKILL);
        }
    }
    let _ = fs::remove_file(pid_file(c.dir(), name));
}
