//! The transformer's fused CPU engine: the step, the supervised cold start and the
//! teacher-forced scoring of [`super::fused_transformer`] (forward, loss, backward and Adam by
//! hand over plain buffers), rollouts and greedy evaluation with a KV cache, `log π_old` from
//! the logits the rollout sampled from. Burn is used only to draw the initial weights (the
//! same seeded stream as burn's path) and to write checkpoints in burn's format.

use super::autodiff::{flat_params, fused_restore, fused_snapshot};
use super::fused_transformer::{FusedTransformer, Hyper, Pick, StepInput, StepSettings};
use super::{
    Batch, Engine, EngineError, SampleRequest, Samples, Snapshot, StepOutput, StepRequest, Which,
};
use crate::config::{ModelKind, RunConfig};
use crate::model::{Policy, TransformerPolicy, TransformerShape, transformer_shape};
use burn::tensor::Device;

pub struct FusedTransformerEngine {
    policy: FusedTransformer,
    /// The reference's flat weights.
    reference: Vec<f32>,
}

impl FusedTransformerEngine {
    /// Whether this engine computes exactly what burn's step computes for `c`: the
    /// transformer without the bug gallery's switches (those stay on burn's path).
    pub fn covers(c: &RunConfig) -> bool {
        c.model.kind == ModelKind::Transformer && !c.algorithm.bugs.any()
    }

    pub fn new(c: &RunConfig) -> Self {
        let shape = transformer_shape(c);
        let device = Device::flex();
        let init = TransformerPolicy::new(shape, c.model.init_scale, c.run.seed, &device);
        let w = flat_params(&Policy::Transformer(init));
        let o = &c.optimizer;
        let hyper = Hyper {
            beta1: o.beta1 as f32,
            beta2: o.beta2 as f32,
            eps: o.eps as f32,
        };
        Self {
            reference: w.clone(),
            policy: FusedTransformer::new(shape, c.task.n, w, hyper).with_threads(c.run.threads),
        }
    }

    fn shape(&self) -> TransformerShape {
        self.policy.shape
    }

    fn burn_policy(&self, w: &[f32], device: &Device) -> Policy {
        Policy::Transformer(TransformerPolicy::from_flat(self.shape(), w, device))
    }

    fn flat(prompts: &[&[u32]]) -> Vec<u32> {
        prompts.iter().flat_map(|p| p.iter().copied()).collect()
    }
}

impl Engine for FusedTransformerEngine {
    fn label(&self) -> String {
        match self.policy.threads() {
            1 => "fused CPU transformer step (KV cache)".into(),
            n => format!("fused CPU transformer step (KV cache, {n} threads)"),
        }
    }

    fn sample(&mut self, req: &SampleRequest) -> Result<Samples, EngineError> {
        let generated = self.policy.generate(
            &Self::flat(req.prompts),
            req.g,
            req.max_len,
            &Pick::Sample(req.draw()),
            req.params.temperature,
            true,
        );
        Ok(Samples {
            rows: generated.rows,
            closed: generated.closed,
            scores: None,
            greedy: generated.greedy,
            // The rollout sampled from these very logits: log π_old comes from them — unless
            // the learner renormalises over the sampler's support (the trainer scores the
            // batch with it).
            logp: Some(generated.logp).filter(|_| generated.support.is_none()),
            sampler_logp: generated.sampler_logp,
            support: generated.support,
        })
    }

    fn greedy(&mut self, prompts: &[&[u32]], max_len: usize) -> Result<Vec<Vec<u32>>, EngineError> {
        let mut out = Vec::with_capacity(prompts.len());
        for chunk in prompts.chunks(1024) {
            let generated =
                self.policy
                    .generate(&Self::flat(chunk), 1, max_len, &Pick::Greedy, 1.0, false);
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
        let w = match which {
            Which::Policy => None,
            Which::Reference => Some(std::mem::take(&mut self.reference)),
        };
        // Positions after a row's end are masked everywhere they are read: not computed.
        let out = self.policy.batch_logp(w.as_deref(), batch, temperature);
        if let Some(w) = w {
            self.reference = w;
        }
        Ok(out)
    }

    fn step(&mut self, batch: &Batch, req: &StepRequest) -> Result<StepOutput, EngineError> {
        let (scalars, mut logp) = self.policy.step(
            &StepInput {
                prompts: &batch.prompts,
                responses: &batch.responses,
                mask: &batch.mask,
                g: batch.g,
                t: batch.t,
                advantages: req.advantages,
                token_advantages: req.token_advantages,
                old_logp: req.old_logp,
                ref_logp: req.ref_logp,
                sampler_logp: req.sampler_logp,
                support: batch.support.as_deref(),
            },
            &StepSettings {
                loss: req.loss,
                temperature: req.temperature,
                lr: req.lr,
                max_grad_norm: req.max_grad_norm,
                entropy_dynamics: req.entropy_dynamics,
            },
        );
        // burn's path returns whole groups: the first ⌈rows/G⌉ prompts' responses.
        let logged = req.logp_rows.div_ceil(batch.g.max(1)).min(batch.b);
        logp.truncate(logged * batch.g * batch.t);
        let entropy = self.policy.token_entropy();
        let entropy = entropy[..logp.len().min(entropy.len())].to_vec();
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
        Ok(self.policy.supervised(&views, lr))
    }

    fn refresh_reference(&mut self) {
        self.reference.clone_from(&self.policy.w);
    }

    fn flat_weights(&self) -> Vec<f32> {
        self.policy.w.clone()
    }

    fn snapshot(&self) -> Result<Snapshot, EngineError> {
        let device = Device::flex();
        fused_snapshot(
            &self.burn_policy(&self.policy.w, &device),
            &self.burn_policy(&self.reference, &device),
            self.policy.adam_bytes(),
        )
    }

    fn restore(&mut self, snapshot: &Snapshot) -> Result<(), EngineError> {
        let template = self.burn_policy(&self.policy.w, &Device::flex());
        let (policy, reference, adam) = fused_restore(snapshot, template)?;
        self.policy
            .load_adam_bytes(adam)
            .map_err(EngineError::Snapshot)?;
        self.policy.w = flat_params(&policy);
        self.reference = flat_params(&reference);
        Ok(())
    }

    fn supports(&self, config: &RunConfig) -> bool {
        Self::covers(config)
    }

    fn threads(&self) -> usize {
        self.policy.threads()
    }

    fn cores(&self) -> super::cores::Cores {
        self.policy.cores().clone()
    }
}
