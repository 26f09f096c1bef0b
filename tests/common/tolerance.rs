//! Per-dtype tolerances: unit roundoffs, the smallest subnormals, and the checks built on them.
#![allow(dead_code)]

use ascend::DType;

use super::data::round_to;

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

/// Asserts element-wise that `got` matches `exp` for an output of `dtype`: NaN where NaN is
/// expected, the same infinity where one is expected, else `|got − exp| ≤ tol(i, exp)`.
pub fn assert_elements(what: &str, dtype: DType, got: &[f64], exp: &[f64], tol: impl Fn(usize, f64) -> f64) {
    assert_eq!(got.len(), exp.len(), "{what}: length");
    for (i, (&g, &e)) in got.iter().zip(exp).enumerate() {
        if !e.is_finite() {
            assert!(e.is_nan() && g.is_nan() || g == e, "{what} ({dtype}) element {i}: got {g:e}, expected {e:e}");
            continue;
        }
        let tol = tol(i, e);
        assert!(
            (g - e).abs() <= tol,
            "{what} ({dtype}) element {i}: got {g:e}, expected {e:e} (|diff| {:e} > tol {tol:e})",
            (g - e).abs()
        );
    }
}

/// Asserts `|got − want| ≤ rel·max|want|` element by element: an error relative to the largest
/// expected magnitude (for results whose small elements are differences of large terms).
#[track_caller]
pub fn assert_scaled(what: &str, got: &[f64], want: &[f64], rel: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let scale = want.iter().fold(1e-30f64, |a, v| a.max(v.abs()));
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= rel * scale, "{what}[{i}]: got {g}, want {w} (± {rel} of {scale})");
    }
}
