//! `fentry/taskstats_exit(struct task_struct *tsk, int group_dead)`, for kernels whose
//! `sched_process_exit` has no `group_dead` argument (6.1, 6.12, ...).
//!
//! do_exit decides `group_dead = atomic_dec_and_test(&signal->live)` once, then passes it to
//! taskstats_exit shortly before the exit tracepoint. Reading `signal->live` at the tracepoint
//! instead is wrong when threads exit together: each has decremented it before either reaches the
//! tracepoint, and both see zero (seen on 6.1 with two CPUs: two "last" threads of one process).
//! So the exact value is recorded here, by thread id, and taken by exit.rs.
use aya_ebpf::{helpers::bpf_get_current_pid_tgid, macros::fentry, programs::FEntryContext};

use crate::GROUP_DEAD;

#[fentry(function = "taskstats_exit")]
pub fn taskstats_exit(ctx: FEntryContext) -> i32 {
    // do_exit runs in the exiting thread: `tsk` is current.
    let group_dead = ctx.arg::<u64>(1) as u32 != 0;
    let tid = bpf_get_current_pid_tgid() as u32;
    let _ = GROUP_DEAD.insert(tid, u8::from(group_dead), 0);
    0
}
