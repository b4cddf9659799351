//! A burst of deaths on the fast path's own connection: the depth bound and the order.
use std::{
    io::{Read, Write},
    sync::Arc,
    time::{Duration, Instant},
};

use super::*;
use crate::{
    kube::testkit::{container, pod, spec, with_gate},
    reconcile::{testkit::cv, testkit::view, ContainerPhase::Running},
};

/// A loopback API server that answers every request 200 as soon as it has read it whole, and
/// returns the request lines in the order they came.
fn answer_each(expected: usize) -> (std::net::SocketAddr, std::thread::JoinHandle<Vec<String>>) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let t = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let (mut buf, mut lines) = (Vec::new(), Vec::new());
        let mut chunk = [0u8; 8192];
        while lines.len() < expected {
            // One whole request: its head, then Content-Length bytes.
            while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..end]).to_string();
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("Content-Length: "))
                    .map_or(0, |n| n.trim().parse().unwrap());
                if buf.len() < end + 4 + len {
                    break;
                }
                buf.drain(..end + 4 + len);
                lines.push(head.lines().next().unwrap_or_default().to_string());
                s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
                    .unwrap();
            }
            if lines.len() >= expected {
                break;
            }
            match s.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        lines
    });
    (addr, t)
}

/// Eight pods die at once, the gated one last: [`DEPTH`] requests go on the one connection,
/// the others wait on the thread, and the gated pod's goes out before the plain ones that died
/// before it. Every death is written, once.
#[test]
fn in_a_burst_a_gated_pods_first_death_goes_before_the_waiting_others() {
    const PODS: usize = 8;
    let types = ConditionTypes::default();
    let ledger = Arc::new(AliveLedger::default());
    let mut pods = Vec::new();
    for i in 0..PODS {
        let mut v = view(vec![cv("app", 0, Running)]);
        v.uid = crate::model::PodUid::parse(&format!("00000000-0000-0000-0000-{i:012}")).unwrap();
        v.name = format!("p{i}");
        let gated = i == PODS - 1;
        let s = spec("Always", vec![], vec![container("app")]);
        let mut p = pod(if gated { with_gate(s, &types.alive) } else { s }, None);
        p.metadata.uid = Some(v.uid.to_string());
        p.metadata.name = Some(v.name.clone());
        ledger.prepare(v.uid, &v, &Arc::new(p), &types);
        pods.push((v.uid, v.containers[0].id));
    }
    let (addr, server) = answer_each(PODS);
    let (dialer, dialed) = dial::pair(None, Duration::from_secs(5)).unwrap();
    let s = std::net::TcpStream::connect(addr).unwrap();
    let conn = wire::Conn::new(wire::Stream::Plain(s));
    conn.set_nonblocking().unwrap();
    dialer.hand(
        conn,
        wire::Template {
            prefix: String::new(),
            host: addr.to_string(),
            headers: Vec::new(),
        },
    );
    let stats = Arc::new(FastStats::default());
    let mut hook = FastDeaths::new(
        DeathDecider {
            types,
            ledger: Arc::clone(&ledger),
            stats: Arc::clone(&stats),
            clock: crate::model::system_clock(),
        },
        crate::model::BootClock::default(),
        "observer",
        Duration::from_secs(10),
        dialed,
    );

    // All in one batch of the reader: nothing is answered in between.
    for (uid, id) in &pods {
        hook.event(&exited_1(*uid, *id), SystemTime::now());
    }
    assert_eq!(hook.conns.len(), 1, "the connection handed over");
    assert_eq!(hook.conns[0].in_flight(), DEPTH, "no deeper than DEPTH");
    assert_eq!(FastStats::get(&stats.waited), (PODS - DEPTH) as u64);

    // The reader's loop: poll, answers, the waiting deaths onto the freed slots.
    let deadline = Instant::now() + Duration::from_secs(10);
    while FastStats::get(&stats.written) < PODS as u64 && Instant::now() < deadline {
        let mut fds = Vec::new();
        hook.interest(&mut fds);
        // SAFETY: `fds` are valid pollfds of open sockets for the duration of the call.
        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 100) };
        hook.ready(&fds);
        assert!(hook.conns.iter().all(|c| c.in_flight() <= DEPTH));
    }
    assert_eq!(
        FastStats::get(&stats.written),
        PODS as u64,
        "every death written"
    );
    let order: Vec<String> = server
        .join()
        .unwrap()
        .iter()
        .map(|l| {
            l.split("/pods/")
                .nth(1)
                .and_then(|r| r.split('/').next())
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    // The first DEPTH went out at once; of those that waited, the gated pod's first.
    let want: Vec<String> = (0..DEPTH)
        .chain([PODS - 1])
        .chain(DEPTH..PODS - 1)
        .map(|i| format!("p{i}"))
        .collect();
    assert_eq!(
        order, want,
        "the gated pod's death first among those that waited"
    );
}
