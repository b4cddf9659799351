//! Processes with exactly known deaths, for the kernel tests: each subcommand ends in one way.
//!
//!   exit N            exit(N)
//!   segv              SIGSEGV with core dumps off
//!   sleep SECS        sleep, then exit 0
//!   thread-exit N     a non-leader thread calls exit_group(N) while the leader blocks
//!   alloc MIB         touch MIB MiB of memory, then keep allocating until killed
//!   oom-child MIB     fork a child named "oom-victim" that runs `alloc MIB`; wait for it,
//!                     print how it ended, exit 0
//!   oom-sibling MIB ROUNDS  ROUNDS times: a sleeping child ("oom-held", oom_score_adj 1000)
//!                     holds MIB MiB, another ("oom-grower") touches 3/4 of that once; the
//!                     limit kills the sleeper; print `victim <pid> status <s> grower <pid> <s>`
//!   spin N            fork and reap N short-lived children (a fork/exit storm), exit 0
//!   spin-ns N         the same, each child the init (pid 1) of a new pid namespace
//!   pidns-init CODE   a child, pid 1 of a new pid namespace, execs `exit CODE`; wait, print
//!                     `child <host pid> status <status>`, exit 0
//!   mix N             N times: a child execs `exit 0` (a plain process), then a child that is
//!                     pid 1 of a new pid namespace execs `exit 1` (a container init); reap both
//!   hog               burn CPU until killed
//!   leak KIBPS [FILE MIB]  touch anonymous memory at KIBPS KiB/s (64 KiB steps, paced on the
//!                     clock) until killed; with FILE, first write MIB MiB there (page cache
//!                     charged here, as a container's logs and libraries are)
//!   cache FILE MIB SECS  write a MIB MiB file (page cache charged here), then read it whole
//!                     again and again for SECS seconds; exit 0
//!   bursty MIB SECS   for SECS seconds: touch MIB MiB, hold it 200 ms, free it, rest 300 ms;
//!                     exit 0
//!   plateau MIB KIBPS SECS  anonymous memory at KIBPS KiB/s up to MIB MiB, held until SECS
//!                     seconds from the start (a heap that grows and stays); exit 0
//!   fault MIB ROUNDS  ROUNDS times: fault in MIB MiB of anonymous memory as fast as the kernel
//!                     gives it, then unmap it (an allocation storm); print `fault: <ms> ms`
#![allow(unused_crate_dependencies)] // a test/bench/bin target sees its package's whole dependency list
use std::{env, process::exit, thread, time::Duration};

fn arg(n: usize) -> u64 {
    env::args().nth(n).and_then(|a| a.parse().ok()).unwrap_or_else(|| {
        eprintln!("usage: observer-workload <exit N|segv|sleep S|thread-exit N|alloc MIB|oom-child MIB|oom-sibling MIB ROUNDS|spin N|spin-ns N|pidns-init CODE|mix N|hog>");
        exit(64)
    })
}

fn set_comm(name: &str) {
    let c = std::ffi::CString::new(name).expect("no NUL");
    // SAFETY: PR_SET_NAME copies at most 16 bytes from a valid C string.
    unsafe { libc::prctl(libc::PR_SET_NAME, c.as_ptr(), 0, 0, 0) };
}

/// clone(2) with `CLONE_NEWPID`, fork-like (no new stack): the child is pid 1 of a new pid
/// namespace. Returns the child's pid in the parent, 0 in the child.
fn fork_new_pid_ns() -> i64 {
    // SAFETY: a raw clone without CLONE_VM is a fork: the child gets a copy of the address space
    // and, with a null stack, continues on its copy of this stack. The callers' children only
    // call async-signal-safe functions (execv, _exit) before they exit.
    unsafe {
        libc::syscall(
            libc::SYS_clone,
            libc::CLONE_NEWPID | libc::SIGCHLD,
            0usize,
            0usize,
            0usize,
            0usize,
        )
    }
}

/// In a forked child: exec this program with `args`, or `_exit(127)`.
fn exec_self(argv: &[std::ffi::CString]) -> ! {
    let mut ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    ptrs.push(std::ptr::null());
    // SAFETY: a NUL-terminated array of valid C strings, alive until execv replaces the image.
    unsafe { libc::execv(ptrs[0], ptrs.as_ptr()) };
    // SAFETY: _exit is async-signal-safe.
    unsafe { libc::_exit(127) }
}

fn self_argv(args: &[&str]) -> Vec<std::ffi::CString> {
    let exe = std::fs::read_link("/proc/self/exe").expect("/proc/self/exe");
    std::iter::once(exe.to_string_lossy().into_owned())
        .chain(args.iter().map(|a| a.to_string()))
        .map(|a| std::ffi::CString::new(a).expect("no NUL"))
        .collect()
}

fn reap(child: i64) -> i32 {
    let mut status = 0;
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(child as libc::pid_t, &mut status, 0) };
    status
}

fn alloc(mib: u64) -> ! {
    let mut chunks: Vec<Vec<u8>> = Vec::new();
    let mut total = 0;
    loop {
        // Touch every page so the memory is really charged to the cgroup.
        chunks.push(vec![0xa5; 1 << 20]);
        total += 1;
        if total == mib {
            eprintln!("alloc: {mib} MiB touched, continuing");
        }
    }
}

/// `rounds` times: a sleeping child holds `mib` MiB and offers itself to the OOM killer, and
/// another child touches three quarters of that, once. The kill takes the sleeper (on another CPU
/// than the allocation); the grower then fits and exits 0, unless the kernel took it too before
/// the sleeper's memory was freed. Prints "victim PID status S grower PID S" per round.
fn oom_sibling(mib: u64, rounds: u64) {
    let _ = std::fs::write("/proc/self/oom_score_adj", "-1000");
    for _ in 0..rounds {
        let mut ready = [0i32; 2];
        // SAFETY: a valid two-element array for pipe(2).
        if unsafe { libc::pipe(ready.as_mut_ptr()) } != 0 {
            exit(71);
        }
        // SAFETY: the children only touch memory, write and sleep before they exit.
        let held = match unsafe { libc::fork() } {
            -1 => exit(71),
            0 => {
                set_comm("oom-held");
                let _ = std::fs::write("/proc/self/oom_score_adj", "1000");
                let held = vec![0xa5u8; (mib as usize) << 20];
                // SAFETY: writing one byte from a valid buffer to our pipe.
                unsafe { libc::write(ready[1], held.as_ptr().cast(), 1) };
                loop {
                    // SAFETY: pause has no preconditions; only a signal ends it.
                    unsafe { libc::pause() };
                }
            }
            child => child,
        };
        let mut b = 0u8;
        // SAFETY: reading one byte into a valid buffer from our pipe.
        unsafe { libc::read(ready[0], (&raw mut b).cast(), 1) };
        // SAFETY: closing our own descriptors.
        unsafe {
            libc::close(ready[0]);
            libc::close(ready[1]);
        }
        // SAFETY: as above.
        let grower = match unsafe { libc::fork() } {
            -1 => exit(71),
            0 => {
                set_comm("oom-grower");
                let _ = std::fs::write("/proc/self/oom_score_adj", "0");
                // Three quarters: once the sleeper's memory is freed, it fits with room to spare.
                let grown = vec![0x5au8; ((mib * 3 / 4) as usize) << 20];
                std::hint::black_box(&grown);
                exit(0)
            }
            child => child,
        };
        let held_status = reap(held.into());
        let grower_status = reap(grower.into());
        println!("victim {held} status {held_status:#x} grower {grower} {grower_status:#x}");
    }
}

/// Anonymous memory at `kib_per_s`, in 64 KiB steps paced on the monotonic clock.
fn leak(kib_per_s: u64) -> ! {
    grow(kib_per_s, usize::MAX, None);
    unreachable!("a leak grows until it is killed")
}

/// Anonymous memory at `kib_per_s` up to `cap` bytes, then held; returns at `until`, if any.
fn grow(kib_per_s: u64, cap: usize, until: Option<std::time::Instant>) {
    const STEP: usize = 64 << 10;
    let start = std::time::Instant::now();
    let mut chunks: Vec<Vec<u8>> = Vec::new();
    while until.is_none_or(|u| std::time::Instant::now() < u) {
        let due = (start.elapsed().as_secs_f64() * kib_per_s as f64 * 1024.0) as usize;
        while chunks.len() * STEP < due.min(cap) {
            chunks.push(vec![0x5a; STEP]);
        }
        thread::sleep(Duration::from_millis(1));
    }
    std::hint::black_box(&chunks);
}

/// `rounds` times: `mib` MiB of anonymous memory faulted in as fast as the kernel gives it (a
/// write per page), then unmapped. Prints the time it took, in ms.
fn fault(mib: u64, rounds: u64) {
    let len = (mib as usize) << 20;
    let start = std::time::Instant::now();
    for _ in 0..rounds {
        // SAFETY: a private anonymous mapping of our own, written within its length, unmapped once.
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            if p == libc::MAP_FAILED {
                exit(70);
            }
            let base = p.cast::<u8>();
            for off in (0..len).step_by(4096) {
                base.add(off).write_volatile(1);
            }
            libc::munmap(p, len);
        }
    }
    println!("fault: {} ms", start.elapsed().as_millis());
}

/// `mib` MiB written to `path` and synced: clean page cache charged to this process's cgroup.
fn write_file(path: &std::path::Path, mib: u64) {
    use std::io::Write;
    let block = vec![0x3c_u8; 1 << 20];
    let mut f = std::fs::File::create(path).unwrap_or_else(|e| {
        eprintln!("{}: {e}", path.display());
        exit(66)
    });
    for _ in 0..mib {
        f.write_all(&block).expect("write");
    }
    f.sync_all().expect("fsync");
}

/// Page cache only: a file larger than the limit read again and again.
fn cache(path: &std::path::Path, mib: u64, secs: u64) {
    use std::io::Read;
    write_file(path, mib);
    let end = std::time::Instant::now() + Duration::from_secs(secs);
    let mut buf = vec![0_u8; 1 << 20];
    let mut passes = 0;
    while std::time::Instant::now() < end {
        let mut f = std::fs::File::open(path).expect("open");
        while f.read(&mut buf).expect("read") > 0 {}
        passes += 1;
    }
    println!("cache: {passes} passes over {mib} MiB");
}

/// Bursts well under the limit, freed each time.
fn bursty(mib: u64, secs: u64) {
    let end = std::time::Instant::now() + Duration::from_secs(secs);
    while std::time::Instant::now() < end {
        let burst: Vec<Vec<u8>> = (0..mib).map(|_| vec![0x77; 1 << 20]).collect();
        thread::sleep(Duration::from_millis(200));
        drop(std::hint::black_box(burst));
        thread::sleep(Duration::from_millis(300));
    }
}

fn main() {
    let cmd = env::args().nth(1).unwrap_or_default();
    match cmd.as_str() {
        "exit" => exit(arg(2) as i32),
        "segv" => {
            let zero = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            // SAFETY: a plain syscall with a valid rlimit.
            unsafe { libc::setrlimit(libc::RLIMIT_CORE, &zero) };
            // SAFETY: Rust's runtime handles SIGSEGV (stack overflow detection) and would ignore a
            // raised one, so the default action comes back first.
            unsafe { libc::signal(libc::SIGSEGV, libc::SIG_DFL) };
            // SAFETY: raising a signal at ourselves, with its default action in place.
            unsafe { libc::raise(libc::SIGSEGV) };
            exit(70)
        }
        "sleep" => {
            thread::sleep(Duration::from_secs(arg(2)));
        }
        "thread-exit" => {
            let code = arg(2) as i32;
            thread::spawn(move || {
                // SAFETY: exit_group ends the whole process; nothing runs after it.
                unsafe { libc::syscall(libc::SYS_exit_group, code) };
            });
            loop {
                thread::park();
            }
        }
        "alloc" => alloc(arg(2)),
        "oom-child" => {
            let mib = arg(2);
            // SAFETY: the child only calls async-signal-safe prctl/write before its own loop.
            match unsafe { libc::fork() } {
                -1 => exit(71),
                0 => {
                    set_comm("oom-victim");
                    let _ = std::fs::write("/proc/self/oom_score_adj", "1000");
                    alloc(mib)
                }
                child => {
                    let mut status = 0;
                    // SAFETY: waiting for our own child.
                    unsafe { libc::waitpid(child, &mut status, 0) };
                    println!("child {child} status {status:#x}");
                    // Stay a little so the test sees the child's death before the parent's exit.
                    thread::sleep(Duration::from_millis(100));
                }
            }
        }
        "oom-sibling" => oom_sibling(arg(2), arg(3)),
        "spin" => {
            for _ in 0..arg(2) {
                // SAFETY: the child exits at once without touching any lock.
                match unsafe { libc::fork() } {
                    -1 => exit(71),
                    // SAFETY: _exit is async-signal-safe.
                    0 => unsafe { libc::_exit(0) },
                    child => {
                        let mut status = 0;
                        // SAFETY: waiting for our own child.
                        unsafe { libc::waitpid(child, &mut status, 0) };
                    }
                }
            }
        }
        "spin-ns" => {
            for _ in 0..arg(2) {
                match fork_new_pid_ns() {
                    -1 => exit(71),
                    // SAFETY: _exit is async-signal-safe.
                    0 => unsafe { libc::_exit(0) },
                    child => {
                        reap(child);
                    }
                }
            }
        }
        "pidns-init" => {
            let argv = self_argv(&["exit", &arg(2).to_string()]);
            match fork_new_pid_ns() {
                -1 => exit(71),
                0 => exec_self(&argv),
                child => {
                    let status = reap(child);
                    println!("child {child} status {status:#x}");
                }
            }
        }
        "mix" => {
            let plain = self_argv(&["exit", "0"]);
            let init = self_argv(&["exit", "1"]);
            for _ in 0..arg(2) {
                // SAFETY: the child only calls execv/_exit.
                match unsafe { libc::fork() } {
                    -1 => exit(71),
                    0 => exec_self(&plain),
                    child => {
                        reap(i64::from(child));
                    }
                }
                match fork_new_pid_ns() {
                    -1 => exit(71),
                    0 => exec_self(&init),
                    child => {
                        reap(child);
                    }
                }
            }
        }
        "leak" => {
            if let Some(file) = env::args().nth(3) {
                write_file(std::path::Path::new(&file), arg(4));
            }
            leak(arg(2))
        }
        "cache" => {
            let file = env::args().nth(2).unwrap_or_else(|| {
                arg(usize::MAX);
                unreachable!()
            });
            cache(std::path::Path::new(&file), arg(3), arg(4));
        }
        "bursty" => bursty(arg(2), arg(3)),
        // plateau <MiB> <KiB/s> <secs>: a heap that grows to its size and stays.
        "plateau" => grow(
            arg(3),
            (arg(2) as usize) << 20,
            Some(std::time::Instant::now() + Duration::from_secs(arg(4))),
        ),
        // fault <MiB> <rounds>: an allocation storm.
        "fault" => fault(arg(2), arg(3)),
        "hog" => loop {
            std::hint::black_box(0u64);
        },
        _ => {
            arg(usize::MAX);
        }
    }
}
