//! The transformer policy on the device (`model.kind = "transformer"`): the weights, the
//! reference copy and Adam's moments in one device buffer for the whole run, as the flat
//! layout of [`crate::engine::fused_transformer::Layout`]; the teacher-forced pass
//! (`shaders/transformer.wgsl` between the products of `matmul.wgsl`) and its softmax statistics;
//! the backward from per-token coefficients `∂L/∂log π_t`, `∂L/∂H_t` (the objective's one text,
//! `objective::loss::evaluate`, computes them on the host from the read-back log π, as for the
//! fused engine); the grad-norm clip and Adam (lecture_step.wgsl's `reduce_*` and `adam`).
//!
//! A batch is `R = B·G` rows of `S = n + T − 1` positions, position-major (position `p` of row
//! `r` at flat row `p·R + r`: a range of positions of every row is one block of rows, so the
//! whole pass, a prefill and a decoding step are each one product per weight), every position
//! computed (the padding after a row's end too: causal attention keeps it from every real
//! token, and its coefficients are 0, so it adds nothing to any gradient). The prompt is
//! computed once per row (the fused engine computes it once per prompt: the same values in
//! another order).
//!
//! Held to the fused CPU engine (`tests/wgsl_transformer.rs`): log π, entropies, every weight's
//! gradient and the weights after Adam, on random shapes.

use super::*;
use crate::engine::fused_transformer::{Generation, Hyper, Layout as Weights, Pick};
use crate::model::TransformerShape;

mod layout;
mod rollout;
use layout::{BlockAt, TfLayout};
use rollout::Sampler;

/// `Tp` of transformer.wgsl: shapes, then element offsets (`model` for weights, `work` for the
/// rest, `ints` for token ids), then the temperature's inverse and the attention's scale.
#[derive(Debug, Clone, Copy, Default)]
#[repr(C)]
pub struct TfParams {
    pub rows: u32,
    pub s: u32,
    pub t0: u32,
    pub t1: u32,
    pub d: u32,
    pub h: u32,
    pub f: u32,
    pub v: u32,
    pub n: u32,
    pub t: u32,
    pub cols: u32,
    pub stride: u32,
    pub x: u32,
    pub y: u32,
    pub z: u32,
    pub xhat: u32,
    pub rstd: u32,
    pub gain: u32,
    pub bias: u32,
    pub qkv: u32,
    pub att: u32,
    pub ctx: u32,
    pub cdf: u32,
    pub act: u32,
    pub logits: u32,
    pub logz: u32,
    pub logp: u32,
    pub ent: u32,
    pub coef: u32,
    pub dcoef: u32,
    pub mask: u32,
    pub i_seq: u32,
    pub i_resp: u32,
    pub tok: u32,
    pub pos: u32,
    pub flags: u32,
    pub i: u32,
    pub sampled: u32,
    pub i_drawn: u32,
    pub i_state: u32,
    pub inv_t: f32,
    pub scale: f32,
    pub g: u32,
    pub b: u32,
    pub i_start: u32,
    pub i_rank: u32,
    pub i_row: u32,
    pub i_pos: u32,
    pub i_npos: u32,
    /// The first flat row of positions `t0..t1`, their rows, and the pass's.
    pub r0: u32,
    pub rn: u32,
    pub total: u32,
    /// Every row at every position (the tables are the identity).
    pub dense: u32,
    pub pad: [u32; 3],
}

/// The buffers of one batch shape.
struct TfPlan {
    at: TfLayout,
    work: wgpu::Buffer,
    ints: wgpu::Buffer,
    uniform: wgpu::Buffer,
    slots: u64,
    group: wgpu::BindGroup,
    /// `matmul_window`'s bind groups ([`MatmulKernel::Window`]): over the model buffer, and
    /// over `scratch` (a copy of a weight gradient's `dY`, for `∂W = Xᵀ·dY` by the same kernel).
    window: Option<wgpu::BindGroup>,
    scratch: Option<(wgpu::Buffer, wgpu::BindGroup)>,
    /// A rollout's sampler (sample.wgsl's buffers and one bind group per position).
    sampler: Option<Sampler>,
}

/// Which plan: the teacher-forced passes' (steps, log π), the sampled rollouts', or greedy
/// decoding's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Pass = 0,
    Rollout = 1,
    /// Greedy decoding (the held-out evaluation, the batch's greedy answers alone): a plan of
    /// its own, so that an iteration's evaluation and rollout, whose shapes differ, do not
    /// rebuild each other's buffers every iteration (a new work buffer is cleared on its first
    /// use: ~20 ms per iteration on lavapipe, measured).
    Greedy = 2,
    /// The rows a decode left open past where most had closed, on their own
    /// ([`WgslTransformer::decode_tail`]): `tail_rows` rows whatever their count.
    Tail = 3,
}

/// What a LayerNorm adds to the residual stream before it normalizes ([`WgslTransformer::record_ln`]).
#[derive(Debug, Clone, Copy)]
enum Fold {
    Nothing,
    /// x = tok_emb[token] + pos_emb[position], of the weights at `model[w0..]`.
    Embed(usize),
    /// x += b₂ (the previous block's, at `model[b2..]`).
    Bias(usize),
}

/// A LayerNorm's outputs in the work buffer (y, x̂, 1/σ) and its gain's offset in the model (β
/// after it).
type LnAt = ((usize, usize, usize), usize);

/// The transformer's weights, reference, Adam state and activations on the device.
pub struct WgslTransformer {
    ctx: Arc<GpuContext>,
    programs: Programs,
    pub shape: TransformerShape,
    weights: Weights,
    /// The prompt's length.
    n: usize,
    /// Elements of one copy of the weights.
    params: usize,
    /// `[policy | reference | Adam m | Adam v | cold start's m | v]`, each `params` long.
    model: wgpu::Buffer,
    /// A bind group of `model` alone (one uniform slot, no batch): the reference's refresh.
    aux: (wgpu::Buffer, wgpu::BindGroup),
    plans: [Option<TfPlan>; 4],
    /// The plan the last upload chose.
    cur: Slot,
    hyper: Hyper,
    /// Adam's step count.
    time: i32,
    /// Whether the passes' `work` holds the policy's forward of the uploaded batch at `inv_t`
    /// (what the backward reads).
    policy_pass: Option<f32>,
    /// Submissions so far, and the dispatches of the last one.
    pub submissions: usize,
    pub last_dispatches: usize,
    /// Plans built so far (each: its work, ints and uniform buffers and bind groups).
    pub plans_built: usize,
    /// Decodes whose open rows went on alone ([`Self::decode_tail`]).
    pub tails: usize,
    /// Per plan (passes, rollouts, greedy decoding), where the next decode's first submission
    /// stops: the length past which its last decode had at most `tail_rows` rows (its longest
    /// row where it had no more; `usize::MAX` before any; see `rollout_chunk`). Any value
    /// gives the same answers (tests set it).
    pub decoded: [usize; 3],
    /// The most rows a decode goes on with on a plan of their own past its first submission
    /// (the tail, [`Self::decode_tail`]); more go on in the decode's own plan. 0: never.
    pub tail_rows: usize,
    /// Whether a read-back waits for the device (natively, by default) or its future answers
    /// `Pending` until the read-back has arrived (a browser; [`Arrival`]).
    pub blocking: bool,
}

/// A submission's read-backs as a future: with `blocking`, the first poll waits for the
/// device ([`Staged::wait`]); without, a poll that finds the read-back still on its way
/// answers `Pending` (no waker is woken: the engine polls again on a later call).
struct Arrival {
    staged: Option<Staged>,
    ctx: Arc<GpuContext>,
    blocking: bool,
}

impl std::future::Future for Arrival {
    type Output = Result<Vec<Vec<u8>>, EngineError>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let Some(staged) = self.staged.take() else {
            return std::task::Poll::Ready(Err(kerr("read-back", "polled after it arrived")));
        };
        if self.blocking {
            return std::task::Poll::Ready(staged.wait(&self.ctx));
        }
        if !staged.is_ready() {
            // Natively the mapping's callback runs inside a poll of the device; a browser runs
            // it between frames.
            let _ = self.ctx.device.poll(wgpu::PollType::Poll);
        }
        if staged.is_ready() {
            std::task::Poll::Ready(staged.read())
        } else {
            self.staged = Some(staged);
            std::task::Poll::Pending
        }
    }
}

/// `Y (+)= X·W` over the flat rows `first..first + count` (a span of positions: one block of
/// rows): X rows of `k` at `x`, Y rows of `n` at `y`, W (in `model`) the view `w`.
fn range_mm(
    (first, count): (usize, usize),
    (x, k): (usize, usize),
    w: (usize, usize, usize),
    (y, n): (usize, usize),
    accumulate: bool,
) -> MatmulParams {
    MatmulParams::single(
        (count, n, k),
        (x + first * k, k, 1),
        w,
        (y + first * n, n),
        accumulate,
    )
}

/// [`WgslTransformer::tail_rows`]'s default: transformer-sort's decodes leave 0–5 of 256 or
/// 288 rows open past the length most of them close at (its answers' 6 of 8 positions).
pub const TAIL_ROWS: usize = 16;

const MODEL: u32 = 0;
const WORK: u32 = 1;
const ONE_HOT: u32 = 2;

impl WgslTransformer {
    /// The transformer of `shape` (prompts of `n` tokens) with weights `w` (the fused layout)
    /// as policy and reference, Adam's moments at 0.
    pub fn new(
        ctx: Arc<GpuContext>,
        shape: TransformerShape,
        n: usize,
        w: &[f32],
        hyper: Hyper,
    ) -> Result<Self, EngineError> {
        let weights = Weights::of(&shape);
        if w.len() != weights.total {
            return Err(kerr(
                "weights",
                format!("{} values for a model of {}", w.len(), weights.total),
            ));
        }
        if shape.heads == 0 || !shape.d_model.is_multiple_of(shape.heads) {
            return Err(kerr("model.heads", "must divide model.d_model"));
        }
        // On a CPU adapter the products by weights read them through uniform windows.
        // transformer.wgsl compiled for this shape's heads only (SMALL_HEADS).
        let small_heads = shape.d_model / shape.heads / 4 <= 4;
        let programs =
            Programs::with_heads(&ctx, MatmulKernel::for_transformer(&ctx), Some(small_heads))?;
        let params = weights.total;
        // A window's worth past the end, so a window may start at any weight.
        let model =
            WgslLectureEngine::storage(&ctx, "wgsl_transformer.model", 6 * params + WINDOW_ELEMS)?;
        let zeros = vec![0.0f32; 4 * params];
        ctx.queue
            .write_buffer(&model, 0, &f32_bytes(&[w, w, &zeros].concat()));
        let aux_uniform = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("wgsl_transformer.aux"),
            size: SLOT,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let work = WgslLectureEngine::storage(&ctx, "wgsl_transformer.aux_work", 4)?;
        let ints = WgslLectureEngine::storage(&ctx, "wgsl_transformer.aux_ints", 4)?;
        let aux_group = step_bind_group(
            &ctx.device,
            &programs.layout,
            "wgsl_transformer.aux",
            [&aux_uniform, &model, &work, &ints],
        );
        Ok(Self {
            aux: (aux_uniform, aux_group),
            ctx,
            programs,
            shape,
            weights,
            n,
            params,
            model,
            plans: [None, None, None, None],
            cur: Slot::Pass,
            hyper,
            time: 0,
            policy_pass: None,
            submissions: 0,
            last_dispatches: 0,
            plans_built: 0,
            tails: 0,
            decoded: [usize::MAX; 3],
            tail_rows: TAIL_ROWS,
            blocking: true,
        })
    }

    fn plan_ref(&self) -> &TfPlan {
        self.plans[self.cur as usize].as_ref().expect("planned")
    }

    /// The `slot` plan for `rows` rows of `t` response tokens (rebuilt when the shape changes),
    /// made current.
    fn plan(
        &mut self,
        slot: Slot,
        (rows, b, g): (usize, usize, usize),
        t: usize,
    ) -> Result<(), EngineError> {
        self.cur = slot;
        if let Some(p) = &self.plans[slot as usize]
            && (p.at.rows, p.at.b, p.at.g, p.at.t) == (rows, b, g, t)
        {
            return Ok(());
        }
        if slot == Slot::Pass {
            self.policy_pass = None;
        }
        if rows == 0 || t == 0 {
            return Err(kerr("batch", "no rows or no response tokens"));
        }
        if self.n + t - 1 > self.shape.context {
            return Err(kerr(
                "batch",
                format!(
                    "{} prompt and {t} response tokens exceed the model's context of {}",
                    self.n, self.shape.context
                ),
            ));
        }
        let params = if slot == Slot::Pass { self.params } else { 0 };
        let at = TfLayout::new(&self.shape, self.n, (rows, b, g), t, params);
        if at.len >= u32::MAX as usize / 2 {
            return Err(kerr("batch", "too large for 32-bit offsets"));
        }
        let ctx = self.ctx.clone();
        let work =
            WgslLectureEngine::storage(&ctx, "wgsl_transformer.work", at.len).map_err(|e| {
                kerr(
                    "batch",
                    format!("{rows} rows of up to {t} response tokens at once: {e}"),
                )
            })?;
        let ints = WgslLectureEngine::storage(&ctx, "wgsl_transformer.ints", at.ints)?;
        // A rollout: per position a block's 9 dispatches per layer and 10 more.
        let per_position = 9 * self.shape.layers + 12;
        let mut slots = (per_position * (t + 1) + 24 * self.shape.layers + 32) as u64;
        let s = &self.shape;
        let widest = s.vocab.max(s.d_ff).max(3 * s.d_model);
        let scratch = match &self.programs.window {
            Some(_) => {
                // The weight gradients' windows: at most nr·widest / (half a window) + 1 each
                // (`run` grows the uniform buffer if a submission ever needs more).
                let parts = (at.nr * widest).div_ceil(WINDOW_ELEMS / 2) + 1;
                slots += ((4 * s.layers + 1) * parts) as u64;
                let len = at.nr * widest + WINDOW_ELEMS;
                Some(WgslLectureEngine::storage(
                    &ctx,
                    "wgsl_transformer.scratch",
                    len,
                )?)
            }
            None => None,
        };
        let (uniform, group, window, scratch) = self.bind(slots, &work, &ints, scratch);
        self.plans_built += 1;
        self.plans[slot as usize] = Some(TfPlan {
            at,
            work,
            ints,
            uniform,
            slots,
            group,
            window,
            scratch,
            sampler: None,
        });
        Ok(())
    }

    /// A uniform buffer of `slots` dispatch slots and the bind groups over it, `work`, `ints`
    /// (and `scratch`).
    #[allow(clippy::type_complexity)]
    fn bind(
        &self,
        slots: u64,
        work: &wgpu::Buffer,
        ints: &wgpu::Buffer,
        scratch: Option<wgpu::Buffer>,
    ) -> (
        wgpu::Buffer,
        wgpu::BindGroup,
        Option<wgpu::BindGroup>,
        Option<(wgpu::Buffer, wgpu::BindGroup)>,
    ) {
        let device = &self.ctx.device;
        let uniform = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("wgsl_transformer.uniform"),
            size: slots * SLOT,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let group = step_bind_group(
            device,
            &self.programs.layout,
            "wgsl_transformer",
            [&uniform, &self.model, work, ints],
        );
        let window = window_bind_group(
            device,
            &self.programs,
            [&uniform, work, &self.model, &self.model],
        );
        let scratch = scratch.and_then(|b| {
            let g = window_bind_group(device, &self.programs, [&uniform, work, &b, &self.model])?;
            Some((b, g))
        });
        (uniform, group, window, scratch)
    }

    /// The attention kernel `entry`, or its vec4 form (`entry` + "4") where the head size and
    /// D are multiples of 4 (every offset of the layout is).
    fn attention(&self, entry: &'static str) -> &'static str {
        let (d, hh) = (self.shape.d_model, self.shape.heads);
        if !(d.is_multiple_of(4) && (d / hh).is_multiple_of(4)) {
            return entry;
        }
        match entry {
            "attention" => "attention4",
            "attn_back_q" => "attn_back_q4",
            "attn_back_kv" => "attn_back_kv4",
            other => other,
        }
    }

    /// A recorder for the current plan.
    fn recorder(&self) -> Recorder {
        Recorder {
            window: self.plan_ref().window.clone(),
            ..Default::default()
        }
    }

    /// The input tokens of a batch in the flat order (each prompt's positions once, then the
    /// responses' position by position, the rows of `order` each holds: `open`): `prompts
    /// [b·n]`, then the responses' first `t − 1` tokens (`responses [rows·t]`, or <eos> where
    /// there are none yet); <eos> after them up to the layout's `nr`.
    fn sequences(
        &self,
        prompts: &[u32],
        responses: Option<&[u32]>,
        (order, open): (&[usize], &[usize]),
        (t, nr): (usize, usize),
    ) -> Vec<u32> {
        let n = self.n;
        let b = prompts.len() / n;
        let eos = (self.shape.vocab - 1) as u32;
        let mut ints = Vec::with_capacity(nr);
        for p in 0..n {
            ints.extend((0..b).map(|pb| prompts[pb * n + p]));
        }
        for (q, &count) in open.iter().enumerate() {
            ints.extend(order[..count].iter().map(|&r| match responses {
                Some(resp) => resp[r * t + q],
                None => eos,
            }));
        }
        ints.resize(nr, eos);
        ints
    }

    fn check_tokens(&self, tokens: &[u32]) -> Result<(), EngineError> {
        let v = self.shape.vocab;
        match tokens.iter().find(|&&x| x as usize >= v) {
            Some(x) => Err(kerr(
                "batch",
                format!("token {x} is outside the vocabulary (0..{v})"),
            )),
            None => Ok(()),
        }
    }

    /// Upload a batch to the passes' plan: `prompts [B·n]`, `responses [R·T]` (`R = B·g`), row
    /// `r` holding `lens[r]` real tokens.
    fn upload(
        &mut self,
        prompts: &[u32],
        responses: &[u32],
        lens: &[usize],
        g: usize,
        t: usize,
    ) -> Result<(), EngineError> {
        let n = self.n;
        let rows = responses.len() / t.max(1);
        if g == 0
            || t == 0
            || prompts.len() != rows / g * n
            || responses.len() != rows * t
            || lens.len() != rows
            || !rows.is_multiple_of(g)
        {
            return Err(kerr(
                "batch",
                format!(
                    "{} prompt tokens, {} response tokens and {} lengths do not make prompts of {n} with {g} responses of {t}",
                    prompts.len(),
                    responses.len(),
                    lens.len()
                ),
            ));
        }
        self.check_tokens(prompts)?;
        self.check_tokens(responses)?;
        self.plan(Slot::Pass, (rows, rows / g, g), t)?;
        // A row needs the positions past the prompt that predict its real tokens: l − 1.
        let npos: Vec<usize> = lens.iter().map(|&l| l.min(t).saturating_sub(1)).collect();
        let (open, order, tables) = self.plan_ref().at.arrange(&npos);
        let nr = self.plan_ref().at.nr;
        let mut ints = self.sequences(prompts, Some(responses), (&order, &open), (t, nr));
        ints.extend_from_slice(responses);
        let mask: Vec<f32> = lens
            .iter()
            .flat_map(|&l| (0..t).map(move |i| if i < l { 1.0 } else { 0.0 }))
            .collect();
        let plan = self.plans[Slot::Pass as usize].as_mut().expect("planned");
        plan.at.open = open;
        let plan = self.plan_ref();
        let q = &self.ctx.queue;
        q.write_buffer(&plan.ints, 0, &u32_bytes(&ints));
        q.write_buffer(
            &plan.ints,
            (plan.at.i_start * 4) as u64,
            &u32_bytes(&tables),
        );
        q.write_buffer(&plan.work, (plan.at.mask * 4) as u64, &f32_bytes(&mask));
        self.policy_pass = None;
        Ok(())
    }

    /// The parameters every dispatch starts from.
    fn base(&self, inv_t: f32) -> TfParams {
        let at = &self.plan_ref().at;
        let s = &self.shape;
        let u = |x: usize| x as u32;
        TfParams {
            rows: u(at.rows),
            s: u(at.s),
            t0: 0,
            t1: u(at.s),
            d: u(s.d_model),
            h: u(s.heads),
            f: u(s.d_ff),
            v: u(s.vocab),
            n: u(self.n),
            t: u(at.t),
            logits: u(at.logits),
            logz: u(at.logz),
            logp: u(at.logp),
            ent: u(at.ent),
            coef: u(at.coef),
            dcoef: u(at.dcoef),
            mask: u(at.mask),
            i_seq: u(at.i_seq),
            i_resp: u(at.i_resp),
            i_drawn: u(at.i_drawn),
            i_state: u(at.i_state),
            sampled: u(at.b * at.g),
            g: u(at.g),
            b: u(at.b),
            i_start: u(at.i_start),
            i_rank: u(at.i_rank),
            i_row: u(at.i_row),
            i_pos: u(at.i_pos),
            i_npos: u(at.i_npos),
            r0: 0,
            rn: u(at.live()),
            total: u(at.live()),
            dense: (at.live() == at.nr) as u32,
            inv_t,
            scale: 1.0 / ((s.d_model / s.heads) as f32).sqrt(),
            ..Default::default()
        }
    }

    /// `base` over positions `t0..t1` (their flat rows from `r0`, `rn` of them).
    fn over(&self, base: TfParams, (t0, t1): (usize, usize)) -> TfParams {
        let (r0, rn) = self.plan_ref().at.span((t0, t1));
        TfParams {
            t0: t0 as u32,
            t1: t1 as u32,
            r0: r0 as u32,
            rn: rn as u32,
            ..base
        }
    }

    /// LayerNorm of the residual stream at the positions of `base` into `y` (x̂ and 1/σ kept
    /// with `keep`: a pass the backward reads), with the gain at `model[gain..]` and the bias
    /// after it, and what the residual stream gets first (`fold`): the embedding, or the
    /// previous block's b₂ — in the LayerNorm's own dispatch where D is a multiple of 4, else
    /// `embed` / `add_bias` right before it.
    fn record_ln(
        &self,
        rec: &mut Recorder,
        base: TfParams,
        (y, xhat, rstd): (usize, usize, usize),
        gain: usize,
        (fold, keep): (Fold, bool),
    ) {
        let u = |x: usize| x as u32;
        let d = self.shape.d_model;
        let x = u(self.plan_ref().at.x);
        let count = base.rn as usize;
        let vector = d.is_multiple_of(4);
        let first = match fold {
            Fold::Nothing => base,
            Fold::Embed(w0) => TfParams {
                tok: u(w0 + self.weights.tok_emb),
                pos: u(w0 + self.weights.pos_emb),
                flags: 4,
                ..base
            },
            Fold::Bias(b2) => TfParams {
                cols: u(d),
                bias: u(b2),
                z: u(b2),
                flags: 2,
                ..base
            },
        };
        let first = TfParams { x, ..first };
        if !vector {
            match fold {
                Fold::Nothing => {}
                Fold::Embed(_) => rec.tf(&self.programs, "embed", first, count * d),
                Fold::Bias(_) => rec.tf(&self.programs, "add_bias", first, count * d),
            }
        }
        let params = TfParams {
            y: u(y),
            xhat: u(xhat),
            rstd: u(rstd),
            gain: u(gain),
            bias: u(gain + d),
            flags: if vector { first.flags } else { 0 },
            ..first
        };
        let entry = match (vector, keep) {
            (false, _) => "layer_norm",
            (true, true) => "layer_norm4",
            (true, false) => "layer_norm4_y",
        };
        rec.tf(&self.programs, entry, params, count);
    }

    /// Whether a pass of the weights at `model[w0..]` on the current plan keeps what the
    /// backward reads: the policy's teacher-forced passes (not the reference's, not a rollout).
    fn keeps(&self, w0: usize) -> bool {
        self.cur == Slot::Pass && w0 == 0
    }

    /// Positions `t0..t1` of every row through the embedding and the blocks, with the weights
    /// at `model[w0..]`, then the final LayerNorm; the keys and values of earlier positions
    /// come from `qkv` (the cache). The last block's output (and the final LayerNorm) is wanted
    /// from position `out_from` on (the positions the head reads: `n − 1` on in a whole pass
    /// or a prefill): before it, only its keys and values.
    fn record_blocks(
        &self,
        rec: &mut Recorder,
        w0: usize,
        (t0, t1): (usize, usize),
        out_from: usize,
    ) {
        let at = &self.plan_ref().at;
        let s = &self.shape;
        let d = s.d_model;
        let all = at.span((t0, t1));
        let p = &self.programs;
        let base = self.over(self.base(1.0), (t0, t1));
        let wl = &self.weights;
        let layers = wl.blocks.len();
        let keep = self.keeps(w0);
        for (l, (bl, ba)) in wl.blocks.iter().zip(&at.blocks).enumerate() {
            // x = the embedding before the first block; every later LayerNorm comes with the
            // product before it (see `record_then_ln`).
            if l == 0 {
                let ln = (ba.a1, ba.xhat1, ba.rstd1);
                self.record_ln(rec, base, ln, w0 + bl.ln1_g, (Fold::Embed(w0), keep));
            }
            let ww = (w0 + bl.wqkv, 3 * d, 1);
            rec.matmul(
                p,
                (WORK, MODEL),
                range_mm(all, (ba.a1, d), ww, (ba.qkv, 3 * d), false),
            );
            let from = if l + 1 == layers {
                out_from.clamp(t0, t1)
            } else {
                t0
            };
            let base = self.over(base, (from, t1));
            // The LayerNorm after the block: the next block's first, or the final one.
            let next = match (wl.blocks.get(l + 1), at.blocks.get(l + 1)) {
                (Some(nb), Some(na)) => ((na.a1, na.xhat1, na.rstd1), w0 + nb.ln1_g),
                _ => ((at.af, at.xhatf, at.rstdf), w0 + wl.lnf_g),
            };
            self.record_block_rest(rec, w0, (bl, ba), base, (keep, next));
        }
    }

    /// A block after its keys and values, at the positions of `base`: attention over the
    /// cache, `x += ctx·W_o`, then `x += GELU(LN₂(x)·W₁ + b₁)·W₂ + b₂`, and the LayerNorm
    /// `next` after it (outputs, gain); what the backward reads kept with `keep`.
    fn record_block_rest(
        &self,
        rec: &mut Recorder,
        w0: usize,
        (bl, ba): (&crate::engine::fused_transformer::BlockLayout, &BlockAt),
        base: TfParams,
        (keep, next): (bool, LnAt),
    ) {
        let at = &self.plan_ref().at;
        let s = &self.shape;
        let (d, f, hh) = (s.d_model, s.d_ff, s.heads);
        let span = (base.r0 as usize, base.rn as usize);
        let count = span.1;
        let p = &self.programs;
        let u = |x: usize| x as u32;
        let w = |o: usize| u(w0 + o);
        let att = TfParams {
            qkv: u(ba.qkv),
            att: u(ba.att),
            ctx: u(ba.ctx),
            ..base
        };
        let entry = match self.attention("attention") {
            "attention4" if !keep => "attention4_ctx",
            entry => entry,
        };
        rec.tf(p, entry, att, count * hh);
        let wo = range_mm(span, (ba.ctx, d), (w0 + bl.wo, d, 1), (at.x, d), true);
        let ln2 = ((ba.a2, ba.xhat2, ba.rstd2), w0 + bl.ln2_g);
        self.record_then_ln(rec, (base, wo), ln2, (None, keep));
        let w1 = range_mm(span, (ba.a2, d), (w0 + bl.w1, f, 1), (ba.hpre, f), false);
        let then = Epilogue::Gelu {
            bias: w(bl.b1),
            act: u(ba.hact + span.0 * f),
            cdf: u(ba.cdf + span.0 * f),
            keep,
        };
        if !rec.matmul_then(p, w1, then) {
            rec.matmul(p, (WORK, MODEL), w1);
            let gelu = TfParams {
                z: u(ba.hpre),
                cdf: u(ba.cdf),
                act: u(ba.hact),
                bias: w(bl.b1),
                ..base
            };
            if f.is_multiple_of(4) {
                let entry = if keep { "bias_gelu4" } else { "bias_gelu4_act" };
                rec.tf(p, entry, gelu, count * f / 4);
            } else {
                rec.tf(p, "bias_gelu", gelu, count * f);
            }
        }
        let w2 = range_mm(span, (ba.hact, f), (w0 + bl.w2, d, 1), (at.x, d), true);
        self.record_then_ln(rec, (base, w2), next, (Some(w0 + bl.b2), keep));
    }

    /// `product` into the residual stream at the rows of `base`, then (`+ b` where `bias`,
    /// e.g. a block's b₂, and) the LayerNorm `ln` (outputs, gain) — in the product's own
    /// dispatch where the kernel allows (`Epilogue::Norm`), else a LayerNorm dispatch that adds
    /// `b` first ([`Self::record_ln`]'s fold).
    fn record_then_ln(
        &self,
        rec: &mut Recorder,
        (base, product): (TfParams, MatmulParams),
        ((y, xhat, rstd), gain): LnAt,
        (bias, keep): (Option<usize>, bool),
    ) {
        let (d, first) = (self.shape.d_model, base.r0 as usize);
        let u = |x: usize| x as u32;
        let then = Epilogue::Norm {
            bias: bias.map(u),
            gain: u(gain),
            y: u(y + first * d),
            xhat: u(xhat + first * d),
            rstd: u(rstd + first),
            keep,
        };
        if rec.matmul_then(&self.programs, product, then) {
            return;
        }
        rec.matmul(&self.programs, (WORK, MODEL), product);
        let fold = bias.map_or(Fold::Nothing, Fold::Bias);
        self.record_ln(rec, base, (y, xhat, rstd), gain, (fold, keep));
    }

    /// The teacher-forced pass of the weights at `model[w0..]` over every position, then each
    /// response token's log Z, log π and entropy at `1/inv_t`.
    fn record_forward(&self, rec: &mut Recorder, w0: usize, inv_t: f32) {
        let at = &self.plan_ref().at;
        let (d, v) = (self.shape.d_model, self.shape.vocab);
        self.record_blocks(rec, w0, (0, at.s), self.n - 1);
        // The head where a response token is predicted.
        let base = self.over(self.base(inv_t), (self.n - 1, at.s));
        let head = at.span((self.n - 1, at.s));
        let ww = (w0 + self.weights.head, v, 1);
        rec.matmul(
            &self.programs,
            (WORK, MODEL),
            range_mm(head, (at.af, d), ww, (at.logits, v), false),
        );
        rec.tf(&self.programs, "score", base, at.rows * at.t);
    }

    /// The backward of the policy's last pass from the coefficients in `coef` / `dcoef`: every
    /// weight's gradient into `grad` (the flat layout). As the forward, the head, the final
    /// LayerNorm and the last block past its keys and values run from position `n − 1` on: the
    /// rows before it get their gradient through the keys and values alone.
    fn record_backward(&self, rec: &mut Recorder, inv_t: f32, entropy: bool) {
        let at = &self.plan_ref().at;
        let s = &self.shape;
        let (d, v) = (s.d_model, s.vocab);
        let nr = at.live();
        let p = &self.programs;
        let base = self.base(inv_t);
        let u = |x: usize| x as u32;
        let g = |o: usize| at.grad + o;
        let wl = &self.weights;
        let dl = TfParams {
            y: u(at.dl),
            flags: entropy as u32,
            ..base
        };
        rec.tf(p, "dlogits", dl, nr);
        let out = self.over(base, (self.n - 1, at.s));
        let head = at.span((self.n - 1, at.s));
        debug_assert_eq!(head, (out.r0 as usize, out.rn as usize));
        let (head_w, lnf) = (((at.af, d), (at.dl, v), wl.head), (at.xhatf, at.rstdf));
        self.record_linear_ln_back(rec, out, head_w, None, (lnf, wl.lnf_g, false));
        self.record_clear(rec, at.dx, head.0 * d);
        let layers = wl.blocks.len();
        for (l, (bl, ba)) in wl.blocks.iter().zip(&at.blocks).enumerate().rev() {
            let here = if l + 1 == layers { out } else { base };
            self.record_block_back(rec, (bl, ba), here);
            // x += attention(LN₁(x))·W_o: the keys and values at every position
            let back = TfParams {
                ctx: u(at.dctx),
                att: u(ba.att),
                qkv: u(ba.qkv),
                z: u(at.ds),
                y: u(at.dqkv),
                ..base
            };
            rec.tf(p, self.attention("attn_back_q"), back, nr * s.heads);
            rec.tf(p, self.attention("attn_back_kv"), back, nr * s.heads);
            let all = (0, nr);
            debug_assert_eq!(all, (base.r0 as usize, base.rn as usize));
            let qkv = ((ba.a1, d), (at.dqkv, 3 * d), bl.wqkv);
            let ln1 = ((ba.xhat1, ba.rstd1), bl.ln1_g, true);
            self.record_linear_ln_back(rec, base, qkv, None, ln1);
        }
        // x = tok_emb[token] + pos_emb[position]: ∂tok_emb = onehot(tokens)ᵀ·dx, ∂pos_emb[p] =
        // Σ over position p's rows of dx; the positions past S get 0.
        let (a, b) = ((at.i_seq, 0, 1), (at.dx, d, 1));
        let one_hot = MatmulParams::single((v, d, nr), a, b, (g(wl.tok_emb), d), false);
        rec.matmul(p, (ONE_HOT, WORK), one_hot);
        let pos = TfParams {
            y: u(at.dx),
            z: u(g(wl.pos_emb)),
            ..base
        };
        // The positions past S get 0: in pos_grad4's dispatch, else a clear of the buffer.
        if d.is_multiple_of(4) {
            let mut all = pos;
            all.cols = u(s.context);
            rec.tf8(p, "pos_grad4", all, s.context * d / 4);
        } else {
            rec.tf(p, "pos_grad", pos, at.s * d);
            self.record_clear(rec, g(wl.pos_emb + at.s * d), (s.context - at.s) * d);
        }
    }

    /// A block's backward at the positions of `base` from dx down to d ctx (in `dctx`; 0 at
    /// the rows before them): `x += GELU(LN₂(x)·W₁ + b₁)·W₂ + b₂`, then `x += ctx·W_o`.
    fn record_block_back(
        &self,
        rec: &mut Recorder,
        (bl, ba): (&crate::engine::fused_transformer::BlockLayout, &BlockAt),
        base: TfParams,
    ) {
        let at = &self.plan_ref().at;
        let (d, f) = (self.shape.d_model, self.shape.d_ff);
        let span = (base.r0 as usize, base.rn as usize);
        let (first, count) = span;
        let u = |x: usize| x as u32;
        let g = |o: usize| at.grad + o;
        self.record_col_sum(rec, base, (at.dx + first * d, count, d), d, g(bl.b2));
        // dh = dx·W₂ᵀ times GELU's derivative: in the product's own dispatch where the kernel
        // allows, else a dispatch after it.
        let then = Epilogue::GeluBack {
            pre: u(ba.hpre + first * f),
            cdf: u(ba.cdf + first * f),
        };
        let w2 = ((ba.hact, f), (at.dx, d), bl.w2);
        if !self
            .record_linear_back(rec, span, w2, at.dh, (Some(then), None))
            .0
        {
            let gelu = TfParams {
                y: u(at.dh),
                z: u(ba.hpre),
                cdf: u(ba.cdf),
                ..base
            };
            if f.is_multiple_of(4) {
                rec.tf(&self.programs, "gelu_backward4", gelu, count * f / 4);
            } else {
                rec.tf(&self.programs, "gelu_backward", gelu, count * f);
            }
        }
        // ∂b₁ = Σ_t dh[t] in ∂W₁'s product where the kernel allows (its col_sum4 otherwise).
        let (w1, ln2) = (((ba.a2, d), (at.dh, f), bl.w1), (ba.xhat2, ba.rstd2));
        self.record_linear_ln_back(rec, base, w1, Some(bl.b1), (ln2, bl.ln2_g, true));
        let wo = ((ba.ctx, d), (at.dx, d), bl.wo);
        self.record_linear_back(rec, span, wo, at.dctx, (None, None));
        self.record_clear(rec, at.dctx, first * d);
    }

    /// Zeros into `work[at..at + len]`.
    fn record_clear(&self, rec: &mut Recorder, at: usize, len: usize) {
        if len > 0 {
            rec.ops.push(Op::Clear {
                buffer: self.plan_ref().work.clone(),
                offset: (at * 4) as u64,
                bytes: (len * 4) as u64,
            });
        }
    }

    /// The backward of `Y = X·W` over the flat rows `first..first + count` (`X [N, k]` at
    /// `x`, `dY [N, m]` at `dy`, `W [k, m]` at `model[w..]`): `∂W = Xᵀ·dY` into the gradient,
    /// `dX = dY·Wᵀ` into `dx`, followed by `then` in its own dispatch where given and the
    /// kernel allows, and `∂b = Σ_t dY[t]` into the gradient at `bias` in ∂W's product where
    /// given and it runs as `∂Wᵀ = dYᵀ·X` in place (its rows' sums of A). Returns whether
    /// `then` and `∂b` were done so (where not, the caller records what they stand for).
    fn record_linear_back(
        &self,
        rec: &mut Recorder,
        (first, nr): (usize, usize),
        ((x, k), (dy, m), w): ((usize, usize), (usize, usize), usize),
        dx: usize,
        (then, bias): (Option<Epilogue>, Option<usize>),
    ) -> (bool, bool) {
        let at = &self.plan_ref().at;
        let p = &self.programs;
        let (x, dy, dx) = (x + first * k, dy + first * m, dx + first * k);
        let dw = MatmulParams::single((k, m, nr), (x, 1, k), (dy, m, 1), (at.grad + w, m), false);
        // ∂Wᵀ = dYᵀ·X, C stored transposed.
        let dwt = MatmulParams {
            c_cs: m as u32,
            ..MatmulParams::single((m, k, nr), (dy, 1, m), (x, k, 1), (at.grad + w, 1), false)
        };
        let plan = self.plan_ref();
        // Through matmul_subgroup.wgsl with B read in place (all of N in one dispatch): B the
        // narrower of dY and X, or X where dY's rows do not start at quads (the head's logits).
        let transposed = m > k || !m.is_multiple_of(4);
        let in_place = if transposed { dwt } else { dw };
        // ∂b as the rows' sums of A = dYᵀ, where ∂Wᵀ runs in place.
        let sums = bias.filter(|_| transposed).map(|b| (at.grad + b) as u32);
        let in_work =
            (plan.window.as_ref()).is_some_and(|group| rec.matmul_b_work(p, group, in_place, sums));
        let done = in_work || self.record_dw_windows(rec, nr, (x, k), (dy, m), (dw, dwt));
        if !done {
            rec.matmul(p, (WORK, WORK), dw);
        }
        let summed = in_work && sums.is_some();
        let back = MatmulParams::single((nr, k, m), (dy, m, 1), (w, 1, m), (dx, k), false);
        if then.is_some_and(|e| rec.matmul_then(p, back, e)) {
            return (true, summed);
        }
        rec.matmul(p, (WORK, MODEL), back);
        (false, summed)
    }

    /// ∂W through matmul_window's windows (the kernels without `B_WORK`): the narrower of dY
    /// and X copied where the kernel reads B, in windows of its rows (the wider one's rows would
    /// make more, smaller windows): ∂W = Xᵀ·dY, or ∂Wᵀ = dYᵀ·X with C stored transposed. False
    /// (nothing recorded) where there is no such kernel.
    fn record_dw_windows(
        &self,
        rec: &mut Recorder,
        nr: usize,
        (x, k): (usize, usize),
        (dy, m): (usize, usize),
        (dw, dwt): (MatmulParams, MatmulParams),
    ) -> bool {
        let (windowed, (from, cols)) = if m > k { (dwt, (x, k)) } else { (dw, (dy, m)) };
        let plan = self.plan_ref();
        plan.scratch.as_ref().is_some_and(|(scratch, group)| {
            let b = MatmulParams {
                b: [0, cols as u32, 1, 0],
                ..windowed
            };
            let ops = rec.ops.len();
            rec.ops.push(Op::Copy {
                src: plan.work.clone(),
                src_off: (from * 4) as u64,
                dst: scratch.clone(),
                dst_off: 0,
                bytes: (nr * cols * 4) as u64,
            });
            let done = rec.windowed(&self.programs, group, b, None);
            if !done {
                rec.ops.truncate(ops);
            }
            done
        })
    }

    /// [`Self::record_linear_back`] of the rows of `base` with dX into `da`, then LayerNorm's
    /// backward there from `da` into `dx` (added to unless `add` is false: the first) — in the
    /// product's own dispatch where the kernel allows (`Epilogue::LnBack`), else a dispatch
    /// after it — and its ∂g and ∂b into the gradient (the gain at `model[gain..]`, the bias
    /// after it; the forward's x̂ and 1/σ at `xhat`, `rstd`).
    fn record_linear_ln_back(
        &self,
        rec: &mut Recorder,
        base: TfParams,
        linear: ((usize, usize), (usize, usize), usize),
        bias: Option<usize>,
        ((xhat, rstd), gain, add): ((usize, usize), usize, bool),
    ) {
        let at = &self.plan_ref().at;
        let u = |x: usize| x as u32;
        let (first, d) = (base.r0 as usize, self.shape.d_model);
        let then = Epilogue::LnBack {
            gain: u(gain),
            xhat: u(xhat + first * d),
            rstd: u(rstd + first),
            dx: u(at.dx + first * d),
            add,
        };
        // Only where dY is at most 64 wide (the head's): the epilogue needs whole rows in one
        // invocation, so the product runs on the one-row kernel, and past that its k loop
        // costs more than the dispatch saved (lavapipe, per supervised step of transformer-
        // sort: W₁'s dX, k = 256, 0.98 → 1.31 ms with the epilogue; W_qkv's, k = 192, 0.83 →
        // 0.82; the head's, k = 11, 0.40 → 0.24).
        let then = (linear.1.1 <= 64).then_some(then);
        let span = (first, base.rn as usize);
        let (fused, summed) = self.record_linear_back(rec, span, linear, at.da, (then, bias));
        if let (Some(b), false) = (bias, summed) {
            let ((_, _), (dy, m), _) = linear;
            self.record_col_sum(rec, base, (dy + first * m, span.1, m), m, at.grad + b);
        }
        // The backward's (no z) and the ∂g, ∂β sums' (into z; flags bit 1 for both at once).
        let params = TfParams {
            y: u(at.da),
            x: u(at.dx),
            xhat: u(xhat),
            rstd: u(rstd),
            gain: u(gain),
            z: u(at.grad + gain),
            flags: add as u32 | 2,
            ..base
        };
        let count = base.rn as usize;
        if d.is_multiple_of(4) && fused {
            rec.tf8(&self.programs, "ln_params4", params, d / 4);
        } else if d.is_multiple_of(4) {
            let wgs = count.div_ceil(64) + (d / 4).div_ceil(8);
            rec.tf(&self.programs, "ln_backward4", params, wgs * 64);
        } else {
            debug_assert!(!fused, "the epilogue takes whole quads");
            rec.tf(&self.programs, "ln_backward", params, count);
            rec.tf(&self.programs, "ln_params", params, d);
        }
    }

    /// `out[c] = Σ_{r < rows} src[r·stride + c]` for `c < cols` (`(src, rows, stride)`).
    fn record_col_sum(
        &self,
        rec: &mut Recorder,
        base: TfParams,
        (src, rows, stride): (usize, usize, usize),
        cols: usize,
        to: usize,
    ) {
        let u = |x: usize| x as u32;
        let params = TfParams {
            y: u(src),
            rows: u(rows),
            stride: u(stride),
            cols: u(cols),
            z: u(to),
            ..base
        };
        if [src, stride, cols].iter().all(|x| x.is_multiple_of(4)) {
            rec.tf8(&self.programs, "col_sum4", params, cols / 4);
        } else {
            rec.tf(&self.programs, "col_sum", params, cols);
        }
    }

    /// Run `rec` as one submission on the current plan and read back `(buffer, element offset,
    /// elements)` of each read (see [`Arrival`]).
    async fn run(
        &mut self,
        mut rec: Recorder,
        reads: &[(Reads, usize, usize)],
    ) -> Result<Vec<Vec<u8>>, EngineError> {
        let needed = rec.slots.len() as u64;
        if needed > self.plan_ref().slots {
            // More dispatches than planned (products cut into windows): a larger uniform
            // buffer, the bind groups over it, and the recorded window ops moved onto them.
            let plan = self.plan_ref();
            let scratch = plan.scratch.as_ref().map(|s| s.0.clone());
            let (uniform, group, window, scratch) =
                self.bind(needed, &plan.work, &plan.ints, scratch);
            let plan = self.plans[self.cur as usize].as_mut().expect("planned");
            let old = [plan.window.take(), plan.scratch.take().map(|s| s.1)];
            let new = [window.clone(), scratch.as_ref().map(|s| s.1.clone())];
            for op in &mut rec.ops {
                if let Op::Window { group, .. } = op
                    && let Some(i) = old.iter().position(|o| o.as_ref() == Some(group))
                    && let Some(g) = &new[i]
                {
                    *group = g.clone();
                }
            }
            (plan.uniform, plan.group, plan.window, plan.scratch) =
                (uniform, group, window, scratch);
            plan.slots = needed;
        }
        let plan = self.plan_ref();
        let device = &self.ctx.device;
        let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let uni: Vec<u8> = rec.slots.iter().flat_map(|s| s.slot_bytes()).collect();
        if !uni.is_empty() {
            self.ctx.queue.write_buffer(&plan.uniform, 0, &uni);
        }
        if std::env::var_os("GRPO_WGSL_PROFILE").is_some() {
            submit::profile(&self.ctx, &plan.group, &mut rec.ops, &rec.slots);
        }
        let mut encoder = device.create_command_encoder(&Default::default());
        let reads: Vec<_> = reads
            .iter()
            .map(|(which, at, len)| {
                let buffer = match which {
                    Reads::Ints => &plan.ints,
                    Reads::Model => &self.model,
                    Reads::Buffer(b) => b,
                    Reads::Work => &plan.work,
                };
                (buffer, *at, *len)
            })
            .collect();
        dispatch_all(&mut encoder, &plan.group, &rec.ops);
        let (staging, total, lens) = stage(device, &mut encoder, &reads);
        self.ctx.queue.submit([encoder.finish()]);
        self.submissions += 1;
        self.last_dispatches = rec.dispatches;
        if let Some(error) = crate::gpu::context::scope_error(scope.pop()) {
            return Err(EngineError::Kernel(KernelError::Readback(format!(
                "the device refused the submission: {error}"
            ))));
        }
        Arrival {
            staged: Some(Staged::map(staging, total, lens)),
            ctx: self.ctx.clone(),
            blocking: self.blocking,
        }
        .await
    }

    /// `log π` and the entropy at `temperature` of every response token (`[R·T]`; 0 after a
    /// row's end) under the policy or the reference: `prompts [B·n]`, `responses [B·g·T]`,
    /// row `r` holding `lens[r]` real tokens.
    #[allow(clippy::too_many_arguments)]
    pub async fn scores(
        &mut self,
        which: Which,
        prompts: &[u32],
        responses: &[u32],
        lens: &[usize],
        g: usize,
        t: usize,
        temperature: f32,
    ) -> Result<(Vec<f32>, Vec<f32>), EngineError> {
        if !(temperature.is_finite() && temperature > 0.0) {
            return Err(kerr("temperature", format!("{temperature}: must be > 0")));
        }
        self.upload(prompts, responses, lens, g, t)?;
        let inv_t = 1.0 / temperature;
        let w0 = match which {
            Which::Policy => 0,
            Which::Reference => self.params,
        };
        let mut rec = self.recorder();
        self.record_forward(&mut rec, w0, inv_t);
        let at = &self.plan_ref().at;
        let tokens = at.rows * at.t;
        let reads = [
            (Reads::Work, at.logp, tokens),
            (Reads::Work, at.ent, tokens),
        ];
        let out = self.run(rec, &reads).await?;
        self.policy_pass = (which == Which::Policy).then_some(inv_t);
        Ok((f32s(&out[0]), f32s(&out[1])))
    }

    /// Upload the coefficients `∂L/∂log π_t` (and `∂L/∂H_t`) of the policy's last pass
    /// ([`Self::scores`] of `Which::Policy`).
    fn upload_coefs(
        &mut self,
        dlogp: &[f32],
        dentropy: Option<&[f32]>,
    ) -> Result<f32, EngineError> {
        let Some(inv_t) = self.policy_pass else {
            return Err(kerr(
                "backward",
                "needs the policy's pass of the batch (scores of the policy) first",
            ));
        };
        self.cur = Slot::Pass;
        let at = &self.plan_ref().at;
        let tokens = at.rows * at.t;
        if dlogp.len() != tokens || dentropy.is_some_and(|e| e.len() != tokens) {
            return Err(kerr(
                "backward",
                format!("the coefficients must hold {tokens} values per token"),
            ));
        }
        let (q, work) = (&self.ctx.queue, &self.plan_ref().work);
        q.write_buffer(work, (at.coef * 4) as u64, &f32_bytes(dlogp));
        if let Some(e) = dentropy {
            q.write_buffer(work, (at.dcoef * 4) as u64, &f32_bytes(e));
        }
        Ok(inv_t)
    }

    /// `∇θ Σ_t (c_t·log π_t + e_t·H_t)` of the policy's last pass: every weight's gradient
    /// (the flat layout), read back.
    pub async fn gradient(
        &mut self,
        dlogp: &[f32],
        dentropy: Option<&[f32]>,
    ) -> Result<Vec<f32>, EngineError> {
        let inv_t = self.upload_coefs(dlogp, dentropy)?;
        let mut rec = self.recorder();
        self.record_backward(&mut rec, inv_t, dentropy.is_some());
        let grad = self.plan_ref().at.grad;
        let out = self.run(rec, &[(Reads::Work, grad, self.params)]).await?;
        Ok(f32s(&out[0]))
    }

    /// One optimizer step from the coefficients of the policy's last pass: the backward, the
    /// gradient's norm, the clip to `max_grad_norm` (0: none) and Adam at `lr`, in one
    /// submission. Returns the gradient's norm (before the clip). The update is skipped when
    /// the norm is not finite (as on the fused engine).
    pub async fn step(
        &mut self,
        dlogp: &[f32],
        dentropy: Option<&[f32]>,
        lr: f64,
        max_grad_norm: f32,
    ) -> Result<f32, EngineError> {
        let inv_t = self.upload_coefs(dlogp, dentropy)?;
        let at = self.plan_ref().at.clone();
        let mut rec = self.recorder();
        self.record_backward(&mut rec, inv_t, dentropy.is_some());
        let p = self.params;
        let adam = StepParams {
            lr: lr as f32,
            max_norm: max_grad_norm,
            ..self.adam_params(&at, self.time + 1)
        };
        rec.reduce(&self.programs, adam, at.grad, p, 1, 6, true);
        rec.step(&self.programs, "adam", adam, p.div_ceil(4));
        let out = self.run(rec, &[(Reads::Work, at.sums + 6, 1)]).await?;
        let norm = f32s(&out[0])[0].sqrt();
        self.policy_pass = None;
        // `adam` leaves the weights and the moments where the norm is not finite.
        if norm.is_finite() {
            self.time += 1;
        }
        Ok(norm)
    }

    /// Adam's parameters at step `time` (lecture_step.wgsl's `reduce_*` and `adam` on the
    /// gradient of `at`): the policy's weights and the run's moments; no clip, `lr` 0.
    fn adam_params(&self, at: &TfLayout, time: i32) -> StepParams {
        let (bc2, factor) = crate::objective::adam::corrections(&self.hyper, time);
        let p = self.params as u32;
        StepParams {
            grad_off: at.grad as u32,
            part_off: at.part as u32,
            sums_off: at.sums as u32,
            chunk: CHUNK as u32,
            p_count: p,
            w_off: 0,
            am_off: 2 * p,
            av_off: 3 * p,
            b1: self.hyper.beta1,
            b2: self.hyper.beta2,
            eps: self.hyper.eps,
            bc2,
            factor,
            ..Default::default()
        }
    }

    /// `parts` copies of the weights from `model[0..]` (policy, reference, Adam's m and v),
    /// read back.
    pub fn read_model(&self, parts: usize) -> Result<Vec<f32>, EngineError> {
        if cfg!(target_arch = "wasm32") {
            return Err(kerr(
                "read-back",
                "reading the weights back waits for the device, which a page cannot do",
            ));
        }
        let device = &self.ctx.device;
        let mut encoder = device.create_command_encoder(&Default::default());
        let reads = [(&self.model, 0, parts * self.params)];
        let (staging, total, lens) = stage(device, &mut encoder, &reads);
        self.ctx.queue.submit([encoder.finish()]);
        let out = Staged::map(staging, total, lens).wait(&self.ctx)?;
        Ok(f32s(&out[0]))
    }

    /// The policy's weights (the flat layout), read back.
    pub fn weights(&self) -> Result<Vec<f32>, EngineError> {
        self.read_model(1)
    }

    /// Elements of one copy of the weights.
    pub fn params(&self) -> usize {
        self.params
    }

    /// Adam's step count.
    pub fn adam_time(&self) -> i32 {
        self.time
    }

    /// Replace the policy, the reference and Adam's state (`m`, `v` and the step count).
    pub fn load(
        &mut self,
        policy: &[f32],
        reference: &[f32],
        (time, m, v): (i32, &[f32], &[f32]),
    ) -> Result<(), EngineError> {
        let p = self.params;
        if [policy.len(), reference.len(), m.len(), v.len()] != [p; 4] {
            return Err(kerr("snapshot", format!("expected {p} values per part")));
        }
        let all = [policy, reference, m, v].concat();
        self.ctx
            .queue
            .write_buffer(&self.model, 0, &f32_bytes(&all));
        self.time = time;
        self.policy_pass = None;
        Ok(())
    }

    /// The reference becomes a copy of the policy (a dispatch: a buffer cannot be copied onto
    /// itself).
    pub fn refresh_reference(&mut self) -> Result<(), EngineError> {
        let copy = StepParams {
            p_count: self.params as u32,
            w_off: 0,
            ref_off: self.params as u32,
            ..Default::default()
        };
        let mut rec = Recorder::default();
        rec.step(&self.programs, "copy_ref", copy, self.params);
        let (uniform, group) = &self.aux;
        let device = &self.ctx.device;
        let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let bytes: Vec<u8> = rec.slots.iter().flat_map(|s| s.slot_bytes()).collect();
        self.ctx.queue.write_buffer(uniform, 0, &bytes);
        let mut encoder = device.create_command_encoder(&Default::default());
        dispatch_all(&mut encoder, group, &rec.ops);
        self.ctx.queue.submit([encoder.finish()]);
        self.submissions += 1;
        match crate::gpu::context::scope_error(scope.pop()) {
            Some(error) => Err(EngineError::Kernel(KernelError::Readback(
                error.to_string(),
            ))),
            None => Ok(()),
        }
    }

    /// The supervised cold start, as [`FusedTransformer::supervised`]: per batch `(prompts
    /// [B·n], targets [B·T], T)` the mean cross-entropy of every position (padding included), a
    /// fresh Adam (its own moments, `model[4P..6P]`) at `lr`, no clip and no check that the
    /// gradient is finite (neither has the fused engine's); a submission per batch (the
    /// forward, the backward and Adam). Returns the last batch's loss.
    pub async fn supervised(
        &mut self,
        batches: &[(&[u32], &[u32], usize)],
        lr: f64,
    ) -> Result<f32, EngineError> {
        let p = self.params;
        let zeros = vec![0.0f32; 2 * p];
        self.ctx
            .queue
            .write_buffer(&self.model, (16 * p) as u64, &f32_bytes(&zeros));
        let mut last = 0.0f32;
        for (k, &(prompts, targets, t)) in batches.iter().enumerate() {
            let rows = targets.len() / t.max(1);
            self.upload(prompts, targets, &vec![t; rows], 1, t)?;
            let tokens = rows * t;
            let at = self.plan_ref().at.clone();
            let coef = vec![-1.0 / tokens as f32; tokens];
            let q = &self.ctx.queue;
            q.write_buffer(
                &self.plan_ref().work,
                (at.coef * 4) as u64,
                &f32_bytes(&coef),
            );
            let mut rec = self.recorder();
            self.record_forward(&mut rec, 0, 1.0);
            self.record_backward(&mut rec, 1.0, false);
            let adam = StepParams {
                am_off: 4 * p as u32,
                av_off: 5 * p as u32,
                // No clip and no finite check, as the fused engine's supervised Adam: no norm
                // (its sum took two dispatches, ~0.5 ms a step on lavapipe; its clear 0.06).
                max_norm: -1.0,
                lr: lr as f32,
                ..self.adam_params(&at, k as i32 + 1)
            };
            rec.step(&self.programs, "adam", adam, p.div_ceil(4));
            let reads: &[(Reads, usize, usize)] = if k + 1 == batches.len() {
                &[(Reads::Work, at.logp, tokens)]
            } else {
                &[]
            };
            let out = self.run(rec, reads).await?;
            if let Some(logp) = out.first() {
                let total: f64 = f32s(logp).iter().map(|&l| l as f64).sum();
                last = (-total / tokens as f64) as f32;
            }
        }
        self.policy_pass = None;
        Ok(last)
    }
}

impl Recorder {
    /// A dispatch of transformer.wgsl's `entry` over `count` invocations.
    fn tf(&mut self, p: &Programs, entry: &'static str, params: TfParams, count: usize) {
        self.tf_grid(p, entry, params, grid_1d(count));
    }

    /// [`Recorder::tf`] for the entries of 8-wide workgroups.
    fn tf8(&mut self, p: &Programs, entry: &'static str, params: TfParams, count: usize) {
        self.tf_grid(p, entry, params, submit::grid_of(count, 8));
    }

    fn tf_grid(
        &mut self,
        p: &Programs,
        entry: &'static str,
        params: TfParams,
        grid: (u32, u32, u32),
    ) {
        let slot = self.slots.len() as u32;
        self.slots.push(StepParamsOrMm::Tf(params));
        self.ops.push(Op::Step {
            pipeline: p.step[entry].clone(),
            slot,
            grid,
            label: entry,
        });
        self.dispatches += 1;
    }
}
