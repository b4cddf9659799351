//! The init pid of each container the agent saw start, kept on the node across agent restarts.
//!
//! A dead container's init pid is gone from the runtime (containerd zeroes it at exit) and from
//! /proc; the kernel log names OOM victims only by pid. So an agent that was restarted while
//! containers died (a DaemonSet upgrade, a crash) could not tell an init's kill from a child's.
//! Every init the kernel shows the agent is appended to a small file in a directory that lives as
//! long as the boot (`/run/observer` by default: tmpfs, gone at reboot when pids lose meaning);
//! the boot id heads the file, so a file from another boot is ignored. Unwritable: said once, and
//! the agent works from memory.
use std::{
    collections::HashMap,
    fs::{self, File, OpenOptions},
    io::Write,
    path::{Path, PathBuf},
};

use crate::cgroup::ContainerId;

const FILE: &str = "inits";
/// Beyond this many lines the file is rewritten with the containers still known.
const COMPACT_AT: usize = 16 * 1024;

pub struct InitStore {
    path: Option<PathBuf>,
    file: Option<File>,
    known: HashMap<ContainerId, u32>,
    lines: usize,
}

fn boot_id() -> String {
    fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

impl InitStore {
    /// Nothing kept beyond this process.
    pub fn in_memory() -> Self {
        Self {
            path: None,
            file: None,
            known: HashMap::new(),
            lines: 0,
        }
    }

    /// Reads what earlier agents of this boot recorded in `dir`, and appends there from now on.
    pub fn open(dir: &Path) -> Self {
        let mut me = Self::in_memory();
        let path = dir.join(FILE);
        let boot = boot_id();
        if let Ok(text) = fs::read_to_string(&path) {
            let mut lines = text.lines();
            if lines.next() == Some(boot.as_str()) {
                for l in lines {
                    let mut f = l.split_whitespace();
                    if let (Some(id), Some(pid)) = (
                        f.next().and_then(ContainerId::parse),
                        f.next().and_then(|p| p.parse().ok()),
                    ) {
                        me.known.insert(id, pid);
                        me.lines += 1;
                    }
                }
            }
        }
        let file = (|| -> std::io::Result<File> {
            fs::create_dir_all(dir)?;
            if me.lines == 0 {
                // A new boot (or no file): start it with this boot's id.
                fs::write(&path, format!("{boot}\n"))?;
            }
            OpenOptions::new().append(true).open(&path)
        })();
        match file {
            Ok(f) => {
                me.file = Some(f);
                me.path = Some(path);
            }
            Err(e) => tracing::info!(
                "container inits not kept across restarts ({}: {e}): after a restart, OOM kills of dead containers may not say whether the init was the victim",
                path.display()
            ),
        }
        me
    }

    pub fn get(&self, id: &ContainerId) -> Option<u32> {
        self.known.get(id).copied()
    }

    pub fn record(&mut self, id: ContainerId, pid: u32) {
        if self.known.insert(id, pid) == Some(pid) {
            return;
        }
        if let Some(f) = &mut self.file {
            // One short line per write: appends of other agents never interleave with it.
            if f.write_all(format!("{id} {pid}\n").as_bytes()).is_err() {
                self.file = None;
            }
            self.lines += 1;
        }
    }

    /// Keeps only the containers `alive` says are still known, rewriting the file when it grew.
    pub fn retain(&mut self, alive: impl Fn(&ContainerId) -> bool) {
        self.known.retain(|id, _| alive(id));
        if self.lines < COMPACT_AT {
            return;
        }
        let Some(path) = &self.path else { return };
        let mut text = format!("{}\n", boot_id());
        for (id, pid) in &self.known {
            text.push_str(&format!("{id} {pid}\n"));
        }
        let tmp = path.with_extension("tmp");
        let written = fs::write(&tmp, text).and_then(|()| fs::rename(&tmp, path));
        match written.and_then(|()| OpenOptions::new().append(true).open(path)) {
            Ok(f) => {
                self.file = Some(f);
                self.lines = self.known.len();
            }
            Err(e) => tracing::debug!("compacting {}: {e}", path.display()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u8) -> ContainerId {
        ContainerId::parse(&format!("{n:064x}")).unwrap()
    }

    #[test]
    fn a_restarted_agent_reads_what_the_last_one_recorded() {
        let dir = tempfile::tempdir().unwrap();
        let mut a = InitStore::open(dir.path());
        a.record(id(1), 100);
        a.record(id(2), 200);
        a.record(id(1), 100);
        drop(a);
        let b = InitStore::open(dir.path());
        assert_eq!(
            (b.get(&id(1)), b.get(&id(2)), b.get(&id(3))),
            (Some(100), Some(200), None)
        );
        assert_eq!(b.lines, 2, "a repeated record is not written twice");
    }

    #[test]
    fn a_file_of_another_boot_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(
            dir.path().join(FILE),
            format!("not-this-boot\n{} 7\n", id(1)),
        )
        .unwrap();
        let s = InitStore::open(dir.path());
        assert_eq!(s.get(&id(1)), None);
        let text = fs::read_to_string(dir.path().join(FILE)).unwrap();
        assert_eq!(
            text,
            format!("{}\n", boot_id()),
            "started over for this boot"
        );
    }

    #[test]
    fn unwritable_is_memory_only() {
        let mut s = InitStore::open(Path::new("/proc/observer-cannot-write-here"));
        s.record(id(1), 1);
        assert_eq!(s.get(&id(1)), Some(1));
        assert!(s.file.is_none());
    }

    #[test]
    fn compaction_keeps_the_living() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = InitStore::open(dir.path());
        for n in 0..5 {
            s.record(id(n), u32::from(n));
        }
        s.lines = COMPACT_AT;
        s.retain(|i| *i == id(3));
        drop(s);
        let s = InitStore::open(dir.path());
        assert_eq!((s.get(&id(3)), s.get(&id(1)), s.lines), (Some(3), None, 1));
    }
}
