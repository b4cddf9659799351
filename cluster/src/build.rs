//! `go build` of the components from the Go module proxy, through the small modules in
//! `cluster/go/`: `kubernetes` requires k8s.io/kubernetes and replaces each staging module
//! (v0.0.0 in its go.mod, which no proxy serves) by its published v0.34.x; `etcd` requires the
//! etcd server, which is itself the etcd command; `helm` requires helm.sh/helm/v4, whose
//! `cmd/helm` is the chart's tests' helm (deploy/chart: `helm lint` and `helm template` in the
//! host suite, `helm install` on the cluster). Binaries land in `target/cluster/bin`, the Go
//! build and module caches in `target/cluster/go`, so only a machine's first build pays (about
//! 7 minutes on 2 idle cores for Kubernetes and etcd, about 4.5 CPU-minutes more for helm, module
//! downloads included; a warm rebuild after a change of flags, a few).
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use crate::{Error, Result};

pub const KUBERNETES_VERSION: &str = "v1.34.4";
pub const ETCD_VERSION: &str = "v3.6.16";
/// The chart's tests' helm (`cluster/go/helm/go.mod` requires the same).
pub const HELM_VERSION: &str = "v4.3.2";
/// The second node's runtime (`cluster/go/containerd/go.mod` requires the same).
pub const CONTAINERD_VERSION: &str = "v2.4.2";

/// What `cluster/go/containerd` builds into `target/cluster/guest/bin`.
pub const CONTAINERD_COMMANDS: &[&str] = &["containerd", "containerd-shim-runc-v2", "ctr"];

/// Every binary the cluster runs, by Go package.
const KUBERNETES_COMMANDS: &[&str] = &[
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubelet",
    "kubectl",
];

/// Builds what is missing or was built from other module files: helm first ([`ensure_helm`]:
/// the host suite's chart tests wait for it, and it is the shorter build), then Kubernetes and
/// etcd. One build at a time per directory: a second caller (CI starts the build early in the
/// background; the suite's `up` comes later) waits for the first and then finds it done.
pub fn ensure(workspace: &Path, dir: &Path) -> Result<()> {
    ensure_helm(workspace, dir)?;
    let go_src = workspace.join("cluster/go");
    let bin = dir.join("bin");
    let _lock = lock(dir)?;
    let stamp_file = bin.join(".built-from");
    let stamp = stamp(&go_src, &["kubernetes", "etcd"])?;
    let complete = KUBERNETES_COMMANDS
        .iter()
        .chain(&["etcd"])
        .all(|b| bin.join(b).is_file());
    if complete && std::fs::read_to_string(&stamp_file).is_ok_and(|s| s == stamp) {
        return Ok(());
    }
    let go = crate::which("go").ok_or_else(|| {
        Error::Missing(
            "Go is not installed: the test cluster's components are built with `go build` \
             (Go 1.24 or newer on PATH)"
                .into(),
        )
    })?;
    std::fs::create_dir_all(&bin).map_err(Error::io(&bin))?;
    let started = Instant::now();
    eprintln!(
        "cluster: building Kubernetes {KUBERNETES_VERSION} and etcd {ETCD_VERSION} with go build \
         (the first build on a machine takes about 7 minutes on 2 idle cores)"
    );
    let mut ldflags = String::from("-s -w");
    // What `kubectl version` and the node's kubeletVersion report (upstream's hack/lib/version.sh).
    let minor = KUBERNETES_VERSION.split('.').nth(1).unwrap_or("0");
    for pkg in [
        "k8s.io/component-base/version",
        "k8s.io/client-go/pkg/version",
    ] {
        ldflags.push_str(&format!(
            " -X {pkg}.gitVersion={KUBERNETES_VERSION} -X {pkg}.gitMajor=1 -X {pkg}.gitMinor={minor} \
             -X {pkg}.gitTreeState=clean -X {pkg}.buildDate=1970-01-01T00:00:00Z"
        ));
    }
    let mut k8s = go_command(&go, dir, &go_src.join("kubernetes"));
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
        KUBERNETES_COMMANDS
            .iter()
            .map(|c| format!("k8s.io/kubernetes/cmd/{c}")),
    );
    run(&mut k8s, "go build (Kubernetes)")?;
    let mut etcd = go_command(&go, dir, &go_src.join("etcd"));
    etcd.args(["build", "-trimpath", "-ldflags", "-s -w", "-o"])
        .arg(bin.join("etcd"))
        .arg("go.etcd.io/etcd/server/v3");
    run(&mut etcd, "go build (etcd)")?;
    std::fs::write(&stamp_file, stamp).map_err(Error::io(&stamp_file))?;
    eprintln!("cluster: built in {:.0?}", started.elapsed());
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
    // Apart from Kubernetes' stamp: a change to either module rebuilds only its own binaries.
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

/// Builds the second node's containerd 2.x (with its runc shim and ctr) when missing or built
/// from other module files: static binaries (CGO_ENABLED=0, which also leaves out the btrfs
/// snapshotter's cgo; the devmapper and ZFS snapshotters are left out by tag), in
/// `<dir>/guest/bin`. The same lock as [`ensure`]: one Go build at a time.
pub fn ensure_containerd(workspace: &Path, dir: &Path) -> Result<()> {
    let go_src = workspace.join("cluster/go");
    let bin = dir.join("guest/bin");
    std::fs::create_dir_all(&bin).map_err(Error::io(&bin))?;
    let _lock = lock(dir)?;
    let stamp_file = bin.join(".built-from");
    let stamp = stamp(&go_src, &["containerd"])?;
    let complete = CONTAINERD_COMMANDS.iter().all(|b| bin.join(b).is_file());
    if complete && std::fs::read_to_string(&stamp_file).is_ok_and(|s| s == stamp) {
        return Ok(());
    }
    let go = crate::which("go").ok_or_else(|| {
        Error::Missing(
            "Go is not installed: the second node's containerd is built with `go build` \
             (Go 1.26.6 or newer on PATH, what containerd 2.4 requires)"
                .into(),
        )
    })?;
    let started = Instant::now();
    eprintln!("cluster: building containerd {CONTAINERD_VERSION} with go build");
    // What `containerd --version` and the node's containerRuntimeVersion report.
    let ldflags = format!(
        "-s -w -X github.com/containerd/containerd/v2/version.Version={CONTAINERD_VERSION} \
         -X github.com/containerd/containerd/v2/version.Revision=observer-cluster"
    );
    let mut build = go_command(&go, dir, &go_src.join("containerd"));
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
            .map(|c| format!("github.com/containerd/containerd/v2/cmd/{c}")),
    );
    run(&mut build, "go build (containerd)")?;
    std::fs::write(&stamp_file, stamp).map_err(Error::io(&stamp_file))?;
    eprintln!("cluster: containerd built in {:.0?}", started.elapsed());
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
