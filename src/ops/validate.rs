//! The generic argument checks every operator's rules are written with (each operator's own
//! rules live in its folder): ranks, dtypes, per-channel vectors, views inside their storage,
//! outputs that do not overlap themselves, scalars finite in f32. Each returns aclnn's status
//! (161002) naming the argument.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::layout::{self, Layout, MAX_RANK, MIN_RANK};

/// Checks that the view lies inside its storage (and within int64); returns its element count.
pub(crate) fn in_storage(name: &'static str, m: &Layout<'_>) -> Result<usize> {
    layout::check_view(m.shape, m.strides, m.offset, m.storage_len).map_err(|e| Error::invalid(name, e))
}

/// Checks a per-channel vector: shape `[c]`, inside its storage.
pub(crate) fn per_channel(name: &'static str, m: &Layout<'_>, c: usize) -> Result<()> {
    if m.shape != [c] {
        return Err(Error::invalid(name, format!("expected shape [{c}] (one value per channel), got {:?}", m.shape)));
    }
    in_storage(name, m).map(|_| ())
}

/// Checks that an activation (gradOut, input, output...) has rank `MIN_RANK..=MAX_RANK` (2 to 8).
pub(crate) fn rank_2_to_8(name: &'static str, m: &Layout<'_>) -> Result<()> {
    let r = m.shape.len();
    if !(MIN_RANK..=MAX_RANK).contains(&r) {
        return Err(Error::invalid(
            name,
            format!("rank must be {MIN_RANK}..={MAX_RANK}, got {r} (shape {:?})", m.shape),
        ));
    }
    Ok(())
}

/// Checks that an activation (gradOut, input, output...) has rank `MIN_RANK..=MAX_RANK` and a
/// non-zero channel dim 1; returns C.
pub(crate) fn activation(name: &'static str, m: &Layout<'_>) -> Result<usize> {
    rank_2_to_8(name, m)?;
    if m.shape[1] == 0 {
        return Err(Error::invalid(name, format!("channel dim 1 must be non-zero, got shape {:?}", m.shape)));
    }
    Ok(m.shape[1])
}

/// Checks that an argument has rank `rank`.
pub(crate) fn rank(name: &'static str, m: &Layout<'_>, rank: usize) -> Result<()> {
    if m.shape.len() != rank {
        return Err(Error::invalid(name, format!("expected {rank} dims, got shape {:?}", m.shape)));
    }
    Ok(())
}

/// Checks that an argument's dtype is one of `allowed`; `note` ends the message (e.g. what to
/// do instead).
pub(crate) fn dtype_in(name: &'static str, m: &Layout<'_>, allowed: &[DType], note: &str) -> Result<()> {
    if allowed.contains(&m.dtype) {
        return Ok(());
    }
    // bounded: one name per dtype of `allowed`, a constant list in the operator.
    #[allow(clippy::disallowed_methods)]
    let list: Vec<&str> = allowed.iter().map(|d| d.name()).collect();
    let sep = if note.is_empty() { "" } else { "; " };
    Err(Error::invalid(
        name,
        format!("dtype {} is not supported (expected one of {}){sep}{note}", m.dtype, list.join(", ")),
    ))
}

/// Checks a per-channel vector the operator writes: shape `[c]`, inside its storage, and no
/// stride 0 over several channels (every channel would land on one element).
pub(crate) fn per_channel_output(name: &'static str, m: &Layout<'_>, c: usize) -> Result<()> {
    per_channel(name, m, c)?;
    if c > 1 && m.strides[0] == 0 {
        return Err(Error::invalid(name, "stride 0 would write every channel to one element"));
    }
    Ok(())
}

/// Checks that no two elements of an output view share a storage position (a stride of 0, or
/// strides that interleave, would make the kernel write several results to one element). The
/// test is the usual sufficient one: taken by increasing stride, each dim of size > 1 must step
/// past everything the smaller dims span (so a few exotic non-overlapping interleavings are
/// refused too). Empty views pass.
pub(crate) fn distinct_elements(name: &'static str, m: &Layout<'_>) -> Result<()> {
    if m.shape.contains(&0) {
        return Ok(());
    }
    // (stride, size) of each dim of size > 1: on the stack for the usual ranks (a launch
    // allocates nothing), else one entry per dim of the shape, a slice already in memory.
    let mut stack = [(0usize, 0usize); 8];
    #[allow(clippy::disallowed_methods)]
    let mut heap = if m.shape.len() > stack.len() { vec![(0, 0); m.shape.len()] } else { Vec::new() };
    let dims = if heap.is_empty() { &mut stack[..] } else { &mut heap[..] };
    let mut n = 0;
    for (&d, &s) in m.shape.iter().zip(m.strides).filter(|(&d, _)| d > 1) {
        dims[n] = (s, d);
        n += 1;
    }
    let dims = &mut dims[..n];
    dims.sort_unstable();
    let mut span = 0usize; // the largest offset the smaller dims reach
    for &mut (stride, size) in dims {
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

/// Checks an output written in the shape and dtype of input `of` (`input`): the same dtype
/// (op-plugin's rule), the same shape, inside its storage.
pub(crate) fn like_input(name: &'static str, m: &Layout<'_>, of: &str, input: &Layout<'_>) -> Result<()> {
    if m.dtype != input.dtype {
        return Err(Error::invalid(name, format!("dtype must equal {of}'s ({}), got {}", input.dtype, m.dtype)));
    }
    same_shape(name, m, of, input.shape)?;
    in_storage(name, m).map(|_| ())
}

/// Checks that `m` has the shape `expected` (that of argument `of`).
pub(crate) fn same_shape(name: &'static str, m: &Layout<'_>, of: &str, expected: &[usize]) -> Result<()> {
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

/// Checks that argument `name`'s dtype is a floating-point one (f32, f16, bf16); any other
/// (`DType::I32`, the counts' dtype) is rejected with what was given.
pub(crate) fn float_dtype(name: &'static str, dtype: DType) -> Result<()> {
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 => Ok(()),
        other => Err(Error::invalid(name, format!("dtype must be f32, f16 or bf16, got {other}"))),
    }
}
