//! The `observer` binary as a user runs it: arguments, errors, and `watch --format json` fields.
use std::{
    io::{BufRead, BufReader},
    path::PathBuf,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

const BIN: &str = env!("CARGO_BIN_EXE_observer");

fn root() -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "CI=true: these tests must run as root"
    );
    eprintln!("SKIPPED: needs root");
    false
}

#[test]
fn help_lists_the_commands() {
    let out = Command::new(BIN).arg("--help").output().unwrap();
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
    let out = Command::new(BIN).arg("check").output().unwrap();
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
}

#[test]
fn a_missing_cgroup_root_is_a_clear_error() {
    if !root() {
        return;
    }
    let out = Command::new(BIN)
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
            BIN,
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

#[test]
fn status_without_a_runtime_says_so() {
    if !root() {
        return;
    }
    let out = Command::new(BIN)
        .args(["status", "--cri-endpoint", "/tmp/observer-no-such.sock"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("observer-no-such.sock"), "{err}");
}

/// The JSON field names are an interface: an exit 42 inside the watched cgroup, read back.
#[test]
fn watch_json_reports_an_exit_with_its_fields() {
    if !root() {
        return;
    }
    let unified = ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.join("cgroup.procs").exists() && p.join("cgroup.controllers").exists())
        .expect("cgroup2 mount");
    let rel = format!("/observer-cli-{}", std::process::id());
    let dir = unified.join(&rel[1..]);
    std::fs::create_dir(&dir).unwrap();
    let _cleanup = Rmdir(dir.clone());
    let mut watch = Command::new(BIN)
        .args(["watch", "--format", "json", "--cgroup-root", &rel])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(watch.stderr.take().unwrap());
    // Wait until it watches (it logs once attached).
    let mut line = String::new();
    while stderr.read_line(&mut line).unwrap() > 0 && !line.contains("watching;") {
        line.clear();
    }
    let procs = dir.join("cgroup.procs");
    let status = Command::new("/bin/sh")
        .arg("-c")
        .arg(format!(
            "echo $$ > {}; exec /bin/sh -c 'exit 42'",
            procs.display()
        ))
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(42));
    let mut out = BufReader::new(watch.stdout.take().unwrap());
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut exit = None;
    let mut line = String::new();
    while Instant::now() < deadline && exit.is_none() {
        line.clear();
        if out.read_line(&mut line).unwrap() == 0 {
            break;
        }
        let v: serde_json::Value =
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        if v["type"] == "exit" && v["exit_code"] == 42 {
            exit = Some(v);
        }
    }
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

    let exit = exit.expect("exit event");
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
    assert_eq!(exit["cgroup_path"], rel.as_str());
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

struct Rmdir(PathBuf);

impl Drop for Rmdir {
    fn drop(&mut self) {
        for _ in 0..50 {
            if std::fs::remove_dir(&self.0).is_ok() || !self.0.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
