//! `Communicator::from_env`'s TCP rendezvous against peers that trickle bytes (audit 4 G04): one
//! deadline bounds the whole exchange, on rank 0's serving side and on a peer's fetching side, so
//! a peer sending one byte every 0.3 s cannot keep a rank waiting past `ASCEND_RENDEZVOUS_TIMEOUT`.
//! The environment is process-wide: the cases run in a child process (this binary re-run).
#![cfg(feature = "mock")]

#[path = "common/self_exec.rs"]
mod self_exec;

use std::env;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ascend::hccl::Communicator;
use self_exec::{expect_success, run_as_child, spawn_self};

const ROLE: &str = "ASCEND_TEST_RENDEZVOUS_ROLE";
/// Between two trickled bytes.
const TRICKLE: Duration = Duration::from_millis(300);
/// `ASCEND_RENDEZVOUS_TIMEOUT` in the child, and the most a failing `from_env` may take beyond it
/// (generous for a loaded machine; unbounded reads took the trickle's whole length, 12 s here).
const TIMEOUT_S: u64 = 1;
const MARGIN: Duration = Duration::from_millis(1500);

/// A free loopback port (bound, then released).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Sends `bytes` one at a time, `TRICKLE` apart, until they run out, `stop` is set or a write fails.
fn trickle(s: &mut TcpStream, bytes: &[u8], stop: &AtomicBool) {
    for b in bytes {
        if stop.load(Ordering::Relaxed) || s.write_all(&[*b]).is_err() {
            return;
        }
        std::thread::sleep(TRICKLE);
    }
}

/// Connects to 127.0.0.1:`port`, retrying for up to 5 s while nothing listens there yet.
fn connect_when_listening(port: u16) -> TcpStream {
    let give_up = Instant::now() + Duration::from_secs(5);
    loop {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => return s,
            Err(_) if Instant::now() < give_up => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("rank 0 never listened on {port}: {e}"),
        }
    }
}

/// A hello that never ends: magic, version 1, rank 1 of 2, a job id said to be 4096 bytes long.
fn endless_hello() -> Vec<u8> {
    let mut hello = b"ASCENDRZ".to_vec();
    for v in [1u32, 1, 2, 4096] {
        hello.extend_from_slice(&v.to_le_bytes());
    }
    hello.extend_from_slice(&[b'j'; 20]);
    hello
}

/// Calls `from_env` on a mock context as `RANK=rank` of 2 on 127.0.0.1:`port`; returns its error
/// text after checking that it came within the timeout and the margin.
fn from_env_fails_in_time(rank: u32, port: u16) -> String {
    for (k, v) in [
        ("RANK", rank.to_string()),
        ("WORLD_SIZE", "2".into()),
        ("MASTER_ADDR", "127.0.0.1".into()),
        ("MASTER_PORT", port.to_string()),
        ("ASCEND_RENDEZVOUS_TIMEOUT", TIMEOUT_S.to_string()),
    ] {
        env::set_var(k, v);
    }
    let ctx = ascend::mock::context(0).unwrap();
    let start = Instant::now();
    let e = Communicator::from_env(&ctx).expect_err("the peer never completes the exchange").to_string();
    let took = start.elapsed();
    assert!(
        took < Duration::from_secs(TIMEOUT_S) + MARGIN,
        "rank {rank} waited {took:?} for a timeout of {TIMEOUT_S} s: {e}"
    );
    e
}

#[test]
fn a_trickling_peer_cannot_stretch_the_rendezvous_timeout() {
    if !run_as_child("a_trickling_peer_cannot_stretch_the_rendezvous_timeout", ROLE, "child") {
        return;
    }
    let stop = AtomicBool::new(false);
    // Rank 0 serving: a local process connects and trickles a hello whose job id claims 4096 bytes.
    let port = free_port();
    let e = std::thread::scope(|sc| {
        sc.spawn(|| trickle(&mut connect_when_listening(port), &endless_hello(), &stop));
        let e = from_env_fails_in_time(0, port);
        stop.store(true, Ordering::Relaxed);
        e
    });
    for w in ["rank(s) 1 of WORLD_SIZE=2, which did not join", "unfinished connections: 127.0.0.1:", "its hello: "] {
        assert!(e.contains(w), "`{w}` missing from: {e}");
    }
    assert!(!e.contains("never connected"), "a stray peer's connection is not rank 1's: {e}");
    // Rank 1 fetching: a "rank 0" reads the hello, then trickles its answer.
    stop.store(false, Ordering::Relaxed);
    let fake = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = fake.local_addr().unwrap().port();
    let e = std::thread::scope(|sc| {
        sc.spawn(|| {
            let (mut s, _) = fake.accept().unwrap();
            let mut hello = [0u8; 4096];
            let _ = s.read(&mut hello);
            let mut answer = b"ASCENDRZ\0".to_vec();
            answer.extend_from_slice(&[0; 4]);
            answer.extend_from_slice(&4108u32.to_le_bytes());
            answer.extend_from_slice(&[7; 20]);
            trickle(&mut s, &answer, &stop);
        });
        let e = from_env_fails_in_time(1, port);
        stop.store(true, Ordering::Relaxed);
        e
    });
    for w in ["rank 1: rank 0 at 127.0.0.1:", "no complete answer within 1 s (ASCEND_RENDEZVOUS_TIMEOUT)", "its answer"]
    {
        assert!(e.contains(w), "`{w}` missing from: {e}");
    }
}

/// A trickling stray connects to rank 0 first; rank 1 comes after it and still joins, well within
/// the timeout: each connection is served on its own thread.
#[test]
fn a_trickling_stray_does_not_hold_up_the_next_peer() {
    match env::var(ROLE).as_deref() {
        Ok("rank") => {
            let ctx = ascend::mock::context(env::var("RANK").unwrap().parse().unwrap()).unwrap();
            let start = Instant::now();
            let comm = Communicator::from_env(&ctx).unwrap_or_else(|e| panic!("{e}"));
            assert!(start.elapsed() < Duration::from_secs(3), "joined after {:?}", start.elapsed());
            drop(comm);
            return;
        }
        Ok(_) => return,
        Err(_) => {}
    }
    let port = free_port();
    let rank = |r: u32| {
        let vars = [
            (ROLE, "rank".to_string()),
            ("RANK", r.to_string()),
            ("WORLD_SIZE", "2".into()),
            ("MASTER_ADDR", "127.0.0.1".into()),
            ("MASTER_PORT", port.to_string()),
            ("ASCEND_RENDEZVOUS_TIMEOUT", "6".into()),
            ("ASCEND_MOCK_DEVICE_COUNT", "2".into()),
        ];
        spawn_self("a_trickling_stray_does_not_hold_up_the_next_peer", &vars)
    };
    let stop = AtomicBool::new(false);
    std::thread::scope(|sc| {
        let rank0 = rank(0);
        let mut stray = connect_when_listening(port);
        let stop = &stop;
        sc.spawn(move || trickle(&mut stray, &endless_hello(), stop));
        let rank1 = rank(1);
        for (r, child) in [rank0, rank1].into_iter().enumerate() {
            expect_success(&format!("rank {r}"), &child.wait_with_output().unwrap());
        }
        stop.store(true, Ordering::Relaxed);
    });
}
