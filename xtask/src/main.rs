//! Developer tasks: `cargo xtask <task>`. One module per task that is more than a command line.
// The run-time file closure the VM initramfs needs (the image task's recipe is in observer-image).
mod rootfs;
mod vm;
use std::{path::PathBuf, process::Command};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install what the build and tests need (scripts/bootstrap.sh).
    Bootstrap,
    /// Build the eBPF object alone (the agent's build.rs does this too).
    BuildEbpf,
    /// Run every benchmark and print their tables (root needed for the kernel ones).
    Bench {
        /// Only benchmarks whose name contains this.
        filter: Option<String>,
    },
    /// Build the agent's OCI image archive (no container engine needed): the release `observer`
    /// and only the files it needs to start. Import it with `ctr -n k8s.io images import`,
    /// `podman load`, or `skopeo copy oci-archive:<file> docker://<registry>/observer:<tag>`.
    Image {
        /// Where to write the archive.
        #[arg(long, default_value = "target/image/observer-image.tar")]
        out: PathBuf,
        /// Use this `observer` binary instead of building the release one.
        #[arg(long)]
        binary: Option<PathBuf>,
        /// Also unpack the image's files into this directory (what deploy/Containerfile copies
        /// into its `scratch` stage).
        #[arg(long)]
        rootfs: Option<PathBuf>,
        /// Cargo build jobs (the build is skipped with --binary).
        #[arg(long, short)]
        jobs: Option<u32>,
    },
    /// The real one-node Kubernetes the cluster suites run on (README: "A real cluster").
    Cluster {
        #[command(flatten)]
        versions: ClusterVersions,
        #[command(subcommand)]
        action: ClusterAction,
    },
    /// Boot kernels under qemu and run `observer check` and the kernel and PLEG suites inside
    /// (see README: "Kernels and cgroup modes").
    VmTest(vm::Args),
}

/// Which Kubernetes each part runs (default: the control plane and guest nodes on the newest
/// supported release, the host node on the oldest; cluster/src/versions.rs). Read by `build` and
/// `up`; a running cluster keeps what it was started with.
#[derive(clap::Args)]
struct ClusterVersions {
    /// Every part on this release (1.35, 1.36 or 1.37); env OBSERVER_KUBERNETES.
    #[arg(long, global = true, env = "OBSERVER_KUBERNETES")]
    kubernetes: Option<String>,
    /// The host node's kubelet (containerd 1.7 up to 1.35, 2.4 after); env OBSERVER_HOST_KUBELET.
    #[arg(long, global = true, env = "OBSERVER_HOST_KUBELET")]
    host_kubelet: Option<String>,
    /// The guest nodes' kubelet; env OBSERVER_GUEST_KUBELET.
    #[arg(long, global = true, env = "OBSERVER_GUEST_KUBELET")]
    guest_kubelet: Option<String>,
}

#[derive(Subcommand)]
enum ClusterAction {
    /// Build the components if needed, start them and wait for the node (a no-op when up).
    Up {
        /// Nodes in all: the host's, then Debian guests under qemu (systemd, cgroup v2 only,
        /// containerd 2.x, the systemd cgroup driver; docs/second-node.md).
        #[arg(long, default_value_t = 1)]
        nodes: usize,
    },
    /// Add or remove a guest node of the running cluster.
    Node {
        #[command(subcommand)]
        action: NodeAction,
    },
    /// Build the agent's image, import it into every node's containerd, apply deploy/ through
    /// cluster/overlay and wait for the DaemonSet's pods to be Ready.
    Deploy,
    /// Stop everything `up` started and remove its state (binaries and Go caches stay).
    Down,
    /// Only build the components (target/cluster/{bin,kubernetes,containerd}), helm among them
    /// (the chart's tests').
    Build {
        /// Also build what the second node needs: containerd 2.x (target/cluster/containerd)
        /// and the Debian guest's disk image (target/cluster/guest/image).
        #[arg(long)]
        guest: bool,
        /// Only helm (target/cluster/bin/helm), what the host suite's chart tests need; waits
        /// for a background build of it, not for the Kubernetes build after it.
        #[arg(long, conflicts_with = "guest")]
        only_helm: bool,
    },
}

#[derive(Subcommand)]
enum NodeAction {
    /// Boot one more guest node and wait until it registers.
    Add,
    /// Stop a guest node and delete its Node object.
    Remove {
        /// The node's name (observer-node-2, …).
        name: String,
    },
}

fn cluster(versions: ClusterVersions, action: ClusterAction) -> Result<()> {
    let mut c = observer_cluster::Cluster::new(&root());
    if versions.kubernetes.is_some()
        || versions.host_kubelet.is_some()
        || versions.guest_kubelet.is_some()
    {
        c = c.choosing(observer_cluster::Versions::choose(
            versions.kubernetes.as_deref(),
            versions.host_kubelet.as_deref(),
            versions.guest_kubelet.as_deref(),
        )?);
    }
    match action {
        ClusterAction::Up { nodes } => {
            for (name, t) in c.up_nodes(nodes)? {
                println!(
                    "{name}: booted in {:.1} s, registered {:.1} s later",
                    t.boot.as_secs_f64(),
                    t.join.as_secs_f64()
                );
            }
        }
        ClusterAction::Node { action } => match action {
            NodeAction::Add => {
                let (name, t) = c.add_node()?;
                println!(
                    "{name}: booted in {:.1} s, registered {:.1} s later",
                    t.boot.as_secs_f64(),
                    t.join.as_secs_f64()
                );
            }
            NodeAction::Remove { name } => c.remove_node(&name)?,
        },
        ClusterAction::Down => c.down()?,
        ClusterAction::Build {
            only_helm: true, ..
        } => {
            observer_cluster::build::ensure_helm(&root(), c.dir())?;
        }
        ClusterAction::Build { guest, .. } => {
            if guest {
                // First: it takes no build lock (a Kubernetes build may be running).
                observer_cluster::guest::image::ensure(&c.dir().join("guest/image"))?;
            }
            c.build()?;
            if guest {
                observer_cluster::build::ensure_containerd(
                    &root(),
                    c.dir(),
                    observer_cluster::versions::Containerd::V2,
                )?;
            }
        }
        ClusterAction::Deploy => {
            c.up()?;
            let archive = PathBuf::from("target/image/observer-image.tar");
            image(archive.clone(), None, None, None)?;
            c.deploy(&root().join(archive))?;
            let mut nodes = vec![observer_cluster::NODE_NAME.to_string()];
            nodes.extend(c.guests().into_iter().map(|g| g.name));
            println!("observer is Ready on {}", nodes.join(", "));
        }
    }
    Ok(())
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd
        .current_dir(root())
        .status()
        .with_context(|| format!("running {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}

fn image(
    out: PathBuf,
    binary: Option<PathBuf>,
    rootfs: Option<PathBuf>,
    jobs: Option<u32>,
) -> Result<()> {
    let binary = match binary {
        Some(b) => b,
        None => {
            let mut build = Command::new("cargo");
            build.args(["build", "--release", "-p", "observer"]);
            if let Some(j) = jobs {
                build.arg("-j").arg(j.to_string());
            }
            run(&mut build)?;
            root().join("target/release/observer")
        }
    };
    let out = root().join(out);
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let image = observer_image::agent::AgentImage::build(&binary)
        .with_context(|| format!("building the image of {}", binary.display()))?;
    image.write_archive(&out)?;
    if let Some(dir) = rootfs {
        image.unpack(&root().join(dir))?;
    }
    let archive = std::fs::metadata(&out)?.len();
    println!("{}  {}", observer_image::agent::NAME, out.display());
    for (path, size) in &image.files {
        println!(
            "  {path:<45} {:>7.1} MiB",
            *size as f64 / f64::from(1 << 20)
        );
    }
    println!(
        "  layer {:.1} MiB uncompressed, archive {:.1} MiB",
        image.layer.len() as f64 / f64::from(1 << 20),
        archive as f64 / f64::from(1 << 20)
    );
    Ok(())
}

/// `cargo run` hands this process its own package's variables (`CARGO_PKG_NAME=xtask`,
/// `CARGO_MANIFEST_DIR`, ...). cargo decides whether a build script's `rerun-if-env-changed` holds
/// from its own environment, so the builds started from here would re-run ring's build script
/// (it names those variables) and rebuild ring, rustls, kube and the agent, and the next build
/// from a shell would do it all again: some 5 minutes of CI's budget, twice.
fn forget_cargo_run_env() {
    let set_by_cargo_run = |k: &str| {
        k.starts_with("CARGO_PKG_")
            || k.starts_with("CARGO_MANIFEST_")
            || matches!(
                k,
                "CARGO_CRATE_NAME" | "CARGO_BIN_NAME" | "CARGO_PRIMARY_PACKAGE"
            )
    };
    for (k, _) in std::env::vars_os() {
        if k.to_str().is_some_and(set_by_cargo_run) {
            // First thing in main, before any other thread exists.
            std::env::remove_var(&k);
        }
    }
}

fn main() -> Result<()> {
    forget_cargo_run_env();
    match Cli::parse().task {
        Task::Image {
            out,
            binary,
            rootfs,
            jobs,
        } => image(out, binary, rootfs, jobs),
        Task::Bootstrap => run(&mut Command::new("./scripts/bootstrap.sh")),
        Task::BuildEbpf => run(Command::new("cargo").args([
            "+nightly-2026-05-19",
            "build",
            "-p",
            "observer-ebpf",
            "--release",
            "--target",
            "bpfel-unknown-none",
            "-Z",
            "build-std=core",
        ])),
        Task::Bench { filter } => {
            // The kernel, api_path and footprint benchmarks drive the release `observer` binary.
            run(Command::new("cargo").args(["build", "--release", "-p", "observer"]))?;
            let benches = [
                "pleg",
                "status",
                "kernel",
                "detection",
                "api_path",
                "footprint",
                "pressure",
                // Starts the real cluster (built once) and deploys the agent.
                "cluster",
                // 250 pods on the same cluster, under churn and faults (about 45 minutes).
                "large_node",
            ];
            for b in benches
                .iter()
                .filter(|b| filter.as_deref().is_none_or(|f| b.contains(f)))
            {
                let exists = root()
                    .join("tests/benches")
                    .join(format!("{b}.rs"))
                    .exists();
                if exists {
                    run(Command::new("cargo").args([
                        "bench",
                        "-p",
                        "observer-tests",
                        "--bench",
                        b,
                    ]))?;
                }
            }
            Ok(())
        }
        Task::VmTest(args) => vm::run(args),
        Task::Cluster { versions, action } => cluster(versions, action),
    }
}
