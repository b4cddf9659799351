//! What a guest said, what it means, and the matrix.
//!
//! The guest's /init (init.sh) prints every step between marker lines on its second serial port:
//! `@@OBSERVER-VM BEGIN <step>`, the step's own output, `@@OBSERVER-VM END <step> rc=<n>`, and
//! `@@OBSERVER-VM DONE` once it is through. [`Parser`] turns that stream into a [`GuestRun`];
//! [`judge`] decides pass / clear refusal / failure for the cgroup mode the guest was booted with;
//! [`render_matrix`] prints the kernel × cgroup mode table the README carries.
use std::{collections::BTreeMap, fmt::Write as _, time::Duration};

pub(crate) const MARKER: &str = "@@OBSERVER-VM";

/// The cgroup setups a guest is booted with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, clap::ValueEnum)]
pub(crate) enum Mode {
    /// cgroup v2 only, every controller on it (memory.max, memory.oom.group are real).
    V2,
    /// v1 controllers beside a cgroup2 hierarchy at /sys/fs/cgroup/unified (systemd's hybrid).
    Hybrid,
    /// v1 hierarchies only: `observer check` must refuse, clearly.
    V1,
}

impl Mode {
    pub(crate) const ALL: [Mode; 3] = [Mode::V2, Mode::Hybrid, Mode::V1];

    /// The value of `observer.cgroup=` on the guest's command line.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Mode::V2 => "v2",
            Mode::Hybrid => "hybrid",
            Mode::V1 => "v1",
        }
    }

    fn column(self) -> &'static str {
        match self {
            Mode::V2 => "cgroup v2 only",
            Mode::Hybrid => "hybrid (v1 controllers + cgroup2)",
            Mode::V1 => "cgroup v1 only",
        }
    }

    /// The suites the guest runs in this mode (v1 only runs `observer check`: the suites need
    /// cgroup2 and would only repeat its refusal; the OOM suite's kills, a global OOM and a
    /// `memory.oom.group` kill, are cgroup v2's).
    pub(crate) fn suites(self) -> &'static [&'static str] {
        match self {
            Mode::V2 => &["kernel", "pleg", "oom", "pressure"],
            Mode::Hybrid => &["kernel", "pleg"],
            Mode::V1 => &[],
        }
    }
}

/// One step of the guest: its output and exit code.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Step {
    pub name: String,
    pub lines: Vec<String>,
    /// `None` until its END marker came.
    pub rc: Option<i32>,
}

/// Everything a guest reported.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct GuestRun {
    /// `uname -r` in the guest.
    pub release: Option<String>,
    /// `/proc/version` in the guest.
    pub version: Option<String>,
    pub steps: Vec<Step>,
    /// The guest reached the end of its script.
    pub done: bool,
}

impl GuestRun {
    pub(crate) fn step(&self, name: &str) -> Option<&Step> {
        self.steps.iter().find(|s| s.name == name)
    }
}

/// What a line of the guest's output was, for whoever prints it live.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Line<'a> {
    /// A step started.
    Begin(&'a str),
    /// A step ended with this exit code.
    End(&'a str, i32),
    /// Output of the step that is running.
    Output(&'a str),
    /// The guest is through.
    Done,
    /// Anything else (a marker of the guest's own: uname, kernel, cpus; or noise between steps).
    Other,
}

/// Feeds on the guest's output one line at a time.
#[derive(Default)]
pub(crate) struct Parser {
    run: GuestRun,
    current: Option<Step>,
}

impl Parser {
    pub(crate) fn feed<'a>(&mut self, raw: &'a str) -> Line<'a> {
        // The serial line may end in \r\n.
        let line = raw.trim_end_matches(['\r', '\n']);
        let Some(rest) = line.strip_prefix(MARKER).map(str::trim_start) else {
            return match &mut self.current {
                Some(step) => {
                    step.lines.push(line.to_string());
                    Line::Output(line)
                }
                None => Line::Other,
            };
        };
        let (word, arg) = rest.split_once(' ').unwrap_or((rest, ""));
        match word {
            "BEGIN" => {
                self.finish_current();
                self.current = Some(Step {
                    name: arg.trim().to_string(),
                    ..Default::default()
                });
                Line::Begin(arg.trim())
            }
            "END" => {
                // "END <step> rc=<n>"
                let (name, rc) = arg.rsplit_once(" rc=").unwrap_or((arg, ""));
                let rc = rc.trim().parse().unwrap_or(-1);
                match self.current.take() {
                    Some(mut step) if step.name == name.trim() => {
                        step.rc = Some(rc);
                        self.run.steps.push(step);
                    }
                    other => {
                        // An END without its BEGIN: keep what there was, and the END's code.
                        self.current = other;
                        self.finish_current();
                        self.run.steps.push(Step {
                            name: name.trim().to_string(),
                            lines: Vec::new(),
                            rc: Some(rc),
                        });
                    }
                }
                Line::End(name.trim(), rc)
            }
            "DONE" => {
                self.finish_current();
                self.run.done = true;
                Line::Done
            }
            "uname" => {
                self.run.release = Some(arg.trim().to_string());
                Line::Other
            }
            "kernel" => {
                self.run.version = Some(arg.trim().to_string());
                Line::Other
            }
            _ => Line::Other,
        }
    }

    fn finish_current(&mut self) {
        if let Some(step) = self.current.take() {
            self.run.steps.push(step);
        }
    }

    /// What the guest said, a step cut short included (its `rc` stays `None`).
    pub(crate) fn finish(mut self) -> GuestRun {
        self.finish_current();
        self.run
    }
}

/// libtest's closing line: `test result: ok. 12 passed; 0 failed; 0 ignored; ...`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct TestCounts {
    pub passed: u32,
    pub failed: u32,
    pub ignored: u32,
    /// Left out by a name filter (`--filter`).
    pub filtered: u32,
}

pub(crate) fn test_counts(lines: &[String]) -> Option<TestCounts> {
    let line = lines
        .iter()
        .rev()
        .find_map(|l| l.trim().strip_prefix("test result: "))?;
    let (_, counts) = line.split_once(". ")?;
    let mut c = TestCounts::default();
    for part in counts.split(';') {
        let mut words = part.split_whitespace();
        let (Some(n), Some(what)) = (words.next(), words.next()) else {
            continue;
        };
        let Ok(n) = n.parse() else { continue };
        match what {
            "passed" => c.passed = n,
            "failed" => c.failed = n,
            "ignored" => c.ignored = n,
            "filtered" => c.filtered = n,
            _ => {}
        }
    }
    Some(c)
}

/// `test some::name ... FAILED` lines.
pub(crate) fn failed_tests(lines: &[String]) -> Vec<String> {
    lines
        .iter()
        .filter_map(|l| {
            let rest = l.trim().strip_prefix("test ")?;
            rest.strip_suffix(" ... FAILED").map(str::to_string)
        })
        .collect()
}

/// How the guest ended, as the host saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Ended {
    /// qemu exited (the guest powered off, or panicked with `panic=-1 -no-reboot`).
    Exited,
    /// Still running at the deadline: killed.
    TimedOut(Duration),
}

/// The outcome of one guest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// `observer check` and every suite passed.
    Pass {
        tests: u32,
    },
    /// cgroup v1 only: `observer check` refused with its reason, as it must.
    Refused,
    Fail(String),
}

/// The words `observer check` uses to refuse a node without cgroup2 (observer-user/src/cli/check.rs).
pub(crate) const REFUSAL: &str = "cgroup v2 is required";

/// Decides what one guest's run means for `mode`. `panic` is the kernel's panic line from the
/// console log, if it has one.
pub(crate) fn judge(mode: Mode, ended: &Ended, run: &GuestRun, panic: Option<&str>) -> Verdict {
    if let Some(p) = panic {
        return Verdict::Fail(format!("kernel panic: {p}"));
    }
    let last = run.steps.last().map(|s| s.name.as_str()).unwrap_or("boot");
    if let Ended::TimedOut(after) = ended {
        return Verdict::Fail(format!(
            "timed out after {} s (last step: {last})",
            after.as_secs()
        ));
    }
    if !run.done {
        return Verdict::Fail(format!(
            "the guest stopped before the end of its script (last step: {last})"
        ));
    }
    match run.step("cgroups") {
        Some(s) if s.rc == Some(0) => {}
        Some(s) => {
            let why = s
                .lines
                .iter()
                .rev()
                .find_map(|l| l.strip_prefix("error: "))
                .or(s.lines.last().map(String::as_str))
                .unwrap_or("no output");
            return Verdict::Fail(format!("cgroup setup failed: {why}"));
        }
        None => return Verdict::Fail("no cgroup setup step".into()),
    }
    let Some(check) = run.step("check") else {
        return Verdict::Fail("`observer check` did not run".into());
    };
    let crashed = |s: &Step| {
        s.lines.iter().any(|l| l.contains("panicked at")) || s.rc.is_some_and(|rc| rc >= 101)
    };
    if mode == Mode::V1 {
        return match check.rc {
            _ if crashed(check) => Verdict::Fail(format!(
                "`observer check` crashed on cgroup v1 (rc {:?})",
                check.rc
            )),
            Some(0) => Verdict::Fail("`observer check` passed on a cgroup v1 only node".into()),
            Some(_) if check.lines.iter().any(|l| l.contains(REFUSAL)) => Verdict::Refused,
            _ => Verdict::Fail(format!(
                "`observer check` failed on cgroup v1 without saying \"{REFUSAL}\""
            )),
        };
    }
    if check.rc != Some(0) {
        let missing: Vec<&str> = check
            .lines
            .iter()
            .filter(|l| l.starts_with("MISSING"))
            .map(|l| l.as_str())
            .collect();
        return Verdict::Fail(format!(
            "`observer check` failed (rc {:?}): {}",
            check.rc,
            missing.join(" / ")
        ));
    }
    let mut tests = 0;
    for suite in mode.suites() {
        let Some(s) = run.step(suite) else {
            return Verdict::Fail(format!("the {suite} suite did not run"));
        };
        let counts = test_counts(&s.lines);
        let failed = failed_tests(&s.lines);
        match (s.rc, counts) {
            (Some(0), Some(c)) if c.failed == 0 && c.passed > 0 => tests += c.passed,
            // `--filter` matched nothing in this suite.
            (Some(0), Some(c)) if c.failed == 0 && c.filtered > 0 => {}
            (_, Some(c)) if c.passed == 0 && c.failed == 0 => {
                return Verdict::Fail(format!("the {suite} suite ran no test"))
            }
            _ if !failed.is_empty() => {
                return Verdict::Fail(format!("{suite}: {}", failed.join(", ")))
            }
            _ => {
                return Verdict::Fail(format!(
                    "the {suite} suite exited with {:?} and no test result",
                    s.rc
                ))
            }
        }
    }
    // Benchmarks asked for (`--bench`): their tables are the record; a failed one fails the guest.
    if let Some(b) = run
        .steps
        .iter()
        .find(|s| s.name.starts_with("bench-") && s.rc != Some(0))
    {
        return Verdict::Fail(format!("{} exited with {:?}", b.name, b.rc));
    }
    Verdict::Pass { tests }
}

/// What `observer check` found about the kernel's fallbacks, for the matrix's notes column.
pub(crate) fn kernel_notes(run: &GuestRun) -> Vec<String> {
    let mut notes = Vec::new();
    // "note: v1 memory not mountable (...)" from the cgroup setup.
    let unmountable: Vec<&str> = run
        .step("cgroups")
        .map(|s| s.lines.as_slice())
        .unwrap_or_default()
        .iter()
        .filter(|l| l.contains("not mountable"))
        .filter_map(|l| l.strip_prefix("note: v1 "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    if !unmountable.is_empty() {
        notes.push(format!(
            "no v1 {}: kernel built without their v1 support (they stay on cgroup2 in hybrid)",
            unmountable.join(", ")
        ));
    }
    let Some(check) = run.step("check") else {
        return notes;
    };
    for l in &check.lines {
        let mut words = l.split_whitespace();
        let (status, name) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
        if status == "ok" && name == "tp_btf/sched_process_exit" {
            let args: String = words.collect::<Vec<_>>().join(" ");
            // Where the probes were loaded (not on v1 only, which check refuses first), it says
            // where group_dead came from instead.
            let loaded = check
                .lines
                .iter()
                .any(|l| l.contains("load and attach probes"));
            if args.starts_with("1 ") && loaded {
                let hooked = check
                    .lines
                    .iter()
                    .any(|l| l.contains("from fentry/taskstats_exit"));
                notes.push(if hooked {
                    "exit tracepoint has no `group_dead`: taken from `fentry/taskstats_exit`"
                        .to_string()
                } else {
                    "exit tracepoint has no `group_dead`: `signal->live` fallback".to_string()
                });
            }
        }
        if status == "note" && l.contains("victim memory fields") && l.contains("absent") {
            notes.push("`mark_victim` carries only the pid: rss fields absent".to_string());
        }
    }
    notes
}

/// One row of the matrix: a kernel, and what each cgroup mode gave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Row {
    pub kernel: String,
    pub cells: BTreeMap<Mode, Cell>,
    pub notes: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Cell {
    Ran {
        verdict: Verdict,
        took: Duration,
    },
    /// Not booted, and why (shown as is).
    Text(String),
}

impl Cell {
    pub(crate) fn failed(&self) -> bool {
        matches!(
            self,
            Cell::Ran {
                verdict: Verdict::Fail(_),
                ..
            }
        )
    }

    fn render(&self) -> String {
        match self {
            Cell::Ran { verdict, took } => {
                let secs = took.as_secs();
                match verdict {
                    Verdict::Pass { tests } => format!("pass ({tests} tests, {secs} s)"),
                    Verdict::Refused => format!("clear refusal ({secs} s)"),
                    Verdict::Fail(why) => format!("**FAIL**: {} ({secs} s)", escape(why)),
                }
            }
            Cell::Text(t) => escape(t),
        }
    }
}

/// Markdown table cells cannot hold `|` nor line breaks.
fn escape(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

/// The kernel × cgroup mode table, in markdown, with only the modes that some row has.
pub(crate) fn render_matrix(rows: &[Row]) -> String {
    let modes: Vec<Mode> = Mode::ALL
        .into_iter()
        .filter(|m| rows.iter().any(|r| r.cells.contains_key(m)))
        .collect();
    let mut out = String::from("| kernel |");
    for m in &modes {
        let _ = write!(out, " {} |", m.column());
    }
    out.push_str(" notes |\n|---|");
    for _ in &modes {
        out.push_str("---|");
    }
    out.push_str("---|\n");
    for r in rows {
        let _ = write!(out, "| {} |", escape(&r.kernel));
        for m in &modes {
            let cell = r.cells.get(m).map(Cell::render).unwrap_or_default();
            let _ = write!(out, " {cell} |");
        }
        let _ = writeln!(out, " {} |", escape(&r.notes.join("; ")));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed_all(text: &str) -> GuestRun {
        let mut p = Parser::default();
        for l in text.lines() {
            p.feed(l);
        }
        p.finish()
    }

    const V2_PASS: &str = "\
noise before
@@OBSERVER-VM uname 6.1.0-57-amd64\r
@@OBSERVER-VM kernel Linux version 6.1.0-57-amd64 (debian-kernel@lists.debian.org) #1 SMP PREEMPT_DYNAMIC Debian 6.1.192-3
@@OBSERVER-VM BEGIN cgroups
0 0 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate
@@OBSERVER-VM END cgroups rc=0
@@OBSERVER-VM BEGIN check
ok       privileges                         root
ok       tp_btf/sched_process_exit          1 arguments
ok       tracepoint oom/mark_victim         present
ok       load and attach probes             6 programs attached, then detached
note       exit group_dead                  not a tracepoint argument here: taken from fentry/taskstats_exit
note       victim memory fields             absent (Linux < 6.8): OOM kills are reported without rss figures
all requirements met
@@OBSERVER-VM END check rc=0
@@OBSERVER-VM BEGIN kernel
running 2 tests
test a ... ok
test b ... ok

test result: ok. 2 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 1.50s
@@OBSERVER-VM END kernel rc=0
@@OBSERVER-VM BEGIN pleg
test result: ok. 3 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 2.00s
@@OBSERVER-VM END pleg rc=0
@@OBSERVER-VM BEGIN oom
running 2 tests
Event (global OOM): the node ran out of memory (no cgroup limit was hit): the largest processes: oom-victim 1.8 GiB
test a_global_oom_is_told_as_the_nodes_memory ... ok
test a_group_kill_is_told_with_the_processes_killed_together ... ok

test result: ok. 2 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 40.00s
@@OBSERVER-VM END oom rc=0
@@OBSERVER-VM BEGIN pressure
test a_leak_is_warned_before_its_kill ... ok
test a_leak_under_a_pod_level_limit_is_warned_before_its_kill ... ok
test bursts_under_the_limit_are_never_warned ... ok
test result: ok. 3 passed; 0 failed; 0 ignored; 0 measured; 1 filtered out; finished in 50.00s
@@OBSERVER-VM END pressure rc=0
@@OBSERVER-VM DONE
";

    #[test]
    fn parses_steps_markers_and_identity() {
        let run = feed_all(V2_PASS);
        assert!(run.done);
        assert_eq!(run.release.as_deref(), Some("6.1.0-57-amd64"));
        assert!(run
            .version
            .as_deref()
            .unwrap()
            .ends_with("Debian 6.1.192-3"));
        let names: Vec<_> = run.steps.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            ["cgroups", "check", "kernel", "pleg", "oom", "pressure"]
        );
        assert!(run.steps.iter().all(|s| s.rc == Some(0)));
        assert_eq!(run.step("check").unwrap().lines.len(), 7);
        assert_eq!(
            test_counts(&run.step("pleg").unwrap().lines),
            Some(TestCounts {
                passed: 3,
                failed: 0,
                ignored: 1,
                filtered: 0,
            })
        );
    }

    #[test]
    fn live_lines_say_what_they_are() {
        let mut p = Parser::default();
        assert_eq!(p.feed("booting"), Line::Other);
        assert_eq!(p.feed("@@OBSERVER-VM BEGIN kernel"), Line::Begin("kernel"));
        assert_eq!(p.feed("test a ... ok\r\n"), Line::Output("test a ... ok"));
        assert_eq!(
            p.feed("@@OBSERVER-VM END kernel rc=101"),
            Line::End("kernel", 101)
        );
        assert_eq!(p.feed("@@OBSERVER-VM DONE"), Line::Done);
        let run = p.finish();
        assert_eq!(run.step("kernel").unwrap().rc, Some(101));
    }

    #[test]
    fn a_step_cut_short_has_no_rc() {
        let run = feed_all("@@OBSERVER-VM BEGIN kernel\ntest a ... ");
        assert!(!run.done);
        assert_eq!(run.step("kernel").unwrap().rc, None);
        assert_eq!(run.step("kernel").unwrap().lines, ["test a ... "]);
    }

    #[test]
    fn a_failed_benchmark_fails_the_guest() {
        let mut run = feed_all(V2_PASS);
        run.steps.push(Step {
            name: "bench-pressure".into(),
            lines: vec!["| leak into 64 MiB | ... |".into()],
            rc: Some(0),
        });
        assert_eq!(
            judge(Mode::V2, &Ended::Exited, &run, None),
            Verdict::Pass { tests: 10 }
        );
        run.steps.last_mut().unwrap().rc = Some(101);
        assert_eq!(
            judge(Mode::V2, &Ended::Exited, &run, None),
            Verdict::Fail("bench-pressure exited with Some(101)".into())
        );
    }

    #[test]
    fn v2_pass_counts_every_suite() {
        let run = feed_all(V2_PASS);
        assert_eq!(
            judge(Mode::V2, &Ended::Exited, &run, None),
            Verdict::Pass { tests: 10 }
        );
        // The OOM suite is cgroup v2's: a v2 guest without it fails, a hybrid one does not
        // run it.
        let mut without = run.clone();
        without.steps.retain(|s| s.name != "oom");
        assert_eq!(
            judge(Mode::V2, &Ended::Exited, &without, None),
            Verdict::Fail("the oom suite did not run".into())
        );
        assert_eq!(
            judge(Mode::Hybrid, &Ended::Exited, &without, None),
            Verdict::Pass { tests: 5 }
        );
        assert_eq!(
            kernel_notes(&run),
            [
                "exit tracepoint has no `group_dead`: taken from `fentry/taskstats_exit`",
                "`mark_victim` carries only the pid: rss fields absent"
            ]
        );
    }

    #[test]
    fn no_group_dead_note_where_the_probes_were_not_loaded() {
        let run = v1("ok       tp_btf/sched_process_exit          1 arguments\nMISSING  cgroup mode  v1 only", 1);
        assert!(kernel_notes(&run).is_empty(), "{:?}", kernel_notes(&run));
        let fallback = V2_PASS.replace(
            "note       exit group_dead                  not a tracepoint argument here: taken from fentry/taskstats_exit\n",
            "",
        );
        assert_eq!(
            kernel_notes(&feed_all(&fallback))[0],
            "exit tracepoint has no `group_dead`: `signal->live` fallback"
        );
    }

    #[test]
    fn a_failed_test_is_named() {
        let text = V2_PASS
            .replace("test b ... ok", "test b ... FAILED")
            .replace(
                "test result: ok. 2 passed; 0 failed",
                "test result: FAILED. 1 passed; 1 failed",
            )
            .replace("END kernel rc=0", "END kernel rc=101");
        let v = judge(Mode::V2, &Ended::Exited, &feed_all(&text), None);
        assert_eq!(v, Verdict::Fail("kernel: b".into()));
    }

    #[test]
    fn a_suite_that_ran_nothing_fails() {
        let text = V2_PASS.replace(
            "3 passed; 0 failed; 1 ignored",
            "0 passed; 0 failed; 1 ignored",
        );
        let v = judge(Mode::Hybrid, &Ended::Exited, &feed_all(&text), None);
        assert_eq!(v, Verdict::Fail("the pleg suite ran no test".into()));
        // Unless a name filter left its tests out.
        let text = V2_PASS.replace(
            "3 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out",
            "0 passed; 0 failed; 0 ignored; 0 measured; 7 filtered out",
        );
        let v = judge(Mode::Hybrid, &Ended::Exited, &feed_all(&text), None);
        assert_eq!(v, Verdict::Pass { tests: 2 });
    }

    #[test]
    fn missing_suite_timeout_hang_and_panic_fail() {
        let cut = V2_PASS.split("@@OBSERVER-VM BEGIN pleg").next().unwrap();
        let run = feed_all(cut);
        assert!(
            matches!(judge(Mode::V2, &Ended::Exited, &run, None), Verdict::Fail(w) if w.contains("before the end") && w.contains("kernel"))
        );
        assert!(matches!(
            judge(Mode::V2, &Ended::TimedOut(Duration::from_secs(900)), &run, None),
            Verdict::Fail(w) if w.starts_with("timed out after 900 s")
        ));
        let full = feed_all(V2_PASS);
        assert!(matches!(
            judge(Mode::V2, &Ended::Exited, &full, Some("Kernel panic - not syncing: Attempted to kill init!")),
            Verdict::Fail(w) if w.contains("Attempted to kill init")
        ));
        let no_pleg = V2_PASS
            .replace("BEGIN pleg", "BEGIN other")
            .replace("END pleg", "END other");
        assert_eq!(
            judge(Mode::V2, &Ended::Exited, &feed_all(&no_pleg), None),
            Verdict::Fail("the pleg suite did not run".into())
        );
    }

    #[test]
    fn v2_check_failure_quotes_what_is_missing() {
        let text = V2_PASS
            .replace(
                "all requirements met",
                "MISSING  load and attach probes  verifier said no",
            )
            .replace("END check rc=0", "END check rc=1");
        assert!(matches!(
            judge(Mode::V2, &Ended::Exited, &feed_all(&text), None),
            Verdict::Fail(w) if w.contains("verifier said no")
        ));
    }

    fn v1(check_lines: &str, rc: i32) -> GuestRun {
        feed_all(&format!(
            "@@OBSERVER-VM BEGIN cgroups\n@@OBSERVER-VM END cgroups rc=0\n@@OBSERVER-VM BEGIN check\n{check_lines}\n@@OBSERVER-VM END check rc={rc}\n@@OBSERVER-VM DONE\n"
        ))
    }

    #[test]
    fn v1_must_refuse_clearly_and_not_crash() {
        let refusal = "MISSING  cgroup mode   v1 only: cgroup v2 is required ...";
        assert_eq!(
            judge(Mode::V1, &Ended::Exited, &v1(refusal, 1), None),
            Verdict::Refused
        );
        assert!(matches!(
            judge(Mode::V1, &Ended::Exited, &v1("all requirements met", 0), None),
            Verdict::Fail(w) if w.contains("passed")
        ));
        assert!(matches!(
            judge(Mode::V1, &Ended::Exited, &v1("MISSING cgroup mode v1 only", 1), None),
            Verdict::Fail(w) if w.contains("without saying")
        ));
        let crash = format!("{refusal}\nthread 'main' panicked at src/x.rs:1:1");
        assert!(matches!(
            judge(Mode::V1, &Ended::Exited, &v1(&crash, 101), None),
            Verdict::Fail(w) if w.contains("crashed")
        ));
        // The suites are not expected on v1.
        assert!(Mode::V1.suites().is_empty());
    }

    #[test]
    fn failed_cgroup_setup_fails_the_guest() {
        let run = feed_all("@@OBSERVER-VM BEGIN cgroups\nerror: cgroup2 child has no memory.oom.group\n0 0 0:1 / /sys/fs/cgroup - cgroup2\n@@OBSERVER-VM END cgroups rc=1\n@@OBSERVER-VM DONE\n");
        assert_eq!(
            judge(Mode::V2, &Ended::Exited, &run, None),
            Verdict::Fail("cgroup setup failed: cgroup2 child has no memory.oom.group".into())
        );
        let bare = feed_all("@@OBSERVER-VM BEGIN cgroups\nmount: failed\n@@OBSERVER-VM END cgroups rc=1\n@@OBSERVER-VM DONE\n");
        assert_eq!(
            judge(Mode::V1, &Ended::Exited, &bare, None),
            Verdict::Fail("cgroup setup failed: mount: failed".into())
        );
    }

    #[test]
    fn unmountable_v1_controllers_are_noted() {
        let run = feed_all("@@OBSERVER-VM BEGIN cgroups\nnote: v1 cpuset not mountable (kernel built without its v1 support)\nnote: v1 memory not mountable (kernel built without its v1 support)\n@@OBSERVER-VM END cgroups rc=0\n");
        assert_eq!(
            kernel_notes(&run),
            ["no v1 cpuset, memory: kernel built without their v1 support (they stay on cgroup2 in hybrid)"]
        );
    }

    #[test]
    fn matrix_has_a_column_per_mode_seen_and_escapes_cells() {
        let secs = Duration::from_secs;
        let rows = vec![
            Row {
                kernel: "6.1.0-57-amd64 (Debian 6.1.192-3, generic)".into(),
                cells: BTreeMap::from([
                    (
                        Mode::V2,
                        Cell::Ran {
                            verdict: Verdict::Pass { tests: 18 },
                            took: secs(95),
                        },
                    ),
                    (
                        Mode::V1,
                        Cell::Ran {
                            verdict: Verdict::Refused,
                            took: secs(9),
                        },
                    ),
                ]),
                notes: vec!["a".into(), "b".into()],
            },
            Row {
                kernel: "6.18.44 (host)".into(),
                cells: BTreeMap::from([
                    (Mode::V2, Cell::Text("not bootable | no image".into())),
                    (
                        Mode::V1,
                        Cell::Ran {
                            verdict: Verdict::Fail("x\ny".into()),
                            took: secs(1),
                        },
                    ),
                ]),
                notes: vec![],
            },
        ];
        let md = render_matrix(&rows);
        let lines: Vec<&str> = md.lines().collect();
        assert_eq!(
            lines,
            [
                "| kernel | cgroup v2 only | cgroup v1 only | notes |",
                "|---|---|---|---|",
                "| 6.1.0-57-amd64 (Debian 6.1.192-3, generic) | pass (18 tests, 95 s) | clear refusal (9 s) | a; b |",
                "| 6.18.44 (host) | not bootable \\| no image | **FAIL**: x y (1 s) |  |",
            ]
        );
        assert!(rows[1].cells[&Mode::V1].failed());
        assert!(!rows[0].cells[&Mode::V1].failed());
    }

    #[test]
    fn matrix_keeps_mode_order_and_blank_cells() {
        let rows2 = vec![
            Row {
                kernel: "k".into(),
                cells: BTreeMap::from([(Mode::Hybrid, Cell::Text("h".into()))]),
                notes: vec![],
            },
            Row {
                kernel: "k2".into(),
                cells: BTreeMap::from([(Mode::V2, Cell::Text("v".into()))]),
                notes: vec![],
            },
        ];
        let md = render_matrix(&rows2);
        assert!(md.starts_with(
            "| kernel | cgroup v2 only | hybrid (v1 controllers + cgroup2) | notes |"
        ));
        assert!(md.contains("| k |  | h |  |"), "{md}");
    }
}
