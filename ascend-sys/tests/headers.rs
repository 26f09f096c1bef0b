//! One list of toolkit headers: the `#include`s of `wrapper.h`'s toolkit branch (the one bindgen
//! reads against a real CANN) are exactly `symbols::BASE_HEADERS` and every operator's
//! `Operator::header`, the list the `bindgen` build probes the toolkit for. Adding an operator
//! to `symbols::OPERATORS` without its include (or the other way round) fails here.

use ascend_sys::symbols::{BASE_HEADERS, OPERATORS};
use ascend_sys::WRAPPER_H;

/// The quoted `#include`s between `#if defined(ASCEND_SYS_USE_CANN_HEADERS)` and its `#else`.
fn toolkit_includes() -> Vec<&'static str> {
    let start = WRAPPER_H.find("#if defined(ASCEND_SYS_USE_CANN_HEADERS)").expect("wrapper.h has the toolkit branch");
    let branch = &WRAPPER_H[start..];
    let branch = &branch[..branch.find("\n#else").expect("the toolkit branch ends with #else")];
    branch.lines().filter_map(|l| l.trim().strip_prefix("#include")).map(|rest| rest.trim().trim_matches('"')).collect()
}

#[test]
fn wrapper_includes_are_the_symbols_headers() {
    let mut included = toolkit_includes();
    let mut listed: Vec<&str> = BASE_HEADERS.iter().copied().chain(OPERATORS.iter().map(|o| o.header)).collect();
    assert!(included.len() > OPERATORS.len(), "the parser found only {included:?}: wrapper.h changed shape");
    included.sort_unstable();
    listed.sort_unstable();
    assert_eq!(included, listed, "wrapper.h's toolkit includes vs symbols::BASE_HEADERS + Operator::header");
}

#[test]
fn every_operator_has_its_own_aclnnop_header() {
    for op in OPERATORS {
        assert!(op.header.starts_with("aclnnop/aclnn_") && op.header.ends_with(".h"), "{}: {}", op.name, op.header);
        let others = OPERATORS.iter().filter(|o| o.header == op.header).count();
        assert_eq!(others, 1, "{} shares its header {} with another operator", op.name, op.header);
    }
}
