//! The committed bindings against the facts in docs/cann/API.md: every enum value, and the
//! sizes of the scalar and handle types the safe layer relies on.

use std::mem::size_of;

use ascend_sys::*;

/// `(enum, variant, value in the bindings, value in the docs)` of each listed variant.
macro_rules! enum_values {
    ($($ty:ident::$variant:ident = $value:expr,)*) => {
        vec![$((stringify!($ty), stringify!($variant), i64::from($ty::$variant.0), $value)),*]
    };
}

/// Every enum value the safe layer relies on, as docs/cann/API.md sections 2.2, 2.3 and 3 and
/// docs/cann/HCCL.md section 3 give them.
fn documented_values() -> Vec<(&'static str, &'static str, i64, i64)> {
    enum_values! {
        aclDataType::ACL_DT_UNDEFINED = -1,
        aclDataType::ACL_FLOAT = 0,
        aclDataType::ACL_FLOAT16 = 1,
        aclDataType::ACL_INT8 = 2,
        aclDataType::ACL_INT32 = 3,
        aclDataType::ACL_UINT8 = 4,
        aclDataType::ACL_INT16 = 6,
        aclDataType::ACL_UINT16 = 7,
        aclDataType::ACL_UINT32 = 8,
        aclDataType::ACL_INT64 = 9,
        aclDataType::ACL_UINT64 = 10,
        aclDataType::ACL_DOUBLE = 11,
        aclDataType::ACL_BOOL = 12,
        aclDataType::ACL_STRING = 13,
        aclDataType::ACL_COMPLEX64 = 16,
        aclDataType::ACL_COMPLEX128 = 17,
        aclDataType::ACL_BF16 = 27,
        aclDataType::ACL_INT4 = 29,
        aclDataType::ACL_UINT1 = 30,
        aclDataType::ACL_COMPLEX32 = 33,
        aclDataType::ACL_HIFLOAT8 = 34,
        aclDataType::ACL_FLOAT8_E5M2 = 35,
        aclDataType::ACL_FLOAT8_E4M3FN = 36,
        aclDataType::ACL_FLOAT8_E8M0 = 37,
        aclDataType::ACL_FLOAT6_E3M2 = 38,
        aclDataType::ACL_FLOAT6_E2M3 = 39,
        aclDataType::ACL_FLOAT4_E2M1 = 40,
        aclDataType::ACL_FLOAT4_E1M2 = 41,
        aclFormat::ACL_FORMAT_UNDEFINED = -1,
        aclFormat::ACL_FORMAT_NCHW = 0,
        aclFormat::ACL_FORMAT_NHWC = 1,
        aclFormat::ACL_FORMAT_ND = 2,
        aclFormat::ACL_FORMAT_NC1HWC0 = 3,
        aclFormat::ACL_FORMAT_FRACTAL_Z = 4,
        aclFormat::ACL_FORMAT_NC1HWC0_C04 = 12,
        aclFormat::ACL_FORMAT_HWCN = 16,
        aclFormat::ACL_FORMAT_NDHWC = 27,
        aclFormat::ACL_FORMAT_FRACTAL_NZ = 29,
        aclFormat::ACL_FORMAT_NCDHW = 30,
        aclFormat::ACL_FORMAT_NDC1HWC0 = 32,
        aclFormat::ACL_FRACTAL_Z_3D = 33,
        aclFormat::ACL_FORMAT_NC = 35,
        aclFormat::ACL_FORMAT_NCL = 47,
        aclFormat::ACL_FORMAT_FRACTAL_NZ_C0_16 = 50,
        aclFormat::ACL_FORMAT_FRACTAL_NZ_C0_32 = 51,
        aclFormat::ACL_FORMAT_FRACTAL_NZ_C0_2 = 52,
        aclFormat::ACL_FORMAT_FRACTAL_NZ_C0_4 = 53,
        aclFormat::ACL_FORMAT_FRACTAL_NZ_C0_8 = 54,
        aclrtMemcpyKind::ACL_MEMCPY_HOST_TO_HOST = 0,
        aclrtMemcpyKind::ACL_MEMCPY_HOST_TO_DEVICE = 1,
        aclrtMemcpyKind::ACL_MEMCPY_DEVICE_TO_HOST = 2,
        aclrtMemcpyKind::ACL_MEMCPY_DEVICE_TO_DEVICE = 3,
        aclrtMemcpyKind::ACL_MEMCPY_DEFAULT = 4,
        aclrtMemcpyKind::ACL_MEMCPY_HOST_TO_BUF_TO_DEVICE = 5,
        aclrtMemcpyKind::ACL_MEMCPY_INNER_DEVICE_TO_DEVICE = 6,
        aclrtMemcpyKind::ACL_MEMCPY_INTER_DEVICE_TO_DEVICE = 7,
        aclrtMemMallocPolicy::ACL_MEM_MALLOC_HUGE_FIRST = 0,
        aclrtMemMallocPolicy::ACL_MEM_MALLOC_HUGE_ONLY = 1,
        aclrtMemMallocPolicy::ACL_MEM_MALLOC_NORMAL_ONLY = 2,
        aclrtMemMallocPolicy::ACL_MEM_MALLOC_HUGE_FIRST_P2P = 3,
        aclrtMemMallocPolicy::ACL_MEM_MALLOC_HUGE_ONLY_P2P = 4,
        aclrtMemMallocPolicy::ACL_MEM_MALLOC_NORMAL_ONLY_P2P = 5,
        aclrtMemMallocPolicy::ACL_MEM_MALLOC_HUGE1G_ONLY = 6,
        aclrtMemMallocPolicy::ACL_MEM_MALLOC_HUGE1G_ONLY_P2P = 7,
        aclrtMemMallocPolicy::ACL_MEM_TYPE_LOW_BAND_WIDTH = 0x100,
        aclrtMemMallocPolicy::ACL_MEM_TYPE_HIGH_BAND_WIDTH = 0x1000,
        aclrtMemMallocPolicy::ACL_MEM_ACCESS_USER_SPACE_READONLY = 0x100000,
        aclmdlRICaptureMode::ACL_MODEL_RI_CAPTURE_MODE_GLOBAL = 0,
        aclmdlRICaptureMode::ACL_MODEL_RI_CAPTURE_MODE_THREAD_LOCAL = 1,
        aclmdlRICaptureMode::ACL_MODEL_RI_CAPTURE_MODE_RELAXED = 2,
        aclmdlRICaptureStatus::ACL_MODEL_RI_CAPTURE_STATUS_NONE = 0,
        aclmdlRICaptureStatus::ACL_MODEL_RI_CAPTURE_STATUS_ACTIVE = 1,
        aclmdlRICaptureStatus::ACL_MODEL_RI_CAPTURE_STATUS_INVALIDATED = 2,
        HcclResult::HCCL_SUCCESS = 0,
        HcclResult::HCCL_E_PARA = 1,
        HcclResult::HCCL_E_PTR = 2,
        HcclResult::HCCL_E_MEMORY = 3,
        HcclResult::HCCL_E_INTERNAL = 4,
        HcclResult::HCCL_E_NOT_SUPPORT = 5,
        HcclResult::HCCL_E_NOT_FOUND = 6,
        HcclResult::HCCL_E_UNAVAIL = 7,
        HcclResult::HCCL_E_SYSCALL = 8,
        HcclResult::HCCL_E_TIMEOUT = 9,
        HcclResult::HCCL_E_OPEN_FILE_FAILURE = 10,
        HcclResult::HCCL_E_TCP_CONNECT = 11,
        HcclResult::HCCL_E_ROCE_CONNECT = 12,
        HcclResult::HCCL_E_TCP_TRANSFER = 13,
        HcclResult::HCCL_E_ROCE_TRANSFER = 14,
        HcclResult::HCCL_E_RUNTIME = 15,
        HcclResult::HCCL_E_DRV = 16,
        HcclResult::HCCL_E_PROFILING = 17,
        HcclResult::HCCL_E_CCE = 18,
        HcclResult::HCCL_E_NETWORK = 19,
        HcclResult::HCCL_E_AGAIN = 20,
        HcclResult::HCCL_E_REMOTE = 21,
        HcclResult::HCCL_E_SUSPENDING = 22,
        HcclResult::HCCL_E_OPRETRY_FAIL = 23,
        HcclResult::HCCL_E_OOM = 24,
        HcclDataType::HCCL_DATA_TYPE_INT8 = 0,
        HcclDataType::HCCL_DATA_TYPE_INT16 = 1,
        HcclDataType::HCCL_DATA_TYPE_INT32 = 2,
        HcclDataType::HCCL_DATA_TYPE_FP16 = 3,
        HcclDataType::HCCL_DATA_TYPE_FP32 = 4,
        HcclDataType::HCCL_DATA_TYPE_INT64 = 5,
        HcclDataType::HCCL_DATA_TYPE_UINT64 = 6,
        HcclDataType::HCCL_DATA_TYPE_UINT8 = 7,
        HcclDataType::HCCL_DATA_TYPE_UINT16 = 8,
        HcclDataType::HCCL_DATA_TYPE_UINT32 = 9,
        HcclDataType::HCCL_DATA_TYPE_FP64 = 10,
        HcclDataType::HCCL_DATA_TYPE_BFP16 = 11,
        HcclDataType::HCCL_DATA_TYPE_INT128 = 12,
        HcclDataType::HCCL_DATA_TYPE_RESERVED = 255,
        HcclReduceOp::HCCL_REDUCE_SUM = 0,
        HcclReduceOp::HCCL_REDUCE_PROD = 1,
        HcclReduceOp::HCCL_REDUCE_MAX = 2,
        HcclReduceOp::HCCL_REDUCE_MIN = 3,
        HcclReduceOp::HCCL_REDUCE_RESERVED = 255,
    }
}

/// Each documented variant of the enum `ty` has its documented value in the bindings.
fn assert_values(ty: &str) {
    let values: Vec<_> = documented_values().into_iter().filter(|v| v.0 == ty).collect();
    assert!(!values.is_empty(), "no documented values of {ty}");
    for (ty, variant, bound, documented) in values {
        assert_eq!(bound, documented, "{ty}::{variant}");
    }
}

#[test]
fn data_type_values_match_api_md() {
    assert_values("aclDataType");
}

#[test]
fn format_values_match_api_md() {
    assert_values("aclFormat");
}

#[test]
fn memcpy_kind_and_malloc_policy_values_match_api_md() {
    assert_values("aclrtMemcpyKind");
    assert_values("aclrtMemMallocPolicy");
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
        Err(e @ ascend_sys::LoadError::Library { .. }) => {
            assert!(e.tried().iter().any(|(p, _)| p.starts_with(dir.to_str().unwrap())), "{e}");
            assert!(e.to_string().contains("libascendcl.so"), "{e}");
        }
        Err(other) => panic!("a missing toolkit is LoadError::Library, got {other:?}"),
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
    assert_values("HcclResult");
    assert_values("HcclDataType");
    assert_values("HcclReduceOp");
}

/// The event declarations `wrapper.h` binds, as `include/external/acl/acl_rt.h` of hicann/runtime
/// @ 681ef761 declares them (its lines 1703-1789, 2872: `ACL_FUNC_VISIBILITY` dropped, spacing
/// normalised), and the event flags of its lines 28-33.
#[test]
fn event_declarations_and_flags_match_acl_rt_h() {
    const ACL_RT_H: &[&str] = &[
        "aclError aclrtCreateEvent(aclrtEvent* event);",
        "aclError aclrtCreateEventWithFlag(aclrtEvent* event, uint32_t flag);",
        "aclError aclrtCreateEventExWithFlag(aclrtEvent* event, uint32_t flag);",
        "aclError aclrtDestroyEvent(aclrtEvent event);",
        "aclError aclrtRecordEvent(aclrtEvent event, aclrtStream stream);",
        "aclError aclrtResetEvent(aclrtEvent event, aclrtStream stream);",
        "aclError aclrtStreamWaitEvent(aclrtStream stream, aclrtEvent event);",
        "aclError aclrtQueryEventStatus(aclrtEvent event, aclrtEventRecordedStatus* status);",
    ];
    assert_declared(ACL_RT_H);
    use ascend_sys::event_flag::*;
    let flags = [
        ("ACL_EVENT_SYNC", ACL_EVENT_SYNC, 0x1),
        ("ACL_EVENT_CAPTURE_STREAM_PROGRESS", ACL_EVENT_CAPTURE_STREAM_PROGRESS, 0x2),
        ("ACL_EVENT_TIME_LINE", ACL_EVENT_TIME_LINE, 0x8),
        ("ACL_EVENT_DEVICE_USE_ONLY", ACL_EVENT_DEVICE_USE_ONLY, 0x10),
        ("ACL_EVENT_EXTERNAL", ACL_EVENT_EXTERNAL, 0x20),
        ("ACL_EVENT_IPC", ACL_EVENT_IPC, 0x40),
    ];
    for (name, value, header) in flags {
        assert_eq!(value, header, "{name}");
        let define = format!("#define {name} 0x{header:08X}U");
        assert!(ascend_sys::WRAPPER_H.lines().any(|l| l.trim() == define), "wrapper.h lacks `{define}`");
    }
    assert_eq!(ascend_sys::status::ACL_ERROR_RT_NO_EVENT_RESOURCE, 207007);
}

/// The bound function types of the event calls (checked by the compiler).
#[allow(dead_code)]
fn event_function_types(acl: &AscendCl) {
    let _: unsafe extern "C" fn(*mut aclrtEvent) -> aclError = acl.aclrtCreateEvent;
    let _: unsafe extern "C" fn(*mut aclrtEvent, u32) -> aclError = acl.aclrtCreateEventWithFlag;
    let _: unsafe extern "C" fn(*mut aclrtEvent, u32) -> aclError = acl.aclrtCreateEventExWithFlag;
    let _: unsafe extern "C" fn(aclrtEvent, aclrtStream) -> aclError = acl.aclrtResetEvent;
    let _: unsafe extern "C" fn(aclrtEvent, aclrtStream) -> aclError = acl.aclrtRecordEvent;
}

/// The BatchNorm pair and the bool-array handles have ops-nn's and nnopbase's prototypes
/// (hicann/ops-nn @ e5c3fa93 `aclnn_batch_norm.h:24,33`, `aclnn_batch_norm_backward.h:25,36`;
/// hicann/opbase `include/nnopbase/aclnn/acl_meta.h:44,52`): each binding coerces to the
/// prototype written out here, argument by argument (a differing type, order or count fails to
/// compile).
#[test]
fn batch_norm_prototypes_match_the_public_headers() {
    type T = *const aclTensor;
    type M = *mut aclTensor;
    type Ex = *mut *mut aclOpExecutor;
    type Launch = unsafe extern "C" fn(*mut std::ffi::c_void, u64, *mut aclOpExecutor, aclrtStream) -> aclnnStatus;
    type Forward = unsafe extern "C" fn(T, T, T, M, M, bool, f64, f64, M, M, M, *mut u64, Ex) -> aclnnStatus;
    type Backward =
        unsafe extern "C" fn(T, T, T, T, T, T, T, bool, f64, *const aclBoolArray, M, M, M, *mut u64, Ex) -> aclnnStatus;
    fn check(api: &OpApi, nn: &NnOpBase) {
        let _: Option<Forward> = api.aclnnBatchNormGetWorkspaceSize.as_ref().ok().copied();
        let _: Option<Launch> = api.aclnnBatchNorm.as_ref().ok().copied();
        let _: Option<Backward> = api.aclnnBatchNormBackwardGetWorkspaceSize.as_ref().ok().copied();
        let _: Option<Launch> = api.aclnnBatchNormBackward.as_ref().ok().copied();
        let _: unsafe extern "C" fn(*const bool, u64) -> *mut aclBoolArray = nn.aclCreateBoolArray;
        let _: unsafe extern "C" fn(*const aclBoolArray) -> aclnnStatus = nn.aclDestroyBoolArray;
    }
    let _ = check;
    assert_eq!(size_of::<aclBoolArray>(), 0, "an opaque handle, only ever behind a pointer");
    let names: Vec<&str> = symbols::OPERATORS.iter().map(|o| o.name).collect();
    assert!(names.contains(&"aclnnBatchNorm") && names.contains(&"aclnnBatchNormBackward"), "{names:?}");
    assert!(symbols::NNOPBASE_SYMBOLS.contains(&"aclCreateBoolArray"));
    assert!(symbols::NNOPBASE_SYMBOLS.contains(&"aclDestroyBoolArray"));
}

/// The capture declarations `wrapper.h` binds, as `include/external/acl/acl_rt.h` of
/// hicann/runtime @ 681ef761 declares them (lines 4710-4795, `ACL_FUNC_VISIBILITY` dropped,
/// spacing normalised; docs/cann/CAPTURE.md 1.1), the enums of its lines 405-417, and the capture
/// statuses of `rt_error_codes.h:45-62`.
#[test]
fn capture_declarations_match_acl_rt_h() {
    const ACL_RT_H: &[&str] = &[
        "aclError aclmdlRICaptureBegin(aclrtStream stream, aclmdlRICaptureMode mode);",
        "aclError aclmdlRICaptureGetInfo(aclrtStream stream, aclmdlRICaptureStatus* status, aclmdlRI* modelRI);",
        "aclError aclmdlRICaptureEnd(aclrtStream stream, aclmdlRI* modelRI);",
        "aclError aclmdlRICaptureThreadExchangeMode(aclmdlRICaptureMode* mode);",
        "aclError aclmdlRIExecuteAsync(aclmdlRI modelRI, aclrtStream stream);",
        "aclError aclmdlRIDestroy(aclmdlRI modelRI);",
    ];
    assert_declared(ACL_RT_H);
    assert_eq!(size_of::<aclmdlRI>(), size_of::<*mut ()>());
    assert_eq!((size_of::<aclmdlRICaptureMode>(), size_of::<aclmdlRICaptureStatus>()), (4, 4));
    assert_values("aclmdlRICaptureMode");
    assert_values("aclmdlRICaptureStatus");
    use ascend_sys::status::*;
    let codes = [
        (ACL_ERROR_RT_CAPTURE_DEPENDENCY, 107024),
        (ACL_ERROR_RT_STREAM_UNJOINED, 107025),
        (ACL_ERROR_RT_STREAM_CAPTURED, 107027),
        (ACL_ERROR_RT_STREAM_NOT_CAPTURED, 107029),
        (ACL_ERROR_RT_STREAM_CAPTURE_IMPLICIT, 107031),
        (ACL_ERROR_RT_STREAM_CAPTURE_UNMATCHED, 107036),
        (ACL_ERROR_RT_STREAM_CAPTURE_WRONG_THREAD, 107038),
        (ACL_ERROR_RT_CAPTURE_MODE_BLOCK_ASYNC, 107041),
    ];
    for (bound, header) in codes {
        assert_eq!(bound, header);
    }
}

/// The bound function types of the capture calls (checked by the compiler); each is optional.
#[allow(dead_code)]
fn capture_function_types(capture: &AclCapture) {
    let _: &Result<unsafe extern "C" fn(aclrtStream, aclmdlRICaptureMode) -> aclError, _> =
        &capture.aclmdlRICaptureBegin;
    let _: &Result<unsafe extern "C" fn(aclrtStream, *mut aclmdlRI) -> aclError, _> = &capture.aclmdlRICaptureEnd;
    let _: &Result<unsafe extern "C" fn(aclmdlRI, aclrtStream) -> aclError, _> = &capture.aclmdlRIExecuteAsync;
    let _: &Result<unsafe extern "C" fn(aclmdlRI) -> aclError, _> = &capture.aclmdlRIDestroy;
}

/// Each of `decls` (as acl_rt.h declares it) is in wrapper.h, spacing normalised.
fn assert_declared(decls: &[&str]) {
    let normalise =
        |s: &str| s.replace(" *", "* ").replace("* *", "**").split_whitespace().collect::<Vec<_>>().join(" ");
    let wrapper: Vec<String> = ascend_sys::WRAPPER_H.lines().map(normalise).collect();
    for decl in decls {
        let decl = normalise(decl);
        assert!(wrapper.contains(&decl), "wrapper.h lacks `{decl}` as acl_rt.h declares it");
    }
}
