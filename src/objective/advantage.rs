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
        let max = group.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let min = group.iter().copied().fold(f32::INFINITY, f32::min);
        // A flat group's mean is its value: the f32 sum can round a ulp off it (ten 0.56568925
        // did), and the normalized modes would blow that up to ~6e-8 / 1e-5 ≈ 0.006.
        let mean = if max == min {
            max
        } else {
            group.iter().sum::<f32>() / g as f32
        };
        let var = if g > 1 {
            group.iter().map(|r| (r - mean) * (r - mean)).sum::<f32>() / (g - 1) as f32
        } else {
            0.0
        };
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
                // GAE needs the critic's values (`objective::value`, in the trainer), the
                // other estimators more than one group's rewards ([`estimate`]); from the
                // rewards alone their stand-in is the return minus a constant baseline: centered.
                _ => r - s.mean,
            });
        }
    }
    out
}

/// What the estimators beyond the group set read besides the rewards (`[B·G]` each, group-major).
#[derive(Debug, Clone, Copy)]
pub struct Rollouts<'a> {
    pub rewards: &'a [f32],
    pub g: usize,
    /// Each response's real tokens (OPO's weights, REINFORCE++'s token-weighted whitening).
    pub lengths: &'a [usize],
    /// 1 where a response is correct (exactly sorted): the analytic Pass@k's binary verdict.
    pub exact: &'a [u32],
    /// `[B]`: the reward of each prompt's greedy answer (ReMax's baseline).
    pub greedy_rewards: Option<&'a [f32]>,
    /// The k of the analytic Pass@k advantage (`algorithm.passk_advantage_k`).
    pub passk_k: usize,
}

/// The ε of verl's `masked_whiten`, under the square root.
pub const WHITEN_EPS: f64 = 1e-8;

/// verl's `masked_whiten`: `(x − mean)/√(var + 1e-8)` with the weighted mean and the unbiased
/// (Bessel over the weights' sum) variance, in f64. Weight 0 gives 0. REINFORCE++ whitens over
/// every real token of the batch: a response's value weighted by its length.
pub fn masked_whiten(x: &[f32], w: &[f32]) -> Vec<f32> {
    let n: f64 = w.iter().map(|&v| v as f64).sum();
    if n <= 0.0 {
        return vec![0.0; x.len()];
    }
    let mean = x
        .iter()
        .zip(w)
        .map(|(&a, &m)| a as f64 * m as f64)
        .sum::<f64>()
        / n;
    let ss = x
        .iter()
        .zip(w)
        .map(|(&a, &m)| m as f64 * (a as f64 - mean).powi(2))
        .sum::<f64>();
    let var = if n > 1.0 { ss / (n - 1.0) } else { 0.0 };
    let inv = 1.0 / (var + WHITEN_EPS).sqrt();
    x.iter()
        .zip(w)
        .map(|(&a, &m)| {
            if m > 0.0 {
                ((a as f64 - mean) * inv) as f32
            } else {
                0.0
            }
        })
        .collect()
}

/// C(a, k) / C(b, k) for a ≤ b, as a product (0 when a < k): no factorial overflows.
fn comb_ratio(a: usize, b: usize, k: usize) -> f64 {
    if a < k {
        return 0.0;
    }
    (0..k).map(|i| (a - i) as f64 / (b - i) as f64).product()
}

/// The analytic Pass@k advantage of one group (arXiv 2508.10751, `passk_adv.py`): with `c` of
/// `N` correct, ρ = 1 − C(N−c, k)/C(N, k) (the group's Pass@k), σ = √(ρ(1 − ρ)); a correct
/// response gets (1 − ρ)/(σ + 1e-6), a wrong one (1 − ρ − C(N−c−1, k−1)/C(N−1, k−1))/(σ + 1e-6).
/// Every advantage is 0 where ρ is 0 or 1 (no correct answer, or a sure pass).
pub fn passk_analytic(correct: &[u32], k: usize) -> Vec<f32> {
    let n = correct.len();
    let c = correct.iter().filter(|&&x| x != 0).count();
    if k == 0 || k > n {
        return vec![0.0; n];
    }
    let rho = 1.0 - comb_ratio(n - c, n, k);
    let sigma = (rho * (1.0 - rho)).max(0.0).sqrt();
    if sigma == 0.0 {
        return vec![0.0; n];
    }
    let pos = (1.0 - rho) / (sigma + 1e-6);
    // C(N−c−1, k−1)/C(N−1, k−1): the chance that the k − 1 others drawn with a wrong one are
    // all wrong too.
    let others = if n - c == 0 {
        0.0
    } else {
        comb_ratio(n - c - 1, n - 1, k - 1)
    };
    let neg = (1.0 - rho - others) / (sigma + 1e-6);
    correct
        .iter()
        .map(|&x| if x != 0 { pos as f32 } else { neg as f32 })
        .collect()
}

/// The estimators outside the group set (`AdvantageMode::GROUP`), `[B·G]`; each from its
/// source's definition (verl `core_algos.py`, the Pass@k paper's code). GAE is the trainer's
/// (it needs the critic); a group mode gives [`advantages`].
pub fn estimate(mode: AdvantageMode, x: &Rollouts) -> Vec<f32> {
    let (rewards, g) = (x.rewards, x.g);
    let len_w: Vec<f32> = x.lengths.iter().map(|&l| l as f32).collect();
    match mode {
        // GPG (arXiv 2504.02546): group-centred, scaled by α = (responses) / (responses in
        // groups with a signal): the batch's gradient is not diluted by flat groups.
        AdvantageMode::Gpg => {
            let signal = rewards
                .chunks(g)
                .filter(|c| !GroupStats::of(c).zero_std)
                .count()
                * g;
            let alpha = rewards.len() as f32 / signal.max(1) as f32;
            advantages(AdvantageMode::Centered, rewards, g)
                .into_iter()
                .map(|a| alpha * a)
                .collect()
        }
        // REINFORCE++ with γ = 1 and an outcome reward: every token's return is the reward,
        // whitened over every real token of the batch (γ < 1: `reinforce_pp_tokens`).
        AdvantageMode::ReinforcePp => masked_whiten(rewards, &len_w),
        // REINFORCE++-baseline: the group mean removed first, then the same whitening.
        AdvantageMode::ReinforcePpBaseline => {
            masked_whiten(&advantages(AdvantageMode::Centered, rewards, g), &len_w)
        }
        // ReMax: the greedy answer's reward as the baseline.
        AdvantageMode::Remax => {
            let base = x
                .greedy_rewards
                .expect("ReMax needs the greedy answers' rewards");
            rewards
                .iter()
                .enumerate()
                .map(|(i, r)| r - base[i / g])
                .collect()
        }
        // OPO: the length-weighted group mean Σ l_j r_j / Σ l_j as the baseline.
        AdvantageMode::Opo => rewards
            .chunks(g)
            .zip(x.lengths.chunks(g))
            .flat_map(|(r, l)| {
                let lsum: f32 = l.iter().map(|&v| v as f32).sum();
                let b = if GroupStats::of(r).zero_std {
                    r[0] // a flat group: exactly 0, as GroupStats' mean
                } else if lsum > 0.0 {
                    r.iter().zip(l).map(|(r, &l)| r * l as f32).sum::<f32>() / lsum
                } else {
                    0.0
                };
                r.iter().map(move |r| r - b)
            })
            .collect(),
        // verl's grpo_passk (arXiv 2503.19595): only the group's best response learns, by its
        // margin over the second best, over the group's std.
        AdvantageMode::Passk => rewards
            .chunks(g)
            .flat_map(|r| {
                let mut out = vec![0.0; r.len()];
                if r.len() >= 2 {
                    let best = (0..r.len()).fold(0, |b, i| if r[i] > r[b] { i } else { b });
                    let second = (0..r.len())
                        .filter(|&i| i != best)
                        .map(|i| r[i])
                        .fold(f32::NEG_INFINITY, f32::max);
                    out[best] = (r[best] - second) / (GroupStats::of(r).std + STD_EPS);
                }
                out
            })
            .collect(),
        AdvantageMode::PasskAnalytic => x
            .exact
            .chunks(g)
            .flat_map(|c| passk_analytic(c, x.passk_k))
            .collect(),
        group => advantages(group, rewards, g),
    }
}

/// REINFORCE++ with a discount: token t of a length-L response returns γ^(L−1−t)·r (the
/// outcome reward at its last token), whitened over every real token of the batch. `[B·G·T]`.
pub fn reinforce_pp_tokens(rewards: &[f32], lengths: &[usize], t: usize, gamma: f32) -> Vec<f32> {
    let mut returns = vec![0.0f32; rewards.len() * t];
    let mut mask = vec![0.0f32; rewards.len() * t];
    for (i, (&r, &len)) in rewards.iter().zip(lengths).enumerate() {
        let len = len.min(t);
        for p in 0..len {
            returns[i * t + p] = r * gamma.powi((len - 1 - p) as i32);
            mask[i * t + p] = 1.0;
        }
    }
    masked_whiten(&returns, &mask)
}

/// W-REINFORCE's weights (arXiv 2506.01347): positive advantages × `pos`, negative × `neg`
/// (PSR: neg = 0; NSR: pos = 0; 1 and 1 = off).
pub fn weight_by_sign(adv: &mut [f32], pos: f32, neg: f32) {
    if pos == 1.0 && neg == 1.0 {
        return;
    }
    for a in adv {
        *a *= if *a > 0.0 { pos } else { neg };
    }
}

/// GDPO (arXiv 2601.05242; TRL `multi_objective_aggregation = "normalize_then_sum"`): each
/// reward `(weight, [B·G] values)` normalized within its group on its own,
/// (r − mean)/(std + 1e-5), then the weighted sum: what the group modes then turn into
/// advantages. (`sum_then_normalize` is the plain weighted sum.)
pub fn normalize_then_sum(components: &[(f32, Vec<f32>)], g: usize) -> Vec<f32> {
    let n = components.first().map_or(0, |c| c.1.len());
    let mut out = vec![0.0f32; n];
    for (w, values) in components {
        for (o, a) in out
            .iter_mut()
            .zip(advantages(AdvantageMode::Normalized, values, g))
        {
            *o += w * a;
        }
    }
    out
}

/// GDPO's "reward collapse" (arXiv 2601.05242): of the pairs of responses in a group whose
/// rewards differ as vectors (some verifier, format or length term differs), the fraction
/// whose advantages come out equal (within 1e-6): the mixture told them apart, the advantage
/// does not. NaN where no pair differs.
pub fn collapsed_pairs(components: &[(f32, Vec<f32>)], adv: &[f32], g: usize) -> f32 {
    let (mut differ, mut collapsed) = (0usize, 0usize);
    for start in (0..adv.len()).step_by(g.max(1)) {
        for i in start..start + g {
            for j in i + 1..start + g {
                if components.iter().all(|(_, v)| v[i] == v[j]) {
                    continue;
                }
                differ += 1;
                let tol = 1e-6 * (1.0 + adv[i].abs().max(adv[j].abs()));
                collapsed += ((adv[i] - adv[j]).abs() <= tol) as usize;
            }
        }
    }
    if differ == 0 {
        f32::NAN
    } else {
        collapsed as f32 / differ as f32
    }
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
        // Exactly 0 where the f32 sum of a flat group is a ulp off its value (ten 0.56568925
        // summed and divided give 0.5656893: normalized said 0.0059 for each).
        let flat = [0.565_689_25_f32; 10];
        assert_ne!(flat.iter().sum::<f32>() / 10.0, flat[0]);
        for m in [Centered, Normalized, Rloo, BatchNormalized] {
            assert!(advantages(m, &flat, 10).iter().all(|&a| a == 0.0), "{m:?}");
        }
        assert_eq!(GroupStats::of(&flat).std, 0.0);
        assert_eq!(frac_zero_std(&r, 3), 0.5);
        let all = all_advantages(&r, 3);
        assert!(all.groups[0].zero_std && !all.groups[1].zero_std);
        assert_eq!(all.by_mode.len(), AdvantageMode::GROUP.len());
    }

    fn rollouts<'a>(r: &'a [f32], g: usize, lens: &'a [usize], exact: &'a [u32]) -> Rollouts<'a> {
        Rollouts {
            rewards: r,
            g,
            lengths: lens,
            exact,
            greedy_rewards: None,
            passk_k: 2,
        }
    }

    #[test]
    fn estimators_worked_values() {
        // Two groups of 3: [1, 2, 6] (mean 3) and [2, 2, 2] (flat), lengths 1..=6.
        let r = [1.0, 2.0, 6.0, 2.0, 2.0, 2.0];
        let lens = [1, 2, 3, 4, 5, 6];
        let exact = [0, 1, 1, 0, 0, 0];
        let x = rollouts(&r, 3, &lens, &exact);
        // GPG: centered × 6 responses / 3 in groups with a signal = 2.
        close(&estimate(Gpg, &x), &[-4.0, -2.0, 6.0, 0.0, 0.0, 0.0]);
        // OPO: baseline (1·1 + 2·2 + 3·6)/6 = 23/6; the flat group's is 2.
        let b = 23.0 / 6.0;
        close(
            &estimate(Opo, &x),
            &[1.0 - b, 2.0 - b, 6.0 - b, 0.0, 0.0, 0.0],
        );
        // verl's grpo_passk: only the best (6) learns, (6 − 2)/(std + ε); std of [1,2,6] = √7.
        let s = 7f32.sqrt() + STD_EPS;
        close(&estimate(Passk, &x), &[0.0, 0.0, 4.0 / s, 0.0, 0.0, 0.0]);
        // ReMax: greedy rewards 3 and 1.
        let x2 = Rollouts {
            greedy_rewards: Some(&[3.0, 1.0]),
            ..x
        };
        close(&estimate(Remax, &x2), &[-2.0, -1.0, 3.0, 1.0, 1.0, 1.0]);
        // REINFORCE++: r weighted by length; mean = (1+4+18+8+10+12)/21 = 53/21, unbiased
        // variance over the 21 tokens.
        let mean = 53.0f64 / 21.0;
        let ss: f64 = r
            .iter()
            .zip(&lens)
            .map(|(&r, &l)| l as f64 * (r as f64 - mean).powi(2))
            .sum();
        let sd = (ss / 20.0 + 1e-8).sqrt();
        let want: Vec<f32> = r.iter().map(|&v| ((v as f64 - mean) / sd) as f32).collect();
        close(&estimate(ReinforcePp, &x), &want);
        // REINFORCE++-baseline: centered [-2, -1, 3, 0, 0, 0], then the same whitening.
        let c = [-2.0f64, -1.0, 3.0, 0.0, 0.0, 0.0];
        let mean = (-2.0 - 2.0 + 9.0) / 21.0;
        let ss: f64 = c
            .iter()
            .zip(&lens)
            .map(|(&v, &l)| l as f64 * (v - mean).powi(2))
            .sum();
        let sd = (ss / 20.0 + 1e-8).sqrt();
        let want: Vec<f32> = c.iter().map(|&v| ((v - mean) / sd) as f32).collect();
        close(&estimate(ReinforcePpBaseline, &x), &want);
        // Every group mode through `estimate` is `advantages`.
        for &m in AdvantageMode::GROUP {
            close(&estimate(m, &x), &advantages(m, &r, 3));
        }
    }

    #[test]
    fn passk_analytic_matches_the_papers_numbers() {
        // N = 8, k = 4 (checked against passk_adv.py): c = 1 → (+1.0, −0.143); c = 2 →
        // (+0.522, −0.174); c = 4 → (+0.120, −0.120); c ≥ 5 → 0 (a sure pass).
        let group = |c: usize| -> Vec<u32> { (0..8).map(|i| (i < c) as u32).collect() };
        let pair = |c: usize| {
            let a = passk_analytic(&group(c), 4);
            (a[0], a[7])
        };
        let near = |x: f32, y: f32| assert!((x - y).abs() < 1e-3, "{x} vs {y}");
        let (p, n) = pair(1);
        near(p, 1.0);
        near(n, -0.1429);
        let (p, n) = pair(2);
        near(p, 0.5222);
        near(n, -0.1741);
        let (p, n) = pair(4);
        near(p, 0.1204);
        near(n, -0.1204);
        for c in [0, 5, 8] {
            assert!(
                passk_analytic(&group(c), 4).iter().all(|&a| a == 0.0),
                "c = {c}"
            );
        }
        // The advantages sum to zero over the group: c·A+ + (N − c)·A− = 0.
        for c in 1..5 {
            let a = passk_analytic(&group(c), 4);
            assert!(a.iter().sum::<f32>().abs() < 1e-5, "c = {c}: {a:?}");
        }
        // k = 1 is GRPO with the population std: A+ = (1 − c/N)/σ, A− = −(c/N)/σ.
        let a = passk_analytic(&group(2), 1);
        let (p, sigma) = (0.25f32, (0.25f32 * 0.75).sqrt());
        near(a[0], (1.0 - p) / (sigma + 1e-6));
        near(a[7], -p / (sigma + 1e-6));
    }

    #[test]
    fn sign_weights_and_normalize_then_sum() {
        let mut a = [2.0, -1.0, 0.0, -3.0];
        weight_by_sign(&mut a, 0.5, 0.0);
        close(&a, &[1.0, 0.0, 0.0, 0.0]);
        // GDPO: two rewards over one group of 4. Summed first, [1, 0, 0, 1] + [0, 1, 1, 0]
        // is flat (no signal); normalized first, each keeps its own.
        let exact = (1.0, vec![1.0, 0.0, 0.0, 1.0]);
        let format = (0.5, vec![0.0, 1.0, 1.0, 0.0]);
        // Unbiased std of [1, 0, 0, 1]: √(1/3); each normalized to ±0.5/(√(1/3) + ε).
        let z = 0.5 / ((1.0f32 / 3.0).sqrt() + STD_EPS);
        let got = normalize_then_sum(&[exact, format], 4);
        close(
            &got,
            &[z - 0.5 * z, -z + 0.5 * z, -z + 0.5 * z, z - 0.5 * z],
        );
    }

    #[test]
    fn collapse_counts_differing_rewards_with_one_advantage() {
        // One group of 4: exact [1, 0, 0, 0] and format [0, 1, 1, 0] at weights 1 and 1. Of the
        // 5 pairs whose vectors differ ((1, 2) are the same), summed rewards [1, 1, 1, 0] give
        // (0, 1) and (0, 2) one advantage: 2/5 collapse. GDPO keeps them apart: exact's rarer
        // success counts for more than format's common one.
        let parts = vec![
            (1.0, vec![1.0, 0.0, 0.0, 0.0]),
            (1.0, vec![0.0, 1.0, 1.0, 0.0]),
        ];
        let summed = advantages(Normalized, &[1.0, 1.0, 1.0, 0.0], 4);
        assert!((collapsed_pairs(&parts, &summed, 4) - 0.4).abs() < 1e-6);
        let gdpo = normalize_then_sum(&parts, 4);
        assert_eq!(collapsed_pairs(&parts, &gdpo, 4), 0.0);
        // Nothing differs in a group: no pair to count.
        assert!(collapsed_pairs(&[(1.0, vec![1.0, 1.0, 0.0, 0.0])], &[0.0; 4], 2).is_nan());
    }

    #[test]
    fn reinforce_pp_tokens_discount_then_whiten() {
        // One response of 2 tokens with r = 1 (γ = 0.5: returns 0.5, 1) and one of 1 token with
        // r = 0 (return 0), T = 2: whitened over the three real tokens.
        let got = reinforce_pp_tokens(&[1.0, 0.0], &[2, 1], 2, 0.5);
        let v = [0.5f64, 1.0, 0.0];
        let mean = 0.5;
        let sd = ((v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / 2.0) + 1e-8).sqrt();
        let w = |x: f64| ((x - mean) / sd) as f32;
        close(&got, &[w(0.5), w(1.0), w(0.0), 0.0]);
        // γ = 1: every token of a response the same, = the per-response estimator.
        let flat = reinforce_pp_tokens(&[1.0, 0.0], &[2, 1], 2, 1.0);
        let per = estimate(ReinforcePp, &rollouts(&[1.0, 0.0], 1, &[2, 1], &[0, 0]));
        close(&flat, &[per[0], per[0], per[1], 0.0]);
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
