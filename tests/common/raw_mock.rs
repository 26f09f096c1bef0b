//! A raw session on the mock CANN through `ascend-sys`, for what the safe API cannot express
//! (null handles, int32 tensors, any counter shape): contiguous device tensors made with
//! `aclrtMalloc` + `aclCreateTensor`, destroyed and freed on drop. Use it inside
//! `common::mock::isolated` (which initialises ACL and checks that nothing leaked).
#![allow(dead_code)]

use std::ffi::c_void;
use std::ptr;

use ascend_sys::{aclDataType, aclFormat, aclTensor, aclrtMemMallocPolicy, aclrtMemcpyKind, Cann};

pub const F32: aclDataType = aclDataType::ACL_FLOAT;
pub const F16: aclDataType = aclDataType::ACL_FLOAT16;
pub const BF16: aclDataType = aclDataType::ACL_BF16;
pub const I32: aclDataType = aclDataType::ACL_INT32;

/// The session: device 0 bound on this thread, and every tensor made so far.
pub struct Raw {
    pub c: &'static Cann,
    held: Vec<(*mut aclTensor, *mut c_void, usize)>,
}

impl Raw {
    pub fn new() -> Raw {
        let c = ascend_sys::load_from(ascend::mock::toolkit_dir()).expect("the mock CANN loads");
        // SAFETY: device 0 exists on the mock; ACL was initialised by the isolated context.
        assert_eq!(unsafe { c.acl.aclrtSetDevice(0) }, 0);
        Raw { c, held: Vec::new() }
    }

    /// A contiguous device tensor of `dtype` and `shape` holding `bytes`.
    pub fn tensor(&mut self, dtype: aclDataType, shape: &[i64], bytes: &[u8]) -> *mut aclTensor {
        self.tensor_in(aclFormat::ACL_FORMAT_ND, dtype, shape, bytes)
    }

    /// [`tensor`](Raw::tensor) with storage format `format` (e.g. a private one, NC1HWC0).
    pub fn tensor_in(&mut self, format: aclFormat, dtype: aclDataType, shape: &[i64], bytes: &[u8]) -> *mut aclTensor {
        let mut mem = ptr::null_mut();
        if !bytes.is_empty() {
            let policy = aclrtMemMallocPolicy::ACL_MEM_MALLOC_HUGE_FIRST;
            // SAFETY: `mem` is a valid out-pointer.
            assert_eq!(unsafe { self.c.acl.aclrtMalloc(&mut mem, bytes.len(), policy) }, 0);
            let kind = aclrtMemcpyKind::ACL_MEMCPY_HOST_TO_DEVICE;
            // SAFETY: reads `bytes.len()` bytes of `bytes` into the fresh allocation of that size.
            let st = unsafe { self.c.acl.aclrtMemcpy(mem, bytes.len(), bytes.as_ptr().cast(), bytes.len(), kind) };
            assert_eq!(st, 0);
        }
        let mut strides = vec![1i64; shape.len()];
        for d in (0..shape.len().saturating_sub(1)).rev() {
            strides[d] = strides[d + 1] * shape[d + 1].max(1);
        }
        // SAFETY: shape/strides arrays of `shape.len()` elements, the storage is the allocation.
        let t = unsafe {
            self.c.nnopbase.aclCreateTensor(
                shape.as_ptr(),
                shape.len() as u64,
                dtype,
                strides.as_ptr(),
                0,
                format,
                shape.as_ptr(),
                shape.len() as u64,
                mem,
            )
        };
        assert!(!t.is_null(), "aclCreateTensor");
        self.held.push((t, mem, bytes.len()));
        t
    }

    /// An f32 tensor of `values`.
    pub fn f32s(&mut self, shape: &[i64], values: &[f32]) -> *mut aclTensor {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_ne_bytes()).collect();
        self.tensor(F32, shape, &bytes)
    }

    /// An f32 tensor of `values` in storage format `format`.
    pub fn f32s_in(&mut self, format: aclFormat, shape: &[i64], values: &[f32]) -> *mut aclTensor {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_ne_bytes()).collect();
        self.tensor_in(format, F32, shape, &bytes)
    }

    /// An int32 tensor of `values`.
    pub fn i32s(&mut self, shape: &[i64], values: &[i32]) -> *mut aclTensor {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_ne_bytes()).collect();
        self.tensor(I32, shape, &bytes)
    }

    /// A bf16 tensor of `values`.
    pub fn bf16s(&mut self, shape: &[i64], values: &[f32]) -> *mut aclTensor {
        let bytes: Vec<u8> = values.iter().flat_map(|&v| half::bf16::from_f32(v).to_ne_bytes()).collect();
        self.tensor(BF16, shape, &bytes)
    }

    /// The f32 contents of tensor `t` (made by this session) after the default stream finished.
    pub fn read_f32(&self, t: *mut aclTensor) -> Vec<f32> {
        let &(_, mem, len) = self.held.iter().find(|h| h.0 == t).expect("a tensor of this session");
        // SAFETY: the default stream exists on the bound device.
        assert_eq!(unsafe { self.c.acl.aclrtSynchronizeStream(ptr::null_mut()) }, 0);
        let mut out = vec![0u8; len];
        let kind = aclrtMemcpyKind::ACL_MEMCPY_DEVICE_TO_HOST;
        // SAFETY: writes `len` bytes into `out` from the allocation of that size.
        assert_eq!(unsafe { self.c.acl.aclrtMemcpy(out.as_mut_ptr().cast(), len, mem, len, kind) }, 0);
        out.chunks_exact(4).map(|b| f32::from_ne_bytes([b[0], b[1], b[2], b[3]])).collect()
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        // SAFETY: the default stream exists; then each tensor and allocation is released once.
        unsafe {
            self.c.acl.aclrtSynchronizeStream(ptr::null_mut());
            for &(t, mem, _) in &self.held {
                self.c.nnopbase.aclDestroyTensor(t);
                if !mem.is_null() {
                    self.c.acl.aclrtFree(mem);
                }
            }
        }
    }
}
