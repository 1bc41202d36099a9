//! The rollout's dispatches and the whole iteration in one submission (rollout, verifier,
//! advantages, μ steps), with their read-backs.

use super::*;

impl WgslLectureEngine {
    /// The rollout's dispatches (the policy's forward, sampling, log π_old, the greedy answers,
    /// the reference's forward and log π_ref) and, with `verify`, the verifier and the
    /// advantage kernels on the sampled tokens; the read-backs [`Self::take_rollout`] parses.
    pub(super) fn record_rollout(
        &mut self,
        req: &SampleRequest,
        verify: Option<([f32; 3], bool)>,
    ) -> Result<Rollout, EngineError> {
        let (b, g, n, v) = (req.prompts.len(), req.g, self.n, self.vocab);
        let t = req.params.temperature;
        let prompts = self.rollout_prompts(req)?;
        self.plan(b, g)?;
        let plan = self.plan.take().expect("planned");
        let l = plan.layout;
        let mut dp = std::mem::take(&mut self.dev_prompts);
        self.sync_ints(&plan, &mut dp, &prompts, l.i_prompts);
        self.dev_prompts = dp;
        let words = sample_words(req, [b, g, n, v]);
        self.ctx
            .queue
            .write_buffer(&plan.sample_params, 0, &u32_bytes(&words));
        let (work, ints, sample_logits, sample_tokens, sample_group) = (
            plan.work.clone(),
            plan.ints.clone(),
            plan.sample_logits.clone(),
            plan.sample_tokens.clone(),
            plan.sample_group.clone(),
        );
        self.plan = Some(plan);
        let mut base = self.base_params(&l);
        base.inv_t = 1.0 / t;
        let (rows, tokens) = (b * n, b * g * n);
        let mut rec = Recorder::default();
        // π_old: forward, sample (sample.wgsl reads its own copy of the logits), log π_old
        // and the greedy answers.
        self.record_forward(&mut rec, &base, 0);
        rec.ops.push(Op::Copy {
            src: work.clone(),
            src_off: (l.logits * 4) as u64,
            dst: sample_logits,
            dst_off: 0,
            bytes: (rows * v * 4) as u64,
        });
        let p = &self.programs;
        rec.ops.push(Op::Sample {
            pipeline: p.row_weights.clone(),
            grid: grid_1d(rows),
            group: sample_group.clone(),
        });
        rec.ops.push(Op::Sample {
            pipeline: p.draw.clone(),
            grid: grid_1d(tokens),
            group: sample_group,
        });
        rec.dispatches += 2;
        rec.ops.push(Op::Copy {
            src: sample_tokens.clone(),
            src_off: 0,
            dst: ints,
            dst_off: (l.i_tokens * 4) as u64,
            bytes: (tokens * 4) as u64,
        });
        rec.step(p, "row_stats", base, rows);
        rec.step(
            p,
            "gather_logp",
            StepParams {
                out_off: l.old as u32,
                ..base
            },
            tokens,
        );
        rec.step(p, "argmax", base, rows);
        // π_ref on the same tokens.
        self.record_logp_of(&mut rec, &base, self.params, l.rf, [rows, tokens]);
        let mut reads = vec![
            (Reads::Ints, l.i_tokens, tokens),
            (Reads::Ints, l.i_greedy, rows),
            (Reads::Work, l.old, tokens),
            (Reads::Work, l.rf, tokens),
        ];
        // Verify (sort_reward.wgsl) and every advantage mode (advantage.wgsl) on the sampled
        // tokens, in a command buffer of the same submission.
        let advantages = match verify {
            Some(v) => {
                self.record_verify(&mut rec, &mut reads, &prompts, &sample_tokens, [b, g], v)?
            }
            None => None,
        };
        self.rollout_dispatches = rec.dispatches;
        Ok(Rollout {
            rec,
            reads,
            b,
            g,
            verified: verify.map(|(_, a)| a),
            advantages,
            temperature: t,
        })
    }

    /// The forward pass of the weights at `w` (0: the policy; `self.params`: the reference),
    /// its row statistics and `log π` of the sampled tokens into `out`.
    fn record_logp_of(
        &self,
        rec: &mut Recorder,
        base: &StepParams,
        w: usize,
        out: usize,
        [rows, tokens]: [usize; 2],
    ) {
        self.record_forward(rec, base, w);
        let p = &self.programs;
        rec.step(p, "row_stats", *base, rows);
        rec.step(
            p,
            "gather_logp",
            StepParams {
                out_off: out as u32,
                ..*base
            },
            tokens,
        );
    }

    /// The prompts of a rollout request, flat, once checked: each of `n` tokens, all in the
    /// vocabulary, and a temperature > 0.
    fn rollout_prompts(&self, req: &SampleRequest) -> Result<Vec<u32>, EngineError> {
        let n = self.n;
        if let Some(p) = req.prompts.iter().find(|p| p.len() != n) {
            return Err(kerr(
                "prompts",
                format!("a prompt of {} tokens; this model reads {n}", p.len()),
            ));
        }
        let t = req.params.temperature;
        if !(t.is_finite() && t > 0.0) {
            return Err(kerr("temperature", format!("{t}: must be > 0")));
        }
        let prompts: Vec<u32> = req.prompts.iter().flat_map(|p| p.iter().copied()).collect();
        self.check_tokens(&prompts, "prompts")?;
        Ok(prompts)
    }

    /// Records the verifier and (`with_adv`) every advantage mode on the sampled tokens, with
    /// their read-backs; returns the advantages' buffer.
    fn record_verify(
        &self,
        rec: &mut Recorder,
        reads: &mut Vec<(Reads, usize, usize)>,
        prompts: &[u32],
        sample_tokens: &wgpu::Buffer,
        [b, g]: [usize; 2],
        (weights, with_adv): ([f32; 3], bool),
    ) -> Result<Option<wgpu::Buffer>, EngineError> {
        let n = self.n;
        let mut advantages = None;
        let k = &self.verify;
        let mut enc = k.encoder();
        let lengths = vec![n as u32; b * g];
        let (parts, rewards) = k.encode_score(
            &mut enc,
            prompts,
            sample_tokens,
            &lengths,
            (b, g, n, n),
            weights,
        )?;
        rec.dispatches += 1;
        reads.push((Reads::Buffer(parts), 0, 4 * b * g));
        reads.push((Reads::Buffer(rewards.clone()), 0, b * g));
        if with_adv {
            let [_, _, zero, adv] = k.encode_advantages(&mut enc, &rewards, b, g)?;
            rec.dispatches += 2;
            reads.push((Reads::Buffer(zero), 0, b));
            reads.push((Reads::Buffer(adv.clone()), 0, 6 * b * g));
            advantages = Some(adv);
        }
        rec.ops.push(Op::Commands(enc.finish()));
        Ok(advantages)
    }

    /// The samples from a rollout's read-backs (the first ones of `out`, in
    /// [`Self::record_rollout`]'s order) and log π_ref; what the device now holds is noted.
    pub(super) fn take_rollout(
        &mut self,
        out: &[Vec<u8>],
        b: usize,
        g: usize,
        verified: Option<bool>,
    ) -> (Samples, Vec<f32>) {
        let n = self.n;
        let tokens_out = u32s(&out[0]);
        let greedy = u32s(&out[1]);
        let old = f32s(&out[2]);
        let rf = f32s(&out[3]);
        let scores = verified.map(|with_adv| {
            let parts = u32s(&out[4]);
            DeviceScores {
                exact: parts.chunks(4).map(|p| p[3]).collect(),
                rewards: f32s(&out[5]),
                advantages: with_adv.then(|| Advantages {
                    zero_std: u32s(&out[6]).iter().map(|&z| z == 1).collect(),
                    by_mode: f32s(&out[7]).chunks(b * g).map(|c| c.to_vec()).collect(),
                }),
            }
        });
        self.dev_tokens = tokens_out.clone();
        self.dev_old = old.clone();
        self.dev_ref = rf.clone();
        self.old_is_current = true;
        let samples = Samples {
            rows: tokens_out.chunks(n).map(|c| c.to_vec()).collect(),
            closed: vec![true; b * g],
            scores,
            greedy: Some(greedy.chunks(n).map(|c| c.to_vec()).collect()),
            logp: Some(old),
            ..Samples::default()
        };
        (samples, rf)
    }

    /// A whole iteration in one submission: the rollout, verifying and every advantage mode,
    /// the driving mode's advantages copied into place, then `mu` optimizer steps; one
    /// read-back of everything. Natively it waits for it; in a browser it answers
    /// [`EngineError::Pending`] until the read-back has arrived (the same request again
    /// collects it).
    pub(super) fn run_iteration(
        &mut self,
        req: &IterationRequest,
    ) -> Result<IterationOutput, EngineError> {
        let key = iteration_key(req);
        // Another request than the one in flight (a run reset meanwhile) drops that one's
        // results.
        if let Some(f) = self.in_flight.take()
            && f.key == key
        {
            if !f.staged.is_ready() {
                self.in_flight = Some(f);
                return Err(EngineError::Pending);
            }
            let out = f.staged.read()?;
            return Ok(self.finish_iteration(&out, &f.shape));
        }
        let (b, g, n) = (req.sample.prompts.len(), req.sample.g, self.n);
        if b == 0 || g == 0 || req.mu == 0 {
            return Err(kerr("iteration", "needs prompts, responses and μ ≥ 1"));
        }
        if req.mu > MAX_STEPS_PER_SUBMISSION || req.mode >= 6 {
            return Err(kerr(
                "iteration",
                format!(
                    "μ = {} (at most {MAX_STEPS_PER_SUBMISSION}) and advantage mode {} (of 6)",
                    req.mu, req.mode
                ),
            ));
        }
        let mut r = self.record_rollout(&req.sample, Some((req.reward_weights, true)))?;
        self.logp_temperature = r.temperature;
        let plan = self.plan.as_ref().expect("planned");
        let l = plan.layout;
        let adv = r.advantages.clone().expect("verified with advantages");
        r.rec.ops.push(Op::Copy {
            src: adv,
            src_off: (req.mode * b * g * 4) as u64,
            dst: plan.work.clone(),
            dst_off: (l.adv * 4) as u64,
            bytes: (b * g * 4) as u64,
        });
        let base = self.step_base(&l, &req.loss, req.temperature, req.lr, req.max_grad_norm);
        self.record_steps(&mut r.rec, &base, &l, b, req.mu);
        let mut reads = r.reads.clone();
        reads.extend([
            (Reads::Work, l.sums, 8 * req.mu),
            (Reads::Work, l.logp, req.logp_rows.min(b * g) * n),
            (Reads::Model, 0, self.params),
        ]);
        let shape = IterationShape {
            b,
            g,
            verified: r.verified,
            base,
            mu: req.mu,
        };
        let (slots, ops) = (r.rec.slots, r.rec.ops);
        let staged = self.submit_staged(&slots, ops, &reads)?;
        if cfg!(target_arch = "wasm32") {
            self.in_flight = Some(InFlight { key, staged, shape });
            return Err(EngineError::Pending);
        }
        let out = staged.wait(&self.ctx)?;
        Ok(self.finish_iteration(&out, &shape))
    }

    /// An iteration's outputs from its read-backs.
    pub(super) fn finish_iteration(
        &mut self,
        out: &[Vec<u8>],
        s: &IterationShape,
    ) -> IterationOutput {
        let (samples, ref_logp) = self.take_rollout(out, s.b, s.g, s.verified);
        let steps = self.take_steps(out, &s.base, s.b * s.g * self.n, s.mu);
        // The device's advantages, log π_old and log π_ref are this iteration's; the host's
        // copies of them are not kept, so a later step uploads its own.
        self.dev_adv.clear();
        self.dev_old.clear();
        self.dev_ref.clear();
        IterationOutput {
            samples,
            ref_logp,
            steps,
        }
    }
}

/// `sample.wgsl`'s parameters for a rollout of `[b, g, n, v]`.
fn sample_words(req: &SampleRequest, [b, g, n, v]: [usize; 4]) -> Vec<u32> {
    let sp = req.params;
    vec![
        b as u32,
        g as u32,
        n as u32,
        v as u32,
        (1.0 / sp.temperature).to_bits(),
        sp.top_k as u32,
        sp.top_p.to_bits(),
        req.stream,
        req.seed as u32,
        (req.seed >> 32) as u32,
        0,
        0,
    ]
}
