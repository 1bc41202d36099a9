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

const COMMON: &str = include_str!("../../shaders/common.wgsl");
const SAMPLE: &str = include_str!("../../shaders/sample.wgsl");
const MATMUL: &str = include_str!("../../shaders/matmul.wgsl");
const STEP: &str = include_str!("../../shaders/lecture_step.wgsl");

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
}

impl MatmulParams {
    fn words(&self) -> [u32; 16] {
        let flags = self.accumulate as u32 | (self.reduce as u32) << 1;
        let (a, b, c) = (self.a, self.b, self.c);
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
}

impl StepParams {
    fn bytes(&self) -> Vec<u8> {
        // SAFETY: `StepParams` is `repr(C)` of 4-byte fields only (no padding).
        let raw = unsafe {
            std::slice::from_raw_parts(
                self as *const Self as *const u8,
                std::mem::size_of::<Self>(),
            )
        };
        raw.to_vec()
    }
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
    /// A dispatch on the sampling kernel's bind group.
    Sample {
        pipeline: wgpu::ComputePipeline,
        grid: (u32, u32, u32),
    },
    Copy {
        src: wgpu::Buffer,
        src_off: u64,
        dst: wgpu::Buffer,
        dst_off: u64,
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
}

/// Which matrix-product kernel of matmul.wgsl the engine runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatmulKernel {
    /// `matmul`: tiles through workgroup memory (GPUs).
    Tiled,
    /// `matmul_rows`: register blocks of [`MATMUL_ROWS`] × 4 outputs per invocation, no
    /// workgroup memory (CPU adapters such as lavapipe: 4× the tiled kernel there, measured).
    Rows,
}

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
            Self::Rows => "matmul_rows",
        }
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

fn layout_entry(
    binding: u32,
    ty: wgpu::BufferBindingType,
    dynamic: bool,
) -> wgpu::BindGroupLayoutEntry {
    wgpu::BindGroupLayoutEntry {
        binding,
        visibility: wgpu::ShaderStages::COMPUTE,
        ty: wgpu::BindingType::Buffer {
            ty,
            has_dynamic_offset: dynamic,
            min_binding_size: None,
        },
        count: None,
    }
}

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

impl Programs {
    fn new(ctx: &GpuContext, kernel: MatmulKernel) -> Result<Self, EngineError> {
        let device = &ctx.device;
        let limits = device.limits();
        if limits.max_storage_buffers_per_shader_stage < 3 || !fits_min(&limits) {
            return Err(kerr(
                "adapter",
                "the WGSL engine needs 64-wide workgroups and 3 storage buffers per stage",
            ));
        }
        let wg = matmul_workgroup_edge(&limits, ctx.summary.is_software());
        let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
        use wgpu::BufferBindingType::{Storage, Uniform};
        let rw = Storage { read_only: false };
        let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some("wgsl_lecture"),
            entries: &[
                layout_entry(0, Uniform, true),
                layout_entry(1, rw, false),
                layout_entry(2, rw, false),
                layout_entry(3, rw, false),
            ],
        });
        let sample_layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some("sample.wgsl"),
            entries: &[
                layout_entry(0, Uniform, false),
                layout_entry(1, Storage { read_only: true }, false),
                layout_entry(2, rw, false),
                layout_entry(3, rw, false),
            ],
        });
        let pipeline_layout = |l: &wgpu::BindGroupLayout| {
            device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                label: None,
                bind_group_layouts: &[Some(l)],
                immediate_size: 0,
            })
        };
        let main_layout = pipeline_layout(&layout);
        let module = |file: &str, src: String| {
            device.create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(file),
                source: wgpu::ShaderSource::Wgsl(src.into()),
            })
        };
        let matmul_src = MATMUL.replace("const WG: u32 = 8u;", &format!("const WG: u32 = {wg}u;"));
        let matmul_module = module("matmul.wgsl", matmul_src);
        let step_module = module("lecture_step.wgsl", format!("{COMMON}\n{STEP}"));
        let sample_module = module("sample.wgsl", format!("{COMMON}\n{SAMPLE}"));
        let pipeline = |layout: &wgpu::PipelineLayout,
                        m: &wgpu::ShaderModule,
                        entry: &str,
                        constants: &[(&str, f64)]| {
            device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(entry),
                layout: Some(layout),
                module: m,
                entry_point: Some(entry),
                compilation_options: wgpu::PipelineCompilationOptions {
                    constants,
                    zero_initialize_workgroup_memory: true,
                },
                cache: None,
            })
        };
        let mut matmul = HashMap::new();
        for a in 0..3u32 {
            for b in 0..2u32 {
                let consts = [("A_SRC", a as f64), ("B_SRC", b as f64)];
                matmul.insert(
                    (a, b),
                    pipeline(&main_layout, &matmul_module, kernel.entry(), &consts),
                );
            }
        }
        let step = STEP_ENTRIES
            .iter()
            .map(|e| (*e, pipeline(&main_layout, &step_module, e, &[])))
            .collect();
        let sample_pl = pipeline_layout(&sample_layout);
        let row_weights = pipeline(&sample_pl, &sample_module, "row_weights", &[]);
        let draw = pipeline(&sample_pl, &sample_module, "draw", &[]);
        if let Some(error) = crate::gpu::context::scope_error(scope.pop()) {
            return Err(EngineError::Kernel(KernelError::Shader {
                file: "matmul.wgsl / lecture_step.wgsl".into(),
                error: error.to_string(),
            }));
        }
        Ok(Self {
            layout,
            matmul,
            step,
            sample_layout,
            row_weights,
            draw,
            tile: wg * 4,
            kernel,
        })
    }
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
        c.model.kind == ModelKind::Lecture
            && FusedLecture::supports(c)
            && c.run.kernels != KernelChoice::Reference
            // PPO's per-token advantages (GAE) are not in its loss kernel.
            && c.algorithm.advantage != crate::config::AdvantageMode::Gae
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

    /// Run `ops` as one submission and read back `(buffer, element offset, elements)`,
    /// waiting for it (natively; the browser cannot wait: there it is an error, and only
    /// [`Engine::iteration`] reads back, asynchronously).
    fn submit(
        &mut self,
        slots: &[StepParamsOrMm],
        ops: Vec<Op>,
        reads: &[(Reads, usize, usize)],
    ) -> Result<Vec<Vec<u8>>, EngineError> {
        let staged = self.submit_staged(slots, ops, reads)?;
        if reads.is_empty() {
            return Ok(Vec::new());
        }
        if cfg!(target_arch = "wasm32") {
            return Err(EngineError::Unsupported(
                "the WGSL engine in a browser reads back only whole iterations (asynchronously); this run needs a blocking read-back: train it on the CPU (device auto)".into(),
            ));
        }
        staged.wait(&self.ctx)
    }

    /// Run `ops` as one submission with the read-backs copied into a staging buffer whose
    /// mapping has been asked for; [`Staged`] collects them.
    fn submit_staged(
        &mut self,
        slots: &[StepParamsOrMm],
        ops: Vec<Op>,
        reads: &[(Reads, usize, usize)],
    ) -> Result<Staged, EngineError> {
        let plan = self.plan.as_ref().expect("planned");
        if slots.len() as u64 > plan.slots {
            return Err(kerr(
                "submission",
                "too many dispatches for the uniform buffer",
            ));
        }
        let device = &self.ctx.device;
        let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let mut uni = Vec::with_capacity(slots.len() * SLOT as usize);
        for s in slots {
            let mut bytes = match s {
                StepParamsOrMm::Step(p) => p.bytes(),
                StepParamsOrMm::Mm(m) => u32_bytes(&m.words()),
            };
            bytes.resize(SLOT as usize, 0);
            uni.extend_from_slice(&bytes);
        }
        if !uni.is_empty() {
            self.ctx.queue.write_buffer(&plan.uniform, 0, &uni);
        }
        if std::env::var_os("GRPO_WGSL_PROFILE").is_some() {
            self.profile(&ops, slots);
        }
        let new_encoder = || {
            device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("wgsl_lecture"),
            })
        };
        // Command buffers of one submission, in order: the recorded ops, broken where commands
        // encoded elsewhere come in.
        let mut buffers = Vec::new();
        let mut encoder = new_encoder();
        let mut ops = ops.into_iter().peekable();
        while let Some(op) = ops.next() {
            match op {
                Op::Copy {
                    src,
                    src_off,
                    dst,
                    dst_off,
                    bytes,
                } => {
                    if bytes > 0 {
                        encoder.copy_buffer_to_buffer(&src, src_off, &dst, dst_off, bytes);
                    }
                }
                Op::Commands(commands) => {
                    buffers.push(std::mem::replace(&mut encoder, new_encoder()).finish());
                    buffers.push(commands);
                }
                first => {
                    let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                        label: Some("wgsl_lecture"),
                        timestamp_writes: None,
                    });
                    // One pass for each run of dispatches.
                    let mut op = first;
                    loop {
                        match op {
                            Op::Step {
                                pipeline,
                                slot,
                                grid,
                                ..
                            } => {
                                pass.set_pipeline(&pipeline);
                                pass.set_bind_group(0, &plan.group, &[slot * SLOT as u32]);
                                pass.dispatch_workgroups(grid.0, grid.1, grid.2);
                            }
                            Op::Sample { pipeline, grid } => {
                                pass.set_pipeline(&pipeline);
                                pass.set_bind_group(0, &plan.sample_group, &[]);
                                pass.dispatch_workgroups(grid.0, grid.1, grid.2);
                            }
                            // Not dispatches: `next_if` below never hands them here.
                            Op::Copy { .. } | Op::Commands(_) => {}
                        }
                        match ops.next_if(|o| matches!(o, Op::Step { .. } | Op::Sample { .. })) {
                            Some(next) => op = next,
                            None => break,
                        }
                    }
                }
            }
        }
        let total: u64 = reads.iter().map(|r| (r.2 * 4) as u64).sum();
        let staging = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("wgsl_lecture.staging"),
            size: total.max(4).next_multiple_of(4),
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut offset = 0u64;
        for (which, at, len) in reads {
            let src = match which {
                Reads::Work => &plan.work,
                Reads::Ints => &plan.ints,
                Reads::Model => &self.model,
                Reads::Buffer(b) => b,
            };
            let bytes = (*len * 4) as u64;
            if bytes > 0 {
                encoder.copy_buffer_to_buffer(src, (*at * 4) as u64, &staging, offset, bytes);
            }
            offset += bytes;
        }
        buffers.push(encoder.finish());
        self.ctx.queue.submit(buffers);
        self.count_submission();
        if let Some(error) = crate::gpu::context::scope_error(scope.pop()) {
            return Err(EngineError::Kernel(KernelError::Readback(format!(
                "the device refused the submission: {error}"
            ))));
        }
        Ok(Staged::map(
            staging,
            total,
            reads.iter().map(|r| r.2).collect(),
        ))
    }

    /// Times each dispatch of `ops` (20 times in a row in one submission), printed to stderr
    /// by label and shape: `GRPO_WGSL_PROFILE=1`. Diagnostics only: the repeated dispatches
    /// change the run's results.
    fn profile(&self, ops: &[Op], slots: &[StepParamsOrMm]) {
        let plan = self.plan.as_ref().expect("planned");
        let device = &self.ctx.device;
        let mut lines = Vec::new();
        for op in ops {
            let Op::Step {
                pipeline,
                slot,
                grid,
                label,
            } = op
            else {
                continue;
            };
            let what = match &slots[*slot as usize] {
                StepParamsOrMm::Mm(m) => {
                    format!("{label} {}x{}x{} b{}", m.m, m.n, m.k, m.batch)
                }
                StepParamsOrMm::Step(_) => format!("{label} {grid:?}"),
            };
            const REPS: u32 = 20;
            let t0 = std::time::Instant::now();
            let mut encoder = device.create_command_encoder(&Default::default());
            {
                let mut pass = encoder.begin_compute_pass(&Default::default());
                pass.set_pipeline(pipeline);
                pass.set_bind_group(0, &plan.group, &[*slot * SLOT as u32]);
                for _ in 0..REPS {
                    pass.dispatch_workgroups(grid.0, grid.1, grid.2);
                }
            }
            self.ctx.queue.submit([encoder.finish()]);
            let _ = device.poll(wgpu::PollType::wait_indefinitely());
            let ms = t0.elapsed().as_secs_f64() * 1e3 / REPS as f64;
            lines.push(format!("{ms:9.3} ms  {what}"));
        }
        eprintln!("[wgsl profile]\n{}", lines.join("\n"));
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
}

/// Records the dispatches of one submission, each with its uniform slot.
#[derive(Default)]
struct Recorder {
    slots: Vec<StepParamsOrMm>,
    ops: Vec<Op>,
    dispatches: usize,
}

/// Workgroups for `count` invocations of 64, over x and y past 65 535 per dimension.
fn grid_1d(count: usize) -> (u32, u32, u32) {
    let groups = count.div_ceil(64).max(1);
    let x = groups.min(65_535);
    (x as u32, groups.div_ceil(x) as u32, 1)
}

impl Recorder {
    fn step(&mut self, p: &Programs, entry: &'static str, params: StepParams, count: usize) {
        self.step_grid(p, entry, params, grid_1d(count));
    }

    fn step_grid(
        &mut self,
        p: &Programs,
        entry: &'static str,
        params: StepParams,
        grid: (u32, u32, u32),
    ) {
        let slot = self.slots.len() as u32;
        self.slots.push(StepParamsOrMm::Step(params));
        self.ops.push(Op::Step {
            pipeline: p.step[entry].clone(),
            slot,
            grid,
            label: entry,
        });
        self.dispatches += 1;
    }

    fn matmul(&mut self, p: &Programs, src: (u32, u32), mm: MatmulParams) {
        let tile = p.tile;
        let batch = if mm.reduce { 1 } else { mm.batch.max(1) };
        let grid = match p.kernel {
            MatmulKernel::Tiled => (
                mm.n.div_ceil(tile).max(1),
                mm.m.div_ceil(tile).max(1),
                batch,
            ),
            MatmulKernel::Rows => {
                let groups = (mm.m.div_ceil(MATMUL_ROWS) as usize * mm.n.div_ceil(4) as usize)
                    .div_ceil(MATMUL_ROWS_WG)
                    .max(1);
                let x = groups.min(65_535);
                (x as u32, groups.div_ceil(x) as u32, batch)
            }
        };
        let slot = self.slots.len() as u32;
        self.slots.push(StepParamsOrMm::Mm(mm));
        self.ops.push(Op::Step {
            pipeline: p.matmul[&src].clone(),
            slot,
            grid,
            label: "matmul",
        });
        self.dispatches += 1;
    }

    /// A two-level sum of `channels` channels of `count` elements from `src` into
    /// `sums[dst..dst + channels]` (squared when `square`).
    #[allow(clippy::too_many_arguments)]
    fn reduce(
        &mut self,
        p: &Programs,
        base: StepParams,
        src: usize,
        count: usize,
        channels: usize,
        dst: u32,
        square: bool,
    ) {
        let nchunks = count.div_ceil(CHUNK).max(1);
        let params = StepParams {
            src_off: src as u32,
            count: count as u32,
            nchunks: nchunks as u32,
            square: square as u32,
            sums_off: base.sums_off + dst,
            ..base
        };
        self.step_grid(
            p,
            "reduce_partial",
            params,
            (nchunks as u32, channels as u32, 1),
        );
        self.step_grid(p, "reduce_final", params, (1, channels as u32, 1));
    }
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

impl Staged {
    /// Ask for `staging`'s first `total` bytes (read-backs of `lens` elements, in order) to be
    /// mapped, after the submission that fills it.
    fn map(staging: wgpu::Buffer, total: u64, lens: Vec<usize>) -> Self {
        let ready = Arc::new(std::sync::Mutex::new(None));
        if total > 0 {
            let flag = ready.clone();
            staging
                .slice(0..total.next_multiple_of(4))
                .map_async(wgpu::MapMode::Read, move |r| {
                    *flag.lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
                });
        }
        Self {
            staging,
            total,
            lens,
            ready,
        }
    }

    /// Whether the mapping has come back (it has failed or succeeded).
    fn is_ready(&self) -> bool {
        self.total == 0
            || self
                .ready
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_some()
    }

    /// Wait for the device, then read (natively).
    fn wait(self, ctx: &GpuContext) -> Result<Vec<Vec<u8>>, EngineError> {
        // Another thread's poll on the same device may be the one running this mapping's
        // callback: the device can be idle a moment before the flag is set.
        let started = web_time::Instant::now();
        while !self.is_ready() {
            ctx.device
                .poll(wgpu::PollType::wait_indefinitely())
                .map_err(|e| EngineError::Kernel(KernelError::Readback(e.to_string())))?;
            if started.elapsed() > std::time::Duration::from_secs(600) {
                break;
            }
            if !self.is_ready() {
                std::thread::yield_now();
            }
        }
        self.read()
    }

    /// Each read-back's bytes, once [`Staged::is_ready`].
    fn read(self) -> Result<Vec<Vec<u8>>, EngineError> {
        let readback = |e: String| EngineError::Kernel(KernelError::Readback(e));
        if self.total == 0 {
            return Ok(self.lens.iter().map(|_| Vec::new()).collect());
        }
        let state = self.ready.lock().unwrap_or_else(|e| e.into_inner()).take();
        match state {
            Some(r) => r.map_err(|e| readback(e.to_string()))?,
            None => return Err(readback("the read-back has not arrived".into())),
        }
        let slice = self.staging.slice(0..self.total.next_multiple_of(4));
        let mapped = slice
            .get_mapped_range()
            .map_err(|e| readback(e.to_string()))?;
        let mut out = Vec::with_capacity(self.lens.len());
        let mut offset = 0usize;
        for &len in &self.lens {
            let Some(bytes) = mapped.get(offset..offset + len * 4) else {
                return Err(readback(format!(
                    "a read of {} bytes past the {} staged",
                    len * 4,
                    mapped.len()
                )));
            };
            out.push(bytes.to_vec());
            offset += len * 4;
        }
        drop(mapped);
        self.staging.unmap();
        Ok(out)
    }
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
    };
    p.estimator = match s.kl_estimator {
        KlEstimator::K1 => 0,
        KlEstimator::K2 => 1,
        KlEstimator::K3 => 2,
    };
    let kl_on = s.kl_in_loss && s.beta > 0.0;
    p.kl_on = kl_on as u32;
    p.beta = if kl_on { s.beta } else { 0.0 };
    p.lo = 1.0 - s.epsilon_low;
    p.hi = 1.0 + s.epsilon_high;
}

impl Engine for WgslLectureEngine {
    fn label(&self) -> String {
        format!("WGSL lecture engine on {}", self.ctx.summary.name)
    }

    fn sample(&mut self, req: &SampleRequest) -> Result<Samples, EngineError> {
        if req.prompts.is_empty() || req.g == 0 {
            return Ok(Samples::default());
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
    /// `count` optimizer steps on one frozen batch in one submission; one read-back of every
    /// step's sums (and the last step's logged log π rows).
    fn run_steps(
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
            logp: None,
        })
    }

    /// The step parameters of one iteration's optimizer steps (Adam's bias corrections are
    /// per step: [`Self::record_steps`]).
    fn step_base(
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
    fn record_steps(
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
            let bc2 = (1.0 - self.beta2.powi(time)).sqrt();
            let step = StepParams {
                bc2,
                factor: bc2 / (1.0 - self.beta1.powi(time)),
                sums_off: (l.sums + 8 * k) as u32,
                ..*base
            };
            self.record_step(rec, &step, l, b);
        }
        debug_assert_eq!(rec.dispatches - before, DISPATCHES_PER_STEP * count);
    }

    /// The outputs of `count` steps from the read-backs `[sums, logged log π, weights]` (the
    /// last three of `out`); the engine's step count and host weights move on.
    fn take_steps(
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
                    },
                    logp: if k + 1 == count {
                        last_logp.clone()
                    } else {
                        Vec::new()
                    },
                }
            })
            .collect()
    }

    /// The rollout's dispatches (the policy's forward, sampling, log π_old, the greedy answers,
    /// the reference's forward and log π_ref) and, with `verify`, the verifier and the
    /// advantage kernels on the sampled tokens; the read-backs [`Self::take_rollout`] parses.
    fn record_rollout(
        &mut self,
        req: &SampleRequest,
        verify: Option<([f32; 3], bool)>,
    ) -> Result<Rollout, EngineError> {
        let (b, g, n, v) = (req.prompts.len(), req.g, self.n, self.vocab);
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
        self.plan(b, g)?;
        let plan = self.plan.take().expect("planned");
        let l = plan.layout;
        let mut dp = std::mem::take(&mut self.dev_prompts);
        self.sync_ints(&plan, &mut dp, &prompts, l.i_prompts);
        self.dev_prompts = dp;
        let sp = req.params;
        let words: Vec<u32> = vec![
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
        ];
        self.ctx
            .queue
            .write_buffer(&plan.sample_params, 0, &u32_bytes(&words));
        let (work, ints, sample_logits, sample_tokens) = (
            plan.work.clone(),
            plan.ints.clone(),
            plan.sample_logits.clone(),
            plan.sample_tokens.clone(),
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
        });
        rec.ops.push(Op::Sample {
            pipeline: p.draw.clone(),
            grid: grid_1d(tokens),
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
        let w_ref = self.params;
        self.record_forward(&mut rec, &base, w_ref);
        let p = &self.programs;
        rec.step(p, "row_stats", base, rows);
        rec.step(
            p,
            "gather_logp",
            StepParams {
                out_off: l.rf as u32,
                ..base
            },
            tokens,
        );
        let mut reads = vec![
            (Reads::Ints, l.i_tokens, tokens),
            (Reads::Ints, l.i_greedy, rows),
            (Reads::Work, l.old, tokens),
            (Reads::Work, l.rf, tokens),
        ];
        // Verify (sort_reward.wgsl) and every advantage mode (advantage.wgsl) on the sampled
        // tokens, in a command buffer of the same submission.
        let mut advantages = None;
        if let Some((weights, with_adv)) = verify {
            let k = &self.verify;
            let mut enc = k.encoder();
            let lengths = vec![n as u32; b * g];
            let (parts, rewards) = k.encode_score(
                &mut enc,
                &prompts,
                &sample_tokens,
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
        }
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

    /// The samples from a rollout's read-backs (the first ones of `out`, in
    /// [`Self::record_rollout`]'s order) and log π_ref; what the device now holds is noted.
    fn take_rollout(
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
        };
        (samples, rf)
    }

    /// A whole iteration in one submission: the rollout, verifying and every advantage mode,
    /// the driving mode's advantages copied into place, then `mu` optimizer steps; one
    /// read-back of everything. Natively it waits for it; in a browser it answers
    /// [`EngineError::Pending`] until the read-back has arrived (the same request again
    /// collects it).
    fn run_iteration(&mut self, req: &IterationRequest) -> Result<IterationOutput, EngineError> {
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
    fn finish_iteration(&mut self, out: &[Vec<u8>], s: &IterationShape) -> IterationOutput {
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

    /// One optimizer step's dispatches: forward → per-token loss and derivative → backward →
    /// grad norm → clip → Adam.
    fn record_step(&self, rec: &mut Recorder, base: &StepParams, l: &Layout, b: usize) {
        let (v, n, d) = (self.vocab, self.n, self.d);
        let rows = b * n;
        let (vd, ndd) = (v * d, n * d * d);
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
            },
        );
        rec.reduce(p, base, l.stats, rows, CHANNELS, 0, false);
        rec.reduce(p, base, l.grad, self.params, 1, 6, true);
        rec.step(p, "adam", base, self.params.div_ceil(4));
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

/// Plain-Rust references of every entry point of `matmul.wgsl` and `lecture_step.wgsl`, over
/// the same three buffers (`model`, `work`, `ints`) and the same parameters: each is the
/// kernel's loop written on the host (the pieces of `fused_lecture`'s step). The tests run a
/// kernel and its reference on the same random buffers and compare every element.
pub mod reference {
    use super::{CHUNK, MatmulParams, StepParams};
    use crate::config::{KlEstimator, LossMode};
    use crate::objective::loss::reference::{kl_term, pg_term};

    /// The buffers a kernel reads and writes.
    #[derive(Debug, Clone, Default, PartialEq)]
    pub struct Buffers {
        pub model: Vec<f32>,
        pub work: Vec<f32>,
        pub ints: Vec<u32>,
    }

    /// `matmul` with `A` and `B` read from model (0) or work (1); `A` may be a one-hot of
    /// token ids in `ints` (2).
    pub fn matmul(buf: &mut Buffers, mm: &MatmulParams, src: (u32, u32)) {
        let read = |buf: &Buffers, s: u32, i: usize| {
            if s == 0 { buf.model[i] } else { buf.work[i] }
        };
        let (m, n, k, batch) = (
            mm.m as usize,
            mm.n as usize,
            mm.k as usize,
            mm.batch as usize,
        );
        let [ao, ars, acs, abs] = mm.a.map(|x| x as usize);
        let [bo, brs, bcs, bbs] = mm.b.map(|x| x as usize);
        let [co, crs, cbs] = mm.c.map(|x| x as usize);
        let outputs = if mm.reduce { 1 } else { batch };
        for z in 0..outputs {
            for i in 0..m {
                for j in 0..n {
                    let mut acc = 0.0f32;
                    let zs: Vec<usize> = if mm.reduce {
                        (0..batch).collect()
                    } else {
                        vec![z]
                    };
                    for zz in zs {
                        for kk in 0..k {
                            let a = if src.0 == 2 {
                                // one-hot of token ids
                                (buf.ints[ao + zz * abs + kk * acs] as usize == i) as u32 as f32
                            } else {
                                read(buf, src.0, ao + zz * abs + i * ars + kk * acs)
                            };
                            let b = read(buf, src.1, bo + zz * bbs + kk * brs + j * bcs);
                            acc = a.mul_add(b, acc);
                        }
                    }
                    let at = co + z * cbs + i * crs + j;
                    buf.work[at] = if mm.accumulate {
                        buf.work[at] + acc
                    } else {
                        acc
                    };
                }
            }
        }
    }

    fn token_logp(lp: &StepParams, buf: &Buffers, i: usize) -> f32 {
        let (g, n, v) = (lp.g as usize, lp.n as usize, lp.v as usize);
        let row = i / (g * n) * n + i % n;
        let tok = buf.ints[lp.i_tokens as usize + i] as usize;
        buf.work[lp.logits_off as usize + row * v + tok] * lp.inv_t
            - buf.work[lp.logz_off as usize + row]
    }

    /// One entry point of `lecture_step.wgsl`.
    pub fn step_kernel(entry: &str, lp: &StepParams, buf: &mut Buffers) {
        let (b, g, n, v, d) = (
            lp.b as usize,
            lp.g as usize,
            lp.n as usize,
            lp.v as usize,
            lp.d as usize,
        );
        let (rows, tokens) = (lp.rows as usize, lp.tokens as usize);
        let w = |x: u32| x as usize;
        match entry {
            "gather_enc" => {
                for i in 0..b * d {
                    let (bi, j) = (i / d, i % d);
                    let mut acc = 0.0f32;
                    for p in 0..n {
                        let tok = buf.ints[w(lp.i_prompts) + bi * n + p] as usize;
                        acc += buf.work[w(lp.t_off) + tok * n * d + p * d + j];
                    }
                    buf.work[w(lp.enc_off) + i] = acc;
                }
            }
            "row_stats" => {
                for r in 0..rows {
                    let x = &buf.work[w(lp.logits_off) + r * v..w(lp.logits_off) + (r + 1) * v];
                    let m = x
                        .iter()
                        .fold(-3.402_823_5e38f32, |m, &l| m.max(l * lp.inv_t));
                    let total: f32 = x.iter().map(|&l| (l * lp.inv_t - m).exp()).sum();
                    let lz = m + total.ln();
                    let mut h = 0.0f32;
                    for &l in x {
                        let z = l * lp.inv_t;
                        let e = (z - m).exp();
                        if e > 0.0 {
                            h -= e / total * (z - lz);
                        }
                    }
                    buf.work[w(lp.logz_off) + r] = lz;
                    buf.work[w(lp.ent_off) + r] = h;
                }
            }
            "gather_logp" => {
                for i in 0..tokens {
                    buf.work[w(lp.out_off) + i] = token_logp(lp, buf, i);
                }
            }
            "row_step" => {
                let mode = [LossMode::Naive, LossMode::Unclipped, LossMode::Clipped][w(lp.mode)];
                let est = [KlEstimator::K1, KlEstimator::K2, KlEstimator::K3][w(lp.estimator)];
                let beta = if lp.kl_on == 1 { lp.beta } else { 0.0 };
                for r in 0..rows {
                    let base = w(lp.logits_off) + r * v;
                    let x: Vec<f32> = buf.work[base..base + v].to_vec();
                    let m = x
                        .iter()
                        .fold(-3.402_823_5e38f32, |m, &l| m.max(l * lp.inv_t));
                    let total: f32 = x.iter().map(|&l| (l * lp.inv_t - m).exp()).sum();
                    let lz = m + total.ln();
                    let mut h = 0.0f32;
                    for &l in &x {
                        let z = l * lp.inv_t;
                        let e = (z - m).exp();
                        if e > 0.0 {
                            h -= e / total * (z - lz);
                        }
                    }
                    let (bi, pos) = (r / n, r % n);
                    let mut rc = 0.0f32;
                    let mut sums = [0.0f32; 5];
                    for gi in 0..g {
                        let t = (bi * g + gi) * n + pos;
                        let tok = buf.ints[w(lp.i_tokens) + t] as usize;
                        let l = x[tok] * lp.inv_t - lz;
                        buf.work[w(lp.out_off) + t] = l;
                        let ratio = (l - buf.work[w(lp.old_off) + t]).exp();
                        let a = buf.work[w(lp.adv_off) + t / n];
                        let (kl, mut dkl) =
                            kl_term(est, l, buf.work[w(lp.rf_off) + t], beta, f32::exp);
                        if lp.kl_on == 0 {
                            dkl = 0.0;
                        }
                        let (term, dterm) = pg_term(mode, a, ratio, l, lp.lo, lp.hi);
                        let c = (dterm + dkl) * lp.cw;
                        buf.work[w(lp.coef_off) + t] = c;
                        rc += c;
                        sums[0] += term;
                        sums[1] += kl;
                        sums[2] += ratio;
                        sums[3] += (ratio < lp.lo && a < 0.0) as u32 as f32;
                        sums[4] += (ratio > lp.hi && a > 0.0) as u32 as f32;
                    }
                    let s = w(lp.stats_off);
                    for (c, x) in sums.iter().enumerate() {
                        buf.work[s + c * rows + r] = *x;
                    }
                    buf.work[s + 5 * rows + r] = h * g as f32;
                    let dl = w(lp.dl_off) + r * v;
                    buf.work[dl..dl + v].fill(0.0);
                    for gi in 0..g {
                        let t = (bi * g + gi) * n + pos;
                        let at = dl + buf.ints[w(lp.i_tokens) + t] as usize;
                        buf.work[at] += buf.work[w(lp.coef_off) + t];
                    }
                    for (u, &xu) in x.iter().enumerate() {
                        buf.work[dl + u] -= rc * (xu * lp.inv_t - lz).exp();
                    }
                }
            }
            "scatter_dt" => {
                let nd = n * d;
                for i in 0..nd {
                    let (p, j) = (i / d, i % d);
                    for u in 0..v {
                        buf.work[w(lp.dt_off) + u * nd + i] = 0.0;
                    }
                    for bi in 0..b {
                        let tok = buf.ints[w(lp.i_prompts) + bi * n + p] as usize;
                        buf.work[w(lp.dt_off) + tok * nd + i] +=
                            buf.work[w(lp.denc_off) + bi * d + j];
                    }
                }
            }
            "argmax" => {
                for r in 0..rows {
                    let x = &buf.work[w(lp.logits_off) + r * v..w(lp.logits_off) + (r + 1) * v];
                    let mut best = 0;
                    for (u, &l) in x.iter().enumerate() {
                        if l > x[best] {
                            best = u;
                        }
                    }
                    buf.ints[w(lp.i_greedy) + r] = best as u32;
                }
            }
            "reduce" => {
                // reduce_partial then reduce_final: per chunk of `chunk` elements a partial
                // sum, then the sum of the partials (the kernel's tree order within a chunk
                // differs from this sequential one: equal within rounding).
                let (count, chunk) = (w(lp.count), w(lp.chunk).max(1));
                let nchunks = count.div_ceil(chunk).max(1);
                for c in 0..w(lp.channels) {
                    let mut total = 0.0f32;
                    for ch in 0..nchunks {
                        let mut part = 0.0f64;
                        for i in ch * chunk..((ch + 1) * chunk).min(count) {
                            let x = buf.work[w(lp.src_off) + c * count + i] as f64;
                            part += if lp.square == 1 { x * x } else { x };
                        }
                        buf.work[w(lp.part_off) + c * nchunks + ch] = part as f32;
                        total += part as f32;
                    }
                    buf.work[w(lp.sums_off) + c] = total;
                }
                let _ = CHUNK;
            }
            "adam" => {
                let norm = buf.work[w(lp.sums_off) + 6].sqrt();
                let scale = if lp.max_norm > 0.0 && norm > lp.max_norm {
                    lp.max_norm / norm
                } else {
                    1.0
                };
                for i in 0..w(lp.p_count) {
                    let gs = buf.work[w(lp.grad_off) + i] * scale;
                    let m = buf.model[w(lp.am_off) + i] * lp.b1 + gs * (1.0 - lp.b1);
                    let vv = buf.model[w(lp.av_off) + i] * lp.b2 + gs * gs * (1.0 - lp.b2);
                    buf.model[w(lp.am_off) + i] = m;
                    buf.model[w(lp.av_off) + i] = vv;
                    let update = m * lp.factor / (vv.sqrt() + lp.eps * lp.bc2);
                    buf.model[w(lp.w_off) + i] -= update * lp.lr;
                }
            }
            "copy_ref" => {
                for i in 0..w(lp.p_count) {
                    buf.model[w(lp.ref_off) + i] = buf.model[w(lp.w_off) + i];
                }
            }
            other => panic!("no reference for {other}"),
        }
    }
}

/// One kernel dispatch for [`KernelHarness::run`].
#[derive(Debug, Clone, Copy)]
pub enum HarnessOp {
    Matmul(MatmulParams, (u32, u32)),
    /// An entry point of lecture_step.wgsl over `count` invocations (`reduce` runs
    /// reduce_partial and reduce_final).
    Step(&'static str, StepParams, usize),
}

/// Runs single kernels on given buffers (the kernel tests): many cases in one submission.
pub struct KernelHarness {
    ctx: Arc<GpuContext>,
    programs: Programs,
}

impl KernelHarness {
    /// A harness running `kernel` for the products (the tests run both on any adapter).
    pub fn new(ctx: Arc<GpuContext>, kernel: MatmulKernel) -> Result<Self, EngineError> {
        Ok(Self {
            programs: Programs::new(&ctx, kernel)?,
            ctx,
        })
    }

    /// The matmul tile edge in use.
    pub fn tile(&self) -> u32 {
        self.programs.tile
    }

    /// Run `ops` in order on `buf` in one submission and return the buffers after.
    pub fn run(
        &self,
        buf: &reference::Buffers,
        ops: &[HarnessOp],
    ) -> Result<reference::Buffers, EngineError> {
        let ctx = &self.ctx;
        let device = &ctx.device;
        let model = WgslLectureEngine::storage(ctx, "harness.model", buf.model.len())?;
        let work = WgslLectureEngine::storage(ctx, "harness.work", buf.work.len())?;
        let ints = WgslLectureEngine::storage(ctx, "harness.ints", buf.ints.len())?;
        ctx.queue.write_buffer(&model, 0, &f32_bytes(&buf.model));
        ctx.queue.write_buffer(&work, 0, &f32_bytes(&buf.work));
        ctx.queue.write_buffer(&ints, 0, &u32_bytes(&buf.ints));
        let mut rec = Recorder::default();
        for op in ops {
            match *op {
                HarnessOp::Matmul(mm, src) => rec.matmul(&self.programs, src, mm),
                HarnessOp::Step("reduce", p, _) => rec.reduce(
                    &self.programs,
                    StepParams { sums_off: 0, ..p },
                    p.src_off as usize,
                    p.count as usize,
                    p.channels as usize,
                    p.sums_off,
                    p.square == 1,
                ),
                HarnessOp::Step(entry, p, count) => rec.step(&self.programs, entry, p, count),
            }
        }
        let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let slots = rec.slots.len().max(1) as u64;
        let uniform = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("harness.uniform"),
            size: slots * SLOT,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut uni = Vec::new();
        for s in &rec.slots {
            let mut bytes = match s {
                StepParamsOrMm::Step(p) => p.bytes(),
                StepParamsOrMm::Mm(m) => u32_bytes(&m.words()),
            };
            bytes.resize(SLOT as usize, 0);
            uni.extend_from_slice(&bytes);
        }
        if !uni.is_empty() {
            ctx.queue.write_buffer(&uniform, 0, &uni);
        }
        let group = step_bind_group(
            device,
            &self.programs.layout,
            "harness",
            [&uniform, &model, &work, &ints],
        );
        let mut encoder = device.create_command_encoder(&Default::default());
        {
            let mut pass = encoder.begin_compute_pass(&Default::default());
            for op in &rec.ops {
                if let Op::Step {
                    pipeline,
                    slot,
                    grid,
                    ..
                } = op
                {
                    pass.set_pipeline(pipeline);
                    pass.set_bind_group(0, &group, &[*slot * SLOT as u32]);
                    pass.dispatch_workgroups(grid.0, grid.1, grid.2);
                }
            }
        }
        let lens = [buf.model.len(), buf.work.len(), buf.ints.len()];
        let total: u64 = lens.iter().map(|l| (l * 4) as u64).sum();
        let staging = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("harness.staging"),
            size: total.max(4),
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut offset = 0;
        for (b, len) in [&model, &work, &ints].into_iter().zip(lens) {
            if len > 0 {
                encoder.copy_buffer_to_buffer(b, 0, &staging, offset, (len * 4) as u64);
            }
            offset += (len * 4) as u64;
        }
        ctx.queue.submit([encoder.finish()]);
        if let Some(error) = crate::gpu::context::scope_error(scope.pop()) {
            return Err(EngineError::Kernel(KernelError::Readback(
                error.to_string(),
            )));
        }
        let out = Staged::map(staging, total, lens.to_vec()).wait(ctx)?;
        Ok(reference::Buffers {
            model: f32s(&out[0]),
            work: f32s(&out[1]),
            ints: u32s(&out[2]),
        })
    }
}

/// The step kernels' bind group: one `SLOT` of the uniform buffer (its dynamic offset picks the
/// dispatch's parameters), the model, the work buffer and the token ids.
fn step_bind_group(
    device: &wgpu::Device,
    layout: &wgpu::BindGroupLayout,
    label: &str,
    [uniform, model, work, ints]: [&wgpu::Buffer; 4],
) -> wgpu::BindGroup {
    device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: Some(label),
        layout,
        entries: &[
            wgpu::BindGroupEntry {
                binding: 0,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer: uniform,
                    offset: 0,
                    size: wgpu::BufferSize::new(SLOT),
                }),
            },
            wgpu::BindGroupEntry {
                binding: 1,
                resource: model.as_entire_binding(),
            },
            wgpu::BindGroupEntry {
                binding: 2,
                resource: work.as_entire_binding(),
            },
            wgpu::BindGroupEntry {
                binding: 3,
                resource: ints.as_entire_binding(),
            },
        ],
    })
}
