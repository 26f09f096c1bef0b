//! [`Prepared`]: the two-phase API's validated call, shared by every operator.

use super::launch::{DevicePrepared, Workspace};
use crate::error::Result;
use crate::stream::Stream;

/// A validated call, ready to launch (phase 2), made by an operator's `prepare_*` function.
///
/// It borrows every tensor of the call until it is launched or dropped, so none can be freed,
/// refilled or read in between. On Ascend, phase 1 has run (`aclnn*GetWorkspaceSize`: the
/// descriptors and the executor exist); [`launch`](Self::launch) runs phase 2, which consumes the
/// executor, so a prepared call runs once. Dropping it unlaunched destroys the executor
/// (`aclSetAclOpExecutorRepeatable` + `aclDestroyAclOpExecutor`) and writes nothing. Phase 1 runs
/// for every prepared call, as in CANN's own API: the stream's launch cache serves the `_into`
/// and allocating entries, whose launch stays on the stream they were given.
#[must_use = "a prepared call does nothing until it is launched"]
pub struct Prepared<'a> {
    kind: Kind<'a>,
}

enum Kind<'a> {
    /// The CPU kernel, with its validated arguments.
    Cpu(Box<dyn FnOnce() -> Result<()> + 'a>),
    Ascend(Box<DevicePrepared<'a>>),
}

impl std::fmt::Debug for Prepared<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            Kind::Cpu(_) => f.write_str("Prepared(Cpu)"),
            Kind::Ascend(a) => f.debug_tuple("Prepared").field(a).finish(),
        }
    }
}

impl<'a> Prepared<'a> {
    /// A call for the CPU backend: `run` is the kernel over the validated arguments.
    pub(crate) fn cpu(run: impl FnOnce() -> Result<()> + 'a) -> Self {
        Prepared { kind: Kind::Cpu(Box::new(run)) }
    }

    /// A call for Ascend, phase 1 done.
    pub(crate) fn ascend(prepared: DevicePrepared<'a>) -> Self {
        Prepared { kind: Kind::Ascend(Box::new(prepared)) }
    }

    /// The workspace phase 2 needs, in bytes (0 on the CPU, and often on Ascend).
    pub fn workspace_size(&self) -> u64 {
        match &self.kind {
            Kind::Cpu(_) => 0,
            Kind::Ascend(a) => a.workspace_size(),
        }
    }

    /// Phase 2: enqueues the work on `stream`, which must be on the device the tensors live on
    /// (the CPU backend runs it now). With `workspace = None` the stream's cached workspace is
    /// used; a caller-owned [`Workspace`] must hold at least
    /// [`workspace_size`](Self::workspace_size) bytes (null is passed when that is 0).
    pub fn launch(self, stream: &Stream, workspace: Option<&Workspace>) -> Result<()> {
        match self.kind {
            Kind::Cpu(run) => {
                if stream.ascend().is_some() {
                    return Err(stream.mismatch("stream", "the call was prepared on the CPU backend"));
                }
                run()
            }
            Kind::Ascend(a) => a.launch(stream, workspace),
        }
    }
}

/// Writes an operator's entry points from one argument list, the allocating entry's:
/// - the allocating entry as given (its body makes the outputs);
/// - `fn name_into(.., outputs) => (args, outs);`: the `_into` entry, the same arguments then
///   the caller's outputs, one [`operator::run`](super::operator::run) of `args` (built from the
///   arguments) on `outs`;
/// - `fn prepare_name(.., ..) -> Prepared;`: the `prepare_` entry, the `_into` entry's arguments
///   each borrowed for the `'a` of the prepared call it returns, one
///   [`operator::prepare`](super::operator::prepare) of the same call;
/// - optionally `pub(crate) fn validate_args(..) -> Result<()> { .. }`, the same arguments with
///   the body given.
///
/// An argument is `name: &Tensor`, `Option<&Tensor>`, `&mut Tensor` (or `&` / `&mut` another type
/// that holds tensors), `Option<&mut Tensor>`,
/// `Type<'_>` (a struct of tensors) or a value type; the allocating entry's each followed by a
/// comma.
macro_rules! entry_points {
    (
        $(#[$alloc_meta:meta])*
        pub fn $alloc:ident($stream:ident: &Stream, $($inputs:tt)*) -> $alloc_ret:ty $alloc_body:block

        $(#[$into_meta:meta])*
        pub fn $into:ident(.., $($outputs:tt)*) => ($op:expr, $outs:expr $(,)?);

        $(#[$prep_meta:meta])*
        pub fn $prep:ident(.., ..) -> $prepared:ident;

        $($check:tt)*
    ) => {
        $(#[$alloc_meta])*
        pub fn $alloc($stream: &Stream, $($inputs)*) -> $alloc_ret $alloc_body

        $(#[$into_meta])*
        pub fn $into(
            $stream: &Stream,
            $($inputs)*
            $($outputs)*
        ) -> $crate::error::Result<()> {
            $crate::ops::operator::run($stream, $op, $outs)
        }

        $crate::ops::prepared::entry_points! {
            @borrow [$(#[$prep_meta])* $prep $prepared $stream ($op, $outs)] []
            $($inputs)* $($outputs)*,
        }

        $crate::ops::prepared::entry_points! { @check $stream [$($inputs)*] $($check)* }
    };
    // The optional `validate_args`.
    (@check $stream:ident [$($inputs:tt)*]) => {};
    (
        @check $stream:ident [$($inputs:tt)*]
        $(#[$check_meta:meta])*
        pub(crate) fn $check:ident(..) -> $check_ret:ty $check_body:block
    ) => {
        $(#[$check_meta])*
        pub(crate) fn $check($stream: &Stream, $($inputs)*) -> $check_ret $check_body
    };
    // The `prepare_` entry's arguments, one at a time: each tensor reference borrowed for `'a`.
    (@borrow $f:tt [$($done:tt)*] $n:ident: &Tensor, $($rest:tt)*) => {
        $crate::ops::prepared::entry_points! { @borrow $f [$($done)* $n: &'a Tensor,] $($rest)* }
    };
    (@borrow $f:tt [$($done:tt)*] $n:ident: Option<&Tensor>, $($rest:tt)*) => {
        $crate::ops::prepared::entry_points! { @borrow $f [$($done)* $n: Option<&'a Tensor>,] $($rest)* }
    };
    (@borrow $f:tt [$($done:tt)*] $n:ident: &mut Tensor, $($rest:tt)*) => {
        $crate::ops::prepared::entry_points! { @borrow $f [$($done)* $n: &'a mut Tensor,] $($rest)* }
    };
    (@borrow $f:tt [$($done:tt)*] $n:ident: Option<&mut Tensor>, $($rest:tt)*) => {
        $crate::ops::prepared::entry_points! { @borrow $f [$($done)* $n: Option<&'a mut Tensor>,] $($rest)* }
    };
    (@borrow $f:tt [$($done:tt)*] $n:ident: &$t:ident, $($rest:tt)*) => {
        $crate::ops::prepared::entry_points! { @borrow $f [$($done)* $n: &'a $t,] $($rest)* }
    };
    (@borrow $f:tt [$($done:tt)*] $n:ident: &mut $t:ident, $($rest:tt)*) => {
        $crate::ops::prepared::entry_points! { @borrow $f [$($done)* $n: &'a mut $t,] $($rest)* }
    };
    (@borrow $f:tt [$($done:tt)*] $n:ident: $t:ident<'_>, $($rest:tt)*) => {
        $crate::ops::prepared::entry_points! { @borrow $f [$($done)* $n: $t<'a>,] $($rest)* }
    };
    (@borrow $f:tt [$($done:tt)*] $n:ident: $t:ty, $($rest:tt)*) => {
        $crate::ops::prepared::entry_points! { @borrow $f [$($done)* $n: $t,] $($rest)* }
    };
    (
        @borrow [$(#[$prep_meta:meta])* $prep:ident $prepared:ident $stream:ident ($op:expr, $outs:expr)]
        [$($args:tt)*]
    ) => {
        $(#[$prep_meta])*
        pub fn $prep<'a>(
            $stream: &Stream,
            $($args)*
        ) -> $crate::error::Result<$prepared<'a>> {
            $crate::ops::operator::prepare($stream, $op, $outs)
        }
    };
}
pub(crate) use entry_points;
