//! The burn autodiff engine: any policy, any config, on any burn backend (wgpu or the CPU).
//! On a wgpu device our WGSL kernels sample (and, for the lecture model, verify and compute
//! advantages) on the same device as burn's tensors.

use super::{
    Advantages, Batch, DeviceScores, Engine, EngineError, SampleRequest, Samples, Snapshot,
    StepOutput, StepRequest, StepScalars, Which,
};
use crate::config::{KernelChoice, RunConfig};
use crate::gpu::Compute;
use crate::gpu::kernels::Kernels;
use crate::model::{LecturePolicy, Policy};
use crate::objective::loss::{self, TokenInputs, TokenTerms};
use crate::objective::sampling;
use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::{AdamConfig, GradientsParams, ModuleOptimizer};
use burn::store::ModuleRecord;
use burn::tensor::{Bytes, Device, Int, Tensor, TensorData};
use std::sync::Arc;

pub struct BurnEngine {
    compute: Compute,
    /// The autodiff device on `compute`.
    device: Device,
    policy: Policy,
    reference: Policy,
    optim: ModuleOptimizer,
    optimizer: crate::config::OptimizerConfig,
    kernels: Option<Arc<Kernels>>,
    vocab: usize,
    /// The objective's per-token buffers, reused across steps.
    terms: TokenTerms,
}

/// Adam as burn's optimizer, from the config's optimizer section.
pub fn adam(o: &crate::config::OptimizerConfig) -> ModuleOptimizer {
    AdamConfig::new()
        .with_beta_1(o.beta1 as f32)
        .with_beta_2(o.beta2 as f32)
        .with_epsilon(o.eps as f32)
        .init()
}

fn prompt_tensor(batch: &Batch, device: &Device) -> Tensor<2, Int> {
    let flat: Vec<i64> = batch.prompts.iter().map(|&x| x as i64).collect();
    Tensor::from_data(TensorData::new(flat, [batch.b, batch.n]), device)
}

fn response_tensor(batch: &Batch, device: &Device) -> Tensor<3, Int> {
    let ids: Vec<i64> = batch.responses.iter().map(|&x| x as i64).collect();
    Tensor::from_data(TensorData::new(ids, [batch.b, batch.g, batch.t]), device)
}

fn f32_tensor<const D: usize>(v: &[f32], shape: [usize; D], device: &Device) -> Tensor<D> {
    Tensor::from_data(TensorData::new(v.to_vec(), shape), device)
}

fn host(x: Tensor<3>) -> Vec<f32> {
    x.into_data().try_to_vec::<f32>().expect("f32")
}

/// `[B, G, T]` log π and entropy, detached, on the host in one read-back.
pub fn read_back(logp: &Tensor<3>, entropy: &Tensor<3>) -> (Vec<f32>, Vec<f32>) {
    let n = logp.shape().num_elements();
    let both = Tensor::cat(
        vec![
            logp.clone().detach().reshape([n]),
            entropy.clone().detach().reshape([n]),
        ],
        0,
    );
    let mut v = both.into_data().try_to_vec::<f32>().expect("f32");
    let entropy = v.split_off(n);
    (v, entropy)
}

/// The surrogate `Σ_t c_t·log π_t + Σ_t e_t·H_t` with the objective's per-token coefficients
/// `c = ∂L/∂log π`, `e = ∂L/∂H` as constants: its gradient is the loss's (its value is not the
/// loss: `terms.loss` is). `logp`, `entropy`: `[B, G, T]` with gradient.
pub fn surrogate(
    logp: Tensor<3>,
    entropy: Tensor<3>,
    terms: &TokenTerms,
    device: &Device,
) -> Tensor<1> {
    let dims = logp.dims();
    let c = f32_tensor(&terms.dlogp, dims, device);
    let pg = logp.mul(c).sum();
    if terms.dentropy.is_empty() {
        pg
    } else {
        pg.add(entropy.mul(f32_tensor(&terms.dentropy, dims, device)).sum())
    }
}

/// Supervised steps on a burn policy (the cold start): `−mean log π(target | prompt)`, a fresh
/// Adam, one step per batch. Returns the policy and the last loss.
pub fn supervised_steps(
    mut policy: Policy,
    batches: &[Batch],
    lr: f64,
    optimizer: &crate::config::OptimizerConfig,
    device: &Device,
) -> (Policy, f32) {
    let mut optim = adam(optimizer);
    let mut last_loss = 0.0f32;
    for (i, batch) in batches.iter().enumerate() {
        let logp = policy.log_probs(
            prompt_tensor(batch, device),
            response_tensor(batch, device),
            1.0,
            None,
        );
        let loss = logp.mean().neg();
        if i + 1 == batches.len() {
            last_loss = loss.clone().into_data().try_to_vec::<f32>().expect("f32")[0];
        }
        let grads = GradientsParams::from_grads(loss.backward(), &policy);
        policy = optim.step(lr, policy.clone(), grads);
    }
    (policy, last_loss)
}

/// Every float parameter of a module, flattened in [`visited`] order except the lecture
/// model's (its own layout: embedding, encode, decode).
pub fn flat_params(policy: &Policy) -> Vec<f32> {
    if let Policy::Lecture(m) = policy {
        let w = m.weights();
        return [w.embedding, w.encode, w.decode].concat();
    }
    visited(policy, None)
}

/// Every float parameter of a module in visiting order — or, with `grads`, each one's
/// gradient there (0 where it has none).
fn visited(policy: &Policy, grads: Option<&GradientsParams>) -> Vec<f32> {
    struct Flat<'a>(Vec<f32>, Option<&'a GradientsParams>);
    impl ModuleVisitor for Flat<'_> {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
            let value = match self.1 {
                None => Some(p.val()),
                Some(g) => g.get::<D>(p.id),
            };
            match value {
                Some(x) => self.0.extend(x.into_data().iter::<f32>()),
                None => {
                    let n = p.val().shape().num_elements();
                    self.0.extend(std::iter::repeat_n(0.0, n));
                }
            }
        }
    }
    let mut f = Flat(Vec::new(), grads);
    policy.visit(&mut f);
    f.0
}

/// A module as burnpack bytes, and back.
pub fn policy_bytes(policy: &Policy) -> Result<Vec<u8>, EngineError> {
    let bytes = policy
        .clone()
        .into_record()
        .into_bytes()
        .map_err(|e| EngineError::Snapshot(e.to_string()))?;
    Ok(bytes.to_vec())
}

pub fn load_policy(template: Policy, bytes: &[u8]) -> Result<Policy, EngineError> {
    let record = ModuleRecord::from_bytes(Bytes::from_bytes_vec(bytes.to_vec()))
        .map_err(|e| EngineError::Snapshot(e.to_string()))?;
    template
        .try_load_record(record)
        .map_err(|e| EngineError::Snapshot(e.to_string()))
}

/// The named blob of a snapshot.
pub fn blob<'a>(snapshot: &'a Snapshot, name: &str) -> Option<&'a [u8]> {
    snapshot
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, b)| b.as_slice())
}

/// A fused CPU engine's snapshot: policy and reference in burn's format (so a checkpoint
/// reads the same whichever engine wrote it), and the engine's own Adam state.
pub fn fused_snapshot(
    policy: &Policy,
    reference: &Policy,
    adam: Vec<u8>,
) -> Result<Snapshot, EngineError> {
    Ok(vec![
        ("policy.bpk".into(), policy_bytes(policy)?),
        ("reference.bpk".into(), policy_bytes(reference)?),
        ("fused_adam.bin".into(), adam),
    ])
}

/// A fused CPU engine's snapshot read back into `template`'s shape: (policy, reference, Adam
/// state). One written by burn's path (its optimizer state instead of ours) is refused.
pub fn fused_restore(
    snapshot: &Snapshot,
    template: Policy,
) -> Result<(Policy, Policy, &[u8]), EngineError> {
    if blob(snapshot, "fused_adam.bin").is_none() && blob(snapshot, "optimizer.bpk").is_some() {
        return Err(EngineError::WrittenByBurn);
    }
    let need = |name: &str| {
        blob(snapshot, name).ok_or_else(|| EngineError::Snapshot(format!("{name} is missing")))
    };
    let policy = load_policy(template.clone(), need("policy.bpk")?)?;
    let reference = load_policy(template, need("reference.bpk")?)?;
    Ok((policy, reference, need("fused_adam.bin")?))
}

impl BurnEngine {
    pub fn new(config: &RunConfig, compute: Compute) -> Result<Self, EngineError> {
        let device = compute.device.clone().autodiff();
        let policy = Policy::new(config, &device);
        let reference = policy.snapshot(&device);
        let kernels = match (config.run.kernels, &compute.gpu) {
            (KernelChoice::Reference, _) | (KernelChoice::Auto, None) => None,
            (KernelChoice::Gpu, None) => {
                return Err(EngineError::KernelsNeedWgpu(compute.label.clone()));
            }
            (_, Some(ctx)) => Some(Arc::new(Kernels::new(ctx.clone())?)),
        };
        Ok(Self {
            compute,
            device,
            policy,
            reference,
            optim: adam(&config.optimizer),
            optimizer: config.optimizer.clone(),
            kernels,
            vocab: config.task.vocab,
            terms: TokenTerms::default(),
        })
    }

    /// A burn engine on the CPU backend that continues from another engine's snapshot (its
    /// policy and reference; a fresh Adam where the snapshot has no burn optimizer state).
    pub fn from_snapshot(config: &RunConfig, snapshot: &Snapshot) -> Result<Self, EngineError> {
        let mut e = Self::new(config, Compute::cpu())?;
        e.restore_weights(snapshot)?;
        if let Some(bytes) = blob(snapshot, "optimizer.bpk") {
            e.restore_optimizer(bytes)?;
        }
        Ok(e)
    }

    /// `∇θ` of the batch's mean token entropy (a forward and a backward of its own) in
    /// [`visited`] order.
    fn entropy_gradient(&self, batch: &Batch, temperature: f32) -> Vec<f32> {
        let d = &self.device;
        let (_, entropy) = self.policy.score(
            prompt_tensor(batch, d),
            response_tensor(batch, d),
            temperature,
            batch.support.as_deref(),
        );
        let m = &batch.mask;
        let count = crate::objective::numeric::masked_sum_f64(m, &vec![1.0; m.len()]).max(1.0);
        let weights: Vec<f32> = m.iter().map(|&x| (x as f64 / count) as f32).collect();
        let mean = entropy
            .mul(f32_tensor(&weights, [batch.b, batch.g, batch.t], d))
            .sum();
        let grads = GradientsParams::from_grads(mean.backward(), &self.policy);
        visited(&self.policy, Some(&grads))
    }

    fn restore_weights(&mut self, snapshot: &Snapshot) -> Result<(), EngineError> {
        let need = |name: &str| {
            blob(snapshot, name).ok_or_else(|| EngineError::Snapshot(format!("{name} is missing")))
        };
        self.policy = load_policy(self.policy.clone(), need("policy.bpk")?)?;
        self.reference = load_policy(self.reference.clone(), need("reference.bpk")?)?.no_grad();
        Ok(())
    }

    fn restore_optimizer(&mut self, bytes: &[u8]) -> Result<(), EngineError> {
        self.optim = self
            .optim
            .clone()
            .from_bytes(Bytes::from_bytes_vec(bytes.to_vec()))
            .map_err(|e| EngineError::Snapshot(e.to_string()))?;
        Ok(())
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    fn prompts_tensor(&self, prompts: &[&[u32]]) -> Tensor<2, Int> {
        let n = prompts.first().map(|p| p.len()).unwrap_or(0);
        let flat: Vec<i64> = prompts
            .iter()
            .flat_map(|p| p.iter().map(|&x| x as i64))
            .collect();
        Tensor::from_data(TensorData::new(flat, [prompts.len(), n]), &self.device)
    }

    fn lecture_logits(&self, m: &LecturePolicy, prompts: &[&[u32]]) -> Vec<f32> {
        m.forward(self.prompts_tensor(prompts).without_autodiff())
            .to_data()
            .try_to_vec::<f32>()
            .expect("f32 logits")
    }
}

impl BurnEngine {
    /// The lecture model's rollout: every position's logits at once, drawn by the WGSL rollout
    /// kernels (verifying on the device) where there are some, else on the host.
    fn sample_lecture(
        &self,
        m: &LecturePolicy,
        req: &SampleRequest,
    ) -> Result<Samples, EngineError> {
        let (b, g) = (req.prompts.len(), req.g);
        let n = req.max_len;
        let v = self.vocab;
        let logits = self.lecture_logits(m, req.prompts);
        let greedy = Some(
            sampling::argmax_rows(&logits, v)
                .chunks(n)
                .map(|c| c.to_vec())
                .collect(),
        );
        // The WGSL rollout kernels draw from f32 logits and return no sampler log π:
        // the mismatch lab's sampler draws on the host.
        if let (Some(k), Some((weights, with_adv)), false) =
            (&self.kernels, req.verify, req.sampler.any())
        {
            let prompts: Vec<u32> = req.prompts.iter().flat_map(|p| p.iter().copied()).collect();
            let (tokens, score, adv) = k.rollout(
                &logits,
                &prompts,
                (b, n, v, g, n),
                req.params,
                req.seed,
                req.stream,
                weights,
                with_adv,
            )?;
            return Ok(Samples {
                rows: tokens.chunks(n).map(|c| c.to_vec()).collect(),
                closed: vec![true; b * g],
                scores: Some(DeviceScores {
                    exact: score.parts.iter().map(|p| p[3]).collect(),
                    rewards: score.rewards,
                    advantages: adv.map(|a| Advantages {
                        zero_std: a.groups.iter().map(|s| s.zero_std).collect(),
                        by_mode: a.by_mode,
                    }),
                }),
                greedy,
                logp: None,
                sampler_logp: None,
                support: None,
            });
        }
        let drawn = super::draw_lecture(&logits, (b, n, v, g), req);
        Ok(Samples {
            rows: drawn.tokens.chunks(n).map(|c| c.to_vec()).collect(),
            closed: vec![true; b * g],
            scores: None,
            greedy,
            logp: None,
            sampler_logp: drawn.sampler_logp,
            support: drawn.support,
        })
    }
}

impl Engine for BurnEngine {
    fn label(&self) -> String {
        format!("burn autodiff on {}", self.compute.label)
    }

    fn sample(&mut self, req: &SampleRequest) -> Result<Samples, EngineError> {
        let (b, g) = (req.prompts.len(), req.g);
        let frozen = self.policy.valid();
        match &frozen {
            Policy::Lecture(m) => self.sample_lecture(m, req),
            Policy::Transformer(_) => {
                let v = self.vocab + 1;
                let rows_n = b * g;
                let kernels = self.kernels.clone().filter(|_| !req.sampler.any());
                let draw = req.draw();
                let mut trace = super::Trace::default();
                let owned: Vec<Vec<u32>> = req.prompts.iter().map(|p| p.to_vec()).collect();
                let refs: Vec<&Vec<u32>> = owned.iter().collect();
                let generated = frozen.generate(
                    &refs,
                    g,
                    req.max_len,
                    &self.compute.device,
                    |logits, t| -> Result<Vec<u32>, EngineError> {
                        // One draw per row: (row, 0, 0) coordinates under a per-position stream,
                        // so the kernel and the Rust path pick the same tokens. The mismatch
                        // lab's sampler (bf16, its own log π) draws on the host.
                        Ok(match &kernels {
                            Some(k) => {
                                let stream = draw.position_stream(t);
                                k.sample(logits, rows_n, 1, v, 1, draw.params, draw.seed, stream)?
                            }
                            None => super::draw_position(logits, v, t, &draw, &mut trace),
                        })
                    },
                )?;
                let (sampler_logp, support) = trace.finish(&generated.rows, req.sampler);
                Ok(Samples {
                    rows: generated.rows,
                    closed: generated.closed,
                    scores: None,
                    greedy: None,
                    logp: None,
                    sampler_logp,
                    support,
                })
            }
        }
    }

    fn greedy(&mut self, prompts: &[&[u32]], max_len: usize) -> Result<Vec<Vec<u32>>, EngineError> {
        let frozen = self.policy.valid();
        let mut out = Vec::with_capacity(prompts.len());
        // Chunks keep the device buffers small for large held-out sets.
        for chunk in prompts.chunks(1024) {
            match &frozen {
                Policy::Lecture(m) => {
                    let greedy: Vec<u32> = m
                        .forward(self.prompts_tensor(chunk).without_autodiff())
                        .argmax(2)
                        .into_data()
                        .iter::<i64>()
                        .map(|x| x as u32)
                        .collect();
                    out.extend(greedy.chunks(max_len).map(|c| c.to_vec()));
                }
                Policy::Transformer(_) => {
                    let v = self.vocab + 1;
                    let owned: Vec<Vec<u32>> = chunk.iter().map(|p| p.to_vec()).collect();
                    let refs: Vec<&Vec<u32>> = owned.iter().collect();
                    let generated =
                        frozen.generate(&refs, 1, max_len, &self.compute.device, |l, _| {
                            Ok::<_, EngineError>(sampling::argmax_rows(l, v))
                        })?;
                    out.extend(generated.rows);
                }
            }
        }
        Ok(out)
    }

    fn device_advantages(
        &mut self,
        rewards: &[f32],
        g: usize,
    ) -> Option<Result<Advantages, EngineError>> {
        let k = self.kernels.as_ref()?;
        Some(
            k.advantages(rewards, g)
                .map(|out| Advantages {
                    zero_std: out.groups.iter().map(|s| s.zero_std).collect(),
                    by_mode: out.by_mode,
                })
                .map_err(EngineError::from),
        )
    }

    fn token_logp(
        &mut self,
        which: Which,
        batch: &Batch,
        temperature: f32,
    ) -> Result<Vec<f32>, EngineError> {
        let p = match which {
            Which::Policy => &self.policy,
            Which::Reference => &self.reference,
        };
        let inner = self.device.clone();
        let logp = p.valid().log_probs(
            prompt_tensor(batch, &inner).without_autodiff(),
            response_tensor(batch, &inner).without_autodiff(),
            temperature,
            batch.support.as_deref(),
        );
        Ok(host(logp))
    }

    fn step(&mut self, batch: &Batch, req: &StepRequest) -> Result<StepOutput, EngineError> {
        let d = &self.device;
        let (b, g, t) = (batch.b, batch.g, batch.t);
        let (logp, token_entropy) = self.policy.score(
            prompt_tensor(batch, d),
            response_tensor(batch, d),
            req.temperature,
            batch.support.as_deref(),
        ); // [B, G, T], with gradient
        // log π and each token's entropy on the host (one read-back); the objective's value and
        // per-token coefficients from `objective::loss`; the surrogate carries them back.
        let (logp_h, entropy_h) = read_back(&logp, &token_entropy);
        let s = &req.loss;
        let mut terms = std::mem::take(&mut self.terms);
        loss::evaluate(
            s,
            &TokenInputs {
                logp: &logp_h,
                old_logp: req.old_logp,
                ref_logp: req.ref_logp,
                sampler_logp: req.sampler_logp,
                advantages: req.token_advantages.unwrap_or(req.advantages),
                mask: &batch.mask,
                entropy: Some(&entropy_h),
                t,
            },
            &mut terms,
        );
        let surrogate = surrogate(logp, token_entropy, &terms, d);
        let mut grads = GradientsParams::from_grads(surrogate.backward(), &self.policy);
        let grad_norm = self
            .policy
            .grad_norm_sq(&grads, d)
            .into_scalar::<f32>()
            .sqrt();
        let logged = req.logp_rows.div_ceil(g.max(1)).min(b);
        let logp_rows = logp_h[..logged * g * t].to_vec();
        let entropy_rows = entropy_h[..logged * g * t].to_vec();
        let loss = terms.loss as f32;
        let scalars = StepScalars::of(&terms, grad_norm);
        self.terms = terms;
        if !loss.is_finite() || !grad_norm.is_finite() {
            // The trainer stops the run; the weights stay as they were.
            return Ok(StepOutput {
                scalars,
                logp: logp_rows,
                entropy: entropy_rows,
            });
        }
        if req.max_grad_norm > 0.0 && grad_norm > req.max_grad_norm {
            grads = self
                .policy
                .scale_grads(grads, req.max_grad_norm / grad_norm);
        }
        // ∇θ of the mean token entropy and the weights before the update (visiting order),
        // for the first-order change of the step actually taken.
        let dynamics = req.entropy_dynamics.then(|| {
            (
                self.entropy_gradient(batch, req.temperature),
                visited(&self.policy, None),
            )
        });
        self.policy = self.optim.step(req.lr, self.policy.clone(), grads);
        let mut scalars = scalars;
        if let Some((dh, before)) = dynamics {
            let after = visited(&self.policy, None);
            scalars.entropy_first_order =
                Some(crate::objective::entropy_dynamics::first_order(&after, &before, &dh) as f32);
        }
        if req.entropy_dynamics {
            // The same states' entropy after the update (one more forward pass).
            let (_, after) = self.policy.valid().score(
                prompt_tensor(batch, d).without_autodiff(),
                response_tensor(batch, d).without_autodiff(),
                req.temperature,
                batch.support.as_deref(),
            );
            let after = host(after);
            let mask = &batch.mask;
            let count = crate::objective::numeric::masked_sum_f64(mask, &vec![1.0; mask.len()]);
            let mean =
                crate::objective::numeric::masked_sum_f64(mask, &after[..mask.len()]) / count;
            scalars.entropy_measured = Some(mean as f32 - scalars.entropy);
        }
        Ok(StepOutput {
            scalars,
            logp: logp_rows,
            entropy: entropy_rows,
        })
    }

    fn supervised(&mut self, batches: &[Batch], lr: f64) -> Result<f32, EngineError> {
        let (policy, loss) = supervised_steps(
            self.policy.clone(),
            batches,
            lr,
            &self.optimizer,
            &self.device,
        );
        self.policy = policy;
        Ok(loss)
    }

    fn refresh_reference(&mut self) {
        self.reference = self.policy.snapshot(&self.device);
    }

    fn flat_weights(&self) -> Vec<f32> {
        flat_params(&self.policy)
    }

    fn snapshot(&self) -> Result<Snapshot, EngineError> {
        let optim = self
            .optim
            .into_bytes()
            .map_err(|e| EngineError::Snapshot(e.to_string()))?;
        Ok(vec![
            ("policy.bpk".into(), policy_bytes(&self.policy)?),
            ("reference.bpk".into(), policy_bytes(&self.reference)?),
            ("optimizer.bpk".into(), optim.to_vec()),
        ])
    }

    fn restore(&mut self, snapshot: &Snapshot) -> Result<(), EngineError> {
        // A checkpoint of the fused CPU step holds its own Adam state, not burn's: continuing
        // it here would silently restart Adam. Say where it continues instead.
        let optimizer = blob(snapshot, "optimizer.bpk").ok_or_else(|| {
            EngineError::Snapshot(if blob(snapshot, "fused_adam.bin").is_some() {
                "this checkpoint was written by a fused CPU or a WGSL engine (its Adam state is fused_adam.bin), which burn's path cannot continue: resume it with --device cpu, or on a wgpu device with --set run.engine=wgsl".into()
            } else {
                "optimizer.bpk is missing".into()
            })
        })?;
        self.restore_weights(snapshot)?;
        self.restore_optimizer(optimizer)
    }
    fn supports(&self, _config: &RunConfig) -> bool {
        true
    }
}
