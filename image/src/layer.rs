//! A layer tar (uncompressed) with fixed owner, group and time on every entry: the same files
//! always give the same bytes, so the same layer digest on every build.
use std::collections::BTreeSet;

use crate::{Error, Result};

pub struct Layer {
    tar: tar::Builder<Vec<u8>>,
    /// Directories written so far (without the trailing slash), so that parents are written once
    /// and before their children, as unpackers expect.
    dirs: BTreeSet<String>,
}

impl Default for Layer {
    fn default() -> Self {
        Self::new()
    }
}

impl Layer {
    pub fn new() -> Self {
        Layer {
            tar: tar::Builder::new(Vec::new()),
            dirs: BTreeSet::new(),
        }
    }

    /// A directory (`path` relative to the root, e.g. `tmp`) and any missing parents (0755).
    pub fn dir(&mut self, path: &str, mode: u32) -> Result<()> {
        let path = path.trim_matches('/');
        if path.is_empty() || self.dirs.contains(path) {
            return Ok(());
        }
        if let Some((parent, _)) = path.rsplit_once('/') {
            self.dir(parent, 0o755)?;
        }
        let mut h = header(tar::EntryType::Directory, mode, 0);
        let name = format!("{path}/");
        self.tar
            .append_data(&mut h, &name, std::io::empty())
            .map_err(|source| Error::Tar { path: name, source })?;
        self.dirs.insert(path.to_string());
        Ok(())
    }

    /// A regular file; missing parent directories are added (0755).
    pub fn file(&mut self, path: &str, mode: u32, data: &[u8]) -> Result<()> {
        let path = self.parents(path)?;
        let mut h = header(tar::EntryType::Regular, mode, data.len() as u64);
        self.tar
            .append_data(&mut h, &path, data)
            .map_err(|source| Error::Tar { path, source })
    }

    /// A symbolic link `path` → `target`; missing parent directories are added (0755).
    pub fn symlink(&mut self, path: &str, target: &str) -> Result<()> {
        let path = self.parents(path)?;
        let mut h = header(tar::EntryType::Symlink, 0o777, 0);
        self.tar
            .append_link(&mut h, &path, target)
            .map_err(|source| Error::Tar { path, source })
    }

    fn parents(&mut self, path: &str) -> Result<String> {
        let path = path.trim_start_matches('/');
        if path.is_empty() || path.ends_with('/') {
            return Err(Error::Invalid(format!("not a file path: {path:?}")));
        }
        if let Some((parent, _)) = path.rsplit_once('/') {
            self.dir(parent, 0o755)?;
        }
        Ok(path.to_string())
    }

    pub fn finish(self) -> Result<Vec<u8>> {
        self.tar.into_inner().map_err(|source| Error::Tar {
            path: "(end of archive)".into(),
            source,
        })
    }
}

/// Fixed owner and time: the same content gives the same digest on every run.
pub(crate) fn header(kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
    let mut h = tar::Header::new_ustar();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_size(size);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parents_come_first_and_once() {
        let mut l = Layer::new();
        l.file("usr/bin/x", 0o755, b"x").unwrap();
        l.symlink("usr/bin/y", "x").unwrap();
        l.dir("tmp", 0o1777).unwrap();
        let bytes = l.finish().unwrap();
        let mut a = tar::Archive::new(bytes.as_slice());
        let got: Vec<(String, u32)> = a
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let path = e.path().unwrap().to_string_lossy().into_owned();
                (path, e.header().mode().unwrap())
            })
            .collect();
        assert_eq!(
            got,
            [
                ("usr/".to_string(), 0o755),
                ("usr/bin/".to_string(), 0o755),
                ("usr/bin/x".to_string(), 0o755),
                ("usr/bin/y".to_string(), 0o777),
                ("tmp/".to_string(), 0o1777),
            ]
        );
    }

    #[test]
    fn directories_are_not_files() {
        assert!(Layer::new().file("etc/", 0o644, b"").is_err());
    }
}
