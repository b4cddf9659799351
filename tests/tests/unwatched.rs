//! The same truth for deaths the agent did not watch. Four containers die: a child OOM-killed then
//! the init exits 0, an init OOM-killed, a plain exit 3, a SIGKILL from outside. Three accounts of
//! them, from the `observer` binary against the real containerd:
//!
//! - **watched**: `status --watch` running the whole time;
//! - **restarted**: `status --watch` that saw the containers start and the child's kill, was
//!   SIGKILLed, and was started again after the deaths;
//! - **after**: `status` run once the deaths were over.
//!
//! For every container the reason, exit code and OOM evidence (victim pid, whether it was the
//! init) must agree; only how each account knows (`exit_source`, the evidence's `source`) differs.
//! `watch --pods` started after the deaths reports them the same way.
#![allow(unused_crate_dependencies)] // a test/bench/bin target sees its package's whole dependency list
use std::collections::HashMap;
use std::path::Path;

use anyhow::{Context, Result};
use nix::sys::signal::Signal;
use observer_tests::{
    agent::WAIT, kernel::require_kernel, poll_until, process::ObserverProcess, require_containerd,
    ContainerSpec, Containerd, PodSpec, Qos,
};
use serde_json::Value;

fn after_go(then: &str) -> String {
    format!("while [ ! -e /tmp/go ]; do sleep 0.05; done; {then}")
}

/// A child allocates past the limit; it raises its own oom_score_adj so that a second victim,
/// should the kernel need one, is never the init.
const CHILD_HOG: &str =
    "(echo 1000 > /proc/self/oom_score_adj; x=$(head -c 64m /dev/zero | tr '\\0' a))";

/// What must agree between accounts: reason, exit code, and the OOM victim (pid, init).
#[derive(Debug, PartialEq, Eq)]
struct Truth {
    reason: Option<String>,
    exit_code: Option<i64>,
    oom: Option<(u64, Option<bool>)>,
}

/// The container rows of one `status -o json` document, by container id.
fn rows(doc: &Value) -> HashMap<String, Value> {
    doc.as_array()
        .into_iter()
        .flatten()
        .flat_map(|pod| pod["containers"].as_array().cloned().unwrap_or_default())
        .filter_map(|c| Some((c["id"].as_str()?.to_string(), c)))
        .collect()
}

fn truth(c: &Value) -> Truth {
    Truth {
        reason: c["reason"].as_str().map(String::from),
        exit_code: c["exit_code"].as_i64(),
        oom: c["last_oom"]
            .as_object()
            .map(|o| (o["pid"].as_u64().unwrap_or(0), o["init"].as_bool())),
    }
}

/// Every container of `ids` has exited in this document.
fn all_exited(doc: &Value, ids: &[&str]) -> bool {
    let r = rows(doc);
    ids.iter().all(|id| {
        r.get(*id)
            .is_some_and(|c| c["state"] == "exited" && c["reason"].is_string())
    })
}

/// `observer status` (read-only: it never writes the state directory) reading `state`.
fn status_args(sock: &str, state: &Path, watch: bool) -> Vec<String> {
    let mut v = vec![
        "status".to_string(),
        "-o".into(),
        "account".into(),
        "--cri-endpoint".into(),
        sock.into(),
        "--state-dir".into(),
        state.display().to_string(),
    ];
    if watch {
        v.push("--watch".into());
    }
    v
}

fn spawn(args: &[String]) -> Result<ObserverProcess> {
    ObserverProcess::spawn(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deaths_before_or_across_a_restart_read_the_same_as_watched_ones() -> Result<()> {
    if !require_containerd() || !require_kernel() {
        return Ok(());
    }
    observer_tests::init_tracing();
    let ctrd = Containerd::start().await?;
    let sock = ctrd.socket().display().to_string();
    // The agent whose restart is tested keeps the state (`observer run`, the only writer);
    // the status watchers beside it read what it keeps.
    let state_dir = tempfile::tempdir()?;
    let state = state_dir.path();
    let watched = spawn(&status_args(&sock, state, true))?;
    let mut first = spawn(&status_args(&sock, state, true))?;
    let mut writer = spawn(&[
        "run".into(),
        "--status-mode".into(),
        "off".into(),
        "--cri-endpoint".into(),
        sock.clone(),
        "--state-dir".into(),
        state.display().to_string(),
        // A stand-in API reviews no tokens: the scrapes here are on loopback.
        "--metrics-access".into(),
        "open".into(),
        "--listen".into(),
        "127.0.0.1:0".into(),
    ])?;

    let run = |name: &'static str, spec: ContainerSpec| {
        let ctrd = &ctrd;
        async move {
            let pod = ctrd
                .run_pod(PodSpec::new(name).qos(Qos::Burstable).container(spec))
                .await?;
            anyhow::Ok(pod.containers[0].id.clone())
        }
    };
    let child = run(
        "child-oom",
        ContainerSpec::sh("app", &format!("{CHILD_HOG}; {}", after_go("exit 0")))
            .memory_limit_mib(32),
    )
    .await?;
    let init = run(
        "init-oom",
        ContainerSpec::sh(
            "app",
            &after_go("x=$(head -c 64m /dev/zero | tr '\\0' a); echo ${#x}"),
        )
        .memory_limit_mib(32),
    )
    .await?;
    let exit3 = run("exit3", ContainerSpec::sh("app", &after_go("exit 3"))).await?;
    let killed = run("killed", ContainerSpec::new("app")).await?;
    let ids = [
        child.as_str(),
        init.as_str(),
        exit3.as_str(),
        killed.as_str(),
    ];

    // The first run of the restarted agent sees them start and the child's kill, then dies.
    let child_kill_seen = |doc: &Value| {
        rows(doc)
            .get(&child)
            .is_some_and(|c| c["last_oom"].is_object())
    };
    first
        .json_until(WAIT, child_kill_seen)
        .await
        .with_context(|| {
            format!(
                "the first agent never saw the child's kill:\n{}",
                first.stderr()
            )
        })?;
    watched
        .json_until(WAIT, child_kill_seen)
        .await
        .context("watched: the child's kill")?;
    // The writer has kept every init it saw start before it dies with the first watcher.
    let kept = poll_until(WAIT, || {
        let text = std::fs::read_to_string(state.join("inits")).ok()?;
        ids.iter().all(|id| text.contains(id)).then_some(())
    });
    assert!(
        kept.is_some(),
        "the agent never kept every init in {}:\n{}",
        state.display(),
        writer.stderr()
    );
    first.stop(Signal::SIGKILL)?;
    writer.stop(Signal::SIGKILL)?;

    // The deaths, while the restarted agent is down.
    for id in &ids[..3] {
        let pid = ctrd.container_pid(id).await?;
        std::fs::write(format!("/proc/{pid}/root/tmp/go"), "")?;
    }
    let pid = ctrd.container_pid(&killed).await?;
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), Signal::SIGKILL)?;
    for id in &ids {
        ctrd.wait_exited(id, WAIT).await?;
    }
    let live = watched
        .json_until(WAIT, |d| all_exited(d, &ids))
        .await
        .with_context(|| format!("watched never saw every death:\n{}", watched.stderr()))?;

    // Started again; and started only now.
    let again = spawn(&status_args(&sock, state, true))?;
    let restarted = again
        .json_until(WAIT, |d| all_exited(d, &ids))
        .await
        .with_context(|| format!("restarted:\n{}", again.stderr()))?;
    let out = tokio::process::Command::new(observer_tests::observer_bin())
        .args(status_args(&sock, state, false))
        .output()
        .await?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let after: Value = serde_json::from_slice(&out.stdout)?;

    let expected = [
        (child.as_str(), "Completed", 0),
        (init.as_str(), "OOMKilled", 137),
        (exit3.as_str(), "Error", 3),
        (killed.as_str(), "Error", 137),
    ];
    let (live, restarted, after) = (rows(&live), rows(&restarted), rows(&after));
    let mut table = vec![
        "| death | watched live | agent restarted mid-way | agent started after |".to_string(),
    ];
    for (id, reason, code) in expected {
        let [w, r, a] = [&live, &restarted, &after].map(|m| m.get(id).cloned().unwrap_or_default());
        let tw = truth(&w);
        assert_eq!(
            (tw.reason.as_deref(), tw.exit_code),
            (Some(reason), Some(code)),
            "watched {id}: {w:#}"
        );
        assert_eq!(
            truth(&r),
            tw,
            "restarted differs for {id}: {r:#}\nwatched: {w:#}"
        );
        assert_eq!(
            truth(&a),
            tw,
            "after differs for {id}: {a:#}\nwatched: {w:#}"
        );
        let cell = |c: &Value| {
            format!(
                "{} / {} ({}){}",
                c["reason"].as_str().unwrap_or("-"),
                c["exit_code"],
                c["exit_source"].as_str().unwrap_or("-"),
                c["last_oom"].as_object().map_or(String::new(), |o| format!(
                    ", OOM kill of pid {} (init: {}, {})",
                    o["pid"],
                    o["init"],
                    o["source"].as_str().unwrap_or("-")
                ))
            )
        };
        table.push(format!(
            "| {reason} {code} | {} | {} | {} |",
            cell(&w),
            cell(&r),
            cell(&a)
        ));
    }
    eprintln!("{}", table.join("\n"));
    // The OOM evidence itself: the child's kill under an init that went on, the init's own kill.
    assert_eq!(truth(&live[&child]).oom.map(|o| o.1), Some(Some(false)));
    assert_eq!(truth(&live[&init]).oom.map(|o| o.1), Some(Some(true)));
    // How each knows: the watched account from the kernel, the later ones from the runtime and
    // the kernel log; the runtime's own words kept beside where they differ.
    assert_eq!(live[&child]["exit_source"], "kernel");
    assert_eq!(after[&child]["last_oom"]["source"], "kernel-log");
    if after[&child]["runtime_reason"] == "OOMKilled" {
        assert_eq!(
            after[&child]["runtime_exit_code"], 0,
            "containerd's OOMKilled / 0 (kubernetes#104454)"
        );
    }

    // `watch --pods` started after the deaths reports each, with the same reason and code, and
    // the OOM kills from the kernel log.
    let mut pods = ObserverProcess::watch_pods(&sock, state)?;
    let died = |id: &str| {
        pods.lines()
            .iter()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|v| v["event"] == "ContainerDied" && v["container_id"] == id)
    };
    assert!(
        observer_tests::eventually_async(WAIT, || ids.iter().all(|id| died(id).is_some())).await,
        "watch --pods printed: {:#?}\n{}",
        pods.lines(),
        pods.stderr()
    );
    for (id, reason, code) in expected {
        let d = died(id).unwrap();
        assert_eq!(
            (d["reason"].as_str(), d["exit_code"].as_i64()),
            (Some(reason), Some(code)),
            "{d:#}"
        );
    }
    let kills: Vec<Value> = pods
        .lines()
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["event"] == "OOMKill")
        .collect();
    for (id, init) in [(child.as_str(), false), (init.as_str(), true)] {
        let pid = truth(&live[id]).oom.unwrap().0;
        assert!(
            kills
                .iter()
                .any(|k| k["container_id"] == id && k["pid"] == pid && k["init"] == init),
            "no OOMKill line for {id} (pid {pid}, init {init}): {kills:#?}"
        );
    }
    pods.stop(Signal::SIGTERM)?;
    Ok(())
}
