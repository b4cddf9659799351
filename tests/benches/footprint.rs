//! The agent's footprint: peak resident memory (VmHWM, start-up included), steady resident
//! memory, start-up time and CPU of each command, against a private containerd (the harness's)
//! and, for `observer run`, the recording API stand-in serving this node's pods:
//!   1. `observer check`, `observer status` and `observer watch --pods` on the node as it is;
//!   2. `observer run` (`--status-mode conditions`, the DaemonSet's default): start-up, idle CPU
//!      over a window (`OBSERVER_BENCH_IDLE_SECS`, default 60) beside a `sleep` doing nothing,
//!      then CPU and memory while 200 containers start, exit and are removed
//!      (`OBSERVER_BENCH_CHURN`), their pods in the API with the readiness gate, so every
//!      death is also a status write;
//!   3. the same with 1000 pods present: real sandboxes (pause) in containerd, one running
//!      container each, every pod in the API (`OBSERVER_BENCH_PODS`): start-up to `/readyz`,
//!      peak memory, idle CPU; `observer status` and `observer watch --pods` on that node.
//!
//!     cargo build --release -p observer && sudo cargo bench -p observer-tests --bench footprint
//!     (or: cargo xtask bench footprint)
//!
//! `OBSERVER_BENCH_BIN=<path>` measures another `observer` binary (an older build, say) with the
//! same steps.
#![allow(unused_crate_dependencies)] // a test/bench/bin target sees its package's whole dependency list
use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use observer::mem::Resident;
use observer_tests::{
    apiserver::{pod_object, ApiStandIn},
    endpoint::{free_listen, metric, ok},
    poll_until_async, require_containerd, ContainerSpec, Containerd, Pod, PodSpec,
};

const NODE: &str = "node-1";
/// The condition the churn's and the big node's pods gate readiness on: each container's
/// start and death is a status write.
const ALIVE: &str = "observer.dev/ContainersAlive";
const DEFAULT_PODS: usize = 1000;
/// Name prefix of the big node's pods (the churn's are `churn-<n>`).
const BIG_PREFIX: &str = "big-";
/// Pods churning at once, each one container at a time.
const CHURN_PODS: usize = 4;
const DEFAULT_CHURN: usize = 200;
const DEFAULT_IDLE: u64 = 60;
/// Sandboxes created at once while the big node is built (containerd and runc do the work).
const BUILDERS: usize = 4;
/// Time `observer watch --pods` runs before its resident size is read.
const WATCH_SECS: u64 = 10;
/// Start-up deadline: 1000 pods on a loaded 2-core machine.
const START_DEADLINE: Duration = Duration::from_secs(180);

fn main() -> Result<()> {
    if !require_containerd() {
        eprintln!("SKIPPED: the footprint benchmark runs the agent as root against containerd");
        return Ok(());
    }
    let bin = match std::env::var_os("OBSERVER_BENCH_BIN") {
        Some(p) => PathBuf::from(p),
        None => {
            let exe = std::env::current_exe()?;
            let p = exe
                .parent()
                .and_then(Path::parent)
                .context("target dir")?
                .join("observer");
            if !p.exists() {
                bail!(
                    "{} not built: cargo build --release -p observer (or cargo xtask bench footprint)",
                    p.display()
                );
            }
            p
        }
    };
    let cfg = Config {
        idle: Duration::from_secs(env_or("OBSERVER_BENCH_IDLE_SECS", DEFAULT_IDLE)),
        churn: env_or("OBSERVER_BENCH_CHURN", DEFAULT_CHURN as u64) as usize,
        pods: env_or("OBSERVER_BENCH_PODS", DEFAULT_PODS as u64) as usize,
    };
    // Two workers: the API stand-in answers the agent while the bench waits or churns.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(run(bin, cfg))
}

struct Config {
    idle: Duration,
    churn: usize,
    pods: usize,
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

async fn run(bin: PathBuf, cfg: Config) -> Result<()> {
    let logs = tempfile::tempdir()?;
    let ctrd = Arc::new(Containerd::start().await?);
    let api = Arc::new(ApiStandIn::start().await?);
    let cri = ctrd.socket().display().to_string();
    let ctx = Ctx {
        bin: bin.clone(),
        logs: logs.path().to_path_buf(),
        cri: cri.clone(),
        kubeconfig: api.kubeconfig()?.display().to_string(),
    };
    let ctrd_pid = ctrd.pid().context("containerd's pid")?;
    let mut t = Tables::default();

    // 1. The node as it is: no pods.
    t.mem.push(ctx.one_shot("observer check", &["check"])?);
    t.mem.push(ctx.one_shot(
        "observer status (one-shot), no pods",
        &["status", "--cri-endpoint", &cri],
    )?);
    t.mem
        .push(ctx.watch("observer watch --pods, no pods").await?);

    // 2. `observer run`, idle and then churning. The churn's pods are in the API before the
    // agent starts: the stand-in's watch sends no additions.
    let churn_pods = churn_sandboxes(&ctrd, &api).await?;
    let agent = ctx.spawn_run("run")?;
    let started = agent.wait_started().await?;
    let sleeper = Sleeper::start()?;
    let window = Window::start(&[agent.pid(), sleeper.pid(), ctrd_pid]);
    tokio::time::sleep(cfg.idle).await;
    let used = window.end();
    let steady = agent.resident().context("agent gone")?;
    t.idle.push(CpuRow::new(
        "`sleep` (a process doing nothing)",
        used[1],
        cfg.idle,
    ));
    t.idle
        .push(CpuRow::new("observer run, no pods", used[0], cfg.idle));
    t.idle.push(CpuRow::new(
        "containerd, no pods (for scale)",
        used[2],
        cfg.idle,
    ));
    drop(sleeper);

    t.churn
        .push(CpuRow::new("idle (above)", used[0], cfg.idle).with_rss(steady.now_kib));
    let died = "observer_pleg_events_total{type=\"ContainerDied\"}";
    let before = (agent.metric(died), writes(&api));
    let window = Window::start(&[agent.pid(), ctrd_pid]);
    let sampler = RssSampler::start(agent.pid());
    let churned = churn_containers(&ctrd, &churn_pods, cfg.churn).await?;
    let used = window.end();
    let max_rss = sampler.stop();
    // The last deaths' writes may still be in flight: they are counted, not awaited.
    let seen = agent.metric(died).zip(before.0).map(|(a, b)| a - b);
    let wrote = writes(&api) - before.1;
    for pod in &churn_pods {
        ctrd.stop_pod(pod).await?;
        ctrd.remove_pod(pod).await?;
    }
    t.churn.push(
        CpuRow::new(
            &format!(
                "{} containers churning ({} ContainerDied in the agent's PLEG, {wrote} status writes)",
                cfg.churn,
                seen.map_or("?".into(), |n| format!("{n:.0}"))
            ),
            used[0],
            churned,
        )
        .with_rss(max_rss)
        .per(cfg.churn),
    );
    t.churn.push(
        CpuRow::new("containerd during the churn (for scale)", used[1], churned).per(cfg.churn),
    );
    t.mem
        .push(agent.finish("observer run, no pods, then the churn", Some(started))?);

    // 3. 1000 pods.
    let built = Instant::now();
    let pods = build_node(&ctrd, &api, cfg.pods).await?;
    t.built = Some((pods.len(), built.elapsed()));
    eprintln!(
        "{} pods running, in {:.0} s",
        pods.len(),
        built.elapsed().as_secs_f64()
    );
    let n = pods.len();
    t.mem.push(ctx.one_shot(
        &format!("observer status (one-shot), {n} pods"),
        &["status", "--cri-endpoint", &cri],
    )?);
    t.mem.push(
        ctx.watch(&format!("observer watch --pods, {n} pods"))
            .await?,
    );
    let agent = ctx.spawn_run("run-big")?;
    let started = agent.wait_started().await?;
    // Ready means the runtime's first relist is answered; the status writes of every pod's
    // first condition follow it, and are part of what start-up costs.
    let all_written = poll_until_async(START_DEADLINE, || {
        (pods_written(&api, BIG_PREFIX) >= n).then(|| agent.born.elapsed())
    })
    .await;
    t.seen = [
        "observer_kernel_pods",
        "observer_kernel_containers",
        "observer_tracked_pods",
        "observer_tracked_containers",
    ]
    .map(|m| agent.metric(m));
    t.all_written = all_written;
    let sleeper = Sleeper::start()?;
    let window = Window::start(&[agent.pid(), sleeper.pid(), ctrd_pid]);
    tokio::time::sleep(cfg.idle).await;
    let used = window.end();
    t.idle.push(CpuRow::new(
        &format!("observer run, {n} pods"),
        used[0],
        cfg.idle,
    ));
    t.idle
        .push(CpuRow::new("`sleep`, same window", used[1], cfg.idle));
    t.idle.push(CpuRow::new(
        &format!("containerd, {n} pods (for scale)"),
        used[2],
        cfg.idle,
    ));
    drop(sleeper);
    t.mem
        .push(agent.finish(&format!("observer run, {n} pods"), Some(started))?);
    t.pods = n;
    let removing = Instant::now();
    remove_node(&ctrd, pods).await?;
    eprintln!(
        "{n} pods removed in {:.0} s",
        removing.elapsed().as_secs_f64()
    );

    print_tables(&bin, &t, cfg.idle);
    // Stops and removes every sandbox (Containerd's Drop); a bench that failed above does too.
    drop(api);
    drop(ctrd);
    Ok(())
}

/// Status writes (pod status patches) the stand-in received.
fn writes(api: &ApiStandIn) -> usize {
    api.recorded()
        .iter()
        .filter(|r| r.method == "PATCH" && r.path().ends_with("/status"))
        .count()
}

/// Pods named `<prefix>...` with at least one status write.
fn pods_written(api: &ApiStandIn, prefix: &str) -> usize {
    let pods: std::collections::HashSet<String> = api
        .recorded()
        .iter()
        .filter(|r| r.method == "PATCH" && r.path().ends_with("/status"))
        .filter_map(|r| r.path().split("/pods/").nth(1).map(str::to_string))
        .filter(|p| p.starts_with(prefix))
        .collect();
    pods.len()
}

/// `pod`, as the API serves it: on this node, gated on [`ALIVE`].
fn serve(api: &ApiStandIn, pod: &Pod, containers: &[&str]) {
    let cs: Vec<(&str, Option<&str>)> = containers.iter().map(|c| (*c, None)).collect();
    api.add_pod(pod_object(
        &pod.name,
        &pod.namespace,
        &pod.uid,
        NODE,
        &cs,
        Some(ALIVE),
    ));
}

/// `n` pods, [`BUILDERS`] at a time: a sandbox each, one `sleep` container in it, and the pod in
/// the API.
async fn build_node(ctrd: &Arc<Containerd>, api: &Arc<ApiStandIn>, n: usize) -> Result<Vec<Pod>> {
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..BUILDERS {
        let (ctrd, api, next) = (Arc::clone(ctrd), Arc::clone(api), Arc::clone(&next));
        tasks.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                let mut pod = ctrd
                    .run_sandbox(&PodSpec::new(format!("{BIG_PREFIX}{i:04}")))
                    .await?;
                ctrd.add_container(&mut pod, ContainerSpec::new("app"))
                    .await?;
                serve(&api, &pod, &["app"]);
                mine.push(pod);
                if i % 100 == 99 {
                    eprintln!("{} pods", i + 1);
                }
            }
            anyhow::Ok(mine)
        }));
    }
    let mut pods = Vec::new();
    for t in tasks {
        pods.extend(t.await??);
    }
    Ok(pods)
}

/// Stops and removes `pods`, [`BUILDERS`] at a time (the harness's own teardown goes one by one).
async fn remove_node(ctrd: &Arc<Containerd>, pods: Vec<Pod>) -> Result<()> {
    let pods = Arc::new(std::sync::Mutex::new(pods));
    let mut tasks = Vec::new();
    for _ in 0..BUILDERS {
        let (ctrd, pods) = (Arc::clone(ctrd), Arc::clone(&pods));
        tasks.push(tokio::spawn(async move {
            loop {
                let Some(pod) = pods.lock().expect("pods lock").pop() else {
                    break;
                };
                ctrd.stop_pod(&pod).await?;
                ctrd.remove_pod(&pod).await?;
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}

/// Where and how the agent runs.
struct Ctx {
    bin: PathBuf,
    logs: PathBuf,
    cri: String,
    kubeconfig: String,
}

impl Ctx {
    fn command(&self, log: &str, args: &[&str]) -> Result<Command> {
        let mut cmd = Command::new(&self.bin);
        cmd.args(args)
            // A backtrace captured on an error path symbolizes the binary's debug info: 100+ MB,
            // which no DaemonSet pays (the variables are unset there).
            .env_remove("RUST_BACKTRACE")
            .env_remove("RUST_LIB_BACKTRACE")
            .env("OBSERVER_STATE_DIR", self.logs.join(format!("{log}.state")))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(self.logs.join(format!("{log}.log")))?);
        Ok(cmd)
    }

    fn spawn(&self, log: &str, args: &[&str]) -> Result<Agent> {
        let child = self.command(log, args)?.spawn().context("spawn observer")?;
        Ok(Agent {
            child,
            reaped: false,
            listen: None,
            born: Instant::now(),
            log: self.logs.join(format!("{log}.log")),
        })
    }

    /// `observer run` as the DaemonSet runs it (conditions), against the API stand-in and the
    /// harness's runtime, on a free port.
    fn spawn_run(&self, log: &str) -> Result<Agent> {
        let addr = free_listen();
        let listen = addr.to_string();
        let mut agent = self.spawn(
            log,
            &[
                "run",
                "--kubeconfig",
                &self.kubeconfig,
                "--node-name",
                NODE,
                // A stand-in API reviews no tokens: the scrapes here are on loopback.
                "--metrics-access",
                "open",
                "--listen",
                &listen,
                "--cri-endpoint",
                &self.cri,
            ],
        )?;
        agent.listen = Some(addr);
        Ok(agent)
    }

    /// `observer watch --pods` for [`WATCH_SECS`], then stopped.
    async fn watch(&self, name: &str) -> Result<MemRow> {
        let log = name.replace(|c: char| !c.is_ascii_alphanumeric(), "-");
        let watch = self.spawn(&log, &["watch", "--pods", "--cri-endpoint", &self.cri])?;
        tokio::time::sleep(Duration::from_secs(WATCH_SECS)).await;
        watch.finish(name, None)
    }

    /// Runs a command to its end; its peak from the kernel's own accounting (wait4).
    fn one_shot(&self, name: &str, args: &[&str]) -> Result<MemRow> {
        let log = name.replace(|c: char| !c.is_ascii_alphanumeric(), "-");
        let start = Instant::now();
        let child = self.command(&log, args)?.spawn()?;
        let (code, usage) = wait4(child.id())?;
        let wall = start.elapsed();
        if code != 0 {
            let text =
                std::fs::read_to_string(self.logs.join(format!("{log}.log"))).unwrap_or_default();
            bail!("{name} exited {code}: {text}");
        }
        Ok(MemRow {
            name: name.into(),
            peak_kib: usage.max_rss_kib,
            steady_kib: None,
            cpu: Some(usage.cpu),
            started: None,
            wall: Some(wall),
        })
    }
}

/// A long-running `observer`.
struct Agent {
    child: Child,
    reaped: bool,
    /// `observer run`'s HTTP port (0: none).
    /// `--listen` of `observer run`.
    listen: Option<SocketAddr>,
    born: Instant,
    log: PathBuf,
}

/// When `observer run` answered: `/healthz` 200 (the probes are attached and the start-up walk
/// is done: the HTTP endpoint opens after both) and `/readyz` 200 (the first relist of the runtime
/// and the pod requests it started were answered).
#[derive(Clone, Copy)]
struct Started {
    healthz: Duration,
    readyz: Duration,
}

impl Agent {
    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn resident(&self) -> Option<Resident> {
        Resident::of(Some(self.pid()))
    }

    async fn wait_started(&self) -> Result<Started> {
        let at = |path: &'static str| {
            poll_until_async(START_DEADLINE, move || {
                self.listen
                    .is_some_and(|a| ok(a, path))
                    .then(|| self.born.elapsed())
            })
        };
        let log = || std::fs::read_to_string(&self.log).unwrap_or_default();
        let healthz = at("/healthz")
            .await
            .with_context(|| format!("no /healthz 200:\n{}", log()))?;
        let readyz = at("/readyz")
            .await
            .with_context(|| format!("no /readyz 200:\n{}", log()))?;
        Ok(Started { healthz, readyz })
    }

    fn metric(&self, series: &str) -> Option<f64> {
        metric(self.listen?, series)
    }

    /// Reads the resident sizes, then stops it (SIGTERM) and reaps it.
    fn finish(mut self, name: &str, started: Option<Started>) -> Result<MemRow> {
        let r = self.resident().context("the agent died early")?;
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(self.pid())?),
            nix::sys::signal::Signal::SIGTERM,
        )?;
        let (_, usage) = wait4(self.pid())?;
        self.reaped = true;
        Ok(MemRow {
            name: name.into(),
            peak_kib: r.peak_kib.max(usage.max_rss_kib),
            steady_kib: Some(r.now_kib),
            cpu: None,
            started,
            wall: None,
        })
    }
}

/// A bench that fails half-way leaves no agent behind.
impl Drop for Agent {
    fn drop(&mut self) {
        if !self.reaped {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

struct Usage {
    max_rss_kib: u64,
    cpu: Duration,
}

/// Reaps our child `pid` with its resource usage.
fn wait4(pid: u32) -> Result<(i32, Usage)> {
    let mut status = 0;
    // SAFETY: rusage is plain data, all zeroes a valid value; wait4 fills it in.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `pid` is a child of this process not reaped yet; both pointers are to live locals.
    let r = unsafe { libc::wait4(i32::try_from(pid)?, &mut status, 0, &mut ru) };
    if r < 0 {
        bail!("wait4 {pid}: {}", std::io::Error::last_os_error());
    }
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    let code = if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        128 + libc::WTERMSIG(status)
    };
    Ok((
        code,
        Usage {
            max_rss_kib: ru.ru_maxrss as u64,
            cpu: tv(ru.ru_utime) + tv(ru.ru_stime),
        },
    ))
}

/// CPU time (user + system) a process has used, from /proc/<pid>/stat.
fn cpu_used(pid: u32) -> Duration {
    // SAFETY: sysconf only reads a constant of the system.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    let ticks = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            // Fields after the command's closing parenthesis, from field 3 (state) on: utime and
            // stime are fields 14 and 15.
            let rest = s.rsplit_once(')')?.1;
            let f: Vec<u64> = rest
                .split_whitespace()
                .skip(11)
                .take(2)
                .filter_map(|v| v.parse().ok())
                .collect();
            (f.len() == 2).then(|| f[0] + f[1])
        })
        .unwrap_or(0);
    Duration::from_millis(ticks * 1000 / hz)
}

/// CPU used by a few processes over the same window.
struct Window {
    pids: Vec<u32>,
    start: Vec<Duration>,
}

impl Window {
    fn start(pids: &[u32]) -> Self {
        Self {
            pids: pids.to_vec(),
            start: pids.iter().map(|&p| cpu_used(p)).collect(),
        }
    }

    fn end(self) -> Vec<Duration> {
        self.pids
            .iter()
            .zip(self.start)
            .map(|(&p, s)| cpu_used(p).saturating_sub(s))
            .collect()
    }
}

/// Samples a process's VmRSS every 200 ms on a thread; `stop` gives the largest seen.
struct RssSampler {
    stop: Arc<AtomicUsize>,
    thread: std::thread::JoinHandle<u64>,
}

impl RssSampler {
    fn start(pid: u32) -> Self {
        let stop = Arc::new(AtomicUsize::new(0));
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut max = 0;
            while flag.load(Ordering::Relaxed) == 0 {
                if let Some(r) = Resident::of(Some(pid)) {
                    max = max.max(r.now_kib);
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            max
        });
        Self { stop, thread }
    }

    fn stop(self) -> u64 {
        self.stop.store(1, Ordering::Relaxed);
        self.thread.join().unwrap_or(0)
    }
}

/// A `sleep` process: the baseline of doing nothing.
struct Sleeper(Child);

impl Sleeper {
    fn start() -> Result<Self> {
        Ok(Self(Command::new("sleep").arg("3600").spawn()?))
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Sleeper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// [`CHURN_PODS`] sandboxes for the churn, in the API.
async fn churn_sandboxes(ctrd: &Containerd, api: &ApiStandIn) -> Result<Vec<Pod>> {
    let mut pods = Vec::new();
    for i in 0..CHURN_PODS {
        let pod = ctrd
            .run_sandbox(&PodSpec::new(format!("churn-{i}")))
            .await?;
        serve(api, &pod, &["main"]);
        pods.push(pod);
    }
    Ok(pods)
}

/// `total` containers in `pods`, one at a time in each: each is created and started, exits by
/// itself, and is removed. Returns the wall time.
async fn churn_containers(ctrd: &Arc<Containerd>, pods: &[Pod], total: usize) -> Result<Duration> {
    let start = Instant::now();
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for pod in pods {
        let (ctrd, next, mut pod) = (Arc::clone(ctrd), Arc::clone(&next), pod.clone());
        tasks.push(tokio::spawn(async move {
            let mut attempt = 0;
            while next.fetch_add(1, Ordering::Relaxed) < total {
                let spec = ContainerSpec::sh("main", "sleep 0.2; exit 0").restart_count(attempt);
                attempt += 1;
                let id = ctrd.add_container(&mut pod, spec).await?;
                ctrd.wait_exited(&id, Duration::from_secs(30)).await?;
                ctrd.remove_container(&id).await?;
                pod.containers.clear();
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(start.elapsed())
}

struct MemRow {
    name: String,
    peak_kib: u64,
    steady_kib: Option<u64>,
    cpu: Option<Duration>,
    started: Option<Started>,
    wall: Option<Duration>,
}

struct CpuRow {
    name: String,
    used: Duration,
    over: Duration,
    rss_kib: Option<u64>,
    per: Option<usize>,
}

impl CpuRow {
    fn new(name: &str, used: Duration, over: Duration) -> Self {
        Self {
            name: name.into(),
            used,
            over,
            rss_kib: None,
            per: None,
        }
    }

    fn with_rss(mut self, kib: u64) -> Self {
        self.rss_kib = Some(kib);
        self
    }

    fn per(mut self, n: usize) -> Self {
        self.per = Some(n);
        self
    }

    fn share(&self) -> f64 {
        self.used.as_secs_f64() / self.over.as_secs_f64() * 100.0
    }
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

/// Everything measured, printed at the end.
#[derive(Default)]
struct Tables {
    mem: Vec<MemRow>,
    idle: Vec<CpuRow>,
    churn: Vec<CpuRow>,
    /// Pods of the big node, and the time to build it.
    pods: usize,
    built: Option<(usize, Duration)>,
    /// From the big node's agent, once ready: observer_kernel_pods, observer_kernel_containers,
    /// observer_tracked_pods, observer_tracked_containers.
    seen: [Option<f64>; 4],
    /// When every big pod's first status write had reached the stand-in.
    all_written: Option<Duration>,
}

fn print_tables(bin: &Path, t: &Tables, idle: Duration) {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "Agent footprint: {}, kernel {}, {cores} cores; `observer run` in conditions mode against the API stand-in, the harness's containerd as the runtime\n",
        bin.display(),
        kernel.trim()
    );
    println!("| command | peak RSS (VmHWM, start-up included) | RSS at the end | start-up | CPU |");
    println!("|---|---:|---:|---:|---:|");
    for r in &t.mem {
        let steady = r.steady_kib.map_or("(exits)".into(), mib);
        let started = match (r.started, r.wall) {
            (Some(s), _) => format!(
                "/healthz {:.2} s, /readyz {:.2} s",
                s.healthz.as_secs_f64(),
                s.readyz.as_secs_f64()
            ),
            (None, Some(w)) => format!("runs {:.2} s", w.as_secs_f64()),
            (None, None) => "-".into(),
        };
        let cpu = r
            .cpu
            .map_or("-".into(), |c| format!("{:.2} s", c.as_secs_f64()));
        println!(
            "| {} | {} | {steady} | {started} | {cpu} |",
            r.name,
            mib(r.peak_kib)
        );
    }
    let show = |v: Option<f64>| v.map_or("?".into(), |v| format!("{v:.0}"));
    if let Some((n, took)) = t.built {
        println!(
            "\n{n} pods (a pause sandbox and one `sleep` container each, every pod in the API) built in {:.0} s.",
            took.as_secs_f64()
        );
    }
    println!(
        "At {} pods, once ready, the agent's kernel model held {} pods and {} containers, its reconciler tracked {} pods and {} containers; every pod's first status write had reached the API {} after the agent's start.",
        t.pods,
        show(t.seen[0]),
        show(t.seen[1]),
        show(t.seen[2]),
        show(t.seen[3]),
        t.all_written
            .map_or("(not within the deadline)".into(), |d| format!("{:.2} s", d.as_secs_f64()))
    );
    println!(
        "\nIdle CPU over {} s (utime + stime from /proc/<pid>/stat, 10 ms ticks)\n",
        idle.as_secs()
    );
    println!("| process | CPU time | % of one core |");
    println!("|---|---:|---:|");
    for c in &t.idle {
        println!(
            "| {} | {} ms | {:.3} % |",
            c.name,
            c.used.as_millis(),
            c.share()
        );
    }
    println!("\nContainer churn against the same `observer run` (no other pods)\n");
    println!(
        "| phase | wall time | CPU time | % of one core | CPU per container | RSS (largest sample) |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for c in &t.churn {
        let per = c.per.map_or("-".into(), |n| {
            format!("{:.1} ms", c.used.as_secs_f64() * 1000.0 / n as f64)
        });
        println!(
            "| {} | {:.1} s | {} ms | {:.2} % | {per} | {} |",
            c.name,
            c.over.as_secs_f64(),
            c.used.as_millis(),
            c.share(),
            c.rss_kib.map_or("-".into(), mib)
        );
    }
}
