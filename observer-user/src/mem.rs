//! The process's own memory: what it holds (`/proc/self/status`) and giving back what start-up
//! freed. Start-up is the agent's peak (the kernel's BTF, the cgroup walk); glibc keeps freed
//! small blocks in its arenas for reuse, so without a trim the resident size stays at that peak
//! for the life of the process.

/// Returns the free pages of the allocator's arenas to the kernel (glibc's `malloc_trim`). Cheap:
/// one walk of the arenas' free lists, taken once after each start-up phase.
pub(crate) fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes each arena's own lock; any thread may call it at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Resident memory of this process now and at its peak (VmRSS, VmHWM), in KiB.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Resident {
    pub now_kib: u64,
    pub peak_kib: u64,
}

impl Resident {
    /// Reads `/proc/<pid>/status` (`None`: this process).
    pub fn of(pid: Option<u32>) -> Option<Self> {
        let path = match pid {
            Some(p) => format!("/proc/{p}/status"),
            None => "/proc/self/status".to_string(),
        };
        Self::parse(&std::fs::read_to_string(path).ok()?)
    }

    fn parse(status: &str) -> Option<Self> {
        let field = |name: &str| {
            status.lines().find_map(|l| {
                l.strip_prefix(name)?
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse()
                    .ok()
            })
        };
        Some(Self {
            now_kib: field("VmRSS:")?,
            peak_kib: field("VmHWM:")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_its_own_resident_size() {
        let r = Resident::of(None).unwrap();
        assert!(r.now_kib > 0 && r.peak_kib >= r.now_kib, "{r:?}");
        release_free_memory();
    }

    #[test]
    fn parses_the_status_fields() {
        let r = Resident::parse("Name:\tx\nVmHWM:\t   50380 kB\nVmRSS:\t   20064 kB\n").unwrap();
        assert_eq!(
            r,
            Resident {
                now_kib: 20064,
                peak_kib: 50380
            }
        );
        assert_eq!(Resident::parse("Name:\tx\n"), None);
    }
}
