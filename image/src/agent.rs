//! The agent's image: `/usr/bin/observer` with its debug info stripped, the ELF interpreter and
//! the shared libraries it links (glibc's libc, libm, libgcc_s), and the empty directories the
//! runtime mounts onto. Nothing else: no shell, no package manager, no CA bundle (the cluster CA
//! comes with the service-account token or the kubeconfig). glibc 2.34+ has its `files` and
//! `dns` NSS modules built in, so name lookups need no other file either.
use std::path::Path;
use std::process::Command;

use crate::layer::Layer;
use crate::oci::{write_oci_archive, ImageSpec};
use crate::{rootfs, Error, Result};

/// The reference deploy/daemonset.yaml names; `localhost/` because no registry is implied.
pub const NAME: &str = concat!("localhost/observer:", env!("CARGO_PKG_VERSION"));
pub const BINARY: &str = "/usr/bin/observer";
pub const ENTRYPOINT: &[&str] = &[BINARY];
pub const CMD: &[&str] = &["run"];
pub const ENV: &[&str] = &["PATH=/usr/bin"];
/// Where the runtime mounts /proc, /sys, /dev, /etc/{hosts,hostname,resolv.conf}; runc would
/// create them, but not on a read-only root filesystem of another runtime.
const MOUNT_POINTS: &[(&str, u32)] = &[
    ("dev", 0o755),
    ("etc", 0o755),
    ("proc", 0o555),
    ("sys", 0o555),
    ("run", 0o755),
    ("tmp", 0o1777),
];

pub struct AgentImage {
    /// The one layer, uncompressed.
    pub layer: Vec<u8>,
    /// Every regular file of the layer (path in the image, size), in layer order.
    pub files: Vec<(String, u64)>,
}

impl AgentImage {
    /// Builds the image of `binary` (a release `observer` built on this machine: its libraries
    /// are taken from here, so the image matches the glibc it was linked against).
    pub fn build(binary: &Path) -> Result<Self> {
        let stripped_dir = tempfile::tempdir().map_err(Error::io(std::env::temp_dir()))?;
        let stripped = stripped_dir.path().join("observer");
        strip_debug(binary, &stripped)?;

        let dest_dir = Path::new(BINARY)
            .parent()
            .and_then(Path::to_str)
            .unwrap_or("/usr/bin");
        let mut closure = rootfs::runtime_files(&[binary], dest_dir)?;
        // The binary itself goes in stripped; its libraries come from ldd of the original.
        let name = binary
            .file_name()
            .ok_or_else(|| Error::Invalid(format!("{} has no file name", binary.display())))?;
        closure.insert(Path::new(dest_dir).join(name), stripped.clone());
        if !closure.contains_key(Path::new(BINARY)) {
            return Err(Error::Invalid(format!(
                "the binary must be named observer, not {}",
                binary.display()
            )));
        }

        let mut layer = Layer::new();
        for (dir, mode) in MOUNT_POINTS {
            layer.dir(dir, *mode)?;
        }
        let mut files = Vec::new();
        for (path, real) in &closure {
            let data = std::fs::read(real).map_err(Error::io(real))?;
            let path = path_in_image(path)?;
            let mode = if path == BINARY.trim_start_matches('/') || is_loader(&path) {
                0o755
            } else {
                0o644
            };
            layer.file(&path, mode, &data)?;
            files.push((format!("/{path}"), data.len() as u64));
        }
        Ok(AgentImage {
            layer: layer.finish()?,
            files,
        })
    }

    pub fn spec(&self) -> ImageSpec<'_> {
        ImageSpec {
            name: NAME,
            entrypoint: ENTRYPOINT,
            cmd: CMD,
            env: ENV,
            layer: &self.layer,
        }
    }

    /// The image as an OCI archive at `out` (for `ctr images import`, `podman load`, skopeo).
    pub fn write_archive(&self, out: &Path) -> Result<()> {
        write_oci_archive(out, &[self.spec()])
    }

    /// The image's files unpacked under `dir` (the Containerfile copies this into `scratch`).
    pub fn unpack(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(Error::io(dir))?;
        tar::Archive::new(self.layer.as_slice())
            .unpack(dir)
            .map_err(Error::io(dir))
    }
}

/// `objcopy --strip-debug`: the release profile keeps line tables for backtraces on the
/// developer's machine; the image keeps the symbols (panics still name functions) and drops the
/// DWARF, most of the binary's size.
fn strip_debug(binary: &Path, out: &Path) -> Result<()> {
    let result = Command::new("objcopy")
        .arg("--strip-debug")
        .arg(binary)
        .arg(out)
        .output()
        .map_err(|e| Error::Tool {
            tool: "objcopy (binutils)".into(),
            detail: e.to_string(),
        })?;
    if !result.status.success() {
        return Err(Error::Tool {
            tool: format!("objcopy --strip-debug {}", binary.display()),
            detail: String::from_utf8_lossy(&result.stderr).into_owned(),
        });
    }
    Ok(())
}

fn path_in_image(path: &Path) -> Result<String> {
    path.to_str()
        .map(|p| p.trim_start_matches('/').to_string())
        .filter(|p| !p.is_empty())
        .ok_or_else(|| Error::Invalid(format!("bad path in image: {}", path.display())))
}

fn is_loader(path: &str) -> bool {
    path.rsplit('/')
        .next()
        .is_some_and(|f| f.starts_with("ld-"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn name_is_versioned_and_local() {
        assert!(NAME.starts_with("localhost/observer:"));
        assert!(NAME.ends_with(env!("CARGO_PKG_VERSION")));
    }

    /// Any dynamically linked binary shows the recipe; `observer` itself is built by the tests
    /// crate's container test, which imports and runs this image.
    #[test]
    fn image_holds_binary_loader_and_libraries_only() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("observer");
        // The test binary itself: dynamically linked against the same glibc.
        std::fs::copy(std::env::current_exe().unwrap(), &bin).unwrap();
        let image = AgentImage::build(&bin).unwrap();
        let paths: Vec<&str> = image.files.iter().map(|(p, _)| p.as_str()).collect();
        assert!(paths.contains(&BINARY), "{paths:?}");
        assert!(paths.iter().any(|p| p.contains("/ld-linux")), "{paths:?}");
        assert!(paths.iter().any(|p| p.ends_with("/libc.so.6")), "{paths:?}");
        // Every file is the binary, the loader or a shared library.
        for p in &paths {
            assert!(*p == BINARY || p.contains(".so"), "unexpected file {p}");
        }
        let entries = crate::oci::tests::entries(&image.layer);
        for (dir, _) in MOUNT_POINTS {
            assert!(entries.iter().any(|e| e.0 == format!("{dir}/")), "{dir}");
        }
        let original = bin.metadata().unwrap().len();
        let (_, stripped) = image.files.iter().find(|(p, _)| p == BINARY).unwrap();
        assert!(*stripped < original, "debug info was not stripped");
        // Same input, same layer (so the same digest).
        assert_eq!(AgentImage::build(&bin).unwrap().layer, image.layer);
        let out = dir.path().join("unpacked");
        image.unpack(&out).unwrap();
        assert!(out.join("usr/bin/observer").is_file());
    }
}
