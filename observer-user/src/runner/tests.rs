//! The runner on paused tokio time: every delay below is exact virtual time, so the back-off
//! bounds are asserted to the nanosecond and nothing sleeps for real.
use std::{
    collections::{HashMap, VecDeque},
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::time::Instant;

use super::*;

/// What one attempt of a key does.
#[derive(Clone, Copy, Debug)]
enum Act {
    Ok(u64),
    Fail,
    RetryAfter(u64),
    Forget,
    Panic,
}

#[derive(Default)]
struct Script {
    /// Per key, the acts of its next attempts; `Ok(10)` once exhausted.
    acts: HashMap<u32, VecDeque<Act>>,
    /// Every start: (key, state, when).
    starts: Vec<(u32, u32, Instant)>,
    running: HashMap<u32, usize>,
    max_running_per_key: usize,
    running_total: usize,
    max_running_total: usize,
}

type Shared = Arc<Mutex<Script>>;

fn runner(cfg: RunnerConfig, script: &Shared) -> Runner<u32, u32, u32> {
    let script = Arc::clone(script);
    Runner::new(cfg, move |key: u32, state: u32| {
        let script = Arc::clone(&script);
        async move {
            let act = {
                let mut s = script.lock().unwrap();
                s.starts.push((key, state, Instant::now()));
                let n = s.running.entry(key).or_default();
                *n += 1;
                let n = *n;
                s.max_running_per_key = s.max_running_per_key.max(n);
                s.running_total += 1;
                s.max_running_total = s.max_running_total.max(s.running_total);
                s.acts
                    .get_mut(&key)
                    .and_then(VecDeque::pop_front)
                    .unwrap_or(Act::Ok(10))
            };
            let sleep = if let Act::Ok(ms) = act { ms } else { 1 };
            tokio::time::sleep(Duration::from_millis(sleep)).await;
            {
                let mut s = script.lock().unwrap();
                *s.running.get_mut(&key).unwrap() -= 1;
                s.running_total -= 1;
            }
            match act {
                Act::Ok(_) => Step::done(state),
                Act::Fail => Step::retry(state),
                Act::RetryAfter(ms) => Step {
                    output: state,
                    then: Then::RetryAfter(Duration::from_millis(ms)),
                },
                Act::Forget => Step {
                    output: state,
                    then: Then::Forget,
                },
                Act::Panic => panic!("boom on {key}"),
            }
        }
    })
}

fn cfg(max_concurrent: usize) -> RunnerConfig {
    RunnerConfig {
        max_concurrent,
        backoff_initial: Duration::from_millis(100),
        backoff_max: Duration::from_secs(1),
        seed: Some(42),
    }
}

fn script(acts: &[(u32, &[Act])]) -> Shared {
    let mut s = Script::default();
    for (k, a) in acts {
        s.acts.insert(*k, a.iter().copied().collect());
    }
    Arc::new(Mutex::new(s))
}

/// Drives the runner until it is idle, returning every finished job in order.
async fn drain(r: &mut Runner<u32, u32, u32>) -> Vec<Finished<u32, u32>> {
    let mut out = Vec::new();
    while !r.is_idle() {
        out.push(r.next().await);
    }
    out
}

#[tokio::test(start_paused = true)]
async fn latest_state_wins_with_one_job_per_key() {
    let s = script(&[(1, &[Act::Ok(100), Act::Ok(100)])]);
    let mut r = runner(cfg(4), &s);
    r.schedule(1, 10);
    // Arrive while the first job runs: folded into one follow-up with the newest state.
    r.schedule(1, 11);
    r.schedule(1, 12);
    let done = drain(&mut r).await;
    let outputs: Vec<u32> = done.iter().map(|f| *f.output.as_ref().unwrap()).collect();
    assert_eq!(outputs, [10, 12]);
    let s = s.lock().unwrap();
    assert_eq!(s.max_running_per_key, 1);
    assert_eq!(s.starts.len(), 2);
    assert_eq!(r.stats().superseded, 1);
    assert_eq!(r.stats().started, 2);
}

#[tokio::test(start_paused = true)]
async fn concurrency_is_bounded_and_every_key_runs() {
    let s = script(&[]);
    let mut r = runner(cfg(3), &s);
    for k in 0..10 {
        r.schedule(k, k * 100);
    }
    assert_eq!(r.in_flight(), 3);
    let done = drain(&mut r).await;
    let mut keys: Vec<u32> = done.iter().map(|f| f.key).collect();
    keys.sort_unstable();
    assert_eq!(keys, (0..10).collect::<Vec<_>>());
    assert_eq!(s.lock().unwrap().max_running_total, 3);
    // Keys ran in the order they were scheduled.
    let starts: Vec<u32> = s.lock().unwrap().starts.iter().map(|x| x.0).collect();
    assert_eq!(starts, (0..10).collect::<Vec<_>>());
}

/// Past the bound, the higher priority starts first, in order within one; a key raised while it
/// waits moves up (and runs once), and a failed high-priority job retries at its priority.
#[tokio::test(start_paused = true)]
async fn higher_priorities_start_first_past_the_bound() {
    let s = script(&[(9, &[Act::Fail])]);
    let mut r = runner(cfg(1), &s);
    r.schedule(0, 0); // takes the one slot
    for k in 1..=4 {
        r.schedule(k, k);
    }
    r.schedule_at(8, 8, Priority::Raised);
    r.schedule_at(9, 9, Priority::High);
    // Key 3 waits at Normal; a newer state of it is a first death: it moves up.
    r.schedule_at(3, 33, Priority::Raised);
    let done = drain(&mut r).await;
    let starts: Vec<(u32, u32)> = s
        .lock()
        .unwrap()
        .starts
        .iter()
        .map(|x| (x.0, x.1))
        .collect();
    // 9 fails and retries after its back-off; while it waits, the others go on.
    assert_eq!(
        starts,
        [
            (0, 0),
            (9, 9),
            (8, 8),
            (3, 33),
            (1, 1),
            (2, 2),
            (4, 4),
            (9, 9)
        ]
    );
    assert_eq!(done.len(), 8);
    assert_eq!(s.lock().unwrap().max_running_per_key, 1);

    // A retry keeps its priority: ahead of Normal work that was ready before it came due.
    {
        let mut sc = s.lock().unwrap();
        sc.acts.insert(5, [Act::Fail].into());
        for k in 10..13 {
            sc.acts.insert(k, [Act::Ok(200)].into());
        }
    }
    r.schedule_at(5, 5, Priority::High);
    for k in 10..13 {
        r.schedule(k, k);
    }
    drain(&mut r).await;
    let starts: Vec<u32> = s
        .lock()
        .unwrap()
        .starts
        .iter()
        .skip(8)
        .map(|x| x.0)
        .collect();
    // 5 fails at once; 10 takes the slot for 200 ms, during which 5's back-off (≤ 100 ms) ends.
    assert_eq!(starts, [5, 10, 5, 11, 12]);
}

#[tokio::test(start_paused = true)]
async fn failures_back_off_with_jitter_and_a_success_resets() {
    let fails = [Act::Fail, Act::Fail, Act::Fail, Act::Fail, Act::Ok(0)];
    let s = script(&[(7, &fails)]);
    let mut r = runner(cfg(1), &s);
    r.schedule(7, 1);
    let done = drain(&mut r).await;
    assert_eq!(
        done.iter().map(|f| f.failures).collect::<Vec<_>>(),
        [1, 2, 3, 4, 0]
    );
    let starts: Vec<Instant> = s.lock().unwrap().starts.iter().map(|x| x.2).collect();
    // Each failed attempt itself takes 1 ms; the gap after the n-th failure is drawn from
    // [c/2, c] with c = 100 ms doubling (equal jitter).
    let mut ceiling = Duration::from_millis(100);
    let mut gaps = Vec::new();
    for w in starts.windows(2) {
        let gap = w[1] - w[0] - Duration::from_millis(1);
        assert!(
            gap >= ceiling / 2 && gap <= ceiling,
            "gap {gap:?} outside [{:?}, {ceiling:?}]",
            ceiling / 2
        );
        gaps.push(gap);
        ceiling *= 2;
    }
    assert!(
        gaps.windows(2).any(|w| w[1] != w[0] * 2),
        "jitter makes the delays other than exact doublings: {gaps:?}"
    );
    assert_eq!(r.stats().retries, 4);

    // The success reset the back-off: the next failure waits at most the initial delay again.
    s.lock().unwrap().acts.insert(7, [Act::Fail].into());
    r.schedule(7, 2);
    let t = Instant::now();
    drain(&mut r).await;
    let starts = &s.lock().unwrap().starts;
    let last = starts[starts.len() - 1].2;
    assert!(last - t <= Duration::from_millis(101), "{:?}", last - t);
}

#[tokio::test(start_paused = true)]
async fn retry_after_is_honoured() {
    let s = script(&[(1, &[Act::RetryAfter(5000)])]);
    let mut r = runner(cfg(1), &s);
    r.schedule(1, 1);
    drain(&mut r).await;
    let starts: Vec<Instant> = s.lock().unwrap().starts.iter().map(|x| x.2).collect();
    assert_eq!(starts.len(), 2);
    assert!(starts[1] - starts[0] >= Duration::from_millis(5001));
}

#[tokio::test(start_paused = true)]
async fn a_new_state_during_back_off_waits_and_then_runs_newest() {
    let s = script(&[(1, &[Act::Fail])]);
    let mut r = runner(cfg(1), &s);
    r.schedule(1, 1);
    let first = r.next().await;
    assert_eq!((first.output.unwrap(), first.failures), (1, 1));
    let failed_at = Instant::now();
    r.schedule(1, 2);
    assert_eq!(r.in_flight(), 0, "the back-off is not cut short");
    let second = r.next().await;
    assert_eq!((second.output.unwrap(), second.failures), (2, 0));
    let starts = &s.lock().unwrap().starts;
    assert_eq!(starts.len(), 2);
    assert!(starts[1].2 - failed_at >= Duration::from_millis(50));
    assert!(r.is_idle());
}

#[tokio::test(start_paused = true)]
async fn a_panicking_job_is_reported_then_retried_and_its_key_is_free() {
    let s = script(&[(3, &[Act::Panic])]);
    let mut r = runner(cfg(2), &s);
    r.schedule(3, 30);
    r.schedule(4, 40);
    let done = drain(&mut r).await;
    let of3: Vec<_> = done.iter().filter(|f| f.key == 3).collect();
    assert_eq!(of3.len(), 2);
    assert!(
        matches!(&of3[0].output, Err(JobPanicked(m)) if m.contains("boom on 3")),
        "{:?}",
        of3[0].output
    );
    assert_eq!(of3[0].failures, 1);
    assert_eq!(
        of3[1].output.as_ref().ok(),
        Some(&30),
        "retried with its state"
    );
    assert_eq!(r.stats().panics, 1);
    assert!(r.is_idle());
    // The key takes new work after the panic.
    r.schedule(3, 31);
    assert_eq!(r.next().await.output.unwrap(), 31);
}

#[tokio::test(start_paused = true)]
async fn forget_drops_pending_work_and_the_running_job_is_not_retried() {
    let s = script(&[(1, &[Act::Fail])]);
    let mut r = runner(cfg(1), &s);
    r.schedule(1, 1);
    r.schedule(1, 2);
    r.forget(&1);
    let f = r.next().await;
    assert_eq!(f.output.unwrap(), 1);
    assert!(
        r.is_idle(),
        "neither retried nor followed by the forgotten state"
    );
    assert_eq!(s.lock().unwrap().starts.len(), 1);
    // A state scheduled after forget, while nothing runs, runs normally.
    r.schedule(1, 3);
    assert_eq!(r.next().await.output.unwrap(), 3);
}

#[tokio::test(start_paused = true)]
async fn then_forget_drops_a_state_that_came_meanwhile() {
    let s = script(&[(1, &[Act::Forget])]);
    let mut r = runner(cfg(1), &s);
    r.schedule(1, 1);
    r.schedule(1, 2);
    let f = r.next().await;
    assert_eq!(f.output.unwrap(), 1);
    assert!(r.is_idle());
}

#[tokio::test(start_paused = true)]
async fn expedite_ends_back_offs() {
    let s = script(&[(1, &[Act::RetryAfter(60_000)])]);
    let mut r = runner(cfg(1), &s);
    r.schedule(1, 1);
    r.next().await;
    let t = Instant::now();
    r.expedite();
    let f = r.next().await;
    assert_eq!(f.output.unwrap(), 1);
    assert!(Instant::now() - t < Duration::from_secs(1));
}

#[tokio::test(start_paused = true)]
async fn next_is_cancel_safe() {
    let s = script(&[(1, &[Act::Ok(500)])]);
    let mut r = runner(cfg(1), &s);
    r.schedule(1, 1);
    // Abandon next() many times while the job runs: nothing is lost.
    for _ in 0..10 {
        let _ = tokio::time::timeout(Duration::from_millis(20), r.next()).await;
    }
    assert_eq!(r.next().await.output.unwrap(), 1);
    assert!(r.is_idle());
}

#[tokio::test(start_paused = true)]
async fn schedule_in_waits_unless_the_key_is_busy() {
    let s = script(&[]);
    let mut r = runner(cfg(1), &s);
    let t = Instant::now();
    r.schedule_in(1, 1, Duration::from_millis(300));
    assert_eq!(r.active(), 0, "waiting out its delay");
    assert_eq!(r.next().await.output.unwrap(), 1);
    let started = s.lock().unwrap().starts[0].2;
    assert_eq!(started - t, Duration::from_millis(300));
    // Busy (queued behind a running key): the requeue joins the pending state, no extra delay.
    r.schedule(2, 20);
    r.schedule(3, 30);
    r.schedule_in(3, 31, Duration::from_secs(60));
    let done = drain(&mut r).await;
    assert_eq!(
        done.iter()
            .map(|f| *f.output.as_ref().unwrap())
            .collect::<Vec<_>>(),
        [20, 31]
    );
    assert!(Instant::now() - t < Duration::from_secs(1));
}
