//! The GRPO objective and its 2025–26 family (GRPO-SPEC §4; CISPO, SAPO, GMPO, GSPO,
//! GSPO-token, LUSPO, dual clip, δ), once: the settings every engine reads, the scalar
//! formulas — ratio, clip, loss, KL k1/k2/k3, the aggregation's weights — and
//! [`evaluate`], the whole objective of one optimizer step over a batch's tokens: its value and
//! its derivative with respect to each token's `log π` (and entropy). Every engine takes those
//! per-token coefficients and applies them through its own backward (the fused CPU engines by
//! hand, burn's autodiff as the surrogate `Σ_t c_t·log π_t`); `shaders/common.wgsl` mirrors the
//! per-token formulas for the WGSL engine. A new objective is written here and there only.

use crate::config::{CovPenalty, ImportanceSamplingLevel, KlEstimator, LossAggMode, LossMode};
use crate::objective::correction::{self, Correction};
use crate::objective::numeric::{
    exp_fast, map2, masked_dot_f64, masked_sum_f64, sized, sum_f64, zeroed,
};

/// Everything the per-token loss needs besides the log-probs.
#[derive(Debug, Clone, Copy)]
pub struct LossSettings {
    pub mode: LossMode,
    pub epsilon_low: f32,
    pub epsilon_high: f32,
    /// β; the KL term is added to the loss only when this is > 0 and `kl_in_loss`.
    pub beta: f32,
    pub kl_in_loss: bool,
    pub kl_estimator: KlEstimator,
    pub agg: LossAggMode,
    /// BUG (gallery): ratio as `logπ / logπ_old`.
    pub bug_ratio_quotient: bool,
    /// Dr. GRPO's constant normaliser (`seq-mean-token-sum-norm`): the longest a response may
    /// be (`task.max_len` for the transformer, `n` for the lecture model), never the batch's
    /// padded width.
    pub max_len: usize,
    /// The entropy bonus `c`: the loss gains `− c·H`, aggregated like the loss.
    pub entropy_coef: f32,
    /// BUG (gallery): π_old recomputed with gradient, so `ρ ≡ 1` and `∂ρ/∂log π = 0`.
    pub unfrozen_old_policy: bool,
    /// BUG (gallery): the reference is the policy itself, so the KL and its gradient are 0.
    pub shared_reference: bool,
    /// Where the ratio lives: per token, per sequence (GSPO) or GSPO-token.
    pub level: ImportanceSamplingLevel,
    /// Dual clip `c` (0 = off): for A < 0 the clipped loss is capped at `c·|A|`.
    pub dual_clip: f32,
    /// δ (0 = off): the clipped loss's unclipped branch uses `min(r, δ)`.
    pub delta: f32,
    /// CISPO's cap on the detached ratio.
    pub cispo_max_ratio: f32,
    /// SAPO's gate temperatures for A > 0 and A ≤ 0.
    pub sapo_tau_pos: f32,
    pub sapo_tau_neg: f32,
    /// ρ of the "80/20" rule (1 = off): only the batch's top-ρ entropy tokens keep `ℓ_t`.
    pub top_entropy_quantile: f32,
    /// The entropy mechanism's covariance rule (Clip-Cov, KL-Cov) and its numbers: the
    /// fraction of real tokens it picks (rounded up), Clip-Cov's covariance window, KL-Cov's κ.
    pub cov: CovPenalty,
    pub cov_ratio: f32,
    pub cov_lb: f32,
    pub cov_ub: f32,
    pub kl_cov_coef: f32,
    /// This step's random stream, for the rules that draw tokens across the batch (Clip-Cov).
    pub stream: u64,
    /// The mismatch lab's weight on each token's policy-gradient term (`objective::correction`).
    pub correction: Correction,
    /// DeepSeek-V3.2's unbiased KL: `KL_t` weighted by `π_θ/π_old` (gradient through both).
    pub unbiased_kl: bool,
}

impl LossSettings {
    /// The settings of a config's algorithm section.
    pub fn of(c: &crate::config::RunConfig) -> Self {
        let a = &c.algorithm;
        Self {
            mode: a.loss,
            epsilon_low: a.epsilon_low as f32,
            epsilon_high: a.epsilon_high as f32,
            beta: a.beta as f32,
            kl_in_loss: a.kl_penalty == crate::config::KlPenaltyMode::Loss,
            kl_estimator: a.kl_estimator,
            agg: a.loss_agg_mode,
            bug_ratio_quotient: a.bugs.ratio_as_logprob_quotient,
            max_len: c.max_len(),
            entropy_coef: a.entropy_coef as f32,
            unfrozen_old_policy: a.bugs.unfrozen_old_policy,
            shared_reference: a.bugs.shared_reference,
            level: a.importance_sampling_level,
            dual_clip: a.dual_clip as f32,
            delta: a.delta as f32,
            cispo_max_ratio: a.cispo_max_ratio as f32,
            sapo_tau_pos: a.sapo_temperature_pos as f32,
            sapo_tau_neg: a.sapo_temperature_neg as f32,
            top_entropy_quantile: a.top_entropy_quantile as f32,
            cov: a.cov_penalty,
            cov_ratio: match a.cov_penalty {
                CovPenalty::KlCov => a.kl_cov_ratio as f32,
                _ => a.clip_cov_ratio as f32,
            },
            cov_lb: a.clip_cov_lb as f32,
            cov_ub: a.clip_cov_ub as f32,
            kl_cov_coef: a.kl_cov_coef as f32,
            stream: 0,
            correction: Correction::of(a),
            unbiased_kl: a.unbiased_kl,
        }
    }

    /// The same settings with one step's random stream.
    pub fn with_stream(self, stream: u64) -> Self {
        Self { stream, ..self }
    }

    /// GRPO-SPEC §4's settings with no bug switched on and no entropy bonus.
    pub fn plain(mode: LossMode, kl_estimator: KlEstimator, agg: LossAggMode) -> Self {
        Self {
            mode,
            epsilon_low: 0.2,
            epsilon_high: 0.2,
            beta: 0.0,
            kl_in_loss: true,
            kl_estimator,
            agg,
            bug_ratio_quotient: false,
            max_len: 0,
            entropy_coef: 0.0,
            unfrozen_old_policy: false,
            shared_reference: false,
            level: ImportanceSamplingLevel::Token,
            dual_clip: 0.0,
            delta: 0.0,
            cispo_max_ratio: 5.0,
            sapo_tau_pos: 1.0,
            sapo_tau_neg: 1.05,
            top_entropy_quantile: 1.0,
            cov: CovPenalty::None,
            cov_ratio: 2e-4,
            cov_lb: 1.0,
            cov_ub: 5.0,
            kl_cov_coef: 0.1,
            stream: 0,
            correction: Correction::NONE,
            unbiased_kl: false,
        }
    }

    /// The per-token loss's parameters, as `reference::pg_term` and `common.wgsl` read them.
    pub fn pg(&self) -> PgParams {
        // GMPO clips log r to [−ε_low, ε_high]: in ratio space [e^−ε_low, e^ε_high].
        let (lo, hi) = match self.mode {
            LossMode::Gmpo => ((-self.epsilon_low).exp(), self.epsilon_high.exp()),
            _ => (1.0 - self.epsilon_low, 1.0 + self.epsilon_high),
        };
        PgParams {
            mode: self.mode,
            lo,
            hi,
            dual_clip: self.dual_clip,
            delta: self.delta,
            cispo_cap: self.cispo_max_ratio,
            tau_pos: self.sapo_tau_pos,
            tau_neg: self.sapo_tau_neg,
        }
    }

    /// Whether a token's ratio is its response's (GSPO, GSPO-token, GMPO's geometric mean).
    pub fn sequence_ratio(&self) -> bool {
        self.level != ImportanceSamplingLevel::Token || self.mode == LossMode::Gmpo
    }

    /// Whether the gradient of a response's loss reaches every token of it through the mean
    /// log-ratio (GSPO and GMPO), rather than each token's own log π (GSPO-token, CISPO).
    pub fn coupled(&self) -> bool {
        self.level == ImportanceSamplingLevel::Sequence || self.mode == LossMode::Gmpo
    }

    /// How the ratio is formed under these settings.
    pub fn ratio_form(&self) -> RatioForm {
        if self.unfrozen_old_policy {
            RatioForm::Unfrozen
        } else if self.bug_ratio_quotient {
            RatioForm::Quotient
        } else {
            RatioForm::Exp
        }
    }

    /// Whether the KL term is part of the loss (it is logged always).
    pub fn kl_on(&self) -> bool {
        self.kl_in_loss && self.beta > 0.0
    }
}

/// The per-token policy-gradient term's parameters: the loss, the clip range `[lo, hi]` (ratio
/// space), and each objective's knobs (0 where a cap is off, as `common.wgsl` reads them).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PgParams {
    pub mode: LossMode,
    pub lo: f32,
    pub hi: f32,
    /// Dual clip `c` (0 = off).
    pub dual_clip: f32,
    /// δ (0 = off).
    pub delta: f32,
    pub cispo_cap: f32,
    pub tau_pos: f32,
    pub tau_neg: f32,
}

/// How `ρ = π_θ/π_old` is formed: the right way, or one of the bug gallery's two.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RatioForm {
    /// `exp(log π − log π_old)`.
    Exp,
    /// BUG: `log π / log π_old`.
    Quotient,
    /// BUG: π_old recomputed with gradient: `ρ ≡ 1` and its derivative vanishes.
    Unfrozen,
}

/// One optimizer step's per-token inputs. `R` responses padded to `T` positions; every
/// `[R·T]` array is row-major by response.
#[derive(Debug, Clone, Copy)]
pub struct TokenInputs<'a> {
    /// `[R·T]` log π_θ of each sampled token (the only input the engine differentiates).
    pub logp: &'a [f32],
    /// `[R·T]` log π_old (frozen at the iteration's start).
    pub old_logp: &'a [f32],
    /// `[R·T]` log π_ref.
    pub ref_logp: &'a [f32],
    /// `[R·T]` the sampler's own log π of each token, where it differs from what the learner
    /// scores (the mismatch lab); `None`: the sampler is π_old.
    pub sampler_logp: Option<&'a [f32]>,
    /// `[R]` one advantage per response, or `[R·T]` one per token (PPO's GAE).
    pub advantages: &'a [f32],
    /// `[R·T]` 1 on real tokens, 0 on padding (padding contributes nothing, whatever it holds).
    pub mask: &'a [f32],
    /// `[R·T]` each token's entropy `H_t` (at the sampling temperature); `None` where the engine
    /// does not compute it (then the entropy bonus must be off and the entropy mean is NaN).
    pub entropy: Option<&'a [f32]>,
    /// `T`, the padded width.
    pub t: usize,
}

/// What [`evaluate`] returns: the loss, its per-token coefficients, and the step's statistics.
/// Buffers are reused across calls (an engine keeps one `TokenTerms`).
#[derive(Debug, Clone, Default)]
pub struct TokenTerms {
    /// The aggregated loss `Σ_t w_t·(ℓ_t + β·KL_t − c·H_t)`.
    pub loss: f64,
    /// `[R·T]` `∂L/∂log π_t`, the aggregation's weight included; 0 on padding.
    pub dlogp: Vec<f32>,
    /// `[R·T]` `∂L/∂H_t` (`− c·w_t`); empty when the entropy bonus is off.
    pub dentropy: Vec<f32>,
    /// Means over real tokens: KL(π_θ ‖ π_ref) by the configured estimator, the clip fractions
    /// (low: `ρ < 1 − ε_low` with `A < 0`; high: `ρ > 1 + ε_high` with `A > 0`), `ρ`, and `H`.
    pub kl: f32,
    pub clip_low: f32,
    pub clip_high: f32,
    pub ratio_mean: f32,
    pub entropy: f32,
    /// `[R·T]` per token, for the inspector and the tests: `A_t`, `ρ_t`, the policy-gradient
    /// term `ℓ_t` and its derivative, `KL_t` and `β·∂KL_t/∂log π`, the aggregation weight `w_t`.
    pub adv: Vec<f32>,
    pub ratio: Vec<f32>,
    /// `[R·T]` the ratio the objective uses where it is the response's — GSPO's
    /// `s = exp(mean_t log r_t)`, GMPO's geometric mean of the clipped token ratios — on each
    /// of its tokens; empty at the token level.
    pub seq_ratio: Vec<f32>,
    /// `[R·T]` GMPO: whether a token's log-ratio is inside its clip (1) or clipped (0, no
    /// gradient through it); GSPO: 1 on real tokens. Empty at the token level.
    pub live: Vec<f32>,
    pub term: Vec<f32>,
    pub dterm: Vec<f32>,
    pub kl_tokens: Vec<f32>,
    pub dkl: Vec<f32>,
    pub weight: Vec<f32>,
    /// `[R·T]` the correction's weight `ω_t` on `ℓ_t` (`objective::correction`); empty when off.
    pub is_weight: Vec<f32>,
}

impl TokenTerms {
    /// The ratio whose clip the objective applies, per token: the response's for GSPO and
    /// GSPO-token, each token's own at the token level and for GMPO (whose clip is per token).
    pub fn clipped_ratio(&self, s: &LossSettings) -> &[f32] {
        if s.sequence_ratio() && s.mode != LossMode::Gmpo {
            &self.seq_ratio
        } else {
            &self.ratio
        }
    }
}

/// The objective of one optimizer step over a batch's tokens (GRPO-SPEC §4): the per-token
/// policy-gradient term (`reference::pg_term`, with each token's ratio or its response's), the
/// KL penalty (in the loss when β > 0), the entropy bonus, aggregated by the configured mode;
/// its value and `∂L/∂log π_t` (through the response's mean log-ratio where the loss has one).
/// Passes over plain arrays, one monomorphic loop per mode and estimator, so they vectorize.
#[inline(always)]
pub fn evaluate(s: &LossSettings, x: &TokenInputs, out: &mut TokenTerms) {
    let n = x.logp.len();
    debug_assert!(x.old_logp.len() == n && x.ref_logp.len() == n && x.mask.len() == n);
    let totals = BatchTotals::of(x.mask, x.t);
    token_passes(s, x, out);
    if s.cov != CovPenalty::None {
        cov_rule(s, x, out);
    }
    if s.top_entropy_quantile < 1.0 {
        top_entropy(s, x, out);
    }
    let sums = weigh(s, x, &totals, out);
    finish(&[sums], out);
}

/// Whether [`evaluate`] can run on a batch's responses in spans ([`evaluate_span`]): every
/// term is the token's or its response's, the batch enters only through [`BatchTotals`] — no
/// batch-level rule (the covariance rules, the top-entropy quantile).
pub fn splits(s: &LossSettings) -> bool {
    s.cov == CovPenalty::None && s.top_entropy_quantile >= 1.0
}

/// What a batch's aggregation weights read of the whole batch: its responses and real tokens.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BatchTotals {
    pub responses: usize,
    /// Real tokens (a count of a 0/1 mask: exact in f32).
    pub tokens: f32,
}

impl BatchTotals {
    /// The totals of a `[R·T]` mask.
    pub fn of(mask: &[f32], t: usize) -> Self {
        Self {
            responses: mask.len() / t.max(1),
            tokens: crate::objective::numeric::lanes8(mask, 0.0, |a, b| a + b),
        }
    }
}

/// One span's sums over its real tokens, which [`finish`] turns into the step's scalars.
#[derive(Debug, Clone, Copy, Default)]
pub struct SpanSums {
    /// `Σ w·(ℓ + β·KL − c·H)`
    pub loss: f64,
    pub kl: f64,
    pub ratio: f64,
    pub entropy: Option<f64>,
    pub count: f64,
    pub clip_low: u32,
    pub clip_high: u32,
}

/// [`evaluate`] on a span of whole responses of a batch whose totals are `totals` (the
/// responses' own terms, their coefficients into `out`), when [`splits`] holds; its sums
/// returned. [`finish`] over the spans' sums, in span order, gives the batch's scalars: the
/// per-token values are [`evaluate`]'s bit for bit, the sums equal up to their order.
#[inline(always)]
pub fn evaluate_span(
    s: &LossSettings,
    x: &TokenInputs,
    totals: &BatchTotals,
    out: &mut TokenTerms,
) -> SpanSums {
    assert!(splits(s), "a batch-level rule needs the whole batch");
    token_passes(s, x, out);
    weigh(s, x, totals, out)
}

/// The step's scalars into `out` from its spans' sums, added in span order.
pub fn finish(spans: &[SpanSums], out: &mut TokenTerms) {
    let add = |f: fn(&SpanSums) -> f64| {
        let (first, rest) = spans.split_first().expect("at least one span");
        rest.iter().fold(f(first), |a, b| a + f(b))
    };
    let count = add(|x| x.count).max(1.0);
    let (low, high) = spans.iter().fold((0u64, 0u64), |(l, h), x| {
        (l + x.clip_low as u64, h + x.clip_high as u64)
    });
    out.loss = add(|x| x.loss);
    out.kl = (add(|x| x.kl) / count) as f32;
    out.clip_low = (low as f64 / count) as f32;
    out.clip_high = (high as f64 / count) as f32;
    out.ratio_mean = (add(|x| x.ratio) / count) as f32;
    out.entropy = match spans[0].entropy {
        Some(_) => (add(|x| x.entropy.unwrap_or(f64::NAN)) / count) as f32,
        None => f32::NAN,
    };
}

/// The passes of every token on its own or within its response: `A_t`, `ρ_t` (and the
/// response's ratio), `KL_t`, `ℓ_t` and their derivatives.
#[inline(always)]
fn token_passes(s: &LossSettings, x: &TokenInputs, out: &mut TokenTerms) {
    per_token_advantages(x, &mut out.adv);
    ratios(s.ratio_form(), x, &mut out.ratio);
    if s.sequence_ratio() {
        sequence_ratios(s, x, out);
    } else {
        out.seq_ratio.clear();
        out.live.clear();
    }
    kl_terms(s, x, out);
    pg_terms(s, x, out);
}

/// The correction's weights, the aggregation's, and the coefficients and sums.
#[inline(always)]
fn weigh(
    s: &LossSettings,
    x: &TokenInputs,
    totals: &BatchTotals,
    out: &mut TokenTerms,
) -> SpanSums {
    if s.correction.on() {
        is_weights(s, x, out);
    } else {
        out.is_weight.clear();
    }
    reference::aggregation_weights_of(s.agg, x.mask, x.t, s.max_len, totals, &mut out.weight);
    aggregate(s, x, out)
}

/// One response's terms (every token real, no entropy bonus): what the inspector and the
/// exports show per token — its ratio (the response's at the sequence level), `ℓ_t`, flags.
pub fn response_terms(
    s: &LossSettings,
    logp: &[f32],
    old_logp: &[f32],
    ref_logp: &[f32],
    adv: f32,
) -> TokenTerms {
    let mask = vec![1.0; logp.len()];
    let advantages = [adv];
    let x = TokenInputs {
        logp,
        old_logp,
        ref_logp,
        sampler_logp: None,
        advantages: &advantages,
        mask: &mask,
        entropy: None,
        t: logp.len(),
    };
    let mut out = TokenTerms::default();
    let s = LossSettings {
        entropy_coef: 0.0,
        ..*s
    };
    evaluate(&s, &x, &mut out);
    out
}

/// `A_t`: one per response broadcast over its tokens, or one per token.
#[inline(always)]
fn per_token_advantages(x: &TokenInputs, adv: &mut Vec<f32>) {
    // Every element written below (the chunks cover `[B·G·T]` whole).
    let adv = sized(adv, x.logp.len());
    if x.advantages.len() == adv.len() {
        adv.copy_from_slice(x.advantages);
    } else {
        for (chunk, &a) in adv.chunks_exact_mut(x.t.max(1)).zip(x.advantages) {
            chunk.fill(a);
        }
    }
}

/// `ρ_t`.
#[inline(always)]
fn ratios(form: RatioForm, x: &TokenInputs, ratio: &mut Vec<f32>) {
    let ratio = sized(ratio, x.logp.len());
    let pairs = ratio.iter_mut().zip(x.logp).zip(x.old_logp);
    match form {
        // Its own monomorphic loop (it vectorizes).
        RatioForm::Exp => {
            for ((r, &l), &o) in pairs {
                *r = reference::ratio_of(RatioForm::Exp, l, o, exp_fast).0;
            }
        }
        _ => {
            for ((r, &l), &o) in pairs {
                *r = reference::ratio_of(form, l, o, exp_fast).0;
            }
        }
    }
}

/// The response's ratio on each of its tokens: `s_i = exp(mean_t log r̃_t)` over its real
/// tokens, `r̃` the token log-ratio (GSPO) or GMPO's clipped one; `live_t` its derivative
/// with respect to `log r_t` (1, or 0 where GMPO's clip holds it). A response with no real
/// token has `s = 1` (TRL's `clamp(min = 1)`).
#[inline(never)]
fn sequence_ratios(s: &LossSettings, x: &TokenInputs, out: &mut TokenTerms) {
    let n = x.logp.len();
    let t = x.t.max(1);
    let gmpo = s.mode == LossMode::Gmpo;
    let (seq, live) = (zeroed(&mut out.seq_ratio, n), zeroed(&mut out.live, n));
    let rows = seq.chunks_exact_mut(t).zip(live.chunks_exact_mut(t));
    for (i, (srow, lrow)) in rows.enumerate() {
        let span = i * t..(i + 1) * t;
        let (mut sum, mut len) = (0.0f64, 0.0f64);
        let cells = x.logp[span.clone()]
            .iter()
            .zip(&x.old_logp[span.clone()])
            .zip(&out.adv[span.clone()])
            .zip(&x.mask[span]);
        for ((((&lp, &old), &a), &m), l) in cells.zip(lrow.iter_mut()) {
            if m == 0.0 {
                continue;
            }
            let lr = lp - old;
            let (v, d) = if gmpo {
                reference::gmpo_log_ratio(lr, a, s.epsilon_low, s.epsilon_high)
            } else {
                (lr, 1.0)
            };
            sum += v as f64;
            len += 1.0;
            *l = d;
        }
        srow.fill(exp_fast((sum / len.max(1.0)) as f32));
    }
}

/// `KL_t` (logged always) and `β·∂KL_t/∂log π` (0 when the KL is not in the loss).
#[inline(always)]
fn kl_terms(s: &LossSettings, x: &TokenInputs, out: &mut TokenTerms) {
    let n = x.logp.len();
    let beta = if s.kl_on() { s.beta } else { 0.0 };
    let (kl, dkl) = (sized(&mut out.kl_tokens, n), sized(&mut out.dkl, n));
    let (lp, rf) = (x.logp, x.ref_logp);
    match s.kl_estimator {
        KlEstimator::K1 => map2(lp, rf, kl, dkl, |lp, rf| {
            reference::kl_term(KlEstimator::K1, lp, rf, beta, exp_fast)
        }),
        KlEstimator::K2 => map2(lp, rf, kl, dkl, |lp, rf| {
            reference::kl_term(KlEstimator::K2, lp, rf, beta, exp_fast)
        }),
        KlEstimator::K3 => map2(lp, rf, kl, dkl, |lp, rf| {
            reference::kl_term(KlEstimator::K3, lp, rf, beta, exp_fast)
        }),
    }
    if s.shared_reference {
        // BUG (gallery): log π_ref is log π itself, gradient included: KL ≡ 0, ∂KL ≡ 0.
        kl.fill(0.0);
    }
    if !s.kl_on() || s.shared_reference {
        // Logged only, no gradient (0·∞ where the logged KL overflowed would be NaN).
        dkl.fill(0.0);
    }
    if s.unbiased_kl {
        unbiased_kl(s, x, kl, dkl);
    }
}

/// DeepSeek-V3.2's unbiased KL: `KL_t ← r_t·KL_t`, so `β·∂/∂log π` becomes
/// `β·(∂r_t/∂log π)·KL_t + r_t·β·∂KL_t/∂log π` (the gradient flows through both, as in TRL).
#[inline(never)]
fn unbiased_kl(s: &LossSettings, x: &TokenInputs, kl: &mut [f32], dkl: &mut [f32]) {
    let beta = if s.kl_on() && !s.shared_reference {
        s.beta
    } else {
        0.0
    };
    let form = s.ratio_form();
    for i in 0..kl.len() {
        let (r, dr) = reference::ratio_of(form, x.logp[i], x.old_logp[i], exp_fast);
        dkl[i] = beta * dr * kl[i] + r * dkl[i];
        kl[i] *= r;
    }
}

/// The mismatch lab's correction: `ℓ_t ← ω_t·ℓ_t` (and its derivative), `ω_t` detached.
#[inline(never)]
fn is_weights(s: &LossSettings, x: &TokenInputs, out: &mut TokenTerms) {
    let tokens = correction::Tokens {
        logp: x.logp,
        old_logp: x.old_logp,
        sampler_logp: x.sampler_logp,
        adv: &out.adv,
        mask: x.mask,
        t: x.t,
    };
    correction::weights(&s.correction, &tokens, &mut out.is_weight);
    let w = &out.is_weight;
    for ((t, d), &o) in out.term.iter_mut().zip(out.dterm.iter_mut()).zip(w) {
        *t *= o;
        *d *= o;
    }
}

/// `ℓ_t` and `∂ℓ_t/∂log π` — with the response's ratio `s` where it has one, `∂ℓ_t/∂log s`
/// (the same formula with `∂s/∂log s = s`; `aggregate` takes it on to each token).
#[inline(always)]
fn pg_terms(s: &LossSettings, x: &TokenInputs, out: &mut TokenTerms) {
    let n = x.logp.len();
    let p = s.pg();
    let (term, dterm) = (sized(&mut out.term, n), sized(&mut out.dterm, n));
    let ratio = if s.sequence_ratio() {
        &out.seq_ratio[..]
    } else {
        &out.ratio[..]
    };
    let (adv, lp) = (&out.adv[..], x.logp);
    // One monomorphic loop per loss (the mode a constant inside each), so each vectorizes.
    // The 2024 losses inline into the engines' AVX2 bodies; the rest are compiled once
    // outside them (`#[inline(never)]`), so the engines' hot bodies keep their size.
    macro_rules! per_mode {
        ($($mode:ident),+; $($cold:ident),+) => {
            match (s.ratio_form(), s.mode) {
                $((RatioForm::Exp, LossMode::$mode) => {
                    pg_loop::<{ LossMode::$mode as u8 }>(&p, adv, ratio, lp, term, dterm)
                })+
                $((RatioForm::Exp, LossMode::$cold) => {
                    pg_loop_outlined::<{ LossMode::$cold as u8 }>(&p, adv, ratio, lp, term, dterm)
                })+
                (form, _) => pg_loop_bug(form, &p, x, adv, ratio, term, dterm),
            }
        };
    }
    per_mode!(Naive, Unclipped, Clipped; Cispo, Sapo, Gmpo);
}

/// `pg_loop`, not inlined into the engines' hot bodies.
#[inline(never)]
fn pg_loop_outlined<const MODE: u8>(
    p: &PgParams,
    adv: &[f32],
    ratio: &[f32],
    lp: &[f32],
    term: &mut [f32],
    dterm: &mut [f32],
) {
    pg_loop::<MODE>(p, adv, ratio, lp, term, dterm)
}

/// The bug gallery's ratio forms, token by token.
#[inline(never)]
fn pg_loop_bug(
    form: RatioForm,
    p: &PgParams,
    x: &TokenInputs,
    adv: &[f32],
    ratio: &[f32],
    term: &mut [f32],
    dterm: &mut [f32],
) {
    for i in 0..term.len() {
        let dr = reference::ratio_of(form, x.logp[i], x.old_logp[i], exp_fast).1;
        (term[i], dterm[i]) = reference::pg_term(p, adv[i], ratio[i], dr, x.logp[i], exp_fast);
    }
}

/// `(ℓ_t, ∂ℓ_t/∂log π)` of every token with `r = exp(log π − log π_old)`, the loss a constant
/// (`MODE` indexes `LossMode::ALL`) so the loop is one monomorphic, vectorizable body.
#[inline(always)]
fn pg_loop<const MODE: u8>(
    p: &PgParams,
    adv: &[f32],
    ratio: &[f32],
    lp: &[f32],
    term: &mut [f32],
    dterm: &mut [f32],
) {
    let p = PgParams {
        mode: LossMode::ALL[MODE as usize],
        ..*p
    };
    let inputs = adv.iter().zip(ratio).zip(lp);
    for ((t, d), ((&a, &r), &lp)) in term.iter_mut().zip(dterm.iter_mut()).zip(inputs) {
        (*t, *d) = reference::pg_term(&p, a, r, r, lp, exp_fast);
    }
}

/// The coefficients `∂L/∂log π_t = w_t·(∂ℓ_t + β·∂KL_t)`, `∂L/∂H_t = −c·w_t`, the loss
/// `Σ_t w_t·(ℓ_t + β·KL_t − c·H_t)` and the sums over real tokens (padding is skipped, so
/// whatever it holds never reaches a sum).
#[inline(always)]
fn aggregate(s: &LossSettings, x: &TokenInputs, out: &mut TokenTerms) -> SpanSums {
    let n = x.logp.len();
    let c = s.entropy_coef;
    let bonus = c != 0.0;
    assert!(
        !bonus || x.entropy.is_some(),
        "the entropy bonus needs each token's entropy"
    );
    let (mask, w) = (&x.mask[..n], &out.weight[..n]);
    let (dterm, dkl) = (&out.dterm[..n], &out.dkl[..n]);
    // Branch-free selects, so the passes vectorize; padding's values never reach a result.
    let dl = sized(&mut out.dlogp, n);
    if s.coupled() {
        couple(x, &out.live, w, dterm, dkl, dl);
    } else {
        for ((((d, &m), &wi), &dt), &dk) in dl.iter_mut().zip(mask).zip(w).zip(dterm).zip(dkl) {
            *d = if m != 0.0 { wi * (dt + dk) } else { 0.0 };
        }
    }
    let de = sized(&mut out.dentropy, if bonus { n } else { 0 });
    for ((d, &m), &wi) in de.iter_mut().zip(mask).zip(w) {
        *d = if m != 0.0 { -(c * wi) } else { 0.0 };
    }
    // The loss Σ w·(ℓ + β·KL − c·H) and the means over real tokens. The KL enters only when it
    // is on (0·∞ would make a logged-only KL that overflowed — a diverged metric, not a
    // diverged loss — into a NaN loss).
    let dot = |v: &[f32]| masked_dot_f64(mask, v, w);
    let total = |v: &[f32]| masked_sum_f64(mask, v);
    let (kl, ratio, adv) = (&out.kl_tokens[..n], &out.ratio[..n], &out.adv[..n]);
    let mut loss = dot(&out.term[..n]);
    if s.kl_on() {
        loss += s.beta as f64 * dot(kl);
    }
    if let (true, Some(h)) = (bonus, x.entropy) {
        loss -= c as f64 * dot(&h[..n]);
    }
    // The clip the objective applies: GSPO's on the response's ratio, GMPO's on each token's;
    // one loop per loss (its mode a constant inside), so each vectorizes.
    let p = s.pg();
    let flagged = out.clipped_ratio(s);
    let (low, high) = match p.mode {
        LossMode::Cispo => clip_counts::<true>(&p, flagged, adv, mask),
        LossMode::Sapo | LossMode::Naive | LossMode::Unclipped => (0, 0),
        _ => clip_counts::<false>(&p, flagged, adv, mask),
    };
    SpanSums {
        loss,
        kl: total(kl),
        ratio: total(ratio),
        entropy: x.entropy.map(|h| total(&h[..n])),
        count: sum_f64(mask),
        clip_low: low,
        clip_high: high,
    }
}

/// Real tokens clipped low and high by `reference::clip_flags`, with the loss a constant
/// (CISPO's cap, or the clip range every other loss flags by), so the loop vectorizes.
#[inline(always)]
fn clip_counts<const CISPO: bool>(
    p: &PgParams,
    ratio: &[f32],
    adv: &[f32],
    mask: &[f32],
) -> (u32, u32) {
    let mode = if CISPO {
        LossMode::Cispo
    } else {
        LossMode::Clipped
    };
    let p = PgParams { mode, ..*p };
    let (mut low, mut high) = (0u32, 0u32);
    for ((&r, &a), &m) in ratio.iter().zip(adv).zip(mask) {
        let (l, h) = reference::clip_flags(&p, r, a);
        low += (m != 0.0 && l) as u32;
        high += (m != 0.0 && h) as u32;
    }
    (low, high)
}

/// The "80/20" rule, a batch-level one: the `(1 − ρ)`-quantile of the real tokens' entropies
/// (torch's linear interpolation, as TRL computes it over the gathered batch), and every token
/// below it loses its policy-gradient term `ℓ_t` (value and derivative; a token at the cut keeps
/// it). The KL and the entropy bonus stay on every token. At the sequence level a masked
/// token's term leaves the response's sum, while its log-ratio still moves the response's ratio.
#[inline(never)]
fn top_entropy(s: &LossSettings, x: &TokenInputs, out: &mut TokenTerms) {
    let h = x
        .entropy
        .expect("algorithm.top_entropy_quantile needs each token's entropy");
    let n = x.logp.len();
    let real: Vec<f32> = (0..n).filter(|&i| x.mask[i] != 0.0).map(|i| h[i]).collect();
    let cut = reference::quantile(real, 1.0 - s.top_entropy_quantile);
    // Below the cut (or NaN) the token's term goes.
    for ((&hi, term), dterm) in h.iter().zip(&mut out.term).zip(&mut out.dterm) {
        if hi.partial_cmp(&cut).is_none_or(|o| o.is_lt()) {
            *term = 0.0;
            *dterm = 0.0;
        }
    }
}

/// The entropy mechanism's covariance rules (arXiv 2505.22617; verl `clip_cov`, `kl_cov`):
/// `cov_t = (A_t − mean A)·(log π_t − mean log π)` over the batch's real tokens, detached — the
/// choice of tokens is a constant of the step, their own terms carry the gradient. Clip-Cov: of
/// the real tokens that the clip does not hold with `lb < cov_t < ub`, `⌈ρN⌉` drawn without
/// replacement from the step's stream lose `ℓ_t` and its derivative. KL-Cov: the `⌈ρN⌉` largest
/// `cov_t` (ties: the earlier token) get `+ κ·|log r_t|`, derivative `κ·sign(log r_t)` (0 at
/// `r = 1`, the subgradient's middle).
#[inline(never)]
fn cov_rule(s: &LossSettings, x: &TokenInputs, out: &mut TokenTerms) {
    let real: Vec<usize> = (0..x.logp.len()).filter(|&i| x.mask[i] != 0.0).collect();
    if real.is_empty() {
        return;
    }
    let n = real.len() as f64;
    let c = super::entropy_dynamics::Covariance::of(x.logp, &out.adv, x.mask).expect("real tokens");
    let cov = |i: usize| c.term(x.logp[i], out.adv[i]);
    // At least one token for any ratio above 0.
    let k = ((s.cov_ratio as f64 * n).ceil() as usize).max(1);
    match s.cov {
        CovPenalty::ClipCov => {
            let p = s.pg();
            let mut pool: Vec<usize> = real
                .iter()
                .copied()
                .filter(|&i| {
                    let (low, high) = reference::clip_flags(&p, out.ratio[i], out.adv[i]);
                    let c = cov(i);
                    !(low || high) && c > s.cov_lb && c < s.cov_ub
                })
                .collect();
            let mut rng = crate::rng::SplitMix64::new(s.stream);
            for j in 0..k.min(pool.len()) {
                let pick = j + rng.below((pool.len() - j) as u64) as usize;
                pool.swap(j, pick);
                out.term[pool[j]] = 0.0;
                out.dterm[pool[j]] = 0.0;
            }
        }
        CovPenalty::KlCov => {
            let mut order = real;
            // Stable: equal covariances keep the earlier token first.
            order.sort_by(|&a, &b| cov(b).total_cmp(&cov(a)));
            for &i in order.iter().take(k) {
                let lr = x.logp[i] - x.old_logp[i];
                let sign = if lr > 0.0 {
                    1.0
                } else if lr < 0.0 {
                    -1.0
                } else {
                    0.0
                };
                out.term[i] += s.kl_cov_coef * lr.abs();
                out.dterm[i] += s.kl_cov_coef * sign;
            }
        }
        CovPenalty::None => {}
    }
}

/// `∂L/∂log π_t` where a response's loss reaches its tokens through the mean log-ratio:
/// `L = Σ_t w_t·ℓ_t(s_i)` gives `∂L/∂log π_t = live_t/L_i · Σ_{t'} w_{t'}·∂ℓ_{t'}/∂log s_i`
/// (`L_i` the response's real tokens), plus the token's own KL term `w_t·β·∂KL_t`.
#[inline(never)]
fn couple(x: &TokenInputs, live: &[f32], w: &[f32], dterm: &[f32], dkl: &[f32], dl: &mut [f32]) {
    let t = x.t.max(1);
    for (i, drow) in dl.chunks_exact_mut(t).enumerate() {
        let span = i * t..(i + 1) * t;
        let mask = &x.mask[span.clone()];
        let len = sum_f64(mask).max(1.0);
        let g = masked_dot_f64(mask, &dterm[span.clone()], &w[span.clone()]);
        let share = (g / len) as f32;
        let cells = mask.iter().zip(&live[span.clone()]).zip(&w[span.clone()]);
        for ((d, ((&m, &l), &wi)), &dk) in drow.iter_mut().zip(cells).zip(&dkl[span]) {
            *d = if m != 0.0 { share * l + wi * dk } else { 0.0 };
        }
    }
}

/// Scalar references, one formula each, for the tests and for teaching.
pub mod reference {
    pub fn ratio(logp: f32, old_logp: f32) -> f32 {
        (logp - old_logp).exp()
    }

    /// `(ρ, ∂ρ/∂log π)` in the given form; `exp` is the exponential the caller computes with.
    #[inline(always)]
    pub fn ratio_of(
        form: super::RatioForm,
        logp: f32,
        old_logp: f32,
        exp: impl Fn(f32) -> f32,
    ) -> (f32, f32) {
        use super::RatioForm;
        match form {
            RatioForm::Exp => {
                let r = exp(logp - old_logp);
                (r, r)
            }
            RatioForm::Quotient => (logp / old_logp, 1.0 / old_logp),
            RatioForm::Unfrozen => (1.0, 0.0),
        }
    }

    pub fn clipped_token_loss(ratio: f32, adv: f32, eps_low: f32, eps_high: f32) -> f32 {
        let mut s = super::LossSettings::plain(
            crate::config::LossMode::Clipped,
            crate::config::KlEstimator::K3,
            crate::config::LossAggMode::SeqMeanTokenMean,
        );
        (s.epsilon_low, s.epsilon_high) = (eps_low, eps_high);
        pg_term(&s.pg(), adv, ratio, ratio, 0.0, f32::exp).0
    }

    /// KL in the reward, PPO-RLHF style: `r − β·Σ_t KL_t(π_old ‖ π_ref)` per response over its
    /// real tokens (`mask`, `old`, `refl`: `[B·G·T]`; `rewards`: `[B·G]`).
    pub fn kl_penalized_rewards(
        rewards: &[f32],
        mask: &[f32],
        old: &[f32],
        refl: &[f32],
        estimator: crate::config::KlEstimator,
        beta: f32,
    ) -> Vec<f32> {
        let t = mask.len() / rewards.len().max(1);
        rewards
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let span = i * t..(i + 1) * t;
                let kl: f32 = old[span.clone()]
                    .iter()
                    .zip(&refl[span.clone()])
                    .zip(&mask[span])
                    .map(|((&lp, &rf), &m)| kl_term(estimator, lp, rf, 0.0, f32::exp).0 * m)
                    .sum();
                r - beta * kl
            })
            .collect()
    }

    /// `(k1, k2, k3)` for `Δ = log π_ref − log π_θ`.
    pub fn kl(logp: f32, ref_logp: f32) -> (f32, f32, f32) {
        use crate::config::KlEstimator;
        let k = |e| kl_term(e, logp, ref_logp, 0.0, f32::exp).0;
        (k(KlEstimator::K1), k(KlEstimator::K2), k(KlEstimator::K3))
    }

    /// One token's `(ratio, loss, kl, flags)` (flags: bit 0 clipped low, bit 1 clipped high),
    /// with the bug gallery's ratio switch: the scalar reference `evaluate` is held to.
    pub fn token_terms(
        s: &super::LossSettings,
        logp: f32,
        old_logp: f32,
        ref_logp: f32,
        adv: f32,
    ) -> (f32, f32, f32, u32) {
        let p = s.pg();
        let (ratio, dr) = ratio_of(s.ratio_form(), logp, old_logp, f32::exp);
        let (mut loss, _) = pg_term(&p, adv, ratio, dr, logp, f32::exp);
        let (kl, _) = kl_term(s.kl_estimator, logp, ref_logp, s.beta, f32::exp);
        if s.kl_on() {
            loss += s.beta * kl;
        }
        let (low, high) = clip_flags(&p, ratio, adv);
        (ratio, loss, kl, low as u32 | ((high as u32) << 1))
    }

    /// The aggregation (GRPO-SPEC §4) as each token's weight in the loss, `[R·T]` for `R` responses
    /// padded to `T` (`mask`: 1 on real tokens; padding weighs 0):
    /// - `seq-mean-token-mean` (GRPO): `1/(R·len_i)`, each response's mean, then their mean;
    /// - `token-mean` (DAPO): `1/Σ mask`, every token of the batch alike;
    /// - `seq-mean-token-sum-norm` (Dr. GRPO): `1/(R·max(max_len, T))`, a constant normaliser;
    /// - `luspo`: `1/R` (verl's `seq-mean-token-sum`): with one sequence-level loss on each of a
    ///   response's `L` tokens, the mean over responses of `L·ℓ_i`.
    ///
    /// The loss is `Σ_t w_t·ℓ_t`; every engine weighs by these.
    pub fn aggregation_weights(
        agg: crate::config::LossAggMode,
        mask: &[f32],
        t: usize,
        max_len: usize,
    ) -> Vec<f32> {
        let mut w = Vec::new();
        aggregation_weights_into(agg, mask, t, max_len, &mut w);
        w
    }

    /// [`aggregation_weights`] into a reused buffer.
    #[inline(always)]
    pub fn aggregation_weights_into(
        agg: crate::config::LossAggMode,
        mask: &[f32],
        t: usize,
        max_len: usize,
        out: &mut Vec<f32>,
    ) {
        let totals = super::BatchTotals::of(mask, t);
        aggregation_weights_of(agg, mask, t, max_len, &totals, out);
    }

    /// [`aggregation_weights`] of a span of whole responses (`mask` the span's) in a batch
    /// whose totals are `totals`.
    #[inline(always)]
    pub fn aggregation_weights_of(
        agg: crate::config::LossAggMode,
        mask: &[f32],
        t: usize,
        max_len: usize,
        totals: &super::BatchTotals,
        out: &mut Vec<f32>,
    ) {
        // Counts of 0/1 masks: exact in f32 in any order.
        let t = t.max(1);
        let (r, tokens) = (totals.responses, totals.tokens);
        // (A fold, not `all`: no early exit, so it vectorizes; the scalar loop with a branch
        // per token was ~1 % of the fused lecture step.)
        if mask.iter().fold(true, |all, &m| all & (m == 1.0)) {
            // No padding (the lecture model, full-length batches): one weight for every token,
            // the value the rows below would give, without a pass per row.
            let w = row_weight(agg, t as f32, r, tokens, max_len.max(t));
            out.clear();
            out.resize(mask.len(), w);
            return;
        }
        out.clear();
        out.resize(mask.len(), 0.0);
        for (row, wrow) in mask.chunks(t).zip(out.chunks_mut(t)) {
            let len = match agg {
                crate::config::LossAggMode::SeqMeanTokenMean => row.iter().sum::<f32>(),
                _ => 0.0,
            };
            let w = row_weight(agg, len, r, tokens, max_len.max(t));
            for (o, &m) in wrow.iter_mut().zip(row) {
                *o = if m == 0.0 { 0.0 } else { w };
            }
        }
    }

    /// One real token's weight in a batch of `r` responses holding `tokens` real tokens, its
    /// response `len` tokens long, `max_len` the longest a response may be:
    /// [`aggregation_weights`]' rule for one token (the inspector's formula card reads it).
    #[inline(always)]
    pub fn row_weight(
        agg: crate::config::LossAggMode,
        len: f32,
        r: usize,
        tokens: f32,
        max_len: usize,
    ) -> f32 {
        use crate::config::LossAggMode;
        match agg {
            LossAggMode::TokenMean => 1.0 / tokens.max(1.0),
            LossAggMode::SeqMeanTokenMean => 1.0 / (len.max(1.0) * r as f32),
            LossAggMode::SeqMeanTokenSumNorm => 1.0 / (r * max_len) as f32,
            LossAggMode::Luspo => 1.0 / (r as f32).max(1.0),
        }
    }

    /// Whether the clip is active on a token, low and high: the ratio below `lo` with `a < 0`,
    /// or above `hi` with `a > 0` (where the clipped objective's gradient is 0; GMPO's `lo`,
    /// `hi` are `e^∓ε`, on each token's own ratio). CISPO: the ratio above its cap with `a > 0`
    /// (TRL's `cispo_clip_ratio`), never low; SAPO's gate, the naive and the unclipped loss
    /// never clip. The clip fractions every engine logs count these (`common.wgsl` mirrors it).
    #[inline(always)]
    pub fn clip_flags(p: &super::PgParams, ratio: f32, adv: f32) -> (bool, bool) {
        use crate::config::LossMode;
        match p.mode {
            LossMode::Cispo => (false, ratio > p.cispo_cap && adv > 0.0),
            LossMode::Sapo | LossMode::Naive | LossMode::Unclipped => (false, false),
            _ => (ratio < p.lo && adv < 0.0, ratio > p.hi && adv > 0.0),
        }
    }

    /// The `q`-quantile of `values` by linear interpolation between the order statistics at
    /// `q·(n − 1)` (`torch.quantile`'s default); `+∞` for no values (nothing is above it).
    pub fn quantile(mut values: Vec<f32>, q: f32) -> f32 {
        if values.is_empty() {
            return f32::INFINITY;
        }
        values.sort_by(f32::total_cmp);
        let pos = q.clamp(0.0, 1.0) as f64 * (values.len() - 1) as f64;
        let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
        let frac = (pos - lo as f64) as f32;
        values[lo] + frac * (values[hi] - values[lo])
    }

    /// GMPO's clip of one token's log-ratio `lr = log r` in log space, pessimistic by the
    /// sign of `a` (verl `geo_mean`): `(sgn·min(sgn·lr, sgn·clip(lr, −ε_low, ε_high)),
    /// its derivative)` — `lr` capped above at `ε_high` when `a > 0`, below at `−ε_low` when
    /// `a < 0`, and `(0, 0)` when `a = 0`. At the edge itself the token counts as inside
    /// (derivative 1: the subgradient this text and its tests use).
    #[inline(always)]
    pub fn gmpo_log_ratio(lr: f32, a: f32, eps_low: f32, eps_high: f32) -> (f32, f32) {
        if a > 0.0 {
            if lr > eps_high {
                (eps_high, 0.0)
            } else {
                (lr, 1.0)
            }
        } else if a < 0.0 {
            if lr < -eps_low {
                (-eps_low, 0.0)
            } else {
                (lr, 1.0)
            }
        } else {
            (0.0, 0.0)
        }
    }

    /// The policy-gradient part of one token's loss and its derivative with respect to
    /// `log π`: `(ℓ, ∂ℓ/∂log π)` for advantage `a`, ratio `r`, its derivative
    /// `dr = ∂r/∂log π` (`r` itself when `r = exp(log π − log π_old)`; for a response's ratio
    /// `s`, `s`: then the derivative is `∂ℓ/∂log s`) and `lp = log π`; `exp` is the
    /// exponential the caller computes with. Per loss:
    /// - naive `−a·lp`; unclipped `−a·r`;
    /// - clipped `−min(min(r, δ)·a, clip(r, lo, hi)·a)`, then for `a < 0` capped at `c·|a|`
    ///   (dual clip); the derivative is `−a·dr` wherever the unclipped branch is the minimum (or
    ///   the ratio is inside the clip range) and neither δ nor the dual clip holds, else 0;
    /// - cispo `−sg(min(r, cap))·a·lp`, derivative `−min(r, cap)·a` (clipped tokens keep it);
    /// - sapo `−(4/τ)·σ(τ(r − 1))·a`, τ by the sign of `a`, derivative `−a·4σ(1−σ)·dr`;
    /// - gmpo (with `r` the response's geometric mean) `−a·r`, as unclipped.
    ///
    /// At a kink (`r` exactly on a clip edge, `r = δ`, the loss exactly at the dual clip's
    /// cap) the gradient is the unclipped side's. `#[inline(always)]` so the loops over tokens
    /// specialise it per mode.
    #[inline(always)]
    pub fn pg_term(
        p: &super::PgParams,
        a: f32,
        r: f32,
        dr: f32,
        lp: f32,
        exp: impl Fn(f32) -> f32,
    ) -> (f32, f32) {
        use crate::config::LossMode;
        match p.mode {
            LossMode::Naive => (-a * lp, -a),
            LossMode::Unclipped | LossMode::Gmpo => (-a * r, -a * dr),
            LossMode::Clipped => {
                // Selects, not `min`, so a NaN ratio stays NaN.
                let capped = p.delta > 0.0 && r > p.delta;
                let rd = if capped { p.delta } else { r };
                let (u, c) = (rd * a, r.clamp(p.lo, p.hi) * a);
                let live = (u <= c || (r > p.lo && r < p.hi)) && !capped;
                let (l, d) = (-u.min(c), if live { -a * dr } else { 0.0 });
                let cap = -a * p.dual_clip;
                if p.dual_clip > 0.0 && a < 0.0 && l > cap {
                    (cap, 0.0)
                } else {
                    (l, d)
                }
            }
            LossMode::Cispo => {
                let w = if r > p.cispo_cap { p.cispo_cap } else { r };
                (-w * a * lp, -w * a)
            }
            LossMode::Sapo => {
                let tau = if a > 0.0 { p.tau_pos } else { p.tau_neg };
                let sg = 1.0 / (1.0 + exp(-tau * (r - 1.0)));
                (-(4.0 / tau) * sg * a, -a * 4.0 * sg * (1.0 - sg) * dr)
            }
        }
    }

    /// One token's KL estimate and `β·∂KL/∂log π`, with `Δ = log π_ref − log π`; `exp` is the
    /// exponential the caller computes with (the fused engines pass their vectorizable one).
    #[inline(always)]
    pub fn kl_term(
        estimator: crate::config::KlEstimator,
        lp: f32,
        rf: f32,
        beta: f32,
        exp: impl Fn(f32) -> f32,
    ) -> (f32, f32) {
        use crate::config::KlEstimator;
        match estimator {
            KlEstimator::K1 => (lp - rf, beta),
            KlEstimator::K2 => {
                let delta = rf - lp;
                (delta * delta / 2.0, -beta * delta)
            }
            KlEstimator::K3 => {
                let e = exp(rf - lp);
                (e - (rf - lp) - 1.0, beta * (1.0 - e))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratio_clip_and_kl_hand_values() {
        use reference::*;
        assert!((ratio(-1.0, -1.5) - 0.5f32.exp()).abs() < 1e-6);
        // ρ = 1.5, A = 2: clipped at 1.28 → −2.56; A = −2: min(−3, −2.56) = −3 → 3
        assert!((clipped_token_loss(1.5, 2.0, 0.2, 0.28) + 2.56).abs() < 1e-6);
        assert!((clipped_token_loss(1.5, -2.0, 0.2, 0.28) - 3.0).abs() < 1e-6);
        // ρ = 0.5, A = −1: clipped at 0.8 → min(−0.5, −0.8) = −0.8 → 0.8
        assert!((clipped_token_loss(0.5, -1.0, 0.2, 0.28) - 0.8).abs() < 1e-6);
        // Δ = ln 2: k1 = −ln2, k2 = ln²2/2, k3 = 2 − ln2 − 1
        let (k1, k2, k3) = kl(-2.0, -2.0 + 2f32.ln());
        let l2 = 2f32.ln();
        assert!(
            (k1 + l2).abs() < 1e-6
                && (k2 - l2 * l2 / 2.0).abs() < 1e-6
                && (k3 - (1.0 - l2)).abs() < 1e-6
        );
        // k3 ≥ 0 always, and 0 at Δ = 0.
        assert_eq!(kl(-1.0, -1.0).2, 0.0);
    }

    /// Only a loss that clips flags a token: naive, unclipped and SAPO never (the naive arm of
    /// loss-family logged clip_ratio/low 0.005 and high 0.005 from the clip range it ignores).
    #[test]
    fn clip_flags_come_from_the_loss_that_clips() {
        use reference::*;
        for p in pg_cases() {
            let flags: Vec<(bool, bool)> = [(0.1f32, -1.0f32), (9.0, 1.0)]
                .iter()
                .map(|&(r, a)| clip_flags(&p, r, a))
                .collect();
            let any = flags.iter().any(|&(l, h)| l || h);
            let clips = matches!(p.mode, LossMode::Clipped | LossMode::Gmpo | LossMode::Cispo);
            assert_eq!(any, clips, "{p:?}: {flags:?}");
        }
    }

    #[test]
    fn derivatives_match_finite_differences() {
        use reference::*;
        let h = 1e-3f32;
        for p in pg_cases() {
            for (lp, old, a) in [
                (-1.0f32, -1.1, 0.7),
                (-0.5, -1.5, 1.3),
                (-2.0, -0.9, -0.8),
                (-1.0, -1.0, -2.0),
                (-0.3, -2.5, -1.0),
                (-1.0, -1.0, 0.0),
            ] {
                let r = |x: f32| (x - old).exp();
                // CISPO's ratio is detached: its derivative holds r still.
                let held = |x: f32| {
                    if p.mode == LossMode::Cispo {
                        r(lp)
                    } else {
                        r(x)
                    }
                };
                let f = |x: f32| pg_term(&p, a, held(x), held(x), x, f32::exp).0;
                let numeric = (f(lp + h) - f(lp - h)) / (2.0 * h);
                let (_, d) = pg_term(&p, a, r(lp), r(lp), lp, f32::exp);
                assert!(
                    (numeric - d).abs() < 2e-2,
                    "{p:?} {lp} {old} {a}: {numeric} vs {d}"
                );
            }
        }
        for est in [KlEstimator::K1, KlEstimator::K2, KlEstimator::K3] {
            let (lp, rf) = (-1.2f32, -0.7);
            let f = |x: f32| kl_term(est, x, rf, 1.0, f32::exp).0;
            let numeric = (f(lp + h) - f(lp - h)) / (2.0 * h);
            let (_, d) = kl_term(est, lp, rf, 1.0, f32::exp);
            assert!((numeric - d).abs() < 1e-2, "{est:?}: {numeric} vs {d}");
        }
        let _ = LossAggMode::TokenMean;
    }
    /// Every per-token loss, the clipped one also with the dual clip and with δ.
    fn pg_cases() -> Vec<PgParams> {
        let base = LossSettings::plain(LossMode::Naive, KlEstimator::K3, LossAggMode::TokenMean);
        let mut out: Vec<PgParams> = LossMode::ALL
            .iter()
            .map(|&mode| {
                LossSettings {
                    mode,
                    epsilon_high: 0.28,
                    ..base
                }
                .pg()
            })
            .collect();
        let clipped = LossSettings {
            mode: LossMode::Clipped,
            ..base
        };
        out.push(
            LossSettings {
                dual_clip: 3.0,
                ..clipped
            }
            .pg(),
        );
        out.push(
            LossSettings {
                delta: 1.5,
                ..clipped
            }
            .pg(),
        );
        out.push(
            LossSettings {
                cispo_max_ratio: 1.1,
                mode: LossMode::Cispo,
                ..base
            }
            .pg(),
        );
        out
    }

    /// Inputs over a ragged batch of `T = 4` (no sampler, no entropy).
    fn inputs<'a>(
        logp: &'a [f32],
        old: &'a [f32],
        refl: &'a [f32],
        adv: &'a [f32],
        mask: &'a [f32],
    ) -> TokenInputs<'a> {
        TokenInputs {
            logp,
            old_logp: old,
            ref_logp: refl,
            sampler_logp: None,
            advantages: adv,
            mask,
            entropy: None,
            t: 4,
        }
    }

    /// A ragged batch (R = 3, T = 4) whose padding holds junk.
    fn ragged(seed: u64) -> [Vec<f32>; 6] {
        let mut rng = crate::rng::SplitMix64::new(seed);
        let mut u = |lo: f32, hi: f32| lo + (hi - lo) * rng.next_f64() as f32;
        let lens = [4usize, 2, 3];
        let mask: Vec<f32> = (0..12)
            .map(|i| (i % 4 < lens[i / 4]) as u32 as f32)
            .collect();
        let junk = |v: Vec<f32>, u: &mut dyn FnMut(f32, f32) -> f32| -> Vec<f32> {
            v.iter()
                .zip(&mask)
                .map(|(&x, &m)| if m == 1.0 { x } else { u(-1e3, 1e3) })
                .collect()
        };
        let mut draw = |lo: f32, hi: f32| -> Vec<f32> { (0..12).map(|_| u(lo, hi)).collect() };
        let logp = draw(-2.5, -0.1);
        let old = draw(-2.5, -0.1);
        let refl = draw(-2.5, -0.1);
        let ent = draw(0.1, 1.5);
        let mut u2 = |lo: f32, hi: f32| lo + (hi - lo) * 0.37;
        let (old, refl) = (junk(old, &mut u2), junk(refl, &mut u2));
        [logp, old, refl, ent, mask, vec![1.3, -0.7, 0.4]]
    }

    /// `evaluate`'s coefficients are the derivatives of its own loss, by central differences,
    /// for every loss mode, KL estimator, aggregation, both ratio bugs, the shared reference and
    /// the entropy bonus, on a ragged batch whose padding holds junk (padding gets 0).
    #[test]
    fn evaluate_coefficients_are_the_loss_derivatives() {
        let [logp, old, refl, ent, mask, adv] = ragged(5);
        let h = 1e-3f32;
        let mut cases = 0;
        for mode in [LossMode::Naive, LossMode::Unclipped, LossMode::Clipped] {
            for est in [KlEstimator::K1, KlEstimator::K2, KlEstimator::K3] {
                for agg in LossAggMode::ALL {
                    for bug in 0..4 {
                        let mut s = LossSettings::plain(mode, est, *agg);
                        s.beta = 0.3;
                        s.max_len = 6;
                        s.epsilon_high = 0.28;
                        s.entropy_coef = if cases % 2 == 0 { 0.05 } else { 0.0 };
                        s.bug_ratio_quotient = bug == 1;
                        s.unfrozen_old_policy = bug == 2;
                        s.shared_reference = bug == 3;
                        cases += 1;
                        // The loss as a function of log π and H; under a bug switch π_old or
                        // π_ref track log π, as they do in the buggy program.
                        let loss_at = |lp: &[f32], en: &[f32]| -> (f64, TokenTerms) {
                            let o: Vec<f32> = if s.unfrozen_old_policy {
                                lp.to_vec()
                            } else {
                                old.clone()
                            };
                            let r: Vec<f32> = if s.shared_reference {
                                lp.to_vec()
                            } else {
                                refl.clone()
                            };
                            let mut out = TokenTerms::default();
                            let x = TokenInputs {
                                logp: lp,
                                old_logp: &o,
                                ref_logp: &r,
                                sampler_logp: None,
                                advantages: &adv,
                                mask: &mask,
                                entropy: Some(en),
                                t: 4,
                            };
                            evaluate(&s, &x, &mut out);
                            (out.loss, out)
                        };
                        let (_, base) = loss_at(&logp, &ent);
                        let (lo, hi) = (1.0 - s.epsilon_low, 1.0 + s.epsilon_high);
                        for i in 0..12 {
                            if mask[i] == 0.0 {
                                assert_eq!(base.dlogp[i], 0.0);
                                continue;
                            }
                            let r = base.ratio[i];
                            if (r - lo).abs() < 2e-2 || (r - hi).abs() < 2e-2 {
                                continue; // a kink of the clip
                            }
                            let bump = |d: f32| {
                                let mut lp = logp.clone();
                                lp[i] += d;
                                loss_at(&lp, &ent).0
                            };
                            let fd = ((bump(h) - bump(-h)) / (2.0 * h as f64)) as f32;
                            let label = format!("{mode:?} {est:?} {agg} bug {bug} token {i}");
                            assert!(
                                (fd - base.dlogp[i]).abs() <= 2e-3 + 2e-2 * fd.abs(),
                                "{label}: ∂L/∂logπ {} vs finite differences {fd}",
                                base.dlogp[i]
                            );
                            if s.entropy_coef != 0.0 {
                                let bump = |d: f32| {
                                    let mut en = ent.clone();
                                    en[i] += d;
                                    loss_at(&logp, &en).0
                                };
                                let fd = ((bump(h) - bump(-h)) / (2.0 * h as f64)) as f32;
                                assert!(
                                    (fd - base.dentropy[i]).abs() <= 1e-4,
                                    "{label}: ∂L/∂H {} vs {fd}",
                                    base.dentropy[i]
                                );
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(cases, 3 * 3 * LossAggMode::ALL.len() * 4);
    }

    /// Each objective's values worked by hand from its paper's (or framework's) definition.
    #[test]
    fn worked_values_from_the_definitions() {
        use crate::config::ImportanceSamplingLevel as Level;
        let close = |x: f32, y: f32| (x - y).abs() < 1e-5;
        let base = LossSettings::plain(
            LossMode::Naive,
            KlEstimator::K3,
            LossAggMode::SeqMeanTokenMean,
        );
        let term = |s: LossSettings, a: f32, r: f32, lp: f32| {
            reference::pg_term(&s.pg(), a, r, r, lp, f32::exp)
        };
        // CISPO: −sg(min(r, 5))·A·log π; the gradient survives above the cap.
        let cispo = LossSettings {
            mode: LossMode::Cispo,
            ..base
        };
        assert_eq!(term(cispo, 2.0, 1.5, -1.0), (3.0, -3.0));
        assert_eq!(term(cispo, 2.0, 7.0, -1.0), (10.0, -10.0));
        // SAPO: −(4/τ)·σ(τ(r−1))·A, slope 1 at r = 1 (as PPO's inside its clip).
        let sapo = LossSettings {
            mode: LossMode::Sapo,
            ..base
        };
        let (l, d) = term(sapo, 1.0, 1.0, -1.0);
        assert!(close(l, -2.0) && close(d, -1.0), "{l} {d}");
        let (l, d) = term(sapo, -1.0, 1.0, -1.0);
        assert!(close(l, 4.0 / 1.05 * 0.5) && close(d, 1.0), "{l} {d}");
        // Dual clip c = 3, A = −1, r = 5: PPO's max(5, 1.2) = 5, capped at 3·|A|, no gradient.
        let clipped = LossSettings {
            mode: LossMode::Clipped,
            ..base
        };
        assert_eq!(
            term(
                LossSettings {
                    dual_clip: 3.0,
                    ..clipped
                },
                -1.0,
                5.0,
                -1.0
            ),
            (3.0, 0.0)
        );
        assert_eq!(term(clipped, -1.0, 5.0, -1.0), (5.0, 5.0));
        // δ = 1.5, A = −1, r = 2: −min(min(2, 1.5)·(−1), 1.2·(−1)) = 1.5, no gradient.
        assert_eq!(
            term(
                LossSettings {
                    delta: 1.5,
                    ..clipped
                },
                -1.0,
                2.0,
                -1.0
            ),
            (1.5, 0.0)
        );
        // GSPO (ε = 3e-4 / 4e-4): log r = [0.1, 0.3] → s = e^0.2; A = −1: ℓ = s; each token
        // gets ∂ℓ/∂log π_t = s/L = s/2. A = +1: clipped at 1 + 4e-4, no gradient.
        let gspo = LossSettings {
            mode: LossMode::Clipped,
            level: Level::Sequence,
            epsilon_low: 3e-4,
            epsilon_high: 4e-4,
            ..base
        };
        let (lp, old) = ([-1.0f32, -2.0], [-1.1f32, -2.3]);
        let s = 0.2f32.exp();
        let t = response_terms(&gspo, &lp, &old, &old, -1.0);
        assert!(
            close(t.loss as f32, s) && close(t.dlogp[0], s / 2.0) && close(t.dlogp[1], s / 2.0),
            "{t:?}"
        );
        let t = response_terms(&gspo, &lp, &old, &old, 1.0);
        assert!(
            close(t.loss as f32, -1.0004) && t.dlogp == [0.0, 0.0] && t.clip_high == 1.0,
            "{t:?}"
        );
        // LUSPO: the same response's GSPO loss × its length 2.
        let luspo = LossSettings {
            agg: LossAggMode::Luspo,
            ..gspo
        };
        let t = response_terms(&luspo, &lp, &old, &old, -1.0);
        assert!(
            close(t.loss as f32, 2.0 * s) && close(t.dlogp[0], s),
            "{t:?}"
        );
        // GSPO-token: the value s on every token, each token's own gradient −A·s·w_t.
        let token = LossSettings {
            level: Level::SequenceToken,
            epsilon_high: 0.5,
            ..gspo
        };
        let t = response_terms(&token, &lp, &old, &old, 1.0);
        assert!(
            close(t.loss as f32, -s) && close(t.dlogp[0], -s / 2.0),
            "{t:?}"
        );
        // GMPO (ε = 0.4 in log space), A = 1: log r = [0.5, −0.1] → clipped [0.4, −0.1], R =
        // e^0.15, ℓ = −R; the clipped token gets no gradient, the other −R/2.
        let gmpo = LossSettings {
            mode: LossMode::Gmpo,
            epsilon_low: 0.4,
            epsilon_high: 0.4,
            ..base
        };
        let (lp, old) = ([-1.0f32, -2.0], [-1.5f32, -1.9]);
        let r = 0.15f32.exp();
        let t = response_terms(&gmpo, &lp, &old, &old, 1.0);
        assert!(
            close(t.loss as f32, -r) && t.dlogp[0] == 0.0 && close(t.dlogp[1], -r / 2.0),
            "{t:?}"
        );
        assert!(close(t.clip_high, 0.5), "{t:?}");
        // The "80/20" rule: quantiles by linear interpolation (torch.quantile), and with ρ = 0.4
        // over entropies 0.1..0.5 the cut is the 0.6-quantile 0.34: the two top tokens keep ℓ.
        assert_eq!(reference::quantile(vec![4.0, 1.0, 3.0, 2.0], 0.5), 2.5);
        assert!(close(reference::quantile(vec![0.9, 0.1, 0.5], 0.8), 0.74));
        assert_eq!(reference::quantile(vec![], 0.5), f32::INFINITY);
        let top = LossSettings {
            top_entropy_quantile: 0.4,
            ..clipped
        };
        let (lp, old) = ([-1.0f32; 5], [-1.0f32; 5]);
        let (mask, adv, ent) = ([1.0f32; 5], [1.0f32], [0.3f32, 0.1, 0.5, 0.2, 0.4]);
        let x = TokenInputs {
            logp: &lp,
            old_logp: &old,
            ref_logp: &old,
            sampler_logp: None,
            advantages: &adv,
            mask: &mask,
            entropy: Some(&ent),
            t: 5,
        };
        let mut t = TokenTerms::default();
        evaluate(&top, &x, &mut t);
        let kept: Vec<bool> = t.dlogp.iter().map(|&d| d != 0.0).collect();
        assert_eq!(kept, [false, false, true, false, true], "{t:?}");
        assert!(close(t.loss as f32, -2.0 / 5.0), "{t:?}");
    }

    /// The kinks' rule (the unclipped side's gradient on an edge, none just outside), A = 0,
    /// and a one-token response (L = 1), where GSPO is PPO's clip.
    /// Clip-Cov and KL-Cov from their definitions on a ragged batch (9 real tokens): the
    /// covariances by hand, the ⌈ρN⌉ count (at least one), KL-Cov's top tokens and their
    /// `κ·|log r|` with derivative `κ·sign`, Clip-Cov's draw (the step's stream decides which,
    /// the same stream the same tokens) zeroing exactly the drawn tokens' terms.
    #[test]
    fn covariance_rules_from_their_definitions() {
        let [logp, old, refl, _, mask, adv] = ragged(7);
        let x = TokenInputs {
            logp: &logp,
            old_logp: &old,
            ref_logp: &refl,
            sampler_logp: None,
            advantages: &adv,
            mask: &mask,
            entropy: None,
            t: 4,
        };
        let run = |s: &LossSettings| {
            let mut out = TokenTerms::default();
            evaluate(s, &x, &mut out);
            out
        };
        let real: Vec<usize> = (0..12).filter(|&i| mask[i] == 1.0).collect();
        let n = real.len() as f64;
        let a_of = |i: usize| adv[i / 4] as f64;
        let mean_a = real.iter().map(|&i| a_of(i)).sum::<f64>() / n;
        let mean_l = real.iter().map(|&i| logp[i] as f64).sum::<f64>() / n;
        let cov = |i: usize| (a_of(i) - mean_a) * (logp[i] as f64 - mean_l);
        let mut by_cov = real.clone();
        by_cov.sort_by(|&a, &b| cov(b).total_cmp(&cov(a)));
        // KL-Cov on the unclipped loss: ρ = 0.25 of 9 tokens → ⌈2.25⌉ = 3.
        let base =
            LossSettings::plain(LossMode::Unclipped, KlEstimator::K3, LossAggMode::TokenMean);
        let plain = run(&base);
        let kl = LossSettings {
            cov: CovPenalty::KlCov,
            cov_ratio: 0.25,
            kl_cov_coef: 0.5,
            ..base
        };
        let got = run(&kl);
        for &i in &real {
            let lr = logp[i] - old[i];
            let picked = by_cov[..3].contains(&i);
            let (dt, dd) = if picked {
                (0.5 * lr.abs(), 0.5 * lr.signum())
            } else {
                (0.0, 0.0)
            };
            assert!((got.term[i] - plain.term[i] - dt).abs() < 1e-6, "token {i}");
            assert!(
                (got.dterm[i] - plain.dterm[i] - dd).abs() < 1e-6,
                "token {i}"
            );
        }
        // A tiny ratio still picks one token: the largest covariance.
        let one = run(&LossSettings {
            cov_ratio: 1e-6,
            ..kl
        });
        let changed: Vec<usize> = real
            .iter()
            .copied()
            .filter(|&i| one.term[i] != plain.term[i])
            .collect();
        assert_eq!(changed, vec![by_cov[0]]);
        // Clip-Cov on the clipped loss, a window holding every covariance, ε wide enough that
        // the clip holds no token: ⌈0.4·9⌉ = 4 tokens lose term and derivative.
        let clipped = LossSettings {
            mode: LossMode::Clipped,
            epsilon_low: 0.99,
            epsilon_high: 50.0,
            cov: CovPenalty::ClipCov,
            cov_ratio: 0.4,
            cov_lb: -1e9,
            cov_ub: 1e9,
            ..base
        };
        let reference = run(&LossSettings {
            cov: CovPenalty::None,
            ..clipped
        });
        let zeroed_by = |stream: u64| -> Vec<usize> {
            let out = run(&LossSettings { stream, ..clipped });
            for &i in &real {
                let gone = out.term[i] == 0.0 && out.dterm[i] == 0.0;
                assert!(
                    gone || (out.term[i] == reference.term[i]
                        && out.dterm[i] == reference.dterm[i])
                );
            }
            real.iter()
                .copied()
                .filter(|&i| out.dterm[i] == 0.0 && reference.dterm[i] != 0.0)
                .collect()
        };
        let first = zeroed_by(1);
        assert_eq!(first.len(), 4, "{first:?}");
        assert_eq!(zeroed_by(1), first, "the same stream draws the same tokens");
        assert!(
            (2..40).any(|s| zeroed_by(s) != first),
            "the stream decides the draw"
        );
        // The window: lb above every covariance leaves nothing to draw.
        let none = run(&LossSettings {
            cov_lb: 1e8,
            ..clipped
        });
        assert_eq!(none.dterm, reference.dterm);
    }

    #[test]
    fn kinks_take_the_unclipped_side_and_one_token_gspo_is_ppo() {
        use crate::config::ImportanceSamplingLevel as Level;
        let base = LossSettings::plain(
            LossMode::Clipped,
            KlEstimator::K3,
            LossAggMode::SeqMeanTokenMean,
        );
        let d = |p: &PgParams, a: f32, r: f32| reference::pg_term(p, a, r, r, -1.0, f32::exp).1;
        let p = base.pg();
        assert_eq!(d(&p, 1.0, p.hi), -p.hi);
        assert_eq!(d(&p, 1.0, p.hi * 0.999), -(p.hi * 0.999));
        assert_eq!(d(&p, 1.0, p.hi * 1.001), 0.0);
        assert_eq!(d(&p, -1.0, p.lo), p.lo);
        assert_eq!(d(&p, -1.0, p.lo * 0.999), 0.0);
        let delta = LossSettings { delta: 1.5, ..base }.pg();
        assert_eq!(d(&delta, -1.0, 1.5), 1.5);
        assert_eq!(d(&delta, -1.0, 1.5001), 0.0);
        let dual = LossSettings {
            dual_clip: 3.0,
            ..base
        }
        .pg();
        let t = |r: f32| reference::pg_term(&dual, -1.0, r, r, -1.0, f32::exp);
        assert_eq!(t(3.0), (3.0, 3.0));
        assert_eq!(t(3.01), (3.0, 0.0));
        for &mode in LossMode::ALL {
            let q = LossSettings { mode, ..base }.pg();
            assert_eq!(d(&q, 0.0, 1.7), 0.0, "{mode:?}");
        }
        assert_eq!(reference::gmpo_log_ratio(0.4, 1.0, 0.4, 0.4), (0.4, 1.0));
        assert_eq!(reference::gmpo_log_ratio(0.41, 1.0, 0.4, 0.4), (0.4, 0.0));
        assert_eq!(
            reference::gmpo_log_ratio(-0.41, -1.0, 0.4, 0.4),
            (-0.4, 0.0)
        );
        let seq = LossSettings {
            level: Level::Sequence,
            ..base
        };
        for (lp, old, a) in [
            (-1.0f32, -1.1f32, 1.0f32),
            (-1.0, -1.5, -1.0),
            (-2.0, -1.0, 0.5),
            (-1.0, -0.5, -2.0),
        ] {
            let tok = response_terms(&base, &[lp], &[old], &[old], a);
            let one = response_terms(&seq, &[lp], &[old], &[old], a);
            assert_eq!(
                (tok.loss, &tok.dlogp),
                (one.loss, &one.dlogp),
                "{lp} {old} {a}"
            );
            assert_eq!((tok.clip_low, tok.clip_high), (one.clip_low, one.clip_high));
        }
    }

    /// The 2025–26 objectives (CISPO, SAPO, GMPO, the dual clip, δ, GSPO and GSPO-token at
    /// each aggregation they allow, LUSPO): `evaluate`'s `∂L/∂log π_t` against central
    /// differences of its own loss, on ragged batches with per-response and per-token
    /// advantages. Where the objective detaches something the difference holds it still:
    /// CISPO's ratio (log π_old moves with log π), GSPO-token's sequence ratio (the token-level
    /// loss at π_old' = π/s, whose ratio is s with each token's own gradient). Tokens within
    /// 2e-2 of a kink (a clip edge, δ, the dual clip's cap, GMPO's log-space edges) are skipped.
    #[test]
    fn every_objective_s_coefficients_are_its_derivatives() {
        use crate::config::ImportanceSamplingLevel as Level;
        let h = 1e-3f32;
        let base = LossSettings::plain(LossMode::Naive, KlEstimator::K3, LossAggMode::TokenMean);
        let mut objectives = vec![];
        for &mode in LossMode::ALL {
            for &agg in LossAggMode::ALL {
                for level in [Level::Token, Level::Sequence, Level::SequenceToken] {
                    let s = LossSettings {
                        mode,
                        agg,
                        level,
                        ..base
                    };
                    let mut c = crate::config::RunConfig::default();
                    let a = &mut c.algorithm;
                    (a.loss, a.loss_agg_mode, a.importance_sampling_level) = (mode, agg, level);
                    if c.validate().is_ok() {
                        objectives.push(s);
                    }
                }
            }
        }
        let clipped = LossSettings {
            mode: LossMode::Clipped,
            ..base
        };
        objectives.push(LossSettings {
            dual_clip: 3.0,
            ..clipped
        });
        objectives.push(LossSettings {
            delta: 1.5,
            ..clipped
        });
        objectives.push(LossSettings {
            dual_clip: 1.6,
            delta: 1.4,
            ..clipped
        });
        objectives.push(LossSettings {
            cispo_max_ratio: 1.1,
            mode: LossMode::Cispo,
            ..base
        });
        // The top-entropy rule (a batch statistic of H, which the differences hold still).
        objectives.push(LossSettings {
            top_entropy_quantile: 0.5,
            ..clipped
        });
        objectives.push(LossSettings {
            top_entropy_quantile: 0.3,
            level: Level::Sequence,
            ..clipped
        });
        // The mismatch lab: each correction (the sampler's log π apart from π_old; OPSM's δ far
        // from any response's mean, so no mask flips within a difference), the unbiased KL.
        let corr = |kind, level, low, high, delta| LossSettings {
            correction: Correction {
                kind,
                level,
                low,
                high,
                opsm_threshold: delta,
            },
            ..clipped
        };
        use crate::config::{IsCorrection as Is, IsLevel};
        objectives.push(corr(Is::Tis, IsLevel::Token, 0.8, 1.3, 0.5));
        objectives.push(corr(Is::Tis, IsLevel::Sequence, 0.0, 3.0, 0.5));
        objectives.push(corr(Is::Mis, IsLevel::Sequence, 0.5, 2.0, 0.5));
        objectives.push(LossSettings {
            level: Level::Sequence,
            ..corr(Is::Icepop, IsLevel::Token, 0.9, 1.1, 0.5)
        });
        objectives.push(corr(Is::Opsm, IsLevel::Token, 0.0, 3.0, -10.0));
        objectives.push(corr(Is::Opsm, IsLevel::Token, 0.0, 3.0, 10.0));
        objectives.push(LossSettings {
            unbiased_kl: true,
            ..clipped
        });
        objectives.push(LossSettings {
            unbiased_kl: true,
            kl_estimator: KlEstimator::K1,
            ..corr(Is::Tis, IsLevel::Token, 0.0, 3.0, 0.5)
        });
        assert!(objectives.len() >= 32, "{} objectives", objectives.len());
        let mut checked = 0;
        for (k, s0) in objectives.iter().enumerate() {
            for seed in 0..4u64 {
                let [logp, old, refl, ent, mask, adv] = ragged(100 + seed);
                let per_token: Vec<f32> = (0..12)
                    .map(|i| adv[i / 4] * (0.5 + (i % 4) as f32 * 0.3))
                    .collect();
                let adv = if seed % 2 == 1 { per_token } else { adv };
                let mut s = *s0;
                (s.beta, s.max_len, s.epsilon_high) = (0.3, 6, 0.28);
                if s.mode == LossMode::Gmpo {
                    (s.epsilon_low, s.epsilon_high) = (0.4, 0.4);
                }
                // The sampler's log π: π_old moved by up to ±0.15 nats per token.
                let sampler: Vec<f32> = (0..12)
                    .map(|i| old[i] + 0.075 * ((i * 7 % 5) as f32 - 2.0))
                    .collect();
                let run = |lp: &[f32], o: &[f32], s: &LossSettings| {
                    let mut out = TokenTerms::default();
                    let x = TokenInputs {
                        logp: lp,
                        old_logp: o,
                        ref_logp: &refl,
                        sampler_logp: Some(&sampler),
                        advantages: &adv,
                        mask: &mask,
                        entropy: Some(&ent),
                        t: 4,
                    };
                    evaluate(s, &x, &mut out);
                    out
                };
                let got = run(&logp, &old, &s);
                // GSPO-token: the token-level objective at π_old' = π/s.
                let (old, fd_settings) = if s.level == Level::SequenceToken {
                    let o: Vec<f32> = (0..12).map(|i| logp[i] - got.seq_ratio[i].ln()).collect();
                    (
                        o,
                        LossSettings {
                            level: Level::Token,
                            ..s
                        },
                    )
                } else {
                    (old, s)
                };
                let p = s.pg();
                for i in 0..12 {
                    if mask[i] == 0.0 {
                        assert_eq!(got.dlogp[i], 0.0);
                        continue;
                    }
                    let row = i / 4 * 4..i / 4 * 4 + 4;
                    let near = |x: f32, edge: f32| (x - edge).abs() < 2e-2 * edge.abs().max(1.0);
                    let kink = |r: f32| {
                        near(r, p.lo)
                            || near(r, p.hi)
                            || near(r, p.delta)
                            || near(r, p.dual_clip)
                            || near(r, p.cispo_cap)
                    };
                    let rows_ratio = if s.sequence_ratio() && s.mode != LossMode::Gmpo {
                        &got.seq_ratio
                    } else {
                        &got.ratio
                    };
                    if row.clone().any(|j| mask[j] != 0.0 && kink(rows_ratio[j])) {
                        continue;
                    }
                    let bump = |d: f32| {
                        let (mut lp, mut o) = (logp.clone(), old.clone());
                        lp[i] += d;
                        if s.mode == LossMode::Cispo {
                            o[i] += d; // the detached ratio held still
                        }
                        run(&lp, &o, &fd_settings).loss
                    };
                    let fd = ((bump(h) - bump(-h)) / (2.0 * h as f64)) as f32;
                    assert!(
                        (fd - got.dlogp[i]).abs() <= 2e-4 + 2e-3 * fd.abs(),
                        "objective {k} {:?} {:?} {} seed {seed} token {i}: ∂L/∂logπ {} vs finite differences {fd}",
                        s.mode,
                        s.level,
                        s.agg,
                        got.dlogp[i]
                    );
                    checked += 1;
                }
            }
        }
        eprintln!("{} objectives, {checked} tokens checked", objectives.len());
        assert!(checked > 500, "{checked} tokens checked");
    }

    /// `evaluate`'s loss and statistics equal the per-token scalar reference (`token_terms`,
    /// `aggregation_weights`, `clip_flags`) summed by hand.
    #[test]
    fn evaluate_equals_the_per_token_reference() {
        let [logp, junk_old, junk_ref, ent, ragged_mask, adv] = ragged(9);
        // A ragged batch, and one without padding (whose weights take their one-fill path; its
        // former padding holds ordinary values).
        let clean = |v: &[f32]| -> Vec<f32> {
            let real = v.iter().zip(&ragged_mask);
            real.map(|(&x, &m)| if m == 1.0 { x } else { -0.5 })
                .collect()
        };
        let full = (vec![1.0; 12], clean(&junk_old), clean(&junk_ref));
        for (mask, old, refl) in [(ragged_mask.clone(), junk_old, junk_ref), full] {
            for mode in [LossMode::Naive, LossMode::Unclipped, LossMode::Clipped] {
                for agg in LossAggMode::ALL {
                    let mut s = LossSettings::plain(mode, KlEstimator::K3, *agg);
                    s.beta = 0.1;
                    s.max_len = 5;
                    s.entropy_coef = 0.02;
                    let mut out = TokenTerms::default();
                    let x = TokenInputs {
                        logp: &logp,
                        old_logp: &old,
                        ref_logp: &refl,
                        sampler_logp: None,
                        advantages: &adv,
                        mask: &mask,
                        entropy: Some(&ent),
                        t: 4,
                    };
                    evaluate(&s, &x, &mut out);
                    let w = reference::aggregation_weights(*agg, &mask, 4, 5);
                    let (mut loss, mut kl, mut ratio, mut low, mut high, mut n) =
                        (0.0f64, 0.0f64, 0.0f64, 0.0, 0.0, 0.0);
                    for i in (0..12).filter(|&i| mask[i] == 1.0) {
                        let (r, l, k, flags) =
                            reference::token_terms(&s, logp[i], old[i], refl[i], adv[i / 4]);
                        loss += (w[i] * l - s.entropy_coef * w[i] * ent[i]) as f64;
                        kl += k as f64;
                        ratio += r as f64;
                        low += (flags & 1) as f64;
                        high += (flags >> 1) as f64;
                        n += 1.0;
                    }
                    let close = |a: f64, b: f64| (a - b).abs() <= 1e-5 * (1.0 + b.abs());
                    assert!(
                        close(out.loss, loss),
                        "{mode:?} {agg}: {} vs {loss}",
                        out.loss
                    );
                    assert!(close(out.kl as f64, kl / n));
                    assert!(close(out.ratio_mean as f64, ratio / n));
                    assert_eq!(out.clip_low, (low / n) as f32);
                    assert_eq!(out.clip_high, (high / n) as f32);
                }
            }
        }
    }

    /// A batch evaluated in spans of whole responses (as the threaded engines cut it) gives
    /// `evaluate`'s per-token coefficients bit for bit and its scalars up to the sums' order,
    /// for every loss, aggregation, and the unbiased KL, on a ragged batch.
    #[test]
    fn spans_give_the_whole_batch_s_terms() {
        let [logp, old, refl, ent, mask, adv] = ragged(11);
        for mode in LossMode::ALL {
            for agg in LossAggMode::ALL {
                for unbiased in [false, true] {
                    let s = LossSettings {
                        beta: 0.1,
                        max_len: 5,
                        entropy_coef: 0.02,
                        unbiased_kl: unbiased,
                        ..LossSettings::plain(*mode, KlEstimator::K3, *agg)
                    };
                    assert!(splits(&s));
                    let x = TokenInputs {
                        entropy: Some(&ent),
                        ..inputs(&logp, &old, &refl, &adv, &mask)
                    };
                    let mut whole = TokenTerms::default();
                    evaluate(&s, &x, &mut whole);
                    let totals = BatchTotals::of(&mask, 4);
                    let (mut sums, mut dlogp) = (Vec::new(), Vec::new());
                    for (a, b) in [(0usize, 1usize), (1, 3)] {
                        let (t0, t1) = (a * 4, b * 4);
                        let span = TokenInputs {
                            logp: &logp[t0..t1],
                            old_logp: &old[t0..t1],
                            ref_logp: &refl[t0..t1],
                            advantages: &adv[a..b],
                            mask: &mask[t0..t1],
                            entropy: Some(&ent[t0..t1]),
                            ..x
                        };
                        let mut part = TokenTerms::default();
                        sums.push(evaluate_span(&s, &span, &totals, &mut part));
                        dlogp.extend_from_slice(&part.dlogp);
                    }
                    let mut out = TokenTerms::default();
                    finish(&sums, &mut out);
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&dlogp), bits(&whole.dlogp), "{mode:?} {agg}");
                    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * (1.0 + b.abs());
                    assert!(close(out.loss, whole.loss), "{mode:?} {agg}");
                    for (a, b) in [
                        (out.kl, whole.kl),
                        (out.ratio_mean, whole.ratio_mean),
                        (out.entropy, whole.entropy),
                    ] {
                        assert!(close(a as f64, b as f64), "{mode:?} {agg}: {a} vs {b}");
                    }
                    assert_eq!(
                        (out.clip_low, out.clip_high),
                        (whole.clip_low, whole.clip_high)
                    );
                }
            }
        }
    }
}
