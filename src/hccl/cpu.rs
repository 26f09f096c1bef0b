//! The CPU engine: the ranks are threads of this process and meet in memory.
//!
//! Each collective is a rendezvous: rank r's n-th collective waits in slot n until every rank has
//! brought its n-th collective, which must be the same kind with the same count, dtype and op
//! (or root). The last rank to arrive computes the result, in f64 and in rank order, so every
//! rank receives the same values; each rounds them once to its tensor's dtype. A mismatch or a
//! rank that does not arrive within the timeout fails the collective on every rank and breaks
//! the group: later collectives fail at once (as a real communicator would have to be rebuilt).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use super::{hccl_error, ReduceOp, ROOT_INFO_BYTES};
use crate::dtype::DType;
use crate::error::Result;
use crate::tensor::Tensor;

/// The first bytes of a CPU root info.
const MAGIC: &[u8; 8] = b"ASCNDCPU";

/// HcclResult values the engine reports (the bound enum's, so both engines report the same).
const HCCL_E_PARA: u32 = ascend_sys::HcclResult::HCCL_E_PARA.0;
const HCCL_E_TIMEOUT: u32 = ascend_sys::HcclResult::HCCL_E_TIMEOUT.0;
const HCCL_E_INTERNAL: u32 = ascend_sys::HcclResult::HCCL_E_INTERNAL.0;

pub(super) fn is_cpu_root(bytes: &[u8; ROOT_INFO_BYTES]) -> bool {
    bytes.starts_with(MAGIC)
}

/// A root info naming a new in-process group: magic, process id, group id.
pub(super) fn new_root() -> Box<[u8; ROOT_INFO_BYTES]> {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let mut b = Box::new([0u8; ROOT_INFO_BYTES]);
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

struct Slot {
    signature: Signature,
    inputs: Vec<Option<Vec<f64>>>,
    arrived: u32,
    output: Option<Arc<Vec<f64>>>,
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
    fn new(size: u32, timeout: Duration) -> Arc<Group> {
        let n = size as usize;
        Arc::new(Group {
            size,
            state: Mutex::new(State { joined: vec![false; n], next: vec![0; n], slots: HashMap::new(), broken: None }),
            arrived: Condvar::new(),
            timeout,
        })
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
pub(super) fn init_all(size: u32) -> Vec<Rank> {
    let group = Group::new(size, super::connect_timeout());
    group.lock().joined.iter_mut().for_each(|j| *j = true);
    (0..size).map(|rank| Rank { group: group.clone(), rank }).collect()
}

/// Groups being joined through a root info, by group id.
static JOINING: Mutex<Vec<(u64, Weak<Group>)>> = Mutex::new(Vec::new());

/// Rank `rank` of the group `root` names: waits until all `n_ranks` have joined.
pub(super) fn init_rank(root: &[u8; ROOT_INFO_BYTES], n_ranks: u32, rank: u32, timeout: Duration) -> Result<Rank> {
    let call = "HcclCommInitRootInfo";
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
                let g = Group::new(n_ranks, timeout);
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
    let deadline = Instant::now() + timeout;
    while !state.joined.iter().all(|&j| j) {
        let now = Instant::now();
        if now >= deadline {
            state.joined[rank as usize] = false;
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

/// The elements of a contiguous host tensor, exactly, as f64.
fn values(t: &Tensor) -> Result<Vec<f64>> {
    let mut v = Vec::new();
    v.try_reserve_exact(t.numel()).map_err(|_| crate::Error::HostAlloc { bytes: t.numel().saturating_mul(8) })?;
    if let Some(view) = t.as_host_view() {
        view.for_each_f32(|x| v.push(f64::from(x)));
    }
    Ok(v)
}

/// Writes `v` (rounded once to the tensor's dtype) into a contiguous host tensor.
fn store(t: &mut Tensor, v: &[f64]) {
    let offset = t.offset();
    if let Some(mut view) = t.as_host_view_mut() {
        for (i, &x) in v.iter().enumerate() {
            view.set_f64(offset + i, x);
        }
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

impl Rank {
    pub(super) fn all_reduce(&self, t: &mut Tensor, op: ReduceOp) -> Result<()> {
        let sig = Signature { kind: Kind::AllReduce(op), dtype: t.dtype(), count: t.numel() };
        let out = self.collective(sig, values(t)?)?;
        store(t, &out);
        Ok(())
    }

    pub(super) fn all_gather(&self, input: &Tensor, output: &mut Tensor) -> Result<()> {
        let sig = Signature { kind: Kind::AllGather, dtype: input.dtype(), count: input.numel() };
        let out = self.collective(sig, values(input)?)?;
        store(output, &out);
        Ok(())
    }

    pub(super) fn broadcast(&self, t: &mut Tensor, root: u32) -> Result<()> {
        let sig = Signature { kind: Kind::Broadcast(root), dtype: t.dtype(), count: t.numel() };
        let input = if self.rank == root { values(t)? } else { Vec::new() };
        let out = self.collective(sig, input)?;
        store(t, &out);
        Ok(())
    }

    /// Brings this rank's n-th collective and returns its output once every rank has come.
    fn collective(&self, sig: Signature, input: Vec<f64>) -> Result<Arc<Vec<f64>>> {
        let g = &*self.group;
        let (size, me) = (g.size as usize, self.rank as usize);
        let mut state = g.lock();
        if let Some((result, why)) = &state.broken {
            return Err(hccl_error(sig.call(), *result, format!("the group failed earlier: {why}")));
        }
        let seq = state.next[me];
        state.next[me] += 1;
        let slot = state.slots.entry(seq).or_insert_with(|| Slot {
            signature: sig,
            inputs: vec![None; size],
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
            let inputs: Vec<Vec<f64>> = slot.inputs.iter_mut().map(|i| i.take().unwrap_or_default()).collect();
            let output = match sig.kind {
                Kind::AllReduce(op) => {
                    let mut acc = inputs[0].clone();
                    for other in &inputs[1..] {
                        for (a, &b) in acc.iter_mut().zip(other) {
                            *a = combine(op, *a, b);
                        }
                    }
                    acc
                }
                Kind::AllGather => inputs.concat(),
                Kind::Broadcast(root) => inputs[root as usize].clone(),
            };
            slot.output = Some(Arc::new(output));
            g.arrived.notify_all();
        }
        let deadline = Instant::now() + g.timeout;
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
