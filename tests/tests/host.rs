//! The library against this host's real cgroup trees, tracefs and kernel log: cgroup ids, mounts
//! seen from another cgroup namespace, the start-up walk of trees built here, tracepoint formats.
#![allow(unused_crate_dependencies)] // a test/bench/bin target sees its package's whole dependency list
use std::{
    os::unix::fs::MetadataExt,
    path::Path,
    time::{Duration, SystemTime},
};

use observer::{
    cgroup::{
        cgroup_id, cgroup_id_and_version, conmon_cgroup_path, container_cgroup_path,
        pod_cgroup_path, scan, CgroupDriver, CgroupKind, CgroupMounts, CgroupVersion, ContainerId,
        KubeRoots, PodUid, Qos, Runtime, Scan, ScanOptions, ScannedCgroup,
    },
    kernel::{kmsg, tracefs, tracefs::FIELD_ABSENT},
};
use observer_tests::{
    eventually,
    kernel::{read_procs, TestCgroup},
    require_root,
};

const WAIT: Duration = Duration::from_secs(10);
const UID: &str = "0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0";
const ID_A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa1";
const ID_B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb2";
const ID_C: &str = "ccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc3";

fn unified() -> observer::cgroup::HierarchyMount {
    CgroupMounts::detect(None)
        .unwrap()
        .unified()
        .expect("cgroup2 mounted")
        .clone()
}

/// Pid-namespace pids of a process, outermost first (`NSpid`).
fn nspid(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .map(|v| {
            v.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Start time of a process, in clock ticks after boot (`/proc/<pid>/stat` field 22).
fn start_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let (_, rest) = stat.rsplit_once(')').unwrap();
    rest.split_whitespace().nth(19).unwrap().parse().unwrap()
}

/// Clock ticks since boot now (USER_HZ is 100 on Linux).
fn now_ticks() -> u64 {
    let up = std::fs::read_to_string("/proc/uptime").unwrap();
    let secs: f64 = up.split_whitespace().next().unwrap().parse().unwrap();
    (secs * 100.0) as u64
}

/// kernfs file handles carry the node id, which is what the kernel calls the cgroup id: an
/// independent read of the same number (as `name_to_handle_at(2)` in systemd and cgroupfs tools).
fn id_from_file_handle(path: &Path) -> u64 {
    use std::{ffi::CString, os::unix::ffi::OsStrExt};
    #[repr(C)]
    struct Handle {
        bytes: u32,
        kind: i32,
        data: [u8; 64],
    }
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    let mut h = Handle {
        bytes: 64,
        kind: 0,
        data: [0; 64],
    };
    let mut mount_id = 0;
    // SAFETY: `h` is a file_handle header followed by `bytes` bytes of room.
    let rc = unsafe {
        libc::name_to_handle_at(
            libc::AT_FDCWD,
            c.as_ptr(),
            (&mut h as *mut Handle).cast(),
            &mut mount_id,
            0,
        )
    };
    assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
    assert_eq!(h.bytes, 8, "kernfs handles are one u64");
    u64::from_ne_bytes(h.data[..8].try_into().unwrap())
}

#[test]
fn cgroup_id_is_the_directory_inode_and_the_kernfs_id() {
    if !require_root() {
        return;
    }
    let u = unified();
    let mut cg = TestCgroup::in_hierarchy(&u, "id").unwrap();
    let rel = cg.mkdir("a/b").unwrap();
    let dir = cg.abs(&rel);
    let (id, version) = cgroup_id_and_version(&dir).unwrap();
    assert_eq!(version, CgroupVersion::V2);
    assert_eq!(id, std::fs::metadata(&dir).unwrap().ino());
    assert_eq!(id, id_from_file_handle(&dir));
    // Distinct cgroups, distinct ids; the root's is 1 on cgroup2.
    assert_ne!(cgroup_id(dir.parent().unwrap()).unwrap(), id);
    if u.root == "/" {
        assert_eq!(cgroup_id(&u.mount_point).unwrap(), 1);
    }
    // A v1 hierarchy answers with its own ids.
    if let Some(pids) = CgroupMounts::detect(None).unwrap().v1("pids") {
        let (_, v) = cgroup_id_and_version(&pids.mount_point).unwrap();
        assert_eq!(v, CgroupVersion::V1);
    }
}

/// The real cgroup2 mount, described as a mount from outside our cgroup namespace (as in a
/// container with a private cgroup namespace and the host's cgroupfs mounted in).
#[test]
fn a_mount_root_outside_our_namespace_is_checked_on_disk() {
    if !require_root() {
        return;
    }
    let u = unified();
    let cg = TestCgroup::in_hierarchy(&u, "mounts").unwrap();
    let text = format!(
        "1 0 0:38 /../.. {} rw - cgroup2 cgroup2 rw\n2 0 0:39 /../x {} rw - cgroup2 cgroup2 rw\n",
        u.mount_point.display(),
        cg.dir.display(),
    );
    let mut m = CgroupMounts::from_mountinfo(&text, Some(&u.mount_point)).unwrap();
    m.resolve_roots_outside_namespace();
    assert_eq!(m.unified().unwrap().root, "/");
    let text = format!(
        "2 0 0:39 /../x {} rw - cgroup2 cgroup2 rw\n",
        cg.dir.display()
    );
    let mut m = CgroupMounts::from_mountinfo(&text, None).unwrap();
    m.resolve_roots_outside_namespace();
    let sub = m.unified().unwrap();
    assert_eq!(sub.root, "/../x");
    assert_eq!(sub.to_absolute("/x"), None);
}

fn find<'a>(scan: &'a Scan, path: &str) -> &'a ScannedCgroup {
    scan.cgroups
        .iter()
        .find(|c| c.path == path)
        .unwrap_or_else(|| panic!("{path} not in scan: {:#?}", scan.cgroups))
}

/// cgroupfs layout on cgroup2: one container whose init is pid 1 of its own pid namespace, one
/// sharing ours (init = oldest, found in a nested cgroup), a malformed sibling.
#[test]
fn scan_finds_cgroup2_containers_and_their_inits() {
    if !require_root() {
        return;
    }
    let u = unified();
    let mut cg = TestCgroup::in_hierarchy(&u, "scan2").unwrap();
    let uid = PodUid::parse(UID).unwrap();
    let (a, b) = (
        ContainerId::parse(ID_A).unwrap(),
        ContainerId::parse(ID_B).unwrap(),
    );
    let (driver, qos) = (CgroupDriver::Cgroupfs, Qos::Burstable);
    let pod = cg.rel(&pod_cgroup_path(driver, qos, &uid));
    let ca = cg
        .mkdir(&container_cgroup_path(
            driver,
            qos,
            &uid,
            Runtime::Containerd,
            &a,
        ))
        .unwrap();
    let cb_sub = cg
        .mkdir(&format!(
            "{}/sub",
            container_cgroup_path(driver, qos, &uid, Runtime::Containerd, &b)
        ))
        .unwrap();
    let cb = cb_sub.trim_end_matches("/sub").to_string();
    assert!(ca.ends_with(&format!("/kubepods/burstable/pod{UID}/{ID_A}")));
    cg.mkdir(&format!(
        "kubepods/burstable/pod{UID}/not-a-container/deeper"
    ))
    .unwrap();
    cg.mkdir("kubepods/besteffort").unwrap();

    // A: `unshare` stays in our pid namespace; the sleep it forks is pid 1 of a new one.
    let unshare = cg
        .spawn_in(
            &ca,
            Path::new("unshare"),
            &["--pid", "--fork", "--kill-child", "sleep", "60"],
        )
        .unwrap()
        .id();
    let procs_a = cg.abs(&ca).join("cgroup.procs");
    let ns_init = observer_tests::poll_until(WAIT, || {
        read_procs(&procs_a).into_iter().find(|&p| p != unshare)
    })
    .expect("unshare's child");
    assert_eq!(nspid(ns_init).last(), Some(&1));
    assert_eq!(nspid(unshare).len(), nspid(std::process::id()).len());

    // B: no pid namespace; the older process sits in a sub-cgroup. Start times tick at USER_HZ:
    // the younger starts on a later tick.
    let older = cg
        .spawn_in(&cb_sub, Path::new("sleep"), &["60"])
        .unwrap()
        .id();
    assert!(eventually(WAIT, || now_ticks() > start_ticks(older) + 1));
    let younger = cg.spawn_in(&cb, Path::new("sleep"), &["60"]).unwrap().id();
    assert!(start_ticks(younger) > start_ticks(older));

    let kp = cg.rel("kubepods");
    let roots = KubeRoots::new([&kp]).unwrap();
    let scan = scan(&u, &roots, &ScanOptions::default()).unwrap();
    assert_eq!(scan.version, CgroupVersion::V2);

    let sa = find(&scan, &ca);
    assert_eq!(sa.id, cgroup_id(&cg.abs(&ca)).unwrap());
    let c = sa.kind.container().unwrap();
    assert_eq!((c.id, c.pod.uid, c.pod.qos, c.nested), (a, uid, qos, false));
    assert_eq!(c.runtime, None, "bare ids are containerd or docker");
    assert_eq!(sa.init_pid, Some(ns_init));
    let mut want = vec![unshare, ns_init];
    want.sort();
    assert_eq!(sa.pids, want);

    let sb = find(&scan, &cb);
    assert_eq!(sb.init_pid, Some(older));
    let mut want = vec![older, younger];
    want.sort();
    assert_eq!(sb.pids, want);
    let sub = find(&scan, &cb_sub);
    assert!(sub.kind.container().unwrap().nested);
    assert_eq!(sub.kind.container().unwrap().id, b);
    assert_eq!((sub.pids.clone(), sub.init_pid), (vec![older], Some(older)));
    assert_eq!(sub.id, cgroup_id(&cg.abs(&cb_sub)).unwrap());

    let sp = find(&scan, &pod);
    assert_eq!(sp.kind.pod().unwrap().uid, uid);
    assert_eq!((sp.pids.len(), sp.init_pid), (4, None));

    // Pod, A, B, B/sub; the QoS and kubepods levels are not listed; the malformed child is
    // counted once and not descended into.
    assert_eq!(scan.cgroups.len(), 4, "{:#?}", scan.cgroups);
    assert_eq!((scan.stats.unrecognized, scan.stats.unreadable), (1, 0));
    // Parents before children.
    let pos = |p: &str| scan.cgroups.iter().position(|c| c.path == p).unwrap();
    assert!(pos(&pod) < pos(&cb) && pos(&cb) < pos(&cb_sub));
}

/// The systemd layout inside a v1 hierarchy (runtimes on hybrid hosts may make only these), with
/// CRI-O's container and conmon cgroups; overlapping roots list nothing twice.
#[test]
fn scan_walks_a_v1_hierarchy_with_crio_and_systemd() {
    if !require_root() {
        return;
    }
    let mounts = CgroupMounts::detect(None).unwrap();
    let Some(pids_h) = mounts.v1("pids").cloned() else {
        // A prerequisite of the host's shape, not of privilege: unified hosts have no v1 trees.
        eprintln!("SKIPPED: no v1 pids hierarchy on this host (cgroup v2 only)");
        return;
    };
    let mut cg = TestCgroup::in_hierarchy(&pids_h, "scanv1").unwrap();
    let uid = PodUid::parse(UID).unwrap();
    let c = ContainerId::parse(ID_C).unwrap();
    let (driver, qos) = (CgroupDriver::Systemd, Qos::BestEffort);
    let cc = container_cgroup_path(driver, qos, &uid, Runtime::Crio, &c);
    assert!(cc.ends_with(&format!("/crio-{ID_C}.scope")));
    let inner = cg.mkdir(&format!("{cc}/container")).unwrap();
    let conmon = cg
        .mkdir(&conmon_cgroup_path(driver, qos, &uid, &c))
        .unwrap();
    let init = cg
        .spawn_in(&inner, Path::new("sleep"), &["60"])
        .unwrap()
        .id();
    let mon = cg
        .spawn_in(&conmon, Path::new("sleep"), &["60"])
        .unwrap()
        .id();

    let kp = cg.rel("kubepods.slice");
    let roots = KubeRoots::new([kp.clone(), format!("{kp}/")]).unwrap();
    let scan = scan(&pids_h, &roots, &ScanOptions::default()).unwrap();
    assert_eq!(scan.version, CgroupVersion::V1);
    let sc = find(&scan, &cg.rel(&cc));
    let k = sc.kind.container().unwrap();
    assert_eq!(
        (k.runtime, k.id, k.pod.driver, k.nested),
        (Some(Runtime::Crio), c, driver, false)
    );
    assert_eq!((sc.pids.clone(), sc.init_pid), (vec![init], Some(init)));
    assert_eq!(
        sc.id,
        std::fs::metadata(cg.abs(&cg.rel(&cc))).unwrap().ino()
    );
    let sm = find(&scan, &conmon);
    assert!(matches!(sm.kind, CgroupKind::Conmon(_)));
    assert_eq!((sm.pids.clone(), sm.init_pid), (vec![mon], None));
    // Pod, container, container/container, conmon.
    assert_eq!(scan.cgroups.len(), 4, "{:#?}", scan.cgroups);
    assert_eq!(scan.stats.unrecognized, 0);
}

#[test]
fn this_kernels_tracepoint_formats() {
    if !require_root() {
        return;
    }
    let tracefs = tracefs::find_or_mount().expect("tracefs");
    let oom = tracefs::oom_offsets(&tracefs).unwrap();
    assert_ne!(oom.pid, FIELD_ABSENT);
    let cg = tracefs::cgroup_offsets(&tracefs).unwrap();
    assert_ne!(cg.val, FIELD_ABSENT);
    assert_ne!(cg.path, FIELD_ABSENT);
}

#[test]
fn the_kernel_log_reads_back_with_its_coverage() {
    if !require_root() {
        return;
    }
    // A record of our own makes the log non-empty: its oldest record must be known, and not after
    // ours.
    let before = SystemTime::now();
    std::fs::write("/dev/kmsg", "observer-tests: kmsg coverage record\n").expect("write /dev/kmsg");
    let h = kmsg::read_history().expect("read /dev/kmsg");
    let since = h.since.expect("a non-empty log has an oldest record");
    assert!(since <= before + Duration::from_secs(1), "{since:?}");
    for k in &h.kills {
        // Only a kill whose log kept the victim's line alone (its report not printed, or
        // overwritten by the ring) has no cgroup.
        let lone = k.report.as_ref().is_some_and(|r| r.constraint.is_none());
        assert!(k.pid > 0 && (!k.task_memcg.is_empty() || lone), "{k:?}");
        assert!(
            k.time + Duration::from_secs(1) >= since,
            "{k:?} older than the log's oldest record"
        );
    }
}
