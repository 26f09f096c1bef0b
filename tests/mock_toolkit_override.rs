//! `ASCEND_MOCK_TOOLKIT_DIR` at run time points `ascend::mock` at a relocated copy of the mock
//! toolkit (test binaries run away from their build tree). One test per binary: it sets the
//! process environment before the mock is first used.
#![cfg(feature = "mock")]

use std::path::{Path, PathBuf};

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

#[test]
fn the_mock_runs_from_a_copy_named_by_the_environment() {
    let built = PathBuf::from(env!("ASCEND_MOCK_TOOLKIT_DIR"));
    let copy = std::env::temp_dir().join(format!("ascend-mock-relocated-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&copy);
    copy_dir(&built, &copy);
    // This binary has this one test: no other thread reads the environment meanwhile.
    std::env::set_var("ASCEND_MOCK_TOOLKIT_DIR", &copy);
    assert_eq!(ascend::mock::toolkit_dir(), copy.as_path());

    let ctx = ascend::mock::context(0).unwrap();
    let s = ctx.new_stream().unwrap();
    let data = [1.5f32, -2.25, 3.0, 0.125];
    let t = ascend::Tensor::from_slice(&s, &data, &[4]).unwrap();
    assert_eq!(t.to_vec::<f32>(&s).unwrap(), data);
    // The library the process loaded is the copy's, not the build tree's.
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    assert!(maps.contains(&format!("{}/lib64/libascendcl.so", copy.display())), "copy not loaded");
    drop((t, s, ctx));
    let _ = std::fs::remove_dir_all(&copy);
}
