//! The config's field table: every key a user may set, its range, its scope (which configs
//! it applies to), its label and help. `validate`, `config_docs`, the app's config form and the
//! exports read it; adding a key is one row here.

use super::*;

/// The largest seed a config holds: `i64::MAX`. A run's `config.toml` (and every config file)
/// stores the seed as a TOML integer, which is an i64, so a larger seed could be run but never
/// written down and resumed. The CLI's `--seed` / `--seeds` take the same bound.
pub const MAX_SEED: u64 = i64::MAX as u64;

/// Why `v` cannot be a float key's value although its f64 is finite: every float key is
/// computed in f32, where a magnitude above `f32::MAX` is ±∞ and a non-zero one below f32's
/// smallest normal number rounds to 0 or loses its precision — the run would die of a NaN at
/// its first step, naming no key. `zero_ok`: whether the key's range allows 0 (said in the
/// advice). The reason ends before "; allowed …", which the caller adds.
pub(super) fn f32_problem(v: f64, zero_ok: bool) -> Option<String> {
    // As the other range errors show a number (serde_json's shortest form: 1e300, not 301 digits).
    let v_shown = serde_json::Number::from_f64(v).map_or_else(|| v.to_string(), |n| n.to_string());
    if (v as f32).is_infinite() {
        return Some(format!(
            "{v_shown} overflows f32 (every float key is computed in f32, whose largest magnitude is {:e})",
            f32::MAX
        ));
    }
    if v != 0.0 && v.abs() < f64::from(f32::MIN_POSITIVE) {
        return Some(format!(
            "{v_shown} underflows f32 (every float key is computed in f32, whose smallest normal magnitude is {:e}: it would round to 0 or lose its precision; use |x| ≥ {:e}{})",
            f32::MIN_POSITIVE,
            f32::MIN_POSITIVE,
            if zero_ok { " or 0" } else { "" }
        ));
    }
    None
}

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
    pub(super) fn contains(&self, value: &serde_json::Value) -> bool {
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
    pub fn applies(self, c: &RunConfig) -> bool {
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
    pub fn words(self) -> &'static str {
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
        "Prompts never trained on, for greedy held-out accuracy (0 = none; usual 32..=1024). verl: data.val_files.")
        .rule("with task.prompts: ≤ the prompts that exist outside them; random prompts: task.train_size + heldout_size ≤ the prompts that exist"),
    Field::new("task.allow_repeats", "repeats", Range::Bool,
        "Whether random prompts may repeat a number ([2,2,0]).")
        .rule("false needs task.vocab ≥ task.n"),
    Field::new("task.reward", "Reward", Range::Choice(RewardKind::NAMES),
        "The verifier (GRPO-SPEC §1). distance: positions equal to sorted(prompt). inclusion_ordering: prompt numbers found + non-decreasing neighbours (can be gamed: [0,0,0] scores high). exact: 1 if sorted, else 0 (the RLVR indicator). TRL: reward_funcs."),
    Field::new("task.reward_weights", "reward weights", Range::Other("a table verifier = weight (distance, inclusion_ordering, exact), finite weights"),
        "A weighted sum of verifiers, e.g. { exact = 1.0, distance = 0.25 }; overrides task.reward when not empty. Dense terms keep a sparse exact reward learnable. The map is one value: a config file's reward_weights (a [task.reward_weights] table or an inline one) replaces the preset's whole map, as --set task.reward_weights={…} does ({} clears it); only --set task.reward_weights.NAME=W changes one weight and keeps the others. TRL: reward_funcs with reward_weights."),
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
    Field::new("task.reward_aggregation", "reward aggregation", Range::Choice(RewardAggregation::NAMES),
        "How several rewards — the verifiers of task.reward_weights, the format reward, the length reward — become the one the advantage reads. sum_then_normalize: their weighted sum (then the advantage mode). normalize_then_sum (GDPO, arXiv 2601.05242): each normalized within its group first, (r_k − mean)/(std + 1e-5), then the weighted sum (a single reward too: normalized in its group), so two reward mixtures that sum alike no longer collapse to one advantage; GDPO's own last step, a batch normalization, is advantage = batch_normalized or reinforce_pp. The logged reward stays the weighted sum. TRL: multi_objective_aggregation (its normalize_then_sum ends with a batch normalization, ε 1e-4).")
        .rule("normalize_then_sum: algorithm.advantage centered, normalized, rloo, batch_normalized, reinforce_pp or reinforce_pp_baseline; not with algorithm.kl_penalty = reward (β > 0)"),
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
    Field::new("algorithm.mu", "μ (passes per batch)", Range::int(1, 1000),
        "Optimizer passes over one batch of rollouts, μ: one step each (or one per mini-batch with algorithm.steps_per_generation > 1). Lecture: 10; GRPO paper: 1; usual 1..=4. With μ > 1 the naive loss has no off-policy correction. TRL: num_iterations; verl: actor_rollout_ref.actor.ppo_epochs."),
    Field::new("algorithm.advantage", "Advantage", Range::Choice(AdvantageMode::NAMES),
        "How rewards become advantages (GRPO-SPEC §3). raw: A = r. centered: r − mean (Dr. GRPO). normalized (GRPO): (r − mean)/(std + 1e-5). max: r where r is the group max, else 0. rloo: r − mean of the others (RLOO). batch_normalized: centered / batch std. gae: PPO with a learned critic — per-token GAE(γ, λ) from a small value model trained on the returns, whitened over the batch (the critic GRPO removes; see algorithm.gamma, lam, value_*). gpg (arXiv 2504.02546): centered × (responses / responses in groups with a signal). reinforce_pp (REINFORCE++): the return γ^(L−1−t)·r whitened over every real token of the batch, no group. reinforce_pp_baseline: the group mean removed first, then that whitening. remax: r − the reward of the prompt's greedy answer. opo: r − the length-weighted group mean Σ l·r / Σ l. passk (verl grpo_passk, arXiv 2503.19595): only the group's best answer learns, (r_max − r_second)/(std + 1e-5). passk_analytic (arXiv 2508.10751): the analytic Pass@k advantage from the group's count of exactly sorted answers, k = passk_advantage_k. TRL: scale_rewards (group, none, batch); verl: algorithm.adv_estimator (grpo, rloo, gpg, reinforce_plus_plus, reinforce_plus_plus_baseline, remax, opo, grpo_passk) with algorithm.norm_adv_by_std_in_grpo; OpenRLHF: algo.advantage.estimator. The std's ε: TRL 1e-4, verl 1e-6.")
        .rule("passk: num_generations ≥ 2; passk_analytic: 1 ≤ passk_advantage_k ≤ num_generations; with task.reward_aggregation = normalize_then_sum: centered, normalized, rloo, batch_normalized, reinforce_pp or reinforce_pp_baseline"),
    Field::new("algorithm.passk_advantage_k", "Pass@k k", Range::int(1, 4096),
        "The k of advantage = passk_analytic: the Pass@k that training optimizes (the paper: 4..=16). Not run.pass_k, the evaluation's k.")
        .rule("≤ num_generations with advantage = passk_analytic"),
    Field::new("algorithm.positive_weight", "A > 0 weight", Range::NON_NEGATIVE,
        "W-REINFORCE's weights (arXiv 2506.01347): every positive advantage is multiplied by this (PSR, learning from successes only: negative_weight = 0; 1 = off). No framework key."),
    Field::new("algorithm.negative_weight", "A < 0 weight", Range::NON_NEGATIVE,
        "Every negative advantage is multiplied by this (NSR, learning from failures only: positive_weight = 0; W-REINFORCE: positive_weight 0.1; 1 = off). No framework key."),
    Field::new("algorithm.loss", "Loss", Range::Choice(LossMode::NAMES),
        "Per-token objective (GRPO-SPEC §4; r = π/π_old). naive: −A·log π (REINFORCE; GPG's loss). unclipped: −A·r. clipped: PPO's −min(rA, clip(r, 1−ε_low, 1+ε_high)A), what TRL and verl use by default (verl: policy_loss.loss_mode = vanilla; TRL: loss_type grpo / dapo / dr_grpo / bnpo). cispo (MiniMax-M1): −sg(min(r, cispo_max_ratio))·A·log π, clipped tokens keep their gradient (TRL: loss_type cispo; verl: loss_mode cispo). sapo (arXiv 2511.20347): −(4/τ)·σ(τ(r−1))·A, a soft gate instead of the clip, τ = sapo_temperature_pos / _neg by the sign of A (TRL: loss_type sapo; verl: loss_mode sapo). gmpo (arXiv 2507.20673): the geometric mean of the token ratios, each clipped in log space to [−ε_low, ε_high], −A·exp(mean log r) per response (verl: loss_mode geo_mean; set ε to the paper's 0.4)."),
    Field::new("algorithm.importance_sampling_level", "ratio level", Range::Choice(ImportanceSamplingLevel::NAMES),
        "Where the ratio lives. token: r_t per token (PPO, GRPO). sequence (GSPO, arXiv 2507.18071): s = exp(mean_t log r_t) replaces every r_t of the response, clipped per sequence (the paper's ε: 3e-4 / 4e-4), gradient through the mean; with loss_agg_mode seq-mean-token-mean (GSPO) or luspo. sequence_token (GSPO-token): the value s per token, the gradient of each token's own log π. TRL: importance_sampling_level (sequence_token: trl.experimental.gspo_token); verl: loss_mode gspo (its GSPO-token form).")
        .rule("sequence: loss unclipped, clipped or sapo, loss_agg_mode seq-mean-token-mean or luspo; sequence_token: loss unclipped, clipped, cispo or sapo, loss_agg_mode not luspo; token with loss gmpo (which is sequence-level itself)"),
    Field::new("algorithm.epsilon_low", "ε low", Range::float(Open(0.0), Open(1.0)),
        "Lower clip range: the ratio is clipped below at 1 − ε_low (so ε_low < 1). PPO: 0.2; lecture: 0.01. TRL: epsilon; verl: actor_rollout_ref.actor.clip_ratio_low."),
    Field::new("algorithm.epsilon_high", "ε high", Range::float(Open(0.0), Open(10.0)),
        "Upper clip range: the ratio is clipped above at 1 + ε_high. PPO: 0.2; DAPO clip-higher (Yu et al. 2025): 0.28. TRL: epsilon_high; verl: actor_rollout_ref.actor.clip_ratio_high."),
    Field::new("algorithm.dual_clip", "dual clip c", Range::NON_NEGATIVE,
        "Dual clip (Ye et al. 2020): for A < 0 the clipped loss is capped at c·|A|, so a token whose ratio ran far above 1 stops pushing (0 = off). verl: actor_rollout_ref.actor.clip_ratio_c, always on there with 3; OpenRLHF: actor.dual_clip.")
        .rule("0, or > 1 with loss = clipped"),
    Field::new("algorithm.delta", "δ (two-sided clip)", Range::NON_NEGATIVE,
        "INTELLECT-2's two-sided clip: the unclipped branch's ratio is capped at δ, min(min(r, δ)·A, clip(r)·A) (0 = off; TRL recommends δ > 1 + ε_high). TRL: delta.")
        .rule("0, or > 1 + epsilon_high with loss = clipped"),
    Field::new("algorithm.cispo_max_ratio", "CISPO cap", Range::POSITIVE,
        "CISPO's cap on the detached ratio: −sg(min(r, cap))·A·log π (ScaleRL: 5). TRL reads epsilon_high as this cap (an absolute ratio); verl clips the detached ratio to [1 − clip_ratio_low, 1 + clip_ratio_high]: the export writes each framework's form."),
    Field::new("algorithm.sapo_temperature_pos", "SAPO τ+", Range::POSITIVE,
        "SAPO's gate temperature for A > 0: the gate is (4/τ)·σ(τ(r−1)), slope 1 at r = 1. TRL: sapo_temperature_pos (1.0); verl: actor_rollout_ref.actor.tau_pos."),
    Field::new("algorithm.sapo_temperature_neg", "SAPO τ−", Range::POSITIVE,
        "SAPO's gate temperature for A ≤ 0 (TRL: sapo_temperature_neg, 1.05; verl: tau_neg)."),
    Field::new("algorithm.beta", "β (KL)", Range::NON_NEGATIVE,
        "KL coefficient β toward the reference policy (0 = no KL and no reference). GRPO paper: 0.04; usual 0.001..=0.1. TRL: beta (its default went 0.04 → 0.0); verl: actor_rollout_ref.actor.kl_loss_coef (in the loss) or algorithm.kl_ctrl.kl_coef (in the reward)."),
    Field::new("algorithm.kl_estimator", "KL estimator", Range::Choice(KlEstimator::NAMES),
        "With Δ = log π_ref − log π: k1 = −Δ, k2 = Δ²/2, k3 = e^Δ − Δ − 1 (Schulman 2020; GRPO uses k3). verl: actor_rollout_ref.actor.kl_loss_type (k1, mse = k2, low_var_kl = k3); TRL: always k3."),
    Field::new("algorithm.kl_penalty", "KL penalty", Range::Choice(KlPenaltyMode::NAMES),
        "Where the KL goes: loss (GRPO: + β·KL in the loss) or reward (PPO-RLHF: r − β·KL). verl: actor_rollout_ref.actor.use_kl_loss or algorithm.use_kl_in_reward; TRL: always in the loss."),
    Field::new("algorithm.ref_period", "ref period", Range::ANY_INT,
        "Copy the policy into the reference every this many iterations (lecture: 10; 0 = never). TRL: sync_ref_model with ref_model_sync_steps (counted in optimizer steps: ref_period·μ); verl: none (the reference stays fixed)."),
    Field::new("algorithm.loss_agg_mode", "Aggregation", Range::Choice(LossAggMode::NAMES),
        "How per-token losses become one number: seq-mean-token-mean (GRPO paper; GSPO's sequence mean), token-mean (DAPO), seq-mean-token-sum-norm (Dr. GRPO, Liu et al. 2025), luspo (arXiv 2602.05261: the sequence-level loss × its length L, averaged over responses). Equal for fixed-length responses, except luspo (× L). verl: actor_rollout_ref.actor.loss_agg_mode; TRL: loss_type (grpo, dapo, dr_grpo, luspo; its default became dapo).")
        .rule("luspo only with importance_sampling_level = sequence"),
    Field::new("algorithm.entropy_coef", "entropy bonus", Range::NON_NEGATIVE,
        "Entropy bonus: −coef·H is added to the loss to keep exploring (0 = off; usual 0.001..=0.01). TRL: entropy_coef; verl: actor_rollout_ref.actor.entropy_coeff."),
    Field::new("algorithm.adaptive_entropy", "adaptive entropy", Range::Bool,
        "Skywork-OR1's adaptive entropy coefficient: after each optimizer step the coefficient (starting at algorithm.entropy_coef) rises by entropy_coef_delta when that step's mean token entropy was at or below entropy_target and falls by it otherwise, within [entropy_coef_min, entropy_coef_max]; the bonus applies only while the last measured entropy is at or below the target. Logged as entropy_coef; kept in checkpoints. TRL: use_adaptive_entropy."),
    Field::new("algorithm.entropy_target", "entropy target", Range::NON_NEGATIVE,
        "The mean token entropy (nats) the adaptive coefficient steers to (TRL entropy_target 0.2)."),
    Field::new("algorithm.entropy_coef_delta", "coef step", Range::NON_NEGATIVE,
        "The adaptive coefficient's change per optimizer step (TRL entropy_coef_delta 0.005)."),
    Field::new("algorithm.entropy_coef_min", "coef min", Range::NON_NEGATIVE,
        "The adaptive coefficient's floor (TRL entropy_coef_min 0)."),
    Field::new("algorithm.entropy_coef_max", "coef max", Range::NON_NEGATIVE,
        "The adaptive coefficient's ceiling (TRL entropy_coef_max 1).")
        .rule(">= algorithm.entropy_coef_min"),
    Field::new("algorithm.top_entropy_quantile", "top-entropy ρ", Range::float(Open(0.0), Closed(1.0)),
        "The \"80/20\" rule (Wang et al. 2025, arXiv 2506.01939): only tokens whose entropy is at least the batch's (1 − ρ)-quantile keep their policy-gradient term (torch.quantile's linear interpolation over the real tokens; ties kept); the KL and the entropy bonus stay on every token (1 = off; the paper: 0.2). TRL: top_entropy_quantile."),
    Field::new("algorithm.cov_penalty", "covariance rule", Range::Choice(CovPenalty::NAMES),
        "The entropy mechanism's rules (Cui et al. 2025, arXiv 2505.22617): a token's covariance cov_t = (A_t − mean A)·(log π_t − mean log π) over the batch's real tokens (detached) drives entropy down when large. clip_cov (with loss = clipped): of the tokens the clip does not hold with clip_cov_lb < cov_t < clip_cov_ub, ⌈clip_cov_ratio·N⌉ drawn at random (the step's own stream) lose their term and gradient. kl_cov (with loss = unclipped, verl's form: no clip): the ⌈kl_cov_ratio·N⌉ largest cov_t get + kl_cov_coef·|log r_t|. The count rounds up: any ratio above 0 picks at least one token. verl: actor_rollout_ref.actor.policy_loss.loss_mode clip_cov / kl_cov.")
        .rule("clip_cov: loss = clipped; kl_cov: loss = unclipped; both at importance_sampling_level = token"),
    Field::new("algorithm.clip_cov_ratio", "Clip-Cov ratio", Range::float(Open(0.0), Closed(1.0)),
        "Clip-Cov: the fraction of real tokens detached (verl clip_cov_ratio 2e-4)."),
    Field::new("algorithm.clip_cov_lb", "Clip-Cov lb", Range::ANY_FLOAT,
        "Clip-Cov: a token is drawn only if its covariance is above this (verl clip_cov_lb 1)."),
    Field::new("algorithm.clip_cov_ub", "Clip-Cov ub", Range::ANY_FLOAT,
        "Clip-Cov: …and below this (verl clip_cov_ub 5).")
        .rule("> clip_cov_lb"),
    Field::new("algorithm.kl_cov_ratio", "KL-Cov ratio", Range::float(Open(0.0), Closed(1.0)),
        "KL-Cov: the fraction of real tokens, the highest covariances, that get the |log r| penalty (verl kl_cov_ratio 2e-4)."),
    Field::new("algorithm.kl_cov_coef", "KL-Cov κ", Range::NON_NEGATIVE,
        "KL-Cov: the coefficient κ of the penalty κ·|log r_t| (verl ppo_kl_coef, 0.1)."),
    Field::new("algorithm.dynamic_sampling", "dynamic sampling", Range::Bool,
        "DAPO dynamic sampling: replace groups whose rewards are all equal (no learning signal) by fresh ones, at most algorithm.max_resample_rounds rounds per iteration. verl (DAPO): algorithm.filter_groups.enable."),
    Field::new("algorithm.steps_per_generation", "steps / generation", Range::int(1, 1000),
        "The rollout's B groups split into this many mini-batches of whole groups (in order), one optimizer step each; the μ passes go over them in turn, so an iteration takes μ·steps_per_generation steps and each mini-batch's loss is aggregated over its own tokens (1 = one step on the whole batch). TRL: steps_per_generation (TRL shuffles completions, not groups, before splitting); verl: ppo_mini_batch_size = B / steps_per_generation; OpenRLHF: train.batch_size.")
        .rule("divides the iteration's prompts B"),
    Field::new("algorithm.replay_buffer", "replay buffer", Range::int(0, 100_000),
        "TRL's experimental GRPO with replay buffer: up to this many groups that had a reward signal are stored with their responses, advantages, log π_old and log π_ref, scored Σ_i |A_i|·std(r) (a full buffer keeps the best); each new group whose rewards are all equal is replaced in the training batch by a stored group drawn in proportion to its score, its ratio then taken against its own (older) log π_old. 0 = off. TRL: GRPOWithReplayBufferConfig.replay_buffer_size.")
        .rule("not with dynamic sampling, GAE or reinforce_pp with gamma < 1"),
    Field::new("algorithm.mask_truncated_completions", "mask truncated", Range::Bool,
        "DAPO's overlong filtering: a response cut at task.max_len without <eos> leaves the loss — its tokens out of the policy-gradient and KL terms and out of the token counts of the aggregation — while its reward still counts in its group's advantages. Transformer only (the lecture model is never cut). TRL: mask_truncated_completions.")
        .only(Transformer).rule("false with model.kind = lecture"),
    Field::new("algorithm.max_resample_rounds", "max rounds", Range::int(0, 64),
        "Bound on dynamic-sampling rounds per iteration; groups still flat after it are kept. verl (DAPO): algorithm.filter_groups.max_num_gen_batches."),
    Field::new("algorithm.is_correction", "IS correction", Range::Choice(IsCorrection::NAMES),
        "The mismatch lab's correction for the gap between the sampler (π_sampler: what drew the responses) and the learner (π_old: the same responses rescored by the policy being trained), w = π_old/π_sampler: none; tis (truncated IS: each token's policy-gradient term × clamp(w, is_threshold_low, is_threshold_high), detached); mis (masked IS: × w inside the band, 0 outside); icepop (Ring/IcePop, per token by definition: as mis at is_level = token, default band 0.5..5 in OpenRLHF's example); opsm (DeepSeek-V3.2's off-policy sequence mask: a response with A < 0 whose mean log(π_sampler/π_θ) exceeds opsm_threshold loses its policy-gradient terms, re-evaluated at every step). Without a gap (sampling.* leave the learner scoring what the sampler drew) w = 1 and π_sampler = π_old. TRL: vllm_importance_sampling_correction + vllm_importance_sampling_mode token_truncate|token_mask|sequence_truncate|sequence_mask, off_policy_mask_threshold; OpenRLHF: enable_vllm_is_correction, vllm_is_correction_type tis|icepop; verl: algorithm.rollout_correction.")
        .rule("icepop and opsm at is_level = token; not on the WGSL engine"),
    Field::new("algorithm.is_level", "correction level", Range::Choice(IsLevel::NAMES),
        "Where tis and mis form their weight: token (each token's w_t) or sequence (one w = Π_t w_t per response, TRL's sequence_* modes: exp of the summed log-ratio). TRL: the vllm_importance_sampling_mode prefix."),
    Field::new("algorithm.is_threshold_low", "IS band low", Range::NON_NEGATIVE,
        "The IS weight's lower bound: tis clamps up to it, mis and icepop zero a weight below it (TRL vllm_importance_sampling_clip_min, unset = 0; OpenRLHF vllm_is_truncated_threshold[0])."),
    Field::new("algorithm.is_threshold_high", "IS band high", Range::POSITIVE,
        "The IS weight's upper bound: tis clamps down to it, mis and icepop zero a weight above it (TRL vllm_importance_sampling_clip_max 3; OpenRLHF vllm_is_truncated_threshold[1]).")
        .rule("> algorithm.is_threshold_low"),
    Field::new("algorithm.opsm_threshold", "OPSM δ", Range::POSITIVE,
        "OPSM's δ (DeepSeek-V3.2 eq. 9): the mean per-token log(π_sampler/π_θ) of a response above which, with A < 0, it is dropped (TRL off_policy_mask_threshold, e.g. 0.5)."),
    Field::new("algorithm.max_staleness", "max staleness", Range::int(0, 64),
        "Stale rollouts, as an asynchronous trainer makes them: iteration i's responses are drawn by the policy of iteration max(0, i − k) (its weights kept, and checkpointed, for k iterations); the learner rescores them as log π_old, and the sampler's own log π feeds algorithm.is_correction and the sampling/* metrics (0 = off). OpenRLHF: async_queue_size; verl: the one-step-off-policy / fully async trainers.")
        .rule("not on the WGSL engine"),
    Field::new("algorithm.unbiased_kl", "unbiased KL", Range::Bool,
        "DeepSeek-V3.2's unbiased KL estimate: each token's KL term multiplied by π_θ/π_old (gradient through both), since the tokens were drawn from π_old, not π_θ. TRL: use_bias_correction_kl.")
        .rule("not on the WGSL engine"),
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
    Field::new("sampling.learner_scores", "learner scores", Range::Choice(LearnerScores::NAMES),
        "What the learner scores: sampled (log π at the sampling temperature, as the sampler drew — top-k / top-p are the sampler's alone) or full (the full softmax at temperature 1, as TRL and verl score behind vLLM: with temperature ≠ 1 a sampler–learner gap, trl #4159). The sampler's own log π is recorded beside log π_old whenever the two differ, for algorithm.is_correction and the sampling/* metrics.")
        .rule("full: not on the WGSL engine"),
    Field::new("sampling.keep_sampling_mask", "keep sampling mask", Range::Bool,
        "DeepSeek-V3.2's Keep Sampling Mask (arXiv 2512.02556 §3.1; prime-rl's and vLLM's \"sampling replay\"): the rollout records the tokens top-k / top-p kept at each position, and the learner scores log π_θ, log π_old and log π_ref renormalised over that support, so truncation stops being a sampler–learner gap (with learner_scores = sampled and an f32 sampler, π_old is then the distribution drawn from). No TRL / verl / OpenRLHF key (SkyRL #877 asks for it).")
        .rule("with sampling.top_k or top_p; vocabulary ≤ 64 tokens; not with algorithm.replay_buffer; not on the WGSL engine"),
    Field::new("sampling.sampler_precision", "sampler precision", Range::Choice(SamplerPrecision::NAMES),
        "The sampler's arithmetic: f32, or bf16 (its logits rounded to bfloat16 before the softmax and the draw, as an inference engine in bf16 does; the learner stays f32) — a controlled sampler–learner gap.")
        .rule("bf16: not on the WGSL engine"),
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
    Field::new("run.seed", "Seed", Range::int(0, MAX_SEED),
        "The run is a pure function of its config and this seed (at most i64::MAX: a run's config.toml holds it as a TOML integer). TRL: seed; verl: data.seed."),
    Field::new("run.iterations", "Iterations", Range::at_least(1),
        "GRPO iterations (the lecture's \"epochs\": 100): a rollout, then μ optimizer steps. verl: trainer.total_training_steps (iterations); TRL: max_steps (optimizer steps: iterations·μ)."),
    Field::new("run.checkpoint_every", "Checkpoint every", Range::ANY_INT,
        "Write a checkpoint every this many iterations (0 = only at the end). TRL: save_steps; verl: trainer.save_freq."),
    Field::new("run.entropy_dynamics", "Entropy dynamics", Range::Bool,
        "Log the entropy mechanism each optimizer step (Cui et al. 2025): entropy/covariance = Cov(log π, A) over the batch's tokens, entropy/predicted_delta = −lr·Cov (the law's natural-gradient form; Adam is outside it), entropy/measured_delta (an extra forward after the update) and entropy/first_order_delta = ∇H·Δθ of the step taken (an extra backward for ∇θH): the fused lecture and transformer steps and burn's path; the WGSL engine refuses the key. The inspector colours each token by its covariance term."),
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
    Field::new("run.threads", "Threads", Range::int(0, 1024),
        "Threads of the fused CPU engines (rollout, log π_old / log π_ref, forward, backward, Adam and evaluation; the lecture model's and the transformer's): 0 = every core, 1 = one. The batch is cut into parts of whole prompts by its shape alone and the parts' sums are added in order, so every thread count gives the same bits; a small batch (the transformer's below ~2 M multiply-adds, the lecture model's below ~1 M) stays one part. In the browser: one thread. compare and the app share the cores between cells (and keep one for the window)."),
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
         from the field table in `src/config/fields.rs` (`grpo-lab config-docs`). `validate` checks \
         these ranges; the app shows the same text as tooltips. Float keys are computed in f32: \
         each also needs |x| ≤ 3.4028235e38 and, unless it is 0, |x| ≥ 1.1754944e-38 \
         (f32's smallest normal number).\n",
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

pub(super) fn json_path<'a>(
    value: &'a serde_json::Value,
    key: &str,
) -> Option<&'a serde_json::Value> {
    key.split('.').try_fold(value, |v, part| v.get(part))
}
