//! Fixtures for tests that run against the real kernel: private cgroups, processes started inside
//! them, and the probes loaded to watch exactly those cgroups.
use std::{
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, Instant},
};

use anyhow::{anyhow, bail, Context};
use observer::{
    cgroup::{cgroup_id, CgroupMounts, HierarchyMount},
    kernel::{EventReader, KernelEvent, ProbeOptions, Probes, Watch, WatchRoot},
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

/// A cgroup of our own on the cgroup2 hierarchy (and, when the memory controller lives on a v1
/// hierarchy as on hybrid hosts, a twin on the v1 memory hierarchy for limits). Removed on drop,
/// after killing whatever is left inside.
pub struct TestCgroup {
    /// Relative to the cgroup2 root, e.g. `/observer-test-123-4`.
    pub rel: String,
    pub v2: PathBuf,
    v1_memory: Option<PathBuf>,
    pub unified: HierarchyMount,
    /// Directories created below `v2` (and their v1 twins), removed deepest first.
    created: Vec<PathBuf>,
}

impl TestCgroup {
    /// A fresh top-level cgroup `/observer-test-<pid>-<seq>-<name>`.
    pub fn new(name: &str) -> anyhow::Result<Self> {
        let mounts = CgroupMounts::detect(None)?;
        let unified = mounts
            .unified()
            .cloned()
            .ok_or_else(|| anyhow!("no cgroup2 mount"))?;
        let rel = format!(
            "/observer-test-{}-{}-{name}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let v2 = unified.to_absolute(&rel).expect("inside the mount");
        fs::create_dir(&v2).with_context(|| format!("mkdir {}", v2.display()))?;
        Ok(Self {
            rel,
            v2,
            v1_memory: None,
            unified,
            created: Vec::new(),
        })
    }

    pub fn id(&self) -> u64 {
        cgroup_id(&self.v2).expect("cgroup id")
    }

    /// Nesting depth below the hierarchy root, as `bpf_get_current_ancestor_cgroup_id` counts it.
    pub fn level(&self) -> u32 {
        self.rel.split('/').filter(|c| !c.is_empty()).count() as u32
    }

    pub fn watch_root(&self) -> WatchRoot {
        WatchRoot {
            id: self.id(),
            level: self.level(),
            _pad: 0,
        }
    }

    /// Creates `sub` (may contain '/') below this cgroup; returns its relative path.
    pub fn mkdir(&mut self, sub: &str) -> anyhow::Result<String> {
        let mut path = self.v2.clone();
        for part in sub.split('/').filter(|c| !c.is_empty()) {
            path.push(part);
            if !path.exists() {
                fs::create_dir(&path).with_context(|| format!("mkdir {}", path.display()))?;
                self.created.push(path.clone());
            }
        }
        Ok(self.unified.to_relative(&path).expect("inside the mount"))
    }

    pub fn abs(&self, rel: &str) -> PathBuf {
        self.unified.to_absolute(rel).expect("inside the mount")
    }

    /// Limits memory: cgroup2 `memory.max` where the controller is on cgroup2, else the v1
    /// memory hierarchy's `memory.limit_in_bytes` on a twin cgroup.
    pub fn limit_memory(&mut self, bytes: u64) -> anyhow::Result<()> {
        let controllers = fs::read_to_string(self.unified.mount_point.join("cgroup.controllers"))
            .unwrap_or_default();
        if controllers.split_whitespace().any(|c| c == "memory") {
            fs::write(
                self.unified.mount_point.join("cgroup.subtree_control"),
                "+memory",
            )
            .context("enable memory controller")?;
            fs::write(self.v2.join("memory.max"), bytes.to_string()).context("memory.max")?;
            return Ok(());
        }
        let mounts = CgroupMounts::detect(None)?;
        let mem = mounts
            .v1("memory")
            .ok_or_else(|| anyhow!("no memory controller on cgroup2 nor on a v1 hierarchy"))?;
        let dir = mem
            .to_absolute(&self.rel)
            .ok_or_else(|| anyhow!("v1 memory mount does not show {}", self.rel))?;
        fs::create_dir_all(&dir).with_context(|| format!("mkdir {}", dir.display()))?;
        fs::write(dir.join("memory.limit_in_bytes"), bytes.to_string())
            .context("memory.limit_in_bytes")?;
        // No swap on these hosts, but if there is, keep the limit a hard one.
        let _ = fs::write(dir.join("memory.memsw.limit_in_bytes"), bytes.to_string());
        let _ = fs::write(dir.join("memory.swappiness"), "0");
        self.v1_memory = Some(dir);
        Ok(())
    }

    /// Starts `program args` inside `rel` (this cgroup or one made by [`Self::mkdir`]): a shell
    /// moves itself into the cgroup, then execs the program, so the program's exec is the first
    /// event inside the cgroup, as with runc.
    pub fn spawn_in(&self, rel: &str, program: &Path, args: &[&str]) -> anyhow::Result<Child> {
        let mut procs = vec![self.abs(rel).join("cgroup.procs")];
        if let Some(v1) = &self.v1_memory {
            procs.push(v1.join("cgroup.procs"));
        }
        let list: Vec<String> = procs.iter().map(|p| p.display().to_string()).collect();
        Command::new("/bin/sh")
            .arg("-c")
            .arg(r#"for p in $OBSERVER_TEST_PROCS; do echo $$ > "$p" || exit 125; done; exec "$@""#)
            .arg("sh")
            .arg(program)
            .args(args)
            .env("OBSERVER_TEST_PROCS", list.join(" "))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("spawn")
    }

    pub fn spawn(&self, program: &Path, args: &[&str]) -> anyhow::Result<Child> {
        self.spawn_in(&self.rel.clone(), program, args)
    }

    fn kill_all(dir: &Path) {
        for _ in 0..50 {
            let pids = fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
            if pids.trim().is_empty() {
                return;
            }
            for pid in pids.lines().filter_map(|p| p.trim().parse::<i32>().ok()) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn remove(dir: &Path) {
        Self::kill_all(dir);
        for _ in 0..50 {
            match fs::remove_dir(dir) {
                Ok(()) => return,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        eprintln!("warning: could not remove test cgroup {}", dir.display());
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        for dir in self.created.iter().rev() {
            Self::remove(dir);
        }
        Self::remove(&self.v2);
        if let Some(v1) = &self.v1_memory {
            Self::remove(v1);
        }
    }
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
        let deadline = Instant::now() + timeout;
        while !done(&self.seen) {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, self.reader.next()).await {
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
        let deadline = Instant::now() + window;
        while let Ok(ev) = tokio::time::timeout(
            deadline.saturating_duration_since(Instant::now()),
            self.reader.next(),
        )
        .await
        {
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

/// The PLEG on top of [`KernelWatch`], synced with the cgroups under a test root at start.
pub struct PlegWatch {
    pub watch: KernelWatch,
    pub pleg: observer::pleg::Pleg,
    pub rx: observer::pleg::PlegReceiver,
    pub events: Vec<observer::pleg::PodLifecycleEvent>,
    scan_root: String,
}

impl PlegWatch {
    /// Probes watching `cg`, and a PLEG that first walks `cg.rel + scan_below` (where the test
    /// laid out its kubepods tree) for containers that already run.
    pub fn new(cg: &TestCgroup, scan_below: &str) -> anyhow::Result<Self> {
        Self::with(cg, scan_below, ProbeOptions::default())
    }

    /// [`Self::new`] with probe options (the watch roots are set to `cg`).
    pub fn with(cg: &TestCgroup, scan_below: &str, opts: ProbeOptions) -> anyhow::Result<Self> {
        let watch = KernelWatch::with(ProbeOptions {
            watch: Watch::Roots(vec![cg.watch_root()]),
            ..opts
        })?;
        let (tx, rx) = observer::pleg::channel(1 << 16);
        let mut pleg =
            observer::pleg::Pleg::new(observer::cgroup::CgroupIndex::new(cg.unified.clone()), tx);
        let scan_root = format!("{}/{}", cg.rel, scan_below.trim_start_matches('/'));
        pleg.rescan(&[&scan_root])?;
        let mut me = Self {
            watch,
            pleg,
            rx,
            events: Vec::new(),
            scan_root,
        };
        me.drain();
        Ok(me)
    }

    fn drain(&mut self) {
        while let Some(ev) = self.rx.try_recv() {
            self.events.push(ev);
        }
    }

    /// Feeds kernel events to the PLEG until `done(lifecycle events so far)`.
    pub async fn until(
        &mut self,
        timeout: Duration,
        mut done: impl FnMut(&[observer::pleg::PodLifecycleEvent]) -> bool,
    ) -> anyhow::Result<&[observer::pleg::PodLifecycleEvent]> {
        let deadline = Instant::now() + timeout;
        self.drain();
        while !done(&self.events) {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, self.watch.reader.next()).await {
                Ok(ev) => {
                    let ev = ev?;
                    self.watch.seen.push(ev.clone());
                    self.pleg.handle(ev);
                    if self.pleg.needs_resync() {
                        self.pleg.rescan(&[&self.scan_root])?;
                    }
                    self.drain();
                }
                Err(_) => bail!(
                    "timed out after {timeout:?}; lifecycle events:\n{:#?}\nkernel events:\n{:#?}",
                    self.events,
                    self.watch.seen
                ),
            }
        }
        Ok(&self.events)
    }
}
