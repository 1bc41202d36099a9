//! Advantages ("deltas") from group rewards, every mode of GRPO-SPEC §3.
//!
//! `rewards` is `[B, G]` flattened row-major: group `b` is `rewards[b*G .. (b+1)*G]`.
//! Conventions where the formulas are undefined: a group of one has `std = 0`, so every
//! centered mode gives 0; RLOO with `G = 1` gives 0 (no other sample to compare with).

use crate::config::AdvantageMode;
use serde::Serialize;
use std::collections::BTreeMap;

/// Added to the std in `normalized` and `batch_normalized` (GRPO).
pub const STD_EPS: f32 = 1e-5;

/// Statistics of one group of `G` rewards.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct GroupStats {
    pub mean: f32,
    /// Unbiased (n − 1); 0 for a group of one.
    pub std: f32,
    pub max: f32,
    pub min: f32,
    /// All rewards equal: every centered mode gives zero advantage (no learning signal).
    pub zero_std: bool,
}

impl GroupStats {
    pub fn of(group: &[f32]) -> Self {
        let g = group.len();
        let mean = group.iter().sum::<f32>() / g as f32;
        let var = if g > 1 {
            group.iter().map(|r| (r - mean) * (r - mean)).sum::<f32>() / (g - 1) as f32
        } else {
            0.0
        };
        let max = group.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let min = group.iter().copied().fold(f32::INFINITY, f32::min);
        Self {
            mean,
            std: var.sqrt(),
            max,
            min,
            zero_std: max == min,
        }
    }
}

/// Unbiased std over all rewards of the batch (for `batch_normalized`), accumulated in
/// f64: a batch can hold many thousands of rewards.
pub fn batch_std(rewards: &[f32]) -> f32 {
    let n = rewards.len();
    if n < 2 {
        return 0.0;
    }
    let mean = rewards.iter().map(|&r| r as f64).sum::<f64>() / n as f64;
    let var = rewards
        .iter()
        .map(|&r| (r as f64 - mean).powi(2))
        .sum::<f64>()
        / (n - 1) as f64;
    var.sqrt() as f32
}

/// Advantages under one mode, `[B, G]` flattened.
pub fn advantages(mode: AdvantageMode, rewards: &[f32], g: usize) -> Vec<f32> {
    assert!(
        g > 0 && rewards.len().is_multiple_of(g),
        "rewards must be [B, G]"
    );
    let bstd = if mode == AdvantageMode::BatchNormalized {
        batch_std(rewards)
    } else {
        0.0
    };
    let mut out = Vec::with_capacity(rewards.len());
    for group in rewards.chunks(g) {
        let s = GroupStats::of(group);
        for &r in group {
            out.push(match mode {
                AdvantageMode::Raw => r,
                AdvantageMode::Centered => r - s.mean,
                AdvantageMode::Normalized => (r - s.mean) / (s.std + STD_EPS),
                AdvantageMode::Max => {
                    if r == s.max {
                        r
                    } else {
                        0.0
                    }
                }
                AdvantageMode::Rloo => {
                    if g > 1 {
                        // r_i − mean_{j≠i} r_j = G/(G−1) · (r_i − mean)
                        (r - s.mean) * g as f32 / (g - 1) as f32
                    } else {
                        0.0
                    }
                }
                AdvantageMode::BatchNormalized => (r - s.mean) / (bstd + STD_EPS),
                // GAE needs the critic's values (`objective::value`, in the trainer); from the
                // rewards alone its stand-in is the return minus a constant baseline: centered.
                AdvantageMode::Gae => r - s.mean,
            });
        }
    }
    out
}

/// BUG (the gallery's `algorithm.bugs.std_without_eps`): `(r − mean)/std` with no ε, which
/// blows up on groups whose rewards nearly agree (and is NaN on groups that agree exactly).
pub fn normalized_without_eps(rewards: &[f32], g: usize) -> Vec<f32> {
    rewards
        .chunks(g)
        .flat_map(|group| {
            let s = GroupStats::of(group);
            group.iter().map(move |r| (r - s.mean) / s.std)
        })
        .collect()
}

/// Every mode for the same rollouts, so they can be shown side by side.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AllAdvantages {
    pub by_mode: BTreeMap<&'static str, Vec<f32>>,
    pub groups: Vec<GroupStats>,
}

pub fn all_advantages(rewards: &[f32], g: usize) -> AllAdvantages {
    AllAdvantages {
        by_mode: AdvantageMode::GROUP
            .iter()
            .map(|&m| (m.name(), advantages(m, rewards, g)))
            .collect(),
        groups: rewards.chunks(g).map(GroupStats::of).collect(),
    }
}

/// The groups (indices) whose rewards are all equal: no learning signal.
pub fn zero_std_groups(rewards: &[f32], g: usize) -> Vec<usize> {
    rewards
        .chunks(g)
        .enumerate()
        .filter(|(_, c)| GroupStats::of(c).zero_std)
        .map(|(i, _)| i)
        .collect()
}

/// Fraction of groups whose rewards are all equal.
pub fn frac_zero_std(rewards: &[f32], g: usize) -> f32 {
    let groups = rewards.len() / g;
    zero_std_groups(rewards, g).len() as f32 / groups.max(1) as f32
}

#[cfg(test)]
mod tests {
    use super::*;
    use AdvantageMode::*;

    fn close(a: &[f32], b: &[f32]) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() <= 1e-5 * (1.0 + y.abs()), "{a:?} vs {b:?}");
        }
    }

    #[test]
    fn hand_values_one_group() {
        // rewards 1, 2, 2, 5: mean 2.5, unbiased var (2.25+.25+.25+6.25)/3 = 3, std √3.
        let r = [1.0, 2.0, 2.0, 5.0];
        let s3 = 3f32.sqrt() + STD_EPS;
        close(&advantages(Raw, &r, 4), &r);
        close(&advantages(Centered, &r, 4), &[-1.5, -0.5, -0.5, 2.5]);
        close(
            &advantages(Normalized, &r, 4),
            &[-1.5 / s3, -0.5 / s3, -0.5 / s3, 2.5 / s3],
        );
        close(&advantages(Max, &r, 4), &[0.0, 0.0, 0.0, 5.0]);
        // RLOO: 1 − 3, 2 − 8/3, 2 − 8/3, 5 − 5/3
        close(
            &advantages(Rloo, &r, 4),
            &[-2.0, -2.0 / 3.0, -2.0 / 3.0, 10.0 / 3.0],
        );
        close(
            &advantages(BatchNormalized, &r, 4),
            &[-1.5 / s3, -0.5 / s3, -0.5 / s3, 2.5 / s3],
        );
    }

    #[test]
    fn negative_rewards_and_ties_at_max() {
        let r = [-1.0, -3.0, -1.0];
        close(&advantages(Max, &r, 3), &[-1.0, 0.0, -1.0]);
        // mean −5/3; centered 2/3, −4/3, 2/3; unbiased std = √((4/9+16/9+4/9)/2) = √(4/3)
        let s = (4.0f32 / 3.0).sqrt() + STD_EPS;
        close(
            &advantages(Normalized, &r, 3),
            &[(2.0 / 3.0) / s, (-4.0 / 3.0) / s, (2.0 / 3.0) / s],
        );
        close(&advantages(Rloo, &r, 3), &[1.0, -2.0, 1.0]);
    }

    #[test]
    fn group_of_one() {
        let r = [4.0, 2.0];
        close(&advantages(Raw, &r, 1), &[4.0, 2.0]);
        for m in [Centered, Normalized, Rloo] {
            close(&advantages(m, &r, 1), &[0.0, 0.0]);
        }
        close(&advantages(Max, &r, 1), &[4.0, 2.0]);
        // batch std over [4, 2] = √2, but each group's own mean is its reward.
        close(&advantages(BatchNormalized, &r, 1), &[0.0, 0.0]);
    }

    #[test]
    fn all_equal_groups_give_zero_under_centered_modes() {
        let r = [3.0, 3.0, 3.0, 1.0, 2.0, 3.0];
        for m in [Centered, Normalized, Rloo, BatchNormalized] {
            let a = advantages(m, &r, 3);
            close(&a[..3], &[0.0, 0.0, 0.0]);
            assert!(a[3..].iter().any(|x| *x != 0.0));
        }
        assert_eq!(frac_zero_std(&r, 3), 0.5);
        let all = all_advantages(&r, 3);
        assert!(all.groups[0].zero_std && !all.groups[1].zero_std);
        assert_eq!(all.by_mode.len(), AdvantageMode::GROUP.len());
    }

    #[test]
    fn batch_normalized_uses_batch_std() {
        // groups [0, 2] and [10, 10]: batch std of [0, 2, 10, 10] (unbiased) = √(88/3 · ... )
        let r = [0.0, 2.0, 10.0, 10.0];
        let mean = 5.5f32;
        let var = r.iter().map(|x| (x - mean) * (x - mean)).sum::<f32>() / 3.0;
        let s = var.sqrt() + STD_EPS;
        close(
            &advantages(BatchNormalized, &r, 2),
            &[-1.0 / s, 1.0 / s, 0.0, 0.0],
        );
    }
}
