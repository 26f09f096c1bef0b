//! The public API contract of docs/DESIGN.md, written out as a user would: if this compiles and
//! passes, the names, signatures and trait bounds the acceptance tests rely on are all there.

mod common;

use ascend::ops::{
    batch_norm_reduce_backward, batch_norm_reduce_backward_into, OutputMask, ReduceBackward, ReduceBackwardOut,
};
use ascend::{bf16, f16, Backend, Context, DType, Element, Error, Result, Stream, Tensor};

fn assert_traits() {
    common::traits::public_api_contract();
}

fn run(ctx: &Context) -> Result<()> {
    let stream: Stream = ctx.new_stream()?;
    stream.synchronize()?;
    let dy = Tensor::from_slice(&stream, &[1f32, 1., 1., 2., 2., 2., 3., 3.], &[4, 2])?;
    let storage: Vec<f32> = (0..8).map(|v| v as f32).collect();
    let (shape, strides, offset) = (vec![4usize, 2], vec![2usize, 1], 0usize);
    let x = Tensor::from_slice_strided(&stream, &storage, &shape, &strides, offset)?;
    let mean = Tensor::from_slice(&stream, &[f16::from_f32(1.0); 2], &[2])?;
    let invstd = Tensor::from_slice(&stream, &[bf16::from_f32(1.0); 2], &[2])?;
    let w = Tensor::from_slice(&stream, &[1f32, 1.], &[2])?;
    let z = Tensor::zeros(&stream, DType::F32, &[2])?;
    let _: (&[usize], &[usize], DType) = (dy.shape(), dy.strides(), dy.dtype());
    assert_eq!(z.to_vec::<f32>(&stream)?, [0.0, 0.0]);
    assert_eq!(<f32 as Element>::DTYPE, DType::F32);

    let out: ReduceBackward = batch_norm_reduce_backward(&stream, &dy, &x, &mean, &invstd, Some(&w), OutputMask::ALL)?;
    let sum_dy: Vec<f32> = out.sum_dy.unwrap().to_vec::<f32>(&stream)?;
    assert_eq!(sum_dy, [7.0, 8.0]);
    assert_eq!(out.sum_dy_xmu.unwrap().to_vec::<f32>(&stream)?, [21.0, 30.0]);
    assert_eq!(out.grad_weight.unwrap().to_vec::<f32>(&stream)?, [21.0, 30.0]);
    assert_eq!(out.grad_bias.unwrap().to_vec::<f32>(&stream)?, [7.0, 8.0]);

    let (mut a, mut b, mut c) = (
        Tensor::zeros(&stream, DType::F32, &[2])?,
        Tensor::zeros(&stream, DType::F16, &[2])?,
        Tensor::zeros(&stream, DType::BF16, &[2])?,
    );
    batch_norm_reduce_backward_into(
        &stream,
        &dy,
        &x,
        &mean,
        &invstd,
        None,
        OutputMask { input_g: true, weight_g: false, bias_g: true },
        ReduceBackwardOut {
            sum_dy: Some(&mut a),
            sum_dy_xmu: Some(&mut b),
            grad_weight: None,
            grad_bias: Some(&mut c),
        },
    )?;
    assert_eq!(a.to_vec::<f32>(&stream)?, [7.0, 8.0]);
    assert_eq!(b.to_vec::<f32>(&stream)?, [21.0, 30.0]);
    assert_eq!(c.to_vec::<f32>(&stream)?, [7.0, 8.0]);

    let err: Error = batch_norm_reduce_backward(&stream, &dy, &x, &w, &invstd, None, OutputMask::ALL)
        .and_then(|_| Tensor::from_slice(&stream, &[1f32; 3], &[2]))
        .unwrap_err();
    assert_eq!(err.status(), Some(161002));
    Ok(())
}

#[test]
fn contract_on_cpu() {
    assert_traits();
    let ctx = Context::cpu();
    assert_eq!(ctx.backend(), Backend::Cpu);
    run(&ctx).unwrap();
    // Without CANN (this machine), `Context::ascend` is an error, never a panic.
    if !ascend::sys::is_available() {
        assert!(Context::ascend(0).is_err());
    }
}

#[cfg(feature = "mock")]
#[test]
fn contract_on_the_mock() {
    let ctx = ascend::mock::context(0).unwrap();
    assert_eq!(ctx.backend(), Backend::Ascend);
    assert!(ascend::mock::toolkit_dir().join("lib64/libascendcl.so").is_file());
    let before = ascend::mock::stats();
    run(&ctx).unwrap();
    let s = ascend::mock::stats();
    let _ = (s.live_allocations, s.live_tensors, s.live_executors, s.live_streams, s.device_mallocs, s.violations);
    assert_eq!(s.violations, before.violations);
    // With nothing cached (the caching allocator would serve the request from a cached block, or
    // retry the failed aclrtMalloc after returning the cache), the failure surfaces.
    ctx.empty_cache().unwrap();
    ascend::mock::fail_next("aclrtMalloc", 207001);
    let stream = ctx.new_stream().unwrap();
    let err = Tensor::zeros(&stream, DType::F32, &[4]).unwrap_err();
    assert_eq!(err.status(), Some(207001));
}
