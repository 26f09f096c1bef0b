//! Host memory of the CPU backend: cached per context and reused across steps (counted by
//! `Context::memory_stats`), zero where `Tensor::zeros` promises it even in a reused block,
//! untouched by a rejected call, and returned by `Context::empty_cache`.

use ascend::hccl::Communicator;
use ascend::ops::{self, OutputMask};
use ascend::{sync_batch_norm, Context, DType, Tensor};

/// A training step's tensors come from the cache after the first step: no host block asked of
/// the system per steady step, and `allocated` back where it was once the step's outputs drop.
#[test]
fn steady_steps_reuse_host_memory() {
    let ctx = Context::cpu();
    let s = ctx.new_stream().unwrap();
    let comm = Communicator::init_all(std::slice::from_ref(&ctx)).unwrap().remove(0);
    let shape = [4, 3, 50];
    let n: usize = shape.iter().product();
    let v = |k: f32| -> Vec<f32> { (0..n).map(|i| ((i * 7 + 3) % 23) as f32 * k - 1.0).collect() };
    let (x, dy) = (Tensor::from_slice(&s, &v(0.25), &shape).unwrap(), Tensor::from_slice(&s, &v(0.5), &shape).unwrap());
    let w = Tensor::from_slice(&s, &[1.0f32, 2.0, 0.5], &[3]).unwrap();
    let step = || {
        let (y, saved) = sync_batch_norm::forward(&comm, &s, &x, Some(&w), None, None, None, 0.1, 1e-5).unwrap();
        let g = sync_batch_norm::backward(&comm, &s, &dy, &saved, Some(&w), OutputMask::ALL).unwrap();
        (y.to_vec::<f32>(&s).unwrap(), g.0.unwrap().to_vec::<f32>(&s).unwrap())
    };
    let first = step();
    let (before, after_first) = (ctx.memory_stats(), ctx.memory_stats().device_allocations);
    for _ in 0..3 {
        assert_eq!(step(), first, "a reused block changed a result");
    }
    let m = ctx.memory_stats();
    assert_eq!(m.device_allocations, after_first, "a steady step asked the system for host memory");
    assert_eq!(m.allocated, before.allocated, "the step's tensors went back");
    assert!(m.reserved > m.allocated, "dropped tensors' blocks stay cached");
    assert!(m.peak_allocated >= m.allocated + n * 4, "the peak counts the step's outputs");
    ctx.empty_cache().unwrap();
    let e = ctx.memory_stats();
    assert_eq!(e.allocated, m.allocated, "live tensors keep their memory");
    assert!(e.reserved < m.reserved, "empty_cache returned the idle blocks");
}

/// `Tensor::zeros` in a block reused from a dropped tensor of non-zero values is zero.
#[test]
fn zeros_in_a_reused_block_are_zero() {
    let ctx = Context::cpu();
    let s = ctx.new_stream().unwrap();
    let ones = Tensor::from_slice(&s, &vec![1.5f32; 4096], &[4096]).unwrap();
    drop(ones);
    let blocks = ctx.memory_stats().device_allocations;
    let z = Tensor::zeros(&s, DType::F32, &[4096]).unwrap();
    assert_eq!(ctx.memory_stats().device_allocations, blocks, "the block was reused");
    assert!(z.to_vec::<f32>(&s).unwrap().iter().all(|&v| v == 0.0));
}

/// A rejected call takes no host memory and returns no tensor.
#[test]
fn a_rejected_call_takes_no_memory() {
    let ctx = Context::cpu();
    let s = ctx.new_stream().unwrap();
    let x = Tensor::from_slice(&s, &[1.0f32, 2.0, 3.0, 4.0], &[2, 2]).unwrap();
    let bad = Tensor::from_slice(&s, &[1.0f32; 3], &[3]).unwrap();
    let before = ctx.memory_stats();
    assert!(ops::batch_norm_elemt(&s, &x, None, None, &bad, &bad, 1e-5).is_err());
    assert!(ops::batch_norm_reduce_backward(&s, &x, &x, &bad, &bad, None, OutputMask::ALL).is_err());
    assert_eq!(ctx.memory_stats(), before);
}

/// `sync_batch_norm`'s output and input gradient keep a dense input's memory order
/// (channels-last stays channels-last, as torch's layers keep it), with the values of a
/// contiguous input's; a view with gaps gives contiguous ones.
#[test]
fn sync_batch_norm_keeps_a_dense_inputs_memory_order() {
    let ctx = Context::cpu();
    let s = ctx.new_stream().unwrap();
    let comm = Communicator::init_all(std::slice::from_ref(&ctx)).unwrap().remove(0);
    let shape = [2, 3, 2, 2];
    let (cl, nchw) = ([12, 1, 6, 3], [12, 4, 2, 1]);
    let storage: Vec<f32> = (0..24).map(|i| (i * 5 % 11) as f32 - 4.0).collect();
    let step = |x: &Tensor, dy: &Tensor| {
        let (y, saved) = sync_batch_norm::forward(&comm, &s, x, None, None, None, None, 0.1, 1e-5).unwrap();
        let dx = sync_batch_norm::backward(&comm, &s, dy, &saved, None, OutputMask::ALL).unwrap().0.unwrap();
        (y, dx)
    };
    let x_cl = Tensor::from_slice_strided(&s, &storage, &shape, &cl, 0).unwrap();
    let x = Tensor::from_slice(&s, &x_cl.to_vec::<f32>(&s).unwrap(), &shape).unwrap();
    let (y_cl, dx_cl) = step(&x_cl, &x_cl);
    let (y, dx) = step(&x, &x);
    assert_eq!((y_cl.strides(), dx_cl.strides()), (&cl[..], &cl[..]));
    assert_eq!((y.strides(), dx.strides()), (&nchw[..], &nchw[..]));
    assert_eq!(y_cl.to_vec::<f32>(&s).unwrap(), y.to_vec::<f32>(&s).unwrap());
    assert_eq!(dx_cl.to_vec::<f32>(&s).unwrap(), dx.to_vec::<f32>(&s).unwrap());
    let gapped = Tensor::from_slice_strided(&s, &storage, &[2, 3, 2], &[12, 4, 2], 0).unwrap();
    assert_eq!(step(&gapped, &gapped).0.strides(), &[6, 2, 1]);
}
