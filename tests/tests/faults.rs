//! `observer run` through the faults a node agent meets, each with the real kernel, the real
//! containerd and the recording API stand-in (which keeps the conditions written to it, so a
//! restarted agent lists what it wrote before):
//!
//! - the agent killed with SIGKILL while containers change state, then started again: the deaths
//!   it missed are written, nothing it wrote before is written again, and no write is older than
//!   one before it (a dead container is never called alive again);
//! - containerd stopped for 30 s: the kernel's account of a death goes on reaching the API, the
//!   agent stays healthy, reconnects, and sees pods started after;
//! - the API answering 500 for 30 s: retried with bounded back-off, then every pod's final status
//!   is written;
//! - containerd frozen (SIGSTOP: its socket accepts and nothing answers, a hung runtime) with the
//!   fast path real-time: a death reaches the API through the fast path, and the status manager,
//!   once its view shows the death, neither undoes it nor moves its transition time;
//! - the API server hung (it reads writes and answers none): each death's patch still goes out
//!   from the fast path at once, the second while the first is unanswered, and once the server
//!   answers again both deaths reach it through the status manager;
//! - credentials rotated on disk and the API answering 401: the fast path reads them again and
//!   its next request carries the new token;
//! - the agent's port flooded with connections that never finish a request, from eight
//!   addresses: `/healthz` answers, a death reaches the API, the refusals are said;
//! - the fast path's write answered without end (an endless chunked body, a body of a huge
//!   length, a head of 4 MiB): the connection is dropped once the answer passed its cap, long
//!   before the request timeout, the death is written by the status manager, the next death
//!   still leaves the fast path at once, and the cause is said once.
//!
//! The ring buffer overflowing is covered by the kernel suite (tests/tests/kernel.rs).
#![allow(unused_crate_dependencies)] // a test/bench/bin target sees its package's whole dependency list
use std::{
    net::SocketAddr,
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use nix::sys::signal::Signal;
use observer_tests::{
    agent::WAIT,
    apiserver::{ApiStandIn, Hostile, Recorded},
    containerd::StopSignal,
    endpoint::{free_listen, metric, ok},
    eventually_async,
    kernel::require_kernel,
    process::ObserverProcess,
    require_containerd, ContainerSpec, Containerd, Pod, PodSpec,
};
use serde_json::Value;

const NODE: &str = "node-1";
const ALIVE: &str = "observer.dev/ContainersAlive";
/// How long each outage lasts.
const OUTAGE: Duration = Duration::from_secs(30);
/// The writer's back-off tops out at 5 s (jittered): the first retry after an outage comes
/// within that; a generous deadline for a loaded machine.
const RECOVERY: Duration = Duration::from_secs(75);

fn alive_status(r: &Recorded) -> Option<&str> {
    r.body["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == ALIVE)?["status"]
        .as_str()
}

fn status_patch_of(r: &Recorded, pod: &str) -> bool {
    r.method == "PATCH" && r.path().ends_with(&format!("/pods/{pod}/status"))
}

/// Status patches of `pod` from request `since` on.
fn patches(api: &ApiStandIn, pod: &str, since: usize) -> Vec<Recorded> {
    api.recorded()
        .into_iter()
        .filter(|r| r.seq >= since && status_patch_of(r, pod))
        .collect()
}

/// The agent as a test runs it, restartable on the same state dir and port.
struct Agent {
    args: Vec<String>,
    listen: SocketAddr,
    process: Option<ObserverProcess>,
}

impl Agent {
    fn new(api: &ApiStandIn, ctrd: &Containerd, state: &Path) -> Result<Self> {
        let listen = free_listen();
        let args = vec![
            "run".into(),
            "--kubeconfig".into(),
            api.kubeconfig()?.display().to_string(),
            "--node-name".into(),
            NODE.into(),
            "--cri-endpoint".into(),
            ctrd.socket().display().to_string(),
            // A stand-in API reviews no tokens: the scrapes here are on loopback.
            "--metrics-access".into(),
            "open".into(),
            "--listen".into(),
            listen.to_string(),
            "--state-dir".into(),
            state.display().to_string(),
        ];
        Ok(Self {
            args,
            listen,
            process: None,
        })
    }

    async fn start(&mut self) -> Result<()> {
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        let p = ObserverProcess::spawn(&args)?;
        let ready = eventually_async(WAIT, || ok(self.listen, "/readyz")).await;
        anyhow::ensure!(ready, "the agent never became ready:\n{}", p.stderr());
        self.process = Some(p);
        Ok(())
    }

    fn kill(&mut self) -> Result<()> {
        let mut p = self.process.take().context("not running")?;
        p.stop(Signal::SIGKILL)?;
        Ok(())
    }

    fn stderr(&self) -> String {
        self.process
            .as_ref()
            .map(ObserverProcess::stderr)
            .unwrap_or_default()
    }

    fn healthy(&self) -> bool {
        ok(self.listen, "/healthz")
    }
}

/// A pod in the API (before the agent lists: the stand-in's watch sends nothing).
fn declare(api: &ApiStandIn, name: &str) -> PodSpec {
    let spec = PodSpec::new(name);
    api.declare(&spec, NODE, &[("app", None)], Some(ALIVE));
    spec
}

/// The declared pod in containerd: one container `app` that runs until told to exit with
/// `code` (`None`: it runs on).
async fn pod(ctrd: &Containerd, spec: &PodSpec, code: Option<i32>) -> Result<Pod> {
    let script = match code {
        Some(c) => format!("while [ ! -e /tmp/go ]; do sleep 0.05; done; exit {c}"),
        None => "sleep 3600".into(),
    };
    ctrd.run_pod(spec.clone().container(ContainerSpec::sh("app", &script)))
        .await
}

/// Tells `pod`'s container to exit (works while containerd is down: through /proc).
fn go(pid: u32) -> Result<()> {
    std::fs::write(format!("/proc/{pid}/root/tmp/go"), "").context("telling the container to exit")
}

/// Waits for a status patch of `pod` (from request `since` on) whose ContainersAlive is `want`.
async fn alive_patch(
    api: &ApiStandIn,
    pod: &str,
    want: &str,
    since: usize,
    timeout: Duration,
) -> Option<Recorded> {
    api.wait_for(timeout, |r| {
        r.seq >= since && r.code == 200 && status_patch_of(r, pod) && alive_status(r) == Some(want)
    })
    .await
}

/// `pod`'s ContainersAlive as the API has it now.
fn served_alive(api: &ApiStandIn, pod: &Pod) -> Option<Value> {
    api.pod(&pod.namespace, &pod.name)?["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == ALIVE)
        .cloned()
}

/// Holds an outage for `OUTAGE` from `since`, checking the whole time that the agent stays
/// healthy (kubelet would restart an agent whose liveness fails, which helps nobody here).
async fn hold_outage(agent: &Agent, since: Instant) {
    while since.elapsed() < OUTAGE {
        assert!(
            agent.healthy(),
            "/healthz failed during the outage:\n{}",
            agent.stderr()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// containerd, the API stand-in with `names` declared, and the agent started on a state dir.
struct Scene {
    ctrd: Containerd,
    api: ApiStandIn,
    agent: Agent,
    _state: tempfile::TempDir,
}

impl Scene {
    /// None (said why) where the kernel or containerd prerequisites are absent.
    async fn start(names: &[&str]) -> Result<Option<(Self, Vec<PodSpec>)>> {
        Self::start_with(names, &[]).await
    }

    /// [`Self::start`] with more flags for the agent.
    async fn start_with(names: &[&str], flags: &[&str]) -> Result<Option<(Self, Vec<PodSpec>)>> {
        if !(require_containerd() && require_kernel()) {
            return Ok(None);
        }
        observer_tests::init_tracing();
        let ctrd = Containerd::start().await?;
        let api = ApiStandIn::start().await?;
        let state = tempfile::tempdir()?;
        let specs = names.iter().map(|n| declare(&api, n)).collect();
        let mut agent = Agent::new(&api, &ctrd, state.path())?;
        agent.args.extend(flags.iter().map(|f| f.to_string()));
        agent.start().await?;
        Ok(Some((
            Self {
                ctrd,
                api,
                agent,
                _state: state,
            },
            specs,
        )))
    }

    /// Runs a declared pod and waits until the API calls it alive. Returns it and its init.
    async fn alive(&self, spec: &PodSpec, code: Option<i32>) -> Result<(Pod, u32)> {
        let p = pod(&self.ctrd, spec, code).await?;
        alive_patch(&self.api, &p.name, "True", 0, WAIT)
            .await
            .with_context(|| {
                format!(
                    "{}: no ContainersAlive True\n{}",
                    p.name,
                    self.agent.stderr()
                )
            })?;
        let pid = self.ctrd.container_pid(p.container_id("app")).await?;
        Ok((p, pid))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_mid_change_the_agent_converges_without_stale_writes() -> Result<()> {
    let Some((mut scene, specs)) = Scene::start(&["steady", "dies", "late"]).await? else {
        return Ok(());
    };
    let (steady, _) = scene.alive(&specs[0], None).await?;
    let (dies, pid) = scene.alive(&specs[1], Some(3)).await?;
    let Scene {
        ctrd, api, agent, ..
    } = &mut scene;

    // Killed; while it is away a container dies and a pod starts.
    agent.kill()?;
    go(pid)?;
    ctrd.wait_exited(dies.container_id("app"), WAIT).await?;
    let late = pod(ctrd, &specs[2], None).await?;
    let before = api.recorded().len();
    agent.start().await?;

    let died = alive_patch(api, &dies.name, "False", before, WAIT)
        .await
        .with_context(|| format!("the death it missed was not written\n{}", agent.stderr()))?;
    let message = died.body["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == ALIVE))
        .and_then(|c| c["message"].as_str())
        .unwrap_or_default()
        .to_string();
    assert!(message.contains("exited with code 3"), "{message}");
    alive_patch(api, &late.name, "True", before, WAIT)
        .await
        .context("the pod started while it was away was not written")?;
    // Converged: the restarted agent computed `steady` and found the API already right.
    assert!(
        eventually_async(WAIT, || {
            metric(agent.listen, "observer_status_unchanged_total").is_some_and(|n| n >= 1.0)
        })
        .await,
        "steady was never found unchanged\n{}",
        agent.stderr()
    );
    assert!(
        patches(api, &steady.name, before).is_empty(),
        "steady written again: {:#?}\nall requests: {:#?}\n{}",
        patches(api, &steady.name, before),
        api.recorded(),
        agent.stderr()
    );
    // Never stale: after the restart, `dies` is only ever called dead.
    for r in patches(api, &dies.name, before) {
        assert_eq!(alive_status(&r), Some("False"), "{r:#?}");
    }
    assert_eq!(
        served_alive(api, &dies).map(|c| c["status"].clone()),
        Some("False".into())
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containerd_down_for_30s_deaths_still_reach_the_api() -> Result<()> {
    let Some((scene, specs)) = Scene::start(&["steady", "dies", "after"]).await? else {
        return Ok(());
    };
    let (steady, _) = scene.alive(&specs[0], None).await?;
    let (dies, pid) = scene.alive(&specs[1], Some(4)).await?;
    let Scene {
        ctrd, api, agent, ..
    } = &scene;

    let down = Instant::now();
    ctrd.stop(StopSignal::Kill).await?;
    let before = api.recorded().len();
    go(pid)?;
    // The kernel saw it; the runtime cannot be asked: the death is written all the same.
    alive_patch(api, &dies.name, "False", before, WAIT)
        .await
        .with_context(|| {
            format!(
                "the death was not written while containerd was down\n{}",
                agent.stderr()
            )
        })?;
    hold_outage(agent, down).await;
    ctrd.resume().await?;
    assert!(
        eventually_async(WAIT, || {
            metric(agent.listen, "observer_cri_reconnects_total").is_some_and(|n| n >= 1.0)
        })
        .await,
        "no reconnect counted\n{}",
        agent.stderr()
    );
    let after = pod(ctrd, &specs[2], None).await?;
    alive_patch(api, &after.name, "True", 0, WAIT)
        .await
        .context("a pod started after the outage was not written")?;
    // Nothing lost or reversed: steady never died, dies stays dead.
    // (Before its container ran, steady was rightly "not running yet".)
    let steady_patches: Vec<Recorded> = patches(api, &steady.name, 0)
        .into_iter()
        .skip_while(|r| alive_status(r) != Some("True"))
        .collect();
    assert!(
        !steady_patches.is_empty()
            && steady_patches
                .iter()
                .all(|r| alive_status(r) != Some("False")),
        "{steady_patches:#?}\n{}",
        agent.stderr()
    );
    assert_eq!(
        served_alive(api, &dies).map(|c| c["status"].clone()),
        Some("False".into())
    );
    assert!(agent.healthy());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_failing_for_30s_then_every_final_status_is_written() -> Result<()> {
    let Some((scene, specs)) = Scene::start(&["first", "second"]).await? else {
        return Ok(());
    };
    let (first, p1) = scene.alive(&specs[0], Some(5)).await?;
    let (second, p2) = scene.alive(&specs[1], Some(6)).await?;
    let pids = [p1, p2];
    let Scene { api, agent, .. } = &scene;

    let down = Instant::now();
    api.fail_writes(Some(500));
    let before = api.recorded().len();
    for pid in pids {
        go(pid)?;
    }
    // Tried, refused.
    for p in [&first, &second] {
        api.wait_for(WAIT, |r| {
            r.seq >= before
                && r.code == 500
                && status_patch_of(r, &p.name)
                && alive_status(r) == Some("False")
        })
        .await
        .with_context(|| format!("{}: the death was never tried", p.name))?;
    }
    hold_outage(agent, down).await;
    // Retried with a growing back-off, not hammered: 200 ms doubling to 5 s, each delay drawn
    // from its upper half, is 9 to 17 tries in 30 s (the fast path's one besides).
    let tries = patches(api, &first.name, before).len();
    assert!(
        (2..=20).contains(&tries),
        "{tries} tries of first's death in 30 s"
    );
    api.fail_writes(None);
    let recovered = api.recorded().len();
    for p in [&first, &second] {
        alive_patch(api, &p.name, "False", recovered, RECOVERY)
            .await
            .with_context(|| format!("{}: the final status was never written", p.name))?;
        assert_eq!(
            served_alive(api, p).map(|c| c["status"].clone()),
            Some("False".into())
        );
    }
    assert!(metric(agent.listen, "observer_status_write_errors_total").is_some_and(|n| n >= 2.0));
    assert!(agent.healthy());
    Ok(())
}

/// SIGSTOP on a process until dropped (SIGCONT then, also when the test fails).
struct Frozen(nix::unistd::Pid);

impl Frozen {
    fn new(pid: u32) -> Result<Self> {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(pid)?);
        nix::sys::signal::kill(pid, Signal::SIGSTOP)?;
        Ok(Self(pid))
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(self.0, Signal::SIGCONT);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containerd_frozen_a_death_reaches_the_api_through_the_fast_path_once() -> Result<()> {
    let Some((scene, specs)) = Scene::start_with(&["dies"], &["--realtime-priority", "10"]).await?
    else {
        return Ok(());
    };
    let (dies, pid) = scene.alive(&specs[0], Some(5)).await?;
    let Scene {
        ctrd, api, agent, ..
    } = &scene;
    let fast_writes = || metric(agent.listen, "observer_fast_path_writes_total");
    let waits = || metric(agent.listen, "observer_status_fast_path_waits_total");
    let unchanged = || metric(agent.listen, "observer_status_unchanged_total");
    let writes = || metric(agent.listen, "observer_status_writes_total");
    assert_eq!(fast_writes(), Some(0.0), "{}", agent.stderr());
    let (unchanged_before, writes_before) = (unchanged().unwrap_or(0.0), writes().unwrap_or(0.0));

    let frozen = Frozen::new(ctrd.pid().context("containerd's pid")?)?;
    let before = api.recorded().len();
    go(pid)?;
    let died = alive_patch(api, &dies.name, "False", before, WAIT)
        .await
        .with_context(|| {
            format!(
                "the death did not reach the API while containerd was frozen\n{}",
                agent.stderr()
            )
        })?;
    let message = died.body["status"]["conditions"][0]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(message.contains("exited with code 5"), "{message}");
    // Sent by the fast path (the runtime asked nothing).
    assert!(
        eventually_async(WAIT, || fast_writes().is_some_and(|n| n >= 1.0)).await,
        "no fast path write counted\n{}",
        agent.stderr()
    );
    // The status manager's view shows the death too: it finds the API right (or only adds to
    // the message), never calls the container alive, never moves the transition time.
    assert!(
        eventually_async(WAIT, || {
            unchanged().unwrap_or(0.0) > unchanged_before || writes().unwrap_or(0.0) > writes_before
        })
        .await,
        "the status manager never took the death up\n{}",
        agent.stderr()
    );
    drop(frozen);
    let after = patches(api, &dies.name, before);
    let transitions: Vec<&Value> = after
        .iter()
        .filter_map(|r| {
            r.body["status"]["conditions"]
                .as_array()?
                .iter()
                .find(|c| c["type"] == ALIVE)
        })
        .inspect(|c| assert_eq!(c["status"], "False", "{after:#?}"))
        // A patch leaves it out where it equals the base's (both within one second).
        .map(|c| &c["lastTransitionTime"])
        .filter(|t| !t.is_null())
        .collect();
    assert!(
        transitions.iter().all(|t| *t == transitions[0]),
        "the transition time moved: {after:#?}"
    );
    assert_eq!(
        served_alive(api, &dies).map(|c| c["status"].clone()),
        Some("False".into())
    );
    tracing::info!(
        waits = waits().unwrap_or(0.0),
        patches = after.len(),
        "the fast path and the status manager agreed"
    );
    Ok(())
}

/// The request timeout of `observer run` (its default): a fast request unanswered this long gives
/// its connection up, and the death to the status manager.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_hung_the_fast_path_still_sends_every_death_at_once() -> Result<()> {
    let Some((scene, specs)) =
        Scene::start_with(&["first", "second"], &["--realtime-priority", "10"]).await?
    else {
        return Ok(());
    };
    let (first, pid1) = scene.alive(&specs[0], Some(3)).await?;
    let (second, pid2) = scene.alive(&specs[1], Some(4)).await?;
    let Scene { api, agent, .. } = &scene;
    let errors = || metric(agent.listen, "observer_fast_path_write_errors_total");
    let before = api.recorded().len();
    api.hang_writes(true);
    // Held (code 0), from the fast path's own connections.
    let held = |pod: &str| {
        let pod = pod.to_string();
        move |r: &Recorded| {
            r.seq >= before
                && r.code == 0
                && status_patch_of(r, &pod)
                && alive_status(r) == Some("False")
                && r.user_agent.starts_with("observer/")
        }
    };
    go(pid1)?;
    let a = api
        .wait_for(WAIT, held(&first.name))
        .await
        .with_context(|| format!("the first death was not sent\n{}", agent.stderr()))?;
    go(pid2)?;
    // Within the first request's timeout, while it is still unanswered: a fast path that waited
    // for its answer (or for the connection's) would send the second only after it.
    let b = api
        .wait_for(REQUEST_TIMEOUT / 2, held(&second.name))
        .await
        .with_context(|| {
            format!(
                "the second death was not sent while the first was unanswered\n{}",
                agent.stderr()
            )
        })?;
    assert!(b.seq > a.seq);
    assert!(agent.healthy(), "{}", agent.stderr());
    // Given up after the timeout: counted, and left to the status manager.
    assert!(
        eventually_async(WAIT, || errors().is_some_and(|n| n >= 2.0)).await,
        "the unanswered fast writes were not counted as failed: {:?}\n{}",
        errors(),
        agent.stderr()
    );
    api.hang_writes(false);
    for pod in [&first, &second] {
        assert!(
            alive_patch(api, &pod.name, "False", before, RECOVERY)
                .await
                .is_some(),
            "{}: the death never reached the API once it answered again\n{}",
            pod.name,
            agent.stderr()
        );
        assert_eq!(
            served_alive(api, pod).map(|c| c["status"].clone()),
            Some("False".into())
        );
    }
    Ok(())
}

/// Connections opened from eight addresses and never finished (half a request line each), far
/// past the endpoint's caps: the agent's port stays answerable for the probes, and a death still
/// reaches the API at once (the kernel reader and the status manager share nothing with the
/// listener but the runtime's workers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_slow_connections_leaves_probes_and_deaths_unaffected() -> Result<()> {
    use tokio::io::AsyncWriteExt;
    let Some((scene, specs)) = Scene::start(&["flooded"]).await? else {
        return Ok(());
    };
    let (p, pid) = scene.alive(&specs[0], Some(3)).await?;
    let Scene { api, agent, .. } = &scene;
    let mut held = Vec::new();
    for peer in 2..10u8 {
        for _ in 0..40 {
            let sock = tokio::net::TcpSocket::new_v4()?;
            sock.bind(SocketAddr::from(([127, 0, 0, peer], 0)))?;
            let mut c = sock.connect(agent.listen).await?;
            // A closed connection (over the cap) refuses the write: that is the point.
            let _ = c.write_all(b"GET /metr").await;
            held.push(c);
        }
    }
    assert!(
        agent.healthy(),
        "/healthz during the flood:\n{}",
        agent.stderr()
    );
    let before = api.recorded().len();
    go(pid)?;
    alive_patch(api, &p.name, "False", before, WAIT)
        .await
        .with_context(|| format!("the death during the flood\n{}", agent.stderr()))?;
    assert!(agent.healthy());
    let said = eventually_async(Duration::from_secs(10), || {
        agent.stderr().contains("connection limit")
    })
    .await;
    assert!(said, "the refusals are said:\n{}", agent.stderr());
    drop(held);
    Ok(())
}

/// Credentials rotated on disk under a running agent (its kubeconfig replaced, now naming a
/// token file): the API server answers the fast path's death with 401, the fast path reads its
/// configuration again at once, and the next death goes out on its own connections with the new
/// token. The refused death reaches the API through the status manager.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_401_makes_the_fast_path_read_its_credentials_again() -> Result<()> {
    let Some((scene, specs)) = Scene::start(&["refused", "after"]).await? else {
        return Ok(());
    };
    let (first, p1) = scene.alive(&specs[0], Some(4)).await?;
    let (second, p2) = scene.alive(&specs[1], Some(5)).await?;
    let Scene { api, agent, .. } = &scene;
    let token = api.dir().join("token");
    // As the kubelet writes a projected token: no newline.
    std::fs::write(&token, "rotated-token")?;
    api.kubeconfig_with_token_file(&token)?;

    api.refuse(Some(401));
    let before = api.recorded().len();
    go(p1)?;
    api.wait_for(WAIT, |r| {
        r.seq >= before && r.code == 401 && status_patch_of(r, &first.name)
    })
    .await
    .context("the death was never tried")?;
    let reread = eventually_async(WAIT, || {
        agent
            .stderr()
            .contains("refused the fast status path's credentials (401)")
    })
    .await;
    assert!(reread, "the 401 is said:\n{}", agent.stderr());
    api.refuse(None);
    alive_patch(api, &first.name, "False", before, RECOVERY)
        .await
        .context("the refused death never reached the API")?;

    let before = api.recorded().len();
    go(p2)?;
    let fast = api
        .wait_for(WAIT, |r| {
            r.seq >= before
                && status_patch_of(r, &second.name)
                && r.user_agent.starts_with("observer/")
        })
        .await
        .with_context(|| format!("no fast path write after the 401\n{}", agent.stderr()))?;
    assert_eq!(
        (fast.code, fast.authorization.as_str()),
        (200, "Bearer rotated-token"),
        "the fast path's request carries the token read after the 401:\n{}",
        agent.stderr()
    );
    Ok(())
}

/// The fast path's writes answered without end (`kind`), two deaths one after the other: each
/// connection is dropped once its answer passed the fast path's cap (1 MiB), long before the
/// request timeout would have given it up; each death is written all the same, by the status
/// manager; the second death leaves the fast path at once (the real-time thread is not held
/// reading the first answer); the cause is counted, and said once.
async fn hostile_answers_drop_the_connection(kind: Hostile) -> Result<()> {
    let Some((scene, specs)) =
        Scene::start_with(&["first", "second"], &["--realtime-priority", "10"]).await?
    else {
        return Ok(());
    };
    let (first, p1) = scene.alive(&specs[0], Some(3)).await?;
    let (second, p2) = scene.alive(&specs[1], Some(4)).await?;
    let Scene { api, agent, .. } = &scene;
    let too_large = || metric(agent.listen, "observer_fast_path_responses_too_large_total");
    assert_eq!(too_large(), Some(0.0), "{}", agent.stderr());
    api.hostile_fast_writes(Some(kind));
    for (pod, pid) in [(&first, p1), (&second, p2)] {
        let before = api.recorded().len();
        let (ended, _) = api.hostile_ended();
        go(pid)?;
        let told = std::time::SystemTime::now();
        // The fast path's write, answered without end.
        let hostile = api
            .wait_for(WAIT, |r| {
                r.seq >= before
                    && r.code == 0
                    && status_patch_of(r, &pod.name)
                    && alive_status(r) == Some("False")
                    && r.user_agent.starts_with("observer/")
            })
            .await
            .with_context(|| format!("{}: no fast path write\n{}", pod.name, agent.stderr()))?;
        let sent_after = hostile.at.duration_since(told).unwrap_or_default();
        // Dropped by the agent: nothing else ends the answer. Well within the request timeout,
        // which would give the connection up too, later.
        let dropped = eventually_async(REQUEST_TIMEOUT / 2, || api.hostile_ended().0 > ended).await;
        let (_, sent) = api.hostile_ended();
        assert!(
            dropped,
            "{}: the endless answer was still read after {:?} ({sent} B)\n{}",
            pod.name,
            REQUEST_TIMEOUT / 2,
            agent.stderr()
        );
        tracing::info!(?kind, pod = %pod.name, ?sent_after, sent, "the fast path dropped the connection");
        // The status manager writes the death (every fast write is answered without end).
        let written = alive_patch(api, &pod.name, "False", before, RECOVERY)
            .await
            .with_context(|| {
                format!(
                    "{}: the death never reached the API\n{}",
                    pod.name,
                    agent.stderr()
                )
            })?;
        assert_eq!(written.user_agent, "observer", "{written:#?}");
        assert_eq!(
            served_alive(api, pod).map(|c| c["status"].clone()),
            Some("False".into())
        );
        // Sent at once from the real-time thread, for the second death too.
        assert!(
            sent_after < Duration::from_secs(2),
            "{}: the fast path wrote the death {sent_after:?} after it\n{}",
            pod.name,
            agent.stderr()
        );
        assert!(agent.healthy(), "{}", agent.stderr());
    }
    assert!(
        eventually_async(WAIT, || too_large().is_some_and(|n| n >= 2.0)).await,
        "the dropped connections were not counted: {:?}\n{}",
        too_large(),
        agent.stderr()
    );
    let said = |stderr: &str| stderr.matches("went past 1048576 bytes").count();
    assert!(
        eventually_async(WAIT, || said(&agent.stderr()) >= 1).await,
        "the cause is said:\n{}",
        agent.stderr()
    );
    assert_eq!(said(&agent.stderr()), 1, "said once:\n{}", agent.stderr());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_chunked_answer_drops_the_fast_connection() -> Result<()> {
    hostile_answers_drop_the_connection(Hostile::EndlessChunked).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_content_length_drops_the_fast_connection() -> Result<()> {
    hostile_answers_drop_the_connection(Hostile::HugeContentLength).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_past_the_cap_drops_the_fast_connection() -> Result<()> {
    hostile_answers_drop_the_connection(Hostile::HugeHead).await
}
