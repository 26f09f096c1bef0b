//! [`BatchNorm`]: `torch.nn.BatchNorm{1,2,3}d` (any rank 2..=8, channels at dim 1) and
//! `torch.nn.SyncBatchNorm` with torch's defaults and semantics.

use crate::error::{Error, Result};
use crate::hccl::Communicator;
use crate::ops::{self, OutputMask};
use crate::stream::Stream;
use crate::sync_batch_norm;
use crate::tensor::Tensor;
use crate::DType;

/// A BatchNorm layer: its parameters, running statistics and settings, as torch's module holds
/// them. Set the public fields as torch's constructor arguments: `weight`/`bias` `None` is
/// `affine=False`, `running_mean`/`running_var` `None` is `track_running_stats=False`,
/// `momentum` `None` is the cumulative moving average (factor `1/num_batches_tracked`).
#[derive(Debug)]
pub struct BatchNorm {
    /// γ, `[C]` (f32 by default; x's dtype also works). `None`: no affine transform.
    pub weight: Option<Tensor>,
    /// β, `[C]`. `None`: no affine transform.
    pub bias: Option<Tensor>,
    /// The running mean, `[C]`, updated in place in training. `None`: not tracked.
    pub running_mean: Option<Tensor>,
    /// The running (unbiased) variance, `[C]`, updated in place in training. `None`: not tracked.
    pub running_var: Option<Tensor>,
    /// Training steps that updated the running statistics.
    pub num_batches_tracked: u64,
    /// The running statistics' update factor; `None`: `1/num_batches_tracked`.
    pub momentum: Option<f64>,
    /// Added to the variance before the square root.
    pub eps: f64,
    /// How [`backward_sync`](Self::backward_sync) sums Σdy·(x − mean) (default `true`: centered).
    ///
    /// CANN's SyncBatchNorm reduction (`aclnnBatchNormReduceBackward`) forms Σdy·x − mean·Σdy,
    /// which cancels when |mean| ≫ std (measured on the mock at x = 1000 + N(0, 1): 15× the error
    /// of torch's f32 CPU BatchNorm on the weight gradient; centered 8×, the rest being the f32
    /// statistics of the forward pass), while its single-device backward and torch's are
    /// centered. With
    /// `true`, x − mean is formed on the device first (one more element-wise launch,
    /// `aclnnBatchNormElemt` with invstd 1 and eps 0, exact for |x − mean| ≤ |mean|, and a
    /// temporary of x's size) and reduced with mean 0: 6 launches a step instead of 5. `false`
    /// runs `sync_batch_norm::backward` as it is. A setting, not an automatic choice: deciding
    /// from |mean|/std would read the statistics on the host, a blocking call in every step.
    pub centered_sync: bool,
    training: bool,
}

/// What a forward pass keeps for its backward pass: the input (borrowed) and the statistics,
/// [`ops::BatchNormSaved`] on one device or SyncBatchNorm's global ones over ranks (opaque: on
/// Atlas A2/A3 CANN saves the batch *variance* where its API says invstd, so the saved statistics
/// go only to the backward pass of the same layer).
#[derive(Debug)]
pub struct BatchNormSaved<'a> {
    input: &'a Tensor,
    kind: Kind<'a>,
}

// A tensor holds its shape and strides in place (no heap allocation per tensor), so the saved
// tensors make this variant large; it lives on the caller's stack for one step.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
enum Kind<'a> {
    /// One device: `aclnnBatchNorm`'s saved statistics (none in eval with running statistics).
    Single(ops::BatchNormSaved),
    /// Over ranks: SyncBatchNorm's global statistics.
    Sync(sync_batch_norm::Saved<'a>),
}

/// The gradients of [`BatchNorm::backward`]: of the input (x's dtype and shape) and, for an affine
/// layer, of the weight and bias (`[C]` f32).
#[derive(Debug)]
pub struct Grads {
    /// ∂L/∂x.
    pub input: Tensor,
    /// ∂L/∂weight (`None` without a weight).
    pub weight: Option<Tensor>,
    /// ∂L/∂bias (`None` without a bias).
    pub bias: Option<Tensor>,
}

impl BatchNorm {
    /// A layer of `num_features` channels on `stream`'s device with torch's defaults: weight 1,
    /// bias 0, running_mean 0, running_var 1 (all `[C]` f32), momentum `Some(0.1)`, eps 1e-5,
    /// in training mode.
    pub fn new(stream: &Stream, num_features: usize) -> Result<Self> {
        if num_features == 0 {
            return Err(Error::invalid("num_features", "must be at least 1"));
        }
        let filled = |v: f32| -> Result<Tensor> {
            let mut data = Vec::new();
            data.try_reserve_exact(num_features)
                .map_err(|_| Error::invalid("num_features", "too large for host memory"))?;
            data.resize(num_features, v);
            Tensor::from_slice(stream, &data, &[num_features])
        };
        Ok(BatchNorm {
            weight: Some(filled(1.0)?),
            bias: Some(filled(0.0)?),
            running_mean: Some(filled(0.0)?),
            running_var: Some(filled(1.0)?),
            num_batches_tracked: 0,
            momentum: Some(0.1),
            eps: 1e-5,
            centered_sync: true,
            training: true,
        })
    }

    /// Training mode: batch statistics, running statistics updated.
    pub fn train(&mut self) {
        self.training = true;
    }

    /// Eval mode: the running statistics (batch statistics when there are none); no state changes.
    pub fn eval(&mut self) {
        self.training = false;
    }

    /// Whether the layer is in training mode.
    pub fn is_training(&self) -> bool {
        self.training
    }

    /// Whether a forward pass uses batch statistics (torch's `bn_training`).
    fn batch_stats(&self) -> bool {
        self.training || (self.running_mean.is_none() && self.running_var.is_none())
    }

    /// Whether a forward pass updates the running statistics.
    fn updates_running(&self) -> bool {
        self.training && self.running_mean.is_some()
    }

    /// The update factor of this step and the counter after it (torch's rule).
    fn factor(&self) -> Result<(f64, u64)> {
        if !self.updates_running() {
            return Ok((0.0, self.num_batches_tracked));
        }
        let n = self
            .num_batches_tracked
            .checked_add(1)
            .ok_or_else(|| Error::invalid("num_batches_tracked", "overflows u64"))?;
        Ok((self.momentum.unwrap_or(1.0 / n as f64), n))
    }

    /// The layer's own rules before any call: the running statistics both or neither (as
    /// torch's module holds them), and torch's check that batch statistics need more than one
    /// value per channel.
    fn check_batch(&self, x: &Tensor, ranks: usize) -> Result<()> {
        if self.running_mean.is_some() != self.running_var.is_some() {
            let (given, missing) = if self.running_mean.is_some() {
                ("running_mean", "running_var")
            } else {
                ("running_var", "running_mean")
            };
            return Err(Error::invalid(missing, format!("{given} is set without {missing}: set both or neither")));
        }
        let shape = x.shape();
        if self.batch_stats() && shape.len() >= 2 && shape[1] > 0 && ranks == 1 && x.numel() / shape[1] == 1 {
            return Err(Error::invalid(
                "input",
                format!("expected more than 1 value per channel when training, got shape {shape:?}"),
            ));
        }
        Ok(())
    }

    /// The forward pass on one device (`aclnnBatchNorm`): `y` has x's shape and dtype. In training
    /// the running statistics are updated in place (unbiased variance) and `num_batches_tracked`
    /// incremented; in eval nothing changes. A rejected call changes no field.
    pub fn forward<'a>(&mut self, stream: &Stream, x: &'a Tensor) -> Result<(Tensor, BatchNormSaved<'a>)> {
        self.check_batch(x, 1)?;
        let (factor, counter) = self.factor()?;
        let batch = self.batch_stats();
        let (rm, rv) = if batch && !self.updates_running() {
            (None, None)
        } else {
            (self.running_mean.as_mut(), self.running_var.as_mut())
        };
        let (y, saved) =
            ops::batch_norm(stream, x, self.weight.as_ref(), self.bias.as_ref(), rm, rv, batch, factor, self.eps)?;
        self.num_batches_tracked = counter;
        Ok((y, BatchNormSaved { input: x, kind: Kind::Single(saved) }))
    }

    /// The backward pass on one device (`aclnnBatchNormBackward`) of the forward pass that gave
    /// `saved`; `dy` has x's shape and dtype.
    pub fn backward(&self, stream: &Stream, dy: &Tensor, saved: &BatchNormSaved<'_>) -> Result<Grads> {
        let Kind::Single(stats) = &saved.kind else {
            return Err(Error::invalid("saved", "comes from forward_sync: pass it to backward_sync"));
        };
        let training = stats.channels().is_some();
        let mask = OutputMask { input_g: true, weight_g: self.weight.is_some(), bias_g: self.bias.is_some() };
        let (rm, rv) = if training { (None, None) } else { (self.running_mean.as_ref(), self.running_var.as_ref()) };
        let g = ops::batch_norm_backward(
            stream,
            dy,
            saved.input,
            self.weight.as_ref(),
            rm,
            rv,
            stats,
            training,
            self.eps,
            mask,
        )?;
        grads(g.grad_input, g.grad_weight, g.grad_bias)
    }

    /// SyncBatchNorm's forward pass over `comm`'s ranks (today's `sync_batch_norm` chain: one
    /// all-gather); with one rank, or in eval (even without running statistics, as torch's
    /// SyncBatchNorm), exactly [`forward`](Self::forward), no collective.
    pub fn forward_sync<'a>(
        &mut self,
        comm: &Communicator,
        stream: &Stream,
        x: &'a Tensor,
    ) -> Result<(Tensor, BatchNormSaved<'a>)> {
        // torch's SyncBatchNorm syncs only in training (`need_sync = bn_training and
        // self.training`): in eval, even without running statistics, each rank normalises locally.
        if comm.size() < 2 || !self.training {
            return self.forward(stream, x);
        }
        self.check_batch(x, comm.size() as usize)?;
        let (factor, counter) = self.factor()?;
        let (rm, rv) =
            if self.updates_running() { (self.running_mean.as_mut(), self.running_var.as_mut()) } else { (None, None) };
        let (y, saved) = sync_batch_norm::forward(
            comm,
            stream,
            x,
            self.weight.as_ref(),
            self.bias.as_ref(),
            rm,
            rv,
            factor,
            self.eps,
        )?;
        self.num_batches_tracked = counter;
        Ok((y, BatchNormSaved { input: x, kind: Kind::Sync(saved) }))
    }

    /// SyncBatchNorm's backward pass (one all-reduce; centered unless
    /// [`centered_sync`](Self::centered_sync) is off) of the forward pass that gave `saved`; a
    /// single-device `saved` (one rank, or eval) runs [`backward`](Self::backward). The weight and
    /// bias gradients are this rank's share, as data-parallel training sums them.
    pub fn backward_sync(
        &self,
        comm: &Communicator,
        stream: &Stream,
        dy: &Tensor,
        saved: &BatchNormSaved<'_>,
    ) -> Result<Grads> {
        let Kind::Sync(s) = &saved.kind else {
            return self.backward(stream, dy, saved);
        };
        let mask = OutputMask { input_g: true, weight_g: self.weight.is_some(), bias_g: self.bias.is_some() };
        let backward = if self.centered_sync { sync_batch_norm::backward_centered } else { sync_batch_norm::backward };
        let (gi, gw, gb) = backward(comm, stream, dy, s, self.weight.as_ref(), mask)?;
        let to_f32 = |t: Option<Tensor>| -> Result<Option<Tensor>> {
            match t {
                Some(t) if t.dtype() != DType::F32 => {
                    let v = t.to_vec::<f32>(stream)?;
                    Tensor::from_slice(stream, &v, t.shape()).map(Some)
                }
                t => Ok(t),
            }
        };
        grads(gi, to_f32(gw)?, to_f32(gb)?)
    }
}

fn grads(input: Option<Tensor>, weight: Option<Tensor>, bias: Option<Tensor>) -> Result<Grads> {
    let input = input.ok_or_else(|| Error::internal("the backward pass returned no input gradient"))?;
    Ok(Grads { input, weight, bias })
}
