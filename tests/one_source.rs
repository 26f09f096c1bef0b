//! The mock CANN and the Rust crate share their facts: every status code the mock's C sources
//! name has the value `ascend_sys::status` gives it, and the mock libraries export exactly the
//! functions `ascend_sys::symbols` binds (the mock's fault-injection list is generated from the
//! same list by build.rs).
#![cfg(feature = "mock")]

use std::path::Path;
use std::process::Command;

/// `NAME = value` pairs of the C sources' status enums (`ACL_*`, `ACLNN_*`, `HCCL_*`).
fn c_codes(source: &str) -> Vec<(String, i64)> {
    let mut out = Vec::new();
    for line in source.lines() {
        let line = line.trim().trim_end_matches(',');
        let Some((name, value)) = line.split_once(" = ") else { continue };
        let name = name.trim();
        let is_code = (name.starts_with("ACL_ERROR") || name.starts_with("ACLNN_ERR") || name == "ACLNN_SUCCESS")
            && name.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
        if let (true, Ok(v)) = (is_code, value.trim().parse::<i64>()) {
            out.push((name.to_string(), v));
        }
    }
    out
}

#[test]
fn mock_status_codes_are_the_crates() {
    let mock = Path::new(env!("CARGO_MANIFEST_DIR")).join("mock");
    let mut files = vec![mock.join("mock_internal.h"), mock.join("nnopbase.c"), mock.join("opapi.h")];
    for dir in ["acl", "ops"] {
        for e in std::fs::read_dir(mock.join(dir)).unwrap() {
            files.push(e.unwrap().path());
        }
    }
    let mut seen = 0;
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        for (name, value) in c_codes(&text) {
            let rust = ascend_sys::status::ALL.iter().find(|(_, n)| *n == name).map(|(v, _)| i64::from(*v));
            let rust = rust.or((name == "ACLNN_SUCCESS").then_some(0));
            assert_eq!(rust, Some(value), "{}: {name} = {value}, ascend_sys::status says {rust:?}", f.display());
            seen += 1;
        }
    }
    assert!(seen >= 15, "the parser found only {seen} codes: the C sources changed shape");
}

/// The dynamic symbols a library defines (`nm -D --defined-only`).
fn exported(lib: &Path) -> Vec<String> {
    let out = Command::new("nm").args(["-D", "--defined-only"]).arg(lib).output().expect("nm (binutils) runs");
    assert!(out.status.success(), "nm {}: {}", lib.display(), String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2).map(str::to_string))
        .collect()
}

#[test]
fn mock_libraries_export_exactly_the_bound_functions() {
    use ascend_sys::symbols::{
        ASCENDCL_CAPTURE_SYMBOLS, ASCENDCL_SYMBOLS, HCCL_OPTIONAL_SYMBOLS, HCCL_SYMBOLS, NNOPBASE_SYMBOLS, OPERATORS,
    };
    let lib64 = ascend::mock::toolkit_dir().join("lib64");
    let ops: Vec<&str> = OPERATORS.iter().flat_map(|o| [o.phase1, o.name]).collect();
    let hccl: Vec<&str> = HCCL_SYMBOLS.iter().chain(HCCL_OPTIONAL_SYMBOLS).copied().collect();
    let acl: Vec<&str> = ASCENDCL_SYMBOLS.iter().chain(ASCENDCL_CAPTURE_SYMBOLS).copied().collect();
    for (lib, bound) in [
        ("libascendcl.so", &acl[..]),
        ("libnnopbase.so", NNOPBASE_SYMBOLS),
        ("libopapi.so", &ops[..]),
        ("libhccl.so", &hccl[..]),
    ] {
        let names = exported(&lib64.join(lib));
        for f in bound {
            assert!(names.iter().any(|n| n == f), "{lib} does not export {f}");
        }
        // Besides the bound API, only the mock's own introspection functions.
        let api_prefixes = ["acl", "Hccl"];
        for n in &names {
            let is_api = api_prefixes.iter().any(|p| n.starts_with(p));
            assert!(
                !is_api || bound.contains(&n.as_str()),
                "{lib} exports {n}, which ascend_sys::symbols does not bind"
            );
        }
    }
}
