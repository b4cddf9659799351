//! One pod explained from the agent's own record: each container instance (started, died with
//! its exact exit, how that is known), and each instance's last OOM kill in full: the sentence the
//! Event and the OOMKilled condition carry, the scope, the limit and its usage, what filled the
//! cgroup, the largest processes, the victim and the trigger; beside them, where the API's pod is
//! at hand, what kubelet reported for each container and where it differs (`explain::kubelet`).
//! `observer explain` prints it; the agent writes it into each pod's PodReport (`explanation`),
//! which `kubectl observer explain` reads.
use std::time::SystemTime;

use k8s_openapi::api::core::v1::Pod;
use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use crate::{
    kernel::oom_report::OomReport,
    model::Printable,
    reconcile::{ContainerPhase, ContainerView, OomEvidence, OomScope, PodView, ScopeUnknown},
    status::{
        compute::rfc3339,
        conditions::{
            describe_kill, memory_limit, others_than, report_is_the_pods, trigger_is_the_pods,
            PAGE_KB,
        },
    },
};

mod kubelet;
pub use kubelet::Disagreement;
pub use kubelet::KubeletAccount;
pub use kubelet::KubeletContainer;
pub use kubelet::KubeletState;

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Explanation {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// Container instances, oldest first per container.
    #[serde(default)]
    pub instances: Vec<Instance>,
    /// The warnings that a container was about to be OOM-killed, oldest first (the lead-up to
    /// the kills below).
    #[serde(default)]
    pub warnings: Vec<Warning>,
    /// The last OOM kill of each instance that had one, oldest first.
    #[serde(default)]
    pub kills: Vec<Kill>,
    /// What kubelet reported for the containers, or why it is not shown.
    pub kubelet: KubeletAccount,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Instance {
    pub container: String,
    pub id: String,
    pub restart_count: u32,
    pub state: Cow<'static, str>,
    pub started_at: Option<String>,
    pub finished_at: Option<String>,
    pub exit_code: Option<i32>,
    pub signal: Option<u8>,
    pub reason: Option<String>,
    /// How the exit is known: `kernel` (watched), `kernel-log` or `runtime`.
    pub exit_source: Option<Cow<'static, str>>,
    /// What the runtime said where the agent corrected it.
    pub runtime_reason: Option<String>,
    pub oom_kills: u32,
}

/// A `MemoryNearLimit` warning (`crate::pressure`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Warning {
    pub container: String,
    pub restart_count: u32,
    pub time: String,
    /// `container`, `pod` or `cgroup`.
    pub scope: Cow<'static, str>,
    /// The Event's sentence.
    pub sentence: String,
    /// What the kernel cannot reclaim over the limit.
    pub ratio: f64,
    /// How long before the instance's last OOM kill it was raised (null: no kill after it).
    pub before_kill_ms: Option<u64>,
    /// The warning still stands (the MemoryPressure condition is True for it).
    pub standing: bool,
    /// At the reading that raised it: what cannot be reclaimed, the usage and the limit, bytes
    /// (0 from an agent that did not say).
    #[serde(default)]
    pub unreclaimable_bytes: u64,
    #[serde(default)]
    pub usage_bytes: u64,
    #[serde(default)]
    pub limit_bytes: u64,
    /// How fast what cannot be reclaimed grew, bytes a second, and the seconds to full at that
    /// rate (null: not measured yet, or not growing).
    #[serde(default)]
    pub growth_bytes_per_second: Option<f64>,
    #[serde(default)]
    pub time_left_seconds: Option<f64>,
    /// How the growth was measured: "between its crossings of 75 % and 86 % of the limit, 0.9 s
    /// apart" (the kernel's threshold records, no sampling), or between two readings at the limit.
    #[serde(default)]
    pub estimated: Option<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Kill {
    pub container: String,
    pub time: String,
    /// The Event's and the OOMKilled condition's sentence.
    pub sentence: String,
    /// `container`, `pod`, `cgroup`, `node` or `unknown`.
    pub scope: Cow<'static, str>,
    /// The cgroup above the pod (scope `cgroup`), or why the scope is unknown.
    pub scope_detail: Option<String>,
    pub victim: Victim,
    pub trigger_pid: Option<u32>,
    pub trigger_comm: Option<String>,
    pub trigger_container: Option<String>,
    pub group: bool,
    pub limit_bytes: Option<u64>,
    /// `kernel` (the probes) or `kernel-log`.
    pub source: Cow<'static, str>,
    /// The kernel's whole report, where the log held it (null: see `scope_detail`). When the
    /// report spans other pods (a node-level OOM, an ancestor's limit), their processes are
    /// taken out of it and counted in `others_withheld`.
    pub report: Option<OomReport>,
    pub others_withheld: Option<Withheld>,
}

/// Processes of a kill's report that may be other pods': counted, never named.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Withheld {
    pub processes: usize,
    pub rss_kb: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Victim {
    pub pid: u32,
    pub comm: String,
    /// The container's init (the container died of it); null when not known.
    pub init: Option<bool>,
    pub anon_rss_kb: Option<u64>,
    pub total_vm_kb: Option<u64>,
    pub oom_score_adj: Option<i16>,
}

fn state(p: ContainerPhase) -> &'static str {
    match p {
        ContainerPhase::Created => "created",
        ContainerPhase::Running => "running",
        ContainerPhase::Exited => "exited",
        ContainerPhase::Unknown => "unknown",
    }
}

fn time(t: Option<SystemTime>) -> Option<String> {
    t.map(rfc3339)
}

/// The pod's story; `container`: that container's instances and kills only. `api`: the API's
/// pod (its status is kubelet's account, its spec the memory limits), or why there is none.
pub fn explain(view: &PodView, container: Option<&str>, api: Result<&Pod, &str>) -> Explanation {
    let spec = api.ok().and_then(|p| p.spec.as_ref());
    let wanted = |c: &&ContainerView| container.is_none_or(|n| c.name == n);
    let instances = view
        .containers
        .iter()
        .filter(wanted)
        .map(|c| Instance {
            container: c.name.clone(),
            id: c.id.as_str().to_string(),
            restart_count: c.restart_count,
            state: state(c.phase).into(),
            started_at: time(c.started_at),
            finished_at: time(c.finished_at),
            exit_code: c.exit_code,
            signal: c.signal,
            reason: c.reason.clone(),
            exit_source: c.exit_source.map(|s| s.as_str().into()),
            runtime_reason: c.runtime_reason.clone(),
            oom_kills: c.oom_kills,
        })
        .collect();
    let mut kills: Vec<(SystemTime, Kill)> = view
        .containers
        .iter()
        .filter(wanted)
        .filter_map(|c| Some((c, c.last_oom.as_ref()?)))
        .map(|(c, o)| {
            let limit = memory_limit(spec, &c.name);
            (o.time, kill(view, c, o, limit.as_deref()))
        })
        .collect();
    kills.sort_by_key(|(t, _)| *t);
    let mut warnings: Vec<(SystemTime, Warning)> = view
        .containers
        .iter()
        .filter(wanted)
        .filter_map(|c| Some((c, c.memory.as_deref()?)))
        .flat_map(|(c, m)| {
            let n = m.raised.len();
            m.raised.iter().enumerate().map(move |(i, r)| {
                let before_kill_ms = c
                    .last_oom
                    .as_ref()
                    .and_then(|o| o.time.duration_since(r.time).ok())
                    .map(|d| d.as_millis() as u64);
                (
                    r.time,
                    Warning {
                        container: c.name.clone(),
                        restart_count: c.restart_count,
                        time: rfc3339(r.time),
                        scope: r.scope.label().into(),
                        sentence: r.sentence(),
                        ratio: r.ratio(),
                        before_kill_ms,
                        standing: m.warning && i + 1 == n,
                        unreclaimable_bytes: r.breakdown.unreclaimable(),
                        usage_bytes: r.usage_bytes,
                        limit_bytes: r.limit_bytes,
                        growth_bytes_per_second: r.growth,
                        time_left_seconds: r.eta(),
                        estimated: r.how_estimated(),
                    },
                )
            })
        })
        .collect();
    warnings.sort_by_key(|(t, _)| *t);
    Explanation {
        warnings: warnings.into_iter().map(|(_, w)| w).collect(),
        namespace: view.namespace.clone(),
        name: view.name.clone(),
        uid: view.uid.to_string(),
        instances,
        kills: kills.into_iter().map(|(_, k)| k).collect(),
        kubelet: kubelet::account(view, api, |n| container.is_none_or(|c| c == n)),
    }
}

fn kill(view: &PodView, c: &ContainerView, o: &OomEvidence, spec_limit: Option<&str>) -> Kill {
    let scope_detail = match &o.scope {
        OomScope::Cgroup(cg) => Some(cg.clone()),
        OomScope::Unknown(ScopeUnknown::LogNotRead) => {
            Some("the kernel log's report of this kill has not been read".into())
        }
        OomScope::Unknown(ScopeUnknown::ReportIncomplete) => {
            Some("the kernel log no longer holds the whole report".into())
        }
        OomScope::Unknown(ScopeUnknown::ReportRefused) => {
            Some("the kernel log's oom-kill line could not be read one way only".into())
        }
        OomScope::Unknown(ScopeUnknown::ReportNotPrinted) => {
            Some("the kernel printed no report of this kill (it prints at most 10 in 5 s)".into())
        }
        _ => None,
    };
    let trigger_ours = trigger_is_the_pods(o);
    let mut report = o.report.as_deref().cloned();
    let mut others_withheld = None;
    if let Some(r) = report.as_mut().filter(|_| !report_is_the_pods(o)) {
        let (processes, rss_kb) = others_than(r, o.pid).unwrap_or_default();
        others_withheld = Some(Withheld { processes, rss_kb });
        r.tasks.retain(|t| t.pid == o.pid);
        if !trigger_ours {
            r.trigger = None;
        }
    }
    let trigger = o
        .report
        .as_deref()
        .and_then(|r| r.trigger.as_ref())
        .filter(|_| trigger_ours);
    Kill {
        container: c.name.clone(),
        time: rfc3339(o.time),
        // The spec's limit is named as the spec's (from the API's pod), never as the one hit.
        sentence: describe_kill(o, Some(c), spec_limit),
        scope: o.scope.label().into(),
        scope_detail,
        victim: Victim {
            pid: o.pid,
            comm: o.comm.clone(),
            init: o.init,
            anon_rss_kb: o.anon_rss_kb,
            total_vm_kb: o.total_vm_kb,
            oom_score_adj: o.oom_score_adj,
        },
        trigger_pid: o
            .trigger_pid
            .filter(|_| trigger_ours)
            .or(trigger.and_then(|t| t.pid)),
        trigger_comm: trigger.map(|t| t.comm.clone()),
        trigger_container: o.trigger_container.filter(|_| trigger_ours).map(|id| {
            view.containers
                .iter()
                .find(|c| c.id == id)
                .map(|c| c.name.clone())
                .unwrap_or_else(|| id.as_str()[..12].to_string())
        }),
        group: o.group,
        limit_bytes: o.limit_bytes,
        source: o.source.as_str().into(),
        report,
        others_withheld,
    }
}

fn mib(kb: u64) -> String {
    crate::status::conditions::kib(kb)
}

/// The explanation as `kubectl describe` would print it.
pub fn render_text(e: &Explanation) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "Pod:        {}/{}",
        Printable(&e.namespace),
        Printable(&e.name)
    );
    let _ = writeln!(s, "UID:        {}", e.uid);
    render_lifecycle(e, &mut s);
    kubelet::render(&e.kubelet, &mut s);
    render_warnings(e, &mut s);
    if e.kills.is_empty() {
        let _ = writeln!(s, "OOM kills:  none");
    }
    for k in &e.kills {
        render_kill(k, &mut s);
    }
    s
}

fn render_lifecycle(e: &Explanation, s: &mut String) {
    use std::fmt::Write;
    let _ = writeln!(s, "Lifecycle (the agent's record, oldest first):");
    for i in &e.instances {
        let exit = match (i.exit_code, i.signal) {
            (Some(c), Some(sig)) => format!(" exit {c} (signal {sig})"),
            (Some(c), None) => format!(" exit {c}"),
            _ => String::new(),
        };
        let _ = writeln!(
            s,
            "  {} #{} {}: started {}{}{}{}{}{}",
            Printable(&i.container),
            i.restart_count,
            i.state,
            i.started_at.as_deref().unwrap_or("?"),
            i.finished_at
                .as_deref()
                .map(|f| format!(", finished {f}"))
                .unwrap_or_default(),
            exit,
            i.reason
                .as_deref()
                .map(|r| format!(" {}", Printable(r)))
                .unwrap_or_default(),
            i.exit_source
                .as_ref()
                .map(|src| format!(" (known from {src})"))
                .unwrap_or_default(),
            if i.oom_kills > 0 {
                format!(", {} OOM kill(s)", i.oom_kills)
            } else {
                String::new()
            },
        );
    }
}

fn render_warnings(e: &Explanation, s: &mut String) {
    use std::fmt::Write;
    for w in &e.warnings {
        let _ = writeln!(
            s,
            "MemoryNearLimit in {} #{} at {} (scope: {}){}{}:",
            Printable(&w.container),
            w.restart_count,
            w.time,
            w.scope,
            w.before_kill_ms
                .map(|ms| format!(", {:.1} s before its OOM kill", ms as f64 / 1000.0))
                .unwrap_or_default(),
            if w.standing { ", standing" } else { "" },
        );
        let _ = writeln!(s, "  {}", Printable(&w.sentence));
    }
}

/// One kill: what the kernel's report says of it, or why there is none.
fn render_kill(k: &Kill, s: &mut String) {
    use std::fmt::Write;
    let _ = writeln!(
        s,
        "OOM kill in {} at {} (scope: {}):",
        Printable(&k.container),
        k.time,
        k.scope
    );
    let _ = writeln!(s, "  {}", k.sentence);
    let Some(r) = &k.report else {
        let _ = writeln!(
            s,
            "  Report:   none ({})",
            k.scope_detail.as_deref().unwrap_or("not in the kernel log")
        );
        return;
    };
    if let Some(t) = &r.trigger {
        let _ = writeln!(
            s,
            "  Trigger:  {} (pid {}) gfp_mask={} order={} oom_score_adj={}",
            Printable(&t.comm),
            t.pid.map_or("?".into(), |p| p.to_string()),
            t.gfp_mask,
            t.order.map_or("?".into(), |o| o.to_string()),
            t.oom_score_adj.map_or("?".into(), |a| a.to_string()),
        );
    } else if k.others_withheld.is_some() && r.has_start {
        let _ = writeln!(
            s,
            "  Trigger:  not named (a process outside this container)"
        );
    } else {
        let _ = writeln!(s, "  Trigger:  unknown (the log lost the report's start)");
    }
    let cg = if r.oom_memcg.is_empty() {
        "none (global OOM)"
    } else {
        &r.oom_memcg
    };
    let _ = writeln!(s, "  Limit of: {}", Printable(cg));
    for c in &r.counters {
        let _ = writeln!(
            s,
            "  {:<9} usage {}, limit {}, failcnt {}",
            format!("{}:", c.name),
            mib(c.usage_kb),
            // v1 prints an unset limit as PAGE_COUNTER_MAX pages.
            if c.limit_kb >= 1 << 50 {
                "none".to_string()
            } else {
                mib(c.limit_kb)
            },
            c.failcnt
        );
    }
    if let Some(b) = &r.breakdown {
        let mut parts: Vec<String> = b
            .parts()
            .iter()
            .filter(|(_, v)| *v > 0)
            .map(|(k, v)| format!("{k} {}", mib(v / 1024)))
            .collect();
        if let Some(u) = b.unmapped_anon().filter(|&u| u >= 1 << 20) {
            parts.push(format!(
                "anon mapped by no process {} (an exited or killed process's, not yet freed)",
                mib(u / 1024)
            ));
        }
        let _ = writeln!(s, "  Filled:   {}", parts.join(", "));
    }
    if let Some(w) = &k.others_withheld {
        let _ = writeln!(
            s,
            "  Others:   {} processes held {} resident (not named: the report spans other pods)",
            w.processes,
            mib(w.rss_kb)
        );
    }
    if r.tasks_listed {
        let _ = writeln!(
            s,
            "  Tasks ({} listed, largest {}{}):",
            r.task_count,
            r.tasks.len(),
            if k.others_withheld.is_some() {
                ", this pod's victim only"
            } else {
                ""
            }
        );
        let _ = writeln!(
            s,
            "    {:>8} {:>10} {:>10} {:>10} {:>10} {:>6}  NAME",
            "PID", "RSS", "ANON", "FILE", "SHMEM", "ADJ"
        );
        let kb = |p: Option<u64>| p.map_or("-".into(), |p| mib(p * PAGE_KB));
        for t in &r.tasks {
            let _ = writeln!(
                s,
                "    {:>8} {:>10} {:>10} {:>10} {:>10} {:>6}  {}",
                t.pid,
                mib(t.rss_pages * PAGE_KB),
                kb(t.rss_anon_pages),
                kb(t.rss_file_pages),
                kb(t.rss_shmem_pages),
                t.oom_score_adj,
                Printable(&t.name)
            );
        }
    } else {
        let _ = writeln!(s, "  Tasks:    not listed (vm.oom_dump_tasks=0)");
    }
    let killed: Vec<String> = r
        .killed()
        .map(|k| format!("{} (pid {})", Printable(&k.comm), k.pid))
        .collect();
    let _ = writeln!(
        s,
        "  Killed:   {}{}",
        killed.join(", "),
        if r.group_cgroup.is_some() {
            " (memory.oom.group)"
        } else {
            ""
        }
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        cgroup::KubeRoots,
        kernel::kmsg,
        kube::testkit::{cv, oom, view},
        reconcile::merge::logged_oom,
    };

    fn logged(file: &str, n: usize) -> OomEvidence {
        let path = format!("{}/src/kernel/testdata/{file}", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(&path).unwrap();
        let k = &kmsg::parse(text.lines())[n];
        let roots = KubeRoots::of_kubelet_root("/").unwrap();
        let id = roots.classify(&k.task_memcg).container().unwrap().id;
        logged_oom(k, id, Some(false))
    }

    #[test]
    fn a_pod_level_kill_explained_in_full() {
        let o = logged("6.12-debian-v2.kmsg", 2);
        let mut app = cv("app", 0, ContainerPhase::Running);
        app.id = o.container_id;
        app.oom_kills = 1;
        app.last_oom = Some(o);
        let e = explain(&view(vec![app]), None, Err("no API"));
        assert_eq!(e.kills.len(), 1);
        let k = &e.kills[0];
        assert_eq!((k.scope.as_ref(), k.source.as_ref()), ("pod", "kernel-log"));
        assert_eq!(k.report.as_ref().unwrap().limit_kb(), Some(49152));
        let text = render_text(&e);
        for part in [
            "(scope: pod)",
            "the pod hit its pod-level 48.0 MiB limit",
            "Trigger:  dd (pid 446)",
            "memory:   usage 48.0 MiB, limit 48.0 MiB, failcnt 71",
            "shmem 15.",
            "Tasks (5 listed, largest 5):",
            "Killed:   dd (pid 446)",
        ] {
            assert!(text.contains(part), "{part:?} missing in\n{text}");
        }
        let json = serde_json::to_value(&e).unwrap();
        assert_eq!(json["kills"][0]["report"]["trigger"]["pid"], 446);
        assert_eq!(json["kills"][0]["scope"], "pod");
    }

    #[test]
    fn a_kill_beyond_the_pod_names_no_other_pods_process() {
        // The pod-level capture, told as if the node had run out: its report's other processes
        // and the trigger (made another container's) may then be other tenants'.
        let mut o = logged("6.12-debian-v2.kmsg", 2);
        o.scope = OomScope::Node;
        let other = cv("elsewhere", 1, ContainerPhase::Running).id;
        let report = o.report.clone().unwrap();
        let stranger = report.tasks.iter().find(|t| t.pid != o.pid).unwrap().pid;
        o.trigger_container = Some(other);
        o.trigger_pid = Some(stranger);
        let foreign: Vec<String> = report
            .tasks
            .iter()
            .filter(|t| t.pid != o.pid && t.name != o.comm)
            .map(|t| t.name.clone())
            .collect();
        assert!(!foreign.is_empty(), "the capture lists other processes");
        let mut app = cv("app", 0, ContainerPhase::Running);
        app.id = o.container_id;
        app.oom_kills = 1;
        app.last_oom = Some(o.clone());
        let e = explain(&view(vec![app]), None, Err("no API"));
        let k = &e.kills[0];
        let kept = &k.report.as_ref().unwrap().tasks;
        assert!(kept.iter().all(|t| t.pid == o.pid), "{kept:?}");
        let w = k.others_withheld.as_ref().unwrap();
        assert_eq!(w.processes, report.tasks.len() - kept.len());
        assert!(k.trigger_pid.is_none() && k.trigger_container.is_none());
        let text = render_text(&e);
        let json = serde_json::to_string(&e).unwrap();
        for name in &foreign {
            assert!(!text.contains(name.as_str()), "{name} named in\n{text}");
            assert!(
                !json.contains(&format!("\"{name}\"")),
                "{name} named in {json}"
            );
        }
        assert!(!text.contains(&format!("pid {stranger}")), "{text}");
        assert!(
            text.contains("Others:   ") && text.contains("Trigger:  not named"),
            "{text}"
        );
    }

    mod beside_kubelet {
        use k8s_openapi::api::core::v1::{
            ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStatus,
            PodStatus,
        };

        use super::*;
        use crate::{
            kube::testkit::{container, exited, pod, spec, t, with_memory_limit},
            status::compute::to_time,
        };

        fn terminated(c: &ContainerView, reason: Option<&str>, code: i32) -> ContainerState {
            ContainerState {
                terminated: Some(ContainerStateTerminated {
                    container_id: Some(format!("containerd://{}", c.id.as_str())),
                    reason: reason.map(str::to_string),
                    exit_code: code,
                    signal: None,
                    started_at: c.started_at.map(to_time),
                    finished_at: c.finished_at.map(to_time),
                    ..Default::default()
                }),
                ..Default::default()
            }
        }

        fn running() -> ContainerState {
            ContainerState {
                running: Some(ContainerStateRunning {
                    started_at: Some(to_time(t(20))),
                }),
                ..Default::default()
            }
        }

        fn api(c: &ContainerView, state: ContainerState, last: Option<ContainerState>) -> Pod {
            pod(
                spec(
                    "Always",
                    vec![],
                    vec![with_memory_limit(container("app"), "32Mi")],
                ),
                Some(PodStatus {
                    container_statuses: Some(vec![ContainerStatus {
                        name: "app".into(),
                        container_id: Some(format!("containerd://{}", c.id.as_str())),
                        restart_count: 1,
                        state: Some(state),
                        last_state: last,
                        ..Default::default()
                    }]),
                    ..Default::default()
                }),
            )
        }

        /// The init OOM-killed: the agent says OOMKilled / 137.
        fn init_killed() -> ContainerView {
            let mut c = exited("app", 0, 137, "OOMKilled");
            c.last_oom = Some(oom(&c, 4100, "sh", true));
            c.oom_kills = 1;
            c
        }

        #[test]
        fn kubelets_error_137_for_an_init_the_kernel_oom_killed_differs() {
            let dead = init_killed();
            let now = cv("app", 1, ContainerPhase::Running);
            let p = api(&now, running(), Some(terminated(&dead, Some("Error"), 137)));
            let e = explain(&view(vec![dead.clone(), now]), None, Ok(&p));
            let k = &e.kubelet;
            assert_eq!(k.unavailable, None);
            assert_eq!(k.containers.len(), 1);
            let app = &k.containers[0];
            assert_eq!(app.restart_count, Some(1));
            assert_eq!(
                app.state.as_ref().map(|s| s.state.as_ref()),
                Some("running")
            );
            let last = app.last_state.as_ref().expect("lastState");
            assert_eq!(
                (last.reason.as_deref(), last.exit_code),
                (Some("Error"), Some(137))
            );
            assert_eq!(app.disagreements.len(), 1, "{:#?}", app.disagreements);
            let d = &app.disagreements[0];
            assert_eq!(d.instance, dead.id.as_str());
            assert_eq!(
                (d.kubelet.as_str(), d.agent.as_str()),
                ("Error / 137", "OOMKilled / 137")
            );
            assert!(
                d.why
                    .starts_with("the kernel OOM-killed the container's init, sh (pid 4100)"),
                "{d:?}"
            );
            // The sentence names the spec's limit as the spec's, now that the pod is at hand.
            assert!(
                e.kills[0]
                    .sentence
                    .contains("the container's spec sets limit 32Mi"),
                "{}",
                e.kills[0].sentence
            );
            let text = render_text(&e);
            for part in [
                "Kubelet's account (the API's pod status) beside the agent's:",
                "  app: restartCount 1",
                "    state:      running, started ",
                "    lastState:  terminated Error, exit 137, started ",
                &format!("    DIFFERS {}: kubelet Error / 137, the agent OOMKilled / 137: the kernel OOM-killed the container's init, sh (pid 4100)", &dead.id.as_str()[..12]),
            ] {
                assert!(text.contains(part), "{part:?} missing in\n{text}");
            }
            let json = serde_json::to_value(&e).unwrap();
            assert_eq!(
                json["kubelet"]["containers"][0]["last_state"]["exit_code"],
                137
            );
            assert_eq!(
                json["kubelet"]["containers"][0]["disagreements"][0]["agent"],
                "OOMKilled / 137"
            );
        }

        #[test]
        fn kubelets_oomkilled_with_exit_0_after_a_childs_kill_differs() {
            let mut done = exited("app", 0, 0, "Completed");
            done.last_oom = Some(oom(&done, 4200, "dd", false));
            let p = api(&done, terminated(&done, Some("OOMKilled"), 0), None);
            let e = explain(&view(vec![done]), None, Ok(&p));
            let d = &e.kubelet.containers[0].disagreements;
            assert_eq!(d.len(), 1, "{d:#?}");
            assert_eq!(
                (d[0].kubelet.as_str(), d[0].agent.as_str()),
                ("OOMKilled / 0", "Completed / 0")
            );
            assert!(
                d[0].why
                    .starts_with("the kernel OOM-killed a child process, dd (pid 4200)"),
                "{d:?}"
            );
        }

        #[test]
        fn a_child_kill_kubelet_cannot_see_and_a_missing_reason_are_marked() {
            let mut up = cv("app", 0, ContainerPhase::Running);
            up.last_oom = Some(oom(&up, 4300, "hog", false));
            let p = api(&up, running(), None);
            let d = explain(&view(vec![up]), None, Ok(&p)).kubelet.containers[0]
                .disagreements
                .clone();
            assert_eq!(d.len(), 1, "{d:#?}");
            assert!(d[0].why.starts_with("kubelet reports no OOM kill: the kernel OOM-killed a child process, hog (pid 4300)"), "{d:?}");

            let dead = init_killed();
            let p = api(&dead, terminated(&dead, None, 137), None);
            let d = &explain(&view(vec![dead]), None, Ok(&p)).kubelet.containers[0].disagreements;
            assert_eq!(d[0].kubelet, "no reason / 137");
            assert!(
                d[0].why
                    .starts_with("the kernel OOM-killed the container's init"),
                "{d:?}"
            );
        }

        #[test]
        fn kubelet_not_caught_up_and_agreement() {
            let dead = init_killed();
            // kubelet still shows the instance running.
            let p = api(&dead, running(), None);
            let d = &explain(&view(vec![dead.clone()]), None, Ok(&p))
                .kubelet
                .containers[0]
                .disagreements;
            assert_eq!(d[0].kubelet, "running");
            assert!(d[0].why.contains("kubelet has not caught up"), "{d:?}");
            // kubelet wrote no status yet.
            let mut bare = api(&dead, running(), None);
            bare.status = None;
            let e = explain(&view(vec![dead.clone()]), None, Ok(&bare));
            let c = &e.kubelet.containers[0];
            assert_eq!((c.restart_count, c.state.as_ref()), (None, None));
            assert_eq!(c.disagreements[0].kubelet, "nothing");
            assert!(
                render_text(&e).contains("app: restartCount none (kubelet wrote no status for it)")
            );
            // The same account: nothing marked.
            let p = api(&dead, terminated(&dead, Some("OOMKilled"), 137), None);
            let e = explain(&view(vec![dead]), None, Ok(&p));
            assert!(e.kubelet.containers[0].disagreements.is_empty());
            assert!(render_text(&e).contains("    agrees with the agent's record\n"));
        }

        #[test]
        fn without_the_api_pod_it_says_so_in_one_line() {
            let e = explain(
                &view(vec![init_killed()]),
                None,
                Err("no --kubeconfig given"),
            );
            assert_eq!(
                e.kubelet.unavailable.as_deref(),
                Some("no --kubeconfig given")
            );
            let text = render_text(&e);
            assert_eq!(
                text.lines()
                    .filter(|l| l.starts_with("Kubelet's account"))
                    .collect::<Vec<_>>(),
                ["Kubelet's account: not shown (no --kubeconfig given)"]
            );
            let json = serde_json::to_value(&e).unwrap();
            assert_eq!(json["kubelet"]["unavailable"], "no --kubeconfig given");
        }
    }

    #[test]
    fn a_kill_without_its_report_says_so() {
        let mut app = cv("app", 0, ContainerPhase::Running);
        app.last_oom = Some(oom(&app, 7, "hog", false));
        let mut other = cv("side", 0, ContainerPhase::Running);
        other.last_oom = Some(oom(&other, 8, "x", false));
        let e = explain(&view(vec![app, other]), Some("app"), Err("no API"));
        assert_eq!(e.instances.len(), 1);
        assert_eq!(e.kills.len(), 1);
        assert_eq!(e.kills[0].scope, "unknown");
        let text = render_text(&e);
        assert!(
            text.contains(
                "Report:   none (the kernel log's report of this kill has not been read)"
            ),
            "{text}"
        );
    }
}
