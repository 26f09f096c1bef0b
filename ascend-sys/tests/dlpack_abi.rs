//! The DLPack declarations against `include/dlpack/dlpack.h` (dmlc/dlpack v1.1, and
//! `kDLAscend = 21` of its main branch): the values of the constants, and each struct's size and
//! field offsets as a C compiler lays them out on a 64-bit target (aarch64 and x86_64 alike).

use std::mem::{offset_of, size_of};

use ascend_sys::dlpack::*;

#[test]
fn constants_are_the_headers() {
    assert_eq!((DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION), (1, 1));
    assert_eq!((kDLCPU, kDLCUDA, kDLExtDev, kDLAscend), (1, 2, 12, 21));
    assert_eq!((kDLInt, kDLUInt, kDLFloat, kDLBfloat), (0, 1, 2, 4));
    assert_eq!(
        (DLPACK_FLAG_BITMASK_READ_ONLY, DLPACK_FLAG_BITMASK_IS_COPIED, DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED),
        (1, 2, 4)
    );
}

#[test]
fn small_structs_have_cs_layout() {
    assert_eq!(size_of::<DLPackVersion>(), 8);
    assert_eq!((offset_of!(DLPackVersion, major), offset_of!(DLPackVersion, minor)), (0, 4));
    // A C enum is an int: DLDevice is two 32-bit words.
    assert_eq!(size_of::<DLDeviceType>(), 4);
    assert_eq!(size_of::<DLDevice>(), 8);
    assert_eq!((offset_of!(DLDevice, device_type), offset_of!(DLDevice, device_id)), (0, 4));
    assert_eq!(size_of::<DLDataType>(), 4);
    assert_eq!((offset_of!(DLDataType, code), offset_of!(DLDataType, bits), offset_of!(DLDataType, lanes)), (0, 1, 2));
}

#[cfg(target_pointer_width = "64")]
#[test]
fn tensors_and_capsules_have_cs_layout_on_64_bit_targets() {
    assert_eq!(size_of::<DLTensor>(), 48);
    let t = [
        offset_of!(DLTensor, data),
        offset_of!(DLTensor, device),
        offset_of!(DLTensor, ndim),
        offset_of!(DLTensor, dtype),
        offset_of!(DLTensor, shape),
        offset_of!(DLTensor, strides),
        offset_of!(DLTensor, byte_offset),
    ];
    assert_eq!(t, [0, 8, 16, 20, 24, 32, 40]);

    assert_eq!(size_of::<DLManagedTensor>(), 64);
    let m = [
        offset_of!(DLManagedTensor, dl_tensor),
        offset_of!(DLManagedTensor, manager_ctx),
        offset_of!(DLManagedTensor, deleter),
    ];
    assert_eq!(m, [0, 48, 56]);

    // The fields up to `deleter` are the ones every major version keeps.
    assert_eq!(size_of::<DLManagedTensorVersioned>(), 80);
    let v = [
        offset_of!(DLManagedTensorVersioned, version),
        offset_of!(DLManagedTensorVersioned, manager_ctx),
        offset_of!(DLManagedTensorVersioned, deleter),
        offset_of!(DLManagedTensorVersioned, flags),
        offset_of!(DLManagedTensorVersioned, dl_tensor),
    ];
    assert_eq!(v, [0, 8, 16, 24, 32]);
    // A nullable function pointer is one pointer (`Option` of a fn pointer uses the null niche).
    assert_eq!(size_of::<Option<unsafe extern "C" fn(*mut DLManagedTensor)>>(), 8);
}
