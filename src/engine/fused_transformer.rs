//! A fused CPU path for the transformer policy (`model::transformer`): forward, loss, backward
//! and Adam written out over plain buffers, every matrix product through `gemm`, no autodiff
//! graph; and autoregressive generation with a KV cache (the prompt prefilled once per
//! prompt, then one new position per response and step). Each batch is cut into parts — whole
//! prompts for the teacher-forced passes, rows for generation — that run on `run.threads`
//! threads with the same result on any number of them (`engine::cores`).
//!
//! The weights live in one flat array in the burn module's visiting order (`Layout`), so Adam,
//! the gradient norm and the checkpoints are single loops over one buffer, and
//! `engine::autodiff::flat_params` of the burn policy equals it element for element.
//!
//! Held equal to burn's autodiff path by `tests/fused_transformer.rs` (same rollouts, metrics
//! and weights within stated tolerances) and to finite differences by the tests below.

use super::StepScalars;
use super::cores::{self, Cores};
use super::fused_lecture::{View, exp_fast, lanes8, product_into, sum_sq, zeroed};
use crate::model::TransformerShape;
use crate::objective::entropy_dynamics::first_order;
use crate::objective::loss::{self, LossSettings, TokenInputs, TokenTerms};
use crate::objective::numeric::{masked_sum_f64, row_entropy, row_softmax};

/// LayerNorm's ε (as `model::transformer::layer_norm`).
const LN_EPS: f32 = 1e-5;

/// Where each parameter array starts in the flat weights (burn's visiting order).
#[derive(Debug, Clone)]
pub struct Layout {
    pub tok_emb: usize,
    pub pos_emb: usize,
    pub blocks: Vec<BlockLayout>,
    pub lnf_g: usize,
    pub lnf_b: usize,
    pub head: usize,
    pub total: usize,
}

#[derive(Debug, Clone, Copy)]
pub struct BlockLayout {
    pub ln1_g: usize,
    pub ln1_b: usize,
    /// `[D, 3D]`
    pub wqkv: usize,
    /// `[D, D]`
    pub wo: usize,
    pub ln2_g: usize,
    pub ln2_b: usize,
    /// `[D, F]`
    pub w1: usize,
    pub b1: usize,
    /// `[F, D]`
    pub w2: usize,
    pub b2: usize,
}

impl Layout {
    pub fn of(s: &TransformerShape) -> Self {
        let (v, c, d, f) = (s.vocab, s.context, s.d_model, s.d_ff);
        let mut at = 0;
        let mut next = |len: usize| {
            let o = at;
            at += len;
            o
        };
        let tok_emb = next(v * d);
        let pos_emb = next(c * d);
        let blocks = (0..s.layers)
            .map(|_| BlockLayout {
                ln1_g: next(d),
                ln1_b: next(d),
                wqkv: next(d * 3 * d),
                wo: next(d * d),
                ln2_g: next(d),
                ln2_b: next(d),
                w1: next(d * f),
                b1: next(f),
                w2: next(f * d),
                b2: next(d),
            })
            .collect();
        let lnf_g = next(d);
        let lnf_b = next(d);
        let head = next(d * v);
        Self {
            tok_emb,
            pos_emb,
            blocks,
            lnf_g,
            lnf_b,
            head,
            total: at,
        }
    }
}

pub use crate::objective::adam::{AdamState, Hyper};

/// Activations of one block that the backward pass reads.
#[derive(Debug, Clone, Default)]
struct BlockActs {
    xhat1: Vec<f32>,
    rstd1: Vec<f32>,
    a1: Vec<f32>,
    qkv: Vec<f32>,
    /// `[R, H, S, S]` attention probabilities (0 above the diagonal).
    att: Vec<f32>,
    ctx: Vec<f32>,
    xhat2: Vec<f32>,
    rstd2: Vec<f32>,
    a2: Vec<f32>,
    hpre: Vec<f32>,
    /// `Φ(hpre)`, kept for GELU's backward.
    cdf: Vec<f32>,
    hact: Vec<f32>,
}

/// The tokens of a teacher-forced pass: the `B·n` prompt positions once per prompt (all `G`
/// responses to a prompt read the same prefix, so its activations are computed once and its
/// gradients gathered from every response), then each response's positions (`R = B·G` rows):
/// row `r` of `L_r` real tokens needs its first `L_r − 1` tokens as inputs, and the positions
/// after its end (padding) are skipped — causal attention never lets them reach a real token,
/// and the loss masks them. Row-major `[N, ·]` buffers hold the prompt positions first. The
/// logits are computed for the `Σ L_r` real tokens only ("selected" positions, row by row).
#[derive(Debug, Clone, Default)]
struct Geometry {
    n: usize,
    g: usize,
    t: usize,
    /// `B·n`
    np: usize,
    /// `B·n + Σ (L_r − 1)`
    total: usize,
    /// The longest sequence a query attends over (`n + T − 1`).
    s: usize,
    /// Row `r`'s input positions start at `np + starts[r]` (`R + 1` entries).
    starts: Vec<usize>,
    /// The row of each response input position.
    row_of: Vec<u32>,
    /// Row `r`'s selected positions are `sel_starts[r]..sel_starts[r + 1]` (`R + 1` entries).
    sel_starts: Vec<usize>,
}

impl Geometry {
    /// `lens[r]`: the real tokens of row `r` (`≤ t`).
    fn new(n: usize, b: usize, g: usize, t: usize, lens: &[usize]) -> Self {
        let r = b * g;
        assert_eq!(lens.len(), r, "one length per row");
        let mut starts = Vec::with_capacity(r + 1);
        let mut sel_starts = Vec::with_capacity(r + 1);
        let (mut at, mut sel) = (0, 0);
        let mut row_of = Vec::new();
        for (ri, &len) in lens.iter().enumerate() {
            let len = len.min(t);
            starts.push(at);
            sel_starts.push(sel);
            let u = len.saturating_sub(1);
            row_of.extend(std::iter::repeat_n(ri as u32, u));
            at += u;
            sel += len;
        }
        starts.push(at);
        sel_starts.push(sel);
        Self {
            n,
            g,
            t,
            np: b * n,
            total: b * n + at,
            s: n + t - 1,
            starts,
            row_of,
            sel_starts,
        }
    }
    /// Selected positions (real tokens) in all.
    fn sel(&self) -> usize {
        self.sel_starts[self.sel_starts.len() - 1]
    }
    /// The keys token `q` attends to: prompt tokens `ps..ps + pc`, then its own response's
    /// tokens `rs..rs + rc`; and its position in the sequence.
    #[inline(always)]
    fn keys(&self, q: usize) -> (usize, usize, usize, usize, usize) {
        if q < self.np {
            let (bi, i) = (q / self.n, q % self.n);
            (bi * self.n, i + 1, 0, 0, i)
        } else {
            let ri = self.row_of[q - self.np] as usize;
            let j = q - self.np - self.starts[ri];
            (
                (ri / self.g) * self.n,
                self.n,
                self.np + self.starts[ri],
                j + 1,
                self.n + j,
            )
        }
    }
    /// The token whose output predicts response token `i` of row `ri`.
    #[inline(always)]
    fn predictor(&self, ri: usize, i: usize) -> usize {
        if i == 0 {
            (ri / self.g) * self.n + self.n - 1
        } else {
            self.np + self.starts[ri] + i - 1
        }
    }
    /// `(selected position, flat index r·T + i, row, i)` of every real token, in order.
    fn selected(&self) -> impl Iterator<Item = (usize, usize, usize, usize)> + '_ {
        (0..self.sel_starts.len() - 1).flat_map(move |ri| {
            let (a, b) = (self.sel_starts[ri], self.sel_starts[ri + 1]);
            (a..b).map(move |k| (k, ri * self.t + k - a, ri, k - a))
        })
    }
}

/// The keep-sampling-mask: each selected row of `logits [sel, V]` restricted to its token's
/// sampler support (`support [B·G·T]`), when there is one.
fn keep_supports(logits: &mut [f32], geo: &Geometry, v: usize, support: Option<&[u64]>) {
    let Some(support) = support else { return };
    for (k, i, _, _) in geo.selected() {
        crate::objective::sampling::keep_support(&mut logits[k * v..(k + 1) * v], support[i]);
    }
}

/// The real tokens of each row: one past the last position with a nonzero mask.
fn lengths_of(mask: &[f32], t: usize) -> Vec<usize> {
    mask.chunks(t.max(1))
        .map(|row| row.iter().rposition(|&m| m != 0.0).map_or(0, |i| i + 1))
        .collect()
}

/// Buffers of a teacher-forced pass and its backward (sized on first use, then reused).
#[derive(Debug, Clone, Default)]
struct Scratch {
    geo: Geometry,
    tokens: Vec<u32>,
    x: Vec<f32>,
    blocks: Vec<BlockActs>,
    /// The residual stream at the `R·T` positions that predict a response token.
    xsel: Vec<f32>,
    xhatf: Vec<f32>,
    rstdf: Vec<f32>,
    af: Vec<f32>,
    logits: Vec<f32>,
    // loss
    z: Vec<f32>,
    logz: Vec<f32>,
    ent: Vec<f32>,
    logp: Vec<f32>,
    /// The part's response tokens (`[rows·T]`), for the backward's one-hot.
    responses: Vec<u32>,
    dlogits: Vec<f32>,
    // backward
    dx: Vec<f32>,
    dsel: Vec<f32>,
    da: Vec<f32>,
    dctx: Vec<f32>,
    dqkv: Vec<f32>,
    dh: Vec<f32>,
    grad: Vec<f32>,
    tmp: Vec<f32>,
}

/// The KV cache of a generation: per block, the prompt's keys and values once per prompt
/// (`[B, n, D]`) and each response's own (`[R, max_len, D]`).
#[derive(Debug, Clone, Default)]
struct Cache {
    /// The rows this position decodes: their tokens, (part-local) prompts and cache rows.
    toks: Vec<u32>,
    prompt_of: Vec<usize>,
    cache_row: Vec<usize>,
    pk: Vec<Vec<f32>>,
    pv: Vec<Vec<f32>>,
    rk: Vec<Vec<f32>>,
    rv: Vec<Vec<f32>>,
    // one position's activations
    x: Vec<f32>,
    a: Vec<f32>,
    qkv: Vec<f32>,
    ctx: Vec<f32>,
    h: Vec<f32>,
    tmp: Vec<f32>,
    scores: Vec<f32>,
    logits: Vec<f32>,
}

/// The inputs of a GRPO step (see [`FusedTransformer::step`]).
#[derive(Clone, Copy)]
pub struct StepInput<'a> {
    /// `[B·n]`
    pub prompts: &'a [u32],
    /// `[B·G·T]`, padded after each response's end.
    pub responses: &'a [u32],
    /// `[B·G·T]`: 1 for real tokens.
    pub mask: &'a [f32],
    pub g: usize,
    pub t: usize,
    /// `[B·G]`
    pub advantages: &'a [f32],
    /// `[B·G·T]`: per-token advantages (GAE), replacing `advantages` when present.
    pub token_advantages: Option<&'a [f32]>,
    /// `[B·G·T]`
    pub old_logp: &'a [f32],
    pub ref_logp: &'a [f32],
    /// `[B·G·T]` the sampler's own log π (the mismatch lab), where it differs.
    pub sampler_logp: Option<&'a [f32]>,
    /// `[B·G·T]` the sampler's support at each token, which the learner renormalises over.
    pub support: Option<&'a [u64]>,
}

impl<'a> StepInput<'a> {
    /// The batch's rows for a teacher-forced pass, each `lens[r]` tokens long.
    fn rows<'b>(&'b self, lens: &'b [usize]) -> Rows<'b> {
        Rows {
            prompts: self.prompts,
            responses: self.responses,
            lens,
            g: self.g,
            t: self.t,
        }
    }

    /// `Σ_t m_t`: the batch's real tokens.
    fn tokens(&self) -> f64 {
        masked_sum_f64(self.mask, &vec![1.0; self.mask.len()]).max(1.0)
    }
}

/// The weights and shape a pass reads (shared by every part).
#[derive(Clone, Copy)]
struct Net<'a> {
    shape: &'a TransformerShape,
    lay: &'a Layout,
    /// The prompt's length.
    n: usize,
    w: &'a [f32],
}

/// The rows of a teacher-forced pass: `prompts [B·n]`, `responses [B·G·T]`, `lens [B·G]`.
#[derive(Clone, Copy)]
struct Rows<'a> {
    prompts: &'a [u32],
    responses: &'a [u32],
    lens: &'a [usize],
    g: usize,
    t: usize,
}

impl<'a> Rows<'a> {
    /// The rows of prompts `p` (a part), and where its tokens start in the whole `[B·G·T]`.
    fn part(&self, n: usize, p: &std::ops::Range<usize>) -> (Self, usize) {
        let (g, t) = (self.g, self.t);
        let part = Self {
            prompts: &self.prompts[p.start * n..p.end * n],
            responses: &self.responses[p.start * g * t..p.end * g * t],
            lens: &self.lens[p.start * g..p.end * g],
            g,
            t,
        };
        (part, p.start * g * t)
    }
}

/// What turns a part's softmax into `∂L/∂logits`: per token (the part's own slices) the
/// coefficients `∂L/∂log π_t` and, with an entropy bonus, `∂L/∂H_t`; the mask; `1/T`.
#[derive(Clone, Copy)]
struct Coefs<'a> {
    dlogp: &'a [f32],
    dentropy: Option<&'a [f32]>,
    mask: &'a [f32],
    inv_t: f32,
}

/// What the step needs besides the batch.
#[derive(Debug, Clone, Copy)]
pub struct StepSettings {
    pub loss: LossSettings,
    pub temperature: f32,
    pub lr: f64,
    pub max_grad_norm: f32,
    /// Measure the step's entropy change (`run.entropy_dynamics`): the mean entropy of the
    /// batch's tokens after the update, and `∇θH·Δθ` of the update (a forward and a backward
    /// more, and a forward after the update).
    pub entropy_dynamics: bool,
}

/// The transformer's weights, Adam state and scratch on the host.
#[derive(Debug, Clone)]
pub struct FusedTransformer {
    pub shape: TransformerShape,
    pub layout: Layout,
    /// The prompt's length.
    pub n: usize,
    /// Flat weights (see [`Layout`]).
    pub w: Vec<f32>,
    pub adam: AdamState,
    pub hyper: Hyper,
    /// One scratch per part of a teacher-forced batch, one KV cache per part of a generation.
    parts: Vec<Scratch>,
    caches: Vec<Cache>,
    /// The last step's `log π`, entropy (`[B·G·T]`), objective terms and gradient (flat).
    logp: Vec<f32>,
    ent: Vec<f32>,
    terms: TokenTerms,
    grad: Vec<f32>,
    cores: Cores,
}

/// `y[r] = LayerNorm(x[r])·g + b` for rows of `d`, keeping `x̂` and `1/σ` for the backward.
#[inline(always)]
pub(crate) fn layer_norm(
    x: &[f32],
    g: &[f32],
    b: &[f32],
    d: usize,
    xhat: &mut [f32],
    rstd: &mut [f32],
    y: &mut [f32],
) {
    let inv_d = 1.0 / d as f32;
    for (((xr, hr), yr), rs) in x
        .chunks_exact(d)
        .zip(xhat.chunks_exact_mut(d))
        .zip(y.chunks_exact_mut(d))
        .zip(rstd.iter_mut())
    {
        let mean = lanes8(xr, 0.0, |a, b| a + b) * inv_d;
        for (h, &v) in hr.iter_mut().zip(xr) {
            *h = v - mean;
        }
        let var = hr.iter().map(|c| c * c).sum::<f32>() * inv_d;
        let r = 1.0 / (var + LN_EPS).sqrt();
        *rs = r;
        for (((h, yv), &gv), &bv) in hr.iter_mut().zip(yr.iter_mut()).zip(g).zip(b) {
            *h *= r;
            *yv = *h * gv + bv;
        }
    }
}

/// LayerNorm's backward: `dx += ∂/∂x`, `dg`, `db` accumulate.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(crate) fn layer_norm_backward(
    dy: &[f32],
    xhat: &[f32],
    rstd: &[f32],
    g: &[f32],
    d: usize,
    dg: &mut [f32],
    db: &mut [f32],
    dx: &mut [f32],
    tmp: &mut Vec<f32>,
) {
    let inv_d = 1.0 / d as f32;
    let dxhat = zeroed(tmp, d);
    for (((dyr, hr), dxr), &r) in dy
        .chunks_exact(d)
        .zip(xhat.chunks_exact(d))
        .zip(dx.chunks_exact_mut(d))
        .zip(rstd)
    {
        let (mut m1, mut m2) = (0.0f32, 0.0f32);
        for ((((dh, &dyv), &hv), &gv), (dgv, dbv)) in dxhat
            .iter_mut()
            .zip(dyr)
            .zip(hr)
            .zip(g)
            .zip(dg.iter_mut().zip(db.iter_mut()))
        {
            *dh = dyv * gv;
            *dgv += dyv * hv;
            *dbv += dyv;
            m1 += *dh;
            m2 += *dh * hv;
        }
        m1 *= inv_d;
        m2 *= inv_d;
        for ((dxv, &dh), &hv) in dxr.iter_mut().zip(dxhat.iter()).zip(hr) {
            *dxv += r * (dh - m1 - hv * m2);
        }
    }
}

/// The backward of `y = x·W` (`x [rows, k]`, `W [k, m]` at `w[at..]`): `∂W = xᵀ·dy` into
/// `grad[at..]` (overwritten: each weight is used once), `dx = dy·Wᵀ` into `dx`.
#[inline(always)]
fn linear_backward(
    w: &[f32],
    grad: &mut [f32],
    at: usize,
    x: &[f32],
    dy: &[f32],
    (rows, k, m): (usize, usize, usize),
    dx: &mut Vec<f32>,
) {
    product_into(
        &mut grad[at..],
        m,
        View::rows(x, k).t(),
        View::rows(dy, m),
        (k, rows, m),
        false,
    );
    let dx = sized(dx, rows * k);
    product_into(
        dx,
        k,
        View::rows(dy, m),
        View::rows(&w[at..][..k * m], m).t(),
        (rows, m, k),
        false,
    );
}

/// The backward of a LayerNorm whose gain sits at `w[at..]` and bias right after it: `∂g`, `∂b`
/// into `grad`, `dx +=`. `saved`: its `x̂` and `1/σ` from the forward.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn ln_backward(
    w: &[f32],
    grad: &mut [f32],
    at: usize,
    d: usize,
    dy: &[f32],
    (xhat, rstd): (&[f32], &[f32]),
    dx: &mut [f32],
    tmp: &mut Vec<f32>,
) {
    let (g, rest) = grad[at..].split_at_mut(d);
    layer_norm_backward(dy, xhat, rstd, &w[at..][..d], d, g, &mut rest[..d], dx, tmp);
}

/// `Φ(x)`, the standard normal CDF, as `erfc(−x/√2)/2` with Numerical Recipes' `erfc`
/// (fractional error < 1.2e-7 everywhere) and `exp_fast`: branch-free, so loops over it
/// vectorize (libm's `erff`, which burn's CPU backend calls, does not, and costs as much as
/// the rest of the MLP here). Against burn's `(1 + erf(x/√2))/2` it differs by ≲ 1e-7
/// absolute (tested).
#[inline(always)]
pub(crate) fn normal_cdf(x: f32) -> f32 {
    let z = x.abs() * std::f32::consts::FRAC_1_SQRT_2;
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -1.265_512_2
        + t * (1.000_023_7
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_204
                                + t * (1.488_515_9 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    // erfc(z) for z = |x|/√2 ≥ 0; Φ(x) = erfc(−x/√2)/2.
    let half_erfc = 0.5 * t * exp_fast(-z * z + poly);
    if x >= 0.0 { 1.0 - half_erfc } else { half_erfc }
}

/// GELU as burn computes it: `x·Φ(x)` (the erf form, not the tanh approximation).
#[inline(always)]
fn gelu(x: f32) -> f32 {
    x * normal_cdf(x)
}

/// `d gelu / dx = Φ(x) + x·φ(x)`, as burn's `gelu_backward`.
#[cfg(test)]
#[inline(always)]
fn gelu_grad(x: f32) -> f32 {
    gelu_grad_from(x, normal_cdf(x))
}

/// `gelu_grad` with `Φ(x)` already known (the forward keeps it).
#[inline(always)]
pub(crate) fn gelu_grad_from(x: f32, cdf: f32) -> f32 {
    const INV_SQRT_2PI: f32 = 0.398_942_3;
    cdf + x * INV_SQRT_2PI * exp_fast(-0.5 * x * x)
}

/// `buf` resized to `len` without clearing what it held: for buffers the next pass
/// overwrites entirely (a product without accumulation, a LayerNorm, a copy), where zeroing
/// first is a memset of megabytes per step for nothing.
#[inline(always)]
fn sized(buf: &mut Vec<f32>, len: usize) -> &mut [f32] {
    buf.resize(len, 0.0);
    &mut buf[..len]
}

/// `x[r] += b` for rows of `b.len()`.
#[inline(always)]
fn add_bias(x: &mut [f32], b: &[f32]) {
    for row in x.chunks_exact_mut(b.len()) {
        for (v, &bv) in row.iter_mut().zip(b) {
            *v += bv;
        }
    }
}

/// `db += Σ_r dy[r]`.
#[inline(always)]
fn bias_grad(dy: &[f32], db: &mut [f32]) {
    for row in dy.chunks_exact(db.len()) {
        for (g, &v) in db.iter_mut().zip(row) {
            *g += v;
        }
    }
}

/// `x = tok_emb[tok] + pos_emb[pos]`.
#[inline(always)]
fn embed(w: &[f32], lay: &Layout, d: usize, tok: u32, pos: usize, x: &mut [f32]) {
    let te = &w[lay.tok_emb + tok as usize * d..][..d];
    let pe = &w[lay.pos_emb + pos * d..][..d];
    for ((xv, &a), &bb) in x.iter_mut().zip(te).zip(pe) {
        *xv = a + bb;
    }
}

/// A LayerNorm's output buffers: `x̂` and `1/σ` (kept for the backward) and the output.
struct Ln<'a> {
    xhat: &'a mut Vec<f32>,
    rstd: &'a mut Vec<f32>,
    out: &'a mut Vec<f32>,
}

impl<'a> Ln<'a> {
    /// `LayerNorm(x)·g + b` of `rows` rows of `d`; the output.
    #[inline(always)]
    fn apply(self, x: &[f32], g: &[f32], b: &[f32], (d, rows): (usize, usize)) -> &'a [f32] {
        sized(self.xhat, rows * d);
        sized(self.rstd, rows);
        sized(self.out, rows * d);
        layer_norm(x, g, b, d, self.xhat, self.rstd, self.out);
        self.out
    }
}

/// A block's first half: `a = LN₁(x)`, `qkv = a·W_qkv` (`[rows, 3D]`).
#[inline(always)]
fn block_qkv(
    w: &[f32],
    bl: &BlockLayout,
    (d, rows): (usize, usize),
    x: &[f32],
    ln1: Ln,
    qkv: &mut Vec<f32>,
) {
    let a = ln1.apply(x, &w[bl.ln1_g..][..d], &w[bl.ln1_b..][..d], (d, rows));
    let qkv = sized(qkv, rows * 3 * d);
    product_into(
        qkv,
        3 * d,
        View::rows(a, d),
        View::rows(&w[bl.wqkv..][..d * 3 * d], 3 * d),
        (rows, d, 3 * d),
        false,
    );
}

/// One query's causal attention over `kc` keys, every head: `p = softmax(q·k_j·scale)` into
/// `probs` (head `h` at `h·stride`), `out += Σ_j p_j·v_j`. Key by key across the heads: each
/// key's row is read once, and the heads' accumulators are independent chains.
#[inline(always)]
fn attend<'k>(
    q: &[f32],
    kc: usize,
    key: impl Fn(usize) -> &'k [f32],
    value: impl Fn(usize) -> &'k [f32],
    (hh, scale, stride): (usize, f32, usize),
    probs: &mut [f32],
    out: &mut [f32],
) {
    let dh = q.len() / hh;
    for j in 0..kc {
        let krow = key(j);
        for h in 0..hh {
            probs[h * stride + j] = dot(&q[h * dh..][..dh], &krow[h * dh..][..dh]) * scale;
        }
    }
    for h in 0..hh {
        softmax_in_place(&mut probs[h * stride..][..kc]);
    }
    for j in 0..kc {
        let vrow = value(j);
        for h in 0..hh {
            axpy(
                &mut out[h * dh..][..dh],
                probs[h * stride + j],
                &vrow[h * dh..][..dh],
            );
        }
    }
}

/// A block's second half: `x += ctx·W_o`, `a = LN₂(x)`, `x += GELU(a·W₁ + b₁)·W₂ + b₂`.
/// `keep`: the activation and `Φ` of the hidden layer for the backward (its pre-activation stays
/// in `hpre`); `None` applies GELU in place in `hpre`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn block_rest(
    w: &[f32],
    bl: &BlockLayout,
    (d, f, rows): (usize, usize, usize),
    x: &mut [f32],
    ctx: &[f32],
    ln2: Ln,
    hpre: &mut Vec<f32>,
    keep: Option<(&mut Vec<f32>, &mut Vec<f32>)>,
) {
    product_into(
        x,
        d,
        View::rows(ctx, d),
        View::rows(&w[bl.wo..][..d * d], d),
        (rows, d, d),
        true,
    );
    let a = ln2.apply(x, &w[bl.ln2_g..][..d], &w[bl.ln2_b..][..d], (d, rows));
    let h = sized(hpre, rows * f);
    product_into(
        h,
        f,
        View::rows(a, d),
        View::rows(&w[bl.w1..][..d * f], f),
        (rows, d, f),
        false,
    );
    add_bias(h, &w[bl.b1..][..f]);
    let act: &[f32] = match keep {
        Some((hact, cdf)) => {
            let y = sized(hact, rows * f);
            let c = sized(cdf, rows * f);
            for ((y, c), &xv) in y.iter_mut().zip(c.iter_mut()).zip(h.iter()) {
                // gelu(x) = x·Φ(x); Φ kept for the backward.
                let p = normal_cdf(xv);
                *c = p;
                *y = xv * p;
            }
            hact
        }
        None => {
            for hv in h.iter_mut() {
                *hv = gelu(*hv);
            }
            hpre
        }
    };
    product_into(
        x,
        d,
        View::rows(act, f),
        View::rows(&w[bl.w2..][..f * d], d),
        (rows, f, d),
        true,
    );
    add_bias(x, &w[bl.b2..][..d]);
}

/// The final LayerNorm and the head: `logits = LN_f(x)·W_head` (`[rows, V]`).
#[inline(always)]
fn head(
    w: &[f32],
    lay: &Layout,
    (d, v, rows): (usize, usize, usize),
    x: &[f32],
    lnf: Ln,
    logits: &mut Vec<f32>,
) {
    let a = lnf.apply(x, &w[lay.lnf_g..][..d], &w[lay.lnf_b..][..d], (d, rows));
    let out = sized(logits, rows * v);
    product_into(
        out,
        v,
        View::rows(a, d),
        View::rows(&w[lay.head..][..d * v], v),
        (rows, d, v),
        false,
    );
}

/// `Σ a·b` in 8 lanes (fixed-size chunks and a pairwise reduction, so the lanes stay in a
/// register: a short dot product — a head's 16 values — is mostly its reduction).
/// Index loops, not iterator adapters: called per key and head, where an adapter's setup
/// that is not inlined costs as much as the work.
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut lanes = [0.0f32; 8];
    let whole = n / 8 * 8;
    for c in (0..whole).step_by(8) {
        let x: &[f32; 8] = a[c..c + 8].try_into().expect("8 values");
        let y: &[f32; 8] = b[c..c + 8].try_into().expect("8 values");
        for l in 0..8 {
            lanes[l] += x[l] * y[l];
        }
    }
    let mut rest = 0.0f32;
    for i in whole..n {
        rest += a[i] * b[i];
    }
    let h = [
        lanes[0] + lanes[4],
        lanes[1] + lanes[5],
        lanes[2] + lanes[6],
        lanes[3] + lanes[7],
    ];
    ((h[0] + h[2]) + (h[1] + h[3])) + rest
}

/// `p ← softmax(p)` (max-subtracted, `exp_fast`).
#[inline(always)]
fn softmax_in_place(p: &mut [f32]) {
    let m = p.iter().fold(f32::MIN, |a, &b| a.max(b));
    let mut total = 0.0f32;
    for pj in p.iter_mut() {
        *pj = exp_fast(*pj - m);
        total += *pj;
    }
    let inv = 1.0 / total;
    for pj in p.iter_mut() {
        *pj *= inv;
    }
}

/// `y += a·x` (in chunks of 8, index loops: see [`dot`]).
#[inline(always)]
fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    let n = y.len().min(x.len());
    let (y, x) = (&mut y[..n], &x[..n]);
    let whole = n / 8 * 8;
    for c in (0..whole).step_by(8) {
        let yc: &mut [f32; 8] = (&mut y[c..c + 8]).try_into().expect("8 values");
        let xc: &[f32; 8] = x[c..c + 8].try_into().expect("8 values");
        for l in 0..8 {
            yc[l] += a * xc[l];
        }
    }
    for i in whole..n {
        y[i] += a * x[i];
    }
}

impl FusedTransformer {
    pub fn new(shape: TransformerShape, n: usize, w: Vec<f32>, hyper: Hyper) -> Self {
        let layout = Layout::of(&shape);
        assert_eq!(w.len(), layout.total, "weights of another shape");
        Self {
            adam: AdamState::new(layout.total),
            shape,
            layout,
            n,
            w,
            hyper,
            parts: Vec::new(),
            caches: Vec::new(),
            logp: Vec::new(),
            ent: Vec::new(),
            terms: TokenTerms::default(),
            grad: Vec::new(),
            cores: Cores::default(),
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

    fn net(&self) -> Net<'_> {
        Net {
            shape: &self.shape,
            lay: &self.layout,
            n: self.n,
            w: &self.w,
        }
    }

    /// The parts of `b` units — prompts with `rows` rows of `t` positions each, or a
    /// generation's rows (`rows = 1`) — a function of the shape alone, so the results do not
    /// depend on the threads; a unit's work is roughly the multiply-adds of its positions
    /// through every block and the head.
    fn parts_of(&self, b: usize, rows: usize, t: usize) -> Vec<std::ops::Range<usize>> {
        let (d, v) = (self.shape.d_model, self.shape.vocab);
        let per_position = self.layout.blocks.len() * (4 * d * d + 2 * d * self.shape.d_ff) + d * v;
        cores::parts(b, (self.n + rows * t) * per_position)
    }

    /// Adam's state as bytes: the step count, then m and v (f32, little-endian).
    pub fn adam_bytes(&self) -> Vec<u8> {
        let mut out = self.adam.time.to_le_bytes().to_vec();
        for x in self.adam.m.iter().chain(&self.adam.v) {
            out.extend_from_slice(&x.to_le_bytes());
        }
        out
    }

    /// Restore what `adam_bytes` wrote (for this shape).
    pub fn load_adam_bytes(&mut self, bytes: &[u8]) -> Result<(), String> {
        let want = 4 + 8 * self.layout.total;
        if bytes.len() != want {
            return Err(format!(
                "fused_adam.bin holds {} bytes, expected {want} for this model",
                bytes.len()
            ));
        }
        self.adam.time = i32::from_le_bytes(bytes[..4].try_into().expect("4 bytes"));
        let mut floats = bytes[4..]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")));
        for x in self.adam.m.iter_mut().chain(self.adam.v.iter_mut()) {
            *x = floats.next().expect("sized above");
        }
        Ok(())
    }

    /// Teacher-forced forward of `R = B·G` rows (the prompt, then the response without its
    /// last token) with weights `w`, row `r` holding `lens[r]` real tokens: fills `sc`
    /// (activations, the geometry, and `logits [Σ L_r, V]` of the positions that predict a
    /// real response token, row by row).
    #[inline(always)]
    fn forward_into(net: &Net, x: &Rows, sc: &mut Scratch) {
        let Net { shape, lay, n, w } = *net;
        let Rows {
            prompts,
            responses,
            lens,
            g,
            t,
        } = *x;
        let (v, d, f, hh) = (shape.vocab, shape.d_model, shape.d_ff, shape.heads);
        let dh = d / hh;
        let b = prompts.len() / n;
        let r = b * g;
        let geo = Geometry::new(n, b, g, t, lens);
        let (rows, s) = (geo.total, geo.s);
        assert!(s <= shape.context, "sequence longer than the context");
        assert!(
            responses.iter().all(|&x| (x as usize) < v)
                && prompts.iter().all(|&x| (x as usize) < v),
            "token ≥ vocab"
        );
        // Input tokens: the prompts, then each response without its last token.
        sc.tokens.clear();
        sc.tokens.extend_from_slice(prompts);
        for ri in 0..r {
            let u = geo.starts[ri + 1] - geo.starts[ri];
            sc.tokens.extend_from_slice(&responses[ri * t..ri * t + u]);
        }
        let x = sized(&mut sc.x, rows * d);
        for (q, (xr, &tok)) in x.chunks_exact_mut(d).zip(&sc.tokens).enumerate() {
            embed(w, lay, d, tok, geo.keys(q).4, xr);
        }
        sc.blocks.resize_with(lay.blocks.len(), BlockActs::default);
        let scale = 1.0 / (dh as f32).sqrt();
        for (bl, acts) in lay.blocks.iter().zip(sc.blocks.iter_mut()) {
            let ln1 = Ln {
                xhat: &mut acts.xhat1,
                rstd: &mut acts.rstd1,
                out: &mut acts.a1,
            };
            block_qkv(w, bl, (d, rows), &sc.x, ln1, &mut acts.qkv);
            // Causal attention of every token and head over its keys.
            let att = sized(&mut acts.att, rows * hh * s);
            let ctx = zeroed(&mut acts.ctx, rows * d);
            let qkv = &acts.qkv;
            for q in 0..rows {
                let (ps, pc, rs, rc, _) = geo.keys(q);
                let key = |j: usize| if j < pc { ps + j } else { rs + j - pc };
                attend(
                    &qkv[q * 3 * d..][..d],
                    pc + rc,
                    |j| &qkv[key(j) * 3 * d + d..][..d],
                    |j| &qkv[key(j) * 3 * d + 2 * d..][..d],
                    (hh, scale, s),
                    &mut att[q * hh * s..][..hh * s],
                    &mut ctx[q * d..][..d],
                );
            }
            let ln2 = Ln {
                xhat: &mut acts.xhat2,
                rstd: &mut acts.rstd2,
                out: &mut acts.a2,
            };
            let kept = Some((&mut acts.hact, &mut acts.cdf));
            block_rest(
                w,
                bl,
                (d, f, rows),
                &mut sc.x,
                &acts.ctx,
                ln2,
                &mut acts.hpre,
                kept,
            );
        }
        // The final LayerNorm and the head at the positions that predict a real token.
        let sel = geo.sel();
        let xsel = sized(&mut sc.xsel, sel * d);
        for (k, _, ri, i) in geo.selected() {
            let from = geo.predictor(ri, i) * d;
            xsel[k * d..(k + 1) * d].copy_from_slice(&sc.x[from..from + d]);
        }
        let lnf = Ln {
            xhat: &mut sc.xhatf,
            rstd: &mut sc.rstdf,
            out: &mut sc.af,
        };
        head(w, lay, (d, v, sel), &sc.xsel, lnf, &mut sc.logits);
        sc.geo = geo;
    }

    /// Gradients of every weight from `sc.dlogits [Σ L_r, V]` into `sc.grad` (flat layout),
    /// for the geometry of the last forward.
    #[inline(always)]
    fn backward(net: &Net, sc: &mut Scratch) {
        let Net { shape, lay, w, .. } = *net;
        let (v, d, f, hh) = (shape.vocab, shape.d_model, shape.d_ff, shape.heads);
        let dh = d / hh;
        let geo = std::mem::take(&mut sc.geo);
        let (rows, s) = (geo.total, geo.s);
        let sel = geo.sel();
        let grad = zeroed(&mut sc.grad, lay.total);
        // logits = af · head
        let head = (sel, d, v);
        linear_backward(w, grad, lay.head, &sc.af, &sc.dlogits, head, &mut sc.da);
        let dsel = zeroed(&mut sc.dsel, sel * d);
        let lnf = (&sc.xhatf[..], &sc.rstdf[..]);
        ln_backward(w, grad, lay.lnf_g, d, &sc.da, lnf, dsel, &mut sc.tmp);
        let dx = zeroed(&mut sc.dx, rows * d);
        for (k, _, ri, i) in geo.selected() {
            let to = geo.predictor(ri, i) * d;
            // The prompt's last position predicts the first token of all G responses.
            axpy(&mut dx[to..to + d], 1.0, &sc.dsel[k * d..(k + 1) * d]);
        }
        let scale = 1.0 / (dh as f32).sqrt();
        for (bl, acts) in lay.blocks.iter().zip(sc.blocks.iter()).rev() {
            // MLP: x += gelu(a2·W1 + b1)·W2 + b2
            bias_grad(&sc.dx, &mut grad[bl.b2..][..d]);
            linear_backward(w, grad, bl.w2, &acts.hact, &sc.dx, (rows, f, d), &mut sc.dh);
            for ((dv, &xv), &p) in sc.dh.iter_mut().zip(&acts.hpre).zip(&acts.cdf) {
                *dv *= gelu_grad_from(xv, p);
            }
            bias_grad(&sc.dh, &mut grad[bl.b1..][..f]);
            linear_backward(w, grad, bl.w1, &acts.a2, &sc.dh, (rows, d, f), &mut sc.da);
            let ln2 = (&acts.xhat2[..], &acts.rstd2[..]);
            ln_backward(w, grad, bl.ln2_g, d, &sc.da, ln2, &mut sc.dx, &mut sc.tmp);
            // Attention: x += ctx·Wo
            linear_backward(
                w,
                grad,
                bl.wo,
                &acts.ctx,
                &sc.dx,
                (rows, d, d),
                &mut sc.dctx,
            );
            let dqkv = zeroed(&mut sc.dqkv, rows * 3 * d);
            let qkv = &acts.qkv;
            // Key by key across the heads, as the forward (the same sums in the same order).
            let mut dp = vec![0.0f32; hh * s];
            let mut sum = vec![0.0f32; hh];
            for q in 0..rows {
                let (ps, pc, rs, rc, _) = geo.keys(q);
                let key = |j: usize| if j < pc { ps + j } else { rs + j - pc };
                let kc = pc + rc;
                let arow = &acts.att[q * hh * s..][..hh * s];
                let dout = &sc.dctx[q * d..][..d];
                sum.fill(0.0);
                for j in 0..kc {
                    let kj = key(j);
                    let vrow = &qkv[kj * 3 * d + 2 * d..][..d];
                    for h in 0..hh {
                        let x = dot(&dout[h * dh..][..dh], &vrow[h * dh..][..dh]);
                        dp[h * s + j] = x;
                        sum[h] += arow[h * s + j] * x;
                    }
                    let dv = &mut dqkv[kj * 3 * d + 2 * d..][..d];
                    for h in 0..hh {
                        axpy(
                            &mut dv[h * dh..][..dh],
                            arow[h * s + j],
                            &dout[h * dh..][..dh],
                        );
                    }
                }
                let qrow = &qkv[q * 3 * d..][..d];
                for j in 0..kc {
                    let kj = key(j);
                    let krow = &qkv[kj * 3 * d + d..][..d];
                    for h in 0..hh {
                        let ds = arow[h * s + j] * (dp[h * s + j] - sum[h]) * scale;
                        axpy(
                            &mut dqkv[q * 3 * d + h * dh..][..dh],
                            ds,
                            &krow[h * dh..][..dh],
                        );
                        axpy(
                            &mut dqkv[kj * 3 * d + d + h * dh..][..dh],
                            ds,
                            &qrow[h * dh..][..dh],
                        );
                    }
                }
            }
            let qkv_shape = (rows, d, 3 * d);
            linear_backward(w, grad, bl.wqkv, &acts.a1, &sc.dqkv, qkv_shape, &mut sc.da);
            let ln1 = (&acts.xhat1[..], &acts.rstd1[..]);
            ln_backward(w, grad, bl.ln1_g, d, &sc.da, ln1, &mut sc.dx, &mut sc.tmp);
        }
        // x = tok_emb[token] + pos_emb[position]
        for (q, (dr, &tok)) in sc.dx.chunks_exact(d).zip(&sc.tokens).enumerate() {
            let pos = geo.keys(q).4;
            for (gv, &dv) in grad[lay.tok_emb + tok as usize * d..][..d]
                .iter_mut()
                .zip(dr)
            {
                *gv += dv;
            }
            for (gv, &dv) in grad[lay.pos_emb + pos * d..][..d].iter_mut().zip(dr) {
                *gv += dv;
            }
        }
        sc.geo = geo;
    }

    /// `log π` at `temperature` of every response token with weights `w`: `prompts [B·n]`,
    /// `responses [B·G·T]` → `[B·G·T]`, every position counted as real.
    pub fn token_logp(
        &mut self,
        w: Option<&[f32]>,
        prompts: &[u32],
        responses: &[u32],
        g: usize,
        t: usize,
        temperature: f32,
    ) -> Vec<f32> {
        let full = vec![t; responses.len() / t.max(1)];
        self.token_logp_ragged(w, prompts, responses, &full, g, t, temperature, None)
    }

    /// [`Self::token_logp_ragged`] of a frozen batch (its lengths and support).
    pub fn batch_logp(
        &mut self,
        w: Option<&[f32]>,
        batch: &crate::task::batch::Batch,
        temperature: f32,
    ) -> Vec<f32> {
        self.token_logp_ragged(
            w,
            &batch.prompts,
            &batch.responses,
            &batch.lengths,
            batch.g,
            batch.t,
            temperature,
            batch.support.as_deref(),
        )
    }

    /// `token_logp` of rows holding `lens[r]` real tokens: the positions after a row's end are
    /// not computed and hold 0. With `support` (`[B·G·T]`), each token's distribution
    /// renormalised over it (`sampling.keep_sampling_mask`).
    #[allow(clippy::too_many_arguments)]
    pub fn token_logp_ragged(
        &mut self,
        w: Option<&[f32]>,
        prompts: &[u32],
        responses: &[u32],
        lens: &[usize],
        g: usize,
        t: usize,
        temperature: f32,
        support: Option<&[u64]>,
    ) -> Vec<f32> {
        let rows = Rows {
            prompts,
            responses,
            lens,
            g,
            t,
        };
        let mut out = vec![0.0f32; responses.len()];
        let score = Score {
            inv_t: 1.0 / temperature,
            support,
            entropy: false,
        };
        let (parts, ranges) = self.forward_parts(w, &rows, &score);
        gather(&parts, &ranges, g * t, |sc| &sc.logp, &mut out);
        self.parts = parts;
        out
    }

    /// One GRPO optimizer step on a ragged batch. Returns the step's scalars and `log π` of
    /// every token (before the update). Weights stay as they were when the loss or the
    /// gradient norm is not finite (as on burn's path; the trainer then stops the run).
    pub fn step(&mut self, x: &StepInput, st: &StepSettings) -> (StepScalars, Vec<f32>) {
        let mut scalars = self.loss_and_gradient(x, st);
        if scalars.loss.is_finite() && scalars.grad_norm.is_finite() {
            let scale = if st.max_grad_norm > 0.0 && scalars.grad_norm > st.max_grad_norm {
                st.max_grad_norm / scalars.grad_norm
            } else {
                1.0
            };
            // ∇θ of the mean token entropy and the weights before the update, for the
            // first-order change of the step actually taken.
            let dynamics = st.entropy_dynamics.then(|| {
                let loss_grad = std::mem::take(&mut self.grad);
                self.entropy_gradient_into(x, st.temperature);
                let dh = std::mem::replace(&mut self.grad, loss_grad);
                (dh, self.w.clone())
            });
            let hyper = self.hyper;
            self.adam
                .step(&mut self.w, &self.grad, scale, st.lr as f32, &hyper);
            if let Some((dh, before)) = dynamics {
                let after = self.mean_entropy(x, st.temperature);
                scalars.entropy_measured = Some(after as f32 - scalars.entropy);
                scalars.entropy_first_order = Some(first_order(&self.w, &before, &dh) as f32);
            }
        }
        (scalars, self.logp.clone())
    }

    /// `∇θ` of the batch's mean token entropy `H̄ = Σ_t m_t·H_t / Σ_t m_t` at `temperature`
    /// into `self.grad` (`∂/∂H_t = m_t/Σm`, no log π term).
    fn entropy_gradient_into(&mut self, x: &StepInput, temperature: f32) {
        let count = x.tokens();
        let weights: Vec<f32> = x.mask.iter().map(|&m| (m as f64 / count) as f32).collect();
        let zeros = vec![0.0f32; x.mask.len()];
        self.coefficient_gradient_into(x, temperature, &zeros, Some(&weights));
    }

    /// `∇θ Σ_t coef_t·log π_t` at `temperature` over the batch's real tokens (flat): with
    /// `coef = (R − b)/K` per answer's tokens it is a sampled `∇J` (the gradient lab). Reads
    /// `x`'s prompts, responses, mask, `g`, `t` and support only.
    pub fn logp_gradient(&mut self, x: &StepInput, coef: &[f32], temperature: f32) -> Vec<f32> {
        self.coefficient_gradient_into(x, temperature, coef, None);
        self.grad.clone()
    }

    /// `∇θ (Σ_t c_t·log π_t + Σ_t e_t·H_t)` at `temperature` (flat) and, with `dentropy`, each
    /// token's entropy (`[B·G·T]`, else 0): what the WGSL engine's backward is held to.
    pub fn coefficient_gradient(
        &mut self,
        x: &StepInput,
        dlogp: &[f32],
        dentropy: Option<&[f32]>,
        temperature: f32,
    ) -> (Vec<f32>, Vec<f32>) {
        self.coefficient_gradient_into(x, temperature, dlogp, dentropy);
        let ranges = self.parts_of(x.prompts.len() / self.n.max(1), x.g, x.t);
        let mut ent = vec![0.0f32; x.responses.len()];
        gather(&self.parts, &ranges, x.g * x.t, |sc| &sc.ent, &mut ent);
        (self.grad.clone(), ent)
    }

    /// `∇θ (Σ_t c_t·log π_t + Σ_t e_t·H_t)` at `temperature` into `self.grad`: a forward and
    /// a backward from the coefficients, no objective.
    fn coefficient_gradient_into(
        &mut self,
        x: &StepInput,
        temperature: f32,
        dlogp: &[f32],
        dentropy: Option<&[f32]>,
    ) {
        let lens = lengths_of(x.mask, x.t);
        let rows = x.rows(&lens);
        let inv_t = 1.0 / temperature;
        let score = Score {
            inv_t,
            support: x.support,
            entropy: dentropy.is_some(),
        };
        let (mut parts, ranges) = self.forward_parts(None, &rows, &score);
        let coefs = Coefs {
            dlogp,
            dentropy,
            mask: x.mask,
            inv_t,
        };
        self.backward_parts(&mut parts, &ranges, x.g * x.t, &coefs);
        self.parts = parts;
    }

    /// The batch's mean token entropy at `temperature` under the current weights.
    fn mean_entropy(&mut self, x: &StepInput, temperature: f32) -> f64 {
        let lens = lengths_of(x.mask, x.t);
        let rows = x.rows(&lens);
        let score = Score {
            inv_t: 1.0 / temperature,
            support: x.support,
            entropy: true,
        };
        let (parts, ranges) = self.forward_parts(None, &rows, &score);
        let mut ent = vec![0.0f32; x.responses.len()];
        gather(&parts, &ranges, x.g * x.t, |sc| &sc.ent, &mut ent);
        self.parts = parts;
        masked_sum_f64(x.mask, &ent) / x.tokens()
    }

    /// Each token's entropy `H_t` as the last [`Self::step`] read it (`[B·G·T]`, 0 on padding).
    pub fn token_entropy(&self) -> &[f32] {
        &self.ent
    }

    /// The gradient of the last [`Self::loss_and_gradient`] (flat layout).
    pub fn gradient(&self) -> &[f32] {
        &self.grad
    }

    /// The step's loss, scalars and gradient (read it with [`Self::gradient`]), no update.
    pub fn loss_and_gradient(&mut self, x: &StepInput, st: &StepSettings) -> StepScalars {
        let (g, t) = (x.g, x.t);
        let lens = lengths_of(x.mask, t);
        let rows = x.rows(&lens);
        let s = &st.loss;
        let inv_t = 1.0 / st.temperature;
        let score = Score {
            inv_t,
            support: x.support,
            entropy: true,
        };
        // Each part's forward and softmax statistics: log π and H per real token (padding: 0).
        let tokens = x.responses.len();
        let (mut parts, ranges) = self.forward_parts(None, &rows, &score);
        zeroed(&mut self.logp, tokens);
        zeroed(&mut self.ent, tokens);
        gather(&parts, &ranges, g * t, |sc| &sc.logp, &mut self.logp);
        gather(&parts, &ranges, g * t, |sc| &sc.ent, &mut self.ent);
        // The objective over the whole batch and its coefficients ∂L/∂log π_t, ∂L/∂H_t.
        let inputs = TokenInputs {
            logp: &self.logp,
            old_logp: x.old_logp,
            ref_logp: x.ref_logp,
            sampler_logp: x.sampler_logp,
            advantages: x.token_advantages.unwrap_or(x.advantages),
            mask: x.mask,
            entropy: Some(&self.ent),
            t,
        };
        let mut terms = std::mem::take(&mut self.terms);
        loss::evaluate(s, &inputs, &mut terms);
        let bonus = s.entropy_coef != 0.0;
        let coefs = Coefs {
            dlogp: &terms.dlogp,
            dentropy: bonus.then_some(&terms.dentropy[..]),
            mask: x.mask,
            inv_t,
        };
        self.backward_parts(&mut parts, &ranges, g * t, &coefs);
        self.parts = parts;
        let grad_norm = sum_sq(&self.grad).sqrt();
        let scalars = StepScalars::of(&terms, grad_norm);
        self.terms = terms;
        scalars
    }

    /// The batch `rows` cut into parts, each part's forward and softmax statistics (weights
    /// `w`, else the policy's) on the threads: the parts (the caller puts them back in
    /// `self.parts`) and the prompts each holds.
    fn forward_parts(
        &mut self,
        w: Option<&[f32]>,
        rows: &Rows,
        score: &Score,
    ) -> (Vec<Scratch>, Vec<std::ops::Range<usize>>) {
        let ranges = self.parts_of(rows.prompts.len() / self.n.max(1), rows.g, rows.t);
        let mut parts = std::mem::take(&mut self.parts);
        parts.resize_with(ranges.len(), Scratch::default);
        let net = Net {
            w: w.unwrap_or(&self.w),
            ..self.net()
        };
        self.cores.each(&mut parts, |j, sc| {
            let (part, at) = rows.part(net.n, &ranges[j]);
            sc.forward_scored(&net, &part, at, score);
        });
        (parts, ranges)
    }

    /// Every part's backward from `coefs` (the whole batch's, `per_prompt` tokens per prompt),
    /// then their gradients summed in part order into `self.grad`.
    fn backward_parts(
        &mut self,
        parts: &mut [Scratch],
        ranges: &[std::ops::Range<usize>],
        per_prompt: usize,
        coefs: &Coefs,
    ) {
        let net = self.net();
        self.cores.each(parts, |j, sc| {
            let (a, b) = (ranges[j].start * per_prompt, ranges[j].end * per_prompt);
            let own = Coefs {
                dlogp: &coefs.dlogp[a..b],
                dentropy: coefs.dentropy.map(|e| &e[a..b]),
                mask: &coefs.mask[a..b],
                inv_t: coefs.inv_t,
            };
            sc.backprop(&net, &own);
        });
        let total = self.layout.total;
        let grads: Vec<&[f32]> = parts.iter().map(|sc| &sc.grad[..total]).collect();
        self.cores
            .sum_in_order(&grads, sized(&mut self.grad, total));
    }

    /// Supervised steps (the cold start): `−mean log π(target | prompt)` over every position of
    /// each batch (as burn's `supervised_steps`: padding included), a fresh Adam, one step per
    /// batch `(prompts [B·n], targets [B·T], T)`. Returns the last loss.
    pub fn supervised(&mut self, batches: &[(&[u32], &[u32], usize)], lr: f64) -> f32 {
        let mut adam = AdamState::new(self.layout.total);
        let mut last = 0.0f32;
        let score = Score {
            inv_t: 1.0,
            support: None,
            entropy: false,
        };
        for &(prompts, targets, t) in batches {
            // Every position counts, padding included (as burn's `supervised_steps`).
            let full = vec![t; targets.len() / t.max(1)];
            let rows = Rows {
                prompts,
                responses: targets,
                lens: &full,
                g: 1,
                t,
            };
            let (mut parts, ranges) = self.forward_parts(None, &rows, &score);
            let tokens = targets.len();
            zeroed(&mut self.logp, tokens);
            gather(&parts, &ranges, t, |sc| &sc.logp, &mut self.logp);
            let total: f64 = self.logp.iter().map(|&l| l as f64).sum();
            last = (-total / tokens as f64) as f32;
            let coef = vec![-1.0 / tokens as f32; tokens];
            let ones = vec![1.0f32; tokens];
            let coefs = Coefs {
                dlogp: &coef,
                dentropy: None,
                mask: &ones,
                inv_t: 1.0,
            };
            self.backward_parts(&mut parts, &ranges, t, &coefs);
            self.parts = parts;
            let hyper = self.hyper;
            adam.step(&mut self.w, &self.grad, 1.0, lr as f32, &hyper);
        }
        last
    }
}

/// How a part's forward is read: the temperature, the sampler's support to renormalise over
/// (the whole batch's), and whether each token's entropy is wanted.
struct Score<'a> {
    inv_t: f32,
    support: Option<&'a [u64]>,
    entropy: bool,
}

/// Each part's `[rows·T]` values (`of`) into their place in the whole `out [B·G·T]`.
fn gather(
    parts: &[Scratch],
    ranges: &[std::ops::Range<usize>],
    per_prompt: usize,
    of: impl Fn(&Scratch) -> &Vec<f32>,
    out: &mut [f32],
) {
    for (sc, p) in parts.iter().zip(ranges) {
        let (a, b) = (p.start * per_prompt, p.end * per_prompt);
        out[a..b].copy_from_slice(&of(sc)[..b - a]);
    }
}

impl Scratch {
    avx2_dispatch! {
        /// A part's forward (`x`, its tokens from `at` in the whole batch) and its softmax
        /// statistics per real token: `z = logits/T`, `log Z`, `log π` and (when asked) `H` into
        /// `[rows·T]` buffers (padding: 0).
        fn forward_scored via forward_scored_avx2 => forward_scored_body(
            &mut self,
            net: &Net,
            x: &Rows,
            at: usize,
            score: &Score,
        ) -> ()
    }

    avx2_dispatch! {
        /// A part's `∂L/∂logits` from its coefficients, then its backward into `self.grad`.
        fn backprop via backprop_avx2 => backprop_body(&mut self, net: &Net, c: &Coefs) -> ()
    }

    #[inline(always)]
    fn forward_scored_body(&mut self, net: &Net, x: &Rows, at: usize, score: &Score) {
        FusedTransformer::forward_into(net, x, self);
        let v = net.shape.vocab;
        let sel = self.geo.sel();
        let tokens = x.responses.len();
        if let Some(support) = score.support {
            keep_supports(
                &mut self.logits,
                &self.geo,
                v,
                Some(&support[at..at + tokens]),
            );
        }
        sized(&mut self.z, sel * v);
        sized(&mut self.logz, sel);
        zeroed(&mut self.ent, tokens);
        zeroed(&mut self.logp, tokens);
        let (mut e, mut p, mut h) = (vec![0.0f32; v], vec![0.0f32; v], vec![0.0f32; v]);
        for (k, i, _, _) in self.geo.selected() {
            let z = &mut self.z[k * v..(k + 1) * v];
            let stats = row_softmax(&self.logits[k * v..(k + 1) * v], score.inv_t, z, &mut e);
            self.logz[k] = stats.0;
            if score.entropy {
                self.ent[i] = row_entropy(z, &e, stats, &mut p, &mut h);
            }
            self.logp[i] = z[x.responses[i] as usize] - stats.0;
        }
        self.responses.clear();
        self.responses.extend_from_slice(x.responses);
    }

    #[inline(always)]
    fn backprop_body(&mut self, net: &Net, c: &Coefs) {
        let v = net.shape.vocab;
        // ∂L/∂z_j = c_t·(1[j = token] − p_j) + e_t·(−p_j·(log p_j + H)), then /T.
        let sel = self.geo.sel();
        let dl = zeroed(&mut self.dlogits, sel * v);
        for (k, i, _, _) in self.geo.selected() {
            if c.mask[i] == 0.0 {
                continue;
            }
            let coef = c.dlogp[i];
            let cw = c.dentropy.map_or(0.0, |e| -e[i]);
            let h = self.ent[i];
            let z = &self.z[k * v..(k + 1) * v];
            let lz = self.logz[k];
            let drow = &mut dl[k * v..(k + 1) * v];
            for (dv, &zi) in drow.iter_mut().zip(z) {
                let lpj = zi - lz;
                let p = exp_fast(lpj);
                *dv = (-coef * p + cw * p * (lpj + h)) * c.inv_t;
            }
            drow[self.responses[i] as usize] += coef * c.inv_t;
        }
        FusedTransformer::backward(net, self);
    }
}

/// How each row of a generation picks its next token.
pub enum Pick {
    /// Sampled with the counter-based draws of `objective::sampling` (row `r` of `B·G`), as
    /// the sampler sees the logits ([`super::draw_position`]).
    Sample(super::Draw),
    /// Argmax (lowest id on ties).
    Greedy,
}

/// What a generation produced.
#[derive(Debug, Clone, Default)]
pub struct Generation {
    /// Sampled rows (`B·G`), `<eos>` included when they closed.
    pub rows: Vec<Vec<u32>>,
    pub closed: Vec<bool>,
    /// `log π` (at the sampling temperature) of each sampled row's tokens, `[B·G·T]` with `T`
    /// the longest row, padding positions (after a row's end) holding 0, as the ragged
    /// teacher-forced pass ([`FusedTransformer::token_logp_ragged`]) leaves them.
    pub logp: Vec<f32>,
    /// The greedy answer to each prompt, when asked for.
    pub greedy: Option<Vec<Vec<u32>>>,
    /// The sampler's own log π of each drawn token, as `logp`, when its draw asks for it.
    pub sampler_logp: Option<Vec<f32>>,
    /// The sampler's support at each drawn token, as `logp`, when its draw asks for it.
    pub support: Option<Vec<u64>>,
}

impl FusedTransformer {
    /// Generate `G` sampled responses per prompt (and, if `with_greedy`, one greedy answer per
    /// prompt in the same pass) with a KV cache: the prompts' positions once per prompt, then
    /// one position per response and step, until every row closed or `max_len`. The rows are
    /// cut into parts, each with its own cache, decoded on the threads; the draws are taken here,
    /// for every row at once, so they do not depend on the parts.
    pub fn generate(
        &mut self,
        prompts: &[u32],
        g: usize,
        max_len: usize,
        pick: &Pick,
        temperature: f32,
        with_greedy: bool,
    ) -> Generation {
        let (n, v) = (self.n, self.shape.vocab);
        let eos = (v - 1) as u32;
        let b = prompts.len() / n;
        let sampled = b * g;
        let greedy_rows = if with_greedy { b } else { 0 };
        let r = sampled + greedy_rows;
        let prompt_of = |i: usize| if i < sampled { i / g } else { i - sampled };
        // Parts of rows (a prompt's rows may fall in two parts: each prefills it), so that a
        // redraw of a few prompts' groups still spreads: part `j` holds rows `ranges[j]`, and
        // the prompts `prompts_of[j]` in order of first use; `local[j][li]` is the part's
        // prompt of its row `li`.
        let ranges = self.parts_of(r, 1, max_len);
        let mut caches = std::mem::take(&mut self.caches);
        caches.resize_with(ranges.len(), Cache::default);
        let layers = self.layout.blocks.len();
        let d = self.shape.d_model;
        let (mut prompts_of, mut local) = (Vec::new(), Vec::new());
        let mut slot = vec![usize::MAX; b];
        for (c, rr) in caches.iter_mut().zip(&ranges) {
            let mut ps: Vec<usize> = Vec::new();
            let here: Vec<usize> = rr
                .clone()
                .map(|i| {
                    let p = prompt_of(i);
                    if slot[p] == usize::MAX {
                        slot[p] = ps.len();
                        ps.push(p);
                    }
                    slot[p]
                })
                .collect();
            for &p in &ps {
                slot[p] = usize::MAX;
            }
            c.size(layers, ps.len() * n * d, rr.len() * max_len * d);
            prompts_of.push(ps);
            local.push(here);
        }
        let net = self.net();
        // Prefill: the prompts' positions, once per prompt (and part).
        for s in 0..n {
            for (c, ps) in caches.iter_mut().zip(&prompts_of) {
                c.toks.clear();
                c.toks.extend(ps.iter().map(|&bi| prompts[bi * n + s]));
                c.prompt_of.clear();
                c.prompt_of.extend(0..ps.len());
                c.cache_row.clone_from(&c.prompt_of);
            }
            self.cores
                .each(&mut caches, |_, c| c.decode(&net, s, max_len, s + 1 == n));
        }
        // Logits at position n − 1 of each prompt, broadcast to its rows.
        let mut logits = vec![0.0f32; r * v];
        for (j, c) in caches.iter().enumerate() {
            for (li, i) in ranges[j].clone().enumerate() {
                let p = local[j][li];
                logits[i * v..(i + 1) * v].copy_from_slice(&c.logits[p * v..(p + 1) * v]);
            }
        }
        let mut rows: Vec<Vec<u32>> = vec![Vec::with_capacity(max_len); r];
        let mut closed = vec![false; r];
        let mut logp_all = vec![0.0f32; sampled * max_len];
        let inv_t = 1.0 / temperature;
        let (mut z, mut e) = (vec![0.0f32; v], vec![0.0f32; v]);
        let mut trace = super::Trace::default();
        for t in 0..max_len {
            if t > 0 {
                // Only the rows still open: a closed row's later positions are padding, which
                // nothing reads (its logits here stay stale and its draws are discarded).
                let mut open = 0;
                for (j, c) in caches.iter_mut().enumerate() {
                    c.toks.clear();
                    c.prompt_of.clear();
                    c.cache_row.clear();
                    for (li, i) in ranges[j].clone().enumerate() {
                        if !closed[i] {
                            c.cache_row.push(li);
                            c.prompt_of.push(local[j][li]);
                            c.toks.push(rows[i][t - 1]);
                        }
                    }
                    open += c.toks.len();
                }
                if open == 0 {
                    break;
                }
                self.cores.each(&mut caches, |_, c| {
                    if !c.toks.is_empty() {
                        c.decode(&net, n + t - 1, max_len, true);
                    }
                });
                for (j, c) in caches.iter().enumerate() {
                    for (k, &li) in c.cache_row.iter().enumerate() {
                        let i = ranges[j].start + li;
                        logits[i * v..(i + 1) * v].copy_from_slice(&c.logits[k * v..(k + 1) * v]);
                    }
                }
            }
            let next: Vec<u32> = match pick {
                Pick::Sample(d) => {
                    super::draw_position(&logits[..sampled * v], v, t, d, &mut trace)
                }
                Pick::Greedy => crate::objective::sampling::argmax_rows(&logits[..sampled * v], v),
            };
            let greedy_next = crate::objective::sampling::argmax_rows(&logits[sampled * v..], v);
            for i in 0..r {
                let tok = if closed[i] {
                    eos
                } else if i < sampled {
                    next[i]
                } else {
                    greedy_next[i - sampled]
                };
                if i < sampled && !closed[i] {
                    let row = &logits[i * v..(i + 1) * v];
                    let (lz, _) = row_softmax(row, inv_t, &mut z, &mut e);
                    logp_all[i * max_len + t] = z[tok as usize] - lz;
                }
                if !closed[i] {
                    rows[i].push(tok);
                    closed[i] = tok == eos;
                }
            }
        }
        self.caches = caches;
        let width = rows[..sampled]
            .iter()
            .map(|x| x.len())
            .max()
            .unwrap_or(1)
            .max(1);
        let logp = (0..sampled)
            .flat_map(|i| logp_all[i * max_len..i * max_len + width].iter().copied())
            .collect();
        let greedy = with_greedy.then(|| rows[sampled..].to_vec());
        rows.truncate(sampled);
        closed.truncate(sampled);
        let (sampler_logp, support) = match pick {
            Pick::Sample(d) => trace.finish(&rows, d.sampler),
            Pick::Greedy => (None, None),
        };
        Generation {
            sampler_logp,
            support,
            rows,
            closed,
            logp,
            greedy,
        }
    }
}

impl Cache {
    /// Room for every block's keys and values: `prompt` floats of the prompts' positions,
    /// `responses` of the rows'.
    fn size(&mut self, layers: usize, prompt: usize, responses: usize) {
        for buf in [&mut self.pk, &mut self.pv, &mut self.rk, &mut self.rv] {
            buf.resize_with(layers, Vec::new);
        }
        for l in 0..layers {
            sized(&mut self.pk[l], prompt);
            sized(&mut self.pv[l], prompt);
            sized(&mut self.rk[l], responses);
            sized(&mut self.rv[l], responses);
        }
    }

    avx2_dispatch! {
        /// One position `s` of the rows in `toks`: embed them, run the blocks against the cache
        /// (writing this position's keys and values into it), and when `logits` the final
        /// LayerNorm and head into `self.logits [rows, V]`. Row `i` belongs to (part-local)
        /// prompt `prompt_of[i]` and keeps its own positions in cache row `cache_row[i]`;
        /// positions `< n` are the prompt's (cached once per prompt).
        fn decode via decode_avx2 => decode_body(
            &mut self,
            net: &Net,
            s: usize,
            max_len: usize,
            logits: bool,
        ) -> ()
    }

    #[inline(always)]
    fn decode_body(&mut self, net: &Net, s: usize, max_len: usize, logits: bool) {
        let Net { shape, lay, n, w } = *net;
        let (v, d, f, hh) = (shape.vocab, shape.d_model, shape.d_ff, shape.heads);
        let c = self;
        let dh = d / hh;
        let rows = c.toks.len();
        let x = sized(&mut c.x, rows * d);
        for (xr, &tok) in x.chunks_exact_mut(d).zip(&c.toks) {
            embed(w, lay, d, tok, s, xr);
        }
        let scale = 1.0 / (dh as f32).sqrt();
        let mut rstd = vec![0.0f32; rows];
        let layers = lay.blocks.len();
        for (l, bl) in lay.blocks.iter().enumerate() {
            let ln1 = Ln {
                xhat: &mut c.tmp,
                rstd: &mut rstd,
                out: &mut c.a,
            };
            block_qkv(w, bl, (d, rows), &c.x, ln1, &mut c.qkv);
            // This position's keys and values into the cache.
            for (i, &p) in c.prompt_of.iter().enumerate().take(rows) {
                let kv = &c.qkv[i * 3 * d..(i + 1) * 3 * d];
                let (kd, vd) = if s < n {
                    let at = (p * n + s) * d;
                    (&mut c.pk[l][at..at + d], at)
                } else {
                    let at = (c.cache_row[i] * max_len + s - n) * d;
                    (&mut c.rk[l][at..at + d], at)
                };
                kd.copy_from_slice(&kv[d..2 * d]);
                if s < n {
                    c.pv[l][vd..vd + d].copy_from_slice(&kv[2 * d..]);
                } else {
                    c.rv[l][vd..vd + d].copy_from_slice(&kv[2 * d..]);
                }
            }
            if !logits && l + 1 == layers {
                // The last block's output here would feed only this position's logits, which
                // are not wanted (a prompt position before the last): its keys and values are
                // all later positions read.
                break;
            }
            let ctx = zeroed(&mut c.ctx, rows * d);
            let span = s + 1;
            let scores = sized(&mut c.scores, hh * span);
            // As the teacher-forced pass: the same attention over the cached keys and values.
            for i in 0..rows {
                let (p, cr) = (c.prompt_of[i], c.cache_row[i]);
                let (kp, vp, kr, vr) = (&c.pk[l], &c.pv[l], &c.rk[l], &c.rv[l]);
                let at = |j: usize| {
                    if j < n {
                        (p * n + j) * d
                    } else {
                        (cr * max_len + j - n) * d
                    }
                };
                attend(
                    &c.qkv[i * 3 * d..][..d],
                    span,
                    |j| {
                        if j < n {
                            &kp[at(j)..][..d]
                        } else {
                            &kr[at(j)..][..d]
                        }
                    },
                    |j| {
                        if j < n {
                            &vp[at(j)..][..d]
                        } else {
                            &vr[at(j)..][..d]
                        }
                    },
                    (hh, scale, span),
                    scores,
                    &mut ctx[i * d..][..d],
                );
            }
            let ln2 = Ln {
                xhat: &mut c.tmp,
                rstd: &mut rstd,
                out: &mut c.a,
            };
            block_rest(w, bl, (d, f, rows), &mut c.x, &c.ctx, ln2, &mut c.h, None);
        }
        if logits {
            let lnf = Ln {
                xhat: &mut c.tmp,
                rstd: &mut rstd,
                out: &mut c.a,
            };
            head(w, lay, (d, v, rows), &c.x, lnf, &mut c.logits);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{KlEstimator, LossAggMode, LossMode};
    use crate::rng::SplitMix64;

    fn shape() -> TransformerShape {
        TransformerShape {
            vocab: 6,
            context: 10,
            d_model: 8,
            heads: 2,
            layers: 2,
            d_ff: 12,
        }
    }

    /// A ragged batch: `B = 2` prompts of `n = 3`, `G = 3`, `T = 4`; lengths 4, 1, 2, 3, 4, 2.
    struct Case {
        prompts: Vec<u32>,
        responses: Vec<u32>,
        mask: Vec<f32>,
        advantages: Vec<f32>,
        old: Vec<f32>,
        refl: Vec<f32>,
    }

    const N: usize = 3;
    const G: usize = 3;
    const T: usize = 4;

    fn case(f: &mut FusedTransformer, seed: u64) -> Case {
        let mut rng = SplitMix64::new(seed);
        let v = f.shape.vocab as u64;
        let lengths = [4usize, 1, 2, 3, 4, 2];
        let prompts: Vec<u32> = (0..2 * N).map(|_| rng.below(v - 1) as u32).collect();
        let mut responses = Vec::new();
        let mut mask = Vec::new();
        for &len in &lengths {
            for i in 0..T {
                responses.push(if i + 1 == len && len < T {
                    (v - 1) as u32
                } else if i < len {
                    rng.below(v - 1) as u32
                } else {
                    (v - 1) as u32
                });
                mask.push((i < len) as u32 as f32);
            }
        }
        let logp = f.token_logp(None, &prompts, &responses, G, T, 0.9);
        let mut noisy =
            |x: &[f32]| -> Vec<f32> { x.iter().map(|v| v + 0.3 * rng.normal() as f32).collect() };
        let old = noisy(&logp);
        let refl = noisy(&logp);
        let advantages = (0..6).map(|i| i as f32 * 0.4 - 1.0).collect();
        Case {
            prompts,
            responses,
            mask,
            advantages,
            old,
            refl,
        }
    }

    fn input(c: &Case) -> StepInput<'_> {
        StepInput {
            prompts: &c.prompts,
            responses: &c.responses,
            mask: &c.mask,
            g: G,
            t: T,
            advantages: &c.advantages,
            token_advantages: None,
            old_logp: &c.old,
            ref_logp: &c.refl,
            sampler_logp: None,
            support: None,
        }
    }

    fn settings(mode: LossMode, est: KlEstimator, agg: LossAggMode, coef: f32) -> StepSettings {
        StepSettings {
            loss: LossSettings {
                mode,
                epsilon_low: 0.2,
                epsilon_high: 0.28,
                beta: 0.1,
                kl_in_loss: true,
                kl_estimator: est,
                agg,
                bug_ratio_quotient: false,
                max_len: 6,
                entropy_coef: coef,
                ..LossSettings::plain(LossMode::Naive, KlEstimator::K3, LossAggMode::TokenMean)
            },
            temperature: 0.9,
            lr: 1e-3,
            max_grad_norm: 0.0,
            entropy_dynamics: false,
        }
    }

    fn fused(seed: u64) -> FusedTransformer {
        let device = burn::tensor::Device::flex();
        let init = crate::model::TransformerPolicy::new(shape(), 20.0, seed, &device);
        let w = super::super::autodiff::flat_params(&crate::model::Policy::Transformer(init));
        let hyper = Hyper {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
        };
        FusedTransformer::new(shape(), N, w, hyper)
    }

    /// A batch the engine cuts into parts gives the same bits on 1 and 3 threads: the
    /// rollout (sampled and greedy rows, log π while sampling, the sampler's trace), the
    /// teacher-forced log π, the step's scalars, log π, entropy and gradient, the cold start.
    #[test]
    fn parts_give_the_same_bits_on_any_number_of_threads() {
        let shape = TransformerShape {
            vocab: 11,
            context: 12,
            d_model: 32,
            heads: 4,
            layers: 1,
            d_ff: 64,
        };
        let (n, b, g, t) = (5, 16, 8, 6);
        let device = burn::tensor::Device::flex();
        let init = crate::model::TransformerPolicy::new(shape, 3.0, 11, &device);
        let w = super::super::autodiff::flat_params(&crate::model::Policy::Transformer(init));
        let hyper = Hyper {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
        };
        let mut rng = SplitMix64::new(5);
        let prompts: Vec<u32> = (0..b * n).map(|_| rng.below(10) as u32).collect();
        let draw = super::super::Draw {
            params: crate::objective::sampling::SamplingParams {
                temperature: 1.0,
                top_k: 4,
                top_p: 1.0,
            },
            seed: 9,
            stream: 2,
            sampler: super::super::SamplerSide {
                bf16: true,
                record_logp: true,
                keep_support: true,
            },
        };
        let run = |threads: usize| {
            let mut f = FusedTransformer::new(shape, n, w.clone(), hyper).with_threads(threads);
            assert!(
                f.parts_of(b, g, t).len() > 1,
                "the case must be cut into parts"
            );
            let out = f.generate(&prompts, g, t, &Pick::Sample(draw), 1.0, true);
            let width = out.logp.len() / (b * g);
            let mut responses = vec![10u32; b * g * width];
            let mut mask = vec![0.0f32; b * g * width];
            for (i, row) in out.rows.iter().enumerate() {
                responses[i * width..i * width + row.len()].copy_from_slice(row);
                mask[i * width..i * width + row.len()].fill(1.0);
            }
            let lens: Vec<usize> = out.rows.iter().map(|r| r.len()).collect();
            let refl = f.token_logp_ragged(None, &prompts, &responses, &lens, g, width, 1.0, None);
            let advantages: Vec<f32> = (0..b * g).map(|i| (i % 5) as f32 * 0.5 - 1.0).collect();
            let x = StepInput {
                prompts: &prompts,
                responses: &responses,
                mask: &mask,
                g,
                t: width,
                advantages: &advantages,
                token_advantages: None,
                old_logp: &out.logp,
                ref_logp: &refl,
                sampler_logp: out.sampler_logp.as_deref(),
                support: out.support.as_deref(),
            };
            let st = settings(
                LossMode::Clipped,
                KlEstimator::K3,
                LossAggMode::TokenMean,
                0.01,
            );
            let (scalars, logp) = f.step(&x, &st);
            let grad = f.gradient().to_vec();
            let ent = f.token_entropy().to_vec();
            let targets: Vec<u32> = (0..64 * t).map(|i| ((i * 7 + i / t) % 11) as u32).collect();
            let sft_prompts: Vec<u32> = prompts.iter().cycle().take(64 * n).copied().collect();
            let sft = f.supervised(&[(&sft_prompts, &targets, t)], 1e-3);
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            (
                out.rows,
                out.greedy,
                bits(&out.logp),
                out.sampler_logp.map(|x| bits(&x)),
                out.support,
                bits(&refl),
                format!("{scalars:?}"),
                bits(&logp),
                bits(&ent),
                bits(&grad),
                sft.to_bits(),
                bits(&f.w),
            )
        };
        assert_eq!(run(1), run(3));
    }

    #[test]
    fn gelu_matches_burns_erf_form() {
        let mut worst = (0.0f32, 0.0f32);
        for i in 0..=200_000 {
            let x = -12.0 + 24.0 * i as f32 / 200_000.0;
            let want = 0.5 * x as f64 * (1.0 + libm::erf(x as f64 / std::f64::consts::SQRT_2));
            let pdf = (-0.5 * (x as f64).powi(2)).exp() / (2.0 * std::f64::consts::PI).sqrt();
            let want_grad =
                0.5 * (1.0 + libm::erf(x as f64 / std::f64::consts::SQRT_2)) + x as f64 * pdf;
            worst.0 = worst.0.max((gelu(x) as f64 - want).abs() as f32);
            worst.1 = worst.1.max((gelu_grad(x) as f64 - want_grad).abs() as f32);
        }
        eprintln!(
            "gelu: worst absolute error {:.2e}, of its derivative {:.2e}",
            worst.0, worst.1
        );
        assert!(worst.0 < 1e-6 && worst.1 < 1e-6, "{worst:?}");
    }

    /// `run.entropy_dynamics` on the transformer: the update is the same step's (its extra
    /// passes leave the weights and scalars alone), the measured change is the mean entropy's
    /// after the step minus before, and at a small learning rate `∇θH·Δθ` is that change to first
    /// order (Adam's first step moves every weight by about `lr`: the rest is O(lr²)).
    #[test]
    fn entropy_dynamics_measures_the_step_and_its_first_order_change() {
        for lr in [1e-4, 3e-3] {
            let mut plain = fused(4);
            let c = case(&mut plain, 5);
            let mut st = settings(
                LossMode::Clipped,
                KlEstimator::K3,
                LossAggMode::TokenMean,
                0.0,
            );
            st.lr = lr;
            let mut dyn_ = plain.clone();
            let (a, _) = plain.step(&input(&c), &st);
            st.entropy_dynamics = true;
            let (b, _) = dyn_.step(&input(&c), &st);
            assert_eq!(plain.w, dyn_.w, "the same update");
            assert_eq!(
                (a.loss, a.entropy, a.grad_norm),
                (b.loss, b.entropy, b.grad_norm)
            );
            assert_eq!((a.entropy_measured, a.entropy_first_order), (None, None));
            let measured = b.entropy_measured.expect("measured") as f64;
            let first = b.entropy_first_order.expect("first order") as f64;
            // The measured change by hand: the mean entropy after the update.
            dyn_.loss_and_gradient(&input(&c), &{
                let mut s = st;
                s.entropy_dynamics = false;
                s
            });
            let after = masked_sum_f64(&c.mask, dyn_.token_entropy()) / input(&c).tokens();
            assert!(
                (measured - (after - b.entropy as f64)).abs() < 1e-6,
                "{measured} vs {after} − {}",
                b.entropy
            );
            let gap = (measured - first).abs();
            eprintln!("lr {lr}: measured {measured:.3e}, first order {first:.3e}, gap {gap:.1e}");
            assert!(measured.abs() > 1e-7, "{measured}");
            if lr < 1e-3 {
                assert!(gap <= 0.05 * measured.abs(), "{measured} vs {first}");
            } else {
                // Bigger steps: the first-order term still has the change's sign.
                assert!(measured * first > 0.0, "{measured} vs {first}");
            }
        }
    }

    /// The analytic gradient against central differences (in f64 of the f32 loss) at a few
    /// coordinates of every parameter array; smooth settings (no clipping kink).
    #[test]
    fn gradient_matches_finite_differences() {
        let mut f = fused(1);
        let c = case(&mut f, 2);
        let st = settings(
            LossMode::Unclipped,
            KlEstimator::K3,
            LossAggMode::SeqMeanTokenMean,
            0.05,
        );
        f.loss_and_gradient(&input(&c), &st);
        let grad = f.gradient().to_vec();
        let lay = f.layout.clone();
        let b0 = lay.blocks[0];
        let b1 = lay.blocks[1];
        let starts = [
            lay.tok_emb,
            lay.pos_emb,
            b0.ln1_g,
            b0.ln1_b,
            b0.wqkv,
            b0.wo,
            b0.ln2_g,
            b0.w1,
            b0.b1,
            b0.w2,
            b1.wqkv,
            b1.b2,
            lay.lnf_g,
            lay.lnf_b,
            lay.head,
        ];
        let mut rng = SplitMix64::new(7);
        let mut worst = 0.0f32;
        for &start in &starts {
            for _ in 0..3 {
                let i = start + rng.below(8) as usize;
                let h = 1e-2f32;
                let at = |f: &mut FusedTransformer, x: f32| {
                    f.w[i] = x;
                    f.loss_and_gradient(&input(&c), &st).loss as f64
                };
                let x0 = f.w[i];
                let numeric = ((at(&mut f, x0 + h) - at(&mut f, x0 - h)) / (2.0 * h as f64)) as f32;
                f.w[i] = x0;
                let err = (numeric - grad[i]).abs() / (1e-3 + grad[i].abs().max(numeric.abs()));
                worst = worst.max(err);
                assert!(
                    (numeric - grad[i]).abs() <= 2e-3 + 0.05 * grad[i].abs(),
                    "weight {i} (array at {start}): numeric {numeric} vs analytic {}",
                    grad[i]
                );
            }
        }
        eprintln!("worst relative finite-difference error {worst:.2e}");
    }

    /// Loss, metrics and the whole gradient equal burn's autodiff on the same weights, for
    /// every loss mode, KL estimator and aggregation, with the entropy bonus.
    #[test]
    fn loss_and_gradient_equal_burn_autodiff() {
        use crate::engine::autodiff;
        use crate::model::Policy;
        use burn::module::{Module, ModuleVisitor, Param};
        use burn::optim::GradientsParams;
        use burn::tensor::{Device, Int, Tensor, TensorData};
        struct Flat<'a>(&'a GradientsParams, Vec<f32>);
        impl ModuleVisitor for Flat<'_> {
            fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
                let g = self
                    .0
                    .get::<D>(p.id)
                    .expect("a gradient for every parameter");
                self.1.extend(g.into_data().iter::<f32>());
            }
        }
        let mut f = fused(3);
        let c = case(&mut f, 4);
        let device = Device::flex().autodiff();
        let policy = Policy::Transformer(crate::model::TransformerPolicy::from_flat(
            shape(),
            &f.w,
            &device,
        ));
        let (b, t) = (2, T);
        let ints = |v: &[u32], s: Vec<usize>| {
            let v: Vec<i64> = v.iter().map(|&x| x as i64).collect();
            TensorData::new(v, s)
        };
        // The 2024 set × every estimator and aggregation, then the 2025–26 objectives (each
        // at the aggregations it allows, the sequence levels included).
        let mut all = vec![];
        for mode in [LossMode::Naive, LossMode::Unclipped, LossMode::Clipped] {
            for est in [KlEstimator::K1, KlEstimator::K2, KlEstimator::K3] {
                for agg in LossAggMode::ALL {
                    let coef = if all.len() % 2 == 0 { 0.03 } else { 0.0 };
                    all.push(settings(mode, est, *agg, coef));
                }
            }
        }
        {
            use crate::config::ImportanceSamplingLevel as Level;
            let k3 = |mode, agg, level| {
                let mut st = settings(mode, KlEstimator::K3, agg, 0.0);
                st.loss.level = level;
                st
            };
            use LossAggMode::{Luspo, SeqMeanTokenMean as Grpo, TokenMean};
            for (mode, agg, level) in [
                (LossMode::Cispo, TokenMean, Level::Token),
                (LossMode::Sapo, Grpo, Level::Token),
                (LossMode::Gmpo, Grpo, Level::Token),
                (LossMode::Clipped, Grpo, Level::Sequence),
                (LossMode::Clipped, Luspo, Level::Sequence),
                (LossMode::Sapo, Grpo, Level::Sequence),
                (LossMode::Clipped, TokenMean, Level::SequenceToken),
                (LossMode::Cispo, Grpo, Level::SequenceToken),
            ] {
                all.push(k3(mode, agg, level));
            }
            let mut dual = k3(LossMode::Clipped, Grpo, Level::Token);
            (dual.loss.dual_clip, dual.loss.delta) = (1.5, 1.4);
            all.push(dual);
            let mut top = k3(LossMode::Clipped, TokenMean, Level::Token);
            top.loss.top_entropy_quantile = 0.4;
            all.push(top);
        }
        for st in all {
            {
                {
                    let (mode, est, agg) = (st.loss.mode, st.loss.kl_estimator, st.loss.agg);
                    let ours = f.loss_and_gradient(&input(&c), &st);
                    let (logp, ent) = policy.score(
                        Tensor::<2, Int>::from_data(ints(&c.prompts, vec![b, N]), &device),
                        Tensor::<3, Int>::from_data(ints(&c.responses, vec![b, G, t]), &device),
                        st.temperature,
                        None,
                    );
                    // burn's side: log π and H by autodiff, the coefficients from the objective.
                    let (lp_h, ent_h) = autodiff::read_back(&logp, &ent);
                    let mut terms = TokenTerms::default();
                    let inputs = TokenInputs {
                        logp: &lp_h,
                        old_logp: &c.old,
                        ref_logp: &c.refl,
                        sampler_logp: None,
                        advantages: &c.advantages,
                        mask: &c.mask,
                        entropy: Some(&ent_h),
                        t,
                    };
                    loss::evaluate(&st.loss, &inputs, &mut terms);
                    let sur = autodiff::surrogate(logp, ent, &terms, &device);
                    let grads = GradientsParams::from_grads(sur.backward(), &policy);
                    let mut flat = Flat(&grads, Vec::new());
                    policy.visit(&mut flat);
                    let theirs = flat.1;
                    let label = format!("{mode:?} {est:?} {agg} {:?}", st.loss.level);
                    for (name, a, bv) in [
                        ("loss", ours.loss, terms.loss as f32),
                        ("kl", ours.kl, terms.kl),
                        ("clip_low", ours.clip_low, terms.clip_low),
                        ("clip_high", ours.clip_high, terms.clip_high),
                        ("ratio", ours.ratio_mean, terms.ratio_mean),
                        ("entropy", ours.entropy, terms.entropy),
                    ] {
                        assert!(
                            (a - bv).abs() <= 1e-5 * (1.0 + bv.abs()),
                            "{label}: {name} {a} vs {bv}"
                        );
                    }
                    let g = f.gradient();
                    assert_eq!(g.len(), theirs.len());
                    let scale = theirs.iter().fold(0.0f32, |m, x| m.max(x.abs()));
                    let worst = g
                        .iter()
                        .zip(&theirs)
                        .map(|(a, b)| (a - b).abs())
                        .fold(0.0f32, f32::max);
                    assert!(
                        worst <= 1e-4 * scale.max(1e-3),
                        "{label}: gradient differs by {worst} (largest component {scale})"
                    );
                }
            }
        }
    }

    /// The AVX2 build of the step and the portable one give bit-identical results.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn avx2_step_is_bit_identical_to_the_portable_step() {
        if !std::arch::is_x86_feature_detected!("avx2") {
            eprintln!("no AVX2 on this CPU: nothing to compare");
            return;
        }
        let mut f = fused(6);
        let c = case(&mut f, 7);
        let st = settings(
            LossMode::Clipped,
            KlEstimator::K3,
            LossAggMode::TokenMean,
            0.01,
        );
        let wide = f.loss_and_gradient(&input(&c), &st);
        let g_wide = f.gradient().to_vec();
        use std::sync::atomic::Ordering::Relaxed;
        crate::engine::PORTABLE_ONLY.store(true, Relaxed);
        let portable = f.loss_and_gradient(&input(&c), &st);
        crate::engine::PORTABLE_ONLY.store(false, Relaxed);
        assert_eq!(portable, wide);
        assert_eq!(g_wide, f.gradient());
    }

    /// Generation with the KV cache reads the same log-probs as the teacher-forced pass on
    /// the generated (padded) rows, and greedy rows in the same pass equal a greedy-only pass.
    #[test]
    fn kv_cache_generation_equals_teacher_forced() {
        let mut f = fused(5);
        let prompts: Vec<u32> = vec![1, 0, 4, 3, 3, 2, 0, 1, 2];
        let params = crate::objective::sampling::SamplingParams {
            temperature: 0.8,
            top_k: 0,
            top_p: 1.0,
        };
        let max_len = 6;
        let draw = |bf16| crate::engine::Draw {
            params,
            seed: 1,
            stream: 2,
            sampler: crate::engine::SamplerSide {
                bf16,
                record_logp: true,
                keep_support: false,
            },
        };
        let gen_out = f.generate(&prompts, 4, max_len, &Pick::Sample(draw(false)), 0.8, true);
        let t = gen_out.rows.iter().map(|r| r.len()).max().unwrap();
        let eos = 5;
        let padded: Vec<u32> = gen_out
            .rows
            .iter()
            .flat_map(|r| (0..t).map(move |i| r.get(i).copied().unwrap_or(eos)))
            .collect();
        let lens: Vec<usize> = gen_out.rows.iter().map(|r| r.len()).collect();
        let forced = f.token_logp_ragged(None, &prompts, &padded, &lens, 4, t, 0.8, None);
        assert_eq!(forced.len(), gen_out.logp.len());
        let worst = forced
            .iter()
            .zip(&gen_out.logp)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(worst < 1e-5, "sampling-time log-probs differ by {worst}");
        // With no gap the sampler's own log π is the learner's.
        let sampler = gen_out.sampler_logp.as_ref().expect("asked for");
        let gap = max_gap(sampler, &gen_out.logp);
        assert!(
            gap < 1e-5,
            "sampler and learner differ by {gap} with no gap"
        );
        let greedy = f.generate(&prompts, 1, max_len, &Pick::Greedy, 1.0, false);
        assert_eq!(gen_out.greedy.unwrap(), greedy.rows);
        assert!(greedy.sampler_logp.is_none());
        // bf16 logits: the sampler's log π parts from the learner's by bf16's rounding (a
        // relative 2⁻⁸ of each logit, here ~1e-3) and not more; rows may draw other tokens.
        let rounded = f.generate(&prompts, 4, max_len, &Pick::Sample(draw(true)), 0.8, false);
        let gap = max_gap(rounded.sampler_logp.as_ref().unwrap(), &rounded.logp);
        assert!(gap > 1e-6 && gap < 0.05, "bf16 gap {gap}");
    }

    fn max_gap(a: &[f32], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len());
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0f32, f32::max)
    }
}
