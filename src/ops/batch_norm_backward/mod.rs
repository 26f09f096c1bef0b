//! `aclnnBatchNormBackward` on both backends: BatchNorm's backward pass on one device, from the
//! statistics [`batch_norm`](super::batch_norm) saved (training) or the running statistics (eval).
//!
//! The public docs are on [`batch_norm_backward`].

mod cpu;

use ascend_sys::{aclnnStatus, symbols, OpApi};

use super::batch_norm::BatchNormSaved;
use super::call::{check_streams, entry_points, run_checked};
use super::launch::Phase2;
use super::operator::{Arg, Handles, Operator, ScalarBits};
use super::prepared::Prepared;
use super::validate;
use super::OutputMask;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::stream::Stream;
use crate::tensor::Tensor;

/// The gradients of [`batch_norm_backward`], each `Some` exactly when the mask asked for it:
/// `grad_input` in the input's shape and dtype, `grad_weight` and `grad_bias` `[C]` f32
/// (torch_npu's rule).
#[derive(Debug, Default)]
pub struct BatchNormGrads {
    /// The gradient of the input (`input_g`).
    pub grad_input: Option<Tensor>,
    /// The gradient of the weight (`weight_g`).
    pub grad_weight: Option<Tensor>,
    /// The gradient of the bias (`bias_g`).
    pub grad_bias: Option<Tensor>,
}

/// Caller-owned outputs for [`batch_norm_backward_into`]; those the mask turns on are required,
/// the others are ignored and left untouched.
#[derive(Debug, Default)]
pub struct BatchNormGradsOut<'a> {
    /// Receives the input gradient (input's shape and dtype).
    pub grad_input: Option<&'a mut Tensor>,
    /// Receives the weight gradient (`[C]`, f32/f16/bf16).
    pub grad_weight: Option<&'a mut Tensor>,
    /// Receives the bias gradient (`[C]`, f32/f16/bf16).
    pub grad_bias: Option<&'a mut Tensor>,
}

impl<'a> BatchNormGradsOut<'a> {
    fn enabled(self, mask: OutputMask) -> [Option<&'a mut Tensor>; 3] {
        [
            self.grad_input.filter(|_| mask.input_g),
            self.grad_weight.filter(|_| mask.weight_g),
            self.grad_bias.filter(|_| mask.bias_g),
        ]
    }
}

/// Phase 1's scalars: `training`, eps, the mask.
#[derive(Clone, Copy, Debug)]
struct Scalars {
    training: bool,
    eps: f64,
    mask: OutputMask,
}

impl ScalarBits for Scalars {
    fn bits(&self) -> [u64; 4] {
        [u64::from(self.training), self.eps.to_bits(), self.mask.bits()[0], 0]
    }
}

entry_points! {
    /// BatchNorm's backward pass (`aclnnBatchNormBackward`) into new tensors.
    ///
    /// Per channel `c` of `input` `x` and `grad_out` `dy`, shape `(N, C, ...)`, `n` elements per
    /// channel, with `m, v` the saved batch mean and variance (`training`) or `running_mean`,
    /// `running_var` (eval; absent: 0 and 1), `r = 1/sqrt(v + eps)` and `x̂ = (x − m)·r`:
    /// `grad_weight = Σ dy·x̂` (centered: summed from `x − m` per element), `grad_bias = Σ dy`,
    /// and `grad_input = weight·r·(dy − grad_bias/n − x̂·grad_weight/n)` in training,
    /// `dy·weight·r` in eval (absent weight: 1).
    ///
    /// * `saved`: what [`batch_norm`](super::batch_norm) returned for this input (the only way to
    ///   pass the saved statistics: see [`BatchNormSaved`]); in training it must hold statistics of
    ///   the input's C. `training` and `eps` must be the forward's.
    /// * `grad_out` and `input`: the same shape (2..=8 dims, C ≠ 0) and dtype (f32/f16/bf16), any
    ///   strides. An empty input succeeds with zero weight and bias gradients.
    /// * `weight`, `running_mean`, `running_var`: `[C]`, any stride and float dtype.
    ///
    /// Errors: [`Error::InvalidArgument`] (161002) on both backends; a rejected call writes
    /// nothing.
    ///
    /// # Numerics
    /// Ascend: CANN's BNTrainingUpdateGrad/BNTrainingReduceGrad (BNInferGrad in eval), in f32,
    /// centered. The mock computes the same in f32. CPU: the sums of
    /// [`batch_norm_reduce_backward`](super::batch_norm_reduce_backward) (Σdy·(x − m) directly,
    /// f64-accurate), and grad_input per element in f64 as
    /// [`batch_norm_elemt_backward`](super::batch_norm_elemt_backward) computes it.
    #[allow(clippy::too_many_arguments)]
    pub fn batch_norm_backward(
        stream: &Stream,
        grad_out: &Tensor,
        input: &Tensor,
        weight: Option<&Tensor>,
        running_mean: Option<&Tensor>,
        running_var: Option<&Tensor>,
        saved: &BatchNormSaved,
        training: bool,
        eps: f64,
        mask: OutputMask,
    ) -> Result<BatchNormGrads> {
        let op = Args { grad_out, input, weight, running_mean, running_var, saved, training, eps, mask };
        let plan = op.check_inputs()?;
        check_streams(stream, op.inputs())?;
        let mut gi = mask.input_g.then(|| super::batch_norm::output_like(stream, input)).transpose()?;
        let mut gw = mask.weight_g.then(|| Tensor::alloc(stream, DType::F32, &[plan.channels], false)).transpose()?;
        let mut gb = mask.bias_g.then(|| Tensor::alloc(stream, DType::F32, &[plan.channels], false)).transpose()?;
        run_checked(stream, op, plan, [gi.as_mut(), gw.as_mut(), gb.as_mut()])?;
        Ok(BatchNormGrads { grad_input: gi, grad_weight: gw, grad_bias: gb })
    }

    /// [`batch_norm_backward`] into caller-owned outputs: `grad_input` of the input's shape and
    /// dtype, `grad_weight`/`grad_bias` `[C]` of any float dtype; any strides that do not overlap
    /// themselves.
    ///
    /// On Ascend this is `aclnnBatchNormBackwardGetWorkspaceSize` (with the mask as an
    /// `aclBoolArray`) followed by `aclnnBatchNormBackward` on `stream`.
    #[allow(clippy::too_many_arguments)]
    pub fn batch_norm_backward_into(.., out: BatchNormGradsOut<'_>) => (
        Args { grad_out, input, weight, running_mean, running_var, saved, training, eps, mask },
        out.enabled(mask),
    );

    /// Phase 1 of the two-phase API of [`batch_norm_backward_into`]; the result borrows every
    /// tensor until it is launched ([`Prepared::launch`]) or dropped (which writes nothing).
    #[allow(clippy::too_many_arguments)]
    pub fn prepare_batch_norm_backward(.., ..) -> Prepared;
}

/// What validation established.
#[derive(Clone, Copy, Debug)]
struct Plan {
    channels: usize,
    empty: bool,
}

/// The arguments of a call but its outputs.
struct Args<'a> {
    grad_out: &'a Tensor,
    input: &'a Tensor,
    weight: Option<&'a Tensor>,
    running_mean: Option<&'a Tensor>,
    running_var: Option<&'a Tensor>,
    saved: &'a BatchNormSaved,
    training: bool,
    eps: f64,
    mask: OutputMask,
}

impl<'a> Args<'a> {
    /// The saved statistics the call reads: both in training, none in eval.
    fn save(&self) -> [Option<&'a Tensor>; 2] {
        match (&self.saved.stats, self.training) {
            (Some([m, v]), true) => [Some(m), Some(v)],
            _ => [None, None],
        }
    }

    /// Validates the inputs in CANN's order (dtypes, then shapes), then what CANN does not check.
    fn check_inputs(&self) -> Result<Plan> {
        validate::float_dtype("gradOut", self.grad_out.dtype())?;
        validate::float_dtype("input", self.input.dtype())?;
        if self.grad_out.dtype() != self.input.dtype() {
            return Err(Error::invalid(
                "gradOut",
                format!("dtype must equal input's ({}), got {}", self.input.dtype(), self.grad_out.dtype()),
            ));
        }
        let [sm, sv] = self.save();
        let per_channel = [
            (self.weight, "weight"),
            (self.running_mean, "runningMean"),
            (self.running_var, "runningVar"),
            (sm, "saveMean"),
            (sv, "saveInvstd"),
        ];
        for (t, name) in per_channel {
            if let Some(t) = t {
                validate::float_dtype(name, t.dtype())?;
            }
        }
        let x = self.input.layout();
        let c = validate::activation("input", &x)?;
        validate::same_shape("gradOut", &self.grad_out.layout(), "input", self.input.shape())?;
        if self.training && sm.is_none() {
            return Err(Error::invalid(
                "saved",
                "holds no statistics (an eval-mode forward saves none): a training backward needs those of a training \
                 forward",
            ));
        }
        for (t, name) in per_channel {
            if let Some(t) = t {
                validate::per_channel(name, &t.layout(), c)?;
            }
        }
        let n = validate::in_storage("input", &x)?;
        validate::in_storage("gradOut", &self.grad_out.layout())?;
        validate::f32_scalar("eps", self.eps)?;
        Ok(Plan { channels: c, empty: n == 0 })
    }
}

impl<'a> Operator<'a> for Args<'a> {
    const OP: &'static symbols::Operator = &symbols::BATCH_NORM_BACKWARD;
    const OUTPUTS: &'static [&'static str] = &["gradInput", "gradWeight", "gradBias"];
    /// Those the mask turns off are `None`.
    type Outputs = [Option<&'a mut Tensor>; 3];
    type Plan = Plan;
    type Scalars = Scalars;

    fn inputs(&self) -> impl IntoIterator<Item = Arg<'a>> {
        let [sm, sv] = self.save();
        [
            (Some(self.grad_out), "gradOut"),
            (Some(self.input), "input"),
            (self.weight, "weight"),
            (self.running_mean, "runningMean"),
            (self.running_var, "runningVar"),
            (sm, "saveMean"),
            (sv, "saveInvstd"),
        ]
    }

    fn check(&self, [gi, gw, gb]: &Self::Outputs) -> Result<Plan> {
        let on = [self.mask.input_g, self.mask.weight_g, self.mask.bias_g];
        for ((t, name), on) in [gi, gw, gb].into_iter().zip(Self::OUTPUTS).zip(on) {
            if on && t.is_none() {
                return Err(Error::null(name, "the mask turns this output on: it must be given"));
            }
        }
        let plan = self.check_inputs()?;
        if let Some(g) = gi {
            validate::like_input("gradInput", &g.layout(), "input", &self.input.layout())?;
        }
        for (t, name) in [(gw, "gradWeight"), (gb, "gradBias")] {
            if let Some(t) = t {
                validate::float_dtype(name, t.dtype())?;
                validate::per_channel_output(name, &t.layout(), plan.channels)?;
            }
        }
        Ok(plan)
    }

    fn scalars(&self) -> Scalars {
        Scalars { training: self.training, eps: self.eps, mask: self.mask }
    }

    fn cpu(self, plan: Plan, outs: Self::Outputs) -> Result<()> {
        cpu::run(&self, plan, outs)
    }

    unsafe fn phase1(api: &OpApi, s: Scalars, h: Handles<'_>) -> Result<aclnnStatus> {
        let f = crate::acl::op_fn(&api.aclnnBatchNormBackwardGetWorkspaceSize, Self::OP.phase1)?;
        let Some(cann) = h.cann else {
            return Err(Error::internal("aclnnBatchNormBackward's phase 1 needs the toolkit for its outputMask"));
        };
        let [grad_out, input, weight, rm, rv, sm, sv] = [0, 1, 2, 3, 4, 5, 6].map(|i| h.input(i).cast_const());
        let [gi, gw, gb] = [0, 1, 2].map(|i| h.output(i));
        let mask = [s.mask.input_g, s.mask.weight_g, s.mask.bias_g];
        // SAFETY: `mask` is live for the call and its length is passed; nnopbase copies it.
        let array = unsafe { cann.nnopbase.aclCreateBoolArray(mask.as_ptr(), mask.len() as u64) };
        if array.is_null() {
            crate::acl::check(cann, "aclCreateBoolArray", ascend_sys::status::ACLNN_ERR_INNER_NULLPTR)?;
        }
        // SAFETY: the signature is the header's (wrapper.h, ops-nn's aclnn_batch_norm_backward.h);
        // the handles are the call's live descriptors in the prototype's order (null where absent,
        // as CANN allows: it fills them), `array` is a live bool array of 3, and the out-pointers
        // are valid (this function's contract).
        let status = unsafe {
            f(grad_out, input, weight, rm, rv, sm, sv, s.training, s.eps, array, gi, gw, gb, h.size, h.executor)
        };
        // ops-nn reads outputMask in phase 1 only (CheckMaskNotNull and the choice of outputs,
        // aclnn_batch_norm_backward.cpp); the executor does not keep it, so it is destroyed now.
        // SAFETY: `array` is live and used by nothing after this call.
        let destroyed = unsafe { cann.nnopbase.aclDestroyBoolArray(array) };
        if let Err(e) = crate::acl::check(cann, "aclDestroyBoolArray", destroyed) {
            // A leaked 3-byte array, reported; failing here would leak the executor phase 1 made.
            crate::device::report(format_args!("aclDestroyBoolArray failed after phase 1 (the mask array leaks): {e}"));
        }
        Ok(status)
    }

    fn phase2(api: &OpApi) -> &std::result::Result<Phase2, libloading::Error> {
        &api.aclnnBatchNormBackward
    }

    /// CANN's empty-input branch writes nothing: the launch fills the gradients with zeros.
    fn zero_after_launch(plan: &Plan) -> bool {
        plan.empty
    }
}
