//! Fixtures for tests that run against the real kernel: private cgroups, processes started inside
//! them, and the probes loaded to watch exactly those cgroups.
use std::{
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicU32, Ordering},
    time::Duration,
};

use anyhow::{anyhow, bail, Context};
use observer::{
    cgroup::{cgroup_id, CgroupMounts, HierarchyMount, KubeRoots},
    kernel::{EventReader, KernelEvent, ProbeOptions, Probes, Watch, WatchRoot},
    pipeline::{KernelPipeline, PipelineConfig},
    pleg::{PlegReceiver, PodLifecycleEvent},
};

/// The `observer-workload` binary built with this crate.
pub fn workload() -> PathBuf {
    // Integration tests run from target/<profile>/deps; the binary sits one level up.
    let exe = std::env::current_exe().expect("current_exe");
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    let path = dir.join("observer-workload");
    assert!(
        path.exists(),
        "{} missing: build with `cargo test -p observer-tests` (it builds the bin)",
        path.display()
    );
    path
}

static SEQ: AtomicU32 = AtomicU32::new(0);

/// The one cgroup fixture: a cgroup of our own, on the cgroup2 hierarchy by default or on any
/// hierarchy given (and, for memory limits where the memory controller lives on a v1 hierarchy as
/// on hybrid hosts, a twin on the v1 memory hierarchy). Removed on drop, after killing whatever is
/// left inside, also when the test panicked.
pub struct TestCgroup {
    /// Relative to the hierarchy's root, e.g. `/observer-test-123-4-name`.
    pub rel: String,
    /// Absolute path of this cgroup's directory.
    pub dir: PathBuf,
    pub mount: HierarchyMount,
    v1_memory: Option<PathBuf>,
    /// Twins on the v1 memory hierarchy of cgroups below this one given a limit
    /// ([`Self::limit_memory_of`]): (hierarchy-relative path, twin directory), removed on drop.
    v1_twins: Vec<(String, PathBuf)>,
    /// Directories created below `dir`, removed deepest first.
    created: Vec<PathBuf>,
}

impl TestCgroup {
    /// A fresh top-level cgroup `/observer-test-<pid>-<seq>-<name>` on the cgroup2 hierarchy.
    pub fn new(name: &str) -> anyhow::Result<Self> {
        let mounts = CgroupMounts::detect(None)?;
        let unified = mounts
            .unified()
            .cloned()
            .ok_or_else(|| anyhow!("no cgroup2 mount"))?;
        Self::in_hierarchy(&unified, name)
    }

    /// A fresh cgroup below the root of `mount` (any hierarchy, v1 or v2).
    pub fn in_hierarchy(mount: &HierarchyMount, name: &str) -> anyhow::Result<Self> {
        // Paths are handed to a shell word by word (`spawn_in`).
        anyhow::ensure!(
            !name.contains(char::is_whitespace),
            "a test cgroup's name has no spaces: {name:?}"
        );
        let rel = format!(
            "{}/observer-test-{}-{}-{name}",
            mount.root.trim_end_matches('/'),
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let dir = mount
            .to_absolute(&rel)
            .ok_or_else(|| anyhow!("{rel} is outside {}", mount.mount_point.display()))?;
        fs::create_dir(&dir).with_context(|| format!("mkdir {}", dir.display()))?;
        Ok(Self {
            rel,
            dir,
            mount: mount.clone(),
            v1_memory: None,
            v1_twins: Vec::new(),
            created: Vec::new(),
        })
    }

    pub fn id(&self) -> u64 {
        cgroup_id(&self.dir).expect("cgroup id")
    }

    /// Nesting depth below the hierarchy root, as `bpf_get_current_ancestor_cgroup_id` counts it.
    pub fn level(&self) -> u32 {
        self.rel.split('/').filter(|c| !c.is_empty()).count() as u32
    }

    /// kubelet's roots for a tree the test laid out below this cgroup: `below` itself when it
    /// names a kubepods cgroup, else both drivers' kubepods cgroups below it (the harness lays
    /// out either driver's names below one prefix).
    pub fn kube_roots(&self, below: &str) -> anyhow::Result<KubeRoots> {
        let base = self.rel(below);
        let base = base.trim_end_matches('/');
        let named = base.ends_with("/kubepods") || base.ends_with("kubepods.slice");
        Ok(if named {
            KubeRoots::new([base])?
        } else {
            KubeRoots::new([format!("{base}/kubepods"), format!("{base}/kubepods.slice")])?
        })
    }

    pub fn watch_root(&self) -> WatchRoot {
        WatchRoot {
            id: self.id(),
            level: self.level(),
            _pad: 0,
        }
    }

    /// Creates `sub` (may contain '/') below this cgroup; returns its hierarchy-relative path.
    pub fn mkdir(&mut self, sub: &str) -> anyhow::Result<String> {
        let mut path = self.dir.clone();
        for part in sub.split('/').filter(|c| !c.is_empty()) {
            path.push(part);
            if !path.exists() {
                fs::create_dir(&path).with_context(|| format!("mkdir {}", path.display()))?;
                self.created.push(path.clone());
            }
        }
        Ok(self.mount.to_relative(&path).expect("inside the mount"))
    }

    /// `sub` below this cgroup, hierarchy-relative.
    pub fn rel(&self, sub: &str) -> String {
        format!("{}/{}", self.rel, sub.trim_start_matches('/'))
    }

    pub fn abs(&self, rel: &str) -> PathBuf {
        self.mount.to_absolute(rel).expect("inside the mount")
    }

    /// Limits memory: cgroup2 `memory.max` where the controller is on cgroup2, else the v1
    /// memory hierarchy's `memory.limit_in_bytes` on a twin cgroup.
    pub fn limit_memory(&mut self, bytes: u64) -> anyhow::Result<()> {
        let controllers = fs::read_to_string(self.mount.mount_point.join("cgroup.controllers"))
            .unwrap_or_default();
        if controllers.split_whitespace().any(|c| c == "memory") {
            fs::write(
                self.mount.mount_point.join("cgroup.subtree_control"),
                "+memory",
            )
            .context("enable memory controller")?;
            fs::write(self.dir.join("memory.max"), bytes.to_string()).context("memory.max")?;
            return Ok(());
        }
        self.v1_memory = Some(v1_twin(&self.rel, bytes)?);
        Ok(())
    }

    /// Limits the memory of `rel`, a cgroup below this one made by [`Self::mkdir`] (a pod's or a
    /// container's, as kubelet limits them): `memory.max` where the controller is on cgroup2
    /// (enabled down the way), else `memory.limit_in_bytes` of its twin on the v1 memory
    /// hierarchy, which [`Self::spawn_in`] then also moves the process into.
    pub fn limit_memory_of(&mut self, rel: &str, bytes: u64) -> anyhow::Result<()> {
        let controllers = fs::read_to_string(self.mount.mount_point.join("cgroup.controllers"))
            .unwrap_or_default();
        if controllers.split_whitespace().any(|c| c == "memory") {
            let target = self.abs(rel);
            let mut dir = self.mount.mount_point.clone();
            for part in target
                .strip_prefix(&self.mount.mount_point)
                .context("below the mount")?
                .components()
            {
                fs::write(dir.join("cgroup.subtree_control"), "+memory")
                    .with_context(|| format!("enable memory in {}", dir.display()))?;
                dir.push(part);
            }
            fs::write(target.join("memory.max"), bytes.to_string()).context("memory.max")?;
            return Ok(());
        }
        let dir = v1_twin(rel, bytes)?;
        self.v1_twins.push((rel.to_string(), dir));
        Ok(())
    }

    /// Starts `program args` inside `rel` (this cgroup or one made by [`Self::mkdir`]): a shell
    /// moves itself into the cgroup, then execs the program, so the program's exec is the first
    /// event inside the cgroup, as with runc. Returns once the process is in the cgroup.
    pub fn spawn_in(&self, rel: &str, program: &Path, args: &[&str]) -> anyhow::Result<Child> {
        let mut procs = vec![self.abs(rel).join("cgroup.procs")];
        // The deepest v1 twin at or above `rel`, else this cgroup's own.
        let twin = self
            .v1_twins
            .iter()
            .filter(|(t, _)| rel == t || rel.starts_with(&format!("{t}/")))
            .max_by_key(|(t, _)| t.len())
            .map(|(_, d)| d)
            .or(self.v1_memory.as_ref());
        if let Some(v1) = twin {
            procs.push(v1.join("cgroup.procs"));
        }
        let list: Vec<String> = procs.iter().map(|p| p.display().to_string()).collect();
        let child = Command::new("/bin/sh")
            .arg("-c")
            .arg(r#"for p in $OBSERVER_TEST_PROCS; do echo $$ > "$p" || exit 125; done; exec "$@""#)
            .arg("sh")
            .arg(program)
            .args(args)
            .env("OBSERVER_TEST_PROCS", list.join(" "))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("spawn")?;
        let pid = child.id();
        // Joined, or already done (a zombie is no longer listed in cgroup.procs).
        let joined = crate::wait::eventually(Duration::from_secs(10), || {
            read_procs(&procs[0]).contains(&pid) || exited(pid)
        });
        anyhow::ensure!(joined, "process {pid} never joined {rel}");
        Ok(child)
    }

    pub fn spawn(&self, program: &Path, args: &[&str]) -> anyhow::Result<Child> {
        self.spawn_in(&self.rel.clone(), program, args)
    }

    fn kill_all(dir: &Path) {
        crate::wait::eventually(Duration::from_secs(1), || {
            let pids = read_procs(&dir.join("cgroup.procs"));
            for &pid in &pids {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            pids.is_empty()
        });
    }

    fn remove(dir: &Path) {
        Self::kill_all(dir);
        let removed =
            crate::wait::eventually(Duration::from_secs(1), || match fs::remove_dir(dir) {
                Ok(()) => true,
                Err(e) => e.kind() == std::io::ErrorKind::NotFound,
            });
        if !removed {
            eprintln!("warning: could not remove test cgroup {}", dir.display());
        }
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        for dir in self.created.iter().rev() {
            Self::remove(dir);
        }
        Self::remove(&self.dir);
        // Each twin and the directories made above it, up to this cgroup's own name.
        let own = Path::new(&self.rel).file_name().map(|n| n.to_os_string());
        self.v1_twins
            .sort_by_key(|(rel, _)| std::cmp::Reverse(rel.len()));
        for (_, twin) in &self.v1_twins {
            Self::remove(twin);
            // The directories made above it go once the last twin below them did.
            for dir in twin.ancestors().skip(1) {
                let top = dir.file_name().map(|n| n.to_os_string()) == own;
                if fs::remove_dir(dir).is_err() || top {
                    break;
                }
            }
        }
        if let Some(v1) = &self.v1_memory {
            Self::remove(v1);
        }
    }
}

/// `rel`'s twin on the v1 memory hierarchy (made with its parents), limited to `bytes`.
fn v1_twin(rel: &str, bytes: u64) -> anyhow::Result<PathBuf> {
    let mounts = CgroupMounts::detect(None)?;
    let mem = mounts
        .v1("memory")
        .ok_or_else(|| anyhow!("no memory controller on cgroup2 nor on a v1 hierarchy"))?;
    let dir = mem
        .to_absolute(rel)
        .ok_or_else(|| anyhow!("v1 memory mount does not show {rel}"))?;
    fs::create_dir_all(&dir).with_context(|| format!("mkdir {}", dir.display()))?;
    fs::write(dir.join("memory.limit_in_bytes"), bytes.to_string())
        .context("memory.limit_in_bytes")?;
    // No swap on these hosts, but if there is, keep the limit a hard one.
    let _ = fs::write(dir.join("memory.memsw.limit_in_bytes"), bytes.to_string());
    let _ = fs::write(dir.join("memory.swappiness"), "0");
    Ok(dir)
}

/// The process is a zombie or gone.
fn exited(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| {
        s.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state == "Z" || state == "X")
    })
}

/// Pids listed in a `cgroup.procs` file (empty when it is gone).
pub fn read_procs(path: &Path) -> Vec<u32> {
    fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// Probes loaded for one test, with the events they saw so far.
pub struct KernelWatch {
    pub probes: Probes,
    pub reader: EventReader,
    pub seen: Vec<KernelEvent>,
}

impl KernelWatch {
    /// Loads the probes watching exec/exit under `roots` only.
    pub fn roots(roots: &[WatchRoot]) -> anyhow::Result<Self> {
        Self::with(ProbeOptions {
            watch: Watch::Roots(roots.to_vec()),
            ..Default::default()
        })
    }

    pub fn with(opts: ProbeOptions) -> anyhow::Result<Self> {
        let mut probes = Probes::load(&opts)?;
        let reader = probes.events()?;
        Ok(Self {
            probes,
            reader,
            seen: Vec::new(),
        })
    }

    /// Reads events until `done(all events so far)` holds, or fails after `timeout` with what was
    /// seen, so a failing test shows the kernel's side of the story.
    pub async fn until(
        &mut self,
        timeout: Duration,
        mut done: impl FnMut(&[KernelEvent]) -> bool,
    ) -> anyhow::Result<&[KernelEvent]> {
        let deadline = tokio::time::Instant::now() + timeout;
        while !done(&self.seen) {
            match tokio::time::timeout_at(deadline, self.reader.next()).await {
                Ok(ev) => self.seen.push(ev?),
                Err(_) => bail!(
                    "timed out after {timeout:?}; events seen:\n{:#?}",
                    self.seen
                ),
            }
        }
        Ok(&self.seen)
    }

    /// Collects whatever arrives for `window` (to show that something did NOT happen).
    pub async fn settle(&mut self, window: Duration) -> anyhow::Result<&[KernelEvent]> {
        let deadline = tokio::time::Instant::now() + window;
        while let Ok(ev) = tokio::time::timeout_at(deadline, self.reader.next()).await {
            self.seen.push(ev?);
        }
        Ok(&self.seen)
    }
}

/// True when the kernel tests can run: root and kernel BTF. Otherwise says why and skips, or
/// fails under `CI=true`.
pub fn require_kernel() -> bool {
    let mut missing = Vec::new();
    if !nix::unistd::geteuid().is_root() {
        missing.push("root (run as uid 0)".to_string());
    }
    if !Path::new(observer::kernel::btf::VMLINUX).exists() {
        missing.push(format!("kernel BTF at {}", observer::kernel::btf::VMLINUX));
    }
    crate::prereq::require("this kernel test", &missing)
}

/// The production kernel pipeline ([`KernelPipeline`]) watching one test cgroup: probes filtered
/// to `cg`, the start-up walk of `cg.rel + scan_below` (where the test laid out its kubepods tree).
pub struct PlegWatch {
    pub pipeline: KernelPipeline,
    pub rx: PlegReceiver,
    /// Lifecycle events so far.
    pub events: Vec<PodLifecycleEvent>,
    /// Kernel events so far (shown when a wait times out).
    pub kernel: Vec<KernelEvent>,
}

impl PlegWatch {
    pub fn new(cg: &TestCgroup, scan_below: &str) -> anyhow::Result<Self> {
        Self::with(cg, scan_below, ProbeOptions::default())
    }

    /// [`Self::new`] with probe options (the watch roots are set to `cg`).
    pub fn with(cg: &TestCgroup, scan_below: &str, opts: ProbeOptions) -> anyhow::Result<Self> {
        let (pipeline, rx) = KernelPipeline::start(PipelineConfig {
            unified: cg.mount.clone(),
            roots: cg.kube_roots(scan_below)?,
            probes: ProbeOptions {
                watch: Watch::Roots(vec![cg.watch_root()]),
                ..opts
            },
            queue: 1 << 16,
        })?;
        let mut me = Self {
            pipeline,
            rx,
            events: Vec::new(),
            kernel: Vec::new(),
        };
        me.drain();
        Ok(me)
    }

    fn drain(&mut self) {
        while let Some(ev) = self.rx.try_recv() {
            self.events.push(ev);
        }
    }

    /// Runs the pipeline until `done(lifecycle events so far)`, or fails after `timeout` with
    /// both the lifecycle and the kernel events seen.
    pub async fn until(
        &mut self,
        timeout: Duration,
        mut done: impl FnMut(&[PodLifecycleEvent]) -> bool,
    ) -> anyhow::Result<&[PodLifecycleEvent]> {
        let deadline = tokio::time::Instant::now() + timeout;
        self.drain();
        while !done(&self.events) {
            let kernel = &mut self.kernel;
            let batch = self.pipeline.next_batch(|ev| kernel.push(ev.clone()));
            match tokio::time::timeout_at(deadline, batch).await {
                Ok(b) => {
                    b?;
                    self.drain();
                }
                Err(_) => bail!(
                    "timed out after {timeout:?}; lifecycle events:\n{:#?}\nkernel events:\n{:#?}",
                    self.events,
                    self.kernel
                ),
            }
        }
        Ok(&self.events)
    }
}

/// One `observer-workload hog` (a CPU-bound loop at normal priority) per core, or `n`; killed on
/// drop. The benches' "every core busy".
pub struct Hogs(Vec<std::process::Child>);

impl Hogs {
    /// One per core.
    pub fn per_core() -> std::io::Result<Self> {
        Self::start(std::thread::available_parallelism().map_or(1, |n| n.get()))
    }

    pub fn start(n: usize) -> std::io::Result<Self> {
        (0..n)
            .map(|_| {
                std::process::Command::new(workload())
                    .arg("hog")
                    .stdin(std::process::Stdio::null())
                    .stdout(std::process::Stdio::null())
                    .spawn()
            })
            .collect::<std::io::Result<Vec<_>>>()
            .map(Self)
    }

    pub fn pids(&self) -> Vec<u32> {
        self.0.iter().map(|c| c.id()).collect()
    }
}

impl Drop for Hogs {
    fn drop(&mut self) {
        for h in &mut self.0 {
            let _ = h.kill();
            let _ = h.wait();
        }
    }
}
