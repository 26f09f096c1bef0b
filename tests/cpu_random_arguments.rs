//! The CPU zero-copy entry on thousands of random, mostly invalid argument sets: every call
//! returns (Ok, or an error with 161001/161002) and never panics; accepted calls write only the
//! outputs' view elements and match an f64 reference.

mod common;

use ascend::cpu::{self, Outputs, View, ViewMut};
use ascend::ops::OutputMask;
use common::Rng;

/// A random shape, strides and offset, usually (not always) inside a storage of `len`.
fn geometry(rng: &mut Rng, rank: usize, len: usize) -> (Vec<usize>, Vec<usize>, usize) {
    let shape: Vec<usize> = (0..rank).map(|_| rng.index(4) + usize::from(rng.index(8) != 0)).collect();
    let strides: Vec<usize> = match rng.index(4) {
        0 => (0..rank).map(|_| rng.index(7)).collect(),
        1 => (0..rank).map(|_| [0, 1, usize::MAX / 2, 3][rng.index(4)]).collect(),
        _ => {
            let mut acc = 1;
            let mut s = vec![0; rank];
            for i in (0..rank).rev() {
                s[i] = acc;
                acc *= shape[i].max(1);
            }
            s
        }
    };
    let offset = if rng.index(5) == 0 { rng.index(len + 3) } else { 0 };
    (shape, strides, offset)
}

#[test]
fn random_arguments_never_panic_and_accepted_calls_are_right() {
    let mut rng = Rng::new(2024);
    let (mut accepted, mut rejected) = (0, 0);
    for _ in 0..20_000 {
        let rank = rng.index(10);
        let len = rng.index(200);
        let dy_data: Vec<f32> = (0..len).map(|_| rng.uniform_f32(-1.0, 1.0)).collect();
        let x_data: Vec<f32> = (0..len).map(|_| rng.uniform_f32(-1.0, 1.0)).collect();
        let (shape, dstr, doff) = geometry(&mut rng, rank, len);
        let (_, xstr, xoff) = geometry(&mut rng, rank, len);
        let xshape = if rng.index(10) == 0 { geometry(&mut rng, rank, len).0 } else { shape.clone() };
        let c = if shape.len() > 1 && rng.index(8) != 0 { shape[1] } else { rng.index(4) };
        let stat: Vec<f32> = (0..c + 2).map(|_| rng.uniform_f32(-1.0, 1.0)).collect();
        let stat_shape = [c + usize::from(rng.index(12) == 0)];
        let mut outs: Vec<Vec<f32>> = (0..4).map(|_| vec![9.0; 2 * c + 3]).collect();
        let out_shape = [c];
        let out_stride = [1 + rng.index(2)];
        let mask = OutputMask { input_g: rng.index(2) == 0, weight_g: rng.index(2) == 0, bias_g: rng.index(2) == 0 };
        let missing = rng.index(16);
        let result = {
            let mut it = outs
                .iter_mut()
                .enumerate()
                .map(|(i, o)| (i != missing).then(|| ViewMut::strided(o.as_mut_slice(), &out_shape, &out_stride, 0)));
            let out = Outputs {
                sum_dy: it.next().flatten(),
                sum_dy_xmu: it.next().flatten(),
                grad_weight: it.next().flatten(),
                grad_bias: it.next().flatten(),
            };
            cpu::batch_norm_reduce_backward(
                View::strided(&dy_data, &shape, &dstr, doff),
                View::strided(&x_data, &xshape, &xstr, xoff),
                View::new(&stat, &stat_shape),
                View::new(&stat, &stat_shape),
                None,
                mask,
                out,
            )
        };
        match result {
            Err(e) => {
                rejected += 1;
                assert!(matches!(e.status(), Some(161001 | 161002)), "{e}");
                assert!(outs.iter().all(|o| o.iter().all(|&v| v == 9.0)), "a rejected call wrote: {e}");
            }
            Ok(()) => {
                accepted += 1;
                // f64 reference of Σdy per channel; check sumDy when it was asked for.
                let mut sum = vec![0f64; c];
                let mut idx = vec![0usize; shape.len()];
                let n: usize = shape.iter().product();
                for _ in 0..n {
                    let p = doff + idx.iter().zip(&dstr).map(|(i, s)| i * s).sum::<usize>();
                    sum[idx[1]] += f64::from(dy_data[p]);
                    for k in (0..shape.len()).rev() {
                        idx[k] += 1;
                        if idx[k] < shape[k] {
                            break;
                        }
                        idx[k] = 0;
                    }
                }
                if mask.input_g && missing != 0 {
                    for ch in 0..c {
                        let got = f64::from(outs[0][ch * out_stride[0]]);
                        assert!(
                            (got - sum[ch]).abs() <= 1e-5 * (1.0 + sum[ch].abs()),
                            "sumDy[{ch}] {got} vs {}",
                            sum[ch]
                        );
                    }
                }
                for o in &outs {
                    // Elements outside the [c] view keep their value.
                    for (i, &v) in o.iter().enumerate() {
                        if i >= c * out_stride[0] || i % out_stride[0] != 0 {
                            assert_eq!(v, 9.0, "wrote outside the output view at {i}");
                        }
                    }
                }
            }
        }
    }
    assert!(
        accepted > 500 && rejected > 500,
        "accepted {accepted}, rejected {rejected}: the generator must cover both"
    );
}
