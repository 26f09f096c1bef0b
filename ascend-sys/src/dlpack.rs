//! The DLPack ABI (`include/dlpack/dlpack.h` of dmlc/dlpack, version 1.1, plus `kDLAscend` from
//! its main branch): the structs frameworks exchange tensors through. Declared by hand from the
//! header (its layout is checked in `tests/abi.rs`); enumerations are plain integers, since a
//! producer may send any value.
#![allow(non_camel_case_types, non_upper_case_globals)]

use std::ffi::c_void;

/// `DLPACK_MAJOR_VERSION`: a `DLManagedTensorVersioned` of another major version has another
/// layout past its `deleter` field.
pub const DLPACK_MAJOR_VERSION: u32 = 1;
/// `DLPACK_MINOR_VERSION` of the header these declarations follow.
pub const DLPACK_MINOR_VERSION: u32 = 1;

/// `DLPackVersion`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DLPackVersion {
    /// A change means another layout of `DLManagedTensorVersioned`.
    pub major: u32,
    /// A change adds enumeration values; the layout is kept.
    pub minor: u32,
}

/// `DLDeviceType` (a C enum: an `int32_t`).
pub type DLDeviceType = i32;
/// `kDLCPU`: host memory.
pub const kDLCPU: DLDeviceType = 1;
/// `kDLCUDA`.
pub const kDLCUDA: DLDeviceType = 2;
/// `kDLExtDev`: a device DLPack does not name; torch_npu exports NPU tensors as this.
pub const kDLExtDev: DLDeviceType = 12;
/// `kDLAscend`: Ascend NPU memory (DLPack's main branch, after v1.3; not in a release yet).
pub const kDLAscend: DLDeviceType = 21;

/// `DLDevice`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DLDevice {
    /// The kind of memory.
    pub device_type: DLDeviceType,
    /// The device ordinal (0 for the host).
    pub device_id: i32,
}

/// `DLDataTypeCode` (stored as a `uint8_t` in [`DLDataType::code`]).
pub type DLDataTypeCode = u8;
/// `kDLInt`: signed integers.
pub const kDLInt: DLDataTypeCode = 0;
/// `kDLUInt`: unsigned integers.
pub const kDLUInt: DLDataTypeCode = 1;
/// `kDLFloat`: IEEE floating point.
pub const kDLFloat: DLDataTypeCode = 2;
/// `kDLBfloat`: bfloat16.
pub const kDLBfloat: DLDataTypeCode = 4;

/// `DLDataType`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DLDataType {
    /// A `DLDataTypeCode`.
    pub code: u8,
    /// Bits per lane.
    pub bits: u8,
    /// Lanes per element (1 for scalars).
    pub lanes: u16,
}

/// `DLTensor`: a strided view of memory.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DLTensor {
    /// The base address (on the device for device memory).
    pub data: *mut c_void,
    /// Where the memory is.
    pub device: DLDevice,
    /// The number of dimensions.
    pub ndim: i32,
    /// The element type.
    pub dtype: DLDataType,
    /// `ndim` extents.
    pub shape: *mut i64,
    /// `ndim` strides in elements, or null for a compact row-major tensor.
    pub strides: *mut i64,
    /// Bytes from `data` to the first element.
    pub byte_offset: u64,
}

/// `DLManagedTensor`: the pre-1.0 capsule (no version, no flags).
#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensor {
    /// The tensor.
    pub dl_tensor: DLTensor,
    /// The producer's context.
    pub manager_ctx: *mut c_void,
    /// Frees `manager_ctx` and the struct itself; may be null.
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

/// `DLPACK_FLAG_BITMASK_READ_ONLY`: the consumer must not write the memory.
pub const DLPACK_FLAG_BITMASK_READ_ONLY: u64 = 1 << 0;
/// `DLPACK_FLAG_BITMASK_IS_COPIED`: the producer made a copy the consumer owns alone.
pub const DLPACK_FLAG_BITMASK_IS_COPIED: u64 = 1 << 1;
/// `DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED`: sub-byte elements are padded, not packed.
pub const DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED: u64 = 1 << 2;

/// `DLManagedTensorVersioned`: the DLPack >= 1.0 capsule.
#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensorVersioned {
    /// The ABI version; only the fields up to `deleter` may be read when the major differs.
    pub version: DLPackVersion,
    /// The producer's context.
    pub manager_ctx: *mut c_void,
    /// Frees `manager_ctx` and the struct itself; may be null.
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    /// `DLPACK_FLAG_BITMASK_*` bits.
    pub flags: u64,
    /// The tensor.
    pub dl_tensor: DLTensor,
}
