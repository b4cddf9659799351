#!/usr/bin/env bash
# Captures the kernel's OOM reports (raw /dev/kmsg records) for the parser's fixtures
# (observer-user/src/kernel/testdata/): boots a kernel in qemu with a busybox initramfs whose /init
# runs each kind of OOM kill the agent tells apart, then prints the kernel log.
#
#   scripts/oom-capture.sh VMLINUZ MODE [MEMORY]     MODE: v2 or v1; MEMORY: qemu -m (256M)
#
# Kills, in kubelet's cgroupfs layout (kubepods/burstable/pod<uid>/<container id>):
#   container   a 32 MiB container limit, hit by the container's only process
#   trigger     a 32 MiB container limit; the allocator (oom_score_adj -900) kills a holder (1000)
#   pod         a 48 MiB pod-level limit: one container holds tmpfs (shmem) and anon memory,
#               its sibling's allocation hits the pod's limit
#   group       (v2) memory.oom.group=1: one kill takes every process of the container
#   global      no limit at all: the guest's memory runs out (constraint CONSTRAINT_NONE)
# The records go to stdout between `@@KMSG BEGIN` and `@@KMSG END`.
set -euo pipefail
VMLINUZ="$1" MODE="$2" MEM="${3:-256M}"
BUSYBOX="${BUSYBOX:-$(command -v busybox)}"
file -L "$BUSYBOX" | grep -q 'statically linked' || { echo "need a static busybox" >&2; exit 1; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/root/bin"
cp "$BUSYBOX" "$work/root/bin/busybox"
cat >"$work/root/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox mkdir -p /bin /proc /sys /dev /tmp
/bin/busybox --install -s /bin
mount -t proc proc /proc; mount -t sysfs sysfs /sys; mount -t devtmpfs devtmpfs /dev
exec >/dev/ttyS0 2>&1
mkdir -p /dev/shm; mount -t tmpfs tmpfs /dev/shm
echo -1000 >/proc/self/oom_score_adj
MODE="$(sed -n 's/.*observer.cgroup=\([a-z0-9]*\).*/\1/p' /proc/cmdline)"
if [ "$MODE" = v1 ]; then
  mount -t tmpfs tmpfs /sys/fs/cgroup; mkdir /sys/fs/cgroup/memory
  mount -t cgroup -o memory cgroup /sys/fs/cgroup/memory
  R=/sys/fs/cgroup/memory; LIMIT=memory.limit_in_bytes
else
  mount -t cgroup2 cgroup2 /sys/fs/cgroup
  for c in memory cpuset; do echo +$c >/sys/fs/cgroup/cgroup.subtree_control; done
  R=/sys/fs/cgroup; LIMIT=memory.max
fi
Q=$R/kubepods/burstable
# A parent level (memory enabled for its children) and a container (a leaf: cgroup v2 lets only
# leaves hold processes once a controller is enabled below).
# cpuset too, as kubelet's v2 nodes: the kernel names the trigger's cpuset cgroup (its container).
mkcg() { mkdir -p "$1"; [ "$MODE" = v1 ] || for c in memory cpuset; do echo +$c >"$1/cgroup.subtree_control"; done; }
mkleaf() { mkdir -p "$1"; }
# A container id of containerd's shape (64 hex digits) from a short readable one.
cid() { s=$1; while [ ${#s} -lt 64 ]; do s=${s}0; done; echo "$s"; }
mkcg $R/kubepods; mkcg $Q
# Runs a command in a cgroup at an oom_score_adj, in the background.
run_in() { cg=$1 adj=$2; shift 2; sh -c "echo \$\$ >$cg/cgroup.procs; echo $adj >/proc/self/oom_score_adj; exec $*" & }
wait_rss() { i=0; while [ $i -lt 100 ] && [ "$(cat $1/memory.current 2>/dev/null || cat $1/memory.usage_in_bytes)" -lt $2 ]; do sleep 0.1; i=$((i+1)); done; }

echo "@@STEP container"
C=$Q/pod11111111-1111-4111-8111-111111111111/$(cid c0ffee01); mkcg ${C%/*}; mkleaf $C; echo 33554432 >$C/$LIMIT
run_in $C 0 dd if=/dev/zero of=/dev/null bs=64M count=1; wait

echo "@@STEP trigger"
C=$Q/pod22222222-2222-4222-8222-222222222222/$(cid c0ffee02); mkcg ${C%/*}; mkleaf $C; echo 33554432 >$C/$LIMIT
run_in $C 1000 /hold.sh 20000000; wait_rss $C 20000000
run_in $C -900 dd if=/dev/zero of=/dev/null bs=24M count=1; wait

echo "@@STEP pod"
P=$Q/pod33333333-3333-4333-8333-333333333333; mkcg $P; echo 50331648 >$P/$LIMIT
mkleaf $P/$(cid c0ffee03a); mkleaf $P/$(cid c0ffee03b)
run_in $P/$(cid c0ffee03a) 0 /hold.sh 12000000 16000000; wait_rss $P/$(cid c0ffee03a) 26000000
run_in $P/$(cid c0ffee03b) 0 dd if=/dev/zero of=/dev/null bs=40M count=1; wait
rm -f /dev/shm/fill

if [ "$MODE" != v1 ]; then
  echo "@@STEP group"
  C=$Q/pod44444444-4444-4444-8444-444444444444/$(cid c0ffee04); mkcg ${C%/*}; mkleaf $C
  echo 33554432 >$C/memory.max; echo 1 >$C/memory.oom.group
  run_in $C 0 sleep 30; run_in $C 0 sleep 31
  run_in $C 0 dd if=/dev/zero of=/dev/null bs=64M count=1; wait
fi

echo "@@STEP global"
G=$R/global; mkleaf $G
# Without overcommit a 1 GiB buffer is refused outright; with it, dd faults it in until the
# guest's memory runs out.
echo 1 >/proc/sys/vm/overcommit_memory
run_in $G 0 dd if=/dev/zero of=/dev/null bs=1G count=1; wait

echo "@@KMSG BEGIN"
timeout 2 cat /dev/kmsg
echo "@@KMSG END"
poweroff -f
INIT
cat >"$work/root/hold.sh" <<'HOLD'
#!/bin/busybox sh
# hold.sh ANON_BYTES [SHMEM_BYTES]: holds that much anonymous memory (and tmpfs), then sleeps.
[ -n "$2" ] && head -c "$2" /dev/zero >/dev/shm/fill
x=$(head -c "$1" /dev/zero | tr '\0' a)
sleep 30
HOLD
chmod +x "$work/root/init" "$work/root/hold.sh"
(cd "$work/root" && find . | cpio -o -H newc --quiet) >"$work/initrd"
# TCG, as `cargo xtask vm-test --accel auto`: nested KVM with `-cpu host` is refused on some hosts.
timeout 600 qemu-system-x86_64 -accel tcg -cpu max -m "$MEM" -smp 2 -nodefaults -display none \
  -no-reboot -serial stdio \
  -kernel "$VMLINUZ" -initrd "$work/initrd" \
  -append "console=ttyS0 loglevel=1 log_buf_len=4M panic=-1 rdinit=/init observer.cgroup=$MODE" \
  </dev/null | tr -d '\r'
