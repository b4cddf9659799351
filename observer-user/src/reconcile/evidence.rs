//! What the kernel said about each container, gathered from the PLEG's events.
use crate::{
    kernel::{BootNs, Comm, OomKill},
    model::ContainerId,
    pleg::{ContainerExit, PlegEvent, PodLifecycleEvent},
};

/// Victims remembered per container, to tell the kernel log's kills the probes already saw.
const VICTIMS_KEPT: usize = 32;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KernelEvidence {
    pub created: Option<BootNs>,
    /// When the init started, its pid and name.
    pub started: Option<(BootNs, u32, Comm)>,
    pub exit: Option<(BootNs, ContainerExit)>,
    pub oom_kills: u32,
    pub last_oom: Option<Box<OomKill>>,
    /// The kill of the container's init, if it was a victim (the container died of it).
    pub init_kill: Option<Box<OomKill>>,
    /// The container whose allocation invoked the OOM killer for `last_oom`, where known.
    pub last_oom_trigger: Option<ContainerId>,
    /// (pid, when the OOM killer chose it) of the most recent victims.
    pub oom_victims: Vec<(u32, BootNs)>,
    pub removed: Option<BootNs>,
}

impl KernelEvidence {
    /// Folds one lifecycle event in. Returns false for events that say nothing about a container.
    pub fn apply(&mut self, ev: &PodLifecycleEvent) -> bool {
        match &ev.event {
            PlegEvent::ContainerChanged { .. } => {
                self.created.get_or_insert(ev.at);
            }
            PlegEvent::ContainerStarted { pid, comm, .. } => {
                self.started = Some((ev.at, *pid, *comm));
            }
            PlegEvent::ContainerDied { exit, .. } => {
                // A lost-exit report never replaces an exact one.
                let keep = matches!(&self.exit, Some((_, e)) if e.status.is_some() && exit.status.is_none());
                if !keep {
                    self.exit = Some((ev.at, exit.clone()));
                }
            }
            PlegEvent::OomKill { kill, trigger, .. } => {
                self.last_oom_trigger = *trigger;
                self.oom_kills += 1;
                if self.oom_victims.len() == VICTIMS_KEPT {
                    self.oom_victims.remove(0);
                }
                // When it was chosen: what the kernel log's record of the kill is matched on.
                self.oom_victims.push((kill.victim.tgid, kill.marked_at));
                if self.init_pid() == Some(kill.victim.tgid) {
                    self.init_kill = Some(kill.clone());
                }
                // The kill read after the init's death it caused.
                if let Some((_, exit)) = self.exit.as_mut() {
                    exit.killed_by_oom(kill.victim.tgid);
                }
                self.last_oom = Some(kill.clone());
            }
            PlegEvent::ContainerRemoved { .. } => self.removed = Some(ev.at),
            // Memory pressure is the reconciler's own account (`reconcile::memory`).
            PlegEvent::PodSync | PlegEvent::LimitHit { .. } => return false,
        }
        true
    }

    pub fn init_pid(&self) -> Option<u32> {
        self.started
            .map(|(_, pid, _)| pid)
            .or_else(|| self.exit.as_ref().and_then(|(_, e)| e.pid))
    }
}
