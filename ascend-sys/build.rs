//! Build script of `ascend-sys`.
//!
//! Default builds need neither CANN nor libclang: the bindings in `src/bindings/` are committed.
//! With the `bindgen` feature the bindings are generated from `wrapper.h` into `OUT_DIR` and used
//! instead; against the real CANN headers when `ASCEND_TOOLKIT_HOME` or `ASCEND_HOME_PATH` holds
//! them, else against `wrapper.h`'s own declarations. `scripts/generate-bindings.sh` sets
//! `ASCEND_SYS_WRITE_BINDINGS` to copy the result back into `src/bindings/`.

#[cfg(feature = "bindgen")]
use std::{env, path::PathBuf};

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=wrapper.h");
    println!("cargo:rerun-if-changed=src/symbols.rs");
    println!("cargo::rustc-check-cfg=cfg(ascend_sys_generated)");

    #[cfg(feature = "bindgen")]
    generate::run(&PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR")));
}

#[cfg(feature = "bindgen")]
mod generate {
    use std::env;
    use std::fs;
    use std::path::{Path, PathBuf};

    include!("src/symbols.rs");

    /// The functions each library exports (docs/cann/API.md section 5.1), bound as one loader struct each
    /// (file, struct, functions, every function required when the library loads). The op
    /// libraries' functions are optional: each operator is checked when it is first used.
    fn libraries() -> Vec<(&'static str, &'static str, Vec<&'static str>, bool)> {
        let ops = OPERATORS.iter().flat_map(|o| [o.phase1, o.name]).collect();
        vec![
            ("ascendcl.rs", "AscendCl", ASCENDCL_SYMBOLS.to_vec(), true),
            ("capture.rs", "AclCapture", ASCENDCL_CAPTURE_SYMBOLS.to_vec(), false),
            ("nnopbase.rs", "NnOpBase", NNOPBASE_SYMBOLS.to_vec(), true),
            ("opapi.rs", "OpApi", ops, false),
            ("hccl.rs", "Hccl", HCCL_SYMBOLS.iter().chain(HCCL_OPTIONAL_SYMBOLS).copied().collect(), false),
        ]
    }

    const TYPES: &[&str] = &[
        "aclError",
        "aclFloat16",
        "aclrtStream",
        "aclrtEvent",
        "aclrtContext",
        "aclOpExecutor",
        "aclTensor",
        "aclBoolArray",
        "aclnnStatus",
        "aclDataType",
        "aclFormat",
        "aclrtMemcpyKind",
        "aclrtMemMallocPolicy",
        "aclSysParamOpt",
        "aclrtEventRecordedStatus",
        "aclmdlRI",
        "aclmdlRICaptureMode",
        "aclmdlRICaptureStatus",
        "HcclComm",
        "HcclRootInfo",
        "HcclResult",
        "HcclDataType",
        "HcclReduceOp",
    ];

    fn toolkit_include() -> Option<PathBuf> {
        for var in ["ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH"] {
            println!("cargo:rerun-if-env-changed={var}");
            if let Some(root) = env::var_os(var) {
                let inc = Path::new(&root).join("include");
                // Every header wrapper.h includes (tests/headers.rs checks the two lists agree).
                let mut headers = BASE_HEADERS.iter().chain(OPERATORS.iter().map(|o| &o.header));
                if headers.all(|h| inc.join(h).is_file()) {
                    return Some(inc);
                }
            }
        }
        None
    }

    fn builder(manifest_dir: &Path, include: &Option<PathBuf>) -> bindgen::Builder {
        let mut b = bindgen::Builder::default()
            .header(manifest_dir.join("wrapper.h").to_string_lossy())
            .clang_args(["-x", "c++", "-std=c++14"])
            .default_enum_style(bindgen::EnumVariation::NewType { is_bitfield: false, is_global: false })
            .prepend_enum_name(false)
            .derive_default(false)
            .layout_tests(true)
            .generate_comments(false)
            .merge_extern_blocks(true);
        if let Some(inc) = include {
            b = b
                .clang_arg(format!("-I{}", inc.display()))
                .clang_arg(format!("-I{}", inc.join("aclnn").display()))
                .clang_arg("-DASCEND_SYS_USE_CANN_HEADERS");
        }
        b
    }

    pub fn run(manifest_dir: &Path) {
        println!("cargo:rerun-if-env-changed=ASCEND_SYS_WRITE_BINDINGS");
        println!("cargo:rustc-cfg=ascend_sys_generated");
        let include = toolkit_include();
        let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR")).join("bindings");
        fs::create_dir_all(&out_dir).expect("create OUT_DIR/bindings");

        let mut types = builder(manifest_dir, &include);
        for t in TYPES {
            types = types.allowlist_type(t);
        }
        let mut outputs = vec![("types.rs", types.generate().expect("bindgen: types"))];

        for (file, name, functions, require_all) in libraries() {
            let mut b = builder(manifest_dir, &include)
                .allowlist_recursively(false)
                .dynamic_library_name(name)
                .dynamic_link_require_all(require_all);
            for f in functions {
                b = b.allowlist_function(f);
            }
            outputs.push((file, b.generate().unwrap_or_else(|e| panic!("bindgen: {name}: {e}"))));
        }

        let copy_to = env::var_os("ASCEND_SYS_WRITE_BINDINGS").map(PathBuf::from);
        for (file, bindings) in outputs {
            bindings.write_to_file(out_dir.join(file)).expect("write bindings");
            if let Some(dir) = &copy_to {
                bindings.write_to_file(dir.join(file)).expect("write bindings to ASCEND_SYS_WRITE_BINDINGS");
            }
        }
    }
}
