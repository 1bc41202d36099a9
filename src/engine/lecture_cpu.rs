//! The lecture model's fused CPU engine: the step of [`super::fused_lecture`] (forward, loss,
//! backward and Adam by hand over plain buffers), sampling from the same forward, `log π_old`
//! from the logits the rollout sampled from. No burn tensors in the loop; burn is used only
//! for the supervised cold start and to write checkpoints in burn's format.

use super::autodiff::{fused_restore, fused_snapshot, supervised_steps};
use super::cores::ROWS_SPAN;
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
    /// The last rollout's rows, given back by the trainer ([`Engine::recycle_rows`]): the next
    /// rollout of as many rows writes its tokens into them.
    spare_rows: Vec<Vec<u32>>,
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
            spare_rows: Vec::new(),
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

    /// `tokens [rows·n]` as a row per response, by spans of [`ROWS_SPAN`] on the threads:
    /// written into the last rollout's rows where the trainer gave back as many, else new ones
    /// (a rollout's thousands of small allocations, and as many `free`s after it).
    fn rows(&mut self, tokens: &[u32], n: usize) -> Vec<Vec<u32>> {
        let cores = self.policy.cores();
        let count = tokens.len() / n.max(1);
        if self.spare_rows.len() != count || n == 0 {
            return cores.map_spans(tokens, ROWS_SPAN * n, |t| {
                t.chunks(n).map(<[u32]>::to_vec).collect()
            });
        }
        let mut rows = std::mem::take(&mut self.spare_rows);
        let mut spans: Vec<(&mut [Vec<u32>], &[u32])> = rows
            .chunks_mut(ROWS_SPAN)
            .zip(tokens.chunks(ROWS_SPAN * n))
            .collect();
        cores.each(&mut spans, |_, (rows, tokens)| {
            for (row, t) in rows.iter_mut().zip(tokens.chunks(n)) {
                row.clear();
                row.extend_from_slice(t);
            }
        });
        rows
    }
}

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
        self.policy.pass_forward(&flat);
        let logits = self.policy.pass_logits();
        // The sampler's view of the logits (bf16 when the mismatch lab asks), and its log π.
        let plain = req.sampler == super::SamplerSide::default();
        let drawn = match plain {
            // The draws by parts on the threads (the same draws).
            true => super::Drawn {
                tokens: self
                    .policy
                    .sample(logits, g, req.params, (req.seed, req.stream)),
                sampler_logp: None,
                support: None,
            },
            false => super::draw_lecture(logits, (b, n, v, g), req),
        };
        let greedy = greedy_rows(self.policy.cores(), logits, n, v);
        // The rollout sampled from these very logits (same weights, same forward): log π_old
        // comes from them, with the step's own arithmetic — unless the learner renormalises
        // over the sampler's support (then the trainer scores the batch with it).
        let logp = drawn.support.is_none().then(|| {
            (self.policy).pass_logp(&flat, &drawn.tokens, req.params.temperature, None, true)
        });
        Ok(Samples {
            rows: self.rows(&drawn.tokens, n),
            closed: vec![true; b * g],
            scores: None,
            greedy: Some(greedy),
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
            self.policy.pass_forward(&Self::flat(chunk));
            let logits = self.policy.pass_logits();
            out.extend(greedy_rows(self.policy.cores(), logits, n, v));
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
            Which::Policy => &mut self.policy,
            Which::Reference => &mut self.reference,
        };
        let support = batch.support.as_deref();
        Ok(f.pass_logp(
            &batch.prompts,
            &batch.responses,
            temperature,
            support,
            false,
        ))
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

    fn recycle_rows(&mut self, rows: Vec<Vec<u32>>) {
        let old = std::mem::replace(&mut self.spare_rows, rows);
        self.policy.cores().drop_spread(old, ROWS_SPAN);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::Batch;

    /// Rollouts written into the rows the trainer gave back, and the scoring passes in the
    /// kept buffers, between rollouts of another shape: what a new engine gives, bit for bit.
    #[test]
    fn recycled_rows_and_kept_pass_buffers_give_what_new_ones_do() {
        let mut c = RunConfig::preset("scaled").unwrap();
        c.run.threads = 2;
        let (n, v) = (c.task.n, c.task.vocab as u32);
        let all: Vec<Vec<u32>> = (0..256u32)
            .map(|i| (0..n as u32).map(|k| (i * 7 + k * 3) % v).collect())
            .collect();
        let mut kept = FusedLectureEngine::new(&c);
        let mut given_back: Option<*const u32> = None;
        let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        for (round, (b, g)) in [(256, 16), (256, 16), (64, 4), (256, 16), (256, 16)]
            .into_iter()
            .enumerate()
        {
            let prompts: Vec<&[u32]> = all[..b].iter().map(|p| p.as_slice()).collect();
            let req = SampleRequest {
                prompts: &prompts,
                g,
                max_len: n,
                params: sampling::SamplingParams::of(&c.sampling),
                seed: 3,
                stream: round as u32,
                sampler: Default::default(),
                verify: None,
            };
            let mut new = FusedLectureEngine::new(&c);
            let (ours, theirs) = (kept.sample(&req).unwrap(), new.sample(&req).unwrap());
            assert_eq!(ours.rows, theirs.rows, "round {round}");
            assert_eq!(
                bits(ours.logp.as_ref().unwrap()),
                bits(theirs.logp.as_ref().unwrap())
            );
            assert_eq!(ours.greedy, theirs.greedy);
            // A round after one of the same shape wrote into the rows given back.
            let reused = given_back == Some(ours.rows[300.min(b * g - 1)].as_ptr());
            assert_eq!(reused, round == 1 || round == 4, "round {round}");
            let flat: Vec<u32> = prompts.concat();
            let batch = Batch::padded(flat, n, &ours.rows, g, v);
            // Against the passes with buffers of their own.
            let (x, y) = (&batch.prompts, &batch.responses);
            for (which, f) in [
                (Which::Reference, &new.reference),
                (Which::Policy, &new.policy),
            ] {
                let a = kept.token_logp(which, &batch, 0.7).unwrap();
                assert_eq!(bits(&a), bits(&f.token_logp(x, y, 0.7, None)));
            }
            let old = new.policy.token_logp(x, y, req.params.temperature, None);
            assert_eq!(bits(ours.logp.as_ref().unwrap()), bits(&old));
            assert_eq!(
                kept.greedy(&prompts, n).unwrap(),
                new.greedy(&prompts, n).unwrap()
            );
            // Rows the trainer changed are written whole all the same.
            let mut rows = ours.rows;
            rows[0].clear();
            rows[1].push(7);
            given_back = Some(rows[300.min(b * g - 1)].as_ptr());
            kept.recycle_rows(rows);
        }
    }
}
