//! The public types apart from any one operator's values: tensors (`to_vec` conversions,
//! metadata), contexts and streams (threads), and the compile-time properties of the public
//! types (docs/DESIGN.md "Public API contract"); on both backends.

mod common;

use ascend::ops::{batch_norm_reduce_backward, OutputMask, PreparedReduceBackward, ReduceBackward, Workspace};
use ascend::{bf16, f16, Backend, Context, DType, Error, Result, Stream, Tensor};
use common::*;

type R = Result<()>;

on_both_backends!(to_vec_conversions, tensor_metadata, context_and_streams);

/// `to_vec` converts between dtypes (exact widening, round-to-nearest narrowing, inf on f16
/// overflow) and reads views in row-major order.
fn to_vec_conversions(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let vals = [1.0f32, 1.0 / 3.0, 65520.0, 1e-8, -2.5, 0.1, f32::INFINITY, -0.0];
    let t = Tensor::from_slice(&s, &vals, &[2, 4])?;
    assert_eq!(t.to_vec::<f32>(&s)?, vals);
    let h: Vec<f16> = t.to_vec(&s)?;
    assert_eq!(h, vals.iter().map(|&v| f16::from_f32(v)).collect::<Vec<_>>());
    assert_eq!(h[2], f16::INFINITY);
    let b: Vec<bf16> = t.to_vec(&s)?;
    assert_eq!(b, vals.iter().map(|&v| bf16::from_f32(v)).collect::<Vec<_>>());
    let hv: Vec<f16> = vals.iter().map(|&v| f16::from_f32(v)).collect();
    let th = Tensor::from_slice(&s, &hv, &[8])?;
    assert_eq!(th.dtype(), DType::F16);
    assert_eq!(th.to_vec::<f32>(&s)?, hv.iter().map(|v| v.to_f32()).collect::<Vec<_>>());
    assert_eq!(th.to_vec::<f16>(&s)?, hv);
    let tb = Tensor::from_slice(&s, &b, &[8])?;
    assert_eq!(tb.to_vec::<f32>(&s)?, b.iter().map(|v| v.to_f32()).collect::<Vec<_>>());
    assert_eq!(tb.to_vec::<f16>(&s)?, b.iter().map(|v| f16::from_f32(v.to_f32())).collect::<Vec<_>>());
    // NaN survives
    let tn = Tensor::from_slice(&s, &[f32::NAN], &[1])?;
    assert!(tn.to_vec::<f16>(&s)?[0].is_nan() && tn.to_vec::<bf16>(&s)?[0].is_nan());
    // views: transpose of a 2x3 storage, and a strided one with an offset
    let st = [0f32, 1., 2., 3., 4., 5.];
    let tt = Tensor::from_slice_strided(&s, &st, &[3, 2], &[1, 3], 0)?;
    assert_eq!(tt.to_vec::<f32>(&s)?, [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
    let tv = Tensor::from_slice_strided(&s, &st, &[2, 2], &[3, 1], 1)?;
    assert_eq!(tv.to_vec::<f16>(&s)?, [1.0f32, 2., 4., 5.].map(f16::from_f32));
    // empty and zeros
    let z = Tensor::zeros(&s, DType::BF16, &[2, 0, 3])?;
    assert!(z.to_vec::<f32>(&s)?.is_empty());
    let z = Tensor::zeros(&s, DType::F16, &[3])?;
    assert_eq!(z.to_vec::<f32>(&s)?, [0.0; 3]);
    Ok(())
}

/// Shape, strides, offset, dtype, numel and contiguity as given.
fn tensor_metadata(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let t = Tensor::from_slice(&s, &[0f32; 24], &[2, 3, 4])?;
    assert_eq!((t.shape(), t.strides(), t.offset(), t.dtype()), (&[2, 3, 4][..], &[12, 4, 1][..], 0, DType::F32));
    assert_eq!((t.numel(), t.storage_len(), t.is_contiguous()), (24, 24, true));
    let v = Tensor::from_slice_strided(&s, &[bf16::ZERO; 30], &[4, 3], &[1, 8], 5)?;
    assert_eq!((v.shape(), v.strides(), v.offset(), v.dtype()), (&[4, 3][..], &[1, 8][..], 5, DType::BF16));
    assert_eq!((v.numel(), v.storage_len(), v.is_contiguous()), (12, 30, false));
    let z = Tensor::zeros(&s, DType::F16, &[5, 0, 2])?;
    assert_eq!((z.shape(), z.dtype(), z.numel()), (&[5, 0, 2][..], DType::F16, 0));
    assert_eq!(t.is_device(), ctx.backend() == Backend::Ascend);
    assert!(!format!("{t:?}").is_empty());
    Ok(())
}

/// Context basics, and a clone of it used from another thread.
fn context_and_streams(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    assert_eq!(s.backend(), ctx.backend());
    assert_eq!(s.context().backend(), ctx.backend());
    match ctx.backend() {
        Backend::Cpu => {
            assert_eq!(ctx.device_id(), None);
            assert!(s.as_raw().is_none());
        }
        Backend::Ascend => {
            assert_eq!(ctx.device_id(), Some(0));
            assert!(s.as_raw().is_some_and(|p| !p.is_null()));
        }
    }
    s.synchronize()?;
    let c2 = ctx.clone();
    let handle = std::thread::spawn(move || -> Result<Vec<f32>> {
        let s = c2.new_stream()?;
        let dy = Tensor::from_slice(&s, &[1f32, 1., 1., 2., 2., 2., 3., 3.], &[4, 2])?;
        let x = Tensor::from_slice(&s, &[0f32, 1., 2., 3., 4., 5., 6., 7.], &[4, 2])?;
        let ones = Tensor::from_slice(&s, &[1f32, 1.], &[2])?;
        let out = batch_norm_reduce_backward(&s, &dy, &x, &ones, &ones, None, OutputMask::ALL)?;
        out.sum_dy_xmu.unwrap().to_vec(&s)
    });
    assert_eq!(handle.join().expect("thread")?, [21.0, 30.0]);
    // A stream (Send) moved to another thread, and tensors shared by reference (Sync).
    let up = Inputs::normal(800, DType::F32, DType::F32, &[3, 2]).upload(&s)?;
    let shared = &up;
    let sum = std::thread::scope(|sc| {
        sc.spawn(move || -> Result<Vec<f32>> {
            let out = shared.run(&s, OutputMask::ALL)?;
            out.sum_dy.unwrap().to_vec(&s)
        })
        .join()
        .expect("thread")
    })?;
    assert_eq!(sum.len(), 2);
    Ok(())
}

/// Compile-time properties of the public types (docs/DESIGN.md "Public API contract").
#[test]
fn static_properties() {
    use ascend::cpu::{Outputs, View, ViewMut};
    use common::traits::{probe, public_api_contract};
    public_api_contract();
    probe!(send_sync: ReduceBackward);
    probe!(send: Workspace);
    probe!(copy: DType, Backend);
    probe!(error: Error);
    probe!(debug: OutputMask, PreparedReduceBackward<'static>, Workspace);
    probe!(debug: View<'static>, ViewMut<'static>, Outputs<'static>);

    // Stream is Send but deliberately not Sync (one thread enqueues at a time): this line would
    // not compile (ambiguous impl) if Stream were Sync.
    trait AmbiguousIfSync<A> {
        fn some_item() {}
    }
    impl<T: ?Sized> AmbiguousIfSync<()> for T {}
    impl<T: ?Sized + Sync> AmbiguousIfSync<u8> for T {}
    <Stream as AmbiguousIfSync<_>>::some_item();
}
