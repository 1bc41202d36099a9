//! The record of a step (GRPO-SPEC §2, last step): the rollout's statistics, the logged
//! groups with every advantage mode, and the optimizer step's scalars, as one `StepRecord`.

use crate::config::AdvantageMode;
use crate::engine::StepScalars;
use crate::engine::cores::Cores;
use crate::metrics::{GroupRecord, StepRecord};
use crate::objective::advantage::GroupStats;

/// What the rollout of an iteration measured (shared by its μ step records).
#[derive(Debug, Clone, Copy, Default)]
pub struct RolloutStats {
    pub reward_mean: f32,
    pub reward_std: f32,
    /// The mean of each group's unbiased reward std (TRL's `reward_std`); None with G = 1.
    pub reward_std_group: Option<f32>,
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
    /// Standard deviation of the driving advantage over the batch.
    pub advantage_std: f32,
    /// Responses sampled so far in the run, this iteration's included.
    pub rollouts: usize,
    /// Held-out pass@1 / pass@4 / pass@k, when evaluated this iteration.
    pub pass: Option<PassAtK>,
    /// Mean |driving advantage| of the responses in groups (with a signal) where at most a
    /// quarter / between / at least three quarters of the responses are exactly right.
    pub advantage_abs_by_success: [f32; 3],
    /// 90th percentile of the wrong answers' lengths.
    pub wrong_length_p90: f32,
    /// Fraction of the wrong answers longer than a correct one.
    pub wrong_longer_frac: f32,
    /// PPO's critic: squared error to the returns before its update, explained variance.
    pub value_loss: f32,
    pub value_explained_var: f32,
    /// GDPO's reward collapse: of the pairs of a group whose reward vectors differ, the
    /// fraction with one advantage (NaN for a single reward).
    pub reward_collapsed_pairs: f32,
    /// The replay buffer's (groups replaced, groups stored) this iteration.
    pub replay: Option<(usize, usize)>,
    /// The sampler–learner gap, where the sampler's log π is recorded.
    pub gap: Option<crate::objective::correction::GapStats>,
}

/// Held-out pass@k from `N` sampled answers per prompt (unbiased estimator, mean over prompts).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct PassAtK {
    pub at_1: f32,
    /// `None` when fewer than 4 answers were sampled per prompt.
    pub at_4: Option<f32>,
    pub at_k: f32,
}

/// The unbiased estimator of pass@k from `n` samples of which `c` are correct (Chen et al.
/// 2021): `1 − C(n−c, k) / C(n, k)`, computed as a product to stay finite.
pub fn pass_at_k(n: usize, c: usize, k: usize) -> f64 {
    if k == 0 || k > n {
        return f64::NAN;
    }
    if n - c < k {
        return 1.0;
    }
    // C(n−c, k) / C(n, k) = Π_{i = n−c+1}^{n} (1 − k / i)
    1.0 - ((n - c + 1)..=n)
        .map(|i| 1.0 - k as f64 / i as f64)
        .product::<f64>()
}

/// How far the policy has moved from `π_old` at a step, before its update: the range of the
/// importance ratio and `KL(π_old ‖ π_θ)` over the real tokens of the batch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RatioStats {
    pub min: f32,
    pub max: f32,
    pub ppo_kl: f32,
}

impl RatioStats {
    pub const UNKNOWN: Self = Self {
        min: f32::NAN,
        max: f32::NAN,
        ppo_kl: f32::NAN,
    };

    /// From `log π_θ` and `log π_old` of the same tokens and their mask (`[rows·T]` each; the
    /// shortest length of the three is used), on one thread: [`RatioStats::on`].
    pub fn of(logp: &[f32], old_logp: &[f32], mask: &[f32]) -> Self {
        Self::on(&Cores::default(), logp, old_logp, mask)
    }

    /// [`RatioStats::of`] with spans of [`RATIO_SPAN`] tokens on `cores`' threads, their sums
    /// combined in span order: the same bits on any number of threads (the spans are a
    /// function of the length alone).
    pub fn on(cores: &Cores, logp: &[f32], old_logp: &[f32], mask: &[f32]) -> Self {
        let len = logp.len().min(old_logp.len()).min(mask.len());
        let mut spans: Vec<(usize, RatioSums)> = (0..len.div_ceil(RATIO_SPAN).max(1))
            .map(|k| (k * RATIO_SPAN, RatioSums::EMPTY))
            .collect();
        cores.each(&mut spans, |_, (at, sums)| {
            let r = *at..(*at + RATIO_SPAN).min(len);
            *sums = RatioSums::of(&logp[r.clone()], &old_logp[r.clone()], &mask[r]);
        });
        spans
            .iter()
            .fold(RatioSums::EMPTY, |a, (_, b)| a.merge(b))
            .finish()
    }
}

/// The tokens one thread takes of [`RatioStats::on`] (a multiple of its 8 lanes).
pub const RATIO_SPAN: usize = 8192;

/// A span's share of [`RatioStats`]: the extremes of the log-ratio, Σ (log π_old − log π) and
/// the count of real tokens, in eight lanes (token `i` in lane `i mod 8`).
#[derive(Debug, Clone, Copy)]
struct RatioSums {
    lo: [f32; 8],
    hi: [f32; 8],
    kl: [f64; 8],
    count: [f64; 8],
    /// Real tokens whose log-ratio was a number.
    numbers: [u32; 8],
}

impl RatioSums {
    const EMPTY: Self = Self {
        lo: [f32::INFINITY; 8],
        hi: [f32::NEG_INFINITY; 8],
        kl: [0.0; 8],
        count: [0.0; 8],
        numbers: [0; 8],
    };

    /// The extremes are taken on the log-ratio and exponentiated once each by
    /// [`RatioSums::finish`] (`exp` is monotone: the same values as the extremes of the ratios,
    /// without an `exp` per token — that was ~1.3 M instructions a step on `scaled`). Compiled
    /// with AVX2 where the CPU has it (the same operations on wider vectors, the same values but
    /// for a NaN's sign; the baseline's SSE build was ~4 % of a `scaled` step's samples).
    fn of(logp: &[f32], old_logp: &[f32], mask: &[f32]) -> Self {
        #[cfg(target_arch = "x86_64")]
        if crate::engine::avx2_on() {
            // SAFETY: the CPU has AVX2 (checked just above).
            return unsafe { Self::of_avx2(logp, old_logp, mask) };
        }
        Self::of_body(logp, old_logp, mask)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    fn of_avx2(logp: &[f32], old_logp: &[f32], mask: &[f32]) -> Self {
        Self::of_body(logp, old_logp, mask)
    }

    #[inline(always)]
    fn of_body(logp: &[f32], old_logp: &[f32], mask: &[f32]) -> Self {
        // Eight independent lanes (the loop vectorizes; one chain of f64 additions over
        // `scaled`'s 32 k tokens was a serial ~50 µs of every step). Padding reads as NaN,
        // which `min`/`max` pass over; whether a real token's log-ratio was a number is
        // counted apart (`f32::min` passes over NaN, as it did over exp(NaN)).
        const L: usize = 8;
        let Self {
            mut lo,
            mut hi,
            mut kl,
            mut count,
            mut numbers,
        } = Self::EMPTY;
        let len = logp.len().min(old_logp.len()).min(mask.len());
        let mut lane = |l: usize, lp: f32, old: f32, m: f32| {
            let real = m != 0.0;
            let d = if real { lp - old } else { f32::NAN };
            lo[l] = lo[l].min(d);
            hi[l] = hi[l].max(d);
            numbers[l] += (real && !d.is_nan()) as u32;
            kl[l] += if real { (old - lp) as f64 } else { 0.0 };
            count[l] += real as u32 as f64;
        };
        let whole = len / L * L;
        for ((lp8, old8), m8) in logp[..whole]
            .chunks_exact(L)
            .zip(old_logp[..whole].chunks_exact(L))
            .zip(mask[..whole].chunks_exact(L))
        {
            for l in 0..L {
                lane(l, lp8[l], old8[l], m8[l]);
            }
        }
        for i in whole..len {
            lane(i - whole, logp[i], old_logp[i], mask[i]);
        }
        Self {
            lo,
            hi,
            kl,
            count,
            numbers,
        }
    }

    /// `self` then `next`, lane by lane.
    fn merge(mut self, next: &Self) -> Self {
        for l in 0..8 {
            self.lo[l] = self.lo[l].min(next.lo[l]);
            self.hi[l] = self.hi[l].max(next.hi[l]);
            self.kl[l] += next.kl[l];
            self.count[l] += next.count[l];
            self.numbers[l] += next.numbers[l];
        }
        self
    }

    fn finish(&self) -> RatioStats {
        let lo = self.lo.iter().fold(f32::INFINITY, |a, &b| a.min(b));
        let hi = self.hi.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        let seen = self.numbers.iter().any(|&k| k > 0);
        let kl: f64 = self.kl.iter().sum();
        let count: f64 = self.count.iter().sum();
        if count == 0.0 {
            return RatioStats::UNKNOWN;
        }
        let (min, max) = if seen {
            (lo.exp(), hi.exp())
        } else {
            (f32::INFINITY, f32::NEG_INFINITY)
        };
        RatioStats {
            min,
            max,
            ppo_kl: (kl / count) as f32,
        }
    }
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
    /// Length of a correct answer in tokens (`n`, plus `<eos>` for the transformer).
    pub correct_len: usize,
}

fn mean_or_nan(v: impl Iterator<Item = f32>) -> f32 {
    let (sum, count) = v.fold((0.0f32, 0usize), |(s, c), x| (s + x, c + 1));
    if count == 0 {
        f32::NAN
    } else {
        sum / count as f32
    }
}

/// The mean over `groups` equal groups of each one's unbiased std (n − 1, as torch's `std`,
/// so TRL's `reward_std`); None for groups of one.
fn group_std_mean(rewards: &[f32], groups: usize) -> Option<f32> {
    let g = rewards.len() / groups.max(1);
    if g < 2 {
        return None;
    }
    let stds = rewards.chunks(g).map(|group| {
        let mean = group.iter().map(|&x| x as f64).sum::<f64>() / g as f64;
        let ss: f64 = group.iter().map(|&x| (x as f64 - mean).powi(2)).sum();
        (ss / (g - 1) as f64).sqrt()
    });
    Some((stds.sum::<f64>() / groups as f64) as f32)
}

pub fn rollout_stats(
    r: &RolloutView,
    resampling: Resampling,
    accuracy_train: f32,
    accuracy_heldout: Option<f32>,
) -> RolloutStats {
    let batch = GroupStats::of(r.rewards);
    let driving_mean = r.driving.iter().sum::<f32>() / r.driving.len().max(1) as f32;
    let advantage_std = (r
        .driving
        .iter()
        .map(|a| (a - driving_mean).powi(2))
        .sum::<f32>()
        / r.driving.len().max(1) as f32)
        .sqrt();
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
        reward_std_group: group_std_mean(r.rewards, r.zero_std.len()),
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
        advantage_std,
        rollouts: 0,
        pass: None,
        advantage_abs_by_success: advantage_by_success(r),
        wrong_length_p90: {
            let mut wrong: Vec<usize> = (0..lengths.len())
                .filter(|&i| r.exact[i] == 0)
                .map(|i| lengths[i])
                .collect();
            wrong.sort_unstable();
            match wrong.len() {
                0 => f32::NAN,
                n => wrong[((n as f64 * 0.9).ceil() as usize).clamp(1, n) - 1] as f32,
            }
        },
        value_loss: f32::NAN,
        value_explained_var: f32::NAN,
        reward_collapsed_pairs: f32::NAN,
        replay: None,
        gap: None,
        wrong_longer_frac: mean_or_nan(
            (0..lengths.len())
                .filter(|&i| r.exact[i] == 0)
                .map(|i| (lengths[i] > r.correct_len) as u8 as f32),
        ),
    }
}

/// Mean |advantage| per group difficulty: groups with a signal whose success rate (exactly
/// right answers) is ≤ 1/4, in between, ≥ 3/4.
fn advantage_by_success(r: &RolloutView) -> [f32; 3] {
    let g = r.driving.len() / r.zero_std.len().max(1);
    let mut acc = [(0f32, 0usize); 3];
    for (gi, &flat) in r.zero_std.iter().enumerate() {
        if flat || g == 0 {
            continue;
        }
        let span = gi * g..(gi + 1) * g;
        let success = r.exact[span.clone()].iter().sum::<u32>() as f32 / g as f32;
        let bin = if success <= 0.25 {
            0
        } else if success < 0.75 {
            1
        } else {
            2
        };
        for a in &r.driving[span] {
            acc[bin].0 += a.abs();
            acc[bin].1 += 1;
        }
    }
    acc.map(|(s, c)| if c == 0 { f32::NAN } else { s / c as f32 })
}

/// The first `count` groups of the batch as the record logs them: prompt, responses (as shown:
/// `<eos>` as the tokenizer's id), rewards, every advantage mode, the driving advantage, the
/// zero-std flag.
#[allow(clippy::too_many_arguments)]
pub fn logged_groups(
    count: usize,
    g: usize,
    indices: &[usize],
    prompts: &[&[u32]],
    shown_rows: &[Vec<u32>],
    rewards: &[f32],
    by_mode: &[Vec<f32>],
    driving: &[f32],
    zero_std: &[bool],
) -> Vec<GroupRecord> {
    (0..count)
        .map(|bi| GroupRecord {
            prompt_index: indices[bi],
            prompt: prompts[bi].to_vec(),
            responses: shown_rows[bi * g..(bi + 1) * g].to_vec(),
            rewards: rewards[bi * g..(bi + 1) * g].to_vec(),
            advantages: AdvantageMode::GROUP
                .iter()
                .zip(by_mode)
                .map(|(m, v)| (m.name().to_string(), v[bi * g..(bi + 1) * g].to_vec()))
                .collect(),
            zero_std: zero_std[bi],
            driving: driving
                .get(bi * g..(bi + 1) * g)
                .map(<[f32]>::to_vec)
                .unwrap_or_default(),
            old_logp: Vec::new(),
            logp: Vec::new(),
            ref_logp: Vec::new(),
            entropy: Vec::new(),
            cov_terms: Vec::new(),
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

/// The entropy mechanism's Cov(log π, A) over the real tokens of a step's batch, from the log π
/// the step returned and each token's advantage (the per-token ones where there are, GAE; else
/// each response's own over its positions).
pub fn covariance(
    logp: &[f32],
    advantages: &[f32],
    token_advantages: Option<&[f32]>,
    batch: &crate::engine::Batch,
) -> Option<crate::objective::entropy_dynamics::Covariance> {
    let per_token: Vec<f32> = match token_advantages {
        Some(a) => a.to_vec(),
        None => advantages
            .iter()
            .flat_map(|&a| std::iter::repeat_n(a, batch.t))
            .collect(),
    };
    crate::objective::entropy_dynamics::Covariance::of(logp, &per_token, &batch.mask)
}

/// The entropy mechanism's numbers on a record (`run.entropy_dynamics`): the step's covariance,
/// the law's prediction −lr·Cov, and each logged token's term (from its response's driving
/// advantage).
pub fn with_covariance(
    record: &mut StepRecord,
    c: Option<crate::objective::entropy_dynamics::Covariance>,
    cfg: &crate::config::RunConfig,
) {
    let Some(c) = c else {
        return;
    };
    record.entropy_covariance = Some(c.cov as f32);
    record.entropy_predicted_delta =
        Some(crate::objective::entropy_dynamics::predicted_delta(cfg.optimizer.lr, &c) as f32);
    let mode = cfg.algorithm.advantage.name();
    for g in record.groups.iter_mut().flatten() {
        let adv = g.advantages.get(mode).cloned().unwrap_or_default();
        g.cov_terms = g
            .logp
            .iter()
            .zip(&adv)
            .map(|(lp, &a)| lp.iter().map(|&l| c.term(l, a)).collect())
            .collect();
    }
}

pub fn step_record(
    at: StepPosition,
    stats: &RolloutStats,
    sc: &StepScalars,
    ratio: RatioStats,
    groups: Option<Vec<GroupRecord>>,
) -> StepRecord {
    StepRecord {
        iteration: at.iteration,
        step: at.step,
        step_in_iteration: at.step_in_iteration,
        reward_mean: stats.reward_mean,
        reward_std: stats.reward_std,
        reward_std_group: stats.reward_std_group,
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
        cispo_clip_ratio: None,
        entropy_coef: None,
        replay_replaced: stats.replay.map(|(r, _)| r as f32),
        replay_size: stats.replay.map(|(_, s)| s as f32),
        is_ratio_min: stats.gap.map(|g| g.ratio_min),
        is_ratio_mean: stats.gap.map(|g| g.ratio_mean),
        is_ratio_max: stats.gap.map(|g| g.ratio_max),
        logp_diff_mean: stats.gap.map(|g| g.logp_diff_mean),
        logp_diff_max: stats.gap.map(|g| g.logp_diff_max),
        is_ess: stats.gap.map(|g| g.ess),
        is_masked: stats.gap.map(|g| g.masked_fraction),
        entropy_covariance: None,
        entropy_predicted_delta: None,
        entropy_first_order_delta: sc.entropy_first_order,
        entropy_measured_delta: sc.entropy_measured,
        ratio_mean: sc.ratio_mean,
        grad_norm: sc.grad_norm,
        lr: at.lr as f32,
        accuracy_train: stats.accuracy_train,
        accuracy_heldout: stats.accuracy_heldout,
        step_time_secs: at.step_time_secs as f32,
        tokens_per_second: (stats.tokens as f64 / at.step_time_secs.max(1e-9)) as f32,
        rollouts: stats.rollouts,
        advantage_std: stats.advantage_std,
        ratio_min: ratio.min,
        ratio_max: ratio.max,
        ppo_kl: ratio.ppo_kl,
        pass_at_1: stats.pass.map(|p| p.at_1),
        pass_at_4: stats.pass.and_then(|p| p.at_4),
        pass_at_k: stats.pass.map(|p| p.at_k),
        advantage_abs_hard: stats.advantage_abs_by_success[0],
        advantage_abs_mid: stats.advantage_abs_by_success[1],
        advantage_abs_easy: stats.advantage_abs_by_success[2],
        wrong_length_p90: stats.wrong_length_p90,
        wrong_longer_frac: stats.wrong_longer_frac,
        value_loss: stats.value_loss,
        value_explained_var: stats.value_explained_var,
        reward_collapsed_pairs: stats.reward_collapsed_pairs,
        groups,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// TRL's `reward_std` by hand: groups [1, 0, 1, 0] (mean ½, Σ(x − ½)² = 1, std √(1/3))
    /// and [1, 1, 1, 1] (std 0): the mean is √(1/3) / 2, not the batch's std.
    #[test]
    fn group_std_is_the_mean_of_the_groups_unbiased_stds() {
        let r = [1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0];
        let got = group_std_mean(&r, 2).unwrap();
        assert!(
            (got as f64 - (1.0f64 / 3.0).sqrt() / 2.0).abs() < 1e-7,
            "{got}"
        );
        assert_eq!(group_std_mean(&[3.0, 3.0], 1), Some(0.0));
        assert_eq!(group_std_mean(&[1.0, 2.0], 2), None);
    }

    #[test]
    fn pass_at_k_matches_the_closed_form() {
        // 1 − C(n−c, k)/C(n, k) by hand: n = 5, c = 2, k = 2: 1 − C(3,2)/C(5,2) = 1 − 3/10.
        assert!((pass_at_k(5, 2, 2) - 0.7).abs() < 1e-12);
        // pass@1 is the fraction correct.
        assert!((pass_at_k(16, 5, 1) - 5.0 / 16.0).abs() < 1e-12);
        assert_eq!(pass_at_k(16, 0, 4), 0.0);
        assert_eq!(pass_at_k(16, 13, 4), 1.0); // fewer than k wrong: some draw is right
        // n = 16, c = 1, k = 16: every sample drawn, the correct one among them.
        assert!((pass_at_k(16, 1, 16) - 1.0).abs() < 1e-12);
        // n = 16, c = 1, k = 4: 4/16.
        assert!((pass_at_k(16, 1, 4) - 0.25).abs() < 1e-12);
        assert!(pass_at_k(3, 1, 4).is_nan());
    }

    #[test]
    fn ratio_stats_skip_padding() {
        let logp = [0.0f32, -1.0, 5.0];
        let old = [0.0f32, -0.5, 0.0];
        let mask = [1.0f32, 1.0, 0.0];
        let r = RatioStats::of(&logp, &old, &mask);
        assert!((r.min - (-0.5f32).exp()).abs() < 1e-6);
        assert_eq!(r.max, 1.0);
        assert!((r.ppo_kl - 0.25).abs() < 1e-6);
        assert!(RatioStats::of(&logp, &old, &[0.0; 3]).min.is_nan());
    }

    /// By spans on threads: the same bits on 1, 2 and 3 threads, lengths across span
    /// boundaries, and the plain formula's values (min/max exactly, the mean within f64's
    /// reordering).
    #[test]
    fn ratio_stats_by_spans_on_any_threads() {
        let mut rng = crate::rng::SplitMix64::new(11);
        let cores: Vec<Cores> = [1, 2, 3].map(Cores::new).into();
        for len in [
            1,
            7,
            RATIO_SPAN - 1,
            RATIO_SPAN,
            RATIO_SPAN + 9,
            3 * RATIO_SPAN + 5,
        ] {
            let logp: Vec<f32> = (0..len).map(|_| (rng.normal() * 2.0) as f32).collect();
            let old: Vec<f32> = (0..len).map(|_| (rng.normal() * 2.0) as f32).collect();
            let mask: Vec<f32> = (0..len).map(|_| (rng.below(5) != 0) as u8 as f32).collect();
            let got: Vec<RatioStats> = cores
                .iter()
                .map(|c| RatioStats::on(c, &logp, &old, &mask))
                .collect();
            let bits = |r: &RatioStats| [r.min, r.max, r.ppo_kl].map(f32::to_bits);
            for g in &got[1..] {
                assert_eq!(bits(g), bits(&got[0]), "len {len}");
            }
            let real: Vec<usize> = (0..len).filter(|&i| mask[i] != 0.0).collect();
            if real.is_empty() {
                assert!(got[0].min.is_nan());
                continue;
            }
            let ratio = |i: usize| (logp[i] - old[i]).exp();
            let min = real.iter().map(|&i| ratio(i)).fold(f32::INFINITY, f32::min);
            let max = real
                .iter()
                .map(|&i| ratio(i))
                .fold(f32::NEG_INFINITY, f32::max);
            let kl =
                real.iter().map(|&i| (old[i] - logp[i]) as f64).sum::<f64>() / real.len() as f64;
            assert_eq!((got[0].min, got[0].max), (min, max), "len {len}");
            assert!(
                (got[0].ppo_kl as f64 - kl).abs() <= 1e-6 * (1.0 + kl.abs()),
                "len {len}"
            );
        }
    }

    /// The AVX2 build of a span's sums equals the baseline build's, field by field, bit for
    /// bit but for a NaN's sign (NaN, ±∞ and padding included; lengths off the lanes'
    /// multiple).
    #[test]
    fn ratio_sums_avx2_equal_the_baseline_build() {
        let mut rng = crate::rng::SplitMix64::new(5);
        for case in 0..200 {
            let n = 1 + case * 7 % 301;
            let pick = |rng: &mut crate::rng::SplitMix64| match rng.below(16) {
                0 => f32::NAN,
                1 => f32::NEG_INFINITY,
                2 => 0.0,
                _ => (rng.normal() * 3.0) as f32,
            };
            let logp: Vec<f32> = (0..n).map(|_| pick(&mut rng)).collect();
            let old: Vec<f32> = (0..n).map(|_| pick(&mut rng)).collect();
            let mask: Vec<f32> = (0..n).map(|_| (rng.below(4) != 0) as u8 as f32).collect();
            // Bit for bit, every NaN as one (x86 gives a NaN's sign by operand order, which
            // vectorizing may change; a NaN mean is written as NaN either way).
            let bits = |s: &RatioSums| {
                let one = |x: f64| if x.is_nan() { u64::MAX } else { x.to_bits() };
                let lanes = s.lo.iter().chain(&s.hi).map(|&x| one(x as f64));
                let wide = s.kl.iter().chain(&s.count).map(|&x| one(x));
                let counts = s.numbers.iter().map(|&k| k as u64);
                lanes.chain(wide).chain(counts).collect::<Vec<u64>>()
            };
            let base = RatioSums::of_body(&logp, &old, &mask);
            assert_eq!(
                bits(&RatioSums::of(&logp, &old, &mask)),
                bits(&base),
                "case {case}"
            );
        }
    }

    /// The extremes taken on the log-ratio equal the extremes of the ratios themselves, bit
    /// for bit (NaN, ±∞ and padding included).
    #[test]
    fn ratio_extremes_equal_the_ratios_extremes() {
        let mut rng = crate::rng::SplitMix64::new(3);
        for case in 0..300 {
            let n = 1 + case % 17;
            let pick = |rng: &mut crate::rng::SplitMix64| match rng.below(12) {
                0 => f32::NAN,
                1 => f32::NEG_INFINITY,
                2 if case % 3 == 0 => f32::INFINITY,
                _ => (rng.normal() * 3.0) as f32,
            };
            let logp: Vec<f32> = (0..n).map(|_| pick(&mut rng)).collect();
            let old: Vec<f32> = (0..n).map(|_| pick(&mut rng)).collect();
            let mask: Vec<f32> = (0..n).map(|_| (rng.below(4) != 0) as u8 as f32).collect();
            let (mut min, mut max) = (f32::INFINITY, f32::NEG_INFINITY);
            for ((&l, &o), &m) in logp.iter().zip(&old).zip(&mask) {
                if m != 0.0 {
                    let r = (l - o).exp();
                    min = min.min(r);
                    max = max.max(r);
                }
            }
            let got = RatioStats::of(&logp, &old, &mask);
            if mask.iter().all(|&m| m == 0.0) {
                assert!(got.min.is_nan());
                continue;
            }
            assert_eq!(
                got.min.to_bits(),
                min.to_bits(),
                "case {case}: {logp:?} {old:?} {mask:?}"
            );
            assert_eq!(
                got.max.to_bits(),
                max.to_bits(),
                "case {case}: {logp:?} {old:?} {mask:?}"
            );
        }
    }
}
