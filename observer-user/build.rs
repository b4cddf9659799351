//! Builds the eBPF object (observer-ebpf) with the nightly toolchain and bpf-linker, so that
//! `cargo build` of the agent embeds the kernel side it was built with.
use std::{env, fs, path::PathBuf};

// A build dependency only so that cargo orders and fingerprints the eBPF crate with this one;
// aya-build builds it for the BPF target itself.
use observer_ebpf as _;

/// The nightly that builds the kernel side (scripts/bootstrap.sh installs it).
const NIGHTLY: &str = "nightly-2026-05-19";

fn main() -> anyhow::Result<()> {
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR"));
    // AYA_BUILD_SKIP=1 builds userspace alone (docs, clippy of userspace on a machine without
    // bpf-linker). The agent then refuses to load, with an error that says why.
    let skip = env::var("AYA_BUILD_SKIP").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
    println!("cargo:rerun-if-env-changed=AYA_BUILD_SKIP");
    if skip {
        let obj = out.join("observer");
        if !obj.exists() {
            fs::write(obj, [])?;
        }
        return Ok(());
    }
    let pkg = aya_build::Package {
        name: "observer-ebpf",
        root_dir: concat!(env!("CARGO_MANIFEST_DIR"), "/../observer-ebpf"),
        ..Default::default()
    };
    // The pin scripts/bootstrap.sh installs: its LLVM is the one bpf-linker was built against.
    aya_build::build_ebpf([pkg], aya_build::Toolchain::Custom(NIGHTLY))
}
