//! The `observer` binary as a user runs it: arguments, errors, and `watch --format json` fields.
#![allow(unused_crate_dependencies)] // a test/bench/bin target sees its package's whole dependency list
use std::{
    io::{BufRead, BufReader},
    process::{Command, Stdio},
    sync::mpsc,
    time::Duration,
};

use observer_tests::{kernel::TestCgroup, observer_bin, require_root as root};

#[test]
fn help_lists_the_commands() {
    let out = Command::new(observer_bin()).arg("--help").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    for cmd in ["watch", "check", "status"] {
        assert!(text.contains(cmd), "{text}");
    }
}

#[test]
fn check_passes_on_this_machine() {
    if !root() {
        return;
    }
    let out = Command::new(observer_bin()).arg("check").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    for row in [
        "privileges",
        "kernel BTF",
        "tp_btf/sched_process_exit",
        "oom/mark_victim",
        "cgroup mode",
        "ring buffer",
        "load and attach",
    ] {
        assert!(
            text.lines().any(|l| l.starts_with("ok") && l.contains(row)),
            "{row}: {text}"
        );
    }
    // Which hook each memory probe got on this kernel, named (tests/tests/kernel.rs requires
    // one where the kernel has it).
    for (probe, hooks) in [
        (
            "memory limit hits",
            [
                "fexit/try_to_free_mem_cgroup_pages",
                "tracepoint/vmscan/",
                "none (",
            ],
        ),
        (
            "memory limit crossings",
            [
                "fexit/try_charge_memcg",
                "raw_tp/mod_memcg_lruvec_state",
                "none (",
            ],
        ),
    ] {
        assert!(
            text.lines().any(|l| l.starts_with("note")
                && l.contains(probe)
                && hooks.iter().any(|h| l.contains(h))),
            "{probe}: {text}"
        );
    }
}

#[test]
fn a_missing_cgroup_root_is_a_clear_error() {
    if !root() {
        return;
    }
    let out = Command::new(observer_bin())
        .args(["watch", "--cgroup-root", "/no/such/cgroup"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("/no/such/cgroup") && err.contains("does not exist"),
        "{err}"
    );
}

/// Run as nobody (setpriv drops every capability): the error says what is missing.
#[test]
fn unprivileged_watch_says_it_needs_root() {
    if !root() {
        return;
    }
    let out = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
            observer_bin().to_str().unwrap(),
            "watch",
            "--all",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("not privileged") && err.contains("root"),
        "{err}"
    );
}

/// The loader accepts CAP_BPF + CAP_PERFMON instead of root; `check` says so too.
#[test]
fn check_accepts_bpf_and_perfmon_without_root() {
    if !root() {
        return;
    }
    let out = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all,+bpf,+perfmon",
            "--ambient-caps=-all,+bpf,+perfmon",
            observer_bin().to_str().unwrap(),
            "check",
            "--no-load",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines().any(|l| l.starts_with("ok")
            && l.contains("privileges")
            && l.contains("CAP_BPF + CAP_PERFMON")),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn status_without_a_runtime_says_so() {
    if !root() {
        return;
    }
    let out = Command::new(observer_bin())
        .args(["status", "--cri-endpoint", "/tmp/observer-no-such.sock"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("observer-no-such.sock"), "{err}");
}

/// `-l` is evaluated by the API server: without `--kubeconfig` it is refused before anything
/// starts, naming what it needs.
#[test]
fn status_selector_needs_the_api() {
    let out = Command::new(observer_bin())
        .args(["status", "-l", "app=web"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--kubeconfig"), "{err}");
}

/// `observer watch --format json` on `cg`, stdout and stderr piped.
fn watch_json(cg: &TestCgroup) -> std::process::Child {
    Command::new(observer_bin())
        .args(["watch", "--format", "json", "--cgroup-root", &cg.rel])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The JSON field names are an interface: an exit 42 inside the watched cgroup, read back.
#[test]
fn watch_json_reports_an_exit_with_its_fields() {
    if !root() {
        return;
    }
    let cg = TestCgroup::new("cli").unwrap();
    let mut watch = watch_json(&cg);
    let mut stderr = BufReader::new(watch.stderr.take().unwrap());
    // Wait until it watches (it logs once attached).
    let mut line = String::new();
    while stderr.read_line(&mut line).unwrap() > 0 && !line.contains("watching;") {
        line.clear();
    }
    let status = cg
        .spawn(std::path::Path::new("/bin/sh"), &["-c", "exit 42"])
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(status.code(), Some(42));
    // Lines are read on a thread of their own, so the wait for the exit line has a deadline.
    let out = BufReader::new(watch.stdout.take().unwrap());
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in out.lines().map_while(Result::ok) {
            let v: serde_json::Value =
                serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
            if v["type"] == "exit" && v["exit_code"] == 42 && tx.send(v).is_err() {
                return;
            }
        }
    });
    let exit = rx.recv_timeout(Duration::from_secs(10));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(watch.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let done = watch.wait().unwrap();
    assert!(done.success(), "SIGTERM is a clean exit");
    let mut tail = String::new();
    let _ = std::io::Read::read_to_string(&mut stderr, &mut tail);
    assert!(
        tail.contains("records dropped"),
        "reports the drop count on exit: {tail}"
    );

    let exit = exit.expect("exit event within 10 s");
    for field in [
        "type",
        "time",
        "pid",
        "tgid",
        "ppid",
        "comm",
        "cgroup_id",
        "cgroup_path",
        "exit_code",
        "signal",
        "core_dumped",
        "group_dead",
    ] {
        assert!(exit.get(field).is_some(), "{field} missing: {exit}");
    }
    assert_eq!(exit["cgroup_path"], cg.rel.as_str());
    assert_eq!(exit["signal"], serde_json::Value::Null);
    assert_eq!(exit["core_dumped"], false);
    assert_eq!(exit["group_dead"], true);
    assert_eq!(exit["comm"], "sh");
    assert!(time::OffsetDateTime::parse(
        exit["time"].as_str().unwrap(),
        &time::format_description::well_known::Rfc3339
    )
    .is_ok());
}

/// A reader of stdout that stops reading costs lines, counted, never the watch: its reader
/// thread keeps going (the drop is said while it happens), SIGTERM still stops it at once, and
/// what reached stdout is whole lines. A watch that wrote stdout blocking hung here in write(2).
#[test]
fn an_unread_stdout_costs_lines_not_the_watch() {
    if !root() {
        return;
    }
    let cg = TestCgroup::new("cli-stall").unwrap();
    let mut watch = watch_json(&cg);
    // stderr on a thread of its own: each line to the channel.
    let (tx, err_lines) = mpsc::channel::<String>();
    let stderr = BufReader::new(watch.stderr.take().unwrap());
    std::thread::spawn(move || {
        for line in stderr.lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let wait_for = |what: &str, timeout: Duration| -> Vec<String> {
        let deadline = std::time::Instant::now() + timeout;
        let mut seen = Vec::new();
        while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
            match err_lines.recv_timeout(left) {
                Ok(l) if l.contains(what) => {
                    seen.push(l);
                    return seen;
                }
                Ok(l) => seen.push(l),
                Err(_) => break,
            }
        }
        panic!("no {what:?} on stderr within {timeout:?}: {seen:#?}");
    };
    wait_for("watching;", Duration::from_secs(20));
    // 30,000 exits, some 8 MB of JSON: past the pipe's 64 KiB and the watch's 4 MiB.
    let spins = 30_000;
    let status = cg
        .spawn(
            &observer_tests::kernel::workload(),
            &["spin", &spins.to_string()],
        )
        .unwrap()
        .wait()
        .unwrap();
    assert!(status.success());
    wait_for("stdout is not being read", Duration::from_secs(20));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(watch.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let summary = wait_for("observer watch: stopped", Duration::from_secs(10));
    let summary = summary.last().unwrap();
    let done =
        observer_tests::wait::poll_until(Duration::from_secs(10), || watch.try_wait().unwrap())
            .expect("the watch did not exit within 10 s of SIGTERM");
    assert!(done.success(), "{summary}");
    let count = |what: &str| -> u64 {
        summary
            .split([';', ','])
            .find_map(|part| part.trim().strip_suffix(what))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {what:?} count: {summary}"))
    };
    let written = count("events written");
    let dropped = count("lines dropped (stdout not read)");
    assert!(dropped > 0, "{summary}");
    // The reader kept reading with stdout full: a blocked one stops near the pipe's 64 KiB
    // (some 250 lines) and the kernel drops the rest.
    assert!(
        written >= spins * 9 / 10,
        "only {written} of {spins} exits read from the kernel: {summary}"
    );
    let out = BufReader::new(watch.stdout.take().unwrap());
    let mut read = 0;
    for line in out.lines().map_while(Result::ok) {
        serde_json::from_str::<serde_json::Value>(&line)
            .unwrap_or_else(|e| panic!("a cut line ({e}): {line}"));
        read += 1;
    }
    assert!(read > 0);
    // Every line the watch made was read here or counted as dropped.
    assert_eq!(read + dropped, written, "{summary}");
}
