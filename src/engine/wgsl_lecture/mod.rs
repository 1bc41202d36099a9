//! The lecture model's WGSL engine: forward, loss, backward, grad-norm clip and Adam as
//! compute dispatches (`shaders/matmul.wgsl`, `shaders/lecture_step.wgsl`), rollouts with
//! the existing sampling kernel (`shaders/sample.wgsl`). The weights, the reference copy,
//! Adam's moments and every activation live in device buffers for the whole run.
//!
//! The products are taken in the order of [`super::fused_lecture`] (per-position tables,
//! gather, one product): on a GPU through a tiled product in workgroup memory, on a CPU
//! adapter (lavapipe) through register blocks without it ([`MatmulKernel`]).
//!
//! Submissions:
//! - a whole iteration ([`Engine::iteration`], what `grpo::iteration` asks where nothing in
//!   the iteration needs the host): **one submission** — the policy's forward, sampling,
//!   log π_old, the greedy answers, the reference's forward and log π_ref, the verifier
//!   (`sort_reward.wgsl`) and every advantage mode (`advantage.wgsl`), the driving mode's
//!   advantages copied into place, then μ × [`DISPATCHES_PER_STEP`] dispatches (forward →
//!   per-token loss and derivative → backward → grad norm → clip → Adam, μ times); one
//!   read-back of the tokens, log-probs, rewards, advantages, every step's scalars, the
//!   logged rows' log π and the policy's weights;
//! - otherwise (dynamic sampling's redraws, the KL in the reward) `sample` (with the verifier
//!   and the advantages when asked) and `steps` are a submission each, and
//!   `token_logp(Reference | Policy)` on the sampled batch come from the rollout's.
//!
//! The held-out greedy evaluation runs the fused CPU forward on the weights read back with
//! the steps (no submission of its own); a refreshed reference is one more submission.
//!
//! Held equal to the fused CPU step by `tests/wgsl_engine.rs`, kernel by kernel against
//! [`reference`] and as a whole engine.

use super::autodiff::{fused_restore, fused_snapshot, supervised_steps};
use super::fused_lecture::FusedLecture;
use super::{
    Advantages, Batch, DeviceScores, Engine, EngineError, IterationOutput, IterationRequest,
    SampleRequest, Samples, Snapshot, StepOutput, StepRequest, StepScalars, Which,
};
use crate::config::{KernelChoice, KlEstimator, LossMode, ModelKind, OptimizerConfig, RunConfig};
use crate::gpu::GpuContext;
use crate::gpu::kernels::{KernelError, Kernels};
use crate::model::Policy;
use crate::model::lecture::{LecturePolicy, LectureWeights};
use crate::objective::loss::LossSettings;
use burn::tensor::Device;
use std::collections::HashMap;
use std::sync::Arc;

mod harness;
mod iteration;
mod programs;
pub mod reference;
mod steps;
mod submit;
pub mod transformer;
mod transformer_engine;

pub use harness::{HarnessOp, KernelHarness};
use programs::{step_bind_group, window_bind_group};
pub use submit::Epilogue;
use submit::{dispatch_all, grid_1d, stage};
pub use transformer_engine::WgslTransformerEngine;

const COMMON: &str = include_str!("../../../shaders/common.wgsl");
const SAMPLE: &str = include_str!("../../../shaders/sample.wgsl");
const MATMUL: &str = include_str!("../../../shaders/matmul.wgsl");
const MATMUL_SUBGROUP: &str = include_str!("../../../shaders/matmul_subgroup.wgsl");
const STEP: &str = include_str!("../../../shaders/lecture_step.wgsl");
const TRANSFORMER: &str = include_str!("../../../shaders/transformer.wgsl");

/// Dispatches in one optimizer step: forward (4), the per-row pass (log Z, per-token terms,
/// dlogits), backward (7 products), two reductions (2 each), Adam.
pub const DISPATCHES_PER_STEP: usize = 17;
/// Dispatches in one `sample` submission: the policy's forward (4), sampling (2), its row
/// statistics, log π_old, greedy, the reference's forward (4), its row statistics and log π_ref.
pub const DISPATCHES_PER_SAMPLE: usize = 15;

/// Optimizer steps one submission takes at most (`steps` splits longer runs).
pub const MAX_STEPS_PER_SUBMISSION: usize = 64;

/// Bytes of one uniform slot (one dispatch's parameters); a multiple of every adapter's
/// `min_uniform_buffer_offset_alignment` (WebGPU's limit is at most 256).
const SLOT: u64 = 256;
/// Elements one reduction workgroup sums (256 invocations × 16).
const CHUNK: usize = 4096;
/// Stats channels the step reduces: loss term, KL, ratio, clipped low, clipped high, entropy.
const CHANNELS: usize = 6;

fn kerr(what: &'static str, reason: impl std::fmt::Display) -> EngineError {
    EngineError::Kernel(KernelError::Input {
        what,
        reason: reason.to_string(),
    })
}

/// The matrix-product parameters (`Mm` in matmul.wgsl).
#[derive(Debug, Clone, Copy, Default)]
pub struct MatmulParams {
    pub m: u32,
    pub n: u32,
    pub k: u32,
    pub batch: u32,
    /// `(offset, row stride, column stride, batch stride)` of A and B.
    pub a: [u32; 4],
    pub b: [u32; 4],
    /// `(offset, row stride, batch stride)` of C.
    pub c: [u32; 3],
    pub accumulate: bool,
    /// `C (+)= Σ_z A[z]·B[z]` instead of one C per z.
    pub reduce: bool,
    /// C's column stride where `batch` is 1 (0 or 1: contiguous). Larger: C stored
    /// transposed (flag bit 2; `c[2]` is not read; one product: `batch` 1).
    pub c_cs: u32,
}

impl MatmulParams {
    /// One product `C = A·B` over flat views: `(offset, row stride, column stride)` of A and
    /// B, `(offset, row stride)` of C (row-major).
    pub fn single(
        (m, n, k): (usize, usize, usize),
        a: (usize, usize, usize),
        b: (usize, usize, usize),
        c: (usize, usize),
        accumulate: bool,
    ) -> Self {
        let u = |x: usize| x as u32;
        Self {
            m: u(m),
            n: u(n),
            k: u(k),
            batch: 1,
            a: [u(a.0), u(a.1), u(a.2), 0],
            b: [u(b.0), u(b.1), u(b.2), 0],
            c: [u(c.0), u(c.1), 0],
            accumulate,
            reduce: false,
            c_cs: 0,
        }
    }

    fn words(&self) -> [u32; 16] {
        let by_columns = self.c_cs > 1;
        debug_assert!(!by_columns || self.batch <= 1);
        let flags = self.accumulate as u32 | (self.reduce as u32) << 1 | (by_columns as u32) << 2;
        let (a, b, mut c) = (self.a, self.b, self.c);
        if by_columns {
            c[2] = self.c_cs;
        }
        [
            self.m, self.n, self.k, self.batch, a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3],
            c[0], c[1], c[2], flags,
        ]
    }
}

/// `Lp` of lecture_step.wgsl: shapes, element offsets, loss and optimizer settings.
#[derive(Debug, Clone, Copy, Default)]
#[repr(C)]
pub struct StepParams {
    pub b: u32,
    pub g: u32,
    pub n: u32,
    pub v: u32,
    pub d: u32,
    pub tokens: u32,
    pub rows: u32,
    pub count: u32,
    pub w_off: u32,
    pub t_off: u32,
    pub m_off: u32,
    pub enc_off: u32,
    pub logits_off: u32,
    pub logz_off: u32,
    pub ent_off: u32,
    pub adv_off: u32,
    pub out_off: u32,
    pub coef_off: u32,
    pub stats_off: u32,
    pub dl_off: u32,
    pub denc_off: u32,
    pub dt_off: u32,
    pub grad_off: u32,
    pub part_off: u32,
    pub sums_off: u32,
    pub src_off: u32,
    pub i_prompts: u32,
    pub i_tokens: u32,
    pub i_greedy: u32,
    pub p_count: u32,
    pub am_off: u32,
    pub av_off: u32,
    pub ref_off: u32,
    pub old_off: u32,
    pub rf_off: u32,
    pub mode: u32,
    pub estimator: u32,
    pub kl_on: u32,
    pub square: u32,
    pub chunk: u32,
    pub nchunks: u32,
    pub channels: u32,
    pub _u0: u32,
    pub _u1: u32,
    pub inv_t: f32,
    pub cw: f32,
    pub beta: f32,
    pub lo: f32,
    pub hi: f32,
    pub lr: f32,
    pub b1: f32,
    pub b2: f32,
    pub eps: f32,
    pub bc2: f32,
    pub factor: f32,
    pub max_norm: f32,
    pub dual_clip: f32,
    pub delta: f32,
    pub cispo_cap: f32,
    pub tau_pos: f32,
    pub tau_neg: f32,
    pub _f0: f32,
    pub _f1: f32,
    pub _f2: f32,
}

/// Where everything sits in the `work` buffer (element offsets) for one batch shape.
#[derive(Debug, Clone, Copy, Default)]
struct Layout {
    b: usize,
    g: usize,
    t: usize,
    m: usize,
    enc: usize,
    logits: usize,
    logz: usize,
    ent: usize,
    adv: usize,
    old: usize,
    rf: usize,
    logp: usize,
    coef: usize,
    stats: usize,
    dl: usize,
    dm: usize,
    denc: usize,
    dt: usize,
    grad: usize,
    part: usize,
    sums: usize,
    len: usize,
    // in `ints`
    i_prompts: usize,
    i_tokens: usize,
    i_greedy: usize,
    ints: usize,
}

impl Layout {
    fn new(b: usize, g: usize, v: usize, n: usize, d: usize, params: usize) -> Self {
        let (rows, tokens) = (b * n, b * g * n);
        let mut at = 0usize;
        // Every region from a multiple of 4 elements (the vector paths of matmul.wgsl).
        let mut take = |len: usize| {
            let here = at;
            at = (at + len.max(1)).next_multiple_of(4);
            here
        };
        let mut l = Layout {
            b,
            g,
            ..Default::default()
        };
        l.t = take(v * n * d);
        l.m = take(d * n * v);
        l.enc = take(b * d);
        l.logits = take(rows * v);
        l.logz = take(rows);
        l.ent = take(rows);
        l.adv = take(b * g);
        l.old = take(tokens);
        l.rf = take(tokens);
        l.logp = take(tokens);
        l.coef = take(tokens);
        l.stats = take(CHANNELS * tokens);
        l.dl = take(rows * v);
        l.dm = take(d * n * v);
        l.denc = take(b * d);
        l.dt = take(v * n * d);
        l.grad = take(params);
        l.part = take(CHANNELS * tokens.max(params).div_ceil(CHUNK));
        l.sums = take(8 * MAX_STEPS_PER_SUBMISSION);
        l.len = at;
        l.i_prompts = 0;
        l.i_tokens = rows;
        l.i_greedy = rows + tokens;
        l.ints = 2 * rows + tokens;
        l
    }
}

/// One recorded operation of a submission.
enum Op {
    /// A dispatch of `pipeline` with the uniform slot `slot`, `grid` workgroups.
    Step {
        pipeline: wgpu::ComputePipeline,
        slot: u32,
        grid: (u32, u32, u32),
        label: &'static str,
    },
    /// A dispatch of sample.wgsl on its bind group.
    Sample {
        pipeline: wgpu::ComputePipeline,
        grid: (u32, u32, u32),
        group: wgpu::BindGroup,
    },
    Copy {
        src: wgpu::Buffer,
        src_off: u64,
        dst: wgpu::Buffer,
        dst_off: u64,
        bytes: u64,
    },
    /// A dispatch of `matmul_window` on its bind group: the uniform slot `slot` and the
    /// model-buffer window from byte `window`.
    Window {
        pipeline: wgpu::ComputePipeline,
        slot: u32,
        window: u32,
        grid: (u32, u32, u32),
        group: wgpu::BindGroup,
    },
    /// `bytes` zeros into `buffer` from byte `offset` (the backward's rows that get no
    /// gradient from above).
    Clear {
        buffer: wgpu::Buffer,
        offset: u64,
        bytes: u64,
    },
    /// Commands encoded elsewhere (the verifier and the advantage kernels of `gpu::kernels`),
    /// between the recorded ones, in the same submission.
    Commands(wgpu::CommandBuffer),
}

/// The compiled pipelines (once per engine).
struct Programs {
    layout: wgpu::BindGroupLayout,
    /// `matmul` per (A source, B source): 0 model, 1 work.
    matmul: HashMap<(u32, u32), wgpu::ComputePipeline>,
    step: HashMap<&'static str, wgpu::ComputePipeline>,
    sample_layout: wgpu::BindGroupLayout,
    row_weights: wgpu::ComputePipeline,
    draw: wgpu::ComputePipeline,
    /// The matmul tile edge (workgroup edge × 4) of [`MatmulKernel::Tiled`].
    tile: u32,
    kernel: MatmulKernel,
    /// The window products' pipelines ([`MatmulKernel::Window`], `WindowSubgroup`) and their
    /// bind group layout.
    window: Option<WindowPrograms>,
}

struct WindowPrograms {
    layout: wgpu::BindGroupLayout,
    device: wgpu::Device,
    /// The window kernels' module, the one-row entry point and their pipeline layout.
    module: wgpu::ShaderModule,
    entry: &'static str,
    pipeline_layout: wgpu::PipelineLayout,
    /// Per `EPI` (0 … 6; or 7: none, B read in place, `B_WORK`) × 24 + two rows (0, 1) × 12 +
    /// `WHOLE` (0, 1) × 6 + `VEC_K` (0, 1) × 3 + `VEC_B` (0, 1, 2) (see `submit::window_modes`),
    /// each built on its first use ([`WindowPrograms::index`], [`WindowPrograms::pipeline`]).
    pipelines: Vec<std::sync::OnceLock<wgpu::ComputePipeline>>,
    /// Columns of C per workgroup (`WIN_COLS` 32, `SG_COLS` 64 of matmul_subgroup.wgsl).
    cols: u32,
    /// Whether the kernels are matmul_subgroup.wgsl's: `matmul_window_subgroup`, and
    /// `matmul_window_subgroup2` (two rows of C per invocation, `SG2_COLS` 32 columns per
    /// workgroup) for products of more than 64 rows.
    subgroup: bool,
    /// The alignment of a window's start, in elements.
    align: usize,
}

/// Which matrix-product kernel of matmul.wgsl the engine runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatmulKernel {
    /// `matmul`: tiles through workgroup memory (GPUs).
    Tiled,
    /// `matmul_rows`: register blocks of [`MATMUL_ROWS`] × 4 outputs per invocation, no
    /// workgroup memory (CPU adapters such as lavapipe: 4× the tiled kernel there, measured).
    Rows,
    /// `matmul_rows`, and `matmul_window` for the products of activations (A in `work`) by
    /// weights (B in `model`) — B read through a uniform window of the model buffer. CPU
    /// adapters, for the transformer: ~3.5× `matmul_rows` on its products (lavapipe).
    Window,
    /// [`MatmulKernel::Window`] through `matmul_window_subgroup` (shaders/matmul_subgroup.wgsl):
    /// each lane loads one quad of B's row and broadcasts it to the subgroup. CPU adapters with
    /// subgroups of 8 or more invocations (lavapipe on AVX2); bit-identical to `Window`.
    WindowSubgroup,
}

/// Elements of `matmul_window`'s uniform window (64 KiB: WebGPU's default binding limit).
const WINDOW_ELEMS: usize = 16_384;

/// Rows of C per invocation of `matmul_rows` (`ROWS` in matmul.wgsl).
pub const MATMUL_ROWS: u32 = 8;
/// Invocations per workgroup of `matmul_rows` (`ROWS_WG` in matmul.wgsl).
const MATMUL_ROWS_WG: usize = 16;

impl MatmulKernel {
    /// The kernel for an adapter: [`MatmulKernel::Rows`] on a CPU adapter.
    pub fn for_adapter(cpu_adapter: bool) -> Self {
        if cpu_adapter { Self::Rows } else { Self::Tiled }
    }

    fn entry(self) -> &'static str {
        match self {
            Self::Tiled => "matmul",
            Self::Rows | Self::Window | Self::WindowSubgroup => "matmul_rows",
        }
    }

    /// The kernel for the transformer's products on `ctx`: the products by weights through
    /// uniform windows on a CPU adapter, with subgroup broadcasts where its subgroups allow
    /// (`GRPO_WGSL_SUBGROUPS=0` keeps them off, to compare).
    pub fn for_transformer(ctx: &GpuContext) -> Self {
        match Self::for_adapter(ctx.summary.is_software()) {
            Self::Rows if Self::subgroups_allow(ctx) => Self::WindowSubgroup,
            Self::Rows => Self::Window,
            other => other,
        }
    }

    /// Whether `ctx` runs `matmul_window_subgroup`: subgroups of at least 8 invocations (a
    /// native adapter; WebGPU's WGSL would need `enable subgroups;`, which naga does not parse
    /// yet), unless `GRPO_WGSL_SUBGROUPS=0`.
    pub fn subgroups_allow(ctx: &GpuContext) -> bool {
        let off = std::env::var("GRPO_WGSL_SUBGROUPS").is_ok_and(|v| v == "0");
        !cfg!(target_arch = "wasm32")
            && !off
            && ctx.summary.subgroup_sizes.is_some_and(|(lo, _)| lo >= 8)
    }
}

const STEP_ENTRIES: [&str; 10] = [
    "gather_enc",
    "scatter_dt",
    "row_stats",
    "gather_logp",
    "row_step",
    "argmax",
    "reduce_partial",
    "reduce_final",
    "adam",
    "copy_ref",
];

/// The entry points of transformer.wgsl (their parameters are [`transformer::TfParams`]).
const TRANSFORMER_ENTRIES: [&str; 29] = [
    "embed",
    "layer_norm",
    "attention",
    "attention4",
    "bias_gelu",
    "add_bias",
    "score",
    "dlogits",
    "ln_backward",
    "ln_params",
    "col_sum",
    "pos_grad",
    "gelu_backward",
    "attn_back_q",
    "attn_back_kv",
    "attn_back_q4",
    "attn_back_kv4",
    "bias_gelu4",
    "gelu_backward4",
    "layer_norm4",
    "expand",
    "place",
    "ln_backward4",
    "ln_params4",
    "col_sum4",
    "pos_grad4",
    "layer_norm4_y",
    "attention4_ctx",
    "bias_gelu4_act",
];

/// The matmul workgroup edge for an adapter: 8×8 invocations (a 32×32 tile, 4 KiB of
/// workgroup memory: within WebGPU's default limits, and the faster choice on CPU adapters
/// such as lavapipe, measured), or 16×16 (a 64×64 tile, 8 KiB) on a GPU whose limits allow it.
pub fn matmul_workgroup_edge(limits: &wgpu::Limits, cpu_adapter: bool) -> u32 {
    let fits = |wg: u32| {
        let tile = wg * 4;
        limits.max_compute_invocations_per_workgroup >= wg * wg
            && limits.max_compute_workgroup_size_x >= wg
            && limits.max_compute_workgroup_size_y >= wg
            && limits.max_compute_workgroup_storage_size >= 2 * tile * 16 * 4
    };
    if !cpu_adapter && fits(16) { 16 } else { 8 }
}

fn fits_min(l: &wgpu::Limits) -> bool {
    l.max_compute_workgroup_size_x >= 64 && l.max_compute_invocations_per_workgroup >= 256
}

/// The buffers of one batch shape, and their bind groups.
struct Plan {
    layout: Layout,
    work: wgpu::Buffer,
    ints: wgpu::Buffer,
    uniform: wgpu::Buffer,
    slots: u64,
    group: wgpu::BindGroup,
    sample_params: wgpu::Buffer,
    sample_logits: wgpu::Buffer,
    sample_tokens: wgpu::Buffer,
    sample_group: wgpu::BindGroup,
}

/// The lecture model on the device.
pub struct WgslLectureEngine {
    ctx: Arc<GpuContext>,
    programs: Programs,
    vocab: usize,
    n: usize,
    d: usize,
    /// Elements of one copy of the weights.
    params: usize,
    /// `[policy | reference | Adam m | Adam v]`, each `params` long, laid out as
    /// `FusedLecture`'s `[embedding | encode | decode_t]`.
    model: wgpu::Buffer,
    plan: Option<Plan>,
    /// Adam's step count.
    time: i32,
    beta1: f32,
    beta2: f32,
    eps: f32,
    optimizer: OptimizerConfig,
    /// Shapes and conversions on the host (never stepped).
    host: FusedLecture,
    /// What the device holds, as the host last wrote or read it: prompts and tokens in
    /// `ints`, advantages and log π_old / log π_ref in `work`.
    dev_prompts: Vec<u32>,
    dev_tokens: Vec<u32>,
    dev_adv: Vec<f32>,
    dev_old: Vec<f32>,
    dev_ref: Vec<f32>,
    /// The temperature `dev_old` / `dev_ref` were computed at, and whether `dev_old` is still
    /// the current policy's (no step since).
    logp_temperature: f32,
    old_is_current: bool,
    /// Submissions so far (for `bench`).
    submissions: std::sync::atomic::AtomicUsize,
    /// The policy's weights as the device holds them, when the host has a fresh copy (read
    /// back with the μ steps' scalars, so evaluation needs no submission of its own).
    host_weights: Option<Vec<f32>>,
    /// The verifier and the advantage kernels (`gpu::kernels`), on the same device.
    verify: Kernels,
    /// Dispatches in the last rollout (with or without verifying).
    rollout_dispatches: usize,
    /// The iteration submitted and not yet read back (only in a browser).
    in_flight: Option<InFlight>,
}

impl WgslLectureEngine {
    /// Whether this engine computes exactly what the config asks: the lecture model without a
    /// bug-gallery switch and without the entropy bonus (as the fused CPU step).
    pub fn covers(c: &RunConfig) -> bool {
        Self::uncovered(c).is_none()
    }

    /// Why a config is not this engine's, in words (`None`: it is).
    pub fn uncovered(c: &RunConfig) -> Option<&'static str> {
        let a = &c.algorithm;
        if c.model.kind != ModelKind::Lecture {
            Some("it trains the lecture model only")
        } else if a.bugs.any() {
            Some("the bug gallery's switches are not in its kernels")
        } else if a.entropy_bonus() {
            Some("the entropy bonus is not in its loss kernel")
        } else if a.top_entropy_quantile < 1.0 {
            Some(
                "the top-entropy rule needs a quantile over the whole batch's token entropies before any token's term",
            )
        } else if c.run.kernels == KernelChoice::Reference {
            Some("run.kernels = reference asks for the Rust kernels")
        } else if a.advantage == crate::config::AdvantageMode::Gae {
            Some("PPO's per-token advantages (GAE) are not in its loss kernel")
        } else if a.cov_penalty != crate::config::CovPenalty::None {
            Some(
                "the covariance rules (Clip-Cov, KL-Cov) pick tokens by a statistic of the whole batch before any token's term",
            )
        } else if a.advantage == crate::config::AdvantageMode::ReinforcePp && a.gamma < 1.0 {
            Some(
                "REINFORCE++ with algorithm.gamma < 1 gives each token its own advantage, which its loss kernel does not take",
            )
        } else if a.max_staleness > 0 {
            Some("stale rollouts (algorithm.max_staleness) sample from kept weights on the host")
        } else if c.run.entropy_dynamics {
            Some(
                "run.entropy_dynamics needs every token's log π and the entropy after each step on the host, and its steps read back only the logged rows",
            )
        } else if a.is_correction != crate::config::IsCorrection::None || a.unbiased_kl {
            Some(
                "the mismatch lab's corrections (algorithm.is_correction, unbiased_kl) are not in its loss kernel",
            )
        } else if c.sampling.sampler_precision == crate::config::SamplerPrecision::Bf16
            || c.sampling.learner_scores == crate::config::LearnerScores::Full
        {
            Some(
                "its rollout kernels draw from the f32 logits the learner scores (sampling.sampler_precision = bf16 and learner_scores = full are host-side gaps)",
            )
        } else if c.sampling.keep_sampling_mask {
            Some(
                "sampling.keep_sampling_mask: its softmax kernels score the full vocabulary and its rollout kernels return no support",
            )
        } else if LossSettings::of(c).sequence_ratio() {
            Some(
                "a sequence-level ratio (GSPO, GSPO-token, GMPO) needs each response's mean log-ratio before any token's term, and its step kernel computes a (prompt, position) row's tokens in one pass",
            )
        } else {
            None
        }
    }

    pub fn new(c: &RunConfig, ctx: Arc<GpuContext>) -> Result<Self, EngineError> {
        let (t, m) = (&c.task, &c.model);
        let w = LectureWeights::init(t.vocab, t.n, m.d_model, m.init_scale, c.run.seed);
        let host = FusedLecture::new(&w, t.vocab, t.n, m.d_model, c);
        let programs = Programs::new(&ctx, MatmulKernel::for_adapter(ctx.summary.is_software()))?;
        let verify = Kernels::new(ctx.clone())?;
        let params = host.embedding.len() + host.encode.len() + host.decode_t.len();
        let model = Self::storage(&ctx, "wgsl_lecture.model", 4 * params)?;
        let o = &c.optimizer;
        let mut e = Self {
            ctx,
            programs,
            vocab: t.vocab,
            n: t.n,
            d: m.d_model,
            params,
            model,
            plan: None,
            time: 0,
            beta1: o.beta1 as f32,
            beta2: o.beta2 as f32,
            eps: o.eps as f32,
            optimizer: o.clone(),
            host,
            dev_prompts: Vec::new(),
            dev_tokens: Vec::new(),
            dev_adv: Vec::new(),
            dev_old: Vec::new(),
            dev_ref: Vec::new(),
            logp_temperature: f32::NAN,
            old_is_current: false,
            submissions: Default::default(),
            host_weights: None,
            verify,
            rollout_dispatches: DISPATCHES_PER_SAMPLE,
            in_flight: None,
        };
        let flat = e.host_flat();
        let zeros = vec![0.0f32; 2 * params];
        let all = [flat.clone(), flat, zeros].concat();
        e.ctx.queue.write_buffer(&e.model, 0, &f32_bytes(&all));
        e.host_weights = Some(e.host_flat());
        Ok(e)
    }

    fn host_flat(&self) -> Vec<f32> {
        let h = &self.host;
        [&h.embedding[..], &h.encode, &h.decode_t].concat()
    }

    fn storage(ctx: &GpuContext, name: &str, elems: usize) -> Result<wgpu::Buffer, EngineError> {
        let bytes = (elems.max(4) * 4) as u64;
        let limits = ctx.device.limits();
        let limit = limits
            .max_storage_buffer_binding_size
            .min(limits.max_buffer_size);
        if bytes > limit {
            return Err(EngineError::Kernel(KernelError::TooLarge {
                buffer: name.into(),
                requested: bytes,
                limit,
                limit_name: "max_storage_buffer_binding_size",
            }));
        }
        Ok(ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(name),
            size: bytes.next_multiple_of(256),
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::UNIFORM
                | wgpu::BufferUsages::COPY_DST
                | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        }))
    }

    /// The plan for `b` prompts × `g` responses (built when the shape changes).
    fn plan(&mut self, b: usize, g: usize) -> Result<(), EngineError> {
        if let Some(p) = &self.plan
            && p.layout.b == b
            && p.layout.g == g
        {
            return Ok(());
        }
        let (v, n, d) = (self.vocab, self.n, self.d);
        let layout = Layout::new(b, g, v, n, d, self.params);
        if layout.len >= u32::MAX as usize / 2 {
            return Err(kerr("batch", "too large for 32-bit offsets"));
        }
        let ctx = self.ctx.clone();
        let device = &ctx.device;
        let work = Self::storage(&ctx, "wgsl_lecture.work", layout.len)?;
        let ints = Self::storage(&ctx, "wgsl_lecture.ints", layout.ints)?;
        let sample_logits = Self::storage(&ctx, "wgsl_lecture.sample_logits", b * n * v)?;
        let sample_weights = Self::storage(&ctx, "wgsl_lecture.sample_weights", b * n * v)?;
        let sample_tokens = Self::storage(&ctx, "wgsl_lecture.sample_tokens", b * g * n)?;
        let slots = (DISPATCHES_PER_STEP * MAX_STEPS_PER_SUBMISSION + 32) as u64;
        let uniform = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("wgsl_lecture.uniform"),
            size: slots * SLOT,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let sample_params = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("wgsl_lecture.sample_params"),
            size: 64,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let group = step_bind_group(
            device,
            &self.programs.layout,
            "wgsl_lecture",
            [&uniform, &self.model, &work, &ints],
        );
        let sample_group = device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("sample.wgsl"),
            layout: &self.programs.sample_layout,
            entries: &[
                wgpu::BindGroupEntry {
                    binding: 0,
                    resource: sample_params.as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 1,
                    resource: sample_logits.as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 2,
                    resource: sample_weights.as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 3,
                    resource: sample_tokens.as_entire_binding(),
                },
            ],
        });
        self.plan = Some(Plan {
            layout,
            work,
            ints,
            uniform,
            slots,
            group,
            sample_params,
            sample_logits,
            sample_tokens,
            sample_group,
        });
        self.dev_prompts.clear();
        self.dev_tokens.clear();
        self.dev_adv.clear();
        self.dev_old.clear();
        self.dev_ref.clear();
        self.old_is_current = false;
        Ok(())
    }

    /// The step parameters every dispatch starts from.
    fn base_params(&self, l: &Layout) -> StepParams {
        let (n, v, d) = (self.n, self.vocab, self.d);
        let p = self.params;
        StepParams {
            b: l.b as u32,
            g: l.g as u32,
            n: n as u32,
            v: v as u32,
            d: d as u32,
            tokens: (l.b * l.g * n) as u32,
            rows: (l.b * n) as u32,
            t_off: l.t as u32,
            m_off: l.m as u32,
            enc_off: l.enc as u32,
            logits_off: l.logits as u32,
            logz_off: l.logz as u32,
            ent_off: l.ent as u32,
            adv_off: l.adv as u32,
            out_off: l.logp as u32,
            coef_off: l.coef as u32,
            stats_off: l.stats as u32,
            dl_off: l.dl as u32,
            denc_off: l.denc as u32,
            dt_off: l.dt as u32,
            grad_off: l.grad as u32,
            part_off: l.part as u32,
            sums_off: l.sums as u32,
            i_prompts: l.i_prompts as u32,
            i_tokens: l.i_tokens as u32,
            i_greedy: l.i_greedy as u32,
            p_count: p as u32,
            ref_off: p as u32,
            am_off: 2 * p as u32,
            av_off: 3 * p as u32,
            old_off: l.old as u32,
            rf_off: l.rf as u32,
            chunk: CHUNK as u32,
            channels: CHANNELS as u32,
            inv_t: 1.0,
            lo: 1.0,
            hi: 1.0,
            ..Default::default()
        }
    }

    /// Upload `data` to `ints` at `at` if the device does not hold it already.
    fn sync_ints(&self, plan: &Plan, cached: &mut Vec<u32>, data: &[u32], at: usize) {
        if cached.as_slice() != data {
            self.ctx
                .queue
                .write_buffer(&plan.ints, (at * 4) as u64, &u32_bytes(data));
            cached.clear();
            cached.extend_from_slice(data);
        }
    }

    fn sync_work(&self, plan: &Plan, cached: &mut Vec<f32>, data: &[f32], at: usize) {
        let same = cached.len() == data.len()
            && cached
                .iter()
                .zip(data)
                .all(|(a, b)| a.to_bits() == b.to_bits());
        if !same {
            self.ctx
                .queue
                .write_buffer(&plan.work, (at * 4) as u64, &f32_bytes(data));
            cached.clear();
            cached.extend_from_slice(data);
        }
    }

    fn check_tokens(&self, tokens: &[u32], what: &'static str) -> Result<(), EngineError> {
        match tokens.iter().find(|&&t| t as usize >= self.vocab) {
            Some(t) => Err(kerr(
                what,
                format!("token {t} is outside the vocabulary (0..{})", self.vocab),
            )),
            None => Ok(()),
        }
    }

    fn check_batch(&self, batch: &Batch) -> Result<(), EngineError> {
        let (b, g, n) = (batch.b, batch.g, self.n);
        if b == 0 || g == 0 {
            return Err(kerr("batch", "no prompts or no responses"));
        }
        if batch.prompts.len() != b * n || batch.responses.len() != b * g * n || batch.t != n {
            return Err(kerr(
                "batch",
                format!(
                    "expected {b} prompts of {n} tokens and {} responses of {n}, got {} prompt tokens, {} response tokens (T = {})",
                    b * g,
                    batch.prompts.len(),
                    batch.responses.len(),
                    batch.t
                ),
            ));
        }
        self.check_tokens(&batch.prompts, "prompts")?;
        self.check_tokens(&batch.responses, "responses")
    }

    /// The forward of the weights at `w0` (0 policy, `params` reference) into `logits`.
    fn record_forward(&self, rec: &mut Recorder, base: &StepParams, w0: usize) {
        let (v, n, d) = (self.vocab, self.n, self.d);
        let l = &self.plan.as_ref().expect("planned").layout;
        let (vd, ndd) = (v * d, n * d * d);
        let u = |x: usize| x as u32;
        // T_p = E · encode_p, side by side: T [V, n·D].
        rec.matmul(
            &self.programs,
            (0, 0),
            MatmulParams {
                m: u(v),
                n: u(d),
                k: u(d),
                batch: u(n),
                a: [u(w0), u(d), 1, 0],
                b: [u(w0 + vd), u(d), 1, u(d * d)],
                c: [u(l.t), u(n * d), u(d)],
                ..Default::default()
            },
        );
        // M_p = decode_p · Eᵀ: M [D, n·V].
        rec.matmul(
            &self.programs,
            (0, 0),
            MatmulParams {
                m: u(d),
                n: u(v),
                k: u(d),
                batch: u(n),
                a: [u(w0 + vd + ndd), u(n * d), 1, u(d)],
                b: [u(w0), 1, u(d), 0],
                c: [u(l.m), u(n * v), u(v)],
                ..Default::default()
            },
        );
        rec.step(&self.programs, "gather_enc", *base, l.b * d.div_ceil(4));
        // logits [B, n·V] = enc · M
        rec.matmul(
            &self.programs,
            (1, 1),
            MatmulParams {
                m: u(l.b),
                n: u(n * v),
                k: u(d),
                batch: 1,
                a: [u(l.enc), u(d), 1, 0],
                b: [u(l.m), u(n * v), 1, 0],
                c: [u(l.logits), u(n * v), 0],
                ..Default::default()
            },
        );
    }

    /// `log π` of `batch`'s tokens for the weights at `w0`, read back.
    fn logp_of(
        &mut self,
        batch: &Batch,
        w0: usize,
        temperature: f32,
    ) -> Result<Vec<f32>, EngineError> {
        self.check_batch(batch)?;
        self.plan(batch.b, batch.g)?;
        let plan = self.plan.take().expect("planned");
        let (mut dp, mut dt) = (
            std::mem::take(&mut self.dev_prompts),
            std::mem::take(&mut self.dev_tokens),
        );
        self.sync_ints(&plan, &mut dp, &batch.prompts, plan.layout.i_prompts);
        self.sync_ints(&plan, &mut dt, &batch.responses, plan.layout.i_tokens);
        (self.dev_prompts, self.dev_tokens) = (dp, dt);
        self.plan = Some(plan);
        let l = self.plan.as_ref().expect("planned").layout;
        let mut base = self.base_params(&l);
        base.w_off = w0 as u32;
        base.inv_t = 1.0 / temperature;
        let mut rec = Recorder::default();
        self.record_forward(&mut rec, &base, w0);
        let tokens = l.b * l.g * self.n;
        rec.step(&self.programs, "row_stats", base, l.b * self.n);
        rec.step(&self.programs, "gather_logp", base, tokens);
        let (slots, ops) = (rec.slots, rec.ops);
        let out = self.submit(&slots, ops, &[(Reads::Work, l.logp, tokens)])?;
        Ok(f32s(&out[0]))
    }
}

/// Where a read-back comes from.
#[derive(Clone)]
enum Reads {
    Work,
    Ints,
    Model,
    /// A buffer of the verifier's or the advantage kernels' (`gpu::kernels`).
    Buffer(wgpu::Buffer),
}

/// An iteration submitted and not yet read back (in a browser, between frames).
struct InFlight {
    /// [`iteration_key`] of its request.
    key: u64,
    staged: Staged,
    shape: IterationShape,
}

/// What reading an iteration's results back needs to know.
struct IterationShape {
    b: usize,
    g: usize,
    verified: Option<bool>,
    base: StepParams,
    mu: usize,
}

/// A hash of what an iteration request asks (prompts, stream, seed, μ, mode): the same
/// request again collects the iteration in flight.
fn iteration_key(req: &IterationRequest) -> u64 {
    let mut h = crate::rng::SplitMix64::new(req.sample.seed ^ u64::from(req.sample.stream));
    let mut mix = |x: u64| h.next_u64() ^ x.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let mut key = mix(req.mu as u64) ^ mix(req.mode as u64) ^ mix(req.sample.g as u64);
    for p in req.sample.prompts {
        for &t in p.iter() {
            key = key.rotate_left(5) ^ mix(u64::from(t));
        }
    }
    key
}

/// A recorded rollout, before its submission.
struct Rollout {
    rec: Recorder,
    /// Tokens, greedy answers, log π_old, log π_ref; with `verified`, the verifier's parts and
    /// rewards, and with `verified == Some(true)` the zero-std flags and every advantage mode.
    reads: Vec<(Reads, usize, usize)>,
    b: usize,
    g: usize,
    verified: Option<bool>,
    /// The advantage kernel's output `[6, B, G]`, when recorded.
    advantages: Option<wgpu::Buffer>,
    temperature: f32,
}

/// A uniform slot's contents.
enum StepParamsOrMm {
    Step(StepParams),
    Mm(MatmulParams),
    /// A window product with an epilogue.
    MmThen(MatmulParams, Epilogue),
    /// A `B_WORK` product that also sums each row of A into `work[dst + row]` (`Mm`'s e_sum).
    MmRowSums(MatmulParams, u32),
    /// A dispatch of transformer.wgsl.
    Tf(transformer::TfParams),
}

impl StepParamsOrMm {
    /// The slot's bytes, padded to [`SLOT`].
    fn slot_bytes(&self) -> Vec<u8> {
        let mut bytes = match self {
            Self::Step(p) => pod_bytes(p),
            Self::Mm(m) => u32_bytes(&m.words()),
            Self::MmThen(m, e) => u32_bytes(&[&m.words()[..], &e.words()[..]].concat()),
            Self::MmRowSums(m, dst) => {
                u32_bytes(&[&m.words()[..], &[0, 0, 0, 0, 0, 4, *dst, 0]].concat())
            }
            Self::Tf(p) => pod_bytes(p),
        };
        bytes.resize(SLOT as usize, 0);
        bytes
    }
}

/// The bytes of a `repr(C)` struct of 4-byte fields (a kernel's parameters).
fn pod_bytes<T: Copy>(p: &T) -> Vec<u8> {
    // SAFETY: only called with `repr(C)` structs of u32 / f32 fields (no padding, no
    // pointers): every byte is initialized.
    let raw =
        unsafe { std::slice::from_raw_parts(p as *const T as *const u8, std::mem::size_of::<T>()) };
    raw.to_vec()
}

/// Records the dispatches of one submission, each with its uniform slot.
#[derive(Default)]
struct Recorder {
    slots: Vec<StepParamsOrMm>,
    ops: Vec<Op>,
    dispatches: usize,
    /// `matmul_window`'s bind group (uniform slots, work, the model's window) where the
    /// products take it ([`MatmulKernel::Window`]).
    window: Option<wgpu::BindGroup>,
}

/// A submission's read-backs on their way to the host: a staging buffer being mapped.
struct Staged {
    staging: wgpu::Buffer,
    total: u64,
    /// Elements of each read-back, in order.
    lens: Vec<usize>,
    /// Set by the mapping's callback.
    ready: Arc<std::sync::Mutex<Option<Result<(), wgpu::BufferAsyncError>>>>,
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}
fn u32_bytes(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}
fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}
fn u32s(b: &[u8]) -> Vec<u32> {
    b.chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// The loss settings as the kernel's parameters.
fn loss_params(p: &mut StepParams, s: &LossSettings) {
    p.mode = match s.mode {
        LossMode::Naive => 0,
        LossMode::Unclipped => 1,
        LossMode::Clipped => 2,
        LossMode::Cispo => 3,
        LossMode::Sapo => 4,
        LossMode::Gmpo => unreachable!("covers() leaves GMPO to the CPU engines"),
    };
    p.estimator = match s.kl_estimator {
        KlEstimator::K1 => 0,
        KlEstimator::K2 => 1,
        KlEstimator::K3 => 2,
    };
    let kl_on = s.kl_in_loss && s.beta > 0.0;
    p.kl_on = kl_on as u32;
    p.beta = if kl_on { s.beta } else { 0.0 };
    let pg = s.pg();
    (p.lo, p.hi) = (pg.lo, pg.hi);
    (p.dual_clip, p.delta, p.cispo_cap) = (pg.dual_clip, pg.delta, pg.cispo_cap);
    (p.tau_pos, p.tau_neg) = (pg.tau_pos, pg.tau_neg);
}

impl Engine for WgslLectureEngine {
    fn label(&self) -> String {
        format!("WGSL lecture engine on {}", self.ctx.summary.name)
    }

    fn sample(&mut self, req: &SampleRequest) -> Result<Samples, EngineError> {
        if req.prompts.is_empty() || req.g == 0 {
            return Ok(Samples::default());
        }
        if req.sampler.any() {
            return Err(EngineError::Unsupported(
                "its rollout kernels draw from f32 logits and return no sampler log π (the mismatch lab's gaps run on the CPU engines)".into(),
            ));
        }
        if cfg!(target_arch = "wasm32") && req.verify.is_none() {
            // Evaluation draws (pass@k) in a browser, where a read-back cannot be waited for:
            // the same sampler on the host, on the weights the last iteration read back.
            return self.sample_on_host(req);
        }
        let r = self.record_rollout(req, req.verify)?;
        let (reads, b, g, verified) = (r.reads.clone(), r.b, r.g, r.verified);
        let (slots, ops) = (r.rec.slots, r.rec.ops);
        let out = self.submit(&slots, ops, &reads)?;
        self.logp_temperature = r.temperature;
        Ok(self.take_rollout(&out, b, g, verified).0)
    }

    fn greedy(
        &mut self,
        prompts: &[&[u32]],
        _max_len: usize,
    ) -> Result<Vec<Vec<u32>>, EngineError> {
        // Through the fused CPU forward on the device's weights: held-out evaluation is one
        // forward, and a read-back of the weights is cheaper than a second plan.
        let mut host = self.host.clone();
        self.load_host(&mut host)?;
        let (n, v) = (self.n, self.vocab);
        let mut out = Vec::with_capacity(prompts.len());
        for chunk in prompts.chunks(1024) {
            let flat: Vec<u32> = chunk.iter().flat_map(|p| p.iter().copied()).collect();
            if flat.len() != chunk.len() * n {
                return Err(kerr(
                    "prompts",
                    format!("every prompt must have {n} tokens"),
                ));
            }
            self.check_tokens(&flat, "prompts")?;
            let logits = host.logits(&flat);
            out.extend(
                crate::objective::sampling::argmax_rows(&logits, v)
                    .chunks(n)
                    .map(|c| c.to_vec()),
            );
        }
        Ok(out)
    }

    fn token_logp(
        &mut self,
        which: Which,
        batch: &Batch,
        temperature: f32,
    ) -> Result<Vec<f32>, EngineError> {
        let cached = self.dev_prompts == batch.prompts
            && self.dev_tokens == batch.responses
            && self.logp_temperature == temperature
            && self
                .plan
                .as_ref()
                .is_some_and(|p| p.layout.b == batch.b && p.layout.g == batch.g);
        match which {
            Which::Reference if cached && self.dev_ref.len() == batch.responses.len() => {
                Ok(self.dev_ref.clone())
            }
            Which::Policy
                if cached && self.old_is_current && self.dev_old.len() == batch.responses.len() =>
            {
                Ok(self.dev_old.clone())
            }
            Which::Reference => self.logp_of(batch, self.params, temperature),
            Which::Policy => self.logp_of(batch, 0, temperature),
        }
    }

    fn step(&mut self, batch: &Batch, req: &StepRequest) -> Result<StepOutput, EngineError> {
        let mut out = self.run_steps(batch, req, 1)?;
        Ok(out.pop().expect("one step"))
    }

    fn batches_steps(&self) -> bool {
        true
    }

    fn runs_iterations(&self) -> bool {
        true
    }

    fn iteration(&mut self, req: &IterationRequest) -> Result<IterationOutput, EngineError> {
        self.run_iteration(req)
    }

    fn steps(
        &mut self,
        batch: &Batch,
        req: &StepRequest,
        count: usize,
    ) -> Result<Vec<StepOutput>, EngineError> {
        let mut out = Vec::with_capacity(count);
        let mut left = count;
        while left > 0 {
            let now = left.min(MAX_STEPS_PER_SUBMISSION);
            let r = StepRequest {
                logp_rows: if now == left { req.logp_rows } else { 0 },
                entropy_rows: if now == left { req.entropy_rows } else { 0 },
                ..*req
            };
            out.extend(self.run_steps(batch, &r, now)?);
            left -= now;
        }
        Ok(out)
    }
    fn supervised(&mut self, batches: &[Batch], lr: f64) -> Result<f32, EngineError> {
        // The cold start runs through burn's autodiff on the CPU (a handful of steps), as on
        // the fused CPU engine; the device weights then continue from its result.
        let mut host = self.host.clone();
        self.load_host(&mut host)?;
        let device = Device::flex().autodiff();
        let policy = burn_policy(&host, &device);
        let (trained, loss) = supervised_steps(policy, batches, lr, &self.optimizer, &device);
        if let Policy::Lecture(m) = &trained {
            host.set_weights(&m.weights());
        }
        let flat = [&host.embedding[..], &host.encode, &host.decode_t].concat();
        self.ctx
            .queue
            .write_buffer(&self.model, 0, &f32_bytes(&flat));
        self.host_weights = Some(flat);
        self.old_is_current = false;
        Ok(loss)
    }

    fn refresh_reference(&mut self) {
        // A copy on the device (a dispatch: a buffer cannot be copied onto itself).
        if self.plan.is_none() && self.plan(1, 1).is_err() {
            return;
        }
        let l = self.plan.as_ref().expect("planned").layout;
        let base = self.base_params(&l);
        let mut rec = Recorder::default();
        rec.step(&self.programs, "copy_ref", base, self.params);
        let (slots, ops) = (rec.slots, rec.ops);
        if let Err(e) = self.submit(&slots, ops, &[]) {
            log::error!("refreshing the reference on the device failed: {e}");
        }
        self.dev_ref.clear();
    }

    fn flat_weights(&self) -> Vec<f32> {
        let mut host = self.host.clone();
        match self.load_host(&mut host) {
            Ok(()) => {
                let w = host.weights();
                [w.embedding, w.encode, w.decode].concat()
            }
            Err(e) => {
                log::error!("reading the weights back failed: {e}");
                Vec::new()
            }
        }
    }

    fn snapshot(&self) -> Result<Snapshot, EngineError> {
        let all = self.read_model()?;
        let p = self.params;
        let mut policy = self.host.clone();
        let mut reference = self.host.clone();
        set_flat(&mut policy, &all[..p]);
        set_flat(&mut reference, &all[p..2 * p]);
        // Adam's state in the fused CPU engine's format (so either engine continues it).
        let mut adam = policy.clone();
        let (m, v) = (&all[2 * p..3 * p], &all[3 * p..]);
        let mut at = 0;
        for st in adam.adam.iter_mut() {
            let len = st.m.len();
            st.m.copy_from_slice(&m[at..at + len]);
            st.v.copy_from_slice(&v[at..at + len]);
            at += len;
        }
        adam.time = self.time;
        let device = Device::flex();
        fused_snapshot(
            &burn_policy(&policy, &device),
            &burn_policy(&reference, &device),
            adam.adam_bytes(),
        )
    }

    fn restore(&mut self, snapshot: &Snapshot) -> Result<(), EngineError> {
        let template = burn_policy(&self.host, &Device::flex());
        let (policy, reference, adam) = fused_restore(snapshot, template)?;
        let mut host = self.host.clone();
        host.load_adam_bytes(adam).map_err(EngineError::Snapshot)?;
        let flat_of = |p: &Policy| -> Result<Vec<f32>, EngineError> {
            let mut f = self.host.clone();
            match p {
                Policy::Lecture(m) => f.set_weights(&m.weights()),
                _ => return Err(EngineError::Snapshot("not a lecture model".into())),
            }
            Ok([&f.embedding[..], &f.encode, &f.decode_t].concat())
        };
        let (pw, rw) = (flat_of(&policy)?, flat_of(&reference)?);
        let m: Vec<f32> = host.adam.iter().flat_map(|s| s.m.iter().copied()).collect();
        let v: Vec<f32> = host.adam.iter().flat_map(|s| s.v.iter().copied()).collect();
        let all = [pw, rw, m, v].concat();
        self.ctx
            .queue
            .write_buffer(&self.model, 0, &f32_bytes(&all));
        self.host_weights = Some(all[..self.params].to_vec());
        self.time = host.time;
        self.old_is_current = false;
        self.dev_ref.clear();
        Ok(())
    }

    fn device_counts(&self) -> Option<super::DeviceCounts> {
        Some(super::DeviceCounts {
            submissions: self.submissions.load(std::sync::atomic::Ordering::Relaxed),
            dispatches_per_step: DISPATCHES_PER_STEP,
            dispatches_per_rollout: self.rollout_dispatches,
        })
    }

    fn supports(&self, config: &RunConfig) -> bool {
        Self::covers(config)
            && config.task.vocab == self.vocab
            && config.task.n == self.n
            && config.model.d_model == self.d
    }
}

impl WgslLectureEngine {
    /// `req` sampled on the host: the fused CPU forward on the weights the host holds, then
    /// the Rust sampler the kernel is held equal to.
    fn sample_on_host(&mut self, req: &SampleRequest) -> Result<Samples, EngineError> {
        let mut host = self.host.clone();
        self.load_host(&mut host)?;
        let (b, g, n, v) = (req.prompts.len(), req.g, self.n, self.vocab);
        let flat: Vec<u32> = req.prompts.iter().flat_map(|p| p.iter().copied()).collect();
        if flat.len() != b * n {
            return Err(kerr(
                "prompts",
                format!("every prompt must have {n} tokens"),
            ));
        }
        self.check_tokens(&flat, "prompts")?;
        let logits = host.logits(&flat);
        let tokens = crate::objective::sampling::sample_independent(
            &logits, b, n, v, g, req.params, req.seed, req.stream,
        );
        let greedy = crate::objective::sampling::argmax_rows(&logits, v);
        Ok(Samples {
            rows: tokens.chunks(n).map(|c| c.to_vec()).collect(),
            closed: vec![true; b * g],
            scores: None,
            greedy: Some(greedy.chunks(n).map(|c| c.to_vec()).collect()),
            ..Samples::default()
        })
    }

    fn count_submission(&self) {
        self.submissions
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// The whole `model` buffer, read back.
    fn read_model(&self) -> Result<Vec<f32>, EngineError> {
        self.read_model_part(4)
    }

    /// The first `copies` weight-sized parts of `model` (1: the policy), read back.
    fn read_model_part(&self, copies: usize) -> Result<Vec<f32>, EngineError> {
        let device = &self.ctx.device;
        let bytes = (copies * self.params * 4) as u64;
        let staging = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("wgsl_lecture.model_staging"),
            size: bytes,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut encoder = device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
            label: Some("wgsl_lecture.read_model"),
        });
        if cfg!(target_arch = "wasm32") {
            return Err(EngineError::Unsupported(
                "reading the WGSL engine's weights back blocks, which a browser cannot".into(),
            ));
        }
        encoder.copy_buffer_to_buffer(&self.model, 0, &staging, 0, bytes);
        self.ctx.queue.submit([encoder.finish()]);
        self.count_submission();
        let out = Staged::map(staging, bytes, vec![copies * self.params]).wait(&self.ctx)?;
        Ok(f32s(&out[0]))
    }

    /// The policy's weights into a host copy.
    fn load_host(&self, host: &mut FusedLecture) -> Result<(), EngineError> {
        match &self.host_weights {
            Some(w) => set_flat(host, w),
            None => set_flat(host, &self.read_model_part(1)?[..self.params]),
        }
        Ok(())
    }

    /// Adam's moments `(m, v)` and step count (tests).
    pub fn adam_state(&self) -> Result<(Vec<f32>, Vec<f32>, i32), EngineError> {
        let all = self.read_model()?;
        let p = self.params;
        Ok((all[2 * p..3 * p].to_vec(), all[3 * p..].to_vec(), self.time))
    }

    /// The matmul tile edge in use.
    pub fn tile(&self) -> u32 {
        self.programs.tile
    }
}

fn set_flat(f: &mut FusedLecture, flat: &[f32]) {
    let (a, b) = (f.embedding.len(), f.encode.len());
    f.embedding.copy_from_slice(&flat[..a]);
    f.encode.copy_from_slice(&flat[a..a + b]);
    f.decode_t.copy_from_slice(&flat[a + b..]);
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
