//! `observer watch`: the kernel's view of process lifecycle, live.
use std::{
    io::{BufWriter, Write},
    os::{fd::AsFd, unix::net::UnixStream},
    path::PathBuf,
    process::ExitCode,
};

use anyhow::{bail, Context};

use super::render::{
    pleg_line, watch_line, write_json, write_pleg_text, write_text, Format, WatchLine,
};
use crate::{
    cgroup::{find_kubepods_roots, CgroupIndex, HierarchyMount},
    kernel::{EventReader, KernelEvent, ProbeOptions, Probes, Wait, Wake, Watch},
    pipeline::{
        unified_mount, watch_roots, KernelPipeline, PipelineConfig, ReaderThread, DEFAULT_QUEUE,
        HEARTBEAT,
    },
    pleg::PlegReceiver,
};

#[derive(Debug, clap::Args)]
pub struct WatchArgs {
    /// Limit exec/exit events to this cgroup subtree, relative to the cgroup2 mount (e.g.
    /// /kubepods.slice or /kubepods). Repeatable. Default: the kubepods subtree if it exists,
    /// else everything.
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

pub async fn run(args: WatchArgs) -> anyhow::Result<ExitCode> {
    let unified = unified_mount(args.cgroupfs.as_deref())?;
    let watch = resolve_watch(&args, &unified)?;
    let opts = ProbeOptions {
        watch,
        thread_exits: args.threads,
        // With --all or --threads every record is printed as it comes; otherwise only a
        // container init's, OOM kills and cgroup events wake the reader, and the rest follow
        // within kernel::QUIET_RECORD_DELAY.
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
        if endpoint.path().exists() && !args.all && args.cgroup_roots.is_empty() {
            return watch_pods_reconciled(
                args.format,
                endpoint,
                args.cgroupfs.clone(),
                args.state.state_dir.clone(),
                reader,
            )
            .await;
        }
        tracing::info!(%endpoint, "no container runtime socket: pod events from the kernel alone");
        let (pipeline, events) = KernelPipeline::start(PipelineConfig {
            scan_roots: find_kubepods_roots(&unified),
            unified,
            probes: opts,
            queue: DEFAULT_QUEUE,
        })?;
        tracing::info!("watching pods; Ctrl-C to stop");
        return watch_pods(args.format, pipeline, events, reader).await;
    }
    let mut probes = Probes::load(&opts)?;
    let events = probes.events()?;
    let mut cgroups = CgroupIndex::new(unified.clone());
    cgroups.scan();
    tracing::info!(cgroups = cgroups.len(), "watching; Ctrl-C to stop");

    // The reader and the printer on a thread of their own (real-time if asked); this task waits
    // for Ctrl-C or for the thread to end (stdout closed, the reader failed).
    let printer = Printer {
        out: BufWriter::with_capacity(1 << 16, std::io::stdout()),
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
    tokio::select! {
        _ = super::shutdown_signal() => {}
        _ = done => {}
    }
    drop(stop);
    let (written, malformed, result) = thread
        .join()
        .map_err(|p| anyhow::anyhow!("the watch thread panicked: {p:?}"))?;
    let counters = probes.counters()?;
    eprintln!(
        "observer watch: stopped; {written} events written, {} records dropped by the kernel (ring buffer full), {malformed} malformed",
        counters.ringbuf_drops,
    );
    finish(result)
}

/// The raw watch's loop, on its own thread: until `stop` hangs up, stdout closes or the reader
/// fails. Returns what it wrote, the malformed records, and how it ended.
fn print_events(
    mut reader: EventReader,
    mut printer: Printer<BufWriter<std::io::Stdout>>,
    stop: &UnixStream,
    realtime: Option<u8>,
) -> (u64, u64, anyhow::Result<()>) {
    if let Some(priority) = realtime {
        crate::sched::realtime_or_say_once(priority, "the kernel reader thread");
    }
    let result = (|| -> anyhow::Result<()> {
        loop {
            match reader.next_blocking(HEARTBEAT, Some(stop.as_fd()))? {
                Wait::Event(ev) => {
                    // Follows NTP steps in the printed times.
                    reader.refresh_clock();
                    printer.emit(ev, &reader)?;
                    while let Some(ev) = reader.try_next() {
                        printer.emit(ev, &reader)?;
                    }
                    printer.out.flush()?;
                }
                Wait::Idle => {}
                Wait::Stopped => return Ok(()),
            }
        }
    })();
    (printer.written, reader.malformed(), result)
}

struct Printer<W: Write> {
    out: W,
    format: Format,
    cgroups: CgroupIndex,
    written: u64,
}

impl<W: Write> Printer<W> {
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
        match self.format {
            Format::Json => write_json(&mut self.out, line),
            Format::Text => write_text(&mut self.out, line),
        }
    }
}

/// `--pods`: kernel events through the PLEG, which runs where `reader` says.
async fn watch_pods(
    format: Format,
    pipeline: KernelPipeline,
    mut rx: PlegReceiver,
    reader: ReaderThread,
) -> anyhow::Result<ExitCode> {
    let clock = pipeline.clock();
    let mut task = pipeline.spawn(reader, || {})?;
    let stdout = std::io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let shutdown = super::shutdown_signal();
    tokio::pin!(shutdown);
    let result: anyhow::Result<()> = async {
        loop {
            let ev = tokio::select! {
                biased;
                _ = &mut shutdown => return Ok(()),
                e = task.stopped() => return Err(e.into()),
                ev = rx.recv() => match ev {
                    Some(ev) => ev,
                    None => return Ok(()),
                },
            };
            let line = pleg_line(&ev, clock.to_system_time(ev.at));
            match format {
                Format::Json => serde_json::to_writer(&mut out, &line)
                    .map_err(std::io::Error::from)
                    .and_then(|_| out.write_all(b"\n"))?,
                Format::Text => write_pleg_text(&mut out, &line)?,
            }
            if rx.is_empty() {
                out.flush()?;
            }
        }
    }
    .await;
    drop(out);
    let s = task.health().stats().pleg;
    eprintln!(
        "observer watch: stopped; {} kernel records dropped, {} kernel events, {} lifecycle events, {} unattributed, {} resyncs",
        task.kernel_counters()?.ringbuf_drops, s.kernel_events, s.lifecycle_events, s.unattributed, s.resyncs
    );
    finish(result)
}

/// `--pods` beside a runtime: the kernel's events live, and once the first relist settled, the
/// deaths and OOM kills the agent did not see happen (it started after them), each saying how it
/// is known.
async fn watch_pods_reconciled(
    format: Format,
    endpoint: crate::cri::CriEndpoint,
    cgroupfs: Option<PathBuf>,
    state_dir: PathBuf,
    reader: ReaderThread,
) -> anyhow::Result<ExitCode> {
    use std::collections::HashSet;

    use crate::{
        agent::{Agent, AgentConfig},
        cgroup::ContainerId,
        pleg::PlegEventType,
    };
    let mut cfg = AgentConfig::new(endpoint);
    cfg.cgroupfs = cgroupfs;
    cfg.reader = reader;
    cfg.reconcile.state_dir = Some(state_dir);
    let mut agent = Agent::start(cfg).await?;
    let mut events = agent.take_pleg_events();
    let clock = agent.clock();
    let reconcile = agent.reconcile.clone();
    let settled = reconcile.settled(std::time::Duration::from_secs(3600));
    tokio::pin!(settled);
    let mut caught_up = false;
    let mut died: HashSet<ContainerId> = HashSet::new();
    let mut killed: HashSet<(ContainerId, u32)> = HashSet::new();
    let stdout = std::io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let write =
        |out: &mut BufWriter<_>, line: &crate::cli::render::PlegLine| -> std::io::Result<()> {
            match format {
                Format::Json => serde_json::to_writer(&mut *out, line)
                    .map_err(std::io::Error::from)
                    .and_then(|_| out.write_all(b"\n")),
                Format::Text => write_pleg_text(out, line),
            }
        };
    tracing::info!("watching pods; Ctrl-C to stop");
    let shutdown = super::shutdown_signal();
    tokio::pin!(shutdown);
    let result: anyhow::Result<()> = async {
        loop {
            tokio::select! {
                biased;
                _ = &mut shutdown => return Ok(()),
                e = agent.failed() => return Err(e.into()),
                ev = events.recv() => match ev {
                    Ok(ev) => {
                        if let Some(id) = ev.container_id() {
                            match ev.kind() {
                                PlegEventType::ContainerDied => { died.insert(id); }
                                PlegEventType::OomKill => {
                                    if let Some(o) = ev.oom() { killed.insert((id, o.victim.tgid)); }
                                }
                                _ => {}
                            }
                        }
                        write(&mut out, &pleg_line(&ev, clock.to_system_time(ev.at)))?;
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                        tracing::warn!(lost = n, "the printer fell behind; lifecycle events not printed");
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return Ok(()),
                },
                _ = &mut settled, if !caught_up => {
                    caught_up = true;
                    for pod in reconcile.pods() {
                        for c in &pod.containers {
                            if let Some(o) = &c.last_oom {
                                if o.source != crate::reconcile::Source::Kernel && killed.insert((c.id, o.pid)) {
                                    write(&mut out, &super::render::view_oom_line(&pod, c, o))?;
                                }
                            }
                            if c.phase == crate::reconcile::ContainerPhase::Exited && died.insert(c.id) {
                                write(&mut out, &super::render::view_died_line(&pod, c))?;
                            }
                        }
                    }
                }
            }
            out.flush()?;
        }
    }
    .await;
    drop(out);
    finish(result)
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
    let roots = if args.cgroup_roots.is_empty() {
        // kubelet's root, whichever driver made it (and wherever it sits).
        find_kubepods_roots(unified)
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
