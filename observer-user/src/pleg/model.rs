//! The node model: pods → containers, each with its cgroup, init, state and last OOM kill,
//! indexed by cgroup id so that a kernel event finds its container in O(1).
//!
//! [`NodeModel::apply`] is the whole state machine: a kernel event in, pod lifecycle events out.
//! It does no I/O; cgroup ids it has never seen are resolved through the caller's function.
use std::{collections::HashMap, sync::Arc};

use super::event::{ContainerExit, ExitReason, PlegEvent, PodLifecycleEvent};
use crate::{
    cgroup::{
        CgroupDriver, CgroupEntry, CgroupKind, ContainerId, ContainerRef, KubeRoots, PodCgroup,
        PodUid, Qos, Runtime, Scan,
    },
    kernel::{BootNs, CgroupChange, Comm, Exec, Exit, KernelEvent, LimitHit, OomKill},
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ContainerState {
    /// Its cgroup exists; no init yet.
    Created,
    Running,
    Exited,
    /// Found at a resync with no process and no history: created-not-started or exited while we
    /// were not looking. The runtime knows which.
    Unknown,
}

impl ContainerState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Created => "created",
            Self::Running => "running",
            Self::Exited => "exited",
            Self::Unknown => "unknown",
        }
    }
}

#[derive(Clone, Debug)]
pub struct ContainerRecord {
    pub id: ContainerId,
    pub pod: PodUid,
    pub runtime: Option<Runtime>,
    pub cgroup_id: u64,
    pub cgroup_path: Arc<str>,
    pub state: ContainerState,
    pub init_pid: Option<u32>,
    pub init_comm: Option<Comm>,
    pub started_at: Option<BootNs>,
    pub finished_at: Option<BootNs>,
    pub exit: Option<ContainerExit>,
    /// OOM kills of any process of the container, and the last one in full.
    pub oom_kills: u32,
    pub last_oom: Option<Box<OomKill>>,
    /// The init itself was OOM-killed: its exit will be OOMKilled whatever the signal says.
    init_oom_killed: bool,
    /// Cgroups below the container's own that map to it.
    nested: Vec<u64>,
}

#[derive(Clone, Debug)]
pub struct PodRecord {
    pub uid: PodUid,
    pub qos: Qos,
    pub driver: CgroupDriver,
    pub cgroup_id: Option<u64>,
    pub containers: Vec<ContainerId>,
    /// Last OOM kill in any of the pod's containers.
    pub last_oom: Option<Box<OomKill>>,
}

/// What a cgroup id belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Owner {
    Pod(PodUid),
    Container(ContainerId),
    /// Known not to be a pod or container (kubepods root, QoS level, conmon, outside kubepods):
    /// cached so such events cost one lookup.
    Other,
    /// Named like a pod's or a container's outside kubelet's roots: never one (counted).
    Foreign,
}

/// What [`NodeModel::apply`] made of an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applied {
    /// Attributed (whether or not it produced lifecycle events).
    Done,
    /// About a cgroup that is not a container (outside kubepods, a QoS level, conmon).
    NotAContainer,
    /// About a cgroup id nobody could resolve: the caller may hold it and retry once its mkdir
    /// arrives, or count it.
    UnknownCgroup(u64),
    /// About a container that already exited or was removed: too late to matter (counted).
    Late,
    /// About a cgroup named like a pod's or a container's outside kubelet's roots
    /// ([`CgroupKind::Foreign`]): changes nothing (counted).
    OutsideRoots(u64),
}

pub struct NodeModel {
    /// What a cgroup path is: only below these is it a pod's or a container's.
    roots: KubeRoots,
    pods: HashMap<PodUid, PodRecord>,
    containers: HashMap<ContainerId, ContainerRecord>,
    by_cgroup: HashMap<u64, Owner>,
    /// Depth of the node's own pid namespace (0 on a host; 1 for a node that is itself a
    /// container, as with kind). Tasks deeper than this are in a container's namespace.
    host_ns_level: u32,
}

impl NodeModel {
    pub fn new(roots: KubeRoots) -> Self {
        Self {
            roots,
            pods: HashMap::new(),
            containers: HashMap::new(),
            by_cgroup: HashMap::new(),
            host_ns_level: 0,
        }
    }

    /// Sets the node's pid namespace depth (the agent's own, with hostPID).
    pub(crate) fn set_host_ns_level(&mut self, level: u32) {
        self.host_ns_level = level;
    }

    /// The task runs in a container's pid namespace, not the node's.
    fn in_container_ns(&self, task: &crate::kernel::Task) -> bool {
        task.ns_level > self.host_ns_level
    }

    /// Pods and containers tracked now.
    pub fn counts(&self) -> (usize, usize) {
        (self.pods.len(), self.containers.len())
    }

    pub fn pods(&self) -> impl Iterator<Item = &PodRecord> {
        self.pods.values()
    }

    pub fn pod(&self, uid: &PodUid) -> Option<&PodRecord> {
        self.pods.get(uid)
    }

    pub fn containers(&self) -> impl Iterator<Item = &ContainerRecord> {
        self.containers.values()
    }

    pub fn container(&self, id: &ContainerId) -> Option<&ContainerRecord> {
        self.containers.get(id)
    }

    /// Applies one kernel event; lifecycle events it causes are pushed to `out`, in order.
    /// `resolve` answers cgroup ids the model has not seen (path and kind).
    pub fn apply(
        &mut self,
        ev: &KernelEvent,
        resolve: &mut dyn FnMut(u64) -> Option<CgroupEntry>,
        out: &mut Vec<PodLifecycleEvent>,
    ) -> Applied {
        match ev {
            KernelEvent::CgroupMkdir(c) => self.mkdir(c, out),
            KernelEvent::CgroupRmdir(c) => self.rmdir(c, out),
            KernelEvent::CgroupEmpty(c) => self.empty(c, out),
            KernelEvent::Exec(e) => {
                self.with_container(e.task.cgroup_id, resolve, out, |m, id, out| {
                    m.exec(id, e, out)
                })
            }
            KernelEvent::Exit(e) => {
                self.with_container(e.task.cgroup_id, resolve, out, |m, id, out| {
                    m.exit(id, e, out)
                })
            }
            KernelEvent::OomKill(o) => {
                self.with_container(o.victim.cgroup_id, resolve, out, |m, id, out| {
                    m.oom(id, o, out)
                })
            }
            KernelEvent::LimitHit(h) => {
                self.with_container(h.task.cgroup_id, resolve, out, |m, id, out| {
                    m.limit_hit(id, h, out)
                })
            }
            KernelEvent::Lost { at, .. } => {
                // Whatever the lost records said is unknown: every pod must be re-read.
                for uid in self.pods.keys() {
                    out.push(PodLifecycleEvent::pod_sync(*uid, *at));
                }
                Applied::Done
            }
        }
    }

    fn with_container(
        &mut self,
        cgroup_id: u64,
        resolve: &mut dyn FnMut(u64) -> Option<CgroupEntry>,
        out: &mut Vec<PodLifecycleEvent>,
        f: impl FnOnce(&mut Self, ContainerId, &mut Vec<PodLifecycleEvent>) -> Applied,
    ) -> Applied {
        let owner = match self.by_cgroup.get(&cgroup_id) {
            Some(o) => *o,
            None => match resolve(cgroup_id) {
                Some(entry) => self.learn(cgroup_id, &entry, None, out),
                None => return Applied::UnknownCgroup(cgroup_id),
            },
        };
        match owner {
            Owner::Container(id) => f(self, id, out),
            Owner::Foreign => Applied::OutsideRoots(cgroup_id),
            Owner::Pod(_) | Owner::Other => Applied::NotAContainer,
        }
    }

    /// Records what a cgroup is, creating its pod and container as needed.
    fn learn(
        &mut self,
        cgroup_id: u64,
        entry: &CgroupEntry,
        at: Option<BootNs>,
        out: &mut Vec<PodLifecycleEvent>,
    ) -> Owner {
        let owner = match &entry.kind {
            CgroupKind::Pod(p) => {
                self.pod_entry(p).cgroup_id = Some(cgroup_id);
                Owner::Pod(p.uid)
            }
            CgroupKind::Container(c) => {
                self.container_entry(c, cgroup_id, &entry.path, at, out);
                Owner::Container(c.id)
            }
            CgroupKind::Foreign => Owner::Foreign,
            _ => Owner::Other,
        };
        self.by_cgroup.insert(cgroup_id, owner);
        owner
    }

    fn pod_entry(&mut self, p: &PodCgroup) -> &mut PodRecord {
        self.pods.entry(p.uid).or_insert_with(|| PodRecord {
            uid: p.uid,
            qos: p.qos,
            driver: p.driver,
            cgroup_id: None,
            containers: Vec::new(),
            last_oom: None,
        })
    }

    /// The container of `c`; a new one is `Created` and reported as ContainerChanged (kubelet's
    /// PLEG reports a created container so). A nested cgroup maps to its container.
    fn container_entry(
        &mut self,
        c: &ContainerRef,
        cgroup_id: u64,
        path: &Arc<str>,
        at: Option<BootNs>,
        out: &mut Vec<PodLifecycleEvent>,
    ) {
        if let Some(rec) = self.containers.get_mut(&c.id) {
            if c.nested {
                if !rec.nested.contains(&cgroup_id) {
                    rec.nested.push(cgroup_id);
                }
            } else if rec.cgroup_id != cgroup_id {
                // Same id, new cgroup: the old one's rmdir was missed. Keep the newest.
                rec.cgroup_id = cgroup_id;
                rec.cgroup_path = Arc::clone(path);
            }
            return;
        }
        let pod = self.pod_entry(&c.pod);
        pod.containers.push(c.id);
        let own_path: Arc<str> = if c.nested {
            Arc::from(c.cgroup_path())
        } else {
            Arc::clone(path)
        };
        let rec = ContainerRecord {
            id: c.id,
            pod: c.pod.uid,
            runtime: c.runtime,
            // For a nested cgroup seen first, the container's own id is learned at its own event.
            cgroup_id: if c.nested { 0 } else { cgroup_id },
            cgroup_path: own_path,
            state: ContainerState::Created,
            init_pid: None,
            init_comm: None,
            started_at: None,
            finished_at: None,
            exit: None,
            oom_kills: 0,
            last_oom: None,
            init_oom_killed: false,
            nested: if c.nested {
                vec![cgroup_id]
            } else {
                Vec::new()
            },
        };
        out.push(event(
            &rec,
            at.unwrap_or_default(),
            PlegEvent::ContainerChanged { id: c.id },
        ));
        self.containers.insert(c.id, rec);
    }

    fn mkdir(&mut self, c: &CgroupChange, out: &mut Vec<PodLifecycleEvent>) -> Applied {
        let entry = self.roots.entry(&c.path);
        match self.learn(c.id, &entry, Some(c.at), out) {
            Owner::Other => Applied::NotAContainer,
            Owner::Foreign => Applied::OutsideRoots(c.id),
            _ => Applied::Done,
        }
    }

    fn exec(&mut self, id: ContainerId, e: &Exec, out: &mut Vec<PodLifecycleEvent>) -> Applied {
        let own_ns = self.in_container_ns(&e.task);
        let Some(rec) = self.containers.get_mut(&id) else {
            return Applied::Late;
        };
        match rec.state {
            ContainerState::Created | ContainerState::Unknown => {
                if !is_init_exec(e, own_ns) {
                    return Applied::Done;
                }
                rec.state = ContainerState::Running;
                rec.init_pid = Some(e.task.tgid);
                rec.init_comm = Some(e.task.comm);
                rec.started_at = Some(e.at);
                out.push(event(
                    rec,
                    e.at,
                    PlegEvent::ContainerStarted {
                        id,
                        pid: e.task.tgid,
                        comm: e.task.comm,
                    },
                ));
                Applied::Done
            }
            ContainerState::Running => {
                // The init exec'ing again keeps its pid but changes its name.
                if rec.init_pid == Some(e.task.tgid) {
                    rec.init_comm = Some(e.task.comm);
                }
                Applied::Done
            }
            ContainerState::Exited => Applied::Late,
        }
    }

    fn exit(&mut self, id: ContainerId, e: &Exit, out: &mut Vec<PodLifecycleEvent>) -> Applied {
        let own_ns = self.in_container_ns(&e.task);
        let Some(rec) = self.containers.get_mut(&id) else {
            return Applied::Late;
        };
        if !e.group_dead {
            return Applied::Done;
        }
        let is_init = match rec.state {
            ContainerState::Running => rec.init_pid == Some(e.task.tgid),
            // Died before its exec was seen (the entrypoint could not be exec'd, or the record
            // was lost). Only a task in a container's namespace counts: the runtime's helpers
            // (runc init's first stages) also exit here, in the node's namespace.
            ContainerState::Created => own_ns,
            ContainerState::Unknown => false,
            ContainerState::Exited => return Applied::Late,
        };
        if !is_init {
            return Applied::Done;
        }
        // The name the process died with, where the record is its leader's: a program may
        // rename itself after its exec (busybox runs an applet by re-exec'ing /proc/self/exe, then
        // names itself after the applet). Another thread's record carries that thread's own name:
        // then the name of the init's last exec.
        let comm = if e.task.pid == e.task.tgid {
            e.task.comm
        } else {
            rec.init_comm.unwrap_or(e.task.comm)
        };
        rec.init_comm = Some(comm);
        let exit = ContainerExit {
            status: Some(e.status),
            reason: ExitReason::of(e.status, rec.init_oom_killed),
            pid: Some(e.task.tgid),
            comm: Some(comm),
        };
        Self::died(rec, exit, e.at, out);
        Applied::Done
    }

    fn died(
        rec: &mut ContainerRecord,
        exit: ContainerExit,
        at: BootNs,
        out: &mut Vec<PodLifecycleEvent>,
    ) {
        rec.state = ContainerState::Exited;
        rec.finished_at = Some(at);
        rec.exit = Some(exit.clone());
        out.push(event(
            rec,
            at,
            PlegEvent::ContainerDied { id: rec.id, exit },
        ));
    }

    fn oom(&mut self, id: ContainerId, o: &OomKill, out: &mut Vec<PodLifecycleEvent>) -> Applied {
        let own_ns = self.in_container_ns(&o.victim);
        let trigger = match self.by_cgroup.get(&o.trigger_cgroup_id) {
            Some(Owner::Container(t)) => Some(*t),
            _ => None,
        };
        let Some(rec) = self.containers.get_mut(&id) else {
            return Applied::Late;
        };
        rec.oom_kills += 1;
        if rec.init_pid == Some(o.victim.tgid) || (rec.state == ContainerState::Created && own_ns) {
            rec.init_oom_killed = true;
        }
        // Read after the init's exit (it died of the kill before the killer marked it): the death
        // already went out as an Error; its OomKill, next, is what corrects it downstream.
        if let Some(exit) = rec.exit.as_mut() {
            exit.killed_by_oom(o.victim.tgid);
        }
        let boxed = Box::new(o.clone());
        rec.last_oom = Some(boxed.clone());
        out.push(event(
            rec,
            o.at,
            PlegEvent::OomKill {
                id,
                kill: boxed.clone(),
                trigger,
            },
        ));
        let pod = rec.pod;
        if let Some(p) = self.pods.get_mut(&pod) {
            p.last_oom = Some(boxed);
        }
        Applied::Done
    }

    /// A charge of the container's met a memory limit: said as it came, whatever state the
    /// container is in (a dying container's last charges are part of its story).
    fn limit_hit(
        &mut self,
        id: ContainerId,
        h: &LimitHit,
        out: &mut Vec<PodLifecycleEvent>,
    ) -> Applied {
        let Some(rec) = self.containers.get(&id) else {
            return Applied::Late;
        };
        out.push(event(
            rec,
            h.at,
            PlegEvent::LimitHit {
                id,
                hit: Box::new(h.clone()),
                cgroup: rec.cgroup_path.clone(),
            },
        ));
        Applied::Done
    }

    /// The cgroup's last process left. For a container whose init's exit was never seen, this is
    /// the last word on its death.
    fn empty(&mut self, c: &CgroupChange, out: &mut Vec<PodLifecycleEvent>) -> Applied {
        let id = match self.by_cgroup.get(&c.id).copied() {
            Some(Owner::Container(id)) => id,
            Some(Owner::Foreign) => return Applied::OutsideRoots(c.id),
            _ => return Applied::NotAContainer,
        };
        let Some(rec) = self.containers.get_mut(&id) else {
            return Applied::Late;
        };
        // Only the container's own cgroup counts: a nested one emptying says nothing.
        if rec.cgroup_id == c.id && matches!(rec.state, ContainerState::Running) {
            Self::died(rec, lost_exit(rec), c.at, out);
        }
        Applied::Done
    }

    fn rmdir(&mut self, c: &CgroupChange, out: &mut Vec<PodLifecycleEvent>) -> Applied {
        match self.by_cgroup.remove(&c.id) {
            Some(Owner::Container(id)) => {
                let Some(rec) = self.containers.get_mut(&id) else {
                    return Applied::Late;
                };
                if rec.cgroup_id != c.id {
                    rec.nested.retain(|n| *n != c.id);
                    return Applied::Done;
                }
                // kubelet's PLEG: a running container that vanished is reported dead, then removed.
                if matches!(rec.state, ContainerState::Running | ContainerState::Created) {
                    Self::died(rec, lost_exit(rec), c.at, out);
                }
                let rec = self.containers.remove(&id).expect("present");
                for n in &rec.nested {
                    self.by_cgroup.remove(n);
                }
                out.push(event(&rec, c.at, PlegEvent::ContainerRemoved { id }));
                if let Some(p) = self.pods.get_mut(&rec.pod) {
                    p.containers.retain(|x| *x != id);
                }
                Applied::Done
            }
            Some(Owner::Pod(uid)) => {
                if let Some(pod) = self.pods.remove(&uid) {
                    for id in pod.containers {
                        if let Some(rec) = self.containers.remove(&id) {
                            self.by_cgroup.remove(&rec.cgroup_id);
                            for n in &rec.nested {
                                self.by_cgroup.remove(n);
                            }
                        }
                    }
                }
                out.push(PodLifecycleEvent::pod_sync(uid, c.at));
                Applied::Done
            }
            Some(Owner::Other) => Applied::NotAContainer,
            Some(Owner::Foreign) => Applied::OutsideRoots(c.id),
            None => Applied::Late,
        }
    }

    /// Brings the model in line with a fresh walk of the cgroup tree: at start (initial sync,
    /// containers started before the agent) and after events were lost.
    pub fn resync(&mut self, scan: &Scan, at: BootNs, out: &mut Vec<PodLifecycleEvent>) {
        let mut seen: HashMap<ContainerId, (u64, Option<u32>, bool)> = HashMap::new();
        for sc in &scan.cgroups {
            let entry = CgroupEntry {
                path: Arc::from(sc.path.as_str()),
                kind: sc.kind,
            };
            match &sc.kind {
                CgroupKind::Pod(_) => {
                    self.learn(sc.id, &entry, Some(at), out);
                }
                CgroupKind::Container(c) => {
                    let known = self.containers.contains_key(&c.id);
                    self.learn(sc.id, &entry, Some(at), out);
                    if !c.nested {
                        let s = seen.entry(c.id).or_insert((sc.id, None, known));
                        s.0 = sc.id;
                        s.1 = sc.init_pid.or(s.1);
                    } else {
                        let s = seen.entry(c.id).or_insert((0, None, known));
                        s.1 = s.1.or(sc.init_pid);
                    }
                }
                _ => {
                    self.by_cgroup.insert(sc.id, Owner::Other);
                }
            }
        }
        for (id, (_, init, was_known)) in &seen {
            let rec = self.containers.get_mut(id).expect("learned above");
            match (rec.state, init) {
                (ContainerState::Created | ContainerState::Unknown, Some(pid)) => {
                    rec.state = ContainerState::Running;
                    rec.init_pid = Some(*pid);
                    rec.init_comm = comm_of(*pid);
                    rec.started_at = rec.started_at.or(Some(at));
                    let comm = rec.init_comm.unwrap_or_default();
                    out.push(event(
                        rec,
                        at,
                        PlegEvent::ContainerStarted {
                            id: *id,
                            pid: *pid,
                            comm,
                        },
                    ));
                }
                (ContainerState::Running, None) => Self::died(rec, lost_exit(rec), at, out),
                (ContainerState::Created, None) if !was_known => {
                    // No process, no history: created-not-started or exited before we looked.
                    rec.state = ContainerState::Unknown;
                }
                _ => {}
            }
        }
        // Containers whose cgroup is gone.
        let gone: Vec<ContainerId> = self
            .containers
            .keys()
            .filter(|id| !seen.contains_key(*id))
            .copied()
            .collect();
        for id in gone {
            let cgroup_id = self.containers[&id].cgroup_id;
            let change = CgroupChange {
                at,
                id: cgroup_id,
                level: 0,
                hierarchy: 0,
                path: String::new(),
            };
            self.by_cgroup.insert(cgroup_id, Owner::Container(id));
            self.rmdir(&change, out);
        }
        let live_pods: std::collections::HashSet<PodUid> = scan
            .cgroups
            .iter()
            .filter_map(|c| c.kind.pod().map(|p| p.uid))
            .collect();
        let gone_pods: Vec<(PodUid, Option<u64>)> = self
            .pods
            .values()
            .filter(|p| !live_pods.contains(&p.uid))
            .map(|p| (p.uid, p.cgroup_id))
            .collect();
        for (uid, cgroup_id) in gone_pods {
            let change = CgroupChange {
                at,
                id: cgroup_id.unwrap_or(0),
                level: 0,
                hierarchy: 0,
                path: String::new(),
            };
            self.by_cgroup.insert(change.id, Owner::Pod(uid));
            self.rmdir(&change, out);
        }
    }
}

/// Whether an exec in a container that has no init yet is the init's.
///
/// With runc, `runc init` joins the container's cgroup while still in the node's pid namespace
/// and may re-exec itself from a memfd (`/dev/fd/N`, `/proc/self/exe`) there before it enters the
/// container's namespace: seen inside the cgroup under load, and never the init. The runtime's
/// last stage, the one that becomes the init, is the only task of the cgroup that enters a
/// container's pid namespace before the entrypoint: so the first exec in a container's namespace
/// is the init's, whatever its pid there. That is pid 1 of the container's own namespace (CRI pid
/// mode CONTAINER, kubelet's default), and another pid of a shared one (POD:
/// `shareProcessNamespace`, where the pause process is pid 1; TARGET: ephemeral containers
/// joining another container's namespace). A container sharing the node's namespace (NODE:
/// hostPID) has no namespace of its own: there the first exec that is not such a self re-exec is
/// the init. `runc exec` sessions (exec probes, `kubectl exec`) come only after the init started.
fn is_init_exec(e: &Exec, in_container_ns: bool) -> bool {
    const SELF_REEXEC: [&str; 4] = ["/proc/self/", "/proc/thread-self/", "/dev/fd/", "memfd:"];
    let self_reexec = SELF_REEXEC.iter().any(|p| e.filename.starts_with(p));
    in_container_ns || !self_reexec
}

fn lost_exit(rec: &ContainerRecord) -> ContainerExit {
    ContainerExit {
        status: None,
        reason: ExitReason::Unknown,
        pid: rec.init_pid,
        comm: rec.init_comm,
    }
}

fn comm_of(pid: u32) -> Option<Comm> {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|c| Comm::from(c.trim_end()))
}

fn event(rec: &ContainerRecord, at: BootNs, event: PlegEvent) -> PodLifecycleEvent {
    PodLifecycleEvent {
        pod_uid: rec.pod,
        runtime: rec.runtime,
        at,
        event,
    }
}
