//! The transition a container's death causes to its pod's `ContainersAlive`, decided here
//! whichever transport sends it: the fast path's own connections on the reader's thread
//! (`fastpath/`), or the status manager's writer, which computes the same condition with the
//! same function ([`observer_conditions`]) from its view once the reconciler has the death.
//!
//! A death is decided from what the manager last computed of the pod (the ledger's
//! [`ManagerSnapshot`]), so the reader's thread waits for no lock of the reconciler's or the
//! reflector's. A failed death of a running container was made ahead there ([`Prepared`]):
//! only its words and time are filled in. Any other (an exit 0) is applied to the view by the
//! merge rules' first rule ([`with_death`]: the kernel's exit is the exit) and the conditions
//! computed in full. Either way the transition is claimed in the [`AliveLedger`] before a byte
//! is written, and skipped when the ledger (or, where it has none, the API) says False already.
use std::{sync::Arc, time::SystemTime};

use k8s_openapi::api::core::v1::{Pod, PodCondition};

use super::{
    conditions::{observer_conditions, ConditionTypes},
    ledger::{AliveLedger, ManagerSnapshot},
    patch::conditions_patch,
    prepared::{DeathDetails, Prepared},
};
use crate::{model::BootClock, pleg::Death, reconcile::merge::with_death};

/// A death's status patch, claimed in the ledger and encoded for the wire.
pub struct DeathPatch {
    /// What it was decided from (where the pod's namespace and name come from).
    pub basis: Arc<ManagerSnapshot>,
    body: Body,
}

enum Body {
    /// The basis's `prepared[i]` with what the death brings. Its condition goes to the ledger
    /// after the request is written ([`DeathPatch::settle`]): only the request's bytes are put
    /// together before send(2).
    FromPrepared {
        prepared: usize,
        filled: DeathDetails,
        now: SystemTime,
    },
    /// Computed in full, and claimed with its condition.
    Computed(Vec<u8>),
}

impl DeathPatch {
    /// The body in parts, to be written one after the other.
    pub fn parts(&self) -> [&[u8]; 11] {
        match &self.body {
            Body::FromPrepared {
                prepared, filled, ..
            } => self.basis.prepared[*prepared].body(filled),
            Body::Computed(b) => {
                let mut parts: [&[u8]; 11] = [&[]; 11];
                parts[0] = b;
                parts
            }
        }
    }

    /// A made-ahead death's condition into the ledger ([`AliveLedger::record_condition`]),
    /// once its request is written (or could not be). A computed one was claimed with it.
    pub fn settle(self, ledger: &AliveLedger, types: &ConditionTypes, death: &Death) {
        if let Body::FromPrepared {
            prepared,
            filled,
            now,
        } = &self.body
        {
            let alive = self.basis.prepared[*prepared].condition(types, filled.words(), *now);
            ledger.record_condition(&death.pod, death.container, alive);
        }
    }
}

/// The transition `d` causes, claimed in `ledger` for the caller to send: `None` when it is no
/// transition to False (the ledger or the API says False already, another death is claimed,
/// the container stays covered), or the manager has not computed the pod yet.
pub fn transition(
    ledger: &AliveLedger,
    types: &ConditionTypes,
    d: &Death,
    clock: &BootClock,
    now: SystemTime,
) -> Option<DeathPatch> {
    let basis = ledger.basis(&d.pod)?;
    let made = Prepared::fits(d)
        .then(|| {
            basis
                .prepared
                .iter()
                .position(|p| p.container == d.container)
        })
        .flatten();
    let body = match made {
        // Made ahead: the death's words and time spliced in.
        Some(i) => {
            let filled = basis.prepared[i].fill(d, clock, now)?;
            // The ledger refuses a False itself; the API's condition is looked at only where
            // the ledger has none (the pod object is many cold pages).
            let claimed = ledger.claim_ahead(d.pod, d.container, |last| {
                last.is_some() || api_alive(&basis.pod, types).is_none_or(|k| k.status != "False")
            });
            claimed.then_some(())?;
            Body::FromPrepared {
                prepared: i,
                filled,
                now,
            }
        }
        None => Body::Computed(in_full(ledger, types, d, clock, &basis, now)?),
    };
    Some(DeathPatch { basis, body })
}

/// The pod's `ContainersAlive` as the API has it.
fn api_alive<'a>(pod: &'a Pod, types: &ConditionTypes) -> Option<&'a PodCondition> {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == types.alive))
}

/// [`transition`] for a death no patch was made for: the conditions computed as the status
/// manager computes them, from the view with the death applied, the patch against the last
/// submitted condition.
fn in_full(
    ledger: &AliveLedger,
    types: &ConditionTypes,
    d: &Death,
    clock: &BootClock,
    basis: &ManagerSnapshot,
    now: SystemTime,
) -> Option<Vec<u8>> {
    let pod = &basis.pod;
    let api = api_alive(pod, types);
    let dead = with_death(&basis.view, d, clock)?;
    let api_uid = pod.metadata.uid.as_deref()?;
    let (before, alive) = ledger.claim(d.pod, d.container, |last| {
        // The last submitted first, then what the API has (for the transition time).
        let known = last.or(api);
        if known.is_some_and(|k| k.status == "False") {
            return None;
        }
        let old: Vec<PodCondition> = known.cloned().into_iter().collect();
        observer_conditions(Some(pod), &dead, &old, types, now)
            .into_iter()
            .find(|c| c.type_ == types.alive)
            .filter(|c| c.status == "False")
    })?;
    // The base is what was last submitted, else the API's.
    let base: Vec<PodCondition> = before.or_else(|| api.cloned()).into_iter().collect();
    let body = conditions_patch(api_uid, &base, std::slice::from_ref(&alive)).ok()??;
    serde_json::to_vec(&body).ok()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{
        kernel::WaitStatus,
        kube::testkit::{container, cv, exited, pod, sidecar, spec, view},
        pleg::{ContainerExit, ExitReason},
        reconcile::{ContainerPhase, PodView},
    };

    /// A death's patch made at the manager's turn is the one the full computation gives (the
    /// same JSON, the same condition in the ledger) for every shape of failed death; an exit 0
    /// is left to the full computation.
    #[test]
    fn a_prepared_death_is_the_full_computation() {
        let types = ConditionTypes::new("observer.dev");
        let clock = BootClock::default();
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let run = ContainerPhase::Running;
        let two = spec("Always", vec![], vec![container("app"), container("log")]);
        let with_sidecar = spec("Never", vec![sidecar("proxy")], vec![container("app")]);
        let shapes: Vec<(&str, Option<k8s_openapi::api::core::v1::PodSpec>, PodView)> = vec![
            (
                "one container",
                Some(two.clone()),
                view(vec![cv("app", 0, run), cv("log", 0, run)]),
            ),
            (
                "restarted",
                Some(two.clone()),
                view(vec![cv("app", 3, run), cv("log", 1, run)]),
            ),
            (
                "another already dead",
                Some(two.clone()),
                view(vec![cv("app", 0, run), exited("log", 0, 2, "Error")]),
            ),
            (
                "another not started",
                Some(two),
                view(vec![cv("app", 0, run)]),
            ),
            (
                "a sidecar",
                Some(with_sidecar),
                view(vec![cv("proxy", 0, run), cv("app", 0, run)]),
            ),
            (
                "no spec",
                None,
                view(vec![cv("app", 0, run), cv("log", 0, run)]),
            ),
        ];
        let endings = [
            (WaitStatus::exited(1), ExitReason::Error),
            (WaitStatus::exited(0), ExitReason::Completed),
            (WaitStatus::signaled(9, false), ExitReason::OomKilled),
            (WaitStatus::signaled(11, true), ExitReason::Error),
        ];
        let mut made = 0;
        for (shape, spec, view) in &shapes {
            let api = Arc::new(pod(spec.clone().unwrap_or_default(), None));
            let api = if spec.is_some() {
                api
            } else {
                Arc::new(Pod {
                    spec: None,
                    ..(*api).clone()
                })
            };
            for c in view.containers.iter().filter(|c| c.phase == run) {
                for (status, reason) in endings {
                    let death = Death {
                        pod: view.uid,
                        container: c.id,
                        at: crate::model::BootNs(1),
                        exit: ContainerExit {
                            status: Some(status),
                            reason,
                            pid: Some(4242),
                            comm: None,
                        },
                    };
                    let ledger = |prepared: bool| {
                        let ledger = AliveLedger::default();
                        ledger.prepare(view.uid, view, &api, &types);
                        if !prepared {
                            let b = ledger.basis(&view.uid).unwrap();
                            ledger.set_basis(
                                view.uid,
                                ManagerSnapshot {
                                    view: b.view.clone(),
                                    pod: Arc::clone(&b.pod),
                                    prepared: Vec::new(),
                                    gated: b.gated,
                                },
                            );
                        }
                        ledger
                    };
                    let (fast, full) = (ledger(true), ledger(false));
                    let has = fast
                        .basis(&view.uid)
                        .unwrap()
                        .prepared
                        .iter()
                        .any(|p| p.container == c.id);
                    let what = format!("{shape}, {} {status:?}", c.name);
                    let a = transition(&fast, &types, &death, &clock, now);
                    let b = transition(&full, &types, &death, &clock, now);
                    let json = |p: &Option<DeathPatch>| {
                        p.as_ref().map(|p| {
                            serde_json::from_slice::<serde_json::Value>(&p.parts().concat())
                                .unwrap()
                        })
                    };
                    assert_eq!(json(&a), json(&b), "{what}");
                    // A made death's condition reaches the ledger once its request is written.
                    if let Some(p) = a {
                        p.settle(&fast, &types, &death);
                    }
                    assert!(
                        b.is_some() || !Prepared::fits(&death),
                        "{what}: every failed death here is a transition"
                    );
                    assert_eq!(fast.last(&view.uid), full.last(&view.uid), "{what}");
                    if Prepared::fits(&death) {
                        assert!(
                            has,
                            "{what}: a running container's failed death is made ahead"
                        );
                        made += 1;
                    }
                }
            }
        }
        assert!(made >= 20, "{made} prepared deaths checked");
    }

    /// The view a death is computed from is the reconciler's after it applied the kernel's
    /// exit: the same function ([`with_death`]) as the merge rules' first rule.
    #[test]
    fn the_dead_view_is_the_merge_rules() {
        use crate::reconcile::{
            merge::{merge, Inputs},
            KernelEvidence, Source,
        };
        let clock = BootClock::default();
        let v = view(vec![cv("app", 0, ContainerPhase::Running)]);
        let id = v.containers[0].id;
        for (status, reason) in [
            (WaitStatus::exited(0), ExitReason::Completed),
            (WaitStatus::exited(3), ExitReason::Error),
            (WaitStatus::signaled(9, false), ExitReason::OomKilled),
        ] {
            let exit = ContainerExit {
                status: Some(status),
                reason,
                pid: Some(7),
                comm: None,
            };
            let d = Death {
                pod: v.uid,
                container: id,
                at: crate::model::BootNs(5_000_000_000),
                exit: exit.clone(),
            };
            let dead = with_death(&v, &d, &clock).expect("a known container");
            let kernel = KernelEvidence {
                exit: Some((d.at, exit)),
                ..Default::default()
            };
            let merged = merge(
                Inputs {
                    kernel: Some(&kernel),
                    ..Inputs::new(id)
                },
                &clock,
            );
            let c = &dead.containers[0];
            assert_eq!(
                (c.phase, c.exit_code, c.signal, &c.reason, c.finished_at),
                (
                    merged.phase,
                    merged.exit_code,
                    merged.signal,
                    &merged.reason,
                    merged.finished_at
                ),
                "{status:?}"
            );
            assert_eq!(c.exit_source, Some(Source::Kernel));
        }
    }
}
