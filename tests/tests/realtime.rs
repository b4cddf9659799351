//! The kernel reader's thread never waits for a lock a normal-priority thread may hold: with
//! every lock it shares with normal priority held by another thread (the PLEG queue's, which the
//! reconciler takes; the pipeline's stats', which a scrape takes), a container's death still leaves as its
//! ContainersAlive=False PATCH, and the events the locks kept back arrive once they are free.
//! The ledger's lock is the one it does wait for (held for map operations only, the answers
//! settled there too: ARCHITECTURE.md, "The fast path and its bound").
#![allow(unused_crate_dependencies)] // a test/bench/bin target sees its package's whole dependency list
use std::{sync::Arc, time::Duration};

use anyhow::{Context, Result};
use observer::{
    fastpath::{FastConfig, FastPath},
    model::{BootClock, ContainerId, PodUid},
    pipeline::{KernelPipeline, PipelineConfig, ReaderThread},
    pleg::PlegEventType,
    reconcile::{ContainerPhase, ContainerView, PodView},
    status::{conditions::ConditionTypes, AliveLedger},
};
use observer_tests::{
    apiserver::{pod_object, ApiStandIn},
    kernel::{read_procs, require_kernel, TestCgroup},
    wait::{eventually, eventually_async},
};

const WAIT: Duration = Duration::from_secs(20);

/// A pod of one container, its init running as runc starts it (pid 1 of its own pid
/// namespace), and the ledger's basis for it as the status manager leaves it after its turn.
fn pod(cg: &mut TestCgroup, api: &ApiStandIn, ledger: &AliveLedger, n: u64) -> Result<String> {
    let uid = format!("0000abcd-0000-4000-8000-{n:012x}");
    let id = ContainerId::parse(&format!("{:064x}", 0xdead_0000u64 + n)).context("an id")?;
    let rel = cg.mkdir(&format!("kubepods/pod{uid}/{id}"))?;
    let mut init = cg.spawn_in(
        &rel,
        std::path::Path::new("/usr/bin/unshare"),
        &["-pf", "sleep", "1000"],
    )?;
    std::thread::spawn(move || init.wait());
    anyhow::ensure!(
        eventually(WAIT, || read_procs(&cg.abs(&rel).join("cgroup.procs"))
            .len()
            >= 2),
        "the init did not start"
    );
    let name = format!("locks-{n}");
    let object = pod_object(
        &name,
        "default",
        &uid,
        "node-1",
        &[("app", None)],
        Some("observer.dev/ContainersAlive"),
    );
    let api_pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(object.clone())?;
    api.add_pod(object);
    let uid = PodUid::parse(&uid).context("a uid")?;
    let view = PodView {
        uid,
        namespace: "default".into(),
        name,
        sandbox_id: ContainerId::parse(&format!("{:064x}", 0x5a4d_0000u64 + n)).context("an id")?,
        sandbox_ready: true,
        created_at: None,
        containers: vec![ContainerView {
            kernel_seen: true,
            memory: None,
            ..ContainerView::new(id, String::from("app"), ContainerPhase::Running)
        }],
        last_oom: None,
    };
    ledger.prepare(uid, &view, &Arc::new(api_pod), &ConditionTypes::default());
    Ok(rel)
}

fn kill(cg: &TestCgroup, rel: &str) {
    for pid in read_procs(&cg.abs(rel).join("cgroup.procs")) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

/// The fast path's ContainersAlive=False PATCHes the stand-in received.
fn false_patches(api: &ApiStandIn) -> usize {
    api.recorded()
        .iter()
        .filter(|r| {
            r.method == "PATCH"
                && r.user_agent.starts_with("observer/")
                && r.body.to_string().contains("\"False\"")
        })
        .count()
}

/// Two deaths one after the other, every shared lock held throughout: the first's batch finds
/// the queue's lock held at its end, its answer finds the answers' lock held, its turn finds the
/// stats' lock held. A thread that waited for any of them would never send the second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deaths_leave_while_every_shared_lock_is_held() -> Result<()> {
    if !require_kernel() {
        return Ok(());
    }
    let api = ApiStandIn::start().await?;
    let mut cg = TestCgroup::new("rt-locks")?;
    let ledger = Arc::new(AliveLedger::default());
    let first = pod(&mut cg, &api, &ledger, 1)?;
    let second = pod(&mut cg, &api, &ledger, 2)?;

    let timeout = Duration::from_secs(5);
    let fast = FastPath::build(FastConfig {
        kubeconfig: Some(api.kubeconfig()?.into()),
        field_manager: "observer".into(),
        request_timeout: timeout,
        types: ConditionTypes::default(),
        ledger: Arc::clone(&ledger),
        clock: observer::model::system_clock(),
    })?;
    tokio::spawn(fast.dialer.run());
    let (pipeline, mut rx) = KernelPipeline::start_with(
        PipelineConfig {
            unified: cg.mount.clone(),
            roots: observer::cgroup::KubeRoots::new([cg.rel("kubepods")])?,
            probes: observer::kernel::ProbeOptions {
                watch: observer::kernel::Watch::Roots(vec![cg.watch_root()]),
                ..Default::default()
            },
            queue: 64,
        },
        BootClock::new(),
        Some(fast.hook),
    )?;
    let task = pipeline.spawn(ReaderThread::Dedicated, || {})?;
    // The start-up walk's events, then the fast path's connection.
    while rx.try_recv().is_some() {}
    anyhow::ensure!(
        eventually_async(WAIT, || ledger.writing()).await,
        "the fast path never had its connection"
    );

    let health = task.health();
    let (one, two) = {
        let _queue = rx.hold_lock();
        let _stats = health.hold_stats();
        kill(&cg, &first);
        let one = eventually_async(WAIT, || false_patches(&api) >= 1).await;
        // The first's answer is back (and kept on the thread: its lock is held).
        tokio::time::sleep(Duration::from_millis(200)).await;
        kill(&cg, &second);
        let two = eventually_async(WAIT, || false_patches(&api) >= 2).await;
        (one, two)
    };
    anyhow::ensure!(
        one && two,
        "a death's PATCH did not leave while the shared locks were held (first: {one}, second: {two})"
    );
    // Kept back while the queue was held, handed over once it is free.
    let died = tokio::time::timeout(WAIT, async {
        let mut died = 0;
        while let Some(ev) = rx.recv().await {
            if ev.kind() == PlegEventType::ContainerDied {
                died += 1;
                if died == 2 {
                    return true;
                }
            }
        }
        false
    })
    .await;
    anyhow::ensure!(
        died == Ok(true),
        "the deaths kept back never reached the queue"
    );
    drop(task);
    Ok(())
}
