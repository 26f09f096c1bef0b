//! The backends a case runs on, and THE `on_both_backends!` that expands one case body into a
//! CPU test and an isolated mock test (serialised, then checked for leaks and violations).
#![allow(dead_code)]

use ascend::Context;

/// The contexts every case runs on: the CPU always, plus the mock Ascend with `--features mock`.
pub fn backends() -> Vec<Context> {
    #[allow(unused_mut)]
    let mut v = vec![Context::cpu()];
    #[cfg(feature = "mock")]
    v.push(mock::context());
    v
}

/// Runs `f` on the CPU backend; with the mock feature, as [`mock::isolated_on`] does, for CPU
/// cases that also use the mock (through [`other_backend`]) and so must not run while another
/// test measures the mock's global counters.
pub fn on_cpu_touching_mock<T>(f: impl FnOnce(&Context) -> T) -> T {
    #[cfg(feature = "mock")]
    return mock::isolated_on(Context::cpu, f);
    #[cfg(not(feature = "mock"))]
    f(&Context::cpu())
}

/// The other backend than `ctx`'s, when this build has one.
pub fn other_backend(ctx: &Context) -> Option<Context> {
    backends().into_iter().find(|c| c.backend() != ctx.backend())
}

#[cfg(feature = "mock")]
pub mod mock {
    use std::sync::{Mutex, MutexGuard};

    use ascend::{Context, Result, Stream};

    use crate::common::reduce_backward::{Inputs, Up};

    /// The mock's Ascend device 0.
    pub fn context() -> Context {
        ascend::mock::context(0).expect("mock context")
    }

    static LOCK: Mutex<()> = Mutex::new(());

    /// Serialises the tests of one binary that read the mock's process-global counters or
    /// inject faults (a failed test poisons nothing).
    pub fn lock() -> MutexGuard<'static, ()> {
        LOCK.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` on a fresh mock context while holding [`lock`], then asserts that it left no
    /// live allocation, tensor descriptor, executor or stream behind and counted no violation.
    pub fn isolated<T>(f: impl FnOnce(&Context) -> T) -> T {
        isolated_on(context, f)
    }

    /// [`isolated`] on the context `make` gives (e.g. the CPU, for a CPU case that also uses
    /// the mock as "the other backend").
    pub fn isolated_on<T>(make: impl FnOnce() -> Context, f: impl FnOnce(&Context) -> T) -> T {
        let _guard = lock();
        ascend::mock::clear_faults(); // a failed test may have left one armed
        let before = ascend::mock::stats();
        let result = {
            let ctx = make();
            f(&ctx)
        };
        let after = ascend::mock::stats();
        assert_eq!(
            after.violations,
            before.violations,
            "mock violations during the test: {:?}",
            ascend::mock::violations_since(before.violations)
        );
        assert_eq!(after.live_allocations, before.live_allocations, "leaked device memory: {before:?} -> {after:?}");
        assert_eq!(after.live_tensors, before.live_tensors, "leaked aclTensor: {before:?} -> {after:?}");
        assert_eq!(after.live_executors, before.live_executors, "leaked executor: {before:?} -> {after:?}");
        assert_eq!(after.live_streams, before.live_streams, "leaked stream: {before:?} -> {after:?}");
        result
    }

    /// [`isolated`] with a fresh stream of the mock context; an error fails the test.
    pub fn on_stream(f: impl FnOnce(&Context, Stream) -> Result<()>) {
        isolated(|ctx| f(ctx, ctx.new_stream()?)).unwrap();
    }

    /// [`on_stream`] with `inp` (the first operator's inputs) uploaded on that stream.
    pub fn with_uploaded(inp: Inputs, f: impl FnOnce(&Context, Stream, Inputs, Up) -> Result<()>) {
        on_stream(|ctx, s| {
            let up = inp.upload(&s)?;
            f(ctx, s, inp, up)
        });
    }
}

/// Expands each case `fn name(ctx: &Context) -> Result<()>` (in scope at the invocation) into
/// `cpu::name` and, with the mock feature, `mock::name`, run inside [`mock::isolated`]
/// (serialised, then checked for no leaked allocation, descriptor, executor or stream and no
/// violation). The `cross` cases use both backends at once (through [`other_backend`]): their
/// CPU run is serialised with the mock runs too ([`on_cpu_touching_mock`]). The optional
/// `mock_only` cases (fault injection) expand into `mock::name` alone.
///
/// `on_both_backends!(a, b)` is `on_both_backends!(local: [a, b], cross: [])`.
#[allow(unused_macros)]
macro_rules! on_both_backends {
    (
        local: [$($name:ident),* $(,)?],
        cross: [$($cross:ident),* $(,)?]
        $(, mock_only: [$($mock_only:ident),* $(,)?])? $(,)?
    ) => {
        mod cpu {
            $( #[test] fn $name() { super::$name(&ascend::Context::cpu()).unwrap(); } )*
            $( #[test] fn $cross() { crate::common::on_cpu_touching_mock(|ctx| super::$cross(ctx)).unwrap(); } )*
        }
        #[cfg(feature = "mock")]
        mod mock {
            $( #[test] fn $name() { crate::common::mock::isolated(|ctx| super::$name(ctx)).unwrap(); } )*
            $( #[test] fn $cross() { crate::common::mock::isolated(|ctx| super::$cross(ctx)).unwrap(); } )*
            $($( #[test] fn $mock_only() { crate::common::mock::isolated(|ctx| super::$mock_only(ctx)).unwrap(); } )*)?
        }
    };
    ($($name:ident),* $(,)?) => {
        $crate::common::on_both_backends!(local: [$($name),*], cross: []);
    };
}
#[allow(unused_imports)]
pub(crate) use on_both_backends;
