//! What the gradient lab asks of the policy it studies ([`Studied`]), and what it hands it: the
//! run's context, a batch's answers and an estimator's grouping and objective. The lecture's
//! tables (`LectureStudy` in `gradient.rs`) and the transformer's generations
//! (`TransformerStudy` in `sampled.rs`) answer it.

use super::exact::Truth;
use crate::config::RunConfig;
use crate::objective::loss::LossSettings;
use crate::task::RewardFn;

/// What the lab reads besides the policy: the run's config, its training prompts (J's
/// prompt distribution is uniform over them) and its reward.
pub struct Ctx<'a> {
    pub config: &'a RunConfig,
    pub prompts: &'a [Vec<u32>],
    pub reward: &'a RewardFn,
}

/// One batch's answers from π_θold, `budget` in a row per chosen prompt, with what every
/// estimator reads of them.
pub struct Drawn {
    /// Each answer's prompt (an index into the training prompts).
    pub xs: Vec<usize>,
    /// `[rows·T]`, padded after each answer's end (the lecture's answers: `T = n`, no padding).
    pub responses: Vec<u32>,
    /// `[rows·T]`: 1 for real tokens.
    pub mask: Vec<f32>,
    pub t: usize,
    pub rewards: Vec<f32>,
    /// `[rows·T]`
    pub old_logp: Vec<f32>,
    pub ref_logp: Vec<f32>,
}

/// What the lab asks of the policy it studies: the lecture's per-position tables
/// (`LectureStudy` in `gradient.rs`: answers enumerated, the truth exact) or the transformer's generations
/// (`TransformerStudy` in `sampled.rs`: a large-sample truth, labelled as such).
pub trait Studied {
    /// Batch `batch`'s answers from π_θold (`budget` per prompt of the batch).
    fn draw_old(&mut self, ctx: &Ctx, budget: usize, batch: usize) -> Drawn;
    /// An objective's gradient of the loss at θ on `d`'s answers as `e` groups them.
    fn loss_gradient(&mut self, ctx: &Ctx, d: &Drawn, e: &Estimator) -> Vec<f32>;
    /// One batch's k1, k2, k3 estimates of `KL(π_θ ‖ π_ref)` per answer, on answers from π_θ.
    fn kl_estimates(&mut self, ctx: &Ctx, budget: usize, batch: usize) -> [f64; 3];
    /// J, ∇J and the KL at θ: exact where the answers can be enumerated, else from `samples`.
    fn truth(&mut self, ctx: &Ctx, samples: usize) -> Truth;
}

/// One estimator on a batch: its groups' prompts (`[rows/G·n]`, one per group of `G`
/// answers), each answer's advantage (`[rows]`) and the objective's settings.
pub struct Estimator<'a> {
    pub group_prompts: &'a [u32],
    pub adv: &'a [f32],
    pub settings: &'a LossSettings,
}

/// The prompts of batch `batch`: the config's batch of the `p` training prompts, uniformly
/// without replacement (all of them when the batch is as large).
pub fn batch_prompts(c: &RunConfig, p: usize, batch: usize) -> Vec<usize> {
    let b = c.batch_prompts(p);
    let mut idx: Vec<usize> = (0..p).collect();
    if b < p {
        let mut rng =
            crate::rng::SplitMix64::for_stream(c.run.seed ^ (batch as u64) << 20, "gradient-lab");
        rng.shuffle(&mut idx);
        idx.truncate(b);
    }
    idx
}
