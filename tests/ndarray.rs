//! The `ndarray` feature: `Tensor::from_array` and `Tensor::to_array` on the CPU and the mock,
//! bit-exact for every dtype, from arrays and views of any strides (transposed, stepped,
//! negative, broadcast), of any dimension.

mod common;

use ascend::{bf16, f16, Context, DType, Element, Result, Tensor};
use common::{on_both_backends, Rng};
use ndarray::{s, Array, ArrayD, ArrayView, Axis, IxDyn};

/// Random values of `T` (i32: integers in [-1000, 1000)), never all zero.
fn random<T: Element>(n: usize, seed: u64) -> Vec<T> {
    let mut rng = Rng::new(seed);
    (0..n)
        .map(|_| match T::DTYPE {
            DType::I32 => T::from_f64(rng.uniform(-1000.0, 1000.0).floor()),
            _ => T::from_f64(rng.uniform(-1.0, 1.0)),
        })
        .collect()
}

/// `from_array` of an owned array, then of views of it with other strides; each read back with
/// `to_array` equals the view element for element (bit for bit: `==` on the dtype's values,
/// none of which is NaN).
fn exact<T: Element>(ctx: &Context) -> Result<()> {
    let s = ctx.new_stream()?;
    let a = Array::from_shape_vec((4, 6), random::<T>(24, 3)).unwrap();
    let views: Vec<ArrayView<'_, T, _>> = vec![
        a.view(),
        a.t(),                    // transposed
        a.slice(s![.., ..;2]),    // every other column
        a.slice(s![..;-1, 1..]),  // rows reversed: negative strides, copied
        a.slice(s![1..3, ..;-3]), // both
    ];
    for v in views {
        let t = Tensor::from_array(&s, v)?;
        assert_eq!(t.shape(), v.shape());
        assert_eq!(t.dtype(), T::DTYPE);
        assert!(t.is_contiguous(), "row-major whatever the view's memory order");
        let back: ArrayD<T> = t.to_array(&s)?;
        assert_eq!(back, v.into_dyn());
    }
    let t = Tensor::from_array(&s, &a)?; // an owned array by reference
    assert_eq!(t.to_array::<T>(&s)?, a.into_dyn());
    Ok(())
}

fn round_trips_are_exact_for_every_dtype(ctx: &Context) -> Result<()> {
    exact::<f32>(ctx)?;
    exact::<f16>(ctx)?;
    exact::<bf16>(ctx)?;
    exact::<i32>(ctx)
}

/// 0-d, 1-d, 3-d and dynamic-dimension arrays, an empty one, a broadcast (zero-stride) view.
fn any_dimension_and_odd_views(ctx: &Context) -> Result<()> {
    let s = ctx.new_stream()?;
    let scalar = ndarray::arr0(1.25f32);
    assert_eq!(Tensor::from_array(&s, &scalar)?.to_array::<f32>(&s)?, scalar.into_dyn());
    let line = Array::from_vec(random::<f32>(7, 5));
    assert_eq!(Tensor::from_array(&s, &line)?.to_array::<f32>(&s)?, line.clone().into_dyn());
    let cube = Array::from_shape_vec((2, 3, 4), random::<f32>(24, 6)).unwrap();
    let moved = cube.view().permuted_axes([2, 0, 1]);
    assert_eq!(Tensor::from_array(&s, moved)?.to_array::<f32>(&s)?, moved.into_dyn());
    let dynamic = ArrayD::from_shape_vec(IxDyn(&[3, 1, 2]), random::<f32>(6, 7)).unwrap();
    assert_eq!(Tensor::from_array(&s, &dynamic)?.to_array::<f32>(&s)?, dynamic);
    let empty = Array::<f32, _>::zeros((0, 3));
    let t = Tensor::from_array(&s, &empty)?;
    assert_eq!((t.shape(), t.to_array::<f32>(&s)?.len()), (&[0usize, 3][..], 0));
    let wide = line.broadcast((3, 7)).unwrap(); // stride 0 along the first axis
    assert_eq!(Tensor::from_array(&s, wide)?.to_array::<f32>(&s)?, wide.into_dyn());
    let col = cube.index_axis(Axis(2), 1);
    assert_eq!(Tensor::from_array(&s, col)?.to_array::<f32>(&s)?, col.into_dyn());
    Ok(())
}

/// `to_array` of a strided tensor (not made from an array) is its view, row-major.
fn to_array_reads_the_view(ctx: &Context) -> Result<()> {
    let s = ctx.new_stream()?;
    let storage = random::<f32>(30, 9);
    let t = Tensor::from_slice_strided(&s, &storage, &[3, 4], &[1, 6], 2)?;
    let expect = Array::from_shape_fn((3, 4), |(i, j)| storage[2 + i + 6 * j]).into_dyn();
    assert_eq!(t.to_array::<f32>(&s)?, expect);
    // Another element type converts as to_vec does: one rounding to nearest even.
    let narrow: ArrayD<f16> = t.to_array(&s)?;
    assert_eq!(narrow, expect.mapv(f16::from_f32));
    Ok(())
}

on_both_backends!(round_trips_are_exact_for_every_dtype, any_dimension_and_odd_views, to_array_reads_the_view);
