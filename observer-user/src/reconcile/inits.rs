//! The init pid of each container the agent saw start, kept on the node across agent restarts.
//!
//! A dead container's init pid is gone from the runtime (containerd zeroes it at exit) and from
//! /proc; the kernel log names OOM victims only by pid. So an agent that was restarted while
//! containers died (a DaemonSet upgrade, a crash) could not tell an init's kill from a child's.
//! Every init the kernel shows the agent is kept in a small file in a directory that lives as long
//! as the boot (`/run/observer` by default: tmpfs, gone at reboot when pids lose meaning); the boot
//! id heads the file.
//!
//! The state is never lost or hijacked:
//! - one agent per directory: it holds an exclusive lock on `<dir>/lock` (which names its pid) for
//!   its life; a second one is refused, naming the holder;
//! - each write is a new file written, synced and renamed over the old one, so a crash at any
//!   point leaves the old file or the new one, and a symlink planted at the path is replaced,
//!   never followed;
//! - a file that does not parse, or is not a regular file, or is of another boot, is renamed aside
//!   with a timestamp and reported, never silently replaced;
//! - [`StateAccess::ReadOnly`] (`observer status`) reads without the lock and never writes.
//!
//! Unwritable: said once, and the agent works from memory.
use std::{
    collections::HashMap,
    fs::{self, File, OpenOptions},
    io::{ErrorKind, Read, Write},
    os::unix::fs::OpenOptionsExt,
    path::{Path, PathBuf},
    time::{SystemTime, UNIX_EPOCH},
};

use nix::fcntl::{Flock, FlockArg};

use crate::model::ContainerId;

const FILE: &str = "inits";
const LOCK: &str = "lock";
/// The most the file is read of: 76 bytes an entry, so about 13 000 containers; anything
/// larger was not written by an agent.
const MAX_BYTES: u64 = 1 << 20;

/// Whether this process may write the state directory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StateAccess {
    /// Read what is there, never write (read-only commands, beside a running agent).
    #[default]
    ReadOnly,
    /// The agent: lock the directory, keep it up to date.
    ReadWrite,
}

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("the state directory {dir} is held by another observer (pid {holder}): one agent per node and state directory; stop that one, or give this one another --state-dir")]
    Locked { dir: PathBuf, holder: String },
}

pub(crate) struct InitStore {
    /// Where to write, with the lock that makes this process the only writer.
    writer: Option<(PathBuf, Flock<File>)>,
    known: HashMap<ContainerId, u32>,
    boot: String,
    /// The last save failed (ENOSPC, EIO): said once, retried at each change, the lock kept.
    failing: bool,
}

fn boot_id() -> String {
    fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Why a file is not used: what the report says, and the name it is kept aside under.
struct Unused {
    why: String,
    kind: &'static str,
}

impl InitStore {
    /// Nothing kept beyond this process.
    pub(crate) fn in_memory() -> Self {
        Self {
            writer: None,
            known: HashMap::new(),
            boot: boot_id(),
            failing: false,
        }
    }

    /// Reads what earlier agents of this boot recorded in `dir`; with [`StateAccess::ReadWrite`],
    /// locks `dir` and keeps the file up to date from now on.
    pub(crate) fn open(dir: &Path, access: StateAccess) -> Result<Self, StateError> {
        let mut me = Self::in_memory();
        let lock = match access {
            StateAccess::ReadOnly => None,
            StateAccess::ReadWrite => match lock(dir) {
                Ok(l) => Some(l),
                Err(LockError::Held(holder)) => {
                    return Err(StateError::Locked {
                        dir: dir.to_path_buf(),
                        holder,
                    })
                }
                Err(LockError::Io(e)) => {
                    tracing::warn!(
                        "container inits not kept across restarts ({}: {e}): after a restart, OOM kills of dead containers may not say whether the init was the victim",
                        dir.display()
                    );
                    None
                }
            },
        };
        let path = dir.join(FILE);
        match read(&path, &me.boot) {
            Ok(known) => me.known = known,
            Err(unused) if lock.is_some() => keep_aside(&path, &unused),
            Err(unused) => tracing::warn!(
                "{}: {}; not used (the agent keeps it aside when it starts)",
                path.display(),
                unused.why
            ),
        }
        if let Some(lock) = lock {
            me.writer = Some((path, lock));
            me.save();
        }
        Ok(me)
    }

    pub(crate) fn get(&self, id: &ContainerId) -> Option<u32> {
        self.known.get(id).copied()
    }

    pub(crate) fn record(&mut self, id: ContainerId, pid: u32) {
        if self.known.insert(id, pid) != Some(pid) {
            self.save();
        }
    }

    /// Keeps only the containers `alive` says are still known.
    pub(crate) fn retain(&mut self, alive: impl Fn(&ContainerId) -> bool) {
        let before = self.known.len();
        self.known.retain(|id, _| alive(id));
        if self.known.len() != before {
            self.save();
        }
    }

    /// Replaces the file with what is known: a new file, synced, renamed over the old one.
    fn save(&mut self) {
        let Some((path, _)) = &self.writer else {
            return;
        };
        let mut text = format!("{}\n", self.boot);
        for (id, pid) in &self.known {
            text.push_str(&format!("{id} {pid}\n"));
        }
        // The lock stays held whatever happens: released, a second agent could take the
        // directory while this one runs on (the file then written by two).
        match replace(path, text.as_bytes()) {
            Err(e) if !self.failing => {
                tracing::warn!(
                    "container inits cannot be written ({}: {e}): the agent goes on from memory and tries again at each change; until one succeeds, a restart loses the inits of containers that die meanwhile",
                    path.display()
                );
                self.failing = true;
            }
            Err(_) => {}
            Ok(()) if self.failing => {
                tracing::info!("container inits written again ({})", path.display());
                self.failing = false;
            }
            Ok(()) => {}
        }
    }
}

enum LockError {
    Held(String),
    Io(std::io::Error),
}

/// Takes `<dir>/lock` and writes this process's pid in it.
fn lock(dir: &Path) -> Result<Flock<File>, LockError> {
    fs::create_dir_all(dir).map_err(LockError::Io)?;
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o644)
        // O_NONBLOCK: a FIFO put there must not hang start-up (it is refused below).
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(dir.join(LOCK))
        .map_err(LockError::Io)?;
    if !file.metadata().map_err(LockError::Io)?.is_file() {
        return Err(LockError::Io(std::io::Error::other(
            "the lock is not a regular file",
        )));
    }
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(mut held) => {
            let pid = std::process::id();
            let written = held
                .set_len(0)
                .and_then(|()| held.write_all(format!("{pid}\n").as_bytes()));
            written.map_err(LockError::Io)?;
            Ok(held)
        }
        Err((mut file, nix::errno::Errno::EWOULDBLOCK)) => {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            let holder = holder.trim();
            Err(LockError::Held(if holder.is_empty() {
                "unknown".into()
            } else {
                holder.to_string()
            }))
        }
        Err((_, e)) => Err(LockError::Io(e.into())),
    }
}

/// The file's entries; `Err` says why it cannot be used. An absent file is an empty one.
fn read(path: &Path, boot: &str) -> Result<HashMap<ContainerId, u32>, Unused> {
    let unreadable = |why: String| Unused {
        why,
        kind: "unreadable",
    };
    let file = match OpenOptions::new()
        .read(true)
        // O_NONBLOCK: opening a FIFO for reading would wait for a writer; it is refused below.
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(HashMap::new()),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(unreadable("a symlink, not the agent's file".into()))
        }
        Err(e) => return Err(unreadable(e.to_string())),
    };
    if !file.metadata().is_ok_and(|m| m.is_file()) {
        return Err(unreadable("not a regular file".into()));
    }
    let mut bytes = Vec::new();
    file.take(MAX_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| unreadable(e.to_string()))?;
    if bytes.len() as u64 > MAX_BYTES {
        return Err(unreadable(format!("larger than {MAX_BYTES} bytes")));
    }
    let text = String::from_utf8(bytes).map_err(|_| unreadable("not text".into()))?;
    let mut lines = text.lines();
    let first = lines.next().unwrap_or_default();
    if !is_boot_id(first) {
        return Err(unreadable(format!(
            "line 1 is not a boot id: {:?}",
            first.chars().take(40).collect::<String>()
        )));
    }
    let mut known = HashMap::new();
    for (n, l) in lines.enumerate() {
        let mut f = l.split(' ');
        match (
            f.next().and_then(ContainerId::parse),
            f.next().and_then(|p| p.parse::<u32>().ok()),
            f.next(),
        ) {
            (Some(id), Some(pid), None) => {
                known.insert(id, pid);
            }
            _ => {
                return Err(unreadable(format!(
                    "line {} is not \"<container id> <pid>\"",
                    n + 2
                )))
            }
        }
    }
    if first != boot {
        return Err(Unused {
            why: format!("written in another boot ({first})"),
            kind: "other-boot",
        });
    }
    Ok(known)
}

/// The kernel's boot id: a UUID in its 8-4-4-4-12 form.
fn is_boot_id(s: &str) -> bool {
    let parts: Vec<&str> = s.split('-').collect();
    parts.iter().map(|p| p.len()).eq([8, 4, 4, 4, 12])
        && parts
            .iter()
            .all(|p| p.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Renames an unused file aside (`inits.<kind>-<unix time>`) and says so.
fn keep_aside(path: &Path, unused: &Unused) {
    let at = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let aside = path.with_file_name(format!(
        "{FILE}.{}-{}.{:09}",
        unused.kind,
        at.as_secs(),
        at.subsec_nanos()
    ));
    match fs::rename(path, &aside) {
        Ok(()) if unused.kind == "other-boot" => tracing::info!(
            "{}: {}; kept as {}, starting a new one",
            path.display(),
            unused.why,
            aside.display()
        ),
        Ok(()) => tracing::warn!(
            "{}: {}; kept as {} for inspection, starting a new one (inits of containers that died before this start are not known)",
            path.display(),
            unused.why,
            aside.display()
        ),
        Err(e) => tracing::warn!(
            "{}: {}; it could not be kept aside ({e}) and is replaced",
            path.display(),
            unused.why
        ),
    }
}

/// Writes `bytes` to a new file beside `path`, syncs it and renames it over `path` (a symlink
/// there is replaced, not followed).
fn replace(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_file_name(format!(".{FILE}.tmp"));
    // Left by a crash in the middle of a write; the lock makes it ours.
    match fs::remove_file(&tmp) {
        Err(e) if e.kind() != ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        File::open(dir)?.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
