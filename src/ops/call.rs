//! The one path every operator call takes, and the entry points written over it.
//!
//! An operator's allocating, `_into` and `prepare_` entries are each a few lines over
//! [`prepare`], [`run`] and [`run_checked`], which validate once, check every tensor's stream once
//! and resolve the backend once, then run the operator's CPU kernel or go through the one launch
//! path ([`super::launch`]). [`entry_points!`] writes the three entries from one argument list;
//! [`run_into_new_like!`] is the allocating entry of an operator whose one output is shaped like an
//! input. What an operator tells the framework is its
//! [`Operator`] impl (`operator.rs`); what a `prepare_` entry returns is a [`Prepared`]
//! (`prepared.rs`).

use super::launch;
use super::operator::{Arg, Operator, Outputs};
use super::prepared::Prepared;
use super::validate;
use crate::error::Result;
use crate::stream::Stream;

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
        $crate::ops::call::check_streams($stream, op.inputs())?;
        let mut output = $crate::tensor::Tensor::alloc($stream, $like.dtype(), $like.shape(), false)?;
        $crate::ops::call::run_checked($stream, op, plan, [&mut output])?;
        Ok(output)
    }};
}
pub(crate) use run_into_new_like;

/// Writes an operator's entry points from one argument list, the allocating entry's:
/// - the allocating entry as given (its body makes the outputs);
/// - `fn name_into(.., outputs) => (args, outs);`: the `_into` entry, the same arguments then
///   the caller's outputs, one [`run`] of `args` (built from the
///   arguments) on `outs`;
/// - `fn prepare_name(.., ..) -> Prepared;`: the `prepare_` entry, the `_into` entry's arguments
///   each borrowed for the `'a` of the prepared call it returns, one
///   [`prepare`] of the same call.
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
    ) => {
        $(#[$alloc_meta])*
        pub fn $alloc($stream: &Stream, $($inputs)*) -> $alloc_ret $alloc_body

        $(#[$into_meta])*
        pub fn $into(
            $stream: &Stream,
            $($inputs)*
            $($outputs)*
        ) -> $crate::error::Result<()> {
            $crate::ops::call::run($stream, $op, $outs)
        }

        $crate::ops::call::entry_points! {
            @borrow [$(#[$prep_meta])* $prep $prepared $stream ($op, $outs)] []
            $($inputs)* $($outputs)*,
        }
    };
    // The `prepare_` entry's arguments, one at a time: each tensor reference borrowed for `'a`.
    (@borrow $f:tt [$($done:tt)*] $n:ident: &Tensor, $($rest:tt)*) => {
        $crate::ops::call::entry_points! { @borrow $f [$($done)* $n: &'a Tensor,] $($rest)* }
    };
    (@borrow $f:tt [$($done:tt)*] $n:ident: Option<&Tensor>, $($rest:tt)*) => {
        $crate::ops::call::entry_points! { @borrow $f [$($done)* $n: Option<&'a Tensor>,] $($rest)* }
    };
    (@borrow $f:tt [$($done:tt)*] $n:ident: &mut Tensor, $($rest:tt)*) => {
        $crate::ops::call::entry_points! { @borrow $f [$($done)* $n: &'a mut Tensor,] $($rest)* }
    };
    (@borrow $f:tt [$($done:tt)*] $n:ident: Option<&mut Tensor>, $($rest:tt)*) => {
        $crate::ops::call::entry_points! { @borrow $f [$($done)* $n: Option<&'a mut Tensor>,] $($rest)* }
    };
    (@borrow $f:tt [$($done:tt)*] $n:ident: &$t:ident, $($rest:tt)*) => {
        $crate::ops::call::entry_points! { @borrow $f [$($done)* $n: &'a $t,] $($rest)* }
    };
    (@borrow $f:tt [$($done:tt)*] $n:ident: &mut $t:ident, $($rest:tt)*) => {
        $crate::ops::call::entry_points! { @borrow $f [$($done)* $n: &'a mut $t,] $($rest)* }
    };
    (@borrow $f:tt [$($done:tt)*] $n:ident: $t:ident<'_>, $($rest:tt)*) => {
        $crate::ops::call::entry_points! { @borrow $f [$($done)* $n: $t<'a>,] $($rest)* }
    };
    (@borrow $f:tt [$($done:tt)*] $n:ident: $t:ty, $($rest:tt)*) => {
        $crate::ops::call::entry_points! { @borrow $f [$($done)* $n: $t,] $($rest)* }
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
            $crate::ops::call::prepare($stream, $op, $outs)
        }
    };
}
pub(crate) use entry_points;
