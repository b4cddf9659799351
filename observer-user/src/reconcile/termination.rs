//! A dead container's own termination message, read from the node's files as kubelet reads it
//! (`getTerminationMessage`, `readLastStringFromContainerLogs`), so that the agent's status holds
//! it without waiting for kubelet's.
//!
//! Everything needed is in the runtime's status of the container: kubelet's annotations name the
//! path inside the container and the policy, the mount with that container path names the file on
//! the node (`<kubelet root>/pods/<uid>/containers/<name>/<random>`, which kubelet creates and
//! mounts), and the log path is the runtime's (`/var/log/pods/...`).
//!
//! The files' contents are the container's, so untrusted: read without following links, regular
//! files only, never more than kubelet keeps. A file the agent cannot see (run in a pod without
//! those host directories mounted, or refused) is [`TerminationMessage::Unreadable`]: the
//! status then keeps kubelet's message from the API rather than saying there is none.
use std::{
    io::{self, Read, Seek, SeekFrom},
    os::unix::fs::OpenOptionsExt,
    path::Path,
};

use k8s_cri::v1 as api;

/// kubelet's `MaxContainerTerminationMessageLength`: the file's last 4 KiB.
pub const MAX_FILE: u64 = 4096;
/// kubelet's `MaxContainerTerminationMessageLogLines` and `...LogLength`: the last 80 lines of
/// the log, of which the last 2 KiB.
pub const MAX_LOG_LINES: usize = 80;
pub const MAX_LOG_BYTES: usize = 2048;
/// How much of the log's end is read: 80 lines of less than 2 KiB of content fit many times over
/// (a line's overhead is its timestamp, stream and tag, some 45 bytes).
const LOG_WINDOW: u64 = 64 * 1024;

const PATH_ANNOTATION: &str = "io.kubernetes.container.terminationMessagePath";
const POLICY_ANNOTATION: &str = "io.kubernetes.container.terminationMessagePolicy";
const FALLBACK_TO_LOGS: &str = "FallbackToLogsOnError";

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TerminationMessage {
    /// What kubelet will read: the file's end, or the log's tail; empty when the container left
    /// none.
    Read(String),
    /// The agent cannot see the file kubelet reads (why): kubelet's copy is the one to trust.
    Unreadable(String),
}

/// The termination message of an exited container; `None` while it has not exited.
pub fn read(s: &api::ContainerStatus) -> Option<TerminationMessage> {
    if s.state != api::ContainerState::ContainerExited as i32 {
        return None;
    }
    let path = s.annotations.get(PATH_ANNOTATION).map(String::as_str);
    // A container that could not even start has no logs (kubelet's rule).
    let fallback = s.annotations.get(POLICY_ANNOTATION).map(String::as_str)
        == Some(FALLBACK_TO_LOGS)
        && s.exit_code != 0
        && s.reason != "ContainerCannotRun";
    let mount = path
        .filter(|p| !p.is_empty())
        .and_then(|p| s.mounts.iter().find(|m| m.container_path == p));
    let from_file = match mount {
        Some(m) => match file_end(Path::new(&m.host_path)) {
            Ok(Some(data)) => data,
            Ok(None) => String::new(),
            Err(why) => return Some(TerminationMessage::Unreadable(why)),
        },
        None => String::new(),
    };
    if !(fallback && from_file.is_empty()) {
        return Some(TerminationMessage::Read(from_file));
    }
    Some(match log_tail(Path::new(&s.log_path)) {
        Ok(tail) => TerminationMessage::Read(tail),
        Err(why) => TerminationMessage::Unreadable(why),
    })
}

/// kubelet's message for the container: the runtime's, then `: ` and its own.
pub fn joined(runtime: Option<&str>, own: &str) -> Option<String> {
    match (runtime.filter(|r| !r.is_empty()), own.is_empty()) {
        (Some(r), false) => Some(format!("{r}: {own}")),
        (Some(r), true) => Some(r.to_string()),
        (None, false) => Some(own.to_string()),
        (None, true) => None,
    }
}

/// The last `max` bytes of a regular file, opened without following a link and without
/// blocking on a FIFO.
fn read_end(path: &Path, max: u64) -> io::Result<Vec<u8>> {
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    let meta = f.metadata()?;
    if !meta.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    let len = meta.len();
    f.seek(SeekFrom::Start(len.saturating_sub(max)))?;
    let mut out = Vec::with_capacity(len.min(max) as usize);
    f.take(max).read_to_end(&mut out)?;
    Ok(out)
}

/// The termination-log file's end; `None` when there is no such file (kubelet's "no message"),
/// which is only believed where its directory is there to be seen.
fn file_end(path: &Path) -> Result<Option<String>, String> {
    if !path.is_absolute() {
        return Err(format!("{} is not an absolute path", path.display()));
    }
    match read_end(path, MAX_FILE) {
        Ok(data) => Ok(Some(String::from_utf8_lossy(&data).into_owned())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => match path.parent() {
            Some(dir) if dir.is_dir() => Ok(None),
            _ => Err(format!(
                "{} is not on this filesystem (kubelet's pods directory not mounted)",
                path.display()
            )),
        },
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

/// The log's last [`MAX_LOG_LINES`] lines (CRI format), their contents joined, of which the last
/// [`MAX_LOG_BYTES`].
fn log_tail(path: &Path) -> Result<String, String> {
    if path.as_os_str().is_empty() || !path.is_absolute() {
        return Err(format!(
            "the runtime's log path {:?} is not absolute",
            path.display()
        ));
    }
    let data = read_end(path, LOG_WINDOW).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(tail_of_cri_log(&data))
}

/// The contents of a CRI log's last lines: `<time> <stream> <P|F>[:tags] <content>`, a partial
/// line (`P`) continued by the next, a full one (`F`) ending with a newline. Malformed lines are
/// skipped, as kubelet skips them.
pub(crate) fn tail_of_cri_log(data: &[u8]) -> String {
    let mut lines: Vec<&[u8]> = data.split(|b| *b == b'\n').collect();
    // The text after the last newline is a line still being written (or nothing).
    lines.pop();
    let start = lines.len().saturating_sub(MAX_LOG_LINES);
    let mut out = Vec::new();
    for line in &lines[start..] {
        let mut fields = line.splitn(4, |b| *b == b' ');
        let (Some(_time), Some(_stream), Some(tag), content) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let full = match tag.split(|b| *b == b':').next() {
            Some(b"F") => true,
            Some(b"P") => false,
            _ => continue,
        };
        out.extend_from_slice(content.unwrap_or_default());
        if full {
            out.push(b'\n');
        }
    }
    let cut = out.len().saturating_sub(MAX_LOG_BYTES);
    String::from_utf8_lossy(&out[cut..]).into_owned()
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn exited(
        dir: &Path,
        policy: &str,
        exit_code: i32,
        file: Option<&str>,
        log: Option<&str>,
    ) -> api::ContainerStatus {
        let host = dir.join("containers/app/0f1e2d3c");
        std::fs::create_dir_all(host.parent().unwrap()).unwrap();
        if let Some(f) = file {
            std::fs::write(&host, f).unwrap();
        }
        let log_path = dir.join("0.log");
        if let Some(l) = log {
            std::fs::write(&log_path, l).unwrap();
        }
        api::ContainerStatus {
            state: api::ContainerState::ContainerExited as i32,
            exit_code,
            annotations: HashMap::from([
                (PATH_ANNOTATION.into(), "/dev/termination-log".into()),
                (POLICY_ANNOTATION.into(), policy.into()),
            ]),
            mounts: vec![api::Mount {
                container_path: "/dev/termination-log".into(),
                host_path: host.to_string_lossy().into_owned(),
                ..Default::default()
            }],
            log_path: log_path.to_string_lossy().into_owned(),
            ..Default::default()
        }
    }

    fn dir() -> tempfile::TempDir {
        tempfile::tempdir().unwrap()
    }

    const LOG: &str = "2026-12-04T10:00:00.000000001Z stdout F first\n\
                       2026-12-04T10:00:00.000000002Z stderr P half \n\
                       2026-12-04T10:00:00.000000003Z stderr F and half\n\
                       garbage\n\
                       2026-12-04T10:00:00.000000004Z stdout F last\n";

    #[test]
    fn the_file_is_the_message() {
        let d = dir();
        let s = exited(d.path(), "File", 2, Some("bye\n"), Some(LOG));
        assert_eq!(read(&s), Some(TerminationMessage::Read("bye\n".into())));
    }

    #[test]
    fn only_the_files_last_4_kib() {
        let d = dir();
        let big = format!("{}{}", "a".repeat(5000), "z".repeat(10));
        let s = exited(d.path(), "File", 0, Some(&big), None);
        let Some(TerminationMessage::Read(m)) = read(&s) else {
            panic!("read");
        };
        assert_eq!(m.len(), MAX_FILE as usize);
        assert!(m.ends_with("azzzzzzzzzz"), "{m}");
    }

    #[test]
    fn fallback_reads_the_log_only_on_failure_with_an_empty_file() {
        let d = dir();
        let s = exited(d.path(), FALLBACK_TO_LOGS, 4, Some(""), Some(LOG));
        assert_eq!(
            read(&s),
            Some(TerminationMessage::Read(
                "first\nhalf and half\nlast\n".into()
            ))
        );
        // A success, or a file with something in it: never the log.
        let s = exited(d.path(), FALLBACK_TO_LOGS, 0, Some(""), Some(LOG));
        assert_eq!(read(&s), Some(TerminationMessage::Read(String::new())));
        let s = exited(d.path(), FALLBACK_TO_LOGS, 4, Some("mine"), Some(LOG));
        assert_eq!(read(&s), Some(TerminationMessage::Read("mine".into())));
        // A container that could not run has no log to read.
        let mut s = exited(d.path(), FALLBACK_TO_LOGS, 128, Some(""), None);
        s.reason = "ContainerCannotRun".into();
        assert_eq!(read(&s), Some(TerminationMessage::Read(String::new())));
    }

    #[test]
    fn the_log_tail_is_80_lines_and_2_kib() {
        let mut log = String::new();
        for i in 0..100 {
            log.push_str(&format!("2026-12-04T10:00:00Z stdout F line {i}\n"));
        }
        let tail = tail_of_cri_log(log.as_bytes());
        assert!(tail.starts_with("line 20\n"), "{tail}");
        assert!(tail.ends_with("line 99\n"), "{tail}");
        let long = format!("2026-12-04T10:00:00Z stdout F {}\n", "x".repeat(5000));
        assert_eq!(tail_of_cri_log(long.as_bytes()).len(), MAX_LOG_BYTES);
    }

    #[test]
    fn no_file_in_a_directory_seen_is_no_message_but_no_directory_is_unreadable() {
        let d = dir();
        let s = exited(d.path(), "File", 1, None, None);
        assert_eq!(read(&s), Some(TerminationMessage::Read(String::new())));
        let mut s = s;
        s.mounts[0].host_path = "/nonexistent/kubelet/pods/u/containers/app/x".into();
        assert!(matches!(read(&s), Some(TerminationMessage::Unreadable(_))));
        // The log the fallback needs is not there either.
        let mut s = exited(d.path(), FALLBACK_TO_LOGS, 1, Some(""), None);
        s.log_path = "/nonexistent/var/log/pods/x/0.log".into();
        assert!(matches!(read(&s), Some(TerminationMessage::Unreadable(_))));
    }

    #[test]
    fn links_and_fifos_are_not_followed() {
        let d = dir();
        let s = exited(d.path(), "File", 1, None, None);
        let secret = d.path().join("secret");
        std::fs::write(&secret, "do not read").unwrap();
        std::os::unix::fs::symlink(&secret, &s.mounts[0].host_path).unwrap();
        assert!(matches!(read(&s), Some(TerminationMessage::Unreadable(_))));
        std::fs::remove_file(&s.mounts[0].host_path).unwrap();
        nix::unistd::mkfifo(
            Path::new(&s.mounts[0].host_path),
            nix::sys::stat::Mode::S_IRUSR | nix::sys::stat::Mode::S_IWUSR,
        )
        .unwrap();
        assert!(matches!(read(&s), Some(TerminationMessage::Unreadable(_))));
    }

    #[test]
    fn a_running_container_has_none_yet_and_no_path_means_none() {
        let d = dir();
        let mut s = exited(d.path(), "File", 1, Some("x"), None);
        s.state = api::ContainerState::ContainerRunning as i32;
        assert_eq!(read(&s), None);
        s.state = api::ContainerState::ContainerExited as i32;
        s.annotations.clear();
        assert_eq!(read(&s), Some(TerminationMessage::Read(String::new())));
    }

    #[test]
    fn joined_as_kubelet_joins() {
        assert_eq!(joined(Some("rt"), "own"), Some("rt: own".into()));
        assert_eq!(joined(Some("rt"), ""), Some("rt".into()));
        assert_eq!(joined(None, "own"), Some("own".into()));
        assert_eq!(joined(Some(""), ""), None);
    }
}
