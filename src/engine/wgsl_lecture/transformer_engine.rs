//! The transformer's WGSL engine (`run.engine = wgsl` with `model.kind = "transformer"`):
//! rollouts with the KV cache, log π, the optimizer steps and the cold start on the device
//! ([`WgslTransformer`]); each step's objective on the host between its pass and its backward
//! (`objective::loss::evaluate`, as on the fused CPU engine: every objective it computes, this
//! engine trains). Checkpoints are the fused transformer engine's (burn's format for the
//! weights, the same Adam blob), so a run can resume on either.

use super::transformer::WgslTransformer;
use super::*;
use crate::engine::autodiff::flat_params;
use crate::engine::fused_transformer::{Hyper, Pick};
use crate::engine::{DeviceCounts, SamplerSide};
use crate::model::{TransformerPolicy, TransformerShape, transformer_shape};
use crate::objective::loss::{self, TokenInputs, TokenTerms};

pub struct WgslTransformerEngine {
    /// The device's state; `None` while a call's future holds it ([`Busy`]).
    dev: Option<WgslTransformer>,
    /// A call whose read-backs have not arrived (without `blocking`).
    busy: Option<Busy>,
    /// Calls wait for their read-backs (natively). Without (a browser, or
    /// [`Self::answer_between_calls`]), a call whose read-back is on its way answers
    /// [`EngineError::Pending`]; the trainer asks again on a later frame — the same call
    /// collects it, and the calls before it in the iteration (which the trainer asks again
    /// too) are answered from `answered`.
    blocking: bool,
    /// The answers of the calls that read and did not change the weights, since the weights
    /// or the reference last changed (without `blocking`): `(key, answer)`.
    answered: Vec<(u64, Answer)>,
    /// Counts changes of the policy's weights; `ref_of`: the count when the reference was
    /// copied from the policy (`None`: not a copy, after a restore).
    version: u64,
    ref_of: Option<u64>,
    /// The reference's refresh asked while a call was in flight: done before the next one.
    refresh_wanted: bool,
    name: String,
    terms: TokenTerms,
    /// Submissions so far; dispatches of the last step and the last rollout.
    submissions: usize,
    step_dispatches: usize,
    rollout_dispatches: usize,
}

/// What a call of the engine answers (the result of [`WgslTransformerEngine::call`]).
#[derive(Clone)]
enum Answer {
    Samples(Samples),
    Rows(Vec<Vec<u32>>),
    Logp(Vec<f32>),
    /// A step's output, and the objective's buffers it used (the engine keeps them).
    Step(StepOutput, TokenTerms),
    Loss(f32),
}

/// The device and a call's result, when the call's future is done.
type Done = (WgslTransformer, Result<Answer, EngineError>);

/// A call in flight: its key, whether it changes the weights, and its future (which holds
/// the device until it is done).
struct Busy {
    key: u64,
    changes_weights: bool,
    future: std::pin::Pin<Box<dyn std::future::Future<Output = Done> + Send>>,
}

impl Busy {
    /// Poll once (no waker: the engine polls again on the next call).
    fn poll(&mut self) -> Option<Done> {
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match self.future.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(done) => Some(done),
            std::task::Poll::Pending => None,
        }
    }
}

/// A call's key: a hash of what it asks.
fn key_of(kind: u8, words: &[&[u32]], rest: impl std::fmt::Debug) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::hash::DefaultHasher::new();
    kind.hash(&mut h);
    words.hash(&mut h);
    format!("{rest:?}").hash(&mut h);
    h.finish()
}

/// log π and the entropy of a batch's response tokens ([`WgslTransformer::scores`]).
async fn scores_of(
    dev: &mut WgslTransformer,
    which: Which,
    b: &Batch,
    temperature: f32,
) -> Result<(Vec<f32>, Vec<f32>), EngineError> {
    dev.scores(
        which,
        &b.prompts,
        &b.responses,
        &b.lengths,
        b.g,
        b.t,
        temperature,
    )
    .await
}

fn f32_words(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

impl WgslTransformerEngine {
    /// Why a config is not this engine's, in words (`None`: it is).
    pub fn uncovered(c: &RunConfig) -> Option<&'static str> {
        if c.model.kind != ModelKind::Transformer {
            Some("it trains the transformer only")
        } else if c.algorithm.bugs.any() {
            Some("the bug gallery's switches are burn's path's")
        } else if SamplerSide::of(c).any() {
            Some(
                "its rollout draws from the learner's f32 logits over the full vocabulary and records no sampler log π (sampling.sampler_precision, keep_sampling_mask, learner_scores = full with a gap, algorithm.is_correction with a gap and stale rollouts run on the CPU engines)",
            )
        } else if c.run.entropy_dynamics {
            Some("run.entropy_dynamics measures on the fused CPU engine")
        } else if c.run.kernels == KernelChoice::Reference {
            Some("run.kernels = reference asks for the Rust kernels")
        } else {
            None
        }
    }

    pub fn new(c: &RunConfig, ctx: Arc<GpuContext>) -> Result<Self, EngineError> {
        let shape = transformer_shape(c);
        let init = TransformerPolicy::new(shape, c.model.init_scale, c.run.seed, &Device::flex());
        let w = flat_params(&Policy::Transformer(init));
        let o = &c.optimizer;
        let hyper = Hyper {
            beta1: o.beta1 as f32,
            beta2: o.beta2 as f32,
            eps: o.eps as f32,
        };
        let name = match MatmulKernel::for_transformer(&ctx) {
            MatmulKernel::WindowSubgroup => format!("{} (subgroup products)", ctx.summary.name),
            _ => ctx.summary.name.clone(),
        };
        let mut engine = Self {
            dev: Some(WgslTransformer::new(ctx, shape, c.task.n, &w, hyper)?),
            busy: None,
            blocking: true,
            answered: Vec::new(),
            version: 0,
            ref_of: Some(0),
            refresh_wanted: false,
            name,
            terms: TokenTerms::default(),
            submissions: 0,
            step_dispatches: 0,
            rollout_dispatches: 0,
        };
        if cfg!(target_arch = "wasm32") {
            engine.answer_between_calls();
        }
        Ok(engine)
    }

    /// Calls stop waiting for the device: a call whose read-back has not arrived answers
    /// [`EngineError::Pending`] and the same call later collects it — as in a browser, where
    /// nothing may wait (natively: tests of that path).
    pub fn answer_between_calls(&mut self) {
        self.blocking = false;
        if let Some(dev) = &mut self.dev {
            dev.blocking = false;
        }
    }

    /// The device's state, when no call holds it.
    fn device(&self) -> Result<&WgslTransformer, EngineError> {
        self.dev.as_ref().ok_or(EngineError::Pending)
    }

    fn burn_policy(shape: TransformerShape, w: &[f32], device: &Device) -> Policy {
        Policy::Transformer(TransformerPolicy::from_flat(shape, w, device))
    }

    fn flat(prompts: &[&[u32]]) -> Vec<u32> {
        prompts.iter().flat_map(|p| p.iter().copied()).collect()
    }

    /// Run a call on the device: `start` makes its future from the device (which the future
    /// hands back when done). Blocking, it is done at its first poll. Otherwise an answer of
    /// the same key since the weights last changed is handed out again (`changes_weights`
    /// false), a call in flight is polled (and collected when it is this one), and a new call
    /// that does not finish at its first poll stays in flight: [`EngineError::Pending`].
    fn call(
        &mut self,
        key: u64,
        changes_weights: bool,
        start: impl FnOnce(WgslTransformer) -> Busy,
    ) -> Result<Answer, EngineError> {
        if !changes_weights && let Some((_, a)) = self.answered.iter().find(|(k, _)| *k == key) {
            return Ok(a.clone());
        }
        if let Some(mut busy) = self.busy.take() {
            match busy.poll() {
                Some(done) => {
                    let answer = self.finish(busy.key, busy.changes_weights, done);
                    if busy.key == key {
                        return answer;
                    }
                }
                None => {
                    self.busy = Some(busy);
                    return Err(EngineError::Pending);
                }
            }
        }
        if std::mem::take(&mut self.refresh_wanted) {
            self.refresh_now();
        }
        let dev = self.dev.take().expect("no call in flight");
        let mut busy = start(dev);
        busy.key = key;
        busy.changes_weights = changes_weights;
        match busy.poll() {
            Some(done) => self.finish(key, changes_weights, done),
            None if self.blocking => unreachable!("a blocking call is done at its first poll"),
            None => {
                self.busy = Some(busy);
                Err(EngineError::Pending)
            }
        }
    }

    /// A call is done: the device back, its counts, and its answer kept (a call that read) or
    /// the kept answers dropped (a call that changed the weights).
    fn finish(
        &mut self,
        key: u64,
        changes_weights: bool,
        (dev, answer): Done,
    ) -> Result<Answer, EngineError> {
        self.submissions = dev.submissions;
        self.dev = Some(dev);
        if changes_weights {
            self.version += 1;
            self.answered.clear();
        } else if let (false, Ok(a)) = (self.blocking, &answer) {
            self.answered.push((key, a.clone()));
        }
        answer
    }

    /// Copy the policy to the reference, unless it is a copy of these weights already.
    fn refresh_now(&mut self) {
        if self.ref_of == Some(self.version) {
            return;
        }
        let Some(dev) = &mut self.dev else {
            self.refresh_wanted = true;
            return;
        };
        match dev.refresh_reference() {
            Ok(()) => {
                self.ref_of = Some(self.version);
                self.answered.clear();
                self.submissions = dev.submissions;
            }
            Err(e) => log::error!("refreshing the reference on the device failed: {e}"),
        }
    }
}

/// A future that holds the device for one call: `body` runs with it, and it is handed back.
macro_rules! busy {
    ($dev:ident, $body:expr) => {
        Busy {
            key: 0,
            changes_weights: false,
            future: Box::pin(async move {
                let mut $dev = $dev;
                let answer = $body.await;
                ($dev, answer)
            }),
        }
    };
}

impl Engine for WgslTransformerEngine {
    fn label(&self) -> String {
        format!("WGSL transformer engine (KV cache) on {}", self.name)
    }

    fn sample(&mut self, req: &SampleRequest) -> Result<Samples, EngineError> {
        if req.prompts.is_empty() || req.g == 0 {
            return Ok(Samples::default());
        }
        let prompts = Self::flat(req.prompts);
        let (g, max_len, draw, temperature) =
            (req.g, req.max_len, req.draw(), req.params.temperature);
        let key = key_of(1, &[&prompts], (g, max_len, draw));
        let answer = self.call(key, false, |dev| {
            busy!(dev, async {
                let out = dev
                    .generate(&prompts, g, max_len, &Pick::Sample(draw), temperature, true)
                    .await?;
                Ok(Answer::Samples(Samples {
                    rows: out.rows,
                    closed: out.closed,
                    scores: None,
                    greedy: out.greedy,
                    // log π_old from the logits the rollout sampled from, as the fused engine.
                    logp: Some(out.logp),
                    sampler_logp: None,
                    support: None,
                }))
            })
        })?;
        self.rollout_dispatches = self
            .device()
            .map_or(self.rollout_dispatches, |d| d.last_dispatches);
        match answer {
            Answer::Samples(s) => Ok(s),
            _ => unreachable!("a rollout answers samples"),
        }
    }

    fn greedy(&mut self, prompts: &[&[u32]], max_len: usize) -> Result<Vec<Vec<u32>>, EngineError> {
        let flat = Self::flat(prompts);
        let n = prompts.first().map_or(0, |p| p.len()).max(1);
        let key = key_of(2, &[&flat], max_len);
        let answer = self.call(key, false, |dev| {
            busy!(dev, async {
                let mut out = Vec::with_capacity(flat.len() / n);
                // In chunks whose activations fit a storage buffer of WebGPU's default 128 MiB.
                for chunk in flat.chunks(256 * n) {
                    let generated = dev
                        .generate(chunk, 1, max_len, &Pick::Greedy, 1.0, false)
                        .await?;
                    out.extend(generated.rows);
                }
                Ok(Answer::Rows(out))
            })
        })?;
        match answer {
            Answer::Rows(rows) => Ok(rows),
            _ => unreachable!("greedy answers rows"),
        }
    }

    fn token_logp(
        &mut self,
        which: Which,
        batch: &Batch,
        temperature: f32,
    ) -> Result<Vec<f32>, EngineError> {
        let lens: Vec<u32> = batch.lengths.iter().map(|&l| l as u32).collect();
        let key = key_of(
            3,
            &[&batch.prompts, &batch.responses, &lens],
            (which, batch.g, batch.t, temperature.to_bits(), self.ref_of),
        );
        let batch = batch.clone();
        let answer = self.call(key, false, |dev| {
            busy!(dev, async {
                let (logp, _) = scores_of(&mut dev, which, &batch, temperature).await?;
                Ok(Answer::Logp(logp))
            })
        })?;
        match answer {
            Answer::Logp(logp) => Ok(logp),
            _ => unreachable!("log π answers log π"),
        }
    }

    fn step(&mut self, batch: &Batch, req: &StepRequest) -> Result<StepOutput, EngineError> {
        let lens: Vec<u32> = batch.lengths.iter().map(|&l| l as u32).collect();
        let adv = req.token_advantages.unwrap_or(req.advantages).to_vec();
        let key = key_of(
            4,
            &[
                &batch.responses,
                &lens,
                &f32_words(&adv),
                &f32_words(req.old_logp),
                &[self.version as u32],
            ],
            (
                req.loss,
                req.temperature.to_bits(),
                req.lr.to_bits(),
                req.max_grad_norm.to_bits(),
            ),
        );
        let (batch, req_loss) = (batch.clone(), req.loss);
        let (old, reference) = (req.old_logp.to_vec(), req.ref_logp.to_vec());
        let sampler = req.sampler_logp.map(|s| s.to_vec());
        let (temperature, lr, max_norm, logp_rows) =
            (req.temperature, req.lr, req.max_grad_norm, req.logp_rows);
        // The objective's buffers go with the step and come back with its answer.
        let mut terms = std::mem::take(&mut self.terms);
        let answer = self.call(key, true, |dev| {
            busy!(dev, async {
                let b = &batch;
                let (mut logp, mut entropy) =
                    scores_of(&mut dev, Which::Policy, b, temperature).await?;
                let inputs = TokenInputs {
                    logp: &logp,
                    old_logp: &old,
                    ref_logp: &reference,
                    sampler_logp: sampler.as_deref(),
                    advantages: &adv,
                    mask: &b.mask,
                    entropy: Some(&entropy),
                    t: b.t,
                };
                loss::evaluate(&req_loss, &inputs, &mut terms);
                let dentropy = (req_loss.entropy_coef != 0.0).then_some(&terms.dentropy[..]);
                // Weights stay as they were when the loss is not finite (the trainer then stops).
                let grad_norm = if StepScalars::of(&terms, 0.0).loss.is_finite() {
                    dev.step(&terms.dlogp, dentropy, lr, max_norm).await?
                } else {
                    let grad = dev.gradient(&terms.dlogp, dentropy).await?;
                    grad.iter().map(|g| (g * g) as f64).sum::<f64>().sqrt() as f32
                };
                let scalars = StepScalars::of(&terms, grad_norm);
                // As the fused engine: whole groups, the first ⌈rows/G⌉ prompts' responses.
                let logged = logp_rows.div_ceil(b.g.max(1)).min(b.b);
                logp.truncate(logged * b.g * b.t);
                entropy.truncate(logp.len());
                let out = StepOutput {
                    scalars,
                    logp,
                    entropy,
                };
                Ok(Answer::Step(out, terms))
            })
        });
        self.step_dispatches = self
            .device()
            .map_or(self.step_dispatches, |d| d.last_dispatches);
        match answer? {
            Answer::Step(out, terms) => {
                self.terms = terms;
                Ok(out)
            }
            _ => unreachable!("a step answers its output"),
        }
    }

    fn supervised(&mut self, batches: &[Batch], lr: f64) -> Result<f32, EngineError> {
        let mut words: Vec<&[u32]> = Vec::new();
        for b in batches {
            words.extend([&b.prompts[..], &b.responses[..]]);
        }
        let key = key_of(5, &words, (lr.to_bits(), batches.len()));
        let batches = batches.to_vec();
        let answer = self.call(key, true, |dev| {
            busy!(dev, async {
                let views: Vec<(&[u32], &[u32], usize)> = batches
                    .iter()
                    .map(|b| (b.prompts.as_slice(), b.responses.as_slice(), b.t))
                    .collect();
                Ok(Answer::Loss(dev.supervised(&views, lr).await?))
            })
        })?;
        match answer {
            Answer::Loss(l) => Ok(l),
            _ => unreachable!("the cold start answers its loss"),
        }
    }

    fn refresh_reference(&mut self) {
        self.refresh_now();
    }

    fn flat_weights(&self) -> Vec<f32> {
        match self.device().and_then(|d| d.read_model(1)) {
            Ok(w) => w,
            Err(e) => {
                log::error!("reading the weights back failed: {e}");
                Vec::new()
            }
        }
    }

    fn snapshot(&self) -> Result<Snapshot, EngineError> {
        let dev = self.device()?;
        let p = dev.params();
        let all = dev.read_model(4)?;
        let device = Device::flex();
        let mut adam = dev.adam_time().to_le_bytes().to_vec();
        adam.extend(all[2 * p..].iter().flat_map(|x| x.to_le_bytes()));
        fused_snapshot(
            &Self::burn_policy(dev.shape, &all[..p], &device),
            &Self::burn_policy(dev.shape, &all[p..2 * p], &device),
            adam,
        )
    }

    fn restore(&mut self, snapshot: &Snapshot) -> Result<(), EngineError> {
        let dev = self.dev.as_mut().ok_or(EngineError::Pending)?;
        let p = dev.params();
        let template = Self::burn_policy(dev.shape, &vec![0.0; p], &Device::flex());
        let (policy, reference, adam) = fused_restore(snapshot, template)?;
        if adam.len() != 4 + 8 * p {
            return Err(EngineError::Snapshot(format!(
                "fused_adam.bin holds {} bytes, expected {} for this model",
                adam.len(),
                4 + 8 * p
            )));
        }
        let time = i32::from_le_bytes(adam[..4].try_into().expect("4 bytes"));
        let moments = f32s(&adam[4..]);
        dev.load(
            &flat_params(&policy),
            &flat_params(&reference),
            (time, &moments[..p], &moments[p..]),
        )?;
        self.version += 1;
        self.ref_of = None;
        self.answered.clear();
        Ok(())
    }

    fn supports(&self, config: &RunConfig) -> bool {
        Self::uncovered(config).is_none()
    }

    fn device_counts(&self) -> Option<DeviceCounts> {
        Some(DeviceCounts {
            submissions: self.submissions,
            dispatches_per_step: self.step_dispatches,
            dispatches_per_rollout: self.rollout_dispatches,
        })
    }
}
