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
//!
//! On `run.threads` a batch of enough prompts is cut into parts (runs of whole prompts, by its
//! shape alone): each part's rows go forward, through the objective (`loss::evaluate_span`) and
//! back to `∂enc` on a thread, then each position's table gradients do; whatever adds over parts
//! or positions is added in their order, so any thread count gives the same bits (`Rows`,
//! `table_grads`).

pub use super::StepScalars;
use super::cores::{self, Blocks, Cores};
use crate::config::{ModelKind, RunConfig};
use crate::model::lecture::LectureWeights;
use crate::objective::adam::normal_or_zero;
use crate::objective::loss::{self, BatchTotals, LossSettings, SpanSums, TokenInputs, TokenTerms};
pub use crate::objective::numeric::{exp_fast, lanes8, sum_f64, sum_sq, zeroed};
use crate::objective::numeric::{row_entropy, row_softmax, sized};
use crate::objective::sampling::{self, SamplingParams};
use std::ops::Range;

mod scoring;

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
    dims: (usize, usize, usize),
    accumulate: bool,
) {
    // SAFETY: `c` is this call's own.
    unsafe { product_at((c.as_mut_ptr(), c.len()), c_rs, a, b, dims, accumulate) }
}

/// [`product_into`] into `C` at a pointer with `len` elements from it: a column block of a
/// matrix whose other blocks other threads write meanwhile ([`Blocks`]).
///
/// # Safety
/// `c` points at `len` elements that no other thread writes or reads in the block this
/// product writes (rows `0..m`, columns `0..n` at row stride `c_rs`) while it runs.
unsafe fn product_at(
    (c, len): (*mut f32, usize),
    c_rs: usize,
    a: View,
    b: View,
    (m, k, n): (usize, usize, usize),
    accumulate: bool,
) {
    assert!(a.holds(m, k) && b.holds(k, n));
    assert!(m == 0 || n == 0 || (n <= c_rs && (m - 1) * c_rs + n <= len));
    // SAFETY: the asserts above keep every element gemm reads or writes inside the slices and
    // `c`'s `len` elements, whose block the caller keeps to this call.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c,
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
/// `log Σ exp z` per row, and (when `probs` is given) the probabilities and each row's
/// entropy. `step` and `token_logp` share it, so log π_old at the first step of an iteration
/// equals the step's log π bit for bit.
#[inline(always)]
fn softmax_rows(
    logits: &[f32],
    v: usize,
    inv_t: f32,
    z: &mut [f32],
    logz: &mut [f32],
    mut probs: Option<(&mut [f32], &mut [f32])>,
) {
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
        }
    }
}

/// `out[t] = z[row(t), x_t] − log Z[row(t)]` for the responses `[B·G·n]` of `B` prompts whose
/// rows' softmax statistics `z [B·n, V]`, `logz [B·n]` hold.
#[inline(always)]
fn gather_logp(n: usize, v: usize, responses: &[u32], z: &[f32], logz: &[f32], out: &mut [f32]) {
    let b = logz.len() / n.max(1);
    let g = responses.len() / logz.len().max(1);
    // A token outside the vocabulary would read (and in the step, write) another row.
    assert!(responses.iter().all(|&t| (t as usize) < v), "token ≥ vocab");
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

/// `∂L/∂z = ∂L/∂log π · 1/T` into `terms.dlogp`: at T ≠ 1 `dlogp`'s terms again with 1/T
/// folded into each weight first (the order the lecture's tables were measured in).
#[inline(always)]
fn temper(s: &LossSettings, inv_t: f32, terms: &mut TokenTerms) {
    if inv_t != 1.0 && s.coupled() {
        // A response's ratio reaches its tokens through `couple`: the coefficients as they
        // are, then 1/T.
        terms.dlogp.iter_mut().for_each(|c| *c *= inv_t);
    } else if inv_t != 1.0 {
        let t = terms;
        let cells = t.dterm.iter().zip(&t.dkl).zip(&t.weight);
        for (c, ((&dt, &dk), &w)) in t.dlogp.iter_mut().zip(cells) {
            *c = (dt + dk) * (w * inv_t);
        }
    }
}

/// `v[from..from + len]`.
fn token_span(v: &[f32], from: usize, len: usize) -> &[f32] {
    &v[from..from + len]
}

/// `buf` cut into one slice per range of `ranges` (consecutive, from 0), `per` elements a unit.
fn split_by<'a, T>(mut buf: &'a mut [T], ranges: &[Range<usize>], per: usize) -> Vec<&'a mut [T]> {
    let mut out = Vec::with_capacity(ranges.len());
    for r in ranges {
        let (head, tail) = std::mem::take(&mut buf).split_at_mut(r.len() * per);
        out.push(head);
        buf = tail;
    }
    out
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
    /// The buffers of the passes that only score (a rollout's logits and log π, log π_ref,
    /// greedy answers), kept between calls: sized once, not refilled each iteration.
    pass: Scratch,
    cores: Cores,
    /// The least work of a part ([`PART_WORK`]; a test sets it to compare part counts).
    part_work: usize,
}

/// The work of one prompt's rows through a step (multiply-adds, roughly) is `4·n·V·D` (its
/// products, and its G responses' tokens at G ≈ 16); a part holds at least this much (~100 µs
/// on one AVX2 core): `scaled`'s 256 prompts make 8 parts, the lecture's 3 prompts and
/// `random-sort`'s 64 one — exactly the single-threaded step.
const PART_WORK: usize = 1_000_000;

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
    /// `ones`' totals (the same every step).
    ones_totals: Option<BatchTotals>,
    terms: TokenTerms,
    // backward
    dm: Vec<f32>,
    d_enc: Vec<f32>,
    dt: Vec<f32>,
    g: Grads,
    /// Each part's own buffers, and (when the batch has parts) each position's tables.
    parts: Vec<Part>,
    positions: Vec<Position>,
    /// Each half of the batch's parts' share of each position's `∂M_p`, `∂T_p` (`[half·n + p]`).
    halves: Vec<Half>,
    /// `Σ x²` of the gradient's three arrays, where the positions' jobs added them up (the
    /// last backward over parts; `None` after one in turn).
    grad_sq: Option<[f32; 3]>,
}

/// A part's own buffers: its responses' objective terms and sums when they are its own.
#[derive(Debug, Clone, Default)]
struct Part {
    terms: TokenTerms,
    sums: SpanSums,
}

/// One position's table gradients `∂T_p [V, D]`, `∂M_p [D, V]` and its share of `∂E`,
/// computed on the threads when the batch has parts (its tables `T_p`, `M_p` and its blocks of
/// `∂encode` and `∂decode` go straight into their place in the whole: [`Blocks`]).
#[derive(Debug, Clone, Default)]
struct Position {
    dt: Vec<f32>,
    dm: Vec<f32>,
    embedding: Vec<f32>,
    /// `Σ x²` of its `∂encode` block and of its `∂decode` columns.
    sq: [f32; 2],
}

/// One half of a batch's parts' share of a position's table gradients: `∂M_p [D, V]` and
/// `∂T_p [V, D]` over its rows.
#[derive(Debug, Clone, Default)]
struct Half {
    dm: Vec<f32>,
    dt: Vec<f32>,
}

/// What a forward over the parts reads: the logits, then their softmax statistics (and
/// log π of the responses given), then the probabilities and entropies too.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
enum Read {
    Logits,
    LogProbs,
    Softmax,
}

/// Where a backward over the parts reads `∂L/∂z` of each response token: the whole batch's
/// coefficients, or nowhere (`dlogits` holds ∂L/∂logits).
#[derive(Debug, Clone, Copy)]
enum Dlogp<'a> {
    Whole(&'a [f32]),
    Given,
}

/// The shape and the tables every part reads (`Forward::t`, `Forward::m`).
struct Tables<'a> {
    n: usize,
    d: usize,
    v: usize,
    t: &'a [f32],
    m: &'a [f32],
}

/// One part's rows of the batch-wide buffers — its prompts, their `(prompt, position)` rows,
/// their responses' tokens — and its own buffers.
struct Rows<'a> {
    prompts: &'a [u32],
    responses: &'a [u32],
    support: Option<&'a [u64]>,
    enc: &'a mut [f32],
    logits: &'a mut [f32],
    z: &'a mut [f32],
    logz: &'a mut [f32],
    probs: &'a mut [f32],
    row_h: &'a mut [f32],
    logp: &'a mut [f32],
    dlogits: &'a mut [f32],
    row_coef: &'a mut [f32],
    d_enc: &'a mut [f32],
    own: &'a mut Part,
}

/// A span of one weight array, its gradient and Adam moments (the step runs spans on the
/// threads; element by element, so any cut gives the same bits).
struct AdamSpan<'a> {
    w: &'a mut [f32],
    g: &'a [f32],
    m: &'a mut [f32],
    v: &'a mut [f32],
}

/// `w` with its gradient `g` and moments cut into `k` spans of near-equal length (span `i`
/// from `i·len/k`).
fn adam_spans<'a>(
    mut w: &'a mut [f32],
    mut g: &'a [f32],
    st: &'a mut AdamMoments,
    k: usize,
) -> Vec<AdamSpan<'a>> {
    let len = w.len();
    let (mut m, mut v) = (&mut st.m[..], &mut st.v[..]);
    (0..k)
        .map(|i| {
            let take = (i + 1) * len / k - i * len / k;
            let (w0, w1) = std::mem::take(&mut w).split_at_mut(take);
            let (g0, g1) = g.split_at(take);
            let (m0, m1) = std::mem::take(&mut m).split_at_mut(take);
            let (v0, v1) = std::mem::take(&mut v).split_at_mut(take);
            (w, g, m, v) = (w1, g1, m1, v1);
            AdamSpan {
                w: w0,
                g: g0,
                m: m0,
                v: v0,
            }
        })
        .collect()
}

impl AdamSpan<'_> {
    avx2_dispatch! {
        fn apply via apply_avx2 => apply_body(&mut self, adam: &crate::objective::adam::AdamStep) -> ()
    }

    #[inline(always)]
    fn apply_body(&mut self, adam: &crate::objective::adam::AdamStep) {
        adam.apply(self.w, self.g, self.m, self.v);
    }
}

impl Rows<'_> {
    avx2_dispatch! {
        fn forward via forward_avx2 => forward_body(&mut self, net: &Tables, inv_t: f32, read: Read) -> ()
    }

    /// This part's logits (`enc = Σ_p T_p[x_p]`, `logits = enc · M`), then what `read` asks.
    #[inline(always)]
    fn forward_body(&mut self, net: &Tables, inv_t: f32, read: Read) {
        let (n, d, v) = (net.n, net.d, net.v);
        let b = self.prompts.len() / n;
        // Zeroed here, by each part on its thread (a memset of the whole batch's `enc` before
        // the parts was ~1 % of a `scaled` step, on one thread).
        self.enc.fill(0.0);
        for (i, row) in self.enc.chunks_exact_mut(d).enumerate() {
            for (p, &tok) in self.prompts[i * n..(i + 1) * n].iter().enumerate() {
                let from = tok as usize * n * d + p * d;
                for (e, &x) in row.iter_mut().zip(&net.t[from..from + d]) {
                    *e += x;
                }
            }
        }
        let (enc, m) = (View::rows(self.enc, d), View::rows(net.m, n * v));
        product_into(self.logits, n * v, enc, m, (b, d, n * v), false);
        self.score(net, inv_t, read);
    }

    /// The softmax statistics of this part's logits (over the sampler's support when given)
    /// and log π of its responses, and the probabilities and entropies when `read` asks.
    #[inline(always)]
    fn score(&mut self, net: &Tables, inv_t: f32, read: Read) {
        if read == Read::Logits {
            return;
        }
        let (n, v) = (net.n, net.v);
        keep_supports(self.logits, v, n, self.support);
        let probs = (read == Read::Softmax).then_some((&mut *self.probs, &mut *self.row_h));
        softmax_rows(self.logits, v, inv_t, self.z, self.logz, probs);
        if !self.responses.is_empty() {
            gather_logp(n, v, self.responses, self.z, self.logz, self.logp);
        }
    }

    avx2_dispatch! {
        fn objective via objective_avx2 => objective_body(
            &mut self,
            s: &LossSettings,
            x: &TokenInputs,
            totals: &BatchTotals,
            inv_t: f32,
        ) -> ()
    }

    /// This part's responses' objective terms (`x` their inputs) into its own `terms`, their
    /// coefficients at 1/T.
    #[inline(always)]
    fn objective_body(
        &mut self,
        s: &LossSettings,
        x: &TokenInputs,
        totals: &BatchTotals,
        inv_t: f32,
    ) {
        let own = &mut *self.own;
        own.sums = loss::evaluate_span(s, x, totals, &mut own.terms);
        temper(s, inv_t, &mut own.terms);
    }

    avx2_dispatch! {
        fn backward via backward_avx2 => backward_body(&mut self, net: &Tables, dlogp: Option<&[f32]>) -> ()
    }

    /// This part's `∂L/∂logits` from `dlogp` (∂L/∂z of each response token's own logit, 1/T
    /// included; `None`: `dlogits` already holds them) with `probs` its rows' softmax, then its
    /// rows' `∂enc`.
    #[inline(always)]
    fn backward_body(&mut self, net: &Tables, dlogp: Option<&[f32]>) {
        let (n, d, v) = (net.n, net.d, net.v);
        let b = self.prompts.len() / n;
        if let Some(dlogp) = dlogp {
            // d log π / d z = onehot − softmax: the one-hot part per token, the softmax part
            // once per row with the summed coefficient.
            let g = dlogp.len() / self.prompts.len().max(1);
            self.dlogits.fill(0.0);
            self.row_coef.fill(0.0);
            for (bi, (rc, drows)) in self
                .row_coef
                .chunks_exact_mut(n)
                .zip(self.dlogits.chunks_exact_mut(n * v))
                .enumerate()
            {
                for gi in 0..g {
                    let span = (bi * g + gi) * n..(bi * g + gi + 1) * n;
                    for (r, &c) in rc.iter_mut().zip(&dlogp[span.clone()]) {
                        *r += c;
                    }
                    let cells = dlogp[span.clone()].iter().zip(&self.responses[span]);
                    for (p, (&c, &tok)) in cells.enumerate() {
                        drows[p * v + tok as usize] += c;
                    }
                }
            }
            let rows = self
                .dlogits
                .chunks_exact_mut(v)
                .zip(self.probs.chunks_exact(v));
            for ((drow, prow), &c) in rows.zip(self.row_coef.iter()) {
                // A confident policy's unlikely tokens give values below f32's normal range
                // (~1e-40), and every product that reads a subnormal is many times slower on
                // x86; no weight moves by a gradient that small (Adam's update underflows too).
                for (dl, &pr) in drow.iter_mut().zip(prow) {
                    *dl = normal_or_zero(*dl - c * pr);
                }
            }
        }
        // logits = enc · M: this part's rows of ∂enc (∂M sums over every row: by position).
        let dl = View::rows(self.dlogits, n * v);
        let m_t = View::rows(net.m, n * v).t();
        product_into(self.d_enc, d, dl, m_t, (b, n * v, d), false);
    }
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
            pass: Scratch::default(),
            cores: Cores::default(),
            part_work: PART_WORK,
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

    /// A copy of the weights alone (no Adam state, no buffers), on the same threads: the
    /// reference, which only scores.
    pub fn weights_copy(&self) -> Self {
        Self {
            embedding: self.embedding.clone(),
            encode: self.encode.clone(),
            decode_t: self.decode_t.clone(),
            adam: Default::default(),
            scratch: Scratch::default(),
            pass: Scratch::default(),
            cores: self.cores.clone(),
            ..*self
        }
    }

    /// Run the parts on `threads` threads (0 = every core; 1, the default, none).
    pub fn with_threads(mut self, threads: usize) -> Self {
        self.cores = Cores::new(threads);
        self
    }

    /// The threads the parts run on.
    pub fn threads(&self) -> usize {
        self.cores.threads()
    }

    /// Those threads.
    pub fn cores(&self) -> &Cores {
        &self.cores
    }

    /// The parts of `b` prompts: a function of the shape alone, so the results do not depend
    /// on the threads, and the same for every pass over a batch (the rollout's logits, the
    /// step's, log π_old's), so they agree bit for bit.
    fn parts_of(&self, b: usize) -> Vec<Range<usize>> {
        cores::parts_at(b, self.n * self.vocab * 4 * self.d, self.part_work)
    }

    /// The per-position tables `T_p = E · encode_p` into `f.t [V, n·D]` and `M_p = decode_p ·
    /// Eᵀ` into `f.m [D, n·V]`: in turn for one part, by position on the threads for several.
    #[inline(always)]
    fn tables(&self, parts: usize, f: &mut Forward) {
        let (n, d, v) = (self.n, self.d, self.vocab);
        let emb = View::rows(&self.embedding, d);
        let encode_p = |p: usize| View::rows(&self.encode, d).at(p * d * d);
        let decode_p = |p: usize| View::rows(&self.decode_t, n * d).at(p * d);
        // Each position's products straight into its column blocks of T and M (every element
        // is written: no memset first).
        let t = Blocks::new(sized(&mut f.t, v * n * d));
        let m = Blocks::new(sized(&mut f.m, d * n * v));
        let position = |p: usize| {
            // SAFETY: position p's call alone writes columns p·D.. of T and p·V.. of M, which
            // nothing reads before the last call returns.
            unsafe {
                product_at(t.at(p * d), n * d, emb, encode_p(p), (v, d, d), false);
                product_at(m.at(p * v), n * v, decode_p(p), emb.t(), (d, d, v), false);
            }
        };
        if parts <= 1 {
            (0..n).for_each(position);
        } else {
            self.cores.each(&mut vec![(); n], |p, _| position(p));
        }
    }

    /// The forward of `prompts [B·n]` cut into parts: the tables, then each part's rows on the
    /// threads — their logits (unless `given`: `sc.f.logits` already holds them) and what
    /// `read` asks, log π of `responses [B·G·n]` when given. Returns the parts.
    #[allow(clippy::too_many_arguments)]
    fn forward_parts(
        &self,
        prompts: &[u32],
        responses: &[u32],
        support: Option<&[u64]>,
        inv_t: f32,
        read: Read,
        given: bool,
        sc: &mut Scratch,
    ) -> Vec<Range<usize>> {
        let ranges = self.prepare_forward(prompts, responses, read, given, sc);
        let (net, mut parts) = self.rows_of(prompts, responses, support, &ranges, sc);
        self.cores.each(&mut parts, |_, r| match given {
            true => r.score(&net, inv_t, read),
            false => r.forward(&net, inv_t, read),
        });
        ranges
    }

    /// The parts of `prompts`, their tables (unless `given`) and the forward's buffers sized
    /// for what `read` asks.
    fn prepare_forward(
        &self,
        prompts: &[u32],
        responses: &[u32],
        read: Read,
        given: bool,
        sc: &mut Scratch,
    ) -> Vec<Range<usize>> {
        let (n, v) = (self.n, self.vocab);
        let b = prompts.len() / n;
        let ranges = self.parts_of(b);
        if !given {
            self.tables(ranges.len(), &mut sc.f);
        }
        let rows = b * n;
        // A buffer this read does not fill keeps its length and stale values (no pass reads
        // them): cut to nothing, it would be filled anew by the next pass that reads it — a
        // rollout's sampling pass, then log π_old's, then the step's, every iteration.
        if read >= Read::LogProbs {
            sized(&mut sc.z, rows * v);
            sized(&mut sc.logz, rows);
        }
        if read >= Read::Softmax {
            sized(&mut sc.probs, rows * v);
            sized(&mut sc.row_h, rows);
        }
        if read >= Read::LogProbs && !responses.is_empty() {
            // (Without responses it keeps the last step's: the entropy lab's second forward.)
            sized(&mut sc.logp, responses.len());
        }
        if !given {
            sized(&mut sc.f.enc, b * self.d);
            sized(&mut sc.f.logits, rows * v);
        }
        ranges
    }

    /// The backward's buffers sized for `prompts` (`∂logits` too unless already `given`).
    fn prepare_backward(&self, prompts: &[u32], given: bool, sc: &mut Scratch) {
        let rows = prompts.len();
        if !given {
            sized(&mut sc.dlogits, rows * self.vocab);
            sized(&mut sc.row_coef, rows);
        }
        sized(&mut sc.d_enc, rows / self.n * self.d);
    }

    /// The batch-wide buffers of `sc` cut at the parts `ranges` of `prompts` (each buffer by
    /// its length per prompt; one not sized for this batch, into empty slices), with the
    /// tables they read.
    fn rows_of<'a>(
        &self,
        prompts: &'a [u32],
        responses: &'a [u32],
        support: Option<&'a [u64]>,
        ranges: &[Range<usize>],
        sc: &'a mut Scratch,
    ) -> (Tables<'a>, Vec<Rows<'a>>) {
        let n = self.n;
        let b = prompts.len() / n;
        let Scratch {
            f,
            z,
            logz,
            probs,
            row_h,
            dlogits,
            logp,
            row_coef,
            d_enc,
            parts,
            ..
        } = sc;
        parts.resize_with(ranges.len(), Part::default);
        let per = |len: usize| match b {
            0 => 0,
            _ if len.is_multiple_of(b) => len / b,
            _ => 0,
        };
        macro_rules! cut {
            ($buf:expr) => {{
                let per = per($buf.len());
                split_by(&mut $buf[..], ranges, per).into_iter()
            }};
        }
        let g = responses.len() / b.max(1);
        let per_s = support.map_or(0, |s| s.len() / b.max(1));
        let mut enc = cut!(f.enc);
        let mut logits = cut!(f.logits);
        let (mut z, mut logz, mut probs, mut row_h) =
            (cut!(z), cut!(logz), cut!(probs), cut!(row_h));
        let (mut dlogits, mut row_coef, mut d_enc) = (cut!(dlogits), cut!(row_coef), cut!(d_enc));
        let mut logp = cut!(logp);
        let rows = ranges
            .iter()
            .zip(parts.iter_mut())
            .map(|(r, own)| Rows {
                prompts: &prompts[r.start * n..r.end * n],
                responses: &responses[r.start * g..r.end * g],
                support: support.map(|s| &s[r.start * per_s..r.end * per_s]),
                enc: enc.next().expect("a slice per part"),
                logits: logits.next().expect("a slice per part"),
                z: z.next().expect("a slice per part"),
                logz: logz.next().expect("a slice per part"),
                probs: probs.next().expect("a slice per part"),
                row_h: row_h.next().expect("a slice per part"),
                logp: logp.next().expect("a slice per part"),
                dlogits: dlogits.next().expect("a slice per part"),
                row_coef: row_coef.next().expect("a slice per part"),
                d_enc: d_enc.next().expect("a slice per part"),
                own,
            })
            .collect();
        let net = Tables {
            n,
            d: self.d,
            v: self.vocab,
            t: &f.t,
            m: &f.m,
        };
        (net, rows)
    }

    /// Every part's backward on the threads — from `dlogp [B·G·n]` (whole, or each part's own
    /// terms; or `sc.dlogits` already holds ∂L/∂logits) — then the weights' gradient into
    /// `sc.g`.
    fn backward_parts(
        &self,
        prompts: &[u32],
        responses: &[u32],
        ranges: &[Range<usize>],
        dlogp: Dlogp,
        sc: &mut Scratch,
    ) {
        let per_prompt = responses.len() / (prompts.len() / self.n).max(1);
        self.prepare_backward(prompts, matches!(dlogp, Dlogp::Given), sc);
        let (net, mut parts) = self.rows_of(prompts, responses, None, ranges, sc);
        self.cores.each(&mut parts, |j, r| match dlogp {
            Dlogp::Whole(w) => {
                let span = ranges[j].start * per_prompt..ranges[j].end * per_prompt;
                r.backward(&net, Some(&w[span]));
            }
            Dlogp::Given => r.backward(&net, None),
        });
        drop(parts);
        self.table_grads(prompts, ranges.len(), sc);
    }

    /// `∂T_p` from the rows' `∂enc` (`enc[b] = Σ_p T_p[x_bp]`: each row back to its token's
    /// row of `T_p`), into `dt` whose row `tok` starts at `tok·rs + at`.
    #[inline(always)]
    fn scatter_dt(
        &self,
        p: usize,
        prompts: &[u32],
        d_enc: &[f32],
        dt: &mut [f32],
        rs: usize,
        at: usize,
    ) {
        let (n, d) = (self.n, self.d);
        for (row, x) in d_enc.chunks_exact(d).zip(prompts.chunks_exact(n)) {
            let to = x[p] as usize * rs + at;
            for (g, &e) in dt[to..to + d].iter_mut().zip(row) {
                *g += e;
            }
        }
    }

    /// Position `p`'s gradients from `∂M_p [D, V]` and `∂T_p [V, D]`: `∂decode_p` into `decode`
    /// (row stride `rs`), `∂encode_p` into `encode`, and `∂E`'s share added to `embedding`
    /// (written when `!add`).
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn position_grads(
        &self,
        p: usize,
        (dm, dt): (View, View),
        decode: &Blocks,
        encode: &mut [f32],
        embedding: &mut [f32],
        add: bool,
    ) {
        let (n, d, v) = (self.n, self.d, self.vocab);
        let emb = View::rows(&self.embedding, d);
        let encode_p = View::rows(&self.encode, d).at(p * d * d);
        let decode_p = View::rows(&self.decode_t, n * d).at(p * d);
        // M_p = decode_p · Eᵀ, into position p's column block of ∂decode [D, n·D].
        // SAFETY: only position p's call writes those columns (one call at a time, or one per
        // position on the threads), and nothing reads them meanwhile.
        unsafe { product_at(decode.at(p * d), n * d, dm, emb, (d, v, d), false) };
        product_into(embedding, d, dm.t(), decode_p, (v, d, d), add);
        // T_p = E · encode_p
        product_into(encode, d, emb.t(), dt, (d, v, d), false);
        product_into(embedding, d, dt, encode_p.t(), (v, d, d), true);
    }

    /// The weights' gradient into `sc.g` from the rows' `∂logits` (`sc.dlogits`) and `∂enc`
    /// (`sc.d_enc`) through `∂M = encᵀ·∂logits` and `∂T`: whole and position by position in
    /// turn for one part; for several, on the threads: each position's `∂M_p`, `∂T_p` over
    /// each half of the parts' rows, then each position's products (its two halves added in
    /// half order) and its share of the squared norm; the `∂E` shares and the norm's added in
    /// position order (the same bits on any number of threads). Sets `sc.grad_sq` where the
    /// positions' jobs summed it (`None` for one part).
    fn table_grads(&self, prompts: &[u32], parts: usize, sc: &mut Scratch) {
        let (n, d, v) = (self.n, self.d, self.vocab);
        let b = prompts.len() / n;
        let g = &mut sc.g;
        // ∂E adds up over positions; ∂encode and ∂decode are written whole below.
        zeroed(&mut g.embedding, v * d);
        sized(&mut g.encode, n * d * d);
        sized(&mut g.decode_t, d * n * d);
        let (enc, dl) = (View::rows(&sc.f.enc, d), View::rows(&sc.dlogits, n * v));
        if parts <= 1 {
            let dm = zeroed(&mut sc.dm, d * n * v);
            product_into(dm, n * v, enc.t(), dl, (d, b, n * v), false);
            let dt = zeroed(&mut sc.dt, v * n * d);
            for p in 0..n {
                self.scatter_dt(p, prompts, &sc.d_enc, dt, n * d, p * d);
            }
            let decode = Blocks::new(&mut g.decode_t);
            for p in 0..n {
                let dm_p = View::rows(&sc.dm, n * v).at(p * v);
                let dt_p = View::rows(&sc.dt, n * d).at(p * d);
                let encode = &mut g.encode[p * d * d..];
                self.position_grads(p, (dm_p, dt_p), &decode, encode, &mut g.embedding, true);
            }
            sc.grad_sq = None;
            return;
        }
        let positions = &mut sc.positions;
        positions.resize_with(n, Position::default);
        let d_enc = &sc.d_enc;
        // First each half of the parts' rows, each position's share of `∂M_p` and `∂T_p`: the
        // halves' jobs come first in the order the threads take them, so that on two threads
        // each reads back the rows its own parts wrote (the activations and their gradients,
        // ~100 KiB that a position's job over every row would read from the other core).
        // Then each position adds its two shares (in half order: the same bits on any number
        // of threads).
        let ranges = self.parts_of(b);
        let mid = ranges[ranges.len() / 2].start;
        let halves = [0..mid, mid..b];
        sc.halves.resize_with(2 * n, Half::default);
        self.cores.each(&mut sc.halves, |i, half| {
            let (rows, p) = (halves[i / n].clone(), i % n);
            let m = rows.len();
            let enc = View::rows(&sc.f.enc[rows.start * d..], d);
            let dl = View::rows(&sc.dlogits[rows.start * n * v..], n * v);
            let dm = zeroed(&mut half.dm, d * v);
            product_into(dm, v, enc.t(), dl.at(p * v), (d, m, v), false);
            let dt = zeroed(&mut half.dt, v * d);
            let (x, de) = (
                &prompts[rows.start * n..rows.end * n],
                &d_enc[rows.start * d..],
            );
            self.scatter_dt(p, x, &de[..m * d], dt, d, 0);
        });
        let shares = &sc.halves;
        // Each position writes its own block of ∂encode in place, its column block of ∂decode
        // in place and its ∂E share aside (`position_grads` overwrites each before adding: no
        // memset first).
        let decode = Blocks::new(&mut g.decode_t);
        let mut jobs: Vec<(&mut Position, &mut [f32])> = positions
            .iter_mut()
            .zip(g.encode.chunks_exact_mut(d * d))
            .collect();
        self.cores.each(&mut jobs, |p, (pos, encode)| {
            let (first, second) = (&shares[p], &shares[n + p]);
            let dm = sized(&mut pos.dm, d * v);
            for ((x, &a), &c) in dm.iter_mut().zip(&first.dm).zip(&second.dm) {
                *x = a + c;
            }
            let dt = sized(&mut pos.dt, v * d);
            for ((x, &a), &c) in dt.iter_mut().zip(&first.dt).zip(&second.dt) {
                *x = a + c;
            }
            let views = (View::rows(&pos.dm, v), View::rows(&pos.dt, d));
            let emb = sized(&mut pos.embedding, v * d);
            self.position_grads(p, views, &decode, encode, emb, false);
            // Its share of the squared norm, read while this core holds what it wrote: its
            // ∂encode block, then its ∂decode columns row by row.
            let decode_sq = (0..d).fold(0.0f32, |sq, row| {
                // SAFETY: position p's columns of this row, which only this call wrote (above)
                // and nothing else reads or writes while the jobs run.
                let at = unsafe { decode.at(row * n * d + p * d).0 };
                sq + sum_sq(unsafe { std::slice::from_raw_parts(at, d) })
            });
            pos.sq = [sum_sq(encode), decode_sq];
        });
        // ∂E as the positions' shares added in position order.
        let positions = &sc.positions;
        let shares: Vec<&[f32]> = positions.iter().map(|p| &p.embedding[..]).collect();
        self.cores.sum_in_order(&shares, &mut g.embedding);
        // The squared norm's shares added in position order (the same bits on any number of
        // threads).
        let [encode_sq, decode_sq] =
            (positions.iter()).fold([0.0f32; 2], |[e, d], p| [e + p.sq[0], d + p.sq[1]]);
        sc.grad_sq = Some([sum_sq(&g.embedding), encode_sq, decode_sq]);
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
        let grad_sq = sc.grad_sq.take();
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
        // Added up by the positions' jobs where the batch has parts; else by spans on the
        // threads (a fixed cut: the same bits on any number of them either way).
        let [e, enc, dec] = grad_sq
            .unwrap_or_else(|| (self.cores).sums_sq([&gr.embedding, &gr.encode, &gr.decode_t]));
        let grad_norm = (e + enc + dec).sqrt();
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
        // Element by element: spans of the three arrays on the threads give the same bits.
        // Each array is cut into the same `n` fractions and the spans ordered fraction by
        // fraction, so a thread's block of them holds the same share of every array: for
        // `encode` the positions, and for `decode` the rows, whose gradient blocks that
        // thread's position and row jobs wrote (the jobs' blocks are split by the same rule,
        // so the shares coincide where the thread count divides `n`; any cut gives the bits).
        let fractions = self.n.max(1);
        let arrays = [&mut self.embedding, &mut self.encode, &mut self.decode_t]
            .into_iter()
            .zip([&gr.embedding, &gr.encode, &gr.decode_t])
            .zip(self.adam.iter_mut());
        let mut cut: Vec<std::vec::IntoIter<AdamSpan>> = arrays
            .map(|((w, g), st)| adam_spans(w, g, st, fractions).into_iter())
            .collect();
        let mut spans: Vec<AdamSpan> = Vec::with_capacity(3 * fractions);
        for _ in 0..fractions {
            spans.extend(cut.iter_mut().filter_map(|c| c.next()));
        }
        let weights = spans.iter().map(|s| s.w.len()).sum();
        self.cores
            .each_worth(weights, &mut spans, |_, span| span.apply(&adam));
        let (entropy_measured, entropy_first_order) = match dynamics {
            Some((dh, before)) => {
                let inv_t = 1.0 / temperature;
                let after = self
                    .forward_softmax(x.prompts, &[], inv_t, x.support, &mut sc)
                    .1;
                let step = crate::objective::entropy_dynamics::first_order(
                    &self.flat_weights(),
                    &before,
                    &dh,
                );
                (
                    Some(((after - entropy) / rows as f64) as f32),
                    Some(step as f32),
                )
            }
            None => (None, None),
        };
        // The entropy per `(prompt, position)` row (this step scores rows, not tokens).
        let scalars = StepScalars {
            entropy: (entropy / rows as f64) as f32,
            entropy_measured,
            entropy_first_order,
            ..StepScalars::of(&sc.terms, grad_norm)
        };
        let logp = self.cores.to_vec(&sc.logp);
        self.scratch = sc;
        (scalars, logp)
    }

    /// The loss's gradient on a batch into `sc.g` (the step's scalars in `sc.terms`, log π in
    /// `sc.logp`); returns the summed entropy of the `(prompt, position)` rows. With several
    /// parts each part's responses' objective terms are its own (`loss::evaluate_span`) unless a
    /// batch-level rule needs them whole.
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
        // The objective over every token (all responses have n tokens: the mask is all ones).
        let tokens = b * g * n;
        if sc.ones.len() != tokens {
            sc.ones = vec![1.0; tokens];
            sc.ones_totals = None;
        }
        if self.parts_of(b).len() > 1 && loss::splits(s) {
            // Each part's forward, objective and backward in one go on the threads.
            let ranges = self.prepare_forward(prompts, responses, Read::Softmax, false, sc);
            self.prepare_backward(prompts, false, sc);
            let totals = *(sc.ones_totals).get_or_insert_with(|| BatchTotals::of(&sc.ones, n));
            let ones = std::mem::take(&mut sc.ones);
            let (net, mut parts) = self.rows_of(prompts, responses, support, &ranges, sc);
            self.cores.each(&mut parts, |j, r| {
                r.forward(&net, inv_t, Read::Softmax);
                // This part's responses and their tokens.
                let (r0, len) = (ranges[j].start * g, ranges[j].len() * g);
                let tok = |v| token_span(v, r0 * n, len * n);
                let logp = std::mem::take(&mut r.logp);
                let own = TokenInputs {
                    logp,
                    old_logp: tok(old_logp),
                    ref_logp: tok(ref_logp),
                    sampler_logp: sampler_logp.map(tok),
                    advantages: match token_advantages {
                        Some(per_token) => tok(per_token),
                        None => token_span(advantages, r0, len),
                    },
                    mask: tok(&ones),
                    entropy: None,
                    t: n,
                };
                r.objective(s, &own, &totals, inv_t);
                r.logp = logp;
                let dlogp = std::mem::take(&mut r.own.terms.dlogp);
                r.backward(&net, Some(&dlogp));
                r.own.terms.dlogp = dlogp;
            });
            drop(parts);
            sc.ones = ones;
            let sums: Vec<SpanSums> = sc.parts.iter().map(|p| p.sums).collect();
            loss::finish(&sums, &mut sc.terms);
            self.table_grads(prompts, ranges.len(), sc);
            return sc.row_h.iter().fold(0.0f64, |a, &h| a + h as f64);
        }
        let (ranges, entropy) = self.forward_softmax(prompts, responses, inv_t, support, sc);
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
        temper(s, inv_t, &mut sc.terms);
        let dlogp = std::mem::take(&mut sc.terms.dlogp);
        self.backward_parts(prompts, responses, &ranges, Dlogp::Whole(&dlogp), sc);
        sc.terms.dlogp = dlogp;
        entropy
    }

    /// The logits of a batch and the softmax of each (prompt, position) row at temperature
    /// `1/inv_t` (over the sampler's support when given; log π of `responses` when given) into
    /// `sc`; returns the parts and the rows' summed entropy.
    #[inline(always)]
    fn forward_softmax(
        &self,
        prompts: &[u32],
        responses: &[u32],
        inv_t: f32,
        support: Option<&[u64]>,
        sc: &mut Scratch,
    ) -> (Vec<Range<usize>>, f64) {
        let ranges =
            self.forward_parts(prompts, responses, support, inv_t, Read::Softmax, false, sc);
        let entropy = sc.row_h.iter().fold(0.0f64, |a, &h| a + h as f64);
        (ranges, entropy)
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
        zeroed(&mut sc.row_coef, rows);
        let ranges = self.parts_of(rows / self.n);
        self.backward_parts(prompts, &[], &ranges, Dlogp::Given, sc);
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
        let (ranges, _) = self.forward_softmax(prompts, &[], inv_t, None, &mut sc);
        let dlogp: Vec<f32> = coef.iter().map(|&c| c * inv_t).collect();
        self.backward_parts(prompts, responses, &ranges, Dlogp::Whole(&dlogp), &mut sc);
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

    /// `b` random prompts of `n` tokens, `g` random responses each, one advantage per response.
    fn random_batch(
        rng: &mut crate::rng::SplitMix64,
        vocab: usize,
        n: usize,
        b: usize,
        g: usize,
    ) -> (Vec<u32>, Vec<u32>, Vec<f32>) {
        let mut tokens =
            |len: usize| -> Vec<u32> { (0..len).map(|_| rng.below(vocab as u64) as u32).collect() };
        let (prompts, responses) = (tokens(b * n), tokens(b * g * n));
        let advantages = (0..b * g).map(|_| rng.normal() as f32).collect();
        (prompts, responses, advantages)
    }

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
        let (prompts, responses, advantages) = random_batch(&mut rng, vocab, n, b, g);
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
                let a = wide.step_batch(&x, &s, 0.9, 0.01, 0.5);
                use std::sync::atomic::Ordering::Relaxed;
                crate::engine::PORTABLE_ONLY.store(true, Relaxed);
                let p = portable.step_batch(&x, &s, 0.9, 0.01, 0.5);
                crate::engine::PORTABLE_ONLY.store(false, Relaxed);
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

    /// A confident policy's unlikely tokens give `c·p` below f32's normal range; the step's
    /// `∂L/∂logits` holds none of them (0 instead), so no product downstream reads a subnormal.
    #[test]
    fn a_confident_policy_s_logit_gradients_hold_no_subnormals() {
        use crate::config::LossAggMode;
        use crate::rng::SplitMix64;
        let (vocab, n, d, b, g) = (16, 4, 16, 64, 8);
        let c = RunConfig::preset("lecture17").unwrap();
        // Large weights: some tokens ~85 nats below their row's best (p ~1e-37).
        let w = LectureWeights::init(vocab, n, d, 3.0, 5);
        let mut rng = SplitMix64::new(3);
        let (prompts, responses, advantages) = random_batch(&mut rng, vocab, n, b, g);
        let mut f = FusedLecture::new(&w, vocab, n, d, &c);
        let logp = f.token_logp(&prompts, &responses, 1.0, None);
        let s = LossSettings::plain(LossMode::Naive, KlEstimator::K3, LossAggMode::TokenMean);
        let x = Batch {
            prompts: &prompts,
            responses: &responses,
            advantages: &advantages,
            token_advantages: None,
            old_logp: &logp,
            ref_logp: &logp,
            sampler_logp: None,
            support: None,
        };
        let (scalars, _) = f.step_batch(&x, &s, 1.0, 1e-3, 0.0);
        assert!(scalars.loss.is_finite());
        let sc = &f.scratch;
        // The case arises: some row's coefficient times a probability is subnormal.
        let tiny = (sc.probs.chunks_exact(vocab).zip(&sc.row_coef))
            .flat_map(|(row, &c)| row.iter().map(move |&p| c * p))
            .filter(|v| v.is_subnormal())
            .count();
        assert!(tiny > 0, "no subnormal c·p: the case is not exercised");
        let sub = sc.dlogits.iter().filter(|v| v.is_subnormal()).count();
        assert_eq!(sub, 0, "{sub} subnormal entries of ∂L/∂logits");
        assert!(sc.dlogits.iter().any(|&v| v != 0.0));
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

    /// A batch the step cuts into parts gives the same step on 1, 2 and 3 threads bit for bit,
    /// and the one-part step's up to the sums' order; log π_old from the rollout's logits equals
    /// the step's log π bit for bit with parts too.
    #[test]
    fn parts_give_the_same_step_on_any_number_of_threads() {
        use crate::config::LossAggMode;
        use crate::rng::SplitMix64;
        let (vocab, n, d, b, g) = (7, 4, 16, 40, 3);
        let c = RunConfig::preset("lecture17").unwrap();
        let w = LectureWeights::init(vocab, n, d, 0.5, 4);
        let (prompts, responses, advantages) =
            random_batch(&mut SplitMix64::new(2), vocab, n, b, g);
        let make = |threads: usize, part_work: usize| {
            let mut f = FusedLecture::new(&w, vocab, n, d, &c).with_threads(threads);
            f.part_work = part_work;
            f
        };
        let one = make(1, usize::MAX);
        assert_eq!(one.parts_of(b).len(), 1);
        assert_eq!(make(1, 1).parts_of(b).len(), cores::MAX_PARTS);
        let old = one.token_logp(&prompts, &responses, 0.8, None);
        let reference: Vec<f32> = old.iter().map(|x| x - 0.1).collect();
        let mut s = LossSettings::plain(LossMode::Clipped, KlEstimator::K3, LossAggMode::TokenMean);
        s.beta = 0.05;
        let step = |f: &mut FusedLecture, support: Option<&[u64]>| {
            let (a, r) = (&advantages, &reference);
            f.step(
                &prompts, &responses, a, None, &old, r, None, support, &s, 0.8, 0.01, 0.0,
            )
        };
        let run = |mut f: FusedLecture| {
            f.pass_forward(&prompts);
            let from_rollout = f.pass_logp(&prompts, &responses, 0.8, None, true);
            let mut out = Vec::new();
            for _ in 0..3 {
                let (sc, logp) = step(&mut f, None);
                if out.is_empty() {
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&logp), bits(&from_rollout));
                }
                out.push(sc);
            }
            (out, f.flat_weights())
        };
        let (whole, w_whole) = run(make(1, usize::MAX));
        let (parts, w_parts) = run(make(1, 1));
        for threads in [2, 3] {
            let (sc, w) = run(make(threads, 1));
            assert_eq!(sc, parts, "{threads} threads");
            assert!(
                w.iter()
                    .zip(&w_parts)
                    .all(|(a, b)| a.to_bits() == b.to_bits())
            );
        }
        let close = |a: f32, b: f32| (a - b).abs() <= 1e-4 * (1.0 + b.abs());
        for (a, b) in parts.iter().zip(&whole) {
            assert!(close(a.loss, b.loss) && close(a.kl, b.kl) && close(a.grad_norm, b.grad_norm));
            assert!(
                close(a.entropy, b.entropy) && a.clip_low == b.clip_low,
                "{a:?} vs {b:?}"
            );
        }
        assert!(w_parts.iter().zip(&w_whole).all(|(&a, &b)| close(a, b)));
        assert_ne!(
            w_parts, w_whole,
            "parts sum in another order (else the test shows nothing)"
        );
        // The entropy lab's second forward (no responses) over the sampler's support, by parts.
        let support = vec![(1u64 << vocab) - 1; responses.len()];
        let dynamics = |threads: usize| {
            let mut f = make(threads, 1);
            f.entropy_dynamics = true;
            let (sc, logp) = step(&mut f, Some(&support));
            assert_eq!(logp.len(), responses.len());
            assert!(sc.entropy_measured.is_some_and(f32::is_finite), "{sc:?}");
            sc
        };
        assert_eq!(dynamics(1), dynamics(2));
    }
}
