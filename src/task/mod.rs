//! The sorting task: prompts and splits, the verifiers, the tokenizer (spec §1).

pub mod reward;
pub mod sort;
pub mod tokenizer;

pub use reward::{Reward, RewardFn};
pub use sort::PromptSet;
pub use tokenizer::SortTokenizer;
