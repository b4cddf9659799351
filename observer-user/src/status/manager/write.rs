//! The write decision: what the mode writes, whether it differs from what was sent or what the
//! API has, and what each write's outcome means.
use std::{sync::Arc, time::SystemTime};

use k8s_openapi::api::core::v1::{Pod, PodCondition};
use tokio::time::Instant;

use super::{podlog::pod_log, stats::bump, StatusManager};
use crate::{
    kube::KubeError,
    reconcile::PodView,
    runner::Priority,
    status::{
        compute::{compute_status, StatusInputs},
        conditions::observer_conditions,
        ledger::{caught_up, gated_on, ManagerTurn},
        patch::{conditions_patch, normalize, status_patch},
        writer::{WriteDone, WriteJob, WriteOutcome},
        StatusMode,
    },
};

impl StatusManager {
    pub(super) fn finished(&mut self, done: WriteDone) {
        let stats = &*self.stats;
        let Ok((job, outcome)) = done.output else {
            bump(&stats.write_errors);
            return;
        };
        let st = self.state.get_mut(&job.uid);
        match outcome {
            WriteOutcome::Written { sent_at } => {
                bump(&stats.writes);
                // The API server is back: the pods waiting out a back-off from its absence are
                // written now, not up to `backoff_max` later.
                if std::mem::take(&mut self.api_away) {
                    tracing::info!(
                        pending = self.writer.pending(),
                        "the API server answers status writes again; the pods waiting are written now"
                    );
                    self.writer.expedite();
                }
                let latency = sent_at.saturating_duration_since(job.observed_at);
                stats.write_latency.observe(latency);
                if let Some(st) = st {
                    st.written = Some(job.desired);
                }
            }
            WriteOutcome::Gone | WriteOutcome::Conflict => {
                if matches!(outcome, WriteOutcome::Gone) {
                    bump(&stats.gone);
                } else {
                    bump(&stats.conflicts);
                }
                pod_log(&mut self.logs, stats, &job.uid, &job.name, || {
                    tracing::info!(pod = %job.name, uid = %job.uid, "status not written: {outcome:?}; the pod's work is dropped");
                });
                if let Some(st) = st {
                    st.gone = true;
                    st.submitted = None;
                }
            }
            WriteOutcome::Rejected(e) => {
                bump(&stats.rejected);
                pod_log(&mut self.logs, stats, &job.uid, &job.name, || {
                    tracing::error!(pod = %job.name, "status patch refused: {e}");
                });
                if let Some(st) = st {
                    st.submitted = None;
                }
            }
            WriteOutcome::Throttled(after) => {
                bump(&stats.throttled);
                tracing::debug!(pod = %job.name, ?after, "status write throttled");
            }
            WriteOutcome::Failed(e) => {
                bump(&stats.write_errors);
                // The API server away: one line for the outage, not one per pod.
                let away = matches!(e, KubeError::Client(_) | KubeError::Timeout(_));
                let first = away && !std::mem::replace(&mut self.api_away, true);
                // A crash-looping pod would log every retry: powers of two.
                if first || (!away && done.failures.is_power_of_two()) {
                    let why = crate::kube::describe(&e, &self.cfg.api_url);
                    pod_log(&mut self.logs, stats, &job.uid, &job.name, || {
                        tracing::warn!(pod = %job.name, failures = done.failures, "status write failed: {why}; retrying");
                    });
                }
            }
        }
    }

    /// Computes what the mode writes and hands it to the writer unless nothing changed.
    pub(super) fn write(&mut self, view: &PodView, pod: &Arc<Pod>, now: SystemTime) {
        let stats = &self.stats;
        let Some(st) = self.state.get_mut(&view.uid) else {
            return;
        };
        if st.gone {
            return;
        }
        bump(&stats.computed);
        // The precondition is the API's UID (a static pod's mirror has its own).
        let api_uid = pod
            .metadata
            .uid
            .clone()
            .unwrap_or_else(|| view.uid.to_string());
        let api = pod.status.clone().unwrap_or_default();
        let api_conditions = api.conditions.as_deref().unwrap_or(&[]);
        let mut priority = Priority::Normal;
        let result = if self.cfg.mode == StatusMode::Conditions {
            // The fast path's claim on ContainersAlive: wait for the view to show the death it
            // wrote (writing now would say True again), then keep its transition time.
            let turn = self.ledger.as_ref().map(|l| {
                // What the fast path decides the pod's next death from.
                l.prepare(view.uid, view, pod, &self.types);
                l.manager_turn(&view.uid, |c| caught_up(view, c))
            });
            let (fast, confirmed) = match turn {
                Some(ManagerTurn::Wait | ManagerTurn::InFlight) => {
                    bump(&stats.fast_waits);
                    return;
                }
                Some(ManagerTurn::AdoptClaim { alive, confirmed }) => (Some(alive), confirmed),
                Some(ManagerTurn::Unclaimed { alive }) => (alive, false),
                None => (None, false),
            };
            // Transition times from the last ContainersAlive submitted (either path), what this
            // agent last computed, else the API's.
            let mut old: Vec<PodCondition> = fast.iter().cloned().collect();
            old.extend(st.conditions.iter().cloned());
            old.extend(
                api_conditions
                    .iter()
                    .filter(|c| !st.conditions.iter().any(|o| o.type_ == c.type_))
                    .cloned(),
            );
            let desired = observer_conditions(Some(pod), view, &old, &self.types, now);
            let normal = serde_json::to_value(&desired).map_err(crate::kube::KubeError::from);
            // What the API has: the reflector's copy, but this manager's conditions as the API
            // last accepted them and the fast path's False once the API accepted it. The
            // reflector's copy can be older than either (a watch that lags, or broke while the
            // API server was away): a death's False written since must not read as "the API
            // already says True", and what was written is not sent again. Only what was
            // accepted: a submitted patch can be superseded before it is sent, and a patch
            // made against it would then leave out fields the API never got.
            let mut base: Vec<PodCondition> = api_conditions.to_vec();
            let ours: Vec<PodCondition> = st
                .written
                .as_deref()
                .and_then(|w| serde::Deserialize::deserialize(w).ok())
                .unwrap_or_default();
            for c in ours.iter().chain(fast.iter().filter(|_| confirmed)) {
                base.retain(|b| b.type_ != c.type_);
                base.push(c.clone());
            }
            let patch = conditions_patch(&api_uid, &base, &desired);
            priority = if !turns_false(&base, &desired, &self.types.alive) {
                Priority::Normal
            } else if gated_on(pod, &self.types.alive) {
                Priority::High
            } else {
                Priority::Raised
            };
            if let (Some(l), Some(a)) = (
                &self.ledger,
                desired.iter().find(|c| c.type_ == self.types.alive),
            ) {
                l.record(view.uid, a.clone());
            }
            st.conditions = desired;
            normal.and_then(|n| patch.map(|p| (n, p)))
        } else {
            let computed = compute_status(&StatusInputs {
                pod: Some(pod),
                view,
                previous: st.status.as_ref(),
                now,
                runtime: &self.cfg.runtime_name,
                types: &self.types,
            });
            let normal = normalize(&computed.status);
            let patch = status_patch(&api_uid, &api, &computed.status);
            let now_ready = computed.status.conditions.as_deref().unwrap_or(&[]);
            if turns_false(api_conditions, now_ready, "ContainersReady") {
                priority = Priority::High;
            }
            st.status = Some(computed.status);
            normal.and_then(|n| patch.map(|p| (n, p)))
        };
        let (normal, patch) = match result {
            Ok(r) => r,
            Err(e) => {
                pod_log(&mut self.logs, stats, &view.uid, &view.name, || {
                    tracing::error!(pod = %view.name, "status not computed: {e}");
                });
                return;
            }
        };
        let normal = Arc::new(normal);
        if st.submitted.as_deref() == Some(&*normal) {
            bump(&stats.unchanged);
            st.observed_at = None;
            return;
        }
        let Some(body) = patch else {
            // The API already says so.
            bump(&stats.unchanged);
            st.submitted = Some(Arc::clone(&normal));
            st.written = Some(normal);
            st.observed_at = None;
            return;
        };
        st.submitted = Some(Arc::clone(&normal));
        let observed_at = st.observed_at.take().unwrap_or_else(Instant::now);
        bump(&stats.submitted);
        self.writer.submit(WriteJob {
            namespace: view.namespace.clone(),
            name: view.name.clone(),
            uid: view.uid,
            body: Arc::new(body),
            desired: normal,
            observed_at,
            priority,
        });
    }
}

/// Whether condition `ty` goes to False from anything else (a pod's first death, not a
/// restart's): what a burst of writes must not hold back.
fn turns_false(base: &[PodCondition], desired: &[PodCondition], ty: &str) -> bool {
    let status = |cs: &[PodCondition]| {
        cs.iter()
            .find(|c| c.type_ == ty)
            .map(|c| c.status == "False")
    };
    status(desired) == Some(true) && status(base) != Some(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(status: &str) -> PodCondition {
        PodCondition {
            type_: "A".into(),
            status: status.into(),
            ..Default::default()
        }
    }

    #[test]
    fn only_a_change_to_false_is_a_first_death() {
        assert!(turns_false(&[c("True")], &[c("False")], "A"));
        assert!(turns_false(&[], &[c("False")], "A"));
        assert!(
            !turns_false(&[c("False")], &[c("False")], "A"),
            "a restart's"
        );
        assert!(!turns_false(&[c("False")], &[c("True")], "A"));
        assert!(!turns_false(&[c("True")], &[c("False")], "B"));
    }
}
