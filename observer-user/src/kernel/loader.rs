//! Loads the embedded eBPF object, fills `CONFIG` for the running kernel, attaches every program.
use std::{os::fd::OwnedFd, path::PathBuf, sync::Arc, time::Duration};

use aya::{
    maps::{Array, HashMap, MapData, PerCpuArray, RingBuf},
    programs::{BtfTracePoint, FEntry, FExit, RawTracePoint, TracePoint},
    Btf, Ebpf, EbpfLoader,
};
use observer_common::{
    config::{ALL_HIERARCHIES, FIELD_ABSENT},
    names, stat, ProbeConfig, WatchRoot, MAX_WATCH_ROOTS,
};

use super::{
    btf::KernelBtf, known_inits::KnownInits, own_pid_ns_level, reader::EventReader, tracefs,
    KernelError,
};

/// The eBPF object built by build.rs from observer-ebpf.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/observer"));

/// Which records wake the reader as they are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Wake {
    /// Only those something waits on: a container init's exec and exit, OOM kills, cgroup
    /// events. The others are read with the next of those or at the reader's next poll, at most
    /// [`super::QUIET_RECORD_DELAY`] later while records keep coming, at most
    /// [`super::QUIET_IDLE_DELAY`] after an idle spell (observer-ebpf/src/wake.rs).
    #[default]
    Selective,
    /// Every record (`observer watch --all`, `--threads`: each one is printed as it comes).
    Every,
    /// None, but one that brings the unread bytes across an eighth of the ring: records are read
    /// at the reader's polls. For an onlooker beside the agent, whose probes run before the
    /// agent's on the same tracepoints and whose wake-ups would delay them (the api_path bench's
    /// own exit timestamps).
    Never,
}

/// Which tasks' exec and exit the kernel sends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Watch {
    /// Every task on the host.
    All,
    /// Only tasks under these cgroup2 subtrees.
    Roots(Vec<WatchRoot>),
}

#[derive(Clone, Debug)]
pub struct ProbeOptions {
    pub watch: Watch,
    /// Send an exit for every thread, not only when the whole process is gone.
    pub thread_exits: bool,
    /// Send cgroup events of every hierarchy (v1 controllers too), not only cgroup2's.
    pub all_cgroup_hierarchies: bool,
    /// Ring buffer size in bytes (a power-of-two multiple of the page size); default
    /// `observer_common::RING_BUFFER_BYTES`.
    pub ring_buffer_bytes: Option<u32>,
    /// Take the paths of older kernels even where this one has more: `sched_process_exit`
    /// without its `group_dead` argument (before Linux 6.x) and a pid-only `oom/mark_victim`
    /// (before 6.8). For tests, so that the fallbacks run on every kernel the suites run on.
    pub older_kernel_paths: bool,
    /// Which records wake the reader.
    pub wake: Wake,
    /// Memory cgroup limit hits (observer-ebpf/src/memcg.rs): at most one record per cgroup per
    /// this interval; `None` leaves the probe out.
    pub limit_hits: Option<Duration>,
    /// Usage crossing these thresholds of a watched memory cgroup's limit, in basis points,
    /// ascending (observer-ebpf/src/charge.rs; at most `observer_common::memcg::MAX_THRESHOLDS`);
    /// `None` leaves the probe out.
    pub limit_crossings: Option<Vec<u16>>,
}

/// The thresholds of a limit whose crossing the charge probe reports, in basis points. 50 % and
/// 75 % measure a leak's growth on its way (their times and what filled the cgroup then); 86 %
/// is the first above the 85 % a healthy heap may sit at (the pressure rules warn of a projected
/// fill only past it: `pressure::PROJECT_FROM`); 90 % and 95 % come again with the growth
/// measured since.
pub const CROSSING_THRESHOLDS: [u16; 5] = [5000, 7500, 8600, 9000, 9500];

/// A crossed threshold is sent again only once usage fell this far below it (basis points of
/// the limit): a cgroup hovering about a threshold sends it once.
const CROSSING_REARM_BP: u16 = 200;

/// The charge probe reads the page counters once per this many pages charged (or, on the
/// statistics' tracepoint, added) on a CPU: the kernel's own charge batch (MEMCG_CHARGE_BATCH),
/// the step in which the page counter moves.
const CROSSING_BATCH_PAGES: u32 = 64;

/// How often a memory cgroup at its limit is reported at most: ten times a second is enough to
/// follow a leak (a 64 MiB limit filling at 64 MiB/s takes a second) and bounds a cgroup that sits
/// at its limit to ten records a second.
pub const LIMIT_HIT_INTERVAL: Duration = Duration::from_millis(100);

impl Default for ProbeOptions {
    fn default() -> Self {
        Self {
            watch: Watch::All,
            thread_exits: false,
            all_cgroup_hierarchies: false,
            ring_buffer_bytes: None,
            older_kernel_paths: false,
            wake: Wake::default(),
            limit_hits: Some(LIMIT_HIT_INTERVAL),
            limit_crossings: Some(CROSSING_THRESHOLDS.to_vec()),
        }
    }
}

/// The kernel function whose `group_dead` argument stands in for the exit tracepoint's where that
/// has none (observer-ebpf/src/group_dead.rs); also the program's name.
const GROUP_DEAD_HOOK: &str = "taskstats_exit";

/// The reclaim function the limit-hit probe attaches to, and its program's name.
const LIMIT_HIT_HOOK: &str = "try_to_free_mem_cgroup_pages";
const LIMIT_HIT_PROGRAM: &str = "memcg_reclaim";
/// The tracepoint it falls back on, and that program's name.
const LIMIT_HIT_TP: &str = "mm_vmscan_memcg_reclaim_end";
const LIMIT_HIT_TP_PROGRAM: &str = "memcg_reclaim_end";

/// The charge function the crossing probe attaches to (fexit), and its program's name.
const CHARGE_HOOK: &str = "try_charge_memcg";
const CHARGE_PROGRAM: &str = "charge_memcg";
/// The raw tracepoint it falls back on (Linux 6.14+), and that program's name.
const CHARGE_TP: &str = "mod_memcg_lruvec_state";
const CHARGE_TP_PROGRAM: &str = "memcg_stat";

/// (program name in the object, how it attaches)
const PROGRAMS: [(&str, Attach); 6] = [
    ("sched_process_exec", Attach::Btf("sched_process_exec")),
    ("sched_process_exit", Attach::Btf("sched_process_exit")),
    ("oom_mark_victim", Attach::Tp("oom", "mark_victim")),
    ("cgroup_mkdir", Attach::Tp("cgroup", "cgroup_mkdir")),
    ("cgroup_rmdir", Attach::Tp("cgroup", "cgroup_rmdir")),
    (
        "cgroup_notify_populated",
        Attach::Tp("cgroup", "cgroup_notify_populated"),
    ),
];

#[derive(Clone, Copy)]
enum Attach {
    Btf(&'static str),
    Tp(&'static str, &'static str),
}

impl Attach {
    fn describe(self) -> String {
        match self {
            Attach::Btf(f) => format!("tp_btf/{f}"),
            Attach::Tp(c, n) => format!("tracepoint/{c}/{n}"),
        }
    }
}

/// Where an exit record's `group_dead` (the whole process is gone) comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GroupDeadSource {
    /// The `sched_process_exit` tracepoint's own argument.
    Tracepoint,
    /// `fentry/taskstats_exit`, where the tracepoint has no such argument.
    Fentry,
    /// `signal->live` read at the tracepoint: the hook could not be attached (why). Two threads
    /// exiting at once on two CPUs may both be reported as the last.
    SignalLive(String),
}

/// Counters the kernel side keeps (summed over CPUs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelCounters {
    /// Records lost because the ring buffer was full.
    pub ringbuf_drops: u64,
    /// OOM victims not tracked because `OOM_MEETINGS` refused the mark (observer-ebpf/src/oom.rs).
    pub oom_pending_full: u64,
    /// Kernel memory reads that failed (fields sent as zero).
    pub read_errors: u64,
    /// Records submitted with a wake-up of the reader, and without one (observer-ebpf/src/wake.rs).
    pub waking_records: u64,
    pub quiet_records: u64,
    /// Memory cgroup reclaims summed into a later limit-hit record (observer-ebpf/src/memcg.rs).
    pub limit_hits_summed: u64,
    /// OOM kills whose victim exited before the killer marked it (observer-ebpf/src/oom.rs).
    pub oom_victim_exited_first: u64,
    /// Halves of an OOM kill's meeting left by an earlier thread of the same id, replaced.
    pub oom_stale_meetings: u64,
    /// Charges after which a watched memory cgroup's page counters were read against their
    /// limits, and the threshold crossings sent (observer-ebpf/src/charge.rs).
    pub charge_checks: u64,
    pub limit_crossings: u64,
}

/// Handle on the `STATS` map, shared by [`Probes`] and the [`EventReader`].
pub(crate) struct Stats(PerCpuArray<MapData, u64>);

impl Stats {
    pub(super) fn read(&self) -> Result<KernelCounters, KernelError> {
        let sum = |i: u32| -> Result<u64, KernelError> {
            Ok(self
                .0
                .get(&i, 0)
                .map_err(|e| KernelError::Map(names::STATS, e.to_string()))?
                .iter()
                .sum())
        };
        Ok(KernelCounters {
            ringbuf_drops: sum(stat::RINGBUF_DROPS)?,
            oom_pending_full: sum(stat::OOM_PENDING_FULL)?,
            read_errors: sum(stat::READ_ERRORS)?,
            waking_records: sum(stat::WAKING)?,
            quiet_records: sum(stat::QUIET)?,
            limit_hits_summed: sum(stat::LIMIT_HITS_SUMMED)?,
            oom_victim_exited_first: sum(stat::OOM_VICTIM_EXITED_FIRST)?,
            oom_stale_meetings: sum(stat::OOM_STALE_MEETINGS)?,
            charge_checks: sum(stat::CHARGE_CHECKS)?,
            limit_crossings: sum(stat::LIMIT_CROSSINGS)?,
        })
    }
}

/// Per-program cost as the kernel accounts it (needs [`Probes::enable_run_time_stats`]).
#[derive(Clone, Debug)]
pub struct ProgramStats {
    pub name: String,
    pub run_time: Duration,
    pub run_count: u64,
}

/// The loaded and attached kernel side. Dropping it detaches every program.
pub struct Probes {
    ebpf: Ebpf,
    stats: Arc<Stats>,
    ring: Option<RingBuf<MapData>>,
    known_inits: Option<HashMap<MapData, u32, u8>>,
    config: ProbeConfig,
    logger: Option<tokio::task::JoinHandle<()>>,
    run_time_stats: Option<OwnedFd>,
    /// `None` where the exit tracepoint has `group_dead`; else whether the hook attached.
    group_dead_hook: Option<Result<(), String>>,
    /// Which limit-hit hook runs, or why none.
    limit_hits: LimitHitSource,
    /// Which charge hook runs, or why none.
    crossings: ChargeSource,
}

/// Where memory cgroup limit hits come from (observer-ebpf/src/memcg.rs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LimitHitSource {
    /// `fexit/try_to_free_mem_cgroup_pages`: the memory cgroup, the pages asked and freed.
    Fexit,
    /// `tracepoint/vmscan/mm_vmscan_memcg_reclaim_end`, where fexit could not be attached (why):
    /// the pages freed only; which cgroup was at its limit is read by userspace.
    Tracepoint(String),
    /// Neither (why): no memory warnings.
    Off(String),
}

/// Where a memory cgroup's usage crossing thresholds of its limit comes from
/// (observer-ebpf/src/charge.rs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChargeSource {
    /// `fexit/try_charge_memcg`: the charge path, once per charge batch.
    Fexit,
    /// `raw_tp/mod_memcg_lruvec_state`, where fexit could not be attached (why): the memory
    /// cgroups' statistics, read once per batch of pages a CPU adds.
    RawTracepoint(String),
    /// Neither (why): a leak with nothing to reclaim is first seen at its limit.
    Off(String),
}

impl ChargeSource {
    /// The hook, as `observer check` and the metrics name it.
    pub fn hook(&self) -> &'static str {
        match self {
            Self::Fexit => "fexit/try_charge_memcg",
            Self::RawTracepoint(_) => "raw_tp/mod_memcg_lruvec_state",
            Self::Off(_) => "none",
        }
    }
}

impl LimitHitSource {
    /// The hook, as `observer check` and the metrics name it.
    pub fn hook(&self) -> &'static str {
        match self {
            Self::Fexit => "fexit/try_to_free_mem_cgroup_pages",
            Self::Tracepoint(_) => "tracepoint/vmscan/mm_vmscan_memcg_reclaim_end",
            Self::Off(_) => "none",
        }
    }
}

impl Probes {
    /// Checks privileges, finds offsets for this kernel, loads and attaches every program.
    pub fn load(opts: &ProbeOptions) -> Result<Self, KernelError> {
        check_privileges()?;
        if OBJECT.is_empty() {
            return Err(KernelError::NoObject);
        }
        raise_memlock();
        // The kernel's BTF is parsed once for aya (`btf`), and that parse serves the loader's
        // relocations and every BTF-attached program; it is dropped once they are attached.
        // `EbpfLoader::new` always parses it on its own: that copy is let go at once, before the
        // raw bytes and ours exist, so that two are never alive together (kernel/btf.rs).
        let mut loader = EbpfLoader::new();
        loader.btf(None);
        let kbtf = KernelBtf::load()?;
        let tracefs = tracefs::find_or_mount()?;
        let exit_has_group_dead =
            !opts.older_kernel_paths && kbtf.tracepoint_arity("sched_process_exit")? >= 2;
        let config = ProbeConfig {
            watch_all: u8::from(opts.watch == Watch::All),
            thread_exits: u8::from(opts.thread_exits),
            exit_has_group_dead: u8::from(exit_has_group_dead),
            exit_group_dead_hook: u8::from(
                !exit_has_group_dead && kbtf.has_function(GROUP_DEAD_HOOK),
            ),
            cgroup_hierarchy: if opts.all_cgroup_hierarchies {
                ALL_HIERARCHIES
            } else {
                0
            },
            task: kbtf.task_offsets()?,
            oom: match tracefs::oom_offsets(&tracefs)? {
                o if opts.older_kernel_paths => observer_common::config::OomTpOffsets {
                    pid: o.pid,
                    ..Default::default()
                },
                o => o,
            },
            cgroup: tracefs::cgroup_offsets(&tracefs)?,
            wake: match opts.wake {
                Wake::Selective => observer_common::config::WAKE_SELECTIVE,
                Wake::Every => observer_common::config::WAKE_EVERY,
                Wake::Never => observer_common::config::WAKE_NONE,
            },
            _pad: [0; 3],
            host_ns_level: own_pid_ns_level(),
            // An eighth of the ring: a reader that only polls is woken well before it fills.
            wake_batch_bytes: (opts
                .ring_buffer_bytes
                .unwrap_or(observer_common::RING_BUFFER_BYTES)
                / 8)
            .max(1),
            _pad2: 0,
            memcg: Default::default(),
            charge: Default::default(),
        };
        let mut config = config;
        // What both memory probes read of struct mem_cgroup, where the BTF says it.
        let memcg_offsets = kbtf.memcg_offsets().map_err(|e| e.to_string());
        if let Ok(m) = &memcg_offsets {
            config.memcg = *m;
        }
        // The limit-hit hooks: fexit where the kernel allows trampolines, else the tracepoint.
        // Both are configured before the load (CONFIG is read-only after it); one is attached.
        let fexit_ready = match opts.limit_hits {
            None => Err("left out".to_string()),
            Some(_) if !kbtf.has_function(LIMIT_HIT_HOOK) => {
                Err(format!("the kernel has no {LIMIT_HIT_HOOK} in its BTF"))
            }
            Some(_) => memcg_offsets.clone().map(|_| ()),
        };
        // The charge hooks likewise: what each can attach to is decided here, from the BTF.
        let charge_ready = match &opts.limit_crossings {
            None => Err("left out (ProbeOptions::limit_crossings)".to_string()),
            Some(t) => charge_config(&kbtf, t)
                .and_then(|c| memcg_offsets.clone().map(|_| c))
                .map(|c| {
                    config.charge = c;
                    ChargeHooks {
                        fexit: if kbtf.has_function(CHARGE_HOOK) {
                            Ok(())
                        } else {
                            Err(format!("the kernel has no {CHARGE_HOOK} in its BTF"))
                        },
                        raw_tp: raw_tp_ready(&kbtf),
                    }
                }),
        };
        if let Some(every) = opts.limit_hits {
            config.memcg.interval_ns = every.as_nanos() as u64;
            config.memcg.tp_nr_reclaimed =
                tracefs::memcg_reclaim_end_offset(&tracefs).unwrap_or(FIELD_ABSENT);
        }
        tracing::debug!(?config, "probe config");
        let btf = kbtf.into_aya()?;
        loader.btf(Some(&btf));
        if let Some(bytes) = opts.ring_buffer_bytes {
            loader.map_max_entries(names::EVENTS, bytes);
        }
        let mut ebpf = loader
            .override_global(names::CONFIG, &config, true)
            .load(OBJECT)
            .map_err(|e| KernelError::LoadObject(e.to_string()))?;
        drop(loader);
        let logger = start_logger(&mut ebpf);

        let mut probes = Self {
            stats: Arc::new(Stats(take_map(&mut ebpf, names::STATS)?)),
            ring: Some(take_map(&mut ebpf, names::EVENTS)?),
            known_inits: Some(take_map(&mut ebpf, names::KNOWN_INITS)?),
            ebpf,
            config,
            logger,
            run_time_stats: None,
            group_dead_hook: None,
            limit_hits: LimitHitSource::Off(String::new()),
            crossings: ChargeSource::Off(String::new()),
        };
        if let Watch::Roots(roots) = &opts.watch {
            probes.set_watch_roots(roots)?;
        }
        probes.attach_all(&btf)?;
        if probes.config.exit_group_dead_hook != 0 {
            probes.attach_group_dead_hook(&btf);
        }
        probes.limit_hits = match (opts.limit_hits, fexit_ready) {
            (None, _) => LimitHitSource::Off("left out (ProbeOptions::limit_hits)".into()),
            (Some(_), ready) => probes.attach_limit_hits(ready, &btf),
        };
        probes.crossings = probes.attach_crossings(charge_ready, &btf);
        drop(btf);
        crate::mem::release_free_memory();
        Ok(probes)
    }

    /// `fentry/taskstats_exit`, where `sched_process_exit` has no `group_dead`. Without it (a
    /// kernel without BPF trampolines) exit records still come, with `group_dead` from
    /// `signal->live`, so a failure is a warning, not an error.
    fn attach_group_dead_hook(&mut self, btf: &Btf) {
        let result = load_group_dead_hook(&mut self.ebpf, btf);
        if let Err(e) = &result {
            tracing::warn!(
                error = %e,
                "fentry/{GROUP_DEAD_HOOK} not attached: a process's last thread is told by \
                 signal->live, which two threads exiting at once can both claim"
            );
        }
        self.group_dead_hook = Some(result);
    }

    /// Where exit records' `group_dead` comes from on this kernel.
    pub fn group_dead_source(&self) -> GroupDeadSource {
        match &self.group_dead_hook {
            None => GroupDeadSource::Tracepoint,
            Some(Ok(())) => GroupDeadSource::Fentry,
            Some(Err(why)) => GroupDeadSource::SignalLive(why.clone()),
        }
    }

    /// Where memory cgroup limit hits come from.
    pub fn limit_hit_source(&self) -> &LimitHitSource {
        &self.limit_hits
    }

    /// Where usage crossing thresholds of a limit comes from.
    pub fn charge_source(&self) -> &ChargeSource {
        &self.crossings
    }

    /// fexit on the charge where the kernel allows trampolines, else the statistics' raw
    /// tracepoint; neither is an error of its own (the limit hits and OOM kills still come), said
    /// once at start with both causes.
    fn attach_crossings(&mut self, ready: Result<ChargeHooks, String>, btf: &Btf) -> ChargeSource {
        let hooks = match ready {
            Ok(h) => h,
            Err(why) if why.starts_with("left out") => return ChargeSource::Off(why),
            Err(why) => {
                tracing::warn!(error = %why, "no memory limit crossings: a leak with nothing to reclaim is warned of only at its limit");
                return ChargeSource::Off(why);
            }
        };
        let why = match hooks
            .fexit
            .and_then(|()| load_fexit(&mut self.ebpf, CHARGE_PROGRAM, CHARGE_HOOK, btf))
        {
            Ok(()) => return ChargeSource::Fexit,
            Err(e) => format!("fexit/{CHARGE_HOOK}: {e}"),
        };
        match hooks
            .raw_tp
            .and_then(|()| load_raw_tracepoint(&mut self.ebpf, CHARGE_TP_PROGRAM, CHARGE_TP))
        {
            Ok(()) => {
                tracing::info!(fexit = %why, "memory limit crossings from raw_tp/{CHARGE_TP}: the page counters are read once per {CROSSING_BATCH_PAGES} pages a CPU adds");
                ChargeSource::RawTracepoint(why)
            }
            Err(e) => {
                let off = format!("{why}; raw_tp/{CHARGE_TP}: {e}");
                tracing::warn!(
                    error = %off,
                    "no memory limit crossings: a leak with nothing to reclaim is warned of only \
                     at its limit"
                );
                ChargeSource::Off(off)
            }
        }
    }

    fn attach_limit_hits(&mut self, fexit: Result<(), String>, btf: &Btf) -> LimitHitSource {
        let why = match fexit
            .and_then(|()| load_fexit(&mut self.ebpf, LIMIT_HIT_PROGRAM, LIMIT_HIT_HOOK, btf))
        {
            Ok(()) => return LimitHitSource::Fexit,
            Err(e) => format!("fexit/{LIMIT_HIT_HOOK}: {e}"),
        };
        let tp = if self.config.memcg.tp_nr_reclaimed == FIELD_ABSENT {
            Err("its format file was not read".to_string())
        } else {
            load_tracepoint(&mut self.ebpf, LIMIT_HIT_TP_PROGRAM, "vmscan", LIMIT_HIT_TP)
        };
        match tp {
            Ok(()) => {
                tracing::info!(fexit = %why, "memory limit hits from tracepoint/vmscan/{LIMIT_HIT_TP}: which cgroup was at its limit is read from cgroupfs");
                LimitHitSource::Tracepoint(why)
            }
            Err(e) => {
                let off = format!("{why}; tracepoint/vmscan/{LIMIT_HIT_TP}: {e}");
                tracing::warn!(
                    error = %off,
                    "no memory limit hits: no warnings before OOM kills (the kills themselves are \
                     still reported)"
                );
                LimitHitSource::Off(off)
            }
        }
    }

    fn attach_all(&mut self, btf: &Btf) -> Result<(), KernelError> {
        for (name, how) in PROGRAMS {
            let prog = self
                .ebpf
                .program_mut(name)
                .ok_or_else(|| KernelError::LoadObject(format!("object has no program {name}")))?;
            let fail = |e: aya::programs::ProgramError| attach_error(how, e);
            match how {
                Attach::Btf(func) => {
                    let p: &mut BtfTracePoint = prog.try_into().map_err(fail)?;
                    p.load(func, btf).map_err(fail)?;
                    p.attach().map_err(fail)?;
                }
                Attach::Tp(cat, tp) => {
                    let p: &mut TracePoint = prog.try_into().map_err(fail)?;
                    p.load().map_err(fail)?;
                    p.attach(cat, tp).map_err(fail)?;
                }
            }
        }
        Ok(())
    }

    /// Replaces the cgroup subtrees exec/exit are limited to (no effect under [`Watch::All`]).
    pub(crate) fn set_watch_roots(&mut self, roots: &[WatchRoot]) -> Result<(), KernelError> {
        if roots.len() > MAX_WATCH_ROOTS as usize {
            return Err(KernelError::TooManyRoots(roots.len()));
        }
        let mut map: Array<_, WatchRoot> = self
            .ebpf
            .map_mut(names::WATCH_ROOTS)
            .ok_or(KernelError::Map(names::WATCH_ROOTS, "missing".into()))?
            .try_into()
            .map_err(|e: aya::maps::MapError| {
                KernelError::Map(names::WATCH_ROOTS, e.to_string())
            })?;
        // Fill from the end so a concurrent reader never sees a hole before the last root.
        for i in (0..MAX_WATCH_ROOTS).rev() {
            let root = roots.get(i as usize).copied().unwrap_or_default();
            map.set(i, root, 0)
                .map_err(|e| KernelError::Map(names::WATCH_ROOTS, e.to_string()))?;
        }
        Ok(())
    }

    /// The stream of decoded events. Can be taken once.
    pub fn events(&mut self) -> Result<EventReader, KernelError> {
        let ring = self.ring.take().ok_or(KernelError::ReaderTaken)?;
        EventReader::new(ring, Arc::clone(&self.stats))
    }

    /// The kernel's set of container inits whose exit wakes the reader. Can be taken once.
    pub fn known_inits(&mut self) -> Result<KnownInits, KernelError> {
        self.known_inits
            .take()
            .map(KnownInits::new)
            .ok_or(KernelError::InitsTaken)
    }

    pub fn counters(&self) -> Result<KernelCounters, KernelError> {
        self.stats.read()
    }

    pub fn config(&self) -> &ProbeConfig {
        &self.config
    }

    /// Turns on the kernel's per-program run-time accounting (`kernel.bpf_stats_enabled`) for as
    /// long as these probes live.
    pub fn enable_run_time_stats(&mut self) -> Result<(), KernelError> {
        if self.run_time_stats.is_none() {
            let fd = aya::sys::enable_stats(aya::sys::Stats::RunTime)
                .map_err(|e| KernelError::LoadObject(format!("BPF_ENABLE_STATS: {e}")))?;
            self.run_time_stats = Some(fd);
        }
        Ok(())
    }

    pub fn program_stats(&self) -> Result<Vec<ProgramStats>, KernelError> {
        // The always-attached programs, then the optional hook that runs here.
        let limit_hits = match self.limit_hits {
            LimitHitSource::Fexit => Some(LIMIT_HIT_PROGRAM),
            LimitHitSource::Tracepoint(_) => Some(LIMIT_HIT_TP_PROGRAM),
            LimitHitSource::Off(_) => None,
        };
        let crossings = match self.crossings {
            ChargeSource::Fexit => Some(CHARGE_PROGRAM),
            ChargeSource::RawTracepoint(_) => Some(CHARGE_TP_PROGRAM),
            ChargeSource::Off(_) => None,
        };
        PROGRAMS
            .iter()
            .map(|(name, _)| *name)
            .chain(limit_hits)
            .chain(crossings)
            .map(|name| {
                let info = self
                    .ebpf
                    .program(name)
                    .ok_or_else(|| KernelError::LoadObject(format!("no program {name}")))?
                    .info()
                    .map_err(|e| KernelError::LoadObject(format!("{name}: {e}")))?;
                Ok(ProgramStats {
                    name: name.to_string(),
                    run_time: info.run_time(),
                    run_count: info.run_count(),
                })
            })
            .collect()
    }
}

impl Drop for Probes {
    fn drop(&mut self) {
        if let Some(task) = self.logger.take() {
            task.abort();
        }
    }
}

fn load_group_dead_hook(ebpf: &mut Ebpf, btf: &Btf) -> Result<(), String> {
    let p: &mut FEntry = ebpf
        .program_mut(GROUP_DEAD_HOOK)
        .ok_or("object has no program")?
        .try_into()
        .map_err(|e: aya::programs::ProgramError| e.to_string())?;
    p.load(GROUP_DEAD_HOOK, btf).map_err(load_text)?;
    p.attach().map_err(load_text)?;
    Ok(())
}

fn load_tracepoint(
    ebpf: &mut Ebpf,
    program: &str,
    category: &str,
    name: &str,
) -> Result<(), String> {
    let p: &mut TracePoint = ebpf
        .program_mut(program)
        .ok_or("object has no program")?
        .try_into()
        .map_err(|e: aya::programs::ProgramError| e.to_string())?;
    p.load().map_err(load_text)?;
    p.attach(category, name).map_err(load_text)?;
    Ok(())
}

fn load_raw_tracepoint(ebpf: &mut Ebpf, program: &str, name: &str) -> Result<(), String> {
    let p: &mut RawTracePoint = ebpf
        .program_mut(program)
        .ok_or("object has no program")?
        .try_into()
        .map_err(|e: aya::programs::ProgramError| e.to_string())?;
    p.load().map_err(load_text)?;
    p.attach(name).map_err(load_text)?;
    Ok(())
}

/// What each charge hook can attach to, from the BTF.
struct ChargeHooks {
    fexit: Result<(), String>,
    raw_tp: Result<(), String>,
}

/// The charge probe's configuration: the offsets from the BTF, the thresholds asked for.
fn charge_config(
    kbtf: &KernelBtf,
    thresholds: &[u16],
) -> Result<observer_common::config::ChargeConfig, String> {
    use observer_common::memcg::MAX_THRESHOLDS;
    if thresholds.is_empty()
        || thresholds.len() > MAX_THRESHOLDS
        || thresholds.windows(2).any(|w| w[0] >= w[1])
        || thresholds.iter().any(|&t| t == 0 || t > 10_000)
    {
        return Err(format!(
            "thresholds {thresholds:?}: 1 to {MAX_THRESHOLDS} ascending basis points of the limit"
        ));
    }
    let mut c = kbtf.charge_offsets().map_err(|e| e.to_string())?;
    c.thresholds_bp[..thresholds.len()].copy_from_slice(thresholds);
    c.rearm_bp = CROSSING_REARM_BP;
    // The charged cgroup and its parent: a container and its pod.
    c.depth = 2;
    c.batch_pages = CROSSING_BATCH_PAGES;
    c.unlimited_pages = super::decode::unlimited_pages();
    Ok(c)
}

/// Whether the statistics' raw tracepoint is there with the arguments the probe reads:
/// `(struct mem_cgroup *memcg, int item, int val)`.
fn raw_tp_ready(kbtf: &KernelBtf) -> Result<(), String> {
    let arity = kbtf
        .tracepoint_arity(CHARGE_TP)
        .map_err(|_| format!("the kernel has no tracepoint {CHARGE_TP} (Linux 6.14+)"))?;
    let first = kbtf
        .tracepoint_arg_struct(CHARGE_TP, 0)
        .map_err(|e| e.to_string())?;
    if arity != 3 || first.as_deref() != Some("mem_cgroup") {
        return Err(format!(
            "{CHARGE_TP} takes {arity} arguments, the first {}: not (struct mem_cgroup *, int, int)",
            first.as_deref().unwrap_or("not a struct pointer")
        ));
    }
    Ok(())
}

fn load_fexit(ebpf: &mut Ebpf, program: &str, function: &str, btf: &Btf) -> Result<(), String> {
    let p: &mut FExit = ebpf
        .program_mut(program)
        .ok_or("object has no program")?
        .try_into()
        .map_err(|e: aya::programs::ProgramError| e.to_string())?;
    p.load(function, btf).map_err(load_text)?;
    p.attach().map_err(load_text)?;
    Ok(())
}

/// aya ends a load error with the verifier's log, empty when the kernel refused before it.
fn load_text(e: aya::programs::ProgramError) -> String {
    let t = format!("{e:#}");
    t.trim_end()
        .trim_end_matches("Verifier output:")
        .trim_end_matches(['.', ' '])
        .to_string()
}

fn take_map<T: TryFrom<aya::maps::Map, Error = aya::maps::MapError>>(
    ebpf: &mut Ebpf,
    name: &'static str,
) -> Result<T, KernelError> {
    let map = ebpf
        .take_map(name)
        .ok_or(KernelError::Map(name, "missing from the object".into()))?;
    T::try_from(map).map_err(|e| KernelError::Map(name, e.to_string()))
}

fn attach_error(how: Attach, e: aya::programs::ProgramError) -> KernelError {
    let what = how.describe();
    // ENOENT from attach or a missing BTF type means the kernel lacks the tracepoint.
    let text = format!("{e:#}");
    let source = std::error::Error::source(&e)
        .map(|s| s.to_string())
        .unwrap_or_default();
    if text.contains("No such file")
        || source.contains("No such file")
        || text.contains("not found")
    {
        KernelError::TracepointMissing(what)
    } else {
        KernelError::Attach {
            program: what,
            reason: if source.is_empty() {
                text
            } else {
                format!("{text}: {source}")
            },
        }
    }
}

/// Forwards aya-log records from the programs to `log` (and so to `tracing`). The logger must
/// outlive the programs: dropping it closes the log map.
fn start_logger(ebpf: &mut Ebpf) -> Option<tokio::task::JoinHandle<()>> {
    let logger = match aya_log::EbpfLogger::init(ebpf) {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!("eBPF logs unavailable: {e}");
            return None;
        }
    };
    let handle = tokio::runtime::Handle::try_current().ok()?;
    handle
        .spawn(async move {
            // SAFETY: the logger owns its ring buffer's fd and keeps it open until it is dropped,
            // which only happens with the AsyncFd.
            let Ok(mut fd) = (unsafe {
                tokio::io::unix::AsyncFd::register_with_interest(
                    logger,
                    tokio::io::Interest::READABLE,
                )
            }) else {
                return;
            };
            loop {
                let Ok(mut guard) = fd.readable_mut().await else {
                    return;
                };
                guard.get_inner_mut().flush();
                guard.clear_ready();
            }
        })
        .into()
}

/// Root, or the capabilities that loading tracing programs needs (CAP_BPF + CAP_PERFMON, or
/// CAP_SYS_ADMIN on kernels before 5.8). Says which one it found.
pub fn privileges() -> Result<&'static str, KernelError> {
    if nix::unistd::geteuid().is_root() {
        return Ok("root");
    }
    let caps = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("CapEff:")
                    .map(|v| u64::from_str_radix(v.trim(), 16).unwrap_or(0))
            })
        })
        .unwrap_or(0);
    const SYS_ADMIN: u64 = 1 << 21;
    const PERFMON: u64 = 1 << 38;
    const BPF: u64 = 1 << 39;
    if caps & PERFMON != 0 && caps & BPF != 0 {
        Ok("CAP_BPF + CAP_PERFMON")
    } else if caps & SYS_ADMIN != 0 {
        Ok("CAP_SYS_ADMIN")
    } else {
        Err(KernelError::NotPrivileged)
    }
}

fn check_privileges() -> Result<(), KernelError> {
    privileges().map(|_| ())
}

/// Kernels before 5.11 charge BPF maps to RLIMIT_MEMLOCK; later ones to the memory cgroup.
fn raise_memlock() {
    use nix::sys::resource::{setrlimit, Resource, RLIM_INFINITY};
    if let Err(e) = setrlimit(Resource::RLIMIT_MEMLOCK, RLIM_INFINITY, RLIM_INFINITY) {
        tracing::debug!("could not raise RLIMIT_MEMLOCK: {e}");
    }
}

/// Where the kernel's BTF is expected; exposed for `observer check`.
pub(crate) fn btf_path() -> PathBuf {
    PathBuf::from(super::btf::VMLINUX)
}
