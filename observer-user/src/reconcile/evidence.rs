//! What the kernel said about each container, gathered from the PLEG's events.
use crate::{
    kernel::{BootNs, Comm, OomKill},
    pleg::{ContainerExit, PlegData, PlegEventType, PodLifecycleEvent},
};

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KernelEvidence {
    pub created: Option<BootNs>,
    pub started: Option<(BootNs, u32, Comm)>,
    pub exit: Option<(BootNs, ContainerExit)>,
    pub oom_kills: u32,
    pub last_oom: Option<Box<OomKill>>,
    pub removed: Option<BootNs>,
}

impl KernelEvidence {
    /// Folds one lifecycle event in. Returns false for events that say nothing about a container.
    pub fn apply(&mut self, ev: &PodLifecycleEvent) -> bool {
        match (ev.kind, &ev.data) {
            (PlegEventType::ContainerChanged, _) => {
                self.created.get_or_insert(ev.at);
            }
            (PlegEventType::ContainerStarted, PlegData::Started { pid, comm }) => {
                self.started = Some((ev.at, *pid, *comm));
            }
            (PlegEventType::ContainerDied, PlegData::Died(exit)) => {
                // A lost-exit report never replaces an exact one.
                let keep = matches!(&self.exit, Some((_, e)) if e.status.is_some() && exit.status.is_none());
                if !keep {
                    self.exit = Some((ev.at, exit.clone()));
                }
            }
            (PlegEventType::OomKill, PlegData::Oom(o)) => {
                self.oom_kills += 1;
                self.last_oom = Some(o.clone());
            }
            (PlegEventType::ContainerRemoved, _) => self.removed = Some(ev.at),
            _ => return false,
        }
        true
    }

    pub fn init_pid(&self) -> Option<u32> {
        self.started
            .map(|(_, pid, _)| pid)
            .or_else(|| self.exit.as_ref().and_then(|(_, e)| e.pid))
    }
}
