//! A real one-node Kubernetes on this machine: etcd, kube-apiserver, kube-controller-manager,
//! kube-scheduler, a containerd of its own and kubelet, built with `go build` from the Go module
//! proxy ([`build`]) and run as root beside the host's other tests.
//!
//! Everything listens on loopback and nothing is sent elsewhere. kubelet refuses a loopback node
//! IP, so the node's address is this machine's first interface address; nobody connects to it
//! (kubelet serves on 127.0.0.1, the API server is never asked to reach kubelet, probes name
//! 127.0.0.1). There is no CNI: only host-network pods start, and the node stays NotReady
//! (containerd reports its network not ready), which is why the node-lifecycle controller is off
//! (it would mark every pod of a NotReady node not ready).
//!
//! The state lives in `target/cluster/` (binaries, Go caches, certificates, etcd, kubelet,
//! containerd's images) and `/run/observer-cluster` (containerd's socket, which the DaemonSet
//! mounts, and runc's state). Pods' cgroups sit under `/observer-cluster/kubepods`
//! (kubelet's `cgroupRoot`), apart from the `/kubepods` trees the host suites lay out.
//!
//! Further nodes ([`guest`]) are Debian guests under qemu, joined to the same control plane:
//! `up_nodes(2)` (`cargo xtask cluster up --nodes 2`).
pub mod build;
mod daemon;
mod faults;
mod files;
pub mod guest;
pub mod host;
pub mod versions;

pub use faults::Component;
pub use files::{containerd_toml, ContainerdPaths};
pub mod pki;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

pub use build::ETCD_VERSION;
pub use guest::{Guest, GUEST_NODE_NAME};
pub use versions::{Release, Versions};

/// The node's name (kubelet's `--hostname-override`), whatever the machine's hostname.
pub const NODE_NAME: &str = "observer-node";
/// kube-apiserver's secure port on 127.0.0.1.
pub const APISERVER_PORT: u16 = 6443;
const ETCD_CLIENT_PORT: u16 = 23790;
const ETCD_PEER_PORT: u16 = 23800;
/// Where containerd's socket (the directory the DaemonSet mounts) and runc's state live.
pub const RUN_DIR: &str = "/run/observer-cluster";
/// kubelet's `cgroupRoot`: pods go under `<this>/kubepods`.
pub const CGROUP_ROOT: &str = "observer-cluster";
/// How long `up` waits for each component.
const START_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{what} failed: {detail}")]
    Command { what: String, detail: String },
    #[error("{what} was not ready within {after:?}: {detail}")]
    Timeout {
        what: String,
        after: Duration,
        detail: String,
    },
    #[error("certificates: {0}")]
    Pki(#[from] rcgen::Error),
    #[error("{0}")]
    Image(#[from] observer_image::Error),
    #[error("{0}")]
    Missing(String),
}

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Error {
        let path = path.into();
        move |source| Error::Io { path, source }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The cluster of one workspace: its files under `<workspace>/target/cluster`.
#[derive(Debug, Clone)]
pub struct Cluster {
    workspace: PathBuf,
    dir: PathBuf,
    /// Releases chosen by the caller (`cargo xtask cluster up --kubernetes …`); else the running
    /// cluster's, else the environment's ([`Versions::of_cluster`]).
    chosen: Option<Versions>,
}

impl Cluster {
    /// The cluster of the workspace this crate was built in.
    pub fn of_workspace() -> Self {
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("the crate sits in the workspace")
            .to_path_buf();
        Self::new(&workspace)
    }

    pub fn new(workspace: &Path) -> Self {
        Self {
            workspace: workspace.to_path_buf(),
            dir: workspace.join("target/cluster"),
            chosen: None,
        }
    }

    /// The same cluster, started (or built) with these releases rather than the environment's.
    pub fn choosing(mut self, versions: Versions) -> Self {
        self.chosen = Some(versions);
        self
    }

    /// The releases this cluster runs (or, before `up`, would run): the caller's choice, else
    /// what `up` recorded, else the environment's. An environment that names a release the
    /// cluster cannot build is refused by `up` and `build`; here it reads as the default.
    pub fn versions(&self) -> Versions {
        self.chosen
            .or_else(|| Versions::of_cluster(&self.dir).ok())
            .unwrap_or_default()
    }

    fn versions_checked(&self) -> Result<Versions> {
        match self.chosen {
            Some(v) => Ok(v),
            None => Versions::of_cluster(&self.dir),
        }
    }

    /// Builds what this cluster's releases need (`cargo xtask cluster build`).
    pub fn build(&self) -> Result<()> {
        build::ensure(&self.workspace, &self.dir, &self.versions_checked()?)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The admin kubeconfig (system:masters), written by `up`.
    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.join("admin.kubeconfig")
    }

    /// The API server's audit log: every write to pods/status and events, with its user, and
    /// every request of the nodes' kubelets and of the agent (what each costs the API server).
    pub fn audit_log(&self) -> PathBuf {
        self.state().join("audit.log")
    }

    /// The audit log's files, oldest first: rotated ones (`audit-<time>.log`), then the current.
    pub fn audit_logs(&self) -> Vec<PathBuf> {
        let mut rotated: Vec<PathBuf> = std::fs::read_dir(self.state())
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("audit-") && n.ends_with(".log"))
            })
            .collect();
        rotated.sort();
        rotated.push(self.audit_log());
        rotated
    }

    /// A built component's binary: etcd and helm, the control plane's (kubectl among them), or
    /// the host node's kubelet ([`Cluster::kubelet_bin`] for another node's).
    pub fn bin(&self, name: &str) -> PathBuf {
        let v = self.versions();
        match name {
            "etcd" | "helm" => self.dir.join("bin").join(name),
            "kubelet" => self.kubelet_bin(v.host_kubelet),
            _ => versions::kubernetes_bin(&self.dir, v.control_plane).join(name),
        }
    }

    /// One release's kubelet.
    pub fn kubelet_bin(&self, r: Release) -> PathBuf {
        versions::kubernetes_bin(&self.dir, r).join("kubelet")
    }

    /// The host node's containerd, its shim and ctr.
    pub fn containerd_bin(&self, name: &str) -> PathBuf {
        versions::containerd_bin(&self.dir, self.versions().host_kubelet.containerd()).join(name)
    }

    /// kubectl with the admin kubeconfig.
    pub fn kubectl(&self) -> Command {
        let mut c = Command::new(self.bin("kubectl"));
        c.arg("--kubeconfig").arg(self.kubeconfig());
        c
    }

    /// helm (`target/cluster/bin/helm`, built with the components) on this cluster, as its admin,
    /// with its cache, configuration and data under `target/cluster/helm` rather than the
    /// user's home.
    pub fn helm(&self) -> Command {
        let mut c = Command::new(self.bin("helm"));
        let home = self.dir.join("helm");
        c.env("KUBECONFIG", self.kubeconfig())
            .env("HELM_CACHE_HOME", home.join("cache"))
            .env("HELM_CONFIG_HOME", home.join("config"))
            .env("HELM_DATA_HOME", home.join("data"));
        c
    }

    /// Runs helm and returns its stdout, or its stderr as the error.
    pub fn helm_ok(&self, args: &[&str]) -> Result<String> {
        let out = self
            .helm()
            .args(args)
            .output()
            .map_err(Error::io(self.bin("helm")))?;
        checked(&format!("helm {}", args.join(" ")), out)
    }

    /// `cluster/overlay`: deploy/ as this cluster runs it (`kubectl apply -k`), and the chart's
    /// values for the same (`chart-values.yaml`).
    pub fn overlay(&self) -> PathBuf {
        self.workspace.join("cluster/overlay")
    }

    /// The agent's Helm chart, `deploy/chart`.
    pub fn chart(&self) -> PathBuf {
        self.workspace.join("deploy/chart")
    }

    /// Runs kubectl and returns its stdout, or its stderr as the error.
    pub fn kubectl_ok(&self, args: &[&str]) -> Result<String> {
        let out = self
            .kubectl()
            .args(args)
            .output()
            .map_err(Error::io(self.bin("kubectl")))?;
        checked(&format!("kubectl {}", args.join(" ")), out)
    }

    /// The directory of containerd's socket (what the DaemonSet mounts as /run/containerd).
    pub fn containerd_socket(&self) -> PathBuf {
        Path::new(RUN_DIR).join("containerd/containerd.sock")
    }

    /// Where kubelet writes pods' container logs (`podLogsDir`): read directly, since
    /// `kubectl logs` would have the API server dial the node's non-loopback address.
    pub fn pod_logs(&self) -> PathBuf {
        self.state().join("pod-logs")
    }

    fn state(&self) -> PathBuf {
        self.dir.join("state")
    }

    /// The host node's kubelet feature gates a bench chose ([`Cluster::restart_kubelet_with_gates`]).
    pub(crate) fn kubelet_gates_file(&self) -> PathBuf {
        self.state().join("kubelet-gates")
    }

    fn pki(&self) -> PathBuf {
        self.dir.join("pki")
    }

    fn logs(&self) -> PathBuf {
        self.dir.join("logs")
    }

    /// Whether every component runs and the API server answers /readyz.
    pub fn is_up(&self) -> bool {
        daemon::COMPONENTS
            .iter()
            .all(|c| daemon::running(&self.dir, c).is_some())
            && self.kubectl_ok(&["get", "--raw", "/readyz"]).is_ok()
    }

    /// Whether `node` is registered with its runtime's version (kubelet reached the runtime).
    pub(crate) fn node_registered(&self, node: &str) -> Result<()> {
        let v = self.kubectl_ok(&[
            "get",
            "node",
            node,
            "-o",
            "jsonpath={.status.nodeInfo.containerRuntimeVersion}",
        ])?;
        if v.is_empty() {
            return Err(Error::Missing("no runtime version reported yet".into()));
        }
        Ok(())
    }

    /// Builds what is missing, starts every component and waits until a pod can run on the
    /// node. A no-op when the cluster is already up; a half-started one is torn down first.
    pub fn up(&self) -> Result<()> {
        if self.is_up() {
            let running = Versions::of_cluster(&self.dir)?;
            if self.chosen.is_some_and(|c| c != running) {
                return Err(Error::Missing(format!(
                    "the cluster already runs {running}: `cargo xtask cluster down` first to \
                     start it with other releases"
                )));
            }
            eprintln!(
                "cluster: already up ({running}; {})",
                self.kubeconfig().display()
            );
            return Ok(());
        }
        // The choice of a cluster no longer up is not kept: the caller's, else the environment's.
        let versions = match self.chosen {
            Some(v) => v,
            None => Versions::from_env()?,
        };
        build::ensure(&self.workspace, &self.dir, &versions)?;
        let this = self.clone().choosing(versions);
        this.up_chosen()
    }

    fn up_chosen(&self) -> Result<()> {
        let versions = self.versions();
        if daemon::COMPONENTS
            .iter()
            .any(|c| daemon::running(&self.dir, c).is_some())
            || self.state().exists()
            // Another checkout's cluster, or one whose processes were killed, leaves the node's
            // socket directory and the pods' cgroups behind.
            || Path::new(RUN_DIR).exists()
            || host::cgroup_mounts()
                .iter()
                .any(|h| h.join(CGROUP_ROOT).exists())
        {
            eprintln!("cluster: a previous cluster is half up or left state; removing it first");
            self.down()?;
        }
        let started = Instant::now();
        for d in [self.state(), self.logs(), PathBuf::from(RUN_DIR)] {
            std::fs::create_dir_all(&d).map_err(Error::io(&d))?;
        }
        versions.save(&self.dir)?;
        pki::ensure(&self.pki())?;
        let files = files::write(self)?;
        daemon::start_etcd(self)?;
        daemon::start_apiserver(self, &files)?;
        self.wait("the API server", || {
            self.kubectl_ok(&["get", "--raw", "/readyz"]).map(|_| ())
        })?;
        daemon::start_controller_manager(self, &files)?;
        daemon::start_scheduler(self, &files)?;
        daemon::start_containerd(self, &files)?;
        self.import_test_images()?;
        files::make_cgroup_root()?;
        daemon::start_kubelet(self, &files)?;
        self.wait("the node's registration", || {
            self.node_registered(NODE_NAME)
        })?;
        // A pod can be created once its namespace has the default service account and the
        // root CA its projected token volume carries.
        self.wait("the default service account and kube-root-ca.crt", || {
            self.kubectl_ok(&["get", "serviceaccount", "default", "-n", "default"])?;
            self.kubectl_ok(&["get", "configmap", "kube-root-ca.crt", "-n", "default"])?;
            Ok(())
        })?;
        eprintln!(
            "cluster: up in {:.0?} ({versions}, etcd {ETCD_VERSION}); KUBECONFIG={}",
            started.elapsed(),
            self.kubeconfig().display()
        );
        Ok(())
    }

    /// [`Cluster::up`], then boots guest nodes until the cluster has `nodes` nodes (the host's
    /// one included); guests already running are kept. Returns how long each new one took.
    pub fn up_nodes(&self, nodes: usize) -> Result<Vec<(String, guest::Started)>> {
        self.up()?;
        let mut started = Vec::new();
        for n in 2..=nodes {
            let g = Guest::new(self, &guest::node_name(n));
            let registered = self
                .kubectl_ok(&["get", "node", &g.name, "-o", "name"])
                .is_ok();
            if g.is_running() && registered {
                eprintln!("cluster: node {} already up", g.name);
                continue;
            }
            started.push((g.name.clone(), g.start()?));
        }
        Ok(started)
    }

    /// Boots one more guest node (the next free name) and waits until it registers.
    pub fn add_node(&self) -> Result<(String, guest::Started)> {
        if !self.is_up() {
            return Err(Error::Missing(
                "the cluster is not up: `cargo xtask cluster up` first".into(),
            ));
        }
        let mut n = 2;
        while Guest::new(self, &guest::node_name(n)).is_running() {
            n += 1;
        }
        let g = Guest::new(self, &guest::node_name(n));
        let started = g.start()?;
        Ok((g.name, started))
    }

    /// Stops a guest node and deletes its Node object (its pods go with it).
    pub fn remove_node(&self, name: &str) -> Result<()> {
        if name == NODE_NAME {
            return Err(Error::Missing(format!(
                "{NODE_NAME} is the host's node: `cargo xtask cluster down` stops it"
            )));
        }
        Guest::new(self, name).stop()?;
        if self.is_up() {
            self.kubectl_ok(&["delete", "node", name, "--ignore-not-found", "--wait=false"])?;
        }
        eprintln!("cluster: node {name} removed");
        Ok(())
    }

    /// Stops every component (the guests first, then kubelet, so nothing is restarted), kills
    /// what runs in the pods' cgroups, unmounts what kubelet and containerd mounted and removes
    /// all state: only the binaries, the Go caches and the guest image stay.
    pub fn down(&self) -> Result<()> {
        for g in Guest::all(self) {
            g.stop()?;
            eprintln!("cluster: guest {} stopped", g.name);
        }
        daemon::stop_all(self);
        // containerd's shims outlive it, re-parented to init and outside the node's cgroups: the
        // node's are the ones that name its socket.
        let shims =
            host::pids_with_cmdline(&format!("-address {}", self.containerd_socket().display()));
        for &pid in &shims {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        if !shims.is_empty() {
            eprintln!(
                "cluster: killed {} containerd shim(s) left by the node",
                shims.len()
            );
        }
        let left = host::destroy_cgroup_subtree(CGROUP_ROOT, Duration::from_secs(10));
        if !left.is_empty() {
            eprintln!("cluster: cgroups still busy after 10 s: {left:?}");
        }
        host::unmount_all(&self.state());
        host::unmount_all(Path::new(RUN_DIR));
        for d in [
            self.state(),
            PathBuf::from(RUN_DIR),
            self.pki(),
            self.logs(),
            // helm's cache, configuration and data (`Cluster::helm`).
            self.dir.join("helm"),
        ] {
            if d.exists() {
                std::fs::remove_dir_all(&d).map_err(Error::io(&d))?;
            }
        }
        let _ = std::fs::remove_file(self.kubeconfig());
        eprintln!("cluster: down");
        Ok(())
    }

    /// Imports an OCI archive into the node's containerd (the `k8s.io` namespace kubelet uses).
    pub fn import(&self, archive: &Path) -> Result<()> {
        Ok(observer_image::oci::ctr_import(
            &self.containerd_socket(),
            archive,
            "overlayfs",
        )?)
    }

    fn import_test_images(&self) -> Result<()> {
        let busybox = which("busybox").ok_or_else(|| {
            Error::Missing(
                "busybox not found (scripts/bootstrap.sh installs busybox-static)".into(),
            )
        })?;
        let archive = self.state().join("test-images.tar");
        observer_image::busybox::write_archive(&busybox, &archive)?;
        self.import(&archive)?;
        let _ = std::fs::remove_file(&archive);
        Ok(())
    }

    /// Imports the agent's image archive, applies `deploy/` through `cluster/overlay` and waits
    /// until the DaemonSet's pod is Ready.
    pub fn deploy(&self, agent_archive: &Path) -> Result<()> {
        self.import(agent_archive)?;
        // Each guest node's containerd gets the same image (through its guest agent).
        for g in self.guests() {
            g.import(agent_archive)?;
        }
        let overlay = self.overlay();
        let overlay = overlay.to_string_lossy();
        self.kubectl_ok(&["apply", "-k", &overlay])?;
        // A re-deploy of the same tag must run the new image: restart the pods explicitly.
        self.kubectl_ok(&[
            "-n",
            "observer-system",
            "rollout",
            "restart",
            "daemonset/observer",
        ])?;
        self.wait_rollout()
    }

    /// Waits for the DaemonSet's rollout; on failure the error carries the pod's description
    /// and the agent's log as kubelet wrote it.
    pub fn wait_rollout(&self) -> Result<()> {
        let guests = self.guests();
        // An agent in a guest starts under software emulation: loading its probes takes longer.
        let after = Duration::from_secs(if guests.is_empty() { 180 } else { 600 });
        let r = self.kubectl_ok(&[
            "-n",
            "observer-system",
            "rollout",
            "status",
            "daemonset/observer",
            &format!("--timeout={}s", after.as_secs()),
        ]);
        r.map(|_| ()).map_err(|e| Error::Timeout {
            what: "the observer DaemonSet".into(),
            after,
            detail: format!(
                "{e}\n{}\nagent log:\n{}{}",
                self.kubectl_ok(&["-n", "observer-system", "describe", "pods"])
                    .unwrap_or_default(),
                self.agent_log().unwrap_or_default(),
                guests
                    .iter()
                    .map(|g| format!(
                        "\nagent log on {}:\n{}",
                        g.name,
                        g.agent_log().unwrap_or_default()
                    ))
                    .collect::<String>()
            ),
        })
    }

    /// The guest nodes whose qemu runs.
    pub fn guests(&self) -> Vec<Guest<'_>> {
        Guest::all(self)
            .into_iter()
            .filter(|g| g.is_running())
            .collect()
    }

    /// The newest log kubelet keeps for the agent's container.
    pub fn agent_log(&self) -> Option<String> {
        let mut newest: Option<(std::time::SystemTime, PathBuf)> = None;
        let pods = std::fs::read_dir(self.pod_logs()).ok()?;
        for pod in pods.flatten() {
            if !pod
                .file_name()
                .to_string_lossy()
                .starts_with("observer-system_observer-")
            {
                continue;
            }
            for f in std::fs::read_dir(pod.path().join("observer"))
                .ok()?
                .flatten()
            {
                let t = f.metadata().and_then(|m| m.modified()).ok()?;
                if newest.as_ref().is_none_or(|(n, _)| t > *n) {
                    newest = Some((t, f.path()));
                }
            }
        }
        std::fs::read_to_string(newest?.1).ok()
    }

    fn wait(&self, what: &str, mut ready: impl FnMut() -> Result<()>) -> Result<()> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let err = match ready() {
                Ok(()) => return Ok(()),
                Err(e) => e,
            };
            if let Some(dead) = daemon::first_dead(&self.dir) {
                return Err(Error::Command {
                    what: format!("{dead} (while waiting for {what})"),
                    detail: format!(
                        "exited:\n{}",
                        files::tail(&self.logs().join(format!("{dead}.log")), 40)
                    ),
                });
            }
            if Instant::now() >= deadline {
                return Err(Error::Timeout {
                    what: what.into(),
                    after: START_TIMEOUT,
                    detail: err.to_string(),
                });
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

fn checked(what: &str, out: Output) -> Result<String> {
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(Error::Command {
            what: what.into(),
            detail: format!(
                "{}: {}{}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim(),
                String::from_utf8_lossy(&out.stdout).trim()
            ),
        })
    }
}

/// A program on PATH.
pub fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}
