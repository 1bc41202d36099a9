//! The frozen batch of one iteration, the data every engine, the critic and the record read.

/// The frozen batch of one iteration: `B` prompts, `B·G` responses padded to `T`.
#[derive(Debug, Clone, Default)]
pub struct Batch {
    pub b: usize,
    pub g: usize,
    /// Padded width: `n` for the lecture model, the longest response for the transformer.
    pub t: usize,
    pub n: usize,
    /// `[B·n]`
    pub prompts: Vec<u32>,
    /// `[B·G·T]`, padded with `pad` after each response's end.
    pub responses: Vec<u32>,
    pub pad: u32,
    /// `[B·G·T]`: 1 for real tokens.
    pub mask: Vec<f32>,
    /// Tokens of each response.
    pub lengths: Vec<usize>,
    /// `[B·G·T]` the sampler's support at each token (bit `j` for token `j`), which the learner
    /// renormalises over (`sampling.keep_sampling_mask`); `None`: the full vocabulary.
    pub support: Option<Vec<u64>>,
}

impl Batch {
    /// `B` prompts of `n` tokens (`[B·n]`) and their `B·G` responses, padded with `pad` to the
    /// longest response (at least one position).
    pub fn padded(prompts: Vec<u32>, n: usize, rows: &[Vec<u32>], g: usize, pad: u32) -> Self {
        let t = rows.iter().map(|r| r.len()).max().unwrap_or(1).max(1);
        let mut responses = Vec::with_capacity(rows.len() * t);
        let mut mask = Vec::with_capacity(rows.len() * t);
        for r in rows {
            let real = r.len().min(t);
            responses.extend_from_slice(&r[..real]);
            responses.resize(responses.len() + t - real, pad);
            mask.resize(mask.len() + real, 1.0f32);
            mask.resize(mask.len() + t - real, 0.0);
        }
        Self {
            b: rows.len() / g.max(1),
            g,
            t,
            n,
            prompts,
            responses,
            pad,
            mask,
            lengths: rows.iter().map(|r| r.len()).collect(),
            support: None,
        }
    }

    /// Groups `range` (`[k·G, …)` rows) as a batch of their own, at the same padded width.
    pub fn groups(&self, range: std::ops::Range<usize>) -> Batch {
        let (g, t, n) = (self.g, self.t, self.n);
        let rows = range.start * g * t..range.end * g * t;
        Batch {
            b: range.len(),
            g,
            t,
            n,
            prompts: self.prompts[range.start * n..range.end * n].to_vec(),
            responses: self.responses[rows.clone()].to_vec(),
            pad: self.pad,
            mask: self.mask[rows.clone()].to_vec(),
            lengths: self.lengths[range.start * g..range.end * g].to_vec(),
            support: self.support.as_ref().map(|s| s[rows].to_vec()),
        }
    }
}
