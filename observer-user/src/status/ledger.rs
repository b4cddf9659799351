//! The one owner of `ContainersAlive`'s truth, shared by the status manager and the fast path
//! (the only state the two writers share): the last condition either side submitted per pod, the
//! fast path's claim on a death's False transition, and each pod's [`ManagerSnapshot`] (the view and API
//! pod the manager last computed, with each running container's failed-death patch made ahead).
//!
//! The protocol: the fast path [`AliveLedger::claim`]s (or [`AliveLedger::claim_ahead`] then
//! [`AliveLedger::record_condition`]s) a death, then [`AliveLedger::confirm`]s or [`AliveLedger::fail`]s
//! it by the API's answer; the manager asks [`AliveLedger::manager_turn`] before computing a pod,
//! and [`AliveLedger::record`]s what it submitted. An answer (or a claim given up) is the ledger's
//! own signal to the manager ([`AliveLedger::take_answered`], woken by a [`Bell`]): the pod's
//! turn comes again without its view changing. Its lock is held for map operations only.
use std::{
    collections::HashMap,
    sync::{atomic::Ordering, Arc, Mutex, MutexGuard},
};

use k8s_openapi::api::core::v1::{Pod, PodCondition};

use super::{conditions::ConditionTypes, prepared::Prepared};
use crate::{
    model::{ContainerId, PodUid},
    reconcile::{ContainerPhase, PodView},
    sync::{Bell, BellWaiter},
};

/// A death the fast path claimed: its False transition is the fast path's to write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Claim {
    pub container: ContainerId,
    /// The API accepted the fast path's patch.
    pub confirmed: bool,
    /// The fast path's patch was not accepted (an error, a timeout): the manager writes it.
    pub failed: bool,
}

impl Claim {
    fn new(container: ContainerId) -> Self {
        Self {
            container,
            confirmed: false,
            failed: false,
        }
    }
}

#[derive(Clone, Debug, Default)]
struct Entry {
    /// `ContainersAlive` as last submitted by either side.
    alive: Option<PodCondition>,
    claim: Option<Claim>,
    basis: Option<Arc<ManagerSnapshot>>,
}

impl Entry {
    /// A death can be claimed: no claim is held, and the last submitted condition is not False
    /// already (then no death is a transition).
    fn claimable(&self) -> bool {
        self.claim.is_none() && self.alive.as_ref().is_none_or(|a| a.status != "False")
    }
}

/// What a death's patch is computed from: the pod's reconciled view and its API object as the
/// status manager last computed the pod (set at each of its turns), so that the PLEG's thread
/// never waits for the reconciler's or the reflector's locks; and each running container's
/// failed death, made ahead from them.
#[derive(Debug)]
pub struct ManagerSnapshot {
    pub view: PodView,
    pub pod: Arc<Pod>,
    pub prepared: Vec<Prepared>,
    /// The pod's readiness is gated on `ContainersAlive`: its first death goes first in a burst.
    pub gated: bool,
}

/// Whether the pod's readiness waits for condition `ty` (a readiness gate).
pub(crate) fn gated_on(pod: &Pod, ty: &str) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.readiness_gates.as_deref())
        .is_some_and(|g| g.iter().any(|g| g.condition_type == ty))
}

/// The last `ContainersAlive` submitted per pod, the fast path's claims, and each pod's
/// [`ManagerSnapshot`]. Its lock is held for map operations only, by either side.
#[derive(Debug, Default)]
pub struct AliveLedger {
    book: Mutex<Book>,
    /// The fast path has its client (the API answered it): claims can be answered.
    writer: std::sync::atomic::AtomicBool,
    /// Rung when a pod is answered; `None` for a ledger without a manager to wake (tests).
    signal: Option<Bell>,
    /// The manager's end of [`Self::signal`], taken once.
    waiter: Mutex<Option<BellWaiter>>,
}

/// What the one lock guards.
#[derive(Debug, Default)]
struct Book {
    pods: HashMap<PodUid, Entry>,
    /// Pods whose claim was answered (or given up) since the manager last looked.
    answered: Vec<PodUid>,
}

/// What the manager is to do with a pod, from the ledger.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum ManagerTurn {
    /// No claim: as without a fast path (`alive`: the last submitted, for its transition time).
    Unclaimed { alive: Option<PodCondition> },
    /// The fast path claimed a death the view does not show yet: writing now would say True.
    Wait,
    /// The view shows the claimed death and the fast path's patch is still in flight: writing
    /// now would send the same condition twice. The answer is the ledger's signal to the
    /// manager ([`AliveLedger::take_answered`]), which takes its turn then.
    InFlight,
    /// The view caught up with the claimed death: `alive` is what the fast path wrote (its
    /// transition time to keep), `confirmed` whether the API has it.
    AdoptClaim {
        alive: PodCondition,
        confirmed: bool,
    },
}

impl AliveLedger {
    /// A ledger that wakes the status manager when the fast path's claims are answered. Fails
    /// only when the process is out of file descriptors (the wake-up is a socket pair).
    pub fn new() -> std::io::Result<Self> {
        let (bell, waiter) = crate::sync::bell()?;
        Ok(Self {
            signal: Some(bell),
            waiter: Mutex::new(Some(waiter)),
            ..Self::default()
        })
    }

    fn lock(&self) -> MutexGuard<'_, Book> {
        crate::sync::lock(&self.book)
    }

    /// The manager's wake-up for [`Self::take_answered`], once (`None` without one).
    pub(crate) fn take_waiter(&self) -> Option<BellWaiter> {
        crate::sync::lock(&self.waiter).take()
    }

    /// The pods whose claim was answered or given up since the last call: the manager's turn.
    pub(crate) fn take_answered(&self) -> Vec<PodUid> {
        std::mem::take(&mut self.lock().answered)
    }

    /// `pod`'s claim is settled by the API's answer (or given up): the manager is told.
    fn answered(&self, mut book: MutexGuard<'_, Book>, pod: PodUid) {
        if !book.answered.contains(&pod) {
            book.answered.push(pod);
        }
        drop(book);
        if let Some(b) = &self.signal {
            b.ring();
        }
    }

    /// The fast path: claims the transition to `alive` (False) for `container`'s death, unless
    /// the ledger already says False or another death is claimed. `decide` gets the last
    /// submitted condition and returns the False condition to write, or `None`.
    pub fn claim(
        &self,
        pod: PodUid,
        container: ContainerId,
        decide: impl FnOnce(Option<&PodCondition>) -> Option<PodCondition>,
    ) -> Option<(Option<PodCondition>, PodCondition)> {
        let mut book = self.lock();
        let map = &mut book.pods;
        let e = map.entry(pod).or_default();
        if !e.claimable() {
            return None;
        }
        let alive = decide(e.alive.as_ref())?;
        let before = e.alive.replace(alive.clone());
        e.claim = Some(Claim::new(container));
        Some((before, alive))
    }

    /// [`Self::claim`] of a made-ahead death, whose condition comes after its request is
    /// written ([`Self::record_condition`]): `ok` says, from the last submitted condition, whether the
    /// death is a transition. Until settled the manager sees the claim (it waits, or finds it in
    /// flight) and the last submitted condition is the one before.
    pub(crate) fn claim_ahead(
        &self,
        pod: PodUid,
        container: ContainerId,
        ok: impl FnOnce(Option<&PodCondition>) -> bool,
    ) -> bool {
        let mut book = self.lock();
        let map = &mut book.pods;
        let e = map.entry(pod).or_default();
        if !e.claimable() || !ok(e.alive.as_ref()) {
            return false;
        }
        e.claim = Some(Claim::new(container));
        true
    }

    /// The condition of a claim made with [`Self::claim_ahead`], unless the manager settled
    /// the pod since.
    pub(crate) fn record_condition(
        &self,
        pod: &PodUid,
        container: ContainerId,
        alive: PodCondition,
    ) {
        let mut book = self.lock();
        let map = &mut book.pods;
        if let Some(e) = map
            .get_mut(pod)
            .filter(|e| e.claim.as_ref().is_some_and(|c| c.container == container))
        {
            e.alive = Some(alive);
        }
    }

    /// The manager's turn on a pod: what the next death's patch starts from, and the patches
    /// of its running containers' failed deaths (none while the pod is not alive: no death is a
    /// transition then).
    pub fn prepare(&self, pod: PodUid, view: &PodView, api: &Arc<Pod>, types: &ConditionTypes) {
        let not_alive = self
            .lock()
            .pods
            .get(&pod)
            .and_then(|e| e.alive.as_ref())
            .is_some_and(|a| a.status == "False");
        let prepared = match api.metadata.uid.as_deref() {
            Some(uid) if !not_alive => view
                .current()
                .filter(|c| c.phase == ContainerPhase::Running)
                .filter_map(|c| Prepared::new(types, api, view, uid, c.id))
                .collect(),
            _ => Vec::new(),
        };
        let basis = Arc::new(ManagerSnapshot {
            view: view.clone(),
            pod: Arc::clone(api),
            prepared,
            gated: gated_on(api, &types.alive),
        });
        self.lock().pods.entry(pod).or_default().basis = Some(basis);
    }

    /// The fast path has its client: only then are claims made.
    pub(crate) fn writer_running(&self, on: bool) {
        self.writer.store(on, Ordering::Release);
    }

    /// Whether the fast path has its client (claims are made).
    pub fn writing(&self) -> bool {
        self.writer.load(Ordering::Acquire)
    }

    pub fn basis(&self, pod: &PodUid) -> Option<Arc<ManagerSnapshot>> {
        self.lock().pods.get(pod).and_then(|e| e.basis.clone())
    }

    /// The fast path's patch for `container` was accepted.
    pub(crate) fn confirm(&self, pod: &PodUid, container: ContainerId) {
        self.settle(pod, container, |c| c.confirmed = true);
    }

    /// The fast path's patch for `container` was not accepted (or not sent): the manager is to
    /// write it.
    pub fn fail(&self, pod: &PodUid, container: ContainerId) {
        self.settle(pod, container, |c| c.failed = true);
    }

    fn settle(&self, pod: &PodUid, container: ContainerId, how: impl FnOnce(&mut Claim)) {
        let mut book = self.lock();
        let Some(c) = book
            .pods
            .get_mut(pod)
            .and_then(|e| e.claim.as_mut())
            .filter(|c| c.container == container)
        else {
            return;
        };
        how(c);
        self.answered(book, *pod);
    }

    /// The manager, before computing a pod: `caught_up` says whether the view shows a container's
    /// death (or no longer has it).
    pub(crate) fn manager_turn(
        &self,
        pod: &PodUid,
        caught_up: impl Fn(ContainerId) -> bool,
    ) -> ManagerTurn {
        let book = self.lock();
        let map = &book.pods;
        let Some(e) = map.get(pod) else {
            return ManagerTurn::Unclaimed { alive: None };
        };
        match (&e.claim, &e.alive) {
            (Some(c), Some(_)) if caught_up(c.container) && !c.confirmed && !c.failed => {
                ManagerTurn::InFlight
            }
            (Some(c), Some(alive)) if caught_up(c.container) => ManagerTurn::AdoptClaim {
                alive: alive.clone(),
                confirmed: c.confirmed,
            },
            (Some(_), _) => ManagerTurn::Wait,
            (None, alive) => ManagerTurn::Unclaimed {
                alive: alive.clone(),
            },
        }
    }

    /// The manager submitted (or found the API holding) `alive`: the claim, if any, is settled.
    pub fn record(&self, pod: PodUid, alive: PodCondition) {
        let mut book = self.lock();
        let map = &mut book.pods;
        let e = map.entry(pod).or_default();
        e.alive = Some(alive);
        e.claim = None;
    }

    /// The last `ContainersAlive` either side submitted for `pod`.
    pub fn last(&self, pod: &PodUid) -> Option<PodCondition> {
        self.lock().pods.get(pod).and_then(|e| e.alive.clone())
    }

    /// Replaces a pod's basis (tests: a basis without made patches).
    #[cfg(test)]
    pub(crate) fn set_basis(&self, pod: PodUid, basis: ManagerSnapshot) {
        self.lock().pods.entry(pod).or_default().basis = Some(Arc::new(basis));
    }

    pub(crate) fn forget(&self, pod: &PodUid) {
        self.lock().pods.remove(pod);
    }

    pub fn len(&self) -> usize {
        self.lock().pods.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Whether `view` shows `container`'s death (or no longer has the container).
pub(crate) fn caught_up(view: &PodView, container: ContainerId) -> bool {
    view.containers
        .iter()
        .find(|c| c.id == container)
        .is_none_or(|c| !matches!(c.phase, ContainerPhase::Running | ContainerPhase::Created))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cond(status: &str, t: &str) -> PodCondition {
        PodCondition {
            type_: "observer.dev/ContainersAlive".into(),
            status: status.into(),
            last_transition_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                t.parse().unwrap(),
            )),
            ..Default::default()
        }
    }

    fn ids() -> (PodUid, ContainerId, ContainerId) {
        (
            PodUid::parse("00000001-0000-0000-0000-000000000000").unwrap(),
            ContainerId::parse(&format!("{:064x}", 1)).unwrap(),
            ContainerId::parse(&format!("{:064x}", 2)).unwrap(),
        )
    }

    /// The fast path claims one False transition; the manager waits until its view shows the
    /// death, then takes the claim's condition and settles it; True is the manager's again.
    #[test]
    fn one_owner_of_the_transition() {
        let (pod, a, b) = ids();
        let ledger = AliveLedger::default();
        let up = cond("True", "2026-12-01T00:00:00Z");
        let down = cond("False", "2026-12-01T00:00:05Z");
        ledger.record(pod, up.clone());
        let (before, claimed) = ledger
            .claim(pod, a, |last| {
                assert_eq!(last, Some(&up));
                Some(down.clone())
            })
            .expect("a transition from True is claimed");
        assert_eq!((before, claimed), (Some(up.clone()), down.clone()));
        // A second death while the first is claimed is not a transition.
        assert!(ledger.claim(pod, b, |_| Some(down.clone())).is_none());
        // The manager's view still says running: it waits rather than write True.
        assert_eq!(ledger.manager_turn(&pod, |_| false), ManagerTurn::Wait);
        // It shows the death, but the fast path's patch is in flight: not sent twice.
        assert_eq!(ledger.manager_turn(&pod, |c| c == a), ManagerTurn::InFlight);
        ledger.confirm(&pod, a);
        assert_eq!(
            ledger.manager_turn(&pod, |c| c == a),
            ManagerTurn::AdoptClaim {
                alive: down.clone(),
                confirmed: true
            }
        );
        ledger.record(pod, down.clone());
        // Settled and False: a later death is no transition for the fast path.
        assert_eq!(
            ledger.manager_turn(&pod, |_| false),
            ManagerTurn::Unclaimed {
                alive: Some(down.clone())
            }
        );
        assert!(ledger.claim(pod, b, |_| Some(down.clone())).is_none());
        // Back to True by the manager: the next death is the fast path's again.
        ledger.record(pod, up);
        assert!(ledger.claim(pod, b, |_| Some(down.clone())).is_some());
        ledger.forget(&pod);
        assert!(ledger.is_empty());
    }

    /// A made-ahead death is claimed before its request is written and settled after: in
    /// between, the manager neither writes True nor takes the claim, and a record of its own
    /// in between is not overwritten by the late record.
    #[test]
    fn claimed_ahead_then_settled() {
        let (pod, a, b) = ids();
        let ledger = AliveLedger::default();
        let up = cond("True", "2026-12-01T00:00:00Z");
        let down = cond("False", "2026-12-01T00:00:05Z");
        ledger.record(pod, up.clone());
        assert!(ledger.claim_ahead(pod, a, |last| {
            assert_eq!(last, Some(&up));
            true
        }));
        // Claimed: no second transition, and the manager waits or finds it in flight.
        assert!(!ledger.claim_ahead(pod, b, |_| true));
        assert_eq!(ledger.manager_turn(&pod, |_| false), ManagerTurn::Wait);
        assert_eq!(ledger.manager_turn(&pod, |c| c == a), ManagerTurn::InFlight);
        ledger.record_condition(&pod, a, down.clone());
        ledger.confirm(&pod, a);
        assert_eq!(
            ledger.manager_turn(&pod, |c| c == a),
            ManagerTurn::AdoptClaim {
                alive: down.clone(),
                confirmed: true
            }
        );
        // The manager settled the pod (True again) before a later claim's settle arrived.
        ledger.record(pod, up.clone());
        assert!(ledger.claim_ahead(pod, b, |_| true));
        ledger.record(pod, up.clone());
        ledger.record_condition(&pod, b, down);
        assert_eq!(
            ledger.manager_turn(&pod, |_| false),
            ManagerTurn::Unclaimed { alive: Some(up) }
        );
        // `ok` refusing is no claim.
        assert!(!ledger.claim_ahead(pod, b, |_| false));
        assert_eq!(
            ledger.manager_turn(&pod, |_| false),
            ManagerTurn::Unclaimed {
                alive: Some(cond("True", "2026-12-01T00:00:00Z"))
            }
        );
    }

    /// A confirmation for another container than the claimed one changes nothing.
    #[test]
    fn a_stale_confirmation_is_ignored() {
        let (pod, a, b) = ids();
        let ledger = AliveLedger::default();
        let down = cond("False", "2026-12-01T00:00:05Z");
        assert!(ledger.claim(pod, a, |_| Some(down.clone())).is_some());
        ledger.confirm(&pod, b);
        assert_eq!(ledger.manager_turn(&pod, |_| true), ManagerTurn::InFlight);
        // Not accepted: the manager writes it (not confirmed, so it is sent).
        ledger.fail(&pod, a);
        assert_eq!(
            ledger.manager_turn(&pod, |_| true),
            ManagerTurn::AdoptClaim {
                alive: down,
                confirmed: false
            }
        );
    }

    /// The two writers' protocol under random interleavings, against what it promises: one False
    /// per death (the fast path claims only a transition), the manager never undoes the fast
    /// path (while a claim is held it never gets a free turn, which could write True), a patch
    /// the API refused is handed back (the manager writes it once its view has the death), and
    /// in the end the last submitted condition is the truth.
    mod model {
        use std::collections::HashSet;

        use proptest::prelude::*;

        use super::*;

        #[derive(Clone, Copy, Debug)]
        enum Op {
            /// Container `c`'s init dies; the fast path claims it whole, or ahead then settles.
            Die { c: u8, ahead: bool },
            /// The API answers the claim's request.
            Answer { ok: bool },
            /// The manager's view shows container `c`'s death.
            ViewSees { c: u8 },
            /// The manager's turn on the pod.
            Turn,
            /// Container `c` runs again (restarted), and the view shows it.
            Restart { c: u8 },
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                (0u8..2, any::<bool>()).prop_map(|(c, ahead)| Op::Die { c, ahead }),
                any::<bool>().prop_map(|ok| Op::Answer { ok }),
                (0u8..2).prop_map(|c| Op::ViewSees { c }),
                Just(Op::Turn),
                (0u8..2).prop_map(|c| Op::Restart { c }),
            ]
        }

        /// What the world and each side know.
        #[derive(Default)]
        struct World {
            /// Each container's current instance (a restart is a new instance, with a new id).
            gen: [u32; 2],
            dead: HashSet<u8>,
            view_dead: HashSet<u8>,
            /// The claim the fast path holds: its container's instance, settled, answered (and
            /// how).
            claim: Option<((u8, u32), bool, Option<bool>)>,
            /// The last condition either side submitted, as its status.
            last: Option<&'static str>,
        }

        impl World {
            /// The manager's view shows the claimed instance's death, or a later instance.
            fn view_caught_up(&self, (c, gen): (u8, u32)) -> bool {
                gen < self.gen[c as usize] || self.view_dead.contains(&c)
            }
        }

        fn status(c: &PodCondition) -> &'static str {
            if c.status == "False" {
                "False"
            } else {
                "True"
            }
        }

        fn run(ops: &[Op]) -> Result<(), TestCaseError> {
            let (pod, _, _) = ids();
            let id_of = |c: u8, gen: u32| {
                ContainerId::parse(&format!("{:064x}", u64::from(c) << 32 | u64::from(gen)))
                    .expect("an id")
            };
            let down = cond("False", "2026-12-01T00:00:05Z");
            let up = cond("True", "2026-12-01T00:00:00Z");
            let ledger = AliveLedger::default();
            let mut w = World::default();
            let turn = |w: &mut World, ledger: &AliveLedger| -> Result<(), TestCaseError> {
                // As the view tells it: an instance's death shown, or the instance replaced.
                let (view_dead, gen) = (w.view_dead.clone(), w.gen);
                let shows = |id: ContainerId| {
                    (0..2u8).any(|c| {
                        (0..gen[c as usize]).any(|g| id_of(c, g) == id)
                            || (view_dead.contains(&c) && id_of(c, gen[c as usize]) == id)
                    })
                };
                match ledger.manager_turn(&pod, shows) {
                    ManagerTurn::Unclaimed { alive } => {
                        prop_assert!(
                            w.claim.is_none(),
                            "a free turn while the fast path holds a claim: the manager could write True over it"
                        );
                        prop_assert_eq!(alive.as_ref().map(status), w.last);
                        let want = if w.view_dead.is_empty() { &up } else { &down };
                        if w.last != Some(status(want)) {
                            ledger.record(pod, want.clone());
                            w.last = Some(status(want));
                        }
                    }
                    ManagerTurn::AdoptClaim { alive, confirmed } => {
                        let (c, settled, answer) = w.claim.expect("a claim to take");
                        prop_assert!(settled && w.view_caught_up(c));
                        prop_assert_eq!(status(&alive), "False");
                        prop_assert_eq!(confirmed, answer == Some(true));
                        // Confirmed: the API has it; refused (or unanswered): the manager
                        // writes it. Either way it is what was last submitted.
                        ledger.record(pod, alive);
                        w.claim = None;
                        w.last = Some("False");
                    }
                    ManagerTurn::InFlight => {
                        let (c, _, answer) = w.claim.expect("a claim in flight");
                        prop_assert!(w.view_caught_up(c) && answer.is_none());
                    }
                    ManagerTurn::Wait => {
                        let (c, _, _) = w.claim.expect("a claim to wait for");
                        prop_assert!(!w.view_caught_up(c));
                    }
                }
                Ok(())
            };
            for op in ops {
                match *op {
                    Op::Die { c, ahead } => {
                        if !w.dead.insert(c) {
                            continue;
                        }
                        let me = (c, w.gen[c as usize]);
                        let id = id_of(me.0, me.1);
                        let transition = w.claim.is_none() && w.last != Some("False");
                        let claimed = if ahead {
                            // The fast path's own check left out: the ledger's rule alone holds
                            // the promise.
                            let ok = ledger.claim_ahead(pod, id, |_| true);
                            if ok {
                                // The request is written, then the condition settled.
                                ledger.record_condition(&pod, id, down.clone());
                            }
                            ok
                        } else {
                            ledger.claim(pod, id, |_| Some(down.clone())).is_some()
                        };
                        prop_assert_eq!(claimed, transition, "one False per death");
                        if claimed {
                            w.claim = Some((me, true, None));
                            w.last = Some("False");
                        }
                    }
                    Op::Answer { ok } => {
                        if let Some((c, settled, None)) = w.claim {
                            if ok {
                                ledger.confirm(&pod, id_of(c.0, c.1));
                            } else {
                                ledger.fail(&pod, id_of(c.0, c.1));
                            }
                            w.claim = Some((c, settled, Some(ok)));
                        }
                    }
                    Op::ViewSees { c } => {
                        if w.dead.contains(&c) {
                            w.view_dead.insert(c);
                        }
                    }
                    Op::Turn => turn(&mut w, &ledger)?,
                    Op::Restart { c } => {
                        // Only a death the view has seen restarts (kubelet's way), as a new
                        // instance.
                        if w.view_dead.remove(&c) {
                            w.dead.remove(&c);
                            w.gen[c as usize] += 1;
                        }
                    }
                }
            }
            // Everything settles: the claim answered, the view catches up, the manager turns.
            if let Some((c, _, None)) = w.claim {
                ledger.fail(&pod, id_of(c.0, c.1));
                w.claim = Some((c, true, Some(false)));
            }
            w.view_dead = w.dead.clone();
            turn(&mut w, &ledger)?;
            turn(&mut w, &ledger)?;
            let truth = if w.dead.is_empty() { "True" } else { "False" };
            prop_assert_eq!(ledger.last(&pod).as_ref().map(status), Some(truth));
            Ok(())
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(2000))]
            #[test]
            fn the_two_writers_agree(ops in proptest::collection::vec(op(), 0..40)) {
                run(&ops)?;
            }
        }
    }
}
