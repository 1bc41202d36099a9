//! Plain-Rust references of every entry point of `matmul.wgsl` and `lecture_step.wgsl`, over
//! the same three buffers (`model`, `work`, `ints`) and the same parameters: each is the
//! kernel's loop written on the host (the pieces of `fused_lecture`'s step). The tests run a
//! kernel and its reference on the same random buffers and compare every element.

use super::{CHUNK, Epilogue, MatmulParams, StepParams};
use crate::config::{KlEstimator, LossMode};
use crate::engine::fused_transformer::{
    gelu_grad_from, layer_norm, layer_norm_backward, normal_cdf,
};
use crate::objective::loss::PgParams;
use crate::objective::loss::reference::{clip_flags, kl_term, pg_term};
use crate::objective::numeric::{row_entropy, row_softmax};

/// The buffers a kernel reads and writes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Buffers {
    pub model: Vec<f32>,
    pub work: Vec<f32>,
    pub ints: Vec<u32>,
}

/// `matmul` with `A` and `B` read from model (0) or work (1); `A` may be a one-hot of
/// token ids in `ints` (2).
pub fn matmul(buf: &mut Buffers, mm: &MatmulParams, src: (u32, u32)) {
    let read = |buf: &Buffers, s: u32, i: usize| {
        if s == 0 { buf.model[i] } else { buf.work[i] }
    };
    let (m, n, k, batch) = (
        mm.m as usize,
        mm.n as usize,
        mm.k as usize,
        mm.batch as usize,
    );
    let [ao, ars, acs, abs] = mm.a.map(|x| x as usize);
    let [bo, brs, bcs, bbs] = mm.b.map(|x| x as usize);
    let [co, crs, cbs] = mm.c.map(|x| x as usize);
    let outputs = if mm.reduce { 1 } else { batch };
    for z in 0..outputs {
        for i in 0..m {
            for j in 0..n {
                let mut acc = 0.0f32;
                let zs: Vec<usize> = if mm.reduce {
                    (0..batch).collect()
                } else {
                    vec![z]
                };
                for zz in zs {
                    for kk in 0..k {
                        let a = if src.0 == 2 {
                            // one-hot of token ids
                            (buf.ints[ao + zz * abs + kk * acs] as usize == i) as u32 as f32
                        } else {
                            read(buf, src.0, ao + zz * abs + i * ars + kk * acs)
                        };
                        let b = read(buf, src.1, bo + zz * bbs + kk * brs + j * bcs);
                        acc = a.mul_add(b, acc);
                    }
                }
                let at = if mm.c_cs > 1 {
                    co + i * crs + j * mm.c_cs as usize
                } else {
                    co + z * cbs + i * crs + j
                };
                buf.work[at] = if mm.accumulate {
                    buf.work[at] + acc
                } else {
                    acc
                };
            }
        }
    }
}

/// What `then` does to the product `mm` once C holds it (matmul_subgroup.wgsl's epilogues),
/// with the fused transformer engine's GELU and LayerNorm, row by row.
pub fn epilogue(buf: &mut Buffers, mm: &MatmulParams, then: &Epilogue) {
    let (m, n) = (mm.m as usize, mm.n as usize);
    let (c0, rs) = (mm.c[0] as usize, mm.c[1] as usize);
    for i in 0..m {
        let (row, o) = (c0 + i * rs, i * rs);
        match *then {
            Epilogue::Gelu {
                bias,
                act,
                cdf,
                keep,
            } => {
                for j in 0..n {
                    let h = buf.work[row + j] + buf.model[bias as usize + j];
                    let p = normal_cdf(h);
                    if keep {
                        buf.work[row + j] = h;
                        buf.work[cdf as usize + o + j] = p;
                    }
                    buf.work[act as usize + o + j] = h * p;
                }
            }
            Epilogue::Norm {
                bias,
                gain,
                y,
                xhat,
                rstd,
                keep,
            } => {
                if let Some(b) = bias {
                    for j in 0..n {
                        buf.work[row + j] += buf.model[b as usize + j];
                    }
                }
                let x = buf.work[row..row + n].to_vec();
                let g = gain as usize;
                let (gain, beta) = buf.model[g..g + 2 * n].split_at(n);
                let (mut h, mut r, mut out) = (vec![0.0; n], [0.0], vec![0.0; n]);
                layer_norm(&x, gain, beta, n, &mut h, &mut r, &mut out);
                let at = |base: u32| base as usize + o;
                buf.work[at(y)..at(y) + n].copy_from_slice(&out);
                if keep {
                    buf.work[at(xhat)..at(xhat) + n].copy_from_slice(&h);
                    buf.work[rstd as usize + i] = r[0];
                }
            }
            Epilogue::GeluBack { pre, cdf } => {
                for j in 0..n {
                    let at = o + j;
                    let g =
                        gelu_grad_from(buf.work[pre as usize + at], buf.work[cdf as usize + at]);
                    buf.work[row + j] *= g;
                }
            }
            Epilogue::LnBack {
                gain,
                xhat,
                rstd,
                dx,
                add,
            } => {
                let dy = buf.work[row..row + n].to_vec();
                let h = buf.work[xhat as usize + o..][..n].to_vec();
                let r = [buf.work[rstd as usize + i]];
                let g = buf.model[gain as usize..][..n].to_vec();
                let out = &mut buf.work[dx as usize + o..][..n];
                if !add {
                    out.fill(0.0);
                }
                let (mut dg, mut db) = (vec![0.0; n], vec![0.0; n]);
                layer_norm_backward(&dy, &h, &r, &g, n, &mut dg, &mut db, out, &mut Vec::new());
            }
        }
    }
}

fn token_logp(lp: &StepParams, buf: &Buffers, i: usize) -> f32 {
    let (g, n, v) = (lp.g as usize, lp.n as usize, lp.v as usize);
    let row = i / (g * n) * n + i % n;
    let tok = buf.ints[lp.i_tokens as usize + i] as usize;
    buf.work[lp.logits_off as usize + row * v + tok] * lp.inv_t
        - buf.work[lp.logz_off as usize + row]
}

/// The Rust reference of one kernel entry point of the lecture step (the WGSL program's
/// `entry`), on the host mirror of its buffers.
pub fn step_kernel(entry: &str, lp: &StepParams, buf: &mut Buffers) {
    match entry {
        "gather_enc" => gather_enc(lp, buf),
        "row_stats" => row_stats(lp, buf),
        "gather_logp" => gather_logp(lp, buf),
        "row_step" => row_step(lp, buf),
        "scatter_dt" => scatter_dt(lp, buf),
        "argmax" => argmax(lp, buf),
        "reduce" => reduce(lp, buf),
        "adam" => adam(lp, buf),
        "copy_ref" => copy_ref(lp, buf),
        other => panic!("no reference for {other}"),
    }
}

/// `(b, g, n, v, d, rows, tokens)` of a step's parameters.
fn dims(lp: &StepParams) -> [usize; 7] {
    [lp.b, lp.g, lp.n, lp.v, lp.d, lp.rows, lp.tokens].map(|x| x as usize)
}

fn w(x: u32) -> usize {
    x as usize
}

/// `(log Z, H)` of one row of logits at temperature `1/inv_t`: the CPU engines' text
/// (`objective::numeric`), which `row_stats` and `row_step` mirror in WGSL (a max-shifted
/// sum; terms with `e^{z−m} = 0` skipped; WGSL's `exp` and sum order within the tolerance).
fn row_logz_entropy(x: &[f32], inv_t: f32) -> (f32, f32) {
    let n = x.len();
    let (mut z, mut e, mut p, mut h) = (vec![0.0; n], vec![0.0; n], vec![0.0; n], vec![0.0; n]);
    let stats = row_softmax(x, inv_t, &mut z, &mut e);
    (stats.0, row_entropy(&z, &e, stats, &mut p, &mut h))
}

fn gather_enc(lp: &StepParams, buf: &mut Buffers) {
    let [b, _, n, _, d, _, _] = dims(lp);
    for i in 0..b * d {
        let (bi, j) = (i / d, i % d);
        let mut acc = 0.0f32;
        for p in 0..n {
            let tok = buf.ints[w(lp.i_prompts) + bi * n + p] as usize;
            acc += buf.work[w(lp.t_off) + tok * n * d + p * d + j];
        }
        buf.work[w(lp.enc_off) + i] = acc;
    }
}

fn row_stats(lp: &StepParams, buf: &mut Buffers) {
    let [_, _, _, v, _, rows, _] = dims(lp);
    for r in 0..rows {
        let x = &buf.work[w(lp.logits_off) + r * v..w(lp.logits_off) + (r + 1) * v];
        let (lz, h) = row_logz_entropy(x, lp.inv_t);
        buf.work[w(lp.logz_off) + r] = lz;
        buf.work[w(lp.ent_off) + r] = h;
    }
}

fn gather_logp(lp: &StepParams, buf: &mut Buffers) {
    let [_, _, _, _, _, _, tokens] = dims(lp);
    for i in 0..tokens {
        buf.work[w(lp.out_off) + i] = token_logp(lp, buf, i);
    }
}

fn row_step(lp: &StepParams, buf: &mut Buffers) {
    let [_, g, n, v, _, rows, _] = dims(lp);
    let modes = [
        LossMode::Naive,
        LossMode::Unclipped,
        LossMode::Clipped,
        LossMode::Cispo,
        LossMode::Sapo,
    ];
    let pg = PgParams {
        mode: modes[w(lp.mode)],
        lo: lp.lo,
        hi: lp.hi,
        dual_clip: lp.dual_clip,
        delta: lp.delta,
        cispo_cap: lp.cispo_cap,
        tau_pos: lp.tau_pos,
        tau_neg: lp.tau_neg,
    };
    let est = [KlEstimator::K1, KlEstimator::K2, KlEstimator::K3][w(lp.estimator)];
    let beta = if lp.kl_on == 1 { lp.beta } else { 0.0 };
    for r in 0..rows {
        let base = w(lp.logits_off) + r * v;
        let x: Vec<f32> = buf.work[base..base + v].to_vec();
        let (lz, h) = row_logz_entropy(&x, lp.inv_t);
        let (bi, pos) = (r / n, r % n);
        let mut rc = 0.0f32;
        let mut sums = [0.0f32; 5];
        for gi in 0..g {
            let t = (bi * g + gi) * n + pos;
            let tok = buf.ints[w(lp.i_tokens) + t] as usize;
            let l = x[tok] * lp.inv_t - lz;
            buf.work[w(lp.out_off) + t] = l;
            let ratio = (l - buf.work[w(lp.old_off) + t]).exp();
            let a = buf.work[w(lp.adv_off) + t / n];
            let (kl, mut dkl) = kl_term(est, l, buf.work[w(lp.rf_off) + t], beta, f32::exp);
            if lp.kl_on == 0 {
                dkl = 0.0;
            }
            let (term, dterm) = pg_term(&pg, a, ratio, ratio, l, f32::exp);
            let c = (dterm + dkl) * lp.cw;
            buf.work[w(lp.coef_off) + t] = c;
            rc += c;
            sums[0] += term;
            sums[1] += kl;
            sums[2] += ratio;
            let (low, high) = clip_flags(&pg, ratio, a);
            sums[3] += low as u32 as f32;
            sums[4] += high as u32 as f32;
        }
        let s = w(lp.stats_off);
        for (c, x) in sums.iter().enumerate() {
            buf.work[s + c * rows + r] = *x;
        }
        buf.work[s + 5 * rows + r] = h * g as f32;
        let dl = w(lp.dl_off) + r * v;
        buf.work[dl..dl + v].fill(0.0);
        for gi in 0..g {
            let t = (bi * g + gi) * n + pos;
            let at = dl + buf.ints[w(lp.i_tokens) + t] as usize;
            buf.work[at] += buf.work[w(lp.coef_off) + t];
        }
        for (u, &xu) in x.iter().enumerate() {
            buf.work[dl + u] -= rc * (xu * lp.inv_t - lz).exp();
        }
    }
}

fn scatter_dt(lp: &StepParams, buf: &mut Buffers) {
    let [b, _, n, v, d, _, _] = dims(lp);
    let nd = n * d;
    for i in 0..nd {
        let (p, j) = (i / d, i % d);
        for u in 0..v {
            buf.work[w(lp.dt_off) + u * nd + i] = 0.0;
        }
        for bi in 0..b {
            let tok = buf.ints[w(lp.i_prompts) + bi * n + p] as usize;
            buf.work[w(lp.dt_off) + tok * nd + i] += buf.work[w(lp.denc_off) + bi * d + j];
        }
    }
}

fn argmax(lp: &StepParams, buf: &mut Buffers) {
    let [_, _, _, v, _, rows, _] = dims(lp);
    for r in 0..rows {
        let x = &buf.work[w(lp.logits_off) + r * v..w(lp.logits_off) + (r + 1) * v];
        let mut best = 0;
        for (u, &l) in x.iter().enumerate() {
            if l > x[best] {
                best = u;
            }
        }
        buf.ints[w(lp.i_greedy) + r] = best as u32;
    }
}

fn reduce(lp: &StepParams, buf: &mut Buffers) {
    // reduce_partial then reduce_final: per chunk of `chunk` elements a partial
    // sum, then the sum of the partials (the kernel's tree order within a chunk
    // differs from this sequential one: equal within rounding).
    let (count, chunk) = (w(lp.count), w(lp.chunk).max(1));
    let nchunks = count.div_ceil(chunk).max(1);
    for c in 0..w(lp.channels) {
        let mut total = 0.0f32;
        for ch in 0..nchunks {
            let mut part = 0.0f64;
            for i in ch * chunk..((ch + 1) * chunk).min(count) {
                let x = buf.work[w(lp.src_off) + c * count + i] as f64;
                part += if lp.square == 1 { x * x } else { x };
            }
            buf.work[w(lp.part_off) + c * nchunks + ch] = part as f32;
            total += part as f32;
        }
        buf.work[w(lp.sums_off) + c] = total;
    }
    let _ = CHUNK;
}

fn adam(lp: &StepParams, buf: &mut Buffers) {
    let norm = buf.work[w(lp.sums_off) + 6].sqrt();
    let scale = if lp.max_norm > 0.0 && norm > lp.max_norm {
        lp.max_norm / norm
    } else {
        1.0
    };
    let adam = crate::objective::adam::AdamStep {
        b1: lp.b1,
        b2: lp.b2,
        eps: lp.eps,
        bc2: lp.bc2,
        factor: lp.factor,
        lr: lp.lr,
        scale,
    };
    for i in 0..w(lp.p_count) {
        let (mut x, mut m, mut v) = (
            buf.model[w(lp.w_off) + i],
            buf.model[w(lp.am_off) + i],
            buf.model[w(lp.av_off) + i],
        );
        adam.element(&mut x, buf.work[w(lp.grad_off) + i], &mut m, &mut v);
        buf.model[w(lp.w_off) + i] = x;
        buf.model[w(lp.am_off) + i] = m;
        buf.model[w(lp.av_off) + i] = v;
    }
}

fn copy_ref(lp: &StepParams, buf: &mut Buffers) {
    for i in 0..w(lp.p_count) {
        buf.model[w(lp.ref_off) + i] = buf.model[w(lp.w_off) + i];
    }
}
