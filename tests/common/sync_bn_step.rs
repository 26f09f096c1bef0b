//! One rank's SyncBatchNorm training step (forward with running statistics, then backward with
//! every gradient), shared by `tests/capture.rs` (a replay of it equals the eager step bit for
//! bit) and `benches/capture_step.rs` (the runtime calls of the eager step and of a replay), so
//! that the step the test proves is the step the bench counts. Included with `#[path]`.

use ascend::hccl::Communicator;
use ascend::ops::OutputMask;
use ascend::{sync_batch_norm, Result, Stream, Tensor};

pub const EPS: f64 = 1e-5;
pub const MOMENTUM: f64 = 0.1;

/// One rank's tensors: input, output gradient, weight, bias, running mean and variance (updated
/// in place by each step).
pub struct Step {
    pub x: Tensor,
    pub dy: Tensor,
    pub w: Tensor,
    pub b: Tensor,
    pub rm: Tensor,
    pub rv: Tensor,
}

impl Step {
    /// Forward and backward on `s`: y, dx, dw, db.
    pub fn run(&mut self, comm: &Communicator, s: &Stream) -> Result<[Tensor; 4]> {
        let (y, saved) = sync_batch_norm::forward(
            comm,
            s,
            &self.x,
            Some(&self.w),
            Some(&self.b),
            Some(&mut self.rm),
            Some(&mut self.rv),
            MOMENTUM,
            EPS,
        )?;
        let (dx, dw, db) = sync_batch_norm::backward(comm, s, &self.dy, &saved, Some(&self.w), OutputMask::ALL)?;
        let missing = || ascend::Error::Config("a gradient of OutputMask::ALL is missing".into());
        Ok([y, dx.ok_or_else(missing)?, dw.ok_or_else(missing)?, db.ok_or_else(missing)?])
    }
}
