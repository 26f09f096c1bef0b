//! The CPU engine of `ascend::hccl`: ranks as threads of this process. Values against an f64
//! reference for 1, 2, 4 and 8 ranks, every dtype and op; made with `init_all` and with
//! `RootInfo` + `init_rank`; every mismatch between ranks is an error on every rank, and a
//! group whose rank left fails at once instead of hanging.

mod common;

use ascend::hccl::{Communicator, ReduceOp, RootInfo};
use ascend::{Context, DType, Error, Result, Tensor};
use common::{round_to, Data, Rng};

/// Runs `f(rank, communicator)` on one thread per rank and returns each rank's result.
fn on_ranks<T: Send>(comms: Vec<Communicator>, f: impl Fn(u32, &Communicator) -> T + Sync) -> Vec<T> {
    let ctxs = vec![Context::cpu(); comms.len()];
    common::on_ranks(comms, &ctxs, |rank, c, _| f(rank, c))
}

fn cpu_comms(n: usize) -> Vec<Communicator> {
    Communicator::init_all(&vec![Context::cpu(); n]).expect("init_all on CPU contexts")
}

/// Rank r's data: random values, distinct per rank, rounded to `dtype`.
fn rank_data(dtype: DType, rank: u32, n: usize) -> Data {
    let mut rng = Rng::new(1000 + u64::from(rank));
    Data::uniform(&mut rng, dtype, &[n], -4.0, 4.0)
}

fn read(t: &Tensor, s: &ascend::Stream) -> Vec<f64> {
    t.to_vec::<f32>(s).unwrap().into_iter().map(f64::from).collect()
}

#[test]
fn all_reduce_matches_f64_for_every_op_dtype_and_rank_count() {
    for n_ranks in [1usize, 2, 4, 8] {
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min] {
                if op == ReduceOp::Prod && dtype == DType::BF16 {
                    continue; // HCCL has no PROD for bf16 (A2/A3): refused on both engines (audit F03)
                }
                let n = 37;
                let inputs: Vec<Data> = (0..n_ranks as u32).map(|r| rank_data(dtype, r, n)).collect();
                let expected: Vec<f64> = (0..n)
                    .map(|i| {
                        let vals = inputs.iter().map(|d| d.values()[i]);
                        let v = match op {
                            ReduceOp::Sum => vals.sum(),
                            ReduceOp::Prod => vals.product(),
                            ReduceOp::Max => vals.fold(f64::NEG_INFINITY, f64::max),
                            ReduceOp::Min => vals.fold(f64::INFINITY, f64::min),
                        };
                        round_to(dtype, v)
                    })
                    .collect();
                let results = on_ranks(cpu_comms(n_ranks), |rank, c| -> Result<Vec<f64>> {
                    let s = Context::cpu().new_stream()?;
                    let mut t = inputs[rank as usize].tensor(&s)?;
                    c.all_reduce(&s, &mut t, op)?;
                    Ok(read(&t, &s))
                });
                for (rank, r) in results.into_iter().enumerate() {
                    // Reduced in f64 in rank order and rounded once: exactly the reference.
                    assert_eq!(r.unwrap(), expected, "{n_ranks} ranks, {dtype}, {op:?}, rank {rank}");
                }
            }
        }
    }
}

#[test]
fn all_gather_and_broadcast() {
    for n_ranks in [1usize, 2, 4, 8] {
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let n = 5;
            let inputs: Vec<Data> = (0..n_ranks as u32).map(|r| rank_data(dtype, r, n)).collect();
            let gathered: Vec<f64> = inputs.iter().flat_map(|d| d.values()).collect();
            let root = (n_ranks as u32) - 1;
            let results = on_ranks(cpu_comms(n_ranks), |rank, c| -> Result<(Vec<f64>, Vec<f64>)> {
                let s = Context::cpu().new_stream()?;
                let input = inputs[rank as usize].tensor(&s)?;
                let mut out = Tensor::zeros(&s, dtype, &[n_ranks, n])?;
                c.all_gather(&s, &input, &mut out)?;
                let mut b = inputs[rank as usize].tensor(&s)?;
                c.broadcast(&s, &mut b, root)?;
                Ok((read(&out, &s), read(&b, &s)))
            });
            for r in results {
                let (g, b) = r.unwrap();
                assert_eq!(g, gathered, "{n_ranks} ranks {dtype}: all_gather is rank-major");
                assert_eq!(b, inputs[root as usize].values(), "{n_ranks} ranks {dtype}: broadcast from {root}");
            }
        }
    }
}

#[test]
fn ranks_meet_through_a_root_info() {
    let root = RootInfo::new(&Context::cpu()).unwrap();
    let bytes = root.as_bytes().to_vec();
    assert_eq!(bytes.len(), ascend::hccl::ROOT_INFO_BYTES);
    let n = 4u32;
    let results: Vec<Result<(u32, u32, Vec<f64>)>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|rank| {
                let bytes = &bytes;
                s.spawn(move || {
                    let root = RootInfo::from_bytes(bytes)?;
                    let c = Communicator::init_rank(&Context::cpu(), n, &root, rank)?;
                    let st = Context::cpu().new_stream()?;
                    let mut t = Tensor::from_slice(&st, &[rank as f32 + 1.0; 3], &[3])?;
                    c.all_reduce(&st, &mut t, ReduceOp::Sum)?;
                    Ok((c.rank(), c.size(), read(&t, &st)))
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, r) in results.into_iter().enumerate() {
        let (rank, size, v) = r.unwrap();
        assert_eq!((rank, size), (i as u32, n));
        assert_eq!(v, [10.0; 3]);
    }
    assert!(RootInfo::from_bytes(&[0u8; 7]).is_err());
}

/// Every way the ranks' n-th collectives can disagree fails on every rank with HCCL_E_PARA
/// (1), and later collectives fail at once.
#[test]
fn mismatched_collectives_fail_on_every_rank() {
    type Case = fn(u32, &Communicator, &ascend::Stream) -> Result<()>;
    let cases: [(&str, Case); 5] = [
        ("count", |r, c, s| {
            let mut t = Tensor::zeros(s, DType::F32, &[2 + r as usize])?;
            c.all_reduce(s, &mut t, ReduceOp::Sum)
        }),
        ("dtype", |r, c, s| {
            let mut t = Tensor::zeros(s, if r == 0 { DType::F32 } else { DType::F16 }, &[2])?;
            c.all_reduce(s, &mut t, ReduceOp::Sum)
        }),
        ("op", |r, c, s| {
            let mut t = Tensor::zeros(s, DType::F32, &[2])?;
            c.all_reduce(s, &mut t, if r == 0 { ReduceOp::Sum } else { ReduceOp::Max })
        }),
        ("order", |r, c, s| {
            let mut t = Tensor::zeros(s, DType::F32, &[2])?;
            if r == 0 {
                c.broadcast(s, &mut t, 0)
            } else {
                c.all_reduce(s, &mut t, ReduceOp::Sum)
            }
        }),
        ("root", |r, c, s| {
            let mut t = Tensor::zeros(s, DType::F32, &[2])?;
            c.broadcast(s, &mut t, r)
        }),
    ];
    for (what, case) in cases {
        let results = on_ranks(cpu_comms(2), |rank, c| {
            let s = Context::cpu().new_stream().unwrap();
            let first = case(rank, c, &s);
            let mut t = Tensor::zeros(&s, DType::F32, &[1]).unwrap();
            (first, c.all_reduce(&s, &mut t, ReduceOp::Sum))
        });
        for (first, later) in results {
            for r in [first, later] {
                match r {
                    Err(e @ Error::Hccl { .. }) => assert_eq!(e.hccl_result(), Some(1), "{what}: {e}"),
                    other => panic!("{what}: expected HCCL_E_PARA, got {other:?}"),
                }
            }
        }
    }
}

/// A rank dropped while another waits for it: the waiting rank fails at once (no hang).
#[test]
fn a_dropped_rank_fails_the_others_instead_of_hanging() {
    let mut comms = cpu_comms(2);
    let second = comms.pop().unwrap();
    let first = comms.pop().unwrap();
    let start = std::time::Instant::now();
    let waiter = std::thread::spawn(move || {
        let s = Context::cpu().new_stream().unwrap();
        let mut t = Tensor::zeros(&s, DType::F32, &[1]).unwrap();
        first.all_reduce(&s, &mut t, ReduceOp::Sum)
    });
    std::thread::sleep(std::time::Duration::from_millis(50));
    drop(second);
    let err = waiter.join().unwrap().expect_err("the other rank left");
    assert_eq!(err.hccl_result(), Some(4), "{err}");
    assert!(start.elapsed() < std::time::Duration::from_secs(10));
}

#[test]
fn arguments_are_checked_alike() {
    let comms = cpu_comms(1);
    let c = &comms[0];
    let s = Context::cpu().new_stream().unwrap();
    // A non-contiguous view.
    let mut t = Tensor::from_slice_strided(&s, &[1f32, 2., 3., 4.], &[2], &[2], 0).unwrap();
    assert_eq!(c.all_reduce(&s, &mut t, ReduceOp::Sum).unwrap_err().status(), Some(161002));
    // all_gather's output size and dtype.
    let x = Tensor::zeros(&s, DType::F32, &[3]).unwrap();
    let mut small = Tensor::zeros(&s, DType::F32, &[2]).unwrap();
    assert_eq!(c.all_gather(&s, &x, &mut small).unwrap_err().status(), Some(161002));
    let mut wrong = Tensor::zeros(&s, DType::F16, &[3]).unwrap();
    assert_eq!(c.all_gather(&s, &x, &mut wrong).unwrap_err().status(), Some(161002));
    // broadcast's root.
    let mut b = Tensor::zeros(&s, DType::F32, &[3]).unwrap();
    assert_eq!(c.broadcast(&s, &mut b, 1).unwrap_err().status(), Some(161002));
    // init_rank's rank.
    let root = RootInfo::new(&Context::cpu()).unwrap();
    assert_eq!(Communicator::init_rank(&Context::cpu(), 2, &root, 2).unwrap_err().status(), Some(161002));
    assert!(Communicator::init_all(&[]).is_err());
}
