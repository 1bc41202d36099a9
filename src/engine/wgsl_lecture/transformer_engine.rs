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
    dev: WgslTransformer,
    name: String,
    terms: TokenTerms,
    /// Dispatches of the last step and the last rollout.
    step_dispatches: usize,
    rollout_dispatches: usize,
}

impl WgslTransformerEngine {
    /// Why a config is not this engine's, in words (`None`: it is).
    pub fn uncovered(c: &RunConfig) -> Option<&'static str> {
        if c.model.kind != ModelKind::Transformer {
            Some("it trains the transformer only")
        } else if cfg!(target_arch = "wasm32") {
            Some(
                "in a browser: its steps read log π back to the host mid-step and wait for it, which a page cannot do (the lecture engine's asynchronous whole iteration is not written for the transformer yet)",
            )
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
        Ok(Self {
            dev: WgslTransformer::new(ctx, shape, c.task.n, &w, hyper)?,
            name,
            terms: TokenTerms::default(),
            step_dispatches: 0,
            rollout_dispatches: 0,
        })
    }

    fn shape(&self) -> TransformerShape {
        self.dev.shape
    }

    fn burn_policy(&self, w: &[f32], device: &Device) -> Policy {
        Policy::Transformer(TransformerPolicy::from_flat(self.shape(), w, device))
    }

    fn flat(prompts: &[&[u32]]) -> Vec<u32> {
        prompts.iter().flat_map(|p| p.iter().copied()).collect()
    }
}

impl Engine for WgslTransformerEngine {
    fn label(&self) -> String {
        format!("WGSL transformer engine (KV cache) on {}", self.name)
    }

    fn sample(&mut self, req: &SampleRequest) -> Result<Samples, EngineError> {
        if req.prompts.is_empty() || req.g == 0 {
            return Ok(Samples::default());
        }
        let out = self.dev.generate(
            &Self::flat(req.prompts),
            req.g,
            req.max_len,
            &Pick::Sample(req.draw()),
            req.params.temperature,
            true,
        )?;
        self.rollout_dispatches = self.dev.last_dispatches;
        Ok(Samples {
            rows: out.rows,
            closed: out.closed,
            scores: None,
            greedy: out.greedy,
            // log π_old from the logits the rollout sampled from, as the fused engine.
            logp: Some(out.logp),
            sampler_logp: None,
            support: None,
        })
    }

    fn greedy(&mut self, prompts: &[&[u32]], max_len: usize) -> Result<Vec<Vec<u32>>, EngineError> {
        let mut out = Vec::with_capacity(prompts.len());
        // In chunks whose activations fit a storage buffer of WebGPU's default 128 MiB.
        for chunk in prompts.chunks(256) {
            let generated =
                self.dev
                    .generate(&Self::flat(chunk), 1, max_len, &Pick::Greedy, 1.0, false)?;
            out.extend(generated.rows);
        }
        Ok(out)
    }

    fn token_logp(
        &mut self,
        which: Which,
        batch: &Batch,
        temperature: f32,
    ) -> Result<Vec<f32>, EngineError> {
        let (logp, _) = self.dev.scores(
            which,
            &batch.prompts,
            &batch.responses,
            &batch.lengths,
            batch.g,
            batch.t,
            temperature,
        )?;
        Ok(logp)
    }

    fn step(&mut self, batch: &Batch, req: &StepRequest) -> Result<StepOutput, EngineError> {
        let (mut logp, mut entropy) = self.dev.scores(
            Which::Policy,
            &batch.prompts,
            &batch.responses,
            &batch.lengths,
            batch.g,
            batch.t,
            req.temperature,
        )?;
        let inputs = TokenInputs {
            logp: &logp,
            old_logp: req.old_logp,
            ref_logp: req.ref_logp,
            sampler_logp: req.sampler_logp,
            advantages: req.token_advantages.unwrap_or(req.advantages),
            mask: &batch.mask,
            entropy: Some(&entropy),
            t: batch.t,
        };
        let mut terms = std::mem::take(&mut self.terms);
        loss::evaluate(&req.loss, &inputs, &mut terms);
        let dentropy = (req.loss.entropy_coef != 0.0).then_some(&terms.dentropy[..]);
        // Weights stay as they were when the loss is not finite (the trainer then stops).
        let grad_norm = if StepScalars::of(&terms, 0.0).loss.is_finite() {
            self.dev
                .step(&terms.dlogp, dentropy, req.lr, req.max_grad_norm)?
        } else {
            let grad = self.dev.gradient(&terms.dlogp, dentropy)?;
            grad.iter().map(|g| (g * g) as f64).sum::<f64>().sqrt() as f32
        };
        self.step_dispatches = self.dev.last_dispatches;
        let scalars = StepScalars::of(&terms, grad_norm);
        self.terms = terms;
        // As the fused engine: whole groups, the first ⌈rows/G⌉ prompts' responses.
        let logged = req.logp_rows.div_ceil(batch.g.max(1)).min(batch.b);
        logp.truncate(logged * batch.g * batch.t);
        entropy.truncate(logp.len());
        Ok(StepOutput {
            scalars,
            logp,
            entropy,
        })
    }

    fn supervised(&mut self, batches: &[Batch], lr: f64) -> Result<f32, EngineError> {
        let views: Vec<(&[u32], &[u32], usize)> = batches
            .iter()
            .map(|b| (b.prompts.as_slice(), b.responses.as_slice(), b.t))
            .collect();
        self.dev.supervised(&views, lr)
    }

    fn refresh_reference(&mut self) {
        if let Err(e) = self.dev.refresh_reference() {
            log::error!("refreshing the reference on the device failed: {e}");
        }
    }

    fn flat_weights(&self) -> Vec<f32> {
        match self.dev.read_model(1) {
            Ok(w) => w,
            Err(e) => {
                log::error!("reading the weights back failed: {e}");
                Vec::new()
            }
        }
    }

    fn snapshot(&self) -> Result<Snapshot, EngineError> {
        let p = self.dev.params();
        let all = self.dev.read_model(4)?;
        let device = Device::flex();
        let mut adam = self.dev.adam_time().to_le_bytes().to_vec();
        adam.extend(all[2 * p..].iter().flat_map(|x| x.to_le_bytes()));
        fused_snapshot(
            &self.burn_policy(&all[..p], &device),
            &self.burn_policy(&all[p..2 * p], &device),
            adam,
        )
    }

    fn restore(&mut self, snapshot: &Snapshot) -> Result<(), EngineError> {
        let p = self.dev.params();
        let template = self.burn_policy(&vec![0.0; p], &Device::flex());
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
        self.dev.load(
            &flat_params(&policy),
            &flat_params(&reference),
            (time, &moments[..p], &moments[p..]),
        )
    }

    fn supports(&self, config: &RunConfig) -> bool {
        Self::uncovered(config).is_none()
    }

    fn device_counts(&self) -> Option<DeviceCounts> {
        Some(DeviceCounts {
            submissions: self.dev.submissions,
            dispatches_per_step: self.step_dispatches,
            dispatches_per_rollout: self.rollout_dispatches,
        })
    }
}
