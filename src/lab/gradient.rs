//! The gradient lab: every estimator against the true gradient (`grpo-lab gradient-lab`).
//!
//! θ_old is the run's policy at `at_iteration` (or a checkpoint's); θ is θ_old after `mu_step`
//! of the next iteration's μ optimizer steps, taken by the trainer itself (θ = θ_old when 0).
//! Each of `batches` independent batches draws `B` prompts (the config's batch, uniformly
//! without replacement: J's prompt distribution is uniform over the training prompts) and a
//! `budget` of answers per prompt from π_θold. The same answers are grouped by each `G` that
//! divides the budget (an equal rollout budget: `budget/G` groups of `G` per prompt), their
//! rewards turned into advantages by each mode, and each objective's gradient at θ (β = 0, no
//! entropy bonus: an estimate of `∇J`, J = E[R]) set against the exact `∇J(θ)` of [`exact`]:
//! cosine, signal-to-noise ratio, scale, bias after the best scale and variance. The
//! reference's KL is estimated by k1, k2 and k3 on answers drawn from π_θ.

use super::exact::{self, Model, Tables, Truth, add_into, dot, norm};
use super::study::{Ctx, Drawn, Estimator, Studied, batch_prompts};
use crate::config::{AdvantageMode, ImportanceSamplingLevel, LossMode, ModelKind, RunConfig};
use crate::engine::fused_lecture::FusedLecture;
use crate::engine::{Batch, Which};
use crate::grpo::Trainer;
use crate::model::lecture::LectureWeights;
use crate::objective::advantage;
use crate::objective::loss::LossSettings;
use crate::task::RewardFn;
use serde::Serialize;

/// What the lab is asked.
#[derive(Debug, Clone)]
pub struct LabArgs {
    /// θ_old: the policy after this many iterations of the run.
    pub at_iteration: usize,
    /// θ: θ_old after this many of the next iteration's μ optimizer steps.
    pub mu_step: usize,
    /// Independent batches per estimator.
    pub batches: usize,
    /// Answers per prompt in a batch (each `G` must divide it).
    pub budget: usize,
    pub group_sizes: Vec<usize>,
    pub modes: Vec<AdvantageMode>,
    /// Objective names ([`OBJECTIVES`]); empty: the config's.
    pub objectives: Vec<String>,
    /// Answers per prompt of the large-sample truth, where the answers cannot be enumerated.
    pub truth_samples: usize,
}

impl Default for LabArgs {
    fn default() -> Self {
        Self {
            at_iteration: 20,
            mu_step: 0,
            batches: 400,
            budget: 256,
            group_sizes: vec![2, 4, 8, 16, 32, 64, 128, 256],
            modes: vec![
                AdvantageMode::Raw,
                AdvantageMode::Centered,
                AdvantageMode::Rloo,
                AdvantageMode::Normalized,
                AdvantageMode::BatchNormalized,
            ],
            objectives: Vec::new(),
            truth_samples: 1 << 16,
        }
    }
}

impl LabArgs {
    /// The defaults for a config's model: the lecture's above; the transformer's smaller —
    /// each of its gradients is a forward and a backward through the network over every
    /// answer of a batch — 50 batches of 32 answers per prompt (G up to 32), and a truth of
    /// 2¹⁸ answers in all.
    pub fn for_config(c: &RunConfig) -> Self {
        match c.model.kind {
            ModelKind::Lecture => Self::default(),
            ModelKind::Transformer => Self {
                batches: 50,
                budget: 32,
                group_sizes: vec![2, 4, 8, 16, 32],
                truth_samples: 1 << 18,
                ..Self::default()
            },
        }
    }

    /// Past μ step 0 the objectives differ: every one of them by default (unless some are
    /// named), each on RLOO advantages unless `modes_given`, so that only the objectives differ.
    pub fn off_policy_defaults(mut self, modes_given: bool) -> Self {
        if self.mu_step > 0 {
            if self.objectives.is_empty() {
                self.objectives = OBJECTIVES.iter().map(|s| s.to_string()).collect();
            }
            if !modes_given {
                self.modes = vec![AdvantageMode::Rloo];
            }
        }
        self
    }
}

/// The objectives the lab can set side by side: the loss modes, and GSPO (clipped, ratio per
/// sequence).
pub const OBJECTIVES: &[&str] = &[
    "naive",
    "unclipped",
    "clipped",
    "cispo",
    "sapo",
    "gmpo",
    "gspo",
];

/// A config's settings under one of [`OBJECTIVES`], with β = 0 and no entropy bonus.
pub fn objective_settings(base: &LossSettings, name: &str) -> Option<LossSettings> {
    let mut s = LossSettings {
        beta: 0.0,
        entropy_coef: 0.0,
        ..*base
    };
    if name == "gspo" {
        s.mode = LossMode::Clipped;
        s.level = ImportanceSamplingLevel::Sequence;
    } else {
        s.mode = LossMode::parse(name)?;
    }
    Some(s)
}

/// The config's own objective's name in [`OBJECTIVES`].
pub fn config_objective(c: &RunConfig) -> &'static str {
    match (c.algorithm.loss, c.algorithm.importance_sampling_level) {
        (LossMode::Clipped, ImportanceSamplingLevel::Sequence) => "gspo",
        (mode, _) => mode.name(),
    }
}

/// Why a lab cannot run.
pub fn check(c: &RunConfig, a: &LabArgs) -> Result<(), String> {
    if c.sampling.top_k > 0 || c.sampling.top_p < 1.0 || c.sampling.has_gap() {
        return Err("the gradient lab studies π itself: sampling.top_k, sampling.top_p and the mismatch lab's sampler keys must be off".into());
    }
    if a.mu_step >= c.algorithm.steps_per_iteration() {
        return Err(format!(
            "--mu-step {} needs more optimizer steps per iteration than that (algorithm.mu × steps_per_generation = {})",
            a.mu_step,
            c.algorithm.steps_per_iteration()
        ));
    }
    if a.batches < 2 {
        return Err("--batches must be at least 2 (a variance needs two)".into());
    }
    if a.budget < 2 {
        return Err(format!(
            "--budget {}: at least 2 answers per prompt (one group of G ≥ 2)",
            a.budget
        ));
    }
    if let Some(g) = a
        .group_sizes
        .iter()
        .find(|&&g| g < 2 || !a.budget.is_multiple_of(g))
    {
        return Err(format!(
            "--group-sizes: G = {g} must be at least 2 and divide --budget {}",
            a.budget
        ));
    }
    if let Some(o) = a
        .objectives
        .iter()
        .find(|o| !OBJECTIVES.contains(&o.as_str()))
    {
        return Err(format!(
            "--objectives: unknown objective '{o}'; allowed: {}",
            OBJECTIVES.join(", ")
        ));
    }
    Ok(())
}

/// The lecture policy studied: θ's fused net, and θ_old's, θ's and the reference's log π tables.
pub struct LectureStudy {
    pub theta: FusedLecture,
    pub old: Tables,
    pub at: Tables,
    pub reference: Tables,
}

impl Studied for LectureStudy {
    fn draw_old(&mut self, ctx: &Ctx, budget: usize, batch: usize) -> Drawn {
        let n = self.old.n;
        let d = draw_batch(&self.old, ctx.config, budget, batch, OLD_STREAM);
        let rewards = d
            .answers
            .chunks_exact(n)
            .zip(&d.xs)
            .map(|(y, &x)| ctx.reward.reward(&ctx.prompts[x], y))
            .collect();
        Drawn {
            old_logp: self.old.token_logp(&d.xs, &d.answers),
            ref_logp: self.reference.token_logp(&d.xs, &d.answers),
            mask: vec![1.0; d.answers.len()],
            t: n,
            rewards,
            responses: d.answers,
            xs: d.xs,
        }
    }

    fn loss_gradient(&mut self, ctx: &Ctx, d: &Drawn, e: &Estimator) -> Vec<f32> {
        self.theta.loss_gradient(
            e.group_prompts,
            &d.responses,
            e.adv,
            &d.old_logp,
            &d.ref_logp,
            e.settings,
            ctx.config.sampling.temperature as f32,
        )
    }

    fn kl_estimates(&mut self, ctx: &Ctx, budget: usize, batch: usize) -> [f64; 3] {
        let d = draw_batch(&self.at, ctx.config, budget, batch, THETA_STREAM);
        let mut k = [0.0f64; 3];
        for (y, &x) in d.answers.chunks_exact(self.at.n).zip(&d.xs) {
            for (acc, v) in k
                .iter_mut()
                .zip(exact::k_estimates(&self.at, &self.reference, x, y))
            {
                *acc += v;
            }
        }
        let rows = d.xs.len() as f64;
        k.map(|x| x / rows)
    }

    fn truth(&mut self, ctx: &Ctx, samples: usize) -> Truth {
        exact::truth(
            &mut Model {
                net: &mut self.theta,
                theta: &self.at,
                reference: &self.reference,
                prompts: ctx.prompts,
                reward: ctx.reward,
                temperature: ctx.config.sampling.temperature as f32,
            },
            samples,
            ctx.config.run.seed,
        )
    }
}

/// The policies the lab studies, taken from a run.
pub struct Setup {
    pub config: RunConfig,
    pub policy: Box<dyn Studied>,
    pub prompts: Vec<Vec<u32>>,
    pub reward: RewardFn,
    /// The iteration θ_old is at: `at_iteration`, or a checkpoint's own (later) one.
    pub iteration: usize,
}

/// The fused lecture policy holding `flat` weights in the lecture's layout
/// (`Engine::flat_weights`).
fn fused_from(c: &RunConfig, flat: &[f32]) -> FusedLecture {
    let (v, n, d) = (c.task.vocab, c.task.n, c.model.d_model);
    let (e, m) = (v * d, n * d * d);
    let w = LectureWeights {
        embedding: flat[..e].to_vec(),
        encode: flat[e..e + m].to_vec(),
        decode: flat[e + m..].to_vec(),
    };
    FusedLecture::new(&w, v, n, d, c)
}

/// The reference's tables, asked of the trainer's engine (whatever it keeps as π_ref).
fn reference_tables(trainer: &mut Trainer, prompts: &[Vec<u32>]) -> Result<Tables, String> {
    let c = &trainer.config;
    let (n, v) = (c.task.n, c.task.vocab);
    // Answer `t t … t` for every token t: each position's whole row.
    let rows: Vec<Vec<u32>> = prompts
        .iter()
        .flat_map(|_| (0..v as u32).map(|t| vec![t; n]))
        .collect();
    let batch = Batch::padded(prompts.concat(), n, &rows, v, v as u32);
    let temperature = c.sampling.temperature as f32;
    let logp = trainer
        .engine_mut()
        .token_logp(Which::Reference, &batch, temperature)
        .map_err(|e| e.to_string())?;
    // `[P, V(answer t), n]` → `[P, n, V]`.
    let mut out = vec![0.0f64; prompts.len() * n * v];
    for x in 0..prompts.len() {
        for t in 0..v {
            for p in 0..n {
                out[(x * n + p) * v + t] = logp[(x * v + t) * n + p] as f64;
            }
        }
    }
    Ok(Tables {
        prompts: prompts.len(),
        n,
        v,
        logp: out,
    })
}

impl Setup {
    /// Drive `trainer` (fresh, or restored from a checkpoint) to θ_old and θ. The reference
    /// is `initial` (iteration 0's policy, in the engine's flat layout) when given, else the
    /// one the trainer's engine holds (a checkpoint's).
    pub fn from_trainer(
        mut trainer: Trainer,
        initial: Option<&[f32]>,
        a: &LabArgs,
    ) -> Result<Self, String> {
        let target = trainer.iteration().max(a.at_iteration);
        while trainer.iteration() < target || !trainer.at_iteration_boundary() {
            trainer.step().map_err(|e| e.to_string())?;
        }
        let iteration = trainer.iteration();
        let c = trainer.config.clone();
        let prompts = trainer.prompts.train.clone();
        let old = trainer.engine().flat_weights();
        for _ in 0..a.mu_step {
            trainer.step().map_err(|e| e.to_string())?;
        }
        let theta = trainer.engine().flat_weights();
        let policy: Box<dyn Studied> = if c.model.kind == ModelKind::Transformer {
            let reference = match initial {
                Some(w) => w.to_vec(),
                None => super::sampled::reference_weights(&trainer)?,
            };
            Box::new(super::sampled::TransformerStudy::new(
                &c, old, theta, reference,
            ))
        } else {
            let temperature = c.sampling.temperature as f32;
            let theta = fused_from(&c, &theta);
            let reference = match initial {
                Some(w) => Tables::of(&fused_from(&c, w), &prompts, temperature),
                None => reference_tables(&mut trainer, &prompts)?,
            };
            Box::new(LectureStudy {
                old: Tables::of(&fused_from(&c, &old), &prompts, temperature),
                at: Tables::of(&theta, &prompts, temperature),
                theta,
                reference,
            })
        };
        Ok(Self {
            policy,
            reward: trainer.reward_fn.clone(),
            prompts,
            config: c,
            iteration,
        })
    }

    /// The studied policy and what it reads besides.
    fn parts(&mut self) -> (&mut dyn Studied, Ctx<'_>) {
        let ctx = Ctx {
            config: &self.config,
            prompts: &self.prompts,
            reward: &self.reward,
        };
        (self.policy.as_mut(), ctx)
    }
}

/// One estimator's record against the truth.
#[derive(Debug, Clone, Serialize)]
pub struct EstimatorStats {
    pub name: String,
    pub mode: String,
    pub objective: String,
    #[serde(rename = "G")]
    pub g: usize,
    /// Groups per prompt in a batch (`budget / G`).
    pub groups: usize,
    pub cosine_mean: f64,
    pub cosine_std: f64,
    /// `‖E ĝ‖ / √tr Cov ĝ`.
    pub snr: f64,
    /// `c* = E ĝ · ∇J / ‖∇J‖²`: the scale that best matches the mean estimate to ∇J.
    pub scale: f64,
    /// `‖E ĝ − c*∇J‖ / ‖c*∇J‖`: the mean's direction error after the best scale.
    pub bias: f64,
    /// What `bias` would read for an unbiased estimator from this many batches (the mean's
    /// own Monte Carlo error, `√(tr Cov / N) / ‖c*∇J‖`; with a sampled truth, its relative
    /// standard error added in quadrature).
    pub bias_floor: f64,
    /// `tr Cov ĝ / ‖c*∇J‖²`: the variance in units of the (scaled) true gradient's square.
    pub variance: f64,
}

/// The reference's KL, exact and by each estimator (per answer: summed over its tokens).
/// `k1`, `k2`, `k3` (and their `_std`) are the sampled estimates: a batch's mean, then mean and
/// std over the batches; `*_expected` and `*_answer_std` are each estimator's expectation and
/// standard deviation over one answer, exact by enumeration where the truth is.
#[derive(Debug, Clone, Serialize)]
pub struct KlStats {
    pub exact: f64,
    pub k1_expected: f64,
    pub k2_expected: f64,
    pub k3_expected: f64,
    pub k1_answer_std: f64,
    pub k2_answer_std: f64,
    pub k3_answer_std: f64,
    pub k1: f64,
    pub k2: f64,
    pub k3: f64,
    pub k1_std: f64,
    pub k2_std: f64,
    pub k3_std: f64,
    /// Answers per estimate (a batch's).
    pub answers: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub exact: bool,
    pub at_iteration: usize,
    pub mu_step: usize,
    pub batches: usize,
    pub budget: usize,
    pub prompts_per_batch: usize,
    /// Answers per prompt behind the truth (enumerated, or sampled when not exact).
    pub truth_answers: usize,
    pub j: f64,
    pub j_se: f64,
    pub true_grad_norm: f64,
    /// The truth's own standard error relative to its norm (0 when exact).
    pub true_grad_se: f64,
    pub estimators: Vec<EstimatorStats>,
    pub kl: KlStats,
}

/// Running sums of one estimator.
#[derive(Default)]
struct Acc {
    sum: Vec<f64>,
    sq_norm: f64,
    cos: f64,
    cos_sq: f64,
    count: usize,
}

impl Acc {
    fn add(&mut self, g: &[f32], truth: &[f64]) {
        add_into(&mut self.sum, g, 1.0);
        let g64: Vec<f64> = g.iter().map(|&x| x as f64).collect();
        let n = norm(&g64);
        self.sq_norm += n * n;
        let c = if n > 0.0 {
            dot(&g64, truth) / (n * norm(truth))
        } else {
            0.0
        };
        self.cos += c;
        self.cos_sq += c * c;
        self.count += 1;
    }

    /// `truth_se`: the truth's own relative standard error (0 when exact), which a sampled
    /// truth adds to every bias's floor.
    fn stats(&self, truth: &[f64], truth_se: f64) -> (f64, f64, f64, f64, f64, f64, f64) {
        let k = self.count as f64;
        let mean: Vec<f64> = self.sum.iter().map(|s| s / k).collect();
        let mean_norm = norm(&mean);
        let tr_cov = ((self.sq_norm - k * mean_norm * mean_norm) / (k - 1.0)).max(0.0);
        let t2 = dot(truth, truth);
        let scale = dot(&mean, truth) / t2;
        let scaled = scale.abs() * t2.sqrt();
        let off: Vec<f64> = mean.iter().zip(truth).map(|(m, t)| m - scale * t).collect();
        let cos_mean = self.cos / k;
        let cos_std = ((self.cos_sq / k - cos_mean * cos_mean) * k / (k - 1.0))
            .max(0.0)
            .sqrt();
        (
            cos_mean,
            cos_std,
            mean_norm / tr_cov.sqrt().max(f64::MIN_POSITIVE),
            scale,
            norm(&off) / scaled,
            if truth_se == 0.0 {
                (tr_cov / k).sqrt() / scaled
            } else {
                ((tr_cov / k) / (scaled * scaled) + truth_se * truth_se).sqrt()
            },
            tr_cov / (scaled * scaled),
        )
    }
}

/// The random streams of a batch's answers from π_θold (the estimators') and from π_θ (the KL
/// estimators').
const OLD_STREAM: u32 = 0x006f_6c64;
const THETA_STREAM: u32 = 0x6b6c;

/// One batch's draws: prompt indices (one per answer) and answers `[rows·n]`.
struct Draws {
    xs: Vec<usize>,
    answers: Vec<u32>,
}

fn draw_batch(t: &Tables, c: &RunConfig, budget: usize, batch: usize, stream: u32) -> Draws {
    let p = t.prompts;
    let idx = batch_prompts(c, p, batch);
    let b = idx.len();
    let mut xs = Vec::with_capacity(b * budget);
    let mut answers = Vec::with_capacity(b * budget * t.n);
    for &x in &idx {
        for i in 0..budget {
            xs.push(x);
            let row = ((batch * p + x) * budget + i) as u32;
            answers.extend(t.draw(x, c.run.seed, stream, row));
        }
    }
    Draws { xs, answers }
}

/// The lab after its θ: the truth, then batch after batch into every estimator's sums.
pub struct Measure {
    setup: Setup,
    args: LabArgs,
    truth: Truth,
    objectives: Vec<String>,
    settings: Vec<LossSettings>,
    /// `(G, mode, objective index)` of each estimator.
    keys: Vec<(usize, AdvantageMode, usize)>,
    accs: Vec<Acc>,
    kl: [Vec<f64>; 3],
    /// Batches done.
    pub batch: usize,
}

impl Measure {
    /// The truth at θ (exact, or the large-sample stand-in) and empty sums.
    pub fn new(mut setup: Setup, a: &LabArgs) -> Self {
        let c = &setup.config;
        let objectives: Vec<String> = if a.objectives.is_empty() {
            vec![config_objective(c).to_string()]
        } else {
            a.objectives.clone()
        };
        let base = LossSettings::of(c);
        let settings = objectives
            .iter()
            .map(|o| objective_settings(&base, o).expect("checked"))
            .collect();
        let count = objectives.len();
        let keys: Vec<(usize, AdvantageMode, usize)> = a
            .group_sizes
            .iter()
            .flat_map(|&g| {
                a.modes
                    .iter()
                    .flat_map(move |&m| (0..count).map(move |o| (g, m, o)))
            })
            .collect();
        let (policy, ctx) = setup.parts();
        let truth = policy.truth(&ctx, a.truth_samples);
        Self {
            accs: keys.iter().map(|_| Acc::default()).collect(),
            keys,
            settings,
            objectives,
            truth,
            args: a.clone(),
            setup,
            kl: Default::default(),
            batch: 0,
        }
    }

    pub fn is_done(&self) -> bool {
        self.batch >= self.args.batches
    }

    /// One more batch: its answers from π_θold, every estimator's gradient on them, and the
    /// KL estimators on answers from π_θ.
    pub fn step(&mut self) {
        let a = &self.args;
        let (policy, ctx) = self.setup.parts();
        let d = policy.draw_old(&ctx, a.budget, self.batch);
        // Each group's prompt, once per G (the keys run G by G).
        let mut group_prompts: Vec<(usize, Vec<u32>)> = Vec::new();
        for (acc, &(g, mode, o)) in self.accs.iter_mut().zip(&self.keys) {
            if group_prompts.last().is_none_or(|(at, _)| *at != g) {
                let p = d.xs.iter().step_by(g);
                group_prompts.push((g, p.flat_map(|&x| ctx.prompts[x].clone()).collect()));
            }
            let adv = advantage::advantages(mode, &d.rewards, g);
            let e = Estimator {
                group_prompts: &group_prompts.last().expect("pushed above").1,
                adv: &adv,
                settings: &self.settings[o],
            };
            let grad = policy.loss_gradient(&ctx, &d, &e);
            // The loss descends; the estimate of ∇J is its negative.
            let ascent: Vec<f32> = grad.iter().map(|x| -x).collect();
            acc.add(&ascent, &self.truth.grad);
        }
        for (k, est) in self
            .kl
            .iter_mut()
            .zip(policy.kl_estimates(&ctx, a.budget, self.batch))
        {
            k.push(est);
        }
        self.batch += 1;
    }

    /// The report over the batches done so far (at least two).
    pub fn report(&self) -> Report {
        let (c, a, truth) = (&self.setup.config, &self.args, &self.truth);
        let estimators = self
            .keys
            .iter()
            .zip(&self.accs)
            .map(|(&(g, mode, o), acc)| {
                let (cosine_mean, cosine_std, snr, scale, bias, bias_floor, variance) =
                    acc.stats(&truth.grad, truth.grad_se);
                let name = if self.objectives.len() > 1 {
                    format!("{}/{}", mode.name(), self.objectives[o])
                } else {
                    mode.name().to_string()
                };
                EstimatorStats {
                    name,
                    mode: mode.name().into(),
                    objective: self.objectives[o].clone(),
                    g,
                    groups: a.budget / g,
                    cosine_mean,
                    cosine_std,
                    snr,
                    scale,
                    bias,
                    bias_floor,
                    variance,
                }
            })
            .collect();
        let [(k1, k1_std), (k2, k2_std), (k3, k3_std)] =
            self.kl.each_ref().map(|v| exact::mean_std(v));
        let b = c.batch_prompts(self.setup.prompts.len());
        Report {
            exact: truth.exact,
            at_iteration: self.setup.iteration,
            mu_step: a.mu_step,
            batches: self.batch,
            budget: a.budget,
            prompts_per_batch: b,
            truth_answers: truth.answers,
            j: truth.j,
            j_se: truth.j_se,
            true_grad_norm: norm(&truth.grad),
            true_grad_se: truth.grad_se,
            estimators,
            kl: KlStats {
                exact: truth.kl,
                k1_expected: truth.k_moments[0].0,
                k2_expected: truth.k_moments[1].0,
                k3_expected: truth.k_moments[2].0,
                k1_answer_std: truth.k_moments[0].1,
                k2_answer_std: truth.k_moments[1].1,
                k3_answer_std: truth.k_moments[2].1,
                k1,
                k2,
                k3,
                k1_std,
                k2_std,
                k3_std,
                answers: b * a.budget,
            },
        }
    }
}

/// The lab from its first training step to its report, in slices: the app's and the
/// browser's frame loop drive it (`advance`), the CLI runs it through.
pub enum Session {
    /// Training to θ_old and θ; iteration 0's policy (the reference) kept when it started there.
    Training(Box<Trainer>, LabArgs, Option<Vec<f32>>),
    Measuring(Box<Measure>),
    Done(Box<Report>),
    Failed(String),
}

impl Session {
    /// A session on `trainer` (fresh, or restored from a checkpoint).
    pub fn start(mut trainer: Trainer, a: &LabArgs) -> Self {
        if let Err(e) = check(&trainer.config, a) {
            return Session::Failed(e);
        }
        // The reference is iteration 0's policy: after the run's supervised cold start where
        // it has one (R1's recipe, `sft.steps`: the reference starts from the fine-tuned policy).
        let initial = if trainer.global_step() == 0 {
            if let Err(e) = trainer.cold_start() {
                return Session::Failed(e.to_string());
            }
            Some(trainer.engine().flat_weights())
        } else {
            None
        };
        Session::Training(Box::new(trainer), a.clone(), initial)
    }

    pub fn is_done(&self) -> bool {
        matches!(self, Session::Done(_) | Session::Failed(_))
    }

    /// What it does now, done and to do.
    pub fn progress(&self) -> (String, usize, usize) {
        match self {
            Session::Training(t, a, _) => (
                "training to θ".into(),
                t.global_step(),
                t.config.algorithm.steps_per_iteration() * a.at_iteration + a.mu_step,
            ),
            Session::Measuring(m) => ("batches".into(), m.batch, m.args.batches),
            Session::Done(r) => ("done".into(), r.batches, r.batches),
            Session::Failed(e) => (format!("failed: {e}"), 0, 0),
        }
    }

    /// Work for at most `budget` (at least one step); `true` when it finished.
    pub fn advance(&mut self, budget: web_time::Duration) -> bool {
        let start = web_time::Instant::now();
        while !self.is_done() {
            let next = match std::mem::replace(self, Session::Failed(String::new())) {
                Session::Training(mut t, a, initial) => {
                    let target = t.iteration().max(a.at_iteration);
                    if t.iteration() < target || !t.at_iteration_boundary() {
                        match t.step() {
                            Ok(_) => Session::Training(t, a, initial),
                            Err(e) => Session::Failed(e.to_string()),
                        }
                    } else {
                        match Setup::from_trainer(*t, initial.as_deref(), &a) {
                            Ok(setup) => Session::Measuring(Box::new(Measure::new(setup, &a))),
                            Err(e) => Session::Failed(e),
                        }
                    }
                }
                Session::Measuring(mut m) => {
                    m.step();
                    if m.is_done() {
                        Session::Done(Box::new(m.report()))
                    } else {
                        Session::Measuring(m)
                    }
                }
                done => done,
            };
            *self = next;
            if start.elapsed() >= budget {
                break;
            }
        }
        self.is_done()
    }

    pub fn report(&self) -> Option<&Report> {
        match self {
            Session::Done(r) => Some(r),
            _ => None,
        }
    }
}

/// The checkpoint `dir` names (a run directory: its newest checkpoint that verifies; or a
/// checkpoint directory `RUN/checkpoints/iter-N`) and the config its run recorded.
pub fn checkpoint_of(dir: &std::path::Path) -> Result<(std::path::PathBuf, RunConfig), String> {
    let (ckpt, run) = if dir.join("config.toml").exists() {
        let ckpt = crate::train::run::latest_checkpoint(dir).ok_or_else(|| {
            format!(
                "--checkpoint: {} holds no checkpoint that verifies",
                dir.display()
            )
        })?;
        (ckpt, dir.to_path_buf())
    } else {
        let run = dir
            .parent()
            .and_then(|p| p.parent())
            .map(|p| p.to_path_buf());
        match run.filter(|r| r.join("config.toml").exists()) {
            Some(run) => (dir.to_path_buf(), run),
            None => {
                return Err(format!(
                    "--checkpoint: {} is neither a run directory (with config.toml) nor a checkpoint inside one (RUN/checkpoints/iter-N)",
                    dir.display()
                ));
            }
        }
    };
    let config = RunConfig::from_file(&run.join("config.toml")).map_err(|e| e.to_string())?;
    Ok((ckpt, config))
}

/// A trainer on the CPU for `config`, restored from `checkpoint` when given.
pub fn trainer_for(
    config: RunConfig,
    checkpoint: Option<&std::path::Path>,
) -> Result<Trainer, String> {
    let mut trainer =
        Trainer::new(config, crate::gpu::Compute::cpu()).map_err(|e| e.to_string())?;
    if let Some(dir) = checkpoint {
        crate::train::checkpoint::load(&mut trainer, dir).map_err(|e| e.to_string())?;
    }
    Ok(trainer)
}

/// Memory of the lab, from the config and the arguments alone: the run's own estimate, the
/// truth's enumeration chunk, the batches' draws and each estimator's running sum.
pub fn estimate(c: &RunConfig, a: &LabArgs) -> crate::estimate::Estimate {
    let mut e = crate::estimate::estimate(c);
    let (n, v, d) = (
        c.task.n as u128,
        c.task.vocab as u128,
        c.model.d_model as u128,
    );
    let prompts = c.task.prompts.len().max(c.task.train_size) as u128;
    let batch_rows = (c.batch_prompts(prompts as usize) * a.budget) as u128;
    let estimators = (a.group_sizes.len() * a.modes.len() * a.objectives.len().max(1)) as u128;
    let parts = if c.model.kind == ModelKind::Transformer {
        let shape = crate::model::transformer_shape(c);
        let params = crate::engine::fused_transformer::Layout::of(&shape).total as u128;
        // A teacher-forced pass keeps ~(10·D + 2·d_ff)·layers + 4·V floats per position.
        let positions = (c.task.n + c.max_len()) as u128;
        let per_row = positions
            * ((10 * d + 2 * shape.d_ff as u128) * shape.layers as u128 + 4 * (v + 1))
            * 4;
        let truth_rows = super::sampled::ROWS as u128;
        [
            (
                "the truth's passes (1024 answers at once)",
                "model.*, task.max_len",
                truth_rows * per_row + 8 * params,
            ),
            (
                "the weights (θ_old, θ, reference) and a gradient",
                "model.*",
                4 * 4 * params,
            ),
            (
                "a batch's answers and passes",
                "--budget, algorithm.prompts_per_iteration",
                batch_rows * per_row,
            ),
            (
                "each estimator's running sum",
                "--group-sizes, --modes, --objectives",
                estimators * params * 8,
            ),
        ]
    } else {
        let params = v * d + 2 * n * d * d;
        let per = exact::answers_per_prompt(c.task.n, c.task.vocab).unwrap_or(a.truth_samples / 8);
        let rows = per.min(1 << 16) as u128;
        [
            (
                "the truth's enumeration chunk",
                "task.n, task.vocab",
                rows * n * 16 + 8 * params,
            ),
            (
                "log π tables (θ_old, θ, reference)",
                "task.n, task.vocab, task.train_size",
                3 * 8 * prompts * n * v,
            ),
            (
                "a batch's answers and per-token terms",
                "--budget, algorithm.prompts_per_iteration",
                batch_rows * n * 64,
            ),
            (
                "each estimator's running sum",
                "--group-sizes, --modes, --objectives",
                estimators * params * 8,
            ),
        ]
    };
    for (what, fields, bytes) in parts {
        e.parts.push(crate::estimate::Part {
            what,
            fields,
            bytes,
        });
    }
    e
}

/// Gradient evaluations the lab will make (its time is about proportional).
pub fn evaluations(a: &LabArgs) -> usize {
    a.batches * a.group_sizes.len() * a.modes.len() * a.objectives.len().max(1)
}

impl Report {
    /// Each estimator's name once, in the report's order (one line per name across G).
    pub fn estimator_names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = Vec::new();
        for e in &self.estimators {
            if !names.contains(&e.name.as_str()) {
                names.push(&e.name);
            }
        }
        names
    }

    fn find(&self, mode: AdvantageMode, g: usize) -> Option<&EstimatorStats> {
        self.estimators
            .iter()
            .find(|e| e.mode == mode.name() && e.g == g)
    }

    /// The report as a table and the checks a student can read off it.
    pub fn text(&self) -> String {
        let mut out = format!(
            "gradient lab: θ_old at iteration {}, θ after {} of its μ steps; {} batches of {} prompts × {} answers\ntruth: {} ({} answers per prompt)\nJ(θ) = {:.5}{}   ‖∇J‖ = {:.5}{}\n\n",
            self.at_iteration,
            self.mu_step,
            self.batches,
            self.prompts_per_batch,
            self.budget,
            if self.exact {
                "exact, by enumeration"
            } else {
                "NOT exact: a large-sample estimate"
            },
            self.truth_answers,
            self.j,
            if self.exact {
                String::new()
            } else {
                format!(" ± {:.5}", self.j_se)
            },
            self.true_grad_norm,
            if self.exact {
                String::new()
            } else {
                format!(" (± {:.1} % relative)", 100.0 * self.true_grad_se)
            },
        );
        out.push_str(&format!(
            "{:<28} {:>4} {:>6}  {:>15} {:>8} {:>9} {:>16} {:>10}\n",
            "estimator", "G", "groups", "cosine to ∇J", "SNR", "scale", "bias (floor)", "variance"
        ));
        for e in &self.estimators {
            out.push_str(&format!(
                "{:<28} {:>4} {:>6}  {:>7.3} ± {:<5.3} {:>8.3} {:>9.5} {:>7.3} ({:.3}) {:>10.3}\n",
                e.name,
                e.g,
                e.groups,
                e.cosine_mean,
                e.cosine_std,
                e.snr,
                e.scale,
                e.bias,
                e.bias_floor,
                e.variance
            ));
        }
        let k = &self.kl;
        out.push_str(&format!(
            "\nKL(π_θ ‖ π_ref) per answer: {:.6}\n{:<4} {:>12} {:>14}   {:>12} {:>10}   (a batch: {} answers)\n",
            k.exact, "", "expectation", "std per answer", "batch mean", "± std", k.answers
        ));
        for (name, e, sd, m, msd) in [
            ("k1", k.k1_expected, k.k1_answer_std, k.k1, k.k1_std),
            ("k2", k.k2_expected, k.k2_answer_std, k.k2, k.k2_std),
            ("k3", k.k3_expected, k.k3_answer_std, k.k3, k.k3_std),
        ] {
            out.push_str(&format!(
                "{name:<4} {e:>12.6} {sd:>14.6}   {m:>12.6} {msd:>10.6}\n"
            ));
        }
        let checks = self.checks();
        if !checks.is_empty() {
            out.push_str("\nwhat it shows:\n");
            for c in checks {
                out.push_str(&format!("- {c}\n"));
            }
        }
        out
    }

    /// The claims, read off this report (where it has the estimators they need), each
    /// with its verdict here: a bias counts as seen when it is over twice its noise floor.
    pub fn checks(&self) -> Vec<String> {
        if self.true_grad_norm.is_nan() || self.true_grad_norm <= 1e-9 {
            // A saturated policy: every answer all but certain, ∇J ≈ 0 — the biases and
            // scales below would be ratios of nothing to nothing.
            return vec![
                format!(
                    "‖∇J‖ = {:.1e}: the policy is saturated here (its answers all but certain), so no estimator has a direction to measure — take an earlier --at-iteration",
                    self.true_grad_norm
                ),
                self.kl_check(),
            ];
        }
        // A bias counts past twice its floor; NaN (no spread in any group: every baseline 0/0)
        // says nothing either way.
        let judged = |bias: f64, floor: f64, yes: &'static str, no: &'static str| {
            if !(bias.is_finite() && floor.is_finite()) {
                "no estimate: NaN, every group's rewards equal?"
            } else if bias > 2.0 * floor {
                yes
            } else {
                no
            }
        };
        let seen =
            |bias: f64, floor: f64| judged(bias, floor, "seen here", "within the noise here");
        use AdvantageMode::*;
        let mut out = Vec::new();
        let gs: Vec<usize> = {
            let mut g: Vec<usize> = self.estimators.iter().map(|e| e.g).collect();
            g.dedup();
            g
        };
        let (Some(&g_lo), Some(&g_hi)) = (gs.first(), gs.last()) else {
            return vec![self.kl_check()];
        };
        if let (Some(raw), Some(rloo)) = (self.find(Raw, g_hi), self.find(Rloo, g_hi)) {
            out.push(format!(
                "a baseline cuts variance: at G = {g_hi}, raw {:.2} → rloo {:.2} (cosine {:.3} → {:.3})",
                raw.variance, rloo.variance, raw.cosine_mean, rloo.cosine_mean
            ));
            out.push(rloo_line(raw, rloo, &judged));
        }
        if let (Some(cen), Some(rloo)) = (self.find(Centered, g_lo), self.find(Rloo, g_lo)) {
            out.push(format!(
                "the group mean is RLOO × (G−1)/G: at G = {g_lo} centered's scale is {:.3} of rloo's ((G−1)/G = {:.3}), its direction: bias {:.3}, floor {:.3} ({})",
                cen.scale / rloo.scale,
                (g_lo - 1) as f64 / g_lo as f64,
                cen.bias,
                cen.bias_floor,
                judged(cen.bias, cen.bias_floor, "a bias: more batches?", "unbiased")
            ));
        }
        // Where normalisation's bias stands out most against its noise.
        let worst = self
            .estimators
            .iter()
            .filter(|e| e.mode == Normalized.name())
            .max_by(|a, b| (a.bias / a.bias_floor).total_cmp(&(b.bias / b.bias_floor)))
            .map(|e| e.g);
        if let Some(norm) = worst.and_then(|g| self.find(Normalized, g)) {
            let g_hi = norm.g;
            out.push(format!(
                "std normalisation changes the direction: normalized's bias {:.3} against a floor of {:.3} at G = {g_hi} ({})",
                norm.bias,
                norm.bias_floor,
                seen(norm.bias, norm.bias_floor)
            ));
        }
        if let (Some(lo), Some(hi), true) =
            (self.find(Rloo, g_lo), self.find(Rloo, g_hi), g_lo != g_hi)
        {
            out.push(format!(
                "at an equal budget, larger groups: rloo cosine {:.3} at G = {g_lo} → {:.3} at G = {g_hi}; centered {}",
                lo.cosine_mean,
                hi.cosine_mean,
                match (self.find(Centered, g_lo), self.find(Centered, g_hi)) {
                    (Some(a), Some(b)) => format!("{:.3} → {:.3}", a.cosine_mean, b.cosine_mean),
                    _ => "not run".into(),
                }
            ));
        }
        out.push(self.kl_check());
        out
    }

    /// The KL estimators' line: each expectation against the exact KL, read off (not assumed).
    fn kl_check(&self) -> String {
        let k = &self.kl;
        let finite = [k.k1_expected, k.k2_expected, k.k3_expected, k.k3_answer_std]
            .iter()
            .all(|x| x.is_finite());
        // Sampled expectations carry their samples' noise: two standard errors.
        let noise = |std: f64| match self.exact {
            true => 0.0,
            false => 2.0 * std / (self.truth_answers.max(1) as f64).sqrt(),
        };
        if k.exact < 1e-9 {
            "KL estimators: θ is the reference here (KL 0), every estimate 0".into()
        } else if k.exact < KL_PRECISION {
            // k1's and k3's expectations are the same number in exact arithmetic; from f32
            // log-probabilities they part by ~1e-7 an answer.
            format!(
                "KL estimators: KL {:.1e}, within the f32 log-probabilities' precision (~1e-7 an answer) of 0: θ is all but the reference here (a checkpoint written right after a reference refresh?), so the estimators' biases cannot be measured",
                k.exact
            )
        } else if !finite {
            format!(
                "KL estimators (KL {:.4}): k3's expectation or spread is not finite here — some answer's ratio π_ref/π_θ overflowed (θ gives ~0 probability to what the reference likes); k1 {}, k2 {}",
                k.exact,
                off(k.k1_expected, k.exact, noise(k.k1_answer_std)),
                off(k.k2_expected, k.exact, noise(k.k2_answer_std))
            )
        } else {
            format!(
                "KL estimators (KL {:.4}, expectations {}): k1 {}, std per answer {:.3}; k2 {}, std {:.3}; k3 {}, std {:.3} ({}); over the batches k3's mean reads {:+.1} % off{}",
                k.exact,
                if self.exact { "exact" } else { "sampled" },
                off(k.k1_expected, k.exact, noise(k.k1_answer_std)),
                k.k1_answer_std,
                off(k.k2_expected, k.exact, noise(k.k2_answer_std)),
                k.k2_answer_std,
                match off(k.k3_expected, k.exact, noise(k.k3_answer_std)) {
                    // k3 is unbiased in exact arithmetic: what an enumeration misses is the
                    // answers whose f32 probability under θ is 0 (their π_ref mass is lost).
                    o if self.exact && o != "unbiased" => format!(
                        "{:+.1} % off the KL (f32 loses the answers θ all but never gives; k3 is unbiased in exact arithmetic)",
                        100.0 * (k.k3_expected / k.exact - 1.0)
                    ),
                    o => o,
                },
                k.k3_answer_std,
                if k.k3_answer_std < k.k1_answer_std {
                    "below k1's"
                } else {
                    "above k1's: far from π_ref k3 is heavy-tailed"
                },
                100.0 * (k.k3 / k.exact - 1.0),
                {
                    // The batches' mean carries their noise: two standard errors of it.
                    let se = 2.0 * k.k3_std / (self.batches.max(1) as f64).sqrt();
                    let dev = k.k3 - k.exact;
                    if dev.abs() <= se {
                        format!(
                            " (within the batches' noise, ±{:.1} %)",
                            100.0 * se / k.exact
                        )
                    } else if dev < 0.0 && dev / k.exact < -0.05 {
                        " (low: its rare large ratios are rarely drawn)".to_string()
                    } else if dev > 0.0 && dev / k.exact > 0.05 {
                        " (high: a rare large ratio drawn weighs heavily)".to_string()
                    } else {
                        String::new()
                    }
                }
            )
        }
    }
}

/// RLOO's line: its bias against its floor, and its scale against raw's (both unbiased, so
/// one scale in expectation; each measured scale carries its estimator's noise, about its
/// bias floor, relative: twice that is read as apart).
fn rloo_line(
    raw: &EstimatorStats,
    rloo: &EstimatorStats,
    judged: &dyn Fn(f64, f64, &'static str, &'static str) -> &'static str,
) -> String {
    let apart = (rloo.scale / raw.scale - 1.0).abs();
    let noise = 2.0 * raw.bias_floor.max(rloo.bias_floor);
    let same = apart <= noise.max(0.02);
    format!(
        "rloo (unbiased in theory): bias {:.3} against a floor of {:.3} ({}), {} ({:.5} vs raw {:.5}{})",
        rloo.bias,
        rloo.bias_floor,
        judged(
            rloo.bias,
            rloo.bias_floor,
            "a bias: more batches?",
            "none seen"
        ),
        if same {
            "at the scale of raw rewards"
        } else {
            "its scale apart from raw's beyond their noise"
        },
        rloo.scale,
        raw.scale,
        if same {
            String::new()
        } else {
            format!(
                ": {:.0} % apart, noise ~{:.0} %",
                100.0 * apart,
                100.0 * noise
            )
        }
    )
}

/// Below this KL (nats) the exact sums' own f32 error (~1e-7 an answer) is over 1 % of it.
const KL_PRECISION: f64 = 1e-5;

/// An expectation against the exact KL: "unbiased" within 0.1 % or `noise` (a sampled truth's
/// two standard errors), else how far off.
fn off(expected: f64, exact: f64, noise: f64) -> String {
    let rel = expected / exact - 1.0;
    if (expected - exact).abs() <= noise.max(1e-3 * exact) {
        "unbiased".into()
    } else {
        format!("{:+.1} % biased", 100.0 * rel)
    }
}

impl Report {
    /// The lab's two charts in `dir`: each estimator's mean cosine to ∇J, and its SNR,
    /// against log₂ G (`gradient-lab-cosine`, `gradient-lab-snr`, PNG and SVG).
    pub fn charts(&self, dir: &std::path::Path) -> std::io::Result<Vec<std::path::PathBuf>> {
        use crate::report::chart::{Series, line_chart};
        let names = self.estimator_names();
        let series = |f: fn(&EstimatorStats) -> f64| -> Vec<Series> {
            names
                .iter()
                .map(|&name| {
                    let points = self
                        .estimators
                        .iter()
                        .filter(|e| e.name == name)
                        .map(|e| ((e.g as f64).log2(), f(e)))
                        .collect();
                    Series::line(name, points)
                })
                .collect()
        };
        let at = format!(
            "iteration {}, μ step {}, budget {}",
            self.at_iteration, self.mu_step, self.budget
        );
        let mut out = line_chart(
            dir,
            "gradient-lab-cosine",
            &format!(
                "cosine to {}, mean over batches ({at})",
                if self.exact {
                    "the exact ∇J"
                } else {
                    "∇J (a large-sample estimate)"
                }
            ),
            "log₂ G (groups of G at an equal budget)",
            "cosine to ∇J",
            &series(|e| e.cosine_mean),
        )?;
        out.extend(line_chart(
            dir,
            "gradient-lab-snr",
            &format!("SNR ‖E ĝ‖ / √tr Cov ĝ ({at})"),
            "log₂ G (groups of G at an equal budget)",
            "SNR",
            &series(|e| e.snr),
        )?);
        Ok(out)
    }
}

/// The lab from a config (or a checkpoint) to its report, with a progress bar unless `quiet`.
pub fn run_all(
    config: RunConfig,
    checkpoint: Option<&std::path::Path>,
    a: &LabArgs,
    quiet: bool,
) -> Result<Report, String> {
    check(&config, a)?;
    let bar = crate::train::progress::Progress::new(
        !quiet,
        1,
        "{msg:>14} [{bar:40}] {pos}/{len} ({eta})",
    );
    let mut session = Session::start(trainer_for(config, checkpoint)?, a);
    while !session.advance(web_time::Duration::from_millis(100)) {
        let (what, done, total) = session.progress();
        bar.set_length(total as u64);
        bar.set_position(done as u64);
        bar.set_message(|| what);
    }
    bar.finish_and_clear();
    match session {
        Session::Done(r) => Ok(*r),
        Session::Failed(e) => Err(e),
        _ => unreachable!("advance runs to the end"),
    }
}

#[cfg(test)]
mod tests {

    /// What the lab says where its numbers mean little: a saturated policy (∇J ≈ 0), a KL
    /// within f32's precision of 0, an overflowed k3 — said so, never "unbiased" by default.
    #[test]
    fn the_checks_say_when_their_numbers_mean_nothing() {
        let kl = |exact: f64, k3: f64| KlStats {
            exact,
            k1_expected: exact,
            k2_expected: exact * 0.9,
            k3_expected: k3,
            k1_answer_std: 0.1,
            k2_answer_std: 0.1,
            k3_answer_std: 0.05,
            k1: exact,
            k2: exact,
            k3,
            k1_std: 0.0,
            k2_std: 0.0,
            k3_std: 0.0,
            answers: 10,
        };
        let report = |norm: f64, kl: KlStats| Report {
            exact: true,
            at_iteration: 3,
            mu_step: 0,
            batches: 3,
            budget: 8,
            prompts_per_batch: 1,
            truth_answers: 10,
            j: 1.0,
            j_se: 0.0,
            true_grad_norm: norm,
            true_grad_se: 0.0,
            estimators: Vec::new(),
            kl,
        };
        let c = report(1e-300, kl(0.1, 0.1)).checks();
        assert!(c[0].contains("saturated"), "{c:?}");
        // The f32 floor: k3's expectation 7× below k1's is the sums' rounding, not a bias.
        let c = report(1.0, kl(2.28e-7, 3.26e-8)).checks();
        assert!(c.iter().any(|l| l.contains("cannot be measured")), "{c:?}");
        assert!(!c.iter().any(|l| l.contains("biased")), "{c:?}");
        let c = report(1.0, kl(0.1, f64::INFINITY)).checks();
        assert!(c.iter().any(|l| l.contains("not finite")), "{c:?}");
        // Read off the numbers: an expectation 20 % off is called so.
        let c = report(1.0, kl(0.1, 0.12)).checks();
        let line = c.iter().find(|l| l.starts_with("KL estimators (")).unwrap();
        assert!(
            line.contains("k1 unbiased") && line.contains("k3 +20.0 % off"),
            "{line}"
        );
        assert!(line.contains("k2 -10.0 % biased"), "{line}");
        // The batches' mean read 20 % high with no spread over the batches: said high; the
        // same gap within two standard errors of that mean (±0.058 over 3 batches) is noise.
        assert!(line.contains("+20.0 % off (high:"), "{line}");
        let noisy = KlStats {
            k3_std: 0.05,
            ..kl(0.1, 0.12)
        };
        let c = report(1.0, noisy).checks();
        let line = c.iter().find(|l| l.starts_with("KL estimators (")).unwrap();
        assert!(line.contains("within the batches' noise"), "{line}");
        let c = report(1.0, kl(0.1, 0.08)).checks();
        let line = c.iter().find(|l| l.starts_with("KL estimators (")).unwrap();
        assert!(line.contains("(low: its rare large ratios"), "{line}");
    }

    use super::*;

    fn lab(config: &RunConfig, a: &LabArgs) -> Report {
        let mut session = Session::start(trainer_for(config.clone(), None).unwrap(), a);
        session.advance(web_time::Duration::from_secs(3600));
        match session {
            Session::Done(r) => *r,
            Session::Failed(e) => panic!("{e}"),
            _ => unreachable!(),
        }
    }

    fn find<'a>(r: &'a Report, name: &str, g: usize) -> &'a EstimatorStats {
        r.estimators
            .iter()
            .find(|e| e.name == name && e.g == g)
            .unwrap()
    }

    /// The first claims at lecture17's start, on a small budget: a large group's RLOO
    /// points at ∇J (cosine → 1, no bias past its noise); the group mean is RLOO scaled by
    /// (G−1)/G exactly; the raw reward is unbiased too but far noisier; std normalisation
    /// bends the direction.
    #[test]
    fn a_large_groups_unbiased_estimate_points_at_the_true_gradient() {
        let c = RunConfig::preset("lecture17").unwrap();
        let a = LabArgs {
            at_iteration: 0,
            batches: 100,
            budget: 256,
            group_sizes: vec![2, 32, 256],
            modes: vec![
                AdvantageMode::Raw,
                AdvantageMode::Centered,
                AdvantageMode::Rloo,
                AdvantageMode::Normalized,
            ],
            ..Default::default()
        };
        let r = lab(&c, &a);
        assert!(r.exact && r.truth_answers == 125 && r.batches == 100);
        let rloo = find(&r, "rloo", 256);
        assert!(rloo.cosine_mean > 0.97, "{rloo:?}");
        assert!(rloo.bias < 2.0 * rloo.bias_floor, "{rloo:?}");
        // Each answer's centered advantage is (G−1)/G of its RLOO one: the same estimate, scaled.
        for g in [2, 32, 256] {
            let ratio = find(&r, "centered", g).scale / find(&r, "rloo", g).scale;
            let want = (g - 1) as f64 / g as f64;
            assert!((ratio - want).abs() < 1e-4, "G = {g}: {ratio} vs {want}");
        }
        let raw = find(&r, "raw", 256);
        assert!(raw.variance > 5.0 * rloo.variance, "{raw:?} vs {rloo:?}");
        assert!(find(&r, "rloo", 2).cosine_mean < rloo.cosine_mean);
        let normalized = find(&r, "normalized", 32);
        assert!(
            normalized.bias > 3.0 * normalized.bias_floor,
            "{normalized:?}"
        );
        // The KL to the reference is zero at iteration 0, and so is every estimate of it.
        let k = &r.kl;
        assert!(
            k.exact.abs() < 1e-5 && k.k1.abs() < 1e-5 && k.k3.abs() < 1e-5,
            "{k:?}"
        );
    }

    /// Once θ ≠ θ_old (a few μ steps in): the naive objective, without its ratio, is biased;
    /// the importance-weighted (unclipped) one is not; KL estimators: k1 and k3 unbiased, k2
    /// biased upward.
    #[test]
    fn off_policy_the_ratio_unbiases_and_k2_is_biased() {
        let c = RunConfig::preset("lecture17").unwrap();
        let a = LabArgs {
            at_iteration: 5,
            mu_step: 5,
            batches: 200,
            budget: 256,
            group_sizes: vec![256],
            modes: vec![AdvantageMode::Rloo],
            objectives: vec!["naive".into(), "unclipped".into(), "clipped".into()],
            ..Default::default()
        };
        let r = lab(&c, &a);
        let naive = find(&r, "rloo/naive", 256);
        let unclipped = find(&r, "rloo/unclipped", 256);
        let clipped = find(&r, "rloo/clipped", 256);
        assert!(naive.bias > 3.0 * naive.bias_floor, "{naive:?}");
        assert!(unclipped.bias < 2.0 * unclipped.bias_floor, "{unclipped:?}");
        assert!(clipped.bias > 3.0 * clipped.bias_floor, "{clipped:?}");
        let k = &r.kl;
        let se = |std: f64| std / (r.batches as f64).sqrt();
        assert!(k.exact > 0.5, "{k:?}");
        assert!((k.k1 - k.exact).abs() < 4.0 * se(k.k1_std), "{k:?}");
        assert!(k.k2 - k.exact > 10.0 * se(k.k2_std), "{k:?}");
    }

    /// The lab on a small transformer at its second iteration (the reference is iteration
    /// 0's): not exact, a truth with its standard error; the group mean is RLOO × (G−1)/G
    /// exactly (the same answers, θ = θ_old); a baseline cuts the raw reward's variance; a
    /// larger group's RLOO points closer to ∇J; the KL is not zero and k1's expectation over
    /// the truth's answers is its KL.
    #[test]
    fn the_transformer_lab_measures_estimators_against_a_sampled_truth() {
        let c = RunConfig::preset("transformer-sort")
            .unwrap()
            .with_overrides(&[
                "model.d_model=16".into(),
                "model.layers=1".into(),
                "model.heads=2".into(),
                "task.train_size=32".into(),
                "task.heldout_size=8".into(),
                "algorithm.prompts_per_iteration=4".into(),
                "algorithm.num_generations=4".into(),
                "algorithm.dynamic_sampling=false".into(),
                "sft.steps=20".into(),
                "sft.examples=64".into(),
                "sft.batch_size=16".into(),
                "optimizer.lr=1e-2".into(),
            ])
            .unwrap();
        let a = LabArgs {
            at_iteration: 2,
            batches: 40,
            budget: 8,
            group_sizes: vec![2, 8],
            modes: vec![
                AdvantageMode::Raw,
                AdvantageMode::Centered,
                AdvantageMode::Rloo,
            ],
            truth_samples: 8 * 32 * 64,
            ..LabArgs::for_config(&c)
        };
        let r = run_all(c, None, &a, true).unwrap();
        let find = |name: &str, g: usize| {
            r.estimators
                .iter()
                .find(|e| e.name == name && e.g == g)
                .unwrap()
        };
        eprintln!("{}", r.text());
        assert!(!r.exact && r.truth_answers == 8 * 64, "{}", r.truth_answers);
        assert!(r.true_grad_norm > 0.0 && r.true_grad_se > 0.0 && r.true_grad_se < 0.5);
        for g in [2, 8] {
            let ratio = find("centered", g).scale / find("rloo", g).scale;
            let want = (g - 1) as f64 / g as f64;
            assert!((ratio - want).abs() < 1e-3, "G = {g}: {ratio} vs {want}");
        }
        assert!(find("raw", 8).variance > find("rloo", 8).variance);
        assert!(find("rloo", 8).cosine_mean > find("rloo", 2).cosine_mean);
        assert!(find("rloo", 8).cosine_mean > 0.1, "{:?}", find("rloo", 8));
        let k = &r.kl;
        assert!(k.exact > 1e-4, "{k:?}");
        assert!(
            (k.k1_expected - k.exact).abs() < 1e-9 * (1.0 + k.exact),
            "{k:?}"
        );
    }

    #[test]
    fn what_the_lab_cannot_study_is_refused_by_name() {
        let t = RunConfig::preset("transformer-sort").unwrap();
        assert_eq!(check(&t, &LabArgs::for_config(&t)), Ok(()));
        let c = RunConfig::preset("lecture17").unwrap();
        let e = check(
            &c,
            &LabArgs {
                mu_step: 10,
                ..Default::default()
            },
        )
        .unwrap_err();
        assert!(e.contains("--mu-step") && e.contains("algorithm.mu"), "{e}");
        let e = check(
            &c,
            &LabArgs {
                group_sizes: vec![3],
                ..Default::default()
            },
        )
        .unwrap_err();
        assert!(e.contains("divide --budget"), "{e}");
        let e = check(
            &c,
            &LabArgs {
                objectives: vec!["ppo".into()],
                ..Default::default()
            },
        )
        .unwrap_err();
        assert!(e.contains("gspo"), "{e}");
        let k = c.with_overrides(&["sampling.top_k=2".into()]).unwrap();
        assert!(
            check(&k, &LabArgs::default())
                .unwrap_err()
                .contains("top_k")
        );
    }
}
