//! `ascend::hccl` on the Ascend backend, over the mock CANN's HCCL: the same API and values as
//! on the CPU (tests/hccl_cpu.rs), collectives asynchronous on the streams with every buffer
//! recorded (dropping anything right after a collective is safe), errors carrying HcclResult's
//! name, faults at each HCCL call leaking nothing.
#![cfg(feature = "mock")]

mod common;

use std::sync::{Mutex, MutexGuard, OnceLock};

use ascend::hccl::{Communicator, ReduceOp, RootInfo};
use ascend::{Context, DType, Error, Result, Stream, Tensor};

const DEVICES: usize = 8;

static SERIAL: Mutex<()> = Mutex::new(());

/// Eight mock devices (read by the mock at aclInit, before which nothing here runs), serialised
/// tests (the mock's counters are process-wide).
fn setup() -> MutexGuard<'static, ()> {
    static INIT: OnceLock<()> = OnceLock::new();
    INIT.get_or_init(|| {
        std::env::set_var("ASCEND_MOCK_DEVICE_COUNT", DEVICES.to_string());
        std::env::set_var("HCCL_CONNECT_TIMEOUT", "60");
        std::env::set_var("HCCL_EXEC_TIMEOUT", "60");
    });
    let guard = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    ascend::mock::clear_faults();
    guard
}

fn contexts(n: usize) -> Vec<Context> {
    (0..n as i32).map(|d| ascend::mock::context(d).expect("mock device")).collect()
}

/// Runs `f(rank, communicator, stream)` on one thread per rank, each on a new stream of its
/// context.
fn on_ranks<T: Send>(
    comms: Vec<Communicator>,
    ctxs: &[Context],
    f: impl Fn(u32, &Communicator, &Stream) -> T + Sync,
) -> Vec<T> {
    common::on_ranks(comms, ctxs, |rank, c, ctx| {
        let st = ctx.new_stream().expect("stream");
        f(rank, c, &st)
    })
}

/// Small integers: every sum, product, max and min is exact in every dtype, whatever the order.
fn rank_values(rank: u32, n: usize) -> Vec<f32> {
    (0..n).map(|i| ((i as u32 * 7 + rank * 3) % 5) as f32 - 2.0).collect()
}

fn upload(s: &Stream, dtype: DType, v: &[f32]) -> Result<Tensor> {
    match dtype {
        DType::F16 => {
            Tensor::from_slice(s, &v.iter().map(|&x| ascend::f16::from_f32(x)).collect::<Vec<_>>(), &[v.len()])
        }
        DType::BF16 => {
            Tensor::from_slice(s, &v.iter().map(|&x| ascend::bf16::from_f32(x)).collect::<Vec<_>>(), &[v.len()])
        }
        _ => Tensor::from_slice(s, v, &[v.len()]),
    }
}

fn live_comms() -> u64 {
    ascend::mock::stats().live_comms
}

#[test]
fn collectives_match_the_reference_over_1_2_4_8_ranks() {
    let _g = setup();
    let before = (ascend::mock::stats(), ascend::mock::leaks());
    for n_ranks in [1usize, 2, 4, 8] {
        let ctxs = contexts(n_ranks);
        let comms = Communicator::init_all(&ctxs).expect("init_all over mock devices");
        assert_eq!(comms.len(), n_ranks);
        let results = on_ranks(comms, &ctxs, |rank, c, s| -> Result<()> {
            assert_eq!((c.rank(), c.size()), (rank, n_ranks as u32));
            for dtype in [DType::F32, DType::F16, DType::BF16] {
                let n = 9;
                let all: Vec<Vec<f32>> = (0..n_ranks as u32).map(|r| rank_values(r, n)).collect();
                for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Prod] {
                    if op == ReduceOp::Prod && dtype == DType::BF16 {
                        continue; // HCCL has no PROD for bf16 (A2/A3)
                    }
                    let mut t = upload(s, dtype, &all[rank as usize])?;
                    c.all_reduce(s, &mut t, op)?;
                    let expect: Vec<f32> = (0..n)
                        .map(|i| {
                            let vals = all.iter().map(|v| v[i]);
                            match op {
                                ReduceOp::Sum => vals.sum(),
                                ReduceOp::Prod => vals.product(),
                                ReduceOp::Max => vals.fold(f32::MIN, f32::max),
                                ReduceOp::Min => vals.fold(f32::MAX, f32::min),
                            }
                        })
                        .collect();
                    assert_eq!(t.to_vec::<f32>(s)?, expect, "{n_ranks} ranks {dtype} {op:?} rank {rank}");
                }
                let input = upload(s, dtype, &all[rank as usize])?;
                let mut out = Tensor::zeros(s, dtype, &[n_ranks, n])?;
                c.all_gather(s, &input, &mut out)?;
                assert_eq!(out.to_vec::<f32>(s)?, all.concat(), "{n_ranks} ranks {dtype} all_gather");
                let root = n_ranks as u32 - 1;
                let mut b = upload(s, dtype, &all[rank as usize])?;
                c.broadcast(s, &mut b, root)?;
                assert_eq!(b.to_vec::<f32>(s)?, all[root as usize], "{n_ranks} ranks {dtype} broadcast");
            }
            Ok(())
        });
        results.into_iter().for_each(|r| r.unwrap());
    }
    let after = (ascend::mock::stats(), ascend::mock::leaks());
    assert_eq!(after.0.violations, before.0.violations, "{:?}", ascend::mock::violations_since(before.0.violations));
    assert_eq!(after.0.live_comms, before.0.live_comms, "communicators destroyed");
    assert_eq!(after.0.live_allocations, before.0.live_allocations);
    assert_eq!(after.1, before.1, "no deliberate leak");
}

/// Ranks meeting through a root info (one thread per device, as one process per device would),
/// then everything dropped right after the collective, before any synchronisation: the
/// communicator and the buffers wait for the stream.
#[test]
fn root_info_ranks_and_drops_before_sync() {
    let _g = setup();
    let before = ascend::mock::stats();
    let ctxs = contexts(2);
    let root = RootInfo::new(&ctxs[0]).unwrap();
    assert_ne!(root.as_bytes(), &[0u8; ascend::hccl::ROOT_INFO_BYTES][..]);
    let bytes = root.as_bytes().to_vec();
    let results: Vec<Result<Vec<f32>>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2u32)
            .map(|rank| {
                let (bytes, ctx) = (&bytes, &ctxs[rank as usize]);
                s.spawn(move || {
                    let root = RootInfo::from_bytes(bytes)?;
                    let c = Communicator::init_rank(ctx, 2, &root, rank)?;
                    let st = ctx.new_stream()?;
                    let mut t = Tensor::from_slice(&st, &[rank as f32 + 1.0; 4], &[4])?;
                    let mut keep = Tensor::zeros(&st, DType::F32, &[4])?;
                    c.all_reduce(&st, &mut t, ReduceOp::Sum)?;
                    // A second collective whose buffers are dropped before the stream runs it.
                    let x = Tensor::from_slice(&st, &[1f32; 2], &[2])?;
                    let mut out = Tensor::zeros(&st, DType::F32, &[2, 2])?;
                    c.all_gather(&st, &x, &mut out)?;
                    drop((x, out));
                    keep.copy_from_slice(&st, &t.to_vec::<f32>(&st)?)?;
                    drop(c); // waits for the stream before HcclCommDestroy
                    keep.to_vec::<f32>(&st)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for r in results {
        assert_eq!(r.unwrap(), [3.0; 4]);
    }
    for ctx in &ctxs {
        ctx.empty_cache().unwrap(); // cached blocks are not leaks: compare without them
    }
    let after = ascend::mock::stats();
    assert_eq!(after.violations, before.violations, "{:?}", ascend::mock::violations_since(before.violations));
    assert_eq!((after.live_comms, after.live_allocations), (before.live_comms, before.live_allocations));
}

/// Ranks that disagree: the collective fails on every rank at synchronisation, named.
#[test]
fn mismatched_collectives_are_errors_on_every_rank() {
    let _g = setup();
    let ctxs = contexts(2);
    let comms = Communicator::init_all(&ctxs).unwrap();
    let before = ascend::mock::stats().violations;
    let results = on_ranks(comms, &ctxs, |rank, c, s| -> Result<Vec<f32>> {
        let mut t = Tensor::zeros(s, DType::F32, &[2 + rank as usize])?;
        c.all_reduce(s, &mut t, ReduceOp::Sum)?;
        t.to_vec::<f32>(s)
    });
    for r in results {
        let err = r.expect_err("a count mismatch fails");
        assert!(err.status().is_some(), "{err}");
    }
    assert!(ascend::mock::stats().violations > before, "the mock counts the mismatch");
}

/// Arguments are checked before HCCL sees them, as on the CPU; a fault at each HCCL call the
/// crate makes is an Error::Hccl with that result's name, and leaks no communicator.
#[test]
fn argument_errors_and_faults() {
    let _g = setup();
    let ctxs = contexts(2);
    assert_eq!(Communicator::init_all(&[ctxs[0].clone(), Context::cpu()]).unwrap_err().status(), Some(161002));
    assert_eq!(Communicator::init_all(&[ctxs[0].clone(), ctxs[0].clone()]).unwrap_err().status(), Some(161002));
    let before = live_comms();
    for api in ["HcclCommInitAll", "HcclGetRootInfo"] {
        ascend::mock::fail_next(api, 4);
        let err = if api == "HcclCommInitAll" {
            Communicator::init_all(&ctxs).unwrap_err()
        } else {
            RootInfo::new(&ctxs[0]).unwrap_err()
        };
        assert!(matches!(err, Error::Hccl { result: 4, name: "HCCL_E_INTERNAL", .. }), "{api}: {err:?}");
        assert_eq!(live_comms(), before, "{api}");
    }
    let comms = Communicator::init_all(&ctxs[..1]).unwrap();
    let s = ctxs[0].new_stream().unwrap();
    let mut t = Tensor::zeros(&s, DType::F32, &[3]).unwrap();
    ascend::mock::fail_next("HcclAllReduce", 5);
    let err = comms[0].all_reduce(&s, &mut t, ReduceOp::Sum).unwrap_err();
    assert!(matches!(err, Error::Hccl { call: "HcclAllReduce", result: 5, .. }), "{err:?}");
    // The tensor is on another stream's device: rejected before HCCL.
    let other = ctxs[1].new_stream().unwrap();
    let mut t1 = Tensor::zeros(&other, DType::F32, &[3]).unwrap();
    assert_eq!(comms[0].all_reduce(&other, &mut t1, ReduceOp::Sum).unwrap_err().status(), Some(161002));
    // A strided view.
    let mut v = Tensor::from_slice_strided(&s, &[1f32; 4], &[2], &[2], 0).unwrap();
    assert_eq!(comms[0].all_reduce(&s, &mut v, ReduceOp::Sum).unwrap_err().status(), Some(161002));
    drop(comms);
    assert_eq!(live_comms(), before);
}

/// A fault at each HCCL call the safe layer makes fails that call with the injected result's name
/// and leaks nothing: no communicator, no device memory, no violation; a failed HcclCommDestroy
/// leaks the communicator and says so (ascend::mock::leaks).
#[test]
fn a_fault_at_each_hccl_call_leaks_nothing() {
    let _g = setup();
    let ctxs = contexts(2);
    let before = (ascend::mock::stats(), ascend::mock::leaks());
    // Collectives: one rank faulted, so both ranks' streams stay consistent (the other rank's
    // call is never issued either).
    let comms = Communicator::init_all(&ctxs[..1]).unwrap();
    let s = ctxs[0].new_stream().unwrap();
    for api in ["HcclAllReduce", "HcclAllGather", "HcclBroadcast"] {
        let mut t = Tensor::zeros(&s, DType::F32, &[3]).unwrap();
        let mut out = Tensor::zeros(&s, DType::F32, &[3]).unwrap();
        ascend::mock::fail_next_on_this_thread(api, 7);
        let err = match api {
            "HcclAllReduce" => comms[0].all_reduce(&s, &mut t, ReduceOp::Sum),
            "HcclAllGather" => comms[0].all_gather(&s, &t, &mut out),
            _ => comms[0].broadcast(&s, &mut t, 0),
        }
        .unwrap_err();
        assert!(matches!(err, Error::Hccl { result: 7, name: "HCCL_E_UNAVAIL", .. }), "{api}: {err:?}");
        // The communicator still works afterwards.
        comms[0].all_reduce(&s, &mut t, ReduceOp::Sum).unwrap();
        assert_eq!(t.to_vec::<f32>(&s).unwrap(), [0.0; 3]);
    }
    drop(comms);
    // HcclCommInitRootInfo on one of two ranks: that rank fails at once, the other times out
    // (a short connect timeout is not settable here without racing other tests, so a single rank).
    let root = RootInfo::new(&ctxs[0]).unwrap();
    ascend::mock::fail_next_on_this_thread("HcclCommInitRootInfo", 7);
    let err = Communicator::init_rank(&ctxs[0], 1, &root, 0).unwrap_err();
    assert!(matches!(err, Error::Hccl { call: "HcclCommInitRootInfo", result: 7, .. }), "{err:?}");
    // HcclCommDestroy: the communicator is leaked, and reported as such.
    let comm = Communicator::init_all(&ctxs[..1]).unwrap().pop().unwrap();
    ascend::mock::fail_next_on_this_thread("HcclCommDestroy", 7);
    drop(comm);
    for ctx in &ctxs {
        ctx.empty_cache().unwrap(); // cached blocks are not leaks: compare without them
    }
    let after = (ascend::mock::stats(), ascend::mock::leaks());
    assert_eq!(after.1.communicators, before.1.communicators + 1, "the failed destroy is a reported leak");
    assert_eq!(after.0.live_comms, before.0.live_comms + 1, "exactly the reported one is still alive");
    assert_eq!(after.0.live_allocations, before.0.live_allocations);
    assert_eq!(after.0.violations, before.0.violations, "{:?}", ascend::mock::violations_since(before.0.violations));
}
