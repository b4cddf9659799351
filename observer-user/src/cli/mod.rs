//! The `observer` subcommands. This is the binary's edge: errors here are `anyhow`, everything
//! below works with the library's typed errors.
mod check;
mod explain;
mod kubectl;
mod run;
mod status;
mod stdout;
mod watch;

use std::process::ExitCode;

use crate::{agent::Agent, cri::CriEndpoint};

use clap::{Parser, Subcommand};

pub use kubectl::plugin_args;

#[derive(Debug, Parser)]
#[command(
    name = "observer",
    version,
    about = "Container lifecycle and OOM kills, straight from the kernel"
)]
pub struct Cli {
    /// Log filter (tracing EnvFilter syntax), e.g. `info`, `observer=debug`.
    #[arg(long, global = true, env = "OBSERVER_LOG", default_value = "info")]
    pub log: String,
    /// Log lines as text for people, or JSON objects for a log pipeline.
    #[arg(long, global = true, env = "OBSERVER_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// The agent, as the DaemonSet runs it: pod status, Events and PodReports in the Kubernetes
    /// API, and /metrics, /healthz, /readyz.
    Run(run::RunArgs),
    /// Stream process, OOM and cgroup events live from the kernel (no cluster needed).
    Watch(watch::WatchArgs),
    /// Check that this node has what observer needs; exits non-zero when something is missing.
    Check(check::CheckArgs),
    /// This node's pods like `kubectl get pods`, from the runtime corrected by the kernel, with
    /// each pod's last OOM kill. No Kubernetes API needed.
    Status(status::StatusArgs),
    /// One pod's lifecycle and OOM kills in full (which limit, what filled it, who held it, who
    /// triggered it), from the agent's own record. No Kubernetes API needed.
    Explain(explain::ExplainArgs),
    /// The kubectl plugin (`kubectl observer explain POD`, `kubectl observer status`, installed as
    /// `kubectl-observer`): reads the pods' PodReports through the API server with your own
    /// kubeconfig and rights; no agent is asked.
    Kubectl(kubectl::KubectlArgs),
}

pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Run(args) => run::run(args).await,
        Command::Watch(args) => watch::run(args).await,
        Command::Check(args) => check::run(args),
        Command::Status(args) => status::run(args).await,
        Command::Explain(args) => explain::run(args).await,
        Command::Kubectl(args) => kubectl::run(args).await,
    }
}

/// Most tokio workers the agent runs, whatever the node's size.
pub const MAX_WORKERS: usize = 2;

/// The binary's tokio runtime: one worker per core up to [`MAX_WORKERS`]. The agent's work is one
/// ring-buffer reader, a few timers and the CRI and API calls; a worker per core of a 96-core node
/// would cost a thread stack and a malloc arena each for nothing (BENCHMARKS.md, "Agent
/// footprint").
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cores.clamp(1, MAX_WORKERS))
        .enable_all()
        .build()
}

/// Logs go to stderr so that stdout stays the event stream, through a bounded queue drained at
/// normal priority (`sync::logs`: a stalled reader of stderr costs lines, counted, never the
/// reader's thread); keep the returned flush until the process ends. A filter that would
/// suppress every line (a misspelt level, `target:level`) is refused: an agent that logs nothing
/// hides its errors.
pub fn init_logging(
    filter: &str,
    format: LogFormat,
) -> anyhow::Result<crate::sync::logs::LogFlush> {
    let filter = log_filter(filter)?;
    // Colours for a terminal only: a log pipeline reading a pipe gets the text itself.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let (queue, flush) = crate::sync::logs::queue(std::io::stderr(), crate::sync::logs::CAPACITY)?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(queue)
        .with_ansi(ansi)
        .with_target(false);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
    Ok(flush)
}

/// `--log` / `OBSERVER_LOG` parsed. EnvFilter takes a bare word as a target enabled at every level,
/// so `debgu` or `observer:debug` parse and enable nothing the agent logs: refused, with the
/// spelling meant.
pub(crate) fn log_filter(spec: &str) -> anyhow::Result<tracing_subscriber::EnvFilter> {
    use tracing_subscriber::filter::LevelFilter;
    const LEVELS: &str = "error, warn, info, debug, trace or off";
    let refuse = |why: String| anyhow::anyhow!("--log / OBSERVER_LOG {spec:?}: {why}");
    let directives: Vec<&str> = spec
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .collect();
    if directives.is_empty() {
        return Err(refuse(format!("empty; give a level ({LEVELS})")));
    }
    for d in directives {
        if d.contains('=') || d.contains('[') || d.parse::<LevelFilter>().is_ok() {
            continue;
        }
        let hint = match d.split_once(':') {
            Some((target, level)) if level.parse::<LevelFilter>().is_ok() => {
                format!("did you mean {target}={level}?")
            }
            _ => {
                format!("a level is one of {LEVELS}; one target's level is written observer=debug")
            }
        };
        return Err(refuse(format!(
            "{d:?} is neither a level nor target=level, and would suppress every log line: {hint}"
        )));
    }
    let mut filter =
        tracing_subscriber::EnvFilter::try_new(spec).map_err(|e| refuse(e.to_string()))?;
    if !spec.contains("kube") {
        // kube's own lines about a failed API call (a Status struct dumped, "failed with error
        // client error (Connect)" with no URL) repeat what the agent reports with the server's
        // URL and what to check; shown when asked for by name.
        for quiet in [
            "kube_runtime::watcher=error",
            "kube_client::client::builder=off",
        ] {
            filter = filter.add_directive(quiet.parse().expect("a valid directive"));
        }
    }
    Ok(filter)
}

/// `--cgroup-root`: where kubelet's pods are, for every command that follows them.
#[derive(Debug, Clone, clap::Args)]
pub struct CgroupRootArg {
    /// Where kubelet's pod cgroups are: kubelet's --cgroup-root (its cgroupRoot: / by default,
    /// /kubelet under kind), or a kubepods cgroup itself (/kubepods, /kubepods.slice,
    /// /kubelet.slice/kubelet-kubepods.slice), relative to the cgroup2 root as kubelet sees it.
    /// Repeatable (comma-separated in the variable). Only below these is a cgroup a pod's or a
    /// container's; one named like it elsewhere is ignored and counted. Default: those of
    /// kubelet's default root and of kind's that exist here, else kubelet's default ones; the
    /// agent says at start which it took.
    #[arg(
        long = "cgroup-root",
        value_name = "PATH",
        env = "OBSERVER_CGROUP_ROOT",
        value_delimiter = ','
    )]
    pub cgroup_roots: Vec<String>,
}

/// `--state-dir` of the read-only commands (`status`, `watch --pods`): a running agent's record
/// of container inits, read and never written.
#[derive(Debug, Clone, clap::Args)]
pub struct StateDirArg {
    /// Where a running agent keeps the inits of containers (read, never written), so that a
    /// kill it recorded is told as the init's or a child's.
    #[arg(
        long,
        value_name = "DIR",
        env = "OBSERVER_STATE_DIR",
        default_value = "/run/observer"
    )]
    pub state_dir: std::path::PathBuf,
}

/// Where the kernel reader runs: a thread of its own, real-time with `--realtime-priority`.
/// `--realtime-priority`, the same for `run`, `watch` and `check`.
#[derive(Debug, Clone, Copy, clap::Args)]
pub struct RealtimeArg {
    /// Read the kernel on a real-time thread: SCHED_FIFO at this priority (1-99; needs
    /// CAP_SYS_NICE), so that a death is seen at once on a busy node rather than after the
    /// workloads' turn. Only that thread is real-time, and nothing it starts inherits it. Where
    /// the kernel refuses, the agent says so once and reads at normal priority; `observer check`
    /// then fails its real-time row.
    #[arg(
        long,
        env = "OBSERVER_REALTIME_PRIORITY",
        value_name = "1-99",
        value_parser = clap::value_parser!(u8).range(1..=99)
    )]
    pub realtime_priority: Option<u8>,
}

fn reader_thread(realtime_priority: Option<u8>) -> crate::pipeline::ReaderThread {
    match realtime_priority {
        Some(p) => crate::pipeline::ReaderThread::Realtime(p),
        None => crate::pipeline::ReaderThread::Dedicated,
    }
}

/// Resolves on Ctrl-C or SIGTERM.
pub(crate) async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// The agent of a read-only command (`status`, `explain`): started, its runtime answering, its
/// first relist in (a slow one is said, with `missing`: what may be absent from the output).
pub(crate) async fn start_reader(
    cfg: crate::agent::AgentConfig,
    missing: &str,
) -> anyhow::Result<Agent> {
    use std::time::Duration;
    let endpoint = cfg.cri.clone();
    let agent = Agent::start(cfg).await?;
    if !agent.wait_runtime(Duration::from_secs(5)).await {
        anyhow::bail!(
            "the container runtime at {endpoint} does not answer: {}",
            agent.runtime.state().last_error.unwrap_or_else(|| {
                "no answer to CRI Version within 5 s: is --cri-endpoint the runtime's CRI socket?"
                    .into()
            })
        );
    }
    if !agent.reconcile.settled(Duration::from_secs(10)).await {
        tracing::warn!("the runtime is slow to answer; {missing}");
    }
    Ok(agent)
}

/// The scheme kubelet puts before container ids in the API (`containerd://`, `cri-o://`).
pub(crate) async fn runtime_name(agent: &Agent, _endpoint: &CriEndpoint) -> String {
    agent.runtime_name(std::time::Duration::from_secs(10)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_filters_that_enable_nothing_are_refused() {
        for good in [
            "info",
            "debug",
            "observer=debug",
            "warn,observer=trace",
            "off",
            "INFO",
        ] {
            assert!(log_filter(good).is_ok(), "{good}");
        }
        let e = log_filter("debgu").unwrap_err().to_string();
        assert!(
            e.contains("\"debgu\" is neither a level nor target=level")
                && e.contains("error, warn, info, debug, trace or off"),
            "{e}"
        );
        let e = log_filter("observer:debug").unwrap_err().to_string();
        assert!(e.contains("did you mean observer=debug?"), "{e}");
        let e = log_filter("observer=debgu").unwrap_err().to_string();
        assert!(
            e.starts_with("--log / OBSERVER_LOG \"observer=debgu\": "),
            "{e}"
        );
        let e = log_filter(" , ").unwrap_err().to_string();
        assert!(e.contains("empty"), "{e}");
    }
}
