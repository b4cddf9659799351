//! `cargo xtask vm-test`: the kernel and PLEG suites inside virtual machines, on the kernels and
//! cgroup setups real nodes run.
//!
//! For each kernel × cgroup mode: one qemu guest boots the kernel with the initramfs of
//! [`initramfs`] (the same for every kernel), its /init (init.sh) mounts the cgroup setup the
//! command line names, runs `observer check`, then the kernel and PLEG test executables with
//! `CI=true` (nothing may skip), and powers off. The host prints the suites' libtest output as it
//! comes (so this command's output is the test runner's own), judges each guest
//! ([`report::judge`]) and prints the matrix ([`report::render_matrix`]). Exit status: non-zero
//! if any guest failed, hung past `--timeout`, or panicked.
//!
//! Kernels come from Debian's packages through scripts/vm-kernels.sh (a flavour name: `amd64`,
//! `cloud-amd64`, `rt-amd64`, `6.12:amd64`), or from a user: a vmlinuz path or a kernel .deb.
//! Guests run one after the other: on two cores a second guest only slows the first.
mod initramfs;
mod qemu;
pub(crate) mod report;

use std::{
    collections::BTreeMap,
    fs,
    io::Write as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use report::{Cell, Line, Mode, Parser, Row, Verdict};

use crate::root;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// A kernel to boot (repeatable): a Debian flavour bookworm packages (`amd64`,
    /// `cloud-amd64`, `rt-amd64`; `6.12:amd64` for the 6.12 series; `amd64@6.1.0-57` pins an ABI),
    /// `host` (/boot/vmlinuz-$(uname -r)), a vmlinuz file, or a kernel .deb. Default: amd64.
    #[arg(long = "kernel", value_name = "KERNEL")]
    kernels: Vec<String>,
    /// A cgroup setup (repeatable). Default: v2.
    #[arg(long = "cgroup", value_enum, value_name = "MODE")]
    modes: Vec<Mode>,
    /// The whole matrix: bookworm's 6.1 generic, cloud and PREEMPT_RT kernels and the host's own,
    /// each with v2, hybrid and v1.
    #[arg(long)]
    all: bool,
    /// Per-guest deadline in seconds; a guest still running then is killed and fails.
    #[arg(long, default_value_t = 1200)]
    timeout: u64,
    #[arg(long, value_enum, default_value = "auto")]
    accel: qemu::Accel,
    /// Guest CPUs (qemu -smp). Under TCG each is one host thread.
    #[arg(long, default_value_t = 2)]
    smp: u32,
    /// Guest memory (qemu -m).
    #[arg(long, default_value = "2G")]
    memory: String,
    /// libtest --test-threads inside the guest.
    #[arg(long, default_value_t = 2)]
    test_threads: u32,
    /// Only the tests whose name contains this (a libtest filter, one word), in both suites.
    #[arg(long)]
    filter: Option<String>,
    /// Also run this benchmark of tests/benches/ in each guest, after the suites (repeatable;
    /// its tables are printed as they come; `--filter nothing` leaves the suites out). It must
    /// need no disk filesystem: the guest has none.
    #[arg(long = "bench", value_name = "BENCH")]
    benches: Vec<String>,
    /// Environment for the benchmark, `NAME=VALUE` (e.g. OBSERVER_PRESSURE_RUNS=5; repeatable).
    #[arg(long = "bench-env", value_name = "NAME=VALUE", requires = "benches")]
    bench_env: Vec<String>,
    /// Also write the matrix (markdown) to this file.
    #[arg(long)]
    matrix: Option<PathBuf>,
    /// Replace the matrix in README.md (between its vm-matrix markers) with this run's.
    #[arg(long)]
    update_readme: bool,
}

/// Where kernels, the initramfs and guest logs live.
fn cache() -> PathBuf {
    std::env::var_os("OBSERVER_VM_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target/vm"))
}

/// The kernels `--all` boots: bookworm's 6.1 flavours. The host's own is added beside them.
const MATRIX_KERNELS: [&str; 3] = ["amd64", "cloud-amd64", "rt-amd64"];

/// A kernel ready to boot.
struct Kernel {
    /// How the matrix names it before the guest says its `uname -r`.
    label: String,
    /// What kind of kernel, from its package name: generic, cloud, PREEMPT_RT.
    flavour: Option<&'static str>,
    vmlinuz: PathBuf,
}

pub(crate) fn run(args: Args) -> Result<()> {
    if !nix_is_root() {
        bail!("vm-test must run as root (it installs kernel packages with apt)");
    }
    if qemu::qemu_path().is_none() {
        bail!(
            "qemu-system-x86_64 not found: scripts/bootstrap.sh installs Debian's qemu-system-x86"
        );
    }
    let mut specs = Vec::new();
    let mut modes = args.modes.clone();
    if args.all {
        specs.extend(MATRIX_KERNELS.map(String::from));
        modes.extend(Mode::ALL);
    }
    specs.extend(args.kernels.iter().cloned());
    if args.all {
        specs.push("host".into());
    }
    if specs.is_empty() {
        specs.push("amd64".into());
    }
    if modes.is_empty() {
        modes.push(Mode::V2);
    }
    dedup(&mut specs);
    modes.sort();
    modes.dedup();

    let dir = cache();
    fs::create_dir_all(dir.join("logs"))?;
    let (kernels, mut rows) = resolve_kernels(&specs, &dir, args.all)?;

    let payload = build_payload(&args.benches)?;
    let initrd = dir.join("initramfs.cpio");
    let size = initramfs::build(&payload, &initrd, &dir.join("stripped"))?;
    println!(
        "vm-test: initramfs {} ({:.1} MiB)",
        initrd.display(),
        size as f64 / (1 << 20) as f64
    );

    let mut machine = qemu::Machine {
        accel: args.accel,
        smp: args.smp,
        memory: args.memory.clone(),
    };
    if machine.accel == qemu::Accel::Auto {
        let first = kernels.first().context("no kernel to boot")?;
        let (ok, why) = qemu::kvm_works(
            &machine,
            &first.vmlinuz,
            &initrd,
            &dir.join("logs/kvm-probe.console"),
        );
        machine.accel = if ok {
            qemu::Accel::Kvm
        } else {
            qemu::Accel::Tcg
        };
        println!(
            "vm-test: {} ({why})",
            if ok {
                "KVM works: using it"
            } else {
                "KVM does not work here: software emulation (TCG)"
            }
        );
    }

    let mut totals = (0u32, 0u32);
    for k in &kernels {
        let mut row = Row {
            kernel: k.label.clone(),
            cells: BTreeMap::new(),
            notes: Vec::new(),
        };
        for &mode in &modes {
            let guest = run_guest(&machine, k, mode, &initrd, &args, &dir)?;
            if let Some(release) = &guest.run.release {
                row.kernel = kernel_label(release, guest.run.version.as_deref(), k.flavour);
            }
            for n in report::kernel_notes(&guest.run) {
                if !row.notes.contains(&n) {
                    row.notes.push(n);
                }
            }
            match &guest.verdict {
                Verdict::Pass { tests } => totals.0 += tests,
                Verdict::Refused => {}
                Verdict::Fail(_) => totals.1 += 1,
            }
            row.cells.insert(
                mode,
                Cell::Ran {
                    verdict: guest.verdict,
                    took: guest.took,
                },
            );
        }
        rows.insert(
            rows.len().saturating_sub(usize::from(host_row_last(&rows))),
            row,
        );
    }

    let accel = match machine.accel {
        qemu::Accel::Kvm => "KVM",
        _ => "TCG (software emulation, vCPUs taking turns on one thread)",
    };
    let matrix = report::render_matrix(&rows);
    // The command as given, less the options that only say where the table goes.
    let command = shown_command(std::env::args().skip(1));
    let caption = format!(
        "`cargo xtask {}`: qemu {accel}, {} vCPU, {} memory, on a 2-core host; time per guest is boot to power-off.\n",
        command.join(" "),
        machine.smp,
        machine.memory
    );
    println!("\n{matrix}\n{caption}");
    fs::write(dir.join("matrix.md"), format!("{matrix}\n{caption}"))?;
    if let Some(path) = &args.matrix {
        fs::write(path, format!("{matrix}\n{caption}"))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if args.update_readme {
        update_readme(&root().join("README.md"), &format!("{matrix}\n{caption}"))?;
    }
    let failed: Vec<String> = rows
        .iter()
        .flat_map(|r| {
            r.cells
                .iter()
                .filter(|(_, c)| c.failed())
                .map(move |(m, _)| format!("{} / {}", r.kernel, m.as_str()))
        })
        .collect();
    // The closing line CI reads: tests passed in all guests, and failed guests.
    println!("vm-test: {} passed, {} failed", totals.0, totals.1);
    if !failed.is_empty() {
        bail!("{} guest(s) failed: {}", failed.len(), failed.join(", "));
    }
    Ok(())
}

/// The command line as the README shows it: without `--update-readme` and `--matrix FILE`, which
/// only say where the table goes.
fn shown_command(args: impl Iterator<Item = String>) -> Vec<String> {
    let mut out = Vec::new();
    let mut skip_next = false;
    for a in args {
        if std::mem::take(&mut skip_next) {
            continue;
        }
        if a == "--matrix" {
            skip_next = true;
        } else if a != "--update-readme" && !a.starts_with("--matrix=") {
            out.push(a);
        }
    }
    out
}

/// The host row, when present, stays last.
fn host_row_last(rows: &[Row]) -> bool {
    rows.last().is_some_and(|r| r.kernel.contains("(this host"))
}

fn dedup(v: &mut Vec<String>) {
    let mut seen = std::collections::HashSet::new();
    v.retain(|s| seen.insert(s.clone()));
}

/// Owner of /proc/self is this process's effective uid.
fn nix_is_root() -> bool {
    fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
        .unwrap_or(false)
}

/// Resolves every `--kernel`: Debian flavours through scripts/vm-kernels.sh (one call for all),
/// files as they are, .debs unpacked. Returns the kernels to boot, and the matrix rows of kernels
/// that cannot be booted here (the host's, when it has no image file).
fn resolve_kernels(specs: &[String], dir: &Path, all: bool) -> Result<(Vec<Kernel>, Vec<Row>)> {
    let mut kernels = Vec::new();
    let mut rows = Vec::new();
    let is_file = |s: &str| s.contains('/') || s.ends_with(".deb") || Path::new(s).exists();
    let flavours: Vec<&String> = specs
        .iter()
        .filter(|s| s.as_str() != "host" && !is_file(s))
        .collect();
    let mut debian = BTreeMap::new();
    if !flavours.is_empty() {
        let out = Command::new(root().join("scripts/vm-kernels.sh"))
            .args(&flavours)
            .env("OBSERVER_VM_CACHE", dir)
            .stderr(Stdio::inherit())
            .output()
            .context("running scripts/vm-kernels.sh")?;
        if !out.status.success() {
            bail!("scripts/vm-kernels.sh {flavours:?} failed: {}", out.status);
        }
        // One `<package> <vmlinuz>` line per flavour, in order.
        let text = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<(&str, &str)> = text.lines().filter_map(|l| l.split_once(' ')).collect();
        if lines.len() != flavours.len() {
            bail!("scripts/vm-kernels.sh printed {text:?} for {flavours:?}");
        }
        for (spec, (pkg, vmlinuz)) in flavours.iter().zip(lines) {
            debian.insert(spec.to_string(), (pkg.to_string(), PathBuf::from(vmlinuz)));
        }
    }
    for spec in specs {
        if let Some((pkg, vmlinuz)) = debian.remove(spec) {
            kernels.push(Kernel {
                label: pkg.clone(),
                flavour: flavour_of(&pkg),
                vmlinuz,
            });
        } else if spec == "host" {
            let release = fs::read_to_string("/proc/sys/kernel/osrelease")
                .context("reading the host's kernel release")?
                .trim()
                .to_string();
            let image = PathBuf::from(format!("/boot/vmlinuz-{release}"));
            if image.is_file() {
                kernels.push(Kernel {
                    label: format!("{release} (this host's kernel)"),
                    flavour: None,
                    vmlinuz: image,
                });
            } else if all {
                rows.push(host_row(&release, &image));
            } else {
                bail!(
                    "the host's kernel {release} has no image at {} to boot; its tests are the host suite (scripts/test.sh)",
                    image.display()
                );
            }
        } else if !Path::new(spec).is_file() {
            bail!("kernel {spec}: no such file");
        } else if spec.ends_with(".deb") {
            kernels.push(unpack_deb(Path::new(spec), dir)?);
        } else {
            let p = PathBuf::from(spec);
            kernels.push(Kernel {
                label: p
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_else(|| spec.clone()),
                flavour: None,
                vmlinuz: p,
            });
        }
    }
    Ok((kernels, rows))
}

/// The host's kernel has no image file (e.g. a firecracker guest, whose kernel is handed over by
/// the VMM): the matrix says so, and points at the suite that does run on it.
fn host_row(release: &str, image: &Path) -> Row {
    let mode = host_cgroup_mode();
    let cells = Mode::ALL
        .into_iter()
        .map(|m| {
            let text = if Some(m) == mode {
                "host suite: `scripts/test.sh` runs the kernel and PLEG suites on it".to_string()
            } else {
                "not bootable: no image file".to_string()
            };
            (m, Cell::Text(text))
        })
        .collect();
    Row {
        kernel: format!("`{release}` (this host; no {} to boot)", image.display()),
        cells,
        notes: vec!["the host runs this cgroup mode only".into()],
    }
}

/// v2, hybrid or v1, from this process's mounts.
fn host_cgroup_mode() -> Option<Mode> {
    cgroup_mode_of(&fs::read_to_string("/proc/self/mountinfo").ok()?)
}

/// v1 hierarchies without a controller (systemd's `name=systemd`) do not make a node hybrid.
fn cgroup_mode_of(text: &str) -> Option<Mode> {
    let fstype = |l: &str| {
        l.split_once(" - ")
            .and_then(|(_, r)| r.split_whitespace().next())
            .map(str::to_string)
    };
    let v2 = text
        .lines()
        .any(|l| fstype(l).as_deref() == Some("cgroup2"));
    let v1 = text.lines().any(|l| {
        fstype(l).as_deref() == Some("cgroup")
            && !l.contains("name=systemd")
            && !l.contains("none,")
    });
    Some(match (v2, v1) {
        (true, false) => Mode::V2,
        (true, true) => Mode::Hybrid,
        (false, true) => Mode::V1,
        (false, false) => return None,
    })
}

fn flavour_of(pkg: &str) -> Option<&'static str> {
    let p = pkg.trim_end_matches("-unsigned");
    if p.ends_with("-rt-amd64") {
        Some("PREEMPT_RT")
    } else if p.ends_with("-cloud-amd64") {
        Some("cloud")
    } else if p.ends_with("-amd64") {
        Some("generic")
    } else {
        None
    }
}

/// `6.1.0-57-amd64 (Debian 6.1.192-3, generic)` from the guest's uname and /proc/version.
fn kernel_label(release: &str, version: Option<&str>, flavour: Option<&str>) -> String {
    let debian = version.and_then(|v| {
        v.split(" Debian ")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
    });
    let parts: Vec<String> = debian
        .map(|d| format!("Debian {d}"))
        .into_iter()
        .chain(flavour.map(str::to_string))
        .collect();
    if parts.is_empty() {
        format!("`{release}`")
    } else {
        format!("`{release}` ({})", parts.join(", "))
    }
}

/// A kernel .deb (Debian's or Ubuntu's linux-image-*): only its boot/ is unpacked.
fn unpack_deb(deb: &Path, dir: &Path) -> Result<Kernel> {
    let stem = deb
        .file_stem()
        .context("a .deb path without a file name")?
        .to_string_lossy()
        .into_owned();
    let dest = dir.join("kernels").join(&stem);
    let find = |dest: &Path| -> Option<PathBuf> {
        fs::read_dir(dest.join("boot"))
            .ok()?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("vmlinuz-"))
            })
    };
    if find(&dest).is_none() {
        fs::create_dir_all(&dest)?;
        let status = Command::new("sh")
            .args([
                "-c",
                r#"dpkg-deb --fsys-tarfile "$1" | tar -x -C "$2" --wildcards './boot/*'"#,
                "sh",
            ])
            .arg(deb)
            .arg(&dest)
            .status()
            .context("running dpkg-deb")?;
        if !status.success() {
            bail!("unpacking boot/ of {} failed: {status}", deb.display());
        }
    }
    let vmlinuz = find(&dest).with_context(|| {
        format!(
            "{} has no boot/vmlinuz-*: not a kernel image package",
            deb.display()
        )
    })?;
    Ok(Kernel {
        label: stem.clone(),
        flavour: flavour_of(stem.split('_').next().unwrap_or(&stem)),
        vmlinuz,
    })
}

/// Builds `observer`, the kernel and PLEG test executables and `observer-workload` (release, as
/// scripts/test.sh builds them, so CI builds nothing twice), and finds them in cargo's output.
fn build_payload(benches: &[String]) -> Result<initramfs::Payload> {
    let observer = cargo_artifacts(&["build", "--release", "-p", "observer"])?
        .into_iter()
        .find(|(name, _)| name == "observer")
        .context("cargo built no `observer` executable")?
        .1;
    // The workspace's default members, as the host suite selects them: another selection
    // resolves other features for shared dependencies and builds the agent and the test crate again.
    let tests = cargo_artifacts(&[
        "test",
        "--release",
        "--test",
        "kernel",
        "--test",
        "pleg",
        "--test",
        "oom",
        "--test",
        "pressure",
        "--no-run",
    ])?;
    let find = |n: &str| {
        tests
            .iter()
            .find(|(name, _)| name == n)
            .map(|(_, p)| p.clone())
            .with_context(|| format!("cargo built no `{n}` executable"))
    };
    let mut suites = vec![
        ("kernel".into(), find("kernel")?),
        ("pleg".into(), find("pleg")?),
        ("oom".into(), find("oom")?),
        ("pressure".into(), find("pressure")?),
    ];
    if !benches.is_empty() {
        // The same selection again: `cargo bench` builds the test crate at its own opt-level.
        let mut args = vec!["bench", "--no-run"];
        for b in benches {
            args.extend(["--bench", b.as_str()]);
        }
        let built = cargo_artifacts(&args)?;
        for b in benches {
            let exe = built
                .iter()
                .find(|(name, _)| name == b)
                .with_context(|| format!("cargo built no `{b}` benchmark"))?
                .1
                .clone();
            suites.push((format!("bench-{b}"), exe));
        }
    }
    let busybox = ["/bin/busybox", "/usr/bin/busybox"]
        .map(PathBuf::from)
        .into_iter()
        .find(|p| p.is_file())
        .context("busybox not found (Debian package busybox-static)")?;
    Ok(initramfs::Payload {
        busybox,
        observer,
        workload: find("observer-workload")?,
        suites,
    })
}

/// Runs cargo with `--message-format=json-render-diagnostics`; returns (target name, executable)
/// of every artifact with an executable.
fn cargo_artifacts(args: &[&str]) -> Result<Vec<(String, PathBuf)>> {
    let out = Command::new("cargo")
        .args(args)
        .arg("--message-format=json-render-diagnostics")
        .current_dir(root())
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running cargo {args:?}"))?;
    if !out.status.success() {
        bail!("cargo {args:?} failed: {}", out.status);
    }
    Ok(parse_artifacts(&String::from_utf8_lossy(&out.stdout)))
}

fn parse_artifacts(json_lines: &str) -> Vec<(String, PathBuf)> {
    json_lines
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["reason"] == "compiler-artifact")
        .filter_map(|v| {
            let exe = v["executable"].as_str()?;
            let name = v["target"]["name"].as_str()?;
            Some((name.to_string(), PathBuf::from(exe)))
        })
        .collect()
}

struct Guest {
    run: report::GuestRun,
    verdict: Verdict,
    took: Duration,
}

/// The kernel command line of a guest.
fn append(mode: Mode, args: &Args) -> String {
    let mut a = vec![
        "console=ttyS0".to_string(),
        "rdinit=/init".into(),
        // A panic ends the guest at once (with qemu's -no-reboot) instead of hanging to the deadline.
        "panic=-1".into(),
        format!("observer.cgroup={}", mode.as_str()),
        format!("observer.threads={}", args.test_threads),
    ];
    if mode == Mode::V2 {
        // What a unified node boots with: no controller can be taken by a v1 hierarchy.
        a.push("cgroup_no_v1=all".into());
    }
    if let Some(f) = &args.filter {
        a.push(format!("observer.filter={f}"));
    }
    a.extend(args.benches.iter().map(|b| format!("observer.bench={b}")));
    a.extend(
        args.bench_env
            .iter()
            .map(|e| format!("observer.bench_env={e}")),
    );
    a.join(" ")
}

fn run_guest(
    machine: &qemu::Machine,
    k: &Kernel,
    mode: Mode,
    initrd: &Path,
    args: &Args,
    dir: &Path,
) -> Result<Guest> {
    let name = format!(
        "{}-{}",
        k.vmlinuz
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        mode.as_str()
    );
    let console = dir.join("logs").join(format!("{name}.console"));
    let out_log = dir.join("logs").join(format!("{name}.out"));
    let mut out = fs::File::create(&out_log)?;
    println!(
        "\n===== vm-test: {} with cgroup {} =====",
        k.label,
        mode.as_str()
    );
    let mut parser = Parser::default();
    let start = Instant::now();
    let boot = qemu::Boot {
        kernel: &k.vmlinuz,
        initrd,
        append: append(mode, args),
        console_log: &console,
        timeout: Duration::from_secs(args.timeout),
    };
    let outcome = qemu::boot(machine, &boot, |line| {
        let text = match &line {
            qemu::Output::Guest(l) | qemu::Output::Qemu(l) => *l,
        };
        let _ = out.write_all(text.as_bytes());
        if let qemu::Output::Qemu(l) = line {
            eprint!("qemu: {l}");
            return qemu::Next::Continue;
        }
        let t = start.elapsed().as_secs();
        match parser.feed(text) {
            Line::Begin(step) => println!("----- [{t:>4} s] {step} -----"),
            Line::End(step, rc) => println!("----- [{t:>4} s] {step}: exit code {rc} -----"),
            Line::Output(l) => println!("{l}"),
            Line::Done => return qemu::Next::Finishing,
            Line::Other => {}
        }
        qemu::Next::Continue
    })?;
    let run = parser.finish();
    let panic = qemu::panic_line(&console);
    let mut verdict = report::judge(mode, &outcome.ended, &run, panic.as_deref());
    if run.steps.is_empty() {
        if let Some(err) = outcome.stderr.iter().rev().find(|l| !l.trim().is_empty()) {
            verdict = Verdict::Fail(format!("qemu: {}", err.trim()));
        }
    }
    let secs = outcome.took.as_secs();
    match &verdict {
        Verdict::Pass { tests } => println!("===== pass: {tests} tests in {secs} s ====="),
        Verdict::Refused => {
            println!("===== clear refusal, as expected on cgroup v1 only, in {secs} s =====")
        }
        Verdict::Fail(why) => {
            println!("===== FAIL after {secs} s: {why} =====");
            println!("last lines of the kernel console ({}):", console.display());
            for l in qemu::tail(&console, 40) {
                println!("  {l}");
            }
        }
    }
    Ok(Guest {
        run,
        verdict,
        took: outcome.took,
    })
}

const README_BEGIN: &str = "<!-- vm-matrix: cargo xtask vm-test --all --update-readme -->";
const README_END: &str = "<!-- /vm-matrix -->";

/// Puts `matrix` between the README's markers.
fn update_readme(path: &Path, matrix: &str) -> Result<()> {
    let text = fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let updated = replace_between(&text, README_BEGIN, README_END, matrix).with_context(|| {
        format!(
            "{} has no `{README_BEGIN}` … `{README_END}` block",
            path.display()
        )
    })?;
    fs::write(path, updated).with_context(|| format!("writing {}", path.display()))
}

fn replace_between(text: &str, begin: &str, end: &str, body: &str) -> Option<String> {
    let (head, rest) = text.split_once(begin)?;
    let (_, tail) = rest.split_once(end)?;
    Some(format!("{head}{begin}\n{}\n{end}{tail}", body.trim_end()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn artifacts_from_cargo_json() {
        let json = r#"{"reason":"compiler-artifact","target":{"name":"kernel","kind":["test"]},"executable":"/t/release/deps/kernel-abc"}
{"reason":"compiler-artifact","target":{"name":"observer_tests","kind":["lib"]},"executable":null}
{"reason":"build-finished","success":true}
not json"#;
        assert_eq!(
            parse_artifacts(json),
            [(
                "kernel".to_string(),
                PathBuf::from("/t/release/deps/kernel-abc")
            )]
        );
    }

    #[test]
    fn labels_name_debian_version_and_flavour() {
        assert_eq!(
            flavour_of("linux-image-6.1.0-57-rt-amd64-unsigned"),
            Some("PREEMPT_RT")
        );
        assert_eq!(
            flavour_of("linux-image-6.1.0-57-cloud-amd64-unsigned"),
            Some("cloud")
        );
        assert_eq!(flavour_of("linux-image-6.1.0-57-amd64"), Some("generic"));
        assert_eq!(flavour_of("vmlinuz-5.15.0-91-generic"), None);
        let v = "Linux version 6.1.0-57-amd64 (debian-kernel@lists.debian.org) (gcc-12) #1 SMP PREEMPT_DYNAMIC Debian 6.1.192-3 (2026-11-20)";
        assert_eq!(
            kernel_label("6.1.0-57-amd64", Some(v), Some("generic")),
            "`6.1.0-57-amd64` (Debian 6.1.192-3, generic)"
        );
        assert_eq!(
            kernel_label("5.15.0-91-generic", Some("Linux version 5.15.0"), None),
            "`5.15.0-91-generic`"
        );
    }

    #[test]
    fn v2_guests_boot_without_v1_controllers() {
        let args = Args {
            kernels: vec![],
            modes: vec![],
            all: false,
            timeout: 1,
            accel: qemu::Accel::Tcg,
            smp: 1,
            memory: "1G".into(),
            test_threads: 1,
            filter: Some("oom".into()),
            benches: vec!["pressure".into(), "kernel".into()],
            bench_env: vec!["OBSERVER_PRESSURE_RUNS=5".into()],
            matrix: None,
            update_readme: false,
        };
        let a = append(Mode::V2, &args);
        assert!(
            a.contains("observer.cgroup=v2") && a.contains("cgroup_no_v1=all"),
            "{a}"
        );
        assert!(a.contains("observer.filter=oom"));
        assert!(
            a.contains("observer.bench=pressure observer.bench=kernel observer.bench_env=OBSERVER_PRESSURE_RUNS=5"),
            "{a}"
        );
        let h = append(Mode::Hybrid, &args);
        assert!(!h.contains("cgroup_no_v1") && h.contains("observer.cgroup=hybrid"));
    }

    #[test]
    fn shown_command_drops_where_the_table_goes() {
        let args = [
            "vm-test",
            "--all",
            "--matrix",
            "m.md",
            "--update-readme",
            "--matrix=x",
            "--smp",
            "2",
        ];
        assert_eq!(
            shown_command(args.into_iter().map(String::from)),
            ["vm-test", "--all", "--smp", "2"]
        );
    }

    #[test]
    fn cgroup_mode_from_mountinfo() {
        let v2 = "30 23 0:25 / /sys/fs/cgroup rw,relatime - cgroup2 cgroup2 rw,nsdelegate\n";
        let systemd = "31 30 0:26 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,name=systemd\n";
        let memory = "35 30 0:30 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n";
        assert_eq!(cgroup_mode_of(v2), Some(Mode::V2));
        assert_eq!(cgroup_mode_of(&format!("{systemd}{v2}")), Some(Mode::V2));
        assert_eq!(
            cgroup_mode_of(&format!("{systemd}{memory}{v2}")),
            Some(Mode::Hybrid)
        );
        assert_eq!(
            cgroup_mode_of(&format!("{systemd}{memory}")),
            Some(Mode::V1)
        );
        assert_eq!(cgroup_mode_of("1 0 0:1 / / rw - ext4 /dev/vda rw\n"), None);
    }

    #[test]
    fn readme_block_is_replaced_in_place() {
        let text = format!("a\n{README_BEGIN}\nold\n{README_END}\nb\n");
        assert_eq!(
            replace_between(&text, README_BEGIN, README_END, "new\n").unwrap(),
            format!("a\n{README_BEGIN}\nnew\n{README_END}\nb\n")
        );
        assert!(replace_between("no markers", README_BEGIN, README_END, "x").is_none());
    }
}
