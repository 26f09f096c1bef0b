//! Tests of the mock HCCL (`libhccl.so` of the mock toolkit) through the raw `ascend-sys`
//! bindings: collectives over 1, 2, 4 and 8 ranks as threads and over 2 and 4 processes, the
//! values they compute, and every misuse HCCL punishes (mismatched collectives, a missing rank,
//! buffers freed too early, bad arguments), each an error and, where it is a misuse, a violation.
//!
//! The mock reads `ASCEND_MOCK_DEVICE_COUNT` at `aclInit`: every test calls [`init`] first, which
//! sets it to 8 before the first mock call of the process (and the HCCL timeouts to 60 s). The mock's counters are process-wide,
//! so every test holds `SERIAL` and compares exact deltas. Multi-process tests re-run this binary
//! with `MOCK_HCCL_ROLE` naming the child's part (and the root info hex-encoded in
//! `MOCK_HCCL_ROOT`); the timeout tests run in a child too, with 1-second timeouts.
#![cfg(feature = "mock")]

mod arguments_and_faults;
#[path = "../common/self_exec.rs"]
mod self_exec;

use std::env;
use std::ffi::{c_void, CStr};
use std::ptr;
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use ascend::mock::{self, MockStats};
use ascend_sys::{
    aclrtMemMallocPolicy, aclrtMemcpyKind, aclrtStream, Cann, Hccl, HcclComm, HcclDataType, HcclReduceOp, HcclRootInfo,
};
use half::{bf16, f16};
use self_exec::{expect_success, spawn_self};

const DEVICES: u32 = 8;
const ROLE: &str = "MOCK_HCCL_ROLE";
const ROOT: &str = "MOCK_HCCL_ROOT";

const SUCCESS: u32 = 0;
const E_PARA: u32 = 1;
const E_PTR: u32 = 2;
const E_INTERNAL: u32 = 4;
const E_NOT_SUPPORT: u32 = 5;
const E_TIMEOUT: u32 = 9;
const E_RUNTIME: u32 = 15;
const E_AGAIN: u32 = 20;
/// `aclrtSynchronizeStream` of a collective whose peer never ran its part.
const TASK_TIMEOUT: i32 = 107020;
/// `aclrtSynchronizeStream` of a collective that failed (mismatch, a peer's failure, ...).
const TASK_FAILED: i32 = 507015;
/// A synchronous copy reading poisoned bytes.
const MEM_ERROR: i32 = 507053;

// ---------------------------------------------------------------------------------------------
// Harness

static SERIAL: Mutex<()> = Mutex::new(());

fn cann() -> &'static Cann {
    ascend_sys::load_from(mock::toolkit_dir()).expect("the mock CANN loads")
}

fn hccl() -> &'static Hccl {
    cann().hccl().expect("the mock toolkit has libhccl.so")
}

/// `ASCEND_MOCK_DEVICE_COUNT=8` before the first mock call of the process, then `aclInit` once.
fn init() {
    static INIT: OnceLock<i32> = OnceLock::new();
    let st = *INIT.get_or_init(|| {
        env::set_var("ASCEND_MOCK_DEVICE_COUNT", DEVICES.to_string());
        // Generous waits (children inherit them), so that a slow machine or valgrind never turns
        // a slow peer into a timeout; the timeout tests set 1 s in their child.
        for var in ["HCCL_CONNECT_TIMEOUT", "HCCL_EXEC_TIMEOUT"] {
            if env::var_os(var).is_none() {
                env::set_var(var, "60");
            }
        }
        // SAFETY: aclInit with a null config path is the documented default initialisation.
        unsafe { cann().acl.aclInit(ptr::null()) }
    });
    assert_eq!(st, 0, "aclInit");
}

/// One test: holds the serial lock, remembers the counters at the start.
struct Session {
    base: MockStats,
    _serial: MutexGuard<'static, ()>,
}

impl Session {
    fn new() -> Session {
        let serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        init();
        mock::clear_faults();
        Session { base: mock::stats(), _serial: serial }
    }

    fn messages(&self) -> Vec<String> {
        mock::violations_since(self.base.violations)
    }

    /// Asserts the violations since the start (or the last call): their number, and that each
    /// needle is in one of them.
    #[track_caller]
    fn expect_violations(&mut self, n: u64, needles: &[&str]) {
        let msgs = self.messages();
        assert_eq!(msgs.len() as u64, n, "violations: {msgs:#?}");
        for needle in needles {
            assert!(msgs.iter().any(|m| m.contains(needle)), "no `{needle}` in {msgs:#?}");
        }
        self.base.violations = mock::stats().violations;
    }

    /// A test's end on `rank`: the rank released (its stream destroyed, its device reset), then
    /// [`Session::expect_clean`].
    #[track_caller]
    fn expect_clean_after(&mut self, rank: Rank) {
        drop(rank);
        self.expect_clean();
    }

    /// Asserts that nothing leaked and no violation is pending since the last check.
    #[track_caller]
    fn expect_clean(&mut self) {
        self.expect_violations(0, &[]);
        let now = mock::stats();
        assert_eq!(now.live_comms, self.base.live_comms, "live communicators");
        assert_eq!(now.live_allocations, self.base.live_allocations, "live allocations");
        assert_eq!(now.live_streams, self.base.live_streams, "live streams");
        assert_eq!(mock::live_events_and_queued_tasks().1, 0, "queued tasks");
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        mock::clear_faults();
    }
}

/// The calling thread's aclGetRecentErrMsg (consumed), or "".
fn err_text() -> String {
    // SAFETY: returns null or a NUL-terminated string valid until the next call on this thread.
    unsafe {
        let p = cann().acl.aclGetRecentErrMsg();
        if p.is_null() {
            String::new()
        } else {
            CStr::from_ptr(p).to_string_lossy().into_owned()
        }
    }
}

/// A communicator handle that may cross threads (one thread drives one rank at a time).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Comm(HcclComm);
// SAFETY: the handle is an opaque token; the mock locks around every use of it.
unsafe impl Send for Comm {}
// SAFETY: as above.
unsafe impl Sync for Comm {}

/// A rank's thread state: its device set on the calling thread, and a stream on it.
struct Rank {
    device: i32,
    stream: aclrtStream,
}

impl Rank {
    fn new(device: u32) -> Rank {
        let acl = &cann().acl;
        // SAFETY: the device exists (ASCEND_MOCK_DEVICE_COUNT=8); `stream` is a valid out-pointer.
        unsafe {
            assert_eq!(acl.aclrtSetDevice(device as i32), 0, "aclrtSetDevice({device})");
            let mut stream = ptr::null_mut();
            assert_eq!(acl.aclrtCreateStream(&mut stream), 0);
            Rank { device: device as i32, stream }
        }
    }

    fn malloc(&self, bytes: usize) -> *mut c_void {
        let mut p = ptr::null_mut();
        // SAFETY: `p` is a valid out-pointer.
        let st = unsafe { cann().acl.aclrtMalloc(&mut p, bytes, aclrtMemMallocPolicy::ACL_MEM_MALLOC_HUGE_FIRST) };
        assert_eq!(st, 0, "aclrtMalloc({bytes})");
        p
    }

    fn upload(&self, bytes: &[u8]) -> *mut c_void {
        let p = self.malloc(bytes.len().max(1));
        // SAFETY: reads `bytes.len()` bytes of `bytes`; the mock checks the destination.
        let st = unsafe {
            cann().acl.aclrtMemcpy(
                p,
                bytes.len(),
                bytes.as_ptr().cast(),
                bytes.len(),
                aclrtMemcpyKind::ACL_MEMCPY_HOST_TO_DEVICE,
            )
        };
        assert_eq!(st, 0, "H2D");
        p
    }

    /// A synchronous device-to-host copy: (status, bytes).
    fn try_download(&self, p: *const c_void, len: usize) -> (i32, Vec<u8>) {
        let mut out = vec![0u8; len];
        // SAFETY: writes at most `len` bytes into `out`; the mock checks the source.
        let st = unsafe {
            cann().acl.aclrtMemcpy(out.as_mut_ptr().cast(), len, p, len, aclrtMemcpyKind::ACL_MEMCPY_DEVICE_TO_HOST)
        };
        (st, out)
    }

    fn download(&self, p: *const c_void, len: usize) -> Vec<u8> {
        let (st, out) = self.try_download(p, len);
        assert_eq!(st, 0, "D2H: {}", err_text());
        out
    }

    fn free(&self, p: *mut c_void) {
        // SAFETY: the mock looks the pointer up before freeing.
        assert_eq!(unsafe { cann().acl.aclrtFree(p) }, 0, "aclrtFree");
    }

    fn sync(&self) -> i32 {
        // SAFETY: a live stream of this thread's device.
        unsafe { cann().acl.aclrtSynchronizeStream(self.stream) }
    }

    /// An in-place f32 sum all-reduce of the 4 floats at `buf` on `comm`: queued, then its task
    /// fails. Returns the error text and how long the call and the failing synchronisation took.
    fn failing_all_reduce(&self, buf: *mut c_void, comm: Comm) -> (String, Duration) {
        let start = Instant::now();
        assert_eq!(all_reduce(buf, buf, 4, Dt::F32, SUM, comm, self.stream), SUCCESS);
        assert_eq!(self.sync(), TASK_FAILED);
        let text = err_text();
        (text, start.elapsed())
    }
}

impl Drop for Rank {
    fn drop(&mut self) {
        // SAFETY: the stream and the device reference were made by `new` on this thread.
        unsafe {
            let a = cann().acl.aclrtDestroyStream(self.stream);
            let b = cann().acl.aclrtResetDevice(self.device);
            if !std::thread::panicking() {
                assert_eq!((a, b), (0, 0), "destroy stream, reset device");
            }
        }
    }
}

fn all_reduce(
    send: *mut c_void,
    recv: *mut c_void,
    count: u64,
    dt: Dt,
    op: HcclReduceOp,
    c: Comm,
    s: aclrtStream,
) -> u32 {
    // SAFETY: the mock validates every argument before using it.
    unsafe { hccl().HcclAllReduce(send, recv, count, dt.hccl(), op, c.0, s).0 }
}

fn all_gather(send: *mut c_void, recv: *mut c_void, count: u64, dt: Dt, c: Comm, s: aclrtStream) -> u32 {
    // SAFETY: as above.
    unsafe { hccl().HcclAllGather(send, recv, count, dt.hccl(), c.0, s).0 }
}

fn broadcast(buf: *mut c_void, count: u64, dt: Dt, root: u32, c: Comm, s: aclrtStream) -> u32 {
    // SAFETY: as above.
    unsafe { hccl().HcclBroadcast(buf, count, dt.hccl(), root, c.0, s).0 }
}

fn destroy(c: Comm) -> u32 {
    // SAFETY: the mock looks the handle up before using it.
    unsafe { hccl().HcclCommDestroy(c.0).0 }
}

fn root_info() -> HcclRootInfo {
    // SAFETY: a zeroed byte array is a valid HcclRootInfo to overwrite; the out-pointer is valid.
    unsafe {
        let mut ri: HcclRootInfo = std::mem::zeroed();
        let st = hccl().HcclGetRootInfo(&mut ri).0;
        assert_eq!(st, SUCCESS, "HcclGetRootInfo: {}", err_text());
        ri
    }
}

fn init_rank(n: u32, ri: &HcclRootInfo, rank: u32) -> (u32, Comm) {
    let mut c = ptr::null_mut();
    // SAFETY: valid pointers; the mock validates the root info.
    let st = unsafe { hccl().HcclCommInitRootInfo(n, ri, rank, &mut c).0 };
    (st, Comm(c))
}

/// `HcclCommInitAll` over devices 0..n.
fn init_all(n: u32) -> Vec<Comm> {
    let mut devices: Vec<i32> = (0..n as i32).collect();
    let mut comms = vec![ptr::null_mut(); n as usize];
    // SAFETY: both arrays hold n elements.
    let st = unsafe { hccl().HcclCommInitAll(n, devices.as_mut_ptr(), comms.as_mut_ptr()).0 };
    assert_eq!(st, SUCCESS, "HcclCommInitAll({n}): {}", err_text());
    comms.into_iter().map(Comm).collect()
}

fn destroy_all(comms: &[Comm]) {
    for &c in comms {
        assert_eq!(destroy(c), SUCCESS, "HcclCommDestroy: {}", err_text());
    }
}

/// [`on_ranks`] over `n` communicators made for it ([`init_all`]) and destroyed afterwards.
fn on_new_ranks<R: Send>(n: u32, f: impl Fn(u32, Comm, &Rank) -> R + Sync) -> Vec<R> {
    let comms = init_all(n);
    let results = on_ranks(&comms, f);
    destroy_all(&comms);
    results
}

/// Runs f(rank, comm, &Rank) on one thread per communicator (rank i on device i).
fn on_ranks<R: Send>(comms: &[Comm], f: impl Fn(u32, Comm, &Rank) -> R + Sync) -> Vec<R> {
    std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .iter()
            .enumerate()
            .map(|(i, &c)| {
                let f = &f;
                s.spawn(move || {
                    let rank = Rank::new(i as u32);
                    f(i as u32, c, &rank)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("a rank's thread panicked")).collect()
    })
}

fn rank_info(c: Comm) -> (u32, u32) {
    let (mut size, mut rank) = (0u32, 0u32);
    // SAFETY: valid out-pointers.
    unsafe {
        assert_eq!(hccl().HcclGetRankSize(c.0, &mut size).0, SUCCESS);
        assert_eq!(hccl().HcclGetRankId(c.0, &mut rank).0, SUCCESS);
    }
    (size, rank)
}

// ---------------------------------------------------------------------------------------------
// Data

#[derive(Clone, Copy, Debug, PartialEq)]
enum Dt {
    F32,
    F16,
    BF16,
    I32,
    I16,
    I8,
    I64,
}

impl Dt {
    fn hccl(self) -> HcclDataType {
        match self {
            Dt::F32 => HcclDataType::HCCL_DATA_TYPE_FP32,
            Dt::F16 => HcclDataType::HCCL_DATA_TYPE_FP16,
            Dt::BF16 => HcclDataType::HCCL_DATA_TYPE_BFP16,
            Dt::I32 => HcclDataType::HCCL_DATA_TYPE_INT32,
            Dt::I16 => HcclDataType::HCCL_DATA_TYPE_INT16,
            Dt::I8 => HcclDataType::HCCL_DATA_TYPE_INT8,
            Dt::I64 => HcclDataType::HCCL_DATA_TYPE_INT64,
        }
    }

    fn size(self) -> usize {
        match self {
            Dt::F32 | Dt::I32 => 4,
            Dt::F16 | Dt::BF16 | Dt::I16 => 2,
            Dt::I8 => 1,
            Dt::I64 => 8,
        }
    }

    fn float(self) -> bool {
        matches!(self, Dt::F32 | Dt::F16 | Dt::BF16)
    }
}

fn encode(dt: Dt, v: &[f64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(v.len() * dt.size());
    for &x in v {
        match dt {
            Dt::F32 => out.extend_from_slice(&(x as f32).to_le_bytes()),
            Dt::F16 => out.extend_from_slice(&f16::from_f64(x).to_le_bytes()),
            Dt::BF16 => out.extend_from_slice(&bf16::from_f64(x).to_le_bytes()),
            Dt::I32 => out.extend_from_slice(&(x as i32).to_le_bytes()),
            Dt::I16 => out.extend_from_slice(&(x as i16).to_le_bytes()),
            Dt::I8 => out.extend_from_slice(&(x as i8).to_le_bytes()),
            Dt::I64 => out.extend_from_slice(&(x as i64).to_le_bytes()),
        }
    }
    out
}

fn decode(dt: Dt, b: &[u8]) -> Vec<f64> {
    b.chunks(dt.size())
        .map(|c| match dt {
            Dt::F32 => f32::from_le_bytes(c.try_into().unwrap()) as f64,
            Dt::F16 => f16::from_le_bytes(c.try_into().unwrap()).to_f64(),
            Dt::BF16 => bf16::from_le_bytes(c.try_into().unwrap()).to_f64(),
            Dt::I32 => i32::from_le_bytes(c.try_into().unwrap()) as f64,
            Dt::I16 => i16::from_le_bytes(c.try_into().unwrap()) as f64,
            Dt::I8 => i8::from_le_bytes(c.try_into().unwrap()) as f64,
            Dt::I64 => i64::from_le_bytes(c.try_into().unwrap()) as f64,
        })
        .collect()
}

/// x rounded to dt (to nearest even), as a value.
fn quantize(dt: Dt, x: f64) -> f64 {
    match dt {
        Dt::F32 => x as f32 as f64,
        Dt::F16 => f16::from_f64(x).to_f64(),
        Dt::BF16 => bf16::from_f64(x).to_f64(),
        Dt::I32 => x as i32 as f64,
        Dt::I16 => x as i16 as f64,
        Dt::I8 => x as i8 as f64,
        Dt::I64 => x as i64 as f64,
    }
}

/// Rank r's input: small values, exactly representable in dt (and, for integers, so that a
/// product over 8 ranks does not overflow i8 too often: wrapping is what HCCL does anyway).
fn input(dt: Dt, rank: u32, n: usize, salt: u32) -> Vec<f64> {
    (0..n)
        .map(|i| {
            let k = ((rank * 7 + i as u32 * 3 + salt * 5) % 11) as f64;
            quantize(dt, if dt.float() { k * 0.375 - 1.5 } else { k - 4.0 })
        })
        .collect()
}

/// What HCCL computes: in rank order, floats in f32 rounded once to dt, integers wrapping.
fn reduce(dt: Dt, op: HcclReduceOp, inputs: &[Vec<f64>]) -> Vec<f64> {
    (0..inputs[0].len())
        .map(|i| {
            if dt.float() {
                let mut a = inputs[0][i] as f32;
                for x in &inputs[1..] {
                    let b = x[i] as f32;
                    a = match op {
                        HcclReduceOp::HCCL_REDUCE_SUM => a + b,
                        HcclReduceOp::HCCL_REDUCE_PROD => a * b,
                        HcclReduceOp::HCCL_REDUCE_MAX => a.max(b),
                        _ => a.min(b),
                    };
                }
                // rounded once (f16/bf16 from f32: exact through f64, which holds every f32)
                quantize(dt, a as f64)
            } else {
                let mut a = inputs[0][i] as i64;
                for x in &inputs[1..] {
                    let b = x[i] as i64;
                    a = match op {
                        HcclReduceOp::HCCL_REDUCE_SUM => a.wrapping_add(b),
                        HcclReduceOp::HCCL_REDUCE_PROD => a.wrapping_mul(b),
                        HcclReduceOp::HCCL_REDUCE_MAX => a.max(b),
                        _ => a.min(b),
                    };
                }
                match dt {
                    Dt::I8 => a as i8 as f64,
                    Dt::I32 => a as i32 as f64,
                    Dt::I16 => a as i16 as f64,
                    _ => a as f64,
                }
            }
        })
        .collect()
}

const SUM: HcclReduceOp = HcclReduceOp::HCCL_REDUCE_SUM;
const PROD: HcclReduceOp = HcclReduceOp::HCCL_REDUCE_PROD;
const MAX: HcclReduceOp = HcclReduceOp::HCCL_REDUCE_MAX;
const MIN: HcclReduceOp = HcclReduceOp::HCCL_REDUCE_MIN;

/// The all-reduce cases every group size runs: (dtype, op).
fn reduce_cases() -> Vec<(Dt, HcclReduceOp)> {
    let mut cases = Vec::new();
    for dt in [Dt::F32, Dt::F16, Dt::BF16, Dt::I32, Dt::I16, Dt::I8, Dt::I64] {
        for op in [SUM, PROD, MAX, MIN] {
            // the A2 table: no PROD for bf16 and int16
            if !(matches!(dt, Dt::BF16 | Dt::I16) && op == PROD) {
                cases.push((dt, op));
            }
        }
    }
    cases
}

/// An all-reduce to run and check.
#[derive(Clone, Copy, Debug)]
struct ReduceCase {
    dt: Dt,
    op: HcclReduceOp,
    count: usize,
    in_place: bool,
    /// Varies the inputs.
    salt: u32,
}

/// One all-reduce on this rank (of `n`), checked against the expected values.
fn check_all_reduce(n: u32, rank: u32, c: Comm, r: &Rank, case: ReduceCase) {
    let ReduceCase { dt, op, count, in_place, salt } = case;
    let inputs: Vec<Vec<f64>> = (0..n).map(|k| input(dt, k, count, salt)).collect();
    let want = reduce(dt, op, &inputs);
    let bytes = count * dt.size();
    let send = r.upload(&encode(dt, &inputs[rank as usize]));
    let recv = if in_place { send } else { r.malloc(bytes) };
    let st = all_reduce(send, recv, count as u64, dt, op, c, r.stream);
    assert_eq!(st, SUCCESS, "HcclAllReduce {dt:?} {op:?}: {}", err_text());
    assert_eq!(r.sync(), 0, "sync of HcclAllReduce {dt:?} {op:?}: {}", err_text());
    let got = decode(dt, &r.download(recv, bytes));
    assert_eq!(got, want, "rank {rank} of {n}: all-reduce {dt:?} {op:?} in place {in_place}");
    if !in_place {
        assert_eq!(decode(dt, &r.download(send, bytes)), inputs[rank as usize], "the input is unchanged");
        r.free(recv);
    }
    r.free(send);
}

// ---------------------------------------------------------------------------------------------
// Values: ranks as threads

#[test]
fn all_reduce_over_1_2_4_8_thread_ranks() {
    let mut s = Session::new();
    for n in [1u32, 2, 4, 8] {
        let comms = init_all(n);
        assert_eq!(mock::stats().live_comms, s.base.live_comms + n as u64);
        on_ranks(&comms, |rank, c, r| {
            assert_eq!(rank_info(c), (n, rank));
            for (k, &(dt, op)) in reduce_cases().iter().enumerate() {
                check_all_reduce(n, rank, c, r, ReduceCase { dt, op, count: 37, in_place: k % 2 == 0, salt: k as u32 });
            }
        });
        destroy_all(&comms);
        s.expect_clean();
    }
}

#[test]
fn all_gather_and_broadcast_over_1_2_4_8_thread_ranks() {
    let mut s = Session::new();
    for n in [1u32, 2, 4, 8] {
        on_new_ranks(n, |rank, c, r| {
            for (salt, dt) in [Dt::I32, Dt::F16, Dt::F32, Dt::I8].into_iter().enumerate() {
                let count = 5;
                let inputs: Vec<Vec<f64>> = (0..n).map(|k| input(dt, k, count, salt as u32)).collect();
                let send = r.upload(&encode(dt, &inputs[rank as usize]));
                let recv = r.malloc(n as usize * count * dt.size());
                assert_eq!(all_gather(send, recv, count as u64, dt, c, r.stream), SUCCESS, "{}", err_text());
                assert_eq!(r.sync(), 0, "{}", err_text());
                let got = decode(dt, &r.download(recv, n as usize * count * dt.size()));
                assert_eq!(got, inputs.concat(), "rank {rank} of {n}: all-gather {dt:?} is rank-major");
                r.free(send);
                r.free(recv);
            }
            for root in 0..n {
                let dt = Dt::BF16;
                let mine = input(dt, rank, 9, root);
                let buf = r.upload(&encode(dt, &mine));
                assert_eq!(broadcast(buf, 9, dt, root, c, r.stream), SUCCESS, "{}", err_text());
                assert_eq!(r.sync(), 0, "{}", err_text());
                let got = decode(dt, &r.download(buf, 9 * dt.size()));
                assert_eq!(got, input(dt, root, 9, root), "rank {rank} of {n}: broadcast from {root}");
                r.free(buf);
            }
        });
        s.expect_clean();
    }
}

/// Reductions run in rank order, in f32, rounded once: inputs chosen so that another order, or
/// rounding to f16/bf16 at each step, gives another result.
#[test]
fn reductions_are_in_rank_order_and_rounded_once() {
    let mut s = Session::new();
    let cases: [(Dt, [f64; 4], f64); 3] = [
        (Dt::F32, [1e8, -1e8, 1.0, 1.0], 2.0),      // reversed order: 0
        (Dt::F16, [2048.0, 1.0, 1.0, 1.0], 2052.0), // 2051 rounds to even; per step: 2048
        (Dt::BF16, [256.0, 1.0, 1.0, 1.0], 260.0),  // 259 rounds to even; per step: 256
    ];
    on_new_ranks(4, |rank, c, r| {
        for (dt, inputs, want) in cases {
            let per_rank: Vec<Vec<f64>> = inputs.iter().map(|&x| vec![x; 3]).collect();
            assert_eq!(reduce(dt, SUM, &per_rank), vec![want; 3], "the reference itself");
            let buf = r.upload(&encode(dt, &per_rank[rank as usize]));
            assert_eq!(all_reduce(buf, buf, 3, dt, SUM, c, r.stream), SUCCESS);
            assert_eq!(r.sync(), 0, "{}", err_text());
            assert_eq!(decode(dt, &r.download(buf, 3 * dt.size())), vec![want; 3], "{dt:?} on rank {rank}");
            r.free(buf);
        }
    });
    s.expect_clean();
}

/// A collective larger than the shared segment's slot (1 MiB per rank) moves in several rounds.
#[test]
fn large_collectives_move_in_several_rounds() {
    let mut s = Session::new();
    on_new_ranks(2, |rank, c, r| {
        check_all_reduce(2, rank, c, r, ReduceCase { dt: Dt::F32, op: SUM, count: 600_000, in_place: true, salt: 1 });
        let count = 300_000; // 1.2 MB per rank
        let mine: Vec<f64> = (0..count).map(|i| (i as f64) * 2.0 + rank as f64).collect();
        let send = r.upload(&encode(Dt::F32, &mine));
        let recv = r.malloc(2 * count * 4);
        assert_eq!(all_gather(send, recv, count as u64, Dt::F32, c, r.stream), SUCCESS);
        assert_eq!(r.sync(), 0, "{}", err_text());
        let got = decode(Dt::F32, &r.download(recv, 2 * count * 4));
        for (k, x) in got.iter().enumerate() {
            let (from, i) = (k / count, k % count);
            assert_eq!(*x, (i as f64) * 2.0 + from as f64, "all-gather element {k}");
        }
        r.free(send);
        r.free(recv);
    });
    s.expect_clean();
}

/// `HcclGetRootInfo` on one thread, `HcclCommInitRootInfo` on one thread per rank; several
/// collectives queued before one synchronize run in order.
#[test]
fn init_root_info_threads_and_queued_collectives() {
    let mut s = Session::new();
    let main = Rank::new(0);
    let ri = root_info();
    let other = root_info();
    assert_ne!(ri.internal, other.internal, "every root info names a new group");
    assert!(ri.internal.iter().any(|&b| b != 0));
    let n = 4;
    let comms: Vec<Comm> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..n)
            .map(|rank| {
                let ri = &ri;
                sc.spawn(move || {
                    let _r = Rank::new(rank);
                    let (st, c) = init_rank(n, ri, rank);
                    assert_eq!(st, SUCCESS, "rank {rank}: {}", err_text());
                    c
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(mock::stats().live_comms, s.base.live_comms + 4);
    on_ranks(&comms, |rank, c, r| {
        assert_eq!(rank_info(c), (n, rank));
        let a = r.upload(&encode(Dt::F32, &[rank as f64 + 1.0; 3]));
        let b = r.upload(&encode(Dt::I32, &[rank as f64; 2]));
        let g = r.malloc(4 * 2 * 4);
        assert_eq!(all_reduce(a, a, 3, Dt::F32, SUM, c, r.stream), SUCCESS);
        assert_eq!(all_gather(b, g, 2, Dt::I32, c, r.stream), SUCCESS);
        assert_eq!(broadcast(a, 3, Dt::F32, 3, c, r.stream), SUCCESS);
        assert_eq!(all_reduce(a, a, 3, Dt::F32, PROD, c, r.stream), SUCCESS);
        assert_eq!(r.sync(), 0, "{}", err_text());
        assert_eq!(decode(Dt::F32, &r.download(a, 12)), [10000.0; 3]);
        assert_eq!(decode(Dt::I32, &r.download(g, 32)), [0.0, 0.0, 1.0, 1.0, 2.0, 2.0, 3.0, 3.0]);
        for p in [a, b, g] {
            r.free(p);
        }
    });
    destroy_all(&comms);
    s.expect_clean_after(main);
}

// ---------------------------------------------------------------------------------------------
// Strictness

/// A collective to issue with fresh buffers.
#[derive(Clone, Copy, Debug)]
enum Issue {
    Reduce(u64, Dt, HcclReduceOp),
    Gather(u64),
    Bcast(u32),
}

fn issue(i: Issue, c: Comm, r: &Rank) -> [*mut c_void; 2] {
    let a = r.upload(&[0u8; 64]);
    let b = r.upload(&[0u8; 2 * 64]);
    let st = match i {
        Issue::Reduce(count, dt, op) => all_reduce(a, b, count, dt, op, c, r.stream),
        Issue::Gather(count) => all_gather(a, b, count, Dt::F32, c, r.stream),
        Issue::Bcast(root) => broadcast(a, 4, Dt::F32, root, c, r.stream),
    };
    assert_eq!(st, SUCCESS, "{i:?}: {}", err_text());
    [a, b]
}

/// Rank 0 issues `a`, rank 1 issues `b`, then each synchronizes: both must fail with
/// TASK_FAILED and `violations` violations (one per mismatched collective, for this process)
/// name the mismatch; then a matching collective works (the group stays consistent).
fn mismatch(s: &mut Session, a: &[Issue], b: &[Issue], violations: u64, needles: &[&str]) {
    let comms = init_all(2);
    let sts = on_ranks(&comms, |rank, c, r| {
        let bufs: Vec<_> = (if rank == 0 { a } else { b }).iter().flat_map(|&i| issue(i, c, r)).collect();
        let st = r.sync();
        let text = err_text();
        for p in bufs {
            r.free(p);
        }
        check_all_reduce(2, rank, c, r, ReduceCase { dt: Dt::F32, op: SUM, count: 3, in_place: true, salt: 0 });
        (st, text)
    });
    for (st, text) in &sts {
        assert_eq!(*st, TASK_FAILED, "{a:?} vs {b:?}: {text}");
        assert!(text.contains("does not match across ranks"), "{a:?} vs {b:?}: {text}");
    }
    s.expect_violations(violations, needles);
    destroy_all(&comms);
    s.expect_clean();
}

#[test]
fn mismatched_collectives_fail_on_every_rank_with_a_violation() {
    let mut s = Session::new();
    let base = Issue::Reduce(8, Dt::F32, SUM);
    mismatch(&mut s, &[base], &[Issue::Reduce(4, Dt::F32, SUM)], 1, &["count 8", "count 4"]);
    mismatch(&mut s, &[base], &[Issue::Reduce(8, Dt::I32, SUM)], 1, &["INT32"]);
    mismatch(&mut s, &[base], &[Issue::Reduce(8, Dt::F32, MAX)], 1, &["MAX"]);
    mismatch(&mut s, &[Issue::Bcast(0)], &[Issue::Bcast(1)], 1, &["root 0", "root 1"]);
    mismatch(&mut s, &[base], &[Issue::Gather(8)], 1, &["HcclAllGather"]);
    // order: rank 0 issues all-reduce then all-gather, rank 1 the other way round: both fail
    mismatch(&mut s, &[base, Issue::Gather(8)], &[Issue::Gather(8), base], 2, &["collective #1", "collective #2"]);
}

/// A buffer freed before the stream ran: a violation; the collective fails on this rank (the
/// task is skipped) and on its peer (its output is poisoned); the group stays usable.
#[test]
fn buffer_freed_before_the_stream_ran() {
    let mut s = Session::new();
    let comms = init_all(2);
    let out = on_ranks(&comms, |rank, c, r| {
        let send = r.upload(&encode(Dt::F32, &[1.0; 16]));
        let recv = r.malloc(64);
        assert_eq!(all_reduce(send, recv, 16, Dt::F32, SUM, c, r.stream), SUCCESS);
        if rank == 0 {
            r.free(recv); // too early: the collective is still queued
        }
        let st = r.sync();
        let text = err_text();
        if rank == 1 {
            let (rd, _) = r.try_download(recv, 64);
            assert_eq!(rd, MEM_ERROR, "rank 1's output was never written: it is poisoned");
            r.free(recv);
        }
        check_all_reduce(2, rank, c, r, ReduceCase { dt: Dt::F16, op: MAX, count: 5, in_place: false, salt: 3 });
        r.free(send);
        (st, text)
    });
    assert_eq!(out[0].0, TASK_FAILED, "{}", out[0].1);
    assert!(out[0].1.contains("freed before it ran"), "{}", out[0].1);
    assert_eq!(out[1].0, TASK_FAILED, "{}", out[1].1);
    assert!(out[1].1.contains("rank 0's part failed"), "{}", out[1].1);
    s.expect_violations(2, &["still uses this memory", "was freed before the task ran"]);
    destroy_all(&comms);
    s.expect_clean();
}

/// A rank that destroys its communicator while a peer waits for it: the peer fails at once.
#[test]
fn a_peer_that_destroyed_its_communicator_fails_the_collective() {
    let mut s = Session::new();
    let comms = init_all(2);
    assert_eq!(destroy(comms[1]), SUCCESS);
    let r = Rank::new(0);
    let buf = r.upload(&[0u8; 16]);
    let (text, took) = r.failing_all_reduce(buf, comms[0]);
    assert!(text.contains("rank 1 destroyed its communicator"), "{text}");
    assert!(took < Duration::from_secs(2), "no wait for a peer that is gone");
    // the group is broken from then on
    assert_eq!(all_reduce(buf, buf, 4, Dt::F32, SUM, comms[0], r.stream), SUCCESS);
    assert_eq!(r.sync(), TASK_FAILED);
    assert!(err_text().contains("group is broken"));
    r.free(buf);
    assert_eq!(destroy(comms[0]), SUCCESS);
    s.expect_clean_after(r);
}

/// The value another thread stores in `slot` (nonzero), waiting for it.
fn wait_for(slot: &Mutex<usize>) -> usize {
    loop {
        let v = *slot.lock().unwrap();
        if v != 0 {
            return v;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// While a collective waits for its peer (with the mock's lock released), its stream stays
/// consistent: another thread synchronizing it waits for it, work queued after it runs after it,
/// and its output freed meanwhile is a violation that fails it (not a crash).
#[test]
fn the_stream_of_a_waiting_collective_stays_consistent() {
    let mut s = Session::new();
    let comms = init_all(2);
    let stream = Mutex::new(0usize);
    let released = Mutex::new(None::<Instant>);
    std::thread::scope(|sc| {
        // rank 0: an all-reduce and a copy after it, then a synchronize that waits for rank 1
        let a = sc.spawn(|| {
            let r = Rank::new(0);
            let buf = r.upload(&encode(Dt::F32, &[1.0, 2.0]));
            let mut host = [0f32; 2];
            *stream.lock().unwrap() = r.stream as usize;
            assert_eq!(all_reduce(buf, buf, 2, Dt::F32, SUM, comms[0], r.stream), SUCCESS);
            // SAFETY: `host` outlives the stream's synchronization below.
            let st = unsafe {
                cann().acl.aclrtMemcpyAsync(
                    host.as_mut_ptr().cast(),
                    8,
                    buf,
                    8,
                    aclrtMemcpyKind::ACL_MEMCPY_DEVICE_TO_HOST,
                    r.stream,
                )
            };
            assert_eq!(st, 0);
            assert_eq!(r.sync(), 0, "{}", err_text());
            assert_eq!(host, [11.0, 22.0], "the copy queued after the collective ran after it");
            r.free(buf);
        });
        // another thread of device 0 synchronizes the same stream meanwhile: it waits
        let b = sc.spawn(|| {
            let r = Rank::new(0);
            let h = wait_for(&stream) as aclrtStream;
            std::thread::sleep(Duration::from_millis(150)); // rank 0 is (very likely) synchronizing
                                                            // SAFETY: a live stream of device 0 (rank 0's thread destroys it after joining).
            assert_eq!(unsafe { cann().acl.aclrtSynchronizeStream(h) }, 0);
            let waited_for = released.lock().unwrap().expect("returned before rank 1 ran its part");
            assert!(waited_for.elapsed() < Duration::from_secs(5));
            drop(r);
        });
        // rank 1 arrives late
        let r = Rank::new(1);
        std::thread::sleep(Duration::from_millis(400));
        let buf = r.upload(&encode(Dt::F32, &[10.0, 20.0]));
        *released.lock().unwrap() = Some(Instant::now());
        assert_eq!(all_reduce(buf, buf, 2, Dt::F32, SUM, comms[1], r.stream), SUCCESS);
        assert_eq!(r.sync(), 0, "{}", err_text());
        r.free(buf);
        a.join().unwrap();
        b.join().unwrap();
    });
    s.expect_violations(0, &[]);

    // the output freed by another thread while the collective waits: two violations, it fails
    let recv_addr = Mutex::new(0usize);
    let out = std::thread::scope(|sc| {
        let a = sc.spawn(|| {
            let r = Rank::new(0);
            let send = r.upload(&[0u8; 8]);
            let recv = r.malloc(8);
            *recv_addr.lock().unwrap() = recv as usize;
            assert_eq!(all_reduce(send, recv, 2, Dt::F32, SUM, comms[0], r.stream), SUCCESS);
            let st = r.sync();
            r.free(send);
            (st, err_text())
        });
        let recv = wait_for(&recv_addr) as *mut c_void;
        std::thread::sleep(Duration::from_millis(300)); // rank 0 is (very likely) synchronizing
        let r = Rank::new(0);
        r.free(recv); // while rank 0's collective waits for rank 1
        drop(r);
        let r = Rank::new(1);
        let buf = r.upload(&[0u8; 8]);
        assert_eq!(all_reduce(buf, buf, 2, Dt::F32, SUM, comms[1], r.stream), SUCCESS);
        assert_eq!(r.sync(), 0, "rank 1's own output is fine: {}", err_text());
        r.free(buf);
        a.join().unwrap()
    });
    assert_eq!(out.0, TASK_FAILED, "{}", out.1);
    // (on a loaded machine rank 0 may not have reached its synchronize yet: then its task is
    // skipped for the same reason)
    let freed = ["recvBuf was freed while the collective ran", "freed before it ran"];
    assert!(freed.iter().any(|m| out.1.contains(m)), "{}", out.1);
    let msgs = s.messages();
    assert!(msgs
        .iter()
        .any(|m| m.contains("freed while the collective ran") || m.contains("freed before the task ran")));
    s.expect_violations(2, &["still uses this memory"]);
    destroy_all(&comms);
    s.expect_clean();
}

// ---------------------------------------------------------------------------------------------
// Child processes

// `c_char` is i8 on x86-64 and u8 on aarch64: the cast reinterprets the byte either way.
#[allow(clippy::unnecessary_cast)]
fn hex(ri: &HcclRootInfo) -> String {
    ri.internal.iter().map(|&b| format!("{:02x}", b as u8)).collect()
}

fn unhex(s: &str) -> HcclRootInfo {
    // SAFETY: a zeroed byte array is a valid HcclRootInfo.
    let mut ri: HcclRootInfo = unsafe { std::mem::zeroed() };
    assert_eq!(s.len(), 2 * ri.internal.len());
    for (i, b) in ri.internal.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap() as _;
    }
    ri
}

/// What every rank of the process tests does (and checks).
fn process_workload(n: u32, rank: u32, c: Comm, r: &Rank) {
    assert_eq!(rank_info(c), (n, rank));
    check_all_reduce(n, rank, c, r, ReduceCase { dt: Dt::F32, op: SUM, count: 37, in_place: true, salt: 0 });
    check_all_reduce(n, rank, c, r, ReduceCase { dt: Dt::BF16, op: MAX, count: 37, in_place: false, salt: 1 });
    check_all_reduce(n, rank, c, r, ReduceCase { dt: Dt::I32, op: PROD, count: 11, in_place: true, salt: 2 });
    check_all_reduce(n, rank, c, r, ReduceCase { dt: Dt::F32, op: SUM, count: 300_000, in_place: true, salt: 3 }); // two rounds
    let send = r.upload(&encode(Dt::F16, &[rank as f64; 3]));
    let recv = r.malloc(n as usize * 3 * 2);
    let buf = r.upload(&encode(Dt::I64, &[rank as f64 * 10.0; 4]));
    assert_eq!(all_gather(send, recv, 3, Dt::F16, c, r.stream), SUCCESS);
    assert_eq!(broadcast(buf, 4, Dt::I64, n - 1, c, r.stream), SUCCESS);
    assert_eq!(r.sync(), 0, "{}", err_text());
    let want: Vec<f64> = (0..n).flat_map(|k| [k as f64; 3]).collect();
    assert_eq!(decode(Dt::F16, &r.download(recv, n as usize * 6)), want);
    assert_eq!(decode(Dt::I64, &r.download(buf, 32)), [(n - 1) as f64 * 10.0; 4]);
    for p in [send, recv, buf] {
        r.free(p);
    }
}

/// Ranks as processes: this process is rank 0, the others are children of it.
#[test]
fn collectives_over_2_and_4_processes() {
    if let Ok(role) = env::var(ROLE) {
        // a child: "rank:<rank>:<n>"
        let parts: Vec<u32> = role.strip_prefix("rank:").unwrap().split(':').map(|x| x.parse().unwrap()).collect();
        let (rank, n) = (parts[0], parts[1]);
        let mut s = Session::new();
        let r = Rank::new(rank);
        let (st, c) = init_rank(n, &unhex(&env::var(ROOT).unwrap()), rank);
        assert_eq!(st, SUCCESS, "child rank {rank}: {}", err_text());
        process_workload(n, rank, c, &r);
        assert_eq!(destroy(c), SUCCESS);
        s.expect_clean_after(r);
        return;
    }
    let mut s = Session::new();
    for n in [2u32, 4] {
        let r = Rank::new(0);
        let ri = root_info();
        let children: Vec<_> = (1..n)
            .map(|rank| {
                spawn_self(
                    "collectives_over_2_and_4_processes",
                    &[(ROLE, format!("rank:{rank}:{n}")), (ROOT, hex(&ri))],
                )
            })
            .collect();
        let (st, c) = init_rank(n, &ri, 0);
        assert_eq!(st, SUCCESS, "rank 0 of {n} processes: {}", err_text());
        process_workload(n, 0, c, &r);
        assert_eq!(destroy(c), SUCCESS);
        for (i, child) in children.into_iter().enumerate() {
            expect_success(&format!("rank {} of {n}", i + 1), &child.wait_with_output().unwrap());
        }
        s.expect_clean_after(r);
    }
}

/// A rank whose process exits without running its part: its peers fail at once (no wait for
/// HCCL_EXEC_TIMEOUT), naming it.
#[test]
fn a_peer_process_that_exited_fails_the_collective() {
    if env::var(ROLE).as_deref() == Ok("exit") {
        let _s = Session::new();
        let _r = Rank::new(1);
        let (st, _c) = init_rank(2, &unhex(&env::var(ROOT).unwrap()), 1);
        assert_eq!(st, SUCCESS, "{}", err_text());
        return; // exits without a collective, without destroying its communicator
    }
    let mut s = Session::new();
    let r = Rank::new(0);
    let ri = root_info();
    let child =
        spawn_self("a_peer_process_that_exited_fails_the_collective", &[(ROLE, "exit".into()), (ROOT, hex(&ri))]);
    let (st, c) = init_rank(2, &ri, 0);
    assert_eq!(st, SUCCESS, "{}", err_text());
    expect_success("the child", &child.wait_with_output().unwrap()); // reaped: its pid is gone
    let buf = r.upload(&[0u8; 16]);
    let (text, took) = r.failing_all_reduce(buf, c);
    assert!(text.contains("rank 1 (process") && text.contains("exited"), "{text}");
    assert!(took < Duration::from_secs(3), "no wait for HCCL_EXEC_TIMEOUT");
    r.free(buf);
    assert_eq!(destroy(c), SUCCESS);
    s.expect_clean_after(r);
}

/// The timeouts, in a child with `HCCL_CONNECT_TIMEOUT=1` and `HCCL_EXEC_TIMEOUT=1`: a rank that
/// never joins, and a rank that never runs its part of a collective, are errors after about a
/// second, never hangs; a group whose collective timed out is broken from then on.
#[test]
fn a_missing_rank_is_a_timeout_not_a_hang() {
    if env::var(ROLE).as_deref() == Ok("timeouts") {
        let mut s = Session::new();
        let r = Rank::new(0);
        let ri = root_info();
        let start = Instant::now();
        let (st, c) = init_rank(2, &ri, 0);
        let took = start.elapsed();
        assert_eq!((st, c), (E_TIMEOUT, Comm(ptr::null_mut())), "{}", err_text());
        assert!(took >= Duration::from_millis(900) && took < Duration::from_secs(4), "connect timeout took {took:?}");
        s.expect_violations(0, &[]);

        let comms = init_all(2);
        let buf = r.upload(&[0u8; 16]);
        assert_eq!(all_reduce(buf, buf, 4, Dt::F32, SUM, comms[0], r.stream), SUCCESS);
        let start = Instant::now();
        assert_eq!(r.sync(), TASK_TIMEOUT, "rank 1 never runs its part");
        let took = start.elapsed();
        let text = err_text();
        assert!(text.contains("HCCL_EXEC_TIMEOUT") && text.contains("rank 1"), "{text}");
        assert!(took >= Duration::from_millis(900) && took < Duration::from_secs(4), "exec timeout took {took:?}");
        assert_eq!(r.try_download(buf, 16).0, MEM_ERROR, "the output is poisoned");
        // broken from then on: fails at once
        let fresh = r.upload(&[0u8; 16]);
        let (text, took) = r.failing_all_reduce(fresh, comms[0]);
        assert!(text.contains("group is broken"), "{text}");
        assert!(took < Duration::from_millis(500));
        r.free(buf);
        r.free(fresh);
        drop(r);
        destroy_all(&comms);
        s.expect_clean();
        return;
    }
    let _s = Session::new();
    let start = Instant::now();
    let child = spawn_self(
        "a_missing_rank_is_a_timeout_not_a_hang",
        &[(ROLE, "timeouts".into()), ("HCCL_CONNECT_TIMEOUT", "1".into()), ("HCCL_EXEC_TIMEOUT", "1".into())],
    );
    expect_success("the timeout child", &child.wait_with_output().unwrap());
    assert!(start.elapsed() < Duration::from_secs(15));
}
