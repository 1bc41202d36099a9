//! What a config will ask of memory, from the config alone, before anything is allocated:
//! the prompts, the parameters and their optimizer state, the rollout's and the backward
//! pass's activations, the cold start's batch. Coarse on purpose (within a small factor of
//! what burn allocates): it exists to refuse `task.train_size = 10⁹` with a sentence instead
//! of an allocator abort, not to plan a cluster.

use crate::config::{ModelKind, RunConfig};

/// One part of the estimate: what, which config fields drive it, bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct Part {
    pub what: &'static str,
    pub fields: &'static str,
    pub bytes: u128,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Estimate {
    pub parts: Vec<Part>,
}

const F32: u128 = 4;
/// burn's autodiff keeps each op's inputs; a tape holds a few copies of each activation.
const TAPE: u128 = 3;

fn mib(bytes: u128) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

impl Estimate {
    pub fn total(&self) -> u128 {
        self.parts.iter().map(|p| p.bytes).sum()
    }

    pub fn total_mib(&self) -> f64 {
        mib(self.total())
    }

    /// The parts that make up most of the total, largest first, as "what (fields) N MiB".
    pub fn drivers(&self) -> String {
        let mut parts = self.parts.clone();
        parts.sort_by_key(|p| std::cmp::Reverse(p.bytes));
        let total = self.total().max(1);
        let mut shown = Vec::new();
        let mut covered = 0u128;
        for p in parts {
            if covered * 10 >= total * 9 && !shown.is_empty() {
                break;
            }
            covered += p.bytes;
            shown.push(format!("{} ({}) {:.0} MiB", p.what, p.fields, mib(p.bytes)));
        }
        shown.join("; ")
    }

    /// The estimate as a table, one part a line.
    pub fn table(&self) -> String {
        let mut out = String::new();
        for p in &self.parts {
            out.push_str(&format!(
                "{:>12.1} MiB  {} ({})\n",
                mib(p.bytes),
                p.what,
                p.fields
            ));
        }
        out.push_str(&format!("{:>12.1} MiB  total\n", self.total_mib()));
        out
    }
}

/// The estimate of a (validated) config.
pub fn estimate(c: &RunConfig) -> Estimate {
    let (t, m, a) = (&c.task, &c.model, &c.algorithm);
    let u = |x: usize| x as u128;
    let prompts = if t.prompts.is_empty() {
        u(t.train_size).saturating_add(u(t.heldout_size))
    } else {
        u(t.prompts.len()).saturating_add(u(t.heldout_size))
    };
    let b = if a.prompts_per_iteration == 0 {
        if t.prompts.is_empty() {
            u(t.train_size)
        } else {
            u(t.prompts.len())
        }
    } else {
        u(a.prompts_per_iteration)
    };
    let g = u(a.num_generations);
    let n = u(t.n);
    // A prompt is a Vec<u32>: its numbers and a 24-byte header; the split keeps an index too.
    let mut parts = vec![Part {
        what: "prompt set",
        fields: "task.train_size, task.heldout_size, task.n",
        bytes: prompts.saturating_mul(n * F32 + 32),
    }];
    let (params, rollout, backward, sft) = model_bytes(c, b, g);
    let (model_fields, act_fields) = match m.kind {
        ModelKind::Lecture => (
            "task.vocab, task.n, model.d_model",
            "algorithm.prompts_per_iteration, algorithm.num_generations, task.n, task.vocab",
        ),
        ModelKind::Transformer => (
            "model.d_model, model.d_ff, model.layers, model.context",
            "algorithm.prompts_per_iteration, algorithm.num_generations, task.max_len, model.d_model, model.d_ff, model.layers",
        ),
    };
    // Policy, reference, gradient, Adam's two moments.
    parts.push(Part {
        what: "parameters, reference, gradients, Adam state",
        fields: model_fields,
        bytes: params.saturating_mul(5 * F32),
    });
    parts.push(Part {
        what: "rollout (sampling, log π_old / π_ref)",
        fields: act_fields,
        bytes: rollout,
    });
    parts.push(Part {
        what: "optimizer step's activations",
        fields: act_fields,
        bytes: backward,
    });
    if c.algorithm.advantage == crate::config::AdvantageMode::Gae {
        let critic = crate::objective::value::ValueModel::parameter_count(
            t.n,
            t.vocab,
            c.max_len(),
            c.algorithm.value_hidden,
        );
        // Weights, Adam's two moments, the gradient; one hidden layer per state of the batch.
        let states = b
            .saturating_mul(u(c.algorithm.num_generations))
            .saturating_mul(u(c.max_len()));
        parts.push(Part {
            what: "PPO's critic (advantage = gae)",
            fields: "algorithm.value_hidden, task.n, task.vocab, task.max_len",
            bytes: u(critic)
                .saturating_mul(4 * F32)
                .saturating_add(states.saturating_mul(u(c.algorithm.value_hidden) * F32)),
        });
    }
    if c.sft.steps > 0 {
        parts.push(Part {
            what: "cold start batch",
            fields: "sft.batch_size, model.*",
            bytes: sft,
        });
    }
    Estimate { parts }
}

/// `(parameters, rollout bytes, backward bytes, cold-start bytes)` of the policy for `b`
/// prompts of `g` responses.
fn model_bytes(c: &RunConfig, b: u128, g: u128) -> (u128, u128, u128, u128) {
    let (t, m) = (&c.task, &c.model);
    let u = |x: usize| x as u128;
    let (n, d, len) = (u(t.n), u(m.d_model), u(c.max_len()));
    match m.kind {
        ModelKind::Lecture => {
            let v = u(t.vocab);
            let params = v * d + 2 * n * d * d;
            let logits = b.saturating_mul(n).saturating_mul(v).saturating_mul(F32);
            let tokens = b
                .saturating_mul(g)
                .saturating_mul(n)
                .saturating_mul(F32 * 8);
            let act = b.saturating_mul(n * d + n * v).saturating_mul(F32 * TAPE);
            let sft = u(c.sft.batch_size).saturating_mul((n * d + n * v) * F32 * TAPE);
            (
                params,
                logits.saturating_add(tokens),
                act.saturating_add(tokens),
                sft,
            )
        }
        ModelKind::Transformer => {
            let v = u(t.vocab) + 1;
            let ff = u(if m.d_ff == 0 { 4 * m.d_model } else { m.d_ff });
            let (layers, heads, ctx) = (u(m.layers), u(m.heads), u(m.context));
            let per_layer = 4 * d * d + 2 * d * ff + 9 * d + ff;
            let params = v * d + ctx * d + layers.saturating_mul(per_layer) + d * v + 2 * d;
            let seq = n + len;
            // Per sequence position: the residual stream, q/k/v, the MLP's hidden layer, and
            // the attention scores over the sequence, in every layer; the logits.
            let per_token = layers.saturating_mul(8 * d + 2 * ff + 2 * heads * seq) + 2 * v;
            let rows = b.saturating_mul(g);
            let rollout = rows
                .saturating_mul(seq)
                .saturating_mul(per_token)
                .saturating_mul(F32);
            let backward = rollout.saturating_mul(TAPE);
            let sft = u(c.sft.batch_size)
                .saturating_mul(seq)
                .saturating_mul(per_token)
                .saturating_mul(F32 * TAPE);
            (params, rollout, backward, sft)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_are_small_and_absurd_sizes_are_huge() {
        for p in ["lecture17", "scaled", "transformer-sort"] {
            let e = estimate(&RunConfig::preset(p).unwrap());
            assert!(e.total_mib() < 1024.0, "{p}: {}", e.table());
        }
        let mut c = RunConfig::preset("random-sort").unwrap();
        c.task.train_size = 1_000_000_000;
        let e = estimate(&c);
        assert!(e.total_mib() > 24.0 * 1024.0, "{}", e.table());
        assert!(e.drivers().contains("task.train_size"), "{}", e.drivers());
        let mut c = RunConfig::preset("transformer-sort").unwrap();
        c.model.d_ff = 1_000_000_000;
        assert!(estimate(&c).drivers().contains("model.d_ff"));
        let mut c = RunConfig::preset("transformer-sort").unwrap();
        c.sft.batch_size = 1_000_000_000;
        assert!(estimate(&c).drivers().contains("sft.batch_size"));
    }
}
