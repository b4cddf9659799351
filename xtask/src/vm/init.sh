#!/bin/busybox sh
# /init of the vm-test guest (built into the initramfs by xtask/src/vm/initramfs.rs).
#
# Sets up the machine a node agent expects (proc, sys, dev, tracefs, bpffs), then the cgroup
# layout named by `observer.cgroup=` on the kernel command line, runs `observer check`, the
# kernel and PLEG suites and, on cgroup v2, the OOM suite (a global OOM and a group kill), and
# powers off. The kernel's console is ttyS0; everything this script
# and the tests print goes to ttyS1, which the host reads, between marker lines:
#   @@OBSERVER-VM BEGIN <step>  ...  @@OBSERVER-VM END <step> rc=<n>   and finally @@OBSERVER-VM DONE
# The host parses those (xtask/src/vm/report.rs); the rest of a step's lines are its own output.

/bin/busybox mkdir -p /bin /sbin /proc /sys /dev /tmp /run
/bin/busybox --install -s /bin
export PATH=/bin:/sbin:/opt/observer
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
# The OOM suite's API stand-in listens on 127.0.0.1.
ip link set lo up 2>/dev/null || ifconfig lo 127.0.0.1 up

OUT=/dev/ttyS1
[ -c "$OUT" ] || OUT=/dev/console
exec >"$OUT" 2>&1

M=@@OBSERVER-VM
say() { echo "$M $*"; }
param() { for w in $(cat /proc/cmdline); do case "$w" in "$1="*) echo "${w#*=}" ;; esac; done; }
halt() {
  sync
  poweroff -f
  # poweroff -f does not return; if it did, exiting init panics the kernel and qemu's -no-reboot
  # ends the guest all the same.
  exit 1
}

if [ "$(param observer.vm)" = probe ]; then
  say PROBE ok
  halt
fi

MODE="$(param observer.cgroup)"
THREADS="$(param observer.threads)"
FILTER="$(param observer.filter)"
say uname "$(uname -r)"
say kernel "$(cat /proc/version)"
say cpus "$(grep -c ^processor /proc/cpuinfo)"

mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null
mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null
mount -t bpf bpf /sys/fs/bpf 2>/dev/null
# Core dumps off: the tests check that a SIGSEGV reports no core.
ulimit -c 0

# v1 controllers the kernel has (enabled column of /proc/cgroups), grouped as systemd mounts them.
v1_hierarchies() {
  have() { awk -v c="$1" '$1 == c && $4 == 1 { found = 1 } END { exit !found }' /proc/cgroups; }
  for h in cpuset cpu,cpuacct blkio memory devices freezer net_cls,net_prio perf_event hugetlb pids rdma misc; do
    ok=1
    for c in $(echo "$h" | tr , ' '); do have "$c" || ok=0; done
    [ $ok = 1 ] && echo "$h"
  done
}

ERR=
fail() { ERR="$*"; return 1; }

mount_v1() {
  mount -t tmpfs -o mode=755 cgroup /sys/fs/cgroup || fail "tmpfs on /sys/fs/cgroup" || return 1
  # The named hierarchy systemd keeps its own tree in on v1 and hybrid hosts.
  mkdir -p /sys/fs/cgroup/systemd
  mount -t cgroup -o none,name=systemd cgroup /sys/fs/cgroup/systemd || fail "name=systemd v1 hierarchy" || return 1
  n=0
  for h in $(v1_hierarchies); do
    mkdir -p "/sys/fs/cgroup/$h"
    if ! mount -t cgroup -o "$h" cgroup "/sys/fs/cgroup/$h" 2>/dev/null; then
      # Linux 6.12 can be built without v1 memory and cpuset (CONFIG_MEMCG_V1, CONFIG_CPUSETS_V1
      # off, as Debian does): /proc/cgroups lists them, a v1 mount says EINVAL. They stay on
      # cgroup2, as under systemd on such a kernel.
      echo "note: v1 $h not mountable (kernel built without its v1 support)"
      rmdir "/sys/fs/cgroup/$h"
      continue
    fi
    n=$((n + 1))
    # systemd's links: /sys/fs/cgroup/cpu -> cpu,cpuacct
    case "$h" in *,*) for c in $(echo "$h" | tr , ' '); do ln -s "$h" "/sys/fs/cgroup/$c"; done ;; esac
  done
  [ $n -gt 0 ] || fail "no v1 controller hierarchy could be mounted"
}

setup_cgroups() {
  case "$MODE" in
    v2)
      # A unified node (systemd.unified_cgroup_hierarchy=1; the host booted with cgroup_no_v1=all):
      # every controller is on cgroup2, enabled for the children of the root.
      mount -t cgroup2 -o nsdelegate cgroup2 /sys/fs/cgroup || fail "cgroup2 on /sys/fs/cgroup" || return 1
      for c in $(cat /sys/fs/cgroup/cgroup.controllers); do
        echo "+$c" >/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null
      done
      # memory.max and memory.oom.group must be real files in a child, or the OOM tests mean nothing.
      mkdir /sys/fs/cgroup/vm-probe || fail "mkdir in cgroup2" || return 1
      for f in memory.max memory.oom.group; do
        [ -f "/sys/fs/cgroup/vm-probe/$f" ] || { rmdir /sys/fs/cgroup/vm-probe; fail "cgroup2 child has no $f"; return 1; }
      done
      rmdir /sys/fs/cgroup/vm-probe
      ;;
    hybrid)
      # systemd's hybrid layout: v1 controllers, cgroup2 (no controllers) at /sys/fs/cgroup/unified.
      mount_v1 || return 1
      mkdir -p /sys/fs/cgroup/unified
      mount -t cgroup2 -o nsdelegate cgroup2 /sys/fs/cgroup/unified || fail "cgroup2 on /sys/fs/cgroup/unified" || return 1
      ;;
    v1)
      # Legacy: v1 hierarchies only, no cgroup2 mounted anywhere.
      mount_v1 || return 1
      ;;
    *)
      fail "unknown observer.cgroup=$MODE (want v2, hybrid or v1)"
      ;;
  esac
}

say BEGIN cgroups
setup_cgroups
rc=$?
grep cgroup /proc/self/mountinfo
for f in /sys/fs/cgroup/cgroup.subtree_control /sys/fs/cgroup/unified/cgroup.controllers; do
  [ -f "$f" ] && echo "$f: $(cat "$f")"
done
[ -n "$ERR" ] && echo "error: $ERR"
say END cgroups rc=$rc
[ $rc = 0 ] || { say DONE; halt; }

# What this kernel's tracepoints carry, for the record (the fallbacks depend on it).
say BEGIN tracepoints
fields() { sed -n 's/^[[:space:]]*field:.* \([a-z_]*\);.*/\1/p' "$1" | grep -v '^common_' | tr '\n' ' '; }
echo "oom/mark_victim fields: $(fields /sys/kernel/tracing/events/oom/mark_victim/format)"
echo "sched/sched_process_exit fields: $(fields /sys/kernel/tracing/events/sched/sched_process_exit/format)"
say END tracepoints rc=0

cd /tmp
say BEGIN check
observer check
say END check rc=$?

if [ "$MODE" != v1 ]; then
  # BPF run-time statistics on before any program is attached: the kernel suite's stats test
  # turns them on (BPF_ENABLE_STATS), which flips a static key and so rewrites kernel text
  # (int3 patching) while the probes run on both CPUs. Under software emulation that once left
  # both vCPUs spinning at the patched site in bpf_trace_run1 (soft lockup, the guest hung);
  # with the key already on, the test's own request patches nothing.
  echo 1 >/proc/sys/kernel/bpf_stats_enabled 2>/dev/null
  # The suites find observer-workload in the parent of their own directory, as under target/.
  # CI=true: a missing prerequisite fails instead of skipping.
  for suite in kernel pleg; do
    say BEGIN "$suite"
    CI=true RUST_BACKTRACE=1 "/opt/observer/deps/$suite" --test-threads="${THREADS:-1}" $FILTER
    say END "$suite" rc=$?
  done
fi
if [ "$MODE" = v2 ]; then
  # One test at a time: the global OOM runs this whole guest out of memory (the suite's own
  # process at oom_score_adj -1000, the allocator at 1000). OBSERVER_VM_GUEST=1: the suite's
  # tests run only here, never on a host. --nocapture: the Event texts are the run's record.
  echo 1 >/proc/sys/vm/oom_dump_tasks
  say BEGIN oom
  OBSERVER_VM_GUEST=1 CI=true RUST_BACKTRACE=1 RUST_LOG=warn /opt/observer/deps/oom --test-threads=1 --nocapture $FILTER
  say END oom rc=$?
  # Memory warnings before the kill on cgroup v2. The cache loop is left to the host's run and the
  # real cluster's node: this guest's only filesystems are in memory (its page cache is shmem or
  # unevictable there, and rightly warned), and its kernel has no disk filesystem built in.
  say BEGIN pressure
  CI=true RUST_BACKTRACE=1 RUST_LOG=warn /opt/observer/deps/pressure --test-threads=1 --nocapture --skip a_cache_loop $FILTER
  say END pressure rc=$?
fi
# The benchmarks asked for (cargo xtask vm-test --bench NAME): their tables are the run's record.
if [ "$MODE" != v1 ]; then
  for bench in $(param observer.bench); do
    say BEGIN "bench-$bench"
    env $(param observer.bench_env) RUST_LOG=warn "/opt/observer/deps/bench-$bench"
    say END "bench-$bench" rc=$?
  done
fi
say DONE
halt
