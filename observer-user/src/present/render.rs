//! How kernel events look on stdout: one JSON object per line, or one aligned text line.
use std::{io::Write, sync::Arc, time::SystemTime};

use serde::Serialize;
use time::{format_description::well_known::Rfc3339, OffsetDateTime};

use crate::{
    cgroup::{CgroupIndex, CgroupKind},
    kernel::{KernelEvent, Task},
    model::{printable, Printable},
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Text,
    Json,
}

/// One line of `observer watch --format json`. Field names are a public interface (README).
#[derive(Debug, Default, Serialize)]
pub(crate) struct WatchLine<'a> {
    #[serde(rename = "type")]
    pub kind: &'a str,
    pub time: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tgid: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ppid: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub comm: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cgroup_id: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cgroup_path: Option<Arc<str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub filename: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Present (possibly null) on exits.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signal: Option<Option<u8>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub core_dumped: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group_dead: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total_vm_kb: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub anon_rss_kb: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file_rss_kb: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shmem_rss_kb: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oom_score_adj: Option<i16>,
    /// The task whose allocation invoked the OOM killer, and its cgroup.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trigger_pid: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trigger_cgroup_path: Option<Arc<str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub level: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lost_records: Option<u64>,
    /// Limit hits: the memory cgroup at its limit (inode number in the memory hierarchy).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memcg_id: Option<u64>,
    /// Limit hits: what the kernel's record says (absent on other lines).
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub limit: Option<LimitLine>,
}

/// A memory warning on a watch line: the reading that raised it (or the latest, at its end),
/// what cannot be reclaimed, and the time to full with how it was estimated.
#[derive(Clone, Debug, Default, Serialize)]
pub struct WarningLine {
    /// `container`, `pod` or `cgroup`: whose limit.
    pub scope: &'static str,
    pub usage_bytes: u64,
    pub limit_bytes: u64,
    pub unreclaimable_bytes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub growth_bytes_per_second: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time_left_seconds: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub estimated: Option<String>,
    /// The end's: how long the warning stood.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stood_seconds: Option<f64>,
    /// The MemoryNearLimit Event's sentence (the raise's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// A memory warning raised or ended, from the reconciled view: `MemoryWarning`,
/// `MemoryWarningEnded`.
pub(crate) fn memory_warning_line(
    pod: crate::model::PodUid,
    c: &crate::reconcile::ContainerView,
    news: &crate::pressure::News<'_>,
    raised_at: Option<SystemTime>,
) -> PlegLine {
    use crate::pressure::News;
    let (event, time, reading) = match news {
        News::Raised(r) => ("MemoryWarning", r.time, Some(*r)),
        News::Ended { at, last } => ("MemoryWarningEnded", *at, *last),
    };
    let warning = reading.map(|r| WarningLine {
        scope: r.scope.label(),
        usage_bytes: r.usage_bytes,
        limit_bytes: r.limit_bytes,
        unreclaimable_bytes: r.breakdown.unreclaimable(),
        growth_bytes_per_second: r.growth,
        time_left_seconds: r.eta(),
        estimated: r.how_estimated(),
        stood_seconds: match news {
            News::Ended { at, .. } => raised_at
                .and_then(|r| at.duration_since(r).ok())
                .map(|d| d.as_secs_f64()),
            News::Raised(_) => None,
        },
        message: matches!(news, News::Raised(_)).then(|| r.sentence()),
    });
    PlegLine {
        event,
        time: rfc3339(time),
        pod_uid: pod.to_string(),
        container_id: Some(c.id.to_string()),
        reason: Some("MemoryNearLimit".into()),
        source: "kernel",
        container: Some(c.name.clone()).filter(|n| !n.is_empty()),
        warning,
        ..Default::default()
    }
}

/// A limit hit's figures on a watch line: the memory cgroup's usage and limit after reclaim
/// (usage 0 and no limit where only the tracepoint was attached), the hits summed in the
/// kernel's record, those whose reclaim fell short, and what reclaim freed of what it was asked.
#[derive(Clone, Debug, Default, Serialize)]
pub struct LimitLine {
    pub usage_bytes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit_bytes: Option<u64>,
    pub limit_hits: u64,
    pub reclaim_short: u64,
    pub reclaimed_bytes: u64,
    pub requested_bytes: u64,
}

impl LimitLine {
    fn of(h: &crate::kernel::LimitHit) -> Self {
        Self {
            usage_bytes: h.usage_bytes,
            limit_bytes: h.limit_bytes,
            limit_hits: h.hits,
            reclaim_short: h.short,
            reclaimed_bytes: h.reclaimed_bytes,
            requested_bytes: h.requested_bytes,
        }
    }
}

pub(crate) fn rfc3339(t: SystemTime) -> String {
    OffsetDateTime::from(t).format(&Rfc3339).unwrap_or_default()
}

/// Builds the line for `ev`; `cgroups` turns ids into paths and container identities.
pub(crate) fn watch_line<'a>(
    ev: &'a KernelEvent,
    time: SystemTime,
    cgroups: &mut CgroupIndex,
) -> WatchLine<'a> {
    let mut line = WatchLine {
        kind: ev.type_name(),
        time: rfc3339(time),
        ..Default::default()
    };
    let task = |line: &mut WatchLine<'a>, t: &Task| {
        line.pid = Some(t.pid);
        line.tgid = Some(t.tgid);
        line.ppid = Some(t.ppid);
        line.comm = Some(t.comm.to_string());
        line.cgroup_id = Some(t.cgroup_id);
    };
    let cgroup_id = match ev {
        KernelEvent::Exec(e) => {
            task(&mut line, &e.task);
            line.filename = Some(&e.filename);
            Some(e.task.cgroup_id)
        }
        KernelEvent::Exit(e) => {
            task(&mut line, &e.task);
            line.exit_code = Some(e.status.exit_code());
            line.signal = Some(e.status.signal());
            line.core_dumped = Some(e.status.core_dumped());
            line.group_dead = Some(e.group_dead);
            Some(e.task.cgroup_id)
        }
        KernelEvent::OomKill(o) => {
            task(&mut line, &o.victim);
            line.comm = Some(o.victim_comm.to_string());
            line.total_vm_kb = o.memory.total_vm_kb;
            line.anon_rss_kb = o.memory.anon_rss_kb;
            line.file_rss_kb = o.memory.file_rss_kb;
            line.shmem_rss_kb = o.memory.shmem_rss_kb;
            line.oom_score_adj = o.oom_score_adj;
            line.trigger_pid = Some(o.trigger_tgid);
            Some(o.victim.cgroup_id)
        }
        KernelEvent::CgroupMkdir(c) | KernelEvent::CgroupRmdir(c) | KernelEvent::CgroupEmpty(c) => {
            line.cgroup_id = Some(c.id);
            line.cgroup_path = Some(Arc::from(c.path.as_str()));
            line.level = Some(c.level);
            kind_fields(&mut line, &cgroups.roots().classify(&c.path));
            None
        }
        KernelEvent::Lost { records, .. } => {
            line.lost_records = Some(*records);
            None
        }
        KernelEvent::LimitHit(h) => {
            task(&mut line, &h.task);
            line.memcg_id = Some(h.memcg_id);
            line.limit = Some(LimitLine::of(h));
            Some(h.task.cgroup_id)
        }
    };
    if let KernelEvent::OomKill(o) = ev {
        if o.trigger_cgroup_id != o.victim.cgroup_id {
            line.trigger_cgroup_path = cgroups
                .resolve(o.trigger_cgroup_id)
                .map(|e| Arc::clone(&e.path));
        }
    }
    if let Some(entry) = cgroup_id.and_then(|id| cgroups.resolve(id)) {
        line.cgroup_path = Some(Arc::clone(&entry.path));
        kind_fields(&mut line, &entry.kind);
    }
    line
}

fn kind_fields(line: &mut WatchLine<'_>, kind: &CgroupKind) {
    if let Some(pod) = kind.pod() {
        line.pod_uid = Some(pod.uid.as_str().to_string());
    }
    if let Some(c) = kind.container() {
        line.container_id = Some(c.id.as_str().to_string());
        line.runtime = c.runtime.map(|r| r.as_str());
    }
}

pub(crate) fn write_json(out: &mut impl Write, line: &WatchLine<'_>) -> std::io::Result<()> {
    serde_json::to_writer(&mut *out, line)?;
    out.write_all(b"\n")
}

/// `15:04:05.123456 exit         1234    1200 sh               code=42  /kubepods/...`
pub(crate) fn write_text(out: &mut impl Write, line: &WatchLine<'_>) -> std::io::Result<()> {
    let clock = line.time.get(11..26).unwrap_or(&line.time);
    let dash = || "-".to_string();
    write!(
        out,
        "{clock:<15} {:<12} {:>7} {:>7} {:<16} ",
        line.kind,
        line.tgid.map_or_else(dash, |p| p.to_string()),
        line.ppid.map_or_else(dash, |p| p.to_string()),
        Printable(line.comm.as_deref().unwrap_or("-")),
    )?;
    let detail = match line.kind {
        "exec" => printable(line.filename.unwrap_or("")).into_owned(),
        "exit" => match line.signal.flatten() {
            Some(s) => format!(
                "signal={s}{}",
                if line.core_dumped == Some(true) {
                    " core"
                } else {
                    ""
                }
            ),
            None => format!("code={}", line.exit_code.unwrap_or(0)),
        },
        "oom_kill" => format!(
            "victim={} anon_rss={}kB total_vm={}kB adj={} by={}",
            line.pid.unwrap_or(0),
            line.anon_rss_kb.map_or_else(dash, |v| v.to_string()),
            line.total_vm_kb.map_or_else(dash, |v| v.to_string()),
            line.oom_score_adj.map_or_else(dash, |v| v.to_string()),
            line.trigger_pid.map_or_else(dash, |v| v.to_string()),
        ),
        "lost" => format!(
            "{} records lost: ring buffer overflowed",
            line.lost_records.unwrap_or(0)
        ),
        "limit_hit" => {
            let l = line.limit.clone().unwrap_or_default();
            format!(
                "hits={} short={} reclaimed={}",
                l.limit_hits,
                l.reclaim_short,
                crate::pressure::mib(l.reclaimed_bytes),
            )
        }
        _ => format!("id={}", line.cgroup_id.unwrap_or(0)),
    };
    write!(
        out,
        "{detail:<24} {}",
        Printable(line.cgroup_path.as_deref().unwrap_or("-"))
    )?;
    if let (Some(c), Some(p)) = (&line.container_id, &line.pod_uid) {
        write!(out, " [pod {p} container {}]", &c[..12.min(c.len())])?;
    }
    out.write_all(b"\n")
}

/// One line of `observer watch --pods --format json`.
#[derive(Debug, Default, Serialize)]
pub struct PlegLine {
    pub event: &'static str,
    pub time: String,
    pub pod_uid: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Present (possibly null) on deaths.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signal: Option<Option<u8>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// How the line is known: `kernel` (seen live), `kernel-log` (an OOM kill from before the
    /// agent started), `runtime` (a death before it started, in the runtime's account).
    pub source: &'static str,
    /// The container's name, where the runtime has told it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    /// What the runtime said where the agent's account replaces it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime_reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime_exit_code: Option<i32>,
    /// OOM kills: whether the victim was the container's init (null: not known).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub init: Option<Option<bool>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub comm: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub anon_rss_kb: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total_vm_kb: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oom_score_adj: Option<i16>,
    /// Limit hits: what the kernel's record says (absent on other lines).
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub limit: Option<LimitLine>,
    /// The agent's memory warnings and their end (absent on other lines).
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub warning: Option<WarningLine>,
}

pub fn pleg_line(ev: &crate::pleg::PodLifecycleEvent, time: SystemTime) -> PlegLine {
    use crate::pleg::PlegEvent;
    let mut line = PlegLine {
        event: ev.kind().as_str(),
        time: rfc3339(time),
        pod_uid: ev.pod_uid.as_str().to_string(),
        container_id: ev.container_id().map(|c| c.as_str().to_string()),
        runtime: ev.runtime.map(|r| r.as_str()),
        source: "kernel",
        ..Default::default()
    };
    match &ev.event {
        PlegEvent::ContainerRemoved { .. }
        | PlegEvent::ContainerChanged { .. }
        | PlegEvent::PodSync => {}
        PlegEvent::ContainerStarted { pid, comm, .. } => {
            line.pid = Some(*pid);
            line.comm = Some(comm.to_string());
        }
        PlegEvent::ContainerDied { exit: x, .. } => {
            line.exit_code = Some(x.exit_code());
            line.signal = Some(x.status.and_then(|s| s.signal()));
            line.reason = Some(x.reason.as_str().to_string());
            line.pid = x.pid;
            line.comm = x.comm.map(|c| c.to_string());
        }
        PlegEvent::OomKill { kill: o, .. } => {
            line.reason = Some("OOMKilled".into());
            line.pid = Some(o.victim.tgid);
            line.comm = Some(o.victim_comm.to_string());
            line.anon_rss_kb = o.memory.anon_rss_kb;
            line.total_vm_kb = o.memory.total_vm_kb;
            line.oom_score_adj = o.oom_score_adj;
        }
        PlegEvent::LimitHit { hit: h, .. } => {
            line.pid = Some(h.task.tgid);
            line.comm = Some(h.task.comm.to_string());
            line.limit = Some(LimitLine::of(h));
        }
    }
    line
}

/// A death the agent did not watch, from the reconciled view (kubelet's first relist reports
/// exited containers as died, too).
pub(crate) fn view_died_line(
    pod: &crate::reconcile::PodView,
    c: &crate::reconcile::ContainerView,
) -> PlegLine {
    PlegLine {
        event: "ContainerDied",
        time: c.finished_at.map(rfc3339).unwrap_or_default(),
        pod_uid: pod.uid.to_string(),
        container_id: Some(c.id.to_string()),
        exit_code: c.exit_code,
        signal: Some(c.signal),
        reason: c.reason.clone(),
        source: c.exit_source.map_or("runtime", |s| s.as_str()),
        container: Some(c.name.clone()).filter(|n| !n.is_empty()),
        runtime_reason: c.runtime_reason.clone(),
        runtime_exit_code: c.runtime_exit_code,
        pid: c.init_pid,
        ..Default::default()
    }
}

/// An OOM kill the agent did not watch, from the kernel log.
pub(crate) fn view_oom_line(
    pod: &crate::reconcile::PodView,
    c: &crate::reconcile::ContainerView,
    o: &crate::reconcile::OomEvidence,
) -> PlegLine {
    PlegLine {
        event: "OOMKill",
        time: rfc3339(o.time),
        pod_uid: pod.uid.to_string(),
        container_id: Some(c.id.to_string()),
        reason: Some("OOMKilled".into()),
        source: o.source.as_str(),
        container: Some(c.name.clone()).filter(|n| !n.is_empty()),
        init: Some(o.init),
        pid: Some(o.pid),
        comm: Some(o.comm.clone()),
        anon_rss_kb: o.anon_rss_kb,
        total_vm_kb: o.total_vm_kb,
        oom_score_adj: o.oom_score_adj,
        ..Default::default()
    }
}

/// ` container=app scope=container unreclaimable=58.2 MiB/64.0 MiB usage=60.1 MiB growth=8.0
/// MiB/s full_in=0.7s (between its crossings of 75 % and 86 % of the limit, 0.9 s apart)`, and at
/// the end ` stood=42.0s`.
fn write_warning(out: &mut impl Write, l: &PlegLine, w: &WarningLine) -> std::io::Result<()> {
    use crate::pressure::mib;
    if let Some(name) = &l.container {
        write!(out, " container={}", Printable(name))?;
    }
    write!(
        out,
        " scope={} unreclaimable={}/{} usage={}",
        w.scope,
        mib(w.unreclaimable_bytes),
        mib(w.limit_bytes),
        mib(w.usage_bytes)
    )?;
    if let Some(s) = w.stood_seconds {
        return write!(out, " stood={s:.1}s");
    }
    if let Some(g) = w.growth_bytes_per_second {
        write!(out, " growth={}/s", mib(g.max(0.0) as u64))?;
    }
    if let Some(t) = w.time_left_seconds {
        write!(out, " full_in={t:.1}s")?;
    }
    if let Some(how) = &w.estimated {
        write!(out, " ({how})")?;
    }
    Ok(())
}

pub(crate) fn write_pleg_text(out: &mut impl Write, l: &PlegLine) -> std::io::Result<()> {
    let clock = l.time.get(11..26).unwrap_or(&l.time);
    let ctr = l
        .container_id
        .as_deref()
        .map_or("-", |c| &c[..12.min(c.len())]);
    write!(
        out,
        "{clock:<15} {:<17} pod {} container {ctr:<12}",
        l.event, l.pod_uid
    )?;
    if let Some(reason) = &l.reason {
        write!(out, " {}", Printable(reason))?;
    }
    if let Some(code) = l.exit_code {
        write!(out, " exit={code}")?;
    }
    if let Some(Some(sig)) = l.signal {
        write!(out, " signal={sig}")?;
    }
    if let (Some(pid), Some(comm)) = (l.pid, &l.comm) {
        write!(out, " pid={pid} comm={}", Printable(comm))?;
    }
    if let Some(rss) = l.anon_rss_kb {
        write!(out, " anon_rss={rss}kB")?;
    }
    if let Some(w) = &l.warning {
        write_warning(out, l, w)?;
    }
    if let Some(h) = &l.limit {
        write!(out, " hits={}", h.limit_hits)?;
        if h.reclaim_short > 0 {
            write!(out, " short={}", h.reclaim_short)?;
        }
        if let Some(lim) = h.limit_bytes {
            let usage = crate::pressure::mib(h.usage_bytes);
            write!(out, " usage={usage}/{}", crate::pressure::mib(lim))?;
        }
    }
    out.write_all(b"\n")
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    use super::*;
    use crate::pressure::{Breakdown, Crossed, News, Pressure, Reading, Scope, Told};

    fn at(ms: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_000) + Duration::from_millis(ms)
    }

    /// Anonymous memory in a 64 MiB container limit, read at a crossing of `bp` (or at a quiet
    /// reread: `None`).
    fn reading(ms: u64, anon_kib: u64, bp: Option<u32>) -> Reading {
        Reading {
            time: at(ms),
            scope: Scope::Container,
            usage_bytes: anon_kib << 10,
            limit_bytes: 64 << 20,
            breakdown: Breakdown {
                anon: anon_kib << 10,
                ..Breakdown::default()
            },
            hits: 0,
            short: 0,
            reclaimed_bytes: 0,
            requested_bytes: 0,
            growth: None,
            top: Vec::new(),
            crossing: bp.map(|threshold_bp| Crossed {
                threshold_bp,
                estimate: None,
            }),
        }
    }

    fn text(line: &PlegLine) -> String {
        let mut buf = Vec::new();
        write_pleg_text(&mut buf, line).unwrap();
        String::from_utf8(buf).unwrap()
    }

    #[test]
    fn a_memory_warning_and_its_end_read_as_watch_lines() {
        let c = crate::reconcile::ContainerView::new(
            crate::model::ContainerId::parse(&"ab".repeat(32)).unwrap(),
            "app",
            crate::reconcile::ContainerPhase::Running,
        );
        let uid = crate::model::PodUid::parse("0b3c1e52-0000-4000-8000-000000000001").unwrap();
        let (mut p, mut told) = (Pressure::default(), Told::default());
        // 75 % then 86 % 0.88 s later: 8 MiB/s, about 1.1 s to full.
        p.apply(reading(0, 48 * 1024, Some(7500)));
        p.apply(reading(880, 56_361, Some(8600)));
        let news = p.news(&mut told);
        let [raised @ News::Raised(r)] = news.as_slice() else {
            panic!("{news:?}")
        };
        let line = memory_warning_line(uid, &c, raised, None);
        let t = text(&line);
        assert_eq!(
            &t[t.find("MemoryWarning").unwrap_or_default()..],
            "MemoryWarning     pod 0b3c1e52-0000-4000-8000-000000000001 container abababababab MemoryNearLimit container=app scope=container unreclaimable=55.0 MiB/64.0 MiB usage=55.0 MiB growth=8.0 MiB/s full_in=1.1s (between its crossings of 75 % and 86 % of the limit, 0.9 s apart)\n"
        );
        let json = serde_json::to_value(&line).unwrap();
        assert_eq!(json["event"], "MemoryWarning");
        assert_eq!(json["container"], "app");
        let left = json["time_left_seconds"].as_f64().unwrap();
        assert!((1.0..1.3).contains(&left), "{json}");
        assert_eq!(json["message"], r.sentence().as_str());
        // Freed to 20 MiB, 40 s on: the end, with how long it stood and no sentence.
        assert_eq!(
            p.apply(reading(40_880, 20 * 1024, None)),
            crate::pressure::Change::Lowered
        );
        let news = p.news(&mut told);
        let [end @ News::Ended { .. }] = news.as_slice() else {
            panic!("{news:?}")
        };
        let line = memory_warning_line(uid, &c, end, Some(at(880)));
        let t = text(&line);
        assert!(t.contains(" MemoryWarningEnded "), "{t}");
        assert!(
            t.ends_with(" unreclaimable=20.0 MiB/64.0 MiB usage=20.0 MiB stood=40.0s\n"),
            "{t}"
        );
        let json = serde_json::to_value(&line).unwrap();
        assert!(json.get("message").is_none(), "{json}");
        assert_eq!(json["stood_seconds"], 40.0);
    }
}
