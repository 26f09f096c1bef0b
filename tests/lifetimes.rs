//! Ascend-specific acceptance tests, on the mock CANN: soundness under asynchronous execution
//! (values dropped before any synchronisation), no leaks, injected faults, workspace reuse,
//! threads. The mock runs queued work only at synchronisation and counts every misuse (memory
//! freed while queued work uses it, unknown handles, a wrong workspace, ...) as a violation.
//!
//! `ascend::mock::stats()` is process-global and the harness runs tests in parallel, so every
//! test here runs inside `common::mock::isolated`: serialised by one lock, and checked afterwards
//! for zero new violations and live allocations/tensors/executors/streams back where they were.
//! Sizes are small so that the binary also runs under valgrind in a few minutes.
#![cfg(feature = "mock")]

mod common;

use ascend::mock::{fail_next, stats};
use ascend::ops::{batch_norm_reduce_backward, OutputMask, ReduceBackward, ReduceBackwardOut, Workspace};
use ascend::{Backend, Context, DType, Error, Result, Stream, Tensor};
use common::mock::{isolated, on_stream, with_uploaded};
use common::*;

/// ACL_ERROR_RT_MEMORY_ALLOCATION.
const RT_MEMORY_ALLOCATION: i32 = 207001;
/// ACLNN_ERR_INNER_NULLPTR.
const INNER_NULLPTR: i32 = 561103;
/// ACLNN_ERR_RUNTIME_ERROR.
const RUNTIME_ERROR: i32 = 361001;
/// ACL_ERROR_RT_PARAM_INVALID.
const RT_PARAM_INVALID: i32 = 107000;

const SHAPE: [usize; 3] = [4, 3, 5];

fn inputs(seed: u64) -> Inputs {
    Inputs::normal(seed, DType::F32, DType::F32, &SHAPE)
}

fn queued_tasks() -> u64 {
    ascend::mock::live_events_and_queued_tasks().1
}

/// The live counters (allocations, tensors, executors, streams) of a snapshot.
fn live(s: &ascend::mock::MockStats) -> [u64; 4] {
    [s.live_allocations, s.live_tensors, s.live_executors, s.live_streams]
}

/// The live counters once `ctx`'s caching allocator has returned its cached blocks to the
/// device (a cached block is not a leak; this waits for the work that last used them).
fn live_uncached(ctx: &Context) -> [u64; 4] {
    ctx.empty_cache().expect("empty_cache");
    live(&stats())
}

/// Outputs to write into (filled, to see that a failed call wrote nothing) and the counters to
/// compare with after a failure, taken with no cached block (cached blocks are not leaks).
fn outs_and_baseline(ctx: &Context, s: &Stream) -> Result<(Outs, ascend::mock::MockStats)> {
    let outs = Outs::filled(s, DType::F32, 3)?;
    ctx.empty_cache()?;
    Ok((outs, stats()))
}

/// After a failure, the same call works and writes the right values.
fn works_afterwards(s: &Stream, up: &Up, outs: &mut Outs, inp: &Inputs) -> Result<()> {
    outs.check_run_into(s, up, OutputMask::ALL, &inp.expected())
}

/// `inputs(seed)` run on a first stream, then on a second one through `second` (which makes that
/// launch with the `launch` it is given, observing what it will around it), the inputs dropped,
/// and each result read through the other stream (`a` of the run on `s1` through `s2`, `b`
/// through `s1`) is right.
fn on_two_streams_crosswise(
    seed: u64,
    second: impl FnOnce(&dyn Fn() -> Result<ReduceBackward>) -> Result<ReduceBackward>,
) {
    with_inputs(seed, |ctx, s1, inp, up| {
        let s2 = ctx.new_stream()?;
        let a = up.run(&s1, OutputMask::ALL)?;
        let b = second(&|| up.run(&s2, OutputMask::ALL))?;
        drop(up);
        check_result(&s2, &a, OutputMask::ALL, DType::F32, &inp.expected());
        check_result(&s1, &b, OutputMask::ALL, DType::F32, &inp.expected());
        Ok(())
    });
}

/// `common::mock::with_uploaded` with `inputs(seed)`.
fn with_inputs(seed: u64, f: impl FnOnce(&Context, Stream, Inputs, Up) -> Result<()>) {
    with_uploaded(inputs(seed), f);
}

// ---------------------------------------------------------------------------------------------
// Dropping before synchronisation

/// Inputs dropped right after the launch, while the work is still queued: the results are right
/// and no violation is counted (the buffers wait for the stream before `aclrtFree`).
#[test]
fn inputs_dropped_before_sync() {
    with_inputs(1, |_, s, inp, up| {
        let out = up.run(&s, OutputMask::ALL)?;
        assert!(queued_tasks() > 0, "the mock runs work at synchronisation: it must still be queued");
        drop(up);
        check_result(&s, &out, OutputMask::ALL, DType::F32, &inp.expected());
        Ok(())
    });
}

/// Outputs dropped right after the launch and never read: no violation, nothing leaks.
#[test]
fn outputs_dropped_before_sync() {
    on_stream(|_, s| {
        let up = inputs(2).upload(&s)?;
        drop(up.run(&s, OutputMask::ALL)?); // the stream's workspace now exists
        s.synchronize()?;
        let before = stats();
        let out = up.run(&s, OutputMask::ALL)?;
        assert!(queued_tasks() > 0);
        drop(out);
        assert_eq!(stats().live_allocations, before.live_allocations, "outputs freed (after the stream drained)");
        Ok(())
    });
}

/// The stream dropped right after the launch: the outputs, read through another stream, are
/// right.
#[test]
fn stream_dropped_before_sync() {
    with_inputs(3, |ctx, s, inp, up| {
        let mut outs = Outs::filled(&s, DType::F32, 3)?;
        up.run_into(&s, OutputMask::ALL, outs.all())?;
        let out = up.run(&s, OutputMask::ALL)?;
        drop(s);
        let s2 = ctx.new_stream()?;
        outs.check(&s2, OutputMask::ALL, &inp.expected());
        check_result(&s2, &out, OutputMask::ALL, DType::F32, &inp.expected());
        Ok(())
    });
}

/// Everything (inputs, outputs, a caller-owned workspace, the stream) dropped right after the
/// launch, in several orders, with no synchronisation at all: no violation, nothing leaks.
#[test]
fn everything_dropped_before_sync_in_any_order() {
    isolated(|ctx| -> Result<()> {
        let orders: [[usize; 4]; 6] =
            [[0, 1, 2, 3], [3, 2, 1, 0], [1, 3, 0, 2], [2, 0, 3, 1], [3, 0, 1, 2], [0, 3, 2, 1]];
        for order in orders {
            let s = ctx.new_stream()?;
            let up = inputs(4).upload(&s)?;
            let mut outs = Outs::filled(&s, DType::F32, 3)?;
            let p = up.prepare(&s, OutputMask::ALL, outs.all())?;
            let ws = Workspace::new(&s, p.workspace_size())?;
            p.launch(&s, Some(&ws))?;
            assert!(queued_tasks() > 0);
            let (mut up, mut outs, mut ws, mut s) = (Some(up), Some(outs), Some(ws), Some(s));
            for k in order {
                match k {
                    0 => drop(up.take()),
                    1 => drop(outs.take()),
                    2 => drop(ws.take()),
                    _ => drop(s.take()),
                }
            }
        }
        Ok(())
    })
    .unwrap();
}

/// A caller-owned workspace dropped right after the launch: the results are right.
#[test]
fn workspace_dropped_before_sync() {
    with_inputs(5, |_, s, inp, up| {
        let mut outs = Outs::filled(&s, DType::F32, 3)?;
        let p = up.prepare(&s, OutputMask::ALL, outs.all())?;
        assert!(p.workspace_size() > 0, "the mock's kernel uses a workspace");
        let ws = Workspace::new(&s, p.workspace_size())?;
        p.launch(&s, Some(&ws))?;
        drop(ws);
        outs.check(&s, OutputMask::ALL, &inp.expected());
        Ok(())
    });
}

/// Inputs read by two streams and outputs written on one and read through the other: every
/// stream that used a buffer is waited for.
#[test]
fn buffers_shared_by_two_streams() {
    on_two_streams_crosswise(6, |launch| launch());
}

/// A buffer used on a second stream after the first is ordered by an event on the device: the
/// host does not synchronise either stream (issue 16; the old code called
/// aclrtSynchronizeStream here), the second launch sees the first one's inputs, the values are
/// right and the mock's hazard detector counts nothing.
#[test]
fn cross_stream_use_is_ordered_by_events_without_host_waits() {
    on_two_streams_crosswise(16, |launch| {
        let before = stats();
        let b = launch()?;
        let after = stats();
        assert_eq!(after.stream_synchronizes, before.stream_synchronizes, "no host wait for s1");
        assert_eq!(after.event_synchronizes, before.event_synchronizes);
        assert_eq!(after.device_synchronizes, before.device_synchronizes);
        assert!(queued_tasks() > 0, "work is still queued");
        Ok(b)
    });
}

/// The public events: a record on one stream, waited for by another, orders a copy read on the
/// second stream; a query never blocks (not complete while queued on the mock), synchronize
/// completes it, elapsed time is finite and non-negative; an event of one backend is refused by
/// a stream of the other.
#[test]
fn events_order_streams_and_time_work() {
    isolated(|ctx| -> Result<()> {
        let (s1, s2) = (ctx.new_stream()?, ctx.new_stream()?);
        let inp = inputs(17);
        let start = s1.record_event()?;
        let up = inp.upload(&s1)?;
        let out = up.run(&s1, OutputMask::ALL)?;
        let end = s1.record_event()?;
        // (With the mock's progress at queries off: else the query lets the device run to it.)
        let progress = ascend::mock::set_query_progress(false);
        let queued = end.is_complete();
        ascend::mock::set_query_progress(progress);
        assert!(!queued?, "queued on the mock: not complete, and the query did not wait");
        s2.wait_event(&end)?;
        drop(end.clone()); // dropping a handle while a wait refers to it is safe
        end.synchronize()?;
        assert!(end.is_complete()? && start.is_complete()?);
        let ms = end.elapsed_ms(&start)?;
        assert!(ms.is_finite() && ms >= 0.0, "{ms}");
        check_result(&s2, &out, OutputMask::ALL, DType::F32, &inp.expected());
        let cpu = Context::cpu().new_stream()?;
        let cpu_event = cpu.record_event()?;
        assert!(cpu_event.is_complete()?);
        cpu_event.synchronize()?;
        assert!(cpu.record_event()?.elapsed_ms(&cpu_event)? >= 0.0);
        assert!(s2.wait_event(&cpu_event).is_err(), "a CPU event on an Ascend stream");
        assert!(cpu.wait_event(&start).is_err(), "an Ascend event on a CPU stream");
        assert!(start.elapsed_ms(&cpu_event).is_err(), "events of two backends");
        cpu.wait_event(&cpu_event)?;
        drop((up, s1));
        s2.synchronize()?;
        Ok(())
    })
    .unwrap();
}

/// Pinned host buffers and asynchronous copies: an upload from a `HostBuffer` and a download
/// into another make no blocking `aclrtMemcpy`; both buffers may be dropped right after the
/// copies are queued (their drop waits for the stream, so the mock sees no host memory freed
/// under a queued copy) and the values round-trip exactly; wrong lengths, dtypes and strided
/// views are refused without queuing anything. On the CPU backend the same calls copy at once.
#[test]
fn host_buffers_and_async_copies() {
    on_stream(|ctx, s| {
        let data: Vec<f32> = (0..96).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0).collect();
        let mut up = ascend::HostBuffer::<f32>::new(ctx, data.len())?;
        assert!(up.as_slice().iter().all(|&v| v == 0.0), "starts zeroed");
        up.as_mut_slice().copy_from_slice(&data);
        let mut t = Tensor::zeros(&s, DType::F32, &[8, 12])?;
        let before = stats();
        t.copy_from_host_async(&s, &up)?;
        let mut down = ascend::HostBuffer::<f32>::new(ctx, data.len())?;
        t.copy_to_host_async(&s, &mut down)?;
        let mid = stats();
        assert_eq!(mid.blocking_copies, before.blocking_copies, "no blocking copy");
        assert_eq!(mid.stream_synchronizes, before.stream_synchronizes, "no host wait to queue them");
        assert_eq!(mid.live_host_allocations, before.live_host_allocations + 1, "pinned memory");
        drop(up); // the upload is still queued: freed once an event after it completed
        assert_eq!(down.as_slice(), &data[..], "as_slice waits for the download");
        let mut second = ascend::HostBuffer::<f32>::new(ctx, data.len())?;
        t.copy_to_host_async(&s, &mut second)?;
        let queued = stats();
        // (With the mock's progress at queries off: else the drop's query lets the copy run.)
        let progress = ascend::mock::set_query_progress(false);
        drop(second); // dropped with the copy still queued: no wait, the free is deferred
        ascend::mock::set_query_progress(progress);
        let dropped = stats();
        assert_eq!(dropped.stream_synchronizes, queued.stream_synchronizes, "drop does not block");
        assert_eq!(dropped.live_host_allocations, queued.live_host_allocations, "not freed yet");
        assert_eq!(t.to_vec::<f32>(&s)?, data);
        assert_eq!(stats().live_host_allocations, queued.live_host_allocations - 1, "freed after the sync");
        // refused: wrong length, dtype, strided view
        let short = ascend::HostBuffer::<f32>::new(ctx, 5)?;
        assert!(t.copy_from_host_async(&s, &short).is_err());
        let halves = ascend::HostBuffer::<ascend::f16>::new(ctx, data.len())?;
        assert!(t.copy_from_host_async(&s, &halves).is_err());
        let mut strided = Tensor::from_slice_strided(&s, &data, &[8, 6], &[12, 2], 0)?;
        let h48 = ascend::HostBuffer::<f32>::new(ctx, 48)?;
        assert!(strided.copy_from_host_async(&s, &h48).is_err());
        assert_eq!(t.to_vec::<f32>(&s)?, data, "nothing written by a refused call");
        // the CPU backend
        let cpu = Context::cpu();
        let cs = cpu.new_stream()?;
        let mut ch = ascend::HostBuffer::<f32>::new(&cpu, data.len())?;
        ch.as_mut_slice().copy_from_slice(&data);
        let mut ct = Tensor::zeros(&cs, DType::F32, &[8, 12])?;
        ct.copy_from_host_async(&cs, &ch)?;
        let mut back = ascend::HostBuffer::<f32>::new(&cpu, data.len())?;
        ct.copy_to_host_async(&cs, &mut back)?;
        assert_eq!(back.as_slice(), &data[..]);
        assert!(t.copy_from_host_async(&s, &ch).is_err(), "a CPU-backend (unpinned) buffer on an Ascend stream");
        Ok(())
    });
}

/// `Context::memory_stats` follows the caching allocator: a tensor raises `allocated` by its
/// bytes, `reserved` by its block (the request rounded up to 512 bytes) and counts one
/// `aclrtMalloc`; dropping it lowers `allocated` and keeps the block `reserved` in the cache,
/// the peak remembers, `empty_cache` returns the cached blocks; the CPU backend reports zeros.
#[test]
fn memory_stats_follow_device_allocations() {
    isolated(|_| -> Result<()> {
        let ctx = ascend::mock::context(0)?; // a context of its own, so nothing else counts
        let s = ctx.new_stream()?;
        assert_eq!(ctx.memory_stats(), ascend::MemoryStats::default());
        let t = Tensor::zeros(&s, DType::F32, &[10, 3])?;
        let m = ctx.memory_stats();
        assert_eq!((m.allocated, m.reserved, m.peak_allocated, m.device_allocations), (120, 512, 120, 1));
        let u = Tensor::from_slice(&s, &[1f32, 2.], &[2])?;
        assert_eq!(ctx.memory_stats().peak_allocated, 128);
        drop((t, u));
        let m = ctx.memory_stats();
        assert_eq!((m.allocated, m.reserved, m.peak_allocated, m.device_allocations), (0, 1024, 128, 2));
        let v = Tensor::zeros(&s, DType::F32, &[100])?; // 400 bytes: a cached 512-byte block
        let m = ctx.memory_stats();
        assert_eq!((m.allocated, m.reserved, m.device_allocations), (400, 1024, 2), "served from the cache");
        drop(v);
        ctx.empty_cache()?;
        let m = ctx.memory_stats();
        assert_eq!((m.allocated, m.reserved, m.peak_allocated, m.device_allocations), (0, 0, 400, 2));
        assert_eq!(Context::cpu().memory_stats(), ascend::MemoryStats::default());
        Context::cpu().empty_cache()?;
        Ok(())
    })
    .unwrap();
}

/// Tensors and streams are RAII: creating them raises the live counts, dropping them restores
/// them; an empty tensor allocates nothing.
#[test]
fn live_counts_follow_values() {
    isolated(|ctx| -> Result<()> {
        let base = stats();
        let s = ctx.new_stream()?;
        assert_eq!(stats().live_streams, base.live_streams + 1);
        let t = Tensor::from_slice(&s, &[1f32, 2., 3.], &[3])?;
        let z = Tensor::zeros(&s, DType::F16, &[4, 2])?;
        assert_eq!(stats().live_allocations, base.live_allocations + 2);
        let e = Tensor::zeros(&s, DType::F32, &[0, 3])?;
        assert_eq!(stats().live_allocations, base.live_allocations + 2, "an empty tensor allocates nothing");
        drop((t, z, e));
        ctx.empty_cache()?; // dropped blocks stay cached until then
        assert_eq!(stats().live_allocations, base.live_allocations);
        drop(s);
        assert_eq!(live(&stats()), live(&base));
        Ok(())
    })
    .unwrap();
}

// ---------------------------------------------------------------------------------------------
// Injected faults

/// `aclrtMalloc` failing (207001) surfaces with its status from every allocating entry point
/// (tensor upload, zeros, the allocating op's outputs, a caller workspace, the stream's cached
/// workspace), leaks nothing, and the next call works.
#[test]
fn fault_malloc() {
    with_inputs(10, |ctx, s, inp, up| {
        let base = stats();
        let expect_malloc_error = |what: &str, err: Error| {
            assert_eq!(err.status(), Some(RT_MEMORY_ALLOCATION), "{what}: {err:?}");
            assert_eq!(err.status_name(), Some("ACL_ERROR_RT_MEMORY_ALLOCATION"));
            assert!(err.to_string().contains("aclrtMalloc"), "{what}: {err}");
            assert_eq!(live(&stats()), live(&base), "{what}: leaked");
        };

        fail_next("aclrtMalloc", RT_MEMORY_ALLOCATION);
        expect_malloc_error("from_slice", Tensor::from_slice(&s, &[1f32; 6], &[2, 3]).unwrap_err());
        fail_next("aclrtMalloc", RT_MEMORY_ALLOCATION);
        expect_malloc_error("zeros", Tensor::zeros(&s, DType::F32, &[3]).unwrap_err());
        fail_next("aclrtMalloc", RT_MEMORY_ALLOCATION);
        expect_malloc_error("allocating op", up.run(&s, OutputMask::ALL).unwrap_err());
        fail_next("aclrtMalloc", RT_MEMORY_ALLOCATION);
        expect_malloc_error("Workspace::new", Workspace::new(&s, 64).unwrap_err());

        // The stream's cached workspace is allocated at the first launch on a fresh stream: its
        // failure destroys the unlaunched executor and writes nothing. (Launch cache off: with
        // it, the executor is retired until the stream has drained; see common::framework.)
        let fresh = ctx.new_stream()?;
        fresh.set_launch_cache_capacity(0);
        let base = stats();
        let mut outs = Outs::filled(&fresh, DType::F32, 3)?;
        fail_next("aclrtMalloc", RT_MEMORY_ALLOCATION);
        let err = up.run_into(&fresh, OutputMask::ALL, outs.all()).unwrap_err();
        assert_eq!(err.status(), Some(RT_MEMORY_ALLOCATION), "{err:?}");
        let now = stats();
        assert_eq!((now.live_tensors, now.live_executors), (base.live_tensors, base.live_executors));
        outs.assert_untouched(&fresh);

        // and everything works afterwards
        check_result(&s, &up.run(&s, OutputMask::ALL)?, OutputMask::ALL, DType::F32, &inp.expected());
        up.run_into(&fresh, OutputMask::ALL, outs.all())?;
        outs.check(&fresh, OutputMask::ALL, &inp.expected());
        Ok(())
    });
}

/// Phase 1 failing (any status, here 561103 and 161002) surfaces with that status and CANN's
/// message, destroys the descriptors already made, creates no executor and writes nothing.
#[test]
fn fault_phase1() {
    with_inputs(11, |ctx, s, inp, up| {
        let (mut outs, base) = outs_and_baseline(ctx, &s)?;
        for code in [INNER_NULLPTR, INVALID, NULLPTR] {
            fail_next("aclnnBatchNormReduceBackwardGetWorkspaceSize", code);
            let err = up.run_into(&s, OutputMask::ALL, outs.all()).unwrap_err();
            assert_eq!(err.status(), Some(code), "{err:?}");
            match &err {
                Error::Cann { call, message, .. } => {
                    assert_eq!(*call, "aclnnBatchNormReduceBackwardGetWorkspaceSize");
                    assert!(message.as_deref().is_some_and(|m| !m.is_empty()), "aclGetRecentErrMsg's text: {err:?}");
                }
                other => panic!("expected Error::Cann, got {other:?}"),
            }
            assert!(err.to_string().contains(&code.to_string()), "{err}");
            assert_eq!(live_uncached(ctx), live(&base), "leaked after a phase-1 failure");
            outs.assert_untouched(&s);
            // the allocating form frees the outputs it made
            fail_next("aclnnBatchNormReduceBackwardGetWorkspaceSize", code);
            assert_eq!(up.run(&s, OutputMask::ALL).unwrap_err().status(), Some(code));
            assert_eq!(live_uncached(ctx), live(&base));
        }
        works_afterwards(&s, &up, &mut outs, &inp)
    });
}

/// Phase 2 failing surfaces with its status, consumes the executor (CANN's rule: the launch owns
/// it even when it fails), leaks nothing and writes nothing; with the stream's workspace and
/// with a caller's. (Launch cache off: a failed cached launch is in common::framework.)
#[test]
fn fault_phase2() {
    on_stream(|ctx, s| {
        s.set_launch_cache_capacity(0);
        let inp = inputs(12);
        let up = inp.upload(&s)?;
        let mut outs = Outs::filled(&s, DType::F32, 3)?;
        up.run_into(&s, OutputMask::ALL, outs.all())?; // the stream's workspace now exists
        let (mut outs, base) = outs_and_baseline(ctx, &s)?;
        for code in [RUNTIME_ERROR, INVALID] {
            fail_next("aclnnBatchNormReduceBackward", code);
            let err = up.run_into(&s, OutputMask::ALL, outs.all()).unwrap_err();
            assert_eq!(err.status(), Some(code), "{err:?}");
            assert!(matches!(&err, Error::Cann { call: "aclnnBatchNormReduceBackward", .. }), "{err:?}");
            assert_eq!(live_uncached(ctx), live(&base), "leaked after a phase-2 failure");
            outs.assert_untouched(&s);

            let p = up.prepare(&s, OutputMask::ALL, outs.all())?;
            let ws = Workspace::new(&s, p.workspace_size())?;
            fail_next("aclnnBatchNormReduceBackward", code);
            assert_eq!(p.launch(&s, Some(&ws)).unwrap_err().status(), Some(code));
            drop(ws);
            assert_eq!(live_uncached(ctx), live(&base));
            outs.assert_untouched(&s);
        }
        works_afterwards(&s, &up, &mut outs, &inp)
    });
}

/// `aclCreateTensor` returning null surfaces as `Error::NullHandle` naming it (no status), with
/// the descriptors made before it destroyed and nothing written.
#[test]
fn fault_create_tensor() {
    with_inputs(13, |ctx, s, inp, up| {
        let (mut outs, base) = outs_and_baseline(ctx, &s)?;
        fail_next("aclCreateTensor", 0);
        let err = up.run_into(&s, OutputMask::ALL, outs.all()).unwrap_err();
        assert!(matches!(&err, Error::NullHandle { call: "aclCreateTensor", .. }), "{err:?}");
        assert_eq!(err.status(), None);
        assert!(err.to_string().contains("aclCreateTensor") && err.to_string().contains("null"), "{err}");
        assert_eq!(live_uncached(ctx), live(&base), "leaked after aclCreateTensor failed");
        outs.assert_untouched(&s);
        fail_next("aclCreateTensor", 0);
        assert!(matches!(up.run(&s, OutputMask::ALL).unwrap_err(), Error::NullHandle { .. }));
        assert_eq!(live_uncached(ctx), live(&base));
        works_afterwards(&s, &up, &mut outs, &inp)
    });
}

/// Other runtime calls failing (the upload's `aclrtMemcpy`, `aclrtMemset` of zeros,
/// `aclrtCreateStream`) surface with their status and leak nothing.
#[test]
fn fault_other_runtime_calls() {
    on_stream(|ctx, s| {
        ctx.empty_cache()?; // cached blocks are not leaks: compare without them
        let base = stats();
        fail_next("aclrtMemcpy", RT_PARAM_INVALID);
        assert_eq!(Tensor::from_slice(&s, &[1f32; 4], &[4]).unwrap_err().status(), Some(RT_PARAM_INVALID));
        fail_next("aclrtMemset", RT_PARAM_INVALID);
        assert_eq!(Tensor::zeros(&s, DType::F32, &[4]).unwrap_err().status(), Some(RT_PARAM_INVALID));
        fail_next("aclrtCreateStream", RT_MEMORY_ALLOCATION);
        assert_eq!(ctx.new_stream().unwrap_err().status(), Some(RT_MEMORY_ALLOCATION));
        assert_eq!(live_uncached(ctx), live(&base));
        assert_eq!(Tensor::from_slice(&s, &[1f32; 4], &[4])?.to_vec::<f32>(&s)?, [1.0; 4]);
        Ok(())
    });
}

// ---------------------------------------------------------------------------------------------
// Executors, workspaces, threads

/// A prepared call holds an executor and descriptors; dropping it unlaunched destroys them
/// (no live executor, no violation) and writes nothing. Repeated, so a leak would add up.
#[test]
fn prepared_dropped_without_launch() {
    on_stream(|_, s| {
        let up = inputs(20).upload(&s)?;
        let mut outs = Outs::filled(&s, DType::F32, 3)?;
        let base = stats();
        for _ in 0..5 {
            let p = up.prepare(&s, OutputMask::ALL, outs.all())?;
            let during = stats();
            assert_eq!(during.live_executors, base.live_executors + 1);
            assert_eq!(during.live_tensors, base.live_tensors + 9, "4 inputs + weight + 4 outputs");
            drop(p);
            assert_eq!(live(&stats()), live(&base));
        }
        s.synchronize()?;
        outs.assert_untouched(&s);
        assert_eq!(stats().violations, base.violations);
        Ok(())
    });
}

/// The steady-state loop (same shapes, `_into` with pre-allocated outputs, 50 iterations)
/// allocates device memory only in the first iteration (the stream's workspace); so does the
/// two-phase loop with a caller-owned workspace, which allocates nothing at all.
#[test]
fn steady_state_loop_allocates_nothing() {
    with_inputs(21, |_, s, inp, up| {
        let mut outs = Outs::filled(&s, DType::F32, 3)?;
        let first = stats().device_mallocs;
        up.run_into(&s, OutputMask::ALL, outs.all())?;
        let after_first = stats().device_mallocs;
        assert!(after_first - first <= 1, "one workspace at most in the first iteration");
        for _ in 1..50 {
            up.run_into(&s, OutputMask::ALL, outs.all())?;
        }
        assert_eq!(stats().device_mallocs, after_first, "allocations after the first iteration");
        outs.check(&s, OutputMask::ALL, &inp.expected());

        let ws = {
            let p = up.prepare(&s, OutputMask::ALL, outs.all())?;
            let ws = Workspace::new(&s, p.workspace_size())?;
            p.launch(&s, Some(&ws))?;
            ws
        };
        let start = stats().device_mallocs;
        for _ in 0..50 {
            up.prepare(&s, OutputMask::ALL, outs.all())?.launch(&s, Some(&ws))?;
        }
        assert_eq!(stats().device_mallocs, start, "two-phase loop with a caller workspace");
        outs.check(&s, OutputMask::ALL, &inp.expected());
        Ok(())
    });
}

/// A workspace smaller than phase 1 asked for is rejected (161002) before phase 2: the executor
/// is destroyed, nothing is written, no violation.
#[test]
fn too_small_workspace_rejected() {
    on_stream(|ctx, s| {
        let up = inputs(22).upload(&s)?;
        let (mut outs, base) = outs_and_baseline(ctx, &s)?;
        let p = up.prepare(&s, OutputMask::ALL, outs.all())?;
        let size = p.workspace_size();
        assert!(size > 0);
        let small = Workspace::new(&s, size - 1)?;
        assert_eq!(p.launch(&s, Some(&small)).unwrap_err().status(), Some(INVALID));
        drop(small);
        assert_eq!(live_uncached(ctx), live(&base));
        // A CPU-backend workspace reports a size but holds no device memory.
        let cpu = Context::cpu().new_stream()?;
        let hollow = Workspace::new(&cpu, size)?;
        let p = up.prepare(&s, OutputMask::ALL, outs.all())?;
        assert_eq!(p.launch(&s, Some(&hollow)).unwrap_err().status(), Some(INVALID));
        assert_eq!(live_uncached(ctx), live(&base));
        outs.assert_untouched(&s);
        Ok(())
    });
}

/// Four threads, each with its own stream on one shared `Context` (clones), run concurrently
/// (released together by a barrier) with different data and shapes: every result is right.
#[test]
fn four_threads_share_a_context() {
    isolated(|ctx| -> Result<()> {
        let barrier = std::sync::Barrier::new(4);
        std::thread::scope(|sc| {
            let handles: Vec<_> = (0..4u64)
                .map(|k| {
                    let ctx = ctx.clone();
                    let barrier = &barrier;
                    sc.spawn(move || -> Result<()> {
                        let c = 2 + k as usize;
                        let inp = Inputs::normal(30 + k, DType::F32, DType::F32, &[3 + k as usize, c, 4]);
                        let exp = inp.expected();
                        let setup = ctx.new_stream().and_then(|s| {
                            let up = inp.upload(&s)?;
                            let outs = Outs::filled(&s, DType::F32, c)?;
                            Ok((s, up, outs))
                        });
                        barrier.wait(); // every thread reaches it, even when its setup failed
                        let (s, up, mut outs) = setup?;
                        for i in 0..10 {
                            if i % 2 == 0 {
                                up.run_into(&s, OutputMask::ALL, outs.all())?;
                            } else {
                                check_result(&s, &up.run(&s, OutputMask::ALL)?, OutputMask::ALL, DType::F32, &exp);
                            }
                        }
                        outs.check(&s, OutputMask::ALL, &exp);
                        Ok(())
                    })
                })
                .collect();
            handles.into_iter().try_for_each(|h| h.join().expect("thread panicked"))
        })
    })
    .unwrap();
}

/// The stream's workspace grows (a larger C after a smaller one) while the earlier launch is
/// still queued: the old workspace is freed only after that work ran; both results are right.
#[test]
fn stream_workspace_grows_with_work_queued() {
    on_stream(|_, s| {
        let small = Inputs::normal(23, DType::F32, DType::F32, &[2, 3, 4]);
        let large = Inputs::normal(24, DType::F32, DType::F32, &[2, 40, 4]);
        let (us, ul) = (small.upload(&s)?, large.upload(&s)?);
        let mut a = Outs::filled(&s, DType::F32, 3)?;
        let mut b = Outs::filled(&s, DType::F32, 40)?;
        let sizes = {
            let p = us.prepare(&s, OutputMask::ALL, a.all())?;
            let q = ul.prepare(&s, OutputMask::ALL, b.all())?;
            (p.workspace_size(), q.workspace_size())
        };
        assert!(sizes.0 < sizes.1, "the mock's workspace grows with C: {sizes:?}");
        us.run_into(&s, OutputMask::ALL, a.all())?;
        assert!(queued_tasks() > 0);
        ul.run_into(&s, OutputMask::ALL, b.all())?;
        a.check(&s, OutputMask::ALL, &small.expected());
        b.check(&s, OutputMask::ALL, &large.expected());
        us.run_into(&s, OutputMask::ALL, a.all())?; // and the big one serves small calls
        a.check(&s, OutputMask::ALL, &small.expected());
        Ok(())
    });
}

/// Tensors, results and a stream dropped on a thread that never made a CANN call itself (so
/// the device must be bound there before aclrtFree / aclrtDestroyStream): no violation.
#[test]
fn values_dropped_on_a_fresh_thread() {
    with_inputs(32, |ctx, s, inp, up| {
        let out = up.run(&s, OutputMask::ALL)?;
        std::thread::spawn(move || drop((up, out, s))).join().expect("thread");
        // and a fresh thread that reads results through a stream it was given
        let s = ctx.new_stream()?;
        let up = inp.upload(&s)?;
        let out = up.run(&s, OutputMask::ALL)?;
        let exp = inp.expected();
        std::thread::spawn(move || check_result(&s, &out, OutputMask::ALL, DType::F32, &exp)).join().expect("thread");
        Ok(())
    });
}

/// A stream moved to another thread and tensors shared across threads.
#[test]
fn stream_moves_between_threads() {
    with_inputs(31, |_, s, inp, up| {
        let shared = &up;
        let (s, out) = std::thread::scope(|sc| {
            sc.spawn(move || {
                let out = shared.run(&s, OutputMask::ALL);
                (s, out)
            })
            .join()
            .expect("thread")
        });
        let out = out?;
        check_result(&s, &out, OutputMask::ALL, DType::F32, &inp.expected());
        check_result(&s, &up.run(&s, OutputMask::ALL)?, OutputMask::ALL, DType::F32, &inp.expected());
        Ok(())
    });
}

// ---------------------------------------------------------------------------------------------
// Devices and backends

/// The mock has one device: asking for another errors (never panics).
#[test]
fn missing_device_is_an_error() {
    isolated(|ctx| {
        assert_eq!(ctx.backend(), Backend::Ascend);
        let dir = ascend::mock::toolkit_dir();
        match ascend::mock::context(7) {
            Err(Error::NoDevice { device: 7, count: 1 }) => {}
            other => panic!("expected NoDevice {{ 7, 1 }}, got {other:?}"),
        }
        assert!(ascend::mock::context(-1).is_err());
        assert!(ascend::mock::context(1).is_err());
        assert!(Context::ascend_from(dir, 7).is_err());
        // Through the default search (no toolkit in the environment of this test binary, or a
        // real one): an error for device 7 either way.
        assert!(Context::ascend(7).is_err());
    });
}

/// A CPU tensor given to an Ascend stream (as any input, as an output, to `to_vec`) is rejected
/// with 161002 before anything is enqueued.
#[test]
fn cpu_tensor_on_an_ascend_stream() {
    on_stream(|_, s| {
        let cs = Context::cpu().new_stream()?;
        let inp = inputs(40);
        let up = inp.upload(&s)?;
        let host = inp.upload(&cs)?;
        let mut host_out = Tensor::zeros(&cs, DType::F32, &[3])?;
        let mut outs = Outs::filled(&s, DType::F32, 3)?;
        let base = stats();
        let w = up.weight.as_ref();
        for (i, (dy, x, mean, invstd, w)) in [
            (&host.dy, &up.x, &up.mean, &up.invstd, w),
            (&up.dy, &host.x, &up.mean, &up.invstd, w),
            (&up.dy, &up.x, &host.mean, &up.invstd, w),
            (&up.dy, &up.x, &up.mean, &host.invstd, w),
            (&up.dy, &up.x, &up.mean, &up.invstd, host.weight.as_ref()),
        ]
        .into_iter()
        .enumerate()
        {
            let err = batch_norm_reduce_backward(&s, dy, x, mean, invstd, w, OutputMask::ALL).unwrap_err();
            assert_eq!(err.status(), Some(INVALID), "input {i}: {err}");
        }
        let [a, b, c, _] = &mut outs.t;
        let out = ReduceBackwardOut {
            sum_dy: Some(a),
            sum_dy_xmu: Some(b),
            grad_weight: Some(c),
            grad_bias: Some(&mut host_out),
        };
        assert_eq!(up.run_into(&s, OutputMask::ALL, out).unwrap_err().status(), Some(INVALID));
        assert_eq!(host.dy.to_vec::<f32>(&s).unwrap_err().status(), Some(INVALID));
        assert_eq!(up.dy.to_vec::<f32>(&cs).unwrap_err().status(), Some(INVALID));
        assert_eq!(stats().device_mallocs, base.device_mallocs);
        assert_eq!(live(&stats()), live(&base));
        outs.assert_untouched(&s);
        assert_eq!(host_out.to_vec::<f32>(&cs)?, [0.0; 3]);
        Ok(())
    });
}
