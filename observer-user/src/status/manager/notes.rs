//! What the manager says besides status: Events (and log lines) for the deaths and OOM kills the
//! kernel reported, and in audit mode the disagreements with kubelet's status, rechecked once
//! the API's grace has passed.
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use tokio::time::Instant;

use super::{podlog::pod_log, stats::bump, KillKey, StatusManager};
use crate::{
    cri::PodRef,
    model::PodUid,
    reconcile::{
        ContainerPhase, ContainerView, OomEvidence, OomScope, PodView, ScopeUnknown, SCOPE_GRACE,
    },
    status::{
        audit::audit,
        conditions::memory_limit,
        events::{Late, PodEvent, Stood},
    },
};

impl StatusManager {
    pub(super) fn recheck(&mut self) {
        let now = Instant::now();
        let due: Vec<PodUid> = self
            .rechecks
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(uid, _)| *uid)
            .collect();
        for uid in due {
            self.rechecks.remove(&uid);
            self.process(&uid);
        }
    }

    /// Kills whose report did not come within the grace: published now, scope unknown.
    pub(super) fn release_held(&mut self) {
        let now = Instant::now();
        let due: Vec<PodUid> = self
            .held
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(uid, _)| *uid)
            .collect();
        for uid in due {
            self.held.remove(&uid);
            let Some(view) = self.state.get(&uid).and_then(|s| s.view.clone()) else {
                continue;
            };
            let pod = self.pods.of_view(&view);
            self.kernel_events(&view, pod.as_deref());
        }
    }

    fn pod_ref(view: &PodView, pod: Option<&Pod>) -> PodRef {
        // Events regard the API's pod: a static pod's mirror has a UID of its own.
        let uid = pod
            .and_then(|p| p.metadata.uid.clone())
            .unwrap_or_else(|| view.uid.to_string());
        PodRef {
            uid,
            namespace: view.namespace.clone(),
            name: view.name.clone(),
        }
    }

    /// OOM kills and deaths the kernel reported since the agent started, each once.
    pub(super) fn kernel_events(&mut self, view: &PodView, pod: Option<&Pod>) {
        let spec = pod.and_then(|p| p.spec.as_ref());
        let is_init = |name: &str| {
            spec.and_then(|s| s.init_containers.as_ref())
                .is_some_and(|ic| ic.iter().any(|c| c.name == name))
        };
        let started = self.epoch.wall;
        let max_age = self.cfg.events.max_age;
        let writes_alive = matches!(
            self.cfg.mode,
            crate::status::StatusMode::Conditions | crate::status::StatusMode::Full
        );
        let Some(st) = self.state.get_mut(&view.uid) else {
            return;
        };
        st.prune(view);
        // A held kill the view no longer shows (a group kill's next member took its place as
        // the container's last) is not waited for: the newer one is published.
        let shown: Vec<KillKey> = view
            .containers
            .iter()
            .filter_map(|c| Some(kill_key(c, c.last_oom.as_ref()?)))
            .collect();
        st.held.retain(|k, _| shown.contains(k));
        let mut out = Vec::new();
        for c in &view.containers {
            // Warnings before the kill: each raised once, those of this agent's time only.
            for (i, r) in c.memory.iter().flat_map(|m| {
                let first = m.raises - m.raised.len() as u32;
                m.raised
                    .iter()
                    .enumerate()
                    .map(move |(i, r)| (first + i as u32 + 1, r))
            }) {
                if r.time >= started && st.warnings.insert((c.id.to_string(), i)) {
                    out.push(PodEvent::MemoryNearLimit {
                        container: c.name.clone(),
                        init_container: is_init(&c.name),
                        reading: Box::new(r.clone()),
                        nth: i,
                    });
                }
            }
            if c.phase == ContainerPhase::Exited && !st.deaths.contains(c.id.as_str()) {
                let recent = c.finished_at.is_none_or(|f| f >= started);
                let late = if recent {
                    None
                } else if pod.is_none() && writes_alive {
                    // Whether an earlier agent told it is read from the API's pod: wait for it.
                    continue;
                } else {
                    untold_since(pod, &self.types.alive, c.finished_at, started, max_age).map(|l| {
                        Late {
                            exit_lost_since: c.started_at.filter(|_| exit_lost(c)),
                            ..l
                        }
                    })
                };
                st.deaths.insert(c.id.to_string());
                // A death since the start the kernel did not report (before the probes were
                // in, or lost with a full ring) is still a death: told from the runtime's
                // record, which must then say when it finished (one without a finish is no
                // news at every start). A start that failed (StartError, the start time the
                // epoch) ran nothing: kubelet's own Event tells it.
                let unseen = !c.kernel_seen
                    && c.finished_at.is_some_and(|f| f >= started)
                    && c.started_at.is_some_and(|s| s > UNIX_EPOCH);
                if (recent && c.kernel_seen) || unseen || late.is_some() {
                    out.push(PodEvent::ContainerDied {
                        container: c.name.clone(),
                        init_container: is_init(&c.name),
                        exit_code: c.exit_code,
                        signal: c.signal,
                        reason: Some(crate::status::compute::terminated_reason(c)),
                        kernel_seen: c.kernel_seen,
                        late,
                    });
                }
            }
            if let Some(o) = &c.last_oom {
                let key = kill_key(c, o);
                if told(&st.kills, &key) {
                    continue;
                }
                if o.time >= started && o.scope == OomScope::Unknown(ScopeUnknown::LogNotRead) {
                    // The probes saw the kill first; the log's report follows within
                    // milliseconds and changes the view again. The grace runs on the loop's
                    // clock from when the kill reached it (milliseconds after the kill: the
                    // view hands it over at once), not on the kernel's wall time.
                    let until = *st
                        .held
                        .entry(key.clone())
                        .or_insert_with(|| Instant::now() + SCOPE_GRACE);
                    if Instant::now() < until {
                        continue;
                    }
                }
                st.held.remove(&key);
                st.kills.insert(key);
                if o.time >= started {
                    out.push(PodEvent::OomKill {
                        container: c.name.clone(),
                        init_container: is_init(&c.name),
                        victim: Box::new(o.clone()),
                        limit: memory_limit(spec, &c.name),
                        view: Some(Box::new(c.clone())),
                    });
                }
            }
        }
        match st.held.values().min() {
            Some(at) => self.held.insert(view.uid, *at),
            None => self.held.remove(&view.uid),
        };
        let pod_ref = Self::pod_ref(view, pod);
        for ev in out {
            bump(&self.stats.events);
            // A late tell is said by the publisher, once it found no earlier agent's Event of it.
            if matches!(ev, PodEvent::ContainerDied { late: Some(_), .. }) {
                self.events.publish(&pod_ref, &ev);
                continue;
            }
            // The node's log says it too, for log pipelines (the Event may be rate-limited or
            // the API away).
            let (e, _) = ev.render();
            let note = e.note.as_deref().unwrap_or_default();
            pod_log(
                &mut self.logs,
                &self.stats,
                &view.uid,
                &view.name,
                || match ev {
                    PodEvent::OomKill { .. } | PodEvent::MemoryNearLimit { .. } => {
                        tracing::warn!(namespace = %view.namespace, pod = %view.name, reason = %e.reason, "{note}")
                    }
                    _ => {
                        tracing::info!(namespace = %view.namespace, pod = %view.name, reason = %e.reason, "{note}")
                    }
                },
            );
            self.events.publish(&pod_ref, &ev);
        }
    }

    pub(super) fn audit(&mut self, view: &PodView, pod: Option<&Pod>, now: SystemTime) {
        let Some(api) = pod.and_then(|p| p.status.as_ref()) else {
            bump(&self.stats.waiting_for_pod);
            return;
        };
        let grace = self.cfg.audit_running_grace;
        let findings = audit(api, view, now, grace);
        if let Some(due) = still_running_due(api, view, now, grace) {
            self.rechecks.insert(view.uid, Instant::now() + due);
        }
        let pod_ref = Self::pod_ref(view, pod);
        let Some(st) = self.state.get_mut(&view.uid) else {
            return;
        };
        for f in findings {
            if !st.findings.insert((f.container_id.clone(), f.kind)) {
                continue;
            }
            bump(&self.stats.audit_findings[f.kind.index()]);
            bump(&self.stats.events);
            pod_log(
                &mut self.logs,
                &self.stats,
                &view.uid,
                &view.name,
                || tracing::warn!(namespace = %view.namespace, pod = %view.name, finding = %f.kind, "{}", f.message()),
            );
            self.events.publish(&pod_ref, &PodEvent::Audit(f));
        }
    }
}

/// What identifies a kill among those said of a pod. A group kill is one: its report names the
/// victim the OOM killer chose, and every process killed with it shares that report (its one
/// Event names them all).
/// Whether the kill was told already: the same container and victim, its time within a second
/// (the probes' and the log's clocks agree to milliseconds, which can straddle a second).
fn told<'a>(kills: impl IntoIterator<Item = &'a KillKey>, key: &KillKey) -> bool {
    kills
        .into_iter()
        .any(|k| k.0 == key.0 && k.1 == key.1 && k.2.abs_diff(key.2) <= 1)
}

fn kill_key(c: &ContainerView, o: &OomEvidence) -> KillKey {
    let group_victim = o
        .report
        .as_deref()
        .filter(|_| o.group)
        .and_then(|r| r.victim.as_ref());
    if let Some(v) = group_victim {
        return (c.id.to_string(), v.pid, 0);
    }
    let secs = o.time.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    (c.id.to_string(), o.pid, secs)
}

/// When a death the API still shows as Running passes the audit's grace, if one is pending.
fn still_running_due(
    api: &PodStatus,
    view: &PodView,
    now: SystemTime,
    grace: Duration,
) -> Option<Duration> {
    let running_ids: Vec<&str> = api
        .container_statuses
        .iter()
        .chain(api.init_container_statuses.iter())
        .flatten()
        .filter(|s| s.state.as_ref().is_some_and(|st| st.running.is_some()))
        .filter_map(|s| s.container_id.as_deref())
        .map(|id| id.split_once("://").map_or(id, |(_, r)| r))
        .collect();
    view.containers
        .iter()
        .filter(|c| c.phase == ContainerPhase::Exited && running_ids.contains(&c.id.as_str()))
        .filter_map(|c| c.finished_at)
        .map(|f| (f + grace).duration_since(now).unwrap_or_default())
        .filter(|d| !d.is_zero())
        .min()
        // Just past the grace, so that the audit then finds it late.
        .map(|d| d + Duration::from_millis(10))
}

/// Whether the runtime's record of a death lost its exit (containerd restarted after the
/// container's task was gone: exit 255 `Unknown`, finished at its own restart).
fn exit_lost(c: &ContainerView) -> bool {
    // The runtime's own words: kept apart where the agent's account differs, else the account.
    let (code, reason) = match &c.runtime_reason {
        Some(_) => (c.runtime_exit_code, &c.runtime_reason),
        None => (c.exit_code, &c.reason),
    };
    !c.kernel_seen
        && code.is_some_and(|code| crate::reconcile::merge::runtime_lost_exit(code, reason))
}

/// Whether a death that finished before this agent's start (at `started`) may be untold, read
/// from the API's `ContainersAlive` (type `alive`):
/// - True since before the death: no agent wrote its False (an agent that was running would
///   have, moving the transition past the death). Not a death in the same second as that True:
///   the API's whole seconds cannot tell it from a death the True followed;
/// - False, the death within `max_age` (how long an agent keeps sending an Event): an earlier
///   agent wrote False and may have been stopped before its Event went out. The publisher
///   looks for that Event before telling it (see `events::told_already`).
fn untold_since(
    pod: Option<&Pod>,
    alive: &str,
    finished: Option<SystemTime>,
    started: SystemTime,
    max_age: Duration,
) -> Option<Late> {
    let finished = finished?;
    let c = pod?
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == alive)?;
    let since = SystemTime::from(c.last_transition_time.as_ref()?.0);
    let late = |stood| Late {
        since,
        finished,
        stood,
        started,
        exit_lost_since: None,
    };
    match c.status.as_str() {
        "True" => {
            // The API keeps whole seconds: a death and the restart's True in the same second
            // look alike to a death after the True. Told only when the True is from an earlier
            // second.
            let secs = |t: SystemTime| t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
            (secs(since) < secs(finished)).then(|| late(Stood::True))
        }
        "False" => started
            .duration_since(finished)
            .is_ok_and(|ago| ago <= max_age)
            .then(|| late(Stood::False)),
        _ => None,
    }
}
