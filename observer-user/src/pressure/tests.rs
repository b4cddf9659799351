use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::{read::*, *};

const MIB: u64 = 1 << 20;

fn at(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_000) + Duration::from_millis(ms)
}

fn reading(ms: u64, anon_mib: u64, file_mib: u64, short: u64) -> Reading {
    Reading {
        time: at(ms),
        scope: Scope::Container,
        usage_bytes: (anon_mib + file_mib) * MIB,
        limit_bytes: 64 * MIB,
        breakdown: Breakdown {
            anon: anon_mib * MIB,
            file: file_mib * MIB,
            ..Breakdown::default()
        },
        hits: 4,
        short,
        reclaimed_bytes: MIB,
        requested_bytes: MIB,
        growth: None,
        top: Vec::new(),
        crossing: None,
    }
}

#[test]
fn a_cache_loop_at_its_limit_is_never_warned() {
    let mut p = Pressure::default();
    // A file reader: the limit is full of page cache, hit ten times a second for a minute.
    for i in 0..600 {
        assert_eq!(p.apply(reading(i * 100, 2, 62, 0)), Change::Same);
    }
    assert!(!p.warning);
    assert_eq!((p.raises, p.hits), (0, 2400));
}

#[test]
fn a_leak_is_warned_once_with_its_growth_and_lowered_only_after_it_stood() {
    let mut p = Pressure::default();
    // Anonymous memory pushing page cache out of a 64 MiB limit at 8 MiB/s.
    assert_eq!(p.apply(reading(0, 40, 24, 0)), Change::Same);
    assert_eq!(p.apply(reading(1_000, 48, 16, 0)), Change::Same);
    assert_eq!(p.apply(reading(2_000, 56, 8, 0)), Change::Same);
    assert_eq!(p.apply(reading(2_500, 60, 4, 0)), Change::Raised);
    let r = p.raised.last().unwrap();
    assert_eq!(r.growth, Some(8.0 * MIB as f64));
    // 4 MiB left at 8 MiB/s.
    assert!((r.eta().unwrap() - 0.5).abs() < 1e-9, "{:?}", r.eta());
    assert!(
        r.sentence().contains("growing 8.0 MiB/s: full in ~0.5 s"),
        "{}",
        r.sentence()
    );
    // Still there: no second warning.
    assert_eq!(p.apply(reading(2_600, 61, 3, 0)), Change::Same);
    assert_eq!(p.raises, 1);
    // Back down (the leak freed), but within MIN_WARNING: it stands.
    assert_eq!(p.apply(reading(10_000, 20, 44, 0)), Change::Same);
    assert!(p.warning);
    assert_eq!(p.apply(reading(2_600 + 30_000, 20, 44, 0)), Change::Lowered);
    assert!(!p.warning);
}

#[test]
fn between_the_thresholds_nothing_flaps() {
    let mut p = Pressure::default();
    assert_eq!(p.apply(reading(0, 58, 6, 0)), Change::Raised); // 90.6 %
                                                               // Around 85 %: neither warn nor calm, for minutes.
    for i in 1..300 {
        let anon = if i % 2 == 0 { 54 } else { 55 };
        assert_eq!(
            p.apply(reading(i * 1_000, anon, 64 - anon, 0)),
            Change::Same
        );
    }
    assert!(p.warning);
    assert_eq!(p.raises, 1);
}

#[test]
fn reclaim_falling_short_warns_earlier() {
    let r = reading(0, 52, 12, 0); // 81 %
    assert_eq!(r.verdict(), Verdict::Hold);
    let r = reading(0, 52, 12, 2);
    assert_eq!(r.verdict(), Verdict::Warn);
    // Short reclaims of a cache-heavy cgroup (dirty pages under writeback) are no warning.
    assert_eq!(reading(0, 8, 56, 3).verdict(), Verdict::Hold);
}

#[test]
fn shmem_and_kernel_memory_count_as_unreclaimable() {
    let mut r = reading(0, 20, 4, 0);
    r.breakdown.shmem = 30 * MIB;
    r.breakdown.kernel = 8 * MIB;
    assert_eq!(r.verdict(), Verdict::Warn, "{}", r.sentence());
}

#[test]
fn a_quiet_warning_is_read_again() {
    let mut p = Pressure::default();
    p.apply(reading(0, 62, 2, 0));
    assert!(!p.recheck_due(at(10_000)));
    assert!(p.recheck_due(at(30_000)));
}

#[test]
fn memory_stat_v2() {
    // 12 MiB of file: 4 shmem, 7 on the file lists, 1 on ramfs (unevictable).
    let stat = "anon 52428800\nfile 12582912\nkernel 3145728\nkernel_stack 65536\n\
                pagetables 131072\nsock 0\nshmem 4194304\nactive_file 3145728\n\
                inactive_file 4194304\nslab_reclaimable 1048576\n\
                slab_unreclaimable 262144\nbogus line\nfile_mapped x\n";
    let b = breakdown_v2(stat);
    assert_eq!(
        b,
        Breakdown {
            anon: 50 * MIB,
            file: 7 * MIB,
            shmem: 4 * MIB,
            locked: MIB,
            kernel: 2 * MIB,
            freed_since: 0,
        }
    );
    assert_eq!(b.unreclaimable(), 57 * MIB);
    // Before `kernel` existed (Linux < 5.18): the parts.
    let old = "anon 1048576\nfile 0\nkernel_stack 16384\npagetables 8192\npercpu 4096\nslab_unreclaimable 4096\n";
    assert_eq!(breakdown_v2(old).kernel, 32768);
}

#[test]
fn memory_stat_v1_uses_the_hierarchy_totals() {
    let stat = "cache 0\nrss 0\nshmem 0\ntotal_cache 20971520\ntotal_rss 41943040\n\
                total_shmem 2097152\ntotal_active_file 8388608\ntotal_inactive_file 10485760\n";
    assert_eq!(
        breakdown_v1(stat),
        Breakdown {
            anon: 40 * MIB,
            file: 18 * MIB,
            shmem: 2 * MIB,
            locked: 0,
            kernel: 0,
            freed_since: 0,
        }
    );
}

#[test]
fn sizes_read_as_people_write_them() {
    assert_eq!(mib(0), "0 B");
    assert_eq!(mib(512 << 10), "512 KiB");
    assert_eq!(mib(64 * MIB), "64.0 MiB");
}

#[test]
fn a_cgroup_and_its_parents_up_to_the_root() {
    let up: Vec<String> = ancestry_of("/kubepods/burstable/podx/abc").collect();
    assert_eq!(
        up,
        [
            "/kubepods/burstable/podx/abc",
            "/kubepods/burstable/podx",
            "/kubepods/burstable",
            "/kubepods"
        ]
    );
    assert_eq!(ancestry_of("/").count(), 0);
}

#[test]
fn what_the_kernel_could_not_reclaim_counts_when_it_was_gone_before_the_read() {
    // Reclaim freed nothing at the hit (63 MiB charged); the read came after the kill.
    let mut r = reading(0, 1, 1, 4);
    r.breakdown.freed_since = 61 * MIB;
    assert_eq!(r.verdict(), Verdict::Warn);
    assert!(
        r.sentence()
            .contains("61.0 MiB more the kernel could not reclaim at the hit"),
        "{}",
        r.sentence()
    );
}

/// A reading at the kernel's crossing of `bp` basis points of the limit.
fn crossed(ms: u64, anon_kib: u64, file_kib: u64, bp: u32) -> Reading {
    let mut r = reading(ms, 0, 0, 0);
    r.usage_bytes = (anon_kib + file_kib) * 1024;
    r.breakdown.anon = anon_kib * 1024;
    r.breakdown.file = file_kib * 1024;
    r.hits = 0;
    r.crossing = Some(Crossed {
        threshold_bp: bp,
        estimate: None,
    });
    r
}

#[test]
fn a_pure_leak_is_warned_at_its_crossing_with_the_time_left() {
    let mut p = Pressure::default();
    // Anonymous memory at 8 MiB/s into 64 MiB: 75 % (48 MiB) then 86 % (55.04 MiB) 0.88 s later.
    assert_eq!(p.apply(crossed(0, 48 * 1024, 0, 7500)), Change::Same);
    assert_eq!(p.apply(crossed(880, 56_361, 0, 8600)), Change::Raised);
    let r = p.raised.last().unwrap();
    let e = r.projected().expect("a projection");
    assert_eq!((e.from_bp, e.interval), (7500, Duration::from_millis(880)));
    // (64 MiB - 55.04 MiB) at ~8 MiB/s: about 1.1 s left.
    let left = e.time_left.unwrap();
    assert!((1.0..1.3).contains(&left), "{left}");
    assert!(
        r.sentence()
            .contains("(between its crossings of 75 % and 86 % of the limit, 0.9 s apart)"),
        "{}",
        r.sentence()
    );
}

#[test]
fn a_page_cache_recrossing_its_top_thresholds_is_never_warned() {
    let mut p = Pressure::default();
    // A file reader at its limit: 95 % crossed again every 100 ms as reclaim frees and it reads
    // on; what cannot be reclaimed (a few hundred KiB) moves by 240 KiB between crossings,
    // which as a rate (2.3 MiB/s) would fill the limit within the horizon (as seen on the test
    // cluster: "296 KiB … growing 2.4 MiB/s … full in ~26.7 s").
    for i in 0..600 {
        let unreclaimable = 100 + (i % 2) * 240;
        let change = p.apply(crossed(i * 100, unreclaimable, 62_000, 9500));
        assert_eq!(change, Change::Same, "crossing {i}");
    }
    assert!(!p.warning);
    assert_eq!(p.raises, 0);
}

#[test]
fn a_heap_that_stops_at_85_percent_is_not_warned() {
    let mut p = Pressure::default();
    // Fast to 85 % (54.4 MiB), crossing 50 and 75 % on its way; the kernel's next is 86 %.
    assert_eq!(p.apply(crossed(0, 32 * 1024, 0, 5000)), Change::Same);
    assert_eq!(p.apply(crossed(200, 48 * 1024, 0, 7500)), Change::Same);
    assert!(!p.warning);
    // There it stays: no further record, and nothing to lower.
    assert_eq!(p.raises, 0);
}

#[test]
fn a_heap_that_stays_at_95_percent_is_warned_and_stays_warned() {
    let mut p = Pressure::default();
    // Fast to 95 % (60.8 MiB), crossing every threshold on its way; warned at 90 %.
    assert_eq!(p.apply(crossed(0, 32 * 1024, 0, 5000)), Change::Same);
    assert_eq!(p.apply(crossed(200, 48 * 1024, 0, 7500)), Change::Same);
    assert_eq!(p.apply(crossed(300, 56_361, 0, 8600)), Change::Raised);
    assert_eq!(p.apply(crossed(350, 58_983, 0, 9000)), Change::Same);
    assert_eq!(p.apply(crossed(400, 62_260, 0, 9500)), Change::Same);
    // Then no record: the quiet rereads find it where it stopped, and the warning stands.
    for i in 1..=4 {
        let now = at(400 + i * QUIET.as_millis() as u64);
        assert!(p.recheck_due(now));
        let mut r = reading(0, 0, 0, 0);
        r.time = now;
        r.breakdown.anon = 62_260 * 1024;
        r.usage_bytes = r.breakdown.anon;
        assert_eq!(p.apply(r), Change::Same, "reread {i}");
        assert!(p.warning);
    }
    assert_eq!(p.raises, 1);
}

#[test]
fn a_reader_is_told_each_warning_and_its_end_once() {
    let mut p = Pressure::default();
    let mut told = Told::default();
    assert!(p.news(&mut told).is_empty());
    p.apply(crossed(0, 48 * 1024, 0, 7500));
    p.apply(crossed(880, 56_361, 0, 8600));
    let news = p.news(&mut told);
    let [News::Raised(r)] = news.as_slice() else {
        panic!("{news:?}")
    };
    assert_eq!(r.time, at(880));
    // Told once.
    assert!(p.news(&mut told).is_empty());
    p.apply(crossed(950, 62_260, 0, 9500));
    assert!(p.news(&mut told).is_empty());
    // Freed to a third after 40 s: the warning ends, told once.
    let mut calm = reading(40_950, 20, 0, 0);
    calm.hits = 0;
    assert_eq!(p.apply(calm), Change::Lowered);
    let news = p.news(&mut told);
    let [News::Ended { at: ended, last }] = news.as_slice() else {
        panic!("{news:?}")
    };
    assert_eq!(
        (*ended, last.map(|r| r.breakdown.anon)),
        (at(40_950), Some(20 * MIB))
    );
    assert!(p.news(&mut told).is_empty());
    // Raised and lowered between two looks: both, in order.
    p.apply(crossed(80_000, 62_260, 0, 9500));
    let mut calm = reading(120_000, 20, 0, 0);
    calm.hits = 0;
    assert_eq!(p.apply(calm), Change::Lowered);
    let news = p.news(&mut told);
    assert!(
        matches!(news.as_slice(), [News::Raised(_), News::Ended { .. }]),
        "{news:?}"
    );
}
