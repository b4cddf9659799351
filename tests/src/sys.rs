//! Process, mount and cgroup housekeeping for the harness's teardown (the mount and cgroup
//! parts, and finding processes by command line, shared with the test cluster's `down`:
//! observer_cluster::host).
pub(crate) use observer_cluster::host::{
    destroy_cgroup_subtree, pids_with_cmdline, start_time, unmount_all,
};
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

pub(crate) fn alive(pid: u32, started: u64) -> bool {
    start_time(pid) == Some(started)
}

pub(crate) fn signal(pid: u32, sig: Signal) {
    let _ = kill(Pid::from_raw(pid as i32), sig);
}

/// Waits until `pid` is gone (or a zombie nobody reaps), up to `timeout`.
pub(crate) fn wait_gone(pid: u32, timeout: Duration) -> bool {
    crate::wait::eventually(timeout, || {
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| {
                s.rfind(')')
                    .and_then(|i| s[i + 1..].split_whitespace().next().map(str::to_string))
            });
        matches!(state.as_deref(), None | Some("Z") | Some("X"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_time_identifies_this_process() {
        let me = std::process::id();
        let t = start_time(me).unwrap();
        assert!(alive(me, t));
        assert!(!alive(me, t + 1));
    }

    #[test]
    fn finds_children_by_cmdline() {
        let marker = format!("observer-test-marker-{}", std::process::id());
        // `read` is a builtin: the shell neither forks nor execs, so exactly one process matches.
        let mut child = std::process::Command::new("sh")
            .args(["-c", "read x", &marker])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // spawn() can return before the new argv is readable in /proc (mid-exec).
        let found = crate::wait::poll_until(Duration::from_secs(5), || {
            Some(pids_with_cmdline(&marker)).filter(|f| !f.is_empty())
        });
        assert_eq!(found, Some(vec![child.id()]));
        signal(child.id(), Signal::SIGKILL);
        child.wait().unwrap();
        assert!(pids_with_cmdline(&marker).is_empty());
    }
}
