//! The record of a step (GRPO-SPEC §2, last step): the rollout's statistics, the logged
//! groups with every advantage mode, and the optimizer step's scalars, as one `StepRecord`.

use crate::config::AdvantageMode;
use crate::engine::StepScalars;
use crate::metrics::{GroupRecord, StepRecord};
use crate::objective::advantage::GroupStats;

/// What the rollout of an iteration measured (shared by its μ step records).
#[derive(Debug, Clone, Copy, Default)]
pub struct RolloutStats {
    pub reward_mean: f32,
    pub reward_std: f32,
    pub reward_min: f32,
    pub reward_max: f32,
    pub frac_zero_std: f32,
    pub exact_match: f32,
    pub advantage_mean_abs: f32,
    pub mean_length: f32,
    pub min_length: f32,
    pub max_length: f32,
    pub mean_length_correct: f32,
    pub mean_length_wrong: f32,
    pub clipped_ratio: f32,
    pub resampled_groups: usize,
    pub resample_rounds: usize,
    pub zero_std_first_draw: f32,
    pub accuracy_train: f32,
    pub accuracy_heldout: Option<f32>,
    pub tokens: usize,
}

/// Dynamic sampling's counts for the record.
#[derive(Debug, Clone, Copy, Default)]
pub struct Resampling {
    pub groups: usize,
    pub rounds: usize,
    pub zero_std_first_draw: f32,
}

/// The rollout's outcome, as the record builder reads it.
pub struct RolloutView<'a> {
    /// Raw scores (before any KL penalty), `[B·G]`.
    pub rewards: &'a [f32],
    pub exact: &'a [u32],
    pub closed: &'a [bool],
    pub lengths: &'a [usize],
    /// The advantage mode that drives the update, `[B·G]`.
    pub driving: &'a [f32],
    pub zero_std: &'a [bool],
}

fn mean_or_nan(v: impl Iterator<Item = f32>) -> f32 {
    let (sum, count) = v.fold((0.0f32, 0usize), |(s, c), x| (s + x, c + 1));
    if count == 0 {
        f32::NAN
    } else {
        sum / count as f32
    }
}

pub fn rollout_stats(
    r: &RolloutView,
    resampling: Resampling,
    accuracy_train: f32,
    accuracy_heldout: Option<f32>,
) -> RolloutStats {
    let batch = GroupStats::of(r.rewards);
    let lengths = r.lengths;
    let length_where = |sel: &dyn Fn(usize) -> bool| {
        mean_or_nan(
            (0..lengths.len())
                .filter(|&i| sel(i))
                .map(|i| lengths[i] as f32),
        )
    };
    RolloutStats {
        reward_mean: batch.mean,
        reward_std: batch.std,
        reward_min: batch.min,
        reward_max: batch.max,
        frac_zero_std: r.zero_std.iter().filter(|z| **z).count() as f32 / r.zero_std.len() as f32,
        exact_match: r.exact.iter().sum::<u32>() as f32 / r.exact.len() as f32,
        advantage_mean_abs: r.driving.iter().map(|x| x.abs()).sum::<f32>() / r.driving.len() as f32,
        mean_length: length_where(&|_| true),
        min_length: lengths.iter().copied().min().unwrap_or(0) as f32,
        max_length: lengths.iter().copied().max().unwrap_or(0) as f32,
        mean_length_correct: length_where(&|i| r.exact[i] == 1),
        mean_length_wrong: length_where(&|i| r.exact[i] == 0),
        clipped_ratio: r.closed.iter().filter(|c| !**c).count() as f32 / r.closed.len() as f32,
        resampled_groups: resampling.groups,
        resample_rounds: resampling.rounds,
        zero_std_first_draw: resampling.zero_std_first_draw,
        accuracy_train,
        accuracy_heldout,
        tokens: lengths.iter().sum(),
    }
}

/// The first `count` groups of the batch as the record logs them: prompt, responses (as shown:
/// `<eos>` as the tokenizer's id), rewards, every advantage mode, the zero-std flag.
#[allow(clippy::too_many_arguments)]
pub fn logged_groups(
    count: usize,
    g: usize,
    indices: &[usize],
    prompts: &[&[u32]],
    shown_rows: &[Vec<u32>],
    rewards: &[f32],
    by_mode: &[Vec<f32>],
    zero_std: &[bool],
) -> Vec<GroupRecord> {
    (0..count)
        .map(|bi| GroupRecord {
            prompt_index: indices[bi],
            prompt: prompts[bi].to_vec(),
            responses: shown_rows[bi * g..(bi + 1) * g].to_vec(),
            rewards: rewards[bi * g..(bi + 1) * g].to_vec(),
            advantages: AdvantageMode::ALL
                .iter()
                .zip(by_mode)
                .map(|(m, v)| (m.name().to_string(), v[bi * g..(bi + 1) * g].to_vec()))
                .collect(),
            zero_std: zero_std[bi],
            old_logp: Vec::new(),
            logp: Vec::new(),
        })
        .collect()
}

/// Where a step sits in the run.
#[derive(Debug, Clone, Copy)]
pub struct StepPosition {
    pub iteration: usize,
    pub step: usize,
    pub step_in_iteration: usize,
    pub lr: f64,
    pub step_time_secs: f64,
}

pub fn step_record(
    at: StepPosition,
    stats: &RolloutStats,
    sc: &StepScalars,
    groups: Option<Vec<GroupRecord>>,
) -> StepRecord {
    StepRecord {
        iteration: at.iteration,
        step: at.step,
        step_in_iteration: at.step_in_iteration,
        reward_mean: stats.reward_mean,
        reward_std: stats.reward_std,
        reward_min: stats.reward_min,
        reward_max: stats.reward_max,
        frac_reward_zero_std: stats.frac_zero_std,
        exact_match: stats.exact_match,
        advantage_mean_abs: stats.advantage_mean_abs,
        mean_length: stats.mean_length,
        min_length: stats.min_length,
        max_length: stats.max_length,
        mean_length_correct: stats.mean_length_correct,
        mean_length_wrong: stats.mean_length_wrong,
        clipped_ratio: stats.clipped_ratio,
        resampled_groups: stats.resampled_groups,
        resample_rounds: stats.resample_rounds,
        zero_std_first_draw: stats.zero_std_first_draw,
        loss: sc.loss,
        kl: sc.kl,
        entropy: sc.entropy,
        clip_ratio_low: sc.clip_low,
        clip_ratio_high: sc.clip_high,
        ratio_mean: sc.ratio_mean,
        grad_norm: sc.grad_norm,
        lr: at.lr as f32,
        accuracy_train: stats.accuracy_train,
        accuracy_heldout: stats.accuracy_heldout,
        step_time_secs: at.step_time_secs as f32,
        tokens_per_second: (stats.tokens as f64 / at.step_time_secs.max(1e-9)) as f32,
        groups,
    }
}
