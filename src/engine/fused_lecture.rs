//! A fused CPU path for the lecture model's optimizer step: forward, loss, backward and Adam
//! written out by hand over plain buffers, with every matrix product through `gemm` (the
//! crate burn's CPU backend uses too), and no autodiff graph, no tensor allocations per op.
//!
//! For a policy this small a burn step is mostly framework overhead; this path computes the
//! same function with the products taken in a cheaper order (see `Forward`), in reused buffers,
//! with loops that vectorize (and an AVX2 build of them, bit-identical to the portable one on
//! the same CPU).
//! It is held equal to the burn path by `tests/fused.rs` (same weights after several
//! iterations within a stated tolerance) and is used only for configurations it covers
//! (`FusedLecture::supports`).

pub use super::StepScalars;
use crate::config::{ModelKind, RunConfig};
use crate::model::lecture::LectureWeights;
use crate::objective::loss::{self, LossSettings, TokenInputs, TokenTerms};
pub use crate::objective::numeric::{exp_fast, lanes8, sum_f64, sum_sq, zeroed};
use crate::objective::numeric::{row_entropy, row_softmax};

/// A read-only strided matrix: element `(i, j)` at `data[i·rs + j·cs]`.
#[derive(Clone, Copy)]
pub(crate) struct View<'a> {
    data: &'a [f32],
    rs: usize,
    cs: usize,
}

impl<'a> View<'a> {
    /// Row-major with `cols` columns.
    pub(crate) fn rows(data: &'a [f32], cols: usize) -> Self {
        Self {
            data,
            rs: cols,
            cs: 1,
        }
    }
    /// The transpose (no copy).
    pub(crate) fn t(self) -> Self {
        Self {
            rs: self.cs,
            cs: self.rs,
            ..self
        }
    }
    /// The same strides from element `offset` on (a block of a larger matrix).
    pub(crate) fn at(self, offset: usize) -> Self {
        Self {
            data: &self.data[offset..],
            ..self
        }
    }
    fn holds(&self, rows: usize, cols: usize) -> bool {
        rows == 0 || cols == 0 || (rows - 1) * self.rs + (cols - 1) * self.cs < self.data.len()
    }
}

/// `C ← A · B` (or `C += A · B` when `accumulate`): `A` is `[m, k]`, `B` `[k, n]`, `C` row-major
/// `[m, n]` with row stride `c_rs` (a block of a wider matrix when `c_rs > n`).
pub(crate) fn product_into(
    c: &mut [f32],
    c_rs: usize,
    a: View,
    b: View,
    (m, k, n): (usize, usize, usize),
    accumulate: bool,
) {
    assert!(a.holds(m, k) && b.holds(k, n));
    assert!(m == 0 || n == 0 || (n <= c_rs && (m - 1) * c_rs + n <= c.len()));
    // SAFETY: the asserts above keep every element gemm reads or writes inside the slices.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            c_rs as isize,
            accumulate,
            a.data.as_ptr(),
            a.cs as isize,
            a.rs as isize,
            b.data.as_ptr(),
            b.cs as isize,
            b.rs as isize,
            1.0f32,
            1.0f32,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

/// Softmax statistics of `[rows, V]` logits at temperature `1/inv_t`: `z = x·inv_t` and
/// `log Σ exp z` per row, and (when `probs` is given) the probabilities, each row's entropy
/// and their sum. `step` and `token_logp` share it, so log π_old at the first step of
/// an iteration equals the step's log π bit for bit.
#[inline(always)]
fn softmax_rows(
    logits: &[f32],
    v: usize,
    inv_t: f32,
    z: &mut Vec<f32>,
    logz: &mut Vec<f32>,
    mut probs: Option<(&mut Vec<f32>, &mut Vec<f32>)>,
) -> f64 {
    // Every element is written below: no fill.
    z.resize(logits.len(), 0.0);
    let rows = logits.len() / v;
    logz.clear();
    logz.resize(rows, 0.0);
    if let Some((pr, hr)) = probs.as_mut() {
        pr.clear();
        pr.resize(logits.len(), 0.0);
        hr.clear();
        hr.resize(rows, 0.0);
    }
    let mut entropy = 0.0f64;
    let mut e = vec![0.0f32; v];
    let mut h = vec![0.0f32; v];
    for (r, (x, zr)) in logits
        .chunks_exact(v)
        .zip(z.chunks_exact_mut(v))
        .enumerate()
    {
        let stats = row_softmax(x, inv_t, zr, &mut e);
        logz[r] = stats.0;
        if let Some((pr, hr)) = probs.as_mut() {
            let p = &mut pr[r * v..(r + 1) * v];
            hr[r] = row_entropy(zr, &e, stats, p, &mut h);
            entropy += hr[r] as f64;
        }
    }
    entropy
}

/// The keep-sampling-mask on the lecture model: each (prompt, position) row of `logits
/// [B·n, V]` restricted to its sampler support, read off the prompt's first response
/// (`support [B·G·n]`: its G responses were drawn from the same row, so they share it).
fn keep_supports(logits: &mut [f32], v: usize, n: usize, support: Option<&[u64]>) {
    let Some(support) = support else { return };
    let g = support.len() * v / logits.len().max(1);
    for (r, row) in logits.chunks_exact_mut(v).enumerate() {
        crate::objective::sampling::keep_support(row, support[(r / n) * g * n + r % n]);
    }
}

/// Adam's state for one parameter array, as burn's `Adam` keeps it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AdamMoments {
    pub m: Vec<f32>,
    pub v: Vec<f32>,
}

/// The lecture model's weights and Adam state on the host, with scratch buffers.
#[derive(Debug, Clone)]
pub struct FusedLecture {
    pub vocab: usize,
    pub n: usize,
    pub d: usize,
    /// `[V, D]`
    pub embedding: Vec<f32>,
    /// `[n·D, D]` (the lecture's `[n, D, D]` layout).
    pub encode: Vec<f32>,
    /// `[D, n·D]`: `decode[p, d2, d1]` at `d2·nD + p·D + d1` (the matrix the forward multiplies).
    pub decode_t: Vec<f32>,
    /// Adam moments of embedding, encode, decode_t; the step count.
    pub adam: [AdamMoments; 3],
    pub time: i32,
    /// Measure each step's entropy change (`run.entropy_dynamics`): the entropy after the
    /// update, and `∇θH·Δθ` (an extra forward and backward pass).
    pub entropy_dynamics: bool,
    beta1: f32,
    beta2: f32,
    eps: f32,
    scratch: Scratch,
}

/// Forward activations of a batch.
///
/// The lecture's model is `logits[b, p] = (Σ_q E[x_bq] · encode_q) · decode_p · Eᵀ`. The
/// products are taken in this order: the per-position tables `T_q = E · encode_q` (`[V, D]`
/// each) and `M_p = decode_p · Eᵀ` (`[D, V]` each) first, then `enc[b] = Σ_q T_q[x_bq]` (a
/// gather) and `logits = enc · M`. Same function; the tables cost `n·V·D²` where the
/// lecture's order costs `B·n·D²` for each of its big products (forward and backward alike;
/// the `B·n·D·V` products are common to both), so this is the cheaper order whenever the
/// vocabulary is smaller than the batch of prompts — the sort task's case (V = 16, B = 256 on `scaled`: 9.4 M instead of
/// 56 M multiply-adds per step). With a larger vocabulary it is still exact (tested), only
/// slower than it could be.
#[derive(Debug, Clone, Default)]
struct Forward {
    /// `[V, n·D]`: `T_p` side by side.
    t: Vec<f32>,
    /// `[B, D]`
    enc: Vec<f32>,
    /// `[D, n·V]`: `M_p` side by side.
    m: Vec<f32>,
    /// `[B, n·V]` = `[B·n, V]`
    logits: Vec<f32>,
}

/// Gradients of the three weight arrays (layouts as the fused path stores them).
#[derive(Debug, Clone, Default)]
struct Grads {
    embedding: Vec<f32>,
    encode: Vec<f32>,
    decode_t: Vec<f32>,
}

/// The inputs of one step (see `FusedLecture::step`).
#[derive(Clone, Copy)]
struct Batch<'a> {
    prompts: &'a [u32],
    responses: &'a [u32],
    advantages: &'a [f32],
    /// `[B·G·n]` per-token advantages (GAE), replacing `advantages` when present.
    token_advantages: Option<&'a [f32]>,
    old_logp: &'a [f32],
    ref_logp: &'a [f32],
    /// `[B·G·n]` the sampler's own log π (the mismatch lab), where it differs.
    sampler_logp: Option<&'a [f32]>,
    /// `[B·G·n]` the sampler's support, which the learner renormalises over.
    support: Option<&'a [u64]>,
}

/// Buffers a step reuses (sized on first use; no allocation or page faults afterwards).
#[derive(Debug, Clone, Default)]
struct Scratch {
    f: Forward,
    z: Vec<f32>,
    logz: Vec<f32>,
    probs: Vec<f32>,
    /// `[B·n]` each (prompt, position) row's entropy; `step_h`: as the last step read them.
    row_h: Vec<f32>,
    step_h: Vec<f32>,
    dlogits: Vec<f32>,
    row_coef: Vec<f32>,
    // per token
    logp: Vec<f32>,
    ones: Vec<f32>,
    terms: TokenTerms,
    // backward
    dm: Vec<f32>,
    d_enc: Vec<f32>,
    dt: Vec<f32>,
    g: Grads,
}

impl FusedLecture {
    /// Whether this path computes exactly what the configured burn step computes.
    pub fn supports(c: &RunConfig) -> bool {
        let a = &c.algorithm;
        // Its step computes no per-token entropy: the entropy bonus and the top-entropy rule
        // train on burn's path.
        c.model.kind == ModelKind::Lecture
            && !a.bugs.any()
            && !a.entropy_bonus()
            && a.top_entropy_quantile >= 1.0
    }

    pub fn new(w: &LectureWeights, vocab: usize, n: usize, d: usize, c: &RunConfig) -> Self {
        let o = &c.optimizer;
        let mut s = Self {
            vocab,
            n,
            d,
            embedding: Vec::new(),
            encode: Vec::new(),
            decode_t: Vec::new(),
            adam: Default::default(),
            time: 0,
            entropy_dynamics: false,
            beta1: o.beta1 as f32,
            beta2: o.beta2 as f32,
            eps: o.eps as f32,
            scratch: Scratch::default(),
        };
        s.set_weights(w);
        s.adam = [s.embedding.len(), s.encode.len(), s.decode_t.len()].map(|len| AdamMoments {
            m: vec![0.0; len],
            v: vec![0.0; len],
        });
        s
    }

    /// Load weights in the lecture's layout.
    pub fn set_weights(&mut self, w: &LectureWeights) {
        let (n, d) = (self.n, self.d);
        self.embedding = w.embedding.clone();
        self.encode = w.encode.clone();
        self.decode_t = vec![0.0; n * d * d];
        for p in 0..n {
            for d2 in 0..d {
                for d1 in 0..d {
                    self.decode_t[d2 * n * d + p * d + d1] = w.decode[(p * d + d2) * d + d1];
                }
            }
        }
    }

    /// The weights in the lecture's layout.
    pub fn weights(&self) -> LectureWeights {
        let (n, d) = (self.n, self.d);
        let mut decode = vec![0.0; n * d * d];
        for p in 0..n {
            for d2 in 0..d {
                for d1 in 0..d {
                    decode[(p * d + d2) * d + d1] = self.decode_t[d2 * n * d + p * d + d1];
                }
            }
        }
        LectureWeights {
            embedding: self.embedding.clone(),
            encode: self.encode.clone(),
            decode,
        }
    }

    /// The logits of a batch into `f` (see `Forward` for the order of the products).
    #[inline(always)]
    fn forward_into(&self, prompts: &[u32], f: &mut Forward) {
        let (n, d, v) = (self.n, self.d, self.vocab);
        let b = prompts.len() / n;
        let emb = View::rows(&self.embedding, d);
        let t = zeroed(&mut f.t, v * n * d);
        let m = zeroed(&mut f.m, d * n * v);
        for p in 0..n {
            let encode_p = View::rows(&self.encode, d).at(p * d * d);
            product_into(&mut t[p * d..], n * d, emb, encode_p, (v, d, d), false);
            let decode_p = View::rows(&self.decode_t, n * d).at(p * d);
            product_into(&mut m[p * v..], n * v, decode_p, emb.t(), (d, d, v), false);
        }
        let enc = zeroed(&mut f.enc, b * d);
        for (i, row) in enc.chunks_exact_mut(d).enumerate() {
            for (p, &tok) in prompts[i * n..(i + 1) * n].iter().enumerate() {
                let from = tok as usize * n * d + p * d;
                for (e, &x) in row.iter_mut().zip(&f.t[from..from + d]) {
                    *e += x;
                }
            }
        }
        let logits = zeroed(&mut f.logits, b * n * v);
        let (enc, m) = (View::rows(&f.enc, d), View::rows(&f.m, n * v));
        product_into(logits, n * v, enc, m, (b, d, n * v), false);
    }

    fn forward(&self, prompts: &[u32]) -> Forward {
        let mut f = Forward::default();
        self.forward_into(prompts, &mut f);
        f
    }

    /// Gradients of the weights from `dlogits [B, n·V]` through `forward`'s products, into
    /// `s.g` (`s.dm`, `s.d_enc`, `s.dt` are its intermediates).
    #[inline(always)]
    fn backward(&self, prompts: &[u32], s: &mut Scratch) {
        let (n, d, v) = (self.n, self.d, self.vocab);
        let b = prompts.len() / n;
        let emb = View::rows(&self.embedding, d);
        let dl = View::rows(&s.dlogits, n * v);
        // logits = enc · M
        let dm = zeroed(&mut s.dm, d * n * v);
        product_into(
            dm,
            n * v,
            View::rows(&s.f.enc, d).t(),
            dl,
            (d, b, n * v),
            false,
        );
        let d_enc = zeroed(&mut s.d_enc, b * d);
        product_into(
            d_enc,
            d,
            dl,
            View::rows(&s.f.m, n * v).t(),
            (b, n * v, d),
            false,
        );
        // enc[b] = Σ_p T_p[x_bp]: scatter the rows back to the tables.
        let dt = zeroed(&mut s.dt, v * n * d);
        for (i, row) in s.d_enc.chunks_exact(d).enumerate() {
            for (p, &tok) in prompts[i * n..(i + 1) * n].iter().enumerate() {
                let to = tok as usize * n * d + p * d;
                for (g, &x) in dt[to..to + d].iter_mut().zip(row) {
                    *g += x;
                }
            }
        }
        let g = &mut s.g;
        zeroed(&mut g.embedding, v * d);
        zeroed(&mut g.encode, n * d * d);
        zeroed(&mut g.decode_t, d * n * d);
        for p in 0..n {
            // M_p = decode_p · Eᵀ
            let dm_p = View::rows(&s.dm, n * v).at(p * v);
            let decode_p = View::rows(&self.decode_t, n * d).at(p * d);
            product_into(&mut g.decode_t[p * d..], n * d, dm_p, emb, (d, v, d), false);
            product_into(&mut g.embedding, d, dm_p.t(), decode_p, (v, d, d), true);
            // T_p = E · encode_p
            let dt_p = View::rows(&s.dt, n * d).at(p * d);
            let encode_p = View::rows(&self.encode, d).at(p * d * d);
            product_into(
                &mut g.encode[p * d * d..],
                d,
                emb.t(),
                dt_p,
                (d, v, d),
                false,
            );
            product_into(&mut g.embedding, d, dt_p, encode_p.t(), (v, d, d), true);
        }
    }

    /// Adam's state as bytes: the step count, then m and v of each array (f32, little-endian).
    pub fn adam_bytes(&self) -> Vec<u8> {
        let mut out = self.time.to_le_bytes().to_vec();
        for st in &self.adam {
            for x in st.m.iter().chain(&st.v) {
                out.extend_from_slice(&x.to_le_bytes());
            }
        }
        out
    }

    /// Restore what `adam_bytes` wrote (for these shapes).
    pub fn load_adam_bytes(&mut self, bytes: &[u8]) -> Result<(), String> {
        let want = 4 + self.adam.iter().map(|a| 8 * a.m.len()).sum::<usize>();
        if bytes.len() != want {
            return Err(format!(
                "fused_adam.bin holds {} bytes, expected {want} for this model",
                bytes.len()
            ));
        }
        self.time = i32::from_le_bytes(bytes[..4].try_into().expect("4 bytes"));
        let mut floats = bytes[4..]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")));
        for st in &mut self.adam {
            for x in st.m.iter_mut().chain(st.v.iter_mut()) {
                *x = floats.next().expect("sized above");
            }
        }
        Ok(())
    }

    /// `log π` at `temperature` of every response token: `prompts [B·n]`, `responses
    /// [B·G·n]` → `[B·G·n]`, computed exactly as `step` computes it (over the sampler's
    /// `support [B·G·n]` when given).
    pub fn token_logp(
        &self,
        prompts: &[u32],
        responses: &[u32],
        temperature: f32,
        support: Option<&[u64]>,
    ) -> Vec<f32> {
        let f = self.forward(prompts);
        self.token_logp_from_logits(&f.logits, responses, temperature, support)
    }

    /// `token_logp` from logits `[B·n, V]` this path's forward already computed. (Portable
    /// build only: an AVX2 build measured no gain here, and it gives the same bits anyway.)
    pub fn token_logp_from_logits(
        &self,
        logits: &[f32],
        responses: &[u32],
        temperature: f32,
        support: Option<&[u64]>,
    ) -> Vec<f32> {
        let (mut z, mut logz, mut out) = (Vec::new(), Vec::new(), Vec::new());
        let mut kept = Vec::new();
        let logits = match support {
            Some(_) => {
                kept.extend_from_slice(logits);
                keep_supports(&mut kept, self.vocab, self.n, support);
                &kept[..]
            }
            None => logits,
        };
        softmax_rows(
            logits,
            self.vocab,
            1.0 / temperature,
            &mut z,
            &mut logz,
            None,
        );
        self.gather_logp(logits.len() / self.vocab, responses, &z, &logz, &mut out);
        out
    }

    /// `out[t] = z[row(t), x_t] − log Z[row(t)]` for responses `[B·G·n]`.
    #[inline(always)]
    fn gather_logp(
        &self,
        prompt_tokens: usize,
        responses: &[u32],
        z: &[f32],
        logz: &[f32],
        out: &mut Vec<f32>,
    ) {
        let (n, v) = (self.n, self.vocab);
        let b = prompt_tokens / n;
        let g = responses.len() / prompt_tokens.max(1);
        // A token outside the vocabulary would read (and in the step, write) another row.
        assert!(responses.iter().all(|&t| (t as usize) < v), "token ≥ vocab");
        out.clear();
        out.resize(responses.len(), 0.0);
        for bi in 0..b {
            for gi in 0..g {
                let span = (bi * g + gi) * n..(bi * g + gi + 1) * n;
                for (p, (o, &tok)) in out[span.clone()]
                    .iter_mut()
                    .zip(&responses[span])
                    .enumerate()
                {
                    let r = bi * n + p;
                    *o = z[r * v + tok as usize] - logz[r];
                }
            }
        }
    }

    /// `logits [B, n, V]` of the current weights (for rollouts and evaluation).
    pub fn logits(&self, prompts: &[u32]) -> Vec<f32> {
        self.forward(prompts).logits
    }

    /// Each token's entropy `H_t` as the last [`Self::step`] read it (before its update), for
    /// the first `rows` of its `[B·G]` responses of `g` per prompt: `[rows·n]` (a lecture
    /// model's distribution at a position depends on the prompt alone, so a token's entropy is
    /// its (prompt, position) row's).
    pub fn token_entropy(&self, g: usize, rows: usize) -> Vec<f32> {
        let (n, h) = (self.n, &self.scratch.step_h);
        (0..rows)
            .filter(|r| (r / g.max(1) + 1) * n <= h.len())
            .flat_map(|r| {
                h[(r / g.max(1)) * n..(r / g.max(1) + 1) * n]
                    .iter()
                    .copied()
            })
            .collect()
    }

    /// One optimizer step of the GRPO loss on a fixed-length batch.
    /// `prompts [B·n]`, `responses [B·G·n]`, `advantages [B·G]`, `old_logp`/`ref_logp [B·G·n]`.
    /// Returns the step's scalars and `log π` of every token (before the update).
    ///
    /// On x86-64 CPUs with AVX2 the same code runs compiled for AVX2 (twice the vector width).
    /// Without FMA contraction every operation is the same IEEE operation in the same order,
    /// so both give bit-identical results (tested). Across CPU models results can still differ
    /// in the last bits: `gemm` picks its kernel (FMA or not) and block sizes at run time.
    #[allow(clippy::too_many_arguments)]
    pub fn step(
        &mut self,
        prompts: &[u32],
        responses: &[u32],
        advantages: &[f32],
        token_advantages: Option<&[f32]>,
        old_logp: &[f32],
        ref_logp: &[f32],
        sampler_logp: Option<&[f32]>,
        support: Option<&[u64]>,
        s: &LossSettings,
        temperature: f32,
        lr: f64,
        max_grad_norm: f32,
    ) -> (StepScalars, Vec<f32>) {
        let x = Batch {
            prompts,
            responses,
            advantages,
            token_advantages,
            old_logp,
            ref_logp,
            sampler_logp,
            support,
        };
        self.step_batch(&x, s, temperature, lr, max_grad_norm)
    }

    avx2_dispatch! {
        fn step_batch via step_avx2 => step_body(
            &mut self,
            x: &Batch,
            s: &LossSettings,
            temperature: f32,
            lr: f64,
            max_grad_norm: f32,
        ) -> (StepScalars, Vec<f32>)
    }

    #[inline(always)]
    fn step_body(
        &mut self,
        x: &Batch,
        s: &LossSettings,
        temperature: f32,
        lr: f64,
        max_grad_norm: f32,
    ) -> (StepScalars, Vec<f32>) {
        let mut sc = std::mem::take(&mut self.scratch);
        let entropy = self.loss_gradient_into(x, s, temperature, &mut sc);
        sc.step_h.clone_from(&sc.row_h);
        let rows = x.prompts.len();
        // ∇θ of the mean row entropy and the weights before the update, for the first-order
        // change of the step actually taken.
        let dynamics = self.entropy_dynamics.then(|| {
            let loss_grads = std::mem::take(&mut sc.g);
            self.entropy_gradient_into(x.prompts, 1.0 / temperature, &mut sc);
            let dh = std::mem::replace(&mut sc.g, loss_grads).flat();
            (dh, self.flat_weights())
        });
        let gr = &sc.g;
        let grad_norm = (sum_sq(&gr.embedding) + sum_sq(&gr.encode) + sum_sq(&gr.decode_t)).sqrt();
        let scale = if max_grad_norm > 0.0 && grad_norm > max_grad_norm {
            max_grad_norm / grad_norm
        } else {
            1.0
        };
        // Adam (one step count for the three arrays).
        self.time += 1;
        let hyper = crate::objective::adam::Hyper {
            beta1: self.beta1,
            beta2: self.beta2,
            eps: self.eps,
        };
        let adam = crate::objective::adam::AdamStep::at(&hyper, self.time, lr as f32, scale);
        for (param, (grad, st)) in [&mut self.embedding, &mut self.encode, &mut self.decode_t]
            .into_iter()
            .zip(
                [&gr.embedding, &gr.encode, &gr.decode_t]
                    .into_iter()
                    .zip(self.adam.iter_mut()),
            )
        {
            adam.apply(param, grad, &mut st.m, &mut st.v);
        }
        let (entropy_measured, entropy_first_order) = match dynamics {
            Some((dh, before)) => {
                let after = self.forward_softmax(x.prompts, 1.0 / temperature, x.support, &mut sc);
                let step: f64 = self
                    .flat_weights()
                    .iter()
                    .zip(&before)
                    .zip(&dh)
                    .map(|((&w, &w0), &g)| (w - w0) as f64 * g as f64)
                    .sum();
                (
                    Some(((after - entropy) / rows as f64) as f32),
                    Some(step as f32),
                )
            }
            None => (None, None),
        };
        let t = &sc.terms;
        let scalars = StepScalars {
            loss: t.loss as f32,
            kl: t.kl,
            clip_low: t.clip_low,
            clip_high: t.clip_high,
            ratio_mean: t.ratio_mean,
            entropy: (entropy / rows as f64) as f32,
            grad_norm,
            entropy_measured,
            entropy_first_order,
        };
        let logp = sc.logp.clone();
        self.scratch = sc;
        (scalars, logp)
    }

    /// The loss's gradient on a batch into `sc.g` (the terms in `sc.terms`, log π in
    /// `sc.logp`); returns the summed entropy of the `(prompt, position)` rows.
    #[inline(always)]
    fn loss_gradient_into(
        &self,
        x: &Batch,
        s: &LossSettings,
        temperature: f32,
        sc: &mut Scratch,
    ) -> f64 {
        let Batch {
            prompts,
            responses,
            advantages,
            token_advantages,
            old_logp,
            ref_logp,
            sampler_logp,
            support,
        } = *x;
        let n = self.n;
        let b = prompts.len() / n;
        let g = advantages.len() / b;
        let inv_t = 1.0 / temperature;
        let entropy = self.forward_softmax(prompts, inv_t, support, sc);
        self.gather_logp(prompts.len(), responses, &sc.z, &sc.logz, &mut sc.logp);
        // The objective over every token (all responses have n tokens: the mask is all ones).
        let tokens = b * g * n;
        if sc.ones.len() != tokens {
            sc.ones = vec![1.0; tokens];
        }
        let inputs = TokenInputs {
            logp: &sc.logp,
            old_logp,
            ref_logp,
            sampler_logp,
            advantages: token_advantages.map_or(advantages, |per_token| &per_token[..tokens]),
            mask: &sc.ones,
            entropy: None,
            t: n,
        };
        loss::evaluate(s, &inputs, &mut sc.terms);
        // ∂L/∂z = ∂L/∂log π · 1/T: at T ≠ 1 `dlogp`'s terms again with 1/T folded into each
        // weight first (the order the lecture's tables were measured in).
        if inv_t != 1.0 && s.coupled() {
            // A response's ratio reaches its tokens through `couple`: the coefficients as
            // they are, then 1/T.
            sc.terms.dlogp.iter_mut().for_each(|c| *c *= inv_t);
        } else if inv_t != 1.0 {
            let t = &mut sc.terms;
            let terms = t.dterm.iter().zip(&t.dkl).zip(&t.weight);
            for (c, ((&dt, &dk), &w)) in t.dlogp.iter_mut().zip(terms) {
                *c = (dt + dk) * (w * inv_t);
            }
        }
        let dlogp = std::mem::take(&mut sc.terms.dlogp);
        self.backward_from_dlogp(prompts, responses, &dlogp, sc);
        sc.terms.dlogp = dlogp;
        entropy
    }

    /// The logits of a batch and the softmax of each (prompt, position) row at temperature
    /// `1/inv_t` (over the sampler's support when given) into `sc`; returns the rows' summed
    /// entropy.
    #[inline(always)]
    fn forward_softmax(
        &self,
        prompts: &[u32],
        inv_t: f32,
        support: Option<&[u64]>,
        sc: &mut Scratch,
    ) -> f64 {
        self.forward_into(prompts, &mut sc.f);
        keep_supports(&mut sc.f.logits, self.vocab, self.n, support);
        softmax_rows(
            &sc.f.logits,
            self.vocab,
            inv_t,
            &mut sc.z,
            &mut sc.logz,
            Some((&mut sc.probs, &mut sc.row_h)),
        )
    }

    /// `∇θ` of the mean entropy of the `(prompt, position)` rows into `sc.g`, from the
    /// softmax `sc` holds (`sc.probs`, `sc.z`, `sc.logz` at temperature `1/inv_t`).
    fn entropy_gradient_into(&self, prompts: &[u32], inv_t: f32, sc: &mut Scratch) {
        let v = self.vocab;
        let rows = prompts.len();
        let dl = zeroed(&mut sc.dlogits, rows * v);
        for (r, out) in dl.chunks_exact_mut(v).enumerate() {
            let (p, z, lz) = (
                &sc.probs[r * v..(r + 1) * v],
                &sc.z[r * v..(r + 1) * v],
                sc.logz[r],
            );
            let h: f32 = -p.iter().zip(z).map(|(&p, &z)| p * (z - lz)).sum::<f32>();
            crate::objective::entropy_dynamics::entropy_logit_gradient(
                p,
                |a| z[a] - lz,
                h,
                inv_t,
                1.0 / rows as f32,
                out,
            );
        }
        self.backward(prompts, sc);
    }

    /// The weights' gradient into `sc.g` from `dlogp [B·G·n]` (∂L/∂z of each response token's
    /// own logit, 1/T included) with `sc.probs` the rows' softmax: d log π / d z = onehot −
    /// softmax, the one-hot part per token, the softmax part once per row with the summed
    /// coefficient.
    #[inline(always)]
    fn backward_from_dlogp(
        &self,
        prompts: &[u32],
        responses: &[u32],
        dlogp: &[f32],
        sc: &mut Scratch,
    ) {
        let (n, v) = (self.n, self.vocab);
        let rows = prompts.len();
        let g = dlogp.len() / rows.max(1);
        zeroed(&mut sc.dlogits, rows * v);
        zeroed(&mut sc.row_coef, rows);
        for (bi, (rc, drows)) in sc
            .row_coef
            .chunks_exact_mut(n)
            .zip(sc.dlogits.chunks_exact_mut(n * v))
            .enumerate()
        {
            for gi in 0..g {
                let span = (bi * g + gi) * n..(bi * g + gi + 1) * n;
                for (r, &c) in rc.iter_mut().zip(&dlogp[span.clone()]) {
                    *r += c;
                }
                for (p, (&c, &tok)) in dlogp[span.clone()].iter().zip(&responses[span]).enumerate()
                {
                    drows[p * v + tok as usize] += c;
                }
            }
        }
        for ((drow, prow), &c) in sc
            .dlogits
            .chunks_exact_mut(v)
            .zip(sc.probs.chunks_exact(v))
            .zip(&sc.row_coef)
        {
            for (dl, &pr) in drow.iter_mut().zip(prow) {
                *dl -= c * pr;
            }
        }
        self.backward(prompts, sc);
    }

    /// The gradient of the loss on a batch, without a step (the gradient lab's estimators):
    /// flat, in [`Self::flat_weights`]'s order. Arguments as [`Self::step`]'s.
    #[allow(clippy::too_many_arguments)]
    pub fn loss_gradient(
        &mut self,
        prompts: &[u32],
        responses: &[u32],
        advantages: &[f32],
        old_logp: &[f32],
        ref_logp: &[f32],
        s: &LossSettings,
        temperature: f32,
    ) -> Vec<f32> {
        let x = Batch {
            prompts,
            responses,
            advantages,
            token_advantages: None,
            old_logp,
            ref_logp,
            sampler_logp: None,
            support: None,
        };
        let mut sc = std::mem::take(&mut self.scratch);
        self.loss_gradient_into(&x, s, temperature, &mut sc);
        let out = sc.g.flat();
        self.scratch = sc;
        out
    }

    /// `∇θ Σ_t coef_t · log π(x_t)` at `temperature` for responses `[B·G·n]` and one
    /// coefficient per token: with `coef = π(y)·R(y)/P` over every answer `y` it is the exact
    /// `∇J` (the gradient lab). Flat, in [`Self::flat_weights`]'s order.
    pub fn logp_gradient(
        &mut self,
        prompts: &[u32],
        responses: &[u32],
        coef: &[f32],
        temperature: f32,
    ) -> Vec<f32> {
        let mut sc = std::mem::take(&mut self.scratch);
        let inv_t = 1.0 / temperature;
        self.forward_softmax(prompts, inv_t, None, &mut sc);
        let dlogp: Vec<f32> = coef.iter().map(|&c| c * inv_t).collect();
        self.backward_from_dlogp(prompts, responses, &dlogp, &mut sc);
        let out = sc.g.flat();
        self.scratch = sc;
        out
    }

    /// The weights as one vector: embedding, encode, then the decode matrices as this path
    /// stores them (`decode_t`); the order of every gradient this path returns.
    pub fn flat_weights(&self) -> Vec<f32> {
        [&self.embedding[..], &self.encode, &self.decode_t].concat()
    }

    /// Set the weights from a vector in [`Self::flat_weights`]'s order.
    pub fn set_flat_weights(&mut self, w: &[f32]) {
        let (a, b) = (self.embedding.len(), self.encode.len());
        assert_eq!(w.len(), a + b + self.decode_t.len(), "flat weights' length");
        self.embedding.copy_from_slice(&w[..a]);
        self.encode.copy_from_slice(&w[a..a + b]);
        self.decode_t.copy_from_slice(&w[a + b..]);
    }
}

impl Grads {
    fn flat(&self) -> Vec<f32> {
        [&self.embedding[..], &self.encode, &self.decode_t].concat()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{KlEstimator, LossMode};

    /// The AVX2 build of the step and the portable one give bit-identical results on the
    /// same CPU.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn avx2_step_is_bit_identical_to_the_portable_step() {
        if !std::arch::is_x86_feature_detected!("avx2") {
            eprintln!("no AVX2 on this CPU: nothing to compare");
            return;
        }
        use crate::config::LossAggMode;
        use crate::rng::SplitMix64;
        let (vocab, n, d, b, g) = (11, 5, 24, 9, 6);
        let mut c = RunConfig::preset("lecture17").unwrap();
        c.optimizer.lr = 0.01;
        let w = LectureWeights::init(vocab, n, d, 0.5, 3);
        let mut rng = SplitMix64::new(9);
        let prompts: Vec<u32> = (0..b * n).map(|_| rng.below(vocab as u64) as u32).collect();
        let responses: Vec<u32> = (0..b * g * n)
            .map(|_| rng.below(vocab as u64) as u32)
            .collect();
        let advantages: Vec<f32> = (0..b * g).map(|_| rng.normal() as f32).collect();
        let noisy = |rng: &mut SplitMix64, x: &[f32]| -> Vec<f32> {
            x.iter().map(|v| v + 0.3 * rng.normal() as f32).collect()
        };
        for (mode, est) in [
            (LossMode::Clipped, KlEstimator::K3),
            (LossMode::Unclipped, KlEstimator::K2),
            (LossMode::Naive, KlEstimator::K1),
        ] {
            let s = LossSettings {
                mode,
                epsilon_low: 0.2,
                epsilon_high: 0.28,
                beta: 0.05,
                kl_in_loss: true,
                kl_estimator: est,
                agg: LossAggMode::TokenMean,
                bug_ratio_quotient: false,
                max_len: n,
                entropy_coef: 0.0,
                ..LossSettings::plain(LossMode::Naive, KlEstimator::K3, LossAggMode::TokenMean)
            };
            let (mut wide, mut portable) = (
                FusedLecture::new(&w, vocab, n, d, &c),
                FusedLecture::new(&w, vocab, n, d, &c),
            );
            let logp = portable.token_logp(&prompts, &responses, 0.9, None);
            let old = noisy(&mut rng, &logp);
            let reference = noisy(&mut rng, &logp);
            let x = Batch {
                prompts: &prompts,
                responses: &responses,
                advantages: &advantages,
                token_advantages: None,
                old_logp: &old,
                ref_logp: &reference,
                sampler_logp: None,
                support: None,
            };
            for _ in 0..3 {
                // SAFETY: AVX2 is present (checked at the top).
                let a = unsafe { wide.step_avx2(&x, &s, 0.9, 0.01, 0.5) };
                let p = portable.step_body(&x, &s, 0.9, 0.01, 0.5);
                assert_eq!(a, p, "{mode:?} {est:?}");
            }
            let bits = |f: &FusedLecture| -> Vec<u32> {
                [&f.embedding, &f.encode, &f.decode_t]
                    .iter()
                    .flat_map(|v| v.iter().map(|x| x.to_bits()))
                    .collect()
            };
            assert_eq!(bits(&wide), bits(&portable), "{mode:?} {est:?}");
        }
    }

    /// A K3 KL that overflows (log π fell 88+ nats below log π_ref, as a naive loss drives
    /// unlikely tokens) is logged as ∞ without touching the loss or the gradients when the KL
    /// is not in the loss, and makes the loss non-finite when it is (as on burn's path).
    #[test]
    fn an_overflowing_logged_kl_leaves_the_step_finite() {
        use crate::config::LossAggMode;
        let (vocab, n, d, b, g) = (5, 3, 8, 2, 4);
        let c = RunConfig::preset("lecture17").unwrap();
        let w = LectureWeights::init(vocab, n, d, 0.5, 1);
        let prompts: Vec<u32> = (0..b * n).map(|i| (i % vocab) as u32).collect();
        let responses: Vec<u32> = (0..b * g * n).map(|i| (i * 7 % vocab) as u32).collect();
        let advantages: Vec<f32> = (0..b * g).map(|i| i as f32 - 3.5).collect();
        for beta in [0.0, 0.1] {
            let mut f = FusedLecture::new(&w, vocab, n, d, &c);
            let logp = f.token_logp(&prompts, &responses, 1.0, None);
            let reference: Vec<f32> = logp.iter().map(|x| x + 100.0).collect();
            let s = LossSettings {
                mode: LossMode::Naive,
                epsilon_low: 0.2,
                epsilon_high: 0.2,
                beta,
                kl_in_loss: true,
                kl_estimator: KlEstimator::K3,
                agg: LossAggMode::TokenMean,
                bug_ratio_quotient: false,
                max_len: n,
                entropy_coef: 0.0,
                ..LossSettings::plain(LossMode::Naive, KlEstimator::K3, LossAggMode::TokenMean)
            };
            let (sc, _) = f.step(
                &prompts,
                &responses,
                &advantages,
                None,
                &logp,
                &reference,
                None,
                None,
                &s,
                1.0,
                0.01,
                1.0,
            );
            assert_eq!(sc.kl, f32::INFINITY);
            if beta == 0.0 {
                assert!(sc.loss.is_finite() && sc.grad_norm.is_finite(), "{sc:?}");
                assert!(f.embedding.iter().all(|x| x.is_finite()));
            } else {
                assert!(!sc.loss.is_finite(), "{sc:?}");
            }
        }
    }
}
