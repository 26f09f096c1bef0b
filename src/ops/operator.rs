//! [`Operator`]: what one operator tells the framework, and the one path every call takes.
//!
//! An operator is an `Args` struct (its input tensors and scalars) plus one `impl Operator`: its
//! rules, its CPU kernel, and its phase-1 FFI call. Its allocating, `_into` and `prepare_` entries
//! are each a few lines over [`prepare`], [`run`] and [`run_checked`], which validate once, check
//! every tensor's stream once and resolve the backend once, then run the CPU kernel or go through
//! the one launch path ([`super::launch`]).
//!
//! Inputs (read only) and outputs (written, in-place ones included: gather's running
//! statistics) are listed apart, each in the order of the operator's aclnn prototype, and phase 1
//! receives the descriptors and scalars as arguments rather than through a closure made per call:
//! what a cache of repeatable executors needs to rebind addresses by position and skip phase 1
//! (how CANN's `aclSetInputTensorAddr`/`aclSetOutputTensorAddr` indices count in-place and absent
//! optional tensors is for that cache to establish).

use ascend_sys::{aclOpExecutor, aclTensor, aclnnStatus, symbols, OpApi};

use super::launch::{self, Phase2};
use super::prepared::Prepared;
use super::validate;
use crate::error::Result;
use crate::stream::Stream;
use crate::tensor::Tensor;

/// One tensor argument: the tensor (`None` for an absent optional one) and its aclnn name (for
/// errors).
pub(crate) type Arg<'t> = (Option<&'t Tensor>, &'static str);

/// An aclnn operator on both backends.
pub(crate) trait Operator<'a>: Sized + 'a {
    /// Its two-phase API in the toolkit.
    const OP: &'static symbols::Operator;
    /// The aclnn names of its outputs, in [`Outputs`](Self::Outputs) order.
    const OUTPUTS: &'static [&'static str];
    /// The tensors it writes, in its prototype's order.
    type Outputs: Outputs<'a>;
    /// What validation established (channels, whether the input is empty, ...).
    type Plan: Copy + 'a;
    /// Phase 1's arguments that are not tensors (eps, momentum, the mask), by value.
    type Scalars: ScalarBits;

    /// Its input tensors in its prototype's order.
    fn inputs(&self) -> impl IntoIterator<Item = Arg<'a>>;
    /// Validates the whole call, in CANN's order, with CANN's statuses; nothing is written on a
    /// rejected call. (That no output overlaps itself is checked after, for every operator.)
    fn check(&self, outs: &Self::Outputs) -> Result<Self::Plan>;
    /// Phase 1's scalars.
    fn scalars(&self) -> Self::Scalars;
    /// The CPU kernel over the validated call; every tensor is in host memory (the streams were
    /// checked).
    fn cpu(self, plan: Self::Plan, outs: Self::Outputs) -> Result<()>;
    /// Phase 1, `aclnn<Op>GetWorkspaceSize` (found in `api` with [`crate::acl::op_fn`]), with the
    /// call's descriptors and out-pointers `h` and its scalars.
    ///
    /// # Safety
    /// `h` holds a live descriptor of each tensor of the call (null for an absent one), inputs in
    /// [`inputs`](Self::inputs) order and outputs in [`Outputs`](Self::Outputs) order, each
    /// outliving the executor, and valid out-pointers.
    unsafe fn phase1(api: &OpApi, scalars: Self::Scalars, h: Handles<'_>) -> Result<aclnnStatus>;
    /// Phase 2, `aclnn<Op>`, in `api`.
    fn phase2(api: &OpApi) -> &std::result::Result<Phase2, libloading::Error>;
    /// Whether phase 2 leaves the outputs unwritten for this plan (CANN's kernels skip empty
    /// inputs), so the launch fills them with zeros.
    fn zero_after_launch(_plan: &Self::Plan) -> bool {
        false
    }
}

/// Phase 1's scalars as bits: part of the launch cache's key (equal bits, equal phase 1).
pub(crate) trait ScalarBits: Copy {
    /// The bits of each scalar, unused words 0.
    fn bits(&self) -> [u64; 4];
}

impl ScalarBits for () {
    fn bits(&self) -> [u64; 4] {
        [0; 4]
    }
}

impl ScalarBits for f64 {
    fn bits(&self) -> [u64; 4] {
        [self.to_bits(), 0, 0, 0]
    }
}

impl ScalarBits for (f64, f64) {
    fn bits(&self) -> [u64; 4] {
        [self.0.to_bits(), self.1.to_bits(), 0, 0]
    }
}

/// The descriptors of one call and phase 1's out-pointers.
#[derive(Clone, Copy)]
pub(crate) struct Handles<'h> {
    pub(crate) inputs: &'h [*mut aclTensor],
    pub(crate) outputs: &'h [*mut aclTensor],
    /// Receives the workspace size.
    pub(crate) size: *mut u64,
    /// Receives the executor.
    pub(crate) executor: *mut *mut aclOpExecutor,
    /// The toolkit the call runs on, for phase-1 arguments that are not tensors but nnopbase
    /// objects (`aclBoolArray`); `None` only in unit tests.
    pub(crate) cann: Option<&'h ascend_sys::Cann>,
}

impl Handles<'_> {
    /// Input `i` (null when absent).
    pub(crate) fn input(&self, i: usize) -> *mut aclTensor {
        self.inputs.get(i).copied().unwrap_or(std::ptr::null_mut())
    }

    /// Output `i` (null when absent).
    pub(crate) fn output(&self, i: usize) -> *mut aclTensor {
        self.outputs.get(i).copied().unwrap_or(std::ptr::null_mut())
    }
}

/// The outputs of a call, borrowed mutably for the CPU kernel and shared for the descriptors.
pub(crate) trait Outputs<'a>: 'a {
    /// Each output in order (`None`: absent, or turned off).
    fn each(&self) -> impl Iterator<Item = Option<&Tensor>>;
    /// Each output in order, borrowed for the whole call (the Ascend side describes them).
    fn into_shared(self) -> impl Iterator<Item = Option<&'a Tensor>>;
}

impl<'a, const N: usize> Outputs<'a> for [&'a mut Tensor; N] {
    fn each(&self) -> impl Iterator<Item = Option<&Tensor>> {
        self.iter().map(|t| Some(&**t))
    }
    fn into_shared(self) -> impl Iterator<Item = Option<&'a Tensor>> {
        self.into_iter().map(|t| Some(&*t))
    }
}

impl<'a, const N: usize> Outputs<'a> for [Option<&'a mut Tensor>; N] {
    fn each(&self) -> impl Iterator<Item = Option<&Tensor>> {
        self.iter().map(|t| t.as_deref())
    }
    fn into_shared(self) -> impl Iterator<Item = Option<&'a Tensor>> {
        self.into_iter().map(|t| t.map(|t| &*t))
    }
}

impl<'a, A: Outputs<'a>, B: Outputs<'a>> Outputs<'a> for (A, B) {
    fn each(&self) -> impl Iterator<Item = Option<&Tensor>> {
        self.0.each().chain(self.1.each())
    }
    fn into_shared(self) -> impl Iterator<Item = Option<&'a Tensor>> {
        self.0.into_shared().chain(self.1.into_shared())
    }
}

/// Checks that every given tensor lives where `stream` runs work, in order.
pub(crate) fn check_streams<'t>(stream: &Stream, args: impl IntoIterator<Item = Arg<'t>>) -> Result<()> {
    for (t, name) in args {
        if let Some(t) = t {
            t.check_stream(stream, name)?;
        }
    }
    Ok(())
}

/// Validates the whole call and checks every tensor's stream, once. After the operator's own
/// rules, every output must not overlap itself (no operator can forget that one).
fn checked<'a, O: Operator<'a>>(stream: &Stream, op: &O, outs: &O::Outputs) -> Result<O::Plan> {
    let plan = op.check(outs)?;
    for (t, name) in outs.each().zip(O::OUTPUTS) {
        if let Some(t) = t {
            validate::distinct_elements(name, &t.layout())?;
        }
    }
    check_streams(stream, op.inputs())?;
    check_streams(stream, outs.each().zip(O::OUTPUTS.iter().copied()))?;
    Ok(plan)
}

/// A `prepare_*` entry: validates, checks the streams and resolves the backend, once each; on
/// Ascend runs phase 1.
pub(crate) fn prepare<'a, O: Operator<'a>>(stream: &Stream, op: O, outs: O::Outputs) -> Result<Prepared<'a>> {
    let plan = checked(stream, &op, &outs)?;
    match stream.ascend() {
        None => Ok(Prepared::cpu(move || op.cpu(plan, outs))),
        Some((_, device)) => launch::prepare(device, op, plan, outs).map(Prepared::ascend),
    }
}

/// An `_into` entry: a launch from the stream's launch cache when it holds this call's
/// signature (validated when the entry was made: see [`launch::launch_if_cached`]), else
/// [`prepare`] and launch on the same stream (with its cached workspace), without checking again.
pub(crate) fn run<'a, O: Operator<'a>>(stream: &Stream, op: O, outs: O::Outputs) -> Result<()> {
    if let Some((inner, device)) = stream.ascend() {
        if launch::launch_if_cached(inner, device, &op, &outs)? {
            return Ok(());
        }
    }
    let plan = checked(stream, &op, &outs)?;
    run_checked(stream, op, plan, outs)
}

/// Runs a call whose arguments are validated and whose tensors are checked against `stream`:
/// what an allocating entry calls once it has validated its inputs and made its outputs (valid
/// by construction).
pub(crate) fn run_checked<'a, O: Operator<'a>>(stream: &Stream, op: O, plan: O::Plan, outs: O::Outputs) -> Result<()> {
    match stream.ascend() {
        None => op.cpu(plan, outs),
        Some((inner, device)) => launch::run(inner, device, op, plan, outs),
    }
}

/// The allocating entry of an operator whose one output has the shape and dtype of its input
/// `$like`: `$op`'s input rules (its `check_inputs`, which returns the plan) and every input's
/// stream first, so that a rejected call allocates nothing; then the output, and the call run
/// into it. Evaluates to `Ok(output)`; an error returns from the entry. (A macro, not a function:
/// the output is borrowed for the operator's lifetime, which a function's own local cannot be.)
macro_rules! run_into_new_like {
    ($stream:ident, $op:expr, $like:expr) => {{
        let op = $op;
        let plan = op.check_inputs()?;
        $crate::ops::operator::check_streams($stream, op.inputs())?;
        let mut output = $crate::tensor::Tensor::alloc($stream, $like.dtype(), $like.shape(), false)?;
        $crate::ops::operator::run_checked($stream, op, plan, [&mut output])?;
        Ok(output)
    }};
}
pub(crate) use run_into_new_like;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Context;

    /// Outputs are listed in order, absent ones as `None`, the same borrowed mutably (for stream
    /// checks and the CPU) and shared (for descriptors); the handles of absent or missing
    /// positions are null.
    #[test]
    fn outputs_and_handles_keep_positions() {
        let stream = Context::cpu().new_stream().unwrap();
        let mut t: Vec<Tensor> = (0..3).map(|i| Tensor::from_slice(&stream, &[i as f32], &[1]).unwrap()).collect();
        let [a, b, c] = &mut t[..] else { unreachable!() };
        let outs = ([Some(a), None], [b, c]);
        let seen: Vec<Option<f32>> = outs.each().map(|t| t.map(|t| t.to_vec::<f32>(&stream).unwrap()[0])).collect();
        assert_eq!(seen, [Some(0.0), None, Some(1.0), Some(2.0)]);
        let shared: Vec<Option<&Tensor>> = outs.into_shared().collect();
        assert_eq!(shared.iter().map(Option::is_some).collect::<Vec<_>>(), [true, false, true, true]);

        let (ins, outs) = ([7usize as *mut aclTensor], [std::ptr::null_mut(), 9usize as *mut aclTensor]);
        let h = Handles {
            inputs: &ins,
            outputs: &outs,
            size: std::ptr::null_mut(),
            executor: std::ptr::null_mut(),
            cann: None,
        };
        assert_eq!((h.input(0) as usize, h.input(1) as usize), (7, 0));
        assert_eq!((h.output(0) as usize, h.output(1) as usize, h.output(2) as usize), (0, 9, 0));
    }
}
