//! The images the tests and the test cluster run, built from Debian's static busybox with no
//! registry: busybox itself and a pause image (containerd's `sandbox_image`) on the same layer.
use std::path::Path;
use std::process::Command;

use crate::layer::Layer;
use crate::oci::{write_oci_archive, ImageSpec};
use crate::{Error, Result};

/// The image test containers run: busybox with every applet linked into /bin.
pub const BUSYBOX_IMAGE: &str = "localhost/observer/busybox:latest";
/// The sandbox image (containerd's `sandbox_image`): the same rootfs, sleeping forever.
pub const PAUSE_IMAGE: &str = "localhost/observer/pause:latest";
pub const BUSYBOX_ENV: &[&str] = &["PATH=/bin"];

/// Like the real pause: exits on TERM/INT, otherwise sleeps; `wait` keeps the shell able to run
/// the trap while the sleep runs.
pub const PAUSE_ENTRYPOINT: &[&str] = &[
    "/bin/sh",
    "-c",
    "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done",
];

/// A layer with the static busybox at /bin/busybox, a symlink per applet in /bin, and the few
/// directories runc and the CRI plugin mount onto.
pub fn busybox_layer(busybox: &Path) -> Result<Vec<u8>> {
    let binary = std::fs::read(busybox).map_err(Error::io(busybox))?;
    let tool = format!("{} --list", busybox.display());
    let out = crate::run_tool(Command::new(busybox).arg("--list"), tool.clone())?;
    let applets = String::from_utf8(out.stdout)
        .map_err(|_| Error::Invalid(format!("{tool}: applet list is not UTF-8")))?;

    let mut layer = Layer::new();
    for (dir, mode) in [
        ("bin", 0o755),
        ("dev", 0o755),
        ("etc", 0o755),
        ("proc", 0o555),
        ("sys", 0o555),
        ("tmp", 0o1777),
        ("root", 0o700),
        ("var", 0o755),
    ] {
        layer.dir(dir, mode)?;
    }
    layer.file("bin/busybox", 0o755, &binary)?;
    for applet in applets.lines().map(str::trim) {
        if applet.is_empty() || applet == "busybox" || applet.contains('/') {
            continue;
        }
        layer.symlink(&format!("bin/{applet}"), "busybox")?;
    }
    for (path, content) in [
        (
            "etc/passwd",
            "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n",
        ),
        ("etc/group", "root:x:0:\nnogroup:x:65534:\n"),
    ] {
        layer.file(path, 0o644, content.as_bytes())?;
    }
    layer.finish()
}

/// One archive holding [`BUSYBOX_IMAGE`] and [`PAUSE_IMAGE`], for `ctr images import`.
pub fn write_archive(busybox: &Path, out: &Path) -> Result<()> {
    let layer = busybox_layer(busybox)?;
    write_oci_archive(
        out,
        &[
            ImageSpec {
                name: BUSYBOX_IMAGE,
                entrypoint: &["/bin/sh"],
                cmd: &[],
                env: BUSYBOX_ENV,
                layer: &layer,
            },
            ImageSpec {
                name: PAUSE_IMAGE,
                entrypoint: PAUSE_ENTRYPOINT,
                cmd: &[],
                env: BUSYBOX_ENV,
                layer: &layer,
            },
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oci::tests::entries;

    fn which_busybox() -> Option<std::path::PathBuf> {
        std::env::var_os("PATH")?
            .to_str()?
            .split(':')
            .map(|d| Path::new(d).join("busybox"))
            .find(|p| p.is_file())
    }

    #[test]
    fn busybox_layer_links_applets() {
        let Some(busybox) = which_busybox() else {
            // Only the file layout is checked here; the containerd tests enforce presence.
            eprintln!("SKIPPED: busybox not installed");
            return;
        };
        let layer = busybox_layer(&busybox).unwrap();
        let files = entries(&layer);
        let find = |p: &str| files.iter().find(|f| f.0 == p);
        let bin = find("bin/busybox").expect("bin/busybox");
        assert_eq!(bin.2.len() as u64, busybox.metadata().unwrap().len());
        for applet in [
            "bin/sh",
            "bin/sleep",
            "bin/cat",
            "bin/echo",
            "bin/kill",
            "bin/head",
        ] {
            let (_, kind, _) = find(applet).unwrap_or_else(|| panic!("{applet} missing"));
            assert_eq!(*kind, tar::EntryType::Symlink, "{applet}");
        }
        assert!(find("tmp/").is_some());
        assert_eq!(
            busybox_layer(&busybox).unwrap(),
            layer,
            "layer is reproducible"
        );
    }
}
