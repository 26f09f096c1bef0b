//! Host tensors as the CPU kernels read and write them.

use crate::dtype::SliceRef;
use crate::error::{Error, Result};
use crate::tensor::{Storage, Tensor};

/// The whole storage of a host tensor (the view's elements lie at its offset and strides), or
/// `None` for a device tensor.
pub(crate) fn storage(t: &Tensor) -> Option<SliceRef<'_>> {
    match &t.storage {
        Storage::Host(h) => Some(h.as_slice_ref()),
        Storage::Device(_) => None,
    }
}

/// Writes `values[i]` (rounded once into the tensor's dtype) to element `i` of a validated rank-1
/// host tensor (argument `name`, for errors).
pub(crate) fn write_vector(t: &mut Tensor, name: &'static str, values: impl IntoIterator<Item = f64>) -> Result<()> {
    let (offset, stride, len) = match (t.shape(), t.strides()) {
        ([len], [stride]) => (t.offset(), *stride, *len),
        _ => return Err(Error::invalid(name, format!("expected a rank-1 tensor, got shape {:?}", t.shape()))),
    };
    let Some(mut view) = t.as_host_view_mut() else {
        return Err(Error::invalid(name, "a device tensor reached the CPU backend"));
    };
    for (i, v) in values.into_iter().take(len).enumerate() {
        view.set_f64(offset + i * stride, v);
    }
    Ok(())
}

/// The elements of a validated host tensor in row-major order, widened to f64 (empty for a device
/// tensor).
pub(crate) fn values(t: &Tensor) -> Vec<f64> {
    let mut v = Vec::with_capacity(t.numel());
    if let Some(view) = t.as_host_view() {
        view.for_each_f32(|x| v.push(f64::from(x)));
    }
    v
}
