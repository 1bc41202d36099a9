//! TRL's experimental GRPO with replay buffer (`trl/experimental/grpo_with_replay_buffer`,
//! f2cd577): groups that had a reward signal are stored, scored `Σ_i |A_i| · std(r)` (the
//! group's unbiased reward std, as `torch.std`); a full buffer keeps the best (a new group
//! enters only by beating the lowest score, which it replaces). After each rollout — the new
//! groups stored first, as TRL does — every group whose rewards are all equal is replaced in
//! the training batch by a stored group drawn in proportion to its score (without replacement
//! while the buffer has enough groups, with it otherwise: `torch.multinomial`). A replayed group
//! brings its own responses, advantages, log π_old and log π_ref: its ratio is taken against
//! the policy that sampled it, some iterations ago.

use crate::engine::Batch;
use crate::rng::SplitMix64;
use serde::{Deserialize, Serialize};

/// One stored group: what its `G` training rows need. Its numbers go into checkpoints as
/// their bits (JSON has no −∞ or NaN, and a log π can be −∞), so a resume replays them exactly.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredGroup {
    pub score: f64,
    /// The iteration that sampled it.
    pub iteration: usize,
    pub prompt: Vec<u32>,
    /// Per response, its real tokens (the batch's `lengths`).
    pub rows: Vec<Vec<u32>>,
    /// Per response, its loss mask over those tokens (0s where the response left the loss).
    #[serde(with = "bits")]
    pub mask: Vec<Vec<f32>>,
    #[serde(with = "bits::flat")]
    pub advantages: Vec<f32>,
    #[serde(with = "bits")]
    pub old_logp: Vec<Vec<f32>>,
    #[serde(with = "bits")]
    pub ref_logp: Vec<Vec<f32>>,
}

/// `Vec<Vec<f32>>` as the bits of each number (`f32::to_bits`), exact for every value.
mod bits {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(x: &[Vec<f32>], s: S) -> Result<S::Ok, S::Error> {
        let b: Vec<Vec<u32>> = x
            .iter()
            .map(|r| r.iter().map(|v| v.to_bits()).collect())
            .collect();
        b.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Vec<f32>>, D::Error> {
        let b: Vec<Vec<u32>> = Deserialize::deserialize(d)?;
        Ok(b.into_iter()
            .map(|r| r.into_iter().map(f32::from_bits).collect())
            .collect())
    }

    /// `Vec<f32>` the same way.
    pub mod flat {
        use serde::{Deserialize, Deserializer, Serialize, Serializer};

        pub fn serialize<S: Serializer>(x: &[f32], s: S) -> Result<S::Ok, S::Error> {
            x.iter()
                .map(|v| v.to_bits())
                .collect::<Vec<u32>>()
                .serialize(s)
        }

        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<f32>, D::Error> {
            let b: Vec<u32> = Deserialize::deserialize(d)?;
            Ok(b.into_iter().map(f32::from_bits).collect())
        }
    }
}

/// The stored groups (at most `algorithm.replay_buffer`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReplayBuffer {
    pub groups: Vec<StoredGroup>,
}

/// A group's replay score: `Σ_i |A_i| · std(r)` with the unbiased std of its rewards.
pub fn score(advantages: &[f32], rewards: &[f32]) -> f64 {
    let std = crate::objective::advantage::batch_std(rewards) as f64;
    std * advantages.iter().map(|a| a.abs() as f64).sum::<f64>()
}

impl ReplayBuffer {
    /// Store `group` if there is room, or in place of the lowest score if it beats it.
    pub fn add(&mut self, group: StoredGroup, capacity: usize) {
        if capacity == 0 {
            return;
        }
        if self.groups.len() < capacity {
            self.groups.push(group);
            return;
        }
        let (low, worst) = self
            .groups
            .iter()
            .enumerate()
            .min_by(|a, b| a.1.score.total_cmp(&b.1.score))
            .map(|(i, g)| (i, g.score))
            .expect("a full buffer of capacity > 0");
        if group.score > worst {
            self.groups[low] = group;
        }
    }

    /// `count` stored groups drawn in proportion to their scores (uniformly if every score is
    /// 0): distinct ones while `count` ≤ the buffer's size, with replacement beyond.
    pub fn draw(&self, count: usize, rng: &mut SplitMix64) -> Vec<usize> {
        let n = self.groups.len();
        if n == 0 {
            return Vec::new();
        }
        let mut weights: Vec<f64> = self.groups.iter().map(|g| g.score.max(0.0)).collect();
        if weights.iter().sum::<f64>() <= 0.0 {
            weights.iter_mut().for_each(|w| *w = 1.0);
        }
        let distinct = count <= n;
        let mut out = Vec::with_capacity(count);
        for _ in 0..count {
            let total: f64 = weights.iter().sum();
            let mut u = rng.next_f64() * total;
            let mut pick = n - 1;
            for (i, &w) in weights.iter().enumerate() {
                if w > 0.0 && u < w {
                    pick = i;
                    break;
                }
                u -= w;
            }
            // Rounding can leave `u` past the last weight: the last group with weight.
            if weights[pick] <= 0.0 {
                pick = weights.iter().rposition(|&w| w > 0.0).unwrap_or(pick);
            }
            out.push(pick);
            if distinct {
                weights[pick] = 0.0;
            }
        }
        out
    }
}

/// The training batch of one iteration, per group: what replay reads and rewrites.
pub struct Training<'a> {
    pub batch: &'a mut Batch,
    pub advantages: &'a mut Vec<f32>,
    pub old_logp: &'a mut Vec<f32>,
    pub ref_logp: &'a mut Vec<f32>,
}

impl Training<'_> {
    /// Group `k` as a stored group.
    pub fn group(&self, k: usize, score: f64, iteration: usize) -> StoredGroup {
        let b: &Batch = self.batch;
        let (g, t, n) = (b.g, b.t, b.n);
        let rows = k * g..(k + 1) * g;
        let cut = |x: &[f32]| -> Vec<Vec<f32>> {
            rows.clone()
                .map(|r| x[r * t..r * t + b.lengths[r]].to_vec())
                .collect()
        };
        StoredGroup {
            score,
            iteration,
            prompt: b.prompts[k * n..(k + 1) * n].to_vec(),
            rows: rows
                .clone()
                .map(|r| b.responses[r * t..r * t + b.lengths[r]].to_vec())
                .collect(),
            mask: cut(&b.mask),
            advantages: self.advantages[rows.clone()].to_vec(),
            old_logp: cut(self.old_logp),
            ref_logp: cut(self.ref_logp),
        }
    }

    /// Put the stored groups `with[j]` in place of groups `at[j]`, re-padding the batch (and
    /// the log π rows) to the longest response.
    pub fn replace(&mut self, at: &[usize], with: &[&StoredGroup]) {
        let (g, t, n) = (self.batch.g, self.batch.t, self.batch.n);
        let rows = self.batch.b * g;
        let real = |x: &[f32], r: usize, len: usize| x[r * t..r * t + len].to_vec();
        let mut tokens: Vec<Vec<u32>> = Vec::with_capacity(rows);
        let (mut mask, mut old, mut refl) = (Vec::new(), Vec::new(), Vec::new());
        for r in 0..rows {
            let len = self.batch.lengths[r];
            tokens.push(self.batch.responses[r * t..r * t + len].to_vec());
            mask.push(real(&self.batch.mask, r, len));
            old.push(real(self.old_logp, r, len));
            refl.push(real(self.ref_logp, r, len));
        }
        for (&k, s) in at.iter().zip(with) {
            self.batch.prompts[k * n..(k + 1) * n].copy_from_slice(&s.prompt);
            for i in 0..g {
                let r = k * g + i;
                tokens[r] = s.rows[i].clone();
                mask[r] = s.mask[i].clone();
                old[r] = s.old_logp[i].clone();
                refl[r] = s.ref_logp[i].clone();
                self.advantages[r] = s.advantages[i];
            }
        }
        let rebuilt = Batch::padded(
            std::mem::take(&mut self.batch.prompts),
            n,
            &tokens,
            g,
            self.batch.pad,
        );
        let pad = |x: &[Vec<f32>]| -> Vec<f32> {
            x.iter()
                .flat_map(|v| (0..rebuilt.t).map(|i| v.get(i).copied().unwrap_or(0.0)))
                .collect()
        };
        let new_mask = pad(&mask);
        *self.old_logp = pad(&old);
        *self.ref_logp = pad(&refl);
        *self.batch = Batch {
            mask: new_mask,
            ..rebuilt
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(score: f64) -> StoredGroup {
        StoredGroup {
            score,
            iteration: 0,
            prompt: vec![],
            rows: vec![],
            mask: vec![],
            advantages: vec![],
            old_logp: vec![],
            ref_logp: vec![],
        }
    }

    #[test]
    fn the_score_is_the_sum_of_abs_advantages_times_the_unbiased_std() {
        // rewards 0, 1, 1, 0: mean 0.5, unbiased var = 4·0.25/3 = 1/3.
        let s = score(&[-1.0, 1.0, 1.0, -1.0], &[0.0, 1.0, 1.0, 0.0]);
        assert!((s - 4.0 * (1.0f64 / 3.0).sqrt()).abs() < 1e-6, "{s}");
        assert_eq!(score(&[0.0; 3], &[2.0; 3]), 0.0);
    }

    #[test]
    fn a_full_buffer_keeps_the_best_groups() {
        let mut buf = ReplayBuffer::default();
        for s in [3.0, 1.0, 2.0] {
            buf.add(stored(s), 2);
        }
        let scores: Vec<f64> = buf.groups.iter().map(|g| g.score).collect();
        assert_eq!(scores, vec![3.0, 2.0], "1 went, 2 took its place");
        buf.add(stored(0.5), 2);
        assert_eq!(buf.groups.len(), 2);
        assert!(buf.groups.iter().all(|g| g.score >= 2.0));
        buf.add(stored(9.0), 0);
        assert_eq!(buf.groups.len(), 2, "capacity 0 stores nothing");
    }

    #[test]
    fn draws_follow_the_scores_and_are_distinct_while_they_can_be() {
        let mut buf = ReplayBuffer::default();
        for s in [1.0, 3.0, 0.0] {
            buf.add(stored(s), 8);
        }
        let mut rng = SplitMix64::new(7);
        let mut hits = [0usize; 3];
        for _ in 0..4000 {
            let d = buf.draw(1, &mut rng);
            hits[d[0]] += 1;
        }
        assert_eq!(hits[2], 0, "a zero score is never drawn");
        let share = hits[1] as f64 / 4000.0;
        assert!((share - 0.75).abs() < 0.03, "{hits:?}");
        for _ in 0..50 {
            let d = buf.draw(2, &mut rng);
            assert!(d[0] != d[1] && !d.contains(&2), "{d:?}");
        }
        // More than it holds: with replacement.
        assert_eq!(buf.draw(5, &mut rng).len(), 5);
        assert!(ReplayBuffer::default().draw(3, &mut rng).is_empty());
    }

    #[test]
    fn a_stored_group_round_trips_through_json_exactly() {
        let mut g = stored(2.5);
        g.old_logp = vec![vec![f32::NEG_INFINITY, -0.5], vec![f32::NAN]];
        g.ref_logp = vec![vec![-1.25]];
        g.advantages = vec![f32::MIN_POSITIVE, -0.0];
        g.mask = vec![vec![1.0, 0.0]];
        let text = serde_json::to_string(&g).unwrap();
        let back: StoredGroup = serde_json::from_str(&text).unwrap();
        let bits = |x: &StoredGroup| -> Vec<u32> {
            x.old_logp
                .iter()
                .chain(&x.ref_logp)
                .chain(&x.mask)
                .flatten()
                .chain(&x.advantages)
                .map(|v| v.to_bits())
                .collect()
        };
        assert_eq!(bits(&back), bits(&g), "{text}");
    }

    #[test]
    fn replacing_a_group_repads_the_batch_and_its_log_probs() {
        // B = 2 prompts of n = 2, G = 2: rows of 1 and 2 tokens, T = 2.
        let rows = vec![vec![5], vec![6, 7], vec![8], vec![9]];
        let mut batch = Batch::padded(vec![1, 2, 3, 4], 2, &rows, 2, 0);
        let mut adv = vec![0.5, -0.5, 0.0, 0.0];
        let mut old = vec![-1.0, 0.0, -2.0, -3.0, -4.0, 0.0, -5.0, 0.0];
        let mut refl = old.clone();
        let mut tr = Training {
            batch: &mut batch,
            advantages: &mut adv,
            old_logp: &mut old,
            ref_logp: &mut refl,
        };
        let mut kept = tr.group(0, 1.0, 3);
        assert_eq!(kept.rows, vec![vec![5], vec![6, 7]]);
        assert_eq!(kept.old_logp, vec![vec![-1.0], vec![-2.0, -3.0]]);
        kept.rows[1] = vec![6, 7, 1];
        kept.mask[1] = vec![1.0, 1.0, 0.0];
        kept.old_logp[1] = vec![-2.0, -3.0, -9.0];
        kept.ref_logp[1] = vec![-2.0, -3.0, -9.0];
        tr.replace(&[1], &[&kept]);
        assert_eq!(batch.t, 3);
        assert_eq!(batch.prompts, vec![1, 2, 1, 2]);
        assert_eq!(batch.lengths, vec![1, 2, 1, 3]);
        assert_eq!(&batch.responses[9..12], &[6, 7, 1]);
        assert_eq!(&batch.mask[9..12], &[1.0, 1.0, 0.0]);
        assert_eq!(&batch.mask[0..3], &[1.0, 0.0, 0.0]);
        assert_eq!(adv, vec![0.5, -0.5, 0.5, -0.5]);
        assert_eq!(&old[0..6], &[-1.0, 0.0, 0.0, -2.0, -3.0, 0.0]);
        assert_eq!(&old[9..12], &[-2.0, -3.0, -9.0]);
    }
}
