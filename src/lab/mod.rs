//! The labs: what grpo-lab's small, deterministic policies let it show exactly.
//!
//! - [`exact`]: the lecture policy's distribution written out — per-position log π tables, every
//!   answer enumerated, J(θ) = E[R], ∇J and the KL to the reference, exactly (or, past the
//!   enumeration's size, a large-sample estimate with its standard error, labelled as such).
//! - [`sampled`]: the transformer studied — answers drawn token by token, a large-sample truth
//!   with its standard error (its answers cannot be enumerated).
//! - [`gradient`]: the gradient lab (`grpo-lab gradient-lab`): every estimator's gradient,
//!   batch after independent batch at the same θ, against the true ∇J.
//!
//! Layer 4 (beside `train`): it drives a [`crate::grpo::Trainer`] to the θ it studies.

pub mod exact;
pub mod gradient;
pub mod sampled;
pub mod study;
