//! tracefs: where tracepoints are listed and their record layouts described. The classic
//! tracepoints' field offsets are read from `events/<category>/<name>/format` at load time.
use std::{
    collections::HashMap,
    fs,
    path::{Path, PathBuf},
};

pub use observer_common::config::FIELD_ABSENT;
use observer_common::config::{CgroupTpOffsets, OomTpOffsets};

use super::KernelError;

const CANDIDATES: [&str; 2] = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

/// Finds a mounted tracefs; mounts it at /sys/kernel/tracing when none is.
pub fn find_or_mount() -> Result<PathBuf, KernelError> {
    if let Some(p) = find() {
        return Ok(p);
    }
    let target = Path::new(CANDIDATES[0]);
    nix::mount::mount(
        Some("nodev"),
        target,
        Some("tracefs"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    )
    .map_err(|e| {
        KernelError::Tracefs(format!("mount -t tracefs nodev {}: {e}", target.display()))
    })?;
    tracing::info!(path = %target.display(), "mounted tracefs");
    find().ok_or_else(|| {
        KernelError::Tracefs(format!(
            "mounted tracefs at {} but it has no events/",
            target.display()
        ))
    })
}

/// A mounted tracefs, without mounting one.
pub fn find() -> Option<PathBuf> {
    CANDIDATES
        .iter()
        .map(PathBuf::from)
        .find(|p| p.join("events").is_dir())
}

/// Fields of one tracepoint's record: name → (offset, size).
#[derive(Debug, Default)]
pub struct Format {
    fields: HashMap<String, (u32, u32)>,
}

impl Format {
    pub fn read(tracefs: &Path, category: &str, name: &str) -> Result<Self, KernelError> {
        let path = tracefs
            .join("events")
            .join(category)
            .join(name)
            .join("format");
        let text = fs::read_to_string(&path)
            .map_err(|_| KernelError::TracepointMissing(format!("{category}/{name}")))?;
        Self::parse(&text)
            .ok_or_else(|| KernelError::Tracefs(format!("unparsable {}", path.display())))
    }

    /// Parses lines like `field:__data_loc char[] comm; offset:12; size:4; signed:0;` (tab-separated).
    pub fn parse(text: &str) -> Option<Self> {
        let mut fields = HashMap::new();
        for line in text.lines() {
            let line = line.trim();
            let Some(rest) = line.strip_prefix("field:") else {
                continue;
            };
            let mut decl = None;
            let (mut offset, mut size) = (None, None);
            for part in rest.split(';') {
                let part = part.trim();
                if let Some(v) = part.strip_prefix("offset:") {
                    offset = v.parse().ok();
                } else if let Some(v) = part.strip_prefix("size:") {
                    size = v.parse().ok();
                } else if decl.is_none() && !part.is_empty() {
                    decl = Some(part);
                }
            }
            // The name is the declaration's last word, without an array suffix.
            let name = decl?.rsplit(' ').next()?.split('[').next()?;
            fields.insert(name.to_string(), (offset?, size?));
        }
        (!fields.is_empty()).then_some(Self { fields })
    }

    /// Offset of `name`, checking its size; [`FIELD_ABSENT`] when this kernel lacks the field.
    pub(crate) fn offset(&self, name: &str, size: u32) -> Result<u32, KernelError> {
        match self.fields.get(name) {
            None => Ok(FIELD_ABSENT),
            Some(&(off, sz)) if sz == size => Ok(off),
            Some(&(_, sz)) => Err(KernelError::Tracefs(format!(
                "field {name} has size {sz}, expected {size}"
            ))),
        }
    }

    fn required(&self, tp: &str, name: &str, size: u32) -> Result<u32, KernelError> {
        match self.offset(name, size)? {
            FIELD_ABSENT => Err(KernelError::Tracefs(format!("{tp} has no field {name}"))),
            off => Ok(off),
        }
    }
}

pub fn oom_offsets(tracefs: &Path) -> Result<OomTpOffsets, KernelError> {
    let f = Format::read(tracefs, "oom", "mark_victim")?;
    let long = std::mem::size_of::<std::ffi::c_ulong>() as u32;
    Ok(OomTpOffsets {
        pid: f.required("oom/mark_victim", "pid", 4)?,
        comm: f.offset("comm", 4)?,
        total_vm: f.offset("total_vm", long)?,
        anon_rss: f.offset("anon_rss", long)?,
        file_rss: f.offset("file_rss", long)?,
        shmem_rss: f.offset("shmem_rss", long)?,
        oom_score_adj: f.offset("oom_score_adj", 2)?,
        _pad: 0,
    })
}

/// `nr_reclaimed` of `vmscan/mm_vmscan_memcg_reclaim_end`.
pub fn memcg_reclaim_end_offset(tracefs: &Path) -> Result<u32, KernelError> {
    let f = Format::read(tracefs, "vmscan", "mm_vmscan_memcg_reclaim_end")?;
    let long = std::mem::size_of::<std::ffi::c_ulong>() as u32;
    f.required("vmscan/mm_vmscan_memcg_reclaim_end", "nr_reclaimed", long)
}

/// The three cgroup tracepoints share one layout; this checks that they do.
pub fn cgroup_offsets(tracefs: &Path) -> Result<CgroupTpOffsets, KernelError> {
    let mut out = None;
    for tp in ["cgroup_mkdir", "cgroup_rmdir", "cgroup_notify_populated"] {
        let f = Format::read(tracefs, "cgroup", tp)?;
        let name = format!("cgroup/{tp}");
        let o = CgroupTpOffsets {
            root: f.required(&name, "root", 4)?,
            level: f.required(&name, "level", 4)?,
            id: f.required(&name, "id", 8)?,
            path: f.required(&name, "path", 4)?,
            val: if tp == "cgroup_notify_populated" {
                f.required(&name, "val", 4)?
            } else {
                FIELD_ABSENT
            },
            _pad: 0,
        };
        out = Some(match out {
            None => o,
            Some(
                prev @ CgroupTpOffsets {
                    root,
                    level,
                    id,
                    path,
                    val,
                    ..
                },
            ) if (root, level, id, path) == (o.root, o.level, o.id, o.path) => CgroupTpOffsets {
                val: if val == FIELD_ABSENT { o.val } else { val },
                ..prev
            },
            Some(_) => {
                return Err(KernelError::Tracefs(
                    "cgroup tracepoints disagree on their layout".into(),
                ))
            }
        });
    }
    Ok(out.expect("three tracepoints read"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MARK_VICTIM_6_18: &str = "name: mark_victim
ID: 449
format:
	field:unsigned short common_type;	offset:0;	size:2;	signed:0;
	field:unsigned char common_flags;	offset:2;	size:1;	signed:0;
	field:unsigned char common_preempt_count;	offset:3;	size:1;	signed:0;
	field:int common_pid;	offset:4;	size:4;	signed:1;

	field:int pid;	offset:8;	size:4;	signed:1;
	field:__data_loc char[] comm;	offset:12;	size:4;	signed:0;
	field:unsigned long total_vm;	offset:16;	size:8;	signed:0;
	field:unsigned long anon_rss;	offset:24;	size:8;	signed:0;
	field:unsigned long file_rss;	offset:32;	size:8;	signed:0;
	field:unsigned long shmem_rss;	offset:40;	size:8;	signed:0;
	field:uid_t uid;	offset:48;	size:4;	signed:0;
	field:unsigned long pgtables;	offset:56;	size:8;	signed:0;
	field:short oom_score_adj;	offset:64;	size:2;	signed:1;

print fmt: \"pid=%d\", REC->pid
";

    // Linux 5.15: mark_victim carried only the pid.
    const MARK_VICTIM_5_15: &str = "format:
	field:unsigned short common_type;	offset:0;	size:2;	signed:0;
	field:int common_pid;	offset:4;	size:4;	signed:1;

	field:int pid;	offset:8;	size:4;	signed:1;
";

    #[test]
    fn parses_fields_and_arrays() {
        let f = Format::parse(MARK_VICTIM_6_18).unwrap();
        assert_eq!(f.offset("pid", 4).unwrap(), 8);
        assert_eq!(f.offset("comm", 4).unwrap(), 12);
        assert_eq!(f.offset("oom_score_adj", 2).unwrap(), 64);
        assert_eq!(f.offset("common_pid", 4).unwrap(), 4);
        let exit = Format::parse("	field:char comm[16];	offset:8;	size:16;	signed:0;").unwrap();
        assert_eq!(exit.offset("comm", 16).unwrap(), 8);
    }

    #[test]
    fn missing_fields_are_absent_and_wrong_sizes_rejected() {
        let f = Format::parse(MARK_VICTIM_5_15).unwrap();
        assert_eq!(f.offset("total_vm", 8).unwrap(), FIELD_ABSENT);
        assert!(f.offset("pid", 8).is_err());
        assert!(Format::parse("garbage\nno fields here").is_none());
    }
}
