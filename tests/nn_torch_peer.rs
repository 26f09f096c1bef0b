//! `nn::BatchNorm` against PyTorch's own `torch.nn.BatchNorm2d` (forward, backward, running
//! statistics, the counter, eval), on both backends, for torch's settings: momentum 0.1 and
//! `None` (cumulative average), `affine=False`, `track_running_stats=False`. Optional: runs when
//! `TORCH_PYTHON` names a Python with torch and numpy (as `benches/torch_peer.py` does), and
//! says so and passes otherwise. Tolerances as the f64 tests: 1e-5 forward, 1e-4 backward,
//! relative to the largest magnitude.

mod common;

use std::process::Command;

use ascend::nn::BatchNorm;
use ascend::Tensor;
use common::{assert_scaled, backends, Rng};

const SHAPE: [usize; 4] = [4, 3, 5, 6];
const STEPS: usize = 3;

/// Runs torch on the steps' inputs; returns, per step, y, dx and (affine) dw, db; then the running
/// mean and var (tracked), the counter, and the eval output of `eval_x`.
const SCRIPT: &str = r#"
import sys, numpy as np, torch
path, momentum, affine, track = sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4] == "1"
shape = [int(v) for v in sys.argv[5].split(",")]
steps = int(sys.argv[6])
n = int(np.prod(shape))
data = np.fromfile(path, dtype=np.float32)
bn = torch.nn.BatchNorm2d(shape[1], momentum=None if momentum == "none" else float(momentum),
                          affine=affine, track_running_stats=track).double()
out = []
for s in range(steps):
    x = torch.tensor(data[2 * s * n:(2 * s + 1) * n].astype(np.float64).reshape(shape), requires_grad=True)
    dy = torch.tensor(data[(2 * s + 1) * n:(2 * s + 2) * n].astype(np.float64).reshape(shape))
    bn.train()
    y = bn(x)
    y.backward(dy)
    out += [y.detach().numpy().ravel(), x.grad.numpy().ravel()]
    if affine:
        out += [bn.weight.grad.numpy().ravel(), bn.bias.grad.numpy().ravel()]
        bn.weight.grad = None
        bn.bias.grad = None
if track:
    out += [bn.running_mean.numpy().ravel(), bn.running_var.numpy().ravel(), np.array([float(bn.num_batches_tracked)])]
bn.eval()
x = torch.tensor(data[2 * steps * n:(2 * steps + 1) * n].astype(np.float64).reshape(shape))
out += [bn(x).detach().numpy().ravel()]
np.concatenate(out).astype(np.float64).tofile(path + ".out")
"#;

fn torch(python: &str, data: &[f32], momentum: Option<f64>, affine: bool, track: bool) -> Vec<f64> {
    let dir = std::env::temp_dir().join(format!("ascend-torch-peer-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("in-{momentum:?}-{affine}-{track}.f32"));
    let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(&path, bytes).unwrap();
    let shape = SHAPE.map(|d| d.to_string()).join(",");
    let momentum = momentum.map_or("none".to_string(), |m| m.to_string());
    let status = Command::new(python)
        .args(["-c", SCRIPT, path.to_str().unwrap(), &momentum])
        .args([if affine { "1" } else { "0" }, if track { "1" } else { "0" }, &shape, &STEPS.to_string()])
        .status()
        .expect("TORCH_PYTHON runs");
    assert!(status.success(), "the torch script failed");
    let out = std::fs::read(path.with_extension("f32.out")).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    out.chunks_exact(8).map(|b| f64::from_le_bytes(b.try_into().unwrap())).collect()
}

#[test]
fn matches_torch_batch_norm_2d() {
    let Ok(python) = std::env::var("TORCH_PYTHON") else {
        println!("TORCH_PYTHON is not set: the PyTorch peer check did not run");
        return;
    };
    let n: usize = SHAPE.iter().product();
    let c = SHAPE[1];
    let mut rng = Rng::new(3);
    let data: Vec<f32> = (0..(2 * STEPS + 1) * n).map(|i| (rng.normal() * 1.5 + (i % 7) as f64 * 0.1) as f32).collect();
    let f64s = |s: &ascend::Stream, t: &Tensor| -> Vec<f64> {
        t.to_vec::<f32>(s).unwrap().into_iter().map(f64::from).collect()
    };
    for (momentum, affine, track) in
        [(Some(0.1), true, true), (None, true, true), (Some(0.1), false, true), (Some(0.1), true, false)]
    {
        let want = torch(&python, &data, momentum, affine, track);
        for ctx in backends() {
            let what = format!("{:?} momentum {momentum:?} affine {affine} track {track}", ctx.backend());
            let s = ctx.new_stream().unwrap();
            let mut bn = BatchNorm::new(&s, c).unwrap();
            bn.momentum = momentum;
            if !affine {
                (bn.weight, bn.bias) = (None, None);
            }
            if !track {
                (bn.running_mean, bn.running_var) = (None, None);
            }
            let mut at = 0;
            let mut take = |len: usize| {
                at += len;
                &want[at - len..at]
            };
            for step in 0..STEPS {
                let x = Tensor::from_slice(&s, &data[2 * step * n..(2 * step + 1) * n], &SHAPE).unwrap();
                let dy = Tensor::from_slice(&s, &data[(2 * step + 1) * n..(2 * step + 2) * n], &SHAPE).unwrap();
                let (y, saved) = bn.forward(&s, &x).unwrap();
                let g = bn.backward(&s, &dy, &saved).unwrap();
                assert_scaled(&format!("{what} step {step} y"), &f64s(&s, &y), take(n), 1e-5);
                assert_scaled(&format!("{what} step {step} dx"), &f64s(&s, &g.input), take(n), 1e-4);
                if affine {
                    assert_scaled(
                        &format!("{what} step {step} dw"),
                        &f64s(&s, g.weight.as_ref().unwrap()),
                        take(c),
                        1e-4,
                    );
                    assert_scaled(
                        &format!("{what} step {step} db"),
                        &f64s(&s, g.bias.as_ref().unwrap()),
                        take(c),
                        1e-4,
                    );
                }
            }
            if track {
                assert_scaled(
                    &format!("{what} running_mean"),
                    &f64s(&s, bn.running_mean.as_ref().unwrap()),
                    take(c),
                    1e-5,
                );
                assert_scaled(
                    &format!("{what} running_var"),
                    &f64s(&s, bn.running_var.as_ref().unwrap()),
                    take(c),
                    1e-5,
                );
                assert_eq!(bn.num_batches_tracked as f64, take(1)[0], "{what}");
            }
            bn.eval();
            let x = Tensor::from_slice(&s, &data[2 * STEPS * n..], &SHAPE).unwrap();
            let (y, _) = bn.forward(&s, &x).unwrap();
            assert_scaled(&format!("{what} eval y"), &f64s(&s, &y), take(n), 1e-5);
            println!("{what}: matches torch.nn.BatchNorm2d");
        }
    }
}

/// Errors are measured against torch in f64 (max |got − want| over max |want|).
fn worst(got: &[f64], want: &[f64]) -> f64 {
    let scale = want.iter().fold(1e-30f64, |a, v| a.max(v.abs()));
    got.iter().zip(want).fold(0.0f64, |a, (g, w)| a.max((g - w).abs() / scale))
}

/// Torch's BatchNorm2d backward over the global batch, in f64 and in f32: (dx, dw) each.
const ACCURACY_SCRIPT: &str = r#"
import sys, numpy as np, torch
path, shape = sys.argv[1], [int(v) for v in sys.argv[2].split(",")]
n = int(np.prod(shape))
data = np.fromfile(path, dtype=np.float32)
out = []
for dtype in (torch.float64, torch.float32):
    bn = torch.nn.BatchNorm2d(shape[1]).to(dtype)
    x = torch.tensor(data[:n].reshape(shape), dtype=dtype, requires_grad=True)
    dy = torch.tensor(data[n:].reshape(shape), dtype=dtype)
    bn(x).backward(dy)
    out += [x.grad.double().numpy().ravel(), bn.weight.grad.double().numpy().ravel()]
np.concatenate(out).tofile(path + ".out")
"#;

/// The sync backward's accuracy at x = 1000 + N(0, 1) over 2 ranks next to torch's own f32
/// BatchNorm2d on the CPU on the global batch (which accumulates its statistics in f64), all
/// against torch in f64: printed, with ratios to torch's f32 error. The centered form (the
/// default) is at least as accurate as the uncentered one, and within 10× torch's f32 error.
#[test]
fn sync_accuracy_next_to_torch_f32() {
    let Ok(python) = std::env::var("TORCH_PYTHON") else {
        println!("TORCH_PYTHON is not set: the PyTorch accuracy comparison did not run");
        return;
    };
    let (rows, c, hw) = (64usize, 2usize, [4usize, 2]);
    let local = [rows, c, hw[0], hw[1]];
    let global = [2 * rows, c, hw[0], hw[1]];
    let n: usize = local.iter().product();
    let mut rng = Rng::new(77);
    let x: Vec<f32> = (0..2 * n).map(|_| (1000.0 + rng.normal()) as f32).collect();
    let dy: Vec<f32> = rng.vec_f32(2 * n, -1.0, 1.0);
    let dir = std::env::temp_dir().join(format!("ascend-torch-accuracy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("data.f32");
    let bytes: Vec<u8> = x.iter().chain(&dy).flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(&path, bytes).unwrap();
    let shape = global.map(|d| d.to_string()).join(",");
    let status = Command::new(&python).args(["-c", ACCURACY_SCRIPT, path.to_str().unwrap(), &shape]).status();
    assert!(status.expect("TORCH_PYTHON runs").success(), "the torch script failed");
    let out: Vec<f64> = std::fs::read(path.with_extension("f32.out"))
        .unwrap()
        .chunks_exact(8)
        .map(|b| f64::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    let (want_dx, rest) = out.split_at(2 * n);
    let (want_dw, rest) = rest.split_at(c);
    let (torch_dx, torch_dw) = rest.split_at(2 * n);
    let (torch_ex, torch_ew) = (worst(torch_dx, want_dx), worst(torch_dw, want_dw));
    println!("torch f32 BatchNorm2d: grad_weight error {torch_ew:.2e}, grad_input error {torch_ex:.2e}");
    #[allow(unused_mut)]
    let mut contexts = vec![vec![ascend::Context::cpu(); 2]];
    #[cfg(feature = "mock")]
    {
        ascend::mock::set_device_count(2).unwrap();
        contexts.push((0..2).map(|d| ascend::mock::context(d).unwrap()).collect());
    }
    let mut errors = Vec::new();
    for ctxs in contexts {
        for centered in [true, false] {
            let comms = ascend::hccl::Communicator::init_all(&ctxs).unwrap();
            let per_rank = common::on_ranks(comms, &ctxs, |r, comm, ctx| {
                let s = ctx.new_stream().unwrap();
                let r = r as usize;
                let xt = Tensor::from_slice(&s, &x[r * n..(r + 1) * n], &local).unwrap();
                let dyt = Tensor::from_slice(&s, &dy[r * n..(r + 1) * n], &local).unwrap();
                let mut bn = BatchNorm::new(&s, c).unwrap();
                bn.centered_sync = centered;
                let (_, saved) = bn.forward_sync(comm, &s, &xt).unwrap();
                let g = bn.backward_sync(comm, &s, &dyt, &saved).unwrap();
                let f = |t: &Tensor| -> Vec<f64> { t.to_vec::<f32>(&s).unwrap().into_iter().map(f64::from).collect() };
                (f(&g.input), f(g.weight.as_ref().unwrap()))
            });
            let dx: Vec<f64> = per_rank.iter().flat_map(|(d, _)| d.clone()).collect();
            let dw: Vec<f64> = (0..c).map(|k| per_rank.iter().map(|(_, w)| w[k]).sum()).collect();
            let (ex, ew) = (worst(&dx, want_dx), worst(&dw, want_dw));
            println!(
                "{:?} centered_sync {centered}: grad_weight error {ew:.2e} ({:.1}× torch f32), grad_input error {ex:.2e} \
                 ({:.1}× torch f32)",
                ctxs[0].backend(),
                ew / torch_ew,
                ex / torch_ex
            );
            errors.push((ctxs[0].backend(), centered, ew, ex));
        }
    }
    // On each backend the centered form is at least as accurate as the uncentered one, and within
    // 10× torch's f32 error: what remains on the mock is the forward's statistics, summed in f32
    // as CANN's kernels do (a mean of 1000 carries an error of ~1e-4, times Σdy), which centering
    // the backward cannot remove.
    for pair in errors.chunks(2) {
        let [(backend, _, ew_c, ex_c), (_, _, ew_u, ex_u)] = [pair[0], pair[1]];
        assert!(ew_c <= ew_u && ex_c <= ex_u, "{backend:?}: centered {ew_c:e}, {ex_c:e}; not {ew_u:e}, {ex_u:e}");
        assert!(ew_c <= 10.0 * torch_ew && ex_c <= 10.0 * torch_ex, "{backend:?}: centered {ew_c:e}, {ex_c:e}");
    }
}
