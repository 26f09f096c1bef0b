//! Kernel tests against an independent f64 reference (plain loops over the strided indices).

use super::*;
use crate::dtype::{bf16, f16};

/// One `#[test]` per float element type, named `$f32`, `$f16` and `$bf16`, each running the
/// generic check `$check` on its type.
macro_rules! float_tests {
    ($check:ident: $f32:ident, $f16:ident, $bf16:ident) => {
        #[test]
        fn $f32() {
            $check::<f32>();
        }

        #[test]
        fn $f16() {
            $check::<$crate::dtype::f16>();
        }

        #[test]
        fn $bf16() {
            $check::<$crate::dtype::bf16>();
        }
    };
}
// The lane tests' per-type tests too.
pub(super) use float_tests;

/// xorshift64* generator (the lane tests' values too).
pub(super) struct Rng(u64);

impl Rng {
    pub(super) fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub(super) fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
    fn normal(&mut self) -> f64 {
        let u = 1.0 - self.unit();
        let v = self.unit();
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }
}

/// A strided buffer: storage plus layout.
struct Buf<T> {
    data: Vec<T>,
    shape: Vec<usize>,
    strides: Vec<usize>,
    offset: usize,
}

impl<T: Element> Buf<T> {
    fn view(&self) -> StridedView<'_, T> {
        StridedView::new(&self.data, &self.shape, &self.strides, self.offset)
    }
}

/// How a test buffer is laid out in memory.
#[derive(Clone, Copy, Debug)]
enum Layout {
    /// Row-major.
    Contig,
    /// Dim 1 innermost, the others row-major.
    ChannelsLast,
    /// Channels-last with a gap after each row (rows not contiguous with each other).
    ChannelsLastPadded,
    /// Dims in a random order, gaps between them, a random offset.
    Random(u64),
    /// Row-major but the last dim reversed in order with the one before (a transpose).
    Transposed,
    /// Row-major except `stride[k] = 0` (broadcast) for the last dim.
    Broadcast,
}

fn layout_strides(shape: &[usize], layout: Layout) -> (Vec<usize>, usize) {
    let r = shape.len();
    let mut order: Vec<usize> = (0..r).collect(); // outer → inner
    let mut pad = 0;
    let mut offset = 0;
    match layout {
        Layout::Contig | Layout::Broadcast => {}
        Layout::ChannelsLast => {
            order.remove(1);
            order.push(1);
        }
        Layout::ChannelsLastPadded => {
            order.remove(1);
            order.push(1);
            pad = 3;
        }
        Layout::Random(seed) => {
            let mut rng = Rng::new(seed);
            for i in (1..r).rev() {
                order.swap(i, rng.below(i + 1));
            }
            pad = rng.below(3);
            offset = rng.below(7);
        }
        Layout::Transposed => order.swap(r - 2, r - 1),
    }
    let mut strides = vec![0; r];
    let mut acc = 1;
    for (i, &k) in order.iter().enumerate().rev() {
        strides[k] = acc;
        // Pad only between dims: after the channel dim in the padded channels-last case.
        let gap = if matches!(layout, Layout::ChannelsLastPadded) && k != 1 { 0 } else { pad };
        acc = acc * shape[k] + if i > 0 { gap } else { 0 };
    }
    if matches!(layout, Layout::Broadcast) {
        strides[r - 1] = 0;
    }
    (strides, offset)
}

/// A buffer of `shape` in `layout`, elements drawn by `gen`.
fn make<T: Element>(shape: &[usize], layout: Layout, rng: &mut Rng, gen: impl Fn(&mut Rng) -> f64) -> Buf<T> {
    let (strides, offset) = layout_strides(shape, layout);
    let span =
        if shape.contains(&0) { 0 } else { 1 + shape.iter().zip(&strides).map(|(n, s)| (n - 1) * s).sum::<usize>() };
    let len = offset + span + rng.below(3);
    let data = (0..len).map(|_| T::from_f64(gen(rng))).collect();
    Buf { data, shape: shape.to_vec(), strides, offset }
}

/// The f64 reference: Σdy, Σdy·(x − mean) and Σ|dy·(x − mean)| (for tolerances) per channel.
fn reference<T: Element>(dy: &Buf<T>, x: &Buf<T>, mean: &[f32]) -> (Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>) {
    let c = dy.shape[1];
    let (mut sd, mut sm, mut ad, mut am) = (vec![0.0; c], vec![0.0; c], vec![0.0; c], vec![0.0; c]);
    let total: usize = dy.shape.iter().product();
    let mut idx = vec![0usize; dy.shape.len()];
    for _ in 0..total {
        let od = dy.offset + idx.iter().zip(&dy.strides).map(|(i, s)| i * s).sum::<usize>();
        let ox = x.offset + idx.iter().zip(&x.strides).map(|(i, s)| i * s).sum::<usize>();
        let ch = idx[1];
        let d = f64::from(dy.data[od].to_f32());
        let t = d * (f64::from(x.data[ox].to_f32()) - f64::from(mean[ch]));
        sd[ch] += d;
        sm[ch] += t;
        ad[ch] += d.abs();
        am[ch] += t.abs();
        for k in (0..idx.len()).rev() {
            idx[k] += 1;
            if idx[k] < dy.shape[k] {
                break;
            }
            idx[k] = 0;
        }
    }
    (sd, sm, ad, am)
}

fn path_of<T: Element>(dy: &Buf<T>, x: &Buf<T>) -> Path {
    Geometry::new(&dy.view(), &x.view()).path()
}

/// Relative tolerance per dtype, against Σ|term|. f16 and bf16 widen to f32 exactly and the
/// sums run in the same f32 lanes, so the arithmetic error bound is the same for all three: at
/// most 256 values per lane in sequence (≤ 256·2⁻²⁴ ≈ 1.5e-5 worst case; random data stays far
/// below), then f64.
fn tolerance(_dtype: crate::dtype::DType) -> f64 {
    2e-6
}

fn isas() -> Vec<Isa> {
    Isa::supported()
}

/// Checks the kernel against the reference for one case, on every ISA (bit-identical to each
/// other), with and without xmu (same Σdy bits), and returns the path it took.
fn check_case<T: Element>(shape: &[usize], ld: Layout, lx: Layout, seed: u64, threads: usize) -> Path {
    let mut rng = Rng::new(seed);
    let dy: Buf<T> = make(shape, ld, &mut rng, |r| r.uniform(-2.0, 2.0));
    let x: Buf<T> = make(shape, lx, &mut rng, |r| r.uniform(-3.0, 3.0));
    let mean: Vec<f32> = (0..shape[1]).map(|_| rng.uniform(-1.0, 1.0) as f32).collect();
    let (rd, rm, ad, am) = reference(&dy, &x, &mean);
    let tol = tolerance(T::DTYPE);
    let mut first: Option<ChannelSums> = None;
    // Every ISA on the general paths (tiny path off), then the tiny path where it applies.
    let elems: usize = shape.iter().product();
    let runs =
        isas().into_iter().map(|isa| (isa, 0)).chain((elems <= TINY_ELEMS).then_some((Isa::detect(), TINY_ELEMS)));
    for (isa, tiny) in runs {
        let got = channel_sums_with(isa, 1024, tiny, dy.view(), x.view(), &mean, true, threads).unwrap();
        let no_xmu = channel_sums_with(isa, 1024, tiny, dy.view(), x.view(), &mean, false, threads).unwrap();
        assert_eq!(no_xmu.sum_dy_xmu, None);
        let gm = got.sum_dy_xmu.as_ref().expect("xmu requested");
        for ch in 0..shape[1] {
            let ctx = format!("{:?} shape {shape:?} {ld:?}/{lx:?} seed {seed} ch {ch} {isa:?}", T::DTYPE);
            assert!((got.sum_dy[ch] - rd[ch]).abs() <= tol * ad[ch], "sum_dy {} vs {} {ctx}", got.sum_dy[ch], rd[ch]);
            assert!((gm[ch] - rm[ch]).abs() <= tol * am[ch], "sum_dy_xmu {} vs {} {ctx}", gm[ch], rm[ch]);
            assert_eq!(got.sum_dy[ch].to_bits(), no_xmu.sum_dy[ch].to_bits(), "with_xmu changed sum_dy: {ctx}");
        }
        match &first {
            None => first = Some(got),
            Some(f) if tiny == 0 => assert!(bits_eq(f, &got), "ISAs differ: {shape:?} {ld:?}/{lx:?}"),
            Some(_) => {}
        }
    }
    path_of(&dy, &x)
}

fn bits_eq(a: &ChannelSums, b: &ChannelSums) -> bool {
    let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    bits(&a.sum_dy) == bits(&b.sum_dy) && a.sum_dy_xmu.as_deref().map(bits) == b.sum_dy_xmu.as_deref().map(bits)
}

fn all_cases<T: Element>() {
    use Layout::*;
    let mut seen = std::collections::HashSet::new();
    let mut note = |p: Path| {
        seen.insert(match p {
            Path::Runs => "runs",
            Path::Rows(Some(_)) => "super-rows",
            Path::Rows(None) => "rows",
            Path::Gather => "gather",
        });
    };
    // Targeted shapes per path.
    let fixed: &[(&[usize], Layout, Layout)] = &[
        (&[3, 5, 40], Contig, Contig),              // runs, short with tails
        (&[2, 3, 9001], Contig, Contig),            // runs, long runs cut into segments
        (&[1, 1, 20000], Contig, Contig),           // runs, one long channel
        (&[5, 4, 3, 7], Contig, Contig),            // runs after merging H·W = 21
        (&[2, 3, 4, 5], Contig, Contig),            // merged 20
        (&[200, 3], Contig, Contig),                // super-rows, lcm(3, 8) = 24
        (&[4, 2], Contig, Contig),                  // super-rows, partial
        (&[33, 64, 5], ChannelsLast, ChannelsLast), // super-rows, C = 64
        (&[3, 7, 5, 11], ChannelsLast, ChannelsLast),
        (&[6, 1100, 3], ChannelsLast, ChannelsLast), // per-row rows, C chunked (lcm > 1024)
        (&[9, 20, 5], ChannelsLastPadded, ChannelsLastPadded), // per-row rows, gaps
        (&[9, 5, 5], ChannelsLastPadded, ChannelsLastPadded), // small C with gaps: gather
        (&[4, 6, 3], Contig, Contig),                // short runs: gather
        (&[3, 5, 40], Contig, ChannelsLast),         // mixed: gather
        (&[3, 5, 6, 40], Transposed, Transposed),    // runs along H after sorting
        (&[3, 5, 6, 40], Contig, Transposed),        // gather
        (&[2, 3, 50], Broadcast, Contig),            // stride 0: gather
        (&[3, 17], Random(1), Random(2)),
        (&[1, 3, 1, 30], Contig, Contig),
        (&[37, 1], Contig, Contig),
        (&[1, 5], Contig, Contig),                 // one position: one partial super-row
        (&[1, 20, 1], ChannelsLastPadded, Contig), // one position, mixed: gather
        (&[2, 70, 1], Random(9), ChannelsLast),
    ];
    for (i, &(shape, ld, lx)) in fixed.iter().enumerate() {
        for threads in [1, 3] {
            note(check_case::<T>(shape, ld, lx, 100 + i as u64, threads));
        }
    }
    // Random shapes: every rank 2..=8, every layout pair.
    let layouts = |s: u64| [Contig, ChannelsLast, ChannelsLastPadded, Random(s), Transposed, Broadcast];
    let mut rng = Rng::new(7);
    for rank in 2..=8 {
        for (a, ld) in layouts(rank as u64).into_iter().enumerate() {
            for (b, lx) in layouts(rank as u64 * 31 + 5).into_iter().enumerate() {
                if a != b && a != 0 && b != 0 && a != 3 {
                    continue; // all pairs with Contig or Random, and every same-layout pair
                }
                let max = [0, 0, 40, 12, 6, 4, 3, 3, 2][rank];
                let shape: Vec<usize> = (0..rank).map(|k| 1 + rng.below(if k == 1 { 5 } else { max })).collect();
                note(check_case::<T>(&shape, ld, lx, rng.next_u64(), 2));
            }
        }
    }
    for p in ["runs", "super-rows", "rows", "gather"] {
        assert!(seen.contains(p), "path {p} never taken");
    }
}

float_tests!(all_cases: matches_reference_f32, matches_reference_f16, matches_reference_bf16);

#[test]
fn path_choice() {
    let p = |shape: &[usize], l: Layout| {
        let (strides, offset) = layout_strides(shape, l);
        let v = StridedView::new(&[0f32][..], shape, &strides, offset);
        Geometry::new(&v, &v).path()
    };
    assert_eq!(p(&[8, 64, 56, 56], Layout::Contig), Path::Runs);
    assert_eq!(p(&[8, 64, 56, 56], Layout::ChannelsLast), Path::Rows(Some(64)));
    assert_eq!(p(&[8, 3, 56, 56], Layout::ChannelsLast), Path::Rows(Some(72)));
    assert_eq!(p(&[8, 2000, 7, 7], Layout::ChannelsLast), Path::Rows(None));
    assert_eq!(p(&[8, 2001, 7], Layout::ChannelsLast), Path::Rows(None));
    assert_eq!(p(&[4, 2], Layout::Contig), Path::Rows(Some(64)));
    assert_eq!(p(&[8, 64, 56, 56], Layout::Transposed), Path::Runs);
    assert_eq!(p(&[8, 64, 3], Layout::Contig), Path::Gather);
    assert_eq!(p(&[256, 1, 65536], Layout::Contig), Path::Runs);
}

#[test]
fn thread_count_independence() {
    use Layout::*;
    // A low spawn threshold (4 KiB per thread) so that these small inputs really use 2, 3 and 8
    // threads, every path, with item ranges that split channels, tiles and lane chunks.
    let cases: &[(&[usize], Layout, Layout)] = &[
        (&[4, 3, 10_000], Contig, Contig),
        (&[3, 2, 20_000], Contig, Contig),
        (&[4000, 24, 1], ChannelsLast, ChannelsLast),
        (&[300, 1500, 1], ChannelsLast, ChannelsLast),
        (&[400, 200, 2], ChannelsLastPadded, ChannelsLastPadded),
        (&[20, 40, 100], Contig, ChannelsLast),
    ];
    for (i, &(shape, ld, lx)) in cases.iter().enumerate() {
        let mut rng = Rng::new(900 + i as u64);
        let dy: Buf<bf16> = make(shape, ld, &mut rng, |r| r.uniform(-2.0, 2.0));
        let x: Buf<bf16> = make(shape, lx, &mut rng, |r| r.uniform(-3.0, 3.0));
        let mean: Vec<f32> = (0..shape[1]).map(|_| rng.uniform(-1.0, 1.0) as f32).collect();
        let run =
            |threads, xmu| channel_sums_with(Isa::detect(), 4096, 0, dy.view(), x.view(), &mean, xmu, threads).unwrap();
        let one = run(1, true);
        for threads in [2, 3, 8, 0] {
            let got = run(threads, true);
            assert!(bits_eq(&one, &got), "{shape:?} {ld:?}/{lx:?}: threads {threads} differ from 1");
            assert_eq!(run(threads, false).sum_dy, one.sum_dy);
        }
    }
    // Through the real entry and threshold: 48 MiB of dy + x, several threads' worth.
    let shape = [2, 3, 1 << 20];
    let mut rng = Rng::new(77);
    let dy: Buf<f32> = make(&shape, Contig, &mut rng, |r| r.uniform(-2.0, 2.0));
    let x: Buf<f32> = make(&shape, Contig, &mut rng, |r| r.uniform(-3.0, 3.0));
    assert!(dy.data.len() * 8 >= 8 * MIN_BYTES_PER_THREAD);
    let mean = [0.1, 0.2, 0.3];
    let one = channel_sums(dy.view(), x.view(), &mean, true, 1).unwrap();
    for threads in [2, 3, 8, 0] {
        assert!(bits_eq(&one, &channel_sums(dy.view(), x.view(), &mean, true, threads).unwrap()), "threads {threads}");
    }
}

/// `parallel` hands out the fixed item ranges, each once, with its own partials.
#[test]
fn parallel_covers_every_item_once() {
    for (n, threads) in [(0, 4), (1, 4), (7, 3), (100, 8), (5, 1)] {
        let mut pd = vec![0.0; n * 2];
        let ranges = std::sync::Mutex::new(Vec::new());
        parallel(
            n,
            threads,
            threads,
            |i| 2 * i,
            &mut pd,
            &mut [],
            |items, pd, pm| {
                assert!(pm.is_empty());
                assert_eq!(pd.len(), 2 * items.len());
                ranges.lock().unwrap().push(items.clone());
                for (k, i) in items.enumerate() {
                    pd[2 * k] = i as f64;
                    pd[2 * k + 1] += 1.0;
                }
            },
        )
        .unwrap();
        let expect: Vec<f64> = (0..n).flat_map(|i| [i as f64, 1.0]).collect();
        assert_eq!(pd, expect, "n {n} threads {threads}");
        let mut ranges = ranges.into_inner().unwrap();
        ranges.sort_by_key(|r| r.start);
        let t = threads.min(n).max(1);
        let want: Vec<_> = (0..t).map(|k| n * k / t..n * (k + 1) / t).collect();
        assert_eq!(ranges, want, "n {n} threads {threads}");
    }
}

/// Relative error of each sum over one long channel of positive data.
fn long_channel<T: Element>(shape: &[usize], layout: Layout) -> (f64, f64) {
    let mut rng = Rng::new(42);
    let dy: Buf<T> = make(shape, layout, &mut rng, |r| r.uniform(0.1, 5.5));
    let x: Buf<T> = make(shape, layout, &mut rng, |r| r.uniform(0.5, 5.0));
    let mean = vec![0.25f32; shape[1]];
    let (rd, rm, _, _) = reference(&dy, &x, &mean);
    let got = channel_sums(dy.view(), x.view(), &mean, true, 0).unwrap();
    let gm = got.sum_dy_xmu.expect("xmu");
    let rel = |a: f64, b: f64| ((a - b) / b).abs();
    let ed = (0..shape[1]).map(|c| rel(got.sum_dy[c], rd[c])).fold(0.0, f64::max);
    let em = (0..shape[1]).map(|c| rel(gm[c], rm[c])).fold(0.0, f64::max);
    (ed, em)
}

#[test]
fn long_channel_accuracy() {
    // 4M elements in one channel (a sequential f32 sum is off by ~1e-3 here).
    for (e, name) in [
        (long_channel::<f32>(&[4, 1, 1 << 20], Layout::Contig), "f32 runs"),
        (long_channel::<bf16>(&[4, 1, 1 << 20], Layout::Contig), "bf16 runs"),
        (long_channel::<f16>(&[1 << 22, 1], Layout::Contig), "f16 [4M, 1]"),
        (long_channel::<f32>(&[1 << 21, 2, 1], Layout::ChannelsLast), "f32 super-rows, 2M per channel"),
        (long_channel::<f32>(&[1 << 18, 16, 1], Layout::ChannelsLastPadded), "f32 rows, 256K per channel"),
    ] {
        assert!(e.0 <= 1e-6 && e.1 <= 1e-6, "{name}: relative errors {e:?}");
    }
}

#[test]
fn cancellation_two_pass() {
    // x = 1000 + N(0, 1), mean = the exact mean: the one-pass form loses ~1e-3 here.
    for (shape, layout) in [(&[4, 1, 65536][..], Layout::Contig), (&[65536, 4][..], Layout::Contig)] {
        let mut rng = Rng::new(5);
        let dy: Buf<f32> = make(shape, layout, &mut rng, |r| r.normal());
        let x: Buf<f32> = make(shape, layout, &mut rng, |r| 1000.0 + r.normal());
        let c = shape[1];
        // The per-channel mean of x, in f64 (the reference's Σdy with dy := x), rounded once.
        let (sum_x, _, _, _) = reference(&x, &x, &vec![0.0; c]);
        let r = shape.iter().product::<usize>() / c;
        let mean: Vec<f32> = sum_x.iter().map(|&s| (s / r as f64) as f32).collect();
        let (_, rm, _, _) = reference(&dy, &x, &mean);
        let got = channel_sums(dy.view(), x.view(), &mean, true, 0).unwrap();
        let gm = got.sum_dy_xmu.expect("xmu");
        for ch in 0..c {
            let rel = ((gm[ch] - rm[ch]) / rm[ch]).abs();
            assert!(rel <= 1e-5, "{shape:?} ch {ch}: {} vs {} ({rel:e})", gm[ch], rm[ch]);
        }
    }
}

#[test]
fn nan_and_inf_propagate() {
    use Layout::*;
    for (shape, layout) in [
        (&[2, 4, 37][..], Contig),
        (&[37, 4][..], Contig),
        (&[37, 20, 1][..], ChannelsLastPadded),
        (&[2, 4, 5][..], Contig),
    ] {
        let mut rng = Rng::new(3);
        let mut dy: Buf<f32> = make(shape, layout, &mut rng, |r| r.uniform(0.5, 1.5));
        let mut x: Buf<f32> = make(shape, layout, &mut rng, |r| r.uniform(-1.0, 1.0));
        let c = shape[1];
        // Element (last n, ch, last spatial...) of a channel: lands in a tail where one exists.
        let at = |b: &Buf<f32>, ch: usize| {
            b.offset
                + b.shape
                    .iter()
                    .zip(&b.strides)
                    .enumerate()
                    .map(|(k, (n, s))| if k == 1 { ch * s } else { (n - 1) * s })
                    .sum::<usize>()
        };
        let mut mean = vec![0.0f32; c];
        let i = at(&dy, 0);
        dy.data[i] = f32::NAN; // ch 0: both sums NaN
        let i = at(&x, 1);
        x.data[i] = f32::INFINITY; // ch 1: Σdy finite, Σdy·(x−m) = +inf (dy > 0)
        let i = at(&dy, 2);
        dy.data[i] = f32::INFINITY; // ch 2: Σdy = +inf
        mean[3] = f32::INFINITY; // ch 3: every term −inf, none NaN
        let got = channel_sums(dy.view(), x.view(), &mean, true, 1).unwrap();
        let m = got.sum_dy_xmu.expect("xmu");
        let ctx = format!("{shape:?} {layout:?}");
        assert!(got.sum_dy[0].is_nan() && m[0].is_nan(), "{ctx}");
        assert!(got.sum_dy[1].is_finite() && m[1] == f64::INFINITY, "{ctx}: {}", m[1]);
        assert!(got.sum_dy[2] == f64::INFINITY, "{ctx}");
        assert!(got.sum_dy[3].is_finite() && m[3] == f64::NEG_INFINITY, "{ctx}: {}", m[3]);
    }
}

#[test]
fn empty_inputs_give_zeros() {
    for shape in [&[0, 3, 4][..], &[2, 3, 0], &[2, 3, 4, 0, 5], &[0, 2]] {
        let strides = crate::layout::contiguous_strides(shape);
        let v = StridedView::new(&[] as &[f32], shape, &strides, 0);
        let got = channel_sums(v, v, &[1.0; 3][..shape[1]], true, 0).unwrap();
        assert_eq!(got.sum_dy[..], vec![0.0; shape[1]][..]);
        assert_eq!(got.sum_dy_xmu.as_deref(), Some(&vec![0.0; shape[1]][..]));
        let got = channel_sums(v, v, &[1.0; 3][..shape[1]], false, 0).unwrap();
        assert_eq!(got.sum_dy_xmu, None);
    }
    let shape = [4, 0, 2];
    let v = StridedView::new(&[] as &[bf16], &shape, &[0, 2, 1], 0);
    let got = channel_sums(v, v, &[], true, 0).unwrap();
    assert!(got.sum_dy.is_empty() && got.sum_dy_xmu.is_some_and(|s| s.is_empty()));
}

#[test]
fn small_known_values() {
    // The crate-level doc example: dy, x of shape [4, 2], mean 1.
    let dy = [1f32, 1., 1., 2., 2., 2., 3., 3.];
    let x = [0f32, 1., 2., 3., 4., 5., 6., 7.];
    let (shape, strides) = ([4, 2], [2, 1]);
    let dy = StridedView::new(&dy[..], &shape, &strides, 0);
    let x = StridedView::new(&x[..], &shape, &strides, 0);
    let got = channel_sums(dy, x, &[1.0, 1.0], true, 0).unwrap();
    assert_eq!(got.sum_dy[..], [7.0, 8.0]);
    assert_eq!(got.sum_dy_xmu.as_deref(), Some(&[21.0, 30.0][..]));
}

/// Per-ISA throughput of the whole kernel on the bench's cache-resident shapes, one thread,
/// interleaved, best of 30 (GB/s of dy + x): the in-process A/B the public bench cannot do.
/// `cargo test --release --lib isa_throughput -- --ignored --nocapture`
#[test]
#[ignore]
fn isa_throughput() {
    fn one<T: Element>(name: &str, shape: &[usize], cl: bool) {
        let mut rng = Rng::new(3);
        let l = if cl { Layout::ChannelsLast } else { Layout::Contig };
        let dy: Buf<T> = make(shape, l, &mut rng, |r| r.uniform(-2.0, 2.0));
        let x: Buf<T> = make(shape, l, &mut rng, |r| r.uniform(-3.0, 3.0));
        let mean: Vec<f32> = (0..shape[1]).map(|i| 0.1 * i as f32).collect();
        let isas = Isa::supported();
        let mut best = vec![f64::MAX; isas.len()];
        for _ in 0..30 {
            for (k, &isa) in isas.iter().enumerate().skip(1) {
                let t = std::time::Instant::now();
                for _ in 0..20 {
                    std::hint::black_box(
                        channel_sums_with(isa, MIN_BYTES_PER_THREAD, 0, dy.view(), x.view(), &mean, true, 1).unwrap(),
                    );
                }
                best[k] = best[k].min(t.elapsed().as_secs_f64() / 20.0);
            }
        }
        let bytes = 2.0 * (dy.data.len() * std::mem::size_of::<T>()) as f64;
        let s: Vec<String> =
            isas.iter().zip(&best).skip(1).map(|(i, b)| format!("{i:?} {:.1}", bytes / b / 1e9)).collect();
        println!("{name} {} {shape:?}: {}", if cl { "CL  " } else { "NCHW" }, s.join("  "));
    }
    for shape in [&[2usize, 16, 32, 32][..], &[4, 32, 32, 32], &[8, 64, 32, 32]] {
        for cl in [false, true] {
            one::<f32>("f32 ", shape, cl);
            one::<f16>("f16 ", shape, cl);
            one::<bf16>("bf16", shape, cl);
        }
    }
}

/// The pool runs every chunk once, from several callers at a time, and a panicking chunk is
/// re-raised on its caller without hanging it or the pool.
#[test]
fn pool_chunks_concurrency_and_panics() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let helpers = pool::helpers();
    std::thread::scope(|s| {
        for t in 0..4 {
            s.spawn(move || {
                for round in 0..200 {
                    let n = 1 + (t * 7 + round) % 40;
                    let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
                    pool::run(8, n, &|k| {
                        hits[k].fetch_add(1, Ordering::Relaxed);
                    });
                    assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1), "n {n}");
                }
            });
        }
    });
    for _ in 0..20 {
        let r = std::panic::catch_unwind(|| {
            pool::run(2, 64, &|k| {
                if k == 40 {
                    panic!("chunk {k}");
                }
                std::hint::black_box(k);
            })
        });
        assert!(r.is_err());
    }
    // Still usable afterwards, with the same helpers.
    let sum = AtomicUsize::new(0);
    pool::run(2, 100, &|k| {
        sum.fetch_add(k, Ordering::Relaxed);
    });
    assert_eq!(sum.into_inner(), 4950);
    assert_eq!(pool::helpers(), helpers);
}

/// Every path (runs, super-rows, rows, gather) and every dtype on shapes small enough for Miri
/// (`.ci/miri` runs this one of the kernel's tests: the others take minutes there), one and three
/// threads, against the f64 reference.
#[test]
fn every_path_on_small_shapes() {
    use Layout::*;
    let cases: &[(&[usize], Layout, Layout)] = &[
        (&[3, 5, 40], Contig, Contig),                         // runs with tails
        (&[4, 2], Contig, Contig),                             // super-rows, partial
        (&[9, 20, 5], ChannelsLastPadded, ChannelsLastPadded), // per-row rows with gaps
        (&[4, 6, 3], Contig, Contig),                          // short runs: gather
        (&[2, 3, 50], Broadcast, Contig),                      // stride 0: gather
    ];
    let mut seen = std::collections::HashSet::new();
    for (i, &(shape, ld, lx)) in cases.iter().enumerate() {
        for threads in [1, 3] {
            let seed = 500 + i as u64;
            seen.insert(format!("{:?}", check_case::<f32>(shape, ld, lx, seed, threads)));
            check_case::<f16>(shape, ld, lx, seed, threads);
            check_case::<bf16>(shape, ld, lx, seed, threads);
        }
    }
    for p in ["Runs", "Rows(Some", "Rows(None)", "Gather"] {
        assert!(seen.iter().any(|s| s.starts_with(p)), "path {p} never taken: {seen:?}");
    }
}
