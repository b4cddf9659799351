//! `observer status`: this node's pods as `kubectl get pods` shows them, from the runtime (CRI)
//! corrected by the kernel, with the last OOM kill of each pod. No Kubernetes API needed.
use std::{
    collections::HashMap,
    io::Write,
    path::PathBuf,
    process::ExitCode,
    time::{Duration, SystemTime},
};

use k8s_openapi::api::core::v1::Pod;
use serde::Serialize;

use crate::present::render::rfc3339;
use crate::{
    agent::AgentConfig,
    cri::CriEndpoint,
    present::print::{columns, computed_pod, human_duration, restarts_cell, Columns},
    reconcile::{ContainerPhase, ContainerView, OomEvidence, PodView, ReconcileStats},
    status::{ConditionTypes, Unknown},
};

#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// CRI socket (a path or unix:///path). Default: containerd's, else CRI-O's.
    #[arg(long, value_name = "ENDPOINT")]
    pub cri_endpoint: Option<CriEndpoint>,
    /// `table` (like kubectl get pods); `json` and `yaml`: one object, a List of Pods with the
    /// PodStatus the agent computes (what `observer run --status-mode full` would write), to set
    /// beside `kubectl get pod -o yaml`; `account`: the agent's own account, the table's rows
    /// with each container's evidence, as JSON (one document; one per line with --watch).
    /// Without the API the pod's spec is unknown: what that leaves open is listed in the
    /// `observer.dev/unknown` annotation, never guessed.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Output::Table)]
    pub output: Output,
    /// Only this namespace's pods. Without -n, every namespace of this node (the runtime's
    /// view, as `crictl pods` lists it).
    #[arg(
        short = 'n',
        long,
        value_name = "NAMESPACE",
        conflicts_with = "all_namespaces"
    )]
    pub namespace: Option<String>,
    /// Every namespace of this node (what no -n gives; accepted as kubectl takes it).
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,
    /// Only pods whose labels match, as `kubectl get -l` (the API server evaluates it: needs
    /// --kubeconfig, the runtime does not hold every pod's labels).
    #[arg(short = 'l', long, value_name = "SELECTOR", requires = "kubeconfig")]
    pub selector: Option<String>,
    /// Prefix of the observer-owned condition types in `yaml` / `pod-json`.
    #[arg(long, value_name = "DOMAIN", default_value = "observer.dev")]
    pub condition_prefix: String,
    /// Keep running and print pods again as they change.
    #[arg(short, long)]
    pub watch: bool,
    /// Where the host's cgroup filesystems are mounted, when observer runs in a container.
    #[arg(long, value_name = "DIR")]
    pub cgroupfs: Option<PathBuf>,
    #[command(flatten)]
    pub cgroup_root: super::CgroupRootArg,
    /// Seconds between safety relists of the runtime (with --watch).
    #[arg(long, value_name = "SECONDS", default_value_t = 60)]
    pub relist_period: u64,
    /// Read this node's pods from the Kubernetes API (only GET and LIST; kubeconfig path, or
    /// `-` for KUBECONFIG, ~/.kube/config, then the in-cluster account): `yaml` / `pod-json`
    /// then carry each pod's spec and the whole PodStatus `observer run --status-mode full`
    /// would write, with nothing left unknown for want of a spec.
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// This node's name, to list only its pods with `--kubeconfig` (else every pod is listed and
    /// matched by UID).
    #[arg(long, env = "NODE_NAME", value_name = "NAME")]
    pub node_name: Option<String>,
    #[command(flatten)]
    pub state: super::StateDirArg,
}

/// The node's pods from the API, by UID.
async fn api_pods(
    api: &crate::kube::ApiClient,
    node: Option<&str>,
    labels: Option<&str>,
) -> anyhow::Result<HashMap<String, Pod>> {
    let pods: ::kube::Api<Pod> = ::kube::Api::all(api.client.clone());
    let mut params = ::kube::api::ListParams::default();
    let selector = node.map(|n| format!("spec.nodeName={n}"));
    if let Some(s) = &selector {
        params = params.fields(s);
    }
    if let Some(l) = labels {
        params = params.labels(l);
    }
    let list = pods.list(&params).await.map_err(|e| {
        anyhow::anyhow!(
            "listing pods: {}",
            crate::kube::describe_api_error(&e, &api.url)
        )
    })?;
    Ok(list
        .items
        .into_iter()
        .filter_map(|p| Some((p.metadata.uid.clone()?, p)))
        .collect())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Table,
    Json,
    Yaml,
    /// `json`'s earlier name.
    #[value(hide = true)]
    PodJson,
    Account,
}

pub(super) async fn run(args: StatusArgs) -> anyhow::Result<ExitCode> {
    let endpoint = args
        .cri_endpoint
        .clone()
        .unwrap_or_else(CriEndpoint::detect);
    let mut cfg = AgentConfig::new(endpoint.clone());
    cfg.cgroupfs = args.cgroupfs.clone();
    cfg.cgroup_roots = args.cgroup_root.cgroup_roots.clone();
    cfg.reconcile.relist_period = Duration::from_secs(args.relist_period.max(1));
    cfg.reconcile.state_dir = Some(args.state.state_dir.clone());
    let mut agent = super::start_reader(cfg, "the list may be incomplete").await?;
    let types = ConditionTypes::new(&args.condition_prefix);
    let runtime = super::runtime_name(&agent, &endpoint).await;
    let api = match &args.kubeconfig {
        Some(path) => {
            let path = (path.as_os_str() != "-").then_some(path.as_os_str());
            Some(crate::kube::client(path).await?)
        }
        None => None,
    };
    let stdout = std::io::stdout();
    let mut shown: HashMap<String, Row> = HashMap::new();
    let mut changes = agent.reconcile.changes();
    let mut first = true;
    let shutdown = super::shutdown_signal();
    tokio::pin!(shutdown);
    loop {
        let mut pods = agent.reconcile.pods();
        // One computation for every output: the table's columns, `json`'s and the statuses of
        // `yaml` / `pod-json` all come from it.
        let from_api = match &api {
            Some(api) => api_pods(api, args.node_name.as_deref(), args.selector.as_deref()).await?,
            None => HashMap::new(),
        };
        // -l: the API answered only the pods that match.
        if args.selector.is_some() {
            pods.retain(|v| from_api.contains_key(v.uid.as_str()));
        }
        // Pods the API binds to this node that the runtime has no sandbox for are listed too,
        // with what the API knows (only where the API was asked for this node's pods).
        let runtime_has = |uid: &str| pods.iter().any(|v| v.uid.to_string() == uid);
        let waiting: Vec<PodView> = match args.node_name {
            Some(_) => from_api
                .iter()
                .filter(|(uid, _)| !runtime_has(uid))
                .filter_map(|(_, p)| crate::present::print::without_sandbox(p))
                .collect(),
            None => Vec::new(),
        };
        pods.extend(waiting);
        if let Some(ns) = &args.namespace {
            pods.retain(|v| &v.namespace == ns);
        }
        pods.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        let now = SystemTime::now();
        let computed: Vec<(Pod, Vec<Unknown>)> = pods
            .iter()
            .map(|v| computed_pod(v, from_api.get(v.uid.as_str()), &types, &runtime, now))
            .collect();
        let rows: Vec<Row> = pods
            .iter()
            .zip(&computed)
            .map(|(v, (pod, unknown))| Row::of(v, &columns(pod, unknown)))
            .collect();
        let mut out = stdout.lock();
        match args.output {
            Output::Account if args.watch => {
                serde_json::to_writer(&mut out, &rows)?;
                out.write_all(b"\n")?;
            }
            Output::Account => {
                serde_json::to_writer_pretty(&mut out, &rows)?;
                out.write_all(b"\n")?;
            }
            Output::Json | Output::Yaml | Output::PodJson => {
                let list = pod_list(computed);
                if args.output == Output::Yaml {
                    if args.watch {
                        out.write_all(b"---\n")?;
                    }
                    out.write_all(serde_saphyr::to_string(&list)?.as_bytes())?;
                } else if args.watch {
                    serde_json::to_writer(&mut out, &list)?;
                    out.write_all(b"\n")?;
                } else {
                    serde_json::to_writer_pretty(&mut out, &list)?;
                    out.write_all(b"\n")?;
                }
            }
            Output::Table => {
                // The first time everything; then, like `kubectl get -w`, the rows that changed.
                let changed: Vec<&Row> = rows
                    .iter()
                    .filter(|r| first || shown.get(&r.uid) != Some(r))
                    .collect();
                let gone: Vec<&Row> = shown
                    .values()
                    .filter(|r| !rows.iter().any(|n| n.uid == r.uid))
                    .collect();
                write_table(&mut out, &changed, &gone, first)?;
            }
        }
        out.flush()?;
        drop(out);
        shown = rows.into_iter().map(|r| (r.uid.clone(), r)).collect();
        first = false;
        if !args.watch {
            break;
        }
        tokio::select! {
            _ = &mut shutdown => break,
            // The kernel reader or the reconciler died: what we would print from now on is stale.
            e = agent.failed() => return Err(e.into()),
            r = changes.changed() => if r.is_err() { break },
        }
        // Let a burst of changes land before printing.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let s = agent.reconcile.stats();
    tracing::debug!(
        relists = ReconcileStats::get(&s.relists),
        missed = ReconcileStats::get(&s.missed_events),
        corrected = ReconcileStats::get(&s.corrected),
        "status done"
    );
    Ok(ExitCode::SUCCESS)
}

/// One pod as printed.
#[derive(Clone, Debug, PartialEq, Serialize)]
struct Row {
    namespace: String,
    name: String,
    uid: String,
    /// kubectl's READY, STATUS and RESTARTS of the computed status.
    ready: String,
    status: String,
    restarts: u32,
    #[serde(skip)]
    last_restart: Option<SystemTime>,
    #[serde(skip)]
    created: Option<SystemTime>,
    created_at: Option<String>,
    last_oom: Option<OomRow>,
    /// The runtime has a sandbox for the pod; false: only the API knows it (kubelet has not
    /// made one, or cannot).
    sandbox: bool,
    containers: Vec<ContainerRow>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
struct OomRow {
    time: String,
    #[serde(skip)]
    at: SystemTime,
    container: String,
    pid: u32,
    comm: String,
    /// The container's init was the victim (the container died of it); null when not known.
    init: Option<bool>,
    anon_rss_kb: Option<u64>,
    total_vm_kb: Option<u64>,
    oom_score_adj: Option<i16>,
    /// The memory cgroup whose limit was hit, where it is not the victim's own (a pod limit).
    oom_cgroup: Option<String>,
    /// `probe` for kills the agent saw, `kernel-log` for kills from before it started.
    source: &'static str,
    /// Which limit was hit: `container`, `pod`, `cgroup`, `node`, `unknown`.
    scope: &'static str,
    /// The sentence of the Event and the OOMKilled condition.
    message: String,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
struct ContainerRow {
    name: String,
    id: String,
    state: &'static str,
    restart_count: u32,
    exit_code: Option<i32>,
    signal: Option<u8>,
    reason: Option<String>,
    /// How the exit code and reason are known: `kernel` (watched), `kernel-log` (the log named
    /// the victim), `runtime` (only the runtime's account).
    exit_source: Option<&'static str>,
    /// What the runtime said where the agent's account replaced it.
    runtime_reason: Option<String>,
    runtime_exit_code: Option<i32>,
    started_at: Option<String>,
    finished_at: Option<String>,
    init_pid: Option<u32>,
    oom_kills: u32,
    last_oom: Option<OomRow>,
}

impl Row {
    fn of(p: &PodView, columns: &Columns) -> Self {
        let name_of = |id: &crate::model::ContainerId| {
            p.containers
                .iter()
                .find(|c| c.id == *id)
                .map_or_else(|| short(id.as_str()).to_string(), |c| c.name.clone())
        };
        Row {
            namespace: p.namespace.clone(),
            name: p.name.clone(),
            uid: p.uid.to_string(),
            ready: columns.ready.clone(),
            status: columns.status.clone(),
            restarts: columns.restarts,
            last_restart: columns.last_restart,
            created: p.created_at,
            created_at: p.created_at.map(rfc3339),
            last_oom: p.last_oom.as_ref().map(|o| {
                let c = p.containers.iter().find(|c| c.id == o.container_id);
                oom_row(o, &name_of(&o.container_id), c)
            }),
            sandbox: p.sandbox_id != crate::model::ContainerId::NONE,
            containers: p.containers.iter().map(container_row).collect(),
        }
    }
}

fn oom_row(o: &OomEvidence, container: &str, c: Option<&ContainerView>) -> OomRow {
    OomRow {
        time: rfc3339(o.time),
        at: o.time,
        container: container.to_string(),
        pid: o.pid,
        comm: o.comm.clone(),
        init: o.init,
        anon_rss_kb: o.anon_rss_kb,
        total_vm_kb: o.total_vm_kb,
        oom_score_adj: o.oom_score_adj,
        oom_cgroup: o.oom_cgroup.clone(),
        source: match o.source {
            crate::reconcile::Source::Kernel => "probe",
            s => s.as_str(),
        },
        scope: o.scope.label(),
        message: crate::status::conditions::describe_kill(o, c, None),
    }
}

fn container_row(c: &ContainerView) -> ContainerRow {
    ContainerRow {
        name: c.name.clone(),
        id: c.id.to_string(),
        state: match c.phase {
            ContainerPhase::Created => "created",
            ContainerPhase::Running => "running",
            ContainerPhase::Exited => "exited",
            ContainerPhase::Unknown => "unknown",
        },
        restart_count: c.restart_count,
        exit_code: c.exit_code,
        signal: c.signal,
        reason: c.reason.clone(),
        exit_source: c.exit_source.map(|s| s.as_str()),
        runtime_reason: c.runtime_reason.clone(),
        runtime_exit_code: c.runtime_exit_code,
        started_at: c.started_at.map(rfc3339),
        finished_at: c.finished_at.map(rfc3339),
        init_pid: c.init_pid,
        oom_kills: c.oom_kills,
        last_oom: c.last_oom.as_ref().map(|o| oom_row(o, &c.name, Some(c))),
    }
}

/// The node's pods as a `v1` List of Pods: metadata as far as the runtime knows it, and the
/// PodStatus computed from the runtime's account corrected by the kernel's; what is left unknown
/// in the `observer.dev/unknown` annotation.
fn pod_list(computed: Vec<(Pod, Vec<Unknown>)>) -> k8s_openapi::List<Pod> {
    let items = computed
        .into_iter()
        .map(|(mut pod, unknown)| {
            let unknown: Vec<String> = unknown.iter().map(|u| u.to_string()).collect();
            pod.metadata.annotations = (!unknown.is_empty())
                .then(|| [("observer.dev/unknown".to_string(), unknown.join("\n"))].into());
            pod
        })
        .collect();
    k8s_openapi::List {
        items,
        metadata: Default::default(),
    }
}

fn short(id: &str) -> &str {
    &id[..id.len().min(12)]
}

/// kubectl's AGE: 45s, 2m30s, 3h, 5d.
pub(crate) fn age(since: Option<SystemTime>, now: SystemTime) -> String {
    since
        .and_then(|s| now.duration_since(s).ok())
        .map_or_else(|| "-".into(), human_duration)
}

fn oom_text(o: &OomRow, now: SystemTime) -> String {
    let rss = o
        .anon_rss_kb
        .map(|kb| format!(", {:.1} MiB rss", kb as f64 / 1024.0))
        .unwrap_or_default();
    format!(
        "{}[{}] in {}, {} ago{rss}",
        o.comm,
        o.pid,
        o.container,
        age(Some(o.at), now)
    )
}

fn write_table(
    out: &mut impl Write,
    rows: &[&Row],
    gone: &[&Row],
    header: bool,
) -> std::io::Result<()> {
    let now = SystemTime::now();
    let cells: Vec<[String; 7]> = rows
        .iter()
        .map(|r| {
            [
                r.namespace.clone(),
                r.name.clone(),
                r.ready.clone(),
                r.status.clone(),
                restarts_cell(r.restarts, r.last_restart, now),
                age(r.created, now),
                r.last_oom
                    .as_ref()
                    .map_or_else(|| "-".into(), |o| oom_text(o, now)),
            ]
        })
        .chain(gone.iter().map(|r| {
            [
                r.namespace.clone(),
                r.name.clone(),
                "0/0".into(),
                "Gone".into(),
                r.restarts.to_string(),
                age(r.created, now),
                "-".into(),
            ]
        }))
        // Every cell may hold what the node said (names, the runtime's reasons, process names).
        .map(|row| row.map(|v| crate::model::printable(&v).into_owned()))
        .collect();
    const HEAD: [&str; 7] = [
        "NAMESPACE",
        "NAME",
        "READY",
        "STATUS",
        "RESTARTS",
        "AGE",
        "LAST OOM KILL",
    ];
    let mut width = HEAD.map(str::len);
    for c in &cells {
        for (w, v) in width.iter_mut().zip(c) {
            *w = (*w).max(v.chars().count());
        }
    }
    let line = |out: &mut dyn Write, c: [&str; 7]| -> std::io::Result<()> {
        for (i, v) in c.iter().enumerate() {
            if i == 6 {
                writeln!(out, "{v}")?;
            } else {
                write!(out, "{v:<w$}   ", w = width[i])?;
            }
        }
        Ok(())
    };
    if header {
        line(out, HEAD)?;
    }
    for c in &cells {
        line(out, c.each_ref().map(String::as_str))?;
    }
    if header && cells.is_empty() {
        writeln!(out, "No pods found on this node.")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_like_kubectl() {
        let now = SystemTime::now();
        let ago = |s| Some(now - Duration::from_secs(s));
        assert_eq!(age(ago(5), now), "5s");
        assert_eq!(age(ago(600), now), "10m");
        assert_eq!(age(ago(3 * 3600), now), "3h");
        assert_eq!(age(ago(3 * 86_400), now), "3d");
        assert_eq!(age(None, now), "-");
    }

    #[test]
    fn table_json_and_yaml_are_one_computation() {
        use crate::kube::testkit::{cv, exited, t, view};
        let v = view(vec![
            exited("app", 0, 137, "OOMKilled"),
            exited("app", 1, 137, "OOMKilled"),
            cv("side", 0, ContainerPhase::Running),
        ]);
        let types = ConditionTypes::default();
        let (pod, unknown) = computed_pod(&v, None, &types, "containerd", t(100));
        let row = Row::of(&v, &columns(&pod, &unknown));
        // kubectl walks the statuses backwards: `app`'s reason is the last word.
        assert_eq!(
            (row.status.as_str(), row.ready.as_str(), row.restarts),
            ("OOMKilled", "?/2", 1)
        );
        assert_eq!(
            crate::present::view_status(&v),
            row.status,
            "the view's STATUS is the same computation"
        );
        let list = pod_list(vec![(pod, unknown)]);
        let status = list.items[0].status.as_ref().unwrap();
        let app = &status.container_statuses.as_ref().unwrap()[0];
        let term = app.state.as_ref().unwrap().terminated.as_ref().unwrap();
        assert_eq!(
            (term.reason.as_deref(), app.restart_count),
            (Some("OOMKilled"), 1)
        );
        let json = serde_json::to_value(&row).unwrap();
        assert_eq!(json["status"], "OOMKilled");
        assert!(
            list.items[0].metadata.annotations.as_ref().unwrap()["observer.dev/unknown"]
                .contains("no pod spec")
        );
    }

    /// Names from the node reach a terminal escaped in every human-readable output: the table,
    /// the kill's sentence (Event, condition), explain's text and the watch line.
    #[test]
    fn what_the_node_names_cannot_drive_a_terminal() {
        use crate::{
            kube::testkit::{cv, oom, view},
            present::{explain, render},
        };
        let hostile = "ev\nil\x1b[2J\u{202e}";
        let mut app = cv(hostile, 0, ContainerPhase::Running);
        let kill = oom(&app, 4242, hostile, true);
        app.oom_kills = 1;
        app.last_oom = Some(kill);
        let mut v = view(vec![app]);
        v.name = hostile.into();
        let types = ConditionTypes::default();
        let (pod, unknown) = computed_pod(&v, None, &types, "containerd", SystemTime::now());
        let row = Row::of(&v, &columns(&pod, &unknown));
        let mut out = Vec::new();
        write_table(&mut out, &[&row], &[], true).unwrap();
        let table = String::from_utf8(out).unwrap();
        let e = explain::explain(&v, None, Err("no API"));
        let text = explain::render_text(&e);
        let sentence = &e.kills[0].sentence;
        let c = &v.containers[0];
        let mut out = Vec::new();
        let oom_line = render::view_oom_line(&v, c, c.last_oom.as_ref().unwrap());
        render::write_pleg_text(&mut out, &oom_line).unwrap();
        render::write_pleg_text(&mut out, &render::view_died_line(&v, c)).unwrap();
        let watch = String::from_utf8(out).unwrap();
        for (what, s, lines) in [
            ("table", &table, 2),
            ("sentence", sentence, 0),
            ("watch", &watch, 2),
        ] {
            assert_eq!(s.matches('\n').count(), lines, "{what}: {s}");
            assert!(!s.contains(['\x1b', '\u{202e}']), "{what}: {s}");
        }
        assert!(table.contains("ev\\x0ail\\x1b[2J\\u{202e}"), "{table}");
        assert!(sentence.contains("ev\\x0ail"), "{sentence}");
        assert!(!text.contains(['\x1b', '\u{202e}']), "{text}");
        assert!(
            !text.lines().any(|l| l.starts_with("il")),
            "no forged line: {text}"
        );
    }

    #[test]
    fn table_aligns_and_says_when_empty() {
        let mut out = Vec::new();
        write_table(&mut out, &[], &[], true).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.starts_with("NAMESPACE   NAME   READY   STATUS   RESTARTS   AGE   LAST OOM KILL"),
            "{text}"
        );
        assert!(text.contains("No pods found"));
    }
}
