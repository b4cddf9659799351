//! Memory pressure before the kill: what a memory cgroup's limit hit means for its container.
//!
//! The kernel says when a charge met a limit and whether reclaim kept up (`kernel::LimitHit`,
//! observer-ebpf/src/memcg.rs, at most ten records a second per cgroup), and, before that, when a
//! charge took the usage past a threshold of the limit (`LimitHit::crossing`,
//! observer-ebpf/src/charge.rs: 50, 75, 86, 90 and 95 %, each once per rise). At each such record
//! the cgroup is read once (`read.rs`: its `memory.stat`, which limit it is) and judged by the
//! rules below; nothing here samples on a timer, but a warning still up is read once more after
//! [`QUIET`] without records, to lower it.
//!
//! The rules (README "Memory warnings"): what the kernel cannot reclaim without swap is anonymous
//! memory, shmem/tmpfs, page cache it may not evict (mlocked, ramfs) and unreclaimable kernel
//! memory; the page cache on the evictable file lists it reclaims on demand, which is why a
//! container reading files sits at its limit all day without risk.
//! - **warn** when that unreclaimable part is at least [`WARN_RATIO`] of the limit, or reclaim
//!   came up short (freed less than asked) while it is at least [`SHORT_WARN_RATIO`];
//! - **warn** of a projected fill: at a crossing while the unreclaimable part is past
//!   [`PROJECT_FROM`] of the limit, when it, growing as it grew since the previous crossing of the
//!   same limit, fills it within [`HORIZON`] ([`Estimate`]);
//! - **lower** the warning when it is below [`CLEAR_RATIO`] and reclaim kept up, and the warning
//!   has stood for at least [`MIN_WARNING`] (no flapping at the threshold); one only projected
//!   is lowered too once it stood, below [`WARN_RATIO`], and the growth stopped;
//! - otherwise keep the state as it is.
pub mod metrics;
pub mod read;

use std::time::{Duration, SystemTime};

pub use read::MemoryReader;

/// Unreclaimable share of the limit at which a container is warned.
pub const WARN_RATIO: f64 = 0.90;
/// ... or at which it is warned when reclaim did not keep up.
pub const SHORT_WARN_RATIO: f64 = 0.75;
/// Below this share (and reclaim keeping up) a warning may be lowered.
pub const CLEAR_RATIO: f64 = 0.80;
/// A warning stands at least this long.
pub const MIN_WARNING: Duration = Duration::from_secs(30);
/// A warning still up after this long without a limit hit is read once more (and again after as
/// long while it stands).
pub const QUIET: Duration = Duration::from_secs(30);
/// Readings that raised a warning, kept per container instance (for explain).
const RAISED_KEPT: usize = 8;
/// How soon a projected fill is warned of. A warning is worth its lead when something can act
/// on it (an operator, an autoscaler, a heap dump) and a fill rate measured over the last quarter
/// of the limit still holds: 30 s covers a leak of 0.5 MiB/s into 64 MiB from its 75 % crossing,
/// and a slower one still meets the [`WARN_RATIO`] rule with more lead than this.
pub const HORIZON: Duration = Duration::from_secs(30);
/// A projected fill is warned of only while the unreclaimable part is past this share of the
/// limit: a heap may grow quickly to 85 % and stay there, which no projection can tell from a
/// leak until it stops (the kernel's next threshold is 86 %: `kernel::CROSSING_THRESHOLDS`); and
/// a page cache at its limit crosses the top thresholds again and again while what it cannot
/// reclaim stays small, its few KiB of noise no rate to project.
pub const PROJECT_FROM: f64 = 0.85;
/// Two readings closer than this say nothing about a rate.
const MIN_INTERVAL: Duration = Duration::from_millis(5);

/// Which limit was hit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scope {
    /// The container's own.
    Container,
    /// The pod's (its cgroup above the containers): every container of the pod charges it.
    Pod,
    /// Another cgroup above the container's (a QoS class, kubepods: the node's allocatable),
    /// hierarchy-relative.
    Cgroup(String),
}

impl Scope {
    /// The metric label.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Container => "container",
            Self::Pod => "pod",
            Self::Cgroup(_) => "cgroup",
        }
    }

    /// "container limit", "pod limit", "limit of cgroup /kubepods/burstable".
    pub fn describe(&self) -> String {
        match self {
            Self::Container => "container limit".to_string(),
            Self::Pod => "pod limit".to_string(),
            Self::Cgroup(c) => format!("limit of cgroup {c}"),
        }
    }
}

/// What fills a memory cgroup, in bytes, from its `memory.stat`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Breakdown {
    pub anon: u64,
    /// Page cache on the evictable file lists: what reclaim can take.
    pub file: u64,
    /// shmem and tmpfs (counted as file by the kernel, but reclaimable only to swap).
    pub shmem: u64,
    /// Page cache reclaim cannot take: mlocked, or on ramfs.
    pub locked: u64,
    /// Kernel memory the kernel cannot reclaim (stacks, page tables, unreclaimable slab, socket
    /// buffers, percpu).
    pub kernel: u64,
    /// Memory the kernel could not reclaim at the limit hit (reclaim freed nothing) that was gone
    /// when `memory.stat` was read: the OOM killer acted in between (fexit records only, which
    /// carry the usage at the hit).
    pub freed_since: u64,
}

impl Breakdown {
    /// What reclaim cannot free without swap.
    pub fn unreclaimable(&self) -> u64 {
        self.anon + self.shmem + self.locked + self.kernel + self.freed_since
    }
}

/// A process of the cgroup and its resident memory, for the warning.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Process {
    pub pid: u32,
    /// Printable, bounded: a process names itself.
    pub comm: String,
    pub rss_bytes: u64,
}

/// One reading of the cgroup at its limit, made at a limit hit.
#[derive(Clone, Debug, PartialEq)]
pub struct Reading {
    pub time: SystemTime,
    pub scope: Scope,
    pub usage_bytes: u64,
    pub limit_bytes: u64,
    pub breakdown: Breakdown,
    /// Limit hits summed in the kernel's record, and of them those whose reclaim came up short.
    pub hits: u64,
    pub short: u64,
    /// Bytes reclaim freed and was asked for, over those hits.
    pub reclaimed_bytes: u64,
    pub requested_bytes: u64,
    /// How fast the unreclaimable part grows, bytes a second, from the previous reading of this
    /// container's episode (`None` for its first).
    pub growth: Option<f64>,
    /// The largest processes by resident memory, read when a warning is raised.
    pub top: Vec<Process>,
    /// Made at a crossing of a threshold of the limit (no reclaim, no hits), not a limit hit.
    pub crossing: Option<Crossed>,
}

/// A reading's crossing: the threshold, and the time to full it projects.
#[derive(Clone, Debug, PartialEq)]
pub struct Crossed {
    /// In basis points of the limit (8600: 86 %).
    pub threshold_bp: u32,
    /// From the previous crossing of the same limit (`None`: this is its first).
    pub estimate: Option<Estimate>,
}

/// A time to full, from two successive crossings of one limit and no other sample: how fast the
/// unreclaimable part grew between them, and how long it takes to fill the limit at that rate.
#[derive(Clone, Debug, PartialEq)]
pub struct Estimate {
    /// The earlier crossing's threshold, in basis points, and how long before this one it was.
    pub from_bp: u32,
    pub interval: Duration,
    /// Growth of the unreclaimable part between the two, bytes a second.
    pub growth: f64,
    /// Seconds until it fills the limit at that growth (`None`: not growing).
    pub time_left: Option<f64>,
}

/// A scope's latest crossing, for the next one's estimate.
#[derive(Clone, Debug, PartialEq, Eq)]
struct CrossingPoint {
    scope: Scope,
    time: SystemTime,
    threshold_bp: u32,
    unreclaimable: u64,
}

impl Reading {
    pub fn ratio(&self) -> f64 {
        if self.limit_bytes == 0 {
            return 0.0;
        }
        self.breakdown.unreclaimable() as f64 / self.limit_bytes as f64
    }

    /// The kernel's usage (page cache included) over the limit, at the record.
    pub fn usage_ratio(&self) -> f64 {
        if self.limit_bytes == 0 {
            return 0.0;
        }
        self.usage_bytes as f64 / self.limit_bytes as f64
    }

    /// The crossing's projection, where it warns: the unreclaimable part past [`PROJECT_FROM`]
    /// of the limit, full within [`HORIZON`].
    pub fn projected(&self) -> Option<&Estimate> {
        let e = self.crossing.as_ref()?.estimate.as_ref()?;
        let soon = e.time_left? <= HORIZON.as_secs_f64();
        (soon && self.ratio() > PROJECT_FROM).then_some(e)
    }

    /// What this reading warns for, were there no projection.
    fn warns_by_ratio(&self) -> bool {
        let r = self.ratio();
        r >= WARN_RATIO || (self.short > 0 && r >= SHORT_WARN_RATIO)
    }

    /// Seconds until the unreclaimable part reaches the limit at the growth measured.
    pub fn eta(&self) -> Option<f64> {
        let g = self.growth.filter(|g| *g > 0.0)?;
        let left = self
            .limit_bytes
            .saturating_sub(self.breakdown.unreclaimable());
        Some(left as f64 / g)
    }

    /// "between its crossings of 75 % and 86 % of the limit, 0.9 s apart": where the growth was
    /// measured between two crossings (no sample in between).
    fn crossings_apart(&self) -> Option<String> {
        let c = self.crossing.as_ref()?;
        let e = c.estimate.as_ref()?;
        Some(format!(
            "between its crossings of {} and {} of the limit, {:.1} s apart",
            percent(e.from_bp),
            percent(c.threshold_bp),
            e.interval.as_secs_f64()
        ))
    }

    /// How [`Self::growth`] and so [`Self::eta`] were measured, for a reader (`None`: not yet).
    pub fn how_estimated(&self) -> Option<String> {
        self.growth?;
        Some(
            self.crossings_apart()
                .unwrap_or_else(|| "between its last two readings of the cgroup".into()),
        )
    }

    /// The judgement of this reading alone.
    pub fn verdict(&self) -> Verdict {
        let r = self.ratio();
        if self.warns_by_ratio() || self.projected().is_some() {
            Verdict::Warn
        } else if r < CLEAR_RATIO && self.short == 0 {
            Verdict::Calm
        } else {
            Verdict::Hold
        }
    }

    /// One sentence: "61.0 MiB of the 64.0 MiB container limit cannot be reclaimed (95%: anon
    /// 60.0 MiB, shmem 0 B, kernel 1.0 MiB; 2.0 MiB page cache), growing 8.0 MiB/s: full in
    /// ~0.4 s".
    pub fn sentence(&self) -> String {
        let b = &self.breakdown;
        let mut locked = if b.locked > 0 {
            format!(", locked page cache {}", mib(b.locked))
        } else {
            String::new()
        };
        if b.freed_since > 0 {
            locked.push_str(&format!(
                ", {} more the kernel could not reclaim at the hit, freed before it was read",
                mib(b.freed_since)
            ));
        }
        let mut s = format!(
            "{} of the {} {} cannot be reclaimed ({:.0}%: anon {}, shmem {}{locked}, kernel {}; {} reclaimable page cache)",
            mib(b.unreclaimable()),
            mib(self.limit_bytes),
            self.scope.describe(),
            self.ratio() * 100.0,
            mib(b.anon),
            mib(b.shmem),
            mib(b.kernel),
            mib(b.file),
        );
        let how = self
            .crossings_apart()
            .map(|h| format!(" ({h})"))
            .unwrap_or_default();
        match (self.growth, self.eta()) {
            (Some(g), Some(eta)) => s.push_str(&format!(
                ", growing {}/s{how}: full in ~{eta:.1} s",
                mib(g as u64)
            )),
            (Some(_), None) => s.push_str(&format!(", not growing{how}")),
            (None, _) => {}
        }
        if self.short > 0 {
            s.push_str(&format!(
                "; reclaim fell short {} of {} times",
                self.short, self.hits
            ));
        }
        if !self.top.is_empty() {
            let top: Vec<String> = self
                .top
                .iter()
                .map(|p| format!("{} (pid {}) {}", p.comm, p.pid, mib(p.rss_bytes)))
                .collect();
            s.push_str(&format!("; largest: {}", top.join(", ")));
        }
        s
    }
}

// Readings' rates are finite (a difference over a duration of at least 5 ms), never NaN: equality
// is reflexive, as a view compared for changes needs.
impl Eq for Reading {}
impl Eq for Pressure {}

/// "86 %", "87.5 %" from basis points.
pub fn percent(bp: u32) -> String {
    if bp.is_multiple_of(100) {
        format!("{} %", bp / 100)
    } else {
        format!("{:.1} %", f64::from(bp) / 100.0)
    }
}

/// "61.0 MiB", "512 KiB", "0 B".
pub fn mib(bytes: u64) -> String {
    match bytes {
        0 => "0 B".to_string(),
        b if b < 1 << 20 => format!("{} KiB", b >> 10),
        b => format!("{:.1} MiB", b as f64 / (1 << 20) as f64),
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Warn,
    Calm,
    Hold,
}

/// What a reading changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// A warning was raised (an Event is due).
    Raised,
    /// The warning was lowered.
    Lowered,
    /// The warning's growth was measured for the first time (the reading that raised it was
    /// its episode's first).
    Measured,
    /// Nothing a reader of the status sees but the figures.
    Same,
}

/// What a reader of the warnings was told last of one container instance (`observer watch
/// --pods`, which prints each warning and its end once).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Told {
    raises: u32,
    warning: bool,
}

/// What a reader told [`Told`] has not heard yet.
#[derive(Clone, Debug, PartialEq)]
pub enum News<'a> {
    /// A warning was raised, by this reading.
    Raised(&'a Reading),
    /// The warning ended at `at`; `last` is the latest reading.
    Ended {
        at: SystemTime,
        last: Option<&'a Reading>,
    },
}

/// A container instance's memory pressure: its warning, and the readings that raised one.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Pressure {
    /// Warned now (the MemoryPressure condition's True).
    pub warning: bool,
    /// Since when the state is what it is (`None` before the first reading).
    pub since: Option<SystemTime>,
    /// Limit hits the kernel reported for this instance.
    pub hits: u64,
    /// Warnings raised for this instance.
    pub raises: u32,
    /// The latest reading.
    pub last: Option<Reading>,
    /// The readings that raised a warning, oldest first (at most [`RAISED_KEPT`]).
    pub raised: Vec<Reading>,
    /// The latest reading that said Warn.
    last_warn: Option<SystemTime>,
    /// The warning standing was raised by a projection, and no reading since warned by the
    /// unreclaimable share alone: it is lowered once the growth stops.
    projected_only: bool,
    /// Each scope's latest crossing (container, pod: at most a few).
    crossings: Vec<CrossingPoint>,
}

impl Pressure {
    /// Folds in one reading; `growth` is measured here against the previous one.
    pub fn apply(&mut self, mut r: Reading) -> Change {
        self.hits += r.hits;
        if let Some(prev) = &self.last {
            let dt = r.time.duration_since(prev.time).unwrap_or_default();
            if dt >= MIN_INTERVAL && prev.scope == r.scope {
                let d = r.breakdown.unreclaimable() as f64 - prev.breakdown.unreclaimable() as f64;
                r.growth = Some(d / dt.as_secs_f64());
            }
        }
        self.estimate(&mut r);
        let verdict = r.verdict();
        let change = match verdict {
            Verdict::Warn => {
                self.last_warn = Some(r.time);
                let by_ratio = r.warns_by_ratio();
                if by_ratio {
                    self.projected_only = false;
                }
                if self.warning {
                    match self.raised.last_mut() {
                        Some(first) if first.growth.is_none() && r.growth.is_some() => {
                            first.growth = r.growth;
                            Change::Measured
                        }
                        _ => Change::Same,
                    }
                } else {
                    self.warning = true;
                    self.projected_only = !by_ratio;
                    self.since = Some(r.time);
                    self.raises += 1;
                    if self.raised.len() == RAISED_KEPT {
                        self.raised.remove(0);
                    }
                    self.raised.push(r.clone());
                    Change::Raised
                }
            }
            Verdict::Calm if self.warning && self.stood(r.time) => {
                self.warning = false;
                self.since = Some(r.time);
                Change::Lowered
            }
            // A projection that did not come true: the growth stopped short of the limit.
            Verdict::Hold
                if self.warning
                    && self.projected_only
                    && self.stood(r.time)
                    && r.eta().is_none_or(|t| t > HORIZON.as_secs_f64()) =>
            {
                self.warning = false;
                self.since = Some(r.time);
                Change::Lowered
            }
            _ => {
                self.since.get_or_insert(r.time);
                Change::Same
            }
        };
        self.last = Some(r);
        change
    }

    /// A crossing's time to full, from the same limit's previous crossing: the growth the
    /// reading then reports is the one between the two (no sample in between).
    fn estimate(&mut self, r: &mut Reading) {
        let Some(c) = &mut r.crossing else {
            return;
        };
        let unreclaimable = r.breakdown.unreclaimable();
        let at = self.crossings.iter().position(|p| p.scope == r.scope);
        if let Some(p) = at.map(|i| &self.crossings[i]) {
            let interval = r.time.duration_since(p.time).unwrap_or_default();
            if interval >= MIN_INTERVAL {
                let growth =
                    (unreclaimable as f64 - p.unreclaimable as f64) / interval.as_secs_f64();
                let left = r.limit_bytes.saturating_sub(unreclaimable);
                c.estimate = Some(Estimate {
                    from_bp: p.threshold_bp,
                    interval,
                    growth,
                    time_left: (growth > 0.0).then(|| left as f64 / growth),
                });
                r.growth = Some(growth);
            }
        }
        let point = CrossingPoint {
            scope: r.scope.clone(),
            time: r.time,
            threshold_bp: c.threshold_bp,
            unreclaimable,
        };
        match at {
            Some(i) => self.crossings[i] = point,
            None => self.crossings.push(point),
        }
    }

    fn stood(&self, now: SystemTime) -> bool {
        self.last_warn
            .is_none_or(|w| now.duration_since(w).unwrap_or_default() >= MIN_WARNING)
    }

    /// What changed since a reader was told `told` (updated to now): a warning raised since,
    /// and its end, in that order (both when it came and went between two looks).
    pub fn news(&self, told: &mut Told) -> Vec<News<'_>> {
        let mut news = Vec::new();
        let raised = self.raises > told.raises;
        if raised {
            news.extend(self.raised.last().map(News::Raised));
        }
        if (told.warning || raised) && !self.warning {
            news.push(News::Ended {
                at: self.since.unwrap_or(SystemTime::UNIX_EPOCH),
                last: self.last.as_ref(),
            });
        }
        *told = Told {
            raises: self.raises,
            warning: self.warning,
        };
        news
    }

    /// A warning up and no reading since `QUIET` before `now`: read again.
    pub fn recheck_due(&self, now: SystemTime) -> bool {
        self.warning
            && self
                .last
                .as_ref()
                .is_some_and(|r| now.duration_since(r.time).unwrap_or_default() >= QUIET)
    }
}

#[cfg(test)]
mod tests;
