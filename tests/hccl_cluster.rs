//! `Communicator::from_rank_table` on the mock HCCL: ranks as processes (this test binary re-run
//! as children), tables checked before HCCL sees them, and a dead peer reported by
//! `async_error` and by the next collective, never a hang.
#![cfg(feature = "mock")]

#[path = "common/self_exec.rs"]
mod self_exec;

use std::env;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use ascend::hccl::{Communicator, ReduceOp};
use ascend::{Context, Error, Tensor};
use self_exec::{expect_success, run_as_child, spawn_self};

const ROLE: &str = "ASCEND_TEST_CLUSTER_ROLE";
const TABLE: &str = "ASCEND_TEST_CLUSTER_TABLE";

static SERIAL: Mutex<()> = Mutex::new(());

fn setup() -> MutexGuard<'static, ()> {
    static INIT: OnceLock<()> = OnceLock::new();
    INIT.get_or_init(|| {
        env::set_var("ASCEND_MOCK_DEVICE_COUNT", "8");
        env::set_var("HCCL_CONNECT_TIMEOUT", "30");
        env::set_var("HCCL_EXEC_TIMEOUT", "30");
    });
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// A fresh scratch directory for this test.
fn scratch(name: &str) -> PathBuf {
    let dir = env::temp_dir().join(format!("ascend-cluster-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A version 1.0 table: `n` ranks, two per server, rank r on device r.
fn table_v1(n: u32) -> String {
    let servers: Vec<String> = (0..n.div_ceil(2))
        .map(|s| {
            let devices: Vec<String> = (2 * s..(2 * s + 2).min(n))
                .map(|r| format!(r#"{{"device_id":"{r}","device_ip":"192.168.{s}.{r}","rank_id":"{r}"}}"#))
                .collect();
            format!(r#"{{"server_id":"node_{s}","device":[{}]}}"#, devices.join(","))
        })
        .collect();
    format!(
        r#"{{"status":"completed","version":"1.0","server_count":"{}","server_list":[{}]}}"#,
        servers.len(),
        servers.join(",")
    )
}

/// A version 2.0 table (Ascend 950): `n` ranks, rank r on device r.
fn table_v2(n: u32) -> String {
    let ranks: Vec<String> =
        (0..n).map(|r| format!(r#"{{"rank_id":{r},"device_id":{r},"local_id":{r},"level_list":[]}}"#)).collect();
    format!(r#"{{"status":"completed","version":"2.0","rank_count":{n},"rank_list":[{}]}}"#, ranks.join(","))
}

/// Rank `rank`'s data for the all-reduce (distinct per rank, never zeros).
fn data(rank: u32, len: usize) -> Vec<f32> {
    (0..len).map(|i| ((i as f64 * 0.37 + rank as f64 * 1.91).sin() * 3.0) as f32).collect()
}

/// What each rank does: an all-reduce (sum) checked against an f64 reference, and an all-gather.
fn workload(comm: &Communicator, ctx: &Context) {
    let (n, rank) = (comm.size(), comm.rank());
    let stream = ctx.new_stream().unwrap();
    let mut t = Tensor::from_slice(&stream, &data(rank, 129), &[129]).unwrap();
    comm.all_reduce(&stream, &mut t, ReduceOp::Sum).unwrap();
    let got = t.to_vec::<f32>(&stream).unwrap();
    for (i, g) in got.iter().enumerate() {
        let want: f64 = (0..n).map(|r| data(r, 129)[i] as f64).sum();
        assert!((*g as f64 - want).abs() <= 1e-5 * (1.0 + want.abs()), "rank {rank} [{i}]: {g} vs {want}");
    }
    let mine = Tensor::from_slice(&stream, &[rank as f32; 2], &[2]).unwrap();
    let mut all = Tensor::from_slice(&stream, &vec![-1f32; 2 * n as usize], &[2 * n as usize]).unwrap();
    comm.all_gather(&stream, &mine, &mut all).unwrap();
    let want: Vec<f32> = (0..n).flat_map(|r| [r as f32; 2]).collect();
    assert_eq!(all.to_vec::<f32>(&stream).unwrap(), want);
    assert!(comm.async_error().unwrap().is_none());
}

fn join(table: &Path, rank: u32) -> (Context, Communicator) {
    let ctx = ascend::mock::context(rank as i32).unwrap();
    let comm = Communicator::from_rank_table(&ctx, table, rank).unwrap_or_else(|e| panic!("rank {rank}: {e}"));
    assert_eq!(comm.rank(), rank);
    (ctx, comm)
}

/// 2 ranks from a version 1.0 table and 4 from a version 2.0 table, each rank a process.
#[test]
fn rank_table_over_2_and_4_processes() {
    let _g = setup();
    if let Ok(role) = env::var(ROLE) {
        let rank: u32 = role.strip_prefix("rank:").unwrap().parse().unwrap();
        let (ctx, comm) = join(Path::new(&env::var(TABLE).unwrap()), rank);
        workload(&comm, &ctx);
        return;
    }
    let dir = scratch("ok");
    for (n, text) in [(2u32, table_v1(2)), (4, table_v2(4))] {
        let path = dir.join(format!("rank_table_{n}.json"));
        std::fs::write(&path, text).unwrap();
        let children: Vec<_> = (1..n)
            .map(|r| {
                spawn_self(
                    "rank_table_over_2_and_4_processes",
                    &[(ROLE, format!("rank:{r}")), (TABLE, path.display().to_string())],
                )
            })
            .collect();
        let before = ascend::mock::stats();
        let (ctx, comm) = join(&path, 0);
        assert_eq!(comm.size(), n);
        workload(&comm, &ctx);
        drop(comm);
        for (i, c) in children.into_iter().enumerate() {
            expect_success(&format!("rank {} of {n}", i + 1), &c.wait_with_output().unwrap());
        }
        let after = ascend::mock::stats();
        assert_eq!(after.live_comms, before.live_comms);
        assert_eq!(after.violations, before.violations);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[track_caller]
fn rejected(ctx: &Context, path: &Path, rank: u32, argument: &str, words: &[&str]) {
    let before = ascend::mock::stats();
    let e = Communicator::from_rank_table(ctx, path, rank).expect_err("a bad table");
    let text = e.to_string();
    assert!(matches!(&e, Error::InvalidArgument { argument: a, .. } if *a == argument), "{e:?}");
    for w in words {
        assert!(text.contains(w), "`{w}` missing from: {text}");
    }
    let after = ascend::mock::stats();
    assert_eq!((after.live_comms, after.violations), (before.live_comms, before.violations), "nothing changed");
}

/// Missing files, bad JSON, bad tables and ranks outside the table are errors naming the path
/// and the problem, before HCCL sees the file.
#[test]
fn bad_rank_tables_are_errors_naming_the_file() {
    let _g = setup();
    let ctx = ascend::mock::context(0).unwrap();
    let dir = scratch("bad");
    let missing = dir.join("missing.json");
    rejected(&ctx, &missing, 0, "path", &["missing.json", "cannot be opened"]);
    rejected(&ctx, &dir, 0, "path", &["not a regular file"]);
    let long = PathBuf::from(format!("/{}", "a".repeat(4096)));
    rejected(&ctx, &long, 0, "path", &["at most 4095 bytes", "4097"]);
    let cases = [
        ("truncated.json", table_v1(2)[..40].to_string(), vec!["truncated.json", "not valid JSON"]),
        ("comment.json", format!("// my cluster\n{}", table_v1(2)), vec!["comments are not allowed"]),
        ("initializing.json", table_v1(2).replace("completed", "initializing"), vec!["\"status\""]),
        ("version.json", table_v1(2).replace("\"1.0\"", "\"0.9\""), vec!["version \"0.9\""]),
        ("gap.json", table_v1(3).replace(r#""rank_id":"1""#, r#""rank_id":"5""#), vec!["rank_id 1 is missing"]),
        ("twice.json", table_v1(2).replace(r#""rank_id":"1""#, r#""rank_id":"0""#), vec!["appears twice"]),
        ("no_device.json", table_v1(2).replace(r#""device_id":"1","#, ""), vec!["device[1]", "device_id"]),
        ("count.json", table_v2(2).replace("\"rank_count\":2", "\"rank_count\":3"), vec!["rank_count"]),
    ];
    for (name, text, words) in cases {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        rejected(&ctx, &path, 0, "path", &words);
    }
    let good = dir.join("good.json");
    std::fs::write(&good, table_v1(2)).unwrap();
    rejected(&ctx, &good, 2, "rank", &["rank 2 is not a rank_id", "good.json", "0..1"]);
    // The table places rank 1 on device_id 1; ctx is device 0 (audit 4 G05).
    rejected(&ctx, &good, 1, "ctx", &["good.json", "rank 1 on device_id 1", "ctx is device 0"]);
    let v2 = dir.join("good_v2.json");
    std::fs::write(&v2, table_v2(2)).unwrap();
    rejected(&ascend::mock::context(1).unwrap(), &v2, 0, "ctx", &["good_v2.json", "rank 0 on device_id 0", "device 1"]);
    let e = Communicator::from_rank_table(&Context::cpu(), &good, 0).unwrap_err();
    assert!(e.to_string().contains("CPU engine joins ranks in one process only"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A peer process that dies after joining: `async_error` reports it (HCCL_E_REMOTE, naming the
/// rank) and the next collective fails at its stream's synchronisation, within seconds.
#[test]
fn a_dead_peer_is_an_async_error_and_fails_the_next_collective() {
    let _g = setup();
    if env::var(ROLE).as_deref() == Ok("die") {
        let (_ctx, comm) = join(Path::new(&env::var(TABLE).unwrap()), 1);
        std::mem::forget(comm);
        std::process::exit(0); // dies without destroying its communicator
    }
    let dir = scratch("dead");
    let path = dir.join("rank_table.json");
    std::fs::write(&path, table_v1(2)).unwrap();
    let child = spawn_self(
        "a_dead_peer_is_an_async_error_and_fails_the_next_collective",
        &[(ROLE, "die".into()), (TABLE, path.display().to_string())],
    );
    let (ctx, comm) = join(&path, 0);
    let out = child.wait_with_output().unwrap(); // reaped: its pid is gone
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let e = comm.async_error().unwrap().expect("the peer died");
    assert_eq!(e.hccl_result(), Some(21), "HCCL_E_REMOTE: {e}");
    assert!(e.to_string().contains("rank 1"), "{e}");
    let stream = ctx.new_stream().unwrap();
    let mut t = Tensor::from_slice(&stream, &data(0, 16), &[16]).unwrap();
    let start = Instant::now();
    let r = comm.all_reduce(&stream, &mut t, ReduceOp::Sum).and_then(|()| stream.synchronize());
    assert!(r.is_err(), "a collective with a dead peer must fail");
    assert!(start.elapsed() < Duration::from_secs(10), "no hang: {:?}", start.elapsed());
    drop(t);
    drop(comm);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A free loopback port (bound, then released).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

const LAUNCH_VARS: [&str; 8] =
    ["RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "RANK_TABLE_FILE", "RANK_ID", "ASCEND_JOB_ID", "LOCAL_RANK"];

/// torchrun's variables for rank `rank` of `n` on 127.0.0.1:`port`.
fn launch_env(rank: u32, n: u32, port: u16) -> Vec<(&'static str, String)> {
    vec![
        ("RANK", rank.to_string()),
        ("LOCAL_RANK", rank.to_string()),
        ("WORLD_SIZE", n.to_string()),
        ("MASTER_ADDR", "127.0.0.1".into()),
        ("MASTER_PORT", port.to_string()),
    ]
}

/// 2 and 4 processes meeting through `from_env` (TCP rendezvous on 127.0.0.1), and 2 through
/// `RANK_TABLE_FILE` + `RANK_ID`.
#[test]
fn from_env_over_2_and_4_processes() {
    let _g = setup();
    if env::var(ROLE).as_deref() == Ok("env") {
        let local: i32 = env::var("LOCAL_RANK").or_else(|_| env::var("RANK_ID")).unwrap().parse().unwrap();
        let ctx = ascend::mock::context(local).unwrap();
        let comm = Communicator::from_env(&ctx).unwrap_or_else(|e| panic!("rank {local}: {e}"));
        workload(&comm, &ctx);
        return;
    }
    for n in [2u32, 4] {
        let port = free_port();
        let ranks: Vec<_> = (0..n)
            .map(|r| {
                let mut e = launch_env(r, n, port);
                e.push((ROLE, "env".into()));
                e.push(("ASCEND_JOB_ID", "test-job".into()));
                spawn_self("from_env_over_2_and_4_processes", &e)
            })
            .collect();
        for (r, c) in ranks.into_iter().enumerate() {
            expect_success(&format!("rank {r} of {n}"), &c.wait_with_output().unwrap());
        }
    }
    let dir = scratch("env-table");
    let path = dir.join("rank_table.json");
    std::fs::write(&path, table_v1(2)).unwrap();
    let ranks: Vec<_> = (0..2u32)
        .map(|r| {
            let e = [(ROLE, "env".into()), ("RANK_TABLE_FILE", path.display().to_string()), ("RANK_ID", r.to_string())];
            spawn_self("from_env_over_2_and_4_processes", &e)
        })
        .collect();
    for (r, c) in ranks.into_iter().enumerate() {
        expect_success(&format!("rank-table rank {r}"), &c.wait_with_output().unwrap());
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Missing and bad variables, a rank 0 that never comes, a peer of another job, a rank 0 whose
/// peers never come: each an error naming the variable or the peer, within the timeout.
#[test]
fn from_env_errors_name_the_variable_or_the_peer() {
    let _g = setup();
    if !run_as_child("from_env_errors_name_the_variable_or_the_peer", ROLE, "errors") {
        return;
    }
    // In a child: the environment is this process's own.
    let ctx = ascend::mock::context(0).unwrap();
    let port = free_port();
    let set = |vars: &[(&str, String)]| {
        for v in LAUNCH_VARS {
            env::remove_var(v);
        }
        for (k, v) in vars {
            env::set_var(k, v);
        }
    };
    let expect = |words: &[&str]| {
        let start = Instant::now();
        let e = Communicator::from_env(&ctx).expect_err("must fail");
        let text = e.to_string();
        for w in words {
            assert!(text.contains(w), "`{w}` missing from: {text}");
        }
        assert!(start.elapsed() < Duration::from_secs(5), "bounded: {:?} for {text}", start.elapsed());
        e
    };
    env::set_var("ASCEND_RENDEZVOUS_TIMEOUT", "1");
    set(&[]);
    expect(&["WORLD_SIZE is not set"]);
    let mut v = launch_env(1, 2, port);
    v.retain(|(k, _)| *k != "MASTER_ADDR");
    set(&v);
    expect(&["MASTER_ADDR is not set"]);
    set(&[("RANK", "x".into()), ("WORLD_SIZE", "2".into())]);
    expect(&["RANK=`x`"]);
    set(&launch_env(2, 2, port));
    expect(&["RANK=2 must be below WORLD_SIZE=2"]);
    set(&launch_env(0, 4_000_000_000, port));
    expect(&["WORLD_SIZE=4000000000 must be in 1..=65536"]);
    let mut v = launch_env(1, 2, port);
    v[4].1 = "70000".into();
    set(&v);
    expect(&["MASTER_PORT=`70000`"]);
    env::set_var("ASCEND_RENDEZVOUS_TIMEOUT", "0");
    set(&launch_env(1, 2, port));
    expect(&["ASCEND_RENDEZVOUS_TIMEOUT=0"]);
    env::set_var("ASCEND_RENDEZVOUS_TIMEOUT", "1");
    // Rank 0 never comes: the peer names it.
    set(&launch_env(1, 2, port));
    let e = expect(&["rank 1 could not reach rank 0 at 127.0.0.1:", "within 1 s"]);
    assert!(matches!(e, Error::Rendezvous(_)), "{e:?}");
    // Rank 0 whose rank 1 never comes names it.
    set(&launch_env(0, 3, port));
    expect(&["rank 0 at 127.0.0.1:", "rank(s) 1, 2 of WORLD_SIZE=3", "never connected"]);
    // A rank of another job is refused, naming both jobs; rank 0 keeps waiting for its own ranks.
    let port_a = free_port();
    let mut v = launch_env(0, 2, port_a);
    v.extend([
        (ROLE, "rank0-job-a".to_string()),
        ("ASCEND_JOB_ID", "job-a".into()),
        ("ASCEND_RENDEZVOUS_TIMEOUT", "3".into()),
    ]);
    let rank0 = spawn_self("a_rank_0_of_job_a", &v);
    set(&launch_env(1, 2, port_a));
    env::set_var("ASCEND_JOB_ID", "job-b");
    env::set_var("ASCEND_RENDEZVOUS_TIMEOUT", "2");
    expect(&["refused it", "serves job `port=", "run=job-a`", "run=job-b`"]);
    expect_success("rank 0 of job a", &rank0.wait_with_output().unwrap());
    env::remove_var("ASCEND_JOB_ID");
    // A "rank 0" that closes the connection in the middle of its answer: a short read, named.
    let liar = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let liar_port = liar.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        use std::io::{Read, Write};
        let (mut s, _) = liar.accept().unwrap();
        let mut hello = [0u8; 4096]; // all of the hello (unread bytes would reset the connection)
        let _ = s.read(&mut hello);
        s.write_all(b"ASCENDRZ\0\x10").unwrap(); // status 0, then half a length
    });
    set(&launch_env(1, 2, liar_port));
    expect(&["rank 1: rank 0 at 127.0.0.1:", "short read"]);
    server.join().unwrap();
    // CPU contexts are refused.
    let e = Communicator::from_env(&Context::cpu()).unwrap_err();
    assert!(e.to_string().contains("CPU engine joins ranks in one process only"), "{e}");
}

/// Rank 0 of "job-a" (a child of the test above): it refuses a rank of another job and fails,
/// naming its missing rank and the refused peer.
#[test]
fn a_rank_0_of_job_a() {
    let _g = setup();
    if env::var(ROLE).as_deref() != Ok("rank0-job-a") {
        return; // only meaningful as the child of from_env_errors_name_the_variable_or_the_peer
    }
    let ctx = ascend::mock::context(0).unwrap();
    let e = Communicator::from_env(&ctx).unwrap_err().to_string();
    assert!(
        e.contains("rank(s) 1 of WORLD_SIZE=2")
            && e.contains("did not join")
            && e.contains("unfinished connections: 127.0.0.1:"),
        "{e}"
    );
}
