//! The CPU:0 device's kernels: plain functions on `f32` slices.
//!
//! One module per family (`gemm`, `conv`, `depthwise`, `pool`, `elementwise`, `softmax`,
//! `reduce`, `optim`), every kernel re-exported here (`cpu::matmul`, `cpu::conv2d_forward`, ...).
//! Conventions shared by every kernel:
//!
//! * Tensors are NHWC and row-major; convolution kernels are Keras' HWIO
//!   (`[kh, kw, c_in, c_out]`), which is exactly the `[kh * kw * c_in, c_out]` matrix an
//!   im2col GEMM wants.
//! * Outputs are fully overwritten (never accumulated into) unless a function says otherwise;
//!   the optimizer steps update their state slices in place.
//! * Lengths are checked with `assert!` up front: a mismatch is a bug in the caller and panics
//!   with a message naming the argument.
//! * Large matrix products go through the [`gemm`](https://docs.rs/gemm) crate; products with a
//!   tiny inner dimension (a 3×3 kernel on one channel, a pointwise layer with few inputs) and
//!   everything else are loops whose innermost dimension is the contiguous channel one. Hot
//!   leaf loops are compiled three times (portable, AVX2 + FMA, and AVX-512; see
//!   `multiversion!`) and picked at run time, since the crate is built for the baseline x86-64
//!   target.
//! * Work is split over rayon's global pool in independent output slices (images, rows, chunks);
//!   small inputs stay on the calling thread. The kernels may be called from inside a rayon
//!   task as well.
//! * `unsafe` is limited to the gemm crate's raw-pointer API, the calls into the AVX2 and AVX-512
//!   versions (after checking the CPU) and a few unchecked loads in the innermost loops, each preceded by
//!   the assert that makes it sound and a `SAFETY` comment.

/// Defines a function whose body is compiled three times on x86-64 — for the build target,
/// with AVX2 + FMA, and with AVX-512 F + VL as well — and picks the widest the CPU runs (see
/// [`SimdLevel`]).
///
/// Written `fn name<const FMA: bool>(...)`, the body gets a const parameter (any name) that is
/// `true` in the AVX2 and AVX-512 versions (and on targets that always have FMA), for [`madd`]
/// and the helpers built on it.
///
/// Use it for leaf loops only, and write them without closures (plain `for` loops): a closure
/// or any other function that is not inlined does not inherit the target features of the
/// function it was written in (with `FMA = true`, its `mul_add` would become a libm call).
macro_rules! multiversion {
    ($(#[$attr:meta])* $vis:vis fn $name:ident<const $fma:ident: bool>($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$attr])*
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            /// The body, inlined into both versions.
            #[inline(always)]
            fn portable<const $fma: bool>($($arg: $ty),*) $(-> $ret)? $body

            #[cfg(target_arch = "x86_64")]
            {
                /// The body compiled with AVX-512 (F and VL) besides AVX2 and FMA.
                #[target_feature(enable = "avx2,fma,avx512f,avx512vl")]
                unsafe fn avx512($($arg: $ty),*) $(-> $ret)? {
                    portable::<true>($($arg),*)
                }
                /// The body compiled with AVX2 and FMA.
                #[target_feature(enable = "avx2,fma")]
                unsafe fn avx2($($arg: $ty),*) $(-> $ret)? {
                    portable::<true>($($arg),*)
                }
                match $crate::ops::cpu::simd_level() {
                    // SAFETY (both): each is `portable` compiled with target features that
                    // `simd_level` just found on the running CPU; no other precondition.
                    $crate::ops::cpu::SimdLevel::Avx512 => return unsafe { avx512($($arg),*) },
                    $crate::ops::cpu::SimdLevel::Avx2 => return unsafe { avx2($($arg),*) },
                    $crate::ops::cpu::SimdLevel::Portable => {}
                }
            }
            portable::<{ $crate::ops::cpu::NATIVE_FMA }>($($arg),*)
        }
    };
    ($(#[$attr:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$attr])*
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            /// The body, inlined into both versions.
            #[inline(always)]
            fn portable($($arg: $ty),*) $(-> $ret)? $body

            #[cfg(target_arch = "x86_64")]
            {
                /// The body compiled with AVX-512 (F and VL) besides AVX2 and FMA.
                #[target_feature(enable = "avx2,fma,avx512f,avx512vl")]
                unsafe fn avx512($($arg: $ty),*) $(-> $ret)? {
                    portable($($arg),*)
                }
                /// The body compiled with AVX2 and FMA.
                #[target_feature(enable = "avx2,fma")]
                unsafe fn avx2($($arg: $ty),*) $(-> $ret)? {
                    portable($($arg),*)
                }
                match $crate::ops::cpu::simd_level() {
                    // SAFETY (both): each is `portable` compiled with target features that
                    // `simd_level` just found on the running CPU; no other precondition.
                    $crate::ops::cpu::SimdLevel::Avx512 => return unsafe { avx512($($arg),*) },
                    $crate::ops::cpu::SimdLevel::Avx2 => return unsafe { avx2($($arg),*) },
                    $crate::ops::cpu::SimdLevel::Portable => {}
                }
            }
            portable($($arg),*)
        }
    };
}

pub(crate) mod batchnorm;
pub(crate) mod conv;
pub(crate) mod conv_general;
pub(crate) mod depthwise;
pub(crate) mod dropout;
pub(crate) mod elementwise;
pub(crate) mod gemm;
mod implicit;
pub(crate) mod loss;
pub(crate) mod normalized_input;
pub(crate) mod optim;
mod ordered;
pub(crate) mod pool;
pub(crate) mod reduce;
pub(crate) mod routed;
pub(crate) mod separable;
mod small_k;
pub(crate) mod softmax;
mod strided;
mod winograd;
// ---- activations and pooling layers ----
pub(crate) mod activation;
pub(crate) mod pooling;
// ---- loss scaling on the device ----
pub(crate) mod loss_scale;

pub(crate) use conv::{
    conv2d_backward_input, conv2d_backward_kernel, conv2d_backward_weights,
    conv2d_backward_weights_normalized, conv2d_forward, BatchNormGradInputs,
};
pub(crate) use depthwise::{
    depthwise_backward_input, depthwise_backward_kernel, depthwise_forward,
};
pub(crate) use elementwise::{activation_backward, activation_forward, add_n, binary, scale};
pub(crate) use gemm::{dense_backward, matmul, matmul_bias_act};
pub(crate) use optim::{adam, clip, rmsprop, sgd, sgd_momentum, weight_decay};
pub(crate) use ordered::{add_parts, ordered_parts, ordered_reduce, ordered_sums};
pub(crate) use pool::{maxpool_backward, maxpool_forward};
pub(crate) use reduce::{argmax_rows, sum_all, sum_rows};
pub(crate) use separable::{
    separable_backward, separable_forward, SeparableGrads, SeparableGradsOut, Source, Stem,
};
pub(crate) use softmax::{accuracy_count, softmax, softmax_cross_entropy};

use std::cell::Cell;

/// Element count below which an element-wise kernel stays on the calling thread (a rayon
/// fork/join costs a few microseconds, about what 64 Ki elements take).
pub(crate) const PAR_MIN_ELEMS: usize = 1 << 16;

/// Elements per rayon task in element-wise kernels.
pub(crate) const PAR_CHUNK: usize = 1 << 15;

/// Whether the build target itself guarantees a fused multiply-add instruction (so that
/// `f32::mul_add` is one instruction rather than a library call).
pub(crate) const NATIVE_FMA: bool = cfg!(any(target_arch = "aarch64", target_feature = "fma"));

/// `a * b + c`, fused (one rounding) when `FMA`, else as two operations. Only pass `FMA = true`
/// where the instruction exists (see `multiversion!`): otherwise `mul_add` is a slow libm call.
#[inline(always)]
pub(crate) fn madd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// Builds `[e(i0), e(i1), ...]`: the expression `e` evaluated with `$i` bound to each literal
/// lane index (no closure, so nothing can stay un-inlined outside a target-feature function).
macro_rules! lanes {
    ($i:ident => $e:expr; $($n:literal)*) => {
        [$({
            let $i = $n;
            $e
        }),*]
    };
}

/// A vector of `f32` lanes that the compiler keeps in one register of its width: its
/// operations work lane by lane with constant indices and no loops (loops over arrays in
/// registers get vectorized only after the arrays were already committed to the stack).
pub(crate) trait Vector: Copy {
    /// Lanes per vector.
    const LANES: usize;

    /// All lanes `v`.
    fn splat(v: f32) -> Self;

    /// `s[at..at + LANES]`.
    fn load(s: &[f32], at: usize) -> Self;

    /// Writes the lanes to `s[at..at + LANES]`.
    fn store(self, s: &mut [f32], at: usize);

    /// `self + a * w`, lane-wise.
    fn madd<const FMA: bool>(self, a: f32, w: Self) -> Self;

    /// `self + a * w`, lane-wise, with a vector `a`.
    fn madd_v<const FMA: bool>(self, a: Self, w: Self) -> Self;

    /// `self + o`, lane-wise.
    fn add(self, o: Self) -> Self;

    /// `NV` consecutive vectors `s[at..at + LANES * NV]` (one bounds check for the group).
    #[inline(always)]
    fn load_n<const NV: usize>(s: &[f32], at: usize) -> [Self; NV] {
        let s = &s[at..at + Self::LANES * NV];
        let mut out = [Self::splat(0.0); NV];
        for (v, o) in out.iter_mut().enumerate() {
            *o = Self::load(s, Self::LANES * v);
        }
        out
    }
}

/// Defines a [`Vector`] of the listed lane indices.
macro_rules! vector_type {
    ($(#[$attr:meta])* $name:ident, $n:literal: $($lane:literal)*) => {
        $(#[$attr])*
        #[derive(Clone, Copy, Debug, Default, PartialEq)]
        pub(crate) struct $name(pub [f32; $n]);

        impl Vector for $name {
            const LANES: usize = $n;

            #[inline(always)]
            fn splat(v: f32) -> Self {
                Self([v; $n])
            }

            #[inline(always)]
            fn load(s: &[f32], at: usize) -> Self {
                let c = &s[at..at + $n];
                Self(lanes!(i => c[i]; $($lane)*))
            }

            #[inline(always)]
            fn store(self, s: &mut [f32], at: usize) {
                s[at..at + $n].copy_from_slice(&self.0);
            }

            #[inline(always)]
            fn madd<const FMA: bool>(self, a: f32, w: Self) -> Self {
                Self(lanes!(i => madd::<FMA>(a, w.0[i], self.0[i]); $($lane)*))
            }

            #[inline(always)]
            fn madd_v<const FMA: bool>(self, a: Self, w: Self) -> Self {
                Self(lanes!(i => madd::<FMA>(a.0[i], w.0[i], self.0[i]); $($lane)*))
            }

            #[inline(always)]
            fn add(self, o: Self) -> Self {
                Self(lanes!(i => self.0[i] + o.0[i]; $($lane)*))
            }
        }

        impl std::ops::Add for $name {
            type Output = Self;

            #[inline(always)]
            fn add(self, o: Self) -> Self {
                Self(lanes!(i => self.0[i] + o.0[i]; $($lane)*))
            }
        }

        impl std::ops::Sub for $name {
            type Output = Self;

            #[inline(always)]
            fn sub(self, o: Self) -> Self {
                Self(lanes!(i => self.0[i] - o.0[i]; $($lane)*))
            }
        }

        impl std::ops::Mul<f32> for $name {
            type Output = Self;

            #[inline(always)]
            fn mul(self, a: f32) -> Self {
                Self(lanes!(i => self.0[i] * a; $($lane)*))
            }
        }

        impl std::ops::Neg for $name {
            type Output = Self;

            #[inline(always)]
            fn neg(self) -> Self {
                Self(lanes!(i => -self.0[i]; $($lane)*))
            }
        }
    };
}

vector_type!(
    /// Eight lanes: one AVX register (two NEON ones).
    V8, 8: 0 1 2 3 4 5 6 7
);

vector_type!(
    /// Sixteen lanes: one AVX-512 register, for loops whose AVX-512 version works on 16 lanes
    /// (Zen 5 and Intel's server cores run 512-bit multiply-adds at full rate: twice the work
    /// of 8 lanes per instruction).
    V16, 16: 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15
);

/// The widest version of a `multiversion!` function the running CPU can run.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SimdLevel {
    /// The build target's baseline.
    Portable,
    /// AVX2 and FMA.
    Avx2,
    /// AVX2, FMA, AVX-512 F and VL. Most loops still work on 8 lanes (`V8`), but AVX-512 gives
    /// the compiler 32 vector registers instead of 16, so they keep all their accumulators and
    /// kernel vectors in registers (15-30% faster separable layers); the 3×3 depthwise loops
    /// work on 16 (`V16`, see [`wide_registers`]).
    Avx512,
}

/// Whether the CPU has AVX2 and FMA, whatever a test forces.
#[cfg(all(test, target_arch = "x86_64"))]
fn simd_level_unforced_has_avx2() -> bool {
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
}

/// The CPU's [`SimdLevel`], or the lower one `ANYGPU_CPU_SIMD` asks for (read once).
#[cfg(target_arch = "x86_64")]
#[inline]
pub(crate) fn simd_level() -> SimdLevel {
    #[cfg(test)]
    if let Some(level) = tests::forced_level() {
        return level;
    }
    static LEVEL: std::sync::OnceLock<SimdLevel> = std::sync::OnceLock::new();
    *LEVEL.get_or_init(|| {
        let asked = std::env::var("ANYGPU_CPU_SIMD").ok();
        capped_level(detected_level(), asked.as_deref())
    })
}

/// The widest level the running CPU supports.
#[cfg(target_arch = "x86_64")]
fn detected_level() -> SimdLevel {
    use std::arch::is_x86_feature_detected as has;
    if !(has!("avx2") && has!("fma")) {
        SimdLevel::Portable
    } else if has!("avx512f") && has!("avx512vl") {
        SimdLevel::Avx512
    } else {
        SimdLevel::Avx2
    }
}

/// `cpu` lowered to what `asked` names (`avx2`, `portable`), so that the AVX2 kernels can be
/// measured on an AVX-512 machine; a level above the CPU's, or an unknown name, changes nothing
/// (with a warning for the unknown name).
#[cfg(target_arch = "x86_64")]
fn capped_level(cpu: SimdLevel, asked: Option<&str>) -> SimdLevel {
    let rank = |l: SimdLevel| l as u8;
    let cap = match asked {
        None | Some("" | "native") => return cpu,
        Some("avx2") => SimdLevel::Avx2,
        Some("portable") => SimdLevel::Portable,
        Some("avx512") => SimdLevel::Avx512,
        Some(other) => {
            log::warn!("ANYGPU_CPU_SIMD={other:?} is not avx512, avx2 or portable; ignored");
            return cpu;
        }
    };
    if rank(cap) < rank(cpu) {
        cap
    } else {
        cpu
    }
}

/// Hints the CPU to bring the cache line holding `s[at]` into L1 ahead of its use; nothing
/// where the target has no prefetch instruction, or `at` is past the end.
#[inline(always)]
pub(crate) fn prefetch(s: &[f32], at: usize) {
    #[cfg(target_arch = "x86_64")]
    if at < s.len() {
        // SAFETY: `at` is inside `s`, and a prefetch only hints the cache: it reads nothing
        // into the program and never faults.
        unsafe {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            _mm_prefetch::<_MM_HINT_T0>(s.as_ptr().add(at).cast());
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (s, at);
}

/// Whether the `multiversion!` loops run a version with vector multiply-adds (AVX2 and FMA, or
/// AVX-512), not the portable one.
#[inline]
pub(crate) fn fma_vectors() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        simd_level() != SimdLevel::Portable
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether the widest version of the `multiversion!` loops runs AVX-512: 32 registers of 16
/// lanes, so a loop may hold about 28 [`V16`]s at once without spilling (otherwise plan for 16
/// `V8`s). A loop that keeps its operands in registers runs twice the work per instruction on
/// 16 lanes; on a Zen 5 (full-width 512-bit multiply-adds) the 3×3 depthwise correlation went
/// from 25-40 to 80-135 GFLOP/s per core in L1 (tutorial shapes, min of 5 × 2000 images).
#[inline]
pub(crate) fn wide_registers() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        simd_level() == SimdLevel::Avx512
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

thread_local! {
    /// Per-thread scratch memory (im2col buffers and the like), kept between calls so that hot
    /// loops do not allocate.
    static SCRATCH: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
}

/// Fills `dst` with one row of a zero-padded image: `left` zeros, then `src` (cut where `dst`
/// ends), then zeros; all zeros for a row of padding (`None`).
pub(crate) fn padded_row(src: Option<&[f32]>, left: usize, dst: &mut [f32]) {
    let Some(src) = src else {
        dst.fill(0.0);
        return;
    };
    let left = left.min(dst.len());
    let len = src.len().min(dst.len() - left);
    dst[..left].fill(0.0);
    dst[left..left + len].copy_from_slice(&src[..len]);
    dst[left + len..].fill(0.0);
}

/// Runs `f` on a scratch slice of `len` elements (contents unspecified) borrowed from the
/// calling thread's pool. Nested calls get a fresh allocation instead of panicking.
pub(crate) fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    let mut buf = SCRATCH.with(Cell::take);
    if buf.len() < len {
        buf.resize(len, 0.0);
    }
    let result = f(&mut buf[..len]);
    SCRATCH.with(|cell| {
        let other = cell.take();
        // Keep the larger of the two buffers (a nested call may have stored one meanwhile).
        cell.set(if other.len() > buf.len() { other } else { buf });
    });
    result
}

#[cfg(test)]
mod ordered_tests {
    use crate::ops::reference::random_vec;
    use crate::ops::spec::{Activation, Conv2dShape, DepthwiseShape, Padding};

    /// `f`'s result in rayon pools of 1, 2, 3, 5 and 8 threads, as bits.
    fn bits_per_pool(f: impl Fn() -> Vec<f32> + Sync) -> Vec<Vec<u32>> {
        [1, 2, 3, 5, 8]
            .iter()
            .map(|&threads| {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                pool.install(&f).iter().map(|v| v.to_bits()).collect()
            })
            .collect()
    }

    fn all_equal(runs: &[Vec<u32>], what: &str) {
        for (i, run) in runs.iter().enumerate().skip(1) {
            assert!(
                run == &runs[0],
                "{what}: pool {i} rounds differently from pool 0"
            );
        }
    }

    #[test]
    fn reductions_give_the_same_bits_with_any_number_of_threads() {
        let s = Conv2dShape {
            n: 64,
            h: 28,
            w: 28,
            c_in: 1,
            c_out: 32,
            kh: 3,
            kw: 3,
            padding: Padding::Same,
            strides: [1, 1],
            dilation: [1, 1],
        };
        let (x, dz) = (
            random_vec(64 * 28 * 28, 1),
            random_vec(64 * 28 * 28 * 32, 2),
        );
        all_equal(
            &bits_per_pool(|| {
                let mut dk = vec![0.0; 9 * 32];
                super::conv2d_backward_kernel(&x, &dz, &mut dk, &s);
                dk
            }),
            "conv2d_backward_kernel",
        );
        // Winograd's algorithm (4 images: a cut by the thread count would vary), then a
        // strided convolution (several images a task), each pass.
        let wino = Conv2dShape {
            n: 4,
            h: 14,
            w: 14,
            c_in: 32,
            c_out: 64,
            ..s
        };
        let strided = Conv2dShape {
            n: 40,
            c_in: 64,
            strides: [2, 2],
            ..wino
        };
        // Enough tile rows for the kernel gradient's tasks of at least 128 tiles.
        let wider_batch = Conv2dShape { n: 40, ..wino };
        // A transformed kernel large enough for the kernel gradient by groups of tile rows
        // (F(4×4, 3×3) at 7×7, 64 → 128: three groups, of 75, 75 and 42).
        let by_groups = Conv2dShape {
            n: 96,
            h: 7,
            w: 7,
            c_in: 64,
            c_out: 128,
            ..s
        };
        for s in [wino, strided, wider_batch, by_groups] {
            let (x, k) = (random_vec(s.input_len(), 6), random_vec(s.kernel_len(), 7));
            all_equal(
                &bits_per_pool(|| {
                    let mut y = vec![0.0; s.output_len()];
                    super::conv2d_forward(&x, &k, None, &mut y, &s, Activation::Linear);
                    let mut dx = vec![0.0; s.input_len()];
                    super::conv2d_backward_input(&y, &k, &mut dx, &s);
                    let mut dk = vec![0.0; s.kernel_len()];
                    super::conv2d_backward_kernel(&x, &y, &mut dk, &s);
                    y.extend(dx);
                    y.extend(dk);
                    y
                }),
                &format!("conv2d_forward and both gradients, {s:?}"),
            );
        }
        let d = DepthwiseShape::same(16, 28, 28, 32, 3, 3);
        let (x, dy) = (random_vec(d.input_len(), 3), random_vec(d.input_len(), 4));
        all_equal(
            &bits_per_pool(|| {
                let mut dk = vec![0.0; 9 * 32];
                super::depthwise_backward_kernel(&x, &dy, &mut dk, &d);
                dk
            }),
            "depthwise_backward_kernel",
        );
        let big = random_vec(1 << 20, 5);
        all_equal(
            &bits_per_pool(|| {
                let mut out = vec![0.0; 32];
                super::sum_rows(&big, (1 << 20) / 32, 32, &mut out);
                out.push(super::sum_all(&big));
                out
            }),
            "sum_rows and sum_all",
        );
        // BatchNormalization's sums over stretches of rows, both passes, with and without
        // the fused ReLU: several tasks of rows, the last short, and channel counts with
        // stretches of 64, 4 and 1 rows.
        for c in [5, 48, 96] {
            let p = crate::ops::spec::BatchNormParams {
                rows: 1000,
                channels: c,
                momentum: 0.9,
                epsilon: 1e-3,
            };
            let (x, dy) = (random_vec(1000 * c, 8), random_vec(1000 * c, 9));
            let (gamma, beta) = (random_vec(c, 10), random_vec(c, 11));
            for relu in [false, true] {
                all_equal(
                    &bits_per_pool(|| {
                        let (mut mm, mut mv) = (vec![0.0; c], vec![1.0; c]);
                        let (mut y, mut stats) = (vec![0.0; 1000 * c], vec![0.0; 2 * c]);
                        let vars = (&mut mm[..], &mut mv[..]);
                        let gb = (&gamma[..], &beta[..]);
                        let out = super::batchnorm::Normalized::Values(&mut y);
                        super::batchnorm::batch_norm_train(&x, gb, vars, out, &mut stats, &p, relu);
                        let (mut dx, mut dg, mut db) =
                            (vec![0.0; 1000 * c], vec![0.0; c], vec![0.0; c]);
                        let relu_beta = relu.then_some(&beta[..]);
                        let sums = (&mut dg[..], &mut db[..]);
                        let dy = super::batchnorm::Dy::Rows(&dy);
                        super::batchnorm::batch_norm_backward(
                            &x, dy, &gamma, &stats, relu_beta, &mut dx, sums, &p,
                        );
                        [y, stats, mm, mv, dx, dg, db].concat()
                    }),
                    &format!("batch normalization over {c} channels, relu {relu}"),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! The narrower versions of the multiversioned loops, which the dispatch never picks on a
    //! machine that has a wider one: the kernels' own tests re-run with each forced.

    use std::sync::atomic::{AtomicU8, Ordering};

    /// 0: no forcing; 1: portable; 2: AVX2 (tests only).
    static FORCED: AtomicU8 = AtomicU8::new(0);

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn cpu_simd_asks_only_for_lower_levels() {
        use super::{capped_level, SimdLevel::*};
        assert_eq!(capped_level(Avx512, Some("avx2")), Avx2);
        assert_eq!(capped_level(Avx512, Some("portable")), Portable);
        assert_eq!(capped_level(Avx2, Some("avx512")), Avx2);
        assert_eq!(capped_level(Avx512, None), Avx512);
        assert_eq!(capped_level(Avx2, Some("sse9")), Avx2);
    }

    /// The level `simd_level` must answer, if a test forces one.
    #[cfg(target_arch = "x86_64")]
    pub(super) fn forced_level() -> Option<super::SimdLevel> {
        match FORCED.load(Ordering::Relaxed) {
            1 => Some(super::SimdLevel::Portable),
            2 if super::simd_level_unforced_has_avx2() => Some(super::SimdLevel::Avx2),
            _ => None,
        }
    }

    fn kernels_match_the_reference() {
        super::conv::tests::forward_matches_reference();
        super::conv::tests::backward_matches_reference();
        super::conv::tests::weights_through_batch_norm_match_reference();
        super::depthwise::tests::matches_reference();
        super::elementwise::tests::activations_match_reference();
        super::small_k::tests::small_k_handles_every_column_split();
        super::small_k::tests::small_k_kernel_grad_handles_every_split();
        super::pool::tests::matches_reference();
        super::pool::compact::tests::compact_routing_matches_the_dense_one();
        super::routed::tests::products_match_the_dense_ones();
        super::softmax::tests::matches_reference();
        super::strided::tests::strided_passes_match_the_oracle();
        super::normalized_input::tests::normalized_inputs_give_the_bits_of_normalized_values();
        super::optim::tests::steps_match_reference();
        super::reduce::tests::sums_match_reference();
        super::separable::tests::matches_reference();
        super::separable::tests::stem_matches_reference();
    }

    /// One test for both levels: the forcing is global, so two tests in parallel would race.
    #[test]
    fn narrower_versions_match_the_reference() {
        for level in [1, 2] {
            FORCED.store(level, Ordering::Relaxed);
            kernels_match_the_reference();
        }
        FORCED.store(0, Ordering::Relaxed);
    }
}
