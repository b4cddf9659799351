//! Further nodes, each a Debian bookworm guest under qemu (software emulation: KVM does not work
//! on these machines), shaped like production nodes where the host is not: systemd as PID 1,
//! cgroup v2 only, containerd 2.x with `SystemdCgroup = true` and kubelet's systemd cgroup
//! driver. The same kubelet binary as the host node, its own name and certificates from the
//! cluster's CA.
//!
//! Networking stays on this machine: qemu's user network with `restrict=on` (the guest reaches
//! nothing but what is forwarded) and one forward, guest 10.0.2.100:6443 → the API server on the
//! host's loopback (`guestfwd`, each connection relayed by a `socat` qemu starts). Inside the
//! guest, systemd listens on 127.0.0.1:6443 and relays to 10.0.2.100:6443, so the guest's
//! kubelet and the DaemonSet's agent name the API server as the host node's do (127.0.0.1:6443,
//! which the serving certificate carries). Nothing forwards into the guest: the host reaches it
//! only through qemu's guest agent on a virtio serial port ([`qga`]), and the API server is never
//! asked to dial the guest's node address (10.0.2.15): kubelet serves on the guest's loopback.
//!
//! The guest's root disk is the cached image ([`image`]), opened `snapshot=on` (its writes go to
//! a temporary file qemu deletes), so stopping qemu leaves nothing behind; a second, read-only
//! disk (the seed, made with `mke2fs -d` at each start) carries containerd, kubelet, the
//! certificates and the configuration, and the guest's `observer-node.service` starts from it.
pub mod image;
pub mod qga;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::{daemon, pki, Cluster, Error, Result, APISERVER_PORT};
use image::{APISERVER_FORWARD, GUEST_ADDRESS};

/// The second node's name (kubelet's `--hostname-override` and the guest's hostname).
pub const GUEST_NODE_NAME: &str = "observer-node-2";
/// How long a guest may take to boot, and then to register its node, under emulation.
const BOOT_TIMEOUT: Duration = Duration::from_secs(600);
const JOIN_TIMEOUT: Duration = Duration::from_secs(600);
/// Memory and CPUs of a guest.
const MEMORY: &str = "3G";
const CPUS: u32 = 2;
/// Where containerd listens in the guest (its default).
pub const GUEST_CONTAINERD_SOCKET: &str = "/run/containerd/containerd.sock";

/// The name of the `n`th node (1 is the host's).
pub fn node_name(n: usize) -> String {
    if n <= 1 {
        crate::NODE_NAME.to_string()
    } else {
        format!("observer-node-{n}")
    }
}

/// How long a guest took to start.
#[derive(Debug, Clone, Copy)]
pub struct Started {
    /// qemu started → the guest agent answers (systemd has started its units).
    pub boot: Duration,
    /// The guest agent answers → the node registered with its runtime's version.
    pub join: Duration,
}

/// One guest node of a cluster.
pub struct Guest<'a> {
    cluster: &'a Cluster,
    pub name: String,
}

impl<'a> Guest<'a> {
    pub fn new(cluster: &'a Cluster, name: &str) -> Self {
        Self {
            cluster,
            name: name.into(),
        }
    }

    /// Every guest of the cluster that has a directory (started, or left by a crash).
    pub fn all(cluster: &'a Cluster) -> Vec<Guest<'a>> {
        let mut names: Vec<String> = fs::read_dir(nodes_dir(cluster))
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names.iter().map(|n| Guest::new(cluster, n)).collect()
    }

    fn dir(&self) -> PathBuf {
        nodes_dir(self.cluster).join(&self.name)
    }

    fn component(&self) -> String {
        format!("qemu-{}", self.name)
    }

    /// The guest agent's socket (see [`qga`]).
    pub fn agent_socket(&self) -> PathBuf {
        self.dir().join("qga.sock")
    }

    /// The guest's kernel console (and systemd's status lines).
    pub fn console_log(&self) -> PathBuf {
        self.cluster
            .logs()
            .join(format!("{}-console.log", self.name))
    }

    pub fn is_running(&self) -> bool {
        daemon::running(self.cluster.dir(), &self.component()).is_some()
    }

    /// Builds what is missing (containerd, the image), boots the guest and waits until its
    /// node is registered. The host's control plane must be up.
    pub fn start(&self) -> Result<Started> {
        let c = self.cluster;
        crate::build::ensure_containerd(&c.workspace, c.dir(), crate::versions::Containerd::V2)?;
        let image = image::ensure(&c.dir().join("guest/image"))?;
        if self.is_running() {
            self.stop()?;
        }
        let dir = self.dir();
        if dir.exists() {
            fs::remove_dir_all(&dir).map_err(Error::io(&dir))?;
        }
        fs::create_dir_all(&dir).map_err(Error::io(&dir))?;
        let seed = self.write_seed()?;
        let console = self.console_log();
        let _ = fs::remove_file(&console);
        let mut q = Command::new("qemu-system-x86_64");
        q.args(["-accel", "tcg,thread=single", "-cpu", "max", "-m", MEMORY])
            .args(["-smp", &CPUS.to_string()])
            .args(["-nodefaults", "-display", "none", "-no-reboot", "-monitor", "none"])
            .arg("-kernel")
            .arg(&image.kernel)
            .arg("-initrd")
            .arg(&image.initrd)
            .arg("-append")
            .arg(format!(
                "root=/dev/vda rw console=ttyS0 panic=-1 systemd.unified_cgroup_hierarchy=1 \
                 cgroup_no_v1=all systemd.hostname={}",
                self.name
            ))
            .arg("-drive")
            .arg(format!(
                "file={},format=raw,if=virtio,snapshot=on",
                image.rootfs.display()
            ))
            .arg("-drive")
            .arg(format!(
                "file={},format=raw,if=virtio,readonly=on",
                seed.display()
            ))
            // The only way out of the guest: its port 6443 at 10.0.2.100, relayed per connection
            // to the API server on this machine's loopback.
            .arg("-netdev")
            .arg(format!(
                "user,id=n0,restrict=on,guestfwd=tcp:{APISERVER_FORWARD}:{APISERVER_PORT}-cmd:socat - TCP:127.0.0.1:{APISERVER_PORT}"
            ))
            .args(["-device", "virtio-net-pci,netdev=n0"])
            .arg("-chardev")
            .arg(format!(
                "socket,id=qga0,path={},server=on,wait=off",
                self.agent_socket().display()
            ))
            .args(["-device", "virtio-serial-pci"])
            .args([
                "-device",
                "virtserialport,chardev=qga0,name=org.qemu.guest_agent.0",
            ])
            .arg("-serial")
            .arg(format!("file:{}", console.display()));
        if crate::which("socat").is_none() {
            return Err(Error::Missing(
                "socat not found: qemu relays the guest's connections to the API server through \
                 it (scripts/bootstrap.sh installs it)"
                    .into(),
            ));
        }
        let started = Instant::now();
        daemon::spawn(c, &self.component(), q)?;
        self.wait(
            "the guest to boot (its guest agent to answer)",
            BOOT_TIMEOUT,
            || {
                qga::Agent::connect(&self.agent_socket(), Duration::from_secs(2))?
                    .call("guest-ping", serde_json::json!({}))
                    .map(|_| ())
            },
        )?;
        let boot = started.elapsed();
        eprintln!(
            "cluster: guest {} booted in {:.1} s (kernel {}); waiting for its node",
            self.name,
            boot.as_secs_f64(),
            image.release
        );
        let booted = Instant::now();
        self.wait("the guest's node registration", JOIN_TIMEOUT, || {
            c.node_registered(&self.name)
        })?;
        let join = booted.elapsed();
        eprintln!(
            "cluster: node {} registered {:.1} s after boot ({:.1} s after qemu started)",
            self.name,
            join.as_secs_f64(),
            started.elapsed().as_secs_f64()
        );
        Ok(Started { boot, join })
    }

    /// Stops qemu (the guest's disk writes go with it) and removes the guest's files. The Node
    /// object stays: [`Cluster::remove_node`] deletes it.
    pub fn stop(&self) -> Result<()> {
        daemon::stop(self.cluster, &self.component());
        let dir = self.dir();
        if dir.exists() {
            fs::remove_dir_all(&dir).map_err(Error::io(&dir))?;
        }
        Ok(())
    }

    /// A connection to the guest's agent, synchronised and ready for a command.
    pub fn agent(&self) -> Result<qga::Agent> {
        qga::Agent::connect(&self.agent_socket(), Duration::from_secs(30))
    }

    /// Runs a command in the guest through its agent.
    pub fn exec(&self, path: &str, args: &[&str], timeout: Duration) -> Result<qga::Exited> {
        self.agent()?.exec(path, args, timeout)
    }

    /// Starts a command in the guest through its agent and returns its pid there at once (it
    /// runs on; stop it with `kill`).
    pub fn spawn(&self, path: &str, args: &[&str]) -> Result<i64> {
        self.agent()?.spawn(path, args)
    }

    /// Imports an OCI archive into the guest's containerd (`k8s.io` namespace), through the
    /// guest agent (no network path into the guest).
    pub fn import(&self, archive: &Path) -> Result<()> {
        let data = fs::read(archive).map_err(Error::io(archive))?;
        let target = "/var/lib/observer-import.tar";
        let mut a = qga::Agent::connect(&self.agent_socket(), Duration::from_secs(120))?;
        a.write_file(target, &data)?;
        let r = a.exec(
            "/opt/observer/bin/ctr",
            &[
                "--address",
                GUEST_CONTAINERD_SOCKET,
                "-n",
                "k8s.io",
                "images",
                "import",
                "--snapshotter",
                "overlayfs",
                target,
            ],
            Duration::from_secs(300),
        )?;
        let _ = a.exec("/bin/rm", &["-f", target], Duration::from_secs(30));
        if r.code != 0 {
            return Err(Error::Command {
                what: format!("ctr images import in {}", self.name),
                detail: format!("exit {}: {}{}", r.code, r.stderr, r.stdout),
            });
        }
        Ok(())
    }

    /// Copies a program of this machine into the guest, without its debug information (the
    /// guest agent carries it base64-encoded), and returns its path there. The guest is Debian
    /// bookworm like this host, so a program built here runs there.
    pub fn install(&self, program: &Path) -> Result<String> {
        let name = program
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "program".into());
        let stripped = self.dir().join(format!("{name}.stripped"));
        let mut strip = Command::new("objcopy");
        strip.arg("--strip-debug").arg(program).arg(&stripped);
        let data = match image::run(&mut strip, "objcopy --strip-debug") {
            Ok(()) => fs::read(&stripped).map_err(Error::io(&stripped))?,
            Err(_) => fs::read(program).map_err(Error::io(program))?,
        };
        let _ = fs::remove_file(&stripped);
        let target = format!("/var/lib/observer-test/{name}");
        let mut a = qga::Agent::connect(&self.agent_socket(), Duration::from_secs(120))?;
        a.exec(
            "/bin/mkdir",
            &["-p", "/var/lib/observer-test"],
            Duration::from_secs(30),
        )?;
        a.write_file(&target, &data)?;
        a.exec("/bin/chmod", &["0755", &target], Duration::from_secs(30))?;
        Ok(target)
    }

    /// An admin kubeconfig in the guest (the API server at 127.0.0.1:6443, through the guest's
    /// relay), for programs the tests run there; returns its path there.
    pub fn admin_kubeconfig(&self) -> Result<String> {
        let pki = self.cluster.pki();
        let read = |f: &str| -> Result<Vec<u8>> {
            let p = pki.join(f);
            fs::read(&p).map_err(Error::io(&p))
        };
        let text = crate::files::kubeconfig_inline(
            "admin",
            &read("ca.crt")?,
            &read("admin.crt")?,
            &read("admin.key")?,
        );
        let target = "/var/lib/observer-test/admin.kubeconfig";
        let mut a = qga::Agent::connect(&self.agent_socket(), Duration::from_secs(60))?;
        a.exec(
            "/bin/mkdir",
            &["-p", "/var/lib/observer-test"],
            Duration::from_secs(30),
        )?;
        a.write_file(target, text.as_bytes())?;
        Ok(target.into())
    }

    /// The newest log the guest's kubelet keeps for the agent's container.
    pub fn agent_log(&self) -> Option<String> {
        let r = self
            .exec(
                "/bin/sh",
                &[
                    "-c",
                    "cat \"$(ls -t /var/log/pods/observer-system_observer-*/observer/*.log | head -n1)\"",
                ],
                Duration::from_secs(60),
            )
            .ok()?;
        (r.code == 0).then_some(r.stdout)
    }

    fn wait(
        &self,
        what: &str,
        timeout: Duration,
        mut ready: impl FnMut() -> Result<()>,
    ) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let err = match ready() {
                Ok(()) => return Ok(()),
                Err(e) => e,
            };
            if !self.is_running() {
                return Err(Error::Command {
                    what: format!("qemu of {} (while waiting for {what})", self.name),
                    detail: format!(
                        "exited:\n{}\nconsole:\n{}",
                        crate::files::tail(
                            &self
                                .cluster
                                .logs()
                                .join(format!("{}.log", self.component())),
                            20
                        ),
                        crate::files::tail(&self.console_log(), 40)
                    ),
                });
            }
            if Instant::now() >= deadline {
                return Err(Error::Timeout {
                    what: what.into(),
                    after: timeout,
                    detail: format!(
                        "{err}\nconsole:\n{}",
                        crate::files::tail(&self.console_log(), 40)
                    ),
                });
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// The seed disk: binaries, certificates, configuration and the test images, as an ext4
    /// image (`mke2fs -d`), mounted read-only at /opt/observer in the guest.
    fn write_seed(&self) -> Result<PathBuf> {
        let c = self.cluster;
        let root = self.dir().join("seed");
        let put = |rel: &str, text: &str, mode: u32| -> Result<()> {
            let p = root.join(rel);
            if let Some(d) = p.parent() {
                fs::create_dir_all(d).map_err(Error::io(d))?;
            }
            fs::write(&p, text).map_err(Error::io(&p))?;
            fs::set_permissions(&p, fs::Permissions::from_mode(mode)).map_err(Error::io(&p))
        };
        let bin = root.join("bin");
        fs::create_dir_all(&bin).map_err(Error::io(&bin))?;
        let guest_bin = crate::versions::containerd_bin(c.dir(), crate::versions::Containerd::V2);
        for b in crate::build::CONTAINERD_COMMANDS {
            link_or_copy(&guest_bin.join(b), &bin.join(b))?;
        }
        link_or_copy(
            &c.kubelet_bin(c.versions().guest_kubelet),
            &bin.join("kubelet"),
        )?;
        pki::node(&c.pki(), &self.name, &self.name)?;
        for (from, to) in [
            ("ca.crt".to_string(), "ca.crt"),
            (format!("{}.crt", self.name), "kubelet.crt"),
            (format!("{}.key", self.name), "kubelet.key"),
            (format!("{}-serving.crt", self.name), "kubelet-serving.crt"),
            (format!("{}-serving.key", self.name), "kubelet-serving.key"),
        ] {
            let text =
                fs::read_to_string(c.pki().join(&from)).map_err(Error::io(c.pki().join(&from)))?;
            put(&format!("pki/{to}"), &text, 0o600)?;
        }
        put("kubelet.yaml", &kubelet_config(), 0o644)?;
        put(
            "kubelet.kubeconfig",
            &crate::files::kubeconfig(Path::new(SEED_PKI), "kubelet"),
            0o644,
        )?;
        put("containerd.toml", &containerd_config(), 0o644)?;
        put("units/containerd.service", CONTAINERD_UNIT, 0o644)?;
        put("units/kubelet.service", &kubelet_unit(&self.name), 0o644)?;
        put(
            "units/observer-apiserver.socket",
            &apiserver_socket(),
            0o644,
        )?;
        put(
            "units/observer-apiserver.service",
            &apiserver_relay(),
            0o644,
        )?;
        put("start.sh", START_SH, 0o755)?;
        let busybox = crate::which("busybox").ok_or_else(|| {
            Error::Missing(
                "busybox not found (scripts/bootstrap.sh installs busybox-static)".into(),
            )
        })?;
        let images = root.join("images");
        fs::create_dir_all(&images).map_err(Error::io(&images))?;
        observer_image::busybox::write_archive(&busybox, &images.join("test-images.tar"))?;
        let disk = self.dir().join("seed.ext4");
        let mut mkfs = Command::new("mke2fs");
        mkfs.args(["-q", "-F", "-t", "ext4", "-L", "observer-seed", "-d"])
            .arg(&root)
            .arg(&disk)
            .arg("512M");
        image::run(&mut mkfs, "mke2fs (the guest's seed disk)")?;
        fs::remove_dir_all(&root).map_err(Error::io(&root))?;
        Ok(disk)
    }
}

fn nodes_dir(c: &Cluster) -> PathBuf {
    c.dir().join("guest/nodes")
}

/// A hard link where the file system allows it (the binaries are large), else a copy.
fn link_or_copy(from: &Path, to: &Path) -> Result<()> {
    if !from.is_file() {
        return Err(Error::Missing(format!("{} is not built", from.display())));
    }
    if fs::hard_link(from, to).is_err() {
        fs::copy(from, to).map_err(Error::io(to))?;
    }
    Ok(())
}

/// Run by the image's `observer-node.service` once the seed disk is mounted.
const START_SH: &str = r#"#!/bin/sh
# The node's start, from the seed disk: containerd, the test images, kubelet.
set -eu
# Debian's kernels default to perf_event_paranoid=3 (their own patch), where perf_event_open
# wants CAP_SYS_ADMIN: the agent, with CAP_PERFMON and CAP_BPF only, then fails attaching its
# classic tracepoints (oom/mark_victim: EACCES). 2 is the upstream default and this host's.
sysctl -q -w kernel.perf_event_paranoid=2
cp /opt/observer/units/* /run/systemd/system/
systemctl daemon-reload
systemctl start observer-apiserver.socket containerd.service
ctr() { /opt/observer/bin/ctr --address /run/containerd/containerd.sock "$@"; }
until ctr -n k8s.io plugins ls >/dev/null 2>&1; do sleep 0.5; done
for a in /opt/observer/images/*.tar; do ctr -n k8s.io images import --snapshotter overlayfs "$a"; done
# The DaemonSet as the test cluster runs it (cluster/overlay) mounts the runtime's socket
# directory from where the host node has it: the same directory here.
mkdir -p /run/observer-cluster/containerd
mount --bind /run/containerd /run/observer-cluster/containerd
systemctl start kubelet.service
echo "observer-node: containerd and kubelet started" > /dev/ttyS0
"#;

/// containerd's own unit (its repository's containerd.service), with the seed's binaries.
const CONTAINERD_UNIT: &str = r#"[Unit]
Description=containerd 2.x (from the seed disk)
After=network.target local-fs.target dbus.service
[Service]
Environment=PATH=/opt/observer/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
ExecStartPre=-/sbin/modprobe overlay
ExecStart=/opt/observer/bin/containerd --config /opt/observer/containerd.toml
Type=notify
Delegate=yes
KillMode=process
Restart=always
RestartSec=5
LimitNPROC=infinity
LimitCORE=infinity
TasksMax=infinity
OOMScoreAdjust=-999
"#;

fn kubelet_unit(name: &str) -> String {
    format!(
        r#"[Unit]
Description=kubelet (from the seed disk)
After=containerd.service observer-apiserver.socket
Wants=containerd.service
[Service]
ExecStart=/opt/observer/bin/kubelet --config=/opt/observer/kubelet.yaml --kubeconfig=/opt/observer/kubelet.kubeconfig --hostname-override={name} --node-ip={GUEST_ADDRESS}
Restart=always
RestartSec=2
"#
    )
}

/// The API server at 127.0.0.1:6443 in the guest, as on the host node: systemd accepts there and
/// relays to the address qemu forwards to the host's loopback.
fn apiserver_socket() -> String {
    format!(
        r#"[Unit]
Description=the API server on the guest's loopback (relayed to the host's)
[Socket]
ListenStream=127.0.0.1:{APISERVER_PORT}
[Install]
WantedBy=sockets.target
"#
    )
}

fn apiserver_relay() -> String {
    format!(
        r#"[Unit]
Description=relay to the API server through qemu's forward
Requires=observer-apiserver.socket
After=observer-apiserver.socket
[Service]
ExecStart=/lib/systemd/systemd-socket-proxyd {APISERVER_FORWARD}:{APISERVER_PORT}
"#
    )
}

/// Where the seed disk's certificates are in the guest.
const SEED_PKI: &str = "/opt/observer/pki";

/// kubelet as on a production node: the systemd driver, the default cgroup root, pod logs in
/// /var/log/pods.
fn kubelet_config() -> String {
    crate::files::kubelet_yaml(
        Path::new(SEED_PKI),
        &format!("unix://{GUEST_CONTAINERD_SOCKET}"),
        "# What containerd's runc options say (SystemdCgroup = true): systemd owns the pods' cgroups.\ncgroupDriver: systemd\n",
    )
}

/// containerd 2.x's configuration (version 3: the CRI plugin split into images and runtime).
fn containerd_config() -> String {
    format!(
        r#"version = 3

[plugins.'io.containerd.cri.v1.images']
  snapshotter = 'overlayfs'
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = '{pause}'

[plugins.'io.containerd.cri.v1.runtime']
  enable_selinux = false
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = 'runc'
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = 'io.containerd.runc.v2'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        # What kubelet's cgroupDriver says: both ask systemd for the pods' and containers' units.
        SystemdCgroup = true

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = '127.0.0.1'
  stream_server_port = '0'
"#,
        pause = observer_image::busybox::PAUSE_IMAGE,
    )
}
