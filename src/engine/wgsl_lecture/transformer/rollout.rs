//! The transformer's rollout on the device: the prefill, then per position the KV cache, the
//! head, sample.wgsl's draws or argmax, and `place`, in one submission per chunk of prompts.

use super::*;

/// sample.wgsl's buffers for a rollout of `rows` sampled rows: the position's logits, their
/// weights, the drawn tokens, and per position its parameters and bind group.
pub(super) struct Sampler {
    rows: usize,
    logits: wgpu::Buffer,
    tokens: wgpu::Buffer,
    params: Vec<wgpu::Buffer>,
    groups: Vec<wgpu::BindGroup>,
}

/// One chunk of a rollout ([`WgslTransformer::generate`]).
struct Chunk {
    /// Every row's tokens: the sampled rows, then the greedy ones.
    rows: Vec<Vec<u32>>,
    closed: Vec<bool>,
    /// The sampled rows' log π, `[sampled·max_len]`.
    logp: Vec<f32>,
}

impl WgslTransformer {
    /// The head at position `p` of every row into `step_logits` (`[rows, V]`), from the final
    /// LayerNorm's output (recorded with the blocks).
    fn record_head_at(&self, rec: &mut Recorder, p: usize) {
        let at = &self.plan_ref().at;
        let (d, v) = (self.shape.d_model, self.shape.vocab);
        let u = |x: usize| x as u32;
        let base = self.over(self.base(1.0), (p, p + 1));
        // A prompt's last position holds one row per prompt: its logits go to each of its rows.
        let (first, count) = at.span((p, p + 1));
        let to = if p < self.n {
            at.prompt_logits
        } else {
            at.step_logits
        };
        let (a, w) = ((at.af + first * d, d, 1), (self.weights.head, v, 1));
        let product = MatmulParams::single((count, v, d), a, w, (to, v), false);
        rec.matmul(&self.programs, (WORK, MODEL), product);
        if p < self.n {
            let expand = TfParams {
                y: u(at.step_logits),
                z: u(at.prompt_logits),
                ..base
            };
            rec.tf(&self.programs, "expand", expand, at.rows * v);
        }
    }

    /// sample.wgsl's buffers on the rollout plan for `rows` sampled rows and `t` positions.
    fn sampler(&mut self, rows: usize, t: usize) -> Result<(), EngineError> {
        let v = self.shape.vocab;
        let ctx = self.ctx.clone();
        let layout = &self.programs.sample_layout;
        let plan = self.plans[self.cur as usize].as_mut().expect("planned");
        if plan
            .sampler
            .as_ref()
            .is_some_and(|s| s.rows == rows && s.params.len() == t)
        {
            return Ok(());
        }
        let storage = |name, elems| WgslLectureEngine::storage(&ctx, name, elems);
        let logits = storage("wgsl_transformer.sample_logits", rows * v)?;
        let weights = storage("wgsl_transformer.sample_weights", rows * v)?;
        let tokens = storage("wgsl_transformer.sample_tokens", rows)?;
        let params: Vec<wgpu::Buffer> = (0..t)
            .map(|_| {
                ctx.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("wgsl_transformer.sample_params"),
                    size: 64,
                    usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                })
            })
            .collect();
        let groups = params
            .iter()
            .map(|p| {
                fn entry(binding: u32, buffer: &wgpu::Buffer) -> wgpu::BindGroupEntry<'_> {
                    wgpu::BindGroupEntry {
                        binding,
                        resource: buffer.as_entire_binding(),
                    }
                }
                ctx.device.create_bind_group(&wgpu::BindGroupDescriptor {
                    label: Some("sample.wgsl"),
                    layout,
                    entries: &[
                        entry(0, p),
                        entry(1, &logits),
                        entry(2, &weights),
                        entry(3, &tokens),
                    ],
                })
            })
            .collect();
        plan.sampler = Some(Sampler {
            rows,
            logits,
            tokens,
            params,
            groups,
        });
        Ok(())
    }

    /// Generate `g` responses to each prompt (`prompts [B·n]`) and, with `with_greedy`, one
    /// greedy answer per prompt in the same pass, on the device in one submission: the prompts
    /// prefilled, then per position the last one's keys and values into the cache (`qkv`),
    /// the head, sample.wgsl's draws under the position's stream (as
    /// [`crate::engine::draw_position`]: the same tokens as the CPU engines where the logits
    /// agree to the last bit — else a token whose cumulative weight sits within rounding of
    /// the uniform draw may differ), argmax for the greedy rows, and `place`; every position up
    /// to `max_len` (a closed row's later positions are computed and ignored). log π of each
    /// sampled row's tokens at `temperature`, as [`FusedTransformer::generate`].
    pub async fn generate(
        &mut self,
        prompts: &[u32],
        g: usize,
        max_len: usize,
        pick: &Pick,
        temperature: f32,
        with_greedy: bool,
    ) -> Result<Generation, EngineError> {
        let n = self.n;
        if n == 0
            || prompts.is_empty()
            || !prompts.len().is_multiple_of(n)
            || g == 0
            || max_len == 0
        {
            return Err(kerr(
                "rollout",
                format!(
                    "{} prompt tokens, {g} responses of up to {max_len} tokens: prompts of {n} tokens, at least one response of one token are needed",
                    prompts.len()
                ),
            ));
        }
        if !(temperature.is_finite() && temperature > 0.0) {
            return Err(kerr("temperature", format!("{temperature}: must be > 0")));
        }
        self.check_tokens(prompts)?;
        let draw = match pick {
            Pick::Sample(d) if d.sampler.any() => {
                return Err(EngineError::Unsupported(
                    "the WGSL transformer's rollout draws from the f32 logits (no bf16 sampler, no recorded sampler log π or support)".into(),
                ));
            }
            Pick::Sample(d) => Some(*d),
            Pick::Greedy => None,
        };
        let b = prompts.len() / n;
        let per_chunk = self.prompts_per_rollout(b, g, max_len, with_greedy);
        let sampled = b * g;
        let (mut rows, mut closed, mut logp_all) = (Vec::new(), Vec::new(), Vec::new());
        let mut greedy = Vec::new();
        for start in (0..b).step_by(per_chunk) {
            let end = (start + per_chunk).min(b);
            let chunk = &prompts[start * n..end * n];
            let mut c = self
                .rollout_chunk(chunk, g, max_len, draw, temperature, with_greedy, start * g)
                .await?;
            greedy.extend(c.rows.split_off((end - start) * g));
            rows.append(&mut c.rows);
            closed.append(&mut c.closed);
            logp_all.append(&mut c.logp);
        }
        let width = rows.iter().map(|x| x.len()).max().unwrap_or(1).max(1);
        let logp = (0..sampled)
            .flat_map(|r| logp_all[r * max_len..][..width].iter().copied())
            .collect();
        Ok(Generation {
            rows,
            closed,
            logp,
            greedy: with_greedy.then_some(greedy),
            sampler_logp: None,
            support: None,
        })
    }

    /// The most prompts of a rollout whose activations fit one storage buffer.
    fn prompts_per_rollout(&self, b: usize, g: usize, max_len: usize, with_greedy: bool) -> usize {
        let limits = self.ctx.device.limits();
        let limit = limits
            .max_storage_buffer_binding_size
            .min(limits.max_buffer_size)
            / 4;
        let rows = |p: usize| p * g + if with_greedy { p } else { 0 };
        let fits = |p: usize| {
            (TfLayout::new(&self.shape, self.n, (rows(p), p, g), max_len, 0).len as u64) < limit
        };
        let mut p = b.max(1);
        while p > 1 && !fits(p) {
            p = p.div_ceil(2);
        }
        p
    }

    /// Position `i`'s draws into `ints[i_drawn..]`: the first `drawn` rows through sample.wgsl
    /// (the logits copied to its buffer, weights, draw, the tokens copied back), the rest by
    /// argmax (lowest id on ties).
    fn record_draw(&self, rec: &mut Recorder, i: usize, drawn: usize) {
        let plan = self.plan_ref();
        let at = &plan.at;
        let (rows, v) = (at.rows, self.shape.vocab);
        let u = |x: usize| x as u32;
        if let Some(s) = plan.sampler.as_ref().filter(|_| drawn > 0) {
            rec.ops.push(Op::Copy {
                src: plan.work.clone(),
                src_off: (at.step_logits * 4) as u64,
                dst: s.logits.clone(),
                dst_off: 0,
                bytes: (drawn * v * 4) as u64,
            });
            for pipeline in [&self.programs.row_weights, &self.programs.draw] {
                rec.ops.push(Op::Sample {
                    pipeline: pipeline.clone(),
                    grid: grid_1d(drawn),
                    group: s.groups[i].clone(),
                });
            }
            rec.ops.push(Op::Copy {
                src: s.tokens.clone(),
                src_off: 0,
                dst: plan.ints.clone(),
                dst_off: (at.i_drawn * 4) as u64,
                bytes: (drawn * 4) as u64,
            });
        }
        if rows > drawn {
            let argmax = StepParams {
                rows: u(rows - drawn),
                v: u(v),
                logits_off: u(at.step_logits + drawn * v),
                i_greedy: u(at.i_drawn + drawn),
                ..Default::default()
            };
            rec.step(&self.programs, "argmax", argmax, rows - drawn);
        }
    }

    /// Each position's sampler parameters for `drawn` rows from the rollout's row `row0`.
    fn upload_draws(&self, d: crate::engine::Draw, drawn: usize, row0: usize) {
        let Some(s) = &self.plan_ref().sampler else {
            return;
        };
        for (i, params) in s.params.iter().enumerate() {
            let sp = d.params;
            let words = [
                drawn as u32,
                1,
                1,
                self.shape.vocab as u32,
                (1.0 / sp.temperature).to_bits(),
                sp.top_k as u32,
                sp.top_p.to_bits(),
                d.position_stream(i),
                d.seed as u32,
                (d.seed >> 32) as u32,
                row0 as u32,
                0,
            ];
            self.ctx.queue.write_buffer(params, 0, &u32_bytes(&words));
        }
    }

    /// The rollout of one chunk of prompts in one submission, or two where a row is still open
    /// where the plan's last decode had closed every row (see [`Self::generate`]); its
    /// sampled rows are the rollout's rows `row0..`. Every row's tokens (the sampled rows, then
    /// the greedy ones), the sampled rows' closed flags and log π `[sampled·max_len]`.
    #[allow(clippy::too_many_arguments)]
    async fn rollout_chunk(
        &mut self,
        prompts: &[u32],
        g: usize,
        max_len: usize,
        draw: Option<crate::engine::Draw>,
        temperature: f32,
        with_greedy: bool,
        row0: usize,
    ) -> Result<Chunk, EngineError> {
        let (n, v) = (self.n, self.shape.vocab);
        let eos = (v - 1) as u32;
        let b = prompts.len() / n;
        let sampled = b * g;
        let rows = sampled + if with_greedy { b } else { 0 };
        let drawn = if draw.is_some() { sampled } else { 0 };
        let slot = if draw.is_some() {
            Slot::Rollout
        } else {
            Slot::Greedy
        };
        self.plan(slot, (rows, b, g), max_len)?;
        if drawn > 0 {
            self.sampler(drawn, max_len)?;
        }
        // Every row at every position (the rank of row r is r).
        let at = &self.plan_ref().at;
        let (open, order, tables) = at.arrange(&vec![max_len - 1; rows]);
        let mut ints = self.sequences(prompts, None, (&order, &open), (max_len, at.nr));
        ints.extend(std::iter::repeat_n(eos, rows * max_len));
        ints.extend(std::iter::repeat_n(0, 3 * rows));
        ints.extend(tables);
        let plan = self.plan_ref();
        let at = plan.at.clone();
        self.ctx
            .queue
            .write_buffer(&plan.ints, 0, &u32_bytes(&ints));
        if let Some(d) = draw {
            self.upload_draws(d, drawn, row0);
        }
        let u = |x: usize| x as u32;
        let place = TfParams {
            sampled: u(sampled),
            logits: u(at.step_logits),
            logp: u(at.roll_logp),
            ..self.base(1.0 / temperature)
        };
        // Positions first..last: each row's token, sampled or greedy, then placed.
        let record = |me: &Self, rec: &mut Recorder, positions: std::ops::Range<usize>| {
            for i in positions {
                if i > 0 {
                    me.record_blocks(rec, 0, (n + i - 1, n + i), n + i - 1);
                }
                me.record_head_at(rec, n - 1 + i);
                me.record_draw(rec, i, drawn);
                rec.tf(&me.programs, "place", TfParams { i: u(i), ..place }, rows);
            }
        };
        let tokens = rows * max_len;
        let reads = [
            (Reads::Ints, at.i_resp, tokens),
            (Reads::Ints, at.i_state, 2 * rows),
            (Reads::Work, at.roll_logp, tokens),
        ];
        // The decode stops where the last call of this plan's rows had all closed (`first`),
        // and goes on in a second submission only if a row is still open there: past the
        // position where every row has closed, each row only gets <eos> and log π 0, which
        // nothing reads (a row's tokens and log π are cut at the longest row). The same
        // answers at any `first`; the sort task's answers close 2 of transformer-sort's 8
        // positions early, and an iteration decodes twice (evaluation, rollout).
        let first = self.decoded[slot as usize].clamp(1, max_len);
        let mut rec = self.recorder();
        self.record_blocks(&mut rec, 0, (0, n), n - 1);
        record(self, &mut rec, 0..first);
        let mut out = self.run(rec, &reads).await?;
        if first < max_len && u32s(&out[1])[..rows].contains(&0) {
            let mut rec = self.recorder();
            record(self, &mut rec, first..max_len);
            let before = self.last_dispatches;
            out = self.run(rec, &reads).await?;
            // The decode's dispatches: both submissions'.
            self.last_dispatches += before;
        }
        let (resp, state, logp_all) = (u32s(&out[0]), u32s(&out[1]), f32s(&out[2]));
        // Where this plan's next call stops first: this call's longest row (≥ 1).
        self.decoded[slot as usize] = state[rows..].iter().max().map_or(max_len, |&l| l as usize);
        let rows_out: Vec<Vec<u32>> = (0..rows)
            .map(|r| resp[r * max_len..][..(state[rows + r] as usize).min(max_len)].to_vec())
            .collect();
        Ok(Chunk {
            rows: rows_out,
            closed: state[..sampled].iter().map(|&c| c == 1).collect(),
            logp: logp_all[..sampled * max_len].to_vec(),
        })
    }
}
