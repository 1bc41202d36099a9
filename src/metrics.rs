//! `StepRecord`: what one optimizer step logs. Plain data, the one thing the trainer,
//! the JSON Lines / CSV sinks, the charts and the app all share. Metric names are
//! those TRL / verl users know (`reward/mean`, `frac_reward_zero_std`, `clip_ratio/low`).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

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
    pub reward_mean: f32,
    #[serde(rename = "reward/std")]
    pub reward_std: f32,
    #[serde(rename = "reward/min")]
    pub reward_min: f32,
    #[serde(rename = "reward/max")]
    pub reward_max: f32,
    /// Fraction of groups whose rewards are all equal (no learning signal).
    pub frac_reward_zero_std: f32,
    /// Fraction of responses that are exactly sorted.
    #[serde(rename = "reward/exact_match")]
    pub exact_match: f32,
    /// Mean |advantage| under the mode driving the update.
    #[serde(rename = "advantage/mean_abs")]
    pub advantage_mean_abs: f32,

    #[serde(rename = "completions/mean_length")]
    pub mean_length: f32,
    #[serde(rename = "completions/min_length")]
    pub min_length: f32,
    #[serde(rename = "completions/max_length")]
    pub max_length: f32,

    pub loss: f32,
    /// Mean per-token KL estimate (the configured estimator) to the reference policy.
    pub kl: f32,
    /// Mean entropy of the policy per response position (nats).
    pub entropy: f32,
    #[serde(rename = "clip_ratio/low")]
    pub clip_ratio_low: f32,
    #[serde(rename = "clip_ratio/high")]
    pub clip_ratio_high: f32,
    /// Mean importance ratio `π_θ / π_old` over tokens (1 on the first step of an iteration).
    #[serde(rename = "ratio/mean")]
    pub ratio_mean: f32,
    /// Global L2 norm of the gradient before clipping.
    pub grad_norm: f32,
    pub lr: f32,

    /// Greedy exact-match accuracy on this iteration's training prompts, at its start.
    #[serde(rename = "accuracy/train")]
    pub accuracy_train: f32,
    /// Same on the held-out prompts (none when the task has no held-out split).
    #[serde(rename = "accuracy/heldout")]
    pub accuracy_heldout: Option<f32>,

    pub step_time_secs: f32,
    /// Response tokens this step trained on, per second of its wall time.
    pub tokens_per_second: f32,

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
    pub rewards: Vec<f32>,
    /// Advantages of the same rewards under every mode (`raw`, `centered`, ...).
    pub advantages: BTreeMap<String, Vec<f32>>,
    pub zero_std: bool,
    /// Per response, per token: `log π_old` (frozen at the rollout).
    #[serde(default)]
    pub old_logp: Vec<Vec<f32>>,
    /// Per response, per token: `log π_θ` at the iteration's last optimizer step (after μ − 1 updates).
    #[serde(default)]
    pub logp: Vec<Vec<f32>>,
}

/// Scalar columns of the CSV sink, in order, with a getter each.
pub const CSV_COLUMNS: &[(&str, fn(&StepRecord) -> Option<f32>)] = &[
    ("iteration", |r| Some(r.iteration as f32)),
    ("step", |r| Some(r.step as f32)),
    ("reward/mean", |r| Some(r.reward_mean)),
    ("reward/std", |r| Some(r.reward_std)),
    ("reward/min", |r| Some(r.reward_min)),
    ("reward/max", |r| Some(r.reward_max)),
    ("frac_reward_zero_std", |r| Some(r.frac_reward_zero_std)),
    ("reward/exact_match", |r| Some(r.exact_match)),
    ("advantage/mean_abs", |r| Some(r.advantage_mean_abs)),
    ("completions/mean_length", |r| Some(r.mean_length)),
    ("completions/min_length", |r| Some(r.min_length)),
    ("completions/max_length", |r| Some(r.max_length)),
    ("loss", |r| Some(r.loss)),
    ("kl", |r| Some(r.kl)),
    ("entropy", |r| Some(r.entropy)),
    ("clip_ratio/low", |r| Some(r.clip_ratio_low)),
    ("clip_ratio/high", |r| Some(r.clip_ratio_high)),
    ("ratio/mean", |r| Some(r.ratio_mean)),
    ("grad_norm", |r| Some(r.grad_norm)),
    ("lr", |r| Some(r.lr)),
    ("accuracy/train", |r| Some(r.accuracy_train)),
    ("accuracy/heldout", |r| r.accuracy_heldout),
    ("step_time_secs", |r| Some(r.step_time_secs)),
    ("tokens_per_second", |r| Some(r.tokens_per_second)),
];

impl StepRecord {
    pub fn csv_header() -> String {
        CSV_COLUMNS
            .iter()
            .map(|(n, _)| *n)
            .collect::<Vec<_>>()
            .join(",")
    }

    pub fn csv_row(&self) -> String {
        CSV_COLUMNS
            .iter()
            .map(|(_, get)| get(self).map(|v| v.to_string()).unwrap_or_default())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// A scalar by its metric name (for charts and comparison tables).
    pub fn scalar(&self, name: &str) -> Option<f32> {
        CSV_COLUMNS
            .iter()
            .find(|(n, _)| *n == name)
            .and_then(|(_, get)| get(self))
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
    pub final_reward_mean: f32,
    /// Greedy exact-match accuracy on the training prompts after the last step.
    pub final_accuracy: f32,
    pub final_heldout_accuracy: Option<f32>,
    pub final_entropy: f32,
    pub final_kl: f32,
    pub max_reward: f32,
    pub wall_time_secs: f64,
    pub ms_per_step: f64,
    /// Why the run ended: `completed`, `interrupted` or `diverged at step N`.
    pub status: String,
}
