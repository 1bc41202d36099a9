//! The mapping itself: every grpo-lab key of a config → the framework's keys and values,
//! with how faithful the carry is, plus the framework keys grpo-lab has no key for (pinned,
//! so nothing rests on a default that moves between versions).

mod mismatch;
mod objective;

use super::value::Val;
use super::{Framework, Options};
use crate::config::{
    AdvantageMode, FIELDS, KlEstimator, KlPenaltyMode, LengthReward, PromptSampling, RewardKind,
    RunConfig,
};

/// How faithfully one grpo-lab key is carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// The same behaviour, by the framework's key(s) or by construction.
    Exact,
    /// Carried as closely as the framework allows; the difference is named (warned).
    Approx,
    /// Carried by the exported data files (prompts, splits).
    Data,
    /// The policy itself: replaced by the pretrained model (`--model`).
    Model,
    /// Has no effect in this config (its feature is off); written where a key exists.
    Inert,
    /// grpo-lab's own machinery (devices, kernels, logging): nothing to carry.
    Local,
    /// No counterpart: the export is refused unless `--lenient`.
    Refused,
}

impl Status {
    pub fn word(self) -> &'static str {
        match self {
            Status::Exact => "exact",
            Status::Approx => "approximate",
            Status::Data => "data files",
            Status::Model => "replaced by --model",
            Status::Inert => "inert here",
            Status::Local => "grpo-lab only",
            Status::Refused => "NO COUNTERPART",
        }
    }
}

/// One grpo-lab key and where it went.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub key: &'static str,
    /// Its value in this config, as TOML writes it.
    pub ours: String,
    pub theirs: Vec<(String, Val)>,
    pub status: Status,
    pub note: String,
}

/// A framework key with no grpo-lab key, written explicitly all the same.
#[derive(Debug, Clone, PartialEq)]
pub struct Pinned {
    pub key: String,
    pub val: Val,
    pub why: String,
    /// Part of the framework's algorithm that grpo-lab does not have (listed among the
    /// differences in MAPPING.md).
    pub differs: bool,
}

/// The numbers every framework's batch arithmetic starts from.
#[derive(Debug, Clone, PartialEq)]
pub struct Shape {
    /// Training prompts.
    pub p: usize,
    /// Held-out prompts.
    pub h: usize,
    /// Prompts per iteration.
    pub b: usize,
    /// Group size.
    pub g: usize,
    /// Optimizer steps per iteration.
    pub mu: usize,
    pub iterations: usize,
    /// Longest completion in the framework's (LLM tokenizer's) tokens.
    pub max_completion: usize,
    /// Longest prompt in LLM tokens.
    pub max_prompt: usize,
}

impl Shape {
    pub fn of(c: &RunConfig, p: usize, h: usize) -> Self {
        Shape {
            p,
            h,
            b: c.batch_prompts(p),
            g: c.algorithm.num_generations,
            mu: c.algorithm.mu,
            iterations: c.run.iterations,
            max_completion: max_completion_tokens(c.max_len()),
            max_prompt: 64 + 4 * c.task.n,
        }
    }
    /// Passes over the training prompts the run makes (rounded up).
    pub fn epochs(&self) -> usize {
        (self.iterations * self.b).div_ceil(self.p.max(1))
    }
}

/// An LLM spends about two tokens per number and its space (more for numbers ≥ 100): four per
/// grpo-lab token, plus room for the end of the answer.
pub fn max_completion_tokens(max_len: usize) -> usize {
    4 * max_len + 16
}

/// The whole plan for one framework.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub rows: Vec<Row>,
    pub pinned: Vec<Pinned>,
    pub shape: Shape,
}

impl Plan {
    /// Every framework key with its value, in the order written (rows, then pinned keys);
    /// a key written by two rows keeps its first value (they agree: see the tests).
    pub fn settings(&self) -> Vec<(String, Val)> {
        let mut out: Vec<(String, Val)> = Vec::new();
        let all = self
            .rows
            .iter()
            .flat_map(|r| r.theirs.iter().cloned())
            .chain(self.pinned.iter().map(|p| (p.key.clone(), p.val.clone())));
        for (k, v) in all {
            if !out.iter().any(|(k2, _)| *k2 == k) {
                out.push((k, v));
            }
        }
        out
    }

    pub fn refused(&self) -> impl Iterator<Item = &Row> {
        self.rows.iter().filter(|r| r.status == Status::Refused)
    }
}

/// The value of a key of the config as TOML writes it (`0.04`, `"clipped"`, `[[1, 0, 2]]`).
fn ours(c: &RunConfig, key: &str) -> String {
    let v = toml::Value::try_from(c).expect("a config serializes");
    let mut cur = &v;
    for part in key.split('.') {
        match cur.get(part) {
            Some(x) => cur = x,
            None => return String::new(),
        }
    }
    let s = cur.to_string();
    if s.len() > 80 {
        format!(
            "{}…",
            &s[..s.char_indices().nth(77).map_or(s.len(), |(i, _)| i)]
        )
    } else {
        s
    }
}

/// The reward weights of `[distance, inclusion_ordering, exact]` (a single verifier: weight 1).
pub fn verifier_weights(c: &RunConfig) -> [f64; 3] {
    let t = &c.task;
    let mut w = [0.0; 3];
    let index = |k: RewardKind| match k {
        RewardKind::Distance => 0,
        RewardKind::InclusionOrdering => 1,
        RewardKind::Exact => 2,
    };
    if t.reward_weights.is_empty() {
        w[index(t.reward)] = 1.0;
    } else {
        for (name, x) in &t.reward_weights {
            if let Some(k) = RewardKind::parse(name) {
                w[index(k)] += x;
            }
        }
    }
    w
}

/// Whether the task adds a format reward (transformer only).
pub fn format_reward(c: &RunConfig) -> f64 {
    if c.model.kind == crate::config::ModelKind::Transformer {
        c.task.format_reward
    } else {
        0.0
    }
}

struct Ctx<'a> {
    c: &'a RunConfig,
    fw: Framework,
    s: Shape,
    model: String,
}

fn kv(k: &str, v: Val) -> (String, Val) {
    (k.to_string(), v)
}
fn f(x: f64) -> Val {
    Val::Float(x)
}
fn i(x: usize) -> Val {
    Val::int(x)
}

/// The plan of a config for a framework.
pub fn plan(c: &RunConfig, fw: Framework, opts: &Options, p: usize, h: usize) -> Plan {
    let ctx = Ctx {
        c,
        fw,
        s: Shape::of(c, p, h),
        model: opts.model.clone(),
    };
    let rows: Vec<Row> = FIELDS
        .iter()
        .map(|field| {
            let (theirs, status, note) = row(&ctx, field.key);
            Row {
                key: field.key,
                ours: ours(c, field.key),
                theirs,
                status,
                note,
            }
        })
        .collect();
    // A key a row writes is the row's, not pinned (advantage = gae writes verl's and
    // OpenRLHF's γ and λ, pinned to 1 otherwise).
    let written = |key: &str| rows.iter().any(|r| r.theirs.iter().any(|(k, _)| k == key));
    let pinned = pinned(&ctx)
        .into_iter()
        .filter(|p| !written(&p.key))
        .collect();
    Plan {
        rows,
        pinned,
        shape: ctx.s,
    }
}

type Mapped = (Vec<(String, Val)>, Status, String);

fn exact(theirs: Vec<(String, Val)>, note: impl Into<String>) -> Mapped {
    (theirs, Status::Exact, note.into())
}
fn approx(theirs: Vec<(String, Val)>, note: impl Into<String>) -> Mapped {
    (theirs, Status::Approx, note.into())
}
fn refused(note: impl Into<String>) -> Mapped {
    (vec![], Status::Refused, note.into())
}
fn inert(theirs: Vec<(String, Val)>, note: impl Into<String>) -> Mapped {
    (theirs, Status::Inert, note.into())
}

const A: &str = "actor_rollout_ref.actor";
const R: &str = "actor_rollout_ref.rollout";

fn row(x: &Ctx, key: &str) -> Mapped {
    if let Some(mapped) = objective::objective_row(x, key) {
        return mapped;
    }
    if let Some(mapped) = mismatch::mismatch_row(x, key) {
        return mapped;
    }
    match key.split('.').next().unwrap_or_default() {
        "task" => task_row(x, key),
        "model" => model_row(x, key),
        "algorithm" => algorithm_row(x, key),
        "optimizer" => optimizer_row(x, key),
        "sampling" => sampling_row(x, key),
        "sft" => sft_row(x, key),
        "run" => run_row(x, key),
        _ => unmapped(),
    }
}

/// `run.iterations`: each framework counts the run's length in its own unit.
fn run_iterations(x: &Ctx) -> Mapped {
    use Framework::*;
    let (s, fw) = (&x.s, x.fw);
    let (it, mu) = (s.iterations, s.mu);
    match fw {
        Trl => exact(
            vec![
                kv("max_steps", i(it * mu)),
                kv("num_train_epochs", f(s.epochs() as f64)),
            ],
            format!(
                "TRL counts optimizer steps: max_steps = iterations·μ = {it}·{mu} = {}",
                it * mu
            ),
        ),
        Verl => exact(
            vec![
                kv("trainer.total_training_steps", i(it)),
                kv("trainer.total_epochs", i(s.epochs())),
            ],
            format!(
                "verl counts iterations (one rollout each): total_training_steps = {it}; total_epochs = ⌈{it}·B/P⌉ = {} only bounds it",
                s.epochs()
            ),
        ),
        OpenRlhf => {
            let per_episode = s.p.div_ceil(s.b.max(1));
            let note = format!(
                "OpenRLHF counts passes: num_episodes = ⌈iterations·B/P⌉ = ⌈{it}·{}/{}⌉ = {} ({} iterations each)",
                s.b,
                s.p,
                s.epochs(),
                per_episode
            );
            if (it * s.b).is_multiple_of(s.p.max(1)) {
                exact(vec![kv("train.num_episodes", i(s.epochs()))], note)
            } else {
                approx(
                    vec![kv("train.num_episodes", i(s.epochs()))],
                    format!(
                        "{note}: {} iterations instead of {it}",
                        s.epochs() * per_episode
                    ),
                )
            }
        }
    }
}

/// `task.length_reward`: where a framework has the same shaping, and where not.
fn length_reward(x: &Ctx) -> Mapped {
    use Framework::*;
    let (c, fw) = (x.c, x.fw);
    match c.task.length_reward {
        LengthReward::None => inert(vec![], "off"),
        LengthReward::Kimi => refused(
            "Kimi k1.5's group-relative length reward has no key in any of the three frameworks",
        ),
        LengthReward::Overlong => match fw {
            OpenRlhf => approx(
                vec![
                    kv(
                        "reward.overlong_buffer_len",
                        f((4 * c.task.overlong_buffer) as f64),
                    ),
                    kv(
                        "reward.overlong_penalty_factor",
                        f(c.task.length_reward_weight),
                    ),
                ],
                "DAPO's soft overlong punishment over the last 4·overlong_buffer LLM tokens",
            ),
            Trl => refused(
                "TRL v1.9.0 has no overlong punishment (mask_truncated_completions only drops truncated answers from the loss)",
            ),
            Verl => refused(
                "verl's main_ppo has no overlong punishment (reward_model.overlong_buffer lives in the DAPO recipe, not in ppo_trainer.yaml)",
            ),
        },
    }
}

/// A key with no export rule.
fn unmapped() -> Mapped {
    (
        vec![],
        Status::Approx,
        "no export rule for this key yet".into(),
    )
}

/// The `task.*` keys.
fn task_row(x: &Ctx, key: &str) -> Mapped {
    use Framework::*;
    let c = x.c;
    let s = &x.s;
    let fw = x.fw;
    let rk = |suffix: &str| format!("{R}.{suffix}");
    match key {
        "task.n" | "task.vocab" | "task.prompts" | "task.train_size" | "task.heldout_size"
        | "task.allow_repeats" => (
            vec![],
            Status::Data,
            format!(
                "the prompt set: data/train.jsonl ({} prompts), data/heldout.jsonl ({} prompts), drawn exactly as grpo-lab draws them for run.seed",
                s.p, s.h
            ),
        ),
        "task.reward" => {
            let theirs = match fw {
                Trl => vec![],
                Verl => vec![
                    kv("custom_reward_function.path", Val::str("reward.py")),
                    kv("custom_reward_function.name", Val::str("compute_score")),
                ],
                OpenRlhf => vec![kv("reward.remote_url", Val::str("reward.py"))],
            };
            let how = match fw {
                Trl => {
                    "reward.py's REWARD_FUNCS (distance, inclusion_ordering, exact) passed as GRPOTrainer(reward_funcs=...)"
                }
                Verl => {
                    "reward.py's compute_score(data_source, solution_str, ground_truth, extra_info)"
                }
                OpenRlhf => "reward.py's reward_func(queries, prompts, labels)",
            };
            exact(
                theirs,
                format!(
                    "{how}; the three verifiers of GRPO-SPEC §1 on the answer parsed as grpo-lab's tokenizer reads it"
                ),
            )
        }
        "task.reward_weights" => {
            let w = verifier_weights(c);
            let mut list: Vec<Val> = w.iter().map(|&x| f(x)).collect();
            if format_reward(c) != 0.0 {
                list.push(f(format_reward(c)));
            }
            let note = format!(
                "weights distance {}, inclusion_ordering {}, exact {} (WEIGHTS in reward.py)",
                w[0], w[1], w[2]
            );
            match fw {
                Trl => exact(vec![kv("reward_weights", Val::List(list))], note),
                _ => exact(vec![], format!("{note}: summed inside the reward function")),
            }
        }
        "task.max_len" => {
            let mc = i(s.max_completion);
            let theirs = match fw {
                Trl => vec![kv("max_completion_length", mc)],
                Verl => vec![
                    kv("data.max_response_length", mc.clone()),
                    kv(&rk("response_length"), mc),
                ],
                OpenRlhf => vec![
                    kv("rollout.max_new_tokens", mc),
                    kv("data.max_len", i(s.max_prompt + s.max_completion)),
                ],
            };
            approx(
                theirs,
                format!(
                    "grpo-lab counts its own tokens (one per number, plus <eos>): {} here; an LLM tokenizer spends about two per number and space, so {} = 4·{} + 16 tokens",
                    c.max_len(),
                    s.max_completion,
                    c.max_len()
                ),
            )
        }
        "task.format_reward" => {
            if format_reward(c) == 0.0 {
                inert(vec![], "off")
            } else {
                approx(
                    vec![],
                    "FORMAT_REWARD in reward.py, added when every word of the answer is a number (the LLM's end of sequence stands for <eos>; truncation is not seen by the reward function)",
                )
            }
        }
        "task.length_reward" => length_reward(x),
        "task.length_reward_weight" | "task.overlong_buffer" => {
            if c.task.length_reward == LengthReward::None {
                inert(vec![], "task.length_reward = none")
            } else {
                inert(vec![], "carried with task.length_reward")
            }
        }
        _ => unmapped(),
    }
}

/// The `model.*` keys.
fn model_row(x: &Ctx, key: &str) -> Mapped {
    use Framework::*;
    let fw = x.fw;
    match key {
        k if k.starts_with("model.") => {
            let theirs = match (fw, k) {
                (Verl, "model.kind") => {
                    vec![kv("actor_rollout_ref.model.path", Val::str(&x.model))]
                }
                (OpenRlhf, "model.kind") => {
                    vec![kv("actor.model_name_or_path", Val::str(&x.model))]
                }
                _ => vec![],
            };
            (
                theirs,
                Status::Model,
                format!("the policy is the pretrained {}", x.model),
            )
        }
        _ => unmapped(),
    }
}

/// The `algorithm.*` keys.
fn algorithm_row(x: &Ctx, key: &str) -> Mapped {
    use Framework::*;
    let c = x.c;
    let a = &c.algorithm;
    let s = &x.s;
    let fw = x.fw;
    let k = |suffix: &str| format!("{A}.{suffix}");
    let rk = |suffix: &str| format!("{R}.{suffix}");
    match key {
        "algorithm.num_generations" => {
            let theirs = match fw {
                Trl => vec![kv("num_generations", i(s.g))],
                Verl => vec![kv(&rk("n"), i(s.g))],
                OpenRlhf => vec![kv("rollout.n_samples_per_prompt", i(s.g))],
            };
            if s.g < 2 {
                return refused(
                    "G = 1: a group of one has no advantage (TRL refuses num_generations < 2; verl's and OpenRLHF's group estimators need n > 1)",
                );
            }
            exact(theirs, "")
        }
        "algorithm.prompts_per_iteration" => {
            let (b, g) = (s.b, s.g);
            // Prompts per optimizer step (`steps_per_generation` mini-batches of whole groups).
            let m = (b / a.steps_per_generation.clamp(1, b.max(1))).max(1);
            let theirs = match fw {
                Trl => vec![
                    kv("per_device_train_batch_size", i(g)),
                    kv("gradient_accumulation_steps", i(m)),
                    kv("generation_batch_size", i(b * g)),
                    kv("steps_per_generation", Val::None),
                ],
                Verl => vec![
                    kv("data.train_batch_size", i(b)),
                    kv(&k("ppo_mini_batch_size"), i(m)),
                    kv(&k("ppo_micro_batch_size_per_gpu"), i(g)),
                    kv(&rk("log_prob_micro_batch_size_per_gpu"), i(g)),
                    kv(
                        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
                        i(g),
                    ),
                ],
                OpenRlhf => vec![
                    kv("rollout.batch_size", i(b)),
                    kv("train.batch_size", i(m * g)),
                    kv("train.micro_batch_size", i(g)),
                    kv("rollout.micro_batch_size", i(g)),
                ],
            };
            let steps = b / m;
            let how = match fw {
                Trl => format!(
                    "TRL counts completions: generation_batch_size = B·G = {b}·{g} = {}; one optimizer step takes per_device_train_batch_size · processes · gradient_accumulation_steps = {g} · 1 · {m} = {} completions, {steps} step(s) per generation (with W processes divide gradient_accumulation_steps by W)",
                    b * g,
                    m * g
                ),
                Verl => format!(
                    "verl counts prompts: data.train_batch_size = B = {b} and ppo_mini_batch_size = {m} ({steps} optimizer step(s) per epoch over the batch; verl multiplies both by n = {g} internally: {} responses)",
                    b * g
                ),
                OpenRlhf => format!(
                    "OpenRLHF counts prompts for rollouts and samples for training: rollout.batch_size = B = {b}, train.batch_size = {} ({steps} optimizer step(s) per epoch over the batch)",
                    m * g
                ),
            };
            if b < s.p {
                approx(
                    theirs,
                    format!(
                        "{how}. B = {b} of {} prompts: the frameworks walk a shuffled epoch; grpo-lab draws B prompts afresh each iteration",
                        s.p
                    ),
                )
            } else {
                exact(theirs, how)
            }
        }
        "algorithm.mu" => {
            let theirs = match fw {
                Trl => vec![kv("num_iterations", i(s.mu))],
                Verl => vec![kv(&k("ppo_epochs"), i(s.mu))],
                OpenRlhf => vec![kv("train.max_epochs", i(s.mu))],
            };
            exact(
                theirs,
                format!(
                    "μ = {} passes (epochs) over each batch of rollouts, one optimizer step per mini-batch",
                    s.mu
                ),
            )
        }
        "algorithm.advantage" => advantage(x),
        "algorithm.beta" => {
            let theirs = match fw {
                Trl => vec![kv("beta", f(a.beta))],
                Verl => vec![
                    kv(&k("kl_loss_coef"), f(a.beta)),
                    kv("algorithm.kl_ctrl.kl_coef", f(a.beta)),
                ],
                OpenRlhf => vec![
                    kv("algo.kl.init_coef", f(a.beta)),
                    kv("algo.kl.target", Val::None),
                ],
            };
            let note = match fw {
                Trl => "written explicitly: TRL's default beta went 0.04 → 0.0",
                Verl => {
                    "kl_loss_coef for the KL in the loss, algorithm.kl_ctrl.kl_coef (fixed controller) for the KL in the reward"
                }
                OpenRlhf => "algo.kl.target = None: a fixed coefficient",
            };
            exact(theirs, note)
        }
        "algorithm.kl_estimator" => kl_estimator(x),
        "algorithm.kl_penalty" => {
            let on = a.beta > 0.0;
            let in_loss = a.kl_penalty == KlPenaltyMode::Loss;
            match fw {
                Trl if in_loss || !on => exact(vec![], "TRL puts β·KL in the loss"),
                Trl => refused("KL in the reward (r − β·KL): TRL only puts the KL in the loss"),
                Verl => exact(
                    vec![
                        kv(&k("use_kl_loss"), Val::Bool(on && in_loss)),
                        kv("algorithm.use_kl_in_reward", Val::Bool(on && !in_loss)),
                    ],
                    "",
                ),
                OpenRlhf => exact(
                    vec![kv("algo.kl.use_loss", Val::Bool(in_loss))],
                    "OpenRLHF: without algo.kl.use_loss the KL goes into the reward",
                ),
            }
        }
        "algorithm.ref_period" => {
            let live = a.beta > 0.0 && a.ref_period > 0;
            match fw {
                Trl => exact(
                    vec![
                        kv("sync_ref_model", Val::Bool(live)),
                        kv("ref_model_sync_steps", i((a.ref_period * s.mu).max(1))),
                        kv("ref_model_mixup_alpha", f(1.0)),
                    ],
                    format!(
                        "TRL counts optimizer steps: ref_model_sync_steps = ref_period·μ = {}·{}; mixup α = 1 copies the policy, as grpo-lab does",
                        a.ref_period, s.mu
                    ),
                ),
                _ if live => approx(
                    vec![],
                    format!(
                        "no key: the reference stays the initial policy for the whole run; grpo-lab copies the policy into it every {} iterations",
                        a.ref_period
                    ),
                ),
                _ => inert(vec![], "no KL, or never refreshed"),
            }
        }
        "algorithm.entropy_coef" => {
            let e = f(a.entropy_coef);
            let theirs = match fw {
                Trl => vec![kv("entropy_coef", e)],
                Verl => vec![kv(&k("entropy_coeff"), e)],
                OpenRlhf => vec![kv("actor.entropy_coef", e)],
            };
            exact(theirs, "")
        }
        "algorithm.dynamic_sampling" => {
            let on = a.dynamic_sampling;
            match fw {
                OpenRlhf => {
                    let theirs = vec![
                        kv("algo.dynamic_filtering_enable", Val::Bool(on)),
                        kv(
                            "algo.dynamic_filtering_range",
                            Val::List(vec![f(0.0), f(1.0)]),
                        ),
                    ];
                    if on {
                        approx(
                            theirs,
                            "OpenRLHF drops groups whose mean normalised score is 0 or 1 (all wrong or all best); grpo-lab replaces every group whose rewards are all equal",
                        )
                    } else {
                        inert(theirs, "off")
                    }
                }
                _ if !on => inert(vec![], "off"),
                Trl => {
                    refused("DAPO dynamic sampling: TRL v1.9.0 has no filter for zero-std groups")
                }
                Verl => refused(
                    "DAPO dynamic sampling: algorithm.filter_groups belongs to verl's DAPO recipe, not to main_ppo",
                ),
            }
        }
        "algorithm.max_resample_rounds" => {
            if !a.dynamic_sampling {
                inert(vec![], "dynamic sampling off")
            } else {
                match fw {
                    OpenRlhf => approx(
                        vec![],
                        "no key: OpenRLHF sends a new prompt for each group it filters out until the batch is full or the prompts run out (its vLLM sampler's `_generate_vllm`); grpo-lab replaces them for at most this many rounds, then keeps the groups still flat (their advantage 0)",
                    ),
                    Trl | Verl => inert(
                        vec![],
                        "carried with algorithm.dynamic_sampling, which has no counterpart here",
                    ),
                }
            }
        }
        "algorithm.prompt_sampling" => {
            let theirs = match fw {
                Trl => vec![kv("shuffle_dataset", Val::Bool(true))],
                Verl => vec![kv("data.shuffle", Val::Bool(true))],
                OpenRlhf => vec![],
            };
            match a.prompt_sampling {
                PromptSampling::Uniform => {
                    exact(theirs, "uniform: a shuffled pass over the prompts")
                }
                other => refused(format!(
                    "`{other}` prompt sampling (after Kimi k1.5) has no key in the framework"
                )),
            }
        }
        "algorithm.gamma"
        | "algorithm.lam"
        | "algorithm.value_lr"
        | "algorithm.value_epochs"
        | "algorithm.value_hidden" => {
            if a.advantage != AdvantageMode::Gae {
                return inert(vec![], "used only with advantage = gae");
            }
            let theirs = match (fw, key) {
                (Trl, _) => None,
                (Verl, "algorithm.gamma") => Some(kv("algorithm.gamma", f(a.gamma))),
                (Verl, "algorithm.lam") => Some(kv("algorithm.lam", f(a.lam))),
                (Verl, "algorithm.value_lr") => Some(kv("critic.optim.lr", f(a.value_lr))),
                (Verl, "algorithm.value_epochs") => {
                    Some(kv("critic.ppo_epochs", i(a.value_epochs)))
                }
                (OpenRlhf, "algorithm.gamma") => Some(kv("algo.advantage.gamma", f(a.gamma))),
                (OpenRlhf, "algorithm.lam") => Some(kv("algo.advantage.lambd", f(a.lam))),
                (OpenRlhf, "algorithm.value_lr") => Some(kv("critic.adam.lr", f(a.value_lr))),
                _ => None,
            };
            match theirs {
                Some(kv) if key == "algorithm.gamma" || key == "algorithm.lam" => {
                    exact(vec![kv], "")
                }
                Some(kv) => approx(
                    vec![kv],
                    "their critic is a language model of its own; ours is one tanh layer over one-hot states",
                ),
                None if fw == Trl => {
                    refused("PPO with a critic is TRL's PPOTrainer, not GRPOTrainer")
                }
                None if key == "algorithm.value_epochs" && a.value_epochs == x.s.mu => approx(
                    vec![],
                    "OpenRLHF's critic trains train.max_epochs = μ epochs, as here; their critic is a language model of its own",
                ),
                None if key == "algorithm.value_epochs" => refused(
                    "OpenRLHF's critic trains as many epochs as the actor (train.max_epochs); it has no count of its own",
                ),
                None => refused(match fw {
                    Verl => {
                        "the critic's shape is the framework's critic model (critic.model.path)"
                    }
                    _ => {
                        "the critic's shape is the framework's critic model (critic.model_name_or_path)"
                    }
                }),
            }
        }
        k if k.starts_with("algorithm.bugs.") => {
            let on = ours(c, k) == "true";
            if on {
                refused("a deliberate bug of the bug gallery (GRPO-SPEC §5) is not exported")
            } else {
                inert(vec![], "off")
            }
        }
        _ => unmapped(),
    }
}

/// The `optimizer.*` keys.
fn optimizer_row(x: &Ctx, key: &str) -> Mapped {
    use Framework::*;
    let c = x.c;
    let fw = x.fw;
    let k = |suffix: &str| format!("{A}.{suffix}");
    match key {
        "optimizer.lr" => {
            let lr = f(c.optimizer.lr);
            let theirs = match fw {
                Trl => vec![kv("learning_rate", lr)],
                Verl => vec![kv(&k("optim.lr"), lr)],
                OpenRlhf => vec![kv("actor.adam.lr", lr)],
            };
            let note = if c.optimizer.lr > 1e-4 {
                format!(
                    "{} is a learning rate for grpo-lab's tiny models; LLMs are fine-tuned near 1e-6 (`--set optimizer.lr=1e-6`)",
                    c.optimizer.lr
                )
            } else {
                String::new()
            };
            exact(theirs, note)
        }
        "optimizer.beta1" | "optimizer.beta2" => {
            let o = &c.optimizer;
            let (b1, b2) = (f(o.beta1), f(o.beta2));
            let theirs = match (fw, key) {
                (Trl, "optimizer.beta1") => vec![kv("adam_beta1", b1)],
                (Trl, _) => vec![kv("adam_beta2", b2)],
                (Verl, _) => vec![kv(&k("optim.betas"), Val::List(vec![b1, b2]))],
                (OpenRlhf, _) => vec![kv("actor.adam.betas", Val::List(vec![b1, b2]))],
            };
            exact(theirs, "AdamW with weight decay 0 is Adam")
        }
        "optimizer.eps" => match fw {
            Trl => exact(vec![kv("adam_epsilon", f(c.optimizer.eps))], ""),
            OpenRlhf => exact(vec![kv("actor.adam.eps", f(c.optimizer.eps))], ""),
            Verl if c.optimizer.eps == 1e-8 => {
                exact(vec![], "no key: torch's AdamW default 1e-8, the same")
            }
            Verl => approx(
                vec![],
                format!(
                    "no key: verl uses torch's AdamW default ε = 1e-8, grpo-lab {}",
                    c.optimizer.eps
                ),
            ),
        },
        "optimizer.max_grad_norm" => {
            let g = c.optimizer.max_grad_norm;
            match fw {
                Trl => exact(vec![kv("max_grad_norm", f(g))], "0 = no clipping in both"),
                OpenRlhf => exact(
                    vec![kv("actor.max_norm", f(g))],
                    "0 = no clipping (DeepSpeed)",
                ),
                Verl => {
                    let v = if g > 0.0 { g } else { 1e9 };
                    exact(
                        vec![kv(&k("grad_clip"), f(v)), kv(&k("optim.clip_grad"), f(v))],
                        if g > 0.0 {
                            String::new()
                        } else {
                            "grpo-lab's 0 (no clipping) written as a bound never reached: verl always clips".into()
                        },
                    )
                }
            }
        }
        _ => unmapped(),
    }
}

/// The `sampling.*` keys.
fn sampling_row(x: &Ctx, key: &str) -> Mapped {
    use Framework::*;
    let c = x.c;
    let fw = x.fw;
    let rk = |suffix: &str| format!("{R}.{suffix}");
    match key {
        "sampling.temperature" => {
            let t = f(c.sampling.temperature);
            let theirs = match fw {
                Trl => vec![kv("temperature", t)],
                Verl => vec![kv(&rk("temperature"), t)],
                OpenRlhf => vec![kv("rollout.temperature", t)],
            };
            exact(theirs, "")
        }
        "sampling.top_k" => {
            let kk = c.sampling.top_k;
            match fw {
                Trl => exact(vec![kv("top_k", i(kk))], "0 = off in both"),
                Verl => exact(
                    vec![kv(
                        &rk("top_k"),
                        Val::Int(if kk == 0 { -1 } else { kk as i64 }),
                    )],
                    "verl: −1 = off",
                ),
                OpenRlhf if kk == 0 => exact(vec![], "no key: OpenRLHF samples without top-k"),
                OpenRlhf => refused("top-k sampling: train_ppo_ray.py v0.11.0 has no top-k flag"),
            }
        }
        "sampling.top_p" => {
            let p = f(c.sampling.top_p);
            let theirs = match fw {
                Trl => vec![kv("top_p", p)],
                Verl => vec![kv(&rk("top_p"), p)],
                OpenRlhf => vec![kv("rollout.top_p", p)],
            };
            exact(theirs, "")
        }
        _ => unmapped(),
    }
}

/// The `sft.*` keys.
fn sft_row(x: &Ctx, key: &str) -> Mapped {
    let c = x.c;
    match key {
        "sft.steps" => {
            if c.sft.steps == 0 {
                inert(vec![], "no supervised cold start")
            } else {
                // Each framework's own supervised trainer.
                let sft = match x.fw {
                    Framework::Trl => "TRL's SFTTrainer",
                    Framework::Verl => "verl's SFT trainer (`-m verl.trainer.fsdp_sft_trainer`)",
                    Framework::OpenRlhf => {
                        "OpenRLHF's SFT trainer (`deepspeed --module openrlhf.cli.train_sft`)"
                    }
                };
                approx(
                    vec![],
                    format!(
                        "the {}-step supervised cold start is not part of the GRPO config: run {sft} on data/train.jsonl (prompt, ground_truth) first and pass its checkpoint as --model",
                        c.sft.steps
                    ),
                )
            }
        }
        k if k.starts_with("sft.") => inert(vec![], "carried with sft.steps"),
        _ => unmapped(),
    }
}

/// The `run.*` keys.
fn run_row(x: &Ctx, key: &str) -> Mapped {
    use Framework::*;
    let c = x.c;
    let s = &x.s;
    let fw = x.fw;
    let k = |suffix: &str| format!("{A}.{suffix}");
    match key {
        "run.name" => {
            let n = Val::str(&c.run.name);
            let theirs = match fw {
                Trl => vec![
                    kv("run_name", n),
                    kv("output_dir", Val::str(format!("runs/{}", c.run.name))),
                ],
                Verl => vec![
                    kv("trainer.experiment_name", n),
                    kv("trainer.project_name", Val::str("grpo-lab")),
                ],
                OpenRlhf => vec![
                    kv("logger.wandb.run_name", n),
                    kv(
                        "ckpt.output_dir",
                        Val::str(format!("./ckpt/{}", c.run.name)),
                    ),
                    kv(
                        "logger.tensorboard_dir",
                        Val::str(format!("./logs/{}", c.run.name)),
                    ),
                ],
            };
            exact(theirs, "")
        }
        "run.seed" => {
            let seed = i(c.run.seed as usize);
            let theirs = match fw {
                Trl => vec![kv("seed", seed)],
                Verl => vec![
                    kv("data.seed", seed.clone()),
                    kv(&k("data_loader_seed"), seed),
                ],
                OpenRlhf => vec![kv("train.seed", seed)],
            };
            exact(
                theirs,
                "the seed is carried; the frameworks' random draws differ from grpo-lab's",
            )
        }
        "run.iterations" => run_iterations(x),
        "run.checkpoint_every" => {
            let every = if c.run.checkpoint_every == 0 {
                s.iterations
            } else {
                c.run.checkpoint_every
            };
            match fw {
                Trl => exact(
                    vec![
                        kv("save_strategy", Val::str("steps")),
                        kv("save_steps", i(every * s.mu)),
                    ],
                    "TRL counts optimizer steps: save_steps = checkpoint_every·μ",
                ),
                Verl => exact(vec![kv("trainer.save_freq", i(every))], ""),
                OpenRlhf => exact(
                    vec![kv("ckpt.save_steps", i(every))],
                    "OpenRLHF counts rollout batches",
                ),
            }
        }
        "run.log_groups" => {
            let theirs = match fw {
                Trl => vec![kv("log_completions", Val::Bool(c.run.log_groups > 0))],
                Verl => vec![kv("trainer.log_val_generations", i(c.run.log_groups))],
                OpenRlhf => vec![],
            };
            (
                theirs,
                Status::Local,
                "what is logged, not what is trained".into(),
            )
        }
        k if k.starts_with("run.") => (
            vec![],
            Status::Local,
            "grpo-lab's compute choice; the framework's placement is in the pinned keys".into(),
        ),
        _ => unmapped(),
    }
}

fn advantage(x: &Ctx) -> Mapped {
    use Framework::*;
    let mode = x.c.algorithm.advantage;
    let eps = |theirs: &str| format!("std ε: grpo-lab 1e-5, {theirs}; std unbiased (n − 1) in all");
    match (x.fw, mode) {
        (Trl, AdvantageMode::Normalized) => approx(
            vec![kv("scale_rewards", Val::str("group"))],
            eps("TRL 1e-4"),
        ),
        (Trl, AdvantageMode::Centered) => exact(
            vec![kv("scale_rewards", Val::str("none"))],
            "Dr. GRPO's centred advantage",
        ),
        (Trl, AdvantageMode::BatchNormalized) => approx(
            vec![kv("scale_rewards", Val::str("batch"))],
            "group mean removed, divided by the batch std (TRL adds ε = 1e-4)",
        ),
        (Verl, AdvantageMode::Normalized) => approx(
            vec![
                kv("algorithm.adv_estimator", Val::str("grpo")),
                kv("algorithm.norm_adv_by_std_in_grpo", Val::Bool(true)),
            ],
            eps("verl 1e-6"),
        ),
        (Verl, AdvantageMode::Centered) => exact(
            vec![
                kv("algorithm.adv_estimator", Val::str("grpo")),
                kv("algorithm.norm_adv_by_std_in_grpo", Val::Bool(false)),
            ],
            "Dr. GRPO's centred advantage",
        ),
        (Verl, AdvantageMode::Rloo) => exact(
            vec![
                kv("algorithm.adv_estimator", Val::str("rloo")),
                kv("algorithm.norm_adv_by_std_in_grpo", Val::Bool(true)),
            ],
            "verl's rloo: r_i − mean of the others (norm_adv_by_std_in_grpo unused)",
        ),
        (Verl, AdvantageMode::BatchNormalized) => {
            refused("batch_normalized (TRL's scale_rewards=\"batch\") has no verl key")
        }
        (OpenRlhf, AdvantageMode::Normalized) => approx(
            vec![
                kv("algo.advantage.estimator", Val::str("group_norm")),
                kv("algo.advantage.no_std_norm", Val::Bool(false)),
            ],
            eps("OpenRLHF 1e-9"),
        ),
        (OpenRlhf, AdvantageMode::Centered) => exact(
            vec![
                kv("algo.advantage.estimator", Val::str("dr_grpo")),
                kv("algo.advantage.no_std_norm", Val::Bool(true)),
            ],
            "Dr. GRPO's centred advantage",
        ),
        (OpenRlhf, AdvantageMode::Rloo) => exact(
            vec![
                kv("algo.advantage.estimator", Val::str("rloo")),
                kv("algo.advantage.no_std_norm", Val::Bool(false)),
            ],
            "",
        ),
        (OpenRlhf, AdvantageMode::BatchNormalized) => approx(
            vec![
                kv("algo.advantage.estimator", Val::str("reinforce_baseline")),
                kv("algo.advantage.no_std_norm", Val::Bool(false)),
            ],
            "reinforce_baseline: group mean removed, then whitened over the batch (its mean removed too)",
        ),
        (Verl, AdvantageMode::Gae) => approx(
            vec![kv("algorithm.adv_estimator", Val::str("gae"))],
            "GAE with a learned critic (verl's is a model of its own: critic.model.path)",
        ),
        (OpenRlhf, AdvantageMode::Gae) => approx(
            vec![kv("algo.advantage.estimator", Val::str("gae"))],
            "GAE with a learned critic (OpenRLHF's is a model of its own: critic.model_name_or_path)",
        ),
        (Trl, AdvantageMode::Gae) => {
            refused("gae: PPO with a critic is TRL's PPOTrainer, not GRPOTrainer")
        }
        (Trl, AdvantageMode::Rloo) => refused(
            "rloo: TRL's GRPOTrainer has no leave-one-out baseline (RLOOTrainer is another trainer)",
        ),
        (_, m) if !AdvantageMode::GROUP.contains(&m) && m != AdvantageMode::Gae => {
            objective::estimator(x)
        }
        (_, m) => refused(format!(
            "`{m}` advantages have no counterpart (GRPO-SPEC §3 teaching modes)"
        )),
    }
}

fn kl_estimator(x: &Ctx) -> Mapped {
    use Framework::*;
    let a = &x.c.algorithm;
    let on = a.beta > 0.0;
    match x.fw {
        Trl => match a.kl_estimator {
            KlEstimator::K3 => exact(vec![], "TRL's KL is always k3"),
            _ if !on => inert(vec![], "β = 0; TRL's KL is always k3"),
            e => refused(format!("{e}: TRL's KL is always k3")),
        },
        Verl => {
            let name = match a.kl_estimator {
                KlEstimator::K1 => "kl",
                KlEstimator::K2 => "mse",
                KlEstimator::K3 => "low_var_kl",
            };
            let theirs = vec![
                kv(&format!("{A}.kl_loss_type"), Val::str(name)),
                kv("algorithm.kl_penalty", Val::str(name)),
            ];
            if a.kl_estimator == KlEstimator::K3 && on {
                approx(
                    theirs,
                    "k3 = verl's low_var_kl, which clamps each token's estimate to [−10, 10]",
                )
            } else {
                exact(theirs, "verl's names: k1 = kl, k2 = mse, k3 = low_var_kl")
            }
        }
        OpenRlhf => exact(
            vec![kv("algo.kl.estimator", Val::str(a.kl_estimator.name()))],
            "",
        ),
    }
}

/// Framework keys grpo-lab has no key for, written so no default decides them.
fn pinned(x: &Ctx) -> Vec<Pinned> {
    use Framework::*;
    let p = |k: &str, v: Val, why: &str| Pinned {
        key: k.into(),
        val: v,
        why: why.into(),
        differs: false,
    };
    let s = &x.s;
    let greedy = "grpo-lab measures held-out accuracy greedily";
    match x.fw {
        Trl => vec![
            p(
                "lr_scheduler_type",
                Val::str("constant"),
                "grpo-lab's learning rate is constant",
            ),
            p("warmup_steps", i(0), "no warmup"),
            p("weight_decay", f(0.0), "Adam, no decay"),
            p(
                "optim",
                Val::str("adamw_torch"),
                "AdamW (= Adam with weight decay 0)",
            ),
            p("min_p", Val::None, "no min-p sampling"),
            p("repetition_penalty", f(1.0), "none"),
            p(
                "use_vllm",
                Val::Bool(false),
                "generation by transformers (set True with a vLLM server for speed)",
            ),
            p(
                "disable_dropout",
                Val::Bool(true),
                "grpo-lab's models have no dropout",
            ),
            p(
                "remove_unused_columns",
                Val::Bool(false),
                "the reward functions need the ground_truth column",
            ),
            p("num_generations_eval", Val::None, "= num_generations"),
            p(
                "eval_strategy",
                Val::str("no"),
                "TRL's evaluation samples; run the held-out split greedily after training instead",
            ),
            p("logging_steps", i(1), "grpo-lab logs every step"),
            p(
                "report_to",
                Val::Expr("REPORT_TO"),
                "TensorBoard where it is installed (next to `grpo-lab export-log --to tensorboard`), else none",
            ),
            p(
                "bf16",
                Val::Expr("BF16"),
                "LLM training precision where the GPU supports bf16, else fp32 (grpo-lab computes in f32)",
            ),
            p("gradient_checkpointing", Val::Bool(true), "memory only"),
        ],
        Verl => vec![
            p("algorithm.gamma", f(1.0), "one reward per answer"),
            p("algorithm.lam", f(1.0), "one reward per answer"),
            p("algorithm.kl_ctrl.type", Val::str("fixed"), "β is constant"),
            p("algorithm.use_pf_ppo", Val::Bool(false), "none"),
            p(
                &format!("{A}.shuffle"),
                Val::Bool(false),
                "mini-batches in order",
            ),
            p(
                &format!("{A}.use_dynamic_bsz"),
                Val::Bool(false),
                "fixed batches",
            ),
            p(&format!("{A}.strategy"), Val::str("fsdp"), "placement"),
            p(
                &format!("{A}.optim.weight_decay"),
                f(0.0),
                "verl's default is 0.01; grpo-lab's Adam has none",
            ),
            p(&format!("{A}.optim.lr_warmup_steps"), i(0), "no warmup"),
            p(
                &format!("{A}.optim.lr_warmup_steps_ratio"),
                f(0.0),
                "no warmup",
            ),
            p(
                &format!("{A}.optim.lr_scheduler_type"),
                Val::str("constant"),
                "constant learning rate",
            ),
            p(&format!("{R}.name"), Val::str("vllm"), "the rollout engine"),
            p(
                &format!("{R}.mode"),
                Val::str("async"),
                "verl 0.7's rollout mode",
            ),
            p(
                &format!("{R}.do_sample"),
                Val::Bool(true),
                "sampled rollouts",
            ),
            p(&format!("{R}.tensor_model_parallel_size"), i(1), "one GPU"),
            p(&format!("{R}.gpu_memory_utilization"), f(0.5), "placement"),
            p(
                &format!("{R}.prompt_length"),
                i(s.max_prompt),
                "= data.max_prompt_length",
            ),
            p(
                &format!("{R}.val_kwargs.do_sample"),
                Val::Bool(false),
                greedy,
            ),
            p(&format!("{R}.val_kwargs.temperature"), f(0.0), greedy),
            p(&format!("{R}.val_kwargs.n"), i(1), greedy),
            p(
                "data.train_files",
                Val::str("data/train.parquet"),
                "written by data/make_parquet.py",
            ),
            p(
                "data.val_files",
                Val::str("data/heldout.parquet"),
                "written by data/make_parquet.py",
            ),
            p("data.prompt_key", Val::str("prompt"), "the parquet column"),
            p(
                "data.max_prompt_length",
                i(s.max_prompt),
                "the longest prompt in LLM tokens, with room",
            ),
            p(
                "data.filter_overlong_prompts",
                Val::Bool(false),
                "no prompt is dropped",
            ),
            p(
                "data.truncation",
                Val::str("error"),
                "a prompt too long is an error, not silently cut",
            ),
            p(
                "reward_model.enable",
                Val::Bool(false),
                "a rule-based reward",
            ),
            p(
                "reward_model.reward_manager",
                Val::str("naive"),
                "calls compute_score once per answer",
            ),
            p("trainer.critic_warmup", i(0), "no critic warm-up"),
            p(
                "trainer.n_gpus_per_node",
                i(1),
                "placement: with more GPUs keep train_batch_size·n divisible by them",
            ),
            p("trainer.nnodes", i(1), "placement"),
            p(
                "trainer.logger",
                Val::List(vec![Val::str("console"), Val::str("tensorboard")]),
                "next to `grpo-lab export-log --to tensorboard`",
            ),
            p(
                "trainer.val_before_train",
                Val::Bool(true),
                "grpo-lab measures accuracy before the first step",
            ),
            p(
                "trainer.test_freq",
                i(1),
                "grpo-lab measures held-out accuracy every iteration",
            ),
        ],
        OpenRlhf => vec![
            p("algo.advantage.gamma", f(1.0), "one reward per answer"),
            p("algo.advantage.lambd", f(1.0), "one reward per answer"),
            p(
                "reward.normalize_enable",
                Val::Bool(false),
                "rewards as the verifiers give them",
            ),
            p(
                "reward.clip_range",
                Val::List(vec![f(-1e6), f(1e6)]),
                "OpenRLHF clips rewards to [−10, 10] by default; grpo-lab does not clip",
            ),
            p(
                "actor.optim",
                Val::str("adam"),
                "AdamW (= Adam with weight decay 0)",
            ),
            p("actor.adam.weight_decay", f(0.0), "no decay"),
            p(
                "actor.lr_scheduler",
                Val::str("constant"),
                "OpenRLHF's default is cosine_with_min_lr",
            ),
            p("actor.lr_warmup_ratio", f(0.0), "no warmup"),
            p(
                "data.prompt_dataset",
                Val::str("data/train.jsonl"),
                "the training prompts",
            ),
            p("data.input_key", Val::str("prompt"), "the prompt column"),
            p(
                "data.label_key",
                Val::str("ground_truth"),
                "passed to reward_func as labels",
            ),
            p(
                "eval.dataset",
                Val::str("data/heldout.jsonl"),
                "the held-out prompts",
            ),
            p("eval.temperature", f(0.0), greedy),
            p("eval.n_samples_per_prompt", i(1), greedy),
            p(
                "eval.steps",
                i(1),
                "grpo-lab measures held-out accuracy every iteration",
            ),
            p("actor.num_nodes", i(1), "placement"),
            p("actor.num_gpus_per_node", i(1), "placement"),
            p("ref.num_nodes", i(1), "placement"),
            p("ref.num_gpus_per_node", i(1), "placement"),
            p("vllm.num_engines", i(1), "placement"),
            p("vllm.tensor_parallel_size", i(1), "placement"),
            p(
                "train.colocate_all",
                Val::Bool(true),
                "one GPU holds actor, reference and vLLM",
            ),
            p("ds.zero_stage", i(2), "placement"),
            p(
                "ds.param_dtype",
                Val::str("bf16"),
                "LLM training precision (grpo-lab computes in f32)",
            ),
            p("logger.logging_steps", i(1), "grpo-lab logs every step"),
        ],
    }
}
