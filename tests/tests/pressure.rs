//! Memory warnings before the kill, on the real kernel: a container leaking anonymous memory is
//! warned (a `MemoryNearLimit` Event and the `MemoryPressure` condition) before its OOM kill, and
//! a container sitting at its limit with page cache or bursting well under it never is, though
//! the kernel reports its limit hits. The agent's chain runs in-process
//! (`observer_tests::stack`): real probes, reconciler and status manager, the pod's cgroups laid
//! out as kubelet and containerd do, a runtime stand-in, the API stand-in recording what the
//! agent writes. On this host (v1 memory on a hybrid layout) and in CI's cgroup v2 guest.
#![allow(unused_crate_dependencies)] // a test/bench/bin target sees its package's whole dependency list
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use observer_tests::{
    apiserver::Recorded,
    kernel::{require_kernel, workload, TestCgroup},
    stack::{AgentStack, InApi, StandInPod},
};
use serde_json::Value;

const NODE: &str = "pressure-node";
const LIMIT: u64 = 64 << 20;
/// A guest under software emulation fills memory slowly.
const WAIT: Duration = Duration::from_secs(120);
const CONDITION: &str = "observer.dev/MemoryPressure";

fn is_event(reason: &'static str) -> impl Fn(&Recorded) -> bool {
    move |r: &Recorded| {
        r.method == "POST" && r.path().ends_with("/events") && r.body["reason"] == reason
    }
}

fn condition<'a>(body: &'a Value, type_: &str) -> Option<&'a Value> {
    body["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

/// One pod, its container limited to [`LIMIT`] (`pod_level`: the pod's cgroup instead), and the
/// agent on it.
async fn pod(
    cg: &mut TestCgroup,
    name: &'static str,
    n: u32,
    pod_level: bool,
) -> Result<(StandInPod, AgentStack)> {
    let limit = (!pod_level).then_some("64Mi");
    let pod = StandInPod::new(cg, name, 0x3e, n, NODE, InApi { limit, gate: None }).await?;
    let limited = if pod_level {
        pod.container
            .rsplit_once('/')
            .map(|(p, _)| p.to_string())
            .context("the container's parent")?
    } else {
        pod.container.clone()
    };
    cg.limit_memory_of(&limited, LIMIT)?;
    let stack = pod.agent(cg, NODE).await?;
    Ok((pod, stack))
}

/// The limit hits the agent counted for the pod's container (any scope).
fn limit_hits(stack: &AgentStack, pod: &str) -> Result<f64> {
    let text = stack.metrics()?;
    Ok(text
        .lines()
        .filter(|l| {
            l.starts_with("observer_memory_limit_hits_total{")
                && l.contains(&format!("pod=\"{pod}\""))
        })
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum())
}

async fn leak_is_warned_before_its_kill(
    name: &'static str,
    n: u32,
    pod_level: bool,
    scope: &str,
) -> Result<()> {
    let mut cg = TestCgroup::new(name)?;
    let (pod, stack) = pod(&mut cg, name, n, pod_level).await?;
    // 4 MiB/s: the limit is met well before the kill (a few hits' readings apart).
    let child = cg.spawn_in(&pod.container, &workload(), &["leak", "4096"])?;
    pod.runtime.started(pod.cid, child.id());
    let _child = tokio::task::spawn_blocking(move || child.wait_with_output());
    let oom = pod
        .api
        .wait_for(WAIT, |r| {
            is_event("OOMKilled")(r) || is_event("ProcessOOMKilled")(r)
        })
        .await
        .with_context(|| format!("no OOM Event: {:#?}", pod.api.recorded()))?;
    let left = stack.status.flush(Duration::from_secs(10)).await;
    ensure!(
        left.events_pending == 0,
        "Events left unpublished: {left:?}"
    );
    let recorded = pod.api.recorded();
    let warnings: Vec<&Recorded> = recorded
        .iter()
        .filter(|r| is_event("MemoryNearLimit")(r))
        .collect();
    ensure!(
        warnings.len() == 1,
        "one MemoryNearLimit Event wanted: {:#?}",
        recorded
    );
    let w = warnings[0];
    // Told before the kill's Event: the warning's reading came from a hit before the kill.
    ensure!(
        w.seq < oom.seq,
        "the warning came after the kill: {w:#?} {oom:#?}"
    );
    let note = w.body["note"].as_str().unwrap_or_default();
    eprintln!("warning: {note}");
    ensure!(
        note.starts_with("container app is about to be OOM-killed: ")
            && note.contains(&format!("64.0 MiB {scope} limit cannot be reclaimed"))
            && note.contains("anon "),
        "{note}"
    );
    ensure!(
        w.body["regarding"]["fieldPath"] == "spec.containers{app}",
        "{:#}",
        w.body
    );
    // The condition said it while the container ran.
    let said = recorded.iter().any(|r| {
        r.method == "PATCH"
            && condition(&r.body, CONDITION)
                .is_some_and(|c| c["status"] == "True" && c["reason"] == "MemoryNearLimit")
    });
    ensure!(said, "no MemoryPressure=True written: {recorded:#?}");
    ensure!(limit_hits(&stack, name)? > 0.0, "no limit hit counted");
    let warned = stack.metric(&format!(
        "observer_memory_warnings_total{{namespace=\"default\",pod=\"{name}\",container=\"app\",scope=\"{scope}\"}}"
    ))?;
    ensure!(
        warned == 1.0,
        "observer_memory_warnings_total = {warned}: {}",
        stack.metrics()?
    );
    // explain tells the warning and the kill on one page.
    let view = stack.reconcile.pod(&pod.uid).context("the pod's view")?;
    let api = stack.status.pods().of_view(&view);
    let e = observer::present::explain::explain(&view, None, api.as_deref().ok_or("no pod"));
    let text = observer::present::explain::render_text(&e);
    ensure!(
        text.contains("MemoryNearLimit") && text.contains("OOM"),
        "{text}"
    );
    // ... and its figures: a warning the Event says was projected from two crossings carries
    // the time left and how it was estimated.
    let warning = e.warnings.first().context("explain lists no warning")?;
    ensure!(
        warning.limit_bytes == LIMIT && warning.unreclaimable_bytes > 0,
        "{warning:?}"
    );
    ensure!(
        warning.estimated.is_some() == warning.growth_bytes_per_second.is_some(),
        "{warning:?}"
    );
    if note.contains("between its crossings") {
        ensure!(
            warning.time_left_seconds.is_some_and(|t| t > 0.0)
                && warning
                    .estimated
                    .as_deref()
                    .is_some_and(|h| h.starts_with("between its crossings of")),
            "{warning:?}"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leak_is_warned_before_its_kill() -> Result<()> {
    if !require_kernel() {
        return Ok(());
    }
    leak_is_warned_before_its_kill("leak", 1, false, "container").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leak_under_a_pod_level_limit_is_warned_before_its_kill() -> Result<()> {
    if !require_kernel() {
        return Ok(());
    }
    leak_is_warned_before_its_kill("leak-pod", 2, true, "pod").await
}

/// Runs `args` in a 64 MiB container to its end and checks the kernel's limit hits came and no
/// warning did.
async fn never_warned(name: &'static str, n: u32, args: &[&str], hits_wanted: bool) -> Result<()> {
    let mut cg = TestCgroup::new(name)?;
    let (pod, stack) = pod(&mut cg, name, n, false).await?;
    let child = cg.spawn_in(&pod.container, &workload(), args)?;
    pod.runtime.started(pod.cid, child.id());
    let out = tokio::task::spawn_blocking(move || child.wait_with_output()).await??;
    ensure!(out.status.success(), "the workload failed: {out:?}");
    eprintln!("{}", String::from_utf8_lossy(&out.stdout).trim());
    if hits_wanted {
        // The kernel's hits were judged: without them the test would prove nothing.
        let hits = observer_tests::poll_until_async(Duration::from_secs(10), || {
            limit_hits(&stack, name).ok().filter(|h| *h > 0.0)
        })
        .await;
        ensure!(hits.is_some(), "no limit hit counted: {}", stack.metrics()?);
        eprintln!("limit hits: {hits:?}");
    }
    let left = stack.status.flush(Duration::from_secs(10)).await;
    ensure!(
        left.events_pending == 0,
        "Events left unpublished: {left:?}"
    );
    let recorded = pod.api.recorded();
    ensure!(
        !recorded.iter().any(is_event("MemoryNearLimit")),
        "a warning: {recorded:#?}"
    );
    ensure!(
        !recorded
            .iter()
            .any(|r| condition(&r.body, CONDITION).is_some()),
        "a MemoryPressure condition: {recorded:#?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_loop_at_its_limit_is_never_warned() -> Result<()> {
    if !require_kernel() {
        return Ok(());
    }
    // A filesystem on a disk: on tmpfs or ramfs the "cache" is shmem or locked and rightly warned.
    let dir = tempfile_dir()?;
    let file = dir.join("pages");
    let file = file.to_str().context("utf-8 path")?;
    never_warned("cache", 3, &["cache", file, "160", "8"], true).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bursts_under_the_limit_are_never_warned() -> Result<()> {
    if !require_kernel() {
        return Ok(());
    }
    never_warned("bursty", 4, &["bursty", "40", "6"], false).await
}

/// A directory on a disk-backed filesystem for the cache loop (`target/tmp`, beside the suites).
fn tempfile_dir() -> Result<std::path::PathBuf> {
    let dir = std::env::current_exe()?
        .ancestors()
        .nth(3)
        .context("target/")?
        .join("tmp")
        .join(format!("pressure-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
