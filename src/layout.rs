//! Shapes and strides: row-major strides, element counts, and the bounds check that keeps every
//! strided view inside its storage.

use crate::dtype::{DType, Element, SliceMut, SliceRef};

/// The smallest rank of an aclnn activation (gradOut, input, output...).
pub const MIN_RANK: usize = 2;
/// The largest rank of any aclnn tensor (CANN's operators take at most 8 dimensions): the
/// activations' limit, the launch cache's and the CPU views' inline shapes.
pub const MAX_RANK: usize = 8;

/// Where one tensor's or view's elements are: dtype, shape, strides and offset (in elements)
/// and the length of the storage they lie in.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Layout<'a> {
    /// The element type.
    pub dtype: DType,
    /// The shape.
    pub shape: &'a [usize],
    /// The strides, in elements.
    pub strides: &'a [usize],
    /// The offset of element 0 into the storage, in elements.
    pub offset: usize,
    /// The storage's length, in elements.
    pub storage_len: usize,
}

impl<'a> Layout<'a> {
    /// The layout of a view of `shape`, `strides` and `offset` over `data`.
    pub(crate) fn of<D: Storage>(data: &D, shape: &'a [usize], strides: &'a [usize], offset: usize) -> Self {
        Layout { dtype: data.dtype(), shape, strides, offset, storage_len: data.len() }
    }
}

/// A hash of everything a layout holds (for the launch cache's key; a fast mixing function, not
/// resistant to adversarial inputs, which only cost the cache hits).
pub(crate) fn hash(l: &Layout<'_>) -> u64 {
    let mut h = mix(l.dtype as u64, l.shape.len() as u64);
    for (&d, &s) in l.shape.iter().zip(l.strides) {
        h = mix(mix(h, d as u64), s as u64);
    }
    mix(mix(h, l.offset as u64), l.storage_len as u64)
}

/// One step of the hash: FxHash's rotate-xor-multiply.
pub(crate) fn mix(h: u64, x: u64) -> u64 {
    (h.rotate_left(5) ^ x).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95)
}

/// Host storage a [`Strided`] view lies in: its element type and length in elements.
pub(crate) trait Storage {
    /// The element type.
    fn dtype(&self) -> DType;
    /// The length, in elements.
    fn len(&self) -> usize;
}

impl<T: Element> Storage for &[T] {
    fn dtype(&self) -> DType {
        T::DTYPE
    }
    fn len(&self) -> usize {
        <[T]>::len(self)
    }
}

impl Storage for SliceRef<'_> {
    fn dtype(&self) -> DType {
        SliceRef::dtype(self)
    }
    fn len(&self) -> usize {
        SliceRef::len(self)
    }
}

impl Storage for SliceMut<'_> {
    fn dtype(&self) -> DType {
        SliceMut::dtype(self)
    }
    fn len(&self) -> usize {
        SliceMut::len(self)
    }
}

/// A strided view over host storage: the storage and the [`Layout`] of the view's elements in it.
/// The one carrier of the CPU kernels (`&[T]` for a typed kernel, [`SliceRef`] for one that
/// dispatches on the dtype, [`SliceMut`] for an output). The caller has checked the layout
/// against the storage.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Strided<'a, D> {
    /// The storage.
    pub data: D,
    /// Where the view's elements lie in it.
    pub layout: Layout<'a>,
}

impl<'a, D: Storage> Strided<'a, D> {
    /// The view of `shape`, `strides` and `offset` (in elements) over `data`.
    pub(crate) fn new(data: D, shape: &'a [usize], strides: &'a [usize], offset: usize) -> Self {
        let layout = Layout::of(&data, shape, strides, offset);
        Strided { data, layout }
    }

    /// The same view over other storage (of the same length or longer).
    #[cfg(test)]
    pub(crate) fn with_data<E: Storage>(&self, data: E) -> Strided<'a, E> {
        Strided::new(data, self.layout.shape, self.layout.strides, self.layout.offset)
    }
}

/// Dims a [`Dims`] holds in place.
const INLINE_DIMS: usize = 8;

/// A tensor's shape or strides: up to [`INLINE_DIMS`] values in place (every operator's rank),
/// more on the heap; so making a tensor of an operator's rank allocates no metadata.
#[derive(Clone, Default)]
pub(crate) struct Dims {
    len: usize,
    inline: [usize; INLINE_DIMS],
    heap: Vec<usize>,
}

impl Dims {
    /// `n` zeros.
    pub(crate) fn zeros(n: usize) -> Dims {
        let mut d = Dims { len: n, inline: [0; INLINE_DIMS], heap: Vec::new() };
        if n > INLINE_DIMS {
            d.heap = vec![0; n];
        }
        d
    }
}

impl From<&[usize]> for Dims {
    fn from(v: &[usize]) -> Dims {
        let mut d = Dims::zeros(v.len());
        d.copy_from_slice(v);
        d
    }
}

impl From<&Vec<usize>> for Dims {
    fn from(v: &Vec<usize>) -> Dims {
        Dims::from(&v[..])
    }
}

impl From<Vec<usize>> for Dims {
    fn from(v: Vec<usize>) -> Dims {
        if v.len() > INLINE_DIMS {
            return Dims { len: v.len(), inline: [0; INLINE_DIMS], heap: v };
        }
        Dims::from(&v[..])
    }
}

impl std::ops::Deref for Dims {
    type Target = [usize];
    fn deref(&self) -> &[usize] {
        if self.len > INLINE_DIMS {
            &self.heap
        } else {
            &self.inline[..self.len]
        }
    }
}

impl std::ops::DerefMut for Dims {
    fn deref_mut(&mut self) -> &mut [usize] {
        if self.len > INLINE_DIMS {
            &mut self.heap
        } else {
            &mut self.inline[..self.len]
        }
    }
}

impl std::fmt::Debug for Dims {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (**self).fmt(f)
    }
}

/// [`contiguous_strides`] as [`Dims`] (no allocation up to [`INLINE_DIMS`] dims).
pub(crate) fn contiguous_dims(shape: &[usize]) -> Dims {
    let mut strides = Dims::zeros(shape.len());
    fill_contiguous_strides(shape, &mut strides);
    strides
}

/// Row-major (C-order) strides, in elements, of a contiguous tensor of `shape`.
pub(crate) fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![0; shape.len()];
    fill_contiguous_strides(shape, &mut strides);
    strides
}

/// Writes the row-major strides of `shape` into `strides[..shape.len()]` (no allocation).
pub(crate) fn fill_contiguous_strides(shape: &[usize], strides: &mut [usize]) {
    let mut acc = 1usize;
    for (s, &d) in strides[..shape.len()].iter_mut().zip(shape).rev() {
        *s = acc;
        acc = acc.saturating_mul(d.max(1));
    }
}

/// The number of elements of `shape`, or `None` on overflow.
pub(crate) fn numel(shape: &[usize]) -> Option<usize> {
    shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))
}

/// Whether a view of `shape` with `strides` is row-major contiguous (size-1 dims may have any
/// stride).
pub(crate) fn is_contiguous(shape: &[usize], strides: &[usize]) -> bool {
    let mut expected = 1usize;
    for (&d, &s) in shape.iter().zip(strides).rev() {
        if d != 1 && s != expected {
            return false;
        }
        expected = expected.saturating_mul(d);
    }
    true
}

/// Checks that every element of the view lies inside a storage of `storage_len` elements, and
/// returns the view's element count. Errors say why, for the caller to wrap.
pub(crate) fn check_view(
    shape: &[usize],
    strides: &[usize],
    offset: usize,
    storage_len: usize,
) -> Result<usize, String> {
    if shape.len() != strides.len() {
        return Err(format!("shape has {} dims but strides has {}", shape.len(), strides.len()));
    }
    // aclTensor describes views in int64: beyond that no backend may accept a view.
    const MAX: usize = i64::MAX as usize;
    if let Some(d) = shape.iter().find(|&&d| d > MAX) {
        return Err(format!("dim {d} of shape {shape:?} exceeds int64's maximum {MAX}"));
    }
    if let Some(s) = strides.iter().find(|&&s| s > MAX) {
        return Err(format!("stride {s} of strides {strides:?} exceeds int64's maximum {MAX}"));
    }
    if offset > MAX || storage_len > MAX {
        return Err(format!("offset {offset} or storage length {storage_len} exceeds int64's maximum {MAX}"));
    }
    let n = numel(shape).ok_or_else(|| format!("shape {shape:?} overflows usize"))?;
    if n == 0 {
        if offset > storage_len {
            return Err(format!("offset {offset} is past the storage of {storage_len} elements"));
        }
        return Ok(0);
    }
    let mut last = offset;
    for (&d, &s) in shape.iter().zip(strides) {
        last = (d - 1)
            .checked_mul(s)
            .and_then(|x| last.checked_add(x))
            .ok_or_else(|| format!("shape {shape:?} with strides {strides:?} overflows usize"))?;
    }
    if last >= storage_len {
        return Err(format!(
            "view (shape {shape:?}, strides {strides:?}, offset {offset}) reaches element {last}, \
             but the storage holds {storage_len}"
        ));
    }
    Ok(n)
}

/// Calls `f` with the storage index of every element of the view, in row-major order.
pub(crate) fn for_each_index(shape: &[usize], strides: &[usize], offset: usize, mut f: impl FnMut(usize)) {
    if shape.contains(&0) {
        return;
    }
    if shape.is_empty() {
        f(offset);
        return;
    }
    let rank = shape.len();
    // On the stack up to rank 16 (every operator's rank), so a per-call walk allocates nothing.
    let mut small = [0usize; 16];
    let mut large = Vec::new();
    let idx: &mut [usize] = if rank <= small.len() {
        &mut small[..rank]
    } else {
        large.resize(rank, 0);
        &mut large
    };
    let mut pos = offset;
    let inner = rank - 1;
    loop {
        let s = strides[inner];
        for i in 0..shape[inner] {
            f(pos + i * s);
        }
        // advance the outer dims (odometer)
        let mut k = inner;
        loop {
            if k == 0 {
                return;
            }
            k -= 1;
            idx[k] += 1;
            // Modular arithmetic: the position after the last index of a dim may be out of
            // range (e.g. a size-1 dim with a huge stride), the one it is brought back to is not.
            pos = pos.wrapping_add(strides[k]);
            if idx[k] < shape[k] {
                break;
            }
            pos = pos.wrapping_sub(strides[k].wrapping_mul(shape[k]));
            idx[k] = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strides_and_contiguity() {
        assert_eq!(contiguous_strides(&[4, 2, 3]), vec![6, 3, 1]);
        assert!(is_contiguous(&[4, 2, 3], &[6, 3, 1]));
        assert!(!is_contiguous(&[4, 2, 3], &[1, 4, 8]));
        assert!(is_contiguous(&[1, 2], &[99, 1]));
    }

    #[test]
    fn view_bounds() {
        assert_eq!(check_view(&[4, 2], &[2, 1], 0, 8), Ok(8));
        assert!(check_view(&[4, 2], &[2, 1], 1, 8).is_err());
        assert!(check_view(&[2], &[usize::MAX], 0, 8).is_err());
        assert_eq!(check_view(&[0, 2], &[2, 1], 0, 0), Ok(0));
        assert!(check_view(&[2], &[1, 1], 0, 8).is_err());
        let max = i64::MAX as usize;
        assert_eq!(check_view(&[1, 2], &[max, 1], 0, 2), Ok(2));
        assert!(check_view(&[1, 2], &[max + 1, 1], 0, 2).is_err());
        assert!(check_view(&[max + 1, 0], &[1, 1], 0, 0).is_err());
    }

    #[test]
    fn iteration_order() {
        let mut seen = vec![];
        // transpose of a 2x3 row-major storage
        for_each_index(&[3, 2], &[1, 3], 0, |i| seen.push(i));
        assert_eq!(seen, vec![0, 3, 1, 4, 2, 5]);
        let mut seen = vec![];
        for_each_index(&[2, 2, 2], &[4, 2, 1], 1, |i| seen.push(i));
        assert_eq!(seen, vec![1, 2, 3, 4, 5, 6, 7, 8]);
    }
}
