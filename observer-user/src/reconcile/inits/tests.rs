use std::time::{Duration, Instant};

use super::*;

fn id(n: u32) -> ContainerId {
    ContainerId::parse(&format!("{n:064x}")).unwrap()
}

fn rw(dir: &Path) -> InitStore {
    InitStore::open(dir, StateAccess::ReadWrite).expect("not locked")
}

fn ro(dir: &Path) -> InitStore {
    InitStore::open(dir, StateAccess::ReadOnly).expect("never locked")
}

/// The names in `dir` other than the lock and the file itself.
fn others(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != FILE && n != LOCK)
        .collect();
    v.sort();
    v
}

fn text_of(known: &[(u32, u32)]) -> String {
    let mut t = format!("{}\n", boot_id());
    for (n, pid) in known {
        t.push_str(&format!("{} {pid}\n", id(*n)));
    }
    t
}

#[test]
fn a_restarted_agent_reads_what_the_last_one_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = rw(dir.path());
    a.record(id(1), 100);
    a.record(id(2), 200);
    drop(a);
    let b = rw(dir.path());
    assert_eq!(
        (b.get(&id(1)), b.get(&id(2)), b.get(&id(3))),
        (Some(100), Some(200), None)
    );
    assert_eq!(
        others(dir.path()),
        Vec::<String>::new(),
        "no temporary left"
    );
}

#[test]
fn a_second_agent_on_the_directory_is_refused_naming_the_holder() {
    let dir = tempfile::tempdir().unwrap();
    let _first = rw(dir.path());
    let Err(e) = InitStore::open(dir.path(), StateAccess::ReadWrite) else {
        panic!("a second writer was let in");
    };
    assert_eq!(
        e.to_string(),
        format!(
            "the state directory {} is held by another observer (pid {}): one agent per node and state directory; stop that one, or give this one another --state-dir",
            dir.path().display(),
            std::process::id()
        )
    );
}

#[test]
fn a_reader_never_writes_and_needs_no_lock() {
    let dir = tempfile::tempdir().unwrap();
    let mut agent = rw(dir.path());
    agent.record(id(1), 10);
    let before = fs::read(dir.path().join(FILE)).unwrap();
    let mut status = ro(dir.path());
    assert_eq!(status.get(&id(1)), Some(10));
    status.record(id(2), 20);
    status.retain(|_| false);
    assert_eq!(fs::read(dir.path().join(FILE)).unwrap(), before);

    let empty = tempfile::tempdir().unwrap();
    let gone = empty.path().join("absent");
    let mut status = ro(&gone);
    status.record(id(1), 1);
    assert!(!gone.exists(), "a read-only store creates nothing");
}

#[test]
fn unparsable_files_are_kept_aside_never_replaced() {
    let cases: Vec<Vec<u8>> = vec![
        b"\n".to_vec(),
        format!("not-a-boot-id\n{} 7\n", id(1)).into_bytes(),
        format!("{}{} seven\n", text_of(&[(2, 8)]), id(1)).into_bytes(),
        vec![0xff, 0x00, 0x13, 0x37, 0xfe],
    ];
    for bytes in cases {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(FILE), &bytes).unwrap();
        let s = rw(dir.path());
        assert!(s.known.is_empty());
        let aside = others(dir.path());
        assert_eq!(aside.len(), 1, "{aside:?}");
        assert!(aside[0].starts_with("inits.unreadable-"), "{aside:?}");
        assert_eq!(fs::read(dir.path().join(&aside[0])).unwrap(), bytes);
        assert_eq!(
            fs::read_to_string(dir.path().join(FILE)).unwrap(),
            text_of(&[])
        );
    }
}

#[test]
fn a_reader_leaves_an_unparsable_file_where_it_is() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join(FILE), "garbage\n").unwrap();
    assert!(ro(dir.path()).known.is_empty());
    assert_eq!(others(dir.path()), Vec::<String>::new());
    assert_eq!(
        fs::read_to_string(dir.path().join(FILE)).unwrap(),
        "garbage\n"
    );
}

#[test]
fn a_file_of_another_boot_is_kept_aside() {
    let dir = tempfile::tempdir().unwrap();
    let old = format!("00000000-0000-0000-0000-000000000000\n{} 7\n", id(1));
    fs::write(dir.path().join(FILE), &old).unwrap();
    let s = rw(dir.path());
    assert_eq!(s.get(&id(1)), None, "pids of another boot mean nothing");
    let aside = others(dir.path());
    assert!(aside[0].starts_with("inits.other-boot-"), "{aside:?}");
    assert_eq!(fs::read_to_string(dir.path().join(&aside[0])).unwrap(), old);
}

#[test]
fn a_symlink_is_never_followed() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("precious");
    fs::write(&target, "not the agent's\n").unwrap();
    std::os::unix::fs::symlink(&target, dir.path().join(FILE)).unwrap();
    let mut s = rw(dir.path());
    s.record(id(1), 1);
    assert_eq!(fs::read_to_string(&target).unwrap(), "not the agent's\n");
    let file = dir.path().join(FILE);
    assert!(fs::symlink_metadata(&file).unwrap().is_file());
    assert_eq!(fs::read_to_string(&file).unwrap(), text_of(&[(1, 1)]));
    let aside: Vec<String> = others(dir.path())
        .into_iter()
        .filter(|n| n != "precious")
        .collect();
    assert!(aside[0].starts_with("inits.unreadable-"), "{aside:?}");
    assert!(fs::symlink_metadata(dir.path().join(&aside[0]))
        .unwrap()
        .is_symlink());
}

#[test]
fn retain_forgets_the_dead_on_disk_too() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = rw(dir.path());
    for n in 0..5 {
        s.record(id(n), n);
    }
    s.retain(|i| *i == id(3));
    drop(s);
    let s = rw(dir.path());
    assert_eq!((s.get(&id(3)), s.get(&id(1))), (Some(3), None));
}

#[test]
fn unwritable_is_memory_only() {
    let mut s = rw(Path::new("/proc/observer-cannot-write-here"));
    s.record(id(1), 1);
    assert_eq!(s.get(&id(1)), Some(1));
    assert!(s.writer.is_none());
}

const CHILD: &str = "OBSERVER_INITS_CRASH_CHILD";

/// Not a test by itself: the writer `killed_in_the_middle_of_a_write_the_file_still_parses`
/// runs in a child process and kills.
#[test]
fn crash_child_writer() {
    let Some(dir) = std::env::var_os(CHILD) else {
        return;
    };
    let mut s = rw(Path::new(&dir));
    for n in 0.. {
        s.record(id(n), n);
    }
}

/// Polls `cond` until it holds or `timeout` passes.
fn eventually(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + timeout;
    while Instant::now() < end {
        if cond() {
            return true;
        }
        std::thread::yield_now();
    }
    cond()
}

#[test]
fn killed_in_the_middle_of_a_write_the_file_still_parses() {
    let dir = tempfile::tempdir().unwrap();
    for round in 1..=5u32 {
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "reconcile::inits::tests::crash_child_writer",
                "--nocapture",
            ])
            .env(CHILD, dir.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // Killed while it writes: once the file has grown past what the last round left.
        let grown = eventually(Duration::from_secs(60), || {
            fs::read_to_string(dir.path().join(FILE))
                .is_ok_and(|t| t.lines().count() > 50 * round as usize)
        });
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        assert!(grown, "round {round}: the writer did not write");
        let s = ro(dir.path());
        assert!(s.known.len() >= 50, "round {round}: {}", s.known.len());
        assert!(s.known.iter().all(|(i, pid)| *i == id(*pid)));
        assert!(
            others(dir.path()).iter().all(|n| !n.starts_with("inits.")),
            "round {round}: nothing unparsable: {:?}",
            others(dir.path())
        );
        // The dead writer's lock is free, and its next writer starts from its file.
        let next = rw(dir.path());
        assert_eq!(next.known, s.known);
    }
}

#[test]
fn a_fifo_at_the_file_or_the_lock_is_refused_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    nix::unistd::mkfifo(&dir.path().join(FILE), nix::sys::stat::Mode::S_IRWXU).unwrap();
    let path = dir.path().to_path_buf();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut s = rw(&path);
        s.record(id(1), 10);
        let _ = tx.send(s.get(&id(1)));
    });
    let got = rx.recv_timeout(Duration::from_secs(10));
    assert_eq!(got, Ok(Some(10)), "start-up did not block on the FIFO");
    assert!(
        others(dir.path())
            .iter()
            .any(|n| n.starts_with("inits.unreadable-")),
        "{:?}",
        others(dir.path())
    );
    assert_eq!(
        fs::read_to_string(dir.path().join(FILE)).unwrap(),
        text_of(&[(1, 10)])
    );

    let dir = tempfile::tempdir().unwrap();
    nix::unistd::mkfifo(&dir.path().join(LOCK), nix::sys::stat::Mode::S_IRWXU).unwrap();
    let path = dir.path().to_path_buf();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let s = rw(&path);
        let _ = tx.send(s.writer.is_none());
    });
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(10)),
        Ok(true),
        "a FIFO lock: memory only, at once"
    );
}

#[test]
fn a_file_larger_than_any_agent_writes_is_kept_aside_unread() {
    let dir = tempfile::tempdir().unwrap();
    let mut text = text_of(&[(1, 10)]);
    while text.len() as u64 <= MAX_BYTES {
        text.push_str(&text_of(&[(2, 20)])[37..]);
    }
    fs::write(dir.path().join(FILE), &text).unwrap();
    let s = rw(dir.path());
    assert_eq!(s.get(&id(1)), None, "not read");
    assert!(others(dir.path())
        .iter()
        .any(|n| n.starts_with("inits.unreadable-")));
}

#[test]
fn a_failed_write_keeps_the_lock_and_is_retried() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = rw(dir.path());
    // The next write's temporary file cannot be made (a directory is in its place), as a full
    // disk would refuse it.
    let tmp = dir.path().join(format!(".{FILE}.tmp"));
    fs::create_dir(&tmp).unwrap();
    s.record(id(1), 10);
    assert!(s.failing && s.writer.is_some());
    assert!(
        matches!(
            InitStore::open(dir.path(), StateAccess::ReadWrite),
            Err(StateError::Locked { .. })
        ),
        "the lock is still held"
    );
    fs::remove_dir(&tmp).unwrap();
    s.record(id(2), 20);
    assert!(!s.failing);
    // Both entries on disk (in the map's order, so compared as sets of lines).
    let written = fs::read_to_string(dir.path().join(FILE)).unwrap();
    let want = text_of(&[(1, 10), (2, 20)]);
    let (mut got, mut want): (Vec<&str>, Vec<&str>) =
        (written.lines().collect(), want.lines().collect());
    got[1..].sort();
    want[1..].sort();
    assert_eq!(got, want);
}
