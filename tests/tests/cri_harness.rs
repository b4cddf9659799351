//! Smoke tests of the containerd harness and of observer's CRI client against a real containerd.
//! They need root and containerd (scripts/bootstrap.sh); without them they skip, except under
//! CI=true where they fail.
#![allow(unused_crate_dependencies)] // a test/bench/bin target sees its package's whole dependency list
use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use observer::cri::{api, CriConfig, KubeletLabels, ReconnectingCri};
use observer_tests::{require_containerd, ContainerSpec, Containerd, PodSpec, Qos, StopSignal};

const EXIT_TIMEOUT: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_code_oom_and_task_exit_events() -> Result<()> {
    if !require_containerd() {
        return Ok(());
    }
    observer_tests::init_tracing();
    let t0 = Instant::now();
    let ctrd = Containerd::start().await?;
    eprintln!(
        "containerd up in {:?} ({} snapshotter)",
        t0.elapsed(),
        ctrd.snapshotter()
    );
    let cri = ctrd.cri()?;

    let v = cri.version().await?;
    assert_eq!(v.runtime_name, "containerd");
    assert_eq!(v.runtime_api_version, "v1");

    // containerd 1.6 does not offer CRI events: a typed outcome, not a generic failure.
    match cri.get_container_events().await {
        Err(e) => assert!(e.is_unimplemented(), "expected Unimplemented, got {e}"),
        Ok(mut stream) => {
            // Some runtimes accept the call and refuse on the first message.
            let first = tokio::time::timeout(Duration::from_secs(2), stream.next()).await;
            if let Ok(Some(Err(e))) = first {
                assert!(e.is_unimplemented(), "expected Unimplemented, got {e}");
            } else {
                panic!(
                    "containerd {} unexpectedly streams CRI events",
                    v.runtime_version
                );
            }
        }
    }

    let mut exits = ctrd.subscribe_task_exits().await?;

    let t = Instant::now();
    let pod = ctrd
        .run_pod(
            PodSpec::new("exiter")
                .qos(Qos::Burstable)
                .container(ContainerSpec::sh("main", "exit 3")),
        )
        .await?;
    let id = pod.container_id("main").to_string();
    let st = ctrd.wait_exited(&id, EXIT_TIMEOUT).await?;
    eprintln!("pod with `exit 3` ran and exited in {:?}", t.elapsed());
    assert_eq!(st.exit_code, 3);
    assert_eq!(st.reason, "Error");
    assert_eq!(st.container_name(), Some("main"));
    assert_eq!(st.restart_count(), Some(0));
    assert_eq!(st.pod_ref().unwrap().uid, pod.uid);

    let exit = exits.wait_for(&id, EXIT_TIMEOUT).await?;
    assert_eq!(exit.exit_status, 3);
    assert!(exit.pid > 0);
    assert_eq!(exit.namespace, "k8s.io");
    let lag = exit
        .received_at
        .duration_since(exit.exited_at)
        .unwrap_or_default();
    eprintln!("/tasks/exit received {lag:?} after exited_at");

    // The read-only client sees the sandbox and container with kubelet's labels.
    let sandboxes = cri.list_pod_sandboxes(None).await?;
    let sb = sandboxes
        .iter()
        .find(|s| s.id == pod.sandbox_id)
        .context("sandbox not listed")?;
    assert_eq!(sb.pod_name(), Some("exiter"));
    assert_eq!(sb.pod_namespace(), Some("default"));
    assert!(sb.is_kubelet_managed());
    let sbst = cri.pod_sandbox_status(&pod.sandbox_id).await?;
    assert_eq!(sbst.pod_ref().unwrap().name, "exiter");
    let containers = cri
        .list_containers(Some(api::ContainerFilter {
            pod_sandbox_id: pod.sandbox_id.clone(),
            ..Default::default()
        }))
        .await?;
    assert_eq!(containers.len(), 1);
    assert_eq!(containers[0].container_name(), Some("main"));
    let missing = cri.container_status("no-such-container").await.unwrap_err();
    assert!(missing.is_not_found(), "{missing}");

    // A container that allocates past its limit is OOM-killed.
    let t = Instant::now();
    let pod2 = ctrd
        .run_pod(
            PodSpec::new("hog").qos(Qos::Burstable).container(
                ContainerSpec::sh(
                    "hog",
                    "x=$(head -c 64m /dev/zero | tr '\\0' a); echo survived ${#x}",
                )
                .memory_limit_mib(32),
            ),
        )
        .await?;
    let hog = pod2.container_id("hog").to_string();
    let st = ctrd.wait_exited(&hog, EXIT_TIMEOUT).await?;
    eprintln!(
        "memory hog OOM-killed in {:?}: {} / {}",
        t.elapsed(),
        st.reason,
        st.exit_code
    );
    assert_eq!(st.reason, "OOMKilled", "status: {st:?}");
    assert_eq!(st.exit_code, 137);
    let exit = exits.wait_for(&hog, EXIT_TIMEOUT).await?;
    assert_eq!(exit.exit_status, 137);

    ctrd.remove_pod(&pod).await?;
    ctrd.remove_pod(&pod2).await?;
    assert!(cri.list_pod_sandboxes(None).await?.is_empty());
    for p in [&pod, &pod2] {
        let dir = Path::new("/sys/fs/cgroup/memory").join(p.cgroup_parent.trim_start_matches('/'));
        assert!(!dir.exists(), "{} left behind", dir.display());
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnects_after_restart_and_teardown_is_complete() -> Result<()> {
    if !require_containerd() {
        return Ok(());
    }
    observer_tests::init_tracing();
    let mut ctrd = Containerd::start().await?;
    let config = CriConfig::new(ctrd.endpoint()).call_timeout(Duration::from_secs(5));
    let cri = ReconnectingCri::new(config);
    cri.wait_connected(Duration::from_secs(10)).await?;
    assert_eq!(cri.state().generation, 1);

    let pod = ctrd
        .run_pod(
            PodSpec::new("survivor")
                .qos(Qos::BestEffort)
                .container(ContainerSpec::new("sleeper")),
        )
        .await?;
    let id = pod.container_id("sleeper").to_string();
    let pid = ctrd.container_pid(&id).await?;

    let mut state = cri.subscribe();
    for (round, how) in [StopSignal::Kill, StopSignal::Term].into_iter().enumerate() {
        let before = state.borrow_and_update().generation;
        let t = Instant::now();
        ctrd.stop(how).await?;
        state
            .wait_for(|s| !s.connected)
            .await
            .context("ReconnectingCri did not notice containerd stopping")?;
        let noticed = t.elapsed();
        assert!(matches!(
            cri.version().await,
            Err(observer::cri::CriError::Disconnected { .. })
        ));
        ctrd.resume().await?;
        let t = Instant::now();
        let s = tokio::time::timeout(
            Duration::from_secs(20),
            state.wait_for(|s| s.connected && s.generation > before),
        )
        .await
        .context("no reconnect within 20 s")??
        .clone();
        eprintln!(
            "{how:?}: loss noticed in {noticed:?}, reconnected {:?} after containerd answered",
            t.elapsed()
        );
        assert_eq!(s.reconnects(), round as u64 + 1);

        // The container survived the restart, and the runtime still knows it.
        ensure!(
            Path::new(&format!("/proc/{pid}")).exists(),
            "container process died with containerd ({how:?})"
        );
        let st = cri.container_status(&id).await?;
        assert_eq!(st.state, api::ContainerState::ContainerRunning as i32);
    }

    // Teardown with a running pod: nothing of this containerd may remain.
    let dir = ctrd.dir().to_path_buf();
    let ctrd_pid = ctrd.pid().context("containerd pid")?;
    let cgroup = Path::new("/sys/fs/cgroup/memory").join(pod.cgroup_parent.trim_start_matches('/'));
    assert!(cgroup.exists());
    let t = Instant::now();
    ctrd.teardown()?;
    eprintln!("teardown in {:?}", t.elapsed());
    drop(ctrd);
    assert!(!dir.exists(), "{} still exists", dir.display());
    assert!(
        !Path::new(&format!("/proc/{ctrd_pid}")).exists(),
        "containerd still running"
    );
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "container process still running"
    );
    assert!(!cgroup.exists(), "{} left behind", cgroup.display());
    let mounts = std::fs::read_to_string("/proc/self/mountinfo")?;
    assert!(
        !mounts.contains(dir.to_str().unwrap()),
        "mounts left under {}",
        dir.display()
    );
    let shims = std::fs::read_dir("/proc")?
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .filter(|c| String::from_utf8_lossy(c).contains(dir.to_str().unwrap()))
        .count();
    assert_eq!(shims, 0, "processes still reference {}", dir.display());

    // With the runtime gone for good, the client stays disconnected and says so.
    state.wait_for(|s| !s.connected).await?;
    assert!(cri.list_containers(None).await.is_err());
    Ok(())
}

/// A test that panics with pods running still leaves nothing behind: Drop tears down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn teardown_runs_when_a_test_panics() -> Result<()> {
    if !require_containerd() {
        return Ok(());
    }
    observer_tests::init_tracing();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let failing = tokio::spawn(async move {
        let ctrd = Containerd::start().await.expect("start");
        let pod = ctrd
            .run_pod(PodSpec::new("doomed").container(ContainerSpec::new("sleeper")))
            .await
            .expect("run pod");
        let pid = ctrd
            .container_pid(pod.container_id("sleeper"))
            .await
            .expect("pid");
        let _ = tx.send((
            ctrd.dir().to_path_buf(),
            ctrd.pid().expect("pid"),
            pid,
            pod.cgroup_parent.clone(),
        ));
        panic!("deliberate failure with a pod running");
    });
    let joined = failing.await;
    assert!(
        joined.is_err_and(|e| e.is_panic()),
        "the task should have panicked"
    );
    let (dir, ctrd_pid, pid, parent) = rx
        .await
        .context("the task panicked before running its pod")?;
    assert!(!dir.exists(), "{} still exists", dir.display());
    assert!(
        !Path::new(&format!("/proc/{ctrd_pid}")).exists(),
        "containerd still running"
    );
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "container process still running"
    );
    let cgroup = Path::new("/sys/fs/cgroup/memory").join(parent.trim_start_matches('/'));
    assert!(!cgroup.exists(), "{} left behind", cgroup.display());
    Ok(())
}

/// One line of a tracefs `trace` file: the event name and its `key=value` fields.
fn trace_event(line: &str) -> Option<(&str, HashMap<&str, &str>)> {
    // "<comm>-<pid> [cpu] flags timestamp: event: k=v k=v"
    let (_, rest) = line.split_once("]")?;
    let mut parts = rest.splitn(3, ": ");
    parts.next()?;
    let event = parts.next()?.trim();
    let fields = parts
        .next()?
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .collect();
    Some((event, fields))
}

/// The cgroup layout facts the kernel side rests on, measured with tracefs on this machine's
/// containerd + runc (cgroupfs driver, hybrid hierarchy): where a container's processes live, what
/// its cgroup is named, and which exec is the first one inside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cgroup_layout_facts() -> Result<()> {
    if !require_containerd() {
        return Ok(());
    }
    observer_tests::init_tracing();
    let tracing = Path::new("/sys/kernel/tracing");
    if !tracing.join("instances").exists() {
        let st = std::process::Command::new("mount")
            .args(["-t", "tracefs", "nodev"])
            .arg(tracing)
            .status()?;
        ensure!(st.success(), "cannot mount tracefs");
    }
    // A private instance: its own buffer, nothing changed for other tracers.
    let inst = tracing
        .join("instances")
        .join(format!("observer-cri-facts-{}", std::process::id()));
    std::fs::create_dir(&inst)?;
    struct RmInstance(std::path::PathBuf);
    impl Drop for RmInstance {
        fn drop(&mut self) {
            let _ = std::fs::write(self.0.join("tracing_on"), "0");
            let _ = std::fs::remove_dir(&self.0);
        }
    }
    let _guard = RmInstance(inst.clone());
    std::fs::write(inst.join("buffer_size_kb"), "8192")?;
    for ev in [
        "cgroup/cgroup_attach_task",
        "sched/sched_process_exec",
        "sched/sched_process_fork",
    ] {
        std::fs::write(inst.join("events").join(ev).join("enable"), "1")?;
    }

    let ctrd = Containerd::start().await?;
    std::fs::write(inst.join("tracing_on"), "1")?;
    let pod = ctrd
        .run_pod(
            PodSpec::new("facts")
                .qos(Qos::Burstable)
                .container(ContainerSpec::new("sleeper").command(["sleep", "3600"])),
        )
        .await?;
    let id = pod.container_id("sleeper").to_string();
    let pid = ctrd.container_pid(&id).await?;
    // StartContainer can return before the entrypoint is exec'd: runc start only opens the exec
    // fifo; the init execs afterwards. Wait for it before stopping the trace.
    let exec_d = observer_tests::eventually_async(Duration::from_secs(10), || {
        std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "sleep")
    })
    .await;
    ensure!(exec_d, "container init never exec'd its entrypoint");
    std::fs::write(inst.join("tracing_on"), "0")?;
    let trace = std::fs::read_to_string(inst.join("trace"))?;
    ensure!(
        !trace.contains("LOST"),
        "trace buffer overran; rerun on a quieter machine"
    );

    // Fact 1: the container's init is in <cgroup parent>/<container id> in every hierarchy,
    // the cgroup2 one (hierarchy 0, mounted at /sys/fs/cgroup/unified here) included.
    let container_cg = format!("{}/{id}", pod.cgroup_parent);
    let proc_cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))?;
    eprintln!("/proc/{pid}/cgroup of container {id}:\n{proc_cgroup}");
    for line in proc_cgroup.lines() {
        let path = line.splitn(3, ':').nth(2).unwrap_or_default();
        assert_eq!(path, container_cg, "{line}");
    }
    assert!(
        proc_cgroup.lines().any(|l| l.starts_with("0::")),
        "no cgroup2 membership"
    );

    // Fact 2: runc creates the pod dir and one dir per container (the sandbox's too), named by
    // the plain container id, under both the v1 controllers and the cgroup2 mount.
    for root in ["/sys/fs/cgroup/unified", "/sys/fs/cgroup/memory"] {
        let pod_dir = Path::new(root).join(pod.cgroup_parent.trim_start_matches('/'));
        let mut children: Vec<String> = std::fs::read_dir(&pod_dir)?
            .flatten()
            .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        children.sort();
        let mut expected = vec![pod.sandbox_id.clone(), id.clone()];
        expected.sort();
        eprintln!("{}: {children:?}", pod_dir.display());
        assert_eq!(children, expected, "{}", pod_dir.display());
    }
    assert!(id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit()));

    // Fact 3: runc init execs itself (/proc/self/exe, then its memfd copy /dev/fd/N) around the
    // time it joins the cgroup: usually both before, but under load the memfd re-exec lands inside
    // the container cgroup. The entrypoint is the first exec inside it by the container's pid 1;
    // anything before it in the cgroup is runc's own re-exec by the runc init (a host-ns pid).
    // Fact 4: the cgroup2 id in the kernel's events is the inode of the cgroup2 directory.
    let events: Vec<_> = trace.lines().filter_map(trace_event).collect();
    let attach = events
        .iter()
        .position(|(ev, f)| {
            *ev == "cgroup_attach_task" && f.get("dst_path") == Some(&container_cg.as_str())
        })
        .context("no cgroup_attach_task into the container cgroup")?;
    let v2_id: u64 = events
        .iter()
        .find(|(ev, f)| {
            *ev == "cgroup_attach_task"
                && f.get("dst_root") == Some(&"0")
                && f.get("dst_path") == Some(&container_cg.as_str())
        })
        .and_then(|(_, f)| f.get("dst_id")?.parse().ok())
        .context("no cgroup2 attach")?;
    let v2_dir = Path::new("/sys/fs/cgroup/unified").join(container_cg.trim_start_matches('/'));
    assert_eq!(
        std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&v2_dir)?),
        v2_id
    );
    let runc_init = events[attach].1["pid"].to_string();
    let init_execs = |range: &[(&str, HashMap<&str, &str>)]| -> Vec<String> {
        range
            .iter()
            .filter(|(ev, f)| {
                *ev == "sched_process_exec" && f.get("pid") == Some(&runc_init.as_str())
            })
            .map(|(_, f)| f["filename"].to_string())
            .collect()
    };
    eprintln!(
        "runc init {runc_init} exec'd {:?} before joining {container_cg}",
        init_execs(&events[..attach])
    );
    // Follow forks from the attached task; collect the execs inside until the entrypoint's.
    let mut inside = std::collections::HashSet::from([runc_init.clone()]);
    let mut execs_inside = Vec::new();
    for (ev, f) in &events[attach..] {
        match *ev {
            "cgroup_attach_task" if f.get("dst_path") == Some(&container_cg.as_str()) => {
                inside.insert(f["pid"].to_string());
            }
            "sched_process_fork" if inside.contains(f["pid"]) => {
                inside.insert(f["child_pid"].to_string());
            }
            "sched_process_exec" if inside.contains(f["pid"]) => {
                execs_inside.push((f["filename"].to_string(), f["pid"].to_string()));
                if f["pid"] == pid.to_string() {
                    break;
                }
            }
            _ => {}
        }
    }
    eprintln!("execs inside {container_cg}, in order, up to the entrypoint's: {execs_inside:?}");
    let (entry, runc_own) = execs_inside
        .split_last()
        .context("no exec inside the container cgroup")?;
    assert_eq!(entry, &("/bin/sleep".to_string(), pid.to_string()));
    for (file, by) in runc_own {
        assert_eq!(
            by, &runc_init,
            "an exec before the entrypoint by another task: {file}"
        );
        assert!(
            file == "/proc/self/exe" || file.starts_with("/dev/fd/"),
            "unexpected early exec {file}"
        );
    }
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let nspid = status
        .lines()
        .find(|l| l.starts_with("NSpid:"))
        .context("no NSpid")?;
    eprintln!("{nspid}");
    assert!(nspid.split_whitespace().last() == Some("1"), "{nspid}");
    Ok(())
}
