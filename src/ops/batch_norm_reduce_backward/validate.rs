//! `batch_norm_reduce_backward`'s rules, shared by both backends and done before any work:
//! everything CANN checks (with CANN's codes, in CANN's order: missing arguments first), plus
//! what CANN does not check but would misread (mean/invstd/weight length, gradOut shape, views
//! inside their storage).

use super::OutputMask;
use crate::error::{Error, Result};
use crate::layout::Layout;
use crate::ops::validate::{float_dtype, in_storage, per_channel, per_channel_output, rank_2_to_8};

/// What validation established.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Channels (input dim 1).
    pub channels: usize,
    /// Whether gradOut/input have no elements (outputs are then zeros).
    pub empty: bool,
}

/// The aclnn names of the outputs, in order: sumDy, sumDyXmu, gradWeight, gradBias.
pub(crate) const OUTPUT_NAMES: [&str; 4] = ["sumDy", "sumDyXmu", "gradWeight", "gradBias"];

/// Which outputs the mask turns on, in [`OUTPUT_NAMES`] order.
pub(crate) fn enabled(mask: OutputMask) -> [bool; 4] {
    [mask.input_g, mask.input_g, mask.weight_g, mask.bias_g]
}

/// Validates the inputs.
pub(crate) fn inputs(
    grad_out: &Layout<'_>,
    input: &Layout<'_>,
    mean: &Layout<'_>,
    invstd: &Layout<'_>,
    weight: Option<&Layout<'_>>,
) -> Result<Plan> {
    for (name, m) in [("gradOut", grad_out), ("input", input)] {
        rank_2_to_8(name, m)?;
    }
    // CANN's dtype check (gradOut, input, mean, invstd: f32/f16/bf16), before gradOut = input.
    for (name, m) in [("gradOut", grad_out), ("input", input), ("mean", mean), ("invstd", invstd)] {
        float_dtype(name, m.dtype)?;
    }
    if let Some(w) = weight {
        float_dtype("weight", w.dtype)?;
    }
    if grad_out.dtype != input.dtype {
        return Err(Error::invalid(
            "gradOut",
            format!("dtype must equal input's ({}), got {}", input.dtype, grad_out.dtype),
        ));
    }
    let c = input.shape[1];
    if c == 0 {
        return Err(Error::invalid("input", format!("channel dim 1 must be non-zero, got shape {:?}", input.shape)));
    }
    if grad_out.shape != input.shape {
        return Err(Error::invalid(
            "gradOut",
            format!("shape must equal input's {:?}, got {:?}", input.shape, grad_out.shape),
        ));
    }
    per_channel("mean", mean, c)?;
    per_channel("invstd", invstd, c)?;
    if let Some(w) = weight {
        per_channel("weight", w, c)?;
    }
    in_storage("gradOut", grad_out)?;
    let n = in_storage("input", input)?;
    Ok(Plan { channels: c, empty: n == 0 })
}

/// Reports a missing output that the mask turns on (161001). CANN checks every null argument
/// before anything else, so callers run this before [`inputs`].
pub(crate) fn missing_outputs(mask: OutputMask, present: [bool; 4]) -> Result<()> {
    for (i, (on, present)) in enabled(mask).into_iter().zip(present).enumerate() {
        if on && !present {
            return Err(Error::null(OUTPUT_NAMES[i], format!("required by the mask {mask:?}, but not given")));
        }
    }
    Ok(())
}

/// Drops the outputs the mask turns off: CANN neither checks nor writes them.
pub(crate) fn keep_enabled<T>(mask: OutputMask, outs: [Option<T>; 4]) -> [Option<T>; 4] {
    let mut it = outs.into_iter().zip(enabled(mask)).map(|(o, on)| o.filter(|_| on));
    std::array::from_fn(|_| it.next().flatten())
}

/// Validates a whole call in CANN's order: missing outputs (161001), then the inputs, then the
/// outputs the mask turns on (`outs` as filtered by [`keep_enabled`]).
pub(crate) fn call(
    [grad_out, input, mean, invstd]: [&Layout<'_>; 4],
    weight: Option<&Layout<'_>>,
    mask: OutputMask,
    outs: [Option<&Layout<'_>>; 4],
) -> Result<Plan> {
    missing_outputs(mask, outs.map(|o| o.is_some()))?;
    let plan = inputs(grad_out, input, mean, invstd, weight)?;
    outputs(&plan, mask, outs)?;
    Ok(plan)
}

/// Validates the outputs the mask turns on (the others are ignored, as CANN ignores them).
pub(crate) fn outputs(plan: &Plan, mask: OutputMask, outs: [Option<&Layout<'_>>; 4]) -> Result<()> {
    let on = enabled(mask);
    for i in 0..4 {
        if let (true, Some(m)) = (on[i], outs[i]) {
            float_dtype(OUTPUT_NAMES[i], m.dtype)?;
            per_channel_output(OUTPUT_NAMES[i], m, plan.channels)?;
        }
    }
    Ok(())
}
