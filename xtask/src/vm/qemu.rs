//! Boots one guest under qemu-system-x86_64 and follows its output, with a deadline.
//!
//! Serial ports: ttyS0 is the kernel's console, written to a log file (read back only to show a
//! panic or the last lines of a guest that failed); ttyS1 is where init.sh writes the steps, read
//! here from qemu's stdout. Kernel messages (OOM kills print a lot) thus never land inside a test's
//! output. `-no-reboot` with `panic=-1` makes a kernel panic end qemu at once.
use std::{
    io::{BufRead, BufReader, Read},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};

use super::report::Ended;

/// How qemu runs the guest's CPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(super) enum Accel {
    /// KVM when a probe guest boots with it, else TCG.
    Auto,
    Kvm,
    /// Software emulation (about 10 to 30 times slower than KVM, works everywhere).
    Tcg,
}

#[derive(Clone, Debug)]
pub(super) struct Machine {
    pub accel: Accel,
    pub smp: u32,
    pub memory: String,
}

impl Machine {
    fn args(&self) -> Vec<String> {
        let (accel, cpu) = match self.accel {
            // The host's CPU model: the guest kernel sees the same features as the host.
            Accel::Kvm => ("kvm", "host"),
            // `max`: every feature TCG can emulate, so a kernel's BPF JIT has what it expects.
            // `thread=single`: every vCPU on one host thread, taking turns. With one thread per
            // vCPU (MTTCG, qemu 7.2), a vCPU running kernel text while the other patches it
            // (text_poke_bp: attaching an fentry program, flipping a static key) hung the guest
            // in soft lockups twice in CI: at `taskstats_exit+0x0` as a test attached its probes,
            // and at a jump label in `bpf_trace_run1`. Taking turns, a write to code is always
            // seen whole by the other vCPU; the guest still has two CPUs, only slower ones.
            Accel::Tcg | Accel::Auto => ("tcg,thread=single", "max"),
        };
        [
            "-accel",
            accel,
            "-cpu",
            cpu,
            "-m",
            &self.memory,
            "-smp",
            &self.smp.to_string(),
            "-nodefaults",
            "-display",
            "none",
            "-no-reboot",
        ]
        .map(str::to_string)
        .to_vec()
    }
}

pub(super) struct Boot<'a> {
    pub kernel: &'a Path,
    pub initrd: &'a Path,
    pub append: String,
    /// Where ttyS0 (the kernel console) is written.
    pub console_log: &'a Path,
    pub timeout: Duration,
}

/// One line qemu printed: the guest's (ttyS1) or qemu's own (stderr).
pub(super) enum Output<'a> {
    Guest(&'a str),
    Qemu(&'a str),
}

/// What the caller wants after a line.
#[derive(PartialEq, Eq)]
pub(super) enum Next {
    Continue,
    /// The guest said it is done: give it a few seconds to power off, then kill it.
    Finishing,
    /// Kill qemu now.
    Stop,
}

pub(super) struct Outcome {
    pub ended: Ended,
    pub took: Duration,
    /// qemu's own error output.
    pub stderr: Vec<String>,
}

enum Msg {
    Guest(String),
    Qemu(String),
    Closed,
}

/// How long a guest that said DONE may take to power off.
const POWEROFF_GRACE: Duration = Duration::from_secs(20);

pub(super) fn boot(
    m: &Machine,
    b: &Boot<'_>,
    mut on_line: impl FnMut(Output<'_>) -> Next,
) -> Result<Outcome> {
    let mut cmd = Command::new("qemu-system-x86_64");
    cmd.args(m.args())
        .arg("-kernel")
        .arg(b.kernel)
        .arg("-initrd")
        .arg(b.initrd)
        .arg("-append")
        .arg(&b.append)
        .arg("-serial")
        .arg(format!("file:{}", b.console_log.display()))
        .args(["-serial", "stdio", "-monitor", "none"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let start = Instant::now();
    let mut child = cmd
        .spawn()
        .with_context(|| format!("starting {cmd:?} (Debian package qemu-system-x86)"))?;
    let (tx, rx) = mpsc::channel();
    let out = child.stdout.take().context("qemu stdout")?;
    let err = child.stderr.take().context("qemu stderr")?;
    let readers = [
        spawn_reader(out, tx.clone(), Msg::Guest),
        spawn_reader(err, tx, Msg::Qemu),
    ];
    let mut deadline = start + b.timeout;
    let mut open = 2;
    let mut stderr = Vec::new();
    let mut ended = Ended::Exited;
    while open > 0 {
        let left = deadline.saturating_duration_since(Instant::now());
        let next = match rx.recv_timeout(left) {
            Ok(Msg::Guest(l)) => on_line(Output::Guest(&l)),
            Ok(Msg::Qemu(l)) => {
                let n = on_line(Output::Qemu(&l));
                stderr.push(l);
                n
            }
            Ok(Msg::Closed) => {
                open -= 1;
                Next::Continue
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if deadline >= start + b.timeout {
                    ended = Ended::TimedOut(b.timeout);
                }
                Next::Stop
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        };
        match next {
            Next::Continue => {}
            Next::Finishing => deadline = deadline.min(Instant::now() + POWEROFF_GRACE),
            Next::Stop => {
                kill(&mut child);
                break;
            }
        }
    }
    let status = child.wait().context("waiting for qemu")?;
    for r in readers {
        let _ = r.join();
    }
    let took = start.elapsed();
    if ended == Ended::Exited && !status.success() {
        // qemu itself failed (bad option, no such file, KVM refused): its stderr says why.
        stderr.push(format!("qemu exited with {status}"));
    }
    Ok(Outcome {
        ended,
        took,
        stderr,
    })
}

fn kill(child: &mut Child) {
    // Our own child, by its pid.
    let _ = child.kill();
}

fn spawn_reader<R: Read + Send + 'static>(
    r: R,
    tx: mpsc::Sender<Msg>,
    wrap: fn(String) -> Msg,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut r = BufReader::new(r);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match r.read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let line = String::from_utf8_lossy(&buf).into_owned();
                    if tx.send(wrap(line)).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = tx.send(Msg::Closed);
    })
}

/// How long a KVM guest may take to reach init. One that works gets there in a few seconds (the
/// same kernel under software emulation in about 7); where nested KVM is broken the guest prints
/// nothing at all, and every VM phase waited this long for it (60 s until 2026-12-07).
const KVM_PROBE_TIMEOUT: Duration = Duration::from_secs(20);

/// Whether KVM really runs a guest here: /dev/kvm can exist and still fail (nested virtualization
/// without the features a guest needs: "KVM internal error ... emulation failure", or an MSR
/// error with `-cpu host`). So boot the real kernel and initramfs with `observer.vm=probe`, whose
/// init prints one line and powers off, and see.
pub(super) fn kvm_works(m: &Machine, kernel: &Path, initrd: &Path, log: &Path) -> (bool, String) {
    if let Err(e) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
    {
        return (false, format!("/dev/kvm: {e}"));
    }
    let probe = Machine {
        accel: Accel::Kvm,
        smp: 1,
        memory: m.memory.clone(),
    };
    let mut ok = false;
    let mut why = String::new();
    let boot = Boot {
        kernel,
        initrd,
        append: "console=ttyS0 rdinit=/init panic=-1 observer.vm=probe".into(),
        console_log: log,
        timeout: KVM_PROBE_TIMEOUT,
    };
    let result = super::qemu::boot(&probe, &boot, |line| match line {
        Output::Guest(l) if l.contains("PROBE ok") => {
            ok = true;
            Next::Finishing
        }
        Output::Qemu(l) => {
            if why.is_empty() {
                why = l.trim().to_string();
            }
            // qemu pauses the guest on an emulation failure instead of exiting.
            if l.contains("KVM internal error") || l.contains("emulation failure") {
                Next::Stop
            } else {
                Next::Continue
            }
        }
        Output::Guest(_) => Next::Continue,
    });
    match result {
        Ok(o) if ok => (
            true,
            format!("probe guest booted in {:.1} s", o.took.as_secs_f64()),
        ),
        Ok(o) if matches!(o.ended, Ended::TimedOut(_)) => (
            false,
            format!(
                "probe guest did not reach init in {} s",
                KVM_PROBE_TIMEOUT.as_secs()
            ),
        ),
        Ok(_) => (
            false,
            if why.is_empty() {
                "probe guest did not reach init".into()
            } else {
                why
            },
        ),
        Err(e) => (false, format!("{e:#}")),
    }
}

/// The kernel's panic line in a console log, if it panicked.
pub(super) fn panic_line(console_log: &Path) -> Option<String> {
    let text = std::fs::read(console_log).ok()?;
    let text = String::from_utf8_lossy(&text);
    text.lines()
        .find(|l| l.contains("Kernel panic"))
        .map(|l| l.trim().to_string())
}

/// The last `n` lines of a log file.
pub(super) fn tail(path: &Path, n: usize) -> Vec<String> {
    let text = std::fs::read(path).unwrap_or_default();
    let text = String::from_utf8_lossy(&text);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..]
        .iter()
        .map(|l| l.to_string())
        .collect()
}

/// Where qemu is, for the error message when it is not.
pub(super) fn qemu_path() -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|d| d.join("qemu-system-x86_64"))
        .find(|p| p.is_file())
}
