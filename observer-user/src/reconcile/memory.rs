//! The reconciler's account of memory pressure: each limit hit the PLEG reports is read against
//! the container's memory cgroups and judged (`crate::pressure`); the view changes only when a
//! warning is raised, first measured or lowered, so a cgroup at its limit costs no status writes.
use std::time::SystemTime;

use super::{bump, Reconciler, RuntimeService};
use crate::{
    kernel::LimitHit,
    model::{ContainerId, PodUid},
    pressure::{metrics::Named, read::PressureError, Change, Pressure},
};

/// One container instance's pressure, live and as shown.
#[derive(Debug, Default)]
pub(super) struct Tracked {
    live: Pressure,
    /// The container's cgroup, hierarchy-relative (for a quiet warning's recheck).
    cgroup: String,
    /// What the view shows.
    pub(super) shown: Option<Box<Pressure>>,
    /// A read error was logged for this container already.
    logged: bool,
}

impl<R: RuntimeService> Reconciler<R> {
    pub(super) fn on_limit_hit(
        &mut self,
        uid: PodUid,
        id: ContainerId,
        hit: &LimitHit,
        cgroup: &str,
    ) {
        let Some(reader) = &self.memory else {
            return;
        };
        let now = self.clock.to_system_time(hit.at);
        let t = self
            .tracked
            .entry(id)
            .or_insert_with(|| super::Tracked::new(uid));
        let p = t.pressure.get_or_insert_with(|| Tracked {
            cgroup: cgroup.to_string(),
            ..Default::default()
        });
        // The largest processes are read only where a warning may be raised.
        let reading = match reader.read(cgroup, hit, now, !p.live.warning) {
            Ok(r) => r,
            Err(e @ PressureError::NotAbove { .. }) => {
                bump(&self.shared.stats.limit_hits_elsewhere);
                tracing::debug!(container = %id, error = %e, "limit hit not judged");
                return;
            }
            Err(e) => {
                bump(&self.shared.stats.limit_hit_read_errors);
                if !std::mem::replace(&mut p.logged, true) {
                    tracing::warn!(container = %id, error = %e, "a memory limit hit could not be read: no memory warning for this container (is the host's cgroupfs mounted into the agent?)");
                }
                return;
            }
        };
        bump(&self.shared.stats.limit_hits_read);
        self.judge(uid, id, reading);
    }

    /// Warnings standing without a limit hit for a while are read once more, to lower them.
    pub(super) fn recheck_pressure(&mut self) {
        let Some(reader) = self.memory.clone() else {
            return;
        };
        let now = self.wall.now();
        let due: Vec<(ContainerId, PodUid, String, crate::pressure::Scope)> = self
            .tracked
            .iter()
            .filter_map(|(id, t)| {
                let p = t.pressure.as_ref()?;
                let scope = p.live.last.as_ref()?.scope.clone();
                p.live
                    .recheck_due(now)
                    .then(|| (*id, t.pod, p.cgroup.clone(), scope))
            })
            .collect();
        for (id, uid, cgroup, scope) in due {
            match reader.reread(&cgroup, &scope, now) {
                Ok(r) => self.judge(uid, id, r),
                // The cgroup is gone with its container: the warning goes with the instance.
                Err(_) => {
                    if let Some(p) = self.tracked.get_mut(&id).and_then(|t| t.pressure.as_mut()) {
                        p.live.warning = false;
                        p.live.since = Some(now);
                    }
                }
            }
        }
    }

    fn judge(&mut self, uid: PodUid, id: ContainerId, reading: crate::pressure::Reading) {
        let Some(p) = self.tracked.get_mut(&id).and_then(|t| t.pressure.as_mut()) else {
            return;
        };
        let change = p.live.apply(reading);
        {
            let view = self.shared.view();
            if let Some((pod, c)) = view
                .get(&uid)
                .and_then(|pod| Some((pod, pod.containers.iter().find(|c| c.id == id)?)))
            {
                if let Some(r) = &p.live.last {
                    self.shared.pressure.record(
                        &Named {
                            namespace: &pod.namespace,
                            pod: &pod.name,
                            container: &c.name,
                        },
                        r,
                        change,
                    );
                }
            }
        }
        if change == Change::Same {
            return;
        }
        if change == Change::Raised {
            if let Some(r) = p.live.raised.last() {
                tracing::debug!(container = %id, at = ?r.time.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default(), "memory warning: {}", r.sentence());
            }
        }
        p.shown = Some(Box::new(p.live.clone()));
        self.remerge(uid, id);
    }
}
