//! Ring-buffer record → [`KernelEvent`]: one small function per record kind.
use observer_common::{
    CgroupRecord, CrossingRecord, EventKind, ExecRecord, ExitRecord, Header, LimitHitRecord,
    OomRecord, Record, TaskInfo,
};
use thiserror::Error;

use super::event::*;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("record of {len} bytes is shorter than its header")]
    NoHeader { len: usize },
    #[error("unknown record kind {0}")]
    UnknownKind(u32),
    #[error("{kind:?} record of {len} bytes, expected at least {want}")]
    Short {
        kind: EventKind,
        len: usize,
        want: usize,
    },
}

/// Copies a record out of the ring buffer's bytes, checking its length.
fn read<R: Record>(bytes: &[u8]) -> Result<R, DecodeError> {
    let want = size_of::<R>();
    if bytes.len() < want {
        return Err(DecodeError::Short {
            kind: R::KIND,
            len: bytes.len(),
            want,
        });
    }
    // SAFETY: length checked; `Record` guarantees every bit pattern is a valid R.
    Ok(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<R>()) })
}

pub fn decode(bytes: &[u8]) -> Result<KernelEvent, DecodeError> {
    if bytes.len() < size_of::<Header>() {
        return Err(DecodeError::NoHeader { len: bytes.len() });
    }
    // SAFETY: length checked; Header is plain integers.
    let header = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<Header>()) };
    let kind = EventKind::from_u32(header.kind).ok_or(DecodeError::UnknownKind(header.kind))?;
    Ok(match kind {
        EventKind::Exec => KernelEvent::Exec(exec(&read(bytes)?)),
        EventKind::Exit => KernelEvent::Exit(exit(&read(bytes)?)),
        EventKind::OomKill => KernelEvent::OomKill(oom(&read(bytes)?)),
        EventKind::CgroupMkdir => KernelEvent::CgroupMkdir(cgroup(&read(bytes)?)),
        EventKind::CgroupRmdir => KernelEvent::CgroupRmdir(cgroup(&read(bytes)?)),
        EventKind::CgroupEmpty => KernelEvent::CgroupEmpty(cgroup(&read(bytes)?)),
        EventKind::LimitHit => KernelEvent::LimitHit(limit_hit(&read(bytes)?)),
        EventKind::LimitCrossing => KernelEvent::LimitHit(crossing(&read(bytes)?)),
    })
}

fn task(t: &TaskInfo) -> Task {
    Task {
        pid: t.pid,
        tgid: t.tgid,
        ppid: t.ppid,
        ns_pid: t.ns_pid,
        ns_level: t.ns_level,
        comm: Comm::from_nul_terminated(&t.comm),
        cgroup_id: t.cgroup_id,
    }
}

fn c_string(raw: &[u8]) -> String {
    let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
    String::from_utf8_lossy(&raw[..end]).into_owned()
}

fn exec(r: &ExecRecord) -> Exec {
    Exec {
        at: BootNs(r.header.time_ns),
        task: task(&r.task),
        old_pid: r.old_pid,
        filename: c_string(&r.filename),
    }
}

fn exit(r: &ExitRecord) -> Exit {
    Exit {
        at: BootNs(r.header.time_ns),
        task: task(&r.task),
        status: WaitStatus(r.exit_code),
        group_dead: r.group_dead != 0,
    }
}

fn oom(r: &OomRecord) -> OomKill {
    let p = &r.pending;
    let kb = |v: u64| (v != u64::MAX).then_some(v);
    OomKill {
        at: BootNs(r.header.time_ns),
        marked_at: BootNs(p.marked_ns),
        victim: task(&r.victim),
        victim_comm: Comm::from_nul_terminated(&p.comm),
        memory: OomMemory {
            total_vm_kb: kb(p.total_vm_kb),
            anon_rss_kb: kb(p.anon_rss_kb),
            file_rss_kb: kb(p.file_rss_kb),
            shmem_rss_kb: kb(p.shmem_rss_kb),
        },
        oom_score_adj: (p.has_oom_score_adj != 0).then_some(p.oom_score_adj),
        trigger_pid: p.trigger_pid,
        trigger_tgid: p.trigger_tgid,
        trigger_cgroup_id: p.trigger_cgroup_id,
    }
}

/// The kernel's page size (`page_counter` counts pages).
fn page_size() -> u64 {
    static PAGE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *PAGE.get_or_init(|| {
        nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
            .ok()
            .flatten()
            .map_or(4096, |p| p as u64)
    })
}

/// What an unlimited page counter holds: PAGE_COUNTER_MAX (LONG_MAX / PAGE_SIZE).
pub(crate) fn unlimited_pages() -> u64 {
    i64::MAX as u64 / page_size()
}

fn limit_hit(r: &LimitHitRecord) -> LimitHit {
    let page = page_size();
    let unlimited = unlimited_pages();
    LimitHit {
        at: BootNs(r.header.time_ns),
        first_at: BootNs(if r.first_ns == 0 {
            r.header.time_ns
        } else {
            r.first_ns
        }),
        task: task(&r.task),
        memcg_id: r.memcg_id,
        usage_bytes: r.usage_pages.saturating_mul(page),
        // No memory cgroup (the tracepoint's record): no counter was read.
        limit_bytes: (r.memcg_id != 0 && r.max_pages < unlimited)
            .then(|| r.max_pages.saturating_mul(page)),
        hits: r.hits,
        short: r.short,
        requested_bytes: r.requested_pages.saturating_mul(page),
        reclaimed_bytes: r.reclaimed_pages.saturating_mul(page),
        crossing: None,
    }
}

/// A crossing is said the way a limit hit is, without reclaim: the PLEG and the reconciler take
/// it down the limit hits' path (which container, which of its cgroups, what fills it).
fn crossing(r: &CrossingRecord) -> LimitHit {
    let page = page_size();
    LimitHit {
        at: BootNs(r.header.time_ns),
        first_at: BootNs(r.header.time_ns),
        task: task(&r.task),
        memcg_id: r.memcg_id,
        usage_bytes: r.usage_pages.saturating_mul(page),
        // The kernel side sends crossings of limits only.
        limit_bytes: (r.max_pages < unlimited_pages()).then(|| r.max_pages.saturating_mul(page)),
        hits: 0,
        short: 0,
        requested_bytes: 0,
        reclaimed_bytes: 0,
        crossing: Some(Crossing {
            threshold_bp: r.threshold_bp,
            depth: r.depth,
        }),
    }
}

fn cgroup(r: &CgroupRecord) -> CgroupChange {
    CgroupChange {
        at: BootNs(r.header.time_ns),
        id: r.id,
        level: r.level,
        hierarchy: r.hierarchy,
        path: c_string(&r.path),
    }
}

#[cfg(test)]
mod tests {
    use observer_common::{oom::OomPending, COMM_LEN};

    use super::*;

    fn bytes<T>(v: &T) -> Vec<u8> {
        // SAFETY: reading the bytes of a repr(C) value for the test.
        unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), size_of::<T>()) }.to_vec()
    }

    fn header(kind: EventKind, t: u64) -> Header {
        Header {
            kind: kind as u32,
            cpu: 1,
            time_ns: t,
        }
    }

    fn comm(s: &str) -> [u8; COMM_LEN] {
        let mut c = [0; COMM_LEN];
        c[..s.len()].copy_from_slice(s.as_bytes());
        c
    }

    fn task_info() -> TaskInfo {
        TaskInfo {
            pid: 11,
            tgid: 10,
            ppid: 1,
            ns_pid: 1,
            ns_level: 1,
            _pad: 0,
            cgroup_id: 4242,
            comm: comm("worker"),
        }
    }

    #[test]
    fn exit_record() {
        let r = ExitRecord {
            header: header(EventKind::Exit, 5),
            task: task_info(),
            exit_code: 9,
            group_dead: 1,
            _pad: [0; 3],
        };
        let KernelEvent::Exit(e) = decode(&bytes(&r)).unwrap() else {
            panic!()
        };
        assert_eq!(e.at, BootNs(5));
        assert_eq!(
            (e.task.pid, e.task.tgid, e.task.ppid, e.task.cgroup_id),
            (11, 10, 1, 4242)
        );
        assert_eq!(e.task.comm.as_str(), "worker");
        assert!(e.task.is_namespace_init());
        assert_eq!(e.status.signal(), Some(9));
        assert!(e.group_dead);
    }

    #[test]
    fn exec_record() {
        let mut filename = [0; observer_common::exec::FILENAME_LEN];
        filename[..7].copy_from_slice(b"/bin/sh");
        let r = ExecRecord {
            header: header(EventKind::Exec, 7),
            task: task_info(),
            old_pid: 11,
            _pad: 0,
            filename,
        };
        let KernelEvent::Exec(e) = decode(&bytes(&r)).unwrap() else {
            panic!()
        };
        assert_eq!(e.filename, "/bin/sh");
        assert_eq!(e.old_pid, 11);
    }

    #[test]
    fn oom_record_with_and_without_memory_fields() {
        let pending = OomPending {
            marked_ns: 3,
            total_vm_kb: 1000,
            anon_rss_kb: 900,
            file_rss_kb: u64::MAX,
            shmem_rss_kb: 0,
            trigger_pid: 20,
            trigger_tgid: 20,
            trigger_cgroup_id: 77,
            oom_score_adj: -997,
            has_oom_score_adj: 1,
            _pad: [0; 5],
            comm: comm("hog"),
        };
        let r = OomRecord {
            header: header(EventKind::OomKill, 4),
            victim: task_info(),
            pending,
        };
        let KernelEvent::OomKill(o) = decode(&bytes(&r)).unwrap() else {
            panic!()
        };
        assert_eq!((o.at, o.marked_at), (BootNs(4), BootNs(3)));
        assert_eq!(
            o.memory,
            OomMemory {
                total_vm_kb: Some(1000),
                anon_rss_kb: Some(900),
                file_rss_kb: None,
                shmem_rss_kb: Some(0)
            }
        );
        assert_eq!(o.oom_score_adj, Some(-997));
        assert_eq!(o.victim_comm.as_str(), "hog");
        assert_eq!(o.trigger_cgroup_id, 77);
    }

    #[test]
    fn limit_hit_record_in_bytes_and_an_unlimited_counter() {
        let page = page_size();
        let mut r = LimitHitRecord {
            header: header(EventKind::LimitHit, 9),
            task: task_info(),
            memcg_id: 31,
            usage_pages: 16384,
            max_pages: 16384,
            first_ns: 0,
            requested_pages: 64,
            reclaimed_pages: 12,
            hits: 3,
            short: 2,
        };
        let KernelEvent::LimitHit(h) = decode(&bytes(&r)).unwrap() else {
            panic!()
        };
        // A window of one reclaim: it started when it was sent.
        assert_eq!((h.at, h.first_at), (BootNs(9), BootNs(9)));
        assert_eq!(
            (h.memcg_id, h.usage_bytes, h.limit_bytes),
            (31, 16384 * page, Some(16384 * page))
        );
        assert_eq!(
            (h.hits, h.short, h.requested_bytes, h.reclaimed_bytes),
            (3, 2, 64 * page, 12 * page)
        );
        r.max_pages = i64::MAX as u64 / page;
        r.first_ns = 4;
        let KernelEvent::LimitHit(h) = decode(&bytes(&r)).unwrap() else {
            panic!()
        };
        assert_eq!((h.first_at, h.limit_bytes), (BootNs(4), None));
        // The tracepoint's record names no memory cgroup and read no counter.
        (r.memcg_id, r.max_pages, r.usage_pages) = (0, 0, 0);
        let KernelEvent::LimitHit(h) = decode(&bytes(&r)).unwrap() else {
            panic!()
        };
        assert_eq!((h.memcg_id, h.limit_bytes, h.usage_bytes), (0, None, 0));
        assert!(matches!(
            decode(&bytes(&r)[..100]),
            Err(DecodeError::Short { want: 128, .. })
        ));
    }

    #[test]
    fn crossing_record_is_a_limit_hit_without_reclaim() {
        let page = page_size();
        let r = CrossingRecord {
            header: header(EventKind::LimitCrossing, 12),
            task: task_info(),
            memcg_id: 31,
            usage_pages: 14_090,
            max_pages: 16_384,
            threshold_bp: 8600,
            depth: 1,
        };
        let ev = decode(&bytes(&r)).unwrap();
        assert_eq!(ev.type_name(), "limit_crossing");
        assert_eq!(KernelEvent::TYPES[ev.type_index()], "limit_crossing");
        let KernelEvent::LimitHit(h) = ev else {
            panic!()
        };
        assert_eq!((h.at, h.first_at), (BootNs(12), BootNs(12)));
        assert_eq!(
            (h.memcg_id, h.usage_bytes, h.limit_bytes),
            (31, 14_090 * page, Some(16_384 * page))
        );
        assert_eq!((h.hits, h.short, h.reclaimed_bytes), (0, 0, 0));
        assert_eq!(
            h.crossing,
            Some(Crossing {
                threshold_bp: 8600,
                depth: 1
            })
        );
        assert_eq!(h.task.cgroup_id, 4242);
        assert!(matches!(
            decode(&bytes(&r)[..90]),
            Err(DecodeError::Short { want: 96, .. })
        ));
    }

    #[test]
    fn cgroup_records() {
        let mut path = [0; observer_common::CGROUP_PATH_LEN];
        path[..9].copy_from_slice(b"/kubepods");
        for (kind, name) in [
            (EventKind::CgroupMkdir, "cgroup_mkdir"),
            (EventKind::CgroupRmdir, "cgroup_rmdir"),
            (EventKind::CgroupEmpty, "cgroup_empty"),
        ] {
            let r = CgroupRecord {
                header: header(kind, 1),
                id: 99,
                level: 1,
                hierarchy: 0,
                _pad: 0,
                path_len: 9,
                path,
            };
            let ev = decode(&bytes(&r)).unwrap();
            assert_eq!(ev.type_name(), name);
            let (KernelEvent::CgroupMkdir(c)
            | KernelEvent::CgroupRmdir(c)
            | KernelEvent::CgroupEmpty(c)) = ev
            else {
                panic!()
            };
            assert_eq!((c.id, c.level, c.path.as_str()), (99, 1, "/kubepods"));
        }
    }

    #[test]
    fn malformed_records_are_errors() {
        assert_eq!(decode(&[1, 2, 3]), Err(DecodeError::NoHeader { len: 3 }));
        let h = bytes(&header(EventKind::Exit, 1));
        assert!(matches!(
            decode(&h),
            Err(DecodeError::Short {
                kind: EventKind::Exit,
                ..
            })
        ));
        let unknown = bytes(&Header {
            kind: 250,
            cpu: 0,
            time_ns: 0,
        });
        assert_eq!(decode(&unknown), Err(DecodeError::UnknownKind(250)));
    }
}
