//! The objective's keys in each framework. Loss × importance-sampling level × aggregation
//! decide one name there — TRL's `loss_type` (+ `importance_sampling_level`), verl's
//! `policy_loss.loss_mode`, OpenRLHF's `actor.policy_loss_type` — written by the
//! `algorithm.loss` row; the other rows say how they enter it.

use super::*;
use crate::config::{CovPenalty, ImportanceSamplingLevel as Level, LossAggMode, LossMode};

/// The row of an objective key (`None`: not one).
pub(super) fn objective_row(x: &Ctx, key: &str) -> Option<Mapped> {
    Some(match key {
        "algorithm.loss" => loss(x),
        "algorithm.importance_sampling_level" => level(x),
        "algorithm.epsilon_low" => epsilon_low(x),
        "algorithm.epsilon_high" => epsilon_high(x),
        "algorithm.loss_agg_mode" => aggregation(x),
        "algorithm.dual_clip" => dual_clip(x),
        "algorithm.delta" => delta(x),
        "algorithm.cispo_max_ratio" => cispo_cap(x),
        "algorithm.sapo_temperature_pos" | "algorithm.sapo_temperature_neg" => sapo_tau(x, key),
        "algorithm.top_entropy_quantile" => top_entropy(x),
        "algorithm.passk_advantage_k" => passk_k(x),
        "algorithm.positive_weight" | "algorithm.negative_weight" => sign_weights(x),
        "task.reward_aggregation" => reward_aggregation(x),
        "algorithm.mask_truncated_completions" => mask_truncated(x),
        "algorithm.cov_penalty" => cov_penalty(x),
        "algorithm.clip_cov_ratio"
        | "algorithm.clip_cov_lb"
        | "algorithm.clip_cov_ub"
        | "algorithm.kl_cov_ratio"
        | "algorithm.kl_cov_coef" => cov_knob(x, key),
        "algorithm.adaptive_entropy" => adaptive_entropy(x),
        "algorithm.entropy_target"
        | "algorithm.entropy_coef_delta"
        | "algorithm.entropy_coef_min"
        | "algorithm.entropy_coef_max" => adaptive_knob(x, key),
        "algorithm.steps_per_generation" => steps_per_generation(x),
        "algorithm.replay_buffer" => replay_buffer(x),
        _ => return None,
    })
}

fn trl_aggregation(agg: LossAggMode) -> &'static str {
    match agg {
        LossAggMode::SeqMeanTokenMean => "grpo",
        LossAggMode::TokenMean => "dapo",
        LossAggMode::SeqMeanTokenSumNorm => "dr_grpo",
        LossAggMode::Luspo => "luspo",
    }
}

/// The framework's name for the loss at its level, or why it has none.
fn loss_name(fw: Framework, c: &RunConfig) -> Result<&'static str, String> {
    use Framework::*;
    let a = &c.algorithm;
    let (loss, level) = (a.loss, a.importance_sampling_level);
    let ratio_free = matches!(
        loss,
        LossMode::Naive | LossMode::Unclipped | LossMode::Clipped
    );
    // The covariance rules are verl loss modes of their own (on its clipped / unclipped loss).
    match (fw, a.cov_penalty) {
        (_, CovPenalty::None) => {}
        (Verl, CovPenalty::ClipCov) => return Ok("clip_cov"),
        (Verl, CovPenalty::KlCov) => return Ok("kl_cov"),
        (fw, cov) => {
            return Err(format!(
                "{} has no covariance rule ({cov} is verl's policy_loss.loss_mode)",
                fw.name()
            ));
        }
    }
    match fw {
        Trl => match (loss, level) {
            (LossMode::Gmpo, _) => Err(
                "TRL has GMPO only in trl.experimental, not in GRPOTrainer's loss_type".into(),
            ),
            (_, Level::SequenceToken) => Err(
                "GSPO-token is trl.experimental.gspo_token's trainer, not an importance_sampling_level of GRPOTrainer".into(),
            ),
            (LossMode::Cispo, _) => Ok("cispo"),
            (LossMode::Sapo, _) => Ok("sapo"),
            _ => Ok(trl_aggregation(a.loss_agg_mode)),
        },
        Verl => match (loss, level) {
            (_, Level::Token) if ratio_free => Ok("vanilla"),
            (LossMode::Clipped, _) => Ok("gspo"),
            (LossMode::Cispo, Level::Token) => Ok("cispo"),
            (LossMode::Sapo, Level::Token) => Ok("sapo"),
            (LossMode::Gmpo, _) => Ok("geo_mean"),
            (m, l) => Err(format!(
                "verl has no {m} loss at the {l} level (its sequence-level loss is gspo, the clipped one)"
            )),
        },
        OpenRlhf => match (loss, level) {
            (_, Level::Token) if ratio_free => Ok("ppo"),
            (LossMode::Clipped, Level::Sequence) => Ok("gspo"),
            (m, l) => Err(format!(
                "OpenRLHF's actor.policy_loss_type is ppo or gspo: no {m} at the {l} level"
            )),
        },
    }
}

fn loss(x: &Ctx) -> Mapped {
    use Framework::*;
    let (c, fw) = (x.c, x.fw);
    let a = &c.algorithm;
    let name = match loss_name(fw, c) {
        Ok(name) => name,
        Err(why) => return refused(why),
    };
    let key = match fw {
        Trl => "loss_type".to_string(),
        Verl => format!("{A}.policy_loss.loss_mode"),
        OpenRlhf => "actor.policy_loss_type".to_string(),
    };
    let theirs = vec![kv(&key, Val::str(name))];
    if name == "kl_cov" && a.loss == LossMode::Unclipped {
        return exact(
            theirs,
            "KL-Cov: verl's kl_cov is the unclipped −A·r with a |log r| penalty on the tokens of highest covariance",
        );
    }
    match a.loss {
        LossMode::Naive | LossMode::Unclipped if x.s.mu > 1 => refused(format!(
            "`{}` with μ = {} > 1: the frameworks' losses always have a ratio with a clip or a gate (set algorithm.loss = clipped, or μ = 1)",
            a.loss, x.s.mu
        )),
        LossMode::Naive | LossMode::Unclipped => approx(
            theirs,
            format!(
                "{}: the frameworks always clip; with μ = 1 the ratio is 1 at the only step, so the clipped objective has the same gradient",
                a.loss
            ),
        ),
        LossMode::Clipped if a.importance_sampling_level == Level::Token => exact(
            theirs,
            match fw {
                Trl => {
                    "PPO's clipped objective (TRL names it by its aggregation; see algorithm.loss_agg_mode)"
                }
                Verl | OpenRlhf => "PPO's clipped objective",
            },
        ),
        LossMode::Clipped => exact(theirs, "GSPO: the sequence ratio, clipped per sequence"),
        LossMode::Cispo if fw == Verl => approx(
            theirs,
            "verl's CISPO clips the detached ratio to [1 − clip_ratio_low, 1 + clip_ratio_high]; grpo-lab caps it above only (clip_ratio_high = cap − 1 is written)",
        ),
        LossMode::Cispo => exact(
            theirs,
            "CISPO: −sg(min(r, cap))·A·log π; TRL reads epsilon_high as the cap (written there)",
        ),
        LossMode::Sapo => exact(
            theirs,
            "SAPO's soft gate (4/τ)·σ(τ(r − 1)) instead of the clip",
        ),
        LossMode::Gmpo => exact(
            theirs,
            "GMPO: the geometric mean of the token ratios, clipped in log space to [−clip_ratio_low, clip_ratio_high]",
        ),
    }
}

fn level(x: &Ctx) -> Mapped {
    use Framework::*;
    let a = &x.c.algorithm;
    let lv = a.importance_sampling_level;
    if let (Err(why), false) = (loss_name(x.fw, x.c), lv == Level::Token) {
        return refused(why);
    }
    match (x.fw, lv) {
        (_, Level::Token) if x.fw != Trl => exact(vec![], "a ratio per token (the default)"),
        (Trl, Level::SequenceToken) => refused(
            "GSPO-token is trl.experimental.gspo_token's trainer, not an importance_sampling_level of GRPOTrainer",
        ),
        (Trl, _) => exact(
            vec![kv("importance_sampling_level", Val::str(lv.name()))],
            "",
        ),
        (OpenRlhf, _) if a.advantage == AdvantageMode::Gae => approx(
            vec![],
            "written in the loss name (gspo): OpenRLHF's gspo puts the sequence ratio exp(mean log r) on every token; with per-token advantages (GAE) that is not GSPO's one-advantage-per-response objective",
        ),
        (OpenRlhf, _) => exact(
            vec![],
            "written in the loss name (gspo): OpenRLHF's gspo puts the sequence ratio exp(mean log r) on every token, GSPO's objective",
        ),
        _ if a.advantage == AdvantageMode::Gae => approx(
            vec![],
            "written in the loss name (gspo), which computes GSPO-token: with per-token advantages (GAE) its gradient differs from GSPO's",
        ),
        _ => exact(
            vec![],
            "written in the loss name (gspo); its GSPO-token form has GSPO's gradient where each response has one advantage",
        ),
    }
}

fn epsilon_low(x: &Ctx) -> Mapped {
    use Framework::*;
    let a = &x.c.algorithm;
    let e = f(a.epsilon_low);
    let theirs = match x.fw {
        Trl => vec![kv("epsilon", e)],
        Verl => vec![
            kv(&format!("{A}.clip_ratio"), e.clone()),
            kv(&format!("{A}.clip_ratio_low"), e),
        ],
        OpenRlhf => vec![kv("actor.eps_clip", e)],
    };
    match a.loss {
        LossMode::Cispo if x.fw == Verl => approx(
            theirs,
            "verl's CISPO clips the detached ratio below at 1 − clip_ratio_low; grpo-lab's CISPO has no lower clip (see algorithm.loss)",
        ),
        LossMode::Cispo | LossMode::Sapo => inert(theirs, format!("{} has no lower clip", a.loss)),
        LossMode::Gmpo => exact(theirs, "GMPO's bound in log space: log r ≥ −ε_low"),
        _ => exact(theirs, ""),
    }
}

fn epsilon_high(x: &Ctx) -> Mapped {
    use Framework::*;
    let a = &x.c.algorithm;
    let high = format!("{A}.clip_ratio_high");
    if a.loss == LossMode::Cispo {
        let cap = a.cispo_max_ratio;
        return match x.fw {
            Trl => exact(
                vec![kv("epsilon_high", f(cap))],
                "CISPO: TRL reads epsilon_high as the cap itself = algorithm.cispo_max_ratio",
            ),
            Verl => exact(
                vec![kv(&high, f(cap - 1.0))],
                "CISPO: verl's cap is 1 + clip_ratio_high = algorithm.cispo_max_ratio",
            ),
            OpenRlhf => inert(vec![], "CISPO reads algorithm.cispo_max_ratio"),
        };
    }
    let theirs = match x.fw {
        Trl => vec![kv("epsilon_high", f(a.epsilon_high))],
        Verl => vec![kv(&high, f(a.epsilon_high))],
        OpenRlhf => vec![kv(
            "actor.eps_clip_low_high",
            Val::List(vec![f(a.epsilon_low), f(a.epsilon_high)]),
        )],
    };
    match a.loss {
        LossMode::Sapo => inert(theirs, "SAPO has no clip"),
        LossMode::Gmpo => exact(theirs, "GMPO's bound in log space: log r ≤ ε_high"),
        _ => exact(theirs, ""),
    }
}

/// The aggregation each named loss applies whatever its aggregation key says.
fn forced_aggregation(fw: Framework, name: &str) -> Option<LossAggMode> {
    match (fw, name) {
        (Framework::Trl, "cispo") => Some(LossAggMode::TokenMean),
        (Framework::Trl, "sapo") => Some(LossAggMode::SeqMeanTokenMean),
        (Framework::Verl, "gspo" | "sapo" | "geo_mean") => Some(LossAggMode::SeqMeanTokenMean),
        // OpenRLHF's PolicyLoss sets token_level_loss = False for gspo.
        (Framework::OpenRlhf, "gspo") => Some(LossAggMode::SeqMeanTokenMean),
        _ => None,
    }
}

fn aggregation(x: &Ctx) -> Mapped {
    use Framework::*;
    let (c, s, fw) = (x.c, &x.s, x.fw);
    let agg = c.algorithm.loss_agg_mode;
    let fixed = c.model.kind == crate::config::ModelKind::Lecture;
    let same = if fixed {
        " (equal for the lecture model's fixed-length answers)"
    } else {
        ""
    };
    let Ok(name) = loss_name(fw, c) else {
        return inert(vec![], "the loss has no twin here (see algorithm.loss)");
    };
    if fw == OpenRlhf && forced_aggregation(fw, name) == Some(agg) {
        return exact(vec![], format!("{name} aggregates as {agg} (no key)"));
    }
    if let Some(theirs) = forced_aggregation(fw, name).filter(|&m| m != agg) {
        // LUSPO's × L is no length effect the lecture model's fixed length hides.
        return if fixed && agg != LossAggMode::Luspo {
            exact(vec![], format!("{name} aggregates as {theirs}{same}"))
        } else {
            approx(
                vec![],
                format!("{name} aggregates as {theirs} whatever the key says; grpo-lab as {agg}"),
            )
        };
    }
    match fw {
        Trl => {
            let note = format!(
                "written as loss_type = \"{name}\" (TRL's default loss_type became \"dapo\"){same}"
            );
            if agg == LossAggMode::SeqMeanTokenSumNorm {
                approx(
                    vec![],
                    format!(
                        "{note}; TRL's dr_grpo divides by max_completion_length ({}), grpo-lab by task.max_len ({})",
                        s.max_completion,
                        c.max_len()
                    ),
                )
            } else {
                exact(vec![], note)
            }
        }
        Verl => {
            // LUSPO's weight 1/R per token is verl's seq-mean-token-sum.
            let theirs_name = match agg {
                LossAggMode::Luspo => "seq-mean-token-sum",
                m => m.name(),
            };
            let theirs = vec![
                kv(&format!("{A}.loss_agg_mode"), Val::str(theirs_name)),
                kv(&format!("{A}.loss_scale_factor"), i(s.max_completion)),
            ];
            exact(
                theirs,
                format!("loss_scale_factor (Dr. GRPO's constant) = max_response_length{same}"),
            )
        }
        OpenRlhf => match agg {
            LossAggMode::TokenMean => exact(
                vec![],
                "OpenRLHF's PPO loss is token-level (token-mean); no key",
            ),
            m if fixed && m != LossAggMode::Luspo => exact(
                vec![],
                format!(
                    "{m}: OpenRLHF's loss is token-mean, equal for the lecture model's fixed-length answers"
                ),
            ),
            m => approx(
                vec![],
                format!("{m}: no key; OpenRLHF's PPO loss is token-mean"),
            ),
        },
    }
}

fn dual_clip(x: &Ctx) -> Mapped {
    use Framework::*;
    let a = &x.c.algorithm;
    let c = a.dual_clip;
    let vanilla = matches!(loss_name(x.fw, x.c), Ok("vanilla" | "ppo"));
    match x.fw {
        Trl if c > 0.0 => refused(
            "TRL has no dual clip (its delta caps the unclipped branch on both signs: algorithm.delta)",
        ),
        Trl => exact(vec![], "no dual clip"),
        Verl if c > 0.0 && vanilla => exact(vec![kv(&format!("{A}.clip_ratio_c"), f(c))], ""),
        Verl if c > 0.0 => refused(
            "verl applies its dual clip (clip_ratio_c) in the vanilla loss only; this loss has none",
        ),
        Verl if vanilla => approx(
            vec![kv(&format!("{A}.clip_ratio_c"), f(3.0))],
            "verl's dual clip is always on in its vanilla loss: for A < 0 the loss is bounded by 3·|A|; grpo-lab's is off (algorithm.dual_clip = 0)",
        ),
        Verl => inert(
            vec![],
            "verl applies its dual clip in the vanilla loss only",
        ),
        OpenRlhf if c > 0.0 => exact(vec![kv("actor.dual_clip", f(c))], ""),
        OpenRlhf => exact(
            vec![kv("actor.dual_clip", Val::None)],
            "no dual clip, as grpo-lab",
        ),
    }
}

fn delta(x: &Ctx) -> Mapped {
    let d = x.c.algorithm.delta;
    match x.fw {
        Framework::Trl if d > 0.0 => exact(vec![kv("delta", f(d))], ""),
        Framework::Trl => exact(vec![kv("delta", Val::None)], "no two-sided clip"),
        fw if d > 0.0 => refused(format!(
            "{} has no δ (the two-sided clip of TRL and INTELLECT-2)",
            fw.name()
        )),
        _ => exact(vec![], "no two-sided clip"),
    }
}

fn cispo_cap(x: &Ctx) -> Mapped {
    if x.c.algorithm.loss != LossMode::Cispo {
        return inert(vec![], "read by algorithm.loss = cispo only");
    }
    match x.fw {
        Framework::Trl => exact(vec![], "written as epsilon_high (TRL's CISPO cap)"),
        Framework::Verl => exact(vec![], "written as clip_ratio_high = cap − 1"),
        Framework::OpenRlhf => inert(vec![], "no CISPO (see algorithm.loss)"),
    }
}

fn top_entropy(x: &Ctx) -> Mapped {
    let q = x.c.algorithm.top_entropy_quantile;
    match x.fw {
        Framework::Trl => exact(vec![kv("top_entropy_quantile", f(q))], ""),
        fw if q < 1.0 => refused(format!(
            "{} has no top-entropy token rule (TRL's top_entropy_quantile)",
            fw.name()
        )),
        _ => exact(vec![], "every token trains"),
    }
}

fn sapo_tau(x: &Ctx, key: &str) -> Mapped {
    let a = &x.c.algorithm;
    let pos = key.ends_with("_pos");
    let tau = f(if pos {
        a.sapo_temperature_pos
    } else {
        a.sapo_temperature_neg
    });
    let theirs = match x.fw {
        Framework::Trl => vec![kv(
            if pos {
                "sapo_temperature_pos"
            } else {
                "sapo_temperature_neg"
            },
            tau,
        )],
        Framework::Verl => vec![kv(
            &format!("{A}.{}", if pos { "tau_pos" } else { "tau_neg" }),
            tau,
        )],
        Framework::OpenRlhf => vec![],
    };
    if a.loss == LossMode::Sapo {
        exact(theirs, "")
    } else {
        inert(theirs, "read by algorithm.loss = sapo only")
    }
}

fn passk_k(x: &Ctx) -> Mapped {
    let a = &x.c.algorithm;
    if a.advantage == crate::config::AdvantageMode::PasskAnalytic {
        refused("the analytic Pass@k advantage has no framework key (the advantage row says why)")
    } else {
        inert(vec![], "read by advantage = passk_analytic only")
    }
}

fn sign_weights(x: &Ctx) -> Mapped {
    let a = &x.c.algorithm;
    if a.positive_weight == 1.0 && a.negative_weight == 1.0 {
        exact(vec![], "every advantage at its own weight (1 and 1)")
    } else {
        refused(format!(
            "{} has no weight by the advantage's sign (W-REINFORCE, arXiv 2506.01347)",
            x.fw.name()
        ))
    }
}

fn reward_aggregation(x: &Ctx) -> Mapped {
    use crate::config::{AdvantageMode, RewardAggregation};
    let c = x.c;
    let gdpo = c.task.reward_aggregation == RewardAggregation::NormalizeThenSum;
    match x.fw {
        Framework::Trl if gdpo => {
            let batch = matches!(
                c.algorithm.advantage,
                AdvantageMode::BatchNormalized
                    | AdvantageMode::ReinforcePp
                    | AdvantageMode::ReinforcePpBaseline
            );
            let theirs = vec![kv(
                "multi_objective_aggregation",
                Val::str("normalize_then_sum"),
            )];
            if batch {
                approx(
                    theirs,
                    "each reward normalized in its group (TRL ε 1e-4, grpo-lab 1e-5), summed, then a batch normalization",
                )
            } else {
                approx(
                    theirs,
                    format!(
                        "TRL ends with a batch normalization, grpo-lab with advantage = {} (TRL's form is advantage = batch_normalized)",
                        c.algorithm.advantage
                    ),
                )
            }
        }
        Framework::Trl => exact(
            vec![kv(
                "multi_objective_aggregation",
                Val::str("sum_then_normalize"),
            )],
            "",
        ),
        fw if gdpo => refused(format!(
            "{} sums its rewards before any normalization (GDPO is TRL's multi_objective_aggregation)",
            fw.name()
        )),
        _ => exact(vec![], "the weighted sum of the rewards"),
    }
}

/// The estimators beyond the group modes and GAE (`algorithm.advantage`).
pub(super) fn estimator(x: &Ctx) -> Mapped {
    use crate::config::AdvantageMode;
    use Framework::*;
    let eps = |theirs: &str| format!("std ε: grpo-lab 1e-5, {theirs}; std unbiased (n − 1) in all");
    match (x.fw, x.c.algorithm.advantage) {
        (Verl, AdvantageMode::Gpg) => exact(
            vec![kv("algorithm.adv_estimator", Val::str("gpg"))],
            "verl's α counts the batch's non-zero rewards, grpo-lab's the responses in groups with a signal: equal for 0/1 rewards where no group is all-correct",
        ),
        (Verl, AdvantageMode::ReinforcePp) => exact(
            vec![
                kv("algorithm.adv_estimator", Val::str("reinforce_plus_plus")),
                kv("algorithm.gamma", Val::Float(x.c.algorithm.gamma)),
            ],
            "returns γ^(L−1−t)·r whitened over the batch's tokens (masked_whiten)",
        ),
        (Verl, AdvantageMode::ReinforcePpBaseline) => exact(
            vec![kv(
                "algorithm.adv_estimator",
                Val::str("reinforce_plus_plus_baseline"),
            )],
            "group mean removed, then whitened over the batch's tokens",
        ),
        (Verl, AdvantageMode::Remax) => exact(
            vec![kv("algorithm.adv_estimator", Val::str("remax"))],
            "the greedy answer's reward as the baseline",
        ),
        (Verl, AdvantageMode::Opo) => exact(
            vec![kv("algorithm.adv_estimator", Val::str("opo"))],
            "verl gives a group of one the baseline 0, grpo-lab its own reward (advantage 0)",
        ),
        (Verl, AdvantageMode::Passk) => approx(
            vec![
                kv("algorithm.adv_estimator", Val::str("grpo_passk")),
                kv("algorithm.norm_adv_by_std_in_grpo", Val::Bool(true)),
            ],
            eps("verl 1e-6"),
        ),
        (OpenRlhf, AdvantageMode::ReinforcePp) => approx(
            vec![kv("algo.advantage.estimator", Val::str("reinforce"))],
            "REINFORCE++: returns whitened over the batch (OpenRLHF's whitening ε differs)",
        ),
        (OpenRlhf, AdvantageMode::ReinforcePpBaseline) => approx(
            vec![
                kv("algo.advantage.estimator", Val::str("reinforce_baseline")),
                kv("algo.advantage.no_std_norm", Val::Bool(false)),
            ],
            "group mean removed, then whitened over the batch (OpenRLHF's whitening ε differs)",
        ),
        (_, AdvantageMode::PasskAnalytic) => refused(
            "passk_analytic: the analytic Pass@k advantage (arXiv 2508.10751) is in the paper's own verl fork, not in a release",
        ),
        (Trl, m) if !AdvantageMode::GROUP.contains(&m) => refused(format!(
            "`{m}`: TRL's GRPOTrainer has only the group advantage (scale_rewards group / batch / none)"
        )),
        (_, m) => refused(format!("`{m}` has no counterpart in {}", x.fw.name())),
    }
}

fn mask_truncated(x: &Ctx) -> Mapped {
    let on = x.c.algorithm.mask_truncated_completions;
    match x.fw {
        Framework::Trl => exact(vec![kv("mask_truncated_completions", Val::Bool(on))], ""),
        fw if on => refused(format!(
            "{} has no switch that drops cut answers from the loss (DAPO's overlong filtering is TRL's mask_truncated_completions)",
            fw.name()
        )),
        _ => exact(vec![], "cut answers train as any other"),
    }
}

fn cov_penalty(x: &Ctx) -> Mapped {
    match x.c.algorithm.cov_penalty {
        CovPenalty::None => exact(vec![], "no covariance rule"),
        // The loss row writes the loss mode (or refuses it by name).
        cov => inert(
            vec![],
            format!("{cov}: written by the algorithm.loss row (verl's loss_mode)"),
        ),
    }
}

/// Clip-Cov's and KL-Cov's numbers: verl's `policy_loss.*` keys where the rule is on.
fn cov_knob(x: &Ctx, key: &str) -> Mapped {
    let a = &x.c.algorithm;
    let (value, theirs, rule) = match key {
        "algorithm.clip_cov_ratio" => (a.clip_cov_ratio, "clip_cov_ratio", CovPenalty::ClipCov),
        "algorithm.clip_cov_lb" => (a.clip_cov_lb, "clip_cov_lb", CovPenalty::ClipCov),
        "algorithm.clip_cov_ub" => (a.clip_cov_ub, "clip_cov_ub", CovPenalty::ClipCov),
        "algorithm.kl_cov_ratio" => (a.kl_cov_ratio, "kl_cov_ratio", CovPenalty::KlCov),
        _ => (a.kl_cov_coef, "ppo_kl_coef", CovPenalty::KlCov),
    };
    if a.cov_penalty != rule {
        return inert(vec![], format!("read by cov_penalty = {rule} only"));
    }
    match x.fw {
        Framework::Verl => approx(
            vec![kv(&format!("{A}.policy_loss.{theirs}"), f(value))],
            "verl counts max(⌊ρN⌋, 1) tokens per micro-batch, grpo-lab ⌈ρN⌉ over the whole batch",
        ),
        fw => refused(format!("{} has no covariance rule", fw.name())),
    }
}

fn adaptive_entropy(x: &Ctx) -> Mapped {
    let on = x.c.algorithm.adaptive_entropy;
    match x.fw {
        Framework::Trl => exact(
            vec![kv("use_adaptive_entropy", Val::Bool(on))],
            if on {
                "entropy_coef is the starting coefficient"
            } else {
                ""
            },
        ),
        fw if on => refused(format!(
            "{} has no adaptive entropy coefficient (Skywork-OR1's controller is TRL's use_adaptive_entropy)",
            fw.name()
        )),
        _ => exact(vec![], "a fixed entropy coefficient"),
    }
}

/// The adaptive controller's numbers: TRL's keys of the same names.
fn adaptive_knob(x: &Ctx, key: &str) -> Mapped {
    let a = &x.c.algorithm;
    let (name, value) = match key {
        "algorithm.entropy_target" => ("entropy_target", a.entropy_target),
        "algorithm.entropy_coef_delta" => ("entropy_coef_delta", a.entropy_coef_delta),
        "algorithm.entropy_coef_min" => ("entropy_coef_min", a.entropy_coef_min),
        _ => ("entropy_coef_max", a.entropy_coef_max),
    };
    match x.fw {
        Framework::Trl => exact(vec![kv(name, f(value))], ""),
        _ if !a.adaptive_entropy => inert(vec![], "read by adaptive_entropy only"),
        fw => inert(
            vec![],
            format!(
                "{} has no adaptive coefficient (the adaptive_entropy row)",
                fw.name()
            ),
        ),
    }
}

fn steps_per_generation(x: &Ctx) -> Mapped {
    let (b, s) = (x.s.b, x.c.algorithm.steps_per_generation);
    if s <= 1 {
        return exact(vec![], "one optimizer step on the whole batch");
    }
    let split = format!(
        "{s} mini-batches of whole groups, in order: written by the algorithm.prompts_per_iteration row"
    );
    if b % s != 0 {
        return approx(
            vec![],
            format!(
                "{split}; B = {b} does not divide by {s}: grpo-lab's mini-batches differ by a group, the frameworks need equal ones"
            ),
        );
    }
    match x.fw {
        Framework::Trl => approx(
            vec![],
            format!(
                "{split} (TRL shuffles the completions before splitting, so its mini-batches mix groups)"
            ),
        ),
        Framework::OpenRlhf => approx(
            vec![],
            format!(
                "{split} (OpenRLHF shuffles its replay buffer's samples on one GPU, so its mini-batches mix groups)"
            ),
        ),
        Framework::Verl => exact(vec![], split),
    }
}

fn replay_buffer(x: &Ctx) -> Mapped {
    let n = x.c.algorithm.replay_buffer;
    if n == 0 {
        return exact(vec![], "no replay buffer");
    }
    refused(match x.fw {
        Framework::Trl => format!(
            "TRL's replay buffer is an experimental trainer of its own (trl.experimental.grpo_with_replay_buffer: GRPOWithReplayBufferConfig(replay_buffer_size={n}) with GRPOWithReplayBufferTrainer); the export writes GRPOConfig / GRPOTrainer: swap the two classes by hand"
        ),
        fw => format!("{} has no replay buffer of groups", fw.name()),
    })
}
