//! `RunConfig`: every knob of a run, as one TOML document.
//!
//! Knob names follow what TRL / verl users know (`num_generations`, `epsilon_low`,
//! `beta`, `loss_agg_mode`, ...). Each field has a one-line doc here; [`FIELDS`] is the
//! one table of every key with its label, help (usual range, the paper, the TRL / verl
//! name) and valid range: `validate` checks it, the app shows it as tooltips and
//! [`config_docs`] prints it (`grpo-lab config-docs`). Presets live in
//! `assets/experiments/*.toml`; a run directory keeps the exact config it ran with as
//! `config.toml`; [`RunConfig::layered`] builds one from a preset, a file and `--set`s.

use serde::{Deserialize, Serialize};
use std::path::Path;
use thiserror::Error;

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
    /// Per-token objective: naive (`-A·logπ`), unclipped (`-A·ρ`), clipped (PPO).
    pub loss: LossMode,
    /// Lower clip range ε_low for the ratio (PPO: 0.2; lecture: 0.01).
    pub epsilon_low: f64,
    /// Upper clip range ε_high (PPO: 0.2; DAPO clip-higher: 0.28).
    pub epsilon_high: f64,
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
    /// Entropy bonus: `− coef · H` is added to the loss (0 = off).
    pub entropy_coef: f64,
    /// DAPO dynamic sampling: replace groups whose rewards are all equal by fresh ones.
    pub dynamic_sampling: bool,
    /// Bound on dynamic-sampling rounds per iteration (groups still flat after it are kept).
    pub max_resample_rounds: usize,
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

impl Default for AlgorithmConfig {
    fn default() -> Self {
        Self {
            num_generations: 10,
            prompts_per_iteration: 0,
            mu: 10,
            advantage: AdvantageMode::Normalized,
            loss: LossMode::Naive,
            epsilon_low: 0.2,
            epsilon_high: 0.2,
            beta: 0.0,
            kl_estimator: KlEstimator::K3,
            kl_penalty: KlPenaltyMode::Loss,
            ref_period: 10,
            loss_agg_mode: LossAggMode::SeqMeanTokenMean,
            entropy_coef: 0.0,
            dynamic_sampling: false,
            max_resample_rounds: 3,
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
}
named_enum!(LossMode { Naive => "naive", Unclipped => "unclipped", Clipped => "clipped" });
named_enum!(KlEstimator { K1 => "k1", K2 => "k2", K3 => "k3" });
named_enum!(KlPenaltyMode { Loss => "loss", Reward => "reward" });
named_enum!(LossAggMode {
    SeqMeanTokenMean => "seq-mean-token-mean",
    TokenMean => "token-mean",
    SeqMeanTokenSumNorm => "seq-mean-token-sum-norm",
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
}

impl Default for SamplingConfig {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
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
        }
    }
}

// ---------------------------------------------------------------- the field table

/// One bound of a number's range.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Bound {
    /// No bound on this side (the number must still be finite).
    None,
    /// The bound itself is allowed.
    Closed(f64),
    /// The bound itself is excluded.
    Open(f64),
}

/// The values a config key accepts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Range {
    /// An integer in `min..=max` (`max: None`: no upper bound).
    Int {
        min: u64,
        max: Option<u64>,
    },
    /// A finite number between two bounds.
    Float {
        low: Bound,
        high: Bound,
    },
    /// One of these names (an enum; serde refuses any other).
    Choice(&'static [&'static str]),
    Bool,
    /// Any text.
    Text,
    /// A structured value, described in words (its checks are in `validate`).
    Other(&'static str),
}

impl Range {
    const fn int(min: u64, max: u64) -> Self {
        Range::Int {
            min,
            max: Some(max),
        }
    }
    const fn at_least(min: u64) -> Self {
        Range::Int { min, max: None }
    }
    const fn float(low: Bound, high: Bound) -> Self {
        Range::Float { low, high }
    }
    const ANY_INT: Range = Range::Int { min: 0, max: None };
    const ANY_FLOAT: Range = Range::Float {
        low: Bound::None,
        high: Bound::None,
    };
    const POSITIVE: Range = Range::Float {
        low: Bound::Open(0.0),
        high: Bound::None,
    };
    const NON_NEGATIVE: Range = Range::Float {
        low: Bound::Closed(0.0),
        high: Bound::None,
    };

    /// Whether a number is in the range (integers and floats; other kinds always pass).
    fn contains(&self, value: &serde_json::Value) -> bool {
        match *self {
            Range::Int { min, max } => value
                .as_u64()
                .is_some_and(|v| v >= min && max.is_none_or(|m| v <= m)),
            Range::Float { low, high } => value.as_f64().is_some_and(|v| {
                v.is_finite()
                    && match low {
                        Bound::None => true,
                        Bound::Closed(b) => v >= b,
                        Bound::Open(b) => v > b,
                    }
                    && match high {
                        Bound::None => true,
                        Bound::Closed(b) => v <= b,
                        Bound::Open(b) => v < b,
                    }
            }),
            _ => true,
        }
    }
}

impl std::fmt::Display for Range {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Range::Int {
                min,
                max: Some(max),
            } => write!(f, "{min}..={max}"),
            Range::Int { min, max: None } => write!(f, "an integer ≥ {min}"),
            Range::Float { low, high } => match (low, high) {
                (Bound::None, Bound::None) => f.write_str("any finite number"),
                (Bound::Open(l), Bound::None) => write!(f, "> {l}"),
                (Bound::Closed(l), Bound::None) => write!(f, "≥ {l}"),
                (Bound::None, Bound::Open(h)) => write!(f, "< {h}"),
                (Bound::None, Bound::Closed(h)) => write!(f, "≤ {h}"),
                (low, high) => {
                    let (open_l, l) = match low {
                        Bound::Open(l) => ("(", l),
                        Bound::Closed(l) => ("[", l),
                        Bound::None => unreachable!(),
                    };
                    let (h, close_h) = match high {
                        Bound::Open(h) => (h, ")"),
                        Bound::Closed(h) => (h, "]"),
                        Bound::None => unreachable!(),
                    };
                    write!(f, "{open_l}{l}, {h}{close_h}")
                }
            },
            Range::Choice(names) => f.write_str(&names.join(", ")),
            Range::Bool => f.write_str("true, false"),
            Range::Text => f.write_str("any text"),
            Range::Other(words) => f.write_str(words),
        }
    }
}

/// When a field's range is checked (elsewhere the field is ignored, so any value passes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Always,
    /// `model.kind = transformer`.
    Transformer,
    /// `model.kind = transformer` and `task.length_reward = overlong`.
    Overlong,
    /// `sft.steps > 0`.
    Sft,
}

impl Scope {
    fn applies(self, c: &RunConfig) -> bool {
        match self {
            Scope::Always => true,
            Scope::Transformer => c.model.kind == ModelKind::Transformer,
            Scope::Overlong => {
                c.model.kind == ModelKind::Transformer
                    && c.task.length_reward == LengthReward::Overlong
            }
            Scope::Sft => c.sft.steps > 0,
        }
    }
    fn words(self) -> &'static str {
        match self {
            Scope::Always => "",
            Scope::Transformer => "model.kind = transformer",
            Scope::Overlong => "task.length_reward = overlong",
            Scope::Sft => "sft.steps > 0",
        }
    }
}

/// One config key: what the app, the docs and `validate` know about it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Field {
    /// Dotted key, as in `--set` and the TOML file (`algorithm.epsilon_high`).
    pub key: &'static str,
    /// Short label (the app's field name).
    pub label: &'static str,
    /// What it does, the usual values, the paper, and the TRL / verl names of the knob.
    pub help: &'static str,
    /// The values it accepts on its own.
    pub range: Range,
    /// When the range is checked.
    pub scope: Scope,
    /// A rule against other fields, in words (checked by `validate`; empty: none).
    pub rule: &'static str,
}

impl Field {
    const fn new(key: &'static str, label: &'static str, range: Range, help: &'static str) -> Self {
        Field {
            key,
            label,
            help,
            range,
            scope: Scope::Always,
            rule: "",
        }
    }
    const fn only(mut self, scope: Scope) -> Self {
        self.scope = scope;
        self
    }
    const fn rule(mut self, rule: &'static str) -> Self {
        self.rule = rule;
        self
    }

    /// The allowed values in words: the range, when it is checked, and any rule against
    /// other fields (the text of error messages, tooltips and the docs).
    pub fn allowed(&self) -> String {
        let mut s = self.range.to_string();
        if self.scope != Scope::Always {
            s.push_str(&format!(" (checked when {})", self.scope.words()));
        }
        if !self.rule.is_empty() {
            s.push_str("; ");
            s.push_str(self.rule);
        }
        s
    }

    /// The app's tooltip: the help, the allowed values, the key.
    pub fn tooltip(&self) -> String {
        format!(
            "{}\n\nAllowed: {}\n`{}`",
            self.help,
            self.allowed(),
            self.key
        )
    }
}

/// The field of a dotted key.
pub fn field_info(key: &str) -> Option<&'static Field> {
    FIELDS.iter().find(|f| f.key == key)
}

use Bound::{Closed, Open};
use Scope::{Overlong, Sft, Transformer};

/// Every key of [`RunConfig`], in file order. The one source of labels, help and ranges.
pub const FIELDS: &[Field] = &[
    // task
    Field::new("task.n", "n (prompt length)", Range::int(1, 64),
        "How many numbers to sort; the lecture model answers exactly n tokens. Lecture: 3; usual 3..=16. The upper bound is the verifier kernel's (MAX_N = 64)."),
    Field::new("task.vocab", "vocab", Range::int(2, 1024),
        "Numbers are drawn from 0..vocab. Lecture: 5; usual 5..=64. The upper bound is the tokenizer's (1024 number tokens)."),
    Field::new("task.prompts", "prompts", Range::Other("lists of task.n numbers, each in 0..task.vocab"),
        "Fixed training prompts (the lecture's [1,0,2], [3,2,4], [1,2,3]). Empty: draw task.train_size random prompts instead."),
    Field::new("task.train_size", "train prompts", Range::ANY_INT,
        "Random training prompts (disjoint from the held-out ones), used when task.prompts is empty. Usual 64..=100000; train_size + heldout_size must not exceed the distinct prompts that exist for n and vocab.")
        .rule("≥ 1 when task.prompts is empty"),
    Field::new("task.heldout_size", "held-out prompts", Range::ANY_INT,
        "Prompts never trained on, for greedy held-out accuracy (0 = none; usual 32..=1024). verl: data.val_files."),
    Field::new("task.allow_repeats", "repeats", Range::Bool,
        "Whether random prompts may repeat a number ([2,2,0]).")
        .rule("false needs task.vocab ≥ task.n"),
    Field::new("task.reward", "Reward", Range::Choice(RewardKind::NAMES),
        "The verifier (GRPO-SPEC §1). distance: positions equal to sorted(prompt). inclusion_ordering: prompt numbers found + non-decreasing neighbours (can be gamed: [0,0,0] scores high). exact: 1 if sorted, else 0 (the RLVR indicator). TRL: reward_funcs."),
    Field::new("task.reward_weights", "reward weights", Range::Other("a table verifier = weight (distance, inclusion_ordering, exact), finite weights"),
        "A weighted sum of verifiers, e.g. { exact = 1.0, distance = 0.25 }; overrides task.reward when not empty. Dense terms keep a sparse exact reward learnable. TRL: reward_funcs with reward_weights."),
    Field::new("task.max_len", "max_len", Range::ANY_INT,
        "Longest response in tokens, <eos> included (0 = n + 1). Responses that reach it without <eos> are truncated. Transformer only. TRL: max_completion_length; verl: data.max_response_length.")
        .rule("0 or ≥ task.n (transformer); 0 or task.n (lecture)"),
    Field::new("task.format_reward", "format reward", Range::ANY_FLOAT,
        "Format reward: added when the answer closes with <eos> within max_len (0 = off; usual 0.1..=1). Transformer only: the lecture model has no <eos>.")
        .only(Transformer).rule("0 with model.kind = lecture"),
    Field::new("task.length_reward", "length reward", Range::Choice(LengthReward::NAMES),
        "none; kimi: Kimi k1.5's group-relative length reward (short correct answers win); overlong: DAPO's soft overlong punishment over the last task.overlong_buffer tokens before max_len. Transformer only.")
        .rule("none with model.kind = lecture"),
    Field::new("task.length_reward_weight", "length weight", Range::ANY_FLOAT,
        "Weight of the length reward (Kimi k1.5 and DAPO: 1.0). verl (DAPO): reward_model.overlong_buffer.penalty_factor.")
        .only(Transformer),
    Field::new("task.overlong_buffer", "overlong buffer", Range::at_least(1),
        "DAPO's L_cache: the last this-many tokens before max_len are penalised linearly (with task.length_reward = overlong). verl (DAPO): reward_model.overlong_buffer.len.")
        .only(Overlong).rule("≤ task.max_len"),
    // model
    Field::new("model.kind", "policy", Range::Choice(ModelKind::NAMES),
        "lecture: the lecture's per-position model (GRPO-SPEC §6; answers exactly n tokens). transformer: a small causal transformer that answers token by token until <eos>."),
    Field::new("model.d_model", "D", Range::int(1, 4096),
        "Embedding width D. Lecture: 10; transformer: usual 32..=256, a multiple of model.heads. HF: hidden_size."),
    Field::new("model.init_scale", "init scale", Range::POSITIVE,
        "Multiplies the initial weights. 1 = the lecture's init (logits of scale ~5: nearly deterministic from the start) and GPT-2's; smaller = closer to uniform, more exploration (usual 0.1..=1)."),
    Field::new("model.layers", "layers", Range::int(1, 12),
        "Transformer blocks (usual 1..=4 here). HF: num_hidden_layers.")
        .only(Transformer),
    Field::new("model.heads", "heads", Range::int(1, 64),
        "Attention heads per block; must divide D. HF: num_attention_heads.")
        .only(Transformer).rule("divides model.d_model"),
    Field::new("model.d_ff", "d_ff", Range::ANY_INT,
        "MLP width (0 = 4·d_model). HF: intermediate_size."),
    Field::new("model.context", "context", Range::int(1, 4096),
        "Longest sequence the transformer reads: at least n + max_len − 1. HF: max_position_embeddings.")
        .only(Transformer).rule("≥ task.n + task.max_len − 1"),
    Field::new("model.vocab", "model vocab", Range::ANY_INT,
        "Token ids the transformer embeds (0 = from the task: task.vocab numbers + <eos>). HF: vocab_size.")
        .rule("0 or task.vocab + 1 (transformer)"),
    // algorithm
    Field::new("algorithm.num_generations", "G (group size)", Range::int(1, 4096),
        "Responses sampled per prompt, the group size G; advantages compare within a group (G = 1 gives no signal). Lecture: 10; usual 4..=64 (GRPO, Shao et al. 2024: 64). TRL: num_generations; verl: actor_rollout_ref.rollout.n."),
    Field::new("algorithm.prompts_per_iteration", "prompts / iteration", Range::ANY_INT,
        "Prompts per iteration B (0 = every training prompt each iteration). verl: data.train_batch_size; TRL: generation_batch_size / num_generations."),
    Field::new("algorithm.mu", "μ (steps per iteration)", Range::int(1, 1000),
        "Optimizer steps on one batch of rollouts, μ. Lecture: 10; GRPO paper: 1; usual 1..=4. With μ > 1 the naive loss has no off-policy correction. TRL: num_iterations; verl: actor_rollout_ref.actor.ppo_epochs."),
    Field::new("algorithm.advantage", "Advantage", Range::Choice(AdvantageMode::NAMES),
        "How a group's rewards become advantages (GRPO-SPEC §3). raw: A = r. centered: r − mean (Dr. GRPO). normalized (GRPO): (r − mean)/(std + 1e-5). max: r where r is the group max, else 0. rloo: r − mean of the others (RLOO). batch_normalized: centered / batch std. gae: PPO with a learned critic — per-token GAE(γ, λ) from a small value model trained on the returns, whitened over the batch (the critic GRPO removes; see algorithm.gamma, lam, value_*). TRL: scale_rewards (group, none, batch); verl: algorithm.adv_estimator (grpo, rloo) with algorithm.norm_adv_by_std_in_grpo. The std's ε: TRL 1e-4, verl 1e-6."),
    Field::new("algorithm.loss", "Loss", Range::Choice(LossMode::NAMES),
        "Per-token objective (GRPO-SPEC §4). naive: −A·log π (REINFORCE). unclipped: −A·ρ with ρ = π/π_old. clipped: PPO's −min(ρA, clip(ρ, 1−ε_low, 1+ε_high)A), what TRL and verl always use (verl: actor_rollout_ref.actor.policy_loss.loss_mode = vanilla, plus its dual clip clip_ratio_c)."),
    Field::new("algorithm.epsilon_low", "ε low", Range::float(Open(0.0), Open(1.0)),
        "Lower clip range: the ratio is clipped below at 1 − ε_low (so ε_low < 1). PPO: 0.2; lecture: 0.01. TRL: epsilon; verl: actor_rollout_ref.actor.clip_ratio_low."),
    Field::new("algorithm.epsilon_high", "ε high", Range::float(Open(0.0), Open(10.0)),
        "Upper clip range: the ratio is clipped above at 1 + ε_high. PPO: 0.2; DAPO clip-higher (Yu et al. 2025): 0.28. TRL: epsilon_high; verl: actor_rollout_ref.actor.clip_ratio_high."),
    Field::new("algorithm.beta", "β (KL)", Range::NON_NEGATIVE,
        "KL coefficient β toward the reference policy (0 = no KL and no reference). GRPO paper: 0.04; usual 0.001..=0.1. TRL: beta (its default went 0.04 → 0.0); verl: actor_rollout_ref.actor.kl_loss_coef (in the loss) or algorithm.kl_ctrl.kl_coef (in the reward)."),
    Field::new("algorithm.kl_estimator", "KL estimator", Range::Choice(KlEstimator::NAMES),
        "With Δ = log π_ref − log π: k1 = −Δ, k2 = Δ²/2, k3 = e^Δ − Δ − 1 (Schulman 2020; GRPO uses k3). verl: actor_rollout_ref.actor.kl_loss_type (k1, mse = k2, low_var_kl = k3); TRL: always k3."),
    Field::new("algorithm.kl_penalty", "KL penalty", Range::Choice(KlPenaltyMode::NAMES),
        "Where the KL goes: loss (GRPO: + β·KL in the loss) or reward (PPO-RLHF: r − β·KL). verl: actor_rollout_ref.actor.use_kl_loss or algorithm.use_kl_in_reward; TRL: always in the loss."),
    Field::new("algorithm.ref_period", "ref period", Range::ANY_INT,
        "Copy the policy into the reference every this many iterations (lecture: 10; 0 = never). TRL: sync_ref_model with ref_model_sync_steps (counted in optimizer steps: ref_period·μ); verl: none (the reference stays fixed)."),
    Field::new("algorithm.loss_agg_mode", "Aggregation", Range::Choice(LossAggMode::NAMES),
        "How per-token losses become one number: seq-mean-token-mean (GRPO paper), token-mean (DAPO), seq-mean-token-sum-norm (Dr. GRPO, Liu et al. 2025). Equal for fixed-length responses. verl: actor_rollout_ref.actor.loss_agg_mode; TRL: loss_type (grpo, dapo, dr_grpo; its default became dapo)."),
    Field::new("algorithm.entropy_coef", "entropy bonus", Range::NON_NEGATIVE,
        "Entropy bonus: −coef·H is added to the loss to keep exploring (0 = off; usual 0.001..=0.01). TRL: entropy_coef; verl: actor_rollout_ref.actor.entropy_coeff."),
    Field::new("algorithm.dynamic_sampling", "dynamic sampling", Range::Bool,
        "DAPO dynamic sampling: replace groups whose rewards are all equal (no learning signal) by fresh ones, at most algorithm.max_resample_rounds rounds per iteration. verl (DAPO): algorithm.filter_groups.enable."),
    Field::new("algorithm.max_resample_rounds", "max rounds", Range::int(0, 64),
        "Bound on dynamic-sampling rounds per iteration; groups still flat after it are kept. verl (DAPO): algorithm.filter_groups.max_num_gen_batches."),
    Field::new("algorithm.prompt_sampling", "prompt sampling", Range::Choice(PromptSampling::NAMES),
        "Which training prompts an iteration uses: uniform; prioritized by 1 − success rate; curriculum from the easiest quarter (fewest inversions) to every prompt at mid-run. Both after Kimi k1.5.")
        .rule("prioritized and curriculum need algorithm.prompts_per_iteration > 0"),
    Field::new("algorithm.gamma", "γ (GAE)", Range::float(Closed(0.0), Closed(1.0)),
        "Discount of GAE (advantage = gae only). 1 for a reward paid once at the end, as here. TRL PPO: gamma; verl: algorithm.gamma."),
    Field::new("algorithm.lam", "λ (GAE)", Range::float(Closed(0.0), Closed(1.0)),
        "GAE's λ (advantage = gae only): 1 = return minus the critic's value (low bias, high variance), 0 = one-step TD error (the critic carries everything). TRL PPO: lam (0.95); verl: algorithm.lam."),
    Field::new("algorithm.value_lr", "critic lr", Range::float(Open(0.0), Open(10.0)),
        "Adam step size of the critic (advantage = gae only). verl: critic.optim.lr."),
    Field::new("algorithm.value_hidden", "critic width", Range::int(1, 4096),
        "Hidden units of the critic: one tanh layer over one-hot features of the prompt, the tokens so far and the position (advantage = gae only). A separate model, not a head on the policy."),
    Field::new("algorithm.value_epochs", "critic steps", Range::int(1, 1000),
        "Full-batch Adam steps of the critic on each iteration's returns (advantage = gae only). verl: critic.ppo_epochs."),
    Field::new("algorithm.bugs.ratio_as_logprob_quotient", "BUG: ratio = logπ / logπ_old", Range::Bool,
        "Deliberate bug (GRPO-SPEC §5): the ratio written as log π / log π_old instead of exp(log π − log π_old); the gradient flips sign."),
    Field::new("algorithm.bugs.unfrozen_old_policy", "BUG: π_old not frozen", Range::Bool,
        "Deliberate bug (GRPO-SPEC §5): π_old recomputed with gradient each step instead of frozen at rollout; the ratio's gradient vanishes and nothing is learned."),
    Field::new("algorithm.bugs.shared_reference", "BUG: reference shared, not copied", Range::Bool,
        "Deliberate bug (GRPO-SPEC §5): the reference shares the policy's weights instead of being a copy; the KL is always 0, the penalty silently off."),
    Field::new("algorithm.bugs.std_without_eps", "BUG: std without ε", Range::Bool,
        "Deliberate bug: normalized advantages (r − mean)/std with no ε. A flat group divides 0 by 0 (NaN: the run stops); a nearly flat one (a KL penalty in the reward, tiny differences) has its noise blown up to advantages of size 1."),
    // optimizer
    Field::new("optimizer.lr", "learning rate", Range::float(Open(0.0), Open(10.0)),
        "Adam's step size. Lecture: 1e-3; usual 1e-5..=1e-2 (LLMs: ~1e-6). TRL: learning_rate; verl: actor_rollout_ref.actor.optim.lr."),
    Field::new("optimizer.beta1", "Adam β1", Range::float(Closed(0.0), Open(1.0)),
        "Adam's first-moment decay (0.9). TRL: adam_beta1; verl: actor_rollout_ref.actor.optim.betas."),
    Field::new("optimizer.beta2", "Adam β2", Range::float(Closed(0.0), Open(1.0)),
        "Adam's second-moment decay (0.999). TRL: adam_beta2; verl: actor_rollout_ref.actor.optim.betas."),
    Field::new("optimizer.eps", "Adam ε", Range::POSITIVE,
        "Adam's ε (PyTorch default 1e-8). TRL: adam_epsilon."),
    Field::new("optimizer.max_grad_norm", "max grad norm", Range::NON_NEGATIVE,
        "Clip the global gradient norm to this value (0 = off; TRL's default 1.0). TRL: max_grad_norm; verl: actor_rollout_ref.actor.grad_clip."),
    // sampling
    Field::new("sampling.temperature", "temperature", Range::POSITIVE,
        "Softmax temperature T for rollouts (1 = the policy as is; usual 0.6..=1.2). TRL: temperature; verl: actor_rollout_ref.rollout.temperature."),
    Field::new("sampling.top_k", "top-k", Range::ANY_INT,
        "Keep the k most likely tokens (0 = off). TRL: top_k; verl: actor_rollout_ref.rollout.top_k (−1 = off)."),
    Field::new("sampling.top_p", "top-p", Range::float(Open(0.0), Closed(1.0)),
        "Nucleus sampling: keep the smallest set with this much probability (1 = off). TRL: top_p; verl: actor_rollout_ref.rollout.top_p."),
    // sft
    Field::new("sft.steps", "SFT steps", Range::ANY_INT,
        "Supervised steps on (prompt, sorted) pairs before RL (DeepSeek-R1's cold start). 0 = pure RL (R1-Zero)."),
    Field::new("sft.examples", "examples", Range::at_least(1),
        "Distinct training prompts used as (prompt, sorted) examples.")
        .only(Sft),
    Field::new("sft.batch_size", "SFT batch", Range::at_least(1),
        "Examples per supervised step. TRL SFTConfig: per_device_train_batch_size.")
        .only(Sft),
    Field::new("sft.lr", "SFT lr", Range::float(Open(0.0), Open(10.0)),
        "Adam's step size for the cold start (1e-3). TRL SFTConfig: learning_rate.")
        .only(Sft),
    Field::new("sft.teacher", "SFT teacher", Range::Text,
        "Distillation (DeepSeek-R1 §distillation): none = the cold start's targets are the sorted prompts; a preset name = that preset is trained first (this run's seed, on the CPU) and the cold start fine-tunes on its sampled answers, right or wrong. The teacher's task must be this run's.")
        .rule("none, or a preset with the same task section"),
    // run
    Field::new("run.name", "Name", Range::Text,
        "Name used in run directories and chart titles."),
    Field::new("run.seed", "Seed", Range::ANY_INT,
        "The run is a pure function of its config and this seed. TRL: seed; verl: data.seed."),
    Field::new("run.iterations", "Iterations", Range::at_least(1),
        "GRPO iterations (the lecture's \"epochs\": 100): a rollout, then μ optimizer steps. verl: trainer.total_training_steps (iterations); TRL: max_steps (optimizer steps: iterations·μ)."),
    Field::new("run.checkpoint_every", "Checkpoint every", Range::ANY_INT,
        "Write a checkpoint every this many iterations (0 = only at the end). TRL: save_steps; verl: trainer.save_freq."),
    Field::new("run.log_groups", "Logged groups", Range::ANY_INT,
        "How many groups per iteration are logged in full (prompt, responses, rewards, advantages). TRL: log_completions."),
    Field::new("run.device", "Device", Range::Choice(DeviceChoice::NAMES),
        "Compute device. auto: picked for this machine (`grpo-lab devices` says which); gpu: a hardware wgpu adapter; software: lavapipe; cpu: burn's CPU backend, the fastest choice for these tiny models without a GPU."),
    Field::new("run.kernels", "Kernels", Range::Choice(KernelChoice::NAMES),
        "Sampling, verifier and advantages in our WGSL kernels (gpu) or plain Rust (reference); auto: the kernels whenever the device is a wgpu adapter. Same tokens either way."),
    Field::new("run.fused_step", "Fused step", Range::Choice(FusedChoice::NAMES),
        "The fused CPU engines (the lecture model's step; the transformer's step with KV-cache rollouts): forward, backward and Adam by hand, held equal to burn's by tests. auto uses them on the CPU backend when the config allows (not with a bug-gallery switch on); off always takes burn's autodiff path."),
    Field::new("run.engine", "Engine on a wgpu device", Range::Choice(EngineChoice::NAMES),
        "On a wgpu device (--device gpu|software): auto takes the WGSL engine for the lecture model (weights, Adam and every activation on the device; forward, backward and Adam as compute dispatches) where it covers the config (no bug-gallery switch, no entropy bonus, run.kernels not reference), else burn's autodiff; wgsl asks for the WGSL engine (on lavapipe when there is no hardware GPU); burn always takes burn's autodiff path there."),
    Field::new("run.max_memory_mib", "Memory cap (MiB)", Range::ANY_INT,
        "A config whose memory estimate (`grpo-lab train --dry-run` prints it) exceeds this is refused before anything is allocated, naming the fields that drive it. 0 = the memory this machine has available."),
    Field::new("run.eval_every", "pass@k every", Range::ANY_INT,
        "Every this many iterations, from iteration 0 (so a run of 61 iterations ends with one after 60), sample run.pass_samples answers per held-out prompt at the sampling temperature and log eval/pass@1, eval/pass@4 and eval/pass@k (the unbiased estimator of Chen et al. 2021). 0 = never; no held-out split: nothing logged. verl: trainer.test_freq with val_kwargs.n."),
    Field::new("run.pass_k", "k of pass@k", Range::int(1, 1024),
        "The k of eval/pass@k (usual 8..=64; 16 by default)."),
    Field::new("run.pass_samples", "pass@k samples", Range::ANY_INT,
        "Answers sampled per held-out prompt for pass@k (0 = run.pass_k); more samples lower the estimator's variance.")
        .rule("0 or ≥ run.pass_k"),
    Field::new("run.rollout_budget", "Rollout budget", Range::ANY_INT,
        "Stop once this many responses have been sampled, dynamic sampling's redraws included (0 = none: run.iterations alone ends the run). Compares arms at equal sampling cost. Logged as sampling/rollouts."),
];

/// The config reference as markdown, from [`FIELDS`] (`grpo-lab config-docs`).
pub fn config_docs() -> String {
    let defaults = serde_json::to_value(RunConfig::default()).expect("default serializes");
    let cell = |s: &str| s.replace('|', "\\|").replace('\n', " ");
    let mut out = String::from(
        "# grpo-lab config reference\n\n\
         Every key of a run's TOML config (`--config FILE`, `--set key=value`), generated \
         from the field table in `src/config.rs` (`grpo-lab config-docs`). `validate` checks \
         these ranges; the app shows the same text as tooltips.\n",
    );
    let mut section = "";
    for f in FIELDS {
        let this = f.key.split('.').next().unwrap_or("");
        if this != section {
            section = this;
            out.push_str(&format!(
                "\n## `{section}`\n\n| key | label | default | allowed | what it does |\n|---|---|---|---|---|\n"
            ));
        }
        let default = json_path(&defaults, f.key)
            .map(|v| v.to_string())
            .unwrap_or_default();
        out.push_str(&format!(
            "| `{}` | {} | `{}` | {} | {} |\n",
            f.key,
            cell(f.label),
            cell(&default),
            cell(&f.allowed()),
            cell(f.help)
        ));
    }
    out
}

fn json_path<'a>(value: &'a serde_json::Value, key: &str) -> Option<&'a serde_json::Value> {
    key.split('.').try_fold(value, |v, part| v.get(part))
}

/// The built-in presets, `assets/experiments/NAME.toml`, compiled in so the binary needs no files.
pub const PRESETS: &[(&str, &str)] = &[
    (
        "lecture17",
        include_str!("../assets/experiments/lecture17.toml"),
    ),
    ("scaled", include_str!("../assets/experiments/scaled.toml")),
    (
        "random-sort",
        include_str!("../assets/experiments/random-sort.toml"),
    ),
    (
        "transformer-sort",
        include_str!("../assets/experiments/transformer-sort.toml"),
    ),
    (
        "length-bias",
        include_str!("../assets/experiments/length-bias.toml"),
    ),
    (
        "r1-vs-r1-zero",
        include_str!("../assets/experiments/r1-vs-r1-zero.toml"),
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
        let value: toml::Table = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: origin.into(),
            reason: e.message().to_string(),
        })?;
        Self::from_table(value)
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
        // Fill missing fields from defaults, then deserialize section by section so the
        // error can name the section.
        let mut merged = reference;
        merge(&mut merged, table);
        let config: RunConfig =
            toml::Value::Table(merged)
                .try_into()
                .map_err(|e: toml::de::Error| ConfigError::InvalidValue {
                    key: "config".into(),
                    reason: e.message().to_string(),
                })?;
        config.validate()?;
        Ok(config)
    }

    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).expect("config serializes")
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
            let over: toml::Table = toml::from_str(&text).map_err(|e| ConfigError::Parse {
                path: path.display().to_string(),
                reason: e.message().to_string(),
            })?;
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
        }
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
        for (k, w) in &t.reward_weights {
            if RewardKind::parse(k).is_none() {
                return bad(
                    &format!("task.reward_weights.{k}"),
                    format!("unknown reward; allowed: {}", RewardKind::NAMES.join(", ")),
                );
            }
            if !w.is_finite() {
                return bad(
                    &format!("task.reward_weights.{k}"),
                    "weight must be finite".into(),
                );
            }
        }
        if !t.allow_repeats && t.vocab < t.n {
            return bad(
                "task.allow_repeats",
                format!("false needs task.vocab ≥ task.n ({} < {})", t.vocab, t.n),
            );
        }
        self.validate_model()?;
        let a = &self.algorithm;
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
        let r = &self.run;
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
    /// run is the same run, where only `run.iterations` may change (to extend it). The keys of
    /// `new` that break it; empty when `new` may continue a run recorded as `self`.
    pub fn changed_for_resume(&self, new: &RunConfig) -> Vec<String> {
        self.differing_keys(new)
            .into_iter()
            .filter(|k| k != "run.iterations")
            .collect()
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
        self.run.iterations * self.algorithm.mu
    }
}

/// Apply `key=value` assignments to a whole config's table. A bad key is refused with the
/// keys allowed there; a value of the wrong kind names its key (each assignment is
/// deserialized alone over the table as it was).
fn apply_sets(table: &mut toml::Table, sets: &[String]) -> Result<(), ConfigError> {
    let reference = table.clone();
    for assignment in sets {
        let (key, raw) = assignment
            .split_once('=')
            .ok_or_else(|| ConfigError::BadAssignment(assignment.clone()))?;
        set_path(table, &reference, key.trim(), parse_value(raw.trim()))?;
    }
    for assignment in sets {
        let key = assignment
            .split_once('=')
            .map(|(k, _)| k.trim())
            .unwrap_or("");
        if let Some(v) = get_path(table, key).cloned() {
            let mut probe = reference.clone();
            set_path(&mut probe, &reference, key, v)?;
            toml::Value::Table(probe)
                .try_into::<RunConfig>()
                .map_err(|e| ConfigError::InvalidValue {
                    key: key.into(),
                    reason: e.message().to_string(),
                })?;
        }
    }
    Ok(())
}

/// The error of a field with a value it does not allow.
fn bad(key: &str, reason: String) -> Result<(), ConfigError> {
    Err(ConfigError::InvalidValue {
        key: key.into(),
        reason,
    })
}

fn parse_value(raw: &str) -> toml::Value {
    // A TOML literal if it parses as one (numbers, booleans, arrays, inline tables), else a string.
    let doc = format!("v = {raw}");
    match toml::from_str::<toml::Table>(&doc) {
        Ok(mut t) => t.remove("v").unwrap_or(toml::Value::String(raw.into())),
        Err(_) => toml::Value::String(raw.to_string()),
    }
}

fn allowed_keys(table: &toml::Table, prefix: &str) -> String {
    table
        .keys()
        .map(|k| {
            if prefix.is_empty() {
                k.clone()
            } else {
                format!("{prefix}.{k}")
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Keys whose values are free-form maps (any key allowed).
const FREE_MAPS: &[&str] = &["task.reward_weights"];

fn check_keys(
    table: &toml::Table,
    reference: &toml::Table,
    prefix: &str,
) -> Result<(), ConfigError> {
    for (key, value) in table {
        let path = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        let Some(ref_value) = reference.get(key) else {
            return Err(ConfigError::UnknownKey {
                key: path,
                allowed: allowed_keys(reference, prefix),
            });
        };
        if FREE_MAPS.contains(&path.as_str()) {
            continue;
        }
        if let (toml::Value::Table(sub), toml::Value::Table(ref_sub)) = (value, ref_value) {
            check_keys(sub, ref_sub, &path)?;
        }
    }
    Ok(())
}

fn merge(base: &mut toml::Table, over: toml::Table) {
    for (k, v) in over {
        match (base.get_mut(&k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o))
                if !FREE_MAPS.iter().any(|f| f.ends_with(&k)) =>
            {
                merge(b, o)
            }
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

fn get_path<'a>(table: &'a toml::Table, key: &str) -> Option<&'a toml::Value> {
    let mut parts = key.split('.');
    let mut cur = table.get(parts.next()?)?;
    for p in parts {
        cur = cur.as_table()?.get(p)?;
    }
    Some(cur)
}

fn set_path(
    table: &mut toml::Table,
    reference: &toml::Table,
    key: &str,
    value: toml::Value,
) -> Result<(), ConfigError> {
    let parts: Vec<&str> = key.split('.').collect();
    let mut cur = table;
    let mut cur_ref = reference;
    let mut free = false;
    for (i, part) in parts.iter().enumerate() {
        let prefix = parts[..i].join(".");
        let last = i + 1 == parts.len();
        if !free && !cur_ref.contains_key(*part) {
            return Err(ConfigError::UnknownKey {
                key: key.into(),
                allowed: allowed_keys(cur_ref, &prefix),
            });
        }
        if last {
            let mut value = value;
            // Keep the value's type where TOML would read a bare word differently
            // (e.g. `run.name=123` stays a string).
            if let Some(toml::Value::String(_)) = cur_ref.get(*part)
                && !value.is_str()
            {
                value = toml::Value::String(value.to_string());
            }
            if let (Some(toml::Value::Float(_)), toml::Value::Integer(i)) =
                (cur_ref.get(*part), &value)
            {
                value = toml::Value::Float(*i as f64);
            }
            cur.insert(part.to_string(), value);
            return Ok(());
        }
        let path_so_far = parts[..=i].join(".");
        if FREE_MAPS.contains(&path_so_far.as_str()) {
            free = true;
        }
        let entry = cur
            .entry(part.to_string())
            .or_insert_with(|| toml::Value::Table(Default::default()));
        let Some(next) = entry.as_table_mut() else {
            return Err(ConfigError::UnknownKey {
                key: key.into(),
                allowed: format!("`{path_so_far}` is a value, not a section"),
            });
        };
        cur = next;
        if !free {
            cur_ref = cur_ref
                .get(*part)
                .and_then(|v| v.as_table())
                .expect("checked above");
        }
    }
    Ok(())
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

    /// Every leaf key of a config, dotted (free-form maps count as one leaf).
    fn leaf_keys(table: &toml::Table, prefix: &str, out: &mut Vec<String>) {
        for (k, v) in table {
            let path = if prefix.is_empty() {
                k.clone()
            } else {
                format!("{prefix}.{k}")
            };
            match v {
                toml::Value::Table(sub) if !FREE_MAPS.contains(&path.as_str()) => {
                    leaf_keys(sub, &path, out)
                }
                _ => out.push(path),
            }
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
        let readme = include_str!("../README.md");
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
        let _ = std::fs::remove_dir_all(&dir);
    }
}
