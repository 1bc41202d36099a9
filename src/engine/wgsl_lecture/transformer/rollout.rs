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
        // The drawn tokens, then (a tail's draws) each row's index in its rollout.
        let tokens = storage("wgsl_transformer.sample_tokens", 2 * rows)?;
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
    /// greedy answer per prompt in the same pass, on the device in one submission (two where a
    /// few rows go on past the rest: `rollout_chunk`): the prompts
    /// prefilled, then per position the last one's keys and values into the cache (`qkv`),
    /// the head, sample.wgsl's draws under the position's stream (as
    /// [`crate::engine::draw_position`]: the same tokens as the CPU engines where the logits
    /// agree to the last bit — else a token whose cumulative weight sits within rounding of
    /// the uniform draw may differ), argmax for the greedy rows, and `place`; every position up
    /// to `max_len` (a closed row's later positions, where computed, are ignored). log π of each
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

    /// The current plan's `ints` for a decode of every row to `max_len` (`prompts`, one per
    /// prompt of the plan): the sequences, the responses (`known` tokens, else <eos>), the
    /// draws' place, every row open and `len` tokens long, and the tables (every row at every
    /// position: the rank of row r is r).
    fn decode_ints(&self, prompts: &[u32], known: Option<&[u32]>, max_len: usize, len: usize) {
        let at = &self.plan_ref().at;
        let (rows, eos) = (at.rows, (self.shape.vocab - 1) as u32);
        let (open, order, tables) = at.arrange(&vec![max_len - 1; rows]);
        let mut ints = self.sequences(prompts, known, (&order, &open), (max_len, at.nr));
        match known {
            Some(k) => ints.extend_from_slice(k),
            None => ints.extend(std::iter::repeat_n(eos, rows * max_len)),
        }
        ints.extend(std::iter::repeat_n(0, 2 * rows));
        ints.extend(std::iter::repeat_n(len as u32, rows));
        ints.extend(tables);
        let q = &self.ctx.queue;
        q.write_buffer(&self.plan_ref().ints, 0, &u32_bytes(&ints));
    }

    /// Positions `positions` of a decode on the current plan: each row's token, the first
    /// `drawn` rows' sampled and the rest's greedy, then placed (`place`: the entry's
    /// parameters but the position).
    fn record_positions(
        &self,
        rec: &mut Recorder,
        positions: std::ops::Range<usize>,
        drawn: usize,
        place: TfParams,
    ) {
        let (n, rows) = (self.n, self.plan_ref().at.rows);
        for i in positions {
            if i > 0 {
                self.record_blocks(rec, 0, (n + i - 1, n + i), n + i - 1);
            }
            self.record_head_at(rec, n - 1 + i);
            self.record_draw(rec, i, drawn);
            let i = i as u32;
            rec.tf(&self.programs, "place", TfParams { i, ..place }, rows);
        }
    }

    /// A decode's rows `open` (ascending; at most `tail_rows`), open after its first `first`
    /// positions, on the tail's plan of `tail_rows` rows (the last open row again where there
    /// are fewer): their prompts and the tokens they drew so far teacher-forced in one pass
    /// (the same keys and values as the decode's cache, row by row the same arithmetic), then
    /// positions `first..max_len` as the decode would go on — the sampled rows (below
    /// `drawn`) under their own streams (sample.wgsl's row list), the rest greedy — in one
    /// submission. Their tokens, closed flags, lengths and log π from `first` on into the
    /// decode's read-backs `whole` (tokens `[rows·max_len]`, flags and lengths `[2·rows]`, log π).
    /// `sampled, g`: the decode's rows below `sampled` answer prompt r / g, the rest r − sampled;
    /// `row0`: its first row's index in the rollout.
    async fn decode_tail(
        &mut self,
        prompts: &[u32],
        open: &[usize],
        (sampled, g, drawn, row0): (usize, usize, usize, usize),
        (first, max_len): (usize, usize),
        (draw, temperature): (Option<crate::engine::Draw>, f32),
        whole: &mut (Vec<u32>, Vec<u32>, Vec<f32>),
    ) -> Result<(), EngineError> {
        let (n, v) = (self.n, self.shape.vocab);
        let eos = (v - 1) as u32;
        let cap = self.tail_rows;
        let rows = whole.1.len() / 2;
        self.plan(Slot::Tail, (cap, cap, 1), max_len)?;
        let tail_drawn = open.iter().filter(|&&r| r < drawn).count();
        if tail_drawn > 0 {
            self.sampler(cap, max_len)?;
        }
        let of = |c: usize| open[c.min(open.len() - 1)];
        let mut tail_prompts = Vec::with_capacity(cap * n);
        let mut known = vec![eos; cap * max_len];
        for c in 0..cap {
            let r = of(c);
            let p = if r < sampled { r / g } else { r - sampled };
            tail_prompts.extend_from_slice(&prompts[p * n..(p + 1) * n]);
            known[c * max_len..][..first].copy_from_slice(&whole.0[r * max_len..][..first]);
        }
        self.decode_ints(&tail_prompts, Some(&known), max_len, first);
        let at = self.plan_ref().at.clone();
        if let Some(d) = draw.filter(|_| tail_drawn > 0) {
            let ids: Vec<u32> = open[..tail_drawn]
                .iter()
                .map(|&r| (row0 + r) as u32)
                .collect();
            self.upload_draws(d, tail_drawn, 0, Some(&ids));
        }
        let place = TfParams {
            logits: at.step_logits as u32,
            logp: at.roll_logp as u32,
            ..self.base(1.0 / temperature)
        };
        let mut rec = self.recorder();
        // Positions up to the one before the last token drawn: their keys and values.
        self.record_blocks(&mut rec, 0, (0, n + first - 1), n + first - 2);
        self.record_positions(&mut rec, first..max_len, tail_drawn, place);
        let reads = [
            (Reads::Ints, at.i_resp, cap * max_len),
            (Reads::Ints, at.i_state, 2 * cap),
            (Reads::Work, at.roll_logp, cap * max_len),
        ];
        let out = self.run(rec, &reads).await?;
        self.tails += 1;
        let (resp, state, logp) = (u32s(&out[0]), u32s(&out[1]), f32s(&out[2]));
        let (w_resp, w_state, w_logp) = whole;
        let span = |x: usize| x * max_len + first..(x + 1) * max_len;
        // The closed rows' log π past `first`: 0, as the decode's own positions would write.
        for r in 0..rows {
            w_logp[span(r)].fill(0.0);
        }
        for (c, &r) in open.iter().enumerate() {
            w_resp[span(r)].copy_from_slice(&resp[span(c)]);
            w_logp[span(r)].copy_from_slice(&logp[span(c)]);
            w_state[r] = state[c];
            w_state[rows + r] = state[cap + c];
        }
        Ok(())
    }

    /// Each position's sampler parameters for `drawn` rows from the rollout's row `row0`, or
    /// (`rows`) for the rows of the rollout it lists.
    fn upload_draws(
        &self,
        d: crate::engine::Draw,
        drawn: usize,
        row0: usize,
        rows: Option<&[u32]>,
    ) {
        let Some(s) = &self.plan_ref().sampler else {
            return;
        };
        if let Some(rows) = rows {
            let q = &self.ctx.queue;
            q.write_buffer(&s.tokens, (drawn * 4) as u64, &u32_bytes(rows));
        }
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
                rows.is_some() as u32,
            ];
            self.ctx.queue.write_buffer(params, 0, &u32_bytes(&words));
        }
    }

    /// The rollout of one chunk of prompts in one submission, or two where a row is still open
    /// where the plan's last decode had closed all rows but `tail_rows` (see
    /// [`Self::generate`]); its
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
        let n = self.n;
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
        self.decode_ints(prompts, None, max_len, 0);
        let at = self.plan_ref().at.clone();
        if let Some(d) = draw {
            self.upload_draws(d, drawn, row0, None);
        }
        let u = |x: usize| x as u32;
        let place = TfParams {
            sampled: u(sampled),
            logits: u(at.step_logits),
            logp: u(at.roll_logp),
            ..self.base(1.0 / temperature)
        };
        let tokens = rows * max_len;
        let reads = [
            (Reads::Ints, at.i_resp, tokens),
            (Reads::Ints, at.i_state, 2 * rows),
            (Reads::Work, at.roll_logp, tokens),
        ];
        // The decode stops where the last call of this plan had at most `tail_rows` rows still
        // open (`first`), and goes on in a second submission only if a row is still open
        // there: those rows alone where they are at most `tail_rows` (`decode_tail`), else
        // every row. Past the position where a row has closed, it only gets <eos> and log π
        // 0, which nothing reads (a row's tokens and log π are cut at the longest row). The
        // same answers at any `first`. transformer-sort's answers close at 6 of its 8
        // positions, bar 0–5 of the 256 held-out or 288 rollout rows, and an iteration decodes
        // twice (evaluation, rollout): measured in four alternated pairs, its rollout part
        // went ~18.4 → ~16.3 ms per step and its evaluation ~19.5 → ~17.6 with the tail
        // (before it, every row went on to the last position).
        let first = self.decoded[slot as usize].clamp(1, max_len);
        let mut rec = self.recorder();
        self.record_blocks(&mut rec, 0, (0, n), n - 1);
        self.record_positions(&mut rec, 0..first, drawn, place);
        let mut out = self.run(rec, &reads).await?;
        let closed = u32s(&out[1]);
        let open: Vec<usize> = (0..rows).filter(|&r| closed[r] == 0).collect();
        let mut tail = None;
        if first < max_len && !open.is_empty() {
            let before = self.last_dispatches;
            if open.len() <= self.tail_rows {
                // The few rows still open go on alone (the rest would only get <eos>).
                let mut whole = (u32s(&out[0]), closed, f32s(&out[2]));
                let row_of = (sampled, g, drawn, row0);
                let pick = (draw, temperature);
                self.decode_tail(prompts, &open, row_of, (first, max_len), pick, &mut whole)
                    .await?;
                self.plan(slot, (rows, b, g), max_len)?;
                tail = Some(whole);
            } else {
                let mut rec = self.recorder();
                self.record_positions(&mut rec, first..max_len, drawn, place);
                out = self.run(rec, &reads).await?;
            }
            // The decode's dispatches: both submissions'.
            self.last_dispatches += before;
        }
        let (resp, state, logp_all) =
            tail.unwrap_or_else(|| (u32s(&out[0]), u32s(&out[1]), f32s(&out[2])));
        // Where this plan's next call stops first: the length past which this call had at most
        // `tail_rows` rows (its longest row where it had no more).
        let mut lens: Vec<u32> = state[rows..].to_vec();
        lens.sort_unstable_by(|x, y| y.cmp(x));
        let stop = lens.get(self.tail_rows).or(lens.first());
        self.decoded[slot as usize] = stop.map_or(max_len, |&l| l as usize);
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
