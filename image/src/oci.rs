//! The OCI image layout (oci-layout, index.json, blobs/sha256/*) written as one tar: what
//! `ctr images import`, `podman load` and `skopeo copy oci-archive:...` read. One layer per
//! image, uncompressed (importers accept it; registries compress on push).
use std::io::Write;
use std::path::Path;

use serde_json::json;
use sha2::{Digest, Sha256};

use crate::layer::header;
use crate::{Error, Result};

const LAYER_MEDIA_TYPE: &str = "application/vnd.oci.image.layer.v1.tar";
const CONFIG_MEDIA_TYPE: &str = "application/vnd.oci.image.config.v1+json";
const MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";

/// One image of an archive.
pub struct ImageSpec<'a> {
    /// Full reference, `host/name:tag`, as containerd names the imported image.
    pub name: &'a str,
    pub entrypoint: &'a [&'a str],
    pub cmd: &'a [&'a str],
    /// `KEY=value` entries of the image config's Env.
    pub env: &'a [&'a str],
    /// An uncompressed layer tar (see [`crate::layer::Layer`]).
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

/// Writes an OCI image layout archive holding `images`, each named by the
/// `io.containerd.image.name` annotation `ctr images import` reads.
pub fn write_oci_archive(out: &Path, images: &[ImageSpec<'_>]) -> Result<()> {
    let mut blobs: Vec<(String, Vec<u8>)> = Vec::new();
    let mut manifests = Vec::new();
    for image in images {
        let layer_digest = digest(image.layer);
        let config = serde_json::to_vec(&json!({
            "architecture": go_arch(),
            "os": "linux",
            "config": {
                "Env": image.env,
                "Entrypoint": image.entrypoint,
                "Cmd": image.cmd,
                "WorkingDir": "/",
            },
            "rootfs": { "type": "layers", "diff_ids": [layer_digest] },
            "history": [{ "created_by": "observer-image (no container engine)" }],
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

    let file = std::fs::File::create(out).map_err(Error::io(out))?;
    let mut tar = tar::Builder::new(std::io::BufWriter::new(file));
    let mut add = |path: &str, data: &[u8]| -> Result<()> {
        let mut h = header(tar::EntryType::Regular, 0o644, data.len() as u64);
        tar.append_data(&mut h, path, data)
            .map_err(|source| Error::Tar {
                path: path.into(),
                source,
            })
    };
    add("oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#)?;
    let index = serde_json::to_vec(&json!({ "schemaVersion": 2, "manifests": manifests }))?;
    add("index.json", &index)?;
    for (hex, data) in &blobs {
        add(&format!("blobs/sha256/{hex}"), data)?;
    }
    tar.into_inner()
        .map_err(Error::io(out))?
        .flush()
        .map_err(Error::io(out))?;
    Ok(())
}

/// Imports an archive into containerd's `k8s.io` namespace (where the CRI plugin looks), unpacked
/// for `snapshotter`, with containerd's own `ctr`.
pub fn ctr_import(ctr_address: &Path, archive: &Path, snapshotter: &str) -> Result<()> {
    crate::run_tool(
        std::process::Command::new("ctr")
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
            .arg(archive),
        format!("ctr images import {}", archive.display()),
    )?;
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::layer::Layer;

    pub(crate) fn entries(tar_bytes: &[u8]) -> Vec<(String, tar::EntryType, Vec<u8>)> {
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
            let mut l = Layer::new();
            l.file("hi", 0o644, b"hi").unwrap();
            l.finish().unwrap()
        };
        write_oci_archive(
            &out,
            &[
                ImageSpec {
                    name: "localhost/a:1",
                    entrypoint: &["/bin/sh"],
                    cmd: &[],
                    env: &["PATH=/bin"],
                    layer: &layer,
                },
                ImageSpec {
                    name: "localhost/b:latest",
                    entrypoint: &["/bin/x"],
                    cmd: &["y"],
                    env: &[],
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
        assert_eq!(config["config"]["Cmd"][0], "y");
        assert_eq!(
            config["rootfs"]["diff_ids"][0],
            manifest["layers"][0]["digest"]
        );
        assert_eq!(config["architecture"], go_arch());
    }
}
