//! The fast path of `observer run` (`conditions` mode): the wire a container's death takes from
//! the PLEG to its `ContainersAlive=False` PATCH, without waiting for the reconciler, the status
//! manager or the CRI, and all on the kernel reader's thread (real-time with
//! `--realtime-priority`: see [`crate::sched`] for the bound), so that the request waits neither
//! behind the node's workloads nor for another thread's wake-up.
//!
//! What it keeps is the transport; what a death means is the status layer's:
//!
//! - The transition: for each death (the kernel saw the init exit, with its status) the hook
//!   asks [`status::death::transition`], which decides it from the pod's [`status::ManagerSnapshot`] in
//!   the ledger (what the status manager last computed, so no lock of the reconciler's view or
//!   the reflector's store is taken) with the manager's own function, and claims it in the
//!   [`AliveLedger`]. A claim is the fast path's to send; the ledger's lock is held for map
//!   operations only.
//! - The wire: the request is written to the socket right there, on connections the reader's
//!   thread owns ([`wire`]): HTTP/1.1, pipelined, non-blocking; answers are read when the
//!   reader's poll(2) says they arrived. Connections are opened, proven and given credentials at
//!   normal priority ([`dial`]). A request not answered within the request timeout gives its
//!   connection up and every death on it to the status manager, so a hung API server never
//!   holds up the next death or the reader; at most [`MAX_IN_FLIGHT`] are in flight.
//! - The answer settles the claim in the ledger ([`AliveLedger::confirm`] / [`AliveLedger::fail`]),
//!   which is the ledger's own signal to the status manager: the pod's turn comes again (to
//!   take the claim's condition as its own, or write it where the API refused it). Transitions
//!   back to True are the manager's alone.
//!
//! [`FastPath::build`] makes the hook and its dialer, for the agent, the tests and the benches.
use std::{
    collections::VecDeque,
    ffi::OsString,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant, SystemTime},
};

use ::kube::api::PatchParams;

use crate::{
    kube::transport::api_message,
    model::{BootClock, ContainerId, PodUid, SharedClock},
    pipeline::{Hook, HookFactory},
    pleg::{Death, PlegEvent, PodLifecycleEvent},
    status::{
        self, conditions::ConditionTypes, death::DeathPatch, patch::CONTENT_TYPE,
        writer::status_path, AliveLedger,
    },
};

/// Deaths in flight or waiting for a connection at once; beyond, they are left to the status
/// manager.
pub(crate) const MAX_IN_FLIGHT: usize = 1024;

/// Requests pipelined on one connection. The API server answers a connection's requests one
/// after another, so a death written behind a hundred others waits for all of them; one more
/// than the request being served saves the round trip between them. Past this depth deaths
/// wait on the thread, a gated pod's first, and go out as answers come back. With
/// [`dial::CONNECTIONS`] it bounds what the fast path asks of the API server at once.
pub(crate) const DEPTH: usize = 2;

/// How often an idle connection is used (`GET /version`), so that neither the server nor
/// anything on the way closes it.
const KEEPALIVE: Duration = Duration::from_secs(30);

/// Counters of the fast path.
#[derive(Debug, Default)]
pub struct FastStats {
    /// Deaths seen, and those left to the manager because too many requests were in flight.
    pub deaths: AtomicU64,
    pub dropped: AtomicU64,
    /// Deaths left to the normal path: the pod or container not known yet, not a transition,
    /// the view already had it.
    pub skipped: AtomicU64,
    /// Deaths that waited on the thread for a connection's free slot (a burst).
    pub waited: AtomicU64,
    /// Patches accepted by the API, and those that were not (the normal path writes them).
    pub written: AtomicU64,
    pub failed: AtomicU64,
    /// Connections dropped because an answer went past [`wire::MAX_RESPONSE_BYTES`].
    pub too_large: AtomicU64,
    /// From the kernel's exit to the request written, observed on the reader's thread.
    pub write_latency: WriteLatency,
}

impl FastStats {
    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }

    /// `observer_fast_path_*_total`.
    pub(crate) fn encode_metrics(
        &self,
        e: &mut prometheus_client::encoding::DescriptorEncoder<'_>,
    ) -> std::fmt::Result {
        let g = Self::get;
        for (name, help, v) in [
            ("fast_path_deaths", "Deaths the fast path saw", g(&self.deaths)),
            ("fast_path_dropped", "Deaths left to the status manager because 1024 fast requests were in flight or waiting, or no connection of the fast path was open", g(&self.dropped)),
            ("fast_path_skipped", "Deaths the fast path left to the status manager (no transition, its client not up, or the pod or container not computed by the manager yet)", g(&self.skipped)),
            ("fast_path_waited", "Deaths that waited for one of the fast path's request slots (a burst: gated pods' first)", g(&self.waited)),
            ("fast_path_writes", "ContainersAlive=False patches of the fast path the API accepted", g(&self.written)),
            ("fast_path_write_errors", "Fast status writes not accepted (the status manager writes them)", g(&self.failed)),
            ("fast_path_responses_too_large", "Connections of the fast path dropped because an answer of the API server went past 1 MiB (their deaths went to the status manager)", g(&self.too_large)),
        ] {
            crate::exposition::counter(e, name, help, v)?;
        }
        crate::exposition::metric(
            e,
            "fast_write_latency",
            "Time from a container init's exit in the kernel to the fast path's ContainersAlive patch written to its connection to the API",
            Some(&prometheus_client::registry::Unit::Seconds),
            &self.write_latency,
        )
    }
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// A latency histogram in seconds with the buckets of [`crate::exposition::Latency`], observed
/// without a lock: prometheus-client's takes one that a scrape holds while it encodes, and the
/// reader's thread waits for no lock a normal-priority thread holds.
#[derive(Debug, Default)]
pub struct WriteLatency {
    /// Per bucket (20 µs doubling, then +Inf), not cumulative.
    buckets: [AtomicU64; LATENCY_BUCKETS + 1],
    sum_ns: AtomicU64,
    count: AtomicU64,
}

const LATENCY_BUCKETS: usize = 20;

fn latency_bound(i: usize) -> f64 {
    20e-6 * f64::from(1u32 << i)
}

impl WriteLatency {
    pub(crate) fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        let i = (0..LATENCY_BUCKETS)
            .find(|&i| secs <= latency_bound(i))
            .unwrap_or(LATENCY_BUCKETS);
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }
}

impl prometheus_client::encoding::EncodeMetric for WriteLatency {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::MetricEncoder<'_>,
    ) -> std::fmt::Result {
        let buckets: Vec<(f64, u64)> = (0..=LATENCY_BUCKETS)
            .map(|i| {
                let bound = if i == LATENCY_BUCKETS {
                    f64::MAX
                } else {
                    latency_bound(i)
                };
                (bound, self.buckets[i].load(Ordering::Relaxed))
            })
            .collect();
        let sum = self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        // The count is the buckets' own sum: a scrape between two atomics stays consistent.
        let count = buckets.iter().map(|(_, n)| n).sum();
        encoder
            .encode_histogram::<prometheus_client::encoding::NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> prometheus_client::metrics::MetricType {
        prometheus_client::metrics::MetricType::Histogram
    }
}

pub mod dial;
pub mod wire;

/// What the fast path is built from.
pub struct FastConfig {
    /// `--kubeconfig` (else in-cluster): its connections are opened from it.
    pub kubeconfig: Option<OsString>,
    /// The field manager its patches name (the status manager's).
    pub field_manager: String,
    pub request_timeout: Duration,
    pub types: ConditionTypes,
    /// Shared with the status manager.
    pub ledger: Arc<AliveLedger>,
    /// The transition's time, and the write's latency, are read from here.
    pub clock: SharedClock,
}

/// The fast path, made once: the hook for the reader's thread, the dialer to run at normal
/// priority (until the hook is dropped), and the counters.
pub struct FastPath {
    pub hook: HookFactory,
    pub dialer: dial::Dialer,
    pub stats: Arc<FastStats>,
}

impl FastPath {
    /// The agent's, the tests' and the benches' one way to it. Fails only when the process is
    /// out of file descriptors (the dialer's wake-up is a socket pair).
    pub fn build(cfg: FastConfig) -> std::io::Result<Self> {
        let (dialer, dialed) = dial::pair(cfg.kubeconfig, cfg.request_timeout)?;
        let stats = Arc::new(FastStats::default());
        let decider = DeathDecider {
            types: cfg.types,
            ledger: cfg.ledger,
            stats: Arc::clone(&stats),
            clock: cfg.clock,
        };
        let (field_manager, timeout) = (cfg.field_manager, cfg.request_timeout);
        let hook: HookFactory = Box::new(move |clock: &BootClock| {
            Box::new(FastDeaths::new(
                decider,
                clock.clone(),
                &field_manager,
                timeout,
                dialed,
            )) as Box<dyn Hook>
        });
        Ok(Self {
            hook,
            dialer,
            stats,
        })
    }
}

/// What a request on the fast path's connections was for.
pub enum Tag {
    /// `GET /version`: the dialer's proof, or an idle connection kept alive.
    Probe,
    Death {
        pod: PodUid,
        container: ContainerId,
        name: String,
        /// From the kernel's exit to the request written.
        written: Duration,
    },
}

/// A death's patch, decided on the PLEG's thread.
pub struct FastJob {
    pub death: Death,
    pub patch: DeathPatch,
}

/// What the PLEG's thread needs to decide a death's patch.
pub(crate) struct DeathDecider {
    pub types: ConditionTypes,
    pub ledger: Arc<AliveLedger>,
    pub stats: Arc<FastStats>,
    /// The transition's time, and the write's latency, are read from here.
    pub clock: SharedClock,
}

impl DeathDecider {
    /// A made-ahead death's condition into the ledger once its request is written.
    fn settle(&self, patch: DeathPatch, death: &Death) {
        patch.settle(&self.ledger, &self.types, death);
    }
}

/// The fast path, on the PLEG's thread: every death with a known exit decided, claimed, and
/// its patch written to one of the thread's own connections.
pub struct FastDeaths {
    decider: DeathDecider,
    clock: BootClock,
    request_timeout: Duration,
    dialed: dial::Dialed,
    conns: Vec<wire::Conn<Tag>>,
    /// Deaths claimed while every connection was [`DEPTH`] deep: gated pods', then the others,
    /// each in the order they died.
    waiting: [VecDeque<FastJob>; 2],
    template: Option<Arc<wire::Template>>,
    /// `?fieldManager=…`, as kube encodes it.
    query: String,
}

impl FastDeaths {
    fn new(
        decider: DeathDecider,
        clock: BootClock,
        field_manager: &str,
        request_timeout: Duration,
        dialed: dial::Dialed,
    ) -> Self {
        let params = PatchParams {
            field_manager: Some(field_manager.to_string()),
            ..Default::default()
        };
        let query = status_path(&params, "n", "p")
            .ok()
            .and_then(|p| p.split_once('?').map(|(_, q)| format!("?{q}")))
            .unwrap_or_default();
        Self {
            decider,
            clock,
            request_timeout,
            dialed,
            conns: Vec::new(),
            waiting: Default::default(),
            template: None,
            query,
        }
    }

    /// The patch for `ev` when it is a death the fast path is to write, claimed in the ledger.
    pub fn claim(&mut self, ev: &PodLifecycleEvent) -> Option<FastJob> {
        let PlegEvent::ContainerDied { id, exit } = &ev.event else {
            return None;
        };
        exit.status?;
        let d = &self.decider;
        bump(&d.stats.deaths);
        // Nothing is claimed while no request can be sent: the manager writes every death then.
        if !d.ledger.writing() {
            bump(&d.stats.skipped);
            return None;
        }
        // A hung API server holds at most this many requests: beyond, the manager writes.
        if self.in_flight() >= MAX_IN_FLIGHT {
            bump(&d.stats.dropped);
            return None;
        }
        let death = Death {
            pod: ev.pod_uid,
            container: *id,
            at: ev.at,
            exit: exit.clone(),
        };
        let now = d.clock.now();
        let Some(patch) = status::death::transition(&d.ledger, &d.types, &death, &self.clock, now)
        else {
            bump(&d.stats.skipped);
            return None;
        };
        Some(FastJob { death, patch })
    }

    fn in_flight(&self) -> usize {
        self.conns.iter().map(wire::Conn::in_flight).sum::<usize>() + self.waiting()
    }

    fn waiting(&self) -> usize {
        self.waiting.iter().map(VecDeque::len).sum()
    }

    /// Writes the death now if a connection has room, else keeps it for [`Self::pump`].
    fn send_or_wait(&mut self, job: FastJob) {
        if self.waiting() == 0 && self.free_conn().is_some() {
            self.write(job);
            return;
        }
        bump(&self.decider.stats.waited);
        let class = usize::from(!job.patch.basis.gated);
        self.waiting[class].push_back(job);
        self.pump();
    }

    /// The waiting deaths, gated pods' first, onto the connections' free slots; with no
    /// connection left, to the status manager.
    fn pump(&mut self) {
        loop {
            if !self.conns.is_empty() && self.free_conn().is_none() {
                return;
            }
            let Some(job) = self.waiting.iter_mut().find_map(|q| q.pop_front()) else {
                return;
            };
            self.write(job);
        }
    }

    /// The open connection with the fewest requests in flight, if one is below [`DEPTH`].
    fn free_conn(&self) -> Option<usize> {
        self.conns
            .iter()
            .enumerate()
            .filter(|(_, c)| c.open_for_requests())
            .min_by_key(|(_, c)| c.in_flight())
            .filter(|(_, c)| c.in_flight() < DEPTH)
            .map(|(i, _)| i)
    }

    /// Takes what the dialer opened since the last call.
    fn take_handed(&mut self) {
        let before = self.conns.len();
        while let Some(h) = self.dialed.take() {
            match h {
                dial::Handed::Conn(c, t) => {
                    self.conns.push(c);
                    self.template = Some(t);
                }
                dial::Handed::Template(t) => self.template = Some(t),
            }
        }
        if self.conns.len() != before {
            self.decider.ledger.writer_running(!self.conns.is_empty());
            self.pump();
        }
    }

    /// Writes the patch on the connection with the fewest requests in flight; with none open,
    /// the death is the status manager's.
    fn write(&mut self, job: FastJob) {
        let FastJob { death, patch } = job;
        let i = self.free_conn();
        let (Some(i), Some(t)) = (i, self.template.as_deref()) else {
            self.decider.settle(patch, &death);
            self.decider.ledger.fail(&death.pod, death.container);
            bump(&self.decider.stats.dropped);
            return;
        };
        let view = &patch.basis.view;
        let path = [
            "/api/v1/namespaces/",
            &view.namespace,
            "/pods/",
            &view.name,
            "/status",
            &self.query,
        ];
        let tag = Tag::Death {
            pod: death.pod,
            container: death.container,
            name: view.name.clone(),
            written: Duration::ZERO,
        };
        let sent = self.conns[i].send_with(tag, self.request_timeout, |out| {
            t.request_into(out, "PATCH", &path, CONTENT_TYPE, &patch.parts());
        });
        // Before any answer (read after this batch) or failure is handled.
        self.decider.settle(patch, &death);
        // Taken now, observed once answered: the histogram is memory the request need not
        // touch first.
        let written = self
            .decider
            .clock
            .now()
            .duration_since(self.clock.to_system_time(death.at))
            .unwrap_or_default();
        match sent {
            Ok(()) => {
                if let Some(Tag::Death { written: w, .. }) = self.conns[i].newest_mut() {
                    *w = written;
                }
            }
            Err(e) => self.give_up(i, &e),
        }
    }

    /// A connection failed: every death on it goes to the status manager, and the dialer opens
    /// another.
    fn give_up(&mut self, i: usize, why: &wire::ConnError) {
        let conn = self.conns.swap_remove(i);
        tracing::debug!("fast status path: connection given up: {why}");
        if why.too_large().is_some() {
            bump(&self.decider.stats.too_large);
        }
        for tag in conn.into_unanswered() {
            self.unanswered(tag);
        }
        self.dialed.lost(why);
        if self.conns.is_empty() {
            self.decider.ledger.writer_running(false);
        }
    }

    fn unanswered(&mut self, tag: Tag) {
        if let Tag::Death { pod, container, .. } = tag {
            // The ledger tells the manager: the pod's turn, to write it.
            self.decider.ledger.fail(&pod, container);
            bump(&self.decider.stats.failed);
        }
    }

    fn answered(&mut self, tag: Tag, r: &wire::Response) {
        let ok = (200..300).contains(&r.status);
        if r.status == 401 {
            // A rotated token, certificate or CA: read again before the next request.
            self.dialed.credentials_refused();
        }
        let Tag::Death {
            pod,
            container,
            name,
            written,
        } = tag
        else {
            if !ok {
                tracing::debug!(
                    status = r.status,
                    "fast status path's keep-alive answered {}",
                    api_message(&r.body)
                );
            }
            return;
        };
        // Settling the claim is the ledger's signal to the manager: the pod's turn again, to
        // take the condition as its own (or write it where it was not accepted).
        if ok {
            bump(&self.decider.stats.written);
            self.decider.stats.write_latency.observe(written);
            self.decider.ledger.confirm(&pod, container);
        } else {
            // The manager writes the same condition once its view caught up, through its
            // retrying writer.
            self.decider.ledger.fail(&pod, container);
            bump(&self.decider.stats.failed);
            if r.status == 401 {
                self.dialed.credentials_refused();
            }
            tracing::debug!(pod = %name, status = r.status, "fast status write not accepted ({}); the status manager writes it", api_message(&r.body));
        }
    }
}

impl Hook for FastDeaths {
    fn event(&mut self, ev: &PodLifecycleEvent, _sent: SystemTime) {
        self.take_handed();
        if let Some(job) = self.claim(ev) {
            self.send_or_wait(job);
        }
    }

    fn interest(&mut self, fds: &mut Vec<libc::pollfd>) -> Option<Instant> {
        self.take_handed();
        let mut due: Option<Instant> = None;
        for c in &self.conns {
            let mut events = libc::POLLIN;
            if c.wants_write() {
                events |= libc::POLLOUT;
            }
            fds.push(libc::pollfd {
                fd: c.fd(),
                events,
                revents: 0,
            });
            let next = c.due().unwrap_or_else(|| c.used() + KEEPALIVE);
            due = Some(due.map_or(next, |d| d.min(next)));
        }
        due
    }

    fn ready(&mut self, fds: &[libc::pollfd]) {
        let now = Instant::now();
        let mut i = 0;
        while i < self.conns.len() {
            let revents = fds
                .get(i)
                .filter(|p| p.fd == self.conns[i].fd())
                .map_or(0, |p| p.revents);
            let readable = revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0;
            let writable = revents & libc::POLLOUT != 0;
            let (answered, failed) = self.conns[i].ready(readable, writable, now);
            for (tag, r) in answered {
                self.answered(tag, &r);
            }
            if let Some(e) = failed {
                self.give_up(i, &e);
                continue;
            }
            if self.conns[i].spent() {
                self.give_up(i, &wire::ConnError::Closed);
                continue;
            }
            if self.conns[i].idle_for(now) >= KEEPALIVE {
                if let Some(t) = self.template.as_deref() {
                    let probe = t.request("GET", "/version", "", b"");
                    if let Err(e) = self.conns[i].send(Tag::Probe, &probe, self.request_timeout) {
                        self.give_up(i, &e);
                        continue;
                    }
                }
            }
            i += 1;
        }
        // Answers freed slots, or the last connection went: the waiting deaths go now.
        self.pump();
    }
}

#[cfg(test)]
mod burst;
#[cfg(test)]
mod with_manager;

/// A container's init exiting with code 1 now, as the PLEG tells it.
#[cfg(test)]
fn exited_1(pod: PodUid, id: ContainerId) -> PodLifecycleEvent {
    use crate::{
        kernel::WaitStatus,
        pleg::{ContainerExit, ExitReason},
    };
    PodLifecycleEvent {
        pod_uid: pod,
        runtime: None,
        at: BootClock::now(),
        event: PlegEvent::ContainerDied {
            id,
            exit: ContainerExit {
                status: Some(WaitStatus::exited(1)),
                reason: ExitReason::Error,
                pid: Some(4242),
                comm: None,
            },
        },
    }
}
