//! Developer tasks: `cargo xtask <task>`. One module per task that is more than a command line.
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
    /// Boot kernels under qemu and run `observer check` and the kernel and PLEG suites inside
    /// (see README: "Kernels and cgroup modes").
    VmTest(vm::Args),
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

fn main() -> Result<()> {
    match Cli::parse().task {
        Task::Bootstrap => run(&mut Command::new("./scripts/bootstrap.sh")),
        Task::BuildEbpf => run(Command::new("cargo").args([
            "+nightly",
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
            // The kernel benchmark drives the release `observer` binary.
            run(Command::new("cargo").args(["build", "--release", "-p", "observer"]))?;
            let benches = ["pleg", "kernel", "detection"];
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
    }
}
