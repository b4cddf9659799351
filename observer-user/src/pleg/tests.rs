//! The PLEG state machine from synthetic kernel events, including the racy orders the kernel and
//! the runtime can produce.
use std::path::PathBuf;

use super::*;
use crate::{
    cgroup::{
        container_cgroup_path, pod_cgroup_path, CgroupDriver, CgroupVersion, ContainerId,
        HierarchyMount, PodUid, Qos, Runtime, ScanStats, ScannedCgroup,
    },
    kernel::{CgroupChange, Comm, Exec, Exit, OomKill, OomMemory, Task, WaitStatus},
};

const UID: &str = "0f3c4a2e-1b7d-4c8e-9a6f-2d5b8e1c7a90";
const UID2: &str = "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee";

fn cid(n: u32) -> ContainerId {
    ContainerId::parse(&format!("{n:064x}")).unwrap()
}

fn pod_path(uid: &str) -> String {
    pod_cgroup_path(
        CgroupDriver::Systemd,
        Qos::Burstable,
        &PodUid::parse(uid).unwrap(),
    )
}

fn ctr_path(uid: &str, n: u32) -> String {
    container_cgroup_path(
        CgroupDriver::Systemd,
        Qos::Burstable,
        &PodUid::parse(uid).unwrap(),
        Runtime::Containerd,
        &cid(n),
    )
}

/// kubelet's default roots (`--cgroup-root=/`, both drivers).
fn roots() -> crate::cgroup::KubeRoots {
    crate::cgroup::KubeRoots::of_kubelet_root("/").unwrap()
}

/// A PLEG whose index cannot ask a kernel: unknown ids stay unknown.
fn pleg(capacity: usize) -> (TestPleg, PlegReceiver) {
    let mount = HierarchyMount {
        version: CgroupVersion::V2,
        mount_point: PathBuf::from("/nonexistent-cgroup-mount"),
        root: "/".into(),
    };
    let (tx, rx) = channel(capacity).expect("a wake-up socket");
    (
        TestPleg {
            pleg: Pleg::new(CgroupIndex::new(mount, roots())),
            tx,
        },
        rx,
    )
}

/// A PLEG whose events go to a queue as the pipeline hands them on.
struct TestPleg {
    pleg: Pleg,
    tx: PlegSender,
}

impl TestPleg {
    fn handle(&mut self, ev: KernelEvent) {
        self.pleg.handle(ev);
        self.forward();
    }

    fn resync(&mut self, scan: &Scan) {
        self.pleg.resync(scan);
        self.forward();
    }

    fn forward(&mut self) {
        for ev in self.pleg.take_events() {
            self.tx.send(ev);
        }
    }
}

impl std::ops::Deref for TestPleg {
    type Target = Pleg;

    fn deref(&self) -> &Pleg {
        &self.pleg
    }
}

impl std::ops::DerefMut for TestPleg {
    fn deref_mut(&mut self) -> &mut Pleg {
        &mut self.pleg
    }
}

fn change(id: u64, path: &str, at: u64) -> CgroupChange {
    CgroupChange {
        at: BootNs(at),
        id,
        level: path.matches('/').count() as u32,
        hierarchy: 0,
        path: path.to_string(),
    }
}

fn mkdir(id: u64, path: &str, at: u64) -> KernelEvent {
    KernelEvent::CgroupMkdir(change(id, path, at))
}

fn rmdir(id: u64, path: &str, at: u64) -> KernelEvent {
    KernelEvent::CgroupRmdir(change(id, path, at))
}

fn empty(id: u64, path: &str, at: u64) -> KernelEvent {
    KernelEvent::CgroupEmpty(change(id, path, at))
}

/// A task inside a container's pid namespace; `ns_pid` 1 is the container's init.
fn task_ns(pid: u32, ns_pid: u32, ns_level: u32, cgroup_id: u64, comm: &str) -> Task {
    Task {
        pid,
        tgid: pid,
        ppid: 1,
        ns_pid,
        ns_level,
        comm: Comm::from(comm),
        cgroup_id,
    }
}

fn task(pid: u32, cgroup_id: u64, comm: &str) -> Task {
    task_ns(pid, 1, 1, cgroup_id, comm)
}

/// The init's exec (pid 1 of the container's namespace).
fn exec(pid: u32, cgroup_id: u64, comm: &str, at: u64) -> KernelEvent {
    exec_as(task(pid, cgroup_id, comm), &format!("/bin/{comm}"), at)
}

/// Any other process exec'ing in the container (`kubectl exec`, a child).
fn exec_other(pid: u32, cgroup_id: u64, comm: &str, at: u64) -> KernelEvent {
    exec_as(
        task_ns(pid, pid % 1000 + 2, 1, cgroup_id, comm),
        &format!("/bin/{comm}"),
        at,
    )
}

fn exec_as(task: Task, filename: &str, at: u64) -> KernelEvent {
    KernelEvent::Exec(Exec {
        at: BootNs(at),
        task,
        old_pid: task.pid,
        filename: filename.to_string(),
    })
}

fn exit(pid: u32, cgroup_id: u64, status: WaitStatus, at: u64) -> KernelEvent {
    exit_as(task(pid, cgroup_id, "x"), status, at)
}

/// The exit of a thread group, recorded from `task` (its last thread).
fn exit_as(task: Task, status: WaitStatus, at: u64) -> KernelEvent {
    KernelEvent::Exit(Exit {
        at: BootNs(at),
        task,
        status,
        group_dead: true,
    })
}

fn oom(pid: u32, cgroup_id: u64, comm: &str, at: u64) -> KernelEvent {
    KernelEvent::OomKill(OomKill {
        at: BootNs(at),
        marked_at: BootNs(at - 1),
        victim: task(pid, cgroup_id, comm),
        victim_comm: Comm::from(comm),
        memory: OomMemory {
            anon_rss_kb: Some(32768),
            ..Default::default()
        },
        oom_score_adj: Some(999),
        trigger_pid: pid,
        trigger_tgid: pid,
        trigger_cgroup_id: cgroup_id,
    })
}

fn drain(rx: &mut PlegReceiver) -> Vec<PodLifecycleEvent> {
    std::iter::from_fn(|| rx.try_recv()).collect()
}

fn kinds(evs: &[PodLifecycleEvent]) -> Vec<PlegEventType> {
    evs.iter().map(PodLifecycleEvent::kind).collect()
}

use PlegEventType::*;

/// Pod with one container (cgroup ids 10 and 11), created.
fn setup(p: &mut TestPleg) {
    p.handle(mkdir(10, &pod_path(UID), 1));
    p.handle(mkdir(11, &ctr_path(UID, 1), 2));
}

#[test]
fn lifecycle_of_a_container_that_completes() {
    let (mut p, mut rx) = pleg(64);
    setup(&mut p);
    p.handle(exec(100, 11, "app", 3));
    p.handle(exec_other(200, 11, "sh", 4)); // kubectl exec: not the init
    p.handle(exit(200, 11, WaitStatus::exited(1), 5));
    p.handle(exit_as(task(100, 11, "app"), WaitStatus::exited(0), 6));
    p.handle(empty(11, &ctr_path(UID, 1), 7));
    p.handle(rmdir(11, &ctr_path(UID, 1), 8));
    let evs = drain(&mut rx);
    assert_eq!(
        kinds(&evs),
        [
            ContainerChanged,
            ContainerStarted,
            ContainerDied,
            ContainerRemoved
        ]
    );
    assert!(evs
        .iter()
        .all(|e| e.pod_uid.as_str() == UID && e.container_id() == Some(cid(1))));
    assert_eq!(
        evs[1].event,
        PlegEvent::ContainerStarted {
            id: cid(1),
            pid: 100,
            comm: Comm::from("app")
        }
    );
    let died = evs[2].exit().unwrap();
    assert_eq!(
        (died.reason, died.exit_code(), died.pid),
        (ExitReason::Completed, 0, Some(100))
    );
    assert_eq!(died.comm, Some(Comm::from("app")));
    assert_eq!(evs[2].at, BootNs(6));
    assert_eq!(evs[1].runtime, Some(Runtime::Containerd));
    assert!(
        p.model().container(&cid(1)).is_none(),
        "removed containers are forgotten"
    );
    assert_eq!(p.stats().late, 0);
}

#[test]
fn exit_codes_and_signals() {
    for (status, reason, code) in [
        (WaitStatus::exited(3), ExitReason::Error, 3),
        (WaitStatus::signaled(9, false), ExitReason::Error, 137),
        (WaitStatus::signaled(11, true), ExitReason::Error, 139),
        (WaitStatus::exited(0), ExitReason::Completed, 0),
    ] {
        let (mut p, mut rx) = pleg(64);
        setup(&mut p);
        p.handle(exec(100, 11, "app", 3));
        p.handle(exit(100, 11, status, 4));
        let evs = drain(&mut rx);
        let died = evs.last().unwrap().exit().unwrap();
        assert_eq!(
            (died.reason, died.exit_code(), died.status),
            (reason, code, Some(status))
        );
    }
}

#[test]
fn oom_kill_of_the_init_is_oomkilled() {
    let (mut p, mut rx) = pleg(64);
    setup(&mut p);
    p.handle(exec(100, 11, "app", 3));
    p.handle(oom(100, 11, "app", 5));
    p.handle(exit(100, 11, WaitStatus::signaled(9, false), 6));
    let evs = drain(&mut rx);
    assert_eq!(
        kinds(&evs),
        [ContainerChanged, ContainerStarted, OomKill, ContainerDied]
    );
    assert_eq!(evs[2].oom().unwrap().victim.pid, 100);
    let died = evs[3].exit().unwrap();
    assert_eq!(
        (died.reason, died.exit_code()),
        (ExitReason::OomKilled, 137)
    );
}

/// The kernel signals the victim before it marks it: a victim that exits at once is read before
/// its kill. The death goes out as read; the kill that follows corrects the record.
#[test]
fn oom_kill_read_after_the_inits_death_corrects_it() {
    let (mut p, mut rx) = pleg(64);
    setup(&mut p);
    p.handle(exec(100, 11, "app", 3));
    p.handle(exit(100, 11, WaitStatus::signaled(9, false), 5));
    p.handle(oom(100, 11, "app", 6));
    let evs = drain(&mut rx);
    assert_eq!(
        kinds(&evs),
        [ContainerChanged, ContainerStarted, ContainerDied, OomKill]
    );
    assert_eq!(evs[2].exit().unwrap().reason, ExitReason::Error);
    let rec = p.model().container(&cid(1)).unwrap();
    assert_eq!(rec.exit.as_ref().unwrap().reason, ExitReason::OomKilled);
    // A kill of another process, or an init that did not die of a SIGKILL, changes nothing.
    for (status, victim) in [
        (WaitStatus::signaled(9, false), 101),
        (WaitStatus::exited(0), 100),
    ] {
        let (mut p, _rx) = pleg(64);
        setup(&mut p);
        p.handle(exec(100, 11, "app", 3));
        p.handle(exit(100, 11, status, 5));
        p.handle(oom(victim, 11, "app", 6));
        let rec = p.model().container(&cid(1)).unwrap();
        assert_ne!(rec.exit.as_ref().unwrap().reason, ExitReason::OomKilled);
    }
}

#[test]
fn oom_kill_of_a_child_leaves_the_container_running_and_a_later_clean_exit_completed() {
    let (mut p, mut rx) = pleg(64);
    setup(&mut p);
    p.handle(exec(100, 11, "app", 3));
    p.handle(exec_other(101, 11, "worker", 4));
    p.handle(oom(101, 11, "worker", 5));
    p.handle(exit(101, 11, WaitStatus::signaled(9, false), 6));
    let evs = drain(&mut rx);
    assert_eq!(kinds(&evs), [ContainerChanged, ContainerStarted, OomKill]);
    let rec = p.model().container(&cid(1)).unwrap();
    assert_eq!(rec.state, ContainerState::Running);
    assert_eq!(rec.oom_kills, 1);
    assert_eq!(
        rec.last_oom.as_ref().unwrap().victim_comm.as_str(),
        "worker"
    );
    assert_eq!(
        p.model()
            .pod(&PodUid::parse(UID).unwrap())
            .unwrap()
            .last_oom
            .as_ref()
            .unwrap()
            .victim
            .pid,
        101
    );
    // containerd would call this OOMKilled with exit code 0 (kubernetes#104454); the truth is
    // Completed, with the child's kill kept as evidence.
    p.handle(exit(100, 11, WaitStatus::exited(0), 7));
    let died = drain(&mut rx);
    assert_eq!(died[0].exit().unwrap().reason, ExitReason::Completed);
    assert_eq!(
        p.model()
            .container(&cid(1))
            .unwrap()
            .last_oom
            .as_ref()
            .unwrap()
            .victim
            .pid,
        101
    );
}

#[test]
fn exit_seen_before_the_mkdir_is_held_and_replayed() {
    let (mut p, mut rx) = pleg(64);
    p.handle(mkdir(10, &pod_path(UID), 1));
    // The container's exec and exit arrive before its mkdir was processed.
    p.handle(exec(100, 11, "app", 3));
    p.handle(exit(100, 11, WaitStatus::exited(2), 4));
    assert_eq!(p.held(), 2);
    assert!(drain(&mut rx).is_empty());
    p.handle(mkdir(11, &ctr_path(UID, 1), 2));
    let evs = drain(&mut rx);
    assert_eq!(
        kinds(&evs),
        [ContainerChanged, ContainerStarted, ContainerDied]
    );
    assert_eq!(evs[2].exit().unwrap().exit_code(), 2);
    assert_eq!(
        (p.held(), p.stats().replayed, p.stats().unattributed),
        (0, 2, 0)
    );
}

#[test]
fn events_for_a_cgroup_that_never_appears_expire_and_are_counted() {
    let (mut p, mut rx) = pleg(64);
    p.handle(exit(100, 77, WaitStatus::exited(0), 1_000));
    assert_eq!(p.held(), 1);
    // Time passes (any later event carries the clock).
    p.handle(mkdir(10, &pod_path(UID), 1_000 + ORPHAN_TTL_NS + 1));
    assert_eq!((p.held(), p.stats().unattributed), (0, 1));
    assert!(drain(&mut rx).is_empty());
}

#[test]
fn pid_reuse_across_containers() {
    let (mut p, mut rx) = pleg(64);
    setup(&mut p);
    p.handle(mkdir(12, &ctr_path(UID, 2), 2));
    p.handle(exec(100, 11, "first", 3));
    p.handle(exit(100, 11, WaitStatus::exited(1), 4));
    // The pid is reused by the second container's init; the first one's record is untouched.
    p.handle(exec(100, 12, "second", 5));
    p.handle(exit(100, 12, WaitStatus::exited(0), 6));
    // A stray exec in the dead container's cgroup (runc re-exec) does not revive it.
    p.handle(exec(100, 11, "runc", 7));
    let evs = drain(&mut rx);
    let deaths: Vec<_> = evs
        .iter()
        .filter(|e| e.kind() == ContainerDied)
        .map(|e| (e.container_id().unwrap(), e.exit().unwrap().exit_code()))
        .collect();
    assert_eq!(deaths, [(cid(1), 1), (cid(2), 0)]);
    assert_eq!(
        p.model().container(&cid(1)).unwrap().state,
        ContainerState::Exited
    );
    assert_eq!(p.stats().late, 1);
}

#[test]
fn start_and_death_within_a_millisecond() {
    let (mut p, mut rx) = pleg(64);
    setup(&mut p);
    p.handle(exec(100, 11, "true", 1_000_000));
    p.handle(exit(100, 11, WaitStatus::exited(0), 1_000_400));
    let evs = drain(&mut rx);
    assert_eq!(
        kinds(&evs),
        [ContainerChanged, ContainerStarted, ContainerDied]
    );
    assert_eq!(evs[2].at.0 - evs[1].at.0, 400);
}

#[test]
fn runc_helpers_in_the_host_namespace_are_not_the_init() {
    let (mut p, mut rx) = pleg(64);
    setup(&mut p);
    // runc init's first stage joins the cgroup in the host's pid namespace, re-execs itself from
    // a memfd, forks the container's init and exits.
    p.handle(exec_as(
        task_ns(500, 500, 0, 11, "runc:[0:PARENT]"),
        "/dev/fd/6",
        3,
    ));
    let stage = |pid| {
        KernelEvent::Exit(Exit {
            at: BootNs(4),
            task: task_ns(pid, pid, 0, 11, "runc:[1:CHILD]"),
            status: WaitStatus::exited(0),
            group_dead: true,
        })
    };
    p.handle(stage(501));
    p.handle(stage(500));
    assert_eq!(
        p.model().container(&cid(1)).unwrap().state,
        ContainerState::Created
    );
    p.handle(exec(502, 11, "app", 6));
    p.handle(exit(502, 11, WaitStatus::exited(4), 7));
    let evs = drain(&mut rx);
    assert_eq!(
        kinds(&evs),
        [ContainerChanged, ContainerStarted, ContainerDied]
    );
    assert!(matches!(
        evs[1].event,
        PlegEvent::ContainerStarted { pid: 502, .. }
    ));
    assert_eq!(evs[2].exit().unwrap().exit_code(), 4);
}

#[test]
fn host_pid_namespace_container_takes_its_first_real_exec() {
    let (mut p, mut rx) = pleg(64);
    setup(&mut p);
    p.handle(exec_as(
        task_ns(500, 500, 0, 11, "runc"),
        "/proc/self/exe",
        3,
    ));
    p.handle(exec_as(task_ns(600, 600, 0, 11, "app"), "/usr/bin/app", 4));
    let host = |pid, code, at| {
        KernelEvent::Exit(Exit {
            at: BootNs(at),
            task: task_ns(pid, pid, 0, 11, "x"),
            status: WaitStatus::exited(code),
            group_dead: true,
        })
    };
    p.handle(host(500, 0, 5));
    p.handle(host(600, 9, 6));
    let evs = drain(&mut rx);
    assert_eq!(
        kinds(&evs),
        [ContainerChanged, ContainerStarted, ContainerDied]
    );
    assert!(matches!(
        evs[1].event,
        PlegEvent::ContainerStarted { pid: 600, .. }
    ));
    assert_eq!(evs[2].exit().unwrap().exit_code(), 9);
}

/// `shareProcessNamespace` (CRI pid mode POD): the pause process is pid 1 of the pod's namespace,
/// and each container's init is some other pid of it. runc's helpers still run in the node's.
#[test]
fn shared_pod_namespace_init_is_the_first_exec_in_the_namespace() {
    let (mut p, mut rx) = pleg(64);
    setup(&mut p);
    p.handle(exec_as(
        task_ns(500, 500, 0, 11, "runc:[0:PARENT]"),
        "/dev/fd/6",
        3,
    ));
    p.handle(exec_as(task_ns(502, 7, 1, 11, "app"), "/usr/bin/app", 4));
    // A `kubectl exec` session and a child of the init, in the same namespace: not the init.
    p.handle(exec_as(task_ns(510, 9, 1, 11, "sh"), "/bin/sh", 5));
    let other = |pid, ns_pid, code, at| {
        KernelEvent::Exit(Exit {
            at: BootNs(at),
            task: task_ns(pid, ns_pid, 1, 11, "x"),
            status: WaitStatus::exited(code),
            group_dead: true,
        })
    };
    p.handle(other(510, 9, 1, 6));
    assert_eq!(
        p.model().container(&cid(1)).unwrap().state,
        ContainerState::Running
    );
    p.handle(other(502, 7, 3, 7));
    let evs = drain(&mut rx);
    assert_eq!(
        kinds(&evs),
        [ContainerChanged, ContainerStarted, ContainerDied]
    );
    assert!(matches!(
        evs[1].event,
        PlegEvent::ContainerStarted { pid: 502, .. }
    ));
    assert_eq!(evs[2].exit().unwrap().exit_code(), 3);
}

/// An ephemeral debug container (CRI pid mode TARGET) joins its target's namespace, where the
/// target's init is pid 1.
#[test]
fn ephemeral_container_in_its_targets_namespace() {
    let (mut p, mut rx) = pleg(64);
    setup(&mut p);
    p.handle(exec_as(task_ns(700, 23, 1, 11, "sh"), "/bin/sh", 3));
    p.handle(exit(700, 11, WaitStatus::signaled(9, false), 4));
    // `exit()` reports pid 1 in the namespace; the death is the init's by its host pid anyway.
    let evs = drain(&mut rx);
    assert_eq!(
        kinds(&evs),
        [ContainerChanged, ContainerStarted, ContainerDied]
    );
    assert_eq!(evs[2].exit().unwrap().exit_code(), 137);
}

/// The node is itself a container (kind): its pid namespace is level 1, pods' are level 2, and a
/// hostPID pod's processes sit at level 1 like runc's helpers.
#[test]
fn a_nested_node_counts_namespaces_from_its_own() {
    let (mut p, mut rx) = pleg(64);
    p.set_host_ns_level(1);
    setup(&mut p);
    p.handle(exec_as(
        task_ns(500, 80, 1, 11, "runc"),
        "/proc/self/exe",
        3,
    ));
    p.handle(exec_as(task_ns(501, 81, 1, 11, "app"), "/usr/bin/app", 4));
    let evs = drain(&mut rx);
    assert!(
        matches!(evs[1].event, PlegEvent::ContainerStarted { pid: 501, .. }),
        "{evs:#?}"
    );
    // At level 1 a helper's exit before any exec is not the init's death; at level 2 it would be.
    let (mut p, mut rx) = pleg(64);
    p.set_host_ns_level(1);
    setup(&mut p);
    let exit_at = |level| {
        KernelEvent::Exit(Exit {
            at: BootNs(5),
            task: task_ns(600, 600, level, 11, "runc:[1:CHILD]"),
            status: WaitStatus::exited(0),
            group_dead: true,
        })
    };
    p.handle(exit_at(1));
    assert_eq!(kinds(&drain(&mut rx)), [ContainerChanged]);
    p.handle(exit_at(2));
    assert_eq!(kinds(&drain(&mut rx)), [ContainerDied]);
}

#[test]
fn death_without_exec_is_the_init_dying() {
    // runc init joined the cgroup but its exec never happened (bad entrypoint) or was lost.
    let (mut p, mut rx) = pleg(64);
    setup(&mut p);
    p.handle(exit(100, 11, WaitStatus::exited(127), 3));
    let evs = drain(&mut rx);
    assert_eq!(kinds(&evs), [ContainerChanged, ContainerDied]);
    assert_eq!(evs[1].exit().unwrap().exit_code(), 127);
}

#[test]
fn events_for_a_removed_cgroup_are_late() {
    let (mut p, mut rx) = pleg(64);
    setup(&mut p);
    p.handle(exec(100, 11, "app", 3));
    p.handle(exit(100, 11, WaitStatus::exited(0), 4));
    p.handle(rmdir(11, &ctr_path(UID, 1), 5));
    drain(&mut rx);
    p.handle(exit(300, 11, WaitStatus::exited(0), 6));
    p.handle(oom(300, 11, "late", 7));
    assert!(drain(&mut rx).is_empty());
    assert_eq!((p.stats().late, p.held()), (2, 0));
}

#[test]
fn lost_exit_is_reported_when_the_cgroup_empties_or_vanishes() {
    let (mut p, mut rx) = pleg(64);
    setup(&mut p);
    p.handle(mkdir(12, &ctr_path(UID, 2), 2));
    p.handle(exec(100, 11, "a", 3));
    p.handle(exec(200, 12, "b", 3));
    // Container 1's init exit was lost; its cgroup emptied.
    p.handle(empty(11, &ctr_path(UID, 1), 5));
    // Container 2's exit and empty were both lost; its cgroup was removed.
    p.handle(rmdir(12, &ctr_path(UID, 2), 6));
    let evs = drain(&mut rx);
    let tail: Vec<_> = evs
        .iter()
        .skip(4)
        .map(|e| {
            (
                e.container_id().unwrap(),
                e.kind(),
                e.exit().map(|x| (x.reason, x.exit_code())),
            )
        })
        .collect();
    assert_eq!(
        tail,
        [
            (cid(1), ContainerDied, Some((ExitReason::Unknown, 137))),
            (cid(2), ContainerDied, Some((ExitReason::Unknown, 137))),
            (cid(2), ContainerRemoved, None),
        ]
    );
}

#[test]
fn lost_records_resync_every_pod() {
    let (mut p, mut rx) = pleg(64);
    setup(&mut p);
    p.handle(mkdir(20, &pod_path(UID2), 3));
    drain(&mut rx);
    p.handle(KernelEvent::Lost {
        at: BootNs(9),
        records: 5,
    });
    let evs = drain(&mut rx);
    assert_eq!(kinds(&evs), [PodSync, PodSync]);
    assert!(p.needs_resync());
    assert_eq!(p.stats().lost_records, 5);
}

#[test]
fn nested_cgroups_belong_to_their_container() {
    let (mut p, mut rx) = pleg(64);
    setup(&mut p);
    let nested = format!("{}/init.scope", ctr_path(UID, 1));
    p.handle(mkdir(13, &nested, 3));
    p.handle(exec(100, 13, "systemd", 4));
    p.handle(exit(100, 13, WaitStatus::exited(0), 5));
    p.handle(rmdir(13, &nested, 6));
    p.handle(rmdir(11, &ctr_path(UID, 1), 7));
    let evs = drain(&mut rx);
    assert_eq!(
        kinds(&evs),
        [
            ContainerChanged,
            ContainerStarted,
            ContainerDied,
            ContainerRemoved
        ]
    );
}

#[test]
fn conmon_and_system_cgroups_make_no_events() {
    let (mut p, mut rx) = pleg(64);
    p.handle(mkdir(10, &pod_path(UID), 1));
    let conmon = crate::cgroup::conmon_cgroup_path(
        CgroupDriver::Systemd,
        Qos::Burstable,
        &PodUid::parse(UID).unwrap(),
        &cid(1),
    );
    p.handle(mkdir(30, &conmon, 2));
    p.handle(exec(400, 30, "conmon", 3));
    p.handle(mkdir(31, "/system.slice/cron.service", 2));
    p.handle(exec(401, 31, "cron", 3));
    assert!(drain(&mut rx).is_empty());
    assert_eq!(p.held(), 0);
}

/// A cgroup named like a running container's, made outside kubelet's roots (a delegated
/// subtree, a container's own cgroupfs) and removed again: the real container is untouched,
/// nothing is made of it, and each of its events is counted.
#[test]
fn a_spoof_outside_kubelets_roots_changes_nothing() {
    let (mut p, mut rx) = pleg(64);
    setup(&mut p);
    p.handle(exec(100, 11, "app", 3));
    let before = drain(&mut rx);
    assert_eq!(kinds(&before), [ContainerChanged, ContainerStarted]);
    for (n, prefix) in ["/evil", "/user.slice/user-1000.slice/user@1000.service"]
        .into_iter()
        .enumerate()
    {
        let n = n as u64 * 10;
        p.handle(mkdir(20 + n, &format!("{prefix}{}", pod_path(UID)), 4));
        p.handle(mkdir(21 + n, &format!("{prefix}{}", ctr_path(UID, 1)), 5));
        // Its own "init" in it (with every process watched), then it goes away.
        p.handle(exec(200, 21 + n, "fake", 6));
        p.handle(exit(200, 21 + n, WaitStatus(9), 7));
        p.handle(empty(21 + n, &format!("{prefix}{}", ctr_path(UID, 1)), 8));
        p.handle(rmdir(21 + n, &format!("{prefix}{}", ctr_path(UID, 1)), 9));
        p.handle(rmdir(20 + n, &format!("{prefix}{}", pod_path(UID)), 10));
    }
    assert_eq!(drain(&mut rx), [], "the spoof made lifecycle events");
    let c = p.model().container(&cid(1)).expect("the real container");
    assert_eq!(
        (c.state, c.cgroup_id, c.init_pid),
        (ContainerState::Running, 11, Some(100))
    );
    assert_eq!(p.model().counts(), (1, 1));
    assert_eq!(p.stats().outside_roots, 2 * 7);
    // The real one still dies as itself.
    p.handle(exit(100, 11, WaitStatus(0), 11));
    assert_eq!(kinds(&drain(&mut rx)), [ContainerDied]);
}

#[test]
fn pod_removal_is_a_pod_sync() {
    let (mut p, mut rx) = pleg(64);
    setup(&mut p);
    p.handle(rmdir(11, &ctr_path(UID, 1), 3));
    p.handle(rmdir(10, &pod_path(UID), 4));
    let evs = drain(&mut rx);
    assert_eq!(
        kinds(&evs),
        [ContainerChanged, ContainerDied, ContainerRemoved, PodSync]
    );
    assert!(p.model().pod(&PodUid::parse(UID).unwrap()).is_none());
}

fn scanned(id: u64, path: &str, pids: &[u32], init: Option<u32>) -> ScannedCgroup {
    ScannedCgroup {
        id,
        path: path.to_string(),
        kind: roots().classify(path),
        pids: pids.to_vec(),
        init_pid: init,
    }
}

fn scan(cgroups: Vec<ScannedCgroup>) -> Scan {
    Scan {
        version: CgroupVersion::V2,
        cgroups,
        stats: ScanStats::default(),
    }
}

#[test]
fn initial_sync_then_resync_after_loss() {
    let (mut p, mut rx) = pleg(64);
    p.resync(&scan(vec![
        scanned(10, &pod_path(UID), &[100, 200], None),
        scanned(11, &ctr_path(UID, 1), &[100], Some(100)),
        scanned(12, &ctr_path(UID, 2), &[], None),
        scanned(20, &pod_path(UID2), &[300], None),
        scanned(21, &ctr_path(UID2, 3), &[300], Some(300)),
    ]));
    let evs = drain(&mut rx);
    let started: Vec<_> = evs
        .iter()
        .filter(|e| e.kind() == ContainerStarted)
        .map(|e| e.container_id().unwrap())
        .collect();
    assert_eq!(started.len(), 2);
    assert!(started.contains(&cid(1)) && started.contains(&cid(3)));
    assert_eq!(
        p.model().container(&cid(2)).unwrap().state,
        ContainerState::Unknown
    );
    assert_eq!(p.model().container(&cid(1)).unwrap().init_pid, Some(100));
    // Events keep flowing on top of the synced state.
    p.handle(exit(100, 11, WaitStatus::exited(0), 50));
    assert_eq!(
        drain(&mut rx)[0].exit().unwrap().reason,
        ExitReason::Completed
    );

    // Later, records were lost meanwhile: container 3 died and pod 2 went away; container 2 started.
    p.handle(KernelEvent::Lost {
        at: BootNs(60),
        records: 100,
    });
    drain(&mut rx);
    p.resync(&scan(vec![
        scanned(10, &pod_path(UID), &[200], None),
        scanned(11, &ctr_path(UID, 1), &[], None),
        scanned(12, &ctr_path(UID, 2), &[200], Some(200)),
    ]));
    let evs = drain(&mut rx);
    let got: Vec<_> = evs.iter().map(|e| (e.kind(), e.container_id())).collect();
    assert!(got.contains(&(ContainerStarted, Some(cid(2)))), "{got:?}");
    assert!(got.contains(&(ContainerDied, Some(cid(3)))), "{got:?}");
    assert!(got.contains(&(ContainerRemoved, Some(cid(3)))), "{got:?}");
    assert!(got.contains(&(PodSync, None)), "{got:?}");
    assert!(
        !got.contains(&(ContainerDied, Some(cid(1)))),
        "already known dead: {got:?}"
    );
    assert!(!p.needs_resync());
    assert!(p.model().pod(&PodUid::parse(UID2).unwrap()).is_none());
}

#[test]
fn a_lagging_consumer_gets_pod_syncs_not_loss() {
    let (mut p, mut rx) = pleg(3);
    setup(&mut p); // ContainerChanged
    for n in 0..50u32 {
        let pid = 1000 + n;
        p.handle(mkdir(100 + u64::from(n), &ctr_path(UID2, 100 + n), 10));
        p.handle(exec(pid, 100 + u64::from(n), "x", 11));
    }
    let evs = drain(&mut rx);
    assert_eq!(
        evs.len(),
        4,
        "3 queued events and one PodSync for the pod that overflowed"
    );
    assert_eq!(evs[3].kind(), PodSync);
    assert_eq!(evs[3].pod_uid.as_str(), UID2);
    assert_eq!(rx.lagged(), 100 - 2);
}

/// The kernel's set of known inits follows the PLEG: an init in at its ContainerStarted (from an
/// exec or from a walk), out at its ContainerDied (from its exit, its cgroup emptying or
/// vanishing, or a walk that no longer finds it); nothing for other processes.
#[test]
fn init_changes_follow_started_and_died() {
    let (mut p, mut rx) = pleg(64);
    setup(&mut p);
    p.handle(mkdir(12, &ctr_path(UID, 2), 2));
    p.handle(mkdir(13, &ctr_path(UID, 3), 2));
    p.handle(exec(100, 11, "a", 3));
    // Shared pid namespace: the init is not pid 1, and is registered all the same.
    p.handle(exec_as(task_ns(200, 7, 1, 12, "b"), "/usr/bin/b", 3));
    p.handle(exec(300, 13, "c", 3));
    p.handle(exec_other(400, 11, "sh", 4));
    p.handle(exit(400, 11, WaitStatus::exited(0), 5));
    assert_eq!(
        p.take_init_changes().collect::<Vec<_>>(),
        [
            InitChange::Started(100),
            InitChange::Started(200),
            InitChange::Started(300)
        ]
    );
    p.handle(exit(100, 11, WaitStatus::exited(0), 6));
    // Container 2's exit was lost: its cgroup emptied. Container 3's cgroup vanished.
    p.handle(empty(12, &ctr_path(UID, 2), 7));
    p.handle(rmdir(13, &ctr_path(UID, 3), 8));
    assert_eq!(
        p.take_init_changes().collect::<Vec<_>>(),
        [
            InitChange::Died(100),
            InitChange::Died(200),
            InitChange::Died(300)
        ]
    );
    assert_eq!(p.take_init_changes().count(), 0, "taken once");

    // From walks: found running, then gone.
    p.resync(&scan(vec![
        scanned(20, &pod_path(UID2), &[500], None),
        scanned(21, &ctr_path(UID2, 5), &[500], Some(500)),
    ]));
    assert_eq!(
        p.take_init_changes().collect::<Vec<_>>(),
        [InitChange::Started(500)]
    );
    p.resync(&scan(vec![scanned(20, &pod_path(UID2), &[], None)]));
    assert_eq!(
        p.take_init_changes().collect::<Vec<_>>(),
        [InitChange::Died(500)]
    );
    drain(&mut rx);
}

#[test]
fn the_stream_stamps_each_event_when_it_is_sent() {
    let (mut p, mut rx) = pleg(64);
    let before = std::time::SystemTime::now();
    setup(&mut p);
    let after = std::time::SystemTime::now();
    let s = rx.try_recv_stamped().unwrap();
    assert_eq!(s.event.kind(), ContainerChanged);
    assert!(before <= s.sent && s.sent <= after);
}

/// The death names the process as it died: a program renamed after its exec (busybox's
/// `exec tail`: an exec of /proc/self/exe, named `exe`, then `tail` by prctl) is `tail`; a record
/// from another thread than the leader (its own thread name) leaves the init's exec name.
#[test]
fn a_death_names_the_process_as_it_died() {
    for (last, want) in [
        (task(100, 11, "tail"), "tail"),
        (
            Task {
                pid: 101,
                ..task(100, 11, "worker-3")
            },
            "exe",
        ),
    ] {
        let (mut p, mut rx) = pleg(64);
        setup(&mut p);
        p.handle(exec(100, 11, "sh", 3));
        p.handle(exec_as(task(100, 11, "exe"), "/proc/self/exe", 4));
        p.handle(exit_as(last, WaitStatus::signaled(9, false), 5));
        let evs = drain(&mut rx);
        let died = evs.iter().find_map(|e| e.exit()).expect("ContainerDied");
        assert_eq!(died.comm, Some(Comm::from(want)), "{last:?}");
        assert_eq!(died.pid, Some(100));
    }
}
