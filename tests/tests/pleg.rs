//! The PLEG against the real kernel: cgroups laid out exactly as kubelet with containerd or CRI-O
//! lays them out (both cgroup drivers), under each test's own root, with real processes in them.
#![allow(unused_crate_dependencies)] // a test/bench/bin target sees its package's whole dependency list
use std::time::Duration;

use observer::{
    cgroup::{
        conmon_cgroup_path, container_cgroup_path, pod_cgroup_path, CgroupDriver, ContainerId,
        PodUid, Qos, Runtime,
    },
    kernel::ProbeOptions,
    pleg::{ExitReason, PlegEvent, PlegEventType, PlegEventType::*, PodLifecycleEvent},
};
use observer_tests::{
    eventually,
    kernel::{require_kernel, workload, PlegWatch, TestCgroup},
};

const WAIT: Duration = Duration::from_secs(10);

fn uid(n: u32) -> PodUid {
    PodUid::parse(&format!("{n:08x}-1111-4222-8333-444444444444")).unwrap()
}

fn cid(n: u32) -> ContainerId {
    ContainerId::parse(&format!("{:064x}", 0xc0ffee00u64 + u64::from(n))).unwrap()
}

fn comm_of(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default()
}

/// The lifecycle events of one container (its memory limit hits left out: how many the kernel
/// sends depends on how long the container sat at its limit).
fn of(events: &[PodLifecycleEvent], id: ContainerId) -> Vec<&PodLifecycleEvent> {
    events
        .iter()
        .filter(|e| e.container_id() == Some(id) && e.kind() != PlegEventType::LimitHit)
        .collect()
}

/// One pod, two containers: one exits 3, one is killed; a `kubectl exec`-like process in the
/// second changes nothing; then both cgroups are removed. Asserts the exact PLEG sequence.
/// `n` keeps pod and container ids apart between tests running at once: cgroup events are
/// node-wide, and ids are unique on a real node.
async fn lifecycle(n: u32, driver: CgroupDriver, runtime: Runtime, qos: Qos) {
    let mut cg = TestCgroup::new(&format!("{}-{}", driver.as_str(), runtime.as_str())).unwrap();
    let pod = uid(10 + n);
    let cid = |k: u32| cid(n * 10 + k);
    let mut w = PlegWatch::new(&cg, "").unwrap();
    let pod_rel = cg.mkdir(&pod_cgroup_path(driver, qos, &pod)).unwrap();
    let a = cg
        .mkdir(&container_cgroup_path(driver, qos, &pod, runtime, &cid(1)))
        .unwrap();
    let b = cg
        .mkdir(&container_cgroup_path(driver, qos, &pod, runtime, &cid(2)))
        .unwrap();
    if runtime == Runtime::Crio {
        // conmon lives beside the container and is not one: its processes make no events.
        let conmon = cg
            .mkdir(&conmon_cgroup_path(driver, qos, &pod, &cid(1)))
            .unwrap();
        cg.spawn_in(&conmon, &workload(), &["exit", "0"])
            .unwrap()
            .wait()
            .unwrap();
    }
    let mut ca = cg.spawn_in(&a, &workload(), &["exit", "3"]).unwrap();
    let mut cb = cg.spawn_in(&b, &workload(), &["sleep", "60"]).unwrap();
    let (pa, pb) = (ca.id(), cb.id());
    ca.wait().unwrap();
    w.until(WAIT, |ev| {
        of(ev, cid(2)).iter().any(|e| e.kind() == ContainerStarted)
    })
    .await
    .unwrap();
    cg.spawn_in(&b, &workload(), &["exit", "0"])
        .unwrap()
        .wait()
        .unwrap();
    cb.kill().unwrap();
    cb.wait().unwrap();
    w.until(WAIT, |ev| {
        of(ev, cid(1)).iter().any(|e| e.kind() == ContainerDied)
            && of(ev, cid(2)).iter().any(|e| e.kind() == ContainerDied)
    })
    .await
    .unwrap();
    for rel in [&a, &b] {
        std::fs::remove_dir(cg.abs(rel)).unwrap();
    }
    let removed =
        |ev: &[PodLifecycleEvent], id| of(ev, id).iter().any(|e| e.kind() == ContainerRemoved);
    let events = w
        .until(WAIT, |ev| removed(ev, cid(1)) && removed(ev, cid(2)))
        .await
        .unwrap()
        .to_vec();

    for (id, pid, code, signal) in [(cid(1), pa, 3, None), (cid(2), pb, 137, Some(9))] {
        let evs = of(&events, id);
        let kinds: Vec<_> = evs.iter().map(|e| e.kind()).collect();
        assert_eq!(
            kinds,
            [
                ContainerChanged,
                ContainerStarted,
                ContainerDied,
                ContainerRemoved
            ],
            "{id}: {evs:#?}"
        );
        assert!(evs.iter().all(|e| e.pod_uid == pod), "{evs:#?}");
        let expected_runtime = match (driver, runtime) {
            // containerd's and docker's cgroupfs names are the bare id.
            (CgroupDriver::Cgroupfs, Runtime::Containerd) => None,
            _ => Some(runtime),
        };
        assert!(
            evs.iter().all(|e| e.runtime == expected_runtime),
            "{evs:#?}"
        );
        assert!(
            matches!(evs[1].event, PlegEvent::ContainerStarted { pid: p, .. } if p == pid),
            "{:?}",
            evs[1]
        );
        let died = evs[2].exit().unwrap();
        assert_eq!(
            (
                died.exit_code(),
                died.status.and_then(|s| s.signal()),
                died.pid
            ),
            (code, signal, Some(pid))
        );
        assert_eq!(died.reason, ExitReason::Error);
        assert!(
            evs.windows(2).all(|w| w[0].at <= w[1].at),
            "ordered per container: {evs:#?}"
        );
    }
    assert_eq!(w.pipeline.stats().pleg.unattributed, 0);
    drop(pod_rel);
}

#[tokio::test]
async fn containerd_systemd_driver() {
    if require_kernel() {
        lifecycle(
            1,
            CgroupDriver::Systemd,
            Runtime::Containerd,
            Qos::Burstable,
        )
        .await;
    }
}

#[tokio::test]
async fn containerd_cgroupfs_driver() {
    if require_kernel() {
        lifecycle(
            2,
            CgroupDriver::Cgroupfs,
            Runtime::Containerd,
            Qos::BestEffort,
        )
        .await;
    }
}

#[tokio::test]
async fn crio_systemd_driver() {
    if require_kernel() {
        lifecycle(3, CgroupDriver::Systemd, Runtime::Crio, Qos::Guaranteed).await;
    }
}

#[tokio::test]
async fn crio_cgroupfs_driver() {
    if require_kernel() {
        lifecycle(4, CgroupDriver::Cgroupfs, Runtime::Crio, Qos::Burstable).await;
    }
}

#[tokio::test]
async fn oom_kill_of_init_and_of_a_child() {
    if !require_kernel() {
        return;
    }
    let (driver, qos, runtime) = (CgroupDriver::Systemd, Qos::Burstable, Runtime::Containerd);
    let mut cg = TestCgroup::new("pleg-oom").unwrap();
    cg.limit_memory(32 << 20).unwrap();
    let pod = uid(2);
    let cid = |k: u32| cid(100 + k);
    let mut w = PlegWatch::new(&cg, "").unwrap();
    cg.mkdir(&pod_cgroup_path(driver, qos, &pod)).unwrap();
    let init_oom = cg
        .mkdir(&container_cgroup_path(driver, qos, &pod, runtime, &cid(1)))
        .unwrap();
    let child_oom = cg
        .mkdir(&container_cgroup_path(driver, qos, &pod, runtime, &cid(2)))
        .unwrap();
    // Container 1's init allocates past the limit; container 2's init forks the allocating child.
    let c1 = cg
        .spawn_in(&init_oom, &workload(), &["alloc", "64"])
        .unwrap();
    let p1 = c1.id();
    let _ = c1.wait_with_output();
    let c2 = cg
        .spawn_in(&child_oom, &workload(), &["oom-child", "64"])
        .unwrap();
    let p2 = c2.id();
    let out = c2.wait_with_output().unwrap();
    assert!(out.status.success());
    let events = w
        .until(WAIT, |ev| {
            of(ev, cid(1)).iter().any(|e| e.kind() == ContainerDied)
                && of(ev, cid(2)).iter().any(|e| e.kind() == ContainerDied)
        })
        .await
        .unwrap()
        .to_vec();
    let one: Vec<_> = of(&events, cid(1)).iter().map(|e| e.kind()).collect();
    assert_eq!(
        one,
        [ContainerChanged, ContainerStarted, OomKill, ContainerDied]
    );
    // The kernel said the charge met the limit before it killed: the first limit hit of a
    // cgroup is sent at once.
    let first_hit = events
        .iter()
        .position(|e| e.container_id() == Some(cid(1)) && e.kind() == PlegEventType::LimitHit);
    let kill = events
        .iter()
        .position(|e| e.container_id() == Some(cid(1)) && e.kind() == OomKill);
    assert!(
        first_hit.is_some() && first_hit < kill,
        "no limit hit before the kill: {events:#?}"
    );
    let died = of(&events, cid(1))[3].exit().unwrap();
    assert_eq!(
        (died.reason, died.exit_code(), died.pid),
        (ExitReason::OomKilled, 137, Some(p1))
    );

    let two = of(&events, cid(2));
    let kinds: Vec<_> = two.iter().map(|e| e.kind()).collect();
    assert_eq!(
        kinds,
        [ContainerChanged, ContainerStarted, OomKill, ContainerDied]
    );
    let oom = two[2].oom().unwrap();
    assert_eq!(oom.victim_comm.as_str(), "oom-victim");
    assert_eq!(oom.victim.ppid, p2);
    // The container lived on after its child's OOM kill and then exited 0: Completed, with the
    // kill kept as evidence.
    let died = two[3].exit().unwrap();
    assert_eq!(
        (died.reason, died.exit_code(), died.pid),
        (ExitReason::Completed, 0, Some(p2))
    );
    let rec = w.pipeline.pleg().model().container(&cid(2)).unwrap();
    assert_eq!(rec.oom_kills, 1);
    assert_eq!(rec.last_oom.as_ref().unwrap().victim.pid, oom.victim.pid);
}

#[tokio::test]
async fn initial_sync_finds_containers_started_before_the_agent() {
    if !require_kernel() {
        return;
    }
    let (driver, qos) = (CgroupDriver::Cgroupfs, Qos::Burstable);
    let mut cg = TestCgroup::new("pleg-sync").unwrap();
    let pod = uid(3);
    let cid = |k: u32| cid(200 + k);
    cg.mkdir(&pod_cgroup_path(driver, qos, &pod)).unwrap();
    let running = cg
        .mkdir(&container_cgroup_path(
            driver,
            qos,
            &pod,
            Runtime::Containerd,
            &cid(1),
        ))
        .unwrap();
    let exited = cg
        .mkdir(&container_cgroup_path(
            driver,
            qos,
            &pod,
            Runtime::Containerd,
            &cid(2),
        ))
        .unwrap();
    let mut before = cg
        .spawn_in(&running, &workload(), &["sleep", "60"])
        .unwrap();
    cg.spawn_in(&exited, &workload(), &["exit", "0"])
        .unwrap()
        .wait()
        .unwrap();
    // The walk names the init by its comm: wait until the sleeper exec'd the workload.
    assert!(eventually(WAIT, || comm_of(before.id()).starts_with("observer-work")));

    // The agent starts now.
    let mut w = PlegWatch::new(&cg, "kubepods").unwrap();
    let started: Vec<_> = w
        .events
        .iter()
        .filter(|e| e.kind() == ContainerStarted)
        .collect();
    assert_eq!(started.len(), 1, "{:#?}", w.events);
    assert_eq!(started[0].container_id(), Some(cid(1)));
    assert!(
        matches!(started[0].event, PlegEvent::ContainerStarted { pid, ref comm, .. } if pid == before.id() && comm.to_string().starts_with("observer-work")),
        "{:?}",
        started[0]
    );
    let rec = w.pipeline.pleg().model().container(&cid(1)).unwrap();
    assert_eq!(rec.init_pid, Some(before.id()));
    assert_eq!(
        w.pipeline.pleg().model().container(&cid(2)).unwrap().state,
        observer::pleg::ContainerState::Unknown
    );

    // The kernel then reports its death exactly.
    before.kill().unwrap();
    before.wait().unwrap();
    let events = w
        .until(WAIT, |ev| ev.iter().any(|e| e.kind() == ContainerDied))
        .await
        .unwrap();
    let died = events.iter().find(|e| e.kind() == ContainerDied).unwrap();
    assert_eq!(died.container_id(), Some(cid(1)));
    assert_eq!(
        died.exit().unwrap().status.and_then(|s| s.signal()),
        Some(9)
    );
}

/// A container dies while the ring buffer is full and its exit record is lost: the PLEG resyncs
/// from the cgroup tree and reports the death as ContainerStatusUnknown, never a stale Running.
#[tokio::test]
async fn lost_records_resync_and_the_death_is_still_reported() {
    if !require_kernel() {
        return;
    }
    let (driver, qos) = (CgroupDriver::Systemd, Qos::Burstable);
    let mut cg = TestCgroup::new("pleg-lost").unwrap();
    let pod = uid(4);
    let cid = |k: u32| cid(300 + k);
    cg.mkdir(&pod_cgroup_path(driver, qos, &pod)).unwrap();
    let victim = cg
        .mkdir(&container_cgroup_path(
            driver,
            qos,
            &pod,
            Runtime::Containerd,
            &cid(1),
        ))
        .unwrap();
    let storm = cg
        .mkdir(&container_cgroup_path(
            driver,
            qos,
            &pod,
            Runtime::Containerd,
            &cid(2),
        ))
        .unwrap();
    let mut sleeper = cg.spawn_in(&victim, &workload(), &["sleep", "60"]).unwrap();
    assert!(eventually(WAIT, || comm_of(sleeper.id()).starts_with("observer-work")));
    let mut w = PlegWatch::with(
        &cg,
        "kubepods.slice",
        ProbeOptions {
            ring_buffer_bytes: Some(4096),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(
        of(&w.events, cid(1))
            .iter()
            .any(|e| e.kind() == ContainerStarted),
        "initial sync: {:#?}",
        w.events
    );
    // Nobody reads: a storm fills the ring, then the sleeper dies, its exit record lost.
    assert!(cg
        .spawn_in(&storm, &workload(), &["spin", "1000"])
        .unwrap()
        .wait()
        .unwrap()
        .success());
    sleeper.kill().unwrap();
    sleeper.wait().unwrap();
    assert!(w.pipeline.kernel_counters().unwrap().ringbuf_drops > 0);

    let events = w
        .until(WAIT, |ev| {
            of(ev, cid(1)).iter().any(|e| e.kind() == ContainerDied)
        })
        .await
        .unwrap()
        .to_vec();
    let died = of(&events, cid(1))
        .into_iter()
        .find(|e| e.kind() == ContainerDied)
        .unwrap()
        .exit()
        .unwrap()
        .clone();
    assert_eq!(
        (died.reason, died.exit_code(), died.status),
        (ExitReason::Unknown, 137, None),
        "{died:?}"
    );
    let stats = w.pipeline.stats().pleg;
    assert!(stats.lost_records > 0 && stats.resyncs >= 2, "{stats:?}");
    assert_eq!(
        w.pipeline.pleg().model().container(&cid(1)).unwrap().state,
        observer::pleg::ContainerState::Exited
    );
}
