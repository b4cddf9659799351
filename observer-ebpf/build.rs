use which::which;

/// Rebuild when bpf-linker changes: the object depends on the linker's LLVM.
fn main() {
    match which("bpf-linker") {
        Ok(p) => println!("cargo:rerun-if-changed={}", p.display()),
        Err(e) => println!("cargo:warning=bpf-linker not found ({e}); run scripts/bootstrap.sh"),
    }
}
