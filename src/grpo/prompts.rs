//! Which training prompts an iteration uses (GRPO-SPEC §2, step 1): uniform without
//! replacement, prioritized by past failure (Kimi k1.5), or a curriculum from easy to hard.

use crate::config::{PromptSampling, RunConfig};
use crate::rng::SplitMix64;

/// The prompt sampler's state: each training prompt's last success rate (kept in checkpoints)
/// and the training prompts ordered from easy to hard.
#[derive(Debug, Clone)]
pub struct PromptSampler {
    /// Per training prompt: exact-match rate of its last group (prioritized sampling).
    pub success: Vec<f32>,
    /// Training prompt indices from easy to hard (curriculum).
    by_difficulty: Vec<usize>,
}

/// `b` of the training prompts, without replacement, each with weight `1 − success + 0.05`
/// (Kimi k1.5's prioritized sampling; the floor keeps solved prompts coming back now and then),
/// by Efraimidis–Spirakis keys `ln(u)/w`.
pub fn prioritized_indices(success: &[f32], b: usize, rng: &mut SplitMix64) -> Vec<usize> {
    let mut keyed: Vec<(f64, usize)> = success
        .iter()
        .enumerate()
        .map(|(i, &s)| {
            let w = (1.0 - s as f64).max(0.0) + 0.05;
            (rng.next_f64().max(1e-300).ln() / w, i)
        })
        .collect();
    keyed.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    keyed.into_iter().take(b).map(|(_, i)| i).collect()
}

/// Number of inversions of a prompt: 0 for a sorted one (the curriculum's difficulty).
pub fn inversions(p: &[u32]) -> usize {
    (0..p.len())
        .flat_map(|i| (i + 1..p.len()).map(move |j| (i, j)))
        .filter(|&(i, j)| p[i] > p[j])
        .count()
}

impl PromptSampler {
    pub fn new(train: &[Vec<u32>]) -> Self {
        let mut by_difficulty: Vec<usize> = (0..train.len()).collect();
        by_difficulty.sort_by_key(|&i| (inversions(&train[i]), i));
        Self {
            success: vec![0.0; train.len()],
            by_difficulty,
        }
    }

    /// Which training prompts an iteration uses, as a function of (seed, iteration) and, for
    /// prioritized sampling, of the success rates so far.
    pub fn indices(&self, config: &RunConfig, iteration: usize) -> Vec<usize> {
        let train = self.success.len();
        let b = config.batch_prompts(train);
        let mut idx: Vec<usize> = (0..train).collect();
        if b >= train {
            return idx;
        }
        let mut rng = SplitMix64::for_stream(
            config.run.seed ^ (iteration as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15),
            "batch",
        );
        match config.algorithm.prompt_sampling {
            PromptSampling::Uniform => {
                rng.shuffle(&mut idx);
                idx.truncate(b);
                idx
            }
            PromptSampling::Prioritized => prioritized_indices(&self.success, b, &mut rng),
            PromptSampling::Curriculum => {
                // The easiest quarter first, growing linearly to every prompt at mid-run.
                let half = (config.run.iterations / 2).max(1) as f64;
                let frac = (0.25 + 0.75 * iteration as f64 / half).min(1.0);
                let pool = ((train as f64 * frac).ceil() as usize).clamp(b, train);
                let mut pool: Vec<usize> = self.by_difficulty[..pool].to_vec();
                rng.shuffle(&mut pool);
                pool.truncate(b);
                pool
            }
        }
    }

    /// Remember each used prompt's success rate (`exact` is `[B·G]`).
    pub fn record(&mut self, indices: &[usize], exact: &[u32], g: usize) {
        for (k, &pi) in indices.iter().enumerate() {
            let hits: u32 = exact[k * g..(k + 1) * g].iter().sum();
            self.success[pi] = hits as f32 / g as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prioritized_sampling_prefers_unsolved_prompts() {
        // Prompts 0..50 always solved, 50..100 never.
        let success: Vec<f32> = (0..100).map(|i| if i < 50 { 1.0 } else { 0.0 }).collect();
        let mut rng = SplitMix64::new(1);
        let (mut unsolved, mut total) = (0, 0);
        for _ in 0..200 {
            let pick = prioritized_indices(&success, 10, &mut rng);
            let mut sorted = pick.clone();
            sorted.sort();
            sorted.dedup();
            assert_eq!(sorted.len(), 10, "without replacement");
            unsolved += pick.iter().filter(|&&i| i >= 50).count();
            total += pick.len();
        }
        // Weights 1.05 vs 0.05: about 95 % of the draws go to unsolved prompts.
        assert!(unsolved as f64 / total as f64 > 0.9, "{unsolved}/{total}");
    }

    #[test]
    fn inversions_count() {
        assert_eq!(inversions(&[0, 1, 2]), 0);
        assert_eq!(inversions(&[2, 1, 0]), 3);
        assert_eq!(inversions(&[1, 0, 1]), 1);
    }
}
