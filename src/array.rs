//! The `ndarray` feature: [`Tensor::from_array`] and [`Tensor::to_array`] copy host data between
//! `ndarray` arrays and tensors (on Ascend one copy each way; device memory cannot be viewed).

use ndarray::{ArrayD, ArrayView, AsArray, Dimension, IxDyn};

use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::stream::Stream;
use crate::tensor::Tensor;

impl Tensor {
    /// A contiguous tensor of `array`'s shape holding a copy of its elements (in `T`'s dtype,
    /// bit for bit). `array` is an `ArrayView` or a `&Array` (any `&ArrayBase`) of any
    /// dimension: a standard-layout one is copied as one block;
    /// other strides, negative ones included, are gathered in row-major order first (so the
    /// tensor is row-major whatever the view's memory order). On Ascend as
    /// [`from_slice`](Self::from_slice): the data is on the device when this returns.
    #[cfg_attr(docsrs, doc(cfg(feature = "ndarray")))]
    pub fn from_array<'a, T, D>(stream: &Stream, array: impl AsArray<'a, T, D>) -> Result<Tensor>
    where
        T: Element,
        D: Dimension,
    {
        let array: ArrayView<'a, T, D> = array.into();
        if let Some(data) = array.as_slice() {
            return Tensor::from_slice(stream, data, array.shape());
        }
        let n = array.len();
        let mut data = Vec::new();
        data.try_reserve_exact(n).map_err(|_| Error::HostAlloc { bytes: n.saturating_mul(size_of::<T>()) })?;
        data.extend(array.iter().copied());
        Tensor::from_slice(stream, &data, array.shape())
    }

    /// The view's elements as an array of its shape (row-major), converted to `T` as
    /// [`to_vec`](Self::to_vec) does: exact, bit for bit, when `T` is the tensor's dtype. On
    /// Ascend this waits for the work queued on the tensor, then copies.
    #[cfg_attr(docsrs, doc(cfg(feature = "ndarray")))]
    pub fn to_array<T: Element>(&self, stream: &Stream) -> Result<ArrayD<T>> {
        let data = self.to_vec::<T>(stream)?;
        ArrayD::from_shape_vec(IxDyn(self.shape()), data)
            .map_err(|e| Error::internal(format!("Tensor::to_array: shape {:?}: {e}", self.shape())))
    }
}
