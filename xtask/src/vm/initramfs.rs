//! The guest's root filesystem: one initramfs (cpio "newc", uncompressed) for every kernel.
//!
//! Why an initramfs and not the host's tree over 9p or virtiofs: Debian's cloud kernel has no 9p
//! and builds virtio as modules, and virtiofs needs a daemon on the host; an initramfs needs
//! nothing from the kernel but `CONFIG_BLK_DEV_INITRD`, which every distribution kernel has, so
//! any kernel package a user brings boots the same guest. It holds only what the guest runs:
//! busybox (static, from busybox-static), /init (init.sh), `observer`, the kernel and PLEG test
//! executables, `observer-workload`, and the shared libraries of each as `ldd` finds them here.
//! Our own binaries are copied without their debug info (60 MB → 4 MB each: a TCG guest unpacks
//! every byte), symbols kept for backtraces. Uncompressed: decompressing under TCG costs more than
//! reading a few more megabytes.
use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    io::{self, BufWriter, Write},
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};

use crate::rootfs::runtime_files;

const INIT: &str = include_str!("init.sh");

/// Where the guest finds the suites; `observer-workload` sits in the parent directory, where
/// `observer_tests::kernel::workload()` looks for it (as under target/release/).
pub(super) const GUEST_DIR: &str = "/opt/observer";

/// The binaries the guest runs.
pub(super) struct Payload {
    pub busybox: PathBuf,
    pub observer: PathBuf,
    pub workload: PathBuf,
    /// (name in the guest, test executable): `kernel`, `pleg`, `oom`.
    pub suites: Vec<(String, PathBuf)>,
}

/// Writes the initramfs to `out`; `scratch` holds the stripped copies. Returns its size in bytes.
pub(super) fn build(payload: &Payload, out: &Path, scratch: &Path) -> Result<u64> {
    fs::create_dir_all(scratch).with_context(|| format!("mkdir {}", scratch.display()))?;
    // guest path -> host file
    let mut files: BTreeMap<PathBuf, PathBuf> = BTreeMap::new();
    files.extend(runtime_files(&[&payload.busybox], "/bin")?);
    let ours: Vec<(String, &Path, String)> = [
        (
            "observer".to_string(),
            payload.observer.as_path(),
            GUEST_DIR.to_string(),
        ),
        (
            "observer-workload".to_string(),
            payload.workload.as_path(),
            GUEST_DIR.to_string(),
        ),
    ]
    .into_iter()
    .chain(
        payload
            .suites
            .iter()
            .map(|(n, p)| (n.clone(), p.as_path(), format!("{GUEST_DIR}/deps"))),
    )
    .collect();
    for (name, bin, dir) in ours {
        // Libraries from the real binary; the binary itself as a stripped copy under its guest name.
        let mut deps = runtime_files(&[bin], &dir)?;
        let file_name = bin.file_name().context("binary has no file name")?;
        deps.remove(&Path::new(&dir).join(file_name));
        files.extend(deps);
        let stripped = scratch.join(&name);
        strip_debug(bin, &stripped)?;
        files.insert(Path::new(&dir).join(&name), stripped);
    }

    let tmp = out.with_extension("tmp");
    let mut cpio = Cpio::new(BufWriter::new(
        fs::File::create(&tmp).with_context(|| format!("create {}", tmp.display()))?,
    ));
    let mut dirs = BTreeSet::new();
    for d in ["dev", "proc", "sys", "tmp", "run", "sbin", "etc"] {
        dirs.insert(PathBuf::from(d));
    }
    for path in files.keys() {
        for a in path.ancestors().skip(1) {
            let rel = a.strip_prefix("/").unwrap_or(a);
            if !rel.as_os_str().is_empty() {
                dirs.insert(rel.to_path_buf());
            }
        }
    }
    // BTreeSet order puts a parent before its children.
    for d in &dirs {
        cpio.dir(&d.to_string_lossy())?;
    }
    // The kernel opens /dev/console for init's stdio before init runs; devtmpfs comes later.
    cpio.char_dev("dev/console", 5, 1)?;
    cpio.file("init", 0o755, INIT.as_bytes())?;
    cpio.symlink("bin/sh", "busybox")?;
    for (guest, host) in &files {
        let data = fs::read(host).with_context(|| format!("read {}", host.display()))?;
        let rel = guest.strip_prefix("/").unwrap_or(guest);
        cpio.file(&rel.to_string_lossy(), 0o755, &data)?;
    }
    let size = cpio.finish()?;
    fs::rename(&tmp, out).with_context(|| format!("rename to {}", out.display()))?;
    Ok(size)
}

fn strip_debug(bin: &Path, out: &Path) -> Result<()> {
    let status = Command::new("strip")
        .arg("--strip-debug")
        .arg("-o")
        .arg(out)
        .arg(bin)
        .status()
        .context("running strip (binutils)")?;
    if !status.success() {
        bail!("strip --strip-debug {} failed: {status}", bin.display());
    }
    Ok(())
}

/// A writer of the "newc" cpio format the kernel unpacks (Documentation/driver-api/early-userspace/
/// buffer-format.rst): a 110-byte ASCII header, the NUL-terminated name, the data, each padded to 4
/// bytes; a `TRAILER!!!` entry ends it. Owner root, time 0: the same inputs give the same bytes.
pub(super) struct Cpio<W: Write> {
    w: W,
    ino: u32,
    written: u64,
}

const S_IFDIR: u32 = 0o040000;
const S_IFREG: u32 = 0o100000;
const S_IFLNK: u32 = 0o120000;
const S_IFCHR: u32 = 0o020000;

impl<W: Write> Cpio<W> {
    pub(super) fn new(w: W) -> Self {
        Self {
            w,
            ino: 1,
            written: 0,
        }
    }

    pub(super) fn dir(&mut self, name: &str) -> io::Result<()> {
        self.entry(name, S_IFDIR | 0o755, 2, (0, 0), &[])
    }

    pub(super) fn file(&mut self, name: &str, perm: u32, data: &[u8]) -> io::Result<()> {
        self.entry(name, S_IFREG | perm, 1, (0, 0), data)
    }

    pub(super) fn symlink(&mut self, name: &str, target: &str) -> io::Result<()> {
        self.entry(name, S_IFLNK | 0o777, 1, (0, 0), target.as_bytes())
    }

    pub(super) fn char_dev(&mut self, name: &str, major: u32, minor: u32) -> io::Result<()> {
        self.entry(name, S_IFCHR | 0o600, 1, (major, minor), &[])
    }

    fn entry(
        &mut self,
        name: &str,
        mode: u32,
        nlink: u32,
        rdev: (u32, u32),
        data: &[u8],
    ) -> io::Result<()> {
        let ino = self.ino;
        self.ino += 1;
        let size = u32::try_from(data.len())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "file over 4 GiB"))?;
        // magic, ino, mode, uid, gid, nlink, mtime, filesize, devmajor, devminor, rdevmajor,
        // rdevminor, namesize (with its NUL), check
        let header = format!(
            "070701{ino:08x}{mode:08x}{:08x}{:08x}{nlink:08x}{:08x}{size:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}",
            0,
            0,
            0,
            0,
            0,
            rdev.0,
            rdev.1,
            name.len() + 1,
            0
        );
        self.put(header.as_bytes())?;
        self.put(name.as_bytes())?;
        self.put(&[0])?;
        self.pad()?;
        self.put(data)?;
        self.pad()
    }

    fn put(&mut self, b: &[u8]) -> io::Result<()> {
        self.w.write_all(b)?;
        self.written += b.len() as u64;
        Ok(())
    }

    fn pad(&mut self) -> io::Result<()> {
        let n = (4 - self.written % 4) % 4;
        self.put(&[0; 3][..n as usize])
    }

    /// Writes the trailer; returns the archive's size.
    pub(super) fn finish(mut self) -> io::Result<u64> {
        self.entry("TRAILER!!!", 0, 1, (0, 0), &[])?;
        self.w.flush()?;
        Ok(self.written)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newc_header_layout_and_padding() {
        let mut buf = Vec::new();
        let mut c = Cpio::new(&mut buf);
        c.file("init", 0o755, b"#!/bin/sh\n").unwrap();
        let size = c.finish().unwrap();
        assert_eq!(size as usize, buf.len());
        assert_eq!(buf.len() % 4, 0);
        let h = std::str::from_utf8(&buf[..110]).unwrap();
        assert_eq!(&h[..6], "070701");
        let field = |i: usize| u32::from_str_radix(&h[6 + i * 8..14 + i * 8], 16).unwrap();
        assert_eq!(field(1), 0o100755, "mode");
        assert_eq!(field(6), 10, "filesize");
        assert_eq!(field(11), 5, "namesize counts the NUL");
        // 110 + "init\0" = 115 -> padded to 116, then the data.
        assert_eq!(&buf[110..115], b"init\0");
        assert_eq!(&buf[116..126], b"#!/bin/sh\n");
        assert!(std::str::from_utf8(&buf[128..238])
            .unwrap()
            .starts_with("070701"));
        assert_eq!(&buf[238..249], b"TRAILER!!!\0");
    }

    /// An independent reader (GNU cpio, which scripts/bootstrap.sh installs) lists it.
    #[test]
    fn gnu_cpio_reads_it() {
        let mut buf = Vec::new();
        let mut c = Cpio::new(&mut buf);
        c.dir("bin").unwrap();
        c.file("bin/busybox", 0o755, &[1, 2, 3]).unwrap();
        c.symlink("bin/sh", "busybox").unwrap();
        c.char_dev("console", 5, 1).unwrap();
        c.finish().unwrap();
        let mut child = Command::new("cpio")
            .args(["-t", "--quiet"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("cpio (Debian package cpio; scripts/bootstrap.sh installs it)");
        child.stdin.take().unwrap().write_all(&buf).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success());
        assert_eq!(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .collect::<Vec<_>>(),
            ["bin", "bin/busybox", "bin/sh", "console"]
        );
    }
}
