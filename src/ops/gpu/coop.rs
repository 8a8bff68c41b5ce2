//! Matrix products on cooperative matrices (`matmul_coop.wgsl`): the tensor cores, through
//! wgpu's experimental `EXPERIMENTAL_COOPERATIVE_MATRIX`, for float16 products (float32
//! accumulation) under the mixed-precision policy.
//!
//! Three gates keep them away from where they would be wrong:
//! * the device is opened with the feature only where the adapter reports the configuration the
//!   kernels are written for (16×16×16, float16 A and B, float32 C; see `CoopSupport::wanted` in `shader::coop`)
//!   and where it runs them as they assume (float16, subgroups of exactly 32 invocations);
//! * before the tuner may time them, each candidate is checked once per adapter against the f64
//!   oracle on ragged shapes and every transpose (`coop_self_check`); a candidate that fails is
//!   logged as an error and never offered again in the process;
//! * `ANYGPU_AUTOTUNE_FORCE` skips that check, so that `tests/coop_matrix.rs` (which the GPU
//!   check runs before it times anything) sees each kernel's own output.
//!
//! Elsewhere nothing changes: the candidates are simply not offered.

use bytemuck::{Pod, Zeroable};
use half::f16;

use crate::device::LogicalDevice;
use crate::error::{Error, Result};
use crate::ops::gpu::grid_1d;
use crate::ops::gpu::kernels::{GpuKernels, SPLITK_REDUCE};
use crate::ops::gpu::MAX_GROUPS_PER_DIM;
use crate::ops::reference;
use crate::ops::spec::{Activation, Conv2dShape, ConvGeometry, Padding};
use crate::ops::Kernels;
use crate::ops::MatmulDims;
pub(crate) use crate::shader::coop::is_candidate;
use crate::shader::coop::{Candidate, CoopSupport, CANDIDATES, SPLIT_CANDIDATE, SPLIT_KERNEL};
use crate::tensor::{DType, Tensor};

/// Whether `c` takes a product of `d`: the vec4 kernels where A and B are stored untransposed
/// with k and n multiples of 4 (the vec4 products of `matmul.rs`), the scalar ones elsewhere
/// (they would take those too, slower).
fn applies(c: &Candidate, d: MatmulDims) -> bool {
    let v4 = !d.trans_a && !d.trans_b && d.k.is_multiple_of(4) && d.n.is_multiple_of(4);
    c.split || c.v4 == v4
}

/// The most 64×64 output tiles a product may have for the split-k candidate to be offered,
/// and the least k: it pays where the tiles alone leave a GPU's cores idle.
const SPLIT_MAX_TILES: usize = 32;
const SPLIT_MIN_K: usize = 512;

/// Whether splitting k pays for a product of `d`: few output tiles and a long k.
fn split_pays(d: MatmulDims) -> bool {
    d.m.div_ceil(64) * d.n.div_ceil(64) <= SPLIT_MAX_TILES && d.k >= SPLIT_MIN_K
}

/// Workgroups a split product aims for (a few per streaming multiprocessor of an H200).
const SPLIT_WORKGROUPS: usize = 512;

/// `(k_slice, splits)` of a split-k product of `d`: slices of whole 32-deep steps of k, about
/// [`SPLIT_WORKGROUPS`] workgroups in all.
fn split_slices(d: MatmulDims) -> (usize, usize) {
    let tiles = d.m.div_ceil(64) * d.n.div_ceil(64);
    let steps = d.k.div_ceil(32).max(1);
    let wanted = SPLIT_WORKGROUPS.div_ceil(tiles.max(1)).clamp(1, steps);
    let k_slice = 32 * steps.div_ceil(wanted);
    (k_slice, d.k.div_ceil(k_slice).max(1))
}

/// Mirror of `Params` in matmul_coop.wgsl (matmul.wgsl's).
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct CoopParams {
    m: u32,
    k: u32,
    n: u32,
    has_bias: u32,
    a_rs: u32,
    a_cs: u32,
    b_rs: u32,
    b_cs: u32,
    act: u32,
    /// `matmul_coop_64x64_splitk`'s slice of k.
    k_slice: u32,
    _unused: [u32; 2],
    /// The convolution whose im2col matrix A is ([`ConvMode`]), and its geometry.
    conv: u32,
    h: u32,
    w: u32,
    ci: u32,
    kw: u32,
    oh: u32,
    ow: u32,
    sh: u32,
    sw: u32,
    dh: u32,
    dw: u32,
    pt: u32,
    pl: u32,
    uh: u32,
    uw: u32,
    _pad: u32,
}

/// What a candidate is checked for and offered for: each has its own self-check and verdicts.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Work {
    /// Matrix products (dense layers, 1×1 convolutions).
    Products,
    /// k×k convolutions, A gathered from the image.
    Convolutions,
}

impl Work {
    fn name(self) -> &'static str {
        match self {
            Work::Products => "products",
            Work::Convolutions => "convolutions",
        }
    }
}

/// What A is in a convolution on the tensor cores (`conv` in matmul_coop.wgsl's Params).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum ConvMode {
    /// The im2col matrix `[pixels, taps]` of the input: the forward product with the kernel
    /// `[taps, co]`.
    Forward = 1,
    /// Its transpose `[taps, pixels]`: the kernel gradient's product with dz `[pixels, co]`.
    KernelGrad = 2,
}

/// The correlation a gathered A reads (matmul_coop.wgsl's `load_a_gathered`): `g`'s image
/// `[n, h, w, ci]`, its `oh × ow` outputs, kernel, strides, dilation and padding, the image
/// seen upsampled by `up` (zeros between its rows and columns; 1 for a plain convolution).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Gather {
    pub(crate) g: ConvGeometry,
    pub(crate) up: [usize; 2],
}

impl Gather {
    /// The convolution `g` itself.
    pub(crate) fn conv(g: ConvGeometry) -> Gather {
        Gather { g, up: [1, 1] }
    }

    /// The input gradient of convolution `g`, `dx = correlate(up(dz), kt)`: the
    /// correlation of `dz` upsampled by the strides with `kt[a, b, o, c] = kernel[kh-1-a,
    /// kw-1-b, c, o]` (`conv2d_flip`'s), at stride 1, the same dilation, and the padding that
    /// puts tap `a` of input row `i` on `dz`'s row `(i + pt - (kh-1-a)·dh) / sh` when that
    /// divides.
    pub(crate) fn input_grad(g: &ConvGeometry) -> Gather {
        let up = [g.sh, g.sw];
        let g = ConvGeometry {
            h: g.oh,
            w: g.ow,
            ci: g.co,
            co: g.ci,
            // (Swapped, so that a grouped convolution's stays unfit for the kernels.)
            cig: g.cog,
            cog: g.cig,
            sh: 1,
            sw: 1,
            pt: (g.kh - 1) * g.dh - g.pt,
            pl: (g.kw - 1) * g.dw - g.pl,
            oh: g.h,
            ow: g.w,
            ..*g
        };
        Gather { g, up }
    }
}

impl CoopParams {
    /// These params with A gathered as `mode` of `gather`.
    fn gathering(self, mode: ConvMode, gather: &Gather) -> CoopParams {
        let Gather { g, up } = gather;
        let u = |x: usize| x as u32;
        CoopParams {
            // Neighbouring invocations along the taps (channels innermost in the image):
            // along k for the forward matrix, along m for its transpose (load_a).
            a_rs: 0,
            a_cs: u32::from(mode == ConvMode::Forward),
            conv: mode as u32,
            h: u(g.h),
            w: u(g.w),
            ci: u(g.ci),
            kw: u(g.kw),
            oh: u(g.oh),
            ow: u(g.ow),
            sh: u(g.sh),
            sw: u(g.sw),
            dh: u(g.dh),
            dw: u(g.dw),
            pt: u(g.pt),
            pl: u(g.pl),
            uh: u(up[0]),
            uw: u(up[1]),
            ..self
        }
    }
}

/// The product a convolution `g` (one group) is in `mode`: the forward pass's
/// `[pixels, taps] · [taps, co]`, or the kernel gradient's `[taps, pixels] · [pixels, co]`.
fn conv_dims(g: &ConvGeometry, mode: ConvMode) -> MatmulDims {
    let (pixels, taps) = (g.n * g.oh * g.ow, g.kh * g.kw * g.ci);
    match mode {
        ConvMode::Forward => MatmulDims {
            m: pixels,
            k: taps,
            n: g.co,
            trans_a: false,
            trans_b: false,
        },
        ConvMode::KernelGrad => MatmulDims {
            m: taps,
            k: pixels,
            n: g.co,
            trans_a: true,
            trans_b: false,
        },
    }
}

/// Whether candidate `c` takes the forward pass of convolution `g`: not the split one; the
/// vec4 ones where the channels (in and out) are multiples of 4 (a vec4 of the image is then
/// one tap's channels), the scalar ones elsewhere; a 32-column tile only for 32 output
/// channels or fewer.
fn conv_applies(c: &Candidate, g: &ConvGeometry) -> bool {
    let v4 = g.ci.is_multiple_of(4) && g.co.is_multiple_of(4);
    !c.split && c.v4 == v4 && (c.cols == 64 || g.co <= c.cols)
}

/// Whether a convolution `g` goes to the tensor cores at all: one group, and taps enough to
/// fill a step of k (a one-channel 3×3 convolution would multiply mostly zeros).
fn conv_fits(g: &ConvGeometry) -> bool {
    g.cig == g.ci && g.cog == g.co && g.kh * g.kw * g.ci >= 32 && g.co > 0 && g.n * g.oh * g.ow > 0
}

/// Shapes of the self-check: ragged (no dimension a multiple of 16, tiles cut at every edge)
/// and one with several tiles each way and several steps of k; each kernel takes those it
/// applies to (k and n multiples of 4 for the vec4 ones).
const CHECK_SHAPES: [(usize, usize, usize); 4] =
    [(37, 45, 51), (100, 70, 131), (37, 44, 52), (100, 72, 132)];

/// The layouts (trans_a, trans_b) of the self-check: every one the dense layers' forward and
/// gradients use, and both transposed (`matmul_transposed`).
const CHECK_LAYOUTS: [(bool, bool); 4] =
    [(false, false), (true, false), (false, true), (true, true)];

/// A split-k product cut into slices of two steps of k, the last one ragged, as a 1×1
/// convolution's kernel gradient (`xᵀ · dz`) is: `split_slices` gives the shapes above
/// one-step slices, and longer ones only to products of 67M multiply-adds or more (a quarter
/// of a second of the f64 oracle). Split candidates only.
const SPLIT_CHECK: (MatmulDims, usize) = (
    MatmulDims {
        m: 100,
        k: 200,
        n: 132,
        trans_a: true,
        trans_b: false,
    },
    64,
);

/// The self-check's tolerance: four float16 ulps relative to max(1, |expected|), as
/// tests/mixed_precision.rs (products accumulate in float32; the output is rounded once).
const CHECK_TOL: f64 = 4.0 * 0.000_976_562_5;

/// The first element of `got` off `want` by more than [`CHECK_TOL`] (NaN included): its index,
/// value and the expected one.
fn first_off<T: Copy + Into<f32>>(got: &[T], want: &[f64]) -> Option<(usize, f32, f64)> {
    got.iter()
        .map(|&g| g.into())
        .zip(want)
        .enumerate()
        .find(|&(_, (g, w))| {
            let close = (f64::from(g) - w).abs() <= CHECK_TOL * w.abs().max(1.0);
            !close
        })
        .map(|(i, (g, w))| (i, g, *w))
}

/// The sum of the `splits` equal layers of `layers` (a split product's partial sums), element
/// by element.
fn layer_sums(layers: &[f32], splits: usize) -> Vec<f32> {
    let len = layers.len() / splits.max(1);
    (0..len)
        .map(|i| (0..splits).map(|z| layers[z * len + i]).sum())
        .collect()
}

/// `len` random float16 values in [-1, 1) from `seed`, and the same as f64.
fn halves(len: usize, seed: u64) -> (Vec<f64>, Vec<f16>) {
    let h: Vec<f16> = reference::random_vec(len, seed)
        .into_iter()
        .map(f16::from_f32)
        .collect();
    (h.iter().map(|v| f64::from(v.to_f32())).collect(), h)
}

/// `kt[a, b, o, c] = kernel[kh-1-a, kw-1-b, c, o]` of a kernel `[kh, kw, c_in, c_out]` of `s`
/// (what `conv2d_flip` writes on the device).
fn flipped<T: Copy>(kernel: &[T], s: &Conv2dShape) -> Vec<T> {
    let (kh, kw, ci, co) = (s.kh, s.kw, s.c_in, s.c_out);
    let mut kt = Vec::with_capacity(kernel.len());
    for a in 0..kh {
        for b in 0..kw {
            for o in 0..co {
                for c in 0..ci {
                    kt.push(kernel[(((kh - 1 - a) * kw + (kw - 1 - b)) * ci + c) * co + o]);
                }
            }
        }
    }
    kt
}

/// The convolutions of the self-check, each candidate taking those it applies to (the vec4
/// ones channels in multiples of 4, the 32-column one at most 32 output channels, the split
/// one every kernel gradient): ragged images and channel counts, 'same' and 'valid' padding,
/// strides and dilation, kernels that are not square, more than 64 output channels; each kind
/// of candidate gets strides and dilation, and each its input gradients at strides above 1.
const CONV_CHECKS: [Conv2dShape; 8] = [
    conv_check(2, 9, 7, 12, 20, (3, 3), Padding::Same, [1, 1], [1, 1]),
    conv_check(2, 9, 7, 5, 19, (3, 3), Padding::Same, [1, 1], [1, 1]),
    conv_check(1, 10, 11, 8, 36, (3, 3), Padding::Valid, [2, 2], [1, 1]),
    conv_check(2, 8, 9, 6, 10, (2, 3), Padding::Same, [1, 1], [2, 2]),
    conv_check(3, 11, 13, 7, 40, (3, 3), Padding::Same, [2, 3], [1, 1]),
    conv_check(2, 11, 10, 12, 28, (2, 3), Padding::Valid, [1, 1], [1, 2]),
    conv_check(1, 7, 6, 8, 72, (3, 3), Padding::Same, [1, 1], [1, 1]),
    conv_check(3, 10, 9, 4, 12, (3, 3), Padding::Same, [3, 2], [1, 1]),
];

#[allow(clippy::too_many_arguments)] // a convolution's every dimension
const fn conv_check(
    n: usize,
    h: usize,
    w: usize,
    c_in: usize,
    c_out: usize,
    (kh, kw): (usize, usize),
    padding: Padding,
    strides: [usize; 2],
    dilation: [usize; 2],
) -> Conv2dShape {
    Conv2dShape {
        n,
        h,
        w,
        c_in,
        c_out,
        kh,
        kw,
        padding,
        strides,
        dilation,
    }
}

impl GpuKernels<'_> {
    /// The cooperative-matrix candidates for `out = act(op(a) · op(b) + bias)` of `d`: float16
    /// tensors on a device where the kernels run, those that take `d`, each once its
    /// self-check passed (under `ANYGPU_AUTOTUNE_FORCE`, without the check).
    pub(crate) fn coop_candidates(
        &self,
        a: &Tensor,
        b: &Tensor,
        bias: Option<&Tensor>,
        out: &Tensor,
        d: MatmulDims,
    ) -> Result<Vec<&'static str>> {
        let half = [Some(a), Some(b), bias, Some(out)]
            .into_iter()
            .flatten()
            .all(|t| t.dtype() == DType::F16);
        if !half {
            return Ok(Vec::new());
        }
        self.coop_offered(&self.dev.ctx.coop, d, out.device_handle())
    }

    /// The candidates `support` lets the tuner offer for a float16 product of `d` on `device`.
    fn coop_offered(
        &self,
        support: &CoopSupport,
        d: MatmulDims,
        device: &LogicalDevice,
    ) -> Result<Vec<&'static str>> {
        // A 32-column tile only where the product is that narrow: wider ones have the others;
        // split k only for few tiles and a long k.
        self.coop_passing(support, device, Work::Products, &|c| {
            applies(c, d) && (c.cols == 64 || d.n <= c.cols) && (!c.split || split_pays(d))
        })
    }

    /// The candidates `support` lets the tuner offer for `work` on `device` of those `takes`
    /// accepts.
    fn coop_passing(
        &self,
        support: &CoopSupport,
        device: &LogicalDevice,
        work: Work,
        takes: &dyn Fn(&Candidate) -> bool,
    ) -> Result<Vec<&'static str>> {
        if !support.usable() {
            return Ok(Vec::new());
        }
        let takes = CANDIDATES.iter().filter(|c| takes(c));
        if self.dev.ctx.tuner.forced() {
            return Ok(takes.map(|c| c.name).collect());
        }
        if self.dev.ctx.tuner.off() {
            // Never picked: no self-check (its time, its risk) for them.
            return Ok(Vec::new());
        }
        let verdicts = self.coop_verdicts(support, device, work)?;
        Ok(takes
            .filter(|c| verdicts.iter().any(|(n, v)| *n == c.name && v.is_ok()))
            .map(|c| c.name)
            .collect())
    }

    /// Each candidate's self-check verdict for `work` on this adapter (kept in `support`),
    /// checking on first use: the products' when a product first asks, the convolutions' when
    /// a convolution does (a model without one never pays for their check), so that a
    /// candidate whose gather fails still takes the products.
    fn coop_verdicts<'s>(
        &self,
        support: &'s CoopSupport,
        device: &LogicalDevice,
        work: Work,
    ) -> Result<&'s [(&'static str, std::result::Result<(), String>)]> {
        let ctx = &self.dev.ctx;
        let cell = match work {
            Work::Products => &support.verdicts,
            Work::Convolutions => &support.conv_verdicts,
        };
        if let Some(verdicts) = cell.get() {
            return Ok(verdicts);
        }
        // An error of the work before is that work's: it fails the op at hand here, rather
        // than a candidate's check.
        ctx.wait_idle()?;
        Ok(cell.get_or_init(|| {
            // The check waits for the device: a warm-up of a tuned op around this one must
            // not count that time against its candidate.
            ctx.tuner.note_outside_work();
            let mut lost: Option<&str> = None;
            let check = match work {
                Work::Products => Self::coop_self_check,
                Work::Convolutions => Self::coop_conv_self_check,
            };
            CANDIDATES
                .iter()
                .enumerate()
                .map(|(index, c)| {
                    let name = c.name;
                    // After a device failure every check would fail, and blame its kernel.
                    let verdict = match lost {
                        Some(first) => Err(format!(
                            "not checked: the device failed in {first}'s self-check"
                        )),
                        // A kernel the driver does not compile is this candidate's failure,
                        // not the device's.
                        None => match ctx.pipeline(c.kernel, self.name) {
                            Err(e) => Err(e.to_string()),
                            Ok(_) => check(self, device, index, c).unwrap_or_else(|e| {
                                lost = Some(name);
                                Err(format!("the device failed: {e}"))
                            }),
                        },
                    };
                    let what = work.name();
                    match &verdict {
                        Ok(()) => {
                            log::info!("{}: {name} passed its self-check ({what})", self.name)
                        }
                        Err(e) => log::error!(
                            "{}: tensor-core candidate {name} disabled for {what}, its \
                             self-check failed: {e}",
                            self.name
                        ),
                    }
                    (name, verdict)
                })
                .collect()
        }))
    }

    /// Runs candidate `c` (the `index`-th, which seeds its inputs) on float16 products of
    /// [`CHECK_SHAPES`] in every layout the gradients use, with a bias and an activation,
    /// against the f64 oracle. `Err` is a device failure; `Ok(Err)` names the first wrong
    /// output.
    fn coop_self_check(
        &self,
        device: &LogicalDevice,
        index: usize,
        c: &Candidate,
    ) -> Result<std::result::Result<(), String>> {
        let name = c.name;
        let mut products = Vec::new();
        for (s, &(m, k, n)) in CHECK_SHAPES.iter().enumerate() {
            for (l, (trans_a, trans_b)) in CHECK_LAYOUTS.into_iter().enumerate() {
                let d = MatmulDims {
                    m,
                    k,
                    n,
                    trans_a,
                    trans_b,
                };
                let act = [Activation::Relu, Activation::Linear, Activation::Selu][(s + l) % 3];
                products.push((d, act, None));
            }
        }
        if c.split {
            let (d, k_slice) = SPLIT_CHECK;
            products.push((d, Activation::Selu, Some(k_slice)));
        }
        for (p, (d, act, k_slice)) in products.into_iter().enumerate() {
            if !applies(c, d) {
                continue;
            }
            let MatmulDims {
                m,
                k,
                n,
                trans_a,
                trans_b,
            } = d;
            // Each candidate and product its own numbers, and an output of NaN: one that
            // leaves elements unwritten cannot pass on what the last check left in memory.
            let seed = 91_000 + 1_000 * index as u64 + 10 * p as u64;
            let ashape = if trans_a { [k, m] } else { [m, k] };
            let bshape = if trans_b { [n, k] } else { [k, n] };
            let (av, ah) = halves(m * k, seed);
            let (bv, bh) = halves(k * n, seed + 1);
            let (cv, ch) = halves(n, seed + 2);
            let at = Tensor::from_slice_on(&ah, &ashape, device)?;
            let bt = Tensor::from_slice_on(&bh, &bshape, device)?;
            let ct = Tensor::from_slice_on(&ch, &[n], device)?;
            let out = Tensor::from_slice_on(&vec![f16::NAN; m * n], &[m, n], device)?;
            match k_slice {
                Some(k_slice) => {
                    self.coop_split_product(&at, &bt, Some(&ct), &out, d, act, k_slice)?
                }
                None => self.matmul_coop(name, &at, &bt, Some(&ct), &out, d, act)?,
            }
            let got = out.to_vec::<f16>()?;
            let product = reference::matmul(&av, &bv, m, k, n, trans_a, trans_b);
            let want = reference::bias_act(&product, Some(&cv), act);
            if let Some((i, g, w)) = first_off(&got, &want) {
                return Ok(Err(format!(
                    "{m}x{k}x{n} trans_a={trans_a} trans_b={trans_b} {act:?}: out[{}, {}] = {g} \
                     where the f64 oracle has {w:.5}",
                    i / n,
                    i % n
                )));
            }
        }
        Ok(Ok(()))
    }

    /// Runs candidate `c` (the `index`-th, which seeds its inputs) on the float16 convolutions
    /// of [`CONV_CHECKS`] it takes (the forward pass with and without a bias, the input
    /// gradients at strides above 1; the split candidate: every kernel gradient) against the
    /// f64 oracle. `Err` is a device failure; `Ok(Err)` names the first wrong output.
    fn coop_conv_self_check(
        &self,
        device: &LogicalDevice,
        index: usize,
        c: &Candidate,
    ) -> Result<std::result::Result<(), String>> {
        let name = c.name;
        for (q, s) in CONV_CHECKS.iter().enumerate() {
            let g = ConvGeometry::conv(s);
            let seed = 95_000 + 1_000 * index as u64 + 10 * q as u64;
            let what = format!(
                "{}x{}x{}x{}->{} {}x{} {:?} strides {:?} dilation {:?}",
                s.n, s.h, s.w, s.c_in, s.c_out, s.kh, s.kw, s.padding, s.strides, s.dilation
            );
            let (xv, xh) = halves(s.input_len(), seed);
            let x = Tensor::from_slice_on(&xh, &[s.n, s.h, s.w, s.c_in], device)?;
            let (oh, ow) = s.out_hw();
            if c.split {
                // The kernel gradient in slices of two steps of k (pixels), the last ragged.
                let (dzv, dzh) = halves(s.output_len(), seed + 1);
                let dz = Tensor::from_slice_on(&dzh, &[s.n, oh, ow, s.c_out], device)?;
                // The layers added up here: a column sum on the device would be tuned, on
                // these toy shapes, inside the check.
                let d = conv_dims(&g, ConvMode::KernelGrad);
                let (partials, splits) = self.coop_split(&x, &dz, d, 64, Some(&g))?;
                let got = layer_sums(&partials.to_vec::<f32>()?, splits);
                let want = reference::conv2d_backward_kernel(&xv, &dzv, s);
                if let Some((i, g, w)) = first_off(&got, &want) {
                    return Ok(Err(format!(
                        "kernel gradient of {what}: dk[{i}] = {g} where the f64 oracle has {w:.5}"
                    )));
                }
            } else if conv_fits(&g) && conv_applies(c, &g) {
                let kshape = [s.kh, s.kw, s.c_in, s.c_out];
                let (kv, kh) = halves(s.kernel_len(), seed + 1);
                let (bv, bh) = halves(s.c_out, seed + 2);
                let kernel = Tensor::from_slice_on(&kh, &kshape, device)?;
                let bias = Tensor::from_slice_on(&bh, &[s.c_out], device)?;
                let len = s.output_len();
                let y =
                    Tensor::from_slice_on(&vec![f16::NAN; len], &[s.n, oh, ow, s.c_out], device)?;
                // ReLU would hide a wrong negative output: mostly the others.
                let act = [Activation::Linear, Activation::Selu, Activation::Relu][q % 3];
                let bias = (q % 2 == 0).then_some(&bias);
                let gather = Gather::conv(g);
                self.conv_coop(name, &x, &kernel, bias, &y, &gather, act)?;
                let got = y.to_vec::<f16>()?;
                let bias = (q % 2 == 0).then_some(&bv[..]);
                let want = reference::conv2d_forward(&xv, &kv, bias, s, act);
                if let Some((i, g, w)) = first_off(&got, &want) {
                    return Ok(Err(format!(
                        "{what} {act:?}: y[{i}] = {g} where the f64 oracle has {w:.5}"
                    )));
                }
            }
            // The input gradient, over dz upsampled by the strides (and dilated taps).
            let gather = Gather::input_grad(&g);
            if !c.split && !s.is_unit_stride() && conv_fits(&gather.g) && conv_applies(c, &gather.g)
            {
                let (kv, kh) = halves(s.kernel_len(), seed + 3);
                let (dzv, dzh) = halves(s.output_len(), seed + 4);
                let kt = flipped(&kh, s);
                let kt = Tensor::from_slice_on(&kt, &[s.kh, s.kw, s.c_out, s.c_in], device)?;
                let dz = Tensor::from_slice_on(&dzh, &[s.n, oh, ow, s.c_out], device)?;
                let len = s.input_len();
                let dx =
                    Tensor::from_slice_on(&vec![f16::NAN; len], &[s.n, s.h, s.w, s.c_in], device)?;
                self.conv_coop(name, &dz, &kt, None, &dx, &gather, Activation::Linear)?;
                let got = dx.to_vec::<f16>()?;
                let want = reference::conv2d_backward_input(&dzv, &kv, s);
                if let Some((i, g, w)) = first_off(&got, &want) {
                    return Ok(Err(format!(
                        "input gradient of {what}: dx[{i}] = {g} where the f64 oracle has {w:.5}"
                    )));
                }
            }
        }
        Ok(Ok(()))
    }

    /// `out = act(op(a) · op(b) + bias)` by candidate `name` (float16 tensors; k > 0).
    #[allow(clippy::too_many_arguments)] // matmul_impl's operands, dims and activation
    pub(crate) fn matmul_coop(
        &self,
        name: &str,
        a: &Tensor,
        b: &Tensor,
        bias: Option<&Tensor>,
        out: &Tensor,
        d: MatmulDims,
        act: Activation,
    ) -> Result<()> {
        // Offered only where it applies (the split kernel only where its row tiles fit in one
        // grid dimension: z holds the slices); anything else is refused rather than run by
        // another kernel, which might be one whose self-check failed.
        let split_fits = d.m.div_ceil(64) <= MAX_GROUPS_PER_DIM;
        let Some(&c) = CANDIDATES
            .iter()
            .find(|c| c.name == name && applies(c, d) && (!c.split || split_fits))
        else {
            return Err(Error::Unsupported {
                op: "MatMul",
                device: self.name.to_string(),
                missing: format!(
                    "the tensor-core kernel {name} for a {}x{}x{} product (trans_a {}, trans_b {})",
                    d.m, d.k, d.n, d.trans_a, d.trans_b
                ),
            });
        };
        if c.split {
            let (k_slice, _) = split_slices(d);
            return self.coop_split_product(a, b, bias, out, d, act, k_slice);
        }
        let bias_or_out = bias.unwrap_or(out);
        let (p, grid) = launch_shape(d, bias.is_some(), act, (c.rows, c.cols));
        if c.v4 {
            // Bindings 3, 4, 5, 6: bias, out, then a and b as vec4.
            self.launch(c.kernel, &p, &[bias_or_out, out, a, b], grid)
        } else {
            self.launch(c.kernel, &p, &[a, b, bias_or_out, out], grid)
        }
    }
}

impl GpuKernels<'_> {
    /// `out = act(op(a) · op(b) + bias)` on the tensor cores, split over k in slices of
    /// `k_slice` (whole steps of 32): the layers' float32 sums, then matmul.wgsl's reduction
    /// with the bias and the activation (its float16 twin rounds once, at the end).
    #[allow(clippy::too_many_arguments)] // matmul_coop's, and the slice
    fn coop_split_product(
        &self,
        a: &Tensor,
        b: &Tensor,
        bias: Option<&Tensor>,
        out: &Tensor,
        d: MatmulDims,
        act: Activation,
        k_slice: usize,
    ) -> Result<()> {
        let (partials, splits) = self.coop_split(a, b, d, k_slice, None)?;
        let (mut r, _) = launch_shape(d, bias.is_some(), act, (64, 64));
        r.k = splits as u32;
        let grid = grid_1d(d.m * d.n, 256);
        self.launch(
            SPLITK_REDUCE,
            &r,
            &[bias.unwrap_or(out), out, &partials],
            grid,
        )
    }

    /// The float32 partial sums `[splits, m, n]` of `op(a) · op(b)` by
    /// `matmul_coop_64x64_splitk`, one layer per slice of k (float16 tensors; k > 0); with
    /// `gather`, A is the transposed im2col matrix of that convolution of the image `a`.
    fn coop_split(
        &self,
        a: &Tensor,
        b: &Tensor,
        d: MatmulDims,
        k_slice: usize,
        gather: Option<&ConvGeometry>,
    ) -> Result<(Tensor, usize)> {
        let splits = d.k.div_ceil(k_slice).max(1);
        let partials = Tensor::uninit(&[splits, d.m, d.n], DType::F32, a.device_handle())?;
        let (mut p, _) = launch_shape(d, false, Activation::Linear, (64, 64));
        if let Some(g) = gather {
            p = p.gathering(ConvMode::KernelGrad, &Gather::conv(*g));
        }
        p.k_slice = k_slice as u32;
        // No row tile folds into z, which holds the slices: the callers check that the row
        // tiles fit in y.
        let grid = [
            d.n.div_ceil(64) as u32,
            d.m.div_ceil(64) as u32,
            splits as u32,
        ];
        self.launch(SPLIT_KERNEL, &p, &[a, b, &partials], grid)?;
        Ok((partials, splits))
    }

    /// Whether the split-k candidate is offered for `op(a) · op(b)` of `d` (float16 operands):
    /// tensor cores, its self-check passed, few tiles and a long k.
    pub(crate) fn coop_split_offered(
        &self,
        (a, b): (&Tensor, &Tensor),
        d: MatmulDims,
    ) -> Result<bool> {
        let half = a.dtype() == DType::F16 && b.dtype() == DType::F16;
        if !half || d.k == 0 {
            return Ok(false);
        }
        let offered = self.coop_offered(&self.dev.ctx.coop, d, a.device_handle())?;
        Ok(offered.contains(&SPLIT_CANDIDATE))
    }

    /// `out = op(a) · op(b)` on the tensor cores, split over k, the layers added up by a column
    /// sum into `out` of either float dtype (a 1×1 convolution's float32 kernel gradient:
    /// `xᵀ · dz` over the pixels). For where [`coop_split_offered`](Self::coop_split_offered).
    pub(crate) fn coop_split_sum(
        &self,
        (a, b): (&Tensor, &Tensor),
        out: &Tensor,
        d: MatmulDims,
    ) -> Result<()> {
        let (k_slice, _) = split_slices(d);
        let (partials, splits) = self.coop_split(a, b, d, k_slice, None)?;
        self.sum_rows(&partials, splits, d.m * d.n, out)
    }
}

impl GpuKernels<'_> {
    /// The tensor-core candidates for the forward pass of convolution `g`, `y = act(conv(x,
    /// kernel) + bias)` as the implicit product of its im2col matrix and the kernel: float16
    /// tensors, one group and taps enough ([`conv_fits`]), the candidates that take it whose
    /// self-check passed.
    pub(crate) fn coop_conv_candidates(
        &self,
        (x, kernel, bias, y): (&Tensor, &Tensor, Option<&Tensor>, &Tensor),
        gather: &Gather,
    ) -> Result<Vec<&'static str>> {
        let g = &gather.g;
        let half = [Some(x), Some(kernel), bias, Some(y)]
            .into_iter()
            .flatten()
            .all(|t| t.dtype() == DType::F16);
        if !half || !conv_fits(g) {
            return Ok(Vec::new());
        }
        self.coop_passing(
            &self.dev.ctx.coop,
            y.device_handle(),
            Work::Convolutions,
            &|c| conv_applies(c, g),
        )
    }

    /// `y = act(conv(x, kernel) + bias)` (convolution `g`, float16 tensors) by candidate
    /// `name`, where [`coop_conv_candidates`](Self::coop_conv_candidates) offers it.
    #[allow(clippy::too_many_arguments)] // a convolution's operands, geometry and activation
    pub(crate) fn conv_coop(
        &self,
        name: &str,
        x: &Tensor,
        kernel: &Tensor,
        bias: Option<&Tensor>,
        y: &Tensor,
        gather: &Gather,
        act: Activation,
    ) -> Result<()> {
        let g = &gather.g;
        let Some(&c) = CANDIDATES
            .iter()
            .find(|c| c.name == name && conv_applies(c, g) && conv_fits(g))
        else {
            return Err(Error::Unsupported {
                op: "Conv2D",
                device: self.name.to_string(),
                missing: format!(
                    "the tensor-core kernel {name} for a {}x{} convolution of {} to {} channels \
                     in {} group(s)",
                    g.kh,
                    g.kw,
                    g.ci,
                    g.co,
                    g.ci / g.cig.max(1)
                ),
            });
        };
        let d = conv_dims(g, ConvMode::Forward);
        let (p, grid) = launch_shape(d, bias.is_some(), act, (c.rows, c.cols));
        let p = p.gathering(ConvMode::Forward, gather);
        let b = bias.unwrap_or(y);
        if c.v4 {
            self.launch(c.kernel, &p, &[b, y, x, kernel], grid)
        } else {
            self.launch(c.kernel, &p, &[x, kernel, b, y], grid)
        }
    }

    /// Whether the kernel gradient of convolution `g` is offered on the tensor cores
    /// ([`coop_conv_dk`](Self::coop_conv_dk)): float16 `x` and `dz`, one group and taps
    /// enough, pixels enough to split, and the split candidate's self-check passed.
    pub(crate) fn coop_conv_dk_offered(
        &self,
        (x, dz): (&Tensor, &Tensor),
        g: &ConvGeometry,
    ) -> Result<bool> {
        let half = x.dtype() == DType::F16 && dz.dtype() == DType::F16;
        let d = conv_dims(g, ConvMode::KernelGrad);
        if !half || !conv_fits(g) || d.k < SPLIT_MIN_K || d.m.div_ceil(64) > MAX_GROUPS_PER_DIM {
            return Ok(false);
        }
        let support = &self.dev.ctx.coop;
        let offered =
            self.coop_passing(support, x.device_handle(), Work::Convolutions, &|c| c.split)?;
        Ok(!offered.is_empty())
    }

    /// The kernel gradient `dk = im2col(x)ᵀ · dz` of convolution `g` (`dk` `[kh, kw, ci, co]`
    /// of either float dtype) on the tensor cores, split over the pixels, the slices added up
    /// by a column sum.
    pub(crate) fn coop_conv_dk(
        &self,
        x: &Tensor,
        dz: &Tensor,
        dk: &Tensor,
        g: &ConvGeometry,
    ) -> Result<()> {
        let d = conv_dims(g, ConvMode::KernelGrad);
        let (k_slice, _) = split_slices(d);
        let (partials, splits) = self.coop_split(x, dz, d, k_slice, Some(g))?;
        self.sum_rows(&partials, splits, d.m * d.n, dk)
    }
}

/// The params and grid of a product of `d` on a kernel of `rows` × `cols` outputs per
/// workgroup.
fn launch_shape(
    d: MatmulDims,
    has_bias: bool,
    act: Activation,
    (rows, cols): (usize, usize),
) -> (CoopParams, [u32; 3]) {
    let (a_rs, a_cs) = if d.trans_a { (1, d.m) } else { (d.k, 1) };
    let (b_rs, b_cs) = if d.trans_b { (1, d.k) } else { (d.n, 1) };
    // Shapes on a GPU fit in u32 (bounded by the binding size).
    let u = |x: usize| x as u32;
    let p = CoopParams {
        m: u(d.m),
        k: u(d.k),
        n: u(d.n),
        has_bias: u32::from(has_bias),
        a_rs: u(a_rs),
        a_cs: u(a_cs),
        b_rs: u(b_rs),
        b_cs: u(b_cs),
        act: act.code(),
        ..CoopParams::zeroed()
    };
    // Row tiles past one grid dimension fold into z (the shader's row_tile).
    let row_tiles = d.m.div_ceil(rows);
    let y = row_tiles.clamp(1, MAX_GROUPS_PER_DIM);
    let grid = [u(d.n.div_ceil(cols)), u(y), u(row_tiles.div_ceil(y).max(1))];
    (p, grid)
}

impl LogicalDevice {
    /// The adapter's cooperative-matrix configurations (tensor cores), as wgpu reports them, when
    /// this device was opened with them: empty on the CPU and on adapters without a
    /// configuration the float16 matrix-product kernels use.
    ///
    /// ```
    /// let rt = anygpu::Runtime::builder().build()?;
    /// assert!(rt.cpu()?.cooperative_matrix_configs().is_empty());
    /// # Ok::<(), anygpu::Error>(())
    /// ```
    pub fn cooperative_matrix_configs(&self) -> Vec<wgpu::CooperativeMatrixProperties> {
        self.gpu()
            .map(|g| g.ctx.coop.configs.clone())
            .unwrap_or_default()
    }

    /// Why the tensor-core products do not run on this device (the feature, configuration or
    /// subgroup size its adapter lacks), `None` where they do.
    ///
    /// ```
    /// let rt = anygpu::Runtime::builder().build()?;
    /// assert!(rt.cpu()?.cooperative_matrix_missing().is_some());
    /// # Ok::<(), anygpu::Error>(())
    /// ```
    pub fn cooperative_matrix_missing(&self) -> Option<String> {
        match self.gpu() {
            Some(g) => g.ctx.coop.missing.clone(),
            None => Some(format!("{} is no GPU", self.name())),
        }
    }

    /// The kernels on cooperative matrices (tensor cores) the autotuner may offer for float16
    /// products and convolutions on this device, each with its self-checks against the f64
    /// oracle (run here if no op ran them yet): `Ok` when it passed both, else what failed,
    /// for products or for convolutions (a candidate is never offered for the work whose check
    /// it failed). Empty where the adapter has no matching configuration (and on the CPU).
    ///
    /// # Errors
    /// The device's failure, if the work recorded before the check fails (the check waits for
    /// it first).
    ///
    /// ```
    /// let rt = anygpu::Runtime::builder().build()?;
    /// for gpu in rt.list_logical_devices(anygpu::DeviceKind::Gpu)? {
    ///     for (kernel, check) in gpu.cooperative_matrix_kernels()? {
    ///         println!("{kernel}: {check:?}");
    ///     }
    /// }
    /// # Ok::<(), anygpu::Error>(())
    /// ```
    pub fn cooperative_matrix_kernels(
        &self,
    ) -> Result<Vec<(&'static str, std::result::Result<(), String>)>> {
        let Some(g) = self.gpu() else {
            return Ok(Vec::new());
        };
        if !g.ctx.coop.usable() {
            return Ok(Vec::new());
        }
        let kernels = GpuKernels::new(g, self.full_name());
        let products = kernels.coop_verdicts(&g.ctx.coop, self, Work::Products)?;
        let convolutions = kernels.coop_verdicts(&g.ctx.coop, self, Work::Convolutions)?;
        Ok(products
            .iter()
            .zip(convolutions)
            .map(|((name, p), (_, c))| {
                let verdict = match (p, c) {
                    (Ok(()), Ok(())) => Ok(()),
                    (p, c) => Err([("products", p), ("convolutions", c)]
                        .into_iter()
                        .filter_map(|(what, v)| v.as_ref().err().map(|e| format!("{what}: {e}")))
                        .collect::<Vec<_>>()
                        .join("; ")),
                };
                (*name, verdict)
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shader::coop::{missing, NEEDS, SUBGROUP_SIZE};
    use crate::shader::{capabilities_of, validate, ShaderFamily};
    use std::sync::OnceLock;

    fn config(m: u32, ab: wgpu::CooperativeScalarType) -> wgpu::CooperativeMatrixProperties {
        wgpu::CooperativeMatrixProperties {
            m_size: m,
            n_size: 16,
            k_size: 16,
            ab_type: ab,
            cr_type: wgpu::CooperativeScalarType::F32,
            saturating_accumulation: false,
        }
    }

    fn nvidia() -> wgpu::AdapterInfo {
        wgpu::AdapterInfo {
            subgroup_min_size: 32,
            subgroup_max_size: 32,
            ..wgpu::AdapterInfo::new(wgpu::DeviceType::DiscreteGpu, wgpu::Backend::Vulkan)
        }
    }

    #[test]
    fn the_kernels_run_only_with_the_configuration_and_subgroup_size_they_are_written_for() {
        use wgpu::CooperativeScalarType::{F16, F32};
        let all = NEEDS | wgpu::Features::TIMESTAMP_QUERY;
        assert_eq!(missing(all, &[config(16, F16)], &nvidia()), None);
        // Another shape or input type, or none at all.
        assert!(missing(all, &[config(8, F16), config(16, F32)], &nvidia()).is_some());
        assert!(missing(all, &[], &nvidia()).is_some());
        // Without the feature (not requested, or refused), subgroups or float16.
        for lacking in [
            wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX,
            wgpu::Features::SUBGROUP,
            wgpu::Features::SHADER_F16,
        ] {
            let why = missing(all - lacking, &[config(16, F16)], &nvidia());
            let name = lacking.iter_names().next().expect("one flag").0;
            assert!(why.is_some_and(|w| w.contains(name)), "{lacking:?}");
        }
        // Subgroups of 64 (AMD's wave64) or of varying size (Intel) would leave fragments
        // unwritten.
        for (lo, hi) in [(64, 64), (32, 64), (8, 32)] {
            let info = wgpu::AdapterInfo {
                subgroup_min_size: lo,
                subgroup_max_size: hi,
                ..nvidia()
            };
            assert!(
                missing(all, &[config(16, F16)], &info).is_some(),
                "{lo}..{hi}"
            );
        }
    }

    #[test]
    fn the_kernels_validate_with_cooperative_matrices_and_compile_to_spirv() {
        assert!(validate(
            ShaderFamily::MatmulCoop,
            capabilities_of(NEEDS - wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX)
        )
        .is_err());
        let v = validate(ShaderFamily::MatmulCoop, capabilities_of(NEEDS)).unwrap();
        for c in CANDIDATES {
            let e = &v.entries[c.kernel.entry];
            assert_eq!(e.workgroup_size, [4 * SUBGROUP_SIZE, 1, 1], "{}", c.name);
            let bindings: &[u32] = match (c.v4, c.split) {
                (_, true) => &[1, 2, 7],
                (true, false) => &[3, 4, 5, 6],
                (false, false) => &[1, 2, 3, 4],
            };
            assert_eq!(e.bindings, bindings, "{}", c.name);
        }
        assert_eq!(v.workgroup_bytes, 13_824);
        // What wgpu's Vulkan backend does with it: naga's SPIR-V writer must take every entry
        // point (the cooperative types, zero accumulators, loads and stores of workgroup memory).
        let source = ShaderFamily::MatmulCoop.source();
        let module = naga::front::wgsl::parse_str(source).unwrap();
        let info = naga::valid::Validator::new(
            naga::valid::ValidationFlags::all(),
            capabilities_of(NEEDS),
        )
        .validate(&module)
        .unwrap();
        // wgpu-hal's options on a Vulkan 1.3 device without robustBufferAccess2.
        let restrict = naga::proc::BoundsCheckPolicy::Restrict;
        let options = naga::back::spv::Options {
            lang_version: (1, 6),
            bounds_check_policies: naga::proc::BoundsCheckPolicies {
                index: restrict,
                buffer: restrict,
                image_load: restrict,
                binding_array: naga::proc::BoundsCheckPolicy::Unchecked,
            },
            force_loop_bounding: true,
            ..Default::default()
        };
        for Candidate { kernel, .. } in CANDIDATES {
            let pipeline = naga::back::spv::PipelineOptions {
                shader_stage: naga::ShaderStage::Compute,
                entry_point: kernel.entry.to_string(),
            };
            let words = naga::back::spv::write_vec(&module, &info, &options, Some(&pipeline))
                .unwrap_or_else(|e| panic!("{}: {e}", kernel.entry));
            assert_eq!(words.first(), Some(&0x0723_0203), "SPIR-V magic");
            spirv_val(kernel.entry, &words);
        }
    }

    /// Runs the SPIRV-Tools validator on `words` for Vulkan 1.3 where it is installed
    /// (`spirv-val`, Debian's spirv-tools), and says so where it is not.
    fn spirv_val(entry: &str, words: &[u32]) {
        let words = &without_workgroup_array_strides(words);
        let path = std::env::temp_dir().join(format!("anygpu-{entry}-{}.spv", std::process::id()));
        std::fs::write(&path, bytemuck::cast_slice::<u32, u8>(words)).unwrap();
        let run = std::process::Command::new("spirv-val")
            .args(["--target-env", "vulkan1.3"])
            .arg(&path)
            .output();
        let _ = std::fs::remove_file(&path);
        match run {
            Ok(out) => assert!(
                out.status.success(),
                "spirv-val refuses {entry}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
            Err(e) => {
                eprintln!("spirv-val not run on {entry} ({e}): SPIR-V written, not validated")
            }
        }
    }

    /// `words` without the ArrayStride decorations naga 30 puts on arrays in workgroup memory,
    /// which Vulkan has since forbidden (VUID-StandaloneSpirv-None-10684; every family with
    /// workgroup arrays has them, and drivers ignore them): so that `spirv-val` goes on to the
    /// rest.
    fn without_workgroup_array_strides(words: &[u32]) -> Vec<u32> {
        const OP_DECORATE: u32 = 71;
        const OP_TYPE_POINTER: u32 = 32;
        const ARRAY_STRIDE: u32 = 6;
        const WORKGROUP: u32 = 4;
        let instructions = |words: &[u32]| -> Vec<(usize, usize)> {
            let mut at = 5;
            let mut spans = Vec::new();
            while at < words.len() {
                let count = (words[at] >> 16) as usize;
                spans.push((at, count.max(1)));
                at += count.max(1);
            }
            spans
        };
        let spans = instructions(words);
        let workgroup_types: Vec<u32> = spans
            .iter()
            .filter(|&&(at, n)| {
                words[at] & 0xffff == OP_TYPE_POINTER && n == 4 && words[at + 2] == WORKGROUP
            })
            .map(|&(at, _)| words[at + 3])
            .collect();
        let mut out = words[..5].to_vec();
        for (at, n) in spans {
            let w = &words[at..at + n];
            let strip = w[0] & 0xffff == OP_DECORATE
                && n == 4
                && w[2] == ARRAY_STRIDE
                && workgroup_types.contains(&w[1]);
            if !strip {
                out.extend_from_slice(w);
            }
        }
        out
    }

    /// `matmul_coop.wgsl` with each cooperative-matrix operation done by hand, for adapters
    /// without them: a fragment of C is the 8 elements `lane + 32 e` (row-major in 16×16) one of
    /// a subgroup's 32 invocations holds, `subgroup_id` is `t / 32`, a fragment of A or B is
    /// its offset in `at` or `bt` (loads always name those tiles with strides AS and BS, and
    /// the multiply-add that uses a fragment reads the tile before the next barrier, as the
    /// load would). Everything else (the tiles' loads, zero padding, transposes, offsets of
    /// the fragments, the write of the output, params and grid) is the kernel's own text.
    fn emulated_source() -> String {
        let mut out = String::new();
        for line in ShaderFamily::MatmulCoop.source().lines() {
            let code = line.trim_start();
            let between = |open: &str, close: &str| -> Option<String> {
                let start = code.find(open)? + open.len();
                let end = start + code[start..].find(close)?;
                Some(code[start..end].to_string())
            };
            let indent = &line[..line.len() - code.len()];
            let lhs = code.split(" = ").next().unwrap_or("");
            if code == "enable wgpu_cooperative_matrix;"
                || code.starts_with("@builtin(subgroup_id)")
            {
                continue;
            } else if code.starts_with("let row0 = ") {
                out.push_str(&format!("{indent}let sg = t / 32u;\n{line}\n"));
            } else if code.contains("coop_mat16x16<f32, C>()") {
                out.push_str(&format!(
                    "{}\n",
                    line.replace("coop_mat16x16<f32, C>()", "array<f32, 8>()")
                ));
            } else if code.contains("coopLoadT<coop_mat16x16<f16, A>>") {
                let offset =
                    between("(&at[", "], AS);").expect("A fragments load `at` with stride AS");
                out.push_str(&format!("{indent}{lhs} = {offset};\n"));
            } else if code.contains("coopLoadT<coop_mat16x16<f16, B>>") {
                let offset =
                    between("(&bt[", "], BS);").expect("B fragments load `bt` with stride BS");
                out.push_str(&format!("{indent}{lhs} = {offset};\n"));
            } else if code.contains("coopMultiplyAdd(") {
                let args = between("coopMultiplyAdd(", ");").expect("one multiply-add a line");
                out.push_str(&format!("{indent}{lhs} = emu_mad({args}, t % 32u);\n"));
            } else if code.starts_with("coopStoreT(") {
                let args =
                    between("coopStoreT(", ", 16u);").expect("C fragments stored with stride 16");
                let (c, slot) = args
                    .split_once(", &ct[")
                    .expect("C fragments stored into `ct`");
                let slot = slot.trim_end_matches(']');
                out.push_str(&format!("{indent}emu_store({c}, {slot}, t % 32u);\n"));
            } else {
                out.push_str(line);
                out.push('\n');
            }
        }
        out.push_str(
            "
fn emu_mad(a_off: u32, b_off: u32, c: array<f32, 8>, lane: u32) -> array<f32, 8> {
    var r = c;
    for (var e = 0u; e < 8u; e++) {
        let idx = lane + 32u * e;
        var s = 0.0;
        for (var l = 0u; l < 16u; l++) {
            s += f32(at[a_off + (idx / 16u) * AS + l]) * f32(bt[b_off + l * BS + idx % 16u]);
        }
        r[e] += s;
    }
    return r;
}

fn emu_store(c: array<f32, 8>, slot: u32, lane: u32) {
    for (var e = 0u; e < 8u; e++) {
        ct[slot + lane + 32u * e] = c[e];
    }
}
",
        );
        out
    }

    #[test]
    fn the_emulated_kernels_keep_no_cooperative_operation() {
        let source = emulated_source();
        for line in source.lines().filter(|l| !l.trim_start().starts_with("//")) {
            for op in [
                "coop_mat",
                "coopLoad",
                "coopStore",
                "coopMultiplyAdd",
                "subgroup",
            ] {
                assert!(!line.contains(op), "{line}");
            }
        }
        let caps = capabilities_of(wgpu::Features::SHADER_F16);
        let v = crate::shader::validate_source("emulated", &source, caps).unwrap();
        assert_eq!(v.entries.len(), CANDIDATES.len());
    }

    /// A runtime on Vulkan (lavapipe here), tuning unforced, and its first GPU with float16;
    /// `None` (the test skips; under `ANYGPU_REQUIRE_ADAPTER=1` it fails) without one.
    fn float16_gpu() -> Option<(crate::Runtime, LogicalDevice)> {
        let rt = crate::Runtime::builder()
            .env("WGPU_BACKEND", Some("vulkan"))
            .env("ANYGPU_AUTOTUNE_FORCE", None)
            .build()
            .expect("runtime");
        let gpus = rt
            .list_logical_devices(crate::DeviceKind::Gpu)
            .expect("devices");
        let Some(dev) = gpus.into_iter().find(|d| d.has_f16()) else {
            assert!(
                std::env::var("ANYGPU_REQUIRE_ADAPTER").as_deref() != Ok("1"),
                "ANYGPU_REQUIRE_ADAPTER=1 but no Vulkan adapter with float16"
            );
            eprintln!("SKIPPED: no adapter with float16");
            return None;
        };
        Some((rt, dev))
    }

    /// Candidate `c`'s kernel compiled from `source` (the emulated text) on `ctx`'s device,
    /// with the layout the pipeline cache would give it.
    fn emulated_pipeline(
        ctx: &crate::device::context::GpuContext,
        source: &str,
        c: &Candidate,
    ) -> crate::shader::Pipeline {
        let module = ctx
            .device
            .create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some("matmul_coop.wgsl (emulated)"),
                source: wgpu::ShaderSource::Wgsl(source.into()),
            });
        let entries = crate::shader::validate_source(
            "emulated",
            source,
            capabilities_of(wgpu::Features::SHADER_F16),
        )
        .unwrap()
        .entries;
        let bindings = entries[c.kernel.entry].bindings.clone();
        let buffer = |binding: u32| wgpu::BindGroupLayoutEntry {
            binding,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: if binding == 0 {
                    wgpu::BufferBindingType::Uniform
                } else {
                    wgpu::BufferBindingType::Storage { read_only: false }
                },
                has_dynamic_offset: binding == 0,
                min_binding_size: None,
            },
            count: None,
        };
        let layout_entries: Vec<_> = std::iter::once(0)
            .chain(bindings.iter().copied())
            .map(buffer)
            .collect();
        let layout = ctx
            .device
            .create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                label: None,
                entries: &layout_entries,
            });
        let pipeline_layout = ctx
            .device
            .create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                label: None,
                bind_group_layouts: &[Some(&layout)],
                immediate_size: 0,
            });
        crate::shader::Pipeline {
            name: c.kernel.entry,
            pipeline: ctx
                .device
                .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                    label: Some(c.kernel.entry),
                    layout: Some(&pipeline_layout),
                    module: &module,
                    entry_point: Some(c.kernel.entry),
                    compilation_options: Default::default(),
                    cache: None,
                }),
            layout,
            bindings,
        }
    }

    /// The self-check itself, through this module's dispatch code (`matmul_coop`, the split
    /// product, `conv_coop`, the gathered split), on the emulated kernels put in the device's
    /// pipeline cache in place of the real ones: every candidate passes; with a gather that
    /// reads the wrong padding, each fails its convolutions' check, says which convolution,
    /// and is offered for products still, never for convolutions.
    #[test]
    fn the_self_check_passes_the_emulated_kernels_and_fails_a_wrong_gather() {
        let Some((_rt, dev)) = float16_gpu() else {
            return;
        };
        let dev = &dev;
        let g = dev.gpu().expect("a GPU");
        let kernels = GpuKernels::new(g, dev.full_name());
        let right = emulated_source();
        let wrong = right.replacen("* p.dw) - i32(p.pl);", "* p.dw) - i32(p.pt);", 1);
        assert_ne!(
            right, wrong,
            "the gather's column padding is where the test expects it"
        );
        for (source, passes) in [(&right, true), (&wrong, false)] {
            for c in CANDIDATES {
                g.ctx
                    .pipelines
                    .replace_for_test(c.kernel, emulated_pipeline(&g.ctx, source, &c));
            }
            let support = CoopSupport {
                configs: Vec::new(),
                missing: None,
                verdicts: OnceLock::new(),
                conv_verdicts: OnceLock::new(),
                emulated: Default::default(),
            };
            let products = kernels.coop_verdicts(&support, dev, Work::Products);
            for (name, verdict) in products.expect("checked") {
                // The products read no image: they pass either way.
                assert_eq!(verdict, &Ok(()), "{name} failed its products' self-check");
            }
            let convolutions = kernels.coop_verdicts(&support, dev, Work::Convolutions);
            for (name, verdict) in convolutions.expect("checked") {
                match (passes, verdict) {
                    (true, Err(e)) => panic!("{name} failed its self-check: {e}"),
                    (false, Ok(())) => panic!("{name} passed with a wrong gather"),
                    (false, Err(e)) => assert!(e.contains("strides"), "{name}: {e}"),
                    (true, Ok(())) => {}
                }
            }
            // What the tuner is offered: the products still, the convolutions only if right.
            let d = MatmulDims {
                m: 64,
                k: 64,
                n: 64,
                trans_a: false,
                trans_b: false,
            };
            let offered = kernels.coop_offered(&support, d, dev).expect("offered");
            assert!(offered.contains(&"coop16_64x64_v4"), "{offered:?}");
            let g = ConvGeometry::conv(&CONV_CHECKS[0]);
            let offered = kernels
                .coop_passing(&support, dev, Work::Convolutions, &|c| conv_applies(c, &g))
                .expect("offered");
            assert_eq!(offered.is_empty(), !passes, "{offered:?}");
        }
    }

    /// The convolution ops through `nn/conv.rs`'s choices (the stride-1 correlation, the
    /// general forward pass, the input gradients at stride 1 and 2, the kernel gradient), each
    /// tensor-core candidate forced in turn on the emulated kernels (the device told it has
    /// them): right against the f64 oracle with the right emulation, and wrong with a gather
    /// one row off (so that it ran, not a fallback; each candidate's forward pass and input
    /// gradient at both strides, or the split one's kernel gradients, fail then).
    #[test]
    fn the_convolution_ops_run_each_forced_candidate() {
        use crate::ops::spec::ConvOptions;
        use crate::ops::GradDType;
        let shapes = [
            // (n, h, w, c_in, c_out, strides): the vec4 candidates', the scalar ones', and the
            // split one's (pixels enough to split), strides uneven too.
            (2, 9, 8, 8, 24, [1, 1]),
            (2, 10, 9, 8, 12, [2, 2]),
            (2, 9, 8, 5, 20, [1, 1]),
            (2, 10, 9, 6, 10, [2, 2]),
            (8, 10, 9, 8, 12, [1, 1]),
            (24, 10, 9, 6, 10, [2, 2]),
            (3, 11, 13, 8, 12, [2, 3]),
            (20, 11, 13, 6, 10, [3, 2]),
        ];
        for c in CANDIDATES {
            let rt = crate::Runtime::builder()
                .env("WGPU_BACKEND", Some("vulkan"))
                .env("ANYGPU_AUTOTUNE_FORCE", Some(c.name))
                .build()
                .expect("runtime");
            let gpus = rt
                .list_logical_devices(crate::DeviceKind::Gpu)
                .expect("devices");
            let Some(dev) = gpus.iter().find(|d| d.has_f16()) else {
                assert!(std::env::var("ANYGPU_REQUIRE_ADAPTER").as_deref() != Ok("1"));
                return;
            };
            let g = dev.gpu().expect("a GPU");
            g.ctx
                .coop
                .emulated
                .store(true, std::sync::atomic::Ordering::Relaxed);
            let _scope = dev.scope();
            let right = emulated_source();
            // Every tap one row off.
            let wrong = right.replacen("- i32(p.pt);", "- i32(p.pt) + 1;", 1);
            assert_ne!(right, wrong);
            for (source, passes) in [(&right, true), (&wrong, false)] {
                for k in CANDIDATES {
                    g.ctx
                        .pipelines
                        .replace_for_test(k.kernel, emulated_pipeline(&g.ctx, source, &k));
                }
                // (shape, op) of each wrong output, and what the candidate takes.
                let mut failures = Vec::new();
                let mut takes = Vec::new();
                for (q, &(n, h, w, c_in, c_out, strides)) in shapes.iter().enumerate() {
                    let s =
                        conv_check(n, h, w, c_in, c_out, (3, 3), Padding::Same, strides, [1, 1]);
                    let options = ConvOptions::new(Padding::Same).strides(strides);
                    let g = ConvGeometry::conv(&s);
                    let dx_g = Gather::input_grad(&g).g;
                    let fits = |g: &ConvGeometry| conv_fits(g) && conv_applies(&c, g);
                    let dk_takes = conv_dims(&g, ConvMode::KernelGrad).k >= SPLIT_MIN_K;
                    takes.extend([
                        ((q, "y"), !c.split && fits(&g)),
                        ((q, "dx"), !c.split && fits(&dx_g)),
                        ((q, "dk"), c.split && dk_takes),
                    ]);
                    let (oh, ow) = s.out_hw();
                    let seed = 8_000 + 10 * q as u64;
                    let (xv, xh) = halves(s.input_len(), seed);
                    let (kv, kh) = halves(s.kernel_len(), seed + 1);
                    let (dzv, dzh) = halves(s.output_len(), seed + 2);
                    let x = Tensor::from_slice_on(&xh, &[n, h, w, c_in], dev).unwrap();
                    let kshape = [3, 3, c_in, c_out];
                    let kernel = Tensor::from_slice_on(&kh, &kshape, dev).unwrap();
                    let dz = Tensor::from_slice_on(&dzh, &[n, oh, ow, c_out], dev).unwrap();
                    let y =
                        crate::ops::conv2d(&x, &kernel, None, options, Activation::Linear).unwrap();
                    let want = reference::conv2d_forward(&xv, &kv, None, &s, Activation::Linear);
                    if let Some(off) = first_off(&y.to_vec::<f16>().unwrap(), &want) {
                        failures.push(((q, "y"), format!("{s:?}: y {off:?}")));
                    }
                    let dx =
                        crate::ops::conv2d_backward_input(&dz, &kernel, &[n, h, w, c_in], options)
                            .unwrap();
                    let want = reference::conv2d_backward_input(&dzv, &kv, &s);
                    if let Some(off) = first_off(&dx.to_vec::<f16>().unwrap(), &want) {
                        failures.push(((q, "dx"), format!("{s:?}: dx {off:?}")));
                    }
                    let f32_grads = GradDType::Float32;
                    let dk =
                        crate::ops::conv2d_backward_kernel_as(&x, &dz, &kshape, options, f32_grads)
                            .unwrap();
                    let want = reference::conv2d_backward_kernel(&xv, &dzv, &s);
                    if let Some(off) = first_off(&dk.to_vec::<f32>().unwrap(), &want) {
                        failures.push(((q, "dk"), format!("{s:?}: dk {off:?}")));
                    }
                }
                if passes {
                    let all: Vec<&str> = failures.iter().map(|(_, f)| f.as_str()).collect();
                    assert!(all.is_empty(), "{}: {}", c.name, all.join("\n"));
                    continue;
                }
                // Wrong wherever the candidate runs: no choice fell back to another kernel.
                for (op, taken) in takes {
                    let failed = failures.iter().any(|(f, _)| *f == op);
                    assert_eq!(failed, taken, "{}: shape {} {}", c.name, op.0, op.1);
                }
            }
        }
    }

    /// The kernels' text with the cooperative operations emulated, on every adapter with
    /// float16 (lavapipe here), through this module's params and grid, against the f64 oracle:
    /// ragged shapes, every transpose, bias and activations.
    #[test]
    fn the_emulated_kernels_match_the_oracle() {
        let Some((_rt, dev)) = float16_gpu() else {
            return;
        };
        let dev = &dev;
        let ctx = &dev.gpu().expect("a GPU").ctx;
        let source = emulated_source();
        let mut failures = Vec::new();
        for c in CANDIDATES {
            let pipeline = emulated_pipeline(ctx, &source, &c);
            let shapes = [
                (1, 1, 1),
                (37, 45, 51),
                (64, 32, 64),
                (100, 70, 131),
                (16, 200, 3),
                (37, 44, 52),
                (100, 72, 132),
                (1, 4, 4),
            ];
            for (s, &(m, k, n)) in shapes.iter().enumerate() {
                for (l, (trans_a, trans_b)) in
                    [(false, false), (true, false), (false, true), (true, true)]
                        .into_iter()
                        .enumerate()
                {
                    let d = MatmulDims {
                        m,
                        k,
                        n,
                        trans_a,
                        trans_b,
                    };
                    if !applies(&c, d) {
                        continue;
                    }
                    let act = [Activation::Relu, Activation::Linear, Activation::Selu][(s + l) % 3];
                    let has_bias = (s + l) % 2 == 0;
                    let seed = 5_000 + 100 * s as u64 + 10 * l as u64;
                    let values = halves;
                    let (av, ah) = values(m * k, seed);
                    let (bv, bh) = values(k * n, seed + 1);
                    let (cv, ch) = values(n, seed + 2);
                    let ashape = if trans_a { [k, m] } else { [m, k] };
                    let bshape = if trans_b { [n, k] } else { [k, n] };
                    let at = Tensor::from_slice_on(&ah, &ashape, dev).unwrap();
                    let bt = Tensor::from_slice_on(&bh, &bshape, dev).unwrap();
                    let ct = Tensor::from_slice_on(&ch, &[n], dev).unwrap();
                    let product = reference::matmul(&av, &bv, m, k, n, trans_a, trans_b);
                    // Split k: the slices `split_slices` gives, and slices of two and three
                    // steps of k (long products get those), the last one ragged.
                    let (natural, _) = split_slices(d);
                    let slices = [natural, 64, 96]
                        .into_iter()
                        .filter(|&s| c.split && (s == natural || s < k));
                    for k_slice in slices {
                        // The layers' raw float32 sums, added up here: the bias, the activation
                        // and the rounding are matmul.wgsl's splitk_reduce's.
                        let splits = k.div_ceil(k_slice);
                        let len = splits * m * n;
                        let part =
                            Tensor::from_slice_on(&vec![f32::NAN; len], &[len], dev).unwrap();
                        let (mut p, _) = launch_shape(d, false, Activation::Linear, (64, 64));
                        p.k_slice = k_slice as u32;
                        let grid = [n.div_ceil(64) as u32, m.div_ceil(64) as u32, splits as u32];
                        let ranges: Vec<_> = [&at, &bt, &part]
                            .iter()
                            .map(|t| t.gpu_range().unwrap())
                            .collect();
                        ctx.dispatch(&pipeline, bytemuck::bytes_of(&p), &ranges, grid);
                        drop(ranges);
                        let layers = part.to_vec::<f32>().unwrap();
                        let sum = |i: usize| -> f64 {
                            (0..splits).map(|z| f64::from(layers[z * m * n + i])).sum()
                        };
                        // float16 operands multiply exactly in float32; only the sums round.
                        let off = (0..m * n).find(|&i| {
                            (sum(i) - product[i]).abs() > 1e-5 * product[i].abs().max(1.0)
                        });
                        if let Some(i) = off {
                            failures.push(format!(
                                "{} {m}x{k}x{n} ta={trans_a} tb={trans_b} in {splits} slices: \
                                 sum[{}, {}] = {}, oracle {:.5}",
                                c.name,
                                i / n,
                                i % n,
                                sum(i),
                                product[i]
                            ));
                        }
                    }
                    if c.split {
                        continue;
                    }
                    let out = Tensor::from_slice_on(&vec![f16::NAN; m * n], &[m, n], dev).unwrap();
                    let (p, grid) = launch_shape(d, has_bias, act, (c.rows, c.cols));
                    let tensors = if c.v4 {
                        [&ct, &out, &at, &bt]
                    } else {
                        [&at, &bt, &ct, &out]
                    };
                    let ranges: Vec<_> = tensors.iter().map(|t| t.gpu_range().unwrap()).collect();
                    ctx.dispatch(&pipeline, bytemuck::bytes_of(&p), &ranges, grid);
                    drop(ranges);
                    let got = out.to_vec::<f16>().unwrap();
                    let want = reference::bias_act(&product, has_bias.then_some(&cv[..]), act);
                    if let Some((i, g, w)) = first_off(&got, &want) {
                        failures.push(format!(
                            "{} {m}x{k}x{n} ta={trans_a} tb={trans_b} bias={has_bias} {act:?}: \
                             out[{}, {}] = {g}, oracle {w:.5}",
                            c.name,
                            i / n,
                            i % n
                        ));
                    }
                }
            }
            failures.extend(emulated_convolutions(dev, &c, &pipeline));
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    /// The convolutions candidate `c` takes, run on its emulated `pipeline` through this
    /// module's params and grid ([`CoopParams::gathering`]) against the f64 oracle: the
    /// self-check's and larger ones (several tiles each way, several steps of k), the forward
    /// pass with a bias and an activation on the product kernels, the kernel gradient in
    /// ragged slices on the split one. The failures, each naming the convolution.
    fn emulated_convolutions(
        dev: &LogicalDevice,
        c: &Candidate,
        pipeline: &crate::shader::Pipeline,
    ) -> Vec<String> {
        let ctx = &dev.gpu().expect("a GPU").ctx;
        let values = halves;
        let upload = |h: &[f16]| Tensor::from_slice_on(h, &[h.len()], dev).unwrap();
        let run = |p: CoopParams, tensors: &[&Tensor], grid: [u32; 3]| {
            let ranges: Vec<_> = tensors.iter().map(|t| t.gpu_range().unwrap()).collect();
            ctx.dispatch(pipeline, bytemuck::bytes_of(&p), &ranges, grid);
        };
        let mut shapes = CONV_CHECKS.to_vec();
        shapes.extend([
            conv_check(2, 14, 14, 16, 72, (3, 3), Padding::Same, [1, 1], [1, 1]),
            conv_check(2, 9, 9, 32, 40, (3, 3), Padding::Same, [1, 1], [1, 1]),
            conv_check(2, 12, 10, 8, 32, (3, 3), Padding::Valid, [1, 1], [2, 2]),
            conv_check(1, 9, 9, 32, 16, (1, 1), Padding::Valid, [2, 2], [1, 1]),
        ]);
        let mut failures = Vec::new();
        for (q, s) in shapes.iter().enumerate() {
            let g = ConvGeometry::conv(s);
            if !conv_fits(&g) {
                continue;
            }
            let what = format!("{} {s:?}", c.name);
            let seed = 6_000 + 100 * q as u64;
            let (xv, xh) = values(s.input_len(), seed);
            let x = upload(&xh);
            if c.split {
                let (dzv, dzh) = values(s.output_len(), seed + 1);
                let dz = upload(&dzh);
                let d = conv_dims(&g, ConvMode::KernelGrad);
                let want = reference::conv2d_backward_kernel(&xv, &dzv, s);
                let (natural, _) = split_slices(d);
                for k_slice in [natural, 64, 96] {
                    let splits = d.k.div_ceil(k_slice);
                    let len = splits * d.m * d.n;
                    let part = Tensor::from_slice_on(&vec![f32::NAN; len], &[len], dev).unwrap();
                    let (mut p, _) = launch_shape(d, false, Activation::Linear, (64, 64));
                    p = p.gathering(ConvMode::KernelGrad, &Gather::conv(g));
                    p.k_slice = k_slice as u32;
                    let grid = [
                        d.n.div_ceil(64) as u32,
                        d.m.div_ceil(64) as u32,
                        splits as u32,
                    ];
                    run(p, &[&x, &dz, &part], grid);
                    let sum = layer_sums(&part.to_vec::<f32>().unwrap(), splits);
                    if let Some((i, got, w)) = first_off(&sum, &want) {
                        failures.push(format!(
                            "{what} kernel gradient in {splits} slices: dk[{i}] = {got}, \
                             oracle {w:.5}"
                        ));
                    }
                }
                continue;
            }
            if !conv_applies(c, &g) {
                continue;
            }
            let (kv, kh) = values(s.kernel_len(), seed + 1);
            let (bv, bh) = values(s.c_out, seed + 2);
            let (kernel, bias) = (upload(&kh), upload(&bh));
            let y = upload(&vec![f16::NAN; s.output_len()]);
            let act = [Activation::Relu, Activation::Linear, Activation::Selu][q % 3];
            let has_bias = q % 2 == 0;
            let d = conv_dims(&g, ConvMode::Forward);
            let (p, grid) = launch_shape(d, has_bias, act, (c.rows, c.cols));
            let p = p.gathering(ConvMode::Forward, &Gather::conv(g));
            if c.v4 {
                run(p, &[&bias, &y, &x, &kernel], grid);
            } else {
                run(p, &[&x, &kernel, &bias, &y], grid);
            }
            let got = y.to_vec::<f16>().unwrap();
            let bias = has_bias.then_some(&bv[..]);
            let want = reference::conv2d_forward(&xv, &kv, bias, s, act);
            if let Some((i, got, w)) = first_off(&got, &want) {
                failures.push(format!(
                    "{what} bias={has_bias} {act:?}: y[{i}] = {got}, oracle {w:.5}"
                ));
            }
        }
        // The input gradients: dz upsampled by the strides, correlated with the flipped kernel.
        for (q, s) in shapes.iter().enumerate() {
            let gather = Gather::input_grad(&ConvGeometry::conv(s));
            if c.split || !conv_fits(&gather.g) || !conv_applies(c, &gather.g) {
                continue;
            }
            let seed = 7_000 + 100 * q as u64;
            let (kv, kh) = values(s.kernel_len(), seed);
            let (dzv, dzh) = values(s.output_len(), seed + 1);
            let (kt, dz) = (upload(&flipped(&kh, s)), upload(&dzh));
            let dx = upload(&vec![f16::NAN; s.input_len()]);
            let d = conv_dims(&gather.g, ConvMode::Forward);
            let (p, grid) = launch_shape(d, false, Activation::Linear, (c.rows, c.cols));
            let p = p.gathering(ConvMode::Forward, &gather);
            if c.v4 {
                run(p, &[&dx, &dx, &dz, &kt], grid);
            } else {
                run(p, &[&dz, &kt, &dx, &dx], grid);
            }
            let got = dx.to_vec::<f16>().unwrap();
            let want = reference::conv2d_backward_input(&dzv, &kv, s);
            if let Some((i, got, w)) = first_off(&got, &want) {
                failures.push(format!(
                    "{} input gradient of {s:?}: dx[{i}] = {got}, oracle {w:.5}",
                    c.name
                ));
            }
        }
        failures
    }

    /// The self-check run for real where the kernels cannot run (lavapipe has no cooperative
    /// matrices, so each pipeline is refused): every candidate fails it, is named with why, and
    /// none is offered.
    #[test]
    fn a_candidate_that_fails_its_self_check_is_never_offered() {
        let Some((_rt, dev)) = float16_gpu() else {
            return;
        };
        let dev = &dev;
        let g = dev.gpu().expect("a GPU");
        assert!(
            !g.ctx.coop.usable(),
            "lavapipe has cooperative matrices now"
        );
        // As if the adapter had reported the configuration.
        let support = CoopSupport {
            configs: Vec::new(),
            missing: None,
            verdicts: OnceLock::new(),
            conv_verdicts: OnceLock::new(),
            emulated: Default::default(),
        };
        let kernels = GpuKernels::new(g, dev.full_name());
        for (trans_a, k) in [(false, 64), (true, 63)] {
            let d = MatmulDims {
                m: 64,
                k,
                n: 64,
                trans_a,
                trans_b: false,
            };
            assert_eq!(
                kernels.coop_offered(&support, d, dev).expect("offered"),
                Vec::<&str>::new()
            );
        }
        let verdicts = support.verdicts.get().expect("checked once");
        assert_eq!(verdicts.len(), CANDIDATES.len());
        for (c, (name, verdict)) in CANDIDATES.iter().zip(verdicts) {
            assert_eq!(c.name, *name);
            let why = verdict.as_ref().expect_err(name);
            assert!(why.contains(c.kernel.entry), "{name}: {why}");
        }
    }

    #[test]
    fn only_this_modules_names_are_candidates() {
        assert!(is_candidate("coop16_64x64") && is_candidate("coop16_32x64"));
        assert!(!is_candidate("tile64") && !is_candidate("coop"));
    }
}
