//! Every container shape kubelet creates, end to end against the real containerd and runc, with the
//! whole agent watching: each CRI pid namespace mode (the init found by the kernel and checked
//! against the runtime's pid), exec sessions and children that are not the init, init containers,
//! a native sidecar, restarts in place, and a pod-level memory limit whose OOM victim is in a
//! sibling of the allocating container.
#![allow(unused_crate_dependencies)] // a test/bench/bin target sees its package's whole dependency list
use anyhow::Result;
use observer::{
    pleg::{ExitReason, PlegEvent, PlegEventType, PodLifecycleEvent},
    reconcile::{ContainerPhase, OomScope, ReconcileStats, Source},
    status::conditions::describe_kill,
};
use observer_tests::{
    agent::{cid, has, kinds, AgentEnv, WAIT},
    eventually_async, ContainerSpec, PidMode, PodSpec, Qos,
};

/// Waits for a file the test creates in the container (through /proc/<pid>/root), then runs `then`.
fn after_go(then: &str) -> String {
    format!("while [ ! -e /tmp/go ]; do sleep 0.05; done; {then}")
}

fn go(pid: u32) {
    std::fs::write(format!("/proc/{pid}/root/tmp/go"), "")
        .expect("create /tmp/go in the container");
}

/// `NSpid` of a process: its pid in each namespace from the node's outward in.
fn nspid(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .map(|v| {
            v.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

fn pid_ns(pid: u32) -> std::path::PathBuf {
    std::fs::read_link(format!("/proc/{pid}/ns/pid")).expect("pid namespace link")
}

/// The init the kernel reported for `id` (its ContainerStarted), checked against the runtime's.
async fn kernel_init(env: &mut AgentEnv, id: &str) -> u32 {
    let evs = env
        .pleg_until(id, has(PlegEventType::ContainerStarted))
        .await;
    let pid = evs
        .iter()
        .find_map(|e| match e.event {
            PlegEvent::ContainerStarted { pid, .. } => Some(pid),
            _ => None,
        })
        .expect("ContainerStarted");
    let runtime = env.ctrd.container_pid(id).await.expect("runtime pid");
    assert_eq!(pid, runtime, "the kernel's init is the runtime's init");
    pid
}

fn died(evs: &[PodLifecycleEvent]) -> &observer::pleg::ContainerExit {
    evs.iter()
        .find_map(PodLifecycleEvent::exit)
        .expect("ContainerDied")
}

/// The reconciler's cross-check of the kernel's inits against the runtime's ran, and agreed.
async fn inits_agree(env: &AgentEnv, at_least: u64) {
    let s = env.agent.reconcile.stats();
    assert!(
        eventually_async(WAIT, || ReconcileStats::get(&s.init_checks) >= at_least).await,
        "only {} init checks",
        ReconcileStats::get(&s.init_checks)
    );
    assert_eq!(ReconcileStats::get(&s.init_disagreements), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_pod_pid_namespace_finds_each_init() -> Result<()> {
    let Some(mut env) = AgentEnv::start().await else {
        return Ok(());
    };
    let mut pod = env
        .ctrd
        .run_sandbox(&PodSpec::new("shared").pid(PidMode::Pod))
        .await?;
    let a = env
        .ctrd
        .add_container(&mut pod, ContainerSpec::new("a"))
        .await?;
    let b = env
        .ctrd
        .add_container(&mut pod, ContainerSpec::sh("b", &after_go("exit 4")))
        .await?;
    let pa = kernel_init(&mut env, &a).await;
    let pb = kernel_init(&mut env, &b).await;
    // The shape: both in the pod's namespace, neither its pid 1 (the pause process is).
    assert_eq!(pid_ns(pa), pid_ns(pb));
    for p in [pa, pb] {
        let ns = nspid(p);
        assert!(ns.len() == 2 && ns[1] != 1, "{p}: NSpid {ns:?}");
    }
    // An exec session in the shared namespace is not an init and does not end anything.
    let (code, _) = env
        .ctrd
        .exec_sync(&a, &["sh", "-c", "exit 9"], WAIT)
        .await?;
    assert_eq!(code, 9);
    // Checked while both run: containerd forgets a dead container's pid.
    inits_agree(&env, 2).await;
    go(pb);
    let evs = env.pleg_until(&b, has(PlegEventType::ContainerDied)).await;
    let d = died(&evs);
    assert_eq!(
        (d.exit_code(), d.pid, d.reason),
        (4, Some(pb), ExitReason::Error)
    );
    let v = env
        .container(&pod.uid, &b, |c| {
            c.phase == ContainerPhase::Exited && !c.name.is_empty()
        })
        .await;
    assert_eq!(
        (v.exit_code, v.reason.as_deref(), v.exit_source),
        (Some(4), Some("Error"), Some(Source::Kernel))
    );
    let va = env
        .container(&pod.uid, &a, |c| c.phase == ContainerPhase::Running)
        .await;
    assert_eq!(va.init_pid, Some(pa));
    assert!(
        !env.seen
            .iter()
            .any(|e| e.container_id() == Some(cid(&a)) && e.kind() == PlegEventType::ContainerDied),
        "the exec session in a was taken for its death"
    );
    env.assert_no_misses();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_pid_namespace_finds_the_init() -> Result<()> {
    let Some(mut env) = AgentEnv::start().await else {
        return Ok(());
    };
    let pod = env
        .ctrd
        .run_pod(
            PodSpec::new("hostpid")
                .pid(PidMode::Node)
                .container(ContainerSpec::sh("app", &after_go("exit 7"))),
        )
        .await?;
    let id = pod.container_id("app").to_string();
    let pid = kernel_init(&mut env, &id).await;
    assert_eq!(nspid(pid).len(), 1, "in the node's namespace");
    inits_agree(&env, 1).await;
    go(pid);
    let evs = env.pleg_until(&id, has(PlegEventType::ContainerDied)).await;
    assert_eq!((died(&evs).exit_code(), died(&evs).pid), (7, Some(pid)));
    env.assert_no_misses();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ephemeral_container_in_its_targets_namespace() -> Result<()> {
    let Some(mut env) = AgentEnv::start().await else {
        return Ok(());
    };
    let mut pod = env
        .ctrd
        .run_pod(PodSpec::new("debugged").container(ContainerSpec::new("main")))
        .await?;
    let main = pod.container_id("main").to_string();
    let pm = kernel_init(&mut env, &main).await;
    // `kubectl debug --target=main`: the ephemeral container joins main's pid namespace.
    let dbg = env
        .ctrd
        .add_container(
            &mut pod,
            ContainerSpec::sh("debugger", &after_go("exit 5")).target(&main),
        )
        .await?;
    let pd = kernel_init(&mut env, &dbg).await;
    assert_eq!(
        pid_ns(pd),
        pid_ns(pm),
        "the debugger shares main's namespace"
    );
    assert_ne!(nspid(pd).last(), Some(&1), "main's init is pid 1 there");
    inits_agree(&env, 2).await;
    go(pd);
    let evs = env
        .pleg_until(&dbg, has(PlegEventType::ContainerDied))
        .await;
    assert_eq!((died(&evs).exit_code(), died(&evs).pid), (5, Some(pd)));
    // main lives on.
    env.container(&pod.uid, &main, |c| c.phase == ContainerPhase::Running)
        .await;
    env.assert_no_misses();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_sessions_and_children_are_never_the_init() -> Result<()> {
    let Some(mut env) = AgentEnv::start().await else {
        return Ok(());
    };
    // The init leaves a child running in the background, then waits.
    let pod = env
        .ctrd
        .run_pod(
            PodSpec::new("probed")
                .container(ContainerSpec::sh("app", &after_go("exit 0")).env("X", "1")),
        )
        .await?;
    let id = pod.container_id("app").to_string();
    let init = kernel_init(&mut env, &id).await;
    // kubelet's exec probes and `kubectl exec` go through ExecSync: `runc exec` in the container.
    for cmd in [
        &["sh", "-c", "exit 3"][..],
        &["true"],
        &["sh", "-c", "sleep 0.2 & exit 0"],
    ] {
        env.ctrd.exec_sync(&id, cmd, WAIT).await?;
    }
    let v = env
        .container(&pod.uid, &id, |c| c.phase == ContainerPhase::Running)
        .await;
    assert_eq!(v.init_pid, Some(init));
    assert!(
        !env.seen
            .iter()
            .any(|e| e.container_id() == Some(cid(&id)) && e.kind() == PlegEventType::ContainerDied),
        "an exec session's exit was taken for the container's"
    );
    go(init);
    let evs = env.pleg_until(&id, has(PlegEventType::ContainerDied)).await;
    assert_eq!(
        (died(&evs).exit_code(), died(&evs).pid, died(&evs).reason),
        (0, Some(init), ExitReason::Completed)
    );
    env.assert_no_misses();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_containers_one_after_another_then_the_main_container() -> Result<()> {
    let Some(mut env) = AgentEnv::start().await else {
        return Ok(());
    };
    let mut pod = env.ctrd.run_sandbox(&PodSpec::new("with-inits")).await?;
    // kubelet creates each init container once the one before it exited 0.
    let mut inits = Vec::new();
    for name in ["init-1", "init-2"] {
        let id = env
            .ctrd
            .add_container(&mut pod, ContainerSpec::sh(name, "exit 0"))
            .await?;
        let evs = env.pleg_until(&id, has(PlegEventType::ContainerDied)).await;
        assert_eq!(
            kinds(&evs),
            [
                PlegEventType::ContainerChanged,
                PlegEventType::ContainerStarted,
                PlegEventType::ContainerDied
            ]
        );
        assert_eq!(died(&evs).reason, ExitReason::Completed);
        env.ctrd.wait_exited(&id, WAIT).await?;
        inits.push(id);
    }
    let main = env
        .ctrd
        .add_container(&mut pod, ContainerSpec::new("main"))
        .await?;
    kernel_init(&mut env, &main).await;
    let view = env
        .pod_until(&pod.uid, |p| {
            p.containers.len() == 3 && p.containers.iter().all(|c| !c.name.is_empty())
        })
        .await;
    for id in &inits {
        let c = view.containers.iter().find(|c| c.id == cid(id)).unwrap();
        assert_eq!(
            (c.phase, c.exit_code, c.reason.as_deref()),
            (ContainerPhase::Exited, Some(0), Some("Completed"))
        );
    }
    let m = view.containers.iter().find(|c| c.id == cid(&main)).unwrap();
    assert_eq!(m.phase, ContainerPhase::Running);
    assert_eq!(observer::present::view_status(&view), "Running");
    env.assert_no_misses();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_sidecar_keeps_running_and_restarts_beside_the_main_container() -> Result<()> {
    let Some(mut env) = AgentEnv::start().await else {
        return Ok(());
    };
    let mut pod = env.ctrd.run_sandbox(&PodSpec::new("sidecar")).await?;
    // An init container with restartPolicy Always: started first, not awaited.
    let side = env
        .ctrd
        .add_container(&mut pod, ContainerSpec::new("proxy"))
        .await?;
    let ps = kernel_init(&mut env, &side).await;
    let main = env
        .ctrd
        .add_container(&mut pod, ContainerSpec::new("app"))
        .await?;
    kernel_init(&mut env, &main).await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(ps as i32),
        nix::sys::signal::Signal::SIGKILL,
    )?;
    let evs = env
        .pleg_until(&side, has(PlegEventType::ContainerDied))
        .await;
    assert_eq!(died(&evs).exit_code(), 137);
    env.ctrd.wait_exited(&side, WAIT).await?;
    // kubelet restarts the sidecar in place while the main container runs on.
    let side2 = env
        .ctrd
        .add_container(&mut pod, ContainerSpec::new("proxy").restart_count(1))
        .await?;
    kernel_init(&mut env, &side2).await;
    let view = env
        .pod_until(&pod.uid, |p| {
            p.current()
                .filter(|c| c.phase == ContainerPhase::Running)
                .count()
                == 2
                && p.containers
                    .iter()
                    .any(|c| c.id == cid(&side2) && c.restart_count == 1)
        })
        .await;
    assert_eq!((view.ready(), view.restarts()), ((2, 2), 1));
    let old = view.containers.iter().find(|c| c.id == cid(&side)).unwrap();
    assert_eq!((old.exit_code, old.signal), (Some(137), Some(9)));
    env.assert_no_misses();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarts_in_place_count_attempts_and_keep_the_last_state() -> Result<()> {
    let Some(mut env) = AgentEnv::start().await else {
        return Ok(());
    };
    let mut pod = env
        .ctrd
        .run_sandbox(&PodSpec::new("crashy").qos(Qos::BestEffort))
        .await?;
    let mut ids = Vec::new();
    for (attempt, code) in [(0u32, 1), (1, 2)] {
        let id = env
            .ctrd
            .add_container(
                &mut pod,
                ContainerSpec::sh("app", &format!("exit {code}")).restart_count(attempt),
            )
            .await?;
        env.pleg_until(&id, has(PlegEventType::ContainerDied)).await;
        env.ctrd.wait_exited(&id, WAIT).await?;
        ids.push(id);
    }
    let last = env
        .ctrd
        .add_container(&mut pod, ContainerSpec::new("app").restart_count(2))
        .await?;
    kernel_init(&mut env, &last).await;
    let view = env
        .pod_until(&pod.uid, |p| {
            p.current()
                .any(|c| c.id == cid(&last) && c.phase == ContainerPhase::Running)
        })
        .await;
    assert_eq!(view.restarts(), 2);
    let prev = view.last_terminated("app").expect("a last state");
    assert_eq!(
        (prev.id, prev.exit_code, prev.reason.as_deref()),
        (cid(&ids[1]), Some(2), Some("Error"))
    );
    env.assert_no_misses();
    Ok(())
}

/// A pod-level memory limit and no container limit: the allocating process is in one container,
/// the OOM killer's victim (the highest score) in its sibling. The kill is the victim's container's;
/// the allocating container and the cgroup whose limit was hit are named beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_level_limit_kills_a_sibling_of_the_allocating_container() -> Result<()> {
    let Some(mut env) = AgentEnv::start().await else {
        return Ok(());
    };
    let mut pod = env.ctrd.run_sandbox(&PodSpec::new("pod-limit")).await?;
    env.ctrd.limit_pod_memory(&pod, 128 << 20)?;
    // The holder's init keeps 48 MiB (twice that while the shell reads it in; the loop keeps the
    // shell from exec'ing its last command) and offers itself to the OOM killer. The grower's
    // child then grows without end (`tail` of a file with no newline); when the pod's 128 MiB are
    // reached, the holder's score is the highest.
    let holder = env
        .ctrd
        .add_container(
            &mut pod,
            ContainerSpec::sh(
                "holder",
                "echo 1000 > /proc/self/oom_score_adj; x=$(head -c 48m /dev/zero | tr '\\0' a); touch /tmp/held; while :; do sleep 3600; done",
            ),
        )
        .await?;
    let grower = env
        .ctrd
        .add_container(
            &mut pod,
            ContainerSpec::sh("grower", &after_go("(tail /dev/zero); sleep 3600")),
        )
        .await?;
    let ph = kernel_init(&mut env, &holder).await;
    let pg = kernel_init(&mut env, &grower).await;
    assert!(
        eventually_async(WAIT, || std::path::Path::new(&format!(
            "/proc/{ph}/root/tmp/held"
        ))
        .exists())
        .await,
        "the holder never held its memory"
    );
    go(pg);
    // The kernel signals the victim before it marks it: the holder, woken on the other CPU or
    // preempting the grower, may exit before its kill is read. Both come, in either order.
    let evs = env
        .pleg_until(&holder, |ks| {
            ks.contains(&PlegEventType::ContainerDied) && ks.contains(&PlegEventType::OomKill)
        })
        .await;
    let (kill, trigger) = evs
        .iter()
        .find_map(|e| match &e.event {
            PlegEvent::OomKill { kill, trigger, .. } => Some((kill.clone(), *trigger)),
            _ => None,
        })
        .unwrap_or_else(|| panic!("an OOM kill in the holder, among: {evs:#?}"));
    assert_eq!(kill.victim.tgid, ph, "the holder's init was the victim");
    assert_eq!(
        trigger,
        Some(cid(&grower)),
        "the allocation was the grower's"
    );
    // Read first, the death knows its kill; read after, it goes out as the SIGKILL it was, and
    // the kill corrects the reconciled view (OOMKilled, below).
    let kill_first = evs.iter().position(|e| e.kind() == PlegEventType::OomKill)
        < evs
            .iter()
            .position(|e| e.kind() == PlegEventType::ContainerDied);
    assert_eq!(
        (died(&evs).reason, died(&evs).exit_code()),
        if kill_first {
            (ExitReason::OomKilled, 137)
        } else {
            (ExitReason::Error, 137)
        }
    );
    // The reconciled evidence names the pod's cgroup (from the kernel log) and its limit.
    let v = env
        .container(&pod.uid, &holder, |c| {
            c.phase == ContainerPhase::Exited
                && c.last_oom.as_ref().is_some_and(|o| o.oom_cgroup.is_some())
        })
        .await;
    let o = v.last_oom.clone().unwrap();
    let o_time = o.time;
    assert_eq!(o.oom_cgroup.as_deref(), Some(pod.cgroup_parent.as_str()));
    assert_eq!(o.limit_bytes, Some(128 << 20));
    assert_eq!(
        (o.init, o.trigger_container),
        (Some(true), Some(cid(&grower)))
    );
    assert_eq!(v.reason.as_deref(), Some("OOMKilled"));
    // The kernel's report names the pod's limit as the scope, and the sentence of the Event and
    // the OOMKilled condition says so: the limit, what filled it, the victim and the trigger.
    assert_eq!(o.scope, OomScope::Pod, "{o:?}");
    let report = o.report.as_deref().expect("the kill's report");
    assert_eq!(report.limit_kb(), Some(128 << 10));
    assert!(report.tasks.iter().any(|t| t.pid == ph), "{report:?}");
    let sentence = describe_kill(&o, Some(&v), None);
    assert!(
        sentence.starts_with(
            "the pod hit its pod-level 128.0 MiB limit (all its containers together): anon "
        ),
        "{sentence}"
    );
    assert!(
        sentence.contains("in container holder was OOM-killed")
            && sentence.contains(&format!("in container {}", &cid(&grower).as_str()[..12])),
        "{sentence}"
    );
    // The kill took the holder alone, and the grower runs on. Its `tail` grows on and may meet
    // the limit again once the holder's memory is free (CI saw it within the test): that later
    // kill is of the grower's child, never of its init.
    assert!(
        report.group_cgroup.is_none() && report.members.is_empty(),
        "{report:?}"
    );
    let grower_view = env
        .container(&pod.uid, &grower, |c| c.phase == ContainerPhase::Running)
        .await;
    assert!(
        grower_view
            .last_oom
            .as_ref()
            .is_none_or(|o| o.init == Some(false) && o.pid != pg && o.time > o_time),
        "{:?}",
        grower_view.last_oom
    );
    env.assert_no_misses();
    Ok(())
}

/// An init that exec's another program at once and is then OOM-killed: the death names the
/// program that died, as the kill does (not the shell it started as, nor the runtime's helper).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_init_that_execs_is_named_by_the_program_that_died() -> Result<()> {
    let Some(mut env) = AgentEnv::start().await else {
        return Ok(());
    };
    let mut pod = env.ctrd.run_sandbox(&PodSpec::new("exec-oom")).await?;
    let id = env
        .ctrd
        .add_container(
            &mut pod,
            ContainerSpec::sh("leak", "exec tail /dev/zero").memory_limit_mib(32),
        )
        .await?;
    let evs = env.pleg_until(&id, has(PlegEventType::ContainerDied)).await;
    let kill = evs
        .iter()
        .find_map(|e| match &e.event {
            PlegEvent::OomKill { kill, .. } => Some(kill.clone()),
            _ => None,
        })
        .expect("an OOM kill");
    assert_eq!(kill.victim_comm.as_str(), "tail", "the kill's victim");
    let d = died(&evs);
    assert_eq!(d.reason, ExitReason::OomKilled);
    assert_eq!(d.pid, Some(kill.victim.tgid), "the init was the victim");
    assert_eq!(
        d.comm.map(|c| c.to_string()).as_deref(),
        Some("tail"),
        "the death names the program that died"
    );
    Ok(())
}
