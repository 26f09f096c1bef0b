//! bindgen output for `wrapper.h` (regenerate with `scripts/generate-bindings.sh`).
//!
//! `types` holds the types and enums; `ascendcl`, `nnopbase` and `opapi` each hold one
//! dynamically loaded library as a struct of function pointers.
#![allow(non_camel_case_types, non_snake_case, non_upper_case_globals, dead_code)]
#![allow(clippy::all, clippy::undocumented_unsafe_blocks, missing_docs, unsafe_op_in_unsafe_fn)]

/// Types, handles and enums.
pub mod types {
    #[cfg(not(ascend_sys_generated))]
    include!("types.rs");
    #[cfg(ascend_sys_generated)]
    include!(concat!(env!("OUT_DIR"), "/bindings/types.rs"));
}

/// `libascendcl.so`: the ACL runtime.
pub mod ascendcl {
    use super::types::*;
    #[cfg(not(ascend_sys_generated))]
    include!("ascendcl.rs");
    #[cfg(ascend_sys_generated)]
    include!(concat!(env!("OUT_DIR"), "/bindings/ascendcl.rs"));
}

/// `libascendcl.so`'s graph capture functions (each optional: toolkits before CANN 8.2 lack them).
pub mod capture {
    use super::types::*;
    #[cfg(not(ascend_sys_generated))]
    include!("capture.rs");
    #[cfg(ascend_sys_generated)]
    include!(concat!(env!("OUT_DIR"), "/bindings/capture.rs"));
}

/// `libnnopbase.so`: aclnn tensors and executors.
pub mod nnopbase {
    use super::types::*;
    #[cfg(not(ascend_sys_generated))]
    include!("nnopbase.rs");
    #[cfg(ascend_sys_generated)]
    include!(concat!(env!("OUT_DIR"), "/bindings/nnopbase.rs"));
}

/// `libopapi.so` / `libopapi_nn.so`: the operator.
pub mod opapi {
    use super::types::*;
    #[cfg(not(ascend_sys_generated))]
    include!("opapi.rs");
    #[cfg(ascend_sys_generated)]
    include!(concat!(env!("OUT_DIR"), "/bindings/opapi.rs"));
}

/// `libhccl.so`: collectives (each function optional at load; the loader checks the required ones).
pub mod hccl {
    use super::types::*;
    #[cfg(not(ascend_sys_generated))]
    include!("hccl.rs");
    #[cfg(ascend_sys_generated)]
    include!(concat!(env!("OUT_DIR"), "/bindings/hccl.rs"));
}

pub use ascendcl::AscendCl;
pub use capture::AclCapture;
pub use hccl::Hccl;
pub use nnopbase::NnOpBase;
pub use opapi::OpApi;
pub use types::*;
