//! Status codes returned by CANN, by name (docs/cann/API.md section 4), and [`name`] to look one up;
//! HCCL's `HcclResult` names, and [`hccl_name`].
//!
//! aclnn calls return `aclnnStatus` (`int32_t`), runtime calls `aclError` (`int`); both share
//! one number space, so one table serves both. HCCL's results are a number space of their own.

macro_rules! codes {
    ($($(#[$doc:meta])* $name:ident = $value:expr;)*) => {
        $($(#[$doc])* pub const $name: i32 = $value;)*
        /// Every named code, as (value, name).
        pub const ALL: &[(i32, &str)] = &[$(($value, stringify!($name))),*];
    };
}

codes! {
    /// Success (`ACL_SUCCESS`, `ACLNN_SUCCESS`).
    ACL_SUCCESS = 0;
    /// A required pointer argument is null.
    ACLNN_ERR_PARAM_NULLPTR = 161001;
    /// An argument is invalid (dtype, shape, rank, format).
    ACLNN_ERR_PARAM_INVALID = 161002;
    /// The runtime failed under aclnn.
    ACLNN_ERR_RUNTIME_ERROR = 361001;
    /// Internal aclnn error.
    ACLNN_ERR_INNER = 561000;
    /// Shape inference failed.
    ACLNN_ERR_INNER_INFERSHAPE_ERROR = 561001;
    /// Tiling failed.
    ACLNN_ERR_INNER_TILING_ERROR = 561002;
    /// No kernel found (the op binary package may not be installed).
    ACLNN_ERR_INNER_FIND_KERNEL_ERROR = 561003;
    /// Creating the executor failed.
    ACLNN_ERR_INNER_CREATE_EXECUTOR = 561101;
    /// The executor was not transferred.
    ACLNN_ERR_INNER_NOT_TRANS_EXECUTOR = 561102;
    /// A null pointer inside aclnn (e.g. destroying a null executor).
    ACLNN_ERR_INNER_NULLPTR = 561103;
    /// Wrong attribute info size.
    ACLNN_ERR_INNER_WRONG_ATTR_INFO_SIZE = 561104;
    /// Key conflict.
    ACLNN_ERR_INNER_KEY_CONFLICT = 561105;
    /// Invalid implementation mode.
    ACLNN_ERR_INNER_INVALID_IMPL_MODE = 561106;
    /// `ASCEND_OPP_PATH` is not set.
    ACLNN_ERR_INNER_OPP_PATH_NOT_FOUND = 561107;
    /// Loading a JSON file failed.
    ACLNN_ERR_INNER_LOAD_JSON_FAILED = 561108;
    /// A JSON value was not found.
    ACLNN_ERR_INNER_JSON_VALUE_NOT_FOUND = 561109;
    /// A JSON file is malformed.
    ACLNN_ERR_INNER_JSON_FORMAT_INVALID = 561110;
    /// A JSON dtype is invalid.
    ACLNN_ERR_INNER_JSON_DTYPE_INVALID = 561111;
    /// The op kernel package was not found.
    ACLNN_ERR_INNER_OPP_KERNEL_PKG_NOT_FOUND = 561112;

    /// Invalid parameter.
    ACL_ERROR_INVALID_PARAM = 100000;
    /// ACL is not initialised (`aclInit` not called).
    ACL_ERROR_UNINITIALIZE = 100001;
    /// `aclInit` called twice.
    ACL_ERROR_REPEAT_INITIALIZE = 100002;
    /// `aclFinalize` called twice.
    ACL_ERROR_REPEAT_FINALIZE = 100037;
    /// Memory allocation failed.
    ACL_ERROR_BAD_ALLOC = 200000;
    /// API not supported.
    ACL_ERROR_API_NOT_SUPPORT = 200001;
    /// Invalid device.
    ACL_ERROR_INVALID_DEVICE = 200002;
    /// Internal error.
    ACL_ERROR_INTERNAL_ERROR = 500000;
    /// Failure.
    ACL_ERROR_FAILURE = 500001;
    /// Runtime failure.
    ACL_ERROR_RT_FAILURE = 500003;
    /// Driver failure.
    ACL_ERROR_DRV_FAILURE = 500004;

    /// Runtime: invalid parameter.
    ACL_ERROR_RT_PARAM_INVALID = 107000;
    /// Runtime: invalid device id.
    ACL_ERROR_RT_INVALID_DEVICEID = 107001;
    /// Runtime: no current context (device not set on this thread).
    ACL_ERROR_RT_CONTEXT_NULL = 107002;
    /// Runtime: the stream is not in the current context.
    ACL_ERROR_RT_STREAM_CONTEXT = 107003;
    /// Runtime: address not aligned.
    ACL_ERROR_RT_ADDR_UNALIGNED = 107008;
    /// Runtime: invalid handle.
    ACL_ERROR_RT_INVALID_HANDLE = 107017;
    /// Runtime: wait timed out.
    ACL_ERROR_RT_WAIT_TIMEOUT = 107019;
    /// Runtime: task timed out.
    ACL_ERROR_RT_TASK_TIMEOUT = 107020;
    /// Capture: a dependency on work outside the capture.
    ACL_ERROR_RT_CAPTURE_DEPENDENCY = 107024;
    /// Capture: a stream joined into the capture did not join back to the origin before the end.
    ACL_ERROR_RT_STREAM_UNJOINED = 107025;
    /// Capture: the model run instance is being captured.
    ACL_ERROR_RT_MODEL_CAPTURED = 107026;
    /// Capture: the stream is being captured (e.g. a second begin on it).
    ACL_ERROR_RT_STREAM_CAPTURED = 107027;
    /// Capture: the event was recorded inside a capture.
    ACL_ERROR_RT_EVENT_CAPTURED = 107028;
    /// Capture: the stream is not being captured (an end without a begin).
    ACL_ERROR_RT_STREAM_NOT_CAPTURED = 107029;
    /// Capture: the mode is not supported.
    ACL_ERROR_RT_CAPTURE_MODE_NOT_SUPPORT = 107030;
    /// Capture: an implicit dependency on the default stream.
    ACL_ERROR_RT_STREAM_CAPTURE_IMPLICIT = 107031;
    /// Capture: conflicting captures.
    ACL_ERROR_RT_STREAM_CAPTURE_CONFLICT = 107032;
    /// Capture: the capture was ended on a stream other than the one it began on.
    ACL_ERROR_RT_STREAM_CAPTURE_UNMATCHED = 107036;
    /// Capture: the model run instance is running.
    ACL_ERROR_RT_MODEL_RUNNING = 107037;
    /// Capture: ended on a thread other than the one that began (modes other than relaxed).
    ACL_ERROR_RT_STREAM_CAPTURE_WRONG_THREAD = 107038;
    /// Capture: a synchronising call during a capture ("async oper convert to sync oper, stream is
    /// captured", rt_error_codes.h:62).
    ACL_ERROR_RT_CAPTURE_MODE_BLOCK_ASYNC = 107041;
    /// Runtime: feature not supported.
    ACL_ERROR_RT_FEATURE_NOT_SUPPORT = 207000;
    /// Runtime: device memory allocation failed.
    ACL_ERROR_RT_MEMORY_ALLOCATION = 207001;
    /// Runtime: no event resource (the device's events are used up).
    ACL_ERROR_RT_NO_EVENT_RESOURCE = 207007;
    /// Runtime: freeing device memory failed.
    ACL_ERROR_RT_MEMORY_FREE = 207002;
    /// Runtime: no device.
    ACL_ERROR_RT_NO_DEVICE = 207004;
    /// Runtime: resource allocation failed.
    ACL_ERROR_RT_RESOURCE_ALLOC_FAIL = 207005;
    /// Runtime: no permission.
    ACL_ERROR_RT_NO_PERMISSION = 207006;
    /// Runtime: device out of memory.
    ACL_ERROR_RT_DEVICE_OOM = 207018;
    /// Runtime: internal error.
    ACL_ERROR_RT_INTERNAL_ERROR = 507000;
    /// Runtime: task scheduler error.
    ACL_ERROR_RT_TS_ERROR = 507001;
    /// Runtime: AI Core timeout.
    ACL_ERROR_RT_AICORE_TIMEOUT = 507014;
    /// Runtime: AI Core exception.
    ACL_ERROR_RT_AICORE_EXCEPTION = 507015;
    /// Runtime: AI Core trap exception.
    ACL_ERROR_RT_AICORE_TRAP_EXCEPTION = 507016;
    /// Runtime: vector core timeout.
    ACL_ERROR_RT_VECTOR_CORE_TIMEOUT = 507034;
    /// Runtime: vector core exception.
    ACL_ERROR_RT_VECTOR_CORE_EXCEPTION = 507035;
    /// Runtime: stream synchronisation timed out.
    ACL_ERROR_RT_STREAM_SYNC_TIMEOUT = 507046;
    /// Runtime: device memory error.
    ACL_ERROR_RT_DEVICE_MEM_ERROR = 507053;
    /// Runtime: HBM multi-bit ECC error.
    ACL_ERROR_RT_HBM_MULTI_BIT_ECC_ERROR = 507054;
    /// Runtime: driver internal error.
    ACL_ERROR_RT_DRV_INTERNAL_ERROR = 507899;
    /// Runtime: AI CPU internal error.
    ACL_ERROR_RT_AICPU_INTERNAL_ERROR = 507900;
    /// Runtime: socket closed.
    ACL_ERROR_RT_SOCKET_CLOSE = 507901;
}

/// The name of a status code (e.g. `161002` → `"ACLNN_ERR_PARAM_INVALID"`), if it is a known one.
///
/// ```
/// assert_eq!(ascend_sys::status::name(161001), Some("ACLNN_ERR_PARAM_NULLPTR"));
/// assert_eq!(ascend_sys::status::name(1), None);
/// ```
pub fn name(code: i32) -> Option<&'static str> {
    ALL.iter().find(|(v, _)| *v == code).map(|(_, n)| *n)
}

/// The `HcclResult` values that are stable across HCCL versions (docs/cann/HCCL.md 3.2), as
/// (value, name): 0 to 24 in order, and `HCCL_E_IN_STATUS`.
pub const HCCL_RESULTS: &[(u32, &str)] = &[
    (0, "HCCL_SUCCESS"),
    (1, "HCCL_E_PARA"),
    (2, "HCCL_E_PTR"),
    (3, "HCCL_E_MEMORY"),
    (4, "HCCL_E_INTERNAL"),
    (5, "HCCL_E_NOT_SUPPORT"),
    (6, "HCCL_E_NOT_FOUND"),
    (7, "HCCL_E_UNAVAIL"),
    (8, "HCCL_E_SYSCALL"),
    (9, "HCCL_E_TIMEOUT"),
    (10, "HCCL_E_OPEN_FILE_FAILURE"),
    (11, "HCCL_E_TCP_CONNECT"),
    (12, "HCCL_E_ROCE_CONNECT"),
    (13, "HCCL_E_TCP_TRANSFER"),
    (14, "HCCL_E_ROCE_TRANSFER"),
    (15, "HCCL_E_RUNTIME"),
    (16, "HCCL_E_DRV"),
    (17, "HCCL_E_PROFILING"),
    (18, "HCCL_E_CCE"),
    (19, "HCCL_E_NETWORK"),
    (20, "HCCL_E_AGAIN"),
    (21, "HCCL_E_REMOTE"),
    (22, "HCCL_E_SUSPENDING"),
    (23, "HCCL_E_OPRETRY_FAIL"),
    (24, "HCCL_E_OOM"),
    (1041, "HCCL_E_IN_STATUS"),
];

/// The name of an `HcclResult` value (e.g. `9` → `"HCCL_E_TIMEOUT"`), if it is a known one.
///
/// ```
/// assert_eq!(ascend_sys::status::hccl_name(9), Some("HCCL_E_TIMEOUT"));
/// assert_eq!(ascend_sys::status::hccl_name(1000), None);
/// ```
pub fn hccl_name(result: u32) -> Option<&'static str> {
    HCCL_RESULTS.iter().find(|(v, _)| *v == result).map(|(_, n)| *n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_resolve_and_values_are_unique() {
        assert_eq!(name(161001), Some("ACLNN_ERR_PARAM_NULLPTR"));
        assert_eq!(name(161002), Some("ACLNN_ERR_PARAM_INVALID"));
        assert_eq!(name(207001), Some("ACL_ERROR_RT_MEMORY_ALLOCATION"));
        assert_eq!(name(561107), Some("ACLNN_ERR_INNER_OPP_PATH_NOT_FOUND"));
        assert_eq!(name(42), None);
        let mut values: Vec<i32> = ALL.iter().map(|(v, _)| *v).collect();
        values.sort_unstable();
        values.dedup();
        assert_eq!(values.len(), ALL.len());
    }

    #[test]
    fn hccl_names_are_the_bindings_values() {
        use crate::HcclResult;
        for (r, n) in [
            (HcclResult::HCCL_SUCCESS, "HCCL_SUCCESS"),
            (HcclResult::HCCL_E_PARA, "HCCL_E_PARA"),
            (HcclResult::HCCL_E_NOT_SUPPORT, "HCCL_E_NOT_SUPPORT"),
            (HcclResult::HCCL_E_TIMEOUT, "HCCL_E_TIMEOUT"),
            (HcclResult::HCCL_E_REMOTE, "HCCL_E_REMOTE"),
            (HcclResult::HCCL_E_OOM, "HCCL_E_OOM"),
        ] {
            assert_eq!(hccl_name(r.0), Some(n));
        }
        assert_eq!(hccl_name(1041), Some("HCCL_E_IN_STATUS"));
        assert_eq!(hccl_name(25), None);
        assert!(HCCL_RESULTS.iter().take(25).enumerate().all(|(i, (v, _))| *v as usize == i));
    }
}
