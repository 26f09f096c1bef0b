//! Regression tests of soundness findings: safe call orders that once freed, raced or read
//! device memory wrongly, or panicked on extreme layouts. Each test names the finding it pins.
//!
//! Mock-backed tests run inside `common::mock::isolated` (serialised, and checked afterwards for
//! zero new mock violations and no leaked allocation, descriptor, executor or stream); a mock
//! violation here means device memory was freed, raced or misused.
#![cfg(feature = "mock")]

mod common;

use ascend::ops::{
    batch_norm_reduce_backward, batch_norm_reduce_backward_into, prepare_batch_norm_reduce_backward, OutputMask,
    ReduceBackwardOut, Workspace,
};
use ascend::{Context, DType, Error, Result, Tensor};
use common::mock::{isolated, on_stream, with_uploaded};
use common::*;

fn inputs(seed: u64, shape: &[usize]) -> Inputs {
    Inputs::normal(seed, DType::F32, DType::F32, shape)
}

type R = Result<()>;

on_both_backends!(
    to_vec_of_a_huge_broadcast_view_is_an_error,
    size_one_dims_with_huge_strides,
    weight_given_to_into_on_both_backends,
    empty_input_gives_positive_zeros_on_both_backends,
    extents_beyond_i64_are_rejected_on_both_backends,
);

// ---------------------------------------------------------------------------------------------
// Finding 1: weight must be recorded on the launch's stream like every other argument.

/// A weight made inside the call expression is dropped while the launch is still queued.
#[test]
fn weight_temporary_dropped_while_queued() {
    with_uploaded(inputs(1, &[4, 3, 5]), |_, s, inp, up| {
        let w = inp.weight.as_ref().unwrap();
        let out =
            batch_norm_reduce_backward(&s, &up.dy, &up.x, &up.mean, &up.invstd, Some(&w.tensor(&s)?), OutputMask::ALL)?;
        check_result(&s, &out, OutputMask::ALL, DType::F32, &inp.expected());
        Ok(())
    });
}

/// weight dropped right after a two-phase launch, before any synchronisation.
#[test]
fn weight_dropped_after_two_phase_launch() {
    with_uploaded(inputs(2, &[3, 4, 6]), |_, s, inp, up| {
        let mut outs = Outs::filled(&s, DType::F32, 4)?;
        let weight = inp.weight.as_ref().unwrap().tensor(&s)?;
        let p = prepare_batch_norm_reduce_backward(
            &s,
            &up.dy,
            &up.x,
            &up.mean,
            &up.invstd,
            Some(&weight),
            OutputMask::ALL,
            outs.all(),
        )?;
        let ws = Workspace::new(&s, p.workspace_size())?;
        p.launch(&s, Some(&ws))?;
        drop(weight);
        drop(ws);
        outs.check(&s, OutputMask::ALL, &inp.expected());
        Ok(())
    });
}

/// weight is written by work queued on another stream, then read as weight: the launch waits.
/// And weight read by a queued launch is then reused as an output on another stream, and
/// refilled with `copy_from_slice`: each waits for the launch that reads it.
#[test]
fn weight_ordered_against_other_streams_and_refills() {
    isolated(|ctx| -> Result<()> {
        let (s1, s2) = (ctx.new_stream()?, ctx.new_stream()?);
        let c = 3;
        let inp = inputs(3, &[5, c, 4]);
        let up = inp.upload(&s1)?;
        // A [c] tensor written on s2 (as sumDy of another call), then used as weight on s1.
        let other = inputs(4, &[2, c, 3]);
        let up2 = other.upload(&s2)?;
        let mut w = Tensor::zeros(&s2, DType::F32, &[c])?;
        up2.run_into(&s2, OutputMask { input_g: false, weight_g: false, bias_g: true }, {
            ReduceBackwardOut { grad_bias: Some(&mut w), ..Default::default() }
        })?;
        let out = batch_norm_reduce_backward(&s1, &up.dy, &up.x, &up.mean, &up.invstd, Some(&w), OutputMask::ALL)?;
        // w is read by the queued launch on s1: reusing it as an output on s2 must wait.
        up2.run_into(&s2, OutputMask { input_g: false, weight_g: false, bias_g: true }, {
            ReduceBackwardOut { grad_bias: Some(&mut w), ..Default::default() }
        })?;
        let again = batch_norm_reduce_backward(&s1, &up.dy, &up.x, &up.mean, &up.invstd, Some(&w), OutputMask::ALL)?;
        // ... and refilling it on the host must wait too.
        w.copy_from_slice(&s1, &[7.0f32, 8.0, 9.0])?;
        let exp = inp.expected();
        check_result(&s1, &out, OutputMask::ALL, DType::F32, &exp);
        check_result(&s1, &again, OutputMask::ALL, DType::F32, &exp);
        assert_eq!(w.to_vec::<f32>(&s1)?, [7.0, 8.0, 9.0]);
        Ok(())
    })
    .unwrap();
}

// ---------------------------------------------------------------------------------------------
// Finding 2: growing the stream's workspace must not free the old one under queued work. The
// old workspace goes back to the caching allocator in the stream's order (no host wait, so no
// synchronise that could fail), reusable only by later work on that stream.

#[test]
fn growing_workspace_keeps_the_old_one_for_queued_work() {
    on_stream(|_, s| {
        let small = inputs(5, &[3, 2, 4]);
        let big = inputs(6, &[2, 64, 3]);
        let (up_small, up_big) = (small.upload(&s)?, big.upload(&s)?);
        let first = up_small.run(&s, OutputMask::ALL)?; // queued, using the stream's small workspace
        let syncs = ascend::mock::stats().stream_synchronizes;
        let second = up_big.run(&s, OutputMask::ALL)?; // grows the workspace
        assert_eq!(ascend::mock::stats().stream_synchronizes, syncs, "growing the workspace waits for nothing");
        // The first launch still runs with its workspace intact.
        check_result(&s, &first, OutputMask::ALL, DType::F32, &small.expected());
        check_result(&s, &second, OutputMask::ALL, DType::F32, &big.expected());
        check_result(&s, &up_small.run(&s, OutputMask::ALL)?, OutputMask::ALL, DType::F32, &small.expected());
        Ok(())
    });
}

// ---------------------------------------------------------------------------------------------
// Finding 3: recording a buffer's stream and enqueuing are one step, so threads sharing an
// input tensor or a workspace never lose track of a stream that still uses it.

#[test]
fn threads_sharing_inputs_and_a_workspace() {
    isolated(|ctx| -> Result<()> {
        const THREADS: usize = 2;
        const ROUNDS: usize = 2000;
        let mut streams: Vec<_> = (0..THREADS).map(|_| ctx.new_stream()).collect::<Result<_>>()?;
        let inp = inputs(7, &[2, 3, 4]);
        let exp = inp.expected();
        let ws = Workspace::new(&streams[0], 1 << 12)?;
        let mut outs: Vec<Outs> = streams.iter().map(|s| Outs::filled(s, DType::F32, 3)).collect::<Result<_>>()?;
        for round in 0..ROUNDS {
            // Inputs made fresh each round and dropped right after the threads enqueued on them.
            let up = inp.upload(&streams[round % THREADS])?;
            let barrier = std::sync::Barrier::new(THREADS);
            std::thread::scope(|sc| -> Result<()> {
                let handles: Vec<_> = streams
                    .iter_mut()
                    .zip(outs.iter_mut())
                    .map(|(s, o)| {
                        let (up, ws, barrier) = (&up, &ws, &barrier);
                        sc.spawn(move || -> Result<()> {
                            let s = &*s;
                            barrier.wait();
                            let p = up.prepare(s, OutputMask::ALL, o.all())?;
                            p.launch(s, Some(ws))
                        })
                    })
                    .collect();
                handles.into_iter().try_for_each(|h| h.join().expect("thread panicked"))
            })?;
            drop(up);
        }
        for (s, o) in streams.iter().zip(&outs) {
            o.check(s, OutputMask::ALL, &exp);
        }
        Ok(())
    })
    .unwrap();
}

// ---------------------------------------------------------------------------------------------
// Finding 4: the workspace is null exactly when phase 1 asked for 0 bytes, even when the caller
// passes a larger workspace (empty input), so empty outputs are still zero-filled.

#[test]
fn empty_input_with_a_caller_workspace() {
    with_uploaded(inputs(8, &[0, 3, 4]), |_, s, _, up| {
        let mut outs = Outs::filled(&s, DType::F32, 3)?;
        let p = up.prepare(&s, OutputMask::ALL, outs.all())?;
        assert_eq!(p.workspace_size(), 0);
        let ws = Workspace::new(&s, 256)?;
        p.launch(&s, Some(&ws))?;
        for t in &outs.t {
            assert_eq!(t.to_vec::<f32>(&s)?, [0.0; 3]);
        }
        Ok(())
    });
}

// ---------------------------------------------------------------------------------------------
// Finding 5: reading a huge zero-stride view is an error, not an abort or a panic.

fn to_vec_of_a_huge_broadcast_view_is_an_error(ctx: &Context) -> R {
    let s = ctx.new_stream().unwrap();
    let t = Tensor::from_slice_strided(&s, &[1.5f32], &[1 << 40], &[0], 0).unwrap();
    let err = t.to_vec::<f32>(&s).expect_err("2^40 elements do not fit in host memory here");
    assert!(matches!(err, Error::HostAlloc { .. }), "{:?}: {err:?}", ctx.backend());
    // A view whose element count overflows usize is refused when it is made.
    let err = Tensor::from_slice_strided(&s, &[1.5f32], &[1 << 31, 1 << 31, 1 << 2], &[0, 0, 0], 0)
        .expect_err("2^64 elements overflow");
    assert_eq!(err.status(), Some(161002), "{err}");
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Finding 6: a size-1 dimension may have any stride CANN accepts without overflowing anywhere.

fn size_one_dims_with_huge_strides(ctx: &Context) -> R {
    let s = ctx.new_stream().unwrap();
    let data: Vec<f32> = (0..6).map(|v| v as f32).collect();
    for big in [i64::MAX as usize, usize::MAX] {
        // [1, 2, 3] with a huge stride on the size-1 leading dim: accepted up to int64's
        // maximum (what aclTensor describes), rejected with 161002 beyond; never a panic.
        let t = match Tensor::from_slice_strided(&s, &data, &[1, 2, 3], &[big, 3, 1], 0) {
            Err(e) if big > i64::MAX as usize => {
                assert_eq!(e.status(), Some(161002), "{e}");
                continue;
            }
            r => r.unwrap(),
        };
        assert_eq!(t.to_vec::<f32>(&s).unwrap(), data);
        let mut t2 = Tensor::from_slice_strided(&s, &data, &[2, 1, 3], &[3, big, 1], 0).unwrap();
        t2.copy_from_slice(&s, &[5.0f32; 6]).unwrap();
        assert_eq!(t2.to_vec::<f32>(&s).unwrap(), [5.0; 6]);
        let c = [1.0f32, 1.0];
        let (mean, invstd) = (Tensor::from_slice(&s, &c, &[2]).unwrap(), Tensor::from_slice(&s, &c, &[2]).unwrap());
        let out = batch_norm_reduce_backward(&s, &t, &t, &mean, &invstd, None, OutputMask::ALL).unwrap();
        // channel 0: x = 0,1,2; channel 1: x = 3,4,5; dy = x; mean 1.
        assert_eq!(out.sum_dy.unwrap().to_vec::<f32>(&s).unwrap(), [3.0, 12.0]);
        assert_eq!(out.sum_dy_xmu.unwrap().to_vec::<f32>(&s).unwrap(), [2.0, 38.0]);
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Finding 7: extents beyond i64::MAX (what aclTensor can describe) are rejected alike on both
// backends, when the tensor is made and when a caller's host view reaches the CPU entry.

fn extents_beyond_i64_are_rejected_on_both_backends(ctx: &Context) -> R {
    let huge = i64::MAX as usize + 1;
    let s = ctx.new_stream().unwrap();
    let data = [1.0f32; 4];
    let cases: [(&[usize], &[usize], usize); 4] = [
        (&[1, 4], &[huge, 1], 0),       // a stride
        (&[0, 4], &[4, 1], 0),          // (control: accepted)
        (&[huge, 0], &[1, 1], 0),       // a dim of an empty view
        (&[1, 4], &[usize::MAX, 1], 0), // the largest stride
    ];
    for (i, (shape, strides, offset)) in cases.into_iter().enumerate() {
        let r = Tensor::from_slice_strided(&s, &data, shape, strides, offset);
        if i == 1 {
            r.unwrap();
        } else {
            let err = r.expect_err("beyond int64");
            assert_eq!(err.status(), Some(161002), "{:?} case {i}: {err}", ctx.backend());
        }
    }
    Ok(())
}

/// The zero-copy CPU entry validates a caller's host views as tensors are validated.
#[test]
fn cpu_entry_rejects_extents_beyond_i64() {
    let huge = i64::MAX as usize + 1;
    let data = [1.0f32; 8];
    let (shape, strides) = ([1usize, 2, 4], [huge, 4, 1]);
    let c = [1.0f32; 2];
    let mut o = [0.0f32; 2];
    let r = ascend::cpu::batch_norm_reduce_backward(
        ascend::cpu::View::strided(&data, &shape, &strides, 0),
        ascend::cpu::View::new(&data, &[2, 4]),
        ascend::cpu::View::new(&c, &[2]),
        ascend::cpu::View::new(&c, &[2]),
        None,
        OutputMask { input_g: false, weight_g: false, bias_g: true },
        ascend::cpu::Outputs { grad_bias: Some(ascend::cpu::ViewMut::new(&mut o, &[2])), ..Default::default() },
    );
    assert_eq!(r.expect_err("stride beyond int64").status(), Some(161002));
    assert_eq!(o, [0.0, 0.0], "a rejected call wrote its output");
}

/// The `_into` entry with weight given, exercised on every backend: the same values (weight never
/// changes one) and no violation.
fn weight_given_to_into_on_both_backends(ctx: &Context) -> R {
    let s = ctx.new_stream().unwrap();
    let inp = inputs(9, &[3, 2, 5]);
    let up = inp.upload(&s).unwrap();
    let mut outs = Outs::filled(&s, DType::F32, 2).unwrap();
    batch_norm_reduce_backward_into(
        &s,
        &up.dy,
        &up.x,
        &up.mean,
        &up.invstd,
        up.weight.as_ref(),
        OutputMask::ALL,
        outs.all(),
    )
    .unwrap();
    outs.check(&s, OutputMask::ALL, &inp.expected());
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Found by the stateful test: empty inputs give +0 in every enabled output on both backends,
// whatever invstd holds (the CPU backend once gave 0·invstd, i.e. −0 for a negative invstd).

fn empty_input_gives_positive_zeros_on_both_backends(ctx: &Context) -> R {
    let s = ctx.new_stream().unwrap();
    let dy = Tensor::zeros(&s, DType::F32, &[0, 3, 2]).unwrap();
    let mean = Tensor::from_slice(&s, &[0.5f32, -1.0, 2.0], &[3]).unwrap();
    let invstd = Tensor::from_slice(&s, &[-1.0f32, f32::NAN, -0.0], &[3]).unwrap();
    let out = batch_norm_reduce_backward(&s, &dy, &dy, &mean, &invstd, None, OutputMask::ALL).unwrap();
    for t in [out.sum_dy, out.sum_dy_xmu, out.grad_weight, out.grad_bias] {
        let v = t.unwrap().to_vec::<f32>(&s).unwrap();
        assert_eq!(v.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), [0; 3], "{:?}: {v:?}", ctx.backend());
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Found by the launch benchmark's redesign: an enqueue skips the buffers' locks when its stream
// is already every buffer's only user, so ordering another stream after that stream, a host read
// of the buffer and the buffer's drop must each wait for an enqueue that made that choice.

/// Two threads repeat cached `_into` launches on their own streams over the same fresh inputs
/// (a repeat on a stream that is the inputs' only user takes the path without buffer locks,
/// while the other thread's launch orders its stream after that one and forgets it), a third
/// thread reads the inputs back meanwhile, and the inputs are dropped right after. Every result
/// is right, and the mock sees no freed, raced or poisoned memory.
#[test]
fn cached_launches_race_other_streams_and_host_reads() {
    isolated(|ctx| -> Result<()> {
        const THREADS: usize = 2;
        const ROUNDS: usize = 300;
        const REPEATS: usize = 4;
        let mut streams: Vec<_> = (0..THREADS).map(|_| ctx.new_stream()).collect::<Result<_>>()?;
        let mut reader = ctx.new_stream()?;
        let inp = inputs(11, &[2, 3, 4]);
        let exp = inp.expected();
        let want_x = inp.upload(&reader)?.x.to_vec::<f32>(&reader)?;
        let mut outs: Vec<Outs> = streams.iter().map(|s| Outs::filled(s, DType::F32, 3)).collect::<Result<_>>()?;
        // Each stream's entry made here, on this thread (the operator's library is loaded first
        // by the thread that spawns the others).
        let first = inp.upload(&streams[0])?;
        for (s, o) in streams.iter().zip(outs.iter_mut()) {
            first.run_into(s, OutputMask::ALL, o.all())?;
        }
        drop(first);
        let hits_before: u64 = streams.iter().map(|s| s.launch_cache_stats().hits).sum();
        for round in 0..ROUNDS {
            let up = inp.upload(&streams[round % THREADS])?;
            let barrier = std::sync::Barrier::new(THREADS + 1);
            std::thread::scope(|sc| -> Result<()> {
                let (up, barrier, reader, want_x) = (&up, &barrier, &mut reader, &want_x);
                let launchers: Vec<_> = streams
                    .iter_mut()
                    .zip(outs.iter_mut())
                    .map(|(s, o)| {
                        sc.spawn(move || -> Result<()> {
                            let s = &*s;
                            barrier.wait();
                            (0..REPEATS).try_for_each(|_| up.run_into(s, OutputMask::ALL, o.all()))
                        })
                    })
                    .collect();
                let read = sc.spawn(move || -> Result<()> {
                    barrier.wait();
                    for _ in 0..2 {
                        assert_eq!(&up.x.to_vec::<f32>(&*reader)?, want_x, "round {round}: the input read back");
                    }
                    Ok(())
                });
                launchers.into_iter().chain([read]).try_for_each(|h| h.join().expect("thread panicked"))
            })?;
            drop(up);
        }
        for (s, o) in streams.iter().zip(&outs) {
            o.check(s, OutputMask::ALL, &exp);
        }
        let hits: u64 = streams.iter().map(|s| s.launch_cache_stats().hits).sum::<u64>() - hits_before;
        if streams[0].launch_cache_stats().capacity > 0 {
            assert!(hits > (ROUNDS * THREADS) as u64, "the repeats were cache hits ({hits})");
        }
        Ok(())
    })
    .unwrap();
}
