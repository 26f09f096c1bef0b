//! The committed bindings against the facts in docs/cann/API.md: every enum value, and the
//! sizes of the scalar and handle types the safe layer relies on.

use std::mem::size_of;

use ascend_sys::*;

/// Each listed value of a bindgen enum (a newtype over its C integer) is the number API.md or
/// HCCL.md gives it, written as the C declaration writes it; a mismatch names the variant.
macro_rules! assert_values {
    ($ty:ident { $($variant:ident = $value:expr),+ $(,)? }) => {
        $(assert_eq!(
            $ty::$variant.0 as i64,
            $value,
            concat!(stringify!($ty), "::", stringify!($variant))
        );)+
    };
}

#[test]
fn data_type_values_match_api_md() {
    assert_values!(aclDataType {
        ACL_DT_UNDEFINED = -1,
        ACL_FLOAT = 0,
        ACL_FLOAT16 = 1,
        ACL_INT8 = 2,
        ACL_INT32 = 3,
        ACL_UINT8 = 4,
        ACL_INT16 = 6,
        ACL_UINT16 = 7,
        ACL_UINT32 = 8,
        ACL_INT64 = 9,
        ACL_UINT64 = 10,
        ACL_DOUBLE = 11,
        ACL_BOOL = 12,
        ACL_STRING = 13,
        ACL_COMPLEX64 = 16,
        ACL_COMPLEX128 = 17,
        ACL_BF16 = 27,
        ACL_INT4 = 29,
        ACL_UINT1 = 30,
        ACL_COMPLEX32 = 33,
        ACL_HIFLOAT8 = 34,
        ACL_FLOAT8_E5M2 = 35,
        ACL_FLOAT8_E4M3FN = 36,
        ACL_FLOAT8_E8M0 = 37,
        ACL_FLOAT6_E3M2 = 38,
        ACL_FLOAT6_E2M3 = 39,
        ACL_FLOAT4_E2M1 = 40,
        ACL_FLOAT4_E1M2 = 41,
    });
}

#[test]
fn format_values_match_api_md() {
    assert_values!(aclFormat {
        ACL_FORMAT_UNDEFINED = -1,
        ACL_FORMAT_NCHW = 0,
        ACL_FORMAT_NHWC = 1,
        ACL_FORMAT_ND = 2,
        ACL_FORMAT_NC1HWC0 = 3,
        ACL_FORMAT_FRACTAL_Z = 4,
        ACL_FORMAT_NC1HWC0_C04 = 12,
        ACL_FORMAT_HWCN = 16,
        ACL_FORMAT_NDHWC = 27,
        ACL_FORMAT_FRACTAL_NZ = 29,
        ACL_FORMAT_NCDHW = 30,
        ACL_FORMAT_NDC1HWC0 = 32,
        ACL_FRACTAL_Z_3D = 33,
        ACL_FORMAT_NC = 35,
        ACL_FORMAT_NCL = 47,
        ACL_FORMAT_FRACTAL_NZ_C0_16 = 50,
        ACL_FORMAT_FRACTAL_NZ_C0_32 = 51,
        ACL_FORMAT_FRACTAL_NZ_C0_2 = 52,
        ACL_FORMAT_FRACTAL_NZ_C0_4 = 53,
        ACL_FORMAT_FRACTAL_NZ_C0_8 = 54,
    });
}

#[test]
fn memcpy_kind_and_malloc_policy_values_match_api_md() {
    assert_values!(aclrtMemcpyKind {
        ACL_MEMCPY_HOST_TO_HOST = 0,
        ACL_MEMCPY_HOST_TO_DEVICE = 1,
        ACL_MEMCPY_DEVICE_TO_HOST = 2,
        ACL_MEMCPY_DEVICE_TO_DEVICE = 3,
        ACL_MEMCPY_DEFAULT = 4,
        ACL_MEMCPY_HOST_TO_BUF_TO_DEVICE = 5,
        ACL_MEMCPY_INNER_DEVICE_TO_DEVICE = 6,
        ACL_MEMCPY_INTER_DEVICE_TO_DEVICE = 7,
    });
    assert_values!(aclrtMemMallocPolicy {
        ACL_MEM_MALLOC_HUGE_FIRST = 0,
        ACL_MEM_MALLOC_HUGE_ONLY = 1,
        ACL_MEM_MALLOC_NORMAL_ONLY = 2,
        ACL_MEM_MALLOC_HUGE_FIRST_P2P = 3,
        ACL_MEM_MALLOC_HUGE_ONLY_P2P = 4,
        ACL_MEM_MALLOC_NORMAL_ONLY_P2P = 5,
        ACL_MEM_MALLOC_HUGE1G_ONLY = 6,
        ACL_MEM_MALLOC_HUGE1G_ONLY_P2P = 7,
        ACL_MEM_TYPE_LOW_BAND_WIDTH = 0x100,
        ACL_MEM_TYPE_HIGH_BAND_WIDTH = 0x1000,
        ACL_MEM_ACCESS_USER_SPACE_READONLY = 0x100000,
    });
}

#[test]
fn scalar_and_handle_sizes() {
    // Enums are int-sized (4 bytes); aclError is int; aclnnStatus is int32_t; handles are pointers.
    assert_eq!(size_of::<aclDataType>(), 4);
    assert_eq!(size_of::<aclFormat>(), 4);
    assert_eq!(size_of::<aclrtMemcpyKind>(), 4);
    assert_eq!(size_of::<aclrtMemMallocPolicy>(), 4);
    assert_eq!(size_of::<aclError>(), 4);
    assert_eq!(size_of::<aclnnStatus>(), 4);
    assert_eq!(size_of::<aclFloat16>(), 2);
    assert_eq!(size_of::<aclrtStream>(), size_of::<*mut ()>());
    assert_eq!(size_of::<aclrtEvent>(), size_of::<*mut ()>());
    assert_eq!(size_of::<aclrtContext>(), size_of::<*mut ()>());
    // bool is the 1-byte C++ bool that GetWorkspaceSize takes for inputG/weightG/biasG.
    assert_eq!(size_of::<bool>(), 1);
    // Opaque structs are only ever behind pointers.
    assert_eq!(size_of::<aclTensor>(), 0);
    assert_eq!(size_of::<aclOpExecutor>(), 0);
}

#[test]
fn status_codes_match_api_md() {
    use ascend_sys::status::*;
    assert_eq!(ACLNN_ERR_PARAM_NULLPTR, 161001);
    assert_eq!(ACLNN_ERR_PARAM_INVALID, 161002);
    assert_eq!(ACLNN_ERR_RUNTIME_ERROR, 361001);
    assert_eq!(ACLNN_ERR_INNER_NULLPTR, 561103);
    assert_eq!(ACL_ERROR_REPEAT_INITIALIZE, 100002);
    assert_eq!(ACL_ERROR_RT_CONTEXT_NULL, 107002);
    assert_eq!(ACL_ERROR_RT_MEMORY_ALLOCATION, 207001);
    assert_eq!(ACL_ERROR_RT_STREAM_SYNC_TIMEOUT, 507046);
}

#[test]
fn missing_toolkit_is_a_typed_error_not_a_panic() {
    let dir = std::env::temp_dir().join(format!("ascend-sys-empty-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // With no CANN on this machine the whole search fails; with one, the explicit dir is skipped.
    match ascend_sys::load_from(&dir) {
        Err(e) => {
            assert!(e.tried.iter().any(|(p, _)| p.starts_with(dir.to_str().unwrap())), "{e}");
            assert!(e.to_string().contains("libascendcl.so"), "{e}");
        }
        Ok(cann) => assert!(!cann.paths[0].starts_with(&dir)),
    }
}

/// HCCL's types against docs/cann/HCCL.md section 3: the 4108-byte root info, and the enum values.
#[test]
fn hccl_types_match_hccl_md() {
    assert_eq!(size_of::<HcclRootInfo>(), 4108);
    assert_eq!(std::mem::align_of::<HcclRootInfo>(), 1);
    assert_eq!(size_of::<HcclComm>(), size_of::<*mut ()>());
    assert_eq!((size_of::<HcclResult>(), size_of::<HcclDataType>(), size_of::<HcclReduceOp>()), (4, 4, 4));
    assert_values!(HcclResult {
        HCCL_SUCCESS = 0,
        HCCL_E_PARA = 1,
        HCCL_E_PTR = 2,
        HCCL_E_MEMORY = 3,
        HCCL_E_INTERNAL = 4,
        HCCL_E_NOT_SUPPORT = 5,
        HCCL_E_NOT_FOUND = 6,
        HCCL_E_UNAVAIL = 7,
        HCCL_E_SYSCALL = 8,
        HCCL_E_TIMEOUT = 9,
        HCCL_E_OPEN_FILE_FAILURE = 10,
        HCCL_E_TCP_CONNECT = 11,
        HCCL_E_ROCE_CONNECT = 12,
        HCCL_E_TCP_TRANSFER = 13,
        HCCL_E_ROCE_TRANSFER = 14,
        HCCL_E_RUNTIME = 15,
        HCCL_E_DRV = 16,
        HCCL_E_PROFILING = 17,
        HCCL_E_CCE = 18,
        HCCL_E_NETWORK = 19,
        HCCL_E_AGAIN = 20,
        HCCL_E_REMOTE = 21,
        HCCL_E_SUSPENDING = 22,
        HCCL_E_OPRETRY_FAIL = 23,
        HCCL_E_OOM = 24,
    });
    assert_values!(HcclDataType {
        HCCL_DATA_TYPE_INT8 = 0,
        HCCL_DATA_TYPE_INT16 = 1,
        HCCL_DATA_TYPE_INT32 = 2,
        HCCL_DATA_TYPE_FP16 = 3,
        HCCL_DATA_TYPE_FP32 = 4,
        HCCL_DATA_TYPE_INT64 = 5,
        HCCL_DATA_TYPE_UINT64 = 6,
        HCCL_DATA_TYPE_UINT8 = 7,
        HCCL_DATA_TYPE_UINT16 = 8,
        HCCL_DATA_TYPE_UINT32 = 9,
        HCCL_DATA_TYPE_FP64 = 10,
        HCCL_DATA_TYPE_BFP16 = 11,
        HCCL_DATA_TYPE_INT128 = 12,
        HCCL_DATA_TYPE_RESERVED = 255,
    });
    assert_values!(HcclReduceOp {
        HCCL_REDUCE_SUM = 0,
        HCCL_REDUCE_PROD = 1,
        HCCL_REDUCE_MAX = 2,
        HCCL_REDUCE_MIN = 3,
        HCCL_REDUCE_RESERVED = 255,
    });
}
