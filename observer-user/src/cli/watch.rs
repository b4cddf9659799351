//! `observer watch`: the kernel's view of process lifecycle, live.
use std::{
    collections::HashSet,
    os::{fd::AsFd, unix::net::UnixStream},
    path::PathBuf,
    process::ExitCode,
    sync::{Arc, Mutex},
};

use anyhow::{bail, Context};

use crate::present::render::{
    pleg_line, watch_line, write_json, write_pleg_text, write_text, Format, PlegLine, WatchLine,
};
use crate::{
    cgroup::{CgroupIndex, ContainerId, HierarchyMount, KubeRoots},
    kernel::{EventReader, KernelEvent, ProbeOptions, Probes, Wait, Wake, Watch},
    model::BootClock,
    pipeline::{
        unified_mount, watch_roots, Hook, HookFactory, KernelPipeline, PipelineConfig,
        ReaderThread, DEFAULT_QUEUE, HEARTBEAT,
    },
    pleg::{PlegEventType, PodLifecycleEvent},
};

#[derive(Debug, clap::Args)]
pub struct WatchArgs {
    /// Limit exec/exit events to this cgroup subtree, relative to the cgroup2 mount (e.g.
    /// /kubepods.slice or /kubepods). Repeatable. With --pods: where kubelet's pods are, as
    /// `observer run --cgroup-root` takes it (kubelet's --cgroup-root, or a kubepods cgroup).
    /// Default: kubelet's pod cgroups on this node if they exist, else everything.
    #[arg(long = "cgroup-root", value_name = "PATH", conflicts_with = "all")]
    pub cgroup_roots: Vec<String>,
    /// Watch every process on the host.
    #[arg(long)]
    pub all: bool,
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    /// Also report the exit of every thread, not only of whole processes.
    #[arg(long)]
    pub threads: bool,
    /// Print pod lifecycle events (ContainerStarted, ContainerDied, OOMKill, ...) instead of
    /// raw kernel events. Containers that already run are found by one walk of the cgroup tree.
    #[arg(long)]
    pub pods: bool,
    /// Where the host's cgroup filesystems are mounted, when observer runs in a container that
    /// mounts them elsewhere (e.g. /host/sys/fs/cgroup).
    #[arg(long, value_name = "DIR")]
    pub cgroupfs: Option<PathBuf>,
    /// With --pods: the CRI socket (a path or unix:///path). Default: containerd's, else
    /// CRI-O's. Where a runtime answers, deaths from before the watch started are printed too
    /// (from its account and the kernel log), as kubelet's first relist reports them.
    #[arg(long, value_name = "ENDPOINT", requires = "pods")]
    pub cri_endpoint: Option<crate::cri::CriEndpoint>,
    #[command(flatten)]
    pub state: super::StateDirArg,
    #[command(flatten)]
    pub realtime: super::RealtimeArg,
}

pub(super) async fn run(args: WatchArgs) -> anyhow::Result<ExitCode> {
    let unified = unified_mount(args.cgroupfs.as_deref())?;
    let watch = resolve_watch(&args, &unified)?;
    let opts = ProbeOptions {
        watch,
        thread_exits: args.threads,
        // With --all or --threads every record is printed as it comes; otherwise only a
        // container init's, OOM kills and cgroup events wake the reader, and the rest follow
        // within kernel::QUIET_RECORD_DELAY (QUIET_IDLE_DELAY after an idle spell).
        wake: if args.all || args.threads {
            Wake::Every
        } else {
            Wake::Selective
        },
        ..Default::default()
    };
    let reader = super::reader_thread(args.realtime.realtime_priority);
    if args.pods {
        let endpoint = args
            .cri_endpoint
            .clone()
            .unwrap_or_else(crate::cri::CriEndpoint::detect);
        if endpoint.path().exists() && !args.all {
            return watch_pods_reconciled(
                args.format,
                endpoint,
                args.cgroupfs.clone(),
                args.cgroup_roots.clone(),
                args.state.state_dir.clone(),
                reader,
            )
            .await;
        }
        tracing::info!(%endpoint, "no container runtime socket: pod events from the kernel alone");
        let cfg = PipelineConfig {
            roots: KubeRoots::detect(&unified, &args.cgroup_roots)?,
            unified,
            probes: opts,
            queue: DEFAULT_QUEUE,
        };
        return watch_pods(args.format, cfg, reader).await;
    }
    let mut probes = Probes::load(&opts)?;
    let events = probes.events()?;
    // What each cgroup is, by kubelet's roots on this node.
    let mut cgroups = CgroupIndex::new(unified.clone(), KubeRoots::detect::<&str>(&unified, &[])?);
    cgroups.scan();
    tracing::info!(cgroups = cgroups.len(), "watching; Ctrl-C to stop");

    // The reader and the printer on a thread of their own (real-time if asked); this task waits
    // for Ctrl-C or for the thread to end (stdout closed, the reader failed).
    let stdout = super::stdout::Stdout::open()?;
    let printer = Printer {
        out: stdout.clone(),
        format: args.format,
        cgroups,
        written: 0,
    };
    let (stop, stop_rx) = UnixStream::pair()?;
    let (done_tx, done) = tokio::sync::oneshot::channel::<()>();
    let realtime = args.realtime.realtime_priority;
    let thread = std::thread::Builder::new()
        .name("observer-watch".into())
        .spawn(move || {
            let out = print_events(events, printer, &stop_rx, realtime);
            let _ = done_tx.send(());
            out
        })?;
    let drained = tokio::select! {
        _ = super::shutdown_signal() => None,
        _ = done => None,
        // Stdout closed while its reader was behind.
        e = stdout.drain() => Some(e),
    };
    drop(stop);
    let (written, malformed, result) = thread
        .join()
        .map_err(|p| anyhow::anyhow!("the watch thread panicked: {p:?}"))?;
    let counters = probes.counters()?;
    stdout.finish();
    eprintln!(
        "observer watch: stopped; {written} events written, {} lines dropped (stdout not read), {} records dropped by the kernel (ring buffer full), {malformed} malformed",
        stdout.dropped(),
        counters.ringbuf_drops,
    );
    finish(match drained {
        Some(e) if result.is_ok() => Err(e.into()),
        _ => result,
    })
}

/// The raw watch's loop, on its own thread: until `stop` hangs up, stdout closes or the reader
/// fails. Returns what it wrote, the malformed records, and how it ended.
fn print_events(
    mut reader: EventReader,
    mut printer: Printer,
    stop: &UnixStream,
    realtime: Option<u8>,
) -> (u64, u64, anyhow::Result<()>) {
    if let Some(priority) = realtime {
        crate::sched::realtime_or_say_once(priority, "the kernel reader thread");
    }
    let result = (|| -> anyhow::Result<()> {
        loop {
            match reader.next_blocking(HEARTBEAT, Some(stop.as_fd()), &mut [])? {
                Wait::Event(ev) => {
                    // Follows NTP steps in the printed times.
                    reader.refresh_clock();
                    printer.emit(ev, &reader)?;
                    while let Some(ev) = reader.try_next() {
                        printer.emit(ev, &reader)?;
                    }
                    printer.out.flush()?;
                }
                Wait::Idle | Wait::Io => {}
                Wait::Stopped => return Ok(()),
            }
        }
    })();
    (printer.written, reader.malformed(), result)
}

struct Printer {
    out: super::stdout::Stdout,
    format: Format,
    cgroups: CgroupIndex,
    written: u64,
}

impl Printer {
    fn emit(&mut self, ev: KernelEvent, reader: &EventReader) -> std::io::Result<()> {
        match &ev {
            KernelEvent::CgroupMkdir(c) => {
                self.cgroups.insert(c.id, &c.path);
            }
            KernelEvent::CgroupRmdir(c) => {
                // Resolve first so the line still carries the pod and container of the removed cgroup.
                let line = watch_line(&ev, reader.wall_time(&ev), &mut self.cgroups);
                self.write(&line)?;
                self.cgroups.remove(c.id);
                return Ok(());
            }
            _ => {}
        }
        let line = watch_line(&ev, reader.wall_time(&ev), &mut self.cgroups);
        self.write(&line)
    }

    fn write(&mut self, line: &WatchLine<'_>) -> std::io::Result<()> {
        self.written += 1;
        let format = self.format;
        self.out.line(|buf| match format {
            Format::Json => write_json(buf, line),
            Format::Text => write_text(buf, line),
        })
    }
}

/// `--pods`' lines, written on the kernel loop's thread as the PLEG sends each event (real-time
/// with `--realtime-priority`): a death reaches stdout without waiting for a normal-priority
/// task's turn behind the node's workloads. A reader of stdout that stops reading costs lines
/// (counted), never that thread's turn (`super::stdout`).
struct PodPrinter {
    out: super::stdout::Stdout,
    format: Format,
    clock: BootClock,
    /// What was printed, so that the catch-up after the first relist repeats nothing.
    died: HashSet<ContainerId>,
    killed: HashSet<(ContainerId, u32)>,
    /// Per container at its memory limit: when its last limit-hit line was printed, and the hits
    /// since (one line per [`LIMIT_LINE_EVERY`]: a cgroup sitting at its limit is reported ten
    /// times a second by the kernel).
    limit_lines: std::collections::HashMap<ContainerId, (crate::kernel::BootNs, u64)>,
    /// What each container's memory warning lines told so far.
    told: std::collections::HashMap<ContainerId, crate::pressure::Told>,
    /// The first write error (stdout closed): the main task ends with it.
    failed: Option<std::io::Error>,
}

/// At most one `MemoryLimitHit` line per container this often (the hits between are summed).
const LIMIT_LINE_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// The printer, shared by the loop's thread and the main task (the catch-up).
#[derive(Clone)]
struct SharedPrinter(Arc<Mutex<PodPrinter>>, Arc<tokio::sync::Notify>);

impl SharedPrinter {
    fn new(format: Format, clock: &BootClock, out: super::stdout::Stdout) -> Self {
        Self(
            Arc::new(Mutex::new(PodPrinter {
                out,
                format,
                clock: clock.clone(),
                died: HashSet::new(),
                killed: HashSet::new(),
                limit_lines: std::collections::HashMap::new(),
                told: std::collections::HashMap::new(),
                failed: None,
            })),
            Arc::new(tokio::sync::Notify::new()),
        )
    }

    /// Writes `line` (and flushes when `flush`); a failure is kept and the main task woken.
    fn write(&self, line: &PlegLine, flush: bool) {
        let mut p = crate::sync::lock(&self.0);
        if p.failed.is_some() {
            return;
        }
        let format = p.format;
        let r = p
            .out
            .line(|buf| match format {
                Format::Json => serde_json::to_writer(&mut *buf, line)
                    .map_err(std::io::Error::from)
                    .map(|_| buf.push(b'\n')),
                Format::Text => write_pleg_text(buf, line),
            })
            .and_then(|_| if flush { p.out.flush() } else { Ok(()) });
        if let Err(e) = r {
            p.failed = Some(e);
            self.1.notify_one();
        }
    }

    /// Resolves once a write failed, with its error.
    async fn failed(&self) -> std::io::Error {
        loop {
            let notified = self.1.notified();
            if let Some(e) = crate::sync::lock(&self.0).failed.take() {
                return e;
            }
            notified.await;
        }
    }

    fn flush(&self) {
        let mut p = crate::sync::lock(&self.0);
        if p.failed.is_none() {
            if let Err(e) = p.out.flush() {
                p.failed = Some(e);
                self.1.notify_one();
            }
        }
    }
}

impl Hook for SharedPrinter {
    fn event(&mut self, ev: &PodLifecycleEvent, _sent: std::time::SystemTime) {
        let line = {
            let mut p = crate::sync::lock(&self.0);
            if let Some(id) = ev.container_id() {
                match ev.kind() {
                    PlegEventType::LimitHit => {
                        let hits = match &ev.event {
                            crate::pleg::PlegEvent::LimitHit { hit, .. } => hit.hits,
                            _ => 0,
                        };
                        let every = LIMIT_LINE_EVERY.as_nanos() as u64;
                        match p.limit_lines.get_mut(&id) {
                            Some((last, pending)) if ev.at.0.saturating_sub(last.0) < every => {
                                *pending += hits;
                                return;
                            }
                            _ => {}
                        }
                        let pending = p.limit_lines.insert(id, (ev.at, 0)).map_or(0, |(_, n)| n);
                        let mut line = pleg_line(ev, p.clock.to_system_time(ev.at));
                        if let Some(l) = &mut line.limit {
                            l.limit_hits = hits + pending;
                        }
                        drop(p);
                        self.write(&line, false);
                        return;
                    }
                    PlegEventType::ContainerRemoved => {
                        p.limit_lines.remove(&id);
                        p.told.remove(&id);
                    }
                    PlegEventType::ContainerDied => {
                        p.died.insert(id);
                        p.limit_lines.remove(&id);
                    }
                    PlegEventType::OomKill => {
                        if let Some(o) = ev.oom() {
                            p.killed.insert((id, o.victim.tgid));
                        }
                    }
                    _ => {}
                }
            }
            pleg_line(ev, p.clock.to_system_time(ev.at))
        };
        self.write(&line, false);
    }

    fn batch_end(&mut self) {
        self.flush();
    }
}

/// Makes the printer once the pipeline's clock exists; `slot` keeps it for the main task.
fn printer_factory(
    format: Format,
    out: super::stdout::Stdout,
    slot: Arc<Mutex<Option<SharedPrinter>>>,
) -> HookFactory {
    Box::new(move |clock: &BootClock| {
        let p = SharedPrinter::new(format, clock, out);
        *crate::sync::lock(&slot) = Some(p.clone());
        Box::new(p)
    })
}

/// `--pods`: kernel events through the PLEG, which runs where `reader` says, and printed there.
async fn watch_pods(
    format: Format,
    cfg: PipelineConfig,
    reader: ReaderThread,
) -> anyhow::Result<ExitCode> {
    let slot = Arc::new(Mutex::new(None));
    let stdout = super::stdout::Stdout::open()?;
    let (pipeline, mut rx) = KernelPipeline::start_with(
        cfg,
        BootClock::new(),
        Some(printer_factory(format, stdout.clone(), Arc::clone(&slot))),
    )?;
    let printer = crate::sync::lock(&slot)
        .take()
        .context("the printer was not made")?;
    // The start-up walk's lines.
    printer.flush();
    tracing::info!("watching pods; Ctrl-C to stop");
    let mut task = pipeline.spawn(reader, || {})?;
    let shutdown = super::shutdown_signal();
    tokio::pin!(shutdown);
    let drain = stdout.drain();
    tokio::pin!(drain);
    let result: anyhow::Result<()> = async {
        loop {
            tokio::select! {
                biased;
                _ = &mut shutdown => return Ok(()),
                e = task.stopped() => return Err(e.into()),
                e = printer.failed() => return Err(e.into()),
                e = &mut drain => return Err(e.into()),
                // The lines are written on the loop's thread; the queue is only drained.
                ev = rx.recv() => if ev.is_none() { return Ok(()) },
            }
        }
    }
    .await;
    printer.flush();
    stdout.finish();
    let s = task.health().stats().pleg;
    eprintln!(
        "observer watch: stopped; {} kernel records dropped, {} kernel events, {} lifecycle events, {} unattributed, {} resyncs, {} lines dropped (stdout not read)",
        task.kernel_counters()?.ringbuf_drops, s.kernel_events, s.lifecycle_events, s.unattributed, s.resyncs, stdout.dropped()
    );
    finish(result)
}

/// `--pods` beside a runtime: the kernel's events live (printed on the loop's thread), and once
/// the first relist settled, the deaths and OOM kills the agent did not see happen (it started
/// after them), each saying how it is known.
async fn watch_pods_reconciled(
    format: Format,
    endpoint: crate::cri::CriEndpoint,
    cgroupfs: Option<PathBuf>,
    cgroup_roots: Vec<String>,
    state_dir: PathBuf,
    reader: ReaderThread,
) -> anyhow::Result<ExitCode> {
    use crate::agent::{Agent, AgentConfig, AgentParts};
    let mut cfg = AgentConfig::new(endpoint);
    cfg.cgroupfs = cgroupfs;
    cfg.cgroup_roots = cgroup_roots;
    cfg.reader = reader;
    cfg.reconcile.state_dir = Some(state_dir);
    let slot = Arc::new(Mutex::new(None));
    let stdout = super::stdout::Stdout::open()?;
    let mut parts = AgentParts::for_node(cfg)?;
    parts.hook = Some(printer_factory(format, stdout.clone(), Arc::clone(&slot)));
    let mut agent = Agent::build(parts).await?;
    let printer = crate::sync::lock(&slot)
        .take()
        .context("the printer was not made")?;
    printer.flush();
    let reconcile = agent.reconcile.clone();
    let settled = reconcile.settled(std::time::Duration::from_secs(3600));
    tokio::pin!(settled);
    let mut caught_up = false;
    let (mut changes, mut view_open) = (reconcile.changes(), true);
    tracing::info!("watching pods; Ctrl-C to stop");
    let shutdown = super::shutdown_signal();
    tokio::pin!(shutdown);
    let drain = stdout.drain();
    tokio::pin!(drain);
    let result: anyhow::Result<()> = async {
        loop {
            tokio::select! {
                biased;
                _ = &mut shutdown => return Ok(()),
                e = agent.failed() => return Err(e.into()),
                e = printer.failed() => return Err(e.into()),
                e = &mut drain => return Err(e.into()),
                _ = &mut settled, if !caught_up => {
                    caught_up = true;
                    catch_up(&printer, &reconcile);
                }
                // The agent's memory warnings are judged by the reconciler (a reading of the
                // cgroup at each crossing or limit hit), not on the loop's thread.
                r = changes.changed(), if view_open => match r {
                    Ok(()) => tell_warnings(&printer, &reconcile),
                    Err(_) => view_open = false,
                },
            }
        }
    }
    .await;
    printer.flush();
    finish(result)
}

/// The deaths and OOM kills the agent did not see happen (it started after them), printed once
/// each. The loop's thread (real-time with --realtime-priority) takes the printer's lock too:
/// it is held here for one container's set inserts, never while the reconciler's view is read
/// or a line is made.
fn catch_up(printer: &SharedPrinter, reconcile: &crate::reconcile::ReconcileHandle) {
    use crate::reconcile::{ContainerPhase, Source};
    let mut lines = Vec::new();
    for pod in reconcile.pods() {
        for c in &pod.containers {
            let oom = c.last_oom.as_ref().filter(|o| o.source != Source::Kernel);
            let (kill, death) = {
                let mut p = crate::sync::lock(&printer.0);
                (
                    oom.filter(|o| p.killed.insert((c.id, o.pid))),
                    c.phase == ContainerPhase::Exited && p.died.insert(c.id),
                )
            };
            if let Some(o) = kill {
                lines.push(crate::present::render::view_oom_line(&pod, c, o));
            }
            if death {
                lines.push(crate::present::render::view_died_line(&pod, c));
            }
        }
    }
    for line in &lines {
        printer.write(line, false);
    }
    printer.flush();
}

/// Each memory warning raised or ended since the last look, once (the printer's lock held for
/// one container's bookkeeping at a time, as in [`catch_up`]).
fn tell_warnings(printer: &SharedPrinter, reconcile: &crate::reconcile::ReconcileHandle) {
    let mut lines = Vec::new();
    for (uid, c) in reconcile.pressured() {
        let Some(p) = c.memory.as_deref() else {
            continue;
        };
        let news = {
            let mut printer = crate::sync::lock(&printer.0);
            p.news(printer.told.entry(c.id).or_default())
        };
        let raised_at = p.raised.last().map(|r| r.time);
        for n in &news {
            lines.push(crate::present::render::memory_warning_line(
                uid, &c, n, raised_at,
            ));
        }
    }
    if lines.is_empty() {
        return;
    }
    for line in &lines {
        printer.write(line, false);
    }
    printer.flush();
}

fn finish(result: anyhow::Result<()>) -> anyhow::Result<ExitCode> {
    match result {
        // A closed stdout (`observer watch | head`) is a normal way to stop.
        Err(e)
            if e.downcast_ref::<std::io::Error>()
                .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe) =>
        {
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => Err(e),
        Ok(()) => Ok(ExitCode::SUCCESS),
    }
}

fn resolve_watch(args: &WatchArgs, unified: &HierarchyMount) -> anyhow::Result<Watch> {
    if args.all {
        return Ok(Watch::All);
    }
    let roots: Vec<String> = if args.cgroup_roots.is_empty() || args.pods {
        // kubelet's roots, whichever driver made them.
        KubeRoots::detect(unified, &args.cgroup_roots)?
            .paths()
            .map(String::from)
            .collect()
    } else {
        for rel in &args.cgroup_roots {
            let abs = unified.to_absolute(rel).with_context(|| {
                format!(
                    "{rel} is not inside the cgroup2 mount {}",
                    unified.mount_point.display()
                )
            })?;
            if !abs.is_dir() {
                bail!(
                    "cgroup root {rel} does not exist ({} is not a directory)",
                    abs.display()
                );
            }
        }
        args.cgroup_roots.clone()
    };
    let found = watch_roots(unified, &roots)?;
    tracing::info!(?roots, found = found.len(), "cgroup subtrees to watch");
    if found.is_empty() {
        tracing::info!(
            "no kubepods cgroup on this node: watching every process (use --cgroup-root to narrow)"
        );
        return Ok(Watch::All);
    }
    Ok(Watch::Roots(found))
}
