//! `Context::auto()` with a toolkit variable naming an unusable CANN: it still falls back to the
//! CPU (the documented default), and `Context::auto_reason()` says why. One test per binary: it
//! sets process environment variables.

use ascend::{Backend, Context, Error};

#[test]
fn auto_keeps_the_reason_it_fell_back_although_a_toolkit_was_named() {
    let missing = std::env::temp_dir().join("ascend-auto-fallback-no-such-toolkit");
    assert!(!missing.exists());
    // SAFETY of the environment change: this binary has this one test, so no other thread reads
    // the environment meanwhile.
    std::env::remove_var(ascend::BACKEND_ENV);
    std::env::remove_var("ASCEND_HOME_PATH");
    std::env::set_var("ASCEND_TOOLKIT_HOME", &missing);
    assert!(Context::auto_reason().is_none(), "no reason before any call");

    let ctx = Context::auto().unwrap();
    assert_eq!(ctx.backend(), Backend::Cpu);
    let reason = Context::auto_reason().expect("a fallback keeps its reason");
    assert!(matches!(reason, Error::Load(_)), "{reason:?}");
    let text = reason.to_string();
    assert!(text.contains(&missing.display().to_string()), "the reason names the path tried: {text}");

    // The strict form returns that error instead of falling back.
    std::env::set_var(ascend::BACKEND_ENV, "ascend");
    let strict = Context::auto().unwrap_err();
    assert!(matches!(strict, Error::Load(_)), "{strict:?}");
    std::env::remove_var(ascend::BACKEND_ENV);
}
