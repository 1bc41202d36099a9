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

/// `distance`: positions where the response agrees with `sorted(prompt)`. A missing position
/// (a short answer) earns nothing; an extra one (a long answer) neither earns nor costs.
pub fn distance(prompt: &[u32], response: &[u32]) -> u32 {
    super::sort::with_sorted(prompt, |truth| {
        truth.iter().zip(response).filter(|(t, r)| t == r).count() as u32
    })
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
    // Most wrong answers are out of order or of another length: no sort for them.
    let maybe = response.len() == prompt.len() && response.is_sorted();
    (maybe && super::sort::with_sorted(prompt, |truth| truth == response)) as u32
}

/// One verifier's value (what `score` returns as `reward`, without building its parts).
pub fn value(kind: RewardKind, prompt: &[u32], response: &[u32]) -> f32 {
    match kind {
        RewardKind::Distance => distance(prompt, response) as f32,
        RewardKind::InclusionOrdering => {
            let (inc, ord) = inclusion_ordering_parts(prompt, response);
            (inc + ord) as f32
        }
        RewardKind::Exact => exact(prompt, response) as f32,
    }
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

    /// Largest possible reward for a length-`n` prompt and a length-`n` answer (the
    /// lecture model's; for charts and thresholds).
    pub fn max_reward(&self, n: usize) -> f32 {
        self.max_reward_at(n, n, true)
    }

    /// Largest possible reward for a length-`n` prompt and an answer of `len` tokens: the
    /// sorted prompt, then (past `n`) its largest element repeated. `inclusion_ordering`
    /// pays every adjacent pair of the answer, so a longer answer can earn more; `exact`
    /// needs `len = n` and, for the transformer, the closing `<eos>` (`closed`).
    pub fn max_reward_at(&self, n: usize, len: usize, closed: bool) -> f32 {
        self.terms
            .iter()
            .map(|(kind, w)| {
                let m = match kind {
                    RewardKind::Distance => n.min(len) as f32,
                    // Each prompt element is paid where its value appears at all: one
                    // token can pay for all n (a prompt of one repeated value).
                    RewardKind::InclusionOrdering => {
                        ((len > 0) as usize * n + len.saturating_sub(1)) as f32
                    }
                    RewardKind::Exact => (len == n && closed) as u8 as f32,
                };
                w.max(0.0) * m
            })
            .sum()
    }

    /// How many verifiers it sums.
    pub fn terms(&self) -> usize {
        self.terms.len()
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
            .map(|(kind, w)| w * value(*kind, prompt, response))
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

/// Largest possible reward of a run: the verifiers' maximum for `n` (for the transformer, over
/// every answer length up to `max_len`), plus the format reward and Kimi's best length reward
/// (+0.5) where they apply.
pub fn max_reward_of(c: &crate::config::RunConfig) -> f32 {
    let t = &c.task;
    let f = RewardFn::from_task(t);
    if c.model.kind != crate::config::ModelKind::Transformer {
        return f.max_reward(t.n);
    }
    // An answer of `len` tokens closes within `max_len` (the format reward; `exact` needs
    // it) when `len < max_len`; a truncated one holds `max_len` tokens. Which length pays
    // most depends on the weights: `inclusion_ordering` pays the longest.
    // The shaping terms as `shaping` pays them: DAPO's overlong penalty on the generated
    // tokens (`<eos>` included), and Kimi's length reward, whose best (+0.5) only a correct
    // answer can have (a wrong one's is ≤ 0).
    let max_len = c.max_len();
    let format = t.format_reward.max(0.0) as f32;
    let w = t.length_reward_weight.max(0.0) as f32;
    let best = (0..=max_len)
        .map(|len| {
            let closed = len < max_len;
            let shaping = match t.length_reward {
                crate::config::LengthReward::Overlong => {
                    w * overlong_penalty(len + closed as usize, max_len, t.overlong_buffer, !closed)
                }
                crate::config::LengthReward::Kimi if closed && len == t.n => 0.5 * w,
                _ => 0.0,
            };
            f.max_reward_at(t.n, len, closed) + if closed { format } else { 0.0 } + shaping
        })
        .fold(f32::MIN, f32::max);
    best.max(0.0)
}

/// A variable-length response of the autoregressive policy, as the verifiers see it.
#[derive(Debug, Clone, Copy)]
pub struct ArResponse<'a> {
    /// The answer: the tokens before `<eos>` (all of them when truncated).
    pub content: &'a [u32],
    /// Closed with `<eos>` within `max_len`.
    pub closed: bool,
    /// Generated tokens, `<eos>` included.
    pub length: usize,
}

impl<'a> ArResponse<'a> {
    /// Split generated tokens at the first `<eos>`.
    pub fn parse(tokens: &'a [u32], eos: u32) -> Self {
        match tokens.iter().position(|&t| t == eos) {
            Some(i) => Self {
                content: &tokens[..i],
                closed: true,
                length: i + 1,
            },
            None => Self {
                content: tokens,
                closed: false,
                length: tokens.len(),
            },
        }
    }

    /// `exact` for an autoregressive answer: sorted, of the exact length, and closed.
    pub fn exact(&self, prompt: &[u32]) -> bool {
        self.closed && exact(prompt, self.content) == 1
    }
}

/// Kimi k1.5's length reward for one group: `λ = 0.5 − (len − min)/(max − min)`; correct
/// answers get `λ`, wrong ones `min(0, λ)`; all lengths equal → 0.
pub fn kimi_length_rewards(lengths: &[usize], correct: &[bool]) -> Vec<f32> {
    let min = lengths.iter().copied().min().unwrap_or(0);
    let max = lengths.iter().copied().max().unwrap_or(0);
    lengths
        .iter()
        .zip(correct)
        .map(|(&len, &ok)| {
            if max == min {
                return 0.0;
            }
            let lambda = 0.5 - (len - min) as f32 / (max - min) as f32;
            if ok { lambda } else { lambda.min(0.0) }
        })
        .collect()
}

/// DAPO's soft overlong punishment with `L_max = max_len`, `L_cache = buffer`: 0 up to
/// `L_max − L_cache` tokens, then linearly down to −1 at `L_max`; −1 beyond (truncated).
pub fn overlong_penalty(length: usize, max_len: usize, buffer: usize, truncated: bool) -> f32 {
    let start = max_len.saturating_sub(buffer);
    if truncated || length > max_len {
        -1.0
    } else if length <= start {
        0.0
    } else {
        (start as f32 - length as f32) / buffer as f32
    }
}

/// The per-response shaping terms of an autoregressive answer under a run's config, the one
/// place they are computed: `(format, overlong)` — the format reward when it closed with
/// `<eos>`, DAPO's weighted overlong penalty (0 when off).
pub fn shaping(c: &crate::config::RunConfig, r: &ArResponse) -> (f32, f32) {
    let t = &c.task;
    let format = if r.closed {
        t.format_reward as f32
    } else {
        0.0
    };
    let overlong = if t.length_reward == crate::config::LengthReward::Overlong {
        t.length_reward_weight as f32
            * overlong_penalty(r.length, c.max_len(), t.overlong_buffer, !r.closed)
    } else {
        0.0
    };
    (format, overlong)
}

/// Rewards and exact-match flags of `B·G` responses (group-major) to `B` prompts under a run's
/// config: the weighted sum of [`reward_components`] — the verifiers and, for the transformer
/// (answers end at `<eos>` = `task.vocab`), the format, overlong and Kimi length terms.
pub fn score_batch(
    f: &RewardFn,
    c: &crate::config::RunConfig,
    prompts: &[&[u32]],
    rows: &[Vec<u32>],
    g: usize,
) -> (Vec<f32>, Vec<u32>) {
    let parts = reward_components(f, c, prompts, rows, g);
    let rewards = (0..rows.len())
        .map(|i| parts.iter().map(|(w, v)| w * v[i]).sum())
        .collect();
    let exact = if c.model.kind != crate::config::ModelKind::Transformer {
        // Each prompt sorted once for its G responses.
        let sorted: Vec<Vec<u32>> = prompts.iter().map(|p| super::sort::sorted(p)).collect();
        rows.iter()
            .enumerate()
            .map(|(i, r)| (sorted[i / g] == *r) as u32)
            .collect()
    } else {
        let eos = c.task.vocab as u32;
        rows.iter()
            .enumerate()
            .map(|(i, r)| ArResponse::parse(r, eos).exact(prompts[i / g]) as u32)
            .collect()
    };
    (rewards, exact)
}

/// Each reward of a run apart, `(weight, [B·G] values)`, whose weighted sum is
/// [`score_batch`]'s reward: each verifier of the task, and for the transformer the format,
/// overlong and Kimi length terms that are on. GDPO normalizes each before the sum
/// (`task.reward_aggregation = normalize_then_sum`).
pub fn reward_components(
    f: &RewardFn,
    c: &crate::config::RunConfig,
    prompts: &[&[u32]],
    rows: &[Vec<u32>],
    g: usize,
) -> Vec<(f32, Vec<f32>)> {
    let prompt = |i: usize| prompts[i / g];
    if c.model.kind != crate::config::ModelKind::Transformer {
        return f
            .terms
            .iter()
            .map(|&(kind, w)| {
                let v = rows
                    .iter()
                    .enumerate()
                    .map(|(i, r)| value(kind, prompt(i), r));
                (w, v.collect())
            })
            .collect();
    }
    let t = &c.task;
    let eos = t.vocab as u32;
    let parsed: Vec<ArResponse> = rows.iter().map(|r| ArResponse::parse(r, eos)).collect();
    let mut out: Vec<(f32, Vec<f32>)> = f
        .terms
        .iter()
        .map(|&(kind, w)| {
            let only = RewardFn {
                terms: vec![(kind, 1.0)],
            };
            let v = parsed
                .iter()
                .enumerate()
                .map(|(i, r)| only.reward_ar(prompt(i), r));
            (w, v.collect())
        })
        .collect();
    if t.format_reward != 0.0 {
        let closed = parsed.iter().map(|r| r.closed as u32 as f32).collect();
        out.push((t.format_reward as f32, closed));
    }
    let w = t.length_reward_weight as f32;
    match t.length_reward {
        crate::config::LengthReward::None => {}
        crate::config::LengthReward::Overlong => {
            let max_len = c.max_len();
            let p = parsed
                .iter()
                .map(|r| overlong_penalty(r.length, max_len, t.overlong_buffer, !r.closed));
            out.push((w, p.collect()));
        }
        crate::config::LengthReward::Kimi => {
            let mut v = Vec::with_capacity(rows.len());
            for (gi, group) in parsed.chunks(g).enumerate() {
                let lens: Vec<usize> = group.iter().map(|r| r.length).collect();
                let ok: Vec<bool> = group.iter().map(|r| r.exact(prompts[gi])).collect();
                v.extend(kimi_length_rewards(&lens, &ok));
            }
            out.push((w, v));
        }
    }
    out
}

impl RewardFn {
    /// The parts of a logged response (`<eos>` as the tokenizer's id) under a run's config:
    /// for the transformer, the verifiers on the answer, `exact` only when closed, and the
    /// format and overlong terms. (Kimi's length reward depends on the whole group: not here.)
    pub fn score_logged(
        &self,
        c: &crate::config::RunConfig,
        prompt: &[u32],
        tokens: &[u32],
    ) -> Reward {
        if c.model.kind != crate::config::ModelKind::Transformer {
            return self.score(prompt, tokens);
        }
        let r = ArResponse::parse(tokens, super::tokenizer::EOS_ID);
        let mut out = self.score(prompt, r.content);
        if let Some(e) = out.parts.get_mut("exact") {
            *e = r.exact(prompt) as u32 as f32;
        }
        if let Some(e) = out.parts.get_mut("exact/exact") {
            *e = r.exact(prompt) as u32 as f32;
        }
        let (format, overlong) = shaping(c, &r);
        if c.task.format_reward != 0.0 {
            out.parts.insert("format".into(), format);
        }
        if c.task.length_reward == crate::config::LengthReward::Overlong {
            out.parts.insert("overlong".into(), overlong);
        }
        out.parts.insert("length".into(), r.length as f32);
        out
    }

    /// The verifiers on an autoregressive answer: distance and inclusion_ordering on its
    /// content (missing or extra positions are wrong), `exact` only when closed.
    pub fn reward_ar(&self, prompt: &[u32], r: &ArResponse) -> f32 {
        self.terms
            .iter()
            .map(|(kind, w)| {
                let v = match kind {
                    RewardKind::Exact => r.exact(prompt) as u32 as f32,
                    k => score(*k, prompt, r.content).reward,
                };
                w * v
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;

    #[test]
    fn exact_and_distance_agree_with_the_sorted_prompt_on_random_cases() {
        let mut rng = SplitMix64::new(7);
        let mut counts = [0usize; 2];
        for case in 0..4000 {
            // Lengths past the stack buffer's 64 take the allocating path.
            let n = rng.below(if case % 10 == 0 { 80 } else { 9 }) as usize;
            let vocab = 1 + rng.below(6);
            let prompt: Vec<u32> = (0..n).map(|_| rng.below(vocab) as u32).collect();
            let truth = crate::task::sort::sorted(&prompt);
            let mut response = match case % 4 {
                0 => truth.clone(),
                1 => prompt.clone(),
                2 => (0..n).map(|_| rng.below(vocab) as u32).collect(),
                _ => {
                    let mut r: Vec<u32> = (0..n).map(|_| rng.below(vocab) as u32).collect();
                    r.sort_unstable();
                    r
                }
            };
            if case % 7 == 0 {
                response.truncate(n / 2);
            }
            let want = (truth == response) as u32;
            assert_eq!(exact(&prompt, &response), want, "{prompt:?} {response:?}");
            let same = truth.iter().zip(&response).filter(|(t, r)| t == r).count();
            assert_eq!(distance(&prompt, &response), same as u32);
            counts[want as usize] += 1;
        }
        assert!(counts[0] > 1000 && counts[1] > 1000, "{counts:?}");
    }

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

    /// The transformer's largest reward is the largest any answer of at most `max_len` tokens
    /// earns on any prompt: found by trying them all on a small task, for each verifier and
    /// a weighted mix (inclusion_ordering pays a longer answer more than the sorted one).
    #[test]
    fn the_transformers_max_reward_is_what_some_answer_earns() {
        let (n, vocab, max_len) = (3usize, 3u32, 5usize);
        let eos = vocab;
        for weights in [
            vec![("inclusion_ordering", 1.0)],
            vec![("distance", 1.0)],
            vec![("exact", 1.0)],
            vec![("exact", 1.0), ("distance", 0.2)],
            vec![("exact", 2.0), ("inclusion_ordering", 0.5)],
        ] {
            for overlong in [false, true] {
                let mut c = crate::config::RunConfig::preset("transformer-sort").unwrap();
                c.task.n = n;
                c.task.vocab = vocab as usize;
                c.task.max_len = max_len;
                c.task.format_reward = 0.2;
                c.task.reward_weights = weights.iter().map(|(k, w)| (k.to_string(), *w)).collect();
                if overlong {
                    // DAPO's penalty from 2 tokens on: the padded answer pays for its length.
                    c.task.length_reward = crate::config::LengthReward::Overlong;
                    c.task.length_reward_weight = 1.0;
                    c.task.overlong_buffer = 3;
                }
                let f = RewardFn::from_task(&c.task);
                let mut best = f32::MIN;
                let answers = (vocab + 1).pow(max_len as u32);
                for prompt in 0..vocab.pow(n as u32) {
                    let prompt: Vec<u32> = (0..n)
                        .map(|i| prompt / vocab.pow(i as u32) % vocab)
                        .collect();
                    for a in 0..answers {
                        let tokens: Vec<u32> = (0..max_len)
                            .map(|i| a / (vocab + 1).pow(i as u32) % (vocab + 1))
                            .collect();
                        let r = ArResponse::parse(&tokens, eos);
                        let (format, overlong) = shaping(&c, &r);
                        best = best.max(f.reward_ar(&prompt, &r) + format + overlong);
                    }
                }
                assert_eq!(max_reward_of(&c), best, "{weights:?}, overlong {overlong}");
            }
        }
    }

    #[test]
    fn eos_and_truncation() {
        let eos = 10;
        let p = [3, 1, 2];
        let closed = ArResponse::parse(&[1, 2, 3, 10, 10], eos);
        assert_eq!(
            (closed.content, closed.closed, closed.length),
            (&[1, 2, 3][..], true, 4)
        );
        assert!(closed.exact(&p));
        let trunc = ArResponse::parse(&[1, 2, 3], eos);
        assert!(!trunc.closed && !trunc.exact(&p));
        let long = ArResponse::parse(&[1, 2, 3, 3, 10], eos);
        assert!(!long.exact(&p));
        let short = ArResponse::parse(&[1, 2, 10], eos);
        assert!(!short.exact(&p));
        let f = RewardFn::single(RewardKind::Distance);
        assert_eq!(f.reward_ar(&p, &long), 3.0);
        assert_eq!(f.reward_ar(&p, &short), 2.0);
        let e = RewardFn::single(RewardKind::Exact);
        assert_eq!(e.reward_ar(&p, &closed), 1.0);
        assert_eq!(e.reward_ar(&p, &trunc), 0.0);
        let empty = ArResponse::parse(&[10], eos);
        assert_eq!((empty.content.len(), empty.length), (0, 1));
        assert_eq!(f.reward_ar(&p, &empty), 0.0);
    }

    #[test]
    fn length_rewards_worked_values() {
        // lengths 2..6: λ = 0.5, 0.25, 0, −0.25, −0.5
        let r = kimi_length_rewards(&[2, 3, 4, 5, 6], &[true, false, true, false, true]);
        assert_eq!(r, vec![0.5, 0.0, 0.0, -0.25, -0.5]);
        assert_eq!(kimi_length_rewards(&[4, 4], &[true, false]), vec![0.0, 0.0]);
        // L_max = 10, L_cache = 4: free up to 6, then −1/4 per token.
        assert_eq!(overlong_penalty(6, 10, 4, false), 0.0);
        assert_eq!(overlong_penalty(7, 10, 4, false), -0.25);
        assert_eq!(overlong_penalty(10, 10, 4, false), -1.0);
        assert_eq!(overlong_penalty(10, 10, 4, true), -1.0);
    }

    #[test]
    fn components_sum_to_the_reward() {
        // Transformer, two verifiers, format and each length reward; lecture, two verifiers.
        let mut rng = SplitMix64::new(7);
        for (preset, length) in [
            ("transformer-sort", "kimi"),
            ("transformer-sort", "overlong"),
            ("scaled", "none"),
        ] {
            let mut sets = vec![
                "task.reward_weights.exact=2".to_string(),
                "task.reward_weights.distance=0.5".into(),
            ];
            if preset != "scaled" {
                sets.push("task.format_reward=0.3".into());
                sets.push(format!("task.length_reward={length}"));
            }
            let c = crate::config::RunConfig::preset(preset)
                .unwrap()
                .with_overrides(&sets)
                .unwrap();
            let f = RewardFn::from_task(&c.task);
            let (g, n, vocab) = (4, c.task.n, c.task.vocab as u64);
            let prompts: Vec<Vec<u32>> = (0..3)
                .map(|_| (0..n).map(|_| rng.below(vocab) as u32).collect())
                .collect();
            let refs: Vec<&[u32]> = prompts.iter().map(|p| p.as_slice()).collect();
            let rows: Vec<Vec<u32>> = (0..3 * g)
                .map(|i| {
                    if i % 3 == 0 {
                        let mut s = super::super::sort::sorted(refs[i / g]);
                        if preset != "scaled" {
                            s.push(c.task.vocab as u32);
                        }
                        return s;
                    }
                    let len = if preset == "scaled" {
                        n
                    } else {
                        1 + rng.below(c.max_len() as u64) as usize
                    };
                    (0..len).map(|_| rng.below(vocab + 1) as u32).collect()
                })
                .collect();
            let (rewards, _) = score_batch(&f, &c, &refs, &rows, g);
            let parts = reward_components(&f, &c, &refs, &rows, g);
            let want = if preset == "scaled" { 2 } else { 4 };
            assert_eq!(parts.len(), want, "{preset} {length}");
            for (i, r) in rewards.iter().enumerate() {
                let sum: f32 = parts.iter().map(|(w, v)| w * v[i]).sum();
                assert!(
                    (sum - r).abs() < 1e-5,
                    "{preset} {length} row {i}: {sum} vs {r}"
                );
            }
        }
    }
}
