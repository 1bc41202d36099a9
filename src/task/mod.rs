//! The sorting task: prompts and splits, the verifiers, the tokenizer (spec §1).

pub mod batch;
pub mod reward;
pub mod sort;
pub mod tokenizer;

pub use reward::{Reward, RewardFn};
pub use sort::PromptSet;
pub use tokenizer::SortTokenizer;

use crate::config::{ModelKind, RunConfig};

/// Whether `answer` (as an engine generated it) is an exactly sorted answer to `prompt`: for
/// the transformer, sorted, of the right length and closed with `<eos>`.
pub fn is_exact(config: &RunConfig, prompt: &[u32], answer: &[u32]) -> bool {
    if config.model.kind == ModelKind::Transformer {
        reward::ArResponse::parse(answer, config.task.vocab as u32).exact(prompt)
    } else {
        reward::exact(prompt, answer) == 1
    }
}

/// Fraction of exactly sorted answers.
pub fn accuracy(config: &RunConfig, prompts: &[&[u32]], answers: &[Vec<u32>]) -> f32 {
    let correct = prompts
        .iter()
        .zip(answers)
        .filter(|(p, a)| is_exact(config, p, a))
        .count();
    correct as f32 / prompts.len().max(1) as f32
}
