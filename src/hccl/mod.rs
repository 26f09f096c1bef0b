//! Collectives across ranks: [`Communicator`] (all-reduce, all-gather, broadcast) and
//! [`RootInfo`], on both backends.
//!
//! * **Ascend**: HCCL (`libhccl.so`, and `libhcomm.so` through it on CANN 9.x), loaded from the
//!   toolkit only when a communicator is made, so single-device users never need it. Collectives
//!   are asynchronous on the stream, like operators: every buffer a collective touches is
//!   recorded on the stream with the enqueue (the one launch path of [`crate::ops`]), so it is
//!   freed only after the stream has run the collective. HCCL's rules hold: one host thread drives
//!   one rank ([`Communicator`] is `Send`, not `Sync`), every rank issues the same collectives in
//!   the same order with the same count, dtype and op, and a rank that never arrives ends in
//!   HCCL's timeout error (`HCCL_CONNECT_TIMEOUT`).
//!   One communicator's collectives run in the order they were issued, also across streams: a
//!   collective on another stream than the previous one waits (on the device, through an event)
//!   for the previous stream's work.
//! * **CPU**: the ranks are threads of this process (at most 4096), joined in memory; a
//!   collective runs when it is called and returns once every rank has called it (or fails after
//!   the timeout). Float values are reduced in f64 in rank order and rounded once, i32 in
//!   wrapping i32 arithmetic as HCCL does, so every rank gets the same bits; all-gather and
//!   broadcast copy bits. This engine is for tests and single-machine use; across machines, the
//!   Ascend path with HCCL is the engine.
//!
//! Tensors given to a collective must be contiguous (HCCL works on flat buffers), on the
//! communicator's device, of f32, f16, bf16 or i32 (bf16 needs Atlas A2/A3 or later on Ascend).
//! Both engines accept the same calls: the (op, dtype) pairs of HCCL's table
//! ([`Communicator::all_reduce`]), and `HCCL_CONNECT_TIMEOUT` read once, as whole seconds in
//! 1..=7200 (anything else means the default, 120 s).
// Host allocations sized by a caller's count are fallible here (.ci/alloc-lint/clippy.toml).
#![deny(clippy::disallowed_methods)]

mod ascend;
mod cpu;
mod rank_table;
mod rendezvous;

use std::cell::Cell;
use std::marker::PhantomData;
use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

use crate::context::{Context, ContextKind};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::stream::Stream;
use crate::tensor::Tensor;

/// How an all-reduce combines the ranks' values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Σ over ranks (`HCCL_REDUCE_SUM`).
    Sum,
    /// Π over ranks (`HCCL_REDUCE_PROD`).
    Prod,
    /// Maximum (`HCCL_REDUCE_MAX`).
    Max,
    /// Minimum (`HCCL_REDUCE_MIN`).
    Min,
}

/// The size of HCCL's `HcclRootInfo` (`HCCL_ROOT_INFO_BYTES`), the payload of a root info.
const HCCL_ROOT_BYTES: usize = 4108;

/// The crate's envelope around the payload: magic (8 bytes), version (u16), kind (u8), a zero
/// byte, then the FNV-1a 64 checksum of everything else (u64), all little-endian.
const ENVELOPE_BYTES: usize = 20;
const ENVELOPE_MAGIC: &[u8; 8] = b"ASCNDRI\0";
const ENVELOPE_VERSION: u16 = 1;

/// The size of a root info as [`RootInfo::as_bytes`] gives it and [`RootInfo::from_bytes`] takes
/// it: HCCL's 4108-byte `HcclRootInfo` (or the CPU engine's group name) inside the crate's
/// 20-byte envelope (magic, version, kind, checksum).
pub const ROOT_INFO_BYTES: usize = ENVELOPE_BYTES + HCCL_ROOT_BYTES;

/// Which engine made a root info (and so which engine can join it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RootKind {
    /// An in-process group of the CPU engine.
    Cpu = 1,
    /// HCCL's `HcclRootInfo` (`HcclGetRootInfo`).
    Hccl = 2,
}

/// What ranks need to find each other ([`Communicator::init_rank`]): made by one rank (the root),
/// then handed to every rank by the launcher (as bytes: a file, an environment variable, a
/// socket). On Ascend it carries HCCL's `HcclRootInfo` (the root opens a host port for the other
/// ranks); on the CPU it names an in-process group.
///
/// The bytes carry an envelope (magic, version, which engine made it, a checksum), so
/// [`from_bytes`](RootInfo::from_bytes) refuses bytes that [`as_bytes`](RootInfo::as_bytes) did
/// not make (truncated, corrupted, or of another format), and each engine refuses a root info
/// made by the other before any HCCL call. The checksum detects accidents, not forgery: bytes
/// built on purpose to pass it are handed to HCCL as its own root info.
#[derive(Clone)]
pub struct RootInfo {
    kind: RootKind,
    /// The envelope followed by the payload (what `as_bytes` returns).
    bytes: Box<[u8; ROOT_INFO_BYTES]>,
}

impl std::fmt::Debug for RootInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.kind {
            RootKind::Cpu => "cpu",
            RootKind::Hccl => "hccl",
        };
        f.debug_struct("RootInfo").field("kind", &kind).finish()
    }
}

/// FNV-1a, 64 bits.
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in parts.iter().flat_map(|p| p.iter()) {
        h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

impl RootInfo {
    /// A new root info for a group whose root rank runs on `ctx`: `HcclGetRootInfo` on Ascend
    /// (after binding the device), a new in-process group on the CPU.
    pub fn new(ctx: &Context) -> Result<RootInfo> {
        Ok(match &ctx.kind {
            ContextKind::Cpu => RootInfo::wrap(RootKind::Cpu, &cpu::new_root()),
            ContextKind::Ascend(device) => {
                let payload = ascend::new_root(device)?;
                RootInfo::wrap(RootKind::Hccl, &payload)
            }
        })
    }

    fn wrap(kind: RootKind, payload: &[u8; HCCL_ROOT_BYTES]) -> RootInfo {
        let mut bytes = Box::new([0u8; ROOT_INFO_BYTES]);
        bytes[..8].copy_from_slice(ENVELOPE_MAGIC);
        bytes[8..10].copy_from_slice(&ENVELOPE_VERSION.to_le_bytes());
        bytes[10] = kind as u8;
        bytes[ENVELOPE_BYTES..].copy_from_slice(payload);
        let sum = fnv1a(&[&bytes[..12], &bytes[ENVELOPE_BYTES..]]);
        bytes[12..ENVELOPE_BYTES].copy_from_slice(&sum.to_le_bytes());
        RootInfo { kind, bytes }
    }

    /// The bytes to hand to the other ranks ([`ROOT_INFO_BYTES`] of them).
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..]
    }

    /// A root info received from the root rank: exactly the [`ROOT_INFO_BYTES`] bytes that
    /// [`as_bytes`](RootInfo::as_bytes) gave there. Any other bytes (wrong length, magic,
    /// version, kind or checksum) are refused.
    pub fn from_bytes(bytes: &[u8]) -> Result<RootInfo> {
        let bytes: [u8; ROOT_INFO_BYTES] = bytes.try_into().map_err(|_| {
            Error::invalid("root", format!("a root info has {ROOT_INFO_BYTES} bytes, got {}", bytes.len()))
        })?;
        let refuse = |why: String| Error::invalid("root", format!("not a root info made by RootInfo::as_bytes: {why}"));
        if &bytes[..8] != ENVELOPE_MAGIC {
            return Err(refuse("bad magic".into()));
        }
        let version = u16::from_le_bytes([bytes[8], bytes[9]]);
        if version != ENVELOPE_VERSION {
            return Err(refuse(format!("envelope version {version}, this crate reads {ENVELOPE_VERSION}")));
        }
        let kind = match bytes[10] {
            1 => RootKind::Cpu,
            2 => RootKind::Hccl,
            k => return Err(refuse(format!("unknown kind {k}"))),
        };
        let mut sum = [0u8; 8];
        sum.copy_from_slice(&bytes[12..ENVELOPE_BYTES]);
        if bytes[11] != 0 || u64::from_le_bytes(sum) != fnv1a(&[&bytes[..12], &bytes[ENVELOPE_BYTES..]]) {
            return Err(refuse("the checksum does not match (corrupted or truncated in transit?)".into()));
        }
        Ok(RootInfo { kind, bytes: Box::new(bytes) })
    }

    /// The payload: HCCL's `HcclRootInfo` or the CPU engine's group name.
    fn payload(&self) -> &[u8; HCCL_ROOT_BYTES] {
        self.bytes[ENVELOPE_BYTES..].try_into().unwrap_or(&[0; HCCL_ROOT_BYTES])
    }
}

/// One rank of a group of ranks that run collectives together (an `HcclComm` on Ascend).
///
/// `Send` but not `Sync`: one thread drives one rank, as HCCL requires. Dropping it destroys the
/// communicator after the streams its collectives ran on have finished.
pub struct Communicator {
    engine: Engine,
    rank: u32,
    size: u32,
    _not_sync: PhantomData<Cell<()>>,
}

enum Engine {
    Cpu(cpu::Rank),
    Ascend(ascend::Comm),
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let backend = match &self.engine {
            Engine::Cpu(_) => "cpu".to_string(),
            Engine::Ascend(c) => format!("Ascend device {}", c.device_id()),
        };
        f.debug_struct("Communicator")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("backend", &backend)
            .finish()
    }
}

impl Communicator {
    /// One communicator per context, rank `i` on `contexts[i]`, for several devices driven by one
    /// process (`HcclCommInitAll` on Ascend: distinct devices of one toolkit; on the CPU, any
    /// number of CPU contexts). Then give each communicator to its own thread: a collective
    /// returns (on the CPU) or completes (on Ascend) only once every rank has issued it.
    pub fn init_all(contexts: &[Context]) -> Result<Vec<Communicator>> {
        if contexts.is_empty() {
            return Err(Error::invalid("contexts", "at least one context is needed"));
        }
        let size = u32::try_from(contexts.len()).map_err(|_| Error::invalid("contexts", "too many ranks"))?;
        let make = |engine, rank| Communicator { engine, rank, size, _not_sync: PhantomData };
        if contexts.iter().all(|c| matches!(c.kind, ContextKind::Cpu)) {
            // bounded: one communicator per rank of the vector cpu::init_all returned (in memory).
            #[allow(clippy::disallowed_methods)]
            let comms = cpu::init_all(size, settings().connect_timeout)?
                .into_iter()
                .enumerate()
                .map(|(r, e)| make(Engine::Cpu(e), r as u32))
                .collect();
            return Ok(comms);
        }
        // bounded: one device per context of `contexts`, a slice already in memory.
        #[allow(clippy::disallowed_methods)]
        let devices = contexts
            .iter()
            .map(|c| match &c.kind {
                ContextKind::Ascend(d) => Ok(d.clone()),
                ContextKind::Cpu => {
                    Err(Error::invalid("contexts", "CPU and Ascend contexts cannot share a communicator"))
                }
            })
            .collect::<Result<Vec<_>>>()?;
        let comms = ascend::init_all(&devices)?;
        // bounded: one communicator per handle of `comms`, a vector already in memory.
        #[allow(clippy::disallowed_methods)]
        let comms = comms.into_iter().enumerate().map(|(r, c)| make(Engine::Ascend(c), r as u32)).collect();
        Ok(comms)
    }

    /// Rank `rank` of `n_ranks`, meeting the others through `root` (one process per device,
    /// possibly across servers: `HcclCommInitRootInfo`). Blocks until every rank has joined, or
    /// fails after the connect timeout (`HCCL_CONNECT_TIMEOUT` seconds; 120 by default). A root
    /// info made by the other backend is refused with `HCCL_E_PARA` before HCCL sees it, as is
    /// a CPU group of more than 4096 ranks.
    pub fn init_rank(ctx: &Context, n_ranks: u32, root: &RootInfo, rank: u32) -> Result<Communicator> {
        if n_ranks == 0 || rank >= n_ranks {
            return Err(Error::invalid("rank", format!("rank {rank} of {n_ranks} ranks: need rank < n_ranks")));
        }
        let call = "HcclCommInitRootInfo";
        let engine = match (&ctx.kind, root.kind) {
            (ContextKind::Cpu, RootKind::Cpu) => {
                Engine::Cpu(cpu::init_rank(root.payload(), n_ranks, rank, settings().connect_timeout)?)
            }
            (ContextKind::Ascend(device), RootKind::Hccl) => {
                Engine::Ascend(ascend::init_rank(device, n_ranks, root.payload(), rank)?)
            }
            (ContextKind::Cpu, RootKind::Hccl) => {
                return Err(hccl_error(
                    call,
                    HCCL_E_PARA,
                    "this root info was made on Ascend; a CPU context needs a CPU one",
                ))
            }
            (ContextKind::Ascend(_), RootKind::Cpu) => {
                return Err(hccl_error(
                    call,
                    HCCL_E_PARA,
                    "this root info was made on a CPU context; an Ascend context needs one from HcclGetRootInfo",
                ))
            }
        };
        Ok(Communicator { engine, rank, size: n_ranks, _not_sync: PhantomData })
    }

    /// Rank `rank` of the rank-table file `path` (`HcclCommInitClusterInfo`; torch_npu's path when
    /// `RANK_TABLE_FILE` is set, and MindSpore's): one process per device, possibly across
    /// servers. Before HCCL sees it the path and the table are checked (at most 4095 bytes, a
    /// readable file, JSON of version 1.0/1.2 `server_list[].device[]` or 2.0 `rank_list[]`,
    /// `"status": "completed"`, rank ids exactly `0..n`, `rank` among them): every problem is an
    /// error naming the path and what is wrong. The table's `device_id` of `rank` must be `ctx`'s
    /// device: its id mapped through `ASCEND_RT_VISIBLE_DEVICES` when that is set (the id indexes
    /// the list), the id itself otherwise; a mismatch is an error naming the table, the rank and
    /// both ids. (The table holds physical ids: in a container that renumbers the devices it
    /// exposes, which no variable shows, this check compares the container's ids with them.)
    /// Blocks until every rank has joined (`HCCL_CONNECT_TIMEOUT`).
    /// CPU contexts: an error (the CPU engine joins ranks in one process only).
    pub fn from_rank_table(ctx: &Context, path: impl AsRef<Path>, rank: u32) -> Result<Communicator> {
        let path = path.as_ref();
        let ContextKind::Ascend(device) = &ctx.kind else {
            return Err(Error::invalid(
                "ctx",
                "a rank table starts HCCL ranks (one process per device); the CPU engine joins ranks in one process \
                 only (Communicator::init_all, Communicator::init_rank)",
            ));
        };
        let table = rank_table::RankTable::load(path)?;
        if rank >= table.size() {
            return Err(Error::invalid(
                "rank",
                format!(
                    "rank {rank} is not a rank_id of rank table {} (ranks 0..{})",
                    path.display(),
                    table.size() - 1
                ),
            ));
        }
        table.check_device(path, rank, device.id)?;
        let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| Error::invalid("path", format!("rank-table path {} contains a NUL byte", path.display())))?;
        let comm = ascend::init_cluster(device, &c_path, rank)?;
        Ok(Communicator { engine: Engine::Ascend(comm), rank, size: table.size(), _not_sync: PhantomData })
    }

    /// This process's rank, from the launcher's environment (torchrun and the Ascend launchers):
    /// * `RANK_TABLE_FILE` set: [`from_rank_table`](Self::from_rank_table) with the rank in
    ///   `RANK` (torch_npu) or else `RANK_ID` (MindSpore, CANN samples); `WORLD_SIZE`/`RANK_SIZE`,
    ///   when set, must equal the table's size;
    /// * else `RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`: rank 0 makes the root info and
    ///   serves it over TCP on `MASTER_ADDR:MASTER_PORT` (`ASCEND_RENDEZVOUS_PORT` overrides the
    ///   port; under torchrun, whose agent holds `MASTER_PORT` when `TORCHELASTIC_USE_AGENT_STORE`
    ///   is true, the default is `MASTER_PORT + 1`), the other ranks fetch it, then all call
    ///   [`init_rank`](Self::init_rank). One deadline of `ASCEND_RENDEZVOUS_TIMEOUT` seconds
    ///   (default 120) bounds each rank's whole exchange; a job id (`MASTER_PORT`, `WORLD_SIZE`,
    ///   and `ASCEND_JOB_ID` or `TORCHELASTIC_RUN_ID`) keeps jobs that reuse an address apart.
    ///
    /// `ctx` is this rank's device: pick it from `LOCAL_RANK` (torchrun) or `DEVICE_ID`. Every
    /// failure names the variable or the peer: [`Error::Config`] for a missing or bad variable,
    /// [`Error::Rendezvous`] for a peer that never came, refused or closed early. CPU contexts: an
    /// error (the CPU engine joins ranks in one process only).
    pub fn from_env(ctx: &Context) -> Result<Communicator> {
        rendezvous::from_env(ctx)
    }

    /// A `Communicator` over an `HcclComm` the caller made (e.g. another library's), on `ctx`'s
    /// device; its rank and size come from `HcclGetRankId`/`HcclGetRankSize`. Collectives run as on
    /// any communicator. On drop the streams its collectives ran on are synchronised, and the
    /// comm is **never destroyed** by this crate. CPU contexts and null handles are errors.
    ///
    /// # Safety
    /// `comm` is a live communicator made on `ctx`'s device, stays alive until this value is
    /// dropped, and is not used by anyone else while this value issues collectives (HCCL's
    /// one-thread-per-rank rule).
    pub unsafe fn from_raw(ctx: &Context, comm: ascend_sys::HcclComm) -> Result<Communicator> {
        let ContextKind::Ascend(device) = &ctx.kind else {
            return Err(Error::invalid("ctx", "an HcclComm needs an Ascend context, got the CPU backend"));
        };
        if comm.is_null() {
            return Err(Error::null("comm", "the HcclComm is null"));
        }
        // SAFETY: the caller's contract, passed on.
        let (comm, rank, size) = unsafe { ascend::borrow(device, comm) }?;
        Ok(Communicator { engine: Engine::Ascend(comm), rank, size, _not_sync: PhantomData })
    }

    /// The raw `HcclComm`, to call HCCL functions this crate does not wrap. Valid while this
    /// `Communicator` lives (do not destroy it: the drop does); `None` for the CPU engine.
    pub fn as_raw(&self) -> Option<ascend_sys::HcclComm> {
        match &self.engine {
            Engine::Cpu(_) => None,
            Engine::Ascend(c) => Some(c.raw()),
        }
    }

    /// Whether HCCL has found an asynchronous error on this communicator
    /// (`HcclGetCommAsyncError`, what torch_npu's watchdog polls; HCCL reports a remote failure as
    /// `HCCL_E_REMOTE`): `Ok(None)` when healthy. The CPU engine has none (its collectives report
    /// failures when called): always `Ok(None)`.
    pub fn async_error(&self) -> Result<Option<Error>> {
        match &self.engine {
            Engine::Cpu(_) => Ok(None),
            Engine::Ascend(c) => c.async_error(),
        }
    }

    /// This rank's number, `0..size()`.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// The number of ranks.
    pub fn size(&self) -> u32 {
        self.size
    }

    /// Combines `tensor` across ranks with `op`, in place: every rank ends with the same result.
    /// Asynchronous on `stream` on Ascend (`HcclAllReduce` with send = recv).
    ///
    /// The (op, dtype) pairs are HCCL's on Atlas A2/A3 (docs/cann/HCCL.md 4.3), on both backends:
    /// every op for f32, f16 and i32 (integers wrap around), every op but `Prod` for bf16;
    /// anything else is `HCCL_E_NOT_SUPPORT` before any rank waits.
    pub fn all_reduce(&self, stream: &Stream, tensor: &mut Tensor, op: ReduceOp) -> Result<()> {
        check_reduce(op, tensor.dtype())?;
        self.check(stream, tensor, "tensor")?;
        match &self.engine {
            Engine::Cpu(r) => r.all_reduce(tensor, op),
            Engine::Ascend(c) => c.all_reduce(stream, tensor, op),
        }
    }

    /// Gathers every rank's `input` into `output` (`size() × input.numel()` elements, rank-major,
    /// same dtype). `HcclAllGather` on Ascend.
    pub fn all_gather(&self, stream: &Stream, input: &Tensor, output: &mut Tensor) -> Result<()> {
        self.check(stream, input, "input")?;
        self.check(stream, output, "output")?;
        if output.dtype() != input.dtype() {
            return Err(Error::invalid(
                "output",
                format!("dtype must equal input's ({}), got {}", input.dtype(), output.dtype()),
            ));
        }
        let want = input.numel().checked_mul(self.size as usize);
        if want != Some(output.numel()) {
            return Err(Error::invalid(
                "output",
                format!(
                    "must hold size × input = {} × {} elements, holds {}",
                    self.size,
                    input.numel(),
                    output.numel()
                ),
            ));
        }
        match &self.engine {
            Engine::Cpu(r) => r.all_gather(input, output),
            Engine::Ascend(c) => c.all_gather(stream, input, output),
        }
    }

    /// Copies `tensor` of rank `root` to every rank's `tensor` (`HcclBroadcast`).
    pub fn broadcast(&self, stream: &Stream, tensor: &mut Tensor, root: u32) -> Result<()> {
        if root >= self.size {
            return Err(Error::invalid("root", format!("root rank {root} of {} ranks", self.size)));
        }
        self.check(stream, tensor, "tensor")?;
        match &self.engine {
            Engine::Cpu(r) => r.broadcast(tensor, root),
            Engine::Ascend(c) => c.broadcast(stream, tensor, root),
        }
    }

    /// The checks every collective makes on a tensor (the same on both backends).
    fn check(&self, stream: &Stream, t: &Tensor, argument: &'static str) -> Result<()> {
        t.check_stream(stream, argument)?;
        match (&self.engine, stream.ascend()) {
            (Engine::Cpu(_), None) => {}
            (Engine::Ascend(c), Some((_, d))) if d.same(c.device()) => {}
            _ => return Err(stream.mismatch("stream", &format!("the communicator is {self:?}"))),
        }
        if !t.is_contiguous() {
            return Err(Error::invalid(argument, "collectives need a contiguous tensor (a flat buffer)"));
        }
        Ok(())
    }
}

const HCCL_E_PARA: u32 = ascend_sys::HcclResult::HCCL_E_PARA.0;
const HCCL_E_NOT_SUPPORT: u32 = ascend_sys::HcclResult::HCCL_E_NOT_SUPPORT.0;

/// Whether HCCL reduces `dtype` with `op` (the Atlas A2/A3 table, docs/cann/HCCL.md 4.3: every
/// op for int32, fp16 and fp32; bfp16 without prod). The one table both engines obey.
pub(crate) fn reduce_supported(op: ReduceOp, dtype: DType) -> bool {
    match dtype {
        DType::F32 | DType::F16 | DType::I32 => true,
        DType::BF16 => op != ReduceOp::Prod,
    }
}

/// [`reduce_supported`] as the error both engines return (`HCCL_E_NOT_SUPPORT`, as HCCL's).
fn check_reduce(op: ReduceOp, dtype: DType) -> Result<()> {
    if reduce_supported(op, dtype) {
        return Ok(());
    }
    Err(hccl_error(
        "HcclAllReduce",
        HCCL_E_NOT_SUPPORT,
        format!("HCCL has no {op:?} reduction for {dtype} (Atlas A2/A3, docs/cann/HCCL.md 4.3)"),
    ))
}

/// The HCCL environment as the engines use it, read once and validated.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Settings {
    /// `HCCL_CONNECT_TIMEOUT`: whole seconds in 1..=7200, else HCCL's default of 120 s.
    pub(crate) connect_timeout: Duration,
}

/// The longest `HCCL_CONNECT_TIMEOUT` HCCL accepts (docs/cann/HCCL.md 4.8), in seconds.
const MAX_CONNECT_TIMEOUT_S: u64 = 7200;
const DEFAULT_CONNECT_TIMEOUT_S: u64 = 120;

impl Settings {
    /// Validates the raw value of `HCCL_CONNECT_TIMEOUT` (`None`: unset).
    pub(crate) fn parse(connect_timeout: Option<&str>) -> Settings {
        let secs = connect_timeout
            .and_then(|v| v.trim().parse::<u64>().ok())
            .filter(|s| (1..=MAX_CONNECT_TIMEOUT_S).contains(s))
            .unwrap_or(DEFAULT_CONNECT_TIMEOUT_S);
        Settings { connect_timeout: Duration::from_secs(secs) }
    }
}

/// The process's [`Settings`], parsed from the environment at the first communicator.
pub(crate) fn settings() -> Settings {
    static SETTINGS: OnceLock<Settings> = OnceLock::new();
    *SETTINGS.get_or_init(|| Settings::parse(std::env::var("HCCL_CONNECT_TIMEOUT").ok().as_deref()))
}

/// A failed HCCL call (or the CPU engine's equivalent), with the result's name.
pub(crate) fn hccl_error(call: &'static str, result: u32, message: impl Into<String>) -> Error {
    Error::hccl(call, result, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_timeout_is_whole_seconds_in_hccl_range_else_the_default() {
        let secs = |v: Option<&str>| Settings::parse(v).connect_timeout.as_secs();
        for (v, want) in [(None, 120), (Some("1"), 1), (Some(" 7200 "), 7200), (Some("300"), 300)] {
            assert_eq!(secs(v), want, "{v:?}");
        }
        for v in ["0", "7201", "-5", "1e20", "1e19", "0.3", "NaN", "inf", "", "18446744073709551616"] {
            assert_eq!(secs(Some(v)), 120, "{v:?}");
        }
    }

    #[test]
    fn a_root_info_round_trips_and_any_changed_byte_is_refused() {
        let root = RootInfo::wrap(RootKind::Hccl, &[7; HCCL_ROOT_BYTES]);
        let back = RootInfo::from_bytes(root.as_bytes()).unwrap();
        assert_eq!((back.kind, back.payload()), (RootKind::Hccl, &[7; HCCL_ROOT_BYTES]));
        for i in (0..ROOT_INFO_BYTES).step_by(97) {
            let mut b = root.as_bytes().to_vec();
            b[i] ^= 1;
            assert!(RootInfo::from_bytes(&b).is_err(), "byte {i}");
        }
    }

    #[test]
    fn the_reduce_table_is_hccls() {
        for dtype in [DType::F32, DType::F16, DType::BF16, DType::I32] {
            for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min] {
                let refused = dtype == DType::BF16 && op == ReduceOp::Prod;
                assert_eq!(reduce_supported(op, dtype), !refused, "{op:?} {dtype}");
            }
        }
    }
}
