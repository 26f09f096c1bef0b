//! The CPU engine: the ranks are threads of this process and meet in memory.
//!
//! Each collective is a rendezvous: rank r's n-th collective waits in a slot until every rank has
//! brought its n-th collective, which must be the same kind with the same count, dtype and op
//! (or root). The last rank to arrive computes the result, so every rank receives the same bits:
//! float reductions in f64 in rank order, rounded once to the dtype; i32 reductions in wrapping
//! i32 arithmetic, as HCCL's; all-gather and broadcast copy the elements bit for bit. A mismatch
//! or a rank that does not arrive within the timeout fails the collective on every rank and
//! breaks the group: later collectives fail at once (as a real communicator would have to be
//! rebuilt).
//!
//! The group keeps its buffers from one collective to the next (each rank's contribution buffer,
//! two slots' tables and results; a buffer over 16 MiB is released after its collective), so a
//! steady loop of collectives makes no heap allocation.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use super::{hccl_error, ReduceOp, HCCL_ROOT_BYTES};
use crate::cpu::host::{try_collect, try_vec};
use crate::dtype::{bf16, bf16_from_f64, f16, f16_from_f64, DType, SliceMut, SliceRef};
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

/// Elements as the engine carries them, one f64 each and exact for every dtype: a float to
/// reduce widened to f64, an i32 as its value, and a float to copy (all-gather, broadcast) as its
/// bit pattern (a u16 or u32, which an f64 holds exactly). The collective's kind and dtype say
/// which ([`load`], [`store`]). One representation for every collective lets any buffer serve
/// any of them: the buffers are kept and reused, so a steady loop of collectives makes no heap
/// allocation.
type Buffer = Vec<f64>;

/// A buffer holding more than this many bytes goes back to the system after its collective
/// instead of being kept for the next one (a one-off huge message does not pin its memory).
const KEEP_BYTES: usize = 16 << 20;

/// Whether `b`'s memory is over [`KEEP_BYTES`] (released after its collective, not kept).
fn oversized(b: &Buffer) -> bool {
    b.capacity().saturating_mul(std::mem::size_of::<f64>()) > KEEP_BYTES
}

/// Empties `b` for reuse, releasing its memory when it is [`oversized`].
fn recycle(b: &mut Buffer) {
    b.clear();
    if oversized(b) {
        *b = Vec::new();
    }
}

/// Room for `n` more elements in `b`, or [`Error::HostAlloc`] (`n` derives from a caller's count).
fn reserve(b: &mut Buffer, n: usize) -> Result<()> {
    b.try_reserve_exact(n).map_err(|_| Error::HostAlloc { bytes: n.saturating_mul(std::mem::size_of::<f64>()) })
}

/// One collective while the ranks bring it and take its result; then free, its tables and
/// result buffer kept for a later collective.
struct Slot {
    /// The collective number it holds; `None` when free.
    seq: Option<u64>,
    signature: Signature,
    /// Each rank's contribution: a rank lends its filled buffer here when it comes and takes it
    /// back with the result (an empty vector stands in meanwhile).
    inputs: Vec<Buffer>,
    /// Which ranks have brought theirs.
    brought: Vec<bool>,
    arrived: u32,
    /// The result, once `ready`. The ranks copy it out after unlocking, each through a clone of
    /// the `Arc` (a count, no allocation) that it drops before its collective returns. The
    /// slot's next collective completes only after every rank has returned from this one, so
    /// its last rank finds the buffer unshared and refills it in place.
    output: Arc<Buffer>,
    ready: bool,
    taken: u32,
}

impl Slot {
    /// A free slot for ranks `0..size` (fallibly: `size` is the caller's).
    fn new(size: usize) -> Result<Slot> {
        let signature = Signature { kind: Kind::AllGather, dtype: DType::F32, count: 0 };
        Ok(Slot {
            seq: None,
            signature,
            inputs: try_vec(size, Vec::new())?,
            brought: try_vec(size, false)?,
            arrived: 0,
            output: Arc::default(),
            ready: false,
            taken: 0,
        })
    }

    /// Takes collective `seq` of signature `signature`, which no rank has brought yet.
    fn start(&mut self, seq: u64, signature: Signature) {
        self.seq = Some(seq);
        self.signature = signature;
        self.brought.iter_mut().for_each(|b| *b = false);
        (self.arrived, self.ready, self.taken) = (0, false, 0);
    }

    /// Every rank has taken the result: the slot is free, its buffer kept (up to
    /// [`KEEP_BYTES`]).
    fn finish(&mut self) {
        self.seq = None;
        if oversized(&self.output) {
            // Ranks may still be copying out of it: the last of them frees it.
            self.output = Arc::default();
        }
    }
}

/// How many collectives can be under way at a time: a rank brings collective n + 1 only after
/// taking n's result, and n + 1 completes only once every rank has brought it (so has taken
/// n's): when any rank brings n + 2, n's slot is free. Collective n takes slot n % 2, so a
/// steady loop puts the same collectives in the same slots, whose buffers then fit already.
const SLOTS: usize = 2;

struct State {
    /// Ranks that have joined (for `init_rank`).
    joined: Vec<bool>,
    /// Each rank's next collective number.
    next: Vec<u64>,
    /// Collective n's slot is `slots[n % SLOTS]`.
    slots: [Slot; SLOTS],
    /// Why the group failed, if it did.
    broken: Option<(u32, String)>,
}

impl State {
    /// Collective `seq`'s slot (started for it by the first rank to come).
    fn slot(&mut self, seq: u64) -> &mut Slot {
        &mut self.slots[(seq % SLOTS as u64) as usize]
    }

    /// Collective `seq`'s slot if it holds it.
    fn holding(&mut self, seq: u64) -> Option<&mut Slot> {
        Some(self.slot(seq)).filter(|s| s.seq == Some(seq))
    }
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
        let slots = [Slot::new(n)?, Slot::new(n)?];
        let state = State { joined: try_vec(n, false)?, next: try_vec(n, 0)?, slots, broken: None };
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

    /// [`break_group`](Self::break_group), and the error of `call` (failing with `result`,
    /// because of `why`) for the rank that found the fault.
    fn fail(&self, state: &mut State, call: &'static str, result: u32, why: String) -> Error {
        self.break_group(state, result, why.clone());
        hccl_error(call, result, why)
    }
}

/// One rank of a CPU group.
pub(super) struct Rank {
    group: Arc<Group>,
    rank: u32,
    /// The buffer this rank fills with its next contribution before locking the group (a
    /// `Cell`: one thread drives a rank).
    spare: Cell<Buffer>,
}

/// `size` ranks of a new group (every rank joined).
pub(super) fn init_all(size: u32, timeout: Duration) -> Result<Vec<Rank>> {
    check_rank_count("HcclCommInitAll", size)?;
    let group = Group::new(size, timeout)?;
    group.lock().joined.iter_mut().for_each(|j| *j = true);
    // bounded: size <= MAX_RANKS (4096), checked at the top.
    #[allow(clippy::disallowed_methods)]
    let ranks = (0..size).map(|rank| Rank::new(group.clone(), rank)).collect();
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
    Ok(Rank::new(group, rank))
}

/// Fills `b` with the elements of a contiguous host tensor (none for a device tensor) as a
/// [`Buffer`] carries them: floats widened to f64 when `wide` (an all-reduce), else their bits;
/// i32 as they are.
fn load(t: &Tensor, wide: bool, b: &mut Buffer) -> Result<()> {
    fn fill<T: Copy>(b: &mut Buffer, s: &[T], [offset, n]: [usize; 2], f: impl Fn(T) -> f64) -> Result<()> {
        let s = s.get(offset..offset + n).unwrap_or_default();
        reserve(b, s.len())?;
        b.extend(s.iter().map(|&x| f(x)));
        Ok(())
    }
    b.clear();
    let at = [t.offset(), t.numel()];
    let Storage::Host(h) = &t.storage else { return Ok(()) };
    match h.as_slice_ref() {
        SliceRef::F32(s) if wide => fill(b, s, at, f64::from),
        SliceRef::F32(s) => fill(b, s, at, |x| f64::from(x.to_bits())),
        SliceRef::F16(s) if wide => fill(b, s, at, f16::to_f64),
        SliceRef::F16(s) => fill(b, s, at, |x| f64::from(x.to_bits())),
        SliceRef::BF16(s) if wide => fill(b, s, at, bf16::to_f64),
        SliceRef::BF16(s) => fill(b, s, at, |x| f64::from(x.to_bits())),
        SliceRef::I32(s) => fill(b, s, at, f64::from),
    }
}

/// Writes `out` into a contiguous host tensor from its offset, [`load`]'s inverse: reduced floats
/// (`wide`) rounded once to the tensor's dtype, bits and i32 as they are (the dtypes were matched
/// by the caller's checks and the ranks' signatures).
fn store(t: &mut Tensor, wide: bool, out: &[f64]) {
    fn put<T>(dst: &mut [T], offset: usize, src: &[f64], f: impl Fn(f64) -> T) {
        if let Some(d) = dst.get_mut(offset..offset + src.len()) {
            d.iter_mut().zip(src).for_each(|(d, &s)| *d = f(s));
        }
    }
    let offset = t.offset();
    let Storage::Host(h) = &mut t.storage else { return };
    match h.as_slice_mut() {
        SliceMut::F32(d) if wide => put(d, offset, out, |x| x as f32),
        SliceMut::F32(d) => put(d, offset, out, |x| f32::from_bits(x as u32)),
        SliceMut::F16(d) if wide => put(d, offset, out, f16_from_f64),
        SliceMut::F16(d) => put(d, offset, out, |x| f16::from_bits(x as u16)),
        SliceMut::BF16(d) if wide => put(d, offset, out, bf16_from_f64),
        SliceMut::BF16(d) => put(d, offset, out, |x| bf16::from_bits(x as u16)),
        SliceMut::I32(d) => put(d, offset, out, |x| x as i32),
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

/// The result of collective `sig` over the ranks' `inputs`, into `out`: an all-reduce combines
/// them in rank order (rank 0's values with rank 1's, then rank 2's, ..., as HCCL's reduction
/// starts from the first rank; no `Sum` identity), an all-gather puts them one after the other
/// (rank-major), a broadcast copies the root's.
fn compute(sig: Signature, inputs: &[Buffer], out: &mut Buffer) -> Result<()> {
    out.clear();
    match sig.kind {
        Kind::AllReduce(op) => {
            let Some((first, rest)) = inputs.split_first() else { return Ok(()) };
            reserve(out, first.len())?;
            out.extend_from_slice(first);
            for other in rest {
                let pairs = out.iter_mut().zip(other);
                if sig.dtype == DType::I32 {
                    // i32 values, exact in f64: wrapping i32 arithmetic, as HCCL's.
                    pairs.for_each(|(x, &y)| *x = f64::from(combine_i32(op, *x as i32, y as i32)));
                } else {
                    pairs.for_each(|(x, &y)| *x = combine(op, *x, y));
                }
            }
        }
        Kind::AllGather => {
            reserve(out, inputs.iter().map(Vec::len).fold(0usize, usize::saturating_add))?;
            inputs.iter().for_each(|i| out.extend_from_slice(i));
        }
        Kind::Broadcast(root) => {
            let root = inputs.get(root as usize).map_or(&[][..], Vec::as_slice);
            reserve(out, root.len())?;
            out.extend_from_slice(root);
        }
    }
    Ok(())
}

impl Rank {
    fn new(group: Arc<Group>, rank: u32) -> Rank {
        Rank { group, rank, spare: Cell::new(Vec::new()) }
    }

    pub(super) fn all_reduce(&self, t: &mut Tensor, op: ReduceOp) -> Result<()> {
        let sig = Signature { kind: Kind::AllReduce(op), dtype: t.dtype(), count: t.numel() };
        let out = self.collective(sig, |b| load(t, true, b))?;
        store(t, true, &out);
        Ok(())
    }

    pub(super) fn all_gather(&self, input: &Tensor, output: &mut Tensor) -> Result<()> {
        let sig = Signature { kind: Kind::AllGather, dtype: input.dtype(), count: input.numel() };
        let out = self.collective(sig, |b| load(input, false, b))?;
        store(output, false, &out);
        Ok(())
    }

    pub(super) fn broadcast(&self, t: &mut Tensor, root: u32) -> Result<()> {
        let sig = Signature { kind: Kind::Broadcast(root), dtype: t.dtype(), count: t.numel() };
        let me = self.rank == root;
        let out = self.collective(sig, |b| {
            b.clear();
            if me {
                load(t, false, b)?;
            }
            Ok(())
        })?;
        store(t, false, &out);
        Ok(())
    }

    /// Brings this rank's n-th collective, its contribution written by `input` into this rank's
    /// spare buffer before the group is locked, and returns the result once every rank has
    /// come. The caller copies the result out and drops it before returning.
    fn collective(&self, sig: Signature, input: impl FnOnce(&mut Buffer) -> Result<()>) -> Result<Arc<Buffer>> {
        let mut mine = self.spare.take();
        let out = input(&mut mine).and_then(|()| self.exchange(sig, &mut mine));
        // Taken back from the slot (an empty stand-in if the collective failed on the way).
        recycle(&mut mine);
        self.spare.set(mine);
        out
    }

    /// [`collective`](Self::collective) under the group's lock: lends `mine` to the slot of this
    /// rank's n-th collective, computes the result when the last rank comes, waits for it, and
    /// takes `mine` back with it.
    fn exchange(&self, sig: Signature, mine: &mut Buffer) -> Result<Arc<Buffer>> {
        let g = &*self.group;
        let (size, me) = (g.size as usize, self.rank as usize);
        let mut state = g.lock();
        if let Some((result, why)) = &state.broken {
            return Err(hccl_error(sig.call(), *result, format!("the group failed earlier: {why}")));
        }
        let seq = state.next[me];
        let slot = state.slot(seq);
        match slot.seq {
            None => slot.start(seq, sig),
            Some(s) if s == seq => {}
            Some(s) => {
                // Impossible (see `SLOTS`): fail rather than mix two collectives.
                let why = format!("collective #{seq} ({}) found collective #{s} under way in its slot", sig.call());
                return Err(g.fail(&mut state, sig.call(), HCCL_E_INTERNAL, why));
            }
        }
        state.next[me] += 1;
        let slot = state.slot(seq);
        if slot.signature != sig {
            let why = format!(
                "collective #{seq}: rank {me} issued {:?} but another rank issued {:?}; every rank must issue \
                 the same collectives in the same order",
                sig, slot.signature
            );
            return Err(g.fail(&mut state, sig.call(), HCCL_E_PARA, why));
        }
        std::mem::swap(&mut slot.inputs[me], mine);
        slot.brought[me] = true;
        slot.arrived += 1;
        if slot.arrived == g.size {
            if Arc::get_mut(&mut slot.output).is_none() {
                // Still shared (see `Slot::output`: not in a steady loop): a new buffer.
                slot.output = Arc::default();
            }
            let computed = match Arc::get_mut(&mut slot.output) {
                Some(out) => compute(sig, &slot.inputs, out),
                None => Err(Error::internal("a new collective buffer is shared")),
            };
            if let Err(e) = computed {
                let why = format!("collective #{seq} ({}): {e}", sig.call());
                return Err(g.fail(&mut state, sig.call(), HCCL_E_INTERNAL, why));
            }
            slot.ready = true;
            g.arrived.notify_all();
        }
        let deadline = deadline_after(g.timeout);
        loop {
            if let Some(slot) = state.holding(seq).filter(|s| s.ready) {
                std::mem::swap(&mut slot.inputs[me], mine);
                let out = slot.output.clone();
                slot.taken += 1;
                if slot.taken == g.size {
                    slot.finish();
                }
                return Ok(out);
            }
            if let Some((result, why)) = &state.broken {
                return Err(hccl_error(sig.call(), *result, why.clone()));
            }
            let now = Instant::now();
            if now >= deadline {
                let missing = match state.holding(seq) {
                    Some(s) => try_collect(size, (0..size).filter(|&r| !s.brought[r])).unwrap_or_default(),
                    None => Vec::new(),
                };
                let why = format!(
                    "collective #{seq} ({}): ranks {missing:?} did not arrive within {:?} (HCCL_CONNECT_TIMEOUT)",
                    sig.call(),
                    g.timeout
                );
                return Err(g.fail(&mut state, sig.call(), HCCL_E_TIMEOUT, why));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::Context;
    use crate::dtype::Element;
    use crate::stream::Stream;

    fn tensor<T: Element>(s: &Stream, v: &[T]) -> Tensor {
        Tensor::from_slice(s, v, &[v.len()]).unwrap()
    }

    /// A float all-reduce is rounded once from its f64 result: 1 + 2^-11 + 2^-24 (three f16
    /// ranks) lies just above the tie between 1 and 1 + 2^-10, so it rounds up; rounding after
    /// dropping the low bits (half's `from_f64`) would see the tie and round to even (1). The same
    /// for bf16 with 1 + 2^-8 + 2^-40.
    #[test]
    fn float_sums_are_rounded_once() {
        fn sum<T: Element>(values: [f64; 3]) -> T {
            let ranks = init_all(3, Duration::from_secs(600)).unwrap();
            let got: Vec<T> = std::thread::scope(|scope| {
                let threads: Vec<_> = ranks
                    .into_iter()
                    .zip(values)
                    .map(|(rank, v)| {
                        scope.spawn(move || {
                            let s = Context::cpu().new_stream().unwrap();
                            let mut t = tensor(&s, &[T::from_f64(v)]);
                            rank.all_reduce(&mut t, ReduceOp::Sum).unwrap();
                            let out = t.to_vec::<T>(&s).unwrap()[0];
                            drop(rank);
                            out
                        })
                    })
                    .collect();
                threads.into_iter().map(|t| t.join().unwrap()).collect()
            });
            assert!(got.iter().all(|g| *g == got[0]), "every rank gets the same bits");
            got[0]
        }
        let tie = |bits: i32| 2f64.powi(-bits);
        assert_eq!(sum::<f16>([1.0, tie(11), tie(24)]), f16::from_f64_const(1.0 + tie(10)));
        assert_eq!(sum::<bf16>([1.0, tie(8), tie(40)]), bf16::from_f64_const(1.0 + tie(7)));
    }

    /// One group runs collectives of changing kinds, dtypes and sizes (growing and shrinking,
    /// one over [`KEEP_BYTES`]) through the same slots and buffers: every rank gets the exact
    /// result each time, bits copied as they are, and the oversized buffers are not kept.
    #[test]
    fn reused_buffers_give_exact_results_and_huge_ones_are_released() {
        const RANKS: u32 = 3;
        let big = KEEP_BYTES / 8 + 1;
        let sizes = [5, 300, 1, 64, big, 7, 300];
        let ranks = init_all(RANKS, Duration::from_secs(600)).unwrap();
        let group = ranks[0].group.clone();
        let ranks: Vec<Rank> = std::thread::scope(|scope| {
            let threads: Vec<_> = ranks
                .into_iter()
                .map(|rank| {
                    let sizes = &sizes;
                    scope.spawn(move || {
                        let s = Context::cpu().new_stream().unwrap();
                        let r = rank.rank;
                        for (step, &n) in sizes.iter().enumerate() {
                            let value = |q: u32, i: usize| (q as usize * 1000 + i + step) as f32;
                            // f32 sum: exact in f32 for these values.
                            let mut t = tensor(&s, &(0..n).map(|i| value(r, i)).collect::<Vec<_>>());
                            rank.all_reduce(&mut t, ReduceOp::Sum).unwrap();
                            let want: Vec<f32> = (0..n).map(|i| (0..RANKS).map(|q| value(q, i)).sum()).collect();
                            assert_eq!(t.to_vec::<f32>(&s).unwrap(), want, "step {step}: sum");
                            // i32 wrapping product.
                            let k = n.min(50);
                            let int = |q: u32, i: usize| (q as i32 + 2) * 65_537 + i as i32;
                            let mut t = tensor(&s, &(0..k).map(|i| int(r, i)).collect::<Vec<_>>());
                            rank.all_reduce(&mut t, ReduceOp::Prod).unwrap();
                            let want: Vec<i32> =
                                (0..k).map(|i| (0..RANKS).fold(1i32, |a, q| a.wrapping_mul(int(q, i)))).collect();
                            assert_eq!(t.to_vec::<i32>(&s).unwrap(), want, "step {step}: i32 product");
                            // f16 all-gather of NaN payloads and other bits.
                            let bits =
                                |q: u32, i: usize| f16::from_bits(0x7c01u16.wrapping_add((q as usize * 7 + i) as u16));
                            let input = tensor(&s, &(0..k).map(|i| bits(r, i)).collect::<Vec<_>>());
                            let mut out = Tensor::zeros(&s, DType::F16, &[k * RANKS as usize]).unwrap();
                            rank.all_gather(&input, &mut out).unwrap();
                            let got: Vec<u16> = out.to_vec::<f16>(&s).unwrap().iter().map(|x| x.to_bits()).collect();
                            let want: Vec<u16> =
                                (0..RANKS).flat_map(|q| (0..k).map(move |i| bits(q, i).to_bits())).collect();
                            assert_eq!(got, want, "step {step}: all-gather bits");
                            // bf16 broadcast from a changing root.
                            let root = step as u32 % RANKS;
                            let mut t = tensor(
                                &s,
                                &(0..k).map(|i| bf16::from_bits((r as usize * 100 + i) as u16)).collect::<Vec<_>>(),
                            );
                            rank.broadcast(&mut t, root).unwrap();
                            let got: Vec<u16> = t.to_vec::<bf16>(&s).unwrap().iter().map(|x| x.to_bits()).collect();
                            let want: Vec<u16> = (0..k).map(|i| (root as usize * 100 + i) as u16).collect();
                            assert_eq!(got, want, "step {step}: broadcast");
                        }
                        rank
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect()
        });
        for rank in &ranks {
            let spare = rank.spare.take();
            assert!(spare.capacity() * 8 <= KEEP_BYTES, "rank {} kept {} elements", rank.rank, spare.capacity());
        }
        let state = group.lock();
        for slot in &state.slots {
            assert_eq!(slot.seq, None);
            assert!(slot.output.capacity() * 8 <= KEEP_BYTES, "a slot kept {} elements", slot.output.capacity());
            assert!(slot.inputs.iter().all(|i| i.capacity() == 0), "inputs go back to their ranks");
        }
    }
}
