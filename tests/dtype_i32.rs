//! `DType::I32` (for counts, as torch passes SyncBatchNorm's counter): tensors of i32 on both
//! backends, an int32 counter for `batch_norm_elemt_backward` giving the same result as a float
//! one, and the operators that take only floats rejecting i32 with 161002.

mod common;

use ascend::ops::{self, OutputMask};
use ascend::{DType, Tensor};

#[test]
fn i32_tensors_round_trip_on_every_backend() {
    for ctx in common::backends() {
        let s = ctx.new_stream().unwrap();
        let v = [7i32, -3, 1 << 20, i32::MAX, i32::MIN, 0];
        let mut t = Tensor::from_slice(&s, &v, &[3, 2]).unwrap();
        assert_eq!(t.dtype(), DType::I32);
        assert_eq!(t.to_vec::<i32>(&s).unwrap(), v, "{:?}", ctx.backend());
        assert_eq!(t.to_vec::<f32>(&s).unwrap()[..3], [7.0, -3.0, 1048576.0]);
        t.copy_from_slice(&s, &[1i32, 2, 3, 4, 5, 6]).unwrap();
        assert_eq!(t.to_vec::<i32>(&s).unwrap(), [1, 2, 3, 4, 5, 6]);
        let z = Tensor::zeros(&s, DType::I32, &[4]).unwrap();
        assert_eq!(z.to_vec::<i32>(&s).unwrap(), [0; 4]);
    }
}

#[test]
fn an_int32_counter_gives_the_float_counters_result() {
    for ctx in common::backends() {
        let s = ctx.new_stream().unwrap();
        let mut rng = common::Rng::new(5);
        let shape = [4, 3, 5];
        let dy = common::Data::normal(&mut rng, DType::F32, &shape, 0.0, 1.0).tensor(&s).unwrap();
        let x = common::Data::normal(&mut rng, DType::F32, &shape, 0.5, 1.0).tensor(&s).unwrap();
        let c = |v: [f32; 3]| Tensor::from_slice(&s, &v, &[3]).unwrap();
        let (mean, invstd, sum_dy, sum_dy_xmu) =
            (c([0.4, 0.5, 0.6]), c([1.0, 1.5, 0.7]), c([2.0, -1.0, 0.5]), c([0.3, 0.2, -0.4]));
        let f32_counter = Tensor::from_slice(&s, &[20f32, 40.0], &[2, 1]).unwrap();
        let i32_counter = Tensor::from_slice(&s, &[20i32, 40], &[2, 1]).unwrap();
        let run = |counter: &Tensor| {
            ops::batch_norm_elemt_backward(&s, &dy, &x, &mean, &invstd, None, &sum_dy, &sum_dy_xmu, counter)
                .unwrap()
                .to_vec::<f32>(&s)
                .unwrap()
        };
        assert_eq!(run(&i32_counter), run(&f32_counter), "{:?}", ctx.backend());
    }
}

#[test]
fn float_only_arguments_reject_i32() {
    for ctx in common::backends() {
        let s = ctx.new_stream().unwrap();
        let xi = Tensor::from_slice(&s, &[1i32; 8], &[4, 2]).unwrap();
        let xf = Tensor::from_slice(&s, &[1f32; 8], &[4, 2]).unwrap();
        let ones = Tensor::from_slice(&s, &[1f32; 2], &[2]).unwrap();
        let counts_i32 = Tensor::from_slice(&s, &[4i32], &[1]).unwrap();
        let rows = Tensor::from_slice(&s, &[0f32; 2], &[1, 2]).unwrap();
        let status = |r: ascend::Result<()>| r.unwrap_err().status();
        let b = ctx.backend();
        assert_eq!(
            status(ops::batch_norm_reduce_backward(&s, &xi, &xi, &ones, &ones, None, OutputMask::ALL).map(drop)),
            Some(161002),
            "{b:?}"
        );
        assert_eq!(status(ops::batch_norm_stats(&s, &xi, 1e-5).map(drop)), Some(161002), "{b:?}");
        assert_eq!(
            status(ops::batch_norm_elemt(&s, &xi, None, None, &ones, &ones, 1e-5).map(drop)),
            Some(161002),
            "{b:?}"
        );
        // CANN takes no int32 counts in GatherStatsWithCounts (only ElemtBackward's counter).
        assert_eq!(
            status(
                ops::batch_norm_gather_stats_with_counts(&s, &xf, &rows, &rows, None, None, 0.1, 1e-5, &counts_i32)
                    .map(drop)
            ),
            Some(161002),
            "{b:?}"
        );
    }
}
