//! Argument validation shared by both backends, done before any work: everything CANN checks
//! (with CANN's codes, in CANN's order: missing arguments first), plus what CANN does not check
//! but would misread (mean/invstd/weight length, gradOut shape, views inside their storage).

use super::OutputMask;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::layout;

/// The smallest rank of gradOut and input.
pub const MIN_RANK: usize = 2;
/// The largest rank of gradOut and input.
pub const MAX_RANK: usize = 8;

/// The layout of one argument.
pub(crate) use crate::layout::Layout as Meta;

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

/// Checks that the view lies inside its storage (and within int64); returns its element count.
pub(crate) fn in_storage(name: &'static str, m: &Meta<'_>) -> Result<usize> {
    layout::check_view(m.shape, m.strides, m.offset, m.storage_len).map_err(|e| Error::invalid(name, e))
}

/// Checks a per-channel vector: shape `[c]`, inside its storage.
pub(crate) fn per_channel(name: &'static str, m: &Meta<'_>, c: usize) -> Result<()> {
    if m.shape != [c] {
        return Err(Error::invalid(name, format!("expected shape [{c}] (one value per channel), got {:?}", m.shape)));
    }
    in_storage(name, m).map(|_| ())
}

/// Checks that an activation (gradOut, input, output...) has rank `MIN_RANK..=MAX_RANK` and a
/// non-zero channel dim 1; returns C.
pub(crate) fn activation(name: &'static str, m: &Meta<'_>) -> Result<usize> {
    let r = m.shape.len();
    if !(MIN_RANK..=MAX_RANK).contains(&r) {
        return Err(Error::invalid(
            name,
            format!("rank must be {MIN_RANK}..={MAX_RANK}, got {r} (shape {:?})", m.shape),
        ));
    }
    if m.shape[1] == 0 {
        return Err(Error::invalid(name, format!("channel dim 1 must be non-zero, got shape {:?}", m.shape)));
    }
    Ok(m.shape[1])
}

/// Checks that an argument has rank `rank`.
pub(crate) fn rank(name: &'static str, m: &Meta<'_>, rank: usize) -> Result<()> {
    if m.shape.len() != rank {
        return Err(Error::invalid(name, format!("expected {rank} dims, got shape {:?}", m.shape)));
    }
    Ok(())
}

/// Checks that an argument's dtype is one of `allowed`; `note` ends the message (e.g. what to
/// do instead).
pub(crate) fn dtype_in(name: &'static str, m: &Meta<'_>, allowed: &[DType], note: &str) -> Result<()> {
    if allowed.contains(&m.dtype) {
        return Ok(());
    }
    let list: Vec<&str> = allowed.iter().map(|d| d.name()).collect();
    let sep = if note.is_empty() { "" } else { "; " };
    Err(Error::invalid(
        name,
        format!("dtype {} is not supported (expected one of {}){sep}{note}", m.dtype, list.join(", ")),
    ))
}

/// Checks a per-channel vector the operator writes: shape `[c]`, inside its storage, and no
/// stride 0 over several channels (every channel would land on one element).
pub(crate) fn per_channel_output(name: &'static str, m: &Meta<'_>, c: usize) -> Result<()> {
    per_channel(name, m, c)?;
    if c > 1 && m.strides[0] == 0 {
        return Err(Error::invalid(name, "stride 0 would write every channel to one element"));
    }
    Ok(())
}

/// Validates the inputs.
pub(crate) fn inputs(
    grad_out: &Meta<'_>,
    input: &Meta<'_>,
    mean: &Meta<'_>,
    invstd: &Meta<'_>,
    weight: Option<&Meta<'_>>,
) -> Result<Plan> {
    for (name, m) in [("gradOut", grad_out), ("input", input)] {
        let r = m.shape.len();
        if !(MIN_RANK..=MAX_RANK).contains(&r) {
            return Err(Error::invalid(
                name,
                format!("rank must be {MIN_RANK}..={MAX_RANK}, got {r} (shape {:?})", m.shape),
            ));
        }
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
    [grad_out, input, mean, invstd]: [&Meta<'_>; 4],
    weight: Option<&Meta<'_>>,
    mask: OutputMask,
    outs: [Option<&Meta<'_>>; 4],
) -> Result<Plan> {
    missing_outputs(mask, outs.map(|o| o.is_some()))?;
    let plan = inputs(grad_out, input, mean, invstd, weight)?;
    outputs(&plan, mask, outs)?;
    Ok(plan)
}

/// Validates the outputs the mask turns on (the others are ignored, as CANN ignores them).
pub(crate) fn outputs(plan: &Plan, mask: OutputMask, outs: [Option<&Meta<'_>>; 4]) -> Result<()> {
    let on = enabled(mask);
    for i in 0..4 {
        if let (true, Some(m)) = (on[i], outs[i]) {
            float_dtype(OUTPUT_NAMES[i], m.dtype)?;
            per_channel(OUTPUT_NAMES[i], m, plan.channels)?;
            if plan.channels > 1 && m.strides[0] == 0 {
                return Err(Error::invalid(OUTPUT_NAMES[i], "stride 0 would write every channel to one element"));
            }
        }
    }
    Ok(())
}

/// Checks that no two elements of an output view share a storage position (a stride of 0, or
/// strides that interleave, would make the kernel write several results to one element). The
/// test is the usual sufficient one: taken by increasing stride, each dim of size > 1 must step
/// past everything the smaller dims span (so a few exotic non-overlapping interleavings are
/// refused too). Empty views pass.
pub(crate) fn distinct_elements(name: &'static str, m: &Meta<'_>) -> Result<()> {
    if m.shape.contains(&0) {
        return Ok(());
    }
    let mut dims: Vec<(usize, usize)> =
        m.shape.iter().zip(m.strides).filter(|(&d, _)| d > 1).map(|(&d, &s)| (s, d)).collect();
    dims.sort_unstable();
    let mut span = 0usize; // the largest offset the smaller dims reach
    for (stride, size) in dims {
        if stride <= span {
            return Err(Error::invalid(
                name,
                format!(
                    "an output view must not overlap itself: shape {:?} with strides {:?} may write some \
                     elements twice (taken by increasing stride, each dim must step past the span of the \
                     smaller ones)",
                    m.shape, m.strides
                ),
            ));
        }
        span = span.saturating_add((size - 1).saturating_mul(stride));
    }
    Ok(())
}

/// Checks that `m` has the shape `expected` (that of argument `of`).
pub(crate) fn same_shape(name: &'static str, m: &Meta<'_>, of: &str, expected: &[usize]) -> Result<()> {
    if m.shape != expected {
        return Err(Error::invalid(name, format!("shape must equal {of}'s {expected:?}, got {:?}", m.shape)));
    }
    Ok(())
}

/// Checks a scalar argument (eps, momentum) that CANN computes with in f32: it must be finite in
/// f32 (NaN, ±inf and anything that rounds to ±inf in f32 are refused), so that the CPU backend,
/// which computes in f64, and CANN see the same value class. The one rule of every operator.
pub(crate) fn f32_scalar(name: &'static str, v: f64) -> Result<()> {
    if v.is_finite() && (v as f32).is_finite() {
        return Ok(());
    }
    Err(Error::invalid(name, format!("must be finite in f32 (CANN computes with it in f32), got {v}")))
}

/// Checks that argument `name`'s dtype is a floating-point one (f32, f16, bf16): every DType
/// today. The match is exhaustive on purpose, so that a new DType (e.g. an integer one) must be
/// decided on here: `DType::I32 => Err(Error::invalid(name, "..."))`.
pub(crate) fn float_dtype(name: &'static str, dtype: DType) -> Result<()> {
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 => Ok(()),
        other => Err(Error::invalid(name, format!("dtype must be f32, f16 or bf16, got {other}"))),
    }
}
