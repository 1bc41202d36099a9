//! The WGSL lecture engine (`engine::wgsl_lecture`), on the wgpu adapter (lavapipe in CI):
//! - every kernel of `shaders/matmul.wgsl` and `shaders/lecture_step.wgsl` against its
//!   plain-Rust reference (`wgsl_lecture::reference`) on ≥ 1000 random cases, sizes 1, odd
//!   and not multiples of the workgroup or the tile, many cases packed into one submission;
//!   sums within `SUM_TOL` of the sum of their terms' magnitudes (the summation orders
//!   differ), everything else within `TOL` relative, integers identical;
//! - the engine as a whole against the fused CPU lecture step: same rollouts, metrics within
//!   1e-3 and weights within 1e-3 (relative to 1 + |x|) after several iterations, for the
//!   loss modes, the KL estimators, clip-higher and grad-norm clipping.

mod common;

use common::{close, step_scalars, wgpu_compute};

use grpo_lab::config::{EngineChoice, FusedChoice, KlEstimator, LossMode, RunConfig};
use grpo_lab::engine::wgsl_lecture::reference::{self, Buffers};
use grpo_lab::engine::wgsl_lecture::{
    Epilogue, HarnessOp, KernelHarness, MatmulKernel, MatmulParams, StepParams,
};
use grpo_lab::engine::{
    Batch, DeviceCounts, Engine, EngineError, SampleRequest, Samples, Snapshot, StepOutput,
    StepRequest, Which,
};
use grpo_lab::gpu::Compute;
use grpo_lab::grpo::Trainer;
use grpo_lab::rng::SplitMix64;
use std::sync::OnceLock;

const TOL: f32 = 2e-5;
const SUM_TOL: f32 = 2e-5;

/// The kernels with `kernel` for the products (the step kernels are the same in both).
fn harness_with(kernel: MatmulKernel) -> Option<&'static KernelHarness> {
    static H: [OnceLock<Option<KernelHarness>>; 4] = [const { OnceLock::new() }; 4];
    H[kernel as usize]
        .get_or_init(|| {
            let compute = wgpu_compute()?;
            let ctx = compute.gpu.expect("wgpu context");
            if kernel == MatmulKernel::WindowSubgroup && !MatmulKernel::subgroups_allow(&ctx) {
                eprintln!("skipped: the adapter has no subgroups of 8 or more invocations");
                return None;
            }
            Some(KernelHarness::new(ctx, kernel).expect("kernels compile"))
        })
        .as_ref()
}

fn harness() -> Option<&'static KernelHarness> {
    harness_with(MatmulKernel::Rows)
}

fn pick(rng: &mut SplitMix64, choices: &[usize]) -> usize {
    choices[rng.below(choices.len() as u64) as usize]
}

fn normals(rng: &mut SplitMix64, len: usize, scale: f32) -> Vec<f32> {
    (0..len).map(|_| rng.normal() as f32 * scale).collect()
}

/// One case: its own buffers and the op on them (offsets local to the buffers).
struct Case {
    buf: Buffers,
    op: HarnessOp,
}

/// Move a case's offsets by the bases of its buffers in the packed ones.
fn relocate(op: HarnessOp, model: u32, work: u32, ints: u32) -> HarnessOp {
    match op {
        HarnessOp::Matmul(mut mm, src) => {
            mm.a[0] += [model, work, ints][src.0 as usize];
            mm.b[0] += if src.1 == 0 { model } else { work };
            mm.c[0] += work;
            HarnessOp::Matmul(mm, src)
        }
        HarnessOp::MatmulInWork(mut mm, sums) => {
            mm.a[0] += work;
            mm.b[0] += work;
            mm.c[0] += work;
            HarnessOp::MatmulInWork(mm, sums.map(|s| s + work))
        }
        HarnessOp::MatmulThen(mut mm, mut then) => {
            mm.a[0] += work;
            mm.b[0] += model;
            mm.c[0] += work;
            match &mut then {
                Epilogue::Gelu { bias, act, cdf, .. } => {
                    *bias += model;
                    *act += work;
                    *cdf += work;
                }
                Epilogue::Norm {
                    bias,
                    gain,
                    y,
                    xhat,
                    rstd,
                    ..
                } => {
                    if let Some(b) = bias {
                        *b += model;
                    }
                    *gain += model;
                    for o in [y, xhat, rstd] {
                        *o += work;
                    }
                }
                Epilogue::GeluBack { pre, cdf } => {
                    *pre += work;
                    *cdf += work;
                }
                Epilogue::LnBack {
                    gain,
                    xhat,
                    rstd,
                    dx,
                    ..
                } => {
                    *gain += model;
                    for o in [xhat, rstd, dx] {
                        *o += work;
                    }
                }
            }
            HarnessOp::MatmulThen(mm, then)
        }
        HarnessOp::Step(e, mut p, count) => {
            for f in [
                &mut p.t_off,
                &mut p.m_off,
                &mut p.enc_off,
                &mut p.logits_off,
                &mut p.logz_off,
                &mut p.ent_off,
                &mut p.adv_off,
                &mut p.out_off,
                &mut p.coef_off,
                &mut p.stats_off,
                &mut p.dl_off,
                &mut p.denc_off,
                &mut p.dt_off,
                &mut p.grad_off,
                &mut p.part_off,
                &mut p.sums_off,
                &mut p.src_off,
                &mut p.old_off,
                &mut p.rf_off,
            ] {
                *f += work;
            }
            for f in [&mut p.i_prompts, &mut p.i_tokens, &mut p.i_greedy] {
                *f += ints;
            }
            for f in [&mut p.w_off, &mut p.ref_off, &mut p.am_off, &mut p.av_off] {
                *f += model;
            }
            HarnessOp::Step(e, p, count)
        }
    }
}

fn apply_reference(buf: &mut Buffers, op: &HarnessOp) {
    match op {
        HarnessOp::Matmul(mm, src) => reference::matmul(buf, mm, *src),
        HarnessOp::MatmulThen(mm, then) => {
            reference::matmul(buf, mm, (1, 0));
            reference::epilogue(buf, mm, then);
        }
        HarnessOp::MatmulInWork(mm, sums) => {
            reference::matmul(buf, mm, (1, 1));
            // Each row's sum of A, in k order (col_sum4's sums over dY's rows).
            if let Some(dst) = sums {
                for i in 0..mm.m as usize {
                    let mut total = 0.0f32;
                    for k in 0..mm.k as usize {
                        total += buf.work
                            [mm.a[0] as usize + i * mm.a[1] as usize + k * mm.a[2] as usize];
                    }
                    buf.work[*dst as usize + i] = total;
                }
            }
        }
        HarnessOp::Step(e, p, _) => reference::step_kernel(e, p, buf),
    }
}

/// Pack `cases` into one set of buffers, run them in one submission and with the reference,
/// and compare. `sums`: compare floats against the magnitude bound (the reference run on
/// |inputs|) instead of relatively. Returns how many float outputs were compared.
fn check(what: &str, cases: Vec<Case>, sums: bool) -> usize {
    let Some(h) = harness() else { return 0 };
    check_on(h, what, cases, sums)
}

/// `cases` packed into one set of buffers, each case's op relocated to its place.
fn pack(cases: Vec<Case>) -> (Buffers, Vec<HarnessOp>) {
    let mut packed = Buffers::default();
    let mut ops = Vec::new();
    for c in cases {
        // Each case from a multiple of 4 elements, so an aligned case stays aligned (the
        // vector paths of matmul_rows).
        packed
            .model
            .resize(packed.model.len().next_multiple_of(4), 0.0);
        packed
            .work
            .resize(packed.work.len().next_multiple_of(4), 0.0);
        let (m, w, i) = (
            packed.model.len() as u32,
            packed.work.len() as u32,
            packed.ints.len() as u32,
        );
        packed.model.extend(&c.buf.model);
        packed.work.extend(&c.buf.work);
        packed.ints.extend(&c.buf.ints);
        ops.push(relocate(c.op, m, w, i));
    }
    (packed, ops)
}

fn check_on(h: &KernelHarness, what: &str, cases: Vec<Case>, sums: bool) -> usize {
    let (packed, ops) = pack(cases);
    let gpu = h.run(&packed, &ops).expect("kernels run");
    let mut want = packed.clone();
    let mut bound = packed.clone();
    bound.model.iter_mut().for_each(|x| *x = x.abs());
    bound.work.iter_mut().for_each(|x| *x = x.abs());
    for op in &ops {
        apply_reference(&mut want, op);
        if sums {
            apply_reference(&mut bound, op);
        }
    }
    assert_eq!(gpu.ints, want.ints, "{what}: integer outputs differ");
    let mut compared = 0;
    for (name, g, r, s) in [
        ("model", &gpu.model, &want.model, &bound.model),
        ("work", &gpu.work, &want.work, &bound.work),
    ] {
        for (i, ((&g, &r), &s)) in g.iter().zip(r).zip(s).enumerate() {
            let ok = if sums {
                (g - r).abs() <= SUM_TOL * s.max(r.abs()) + 1e-6
            } else {
                (g - r).abs() <= TOL * r.abs().max(1.0) || (g.is_nan() && r.is_nan()) || g == r
            };
            assert!(
                ok,
                "{what}: {name}[{i}]: kernel {g} vs reference {r} (bound {s})"
            );
            compared += 1;
        }
    }
    compared
}

/// A strided view of a `rows × cols` matrix (`z` of them): row-major or transposed.
fn view(rng: &mut SplitMix64, rows: usize, cols: usize) -> ([u32; 4], usize) {
    let (rs, cs) = if rng.below(2) == 0 {
        (cols, 1)
    } else {
        (1, rows)
    };
    ([0, rs as u32, cs as u32, (rows * cols) as u32], rows * cols)
}

#[test]
fn matmul_matches_reference() {
    // Window: the products of `work` by `model` (batch 1, no reduce) through matmul_window,
    // the rest through matmul_rows.
    for kernel in [
        MatmulKernel::Tiled,
        MatmulKernel::Rows,
        MatmulKernel::Window,
        MatmulKernel::WindowSubgroup,
    ] {
        if let Some(h) = harness_with(kernel) {
            matmul_cases(h, kernel);
        }
    }
}

/// matmul_window on weights larger than its 64 KiB window: B cut into ranges of k (B row-major,
/// partial products accumulated) or of columns (B transposed), odd and aligned shapes, with and
/// without accumulation, A along k (vector path) or across.
#[test]
fn matmul_window_cuts_large_weights() {
    for kernel in [MatmulKernel::Window, MatmulKernel::WindowSubgroup] {
        if let Some(h) = harness_with(kernel) {
            let total = check_on(h, "matmul_window cut", window_cut_cases(), true);
            eprintln!("{kernel:?} cut: {total} values compared");
        }
    }
}

/// matmul_window_subgroup gives matmul_window's results bit for bit (the same products in
/// the same order; only who loads B differs), on the cut cases and the random products.
#[test]
fn matmul_window_subgroup_is_bit_identical() {
    let (Some(plain), Some(sg)) = (
        harness_with(MatmulKernel::Window),
        harness_with(MatmulKernel::WindowSubgroup),
    ) else {
        return;
    };
    let (packed, ops) = pack(window_cut_cases());
    let a = plain.run(&packed, &ops).expect("kernels run");
    let b = sg.run(&packed, &ops).expect("kernels run");
    assert_eq!(a.work.len(), b.work.len());
    for (i, (x, y)) in a.work.iter().zip(&b.work).enumerate() {
        assert_eq!(x.to_bits(), y.to_bits(), "work[{i}]: {x} vs {y}");
    }
}

/// matmul_subgroup.wgsl's epilogues — GELU after the product (the transformer's W₁), a
/// LayerNorm of each row after it (W_o, W₂ and the b₂ before the next LayerNorm), and their
/// backwards (dh = dx·W₂ᵀ times GELU's derivative; the LayerNorm's dx after the dX of the head,
/// W₁ and W_qkv) — against the product's reference followed by the fused transformer engine's
/// GELU, LayerNorm and their backwards: one and
/// two rows of C an invocation (m of 1, odd, 64 and past it), B within a window or cut into
/// ranges of k (the epilogue on the last), C accumulated or not, with and without what the
/// backward keeps and the LayerNorm's bias.
#[test]
fn matmul_epilogues_match_the_reference() {
    let Some(h) = harness_with(MatmulKernel::WindowSubgroup) else {
        return;
    };
    let mut rng = SplitMix64::new(17);
    let mut cases = Vec::new();
    for m in [1usize, 5, 64, 65, 130] {
        for k in [4usize, 64, 260] {
            // GELU, LayerNorm, GELU's backward, LayerNorm's backward.
            for kind in 0..4 {
                let norm = kind % 2 == 1;
                let n = if norm { 64 } else { pick(&mut rng, &[64, 128]) };
                let (keep, accumulate) = (rng.below(2) == 0, rng.below(2) == 0);
                let mut buf = Buffers::default();
                // B after a few values (its window unaligned), then the bias, the gain and β.
                let pad = pick(&mut rng, &[0, 1, 7, 64]);
                buf.model = normals(&mut rng, pad + k * n, 0.3);
                buf.model.resize(buf.model.len().next_multiple_of(4), 0.0);
                let v = buf.model.len() as u32;
                buf.model.extend(normals(&mut rng, 3 * n, 1.0));
                // A, C (its old values), then the epilogue's outputs.
                buf.work = normals(&mut rng, m * k + m * n, 1.0);
                let out = buf.work.len() as u32;
                buf.work.extend(normals(&mut rng, 2 * m * n + m, 1.0));
                let (m32, n32) = (m as u32, n as u32);
                let mm = MatmulParams {
                    m: m32,
                    n: n32,
                    k: k as u32,
                    batch: 1,
                    a: [0, k as u32, 1, 0],
                    b: [pad as u32, n32, 1, 0],
                    c: [m32 * k as u32, n32, 0],
                    accumulate,
                    reduce: false,
                    c_cs: 0,
                };
                let then = if kind == 2 {
                    Epilogue::GeluBack {
                        pre: out,
                        cdf: out + m32 * n32,
                    }
                } else if kind == 3 {
                    Epilogue::LnBack {
                        gain: v,
                        xhat: out,
                        dx: out + m32 * n32,
                        rstd: out + 2 * m32 * n32,
                        add: keep,
                    }
                } else if norm {
                    Epilogue::Norm {
                        bias: (rng.below(2) == 0).then_some(v + 2 * n32),
                        gain: v,
                        y: out,
                        xhat: out + m32 * n32,
                        rstd: out + 2 * m32 * n32,
                        keep,
                    }
                } else {
                    Epilogue::Gelu {
                        bias: v,
                        act: out,
                        cdf: out + m32 * n32,
                        keep,
                    }
                };
                cases.push(Case {
                    buf,
                    op: HarnessOp::MatmulThen(mm, then),
                });
            }
        }
    }
    let (packed, ops) = pack(cases);
    let gpu = h.run(&packed, &ops).expect("kernels run");
    let mut want = packed.clone();
    for op in &ops {
        apply_reference(&mut want, op);
        // GELU's output alone leaves C unspecified (the partial sums of a cut product, or
        // its old values): not compared.
        if let HarnessOp::MatmulThen(mm, Epilogue::Gelu { keep: false, .. }) = op {
            for i in 0..mm.m as usize {
                let row = (mm.c[0] + i as u32 * mm.c[1]) as usize;
                let n = mm.n as usize;
                want.work[row..row + n].copy_from_slice(&gpu.work[row..row + n]);
            }
        }
    }
    assert_eq!(gpu.model, want.model, "the model is only read");
    for (i, (&g, &r)) in gpu.work.iter().zip(&want.work).enumerate() {
        assert!(
            (g - r).abs() <= TOL * r.abs().max(1.0),
            "matmul epilogues: work[{i}]: kernel {g} vs reference {r}"
        );
    }
    eprintln!("epilogues: 60 cases, {} values compared", gpu.work.len());
}

/// The weight gradients' products with B read in place (matmul_subgroup.wgsl's `B_WORK`): ∂W =
/// Xᵀ·dY and ∂Wᵀ = dYᵀ·X at the transformer's shapes and odd ones — N (k here) of 4 to past
/// several windows, C of one row to two workgroups of two rows, row-major or transposed,
/// accumulated or not, B row-major (`VEC_B` 1) or along k (`VEC_B` 2), A along k or across,
/// with each row's sum of A (a bias's gradient) or without — against the reference.
#[test]
fn matmul_with_b_in_work_matches_the_reference() {
    let Some(h) = harness_with(MatmulKernel::WindowSubgroup) else {
        return;
    };
    let mut rng = SplitMix64::new(23);
    let mut cases = Vec::new();
    for (m, n) in [
        (64, 64),
        (256, 64),
        (192, 64),
        (11, 64),
        (1, 64),
        (65, 128),
        (64, 12),
    ] {
        for k in [4usize, 17, 260, 1290] {
            let along_k = rng.below(2) == 0;
            let b_along_k = rng.below(2) == 0 && k.is_multiple_of(4);
            let (a_rs, a_cs) = if along_k { (k, 1) } else { (1, m) };
            let (b_rs, b_cs) = if b_along_k { (1, k) } else { (n, 1) };
            let row_major = rng.below(2) == 0;
            let (c_rs, c_cs) = if row_major { (n, 0) } else { (1, m) };
            let mut buf = Buffers {
                work: normals(&mut rng, m * k + m * n, 1.0),
                ..Default::default()
            };
            let b_off = buf.work.len().next_multiple_of(4);
            buf.work.resize(b_off, 0.0);
            buf.work.extend(normals(&mut rng, k * n, 1.0));
            let accumulate = rng.below(2) == 0;
            let mm = single(
                (m, n, k),
                (a_rs, a_cs),
                (b_off, b_rs, b_cs),
                (c_rs, c_cs),
                accumulate,
            );
            // Row sums after B, at an offset that is not a multiple of 4 half the time.
            let sums = (rng.below(2) == 0).then(|| {
                let at = buf.work.len() + rng.below(2) as usize;
                buf.work.resize(at + m, 7.0);
                at as u32
            });
            cases.push(Case {
                buf,
                op: HarnessOp::MatmulInWork(mm, sums),
            });
        }
    }
    let total = check_on(h, "B in work", cases, true);
    eprintln!("B in work: 28 products, {total} values compared");
}

/// One `m × n × k` product with A from 0, B from `b_off` and C after A (strides given; C's
/// column stride 0 row-major).
fn single(
    (m, n, k): (usize, usize, usize),
    (a_rs, a_cs): (usize, usize),
    (b_off, b_rs, b_cs): (usize, usize, usize),
    (c_rs, c_cs): (usize, usize),
    accumulate: bool,
) -> MatmulParams {
    MatmulParams {
        c_cs: c_cs as u32,
        ..MatmulParams::single(
            (m, n, k),
            (0, a_rs, a_cs),
            (b_off, b_rs, b_cs),
            (m * k, c_rs),
            accumulate,
        )
    }
}

/// Products whose weights exceed one window, odd and aligned shapes; 70 × 128 × 140 with C
/// row-major: whole blocks of 64 columns (matmul_window_subgroup's `WHOLE` pipelines), with
/// rows past m in the last workgroup.
fn window_cut_cases() -> Vec<Case> {
    let mut rng = SplitMix64::new(5);
    let mut cases = Vec::new();
    let shapes = [
        (70, 300, 90),
        (33, 201, 131),
        (5, 64, 512),
        (64, 1100, 16),
        (70, 128, 140),
    ];
    for &(m, n, k) in &shapes {
        for b_transposed in [false, true] {
            for accumulate in [false, true] {
                let a_along_k = rng.below(2) == 0;
                let (a_rs, a_cs) = if a_along_k { (k, 1) } else { (1, m) };
                let (b_rs, b_cs) = if b_transposed { (1, k) } else { (n, 1) };
                let mut buf = Buffers::default();
                // B after a few values, so its window starts unaligned.
                let pad = pick(&mut rng, &[0, 1, 7, 64]);
                buf.model = normals(&mut rng, pad + k * n, 1.0);
                buf.work = normals(&mut rng, m * k + m * n, 1.0);
                // Half the cases store C transposed (a weight's gradient as ∂Wᵀ = dYᵀ·X).
                let row_major = rng.below(2) == 0 || n == 128;
                let (c_rs, c_cs) = if row_major { (n, 0) } else { (1, m) };
                let mm = single(
                    (m, n, k),
                    (a_rs, a_cs),
                    (pad, b_rs, b_cs),
                    (c_rs, c_cs),
                    accumulate,
                );
                cases.push(Case {
                    buf,
                    op: HarnessOp::Matmul(mm, (1, 0)),
                });
            }
        }
    }
    cases
}

/// 1000 random products on `h`'s matmul kernel against the reference.
fn matmul_cases(h: &KernelHarness, kernel: MatmulKernel) {
    let mut rng = SplitMix64::new(11);
    let dims = [1, 2, 3, 5, 7, 16, 17, 31, 32, 33, 47, 64, 65];
    let mut total = 0;
    for batch_of_cases in 0..10 {
        let mut cases = Vec::new();
        for _ in 0..100 {
            // A third of the cases aligned: sizes and offsets multiples of 4 (the vector paths).
            let aligned = rng.below(3) == 0;
            let dims: &[usize] = if aligned { &[4, 8, 16, 32, 64] } else { &dims };
            let (m, n, k) = (
                pick(&mut rng, dims),
                pick(&mut rng, dims),
                pick(&mut rng, dims),
            );
            let batch = pick(&mut rng, &[1, 1, 2, 3, 8]);
            let reduce = rng.below(3) == 0;
            let accumulate = rng.below(3) == 0;
            let src = (rng.below(2) as u32, rng.below(2) as u32);
            let (a, alen) = view(&mut rng, m, k);
            let (b, blen) = view(&mut rng, k, n);
            let pad = pick(&mut rng, &[0, 0, 3]);
            let outputs = if reduce { 1 } else { batch };
            // A quarter of the single products store C transposed (columns `m + pad` apart).
            let by_columns = outputs == 1 && batch == 1 && rng.below(4) == 0;
            let (c_rs, c_cs, clen) = if by_columns {
                (1, m + pad, n * (m + pad))
            } else {
                (n + pad, 0, outputs * m * (n + pad))
            };
            let mut buf = Buffers::default();
            let mut place = |src: u32, len: usize, rng: &mut SplitMix64| -> u32 {
                let v = normals(rng, len, 1.0);
                if aligned {
                    buf.model.resize(buf.model.len().next_multiple_of(4), 0.0);
                    buf.work.resize(buf.work.len().next_multiple_of(4), 0.0);
                }
                if src == 0 {
                    let at = buf.model.len();
                    buf.model.extend(v);
                    at as u32
                } else {
                    let at = buf.work.len();
                    buf.work.extend(v);
                    at as u32
                }
            };
            let a_off = place(src.0, alen * batch, &mut rng);
            // A third of the cases take A as a one-hot of token ids (A_SRC = 2).
            let onehot = rng.below(3) == 0;
            let (src, a, a_off) = if onehot {
                let at = buf.ints.len() as u32;
                buf.ints
                    .extend((0..batch * k).map(|_| rng.below(m as u64 + 1) as u32));
                ((2, src.1), [0, 0, 1, k as u32], at)
            } else {
                (src, a, a_off)
            };
            let b_off = place(src.1, blen * batch, &mut rng);
            let c_off = buf.work.len() as u32;
            buf.work.extend(normals(&mut rng, clen, 1.0));
            let mm = MatmulParams {
                m: m as u32,
                n: n as u32,
                k: k as u32,
                batch: batch as u32,
                a: [a_off, a[1], a[2], a[3]],
                b: [b_off, b[1], b[2], b[3]],
                c: [c_off, c_rs as u32, (m * c_rs) as u32],
                accumulate,
                reduce,
                c_cs: c_cs as u32,
            };
            cases.push(Case {
                buf,
                op: HarnessOp::Matmul(mm, src),
            });
        }
        total += check_on(
            h,
            &format!("{kernel:?} matmul batch {batch_of_cases}"),
            cases,
            true,
        );
    }
    eprintln!("{kernel:?} matmul: 1000 cases, {total} values compared");
}

/// Random shapes and buffers for the step kernels: every region the kernels may touch, in
/// a fresh `work` (random), `ints` (valid tokens) and `model`.
fn step_case(rng: &mut SplitMix64) -> (StepParams, Buffers) {
    let b = pick(rng, &[1, 2, 3, 5, 9]);
    let g = pick(rng, &[1, 2, 3, 7]);
    let n = pick(rng, &[1, 2, 3, 5]);
    let v = pick(rng, &[1, 2, 3, 5, 16, 17]);
    // Half the cases aligned: D, the parameter count and every offset multiples of 4 (as the
    // engine lays its buffers out).
    let aligned = rng.below(2) == 0;
    let d = if aligned {
        pick(rng, &[4, 8, 12])
    } else {
        pick(rng, &[1, 3, 8, 10, 13])
    };
    let (rows, tokens) = (b * n, b * g * n);
    let p_count = if aligned {
        pick(rng, &[4, 64, 200])
    } else {
        pick(rng, &[1, 7, 65, 200])
    };
    let mut work = Vec::new();
    let mut take = |len: usize, scale: f32, rng: &mut SplitMix64| -> u32 {
        if aligned {
            work.resize(work.len().next_multiple_of(4), 0.0);
        }
        let at = work.len() as u32;
        work.extend(normals(rng, len, scale));
        at
    };
    let mut p = StepParams {
        b: b as u32,
        g: g as u32,
        n: n as u32,
        v: v as u32,
        d: d as u32,
        tokens: tokens as u32,
        rows: rows as u32,
        p_count: p_count as u32,
        inv_t: [1.0, 0.7, 1.3][rng.below(3) as usize],
        ..Default::default()
    };
    p.t_off = take(v * n * d, 1.0, rng);
    p.m_off = take(d * n * v, 1.0, rng);
    p.enc_off = take(b * d, 1.0, rng);
    p.logits_off = take(rows * v, 2.0, rng);
    p.logz_off = take(rows, 1.0, rng);
    p.ent_off = take(rows, 1.0, rng);
    p.adv_off = take(b * g, 1.0, rng);
    p.out_off = take(tokens, 1.0, rng);
    p.coef_off = take(tokens, 1.0, rng);
    p.stats_off = take(6 * tokens, 1.0, rng);
    p.dl_off = take(rows * v, 1.0, rng);
    p.denc_off = take(b * d, 1.0, rng);
    p.dt_off = take(v * n * d, 1.0, rng);
    p.grad_off = take(p_count, 1.0, rng);
    p.old_off = take(tokens, 1.0, rng);
    p.rf_off = take(tokens, 1.0, rng);
    p.sums_off = take(8, 1.0, rng);
    p.part_off = take(6 * 64, 1.0, rng);
    let mut ints = Vec::new();
    p.i_prompts = 0;
    ints.extend((0..rows).map(|_| rng.below(v as u64) as u32));
    p.i_tokens = ints.len() as u32;
    ints.extend((0..tokens).map(|_| rng.below(v as u64) as u32));
    p.i_greedy = ints.len() as u32;
    ints.extend((0..rows).map(|_| rng.below(1000) as u32));
    let model = normals(rng, 4 * p_count, 0.5);
    p.w_off = 0;
    p.ref_off = p_count as u32;
    p.am_off = 2 * p_count as u32;
    p.av_off = 3 * p_count as u32;
    (p, Buffers { model, work, ints })
}

fn step_kernel_cases(
    seed: u64,
    entry: &'static str,
    sums: bool,
    tune: impl Fn(&mut SplitMix64, &mut StepParams, &mut Buffers) -> usize,
) {
    let mut rng = SplitMix64::new(seed);
    let mut total = 0;
    for round in 0..4 {
        let mut cases = Vec::new();
        for _ in 0..250 {
            let (mut p, mut buf) = step_case(&mut rng);
            let count = tune(&mut rng, &mut p, &mut buf);
            cases.push(Case {
                buf,
                op: HarnessOp::Step(entry, p, count),
            });
        }
        total += check(&format!("{entry} round {round}"), cases, sums);
    }
    eprintln!("{entry}: 1000 cases, {total} values compared");
}

#[test]
fn gather_enc_matches_reference() {
    step_kernel_cases(21, "gather_enc", true, |_, p, _| {
        (p.b * p.d.div_ceil(4)) as usize
    });
}

#[test]
fn scatter_dt_matches_reference() {
    step_kernel_cases(27, "scatter_dt", true, |_, p, _| (p.n * p.d) as usize);
}

#[test]
fn row_stats_matches_reference() {
    step_kernel_cases(22, "row_stats", false, |rng, p, buf| {
        // Ties, huge and tiny logits besides normal ones.
        let rows = (p.rows * p.v) as usize;
        let at = p.logits_off as usize;
        match rng.below(4) {
            0 => buf.work[at..at + rows]
                .iter_mut()
                .for_each(|x| *x = (*x * 0.5).round()),
            1 => buf.work[at..at + rows].iter_mut().for_each(|x| *x *= 30.0),
            2 => buf.work[at..at + rows].iter_mut().for_each(|x| *x *= 1e-20),
            _ => {}
        }
        p.rows as usize
    });
}

#[test]
fn gather_logp_matches_reference() {
    step_kernel_cases(23, "gather_logp", false, |_, p, _| p.tokens as usize);
}

#[test]
fn row_step_matches_reference() {
    step_kernel_cases(31, "row_step", false, |rng, p, _| {
        // naive, unclipped, clipped, cispo, sapo; the clipped one with and without the dual
        // clip and δ.
        p.mode = rng.below(5) as u32;
        (p.dual_clip, p.delta) =
            [(0.0, 0.0), (3.0, 0.0), (0.0, 1.5), (2.0, 1.3)][rng.below(4) as usize];
        p.cispo_cap = [5.0, 1.1][rng.below(2) as usize];
        (p.tau_pos, p.tau_neg) = (1.0, 1.05);
        p.estimator = rng.below(3) as u32;
        p.kl_on = rng.below(2) as u32;
        p.beta = [0.0, 0.04, 0.5][rng.below(3) as usize];
        let (lo, hi) = [(0.2, 0.2), (0.2, 0.28), (0.01, 0.01)][rng.below(3) as usize];
        p.lo = 1.0 - lo;
        p.hi = 1.0 + hi;
        p.cw = p.inv_t / p.tokens as f32;
        p.rows as usize
    });
}

#[test]
fn argmax_matches_reference() {
    step_kernel_cases(27, "argmax", false, |rng, p, buf| {
        if rng.below(2) == 0 {
            // Many exact ties: the first maximum wins.
            let at = p.logits_off as usize;
            let len = (p.rows * p.v) as usize;
            buf.work[at..at + len]
                .iter_mut()
                .for_each(|x| *x = (*x * 0.7).round());
        }
        p.rows as usize
    });
}

#[test]
fn reductions_match_reference() {
    step_kernel_cases(28, "reduce", true, |rng, p, buf| {
        // Channels of `count` values (up to 3 chunks of 4096) at the end of `work`.
        let count = pick(rng, &[1, 3, 255, 257, 4095, 4097, 9000]);
        let channels = pick(rng, &[1, 2, 6]);
        p.src_off = buf.work.len() as u32;
        buf.work.extend(normals(rng, count * channels, 1.0));
        p.count = count as u32;
        p.channels = channels as u32;
        p.nchunks = count.div_ceil(4096) as u32;
        p.chunk = 4096;
        p.square = rng.below(2) as u32;
        // Room for every channel's partials.
        p.part_off = buf.work.len() as u32;
        buf.work.extend(vec![0.0; channels * p.nchunks as usize]);
        0
    });
}

#[test]
fn adam_matches_reference() {
    step_kernel_cases(29, "adam", false, |rng, p, buf| {
        let t = 1 + rng.below(50) as i32;
        let (b1, b2) = (0.9f32, 0.999f32);
        p.b1 = b1;
        p.b2 = b2;
        p.eps = 1e-8;
        p.bc2 = (1.0 - b2.powi(t)).sqrt();
        p.factor = p.bc2 / (1.0 - b1.powi(t));
        p.lr = [1e-3, 1e-2][rng.below(2) as usize];
        p.max_norm = [0.0, 0.5, 100.0][rng.below(3) as usize];
        // Second moments are non-negative.
        let (at, len) = (p.av_off as usize, p.p_count as usize);
        buf.model[at..at + len]
            .iter_mut()
            .for_each(|x| *x = x.abs());
        let s = p.sums_off as usize + 6;
        buf.work[s] = buf.work[s].abs() * 10.0;
        p.p_count.div_ceil(4) as usize
    });
}

/// Gradients and moments at the edge of f32's normal range (a sharpened policy's): the kernel,
/// as `objective::adam`, keeps every subnormal out of the moments, and its moments and
/// weights are the reference's — bit for bit on a CPU adapter (lavapipe computes subnormals as
/// the host does), within TOL plus a few smallest normals on a GPU, which may flush a
/// subnormal intermediate (`m·β1`) before the sum.
#[test]
fn adam_keeps_subnormals_out_of_the_moments() {
    let Some(h) = harness() else { return };
    let mut rng = SplitMix64::new(41);
    let mut cases = Vec::new();
    for _ in 0..40 {
        let (mut p, mut buf) = step_case(&mut rng);
        (p.b1, p.b2, p.eps, p.lr, p.max_norm) = (0.9, 0.999, 1e-8, 1e-3, 0.0);
        (p.bc2, p.factor) = (0.5, 2.0);
        let tiny = [1e-18f32, 1e-20, 1e-30, 1e-37, 1e-40][rng.below(5) as usize];
        let (g, len) = (p.grad_off as usize, p.p_count as usize);
        buf.work[g..g + len].iter_mut().for_each(|x| *x *= tiny);
        // Moments just above f32's smallest normal (1.1755e-38), which one step's decay takes
        // below it unless the gradient adds enough.
        for (at, scale) in [
            (p.am_off as usize, 1.25e-38f32),
            (p.av_off as usize, 1.176e-38),
        ] {
            buf.model[at..at + len]
                .iter_mut()
                .for_each(|x| *x = scale * (1.0 + 0.01 * x.abs()).min(1.02));
        }
        buf.work[p.sums_off as usize + 6] = 1.0;
        cases.push(Case {
            buf,
            op: HarnessOp::Step("adam", p, p.p_count.div_ceil(4) as usize),
        });
    }
    let (packed, ops) = pack(cases);
    let gpu = h.run(&packed, &ops).expect("kernels run");
    let mut want = packed.clone();
    ops.iter().for_each(|op| apply_reference(&mut want, op));
    let (mut moments, mut zeroed) = (0, 0);
    for op in &ops {
        let HarnessOp::Step(_, p, _) = op else {
            unreachable!()
        };
        let len = p.p_count as usize;
        for at in [p.am_off, p.av_off, p.w_off].map(|o| o as usize) {
            for i in at..at + len {
                let (g, r) = (gpu.model[i], want.model[i]);
                let close = (g - r).abs() <= TOL * r.abs() + 4.0 * f32::MIN_POSITIVE;
                assert!(
                    g.to_bits() == r.to_bits() || (!h.on_cpu() && close),
                    "model[{i}]: kernel {g:e} vs reference {r:e}"
                );
                if at != p.w_off as usize {
                    assert!(!g.is_subnormal(), "model[{i}] = {g:e} is subnormal");
                    moments += 1;
                    zeroed += usize::from(g == 0.0);
                }
            }
        }
    }
    // Many decayed below the smallest normal (the case under test) and are zero.
    assert!(
        zeroed > moments / 10,
        "{zeroed} of {moments} moments zeroed"
    );
}

#[test]
fn copy_ref_matches_reference() {
    step_kernel_cases(30, "copy_ref", false, |_, p, _| p.p_count as usize);
}

// ------------------------------------------------------------------ the engine as a whole

/// Train `config` for `iterations` on the fused CPU step and on the WGSL engine: same
/// rollouts, metrics within 1e-3 and weights within `weight_tol`.
fn compare(config: RunConfig, iterations: usize, weight_tol: f32) {
    let Some(wgpu) = wgpu_compute() else { return };
    let mut runs = Vec::new();
    for on_gpu in [false, true] {
        let mut c = config.clone();
        c.run.iterations = iterations;
        c.run.fused_step = FusedChoice::Auto;
        c.run.engine = if on_gpu {
            EngineChoice::Wgsl
        } else {
            EngineChoice::Auto
        };
        let compute = if on_gpu { wgpu.clone() } else { Compute::cpu() };
        let mut t = Trainer::new(c, compute).unwrap();
        let label = t.engine_label();
        assert_eq!(label.contains("WGSL"), on_gpu, "{label}");
        let mut records = Vec::new();
        while !t.is_done() {
            records.push(t.step().unwrap());
        }
        runs.push((records, t.engine().flat_weights()));
    }
    let ((cpu, wc), (gpu, wg)) = (&runs[0], &runs[1]);
    assert_eq!(cpu.len(), gpu.len());
    for (a, b) in cpu.iter().zip(gpu) {
        assert_eq!(
            a.groups.as_ref().map(|g| &g[0].responses),
            b.groups.as_ref().map(|g| &g[0].responses),
            "step {}",
            a.step
        );
        assert_eq!(a.reward_mean, b.reward_mean, "step {}", a.step);
        for (name, x, y) in step_scalars(a, b) {
            assert!(
                close(x, y, 1e-3),
                "step {} {name}: fused CPU {x} vs WGSL {y}",
                a.step
            );
        }
    }
    assert_eq!(wc.len(), wg.len());
    let worst = wc
        .iter()
        .zip(wg)
        .map(|(a, b)| (a - b).abs() / (1.0 + a.abs()))
        .fold(0.0f32, f32::max);
    eprintln!("worst relative weight difference after {iterations} iterations: {worst:.2e}");
    assert!(
        worst < weight_tol,
        "weights differ by {worst} after {iterations} iterations"
    );
}

#[test]
fn wgsl_engine_equals_fused_cpu_on_lecture17() {
    compare(RunConfig::preset("lecture17").unwrap(), 4, 1e-3);
}

#[test]
fn wgsl_engine_equals_fused_cpu_with_each_loss_and_kl_estimator() {
    for (loss, est, beta, eps_high, max_norm) in [
        (LossMode::Unclipped, KlEstimator::K1, 0.05, 0.2, 0.0),
        (LossMode::Clipped, KlEstimator::K2, 0.1, 0.28, 0.5),
        (LossMode::Clipped, KlEstimator::K3, 0.04, 0.2, 0.05),
        (LossMode::Naive, KlEstimator::K3, 0.2, 0.2, 1.0),
    ] {
        let mut c = RunConfig::preset("random-sort").unwrap();
        c.algorithm.loss = loss;
        c.algorithm.kl_estimator = est;
        c.algorithm.beta = beta;
        c.algorithm.epsilon_low = 0.2;
        c.algorithm.epsilon_high = eps_high;
        c.algorithm.ref_period = 2;
        c.algorithm.mu = 3;
        c.optimizer.max_grad_norm = max_norm;
        c.optimizer.lr = 1e-2;
        eprintln!("{loss:?} {est:?} β {beta} ε_high {eps_high} max_grad_norm {max_norm}");
        compare(c, 3, 2e-3);
    }
}

/// CISPO, SAPO, the dual clip and δ in `common.wgsl` train as the fused CPU step does; the
/// sequence-level objectives are refused by name (`run.engine = wgsl`).
#[test]
fn wgsl_engine_equals_fused_cpu_with_the_token_level_2025_objectives() {
    for sets in [
        &["algorithm.loss=cispo", "algorithm.cispo_max_ratio=1.2"][..],
        &["algorithm.loss=sapo"],
        &[
            "algorithm.loss=clipped",
            "algorithm.dual_clip=1.5",
            "algorithm.delta=1.3",
        ],
    ] {
        let mut c = RunConfig::preset("random-sort").unwrap();
        c.algorithm.mu = 3;
        c.optimizer.lr = 1e-2;
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        eprintln!("{sets:?}");
        compare(c.with_overrides(&sets).unwrap(), 3, 2e-3);
    }
    let Some(wgpu) = wgpu_compute() else { return };
    let mut c = RunConfig::preset("lecture17").unwrap();
    c.run.engine = EngineChoice::Wgsl;
    c.algorithm.importance_sampling_level = grpo_lab::config::ImportanceSamplingLevel::Sequence;
    c.algorithm.loss = LossMode::Clipped;
    let e = Trainer::new(c, wgpu).err().expect("refused").to_string();
    assert!(e.contains("sequence-level ratio"), "{e}");
}

/// The 2025–26 estimators (computed on the host, `objective::advantage`) drive the WGSL
/// engine's steps as they drive the fused CPU step's; REINFORCE++ with γ < 1 (an advantage
/// per token) is refused by name.
#[test]
fn wgsl_engine_equals_fused_cpu_with_the_2025_estimators() {
    for sets in [
        &["algorithm.advantage=gpg"][..],
        &["algorithm.advantage=reinforce_pp_baseline"],
        &["algorithm.advantage=remax"],
        &["algorithm.advantage=opo", "algorithm.negative_weight=0.1"],
        &["algorithm.advantage=passk"],
        &[
            "task.reward_weights.exact=1",
            "task.reward_weights.distance=0.5",
            "task.reward_aggregation=normalize_then_sum",
            "algorithm.advantage=reinforce_pp",
        ],
    ] {
        let mut c = RunConfig::preset("random-sort").unwrap();
        c.algorithm.mu = 2;
        c.algorithm.loss = LossMode::Clipped;
        c.optimizer.lr = 1e-2;
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        eprintln!("{sets:?}");
        compare(c.with_overrides(&sets).unwrap(), 2, 2e-3);
    }
    let Some(wgpu) = wgpu_compute() else { return };
    let mut c = RunConfig::preset("lecture17").unwrap();
    c.run.engine = EngineChoice::Wgsl;
    c.algorithm.advantage = grpo_lab::config::AdvantageMode::ReinforcePp;
    c.algorithm.gamma = 0.9;
    let e = Trainer::new(c, wgpu).err().expect("refused").to_string();
    assert!(e.contains("REINFORCE++"), "{e}");
}

/// TRL's mini-batches (`steps_per_generation`) and replay buffer on the WGSL engine: it takes
/// the mini-batches one step at a time (not its one-submission μ steps on the whole batch) and
/// the replayed groups as the host put them in, training as the fused CPU step does.
#[test]
fn wgsl_engine_equals_fused_cpu_with_mini_batches_and_replay() {
    for sets in [
        &[
            "algorithm.steps_per_generation=2",
            "algorithm.prompts_per_iteration=4",
        ][..],
        &["algorithm.replay_buffer=4"],
    ] {
        let mut c = RunConfig::preset("random-sort").unwrap();
        c.algorithm.mu = 2;
        c.algorithm.loss = LossMode::Clipped;
        // At 1e-2 the logged k3 KL to the reference reaches 1e12 within an iteration of four
        // steps (a token the policy dropped): exp of a large Δ, which amplifies rounding.
        c.optimizer.lr = 3e-3;
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        eprintln!("{sets:?}");
        compare(c.with_overrides(&sets).unwrap(), 3, 2e-3);
    }
}

#[test]
fn wgsl_engine_equals_fused_cpu_with_temperature_top_k_and_top_p() {
    let mut c = RunConfig::preset("random-sort").unwrap();
    c.sampling.temperature = 0.7;
    c.sampling.top_k = 3;
    c.sampling.top_p = 0.9;
    c.algorithm.loss = LossMode::Clipped;
    c.algorithm.mu = 2;
    compare(c, 3, 2e-3);
}

#[test]
fn wgsl_engine_is_deterministic_and_snapshots_round_trip() {
    let Some(wgpu) = wgpu_compute() else { return };
    let mut c = RunConfig::preset("lecture17").unwrap();
    c.run.engine = EngineChoice::Wgsl;
    c.run.iterations = 3;
    let run = |c: &RunConfig| {
        let mut t = Trainer::new(c.clone(), wgpu.clone()).unwrap();
        let mut losses = Vec::new();
        while !t.is_done() {
            losses.push(t.step().unwrap().loss);
        }
        (losses, t.engine().flat_weights(), t)
    };
    c.run.eval_every = 0;
    c.algorithm.ref_period = 2;
    let (l1, w1, t1) = run(&c);
    // An iteration is one submission (rollout, verifying, advantages, log π_old / log π_ref
    // and the μ steps), plus one when the reference is refreshed (iteration 2 here).
    let counts = t1.engine().device_counts().expect("the WGSL engine counts");
    assert_eq!(counts.submissions, 3 + 1, "{counts:?} over 3 iterations");
    assert_eq!(counts.dispatches_per_step, 17);
    // The rollout's dispatches: two forwards, sampling, the row statistics and log-probs,
    // the greedy answers, the verifier and the two advantage kernels.
    assert_eq!(counts.dispatches_per_rollout, 18);
    let (l2, w2, _) = run(&c);
    assert_eq!(l1, l2, "same seed, same backend: same curve");
    assert_eq!(w1, w2);
    // A snapshot restores into a fresh WGSL engine and into the fused CPU engine alike.
    let snap = t1.engine().snapshot().unwrap();
    let mut fresh = grpo_lab::engine::build(&c, &wgpu).unwrap();
    fresh.restore(&snap).unwrap();
    assert_eq!(fresh.flat_weights(), w1);
    let mut cpu_c = c.clone();
    cpu_c.run.engine = EngineChoice::Auto;
    let mut cpu = grpo_lab::engine::build(&cpu_c, &Compute::cpu()).unwrap();
    cpu.restore(&snap).unwrap();
    assert_eq!(cpu.flat_weights(), w1);
}

/// The WGSL engine with its whole-iteration path hidden: the trainer takes the split path
/// (rollout and verifying in one submission, the μ steps in another).
struct Split(Box<dyn Engine + Send>);

impl Engine for Split {
    fn label(&self) -> String {
        self.0.label()
    }
    fn sample(&mut self, req: &SampleRequest) -> Result<Samples, EngineError> {
        self.0.sample(req)
    }
    fn greedy(&mut self, p: &[&[u32]], max_len: usize) -> Result<Vec<Vec<u32>>, EngineError> {
        self.0.greedy(p, max_len)
    }
    fn token_logp(&mut self, w: Which, b: &Batch, t: f32) -> Result<Vec<f32>, EngineError> {
        self.0.token_logp(w, b, t)
    }
    fn step(&mut self, b: &Batch, req: &StepRequest) -> Result<StepOutput, EngineError> {
        self.0.step(b, req)
    }
    fn batches_steps(&self) -> bool {
        self.0.batches_steps()
    }
    fn steps(
        &mut self,
        b: &Batch,
        req: &StepRequest,
        count: usize,
    ) -> Result<Vec<StepOutput>, EngineError> {
        self.0.steps(b, req, count)
    }
    fn supervised(&mut self, batches: &[Batch], lr: f64) -> Result<f32, EngineError> {
        self.0.supervised(batches, lr)
    }
    fn refresh_reference(&mut self) {
        self.0.refresh_reference()
    }
    fn flat_weights(&self) -> Vec<f32> {
        self.0.flat_weights()
    }
    fn snapshot(&self) -> Result<Snapshot, EngineError> {
        self.0.snapshot()
    }
    fn restore(&mut self, s: &Snapshot) -> Result<(), EngineError> {
        self.0.restore(s)
    }
    fn supports(&self, c: &RunConfig) -> bool {
        self.0.supports(c)
    }
    fn device_counts(&self) -> Option<DeviceCounts> {
        self.0.device_counts()
    }
}

#[test]
fn whole_iteration_in_one_submission_equals_the_split_path() {
    let Some(wgpu) = wgpu_compute() else { return };
    let mut c = RunConfig::preset("lecture17").unwrap();
    c.run.engine = EngineChoice::Wgsl;
    c.run.iterations = 3;
    c.run.eval_every = 0;
    c.algorithm.loss = LossMode::Clipped;
    c.algorithm.beta = 0.05;
    let mut runs = Vec::new();
    for whole in [true, false] {
        let engine = grpo_lab::engine::build(&c, &wgpu).unwrap();
        let engine: Box<dyn Engine + Send> = if whole {
            engine
        } else {
            Box::new(Split(engine))
        };
        let mut t = Trainer::with_engine(c.clone(), engine).unwrap();
        let mut records = Vec::new();
        while !t.is_done() {
            records.push(t.step().unwrap());
        }
        let submissions = t.engine().device_counts().unwrap().submissions;
        runs.push((records, t.engine().flat_weights(), submissions));
    }
    let ((whole, w1, s1), (split, w2, s2)) = (&runs[0], &runs[1]);
    // Same kernels in the same order: bit for bit the same run.
    for (a, b) in whole.iter().zip(split) {
        // Responses, rewards, every advantage mode, log π_old and log π.
        assert_eq!(a.groups, b.groups, "step {}", a.step);
        assert_eq!(a.reward_mean, b.reward_mean, "step {}", a.step);
        for (name, x, y) in step_scalars(a, b) {
            assert!(
                x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()),
                "step {} {name}: whole {x} vs split {y}",
                a.step
            );
        }
    }
    assert_eq!(w1, w2);
    assert_eq!(
        (*s1, *s2),
        (3, 6),
        "submissions: one per iteration against two"
    );
}

#[test]
fn engine_choice_selects_and_refuses_clearly() {
    let lecture = RunConfig::preset("lecture17").unwrap();
    let mut wgsl = lecture.clone();
    wgsl.run.engine = EngineChoice::Wgsl;
    let e = grpo_lab::engine::build(&wgsl, &Compute::cpu())
        .err()
        .expect("wgsl on the CPU is refused")
        .to_string();
    assert!(
        e.contains("run.engine = wgsl") && e.contains("--device"),
        "{e}"
    );
    let mut bug = wgsl.clone();
    bug.algorithm.entropy_coef = 0.01;
    if let Some(w) = wgpu_compute() {
        let e = grpo_lab::engine::build(&bug, &w)
            .err()
            .expect("refused")
            .to_string();
        assert!(e.contains("entropy"), "{e}");
        let mut burn = lecture.clone();
        burn.run.engine = EngineChoice::Burn;
        assert_eq!(
            grpo_lab::engine::kind_for(&burn, &w),
            grpo_lab::engine::EngineKind::Burn
        );
        assert_eq!(
            grpo_lab::engine::kind_for(&lecture, &w),
            grpo_lab::engine::EngineKind::Wgsl
        );
    }
    let err = RunConfig::default()
        .with_overrides(&["run.engine=cuda".into()])
        .unwrap_err()
        .to_string();
    assert!(err.contains("wgsl") && err.contains("burn"), "{err}");
}

/// Bad input comes back as an error naming what is wrong, never a panic or a device error.
#[test]
fn bad_input_is_refused_with_clear_errors() {
    use grpo_lab::objective::loss::LossSettings;
    use grpo_lab::objective::sampling::SamplingParams;
    let Some(wgpu) = wgpu_compute() else { return };
    let mut c = RunConfig::preset("lecture17").unwrap();
    c.run.engine = EngineChoice::Wgsl;
    let mut e = grpo_lab::engine::build(&c, &wgpu).unwrap();
    let (n, v) = (c.task.n, c.task.vocab as u32);
    let params = SamplingParams {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
    };
    let sample = |e: &mut Box<dyn grpo_lab::engine::Engine + Send>, prompt: &[u32], t: f32| {
        e.sample(&SampleRequest {
            prompts: &[prompt],
            g: 2,
            max_len: n,
            params: SamplingParams {
                temperature: t,
                ..params
            },
            seed: 1,
            stream: 0,
            sampler: Default::default(),
            verify: None,
        })
        .map(|_| ())
        .map_err(|x| x.to_string())
    };
    let bad_token = sample(&mut e, &[0, v, 1], 1.0).unwrap_err();
    assert!(bad_token.contains("outside the vocabulary"), "{bad_token}");
    let short = sample(&mut e, &[0, 1], 1.0).unwrap_err();
    assert!(short.contains("2 tokens"), "{short}");
    let cold = sample(&mut e, &[0, 1, 2], 0.0).unwrap_err();
    assert!(cold.contains("temperature"), "{cold}");
    // A well-formed batch, then broken copies of it.
    let rows = vec![vec![0u32, 1, 2], vec![2, 1, 0]];
    let batch = Batch::padded(vec![1, 0, 2], n, &rows, 2, v);
    let logp = e.token_logp(Which::Policy, &batch, 1.0).unwrap();
    assert_eq!(logp.len(), 6);
    let mut outside = batch.clone();
    outside.responses[4] = 99;
    let err = e
        .token_logp(Which::Reference, &outside, 1.0)
        .unwrap_err()
        .to_string();
    assert!(err.contains("outside the vocabulary"), "{err}");
    let req = |adv: &'static [f32]| StepRequest {
        loss: LossSettings::of(&c),
        temperature: 1.0,
        lr: 1e-3,
        max_grad_norm: 0.0,
        advantages: adv,
        token_advantages: None,
        old_logp: Box::leak(logp.clone().into_boxed_slice()),
        ref_logp: Box::leak(logp.clone().into_boxed_slice()),
        sampler_logp: None,
        logp_rows: 0,
        entropy_rows: 0,
        entropy_dynamics: false,
    };
    let err = e.step(&batch, &req(&[1.0])).unwrap_err().to_string();
    assert!(err.contains("advantages"), "{err}");
    let ok = e.step(&batch, &req(&[1.0, -1.0])).unwrap();
    assert!(ok.scalars.loss.is_finite());
}
