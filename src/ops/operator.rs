//! [`Operator`]: what one operator tells the framework.
//!
//! An operator is an `Args` struct (its input tensors and scalars) plus one `impl Operator`: its
//! rules, its CPU kernel, and its phase-1 FFI call. The paths every call takes over it (validate
//! once, check the streams once, resolve the backend once) and the entry points written from one
//! argument list are in [`super::call`].
//!
//! Inputs (read only) and outputs (written, in-place ones included: gather's running
//! statistics) are listed apart, each in the order of the operator's aclnn prototype, and phase 1
//! receives the descriptors and scalars as arguments rather than through a closure made per call:
//! what a cache of repeatable executors needs to rebind addresses by position and skip phase 1
//! (how CANN's `aclSetInputTensorAddr`/`aclSetOutputTensorAddr` indices count in-place and absent
//! optional tensors is for that cache to establish).

use ascend_sys::{aclOpExecutor, aclTensor, aclnnStatus, symbols, OpApi};

use super::launch::Phase2;
use crate::error::Result;
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
