//! `go build` of the components from the Go module proxy, through the small modules in
//! `cluster/go/`: `kubernetes/v1.<minor>` requires one release of k8s.io/kubernetes and replaces
//! each staging module (v0.0.0 in its go.mod, which no proxy serves) by its published v0.<minor>.x
//! (`scripts/kubernetes-module.sh` writes them); `etcd` requires the etcd server, which is itself
//! the etcd command; `containerd/v1.7` and `containerd/v2.4` the nodes' runtimes; `helm` requires
//! helm.sh/helm/v4, whose `cmd/helm` is the chart's tests' helm (deploy/chart: `helm lint` and
//! `helm template` in the host suite, `helm install` on the cluster). Each release's binaries land
//! in `target/cluster/kubernetes/<version>`, each containerd's in `target/cluster/containerd/
//! <version>`, etcd and helm in `target/cluster/bin`; the Go build and module caches in
//! `target/cluster/go`, so only a machine's first build pays (about 7 minutes on 2 idle cores for
//! one release's control plane and etcd, 3 more for a second release's kubelet, about 4.5
//! CPU-minutes for helm, module downloads included; a warm rebuild after a change of flags, a few).
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use crate::versions::{self, Containerd, Release, Versions};
use crate::{Error, Result};

pub const ETCD_VERSION: &str = "v3.6.16";
/// The chart's tests' helm (`cluster/go/helm/go.mod` requires the same).
pub const HELM_VERSION: &str = "v4.3.2";

/// What each containerd build provides.
pub const CONTAINERD_COMMANDS: &[&str] = &["containerd", "containerd-shim-runc-v2", "ctr"];

/// Builds what is missing or was built from other module files: helm first ([`ensure_helm`]:
/// the host suite's chart tests wait for it, and it is the shorter build), then each Kubernetes
/// release `versions` names (with the commands taken from it), etcd, and the host node's
/// containerd. One build at a time per directory: a second caller (CI starts the build early in
/// the background; the suite's `up` comes later) waits for the first and then finds it done.
pub fn ensure(workspace: &Path, dir: &Path, versions: &Versions) -> Result<()> {
    ensure_helm(workspace, dir)?;
    for (release, commands) in versions.builds() {
        ensure_kubernetes(workspace, dir, release, &commands)?;
    }
    ensure_etcd(workspace, dir)?;
    ensure_containerd(workspace, dir, versions.host_kubelet.containerd())
}

fn go() -> Result<std::path::PathBuf> {
    crate::which("go").ok_or_else(|| {
        Error::Missing(
            "Go is not installed: the test cluster's components are built with `go build` \
             (Go 1.26 or newer on PATH, what Kubernetes 1.37 and containerd 2.4 require)"
                .into(),
        )
    })
}

/// Builds `commands` of one Kubernetes release into [`versions::kubernetes_bin`].
fn ensure_kubernetes(
    workspace: &Path,
    dir: &Path,
    release: Release,
    commands: &[&str],
) -> Result<()> {
    let go_src = workspace.join("cluster/go");
    let bin = versions::kubernetes_bin(dir, release);
    let module = release.module();
    let stamp = stamp(&go_src, &[&module])?;
    let stamp_file = bin.join(".built-from");
    // Binaries of this release another choice of versions wanted stay valid while the module
    // files are the same: only missing commands are built.
    let done = || {
        commands.iter().all(|b| bin.join(b).is_file())
            && std::fs::read_to_string(&stamp_file).is_ok_and(|s| s == stamp)
    };
    if done() {
        return Ok(());
    }
    let _lock = lock(dir)?;
    if done() {
        return Ok(());
    }
    let go = go()?;
    if !std::fs::read_to_string(&stamp_file).is_ok_and(|s| s == stamp) && bin.exists() {
        // Built from other module files: none of it may be kept beside the new build.
        std::fs::remove_dir_all(&bin).map_err(Error::io(&bin))?;
    }
    std::fs::create_dir_all(&bin).map_err(Error::io(&bin))?;
    let started = Instant::now();
    let version = release.version();
    eprintln!(
        "cluster: building Kubernetes {version} ({}) with go build (about 7 minutes on 2 idle \
         cores for a control plane, 3 for a kubelet)",
        commands.join(", ")
    );
    let mut ldflags = String::from("-s -w");
    // What `kubectl version` and the node's kubeletVersion report (upstream's hack/lib/version.sh).
    let minor = release.minor();
    for pkg in [
        "k8s.io/component-base/version",
        "k8s.io/client-go/pkg/version",
    ] {
        ldflags.push_str(&format!(
            " -X {pkg}.gitVersion={version} -X {pkg}.gitMajor=1 -X {pkg}.gitMinor={minor} \
             -X {pkg}.gitTreeState=clean -X {pkg}.buildDate=1970-01-01T00:00:00Z"
        ));
    }
    let mut k8s = go_command(&go, dir, &go_src.join(&module));
    k8s.args([
        "build",
        "-tags=selinux,notest",
        "-trimpath",
        "-ldflags",
        &ldflags,
        "-o",
    ])
    .arg(format!("{}/", bin.display()));
    k8s.args(
        commands
            .iter()
            .map(|c| format!("k8s.io/kubernetes/cmd/{c}")),
    );
    run(&mut k8s, &format!("go build (Kubernetes {version})"))?;
    std::fs::write(&stamp_file, stamp).map_err(Error::io(&stamp_file))?;
    eprintln!(
        "cluster: Kubernetes {version} built in {:.0?}",
        started.elapsed()
    );
    Ok(())
}

/// Builds etcd ([`ETCD_VERSION`]) into `<dir>/bin`.
fn ensure_etcd(workspace: &Path, dir: &Path) -> Result<()> {
    let go_src = workspace.join("cluster/go");
    let bin = dir.join("bin");
    let etcd = bin.join("etcd");
    let stamp_file = bin.join(".etcd-built-from");
    let stamp = stamp(&go_src, &["etcd"])?;
    let done = || etcd.is_file() && std::fs::read_to_string(&stamp_file).is_ok_and(|s| s == stamp);
    if done() {
        return Ok(());
    }
    let _lock = lock(dir)?;
    if done() {
        return Ok(());
    }
    let go = go()?;
    std::fs::create_dir_all(&bin).map_err(Error::io(&bin))?;
    let started = Instant::now();
    eprintln!("cluster: building etcd {ETCD_VERSION} with go build");
    let mut build = go_command(&go, dir, &go_src.join("etcd"));
    build
        .args(["build", "-trimpath", "-ldflags", "-s -w", "-o"])
        .arg(&etcd)
        .arg("go.etcd.io/etcd/server/v3");
    run(&mut build, "go build (etcd)")?;
    std::fs::write(&stamp_file, stamp).map_err(Error::io(&stamp_file))?;
    eprintln!("cluster: etcd built in {:.0?}", started.elapsed());
    Ok(())
}

/// The one Go build at a time of `dir` (held until dropped).
fn lock(dir: &Path) -> Result<nix::fcntl::Flock<std::fs::File>> {
    std::fs::create_dir_all(dir).map_err(Error::io(dir))?;
    let lock_path = dir.join(".build.lock");
    let lock_file = std::fs::File::create(&lock_path).map_err(Error::io(&lock_path))?;
    nix::fcntl::Flock::lock(lock_file, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| Error::io(&lock_path)(e.into()))
}

/// Builds helm ([`HELM_VERSION`], `target/cluster/bin/helm`) when missing or built from other
/// module files: a static binary, as upstream's release. Done is checked before the lock too:
/// the host suite asks for helm (`cargo xtask cluster build --only-helm`) while the background
/// job may hold the lock for the Kubernetes build, minutes after helm's was done.
pub fn ensure_helm(workspace: &Path, dir: &Path) -> Result<()> {
    let go_src = workspace.join("cluster/go");
    let bin = dir.join("bin");
    let helm = bin.join("helm");
    // A stamp of its own: a change to another module rebuilds only that module's binaries.
    let stamp_file = bin.join(".helm-built-from");
    let stamp = stamp(&go_src, &["helm"])?;
    // The stamp is written after the binary: a matching one names a finished build.
    let done = || helm.is_file() && std::fs::read_to_string(&stamp_file).is_ok_and(|s| s == stamp);
    if done() {
        return Ok(());
    }
    let _lock = lock(dir)?;
    if done() {
        return Ok(());
    }
    let go = crate::which("go").ok_or_else(|| {
        Error::Missing(
            "Go is not installed: the chart's tests' helm is built with `go build` \
             (Go 1.26 or newer on PATH, what helm v4.3 requires)"
                .into(),
        )
    })?;
    std::fs::create_dir_all(&bin).map_err(Error::io(&bin))?;
    let started = Instant::now();
    eprintln!("cluster: building helm {HELM_VERSION} with go build");
    // What `helm version` reports (upstream's Makefile sets the same variable; its source says
    // only the minor version).
    let ldflags = format!("-s -w -X helm.sh/helm/v4/internal/version.version={HELM_VERSION}");
    let mut build = go_command(&go, dir, &go_src.join("helm"));
    build
        .args(["build", "-trimpath", "-ldflags", &ldflags, "-o"])
        .arg(&helm)
        .arg("helm.sh/helm/v4/cmd/helm");
    run(&mut build, "go build (helm)")?;
    std::fs::write(&stamp_file, stamp).map_err(Error::io(&stamp_file))?;
    eprintln!("cluster: helm built in {:.0?}", started.elapsed());
    Ok(())
}

fn go_command(go: &Path, dir: &Path, module: &Path) -> Command {
    let mut c = Command::new(go);
    c.current_dir(module)
        .env("GOCACHE", dir.join("go/cache"))
        .env("GOMODCACHE", dir.join("go/mod"))
        // go.sum is committed: the build takes exactly those modules, and never another toolchain.
        .env("GOFLAGS", "-mod=readonly")
        .env("GOTOOLCHAIN", "local")
        // Static binaries, as upstream releases them.
        .env("CGO_ENABLED", "0");
    c
}

fn run(cmd: &mut Command, what: &str) -> Result<()> {
    let status = cmd.status().map_err(Error::io("go"))?;
    if !status.success() {
        return Err(Error::Command {
            what: what.into(),
            detail: status.to_string(),
        });
    }
    Ok(())
}

/// Builds one containerd line (with its runc shim and ctr) when missing or built from other
/// module files: static binaries (CGO_ENABLED=0, which also leaves out the btrfs snapshotter's
/// cgo; the devmapper and ZFS snapshotters are left out by tag), in
/// [`versions::containerd_bin`]. The same lock as the other builds: one Go build at a time.
pub fn ensure_containerd(workspace: &Path, dir: &Path, which: Containerd) -> Result<()> {
    let go_src = workspace.join("cluster/go");
    let bin = versions::containerd_bin(dir, which);
    let stamp_file = bin.join(".built-from");
    let stamp = stamp(&go_src, &[which.module()])?;
    let done = || {
        CONTAINERD_COMMANDS.iter().all(|b| bin.join(b).is_file())
            && std::fs::read_to_string(&stamp_file).is_ok_and(|s| s == stamp)
    };
    if done() {
        return Ok(());
    }
    let _lock = lock(dir)?;
    if done() {
        return Ok(());
    }
    let go = go()?;
    std::fs::create_dir_all(&bin).map_err(Error::io(&bin))?;
    let started = Instant::now();
    let version = which.version();
    let package = which.package();
    eprintln!("cluster: building containerd {version} with go build");
    // What `containerd --version` and the node's containerRuntimeVersion report.
    let ldflags = format!(
        "-s -w -X {package}/version.Version={version} \
         -X {package}/version.Revision=observer-cluster"
    );
    let mut build = go_command(&go, dir, &go_src.join(which.module()));
    build
        .args([
            "build",
            "-tags=no_btrfs,no_devmapper,no_zfs,urfave_cli_no_docs",
            "-trimpath",
            "-ldflags",
            &ldflags,
            "-o",
        ])
        .arg(format!("{}/", bin.display()));
    build.args(
        CONTAINERD_COMMANDS
            .iter()
            .map(|c| format!("{package}/cmd/{c}")),
    );
    run(&mut build, &format!("go build (containerd {version})"))?;
    std::fs::write(&stamp_file, stamp).map_err(Error::io(&stamp_file))?;
    eprintln!(
        "cluster: containerd {version} built in {:.0?}",
        started.elapsed()
    );
    Ok(())
}

/// The module files the binaries were built from.
fn stamp(go_src: &Path, modules: &[&str]) -> Result<String> {
    let mut s = String::new();
    for m in modules {
        for f in ["go.mod", "go.sum"] {
            let p = go_src.join(m).join(f);
            s.push_str(&std::fs::read_to_string(&p).map_err(Error::io(&p))?);
        }
    }
    Ok(s)
}
