//! Engines: how one compute path does what `grpo::iteration` asks. An engine owns the
//! policy's weights, the optimizer state and the reference copy; it samples responses, scores
//! them teacher-forced, takes an optimizer step on a frozen rollout, snapshots and restores.
//! The algorithm (which prompts, rewards, advantages, dynamic sampling, the record) lives in
//! `grpo` and never sees burn, gemm or wgpu.
//!
//! Engines now: [`autodiff::BurnEngine`] (burn autodiff, any burn backend, the WGSL rollout
//! kernels on a wgpu device), [`lecture_cpu::FusedLectureEngine`] (the lecture model's fused
//! CPU step) and [`transformer_cpu::FusedTransformerEngine`] (the transformer's fused CPU step,
//! rollouts with a KV cache). [`kind_for`] picks the fastest one for a config on this machine.

/// The fused CPU engines' AVX2 / portable dispatch, once: `fn NAME(&mut self, ARGS) -> R` runs
/// `BODY` (an `#[inline(always)]` method) compiled with AVX2 through the generated method `AVX2`
/// where the CPU has it (x86-64, checked at run time), else compiled as it is. Without FMA
/// contraction both are the same IEEE operations in the same order: bit-identical results.
macro_rules! avx2_dispatch {
    ($(#[$meta:meta])* $vis:vis fn $name:ident via $avx2:ident => $body:ident
        (&mut self $(, $arg:ident : $ty:ty)* $(,)?) -> $ret:ty) => {
        $(#[$meta])*
        #[allow(clippy::too_many_arguments)]
        $vis fn $name(&mut self $(, $arg: $ty)*) -> $ret {
            #[cfg(target_arch = "x86_64")]
            if $crate::engine::avx2_on() {
                // SAFETY: the CPU has AVX2 (checked just above).
                return unsafe { self.$avx2($($arg),*) };
            }
            self.$body($($arg),*)
        }

        /// The same method compiled with AVX2 enabled (same operations, wider vectors).
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx2")]
        #[allow(clippy::too_many_arguments)]
        fn $avx2(&mut self $(, $arg: $ty)*) -> $ret {
            self.$body($($arg),*)
        }
    };
}

/// Whether the dispatch takes the AVX2 build (the CPU has it, and no test turned it off).
#[cfg(target_arch = "x86_64")]
#[inline]
pub(crate) fn avx2_on() -> bool {
    #[cfg(test)]
    if PORTABLE_ONLY.load(std::sync::atomic::Ordering::Relaxed) {
        return false;
    }
    std::arch::is_x86_feature_detected!("avx2")
}

/// Set by a test to run the portable builds (harmless to other tests: both builds give the
/// same bits, which is what that test checks).
#[cfg(test)]
pub(crate) static PORTABLE_ONLY: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

pub mod autodiff;
pub mod cores;
pub mod fused_lecture;
pub mod fused_transformer;
pub mod lecture_cpu;
pub mod transformer_cpu;
pub mod wgsl_lecture;

use crate::config::{DeviceChoice, EngineChoice, FusedChoice, ModelKind, RunConfig};
use crate::gpu::{Compute, DeviceError};
use crate::objective::loss::LossSettings;
use crate::objective::sampling::SamplingParams;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum EngineError {
    #[error(transparent)]
    Kernel(#[from] crate::gpu::kernels::KernelError),
    #[error(
        "run.kernels = gpu needs a wgpu device, but the run is on {0}; use --kernels reference or --device software|gpu"
    )]
    KernelsNeedWgpu(String),
    #[error("run.engine = wgsl {0}")]
    WgslUnavailable(String),
    #[error("checkpoint: {0}")]
    Snapshot(String),
    /// Asked of an engine something it does not do.
    #[error("{0}")]
    Unsupported(String),
    /// The device has not answered yet (in a browser, where nothing can wait for it): ask
    /// again on a later frame.
    #[error("waiting for the device")]
    Pending,
    /// The snapshot holds burn's optimizer state, which this engine cannot continue exactly;
    /// burn's autodiff engine can.
    #[error("checkpoint: written on burn's autodiff path (optimizer.bpk), not by this engine")]
    WrittenByBurn,
}

/// `B` prompts, `G` responses each, sampled from the current policy.
#[derive(Debug, Clone, Copy)]
pub struct SampleRequest<'a> {
    /// `B` prompts of `n` tokens.
    pub prompts: &'a [&'a [u32]],
    pub g: usize,
    /// Most tokens a response may have (`n` for the lecture model, which always answers `n`).
    pub max_len: usize,
    pub params: SamplingParams,
    pub seed: u64,
    /// Keys the random draws: the iteration for the first draw, a hash of it for resampling.
    pub stream: u32,
    /// The sampler's own side (the mismatch lab): bf16 logits, and its log π returned.
    pub sampler: SamplerSide,
    /// Verify on the device too, when the engine can (the WGSL rollout kernels): the reward
    /// weights of `distance`, `exact`, `inclusion_ordering` — and the advantages if `true`.
    pub verify: Option<([f32; 3], bool)>,
}

/// How the sampler differs from the learner on purpose (the mismatch lab; the CPU engines and
/// burn's take it, the WGSL lecture engine refuses it by name).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SamplerSide {
    /// The sampler's logits rounded to bf16 before its softmax and draw.
    pub bf16: bool,
    /// Return the log π of each drawn token under the distribution drawn from
    /// ([`Samples::sampler_logp`]).
    pub record_logp: bool,
    /// Return the tokens the sampler could draw at each position ([`Samples::support`]), for
    /// the learner to renormalise over (`sampling.keep_sampling_mask`).
    pub keep_support: bool,
}

impl SamplerSide {
    /// A config's sampler side.
    pub fn of(c: &RunConfig) -> Self {
        Self {
            bf16: c.sampling.sampler_precision == crate::config::SamplerPrecision::Bf16,
            record_logp: c.records_sampler_logp(),
            keep_support: c.sampling.keep_sampling_mask,
        }
    }

    /// Whether anything is asked beyond a plain draw.
    pub fn any(&self) -> bool {
        self.bf16 || self.record_logp || self.keep_support
    }
}

/// The lecture model's rollout from its logits `[B, n, V]` (shape `(B, n, V, G)`): tokens
/// `[B·G·n]` drawn as the sampler sees the logits (rounded to bf16 when asked), and when asked
/// the sampler's own log π of each and its support at each (`[B·G·n]`; a prompt's G responses
/// share each position's).
pub(crate) fn draw_lecture(
    logits: &[f32],
    (b, n, v, g): (usize, usize, usize, usize),
    req: &SampleRequest,
) -> Drawn {
    use crate::objective::sampling;
    let seen = as_sampler_sees(logits, req.sampler);
    let tokens = sampling::sample_independent(&seen, b, n, v, g, req.params, req.seed, req.stream);
    let sampler_logp = req
        .sampler
        .record_logp
        .then(|| sampling::sampler_logp(&seen, (b, n, v, g), req.params, &tokens));
    let support = req.sampler.keep_support.then(|| {
        let per_position = sampling::support_rows(&seen, v, req.params);
        (0..b * g * n)
            .map(|i| per_position[(i / (g * n)) * n + i % n])
            .collect()
    });
    Drawn {
        tokens,
        sampler_logp,
        support,
    }
}

/// A lecture rollout's draws ([`draw_lecture`]).
pub(crate) struct Drawn {
    pub tokens: Vec<u32>,
    pub sampler_logp: Option<Vec<f32>>,
    pub support: Option<Vec<u64>>,
}

/// How a rollout draws: the sampling settings, the counter-based stream's keys and the
/// sampler's own side — [`SampleRequest`] without its prompts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Draw {
    pub params: SamplingParams,
    pub seed: u64,
    pub stream: u32,
    pub sampler: SamplerSide,
}

impl Draw {
    /// The stream of an autoregressive rollout's position `t` (one draw per row under it).
    pub fn position_stream(&self, t: usize) -> u32 {
        crate::rng::counter_u32(self.seed, &[self.stream, t as u32, 0xA7])
    }
}

impl SampleRequest<'_> {
    /// How this request draws.
    pub fn draw(&self) -> Draw {
        Draw {
            params: self.params,
            seed: self.seed,
            stream: self.stream,
            sampler: self.sampler,
        }
    }
}

/// The logits as the sampler sees them: rounded to bf16 when asked.
fn as_sampler_sees(logits: &[f32], side: SamplerSide) -> std::borrow::Cow<'_, [f32]> {
    if side.bf16 {
        let round = crate::objective::sampling::round_bf16;
        std::borrow::Cow::Owned(logits.iter().map(|&x| round(x)).collect())
    } else {
        std::borrow::Cow::Borrowed(logits)
    }
}

/// What an autoregressive rollout's sampler recorded, position by position (both transformer
/// engines): each row's log π_sampler and support where [`SamplerSide`] asks for them.
#[derive(Debug, Default)]
pub(crate) struct Trace {
    logp: Vec<Vec<f32>>,
    support: Vec<Vec<u64>>,
}

impl Trace {
    /// The records as `[rows·T]`, `T` the longest row (at least 1) — the layout of the learner's
    /// `log π` ([`Samples::logp`]): 0 past each row's end for log π, every token for the support.
    pub fn finish(
        &self,
        rows: &[Vec<u32>],
        side: SamplerSide,
    ) -> (Option<Vec<f32>>, Option<Vec<u64>>) {
        (
            side.record_logp.then(|| by_rows(&self.logp, rows, 0.0)),
            side.keep_support
                .then(|| by_rows(&self.support, rows, u64::MAX)),
        )
    }
}

/// Per-position records `[T][rows]` → `[rows·T]`, `fill` past each row's end.
fn by_rows<T: Copy>(trace: &[Vec<T>], rows: &[Vec<u32>], fill: T) -> Vec<T> {
    let width = rows.iter().map(|r| r.len()).max().unwrap_or(1).max(1);
    let mut out = vec![fill; rows.len() * width];
    for (i, row) in rows.iter().enumerate() {
        for (t, slot) in out[i * width..i * width + row.len()].iter_mut().enumerate() {
            *slot = trace[t][i];
        }
    }
    out
}

/// One position `t` of an autoregressive rollout (both transformer engines): each row's next
/// token drawn from `logits [rows, V]` as the sampler sees them, one draw per row under the
/// position's own stream — so every engine and the WGSL kernel pick the same tokens — and,
/// when asked, each draw's log π_sampler and the row's support recorded in `trace`.
pub(crate) fn draw_position(
    logits: &[f32],
    v: usize,
    t: usize,
    d: &Draw,
    trace: &mut Trace,
) -> Vec<u32> {
    use crate::objective::sampling;
    let rows = logits.len() / v;
    let step_stream = d.position_stream(t);
    let seen = as_sampler_sees(logits, d.sampler);
    let tokens = sampling::sample_independent(&seen, rows, 1, v, 1, d.params, d.seed, step_stream);
    if d.sampler.record_logp {
        let logp = sampling::sampler_logp(&seen, (rows, 1, v, 1), d.params, &tokens);
        trace.logp.push(logp);
    }
    if d.sampler.keep_support {
        trace
            .support
            .push(sampling::support_rows(&seen, v, d.params));
    }
    tokens
}

/// Rewards (and advantages) an engine computed on its device along with the samples.
#[derive(Debug, Clone)]
pub struct DeviceScores {
    pub rewards: Vec<f32>,
    /// 1 where a response is exactly sorted.
    pub exact: Vec<u32>,
    pub advantages: Option<Advantages>,
}

/// Every advantage mode for `[B, G]` rewards (`AdvantageMode::GROUP` order) and each group's
/// zero-std flag.
#[derive(Debug, Clone)]
pub struct Advantages {
    pub by_mode: Vec<Vec<f32>>,
    pub zero_std: Vec<bool>,
}

/// What a rollout produced: `B·G` rows.
#[derive(Debug, Clone, Default)]
pub struct Samples {
    /// Each response's tokens (`<eos>`, the task's vocab size, included when it closed).
    pub rows: Vec<Vec<u32>>,
    /// Closed with `<eos>` within `max_len` (always true for the fixed-length lecture model).
    pub closed: Vec<bool>,
    pub scores: Option<DeviceScores>,
    /// Greedy answer to each prompt, when it came free with the sampling pass.
    pub greedy: Option<Vec<Vec<u32>>>,
    /// `log π` of every sampled token at the sampling weights (`[B·G·T]`, padded to the longest
    /// response), when it came free with the sampling pass and equals what
    /// [`Engine::token_logp`] would compute on the real tokens.
    pub logp: Option<Vec<f32>>,
    /// `[B·G·T]` log π of every drawn token under the distribution the sampler drew from
    /// (top-k / top-p renormalised, bf16 logits), when [`SamplerSide::record_logp`] asked.
    pub sampler_logp: Option<Vec<f32>>,
    /// `[B·G·T]` the tokens the sampler could draw at each position (bit `j` for token `j`;
    /// every token past a row's end), when [`SamplerSide::keep_support`] asked.
    pub support: Option<Vec<u64>>,
}

pub use crate::task::batch::Batch;

/// Whose log-probabilities: the policy being trained or the reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Which {
    Policy,
    Reference,
}

/// One optimizer step's inputs besides the batch.
#[derive(Debug, Clone, Copy)]
pub struct StepRequest<'a> {
    pub loss: LossSettings,
    pub temperature: f32,
    pub lr: f64,
    pub max_grad_norm: f32,
    /// `[B·G]`, the mode that drives the update.
    pub advantages: &'a [f32],
    /// `[B·G·T]`: an advantage per token (PPO's GAE with a learned critic); when present it
    /// replaces `advantages` in the loss.
    pub token_advantages: Option<&'a [f32]>,
    /// `[B·G·T]`, frozen.
    pub old_logp: &'a [f32],
    pub ref_logp: &'a [f32],
    /// `[B·G·T]` the sampler's own log π where it differs from the learner's (the mismatch
    /// lab); `None`: the sampler is π_old.
    pub sampler_logp: Option<&'a [f32]>,
    /// Return `log π` (before the update) of the first this many responses.
    pub logp_rows: usize,
    /// Of those, the first this many need their per-token entropy (the logged groups at an
    /// iteration's last step, a mini-batch's rows); an engine may return more.
    pub entropy_rows: usize,
    /// Measure the step's entropy change (`run.entropy_dynamics`), where the engine can:
    /// [`StepScalars::entropy_measured`] and [`StepScalars::entropy_first_order`].
    pub entropy_dynamics: bool,
}

/// The scalars one optimizer step reports (on any engine).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepScalars {
    pub loss: f32,
    pub kl: f32,
    pub clip_low: f32,
    pub clip_high: f32,
    pub ratio_mean: f32,
    pub entropy: f32,
    pub grad_norm: f32,
    /// The mean entropy over the step's states after its update minus `entropy` (asked by
    /// [`StepRequest::entropy_dynamics`], where the engine measures it).
    pub entropy_measured: Option<f32>,
    /// `∇θ H · Δθ`: the first-order entropy change of the update actually taken (same).
    pub entropy_first_order: Option<f32>,
}

impl StepScalars {
    /// The scalars of a step whose objective `objective::loss` evaluated (`t`), with the
    /// gradient's norm; nothing of the entropy's change.
    pub fn of(t: &crate::objective::loss::TokenTerms, grad_norm: f32) -> Self {
        Self {
            loss: t.loss as f32,
            kl: t.kl,
            clip_low: t.clip_low,
            clip_high: t.clip_high,
            ratio_mean: t.ratio_mean,
            entropy: t.entropy,
            grad_norm,
            entropy_measured: None,
            entropy_first_order: None,
        }
    }
}

#[derive(Debug, Clone)]
pub struct StepOutput {
    pub scalars: StepScalars,
    /// `log π` of the first `logp_rows` responses, `[rows·T]`.
    pub logp: Vec<f32>,
    /// Each token's entropy `H_t` (at the step's temperature) of the same rows, `[rows·T]`;
    /// empty where the engine does not return it (the WGSL engine).
    pub entropy: Vec<f32>,
}

/// A whole iteration asked of an engine that runs one on its device
/// ([`Engine::runs_iterations`]): rollout, verifying, every advantage mode, log π_old /
/// log π_ref and `mu` optimizer steps on the mode that drives, in one submission.
#[derive(Debug, Clone, Copy)]
pub struct IterationRequest<'a> {
    /// The rollout (`verify` is ignored: `reward_weights` verify on the device).
    pub sample: SampleRequest<'a>,
    /// The weights of `distance`, `exact`, `inclusion_ordering`.
    pub reward_weights: [f32; 3],
    /// The mode that drives the update, as an index into `AdvantageMode::GROUP`.
    pub mode: usize,
    pub loss: LossSettings,
    pub temperature: f32,
    pub lr: f64,
    pub max_grad_norm: f32,
    pub mu: usize,
    /// Return `log π` (before the last update) of the first this many responses.
    pub logp_rows: usize,
}

/// What a whole iteration produced.
#[derive(Debug, Clone)]
pub struct IterationOutput {
    /// The rollout, with its scores and every advantage mode, the greedy answers and log π_old.
    pub samples: Samples,
    /// `[B·G·T]`
    pub ref_logp: Vec<f32>,
    /// The `mu` optimizer steps, in order.
    pub steps: Vec<StepOutput>,
}

/// A snapshot of an engine's state as named byte blobs (weights, reference, optimizer); the
/// `train` layer writes them to disk.
pub type Snapshot = Vec<(String, Vec<u8>)>;

/// A compute path for GRPO.
pub trait Engine {
    /// One line for logs and the app: what computes, where.
    fn label(&self) -> String;
    /// Sample `G` responses per prompt from the current policy.
    fn sample(&mut self, req: &SampleRequest) -> Result<Samples, EngineError>;
    /// The greedy answer of the current policy to each prompt.
    fn greedy(&mut self, prompts: &[&[u32]], max_len: usize) -> Result<Vec<Vec<u32>>, EngineError>;
    /// Every advantage mode on the engine's device, when it has kernels for it.
    fn device_advantages(
        &mut self,
        _rewards: &[f32],
        _g: usize,
    ) -> Option<Result<Advantages, EngineError>> {
        None
    }
    /// Teacher-forced `log π` (or `log π_ref`) of every token of the batch at `temperature`,
    /// `[B·G·T]` (padding positions hold whatever the engine computed there).
    fn token_logp(
        &mut self,
        which: Which,
        batch: &Batch,
        temperature: f32,
    ) -> Result<Vec<f32>, EngineError>;
    /// One optimizer step of the GRPO loss on a frozen batch.
    fn step(&mut self, batch: &Batch, req: &StepRequest) -> Result<StepOutput, EngineError>;
    /// Whether this engine takes an iteration's optimizer steps in one go ([`Engine::steps`]:
    /// one device submission for the WGSL engine). The trainer then asks for all of them on
    /// the iteration's first step and hands the outputs out one step at a time, so a live
    /// config change applies from the next iteration.
    fn batches_steps(&self) -> bool {
        false
    }
    /// `count` optimizer steps on the same frozen batch with the same request, in order;
    /// `req.logp_rows` applies to the last one.
    fn steps(
        &mut self,
        batch: &Batch,
        req: &StepRequest,
        count: usize,
    ) -> Result<Vec<StepOutput>, EngineError> {
        let mut out = Vec::with_capacity(count);
        for k in 0..count {
            let r = StepRequest {
                logp_rows: if k + 1 == count { req.logp_rows } else { 0 },
                entropy_rows: if k + 1 == count { req.entropy_rows } else { 0 },
                ..*req
            };
            out.push(self.step(batch, &r)?);
        }
        Ok(out)
    }
    /// Whether [`Engine::iteration`] runs a whole iteration on this engine's device (one
    /// submission). The trainer asks for it where the config lets the iteration run
    /// without the host in between (no dynamic sampling, no KL in the reward, a group
    /// advantage mode, no bug switch).
    fn runs_iterations(&self) -> bool {
        false
    }
    /// A whole iteration (see [`IterationRequest`]); only where [`Engine::runs_iterations`].
    fn iteration(&mut self, _req: &IterationRequest) -> Result<IterationOutput, EngineError> {
        Err(EngineError::Unsupported(format!(
            "{} does not run whole iterations",
            self.label()
        )))
    }
    /// Supervised steps (the cold start): cross-entropy of each target given its prompt, a fresh
    /// Adam with `lr`, one step per batch. Returns the last step's loss.
    fn supervised(&mut self, batches: &[Batch], lr: f64) -> Result<f32, EngineError>;
    /// The reference becomes a real copy of the policy.
    fn refresh_reference(&mut self);
    /// Called between iterations (engines that cache per-iteration state drop it here).
    fn end_iteration(&mut self) {}
    /// A rollout's rows ([`Samples::rows`]), given back once the trainer is done with them: an
    /// engine may keep them for its next rollout to write into; by default they are freed on
    /// the threads ([`cores::Cores::drop_spread`]).
    fn recycle_rows(&mut self, rows: Vec<Vec<u32>>) {
        self.cores().drop_spread(rows, cores::ROWS_SPAN);
    }
    /// Every weight of the policy, flattened in a fixed order (tests, comparisons).
    fn flat_weights(&self) -> Vec<f32>;
    fn snapshot(&self) -> Result<Snapshot, EngineError>;
    fn restore(&mut self, snapshot: &Snapshot) -> Result<(), EngineError>;
    /// Whether this engine computes exactly what `config` asks (after a live change).
    fn supports(&self, config: &RunConfig) -> bool;
    /// The threads its passes run on (`run.threads` where the engine takes it).
    fn threads(&self) -> usize {
        1
    }
    /// Those threads, for the trainer's own passes over a batch (the ratio statistics, the
    /// rewards): one where the engine has none.
    fn cores(&self) -> cores::Cores {
        cores::Cores::default()
    }
    /// For engines that drive a device by hand (the WGSL engine): command submissions so far
    /// and dispatches per optimizer step (`bench` reports them).
    fn device_counts(&self) -> Option<DeviceCounts> {
        None
    }
}

/// What an engine that drives a device by hand has sent it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceCounts {
    /// Command submissions since the engine was built.
    pub submissions: usize,
    /// Compute dispatches in one optimizer step.
    pub dispatches_per_step: usize,
    /// Compute dispatches in one rollout (sampling, log π_old, log π_ref).
    pub dispatches_per_rollout: usize,
}

/// Which engine kind a config runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineKind {
    /// burn autodiff on the chosen device.
    Burn,
    /// The lecture model's fused CPU step.
    FusedLecture,
    /// The transformer's fused CPU step (KV-cache rollouts).
    FusedTransformer,
    /// The lecture model's WGSL engine (forward, backward and Adam as dispatches).
    Wgsl,
    /// The transformer's WGSL engine (KV-cache rollouts, backward and Adam as dispatches):
    /// only where `run.engine = wgsl` asks for it (`auto` keeps the fused CPU engine until a
    /// hardware GPU has been measured).
    WgslTransformer,
}

/// The engine a config gets on a compute device: on a wgpu device the WGSL lecture engine
/// where it covers the config (unless `run.engine = burn`); on the CPU the fused CPU step
/// where it covers the config; else burn's autodiff.
pub fn kind_for(config: &RunConfig, compute: &Compute) -> EngineKind {
    if compute.gpu.is_some()
        && config.run.engine != EngineChoice::Burn
        && wgsl_lecture::WgslLectureEngine::covers(config)
    {
        return EngineKind::Wgsl;
    }
    if compute.gpu.is_some()
        && config.run.engine == EngineChoice::Wgsl
        && wgsl_lecture::WgslTransformerEngine::uncovered(config).is_none()
    {
        return EngineKind::WgslTransformer;
    }
    // In a browser a WebGPU device serves only the WGSL engine (burn's wgpu backend is not in
    // the build): everything else trains on the CPU engines there.
    let cpu_side = compute.gpu.is_none() || cfg!(target_arch = "wasm32");
    let fused = config.run.fused_step == FusedChoice::Auto && cpu_side;
    if fused && lecture_cpu::FusedLectureEngine::covers(config) {
        EngineKind::FusedLecture
    } else if fused && transformer_cpu::FusedTransformerEngine::covers(config) {
        EngineKind::FusedTransformer
    } else {
        EngineKind::Burn
    }
}

/// Whether `config` can run on `compute` at all: the kernels or the engine it asks for need a
/// wgpu device, or the WGSL engine it asks for does not cover it. The CLI asks before its run
/// (and `--dry-run`) says anything; [`build`] asks again.
pub fn check(config: &RunConfig, compute: &Compute) -> Result<(), EngineError> {
    if config.run.kernels == crate::config::KernelChoice::Gpu && compute.gpu.is_none() {
        return Err(EngineError::KernelsNeedWgpu(compute.label.clone()));
    }
    if config.run.engine == EngineChoice::Wgsl {
        if compute.gpu.is_none() {
            return Err(EngineError::WgslUnavailable(format!(
                "needs a wgpu device, but the run is on {}: use --device gpu or --device software (run.device = gpu | software), or set run.engine = auto or burn",
                compute.label
            )));
        }
        let uncovered = match config.model.kind {
            crate::config::ModelKind::Transformer => {
                wgsl_lecture::WgslTransformerEngine::uncovered(config)
            }
            _ => wgsl_lecture::WgslLectureEngine::uncovered(config),
        };
        if let Some(why) = uncovered {
            return Err(EngineError::WgslUnavailable(format!(
                "does not cover this config: {why}; set run.engine = auto or burn"
            )));
        }
    }
    Ok(())
}

/// Build the engine for a config.
pub fn build(config: &RunConfig, compute: &Compute) -> Result<Box<dyn Engine + Send>, EngineError> {
    check(config, compute)?;
    Ok(match kind_for(config, compute) {
        EngineKind::Wgsl => {
            let gpu = compute.gpu.clone().expect("kind_for: a wgpu device");
            Box::new(wgsl_lecture::WgslLectureEngine::new(config, gpu)?)
        }
        EngineKind::WgslTransformer => {
            let gpu = compute.gpu.clone().expect("kind_for: a wgpu device");
            Box::new(wgsl_lecture::WgslTransformerEngine::new(config, gpu)?)
        }
        EngineKind::FusedLecture => Box::new(lecture_cpu::FusedLectureEngine::new(config)),
        EngineKind::FusedTransformer => {
            Box::new(transformer_cpu::FusedTransformerEngine::new(config))
        }
        // In a browser burn runs on its CPU backend, never with WebGPU kernels (their
        // read-backs block).
        EngineKind::Burn if cfg!(target_arch = "wasm32") => {
            Box::new(autodiff::BurnEngine::new(config, Compute::cpu())?)
        }
        EngineKind::Burn => Box::new(autodiff::BurnEngine::new(config, compute.clone())?),
    })
}

/// The engine that covers every config (burn's path, on its CPU backend), continuing from a
/// snapshot: where a live-changed config leaves the engine it ran on, or a checkpoint was
/// written on burn's path.
pub fn covering_all_from(
    config: &RunConfig,
    snapshot: &Snapshot,
) -> Result<Box<dyn Engine + Send>, EngineError> {
    Ok(Box::new(autodiff::BurnEngine::from_snapshot(
        config, snapshot,
    )?))
}

/// The device `--device auto` resolves to for a config, and why (one line). The rule, from the
/// measurements in the README:
/// - no hardware GPU: the CPU. Lavapipe (a CPU emulating a GPU) is never the default for
///   training — it is slower than the CPU engines at every measured size (the WGSL engine
///   4–120×, burn's path 44–1500×); `--device software` still selects it.
/// - a hardware GPU: the lecture model stays on the fused CPU step (0.01–0.9 ms per step on the
///   presets). The WGSL engine (17 dispatches per step, one submission per iteration) has been measured on
///   lavapipe only, where the fused CPU step is faster at every preset shape; `auto` moves the
///   lecture model to it on a hardware GPU once `bench/gpu.sh` shows it winning there.
///   `run.engine = wgsl` asks for it (lavapipe without a hardware GPU).
///   The transformer stays on the fused CPU transformer engine where it covers the config:
///   neither its WGSL engine nor burn's path has been measured on a hardware GPU (`bench/gpu.sh`
///   prints both against it), and on lavapipe the fused step is 13× the WGSL engine's speed and
///   ~270× burn's. A transformer config the fused engine does not cover goes to the GPU
///   (burn's autodiff there, rather than burn on the CPU).
pub fn auto_device(config: &RunConfig, hardware_gpu: Option<&str>) -> (DeviceChoice, String) {
    let lecture = config.model.kind == ModelKind::Lecture;
    if config.run.engine == EngineChoice::Wgsl {
        // The WGSL engine was asked for: it needs a wgpu device, lavapipe if nothing else.
        return match hardware_gpu {
            Some(name) => (
                DeviceChoice::Gpu,
                format!("run.engine = wgsl, on the hardware GPU {name}"),
            ),
            None => (
                DeviceChoice::Software,
                if cfg!(target_arch = "wasm32") {
                    "run.engine = wgsl: the browser's WebGPU adapter".into()
                } else {
                    "run.engine = wgsl and no hardware GPU, so lavapipe".into()
                },
            ),
        };
    }
    if config.run.kernels == crate::config::KernelChoice::Gpu {
        // The WGSL kernels were asked for: they need a wgpu device, lavapipe if nothing else.
        return match hardware_gpu {
            Some(name) => (
                DeviceChoice::Gpu,
                format!("run.kernels = gpu, on the hardware GPU {name}"),
            ),
            None => (
                DeviceChoice::Software,
                "run.kernels = gpu and no hardware GPU, so lavapipe".into(),
            ),
        };
    }
    match hardware_gpu {
        None => (
            DeviceChoice::Cpu,
            "no hardware GPU, so the CPU; lavapipe, a CPU emulating a GPU, is never the default (--device software selects it)".into(),
        ),
        Some(name) if lecture => (
            DeviceChoice::Cpu,
            format!("the lecture model's fused CPU step beats burn's path on {name} at every preset shape"),
        ),
        Some(name)
            if config.run.fused_step == FusedChoice::Auto
                && transformer_cpu::FusedTransformerEngine::covers(config) =>
        {
            let why = format!(
                "the fused CPU transformer engine: neither the WGSL engine nor burn's path has been measured on a hardware GPU such as {name} yet (bench/gpu.sh; run.engine = wgsl asks for the WGSL engine)"
            );
            (DeviceChoice::Cpu, why)
        }
        Some(name) => (
            DeviceChoice::Gpu,
            format!(
                "a transformer the fused CPU engine does not cover: burn's path on the hardware GPU {name}"
            ),
        ),
    }
}

/// Open the compute device for a config: `auto` follows [`auto_device`]; the others as asked.
/// Returns the device and the one line that says which engine runs and why.
pub fn select(choice: DeviceChoice, config: &RunConfig) -> Result<(Compute, String), DeviceError> {
    let (choice, why) = resolve(choice, config);
    let compute = Compute::select(choice)?;
    let engine = match kind_for(config, &compute) {
        _ if config.run.engine == EngineChoice::Wgsl && compute.gpu.is_none() => {
            "none (run.engine = wgsl needs a wgpu device)"
        }
        EngineKind::FusedLecture => "fused CPU lecture step",
        EngineKind::FusedTransformer => "fused CPU transformer step",
        EngineKind::Burn => "burn autodiff",
        EngineKind::Wgsl => "WGSL lecture engine",
        EngineKind::WgslTransformer => "WGSL transformer engine",
    };
    Ok((
        compute.clone(),
        format!("engine: {engine} on {} — {why}", compute.label),
    ))
}

/// The device `choice` means for `config` (`auto` resolved), and why.
pub fn resolve(choice: DeviceChoice, config: &RunConfig) -> (DeviceChoice, String) {
    match choice {
        DeviceChoice::Auto => {
            let gpu = crate::gpu::context::hardware_adapter_name();
            auto_device(config, gpu.as_deref())
        }
        // `--device X` reaches the config as `run.device = X`: either may have said it.
        other => (
            other,
            format!("run.device = {0} (--device {0})", other.name()),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_never_trains_on_lavapipe_unless_the_kernels_are_asked_for() {
        let lecture = RunConfig::preset("lecture17").unwrap();
        let transformer = RunConfig::preset("transformer-sort").unwrap();
        assert_eq!(auto_device(&lecture, None).0, DeviceChoice::Cpu);
        assert_eq!(auto_device(&transformer, None).0, DeviceChoice::Cpu);
        assert_eq!(auto_device(&lecture, Some("a GPU")).0, DeviceChoice::Cpu);
        // Until a hardware GPU has been measured, the transformer keeps the fused CPU engine
        // where it covers the config; burn's path on the GPU where it does not.
        assert_eq!(
            auto_device(&transformer, Some("a GPU")).0,
            DeviceChoice::Cpu
        );
        let mut uncovered = transformer.clone();
        uncovered.run.fused_step = FusedChoice::Off; // burn's path asked for
        assert_eq!(auto_device(&uncovered, Some("a GPU")).0, DeviceChoice::Gpu);
        let mut wgsl = lecture.clone();
        wgsl.run.engine = EngineChoice::Wgsl;
        assert_eq!(auto_device(&wgsl, None).0, DeviceChoice::Software);
        assert_eq!(auto_device(&wgsl, Some("a GPU")).0, DeviceChoice::Gpu);
        let mut kernels = lecture.clone();
        kernels.run.kernels = crate::config::KernelChoice::Gpu;
        assert_eq!(auto_device(&kernels, None).0, DeviceChoice::Software);
        assert_eq!(auto_device(&kernels, Some("a GPU")).0, DeviceChoice::Gpu);
    }
}
