//! OOM kills as users see them, for the kills only CI's VM guests can make: a global OOM (the
//! node out of memory) and a `memory.oom.group=1` group kill (cgroup v2). What is checked is what
//! users read: the Event and the `OOMKilled` condition the status manager writes (one sentence
//! naming the scope), and the model `observer explain` prints. The guest has no containerd and no
//! API server, so the agent's own pipeline runs in-process (`observer_tests::stack`): real probes
//! and kernel log, real reconciler and status manager, the pod's cgroups laid out as kubelet and
//! containerd do, a runtime stand-in, and the API stand-in recording what the agent writes.
//! Run one test at a time (`--test-threads=1`) with `OBSERVER_VM_GUEST=1` in a cgroup v2 guest;
//! not yet in xtask/src/vm/init.sh's run (README.md, "What the agent cannot know").
#![allow(unused_crate_dependencies)] // a test/bench/bin target sees its package's whole dependency list
use std::{path::Path, time::Duration};

use anyhow::{ensure, Context, Result};
use observer_tests::{
    apiserver::Recorded,
    kernel::{require_kernel, workload, TestCgroup},
    prereq::require_in_guest,
    stack::{AgentStack, InApi, StandInPod},
};
use serde_json::Value;

const NODE: &str = "vm-node";
/// A guest under software emulation fills its memory slowly.
const WAIT: Duration = Duration::from_secs(120);
const OOM_CONDITION: &str = "observer.dev/OOMKilled";

/// One pod with one container `app` ([`StandInPod`]), with what these tests do to it.
struct Pod(StandInPod);

impl std::ops::Deref for Pod {
    type Target = StandInPod;
    fn deref(&self) -> &StandInPod {
        &self.0
    }
}

impl Pod {
    async fn new(
        cg: &mut TestCgroup,
        name: &'static str,
        n: u32,
        limit: Option<&str>,
    ) -> Result<Self> {
        let in_api = InApi { limit, gate: None };
        Ok(Self(
            StandInPod::new(cg, name, 0x0e, n, NODE, in_api).await?,
        ))
    }

    /// The agent's pipeline on this pod, once the API's pods are listed.
    async fn agent(&self, cg: &TestCgroup) -> Result<AgentStack> {
        self.0.agent(cg, NODE).await
    }

    /// Runs `program args` as the container's init (in its cgroup) to its end; its output.
    async fn run_init(
        &self,
        cg: &TestCgroup,
        program: &Path,
        args: &[&str],
    ) -> Result<std::process::Output> {
        let child = cg.spawn_in(&self.container, program, args)?;
        self.runtime.started(self.cid, child.id());
        Ok(tokio::task::spawn_blocking(move || child.wait_with_output()).await??)
    }

    /// The one OOM Event for the container (its note), after the manager published all it had
    /// (a held kill included): a second one fails.
    async fn the_oom_event(&self, stack: &AgentStack) -> Result<String> {
        let is_oom = |r: &Recorded| {
            r.method == "POST"
                && r.path().ends_with("/events")
                && (r.body["reason"] == "OOMKilled" || r.body["reason"] == "ProcessOOMKilled")
        };
        self.api
            .wait_for(WAIT, is_oom)
            .await
            .with_context(|| format!("no OOM Event: {:#?}", self.api.recorded()))?;
        let left = stack.status.flush(Duration::from_secs(10)).await;
        ensure!(
            left.events_pending == 0,
            "Events left unpublished: {left:?}"
        );
        let events: Vec<Recorded> = self.api.recorded().into_iter().filter(is_oom).collect();
        ensure!(events.len() == 1, "one OOM Event wanted: {events:#?}");
        let e = &events[0].body;
        ensure!(
            e["regarding"]["name"] == self.name
                && e["regarding"]["fieldPath"] == "spec.containers{app}",
            "{e:#}"
        );
        Ok(e["note"].as_str().unwrap_or_default().to_string())
    }

    /// The OOMKilled condition once its message says `what` (the status path writes it at
    /// once, and again when the report names the scope; the end of the sentence, the
    /// container's fate, follows the container).
    async fn condition_saying(&self, what: impl Fn(&str) -> bool) -> Result<String> {
        // A patch leaves out what it does not change (the status, True since the kill): the
        // message is looked for in the patches, the status in the condition the API merged.
        let says = |r: &Recorded| {
            r.method == "PATCH"
                && r.path().ends_with(&format!("/pods/{}/status", self.name))
                && condition(&r.body, OOM_CONDITION)
                    .is_some_and(|c| c["message"].as_str().is_some_and(&what))
        };
        let r =
            self.api.wait_for(WAIT, says).await.with_context(|| {
                format!("no such OOMKilled condition: {:#?}", self.api.recorded())
            })?;
        let served = self
            .api
            .pod("default", self.name)
            .context("the served pod")?;
        ensure!(
            condition(&served, OOM_CONDITION).is_some_and(|c| c["status"] == "True"),
            "the API's OOMKilled is not True: {served:#}"
        );
        Ok(condition(&r.body, OOM_CONDITION)
            .and_then(|c| c["message"].as_str())
            .unwrap_or_default()
            .to_string())
    }

    /// `observer explain`'s model of the pod (what the binary prints and a PodReport holds),
    /// with the API's pod as the agent's reflector has it.
    fn explained(&self, stack: &AgentStack) -> Result<(Value, String)> {
        let view = stack.reconcile.pod(&self.uid).context("the pod's view")?;
        let api = stack.status.pods().of_view(&view);
        let e = observer::present::explain::explain(
            &view,
            None,
            api.as_deref().ok_or("the reflector has no such pod"),
        );
        Ok((
            serde_json::to_value(&e)?,
            observer::present::explain::render_text(&e),
        ))
    }
}

/// What the kernel log holds of the kills, and the view's kill, for a failure's message.
fn clocks(stack: &AgentStack, uid: &observer::model::PodUid) -> String {
    let logged: Vec<String> = observer::kernel::kmsg::read_history()
        .map(|h| {
            h.kills
                .iter()
                .map(|k| format!("pid {} at_us {} time {:?}", k.pid, k.at_us, k.time))
                .collect()
        })
        .unwrap_or_default();
    let seen = stack
        .reconcile
        .pod(uid)
        .and_then(|v| v.last_oom)
        .map(|o| format!("pid {} time {:?} scope {:?}", o.pid, o.time, o.scope));
    format!("the view's kill: {seen:?}; the kernel log's: {logged:?}")
}

fn condition<'a>(body: &'a Value, type_: &str) -> Option<&'a Value> {
    body["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

/// Enables the memory controller from `cg` down to (not into) `rel`: cgroup v2 gives a cgroup
/// `memory.max` only where its parent delegates the controller.
fn delegate_memory(cg: &TestCgroup, rel: &str) -> Result<()> {
    let mut dir = cg.dir.clone();
    let below = rel
        .strip_prefix(&cg.rel)
        .context("inside the test cgroup")?
        .trim_matches('/');
    for part in below.split('/') {
        std::fs::write(dir.join("cgroup.subtree_control"), "+memory")
            .with_context(|| format!("+memory in {}", dir.display()))?;
        dir.push(part);
    }
    Ok(())
}

/// Restores the harness's oom_score_adj when the global OOM test ends.
struct ScoreAdj(String);

impl ScoreAdj {
    /// The harness (and so the agent's pipeline in it) out of the OOM killer's reach.
    fn protect() -> Result<Self> {
        let old = std::fs::read_to_string("/proc/self/oom_score_adj")?;
        std::fs::write("/proc/self/oom_score_adj", "-1000")?;
        Ok(Self(old.trim().to_string()))
    }
}

impl Drop for ScoreAdj {
    fn drop(&mut self) {
        let _ = std::fs::write("/proc/self/oom_score_adj", &self.0);
    }
}

fn v2_memory_missing() -> Vec<String> {
    let controllers =
        std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers").unwrap_or_default();
    if controllers.split_whitespace().any(|c| c == "memory") {
        vec![]
    } else {
        vec!["the memory controller on cgroup v2 at /sys/fs/cgroup (memory.oom.group)".into()]
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_kill_is_told_with_the_processes_killed_together() -> Result<()> {
    if !require_kernel() || !require_in_guest("the group-kill test", None, &v2_memory_missing()) {
        return Ok(());
    }
    observer_tests::init_tracing();
    let mut cg = TestCgroup::new("oom-group")?;
    let pod = Pod::new(&mut cg, "grouped", 1, Some("32Mi")).await?;
    delegate_memory(&cg, &pod.container)?;
    let dir = cg.abs(&pod.container);
    std::fs::write(dir.join("memory.max"), (32u64 << 20).to_string())?;
    std::fs::write(dir.join("memory.swap.max"), "0").ok();
    std::fs::write(dir.join("memory.oom.group"), "1")?;
    let stack = pod.agent(&cg).await?;

    // The init forks a child that allocates past the limit: the group kill takes both. The
    // init's oom_score_adj is set to 0 (a harness at -1000 would make it unkillable).
    let out = pod
        .run_init(
            &cg,
            Path::new("/bin/sh"),
            &[
                "-c",
                r#"echo 0 > /proc/self/oom_score_adj && exec "$0" oom-child 64"#,
                &workload().display().to_string(),
            ],
        )
        .await?;
    use std::os::unix::process::ExitStatusExt;
    ensure!(
        out.status.signal() == Some(9),
        "the init was killed with its child: {:?}",
        out.status
    );
    pod.runtime.exited(pod.cid, 137, "OOMKilled");

    let note = pod.the_oom_event(&stack).await?;
    eprintln!("Event (group kill): {note}");
    let (json, text) = pod.explained(&stack)?;
    let kill = &json["kills"][0];
    let report = &kill["report"];
    let init = report["members"]
        .as_array()
        .into_iter()
        .flatten()
        .chain(std::iter::once(&report["victim"]))
        .find(|k| k["comm"] != "oom-victim")
        .context("the init among those killed")?["pid"]
        .clone();
    let told = |s: &str| {
        s.starts_with("container app hit its 32.0 MiB limit: anon ")
            && s.contains("every process of the container was killed with it (memory.oom.group): ")
            && s.contains("oom-victim (pid ")
            && s.contains(&format!("(pid {init})"))
    };
    ensure!(
        told(&note),
        "the Event names the scope and every process killed: {note}\n{}",
        clocks(&stack, &pod.uid)
    );
    let message = pod.condition_saying(told).await?;
    eprintln!("OOMKilled condition (group kill): {message}");
    ensure!(
        kill["scope"] == "container"
            && kill["group"] == true
            && kill["sentence"].as_str().is_some_and(told),
        "{kill:#}"
    );
    ensure!(
        report["group_cgroup"] == pod.container.as_str(),
        "{report:#}"
    );
    // No kubelet here: its account is shown as empty, and each instance marked as not reported.
    let k = &json["kubelet"]["containers"][0];
    ensure!(
        k["container"] == "app" && k["disagreements"][0]["kubelet"] == "nothing",
        "{:#}",
        json["kubelet"]
    );
    eprintln!("observer explain (group kill):\n{text}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_global_oom_is_told_as_the_nodes_memory() -> Result<()> {
    if !require_kernel()
        || !require_in_guest(
            "the global OOM test",
            Some("it runs the whole machine out of memory"),
            &[],
        )
    {
        return Ok(());
    }
    observer_tests::init_tracing();
    // The report names the largest processes only when the kernel lists them.
    std::fs::write("/proc/sys/vm/oom_dump_tasks", "1")?;
    let _adj = ScoreAdj::protect()?;
    let mut cg = TestCgroup::new("oom-node")?;
    // No memory limit anywhere above the container: only the node's memory can run out.
    let pod = Pod::new(&mut cg, "greedy", 2, None).await?;
    // The memory controller on down to the container, as kubelet's tree has it (with no limit
    // set anywhere): the kernel's report names a task's nearest cgroup with the controller on.
    delegate_memory(&cg, &pod.container)?;
    let stack = pod.agent(&cg).await?;

    // The init (at -1000, as the harness) forks `oom-victim` (oom_score_adj 1000), which
    // allocates until the kernel kills it; the init reports it and exits 0.
    let out = pod
        .run_init(&cg, &workload(), &["oom-child", "1000000"])
        .await?;
    ensure!(out.status.success(), "the init survived: {:?}", out.status);
    let said = String::from_utf8_lossy(&out.stdout);
    let victim: u32 = said
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .with_context(|| format!("the init's report of its child: {said:?}"))?;
    ensure!(said.contains("status 0x9"), "killed by SIGKILL: {said}");
    pod.runtime.exited(pod.cid, 0, "Completed");

    let note = pod.the_oom_event(&stack).await?;
    eprintln!("Event (global OOM): {note}");
    // The node's other processes (this test's own, the guest's) are counted, never named: on
    // a real node they are other pods'.
    let told = |s: &str| {
        s.starts_with("the node ran out of memory (no cgroup limit was hit): ")
            && s.contains(" other processes held ")
            && !s.contains("largest processes")
            && s.contains(&format!(
                "process oom-victim (pid {victim}) in container app was OOM-killed"
            ))
    };
    ensure!(
        told(&note),
        "the Event names the node's memory as the scope: {note}\n{}",
        clocks(&stack, &pod.uid)
    );
    let message = pod.condition_saying(told).await?;
    eprintln!("OOMKilled condition (global OOM): {message}");
    let (json, text) = pod.explained(&stack)?;
    let kill = &json["kills"][0];
    ensure!(
        kill["scope"] == "node"
            && kill["victim"]["pid"] == victim
            && kill["report"]["oom_memcg"] == ""
            && kill["report"]["tasks_listed"] == true,
        "{kill:#}"
    );
    // The node's other processes are out of the pod's explanation, counted only.
    let tasks = kill["report"]["tasks"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    ensure!(
        tasks.iter().all(|t| t["pid"] == victim)
            && kill["others_withheld"]["processes"]
                .as_u64()
                .is_some_and(|n| n > 0),
        "only the victim listed, the others counted: {kill:#}"
    );
    eprintln!("observer explain (global OOM):\n{text}");
    Ok(())
}
