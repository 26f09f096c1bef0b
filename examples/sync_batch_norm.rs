//! A SyncBatchNorm layer's forward and backward over N ranks, checked against BatchNorm over the
//! whole global batch (computed here in f64).
//!
//! ```sh
//! cargo run --example sync_batch_norm                       # 4 ranks as threads: Ascend devices 0..3 if present, else CPU
//! cargo run --example sync_batch_norm --features mock -- --mock   # 4 ranks on mock Ascend devices
//! cargo run --example sync_batch_norm -- --ranks 8          # any number of ranks
//! ```
//!
//! One process per device (a real server, or the mock with `--features mock -- --mock`): start
//! one process per rank with `ASCEND_RANK` (0..n), `ASCEND_WORLD_SIZE` (n) and
//! `ASCEND_ROOT_INFO_FILE` (a path all ranks see). Rank 0 writes HCCL's root info there; the
//! others wait for the file, then all join (`Communicator::init_rank`):
//!
//! ```sh
//! rm -f /tmp/syncbn.root     # a stale file from an earlier run would mislead the other ranks
//! for r in 0 1 2 3 4 5 6 7; do
//!   ASCEND_RANK=$r ASCEND_WORLD_SIZE=8 ASCEND_ROOT_INFO_FILE=/tmp/syncbn.root \
//!     target/release/examples/sync_batch_norm &
//! done; wait
//! ```
//! Under a launcher (torchrun's `RANK`/`WORLD_SIZE`/`MASTER_ADDR`/`MASTER_PORT`/`LOCAL_RANK`, or
//! `RANK_TABLE_FILE` with `RANK_ID`/`DEVICE_ID`), each process joins with
//! `Communicator::from_env` (see `launched_rank` and `.ci/cluster`):
//!
//! ```sh
//! for r in 0 1 2 3; do
//!   RANK=$r LOCAL_RANK=$r WORLD_SIZE=4 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 \
//!     target/release/examples/sync_batch_norm &
//! done; wait
//! ```
//! Across servers, copy the root file to every server (or pass it any other way: it is 4128
//! bytes) and give each process its global rank; the device is `ASCEND_DEVICE` (default: the
//! rank modulo 8).

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use ascend::hccl::{Communicator, RootInfo};
use ascend::ops::OutputMask;
use ascend::{sync_batch_norm, Context, Result, Stream, Tensor};

const C: usize = 8;
const S: usize = 16;
const ROWS_PER_RANK: usize = 3;
const EPS: f64 = 1e-5;

/// Deterministic data of the global batch (every rank makes all of it, uses its own rows).
fn global(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed | 1;
    (0..n * C * S)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 11) as f64 / (1u64 << 53) as f64 * 4.0 - 1.5) as f32
        })
        .collect()
}

/// BatchNorm over the global batch in f64: (y, dx).
fn reference(x: &[f32], dy: &[f32], n: usize) -> (Vec<f64>, Vec<f64>) {
    let m = (n * S) as f64;
    let (mut y, mut dx) = (vec![0.0; x.len()], vec![0.0; x.len()]);
    for c in 0..C {
        let idx: Vec<usize> = (0..n).flat_map(|i| (0..S).map(move |k| (i * C + c) * S + k)).collect();
        let mu = idx.iter().map(|&j| f64::from(x[j])).sum::<f64>() / m;
        let var = idx.iter().map(|&j| (f64::from(x[j]) - mu).powi(2)).sum::<f64>() / m;
        let inv = 1.0 / (var + EPS).sqrt();
        let sdy: f64 = idx.iter().map(|&j| f64::from(dy[j])).sum();
        let sdyx: f64 = idx.iter().map(|&j| f64::from(dy[j]) * (f64::from(x[j]) - mu)).sum();
        for &j in &idx {
            let xm = f64::from(x[j]) - mu;
            y[j] = xm * inv;
            dx[j] = inv * (f64::from(dy[j]) - sdy / m - xm * inv * inv * sdyx / m);
        }
    }
    (y, dx)
}

/// One rank's step: forward + backward on its rows; returns the largest error against f64 and
/// the time of the step (forward + backward, results read back), in ms.
fn rank_step(comm: &Communicator, s: &Stream, n_ranks: usize) -> Result<(f64, f64)> {
    let n = n_ranks * ROWS_PER_RANK;
    let (gx, gdy) = (global(n, 1), global(n, 2));
    let rows = comm.rank() as usize * ROWS_PER_RANK * C * S..(comm.rank() as usize + 1) * ROWS_PER_RANK * C * S;
    let x = Tensor::from_slice(s, &gx[rows.clone()], &[ROWS_PER_RANK, C, S])?;
    let dy = Tensor::from_slice(s, &gdy[rows.clone()], &[ROWS_PER_RANK, C, S])?;
    let (mut running_mean, mut running_var) =
        (Tensor::zeros(s, ascend::DType::F32, &[C])?, { Tensor::from_slice(s, &[1f32; C], &[C])? });
    let start = Instant::now();
    let (y, saved) =
        sync_batch_norm::forward(comm, s, &x, None, None, Some(&mut running_mean), Some(&mut running_var), 0.1, EPS)?;
    let (dx, _, _) = sync_batch_norm::backward(comm, s, &dy, &saved, None, OutputMask::ALL)?;
    let y: Vec<f32> = y.to_vec(s)?;
    let dx: Vec<f32> = dx.map(|t| t.to_vec(s)).transpose()?.unwrap_or_default();
    let ms = start.elapsed().as_secs_f64() * 1e3;
    let (ry, rdx) = reference(&gx, &gdy, n);
    let err =
        |got: &[f32], exp: &[f64]| got.iter().zip(exp).map(|(g, e)| (f64::from(*g) - e).abs()).fold(0.0, f64::max);
    Ok((err(&y, &ry[rows.clone()]).max(err(&dx, &rdx[rows])), ms))
}

/// Runs the example, exiting with status 1 on an error ([`common::main`]).
fn main() {
    common::main(run);
}

fn run() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let flag = |f: &str| args.iter().position(|a| a == f);
    let n_ranks: usize = flag("--ranks").and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok()).unwrap_or(4);
    let use_mock = flag("--mock").is_some();
    if use_mock && std::env::var_os("ASCEND_MOCK_DEVICE_COUNT").is_none() {
        // The mock reads its device count at aclInit, which has not run yet.
        std::env::set_var("ASCEND_MOCK_DEVICE_COUNT", n_ranks.max(8).to_string());
    }
    let device_context = |device: i32| -> Result<Context> {
        #[cfg(feature = "mock")]
        if use_mock {
            return ascend::mock::context(device);
        }
        let _ = use_mock;
        Context::ascend(device)
    };

    if std::env::var_os("WORLD_SIZE").is_some() || std::env::var_os("RANK_TABLE_FILE").is_some() {
        return launched_rank(&device_context);
    }
    if let Ok(rank) = std::env::var("ASCEND_RANK") {
        // One process per device.
        let rank: u32 = rank.parse().map_err(|_| ascend::Error::Config("ASCEND_RANK must be a number".into()))?;
        let world: u32 = std::env::var("ASCEND_WORLD_SIZE")
            .ok()
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| ascend::Error::Config("set ASCEND_WORLD_SIZE".into()))?;
        let file = std::env::var("ASCEND_ROOT_INFO_FILE")
            .map_err(|_| ascend::Error::Config("set ASCEND_ROOT_INFO_FILE".into()))?;
        let device = std::env::var("ASCEND_DEVICE").ok().and_then(|v| v.parse().ok()).unwrap_or(rank as i32 % 8);
        let ctx = device_context(device)?;
        let root = exchange_root_info(&ctx, rank, Path::new(&file))?;
        let comm = Communicator::init_rank(&ctx, world, &root, rank)?;
        let (err, ms) = rank_step(&comm, &ctx.new_stream()?, world as usize)?;
        println!(
            "rank {rank}/{world} on {:?}: max |error| vs BatchNorm over the global batch = {err:.2e}, step {ms:.2} ms",
            ctx.backend()
        );
        return Ok(());
    }

    // Ranks as threads of this process.
    let ctxs: Vec<Context> = match (0..n_ranks as i32).map(device_context).collect::<Result<Vec<_>>>() {
        Ok(c) => c,
        Err(e) if use_mock => return Err(e),
        Err(_) => vec![Context::cpu(); n_ranks], // no Ascend devices here
    };
    println!("{n_ranks} ranks on {:?}", ctxs[0].backend());
    let comms = Communicator::init_all(&ctxs)?;
    let errors: Vec<Result<(f64, f64)>> = std::thread::scope(|sc| {
        let hs: Vec<_> = comms
            .into_iter()
            .zip(&ctxs)
            .map(|(comm, ctx)| sc.spawn(move || rank_step(&comm, &ctx.new_stream()?, n_ranks)))
            .collect();
        hs.into_iter().map(|h| h.join().expect("rank thread panicked")).collect()
    });
    for (rank, e) in errors.into_iter().enumerate() {
        let (err, ms) = e?;
        println!("rank {rank}: max |error| vs BatchNorm over the global batch = {err:.2e}, step {ms:.2} ms");
    }
    Ok(())
}

/// Rank 0 makes the root info and writes it to `file` (atomically); the others wait for it.
fn exchange_root_info(ctx: &Context, rank: u32, file: &Path) -> Result<RootInfo> {
    let io = |e: std::io::Error| ascend::Error::Config(format!("{}: {e}", file.display()));
    if rank == 0 {
        let root = RootInfo::new(ctx)?;
        let tmp = file.with_extension("tmp");
        std::fs::write(&tmp, root.as_bytes()).map_err(io)?;
        std::fs::rename(&tmp, file).map_err(io)?;
        return Ok(root);
    }
    let start = Instant::now();
    loop {
        if let Ok(bytes) = std::fs::read(file) {
            if bytes.len() == ascend::hccl::ROOT_INFO_BYTES {
                return RootInfo::from_bytes(&bytes);
            }
        }
        if start.elapsed() > Duration::from_secs(120) {
            return Err(ascend::Error::Config(format!("no root info appeared in {}", file.display())));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

// ---- Launched by a cluster launcher (Communicator::from_env) --------------------------------------

/// One rank started by a launcher: the device from `LOCAL_RANK` (torchrun) or `DEVICE_ID`
/// (rank-table scripts), else the rank modulo 8; the communicator from the environment. With
/// `SYNCBN_ABORT_RANK=r`, rank r dies in the middle of the step (after the forward), to show
/// that the other ranks then fail with an error instead of hanging.
fn launched_rank(device_context: &dyn Fn(i32) -> Result<Context>) -> Result<()> {
    let number = |name: &str| std::env::var(name).ok().and_then(|v| v.trim().parse::<i32>().ok());
    let device = number("LOCAL_RANK")
        .or_else(|| number("DEVICE_ID"))
        .or_else(|| number("RANK").or_else(|| number("RANK_ID")).map(|r| r % 8))
        .unwrap_or(0);
    let ctx = device_context(device)?;
    let comm = Communicator::from_env(&ctx)?;
    let (rank, world) = (comm.rank(), comm.size());
    let stream = ctx.new_stream()?;
    if number("SYNCBN_ABORT_RANK") == Some(rank as i32) {
        let x = Tensor::from_slice(&stream, &global(ROWS_PER_RANK, 1), &[ROWS_PER_RANK, C, S])?;
        let _ = sync_batch_norm::forward(&comm, &stream, &x, None, None, None, None, 0.1, EPS)?;
        stream.synchronize()?;
        eprintln!("rank {rank}/{world}: aborting in the middle of the step (SYNCBN_ABORT_RANK)");
        std::process::abort();
    }
    let (err, ms) = rank_step(&comm, &stream, world as usize)?;
    if let Some(e) = comm.async_error()? {
        return Err(e);
    }
    println!(
        "rank {rank}/{world} (device {device}, from_env): max |error| vs BatchNorm over the global batch = {err:.2e}, \
         step {ms:.2} ms"
    );
    if err > 1e-3 {
        return Err(ascend::Error::Config(format!("rank {rank}: error {err:.2e} is above 1e-3")));
    }
    Ok(())
}
