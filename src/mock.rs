//! The mock CANN toolkit (feature `mock`): a strict fake of CANN over host memory, for tests and CI.
//!
//! The crate's build script compiles the C sources in `mock/` into a toolkit layout
//! ([`toolkit_dir`]`/lib64/` holds `libascendcl.so`, `libnnopbase.so`, `libopapi.so` and
//! `libhccl.so`), exporting the same symbols as CANN. Load it like a real toolkit, e.g.
//! `ascend_sys::load_from(ascend::mock::toolkit_dir())`, and the whole Ascend code path runs:
//! device memory is host memory the mock tracks, streams are queues that run at synchronization,
//! phase 1 validates as ops-nn does and phase 2 computes as the hardware does (f32 accumulation).
//!
//! The mock is strict: every misuse CANN would punish (double free, use of a destroyed handle,
//! memory freed while queued work still uses it, an executor launched twice, a wrong workspace,
//! unaligned tensor data, a device call without `aclInit`/`aclrtSetDevice`, ...) counts a
//! violation and prints `ascend mock CANN violation: <why>` on stderr. Tests assert on
//! [`stats`] (and [`violations_since`] for the messages). What a skipped task should have written
//! is poisoned (see [`MockStats::poisoned_bytes`]): reading it is an error, never stale bytes.
//!
//! As on CANN, `aclrtFree` neither synchronises nor waits (`aclrtFreeWithDevSync` is CANN's
//! waiting variant): a free of memory that queued work still uses is a violation, and the tasks
//! that use the memory are skipped and poison what they should have written. An
//! `aclrtMemcpyAsync` between two host buffers fails with `ACL_ERROR_RT_FEATURE_NOT_SUPPORT`
//! (207000), and one whose host side is pageable (not from `aclrtMallocHost`) runs synchronously,
//! as on CANN: the host waits for the stream's queued work and the copy (counted in
//! [`MockStats::blocking_copies`]).
//!
//! Executors CANN will not repeat: [`refuse_repeatable`] (or the environment variable
//! `ASCEND_MOCK_REFUSE_REPEATABLE`) makes `aclSetAclOpExecutorRepeatable` refuse an operator's
//! executors, as CANN refuses those whose phase 1 used an AI CPU kernel, a DSA task or a
//! synchronous copy. Phase 1 records the device's `ACL_OPT_DETERMINISTIC`, and
//! [`launch_counters`] counts the launches of executors prepared under another value than the
//! device has at the launch.
//!
//! Events are modelled as CANN documents them (runtime `docs/zh/api_ref/07_event_management.md`,
//! `acl_rt.h`): an `aclrtCreateEvent` / `aclrtCreateEventWithFlag` event is recorded again only
//! after `aclrtResetEvent` (else a violation), an `aclrtCreateEventExWithFlag` event is reused by
//! recording it again and refuses `aclrtResetEvent` (207000), a stream waits only for a recorded
//! event (107000, the runtime's `ACL_ERROR_RT_INVALID_VALUE`) made with `ACL_EVENT_SYNC` when it
//! comes from ExWithFlag, an event is used only with streams of its own device (107003), and a
//! device holds at most 65,536 live events (the next creation is refused with 207007; CANN takes
//! an ExWithFlag(`ACL_EVENT_SYNC`) event's resource at its first record, the mock at creation).
//! The device progresses while the host queries: `aclrtQueryEventStatus` runs the event's stream
//! up to the queried record (and no further), so an event completes while later work of its
//! stream is still queued (a failed task there is reported by the stream's next synchronise);
//! [`set_query_progress`] turns that off. A query that reaches a queued collective runs it like
//! a synchronise, waiting for its peers (the mock's HCCL exchanges data only while every rank runs
//! its part): ranks that wait for each other on the host should first let their collectives run
//! (a query of an event recorded after them). [`stats`] counts events made, destroyed and live,
//! [`live_events_on`] per device.
//!
//! The functions here read the mock's process-wide state through extra C functions of its
//! `libascendcl.so` (`ascend_mock_*`, see `mock/ascend_mock.h`), loaded from the same file as the
//! CANN bindings, hence the same instance.
//!
//! Devices: the mock has 1 device, or `ASCEND_MOCK_DEVICE_COUNT` (0..=64, read by `aclInit`,
//! hence once per process in practice), or what [`set_device_count`] set last (at run time; it
//! takes precedence over the variable).
//!
//! HCCL: the mock's `libhccl.so` joins the ranks of a communicator, threads of one process or
//! separate processes, through a POSIX shared-memory segment named by the root info. Collectives
//! are queued on the mock streams like any task and exchange data when each rank's stream is
//! synchronized; the n-th collective of every rank must match (kind, count, dtype, op, root), or
//! it fails on every rank with a violation. Waits are bounded: `HCCL_CONNECT_TIMEOUT` (seconds,
//! default 5 in the mock) for `HcclCommInitRootInfo`, `HCCL_EXEC_TIMEOUT` (seconds, default 10) for
//! a collective whose peer never runs its part (the synchronize then fails with
//! `ACL_ERROR_RT_TASK_TIMEOUT`, 107020). `ASCEND_MOCK_HCCL_CHUNK` (bytes, default 1 MiB) is how
//! much each rank moves through shared memory per round.

use std::ffi::{c_char, c_int, CString};
use std::path::Path;
use std::sync::OnceLock;

/// The byte every fresh `aclrtMalloc` block of the mock is filled with (never zeros), so output
/// that was never written is recognisable.
pub const GARBAGE_BYTE: u8 = 0xA5;

/// The root of the mock toolkit built for this crate (its `lib64/` holds the four libraries).
///
/// Pass it to `ascend_sys::load_from` (or to the `Context` constructor that takes a toolkit
/// directory) to run on the mock. It is the build directory the build script wrote, unless the
/// environment variable `ASCEND_MOCK_TOOLKIT_DIR` (read once, at the first call) names another:
/// set it when the test binaries run away from their build tree (an archive of test binaries, a
/// container image, a cache), pointing at a copy of that `mock-cann` directory.
pub fn toolkit_dir() -> &'static Path {
    static DIR: OnceLock<std::path::PathBuf> = OnceLock::new();
    DIR.get_or_init(|| match std::env::var_os("ASCEND_MOCK_TOOLKIT_DIR") {
        Some(dir) if !dir.is_empty() => dir.into(),
        _ => env!("ASCEND_MOCK_TOOLKIT_DIR").into(),
    })
}

/// An Ascend-backend [`Context`](crate::Context) on device `device` of the mock toolkit: the
/// whole Ascend code path (loading, `aclInit`, device binding, two-phase calls, workspaces,
/// asynchronous streams, destruction) runs against the mock.
pub fn context(device: i32) -> crate::Result<crate::Context> {
    crate::Context::ascend_from(toolkit_dir(), device)
}

/// Process-wide counters of the mock CANN.
///
/// `live_*` count objects alive now; `device_mallocs` and `violations` are totals since the
/// process loaded the mock. Tests usually compare two snapshots.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MockStats {
    /// `aclrtMalloc` blocks not yet freed.
    pub live_allocations: u64,
    /// `aclCreateTensor` handles not yet destroyed.
    pub live_tensors: u64,
    /// Executors from phase 1 neither consumed by phase 2 nor destroyed.
    pub live_executors: u64,
    /// Streams from `aclrtCreateStream` not yet destroyed (the implicit default streams excluded).
    pub live_streams: u64,
    /// Total successful `aclrtMalloc` calls.
    pub device_mallocs: u64,
    /// Total violations detected (each also printed on stderr).
    pub violations: u64,
    /// Device bytes (of live allocations) that a skipped queued task should have written and
    /// nothing wrote since. Reading them fails: a synchronous `aclrtMemcpy` returns
    /// `ACL_ERROR_RT_DEVICE_MEM_ERROR` (507053), a queued copy or kernel reading them is skipped
    /// and poisons what it should have written in turn. Writing the bytes or freeing their
    /// allocation clears them.
    pub poisoned_bytes: u64,
    /// HCCL communicators (`libhccl.so` of the mock) made and not yet destroyed.
    pub live_comms: u64,
    /// Total `aclrtSynchronizeStream` calls (host waits for one stream).
    pub stream_synchronizes: u64,
    /// Total `aclrtSynchronizeEvent` calls (host waits for one event).
    pub event_synchronizes: u64,
    /// Total `aclrtSynchronizeDevice` calls (host waits for every stream of a device).
    pub device_synchronizes: u64,
    /// Total successful `aclrtFree` calls (`aclrtFree` itself does not wait; a steady loop
    /// makes none: the allocator caches its blocks).
    pub device_frees: u64,
    /// Total blocking copies: `aclrtMemcpy` calls, and `aclrtMemcpyAsync` calls from or to
    /// pageable host memory, which CANN runs synchronously (the host waits for the copy).
    pub blocking_copies: u64,
    /// Total successful `aclrtMallocHost` calls (pinned host memory).
    pub host_mallocs: u64,
    /// `aclrtMallocHost` blocks not yet freed with `aclrtFreeHost`.
    pub live_host_allocations: u64,
    /// Total `HcclAllReduce` calls that queued a collective (the mock's `libhccl.so`).
    pub all_reduces: u64,
    /// Total `HcclAllGather` calls that queued a collective.
    pub all_gathers: u64,
    /// Total `HcclBroadcast` calls that queued a collective.
    pub broadcasts: u64,
    /// Events (of every kind, on every device) not yet destroyed.
    pub live_events: u64,
    /// Total events made (`aclrtCreateEvent`, `aclrtCreateEventWithFlag`, `aclrtCreateEventExWithFlag`).
    pub events_created: u64,
    /// Total events destroyed (`aclrtDestroyEvent`).
    pub events_destroyed: u64,
    /// Tasks queued on streams and not yet run.
    pub queued_tasks: u64,
}

/// Counters of the calling thread only (useful when tests run in parallel threads).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ThreadStats {
    /// Successful `aclrtMalloc` calls made on this thread.
    pub device_mallocs: u64,
    /// Violations detected in calls made on this thread (including queued tasks that a
    /// synchronizing call on this thread ran).
    pub violations: u64,
    /// Runtime calls made on this thread: every entry point of the toolkit's libraries (`acl*`,
    /// `aclnn*`, `Hccl*`), successful or not.
    pub api_calls: u64,
}

/// `ascend_mock_stats` of `mock/ascend_mock.h`.
#[repr(C)]
#[derive(Default)]
struct RawStats {
    live_allocations: u64,
    live_tensors: u64,
    live_executors: u64,
    live_streams: u64,
    live_events: u64,
    device_mallocs: u64,
    violations: u64,
    queued_tasks: u64,
    poisoned_bytes: u64,
    live_comms: u64,
    stream_synchronizes: u64,
    event_synchronizes: u64,
    device_synchronizes: u64,
    device_frees: u64,
    blocking_copies: u64,
    host_mallocs: u64,
    live_host_allocations: u64,
    all_reduces: u64,
    all_gathers: u64,
    broadcasts: u64,
    events_created: u64,
    events_destroyed: u64,
}

struct Api {
    get_stats: unsafe extern "C" fn(*mut RawStats),
    thread_violations: unsafe extern "C" fn() -> u64,
    thread_device_mallocs: unsafe extern "C" fn() -> u64,
    thread_api_calls: unsafe extern "C" fn() -> u64,
    fail_next: unsafe extern "C" fn(*const c_char, c_int) -> c_int,
    fail_next_thread: unsafe extern "C" fn(*const c_char, c_int) -> c_int,
    clear_faults: unsafe extern "C" fn(),
    violation_count: unsafe extern "C" fn() -> u64,
    violation_message: unsafe extern "C" fn(u64, *mut c_char, usize) -> usize,
    set_device_count: unsafe extern "C" fn(c_int, *mut c_int) -> c_int,
    device_live_events: unsafe extern "C" fn(c_int) -> u64,
    set_query_progress: unsafe extern "C" fn(c_int) -> c_int,
    capture_stats: unsafe extern "C" fn(*mut u64, *mut u64, *mut u64, *mut u64),
    /// Keeps the library mapped for the life of the process.
    _library: libloading::Library,
}

fn api() -> &'static Api {
    static API: OnceLock<Api> = OnceLock::new();
    API.get_or_init(|| {
        let path = toolkit_dir().join("lib64").join(ascend_sys::loader::ASCENDCL);
        // SAFETY: this is the mock's own libascendcl.so, built by this crate's build script; its
        // initialisers only set up static state. Loading the same path as `ascend_sys::load_from`
        // yields the same (reference-counted) instance.
        let library = unsafe { libloading::Library::new(&path) }
            .unwrap_or_else(|e| panic!("the mock CANN build is broken: cannot load {}: {e}", path.display()));
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the symbol is declared in mock/ascend_mock.h with exactly the signature of
                // the field it is stored in; the library outlives the pointer (kept in `Api`).
                *unsafe { library.get(concat!($name, "\0").as_bytes()) }.unwrap_or_else(|e| {
                    panic!("the mock CANN build is broken: {} lacks {}: {e}", path.display(), $name)
                })
            };
        }
        Api {
            get_stats: sym!("ascend_mock_get_stats"),
            thread_violations: sym!("ascend_mock_thread_violations"),
            thread_device_mallocs: sym!("ascend_mock_thread_device_mallocs"),
            thread_api_calls: sym!("ascend_mock_thread_api_calls"),
            fail_next: sym!("ascend_mock_fail_next"),
            fail_next_thread: sym!("ascend_mock_fail_next_thread"),
            clear_faults: sym!("ascend_mock_clear_faults"),
            violation_count: sym!("ascend_mock_violation_count"),
            violation_message: sym!("ascend_mock_violation_message"),
            set_device_count: sym!("ascend_mock_set_device_count"),
            device_live_events: sym!("ascend_mock_device_live_events"),
            set_query_progress: sym!("ascend_mock_set_query_progress"),
            capture_stats: sym!("ascend_mock_capture_stats"),
            _library: library,
        }
    })
}

/// The mock's process-wide counters now.
///
/// # Panics
/// Only if the mock toolkit that this crate's build script produced cannot be loaded (a broken build).
pub fn stats() -> MockStats {
    let mut raw = RawStats::default();
    // SAFETY: `raw` is a valid, writable `ascend_mock_stats` (same layout, `repr(C)`).
    unsafe { (api().get_stats)(&mut raw) };
    MockStats {
        live_allocations: raw.live_allocations,
        live_tensors: raw.live_tensors,
        live_executors: raw.live_executors,
        live_streams: raw.live_streams,
        device_mallocs: raw.device_mallocs,
        violations: raw.violations,
        poisoned_bytes: raw.poisoned_bytes,
        live_comms: raw.live_comms,
        stream_synchronizes: raw.stream_synchronizes,
        event_synchronizes: raw.event_synchronizes,
        device_synchronizes: raw.device_synchronizes,
        device_frees: raw.device_frees,
        blocking_copies: raw.blocking_copies,
        host_mallocs: raw.host_mallocs,
        live_host_allocations: raw.live_host_allocations,
        all_reduces: raw.all_reduces,
        all_gathers: raw.all_gathers,
        broadcasts: raw.broadcasts,
        live_events: raw.live_events,
        events_created: raw.events_created,
        events_destroyed: raw.events_destroyed,
        queued_tasks: raw.queued_tasks,
    }
}

/// The mock's graph capture counters (`mock/acl/capture.c`), process-wide.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CaptureStats {
    /// Captures begun (`aclmdlRICaptureBegin` calls that succeeded).
    pub captures: u64,
    /// Replays queued (`aclmdlRIExecuteAsync` calls that succeeded).
    pub replays: u64,
    /// Model run instances alive (captured, or being captured, and not destroyed).
    pub live_models: u64,
    /// Streams pulled into a capture by waiting for an event recorded in it (side streams of a
    /// capture across streams).
    pub joined_streams: u64,
}

/// The mock's graph capture counters now.
///
/// # Panics
/// Only if the mock toolkit cannot be loaded (a broken build).
pub fn capture_stats() -> CaptureStats {
    let mut s = CaptureStats::default();
    // SAFETY: four valid, writable counters; the function only reads under the mock's lock.
    unsafe { (api().capture_stats)(&mut s.captures, &mut s.replays, &mut s.live_models, &mut s.joined_streams) };
    s
}

/// Sets whether `aclrtQueryEventStatus` lets the mock device progress, and returns the previous
/// setting (process-wide; on by default). On, a query runs the tasks of the event's stream up to
/// the queried record (as hardware runs while the host works), so the event completes while
/// later work of that stream is still queued; a task that fails there is reported by the stream's
/// next synchronise. Off, a query runs nothing: an event completes only when its stream is drained
/// (a synchronise, or a wait for the event), which keeps work "in flight" for tests of what must
/// not happen before it completes.
///
/// # Panics
/// Only if the mock toolkit cannot be loaded (a broken build).
pub fn set_query_progress(on: bool) -> bool {
    // SAFETY: the function takes a plain int and only sets a flag under the mock's lock.
    unsafe { (api().set_query_progress)(c_int::from(on)) != 0 }
}

/// Live events of mock device `device` (the mock refuses a creation beyond 65536 of them, with
/// `ACL_ERROR_RT_NO_EVENT_RESOURCE`, 207007, as Atlas A2/A3 hold at most that many per device).
///
/// # Panics
/// Only if the mock toolkit cannot be loaded (a broken build).
pub fn live_events_on(device: i32) -> u64 {
    // SAFETY: the function takes a plain int and only reads a counter under the mock's lock.
    unsafe { (api().device_live_events)(device) }
}

/// The calling thread's counters.
///
/// # Panics
/// Only if the mock toolkit cannot be loaded (a broken build).
pub fn thread_stats() -> ThreadStats {
    let api = api();
    // SAFETY: the functions take no arguments and only read thread-local counters.
    unsafe {
        ThreadStats {
            device_mallocs: (api.thread_device_mallocs)(),
            violations: (api.thread_violations)(),
            api_calls: (api.thread_api_calls)(),
        }
    }
}

/// Number of live events (of every kind, not yet destroyed) and of tasks queued on streams
/// and not yet run.
///
/// # Panics
/// Only if the mock toolkit cannot be loaded (a broken build).
pub fn live_events_and_queued_tasks() -> (u64, u64) {
    let mut raw = RawStats::default();
    // SAFETY: as in `stats`.
    unsafe { (api().get_stats)(&mut raw) };
    (raw.live_events, raw.queued_tasks)
}

fn arm(api_name: &str, status: i32, thread_only: bool) {
    let api = api();
    let name = CString::new(api_name).ok();
    let known = name.as_ref().is_some_and(|name| {
        let f = if thread_only { api.fail_next_thread } else { api.fail_next };
        // SAFETY: `name` is a NUL-terminated string that outlives the call; the mock copies nothing
        // but the status.
        unsafe { f(name.as_ptr(), status) == 0 }
    });
    assert!(
        known,
        "ascend::mock::fail_next: `{api_name}` is not a function of the mock CANN (see ascend_sys::symbols)"
    );
}

/// Makes the next call of `api` (on any thread) return `status` without doing anything else.
///
/// `api` is a C function name, one of the functions listed in [`ascend_sys::symbols`] other than `aclGetRecentErrMsg` (e.g. `"aclrtMalloc"`). Functions returning a
/// pointer (`aclCreateTensor`) return null instead, and `aclrtMalloc`, `aclrtCreateStream` and
/// the event creations store null in their out-pointer. The failing call sets the thread's
/// `aclGetRecentErrMsg` text. A failed `aclnnBatchNormReduceBackward` still consumes its
/// (non-repeatable) executor, as every phase-2 call does. Arming the same API again replaces
/// the status.
///
/// The fault is process-wide: with tests running in parallel threads prefer
/// [`fail_next_on_this_thread`].
///
/// # Panics
/// If `api` is not such a function (a typo would otherwise silently never fire), or if the mock
/// toolkit cannot be loaded (a broken build).
pub fn fail_next(api: &str, status: i32) {
    arm(api, status, false);
}

/// Like [`fail_next`], but only a call made on the calling thread consumes the fault.
///
/// # Panics
/// As [`fail_next`].
pub fn fail_next_on_this_thread(api: &str, status: i32) {
    arm(api, status, true);
}

/// Disarms every pending process-wide fault and the calling thread's faults.
///
/// # Panics
/// Only if the mock toolkit cannot be loaded (a broken build).
pub fn clear_faults() {
    // SAFETY: takes no arguments; only resets the mock's fault tables.
    unsafe { (api().clear_faults)() }
}

/// The most devices the mock can have.
pub const MAX_DEVICES: u32 = 64;

/// Sets how many devices the mock has, from now on: a test that needs `n` devices says so
/// itself, whichever test of the process initialised ACL first.
///
/// It takes effect at once, before or after `aclInit`: `aclrtGetDeviceCount` reports `count` and
/// `aclrtSetDevice` accepts exactly the devices `0..count`, so [`context`]`(d)` (and
/// `Context::ascend_from`) succeeds for `d < count` and fails with [`Error::NoDevice`] beyond. It
/// takes precedence over `ASCEND_MOCK_DEVICE_COUNT` and outlives `aclFinalize`.
///
/// Shrinking is refused while a device that would go away is in use: it holds live device
/// memory, a stream from `aclrtCreateStream`, or work queued on its default stream (drop the
/// tensors, streams and contexts on it first). A device that goes away while merely set on some
/// thread keeps its state, hidden: runtime calls on that thread fail as with no device set (a
/// violation, as on CANN), until the count covers the device again.
///
/// The count is process-wide: tests in one binary that change it must not run at the same time
/// (hold a common lock).
///
/// # Errors
/// [`Error::InvalidArgument`] (argument `count`, status 161002) when `count` exceeds
/// [`MAX_DEVICES`], or when a device at or above `count` is in use; the count is then unchanged.
///
/// # Panics
/// Only if the mock toolkit cannot be loaded (a broken build).
///
/// [`Error::NoDevice`]: crate::Error::NoDevice
/// [`Error::InvalidArgument`]: crate::Error::InvalidArgument
pub fn set_device_count(count: u32) -> crate::Result<()> {
    let invalid = |message: String| crate::Error::InvalidArgument {
        argument: "count",
        message,
        status: crate::error::STATUS_INVALID,
    };
    let Some(n) = c_int::try_from(count).ok().filter(|_| count <= MAX_DEVICES) else {
        return Err(invalid(format!("the mock has at most {MAX_DEVICES} devices, {count} asked for")));
    };
    let mut busy: c_int = -1;
    // SAFETY: `busy` is a valid, writable int for the call; the mock only stores into it.
    match unsafe { (api().set_device_count)(n, &mut busy) } {
        0 => Ok(()),
        -2 => Err(invalid(format!(
            "device {busy} is in use (it holds device memory, a stream or queued work), so the mock cannot \
             shrink to {count} device(s)"
        ))),
        other => Err(crate::Error::Internal {
            what: format!(
                "ascend_mock_set_device_count({count}) returned {other}, which mock/ascend_mock.h does not define"
            ),
        }),
    }
}

/// The messages of the violations numbered `first..` (0-based, in the order detected), e.g.
/// `violations_since(before.violations)` after a [`stats`] snapshot. Only the last 1024 messages
/// are kept; older ones are left out.
///
/// # Panics
/// Only if the mock toolkit cannot be loaded (a broken build).
pub fn violations_since(first: u64) -> Vec<String> {
    let api = api();
    // SAFETY: takes no arguments.
    let end = unsafe { (api.violation_count)() };
    (first..end)
        .filter_map(|index| {
            let mut buf = vec![0u8; 1024];
            // SAFETY: `buf` is writable for `buf.len()` bytes; the mock writes at most that many,
            // NUL-terminated.
            let needed = unsafe { (api.violation_message)(index, buf.as_mut_ptr().cast(), buf.len()) };
            if needed == 0 {
                return None;
            }
            buf.truncate(needed.min(buf.len()) - 1);
            Some(String::from_utf8_lossy(&buf).into_owned())
        })
        .collect()
}

/// The message of the most recent violation, if any.
///
/// # Panics
/// Only if the mock toolkit cannot be loaded (a broken build).
pub fn last_violation() -> Option<String> {
    let count = stats().violations;
    count.checked_sub(1).and_then(|last| violations_since(last).pop())
}

/// Objects the crate's destructors deliberately leaked in this process because a destroy call,
/// or the synchronise before it, failed (e.g. an injected fault): queued work might still use
/// them, so leaking is the only sound choice. The mock's live counters exceed what the program
/// holds by exactly these.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Leaks {
    /// Device allocations (`aclrtFree` not called or failed).
    pub allocations: u64,
    /// `aclTensor` descriptors.
    pub tensors: u64,
    /// Executors.
    pub executors: u64,
    /// Streams.
    pub streams: u64,
    /// HCCL communicators.
    pub communicators: u64,
}

/// The crate's deliberate leaks so far (see [`Leaks`]).
pub fn leaks() -> Leaks {
    let [allocations, tensors, executors, streams, communicators] = crate::device::leaks();
    Leaks { allocations, tensors, executors, streams, communicators }
}

/// What the launch path has cost the host so far in this process, counted by the mock: the
/// numbers a steady loop should keep flat.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LaunchCounters {
    /// `aclTensor` descriptors created (successful `aclCreateTensor` calls).
    pub tensors_created: u64,
    /// Phase-1 calls (`aclnn*GetWorkspaceSize`, successful or not).
    pub phase1_calls: u64,
    /// Phase-2 calls that queued a kernel (an empty call queues none).
    pub launches: u64,
    /// Of `launches`, those of executors that phase 1 made while the device's
    /// `ACL_OPT_DETERMINISTIC` was on.
    pub deterministic_launches: u64,
    /// Of `launches`, those of executors that phase 1 made under another `ACL_OPT_DETERMINISTIC`
    /// than the device had at the launch: on CANN they run the kernel and tiling chosen under
    /// the old setting.
    pub stale_deterministic_launches: u64,
    /// Failed `aclSetAclOpExecutorRepeatable` calls: refusals ([`refuse_repeatable`]) and
    /// injected faults.
    pub repeatable_refusals: u64,
}

type Counter = unsafe extern "C" fn() -> u64;

/// The launch-path functions of the mock's `libnnopbase.so` and `libopapi.so`.
struct LaunchApi {
    tensors_created: Counter,
    phase1_calls: Counter,
    launches: unsafe extern "C" fn(*mut u64, *mut u64, *mut u64),
    repeatable_refusals: Counter,
    refuse_repeatable: unsafe extern "C" fn(*const c_char, c_int) -> c_int,
    _libraries: [libloading::Library; 2],
}

fn launch_api() -> &'static LaunchApi {
    static API: OnceLock<LaunchApi> = OnceLock::new();
    API.get_or_init(|| {
        let open = |name: &str| {
            let path = toolkit_dir().join("lib64").join(name);
            // SAFETY: the mock's own library, built by this crate's build script; its initialisers
            // only set up static state, and loading the path `ascend_sys::load_from` loads yields
            // the same (reference-counted) instance.
            let library = unsafe { libloading::Library::new(&path) }
                .unwrap_or_else(|e| panic!("the mock CANN build is broken: cannot load {}: {e}", path.display()));
            (library, path)
        };
        let ((nnopbase, nnopbase_path), (opapi, opapi_path)) =
            (open(ascend_sys::loader::NNOPBASE), open(ascend_sys::loader::OPAPI));
        macro_rules! sym {
            ($library:ident, $path:ident, $name:literal) => {
                // SAFETY: declared in mock/ascend_mock.h with exactly the signature of the field
                // it is stored in; the library outlives the pointer (kept in `LaunchApi`).
                *unsafe { $library.get(concat!($name, "\0").as_bytes()) }.unwrap_or_else(|e| {
                    panic!("the mock CANN build is broken: {} lacks {}: {e}", $path.display(), $name)
                })
            };
        }
        LaunchApi {
            tensors_created: sym!(nnopbase, nnopbase_path, "ascend_mock_tensors_created"),
            repeatable_refusals: sym!(nnopbase, nnopbase_path, "ascend_mock_repeatable_refusals"),
            refuse_repeatable: sym!(nnopbase, nnopbase_path, "ascend_mock_refuse_repeatable"),
            phase1_calls: sym!(opapi, opapi_path, "ascend_mock_phase1_calls"),
            launches: sym!(opapi, opapi_path, "ascend_mock_launches"),
            _libraries: [nnopbase, opapi],
        }
    })
}

/// The mock's [`LaunchCounters`] now (process-wide totals).
///
/// # Panics
/// Only if the mock toolkit that this crate's build script produced cannot be loaded (a broken build).
pub fn launch_counters() -> LaunchCounters {
    let api = launch_api();
    let (mut launches, mut deterministic_launches, mut stale_deterministic_launches) = (0, 0, 0);
    // SAFETY: the counters take no arguments and only read counters; `ascend_mock_launches`
    // writes three u64 through the valid pointers given.
    unsafe {
        (api.launches)(&mut launches, &mut deterministic_launches, &mut stale_deterministic_launches);
        LaunchCounters {
            tensors_created: (api.tensors_created)(),
            phase1_calls: (api.phase1_calls)(),
            launches,
            deterministic_launches,
            stale_deterministic_launches,
            repeatable_refusals: (api.repeatable_refusals)(),
        }
    }
}

/// From now on, `aclSetAclOpExecutorRepeatable` refuses (`on`) or accepts again (`!on`) the
/// executors of operator `op` with `ACLNN_ERR_INNER` (561000), as CANN refuses executors it cannot
/// repeat (phase 1 used an AI CPU kernel, a DSA task or a synchronous copy; not a violation).
///
/// `op` is the operator's phase-2 name (e.g. `"aclnnBatchNormStats"`), or `"*"` for every
/// operator. Process-wide. The environment variable `ASCEND_MOCK_REFUSE_REPEATABLE` (a
/// comma-separated list of such names, read once by the mock at its first use of the list) sets
/// the list a process starts with, e.g. to run a whole test binary under refusal.
///
/// # Panics
/// If `op` is neither `"*"` nor the phase-2 name of an operator in
/// [`ascend_sys::symbols::OPERATORS`], or if the mock toolkit cannot be loaded (a broken build).
pub fn refuse_repeatable(op: &str, on: bool) {
    let known = op == "*" || ascend_sys::symbols::OPERATORS.iter().any(|o| o.name == op);
    assert!(known, "ascend::mock::refuse_repeatable: `{op}` is not an operator of the mock CANN (nor \"*\")");
    let name = CString::new(op).expect("an operator name has no NUL");
    // SAFETY: `name` is a NUL-terminated string that outlives the call; the mock copies it.
    let status = unsafe { (launch_api().refuse_repeatable)(name.as_ptr(), c_int::from(on)) };
    assert_eq!(status, 0, "ascend::mock::refuse_repeatable({op:?}): the mock's list of refused operators is full");
}
