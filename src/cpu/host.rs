//! Host tensors as the CPU kernels read and write them.

use crate::cpu::scratch::Scratch;
use crate::cpu::{View, ViewMut};
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// The host view of `t` (argument `name`) on the CPU path, where every tensor's stream was
/// checked: a device tensor here is this crate's bug ([`Error::Internal`]).
pub(crate) fn view<'t>(t: &'t Tensor, name: &'static str) -> Result<View<'t>> {
    t.as_host_view().ok_or_else(|| device_on_cpu(name))
}

/// [`view`], mutably (an output).
pub(crate) fn view_mut<'t>(t: &'t mut Tensor, name: &'static str) -> Result<ViewMut<'t>> {
    t.as_host_view_mut().ok_or_else(|| device_on_cpu(name))
}

fn device_on_cpu(name: &'static str) -> Error {
    Error::internal(format!("{name}: a device tensor reached the CPU backend"))
}

/// Writes `values[i]` (rounded once into the tensor's dtype) to element `i` of a validated rank-1
/// host tensor (argument `name`, for errors).
pub(crate) fn write_vector(t: &mut Tensor, name: &'static str, values: impl IntoIterator<Item = f64>) -> Result<()> {
    let (offset, stride, len) = match (t.shape(), t.strides()) {
        ([len], [stride]) => (t.offset(), *stride, *len),
        _ => return Err(Error::invalid(name, format!("expected a rank-1 tensor, got shape {:?}", t.shape()))),
    };
    let mut view = view_mut(t, name)?;
    for (i, v) in values.into_iter().take(len).enumerate() {
        view.set_f64(offset + i * stride, v);
    }
    Ok(())
}

/// An empty vector with room for `n` elements, or [`Error::HostAlloc`] when the host cannot hold
/// it. Every buffer or work table whose length derives from a caller's count (a view's element
/// count, which a zero-stride view makes as large as it likes, or a channel count) is made here
/// or by [`try_vec`] / [`try_collect`], never with `Vec::with_capacity` or `vec!` (which abort the
/// process when the allocation fails).
pub(crate) fn try_with_capacity<T>(n: usize) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| Error::HostAlloc { bytes: n.saturating_mul(std::mem::size_of::<T>()) })?;
    Ok(v)
}

/// `n` copies of `value`, or [`Error::HostAlloc`] (see [`try_with_capacity`]).
pub(crate) fn try_vec<T: Clone>(n: usize, value: T) -> Result<Vec<T>> {
    let mut v = try_with_capacity(n)?;
    // bounded: the capacity for `n` was reserved just above (try_reserve_exact), so this resize
    // never allocates.
    #[allow(clippy::disallowed_methods)]
    v.resize(n, value);
    Ok(v)
}

/// The items of `values` (at most `n` are taken, the capacity reserved up front), or
/// [`Error::HostAlloc`] (see [`try_with_capacity`]).
pub(crate) fn try_collect<T>(n: usize, values: impl IntoIterator<Item = T>) -> Result<Vec<T>> {
    let mut v = try_with_capacity(n)?;
    v.extend(values.into_iter().take(n));
    Ok(v)
}

/// [`try_with_capacity`] in a reused [`Scratch`] block: the kernels' per-call tables, so that a
/// steady loop makes no heap allocation.
pub(crate) fn scratch_with_capacity<T>(n: usize) -> Result<Scratch<T>> {
    Scratch::with_capacity(n)
}

/// [`try_vec`] in a [`Scratch`] block.
pub(crate) fn scratch_vec<T: Clone>(n: usize, value: T) -> Result<Scratch<T>> {
    let mut v = Scratch::with_capacity(n)?;
    v.resize(n, value);
    Ok(v)
}

/// [`try_collect`] into a [`Scratch`] block.
pub(crate) fn scratch_collect<T>(n: usize, values: impl IntoIterator<Item = T>) -> Result<Scratch<T>> {
    let mut v = Scratch::with_capacity(n)?;
    v.extend(values.into_iter().take(n));
    Ok(v)
}

/// The elements of a validated host tensor in row-major order, widened exactly to f64 (empty for a
/// device tensor), in a [`Scratch`] block, or [`Error::HostAlloc`] for more than the host can hold.
pub(crate) fn scratch_values(t: &Tensor) -> Result<Scratch<f64>> {
    let Some(v) = t.as_host_view() else {
        return Ok(Scratch::new());
    };
    let mut out = Scratch::with_capacity(t.numel())?;
    v.for_each_f64(|x| out.push(x));
    Ok(out)
}

/// A tensor's shape and strides copied onto the stack (so that its storage can be borrowed
/// mutably while they are read): `(shape, strides)` arrays of which the first `rank` entries
/// count. Ranks above [`MAX_RANK`](crate::ops::MAX_RANK) never reach a kernel (validated).
pub(crate) fn layout_of(t: &Tensor) -> Result<([usize; crate::ops::MAX_RANK], [usize; crate::ops::MAX_RANK], usize)> {
    let rank = t.shape().len();
    if rank > crate::ops::MAX_RANK {
        return Err(Error::internal(format!("a rank-{rank} tensor reached a CPU kernel")));
    }
    let (mut shape, mut strides) = ([0; crate::ops::MAX_RANK], [0; crate::ops::MAX_RANK]);
    shape[..rank].copy_from_slice(t.shape());
    strides[..rank].copy_from_slice(t.strides());
    Ok((shape, strides, rank))
}
