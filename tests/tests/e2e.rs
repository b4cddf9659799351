//! End to end against a real containerd and runc: pods created through CRI as kubelet creates
//! them, the kernel probes and PLEG watching, the reconciler merging both. Each test asserts the
//! PLEG events and the reconciled state.
#![allow(unused_crate_dependencies)] // a test/bench/bin target sees its package's whole dependency list
use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::Pod;
use observer::{
    pleg::{ExitReason, PlegEventType},
    reconcile::{ContainerPhase, OomScope, ReconcileStats, ScopeUnknown, Source},
    status::conditions::describe_kill,
};
use observer_tests::{
    agent::{has, kinds, AgentEnv, WAIT},
    eventually_async, ContainerSpec, PodSpec, Qos, StopSignal,
};

/// A subshell that allocates past a 32 MiB limit. It raises its own oom_score_adj (its children
/// inherit it), so that when the kernel needs a second victim before the first one's memory is
/// reaped, it takes one of these and not the container's init.
macro_rules! child_hog {
    () => {
        "echo 1000 > /proc/self/oom_score_adj; x=$(head -c 64m /dev/zero | tr '\\0' a)"
    };
}

/// `observer status -o account` against the containerd at `endpoint`, as a user runs it.
async fn status_account(endpoint: &str) -> Result<serde_json::Value> {
    let out = tokio::process::Command::new(observer_tests::observer_bin())
        .args(["status", "-o", "account", "--cri-endpoint", endpoint])
        .output()
        .await?;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    // A one-shot reader's end is a normal one: its tasks stop with it, and ERROR means an error.
    assert!(
        !err.contains("ERROR"),
        "a successful status said an error:\n{err}"
    );
    Ok(serde_json::from_slice(&out.stdout)?)
}

async fn run_one(env: &AgentEnv, name: &str, spec: ContainerSpec) -> Result<(String, String)> {
    let pod = env
        .ctrd
        .run_pod(PodSpec::new(name).qos(Qos::Burstable).container(spec))
        .await?;
    let cid = pod.containers[0].id.clone();
    Ok((pod.uid, cid))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_0_is_completed() -> Result<()> {
    let Some(mut env) = AgentEnv::start().await else {
        return Ok(());
    };
    let (uid, cid) = run_one(&env, "exit0", ContainerSpec::sh("app", "exit 0")).await?;
    let evs = env
        .pleg_until(&cid, has(PlegEventType::ContainerDied))
        .await;
    assert_eq!(
        kinds(&evs),
        [
            PlegEventType::ContainerChanged,
            PlegEventType::ContainerStarted,
            PlegEventType::ContainerDied
        ]
    );
    let died = evs[2].exit().unwrap();
    assert_eq!((died.reason, died.exit_code()), (ExitReason::Completed, 0));
    let v = env
        .container(&uid, &cid, |c| {
            c.phase == ContainerPhase::Exited && c.name == "app"
        })
        .await;
    assert_eq!(
        (v.exit_code, v.reason.as_deref(), v.restart_count),
        (Some(0), Some("Completed"), 0)
    );
    assert!(v.kernel_seen && v.init_pid.is_some());
    env.assert_no_misses();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_3_is_error_code_3() -> Result<()> {
    let Some(mut env) = AgentEnv::start().await else {
        return Ok(());
    };
    let (uid, cid) = run_one(&env, "exit3", ContainerSpec::sh("app", "exit 3")).await?;
    let evs = env
        .pleg_until(&cid, has(PlegEventType::ContainerDied))
        .await;
    let died = evs.last().unwrap().exit().unwrap();
    assert_eq!(
        (
            died.reason,
            died.exit_code(),
            died.status.and_then(|s| s.signal())
        ),
        (ExitReason::Error, 3, None)
    );
    let v = env
        .container(&uid, &cid, |c| {
            c.phase == ContainerPhase::Exited && !c.name.is_empty()
        })
        .await;
    assert_eq!(
        (
            v.exit_code,
            v.reason.as_deref(),
            v.runtime_reason.as_deref()
        ),
        (Some(3), Some("Error"), None),
        "runtime and kernel agree"
    );
    let pod = env.pod(&uid).unwrap();
    assert_eq!(
        (
            pod.namespace.as_str(),
            pod.name.as_str(),
            observer::present::view_status(&pod).as_str()
        ),
        ("default", "exit3", "Error")
    );
    env.assert_no_misses();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_is_137_signal_9() -> Result<()> {
    let Some(mut env) = AgentEnv::start().await else {
        return Ok(());
    };
    let (uid, cid) = run_one(&env, "killed", ContainerSpec::new("app")).await?;
    env.pleg_until(&cid, has(PlegEventType::ContainerStarted))
        .await;
    let pid = env.ctrd.container_pid(&cid).await?;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )?;
    let evs = env
        .pleg_until(&cid, has(PlegEventType::ContainerDied))
        .await;
    let died = evs.last().unwrap().exit().unwrap();
    assert_eq!(
        (
            died.exit_code(),
            died.status.and_then(|s| s.signal()),
            died.pid
        ),
        (137, Some(9), Some(pid))
    );
    let v = env
        .container(&uid, &cid, |c| c.phase == ContainerPhase::Exited)
        .await;
    assert_eq!(
        (v.exit_code, v.signal, v.reason.as_deref()),
        (Some(137), Some(9), Some("Error"))
    );
    env.assert_no_misses();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_oom_kill_is_oomkilled_with_the_victim() -> Result<()> {
    let Some(mut env) = AgentEnv::start().await else {
        return Ok(());
    };
    // The shell itself accumulates the data, so the init is the biggest process and the victim.
    let hog = ContainerSpec::sh("hog", "x=$(head -c 64m /dev/zero | tr '\\0' a); echo ${#x}")
        .memory_limit_mib(32);
    let (uid, cid) = run_one(&env, "oom-init", hog).await?;
    let evs = env
        .pleg_until(&cid, has(PlegEventType::ContainerDied))
        .await;
    assert_eq!(
        kinds(&evs),
        [
            PlegEventType::ContainerChanged,
            PlegEventType::ContainerStarted,
            PlegEventType::OomKill,
            PlegEventType::ContainerDied
        ]
    );
    let oom = evs[2].oom().unwrap();
    let died = evs[3].exit().unwrap();
    assert_eq!(
        (died.reason, died.exit_code()),
        (ExitReason::OomKilled, 137)
    );
    assert_eq!(Some(oom.victim.tgid), died.pid, "the init was the victim");
    let v = env
        .container(&uid, &cid, |c| {
            c.phase == ContainerPhase::Exited && !c.name.is_empty()
        })
        .await;
    assert_eq!(
        (v.exit_code, v.reason.as_deref()),
        (Some(137), Some("OOMKilled"))
    );
    let ev = v.last_oom.context("OOM evidence")?;
    assert_eq!((ev.init, ev.source), (Some(true), Source::Kernel));
    assert_eq!((ev.pid, ev.comm.as_str()), (oom.victim.tgid, "sh"));
    if let Some(rss) = ev.anon_rss_kb {
        assert!(rss > 16 << 10, "anon rss {rss} kB at the kill");
    }
    assert_eq!(
        observer::present::view_status(&env.pod(&uid).unwrap()),
        "OOMKilled"
    );
    // The kernel log's report comes milliseconds after the probes: then the scope is the
    // container's own limit, and the sentence says what filled it and who held it.
    let v = env
        .container(&uid, &cid, |c| {
            c.last_oom
                .as_ref()
                .is_some_and(|o| o.scope != OomScope::Unknown(ScopeUnknown::LogNotRead))
        })
        .await;
    let ev = v.last_oom.as_ref().unwrap();
    assert_eq!(ev.scope, OomScope::Container, "{ev:?}");
    let sentence = describe_kill(ev, Some(&v), None);
    assert!(
        sentence.starts_with("container hog hit its 32.0 MiB limit: anon "),
        "{sentence}"
    );
    assert!(
        sentence.contains("(sh "),
        "the top consumer is named: {sentence}"
    );
    env.assert_no_misses();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_oom_kill_leaves_the_container_running_then_completed() -> Result<()> {
    let Some(mut env) = AgentEnv::start().await else {
        return Ok(());
    };
    // A subshell (a child) is the victim; the init waits for a file, then exits 0.
    let script = concat!(
        "(",
        child_hog!(),
        "); while [ ! -e /tmp/go ]; do sleep 0.05; done; exit 0"
    );
    let (uid, cid) = run_one(
        &env,
        "oom-child",
        ContainerSpec::sh("app", script).memory_limit_mib(32),
    )
    .await?;
    let evs = env.pleg_until(&cid, has(PlegEventType::OomKill)).await;
    assert_eq!(
        kinds(&evs),
        [
            PlegEventType::ContainerChanged,
            PlegEventType::ContainerStarted,
            PlegEventType::OomKill
        ]
    );
    // The memory cgroup's killer may take a second victim before the first one's memory is
    // reaped, later than the quiet period on a loaded machine: the view and the PLEG stream
    // must end up agreeing on every kill, whichever reports it first.
    let mut victims = env.oom_victims(&cid, Duration::from_millis(300)).await;
    let mut v = None;
    for _ in 0..10 {
        let n = victims.len() as u32;
        let seen = env
            .container(&uid, &cid, |c| c.oom_kills >= n && !c.name.is_empty())
            .await;
        if seen.oom_kills == n {
            v = Some(seen);
            break;
        }
        victims = env.oom_victims(&cid, Duration::from_millis(300)).await;
    }
    let v =
        v.unwrap_or_else(|| panic!("the view's OOM kills never matched the PLEG's {victims:?}"));
    let victim = victims.last().unwrap().0;
    assert_eq!(
        v.phase,
        ContainerPhase::Running,
        "the container survives its child's OOM kill"
    );
    assert_eq!(
        v.last_oom.as_ref().map(|o| (o.pid, o.init)),
        Some((victim, Some(false)))
    );
    assert!(
        victims.iter().all(|(pid, _)| Some(*pid) != v.init_pid),
        "the init was not a victim: {victims:?}"
    );

    // Let the init exit 0: containerd calls that OOMKilled with exit code 0 (kubernetes#104454);
    // the truth is Completed, with the child's kill kept as evidence.
    let pid = env.ctrd.container_pid(&cid).await?;
    std::fs::write(format!("/proc/{pid}/root/tmp/go"), "")?;
    env.pleg_until(&cid, has(PlegEventType::ContainerDied))
        .await;
    let runtime = env.ctrd.wait_exited(&cid, WAIT).await?;
    // The reconciler asks the runtime again until it has caught up with the kernel.
    let v = env
        .container(&uid, &cid, |c| {
            c.phase == ContainerPhase::Exited
                && (c.runtime_reason.is_some() || runtime.reason != "OOMKilled")
        })
        .await;
    assert_eq!(
        (v.exit_code, v.reason.as_deref()),
        (Some(0), Some("Completed"))
    );
    assert_eq!(v.last_oom.as_ref().map(|o| o.pid), Some(victim));
    eprintln!(
        "containerd says {} / {} for this container",
        runtime.reason, runtime.exit_code
    );
    if runtime.reason == "OOMKilled" {
        assert_eq!(
            (v.runtime_reason.as_deref(), v.runtime_exit_code),
            (Some("OOMKilled"), Some(0)),
            "the runtime's account kept for audit"
        );
        assert!(ReconcileStats::get(&env.agent.reconcile.stats().corrected) >= 1);
    }
    env.assert_no_misses();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recreated_container_counts_a_restart_and_removal_is_reported() -> Result<()> {
    let Some(mut env) = AgentEnv::start().await else {
        return Ok(());
    };
    let mut pod = env
        .ctrd
        .run_pod(
            PodSpec::new("restarts")
                .qos(Qos::BestEffort)
                .container(ContainerSpec::sh("app", "exit 1")),
        )
        .await?;
    let first = pod.containers[0].id.clone();
    env.pleg_until(&first, has(PlegEventType::ContainerDied))
        .await;
    // kubelet restarts it as attempt 1.
    let second = env
        .ctrd
        .add_container(&mut pod, ContainerSpec::new("app").restart_count(1))
        .await?;
    env.pleg_until(&second, has(PlegEventType::ContainerStarted))
        .await;
    let v = env
        .container(&pod.uid, &second, |c| {
            c.phase == ContainerPhase::Running && c.restart_count == 1
        })
        .await;
    assert_eq!(v.name, "app");
    let view = env.pod(&pod.uid).unwrap();
    assert_eq!(
        (
            view.restarts(),
            view.ready(),
            observer::present::view_status(&view).as_str()
        ),
        (1, (1, 1), "Running")
    );

    // The kernel reported the dead instance's cgroup removed when the runtime deleted its task,
    // right after the death.
    let evs = env
        .pleg_until(&first, has(PlegEventType::ContainerRemoved))
        .await;
    assert_eq!(
        kinds(&evs),
        [
            PlegEventType::ContainerChanged,
            PlegEventType::ContainerStarted,
            PlegEventType::ContainerDied,
            PlegEventType::ContainerRemoved
        ]
    );
    assert!(
        env.pod(&pod.uid)
            .unwrap()
            .containers
            .iter()
            .any(|c| c.id.as_str() == first),
        "the runtime still has its record"
    );
    // kubelet garbage-collects the record. containerd 1.6 has no event for that (no
    // GetContainerEvents): the relist, periodic in the agent and asked for here, drops it.
    // (kubelet removes only what the runtime reports exited; the kernel is faster than that.)
    env.ctrd.wait_exited(&first, WAIT).await?;
    env.ctrd.remove_container(&first).await?;
    env.agent.reconcile.request_relist();
    env.pod_until(&pod.uid, |p| {
        p.containers.iter().all(|c| c.id.as_str() != first)
    })
    .await;
    env.assert_no_misses();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_and_removed_sandbox_is_gone() -> Result<()> {
    let Some(mut env) = AgentEnv::start().await else {
        return Ok(());
    };
    let pod = env
        .ctrd
        .run_pod(PodSpec::new("gone").container(ContainerSpec::new("app")))
        .await?;
    let cid = pod.containers[0].id.clone();
    env.pleg_until(&cid, has(PlegEventType::ContainerStarted))
        .await;
    env.container(&pod.uid, &cid, |c| {
        c.phase == ContainerPhase::Running && !c.name.is_empty()
    })
    .await;
    env.ctrd.stop_pod(&pod).await?;
    let evs = env
        .pleg_until(&cid, has(PlegEventType::ContainerDied))
        .await;
    assert_eq!(
        evs.last()
            .unwrap()
            .exit()
            .unwrap()
            .status
            .and_then(|s| s.signal()),
        Some(9),
        "StopPodSandbox kills"
    );
    env.ctrd.remove_pod(&pod).await?;
    env.pleg_until(&cid, has(PlegEventType::ContainerRemoved))
        .await;
    let u = observer_tests::agent::uid(&pod.uid);
    let gone = env
        .agent
        .reconcile
        .wait_for(WAIT, |v| !v.contains_key(&u))
        .await;
    assert!(gone, "pod still in the view: {:#?}", env.pod(&pod.uid));
    env.assert_no_misses();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containerd_restart_mid_test_converges_without_missing_the_death() -> Result<()> {
    let Some(mut env) = AgentEnv::start().await else {
        return Ok(());
    };
    let (uid, cid) = run_one(
        &env,
        "restart",
        ContainerSpec::sh("app", "while [ ! -e /tmp/go ]; do sleep 0.05; done; exit 5"),
    )
    .await?;
    env.pleg_until(&cid, has(PlegEventType::ContainerStarted))
        .await;
    env.container(&uid, &cid, |c| {
        c.phase == ContainerPhase::Running && !c.name.is_empty()
    })
    .await;
    let pid = env.ctrd.container_pid(&cid).await?;

    // containerd goes away; the container dies meanwhile.
    env.ctrd.stop(StopSignal::Kill).await?;
    std::fs::write(format!("/proc/{pid}/root/tmp/go"), "")?;
    let evs = env
        .pleg_until(&cid, has(PlegEventType::ContainerDied))
        .await;
    assert_eq!(evs.last().unwrap().exit().unwrap().exit_code(), 5);
    // The view shows the death from the kernel alone, with the runtime down.
    let v = env
        .container(&uid, &cid, |c| c.phase == ContainerPhase::Exited)
        .await;
    assert_eq!(
        (v.exit_code, v.exit_source),
        (Some(5), Some(Source::Kernel))
    );
    // The agent noticed the runtime went away (the death above was seen without it).
    let cri = env.agent.runtime.clone();
    assert!(
        eventually_async(WAIT, || !cri.is_connected()).await,
        "the agent never noticed containerd was gone"
    );

    let before = env.agent.runtime.reconnects();
    env.ctrd.resume().await?;
    assert!(
        eventually_async(WAIT, || cri.reconnects() > before && cri.is_connected()).await,
        "agent never reconnected"
    );
    // Converged: the runtime agrees on the exit, and nothing had to be repaired.
    let v = env
        .container(&uid, &cid, |c| {
            c.phase == ContainerPhase::Exited
                && c.exit_code == Some(5)
                && c.reason.as_deref() == Some("Error")
        })
        .await;
    assert_eq!(
        v.runtime_exit_code, None,
        "runtime and kernel agree after the restart"
    );
    let runtime = env.ctrd.container_status(&cid).await?;
    assert_eq!(runtime.exit_code, 5);
    // The relist that follows the reconnect (the kernel had already given the exit, so the view
    // did not wait for it) re-reads the pod and finds nothing to repair.
    let stats = env.agent.reconcile.stats();
    assert!(
        eventually_async(WAIT, || ReconcileStats::get(&stats.relists) >= 2).await,
        "no relist after the reconnect"
    );
    assert!(env.agent.reconcile.settled(WAIT).await);
    env.assert_no_misses();
    Ok(())
}

/// `observer status` as a user runs it, against this test's containerd: pods, their state, and the
/// last OOM kill, which happened before the command started (so it comes from the kernel log).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_command_shows_pods_and_the_last_oom_kill() -> Result<()> {
    let Some(mut env) = AgentEnv::start().await else {
        return Ok(());
    };
    let bin = observer_tests::observer_bin();
    let (failed_uid, failed) = run_one(&env, "failed", ContainerSpec::sh("app", "exit 3")).await?;
    let script = concat!("(", child_hog!(), "); sleep 3600");
    let (oom_uid, oomer) = run_one(
        &env,
        "oomer",
        ContainerSpec::sh("worker", script).memory_limit_mib(32),
    )
    .await?;
    env.pleg_until(&failed, has(PlegEventType::ContainerDied))
        .await;
    env.pleg_until(&oomer, has(PlegEventType::OomKill)).await;
    let (victim, comm) = env
        .oom_victims(&oomer, Duration::from_millis(300))
        .await
        .pop()
        .unwrap();
    env.ctrd.wait_exited(&failed, WAIT).await?;

    let endpoint = env.ctrd.socket().display().to_string();
    let rows = status_account(&endpoint).await?;
    let row = |uid: &str| {
        rows.as_array()
            .unwrap()
            .iter()
            .find(|r| r["uid"] == uid)
            .cloned()
            .unwrap_or_else(|| panic!("{uid} not in {rows:#}"))
    };
    let f = row(&failed_uid);
    assert_eq!(
        (
            f["name"].as_str(),
            f["ready"].as_str(),
            f["status"].as_str()
        ),
        (Some("failed"), Some("0/1"), Some("Error")),
        "{f:#}"
    );
    assert_eq!(f["containers"][0]["exit_code"], 3);
    assert_eq!(f["containers"][0]["reason"], "Error");
    let o = row(&oom_uid);
    // Running, but whether it is ready is the pod spec's probes' to say, which `observer status`
    // without the API does not have: kubectl's READY column with the unknown shown as `?`.
    assert_eq!(
        (o["ready"].as_str(), o["status"].as_str()),
        (Some("?/1"), Some("Running")),
        "{o:#}"
    );
    let oom = &o["last_oom"];
    assert_eq!(
        (
            oom["pid"].as_u64(),
            oom["comm"].as_str(),
            oom["container"].as_str()
        ),
        (Some(u64::from(victim)), Some(comm.as_str()), Some("worker")),
        "{o:#}"
    );
    assert_eq!(oom["source"], "kernel-log", "the kill predates the command");
    // The report was read again from the kernel log by the command, as by a restarted agent.
    assert_eq!(oom["scope"], "container", "{oom:#}");
    let message = oom["message"].as_str().unwrap_or_default();
    // The last kill may be the kernel's second victim (tr), taken while the first one's memory
    // was being freed: then "anon … mapped by no process".
    assert!(
        message.starts_with("container worker hit its 32.0 MiB limit: anon "),
        "{message}"
    );
    assert!(oom["anon_rss_kb"].is_u64(), "{oom:#}");

    let table = tokio::process::Command::new(&bin)
        .args(["status", "--cri-endpoint", &endpoint])
        .output()
        .await?;
    let text = String::from_utf8_lossy(&table.stdout);
    eprintln!("{text}");
    assert!(text.starts_with("NAMESPACE"), "{text}");
    let line = text
        .lines()
        .find(|l| l.contains("oomer"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        line.contains("Running") && line.contains(&format!("{comm}[{victim}] in worker")),
        "{line}"
    );

    // The PodStatus the agent computes, as `kubectl get pod -o yaml` shows one.
    let yaml = tokio::process::Command::new(&bin)
        .args(["status", "-o", "yaml", "--cri-endpoint", &endpoint])
        .output()
        .await?;
    let text = String::from_utf8_lossy(&yaml.stdout);
    assert!(
        yaml.status.success(),
        "{}",
        String::from_utf8_lossy(&yaml.stderr)
    );
    let list: k8s_openapi::List<Pod> = serde_saphyr::from_str(&text)?;
    // `-o json` is the same object; `-n` keeps one namespace's pods.
    let json_of = |extra: &[&str]| {
        let mut args = vec!["status", "-o", "json", "--cri-endpoint", &endpoint];
        args.extend_from_slice(extra);
        let out = std::process::Command::new(&bin).args(&args).output()?;
        anyhow::ensure!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok::<_, anyhow::Error>(serde_json::from_slice::<k8s_openapi::List<Pod>>(
            &out.stdout,
        )?)
    };
    let statuses = |l: &k8s_openapi::List<Pod>, uid: &str| {
        l.items
            .iter()
            .find(|p| p.metadata.uid.as_deref() == Some(uid))
            .and_then(|p| p.status.as_ref()?.container_statuses.clone())
    };
    let json = json_of(&[])?;
    assert_eq!(
        statuses(&json, &failed_uid),
        statuses(&list, &failed_uid),
        "-o json and -o yaml differ"
    );
    let ns = list
        .items
        .iter()
        .find(|p| p.metadata.uid.as_deref() == Some(failed_uid.as_str()))
        .and_then(|p| p.metadata.namespace.clone())
        .unwrap();
    let one = json_of(&["-n", &ns])?;
    assert!(
        statuses(&one, &failed_uid).is_some(),
        "-n {ns} left out its pod"
    );
    assert!(
        one.items
            .iter()
            .all(|p| p.metadata.namespace.as_deref() == Some(ns.as_str())),
        "-n {ns} kept other namespaces"
    );
    assert!(json_of(&["-n", "observer-no-such-namespace"])?
        .items
        .is_empty());
    let pod = |uid: &str| {
        list.items
            .iter()
            .find(|p| p.metadata.uid.as_deref() == Some(uid))
            .unwrap_or_else(|| panic!("{uid} not in {text}"))
    };
    let f = pod(&failed_uid);
    let status = f.status.as_ref().unwrap();
    let cs = &status.container_statuses.as_ref().unwrap()[0];
    let term = cs.state.as_ref().and_then(|s| s.terminated.as_ref());
    assert_eq!(
        (
            cs.name.as_str(),
            term.map(|t| t.exit_code),
            term.and_then(|t| t.reason.as_deref()),
            cs.container_id.as_deref(),
        ),
        (
            "app",
            Some(3),
            Some("Error"),
            Some(format!("containerd://{failed}").as_str())
        ),
        "{text}"
    );
    // Without the API the spec is unknown, and the output says so rather than guess a phase.
    let unknown = f
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("observer.dev/unknown"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(unknown.contains("spec"), "{unknown}");
    let o = pod(&oom_uid);
    let conds = o.status.as_ref().unwrap().conditions.as_ref().unwrap();
    let oom = conds
        .iter()
        .find(|c| c.type_ == "observer.dev/OOMKilled")
        .unwrap_or_else(|| panic!("{text}"));
    assert_eq!(oom.status, "True");
    assert!(
        oom.message
            .as_deref()
            .is_some_and(|m| m.contains(&format!("{comm} (pid {victim})"))),
        "{oom:?}"
    );
    Ok(())
}

/// The merge rule never contradicts the runtime without evidence, tried as a user did: inits
/// OOM-killed (`exec tail /dev/zero` under 32 MiB) while no agent ran, read afterwards by a fresh
/// `observer status -o account`. Each container is what the evidence proves: OOMKilled/137 where
/// the runtime or the kernel's report proves the init was the victim, the runtime's account
/// otherwise; never a reason the runtime did not give without the evidence named
/// (`exit_source`), never a victim said not to be the init on no evidence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inits_oom_killed_while_no_agent_ran_are_told_as_the_evidence_proves() -> Result<()> {
    if !observer_tests::require_containerd() || !observer_tests::kernel::require_kernel() {
        return Ok(());
    }
    observer_tests::init_tracing();
    let ctrd = observer_tests::Containerd::start().await?;
    let mut pods = Vec::new();
    for n in 0..6 {
        let spec = ContainerSpec::sh("app", "exec tail /dev/zero").memory_limit_mib(32);
        let pod = ctrd
            .run_pod(
                PodSpec::new(format!("tail-{n}"))
                    .qos(Qos::Burstable)
                    .container(spec),
            )
            .await?;
        pods.push((pod.uid.clone(), pod.containers[0].id.clone()));
    }
    let mut runtime = Vec::new();
    for (_, id) in &pods {
        let s = ctrd.wait_exited(id, WAIT).await?;
        runtime.push((s.exit_code, s.reason.clone()));
    }
    let rows = status_account(&ctrd.socket().display().to_string()).await?;
    let mut told = Vec::new();
    for ((uid, _), said) in pods.iter().zip(&runtime) {
        let row = rows
            .as_array()
            .into_iter()
            .flatten()
            .find(|r| r["uid"] == uid.as_str())
            .with_context(|| format!("{uid} not in {rows:#}"))?;
        let c = &row["containers"][0];
        eprintln!("runtime {said:?}: {row:#}");
        told.push(c.clone());
        // The kill, where the kernel printed its report (at most 10 in 5 s: in a storm the
        // rest have only their `Killed process` line, which names no cgroup): tail's, and never
        // said not to be the init.
        let kill = &row["last_oom"];
        if !kill.is_null() {
            assert_eq!(kill["comm"], "tail", "{row:#}");
            assert_ne!(kill["init"], false, "{row:#}");
        }
        assert_eq!(c["exit_code"], 137, "{c:#}");
        let reason = c["reason"].as_str().unwrap_or_default();
        if reason != said.1 {
            // A verdict other than the runtime's names its evidence: the kernel log.
            assert_eq!(c["exit_source"], "kernel-log", "{c:#}");
            assert_eq!(reason, "OOMKilled", "the runtime said {said:?}: {c:#}");
        }
    }
    // The init was the victim in every one: each is OOMKilled, by the runtime's word or the
    // kernel's report.
    for c in &told {
        assert_eq!(c["reason"], "OOMKilled", "{c:#}");
    }
    Ok(())
}

/// `observer watch --pods` beside the real containerd prints the agent's memory warning and its
/// end, not only the kernel's limit records: a container fills its 64 MiB limit with 60 MiB of
/// tmpfs pages in /dev/shm (shmem: reclaim cannot take them), then removes them and stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_pods_prints_a_memory_warning_and_its_end() -> Result<()> {
    if !observer_tests::require_containerd() || !observer_tests::kernel::require_kernel() {
        return Ok(());
    }
    observer_tests::init_tracing();
    let ctrd = observer_tests::Containerd::start().await?;
    let sock = ctrd.socket().display().to_string();
    let state = tempfile::tempdir()?;
    let watch = observer_tests::process::ObserverProcess::watch_pods(&sock, state.path())?;
    let ready =
        observer_tests::eventually_async(WAIT, || watch.stderr().contains("watching pods")).await;
    assert!(ready, "watch --pods never started:\n{}", watch.stderr());
    // Two seconds for the agent to learn the new container before its pages come.
    let spec = ContainerSpec::sh(
        "app",
        "sleep 2; dd if=/dev/zero of=/dev/shm/fill bs=1M count=60; sleep 1; rm /dev/shm/fill; exec sleep 3600",
    )
    .memory_limit_mib(64);
    let pod = ctrd
        .run_pod(PodSpec::new("shm-fill").qos(Qos::Burstable).container(spec))
        .await?;
    let id = pod.containers[0].id.clone();
    let line = |event: &'static str| {
        let id = id.clone();
        move |v: &serde_json::Value| v["event"] == event && v["container_id"] == id.as_str()
    };
    let warned = watch
        .json_until(Duration::from_secs(60), line("MemoryWarning"))
        .await
        .with_context(|| {
            format!(
                "no MemoryWarning line: {:#?}\n{}",
                watch.lines(),
                watch.stderr()
            )
        })?;
    eprintln!("{warned:#}");
    let limit = 64u64 << 20;
    assert_eq!(warned["container"], "app", "{warned:#}");
    assert_eq!(warned["scope"], "container", "{warned:#}");
    assert_eq!(warned["limit_bytes"], limit, "{warned:#}");
    // Warned at 90 % of the limit unreclaimable, or earlier by a projection: past 85 % and full
    // within the horizon (a fast fill, as dd into tmpfs is on an idle machine, is projected at
    // the 86 % crossing).
    let share = warned["unreclaimable_bytes"].as_u64().unwrap_or(0) as f64 / limit as f64;
    let projected = warned["estimated"].is_string()
        && warned["time_left_seconds"]
            .as_f64()
            .is_some_and(|t| t <= observer::pressure::HORIZON.as_secs_f64());
    assert!(
        share >= observer::pressure::WARN_RATIO
            || (projected && share > observer::pressure::PROJECT_FROM),
        "{warned:#}"
    );
    let message = warned["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("shmem 5") || message.contains("shmem 6"),
        "{message}"
    );
    // The end: once the warning stood 30 s and a quiet reread found the pages gone.
    let ended = watch
        .json_until(Duration::from_secs(120), line("MemoryWarningEnded"))
        .await
        .with_context(|| {
            format!(
                "no MemoryWarningEnded line: {:#?}\n{}",
                watch.lines(),
                watch.stderr()
            )
        })?;
    eprintln!("{ended:#}");
    assert!(
        ended["stood_seconds"].as_f64().unwrap_or(0.0) >= 30.0,
        "{ended:#}"
    );
    assert!(
        (ended["unreclaimable_bytes"].as_u64().unwrap_or(u64::MAX) as f64) < 0.8 * limit as f64,
        "{ended:#}"
    );
    // Each once.
    let count = |event| {
        watch
            .lines()
            .iter()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| line(event)(v))
            .count()
    };
    assert_eq!(
        (count("MemoryWarning"), count("MemoryWarningEnded")),
        (1, 1)
    );
    Ok(())
}
