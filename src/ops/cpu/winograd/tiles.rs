//! The two tile sizes' transforms: one-dimensional maps `L`, one of `Bᵀ`, `Aᵀ`, `A`, `G`, `Gᵀ`,
//! which the caller applies to a tile's columns and then to its rows (`L x Lᵀ`).
//!
//! F(2×2, 3×3) interpolates at 0, ±1 and ∞; F(4×4, 3×3) at 0, ±1, ½, -2 and ∞, the points
//! for which Barabasz et al. ("Error Analysis and Improving the Accuracy of Winograd
//! Convolution for Deep Neural Networks", ACM TOMS 2020) found the smallest error of F(4, 3):
//! with 64-128 channels in f32, about 2·10⁻⁶ of the outputs' largest magnitude against 3·10⁻⁷
//! for F(2×2, 3×3), where the usual points 0, ±1, ±2 give 4·10⁻⁶. Each map is written out
//! term by term: a product by a zero entry of the matrix would not fold away.

use std::ops::{Add, Mul, Neg, Sub};

/// A one-dimensional map from `I` values to `O`. A trait, not a function passed by value: a
/// function item is called through a shim that the compiler may leave out of line, compiled
/// without the caller's vector instructions.
pub(super) trait Map<const I: usize, const O: usize> {
    /// The map of one column or row of a tile: of one channel's values, or of a vector of
    /// channels' (the same arithmetic lane by lane).
    fn map<T: Value>(x: [T; I]) -> [T; O];
}

/// What a [`Map`] computes on: `f32`, or a vector of them.
pub(super) trait Value:
    Copy
    + Default
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<f32, Output = Self>
    + Neg<Output = Self>
{
}

impl<T> Value for T where
    T: Copy + Default + Add<Output = T> + Sub<Output = T> + Mul<f32, Output = T> + Neg<Output = T>
{
}

/// Defines [`Map`]s: `Name(pattern): I -> O { body }`, the body a `[T; O]` from the
/// pattern's `[T; I]`.
macro_rules! maps {
    ($($(#[$attr:meta])* $name:ident($x:pat) : $i:literal -> $o:literal $body:block)*) => {
        $(
            $(#[$attr])*
            pub struct $name;

            impl Map<$i, $o> for $name {
                #[inline(always)]
                fn map<T: super::Value>($x: [T; $i]) -> [T; $o] $body
            }
        )*
    };
}

/// F(2×2, 3×3): 4×4 input tiles, 16 products per 2×2 outputs.
pub(super) mod f2 {
    use super::Map;

    maps! {
        /// `Bᵀ d` with `Bᵀ = [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]]`.
        Bt([a, b, c, d]): 4 -> 4 {
            [a - c, b + c, c - b, b - d]
        }

        /// `Aᵀ m` with `Aᵀ = [[1, 1, 1, 0], [0, 1, -1, -1]]`.
        At([a, b, c, d]): 4 -> 2 {
            [a + b + c, b - c - d]
        }

        /// `A z`, the transpose of [`At`].
        A([p, q]): 2 -> 4 {
            [p, p + q, p - q, -q]
        }

        /// `G g` with `G = [[1, 0, 0], [½, ½, ½], [½, -½, ½], [0, 0, 1]]`.
        G([g0, g1, g2]): 3 -> 4 {
            [g0, (g0 + g1 + g2) * 0.5, (g0 - g1 + g2) * 0.5, g2]
        }

        /// `Gᵀ u`, the transpose of [`G`].
        Gt([a, b, c, d]): 4 -> 3 {
            [a + (b + c) * 0.5, (b - c) * 0.5, (b + c) * 0.5 + d]
        }
    }
}

/// `L x Lᵀ` of an `I × I` tile into `O × O` rows: `L` on each column, then on each row.
/// `x(r, s)` is the value at row `r`, column `s`.
#[inline(always)]
pub(super) fn square<T: Value, const I: usize, const O: usize, L: Map<I, O>>(
    x: impl Fn(usize, usize) -> T,
) -> [[T; O]; O] {
    let mut cols = [[T::default(); O]; I];
    for (s, col) in cols.iter_mut().enumerate() {
        let mut column = [T::default(); I];
        for (r, value) in column.iter_mut().enumerate() {
            *value = x(r, s);
        }
        *col = L::map(column);
    }
    let mut rows = [[T::default(); O]; O];
    for (r, out) in rows.iter_mut().enumerate() {
        let mut row = [T::default(); I];
        for (s, value) in row.iter_mut().enumerate() {
            *value = cols[s][r];
        }
        *out = L::map(row);
    }
    rows
}

/// F(2×2, 3×3)'s input transform over a whole 4×4 tile (flattened row by row) in one map:
/// the arithmetic of the two passes of its 1-D maps, in their order, so the same bits. A 4×4
/// tile's values fit in registers, and one pass skips the intermediate rows that two passes
/// write and read: 35-45% faster (14×14, 32 → 64 channels, one core).
pub(super) mod f2_tile {
    use super::{f2, square, Map, Value};

    /// `Bᵀ d B`.
    pub struct Bt;

    impl Map<16, 16> for Bt {
        #[inline(always)]
        fn map<T: Value>(x: [T; 16]) -> [T; 16] {
            flat(square::<T, 4, 4, f2::Bt>(|r, s| x[4 * r + s]))
        }
    }

    /// An `O × O` tile's rows, one after another.
    #[inline(always)]
    fn flat<T: Value, const O: usize, const OO: usize>(rows: [[T; O]; O]) -> [T; OO] {
        std::array::from_fn(|q| rows[q / O][q % O])
    }
}

/// F(4×4, 3×3): 6×6 input tiles, 36 products per 4×4 outputs.
pub(super) mod f4 {
    use super::Map;

    /// ⅓ and 1/15, the reciprocals of `Π_{l≠j} (p_j - p_l)` in `G`.
    const THIRD: f32 = 1.0 / 3.0;
    const FIFTEENTH: f32 = 1.0 / 15.0;

    maps! {
        /// `Bᵀ d`, `Bᵀ` the rows `[1, -3/2, -2, 3/2, 1, 0]`, `[0, -1, ½, 5/2, 1, 0]`, `[0, 1,
        /// -5/2, ½, 1, 0]`, `[0, -2, -1, 2, 1, 0]`, `[0, ½, -1, -½, 1, 0]`, `[0, 1, -3/2, -2,
        /// 3/2, 1]`.
        Bt([d0, d1, d2, d3, d4, d5]): 6 -> 6 {
            [
                d0 + d4 + (d3 - d1) * 1.5 - d2 * 2.0,
                d4 - d1 + d2 * 0.5 + d3 * 2.5,
                d1 + d4 + d3 * 0.5 - d2 * 2.5,
                d4 - d2 + (d3 - d1) * 2.0,
                d4 - d2 + (d1 - d3) * 0.5,
                d1 + d5 + (d4 - d2) * 1.5 - d3 * 2.0,
            ]
        }

        /// `Aᵀ m`: row `i` holds each finite point to the power `i`, then `[0, 0, 0, 1]` for ∞.
        At([m0, m1, m2, m3, m4, m5]): 6 -> 4 {
            let (sum, diff) = (m1 + m2, m1 - m2);
            [
                m0 + sum + m3 + m4,
                diff + m3 * 0.5 - m4 * 2.0,
                sum + m3 * 0.25 + m4 * 4.0,
                diff + m3 * 0.125 - m4 * 8.0 + m5,
            ]
        }

        /// `A z`, the transpose of [`At`].
        A([z0, z1, z2, z3]): 4 -> 6 {
            let (even, odd) = (z0 + z2, z1 + z3);
            [
                z0,
                even + odd,
                even - odd,
                z0 + z1 * 0.5 + z2 * 0.25 + z3 * 0.125,
                z0 - z1 * 2.0 + z2 * 4.0 - z3 * 8.0,
                z3,
            ]
        }

        /// `G g`: row `j` is `[1, p, p²] / Π_{l≠j} (p - p_l)` for the finite point `p = p_j`, then
        /// `[0, 0, 1]` for ∞.
        G([g0, g1, g2]): 3 -> 6 {
            [
                g0,
                (g0 + g1 + g2) * THIRD,
                (g1 - g0 - g2) * THIRD,
                (g0 * 16.0 + g1 * 8.0 + g2 * 4.0) * -FIFTEENTH,
                (g0 - g1 * 2.0 + g2 * 4.0) * FIFTEENTH,
                g2,
            ]
        }

        /// `Gᵀ u`, the transpose of [`G`].
        Gt([u0, u1, u2, u3, u4, u5]): 6 -> 3 {
            [
                u0 + (u1 - u2) * THIRD + (u4 - u3 * 16.0) * FIFTEENTH,
                (u1 + u2) * THIRD - (u3 * 8.0 + u4 * 2.0) * FIFTEENTH,
                u5 + (u1 - u2) * THIRD + (u4 - u3) * (4.0 * FIFTEENTH),
            ]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 1-D algorithm `Aᵀ [(G g) ⊙ (Bᵀ d)]` against the direct correlation `y_i = Σ_k
    /// g_k d_{i+k}`, in f64 from the f32 maps (their constants are exact or rounded once).
    fn one_dimension<const N: usize, const M: usize, Bt, At, G>()
    where
        Bt: Map<N, N>,
        At: Map<N, M>,
        G: Map<3, N>,
    {
        let d: [f32; N] = std::array::from_fn(|i| (i as f32 * 0.37).sin());
        let k = [0.3f32, -1.1, 0.7];
        let (u, v) = (G::map(k), Bt::map(d));
        let y = At::map(std::array::from_fn(|j| u[j] * v[j]));
        for (i, y) in y.into_iter().enumerate() {
            let direct: f32 = (0..3).map(|t| k[t] * d[i + t]).sum();
            assert!(
                (y - direct).abs() < 1e-5,
                "output {i}: {y} against {direct}"
            );
        }
    }

    #[test]
    fn each_variant_computes_the_correlation() {
        one_dimension::<4, 2, f2::Bt, f2::At, f2::G>();
        one_dimension::<6, 4, f4::Bt, f4::At, f4::G>();
    }

    #[test]
    fn the_whole_tile_map_is_the_two_passes() {
        let d: [f32; 16] = std::array::from_fn(|i| (i as f32 * 0.61).cos() * 3.0);
        let mut cols = [[0.0f32; 4]; 4];
        for s in 0..4 {
            cols[s] = f2::Bt::map([d[s], d[4 + s], d[8 + s], d[12 + s]]);
        }
        let mut input = [0.0f32; 16];
        for r in 0..4 {
            input[4 * r..4 * r + 4]
                .copy_from_slice(&f2::Bt::map(std::array::from_fn(|s| cols[s][r])));
        }
        assert_eq!(
            f2_tile::Bt::map(d).map(f32::to_bits),
            input.map(f32::to_bits)
        );
    }

    #[test]
    fn the_gradient_maps_are_the_transposes() {
        // ⟨A z, m⟩ = ⟨z, Aᵀ m⟩ and ⟨G g, u⟩ = ⟨g, Gᵀ u⟩ for every basis vector pair.
        fn transposes<const P: usize, const Q: usize, F: Map<P, Q>, Ft: Map<Q, P>>() {
            for i in 0..P {
                for j in 0..Q {
                    let (ei, ej) = (
                        std::array::from_fn(|k| f32::from(u8::from(k == i))),
                        std::array::from_fn(|k| f32::from(u8::from(k == j))),
                    );
                    let (fwd, back) = (F::map(ei)[j], Ft::map(ej)[i]);
                    assert!(
                        (fwd - back).abs() < 1e-6,
                        "entry ({j}, {i}): {fwd} against {back}"
                    );
                }
            }
        }
        transposes::<2, 4, f2::A, f2::At>();
        transposes::<3, 4, f2::G, f2::Gt>();
        transposes::<4, 6, f4::A, f4::At>();
        transposes::<3, 6, f4::G, f4::Gt>();
    }
}
