//! Tests of the mock CANN toolkit through the raw `ascend-sys` bindings (issue 3):
//!
//! * each kind of misuse counts a violation (and returns CANN's error) — see the `violation_*` tests;
//! * each ops-nn unit case of docs/cann/SEMANTICS.md section 3.2 gets the status ops-nn expects, with
//!   `aclGetRecentErrMsg` text — the `ut_*` tests;
//! * the compute matches a bit-exact replica of the hardware's algorithm and an f64 reference, for
//!   f32/f16/bf16 and strided views — the `values_*` tests;
//! * runtime semantics: streams are queues, events, threads, fault injection.
//!
//! The mock's counters are process-wide, so every test holds `SERIAL` and compares exact deltas.
#![cfg(feature = "mock")]

#[path = "common/self_exec.rs"]
mod self_exec;

use std::ffi::{c_void, CStr};
use std::ptr;
use std::sync::{Mutex, MutexGuard, OnceLock};

use ascend::mock::{self, MockStats};
use ascend_sys::{
    aclDataType, aclFormat, aclOpExecutor, aclTensor, aclrtEvent, aclrtEventRecordedStatus, aclrtMemMallocPolicy,
    aclrtMemcpyKind, aclrtStream, Cann,
};
use half::{bf16, f16};

const NULLPTR: i32 = 161001;
const INVALID: i32 = 161002;
const H2D: aclrtMemcpyKind = aclrtMemcpyKind::ACL_MEMCPY_HOST_TO_DEVICE;
const D2H: aclrtMemcpyKind = aclrtMemcpyKind::ACL_MEMCPY_DEVICE_TO_HOST;
const D2D: aclrtMemcpyKind = aclrtMemcpyKind::ACL_MEMCPY_DEVICE_TO_DEVICE;
const ND: aclFormat = aclFormat::ACL_FORMAT_ND;
const SENTINEL: f32 = -777.0;

// ---------------------------------------------------------------------------------------------
// Harness

static SERIAL: Mutex<()> = Mutex::new(());

fn cann() -> &'static Cann {
    ascend_sys::load_from(mock::toolkit_dir()).expect("the mock CANN loads")
}

/// One test's session on the mock: holds the serial lock, has ACL initialised and device 0 set on
/// the calling thread (reset again on drop), and remembers the counters at the start.
/// The operator's functions in the mock (which exports every operator).
fn bnrb(c: &Cann) -> &'static ascend_sys::OpApi {
    c.operator(&ascend_sys::symbols::BATCH_NORM_REDUCE_BACKWARD).expect("the mock exports aclnnBatchNormReduceBackward")
}

struct Mock {
    c: &'static Cann,
    base: MockStats,
    _serial: MutexGuard<'static, ()>,
}

impl Mock {
    fn new() -> Mock {
        let serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let c = cann();
        static INIT: OnceLock<i32> = OnceLock::new();
        // SAFETY: aclInit with a null config path is the documented default initialisation.
        let init = *INIT.get_or_init(|| unsafe { c.acl.aclInit(ptr::null()) });
        assert_eq!(init, 0, "aclInit");
        mock::clear_faults();
        // SAFETY: device 0 exists on the mock (ASCEND_MOCK_DEVICE_COUNT defaults to 1).
        assert_eq!(unsafe { c.acl.aclrtSetDevice(0) }, 0);
        Mock { c, base: mock::stats(), _serial: serial }
    }

    /// Violations counted since the start of the test.
    fn violations(&self) -> u64 {
        mock::stats().violations - self.base.violations
    }

    /// The messages of the violations since the start of the test.
    fn messages(&self) -> Vec<String> {
        mock::violations_since(self.base.violations)
    }

    /// Asserts the violation count since the start, and that the last message contains `needle`.
    #[track_caller]
    fn expect_violations(&self, n: u64, needle: &str) {
        let msgs = self.messages();
        assert_eq!(self.violations(), n, "violations: {msgs:#?}");
        if n > 0 {
            assert!(msgs.last().is_some_and(|m| m.contains(needle)), "no `{needle}` in {msgs:#?}");
        }
    }

    /// The thread's aclGetRecentErrMsg (consumed), or "".
    fn err(&self) -> String {
        // SAFETY: returns null or a NUL-terminated string valid until the next call on this thread.
        unsafe {
            let p = self.c.acl.aclGetRecentErrMsg();
            if p.is_null() {
                String::new()
            } else {
                CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        }
    }

    fn stream(&self) -> aclrtStream {
        let mut s = ptr::null_mut();
        // SAFETY: `s` is a valid out-pointer.
        assert_eq!(unsafe { self.c.acl.aclrtCreateStream(&mut s) }, 0);
        s
    }

    fn destroy_stream(&self, s: aclrtStream) -> i32 {
        // SAFETY: the mock validates the handle before using it.
        unsafe { self.c.acl.aclrtDestroyStream(s) }
    }

    fn sync(&self, s: aclrtStream) -> i32 {
        // SAFETY: the mock validates the handle before using it.
        unsafe { self.c.acl.aclrtSynchronizeStream(s) }
    }

    fn malloc(&self, bytes: usize) -> *mut c_void {
        let mut p = ptr::null_mut();
        // SAFETY: `p` is a valid out-pointer.
        let st = unsafe { self.c.acl.aclrtMalloc(&mut p, bytes, aclrtMemMallocPolicy::ACL_MEM_MALLOC_HUGE_FIRST) };
        assert_eq!(st, 0, "aclrtMalloc({bytes}): {}", self.err());
        p
    }

    fn free(&self, p: *mut c_void) -> i32 {
        // SAFETY: the mock looks the pointer up in its table before freeing anything.
        unsafe { self.c.acl.aclrtFree(p) }
    }

    fn h2d(&self, dst: *mut c_void, src: &[u8]) -> i32 {
        // SAFETY: reads `src.len()` bytes of `src`; the mock checks the destination range.
        unsafe { self.c.acl.aclrtMemcpy(dst, src.len(), src.as_ptr().cast(), src.len(), H2D) }
    }

    fn d2h(&self, src: *const c_void, len: usize) -> Vec<u8> {
        let mut out = vec![0u8; len];
        // SAFETY: writes at most `len` bytes into `out`; the mock checks the source range.
        let st = unsafe { self.c.acl.aclrtMemcpy(out.as_mut_ptr().cast(), len, src, len, D2H) };
        assert_eq!(st, 0, "D2H: {}", self.err());
        out
    }

    /// A synchronous device-to-host copy that may fail: (status, the host buffer, filled with
    /// 0x11 before the call so that a copy that did nothing is told apart).
    fn try_d2h(&self, src: *const c_void, len: usize) -> (i32, Vec<u8>) {
        let mut out = vec![0x11u8; len];
        // SAFETY: writes at most `len` bytes into `out`; the mock checks the source range.
        let st = unsafe { self.c.acl.aclrtMemcpy(out.as_mut_ptr().cast(), len, src, len, D2H) };
        (st, out)
    }

    /// Asserts that reading `len` bytes at `src` fails because they are poisoned, copying nothing,
    /// and that the error text contains every needle. Returns the text.
    #[track_caller]
    fn expect_poisoned(&self, src: *const c_void, len: usize, needles: &[&str]) -> String {
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

    fn poisoned_bytes(&self) -> u64 {
        mock::stats().poisoned_bytes - self.base.poisoned_bytes
    }

    fn memset(&self, p: *mut c_void, value: i32, count: usize) -> i32 {
        // SAFETY: the mock checks the range against its allocation table.
        unsafe { self.c.acl.aclrtMemset(p, count, value, count) }
    }

    fn upload(&self, bytes: &[u8]) -> *mut c_void {
        let p = self.malloc(bytes.len().max(1));
        assert_eq!(self.h2d(p, bytes), 0);
        p
    }

    fn create_tensor(&self, s: &Spec, data: *mut c_void) -> *mut aclTensor {
        // SAFETY: shape/strides/storage arrays are live for the call and their lengths are passed;
        // the mock copies them and validates `data` against its allocation table.
        unsafe {
            self.c.nnopbase.aclCreateTensor(
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

    fn destroy_tensor(&self, t: *const aclTensor) -> i32 {
        // SAFETY: the mock validates the handle.
        unsafe { self.c.nnopbase.aclDestroyTensor(t) }
    }

    /// A device tensor holding `storage` (encoded to the spec's dtype).
    fn dev(&self, spec: &Spec, storage: &[f32]) -> Dev {
        assert_eq!(storage.len() as i64, spec.storage_numel());
        let bytes = encode(spec.dt, storage);
        let mem = if bytes.is_empty() { ptr::null_mut() } else { self.upload(&bytes) };
        let t = self.create_tensor(spec, mem);
        assert!(!t.is_null(), "aclCreateTensor {spec:?}: {}", self.err());
        Dev { t, mem, bytes: bytes.len(), spec: spec.clone() }
    }

    fn read(&self, d: &Dev) -> Vec<f32> {
        decode(d.spec.dt, &self.d2h(d.mem, d.bytes))
    }

    fn release(&self, d: Dev) {
        assert_eq!(self.destroy_tensor(d.t), 0);
        if !d.mem.is_null() {
            assert_eq!(self.free(d.mem), 0);
        }
    }

    fn phase1(&self, a: &Args) -> (i32, u64, *mut aclOpExecutor) {
        let mut ws = u64::MAX;
        let mut ex = ptr::null_mut();
        // SAFETY: handles are live or deliberately invalid (the mock validates them); the out
        // pointers are valid locals.
        let st = unsafe {
            bnrb(self.c).aclnnBatchNormReduceBackwardGetWorkspaceSize(
                a.t[0], a.t[1], a.t[2], a.t[3], a.t[4], a.g[0], a.g[1], a.g[2], a.t[5], a.t[6], a.t[7], a.t[8],
                &mut ws, &mut ex,
            )
        };
        (st, ws, ex)
    }

    fn launch(&self, ws: *mut c_void, size: u64, ex: *mut aclOpExecutor, s: aclrtStream) -> i32 {
        // SAFETY: the mock validates executor, workspace and stream before queueing anything.
        unsafe { bnrb(self.c).aclnnBatchNormReduceBackward(ws, size, ex, s) }
    }

    /// Phase 2 with a fresh workspace of the reported size on `s`, synchronized, workspace freed.
    fn launch_sync(&self, size: u64, ex: *mut aclOpExecutor, s: aclrtStream) -> i32 {
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
    fn expect_ok(&self, a: &Args) {
        let (st, ws, ex) = self.phase1(a);
        assert_eq!(st, 0, "phase 1: {}", self.err());
        assert_eq!(self.launch_sync(ws, ex, ptr::null_mut()), 0, "{}", self.err());
    }

    /// Phase 1 must fail with `status` and a message containing `needle`, creating no executor.
    #[track_caller]
    fn expect_status(&self, a: &Args, status: i32, needle: &str) {
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
struct Spec {
    dt: aclDataType,
    shape: Vec<i64>,
    strides: Vec<i64>,
    offset: i64,
    storage_dims: Vec<i64>,
    format: aclFormat,
}

impl Spec {
    fn contiguous(dt: aclDataType, shape: &[i64]) -> Spec {
        let strides = contiguous_strides(shape);
        Spec { dt, shape: shape.to_vec(), strides, offset: 0, storage_dims: shape.to_vec(), format: ND }
    }

    fn strided(dt: aclDataType, shape: &[i64], strides: &[i64], offset: i64, storage: i64) -> Spec {
        Spec { dt, shape: shape.to_vec(), strides: strides.to_vec(), offset, storage_dims: vec![storage], format: ND }
    }

    fn with_format(mut self, format: aclFormat) -> Spec {
        self.format = format;
        self
    }

    fn storage_numel(&self) -> i64 {
        self.storage_dims.iter().product()
    }

    /// Storage index of the element at multi-index `idx`.
    fn pos(&self, idx: &[i64]) -> usize {
        (self.offset + idx.iter().zip(&self.strides).map(|(i, s)| i * s).sum::<i64>()) as usize
    }

    /// Storage index of the linear-th element (row-major over the view).
    fn pos_linear(&self, mut linear: i64) -> usize {
        let mut pos = self.offset;
        for k in (0..self.shape.len()).rev() {
            pos += (linear % self.shape[k]) * self.strides[k];
            linear /= self.shape[k];
        }
        pos as usize
    }
}

fn contiguous_strides(shape: &[i64]) -> Vec<i64> {
    let mut strides = vec![1i64; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1];
    }
    strides
}

fn f32_spec(shape: &[i64]) -> Spec {
    Spec::contiguous(aclDataType::ACL_FLOAT, shape)
}

struct Dev {
    t: *mut aclTensor,
    mem: *mut c_void,
    bytes: usize,
    spec: Spec,
}

/// The 14 arguments of phase 1 (tensors in declaration order: gradOut, input, mean, invstd,
/// weight, sumDy, sumDyXmu, gradWeight, gradBias).
#[derive(Clone, Copy)]
struct Args {
    t: [*mut aclTensor; 9],
    g: [bool; 3],
}

fn encode(dt: aclDataType, v: &[f32]) -> Vec<u8> {
    match dt {
        aclDataType::ACL_FLOAT => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        aclDataType::ACL_FLOAT16 => v.iter().flat_map(|x| f16::from_f32(*x).to_le_bytes()).collect(),
        aclDataType::ACL_BF16 => v.iter().flat_map(|x| bf16::from_f32(*x).to_le_bytes()).collect(),
        aclDataType::ACL_INT32 => v.iter().flat_map(|x| (*x as i32).to_le_bytes()).collect(),
        other => panic!("unsupported test dtype {other:?}"),
    }
}

fn decode(dt: aclDataType, b: &[u8]) -> Vec<f32> {
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
fn quantize(dt: aclDataType, v: &[f32]) -> Vec<f32> {
    decode(dt, &encode(dt, v))
}

/// xorshift64* — tiny, deterministic.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [lo, hi).
    fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        let u = (self.next() >> 40) as f32 / (1u64 << 24) as f32;
        lo + (hi - lo) * u
    }

    fn vec(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform(lo, hi)).collect()
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The standard set of nine tensors for a contiguous f32 case of `shape`, all values given.
struct Case {
    devs: Vec<Dev>,
}

impl Case {
    /// gradOut/input of `shape` (dtype `dt`), mean/invstd/weight [C] and four outputs [C], f32
    /// unless said otherwise, outputs filled with SENTINEL.
    fn new(m: &Mock, dt: aclDataType, shape: &[i64], dy: &[f32], x: &[f32], mean: &[f32], invstd: &[f32]) -> Case {
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

    fn from_specs(m: &Mock, specs: [Spec; 9], dy: &[f32], x: &[f32], mean: &[f32], invstd: &[f32]) -> Case {
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

    fn args(&self) -> Args {
        let mut t = [ptr::null_mut(); 9];
        for (slot, d) in t.iter_mut().zip(&self.devs) {
            *slot = d.t;
        }
        Args { t, g: [true; 3] }
    }

    fn outputs(&self, m: &Mock) -> [Vec<f32>; 4] {
        [m.read(&self.devs[5]), m.read(&self.devs[6]), m.read(&self.devs[7]), m.read(&self.devs[8])]
    }

    fn release(self, m: &Mock) {
        for d in self.devs {
            m.release(d);
        }
    }
}

/// The ops-nn UT's standard input: [2,3,1,4] in U(-8,8), mean [-2,2,1], invstd [0.125,0.1,0.3].
fn ut_case(m: &Mock, dt: aclDataType) -> Case {
    let mut rng = Rng(0x5EED);
    let v = rng.vec(24, -8.0, 8.0);
    Case::new(m, dt, &[2, 3, 1, 4], &v, &v, &[-2.0, 2.0, 1.0], &[0.125, 0.1, 0.3])
}

/// Replaces tensor `slot` of a case by a fresh tensor of `spec` (kept alive in `extra`).
fn swap(m: &Mock, a: &mut Args, slot: usize, spec: &Spec, extra: &mut Vec<Dev>) {
    let d = m.dev(spec, &vec![0.5; spec.storage_numel() as usize]);
    a.t[slot] = d.t;
    extra.push(d);
}

// ---------------------------------------------------------------------------------------------
// The documentation's sample (T01)

#[test]
fn values_doc_example() {
    let m = Mock::new();
    let case = Case::new(
        &m,
        aclDataType::ACL_FLOAT,
        &[4, 2],
        &[1., 1., 1., 2., 2., 2., 3., 3.],
        &[0., 1., 2., 3., 4., 5., 6., 7.],
        &[1., 1.],
        &[1., 1.],
    );
    let (st, ws, ex) = m.phase1(&case.args());
    assert_eq!(st, 0);
    assert!(ws > 0, "a non-empty launch reports a workspace");
    assert_eq!(mock::stats().live_executors, m.base.live_executors + 1);
    assert_eq!(m.launch_sync(ws, ex, ptr::null_mut()), 0);
    assert_eq!(mock::stats().live_executors, m.base.live_executors, "phase 2 consumes the executor");
    let [sum_dy, sum_dy_xmu, grad_weight, grad_bias] = case.outputs(&m);
    assert_eq!(sum_dy, [7.0, 8.0]);
    assert_eq!(sum_dy_xmu, [21.0, 30.0]);
    assert_eq!(grad_weight, [21.0, 30.0]);
    assert_eq!(grad_bias, [7.0, 8.0]);
    case.release(&m);
    m.expect_violations(0, "");
}

// ---------------------------------------------------------------------------------------------
// ops-nn unit cases (docs/cann/SEMANTICS.md 3.2): GetWorkspaceSize status and message

#[test]
fn ut_dtypes_f32_f16_bf16_ok() {
    let m = Mock::new();
    for dt in [aclDataType::ACL_FLOAT, aclDataType::ACL_FLOAT16, aclDataType::ACL_BF16] {
        let case = ut_case(&m, dt);
        m.expect_ok(&case.args());
        case.release(&m);
    }
    m.expect_violations(0, "");
}

#[test]
fn ut_int32_grad_and_input_invalid() {
    let m = Mock::new();
    let case = ut_case(&m, aclDataType::ACL_INT32);
    m.expect_status(&case.args(), INVALID, "Tensor gradOut not implemented for DT_INT32");
    case.release(&m);
    m.expect_violations(0, "");
}

#[test]
fn ut_mask_off_output_is_not_checked() {
    let m = Mock::new();
    let case = ut_case(&m, aclDataType::ACL_FLOAT16);
    let mut extra = Vec::new();
    let mut a = case.args();
    // sumDy int32 with inputG = false: OK, and never written
    swap(&m, &mut a, 5, &Spec::contiguous(aclDataType::ACL_INT32, &[3]), &mut extra);
    a.g = [false, true, true];
    m.expect_ok(&a);
    assert_eq!(m.d2h(extra[0].mem, 12), vec![0u8; 12], "a masked-off output is never written");
    assert_eq!(m.read(&case.devs[6]), [SENTINEL; 3], "sumDyXmu is masked off too");
    // NULL masked-off outputs are fine too
    a.t[5] = ptr::null_mut();
    a.t[6] = ptr::null_mut();
    m.expect_ok(&a);
    // gradWeight NC1HWC0 with weightG = false: OK
    let mut b = case.args();
    swap(&m, &mut b, 7, &f32_spec(&[3]).with_format(aclFormat::ACL_FORMAT_NC1HWC0), &mut extra);
    b.g = [true, false, true];
    m.expect_ok(&b);
    // ... but with weightG = true it is a private format
    b.g = [true, true, true];
    m.expect_status(&b, INVALID, "Format of gradWeight does not support NC1HWC0");
    for d in extra {
        m.release(d);
    }
    case.release(&m);
    m.expect_violations(0, "");
}

#[test]
fn ut_formats() {
    let m = Mock::new();
    let mut rng = Rng(7);
    let v = rng.vec(24, -8.0, 8.0);
    for (format, ok) in [
        (aclFormat::ACL_FORMAT_NCHW, true),
        (aclFormat::ACL_FORMAT_NHWC, true),
        (aclFormat::ACL_FORMAT_HWCN, true),
        (aclFormat::ACL_FORMAT_NDHWC, true),
        (aclFormat::ACL_FORMAT_NCDHW, true),
        (aclFormat::ACL_FORMAT_NC1HWC0, false),
        (aclFormat::ACL_FORMAT_FRACTAL_NZ, false),
    ] {
        let s = f32_spec(&[2, 3, 1, 4]).with_format(format);
        let stat = f32_spec(&[3]);
        let specs =
            [s.clone(), s, stat.clone(), stat.clone(), stat.clone(), stat.clone(), stat.clone(), stat.clone(), stat];
        let case = Case::from_specs(&m, specs, &v, &v, &[-2., 2., 1.], &[0.125, 0.1, 0.3]);
        if ok {
            m.expect_ok(&case.args());
        } else {
            m.expect_status(&case.args(), INVALID, "Format of gradOut does not support");
        }
        case.release(&m);
    }
    m.expect_violations(0, "");
}

#[test]
fn ut_empty_input_succeeds_without_writing() {
    let m = Mock::new();
    let c = 3;
    let stat = f32_spec(&[c]);
    let e = f32_spec(&[2, 3, 0, 4]);
    let specs =
        [e.clone(), e, stat.clone(), stat.clone(), stat.clone(), stat.clone(), stat.clone(), stat.clone(), stat];
    let case = Case::from_specs(&m, specs, &[], &[], &[-2., 2., 1.], &[0.125, 0.1, 0.3]);
    assert!(case.devs[0].mem.is_null(), "an empty storage may have null data");
    let (st, ws, ex) = m.phase1(&case.args());
    assert_eq!((st, ws), (0, 0), "{}", m.err());
    assert_eq!(m.launch_sync(ws, ex, ptr::null_mut()), 0);
    for out in case.outputs(&m) {
        assert_eq!(out, [SENTINEL; 3], "A2/A3 leave the outputs of an empty input unwritten");
    }
    assert_eq!(mock::stats().live_executors, m.base.live_executors);
    case.release(&m);
    m.expect_violations(0, "");
}

#[test]
fn ut_rank_outside_2_to_8_invalid() {
    let m = Mock::new();
    let case = ut_case(&m, aclDataType::ACL_FLOAT);
    let mut extra = Vec::new();
    let rank9 = f32_spec(&[2, 3, 1, 4, 1, 1, 1, 1, 1]);
    for slot in [0, 1] {
        let mut a = case.args();
        swap(&m, &mut a, slot, &rank9, &mut extra);
        let name = ["gradOut", "input"][slot];
        m.expect_status(&a, INVALID, &format!("Dim of {name} should be in [2, 8], but got 9"));
    }
    let mut a = case.args();
    swap(&m, &mut a, 0, &f32_spec(&[8]), &mut extra);
    swap(&m, &mut a, 1, &f32_spec(&[8]), &mut extra);
    m.expect_status(&a, INVALID, "Dim of gradOut should be in [2, 8], but got 1");
    // rank 8 is accepted (T21)
    let mut rng = Rng(21);
    let shape = [2, 3, 2, 2, 2, 2, 2, 2];
    let v = rng.vec(384, -1.0, 1.0);
    let big = Case::new(&m, aclDataType::ACL_FLOAT, &shape, &v, &v, &[0.1, 0.2, 0.3], &[1.0, 2.0, 3.0]);
    m.expect_ok(&big.args());
    big.release(&m);
    for d in extra {
        m.release(d);
    }
    case.release(&m);
    m.expect_violations(0, "");
}

#[test]
fn ut_mismatches_invalid() {
    let m = Mock::new();
    let case = ut_case(&m, aclDataType::ACL_FLOAT);
    let mut extra = Vec::new();
    // gradOut f32 with input f16
    let mut a = case.args();
    swap(&m, &mut a, 1, &Spec::contiguous(aclDataType::ACL_FLOAT16, &[2, 3, 1, 4]), &mut extra);
    m.expect_status(&a, INVALID, "Tensor gradOut dtype DT_FLOAT should be the same as tensor input dtype DT_FLOAT16");
    // gradOut ND with input NHWC
    let mut a = case.args();
    swap(&m, &mut a, 1, &f32_spec(&[2, 3, 1, 4]).with_format(aclFormat::ACL_FORMAT_NHWC), &mut extra);
    m.expect_status(&a, INVALID, "Format of gradOut ND should be the same as format of input NHWC");
    // sumDy of shape [5]: invalid with inputG, OK without
    let mut a = case.args();
    swap(&m, &mut a, 5, &f32_spec(&[5]), &mut extra);
    m.expect_status(&a, INVALID, "Expected tensor sumDy to have shape [3], but got [5]");
    a.g = [false, true, true];
    m.expect_ok(&a);
    // mean and invstd may have another (supported) dtype than input; outputs too
    let mut a = case.args();
    swap(&m, &mut a, 2, &Spec::contiguous(aclDataType::ACL_BF16, &[3]), &mut extra);
    swap(&m, &mut a, 8, &Spec::contiguous(aclDataType::ACL_FLOAT16, &[3]), &mut extra);
    m.expect_ok(&a);
    // an unsupported mean dtype
    let mut a = case.args();
    swap(&m, &mut a, 3, &Spec::contiguous(aclDataType::ACL_INT32, &[3]), &mut extra);
    m.expect_status(&a, INVALID, "Tensor invstd not implemented for DT_INT32");
    // channel 0 (T15)
    let mut a = case.args();
    swap(&m, &mut a, 0, &f32_spec(&[4, 0, 3]), &mut extra);
    swap(&m, &mut a, 1, &f32_spec(&[4, 0, 3]), &mut extra);
    m.expect_status(&a, INVALID, "should not be 0");
    for d in extra {
        m.release(d);
    }
    case.release(&m);
    m.expect_violations(0, "");
}

#[test]
fn ut_null_checks_come_first() {
    let m = Mock::new();
    let case = ut_case(&m, aclDataType::ACL_FLOAT);
    let names = ["gradOut", "input", "mean", "invstd", "", "sumDy", "sumDyXmu", "gradWeight", "gradBias"];
    for slot in [0, 1, 2, 3, 5, 6, 7, 8] {
        let mut a = case.args();
        a.t[slot] = ptr::null_mut();
        let needle = format!("Expected a proper Tensor but got null for argument {}.", names[slot]);
        m.expect_status(&a, NULLPTR, &needle);
    }
    // sumDyXmu NULL while gradOut is NC1HWC0: the null check wins
    let mut extra = Vec::new();
    let mut a = case.args();
    swap(&m, &mut a, 0, &f32_spec(&[2, 3, 1, 4]).with_format(aclFormat::ACL_FORMAT_NC1HWC0), &mut extra);
    a.t[6] = ptr::null_mut();
    m.expect_status(&a, NULLPTR, "got null for argument sumDyXmu");
    // weight may be NULL
    let mut a = case.args();
    a.t[4] = ptr::null_mut();
    m.expect_ok(&a);
    // null workspaceSize / executor pointers
    let a = case.args();
    let mut ws = 0u64;
    let mut ex = ptr::null_mut();
    // SAFETY: deliberately null out-pointers; the mock checks them before writing.
    let (st1, st2) = unsafe {
        (
            bnrb(m.c).aclnnBatchNormReduceBackwardGetWorkspaceSize(
                a.t[0],
                a.t[1],
                a.t[2],
                a.t[3],
                a.t[4],
                true,
                true,
                true,
                a.t[5],
                a.t[6],
                a.t[7],
                a.t[8],
                ptr::null_mut(),
                &mut ex,
            ),
            bnrb(m.c).aclnnBatchNormReduceBackwardGetWorkspaceSize(
                a.t[0],
                a.t[1],
                a.t[2],
                a.t[3],
                a.t[4],
                true,
                true,
                true,
                a.t[5],
                a.t[6],
                a.t[7],
                a.t[8],
                &mut ws,
                ptr::null_mut(),
            ),
        )
    };
    assert_eq!((st1, st2), (NULLPTR, NULLPTR));
    assert!(m.err().contains("argument executor"));
    for d in extra {
        m.release(d);
    }
    case.release(&m);
    m.expect_violations(0, "");
}

#[test]
fn ut_precision_and_contiguous_exact_values() {
    let m = Mock::new();
    // T02: dy = x = 1, [2,3,1,4]
    let ones = vec![1.0; 24];
    let case = Case::new(&m, aclDataType::ACL_FLOAT, &[2, 3, 1, 4], &ones, &ones, &[-2., 2., 1.], &[0.125, 0.1, 0.3]);
    m.expect_ok(&case.args());
    let [sum_dy, xmu, gw, gb] = case.outputs(&m);
    assert_eq!(sum_dy, [8.0; 3]);
    assert_eq!(xmu, [24.0, -8.0, 0.0]);
    assert_eq!(gw, [3.0, -8.0f32 * 0.1, 0.0]);
    assert_eq!(gb, [8.0; 3]);
    case.release(&m);
    // T03: [3,5,3,8], dy = x = 1
    let ones = vec![1.0; 360];
    let mean = [-2., 2., 1., 0., -1.];
    let invstd = [0.125, 0.1, 0.3, 0.05, 0.2];
    let case = Case::new(&m, aclDataType::ACL_FLOAT, &[3, 5, 3, 8], &ones, &ones, &mean, &invstd);
    m.expect_ok(&case.args());
    let [sum_dy, xmu, gw, _] = case.outputs(&m);
    assert_eq!(sum_dy, [72.0; 5]);
    assert_eq!(xmu, [216.0, -72.0, 0.0, 72.0, 144.0]);
    let want: Vec<f32> = xmu.iter().zip(invstd).map(|(a, b)| a * b).collect();
    assert_eq!(gw, want);
    case.release(&m);
    m.expect_violations(0, "");
}

// ---------------------------------------------------------------------------------------------
// Violations

#[test]
fn violation_free_of_unknown_or_freed_pointer() {
    let m = Mock::new();
    let mut host = [0u8; 64];
    assert_eq!(m.free(host.as_mut_ptr().cast()), 107000);
    m.expect_violations(1, "is not a live device allocation");
    assert!(m.err().contains("aclrtFree failed. ERROR: 107000"));
    let p = m.malloc(64);
    // SAFETY: only used as an address; the mock rejects it without touching memory.
    let inner = unsafe { p.cast::<u8>().add(32) };
    assert_eq!(m.free(inner.cast()), 107000);
    m.expect_violations(2, "points inside the allocation");
    assert_eq!(m.free(p), 0);
    assert_eq!(m.free(p), 107000);
    m.expect_violations(3, "double free");
    assert_eq!(m.free(ptr::null_mut()), 100000);
    m.expect_violations(3, "");
}

#[test]
fn violation_free_while_queued_copy_uses_it() {
    let m = Mock::new();
    let s = m.stream();
    let p = m.malloc(64);
    let host = [1u8; 64];
    // SAFETY: `host` outlives the stream synchronization below.
    assert_eq!(unsafe { m.c.acl.aclrtMemcpyAsync(p, 64, host.as_ptr().cast(), 64, H2D, s) }, 0);
    assert_eq!(m.free(p), 0, "the free itself succeeds");
    m.expect_violations(1, "still uses this memory");
    assert_eq!(m.sync(s), 507053, "the queued copy finds its memory gone");
    m.expect_violations(2, "was freed before the task ran");
    assert!(m.err().contains("aclrtSynchronizeStream failed. ERROR: 507053"));
    assert_eq!(m.destroy_stream(s), 0);
}

#[test]
fn violation_launch_reading_freed_memory() {
    let m = Mock::new();
    let s = m.stream();
    let case = ut_case(&m, aclDataType::ACL_FLOAT);
    let (st, size, ex) = m.phase1(&case.args());
    assert_eq!(st, 0);
    let ws = m.malloc(size as usize);
    assert_eq!(m.launch(ws, size, ex, s), 0);
    // free the input and the workspace before the launch ran
    assert_eq!(m.free(case.devs[1].mem), 0);
    m.expect_violations(1, "still uses this memory (input)");
    assert_eq!(m.free(ws), 0);
    m.expect_violations(2, "still uses this memory (workspace)");
    assert_eq!(m.sync(s), 507015);
    m.expect_violations(3, "device memory of input");
    m.expect_poisoned(case.devs[5].mem, 12, &["they are bytes of sumDy that task #", "was freed before it ran"]);
    m.expect_violations(3, "");
    let mut devs = case.devs;
    let input = devs.remove(1);
    assert_eq!(m.destroy_tensor(input.t), 0);
    for d in devs {
        m.release(d);
    }
    assert_eq!(m.destroy_stream(s), 0);
    // a tensor over freed memory cannot be launched either
    let case = ut_case(&m, aclDataType::ACL_FLOAT);
    let (st, size, ex) = m.phase1(&case.args());
    assert_eq!(st, 0);
    assert_eq!(m.free(case.devs[2].mem), 0);
    let ws = m.malloc(size as usize);
    assert_eq!(m.launch(ws, size, ex, ptr::null_mut()), INVALID);
    m.expect_violations(4, "the device memory of tensor mean");
    assert_eq!(mock::stats().live_executors, m.base.live_executors, "a failed phase 2 still consumes");
    assert_eq!(m.free(ws), 0);
    let mut devs = case.devs;
    let mean = devs.remove(2);
    assert_eq!(m.destroy_tensor(mean.t), 0);
    for d in devs {
        m.release(d);
    }
    m.expect_violations(4, "");
}

#[test]
fn violation_destroyed_tensor() {
    let m = Mock::new();
    let case = ut_case(&m, aclDataType::ACL_FLOAT);
    // destroyed between phase 1 and phase 2
    let (st, size, ex) = m.phase1(&case.args());
    assert_eq!(st, 0);
    let extra = m.dev(&f32_spec(&[3]), &[0.0; 3]);
    let mut a = case.args();
    a.t[7] = extra.t;
    let (st2, size2, ex2) = m.phase1(&a);
    assert_eq!(st2, 0);
    assert_eq!(m.destroy_tensor(extra.t), 0);
    let ws = m.malloc(size.max(size2) as usize);
    assert_eq!(m.launch(ws, size2, ex2, ptr::null_mut()), INVALID);
    m.expect_violations(1, "tensor gradWeight");
    assert!(m.err().contains("was destroyed between GetWorkspaceSize and the launch"));
    // destroying tensors right after the launch is fine (op-plugin does it)
    assert_eq!(m.launch(ws, size, ex, ptr::null_mut()), 0);
    for d in &case.devs {
        assert_eq!(m.destroy_tensor(d.t), 0);
    }
    assert_eq!(m.sync(ptr::null_mut()), 0);
    assert_eq!(m.read(&case.devs[5]).len(), 3);
    m.expect_violations(1, "");
    // double destroy
    assert_eq!(m.destroy_tensor(case.devs[0].t), INVALID);
    m.expect_violations(2, "already destroyed");
    assert_eq!(m.destroy_tensor(ptr::null()), NULLPTR);
    // phase 1 with a destroyed tensor
    let (st, _, ex) = m.phase1(&case.args());
    assert_eq!(st, INVALID);
    assert!(ex.is_null());
    m.expect_violations(3, "argument gradOut");
    assert_eq!(m.free(ws), 0);
    assert_eq!(m.free(extra.mem), 0);
    for d in case.devs {
        assert_eq!(m.free(d.mem), 0);
    }
    assert_eq!(mock::stats().live_tensors, m.base.live_tensors);
    m.expect_violations(3, "");
}

#[test]
fn violation_destroyed_or_unknown_stream() {
    let m = Mock::new();
    let s = m.stream();
    assert_eq!(mock::stats().live_streams, m.base.live_streams + 1);
    assert_eq!(m.destroy_stream(s), 0);
    assert_eq!(mock::stats().live_streams, m.base.live_streams);
    assert_eq!(m.sync(s), 107017);
    m.expect_violations(1, "already destroyed");
    assert_eq!(m.destroy_stream(s), 107017);
    m.expect_violations(2, "already destroyed");
    let p = m.malloc(32);
    let host = [0u8; 32];
    // SAFETY: the mock rejects the stream before queueing anything.
    assert_eq!(unsafe { m.c.acl.aclrtMemcpyAsync(p, 32, host.as_ptr().cast(), 32, H2D, s) }, 107017);
    m.expect_violations(3, "already destroyed");
    let bogus = 0x1234_5678usize as aclrtStream;
    assert_eq!(m.sync(bogus), 107017);
    m.expect_violations(4, "not a handle this toolkit issued");
    // phase 2 on a dead stream: the runtime refuses it
    let case = ut_case(&m, aclDataType::ACL_FLOAT);
    let (_, size, ex) = m.phase1(&case.args());
    let ws = m.malloc(size as usize);
    assert_eq!(m.launch(ws, size, ex, s), 361001);
    m.expect_violations(5, "already destroyed");
    assert_eq!(m.destroy_stream(ptr::null_mut()), 100000);
    m.expect_violations(6, "the default stream cannot be destroyed");
    assert_eq!(m.free(ws), 0);
    assert_eq!(m.free(p), 0);
    case.release(&m);
    assert_eq!(mock::stats().live_executors, m.base.live_executors);
}

#[test]
fn violation_executor_launched_twice() {
    let m = Mock::new();
    let case = ut_case(&m, aclDataType::ACL_FLOAT);
    let (st, size, ex) = m.phase1(&case.args());
    assert_eq!(st, 0);
    let ws = m.malloc(size as usize);
    assert_eq!(m.launch(ws, size, ex, ptr::null_mut()), 0);
    assert_eq!(m.launch(ws, size, ex, ptr::null_mut()), INVALID);
    m.expect_violations(1, "launched twice?");
    assert_eq!(m.sync(ptr::null_mut()), 0);
    assert_eq!(m.launch(ws, size, ptr::null_mut(), ptr::null_mut()), NULLPTR);
    assert_eq!(m.free(ws), 0);
    case.release(&m);
    m.expect_violations(1, "");
}

#[test]
fn violation_wrong_workspace() {
    let m = Mock::new();
    let case = ut_case(&m, aclDataType::ACL_FLOAT);
    let a = case.args();
    let (_, size, _) = {
        let (st, size, ex) = m.phase1(&a);
        assert_eq!(st, 0);
        assert_eq!(m.launch_sync(size, ex, ptr::null_mut()), 0);
        (st, size, ex)
    };
    assert!(size >= 24, "2·C floats");
    let ws = m.malloc(size as usize);
    let small = m.malloc(size as usize - 4);
    let cases: [(*mut c_void, u64, &str); 5] = [
        (ws, size - 4, "is smaller than the"),
        (ptr::null_mut(), size, "pass NULL exactly when the size is 0"),
        (ws, 0, "pass NULL exactly when the size is 0"),
        (small, size, "is not inside one live device allocation"),
        // SAFETY (address only): inside `ws`, the mock checks the range without touching it.
        (unsafe { ws.cast::<u8>().add(4).cast() }, size, "is not inside one live device allocation"),
    ];
    for (i, (ptr_, len, needle)) in cases.into_iter().enumerate() {
        let (st, _, ex) = m.phase1(&a);
        assert_eq!(st, 0);
        assert_eq!(m.launch(ptr_, len, ex, ptr::null_mut()), INVALID, "case {i}");
        m.expect_violations(i as u64 + 1, needle);
    }
    // a freed workspace (freed after the launch, before the run)
    let (_, _, ex) = m.phase1(&a);
    assert_eq!(m.launch(ws, size, ex, ptr::null_mut()), 0);
    assert_eq!(m.free(ws), 0);
    m.expect_violations(6, "(workspace)");
    assert_eq!(m.sync(ptr::null_mut()), 507015);
    m.expect_violations(7, "device memory of workspace");
    assert_eq!(m.free(small), 0);
    assert_eq!(mock::stats().live_executors, m.base.live_executors);
    case.release(&m);
    m.expect_violations(7, "");
}

#[test]
fn violation_bad_tensor_descriptions() {
    let m = Mock::new();
    let p = m.malloc(240);
    let s = f32_spec(&[4, 2]);
    let bad = |spec: &Spec, data: *mut c_void, n: u64, needle: &str| {
        assert!(m.create_tensor(spec, data).is_null(), "{spec:?} must be rejected");
        m.expect_violations(n, needle);
        assert!(m.err().contains("aclCreateTensor failed"));
    };
    // SAFETY (addresses only): never dereferenced by the mock, which rejects them.
    let (p4, p224) = unsafe { (p.cast::<u8>().add(4).cast(), p.cast::<u8>().add(224).cast()) };
    bad(&s, p4, 1, "is not 32-byte aligned");
    bad(&s, p224, 2, "runs past the end of its device allocation");
    let mut host = vec![0u64; 64];
    let host_ptr = host.as_mut_ptr().cast::<u8>();
    let aligned = host_ptr.wrapping_add(host_ptr.align_offset(32)).cast();
    bad(&s, aligned, 3, "is not inside a live device allocation");
    bad(&s, ptr::null_mut(), 4, "tensorData is null but the storage has 8 elements");
    bad(&Spec::strided(aclDataType::ACL_FLOAT, &[4, 2], &[2, 1], 1, 8), p, 5, "exceeds the storage");
    bad(&Spec::strided(aclDataType::ACL_FLOAT, &[4, 2], &[-2, 1], 6, 8), p, 6, "stride 0 is negative");
    bad(&Spec::strided(aclDataType::ACL_FLOAT, &[-4, 2], &[2, 1], 0, 8), p, 7, "view dim 0 is negative");
    bad(&Spec::strided(aclDataType::ACL_FLOAT, &[4, 2], &[2, 1], -1, 8), p, 8, "offset -1 is negative");
    bad(&Spec { storage_dims: vec![-8], ..s.clone() }, p, 9, "storage dim 0 is negative");
    assert_eq!(m.free(p), 0);
    bad(&s, p, 10, "is not inside a live device allocation");
    // accepted: empty storage with null data; a view at the very end of the storage; a broadcast (stride 0)
    let ok = [
        (Spec::strided(aclDataType::ACL_FLOAT, &[0, 2], &[2, 1], 0, 0), ptr::null_mut()),
        (Spec::strided(aclDataType::ACL_FLOAT, &[2, 2], &[2, 1], 4, 8), m.malloc(32)),
        (Spec::strided(aclDataType::ACL_FLOAT, &[4, 2], &[0, 1], 0, 2), m.malloc(8)),
    ];
    for (spec, data) in &ok {
        let t = m.create_tensor(spec, *data);
        assert!(!t.is_null(), "{spec:?}: {}", m.err());
        assert_eq!(m.destroy_tensor(t), 0);
        if !data.is_null() {
            assert_eq!(m.free(*data), 0);
        }
    }
    m.expect_violations(10, "");
}

#[test]
fn violation_device_call_on_a_thread_without_device() {
    let m = Mock::new();
    let c = m.c;
    let (malloc_st, stream_st, get_st) = std::thread::spawn(move || {
        let mut p = ptr::null_mut();
        let mut s = ptr::null_mut();
        let mut dev = -1;
        // SAFETY: valid out-pointers; the thread never called aclrtSetDevice.
        unsafe {
            (
                c.acl.aclrtMalloc(&mut p, 64, aclrtMemMallocPolicy::ACL_MEM_MALLOC_HUGE_FIRST),
                c.acl.aclrtCreateStream(&mut s),
                c.acl.aclrtGetDevice(&mut dev),
            )
        }
    })
    .join()
    .unwrap();
    assert_eq!((malloc_st, stream_st, get_st), (107002, 107002, 107002));
    m.expect_violations(2, "call aclrtSetDevice on this thread first");
}

#[test]
fn violation_reset_device_with_live_stream() {
    let m = Mock::new();
    let s = m.stream();
    // SAFETY: plain runtime calls.
    unsafe {
        assert_eq!(m.c.acl.aclrtResetDevice(0), 0);
        m.expect_violations(1, "stream(s) created on the device are still alive");
        assert_eq!(m.c.acl.aclrtResetDevice(0), 107000);
        m.expect_violations(2, "more aclrtResetDevice than aclrtSetDevice");
        assert_eq!(m.c.acl.aclrtSetDevice(0), 0);
        let mut dev = -1;
        assert_eq!(m.c.acl.aclrtGetDevice(&mut dev), 0);
        assert_eq!(dev, 0);
    }
    assert_eq!(m.destroy_stream(s), 0);
    m.expect_violations(2, "");
}

#[test]
fn violation_memcpy_and_memset_checks() {
    let m = Mock::new();
    let d = m.malloc(64);
    let d2 = m.malloc(64);
    let mut host = vec![0u8; 64];
    let h = host.as_mut_ptr().cast::<c_void>();
    let c = m.c;
    let mut n = 0;
    let mut expect = |st: i32, needle: &str| {
        n += 1;
        assert_eq!(st, 107000, "{needle}");
        m.expect_violations(n, needle);
    };
    // SAFETY: every call below is rejected by the mock before any byte is copied.
    unsafe {
        expect(c.acl.aclrtMemcpy(h, 64, d, 64, H2D), "dst range");
        expect(c.acl.aclrtMemcpy(d, 64, d2, 64, H2D), "src range");
        expect(c.acl.aclrtMemcpy(d, 64, h, 64, D2H), "dst range");
        expect(c.acl.aclrtMemcpy(d, 64, h, 64, D2D), "src range");
        expect(c.acl.aclrtMemcpy(d, 32, h, 64, H2D), "count 64 is greater than destMax 32");
        expect(c.acl.aclrtMemcpy(d, 128, h, 65, H2D), "not inside one live device allocation");
        expect(c.acl.aclrtMemcpy(d, 64, h, 64, aclrtMemcpyKind(9)), "is not an aclrtMemcpyKind");
        expect(c.acl.aclrtMemset(d, 32, 0, 64), "count 64 is greater than maxCount 32");
        expect(c.acl.aclrtMemset(d, 128, 0, 65), "not inside one live device allocation");
        // accepted: D2D, DEFAULT (kind from provenance), memset, count 0
        assert_eq!(c.acl.aclrtMemset(d, 64, 7, 64), 0);
        assert_eq!(c.acl.aclrtMemcpy(d2, 64, d, 64, D2D), 0);
        assert_eq!(c.acl.aclrtMemcpy(h, 64, d2, 64, aclrtMemcpyKind::ACL_MEMCPY_DEFAULT), 0);
        assert_eq!(c.acl.aclrtMemcpy(d, 64, h, 0, H2D), 0);
    }
    assert_eq!(host, vec![7u8; 64]);
    assert_eq!(m.free(d), 0);
    assert_eq!(m.free(d2), 0);
    m.expect_violations(9, "");
}

#[test]
fn violation_unsynchronized_access_to_queued_work() {
    let m = Mock::new();
    let a = m.stream();
    let b = m.stream();
    let d = m.malloc(64);
    let src = vec![3u8; 64];
    let mut dst = vec![0u8; 64];
    let c = m.c;
    // SAFETY: host buffers outlive the synchronizations below.
    unsafe {
        assert_eq!(c.acl.aclrtMemcpyAsync(d, 64, src.as_ptr().cast(), 64, H2D, a), 0);
        // a synchronous read of memory that queued work will write: reads garbage
        assert_eq!(c.acl.aclrtMemcpy(dst.as_mut_ptr().cast(), 64, d, 64, D2H), 0);
        m.expect_violations(1, "with no synchronization in between");
        assert_eq!(dst, vec![mock::GARBAGE_BYTE; 64], "fresh device memory is garbage, not zeros");
        // another stream reading it without an event
        assert_eq!(c.acl.aclrtMemcpyAsync(dst.as_mut_ptr().cast(), 64, d, 64, D2H, b), 0);
        m.expect_violations(2, "queued on stream");
        assert_eq!(m.sync(b), 0);
        // ordered through an event: no violation, and the data arrives
        assert_eq!(c.acl.aclrtMemcpyAsync(d, 64, src.as_ptr().cast(), 64, H2D, a), 0);
        let mut ev: aclrtEvent = ptr::null_mut();
        assert_eq!(c.acl.aclrtCreateEvent(&mut ev), 0);
        assert_eq!(c.acl.aclrtRecordEvent(ev, a), 0);
        assert_eq!(c.acl.aclrtStreamWaitEvent(b, ev), 0);
        assert_eq!(c.acl.aclrtMemcpyAsync(dst.as_mut_ptr().cast(), 64, d, 64, D2H, b), 0);
        assert_eq!(c.acl.aclrtSynchronizeEvent(ev), 0);
        assert_eq!(m.sync(b), 0);
        assert_eq!(dst, src);
        assert_eq!(c.acl.aclrtDestroyEvent(ev), 0);
        assert_eq!(c.acl.aclrtSynchronizeEvent(ev), 107017);
        m.expect_violations(3, "event");
    }
    assert_eq!(m.sync(a), 0);
    assert_eq!(m.destroy_stream(a), 0);
    assert_eq!(m.destroy_stream(b), 0);
    assert_eq!(m.free(d), 0);
    m.expect_violations(3, "");
}

#[test]
fn violation_unchecked_lengths_caught_when_the_kernel_runs() {
    let m = Mock::new();
    let case = ut_case(&m, aclDataType::ACL_FLOAT);
    let mut extra = Vec::new();
    // mean of length 2 < C = 3: ops-nn accepts it, the kernel reads past the view
    let mut a = case.args();
    swap(&m, &mut a, 2, &f32_spec(&[2]), &mut extra);
    let (st, size, ex) = m.phase1(&a);
    assert_eq!(st, 0, "ops-nn does not check mean's length");
    let ws = m.malloc(size as usize);
    assert_eq!(m.launch(ws, size, ex, ptr::null_mut()), 0);
    assert_eq!(m.sync(ptr::null_mut()), 507015);
    m.expect_violations(1, "mean has shape [2] (2 elements) but the kernel reads 3");
    assert!(m.err().contains("its kernel failed with status 507015"));
    m.expect_poisoned(case.devs[5].mem, 12, &["they are bytes of sumDy that task #", "its kernel failed"]);
    // gradOut of another shape than input
    let mut a = case.args();
    swap(&m, &mut a, 0, &f32_spec(&[2, 3, 2, 2]), &mut extra);
    let (st, size2, ex) = m.phase1(&a);
    assert_eq!(st, 0, "ops-nn does not check gradOut's shape");
    assert_eq!(m.launch(ws, size2, ex, ptr::null_mut()), 0);
    assert_eq!(m.sync(ptr::null_mut()), 507015);
    m.expect_violations(2, "gradOut has shape [2, 3, 2, 2] but input has shape [2, 3, 1, 4]");
    assert_eq!(m.free(ws), 0);
    for d in extra {
        m.release(d);
    }
    case.release(&m);
    m.expect_violations(2, "");
}

#[test]
fn violation_executor_destroy_rules_and_repeatable() {
    let m = Mock::new();
    let mut rng = Rng(99);
    let dy = rng.vec(24, -1.0, 1.0);
    let x = rng.vec(24, -1.0, 1.0);
    let case = Case::new(&m, aclDataType::ACL_FLOAT, &[2, 3, 1, 4], &dy, &x, &[0.5, 0.0, -0.5], &[1.0, 2.0, 0.5]);
    // SAFETY: the mock validates executor handles.
    unsafe {
        assert_eq!(m.c.nnopbase.aclDestroyAclOpExecutor(ptr::null_mut()), 561103);
        let (st, _, ex) = m.phase1(&case.args());
        assert_eq!(st, 0);
        assert_eq!(m.c.nnopbase.aclDestroyAclOpExecutor(ex), 0);
        m.expect_violations(1, "is not repeatable");
        assert_eq!(mock::stats().live_executors, m.base.live_executors, "freed anyway");
        // repeatable: launch twice, then destroy
        let (st, size, ex) = m.phase1(&case.args());
        assert_eq!(st, 0);
        assert_eq!(m.c.nnopbase.aclSetAclOpExecutorRepeatable(ex), 0);
        let ws = m.malloc(size as usize);
        assert_eq!(m.launch(ws, size, ex, ptr::null_mut()), 0);
        assert_eq!(m.sync(ptr::null_mut()), 0);
        let first = case.outputs(&m);
        assert_eq!(m.h2d(case.devs[5].mem, &encode(aclDataType::ACL_FLOAT, &[0.0; 3])), 0);
        assert_eq!(m.launch(ws, size, ex, ptr::null_mut()), 0);
        assert_eq!(m.sync(ptr::null_mut()), 0);
        assert_eq!(case.outputs(&m), first, "a repeated launch computes the same");
        assert_eq!(mock::stats().live_executors, m.base.live_executors + 1);
        assert_eq!(m.c.nnopbase.aclDestroyAclOpExecutor(ex), 0);
        assert_eq!(mock::stats().live_executors, m.base.live_executors);
        assert_eq!(m.c.nnopbase.aclDestroyAclOpExecutor(ex), INVALID);
        m.expect_violations(2, "already destroyed");
        assert_eq!(m.free(ws), 0);
    }
    case.release(&m);
    m.expect_violations(2, "");
}

// ---------------------------------------------------------------------------------------------
// Runtime: init, devices (each in a child process, so that the state before aclInit is real)

const CHILD_ENV: &str = "ASCEND_MOCK_TEST_CHILD";

/// Runs the `child_entry` test of this binary in a new process with `scenario`.
fn run_child(scenario: &str, env: &[(&str, &str)]) {
    let mut cmd = self_exec::self_command();
    cmd.args(["--exact", "child_entry", "--nocapture", "--test-threads=1"]).env(CHILD_ENV, scenario);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("spawn the test binary");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "child `{scenario}` failed:\n{text}");
    assert!(text.contains("1 passed"), "child `{scenario}` ran no test:\n{text}");
}

#[test]
fn child_entry() {
    let Ok(scenario) = std::env::var(CHILD_ENV) else { return };
    let c = cann();
    let v = || mock::stats().violations;
    // SAFETY: plain runtime calls with valid out-pointers.
    unsafe {
        match scenario.as_str() {
            "uninit" => {
                let mut p = ptr::null_mut();
                let mut s = ptr::null_mut();
                let mut n = 0u32;
                assert_eq!(c.acl.aclrtSetDevice(0), 100001);
                assert_eq!(c.acl.aclrtMalloc(&mut p, 64, aclrtMemMallocPolicy::ACL_MEM_MALLOC_HUGE_FIRST), 100001);
                assert_eq!(c.acl.aclrtCreateStream(&mut s), 100001);
                assert_eq!(c.acl.aclrtGetDeviceCount(&mut n), 100001);
                assert_eq!(c.acl.aclFinalize(), 100001);
                assert_eq!(v(), 5, "{:?}", mock::violations_since(0));
                assert!(mock::last_violation().unwrap().contains("call aclInit first"));
                assert_eq!(c.acl.aclInit(ptr::null()), 0);
                assert_eq!(c.acl.aclInit(ptr::null()), 100002);
                assert_eq!(c.acl.aclrtGetDeviceCount(&mut n), 0);
                assert_eq!(n, 1);
                assert_eq!(c.acl.aclrtSetDevice(1), 107001);
                assert_eq!(c.acl.aclrtSetDevice(-1), 107001);
                assert_eq!(c.acl.aclrtSetDevice(0), 0);
                assert_eq!(c.acl.aclrtResetDevice(0), 0);
                assert_eq!(c.acl.aclFinalize(), 0);
                assert_eq!(c.acl.aclFinalize(), 100037);
                assert_eq!(v(), 5, "{:?}", mock::violations_since(0));
                assert_eq!(c.acl.aclrtMalloc(&mut p, 64, aclrtMemMallocPolicy::ACL_MEM_MALLOC_HUGE_FIRST), 100001);
                assert_eq!(v(), 6);
            }
            "two_devices" => {
                let mut n = 0u32;
                let mut s1 = ptr::null_mut();
                assert_eq!(c.acl.aclInit(ptr::null()), 0);
                assert_eq!(c.acl.aclrtGetDeviceCount(&mut n), 0);
                assert_eq!(n, 2);
                assert_eq!(c.acl.aclrtSetDevice(1), 0);
                assert_eq!(c.acl.aclrtCreateStream(&mut s1), 0);
                assert_eq!(c.acl.aclrtSetDevice(0), 0);
                let mut dev = -1;
                assert_eq!(c.acl.aclrtGetDevice(&mut dev), 0);
                assert_eq!(dev, 0);
                assert_eq!(c.acl.aclrtSynchronizeStream(s1), 107003);
                assert_eq!(v(), 1);
                assert!(mock::last_violation().unwrap().contains("belongs to device 1"));
                assert_eq!(c.acl.aclrtSetDevice(1), 0);
                assert_eq!(c.acl.aclrtDestroyStream(s1), 0);
                assert_eq!(c.acl.aclrtResetDevice(1), 0);
                assert_eq!(c.acl.aclrtResetDevice(1), 0);
                assert_eq!(c.acl.aclrtResetDevice(0), 0);
                assert_eq!(c.acl.aclFinalize(), 0);
                assert_eq!(v(), 1);
            }
            "no_devices" => {
                let mut n = 7u32;
                assert_eq!(c.acl.aclInit(ptr::null()), 0);
                assert_eq!(c.acl.aclrtGetDeviceCount(&mut n), 0);
                assert_eq!(n, 0);
                assert_eq!(c.acl.aclrtSetDevice(0), 107001);
                assert_eq!(v(), 0);
            }
            other => panic!("unknown child scenario {other}"),
        }
    }
}

#[test]
fn violation_runtime_calls_before_acl_init() {
    run_child("uninit", &[]);
}

#[test]
fn runtime_device_count_and_stream_of_another_device() {
    run_child("two_devices", &[("ASCEND_MOCK_DEVICE_COUNT", "2")]);
    run_child("no_devices", &[("ASCEND_MOCK_DEVICE_COUNT", "0")]);
}

// ---------------------------------------------------------------------------------------------
// Runtime: streams are queues, fault injection, threads

#[test]
fn runtime_streams_run_at_synchronize() {
    let m = Mock::new();
    let s = m.stream();
    let d = m.malloc(16);
    let src = [9u8; 16];
    let mut dst = [0u8; 16];
    // SAFETY: host buffers outlive the synchronization.
    unsafe {
        assert_eq!(m.c.acl.aclrtMemcpyAsync(d, 16, src.as_ptr().cast(), 16, H2D, s), 0);
        assert_eq!(m.c.acl.aclrtMemcpyAsync(dst.as_mut_ptr().cast(), 16, d, 16, D2H, s), 0);
    }
    assert_eq!(dst, [0u8; 16], "nothing runs before the stream is synchronized");
    assert_eq!(mock::live_events_and_queued_tasks().1, 2);
    // SAFETY: plain runtime call.
    assert_eq!(unsafe { m.c.acl.aclrtSynchronizeDevice() }, 0);
    assert_eq!(dst, src);
    // destroy drains first
    let ones = [1u8; 16];
    // SAFETY: `ones` outlives the stream's destruction, which runs the copy.
    unsafe { assert_eq!(m.c.acl.aclrtMemcpyAsync(d, 16, ones.as_ptr().cast(), 16, H2D, s), 0) };
    assert_eq!(m.destroy_stream(s), 0);
    assert_eq!(m.d2h(d, 16), vec![1u8; 16]);
    assert_eq!(mock::live_events_and_queued_tasks().1, 0);
    assert_eq!(m.free(d), 0);
    m.expect_violations(0, "");
}

#[test]
fn runtime_fail_next() {
    let m = Mock::new();
    let before = mock::stats();
    let before_thread = mock::thread_stats();
    mock::fail_next("aclrtMalloc", 207001);
    let mut junk = 0u8;
    let mut p: *mut c_void = (&mut junk as *mut u8).cast();
    // SAFETY: valid out-pointer.
    let st = unsafe { m.c.acl.aclrtMalloc(&mut p, 64, aclrtMemMallocPolicy::ACL_MEM_MALLOC_HUGE_FIRST) };
    assert_eq!(st, 207001);
    assert!(p.is_null());
    assert!(m.err().contains("aclrtMalloc failed. ERROR: 207001"));
    assert_eq!(mock::stats().device_mallocs, before.device_mallocs);
    let p = m.malloc(64);
    assert_eq!(mock::stats().device_mallocs, before.device_mallocs + 1, "only once");
    assert_eq!(mock::thread_stats().device_mallocs, before_thread.device_mallocs + 1);
    // pointer-returning API
    mock::fail_next("aclCreateTensor", 1);
    assert!(m.create_tensor(&f32_spec(&[2]), p).is_null());
    let t = m.create_tensor(&f32_spec(&[2]), p);
    assert!(!t.is_null());
    assert_eq!(m.destroy_tensor(t), 0);
    // phase 1 / phase 2
    let case = ut_case(&m, aclDataType::ACL_FLOAT);
    mock::fail_next("aclnnBatchNormReduceBackwardGetWorkspaceSize", 561002);
    assert_eq!(m.phase1(&case.args()).0, 561002);
    let (st, size, ex) = m.phase1(&case.args());
    assert_eq!(st, 0);
    mock::fail_next("aclnnBatchNormReduceBackward", 561003);
    assert_eq!(m.launch(ptr::null_mut(), size, ex, ptr::null_mut()), 561003);
    assert_eq!(mock::stats().live_executors, m.base.live_executors, "a failed phase 2 consumes the executor");
    // thread-local faults only fire on their thread
    mock::fail_next_on_this_thread("aclrtSynchronizeStream", 507046);
    let c = m.c;
    // SAFETY: a thread without device: the call fails on the device check, not on the fault.
    let other = std::thread::spawn(move || unsafe { c.acl.aclrtSynchronizeStream(ptr::null_mut()) }).join().unwrap();
    assert_eq!(other, 107002);
    assert_eq!(m.sync(ptr::null_mut()), 507046);
    assert_eq!(m.sync(ptr::null_mut()), 0);
    // an unknown API name is a test bug: it panics instead of never firing
    assert!(std::panic::catch_unwind(|| mock::fail_next("aclrtMallocc", 1)).is_err());
    assert_eq!(m.free(p), 0);
    case.release(&m);
    m.expect_violations(1, "call aclrtSetDevice on this thread first");
}

#[test]
fn runtime_recent_error_message_is_per_thread_and_consumed() {
    let m = Mock::new();
    let _ = m.err();
    assert_eq!(m.err(), "", "no message after the last one was read");
    assert_eq!(m.free(ptr::null_mut()), 100000);
    let c = m.c;
    // SAFETY: aclGetRecentErrMsg takes no arguments.
    let other = std::thread::spawn(move || unsafe { c.acl.aclGetRecentErrMsg().is_null() }).join().unwrap();
    assert!(other, "another thread has no message");
    assert!(m.err().starts_with("aclrtFree failed. ERROR: 100000"));
    assert_eq!(m.err(), "", "reading the message consumes it");
    m.expect_violations(0, "");
}

#[test]
fn runtime_threads_each_with_a_stream() {
    let m = Mock::new();
    let c = m.c;
    let handles: Vec<_> = (0..4u64)
        .map(|k| {
            std::thread::spawn(move || {
                // SAFETY: each thread binds the device, uses only its own objects and releases them.
                unsafe {
                    assert_eq!(c.acl.aclrtSetDevice(0), 0);
                    let mut s = ptr::null_mut();
                    assert_eq!(c.acl.aclrtCreateStream(&mut s), 0);
                    let mut rng = Rng(1000 + k);
                    let shape = [5i64, 4, 3];
                    let dy = rng.vec(60, -1.0, 1.0);
                    let x = rng.vec(60, -1.0, 1.0);
                    let mean = [0.1f32, -0.2, 0.3, 0.0];
                    let inv = [1.0f32, 2.0, 0.5, 1.5];
                    let up = |v: &[f32]| {
                        let b = encode(aclDataType::ACL_FLOAT, v);
                        let mut p = ptr::null_mut();
                        assert_eq!(
                            c.acl.aclrtMalloc(&mut p, b.len(), aclrtMemMallocPolicy::ACL_MEM_MALLOC_HUGE_FIRST),
                            0
                        );
                        assert_eq!(c.acl.aclrtMemcpyAsync(p, b.len(), b.as_ptr().cast(), b.len(), H2D, s), 0);
                        assert_eq!(c.acl.aclrtSynchronizeStream(s), 0);
                        p
                    };
                    let mems = [up(&dy), up(&x), up(&mean), up(&inv), up(&[0.0; 4]), up(&[0.0; 4])];
                    let specs = [f32_spec(&shape), f32_spec(&shape), f32_spec(&[4]), f32_spec(&[4]), f32_spec(&[4])];
                    let spec_of = |i: usize| &specs[i.min(4)];
                    let ts: Vec<*mut aclTensor> = (0..6)
                        .map(|i| {
                            let sp = spec_of(i);
                            c.nnopbase.aclCreateTensor(
                                sp.shape.as_ptr(),
                                sp.shape.len() as u64,
                                sp.dt,
                                sp.strides.as_ptr(),
                                0,
                                ND,
                                sp.storage_dims.as_ptr(),
                                sp.storage_dims.len() as u64,
                                mems[i],
                            )
                        })
                        .collect();
                    let mut results = Vec::new();
                    for _ in 0..3 {
                        let mut size = 0;
                        let mut ex = ptr::null_mut();
                        let st = bnrb(c).aclnnBatchNormReduceBackwardGetWorkspaceSize(
                            ts[0],
                            ts[1],
                            ts[2],
                            ts[3],
                            ptr::null(),
                            true,
                            false,
                            false,
                            ts[4],
                            ts[5],
                            ptr::null_mut(),
                            ptr::null_mut(),
                            &mut size,
                            &mut ex,
                        );
                        assert_eq!(st, 0);
                        let mut ws = ptr::null_mut();
                        assert_eq!(
                            c.acl.aclrtMalloc(&mut ws, size as usize, aclrtMemMallocPolicy::ACL_MEM_MALLOC_HUGE_FIRST),
                            0
                        );
                        assert_eq!(bnrb(c).aclnnBatchNormReduceBackward(ws, size, ex, s), 0);
                        let mut out = [0f32; 4];
                        assert_eq!(c.acl.aclrtMemcpyAsync(out.as_mut_ptr().cast(), 16, mems[5], 16, D2H, s), 0);
                        assert_eq!(c.acl.aclrtSynchronizeStream(s), 0);
                        assert_eq!(c.acl.aclrtFree(ws), 0);
                        results.push(out);
                    }
                    for t in ts {
                        assert_eq!(c.nnopbase.aclDestroyTensor(t), 0);
                    }
                    for p in mems {
                        assert_eq!(c.acl.aclrtFree(p), 0);
                    }
                    assert_eq!(c.acl.aclrtDestroyStream(s), 0);
                    assert_eq!(c.acl.aclrtResetDevice(0), 0);
                    let spec = f32_spec(&shape);
                    let want = replica(&spec, &dy, &spec, &x, &mean, &inv, 4).1;
                    for r in &results {
                        assert_eq!(r[..], want[..]);
                    }
                    mock::thread_stats().violations
                }
            })
        })
        .collect();
    for h in handles {
        assert_eq!(h.join().unwrap(), 0);
    }
    let after = mock::stats();
    assert_eq!(after.live_allocations, m.base.live_allocations);
    assert_eq!(after.live_streams, m.base.live_streams);
    assert_eq!(after.live_tensors, m.base.live_tensors);
    assert_eq!(after.device_mallocs, m.base.device_mallocs + 4 * (6 + 3));
    m.expect_violations(0, "");
}

/// Several threads make every kind of mock call at the same time, many rounds each, on their own
/// streams and memory: results stay bit-exact, only the deliberate violations count, the counters
/// balance. Besides checking thread safety, this is the test in which threads overlap inside the
/// mock (a barrier starts them together; many rounds span many scheduler slices), so that a race
/// in the mock's C shows under valgrind's helgrind (.ci/run); the other threaded tests finish
/// each thread within one slice under valgrind.
#[test]
fn runtime_threads_overlap_in_every_kind_of_call() {
    const THREADS: usize = 4;
    const ROUNDS: usize = 25;
    const GLOBAL_FAULTS: [&str; THREADS] =
        ["aclrtSynchronizeDevice", "aclrtGetDevice", "aclSetAclOpExecutorRepeatable", "aclDestroyAclOpExecutor"];
    let m = Mock::new();
    let c = m.c;
    let start = std::sync::Barrier::new(THREADS);
    let shape = [2i64, 3, 2];
    let spec = f32_spec(&shape);
    let stat = f32_spec(&[3]);
    std::thread::scope(|sc| {
        let threads: Vec<_> = (0..THREADS)
            .map(|k| {
                let (start, spec, stat) = (&start, &spec, &stat);
                sc.spawn(move || {
                    let mut rng = Rng(77 + k as u64);
                    let (dy, x) = (rng.vec(12, -1.0, 1.0), rng.vec(12, -1.0, 1.0));
                    let (mean, inv) = ([0.5f32, -0.25, 0.0], [1.0f32, 2.0, 0.5]);
                    let (want_dy, want_xmu, _) = replica(spec, &dy, spec, &x, &mean, &inv, 3);
                    let before = mock::thread_stats();
                    start.wait();
                    // SAFETY: each thread binds the device and uses only its own objects; host
                    // buffers outlive the synchronizations that use them.
                    unsafe {
                        assert_eq!(c.acl.aclrtSetDevice(0), 0);
                        let mut s = ptr::null_mut();
                        assert_eq!(c.acl.aclrtCreateStream(&mut s), 0);
                        let mut ev: aclrtEvent = ptr::null_mut();
                        assert_eq!(c.acl.aclrtCreateEvent(&mut ev), 0);
                        let mut host = [0u8; 8];
                        assert_eq!(c.acl.aclrtFree(host.as_mut_ptr().cast()), 107000, "a deliberate violation");
                        assert!(!c.acl.aclGetRecentErrMsg().is_null());
                        // Valgrind runs one thread at a time: yielding before each call lets it
                        // switch threads there, so that any call may follow another thread's call
                        // with no lock handoff in between (what helgrind needs to see a race).
                        let y = std::thread::yield_now;
                        let malloc = |bytes: usize| {
                            let mut p = ptr::null_mut();
                            y();
                            let st = c.acl.aclrtMalloc(&mut p, bytes, aclrtMemMallocPolicy::ACL_MEM_MALLOC_HUGE_FIRST);
                            assert_eq!(st, 0);
                            p
                        };
                        let tensor = |sp: &Spec, p: *mut c_void| {
                            y();
                            let t = c.nnopbase.aclCreateTensor(
                                sp.shape.as_ptr(),
                                sp.shape.len() as u64,
                                sp.dt,
                                sp.strides.as_ptr(),
                                0,
                                ND,
                                sp.storage_dims.as_ptr(),
                                sp.storage_dims.len() as u64,
                                p,
                            );
                            assert!(!t.is_null());
                            t
                        };
                        let inputs = [encode(F32, &dy), encode(F32, &x), encode(F32, &mean), encode(F32, &inv)];
                        for round in 0..ROUNDS {
                            let mems: Vec<*mut c_void> = [48, 48, 12, 12, 12, 12].into_iter().map(malloc).collect();
                            for (p, b) in mems.iter().zip(&inputs) {
                                y();
                                assert_eq!(c.acl.aclrtMemcpyAsync(*p, b.len(), b.as_ptr().cast(), b.len(), H2D, s), 0);
                            }
                            y();
                            assert_eq!(c.acl.aclrtMemset(mems[4], 12, 0, 12), 0);
                            let specs = [spec, spec, stat, stat, stat, stat];
                            let ts: Vec<*mut aclTensor> = (0..6).map(|i| tensor(specs[i], mems[i])).collect();
                            let (mut size, mut ex) = (0, ptr::null_mut());
                            y();
                            let st = bnrb(c).aclnnBatchNormReduceBackwardGetWorkspaceSize(
                                ts[0],
                                ts[1],
                                ts[2],
                                ts[3],
                                ptr::null(),
                                true,
                                false,
                                false,
                                ts[4],
                                ts[5],
                                ptr::null_mut(),
                                ptr::null_mut(),
                                &mut size,
                                &mut ex,
                            );
                            assert_eq!(st, 0);
                            let ws = malloc(size as usize);
                            y();
                            assert_eq!(bnrb(c).aclnnBatchNormReduceBackward(ws, size, ex, s), 0);
                            let mut out = [0u8; 24];
                            let dst: *mut c_void = out.as_mut_ptr().cast();
                            y();
                            assert_eq!(c.acl.aclrtMemcpyAsync(dst, 12, mems[4], 12, D2H, s), 0);
                            y();
                            assert_eq!(c.acl.aclrtRecordEvent(ev, s), 0);
                            y();
                            if round % 2 == 0 {
                                assert_eq!(c.acl.aclrtSynchronizeEvent(ev), 0);
                            } else {
                                assert_eq!(c.acl.aclrtSynchronizeStream(s), 0);
                            }
                            y();
                            assert_eq!(c.acl.aclrtMemcpy(at(dst, 12), 12, mems[5], 12, D2H), 0);
                            assert_eq!(decode(F32, &out[..12]), want_dy);
                            assert_eq!(decode(F32, &out[12..]), want_xmu);
                            y();
                            assert_eq!(c.acl.aclrtFree(ws), 0);
                            for t in ts {
                                y();
                                assert_eq!(c.nnopbase.aclDestroyTensor(t), 0);
                            }
                            for p in mems {
                                y();
                                assert_eq!(c.acl.aclrtFree(p), 0);
                            }
                            mock::fail_next_on_this_thread("aclrtGetDeviceCount", 507899);
                            let mut n = 0u32;
                            y();
                            assert_eq!(c.acl.aclrtGetDeviceCount(&mut n), 507899);
                            assert!(!c.acl.aclGetRecentErrMsg().is_null());
                            y();
                            assert_eq!(c.acl.aclrtGetDeviceCount(&mut n), 0);
                            // a process-wide fault, on a function only this thread calls: while
                            // armed, every thread's calls take the fault table's locked path
                            mock::fail_next(GLOBAL_FAULTS[k], 507899);
                            y();
                            let st = match k {
                                0 => c.acl.aclrtSynchronizeDevice(),
                                1 => c.acl.aclrtGetDevice(&mut 0),
                                2 => c.nnopbase.aclSetAclOpExecutorRepeatable(ptr::null_mut()),
                                _ => c.nnopbase.aclDestroyAclOpExecutor(ptr::null_mut()),
                            };
                            assert_eq!(st, 507899);
                            y();
                            assert!(mock::stats().live_allocations >= m.base.live_allocations);
                        }
                        assert_eq!(c.acl.aclrtDestroyEvent(ev), 0);
                        assert_eq!(c.acl.aclrtDestroyStream(s), 0);
                        assert_eq!(c.acl.aclrtResetDevice(0), 0);
                    }
                    let after = mock::thread_stats();
                    (after.violations - before.violations, after.device_mallocs - before.device_mallocs)
                })
            })
            .collect();
        for t in threads {
            assert_eq!(t.join().unwrap(), (1, 7 * ROUNDS as u64), "(violations, mallocs) of a thread");
        }
    });
    let after = mock::stats();
    let want = MockStats {
        device_mallocs: m.base.device_mallocs + (THREADS * ROUNDS * 7) as u64,
        violations: m.base.violations + THREADS as u64,
        ..with_call_totals(m.base, &after)
    };
    assert_eq!(after, want);
    assert!(m.messages().iter().all(|v| v.contains("is not a live device allocation")), "{:#?}", m.messages());
}

/// `base` with the call totals (synchronises, frees, blocking copies, host allocations) of
/// `after`: they grow with every call, so snapshots compare only the other counters.
fn with_call_totals(base: MockStats, after: &MockStats) -> MockStats {
    MockStats {
        stream_synchronizes: after.stream_synchronizes,
        event_synchronizes: after.event_synchronizes,
        device_synchronizes: after.device_synchronizes,
        device_frees: after.device_frees,
        blocking_copies: after.blocking_copies,
        host_mallocs: after.host_mallocs,
        ..base
    }
}

// ---------------------------------------------------------------------------------------------
// Poison: what a skipped task should have written cannot be read as if it had been (issue 8)

const F32: aclDataType = aclDataType::ACL_FLOAT;

/// `p` moved by `bytes` (device addresses are only passed to the mock, never dereferenced here).
fn at(p: *mut c_void, bytes: usize) -> *mut c_void {
    p.cast::<u8>().wrapping_add(bytes).cast()
}

/// Queues phase 2 of `args` (over `case`) on `s` with a fresh workspace, then frees the case's
/// input before the stream runs it: the synchronize skips the kernel (507015). Two violations
/// (the free while queued, the skip). The input's `mem` is null afterwards (`release` then only
/// destroys its tensor). Returns the workspace, still allocated.
fn skip_launch(m: &Mock, case: &mut Case, args: &Args, s: aclrtStream) -> *mut c_void {
    let (st, size, ex) = m.phase1(args);
    assert_eq!(st, 0, "phase 1: {}", m.err());
    let ws = m.malloc(size as usize);
    assert_eq!(m.launch(ws, size, ex, s), 0, "phase 2: {}", m.err());
    let input = std::mem::replace(&mut case.devs[1].mem, ptr::null_mut());
    assert_eq!(m.free(input), 0);
    assert_eq!(m.sync(s), 507015, "the kernel is skipped");
    ws
}

/// At the end of a poison test: every object released, all poison gone, `violations` new ones.
#[track_caller]
fn expect_clean_end(m: &Mock, violations: u64) {
    let after = mock::stats();
    let want = MockStats {
        device_mallocs: after.device_mallocs,
        violations: m.base.violations + violations,
        ..with_call_totals(m.base, &after)
    };
    assert_eq!(after, want);
    assert_eq!(mock::live_events_and_queued_tasks().1, 0);
}

#[test]
fn poison_skipped_kernel_outputs_fail_to_read_until_rewritten() {
    let m = Mock::new();
    assert_eq!(m.base.poisoned_bytes, 0, "an earlier test left poison behind");
    let s = m.stream();
    let mut case = ut_case(&m, F32);
    let args = case.args();
    let ws = skip_launch(&m, &mut case, &args, s);
    let msg = m.err();
    for needle in [
        "aclrtSynchronizeStream failed. ERROR: 507015",
        "(aclnnBatchNormReduceBackward) was skipped: the device memory of input [",
    ] {
        assert!(msg.contains(needle), "no `{needle}` in: {msg}");
    }
    m.expect_violations(2, "was freed before the task ran");
    assert_eq!(m.poisoned_bytes(), 4 * 12 + 32, "four outputs of three f32, and the 32-byte workspace");
    for (slot, name) in [(5, "sumDy"), (6, "sumDyXmu"), (7, "gradWeight"), (8, "gradBias")] {
        m.expect_poisoned(
            case.devs[slot].mem,
            12,
            &[
                &format!("they are bytes of {name} that task #"),
                "(aclnnBatchNormReduceBackward queued on stream 0x",
                "was skipped: the device memory of input [",
                "was freed before it ran. Nothing was copied.",
            ],
        );
    }
    m.expect_poisoned(ws, 32, &["they are bytes of workspace that task #"]);
    m.expect_poisoned(at(case.devs[5].mem, 5), 1, &["they are bytes of sumDy"]);
    m.expect_violations(2, "");
    // freeing an allocation drops its poison
    assert_eq!(m.free(ws), 0);
    assert_eq!(m.poisoned_bytes(), 48);
    // a partial rewrite clears exactly the bytes written: channel 0 by a copy, channel 2 by a memset
    let sum_dy = case.devs[5].mem;
    assert_eq!(m.h2d(sum_dy, &1.5f32.to_le_bytes()), 0);
    assert_eq!(m.poisoned_bytes(), 44);
    assert_eq!(m.d2h(sum_dy, 4), 1.5f32.to_le_bytes());
    m.expect_poisoned(sum_dy, 12, &[&format!("(at {:p})", at(sum_dy, 4))]);
    assert_eq!(m.memset(at(sum_dy, 8), 0, 4), 0);
    assert_eq!(m.poisoned_bytes(), 40);
    assert_eq!(m.d2h(at(sum_dy, 8), 4), [0u8; 4]);
    m.expect_poisoned(at(sum_dy, 4), 4, &["they are bytes of sumDy"]);
    m.expect_poisoned(at(sum_dy, 3), 2, &[&format!("(at {:p})", at(sum_dy, 4))]);
    m.expect_poisoned(at(sum_dy, 7), 2, &[&format!("(at {:p})", at(sum_dy, 7))]);
    // a full rewrite: the read succeeds, with the new values
    assert_eq!(m.h2d(case.devs[6].mem, &encode(F32, &[7.0, 8.0, 9.0])), 0);
    assert_eq!(m.poisoned_bytes(), 28);
    assert_eq!(m.read(&case.devs[6]), [7.0, 8.0, 9.0]);
    // free drops poison; fresh memory (perhaps at the same address) is clean garbage
    let grad_weight = std::mem::replace(&mut case.devs[7].mem, ptr::null_mut());
    assert_eq!(m.free(grad_weight), 0);
    assert_eq!(m.poisoned_bytes(), 16);
    let fresh = m.malloc(12);
    assert_eq!(m.d2h(fresh, 12), [mock::GARBAGE_BYTE; 12]);
    assert_eq!(m.free(fresh), 0);
    m.expect_violations(2, "");
    case.release(&m);
    assert_eq!(m.destroy_stream(s), 0);
    expect_clean_end(&m, 2);
}

#[test]
fn poison_propagates_through_kernels_and_async_copies() {
    let m = Mock::new();
    let s = m.stream();
    let mut a = ut_case(&m, F32);
    let args_a = a.args();
    let ws_a = skip_launch(&m, &mut a, &args_a, s);
    assert_eq!(m.free(ws_a), 0);
    m.expect_violations(2, "was freed before the task ran");
    assert_eq!(m.poisoned_bytes(), 48);
    // kernel B reads A's sumDy as its mean: skipped, an error status but no new violation...
    let b = ut_case(&m, F32);
    let mut args = b.args();
    args.t[2] = a.devs[5].t;
    let (st, size, ex) = m.phase1(&args);
    assert_eq!(st, 0);
    let ws_b = m.malloc(size as usize);
    assert_eq!(m.launch(ws_b, size, ex, s), 0);
    assert_eq!(m.sync(s), 507015);
    let msg = m.err();
    for needle in [
        "aclrtSynchronizeStream failed. ERROR: 507015",
        "(aclnnBatchNormReduceBackward) was skipped: mean [",
        "holds bytes that were never written",
        "they are bytes of sumDy that task #",
    ] {
        assert!(msg.contains(needle), "no `{needle}` in: {msg}");
    }
    m.expect_violations(2, "");
    // ...and poisons what it should have written, naming the chain back to A
    assert_eq!(m.poisoned_bytes(), 48 + 48 + 32);
    m.expect_poisoned(
        b.devs[8].mem,
        12,
        &[
            "they are bytes of gradBias that task #",
            "was skipped: mean [",
            "they are bytes of sumDy that task #",
            "was freed before it ran",
        ],
    );
    assert_eq!(m.free(ws_b), 0);
    // queued copies reading poison are skipped; a device destination is poisoned in turn
    let dst = m.upload(&[0u8; 12]);
    let mut host = [0x11u8; 12];
    // SAFETY: `host` outlives the synchronization; the mock checks the device ranges.
    unsafe {
        assert_eq!(m.c.acl.aclrtMemcpyAsync(dst, 12, a.devs[8].mem, 12, D2D, s), 0);
        assert_eq!(m.c.acl.aclrtMemcpyAsync(host.as_mut_ptr().cast(), 12, a.devs[8].mem, 12, D2H, s), 0);
    }
    assert_eq!(m.sync(s), 507053);
    let msg = m.err();
    for needle in [
        "aclrtSynchronizeStream failed. ERROR: 507053",
        "(aclrtMemcpyAsync) was skipped: the copy's source [",
        "they are bytes of gradBias that task #",
    ] {
        assert!(msg.contains(needle), "no `{needle}` in: {msg}");
    }
    assert_eq!(host, [0x11u8; 12], "the skipped copy wrote nothing");
    assert_eq!(m.poisoned_bytes(), 96 + 12);
    m.expect_poisoned(
        dst,
        12,
        &[
            "they are bytes of the copy's destination that task #",
            "(aclrtMemcpyAsync queued on stream 0x",
            "they are bytes of gradBias that task #",
        ],
    );
    // a synchronous device-to-device copy from poison fails and leaves its destination alone
    let clean = m.upload(&[5u8; 12]);
    // SAFETY: both ranges are device memory the mock checks.
    assert_eq!(unsafe { m.c.acl.aclrtMemcpy(clean, 12, dst, 12, D2D) }, 507053);
    assert!(m.err().contains("Nothing was copied"));
    assert_eq!(m.d2h(clean, 12), [5u8; 12]);
    assert_eq!(m.poisoned_bytes(), 96 + 12);
    m.expect_violations(2, "");
    // queued copies that run clear what they wrote: dst, and A's sumDy (B's mean)
    let ones = encode(F32, &[1.0; 3]);
    // SAFETY: `ones` outlives the synchronization.
    unsafe {
        assert_eq!(m.c.acl.aclrtMemcpyAsync(dst, 12, clean, 12, D2D, s), 0);
        assert_eq!(m.c.acl.aclrtMemcpyAsync(a.devs[5].mem, 12, ones.as_ptr().cast(), 12, H2D, s), 0);
    }
    assert_eq!(m.sync(s), 0, "{}", m.err());
    assert_eq!(m.d2h(dst, 12), [5u8; 12]);
    assert_eq!(m.poisoned_bytes(), 96 - 12);
    // B relaunched: it runs, clears its outputs, and they hold what a clean run computes
    let (st, size, ex) = m.phase1(&args);
    assert_eq!(st, 0);
    assert_eq!(m.launch_sync(size, ex, s), 0, "{}", m.err());
    assert_eq!(m.poisoned_bytes(), 36, "A's three other outputs");
    let v = Rng(0x5EED).vec(24, -8.0, 8.0);
    let reference = Case::new(&m, F32, &[2, 3, 1, 4], &v, &v, &[1.0; 3], &[0.125, 0.1, 0.3]);
    m.expect_ok(&reference.args());
    assert_eq!(b.outputs(&m), reference.outputs(&m));
    m.expect_violations(2, "");
    for p in [dst, clean] {
        assert_eq!(m.free(p), 0);
    }
    for c in [a, b, reference] {
        c.release(&m);
    }
    assert_eq!(m.destroy_stream(s), 0);
    expect_clean_end(&m, 2);
}

#[test]
fn poison_covers_exactly_the_elements_of_strided_views() {
    let m = Mock::new();
    let s = m.stream();
    // one allocation, two interleaved [3] views: even elements = sumDy of a kernel that is skipped
    let shared = m.upload(&encode(F32, &[0.0, 10.0, 0.0, 11.0, 0.0, 12.0]));
    let even = m.create_tensor(&Spec::strided(F32, &[3], &[2], 0, 6), shared);
    let odd = m.create_tensor(&Spec::strided(F32, &[3], &[2], 1, 6), shared);
    assert!(!even.is_null() && !odd.is_null());
    let mut a = ut_case(&m, F32);
    let mut args = a.args();
    args.t[5] = even;
    let ws = skip_launch(&m, &mut a, &args, s);
    assert_eq!(m.free(ws), 0);
    assert_eq!(m.poisoned_bytes(), 12 + 3 * 12, "the even elements and the three other outputs");
    for (k, v) in [10.0f32, 11.0, 12.0].into_iter().enumerate() {
        assert_eq!(m.d2h(at(shared, 8 * k + 4), 4), v.to_le_bytes(), "odd element {k} is not poisoned");
        m.expect_poisoned(at(shared, 8 * k), 4, &["they are bytes of sumDy that task #"]);
    }
    m.expect_poisoned(at(shared, 4), 8, &[&format!("(at {:p})", at(shared, 8))]);
    // a kernel reading the odd view runs, though its span covers poisoned even elements
    let b = ut_case(&m, F32);
    let mut args_b = b.args();
    args_b.t[2] = odd;
    m.expect_ok(&args_b);
    assert_eq!(m.poisoned_bytes(), 48);
    // one reading the even view is skipped (and poisons B's outputs)
    let mut args_c = b.args();
    args_c.t[3] = even;
    let (st, size, ex) = m.phase1(&args_c);
    assert_eq!(st, 0);
    assert_eq!(m.launch_sync(size, ex, s), 507015);
    assert!(m.err().contains("was skipped: invstd ["));
    m.expect_poisoned(b.devs[6].mem, 12, &["they are bytes of sumDyXmu", "was skipped: invstd ["]);
    assert_eq!(m.poisoned_bytes(), 48 + 48);
    // a kernel writing the even view clears exactly its elements; the odd ones keep their values
    let c = ut_case(&m, F32);
    let mut args_d = c.args();
    args_d.t[5] = even;
    m.expect_ok(&args_d);
    assert_eq!(m.poisoned_bytes(), 36 + 48);
    let v = Rng(0x5EED).vec(24, -8.0, 8.0);
    let spec = f32_spec(&[2, 3, 1, 4]);
    let sum_dy = replica(&spec, &v, &spec, &v, &[-2.0, 2.0, 1.0], &[0.125, 0.1, 0.3], 3).0;
    let all = decode(F32, &m.d2h(shared, 24));
    assert_eq!(all, [sum_dy[0], 10.0, sum_dy[1], 11.0, sum_dy[2], 12.0]);
    m.expect_violations(2, "");
    for t in [even, odd] {
        assert_eq!(m.destroy_tensor(t), 0);
    }
    assert_eq!(m.free(shared), 0);
    for case in [a, b, c] {
        case.release(&m);
    }
    assert_eq!(m.destroy_stream(s), 0);
    expect_clean_end(&m, 2);
}

// ---------------------------------------------------------------------------------------------
// Values: replica of the hardware algorithm (bit-exact) and an f64 reference

/// The mock's algorithm in Rust: f32, sequential within blocks of 256 elements per channel,
/// blocks added in order; then sumDyXmu = Σdy·x − mean·Σdy, gradWeight = sumDyXmu·invstd.
/// `dy`/`x` are storages (already rounded through their dtype); mean/invstd per channel.
fn replica(
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

/// f64 two-pass reference per channel: (Σdy, Σdy·(x−mean), Σ|dy·x| + |mean|·Σ|dy|, Σ|dy|), the
/// last two being the scales of the f32 error bounds of sumDyXmu and sumDy.
fn reference(dys: &Spec, dy: &[f32], xs: &Spec, x: &[f32], mean: &[f32], c: usize) -> Vec<(f64, f64, f64, f64)> {
    let shape = &dys.shape;
    let total: i64 = shape.iter().product();
    let mut acc = vec![(0f64, 0f64, 0f64, 0f64); c];
    let mut idx = vec![0i64; shape.len()];
    for _ in 0..total {
        let ch = idx[1] as usize;
        let vd = dy[dys.pos(&idx)] as f64;
        let vx = x[xs.pos(&idx)] as f64;
        let a = &mut acc[ch];
        a.0 += vd;
        a.1 += vd * (vx - mean[ch] as f64);
        a.2 += (vd * vx).abs();
        a.3 += vd.abs();
        for d in (0..shape.len()).rev() {
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    acc.iter().zip(mean).map(|(a, m)| (a.0, a.1, a.2 + (*m as f64).abs() * a.3, a.3)).collect()
}

#[derive(Clone, Copy, Debug)]
enum Layout {
    Contiguous,
    Reversed,
    Padded,
    ChannelsLast,
}

/// A view of `shape` in the given layout over a storage of its own.
fn layout(dt: aclDataType, shape: &[i64], l: Layout, rng: &mut Rng) -> Spec {
    let r = shape.len();
    match l {
        Layout::Contiguous => Spec::contiguous(dt, shape),
        Layout::Reversed => {
            let rev: Vec<i64> = shape.iter().rev().copied().collect();
            let rs = contiguous_strides(&rev);
            let strides: Vec<i64> = (0..r).map(|i| rs[r - 1 - i]).collect();
            Spec::strided(dt, shape, &strides, 0, shape.iter().product())
        }
        Layout::Padded => {
            let start: Vec<i64> = (0..r).map(|_| rng.below(3) as i64).collect();
            let parent: Vec<i64> = shape.iter().zip(&start).map(|(d, s)| d + s + rng.below(2) as i64).collect();
            let strides = contiguous_strides(&parent);
            let offset = start.iter().zip(&strides).map(|(a, b)| a * b).sum();
            Spec::strided(dt, shape, &strides, offset, parent.iter().product())
        }
        Layout::ChannelsLast => {
            // memory order: dim 0, dims 2.., dim 1 fastest
            let mut order: Vec<usize> = vec![0];
            order.extend(2..r);
            order.push(1);
            let mut strides = vec![0i64; r];
            let mut acc = 1;
            for &d in order.iter().rev() {
                strides[d] = acc;
                acc *= shape[d];
            }
            Spec::strided(dt, shape, &strides, 0, shape.iter().product())
        }
    }
}

/// A [C] vector with stride `stride` and offset `offset` over a storage with one spare element.
fn vec_spec(dt: aclDataType, c: i64, stride: i64, offset: i64) -> Spec {
    Spec::strided(dt, &[c], &[stride], offset, offset + (c - 1) * stride + 2)
}

fn out_eps(dt: aclDataType) -> f64 {
    match dt {
        aclDataType::ACL_FLOAT => 1e-6,
        aclDataType::ACL_FLOAT16 => 2f64.powi(-10),
        _ => 2f64.powi(-7),
    }
}

/// Rounds a replica f32 result to the output dtype, as the mock stores it.
fn to_dtype(dt: aclDataType, v: f32) -> f32 {
    quantize(dt, &[v])[0]
}

fn same_bits(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

struct ValueCase {
    shape: Vec<i64>,
    dt: aclDataType,
    stat_dt: aclDataType,
    out_dt: aclDataType,
    dy_layout: Layout,
    x_layout: Layout,
    stat_stride: i64,
    out_stride: i64,
    mean_range: (f32, f32),
}

fn check_values(m: &Mock, rng: &mut Rng, vc: &ValueCase) {
    let c = vc.shape[1];
    let cu = c as usize;
    let dys = layout(vc.dt, &vc.shape, vc.dy_layout, rng);
    let xs = layout(vc.dt, &vc.shape, vc.x_layout, rng);
    let ms = vec_spec(vc.stat_dt, c, vc.stat_stride, 1);
    let is = vec_spec(vc.stat_dt, c, vc.stat_stride, 0);
    let os = vec_spec(vc.out_dt, c, vc.out_stride, 1);
    let dy = quantize(vc.dt, &rng.vec(dys.storage_numel() as usize, -2.0, 2.0));
    let x = quantize(vc.dt, &rng.vec(xs.storage_numel() as usize, -2.0, 2.0));
    let mean = quantize(vc.stat_dt, &rng.vec(ms.storage_numel() as usize, vc.mean_range.0, vc.mean_range.1));
    let inv = quantize(vc.stat_dt, &rng.vec(is.storage_numel() as usize, 0.1, 2.0));
    let specs =
        [dys.clone(), xs.clone(), ms.clone(), is.clone(), f32_spec(&[c]), os.clone(), os.clone(), os.clone(), os];
    let case = Case::from_specs(m, specs, &dy, &x, &mean, &inv);
    m.expect_ok(&case.args());
    let outs = case.outputs(m);

    let mean_c: Vec<f32> = (0..c).map(|i| mean[ms.pos_linear(i)]).collect();
    let inv_c: Vec<f32> = (0..c).map(|i| inv[is.pos_linear(i)]).collect();
    let (r_dy, r_xmu, r_gw) = replica(&dys, &dy, &xs, &x, &mean_c, &inv_c, cu);
    let refs = reference(&dys, &dy, &xs, &x, &mean_c, cu);
    let os = &case.devs[5].spec;
    let what = format!(
        "{:?} {:?}/{:?}/{:?} dy {:?} x {:?}",
        vc.shape, vc.dt, vc.stat_dt, vc.out_dt, vc.dy_layout, vc.x_layout
    );
    for (k, out) in outs.iter().enumerate() {
        // positions outside the output view keep the sentinel
        for (p, v) in out.iter().enumerate() {
            let in_view = (0..c).any(|i| os.pos_linear(i) == p);
            if !in_view {
                assert_eq!(*v, to_dtype(vc.out_dt, SENTINEL), "{what}: output {k} written outside its view at {p}");
            }
        }
        let got: Vec<f32> = (0..c).map(|i| out[os.pos_linear(i)]).collect();
        let (exact, want_f64): (Vec<f32>, Vec<f64>) = match k {
            0 | 3 => (r_dy.clone(), refs.iter().map(|r| r.0).collect()),
            1 => (r_xmu.clone(), refs.iter().map(|r| r.1).collect()),
            _ => (r_gw.clone(), refs.iter().zip(&inv_c).map(|(r, s)| r.1 * *s as f64).collect()),
        };
        for i in 0..cu {
            let e = to_dtype(vc.out_dt, exact[i]);
            assert!(same_bits(got[i], e), "{what}: output {k}[{i}] = {} but the replica gives {e}", got[i]);
            let scale = if k == 0 || k == 3 { refs[i].3 } else { refs[i].2 };
            let scale = if k == 2 { scale * inv_c[i] as f64 } else { scale };
            let tol = 1e-5 * scale + out_eps(vc.out_dt) * want_f64[i].abs() + 1e-30;
            let err = (got[i] as f64 - want_f64[i]).abs();
            assert!(
                err <= tol,
                "{what}: output {k}[{i}] = {} vs f64 {} (err {err:e} > tol {tol:e})",
                got[i],
                want_f64[i]
            );
        }
    }
    case.release(m);
}

#[test]
fn values_random_dtypes_and_strided_views() {
    let m = Mock::new();
    let mut rng = Rng(0xC0FFEE);
    let f32_ = aclDataType::ACL_FLOAT;
    let f16_ = aclDataType::ACL_FLOAT16;
    let bf16_ = aclDataType::ACL_BF16;
    let shapes: [&[i64]; 6] = [&[7, 1], &[1, 21], &[4, 6, 5], &[3, 4, 2, 5], &[2, 3, 2, 2, 3], &[20, 2, 16, 9]];
    let layouts = [Layout::Contiguous, Layout::Reversed, Layout::Padded, Layout::ChannelsLast];
    let dts = [(f32_, f32_, f32_), (f16_, f16_, f16_), (bf16_, bf16_, bf16_), (f16_, f32_, f32_), (bf16_, f16_, bf16_)];
    let mut n = 0;
    for (si, shape) in shapes.iter().enumerate() {
        for (di, &(dt, stat_dt, out_dt)) in dts.iter().enumerate() {
            let vc = ValueCase {
                shape: shape.to_vec(),
                dt,
                stat_dt,
                out_dt,
                dy_layout: layouts[(si + di) % 4],
                x_layout: layouts[(si + 2 * di + 1) % 4],
                stat_stride: 1 + (di as i64 % 3),
                out_stride: 1 + (si as i64 % 2),
                mean_range: (-1.0, 1.0),
            };
            check_values(&m, &mut rng, &vc);
            n += 1;
        }
    }
    assert_eq!(n, 30);
    m.expect_violations(0, "");
}

#[test]
fn values_long_channel_keeps_f32_accuracy() {
    let m = Mock::new();
    let mut rng = Rng(42);
    let vc = ValueCase {
        shape: vec![1024, 2, 96],
        dt: aclDataType::ACL_FLOAT,
        stat_dt: aclDataType::ACL_FLOAT,
        out_dt: aclDataType::ACL_FLOAT,
        dy_layout: Layout::Contiguous,
        x_layout: Layout::ChannelsLast,
        stat_stride: 1,
        out_stride: 1,
        mean_range: (-0.5, 0.5),
    };
    check_values(&m, &mut rng, &vc);
    m.expect_violations(0, "");
}

/// Runs the op on dy of shape [1, n] (x = 1, mean = 0) with sumDy and gradBias in `out_dts`;
/// returns (sumDy, gradBias) as raw bytes.
fn per_element(m: &Mock, in_dt: aclDataType, dy_bytes: &[u8], n: i64, out_dts: [aclDataType; 2]) -> [Vec<u8>; 2] {
    let dys = Spec::contiguous(in_dt, &[1, n]);
    let dy_mem = m.upload(dy_bytes);
    let dy_t = m.create_tensor(&dys, dy_mem);
    let x = m.dev(&dys, &vec![1.0; n as usize]);
    let zeros = m.dev(&f32_spec(&[n]), &vec![0.0; n as usize]);
    let ones = m.dev(&f32_spec(&[n]), &vec![1.0; n as usize]);
    let o0 = m.dev(&Spec::contiguous(out_dts[0], &[n]), &vec![0.0; n as usize]);
    let o1 = m.dev(&Spec::contiguous(out_dts[1], &[n]), &vec![0.0; n as usize]);
    let mut a = Args { t: [ptr::null_mut(); 9], g: [false, false, true] };
    a.t[0] = dy_t;
    a.t[1] = x.t;
    a.t[2] = zeros.t;
    a.t[3] = ones.t;
    a.t[8] = o1.t;
    m.expect_ok(&a);
    // sumDy needs inputG (and so sumDyXmu): reuse o1's shape for a throwaway sumDyXmu
    let xmu = m.dev(&f32_spec(&[n]), &vec![0.0; n as usize]);
    let mut b = a;
    b.g = [true, false, false];
    b.t[5] = o0.t;
    b.t[6] = xmu.t;
    b.t[8] = ptr::null_mut();
    m.expect_ok(&b);
    let out = [m.d2h(o0.mem, o0.bytes), m.d2h(o1.mem, o1.bytes)];
    assert_eq!(m.destroy_tensor(dy_t), 0);
    assert_eq!(m.free(dy_mem), 0);
    for d in [x, zeros, ones, o0, o1, xmu] {
        m.release(d);
    }
    out
}

#[test]
fn values_f16_bf16_conversions_exhaustive_and_rounding() {
    let m = Mock::new();
    let n = 1 << 16;
    // every f16 and every bf16 bit pattern, read as input and written out as f32 (sumDy = 0 + dy)
    for in_dt in [aclDataType::ACL_FLOAT16, aclDataType::ACL_BF16] {
        let bytes: Vec<u8> = (0..=u16::MAX).flat_map(|b| b.to_le_bytes()).collect();
        let [sum_dy, grad_bias] = per_element(&m, in_dt, &bytes, n, [aclDataType::ACL_FLOAT, aclDataType::ACL_FLOAT]);
        let got = decode(aclDataType::ACL_FLOAT, &sum_dy);
        assert_eq!(sum_dy, grad_bias);
        for (b, g) in (0..=u16::MAX).zip(got) {
            let v = if in_dt == aclDataType::ACL_FLOAT16 {
                f16::from_bits(b).to_f32()
            } else {
                bf16::from_bits(b).to_f32()
            };
            let want = 0.0f32 + v;
            assert!(same_bits(g, want), "{in_dt:?} bits {b:#06x}: got {g} want {want}");
        }
    }
    // f32 -> f16 / bf16 rounding (nearest even) on random bit patterns and edge cases
    let mut rng = Rng(0xF16);
    let mut vals: Vec<f32> = (0..n - 32).map(|_| f32::from_bits(rng.next() as u32)).collect();
    vals.extend([
        65504.0,
        65519.99,
        65520.0,
        -65520.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -f32::NAN,
        2f32.powi(-24),
        2f32.powi(-25),
        2f32.powi(-25) * 1.0001,
        3.0 * 2f32.powi(-25),
        2f32.powi(-14) - 2f32.powi(-25),
        5.960_464_5e-8,
        6.103_515_6e-5,
        1.0 + 2f32.powi(-11),
        1.0 + 3.0 * 2f32.powi(-11),
        1.0 + 2f32.powi(-8),
        1.0 + 3.0 * 2f32.powi(-8),
        f32::MAX,
        f32::MIN_POSITIVE,
        1e-45,
        -0.0,
        0.0,
        3.389_531_4e38,
        3.402_823_4e38,
        -1.0e-40,
        0.333_333_34,
        -2.5,
        1.5,
        0.1,
        7.0,
    ]);
    let bytes = encode(aclDataType::ACL_FLOAT, &vals);
    let [h, b] = per_element(&m, aclDataType::ACL_FLOAT, &bytes, n, [aclDataType::ACL_FLOAT16, aclDataType::ACL_BF16]);
    for (i, v) in vals.iter().enumerate() {
        let s = 0.0f32 + *v;
        let gh = f16::from_le_bytes([h[2 * i], h[2 * i + 1]]);
        let gb = bf16::from_le_bytes([b[2 * i], b[2 * i + 1]]);
        let (wh, wb) = (f16::from_f32(s), bf16::from_f32(s));
        assert!(gh.to_bits() == wh.to_bits() || (gh.is_nan() && wh.is_nan()), "f16({s:e}): {gh} vs {wh}");
        assert!(gb.to_bits() == wb.to_bits() || (gb.is_nan() && wb.is_nan()), "bf16({s:e}): {gb} vs {wb}");
    }
    m.expect_violations(0, "");
}

#[test]
fn values_nan_and_inf_propagate() {
    let m = Mock::new();
    let dy = [1.0, f32::INFINITY, f32::NAN, 1.0, 2.0, 1.0, 1.0, 3.0];
    let x = [1.0, 1.0, 1.0, f32::NAN, 1.0, 1.0, f32::INFINITY, 1.0];
    let case = Case::new(&m, aclDataType::ACL_FLOAT, &[2, 4], &dy, &x, &[0.0; 4], &[1.0; 4]);
    m.expect_ok(&case.args());
    let [sum_dy, xmu, _, _] = case.outputs(&m);
    assert_eq!(sum_dy[0], 3.0);
    assert_eq!(sum_dy[1], f32::INFINITY);
    assert!(sum_dy[2].is_nan());
    assert_eq!(sum_dy[3], 4.0);
    assert!(xmu[1].is_nan(), "inf − 0·inf is NaN: {xmu:?}");
    assert!(xmu[2].is_nan() && xmu[3].is_nan());
    case.release(&m);
    m.expect_violations(0, "");
}

// ---------------------------------------------------------------------------------------------
// Events, pinned host memory and call counters (issue 16)

fn query(c: &Cann, e: aclrtEvent) -> (i32, aclrtEventRecordedStatus) {
    let mut status = aclrtEventRecordedStatus::ACL_EVENT_RECORDED_STATUS_COMPLETE;
    // SAFETY: `status` is a valid out-pointer; the mock checks the handle.
    let st = unsafe { c.acl.aclrtQueryEventStatus(e, &mut status) };
    (st, status)
}

/// Events as CANN documents them: a query never blocks (NOT_READY until the record ran, also
/// for an event never recorded), elapsed time needs both events completed, and destroying an
/// event that a queued aclrtStreamWaitEvent still refers to is a violation.
#[test]
fn events_query_elapsed_time_and_destroy_while_waited_on() {
    const DONE: aclrtEventRecordedStatus = aclrtEventRecordedStatus::ACL_EVENT_RECORDED_STATUS_COMPLETE;
    const NOT_READY: aclrtEventRecordedStatus = aclrtEventRecordedStatus::ACL_EVENT_RECORDED_STATUS_NOT_READY;
    let m = Mock::new();
    let (a, b) = (m.stream(), m.stream());
    let c = m.c;
    let d = m.malloc(4096);
    let src: Vec<u8> = (0..4096u32).map(|i| (i * 7 % 251) as u8).collect();
    let mut start: aclrtEvent = ptr::null_mut();
    let mut end: aclrtEvent = ptr::null_mut();
    let before = mock::stats();
    // SAFETY: handles from the mock; host buffers outlive the synchronisations below.
    unsafe {
        assert_eq!(c.acl.aclrtCreateEvent(&mut start), 0);
        assert_eq!(c.acl.aclrtCreateEvent(&mut end), 0);
        assert_eq!(query(c, start), (0, NOT_READY), "never recorded");
        assert_eq!(c.acl.aclrtRecordEvent(start, a), 0);
        assert_eq!(c.acl.aclrtMemcpyAsync(d, 4096, src.as_ptr().cast(), 4096, H2D, a), 0);
        assert_eq!(c.acl.aclrtRecordEvent(end, a), 0);
        assert_eq!(query(c, end), (0, NOT_READY), "queued, not run: a query runs nothing");
        let mut ms = -1f32;
        assert_eq!(c.acl.aclrtEventElapsedTime(&mut ms, start, end), 107000, "not completed yet");
        assert_eq!(ms, -1.0, "nothing written on failure");
        assert_eq!(c.acl.aclrtSynchronizeEvent(end), 0);
        assert_eq!(query(c, start), (0, DONE));
        assert_eq!(query(c, end), (0, DONE));
        assert_eq!(c.acl.aclrtEventElapsedTime(&mut ms, start, end), 0, "{}", m.err());
        assert!(ms.is_finite() && ms >= 0.0, "{ms}");
        // a wait queued on b keeps the event in use until b runs it
        assert_eq!(c.acl.aclrtRecordEvent(end, a), 0);
        assert_eq!(c.acl.aclrtStreamWaitEvent(b, end), 0);
        assert_eq!(c.acl.aclrtDestroyEvent(end), 107000);
        m.expect_violations(1, "is still waited for by");
        assert_eq!(m.sync(b), 0);
        assert_eq!(c.acl.aclrtDestroyEvent(end), 0, "{}", m.err());
        assert_eq!(c.acl.aclrtDestroyEvent(start), 0);
    }
    let after = mock::stats();
    assert_eq!(after.event_synchronizes - before.event_synchronizes, 1);
    assert_eq!(after.stream_synchronizes - before.stream_synchronizes, 1);
    assert_eq!(m.d2h(d, 4096), src);
    assert_eq!(m.sync(a), 0);
    assert_eq!(m.free(d), 0);
    assert_eq!(m.destroy_stream(a), 0);
    assert_eq!(m.destroy_stream(b), 0);
    m.expect_violations(1, "");
}

/// The cross-stream hazard detector on the raw API: two copies on different streams writing the
/// same device bytes, with nothing ordering them, are a violation; the same pair ordered by an
/// event (record on the first stream, wait on the second) is accepted and the second write wins.
#[test]
fn hazard_detector_catches_an_unordered_pair_and_accepts_an_event_ordered_one() {
    let m = Mock::new();
    let (a, b) = (m.stream(), m.stream());
    let c = m.c;
    let d = m.malloc(256);
    let first: Vec<u8> = (0..256u32).map(|i| (i % 13) as u8 + 1).collect();
    let second: Vec<u8> = (0..256u32).map(|i| (i % 17) as u8 + 100).collect();
    // SAFETY: handles from the mock; host buffers outlive the synchronisations below.
    unsafe {
        assert_eq!(c.acl.aclrtMemcpyAsync(d, 256, first.as_ptr().cast(), 256, H2D, a), 0);
        // overlapping bytes [128, 256), both writing, nothing in between
        assert_eq!(c.acl.aclrtMemcpyAsync(at(d, 128), 128, second.as_ptr().cast(), 128, H2D, b), 0);
        m.expect_violations(1, "with no synchronization in between");
        assert_eq!(m.sync(a), 0);
        assert_eq!(m.sync(b), 0);
        // ordered by an event: accepted
        let mut ev: aclrtEvent = ptr::null_mut();
        assert_eq!(c.acl.aclrtCreateEvent(&mut ev), 0);
        assert_eq!(c.acl.aclrtMemcpyAsync(d, 256, first.as_ptr().cast(), 256, H2D, a), 0);
        assert_eq!(c.acl.aclrtRecordEvent(ev, a), 0);
        assert_eq!(c.acl.aclrtStreamWaitEvent(b, ev), 0);
        assert_eq!(c.acl.aclrtMemcpyAsync(at(d, 128), 128, second.as_ptr().cast(), 128, H2D, b), 0);
        m.expect_violations(1, "");
        assert_eq!(m.sync(b), 0);
        assert_eq!(m.sync(a), 0);
        assert_eq!(c.acl.aclrtDestroyEvent(ev), 0);
    }
    let mut want = first[..128].to_vec();
    want.extend_from_slice(&second[..128]);
    assert_eq!(m.d2h(d, 256), want);
    assert_eq!(m.free(d), 0);
    assert_eq!(m.destroy_stream(a), 0);
    assert_eq!(m.destroy_stream(b), 0);
    m.expect_violations(1, "");
}

/// Pinned host memory: aclrtMallocHost blocks are host memory an async copy may use; freeing one
/// while a queued copy still reads it is a violation; a double free is refused. The counters see
/// each allocation, free, blocking copy and synchronise.
#[test]
fn pinned_host_memory_and_call_counters() {
    let m = Mock::new();
    let s = m.stream();
    let c = m.c;
    let d = m.malloc(64);
    let before = mock::stats();
    // SAFETY: pointers from the mock; each copy stays inside its 64-byte block.
    unsafe {
        let mut h: *mut c_void = ptr::null_mut();
        assert_eq!(c.acl.aclrtMallocHost(&mut h, 64), 0);
        let bytes: Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(37) ^ 0x5A).collect();
        ptr::copy_nonoverlapping(bytes.as_ptr(), h.cast::<u8>(), 64);
        assert_eq!(c.acl.aclrtMemcpyAsync(d, 64, h, 64, H2D, s), 0);
        assert_eq!(m.sync(s), 0);
        assert_eq!(m.d2h(d, 64), bytes);
        assert_eq!(mock::stats().live_host_allocations, before.live_host_allocations + 1);
        // freed while a queued copy still reads it: refused, the block stays
        assert_eq!(c.acl.aclrtMemcpyAsync(d, 64, h, 64, H2D, s), 0);
        assert_eq!(c.acl.aclrtFreeHost(h), 107000);
        m.expect_violations(1, "still uses this host memory");
        assert_eq!(m.sync(s), 0);
        assert_eq!(c.acl.aclrtFreeHost(h), 0, "{}", m.err());
        assert_eq!(c.acl.aclrtFreeHost(h), 107000);
        m.expect_violations(2, "not a live aclrtMallocHost block");
    }
    let after = mock::stats();
    assert_eq!(after.host_mallocs - before.host_mallocs, 1);
    assert_eq!(after.live_host_allocations, before.live_host_allocations);
    assert_eq!(after.stream_synchronizes - before.stream_synchronizes, 2);
    assert_eq!(after.blocking_copies - before.blocking_copies, 1, "the one aclrtMemcpy of d2h");
    assert_eq!(after.device_frees, before.device_frees);
    assert_eq!(m.free(d), 0);
    assert_eq!(mock::stats().device_frees, before.device_frees + 1);
    assert_eq!(m.destroy_stream(s), 0);
    m.expect_violations(2, "");
}
