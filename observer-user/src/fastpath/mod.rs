//! The fast path of `observer run` (`conditions` mode): a container's death from the PLEG to the
//! `ContainersAlive=False` PATCH on the wire, without waiting for the reconciler, the status
//! manager or the CRI, and all on the kernel reader's thread (real-time with
//! `--realtime-priority`: see [`crate::sched`] for the bound), so that the request waits neither
//! behind the node's workloads nor for another thread's wake-up.
//!
//! - [`FastDeaths`] is the PLEG's hook. For each death (the kernel saw the init exit, with its
//!   status) it takes the pod's [`ManagerSnapshot`] from the ledger (the reconciled view and the API's pod
//!   as the status manager last computed them: the container's name and restart count are known
//!   from its start) and claims the transition. A failed death's patch was made there ahead
//!   ([`Prepared`]): only how and when the container ended are spliced in. Any other death (an
//!   exit 0) is applied to the view as the reconciler will, and the condition computed with the
//!   manager's own function ([`observer_conditions`]). It takes no lock a normal-priority thread
//!   holds for longer than a map operation (not the reconciler's view, not the reflector's
//!   store).
//! - The request is written to the socket right there, on connections the reader's thread owns
//!   ([`wire`]): HTTP/1.1, pipelined, non-blocking; answers are read when the reader's poll(2)
//!   says they arrived. Connections are opened and proven at normal priority ([`dial`]). Only a
//!   transition to False is written here; a request not answered within the request timeout
//!   gives its connection up and every death on it to the status manager, so a hung API server
//!   never holds up the next death or the reader; at most [`MAX_IN_FLIGHT`] are in flight.
//! - One owner of the condition's truth: the [`AliveLedger`], shared with the status manager,
//!   holds the last `ContainersAlive` either side submitted per pod. The fast path claims the
//!   False transition there (and skips when the ledger already says False); the manager does not
//!   write the pod while its view has not caught up with a claimed death (which would write True
//!   again), then takes the claim's transition time as its own, and counts a confirmed fast write
//!   as what the API has (so the same condition is not sent twice). Transitions back to True are
//!   the manager's alone.
use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant, SystemTime},
};

use ::kube::api::PatchParams;
use k8s_openapi::api::core::v1::{Pod, PodCondition};

use crate::{
    kube::transport::api_message,
    model::{BootClock, ContainerId, PodUid, SharedClock},
    pipeline::Hook,
    pleg::{Death, PlegEvent, PodLifecycleEvent},
    reconcile::{ContainerPhase, PodView, ReconcileHandle, Source},
    status::{
        conditions::{observer_conditions, ConditionTypes},
        patch::{conditions_patch, CONTENT_TYPE},
        writer::status_path,
        AliveLedger, DeathDetails, ManagerSnapshot, Prepared,
    },
    sync::{Bell, BellWaiter},
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
    /// From the kernel's exit to the request written, observed at normal priority.
    pub write_latency: crate::exposition::Latency,
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
        self.write_latency.encode(
            e,
            "fast_write_latency",
            "Time from a container init's exit in the kernel to the fast path's ContainersAlive patch written to its connection to the API",
        )
    }
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

pub mod dial;
pub mod wire;

/// A death the API answered (or that was given up): its pod is to be marked changed for the
/// status manager's turn, and the write's latency observed, both at normal priority.
#[derive(Clone, Copy, Debug)]
struct Answered {
    pod: PodUid,
    /// From the kernel's exit to the request written; `None` when it was not answered.
    written: Option<Duration>,
}

struct AnswersShared {
    items: std::sync::Mutex<Vec<Answered>>,
    bell: Bell,
}

/// The reader thread's end of the answers: kept on the thread, handed over when the lock is
/// free (never waited for).
pub struct AnswerSender {
    shared: Arc<AnswersShared>,
    local: Vec<Answered>,
}

/// The normal-priority end: [`Self::run`] marks each answered pod changed in the reconciler's
/// view (the status manager holds a pod while its fast patch is in flight) and observes the
/// write's latency.
pub struct AnswerReceiver {
    shared: Arc<AnswersShared>,
    waiter: BellWaiter,
}

/// The two ends. Fails only when the process is out of file descriptors.
pub fn answers() -> std::io::Result<(AnswerSender, AnswerReceiver)> {
    let (bell, waiter) = crate::sync::bell()?;
    let shared = Arc::new(AnswersShared {
        items: std::sync::Mutex::new(Vec::new()),
        bell,
    });
    Ok((
        AnswerSender {
            shared: Arc::clone(&shared),
            local: Vec::new(),
        },
        AnswerReceiver { shared, waiter },
    ))
}

impl AnswerSender {
    fn push(&mut self, a: Answered) {
        self.local.push(a);
    }

    fn flush(&mut self) {
        if self.local.is_empty() {
            return;
        }
        if let Some(mut items) = crate::sync::try_lock(&self.shared.items) {
            items.append(&mut self.local);
            drop(items);
            self.shared.bell.ring();
        }
    }

    /// Answers kept on the thread because the lock was busy.
    fn kept(&self) -> usize {
        self.local.len()
    }
}

impl AnswerReceiver {
    /// Holds the answers' lock until the guard drops: tests show that the reader's thread never
    /// waits for it.
    pub fn hold_lock(&self) -> impl Drop + '_ {
        crate::sync::lock(&self.shared.items)
    }

    /// Runs until the agent stops.
    pub async fn run(mut self, reconcile: ReconcileHandle, stats: Arc<FastStats>) {
        loop {
            self.waiter.arm();
            let taken = std::mem::take(&mut *crate::sync::lock(&self.shared.items));
            if taken.is_empty() {
                self.waiter.wait().await;
                continue;
            }
            for a in taken {
                if let Some(w) = a.written {
                    stats.write_latency.observe(w);
                }
                reconcile.mark_changed(a.pod);
            }
        }
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
    pub patch: FastPatch,
}

/// The status patch of one death, encoded.
pub struct FastPatch {
    /// Where the pod's namespace and name come from.
    pub basis: Arc<ManagerSnapshot>,
    pub body: Body,
}

pub enum Body {
    /// The basis's `prepared[i]` with what the death brings. Its condition goes to the ledger
    /// after the request is written: only the request's bytes are put together before send(2).
    FromPrepared {
        prepared: usize,
        filled: DeathDetails,
        now: SystemTime,
    },
    /// Computed in full, and claimed with its condition.
    Computed(Vec<u8>),
}

impl FastPatch {
    /// The body in parts.
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

    /// A made-ahead death's condition into the ledger ([`AliveLedger::record_condition`]), once its
    /// request is written (or could not be).
    pub(crate) fn record_in_ledger(self, d: &DeathDecider, death: &Death) {
        if let Body::FromPrepared {
            prepared,
            filled,
            now,
        } = &self.body
        {
            let alive = self.basis.prepared[*prepared].condition(&d.types, filled.words(), *now);
            d.ledger
                .record_condition(&death.pod, death.container, alive);
        }
    }
}

/// What the PLEG's thread needs to decide a death's patch.
pub struct DeathDecider {
    pub types: ConditionTypes,
    pub ledger: Arc<AliveLedger>,
    pub stats: Arc<FastStats>,
    /// The transition's time, and the write's latency, are read from here.
    pub clock: SharedClock,
}

/// What the fast path's requests need, known before the agent starts.
pub struct WriterConfig {
    pub field_manager: String,
    pub request_timeout: Duration,
    /// Where answered deaths go, for normal priority to act on ([`AnswerReceiver::run`]).
    pub answers: AnswerSender,
}

/// The fast path, on the PLEG's thread: every death with a known exit decided, claimed, and
/// its patch written to one of the thread's own connections.
pub struct FastDeaths {
    decider: DeathDecider,
    clock: BootClock,
    cfg: WriterConfig,
    dialed: dial::Dialed,
    conns: Vec<wire::Conn<Tag>>,
    /// Deaths claimed while every connection was [`DEPTH`] deep: gated pods', then the others,
    /// each in the order they died.
    waiting: [std::collections::VecDeque<FastJob>; 2],
    template: Option<Arc<wire::Template>>,
    /// `?fieldManager=…`, as kube encodes it.
    query: String,
}

impl FastDeaths {
    pub fn new(
        decider: DeathDecider,
        clock: BootClock,
        cfg: WriterConfig,
        dialed: dial::Dialed,
    ) -> Self {
        let params = PatchParams {
            field_manager: Some(cfg.field_manager.clone()),
            ..Default::default()
        };
        let query = status_path(&params, "n", "p")
            .ok()
            .and_then(|p| p.split_once('?').map(|(_, q)| format!("?{q}")))
            .unwrap_or_default();
        Self {
            decider,
            clock,
            cfg,
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
        let Some(patch) = decide(d, &death, &self.clock) else {
            bump(&d.stats.skipped);
            return None;
        };
        Some(FastJob { death, patch })
    }

    fn in_flight(&self) -> usize {
        self.conns.iter().map(wire::Conn::in_flight).sum::<usize>() + self.waiting()
    }

    fn waiting(&self) -> usize {
        self.waiting
            .iter()
            .map(std::collections::VecDeque::len)
            .sum()
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
            patch.record_in_ledger(&self.decider, &death);
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
        let sent = self.conns[i].send_with(tag, self.cfg.request_timeout, |out| {
            t.request_into(out, "PATCH", &path, CONTENT_TYPE, &patch.parts());
        });
        // Before any answer (read after this batch) or failure is handled.
        patch.record_in_ledger(&self.decider, &death);
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
            self.decider.ledger.fail(&pod, container);
            bump(&self.decider.stats.failed);
            self.cfg.answers.push(Answered { pod, written: None });
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
        if ok {
            bump(&self.decider.stats.written);
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
        // The manager held the pod while the patch was in flight: its turn now.
        self.cfg.answers.push(Answered {
            pod,
            written: Some(written),
        });
    }
}

impl Hook for FastDeaths {
    fn event(&mut self, ev: &PodLifecycleEvent, _sent: SystemTime) {
        self.take_handed();
        if let Some(job) = self.claim(ev) {
            self.send_or_wait(job);
        }
    }

    fn batch_end(&mut self) {
        self.cfg.answers.flush();
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
        if self.cfg.answers.kept() > 0 {
            // Answers wait on the thread while the other end held its lock.
            let soon = Instant::now() + Duration::from_millis(1);
            due = Some(due.map_or(soon, |d| d.min(soon)));
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
                    if let Err(e) = self.conns[i].send(Tag::Probe, &probe, self.cfg.request_timeout)
                    {
                        self.give_up(i, &e);
                        continue;
                    }
                }
            }
            i += 1;
        }
        // Answers freed slots, or the last connection went: the waiting deaths go now.
        self.pump();
        self.cfg.answers.flush();
    }
}

/// The view as the reconciler will have it once it applied the kernel's exit (merge rules: the
/// kernel's exit wins). `None` when the view does not know the container. The reconciler may
/// have applied it already (it reads the same event): the ledger, not the view, says whether
/// the transition is still to be written.
pub(crate) fn with_death(view: &PodView, d: &Death, clock: &BootClock) -> Option<PodView> {
    let status = d.exit.status?;
    let mut v = view.clone();
    let c = v.containers.iter_mut().find(|c| c.id == d.container)?;
    c.phase = ContainerPhase::Exited;
    c.exit_code = Some(status.exit_code());
    c.signal = status.signal();
    c.reason = Some(d.exit.reason.as_str().to_string());
    c.finished_at = Some(clock.to_system_time(d.at));
    c.exit_source = Some(Source::Kernel);
    Some(v)
}

/// The patch for a death, when it is a transition to False the fast path claimed.
fn decide(cfg: &DeathDecider, d: &Death, clock: &BootClock) -> Option<FastPatch> {
    decide_at(cfg, d, clock, cfg.clock.now())
}

fn decide_at(
    cfg: &DeathDecider,
    d: &Death,
    clock: &BootClock,
    now: SystemTime,
) -> Option<FastPatch> {
    let basis = cfg.ledger.basis(&d.pod)?;
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
            let claimed = cfg.ledger.claim_ahead(d.pod, d.container, |last| {
                last.is_some()
                    || api_alive(&basis.pod, &cfg.types).is_none_or(|k| k.status != "False")
            });
            claimed.then_some(())?;
            Body::FromPrepared {
                prepared: i,
                filled,
                now,
            }
        }
        None => {
            let api = api_alive(&basis.pod, &cfg.types);
            Body::Computed(decide_in_full(
                cfg,
                d,
                clock,
                &basis.view,
                &basis.pod,
                api,
                now,
            )?)
        }
    };
    Some(FastPatch { basis, body })
}

/// The pod's `ContainersAlive` as the API has it.
fn api_alive<'a>(pod: &'a Pod, types: &ConditionTypes) -> Option<&'a PodCondition> {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == types.alive))
}

/// [`decide`] for a death no patch was made for: the condition computed as the status manager
/// would, the patch against the last submitted condition.
fn decide_in_full(
    cfg: &DeathDecider,
    d: &Death,
    clock: &BootClock,
    view: &PodView,
    pod: &Pod,
    api_alive: Option<&PodCondition>,
    now: SystemTime,
) -> Option<Vec<u8>> {
    let dead = with_death(view, d, clock)?;
    let api_uid = pod.metadata.uid.as_deref()?;
    let (before, alive) = cfg.ledger.claim(d.pod, d.container, |last| {
        // The last submitted first, then what the API has (for the transition time).
        let known = last.or(api_alive);
        if known.is_some_and(|k| k.status == "False") {
            return None;
        }
        let old: Vec<PodCondition> = known.cloned().into_iter().collect();
        let desired = observer_conditions(Some(pod), &dead, &old, &cfg.types, now);
        desired
            .into_iter()
            .find(|c| c.type_ == cfg.types.alive)
            .filter(|c| c.status == "False")
    })?;
    // The base is what was last submitted, else the API's.
    let base: Vec<PodCondition> = before.or_else(|| api_alive.cloned()).into_iter().collect();
    let body = conditions_patch(api_uid, &base, std::slice::from_ref(&alive)).ok()??;
    serde_json::to_vec(&body).ok()
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A death's patch made at the manager's turn is the one the full computation gives (the
    /// same JSON, the same condition in the ledger) for every shape of failed death; an exit 0
    /// is left to the full computation.
    #[test]
    fn a_prepared_death_is_the_full_computation() {
        use crate::{
            kernel::WaitStatus,
            kube::testkit::{container, cv, exited, pod, sidecar, spec, view},
            pleg::{ContainerExit, ExitReason},
        };
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
                        at: BootClock::now(),
                        exit: ContainerExit {
                            status: Some(status),
                            reason,
                            pid: Some(4242),
                            comm: None,
                        },
                    };
                    let decider = |prepared: bool| {
                        let ledger = Arc::new(AliveLedger::default());
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
                        DeathDecider {
                            types: types.clone(),
                            ledger,
                            stats: Arc::default(),
                            clock: crate::model::system_clock(),
                        }
                    };
                    let (fast, full) = (decider(true), decider(false));
                    let has = fast
                        .ledger
                        .basis(&view.uid)
                        .unwrap()
                        .prepared
                        .iter()
                        .any(|p| p.container == c.id);
                    let what = format!("{shape}, {} {status:?}", c.name);
                    let a = decide_at(&fast, &death, &clock, now);
                    let b = decide_at(&full, &death, &clock, now);
                    let json = |p: &Option<FastPatch>| {
                        p.as_ref().map(|p| {
                            serde_json::from_slice::<serde_json::Value>(&p.parts().concat())
                                .unwrap()
                        })
                    };
                    assert_eq!(json(&a), json(&b), "{what}");
                    // A made death's condition reaches the ledger once its request is written.
                    if let Some(p) = a {
                        p.record_in_ledger(&fast, &death);
                    }
                    assert!(
                        b.is_some() || !Prepared::fits(&death),
                        "{what}: every failed death here is a transition"
                    );
                    let alive = |d: &DeathDecider| d.ledger.last(&view.uid);
                    assert_eq!(alive(&fast), alive(&full), "{what}");
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
}
