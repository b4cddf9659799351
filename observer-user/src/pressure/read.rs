//! Reading a memory cgroup at its limit: which of the container's cgroups it is, what fills it,
//! and its largest processes. Everything read here is the node's, so it is bounded and checked:
//! a `memory.stat` line that does not parse is skipped, a process name is made printable, and a
//! process is named only if it is still in the cgroup once read (a pid is reused).
use std::{
    collections::HashSet,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    time::SystemTime,
};

use prometheus_client::metrics::counter::Counter;
use thiserror::Error;

use super::{Breakdown, Process, Reading, Scope};
use crate::{
    cgroup::{CgroupMounts, HierarchyMount},
    kernel::LimitHit,
    model::printable,
};

/// The most processes looked at for the largest (a container with more is named by its first).
const MAX_PROCESSES: usize = 256;
/// Largest processes named in a warning.
const TOP: usize = 3;
/// The most of a `memory.stat` read.
const MAX_STAT_BYTES: u64 = 16 << 10;

#[derive(Debug, Error)]
pub enum PressureError {
    /// The memory cgroup at its limit is none of the container's cgroup and its parents: the
    /// charge came from elsewhere (a write to `memory.max`, a cgroup the task left).
    #[error("memory cgroup {memcg_id} is not above the container's cgroup {cgroup}")]
    NotAbove { memcg_id: u64, cgroup: String },
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Where memory cgroups are read: the hierarchy the memory controller lives in.
#[derive(Clone, Debug)]
pub struct MemoryReader {
    mount: HierarchyMount,
    v2: bool,
    /// `/proc`, for processes' names and resident memory.
    proc: PathBuf,
    /// Processes left out: no longer in the cgroup that listed them once read.
    dropped: Counter,
}

impl MemoryReader {
    /// cgroup2 where the memory controller is enabled there, else v1's memory hierarchy.
    pub fn new(mounts: &CgroupMounts) -> Option<Self> {
        let v2 = mounts.unified().filter(|u| {
            std::fs::read_to_string(u.mount_point.join("cgroup.controllers"))
                .is_ok_and(|c| c.split_whitespace().any(|c| c == "memory"))
        });
        let (mount, v2) = match v2 {
            Some(u) => (u.clone(), true),
            None => (mounts.v1("memory")?.clone(), false),
        };
        Some(Self {
            mount,
            v2,
            proc: PathBuf::from("/proc"),
            dropped: Counter::default(),
        })
    }

    /// Counts the processes it leaves out in `metrics` (`observer_memory_processes_dropped_total`).
    pub fn counting_in(mut self, metrics: &super::metrics::PressureMetrics) -> Self {
        self.dropped = metrics.processes_dropped.clone();
        self
    }

    pub fn is_v2(&self) -> bool {
        self.v2
    }

    /// Reads the cgroup at its limit for a hit charged by a task of the container whose cgroup is
    /// `container_cgroup` (hierarchy-relative). `top`: also name the largest processes (when a
    /// warning may be raised: it costs a read per process).
    pub fn read(
        &self,
        container_cgroup: &str,
        hit: &LimitHit,
        now: SystemTime,
        top: bool,
    ) -> Result<Reading, PressureError> {
        let mut r = if hit.memcg_id == 0 {
            // The tracepoint's record: the cgroup is the nearest to its limit.
            let (scope, rel, usage) = self.nearest_limit(container_cgroup)?;
            let mut r = self.read_cgroup(scope, &rel, now, top)?;
            r.usage_bytes = usage;
            r
        } else {
            let (scope, rel) = self.scope_of(container_cgroup, hit.memcg_id)?;
            let mut r = self.read_cgroup(scope, &rel, now, top)?;
            r.usage_bytes = hit.usage_bytes;
            if let Some(l) = hit.limit_bytes {
                r.limit_bytes = l;
            }
            // Reclaim freed nothing at the limit: everything charged then was unreclaimable, the
            // kernel's own word. When the cgroup has since lost most of it (the OOM killer acted
            // before this read), that word stands for the reading.
            let nothing_freed = hit.hits > 0 && hit.short == hit.hits && hit.reclaimed_bytes == 0;
            if nothing_freed && self.usage(&rel).unwrap_or(0) < hit.usage_bytes / 2 {
                r.breakdown.freed_since =
                    hit.usage_bytes.saturating_sub(r.breakdown.unreclaimable());
            }
            r
        };
        r.hits = hit.hits;
        r.short = hit.short;
        r.reclaimed_bytes = hit.reclaimed_bytes;
        r.requested_bytes = hit.requested_bytes;
        r.crossing = hit.crossing.map(|c| super::Crossed {
            threshold_bp: c.threshold_bp,
            estimate: None,
        });
        Ok(r)
    }

    /// Reads again a cgroup a warning was raised for, without a hit (a quiet warning's recheck).
    pub fn reread(
        &self,
        container_cgroup: &str,
        scope: &Scope,
        now: SystemTime,
    ) -> Result<Reading, PressureError> {
        let rel = match scope {
            Scope::Container => container_cgroup.to_string(),
            Scope::Pod => parent(container_cgroup).to_string(),
            Scope::Cgroup(c) => c.clone(),
        };
        let mut r = self.read_cgroup(scope.clone(), &rel, now, false)?;
        r.usage_bytes = self.usage(&rel)?;
        Ok(r)
    }

    fn usage(&self, rel: &str) -> Result<u64, PressureError> {
        let file = if self.v2 {
            "memory.current"
        } else {
            "memory.usage_in_bytes"
        };
        Ok(self.number(rel, file)?.unwrap_or(0))
    }

    /// Of the container's cgroup and its parents, the one with a limit and the least room left
    /// under it: (scope, path, usage).
    fn nearest_limit(&self, container_cgroup: &str) -> Result<(Scope, String, u64), PressureError> {
        let mut best: Option<(u64, Scope, String, u64)> = None;
        for (depth, rel) in ancestry(container_cgroup).enumerate() {
            let Ok(Some(limit)) = self.number(&rel, self.limit_file()) else {
                continue;
            };
            let Ok(usage) = self.usage(&rel) else {
                continue;
            };
            let room = limit.saturating_sub(usage);
            if best.as_ref().is_none_or(|b| room < b.0) {
                best = Some((room, scope_at(depth, &rel), rel, usage));
            }
        }
        best.map(|(_, s, rel, usage)| (s, rel, usage))
            .ok_or_else(|| PressureError::NotAbove {
                memcg_id: 0,
                cgroup: container_cgroup.to_string(),
            })
    }

    fn limit_file(&self) -> &'static str {
        if self.v2 {
            "memory.max"
        } else {
            "memory.limit_in_bytes"
        }
    }

    /// The container's cgroup or the parent whose directory is `memcg_id`.
    fn scope_of(
        &self,
        container_cgroup: &str,
        memcg_id: u64,
    ) -> Result<(Scope, String), PressureError> {
        for (depth, rel) in ancestry(container_cgroup).enumerate() {
            let Some(abs) = self.mount.to_absolute(&rel) else {
                continue;
            };
            if std::fs::metadata(&abs).is_ok_and(|m| m.ino() == memcg_id) {
                return Ok((scope_at(depth, &rel), rel));
            }
        }
        Err(PressureError::NotAbove {
            memcg_id,
            cgroup: container_cgroup.to_string(),
        })
    }

    fn read_cgroup(
        &self,
        scope: Scope,
        rel: &str,
        now: SystemTime,
        top: bool,
    ) -> Result<Reading, PressureError> {
        let dir = self.dir(rel)?;
        let stat = read_bounded(&dir.join("memory.stat"))?;
        let limit = self.number(rel, self.limit_file())?.unwrap_or(0);
        // Only the pod's own processes are named: an ancestor's cgroup (a QoS class, kubepods)
        // holds other pods', which this pod's Event must not show.
        let own = matches!(scope, Scope::Container | Scope::Pod);
        let breakdown = if self.v2 {
            breakdown_v2(&stat)
        } else {
            breakdown_v1(&stat)
        };
        Ok(Reading {
            time: now,
            scope,
            usage_bytes: 0,
            limit_bytes: limit,
            breakdown,
            hits: 0,
            short: 0,
            reclaimed_bytes: 0,
            requested_bytes: 0,
            growth: None,
            top: if top && own {
                self.largest(&dir)
            } else {
                Vec::new()
            },
            crossing: None,
        })
    }

    fn dir(&self, rel: &str) -> Result<PathBuf, PressureError> {
        self.mount
            .to_absolute(rel)
            .ok_or_else(|| PressureError::Read {
                path: PathBuf::from(rel),
                source: std::io::Error::other("not a path under the memory hierarchy"),
            })
    }

    /// A number file; `None` for "max" (v2) or v1's page-rounded i64::MAX.
    fn number(&self, rel: &str, file: &str) -> Result<Option<u64>, PressureError> {
        let text = read_bounded(&self.dir(rel)?.join(file))?;
        Ok(text.trim().parse::<u64>().ok().filter(|&b| b < (1 << 62)))
    }

    /// The largest processes of the cgroup and its children (one level: a pod's containers).
    fn largest(&self, dir: &Path) -> Vec<Process> {
        self.largest_with(dir, || {})
    }

    /// [`Self::largest`], running `between` after the cgroups' processes are listed and before
    /// they are read (tests: a pid reused there).
    ///
    /// A pid names a process only while it lives: one that exited after `cgroup.procs` was read
    /// may be reused by another tenant's process before its `/proc` entry is, and that name must
    /// not reach this pod's Event. So each cgroup's `cgroup.procs` is read again once its
    /// processes are, and one no longer listed is left out (and counted). A pid listed both
    /// times was the cgroup's when read: reused in between, it would have to be reused again,
    /// into this cgroup. (Not `/proc/<pid>/cgroup`: in the agent's cgroup namespace its paths
    /// are relative to the namespace's root, not to the hierarchy's.)
    fn largest_with(&self, dir: &Path, between: impl FnOnce()) -> Vec<Process> {
        let mut dirs = vec![dir.to_path_buf()];
        if let Ok(entries) = std::fs::read_dir(dir) {
            dirs.extend(
                entries
                    .flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path()),
            );
        }
        let mut listed: Vec<(PathBuf, Vec<u32>)> = Vec::new();
        let mut count = 0;
        for d in dirs {
            let Some(pids) = procs(&d) else {
                continue;
            };
            let pids: Vec<u32> = pids.into_iter().take(MAX_PROCESSES - count).collect();
            count += pids.len();
            listed.push((d, pids));
            if count >= MAX_PROCESSES {
                break;
            }
        }
        between();
        let mut found = Vec::new();
        for (d, pids) in listed {
            let read: Vec<Process> = pids.into_iter().filter_map(|p| self.process(p)).collect();
            if read.is_empty() {
                continue;
            }
            // Gone with its cgroup: none of them can be told apart from a reused pid.
            let still: HashSet<u32> = procs(&d).unwrap_or_default().into_iter().collect();
            for p in read {
                if still.contains(&p.pid) {
                    found.push(p);
                } else {
                    self.dropped.inc();
                }
            }
        }
        found.sort_by_key(|p| std::cmp::Reverse(p.rss_bytes));
        found.truncate(TOP);
        found
    }

    /// A process's name and resident memory, from `/proc`.
    fn process(&self, pid: u32) -> Option<Process> {
        let page = 4096u64;
        let base = self.proc.join(pid.to_string());
        let statm = read_bounded(&base.join("statm")).ok()?;
        let rss_pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
        let comm = read_bounded(&base.join("comm")).unwrap_or_default();
        Some(Process {
            pid,
            comm: printable(comm.trim_end_matches('\n'))
                .chars()
                .take(64)
                .collect(),
            rss_bytes: rss_pages * page,
        })
    }
}

/// The pids a cgroup's `cgroup.procs` lists; `None` when it cannot be read.
fn procs(dir: &Path) -> Option<Vec<u32>> {
    let text = read_bounded(&dir.join("cgroup.procs")).ok()?;
    Some(
        text.lines()
            .filter_map(|l| l.trim().parse::<u32>().ok())
            .collect(),
    )
}

/// The cgroup and its parents up to the hierarchy's root (excluded: it has no limit).
fn ancestry(rel: &str) -> impl Iterator<Item = String> + '_ {
    let mut next = Some(rel.trim_end_matches('/').to_string());
    std::iter::from_fn(move || {
        let cur = next.take().filter(|c| !c.is_empty() && c != "/")?;
        next = Some(parent(&cur).to_string());
        Some(cur)
    })
    .take(16)
}

fn scope_at(depth: usize, rel: &str) -> Scope {
    match depth {
        0 => Scope::Container,
        1 => Scope::Pod,
        _ => Scope::Cgroup(rel.to_string()),
    }
}

fn parent(rel: &str) -> &str {
    match rel.trim_end_matches('/').rsplit_once('/') {
        Some(("", _)) | None => "/",
        Some((p, _)) => p,
    }
}

fn read_bounded(path: &Path) -> Result<String, PressureError> {
    use std::io::Read;
    let err = |source| PressureError::Read {
        path: path.to_path_buf(),
        source,
    };
    let f = std::fs::File::open(path).map_err(err)?;
    let mut s = String::new();
    f.take(MAX_STAT_BYTES).read_to_string(&mut s).map_err(err)?;
    Ok(s)
}

fn keys(stat: &str) -> impl Iterator<Item = (&str, u64)> {
    stat.lines().filter_map(|l| {
        let (k, v) = l.split_once(' ')?;
        Some((k, v.trim().parse().ok()?))
    })
}

#[cfg(test)]
pub(crate) fn ancestry_of(rel: &str) -> impl Iterator<Item = String> + '_ {
    ancestry(rel)
}

/// cgroup2's `memory.stat`.
pub(crate) fn breakdown_v2(stat: &str) -> Breakdown {
    let mut b = Breakdown::default();
    let (mut file, mut lru_file, mut kernel, mut slab_reclaimable, mut parts) = (0, 0, None, 0, 0);
    for (k, v) in keys(stat) {
        match k {
            "anon" => b.anon = v,
            "file" => file = v,
            "shmem" => b.shmem = v,
            "active_file" | "inactive_file" => lru_file += v,
            // Linux 5.18+: every kernel allocation charged, slab included.
            "kernel" => kernel = Some(v),
            "slab_reclaimable" => slab_reclaimable = v,
            "kernel_stack" | "pagetables" | "sec_pagetables" | "percpu" | "sock"
            | "slab_unreclaimable" => parts += v,
            _ => {}
        }
    }
    // shmem is counted in file but lives on the anon lists: only swap can take it.
    b.file = lru_file;
    b.locked = file.saturating_sub(b.shmem).saturating_sub(lru_file);
    b.kernel = kernel.map_or(parts, |k| k.saturating_sub(slab_reclaimable));
    b
}

/// v1's `memory.stat`: the hierarchical `total_` keys (a pod's cgroup holds its containers').
pub(crate) fn breakdown_v1(stat: &str) -> Breakdown {
    let mut b = Breakdown::default();
    let (mut cache, mut lru_file) = (0, 0);
    for (k, v) in keys(stat) {
        match k {
            "total_rss" => b.anon = v,
            "total_cache" => cache = v,
            "total_shmem" => b.shmem = v,
            "total_active_file" | "total_inactive_file" => lru_file += v,
            _ => {}
        }
    }
    // v1 keeps kernel memory out of memory.stat (memory.kmem.*): it is left out.
    b.file = lru_file;
    b.locked = cache.saturating_sub(b.shmem).saturating_sub(lru_file);
    b
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{cgroup::CgroupVersion, pressure::metrics::PressureMetrics};

    /// A memory hierarchy and a `/proc`, in a directory.
    struct Fake(tempfile::TempDir);

    impl Fake {
        fn new() -> Self {
            Self(tempfile::tempdir().unwrap())
        }

        fn cgroup(&self, rel: &str) -> PathBuf {
            self.0.path().join("cgroup").join(rel)
        }

        /// `rel`'s `cgroup.procs` says `pids`.
        fn procs(&self, rel: &str, pids: &[u32]) {
            let dir = self.cgroup(rel);
            std::fs::create_dir_all(&dir).unwrap();
            let text: String = pids.iter().map(|p| format!("{p}\n")).collect();
            std::fs::write(dir.join("cgroup.procs"), text).unwrap();
        }

        /// Process `pid` is `comm`, with `rss_pages` resident.
        fn process(&self, pid: u32, comm: &str, rss_pages: u64) {
            let dir = self.0.path().join("proc").join(pid.to_string());
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("statm"), format!("9000 {rss_pages} 10 1 0 50 0\n")).unwrap();
            std::fs::write(dir.join("comm"), format!("{comm}\n")).unwrap();
        }

        fn reader(&self) -> MemoryReader {
            MemoryReader {
                mount: HierarchyMount {
                    version: CgroupVersion::V2,
                    mount_point: self.cgroup(""),
                    root: "/".into(),
                },
                v2: true,
                proc: self.0.path().join("proc"),
                dropped: Counter::default(),
            }
        }
    }

    fn names(ps: Vec<Process>) -> Vec<String> {
        ps.into_iter().map(|p| p.comm).collect()
    }

    /// A pid listed in the pod's cgroups that, by the time `/proc` is read, is another tenant's
    /// process (its own exited, the pid reused) is not named, and is counted; so are the
    /// processes of a cgroup gone in between. The others are named as before.
    #[test]
    fn a_process_no_longer_in_its_cgroup_once_read_is_not_named() {
        let f = Fake::new();
        f.procs("pod", &[]);
        f.procs("pod/app", &[41, 42]);
        f.procs("pod/proxy", &[43]);
        f.process(41, "hold.sh", 100);
        f.process(42, "dd", 5000);
        f.process(43, "envoy", 300);
        let metrics = PressureMetrics::default();
        let r = f.reader().counting_in(&metrics);
        let pod = f.cgroup("pod");
        assert_eq!(names(r.largest(&pod)), ["dd", "envoy", "hold.sh"]);
        assert_eq!(metrics.processes_dropped.get(), 0);

        // dd exits after the listing; its pid is another tenant's process when /proc is read.
        let named = r.largest_with(&pod, || {
            f.procs("pod/app", &[41]);
            f.procs("other-pod/app", &[42]);
            f.process(42, "other-tenant", 9000);
        });
        assert_eq!(names(named), ["envoy", "hold.sh"]);
        assert_eq!(metrics.processes_dropped.get(), 1);

        // The proxy's cgroup goes in between (its container ended): its pid is not named.
        let named = r.largest_with(&pod, || {
            std::fs::remove_file(f.cgroup("pod/proxy/cgroup.procs")).unwrap();
        });
        assert_eq!(names(named), ["hold.sh"]);
        assert_eq!(metrics.processes_dropped.get(), 2);

        // A pid reused into the same cgroup is that cgroup's process: named.
        f.procs("pod/proxy", &[43]);
        let named = r.largest_with(&pod, || {
            f.process(43, "envoy-restarted", 200);
        });
        assert_eq!(names(named), ["envoy-restarted", "hold.sh"]);
        assert_eq!(metrics.processes_dropped.get(), 2);
    }
}
