//! `grpo-lab objective`: one response's objective under any loss, level and knob of the
//! config — each token's term and `∂L/∂log π`, and the aggregated loss — computed by
//! [`super::loss::evaluate`], the text every engine trains with.

use super::loss::{self, LossSettings, TokenInputs, TokenTerms};
use crate::config::{ConfigError, RunConfig};
use serde::Serialize;

/// One token of a calculation.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TokenRow {
    /// The token's term of the objective J to maximise: `−(ℓ_t + β·KL_t)`.
    pub objective: f32,
    /// `∂L/∂log π_t` of the aggregated loss `L = −J` (the coefficient the engines apply).
    pub dlogp: f32,
    /// The ratio the token's term uses (the response's at the sequence level).
    pub ratio: f32,
    /// The policy-gradient term `ℓ_t`.
    pub loss_term: f32,
    /// The KL estimate `KL_t` against π_ref (`None`, JSON null, without `--ref-logp`).
    pub kl: Option<f32>,
    /// The aggregation's weight of the token.
    pub weight: f32,
    /// The mismatch lab's weight `ω_t` on `ℓ_t` (1 without `algorithm.is_correction`).
    pub is_weight: f32,
}

/// A whole calculation: the tokens, the loss, the clip fractions.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Calculation {
    pub tokens: Vec<TokenRow>,
    pub loss: f64,
    pub clip_low: f32,
    pub clip_high: f32,
}

/// What a calculation can refuse.
#[derive(Debug, thiserror::Error)]
pub enum CalcError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("{0}")]
    Input(String),
}

/// The objective of one response of `logp.len()` tokens with advantage `adv` under the
/// config's algorithm (`ref_logp`: log π_ref, needed where β > 0; `sampler_logp`: the
/// sampler's own log π, for `algorithm.is_correction`, π_old where absent).
pub fn calculate(
    config: &RunConfig,
    logp: &[f32],
    old_logp: &[f32],
    ref_logp: Option<&[f32]>,
    sampler_logp: Option<&[f32]>,
    adv: f32,
) -> Result<Calculation, CalcError> {
    config.validate()?;
    check_inputs(logp, old_logp, ref_logp, sampler_logp, adv)?;
    let n = logp.len();
    let s = LossSettings::of(config);
    if s.kl_on() && ref_logp.is_none() {
        return Err(CalcError::Input(
            "algorithm.beta > 0 puts the KL in the loss: give --ref-logp".into(),
        ));
    }
    if s.top_entropy_quantile < 1.0 {
        return Err(CalcError::Input(
            "algorithm.top_entropy_quantile is a batch-level rule (a quantile over a batch's token entropies): the loss-family and entropy experiments show it, one response cannot".into(),
        ));
    }
    if config.algorithm.adaptive_entropy {
        return Err(CalcError::Input(
            "algorithm.adaptive_entropy moves the bonus's coefficient from step to step on the batch's measured entropy: the entropy-controls experiment shows it, one response cannot".into(),
        ));
    }
    if s.entropy_coef != 0.0 {
        return Err(CalcError::Input(
            "algorithm.entropy_coef needs each token's entropy, which one response's log π does not give: set it to 0 here".into(),
        ));
    }
    let refl = ref_logp.unwrap_or(old_logp);
    // The sign's weights (NSR/PSR: algorithm.negative_weight, positive_weight) scale the
    // advantage as the trainer does, after its estimator.
    let mut advantages = [adv];
    let a = &config.algorithm;
    super::advantage::weight_by_sign(
        &mut advantages,
        a.positive_weight as f32,
        a.negative_weight as f32,
    );
    let mask = vec![1.0; n];
    let x = TokenInputs {
        logp,
        old_logp,
        ref_logp: refl,
        sampler_logp,
        advantages: &advantages,
        mask: &mask,
        entropy: None,
        t: n,
    };
    let mut t = TokenTerms::default();
    loss::evaluate(&s, &x, &mut t);
    let beta = if s.kl_on() { s.beta } else { 0.0 };
    let ratio = if s.sequence_ratio() && t.seq_ratio.len() == n {
        &t.seq_ratio
    } else {
        &t.ratio
    };
    let tokens = (0..n)
        .map(|i| TokenRow {
            // β = 0 leaves the KL out (its estimate may overflow where log π is far below).
            objective: -(t.term[i]
                + if beta == 0.0 {
                    0.0
                } else {
                    beta * t.kl_tokens[i]
                }),
            dlogp: t.dlogp[i],
            ratio: ratio[i],
            loss_term: t.term[i],
            kl: ref_logp.map(|_| t.kl_tokens[i]),
            weight: t.weight[i],
            is_weight: t.is_weight.get(i).copied().unwrap_or(1.0),
        })
        .collect::<Vec<TokenRow>>();
    finite_terms(&tokens, t.loss, logp, old_logp)?;
    Ok(Calculation {
        tokens,
        loss: t.loss,
        clip_low: t.clip_low,
        clip_high: t.clip_high,
    })
}

/// f32, as the engines compute: a ratio e^{log π − log π_old} past ~3.4e38 is infinite, and so
/// may the aggregated loss be of finite terms.
fn finite_terms(
    tokens: &[TokenRow],
    loss: f64,
    logp: &[f32],
    old_logp: &[f32],
) -> Result<(), CalcError> {
    let bad = tokens.iter().position(|r| {
        ![r.objective, r.dlogp, r.ratio]
            .iter()
            .all(|v| v.is_finite())
    });
    if let Some(i) = bad {
        return Err(CalcError::Input(format!(
            "token {i}: the objective is not finite in f32 (ratio {}, ∂L/∂log π {}; log π − log π_old = {}): allowed log-ratios whose exponential f32 holds (below ~88), as the engines compute in f32 too",
            tokens[i].ratio,
            tokens[i].dlogp,
            logp[i] - old_logp[i]
        )));
    }
    if !loss.is_finite() {
        return Err(CalcError::Input(format!(
            "the loss is {loss} in f32 although every token's term is finite: the aggregation overflows (allowed terms whose sum f32 holds, below ~3.4e38)"
        )));
    }
    Ok(())
}

/// The inputs' lengths agree and each is what it stands for: log-probabilities ≤ 0, a finite
/// advantage.
fn check_inputs(
    logp: &[f32],
    old_logp: &[f32],
    ref_logp: Option<&[f32]>,
    sampler_logp: Option<&[f32]>,
    adv: f32,
) -> Result<(), CalcError> {
    let n = logp.len();
    if n == 0 {
        return Err(CalcError::Input("--logp is empty".into()));
    }
    if old_logp.len() != n {
        return Err(CalcError::Input(format!(
            "--old-logp has {} values, --logp {n}: one per token each",
            old_logp.len()
        )));
    }
    if let Some(r) = sampler_logp.filter(|r| r.len() != n) {
        return Err(CalcError::Input(format!(
            "--sampler-logp has {} values, --logp {n}",
            r.len()
        )));
    }
    if let Some(r) = ref_logp.filter(|r| r.len() != n) {
        return Err(CalcError::Input(format!(
            "--ref-logp has {} values, --logp {n}",
            r.len()
        )));
    }
    // A log-probability is at most 0 (a probability at most 1): a positive one is a typo or a
    // logit, and the ratios it makes (e^{log π − log π_old}) describe no policy.
    for (flag, values) in [
        ("--logp", Some(logp)),
        ("--old-logp", Some(old_logp)),
        ("--ref-logp", ref_logp),
        ("--sampler-logp", sampler_logp),
    ] {
        if let Some((i, v)) = values
            .into_iter()
            .flatten()
            .enumerate()
            .find(|(_, v)| !v.is_finite() || **v > 0.0)
        {
            return Err(CalcError::Input(format!(
                "{flag}: token {i} has {v}; a log-probability is at most 0 (allowed: finite values ≤ 0)"
            )));
        }
    }
    if !adv.is_finite() {
        return Err(CalcError::Input(format!(
            "--advantage {adv}: allowed a finite value (an f32)"
        )));
    }
    Ok(())
}

impl Calculation {
    /// The table `grpo-lab objective` prints.
    pub fn table(&self, config: &RunConfig) -> String {
        let a = &config.algorithm;
        let mut out = format!(
            "loss {} · level {} · aggregation {} · ε [{}, {}] · β {}\n",
            a.loss,
            a.importance_sampling_level,
            a.loss_agg_mode,
            a.epsilon_low,
            a.epsilon_high,
            a.beta
        );
        if a.positive_weight != 1.0 || a.negative_weight != 1.0 {
            out += &format!(
                "advantage weighted by its sign: × {} where A > 0, × {} where A < 0\n",
                a.positive_weight, a.negative_weight
            );
        }
        let corrected = a.is_correction != crate::config::IsCorrection::None;
        if corrected {
            out += &format!(
                "correction {} · level {} · band [{}, {}]\n",
                a.is_correction, a.is_level, a.is_threshold_low, a.is_threshold_high
            );
        }
        out += "token    ratio   objective   ∂L/∂logπ     weight";
        out += if corrected { "          ω\n" } else { "\n" };
        for (i, r) in self.tokens.iter().enumerate() {
            out += &format!(
                "{i:>5} {:>8.4} {:>11.5} {:>10.5} {:>10.5}",
                r.ratio, r.objective, r.dlogp, r.weight
            );
            out += &if corrected {
                format!(" {:>10.5}\n", r.is_weight)
            } else {
                "\n".into()
            };
        }
        out += &format!(
            "loss {:.6} (clipped low {:.2}, high {:.2})\n",
            self.loss, self.clip_low, self.clip_high
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(sets: &[&str]) -> RunConfig {
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        RunConfig::default().with_overrides(&sets).unwrap()
    }

    /// The calculator is `evaluate` on one response: GSPO's worked value (log r = [0.1, 0.3],
    /// A = −1: s = e^0.2 on each token, ∂L/∂log π_t = s/2).
    #[test]
    fn gspo_by_hand() {
        let c = config(&[
            "algorithm.loss=clipped",
            "algorithm.importance_sampling_level=sequence",
            "algorithm.epsilon_low=0.0003",
            "algorithm.epsilon_high=0.0004",
        ]);
        let got = calculate(&c, &[-1.0, -2.0], &[-1.1, -2.3], None, None, -1.0).unwrap();
        let s = 0.2f32.exp();
        assert!((got.loss as f32 - s).abs() < 1e-5, "{got:?}");
        for t in &got.tokens {
            assert!((t.ratio - s).abs() < 1e-5 && (t.dlogp - s / 2.0).abs() < 1e-5);
            assert!((t.objective + s).abs() < 1e-5);
        }
    }

    /// Bad combinations are refused naming both keys; ragged inputs naming the flags.
    #[test]
    fn refusals() {
        let sets = [
            "algorithm.loss=cispo",
            "algorithm.importance_sampling_level=sequence",
        ];
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        let e = RunConfig::default()
            .with_overrides(&sets)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("importance_sampling_level") && e.contains("algorithm.loss"),
            "{e}"
        );
        let mut c = RunConfig::default();
        c.algorithm.loss = crate::config::LossMode::Gmpo;
        c.algorithm.loss_agg_mode = crate::config::LossAggMode::TokenMean;
        let e = calculate(&c, &[-1.0], &[-1.0], None, None, 1.0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("loss_agg_mode") && e.contains("gmpo"), "{e}");
        let c = config(&[]);
        let e = calculate(&c, &[-1.0, -2.0], &[-1.0], None, None, 1.0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--old-logp"), "{e}");
        let c = config(&["algorithm.beta=0.1"]);
        let e = calculate(&c, &[-1.0], &[-1.0], None, None, 1.0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--ref-logp"), "{e}");
        // A log-probability above 0 names its flag and token; 0 itself (p = 1) is allowed.
        let c = config(&[]);
        let e = calculate(&c, &[-1.0, 0.5], &[-1.0, -1.0], None, None, 1.0)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--logp: token 1 has 0.5") && e.contains("≤ 0"),
            "{e}"
        );
        let e = calculate(&c, &[-1.0], &[-1.0], None, Some(&[0.1]), 1.0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--sampler-logp: token 0"), "{e}");
        assert!(calculate(&c, &[0.0], &[-0.0], None, None, 1.0).is_ok());
        // A non-finite advantage is refused; a token far below π_old has a finite objective
        // where β = 0 (its KL estimate overflows, and is not in the loss).
        let e = calculate(&c, &[-1.0], &[-1.0], None, None, f32::INFINITY)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--advantage"), "{e}");
        let got = calculate(&c, &[-1.0, -1000.0], &[-1.0, -1.0], None, None, 1.0).unwrap();
        assert!(
            got.tokens.iter().all(|t| t.objective.is_finite()),
            "{got:?}"
        );
        // Far above π_old the ratio overflows f32: refused, naming the token (it printed inf).
        let c = config(&["algorithm.loss=unclipped"]);
        let e = calculate(&c, &[-1.0, -1.0], &[-1.0, -1000.0], None, None, 1.0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("token 1") && e.contains("not finite"), "{e}");
    }

    /// The sign's weights scale the advantage as in training (they were ignored); without
    /// π_ref there is no KL to report (it was k3 against π_old).
    #[test]
    fn sign_weights_apply_and_no_kl_without_a_reference() {
        let plain = calculate(&config(&[]), &[-1.0], &[-1.0], None, None, 1.0).unwrap();
        let c = config(&["algorithm.positive_weight=0.5"]);
        let half = calculate(&c, &[-1.0], &[-1.0], None, None, 1.0).unwrap();
        assert!((half.tokens[0].dlogp - plain.tokens[0].dlogp / 2.0).abs() < 1e-7);
        let negative = calculate(&c, &[-1.0], &[-1.0], None, None, -1.0).unwrap();
        assert!((negative.tokens[0].dlogp + plain.tokens[0].dlogp).abs() < 1e-7);
        assert_eq!(plain.tokens[0].kl, None);
        let with_ref = calculate(&c, &[-1.0], &[-1.0], Some(&[-2.0]), None, 1.0).unwrap();
        assert!(with_ref.tokens[0].kl.is_some_and(|k| k > 0.0));
    }
}
