//! The HCCL result layer: one function per HCCL call, each turning its `HcclResult` into a
//! [`Result`] (with `HcclGetErrorString`'s text when the library has it). Every call needs the
//! device of its communicator bound to the thread first. The safe API is [`crate::hccl`].

use std::ffi::{c_void, CStr};

use ascend_sys::{aclrtStream, Hccl, HcclComm, HcclDataType, HcclReduceOp, HcclResult, HcclRootInfo, LoadError};

use super::op_fn;
use crate::error::{Error, Result};

/// Turns an `HcclResult` into a `Result`, with `HcclGetErrorString`'s text when the library has it.
pub(crate) fn check(hccl: &Hccl, call: &'static str, r: HcclResult) -> Result<()> {
    if r == HcclResult::HCCL_SUCCESS {
        return Ok(());
    }
    let text = hccl.HcclGetErrorString.as_ref().ok().and_then(|f| {
        // SAFETY: HcclGetErrorString takes a code and returns null or a static NUL-terminated
        // string (docs/cann/HCCL.md 4.7); it is copied out at once.
        let p = unsafe { f(r) };
        // SAFETY: as above, non-null means a valid C string.
        (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    });
    Err(Error::hccl(call, r.0, text.unwrap_or_default()))
}

/// A function of [`HCCL_OPTIONAL_SYMBOLS`](ascend_sys::symbols::HCCL_OPTIONAL_SYMBOLS), which
/// `libhccl.so` may lack: absent, it is a load error ([`LoadError::Symbol`]) naming the library,
/// the function and `why` it may be missing, as a missing required function is when HCCL loads.
fn optional<'f, F>(f: &'f std::result::Result<F, libloading::Error>, call: &'static str, why: &str) -> Result<&'f F> {
    f.as_ref()
        .map_err(|e| Error::Load(LoadError::missing_symbol(ascend_sys::loader::HCCL, call, format!("{e}; {why}"))))
}

/// `HcclGetRootInfo`.
pub(crate) fn get_root_info(hccl: &Hccl) -> Result<HcclRootInfo> {
    let f = op_fn(&hccl.HcclGetRootInfo, "HcclGetRootInfo")?;
    let mut root = HcclRootInfo { internal: [0; std::mem::size_of::<HcclRootInfo>()] };
    // SAFETY: `root` is a writable HcclRootInfo (4108 bytes, checked by the ABI tests).
    check(hccl, "HcclGetRootInfo", unsafe { f(&mut root) })?;
    Ok(root)
}

/// `HcclCommInitAll`: one communicator per device of `ids`.
pub(crate) fn comm_init_all(hccl: &Hccl, ids: &mut [i32]) -> Result<Vec<HcclComm>> {
    let f = op_fn(&hccl.HcclCommInitAll, "HcclCommInitAll")?;
    let n = u32::try_from(ids.len()).map_err(|_| Error::invalid("contexts", "too many ranks"))?;
    let mut raw: Vec<HcclComm> = vec![std::ptr::null_mut(); ids.len()];
    // SAFETY: `ids` holds `n` device ids and `raw` room for `n` handles (docs/cann/HCCL.md 4.5.2).
    check(hccl, "HcclCommInitAll", unsafe { f(n, ids.as_mut_ptr(), raw.as_mut_ptr()) })?;
    Ok(raw)
}

/// `HcclCommInitRootInfo`: blocks until every rank has joined.
pub(crate) fn comm_init_root_info(hccl: &Hccl, n: u32, root: &HcclRootInfo, rank: u32) -> Result<HcclComm> {
    let f = op_fn(&hccl.HcclCommInitRootInfo, "HcclCommInitRootInfo")?;
    let mut raw: HcclComm = std::ptr::null_mut();
    // SAFETY: `root` is a readable 4108-byte HcclRootInfo and `raw` a writable handle. HCCL reads
    // the root as data (the root's address and ids): no pointer in it is dereferenced.
    check(hccl, "HcclCommInitRootInfo", unsafe { f(n, root, rank, &mut raw) })?;
    Ok(raw)
}

/// `HcclCommInitClusterInfo(path, rank)`: blocks until every rank has joined.
pub(crate) fn comm_init_cluster_info(hccl: &Hccl, path: &CStr, rank: u32) -> Result<HcclComm> {
    let f = op_fn(&hccl.HcclCommInitClusterInfo, "HcclCommInitClusterInfo")?;
    let mut raw: HcclComm = std::ptr::null_mut();
    // SAFETY: `path` is a NUL-terminated string and `raw` a writable handle.
    check(hccl, "HcclCommInitClusterInfo", unsafe { f(path.as_ptr(), rank, &mut raw) })?;
    Ok(raw)
}

/// `HcclGetRankId` and `HcclGetRankSize`: the communicator's rank and size.
///
/// # Safety
/// `comm` is a live communicator.
pub(crate) unsafe fn rank_and_size(hccl: &Hccl, comm: HcclComm) -> Result<(u32, u32)> {
    let get_rank = op_fn(&hccl.HcclGetRankId, "HcclGetRankId")?;
    let get_size = op_fn(&hccl.HcclGetRankSize, "HcclGetRankSize")?;
    let (mut rank, mut size) = (0u32, 0u32);
    // SAFETY: `comm` is live (this function's contract); the out-pointer is writable.
    check(hccl, "HcclGetRankId", unsafe { get_rank(comm, &mut rank) })?;
    // SAFETY: as above.
    check(hccl, "HcclGetRankSize", unsafe { get_size(comm, &mut size) })?;
    Ok((rank, size))
}

/// `HcclGetCommAsyncError`: the communicator's asynchronous error (`HCCL_SUCCESS` when healthy).
/// An HCCL without the function (before 2023, and Ascend 950) is an [`Error::Load`] naming it.
///
/// # Safety
/// `comm` is a live communicator.
pub(crate) unsafe fn comm_async_error(hccl: &Hccl, comm: HcclComm) -> Result<HcclResult> {
    let f = *optional(&hccl.HcclGetCommAsyncError, "HcclGetCommAsyncError", "HCCL before 2023 and Ascend 950 lack it")?;
    let mut code = HcclResult::HCCL_SUCCESS;
    // SAFETY: `comm` is live (this function's contract) and `code` a writable HcclResult.
    check(hccl, "HcclGetCommAsyncError", unsafe { f(comm, &mut code) })?;
    Ok(code)
}

/// The HCCL calls whose only result is their status: each `unsafe fn $name(hccl, args)` finds
/// `$call` in `hccl` and checks what it returns for the arguments listed after it.
macro_rules! status_calls {
    ($(
        $(#[$doc:meta])*
        fn $name:ident($($arg:ident: $ty:ty),* $(,)?) => $call:ident($($pass:expr),* $(,)?);
    )*) => {$(
        $(#[$doc])*
        pub(crate) unsafe fn $name(hccl: &Hccl, $($arg: $ty),*) -> Result<()> {
            let f = op_fn(&hccl.$call, stringify!($call))?;
            // SAFETY: the caller keeps this function's contract (its `# Safety`), which is the
            // call's.
            check(hccl, stringify!($call), unsafe { f($($pass),*) })
        }
    )*};
}

status_calls! {
    /// `HcclCommDestroy`.
    ///
    /// # Safety
    /// `comm` is a live communicator whose collectives have finished, never used afterwards.
    fn comm_destroy(comm: HcclComm) => HcclCommDestroy(comm);

    /// `HcclAllReduce` in place (send = receive, which HCCL supports) of `count` elements at `buf`
    /// on `stream`.
    ///
    /// # Safety
    /// `buf` addresses `count` contiguous elements of `dtype` in device memory that stays allocated
    /// until the collective has run on `stream`; `comm` and `stream` are live on the bound device.
    fn all_reduce(
        buf: *mut c_void, count: u64, dtype: HcclDataType, op: HcclReduceOp, comm: HcclComm, stream: aclrtStream,
    ) => HcclAllReduce(buf, buf, count, dtype, op, comm, stream);

    /// `HcclAllGather` of `count` elements from `src` into `dst` (ranks × `count`) on `stream`.
    ///
    /// # Safety
    /// `src` holds `count` and `dst` ranks × `count` contiguous elements of `dtype` in device memory
    /// that stays allocated until the collective has run on `stream`; `comm` and `stream` are live on
    /// the bound device.
    fn all_gather(
        src: *mut c_void, dst: *mut c_void, count: u64, dtype: HcclDataType, comm: HcclComm, stream: aclrtStream,
    ) => HcclAllGather(src, dst, count, dtype, comm, stream);

    /// `HcclBroadcast` of `count` elements at `buf` from rank `root` on `stream`.
    ///
    /// # Safety
    /// As [`all_reduce`]; `root` is below the communicator's size.
    fn broadcast(
        buf: *mut c_void, count: u64, dtype: HcclDataType, root: u32, comm: HcclComm, stream: aclrtStream,
    ) => HcclBroadcast(buf, count, dtype, root, comm, stream);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A missing optional HCCL function is a load error naming the library and the function (it
    /// was `Error::Config`, which says the caller configured something wrong).
    #[test]
    fn a_missing_optional_function_is_a_load_error_naming_it() {
        let absent: std::result::Result<unsafe extern "C" fn(), libloading::Error> =
            Err(libloading::Error::DlSymUnknown);
        let err = optional(&absent, "HcclGetCommAsyncError", "HCCL before 2023 lacks it").unwrap_err();
        match &err {
            Error::Load(LoadError::Symbol { library, symbol, reason, .. }) => {
                assert_eq!((library.as_str(), symbol.as_str()), (ascend_sys::loader::HCCL, "HcclGetCommAsyncError"));
                assert!(reason.contains("HCCL before 2023 lacks it"), "{reason}");
            }
            other => panic!("expected Error::Load(LoadError::Symbol), got {other:?}"),
        }
        assert_eq!(err.status(), None);
        let present: std::result::Result<u8, libloading::Error> = Ok(7);
        assert_eq!(optional(&present, "HcclGetCommAsyncError", "").ok(), Some(&7));
    }
}
