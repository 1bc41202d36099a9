//! `StepRecord`: what one optimizer step logs. Plain data, the one thing the trainer,
//! the JSON Lines / CSV sinks, the charts and the app all share. Metric names are
//! those TRL / verl users know (`reward/mean`, `frac_reward_zero_std`, `clip_ratio/low`).

use serde::{Deserialize, Deserializer, Serialize};
use std::collections::BTreeMap;

// JSON has no NaN or infinity: serde_json writes them as `null`. Reading back, `null` is NaN,
// so a run whose KL overflowed (k3 is unbounded) still loads.
fn nan(x: Option<f32>) -> f32 {
    x.unwrap_or(f32::NAN)
}
fn f32_or_nan<'de, D: Deserializer<'de>>(d: D) -> Result<f32, D::Error> {
    Option::<f32>::deserialize(d).map(nan)
}
fn nan_default() -> f32 {
    f32::NAN
}
fn vec_f32_or_nan<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<f32>, D::Error> {
    Vec::<Option<f32>>::deserialize(d).map(|v| v.into_iter().map(nan).collect())
}
fn vec_vec_f32_or_nan<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Vec<f32>>, D::Error> {
    Vec::<Vec<Option<f32>>>::deserialize(d).map(|v| {
        v.into_iter()
            .map(|r| r.into_iter().map(nan).collect())
            .collect()
    })
}
fn map_vec_f32_or_nan<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<BTreeMap<String, Vec<f32>>, D::Error> {
    BTreeMap::<String, Vec<Option<f32>>>::deserialize(d).map(|m| {
        m.into_iter()
            .map(|(k, v)| (k, v.into_iter().map(nan).collect()))
            .collect()
    })
}

/// One optimizer step. Rollout-level fields (rewards, lengths, accuracy) belong to the
/// iteration the step is in and repeat on each of its `μ` steps; `groups` is present on
/// the last step of each iteration only (with the per-token log-probs of that step).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    /// GRPO iteration, from 0.
    pub iteration: usize,
    /// Optimizer step, from 1, counted over the whole run.
    pub step: usize,
    /// Step within the iteration, from 0 to `μ − 1`.
    pub step_in_iteration: usize,

    #[serde(rename = "reward/mean")]
    #[serde(deserialize_with = "f32_or_nan")]
    pub reward_mean: f32,
    #[serde(rename = "reward/std")]
    #[serde(deserialize_with = "f32_or_nan")]
    pub reward_std: f32,
    /// The mean over the iteration's groups of each group's reward std (unbiased, n − 1, as
    /// torch's `std`): what TRL logs as `reward_std` (`reward/std` is over the whole batch).
    /// None with G = 1, and in logs written before it.
    #[serde(
        rename = "reward/group_std",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub reward_std_group: Option<f32>,
    #[serde(rename = "reward/min")]
    #[serde(deserialize_with = "f32_or_nan")]
    pub reward_min: f32,
    #[serde(rename = "reward/max")]
    #[serde(deserialize_with = "f32_or_nan")]
    pub reward_max: f32,
    /// Fraction of groups whose rewards are all equal (no learning signal).
    #[serde(deserialize_with = "f32_or_nan")]
    pub frac_reward_zero_std: f32,
    /// Fraction of responses that are exactly sorted.
    #[serde(rename = "reward/exact_match")]
    #[serde(deserialize_with = "f32_or_nan")]
    pub exact_match: f32,
    /// Mean |advantage| under the mode driving the update.
    #[serde(rename = "advantage/mean_abs")]
    #[serde(deserialize_with = "f32_or_nan")]
    pub advantage_mean_abs: f32,

    #[serde(rename = "completions/mean_length")]
    #[serde(deserialize_with = "f32_or_nan")]
    pub mean_length: f32,
    #[serde(rename = "completions/min_length")]
    #[serde(deserialize_with = "f32_or_nan")]
    pub min_length: f32,
    #[serde(rename = "completions/max_length")]
    #[serde(deserialize_with = "f32_or_nan")]
    pub max_length: f32,

    /// Mean length of exactly-correct responses (NaN when none).
    #[serde(rename = "completions/mean_length_correct")]
    #[serde(default = "nan_default", deserialize_with = "f32_or_nan")]
    pub mean_length_correct: f32,
    /// Mean length of wrong responses (NaN when none).
    #[serde(rename = "completions/mean_length_wrong")]
    #[serde(default = "nan_default", deserialize_with = "f32_or_nan")]
    pub mean_length_wrong: f32,
    /// Fraction of responses truncated at `max_len` without `<eos>`.
    #[serde(rename = "completions/clipped_ratio")]
    #[serde(default = "nan_default", deserialize_with = "f32_or_nan")]
    pub clipped_ratio: f32,
    /// Dynamic sampling: groups replaced because their rewards were all equal.
    #[serde(rename = "sampling/resampled_groups")]
    #[serde(default)]
    pub resampled_groups: usize,
    /// Dynamic sampling: rounds of resampling this iteration (bounded by max_resample_rounds).
    #[serde(rename = "sampling/resample_rounds")]
    #[serde(default)]
    pub resample_rounds: usize,
    /// Fraction of zero-std groups in the first draw, before any resampling.
    #[serde(rename = "sampling/zero_std_first_draw")]
    #[serde(default = "nan_default", deserialize_with = "f32_or_nan")]
    pub zero_std_first_draw: f32,

    #[serde(deserialize_with = "f32_or_nan")]
    pub loss: f32,
    /// Mean per-token KL estimate (the configured estimator) to the reference policy.
    #[serde(deserialize_with = "f32_or_nan")]
    pub kl: f32,
    /// Mean entropy of the policy per response position (nats).
    #[serde(deserialize_with = "f32_or_nan")]
    pub entropy: f32,
    #[serde(rename = "clip_ratio/low")]
    #[serde(deserialize_with = "f32_or_nan")]
    pub clip_ratio_low: f32,
    #[serde(rename = "clip_ratio/high")]
    #[serde(deserialize_with = "f32_or_nan")]
    pub clip_ratio_high: f32,
    /// TRL's name for CISPO's clip count (`algorithm.loss = cispo` only): the fraction of
    /// tokens with A > 0 whose ratio passed the cap, as `clip_ratio/high` counts it there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cispo_clip_ratio: Option<f32>,
    /// The entropy bonus's coefficient after this step (TRL's `entropy_coef`: logged whenever
    /// there is a bonus; with `algorithm.adaptive_entropy`, after the step's update).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entropy_coef: Option<f32>,
    /// The replay buffer (`algorithm.replay_buffer` > 0): groups of this rollout replaced by
    /// stored ones, and the groups stored after it.
    #[serde(
        rename = "replay/replaced_groups",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub replay_replaced: Option<f32>,
    #[serde(
        rename = "replay/size",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub replay_size: Option<f32>,
    /// The sampler–learner gap of this iteration's rollout, where the sampler's own log π is
    /// recorded (`objective::correction::GapStats`; TRL's names): the IS weight π_old/π_sampler
    /// as applied (raw without a correction), |log π_old − log π_sampler|, the weights'
    /// effective sample size and the fraction of real tokens they zero.
    #[serde(
        rename = "sampling/importance_sampling_ratio/min",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub is_ratio_min: Option<f32>,
    #[serde(
        rename = "sampling/importance_sampling_ratio/mean",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub is_ratio_mean: Option<f32>,
    #[serde(
        rename = "sampling/importance_sampling_ratio/max",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub is_ratio_max: Option<f32>,
    #[serde(
        rename = "sampling/sampling_logp_difference/mean",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub logp_diff_mean: Option<f32>,
    #[serde(
        rename = "sampling/sampling_logp_difference/max",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub logp_diff_max: Option<f32>,
    #[serde(
        rename = "sampling/is_effective_sample_size",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub is_ess: Option<f32>,
    #[serde(
        rename = "sampling/is_masked_fraction",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub is_masked: Option<f32>,
    /// The entropy mechanism (`run.entropy_dynamics`; `objective::entropy_dynamics`):
    /// Cov(log π, A) over the step's real tokens before its update, the law's prediction
    /// −lr·Cov, the step's first-order change ∇θH·Δθ and the measured change of the mean
    /// entropy over the step's states (where the engine measures them).
    #[serde(
        rename = "entropy/covariance",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub entropy_covariance: Option<f32>,
    #[serde(
        rename = "entropy/predicted_delta",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub entropy_predicted_delta: Option<f32>,
    #[serde(
        rename = "entropy/first_order_delta",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub entropy_first_order_delta: Option<f32>,
    #[serde(
        rename = "entropy/measured_delta",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub entropy_measured_delta: Option<f32>,
    /// Mean importance ratio `π_θ / π_old` over tokens (1 on the first step of an iteration).
    #[serde(rename = "ratio/mean")]
    #[serde(deserialize_with = "f32_or_nan")]
    pub ratio_mean: f32,
    /// Global L2 norm of the gradient before clipping.
    #[serde(deserialize_with = "f32_or_nan")]
    pub grad_norm: f32,
    #[serde(deserialize_with = "f32_or_nan")]
    pub lr: f32,

    /// Greedy exact-match accuracy on this iteration's training prompts, at its start.
    #[serde(rename = "accuracy/train")]
    #[serde(deserialize_with = "f32_or_nan")]
    pub accuracy_train: f32,
    /// Same on the held-out prompts (none when the task has no held-out split).
    #[serde(rename = "accuracy/heldout")]
    pub accuracy_heldout: Option<f32>,

    #[serde(deserialize_with = "f32_or_nan")]
    pub step_time_secs: f32,
    /// Response tokens this step trained on, per second of its wall time.
    #[serde(deserialize_with = "f32_or_nan")]
    pub tokens_per_second: f32,

    /// Responses sampled so far in the run, this iteration's included (dynamic sampling's
    /// redraws count).
    #[serde(rename = "sampling/rollouts")]
    #[serde(default)]
    pub rollouts: usize,
    /// Standard deviation of the driving advantage over the batch's responses.
    #[serde(rename = "advantage/std")]
    #[serde(default = "nan_default", deserialize_with = "f32_or_nan")]
    pub advantage_std: f32,
    /// Smallest `π_θ / π_old` over the batch's real tokens at this step, before its update.
    #[serde(rename = "ratio/min")]
    #[serde(default = "nan_default", deserialize_with = "f32_or_nan")]
    pub ratio_min: f32,
    /// Largest `π_θ / π_old` over the batch's real tokens at this step, before its update.
    #[serde(rename = "ratio/max")]
    #[serde(default = "nan_default", deserialize_with = "f32_or_nan")]
    pub ratio_max: f32,
    /// `KL(π_old ‖ π_θ)` at this step: the mean of `log π_old − log π_θ` over the sampled real
    /// tokens (verl's `actor/ppo_kl`); 0 on the first step of an iteration.
    #[serde(rename = "ppo_kl")]
    #[serde(default = "nan_default", deserialize_with = "f32_or_nan")]
    pub ppo_kl: f32,
    /// Held-out pass@1 from `run.pass_samples` sampled answers per prompt (unbiased
    /// estimator), on the iterations where it is evaluated (`run.eval_every`).
    #[serde(rename = "eval/pass@1")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pass_at_1: Option<f32>,
    /// Held-out pass@4, as pass@1 (when `run.pass_samples` ≥ 4).
    #[serde(rename = "eval/pass@4")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pass_at_4: Option<f32>,
    /// Held-out pass@k at k = `run.pass_k`.
    #[serde(rename = "eval/pass@k")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pass_at_k: Option<f32>,
    /// Mean |driving advantage| of the responses in groups (with a signal) where at most a
    /// quarter of the answers are exactly right ("hard" prompts).
    #[serde(rename = "advantage/abs_hard")]
    #[serde(default = "nan_default", deserialize_with = "f32_or_nan")]
    pub advantage_abs_hard: f32,
    /// Same, groups with between a quarter and three quarters right.
    #[serde(rename = "advantage/abs_mid")]
    #[serde(default = "nan_default", deserialize_with = "f32_or_nan")]
    pub advantage_abs_mid: f32,
    /// Same, groups with at least three quarters right ("easy" prompts).
    #[serde(rename = "advantage/abs_easy")]
    #[serde(default = "nan_default", deserialize_with = "f32_or_nan")]
    pub advantage_abs_easy: f32,
    /// 90th percentile of the wrong answers' lengths (tokens).
    #[serde(rename = "completions/wrong_length_p90")]
    #[serde(default = "nan_default", deserialize_with = "f32_or_nan")]
    pub wrong_length_p90: f32,
    /// Fraction of the wrong answers that are longer than a correct answer.
    #[serde(rename = "completions/wrong_longer_frac")]
    #[serde(default = "nan_default", deserialize_with = "f32_or_nan")]
    pub wrong_longer_frac: f32,
    /// PPO's critic (`advantage = "gae"`): mean squared error to the returns before its update.
    #[serde(rename = "critic/vf_loss")]
    #[serde(default = "nan_default", deserialize_with = "f32_or_nan")]
    pub value_loss: f32,
    /// `1 − Var(returns − values) / Var(returns)` (1 = a perfect critic, ≤ 0 = useless).
    #[serde(rename = "critic/vf_explained_var")]
    #[serde(default = "nan_default", deserialize_with = "f32_or_nan")]
    pub value_explained_var: f32,
    /// GDPO's reward collapse (a mixture of rewards only): of the pairs of responses in a
    /// group whose reward vectors differ, the fraction the advantage does not tell apart.
    #[serde(rename = "reward/collapsed_pairs")]
    #[serde(default = "nan_default", deserialize_with = "f32_or_nan")]
    pub reward_collapsed_pairs: f32,

    /// The iteration's groups, in full (first `run.log_groups` of them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub groups: Option<Vec<GroupRecord>>,
}

/// One prompt's group of `G` responses: what the app's group inspector shows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupRecord {
    /// Index of the prompt in the training set.
    pub prompt_index: usize,
    pub prompt: Vec<u32>,
    pub responses: Vec<Vec<u32>>,
    #[serde(deserialize_with = "vec_f32_or_nan")]
    pub rewards: Vec<f32>,
    /// Advantages of the same rewards under every mode (`raw`, `centered`, ...).
    #[serde(deserialize_with = "map_vec_f32_or_nan")]
    pub advantages: BTreeMap<String, Vec<f32>>,
    pub zero_std: bool,
    /// The advantage each response was trained with (the driving mode's, after any sign
    /// weighting or multi-reward normalisation; a per-response stand-in where GAE's are per token).
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "vec_f32_or_nan"
    )]
    pub driving: Vec<f32>,
    /// Per response, per token: `log π_old` (frozen at the rollout).
    #[serde(default, deserialize_with = "vec_vec_f32_or_nan")]
    pub old_logp: Vec<Vec<f32>>,
    /// Per response, per token: `log π_θ` at the iteration's last optimizer step (after μ − 1 updates).
    #[serde(default, deserialize_with = "vec_vec_f32_or_nan")]
    pub logp: Vec<Vec<f32>>,
    /// Per response, per token: `log π_ref` (the token view's KL term).
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "vec_vec_f32_or_nan"
    )]
    pub ref_logp: Vec<Vec<f32>>,
    /// Per response, per token: the policy's entropy `H_t` at that position, at the sampling
    /// temperature, as the last step read it (empty where the engine does not return it).
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "vec_vec_f32_or_nan"
    )]
    pub entropy: Vec<Vec<f32>>,
    /// Per response, per token, with `run.entropy_dynamics`: the token's term of the batch's
    /// Cov(log π, A) at that step, `(A − mean A)(log π − mean log π)` (positive: it lowers the
    /// entropy).
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "vec_vec_f32_or_nan"
    )]
    pub cov_terms: Vec<Vec<f32>>,
}

/// A scalar of a record, if it was logged.
pub type Getter = fn(&StepRecord) -> Option<f32>;

/// The getter of a metric name (look it up once to read many records).
pub fn getter(name: &str) -> Option<Getter> {
    CSV_COLUMNS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, get)| *get)
}

/// The run's scalars by metric name, in the CSV's order, with a getter each: the list the
/// charts, the app, `compare` and `export-log` iterate. `iteration` and `step` lead it (those
/// readers skip them by name); `step_in_iteration` is a position within the iteration, not a
/// metric, so it is only in the CSV ([`csv_columns`]).
pub const CSV_COLUMNS: &[(&str, Getter)] = &[
    ("iteration", |r| Some(r.iteration as f32)),
    ("step", |r| Some(r.step as f32)),
    ("reward/mean", |r| Some(r.reward_mean)),
    ("reward/std", |r| Some(r.reward_std)),
    ("reward/group_std", |r| r.reward_std_group),
    ("reward/min", |r| Some(r.reward_min)),
    ("reward/max", |r| Some(r.reward_max)),
    ("frac_reward_zero_std", |r| Some(r.frac_reward_zero_std)),
    ("reward/exact_match", |r| Some(r.exact_match)),
    ("advantage/mean_abs", |r| Some(r.advantage_mean_abs)),
    ("completions/mean_length", |r| Some(r.mean_length)),
    ("completions/min_length", |r| Some(r.min_length)),
    ("completions/max_length", |r| Some(r.max_length)),
    ("completions/mean_length_correct", |r| {
        Some(r.mean_length_correct)
    }),
    ("completions/mean_length_wrong", |r| {
        Some(r.mean_length_wrong)
    }),
    ("completions/clipped_ratio", |r| Some(r.clipped_ratio)),
    ("sampling/resampled_groups", |r| {
        Some(r.resampled_groups as f32)
    }),
    ("sampling/resample_rounds", |r| {
        Some(r.resample_rounds as f32)
    }),
    ("sampling/zero_std_first_draw", |r| {
        Some(r.zero_std_first_draw)
    }),
    ("loss", |r| Some(r.loss)),
    ("kl", |r| Some(r.kl)),
    ("entropy", |r| Some(r.entropy)),
    ("clip_ratio/low", |r| Some(r.clip_ratio_low)),
    ("clip_ratio/high", |r| Some(r.clip_ratio_high)),
    ("cispo_clip_ratio", |r| r.cispo_clip_ratio),
    ("entropy_coef", |r| r.entropy_coef),
    ("replay/replaced_groups", |r| r.replay_replaced),
    ("replay/size", |r| r.replay_size),
    ("sampling/importance_sampling_ratio/min", |r| r.is_ratio_min),
    ("sampling/importance_sampling_ratio/mean", |r| {
        r.is_ratio_mean
    }),
    ("sampling/importance_sampling_ratio/max", |r| r.is_ratio_max),
    ("sampling/sampling_logp_difference/mean", |r| {
        r.logp_diff_mean
    }),
    ("sampling/sampling_logp_difference/max", |r| r.logp_diff_max),
    ("sampling/is_effective_sample_size", |r| r.is_ess),
    ("sampling/is_masked_fraction", |r| r.is_masked),
    ("entropy/covariance", |r| r.entropy_covariance),
    ("entropy/predicted_delta", |r| r.entropy_predicted_delta),
    ("entropy/first_order_delta", |r| r.entropy_first_order_delta),
    ("entropy/measured_delta", |r| r.entropy_measured_delta),
    ("ratio/mean", |r| Some(r.ratio_mean)),
    ("grad_norm", |r| Some(r.grad_norm)),
    ("lr", |r| Some(r.lr)),
    ("accuracy/train", |r| Some(r.accuracy_train)),
    ("accuracy/heldout", |r| r.accuracy_heldout),
    ("step_time_secs", |r| Some(r.step_time_secs)),
    ("tokens_per_second", |r| Some(r.tokens_per_second)),
    ("sampling/rollouts", |r| Some(r.rollouts as f32)),
    ("advantage/std", |r| Some(r.advantage_std)),
    ("ratio/min", |r| Some(r.ratio_min)),
    ("ratio/max", |r| Some(r.ratio_max)),
    ("ppo_kl", |r| Some(r.ppo_kl)),
    ("eval/pass@1", |r| r.pass_at_1),
    ("eval/pass@4", |r| r.pass_at_4),
    ("eval/pass@k", |r| r.pass_at_k),
    ("advantage/abs_hard", |r| Some(r.advantage_abs_hard)),
    ("advantage/abs_mid", |r| Some(r.advantage_abs_mid)),
    ("advantage/abs_easy", |r| Some(r.advantage_abs_easy)),
    ("completions/wrong_length_p90", |r| Some(r.wrong_length_p90)),
    ("completions/wrong_longer_frac", |r| {
        Some(r.wrong_longer_frac)
    }),
    ("critic/vf_loss", |r| Some(r.value_loss)),
    ("critic/vf_explained_var", |r| Some(r.value_explained_var)),
    ("reward/collapsed_pairs", |r| Some(r.reward_collapsed_pairs)),
];

/// Metrics that are fractions or probabilities, in [0, 1] by construction: a chart clamps a
/// mean ± std band of them to that interval (a band below 0 would draw accuracies no run can
/// have).
const UNIT_INTERVAL: &[&str] = &[
    "frac_reward_zero_std",
    "reward/exact_match",
    "reward/collapsed_pairs",
    "completions/clipped_ratio",
    "completions/wrong_longer_frac",
    "sampling/zero_std_first_draw",
    "sampling/is_effective_sample_size",
    "sampling/is_masked_fraction",
    "clip_ratio/low",
    "clip_ratio/high",
    "cispo_clip_ratio",
    "accuracy/train",
    "accuracy/heldout",
    "eval/pass@1",
    "eval/pass@4",
    "eval/pass@k",
];

/// Whether the metric `name` is a fraction, bounded to [0, 1] (see `UNIT_INTERVAL`).
pub fn in_unit_interval(name: &str) -> bool {
    UNIT_INTERVAL.contains(&name)
}

/// `step_in_iteration`, the CSV's third column (after `iteration` and `step`, as in the JSONL).
static STEP_IN_ITERATION: (&str, Getter) =
    ("step_in_iteration", |r| Some(r.step_in_iteration as f32));

/// The columns of `metrics.csv`: [`CSV_COLUMNS`] with `step_in_iteration` after `step`, so
/// the CSV carries every scalar of the JSONL (a reader can tell the μ steps of an iteration
/// apart) without it becoming a metric the charts or `compare` would offer.
pub fn csv_columns() -> impl Iterator<Item = &'static (&'static str, Getter)> {
    let (index, metrics) = CSV_COLUMNS.split_at(2);
    index
        .iter()
        .chain(std::iter::once(&STEP_IN_ITERATION))
        .chain(metrics)
}

/// One CSV cell. The JSONL writes a non-finite value as `null` (JSON has no NaN) and leaves
/// an unlogged one out, so "not measured" and "not finite" are one thing there; the CSV says
/// it the same way, always with an empty cell (which pandas and spreadsheets read as missing),
/// never `NaN` in some columns and empty in others. A finite value is written in full
/// (shortest form that reads back as the same `f32`, as in the JSONL).
fn csv_cell(v: Option<f32>) -> String {
    v.filter(|v| v.is_finite())
        .map(|v| v.to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_columns_put_step_in_iteration_after_step_and_nowhere_else() {
        let names: Vec<&str> = csv_columns().map(|(n, _)| *n).collect();
        assert_eq!(names[..3], ["iteration", "step", "step_in_iteration"]);
        assert_eq!(names.len(), CSV_COLUMNS.len() + 1);
        // Not a metric: the charts, the app and `compare` look metrics up by name.
        assert!(getter("step_in_iteration").is_none());
    }

    #[test]
    fn the_unit_interval_metrics_are_metrics() {
        for name in UNIT_INTERVAL {
            assert!(getter(name).is_some(), "{name}");
        }
    }

    #[test]
    fn csv_cells_are_empty_exactly_where_the_jsonl_has_null() {
        for v in [
            None,
            Some(f32::NAN),
            Some(f32::INFINITY),
            Some(f32::NEG_INFINITY),
        ] {
            assert_eq!(csv_cell(v), "", "{v:?}");
            assert_eq!(serde_json::to_string(&v).unwrap(), "null", "{v:?}");
        }
        for v in [0.0f32, -1.5, 3.0, 1e-7, 0.6666667, 6297670.0] {
            assert_eq!(csv_cell(Some(v)).parse::<f32>().unwrap(), v);
        }
    }

    #[test]
    fn non_finite_values_survive_a_round_trip_as_nan() {
        let line = r#"{"iteration":0,"step":1,"step_in_iteration":0,"reward/mean":1.0,"reward/std":0.0,"reward/min":1.0,"reward/max":1.0,"frac_reward_zero_std":1.0,"reward/exact_match":0.0,"advantage/mean_abs":0.0,"completions/mean_length":3.0,"completions/min_length":3.0,"completions/max_length":3.0,"loss":0.0,"kl":null,"entropy":0.1,"clip_ratio/low":0.0,"clip_ratio/high":0.0,"ratio/mean":1.0,"grad_norm":0.0,"lr":0.001,"accuracy/train":0.0,"accuracy/heldout":null,"step_time_secs":0.1,"tokens_per_second":1.0}"#;
        let r: super::StepRecord = serde_json::from_str(line).unwrap();
        assert!(r.kl.is_nan());
        assert_eq!(r.accuracy_heldout, None);
    }
}

impl StepRecord {
    /// The header of `metrics.csv`: the names of [`csv_columns`], in order.
    pub fn csv_header() -> String {
        csv_columns().map(|(n, _)| *n).collect::<Vec<_>>().join(",")
    }

    /// One line of `metrics.csv`, cell for cell what `metrics.jsonl` holds: a value the JSONL
    /// writes as `null` or leaves out is an empty cell (see [`csv_cell`]).
    pub fn csv_row(&self) -> String {
        csv_columns()
            .map(|(_, get)| csv_cell(get(self)))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// A scalar by its metric name (for charts and comparison tables).
    pub fn scalar(&self, name: &str) -> Option<f32> {
        getter(name).and_then(|get| get(self))
    }
}

/// What `summary.json` holds at the end of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunSummary {
    pub name: String,
    pub seed: u64,
    pub device: String,
    pub iterations: usize,
    pub steps: usize,
    /// Mean reward of the last iteration's rollouts.
    #[serde(deserialize_with = "f32_or_nan")]
    pub final_reward_mean: f32,
    /// Greedy exact-match accuracy on the training prompts after the last step.
    #[serde(deserialize_with = "f32_or_nan")]
    pub final_accuracy: f32,
    pub final_heldout_accuracy: Option<f32>,
    /// Held-out greedy accuracy right after the supervised cold start (None without one).
    #[serde(default)]
    pub sft_heldout_accuracy: Option<f32>,
    #[serde(deserialize_with = "f32_or_nan")]
    pub final_entropy: f32,
    #[serde(deserialize_with = "f32_or_nan")]
    pub final_kl: f32,
    #[serde(deserialize_with = "f32_or_nan")]
    pub max_reward: f32,
    pub wall_time_secs: f64,
    pub ms_per_step: f64,
    /// Why the run ended: `completed`, `interrupted` or `diverged at step N`.
    pub status: String,
    /// Trainable parameters of the policy, and of PPO's critic (0 without one).
    #[serde(default)]
    pub policy_parameters: usize,
    #[serde(default)]
    pub critic_parameters: usize,
}
