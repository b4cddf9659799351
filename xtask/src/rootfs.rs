//! The files a dynamically linked binary needs at run time (itself, its ELF interpreter, its
//! shared libraries, as `ldd` resolves them on this machine): what an image or a VM's initramfs
//! must carry for the binary to start.
use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};

/// For each file: the path it must have in the root filesystem → the real file to copy there
/// (symlinks resolved, so a copy never dangles). The binaries themselves are placed at
/// `dest_dir/<file name>`.
pub fn runtime_files(binaries: &[&Path], dest_dir: &str) -> Result<BTreeMap<PathBuf, PathBuf>> {
    let mut files = BTreeMap::new();
    for bin in binaries {
        let real = bin
            .canonicalize()
            .with_context(|| format!("{} not found", bin.display()))?;
        let name = bin.file_name().context("binary path has no file name")?;
        files.insert(Path::new(dest_dir).join(name), real);
        for lib in shared_libraries(bin)? {
            let real = lib
                .canonicalize()
                .with_context(|| format!("{} (needed by {})", lib.display(), bin.display()))?;
            files.insert(lib, real);
        }
    }
    Ok(files)
}

/// The absolute paths `ldd` prints for `bin`; none for a static binary.
fn shared_libraries(bin: &Path) -> Result<Vec<PathBuf>> {
    let out = Command::new("ldd")
        .arg(bin)
        .output()
        .context("running ldd")?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        if text.contains("not a dynamic executable")
            || String::from_utf8_lossy(&out.stderr).contains("not a dynamic executable")
        {
            return Ok(Vec::new());
        }
        bail!(
            "ldd {} failed: {}",
            bin.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(parse_ldd(&text))
}

fn parse_ldd(text: &str) -> Vec<PathBuf> {
    text.lines()
        .filter_map(|l| {
            // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or
            // "/lib64/ld-linux-x86-64.so.2 (0x...)"; the vDSO has no file.
            let path = match l.split_once("=>") {
                Some((_, rest)) => rest.split_whitespace().next()?,
                None => l.split_whitespace().next()?,
            };
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ldd_output() {
        let text = "\tlinux-vdso.so.1 (0x00007ffd)\n\tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x1)\n\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x2)\n\t/lib64/ld-linux-x86-64.so.2 (0x3)\n";
        assert_eq!(
            parse_ldd(text),
            [
                "/lib/x86_64-linux-gnu/libgcc_s.so.1",
                "/lib/x86_64-linux-gnu/libc.so.6",
                "/lib64/ld-linux-x86-64.so.2"
            ]
            .map(PathBuf::from)
        );
    }

    #[test]
    fn a_dynamic_binary_brings_its_loader() {
        let files = runtime_files(&[Path::new("/bin/sh")], "/bin").unwrap();
        assert!(files.contains_key(Path::new("/bin/sh")));
        assert!(
            files
                .keys()
                .any(|p| p.to_string_lossy().contains("ld-linux")),
            "{files:?}"
        );
        assert!(files.values().all(|real| real.is_file()));
    }
}
