//! Dynamic sampling (DAPO): groups with no learning signal (every reward equal) are replaced
//! by fresh ones — unused prompts first, else new responses to the same prompt — at most
//! `max_resample_rounds` times; groups still flat after that stay (their advantage is 0).

use super::iteration::Scored;
use super::record::Resampling;
use super::{TrainError, Trainer};
use crate::objective::advantage::zero_std_groups;
use crate::rng::{SplitMix64, counter_u32};

impl Trainer {
    /// Replace the flat groups of `scored` (prompts `indices`) in place; returns the counts.
    pub(super) fn resample_flat_groups(
        &mut self,
        indices: &mut [usize],
        scored: &mut Scored,
    ) -> Result<Resampling, TrainError> {
        let cfg = self.config.clone();
        let a = &cfg.algorithm;
        let g = a.num_generations;
        let mut flat = zero_std_groups(&scored.rewards, g);
        let mut out = Resampling {
            zero_std_first_draw: flat.len() as f32 / indices.len() as f32,
            ..Default::default()
        };
        if !a.dynamic_sampling {
            return Ok(out);
        }
        let iteration = self.iteration;
        let mut spare: Vec<usize> = (0..self.prompts.train.len())
            .filter(|i| !indices.contains(i))
            .collect();
        SplitMix64::for_stream(cfg.run.seed ^ iteration as u64, "resample").shuffle(&mut spare);
        // Each row's log-probs from the sampling pass (its real tokens) — the learner's and the
        // sampler's own —, when the engine gave them, so they survive the replacement (see
        // `with_padding`).
        let original = [scored.logp.take(), scored.sampler_logp.take()];
        let mut carried = original
            .clone()
            .map(|lp| lp.map(|lp| real_tokens(&lp, &scored.rows)));
        let original_support = scored.support.take();
        let mut support = original_support
            .as_ref()
            .map(|s| real_tokens(s, &scored.rows));
        while !flat.is_empty() && out.rounds < a.max_resample_rounds {
            out.rounds += 1;
            let fresh: Vec<usize> = flat
                .iter()
                .map(|&gi| spare.pop().unwrap_or(indices[gi]))
                .collect();
            let stream = counter_u32(cfg.run.seed, &[iteration as u32, out.rounds as u32, 0xD5]);
            let more = self.sample_and_verify(&fresh, stream, false)?;
            let fresh_logp = [&more.logp, &more.sampler_logp]
                .map(|lp| lp.as_ref().map(|lp| real_tokens(lp, &more.rows)));
            let fresh_support = more.support.as_ref().map(|s| real_tokens(s, &more.rows));
            for (rows, fresh_rows) in carried.iter_mut().zip(&fresh_logp) {
                if fresh_rows.is_none() {
                    *rows = None;
                }
            }
            match (&mut scored.greedy, &more.greedy) {
                (Some(greedy), Some(fresh_greedy)) => {
                    for (k, &gi) in flat.iter().enumerate() {
                        greedy[gi] = fresh_greedy[k].clone();
                    }
                }
                _ => scored.greedy = None,
            }
            for (k, &gi) in flat.iter().enumerate() {
                indices[gi] = fresh[k];
                for (rows, fresh_rows) in carried.iter_mut().zip(&fresh_logp) {
                    if let (Some(rows), Some(fresh_rows)) = (rows, fresh_rows) {
                        for j in 0..g {
                            rows[gi * g + j] = fresh_rows[k * g + j].clone();
                        }
                    }
                }
                // Asked of every pass alike: present in both or in neither.
                if let (Some(rows), Some(fresh_rows)) = (&mut support, &fresh_support) {
                    for j in 0..g {
                        rows[gi * g + j] = fresh_rows[k * g + j].clone();
                    }
                }
                for j in 0..g {
                    let (dst, src) = (gi * g + j, k * g + j);
                    scored.rows[dst] = more.rows[src].clone();
                    scored.closed[dst] = more.closed[src];
                    scored.rewards[dst] = more.rewards[src];
                    scored.exact[dst] = more.exact[src];
                }
            }
            out.groups += flat.len();
            flat = zero_std_groups(&scored.rewards, g);
        }
        // The replaced groups' advantages are stale; log-probs and greedy answers were carried.
        scored.advantages = None;
        [scored.logp, scored.sampler_logp] = if out.rounds == 0 {
            original
        } else {
            carried.map(|rows| rows.map(|rows| with_padding(&rows, 0.0)))
        };
        scored.support = if out.rounds == 0 {
            original_support
        } else {
            support.map(|rows| with_padding(&rows, u64::MAX))
        };
        Ok(out)
    }
}

/// `[rows·T]` per-token values (padded to the longest row) → each row's real tokens.
fn real_tokens<T: Clone>(logp: &[T], rows: &[Vec<u32>]) -> Vec<Vec<T>> {
    let t = logp.len() / rows.len().max(1);
    rows.iter()
        .enumerate()
        .map(|(i, r)| logp[i * t..i * t + r.len().min(t)].to_vec())
        .collect()
}

/// Rows of per-token values → `[rows·T]` padded to the longest (at least one position) with
/// `fill` (0 for log-probs, every token for a support): the padding positions of a batch whose
/// rows came from different sampling passes. The loss never reads them (they are masked), so
/// no forward pass is spent on them.
fn with_padding<T: Copy>(rows: &[Vec<T>], fill: T) -> Vec<T> {
    let t = rows.iter().map(|r| r.len()).max().unwrap_or(1).max(1);
    let mut out = vec![fill; rows.len() * t];
    for (i, r) in rows.iter().enumerate() {
        out[i * t..i * t + r.len()].copy_from_slice(r);
    }
    out
}
