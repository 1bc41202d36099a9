//! A logged group's tokens through the objective: each token's quantities (the inspector's
//! token view colours them) and the configured objective written out with one token's
//! numbers, step by step to its contribution to the step's loss (the inspector's formula
//! card). The numbers are [`loss::evaluate`]'s — the text every engine trains with — over the
//! group's responses, each token weighted as in its step's batch ([`reference::row_weight`]);
//! the formulas beside them are the words for [`reference::pg_term`], `kl_term` and
//! `aggregation_weights`.

use super::advantage::{GroupStats, STD_EPS};
use super::loss::{self, LossSettings, RatioForm, TokenInputs, TokenTerms, reference};
use crate::config::{
    AdvantageMode, CovPenalty, ImportanceSamplingLevel, KlEstimator, LossAggMode, LossMode,
};

/// A logged group's per-token inputs: one row per response, as long as its real tokens
/// (`ref_logp` and `entropy` may be empty: a log written before they were recorded, or an
/// engine that keeps the entropy on its device).
#[derive(Debug, Clone, Copy)]
pub struct GroupInputs<'a> {
    pub logp: &'a [Vec<f32>],
    pub old_logp: &'a [Vec<f32>],
    pub ref_logp: &'a [Vec<f32>],
    pub entropy: &'a [Vec<f32>],
    /// One per response: the advantage it was trained with.
    pub advantages: &'a [f32],
}

/// The step's batch the group was part of: what the aggregation's weights read.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BatchShape {
    /// Responses in the step (`B·G` of its mini-batch).
    pub responses: usize,
    /// Their real tokens.
    pub tokens: usize,
}

/// A group's tokens under one objective: `[G·T]` arrays, `T` the group's longest response.
#[derive(Debug, Clone)]
pub struct GroupTerms {
    pub t: usize,
    /// Each response's tokens with a log π (its real tokens).
    pub lengths: Vec<usize>,
    /// `evaluate`'s per-token terms; `weight` is the token's weight in its step's batch.
    pub terms: TokenTerms,
    /// `log π_t`, `log π_old,t`, `log π_ref,t` (π_old's where π_ref was not recorded).
    pub logp: Vec<f32>,
    pub old_logp: Vec<f32>,
    pub ref_logp: Vec<f32>,
    /// `H_t` (NaN where not recorded).
    pub entropy: Vec<f32>,
    /// `w_t·(ℓ_t + β·KL_t − c·H_t)`: the token's share of the step's loss (the KL only where it
    /// is in the loss, the bonus only where it is on and the entropy known).
    pub contribution: Vec<f32>,
    pub has_ref: bool,
    pub has_entropy: bool,
    /// What the group alone cannot reproduce of the step (the batch-level rules), in words.
    pub caveats: Vec<&'static str>,
}

/// The quantities a token can be coloured by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quantity {
    Contribution,
    Advantage,
    Ratio,
    Kl,
    Entropy,
    Covariance,
}

impl Quantity {
    pub const ALL: [Quantity; 6] = [
        Quantity::Contribution,
        Quantity::Advantage,
        Quantity::Ratio,
        Quantity::Kl,
        Quantity::Entropy,
        Quantity::Covariance,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Quantity::Contribution => "objective: w·(ℓ + β·KL − c·H)",
            Quantity::Advantage => "advantage A",
            Quantity::Ratio => "ratio ρ = π/π_old",
            Quantity::Kl => "KL term",
            Quantity::Entropy => "entropy H",
            Quantity::Covariance => "Cov(log π, A) term",
        }
    }

    /// Signed quantities are drawn on a diverging scale around their centre (0, or 1 for the
    /// ratio, on a log scale); the entropy and the KL estimate from 0 up.
    pub fn diverging(self) -> bool {
        !matches!(self, Quantity::Entropy)
    }
}

/// `rows` padded to `[R·T]` with `fill` (row `i` keeps its first `lengths[i]` values).
fn padded(rows: &[Vec<f32>], lengths: &[usize], t: usize, fill: f32) -> Vec<f32> {
    let mut out = vec![fill; lengths.len() * t];
    for (i, row) in rows.iter().take(lengths.len()).enumerate() {
        let n = lengths[i].min(row.len());
        out[i * t..i * t + n].copy_from_slice(&row[..n]);
    }
    out
}

/// The settings over the group alone: the batch-level rules (they pick tokens across the whole
/// batch), the correction (the sampler's own log π is not logged) and — without entropies —
/// the bonus are left out, each said in words.
fn group_settings(s: &LossSettings, has_entropy: bool) -> (LossSettings, Vec<&'static str>) {
    let mut g = *s;
    let mut caveats = Vec::new();
    if g.cov != CovPenalty::None {
        g.cov = CovPenalty::None;
        caveats.push("the covariance rule (Clip-Cov / KL-Cov) picks tokens across the whole batch: its picks are not shown");
    }
    if g.top_entropy_quantile < 1.0 {
        g.top_entropy_quantile = 1.0;
        caveats.push("the 80/20 rule keeps the batch's top-entropy tokens: its mask is not shown");
    }
    if g.correction.on() {
        g.correction = super::correction::Correction::NONE;
        caveats
            .push("the sampler's own log π is not logged: the correction's weight ω is not shown");
    }
    if g.entropy_coef != 0.0 && !has_entropy {
        g.entropy_coef = 0.0;
        caveats.push(
            "this engine does not return each token's entropy: the entropy bonus is not shown",
        );
    }
    (g, caveats)
}

impl GroupTerms {
    /// The group's tokens under `s`, weighted as in `batch`.
    pub fn of(s: &LossSettings, x: &GroupInputs, batch: BatchShape) -> Self {
        let r = x.advantages.len().min(x.logp.len()).min(x.old_logp.len());
        let lengths: Vec<usize> = (0..r)
            .map(|i| x.logp[i].len().min(x.old_logp[i].len()))
            .collect();
        let t = lengths.iter().copied().max().unwrap_or(0).max(1);
        let has_ref = x.ref_logp.len() >= r && (0..r).all(|i| x.ref_logp[i].len() >= lengths[i]);
        let has_entropy = x.entropy.len() >= r && (0..r).all(|i| x.entropy[i].len() >= lengths[i]);
        let pad = |rows: &[Vec<f32>], fill: f32| padded(rows, &lengths, t, fill);
        let (logp, old) = (pad(x.logp, 0.0), pad(x.old_logp, 0.0));
        let refl = if has_ref {
            pad(x.ref_logp, 0.0)
        } else {
            old.clone()
        };
        let entropy = if has_entropy {
            pad(x.entropy, f32::NAN)
        } else {
            vec![f32::NAN; r * t]
        };
        let mask: Vec<f32> = (0..r * t)
            .map(|k| if k % t < lengths[k / t] { 1.0 } else { 0.0 })
            .collect();
        let (g, caveats) = group_settings(s, has_entropy);
        let bonus = g.entropy_coef != 0.0;
        let mut terms = TokenTerms::default();
        loss::evaluate(
            &g,
            &TokenInputs {
                logp: &logp,
                old_logp: &old,
                ref_logp: &refl,
                sampler_logp: None,
                advantages: &x.advantages[..r],
                mask: &mask,
                entropy: bonus.then_some(&entropy[..]),
                t,
            },
            &mut terms,
        );
        // Each token's weight in its step's batch, not in the group.
        for (i, &len) in lengths.iter().enumerate() {
            let w = reference::row_weight(
                s.agg,
                len as f32,
                batch.responses,
                batch.tokens as f32,
                s.max_len.max(t),
            );
            terms.weight[i * t..i * t + len].fill(w);
        }
        let beta = if g.kl_on() { g.beta } else { 0.0 };
        let contribution = (0..r * t)
            .map(|k| {
                if mask[k] == 0.0 {
                    return 0.0;
                }
                let h = if bonus {
                    g.entropy_coef * entropy[k]
                } else {
                    0.0
                };
                let kl = if beta != 0.0 && has_ref {
                    beta * terms.kl_tokens[k]
                } else {
                    0.0
                };
                terms.weight[k] * (terms.term[k] + kl - h)
            })
            .collect();
        if !has_ref {
            terms.kl_tokens.fill(f32::NAN);
        }
        Self {
            t,
            lengths,
            terms,
            logp,
            old_logp: old,
            ref_logp: refl,
            entropy,
            contribution,
            has_ref,
            has_entropy,
            caveats,
        }
    }

    /// The `[G·T]` index of response `i`'s token `t` (`None` past its end).
    pub fn at(&self, i: usize, t: usize) -> Option<usize> {
        (i < self.lengths.len() && t < self.lengths[i]).then_some(i * self.t + t)
    }

    /// A token's value of `q` (`cov`: the logged covariance terms, `[G][T]`).
    pub fn value(&self, q: Quantity, i: usize, t: usize, cov: &[Vec<f32>]) -> f32 {
        let Some(k) = self.at(i, t) else {
            return f32::NAN;
        };
        match q {
            Quantity::Contribution => self.contribution[k],
            Quantity::Advantage => self.terms.adv[k],
            Quantity::Ratio => self.ratio_at(k),
            Quantity::Kl => self.terms.kl_tokens[k],
            Quantity::Entropy => self.entropy[k],
            Quantity::Covariance => cov
                .get(i)
                .and_then(|c| c.get(t))
                .copied()
                .unwrap_or(f32::NAN),
        }
    }

    /// The ratio whose clip applies at index `k`: the response's at the sequence level.
    fn ratio_at(&self, k: usize) -> f32 {
        match self.terms.seq_ratio.get(k) {
            Some(&s) => s,
            None => self.terms.ratio[k],
        }
    }

    /// Whether the objective's clip holds the token: the clipped loss and GMPO (no gradient
    /// through its ratio), CISPO (its weight capped). The losses without a clip never do (the
    /// logged clip fractions count their tokens outside `1 ± ε` all the same).
    pub fn clipped(&self, s: &LossSettings, i: usize, t: usize) -> bool {
        let Some(k) = self.at(i, t) else {
            return false;
        };
        if !clips(s) {
            return false;
        }
        let ratio = if s.sequence_ratio() && s.mode != LossMode::Gmpo {
            self.ratio_at(k)
        } else {
            self.terms.ratio[k]
        };
        let (low, high) = reference::clip_flags(&s.pg(), ratio, self.terms.adv[k]);
        low || high
    }

    /// The largest |value| of `q` over the group's tokens (the colour scale's end); for the
    /// ratio, the largest |log ρ|.
    pub fn scale(&self, q: Quantity, cov: &[Vec<f32>]) -> f32 {
        let mut m = 0.0f32;
        for (i, &len) in self.lengths.iter().enumerate() {
            for t in 0..len {
                let v = self.value(q, i, t, cov);
                let v = if q == Quantity::Ratio { v.ln() } else { v };
                if v.is_finite() {
                    m = m.max(v.abs());
                }
            }
        }
        m.max(1e-12)
    }
}

/// One step of a token's formula: what it computes, the formula, the same with the token's
/// numbers, and its value.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub what: &'static str,
    pub formula: String,
    pub numbers: String,
    pub value: f32,
}

fn step(what: &'static str, formula: impl Into<String>, numbers: String, value: f32) -> Step {
    Step {
        what,
        formula: formula.into(),
        numbers,
        value,
    }
}

/// What the advantage step reads besides the group's terms: the group's rewards, the mode that
/// drives and (for `batch_normalized`) the batch's std where known.
#[derive(Debug, Clone, Copy)]
pub struct AdvantageInputs<'a> {
    pub mode: AdvantageMode,
    pub rewards: &'a [f32],
}

/// The advantage of response `i` written out (GRPO-SPEC §3) with the group's rewards; `value`
/// is the advantage it was trained with.
pub fn advantage_step(a: &AdvantageInputs, i: usize, value: f32) -> Step {
    let r = a.rewards.get(i).copied().unwrap_or(f32::NAN);
    let g = a.rewards.len();
    let s = GroupStats::of(a.rewards);
    let (formula, numbers) = match a.mode {
        AdvantageMode::Raw => ("A_i = r_i".to_string(), format!("{r:.3}")),
        AdvantageMode::Centered => (
            "A_i = r_i − mean(r)".into(),
            format!("{r:.3} − {:.3}", s.mean),
        ),
        AdvantageMode::Normalized => (
            "A_i = (r_i − mean(r)) / (std(r) + ε)".into(),
            format!("({r:.3} − {:.3}) / ({:.3} + {STD_EPS:e})", s.mean, s.std),
        ),
        AdvantageMode::Max => (
            "A_i = r_i if r_i = max(r), else 0".into(),
            format!("r_i = {r:.3}, max(r) = {:.3}", s.max),
        ),
        AdvantageMode::Rloo => (
            "A_i = r_i − mean_{j≠i}(r_j) = G/(G−1)·(r_i − mean(r))".into(),
            format!("{g}/{}·({r:.3} − {:.3})", g.saturating_sub(1), s.mean),
        ),
        AdvantageMode::BatchNormalized => (
            "A_i = (r_i − mean(r)) / (std over the batch + ε)".into(),
            format!("({r:.3} − {:.3}) / (std_batch + ε)", s.mean),
        ),
        m => (
            format!("A_i by {m} (its estimator reads more than the group's rewards)"),
            format!("r_i = {r:.3}"),
        ),
    };
    step("advantage", formula, numbers, value)
}

/// The configured objective at response `i`'s token `t`, step by step: ratio, policy-gradient
/// term (and whether the clip holds it), KL, entropy bonus, weight, contribution.
pub fn token_steps(s: &LossSettings, g: &GroupTerms, i: usize, t: usize) -> Vec<Step> {
    let Some(k) = g.at(i, t) else {
        return Vec::new();
    };
    let x = &g.terms;
    let (a, r) = (x.adv[k], x.ratio[k]);
    let mut out = vec![ratio_step(s, g, k)];
    out.push(pg_step(s, g, k, a, r));
    let dterm = x.dterm[k];
    out.push(step(
        "gradient of ℓ",
        if s.coupled() {
            "∂ℓ/∂log s (through the response's mean log-ratio)"
        } else {
            "∂ℓ/∂log π_t"
        },
        if dterm == 0.0 && a != 0.0 {
            "0: the clip (or a cap) holds this token — it teaches nothing this step".into()
        } else {
            format!("{dterm:+.4}")
        },
        dterm,
    ));
    if g.has_ref {
        out.push(kl_step(s, g, k));
    }
    if s.entropy_coef != 0.0 && g.has_entropy {
        let h = g.entropy[k];
        out.push(step(
            "entropy bonus",
            "− c·H_t",
            format!("− {}·{h:.4}", s.entropy_coef),
            -s.entropy_coef * h,
        ));
    }
    out.push(weight_step(s, g, i, x.weight[k]));
    let beta = if s.kl_on() && g.has_ref { s.beta } else { 0.0 };
    let c = if g.has_entropy { s.entropy_coef } else { 0.0 };
    let h = if c != 0.0 { g.entropy[k] } else { 0.0 };
    out.push(step(
        "contribution to the loss",
        "w_t·(ℓ_t + β·KL_t − c·H_t)",
        format!(
            "{:.3e}·({:+.4} + {beta}·{:.4} − {c}·{h:.4})",
            x.weight[k],
            x.term[k],
            if g.has_ref { x.kl_tokens[k] } else { 0.0 }
        ),
        g.contribution[k],
    ));
    out
}

fn ratio_step(s: &LossSettings, g: &GroupTerms, k: usize) -> Step {
    let x = &g.terms;
    let r = x.ratio[k];
    let (lp, old) = (g.logp[k], g.old_logp[k]);
    let lr = lp - old;
    match (s.ratio_form(), s.sequence_ratio()) {
        (RatioForm::Unfrozen, _) => step(
            "ratio",
            "ρ_t ≡ 1 (BUG: π_old recomputed with gradient)",
            "1".into(),
            1.0,
        ),
        (RatioForm::Quotient, _) => step(
            "ratio",
            "ρ_t = log π_t / log π_old,t (BUG: a quotient of logs)",
            format!("{lp:.4} / {old:.4}"),
            r,
        ),
        (RatioForm::Exp, false) => step(
            "ratio",
            "ρ_t = π_θ/π_old = exp(log π_t − log π_old,t)",
            format!("exp({lp:.4} − ({old:.4})) = exp({lr:+.4})"),
            r,
        ),
        (RatioForm::Exp, true) => {
            let sr = x.seq_ratio.get(k).copied().unwrap_or(r);
            if s.mode == LossMode::Gmpo {
                step(
                    "ratio",
                    "r̄_i = exp(mean_t clip(log ρ_t, −ε_low, ε_high)) (GMPO's geometric mean)",
                    format!("token ρ_t = exp({lr:+.4}); r̄_i = exp({:+.4})", sr.ln()),
                    sr,
                )
            } else if s.level == ImportanceSamplingLevel::SequenceToken {
                step(
                    "ratio",
                    "s_i,t = sg(s_i)·π_t/sg(π_t), s_i = exp(mean_t log ρ_t) (GSPO-token)",
                    format!("token ρ_t = exp({lr:+.4}); s_i = exp({:+.4})", sr.ln()),
                    sr,
                )
            } else {
                step(
                    "ratio",
                    "s_i = exp(1/|o_i|·Σ_t (log π_t − log π_old,t)) (GSPO: the response's)",
                    format!("token ρ_t = exp({lr:+.4}); s_i = exp({:+.4})", sr.ln()),
                    sr,
                )
            }
        }
    }
}

/// Whether the loss has a clip (or a cap) that can hold a token.
fn clips(s: &LossSettings) -> bool {
    matches!(s.mode, LossMode::Clipped | LossMode::Gmpo | LossMode::Cispo)
}

fn pg_step(s: &LossSettings, g: &GroupTerms, k: usize, a: f32, r: f32) -> Step {
    let x = &g.terms;
    let p = s.pg();
    let term = x.term[k];
    let rr = match s.sequence_ratio() {
        true => x.seq_ratio.get(k).copied().unwrap_or(r),
        false => r,
    };
    let (formula, numbers) = match s.mode {
        LossMode::Naive => (
            "ℓ_t = −A·log π_t".to_string(),
            format!("−({a:+.4})·({:.4})", g.logp[k]),
        ),
        LossMode::Unclipped => ("ℓ_t = −A·ρ".into(), format!("−({a:+.4})·{rr:.4}")),
        LossMode::Gmpo => ("ℓ_t = −A·r̄_i".into(), format!("−({a:+.4})·{rr:.4}")),
        LossMode::Clipped => {
            let c = rr.clamp(p.lo, p.hi);
            let mut f = "ℓ_t = −min(ρ·A, clip(ρ, 1−ε_low, 1+ε_high)·A)".to_string();
            if p.delta > 0.0 {
                f = "ℓ_t = −min(min(ρ, δ)·A, clip(ρ, 1−ε_low, 1+ε_high)·A)".into();
            }
            if p.dual_clip > 0.0 {
                f += ", for A < 0 capped at c·|A| (dual clip)";
            }
            (
                f,
                format!(
                    "−min({rr:.4}·{a:+.4}, clip({rr:.4}, {:.3}, {:.3})·{a:+.4}) = −min({:+.4}, {:+.4})",
                    p.lo,
                    p.hi,
                    rr * a,
                    c * a
                ),
            )
        }
        LossMode::Cispo => (
            "ℓ_t = −sg(min(ρ, cap))·A·log π_t".into(),
            format!(
                "−min({rr:.4}, {})·({a:+.4})·({:.4})",
                p.cispo_cap, g.logp[k]
            ),
        ),
        LossMode::Sapo => {
            let tau = if a > 0.0 { p.tau_pos } else { p.tau_neg };
            (
                "ℓ_t = −(4/τ)·σ(τ·(ρ − 1))·A (τ by the sign of A)".into(),
                format!("−(4/{tau})·σ({tau}·({rr:.4} − 1))·({a:+.4})"),
            )
        }
    };
    let clipped = {
        let (low, high) = reference::clip_flags(
            &p,
            if s.sequence_ratio() && s.mode != LossMode::Gmpo {
                rr
            } else {
                r
            },
            a,
        );
        clips(s) && (low || high)
    };
    let numbers = if clipped {
        format!("{numbers}   ✂ clipped")
    } else {
        numbers
    };
    step("policy-gradient term", formula, numbers, term)
}

fn kl_step(s: &LossSettings, g: &GroupTerms, k: usize) -> Step {
    let kl = g.terms.kl_tokens[k];
    let delta = g.ref_logp[k] - g.logp[k];
    let formula = match s.kl_estimator {
        KlEstimator::K1 => "KL_t (k1) = log π_t − log π_ref,t",
        KlEstimator::K2 => "KL_t (k2) = ½·(log π_ref,t − log π_t)²",
        KlEstimator::K3 => "KL_t (k3) = exp(Δ) − Δ − 1, Δ = log π_ref,t − log π_t",
    };
    let where_ = if s.kl_on() {
        format!("in the loss as β·KL_t = {}·{kl:.4}", s.beta)
    } else if s.beta > 0.0 {
        format!("β = {}: in the reward, not the loss", s.beta)
    } else {
        "β = 0: logged only".into()
    };
    let where_ = format!(
        "Δ = {:.4} − ({:.4}) = {delta:+.4}; {where_}",
        g.ref_logp[k], g.logp[k]
    );
    step("KL to the reference", formula, where_, kl)
}

fn weight_step(s: &LossSettings, g: &GroupTerms, i: usize, w: f32) -> Step {
    let len = g.lengths.get(i).copied().unwrap_or(0);
    let (formula, numbers) = match s.agg {
        LossAggMode::TokenMean => (
            "w_t = 1/Σ_i |o_i| (token-mean: every real token of the batch alike)",
            format!("1/{:.0}", 1.0 / w),
        ),
        LossAggMode::SeqMeanTokenMean => (
            "w_t = 1/(R·|o_i|) (seq-mean-token-mean: each response's mean, then theirs)",
            format!("1/(R·{len}), R = {:.0}", 1.0 / (w * len.max(1) as f32)),
        ),
        LossAggMode::SeqMeanTokenSumNorm => (
            "w_t = 1/(R·L_max) (Dr. GRPO: a constant normaliser)",
            format!("1/{:.0}", 1.0 / w),
        ),
        LossAggMode::Luspo => (
            "w_t = 1/R (LUSPO: each response's sum, then the mean)",
            format!("1/{:.0}", 1.0 / w),
        ),
    };
    step("aggregation weight", formula, numbers, w)
}

/// One objective the formula card compares with: its loss and ratio level, and where it names
/// them its aggregation and clip range (else the configured ones stay).
#[derive(Debug, Clone, Copy)]
pub struct Variant {
    pub name: &'static str,
    pub mode: LossMode,
    pub level: ImportanceSamplingLevel,
    pub agg: Option<LossAggMode>,
    pub eps: Option<(f32, f32)>,
}

const fn variant(
    name: &'static str,
    mode: LossMode,
    level: ImportanceSamplingLevel,
    agg: Option<LossAggMode>,
    eps: Option<(f32, f32)>,
) -> Variant {
    Variant {
        name,
        mode,
        level,
        agg,
        eps,
    }
}

use ImportanceSamplingLevel::{Sequence, SequenceToken, Token};

/// The objectives of the compare menu, with the field's usual settings of each.
pub const COMPARE: &[Variant] = &[
    variant(
        "GRPO (clipped, per token)",
        LossMode::Clipped,
        Token,
        Some(LossAggMode::SeqMeanTokenMean),
        None,
    ),
    variant(
        "DAPO (clip-higher, token-mean)",
        LossMode::Clipped,
        Token,
        Some(LossAggMode::TokenMean),
        Some((0.2, 0.28)),
    ),
    variant(
        "Dr. GRPO (constant normaliser)",
        LossMode::Clipped,
        Token,
        Some(LossAggMode::SeqMeanTokenSumNorm),
        None,
    ),
    variant(
        "GSPO (sequence ratio)",
        LossMode::Clipped,
        Sequence,
        None,
        Some((3e-4, 4e-4)),
    ),
    variant(
        "GSPO-token",
        LossMode::Clipped,
        SequenceToken,
        None,
        Some((3e-4, 4e-4)),
    ),
    variant(
        "CISPO (capped IS weight)",
        LossMode::Cispo,
        Token,
        None,
        None,
    ),
    variant("SAPO (soft gate)", LossMode::Sapo, Token, None, None),
    variant(
        "GMPO (geometric mean)",
        LossMode::Gmpo,
        Token,
        None,
        Some((0.4, 0.4)),
    ),
    variant("unclipped (ρ·A)", LossMode::Unclipped, Token, None, None),
    variant("naive (A·log π)", LossMode::Naive, Token, None, None),
];

/// The settings of `COMPARE[which]` over `s`.
pub fn compared(s: &LossSettings, which: usize) -> LossSettings {
    let mut out = *s;
    if let Some(v) = COMPARE.get(which) {
        out.mode = v.mode;
        out.level = v.level;
        out.agg = v.agg.unwrap_or(out.agg);
        (out.epsilon_low, out.epsilon_high) = v.eps.unwrap_or((out.epsilon_low, out.epsilon_high));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    type Rows = Vec<Vec<f32>>;

    /// (log π, log π_old, log π_ref, advantages) of two responses, 3 and 2 tokens long.
    fn group() -> (Rows, Rows, Rows, Vec<f32>) {
        let logp = vec![vec![-0.5, -1.0, -0.2], vec![-2.0, -0.1]];
        let old = vec![vec![-0.6, -0.7, -0.2], vec![-1.5, -0.1]];
        let refl = vec![vec![-0.4, -1.2, -0.3], vec![-1.0, -0.2]];
        (logp, old, refl, vec![1.0, -1.0])
    }

    fn terms(s: &LossSettings, batch: BatchShape) -> GroupTerms {
        let (logp, old, refl, adv) = group();
        GroupTerms::of(
            s,
            &GroupInputs {
                logp: &logp,
                old_logp: &old,
                ref_logp: &refl,
                entropy: &[],
                advantages: &adv,
            },
            batch,
        )
    }

    /// Every step's value is the token's number from `evaluate`, and the contribution is
    /// the weight times the terms: by hand for GRPO's clipped loss with a k3 KL in the loss.
    #[test]
    fn clipped_token_by_hand() {
        let mut s = LossSettings::plain(
            LossMode::Clipped,
            KlEstimator::K3,
            LossAggMode::SeqMeanTokenMean,
        );
        s.beta = 0.1;
        let batch = BatchShape {
            responses: 8,
            tokens: 30,
        };
        let g = terms(&s, batch);
        // Response 0, token 1: ρ = e^−0.3 = 0.741 < 0.8 with A = +1: −min(0.741, 0.8) = −0.741,
        // not clipped (the clip holds only ρ > 1.2 for A > 0).
        let steps = token_steps(&s, &g, 0, 1);
        let r = (-0.3f32).exp();
        assert!((steps[0].value - r).abs() < 1e-6);
        assert!((steps[1].value + r).abs() < 1e-6);
        assert!(!steps[1].numbers.contains('✂'));
        // k3 with Δ = −1.2 − (−1.0) = −0.2.
        let kl = (-0.2f32).exp() + 0.2 - 1.0;
        let kl_step = steps
            .iter()
            .find(|s| s.what == "KL to the reference")
            .unwrap();
        assert!((kl_step.value - kl).abs() < 1e-6);
        // Weight: 1/(R·|o_0|) = 1/(8·3) in the batch, not 1/(2·3) in the group.
        let w = steps
            .iter()
            .find(|s| s.what == "aggregation weight")
            .unwrap();
        assert!((w.value - 1.0 / 24.0).abs() < 1e-7);
        let c = steps.last().unwrap();
        assert!((c.value - (-r + 0.1 * kl) / 24.0).abs() < 1e-6);
        // Response 1, token 0: ρ = e^−0.5 = 0.607 < 0.8 with A = −1: clipped low, ℓ = 0.8,
        // and its gradient is 0.
        let steps = token_steps(&s, &g, 1, 0);
        assert!(g.clipped(&s, 1, 0));
        assert!((steps[1].value - 0.8).abs() < 1e-6);
        assert!(steps[1].numbers.contains('✂'));
        assert_eq!(steps[2].value, 0.0);
    }

    /// The contributions of every token sum to the loss `evaluate` gives the group when the
    /// group is the whole batch, for every objective of the compare menu.
    #[test]
    fn contributions_sum_to_the_loss_for_every_compared_objective() {
        let base = LossSettings::plain(
            LossMode::Clipped,
            KlEstimator::K3,
            LossAggMode::SeqMeanTokenMean,
        );
        let whole = BatchShape {
            responses: 2,
            tokens: 5,
        };
        for (which, v) in COMPARE.iter().enumerate() {
            let mut s = compared(&base, which);
            s.max_len = 3;
            let g = terms(&s, whole);
            let sum: f64 = g.contribution.iter().map(|&c| c as f64).sum();
            assert!(
                (sum - g.terms.loss).abs() < 1e-5,
                "{}: {sum} vs {}",
                v.name,
                g.terms.loss
            );
            assert!(!token_steps(&s, &g, 1, 1).is_empty());
        }
    }

    #[test]
    fn advantage_steps_show_the_group_s_numbers() {
        let rewards = [1.0, 0.0, 0.5, 0.5];
        let a = AdvantageInputs {
            mode: AdvantageMode::Normalized,
            rewards: &rewards,
        };
        let s = advantage_step(&a, 0, 1.2);
        assert!(s.numbers.starts_with("(1.000 − 0.500) / (0.408"));
        assert_eq!(s.value, 1.2);
    }

    /// Without log π_ref the KL is unknown (NaN), not 0; without entropies the bonus is said
    /// to be missing.
    #[test]
    fn missing_inputs_are_said_not_invented() {
        let mut s = LossSettings::plain(LossMode::Clipped, KlEstimator::K3, LossAggMode::TokenMean);
        s.entropy_coef = 0.01;
        let (logp, old, _, adv) = group();
        let g = GroupTerms::of(
            &s,
            &GroupInputs {
                logp: &logp,
                old_logp: &old,
                ref_logp: &[],
                entropy: &[],
                advantages: &adv,
            },
            BatchShape {
                responses: 2,
                tokens: 5,
            },
        );
        assert!(g.value(Quantity::Kl, 0, 0, &[]).is_nan());
        assert!(g.value(Quantity::Entropy, 0, 0, &[]).is_nan());
        assert_eq!(g.caveats.len(), 1);
        assert!(g.value(Quantity::Ratio, 0, 5, &[]).is_nan());
    }
}
