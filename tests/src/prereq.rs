//! The skip policy, in one place: a test whose prerequisite is truly absent (not root, a binary not
//! installed) says why and skips; under `CI=true` the same absence fails the test, because CI is
//! where these tests must really run.
use std::path::{Path, PathBuf};

/// The binaries the containerd harness runs.
pub const CONTAINERD_BINARIES: &[&str] = &[
    "containerd",
    "ctr",
    "runc",
    "containerd-shim-runc-v2",
    "busybox",
];

#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    Run,
    Skip(String),
    Fail(String),
}

/// What to do given the missing prerequisites and whether we run in CI.
pub fn decide(test_needs: &str, missing: &[String], ci: bool) -> Decision {
    if missing.is_empty() {
        return Decision::Run;
    }
    let why = format!("{test_needs} needs: {}", missing.join("; "));
    if ci {
        Decision::Fail(why)
    } else {
        Decision::Skip(why)
    }
}

/// `CI=true` (or `1`), as CI runners set it.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1")
}

/// A VM guest made for tests (`OBSERVER_VM_GUEST=1` in its environment).
pub fn in_vm_guest() -> bool {
    std::env::var("OBSERVER_VM_GUEST").is_ok_and(|v| v == "1")
}

/// A test for VM guests (a global OOM, a cgroup setup CI's host lacks): there the policy above
/// applies (with `CI=true` a missing prerequisite fails); on a host it skips, saying why, even
/// under `CI=true`.
/// `host_why`: why it does not run on a host at all (`None`: it runs on a host that has
/// everything `missing` lists).
pub fn require_in_guest(what: &str, host_why: Option<&str>, missing: &[String]) -> bool {
    if in_vm_guest() {
        return require(what, missing);
    }
    let why = match host_why {
        Some(why) => vec![format!("a VM guest (OBSERVER_VM_GUEST=1): {why}")],
        None => missing.to_vec(),
    };
    apply(decide(what, &why, false))
}

fn apply(decision: Decision) -> bool {
    match decision {
        Decision::Run => true,
        Decision::Skip(why) => {
            // eprintln: shown by `cargo test` even for passing tests with --nocapture, and in CI logs.
            eprintln!("SKIPPED: {why}");
            false
        }
        Decision::Fail(why) => panic!("prerequisite missing under CI=true (never skipped): {why}"),
    }
}

/// The policy for any prerequisite list: true when `missing` is empty; otherwise prints
/// `SKIPPED: <what> needs: ...` and returns false, or panics under `CI=true`.
pub fn require(what: &str, missing: &[String]) -> bool {
    apply(decide(what, missing, in_ci()))
}

fn root_missing() -> Vec<String> {
    if nix::unistd::geteuid().is_root() {
        vec![]
    } else {
        vec!["root (run as uid 0)".into()]
    }
}

/// True when the test may run as root; otherwise prints why it skips (or panics under CI).
pub fn require_root() -> bool {
    require("this test", &root_missing())
}

/// True when root and everything [`crate::Containerd`] runs are present; otherwise skips (or
/// panics under CI) saying what is missing.
pub fn require_containerd() -> bool {
    let mut missing = root_missing();
    for bin in CONTAINERD_BINARIES {
        if which(bin).is_none() {
            missing.push(format!(
                "`{bin}` on PATH (scripts/bootstrap.sh installs it)"
            ));
        }
    }
    if let Some(busybox) = which("busybox") {
        if !is_static_elf(&busybox).unwrap_or(false) {
            missing.push(format!(
                "a static busybox ({} is dynamically linked; install busybox-static)",
                busybox.display()
            ));
        }
    }
    require("this containerd test", &missing)
}

/// The release `observer` binary of this build (next to the running test's target dir), if it is
/// newer than every source file it is built from: a test that runs it (in an image, say) must run
/// the code under test. `cargo test --release` of the workspace builds it; otherwise
/// `cargo build --release -p observer`. The error says what is missing, for [`require`].
pub fn observer_release_binary() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .map(|d| d.join("observer"))
        .ok_or("no target dir")?;
    let built = std::fs::metadata(&bin)
        .and_then(|m| m.modified())
        .map_err(|_| format!("{} (cargo build --release -p observer)", bin.display()))?;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .ok_or("no workspace root")?;
    let newest = [
        "observer-user/src",
        "observer-ebpf/src",
        "observer-common/src",
    ]
    .iter()
    .filter_map(|d| newest_mtime(&root.join(d)))
    .max()
    .unwrap_or(std::time::SystemTime::UNIX_EPOCH);
    if built < newest {
        return Err(format!(
            "an up-to-date {} (older than its sources: cargo build --release -p observer)",
            bin.display()
        ));
    }
    Ok(bin)
}

/// helm for the chart's tests: the one `cargo xtask cluster build` builds (helm.sh/helm/v4 from
/// the Go module proxy, at `target/cluster/bin/helm`), else one on PATH, as kubectl is found. The
/// error says how to get it, for [`require`]; scripts/test.sh builds it before the host suite.
pub fn helm() -> Result<PathBuf, String> {
    let built = observer_cluster::Cluster::of_workspace().bin("helm");
    if is_executable(&built) {
        return Ok(built);
    }
    which("helm").ok_or_else(|| {
        format!(
            "helm ({} or on PATH: `cargo xtask cluster build --only-helm` builds it)",
            built.display()
        )
    })
}

fn newest_mtime(dir: &Path) -> Option<std::time::SystemTime> {
    let mut newest = None;
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        let p = e.path();
        let t = if p.is_dir() {
            newest_mtime(&p)
        } else {
            e.metadata().and_then(|m| m.modified()).ok()
        };
        newest = newest.max(t);
    }
    newest
}

/// Finds `name` on PATH, plus the sbin directories root's PATH usually has.
pub fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/local/sbin", "/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    p.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// An ELF with no PT_INTERP program header runs without a dynamic loader: it can be the only file
/// of an image's rootfs.
pub fn is_static_elf(path: &Path) -> std::io::Result<bool> {
    let data = std::fs::read(path)?;
    Ok(elf_has_interp(&data) == Some(false))
}

/// `None` when `data` is not a little-endian ELF64.
fn elf_has_interp(data: &[u8]) -> Option<bool> {
    const PT_INTERP: u32 = 3;
    if data.get(..4)? != b"\x7fELF" || *data.get(4)? != 2 || *data.get(5)? != 1 {
        return None;
    }
    let u16_at = |o: usize| Some(u16::from_le_bytes(data.get(o..o + 2)?.try_into().ok()?));
    let u32_at = |o: usize| Some(u32::from_le_bytes(data.get(o..o + 4)?.try_into().ok()?));
    let u64_at = |o: usize| Some(u64::from_le_bytes(data.get(o..o + 8)?.try_into().ok()?));
    let phoff = usize::try_from(u64_at(0x20)?).ok()?;
    let phentsize = usize::from(u16_at(0x36)?);
    let phnum = usize::from(u16_at(0x38)?);
    for i in 0..phnum {
        if u32_at(phoff + i * phentsize)? == PT_INTERP {
            return Some(true);
        }
    }
    Some(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_missing_runs() {
        assert_eq!(decide("t", &[], true), Decision::Run);
        assert_eq!(decide("t", &[], false), Decision::Run);
    }

    #[test]
    fn missing_skips_locally_and_fails_in_ci() {
        let missing = vec!["root".to_string()];
        assert!(matches!(decide("t", &missing, false), Decision::Skip(w) if w.contains("root")));
        assert!(matches!(decide("t", &missing, true), Decision::Fail(w) if w.contains("root")));
    }

    #[test]
    #[should_panic(expected = "never skipped")]
    fn ci_failure_panics() {
        apply(decide("t", &["x".into()], true));
    }

    #[test]
    fn elf_interp_detection() {
        // This test binary is dynamically linked (Rust's default on gnu targets).
        let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        assert_eq!(elf_has_interp(&me), Some(true));
        assert_eq!(elf_has_interp(b"#!/bin/sh\n"), None);
        assert_eq!(elf_has_interp(b"\x7fELF"), None, "truncated header");
    }

    #[test]
    fn which_finds_sh_and_not_nonsense() {
        assert!(which("sh").is_some());
        assert!(which("no-such-binary-observer").is_none());
    }
}
