//! What each optimizer step of an iteration trains on: the whole frozen batch, or one of
//! `algorithm.steps_per_generation` mini-batches of whole groups (TRL's `steps_per_generation`:
//! the rollout split once, the μ passes going over the mini-batches in turn, each loss
//! aggregated over its own mini-batch); and the replay buffer's groups put in place of the
//! flat ones before the steps begin (see [`super::replay`]).

use super::Trainer;
use super::replay::{self, StoredGroup, Training};
use super::trainer::Frozen;
use crate::engine::Batch;
use crate::rng::{SplitMix64, counter_u32};
use std::ops::Range;

/// One step's share of the frozen batch, copied out (only when there is more than one).
pub(super) struct Part {
    pub batch: Batch,
    pub advantages: Vec<f32>,
    pub token_advantages: Option<Vec<f32>>,
    pub old_logp: Vec<f32>,
    pub ref_logp: Vec<f32>,
    pub sampler_logp: Option<Vec<f32>>,
    /// Its rows in the whole batch (`[B·G]` indices).
    pub rows: Range<usize>,
}

/// The groups of mini-batch `k` of `s` over `b` groups: `[k·b/s, (k+1)·b/s)`.
pub fn groups_of(b: usize, s: usize, k: usize) -> Range<usize> {
    k * b / s..(k + 1) * b / s
}

impl Frozen {
    /// How many mini-batches an iteration's steps cycle over (at most one per group).
    pub(super) fn parts(&self, steps_per_generation: usize) -> usize {
        steps_per_generation.clamp(1, self.batch.b.max(1))
    }

    /// Mini-batch `k` of `s` (`s` > 1).
    pub(super) fn part(&self, k: usize, s: usize) -> Part {
        let groups = groups_of(self.batch.b, s, k);
        let g = self.batch.g;
        let rows = groups.start * g..groups.end * g;
        let t = self.batch.t;
        let tokens = rows.start * t..rows.end * t;
        Part {
            batch: self.batch.groups(groups),
            advantages: self.advantages[rows.clone()].to_vec(),
            token_advantages: self
                .token_advantages
                .as_ref()
                .map(|x| x[tokens.clone()].to_vec()),
            old_logp: self.old_logp[tokens.clone()].to_vec(),
            ref_logp: self.ref_logp[tokens.clone()].to_vec(),
            sampler_logp: self.sampler_logp.as_ref().map(|x| x[tokens].to_vec()),
            rows,
        }
    }

    /// What a step trains on: its mini-batch's (batch, advantages, per-token advantages,
    /// log π_old, log π_ref, the sampler's log π), or the whole frozen batch's.
    #[allow(clippy::type_complexity)]
    pub(super) fn view<'a>(
        &'a self,
        part: Option<&'a Part>,
    ) -> (
        &'a Batch,
        &'a [f32],
        Option<&'a [f32]>,
        &'a [f32],
        &'a [f32],
        Option<&'a [f32]>,
    ) {
        match part {
            Some(p) => (
                &p.batch,
                &p.advantages,
                p.token_advantages.as_deref(),
                &p.old_logp,
                &p.ref_logp,
                p.sampler_logp.as_deref(),
            ),
            None => (
                &self.batch,
                &self.advantages,
                self.token_advantages.as_deref(),
                &self.old_logp,
                &self.ref_logp,
                self.sampler_logp.as_deref(),
            ),
        }
    }

    /// Keep the log π and entropy a mini-batch's step read for its rows (`logp`, `entropy`: the
    /// first rows of the part; `entropy` may be empty), for the iteration's logged groups.
    pub(super) fn saw(&mut self, rows: Range<usize>, logp: &[f32], entropy: &[f32]) {
        let t = self.batch.t;
        let len = self.old_logp.len();
        let (seen_logp, seen_entropy) = self
            .seen
            .get_or_insert_with(|| (vec![0.0; len], Vec::new()));
        for (seen, x) in [(seen_logp, logp), (seen_entropy, entropy)] {
            if x.is_empty() {
                continue;
            }
            seen.resize(len, 0.0);
            let n = x.len().min(rows.len() * t);
            seen[rows.start * t..rows.start * t + n].copy_from_slice(&x[..n]);
        }
    }
}

impl Trainer {
    /// The replay buffer's turn, after the advantages and before the steps: every group with
    /// a reward signal is offered to the buffer, then every flat group (`zero_std`) of the
    /// frozen batch is replaced by a stored one. Returns, per group, whether it was replaced.
    pub(super) fn replay_into(
        &mut self,
        f: &mut Frozen,
        rewards: &[f32],
        zero_std: &[bool],
    ) -> Vec<bool> {
        let cfg = &self.config;
        let (capacity, g, b) = (cfg.algorithm.replay_buffer, f.batch.g, f.batch.b);
        let mut tr = Training {
            batch: &mut f.batch,
            advantages: &mut f.advantages,
            old_logp: &mut f.old_logp,
            ref_logp: &mut f.ref_logp,
        };
        for k in (0..b).filter(|&k| !zero_std[k]) {
            let rows = k * g..(k + 1) * g;
            let score = replay::score(&tr.advantages[rows.clone()], &rewards[rows]);
            self.replay
                .add(tr.group(k, score, self.iteration), capacity);
        }
        let flat: Vec<usize> = (0..b).filter(|&k| zero_std[k]).collect();
        let mut rng =
            SplitMix64::new(counter_u32(cfg.run.seed, &[self.iteration as u32, 0x5EB1]) as u64);
        let picks = self.replay.draw(flat.len(), &mut rng);
        let with: Vec<&StoredGroup> = picks.iter().map(|&i| &self.replay.groups[i]).collect();
        let at = &flat[..with.len()];
        if !at.is_empty() {
            tr.replace(at, &with);
        }
        let mut replaced = vec![false; b];
        for &k in at {
            replaced[k] = true;
        }
        replaced
    }
}

#[cfg(test)]
mod tests {
    use super::groups_of;

    #[test]
    fn mini_batches_cover_every_group_once_in_order() {
        for (b, s) in [(8, 1), (8, 2), (8, 3), (5, 5), (7, 4)] {
            let all: Vec<usize> = (0..s).flat_map(|k| groups_of(b, s, k)).collect();
            assert_eq!(all, (0..b).collect::<Vec<_>>(), "b {b} s {s}");
            assert!((0..s).all(|k| !groups_of(b, s, k).is_empty()));
        }
        assert_eq!(groups_of(8, 2, 1), 4..8);
    }
}
