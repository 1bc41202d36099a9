//! The optimizer steps' submissions: μ steps on one frozen batch, each forward → per-token
//! loss and derivative → backward → grad norm → clip → Adam, recorded into one submission.

use super::*;

impl WgslLectureEngine {
    /// `count` optimizer steps on one frozen batch in one submission; one read-back of every
    /// step's sums (and the last step's logged log π rows).
    pub(super) fn run_steps(
        &mut self,
        batch: &Batch,
        req: &StepRequest,
        count: usize,
    ) -> Result<Vec<StepOutput>, EngineError> {
        self.check_batch(batch)?;
        let (b, g, n) = (batch.b, batch.g, self.n);
        let tokens = b * g * n;
        if req.advantages.len() != b * g
            || req.old_logp.len() != tokens
            || req.ref_logp.len() != tokens
        {
            return Err(kerr(
                "step",
                format!(
                    "advantages / log π_old / log π_ref must hold {} / {tokens} / {tokens} values, got {} / {} / {}",
                    b * g,
                    req.advantages.len(),
                    req.old_logp.len(),
                    req.ref_logp.len()
                ),
            ));
        }
        if !(req.temperature.is_finite() && req.temperature > 0.0) {
            return Err(kerr(
                "temperature",
                format!("{}: must be > 0", req.temperature),
            ));
        }
        self.plan(b, g)?;
        let plan = self.plan.take().expect("planned");
        let l = plan.layout;
        let mut dp = std::mem::take(&mut self.dev_prompts);
        let mut dt = std::mem::take(&mut self.dev_tokens);
        let mut da = std::mem::take(&mut self.dev_adv);
        let mut dold = std::mem::take(&mut self.dev_old);
        let mut dref = std::mem::take(&mut self.dev_ref);
        let stale_old = dold.len() != req.old_logp.len()
            || dold
                .iter()
                .zip(req.old_logp)
                .any(|(a, b)| a.to_bits() != b.to_bits());
        self.sync_ints(&plan, &mut dp, &batch.prompts, l.i_prompts);
        self.sync_ints(&plan, &mut dt, &batch.responses, l.i_tokens);
        self.sync_work(&plan, &mut da, req.advantages, l.adv);
        self.sync_work(&plan, &mut dold, req.old_logp, l.old);
        self.sync_work(&plan, &mut dref, req.ref_logp, l.rf);
        (
            self.dev_prompts,
            self.dev_tokens,
            self.dev_adv,
            self.dev_old,
            self.dev_ref,
        ) = (dp, dt, da, dold, dref);
        if stale_old {
            self.old_is_current = false;
        }
        self.plan = Some(plan);

        let base = self.step_base(&l, &req.loss, req.temperature, req.lr, req.max_grad_norm);
        let mut rec = Recorder::default();
        self.record_steps(&mut rec, &base, &l, b, count);
        let logp_rows = req.logp_rows.min(b * g) * n;
        let (slots, ops) = (rec.slots, rec.ops);
        let out = self.submit(
            &slots,
            ops,
            &[
                (Reads::Work, l.sums, 8 * count),
                (Reads::Work, l.logp, logp_rows),
                (Reads::Model, 0, self.params),
            ],
        )?;
        Ok(self.take_steps(&out, &base, tokens, count))
    }

    /// The step parameters of one iteration's optimizer steps (Adam's bias corrections are
    /// per step: [`Self::record_steps`]).
    pub(super) fn step_base(
        &self,
        l: &Layout,
        loss: &LossSettings,
        temperature: f32,
        lr: f64,
        max_grad_norm: f32,
    ) -> StepParams {
        let mut base = self.base_params(l);
        let inv_t = 1.0 / temperature;
        base.inv_t = inv_t;
        // Every aggregation is the mean over the B·G·n tokens: every response has n tokens.
        base.cw = inv_t / (l.b * l.g * self.n) as f32;
        loss_params(&mut base, loss);
        base.lr = lr as f32;
        base.b1 = self.beta1;
        base.b2 = self.beta2;
        base.eps = self.eps;
        base.max_norm = max_grad_norm;
        base
    }

    /// `count` optimizer steps from Adam's step `self.time + 1`, each with its sums in its own
    /// slot of `sums`.
    pub(super) fn record_steps(
        &self,
        rec: &mut Recorder,
        base: &StepParams,
        l: &Layout,
        b: usize,
        count: usize,
    ) {
        let before = rec.dispatches;
        for k in 0..count {
            let time = self.time + 1 + k as i32;
            let hyper = crate::objective::adam::Hyper {
                beta1: self.beta1,
                beta2: self.beta2,
                eps: base.eps,
            };
            let (bc2, factor) = crate::objective::adam::corrections(&hyper, time);
            let step = StepParams {
                bc2,
                factor,
                sums_off: (l.sums + 8 * k) as u32,
                ..*base
            };
            self.record_step(rec, &step, l, b);
        }
        debug_assert_eq!(rec.dispatches - before, DISPATCHES_PER_STEP * count);
    }

    /// The outputs of `count` steps from the read-backs `[sums, logged log π, weights]` (the
    /// last three of `out`); the engine's step count and host weights move on.
    pub(super) fn take_steps(
        &mut self,
        out: &[Vec<u8>],
        base: &StepParams,
        tokens: usize,
        count: usize,
    ) -> Vec<StepOutput> {
        let [sums, last_logp, weights] = &out[out.len() - 3..] else {
            unreachable!("three read-backs")
        };
        self.time += count as i32;
        self.host_weights = Some(f32s(weights));
        self.old_is_current = false;
        let sums = f32s(sums);
        let last_logp = f32s(last_logp);
        let tk = tokens as f64;
        (0..count)
            .map(|k| {
                let s = &sums[8 * k..8 * k + 8];
                let kl_part = if base.kl_on == 1 {
                    base.beta as f64 * s[1] as f64
                } else {
                    0.0
                };
                StepOutput {
                    scalars: StepScalars {
                        loss: ((s[0] as f64 + kl_part) / tk) as f32,
                        kl: (s[1] as f64 / tk) as f32,
                        ratio_mean: (s[2] as f64 / tk) as f32,
                        clip_low: (s[3] as f64 / tk) as f32,
                        clip_high: (s[4] as f64 / tk) as f32,
                        entropy: (s[5] as f64 / tk) as f32,
                        grad_norm: s[6].sqrt(),
                        entropy_measured: None,
                        entropy_first_order: None,
                    },
                    logp: if k + 1 == count {
                        last_logp.clone()
                    } else {
                        Vec::new()
                    },
                    // The kernels keep each token's entropy on the device only.
                    entropy: Vec::new(),
                }
            })
            .collect()
    }

    /// One optimizer step's dispatches: forward → per-token loss and derivative → backward →
    /// grad norm → clip → Adam.
    pub(super) fn record_step(&self, rec: &mut Recorder, base: &StepParams, l: &Layout, b: usize) {
        let (v, n, d) = (self.vocab, self.n, self.d);
        let rows = b * n;
        let u = |x: usize| x as u32;
        let base = *base;
        self.record_forward(rec, &base, 0);
        let p = &self.programs;
        // log Z, log π, the loss terms and their derivative, dlogits: one pass per row.
        rec.step(p, "row_step", base, rows);
        // logits = enc · M: dM = encᵀ · dlogits, d_enc = dlogits · Mᵀ.
        rec.matmul(
            p,
            (1, 1),
            MatmulParams {
                m: u(d),
                n: u(n * v),
                k: u(b),
                batch: 1,
                a: [u(l.enc), 1, u(d), 0],
                b: [u(l.dl), u(n * v), 1, 0],
                c: [u(l.dm), u(n * v), 0],
                ..Default::default()
            },
        );
        rec.matmul(
            p,
            (1, 1),
            MatmulParams {
                m: u(b),
                n: u(d),
                k: u(n * v),
                batch: 1,
                a: [u(l.dl), u(n * v), 1, 0],
                b: [u(l.m), 1, u(n * v), 0],
                c: [u(l.denc), u(d), 0],
                ..Default::default()
            },
        );
        // enc[b] = Σ_p T_p[x_bp]: dT_p = onehot(x_p)ᵀ · d_enc, as a race-free scatter.
        rec.step(p, "scatter_dt", base, n * d);
        self.record_weight_grads(rec, l);
        let p = &self.programs;
        rec.reduce(p, base, l.stats, rows, CHANNELS, 0, false);
        rec.reduce(p, base, l.grad, self.params, 1, 6, true);
        rec.step(p, "adam", base, self.params.div_ceil(4));
    }
    /// The weights' gradients from dM (`l.dm`) and dT (`l.dt`), into `l.grad`.
    fn record_weight_grads(&self, rec: &mut Recorder, l: &Layout) {
        let (v, n, d) = (self.vocab, self.n, self.d);
        let (vd, ndd) = (v * d, n * d * d);
        let u = |x: usize| x as u32;
        let p = &self.programs;
        // M_p = decode_p · Eᵀ: ∂decode_p = dM_p · E, ∂E = Σ_p dM_pᵀ · decode_p.
        rec.matmul(
            p,
            (1, 0),
            MatmulParams {
                m: u(d),
                n: u(d),
                k: u(v),
                batch: u(n),
                a: [u(l.dm), u(n * v), 1, u(v)],
                b: [0, u(d), 1, 0],
                c: [u(l.grad + vd + ndd), u(n * d), u(d)],
                ..Default::default()
            },
        );
        rec.matmul(
            p,
            (1, 0),
            MatmulParams {
                m: u(v),
                n: u(d),
                k: u(d),
                batch: u(n),
                a: [u(l.dm), 1, u(n * v), u(v)],
                b: [u(vd + ndd), u(n * d), 1, u(d)],
                c: [u(l.grad), u(d), 0],
                reduce: true,
                ..Default::default()
            },
        );
        // T_p = E · encode_p: ∂encode_p = Eᵀ · dT_p, ∂E += Σ_p dT_p · encode_pᵀ.
        rec.matmul(
            p,
            (0, 1),
            MatmulParams {
                m: u(d),
                n: u(d),
                k: u(v),
                batch: u(n),
                a: [0, 1, u(d), 0],
                b: [u(l.dt), u(n * d), 1, u(d)],
                c: [u(l.grad + vd), u(d), u(d * d)],
                ..Default::default()
            },
        );
        rec.matmul(
            p,
            (1, 0),
            MatmulParams {
                m: u(v),
                n: u(d),
                k: u(d),
                batch: u(n),
                a: [u(l.dt), u(n * d), 1, u(d)],
                b: [u(vd), 1, u(d), u(d * d)],
                c: [u(l.grad), u(d), 0],
                accumulate: true,
                reduce: true,
                c_cs: 0,
            },
        );
    }
}
