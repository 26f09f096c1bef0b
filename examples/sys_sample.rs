//! The documentation's sample of `aclnnBatchNormReduceBackward` (ops-nn
//! `examples/test_aclnn_batch_norm_reduce_backward.cpp`), written against the raw `ascend-sys`
//! calls in the same order (docs/cann/API.md section 1.5), running on the mock CANN toolkit.
//!
//! ```text
//! cargo run --features mock --example sys_sample
//! ```
//!
//! Prints sumDy=[7, 8], sumDyXmu=[21, 30], gradWeight=[21, 30], gradBias=[7, 8], then checks that
//! the mock has no live object left and saw no violation (exit code 1 otherwise).

use std::ffi::{c_void, CStr};
use std::process::ExitCode;
use std::ptr;

use ascend::mock;
use ascend_sys::{
    aclDataType, aclFormat, aclOpExecutor, aclTensor, aclrtMemMallocPolicy, aclrtMemcpyKind, aclrtStream,
};

/// Turns a nonzero status into an error naming the call and CANN's message.
fn check(cann: &ascend_sys::Cann, what: &str, status: i32) -> Result<(), String> {
    if status == 0 {
        return Ok(());
    }
    // SAFETY: aclGetRecentErrMsg takes no arguments; it returns null or a NUL-terminated string
    // valid until the next CANN call on this thread, copied out at once.
    let msg = unsafe {
        let p = cann.acl.aclGetRecentErrMsg();
        if p.is_null() {
            String::new()
        } else {
            CStr::from_ptr(p).to_string_lossy().into_owned()
        }
    };
    Err(format!("{what} failed: {status} {msg}"))
}

/// Row-major strides of a shape, in elements.
fn contiguous_strides(shape: &[i64]) -> Vec<i64> {
    let mut strides = vec![1i64; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1];
    }
    strides
}

fn run(cann: &ascend_sys::Cann) -> Result<[Vec<f32>; 4], String> {
    // The operator is resolved on first use (a toolkit without it fails here, naming it).
    let op = cann.operator(&ascend_sys::symbols::BATCH_NORM_REDUCE_BACKWARD).map_err(|e| e.to_string())?;
    let device = 0;
    // 1. aclInit -> aclrtSetDevice -> aclrtCreateStream
    // SAFETY (this block and the ones below): every call gets pointers to live locals of the right
    // type and sizes matching the buffers; handles come from the calls that created them.
    unsafe {
        check(cann, "aclInit", cann.acl.aclInit(ptr::null()))?;
        check(cann, "aclrtSetDevice", cann.acl.aclrtSetDevice(device))?;
    }
    let mut stream: aclrtStream = ptr::null_mut();
    // SAFETY: `stream` is a valid out-pointer.
    unsafe { check(cann, "aclrtCreateStream", cann.acl.aclrtCreateStream(&mut stream))? };

    // 2. the nine tensors: gradOut, input, mean, invstd, weight, sumDy, sumDyXmu, gradWeight, gradBias
    let grad_out = [1f32, 1., 1., 2., 2., 2., 3., 3.];
    let input = [0f32, 1., 2., 3., 4., 5., 6., 7.];
    let ones = [1f32, 1.];
    let shapes: [&[i64]; 9] = [&[4, 2], &[4, 2], &[2], &[2], &[2], &[2], &[2], &[2], &[2]];
    let host: [&[f32]; 9] = [&grad_out, &input, &ones, &ones, &ones, &ones, &ones, &ones, &ones];
    let mut dev = [ptr::null_mut::<c_void>(); 9];
    let mut tensors = [ptr::null_mut::<aclTensor>(); 9];
    for i in 0..9 {
        let bytes = std::mem::size_of_val(host[i]);
        let strides = contiguous_strides(shapes[i]);
        // SAFETY: `dev[i]` is a valid out-pointer; the copy reads `bytes` bytes of `host[i]` and
        // writes them into the fresh allocation of `bytes` bytes; the tensor describes exactly it.
        unsafe {
            check(
                cann,
                "aclrtMalloc",
                cann.acl.aclrtMalloc(&mut dev[i], bytes, aclrtMemMallocPolicy::ACL_MEM_MALLOC_HUGE_FIRST),
            )?;
            check(
                cann,
                "aclrtMemcpy",
                cann.acl.aclrtMemcpy(
                    dev[i],
                    bytes,
                    host[i].as_ptr().cast(),
                    bytes,
                    aclrtMemcpyKind::ACL_MEMCPY_HOST_TO_DEVICE,
                ),
            )?;
            tensors[i] = cann.nnopbase.aclCreateTensor(
                shapes[i].as_ptr(),
                shapes[i].len() as u64,
                aclDataType::ACL_FLOAT,
                strides.as_ptr(),
                0,
                aclFormat::ACL_FORMAT_ND,
                shapes[i].as_ptr(),
                shapes[i].len() as u64,
                dev[i],
            );
        }
        if tensors[i].is_null() {
            check(cann, "aclCreateTensor", -1)?;
        }
    }

    // 3. GetWorkspaceSize -> workspace only if > 0 -> launch -> synchronize
    let mut workspace_size = 0u64;
    let mut executor: *mut aclOpExecutor = ptr::null_mut();
    // SAFETY: the tensors are live handles; the two out-pointers are valid locals.
    unsafe {
        check(
            cann,
            "aclnnBatchNormReduceBackwardGetWorkspaceSize",
            op.aclnnBatchNormReduceBackwardGetWorkspaceSize(
                tensors[0],
                tensors[1],
                tensors[2],
                tensors[3],
                tensors[4],
                true,
                true,
                true,
                tensors[5],
                tensors[6],
                tensors[7],
                tensors[8],
                &mut workspace_size,
                &mut executor,
            ),
        )?;
    }
    let mut workspace: *mut c_void = ptr::null_mut();
    if workspace_size > 0 {
        // SAFETY: `workspace` is a valid out-pointer.
        unsafe {
            check(
                cann,
                "aclrtMalloc(workspace)",
                cann.acl.aclrtMalloc(
                    &mut workspace,
                    workspace_size as usize,
                    aclrtMemMallocPolicy::ACL_MEM_MALLOC_HUGE_FIRST,
                ),
            )?;
        }
    }
    // SAFETY: the executor comes from phase 1 and is consumed here; the workspace has the reported
    // size (or is null for 0); the stream is live.
    unsafe {
        check(
            cann,
            "aclnnBatchNormReduceBackward",
            op.aclnnBatchNormReduceBackward(workspace, workspace_size, executor, stream),
        )?;
        check(cann, "aclrtSynchronizeStream", cann.acl.aclrtSynchronizeStream(stream))?;
    }

    // 4. copy the four outputs back
    let mut outputs = [vec![0f32; 2], vec![0f32; 2], vec![0f32; 2], vec![0f32; 2]];
    for (k, out) in outputs.iter_mut().enumerate() {
        let bytes = std::mem::size_of_val(out.as_slice());
        // SAFETY: copies `bytes` bytes from the output's allocation into `out`, which holds that many.
        unsafe {
            check(
                cann,
                "aclrtMemcpy",
                cann.acl.aclrtMemcpy(
                    out.as_mut_ptr().cast(),
                    bytes,
                    dev[5 + k],
                    bytes,
                    aclrtMemcpyKind::ACL_MEMCPY_DEVICE_TO_HOST,
                ),
            )?;
        }
    }

    // 5. destroy the tensors, free the memory (and the workspace), destroy the stream, reset, finalize
    // SAFETY: each handle and pointer was created above and is released exactly once; the stream
    // was synchronized, so no queued work uses the memory.
    unsafe {
        for t in tensors {
            check(cann, "aclDestroyTensor", cann.nnopbase.aclDestroyTensor(t))?;
        }
        for p in dev {
            check(cann, "aclrtFree", cann.acl.aclrtFree(p))?;
        }
        if workspace_size > 0 {
            check(cann, "aclrtFree(workspace)", cann.acl.aclrtFree(workspace))?;
        }
        check(cann, "aclrtDestroyStream", cann.acl.aclrtDestroyStream(stream))?;
        check(cann, "aclrtResetDevice", cann.acl.aclrtResetDevice(device))?;
        check(cann, "aclFinalize", cann.acl.aclFinalize())?;
    }
    Ok(outputs)
}

fn fmt(v: &[f32]) -> String {
    let items: Vec<String> = v.iter().map(|x| x.to_string()).collect();
    format!("[{}]", items.join(", "))
}

fn main() -> ExitCode {
    let cann = match ascend_sys::load_from(mock::toolkit_dir()) {
        Ok(cann) => cann,
        Err(e) => {
            eprintln!("cannot load the mock CANN: {e}");
            return ExitCode::FAILURE;
        }
    };
    let [sum_dy, sum_dy_xmu, grad_weight, grad_bias] = match run(cann) {
        Ok(outputs) => outputs,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    println!("sumDy={}", fmt(&sum_dy));
    println!("sumDyXmu={}", fmt(&sum_dy_xmu));
    println!("gradWeight={}", fmt(&grad_weight));
    println!("gradBias={}", fmt(&grad_bias));

    let stats = mock::stats();
    let live = stats.live_allocations + stats.live_tensors + stats.live_executors + stats.live_streams;
    if live != 0 || stats.violations != 0 {
        eprintln!("the mock CANN reports leftovers or misuse: {stats:?} {:?}", mock::violations_since(0));
        return ExitCode::FAILURE;
    }
    let expected = [[7f32, 8.], [21., 30.], [21., 30.], [7., 8.]];
    if [&sum_dy, &sum_dy_xmu, &grad_weight, &grad_bias].iter().zip(expected).any(|(got, want)| got[..] != want) {
        eprintln!("unexpected values");
        return ExitCode::FAILURE;
    }
    println!("mock CANN: 0 live objects, 0 violations ({} device mallocs)", stats.device_mallocs);
    ExitCode::SUCCESS
}
