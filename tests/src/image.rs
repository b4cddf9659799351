//! Images built here, with no registry: a busybox-static rootfs packed as an OCI image archive and
//! imported with `ctr images import`.
use std::io::Write;
use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context, Result};
use serde_json::json;
use sha2::{Digest, Sha256};

/// The image test containers run: busybox with every applet linked into /bin.
pub const BUSYBOX_IMAGE: &str = "localhost/observer/busybox:latest";
/// The sandbox image (containerd's `sandbox_image`): the same rootfs, sleeping forever.
pub const PAUSE_IMAGE: &str = "localhost/observer/pause:latest";

const LAYER_MEDIA_TYPE: &str = "application/vnd.oci.image.layer.v1.tar";
const CONFIG_MEDIA_TYPE: &str = "application/vnd.oci.image.config.v1+json";
const MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";

/// Like the real pause: exits on TERM/INT, otherwise sleeps; `wait` keeps the shell able to run
/// the trap while the sleep runs.
pub const PAUSE_ENTRYPOINT: &[&str] = &[
    "/bin/sh",
    "-c",
    "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done",
];

/// One image of an archive.
pub struct ImageSpec<'a> {
    pub name: &'a str,
    pub entrypoint: &'a [&'a str],
    pub cmd: &'a [&'a str],
    /// An uncompressed layer tar (see [`busybox_layer`]).
    pub layer: &'a [u8],
}

pub fn sha256_hex(data: &[u8]) -> String {
    format!("{:x}", Sha256::digest(data))
}

fn digest(data: &[u8]) -> String {
    format!("sha256:{}", sha256_hex(data))
}

/// Go's GOARCH for this machine, as image configs name architectures.
pub fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        other => other,
    }
}

/// A layer with the static busybox at /bin/busybox, a symlink per applet in /bin, and the few
/// directories runc and the CRI plugin mount onto.
pub fn busybox_layer(busybox: &Path) -> Result<Vec<u8>> {
    let binary =
        std::fs::read(busybox).with_context(|| format!("reading {}", busybox.display()))?;
    let out = Command::new(busybox)
        .arg("--list")
        .output()
        .with_context(|| format!("running {} --list", busybox.display()))?;
    if !out.status.success() {
        bail!("{} --list failed: {}", busybox.display(), out.status);
    }
    let applets = String::from_utf8(out.stdout).context("applet list is not UTF-8")?;

    let mut tar = tar::Builder::new(Vec::new());
    for (dir, mode) in [
        ("bin/", 0o755),
        ("dev/", 0o755),
        ("etc/", 0o755),
        ("proc/", 0o555),
        ("sys/", 0o555),
        ("tmp/", 0o1777),
        ("root/", 0o700),
        ("var/", 0o755),
    ] {
        let mut h = header(tar::EntryType::Directory, mode, 0);
        tar.append_data(&mut h, dir, std::io::empty())?;
    }
    let mut h = header(tar::EntryType::Regular, 0o755, binary.len() as u64);
    tar.append_data(&mut h, "bin/busybox", binary.as_slice())?;
    for applet in applets.lines().map(str::trim) {
        if applet.is_empty() || applet == "busybox" || applet.contains('/') {
            continue;
        }
        let mut h = header(tar::EntryType::Symlink, 0o777, 0);
        tar.append_link(&mut h, format!("bin/{applet}"), "busybox")?;
    }
    for (path, content) in [
        (
            "etc/passwd",
            "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n",
        ),
        ("etc/group", "root:x:0:\nnogroup:x:65534:\n"),
    ] {
        let mut h = header(tar::EntryType::Regular, 0o644, content.len() as u64);
        tar.append_data(&mut h, path, content.as_bytes())?;
    }
    Ok(tar.into_inner()?)
}

/// Fixed owner and time: the same busybox gives the same layer digest on every run.
fn header(kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
    let mut h = tar::Header::new_ustar();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_size(size);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h
}

/// Writes an OCI image layout archive (oci-layout, index.json, blobs/sha256/*) holding `images`,
/// each named by the `io.containerd.image.name` annotation `ctr images import` reads.
pub fn write_oci_archive(out: &Path, images: &[ImageSpec<'_>]) -> Result<()> {
    let mut blobs: Vec<(String, Vec<u8>)> = Vec::new();
    let mut manifests = Vec::new();
    for image in images {
        let layer_digest = digest(image.layer);
        let config = serde_json::to_vec(&json!({
            "architecture": go_arch(),
            "os": "linux",
            "config": {
                "Env": ["PATH=/bin"],
                "Entrypoint": image.entrypoint,
                "Cmd": image.cmd,
                "WorkingDir": "/",
            },
            "rootfs": { "type": "layers", "diff_ids": [layer_digest] },
            "history": [{ "created_by": "observer-tests image builder" }],
        }))?;
        let manifest = serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": MANIFEST_MEDIA_TYPE,
            "config": { "mediaType": CONFIG_MEDIA_TYPE, "digest": digest(&config), "size": config.len() },
            "layers": [{ "mediaType": LAYER_MEDIA_TYPE, "digest": layer_digest, "size": image.layer.len() }],
        }))?;
        let tag = image.name.rsplit_once(':').map_or("latest", |(_, t)| t);
        manifests.push(json!({
            "mediaType": MANIFEST_MEDIA_TYPE,
            "digest": digest(&manifest),
            "size": manifest.len(),
            "platform": { "architecture": go_arch(), "os": "linux" },
            "annotations": {
                "io.containerd.image.name": image.name,
                "org.opencontainers.image.ref.name": tag,
            },
        }));
        blobs.push((sha256_hex(&config), config));
        blobs.push((sha256_hex(&manifest), manifest));
        blobs.push((sha256_hex(image.layer), image.layer.to_vec()));
    }
    blobs.sort_by(|a, b| a.0.cmp(&b.0));
    blobs.dedup_by(|a, b| a.0 == b.0);

    let file = std::fs::File::create(out).with_context(|| format!("creating {}", out.display()))?;
    let mut tar = tar::Builder::new(std::io::BufWriter::new(file));
    let mut add = |path: &str, data: &[u8]| -> Result<()> {
        let mut h = header(tar::EntryType::Regular, 0o644, data.len() as u64);
        tar.append_data(&mut h, path, data)?;
        Ok(())
    };
    add("oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#)?;
    let index = serde_json::to_vec(&json!({ "schemaVersion": 2, "manifests": manifests }))?;
    add("index.json", &index)?;
    for (hex, data) in &blobs {
        add(&format!("blobs/sha256/{hex}"), data)?;
    }
    tar.into_inner()?.flush()?;
    Ok(())
}

/// Imports an archive into containerd's `k8s.io` namespace (where the CRI plugin looks), unpacked
/// for `snapshotter`.
pub fn import(ctr_address: &Path, archive: &Path, snapshotter: &str) -> Result<()> {
    let out = Command::new("ctr")
        .arg("--address")
        .arg(ctr_address)
        .args([
            "-n",
            "k8s.io",
            "images",
            "import",
            "--snapshotter",
            snapshotter,
        ])
        .arg(archive)
        .output()
        .context("running ctr images import")?;
    if !out.status.success() {
        bail!(
            "ctr images import {} failed ({}): {}{}",
            archive.display(),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(tar_bytes: &[u8]) -> Vec<(String, tar::EntryType, Vec<u8>)> {
        let mut a = tar::Archive::new(tar_bytes);
        a.entries()
            .unwrap()
            .map(|e| {
                let mut e = e.unwrap();
                let path = e.path().unwrap().to_string_lossy().into_owned();
                let kind = e.header().entry_type();
                let mut data = Vec::new();
                std::io::Read::read_to_end(&mut e, &mut data).unwrap();
                (path, kind, data)
            })
            .collect()
    }

    #[test]
    fn archive_is_a_consistent_oci_layout() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("img.tar");
        let layer = {
            let mut t = tar::Builder::new(Vec::new());
            let mut h = header(tar::EntryType::Regular, 0o644, 2);
            t.append_data(&mut h, "hi", &b"hi"[..]).unwrap();
            t.into_inner().unwrap()
        };
        write_oci_archive(
            &out,
            &[
                ImageSpec {
                    name: "localhost/a:1",
                    entrypoint: &["/bin/sh"],
                    cmd: &[],
                    layer: &layer,
                },
                ImageSpec {
                    name: "localhost/b:latest",
                    entrypoint: &["/bin/x"],
                    cmd: &["y"],
                    layer: &layer,
                },
            ],
        )
        .unwrap();
        let files = entries(&std::fs::read(&out).unwrap());
        let get = |p: &str| files.iter().find(|f| f.0 == p).map(|f| f.2.clone());
        assert!(get("oci-layout").is_some());
        let index: serde_json::Value = serde_json::from_slice(&get("index.json").unwrap()).unwrap();
        let manifests = index["manifests"].as_array().unwrap();
        assert_eq!(manifests.len(), 2);
        assert_eq!(
            manifests[0]["annotations"]["io.containerd.image.name"],
            "localhost/a:1"
        );
        assert_eq!(
            manifests[0]["annotations"]["org.opencontainers.image.ref.name"],
            "1"
        );
        // The shared layer is stored once; every blob's name is its digest.
        let blobs: Vec<_> = files
            .iter()
            .filter(|f| f.0.starts_with("blobs/sha256/"))
            .collect();
        assert_eq!(blobs.len(), 5, "2 configs + 2 manifests + 1 layer");
        for (path, _, data) in &blobs {
            assert_eq!(path.trim_start_matches("blobs/sha256/"), sha256_hex(data));
        }
        // Follow index -> manifest -> config -> diff_id.
        let mdigest = manifests[1]["digest"]
            .as_str()
            .unwrap()
            .trim_start_matches("sha256:");
        let manifest: serde_json::Value =
            serde_json::from_slice(&get(&format!("blobs/sha256/{mdigest}")).unwrap()).unwrap();
        let cdigest = manifest["config"]["digest"]
            .as_str()
            .unwrap()
            .trim_start_matches("sha256:");
        let config: serde_json::Value =
            serde_json::from_slice(&get(&format!("blobs/sha256/{cdigest}")).unwrap()).unwrap();
        assert_eq!(config["config"]["Entrypoint"][0], "/bin/x");
        assert_eq!(
            config["rootfs"]["diff_ids"][0],
            manifest["layers"][0]["digest"]
        );
        assert_eq!(config["architecture"], go_arch());
    }

    #[test]
    fn busybox_layer_links_applets() {
        let Some(busybox) = crate::prereq::which("busybox") else {
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
