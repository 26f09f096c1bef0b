//! The documentation's sample of `aclnnBatchNormReduceBackward` (docs/cann/API.md §1.5), on
//! `Context::auto()`: Ascend device 0 when CANN and a device are present, else the CPU.
//!
//! ```text
//! cargo run --example batch_norm_reduce_backward
//! ASCEND_BACKEND=cpu cargo run --example batch_norm_reduce_backward
//! ```

mod common;

use ascend::ops::{batch_norm_reduce_backward, OutputMask};
use ascend::{Context, Tensor};

/// Runs the example, exiting with status 1 on an error ([`common::main`]).
fn main() {
    common::main(run);
}

fn run() -> ascend::Result<()> {
    let ctx = Context::auto()?;
    let stream = ctx.new_stream()?;
    println!("backend: {:?}", ctx.backend());

    // gradOut and input are [N=4, C=2]; mean, invstd and weight hold one value per channel.
    let grad_out = Tensor::from_slice(&stream, &[1f32, 1., 1., 2., 2., 2., 3., 3.], &[4, 2])?;
    let input = Tensor::from_slice(&stream, &[0f32, 1., 2., 3., 4., 5., 6., 7.], &[4, 2])?;
    let mean = Tensor::from_slice(&stream, &[1f32, 1.], &[2])?;
    let invstd = Tensor::from_slice(&stream, &[1f32, 1.], &[2])?;
    let weight = Tensor::from_slice(&stream, &[1f32, 1.], &[2])?;

    let out = batch_norm_reduce_backward(&stream, &grad_out, &input, &mean, &invstd, Some(&weight), OutputMask::ALL)?;

    for (name, t) in [
        ("sumDy", &out.sum_dy),
        ("sumDyXmu", &out.sum_dy_xmu),
        ("gradWeight", &out.grad_weight),
        ("gradBias", &out.grad_bias),
    ] {
        let values = t.as_ref().map(|t| t.to_vec::<f32>(&stream)).transpose()?.unwrap_or_default();
        let values: Vec<String> = values.iter().map(f32::to_string).collect();
        println!("{name}=[{}]", values.join(", "));
    }
    Ok(())
}
