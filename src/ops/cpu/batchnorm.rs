//! Batch normalization on CPU:0, over `x` viewed as `[rows, c]` (see
//! [`BatchNormParams`]): per-channel moments (biased variance, as `tf.nn.moments`, in one pass),
//! the normalization `y = x * a + b` with `a = gamma / sqrt(var + epsilon)`, `b = beta - mean * a`
//! (`tf.nn.batch_normalization`'s arithmetic), the moving statistics' update, and the fused
//! gradient; each optionally with a ReLU after the normalization (TensorFlow's
//! `_FusedBatchNormEx`), whose gradient mask the backward pass recomputes from `x`. Two forms
//! keep an activation out of memory: the normalized values' mean over each image (a global
//! average pooling after the layer, [`Normalized::ImageMeans`], its gradient [`Dy::ImageMeans`]),
//! and the input gradient formed by whoever reads it, rows at a time ([`InputGrad`]). Sums add
//! their terms in f32 over runs of a few rows and the runs in f64 ([`F32_RUN`]), over fixed
//! blocks of rows added in order ([`ordered_sums`]), so a result is the same bits on every run.

use rayon::prelude::*;

use crate::ops::cpu::elementwise::relu_grad;
use crate::ops::cpu::{ordered_sums, wide_registers, with_scratch};
use crate::ops::spec::BatchNormParams;

/// Rows per task of the sums and of the element-wise passes.
const ROWS_PER_TASK: usize = 256;

/// Per-channel sums of `f(block, acc)` over every block of [`ROWS_PER_TASK`] rows, in f64,
/// `width` values per row: `f` adds one block's rows (`[first row, end)`) into `acc`.
fn column_sums(
    rows: usize,
    width: usize,
    f: impl Fn((usize, usize), &mut [f64]) + Sync,
) -> Vec<f64> {
    let tasks = rows.div_ceil(ROWS_PER_TASK);
    ordered_sums(tasks, width, |acc, t| {
        f(
            (t * ROWS_PER_TASK, ((t + 1) * ROWS_PER_TASK).min(rows)),
            acc,
        );
    })
}

/// Rows the leaf loops below take as one stretch: below 64 channels, a multiple of 64 values
/// (`64 / gcd(c, 64)` rows of `c`), else one row. Their loops run over a stretch against
/// per-channel values repeated to its length ([`stretched`]), as the compiler vectorizes 64
/// values at a time: a loop over one row ran scalar at 32 channels, and the passes at a third
/// of the memory's speed. From 64 channels a row is long enough, and longer stretches (up to
/// 64 rows at an odd count) only grow the repeated values and the sums past the cache. A
/// block of rows may end inside a stretch (its loops stop short), as long as it starts on a
/// row: every row of a stretch holds the same channels.
fn stretch_rows(c: usize) -> usize {
    if c >= 64 {
        return 1;
    }
    let (mut a, mut b) = (c.max(1), 64);
    while b != 0 {
        (a, b) = (b, a % b);
    }
    64 / a
}

/// `v` (one value per channel) repeated for the [`stretch_rows`] rows of a stretch.
fn stretched<T: Copy>(v: &[T]) -> Vec<T> {
    v.repeat(stretch_rows(v.len()))
}

/// Per-channel sums from sums over stretches: `wide` holds stretch-long sums back to back (row
/// `q`'s channel `j` at `q * c + j`), and each is folded, row by row in order, into `c`
/// per-channel values.
fn fold_stretch(wide: &[f64], c: usize) -> Vec<f64> {
    let stretch = c * stretch_rows(c);
    let mut sums = vec![0.0; wide.len() / stretch.max(1) * c];
    for (sum, part) in sums.chunks_exact_mut(c).zip(wide.chunks_exact(stretch)) {
        for row in part.chunks_exact(c) {
            sum.iter_mut().zip(row).for_each(|(s, r)| *s += r);
        }
    }
    sums
}

/// Stretches ([`stretch_rows`]) whose terms the sums add in f32 before adding them to their
/// f64 sums (one term a stretch per value: at most 16 terms in f32). Widening every term to
/// f64 had cost twice the arithmetic of the f32 loops (the statistics of the modern CNN's
/// first block, 3.2 M values, took 1.1-1.2 ms on one core with the values in cache, 0.54-0.64
/// ms now); 16 terms in f32 add at most 16 roundings (1e-6 of their magnitudes).
const F32_RUN: usize = 16;

multiversion! {
    /// `acc += [Σ (x - shift); Σ (x - shift)²]` over the stretches of `x` (see
    /// [`stretch_rows`]; a last one may be short), in f32 over runs of [`F32_RUN`] stretches
    /// and in f64 across them ([`run_sums`]); `shift` and both halves of `acc` a stretch long.
    fn shifted_sums(x: &[f32], shift: &[f32], acc: &mut [f64]) {
        run_sums((x.len(), shift.len()), acc, &Shifted { x, shift });
    }
}

/// The terms of [`shifted_sums`]: `(d, d²)` with `d = x - shift`.
struct Shifted<'a> {
    x: &'a [f32],
    shift: &'a [f32],
}

impl Terms for Shifted<'_> {
    #[inline(always)]
    fn add_block<const B: usize>(&self, at: usize, j0: usize, (p1, p2): BlockSums<'_, B>) {
        let (x, shift) = (block::<B>(self.x, at + j0), block::<B>(self.shift, j0));
        for l in 0..B {
            let (t1, t2) = shifted(x[l], shift[l]);
            p1[l] += t1;
            p2[l] += t2;
        }
    }

    #[inline(always)]
    fn term(&self, at: usize, j: usize) -> (f32, f32) {
        shifted(self.x[at + j], self.shift[j])
    }
}

/// `(x - shift, (x - shift)²)`.
#[inline(always)]
fn shifted(x: f32, shift: f32) -> (f32, f32) {
    let d = x - shift;
    (d, d * d)
}

/// Values of a stretch whose f32 sums [`run_sums`] keeps in registers across a run: two
/// AVX-512 vectors, four AVX2 ones (after blocks of [`WIDE_BLOCK`] under AVX-512).
const BLOCK: usize = 32;

/// The block under AVX-512: a whole stretch below 64 channels, a row at 64, so that a run
/// reads its rows straight through rather than half a row at a time, twice. The modern CNN's
/// gradient sums over 1.6 M values at 64 channels took 10-25% less (two threads, in one
/// process, alternating: 0.29-0.34 → 0.25-0.27 ms, in a slower hour 0.57-0.60 → 0.50-0.51).
/// Under AVX2 its 128 sums would take all 16 registers.
const WIDE_BLOCK: usize = 64;

/// `s[at..at + B]`.
#[inline(always)]
fn block<const B: usize>(s: &[f32], at: usize) -> &[f32; B] {
    s[at..at + B]
        .try_into()
        .expect("a slice of B values is a block")
}

/// The f32 sums of a block of `B` positions, both terms'.
type BlockSums<'a, const B: usize> = (&'a mut [f32; B], &'a mut [f32; B]);

/// The two terms of each position of a stretch, which [`run_sums`] adds up.
trait Terms {
    /// Adds the terms of positions `j0..j0 + B` of the stretch at `at` to `sums`.
    fn add_block<const B: usize>(&self, at: usize, j0: usize, sums: BlockSums<'_, B>);

    /// The terms of position `j` of the stretch at `at`.
    fn term(&self, at: usize, j: usize) -> (f32, f32);
}

/// `acc += [Σ t₁; Σ t₂]` over the stretches of `len` values in `values` values (a last one
/// may be short), `(t₁, t₂)` the [`Terms`] of a position: in f32 over runs of [`F32_RUN`]
/// stretches, each run's sums added to `acc`'s f64 ones (both halves of `acc` `len` long). A
/// run goes a block of positions at a time through all its stretches ([`WIDE_BLOCK`] or
/// [`BLOCK`], then one by one), the block's sums in registers; position by position over
/// each stretch, the loops had paid their overhead and the sums' loads and stores every 64
/// values: the modern CNN's first-block statistics (3.2 M values, two threads, in one
/// process, alternating) took 0.43-0.54 ms against 0.34-0.46 with blocks of 32, its
/// gradient's sums 0.72-0.76 against 0.66-0.68. Each position's terms are added in stretch
/// order whatever the blocks, so the same bits.
#[inline(always)]
fn run_sums<T: Terms>((values, len): (usize, usize), acc: &mut [f64], terms: &T) {
    let (s1, s2) = acc.split_at_mut(len);
    let wide = wide_registers();
    for base in (0..values).step_by((len * F32_RUN).max(1)) {
        let run = (base, (values - base).min(len * F32_RUN), len);
        let mut j0 = 0;
        if wide {
            while j0 + WIDE_BLOCK <= len {
                block_run::<WIDE_BLOCK, T>(terms, run, j0, (&mut *s1, &mut *s2));
                j0 += WIDE_BLOCK;
            }
        }
        while j0 + BLOCK <= len {
            block_run::<BLOCK, T>(terms, run, j0, (&mut *s1, &mut *s2));
            j0 += BLOCK;
        }
        let (full, short) = (run.1 / len, run.1 % len);
        for j in j0..len {
            let (mut p1, mut p2) = (0.0f32, 0.0f32);
            for i in 0..full + usize::from(short > j) {
                let (t1, t2) = terms.term(base + i * len, j);
                p1 += t1;
                p2 += t2;
            }
            s1[j] += f64::from(p1);
            s2[j] += f64::from(p2);
        }
    }
}

/// [`run_sums`] of positions `j0..j0 + B` over the run of `run_len` values at `base`
/// (stretches of `len`).
#[inline(always)]
fn block_run<const B: usize, T: Terms>(
    terms: &T,
    (base, run_len, len): (usize, usize, usize),
    j0: usize,
    (s1, s2): (&mut [f64], &mut [f64]),
) {
    let (full, short) = (run_len / len, run_len % len);
    let (mut p1, mut p2) = ([0.0f32; B], [0.0f32; B]);
    for i in 0..full {
        terms.add_block::<B>(base + i * len, j0, (&mut p1, &mut p2));
    }
    for l in 0..short.saturating_sub(j0).min(B) {
        let (t1, t2) = terms.term(base + full * len, j0 + l);
        p1[l] += t1;
        p2[l] += t2;
    }
    add_run((&p1, &p2), (&mut s1[j0..j0 + B], &mut s2[j0..j0 + B]));
}

/// Adds a run's f32 sums to the f64 ones (see [`F32_RUN`]).
#[inline(always)]
fn add_run((p1, p2): (&[f32], &[f32]), (s1, s2): (&mut [f64], &mut [f64])) {
    for ((s1, s2), (&p1, &p2)) in s1.iter_mut().zip(s2.iter_mut()).zip(p1.iter().zip(p2)) {
        *s1 += f64::from(p1);
        *s2 += f64::from(p2);
    }
}

/// `(mean, var)` per channel of `x` (`[rows, c]`, rows > 0): biased variance, in one pass of
/// sums of `x - x[0]` and its square ([`shifted_sums`]; the shift by the first row keeps the
/// subtraction `E[d²] - E[d]²` from cancelling when the mean is large against the spread).
pub(crate) fn batch_norm_moments(x: &[f32], rows: usize, c: usize) -> (Vec<f32>, Vec<f32>) {
    assert!(
        x.len() >= rows * c,
        "x holds {} values, not {rows}x{c}",
        x.len()
    );
    assert!(rows > 0 && c > 0, "moments of {rows}x{c} values");
    let shift = &x[..c];
    let wide_shift = stretched(shift);
    let wide = column_sums(rows, 2 * wide_shift.len(), |(r0, r1), acc| {
        shifted_sums(&x[r0 * c..r1 * c], &wide_shift, acc);
    });
    let sums = fold_stretch(&wide, c);
    let n = rows as f64;
    let mut mean = Vec::with_capacity(c);
    let mut var = Vec::with_capacity(c);
    for j in 0..c {
        let (m, sq) = (sums[j] / n, sums[c + j] / n);
        mean.push((f64::from(shift[j]) + m) as f32);
        // Rounding may leave a constant channel a hair below zero; NaN stays NaN.
        let v = sq - m * m;
        var.push(if v < 0.0 { 0.0 } else { v as f32 });
    }
    (mean, var)
}

multiversion! {
    /// `y = x * a + b` per channel, a stretch at a time (`a`, `b` a stretch long, see
    /// [`stretch_rows`]), then `max(y, 0)` with `relu`.
    fn scale_shift(x: &[f32], a: &[f32], b: &[f32], relu: bool, y: &mut [f32]) {
        for (yr, xr) in y.chunks_mut(a.len()).zip(x.chunks(a.len())) {
            let values = yr.iter_mut().zip(xr).zip(a.iter().zip(b));
            if relu {
                for ((y, &x), (&a, &b)) in values {
                    *y = preactivation(x, a, b).max(0.0);
                }
            } else {
                for ((y, &x), (&a, &b)) in values {
                    *y = preactivation(x, a, b);
                }
            }
        }
    }
}

/// The normalized value `x * a + b`, before a fused ReLU: the backward pass recomputes it
/// with this same expression (a product, then a sum: Rust never contracts it into a fused
/// multiply-add), so its sign is the forward pass's to the bit.
#[inline(always)]
fn preactivation(x: f32, a: f32, b: f32) -> f32 {
    x * a + b
}

/// `(a, b)` of `y = x * a + b`: `a = gamma * inv`, `b = beta - mean * a`, from
/// `stats = [mean; inv]` (`tf.nn.batch_normalization`'s arithmetic).
fn affine(gamma: &[f32], beta: &[f32], stats: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let c = gamma.len();
    let (mean, inv) = stats.split_at(c);
    let a: Vec<f32> = gamma.iter().zip(inv).map(|(g, i)| g * i).collect();
    let b: Vec<f32> = (0..c).map(|j| beta[j] - mean[j] * a[j]).collect();
    (a, b)
}

/// Where a forward pass puts the normalized values.
#[derive(Debug)]
pub(crate) enum Normalized<'a> {
    /// `y` itself, `[rows, c]`.
    Values(&'a mut [f32]),
    /// Their mean over each image's `pixels` rows (a global average pooling after the layer),
    /// `pooled` `[rows / pixels, c]`: the values are added up where they are computed and
    /// never written (nor read back by the pooling).
    ImageMeans {
        pooled: &'a mut [f32],
        pixels: usize,
    },
    /// Nowhere: the statistics only, for a reader that normalizes `x` as it copies it (a
    /// [`Normalizer`]).
    Deferred,
}

/// A batch normalization's output `max(x · a + b, 0)` per channel, formed where a reader
/// copies `x` (a strided convolution's zero-padded images) instead of written whole and read
/// back: the same bits as the forward pass's [`Normalized::Values`] with a ReLU.
#[derive(Debug)]
pub(crate) struct Normalizer {
    /// `a` and `b` a stretch long (see [`stretch_rows`]).
    a: Vec<f32>,
    b: Vec<f32>,
}

impl Normalizer {
    /// The normalization `(gamma, beta)` with the training pass's `stats` (`[mean; inv]`).
    pub(crate) fn new((gamma, beta): (&[f32], &[f32]), stats: &[f32]) -> Normalizer {
        assert!(
            beta.len() == gamma.len() && stats.len() == 2 * gamma.len(),
            "Normalizer: {} gammas, {} betas, {} statistics",
            gamma.len(),
            beta.len(),
            stats.len()
        );
        let (a, b) = affine(gamma, beta, stats);
        Normalizer {
            a: stretched(&a),
            b: stretched(&b),
        }
    }

    /// `y = max(x · a + b, 0)`: `x` whole pixels (it starts on channel 0), `y` as long.
    pub(crate) fn apply(&self, x: &[f32], y: &mut [f32]) {
        assert_eq!(x.len(), y.len(), "Normalizer: x and y lengths differ");
        scale_shift(x, &self.a, &self.b, true, y);
    }

    /// Every value of `x` (whole pixels) normalized into `y`, in parallel blocks: for a reader
    /// that cannot normalize as it reads.
    pub(crate) fn apply_all(&self, x: &[f32], y: &mut [f32]) {
        assert_eq!(x.len(), y.len(), "Normalizer: x and y lengths differ");
        let block = ROWS_PER_TASK * self.a.len();
        y.par_chunks_mut(block)
            .zip(x.par_chunks(block))
            .for_each(|(y, x)| self.apply(x, y));
    }
}

/// The normalized values `x * (gamma * inv) + (beta - mean * gamma * inv)` per channel,
/// `stats = [mean; inv]`, then `max(·, 0)` with `relu`, into `out`.
fn normalize(
    x: &[f32],
    (gamma, beta): (&[f32], &[f32]),
    stats: &[f32],
    relu: bool,
    out: Normalized<'_>,
) {
    let y = match out {
        Normalized::Values(y) => y,
        Normalized::ImageMeans { pooled, pixels } => {
            return image_means(x, (gamma, beta), stats, relu, (pooled, pixels));
        }
        Normalized::Deferred => return,
    };
    let c = gamma.len();
    let (a, b) = affine(gamma, beta, stats);
    let (a, b) = (stretched(&a), stretched(&b));
    let n = y.len().min(x.len());
    y[..n]
        .par_chunks_mut(ROWS_PER_TASK * c)
        .zip(x[..n].par_chunks(ROWS_PER_TASK * c))
        .for_each(|(y, x)| scale_shift(x, &a, &b, relu, y));
}

/// The training forward pass: batch statistics into `stats` (`[mean; inv]`, `2c` values, what
/// the backward pass needs), the normalized values into `out` (through a ReLU with `relu`),
/// and the moving statistics updated in place.
#[allow(clippy::too_many_arguments)]
pub(crate) fn batch_norm_train(
    x: &[f32],
    (gamma, beta): (&[f32], &[f32]),
    (moving_mean, moving_var): (&mut [f32], &mut [f32]),
    out: Normalized<'_>,
    stats: &mut [f32],
    p: &BatchNormParams,
    relu: bool,
) {
    let (rows, c) = (p.rows, p.channels);
    let (mean, var) = batch_norm_moments(x, rows, c);
    let one_minus = p.one_minus_momentum();
    for j in 0..c {
        stats[j] = mean[j];
        stats[c + j] = 1.0 / (var[j] + p.epsilon).sqrt();
        moving_mean[j] = moving_mean[j] * p.momentum + mean[j] * one_minus;
        moving_var[j] = moving_var[j] * p.momentum + var[j] * one_minus;
    }
    normalize(x, (gamma, beta), stats, relu, out);
}

/// `pooled[i, :]`, the mean of the normalized values (through a ReLU with `relu`) over image
/// `i`'s `pixels` rows of `x`: each image's rows added in order, then multiplied by `1 /
/// pixels`, so the same bits as the values normalized whole and pooled by the global average
/// pooling.
fn image_means(
    x: &[f32],
    (gamma, beta): (&[f32], &[f32]),
    stats: &[f32],
    relu: bool,
    (pooled, pixels): (&mut [f32], usize),
) {
    let c = gamma.len();
    if c == 0 {
        return;
    }
    let (a, b) = affine(gamma, beta, stats);
    let inv = 1.0 / pixels as f32;
    pooled.par_chunks_mut(c).enumerate().for_each(|(i, out)| {
        let x = &x[i * pixels * c..(i + 1) * pixels * c];
        image_mean(x, &a, &b, relu, inv, out);
    });
}

multiversion! {
    /// `out = inv · Σ_rows (x · a + b)` per channel (through `max(·, 0)` with `relu`), the
    /// rows of `x` (each `out.len()` long) added in order.
    fn image_mean(x: &[f32], a: &[f32], b: &[f32], relu: bool, inv: f32, out: &mut [f32]) {
        out.fill(0.0);
        for row in x.chunks_exact(out.len()) {
            let values = out.iter_mut().zip(row).zip(a.iter().zip(b));
            if relu {
                for ((out, &x), (&a, &b)) in values {
                    *out += preactivation(x, a, b).max(0.0);
                }
            } else {
                for ((out, &x), (&a, &b)) in values {
                    *out += preactivation(x, a, b);
                }
            }
        }
        for out in out.iter_mut() {
            *out *= inv;
        }
    }
}

/// The inference pass: the normalized values from the moving statistics into `out` (through a
/// ReLU with `relu`).
pub(crate) fn batch_norm_infer(
    x: &[f32],
    (gamma, beta): (&[f32], &[f32]),
    (moving_mean, moving_var): (&[f32], &[f32]),
    out: Normalized<'_>,
    p: &BatchNormParams,
    relu: bool,
) {
    let c = p.channels;
    let mut stats = vec![0.0f32; 2 * c];
    for j in 0..c {
        stats[j] = moving_mean[j];
        stats[c + j] = 1.0 / (moving_var[j] + p.epsilon).sqrt();
    }
    normalize(x, (gamma, beta), &stats, relu, out);
}

/// The gradients of the training pass: `dx`, `dgamma = Σ g x̂`, `dbeta = Σ g`, from the
/// forward pass's `stats` (`[mean; inv]`), where `g = dy`, or, after a pass with a fused ReLU
/// (`relu_beta`: the layer's `beta`), ReLU's gradient `g = x̂ · gamma + beta > 0 ? dy : 0`, its
/// mask recomputed from `x` as the forward pass computed it.
#[allow(clippy::too_many_arguments)]
pub(crate) fn batch_norm_backward(
    x: &[f32],
    dy: Dy<'_>,
    gamma: &[f32],
    stats: &[f32],
    relu_beta: Option<&[f32]>,
    dx: &mut [f32],
    (dgamma, dbeta): (&mut [f32], &mut [f32]),
    p: &BatchNormParams,
) {
    let sums = (dgamma, dbeta);
    let grad = InputGrad::new(
        (x, dy),
        (gamma, relu_beta),
        stats,
        sums,
        (p.rows, p.channels),
    );
    grad.all(&mut dx[..p.rows * p.channels]);
}

/// The gradient w.r.t. a training pass's output (its ReLU's, with one fused).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Dy<'a> {
    /// `[rows, c]`.
    Rows(&'a [f32]),
    /// The gradient of a mean over each image's `pixels` rows (a global average pooling after
    /// the layer), `pooled` `[rows / pixels, c]`: each row's is its image's times `1 /
    /// pixels`, as the pooling's gradient spreads it (and formed so, block by block).
    ImageMeans { pooled: &'a [f32], pixels: usize },
}

impl Dy<'_> {
    /// `f` of the gradient of rows `[r0, r1)` (`c` values each): read in place, or spread
    /// into scratch memory.
    fn with_rows<R>(&self, (r0, r1): (usize, usize), c: usize, f: impl FnOnce(&[f32]) -> R) -> R {
        match *self {
            Dy::Rows(dy) => f(&dy[r0 * c..r1 * c]),
            Dy::ImageMeans { pooled, pixels } => with_scratch((r1 - r0) * c, |buf| {
                let inv = 1.0 / pixels as f32;
                for (r, row) in (r0..r1).zip(buf.chunks_exact_mut(c)) {
                    let g = &pooled[r / pixels * c..][..c];
                    row.iter_mut().zip(g).for_each(|(d, &g)| *d = g * inv);
                }
                f(buf)
            }),
        }
    }

    /// Whether it holds `rows` rows of `c`.
    fn holds(&self, rows: usize, c: usize) -> bool {
        match *self {
            Dy::Rows(dy) => dy.len() >= rows * c,
            Dy::ImageMeans { pooled, pixels } => {
                pixels > 0 && rows.is_multiple_of(pixels) && pooled.len() >= rows / pixels * c
            }
        }
    }
}

/// The input gradient of a training pass, `dx = k g + k' (x - mean) + k''` per channel (see
/// [`batch_norm_backward`]), once its sums are known: what a consumer of `dx` needs to form
/// any rows of it where it reads them (a convolution's kernel gradient, block by block in
/// cache, instead of `dx` written whole and read back).
pub(crate) struct InputGrad<'a> {
    x: &'a [f32],
    dy: Dy<'a>,
    c: usize,
    /// The mean, [`stretched`].
    mean: Vec<f32>,
    /// `[k; k'; k'']`, each third [`stretched`].
    coef: Vec<f32>,
    /// The fused ReLU's `(a, b)` ([`affine`]), [`stretched`].
    relu: Option<(Vec<f32>, Vec<f32>)>,
}

impl<'a> InputGrad<'a> {
    /// The sums over `x` (`[rows, c]`) and `dy`, written as `dgamma` and `dbeta`, and the
    /// coefficients of `dx` from them (the other arguments as [`batch_norm_backward`]'s).
    pub(crate) fn new(
        (x, dy): (&'a [f32], Dy<'a>),
        (gamma, relu_beta): (&[f32], Option<&[f32]>),
        stats: &[f32],
        (dgamma, dbeta): (&mut [f32], &mut [f32]),
        (rows, c): (usize, usize),
    ) -> InputGrad<'a> {
        let len = rows * c;
        assert!(
            x.len() >= len && dy.holds(rows, c),
            "batch-norm gradient: x and dy must hold {rows}x{c} values"
        );
        let (mean, inv) = stats.split_at(c);
        let relu = relu_beta.map(|beta| {
            let (a, b) = affine(gamma, beta, stats);
            (stretched(&a), stretched(&b))
        });
        let ab = relu.as_ref().map(|(a, b)| (&a[..], &b[..]));
        let wide_mean = stretched(mean);
        let wide = column_sums(rows, 2 * wide_mean.len(), |(r0, r1), acc| {
            dy.with_rows((r0, r1), c, |g| {
                grad_sums(&x[r0 * c..r1 * c], g, &wide_mean, ab, acc);
            });
        });
        let sums = fold_stretch(&wide, c);
        let n = rows as f32;
        let mut coef = vec![0.0f32; 3 * c];
        for j in 0..c {
            let (s1, s2) = (sums[j] as f32, sums[c + j] as f32);
            let k = gamma[j] * inv[j];
            dbeta[j] = s1;
            dgamma[j] = s2 * inv[j];
            coef[j] = k;
            coef[c + j] = -k * inv[j] * inv[j] * s2 / n;
            coef[2 * c + j] = -k * s1 / n;
        }
        InputGrad {
            x: &x[..len],
            dy,
            c,
            mean: wide_mean,
            coef: stretched_rows(&coef, c),
            relu,
        }
    }

    /// Values of `dx`: rows × channels.
    pub(crate) fn len(&self) -> usize {
        self.x.len()
    }

    /// `dx` of every row, in parallel.
    pub(crate) fn all(&self, dx: &mut [f32]) {
        dx.par_chunks_mut(ROWS_PER_TASK * self.c.max(1))
            .enumerate()
            .for_each(|(t, dx)| self.rows(t * ROWS_PER_TASK, dx));
    }

    /// `dx` of the rows from `first_row` on, as many as `dx` holds (whole rows), on the
    /// calling thread.
    pub(crate) fn rows(&self, first_row: usize, dx: &mut [f32]) {
        let at = first_row * self.c;
        let x = &self.x[at..at + dx.len()];
        let last = first_row + dx.len() / self.c.max(1);
        let relu = self.relu.as_ref().map(|(a, b)| (&a[..], &b[..]));
        self.dy.with_rows((first_row, last), self.c, |dy| {
            input_grad(x, dy, &self.mean, &self.coef, relu, dx);
        });
    }
}

/// `[k; k'; k'']` (`3c` values) with each third [`stretched`].
fn stretched_rows(coef: &[f32], c: usize) -> Vec<f32> {
    coef.chunks_exact(c.max(1)).flat_map(stretched).collect()
}

multiversion! {
    /// `acc = [Σ g; Σ g (x - mean)]` over the stretches of `x` and `dy` (see
    /// [`stretch_rows`]; `mean`, `a`, `b` and both halves of `acc` a stretch long): `g = dy`,
    /// or with `relu = Some((a, b))`, ReLU's gradient at `x * a + b`. Added as
    /// [`shifted_sums`] adds its terms ([`run_sums`]).
    fn grad_sums(
        x: &[f32],
        dy: &[f32],
        mean: &[f32],
        relu: Option<(&[f32], &[f32])>,
        acc: &mut [f64],
    ) {
        let sizes = (x.len().min(dy.len()), mean.len());
        match relu {
            Some((a, b)) => run_sums(sizes, acc, &ReluGrad { x, dy, mean, a, b }),
            None => run_sums(sizes, acc, &Grad { x, dy, mean }),
        }
    }
}

/// `(g, g (x - mean))`, the terms of [`grad_sums`].
#[inline(always)]
fn grad_terms(g: f32, x: f32, mean: f32) -> (f32, f32) {
    (g, g * (x - mean))
}

/// The terms of [`grad_sums`] with `g = dy`.
struct Grad<'a> {
    x: &'a [f32],
    dy: &'a [f32],
    mean: &'a [f32],
}

impl Terms for Grad<'_> {
    #[inline(always)]
    fn add_block<const B: usize>(&self, at: usize, j0: usize, (p1, p2): BlockSums<'_, B>) {
        let (x, dy) = (block::<B>(self.x, at + j0), block::<B>(self.dy, at + j0));
        let mean = block::<B>(self.mean, j0);
        for l in 0..B {
            let (t1, t2) = grad_terms(dy[l], x[l], mean[l]);
            p1[l] += t1;
            p2[l] += t2;
        }
    }

    #[inline(always)]
    fn term(&self, at: usize, j: usize) -> (f32, f32) {
        grad_terms(self.dy[at + j], self.x[at + j], self.mean[j])
    }
}

/// The terms of [`grad_sums`] with ReLU's gradient `g` at `x * a + b`.
struct ReluGrad<'a> {
    x: &'a [f32],
    dy: &'a [f32],
    mean: &'a [f32],
    a: &'a [f32],
    b: &'a [f32],
}

impl Terms for ReluGrad<'_> {
    #[inline(always)]
    fn add_block<const B: usize>(&self, at: usize, j0: usize, (p1, p2): BlockSums<'_, B>) {
        let (x, dy) = (block::<B>(self.x, at + j0), block::<B>(self.dy, at + j0));
        let mean = block::<B>(self.mean, j0);
        let (a, b) = (block::<B>(self.a, j0), block::<B>(self.b, j0));
        for l in 0..B {
            let g = relu_grad(dy[l], preactivation(x[l], a[l], b[l]));
            let (t1, t2) = grad_terms(g, x[l], mean[l]);
            p1[l] += t1;
            p2[l] += t2;
        }
    }

    #[inline(always)]
    fn term(&self, at: usize, j: usize) -> (f32, f32) {
        let (x, dy) = (self.x[at + j], self.dy[at + j]);
        let g = relu_grad(dy, preactivation(x, self.a[j], self.b[j]));
        grad_terms(g, x, self.mean[j])
    }
}

multiversion! {
    /// `dx = k g + k' (x - mean) + k''` per channel, a stretch at a time: `coef = [k; k';
    /// k'']`, each third, `mean`, and the ReLU's `a` and `b` a stretch long; `g` as in
    /// [`grad_sums`].
    fn input_grad(
        x: &[f32],
        dy: &[f32],
        mean: &[f32],
        coef: &[f32],
        relu: Option<(&[f32], &[f32])>,
        dx: &mut [f32],
    ) {
        let len = mean.len();
        let (k, rest) = coef.split_at(len);
        let (k1, k2) = rest.split_at(len);
        for ((dxr, xr), gr) in dx.chunks_mut(len).zip(x.chunks(len)).zip(dy.chunks(len)) {
            let values = dxr.iter_mut().zip(xr.iter().zip(gr)).zip(mean.iter().zip(k));
            let coefs = k1.iter().zip(k2);
            if let Some((a, b)) = relu {
                let coefs = coefs.zip(a.iter().zip(b));
                for (((dx, (&x, &dy)), (&mean, &k)), ((&k1, &k2), (&a, &b))) in values.zip(coefs) {
                    let g = relu_grad(dy, preactivation(x, a, b));
                    *dx = k * g + k1 * (x - mean) + k2;
                }
            } else {
                for (((dx, (&x, &g)), (&mean, &k)), (&k1, &k2)) in values.zip(coefs) {
                    *dx = k * g + k1 * (x - mean) + k2;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::reference::random_vec;

    /// One-pass moments against the two-pass ones in f64, on data whose mean is a million
    /// times its spread (where unshifted sums of squares would cancel to nothing), over more
    /// rows than one task and a channel count no vector width divides.
    #[test]
    fn moments_match_two_passes_with_a_large_mean() {
        let (rows, c) = (1000, 5);
        let x: Vec<f32> = random_vec(rows * c, 1)
            .iter()
            .enumerate()
            .map(|(i, v)| 1.0e4 * (1.0 + (i % c) as f32) + 0.01 * v)
            .collect();
        let (mean, var) = batch_norm_moments(&x, rows, c);
        for j in 0..c {
            let column = || x.iter().skip(j).step_by(c).map(|&v| f64::from(v));
            let m = column().sum::<f64>() / rows as f64;
            let v = column().map(|t| (t - m) * (t - m)).sum::<f64>() / rows as f64;
            assert!((f64::from(mean[j]) - m).abs() <= 1e-7 * m.abs(), "mean {j}");
            assert!(
                (f64::from(var[j]) - v).abs() <= 1e-4 * v,
                "var {j}: {} vs {v}",
                var[j]
            );
        }
    }

    /// The moments and the gradient's sums against two passes in f64, on data whose mean is
    /// about its spread, over many blocks of rows and several runs of f32 sums a block, blocks
    /// that end inside a stretch, and a stretch that blocks of 32 do not divide (100
    /// channels): within 1e-6 of the sums' magnitudes.
    #[test]
    fn sums_stay_within_a_millionth_of_f64() {
        for (rows, c) in [(5000, 32), (3001, 48), (999, 5), (700, 100)] {
            let x: Vec<f32> = random_vec(rows * c, 7)
                .iter()
                .map(|v| 2.0 * v + 1.5)
                .collect();
            let dy = random_vec(rows * c, 8);
            let column = |v: &[f32], j: usize| -> Vec<f64> {
                v.iter().skip(j).step_by(c).map(|&t| f64::from(t)).collect()
            };
            let (mean, var) = batch_norm_moments(&x, rows, c);
            let n = rows as f64;
            let mut means = Vec::new();
            for j in 0..c {
                let xs = column(&x, j);
                let m = xs.iter().sum::<f64>() / n;
                let v = xs.iter().map(|t| (t - m).powi(2)).sum::<f64>() / n;
                assert!(
                    (f64::from(mean[j]) - m).abs() <= 1e-6 * (m.abs() + v.sqrt()),
                    "mean {j}"
                );
                assert!(
                    (f64::from(var[j]) - v).abs() <= 1e-6 * v,
                    "var {j}: {} vs {v}",
                    var[j]
                );
                means.push(mean[j]);
            }
            let wide = stretched(&means);
            let mut acc = vec![0.0f64; 2 * wide.len()];
            grad_sums(&x, &dy, &wide, None, &mut acc);
            let sums = fold_stretch(&acc, c);
            for j in 0..c {
                let (xs, gs) = (column(&x, j), column(&dy, j));
                let s1: f64 = gs.iter().sum();
                let s2: f64 = gs
                    .iter()
                    .zip(&xs)
                    .map(|(g, x)| g * (x - f64::from(means[j])))
                    .sum();
                let scale1: f64 = gs.iter().map(|g| g.abs()).sum();
                let scale2: f64 = gs
                    .iter()
                    .zip(&xs)
                    .map(|(g, x)| (g * (x - f64::from(means[j]))).abs())
                    .sum();
                assert!((sums[j] - s1).abs() <= 1e-6 * scale1, "Σ dy, channel {j}");
                assert!(
                    (sums[c + j] - s2).abs() <= 1e-6 * scale2,
                    "Σ dy x̂, channel {j}"
                );
            }
        }
    }

    /// The passes with a fused ReLU give the bits of the plain passes with the ReLU and its
    /// gradient (`dy` where the output is positive) applied between them: over more rows
    /// than one task, with values at and around zero after the normalization.
    #[test]
    fn a_fused_relu_is_the_relu_between_the_plain_passes() {
        let (rows, c) = (700, 6);
        let p = BatchNormParams {
            rows,
            channels: c,
            momentum: 0.9,
            epsilon: 1e-3,
        };
        let x = random_vec(rows * c, 2);
        let dy = random_vec(rows * c, 3);
        let (gamma, beta) = (random_vec(c, 4), random_vec(c, 5));
        let train = |relu: bool| {
            let (mut mm, mut mv) = (vec![0.0f32; c], vec![1.0f32; c]);
            let (mut y, mut stats) = (vec![0.0f32; rows * c], vec![0.0f32; 2 * c]);
            let vars = (&mut mm[..], &mut mv[..]);
            batch_norm_train(
                &x,
                (&gamma, &beta),
                vars,
                Normalized::Values(&mut y),
                &mut stats,
                &p,
                relu,
            );
            (y, stats, mm, mv)
        };
        let (y, stats, mm, mv) = train(false);
        let (fused, fused_stats, fmm, fmv) = train(true);
        let relu: Vec<f32> = y.iter().map(|v| v.max(0.0)).collect();
        assert_eq!(fused, relu, "forward");
        assert_eq!(
            (fused_stats, fmm, fmv),
            (stats.clone(), mm, mv),
            "statistics"
        );
        assert!(relu.iter().filter(|&&v| v == 0.0).count() > rows * c / 4);

        let backward = |dy: &[f32], relu_beta: Option<&[f32]>| {
            let (mut dx, mut dg, mut db) = (vec![0.0f32; rows * c], vec![0.0; c], vec![0.0; c]);
            let sums = (&mut dg[..], &mut db[..]);
            batch_norm_backward(
                &x,
                Dy::Rows(dy),
                &gamma,
                &stats,
                relu_beta,
                &mut dx,
                sums,
                &p,
            );
            (dx, dg, db)
        };
        let masked: Vec<f32> = dy
            .iter()
            .zip(&fused)
            .map(|(&d, &y)| if y > 0.0 { d } else { 0.0 })
            .collect();
        assert_eq!(
            backward(&dy, Some(&beta)),
            backward(&masked, None),
            "backward"
        );
    }

    /// The per-image means are the normalized values (through the ReLU, in training and in
    /// inference) pooled by the global average pooling's kernel, to the bit; the gradient
    /// from the means is the gradient from what the pooling's gradient spreads, to the bit.
    /// Images of 7 pixels: the blocks of rows start and end inside images.
    #[test]
    fn image_means_are_the_pooled_values() {
        let (images, pixels, c) = (150, 7, 24);
        let rows = images * pixels;
        let p = BatchNormParams {
            rows,
            channels: c,
            momentum: 0.9,
            epsilon: 1e-3,
        };
        let pool = crate::ops::spec::PoolShape {
            n: images,
            h: 1,
            w: pixels,
            c,
        };
        let x = random_vec(rows * c, 6);
        let (gamma, beta) = (random_vec(c, 7), random_vec(c, 8));
        let (moving_mean, moving_var) = (random_vec(c, 9), vec![0.7f32; c]);
        let gb = (&gamma[..], &beta[..]);
        for relu in [false, true] {
            let (mut mm, mut mv) = (moving_mean.clone(), moving_var.clone());
            let (mut y, mut stats) = (vec![0.0f32; rows * c], vec![0.0f32; 2 * c]);
            batch_norm_train(
                &x,
                gb,
                (&mut mm, &mut mv),
                Normalized::Values(&mut y),
                &mut stats,
                &p,
                relu,
            );
            let mut pooled = vec![0.0f32; images * c];
            crate::ops::cpu::pooling::global_avg_pool(&y, &mut pooled, &pool);

            let (mut fmm, mut fmv) = (moving_mean.clone(), moving_var.clone());
            let (mut means, mut fstats) = (vec![f32::NAN; images * c], vec![0.0f32; 2 * c]);
            let moving = (&mut fmm[..], &mut fmv[..]);
            let out = Normalized::ImageMeans {
                pooled: &mut means,
                pixels,
            };
            batch_norm_train(&x, gb, moving, out, &mut fstats, &p, relu);
            assert_eq!(means, pooled, "training, relu {relu}");
            assert_eq!((fstats, fmm, fmv), (stats.clone(), mm, mv), "statistics");

            let moving = (&moving_mean[..], &moving_var[..]);
            batch_norm_infer(&x, gb, moving, Normalized::Values(&mut y), &p, relu);
            crate::ops::cpu::pooling::global_avg_pool(&y, &mut pooled, &pool);
            let out = Normalized::ImageMeans {
                pooled: &mut means,
                pixels,
            };
            batch_norm_infer(&x, gb, moving, out, &p, relu);
            assert_eq!(means, pooled, "inference, relu {relu}");

            let dpooled = random_vec(images * c, 10);
            let mut spread = vec![0.0f32; rows * c];
            crate::ops::cpu::pooling::global_avg_pool_backward(&dpooled, &mut spread, &pool);
            let relu_beta = relu.then_some(&beta[..]);
            let backward = |dy: Dy<'_>| {
                let (mut dx, mut dg, mut db) =
                    (vec![f32::NAN; rows * c], vec![0.0; c], vec![0.0; c]);
                let sums = (&mut dg[..], &mut db[..]);
                batch_norm_backward(&x, dy, &gamma, &stats, relu_beta, &mut dx, sums, &p);
                (dx, dg, db)
            };
            let from_means = backward(Dy::ImageMeans {
                pooled: &dpooled,
                pixels,
            });
            assert_eq!(
                from_means,
                backward(Dy::Rows(&spread)),
                "backward, relu {relu}"
            );
        }
    }
}
