//! Shared helpers of the acceptance tests (`tests/ops.rs`, `tests/ascend_mock.rs`):
//!
//! * [`Rng`]: a small deterministic generator (splitmix64), so every run sees the same data;
//! * [`Data`]: host test data that knows its dtype and strided layout, uploads itself as a
//!   [`Tensor`] and feeds the reference;
//! * [`reference`]: an independent f64 implementation of the op (plain loops over the strided
//!   indices, `Σ dy·(x − mean)` summed directly), with the per-channel condition sums the
//!   tolerances scale with;
//! * [`assert_close`] / [`assert_opbase`]: the tolerance checks, stated below per dtype;
//! * [`backends`]: the contexts to run on (CPU always, the mock Ascend with `--features mock`).
#![allow(dead_code)]

use ascend::ops::{
    batch_norm_reduce_backward, batch_norm_reduce_backward_into, prepare_batch_norm_reduce_backward, OutputMask,
    PreparedReduceBackward, ReduceBackward, ReduceBackwardOut,
};
use ascend::{bf16, f16, Context, DType, Result, Stream, Tensor};

// ---------------------------------------------------------------------------------------------
// Random numbers

/// splitmix64: deterministic, no dependencies.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }

    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.unit(); // (0, 1]
        let u2 = self.unit();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

// ---------------------------------------------------------------------------------------------
// dtypes

/// `v` rounded (to nearest even) to `dtype`, widened back to f64.
pub fn round_to(dtype: DType, v: f64) -> f64 {
    match dtype {
        DType::F32 => f64::from(v as f32),
        DType::F16 => f16::from_f64(v).to_f64(),
        DType::BF16 => bf16::from_f64(v).to_f64(),
        _ => v.round(), // i32
    }
}

/// The unit roundoff of `dtype` (half an ulp at 1).
pub fn unit_roundoff(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => f64::powi(2.0, -24),
        DType::F16 => f64::powi(2.0, -11),
        DType::BF16 => f64::powi(2.0, -8),
        _ => 0.0, // i32: exact
    }
}

/// The smallest positive (subnormal) value of `dtype`: the absolute floor of every tolerance.
pub fn tiny(dtype: DType) -> f64 {
    match dtype {
        DType::F32 | DType::BF16 => f64::powi(2.0, -149),
        DType::F16 => f64::powi(2.0, -24),
        _ => 1.0, // i32
    }
}

pub const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

/// The dtype the allocating API gives (op-plugin's rule): f16 iff input and mean are both f16.
pub fn allocating_dtype(input: DType, mean: DType) -> DType {
    if input == DType::F16 && mean == DType::F16 {
        DType::F16
    } else {
        DType::F32
    }
}

// ---------------------------------------------------------------------------------------------
// Test data

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

/// A tensor's elements as the raw bits of its own dtype, for bit-exact comparisons.
pub fn bits(stream: &Stream, t: &Tensor) -> Vec<u32> {
    match t.dtype() {
        DType::F32 => t.to_vec::<f32>(stream).expect("to_vec").into_iter().map(f32::to_bits).collect(),
        DType::F16 => t.to_vec::<f16>(stream).expect("to_vec").into_iter().map(|v| u32::from(v.to_bits())).collect(),
        DType::BF16 => t.to_vec::<bf16>(stream).expect("to_vec").into_iter().map(|v| u32::from(v.to_bits())).collect(),
        _ => t.to_vec::<i32>(stream).expect("to_vec").into_iter().map(|v| v as u32).collect(),
    }
}

// ---------------------------------------------------------------------------------------------
// The f64 reference

/// The op's outputs in f64, with per-channel condition sums for the tolerances.
#[derive(Clone, Debug)]
pub struct Expected {
    pub channels: usize,
    /// Elements reduced per channel.
    pub r: usize,
    pub sum_dy: Vec<f64>,
    pub sum_dy_xmu: Vec<f64>,
    pub grad_weight: Vec<f64>,
    pub grad_bias: Vec<f64>,
    /// Σ|dy| per channel (condition of sumDy / gradBias).
    pub cond_dy: Vec<f64>,
    /// Σ|dy|·(|x| + |mean|) per channel: bounds the terms of both the direct sum Σdy·(x−mean)
    /// and the Ascend kernel's one-pass Σdy·x − mean·Σdy.
    pub cond_xmu: Vec<f64>,
    /// cond_xmu·|invstd|.
    pub cond_gw: Vec<f64>,
}

impl Expected {
    /// The expected values of output `i` (sumDy, sumDyXmu, gradWeight, gradBias order).
    pub fn output(&self, i: usize) -> (&[f64], &[f64]) {
        match i {
            0 => (&self.sum_dy, &self.cond_dy),
            1 => (&self.sum_dy_xmu, &self.cond_xmu),
            2 => (&self.grad_weight, &self.cond_gw),
            _ => (&self.grad_bias, &self.cond_dy),
        }
    }
}

/// The op computed independently in f64: plain loops over every multi-index of the shape,
/// reading each tensor through its own strides; `sumDyXmu = Σ dy·(x − mean)` summed directly
/// (two-pass: the mean is given, never `Σdy·x − mean·Σdy`), `gradWeight = sumDyXmu·invstd`,
/// `gradBias = sumDy`. weight is not an argument: it never changes a value.
pub fn reference(dy: &Data, x: &Data, mean: &Data, invstd: &Data) -> Expected {
    assert_eq!(dy.shape, x.shape);
    let c = x.shape[1];
    let mean = mean.values();
    let invstd = invstd.values();
    assert_eq!((mean.len(), invstd.len()), (c, c));
    let mut e = Expected {
        channels: c,
        r: x.numel().checked_div(c).unwrap_or(0),
        sum_dy: vec![0.0; c],
        sum_dy_xmu: vec![0.0; c],
        grad_weight: vec![0.0; c],
        grad_bias: vec![0.0; c],
        cond_dy: vec![0.0; c],
        cond_xmu: vec![0.0; c],
        cond_gw: vec![0.0; c],
    };
    for_each_index(&x.shape, |i| {
        let ch = i[1];
        let (g, v) = (dy.get(i), x.get(i));
        e.sum_dy[ch] += g;
        e.sum_dy_xmu[ch] += g * (v - mean[ch]);
        e.cond_dy[ch] += g.abs();
        e.cond_xmu[ch] += g.abs() * (v.abs() + mean[ch].abs());
    });
    for (ch, &inv) in invstd.iter().enumerate() {
        e.grad_weight[ch] = e.sum_dy_xmu[ch] * inv;
        e.grad_bias[ch] = e.sum_dy[ch];
        e.cond_gw[ch] = e.cond_xmu[ch] * inv.abs();
    }
    e
}

// ---------------------------------------------------------------------------------------------
// Tolerances

/// Accumulation slack: the error of an f32 sum of R terms is bounded by `ACC_K·(√R + 1)·u32`
/// times the sum of the terms' magnitudes (a probabilistic bound; the worst case is R·u32).
pub const ACC_K: f64 = 8.0;

/// The per-element tolerance for an output of `dtype` whose exact value is `e`, for a channel
/// of `r` elements whose terms' magnitudes sum to `cond`:
///
/// `|got − e| ≤ rtol·|e| + atol`, with
/// * `rtol = 2·(u_out + u_f32)`: one rounding into the output dtype (u_out = 2^-24 f32,
///   2^-11 f16, 2^-8 bf16) plus one f32 product (gradWeight), doubled for slack;
/// * `atol = ACC_K·(√r + 1)·u_f32·cond + tiny(dtype)`: f32 accumulation noise (both backends
///   accumulate in f32 at least; the Ascend kernel is one-pass Σdy·x − mean·Σdy, covered by
///   cond = Σ|dy|·(|x| + |mean|)), plus the dtype's smallest subnormal.
///
/// So f32 outputs are held to ~1e-7 relative plus f32 reduction noise, f16 to ~1e-3, bf16 to
/// ~8e-3. An error of one whole term (e.g. a skipped or misread element) exceeds it for the
/// sizes used here.
pub fn tolerance(dtype: DType, e: f64, r: usize, cond: f64) -> f64 {
    let u32_ = unit_roundoff(DType::F32);
    let rtol = 2.0 * (unit_roundoff(dtype) + u32_);
    let atol = ACC_K * ((r as f64).sqrt() + 1.0) * u32_ * cond + tiny(dtype);
    rtol * e.abs() + atol
}

/// Whether `got` matches `exp` for an output of `dtype`: NaN where NaN is expected, the same
/// infinity where one is expected (or where the value overflows the output dtype), else within
/// [`tolerance`].
pub fn close(dtype: DType, got: f64, exp: f64, r: usize, cond: f64) -> bool {
    if exp.is_nan() {
        return got.is_nan();
    }
    let rounded = round_to(dtype, exp);
    if exp.is_infinite() || (rounded.is_infinite() && round_to(dtype, exp * (1.0 - 1e-3)).is_infinite()) {
        return got == rounded;
    }
    got.is_finite() && (got - exp).abs() <= tolerance(dtype, exp, r, cond)
}

/// Asserts [`close`] element-wise, naming the output and the first bad channel.
pub fn assert_close(what: &str, dtype: DType, got: &[f64], exp: &[f64], cond: &[f64], r: usize) {
    assert_eq!(got.len(), exp.len(), "{what}: length");
    for c in 0..exp.len() {
        assert!(
            close(dtype, got[c], exp[c], r, cond[c]),
            "{what}[{c}] ({dtype}): got {:e}, expected {:e} (|diff| {:e} > tol {:e}); got {got:?}, expected {exp:?}",
            got[c],
            exp[c],
            (got[c] - exp[c]).abs(),
            tolerance(dtype, exp[c], r, cond[c]),
        );
    }
}

/// The hicann/opbase open-source precision standard (SEMANTICS §4.1), against the f64 golden:
/// MERE = mean(|a−g|/(|g|+1e-7)) < T and MARE = max(|a−g|/(|g|+1e-7)) < 10·T, with T = 2^-13
/// (f32), 2^-10 (f16), 2^-7 (bf16), by output dtype.
pub fn assert_opbase(what: &str, dtype: DType, got: &[f64], golden: &[f64]) {
    let t = match dtype {
        DType::F32 => f64::powi(2.0, -13),
        DType::F16 => f64::powi(2.0, -10),
        DType::BF16 => f64::powi(2.0, -7),
        _ => 0.0,
    };
    assert_eq!(got.len(), golden.len(), "{what}: length");
    let rel: Vec<f64> = got.iter().zip(golden).map(|(a, g)| (a - g).abs() / (g.abs() + 1e-7)).collect();
    let mere = rel.iter().sum::<f64>() / rel.len().max(1) as f64;
    let mare = rel.iter().cloned().fold(0.0, f64::max);
    assert!(
        mere < t && mare < 10.0 * t,
        "{what} ({dtype}): MERE {mere:e} (< {t:e}?), MARE {mare:e} (< {:e}?)",
        10.0 * t
    );
}

/// Distance in units in the last place between two finite f32 values.
pub fn ulps(a: f32, b: f32) -> u32 {
    fn ordered(v: f32) -> i64 {
        let b = v.to_bits() as i32;
        i64::from(if b < 0 { i32::MIN - b } else { b })
    }
    (ordered(a) - ordered(b)).unsigned_abs() as u32
}

pub const OUTPUT_NAMES: [&str; 4] = ["sumDy", "sumDyXmu", "gradWeight", "gradBias"];

/// Which outputs `mask` turns on, in [`OUTPUT_NAMES`] order.
pub fn enabled(mask: OutputMask) -> [bool; 4] {
    [mask.input_g, mask.input_g, mask.weight_g, mask.bias_g]
}

/// All eight masks.
pub fn all_masks() -> Vec<OutputMask> {
    (0..8).map(|m| OutputMask { input_g: m & 1 != 0, weight_g: m & 2 != 0, bias_g: m & 4 != 0 }).collect()
}

/// The four outputs of an allocating call, in [`OUTPUT_NAMES`] order.
pub fn outputs(out: &ReduceBackward) -> [Option<&Tensor>; 4] {
    [out.sum_dy.as_ref(), out.sum_dy_xmu.as_ref(), out.grad_weight.as_ref(), out.grad_bias.as_ref()]
}

/// Checks an allocating call's result: each output present exactly when `mask` asks for it,
/// of shape `[C]` and dtype `dtype`, with values [`close`] to `exp`.
pub fn check_result(stream: &Stream, out: &ReduceBackward, mask: OutputMask, dtype: DType, exp: &Expected) {
    for (i, (t, on)) in outputs(out).into_iter().zip(enabled(mask)).enumerate() {
        let name = OUTPUT_NAMES[i];
        assert_eq!(t.is_some(), on, "{name}: present iff the mask {mask:?} asks for it");
        if let Some(t) = t {
            check_tensor(stream, name, t, dtype, i, exp);
        }
    }
}

/// Checks one output tensor (output `i` in [`OUTPUT_NAMES`] order) against `exp`.
pub fn check_tensor(stream: &Stream, name: &str, t: &Tensor, dtype: DType, i: usize, exp: &Expected) {
    assert_eq!(t.shape(), [exp.channels], "{name}: shape");
    assert_eq!(t.dtype(), dtype, "{name}: dtype");
    let (e, cond) = exp.output(i);
    assert_close(name, dtype, &read(stream, t), e, cond, exp.r);
}

/// An error's aclnn status, with the error shown when it has none.
pub fn status_of<T: std::fmt::Debug>(r: Result<T>) -> i32 {
    match r {
        Ok(v) => panic!("expected an error, got Ok({v:?})"),
        Err(e) => e.status().unwrap_or_else(|| panic!("error without a status: {e:?}")),
    }
}

// ---------------------------------------------------------------------------------------------
// Fixtures

/// The op's inputs as host data.
#[derive(Clone, Debug)]
pub struct Inputs {
    pub dy: Data,
    pub x: Data,
    pub mean: Data,
    pub invstd: Data,
    pub weight: Option<Data>,
}

impl Inputs {
    /// dy ~ N(0,1), x ~ N(0.5,1), mean ~ U(0.3,0.7) (near the data mean, so the one-pass Ascend
    /// kernel is accurate), invstd ~ U(0.5,2), weight ~ N(0,1); gradOut/input in `dt`, the
    /// per-channel vectors in `sdt`.
    pub fn normal(seed: u64, dt: DType, sdt: DType, shape: &[usize]) -> Self {
        let mut rng = Rng::new(seed);
        let c = shape[1];
        Inputs {
            dy: Data::normal(&mut rng, dt, shape, 0.0, 1.0),
            x: Data::normal(&mut rng, dt, shape, 0.5, 1.0),
            mean: Data::uniform(&mut rng, sdt, &[c], 0.3, 0.7),
            invstd: Data::uniform(&mut rng, sdt, &[c], 0.5, 2.0),
            weight: Some(Data::normal(&mut rng, sdt, &[c], 0.0, 1.0)),
        }
    }

    /// The ATK system tests' distribution: all five tensors U(-10,10) in `dt` (so invstd may be
    /// negative and mean is far from the data mean).
    pub fn atk(seed: u64, dt: DType, shape: &[usize]) -> Self {
        let mut rng = Rng::new(seed);
        let c = shape[1];
        Inputs {
            dy: Data::uniform(&mut rng, dt, shape, -10.0, 10.0),
            x: Data::uniform(&mut rng, dt, shape, -10.0, 10.0),
            mean: Data::uniform(&mut rng, dt, &[c], -10.0, 10.0),
            invstd: Data::uniform(&mut rng, dt, &[c], -10.0, 10.0),
            weight: Some(Data::uniform(&mut rng, dt, &[c], -10.0, 10.0)),
        }
    }

    /// SEMANTICS T02/T03: dy = x = 1.
    pub fn ones(dt: DType, shape: &[usize], mean: &[f64], invstd: &[f64]) -> Self {
        let c = shape[1];
        Inputs {
            dy: Data::filled(dt, shape, 1.0),
            x: Data::filled(dt, shape, 1.0),
            mean: Data::new(dt, mean, &[c]),
            invstd: Data::new(dt, invstd, &[c]),
            weight: Some(Data::filled(dt, &[c], 3.0)),
        }
    }

    pub fn expected(&self) -> Expected {
        reference(&self.dy, &self.x, &self.mean, &self.invstd)
    }

    /// The dtype the allocating API gives for these inputs.
    pub fn out_dtype(&self) -> DType {
        allocating_dtype(self.x.dtype, self.mean.dtype)
    }

    pub fn upload(&self, s: &Stream) -> Result<Up> {
        Ok(Up {
            dy: self.dy.tensor(s)?,
            x: self.x.tensor(s)?,
            mean: self.mean.tensor(s)?,
            invstd: self.invstd.tensor(s)?,
            weight: self.weight.as_ref().map(|w| w.tensor(s)).transpose()?,
        })
    }
}

/// Uploaded inputs.
#[derive(Debug)]
pub struct Up {
    pub dy: Tensor,
    pub x: Tensor,
    pub mean: Tensor,
    pub invstd: Tensor,
    pub weight: Option<Tensor>,
}

impl Up {
    pub fn run(&self, s: &Stream, mask: OutputMask) -> Result<ReduceBackward> {
        batch_norm_reduce_backward(s, &self.dy, &self.x, &self.mean, &self.invstd, self.weight.as_ref(), mask)
    }

    pub fn run_into(&self, s: &Stream, mask: OutputMask, out: ReduceBackwardOut<'_>) -> Result<()> {
        batch_norm_reduce_backward_into(s, &self.dy, &self.x, &self.mean, &self.invstd, self.weight.as_ref(), mask, out)
    }

    pub fn prepare<'a>(
        &'a self,
        s: &Stream,
        mask: OutputMask,
        out: ReduceBackwardOut<'a>,
    ) -> Result<PreparedReduceBackward<'a>> {
        prepare_batch_norm_reduce_backward(
            s,
            &self.dy,
            &self.x,
            &self.mean,
            &self.invstd,
            self.weight.as_ref(),
            mask,
            out,
        )
    }
}

/// Four caller-owned outputs for the `_into` API, pre-filled with distinct non-zero sentinels
/// (or any layout), remembering what they held.
pub struct Outs {
    pub init: [Data; 4],
    pub t: [Tensor; 4],
}

impl Outs {
    pub fn new(s: &Stream, init: [Data; 4]) -> Result<Self> {
        let t = [init[0].tensor(s)?, init[1].tensor(s)?, init[2].tensor(s)?, init[3].tensor(s)?];
        Ok(Outs { init, t })
    }

    /// Contiguous `[c]` outputs of `dtype` holding 1000 + 10·i + k.
    pub fn filled(s: &Stream, dtype: DType, c: usize) -> Result<Self> {
        Self::new(s, std::array::from_fn(|i| sentinel(dtype, c, i)))
    }

    /// All four outputs.
    pub fn all(&mut self) -> ReduceBackwardOut<'_> {
        let [a, b, c, d] = &mut self.t;
        ReduceBackwardOut { sum_dy: Some(a), sum_dy_xmu: Some(b), grad_weight: Some(c), grad_bias: Some(d) }
    }

    /// Only the outputs `mask` turns on.
    pub fn masked(&mut self, mask: OutputMask) -> ReduceBackwardOut<'_> {
        let [a, b, c, d] = &mut self.t;
        let on = enabled(mask);
        ReduceBackwardOut {
            sum_dy: on[0].then_some(a),
            sum_dy_xmu: on[1].then_some(b),
            grad_weight: on[2].then_some(c),
            grad_bias: on[3].then_some(d),
        }
    }

    /// The enabled outputs hold the expected values, the others what they held before.
    pub fn check(&self, s: &Stream, mask: OutputMask, exp: &Expected) {
        for (i, on) in enabled(mask).into_iter().enumerate() {
            let name = OUTPUT_NAMES[i];
            if on {
                check_tensor(s, name, &self.t[i], self.init[i].dtype, i, exp);
            } else {
                assert_eq!(read(s, &self.t[i]), self.init[i].values(), "{name} (masked off) must stay untouched");
            }
        }
    }

    pub fn assert_untouched(&self, s: &Stream) {
        for ((t, init), name) in self.t.iter().zip(&self.init).zip(OUTPUT_NAMES) {
            assert_eq!(read(s, t), init.values(), "{name}: a rejected call wrote it");
        }
    }
}

pub fn sentinel(dtype: DType, c: usize, i: usize) -> Data {
    let v: Vec<f64> = (0..c).map(|k| 1000.0 + 10.0 * i as f64 + k as f64).collect();
    Data::new(dtype, &v, &[c])
}

// ---------------------------------------------------------------------------------------------
// Backends

/// The contexts every case runs on: the CPU always, plus the mock Ascend with `--features mock`.
pub fn backends() -> Vec<Context> {
    #[allow(unused_mut)]
    let mut v = vec![Context::cpu()];
    #[cfg(feature = "mock")]
    v.push(mock::context());
    v
}

/// Runs `f` on the CPU backend; with the mock feature, as [`mock::isolated_on`] does, for CPU
/// cases that also use the mock (through [`other_backend`]) and so must not run while another
/// test measures the mock's global counters.
pub fn on_cpu_touching_mock<T>(f: impl FnOnce(&Context) -> T) -> T {
    #[cfg(feature = "mock")]
    return mock::isolated_on(Context::cpu, f);
    #[cfg(not(feature = "mock"))]
    f(&Context::cpu())
}

/// The other backend than `ctx`'s, when this build has one.
pub fn other_backend(ctx: &Context) -> Option<Context> {
    backends().into_iter().find(|c| c.backend() != ctx.backend())
}

#[cfg(feature = "mock")]
pub mod mock {
    use std::sync::{Mutex, MutexGuard};

    use ascend::Context;

    /// The mock's Ascend device 0.
    pub fn context() -> Context {
        ascend::mock::context(0).expect("mock context")
    }

    static LOCK: Mutex<()> = Mutex::new(());

    /// Serialises the tests of one binary that read the mock's process-global counters or
    /// inject faults (a failed test poisons nothing).
    pub fn lock() -> MutexGuard<'static, ()> {
        LOCK.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` on a fresh mock context while holding [`lock`], then asserts that it left no
    /// live allocation, tensor descriptor, executor or stream behind and counted no violation.
    pub fn isolated<T>(f: impl FnOnce(&Context) -> T) -> T {
        isolated_on(context, f)
    }

    /// [`isolated`] on the context `make` gives (e.g. the CPU, for a CPU case that also uses
    /// the mock as "the other backend").
    pub fn isolated_on<T>(make: impl FnOnce() -> Context, f: impl FnOnce(&Context) -> T) -> T {
        let _guard = lock();
        ascend::mock::clear_faults(); // a failed test may have left one armed
        let before = ascend::mock::stats();
        let result = {
            let ctx = make();
            f(&ctx)
        };
        let after = ascend::mock::stats();
        assert_eq!(
            after.violations,
            before.violations,
            "mock violations during the test: {:?}",
            ascend::mock::violations_since(before.violations)
        );
        assert_eq!(after.live_allocations, before.live_allocations, "leaked device memory: {before:?} -> {after:?}");
        assert_eq!(after.live_tensors, before.live_tensors, "leaked aclTensor: {before:?} -> {after:?}");
        assert_eq!(after.live_executors, before.live_executors, "leaked executor: {before:?} -> {after:?}");
        assert_eq!(after.live_streams, before.live_streams, "leaked stream: {before:?} -> {after:?}");
        result
    }
}
