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
        while !flat.is_empty() && out.rounds < a.max_resample_rounds {
            out.rounds += 1;
            let fresh: Vec<usize> = flat
                .iter()
                .map(|&gi| spare.pop().unwrap_or(indices[gi]))
                .collect();
            let stream = counter_u32(cfg.run.seed, &[iteration as u32, out.rounds as u32, 0xD5]);
            let more = self.sample_and_verify(&fresh, stream, false)?;
            for (k, &gi) in flat.iter().enumerate() {
                indices[gi] = fresh[k];
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
        // The replaced groups' advantages, log-probs and greedy answers are stale.
        scored.advantages = None;
        scored.logp = None;
        scored.greedy = None;
        Ok(out)
    }
}
