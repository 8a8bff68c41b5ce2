//! The tile transforms over rows of channels: each tile's input `Bᵀ d B`, its output `Aᵀ m
//! A` and output gradient `A dz Aᵀ`, vectors of channels at a time, between the images and
//! the per-task scratch memory of [`super::correlate`] and the kernel gradients; and the
//! kernel's own `G g Gᵀ` and its gradient, channel pairs side by side. The one-dimensional
//! maps they apply are in [`super::tiles`].

use rayon::prelude::*;

use crate::ops::cpu::{Vector, V16, V8};

use super::tiles::{f2, f2_tile, f4, square, Map, Value};
use super::{Correlation, Tile};

/// Channels a transform works on at once: one AVX-512 vector.
const CHUNK: usize = 16;

/// Channel pairs a kernel transform's task takes: 64 KiB of kernel.
const PAIRS_PER_TASK: usize = 16 * 1024;

/// `G g Gᵀ` from a `[3, 3, pairs]` kernel into `[ξ, pairs]`, or with `back`, `Gᵀ dU G` from
/// `[ξ, pairs]` into `[3, 3, pairs]`: the channel pairs side by side, as channels are in the
/// tiles' transforms, cut into tasks of [`PAIRS_PER_TASK`].
pub(super) fn transform_pairs(from: &[f32], c: &Correlation, to: &mut [f32], back: bool) {
    let pairs = c.c_in * c.c_out;
    if pairs == 0 {
        return;
    }
    let mut tasks: Vec<Vec<&mut [f32]>> = Vec::new();
    tasks.resize_with(pairs.div_ceil(PAIRS_PER_TASK), Vec::new);
    for row in to.chunks_exact_mut(pairs) {
        for (task, part) in tasks.iter_mut().zip(row.chunks_mut(PAIRS_PER_TASK)) {
            task.push(part);
        }
    }
    tasks.into_par_iter().enumerate().for_each(|(t, mut outs)| {
        let first = t * PAIRS_PER_TASK;
        let ins: Vec<&[f32]> = from
            .chunks_exact(pairs)
            .map(|row| &row[first..first + outs[0].len()])
            .collect();
        transform_pair_block(&ins, &mut outs, c.tile, back);
    });
}

multiversion! {
    /// [`transform_pairs`] on one block of channel pairs: `ins` and `outs` its rows.
    fn transform_pair_block(ins: &[&[f32]], outs: &mut [&mut [f32]], tile: Tile, back: bool) {
        let mut tmp = vec![0.0f32; 3 * (tile.side() + 2) * outs[0].len()];
        match (tile, back) {
            (Tile::F2, false) => separable::<3, 4, f2::G>(ins, outs, &mut tmp),
            (Tile::F4, false) => separable::<3, 6, f4::G>(ins, outs, &mut tmp),
            (Tile::F2, true) => separable::<4, 3, f2::Gt>(ins, outs, &mut tmp),
            (Tile::F4, true) => separable::<6, 3, f4::Gt>(ins, outs, &mut tmp),
        }
    }
}

/// `outs[q][k] = L([ins[0][k], ins[1][k], ...])[q]` for every channel `k` (`outs` all as
/// long, `ins` at least as long). A chunk of [`CHUNK`] channels at a time is copied into
/// arrays and transformed there, so the compiler turns the per-channel arithmetic into whole
/// vectors whatever the channel count (a plain loop over 32 channels ran scalar: the
/// vectorized loop takes 64 at a time); the last channels one by one.
#[inline(always)]
fn per_channel<const N: usize, const M: usize, L: Map<N, M>>(
    ins: [&[f32]; N],
    outs: &mut [&mut [f32]],
) {
    let len = outs[0].len();
    let mut k0 = 0;
    while k0 + CHUNK <= len {
        let mut chunk = [[0.0; CHUNK]; N];
        for (chunk, src) in chunk.iter_mut().zip(ins) {
            chunk.copy_from_slice(&src[k0..k0 + CHUNK]);
        }
        let mut results = [[0.0; CHUNK]; M];
        for k in 0..CHUNK {
            let mut one = [0.0; N];
            for q in 0..N {
                one[q] = chunk[q][k];
            }
            let one = L::map(one);
            for q in 0..M {
                results[q][k] = one[q];
            }
        }
        for (dst, result) in outs.iter_mut().zip(&results) {
            dst[k0..k0 + CHUNK].copy_from_slice(result);
        }
        k0 += CHUNK;
    }
    for k in k0..len {
        let mut one = [0.0; N];
        for q in 0..N {
            one[q] = ins[q][k];
        }
        for (dst, value) in outs.iter_mut().zip(L::map(one)) {
            dst[k] = value;
        }
    }
}

/// `outs = L ins Lᵀ` channel by channel: `ins` an `I × I` tile of channel rows (row-major),
/// `outs` `O × O`. `L` maps each column into `tmp` (`[I, O, channels]`), then each row of
/// `tmp`: two passes of a one-dimensional map that the compiler vectorizes, where one pass
/// over a whole 6×6 tile ran scalar.
#[inline(always)]
fn separable<const I: usize, const O: usize, L: Map<I, O>>(
    ins: &[&[f32]],
    outs: &mut [&mut [f32]],
    tmp: &mut [f32],
) {
    let len = outs[0].len();
    for (s, col) in tmp.chunks_exact_mut(O * len).take(I).enumerate() {
        let mut src = [ins[0]; I];
        for (r, src) in src.iter_mut().enumerate() {
            *src = ins[r * I + s];
        }
        per_channel::<I, O, L>(src, &mut rows_of::<O>(col, len));
    }
    for (r, outs) in outs.chunks_exact_mut(O).enumerate() {
        let mut src = [&tmp[..0]; I];
        for (s, src) in src.iter_mut().enumerate() {
            *src = &tmp[(s * O + r) * len..][..len];
        }
        per_channel::<I, O, L>(src, outs);
    }
}

/// `out` (`E` rows of `width`) as its rows.
#[inline(always)]
fn rows_of<const E: usize>(out: &mut [f32], width: usize) -> [&mut [f32]; E] {
    let mut rows: [&mut [f32]; E] = std::array::from_fn(|_| Default::default());
    for (row, chunk) in rows.iter_mut().zip(out.chunks_exact_mut(width)) {
        *row = chunk;
    }
    rows
}

/// A tile's transform over channel rows: its `A` input rows (row-major over the tile) into
/// its `B` output rows, `len` channels each. The rows come as plain pointers: from slices,
/// every vector's load and store read a fat pointer from an array on the stack and checked
/// its bounds; without that, F(4×4, 3×3)'s transforms take 7-36% less time.
trait TileMap<const A: usize, const B: usize> {
    /// Transforms one tile, channel by channel.
    ///
    /// # Safety
    /// Each of `ins` is readable and each of `outs` writable for `len` floats, and no output
    /// row overlaps another row, in or out.
    unsafe fn apply(ins: &[*const f32; A], outs: &[*mut f32; B], len: usize);
}

/// The vector at `p + k`.
///
/// # Safety
/// `p + k` is readable for `V::LANES` floats.
#[inline(always)]
unsafe fn load<V: Vector>(p: *const f32, k: usize) -> V {
    V::load(unsafe { std::slice::from_raw_parts(p.add(k), V::LANES) }, 0)
}

/// Writes `v` to `p + k`.
///
/// # Safety
/// `p + k` is writable for `V::LANES` floats, and no reference covers them.
#[inline(always)]
unsafe fn store<V: Vector>(v: V, p: *mut f32, k: usize) {
    v.store(
        unsafe { std::slice::from_raw_parts_mut(p.add(k), V::LANES) },
        0,
    )
}

/// A whole-tile map `T` into `B` rows in one pass ([`per_channel`]): F(2×2, 3×3)'s input
/// transform ([`f2_tile`]), which ran 10-15% slower on vectors (`by_vectors!`).
struct OnePass<T>(std::marker::PhantomData<T>);

impl<const A: usize, const B: usize, T: Map<A, B>> TileMap<A, B> for OnePass<T> {
    #[inline(always)]
    unsafe fn apply(ins: &[*const f32; A], outs: &[*mut f32; B], len: usize) {
        let ins = ins.map(|p| unsafe { std::slice::from_raw_parts(p, len) });
        let mut outs = outs.map(|p| unsafe { std::slice::from_raw_parts_mut(p, len) });
        per_channel::<A, B, T>(ins, &mut outs);
    }
}

/// Defines a [`TileMap`] `L x Lᵀ` that works on vectors `V` of channels, each tile's values
/// loaded from its rows and kept in registers: `L` on each column (one local per column, its
/// input rows listed), then on each row, each result stored straight into its output row
/// (the last channels one at a time). Against two passes of [`per_channel`] through a
/// scratch tile, F(4×4, 3×3)'s output transform ran 20-40% faster, its input transform
/// 0-20%; the same arithmetic in the same order, so the same bits. Written out: a column
/// array built by `from_fn`, or a row consumed by `into_iter`, left the vectors to be copied
/// through memory, and ran as slow as the passes; the rows written out one by one, rather
/// than a loop, ran 10-25% slower.
macro_rules! by_vectors {
    ($(#[$attr:meta])* $name:ident: $map:ty, $a:literal -> $b:literal, $i:literal x $o:literal,
     columns [$($col:ident: $($at:literal)*),*]) => {
        $(#[$attr])*
        struct $name<V>(std::marker::PhantomData<V>);

        // The tile's sides are those of its rows.
        const _: () = assert!($i * $i == $a && $o * $o == $b);

        impl<V: Vector + Value> TileMap<$a, $b> for $name<V> {
            #[inline(always)]
            unsafe fn apply(ins: &[*const f32; $a], outs: &[*mut f32; $b], len: usize) {
                let mut k = 0;
                while k + V::LANES <= len {
                    $(let $col = <$map>::map([$(unsafe { load::<V>(ins[$at], k) }),*]);)*
                    for r in 0..$o {
                        let row = <$map>::map([$($col[r]),*]);
                        for j in 0..$o {
                            unsafe { store(row[j], outs[r * $o + j], k) };
                        }
                    }
                    k += V::LANES;
                }
                for k in k..len {
                    let rows = square::<f32, $i, $o, $map>(|r, s| unsafe {
                        *ins[r * $i + s].add(k)
                    });
                    for (r, row) in rows.iter().enumerate() {
                        for (j, &value) in row.iter().enumerate() {
                            unsafe { *outs[r * $o + j].add(k) = value };
                        }
                    }
                }
            }
        }
    };
}

by_vectors!(
    /// F(4×4, 3×3)'s input transform `Bᵀ d B`.
    F4In: f4::Bt, 36 -> 36, 6 x 6, columns [
        c0: 0 6 12 18 24 30, c1: 1 7 13 19 25 31, c2: 2 8 14 20 26 32,
        c3: 3 9 15 21 27 33, c4: 4 10 16 22 28 34, c5: 5 11 17 23 29 35
    ]
);

by_vectors!(
    /// F(4×4, 3×3)'s output transform `Aᵀ m A`.
    F4Out: f4::At, 36 -> 16, 6 x 4, columns [
        c0: 0 6 12 18 24 30, c1: 1 7 13 19 25 31, c2: 2 8 14 20 26 32,
        c3: 3 9 15 21 27 33, c4: 4 10 16 22 28 34, c5: 5 11 17 23 29 35
    ]
);

by_vectors!(
    /// F(4×4, 3×3)'s output-gradient transform `A dz Aᵀ`.
    F4OutGrad: f4::A, 16 -> 36, 4 x 6, columns [
        c0: 0 4 8 12, c1: 1 5 9 13, c2: 2 6 10 14, c3: 3 7 11 15
    ]
);

by_vectors!(
    /// F(2×2, 3×3)'s output transform `Aᵀ m A`.
    F2Out: f2::At, 16 -> 4, 4 x 2, columns [
        c0: 0 4 8 12, c1: 1 5 9 13, c2: 2 6 10 14, c3: 3 7 11 15
    ]
);

by_vectors!(
    /// F(2×2, 3×3)'s output-gradient transform `A dz Aᵀ`.
    F2OutGrad: f2::A, 4 -> 16, 2 x 4, columns [c0: 0 2, c1: 1 3]
);

/// `E` rows of `width` floats from `out`'s start, as pointers (all from one, so that writing
/// through one leaves the others valid).
#[inline(always)]
fn row_pointers<const E: usize>(out: &mut [f32], width: usize) -> [*mut f32; E] {
    assert!(
        out.len() >= E * width,
        "{E} rows of {width} in {}",
        out.len()
    );
    let first = out.as_mut_ptr();
    let mut rows = [first; E];
    for (q, row) in rows.iter_mut().enumerate() {
        *row = first.wrapping_add(q * width);
    }
    rows
}

/// Transformed tiles, element ξ of every tile together (`[ξ, tiles, width]`): a kernel
/// gradient's product `V_ξᵀ Z_ξ` over the tiles then reads each operand as one run of memory.
/// With each tile's elements together instead (`[tiles, ξ, width]`), `V_ξᵀ`'s columns were
/// rows 2-9 KiB apart, which the gemm crate reads in place: at 14×14 32 → 64 the products took
/// 17% longer under F(2×2, 3×3), 7% under F(4×4, 3×3) (AMD Zen 3, one core), and the whole
/// kernel gradient in a training step 1.4 times as long (two threads).
///
/// Element ξ's rows start [`stride`](Self::stride) floats after element ξ - 1's: an odd number
/// of cache lines, so that a tile's rows fall into different cache sets. With `tiles * width`
/// floats instead, a task's 128 tiles of 64 channels (14×14 under F(4×4, 3×3)) put its 36
/// rows 32 KiB apart, all in one set of the L1 cache, and that kernel gradient took 20-38%
/// longer (14-20% under F(2×2, 3×3), 133 tiles; two threads, best of 40).
///
/// A value covers tiles `[first, first + count)` of its buffer and is their only writer:
/// [`new`](Self::new) borrows the whole buffer, [`split_at`](Self::split_at) cuts tile
/// ranges off it, so that tasks transform tiles of one buffer in parallel.
pub(super) struct Transformed<'a> {
    /// The buffer's start.
    base: *mut f32,
    /// Elements ξ of a tile.
    elements: usize,
    /// Floats from one element's rows to the next's.
    stride: usize,
    /// Floats of one element of one tile (its channels).
    width: usize,
    /// This value's first tile in the buffer.
    first: usize,
    /// This value's tiles.
    count: usize,
    _buffer: std::marker::PhantomData<&'a mut [f32]>,
}

// SAFETY: a `Transformed` writes only its own tiles' rows, which no other value covers (`new`
// borrows the buffer mutably, `split_at` hands out disjoint ranges).
unsafe impl Send for Transformed<'_> {}

impl<'a> Transformed<'a> {
    /// Floats from one element's rows to the next's, for `tiles` tiles of `width` floats an
    /// element: at least their `tiles * width`, rounded up to an odd number of 64-byte lines.
    pub(super) fn stride(tiles: usize, width: usize) -> usize {
        const LINE: usize = 16;
        ((tiles * width).div_ceil(LINE) | 1) * LINE
    }

    /// Floats of a buffer for `tiles` tiles of `elements` rows of `width` floats.
    pub(super) fn len(elements: usize, tiles: usize, width: usize) -> usize {
        elements * Self::stride(tiles, width)
    }

    /// `tiles` tiles of `elements` rows of `width` floats in `buffer`'s first
    /// [`len`](Self::len) floats.
    pub(super) fn new(buffer: &'a mut [f32], elements: usize, tiles: usize, width: usize) -> Self {
        assert!(
            buffer.len() >= Self::len(elements, tiles, width),
            "{tiles} tiles of {elements} rows of {width} in {}",
            buffer.len()
        );
        Transformed {
            base: buffer.as_mut_ptr(),
            elements,
            stride: Self::stride(tiles, width),
            width,
            first: 0,
            count: tiles,
            _buffer: std::marker::PhantomData,
        }
    }

    /// This value's first `count` tiles (at most all of them), and the rest.
    pub(super) fn split_at(self, count: usize) -> (Self, Self) {
        let count = count.min(self.count);
        let rest = Transformed {
            first: self.first + count,
            count: self.count - count,
            ..self
        };
        (Transformed { count, ..self }, rest)
    }

    /// The `E` rows of this value's tile `t`, element ξ's at index ξ, each writable for
    /// `width` floats.
    #[inline(always)]
    fn rows<const E: usize>(&mut self, t: usize) -> [*mut f32; E] {
        assert!(
            t < self.count && E == self.elements,
            "tile {t} of {}, {E} rows of {}",
            self.count,
            self.elements
        );
        let first = self.base.wrapping_add((self.first + t) * self.width);
        let mut rows = [first; E];
        for (xi, row) in rows.iter_mut().enumerate() {
            *row = first.wrapping_add(xi * self.stride);
        }
        rows
    }
}

multiversion! {
    /// `V_ξ[t, :] = (Bᵀ d_t B)_ξ` for the tiles of tile rows `[t0, t1)` into `v` (its tiles,
    /// `c_in` floats an element), `d_t` the tile's input pixels (zero outside the image).
    pub(super) fn transform_input(
        x: &[f32],
        c: &Correlation,
        rows: (usize, usize),
        v: Transformed<'_>,
    ) {
        // Vectors of 16 channels (two AVX2 registers each, where AVX-512 is absent): with 8
        // the transforms ran 5-20% slower on both.
        match c.tile {
            Tile::F2 => input_tiles::<4, 16, OnePass<f2_tile::Bt>>(x, c, rows, v),
            Tile::F4 => input_tiles::<6, 36, F4In<V16>>(x, c, rows, v),
        }
    }
}

/// [`transform_input`] for input tiles of `N × N = E` pixels.
#[inline(always)]
fn input_tiles<const N: usize, const E: usize, T: TileMap<E, E>>(
    x: &[f32],
    c: &Correlation,
    (t0, t1): (usize, usize),
    mut v: Transformed<'_>,
) {
    let (th, tw, ci, side) = (c.tiles_h(), c.tiles_w(), c.c_in, c.tile.side());
    assert_eq!(
        (v.count, v.width),
        ((t1 - t0) * tw, ci),
        "winograd: input tiles"
    );
    let zeros = vec![0.0f32; ci];
    for tr in t0..t1 {
        let (img, ti) = (tr / th, tr % th);
        for tj in 0..tw {
            let t = (tr - t0) * tw + tj;
            // The tile's pixels, zeros outside the image (`wrapping_sub`: a row or column
            // before it wraps past the end).
            let mut d = [zeros.as_ptr(); E];
            for r in 0..N {
                let i = (side * ti + r).wrapping_sub(c.pt);
                for s in 0..N {
                    let j = (side * tj + s).wrapping_sub(c.pl);
                    if i < c.h && j < c.w {
                        d[r * N + s] = x[((img * c.h + i) * c.w + j) * ci..][..ci].as_ptr();
                    }
                }
            }
            let out = v.rows::<E>(t);
            // SAFETY: rows of `ci` floats of `x` or `zeros`, and `E` disjoint ones of `v`'s.
            unsafe { T::apply(&d, &out, ci) };
        }
    }
}

multiversion! {
    /// `Z_t = A dz_t Aᵀ` for the tiles of tile rows `[t0, t1)` into `z` (its tiles, `c_out`
    /// floats an element), `dz` the output rows those tiles cover (zero past the output).
    pub(super) fn transform_output_grad(
        dz: &[f32],
        c: &Correlation,
        rows: (usize, usize),
        z: Transformed<'_>,
    ) {
        // Vectors of 8 channels: with 16 (36 outputs from 16 inputs) the output gradient ran
        // 10-20% slower under AVX-512, and up to 45% under AVX2.
        match c.tile {
            Tile::F2 => output_grad_tiles::<2, 4, 16, F2OutGrad<V8>>(dz, c, rows, z),
            Tile::F4 => output_grad_tiles::<4, 16, 36, F4OutGrad<V8>>(dz, c, rows, z),
        }
    }
}

/// [`transform_output_grad`] for tiles of `M × M = Q` outputs and `E` elements.
#[inline(always)]
fn output_grad_tiles<const M: usize, const Q: usize, const E: usize, T: TileMap<Q, E>>(
    dz: &[f32],
    c: &Correlation,
    (t0, t1): (usize, usize),
    mut z: Transformed<'_>,
) {
    let (th, tw, co) = (c.tiles_h(), c.tiles_w(), c.c_out);
    assert_eq!(
        (z.count, z.width),
        ((t1 - t0) * tw, co),
        "winograd: output-gradient tiles"
    );
    let first_row = c.out_row(t0);
    let zeros = vec![0.0f32; co];
    for tr in t0..t1 {
        let (img, ti) = (tr / th, tr % th);
        for tj in 0..tw {
            let t = (tr - t0) * tw + tj;
            let mut d = [zeros.as_ptr(); Q];
            for (d, at) in d
                .iter_mut()
                .zip(c.tile_outputs::<M, Q>(img, ti, tj, first_row))
            {
                if let Some(at) = at {
                    *d = dz[at..][..co].as_ptr();
                }
            }
            let out = z.rows::<E>(t);
            // SAFETY: rows of `co` floats of `dz` or `zeros`, and `E` disjoint ones of `z`'s.
            unsafe { T::apply(&d, &out, co) };
        }
    }
}

multiversion! {
    /// The outputs `Aᵀ m_t A` of the tiles of tile rows `[t0, t1)` from `m` (`[ξ, tiles,
    /// c_out]`) into `out`, the output rows those tiles cover (a last tile's rows or columns
    /// past the output are dropped).
    pub(super) fn transform_output(
        m: &[f32],
        c: &Correlation,
        rows: (usize, usize),
        out: &mut [f32],
    ) {
        match c.tile {
            Tile::F2 => output_tiles::<2, 4, 16, F2Out<V16>>(m, c, rows, out),
            Tile::F4 => output_tiles::<4, 16, 36, F4Out<V16>>(m, c, rows, out),
        }
    }
}

/// [`transform_output`] for tiles of `M × M = Q` outputs and `E` elements.
#[inline(always)]
fn output_tiles<const M: usize, const Q: usize, const E: usize, T: TileMap<E, Q>>(
    m: &[f32],
    c: &Correlation,
    (t0, t1): (usize, usize),
    out: &mut [f32],
) {
    let (th, tw, co) = (c.tiles_h(), c.tiles_w(), c.c_out);
    let tiles = (t1 - t0) * tw;
    let first_row = c.out_row(t0);
    // Where the outputs past the image go.
    let mut dropped = vec![0.0f32; Q * co];
    let spare = row_pointers::<Q>(&mut dropped, co);
    let (y, y_len) = (out.as_mut_ptr(), out.len());
    for tr in t0..t1 {
        let (img, ti) = (tr / th, tr % th);
        for tj in 0..tw {
            let t = (tr - t0) * tw + tj;
            // A loop, not `from_fn`: that was called out of line, and reading its array back
            // stalled.
            let mut e = [std::ptr::null(); E];
            for (xi, e) in e.iter_mut().enumerate() {
                *e = m[(xi * tiles + t) * co..][..co].as_ptr();
            }
            // The tile's outputs in `out`, or in `dropped`.
            let at_pixel = c.tile_outputs::<M, Q>(img, ti, tj, first_row);
            let mut dst = spare;
            for (dst, at) in dst.iter_mut().zip(at_pixel) {
                if let Some(at) = at {
                    assert!(at + co <= y_len, "output pixel at {at} past {y_len}");
                    *dst = y.wrapping_add(at);
                }
            }
            // SAFETY: rows of `co` floats of `m`, and `Q` of `out` or `dropped`, distinct
            // pixels.
            unsafe { T::apply(&e, &dst, co) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `T` on `A = I × I` rows of `c` channels, against two passes of `L` ([`separable`]).
    fn tile_map_is_two_passes<
        const I: usize,
        const O: usize,
        const A: usize,
        const B: usize,
        L,
        T,
    >()
    where
        L: Map<I, O>,
        T: TileMap<A, B>,
    {
        // Whole vectors of 16 and of 8 channels, and channels left over after them.
        for c in [5, 8, 16, 37] {
            let ins: Vec<Vec<f32>> = (0..A)
                .map(|q| {
                    let values = (0..c).map(|k| ((q * 37 + k * 11) as f32 * 0.731).sin() * 2.0);
                    values.collect()
                })
                .collect();
            let rows: [&[f32]; A] = std::array::from_fn(|q| &ins[q][..]);
            let (mut ours, mut theirs) = (vec![0.0f32; O * O * c], vec![0.0f32; O * O * c]);
            let ins = rows.map(<[f32]>::as_ptr);
            // SAFETY: `A` rows of `c` floats, and `B` disjoint ones of `ours`.
            unsafe { T::apply(&ins, &row_pointers::<B>(&mut ours, c), c) };
            let mut tmp = vec![0.0f32; I * O * c];
            let mut outs: Vec<&mut [f32]> = theirs.chunks_exact_mut(c).collect();
            separable::<I, O, L>(&rows, &mut outs, &mut tmp);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&ours), bits(&theirs), "{c} channels");
        }
    }

    /// How many times [`Transformed`]'s rows cover each float of their buffer, for `tiles`
    /// tiles of `E` elements of `width`, split into three parts.
    fn coverage<const E: usize>(tiles: usize, width: usize) -> Vec<u8> {
        let mut floats = vec![0.0f32; Transformed::len(E, tiles, width)];
        let mut times = vec![0u8; floats.len()];
        let base = floats.as_mut_ptr();
        let (first, rest) = Transformed::new(&mut floats, E, tiles, width).split_at(tiles / 3);
        let (second, third) = rest.split_at(tiles / 3);
        assert_eq!(first.count + second.count + third.count, tiles);
        for mut part in [first, second, third] {
            for t in 0..part.count {
                for row in part.rows::<E>(t) {
                    // SAFETY: both pointers are into `floats`.
                    let at = usize::try_from(unsafe { row.offset_from(base) }).unwrap();
                    times[at..at + width].iter_mut().for_each(|n| *n += 1);
                }
            }
        }
        times
    }

    #[test]
    fn transformed_tiles_cover_their_buffer_once_in_odd_lines() {
        for (tiles, width) in [(133, 64), (128, 64), (5, 3), (1, 16), (0, 8)] {
            let stride = Transformed::stride(tiles, width);
            assert!(stride >= tiles * width && stride.is_multiple_of(16) && (stride / 16) % 2 == 1);
            for times in [coverage::<16>(tiles, width), coverage::<36>(tiles, width)] {
                assert!(times.iter().all(|&n| n <= 1), "rows overlap");
                let elements = times.len() / stride;
                let written = times.iter().filter(|&&n| n == 1).count();
                assert_eq!(written, elements * tiles * width);
            }
        }
    }

    #[test]
    fn tile_maps_give_the_bits_of_two_passes() {
        tile_map_is_two_passes::<6, 6, 36, 36, f4::Bt, F4In<V16>>();
        tile_map_is_two_passes::<6, 4, 36, 16, f4::At, F4Out<V16>>();
        tile_map_is_two_passes::<4, 6, 16, 36, f4::A, F4OutGrad<V8>>();
        tile_map_is_two_passes::<4, 4, 16, 16, f2::Bt, OnePass<f2_tile::Bt>>();
        tile_map_is_two_passes::<4, 2, 16, 4, f2::At, F2Out<V16>>();
        tile_map_is_two_passes::<2, 4, 4, 16, f2::A, F2OutGrad<V8>>();
        // The vector widths the dispatch does not pick run the same arithmetic.
        tile_map_is_two_passes::<6, 4, 36, 16, f4::At, F4Out<V8>>();
        tile_map_is_two_passes::<4, 6, 16, 36, f4::A, F4OutGrad<V16>>();
    }
}
