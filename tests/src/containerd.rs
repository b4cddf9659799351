//! A private containerd for one test: its own root, state, socket and runc root under a fresh
//! temp dir, the CRI plugin configured like a cgroupfs kubelet node without CNI, and local images.
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use nix::sys::signal::Signal;
use observer::cri::{api, CriClient, CriConfig, CriEndpoint};
use sha2::{Digest, Sha256};

use crate::events::TaskExitStream;
use crate::image;
use crate::pod::{container_config, sandbox_config, Container, ContainerSpec, Pod, PodSpec};
use crate::sys;

/// Temp dirs of this harness start with this; a dead owner marks one as a crashed run's leftover.
const DIR_PREFIX: &str = "observer-ctrd-";
/// containerd 1.6 puts shim sockets here whatever its state dir (shim.SocketAddress).
const SHIM_SOCKET_DIR: &str = "/run/containerd/s";
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Generous: RunPodSandbox and CreateContainer do real work (mounts, runc) on a 2-core machine.
const HARNESS_CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// What teardown must remove.
#[derive(Default)]
struct Created {
    sandboxes: Vec<String>,
    /// Pod cgroup parents (e.g. `/kubepods/burstable/pod<uid>`).
    cgroups: Vec<String>,
}

/// How [`Containerd::restart`] stops containerd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopSignal {
    /// SIGKILL: a crash. Shims and containers keep running.
    Kill,
    /// SIGTERM: an orderly stop (an upgrade, systemctl restart). Shims and containers keep running.
    Term,
}

/// A running containerd owned by a test. Dropping it stops and removes the pods it created, stops
/// containerd and its shims, unmounts everything under its dir and removes the dir, also when the
/// test panicked.
pub struct Containerd {
    dir: PathBuf,
    socket: PathBuf,
    config: PathBuf,
    snapshotter: &'static str,
    process: Mutex<Option<Child>>,
    client: Mutex<Option<CriClient>>,
    created: Mutex<Created>,
    torn_down: bool,
}

impl Containerd {
    /// Starts containerd, waits until it answers CRI Version, imports the busybox and pause
    /// images. Cleans up leftovers of crashed earlier runs first.
    pub async fn start() -> Result<Self> {
        tokio::task::spawn_blocking(cleanup_stale)
            .await
            .context("stale cleanup")?;
        let dir = tempfile::Builder::new()
            .prefix(DIR_PREFIX)
            .tempdir_in(std::env::temp_dir())
            .context("creating the harness dir")?
            // Removal is ours (after unmounting), not TempDir's.
            .keep();
        // From here on, Drop cleans up whatever a failing step leaves.
        let mut ctrd = Containerd {
            socket: dir.join("containerd.sock"),
            config: dir.join("config.toml"),
            snapshotter: "overlayfs",
            process: Mutex::new(None),
            client: Mutex::new(None),
            created: Mutex::new(Created::default()),
            torn_down: false,
            dir,
        };
        let me = std::process::id();
        let started = sys::start_time(me).context("reading this process's start time")?;
        fs::write(ctrd.dir.join("owner"), format!("{me} {started}\n"))?;
        ctrd.snapshotter = if overlay_works(&ctrd.dir) {
            "overlayfs"
        } else {
            "native"
        };
        fs::write(&ctrd.config, ctrd.config_toml())?;
        fs::create_dir_all(ctrd.dir.join("pods"))?;
        ctrd.spawn()?;
        ctrd.wait_ready().await?;
        let (dir, socket, snapshotter) = (ctrd.dir.clone(), ctrd.socket.clone(), ctrd.snapshotter);
        tokio::task::spawn_blocking(move || import_images(&dir, &socket, snapshotter))
            .await
            .context("image import task")??;
        tracing::info!(dir = %ctrd.dir.display(), snapshotter, pid = ?ctrd.pid(), "containerd ready");
        Ok(ctrd)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    pub fn endpoint(&self) -> CriEndpoint {
        CriEndpoint::new(&self.socket)
    }

    /// `overlayfs`, or `native` where overlay mounts do not work.
    pub fn snapshotter(&self) -> &'static str {
        self.snapshotter
    }

    /// containerd's pid while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.process.lock().ok()?.as_ref().map(Child::id)
    }

    /// Where the sandboxes' log directories go (kubelet's /var/log/pods).
    pub fn logs_root(&self) -> PathBuf {
        self.dir.join("pods")
    }

    /// Imports an OCI image archive (e.g. the agent's, from `observer_image`) for the CRI plugin.
    pub async fn import_archive(&self, archive: &Path) -> Result<()> {
        let (socket, archive, snapshotter) =
            (self.socket.clone(), archive.to_path_buf(), self.snapshotter);
        tokio::task::spawn_blocking(move || image::import(&socket, &archive, snapshotter))
            .await
            .context("image import task")??;
        Ok(())
    }

    /// A CRI client connected to this containerd (reconnected after [`Containerd::restart`]).
    pub fn cri(&self) -> Result<CriClient> {
        self.client
            .lock()
            .map_err(|_| anyhow!("client lock poisoned"))?
            .clone()
            .ok_or_else(|| anyhow!("containerd is not running"))
    }

    fn config_toml(&self) -> String {
        let d = &self.dir;
        observer_cluster::containerd_toml(&observer_cluster::ContainerdPaths {
            root: &d.join("root"),
            state: &d.join("state"),
            socket: &self.socket,
            opt: &d.join("opt"),
            runc_root: &d.join("runc"),
            cni: &d.join("cni"),
            snapshotter: self.snapshotter,
        })
    }

    fn spawn(&self) -> Result<()> {
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("containerd.log"))?;
        let child = Command::new("containerd")
            .arg("--config")
            .arg(&self.config)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("spawning containerd")?;
        let pid = child.id();
        let started = sys::start_time(pid).unwrap_or(0);
        fs::write(
            self.dir.join("containerd.pid"),
            format!("{pid} {started}\n"),
        )?;
        *self.process.lock().map_err(|_| anyhow!("lock poisoned"))? = Some(child);
        Ok(())
    }

    async fn wait_ready(&self) -> Result<()> {
        let config = CriConfig::new(self.endpoint())
            .call_timeout(HARNESS_CALL_TIMEOUT)
            .connect_timeout(Duration::from_secs(2));
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut last_err = String::from("no attempt");
        loop {
            if let Some(status) = self.exited()? {
                bail!(
                    "containerd exited ({status}) before it was ready:\n{}",
                    self.log_tail(30)
                );
            }
            if self.socket.exists() {
                match CriClient::connect(&config).await {
                    Ok(c) => match c.version().await {
                        Ok(_) => {
                            *self.client.lock().map_err(|_| anyhow!("lock poisoned"))? = Some(c);
                            return Ok(());
                        }
                        Err(e) => last_err = e.to_string(),
                    },
                    Err(e) => last_err = e.to_string(),
                }
            }
            if Instant::now() >= deadline {
                bail!(
                    "containerd did not answer CRI Version within {READY_TIMEOUT:?} ({last_err}):\n{}",
                    self.log_tail(30)
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn exited(&self) -> Result<Option<std::process::ExitStatus>> {
        let mut guard = self.process.lock().map_err(|_| anyhow!("lock poisoned"))?;
        match guard.as_mut() {
            Some(child) => Ok(child.try_wait()?),
            None => bail!("containerd is not running"),
        }
    }

    /// The last `lines` lines of containerd's log, for error messages.
    pub fn log_tail(&self, lines: usize) -> String {
        let log = fs::read_to_string(self.dir.join("containerd.log")).unwrap_or_default();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Stops containerd (its shims and containers keep running), as a crash or an upgrade would.
    pub async fn stop(&self, how: StopSignal) -> Result<()> {
        let child = self
            .process
            .lock()
            .map_err(|_| anyhow!("lock poisoned"))?
            .take();
        *self.client.lock().map_err(|_| anyhow!("lock poisoned"))? = None;
        let Some(child) = child else {
            bail!("containerd is not running");
        };
        tokio::task::spawn_blocking(move || stop_child(child, how))
            .await
            .context("stopping containerd")?
    }

    /// Starts containerd again on the same dirs and waits until it answers.
    pub async fn resume(&self) -> Result<()> {
        if self.pid().is_some() {
            bail!("containerd is already running");
        }
        self.spawn()?;
        self.wait_ready().await
    }

    /// [`Containerd::stop`] then [`Containerd::resume`].
    pub async fn restart(&self, how: StopSignal) -> Result<()> {
        self.stop(how).await?;
        self.resume().await
    }

    /// Subscribes to containerd's `/tasks/exit` events in the `k8s.io` namespace.
    pub async fn subscribe_task_exits(&self) -> Result<TaskExitStream> {
        TaskExitStream::subscribe(self.cri()?.channel(), Some("k8s.io")).await
    }

    /// Runs a sandbox for `spec` and creates and starts its containers, in order.
    pub async fn run_pod(&self, spec: PodSpec) -> Result<Pod> {
        let mut pod = self.run_sandbox(&spec).await?;
        for c in spec.containers {
            self.add_container(&mut pod, c).await?;
        }
        Ok(pod)
    }

    /// RunPodSandbox only (`spec.containers` is ignored).
    pub async fn run_sandbox(&self, spec: &PodSpec) -> Result<Pod> {
        let config = sandbox_config(spec, &spec.log_directory(&self.logs_root()));
        self.run_sandbox_with(spec, config).await
    }

    /// RunPodSandbox with a config built elsewhere (e.g. [`crate::kubelet`]'s, from a manifest)
    /// for `spec`'s pod; `config.log_directory` should be under [`Containerd::logs_root`].
    pub async fn run_sandbox_with(
        &self,
        spec: &PodSpec,
        config: api::PodSandboxConfig,
    ) -> Result<Pod> {
        let log_directory = PathBuf::from(&config.log_directory);
        // kubelet creates the pod's log directory before RunPodSandbox.
        fs::create_dir_all(&log_directory)?;
        let cgroup_parent = config
            .linux
            .as_ref()
            .map(|l| l.cgroup_parent.clone())
            .unwrap_or_else(|| spec.cgroup_parent());
        // Before the call: runc may create the pod cgroup even when RunPodSandbox then fails.
        self.remember("cgroups", &cgroup_parent, |c| &mut c.cgroups)?;
        let cri = self.cri()?;
        let mut rt = cri.runtime();
        let resp = cri
            .timed(
                "RunPodSandbox",
                rt.run_pod_sandbox(api::RunPodSandboxRequest {
                    config: Some(config.clone()),
                    runtime_handler: String::new(),
                }),
            )
            .await
            .with_context(|| format!("RunPodSandbox {}:\n{}", spec.name, self.log_tail(15)))?;
        self.remember("sandboxes", &resp.pod_sandbox_id, |c| &mut c.sandboxes)?;
        Ok(Pod {
            sandbox_id: resp.pod_sandbox_id,
            name: spec.name.clone(),
            namespace: spec.namespace.clone(),
            uid: spec.uid.clone(),
            qos: spec.qos,
            cgroup_parent,
            pid: spec.pid,
            log_directory,
            sandbox_config: config,
            containers: vec![],
        })
    }

    /// CreateContainer + StartContainer with a config built elsewhere; the container is added to
    /// `pod`. Returns its id.
    pub async fn add_container_with(
        &self,
        pod: &mut Pod,
        config: api::ContainerConfig,
    ) -> Result<String> {
        let name = config
            .metadata
            .as_ref()
            .map(|m| m.name.clone())
            .unwrap_or_default();
        let restart_count = config.metadata.as_ref().map_or(0, |m| m.attempt);
        let id = self.create_container_with(pod, config).await?;
        self.start_container(&id).await?;
        pod.containers.push(Container {
            id: id.clone(),
            name,
            restart_count,
        });
        Ok(id)
    }

    /// Records something teardown must remove, in memory and (for the cleanup of a run that
    /// dies without Drop) in `dir/<file>`.
    fn remember(
        &self,
        file: &str,
        item: &str,
        list: fn(&mut Created) -> &mut Vec<String>,
    ) -> Result<()> {
        let mut created = self.created.lock().map_err(|_| anyhow!("lock poisoned"))?;
        list(&mut created).push(item.to_string());
        drop(created);
        let mut f = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(file))?;
        writeln!(f, "{item}")?;
        Ok(())
    }

    /// CreateContainer + StartContainer; the container is added to `pod`. Returns its id.
    pub async fn add_container(&self, pod: &mut Pod, spec: ContainerSpec) -> Result<String> {
        let id = self.create_container(pod, &spec).await?;
        self.start_container(&id).await?;
        pod.containers.push(Container {
            id: id.clone(),
            name: spec.name,
            restart_count: spec.restart_count,
        });
        Ok(id)
    }

    /// CreateContainer only. Returns the container id.
    pub async fn create_container(&self, pod: &Pod, spec: &ContainerSpec) -> Result<String> {
        self.create_container_with(pod, container_config(pod, spec))
            .await
    }

    /// CreateContainer with a config built elsewhere. Returns the container id.
    pub async fn create_container_with(
        &self,
        pod: &Pod,
        config: api::ContainerConfig,
    ) -> Result<String> {
        // kubelet creates the container's log directory inside the pod's.
        let log = pod.log_directory.join(&config.log_path);
        if let Some(parent) = log.parent() {
            fs::create_dir_all(parent)?;
        }
        let name = config
            .metadata
            .as_ref()
            .map(|m| m.name.clone())
            .unwrap_or_default();
        let cri = self.cri()?;
        let mut rt = cri.runtime();
        let resp = cri
            .timed(
                "CreateContainer",
                rt.create_container(api::CreateContainerRequest {
                    pod_sandbox_id: pod.sandbox_id.clone(),
                    config: Some(config),
                    sandbox_config: Some(pod.sandbox_config.clone()),
                }),
            )
            .await
            .with_context(|| {
                format!(
                    "CreateContainer {}/{name}:\n{}",
                    pod.name,
                    self.log_tail(15)
                )
            })?;
        Ok(resp.container_id)
    }

    pub async fn start_container(&self, id: &str) -> Result<()> {
        let cri = self.cri()?;
        let mut rt = cri.runtime();
        cri.timed(
            "StartContainer",
            rt.start_container(api::StartContainerRequest {
                container_id: id.to_string(),
            }),
        )
        .await
        .with_context(|| format!("StartContainer {id}:\n{}", self.log_tail(15)))?;
        Ok(())
    }

    /// CRI ExecSync (what kubelet's exec probes use): runs `cmd` in the container through
    /// `runc exec`; returns the exit code and stdout.
    pub async fn exec_sync(
        &self,
        id: &str,
        cmd: &[&str],
        timeout: Duration,
    ) -> Result<(i32, String)> {
        let cri = self.cri()?;
        let mut rt = cri.runtime();
        let resp = cri
            .timed(
                "ExecSync",
                rt.exec_sync(api::ExecSyncRequest {
                    container_id: id.to_string(),
                    cmd: cmd.iter().map(|s| s.to_string()).collect(),
                    timeout: timeout.as_secs() as i64,
                }),
            )
            .await?;
        Ok((
            resp.exit_code,
            String::from_utf8_lossy(&resp.stdout).into_owned(),
        ))
    }

    /// A pod-level memory limit, as kubelet writes it on the pod's cgroup (the runtime never does):
    /// cgroup2 `memory.max` where the memory controller lives there, else the v1 memory
    /// hierarchy's `memory.limit_in_bytes`.
    pub fn limit_pod_memory(&self, pod: &Pod, bytes: u64) -> Result<()> {
        let mounts = observer::cgroup::CgroupMounts::detect(None)?;
        let v2 = mounts.unified().filter(|u| {
            fs::read_to_string(u.mount_point.join("cgroup.controllers"))
                .is_ok_and(|c| c.split_whitespace().any(|c| c == "memory"))
        });
        let (dir, file) = match v2 {
            Some(u) => (u.to_absolute(&pod.cgroup_parent), "memory.max"),
            None => (
                mounts
                    .v1("memory")
                    .context("no memory controller")?
                    .to_absolute(&pod.cgroup_parent),
                "memory.limit_in_bytes",
            ),
        };
        let dir = dir.context("pod cgroup outside the mount")?;
        fs::write(dir.join(file), bytes.to_string())
            .with_context(|| format!("{}/{file}", dir.display()))?;
        Ok(())
    }

    /// StopContainer: SIGTERM, then SIGKILL after `grace`.
    pub async fn stop_container(&self, id: &str, grace: Duration) -> Result<()> {
        let cri = self.cri()?;
        let mut rt = cri.runtime();
        cri.timed(
            "StopContainer",
            rt.stop_container(api::StopContainerRequest {
                container_id: id.to_string(),
                timeout: grace.as_secs() as i64,
            }),
        )
        .await?;
        Ok(())
    }

    pub async fn remove_container(&self, id: &str) -> Result<()> {
        let cri = self.cri()?;
        let mut rt = cri.runtime();
        cri.timed(
            "RemoveContainer",
            rt.remove_container(api::RemoveContainerRequest {
                container_id: id.to_string(),
            }),
        )
        .await?;
        Ok(())
    }

    pub async fn stop_pod(&self, pod: &Pod) -> Result<()> {
        let cri = self.cri()?;
        let mut rt = cri.runtime();
        cri.timed(
            "StopPodSandbox",
            rt.stop_pod_sandbox(api::StopPodSandboxRequest {
                pod_sandbox_id: pod.sandbox_id.clone(),
            }),
        )
        .await?;
        Ok(())
    }

    /// RemovePodSandbox (stopping it first, as the runtime does), then removes the pod cgroup
    /// kubelet would remove.
    pub async fn remove_pod(&self, pod: &Pod) -> Result<()> {
        let cri = self.cri()?;
        let mut rt = cri.runtime();
        cri.timed(
            "RemovePodSandbox",
            rt.remove_pod_sandbox(api::RemovePodSandboxRequest {
                pod_sandbox_id: pod.sandbox_id.clone(),
            }),
        )
        .await?;
        {
            let mut created = self.created.lock().map_err(|_| anyhow!("lock poisoned"))?;
            created.sandboxes.retain(|id| id != &pod.sandbox_id);
            created.cgroups.retain(|cg| cg != &pod.cgroup_parent);
        }
        let parent = pod.cgroup_parent.clone();
        let left = tokio::task::spawn_blocking(move || {
            sys::destroy_cgroup_subtree(&parent, Duration::from_secs(5))
        })
        .await?;
        if !left.is_empty() {
            bail!("pod cgroups not removable: {left:?}");
        }
        Ok(())
    }

    pub async fn container_status(&self, id: &str) -> Result<api::ContainerStatus> {
        Ok(self.cri()?.container_status(id).await?)
    }

    /// containerd's verbose ContainerStatus info: the pid, and the OCI runtime spec it made from
    /// the CRI config (`runtimeSpec`: namespaces, capabilities, mounts, seccomp).
    pub async fn container_info(&self, id: &str) -> Result<serde_json::Value> {
        let cri = self.cri()?;
        let mut rt = cri.runtime();
        let resp = cri
            .timed(
                "ContainerStatus",
                rt.container_status(api::ContainerStatusRequest {
                    container_id: id.to_string(),
                    verbose: true,
                }),
            )
            .await?;
        let info = resp
            .info
            .get("info")
            .context("verbose status has no info")?;
        serde_json::from_str(info).context("parsing verbose info")
    }

    /// The host pid of the container's init (from containerd's verbose ContainerStatus).
    pub async fn container_pid(&self, id: &str) -> Result<u32> {
        self.cri()?
            .container_pid(id)
            .await?
            .ok_or_else(|| anyhow!("container {id} has no pid in its verbose status"))
    }

    /// Polls ContainerStatus until the container has exited, up to `timeout`.
    pub async fn wait_exited(&self, id: &str, timeout: Duration) -> Result<api::ContainerStatus> {
        let deadline = tokio::time::Instant::now() + timeout;
        let exited = api::ContainerState::ContainerExited as i32;
        loop {
            // An async call per check, so not `eventually`: the same deadline, the same poll.
            let st = self.container_status(id).await?;
            if st.state == exited {
                return Ok(st);
            }
            if tokio::time::Instant::now() >= deadline {
                bail!(
                    "container {id} still {:?} after {timeout:?}",
                    api::ContainerState::try_from(st.state)
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stops and removes everything this harness created and deletes its dir. Idempotent; Drop
    /// calls it. Returns what could not be cleaned.
    pub fn teardown(&mut self) -> Result<()> {
        if self.torn_down {
            return Ok(());
        }
        self.torn_down = true;
        if std::thread::panicking() {
            // The runtime's side of a failed test, before its dir goes away.
            eprintln!(
                "containerd log ({}), last lines:\n{}",
                self.dir.display(),
                self.log_tail(40)
            );
        }
        let mut problems = Vec::new();
        let created = std::mem::take(&mut *self.created.lock().unwrap_or_else(|e| e.into_inner()));
        let running = self
            .process
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some();
        *self.client.lock().unwrap_or_else(|e| e.into_inner()) = None;

        // Politely first: the runtime stops containers, removes their mounts, ends the shims.
        if running && !created.sandboxes.is_empty() {
            if let Err(e) = remove_sandboxes_blocking(self.endpoint(), created.sandboxes.clone()) {
                problems.push(format!("removing pods through CRI: {e:#}"));
            }
        }
        let child = self
            .process
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(child) = child {
            if let Err(e) = stop_child(child, StopSignal::Term) {
                problems.push(format!("stopping containerd: {e:#}"));
            }
        }
        problems.extend(force_clean(&self.dir, &self.socket, &created));
        if problems.is_empty() {
            Ok(())
        } else {
            bail!(
                "teardown of {} incomplete:\n{}",
                self.dir.display(),
                problems.join("\n")
            )
        }
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        if let Err(e) = self.teardown() {
            eprintln!("observer-tests: {e:#}");
        }
    }
}

/// What a container printed, from its CRI log file.
#[derive(Debug, Clone, Default)]
pub struct ContainerLog {
    /// stdout and stderr, interleaved as written.
    pub all: String,
    pub stdout: String,
    pub stderr: String,
}

/// Reads the CRI log (`<time> <stream> <tag> <line>` per line) of the container whose config had
/// `log_path`, in `pod`; empty if there is none yet.
pub fn read_container_log(pod: &Pod, log_path: &str) -> ContainerLog {
    let text = fs::read_to_string(pod.log_directory.join(log_path)).unwrap_or_default();
    let (mut all, mut stdout, mut stderr) = (Vec::new(), Vec::new(), Vec::new());
    for parts in text.lines().map(|l| l.splitn(4, ' ').collect::<Vec<_>>()) {
        if let [_, stream, _, line] = parts.as_slice() {
            all.push(*line);
            match *stream {
                "stdout" => stdout.push(*line),
                "stderr" => stderr.push(*line),
                _ => {}
            }
        }
    }
    ContainerLog {
        all: all.join("\n"),
        stdout: stdout.join("\n"),
        stderr: stderr.join("\n"),
    }
}

/// The CRI removals of teardown, on a runtime of their own: Drop may run inside a test's runtime
/// (where blocking on another future is not allowed) or outside any.
fn remove_sandboxes_blocking(endpoint: CriEndpoint, ids: Vec<String>) -> Result<()> {
    std::thread::spawn(move || -> Result<()> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(async {
            let config = CriConfig::new(endpoint).call_timeout(Duration::from_secs(20));
            let cri = CriClient::connect(&config).await?;
            let mut errors = Vec::new();
            for id in ids {
                let mut rt = cri.runtime();
                let req = api::RemovePodSandboxRequest {
                    pod_sandbox_id: id.clone(),
                };
                if let Err(e) = cri
                    .timed("RemovePodSandbox", rt.remove_pod_sandbox(req))
                    .await
                {
                    errors.push(format!("{id}: {e}"));
                }
            }
            if errors.is_empty() {
                Ok(())
            } else {
                bail!("{}", errors.join("; "))
            }
        })
    })
    .join()
    .map_err(|_| anyhow!("teardown thread panicked"))?
}

fn stop_child(mut child: Child, how: StopSignal) -> Result<()> {
    let pid = child.id();
    sys::signal(
        pid,
        match how {
            StopSignal::Kill => Signal::SIGKILL,
            StopSignal::Term => Signal::SIGTERM,
        },
    );
    if crate::wait::eventually(Duration::from_secs(10), || {
        child.try_wait().map_or(true, |s| s.is_some())
    }) {
        return Ok(());
    }
    sys::signal(pid, Signal::SIGKILL);
    child.wait()?;
    bail!("containerd {pid} ignored {how:?} for 10 s; killed");
}

/// Removes what is left under `dir` without asking containerd: kills its processes (containerd,
/// shims) and the pods' processes, removes pod cgroups, shim sockets and mounts, then the dir.
fn force_clean(dir: &Path, socket: &Path, created: &Created) -> Vec<String> {
    let mut problems = Vec::new();
    let needle = dir.to_string_lossy().into_owned();
    let leftovers = sys::pids_with_cmdline(&needle);
    for &pid in &leftovers {
        sys::signal(pid, Signal::SIGKILL);
    }
    for &pid in &leftovers {
        if !sys::wait_gone(pid, Duration::from_secs(5)) {
            problems.push(format!("process {pid} survived SIGKILL"));
        }
    }
    for parent in &created.cgroups {
        let left = sys::destroy_cgroup_subtree(parent, Duration::from_secs(5));
        if !left.is_empty() {
            problems.push(format!("cgroups left: {left:?}"));
        }
    }
    for id in &created.sandboxes {
        let _ = fs::remove_file(shim_socket(socket, "k8s.io", id));
    }
    let still = sys::unmount_all(dir);
    if !still.is_empty() {
        problems.push(format!("still mounted: {still:?}"));
    }
    if let Err(e) = fs::remove_dir_all(dir) {
        if dir.exists() {
            problems.push(format!("removing {}: {e}", dir.display()));
        }
    }
    problems
}

/// Where containerd 1.6 puts the shim socket of the task group `id` (the sandbox id for CRI).
fn shim_socket(containerd_socket: &Path, namespace: &str, id: &str) -> PathBuf {
    let key = containerd_socket.join(namespace).join(id);
    let hash = Sha256::digest(key.as_os_str().as_encoded_bytes());
    Path::new(SHIM_SOCKET_DIR).join(format!("{hash:x}"))
}

/// Removes harness dirs whose owning test process is gone (killed, or crashed without unwinding).
fn cleanup_stale() {
    let Ok(entries) = fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().starts_with(DIR_PREFIX) {
            continue;
        }
        let dir = entry.path();
        if !is_stale(&dir) {
            continue;
        }
        tracing::warn!(dir = %dir.display(), "cleaning up a crashed harness run");
        if let Ok(pidfile) = fs::read_to_string(dir.join("containerd.pid")) {
            if let Some((pid, started)) = parse_pid_file(&pidfile) {
                if sys::alive(pid, started) {
                    sys::signal(pid, Signal::SIGKILL);
                    sys::wait_gone(pid, Duration::from_secs(5));
                }
            }
        }
        let lines = |file: &str| -> Vec<String> {
            fs::read_to_string(dir.join(file))
                .unwrap_or_default()
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(String::from)
                .collect()
        };
        let created = Created {
            sandboxes: lines("sandboxes"),
            cgroups: lines("cgroups"),
        };
        let problems = force_clean(&dir, &dir.join("containerd.sock"), &created);
        if !problems.is_empty() {
            tracing::warn!(dir = %dir.display(), ?problems, "stale harness dir not fully cleaned");
        }
    }
}

fn is_stale(dir: &Path) -> bool {
    match fs::read_to_string(dir.join("owner"))
        .ok()
        .as_deref()
        .and_then(parse_pid_file)
    {
        Some((pid, started)) => !sys::alive(pid, started),
        // No owner yet: a run between mkdir and writing it, unless that was long ago.
        None => dir
            .metadata()
            .and_then(|m| m.modified())
            .map(|t| t.elapsed().unwrap_or_default() > Duration::from_secs(120))
            .unwrap_or(false),
    }
}

fn parse_pid_file(s: &str) -> Option<(u32, u64)> {
    let mut it = s.split_whitespace();
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

/// Tries an overlay mount in `dir`: some filesystems (overlay itself, some tmpfs setups) cannot be
/// an upper dir.
fn overlay_works(dir: &Path) -> bool {
    let probe = dir.join("overlay-probe");
    let [lower, upper, work, merged] = ["lower", "upper", "work", "merged"].map(|d| probe.join(d));
    let ok = (|| -> Result<()> {
        for d in [&lower, &upper, &work, &merged] {
            fs::create_dir_all(d)?;
        }
        let opts = format!(
            "lowerdir={},upperdir={},workdir={}",
            lower.display(),
            upper.display(),
            work.display()
        );
        nix::mount::mount(
            Some("overlay"),
            &merged,
            Some("overlay"),
            nix::mount::MsFlags::empty(),
            Some(opts.as_str()),
        )?;
        nix::mount::umount2(&merged, nix::mount::MntFlags::MNT_DETACH)?;
        Ok(())
    })();
    if let Err(e) = &ok {
        tracing::warn!(error = %e, "overlay mounts do not work here; using the native snapshotter");
    }
    let _ = fs::remove_dir_all(&probe);
    ok.is_ok()
}

fn import_images(dir: &Path, socket: &Path, snapshotter: &str) -> Result<()> {
    let busybox = crate::prereq::which("busybox").context("busybox not found")?;
    let archive = dir.join("images.tar");
    observer_image::busybox::write_archive(&busybox, &archive)?;
    image::import(socket, &archive, snapshotter)?;
    let _ = fs::remove_file(&archive);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_logs_split_by_stream() {
        let dir = tempfile::tempdir().unwrap();
        let pod = Pod {
            sandbox_id: String::new(),
            name: "p".into(),
            namespace: "n".into(),
            uid: "u".into(),
            qos: crate::Qos::BestEffort,
            cgroup_parent: String::new(),
            pid: crate::pod::PidMode::Container,
            log_directory: dir.path().to_path_buf(),
            sandbox_config: Default::default(),
            containers: vec![],
        };
        fs::create_dir_all(dir.path().join("c")).unwrap();
        fs::write(
            dir.path().join("c/0.log"),
            "2026-01-01T00:00:00Z stdout F {\"a\": 1}\n2026-01-01T00:00:00Z stderr F warn: x y\n",
        )
        .unwrap();
        let log = read_container_log(&pod, "c/0.log");
        assert_eq!(log.stdout, "{\"a\": 1}");
        assert_eq!(log.stderr, "warn: x y");
        assert_eq!(log.all, "{\"a\": 1}\nwarn: x y");
        assert!(read_container_log(&pod, "none/0.log").all.is_empty());
    }

    #[test]
    fn pid_files_parse() {
        assert_eq!(parse_pid_file("12 345\n"), Some((12, 345)));
        assert_eq!(parse_pid_file("12"), None);
        assert_eq!(parse_pid_file(""), None);
    }

    #[test]
    fn dir_of_a_dead_owner_is_stale_and_a_live_one_is_not() {
        let base = tempfile::tempdir().unwrap();
        let live = base.path().join("live");
        let dead = base.path().join("dead");
        fs::create_dir_all(&live).unwrap();
        fs::create_dir_all(&dead).unwrap();
        let me = std::process::id();
        let t = sys::start_time(me).unwrap();
        fs::write(live.join("owner"), format!("{me} {t}")).unwrap();
        // Same pid, other start time: the pid was reused by another process.
        fs::write(dead.join("owner"), format!("{me} {}", t + 1)).unwrap();
        assert!(!is_stale(&live));
        assert!(is_stale(&dead));
        // A fresh dir without owner is a run still starting.
        assert!(!is_stale(base.path()));
    }

    #[test]
    fn shim_socket_matches_containerd_layout() {
        let p = shim_socket(Path::new("/tmp/x/containerd.sock"), "k8s.io", "abc");
        let expected = format!("{:x}", Sha256::digest(b"/tmp/x/containerd.sock/k8s.io/abc"));
        assert_eq!(p, Path::new(SHIM_SOCKET_DIR).join(expected));
    }
}
