//! The second node's disk image: Debian bookworm from Debian's packages only (mmdebstrap into a
//! directory, then `mke2fs -d`: no loop mount), with systemd as PID 1, Debian's 6.1 cloud kernel
//! and its initramfs (copied out beside the image: qemu boots them directly), runc from Debian
//! and qemu's guest agent (the host's only way in: no network service listens in the guest).
//! Nothing of the cluster is in it: binaries, certificates and configuration come on a second
//! disk made at each start ([`super::seed`]), so the image is rebuilt only when this recipe
//! changes (about 2 minutes, most of it downloading).
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use crate::{Error, Result};

/// Debian's packages of the guest. `linux-image-cloud-amd64`: the 6.1 kernel for virtual
/// machines (BTF, BPF, memcg; virtio as modules, loaded by its initramfs and udev). `runc`:
/// Debian's 1.1.5, built against bookworm's libseccomp; containerd drives it through its
/// command line, which has not changed for what CRI asks of it. `dbus`: kubelet's and runc's
/// systemd cgroup driver ask systemd for units over the system bus. `qemu-guest-agent`: how the
/// host runs a command or writes a file in the guest (over a virtio serial port).
const PACKAGES: &[&str] = &[
    "systemd",
    "systemd-sysv",
    "udev",
    "dbus",
    "kmod",
    "iproute2",
    "iptables",
    "procps",
    "e2fsprogs",
    "linux-image-cloud-amd64",
    "initramfs-tools",
    "runc",
    "qemu-guest-agent",
];

const SOURCES: &[&str] = &[
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian bookworm-updates main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
];

/// The guest's own address on qemu's user network, and the address whose port 6443 qemu
/// forwards to the API server on the host's loopback.
pub const GUEST_ADDRESS: &str = "10.0.2.15";
pub const APISERVER_FORWARD: &str = "10.0.2.100";

/// The image's files, run once in the new root (`$1`) after the packages are installed.
fn customize() -> String {
    format!(
        r#"set -e
cat > "$1/etc/fstab" <<'END'
/dev/vda / ext4 rw,errors=remount-ro 0 1
LABEL=observer-seed /opt/observer ext4 ro,nofail 0 0
END
mkdir -p "$1/opt/observer"
# qemu's user network, statically: the guest reaches nothing but the forwards qemu was given.
mkdir -p "$1/etc/systemd/network"
cat > "$1/etc/systemd/network/10-guest.network" <<'END'
[Match]
Name=en* eth*
[Network]
Address={GUEST_ADDRESS}/24
Gateway=10.0.2.2
LinkLocalAddressing=no
IPv6AcceptRA=no
END
# No name server is reachable; kubelet wants the file.
echo '# no name server: the guest reaches only the API server, by address' > "$1/etc/resolv.conf"
echo observer-guest > "$1/etc/hostname"
# The node's own start (containerd, kubelet), from the seed disk.
cat > "$1/etc/systemd/system/observer-node.service" <<'END'
[Unit]
Description=observer test cluster node (from the seed disk)
RequiresMountsFor=/opt/observer
After=network.target local-fs.target dbus.service
ConditionPathExists=/opt/observer/start.sh
[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/opt/observer/start.sh
[Install]
WantedBy=multi-user.target
END
chroot "$1" systemctl enable systemd-networkd.service observer-node.service
# Nothing that wakes up on a timer in a short-lived test node.
chroot "$1" systemctl mask apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer man-db.timer systemd-tmpfiles-clean.timer 2>/dev/null || true
rm -rf "$1/var/cache/apt/archives"/*.deb "$1/var/lib/apt/lists"/*
"#
    )
}

/// Where the image and its kernel are.
pub struct Image {
    pub rootfs: PathBuf,
    pub kernel: PathBuf,
    pub initrd: PathBuf,
    /// The kernel's release (`6.1.0-57-cloud-amd64`).
    pub release: String,
}

/// Builds the image into `dir` (`target/cluster/guest/image`) unless it was built from this
/// recipe already.
pub fn ensure(dir: &Path) -> Result<Image> {
    let stamp_file = dir.join(".built-from");
    let recipe = format!(
        "{}\n{}\n{}\n",
        PACKAGES.join(","),
        SOURCES.join("\n"),
        customize()
    );
    let rootfs = dir.join("rootfs.ext4");
    let kernel = dir.join("vmlinuz");
    let initrd = dir.join("initrd.img");
    let release_file = dir.join("release");
    let built = [&rootfs, &kernel, &initrd, &release_file]
        .iter()
        .all(|p| p.is_file());
    if built && std::fs::read_to_string(&stamp_file).is_ok_and(|s| s == recipe) {
        let release = std::fs::read_to_string(&release_file).map_err(Error::io(&release_file))?;
        return Ok(Image {
            rootfs,
            kernel,
            initrd,
            release: release.trim().to_string(),
        });
    }
    for tool in ["mmdebstrap", "mke2fs"] {
        if crate::which(tool).is_none() && !Path::new("/usr/sbin").join(tool).is_file() {
            return Err(Error::Missing(format!(
                "{tool} not found: the guest's image is built with mmdebstrap and mke2fs \
                 (scripts/bootstrap.sh installs mmdebstrap and e2fsprogs)"
            )));
        }
    }
    std::fs::create_dir_all(dir).map_err(Error::io(dir))?;
    let started = Instant::now();
    eprintln!(
        "cluster: building the guest's Debian bookworm image with mmdebstrap (about 2 minutes)"
    );
    let root = dir.join("root.tmp");
    if root.exists() {
        std::fs::remove_dir_all(&root).map_err(Error::io(&root))?;
    }
    let mut mm = Command::new("mmdebstrap");
    mm.args(["--variant=minbase", "--mode=root", "--format=directory"])
        .arg("--aptopt=APT::Install-Recommends \"false\"")
        .arg(format!("--include={}", PACKAGES.join(",")))
        .arg(format!("--customize-hook={}", customize()))
        .arg("bookworm")
        .arg(&root)
        .args(SOURCES)
        // The same files from the same packages whenever it is rebuilt (timestamps included).
        .env("SOURCE_DATE_EPOCH", "0");
    run(&mut mm, "mmdebstrap")?;
    let boot = root.join("boot");
    let find = |prefix: &str| -> Result<PathBuf> {
        std::fs::read_dir(&boot)
            .map_err(Error::io(&boot))?
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with(prefix))
            })
            .ok_or_else(|| Error::Missing(format!("no {prefix}* in {}", boot.display())))
    };
    let vmlinuz = find("vmlinuz-")?;
    let release = vmlinuz
        .file_name()
        .map(|n| {
            n.to_string_lossy()
                .trim_start_matches("vmlinuz-")
                .to_string()
        })
        .unwrap_or_default();
    copy(&vmlinuz, &kernel)?;
    copy(&find("initrd.img-")?, &initrd)?;
    let tmp = dir.join("rootfs.ext4.tmp");
    let _ = std::fs::remove_file(&tmp);
    // Sparse: 4 GiB for containerd's images and kubelet's state, a few hundred MiB used.
    let mut mkfs = Command::new("mke2fs");
    mkfs.args(["-q", "-F", "-t", "ext4", "-L", "observer-root", "-d"])
        .arg(&root)
        .arg(&tmp)
        .arg("4G");
    run(&mut mkfs, "mke2fs (the guest's root)")?;
    std::fs::rename(&tmp, &rootfs).map_err(Error::io(&rootfs))?;
    std::fs::remove_dir_all(&root).map_err(Error::io(&root))?;
    std::fs::write(&release_file, &release).map_err(Error::io(&release_file))?;
    std::fs::write(&stamp_file, recipe).map_err(Error::io(&stamp_file))?;
    eprintln!(
        "cluster: guest image built in {:.0?} (kernel {release})",
        started.elapsed()
    );
    Ok(Image {
        rootfs,
        kernel,
        initrd,
        release,
    })
}

fn copy(from: &Path, to: &Path) -> Result<()> {
    std::fs::copy(from, to).map_err(Error::io(to))?;
    Ok(())
}

pub(crate) fn run(cmd: &mut Command, what: &str) -> Result<()> {
    let out = cmd.output().map_err(|e| Error::Command {
        what: what.into(),
        detail: e.to_string(),
    })?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = err.lines().collect();
        return Err(Error::Command {
            what: what.into(),
            detail: format!(
                "{}: {}",
                out.status,
                lines[lines.len().saturating_sub(30)..].join("\n")
            ),
        });
    }
    Ok(())
}
