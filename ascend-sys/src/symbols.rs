// The functions bound from each library: the allowlists the bindings are generated from (the
// build script includes this file) and the symbols each library must export to load.

/// `libascendcl.so`: the ACL runtime.
pub const ASCENDCL_SYMBOLS: &[&str] = &[
    "aclInit",
    "aclFinalize",
    "aclGetRecentErrMsg",
    "aclrtSetDevice",
    "aclrtResetDevice",
    "aclrtGetDevice",
    "aclrtGetDeviceCount",
    "aclrtSynchronizeDevice",
    "aclrtCreateStream",
    "aclrtDestroyStream",
    "aclrtSynchronizeStream",
    "aclrtMalloc",
    "aclrtFree",
    "aclrtMemcpy",
    "aclrtMemcpyAsync",
    "aclrtMemset",
    "aclrtCreateEvent",
    "aclrtCreateEventWithFlag",
    "aclrtCreateEventExWithFlag",
    "aclrtResetEvent",
    "aclrtDestroyEvent",
    "aclrtRecordEvent",
    "aclrtSynchronizeEvent",
    "aclrtStreamWaitEvent",
    "aclrtCtxSetSysParamOpt",
    "aclrtCtxGetSysParamOpt",
    "aclrtQueryEventStatus",
    "aclrtEventElapsedTime",
    "aclrtMallocHost",
    "aclrtFreeHost",
];

/// `libascendcl.so` functions of graph capture (`aclmdlRI`, acl_rt.h:4710-4795), which toolkits
/// before CANN 8.2 lack: resolved when a capture first needs them, from the library
/// `ASCENDCL_SYMBOLS` came from (docs/cann/CAPTURE.md 1.2).
pub const ASCENDCL_CAPTURE_SYMBOLS: &[&str] = &[
    "aclmdlRICaptureBegin",
    "aclmdlRICaptureGetInfo",
    "aclmdlRICaptureEnd",
    "aclmdlRICaptureThreadExchangeMode",
    "aclmdlRIExecuteAsync",
    "aclmdlRIDestroy",
];

/// `libnnopbase.so`: aclnn tensors and executors.
pub const NNOPBASE_SYMBOLS: &[&str] = &[
    "aclCreateTensor",
    "aclDestroyTensor",
    "aclSetAclOpExecutorRepeatable",
    "aclDestroyAclOpExecutor",
    "aclSetInputTensorAddr",
    "aclSetOutputTensorAddr",
    "aclnnInit",
    "aclCreateBoolArray",
    "aclDestroyBoolArray",
];

/// An aclnn operator: the two functions of its two-phase API, the toolkit header declaring them,
/// and the package whose op library exports it on split installs (CANN 8.5+: `libopapi_nn.so`,
/// `libopapi_math.so`; before, all are in `libopapi.so`). Each operator is resolved when first
/// used, so a toolkit lacking one fails only that operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Operator {
    /// The launch (phase 2), which is also the operator's name, e.g. `aclnnBatchNormStats`.
    pub name: &'static str,
    /// Phase 1, `<name>GetWorkspaceSize`.
    pub phase1: &'static str,
    /// The package: `nn` or `math`.
    pub package: &'static str,
    /// The toolkit header declaring both functions, relative to its include directory, e.g.
    /// `aclnnop/aclnn_batch_norm_stats.h` (`wrapper.h` includes it when it binds the toolkit's
    /// own headers; the `bindgen` build probes for it).
    pub header: &'static str,
}

/// The toolkit headers `wrapper.h` includes besides the operators' own (`Operator::header`),
/// relative to the toolkit's include directory.
pub const BASE_HEADERS: &[&str] = &["acl/acl.h", "aclnn/acl_meta.h", "aclnn/aclnn_base.h", "hccl/hccl.h"];

/// Defines each operator's constant from its name, package and header (phase 1 is always
/// `<name>GetWorkspaceSize`), and `OPERATORS`, the list of them all.
macro_rules! operators {
    ($($constant:ident = $name:literal, $package:literal, $header:literal;)*) => {
        $(
            #[doc = concat!("`", $name, "` (", $package, ").")]
            pub const $constant: Operator = Operator {
                name: $name,
                phase1: concat!($name, "GetWorkspaceSize"),
                package: $package,
                header: $header,
            };
        )*

        /// Every operator bound, each in its package (docs/cann/SYNCBN.md section 1).
        pub const OPERATORS: &[Operator] = &[$($constant),*];
    };
}

operators! {
    BATCH_NORM_REDUCE_BACKWARD = "aclnnBatchNormReduceBackward", "nn", "aclnnop/aclnn_batch_norm_backward_reduce.h";
    BATCH_NORM_STATS = "aclnnBatchNormStats", "math", "aclnnop/aclnn_batch_norm_stats.h";
    BATCH_NORM_GATHER_STATS_WITH_COUNTS =
        "aclnnBatchNormGatherStatsWithCounts", "nn", "aclnnop/aclnn_batch_norm_gather_stats_with_counts.h";
    BATCH_NORM_ELEMT = "aclnnBatchNormElemt", "nn", "aclnnop/aclnn_batch_norm_elemt.h";
    BATCH_NORM_ELEMT_BACKWARD = "aclnnBatchNormElemtBackward", "nn", "aclnnop/aclnn_batch_norm_elemt_backward.h";
    BATCH_NORM = "aclnnBatchNorm", "nn", "aclnnop/aclnn_batch_norm.h";
    BATCH_NORM_BACKWARD = "aclnnBatchNormBackward", "nn", "aclnnop/aclnn_batch_norm_backward.h";
    CAST = "aclnnCast", "math", "aclnnop/aclnn_cast.h";
}

/// `libhccl.so` (and, through it, `libhcomm.so` on CANN 9.x): collectives across devices, loaded
/// only when a communicator is made. Every one must be exported.
pub const HCCL_SYMBOLS: &[&str] = &[
    "HcclGetRootInfo",
    "HcclCommInitRootInfo",
    "HcclCommInitAll",
    "HcclCommInitClusterInfo",
    "HcclCommDestroy",
    "HcclAllReduce",
    "HcclBroadcast",
    "HcclAllGather",
    "HcclGetRankSize",
    "HcclGetRankId",
];

/// `libhccl.so` functions that some releases lack (`HcclGetErrorString` is absent in 8.x headers;
/// `HcclGetCommAsyncError` appeared in 2023 and is unsupported on Ascend 950, docs/cann/HCCL.md 2).
pub const HCCL_OPTIONAL_SYMBOLS: &[&str] = &["HcclGetErrorString", "HcclGetCommAsyncError"];
