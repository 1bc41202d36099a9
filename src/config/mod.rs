//! `RunConfig`: every knob of a run, as one TOML document.
//!
//! Knob names follow what TRL / verl users know (`num_generations`, `epsilon_low`,
//! `beta`, `loss_agg_mode`, ...). Each field has a one-line doc here; [`FIELDS`] is the
//! one table of every key with its label, help (usual range, the paper, the TRL / verl
//! name) and valid range: `validate` checks it, the app shows it as tooltips and
//! [`config_docs`] prints it (`grpo-lab config-docs`). Presets live in
//! `assets/experiments/*.toml`; a run directory keeps the exact config it ran with as
//! `config.toml`; [`RunConfig::layered`] builds one from a preset, a file and `--set`s.

mod fields;
mod objective;
mod share;
mod toml_layers;
use fields::json_path;
pub use fields::*;
use serde::{Deserialize, Serialize};
use std::path::Path;
use thiserror::Error;
pub use toml_layers::get_path;
use toml_layers::*;

/// A problem with a config: names the field and, where there is a choice, the allowed values.
#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("unknown preset `{name}`; available presets: {available}")]
    UnknownPreset { name: String, available: String },
    #[error("unknown config key `{key}`; allowed keys here: {allowed}")]
    UnknownKey { key: String, allowed: String },
    #[error("invalid value for `{key}`: {reason}")]
    InvalidValue { key: String, reason: String },
    #[error("`--set` expects key=value, got `{0}`")]
    BadAssignment(String),
    #[error("cannot read config file {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("config file {path} is not valid TOML: {reason}")]
    Parse { path: String, reason: String },
    /// A shared one-line config (a link's, **Load line**'s), which is JSON.
    #[error("the shared line is not a valid config: {0}")]
    SharedLine(String),
}

/// The whole run: what to learn, with what model, by which algorithm.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    pub task: TaskConfig,
    pub model: ModelConfig,
    pub algorithm: AlgorithmConfig,
    pub optimizer: OptimizerConfig,
    pub sampling: SamplingConfig,
    pub sft: SftConfig,
    pub run: RunSettings,
}

/// Optional supervised cold start before RL (DeepSeek-R1's recipe): a few steps of
/// cross-entropy on correct (prompt, sorted) pairs. `steps = 0` is pure RL ("R1-Zero").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SftConfig {
    /// Supervised steps before the first GRPO iteration (0 = none).
    pub steps: usize,
    /// Distinct training prompts used as (prompt, sorted) examples.
    pub examples: usize,
    /// Examples per supervised step.
    pub batch_size: usize,
    /// Adam learning rate of the cold start.
    pub lr: f64,
    /// Distillation: `none` (the targets are the sorted prompts), or a preset whose policy —
    /// trained first, with this run's seed, on the same task — samples the targets.
    pub teacher: String,
}

impl Default for SftConfig {
    fn default() -> Self {
        Self {
            steps: 0,
            examples: 256,
            batch_size: 64,
            lr: 1e-3,
            teacher: "none".into(),
        }
    }
}

/// The sorting task (spec §1).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TaskConfig {
    /// Prompt length: how many numbers to sort (lecture: 3).
    pub n: usize,
    /// Numbers are drawn from `0..vocab` (lecture: 5).
    pub vocab: usize,
    /// Fixed training prompts (the lecture's three). Empty: draw `train_size` random prompts.
    pub prompts: Vec<Vec<u32>>,
    /// Number of random training prompts when `prompts` is empty.
    pub train_size: usize,
    /// Number of held-out prompts, disjoint from the training ones (0 disables).
    pub heldout_size: usize,
    /// Whether random prompts may repeat a number (`[2,2,0]`).
    pub allow_repeats: bool,
    /// The verifier: `distance`, `inclusion_ordering` or `exact` (spec §1).
    pub reward: RewardKind,
    /// Optional weighted sum of verifiers, e.g. `{ exact = 1.0, distance = 0.2 }`; overrides `reward`.
    pub reward_weights: std::collections::BTreeMap<String, f64>,
    /// Longest response in tokens, `<eos>` included (transformer only; 0 = n + 1).
    pub max_len: usize,
    /// Format reward: added when the response closes with `<eos>` within `max_len` (transformer; 0 = off).
    pub format_reward: f64,
    /// Length reward: none, kimi (Kimi k1.5, group-relative) or overlong (DAPO soft overlong punishment).
    pub length_reward: LengthReward,
    /// Weight of the length reward (Kimi k1.5 and DAPO: 1.0).
    pub length_reward_weight: f64,
    /// DAPO's `L_cache`: the last this-many tokens before `max_len` are penalised linearly.
    pub overlong_buffer: usize,
    /// How several rewards (the verifiers of `reward_weights`, format, length) become the one
    /// the advantage reads: `sum_then_normalize` (the weighted sum) or `normalize_then_sum`
    /// (GDPO: each normalized within its group first; TRL `multi_objective_aggregation`).
    pub reward_aggregation: RewardAggregation,
}

impl TaskConfig {
    /// How many distinct prompts exist for n and vocab (saturating).
    pub fn prompt_space(&self) -> u128 {
        let mut total: u128 = 1;
        for i in 0..self.n {
            let choices = if self.allow_repeats {
                self.vocab as u128
            } else {
                (self.vocab as u128).saturating_sub(i as u128)
            };
            total = total.saturating_mul(choices);
        }
        total
    }

    /// How many distinct prompts the held-out split may draw: those of the prompt space that
    /// are not fixed training prompts (the whole space with random prompts, which then share
    /// it with `train_size`). A fixed prompt outside the space (a repeat with
    /// `allow_repeats = false`) takes nothing from it.
    pub fn heldout_room(&self) -> u128 {
        let fixed: std::collections::HashSet<&Vec<u32>> = self
            .prompts
            .iter()
            .filter(|p| self.allow_repeats || distinct(p))
            .collect();
        self.prompt_space().saturating_sub(fixed.len() as u128)
    }
}

/// Whether a prompt's numbers are all different.
fn distinct(p: &[u32]) -> bool {
    let mut seen = std::collections::HashSet::new();
    p.iter().all(|x| seen.insert(x))
}

impl Default for TaskConfig {
    fn default() -> Self {
        Self {
            n: 3,
            vocab: 5,
            prompts: vec![vec![1, 0, 2], vec![3, 2, 4], vec![1, 2, 3]],
            train_size: 0,
            heldout_size: 32,
            allow_repeats: true,
            reward: RewardKind::InclusionOrdering,
            reward_weights: Default::default(),
            max_len: 0,
            format_reward: 0.0,
            length_reward: LengthReward::None,
            length_reward_weight: 1.0,
            overlong_buffer: 4,
            reward_aggregation: RewardAggregation::SumThenNormalize,
        }
    }
}

/// The verifiers of spec §1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RewardKind {
    Distance,
    InclusionOrdering,
    Exact,
}

impl RewardKind {
    pub const ALL: [RewardKind; 3] = [Self::Distance, Self::InclusionOrdering, Self::Exact];
    /// The names a config file uses, in the order of [`Self::ALL`].
    pub const NAMES: &'static [&'static str] = &["distance", "inclusion_ordering", "exact"];
    pub fn name(self) -> &'static str {
        match self {
            Self::Distance => "distance",
            Self::InclusionOrdering => "inclusion_ordering",
            Self::Exact => "exact",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.name() == s)
    }
}

/// The policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelConfig {
    /// Which policy: `lecture` (per-position model of the lecture, spec §6) or `transformer`
    /// (a small causal transformer answering token by token until `<eos>`).
    pub kind: ModelKind,
    /// Embedding width `D` (lecture: 10; transformer: a multiple of `heads`).
    pub d_model: usize,
    /// Multiplies the initial weights (1.0 = the lecture's init / GPT-2's; smaller = closer to uniform).
    pub init_scale: f64,
    /// Transformer blocks.
    pub layers: usize,
    /// Attention heads per block (`d_model` must be a multiple).
    pub heads: usize,
    /// MLP width (0 = 4·d_model).
    pub d_ff: usize,
    /// Longest sequence the transformer reads: must hold `task.n + task.max_len − 1`.
    pub context: usize,
    /// Token ids the transformer embeds (0 = from the task: `task.vocab` numbers + `<eos>`).
    pub vocab: usize,
}

impl Default for ModelConfig {
    fn default() -> Self {
        Self {
            kind: ModelKind::Lecture,
            d_model: 10,
            init_scale: 1.0,
            layers: 2,
            heads: 4,
            d_ff: 0,
            context: 32,
            vocab: 0,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelKind {
    Lecture,
    Transformer,
}

impl ModelKind {
    /// The names a config file uses.
    pub const NAMES: &'static [&'static str] = &["lecture", "transformer"];
}

/// GRPO itself (spec §2–§4).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AlgorithmConfig {
    /// Responses sampled per prompt, the group size `G` (lecture: 10).
    pub num_generations: usize,
    /// Prompts per iteration `B` (0 = every training prompt each iteration).
    pub prompts_per_iteration: usize,
    /// Optimizer steps on one batch of rollouts, `μ` (lecture: 10).
    pub mu: usize,
    /// How group rewards become advantages: raw, centered, normalized (GRPO), max, rloo, batch_normalized.
    pub advantage: AdvantageMode,
    /// The k of `advantage = passk_analytic` (the Pass@k that training optimizes; not
    /// `run.pass_k`, the evaluation's).
    pub passk_advantage_k: usize,
    /// W-REINFORCE's λ: positive advantages are multiplied by it (PSR alone: negative_weight
    /// 0; 1 = off).
    pub positive_weight: f64,
    /// Negative advantages are multiplied by it (NSR alone: positive_weight 0; 1 = off).
    pub negative_weight: f64,
    /// Per-token objective: naive (`-A·logπ`), unclipped (`-A·ρ`), clipped (PPO).
    pub loss: LossMode,
    /// Where the ratio lives: token (PPO, GRPO), sequence (GSPO), sequence_token (GSPO-token).
    pub importance_sampling_level: ImportanceSamplingLevel,
    /// Lower clip range ε_low for the ratio (PPO: 0.2; lecture: 0.01).
    pub epsilon_low: f64,
    /// Upper clip range ε_high (PPO: 0.2; DAPO clip-higher: 0.28).
    pub epsilon_high: f64,
    /// verl's dual clip `c` (`clip_ratio_c`): for A < 0 the clipped loss is capped at c·|A| (0 = off).
    pub dual_clip: f64,
    /// TRL's `delta` (INTELLECT-2): the unclipped branch's ratio capped at δ (0 = off).
    pub delta: f64,
    /// CISPO's cap on the detached ratio (TRL: epsilon_high read as a ratio; ScaleRL: 5).
    pub cispo_max_ratio: f64,
    /// SAPO's gate temperature τ for A > 0.
    pub sapo_temperature_pos: f64,
    /// SAPO's gate temperature τ for A ≤ 0.
    pub sapo_temperature_neg: f64,
    /// KL coefficient β toward the reference policy (0 = no KL and no reference).
    pub beta: f64,
    /// KL estimator: k1, k2 or k3 (GRPO: k3).
    pub kl_estimator: KlEstimator,
    /// Where the KL goes: `loss` (GRPO: `+β·KL`) or `reward` (PPO-RLHF: `r - β·KL`).
    pub kl_penalty: KlPenaltyMode,
    /// Refresh the reference to a copy of the policy every this many iterations (lecture: 10; 0 = never).
    pub ref_period: usize,
    /// Token aggregation: seq-mean-token-mean (GRPO), token-mean (DAPO), seq-mean-token-sum-norm (Dr. GRPO).
    pub loss_agg_mode: LossAggMode,
    /// Entropy bonus: `− coef · H` is added to the loss (0 = off; with `adaptive_entropy`,
    /// the coefficient's starting value).
    pub entropy_coef: f64,
    /// Skywork-OR1's adaptive entropy coefficient (TRL `use_adaptive_entropy`): after each
    /// optimizer step the coefficient moves by `entropy_coef_delta` toward keeping the
    /// entropy at `entropy_target`, and applies only while the entropy is at or below it.
    pub adaptive_entropy: bool,
    /// The entropy the adaptive coefficient steers to (TRL 0.2).
    pub entropy_target: f64,
    /// The adaptive coefficient's step per optimizer step (TRL 0.005).
    pub entropy_coef_delta: f64,
    /// The adaptive coefficient's floor (TRL 0).
    pub entropy_coef_min: f64,
    /// The adaptive coefficient's ceiling (TRL 1).
    pub entropy_coef_max: f64,
    /// The "80/20" rule: only the top-ρ highest-entropy tokens of the batch get a policy
    /// gradient (1 = off; TRL `top_entropy_quantile`).
    pub top_entropy_quantile: f64,
    /// The entropy mechanism's covariance rules (arXiv 2505.22617): none, clip_cov (a few
    /// high-covariance tokens lose their gradient) or kl_cov (the highest-covariance tokens get
    /// a |log r| penalty). verl `policy_loss.loss_mode` clip_cov / kl_cov.
    pub cov_penalty: CovPenalty,
    /// Clip-Cov: the fraction of the batch's real tokens detached (verl 2e-4; rounded up).
    pub clip_cov_ratio: f64,
    /// Clip-Cov: only tokens with covariance above this…
    pub clip_cov_lb: f64,
    /// …and below this are drawn.
    pub clip_cov_ub: f64,
    /// KL-Cov: the fraction of real tokens (the highest covariances) penalised (rounded up).
    pub kl_cov_ratio: f64,
    /// KL-Cov: the penalty's coefficient κ on |log r| (verl `ppo_kl_coef`, 0.1).
    pub kl_cov_coef: f64,
    /// DAPO dynamic sampling: replace groups whose rewards are all equal by fresh ones.
    pub dynamic_sampling: bool,
    /// TRL's `steps_per_generation`: the rollout's `B` groups split into this many mini-batches
    /// of whole groups, one optimizer step each; the μ passes go over them in turn
    /// (1 = one step on the whole batch).
    pub steps_per_generation: usize,
    /// TRL's experimental replay buffer: up to this many groups with a reward signal are kept
    /// (scored Σ|A|·std); a new group whose rewards are all equal is replaced by a stored one
    /// drawn in proportion to its score (0 = off).
    pub replay_buffer: usize,
    /// DAPO's overlong filtering: responses cut at `max_len` without `<eos>` leave the loss
    /// (their rewards still count in the advantages; TRL `mask_truncated_completions`).
    pub mask_truncated_completions: bool,
    /// Bound on dynamic-sampling rounds per iteration (groups still flat after it are kept).
    pub max_resample_rounds: usize,
    /// The mismatch lab's correction for the gap between the sampler (π_sampler, which drew
    /// the responses) and the learner (π_old, recomputed): none, tis (truncated IS weight),
    /// mis (masked IS weight), icepop (tokens outside the band masked), opsm (DeepSeek-V3.2's
    /// off-policy sequence mask). TRL `vllm_importance_sampling_*`, OpenRLHF
    /// `vllm_is_correction_type`.
    pub is_correction: IsCorrection,
    /// Where tis / mis form their weight: per token, or one per sequence (the product).
    pub is_level: IsLevel,
    /// The IS weight's band `[low, high]`: tis clamps to it, mis and icepop zero outside it.
    pub is_threshold_low: f64,
    pub is_threshold_high: f64,
    /// OPSM's δ: a response with A < 0 whose mean log(π_sampler/π_θ) exceeds it is dropped
    /// (TRL `off_policy_mask_threshold`).
    pub opsm_threshold: f64,
    /// DeepSeek-V3.2's unbiased KL: each token's KL estimate weighted by π_θ/π_old (TRL
    /// `use_bias_correction_kl`).
    pub unbiased_kl: bool,
    /// Stale rollouts, as an asynchronous trainer makes them: iteration i's responses are drawn
    /// by the policy of iteration max(0, i − k); the learner rescores them as π_old (0 = off).
    pub max_staleness: usize,
    /// Which training prompts an iteration uses: uniform, prioritized (by 1 − success rate,
    /// Kimi k1.5) or curriculum (easy to hard by inversions). Needs prompts_per_iteration > 0.
    pub prompt_sampling: PromptSampling,
    /// PPO's critic (`advantage = "gae"`): discount γ of GAE.
    pub gamma: f64,
    /// GAE's λ (1 = Monte Carlo return minus the value; 0 = one-step TD error).
    pub lam: f64,
    /// The critic's Adam step size.
    pub value_lr: f64,
    /// The critic's hidden units (one tanh layer over the state's one-hot features).
    pub value_hidden: usize,
    /// Full-batch Adam steps of the critic on each iteration's returns.
    pub value_epochs: usize,
    /// Deliberate bugs for the bug gallery (spec §5); all off by default.
    pub bugs: BugSwitches,
}

impl AlgorithmConfig {
    /// Optimizer steps per rollout: μ passes over `steps_per_generation` mini-batches.
    pub fn steps_per_iteration(&self) -> usize {
        self.mu * self.steps_per_generation.max(1)
    }

    /// Whether the loss has an entropy bonus at some step: a coefficient now, or the adaptive
    /// one (which may start at 0 and rise).
    pub fn entropy_bonus(&self) -> bool {
        self.entropy_coef != 0.0 || self.adaptive_entropy
    }
}

impl Default for AlgorithmConfig {
    fn default() -> Self {
        Self {
            num_generations: 10,
            prompts_per_iteration: 0,
            mu: 10,
            advantage: AdvantageMode::Normalized,
            passk_advantage_k: 4,
            positive_weight: 1.0,
            negative_weight: 1.0,
            loss: LossMode::Naive,
            importance_sampling_level: ImportanceSamplingLevel::Token,
            epsilon_low: 0.2,
            epsilon_high: 0.2,
            dual_clip: 0.0,
            delta: 0.0,
            cispo_max_ratio: 5.0,
            sapo_temperature_pos: 1.0,
            sapo_temperature_neg: 1.05,
            beta: 0.0,
            kl_estimator: KlEstimator::K3,
            kl_penalty: KlPenaltyMode::Loss,
            ref_period: 10,
            loss_agg_mode: LossAggMode::SeqMeanTokenMean,
            entropy_coef: 0.0,
            adaptive_entropy: false,
            entropy_target: 0.2,
            entropy_coef_delta: 0.005,
            entropy_coef_min: 0.0,
            entropy_coef_max: 1.0,
            top_entropy_quantile: 1.0,
            cov_penalty: CovPenalty::None,
            clip_cov_ratio: 2e-4,
            clip_cov_lb: 1.0,
            clip_cov_ub: 5.0,
            kl_cov_ratio: 2e-4,
            kl_cov_coef: 0.1,
            dynamic_sampling: false,
            steps_per_generation: 1,
            replay_buffer: 0,
            mask_truncated_completions: false,
            max_resample_rounds: 3,
            is_correction: IsCorrection::None,
            is_level: IsLevel::Token,
            is_threshold_low: 0.0,
            is_threshold_high: 3.0,
            opsm_threshold: 0.5,
            unbiased_kl: false,
            max_staleness: 0,
            prompt_sampling: PromptSampling::Uniform,
            gamma: 1.0,
            lam: 0.95,
            value_lr: 3e-3,
            value_hidden: 64,
            value_epochs: 8,
            bugs: BugSwitches::default(),
        }
    }
}

/// Deliberate bugs (spec §5), each one labelled as such wherever it shows.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BugSwitches {
    /// BUG: ratio written as `logπ / logπ_old` instead of `exp(logπ - logπ_old)`.
    pub ratio_as_logprob_quotient: bool,
    /// BUG: `π_old` recomputed with gradient each step instead of frozen at rollout.
    pub unfrozen_old_policy: bool,
    /// BUG: the reference shares the policy's weights instead of being a copy.
    pub shared_reference: bool,
    /// BUG: normalized advantages divided by the group's std with no ε.
    pub std_without_eps: bool,
}

impl BugSwitches {
    pub fn any(&self) -> bool {
        self.ratio_as_logprob_quotient
            || self.unfrozen_old_policy
            || self.shared_reference
            || self.std_without_eps
    }
}

macro_rules! named_enum {
    ($ty:ident { $($variant:ident => $name:literal),+ $(,)? }) => {
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
        pub enum $ty { $(#[serde(rename = $name)] $variant),+ }
        impl $ty {
            pub const ALL: &'static [$ty] = &[$($ty::$variant),+];
            /// The names a config file uses, in the order of [`Self::ALL`].
            pub const NAMES: &'static [&'static str] = &[$($name),+];
            pub fn name(self) -> &'static str { match self { $($ty::$variant => $name),+ } }
            pub fn parse(s: &str) -> Option<Self> { Self::ALL.iter().copied().find(|m| m.name() == s) }
        }
        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { f.write_str(self.name()) }
        }
    };
}

named_enum!(AdvantageMode {
    Raw => "raw",
    Centered => "centered",
    Normalized => "normalized",
    Max => "max",
    Rloo => "rloo",
    BatchNormalized => "batch_normalized",
    Gae => "gae",
    Gpg => "gpg",
    ReinforcePp => "reinforce_pp",
    ReinforcePpBaseline => "reinforce_pp_baseline",
    Remax => "remax",
    Opo => "opo",
    Passk => "passk",
    PasskAnalytic => "passk_analytic",
});

impl AdvantageMode {
    /// The modes computed from a group's rewards alone (every one of them is logged for each
    /// group, the kernels compute them all); `gae` needs a learned critic instead.
    pub const GROUP: &'static [AdvantageMode] = &[
        AdvantageMode::Raw,
        AdvantageMode::Centered,
        AdvantageMode::Normalized,
        AdvantageMode::Max,
        AdvantageMode::Rloo,
        AdvantageMode::BatchNormalized,
    ];

    /// Where this mode is in [`Self::GROUP`] (`None`: GAE or an estimator of its own).
    pub fn group_index(self) -> Option<usize> {
        Self::GROUP.iter().position(|m| *m == self)
    }
}
named_enum!(LossMode {
    Naive => "naive",
    Unclipped => "unclipped",
    Clipped => "clipped",
    Cispo => "cispo",
    Sapo => "sapo",
    Gmpo => "gmpo",
});
named_enum!(ImportanceSamplingLevel {
    Token => "token",
    Sequence => "sequence",
    SequenceToken => "sequence_token",
});
named_enum!(KlEstimator { K1 => "k1", K2 => "k2", K3 => "k3" });
named_enum!(KlPenaltyMode { Loss => "loss", Reward => "reward" });
named_enum!(LossAggMode {
    SeqMeanTokenMean => "seq-mean-token-mean",
    TokenMean => "token-mean",
    SeqMeanTokenSumNorm => "seq-mean-token-sum-norm",
    Luspo => "luspo",
});
named_enum!(CovPenalty {
    None => "none",
    ClipCov => "clip_cov",
    KlCov => "kl_cov",
});
named_enum!(IsCorrection {
    None => "none",
    Tis => "tis",
    Mis => "mis",
    Icepop => "icepop",
    Opsm => "opsm",
});
named_enum!(IsLevel { Token => "token", Sequence => "sequence" });
named_enum!(LearnerScores { Sampled => "sampled", Full => "full" });
named_enum!(SamplerPrecision { F32 => "f32", Bf16 => "bf16" });
named_enum!(RewardAggregation {
    SumThenNormalize => "sum_then_normalize",
    NormalizeThenSum => "normalize_then_sum",
});
named_enum!(LengthReward { None => "none", Kimi => "kimi", Overlong => "overlong" });
named_enum!(PromptSampling {
    Uniform => "uniform",
    Prioritized => "prioritized",
    Curriculum => "curriculum",
});
named_enum!(DeviceChoice { Auto => "auto", Gpu => "gpu", Software => "software", Cpu => "cpu" });
named_enum!(KernelChoice { Auto => "auto", Gpu => "gpu", Reference => "reference" });
named_enum!(FusedChoice { Auto => "auto", Off => "off" });
named_enum!(EngineChoice { Auto => "auto", Wgsl => "wgsl", Burn => "burn" });

/// Adam (the lecture's optimizer).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OptimizerConfig {
    /// Learning rate (lecture: 1e-3).
    pub lr: f64,
    /// Adam β1 (0.9).
    pub beta1: f64,
    /// Adam β2 (0.999).
    pub beta2: f64,
    /// Adam ε (PyTorch default 1e-8).
    pub eps: f64,
    /// Clip the global gradient norm to this value (0 = off; TRL: 1.0).
    pub max_grad_norm: f64,
}

impl Default for OptimizerConfig {
    fn default() -> Self {
        Self {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            max_grad_norm: 0.0,
        }
    }
}

/// How rollouts are sampled.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SamplingConfig {
    /// Softmax temperature T (1.0 = the policy as is).
    pub temperature: f64,
    /// Keep only the k most likely tokens (0 = off).
    pub top_k: usize,
    /// Nucleus sampling: keep the smallest set with this much mass (1.0 = off).
    pub top_p: f64,
    /// What the learner scores (log π_old, log π_θ, log π_ref): `sampled`, the policy at the
    /// sampling temperature (as the sampler drew, before top-k / top-p); `full`, the full
    /// softmax at temperature 1, as TRL and verl score behind vLLM — a sampler–learner gap.
    pub learner_scores: LearnerScores,
    /// The sampler's arithmetic: `f32`, or its logits rounded to bf16 before the draw (a gap).
    pub sampler_precision: SamplerPrecision,
    /// DeepSeek-V3.2's keep-sampling-mask: the learner scores every distribution renormalised
    /// over the tokens the sampler's top-k / top-p kept at each position.
    pub keep_sampling_mask: bool,
}

impl SamplingConfig {
    /// The temperature at which the learner scores tokens.
    pub fn learner_temperature(&self) -> f64 {
        match self.learner_scores {
            LearnerScores::Sampled => self.temperature,
            LearnerScores::Full => 1.0,
        }
    }

    /// Whether the distribution the sampler drew from differs from what the learner scores:
    /// top-k / top-p truncation, bf16 logits, or the learner at temperature 1.
    pub fn has_gap(&self) -> bool {
        self.top_k > 0
            || self.top_p < 1.0
            || self.sampler_precision == SamplerPrecision::Bf16
            || (self.learner_scores == LearnerScores::Full && self.temperature != 1.0)
    }
}

impl Default for SamplingConfig {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            learner_scores: LearnerScores::Sampled,
            sampler_precision: SamplerPrecision::F32,
            keep_sampling_mask: false,
        }
    }
}

/// Length of the run, seed, device and what gets written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RunSettings {
    /// Name used in run directories and chart titles.
    pub name: String,
    /// Seed: a run is a function of its config and this seed.
    pub seed: u64,
    /// GRPO iterations ("epochs" in the lecture: 100).
    pub iterations: usize,
    /// Write a checkpoint every this many iterations (0 = only at the end).
    pub checkpoint_every: usize,
    /// How many groups per iteration are logged in full (responses, rewards, advantages).
    pub log_groups: usize,
    /// Compute device: auto, gpu, software (lavapipe) or cpu (burn's CPU backend).
    pub device: DeviceChoice,
    /// Sampling, verifying and advantages: `gpu` (our WGSL kernels), `reference` (the plain-Rust
    /// path), `auto` (the kernels whenever the device is a wgpu adapter).
    pub kernels: KernelChoice,
    /// The fused CPU engines (the lecture model's step; the transformer's step with KV-cache
    /// rollouts), held equal to burn's by tests: `auto` uses them on the CPU backend when the
    /// config allows, `off` always takes burn's autodiff path.
    pub fused_step: FusedChoice,
    /// The engine on a wgpu device (`--device gpu|software`): `auto` takes the WGSL engine
    /// (forward, backward and Adam as compute dispatches) for the lecture model where it
    /// covers the config, `wgsl` asks for it (lavapipe if no hardware GPU), `burn` always
    /// takes burn's autodiff path there.
    pub engine: EngineChoice,
    /// Refuse a config whose memory estimate exceeds this many MiB (0 = the memory this
    /// machine has available when the run starts).
    pub max_memory_mib: usize,
    /// Every this many iterations (from iteration 0), sample `pass_samples` answers to each
    /// held-out prompt and log `eval/pass@1`, `eval/pass@4` and `eval/pass@k` (0 = never).
    pub eval_every: usize,
    /// The k of `eval/pass@k` (unbiased estimator from `pass_samples` answers).
    pub pass_k: usize,
    /// Answers sampled per held-out prompt for pass@k (0 = `pass_k`).
    pub pass_samples: usize,
    /// Stop once this many responses have been sampled, dynamic sampling's redraws included
    /// (0 = no budget: `iterations` alone ends the run).
    pub rollout_budget: usize,
    /// Log the entropy mechanism each optimizer step (Cui et al. 2025): `entropy/covariance`
    /// and `entropy/predicted_delta` (every engine), `entropy/measured_delta` (the lecture
    /// model's CPU engines: an extra forward pass) and `entropy/first_order_delta` (the fused
    /// lecture step: an extra backward pass).
    pub entropy_dynamics: bool,
    /// Threads of the fused CPU engines (0 = every core): the batch is cut into parts by its
    /// shape alone, so any number gives the same bits.
    pub threads: usize,
}

impl Default for RunSettings {
    fn default() -> Self {
        Self {
            name: "run".into(),
            seed: 0,
            iterations: 100,
            checkpoint_every: 10,
            log_groups: 16,
            device: DeviceChoice::Auto,
            kernels: KernelChoice::Auto,
            fused_step: FusedChoice::Auto,
            engine: EngineChoice::Auto,
            max_memory_mib: 0,
            eval_every: 20,
            pass_k: 16,
            pass_samples: 0,
            rollout_budget: 0,
            entropy_dynamics: false,
            threads: 0,
        }
    }
}

/// The built-in presets, `assets/experiments/NAME.toml`, compiled in so the binary needs no files.
pub const PRESETS: &[(&str, &str)] = &[
    (
        "lecture17",
        include_str!("../../assets/experiments/lecture17.toml"),
    ),
    (
        "scaled",
        include_str!("../../assets/experiments/scaled.toml"),
    ),
    (
        "random-sort",
        include_str!("../../assets/experiments/random-sort.toml"),
    ),
    (
        "transformer-sort",
        include_str!("../../assets/experiments/transformer-sort.toml"),
    ),
    (
        "length-bias",
        include_str!("../../assets/experiments/length-bias.toml"),
    ),
    (
        "r1-vs-r1-zero",
        include_str!("../../assets/experiments/r1-vs-r1-zero.toml"),
    ),
];

/// The text of a compiled-in asset by name, or the list of available names (for the error).
pub fn named_asset(table: &[(&str, &'static str)], name: &str) -> Result<&'static str, String> {
    table
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, t)| *t)
        .ok_or_else(|| table.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", "))
}

impl RunConfig {
    /// A preset by name.
    pub fn preset(name: &str) -> Result<Self, ConfigError> {
        let text = named_asset(PRESETS, name).map_err(|available| ConfigError::UnknownPreset {
            name: name.into(),
            available,
        })?;
        Self::from_toml_str(text, &format!("preset {name}"))
    }

    pub fn from_toml_str(text: &str, origin: &str) -> Result<Self, ConfigError> {
        Self::from_table(parse_toml(text, origin)?)
    }

    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_toml_str(&text, &path.display().to_string())
    }

    /// Build from a TOML table, checking every key against the known ones first so an
    /// unknown key is reported with the allowed keys next to it.
    pub fn from_table(table: toml::Table) -> Result<Self, ConfigError> {
        let reference = toml::Table::try_from(RunConfig::default()).expect("default serializes");
        check_keys(&table, &reference, "")?;
        // Fill missing fields from defaults, then deserialize; serde's error names no key, so
        // the key is found by trying the values one at a time (first_bad_leaf).
        let mut merged = reference.clone();
        merge(&mut merged, table);
        let config: RunConfig =
            toml::Value::Table(merged.clone())
                .try_into()
                .map_err(|e: toml::de::Error| {
                    // serde names no key: the first one that fails alone over the defaults.
                    let (key, reason) = first_bad_leaf(&merged, &reference)
                        .unwrap_or_else(|| ("config".into(), e.message().to_string()));
                    ConfigError::InvalidValue { key, reason }
                })?;
        config.validate()?;
        Ok(config)
    }

    /// The config as a TOML file's text, ending with a newline as a text file's last line does
    /// (a run's `config.toml`, an export's `grpo-lab.toml`).
    pub fn to_toml(&self) -> String {
        let mut text = toml::to_string_pretty(self).expect("config serializes");
        if !text.ends_with('\n') {
            text.push('\n');
        }
        text
    }

    /// Apply `key=value` overrides (dotted keys, TOML values; bare words are strings).
    pub fn with_overrides(&self, sets: &[String]) -> Result<Self, ConfigError> {
        let mut table = toml::Table::try_from(self).expect("config serializes");
        apply_sets(&mut table, sets)?;
        Self::from_table(table)
    }

    /// The config of a run as the CLI builds it: a preset (else the defaults), then a TOML
    /// file's keys over it (section by section, key by key), then `--set key=value`
    /// overrides, then one validation of the result. Each layer may leave keys out; only
    /// the whole must be valid. Errors name the preset, the file or the key.
    ///
    /// A free map ([`FREE_MAPS`]: `task.reward_weights`) is one value, not a section: a
    /// file's map replaces the preset's whole, as `--set task.reward_weights={…}` does, and
    /// only `--set task.reward_weights.NAME=W` changes one entry. A file is often a whole
    /// config (a run's `config.toml`), which must read back as it was over any preset: its
    /// `{ exact = 1.0 }` must not gain the preset's `distance`, its `{}` must clear the map;
    /// TOML cannot tell `[task.reward_weights]` from an inline table, so both replace.
    pub fn layered(
        preset: Option<&str>,
        file: Option<&Path>,
        sets: &[String],
    ) -> Result<RunConfig, ConfigError> {
        let base = match preset {
            Some(name) => Self::preset(name)?,
            None => RunConfig::default(),
        };
        let mut table = toml::Table::try_from(&base).expect("config serializes");
        if let Some(path) = file {
            let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
                path: path.display().to_string(),
                source,
            })?;
            let over = parse_toml(&text, &path.display().to_string())?;
            let reference =
                toml::Table::try_from(RunConfig::default()).expect("default serializes");
            check_keys(&over, &reference, "")?;
            merge(&mut table, over);
        }
        apply_sets(&mut table, sets)?;
        Self::from_table(table)
    }

    /// Semantic checks serde cannot make. Each error names the field and what it allows:
    /// first every field's own range from [`FIELDS`], then the rules between fields.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_ranges()?;
        self.validate_task()?;
        self.validate_model()?;
        self.validate_algorithm()?;
        self.validate_objective()?;
        let r = &self.run;
        // The name heads charts, reports and the exported scripts' comments: one line of text.
        if r.name.trim().is_empty() || r.name.chars().any(char::is_control) {
            return bad(
                "run.name",
                format!(
                    "{:?}: allowed one line of text (not empty, no control characters)",
                    r.name
                ),
            );
        }
        if r.pass_samples != 0 && r.pass_samples < r.pass_k {
            return bad(
                "run.pass_samples",
                format!(
                    "{} < run.pass_k = {}: pass@k needs at least k answers per prompt (0 = run.pass_k)",
                    r.pass_samples, r.pass_k
                ),
            );
        }
        Ok(())
    }

    /// Every field of the table within its range (and finite), where its scope applies.
    fn validate_ranges(&self) -> Result<(), ConfigError> {
        let values = serde_json::to_value(self).expect("config serializes");
        for f in FIELDS {
            let Some(value) = json_path(&values, f.key) else {
                continue;
            };
            // A NaN or ±∞ (serde_json writes them as null) is wrong in any field, used by this
            // config or not: it would be written into the run's files all the same.
            if value.is_null() {
                return bad(
                    f.key,
                    format!("a non-finite number; allowed {}", f.allowed()),
                );
            }
            if !f.scope.applies(self) {
                continue;
            }
            if !f.range.contains(value) {
                // serde_json writes NaN and ±inf as null.
                let shown = if value.is_null() {
                    "a non-finite number".to_string()
                } else {
                    value.to_string()
                };
                return bad(
                    f.key,
                    format!("{shown} is out of range; allowed {}", f.allowed()),
                );
            }
            if let (Range::Float { .. }, Some(v)) = (f.range, value.as_f64()) {
                let zero_ok = f.range.contains(&serde_json::json!(0.0));
                if let Some(why) = f32_problem(v, zero_ok) {
                    return bad(f.key, format!("{why}; allowed {}", f.allowed()));
                }
            }
        }
        Ok(())
    }

    /// The task's prompts, reward weights and vocabulary against each other.
    fn validate_task(&self) -> Result<(), ConfigError> {
        let t = &self.task;
        for (i, p) in t.prompts.iter().enumerate() {
            if p.len() != t.n {
                return bad(
                    "task.prompts",
                    format!("prompt {i} has {} numbers but task.n = {}", p.len(), t.n),
                );
            }
            if let Some(x) = p.iter().find(|&&x| x as usize >= t.vocab) {
                return bad(
                    "task.prompts",
                    format!("prompt {i} holds {x}, outside 0..{} (task.vocab)", t.vocab),
                );
            }
        }
        if t.prompts.is_empty() && t.train_size == 0 {
            return bad(
                "task.train_size",
                "must be ≥ 1 when task.prompts is empty".into(),
            );
        }
        // Random prompts are drawn distinct, training and held-out apart (PromptSet::build).
        let space = t.prompt_space();
        let wanted = t.train_size as u128 + t.heldout_size as u128;
        if t.prompts.is_empty() && wanted > space {
            return bad(
                "task.train_size",
                format!(
                    "{} + task.heldout_size {} = {wanted} distinct prompts, but only {space} exist for n = {}, vocab = {}{}: allowed a sum ≤ {space}",
                    t.train_size,
                    t.heldout_size,
                    t.n,
                    t.vocab,
                    if t.allow_repeats {
                        ""
                    } else {
                        " without repeats"
                    }
                ),
            );
        }
        self.validate_reward_weights()?;
        if !t.allow_repeats && t.vocab < t.n {
            return bad(
                "task.allow_repeats",
                format!("false needs task.vocab ≥ task.n ({} < {})", t.vocab, t.n),
            );
        }
        self.validate_heldout()
    }

    /// Each weight of the free map `task.reward_weights`: a known verifier, a number f32
    /// holds (the map has no row of its own in [`FIELDS`], so `validate_ranges` misses it).
    fn validate_reward_weights(&self) -> Result<(), ConfigError> {
        for (k, w) in &self.task.reward_weights {
            let key = format!("task.reward_weights.{k}");
            if RewardKind::parse(k).is_none() {
                return bad(
                    &key,
                    format!("unknown reward; allowed: {}", RewardKind::NAMES.join(", ")),
                );
            }
            if !w.is_finite() {
                return bad(&key, "weight must be finite".into());
            }
            if let Some(why) = f32_problem(*w, true) {
                return bad(&key, format!("{why}; allowed a finite weight"));
            }
        }
        Ok(())
    }

    /// With fixed training prompts, the held-out prompts are drawn among the others: more than
    /// exist would be cut to them (`PromptSet::build`) while the run's config.toml still
    /// recorded the size asked for. (Random prompts are checked with `task.train_size`.)
    fn validate_heldout(&self) -> Result<(), ConfigError> {
        let t = &self.task;
        let room = t.heldout_room();
        if t.prompts.is_empty() || t.heldout_size as u128 <= room {
            return Ok(());
        }
        bad(
            "task.heldout_size",
            format!(
                "{} held-out prompts, but only {room} of the {} prompts for n = {}, vocab = {}{} lie outside task.prompts; allowed 0..={room}",
                t.heldout_size,
                t.prompt_space(),
                t.n,
                t.vocab,
                if t.allow_repeats {
                    ""
                } else {
                    " without repeats"
                }
            ),
        )
    }

    /// The algorithm's prompt sampling and the SFT teacher.
    fn validate_algorithm(&self) -> Result<(), ConfigError> {
        let a = &self.algorithm;
        // More prompts an iteration than there are would be cut to them without a word, the
        // run's config still saying otherwise.
        let (train, from) = match self.task.prompts.len() {
            0 => (self.task.train_size, "task.train_size"),
            fixed => (fixed, "the prompts of task.prompts"),
        };
        if a.prompts_per_iteration > train {
            return bad(
                "algorithm.prompts_per_iteration",
                format!(
                    "{} > the {train} training prompts ({from}): allowed 0 (every prompt) or at most {train}",
                    a.prompts_per_iteration
                ),
            );
        }
        if a.prompt_sampling != PromptSampling::Uniform && a.prompts_per_iteration == 0 {
            return bad(
                "algorithm.prompt_sampling",
                format!(
                    "`{}` chooses among the training prompts, so it needs algorithm.prompts_per_iteration > 0 (0 uses every prompt every iteration)",
                    a.prompt_sampling
                ),
            );
        }
        if self.sft.teacher != "none" {
            match RunConfig::preset(&self.sft.teacher) {
                Err(_) => {
                    return bad(
                        "sft.teacher",
                        format!(
                            "`{}` is not a preset; allowed: none, {}",
                            self.sft.teacher,
                            PRESETS
                                .iter()
                                .map(|(n, _)| *n)
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    );
                }
                Ok(t) if t.task != self.task => {
                    return bad(
                        "sft.teacher",
                        format!(
                            "`{}` trains on another task (it differs in {}); a teacher must answer this run's prompts",
                            self.sft.teacher,
                            t.differing_keys(self)
                                .into_iter()
                                .filter(|k| k.starts_with("task."))
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    );
                }
                Ok(t) if t.sft.teacher != "none" => {
                    return bad(
                        "sft.teacher",
                        format!(
                            "`{}` has a teacher of its own; one level of distillation only",
                            self.sft.teacher
                        ),
                    );
                }
                Ok(_) => {}
            }
        }
        Ok(())
    }

    /// Checks of the policy's shape against the task (names both numbers when they disagree).
    fn validate_model(&self) -> Result<(), ConfigError> {
        let (t, m) = (&self.task, &self.model);
        if m.kind == ModelKind::Lecture {
            if t.max_len != 0 && t.max_len != t.n {
                return bad(
                    "task.max_len",
                    format!(
                        "{} ≠ task.n = {}: the lecture model always answers exactly n tokens; use model.kind = transformer for variable lengths",
                        t.max_len, t.n
                    ),
                );
            }
            for (key, on) in [
                ("task.format_reward", t.format_reward != 0.0),
                ("task.length_reward", t.length_reward != LengthReward::None),
                (
                    "algorithm.mask_truncated_completions",
                    self.algorithm.mask_truncated_completions,
                ),
            ] {
                if on {
                    return bad(
                        key,
                        "needs model.kind = transformer: the lecture model has no <eos> and a fixed length".into(),
                    );
                }
            }
            return Ok(());
        }
        let max_len = self.max_len();
        if max_len < t.n {
            return bad(
                "task.max_len",
                format!(
                    "{max_len} is below task.n = {}: a sorted answer needs n tokens (n + 1 with <eos>)",
                    t.n
                ),
            );
        }
        let need = t.n + max_len - 1;
        if m.context < need {
            return bad(
                "model.context",
                format!(
                    "{} is shorter than the sequences it must read: task.n + task.max_len − 1 = {} + {} − 1 = {need}",
                    m.context, t.n, max_len
                ),
            );
        }
        let tokens = t.vocab + 1;
        if m.vocab != 0 && m.vocab != tokens {
            return bad(
                "model.vocab",
                format!(
                    "{} does not match the task's tokenizer, which has {tokens} tokens (task.vocab = {} numbers + <eos>); set model.vocab = {tokens} or 0",
                    m.vocab, t.vocab
                ),
            );
        }
        if !m.d_model.is_multiple_of(m.heads) {
            return bad(
                "model.heads",
                format!("{} must divide model.d_model = {}", m.heads, m.d_model),
            );
        }
        if t.length_reward == LengthReward::Overlong && t.overlong_buffer > max_len {
            return bad(
                "task.overlong_buffer",
                format!(
                    "{} must be in 1..=task.max_len ({max_len})",
                    t.overlong_buffer
                ),
            );
        }
        Ok(())
    }

    /// The dotted keys whose values differ between two configs (`algorithm.mu`, …).
    pub fn differing_keys(&self, other: &RunConfig) -> Vec<String> {
        fn walk(prefix: &str, a: &toml::Value, b: Option<&toml::Value>, out: &mut Vec<String>) {
            match (a, b) {
                (toml::Value::Table(ta), Some(toml::Value::Table(tb))) => {
                    for (k, va) in ta {
                        let key = if prefix.is_empty() {
                            k.clone()
                        } else {
                            format!("{prefix}.{k}")
                        };
                        walk(&key, va, tb.get(k), out);
                    }
                    for k in tb.keys().filter(|k| !ta.contains_key(*k)) {
                        out.push(format!("{prefix}.{k}"));
                    }
                }
                (a, Some(b)) if a == b => {}
                _ => out.push(prefix.to_string()),
            }
        }
        let as_value = |c: &RunConfig| toml::Value::try_from(c).expect("a config serializes");
        let mut out = Vec::new();
        walk("", &as_value(self), Some(&as_value(other)), &mut out);
        out
    }

    /// The resume rule, one for every resume (`train --resume`, a checkpoint loaded): a resumed
    /// run is the same run, where only `run.iterations` may change (to extend it), and where it
    /// computes (`run.threads`, `run.engine`, `run.device`). The keys of
    /// `new` that break it; empty when `new` may continue a run recorded as `self`.
    pub fn changed_for_resume(&self, new: &RunConfig) -> Vec<String> {
        self.differing_keys(new)
            .into_iter()
            // The threads change no result (engine::cores): a run may go on with others. The
            // engine and the device say where it computes: the fused CPU and the WGSL engines
            // share a checkpoint's format (what one cannot continue is refused by it).
            .filter(|k| {
                !matches!(
                    k.as_str(),
                    "run.iterations" | "run.threads" | "run.engine" | "run.device"
                )
            })
            .collect()
    }

    /// Whether the rollout records the sampler's own log π beside the learner's log π_old: the
    /// sampler drew from something else than the learner scores (top-k / top-p, bf16 logits,
    /// the learner at temperature 1, an older policy) and the mismatch lab is asked for (a gap
    /// key or a correction: top-k / top-p alone roll out as they always did), on either model.
    pub fn records_sampler_logp(&self) -> bool {
        let s = &self.sampling;
        let asked = s.learner_scores == LearnerScores::Full
            || s.sampler_precision == SamplerPrecision::Bf16
            || s.keep_sampling_mask
            || self.algorithm.is_correction != IsCorrection::None;
        self.algorithm.max_staleness > 0 || (s.has_gap() && asked)
    }

    /// The tokens the policy chooses among at each position: `task.vocab` for the lecture
    /// model, and `<eos>` besides for the transformer.
    pub fn learner_vocab(&self) -> usize {
        match self.model.kind {
            ModelKind::Lecture => self.task.vocab,
            ModelKind::Transformer => self.task.vocab + 1,
        }
    }

    /// The longest response in tokens: `n` for the lecture model, `task.max_len` (0 = n + 1)
    /// for the transformer.
    pub fn max_len(&self) -> usize {
        match (self.model.kind, self.task.max_len) {
            (ModelKind::Lecture, _) => self.task.n,
            (_, 0) => self.task.n + 1,
            (_, l) => l,
        }
    }

    /// The prompts drawn per iteration.
    pub fn batch_prompts(&self, train_len: usize) -> usize {
        match self.algorithm.prompts_per_iteration {
            0 => train_len,
            b => b.min(train_len),
        }
    }

    /// Optimizer steps in the whole run.
    pub fn total_steps(&self) -> usize {
        self.run.iterations * self.algorithm.steps_per_iteration()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_parse_and_validate() {
        for (name, _) in PRESETS {
            RunConfig::preset(name).unwrap();
        }
    }

    #[test]
    fn lecture17_is_the_lecture() {
        let c = RunConfig::preset("lecture17").unwrap();
        assert_eq!(
            c.task.prompts,
            vec![vec![1, 0, 2], vec![3, 2, 4], vec![1, 2, 3]]
        );
        assert_eq!((c.task.n, c.task.vocab, c.model.d_model), (3, 5, 10));
        assert_eq!(c.algorithm.num_generations, 10);
        assert_eq!((c.run.iterations, c.algorithm.mu), (100, 10));
        assert_eq!(c.optimizer.lr, 1e-3);
        assert_eq!(c.task.reward, RewardKind::InclusionOrdering);
    }

    #[test]
    fn set_overrides_and_names_bad_keys_and_values() {
        let c = RunConfig::preset("lecture17").unwrap();
        let c2 = c
            .with_overrides(&[
                "algorithm.advantage=centered".into(),
                "optimizer.lr=1".into(),
            ])
            .unwrap();
        assert_eq!(c2.algorithm.advantage, AdvantageMode::Centered);
        assert_eq!(c2.optimizer.lr, 1.0);
        let e = c
            .with_overrides(&["algorithm.advantag=raw".into()])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("algorithm.advantag") && e.contains("algorithm.advantage"),
            "{e}"
        );
        let e = c
            .with_overrides(&["algorithm.advantage=nope".into()])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("algorithm.advantage") && e.contains("rloo"),
            "{e}"
        );
        let e = c
            .with_overrides(&["algorithm.num_generations=-3".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("algorithm.num_generations"), "{e}");
        let e = c
            .with_overrides(&["algorithm.epsilon_low=1.5".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("algorithm.epsilon_low"), "{e}");
    }

    #[test]
    fn toml_round_trip() {
        let c = RunConfig::preset("scaled").unwrap();
        let back = RunConfig::from_toml_str(&c.to_toml(), "test").unwrap();
        assert_eq!(c, back);
    }

    #[test]
    fn unknown_key_in_file_is_named() {
        let e = RunConfig::from_toml_str("[algorithm]\nbetta = 0.1\n", "t")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("algorithm.betta") && e.contains("algorithm.beta"),
            "{e}"
        );
    }

    /// A value serde refuses in a file names its key and the allowed values, as `--set` does
    /// (it said "invalid value for `config`").
    #[test]
    fn bad_value_in_file_is_named() {
        for (text, key, needle) in [
            ("[run]\nengine = \"wgls\"\n", "run.engine", "wgsl"),
            (
                "[run]\nseed = 1\n[algorithm]\nloss = 3\n",
                "algorithm.loss",
                "clipped",
            ),
            ("[task]\nn = \"four\"\n", "task.n", "1..=64"),
        ] {
            let e = RunConfig::from_toml_str(text, "t").unwrap_err().to_string();
            assert!(
                e.contains(&format!("`{key}`")) && e.contains(needle),
                "{text}: {e}"
            );
        }
    }

    #[test]
    fn the_field_table_holds_every_key_once() {
        let mut keys = Vec::new();
        leaf_keys(
            &toml::Table::try_from(RunConfig::default()).unwrap(),
            "",
            &mut keys,
        );
        let table: Vec<&str> = FIELDS.iter().map(|f| f.key).collect();
        for k in &keys {
            assert!(table.contains(&k.as_str()), "`{k}` is missing from FIELDS");
        }
        for f in FIELDS {
            assert!(
                keys.iter().any(|k| k == f.key),
                "`{}` is not a config key",
                f.key
            );
            assert_eq!(
                FIELDS.iter().filter(|g| g.key == f.key).count(),
                1,
                "{}",
                f.key
            );
            assert!(!f.label.is_empty() && !f.help.is_empty(), "{}", f.key);
        }
        assert_eq!(table.len(), keys.len());
    }

    #[test]
    fn every_choice_in_the_table_is_accepted_and_nothing_else() {
        let c = RunConfig::preset("transformer-sort").unwrap();
        for f in FIELDS {
            let Range::Choice(names) = f.range else {
                continue;
            };
            for name in names {
                // prompt sampling other than uniform needs B > 0.
                let sets = vec![
                    "algorithm.prompts_per_iteration=4".to_string(),
                    format!("{}={name}", f.key),
                ];
                if let Err(e) = c.with_overrides(&sets) {
                    // Only a rule between fields may refuse it, never the name itself.
                    assert!(!e.to_string().contains("unknown variant"), "{}: {e}", f.key);
                }
            }
            let e = c
                .with_overrides(&[format!("{}=no-such-value", f.key)])
                .unwrap_err()
                .to_string();
            assert!(e.contains(f.key), "{e}");
            for name in names {
                assert!(e.contains(name), "{}: {e} should list {name}", f.key);
            }
        }
    }

    #[test]
    fn validate_checks_every_range_of_the_table_and_names_the_field() {
        let c = RunConfig::preset("transformer-sort").unwrap();
        let mut checked = 0;
        for f in FIELDS {
            let bad_values: Vec<String> = match f.range {
                Range::Int { min, max } => {
                    let mut v = vec![];
                    if min > 0 {
                        v.push((min - 1).to_string());
                    }
                    if let Some(m) = max {
                        v.push((m + 1).to_string());
                    }
                    v
                }
                Range::Float { low, high } => {
                    let mut v = vec!["nan".to_string(), "inf".to_string()];
                    match low {
                        Bound::Closed(b) => v.push(format!("{}", b - 0.5)),
                        Bound::Open(b) => v.push(format!("{b:?}")),
                        Bound::None => {}
                    }
                    match high {
                        Bound::Closed(b) => v.push(format!("{}", b + 0.5)),
                        Bound::Open(b) => v.push(format!("{b:?}")),
                        Bound::None => {}
                    }
                    v
                }
                _ => vec![],
            };
            let mut sets: Vec<String> = match f.scope {
                Scope::Sft => vec!["sft.steps=5".into()],
                Scope::Overlong => vec!["task.length_reward=overlong".into()],
                _ => vec![],
            };
            for v in bad_values {
                sets.push(format!("{}={v}", f.key));
                let e = c.with_overrides(&sets).unwrap_err();
                let ConfigError::InvalidValue { key, reason } = &e else {
                    panic!("{}={v}: {e}", f.key);
                };
                assert_eq!(key, f.key, "{}={v}: {e}", f.key);
                assert!(reason.contains(&f.range.to_string()), "{e}");
                sets.pop();
                checked += 1;
            }
        }
        assert!(checked > 40, "{checked}");
    }

    #[test]
    fn documented_and_validated_ranges_agree() {
        // task.n: the verifier kernel holds 64 numbers; the scaling bench sweeps n up to 32.
        let c = RunConfig::preset("random-sort").unwrap();
        assert!(c.with_overrides(&["task.n=32".into()]).is_ok());
        let e = c
            .with_overrides(&["task.n=65".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("task.n") && e.contains("1..=64"), "{e}");
        assert!(field_info("task.n").unwrap().tooltip().contains("1..=64"));
        let e = c
            .with_overrides(&["algorithm.epsilon_low=1.0".into()])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("algorithm.epsilon_low") && e.contains("(0, 1)"),
            "{e}"
        );
        // Settings a range does not check outside their scope stay free.
        let lecture = RunConfig::preset("lecture17").unwrap();
        assert!(lecture.with_overrides(&["model.layers=0".into()]).is_ok());
        assert!(lecture.with_overrides(&["sft.lr=0".into()]).is_ok());
    }

    #[test]
    fn the_readme_config_table_names_only_keys_of_the_field_table() {
        let readme = include_str!("../../README.md");
        let start = readme
            .find("| section | keys |")
            .expect("README has the config table");
        let mut rows = 0;
        for line in readme[start..].lines().skip(2) {
            if !line.starts_with('|') {
                break;
            }
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let section = cells[1].trim_matches('`');
            // Parentheses hold allowed values and notes, not keys.
            let mut keys_text = String::new();
            let mut depth = 0;
            for ch in cells[2].chars() {
                match ch {
                    '(' => depth += 1,
                    ')' => depth -= 1,
                    _ if depth == 0 => keys_text.push(ch),
                    _ => {}
                }
            }
            let names: Vec<&str> = keys_text.split('`').skip(1).step_by(2).collect();
            assert!(!names.is_empty(), "{line}");
            for name in names {
                let key = format!("{section}.{name}");
                let known = match key.strip_suffix('*') {
                    Some(prefix) => FIELDS.iter().any(|f| f.key.starts_with(prefix)),
                    None => field_info(&key).is_some(),
                };
                assert!(known, "README names `{key}`, which FIELDS does not have");
            }
            rows += 1;
        }
        assert_eq!(rows, 7, "one row per section");
    }

    #[test]
    fn config_docs_list_every_key_with_its_range() {
        let docs = config_docs();
        for f in FIELDS {
            let row = docs
                .lines()
                .find(|l| l.starts_with(&format!("| `{}` |", f.key)))
                .unwrap_or_else(|| panic!("no row for {}", f.key));
            assert!(row.contains(&f.allowed().replace('|', "\\|")), "{row}");
        }
        assert!(
            docs.contains("| `task.n` | n (prompt length) | `3` | 1..=64 |"),
            "{docs}"
        );
        assert!(docs.contains("actor_rollout_ref.rollout.n"));
    }

    #[test]
    fn layered_is_preset_then_file_then_sets() {
        let dir = std::env::temp_dir().join(format!("grpo-lab-layered-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("over.toml");
        // Valid only over random-sort (empty prompts): alone, over the defaults' three
        // 3-number prompts, n = 5 would not be.
        std::fs::write(&file, "[task]\nn = 5\n[algorithm]\nmu = 2\n").unwrap();
        let c = RunConfig::layered(Some("random-sort"), Some(&file), &["algorithm.mu=3".into()])
            .unwrap();
        assert_eq!((c.task.n, c.task.vocab, c.algorithm.mu), (5, 8, 3));
        assert_eq!(
            c.task.reward,
            RewardKind::Exact,
            "the preset's other keys stay"
        );
        // Without a preset the file goes over the defaults; a --set may repair the whole.
        assert!(RunConfig::layered(None, Some(&file), &[]).is_err());
        let c = RunConfig::layered(
            None,
            Some(&file),
            &["task.prompts=[]".into(), "task.train_size=64".into()],
        )
        .unwrap();
        assert_eq!((c.task.n, c.algorithm.mu), (5, 2));
        // Errors name the preset, the file's key, the set's key.
        let e = RunConfig::layered(Some("nope"), None, &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("lecture17"), "{e}");
        std::fs::write(&file, "[algorithm]\nmuu = 2\n").unwrap();
        let e = RunConfig::layered(Some("lecture17"), Some(&file), &[])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("algorithm.muu") && e.contains("algorithm.mu"),
            "{e}"
        );
        std::fs::write(&file, "[algorithm\n").unwrap();
        let e = RunConfig::layered(Some("lecture17"), Some(&file), &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("over.toml"), "{e}");
        let e = RunConfig::layered(Some("lecture17"), None, &["algorithm.mu=0".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("algorithm.mu") && e.contains("1..=1000"), "{e}");
        // More random prompts than exist for n and vocab: refused here (a dry run says so),
        // not when the run builds its prompts.
        let sets = [
            "task.prompts=[]",
            "task.train_size=100",
            "task.heldout_size=100",
        ];
        let e = RunConfig::layered(Some("lecture17"), None, &sets.map(String::from))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("task.train_size") && e.contains("only 125 exist"),
            "{e}"
        );
        // More prompts an iteration than the task has: refused, not cut without a word.
        let sets = ["algorithm.prompts_per_iteration=10".to_string()];
        let e = RunConfig::layered(Some("lecture17"), None, &sets)
            .unwrap_err()
            .to_string();
        assert!(e.contains("the 3 training prompts"), "{e}");
        // A file's value of the wrong type is named, not the key a --set (or --device) touched.
        std::fs::write(&file, "[algorithm]\nnum_generations = \"ten\"\n").unwrap();
        let e = RunConfig::layered(Some("lecture17"), Some(&file), &["run.device=cpu".into()])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("algorithm.num_generations") && !e.contains("run.device"),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The error of a layered config: its key and reason.
    fn refusal(preset: Option<&str>, file: Option<&str>, sets: &[&str]) -> (String, String) {
        // One file per call: the tests run in parallel.
        static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = file.map(|text| {
            let name = format!("grpo-lab-refusal-{}-{call}.toml", std::process::id());
            let path = std::env::temp_dir().join(name);
            std::fs::write(&path, text).unwrap();
            path
        });
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        let result = RunConfig::layered(preset, path.as_deref(), &sets);
        if let Some(path) = &path {
            let _ = std::fs::remove_file(path);
        }
        match result {
            Err(ConfigError::InvalidValue { key, reason }) => (key, reason),
            Err(e) => ("(not InvalidValue)".into(), e.to_string()),
            Ok(_) => ("(accepted)".into(), String::new()),
        }
    }

    /// A float whose f64 is finite but whose f32 is ±∞, or 0 where "> 0" is asked, passed
    /// validation and killed the run with a NaN at step 1, naming no key.
    #[test]
    fn float_keys_must_fit_in_f32() {
        for set in [
            "sampling.temperature=1e-50",
            "algorithm.beta=1e300",
            "algorithm.entropy_coef=1e300",
            "algorithm.positive_weight=1e300",
            "algorithm.sapo_temperature_pos=1e-50",
            "algorithm.sapo_temperature_pos=1e300",
            "optimizer.eps=1e-40",
            "task.reward_weights.exact=1e300",
            "task.reward_weights.exact=-1e300",
        ] {
            let (key, reason) = refusal(None, None, &[set]);
            assert_eq!(key, set.split('=').next().unwrap(), "{set}: {reason}");
            assert!(
                reason.contains("f32") && reason.contains("; allowed"),
                "{set}: {reason}"
            );
            assert!(reason.len() < 400, "the number in its short form: {reason}");
            let limit = if set.contains("e-") {
                "1.1754944e-38"
            } else {
                "3.4028235e38"
            };
            assert!(reason.contains(limit), "{set}: {reason}");
        }
        // What f32 holds still passes, 0 included where the range allows it.
        for set in [
            "sampling.temperature=1e-30",
            "algorithm.beta=3e38",
            "algorithm.beta=0",
            "task.reward_weights.exact=0",
        ] {
            assert!(
                RunConfig::layered(None, None, &[set.into()]).is_ok(),
                "{set}"
            );
        }
    }

    /// TOML integers are i64: a seed above i64::MAX cannot be written into a run's
    /// config.toml, so it is refused as out of range, from --set, from a file or in code.
    #[test]
    fn seeds_stop_at_i64_max() {
        assert_eq!(MAX_SEED, i64::MAX as u64);
        let range = "0..=9223372036854775807";
        assert_eq!(field_info("run.seed").unwrap().allowed(), range);
        for set in [
            "run.seed=9223372036854775808",
            "run.seed=18446744073709551615",
        ] {
            let (key, reason) = refusal(None, None, &[set]);
            assert_eq!(key, "run.seed", "{reason}");
            assert!(
                reason.contains(range) && reason.contains("out of range"),
                "{reason}"
            );
        }
        let file = "[run]\nname = \"x\"\nseed = 9223372036854775808\n";
        let (key, reason) = refusal(Some("lecture17"), Some(file), &[]);
        assert_eq!(key, "run.seed", "{reason}");
        assert!(reason.contains(range), "{reason}");
        let max = format!("run.seed={}", i64::MAX);
        assert!(RunConfig::layered(None, None, &[max]).is_ok());
        let mut c = RunConfig::default();
        c.run.seed = MAX_SEED + 1;
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("`run.seed`") && e.contains(range), "{e}");
    }

    /// `steps_per_generation` must cut B into equal mini-batches: 2 over lecture17's three
    /// prompts ran with mini-batches of 1 and 2 groups.
    #[test]
    fn mini_batches_divide_the_iterations_prompts() {
        let key = "algorithm.steps_per_generation";
        let (k, reason) = refusal(
            Some("lecture17"),
            None,
            &["algorithm.steps_per_generation=2"],
        );
        assert_eq!(k, key, "{reason}");
        assert!(
            reason.contains("algorithm.prompts_per_iteration = 0")
                && reason.contains("task.prompts")
                && reason.contains("allowed a divisor of 3: 1, 3"),
            "{reason}"
        );
        let (k, reason) = refusal(
            Some("random-sort"),
            None,
            &["algorithm.steps_per_generation=3"],
        );
        assert_eq!(k, key, "{reason}");
        assert!(reason.contains("1, 2, 4, 8, 16, 32, 64"), "{reason}");
        let sets = [
            "algorithm.prompts_per_iteration=0",
            "algorithm.steps_per_generation=3",
        ];
        let (k, reason) = refusal(Some("random-sort"), None, &sets);
        assert_eq!(k, key, "{reason}");
        assert!(reason.contains("task.train_size, B = 512"), "{reason}");
        for (preset, s) in [
            ("lecture17", 3),
            ("random-sort", 4),
            ("transformer-sort", 32),
        ] {
            let set = format!("{key}={s}");
            assert!(
                RunConfig::layered(Some(preset), None, &[set]).is_ok(),
                "{preset}"
            );
        }
    }

    /// A syntax error says where it is, on one line ("duplicate key" said nothing more).
    #[test]
    fn toml_syntax_errors_say_where() {
        for (text, needle) in [
            (
                "[task]\nn = 3\nn = 4\n",
                "duplicate key at line 3, column 1: `n = 4`",
            ),
            ("[task\n", "at line 1, column 6: `[task`"),
            (
                "[run]\nseed = 1\nname = = \"a\"\n",
                "at line 3, column 8: `name = = \"a\"`",
            ),
        ] {
            let (key, reason) = refusal(None, Some(text), &[]);
            assert_eq!(key, "(not InvalidValue)", "{reason}");
            assert!(
                reason.contains("is not valid TOML") && reason.contains(needle),
                "{text:?}: {reason}"
            );
            assert!(!reason.contains('\n'), "one line: {reason}");
            let e = RunConfig::from_toml_str(text, "t").unwrap_err().to_string();
            assert!(e.contains(needle), "{e}");
        }
    }

    /// Held-out prompts beside fixed training prompts were cut to what exists without a word
    /// (the run's config.toml still asking for more); now refused with the largest size.
    #[test]
    fn heldout_beyond_the_prompts_left_is_refused() {
        let (key, reason) = refusal(Some("lecture17"), None, &["task.heldout_size=1000000"]);
        assert_eq!(key, "task.heldout_size", "{reason}");
        assert!(
            reason.contains("only 122 of the 125 prompts") && reason.contains("allowed 0..=122"),
            "{reason}"
        );
        let ok = RunConfig::layered(Some("lecture17"), None, &["task.heldout_size=122".into()]);
        assert_eq!(ok.unwrap().task.heldout_room(), 122);
        // A fixed prompt the space does not hold (a repeat, allow_repeats = false) leaves it whole.
        let t = TaskConfig {
            prompts: vec![vec![2, 2, 0], vec![1, 0, 2]],
            allow_repeats: false,
            ..TaskConfig::default()
        };
        assert_eq!((t.prompt_space(), t.heldout_room()), (60, 59));
    }

    /// A free map is one value: a file's `[task.reward_weights]` replaces the preset's whole,
    /// as `--set task.reward_weights={…}` does, so a run's config.toml reads back as it was
    /// over any preset; `--set task.reward_weights.NAME=W` changes one weight. The docs say so.
    #[test]
    fn reward_weights_are_one_value_in_a_file_and_in_a_whole_set() {
        let weights = |c: RunConfig| c.task.reward_weights.into_iter().collect::<Vec<_>>();
        let dir = std::env::temp_dir().join(format!("grpo-lab-weights-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("w.toml");
        std::fs::write(&file, "[task.reward_weights]\nexact = 1.0\n").unwrap();
        let from_file = RunConfig::layered(Some("random-sort"), Some(&file), &[]).unwrap();
        let whole = RunConfig::layered(
            Some("random-sort"),
            None,
            &["task.reward_weights={exact=1.0}".into()],
        )
        .unwrap();
        assert_eq!(weights(from_file), vec![("exact".to_string(), 1.0)]);
        assert_eq!(weights(whole), vec![("exact".to_string(), 1.0)]);
        let one = RunConfig::layered(
            Some("random-sort"),
            None,
            &["task.reward_weights.exact=2.0".into()],
        )
        .unwrap();
        assert_eq!(
            weights(one),
            vec![("distance".to_string(), 0.25), ("exact".to_string(), 2.0)]
        );
        // A saved config without weights, given over a preset with some, reads back as saved.
        let saved = RunConfig::preset("lecture17").unwrap();
        std::fs::write(&file, saved.to_toml()).unwrap();
        let back = RunConfig::layered(Some("random-sort"), Some(&file), &[]).unwrap();
        assert_eq!(back, saved);
        let help = field_info("task.reward_weights").unwrap().help;
        assert!(
            help.contains("replaces the preset's whole map")
                && help.contains("task.reward_weights.NAME=W"),
            "{help}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// `[[task]]` or `task = 3` said "expected usize" / "expected struct TaskConfig": now the
    /// key is called a section and its keys are listed.
    #[test]
    fn a_section_given_a_value_lists_its_keys() {
        for (text, key, got) in [
            ("[[task]]\nn = 3\n", "task", "an array"),
            ("task = 3\n", "task", "the integer `3`"),
            (
                "[algorithm]\nbugs = true\n",
                "algorithm.bugs",
                "the boolean `true`",
            ),
        ] {
            let (k, reason) = refusal(None, Some(text), &[]);
            assert_eq!(k, key, "{text:?}: {reason}");
            let listed = FIELDS
                .iter()
                .filter(|f| f.key.strip_prefix(key).is_some_and(|k| k.starts_with('.')))
                .all(|f| reason.contains(f.key));
            assert!(
                reason.contains("a section") && reason.contains(got) && listed,
                "{text:?}: {reason}"
            );
        }
        let e = RunConfig::from_toml_str("task = 3\n", "t")
            .unwrap_err()
            .to_string();
        assert!(e.contains("task.reward_aggregation"), "{e}");
    }

    #[test]
    fn saved_configs_end_with_a_newline() {
        for (name, _) in PRESETS {
            let text = RunConfig::preset(name).unwrap().to_toml();
            assert!(text.ends_with('\n') && !text.ends_with("\n\n"), "{name}");
        }
    }
}
