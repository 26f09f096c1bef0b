//! The launch path's behaviour, which is the same for every operator and so is tested once here
//! and instantiated by each operator's test file with `framework_tests!(TheCase)`:
//!
//! * the two phases: prepare → workspace_size → launch with `None`, with a caller's workspace of
//!   exactly that size, with a larger one reused, and a too-small or empty one refused (161002)
//!   writing nothing;
//! * a prepared call dropped unlaunched writes nothing;
//! * every argument dropped right after the launch, before the queued work ran: the results are
//!   right and the mock counts no violation;
//! * (mock) on each path through the launch cache (off, a miss, a hit), a fault injected at each
//!   CANN call the path makes fails the call with that status (`NullHandle` for
//!   `aclCreateTensor`), naming the call, leaking nothing and writing nothing, in both the
//!   `_into` and the allocating form (and an `aclrtMalloc` fault fails the allocating form),
//!   after which the call works again;
//! * (mock) on each path, a fault at any CANN function the crate binds (but those that destroy or
//!   free, whose failure is a reported leak by design): each call either succeeds with the right
//!   values or fails writing nothing, and the path's own calls do fail;
//! * (mock) executors CANN will not make repeatable: a refusal injected once, and the operator
//!   refused persistently (`ascend::mock::refuse_repeatable`), in every form: the calls are
//!   right, launched uncached, the signature not tried again, nothing leaked.
//!
//! The mock runs are inside `common::mock::isolated` (serialised, then checked for no leaked
//! allocation, descriptor, executor or stream and no violation).
#![allow(dead_code)]

use ascend::ops::{Prepared, Workspace};
use ascend::{Backend, Context, DType, Error, Result, Stream, Tensor};

use super::data::{bits, status_of, Data, INVALID};

/// One operator's call, as the framework tests drive it. Implemented by the operator test file's
/// host case (its inputs as data, which the value checks compare against).
pub trait Framework: Sized {
    /// The operator's aclnn function (`aclnnX`; phase 1 is `aclnnXGetWorkspaceSize`).
    const ACLNN: &'static str;
    /// Whether the mock operator asks for a workspace (then phase 1 reports a size > 0).
    const MOCK_WORKSPACE: bool;
    /// The case's tensors on a stream (inputs and in-place arguments).
    type Up;
    /// The caller-owned outputs of `_into` and prepare.
    type Out;
    /// What the allocating form returns.
    type Res: std::fmt::Debug;

    /// A small all-f32 case; `seed` picks its data.
    fn small(seed: u64) -> Self;
    /// A case in mixed dtypes.
    fn mixed(seed: u64) -> Self;
    fn upload(&self, s: &Stream) -> Result<Self::Up>;
    /// Outputs for `_into`, pre-filled with values no correct call leaves there.
    fn outputs(&self, s: &Stream) -> Result<Self::Out>;
    fn run(&self, up: &mut Self::Up, s: &Stream) -> Result<Self::Res>;
    fn run_into(&self, up: &mut Self::Up, s: &Stream, out: &mut Self::Out) -> Result<()>;
    fn prepare<'a>(&self, up: &'a mut Self::Up, s: &Stream, out: &'a mut Self::Out) -> Result<Prepared<'a>>;
    /// Asserts that `out` holds this case's values (shape, dtype, values within tolerance).
    fn check(&self, ctx: &Context, s: &Stream, what: &str, out: &Self::Out);
    /// Asserts that the allocating form's result holds this case's values.
    fn check_res(&self, ctx: &Context, s: &Stream, what: &str, res: &Self::Res);
    /// The outputs' bits.
    fn out_bits(s: &Stream, out: &Self::Out) -> Vec<Vec<u32>>;
    /// The bits of the arguments a call updates in place (none by default).
    fn in_place_bits(_s: &Stream, _up: &Self::Up) -> Vec<Vec<u32>> {
        Vec::new()
    }
}

/// [`Framework::outputs`] for the operators that write two f32 per-channel vectors (mean and
/// invstd): both `[c]`, pre-filled with 42.
pub fn two_channel_outputs(s: &Stream, c: usize) -> Result<(Tensor, Tensor)> {
    let filled = || Data::filled(DType::F32, &[c], 42.0).tensor(s);
    Ok((filled()?, filled()?))
}

/// Everything a call may write, as bits.
fn written<F: Framework>(s: &Stream, up: &F::Up, out: &F::Out) -> Vec<Vec<u32>> {
    let mut v = F::out_bits(s, out);
    v.extend(F::in_place_bits(s, up));
    v
}

/// prepare → workspace_size → launch, with `None`, with a caller's workspace of exactly that
/// size (same bits), with a larger one reused twice; a too-small or empty workspace is refused
/// with 161002, writing nothing. The CPU asks for no workspace, the mock for one iff
/// `F::MOCK_WORKSPACE`.
pub fn two_phase<F: Framework>(ctx: &Context) -> Result<()> {
    let s = ctx.new_stream()?;
    let case = F::small(100);
    let mut up = case.upload(&s)?;
    let mut a = case.outputs(&s)?;
    let p = case.prepare(&mut up, &s, &mut a)?;
    let size = p.workspace_size();
    match ctx.backend() {
        Backend::Cpu => assert_eq!(size, 0, "the CPU asks for no workspace"),
        _ => assert_eq!(size > 0, F::MOCK_WORKSPACE, "the mock asks for a workspace: {size}"),
    }
    p.launch(&s, None)?;
    case.check(ctx, &s, "launch(None)", &a);

    let mut b = case.outputs(&s)?;
    let p = case.prepare(&mut up, &s, &mut b)?;
    assert_eq!(p.workspace_size(), size, "same call, same workspace size");
    let ws = Workspace::new(&s, size)?;
    assert_eq!(ws.size(), size);
    p.launch(&s, Some(&ws))?;
    assert_eq!(F::out_bits(&s, &a), F::out_bits(&s, &b), "the caller's workspace gives the same bits");

    let big = Workspace::new(&s, size + 4096)?;
    for _ in 0..2 {
        let mut c = case.outputs(&s)?;
        case.prepare(&mut up, &s, &mut c)?.launch(&s, Some(&big))?;
        case.check(ctx, &s, "a larger workspace, reused", &c);
    }
    if size > 0 {
        for small in [Workspace::new(&s, size - 1)?, Workspace::new(&s, 0)?] {
            let mut d = case.outputs(&s)?;
            let before = written::<F>(&s, &up, &d);
            let err = case.prepare(&mut up, &s, &mut d)?.launch(&s, Some(&small)).unwrap_err();
            assert_eq!(err.status(), Some(INVALID), "workspace of {} < {size}: {err}", small.size());
            assert_eq!(written::<F>(&s, &up, &d), before, "a refused launch wrote");
        }
    }
    Ok(())
}

/// A prepared call dropped without launch writes nothing (in-place arguments included).
pub fn prepared_dropped_unlaunched<F: Framework>(ctx: &Context) -> Result<()> {
    let s = ctx.new_stream()?;
    let case = F::small(101);
    let mut up = case.upload(&s)?;
    let mut out = case.outputs(&s)?;
    let before = written::<F>(&s, &up, &out);
    let p = case.prepare(&mut up, &s, &mut out)?;
    let _ = format!("{p:?}");
    drop(p);
    s.synchronize()?;
    assert_eq!(written::<F>(&s, &up, &out), before, "a prepared call dropped unlaunched wrote");
    Ok(())
}

/// Every argument dropped right after the launch, before the queued work ran: the allocating
/// result is right with its inputs gone; the `_into` arguments dropped with the stream kept (then
/// synchronised) and with the stream dropped too.
pub fn arguments_dropped_right_after_the_launch<F: Framework>(ctx: &Context) -> Result<()> {
    let case = F::mixed(121);
    let s = ctx.new_stream()?;
    let mut up = case.upload(&s)?;
    let res = case.run(&mut up, &s)?;
    drop(up);
    case.check_res(ctx, &s, "inputs dropped", &res);

    let mut up = case.upload(&s)?;
    let mut out = case.outputs(&s)?;
    case.run_into(&mut up, &s, &mut out)?;
    drop((up, out));
    s.synchronize()?;

    let s2 = ctx.new_stream()?;
    let mut up = case.upload(&s2)?;
    let mut out = case.outputs(&s2)?;
    case.run_into(&mut up, &s2, &mut out)?;
    drop(up);
    drop(out);
    drop(s2);
    Ok(())
}

/// Empties the launch cache of `s` (its entries destroyed once the stream has drained), keeping
/// its capacity.
#[cfg(feature = "mock")]
pub fn flush_launch_cache(s: &Stream) {
    let capacity = s.launch_cache_stats().capacity;
    s.set_launch_cache_capacity(0);
    s.synchronize().expect("synchronize");
    s.set_launch_cache_capacity(capacity);
}

/// The live counters once the launch cache of `s` has been emptied and `ctx`'s caching allocator
/// has returned its cached blocks (neither a cached executor nor a cached block is a leak).
#[cfg(feature = "mock")]
fn live(ctx: &Context, s: &Stream) -> [u64; 4] {
    flush_launch_cache(s);
    ctx.empty_cache().expect("empty_cache");
    let st = ascend::mock::stats();
    [st.live_allocations, st.live_tensors, st.live_executors, st.live_streams]
}

/// The path a call takes through the launch cache, arranged before each faulted call.
#[cfg(feature = "mock")]
#[derive(Clone, Copy, Debug)]
enum Path {
    /// The cache is off: descriptors, phase 1, phase 2 (which consumes the executor).
    Uncached,
    /// An empty cache: descriptors, phase 1, `aclSetAclOpExecutorRepeatable`, phase 2. (A
    /// failure of `aclSetAclOpExecutorRepeatable` does not fail the call: see
    /// [`repeatable_refused`].)
    Miss,
    /// The call's executor is cached, bound to other buffers: rebind every tensor, phase 2.
    Hit,
}

#[cfg(feature = "mock")]
impl Path {
    const ALL: [Path; 3] = [Path::Uncached, Path::Miss, Path::Hit];

    /// Whether `s` can take this path for `case`: not [`Path::Hit`] when the mock refuses the
    /// operator's repeatable executors (`ASCEND_MOCK_REFUSE_REPEATABLE`), since nothing is cached
    /// then.
    fn reachable<F: Framework>(self, s: &Stream, case: &F) -> Result<bool> {
        if !matches!(self, Path::Hit) {
            return Ok(true);
        }
        self.arrange(s, case)?;
        Ok(s.launch_cache_stats().entries > 0)
    }

    /// Readies `s` so that the next call of `case` takes this path.
    fn arrange<F: Framework>(self, s: &Stream, case: &F) -> Result<()> {
        match self {
            Path::Uncached => s.set_launch_cache_capacity(0),
            Path::Miss => flush_launch_cache(s),
            Path::Hit => {
                // On buffers of its own, so the next call rebinds every tensor.
                let (mut other, mut warm) = (case.upload(s)?, case.outputs(s)?);
                case.run_into(&mut other, s, &mut warm)?;
                s.synchronize()?;
            }
        }
        Ok(())
    }

    /// The CANN calls of this path, each with the status a fault injects and the status the call
    /// then fails with (`None`: `NullHandle`, for aclCreateTensor's null).
    fn calls(self, phase1: &str, aclnn: &'static str) -> Vec<(String, i32, Option<i32>)> {
        let create = ("aclCreateTensor".to_string(), 161001, None);
        let p1 = (phase1.to_string(), 561103, Some(561103));
        let p2 = (aclnn.to_string(), 361001, Some(361001));
        match self {
            Path::Uncached => vec![create, p1, p2],
            Path::Miss => vec![create, p1, p2],
            Path::Hit => vec![
                ("aclSetInputTensorAddr".into(), 161002, Some(161002)),
                ("aclSetOutputTensorAddr".into(), 161002, Some(161002)),
                p2,
            ],
        }
    }
}

/// On each path through the launch cache, a fault injected at each CANN call the path makes
/// fails the call with that status (or `NullHandle` for aclCreateTensor), naming the call, leaks
/// nothing and writes nothing, in the `_into` and the allocating form; an aclrtMalloc fault fails
/// the allocating form; then the call works.
#[cfg(feature = "mock")]
pub fn faults_at_each_cann_call<F: Framework>(ctx: &Context) -> Result<()> {
    use ascend::mock::fail_next_on_this_thread;
    let phase1 = format!("{}GetWorkspaceSize", F::ACLNN);
    for path in Path::ALL {
        let s = ctx.new_stream()?;
        let case = F::small(120);
        let mut up = case.upload(&s)?;
        let mut out = case.outputs(&s)?;
        case.run_into(&mut up, &s, &mut out)?; // the stream's workspace cache exists from here on
        let mut out = case.outputs(&s)?;
        if !path.reachable(&s, &case)? {
            continue;
        }
        let base = live(ctx, &s);
        for (api, code, status) in path.calls(&phase1, F::ACLNN) {
            let api = api.as_str();
            path.arrange(&s, &case)?;
            let before = written::<F>(&s, &up, &out);
            fail_next_on_this_thread(api, code);
            let err = case.run_into(&mut up, &s, &mut out).unwrap_err();
            if status.is_none() {
                assert!(matches!(&err, Error::NullHandle { call: "aclCreateTensor", .. }), "{path:?}: {err:?}");
            }
            assert_eq!(err.status(), status, "{path:?}, {api}: {err:?}");
            assert!(err.to_string().contains(api), "{path:?}, {api}: {err}");
            assert_eq!(live(ctx, &s), base, "{path:?}, {api}: leaked");
            assert_eq!(written::<F>(&s, &up, &out), before, "{path:?}, {api}: wrote");
            path.arrange(&s, &case)?;
            let before = written::<F>(&s, &up, &out);
            fail_next_on_this_thread(api, code);
            let err = case.run(&mut up, &s).unwrap_err();
            assert_eq!(err.status(), status, "{path:?}, {api} (allocating): {err:?}");
            assert_eq!(live(ctx, &s), base, "{path:?}, {api} (allocating): leaked");
            assert_eq!(written::<F>(&s, &up, &out), before, "{path:?}, {api} (allocating): wrote");
        }
        fail_next_on_this_thread("aclrtMalloc", 207001);
        assert_eq!(status_of(case.run(&mut up, &s)), 207001);
        assert_eq!(live(ctx, &s), base, "{path:?}, aclrtMalloc: leaked");
        path.arrange(&s, &case)?;
        case.run_into(&mut up, &s, &mut out)?;
        case.check(ctx, &s, "after the faults", &out);
    }
    Ok(())
}

/// On each path through the launch cache, a fault armed at every CANN function the crate binds
/// (but those that destroy or free, whose failure is a reported leak by design) before one
/// `_into` and one allocating call: each call either succeeds with the right values or fails
/// writing nothing; the calls of the path (the operator's, the descriptors', the rebinds) do
/// fail.
#[cfg(feature = "mock")]
pub fn a_fault_at_any_cann_call<F: Framework>(ctx: &Context) -> Result<()> {
    use ascend::mock::{clear_faults, fail_next_on_this_thread};
    use ascend::sys::symbols::{ASCENDCL_SYMBOLS, NNOPBASE_SYMBOLS};
    let skip = ["Destroy", "Free", "Finalize", "Reset", "GetRecentErrMsg"];
    let phase1 = format!("{}GetWorkspaceSize", F::ACLNN);
    let apis: Vec<&str> = ASCENDCL_SYMBOLS
        .iter()
        .chain(NNOPBASE_SYMBOLS)
        .copied()
        .chain([phase1.as_str(), F::ACLNN])
        .filter(|a| !skip.iter().any(|k| a.contains(k)))
        .collect();
    for path in Path::ALL {
        let s = ctx.new_stream()?;
        let case = F::small(122);
        let mut up = case.upload(&s)?;
        if !path.reachable(&s, &case)? {
            continue;
        }
        let mut failed = Vec::new();
        for &api in &apis {
            let mut out = case.outputs(&s)?;
            path.arrange(&s, &case)?;
            let before = written::<F>(&s, &up, &out);
            fail_next_on_this_thread(api, 507899);
            let r = case.run_into(&mut up, &s, &mut out);
            clear_faults();
            match r {
                Ok(()) => case.check(ctx, &s, api, &out),
                Err(e) => {
                    failed.push(api);
                    assert_eq!(written::<F>(&s, &up, &out), before, "{path:?}, {api}: failed ({e}) but wrote");
                }
            }
            path.arrange(&s, &case)?;
            fail_next_on_this_thread(api, 507899);
            let r = case.run(&mut up, &s);
            clear_faults();
            if let Ok(res) = r {
                case.check_res(ctx, &s, api, &res);
            }
        }
        for (api, _, _) in path.calls(&phase1, F::ACLNN) {
            assert!(
                failed.contains(&api.as_str()),
                "{path:?}: a fault at {api} must fail the call (failed: {failed:?})"
            );
        }
    }
    Ok(())
}

/// Refuses (or accepts again) the repeatable executors of `op` in the mock until dropped.
#[cfg(feature = "mock")]
pub struct RefuseRepeatable(&'static str);

#[cfg(feature = "mock")]
impl RefuseRepeatable {
    pub fn new(op: &'static str) -> Self {
        ascend::mock::refuse_repeatable(op, true);
        RefuseRepeatable(op)
    }
}

#[cfg(feature = "mock")]
impl Drop for RefuseRepeatable {
    fn drop(&mut self) {
        ascend::mock::refuse_repeatable(self.0, false);
    }
}

/// Executors CANN will not make repeatable (ASYNC.md §5). A refusal injected once (561000, as
/// CANN's) does not fail the call: it is right, launched uncached, and its signature is not tried
/// again on that stream. With the operator refused persistently, every form (`_into`, allocating,
/// prepared, prepared and dropped unlaunched) is right, three times over, with one phase 1 and one
/// launch per call, no cache entry, no further attempt after the first per signature, and (checked
/// by `isolated`) no leaked executor and no violation.
#[cfg(feature = "mock")]
pub fn repeatable_refused<F: Framework>(ctx: &Context) -> Result<()> {
    use ascend::mock::{fail_next_on_this_thread, launch_counters};
    let s = ctx.new_stream()?;
    let case = F::small(123);
    let mut up = case.upload(&s)?;
    fail_next_on_this_thread("aclSetAclOpExecutorRepeatable", 561000);
    let mut out = case.outputs(&s)?;
    let before = launch_counters();
    case.run_into(&mut up, &s, &mut out)?;
    case.check(ctx, &s, "a refusal injected once", &out);
    assert_eq!(launch_counters().repeatable_refusals - before.repeatable_refusals, 1, "the fault fired");
    let before = launch_counters();
    case.run_into(&mut up, &s, &mut out)?;
    case.check(ctx, &s, "after a refusal", &out);
    let after = launch_counters();
    assert_eq!(after.repeatable_refusals, before.repeatable_refusals, "a refused signature is tried again");
    assert_eq!(after.phase1_calls - before.phase1_calls, 1, "a refused signature runs phase 1");
    assert_eq!(s.launch_cache_stats().entries, 0, "a refused executor was cached");

    let _refuse = RefuseRepeatable::new(F::ACLNN);
    let s = ctx.new_stream()?;
    for round in 0..3 {
        let before = launch_counters();
        let mut out = case.outputs(&s)?;
        case.run_into(&mut up, &s, &mut out)?;
        case.check(ctx, &s, &format!("refused, _into, round {round}"), &out);
        let res = case.run(&mut up, &s)?;
        case.check_res(ctx, &s, &format!("refused, allocating, round {round}"), &res);
        let mut out = case.outputs(&s)?;
        case.prepare(&mut up, &s, &mut out)?.launch(&s, None)?;
        case.check(ctx, &s, &format!("refused, prepared, round {round}"), &out);
        let mut unlaunched = case.outputs(&s)?;
        drop(case.prepare(&mut up, &s, &mut unlaunched)?);
        let after = launch_counters();
        assert_eq!(after.phase1_calls - before.phase1_calls, 4, "round {round}: one phase 1 per call");
        assert_eq!(after.launches - before.launches, 3, "round {round}: one launch per launched call");
        if round > 0 {
            // the prepared call dropped unlaunched tries (its destroy's documented pairing)
            assert_eq!(after.repeatable_refusals - before.repeatable_refusals, 1, "round {round}: tried again");
        }
    }
    let st = s.launch_cache_stats();
    assert_eq!((st.entries, st.hits, st.misses), (0, 0, 0), "refused executors were cached: {st:?}");
    Ok(())
}

/// Ranks 2 to 8 (channels at dim 1 throughout; `case(rank, shape)` makes each rank's case):
/// the allocating form's result is right.
pub fn ranks_2_to_8<F: Framework>(ctx: &Context, case: impl Fn(u64, &[usize]) -> F) -> Result<()> {
    let s = ctx.new_stream()?;
    for rank in 2..=8 {
        let shape: Vec<usize> = (0..rank).map(|d| [3, 4, 2, 1, 3, 2, 1, 2][d]).collect();
        let case = case(rank as u64, &shape);
        let res = case.run(&mut case.upload(&s)?, &s)?;
        case.check_res(ctx, &s, &format!("rank {rank}"), &res);
    }
    Ok(())
}

/// An empty input (batch 0, or an empty spatial dim; `case(shape)` makes the f32 case) computes
/// nothing and succeeds in the three forms of a one-output operator: the allocating form gives an
/// empty tensor of that shape, prepare asks for no workspace.
pub fn empty_inputs<F: Framework<Out = Tensor, Res = Tensor>>(
    ctx: &Context,
    case: impl Fn(&[usize]) -> F,
) -> Result<()> {
    let s = ctx.new_stream()?;
    for shape in [[0, 3, 4], [2, 3, 0]] {
        let case = case(&shape);
        let mut up = case.upload(&s)?;
        let out = case.run(&mut up, &s)?;
        assert_eq!(out.shape(), &shape[..]);
        assert!(out.to_vec::<f32>(&s)?.is_empty());
        let mut into = Tensor::zeros(&s, DType::F32, &shape)?;
        case.run_into(&mut up, &s, &mut into)?;
        let mut into = Tensor::zeros(&s, DType::F32, &shape)?;
        let p = case.prepare(&mut up, &s, &mut into)?;
        assert_eq!(p.workspace_size(), 0);
        p.launch(&s, None)?;
    }
    Ok(())
}

/// `_into` of a one-output operator into outputs of any non-overlapping layout, each made from
/// `sentinel` (the rank-4 output's shape and dtype, pre-filled): channels-last, spread with gaps,
/// reversed dims; each result is right.
pub fn strided_outputs<F: Framework<Out = Tensor>>(ctx: &Context, case: &F, sentinel: &Data) -> Result<()> {
    let s = ctx.new_stream()?;
    let mut up = case.upload(&s)?;
    let layouts = [
        ("channels-last", sentinel.permuted(&[0, 2, 3, 1])),
        ("spread", sentinel.spread(2, 3, 555.0)),
        ("reversed dims", sentinel.permuted(&[3, 2, 1, 0])),
    ];
    for (what, init) in layouts {
        let mut out = init.tensor(&s)?;
        case.run_into(&mut up, &s, &mut out)?;
        case.check(ctx, &s, what, &out);
    }
    Ok(())
}

/// Each case (named, e.g. by its layout) through the allocating form: the result is contiguous
/// and right.
pub fn allocating_results<'n, F: Framework<Res = Tensor>>(
    ctx: &Context,
    cases: impl IntoIterator<Item = (&'n str, F)>,
) -> Result<()> {
    let s = ctx.new_stream()?;
    for (what, case) in cases {
        let out = case.run(&mut case.upload(&s)?, &s)?;
        assert!(out.is_contiguous(), "{what}: the allocating result is contiguous");
        case.check_res(ctx, &s, what, &out);
    }
    Ok(())
}

/// Inputs above the CPU's threading threshold (`cases`, each named): the allocating form's result
/// is right, and running it again gives the same bits (any thread interleaving).
pub fn large_inputs<F: Framework<Res = Tensor>>(
    ctx: &Context,
    cases: impl IntoIterator<Item = (String, F)>,
) -> Result<()> {
    let s = ctx.new_stream()?;
    for (what, case) in cases {
        let mut up = case.upload(&s)?;
        let out = case.run(&mut up, &s)?;
        case.check_res(ctx, &s, &what, &out);
        assert_eq!(bits(&s, &out), bits(&s, &case.run(&mut up, &s)?), "{what}: the same bits again");
    }
    Ok(())
}

/// The same call gives the same bits through every entry point of an operator whose allocating
/// form returns what `_into` writes: the allocating form twice, and `_into` (into the case's
/// pre-filled outputs).
pub fn deterministic<F: Framework<Res = <F as Framework>::Out>>(ctx: &Context, case: F) -> Result<()> {
    let s = ctx.new_stream()?;
    let mut up = case.upload(&s)?;
    let a = case.run(&mut up, &s)?;
    let b = case.run(&mut up, &s)?;
    let mut c = case.outputs(&s)?;
    case.run_into(&mut up, &s, &mut c)?;
    assert_eq!(F::out_bits(&s, &a), F::out_bits(&s, &b), "the allocating form twice");
    assert_eq!(F::out_bits(&s, &a), F::out_bits(&s, &c), "the allocating form and _into");
    Ok(())
}

/// Instantiates the framework tests for one operator: `framework_tests!(Case)`, where `Case`
/// (in scope at the invocation) implements [`Framework`]. Expands into `framework::cpu::*` and,
/// with the mock feature, `framework::mock::*` (each run inside `common::mock::isolated`), through
/// `on_both_backends!`; the fault tests run on the mock only.
#[allow(unused_macros)]
macro_rules! framework_tests {
    ($case:ty) => {
        mod framework {
            #[allow(unused_imports)]
            use super::*;
            use crate::common::framework as f;
            type Op = $case;
            fn two_phase(ctx: &ascend::Context) -> ascend::Result<()> {
                f::two_phase::<Op>(ctx)
            }
            fn prepared_dropped_unlaunched(ctx: &ascend::Context) -> ascend::Result<()> {
                f::prepared_dropped_unlaunched::<Op>(ctx)
            }
            fn arguments_dropped_right_after_the_launch(ctx: &ascend::Context) -> ascend::Result<()> {
                f::arguments_dropped_right_after_the_launch::<Op>(ctx)
            }
            #[cfg(feature = "mock")]
            fn faults_at_each_cann_call(ctx: &ascend::Context) -> ascend::Result<()> {
                f::faults_at_each_cann_call::<Op>(ctx)
            }
            #[cfg(feature = "mock")]
            fn a_fault_at_any_cann_call(ctx: &ascend::Context) -> ascend::Result<()> {
                f::a_fault_at_any_cann_call::<Op>(ctx)
            }
            #[cfg(feature = "mock")]
            fn repeatable_refused(ctx: &ascend::Context) -> ascend::Result<()> {
                f::repeatable_refused::<Op>(ctx)
            }
            crate::common::on_both_backends!(
                local: [two_phase, prepared_dropped_unlaunched, arguments_dropped_right_after_the_launch],
                cross: [],
                mock_only: [faults_at_each_cann_call, a_fault_at_any_cann_call, repeatable_refused],
            );
        }
    };
}
#[allow(unused_imports)]
pub(crate) use framework_tests;

/// The [`Framework`] items every operator with one output tensor spells the same way: `Up`
/// (in scope at the invocation, with `run`, `run_into` and `prepare` methods) as the uploaded
/// case, one `Tensor` out, outputs shaped like the case's `x` in the dtype of its field `$field`
/// and pre-filled with 777, and the file's `check(ctx, s, what, out, dtype, case)` for both
/// forms' results.
#[allow(unused_macros)]
macro_rules! one_output_framework_items {
    (output_dtype_of: $field:ident) => {
        type Up = Up;
        type Out = ascend::Tensor;
        type Res = ascend::Tensor;

        fn upload(&self, s: &ascend::Stream) -> ascend::Result<Up> {
            Self::upload(self, s)
        }

        fn outputs(&self, s: &ascend::Stream) -> ascend::Result<ascend::Tensor> {
            crate::common::data::Data::filled(self.$field.dtype, &self.x.shape, 777.0).tensor(s)
        }

        fn run(&self, up: &mut Up, s: &ascend::Stream) -> ascend::Result<ascend::Tensor> {
            up.run(s)
        }

        fn run_into(&self, up: &mut Up, s: &ascend::Stream, out: &mut ascend::Tensor) -> ascend::Result<()> {
            up.run_into(s, out)
        }

        fn prepare<'a>(
            &self,
            up: &'a mut Up,
            s: &ascend::Stream,
            out: &'a mut ascend::Tensor,
        ) -> ascend::Result<ascend::ops::Prepared<'a>> {
            up.prepare(s, out)
        }

        fn check(&self, ctx: &ascend::Context, s: &ascend::Stream, what: &str, out: &ascend::Tensor) {
            check(ctx, s, what, out, self.$field.dtype, self);
        }

        fn check_res(&self, ctx: &ascend::Context, s: &ascend::Stream, what: &str, res: &ascend::Tensor) {
            check(ctx, s, what, res, self.$field.dtype, self);
        }

        fn out_bits(s: &ascend::Stream, out: &ascend::Tensor) -> Vec<Vec<u32>> {
            vec![crate::common::data::bits(s, out)]
        }
    };
}
#[allow(unused_imports)]
pub(crate) use one_output_framework_items;

/// The [`Framework`] items every operator with two `[C]` output tensors (mean and invstd) spells
/// the same way: the pair out (pre-filled, `C` the dim 1 of the case's field `$field`), the
/// allocating form's result checked as `_into`'s outputs are, and both outputs' bits.
#[allow(unused_macros)]
macro_rules! two_output_framework_items {
    (channels_of: $field:ident) => {
        type Out = (ascend::Tensor, ascend::Tensor);
        type Res = (ascend::Tensor, ascend::Tensor);

        fn outputs(&self, s: &ascend::Stream) -> ascend::Result<(ascend::Tensor, ascend::Tensor)> {
            crate::common::framework::two_channel_outputs(s, self.$field.shape[1])
        }

        fn check_res(
            &self,
            ctx: &ascend::Context,
            s: &ascend::Stream,
            what: &str,
            res: &(ascend::Tensor, ascend::Tensor),
        ) {
            self.check(ctx, s, what, res);
        }

        fn out_bits(s: &ascend::Stream, (m, v): &(ascend::Tensor, ascend::Tensor)) -> Vec<Vec<u32>> {
            vec![crate::common::data::bits(s, m), crate::common::data::bits(s, v)]
        }
    };
}
#[allow(unused_imports)]
pub(crate) use two_output_framework_items;
