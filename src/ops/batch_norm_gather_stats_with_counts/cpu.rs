//! The CPU kernel of [`batch_norm_gather_stats_with_counts`](super::batch_norm_gather_stats_with_counts):
//! the global statistics from every rank's, in f64 over host values, and the running statistics'
//! update ([`update_running`], which `batch_norm`'s kernel shares).

use crate::cpu::host;
use crate::cpu::scratch::Scratch;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// The global statistics of one channel, in f64.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Global {
    mean: f64,
    invstd: f64,
    /// The unbiased variance var_n/(N − 1), for running_var.
    unbiased_var: f64,
}

/// The operator's math in f64 over host values: `mean`, `invstd` row-major `[W, C]`, `counts`
/// `[W]`. Two passes per channel: the weighted mean, then the spread around it.
/// Sums start at +0 (`fold(0.0, ..)`), as CANN's do: Rust's float `Sum` starts at −0.
fn combine(c: usize, mean: &[f64], invstd: &[f64], counts: &[f64], eps: f64) -> Result<Scratch<Global>> {
    let n = counts.iter().fold(0.0, |a, &v| a + v);
    let channel = |ch: usize| {
        let rows = || counts.iter().enumerate().map(move |(j, &nj)| (nj, mean[j * c + ch], invstd[j * c + ch]));
        let m = rows().fold(0.0, |a, (nj, mj, _)| a + nj * mj) / n;
        let var_n = rows().fold(0.0, |a, (nj, mj, ij)| {
            let var_j = 1.0 / (ij * ij) - eps;
            a + (nj * var_j + nj * (mj - m) * (mj - m))
        });
        Global { mean: m, invstd: 1.0 / (var_n / n + eps).sqrt(), unbiased_var: var_n / (n - 1.0) }
    };
    host::scratch_collect(c, (0..c).map(channel))
}

/// Whether every rank is one and the same row: W > 1 ranks over stride 0 in mean, invstd and
/// counts alike (a broadcast view, whose W the caller may make as large as it likes).
fn one_broadcast_row(ranks: usize, [mean, invstd, counts]: [&Tensor; 3]) -> bool {
    ranks > 1 && [mean, invstd, counts].iter().all(|t| t.strides().first() == Some(&0))
}

/// Row 0 of a validated host `[W, C]` tensor, widened exactly to f64.
fn first_row(t: &Tensor, name: &'static str, c: usize) -> Result<Scratch<f64>> {
    let data = host::view(t, name)?.storage();
    let (offset, stride) = (t.offset(), t.strides().get(1).copied().unwrap_or(0));
    host::scratch_collect(c, (0..c).map(|ch| data.get_f64(offset + ch * stride)))
}

/// Runs a validated call over host tensors: `mean`, `invstd` `[ranks, c]`, `counts` `[ranks]`,
/// the running statistics (both or neither) updated in place with `momentum`, `eps` and
/// `momentum` as the kernel takes them; writes `mean_all` and `invstd_all` (`[c]`).
pub(super) fn run(
    [ranks, c]: [usize; 2],
    [mean, invstd, counts]: [&Tensor; 3],
    running: Option<(&mut Tensor, &mut Tensor)>,
    momentum: f64,
    eps: f64,
    mean_all: &mut Tensor,
    invstd_all: &mut Tensor,
) -> Result<()> {
    if ranks == 0 || c == 0 {
        host::write_vector(mean_all, "meanAll", std::iter::repeat_n(0.0, c))?;
        return host::write_vector(invstd_all, "invstdAll", std::iter::repeat_n(f64::NAN, c));
    }
    let g = if one_broadcast_row(ranks, [mean, invstd, counts]) {
        // W copies of one row are that row with W times its count: the same sums, without walking
        // (or allocating for) W rows.
        let n = first_row(counts, "counts", 1)?;
        let weighted = [ranks as f64 * n[0]];
        combine(c, &first_row(mean, "mean", c)?, &first_row(invstd, "invstd", c)?, &weighted, eps)?
    } else {
        let (m, i, n) = (host::scratch_values(mean)?, host::scratch_values(invstd)?, host::scratch_values(counts)?);
        if m.len() != ranks * c || i.len() != m.len() || n.len() != ranks {
            return Err(Error::internal("mean: a device tensor reached the CPU backend"));
        }
        combine(c, &m, &i, &n, eps)?
    };
    // Everything that may fail comes before the first write.
    let old = running
        .as_ref()
        .map(|(rm, rv)| Ok::<_, Error>((host::scratch_values(rm)?, host::scratch_values(rv)?)))
        .transpose()?;
    host::write_vector(mean_all, "meanAll", g.iter().map(|g| g.mean))?;
    host::write_vector(invstd_all, "invstdAll", g.iter().map(|g| g.invstd))?;
    if let (Some((rm, rv)), Some((old_m, old_v))) = (running, old) {
        update_running(rm, "runningMean", &old_m, g.iter().map(|g| g.mean), momentum)?;
        update_running(rv, "runningVar", &old_v, g.iter().map(|g| g.unbiased_var), momentum)?;
    }
    Ok(())
}

/// Writes `running ← (1 − momentum)·old + momentum·batch` per channel (in f64, rounded once
/// into `running`'s dtype): the running statistics' update, from their `old` values read before
/// any write of the call.
pub(in crate::ops) fn update_running(
    running: &mut Tensor,
    name: &'static str,
    old: &[f64],
    batch: impl Iterator<Item = f64>,
    momentum: f64,
) -> Result<()> {
    let keep = 1.0 - momentum;
    host::write_vector(running, name, old.iter().zip(batch).map(|(r, b)| keep * r + momentum * b))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two ranks whose union is known: [1, 2, 3] and [4, 5] (biased variances 2/3 and 1/4).
    #[test]
    fn combine_matches_the_union() {
        let eps = 1e-5;
        let inv = |var: f64| 1.0 / (var + eps).sqrt();
        let g = combine(1, &[2.0, 4.5], &[inv(2.0 / 3.0), inv(0.25)], &[3.0, 2.0], eps).unwrap();
        let all = [1.0, 2.0, 3.0, 4.0, 5.0];
        let m = all.iter().fold(0.0, |a, x| a + x) / 5.0;
        let ss = all.iter().fold(0.0, |a, x| a + (x - m) * (x - m));
        assert!((g[0].mean - m).abs() < 1e-12);
        assert!((g[0].invstd - 1.0 / (ss / 5.0 + eps).sqrt()).abs() < 1e-9);
        assert!((g[0].unbiased_var - ss / 4.0).abs() < 1e-9);
    }
}
