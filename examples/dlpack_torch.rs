//! DLPack with PyTorch in one process, on the CPU backend: a torch tensor (a transposed view)
//! goes to Rust as torch's capsules (legacy `DLManagedTensor` and versioned), and Rust tensors go
//! to torch (`torch.from_dlpack` of our capsules), values checked on both sides and every
//! deleter called by its consumer. It embeds the Python of a PyTorch environment:
//!
//! ```sh
//! cargo run --example dlpack_torch -- /path/to/venv/bin/python
//! ```
//!
//! The Ascend path is the same with torch_npu (its capsules are `kDLExtDev`), which needs an NPU.

use std::ffi::{c_char, c_int, CString};
use std::process::Command;

use ascend::{Context, Tensor};

type PyInit = unsafe extern "C" fn(c_int);
type PyRun = unsafe extern "C" fn(*const c_char) -> c_int;

/// `python -c code`'s output, trimmed.
fn ask(python: &str, code: &str) -> String {
    let out = Command::new(python).args(["-c", code]).output().expect("runs the Python executable");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Runs Python source in `__main__`; panics if it raised.
fn run(py_run: PyRun, code: &str) {
    let code = CString::new(code).expect("no NUL in the source");
    // SAFETY: the interpreter is initialised and `code` is a NUL-terminated string.
    assert_eq!(unsafe { py_run(code.as_ptr()) }, 0, "the Python code raised (see above)");
}

fn env_usize(name: &str) -> usize {
    std::env::var(name).expect("set by the Python code").parse().expect("an address")
}

fn main() -> ascend::Result<()> {
    let Some(python) = std::env::args().nth(1) else {
        println!("usage: dlpack_torch /path/to/venv/bin/python (an environment with PyTorch)");
        return Ok(());
    };
    let lib = ask(
        &python,
        "import sysconfig, os; print(os.path.join(sysconfig.get_config_var('LIBDIR'), \
         sysconfig.get_config_var('LDLIBRARY')))",
    );
    let home = ask(&python, "import sys; print(sys.base_prefix)");
    let site = ask(&python, "import site; print(site.getsitepackages()[0])");
    std::env::set_var("PYTHONHOME", &home);
    // SAFETY: loading libpython runs no initialiser beyond the C runtime's; RTLD_GLOBAL so that
    // the extension modules torch loads find the interpreter's symbols.
    let lib = unsafe {
        libloading::os::unix::Library::open(
            Some(&lib),
            libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_GLOBAL,
        )
    }
    .expect("libpython loads");
    // SAFETY: the C API's signatures: `void Py_InitializeEx(int)`, `int PyRun_SimpleString(const char *)`.
    let (init, py_run): (PyInit, PyRun) = unsafe {
        (*lib.get::<PyInit>(b"Py_InitializeEx\0").unwrap(), *lib.get::<PyRun>(b"PyRun_SimpleString\0").unwrap())
    };
    // SAFETY: once, before any other call into the interpreter.
    unsafe { init(0) };
    run(
        py_run,
        &format!(
            r#"
import sys, os, ctypes
sys.path.insert(0, {site:?})
import torch
api = ctypes.pythonapi
api.PyCapsule_GetPointer.restype = ctypes.c_void_p
api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
api.PyCapsule_New.restype = ctypes.py_object
api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]

def hand_over(cap, name):
    # What a consumer does with a capsule it takes: read the pointer, rename it so that the
    # capsule's destructor no longer calls the deleter (the consumer will).
    addr = api.PyCapsule_GetPointer(cap, name)
    api.PyCapsule_SetName(cap, b"used_" + name)
    return str(addr)

x = torch.arange(12, dtype=torch.float32).reshape(3, 4).t()   # shape [4, 3], strides [1, 4]
os.environ["LEGACY"] = hand_over(x.__dlpack__(), b"dltensor")
os.environ["VERSIONED"] = hand_over(x.__dlpack__(max_version=(1, 0)), b"dltensor_versioned")
print("torch", torch.__version__, "exported", tuple(x.shape), x.stride())
"#
        ),
    );
    let cpu = Context::cpu().new_stream()?;
    let expect: Vec<f32> = (0..4).flat_map(|i| (0..3).map(move |j| (4 * j + i) as f32)).collect();
    // SAFETY: live capsules torch made and handed over (renamed `used_*` on the Python side).
    let legacy = unsafe { Tensor::from_dlpack_legacy(&cpu, env_usize("LEGACY") as *mut _) }?;
    // SAFETY: as above.
    let versioned = unsafe { Tensor::from_dlpack(&cpu, env_usize("VERSIONED") as *mut _) }?;
    for t in [&legacy, &versioned] {
        assert_eq!(t.shape(), [4, 3]);
        assert_eq!(t.to_vec::<f32>(&cpu)?, expect);
    }
    println!("rust: imported torch's legacy and versioned capsules: {:?}", legacy.to_vec::<f32>(&cpu)?);

    let ours = Tensor::from_slice_strided(&cpu, &[1f32, 2., 3., 4., 5., 6., 7., 8.], &[2, 3], &[4, 1], 1)?;
    let versioned = ours.to_dlpack(&cpu)?.into_raw() as usize;
    let legacy = ours.to_dlpack(&cpu)?.into_raw_legacy() as usize;
    run(
        py_run,
        &format!(
            r#"
for addr, name in [({versioned}, b"dltensor_versioned"), ({legacy}, b"dltensor")]:
    cap = api.PyCapsule_New(addr, name, None)
    y = torch.from_dlpack(cap)
    assert y.tolist() == [[2.0, 3.0, 4.0], [6.0, 7.0, 8.0]], y
    print("torch: imported rust's", name.decode(), "capsule:", y.tolist())
    del y, cap   # torch calls our deleter
"#
        ),
    );
    println!("ok");
    Ok(())
}
