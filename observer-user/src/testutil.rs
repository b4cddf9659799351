//! Test helpers shared by the library's unit tests: the root check (which fails instead of
//! skipping under CI=true), and private cgroup trees created under a real hierarchy and removed
//! (processes killed, directories removed bottom-up) when dropped, also after a failed assert.
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::cgroup::HierarchyMount;

/// Whether a test that writes to cgroupfs may run. Under `CI=true` not being root fails the test
/// instead of skipping it, so CI cannot go green without running it.
pub(crate) fn require_root(test: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{test}: needs root, and CI=true does not allow skipping"
    );
    eprintln!("skipping {test}: needs root");
    false
}

pub(crate) struct TestTree {
    pub mount: HierarchyMount,
    /// Hierarchy-relative path of the tree's top directory.
    pub rel_root: String,
    pub abs_root: PathBuf,
    children: Vec<Child>,
}

impl TestTree {
    /// `<mount>/observer-test-<pid>-<tag>`; tags keep parallel tests apart.
    pub fn new(mount: &HierarchyMount, tag: &str) -> TestTree {
        let rel_root = format!(
            "{}/observer-test-{}-{tag}",
            mount.root.trim_end_matches('/'),
            std::process::id()
        );
        let abs_root = mount
            .to_absolute(&rel_root)
            .expect("test root inside the mount");
        let tree = TestTree {
            mount: mount.clone(),
            rel_root,
            abs_root,
            children: Vec::new(),
        };
        tree.remove_all();
        std::fs::create_dir(&tree.abs_root)
            .unwrap_or_else(|e| panic!("mkdir {:?}: {e}", tree.abs_root));
        tree
    }

    /// Hierarchy-relative path of `sub` (which starts with '/').
    pub fn rel(&self, sub: &str) -> String {
        format!("{}{sub}", self.rel_root)
    }

    pub fn abs(&self, sub: &str) -> PathBuf {
        self.mount
            .to_absolute(&self.rel(sub))
            .expect("inside the mount")
    }

    pub fn mkdir(&self, sub: &str) -> PathBuf {
        let p = self.abs(sub);
        std::fs::create_dir_all(&p).unwrap_or_else(|e| panic!("mkdir {p:?}: {e}"));
        p
    }

    /// Runs `argv` as a process that joins cgroup `sub` before it execs, so anything it forks
    /// starts inside. Returns its pid.
    pub fn spawn_in(&mut self, sub: &str, argv: &[&str]) -> u32 {
        let procs = self.abs(sub).join("cgroup.procs");
        let child = Command::new("sh")
            .arg("-c")
            .arg(r#"echo $$ > "$0" && exec "$@""#)
            .arg(&procs)
            .args(argv)
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn sh");
        let pid = child.id();
        self.children.push(child);
        self.wait_until(
            || read_procs(&procs).contains(&pid),
            "process to join its cgroup",
        );
        pid
    }

    /// Polls `cond` for up to 10 s.
    pub fn wait_until(&self, mut cond: impl FnMut() -> bool, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !cond() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn dirs_bottom_up(&self) -> Vec<PathBuf> {
        let mut out = Vec::new();
        let mut stack = vec![self.abs_root.clone()];
        while let Some(d) = stack.pop() {
            if let Ok(rd) = std::fs::read_dir(&d) {
                for e in rd.flatten() {
                    if e.file_type().is_ok_and(|t| t.is_dir()) {
                        stack.push(e.path());
                    }
                }
            }
            out.push(d);
        }
        out.reverse();
        out
    }

    fn remove_all(&self) {
        if !self.abs_root.exists() {
            return;
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let dirs = self.dirs_bottom_up();
            for d in &dirs {
                for pid in read_procs(&d.join("cgroup.procs")) {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid as i32),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
            }
            let mut left = false;
            for d in &dirs {
                match std::fs::remove_dir(d) {
                    Ok(()) => {}
                    Err(e) if e.kind() == ErrorKind::NotFound => {}
                    Err(_) => left = true,
                }
            }
            if !left {
                return;
            }
            if Instant::now() > deadline {
                eprintln!("could not remove test cgroups under {:?}", self.abs_root);
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for TestTree {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.remove_all();
    }
}

pub(crate) fn read_procs(path: &Path) -> Vec<u32> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}
