//! `aclnnBatchNormElemt` on both backends: BatchNorm's normalisation with given statistics,
//! the last step of SyncBatchNorm's forward pass.
//!
//! The public docs are on [`batch_norm_elemt`].

pub(in crate::ops) mod cpu;

use ascend_sys::{aclnnStatus, symbols, OpApi};

use super::call::{entry_points, run_into_new_like};
use super::launch::Phase2;
use super::operator::{Arg, Handles, Operator};
use super::prepared::Prepared;
use super::validate;
use crate::error::Result;
use crate::layout::Layout;
use crate::stream::Stream;
use crate::tensor::Tensor;

entry_points! {
    /// Normalises `input` with the given per-channel statistics into a new tensor of `input`'s shape
    /// and dtype.
    ///
    /// Per element of channel `c` (dim 1) of `input` `x`, shape `(N, C, ...)`:
    /// `output = (x − mean[c])·|invstd[c]|·weight[c] + bias[c]`; `weight` defaults to 1 and `bias` to
    /// 0 (invstd is positive for real statistics; see Numerics for why the magnitude).
    ///
    /// # Arguments
    /// * `input` and `output`: 2 to 8 dims, the same shape, `C = shape[1] ≠ 0`; any strides (the
    ///   output must not overlap itself). An empty input (some dim 0) computes nothing and succeeds.
    /// * `weight`, `bias`, `mean`, `invstd`: shape `[C]`, any stride.
    /// * dtypes: each of `input`, `weight`, `bias`, `mean`, `invstd` is f32, f16 or bf16 on its own
    ///   (CANN checks each tensor's dtype separately on Atlas A2/A3, so bf16/f16 activations with f32
    ///   statistics, which is what torch passes, are accepted); `output` must have `input`'s dtype
    ///   (op-plugin's rule; whether CANN computes a differing output dtype correctly is unconfirmed).
    ///   Whether CANN computes mixed dtypes correctly on hardware is **unconfirmed**: both backends
    ///   here widen every tensor to f32 and round the result once into the output dtype.
    /// * `eps` is used only by CANN's implementation (see below); it must be finite in f32.
    ///
    /// Errors have aclnn's status 161002 (`ACLNN_ERR_PARAM_INVALID`) on both backends; a rejected
    /// call writes nothing. (CANN returns 161002, not 161001, for a null input, mean, invstd or
    /// output: that case cannot arise here, every one of them is a reference.)
    ///
    /// # Numerics
    /// * Ascend: CANN rebuilds the variance `var = 1/invstd² − eps` and runs inference BatchNorm,
    ///   `(x − mean)/sqrt(var + eps)·weight + bias`. The round trip costs a few f32 ulps of the scale,
    ///   and more when `eps` is large next to `1/invstd²` (the subtraction cancels: the relative error
    ///   of the scale grows like `eps·invstd²·2⁻²⁴`; `eps·invstd² ≤ 1` whenever invstd came from
    ///   statistics computed with the same eps). It also loses invstd's sign: **a negative invstd
    ///   acts as `|invstd|`** (and an invstd whose square overflows or underflows f32 gives an
    ///   infinite or zero scale). The mock CANN computes exactly this, in f32.
    /// * CPU: `scale[c] = |invstd[c]|·weight[c]` (the magnitude, as on Ascend) rounded once to f32 (the
    ///   product of two f32 values is exact in f64), then per element in f32
    ///   `(x − mean[c])·scale[c] + bias[c]`, rounded once into the output dtype. `eps` is not used
    ///   (the round trip cancels it). Error: at most about `4·2⁻²⁴·|x − mean|·|scale| + 2⁻²⁴·|bias|` before the
    ///   final rounding (half an ulp of the output dtype). Deterministic: the same bits on every run
    ///   and for any thread count; runs at memory speed on contiguous and channels-last data.
    ///
    /// # Determinism on hardware
    /// On real Atlas A2/A3 and Atlas training (910) hardware, aclnnBatchNormElemt is documented as
    /// **non-deterministic by default**: its results may differ from run to run (in the last bits).
    /// It is deterministic when the context's deterministic option is set, i.e. CANN's
    /// `aclrtCtxSetSysParamOpt(ACL_OPT_DETERMINISTIC, 1)` (or the process-wide
    /// `aclrtSetSysParamOpt(ACL_OPT_DETERMINISTIC, 1)`) from `libascendcl.so`, which this crate does
    /// not bind: call it through your own FFI on the thread whose context runs the stream. It is
    /// deterministic on Ascend 950. The CPU backend and the mock are always deterministic.
    ///
    /// # Calling
    /// Arguments are validated first, on both backends alike; a rejected call returns
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) (161002) and allocates nothing. On Ascend the work is asynchronous on
    /// `stream`: read the result with [`Tensor::to_vec`].
    pub fn batch_norm_elemt(
        stream: &Stream,
        input: &Tensor,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        mean: &Tensor,
        invstd: &Tensor,
        eps: f64,
    ) -> Result<Tensor> {
        run_into_new_like!(stream, Args { input, weight, bias, mean, invstd, eps }, input)
    }

    /// [`batch_norm_elemt`] into the caller-owned `output` (same shape and dtype as `input`, any
    /// strides that do not overlap themselves).
    ///
    /// On Ascend this is `aclnnBatchNormElemtGetWorkspaceSize` followed by `aclnnBatchNormElemt` on
    /// `stream`, with the stream's cached workspace. The call returns once the work is enqueued; every
    /// tensor may be dropped at once (its memory is freed after the stream has finished with it).
    #[allow(clippy::too_many_arguments)]
    pub fn batch_norm_elemt_into(.., output: &mut Tensor) => (
        Args { input, weight, bias, mean, invstd, eps },
        [output],
    );

    /// Phase 1 of the two-phase API: validates the arguments and, on Ascend, creates the tensor
    /// descriptors and the executor (`aclnnBatchNormElemtGetWorkspaceSize`).
    ///
    /// The result borrows every tensor until it is launched or dropped. [`Prepared::launch`] runs
    /// phase 2; dropping it unlaunched destroys the executor and writes nothing.
    #[allow(clippy::too_many_arguments)]
    pub fn prepare_batch_norm_elemt(.., ..) -> Prepared;
}

/// The layouts of what a call reads.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ElemtInputs<'l> {
    pub input: Layout<'l>,
    pub weight: Option<Layout<'l>>,
    pub bias: Option<Layout<'l>>,
    pub mean: Layout<'l>,
    pub invstd: Layout<'l>,
}

impl<'l> ElemtInputs<'l> {
    /// Each input with its aclnn name, in the prototype's order.
    fn named(&self) -> [(Option<&Layout<'l>>, &'static str); 5] {
        [
            (Some(&self.input), "input"),
            (self.weight.as_ref(), "weight"),
            (self.bias.as_ref(), "bias"),
            (Some(&self.mean), "mean"),
            (Some(&self.invstd), "invstd"),
        ]
    }
}

/// Validates the inputs of a call over their layouts and eps, in CANN's order (dtypes, then
/// shapes), then what CANN does not check (views inside their storage, eps); returns whether the
/// input is empty. Checks no stream, allocates nothing: a composite call (`sync_batch_norm`)
/// asks it before its first side effect.
pub(crate) fn check_inputs(inputs: &ElemtInputs<'_>, eps: f64) -> Result<bool> {
    // Each tensor's dtype on its own (Atlas A2/A3: f32, f16, bf16).
    for (m, name) in inputs.named() {
        if let Some(m) = m {
            validate::float_dtype(name, m.dtype)?;
        }
    }
    let c = validate::activation("input", &inputs.input)?;
    for (m, name) in inputs.named().into_iter().skip(1) {
        if let Some(m) = m {
            validate::per_channel(name, m, c)?;
        }
    }
    let n = validate::in_storage("input", &inputs.input)?;
    validate::f32_scalar("eps", eps)?;
    Ok(n == 0)
}

/// The arguments of a call but its output.
struct Args<'a> {
    input: &'a Tensor,
    weight: Option<&'a Tensor>,
    bias: Option<&'a Tensor>,
    mean: &'a Tensor,
    invstd: &'a Tensor,
    eps: f64,
}

impl Args<'_> {
    /// [`check_inputs`] of this call's inputs; returns whether the input is empty.
    fn check_inputs(&self) -> Result<bool> {
        let inputs = ElemtInputs {
            input: self.input.layout(),
            weight: self.weight.map(Tensor::layout),
            bias: self.bias.map(Tensor::layout),
            mean: self.mean.layout(),
            invstd: self.invstd.layout(),
        };
        check_inputs(&inputs, self.eps)
    }
}

impl<'a> Operator<'a> for Args<'a> {
    const OP: &'static symbols::Operator = &symbols::BATCH_NORM_ELEMT;
    const OUTPUTS: &'static [&'static str] = &["output"];
    type Outputs = [&'a mut Tensor; 1];
    /// Whether the input is empty.
    type Plan = bool;
    /// eps.
    type Scalars = f64;

    fn inputs(&self) -> impl IntoIterator<Item = Arg<'a>> {
        [
            (Some(self.input), "input"),
            (self.weight, "weight"),
            (self.bias, "bias"),
            (Some(self.mean), "mean"),
            (Some(self.invstd), "invstd"),
        ]
    }

    /// The inputs, then the output against them.
    fn check(&self, [output]: &Self::Outputs) -> Result<bool> {
        let empty = self.check_inputs()?;
        validate::like_input("output", &output.layout(), "input", &self.input.layout())?;
        Ok(empty)
    }

    fn scalars(&self) -> f64 {
        self.eps
    }

    fn cpu(self, empty: bool, [output]: Self::Outputs) -> Result<()> {
        if empty {
            return Ok(());
        }
        let Args { input, weight, bias, mean, invstd, eps } = self;
        cpu::run(input, [weight, bias], [mean, invstd], eps, output)
    }

    unsafe fn phase1(api: &OpApi, eps: f64, h: Handles<'_>) -> Result<aclnnStatus> {
        let f = crate::acl::op_fn(&api.aclnnBatchNormElemtGetWorkspaceSize, Self::OP.phase1)?;
        let [input, weight, bias, mean, invstd] = [0, 1, 2, 3, 4].map(|i| h.input(i));
        // SAFETY: the signature is the header's (wrapper.h, checked against CANN's headers; mean
        // and invstd are non-const there, and CANN only reads them); the handles are the call's
        // live descriptors in the prototype's order and the out-pointers are valid (this
        // function's contract).
        Ok(unsafe { f(input, weight, bias, mean, invstd, eps, h.output(0), h.size, h.executor) })
    }

    fn phase2(api: &OpApi) -> &std::result::Result<Phase2, libloading::Error> {
        &api.aclnnBatchNormElemt
    }
}
