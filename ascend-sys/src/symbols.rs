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
    "aclrtDestroyEvent",
    "aclrtRecordEvent",
    "aclrtSynchronizeEvent",
    "aclrtStreamWaitEvent",
];

/// `libnnopbase.so`: aclnn tensors and executors.
pub const NNOPBASE_SYMBOLS: &[&str] =
    &["aclCreateTensor", "aclDestroyTensor", "aclSetAclOpExecutorRepeatable", "aclDestroyAclOpExecutor", "aclnnInit"];

/// `libopapi.so` / `libopapi_nn.so`: the operator's two phases.
pub const OPAPI_SYMBOLS: &[&str] = &["aclnnBatchNormReduceBackwardGetWorkspaceSize", "aclnnBatchNormReduceBackward"];
