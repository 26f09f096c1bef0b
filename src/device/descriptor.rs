//! `aclTensor`: the host-side descriptor of a strided device view.

use ascend_sys::{aclDataType, aclFormat, aclTensor};

use super::{leaked, report_drop_error, Device, DeviceBuffer, Leak};
use crate::acl;
use crate::dtype::DType;
use crate::error::{Error, Result};

/// The CANN data type of a [`DType`].
pub(crate) fn acl_dtype(dtype: DType) -> aclDataType {
    match dtype {
        DType::F32 => aclDataType::ACL_FLOAT,
        DType::F16 => aclDataType::ACL_FLOAT16,
        DType::BF16 => aclDataType::ACL_BF16,
        DType::I32 => aclDataType::ACL_INT32,
    }
}

/// An `aclTensor` describing a view into a [`DeviceBuffer`] it borrows; destroyed on drop. The
/// buffer travels with its descriptor, so the list of descriptors of a call is also the list of
/// the memory the call touches.
///
/// The descriptor is host metadata only: destroying it after phase 2 has been launched, before
/// the stream has run the work, is what op-plugin does and is safe.
pub(crate) struct AclTensor<'a> {
    device: &'a Device,
    raw: *mut aclTensor,
    buffer: &'a DeviceBuffer,
}

fn to_i64(v: usize, what: &'static str) -> Result<i64> {
    i64::try_from(v).map_err(|_| Error::invalid(what, format!("{v} does not fit in int64")))
}

impl<'a> AclTensor<'a> {
    /// Describes the view (shape, strides, offset in elements) of `buffer`, whose storage holds
    /// `storage_len` elements of `dtype`. The view has been checked to lie inside the storage.
    pub(crate) fn new(
        buffer: &'a DeviceBuffer,
        dtype: DType,
        shape: &[usize],
        strides: &[usize],
        offset: usize,
        storage_len: usize,
    ) -> Result<Self> {
        let device: &'a Device = buffer.device();
        debug_assert!(storage_len * dtype.size_in_bytes() <= buffer.bytes());
        // On the stack for the usual ranks (aclnn tensors have at most 8 dims).
        let (mut dims_stack, mut strides_stack) = ([0i64; 8], [0i64; 8]);
        let (dims_heap, strides_heap);
        let (dims, strides) = if shape.len() <= 8 && strides.len() <= 8 {
            for (d, &v) in dims_stack.iter_mut().zip(shape) {
                *d = to_i64(v, "shape")?;
            }
            for (d, &v) in strides_stack.iter_mut().zip(strides) {
                *d = to_i64(v, "strides")?;
            }
            (&dims_stack[..shape.len()], &strides_stack[..strides.len()])
        } else {
            dims_heap = shape.iter().map(|&d| to_i64(d, "shape")).collect::<Result<Vec<_>>>()?;
            strides_heap = strides.iter().map(|&s| to_i64(s, "strides")).collect::<Result<Vec<_>>>()?;
            (&dims_heap[..], &strides_heap[..])
        };
        device.bind()?;
        // SAFETY: the buffer is a live allocation of at least `storage_len` elements (or null with
        // storage_len 0), the view lies inside it (checked by the caller), and the descriptor
        // borrows the buffer for 'a so the memory outlives it.
        let raw = unsafe {
            acl::create_tensor(
                device.cann,
                dims,
                strides,
                to_i64(offset, "offset")?,
                acl_dtype(dtype),
                format_of(shape.len()),
                to_i64(storage_len, "storage")?,
                buffer.ptr(),
            )?
        };
        Ok(AclTensor { device, raw, buffer })
    }

    pub(crate) fn raw(&self) -> *mut aclTensor {
        self.raw
    }

    /// The device memory the descriptor points into.
    pub(crate) fn buffer(&self) -> &'a DeviceBuffer {
        self.buffer
    }

    /// Gives up ownership of the descriptor (and its tie to the buffer): the caller destroys it,
    /// and rebinds its address before any launch that uses it after this buffer's lifetime.
    pub(crate) fn into_raw(self) -> *mut aclTensor {
        std::mem::ManuallyDrop::new(self).raw
    }
}

impl Drop for AclTensor<'_> {
    fn drop(&mut self) {
        let result = self.device.bind().and_then(|()| {
            // SAFETY: `raw` is a live descriptor, never used after this.
            unsafe { acl::destroy_tensor(self.device.cann, self.raw) }
        });
        if let Err(e) = result {
            report_drop_error("aclDestroyTensor", &e);
            leaked(Leak::Tensor);
        }
    }
}

/// The storage format a tensor of `rank` dims is described with, torch_npu's rule for base
/// formats (and what aclnnBatchNorm requires: a 5-D input must be NCDHW on Atlas A2/A3, and ND
/// for a 4-D one fails at run time on 910B): 3 → NCL, 4 → NCHW, 5 → NCDHW, any other ND.
fn format_of(rank: usize) -> aclFormat {
    match rank {
        3 => aclFormat::ACL_FORMAT_NCL,
        4 => aclFormat::ACL_FORMAT_NCHW,
        5 => aclFormat::ACL_FORMAT_NCDHW,
        _ => aclFormat::ACL_FORMAT_ND,
    }
}
