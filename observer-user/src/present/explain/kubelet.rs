//! What kubelet wrote for each container (the API's pod status: state, lastState, restartCount)
//! beside the agent's record of the same instances, matched by container id, and where the two
//! accounts differ.
use k8s_openapi::api::core::v1::{ContainerState, ContainerStatus, Pod};
use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use crate::{
    model::Printable,
    reconcile::{ContainerPhase, ContainerView, OomEvidence, PodView},
    status::compute::rfc3339,
};

/// kubelet's account of the pod's containers.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct KubeletAccount {
    /// Why kubelet's account is not shown (no API pod to read); `containers` is then empty.
    pub unavailable: Option<String>,
    pub containers: Vec<KubeletContainer>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct KubeletContainer {
    pub container: String,
    pub init_container: bool,
    /// `null`: kubelet has written no status for this container.
    pub restart_count: Option<i32>,
    pub state: Option<KubeletState>,
    pub last_state: Option<KubeletState>,
    /// Where kubelet's account of an instance differs from the agent's (the kernel's).
    pub disagreements: Vec<Disagreement>,
}

/// One of kubelet's `state` / `lastState`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KubeletState {
    /// `running`, `waiting` or `terminated`.
    pub state: Cow<'static, str>,
    pub reason: Option<String>,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub started_at: Option<String>,
    pub finished_at: Option<String>,
    /// The instance, without the runtime's `containerd://` prefix.
    pub container_id: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Disagreement {
    /// The container instance (its id).
    pub instance: String,
    /// What kubelet says of it, and what the agent does.
    pub kubelet: String,
    pub agent: String,
    pub why: String,
}

fn strip(id: &str) -> &str {
    id.split_once("://").map_or(id, |(_, r)| r)
}

fn of(s: &ContainerState, id: Option<&str>) -> Option<KubeletState> {
    let id = id.map(|i| strip(i).to_string());
    if let Some(t) = &s.terminated {
        return Some(KubeletState {
            state: "terminated".into(),
            reason: t.reason.clone(),
            exit_code: Some(t.exit_code),
            signal: t.signal,
            started_at: t.started_at.as_ref().map(|t| t.0.to_string()),
            finished_at: t.finished_at.as_ref().map(|t| t.0.to_string()),
            // A terminated state names its own instance.
            container_id: t
                .container_id
                .as_deref()
                .map(|i| strip(i).to_string())
                .or(id),
        });
    }
    if let Some(r) = &s.running {
        return Some(KubeletState {
            state: "running".into(),
            reason: None,
            exit_code: None,
            signal: None,
            started_at: r.started_at.as_ref().map(|t| t.0.to_string()),
            finished_at: None,
            container_id: id,
        });
    }
    s.waiting.as_ref().map(|w| KubeletState {
        state: "waiting".into(),
        reason: w.reason.clone(),
        exit_code: None,
        signal: None,
        started_at: None,
        finished_at: None,
        container_id: None,
    })
}

impl KubeletState {
    fn summary(&self) -> String {
        match (self.state.as_ref(), &self.reason, self.exit_code) {
            ("terminated", r, Some(code)) => {
                format!("{} / {code}", r.as_deref().unwrap_or("no reason"))
            }
            ("waiting", Some(r), _) => format!("waiting ({r})"),
            (s, _, _) => s.to_string(),
        }
    }
}

fn agent_summary(c: &ContainerView) -> String {
    match c.phase {
        ContainerPhase::Exited => format!(
            "{} / {}",
            c.reason.as_deref().unwrap_or("no reason"),
            c.exit_code.map_or("?".into(), |e| e.to_string())
        ),
        ContainerPhase::Running => "running".into(),
        ContainerPhase::Created => "created".into(),
        ContainerPhase::Unknown => "unknown".into(),
    }
}

fn victim(o: &OomEvidence) -> String {
    format!("{} (pid {}) at {}", o.comm, o.pid, rfc3339(o.time))
}

/// Why kubelet's account of instance `c` (`k`: kubelet's state naming it, if any) differs from
/// the agent's; `None` where they agree. `newest`: `c` is one of the two newest instances, which
/// kubelet's state and lastState should name.
fn differs(c: &ContainerView, k: Option<&KubeletState>, newest: bool) -> Option<String> {
    let kill = c.last_oom.as_ref();
    let child_kill = kill.filter(|o| o.init != Some(true));
    let init_kill = kill.filter(|o| o.init == Some(true));
    let Some(k) = k else {
        return newest.then(|| match c.phase {
            ContainerPhase::Exited => {
                "kubelet has not reported this instance's end (nor the instance) yet".into()
            }
            _ => "kubelet has not reported this instance yet".into(),
        });
    };
    match (c.phase, k.state.as_ref()) {
        (ContainerPhase::Exited, "terminated") => {
            let same = k.reason == c.reason && k.exit_code == c.exit_code;
            if same {
                return None;
            }
            let kubelet_oom = k.reason.as_deref() == Some("OOMKilled");
            Some(match (init_kill, child_kill) {
                (Some(o), _) if !kubelet_oom => {
                    format!("the kernel OOM-killed the container's init, {}", victim(o))
                }
                (_, Some(o)) if kubelet_oom => format!(
                    "the kernel OOM-killed a child process, {}, not the init (kubernetes#104454)",
                    victim(o)
                ),
                (None, None) if kubelet_oom => {
                    "the kernel saw no OOM kill in this container (containerd marks any OOM \
                     event in the cgroup, a pod-level one included)"
                        .into()
                }
                _ if k.reason.is_none() => "kubelet gives no reason".into(),
                _ => format!(
                    "the agent's exit is known from {}",
                    c.exit_source.map_or("the runtime", |s| s.as_str())
                ),
            })
        }
        (ContainerPhase::Exited, _) => Some(format!(
            "the kernel saw it exit{}; kubelet has not caught up",
            c.finished_at
                .map(|f| format!(" at {}", rfc3339(f)))
                .unwrap_or_default()
        )),
        (ContainerPhase::Running, "running") => child_kill.map(|o| {
            format!(
                "kubelet reports no OOM kill: the kernel OOM-killed a child process, {}, and the \
                 container ran on",
                victim(o)
            )
        }),
        _ => None,
    }
}

/// kubelet's account from the API's `pod` (`Err`: why there is none) for the containers of
/// `view` that `wanted` selects.
pub(super) fn account(
    view: &PodView,
    api: Result<&Pod, &str>,
    wanted: impl Fn(&str) -> bool,
) -> KubeletAccount {
    let pod = match api {
        Ok(p) => p,
        Err(why) => {
            return KubeletAccount {
                unavailable: Some(why.to_string()),
                containers: Vec::new(),
            }
        }
    };
    let status = pod.status.as_ref();
    let statuses = |init: bool| -> &[ContainerStatus] {
        status
            .and_then(|s| {
                if init {
                    s.init_container_statuses.as_deref()
                } else {
                    s.container_statuses.as_deref()
                }
            })
            .unwrap_or_default()
    };
    // The spec's order (init containers first), then any name only the statuses or the view have.
    let mut names: Vec<(String, bool)> = Vec::new();
    let mut add = |n: &str, init: bool| {
        if wanted(n) && !names.iter().any(|(m, _)| m == n) {
            names.push((n.to_string(), init));
        }
    };
    if let Some(spec) = pod.spec.as_ref() {
        for c in spec.init_containers.iter().flatten() {
            add(&c.name, true);
        }
        for c in &spec.containers {
            add(&c.name, false);
        }
    }
    for init in [true, false] {
        for s in statuses(init) {
            add(&s.name, init);
        }
    }
    for c in &view.containers {
        add(&c.name, false);
    }
    let containers = names
        .into_iter()
        .map(|(name, init)| {
            let cs = statuses(init).iter().find(|s| s.name == name);
            let id = cs.and_then(|s| s.container_id.as_deref());
            let state = cs.and_then(|s| s.state.as_ref()).and_then(|s| of(s, id));
            // lastState's instance is named by its terminated record only.
            let last_state = cs
                .and_then(|s| s.last_state.as_ref())
                .and_then(|s| of(s, None));
            let mut mine: Vec<&ContainerView> =
                view.containers.iter().filter(|c| c.name == name).collect();
            mine.sort_by_key(|c| std::cmp::Reverse(c.restart_count));
            let disagreements = mine
                .iter()
                .enumerate()
                .filter_map(|(i, c)| {
                    let id = c.id.as_str();
                    let k = [&state, &last_state]
                        .into_iter()
                        .flatten()
                        .find(|k| k.container_id.as_deref() == Some(id));
                    let why = differs(c, k, i < 2)?;
                    Some(Disagreement {
                        instance: id.to_string(),
                        kubelet: k.map_or("nothing".into(), KubeletState::summary),
                        agent: agent_summary(c),
                        why,
                    })
                })
                .collect();
            KubeletContainer {
                container: name,
                init_container: init,
                restart_count: cs.map(|s| s.restart_count),
                state,
                last_state,
                disagreements,
            }
        })
        .collect();
    KubeletAccount {
        unavailable: None,
        containers,
    }
}

fn state_line(k: &KubeletState) -> String {
    let mut s = k.state.to_string();
    if let Some(r) = &k.reason {
        s.push_str(&format!(" {}", Printable(r)));
    }
    if let Some(code) = k.exit_code {
        s.push_str(&format!(", exit {code}"));
    }
    if let Some(sig) = k.signal {
        s.push_str(&format!(" (signal {sig})"));
    }
    if let Some(t) = &k.started_at {
        s.push_str(&format!(", started {t}"));
    }
    if let Some(t) = &k.finished_at {
        s.push_str(&format!(", finished {t}"));
    }
    if let Some(id) = &k.container_id {
        s.push_str(&format!(" ({})", Printable(short(id))));
    }
    s
}

fn short(id: &str) -> &str {
    id.get(..12).unwrap_or(id)
}

/// The account as `observer explain` prints it.
pub(super) fn render(k: &KubeletAccount, out: &mut String) {
    use std::fmt::Write;
    if let Some(why) = &k.unavailable {
        let _ = writeln!(out, "Kubelet's account: not shown ({why})");
        return;
    }
    let _ = writeln!(
        out,
        "Kubelet's account (the API's pod status) beside the agent's:"
    );
    for c in &k.containers {
        let _ = writeln!(
            out,
            "  {}{}: restartCount {}",
            Printable(&c.container),
            if c.init_container { " (init)" } else { "" },
            c.restart_count
                .map_or("none (kubelet wrote no status for it)".into(), |r| r
                    .to_string())
        );
        let none = "none".to_string();
        let _ = writeln!(
            out,
            "    state:      {}",
            c.state.as_ref().map_or(none.clone(), state_line)
        );
        let _ = writeln!(
            out,
            "    lastState:  {}",
            c.last_state.as_ref().map_or(none, state_line)
        );
        if c.disagreements.is_empty() {
            let _ = writeln!(out, "    agrees with the agent's record");
        }
        for d in &c.disagreements {
            let _ = writeln!(
                out,
                "    DIFFERS {}: kubelet {}, the agent {}: {}",
                Printable(short(&d.instance)),
                Printable(&d.kubelet),
                Printable(&d.agent),
                d.why
            );
        }
    }
}
