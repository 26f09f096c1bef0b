//! Host test data: values exactly representable in their dtype, in any strided layout, that
//! upload themselves as a [`Tensor`] and feed the f64 references; reading tensors back.
#![allow(dead_code)]

use ascend::{bf16, f16, DType, Result, Stream, Tensor};

use super::rng::Rng;

/// `v` rounded (to nearest even) to `dtype`, widened back to f64.
pub fn round_to(dtype: DType, v: f64) -> f64 {
    match dtype {
        DType::F32 => f64::from(v as f32),
        DType::F16 => f16::from_f64(v).to_f64(),
        DType::BF16 => bf16::from_f64(v).to_f64(),
        _ => v.round(), // i32
    }
}

pub const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

/// Every `[DType; N]` of [`DTYPES`], the last varying fastest (the order of N nested loops).
pub fn dtype_tuples<const N: usize>() -> impl Iterator<Item = [DType; N]> {
    (0..DTYPES.len().pow(N as u32)).map(|mut k| {
        let mut t = [DType::F32; N];
        for d in t.iter_mut().rev() {
            *d = DTYPES[k % DTYPES.len()];
            k /= DTYPES.len();
        }
        t
    })
}

/// Every pair of an item of `a` and one of `b`, `b` varying fastest.
pub fn product<A: Copy, B: Copy, const M: usize>(
    a: impl IntoIterator<Item = A>,
    b: [B; M],
) -> impl Iterator<Item = (A, B)> {
    a.into_iter().flat_map(move |x| b.map(|y| (x, y)))
}

/// Row-major strides of `shape`, in elements.
pub fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![0; shape.len()];
    let mut acc = 1;
    for (s, &d) in strides.iter_mut().zip(shape).rev() {
        *s = acc;
        acc *= d.max(1);
    }
    strides
}

/// Calls `f` with every multi-index of `shape` in row-major order.
pub fn for_each_index(shape: &[usize], mut f: impl FnMut(&[usize])) {
    if shape.contains(&0) {
        return;
    }
    let mut idx = vec![0; shape.len()];
    loop {
        f(&idx);
        let mut k = shape.len();
        loop {
            if k == 0 {
                return;
            }
            k -= 1;
            idx[k] += 1;
            if idx[k] < shape[k] {
                break;
            }
            idx[k] = 0;
        }
    }
}

/// Host test data: a strided view (`shape`, `strides`, `offset`, in elements) over `storage`,
/// whose values are all exactly representable in `dtype` (so the reference sees exactly what
/// the backend sees).
#[derive(Clone, Debug, PartialEq)]
pub struct Data {
    pub dtype: DType,
    pub storage: Vec<f64>,
    pub shape: Vec<usize>,
    pub strides: Vec<usize>,
    pub offset: usize,
}

impl Data {
    /// A contiguous view of `values` (rounded to `dtype`).
    pub fn new(dtype: DType, values: &[f64], shape: &[usize]) -> Self {
        assert_eq!(values.len(), shape.iter().product::<usize>(), "values vs shape {shape:?}");
        Self::strided(dtype, values, shape, &contiguous_strides(shape), 0)
    }

    /// A strided view of `storage` (rounded to `dtype`).
    pub fn strided(dtype: DType, storage: &[f64], shape: &[usize], strides: &[usize], offset: usize) -> Self {
        Data {
            dtype,
            storage: storage.iter().map(|&v| round_to(dtype, v)).collect(),
            shape: shape.to_vec(),
            strides: strides.to_vec(),
            offset,
        }
    }

    /// Every element `v`.
    pub fn filled(dtype: DType, shape: &[usize], v: f64) -> Self {
        Self::new(dtype, &vec![v; shape.iter().product()], shape)
    }

    /// Elements uniform in [lo, hi).
    pub fn uniform(rng: &mut Rng, dtype: DType, shape: &[usize], lo: f64, hi: f64) -> Self {
        let v: Vec<f64> = (0..shape.iter().product::<usize>()).map(|_| rng.uniform(lo, hi)).collect();
        Self::new(dtype, &v, shape)
    }

    /// Elements N(mu, sigma²).
    pub fn normal(rng: &mut Rng, dtype: DType, shape: &[usize], mu: f64, sigma: f64) -> Self {
        let v: Vec<f64> = (0..shape.iter().product::<usize>()).map(|_| mu + sigma * rng.normal()).collect();
        Self::new(dtype, &v, shape)
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// The storage index of element `idx`.
    pub fn index(&self, idx: &[usize]) -> usize {
        self.offset + idx.iter().zip(&self.strides).map(|(i, s)| i * s).sum::<usize>()
    }

    pub fn get(&self, idx: &[usize]) -> f64 {
        self.storage[self.index(idx)]
    }

    /// The view's elements in row-major order.
    pub fn values(&self) -> Vec<f64> {
        let mut v = Vec::with_capacity(self.numel());
        for_each_index(&self.shape, |i| v.push(self.get(i)));
        v
    }

    /// The same dtype and logical values, contiguous.
    pub fn contiguous(&self) -> Data {
        Data::new(self.dtype, &self.values(), &self.shape)
    }

    /// The same dtype and logical values, contiguous, but for the row-major elements at the given
    /// positions, replaced (e.g. to plant NaN and infinities).
    pub fn with_values_at(&self, replaced: &[(usize, f64)]) -> Data {
        let mut v = self.values();
        for &(k, value) in replaced {
            v[k] = value;
        }
        Data::new(self.dtype, &v, &self.shape)
    }

    /// The same values converted to `dtype` (rounded).
    pub fn cast(&self, dtype: DType) -> Data {
        Data::strided(dtype, &self.storage, &self.shape, &self.strides, self.offset)
    }

    /// The same logical values, laid out in storage with the dims in `order` (outermost first):
    /// `[0, 2, 3, 1]` is channels-last for rank 4, `[2, 1, 0]` a transpose for rank 3.
    pub fn permuted(&self, order: &[usize]) -> Data {
        assert_eq!(order.len(), self.shape.len());
        let storage_shape: Vec<usize> = order.iter().map(|&d| self.shape[d]).collect();
        let storage_strides = contiguous_strides(&storage_shape);
        let mut strides = vec![0; order.len()];
        for (j, &d) in order.iter().enumerate() {
            strides[d] = storage_strides[j];
        }
        let mut out =
            Data { dtype: self.dtype, storage: vec![0.0; self.numel()], shape: self.shape.clone(), strides, offset: 0 };
        for_each_index(&self.shape, |i| {
            let k = out.index(i);
            out.storage[k] = self.get(i);
        });
        out
    }

    /// The same logical values, each element `stride` apart in a contiguous-order storage that
    /// starts at `offset`; the gaps hold `fill`.
    pub fn spread(&self, stride: usize, offset: usize, fill: f64) -> Data {
        let base = contiguous_strides(&self.shape);
        let strides: Vec<usize> = base.iter().map(|s| s * stride).collect();
        let len = offset + (self.numel().max(1) - 1) * stride + 1 + stride;
        let mut out = Data {
            dtype: self.dtype,
            storage: vec![round_to(self.dtype, fill); len],
            shape: self.shape.clone(),
            strides,
            offset,
        };
        for_each_index(&self.shape, |i| {
            let k = out.index(i);
            out.storage[k] = self.get(i);
        });
        out
    }

    /// Uploads the data as a tensor on `stream` (`Tensor::from_slice_strided` in its dtype).
    pub fn tensor(&self, stream: &Stream) -> Result<Tensor> {
        let (shape, strides, offset) = (&self.shape[..], &self.strides[..], self.offset);
        match self.dtype {
            DType::F32 => {
                let s: Vec<f32> = self.storage.iter().map(|&v| v as f32).collect();
                Tensor::from_slice_strided(stream, &s, shape, strides, offset)
            }
            DType::F16 => {
                let s: Vec<f16> = self.storage.iter().map(|&v| f16::from_f64(v)).collect();
                Tensor::from_slice_strided(stream, &s, shape, strides, offset)
            }
            DType::BF16 => {
                let s: Vec<bf16> = self.storage.iter().map(|&v| bf16::from_f64(v)).collect();
                Tensor::from_slice_strided(stream, &s, shape, strides, offset)
            }
            _ => {
                let s: Vec<i32> = self.storage.iter().map(|&v| v.round() as i32).collect();
                Tensor::from_slice_strided(stream, &s, shape, strides, offset)
            }
        }
    }
}

/// A tensor's elements (row-major), widened exactly to f64 (through `to_vec::<f32>`).
pub fn read(stream: &Stream, t: &Tensor) -> Vec<f64> {
    t.to_vec::<f32>(stream).expect("to_vec").into_iter().map(f64::from).collect()
}

/// Asserts that `out` has `shape` and `dtype` (naming `what`), and reads it as [`read`] does.
pub fn read_checked(s: &Stream, what: &str, out: &Tensor, shape: &[usize], dtype: DType) -> Vec<f64> {
    assert_eq!(out.shape(), shape, "{what}: shape");
    assert_eq!(out.dtype(), dtype, "{what}: dtype");
    read(s, out)
}

/// A tensor's elements as the raw bits of its own dtype, for bit-exact comparisons.
pub fn bits(stream: &Stream, t: &Tensor) -> Vec<u32> {
    match t.dtype() {
        DType::F32 => t.to_vec::<f32>(stream).expect("to_vec").into_iter().map(f32::to_bits).collect(),
        DType::F16 => t.to_vec::<f16>(stream).expect("to_vec").into_iter().map(|v| u32::from(v.to_bits())).collect(),
        DType::BF16 => t.to_vec::<bf16>(stream).expect("to_vec").into_iter().map(|v| u32::from(v.to_bits())).collect(),
        _ => t.to_vec::<i32>(stream).expect("to_vec").into_iter().map(|v| v as u32).collect(),
    }
}

/// ACLNN_ERR_PARAM_NULLPTR: a required argument is null. (aclnn's codes are written out here,
/// independently of the crate's own constants.)
pub const NULLPTR: i32 = 161001;
/// ACLNN_ERR_PARAM_INVALID: an argument CANN refuses.
pub const INVALID: i32 = 161002;

/// An error's aclnn status, with the error shown when it has none.
pub fn status_of<T: std::fmt::Debug>(r: Result<T>) -> i32 {
    match r {
        Ok(v) => panic!("expected an error, got Ok({v:?})"),
        Err(e) => e.status().unwrap_or_else(|| panic!("error without a status: {e:?}")),
    }
}

/// Asserts an `InvalidArgument` error with status 161002 (ACLNN_ERR_PARAM_INVALID) naming
/// `argument`.
pub fn expect_invalid<T: std::fmt::Debug>(what: &str, r: Result<T>, argument: &str) {
    match r {
        Err(ascend::Error::InvalidArgument { argument: a, status, message }) => {
            assert_eq!(status, 161002, "{what}: status for `{a}`: {message}");
            assert_eq!(a, argument, "{what}: argument ({message})");
        }
        other => panic!("{what}: expected InvalidArgument 161002 naming `{argument}`, got {other:?}"),
    }
}

/// `uploaded!(case, s => Up { x, mean; optional: weight; copied: eps })`: `Ok(Up { .. })` with
/// each listed field of `case` on stream `s`: a [`Data`] as its tensor, an optional one (after
/// `optional:`) as an optional tensor, a scalar (after `copied:`) as it is; `?` on each upload.
macro_rules! uploaded {
    ($case:expr, $s:expr => $up:ident {
        $($t:ident),* $(,)?
        $(; optional: $($o:ident),+)?
        $(; copied: $($c:ident),+)?
    }) => {{
        let (case, s) = ($case, $s);
        Ok($up {
            $($t: case.$t.tensor(s)?,)*
            $($($o: case.$o.as_ref().map(|d| d.tensor(s)).transpose()?,)+)?
            $($($c: case.$c,)+)?
        })
    }};
}
pub(crate) use uploaded;
