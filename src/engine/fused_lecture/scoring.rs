//! The passes of the fused lecture model that score and draw without an update: logits, each
//! token's log π (in buffers of their own or in the kept pass buffers), the rollout's draws and
//! the last step's per-token entropy.

use super::*;

impl FusedLecture {
    /// `log π` at `temperature` of every response token: `prompts [B·n]`, `responses
    /// [B·G·n]` → `[B·G·n]`, computed exactly as `step` computes it (over the sampler's
    /// `support [B·G·n]` when given).
    pub fn token_logp(
        &self,
        prompts: &[u32],
        responses: &[u32],
        temperature: f32,
        support: Option<&[u64]>,
    ) -> Vec<f32> {
        let mut sc = Scratch::default();
        let (inv_t, read) = (1.0 / temperature, Read::LogProbs);
        self.forward_parts(prompts, responses, support, inv_t, read, false, &mut sc);
        sc.logp
    }

    /// `G` responses per prompt drawn from `logits [B·n, V]` (this path's, of `B` prompts) as
    /// `sampling::sample_independent` draws them, the parts on the threads: `[B·G·n]`.
    pub fn sample(
        &self,
        logits: &[f32],
        g: usize,
        params: SamplingParams,
        key: (u64, u32),
    ) -> Vec<u32> {
        let (n, v) = (self.n, self.vocab);
        let b = logits.len() / (n * v).max(1);
        let ranges = self.parts_of(b);
        let mut out = vec![0u32; b * g * n];
        let mut parts: Vec<_> = split_by(&mut out, &ranges, g * n)
            .into_iter()
            .zip(&ranges)
            .collect();
        self.cores.each(&mut parts, |_, (out, r)| {
            let rows = &logits[r.start * n * v..r.end * n * v];
            sampling::sample_independent_into(rows, r.start, (n, v, g), params, key, out);
        });
        out
    }

    /// [`Self::logits`] into the kept pass buffers ([`Self::pass_logits`] reads them,
    /// [`Self::pass_logp`] can score from them).
    pub fn pass_forward(&mut self, prompts: &[u32]) {
        let mut sc = std::mem::take(&mut self.pass);
        self.forward_parts(prompts, &[], None, 1.0, Read::Logits, false, &mut sc);
        self.pass = sc;
    }

    /// The logits `[B·n, V]` of the last [`Self::pass_forward`].
    pub fn pass_logits(&self) -> &[f32] {
        &self.pass.f.logits
    }

    /// log π of `responses` (`[B·G·n]`, [`Self::token_logp`]'s values) in the kept pass
    /// buffers: from the logits the last [`Self::pass_forward`] left there (of the same
    /// `prompts`: the rollout's own) if `from_forward`, else through a forward of its own.
    pub fn pass_logp(
        &mut self,
        prompts: &[u32],
        responses: &[u32],
        temperature: f32,
        support: Option<&[u64]>,
        from_forward: bool,
    ) -> Vec<f32> {
        let mut sc = std::mem::take(&mut self.pass);
        let (inv_t, read, given) = (1.0 / temperature, Read::LogProbs, from_forward);
        self.forward_parts(prompts, responses, support, inv_t, read, given, &mut sc);
        let logp = self.cores.to_vec(&sc.logp);
        self.pass = sc;
        logp
    }

    /// `logits [B, n, V]` of the current weights (for rollouts and evaluation).
    pub fn logits(&self, prompts: &[u32]) -> Vec<f32> {
        let mut sc = Scratch::default();
        self.forward_parts(prompts, &[], None, 1.0, Read::Logits, false, &mut sc);
        sc.f.logits
    }

    /// Each token's entropy `H_t` as the last [`Self::step`] read it (before its update), for
    /// the first `rows` of its `[B·G]` responses of `g` per prompt: `[rows·n]` (a lecture
    /// model's distribution at a position depends on the prompt alone, so a token's entropy is
    /// its (prompt, position) row's).
    pub fn token_entropy(&self, g: usize, rows: usize) -> Vec<f32> {
        let (n, h) = (self.n, &self.scratch.step_h);
        let mut out = Vec::with_capacity(rows * n);
        for r in 0..rows {
            let prompt = r / g.max(1);
            match h.get(prompt * n..(prompt + 1) * n) {
                Some(row) => out.extend_from_slice(row),
                None => break,
            }
        }
        out
    }
}
