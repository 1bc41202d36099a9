//! The verifiers (spec §1). Each is a pure function of prompt and response, and
//! returns the reward with its parts so the app and `grpo-lab score` can show
//! where a number came from.

use crate::config::{RewardKind, TaskConfig};
use serde::Serialize;
use std::collections::BTreeMap;

/// A reward and its named parts.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Reward {
    pub reward: f32,
    pub parts: BTreeMap<String, f32>,
}

/// `distance`: positions where the response agrees with `sorted(prompt)`.
/// Missing or extra positions (variable-length responses) count as wrong.
pub fn distance(prompt: &[u32], response: &[u32]) -> u32 {
    let truth = super::sort::sorted(prompt);
    truth.iter().zip(response).filter(|(t, r)| t == r).count() as u32
}

/// `inclusion_ordering`, in its two parts: (prompt elements found in the response,
/// each occurrence counted; adjacent non-decreasing pairs of the response).
pub fn inclusion_ordering_parts(prompt: &[u32], response: &[u32]) -> (u32, u32) {
    let inclusion = prompt.iter().filter(|x| response.contains(x)).count() as u32;
    let ordering = response.windows(2).filter(|w| w[0] <= w[1]).count() as u32;
    (inclusion, ordering)
}

/// `exact`: 1 if the response is `sorted(prompt)`, else 0.
pub fn exact(prompt: &[u32], response: &[u32]) -> u32 {
    (super::sort::sorted(prompt) == response) as u32
}

/// One verifier with its parts.
pub fn score(kind: RewardKind, prompt: &[u32], response: &[u32]) -> Reward {
    let mut parts = BTreeMap::new();
    let reward = match kind {
        RewardKind::Distance => {
            let d = distance(prompt, response);
            parts.insert("matching_positions".into(), d as f32);
            d as f32
        }
        RewardKind::InclusionOrdering => {
            let (inc, ord) = inclusion_ordering_parts(prompt, response);
            parts.insert("inclusion".into(), inc as f32);
            parts.insert("ordering".into(), ord as f32);
            (inc + ord) as f32
        }
        RewardKind::Exact => {
            let e = exact(prompt, response);
            parts.insert("exact".into(), e as f32);
            e as f32
        }
    };
    Reward { reward, parts }
}

/// The task's reward: one verifier, or a weighted sum of several.
#[derive(Debug, Clone, PartialEq)]
pub struct RewardFn {
    terms: Vec<(RewardKind, f32)>,
}

impl RewardFn {
    pub fn single(kind: RewardKind) -> Self {
        Self {
            terms: vec![(kind, 1.0)],
        }
    }

    pub fn from_task(task: &TaskConfig) -> Self {
        if task.reward_weights.is_empty() {
            return Self::single(task.reward);
        }
        let terms = task
            .reward_weights
            .iter()
            .filter_map(|(k, w)| RewardKind::parse(k).map(|kind| (kind, *w as f32)))
            .collect();
        Self { terms }
    }

    /// Largest possible reward for a length-`n` prompt (for charts and thresholds).
    pub fn max_reward(&self, n: usize) -> f32 {
        self.terms
            .iter()
            .map(|(kind, w)| {
                let m = match kind {
                    RewardKind::Distance => n as f32,
                    RewardKind::InclusionOrdering => (2 * n).saturating_sub(1) as f32,
                    RewardKind::Exact => 1.0,
                };
                w.max(0.0) * m
            })
            .sum()
    }

    pub fn describe(&self) -> String {
        if self.terms.len() == 1 && self.terms[0].1 == 1.0 {
            return self.terms[0].0.name().into();
        }
        self.terms
            .iter()
            .map(|(k, w)| format!("{w}·{}", k.name()))
            .collect::<Vec<_>>()
            .join(" + ")
    }

    /// Weights of `[distance, exact, inclusion_ordering]`, the verifier kernel's order.
    pub fn kernel_weights(&self) -> [f32; 3] {
        let mut w = [0.0f32; 3];
        for (kind, x) in &self.terms {
            let i = match kind {
                RewardKind::Distance => 0,
                RewardKind::Exact => 1,
                RewardKind::InclusionOrdering => 2,
            };
            w[i] += x;
        }
        w
    }

    /// The reward only (the trainer's hot path).
    pub fn reward(&self, prompt: &[u32], response: &[u32]) -> f32 {
        self.terms
            .iter()
            .map(|(kind, w)| w * score(*kind, prompt, response).reward)
            .sum()
    }

    /// The reward with every part, parts of weighted terms prefixed by their verifier.
    pub fn score(&self, prompt: &[u32], response: &[u32]) -> Reward {
        if self.terms.len() == 1 && self.terms[0].1 == 1.0 {
            return score(self.terms[0].0, prompt, response);
        }
        let mut parts = BTreeMap::new();
        let mut total = 0.0;
        for (kind, w) in &self.terms {
            let r = score(*kind, prompt, response);
            for (name, v) in r.parts {
                parts.insert(format!("{}/{name}", kind.name()), v);
            }
            parts.insert(kind.name().to_string(), r.reward);
            total += w * r.reward;
        }
        Reward {
            reward: total,
            parts,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;

    #[test]
    fn spec_worked_values() {
        let prompt = [3, 1, 0, 2];
        // (response, distance, inclusion, ordering, exact) from GRPO-SPEC §1.
        let table: [([u32; 4], u32, u32, u32, u32); 3] = [
            ([0, 1, 2, 3], 4, 4, 3, 1),
            ([7, 2, 2, 5], 1, 1, 2, 0),
            ([0, 3, 1, 2], 1, 4, 2, 0),
        ];
        for (resp, d, inc, ord, ex) in table {
            assert_eq!(distance(&prompt, &resp), d, "{resp:?}");
            assert_eq!(
                inclusion_ordering_parts(&prompt, &resp),
                (inc, ord),
                "{resp:?}"
            );
            assert_eq!(exact(&prompt, &resp), ex, "{resp:?}");
            assert_eq!(
                score(RewardKind::InclusionOrdering, &prompt, &resp).reward,
                (inc + ord) as f32
            );
        }
    }

    #[test]
    fn gameable_reward_scores_constant_outputs_high() {
        // [0,0,0,0] scores 1 + 3 = 4 of 7 on inclusion_ordering: the hack the app must show.
        assert_eq!(
            inclusion_ordering_parts(&[3, 1, 0, 2], &[0, 0, 0, 0]),
            (1, 3)
        );
    }

    /// Plain restatements of the verifiers, written differently, on random cases.
    #[test]
    fn random_cases_match_plain_reference() {
        let mut rng = SplitMix64::new(11);
        for _ in 0..5000 {
            let n = 1 + rng.below(7) as usize;
            let vocab = 1 + rng.below(9);
            let prompt: Vec<u32> = (0..n).map(|_| rng.below(vocab) as u32).collect();
            let len = rng.below(n as u64 + 3) as usize;
            let resp: Vec<u32> = (0..len).map(|_| rng.below(vocab) as u32).collect();
            let mut truth = prompt.clone();
            truth.sort();
            let mut d = 0;
            for i in 0..n.min(len) {
                if truth[i] == resp[i] {
                    d += 1;
                }
            }
            let mut inc = 0;
            for x in &prompt {
                if resp.iter().any(|r| r == x) {
                    inc += 1;
                }
            }
            let mut ord = 0;
            for i in 1..len {
                if resp[i - 1] <= resp[i] {
                    ord += 1;
                }
            }
            assert_eq!(distance(&prompt, &resp), d);
            assert_eq!(inclusion_ordering_parts(&prompt, &resp), (inc, ord));
            assert_eq!(exact(&prompt, &resp), (truth == resp) as u32);
            if len == n {
                assert!(inc + ord <= (2 * n - 1) as u32);
            }
        }
    }

    #[test]
    fn weighted_sum() {
        let mut task = TaskConfig::default();
        task.reward_weights.insert("exact".into(), 2.0);
        task.reward_weights.insert("distance".into(), 0.5);
        let f = RewardFn::from_task(&task);
        let r = f.score(&[3, 1, 0, 2], &[0, 1, 2, 3]);
        assert_eq!(r.reward, 2.0 * 1.0 + 0.5 * 4.0);
        assert_eq!(f.reward(&[3, 1, 0, 2], &[0, 3, 1, 2]), 0.5);
        assert_eq!(r.parts["exact"], 1.0);
        assert_eq!(f.max_reward(4), 4.0);
    }
}
