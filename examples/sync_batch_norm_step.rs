//! The SyncBatchNorm backward step this operator serves, simulated with two ranks in one
//! process: each rank reduces its own shard (`batch_norm_reduce_backward`), the per-channel sums
//! are all-reduced (here: added on the host; in training, an all-reduce over HCCL/NCCL), and every
//! rank then has the global sums from which gradWeight, gradBias and the input gradient follow.
//!
//! The result is checked against one rank reducing the whole batch.
//!
//! ```text
//! cargo run --example sync_batch_norm_step
//! ```

mod common;

use ascend::ops::{batch_norm_reduce_backward, OutputMask};
use ascend::{Context, Stream, Tensor};

const N_PER_RANK: usize = 3;
const C: usize = 4;
const HW: usize = 5;

/// Deterministic pseudo-random data in [-1, 1).
fn data(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// One rank's local reduction: (sumDy, sumDyXmu) per channel.
fn local_reduce(
    stream: &Stream,
    dy: &[f32],
    x: &[f32],
    n: usize,
    mean: &[f32],
    invstd: &[f32],
) -> ascend::Result<[Vec<f32>; 2]> {
    let shape = [n, C, HW];
    let dy = Tensor::from_slice(stream, dy, &shape)?;
    let x = Tensor::from_slice(stream, x, &shape)?;
    let mean = Tensor::from_slice(stream, mean, &[C])?;
    let invstd = Tensor::from_slice(stream, invstd, &[C])?;
    let mask = OutputMask { input_g: true, weight_g: false, bias_g: false };
    let out = batch_norm_reduce_backward(stream, &dy, &x, &mean, &invstd, None, mask)?;
    let get = |t: Option<Tensor>| t.map(|t| t.to_vec::<f32>(stream)).transpose().map(Option::unwrap_or_default);
    Ok([get(out.sum_dy)?, get(out.sum_dy_xmu)?])
}

/// Runs the example, exiting with status 1 on an error ([`common::main`]).
fn main() {
    common::main(run);
}

fn run() -> ascend::Result<()> {
    let ctx = Context::auto()?;
    println!("backend: {:?}", ctx.backend());
    let stream = ctx.new_stream()?;

    // The forward pass's statistics over the global batch (2 ranks × N_PER_RANK samples).
    let numel_rank = N_PER_RANK * C * HW;
    let (dy, x) = (data(1, 2 * numel_rank), data(2, 2 * numel_rank));
    let mut mean = [0f32; C];
    let mut var = [0f32; C];
    let count = (2 * N_PER_RANK * HW) as f32;
    for (i, &v) in x.iter().enumerate() {
        mean[(i / HW) % C] += v / count;
    }
    for (i, &v) in x.iter().enumerate() {
        let c = (i / HW) % C;
        var[c] += (v - mean[c]) * (v - mean[c]) / count;
    }
    let invstd: Vec<f32> = var.iter().map(|v| 1.0 / (v + 1e-5).sqrt()).collect();

    // 1. Each rank reduces its shard locally.
    let ranks: Vec<[Vec<f32>; 2]> = (0..2)
        .map(|r| {
            let shard = r * numel_rank..(r + 1) * numel_rank;
            local_reduce(&stream, &dy[shard.clone()], &x[shard], N_PER_RANK, &mean, &invstd)
        })
        .collect::<ascend::Result<_>>()?;

    // 2. All-reduce (sum) of the per-channel sums across ranks.
    let sum_dy: Vec<f32> = (0..C).map(|c| ranks[0][0][c] + ranks[1][0][c]).collect();
    let sum_dy_xmu: Vec<f32> = (0..C).map(|c| ranks[0][1][c] + ranks[1][1][c]).collect();

    // 3. What every rank derives from the global sums.
    let grad_weight: Vec<f32> = sum_dy_xmu.iter().zip(&invstd).map(|(s, i)| s * i).collect();
    let grad_bias = sum_dy.clone();
    let mean_dy: Vec<f32> = sum_dy.iter().map(|s| s / count).collect();
    let mean_dy_xmu: Vec<f32> = sum_dy_xmu.iter().map(|s| s / count).collect();
    // Input gradient of element 0 of channel 1 on rank 0 (weight = 1), as batch_norm_backward_elemt computes it.
    let (i, c) = (HW, 1);
    let dx = (dy[i] - mean_dy[c] - (x[i] - mean[c]) * invstd[c] * invstd[c] * mean_dy_xmu[c]) * invstd[c];

    println!("all-reduced sumDy={sum_dy:?}");
    println!("all-reduced sumDyXmu={sum_dy_xmu:?}");
    println!("gradWeight={grad_weight:?}");
    println!("gradBias={grad_bias:?}");
    println!("dx[0, 1, 0] on rank 0 = {dx}");

    // Check: one rank over the whole batch gives the same sums (up to f32 rounding of the split).
    let [full_dy, full_xmu] = local_reduce(&stream, &dy, &x, 2 * N_PER_RANK, &mean, &invstd)?;
    let close = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(a, b)| (a - b).abs() <= 1e-5 * (1.0 + b.abs()));
    assert!(close(&sum_dy, &full_dy) && close(&sum_dy_xmu, &full_xmu), "sharded and full-batch sums differ");
    println!("sharded sums match the full-batch reduction");
    Ok(())
}
