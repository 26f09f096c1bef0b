//! Build script of `ascend`.
//!
//! Without the `mock` feature it does nothing. With it, it compiles the mock CANN toolkit (the C
//! sources in `mock/`) with the `cc` crate's compiler into `$OUT_DIR/mock-cann/lib64/`
//! (`libascendcl.so`, `libnnopbase.so`, `libopapi.so`; the latter two link to the first, found
//! next to them through `$ORIGIN`), and exports that toolkit root to the crate as the compile-time
//! variable `ASCEND_MOCK_TOOLKIT_DIR` (read by `ascend::mock::toolkit_dir`).

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "mock")]
    mock::build();
}

#[cfg(feature = "mock")]
mod mock {
    use std::env;
    use std::fs;
    use std::path::{Path, PathBuf};
    use std::process::Command;

    /// Sources and headers of the mock, relative to the crate root.
    const SOURCES: [&str; 5] =
        ["mock/acl.c", "mock/nnopbase.c", "mock/opapi.c", "mock/mock_internal.h", "mock/ascend_mock.h"];

    /// (library, source, links to libascendcl).
    const LIBRARIES: [(&str, &str, bool); 3] = [
        ("libascendcl.so", "mock/acl.c", false),
        ("libnnopbase.so", "mock/nnopbase.c", true),
        ("libopapi.so", "mock/opapi.c", true),
    ];

    const CFLAGS: [&str; 11] = [
        "-shared",
        "-fPIC",
        "-std=c11",
        "-O2",
        "-g",
        "-Wall",
        "-Wextra",
        "-pthread",
        "-fvisibility=hidden",
        // Keep f32 arithmetic exactly as written (no fused multiply-add): results are bit-reproducible.
        "-ffp-contract=off",
        "-Wl,-z,defs",
    ];

    pub fn build() {
        let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
        let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
        for src in SOURCES {
            println!("cargo:rerun-if-changed={src}");
        }
        println!("cargo:rerun-if-env-changed=DEP_ASCEND_SYS_CANN_INCLUDE");
        // Warnings are errors in this project's CI, not in users' builds (a newer compiler may
        // warn about more).
        println!("cargo:rerun-if-env-changed=ASCEND_MOCK_WERROR");
        let werror = env::var_os("ASCEND_MOCK_WERROR").is_some_and(|v| v == "1");
        // ascend-sys (links = "ascend_sys_cann") exports the directory of wrapper.h.
        let include = env::var_os("DEP_ASCEND_SYS_CANN_INCLUDE")
            .map(PathBuf::from)
            .unwrap_or_else(|| manifest.join("ascend-sys"));
        println!("cargo:rerun-if-changed={}", include.join("wrapper.h").display());

        let root = out.join("mock-cann");
        let lib64 = root.join("lib64");
        fs::create_dir_all(&lib64).unwrap_or_else(|e| panic!("create {}: {e}", lib64.display()));

        let compiler = cc::Build::new().get_compiler();
        for (name, src, links_acl) in LIBRARIES {
            let target = lib64.join(name);
            let mut cmd = compiler.to_command();
            cmd.args(CFLAGS)
                .args(werror.then_some("-Werror"))
                .arg(format!("-I{}", include.display()))
                .arg(format!("-I{}", manifest.join("mock").display()))
                .arg(format!("-Wl,-soname,{name}"))
                .arg("-o")
                .arg(&target)
                .arg(manifest.join(src));
            if links_acl {
                cmd.arg(format!("-L{}", lib64.display())).arg("-lascendcl").arg("-Wl,-rpath,$ORIGIN");
            }
            run(cmd, &target);
        }
        println!("cargo:rustc-env=ASCEND_MOCK_TOOLKIT_DIR={}", root.display());
    }

    fn run(mut cmd: Command, target: &Path) {
        let output = cmd.output().unwrap_or_else(|e| panic!("mock CANN: cannot run the C compiler ({cmd:?}): {e}"));
        if !output.status.success() {
            panic!(
                "mock CANN: building {} failed ({cmd:?}):\n{}{}",
                target.display(),
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
        }
    }
}
