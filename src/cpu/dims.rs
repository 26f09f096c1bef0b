//! The dims of a walk over `K` strided views of one shape, and the odometer that walks them.
//!
//! Every CPU kernel reads its views in storage order with as few, as long dims as possible: the
//! dims are sorted by the first view's stride (outermost first, ties in logical order), size-1
//! dims are dropped, and a dim is merged into its outer neighbour wherever it nests in every view
//! (`inner stride × inner size == outer stride`). [`sort_merge`] is that step for any dim type;
//! [`Dims::reduction`] applies it to the reduction dims (all but the channel, dim 1) of the
//! reduction kernels, and the channel-wise maps apply it with the channel as a fence.

/// Most dims of a walk: the operators' rank limit (8; validation rejects more, and
/// [`Dims::reduction`] never reads past it).
pub(crate) const MAX_DIMS: usize = 8;

/// One dim: its size and each view's stride along it (in elements).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Dim<const K: usize> {
    pub n: usize,
    pub s: [usize; K],
}

impl<const K: usize> Default for Dim<K> {
    fn default() -> Self {
        Dim { n: 0, s: [0; K] }
    }
}

/// Whether a dim of stride `inner` and size `n` continues one of stride `outer` (so the two walk
/// as one dim); `false` on overflow.
#[inline]
pub(crate) fn nests(outer: usize, inner: usize, n: usize) -> bool {
    inner.checked_mul(n) == Some(outer)
}

impl<const K: usize> Dim<K> {
    /// `outer` and `inner` as one dim when `inner` nests in `outer` in every view.
    fn merged(outer: &Self, inner: &Self) -> Option<Self> {
        (0..K)
            .all(|k| nests(outer.s[k], inner.s[k], inner.n))
            .then(|| Dim { n: outer.n.saturating_mul(inner.n), s: inner.s })
    }
}

/// Sorts `dims` outermost first (`key` descending; stable, so ties keep their order) and merges
/// each dim into its outer neighbour where `merge(outer, inner)` gives the merged dim. The kept
/// dims are moved to the front; returns their count.
pub(crate) fn sort_merge<D: Copy>(
    dims: &mut [D],
    key: impl Fn(&D) -> usize,
    merge: impl Fn(&D, &D) -> Option<D>,
) -> usize {
    // Insertion sort: at most 8 dims, no allocation.
    for i in 1..dims.len() {
        let mut j = i;
        while j > 0 && key(&dims[j - 1]) < key(&dims[j]) {
            dims.swap(j - 1, j);
            j -= 1;
        }
    }
    let mut m = 0;
    for i in 0..dims.len() {
        let d = dims[i];
        if m > 0 {
            if let Some(both) = merge(&dims[m - 1], &d) {
                dims[m - 1] = both;
                continue;
            }
        }
        dims[m] = d;
        m += 1;
    }
    m
}

/// The reduction dims of `K` views: sorted by the first view's stride, size-1 dims dropped,
/// nesting neighbours merged.
#[derive(Clone, Debug)]
pub(crate) struct Dims<const K: usize> {
    dims: [Dim<K>; MAX_DIMS],
    nd: usize,
}

impl<const K: usize> Dims<K> {
    /// The dims of `shape` but the channel (dim 1) with the views' `strides` (each as long as
    /// `shape`, at most [`MAX_DIMS`]), keeping only those for which `keep` holds (besides being
    /// longer than 1).
    pub(crate) fn reduction(shape: &[usize], strides: [&[usize]; K], keep: impl Fn(&Dim<K>) -> bool) -> Self {
        let mut dims = [Dim::default(); MAX_DIMS];
        let mut nd = 0;
        for k in (0..shape.len().min(MAX_DIMS)).filter(|&k| k != 1) {
            let d = Dim { n: shape[k], s: std::array::from_fn(|v| strides[v].get(k).copied().unwrap_or(0)) };
            if d.n > 1 && keep(&d) {
                dims[nd] = d;
                nd += 1;
            }
        }
        let nd = sort_merge(&mut dims[..nd], |d| d.s[0], Dim::merged);
        Dims { dims, nd }
    }

    /// The dims, outermost first.
    pub(crate) fn as_slice(&self) -> &[Dim<K>] {
        &self.dims[..self.nd]
    }

    /// Positions walked (the product of the sizes; 1 for no dim).
    pub(crate) fn positions(&self) -> usize {
        self.as_slice().iter().fold(1usize, |a, d| a.saturating_mul(d.n))
    }
}

/// Walks the positions of a set of dims in row-major order, tracking each view's storage index.
#[derive(Clone, Debug)]
pub(crate) struct Odometer<'a, const K: usize> {
    dims: &'a [Dim<K>],
    idx: [usize; MAX_DIMS],
    /// The current position's storage index in each view.
    pub pos: [usize; K],
}

impl<'a, const K: usize> Odometer<'a, K> {
    /// Starts at flat position `p` (row-major over `dims`) from the views' base indices `base`.
    pub(crate) fn new(dims: &'a [Dim<K>], mut p: usize, mut base: [usize; K]) -> Self {
        let mut idx = [0; MAX_DIMS];
        for (k, d) in dims.iter().enumerate().rev() {
            idx[k] = p % d.n;
            p /= d.n;
            for (b, s) in base.iter_mut().zip(d.s) {
                *b += idx[k] * s;
            }
        }
        Odometer { dims, idx, pos: base }
    }

    /// Moves to the next position (after the last one: back to the first).
    #[inline]
    pub(crate) fn advance(&mut self) {
        for (k, d) in self.dims.iter().enumerate().rev() {
            self.idx[k] += 1;
            for (p, s) in self.pos.iter_mut().zip(d.s) {
                *p += s;
            }
            if self.idx[k] < d.n {
                return;
            }
            self.idx[k] = 0;
            for (p, s) in self.pos.iter_mut().zip(d.s) {
                *p -= s * d.n;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every storage index of the walk, by brute force over the logical index.
    fn brute(shape: &[usize], strides: &[usize]) -> Vec<usize> {
        let mut out = Vec::new();
        let n: usize = shape.iter().enumerate().filter(|&(k, _)| k != 1).map(|(_, &n)| n).product();
        let mut idx = vec![0; shape.len()];
        for _ in 0..n {
            out.push(idx.iter().zip(strides).map(|(i, s)| i * s).sum());
            for k in (0..shape.len()).rev().filter(|&k| k != 1) {
                idx[k] += 1;
                if idx[k] < shape[k] {
                    break;
                }
                idx[k] = 0;
            }
        }
        out
    }

    #[test]
    fn merges_contiguous_dims_and_walks_every_position() {
        // NCHW: N, H, W merge into two dims (N apart from H·W by the channel).
        let shape = [2, 3, 4, 5];
        let nchw = [60, 20, 5, 1];
        let d = Dims::<1>::reduction(&shape, [&nchw], |_| true);
        assert_eq!(d.as_slice(), &[Dim { n: 2, s: [60] }, Dim { n: 20, s: [1] }]);
        // Channels-last: N·H·W is one dim of stride C.
        let cl = [60, 1, 15, 3];
        let d = Dims::<2>::reduction(&shape, [&cl, &cl], |_| true);
        assert_eq!(d.as_slice(), &[Dim { n: 40, s: [3, 3] }]);
        // Mixed: dy NCHW, x channels-last: H and W nest in both, N does not.
        let d = Dims::<2>::reduction(&shape, [&nchw, &cl], |_| true);
        assert_eq!(d.as_slice(), &[Dim { n: 2, s: [60, 60] }, Dim { n: 20, s: [1, 3] }]);
        // A transposed x: nothing merges, sorted by dy's strides.
        let d = Dims::<2>::reduction(&shape, [&nchw, &[60, 20, 1, 4]], |_| true);
        assert_eq!(d.as_slice().len(), 3);
        assert_eq!(d.positions(), 40);
        for (shape, st) in [(&shape[..], &nchw[..]), (&shape[..], &cl[..]), (&[3, 2, 1, 4][..], &[1, 12, 99, 3][..])] {
            let d = Dims::<1>::reduction(shape, [st], |_| true);
            let mut want = brute(shape, st);
            let mut o = Odometer::new(d.as_slice(), 0, [7]);
            let mut got: Vec<usize> = (0..d.positions())
                .map(|_| {
                    let p = o.pos[0] - 7;
                    o.advance();
                    p
                })
                .collect();
            assert_eq!(o.pos, [7], "the odometer wraps to the start");
            want.sort_unstable();
            got.sort_unstable();
            assert_eq!(got, want, "{shape:?} {st:?}");
            // Starting mid-way gives the same positions as walking there.
            let mut a = Odometer::new(d.as_slice(), 0, [0]);
            for p in 0..d.positions() {
                assert_eq!(Odometer::new(d.as_slice(), p, [0]).pos, a.pos);
                a.advance();
            }
        }
    }

    #[test]
    fn keep_drops_dims_and_overflow_never_merges() {
        let d = Dims::<1>::reduction(&[4, 2, 3], [&[0, 3, 1]], |d| d.s[0] != 0);
        assert_eq!(d.as_slice(), &[Dim { n: 3, s: [1] }]);
        assert!(!nests(usize::MAX, usize::MAX / 2 + 1, 2));
        assert!(nests(8, 4, 2));
    }
}
