//! What the node hands the agent that anyone there can forge, against the real kernel (as root):
//! a cgroup named like a running container's made outside kubelet's roots (a delegated subtree,
//! a container's own cgroupfs), and an OOM report written to /dev/kmsg by a process. Neither may
//! change what the agent believes of the real container: its state, its conditions, its Events,
//! its metrics. The agent is `observer run`'s chain in-process (`observer_tests::stack`): real
//! probes and kernel log, a runtime stand-in, the API stand-in recording what it writes.
#![allow(unused_crate_dependencies)] // a test/bench/bin target sees its package's whole dependency list
use std::{io::Write, time::Duration};

use anyhow::{ensure, Context, Result};
use observer::{
    cgroup::{
        container_cgroup_path, pod_cgroup_path, CgroupDriver, ContainerId, PodUid, Qos, Runtime,
    },
    model::{Clock, FakeClock, SystemClock},
    reconcile::ContainerPhase,
};
use observer_tests::{
    apiserver::{ApiStandIn, Recorded},
    eventually_async,
    kernel::{require_kernel, workload, TestCgroup},
    prereq,
    stack::{AgentStack, InApi, StandInPod},
};
use serde_json::Value;

const NODE: &str = "untrusted-node";
const WAIT: Duration = Duration::from_secs(30);
const ALIVE: &str = "observer.dev/ContainersAlive";

/// One running container `app` of pod `name`, laid out as kubelet and containerd do below the
/// test cgroup's kubepods root, with the agent watching it.
struct Running {
    name: &'static str,
    uid: PodUid,
    cid: ContainerId,
    /// The container's cgroup, hierarchy-relative.
    container: String,
    init: std::process::Child,
    api: ApiStandIn,
    stack: AgentStack,
}

impl Running {
    async fn start(cg: &mut TestCgroup, name: &'static str, n: u32) -> Result<Self> {
        Self::start_on(cg, name, n, SystemClock).await
    }

    /// [`Self::start`] with the agent deciding by the wall clock `clock`.
    async fn start_on<C: Clock>(
        cg: &mut TestCgroup,
        name: &'static str,
        n: u32,
        clock: C,
    ) -> Result<Self> {
        let in_api = InApi {
            limit: None,
            gate: Some(ALIVE),
        };
        let pod = StandInPod::new(cg, name, 0xa1, n, NODE, in_api).await?;
        let stack = pod.agent_on(cg, NODE, clock).await?;
        let StandInPod {
            name,
            uid,
            cid,
            container,
            api,
            runtime,
        } = pod;
        let init = cg.spawn_in(&container, &workload(), &["sleep", "600"])?;
        runtime.started(cid, init.id());
        let me = Self {
            name,
            uid,
            cid,
            container,
            init,
            api,
            stack,
        };
        me.api
            .wait_for(WAIT, |r| me.alive(r) == Some("True"))
            .await
            .with_context(|| {
                format!(
                    "ContainersAlive=True never written: {:#?}",
                    me.api.recorded()
                )
            })?;
        ensure!(
            me.phase() == Some(ContainerPhase::Running),
            "{:?}",
            me.phase()
        );
        Ok(me)
    }

    /// ContainersAlive's status in a PATCH of this pod's status.
    fn alive<'a>(&self, r: &'a Recorded) -> Option<&'a str> {
        if r.method != "PATCH" || !r.path().ends_with(&format!("/pods/{}/status", self.name)) {
            return None;
        }
        condition(&r.body, ALIVE)?["status"].as_str()
    }

    fn phase(&self) -> Option<ContainerPhase> {
        let view = self.stack.reconcile.pod(&self.uid)?;
        let c = view.containers.iter().find(|c| c.id == self.cid)?;
        Some(c.phase)
    }

    /// Waits until the status manager sent all it had.
    async fn flushed(&self) -> Result<()> {
        let left = self.stack.status.flush(Duration::from_secs(10)).await;
        ensure!(
            left.events_pending == 0,
            "Events left unpublished: {left:?}"
        );
        Ok(())
    }

    /// What the agent wrote about the container's death or an OOM kill since `from` (a
    /// recorded request's seq): PATCHes saying it is not alive or OOM-killed, and Events.
    fn bad_news(&self, from: usize) -> Vec<Recorded> {
        self.api
            .recorded()
            .into_iter()
            .filter(|r| r.seq >= from)
            .filter(|r| {
                self.alive(r) == Some("False")
                    || condition(&r.body, "observer.dev/OOMKilled")
                        .is_some_and(|c| c["status"] == "True")
                    || (r.method == "POST" && r.path().ends_with("/events"))
            })
            .collect()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.init.kill();
        let _ = self.init.wait();
    }
}

fn condition<'a>(body: &'a Value, type_: &str) -> Option<&'a Value> {
    body["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

/// The wall clock is the agent's own, injected (`AgentParts::clock`), not whatever the node's
/// says: an agent built with a fake clock a day behind this machine's stamps ContainersAlive's
/// transitions (True at the start, False at the death) from it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agents_transitions_are_stamped_by_the_clock_it_is_given() -> Result<()> {
    if !require_kernel() {
        return Ok(());
    }
    let day = Duration::from_secs(86_400);
    let behind = std::time::SystemTime::now() - day;
    let mut cg = TestCgroup::new("fake-clock")?;
    let mut pod = Running::start_on(&mut cg, "clocked", 3, FakeClock::at(behind)).await?;
    let from = pod.api.recorded().len();
    pod.init.kill()?;
    pod.init.wait()?;
    pod.api
        .wait_for(WAIT, |r| r.seq >= from && pod.alive(r) == Some("False"))
        .await
        .context("the death was not written")?;
    // True as the agent first wrote it; False as the API serves it after the death (a patch
    // leaves out a transition time equal to the served one, to the second).
    let written_true = pod
        .api
        .recorded()
        .iter()
        .filter(|r| pod.alive(r) == Some("True"))
        .find_map(|r| {
            condition(&r.body, ALIVE)?["lastTransitionTime"]
                .as_str()
                .map(str::to_string)
        })
        .context("no True with a transition time")?;
    let served = pod
        .api
        .pod("default", pod.name)
        .context("the pod is served")?;
    let served_false = condition(&served, ALIVE)
        .filter(|c| c["status"] == "False")
        .and_then(|c| c["lastTransitionTime"].as_str())
        .with_context(|| format!("the served pod: {served:#}"))?
        .to_string();
    let machine = std::time::SystemTime::now();
    for (status, at) in [("True", &written_true), ("False", &served_false)] {
        let at: std::time::SystemTime =
            time::OffsetDateTime::parse(at, &time::format_description::well_known::Rfc3339)
                .context("a time")?
                .into();
        // Within the test's own span on the fake clock, a day before the machine's.
        ensure!(
            at >= behind - Duration::from_secs(1) && at + day <= machine + Duration::from_secs(1),
            "{status} stamped {at:?}, not by the agent's clock ({behind:?} on)"
        );
    }
    Ok(())
}

/// A running container's pod and container cgroups made again below a subtree of the test
/// cgroup that is not kubelet's root (`<cg>/evil/kubepods/...`), then removed: the PLEG counts
/// each of those events and ignores them, and the real container stays running, with no death
/// written, no Event. Its real death afterwards is told as ever (the checks above can fail).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cgroup_named_like_a_container_outside_kubelets_roots_changes_nothing() -> Result<()> {
    if !require_kernel() {
        return Ok(());
    }
    let mut cg = TestCgroup::new("spoofed-cgroup")?;
    let mut pod = Running::start(&mut cg, "spoofed", 1).await?;
    let outside = "observer_pleg_outside_roots_events_total";
    let before = pod.stack.metric(outside)?;
    let from = pod.api.recorded().len();

    let (driver, qos) = (CgroupDriver::Cgroupfs, Qos::Burstable);
    let spoof_pod = cg.mkdir(&format!("evil{}", pod_cgroup_path(driver, qos, &pod.uid)))?;
    let spoof = cg.mkdir(&format!(
        "evil{}",
        container_cgroup_path(driver, qos, &pod.uid, Runtime::Containerd, &pod.cid)
    ))?;
    ensure!(spoof.ends_with(pod.container.trim_start_matches(&cg.rel)));
    std::fs::remove_dir(cg.abs(&spoof))?;
    std::fs::remove_dir(cg.abs(&spoof_pod))?;
    // mkdir and rmdir of both: four events outside the roots, seen and ignored.
    ensure!(
        eventually_async(WAIT, || pod.stack.metric(outside).unwrap_or(0.0)
            >= before + 4.0)
        .await,
        "{outside} did not count the spoof's events: {}",
        pod.stack.metrics()?
    );
    pod.flushed().await?;
    ensure!(
        pod.phase() == Some(ContainerPhase::Running),
        "the real container's state changed: {:?}",
        pod.stack.reconcile.pod(&pod.uid)
    );
    let news = pod.bad_news(from);
    ensure!(news.is_empty(), "the spoof made the agent write: {news:#?}");

    // The real container's death is written as always.
    pod.init.kill()?;
    pod.init.wait()?;
    let died = pod
        .api
        .wait_for(WAIT, |r| r.seq >= from && pod.alive(r) == Some("False"))
        .await;
    ensure!(
        died.is_some(),
        "the real death was not written: {:#?}",
        pod.api.recorded()
    );
    ensure!(
        pod.phase() == Some(ContainerPhase::Exited),
        "{:?}",
        pod.phase()
    );
    Ok(())
}

/// An OOM kill forged in the kernel log: the two lines that name a kill (`oom-kill:` with the
/// running container's cgroup and its init's pid, and `Killed process`), written to /dev/kmsg
/// as a process can. The kernel gives them facility LOG_USER; the agent counts them and makes
/// nothing of them: no OOM kill in its view, no condition, no Event, no OOM metric.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oom_report_a_process_wrote_to_the_kernel_log_changes_nothing() -> Result<()> {
    if !require_kernel() {
        return Ok(());
    }
    let devkmsg = std::fs::read_to_string("/proc/sys/kernel/printk_devkmsg").unwrap_or_default();
    let missing: Vec<String> = (devkmsg.trim() == "off")
        .then(|| "writes to /dev/kmsg (kernel.printk_devkmsg is off)".to_string())
        .into_iter()
        .collect();
    if !prereq::require("forging the kernel log", &missing) {
        return Ok(());
    }
    let mut cg = TestCgroup::new("forged-kmsg")?;
    let pod = Running::start(&mut cg, "forged", 2).await?;
    let ignored = "observer_kernel_log_records_ignored_total{reason=\"not_kernel\"}";
    let before = pod.stack.metric(ignored)?;
    let from = pod.api.recorded().len();

    let pid = pod.init.id();
    let cgroup = &pod.container;
    let lines = [
        format!("<6>oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg={cgroup},task_memcg={cgroup},task=FORGED,pid={pid},uid=0"),
        format!("<3>Memory cgroup out of memory: Killed process {pid} (FORGED) total-vm:4096kB, anon-rss:2048kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:40kB oom_score_adj:0"),
    ];
    let mut kmsg = std::fs::OpenOptions::new().write(true).open("/dev/kmsg")?;
    for l in &lines {
        // One write, one record; with its newline, as the kernel's end: a record without one is
        // kept open for a continuation, unread, until some other record comes.
        kmsg.write_all(format!("{l}\n").as_bytes())?;
    }
    ensure!(
        eventually_async(WAIT, || pod.stack.metric(ignored).unwrap_or(0.0)
            >= before + 2.0)
        .await,
        "the follower did not count the forged lines: {}",
        pod.stack.metrics()?
    );
    // Counted as read: dropped there, nothing of them is under way any more.
    pod.flushed().await?;
    let view = pod
        .stack
        .reconcile
        .pod(&pod.uid)
        .context("the pod's view")?;
    let c = view
        .containers
        .iter()
        .find(|c| c.id == pod.cid)
        .context("the container's view")?;
    ensure!(
        c.oom_kills == 0 && c.last_oom.is_none() && view.last_oom.is_none(),
        "the forged kill is in the view: {view:#?}"
    );
    ensure!(c.phase == ContainerPhase::Running, "{:?}", c.phase);
    let news = pod.bad_news(from);
    ensure!(
        news.is_empty(),
        "the forged report made the agent write: {news:#?}"
    );
    let metrics = pod.stack.metrics()?;
    ensure!(
        !metrics
            .lines()
            .any(|l| l.starts_with("observer_oom_kills_total{")),
        "an OOM kill was counted: {metrics}"
    );
    Ok(())
}
