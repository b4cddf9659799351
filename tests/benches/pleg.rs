//! PLEG throughput from synthetic kernel events (in process, no kernel needed), side by side with
//! the work a relist-based PLEG (kubelet's generic PLEG) does per relist on the same node, and the
//! memory the node model takes per tracked container at 1000 pods × 3 containers.
//!
//!     cargo bench -p observer-tests --bench pleg
#![allow(unused_crate_dependencies)] // a test/bench/bin target sees its package's whole dependency list
use std::{
    alloc::{GlobalAlloc, Layout, System},
    collections::HashMap,
    hint::black_box,
    path::PathBuf,
    sync::atomic::{AtomicIsize, Ordering},
    time::{Duration, Instant},
};

use observer::{
    cgroup::{
        container_cgroup_path, pod_cgroup_path, CgroupDriver, CgroupIndex, CgroupVersion,
        ContainerId, HierarchyMount, PodUid, Qos, Runtime,
    },
    kernel::{BootNs, CgroupChange, Comm, Exec, Exit, KernelEvent, Task, WaitStatus},
    pleg::{channel, Pleg},
};

/// Counts live heap bytes, to measure what the node model holds.
struct Counting;
static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator; only a counter is added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's contract for `alloc`, passed on.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as isize, Ordering::Relaxed);
        // SAFETY: `p` came from this allocator (so from System) with layout `l`.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        LIVE.fetch_add(new as isize - l.size() as isize, Ordering::Relaxed);
        // SAFETY: as for dealloc; `new` is the caller's valid size.
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

const PODS: u32 = 1000;
const PER_POD: u32 = 3;

fn uid(p: u32) -> PodUid {
    PodUid::parse(&format!("{p:08x}-0000-4000-8000-000000000000")).unwrap()
}

fn cid(p: u32, c: u32, gen: u32) -> ContainerId {
    ContainerId::parse(&format!("{:032x}{:016x}{:016x}", p, c, gen)).unwrap()
}

fn change(id: u64, path: String, at: u64) -> CgroupChange {
    CgroupChange {
        at: BootNs(at),
        id,
        level: 5,
        hierarchy: 0,
        path,
    }
}

fn task(pid: u32, cgroup_id: u64) -> Task {
    Task {
        pid,
        tgid: pid,
        ppid: 1,
        ns_pid: 1,
        ns_level: 1,
        comm: Comm::from("app"),
        cgroup_id,
    }
}

/// Cgroup id of container c of pod p in generation gen.
fn cg(p: u32, c: u32, gen: u32) -> u64 {
    1_000_000 + u64::from(gen) * 10_000 + u64::from(p) * 10 + u64::from(c)
}

/// A PLEG and its queue, the events handed over as the pipeline does (a batch per kernel event
/// here).
struct Queued {
    pleg: Pleg,
    tx: observer::pleg::PlegSender,
    batch: Vec<observer::pleg::Stamped>,
}

impl Queued {
    fn handle(&mut self, ev: KernelEvent) {
        self.pleg.handle(ev);
        let sent = std::time::SystemTime::now();
        self.batch.extend(
            self.pleg
                .take_events()
                .map(|event| observer::pleg::Stamped { event, sent }),
        );
        self.tx.send_batch(&mut self.batch, true);
    }
}

impl std::ops::Deref for Queued {
    type Target = Pleg;

    fn deref(&self) -> &Pleg {
        &self.pleg
    }
}

fn new_pleg(capacity: usize) -> (Queued, observer::pleg::PlegReceiver) {
    let mount = HierarchyMount {
        version: CgroupVersion::V2,
        mount_point: PathBuf::from("/nonexistent"),
        root: "/".into(),
    };
    let (tx, rx) = channel(capacity).expect("a wake-up socket");
    (
        Queued {
            pleg: Pleg::new(CgroupIndex::new(
                mount,
                observer::cgroup::KubeRoots::of_kubelet_root("/").expect("kubelet's roots"),
            )),
            tx,
            batch: Vec::new(),
        },
        rx,
    )
}

/// The node: every pod and container created, every init running.
fn populate(pleg: &mut Queued, rx: &mut observer::pleg::PlegReceiver) {
    let mut t = 1;
    for p in 0..PODS {
        pleg.handle(KernelEvent::CgroupMkdir(change(
            u64::from(p) + 10,
            pod_cgroup_path(CgroupDriver::Systemd, Qos::Burstable, &uid(p)),
            t,
        )));
        for c in 0..PER_POD {
            let path = container_cgroup_path(
                CgroupDriver::Systemd,
                Qos::Burstable,
                &uid(p),
                Runtime::Containerd,
                &cid(p, c, 0),
            );
            pleg.handle(KernelEvent::CgroupMkdir(change(cg(p, c, 0), path, t)));
            pleg.handle(KernelEvent::Exec(Exec {
                at: BootNs(t),
                task: task(100_000 + p * 10 + c, cg(p, c, 0)),
                old_pid: 0,
                filename: String::new(),
            }));
            t += 1;
        }
        while rx.try_recv().is_some() {}
    }
}

/// One container restart cycle: a `kubectl exec` process comes and goes, the init dies, the
/// cgroup empties and is removed, the next attempt's cgroup appears and its init execs.
fn churn(p: u32, c: u32, gen: u32, t: u64) -> [KernelEvent; 7] {
    let (old, new) = (cg(p, c, gen), cg(p, c, gen + 1));
    let init = 100_000 + p * 10 + c;
    let new_path = container_cgroup_path(
        CgroupDriver::Systemd,
        Qos::Burstable,
        &uid(p),
        Runtime::Containerd,
        &cid(p, c, gen + 1),
    );
    [
        KernelEvent::Exec(Exec {
            at: BootNs(t),
            task: task(900_000, old),
            old_pid: 0,
            filename: String::new(),
        }),
        KernelEvent::Exit(Exit {
            at: BootNs(t),
            task: task(900_000, old),
            status: WaitStatus::exited(0),
            group_dead: true,
        }),
        KernelEvent::Exit(Exit {
            at: BootNs(t),
            task: task(init, old),
            status: WaitStatus::exited(1),
            group_dead: true,
        }),
        KernelEvent::CgroupEmpty(change(old, String::new(), t)),
        KernelEvent::CgroupRmdir(change(old, String::new(), t)),
        KernelEvent::CgroupMkdir(change(new, new_path, t)),
        KernelEvent::Exec(Exec {
            at: BootNs(t),
            task: task(init, new),
            old_pid: 0,
            filename: String::new(),
        }),
    ]
}

/// What kubelet's generic PLEG does every relist: compare every container's state with the
/// previous relist's and emit events for the differences.
fn relist_diff(
    old: &HashMap<ContainerId, (u8, u64)>,
    new: &HashMap<ContainerId, (u8, u64)>,
    events: &mut Vec<(ContainerId, u8)>,
) {
    for (id, (state, _)) in new {
        match old.get(id) {
            Some((s, _)) if s == state => {}
            _ => events.push((*id, *state)),
        }
    }
    for id in old.keys() {
        if !new.contains_key(id) {
            events.push((*id, 3));
        }
    }
}

fn main() {
    // Memory per container: live heap of a fully populated model.
    let before = LIVE.load(Ordering::Relaxed);
    let (mut pleg, mut rx) = new_pleg(1 << 16);
    populate(&mut pleg, &mut rx);
    let model_bytes = LIVE.load(Ordering::Relaxed) - before;
    let containers = PODS * PER_POD;
    let rss_kb = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:").map(|v| v.trim().to_string()))
        })
        .unwrap_or_default();

    // Event-driven: churn every container repeatedly, measure per kernel event.
    let rounds = 20u32;
    let mut events = Vec::with_capacity((containers * 7 * rounds) as usize);
    for gen in 0..rounds {
        for p in 0..PODS {
            for c in 0..PER_POD {
                events.extend(churn(p, c, gen, 1_000_000 + u64::from(gen)));
            }
        }
    }
    let n = events.len();
    let start = Instant::now();
    let mut out = 0u64;
    for ev in events {
        pleg.handle(ev);
        while let Some(e) = rx.try_recv() {
            black_box(&e);
            out += 1;
        }
    }
    let pleg_elapsed = start.elapsed();
    let stats = pleg.stats();
    assert_eq!(stats.unattributed, 0);
    assert_eq!(
        out,
        u64::from(containers * rounds) * 4,
        "Died, Removed, Changed, Started per cycle"
    );

    // Relist baseline: one diff of the same 3000 containers, where one container changed.
    let old: HashMap<ContainerId, (u8, u64)> = (0..PODS)
        .flat_map(|p| (0..PER_POD).map(move |c| (cid(p, c, 0), (1u8, 0u64))))
        .collect();
    let mut new = old.clone();
    new.insert(cid(0, 0, 0), (2, 1));
    let iters = 2000;
    let mut evs = Vec::new();
    let start = Instant::now();
    for _ in 0..iters {
        evs.clear();
        relist_diff(black_box(&old), black_box(&new), &mut evs);
        black_box(&evs);
    }
    let relist = start.elapsed() / iters;

    let per_event = pleg_elapsed / n as u32;
    println!("PLEG, {PODS} pods × {PER_POD} containers (synthetic kernel events, one thread)\n");
    println!("| approach | unit of work | time | throughput |");
    println!("|---|---|---:|---:|");
    println!("| kernel-driven PLEG (this) | one kernel event | {} | {:.2} M kernel events/s ({:.2} M lifecycle events/s) |", fmt(per_event), n as f64 / pleg_elapsed.as_secs_f64() / 1e6, out as f64 / pleg_elapsed.as_secs_f64() / 1e6);
    println!("| relist diff (generic PLEG style) | one relist of {containers} containers | {} | one relist per period (kubelet: 1 s) |", fmt(relist));
    println!("\nA death costs the kernel-driven PLEG ~7 events of work ({}); a relist-driven one pays {} every period whether or not anything died, plus the CRI ListContainers/ListPodSandbox round trips (not included here), and reports the death up to one period late.\n", fmt(per_event * 7), fmt(relist));
    println!("| node model at {PODS} pods × {PER_POD} containers | value |");
    println!("|---|---:|");
    println!(
        "| live heap of the model (counting allocator) | {:.1} KiB |",
        model_bytes as f64 / 1024.0
    );
    println!(
        "| per tracked container | {} bytes |",
        model_bytes / containers as isize
    );
    println!("| process VmRSS after populating | {rss_kb} |");
}

fn fmt(d: Duration) -> String {
    if d.as_nanos() < 10_000 {
        format!("{} ns", d.as_nanos())
    } else {
        format!("{:.1} µs", d.as_nanos() as f64 / 1000.0)
    }
}
