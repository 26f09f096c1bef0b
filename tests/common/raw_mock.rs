//! One raw session on the mock CANN through `ascend-sys`, for what the safe API cannot express
//! (null or destroyed handles, int32 tensors, private formats, any counter shape, misuse the mock
//! must count as a violation): device tensors made with `aclrtMalloc` + `aclCreateTensor`, the
//! runtime's calls as methods, the violation counters since the session began, and the first
//! operator's nine-tensor call (`Args`, `Case`) that the mock runtime's tests use as their kernel.
//!
//! [`Mock::new`] is a test's own session (it holds `common::mock::lock`, initialises ACL and
//! binds device 0, reset again on drop); [`Mock::in_isolated`] is one inside
//! `common::mock::isolated`, which already holds the lock and checks that nothing leaked.
#![allow(dead_code)]

use std::ffi::{c_void, CStr};
use std::ptr;
use std::sync::{MutexGuard, OnceLock};

use ascend::mock::{self, MockStats};
use ascend_sys::{
    aclDataType, aclFormat, aclOpExecutor, aclTensor, aclrtMemMallocPolicy, aclrtMemcpyKind, aclrtStream, Cann,
};
use half::{bf16, f16};

use crate::common::rng::Rng;

pub const F32: aclDataType = aclDataType::ACL_FLOAT;
pub const F16: aclDataType = aclDataType::ACL_FLOAT16;
pub const BF16: aclDataType = aclDataType::ACL_BF16;
pub const I32: aclDataType = aclDataType::ACL_INT32;

pub use crate::common::data::{INVALID, NULLPTR};
pub const H2D: aclrtMemcpyKind = aclrtMemcpyKind::ACL_MEMCPY_HOST_TO_DEVICE;
pub const D2H: aclrtMemcpyKind = aclrtMemcpyKind::ACL_MEMCPY_DEVICE_TO_HOST;
pub const D2D: aclrtMemcpyKind = aclrtMemcpyKind::ACL_MEMCPY_DEVICE_TO_DEVICE;
pub const ND: aclFormat = aclFormat::ACL_FORMAT_ND;
pub const SENTINEL: f32 = -777.0;

// ---------------------------------------------------------------------------------------------
// Harness

pub fn cann() -> &'static Cann {
    ascend_sys::load_from(mock::toolkit_dir()).expect("the mock CANN loads")
}

/// `aclCreateTensor` of `s` over `data` through `c` (also for threads that hold no [`Mock`]).
pub fn create_tensor(c: &Cann, s: &Spec, data: *mut c_void) -> *mut aclTensor {
    // SAFETY: shape/strides/storage arrays are live for the call and their lengths are passed;
    // the mock copies them and validates `data` against its allocation table.
    unsafe {
        c.nnopbase.aclCreateTensor(
            s.shape.as_ptr(),
            s.shape.len() as u64,
            s.dt,
            s.strides.as_ptr(),
            s.offset,
            s.format,
            s.storage_dims.as_ptr(),
            s.storage_dims.len() as u64,
            data,
        )
    }
}

/// The operator's functions in the mock (which exports every operator).
pub fn bnrb(c: &Cann) -> &'static ascend_sys::OpApi {
    c.operator(&ascend_sys::symbols::BATCH_NORM_REDUCE_BACKWARD).expect("the mock exports aclnnBatchNormReduceBackward")
}

/// One test's session on the mock: holds the serial lock, has ACL initialised and device 0 set on
/// the calling thread (reset again on drop), and remembers the counters at the start.
pub struct Mock {
    pub c: &'static Cann,
    pub base: MockStats,
    /// Tensors made by [`Mock::tensor`] and its forms, released on drop.
    held: Vec<Dev>,
    /// Whether drop resets device 0 (a session of its own; not inside `isolated`).
    own: bool,
    _serial: Option<MutexGuard<'static, ()>>,
}

/// Runs `f` on a raw session ([`Mock::in_isolated`]) inside `common::mock::isolated` (which
/// checks afterwards that nothing leaked and no violation was counted).
pub fn isolated(f: impl FnOnce(&mut Mock)) {
    crate::common::mock::isolated(|_| f(&mut Mock::in_isolated()));
}

impl Mock {
    /// A test's own session: holds `common::mock::lock`, initialises ACL (once per process; an
    /// earlier initialisation by the safe API is fine), clears any fault a failed test left and
    /// binds device 0 on this thread (reset on drop).
    pub fn new() -> Mock {
        let serial = crate::common::mock::lock();
        let mut m = Mock::bind(true);
        m._serial = Some(serial);
        m
    }

    /// [`Mock::new`] and a stream of its own (the test destroys it).
    pub fn with_stream() -> (Mock, aclrtStream) {
        let m = Mock::new();
        let s = m.stream();
        (m, s)
    }

    /// A session inside `common::mock::isolated` (which holds the lock, made a context and so
    /// initialised ACL, and checks for leaks afterwards): binds device 0 on this thread.
    pub fn in_isolated() -> Mock {
        Mock::bind(false)
    }

    fn bind(own: bool) -> Mock {
        let c = cann();
        static INIT: OnceLock<i32> = OnceLock::new();
        // SAFETY: aclInit with a null config path is the documented default initialisation.
        let init = *INIT.get_or_init(|| unsafe { c.acl.aclInit(ptr::null()) });
        assert!(init == 0 || init == 100002, "aclInit: {init}");
        if own {
            mock::clear_faults();
        }
        // SAFETY: device 0 exists on the mock (ASCEND_MOCK_DEVICE_COUNT defaults to 1).
        assert_eq!(unsafe { c.acl.aclrtSetDevice(0) }, 0);
        Mock { c, base: mock::stats(), held: Vec::new(), own, _serial: None }
    }

    /// A contiguous ND device tensor of `dtype` and `shape` holding `bytes` (no memory for none),
    /// released when the session ends.
    pub fn tensor(&mut self, dtype: aclDataType, shape: &[i64], bytes: &[u8]) -> *mut aclTensor {
        self.tensor_in(ND, dtype, shape, bytes)
    }

    /// [`tensor`](Mock::tensor) with storage format `format` (e.g. a private one, NC1HWC0).
    pub fn tensor_in(&mut self, format: aclFormat, dtype: aclDataType, shape: &[i64], bytes: &[u8]) -> *mut aclTensor {
        let mut strides = vec![1i64; shape.len()];
        for d in (0..shape.len().saturating_sub(1)).rev() {
            strides[d] = strides[d + 1] * shape[d + 1].max(1);
        }
        let spec = Spec { dt: dtype, shape: shape.to_vec(), strides, offset: 0, storage_dims: shape.to_vec(), format };
        let mem = if bytes.is_empty() { ptr::null_mut() } else { self.upload(bytes) };
        let t = self.create_tensor(&spec, mem);
        assert!(!t.is_null(), "aclCreateTensor {spec:?}: {}", self.err());
        self.held.push(Dev { t, mem, bytes: bytes.len(), spec });
        t
    }

    /// A contiguous tensor of `dtype` and `shape` holding zeros.
    pub fn zeros(&mut self, dtype: aclDataType, shape: &[i64]) -> *mut aclTensor {
        let n = shape.iter().product::<i64>().max(0) as usize;
        self.tensor(dtype, shape, &encode(dtype, &vec![0.0; n]))
    }

    /// An f32 tensor of `values`.
    pub fn f32s(&mut self, shape: &[i64], values: &[f32]) -> *mut aclTensor {
        self.tensor(F32, shape, &encode(F32, values))
    }

    /// An f32 tensor of `values` in storage format `format`.
    pub fn f32s_in(&mut self, format: aclFormat, shape: &[i64], values: &[f32]) -> *mut aclTensor {
        self.tensor_in(format, F32, shape, &encode(F32, values))
    }

    /// An int32 tensor of `values`.
    pub fn i32s(&mut self, shape: &[i64], values: &[i32]) -> *mut aclTensor {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.tensor(I32, shape, &bytes)
    }

    /// A bf16 tensor of `values` (rounded).
    pub fn bf16s(&mut self, shape: &[i64], values: &[f32]) -> *mut aclTensor {
        self.tensor(BF16, shape, &encode(BF16, values))
    }

    /// The f32 contents of tensor `t` (made by [`tensor`](Mock::tensor)) once the default stream
    /// finished.
    pub fn read_f32(&self, t: *mut aclTensor) -> Vec<f32> {
        let d = self.held.iter().find(|h| h.t == t).expect("a tensor of this session");
        assert_eq!(self.sync(ptr::null_mut()), 0);
        decode(F32, &self.d2h(d.mem, d.bytes))
    }

    /// Destroys an executor that phase 1 made and that is not launched, as the crate does: the
    /// documented `aclSetAclOpExecutorRepeatable` first, which CANN may refuse (561000, e.g.
    /// under `ASCEND_MOCK_REFUSE_REPEATABLE`), then `aclDestroyAclOpExecutor` either way.
    pub fn discard(&self, ex: *mut aclOpExecutor) {
        // SAFETY: a live, unlaunched executor from phase 1.
        unsafe {
            let status = self.c.nnopbase.aclSetAclOpExecutorRepeatable(ex);
            assert!(status == 0 || status == 561000, "aclSetAclOpExecutorRepeatable: {status}");
            assert_eq!(self.c.nnopbase.aclDestroyAclOpExecutor(ex), 0);
        }
    }

    /// Violations counted since the start of the test.
    pub fn violations(&self) -> u64 {
        mock::stats().violations - self.base.violations
    }

    /// The messages of the violations since the start of the test.
    pub fn messages(&self) -> Vec<String> {
        mock::violations_since(self.base.violations)
    }

    /// Asserts the violation count since the start, and that the last message contains `needle`.
    #[track_caller]
    pub fn expect_violations(&self, n: u64, needle: &str) {
        let msgs = self.messages();
        assert_eq!(self.violations(), n, "violations: {msgs:#?}");
        if n > 0 {
            assert!(msgs.last().is_some_and(|m| m.contains(needle)), "no `{needle}` in {msgs:#?}");
        }
    }

    /// The end of a raw test: frees `buffers`, then destroys `streams` (each call must succeed,
    /// its failure naming which), then expects `violations` in all.
    #[track_caller]
    pub fn finish(&self, buffers: &[*mut c_void], streams: &[aclrtStream], violations: u64) {
        for (i, &p) in buffers.iter().enumerate() {
            assert_eq!(self.free(p), 0, "aclrtFree of buffers[{i}]: {}", self.err());
        }
        for (i, &s) in streams.iter().enumerate() {
            assert_eq!(self.destroy_stream(s), 0, "aclrtDestroyStream of streams[{i}]: {}", self.err());
        }
        self.expect_violations(violations, "");
    }

    /// The thread's aclGetRecentErrMsg (consumed), or "".
    pub fn err(&self) -> String {
        recent_error(self.c)
    }

    /// Asserts that the thread's aclGetRecentErrMsg (consumed) contains every needle.
    #[track_caller]
    pub fn expect_err(&self, needles: &[&str]) {
        let msg = self.err();
        for needle in needles {
            assert!(msg.contains(needle), "no `{needle}` in: {msg}");
        }
    }

    pub fn stream(&self) -> aclrtStream {
        let mut s = ptr::null_mut();
        // SAFETY: `s` is a valid out-pointer.
        assert_eq!(unsafe { self.c.acl.aclrtCreateStream(&mut s) }, 0);
        s
    }

    pub fn destroy_stream(&self, s: aclrtStream) -> i32 {
        // SAFETY: the mock validates the handle before using it.
        unsafe { self.c.acl.aclrtDestroyStream(s) }
    }

    pub fn sync(&self, s: aclrtStream) -> i32 {
        // SAFETY: the mock validates the handle before using it.
        unsafe { self.c.acl.aclrtSynchronizeStream(s) }
    }

    pub fn malloc(&self, bytes: usize) -> *mut c_void {
        let mut p = ptr::null_mut();
        // SAFETY: `p` is a valid out-pointer.
        let st = unsafe { self.c.acl.aclrtMalloc(&mut p, bytes, aclrtMemMallocPolicy::ACL_MEM_MALLOC_HUGE_FIRST) };
        assert_eq!(st, 0, "aclrtMalloc({bytes}): {}", self.err());
        p
    }

    pub fn free(&self, p: *mut c_void) -> i32 {
        // SAFETY: the mock looks the pointer up in its table before freeing anything.
        unsafe { self.c.acl.aclrtFree(p) }
    }

    pub fn h2d(&self, dst: *mut c_void, src: &[u8]) -> i32 {
        // SAFETY: reads `src.len()` bytes of `src`; the mock checks the destination range.
        unsafe { self.c.acl.aclrtMemcpy(dst, src.len(), src.as_ptr().cast(), src.len(), H2D) }
    }

    pub fn d2h(&self, src: *const c_void, len: usize) -> Vec<u8> {
        let mut out = vec![0u8; len];
        // SAFETY: writes at most `len` bytes into `out`; the mock checks the source range.
        let st = unsafe { self.c.acl.aclrtMemcpy(out.as_mut_ptr().cast(), len, src, len, D2H) };
        assert_eq!(st, 0, "D2H: {}", self.err());
        out
    }

    /// A synchronous device-to-host copy that may fail: (status, the host buffer, filled with
    /// 0x11 before the call so that a copy that did nothing is told apart).
    pub fn try_d2h(&self, src: *const c_void, len: usize) -> (i32, Vec<u8>) {
        let mut out = vec![0x11u8; len];
        // SAFETY: writes at most `len` bytes into `out`; the mock checks the source range.
        let st = unsafe { self.c.acl.aclrtMemcpy(out.as_mut_ptr().cast(), len, src, len, D2H) };
        (st, out)
    }

    /// Asserts that reading `len` bytes at `src` fails because they are poisoned, copying nothing,
    /// and that the error text contains every needle. Returns the text.
    #[track_caller]
    pub fn expect_poisoned(&self, src: *const c_void, len: usize, needles: &[&str]) -> String {
        let (st, got) = self.try_d2h(src, len);
        let msg = self.err();
        assert_eq!(st, 507053, "reading poisoned bytes: {msg}");
        assert_eq!(got, vec![0x11u8; len], "a failed read copies nothing");
        assert!(msg.starts_with("aclrtMemcpy failed. ERROR: 507053. The copy's source ["), "{msg}");
        for needle in
            ["holds bytes that were never written", "should have written, but it was skipped: "].iter().chain(needles)
        {
            assert!(msg.contains(needle), "no `{needle}` in: {msg}");
        }
        msg
    }

    pub fn poisoned_bytes(&self) -> u64 {
        mock::stats().poisoned_bytes - self.base.poisoned_bytes
    }

    pub fn memset(&self, p: *mut c_void, value: i32, count: usize) -> i32 {
        // SAFETY: the mock checks the range against its allocation table.
        unsafe { self.c.acl.aclrtMemset(p, count, value, count) }
    }

    pub fn upload(&self, bytes: &[u8]) -> *mut c_void {
        let p = self.malloc(bytes.len().max(1));
        assert_eq!(self.h2d(p, bytes), 0);
        p
    }

    pub fn create_tensor(&self, s: &Spec, data: *mut c_void) -> *mut aclTensor {
        create_tensor(self.c, s, data)
    }

    pub fn destroy_tensor(&self, t: *const aclTensor) -> i32 {
        // SAFETY: the mock validates the handle.
        unsafe { self.c.nnopbase.aclDestroyTensor(t) }
    }

    /// A device tensor holding `storage` (encoded to the spec's dtype).
    pub fn dev(&self, spec: &Spec, storage: &[f32]) -> Dev {
        assert_eq!(storage.len() as i64, spec.storage_numel());
        let bytes = encode(spec.dt, storage);
        let mem = if bytes.is_empty() { ptr::null_mut() } else { self.upload(&bytes) };
        let t = self.create_tensor(spec, mem);
        assert!(!t.is_null(), "aclCreateTensor {spec:?}: {}", self.err());
        Dev { t, mem, bytes: bytes.len(), spec: spec.clone() }
    }

    pub fn read(&self, d: &Dev) -> Vec<f32> {
        decode(d.spec.dt, &self.d2h(d.mem, d.bytes))
    }

    pub fn release(&self, d: Dev) {
        assert_eq!(self.destroy_tensor(d.t), 0);
        if !d.mem.is_null() {
            assert_eq!(self.free(d.mem), 0);
        }
    }

    pub fn phase1(&self, a: &Args) -> (i32, u64, *mut aclOpExecutor) {
        let mut ws = u64::MAX;
        let mut ex = ptr::null_mut();
        // SAFETY: the out pointers are valid locals.
        let st = unsafe { self.phase1_to(a, &mut ws, &mut ex) };
        (st, ws, ex)
    }

    /// Phase 1, which must succeed: the workspace size and the executor.
    pub fn phase1_ok(&self, a: &Args) -> (u64, *mut aclOpExecutor) {
        let (st, ws, ex) = self.phase1(a);
        assert_eq!(st, 0, "phase 1: {}", self.err());
        (ws, ex)
    }

    /// Phase 1 writing the workspace size and executor through `ws` and `ex`.
    ///
    /// # Safety
    /// `ws` and `ex` are each null (the mock checks them before writing) or valid for a write.
    /// The handles in `a` are live or deliberately invalid (the mock validates them).
    pub unsafe fn phase1_to(&self, a: &Args, ws: *mut u64, ex: *mut *mut aclOpExecutor) -> i32 {
        bnrb(self.c).aclnnBatchNormReduceBackwardGetWorkspaceSize(
            a.t[0], a.t[1], a.t[2], a.t[3], a.t[4], a.g[0], a.g[1], a.g[2], a.t[5], a.t[6], a.t[7], a.t[8], ws, ex,
        )
    }

    pub fn launch(&self, ws: *mut c_void, size: u64, ex: *mut aclOpExecutor, s: aclrtStream) -> i32 {
        // SAFETY: the mock validates executor, workspace and stream before queueing anything.
        unsafe { bnrb(self.c).aclnnBatchNormReduceBackward(ws, size, ex, s) }
    }

    /// Phase 2 with a fresh workspace of the reported size on `s`, synchronized, workspace freed.
    pub fn launch_sync(&self, size: u64, ex: *mut aclOpExecutor, s: aclrtStream) -> i32 {
        let ws = if size > 0 { self.malloc(size as usize) } else { ptr::null_mut() };
        let st = self.launch(ws, size, ex, s);
        assert_eq!(st, 0, "phase 2: {}", self.err());
        let st = self.sync(s);
        if !ws.is_null() {
            assert_eq!(self.free(ws), 0);
        }
        st
    }

    /// Phase 1 must succeed; then phase 2 runs (consuming the executor) on the default stream.
    #[track_caller]
    pub fn expect_ok(&self, a: &Args) {
        let (st, ws, ex) = self.phase1(a);
        assert_eq!(st, 0, "phase 1: {}", self.err());
        assert_eq!(self.launch_sync(ws, ex, ptr::null_mut()), 0, "{}", self.err());
    }

    /// Phase 1 must fail with `status` and a message containing `needle`, creating no executor.
    #[track_caller]
    pub fn expect_status(&self, a: &Args, status: i32, needle: &str) {
        let before = mock::stats().live_executors;
        let (st, _, ex) = self.phase1(a);
        let msg = self.err();
        assert_eq!(st, status, "status; message: {msg}");
        assert!(ex.is_null());
        assert_eq!(mock::stats().live_executors, before);
        assert!(msg.contains("aclnnBatchNormReduceBackwardGetWorkspaceSize failed. ERROR: "), "{msg}");
        assert!(msg.contains(&status.to_string()) && msg.contains(needle), "`{needle}` not in: {msg}");
    }
}

impl Drop for Mock {
    fn drop(&mut self) {
        if !self.held.is_empty() {
            // The work queued on the held tensors finishes before they are released.
            self.sync(ptr::null_mut());
        }
        for d in std::mem::take(&mut self.held) {
            self.destroy_tensor(d.t);
            if !d.mem.is_null() {
                self.free(d.mem);
            }
        }
        if !self.own {
            return;
        }
        mock::clear_faults();
        // SAFETY: balances the aclrtSetDevice of `new`.
        let st = unsafe { self.c.acl.aclrtResetDevice(0) };
        if !std::thread::panicking() {
            assert_eq!(st, 0, "aclrtResetDevice");
        }
    }
}

/// A tensor description: view (shape, strides, offset in elements) over a 1-D storage.
#[derive(Clone, Debug)]
pub struct Spec {
    pub dt: aclDataType,
    pub shape: Vec<i64>,
    pub strides: Vec<i64>,
    pub offset: i64,
    pub storage_dims: Vec<i64>,
    pub format: aclFormat,
}

impl Spec {
    pub fn contiguous(dt: aclDataType, shape: &[i64]) -> Spec {
        let strides = contiguous_strides(shape);
        Spec { dt, shape: shape.to_vec(), strides, offset: 0, storage_dims: shape.to_vec(), format: ND }
    }

    pub fn strided(dt: aclDataType, shape: &[i64], strides: &[i64], offset: i64, storage: i64) -> Spec {
        Spec { dt, shape: shape.to_vec(), strides: strides.to_vec(), offset, storage_dims: vec![storage], format: ND }
    }

    pub fn with_format(mut self, format: aclFormat) -> Spec {
        self.format = format;
        self
    }

    pub fn storage_numel(&self) -> i64 {
        self.storage_dims.iter().product()
    }

    /// Storage index of the element at multi-index `idx`.
    pub fn pos(&self, idx: &[i64]) -> usize {
        (self.offset + idx.iter().zip(&self.strides).map(|(i, s)| i * s).sum::<i64>()) as usize
    }

    /// Storage index of the linear-th element (row-major over the view).
    pub fn pos_linear(&self, mut linear: i64) -> usize {
        let mut pos = self.offset;
        for k in (0..self.shape.len()).rev() {
            pos += (linear % self.shape[k]) * self.strides[k];
            linear /= self.shape[k];
        }
        pos as usize
    }
}

pub fn contiguous_strides(shape: &[i64]) -> Vec<i64> {
    let mut strides = vec![1i64; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1];
    }
    strides
}

pub fn f32_spec(shape: &[i64]) -> Spec {
    Spec::contiguous(aclDataType::ACL_FLOAT, shape)
}

pub struct Dev {
    pub t: *mut aclTensor,
    pub mem: *mut c_void,
    pub bytes: usize,
    pub spec: Spec,
}

/// The 14 arguments of phase 1 (tensors in declaration order: gradOut, input, mean, invstd,
/// weight, sumDy, sumDyXmu, gradWeight, gradBias).
#[derive(Clone, Copy)]
pub struct Args {
    pub t: [*mut aclTensor; 9],
    pub g: [bool; 3],
}

pub fn encode(dt: aclDataType, v: &[f32]) -> Vec<u8> {
    match dt {
        aclDataType::ACL_FLOAT => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        aclDataType::ACL_FLOAT16 => v.iter().flat_map(|x| f16::from_f32(*x).to_le_bytes()).collect(),
        aclDataType::ACL_BF16 => v.iter().flat_map(|x| bf16::from_f32(*x).to_le_bytes()).collect(),
        aclDataType::ACL_INT32 => v.iter().flat_map(|x| (*x as i32).to_le_bytes()).collect(),
        other => panic!("unsupported test dtype {other:?}"),
    }
}

pub fn decode(dt: aclDataType, b: &[u8]) -> Vec<f32> {
    match dt {
        aclDataType::ACL_FLOAT => b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect(),
        aclDataType::ACL_FLOAT16 => {
            b.chunks_exact(2).map(|c| f16::from_le_bytes(c.try_into().unwrap()).to_f32()).collect()
        }
        aclDataType::ACL_BF16 => {
            b.chunks_exact(2).map(|c| bf16::from_le_bytes(c.try_into().unwrap()).to_f32()).collect()
        }
        other => panic!("unsupported test dtype {other:?}"),
    }
}

/// Rounds f32 values through a dtype (what the device holds after an upload).
pub fn quantize(dt: aclDataType, v: &[f32]) -> Vec<f32> {
    decode(dt, &encode(dt, v))
}

/// The standard set of nine tensors for a contiguous f32 case of `shape`, all values given.
pub struct Case {
    pub devs: Vec<Dev>,
}

impl Case {
    /// gradOut/input of `shape` (dtype `dt`), mean/invstd/weight [C] and four outputs [C], f32
    /// unless said otherwise, outputs filled with SENTINEL.
    pub fn new(m: &Mock, dt: aclDataType, shape: &[i64], dy: &[f32], x: &[f32], mean: &[f32], invstd: &[f32]) -> Case {
        let c = shape[1];
        let stat = f32_spec(&[c]);
        let specs = [
            Spec::contiguous(dt, shape),
            Spec::contiguous(dt, shape),
            stat.clone(),
            stat.clone(),
            stat.clone(),
            stat.clone(),
            stat.clone(),
            stat.clone(),
            stat,
        ];
        Case::from_specs(m, specs, dy, x, mean, invstd)
    }

    pub fn from_specs(m: &Mock, specs: [Spec; 9], dy: &[f32], x: &[f32], mean: &[f32], invstd: &[f32]) -> Case {
        let mut devs = Vec::new();
        for (i, spec) in specs.iter().enumerate() {
            let n = spec.storage_numel() as usize;
            let data: Vec<f32> = match i {
                0 => dy.to_vec(),
                1 => x.to_vec(),
                2 => mean.to_vec(),
                3 => invstd.to_vec(),
                4 => vec![3.0; n],
                _ => vec![SENTINEL; n],
            };
            devs.push(m.dev(spec, &data));
        }
        Case { devs }
    }

    pub fn args(&self) -> Args {
        let mut t = [ptr::null_mut(); 9];
        for (slot, d) in t.iter_mut().zip(&self.devs) {
            *slot = d.t;
        }
        Args { t, g: [true; 3] }
    }

    pub fn outputs(&self, m: &Mock) -> [Vec<f32>; 4] {
        [m.read(&self.devs[5]), m.read(&self.devs[6]), m.read(&self.devs[7]), m.read(&self.devs[8])]
    }

    pub fn release(self, m: &Mock) {
        for d in self.devs {
            m.release(d);
        }
    }
}

/// The ops-nn UT's standard input: [2,3,1,4] in U(-8,8), mean [-2,2,1], invstd [0.125,0.1,0.3].
pub fn ut_case(m: &Mock, dt: aclDataType) -> Case {
    let mut rng = Rng::new(0x5EED);
    let v = rng.vec_f32(24, -8.0, 8.0);
    Case::new(m, dt, &[2, 3, 1, 4], &v, &v, &[-2.0, 2.0, 1.0], &[0.125, 0.1, 0.3])
}

/// Runs `f` on a session of its own with `ut_case(dt)` and a list for the tensors [`swap`]
/// makes; then releases them all and expects `violations` violations in all (with no message
/// left unchecked).
pub fn with_ut_case(dt: aclDataType, violations: u64, f: impl FnOnce(&Mock, &Case, &mut Vec<Dev>)) {
    let m = Mock::new();
    let case = ut_case(&m, dt);
    let mut extra = Vec::new();
    f(&m, &case, &mut extra);
    for d in extra {
        m.release(d);
    }
    case.release(&m);
    m.expect_violations(violations, "");
}

/// Replaces tensor `slot` of a case by a fresh tensor of `spec` (kept alive in `extra`).
pub fn swap(m: &Mock, a: &mut Args, slot: usize, spec: &Spec, extra: &mut Vec<Dev>) {
    let d = m.dev(spec, &vec![0.5; spec.storage_numel() as usize]);
    a.t[slot] = d.t;
    extra.push(d);
}

/// `p` moved by `bytes` (device addresses are only passed to the mock, never dereferenced here).
pub fn at(p: *mut c_void, bytes: usize) -> *mut c_void {
    p.cast::<u8>().wrapping_add(bytes).cast()
}

/// The mock's algorithm in Rust: f32, sequential within blocks of 256 elements per channel,
/// blocks added in order; then sumDyXmu = Σdy·x − mean·Σdy, gradWeight = sumDyXmu·invstd.
/// `dy`/`x` are storages (already rounded through their dtype); mean/invstd per channel.
pub fn replica(
    dys: &Spec,
    dy: &[f32],
    xs: &Spec,
    x: &[f32],
    mean: &[f32],
    invstd: &[f32],
    c: usize,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let shape = &dys.shape;
    let total: i64 = shape.iter().product();
    let mut blk = vec![0f32; 2 * c];
    let mut cnt = vec![0u32; c];
    let mut tot = vec![0f32; 2 * c];
    let mut idx = vec![0i64; shape.len()];
    for _ in 0..total {
        let ch = idx[1] as usize;
        let vd = dy[dys.pos(&idx)];
        let vx = x[xs.pos(&idx)];
        let prod = vd * vx;
        blk[2 * ch] += vd;
        blk[2 * ch + 1] += prod;
        cnt[ch] += 1;
        if cnt[ch] == 256 {
            tot[ch] += blk[2 * ch];
            tot[c + ch] += blk[2 * ch + 1];
            blk[2 * ch] = 0.0;
            blk[2 * ch + 1] = 0.0;
            cnt[ch] = 0;
        }
        for d in (0..shape.len()).rev() {
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    for ch in 0..c {
        if cnt[ch] > 0 {
            tot[ch] += blk[2 * ch];
            tot[c + ch] += blk[2 * ch + 1];
        }
    }
    let sum_dy = tot[..c].to_vec();
    let xmu: Vec<f32> = (0..c).map(|ch| tot[c + ch] - mean[ch] * tot[ch]).collect();
    let gw: Vec<f32> = (0..c).map(|ch| xmu[ch] * invstd[ch]).collect();
    (sum_dy, xmu, gw)
}

/// The thread's aclGetRecentErrMsg of toolkit `c` (consumed), or "".
pub fn recent_error(c: &Cann) -> String {
    // SAFETY: returns null or a NUL-terminated string valid until the next call on this thread.
    unsafe {
        let p = c.acl.aclGetRecentErrMsg();
        if p.is_null() {
            String::new()
        } else {
            CStr::from_ptr(p).to_string_lossy().into_owned()
        }
    }
}
