//! The agent under test: a private containerd with the whole agent (kernel pipeline, reconciler)
//! watching it, and the PLEG events it consumed, for end-to-end tests.
use std::time::Duration;

use observer::{
    agent::{Agent, AgentConfig},
    model::{ContainerId, PodUid},
    pleg::{PlegEventType, PodLifecycleEvent},
    reconcile::{ContainerView, PodView, ReconcileStats},
};
use tokio::sync::broadcast;

use crate::{kernel::require_kernel, require_containerd, Containerd};

/// How long end-to-end waits may take on a loaded 2-core machine.
pub const WAIT: Duration = Duration::from_secs(15);

pub struct AgentEnv {
    pub ctrd: Containerd,
    pub agent: Agent,
    pleg: broadcast::Receiver<PodLifecycleEvent>,
    /// PLEG events received so far.
    pub seen: Vec<PodLifecycleEvent>,
}

/// Parses a pod uid the harness made.
pub fn uid(s: &str) -> PodUid {
    PodUid::parse(s).unwrap_or_else(|| panic!("not a pod uid: {s}"))
}

/// Parses a container id the runtime gave.
pub fn cid(s: &str) -> ContainerId {
    ContainerId::parse(s).unwrap_or_else(|| panic!("not a container id: {s}"))
}

impl AgentEnv {
    /// containerd and the agent, connected; `None` (after saying why) when the prerequisites are
    /// absent outside CI.
    pub async fn start() -> Option<Self> {
        if !require_containerd() || !require_kernel() {
            return None;
        }
        crate::init_tracing();
        let ctrd = Containerd::start().await.expect("containerd");
        let agent = Agent::start(AgentConfig::new(ctrd.endpoint()))
            .await
            .expect("agent");
        assert!(
            agent.wait_runtime(WAIT).await,
            "agent never reached containerd"
        );
        let pleg = agent.reconcile.pleg_events();
        Some(Self {
            ctrd,
            agent,
            pleg,
            seen: Vec::new(),
        })
    }

    pub fn pod(&self, uid_: &str) -> Option<PodView> {
        self.agent.reconcile.pod(&uid(uid_))
    }

    /// Waits until the reconciled view of container `id` satisfies `pred`, and returns it.
    pub async fn container(
        &self,
        pod: &str,
        id: &str,
        pred: impl Fn(&ContainerView) -> bool,
    ) -> ContainerView {
        let (u, c) = (uid(pod), cid(id));
        let found = self
            .agent
            .reconcile
            .wait_for(WAIT, |v| {
                v.get(&u)
                    .and_then(|p| p.containers.iter().find(|x| x.id == c))
                    .is_some_and(&pred)
            })
            .await;
        let view = self.agent.reconcile.pod(&u);
        assert!(
            found,
            "container {id} never reached the expected state; pod view: {view:#?}"
        );
        view.unwrap()
            .containers
            .into_iter()
            .find(|x| x.id == c)
            .unwrap()
    }

    /// Waits until `pred` holds for the pod's view.
    pub async fn pod_until(&self, pod: &str, pred: impl Fn(&PodView) -> bool) -> PodView {
        let u = uid(pod);
        let found = self
            .agent
            .reconcile
            .wait_for(WAIT, |v| v.get(&u).is_some_and(&pred))
            .await;
        let view = self.agent.reconcile.pod(&u);
        assert!(
            found,
            "pod {pod} never reached the expected state: {view:#?}"
        );
        view.unwrap()
    }

    /// The lifecycle events of container `id`, waiting until `done` holds for their kinds.
    pub async fn pleg_until(
        &mut self,
        id: &str,
        done: impl Fn(&[PlegEventType]) -> bool,
    ) -> Vec<PodLifecycleEvent> {
        let c = cid(id);
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            // Lifecycle events only: memory limit hits come as often as the kernel reclaims.
            let mine: Vec<PodLifecycleEvent> = self
                .seen
                .iter()
                .filter(|e| e.container_id() == Some(c) && e.kind() != PlegEventType::LimitHit)
                .cloned()
                .collect();
            if done(&mine.iter().map(PodLifecycleEvent::kind).collect::<Vec<_>>()) {
                return mine;
            }
            match tokio::time::timeout_at(deadline, self.pleg.recv()).await {
                Ok(Ok(ev)) => self.seen.push(ev),
                Ok(Err(broadcast::error::RecvError::Lagged(n))) => {
                    panic!("test lagged {n} PLEG events")
                }
                Ok(Err(e)) => panic!("PLEG stream ended: {e}"),
                Err(_) => panic!("PLEG events for {id}: {mine:#?}"),
            }
        }
    }

    /// The OOM kills of `id` (victim pid and comm, in order), after `quiet` without new events:
    /// the kernel may need more than one victim before the first one's memory is reaped.
    pub async fn oom_victims(&mut self, id: &str, quiet: Duration) -> Vec<(u32, String)> {
        while let Ok(Ok(ev)) = tokio::time::timeout(quiet, self.pleg.recv()).await {
            self.seen.push(ev);
        }
        let c = cid(id);
        self.seen
            .iter()
            .filter(|e| e.container_id() == Some(c))
            .filter_map(|e| e.oom())
            .map(|o| (o.victim.tgid, o.victim_comm.to_string()))
            .collect()
    }

    /// Nothing had to be repaired by a relist, and the kernel dropped nothing.
    pub fn assert_no_misses(&self) {
        let s = self.agent.reconcile.stats();
        assert_eq!(
            ReconcileStats::get(&s.missed_events),
            0,
            "the relist had to repair something"
        );
        let drops = self
            .agent
            .kernel_counters()
            .expect("kernel counters readable")
            .ringbuf_drops;
        assert_eq!(drops, 0, "kernel ring-buffer drops");
    }
}

/// The lifecycle events' kinds, memory limit hits left out (how many the kernel sends depends
/// on how long the container sat at its limit; tests/tests/pleg.rs checks the first comes before
/// the kill).
pub fn kinds(evs: &[PodLifecycleEvent]) -> Vec<PlegEventType> {
    evs.iter()
        .map(PodLifecycleEvent::kind)
        .filter(|k| *k != PlegEventType::LimitHit)
        .collect()
}

/// "`k` happened".
pub fn has(k: PlegEventType) -> impl Fn(&[PlegEventType]) -> bool {
    move |ks| ks.contains(&k)
}
