//! The lecture model's fused CPU engine: the step of [`super::fused_lecture`] (forward, loss,
//! backward and Adam by hand over plain buffers), sampling from the same forward, `log π_old`
//! from the logits the rollout sampled from. No burn tensors in the loop; burn is used only
//! for the supervised cold start and to write checkpoints in burn's format.

use super::autodiff::{fused_restore, fused_snapshot, supervised_steps};
use super::fused_lecture::FusedLecture;
use super::{
    Batch, Engine, EngineError, SampleRequest, Samples, Snapshot, StepOutput, StepRequest, Which,
};
use crate::config::{OptimizerConfig, RunConfig};
use crate::model::Policy;
use crate::model::lecture::{LecturePolicy, LectureWeights};
use crate::objective::sampling;
use burn::tensor::Device;

pub struct FusedLectureEngine {
    policy: FusedLecture,
    reference: FusedLecture,
    optimizer: OptimizerConfig,
}

impl FusedLectureEngine {
    /// Whether this engine computes exactly what the configured burn step computes.
    pub fn covers(c: &RunConfig) -> bool {
        FusedLecture::supports(c)
    }

    pub fn new(c: &RunConfig) -> Self {
        let (t, m) = (&c.task, &c.model);
        let w = LectureWeights::init(t.vocab, t.n, m.d_model, m.init_scale, c.run.seed);
        let policy = FusedLecture::new(&w, t.vocab, t.n, m.d_model, c).with_threads(c.run.threads);
        Self {
            reference: policy.weights_copy(),
            policy,
            optimizer: c.optimizer.clone(),
        }
    }

    fn burn_policy(f: &FusedLecture, device: &Device) -> Policy {
        Policy::Lecture(LecturePolicy::from_weights(
            &f.weights(),
            f.vocab,
            f.n,
            f.d,
            device,
        ))
    }

    fn set_from(f: &mut FusedLecture, p: &Policy) {
        if let Policy::Lecture(m) = p {
            f.set_weights(&m.weights());
        }
    }

    fn flat(prompts: &[&[u32]]) -> Vec<u32> {
        prompts.iter().flat_map(|p| p.iter().copied()).collect()
    }
}

/// Responses per span when a rollout's rows are cut out on the threads.
const ROWS_SPAN: usize = 512;

/// Prompts per span when their greedy answers are read off the logits on the threads.
const GREEDY_SPAN: usize = 64;

/// The greedy answer to each prompt of `logits [B·n, V]` (`[B]` rows of `n`), by spans of
/// prompts on the threads.
fn greedy_rows(cores: &super::cores::Cores, logits: &[f32], n: usize, v: usize) -> Vec<Vec<u32>> {
    cores.map_spans(logits, GREEDY_SPAN * n * v, |x| {
        (sampling::argmax_rows(x, v).chunks(n))
            .map(<[u32]>::to_vec)
            .collect()
    })
}

impl Engine for FusedLectureEngine {
    fn label(&self) -> String {
        match self.policy.threads() {
            1 => "fused CPU lecture step".into(),
            n => format!("fused CPU lecture step ({n} threads)"),
        }
    }

    fn threads(&self) -> usize {
        self.policy.threads()
    }

    fn cores(&self) -> super::cores::Cores {
        self.policy.cores().clone()
    }

    fn sample(&mut self, req: &SampleRequest) -> Result<Samples, EngineError> {
        let (b, g) = (req.prompts.len(), req.g);
        let (n, v) = (self.policy.n, self.policy.vocab);
        let flat = Self::flat(req.prompts);
        let logits = self.policy.logits(&flat);
        // The sampler's view of the logits (bf16 when the mismatch lab asks), and its log π.
        let plain = req.sampler == super::SamplerSide::default();
        let drawn = match plain {
            // The draws by parts on the threads (the same draws).
            true => super::Drawn {
                tokens: self
                    .policy
                    .sample(&logits, g, req.params, (req.seed, req.stream)),
                sampler_logp: None,
                support: None,
            },
            false => super::draw_lecture(&logits, (b, n, v, g), req),
        };
        // The rollout sampled from these very logits (same weights, same forward): log π_old
        // comes from them, with the step's own arithmetic — unless the learner renormalises
        // over the sampler's support (then the trainer scores the batch with it).
        let logp = drawn.support.is_none().then(|| {
            self.policy.token_logp_from_logits(
                &flat,
                &logits,
                &drawn.tokens,
                req.params.temperature,
                None,
            )
        });
        let cores = self.policy.cores();
        Ok(Samples {
            // A row per response (thousands of small allocations), by spans on the threads.
            rows: cores.map_spans(&drawn.tokens, ROWS_SPAN * n, |t| {
                t.chunks(n).map(<[u32]>::to_vec).collect()
            }),
            closed: vec![true; b * g],
            scores: None,
            greedy: Some(greedy_rows(cores, &logits, n, v)),
            logp,
            sampler_logp: drawn.sampler_logp,
            support: drawn.support,
        })
    }

    fn greedy(
        &mut self,
        prompts: &[&[u32]],
        _max_len: usize,
    ) -> Result<Vec<Vec<u32>>, EngineError> {
        let (n, v) = (self.policy.n, self.policy.vocab);
        let mut out = Vec::with_capacity(prompts.len());
        for chunk in prompts.chunks(1024) {
            let logits = self.policy.logits(&Self::flat(chunk));
            out.extend(greedy_rows(self.policy.cores(), &logits, n, v));
        }
        Ok(out)
    }

    fn token_logp(
        &mut self,
        which: Which,
        batch: &Batch,
        temperature: f32,
    ) -> Result<Vec<f32>, EngineError> {
        let f = match which {
            Which::Policy => &self.policy,
            Which::Reference => &self.reference,
        };
        let support = batch.support.as_deref();
        Ok(f.token_logp(&batch.prompts, &batch.responses, temperature, support))
    }

    fn step(&mut self, batch: &Batch, req: &StepRequest) -> Result<StepOutput, EngineError> {
        self.policy.entropy_dynamics = req.entropy_dynamics;
        let (scalars, mut logp) = self.policy.step(
            &batch.prompts,
            &batch.responses,
            req.advantages,
            req.token_advantages,
            req.old_logp,
            req.ref_logp,
            req.sampler_logp,
            batch.support.as_deref(),
            &req.loss,
            req.temperature,
            req.lr,
            req.max_grad_norm,
        );
        logp.truncate(req.logp_rows * batch.t);
        let entropy = self
            .policy
            .token_entropy(batch.g, (logp.len() / batch.t.max(1)).min(req.entropy_rows));
        Ok(StepOutput {
            scalars,
            logp,
            entropy,
        })
    }

    fn supervised(&mut self, batches: &[Batch], lr: f64) -> Result<f32, EngineError> {
        // The cold start runs through burn's autodiff on the CPU (it is a handful of steps);
        // the fused weights then continue from its result.
        let device = Device::flex().autodiff();
        let (trained, loss) = supervised_steps(
            Self::burn_policy(&self.policy, &device),
            batches,
            lr,
            &self.optimizer,
            &device,
        );
        Self::set_from(&mut self.policy, &trained);
        Ok(loss)
    }

    fn refresh_reference(&mut self) {
        self.reference = self.policy.weights_copy();
    }

    fn flat_weights(&self) -> Vec<f32> {
        let w = self.policy.weights();
        [w.embedding, w.encode, w.decode].concat()
    }

    fn snapshot(&self) -> Result<Snapshot, EngineError> {
        let device = Device::flex();
        fused_snapshot(
            &Self::burn_policy(&self.policy, &device),
            &Self::burn_policy(&self.reference, &device),
            self.policy.adam_bytes(),
        )
    }

    fn restore(&mut self, snapshot: &Snapshot) -> Result<(), EngineError> {
        let template = Self::burn_policy(&self.policy, &Device::flex());
        let (policy, reference, adam) = fused_restore(snapshot, template)?;
        Self::set_from(&mut self.policy, &policy);
        Self::set_from(&mut self.reference, &reference);
        self.policy
            .load_adam_bytes(adam)
            .map_err(EngineError::Snapshot)?;
        Ok(())
    }

    fn supports(&self, config: &RunConfig) -> bool {
        Self::covers(config)
    }
}
