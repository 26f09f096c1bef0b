//! The CPU engine: the ranks are threads of this process and meet in memory.
//!
//! Each collective is a rendezvous: rank r's n-th collective waits in slot n until every rank has
//! brought its n-th collective, which must be the same kind with the same count, dtype and op
//! (or root). The last rank to arrive computes the result, so every rank receives the same bits:
//! float reductions in f64 in rank order, rounded once to the dtype; i32 reductions in wrapping
//! i32 arithmetic, as HCCL's; all-gather and broadcast copy the elements bit for bit. A mismatch
//! or a rank that does not arrive within the timeout fails the collective on every rank and
//! breaks the group: later collectives fail at once (as a real communicator would have to be
//! rebuilt).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use super::{hccl_error, ReduceOp, HCCL_ROOT_BYTES};
use crate::cpu::host::try_vec;
use crate::dtype::{bf16, f16, DType, SliceMut, SliceRef};
use crate::error::{Error, Result};
use crate::tensor::{Storage, Tensor};

/// The first bytes of a CPU root info.
const MAGIC: &[u8; 8] = b"ASCNDCPU";

/// HcclResult values the engine reports (the bound enum's, so both engines report the same).
const HCCL_E_PARA: u32 = ascend_sys::HcclResult::HCCL_E_PARA.0;
const HCCL_E_TIMEOUT: u32 = ascend_sys::HcclResult::HCCL_E_TIMEOUT.0;
const HCCL_E_INTERNAL: u32 = ascend_sys::HcclResult::HCCL_E_INTERNAL.0;

/// The most ranks a CPU group takes (each is a thread of this process). HCCL documents no limit
/// for `HcclCommInitRootInfo`; the mock HCCL takes at most 64.
pub(crate) const MAX_RANKS: u32 = 4096;

/// `n_ranks` within [`MAX_RANKS`], else `HCCL_E_PARA` naming the call.
fn check_rank_count(call: &'static str, n_ranks: u32) -> Result<()> {
    if n_ranks > MAX_RANKS {
        return Err(hccl_error(
            call,
            HCCL_E_PARA,
            format!("{n_ranks} ranks: the CPU engine runs at most {MAX_RANKS} ranks (threads of one process)"),
        ));
    }
    Ok(())
}

/// `now + timeout`, or `now` plus the longest timeout the clock can represent.
fn deadline_after(timeout: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(timeout).or_else(|| now.checked_add(Duration::from_secs(1))).unwrap_or(now)
}

fn is_cpu_root(bytes: &[u8; HCCL_ROOT_BYTES]) -> bool {
    bytes.starts_with(MAGIC)
}

/// A root info naming a new in-process group: magic, process id, group id.
pub(super) fn new_root() -> Box<[u8; HCCL_ROOT_BYTES]> {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let mut b = Box::new([0u8; HCCL_ROOT_BYTES]);
    b[..8].copy_from_slice(MAGIC);
    b[8..12].copy_from_slice(&std::process::id().to_le_bytes());
    b[12..20].copy_from_slice(&NEXT.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    b
}

/// What a collective is, for matching the ranks' n-th calls.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    AllReduce(ReduceOp),
    AllGather,
    Broadcast(u32),
}

#[derive(Clone, Copy, Debug, PartialEq)]
struct Signature {
    kind: Kind,
    dtype: DType,
    count: usize,
}

impl Signature {
    fn call(&self) -> &'static str {
        match self.kind {
            Kind::AllReduce(_) => "HcclAllReduce",
            Kind::AllGather => "HcclAllGather",
            Kind::Broadcast(_) => "HcclBroadcast",
        }
    }
}

/// A rank's contribution to a collective, and a collective's result.
#[derive(Clone, Debug)]
enum Payload {
    /// Float elements to reduce, widened exactly to f64.
    Float(Vec<f64>),
    /// i32 elements to reduce (wrapping).
    Int(Vec<i32>),
    /// Elements copied bit for bit (all-gather, broadcast).
    Bits(Elements),
}

/// Elements of one dtype, as stored.
#[derive(Clone, Debug)]
enum Elements {
    F32(Vec<f32>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    I32(Vec<i32>),
}

struct Slot {
    signature: Signature,
    inputs: Vec<Option<Payload>>,
    arrived: u32,
    output: Option<Arc<Payload>>,
    taken: u32,
}

struct State {
    /// Ranks that have joined (for `init_rank`).
    joined: Vec<bool>,
    /// Each rank's next collective number.
    next: Vec<u64>,
    slots: HashMap<u64, Slot>,
    /// Why the group failed, if it did.
    broken: Option<(u32, String)>,
}

/// The ranks of one group.
struct Group {
    size: u32,
    state: Mutex<State>,
    arrived: Condvar,
    timeout: Duration,
}

impl Group {
    fn new(size: u32, timeout: Duration) -> Result<Arc<Group>> {
        let n = size as usize;
        let state = State { joined: try_vec(n, false)?, next: try_vec(n, 0)?, slots: HashMap::new(), broken: None };
        Ok(Arc::new(Group { size, state: Mutex::new(state), arrived: Condvar::new(), timeout }))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Breaks the group (every pending and later collective fails) and wakes every rank.
    fn break_group(&self, state: &mut State, result: u32, why: String) {
        if state.broken.is_none() {
            state.broken = Some((result, why));
        }
        self.arrived.notify_all();
    }
}

/// One rank of a CPU group.
pub(super) struct Rank {
    group: Arc<Group>,
    rank: u32,
}

/// `size` ranks of a new group (every rank joined).
pub(super) fn init_all(size: u32, timeout: Duration) -> Result<Vec<Rank>> {
    check_rank_count("HcclCommInitAll", size)?;
    let group = Group::new(size, timeout)?;
    group.lock().joined.iter_mut().for_each(|j| *j = true);
    // bounded: size <= MAX_RANKS (4096), checked at the top.
    #[allow(clippy::disallowed_methods)]
    let ranks = (0..size).map(|rank| Rank { group: group.clone(), rank }).collect();
    Ok(ranks)
}

/// Groups being joined through a root info, by group id.
static JOINING: Mutex<Vec<(u64, Weak<Group>)>> = Mutex::new(Vec::new());

/// Rank `rank` of the group `root` names: waits until all `n_ranks` have joined.
pub(super) fn init_rank(root: &[u8; HCCL_ROOT_BYTES], n_ranks: u32, rank: u32, timeout: Duration) -> Result<Rank> {
    let call = "HcclCommInitRootInfo";
    check_rank_count(call, n_ranks)?;
    if !is_cpu_root(root) {
        return Err(hccl_error(call, HCCL_E_PARA, "this root info was made on Ascend; a CPU context needs a CPU one"));
    }
    let pid = u32::from_le_bytes(root[8..12].try_into().unwrap_or_default());
    if pid != std::process::id() {
        return Err(hccl_error(
            call,
            HCCL_E_PARA,
            "this CPU root info comes from another process: the CPU engine joins the ranks of one process",
        ));
    }
    let id = u64::from_le_bytes(root[12..20].try_into().unwrap_or_default());
    let group = {
        let mut joining = JOINING.lock().unwrap_or_else(|p| p.into_inner());
        joining.retain(|(_, g)| g.strong_count() > 0);
        match joining.iter().find(|(i, _)| *i == id).and_then(|(_, g)| g.upgrade()) {
            Some(g) => g,
            None => {
                let g = Group::new(n_ranks, timeout)?;
                joining.push((id, Arc::downgrade(&g)));
                g
            }
        }
    };
    if group.size != n_ranks {
        return Err(hccl_error(
            call,
            HCCL_E_PARA,
            format!("rank {rank} says {n_ranks} ranks, the group has {}", group.size),
        ));
    }
    let mut state = group.lock();
    if state.joined[rank as usize] {
        return Err(hccl_error(call, HCCL_E_PARA, format!("rank {rank} joined twice")));
    }
    state.joined[rank as usize] = true;
    group.arrived.notify_all();
    let deadline = deadline_after(timeout);
    while !state.joined.iter().all(|&j| j) {
        let now = Instant::now();
        if now >= deadline {
            state.joined[rank as usize] = false;
            // bounded: n_ranks <= MAX_RANKS (4096), checked at the top.
            #[allow(clippy::disallowed_methods)]
            let missing: Vec<usize> =
                (0..n_ranks as usize).filter(|&r| !state.joined[r] && r != rank as usize).collect();
            return Err(hccl_error(
                call,
                HCCL_E_TIMEOUT,
                format!("ranks {missing:?} did not join within {timeout:?} (HCCL_CONNECT_TIMEOUT)"),
            ));
        }
        state = group.arrived.wait_timeout(state, deadline - now).unwrap_or_else(|p| p.into_inner()).0;
    }
    drop(state);
    Ok(Rank { group, rank })
}

/// The contiguous elements of a host tensor (empty for a device tensor), copied.
fn elements(t: &Tensor) -> Result<Elements> {
    fn copy<T: Copy>(s: &[T], offset: usize, n: usize) -> Result<Vec<T>> {
        let mut v = Vec::new();
        v.try_reserve_exact(n).map_err(|_| Error::HostAlloc { bytes: n.saturating_mul(std::mem::size_of::<T>()) })?;
        v.extend_from_slice(s.get(offset..offset + n).unwrap_or_default());
        Ok(v)
    }
    let (offset, n) = (t.offset(), t.numel());
    Ok(match &t.storage {
        Storage::Host(h) => match h.as_slice_ref() {
            SliceRef::F32(s) => Elements::F32(copy(s, offset, n)?),
            SliceRef::F16(s) => Elements::F16(copy(s, offset, n)?),
            SliceRef::BF16(s) => Elements::BF16(copy(s, offset, n)?),
            SliceRef::I32(s) => Elements::I32(copy(s, offset, n)?),
        },
        Storage::Device(_) => Elements::F32(Vec::new()),
    })
}

/// What a rank brings to an all-reduce: floats widened exactly to f64, i32 as they are.
fn reduce_input(t: &Tensor) -> Result<Payload> {
    fn widen<T: Copy>(v: &[T], f: impl Fn(T) -> f64) -> Result<Vec<f64>> {
        let mut out = Vec::new();
        out.try_reserve_exact(v.len()).map_err(|_| Error::HostAlloc { bytes: v.len().saturating_mul(8) })?;
        out.extend(v.iter().map(|&x| f(x)));
        Ok(out)
    }
    Ok(match elements(t)? {
        Elements::F32(v) => Payload::Float(widen(&v, f64::from)?),
        Elements::F16(v) => Payload::Float(widen(&v, f16::to_f64)?),
        Elements::BF16(v) => Payload::Float(widen(&v, bf16::to_f64)?),
        Elements::I32(v) => Payload::Int(v),
    })
}

/// Writes `out` into a contiguous host tensor from its offset: floats rounded once to the
/// tensor's dtype, i32 and copied elements as they are (the dtypes were matched by the caller's
/// checks and the ranks' signatures).
fn store(t: &mut Tensor, out: &Payload) {
    fn put<T: Copy, U: Copy>(dst: &mut [T], offset: usize, src: &[U], f: impl Fn(U) -> T) {
        if let Some(d) = dst.get_mut(offset..offset + src.len()) {
            d.iter_mut().zip(src).for_each(|(d, &s)| *d = f(s));
        }
    }
    let offset = t.offset();
    let Storage::Host(h) = &mut t.storage else { return };
    match (h.as_slice_mut(), out) {
        (SliceMut::F32(d), Payload::Float(v)) => put(d, offset, v, |x| x as f32),
        (SliceMut::F16(d), Payload::Float(v)) => put(d, offset, v, f16::from_f64),
        (SliceMut::BF16(d), Payload::Float(v)) => put(d, offset, v, bf16::from_f64),
        (SliceMut::I32(d), Payload::Int(v)) => put(d, offset, v, |x| x),
        (SliceMut::F32(d), Payload::Bits(Elements::F32(v))) => put(d, offset, v, |x| x),
        (SliceMut::F16(d), Payload::Bits(Elements::F16(v))) => put(d, offset, v, |x| x),
        (SliceMut::BF16(d), Payload::Bits(Elements::BF16(v))) => put(d, offset, v, |x| x),
        (SliceMut::I32(d), Payload::Bits(Elements::I32(v))) => put(d, offset, v, |x| x),
        _ => {}
    }
}

fn combine(op: ReduceOp, a: f64, b: f64) -> f64 {
    match op {
        ReduceOp::Sum => a + b,
        ReduceOp::Prod => a * b,
        _ if a.is_nan() || b.is_nan() => f64::NAN,
        ReduceOp::Max => a.max(b),
        ReduceOp::Min => a.min(b),
    }
}

fn combine_i32(op: ReduceOp, a: i32, b: i32) -> i32 {
    match op {
        ReduceOp::Sum => a.wrapping_add(b),
        ReduceOp::Prod => a.wrapping_mul(b),
        ReduceOp::Max => a.max(b),
        ReduceOp::Min => a.min(b),
    }
}

/// Reduces the ranks' contributions in rank order: rank 0's values, combined with rank 1's,
/// then rank 2's, ... (as HCCL's reduction starts from the first rank; no `Sum` identity).
fn reduce(op: ReduceOp, inputs: Vec<Payload>) -> Payload {
    let mut inputs = inputs.into_iter();
    let Some(first) = inputs.next() else { return Payload::Float(Vec::new()) };
    inputs.fold(first, |acc, other| match (acc, other) {
        (Payload::Float(mut a), Payload::Float(b)) => {
            a.iter_mut().zip(&b).for_each(|(x, &y)| *x = combine(op, *x, y));
            Payload::Float(a)
        }
        (Payload::Int(mut a), Payload::Int(b)) => {
            a.iter_mut().zip(&b).for_each(|(x, &y)| *x = combine_i32(op, *x, y));
            Payload::Int(a)
        }
        (acc, _) => acc, // the signatures matched: the same dtype on every rank
    })
}

/// The ranks' elements one after the other (rank-major), bit for bit.
fn concat(inputs: Vec<Payload>) -> Result<Payload> {
    fn join<T: Copy>(parts: &[&Vec<T>]) -> Result<Vec<T>> {
        let n = parts.iter().map(|p| p.len()).fold(0usize, usize::saturating_add);
        let mut v = Vec::new();
        v.try_reserve_exact(n).map_err(|_| Error::HostAlloc { bytes: n.saturating_mul(std::mem::size_of::<T>()) })?;
        parts.iter().for_each(|p| v.extend_from_slice(p));
        Ok(v)
    }
    macro_rules! gather {
        ($variant:ident) => {{
            // bounded: one reference per rank's payload, already in memory (`inputs`).
            #[allow(clippy::disallowed_methods)]
            let parts: Vec<_> = inputs
                .iter()
                .filter_map(|p| if let Payload::Bits(Elements::$variant(v)) = p { Some(v) } else { None })
                .collect();
            Elements::$variant(join(&parts)?)
        }};
    }
    Ok(Payload::Bits(match inputs.first() {
        Some(Payload::Bits(Elements::F16(_))) => gather!(F16),
        Some(Payload::Bits(Elements::BF16(_))) => gather!(BF16),
        Some(Payload::Bits(Elements::I32(_))) => gather!(I32),
        _ => gather!(F32),
    }))
}

impl Rank {
    pub(super) fn all_reduce(&self, t: &mut Tensor, op: ReduceOp) -> Result<()> {
        let sig = Signature { kind: Kind::AllReduce(op), dtype: t.dtype(), count: t.numel() };
        let out = self.collective(sig, reduce_input(t)?)?;
        store(t, &out);
        Ok(())
    }

    pub(super) fn all_gather(&self, input: &Tensor, output: &mut Tensor) -> Result<()> {
        let sig = Signature { kind: Kind::AllGather, dtype: input.dtype(), count: input.numel() };
        let out = self.collective(sig, Payload::Bits(elements(input)?))?;
        store(output, &out);
        Ok(())
    }

    pub(super) fn broadcast(&self, t: &mut Tensor, root: u32) -> Result<()> {
        let sig = Signature { kind: Kind::Broadcast(root), dtype: t.dtype(), count: t.numel() };
        let input = if self.rank == root { elements(t)? } else { Elements::F32(Vec::new()) };
        let out = self.collective(sig, Payload::Bits(input))?;
        store(t, &out);
        Ok(())
    }

    /// Brings this rank's n-th collective and returns its output once every rank has come.
    fn collective(&self, sig: Signature, input: Payload) -> Result<Arc<Payload>> {
        let g = &*self.group;
        let (size, me) = (g.size as usize, self.rank as usize);
        let mut state = g.lock();
        if let Some((result, why)) = &state.broken {
            return Err(hccl_error(sig.call(), *result, format!("the group failed earlier: {why}")));
        }
        let seq = state.next[me];
        // The slot's table, made by the first rank to arrive (fallibly: `size` is the caller's).
        let inputs = if state.slots.contains_key(&seq) { Vec::new() } else { try_vec(size, None)? };
        state.next[me] += 1;
        let slot = state.slots.entry(seq).or_insert_with(|| Slot {
            signature: sig,
            inputs,
            arrived: 0,
            output: None,
            taken: 0,
        });
        if slot.signature != sig {
            let why = format!(
                "collective #{seq}: rank {me} issued {:?} but another rank issued {:?}; every rank must issue \
                 the same collectives in the same order",
                sig, slot.signature
            );
            g.break_group(&mut state, HCCL_E_PARA, why.clone());
            return Err(hccl_error(sig.call(), HCCL_E_PARA, why));
        }
        slot.inputs[me] = Some(input);
        slot.arrived += 1;
        if slot.arrived == g.size {
            // bounded: moves the slot's table (one entry per rank, already in memory) out.
            #[allow(clippy::disallowed_methods)]
            let mut inputs: Vec<Payload> =
                slot.inputs.iter_mut().map(|i| i.take().unwrap_or(Payload::Float(Vec::new()))).collect();
            let output = match sig.kind {
                Kind::AllReduce(op) => Ok(reduce(op, inputs)),
                Kind::AllGather => concat(inputs),
                Kind::Broadcast(root) => Ok(inputs.swap_remove(root as usize)),
            };
            let output = match output {
                Ok(o) => o,
                Err(e) => {
                    let why = format!("collective #{seq} ({}): {e}", sig.call());
                    g.break_group(&mut state, HCCL_E_INTERNAL, why.clone());
                    return Err(hccl_error(sig.call(), HCCL_E_INTERNAL, why));
                }
            };
            slot.output = Some(Arc::new(output));
            g.arrived.notify_all();
        }
        let deadline = deadline_after(g.timeout);
        loop {
            if let Some(slot) = state.slots.get_mut(&seq) {
                if let Some(out) = slot.output.clone() {
                    slot.taken += 1;
                    if slot.taken == g.size {
                        state.slots.remove(&seq);
                    }
                    return Ok(out);
                }
            }
            if let Some((result, why)) = &state.broken {
                return Err(hccl_error(sig.call(), *result, why.clone()));
            }
            let now = Instant::now();
            if now >= deadline {
                // bounded: size is the group's, <= MAX_RANKS (4096), checked when it was made.
                #[allow(clippy::disallowed_methods)]
                let missing: Vec<usize> = match state.slots.get(&seq) {
                    Some(s) => (0..size).filter(|&r| s.inputs[r].is_none()).collect(),
                    None => Vec::new(),
                };
                let why = format!(
                    "collective #{seq} ({}): ranks {missing:?} did not arrive within {:?} (HCCL_CONNECT_TIMEOUT)",
                    sig.call(),
                    g.timeout
                );
                g.break_group(&mut state, HCCL_E_TIMEOUT, why.clone());
                return Err(hccl_error(sig.call(), HCCL_E_TIMEOUT, why));
            }
            state = g.arrived.wait_timeout(state, deadline - now).unwrap_or_else(|p| p.into_inner()).0;
        }
    }
}

impl Drop for Rank {
    fn drop(&mut self) {
        // The rank will never bring another collective: ranks waiting for it, or calling one
        // later, fail at once instead of waiting for the timeout. (Collectives every rank has
        // brought already complete: their output is taken before the group's state is looked at.)
        let mut state = self.group.lock();
        let why = format!("rank {} of the group was dropped", self.rank);
        self.group.break_group(&mut state, HCCL_E_INTERNAL, why);
    }
}
