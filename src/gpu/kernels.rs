//! GRPO's own compute kernels (`shaders/*.wgsl`) on the shared wgpu device. They live in
//! `grpo/`, beside the Rust references they are held equal to (`advantage`, `sampling`,
//! `loss`, `task::reward`), and use the device that `gpu::context` opens.
//!
//! Pipelines are built once from the WGSL files (compiled in with `include_str!`), bind
//! group layouts are written out, and buffers are kept in a pool and reused across
//! iterations. Every kernel has a plain-Rust reference (named in its file's header) and
//! tests hold them equal. In order, as wgpu's hello_compute: shader module, bind group
//! layout, pipeline (once); then per call: buffers, bind group, dispatch, copy, map, read.

use crate::gpu::GpuContext;
use crate::objective::advantage::GroupStats;
use crate::objective::sampling::SamplingParams;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use thiserror::Error;

const COMMON: &str = include_str!("../../shaders/common.wgsl");
const SAMPLE: &str = include_str!("../../shaders/sample.wgsl");
const SORT_REWARD: &str = include_str!("../../shaders/sort_reward.wgsl");
const ADVANTAGE: &str = include_str!("../../shaders/advantage.wgsl");

const WORKGROUP: u32 = 64;

#[derive(Debug, Error, Clone, PartialEq)]
pub enum KernelError {
    #[error("shaders/{file}: {error}")]
    Shader { file: String, error: String },
    #[error(
        "buffer `{buffer}` would need {requested} bytes, over the adapter's limit of {limit} bytes ({limit_name}); use a smaller batch"
    )]
    TooLarge {
        buffer: String,
        requested: u64,
        limit: u64,
        limit_name: &'static str,
    },
    #[error("{what}: {reason}")]
    Input { what: &'static str, reason: String },
    #[error("reading results back from the device failed: {0}")]
    Readback(String),
}

#[derive(Clone, Copy)]
enum Binding {
    Uniform,
    Read,
    ReadWrite,
}

struct Kernel {
    layout: wgpu::BindGroupLayout,
    pipelines: HashMap<&'static str, wgpu::ComputePipeline>,
}

/// The compiled kernels and their buffer pool.
pub struct Kernels {
    ctx: Arc<GpuContext>,
    sample: Kernel,
    reward: Kernel,
    advantage: Kernel,
    pool: Mutex<HashMap<&'static str, wgpu::Buffer>>,
    /// One call at a time: calls share the pooled buffers (and the staging buffer is mapped).
    busy: Mutex<()>,
}

impl std::fmt::Debug for Kernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Kernels on {}", self.ctx.summary.name)
    }
}

/// Compile one WGSL file (with `common.wgsl` before it) and its entry points, capturing
/// validation errors so they come back with the file name instead of a panic.
fn build_kernel(
    ctx: &GpuContext,
    file: &str,
    source: &str,
    bindings: &[Binding],
    entries: &[&'static str],
) -> Result<Kernel, KernelError> {
    let device = &ctx.device;
    let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
    let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some(file),
        source: wgpu::ShaderSource::Wgsl(format!("{COMMON}\n{source}").into()),
    });
    let entries_layout: Vec<wgpu::BindGroupLayoutEntry> = bindings
        .iter()
        .enumerate()
        .map(|(i, b)| wgpu::BindGroupLayoutEntry {
            binding: i as u32,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: match b {
                    Binding::Uniform => wgpu::BufferBindingType::Uniform,
                    Binding::Read => wgpu::BufferBindingType::Storage { read_only: true },
                    Binding::ReadWrite => wgpu::BufferBindingType::Storage { read_only: false },
                },
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: None,
        })
        .collect();
    let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
        label: Some(file),
        entries: &entries_layout,
    });
    let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
        label: Some(file),
        bind_group_layouts: &[Some(&layout)],
        immediate_size: 0,
    });
    let mut pipelines = HashMap::new();
    for entry in entries {
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(entry),
            layout: Some(&pipeline_layout),
            module: &module,
            entry_point: Some(entry),
            compilation_options: Default::default(),
            cache: None,
        });
        pipelines.insert(*entry, pipeline);
    }
    // Native wgpu answers at once. A browser answers later and the answer is dropped here
    // (this is sync): an invalid pipeline then fails when it is used.
    if let Some(Some(error)) = crate::gpu::context::block_on_ready(scope.pop()) {
        return Err(KernelError::Shader {
            file: file.to_string(),
            error: error.to_string(),
        });
    }
    Ok(Kernel { layout, pipelines })
}

/// Compile a WGSL source on its own (for tests of error reporting).
pub fn check_shader(
    ctx: &GpuContext,
    file: &str,
    source: &str,
    entry: &'static str,
) -> Result<(), KernelError> {
    build_kernel(ctx, file, source, &[], &[entry]).map(|_| ())
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}
fn u32_bytes(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// A uniform block of 32-bit words.
#[derive(Clone, Copy)]
enum Word {
    U(u32),
    F(f32),
}
fn words(ws: &[Word]) -> Vec<u8> {
    let mut out: Vec<u8> = ws
        .iter()
        .flat_map(|w| match w {
            Word::U(u) => u.to_le_bytes(),
            Word::F(f) => f.to_le_bytes(),
        })
        .collect();
    while !out.len().is_multiple_of(16) {
        out.push(0);
    }
    out
}

/// Outputs of the verifier kernel.
#[derive(Debug, Clone, PartialEq)]
pub struct ScoreOutput {
    /// Per response: distance, inclusion, ordering, exact.
    pub parts: Vec<[u32; 4]>,
    pub rewards: Vec<f32>,
}

/// Outputs of the advantage kernel.
#[derive(Debug, Clone, PartialEq)]
pub struct AdvantageOutput {
    /// In `AdvantageMode::GROUP` order, each `[B, G]`.
    pub by_mode: Vec<Vec<f32>>,
    pub groups: Vec<GroupStats>,
    pub batch_mean: f32,
    pub batch_std: f32,
}

impl Kernels {
    /// Build every pipeline once.
    pub fn new(ctx: Arc<GpuContext>) -> Result<Self, KernelError> {
        use Binding::*;
        let sample = build_kernel(
            &ctx,
            "sample.wgsl",
            SAMPLE,
            &[Uniform, Read, ReadWrite, ReadWrite],
            &["row_weights", "draw"],
        )?;
        let reward = build_kernel(
            &ctx,
            "sort_reward.wgsl",
            SORT_REWARD,
            &[Uniform, Read, Read, Read, ReadWrite, ReadWrite],
            &["score"],
        )?;
        let advantage = build_kernel(
            &ctx,
            "advantage.wgsl",
            ADVANTAGE,
            &[Uniform, Read, ReadWrite, ReadWrite, ReadWrite, ReadWrite],
            &["batch_stats", "group_advantages"],
        )?;
        Ok(Self {
            ctx,
            sample,
            reward,
            advantage,
            pool: Mutex::new(HashMap::new()),
            busy: Mutex::new(()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ()> {
        self.busy.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn context(&self) -> &Arc<GpuContext> {
        &self.ctx
    }

    fn check_size(&self, name: &str, bytes: u64) -> Result<(), KernelError> {
        let limits = self.ctx.device.limits();
        let binding = limits.max_storage_buffer_binding_size;
        if bytes > binding {
            return Err(KernelError::TooLarge {
                buffer: name.into(),
                requested: bytes,
                limit: binding,
                limit_name: "max_storage_buffer_binding_size",
            });
        }
        if bytes > limits.max_buffer_size {
            return Err(KernelError::TooLarge {
                buffer: name.into(),
                requested: bytes,
                limit: limits.max_buffer_size,
                limit_name: "max_buffer_size",
            });
        }
        Ok(())
    }

    /// A pooled buffer of at least `bytes`, reused when big enough.
    fn buffer(
        &self,
        name: &'static str,
        bytes: u64,
        usage: wgpu::BufferUsages,
    ) -> Result<wgpu::Buffer, KernelError> {
        self.check_size(name, bytes)?;
        let size = bytes.max(16).next_multiple_of(256);
        let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(b) = pool.get(name)
            && b.size() >= size
            && b.usage().contains(usage)
        {
            return Ok(b.clone());
        }
        let b = self.ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(name),
            size,
            usage,
            mapped_at_creation: false,
        });
        pool.insert(name, b.clone());
        Ok(b)
    }

    fn storage(&self, name: &'static str, bytes: u64) -> Result<wgpu::Buffer, KernelError> {
        self.buffer(
            name,
            bytes,
            wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_DST
                | wgpu::BufferUsages::COPY_SRC,
        )
    }

    fn upload(&self, name: &'static str, data: &[u8]) -> Result<wgpu::Buffer, KernelError> {
        let b = self.storage(name, data.len() as u64)?;
        if !data.is_empty() {
            self.ctx.queue.write_buffer(&b, 0, data);
        }
        Ok(b)
    }

    fn uniform(&self, name: &'static str, data: &[u8]) -> Result<wgpu::Buffer, KernelError> {
        let b = self.buffer(
            name,
            data.len() as u64,
            wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
        )?;
        self.ctx.queue.write_buffer(&b, 0, data);
        Ok(b)
    }

    /// Workgroups for `count` invocations of 64, spread over x and y past the per-dimension limit.
    fn grid(&self, count: usize) -> Result<(u32, u32), KernelError> {
        let groups = (count as u64).div_ceil(WORKGROUP as u64).max(1);
        let max = self
            .ctx
            .device
            .limits()
            .max_compute_workgroups_per_dimension as u64;
        let x = groups.min(max);
        let y = groups.div_ceil(x);
        if y > max {
            return Err(KernelError::TooLarge {
                buffer: "dispatch".into(),
                requested: count as u64,
                limit: max * max * WORKGROUP as u64,
                limit_name: "max_compute_workgroups_per_dimension² × 64 invocations",
            });
        }
        Ok((x as u32, y as u32))
    }

    fn bind(&self, kernel: &Kernel, buffers: &[&wgpu::Buffer]) -> wgpu::BindGroup {
        let entries: Vec<wgpu::BindGroupEntry> = buffers
            .iter()
            .enumerate()
            .map(|(i, b)| wgpu::BindGroupEntry {
                binding: i as u32,
                resource: b.as_entire_binding(),
            })
            .collect();
        self.ctx
            .device
            .create_bind_group(&wgpu::BindGroupDescriptor {
                label: None,
                layout: &kernel.layout,
                entries: &entries,
            })
    }

    fn dispatch(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        kernel: &Kernel,
        entry: &str,
        group: &wgpu::BindGroup,
        grid: (u32, u32),
    ) {
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some(entry),
            timestamp_writes: None,
        });
        pass.set_pipeline(&kernel.pipelines[entry]);
        pass.set_bind_group(0, group, &[]);
        pass.dispatch_workgroups(grid.0, grid.1, 1);
    }

    /// Submit `encoder` after copying the `(buffer, bytes)` outputs into one staging buffer,
    /// then map it and return each output's bytes.
    fn finish_and_read(
        &self,
        mut encoder: wgpu::CommandEncoder,
        outputs: &[(&wgpu::Buffer, u64)],
    ) -> Result<Vec<Vec<u8>>, KernelError> {
        let total: u64 = outputs.iter().map(|(_, n)| n.next_multiple_of(4)).sum();
        let staging = self.buffer(
            "staging",
            total.max(4),
            wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        )?;
        let mut offset = 0;
        for (buf, n) in outputs {
            if *n > 0 {
                encoder.copy_buffer_to_buffer(buf, 0, &staging, offset, *n);
            }
            offset += n.next_multiple_of(4);
        }
        self.ctx.queue.submit([encoder.finish()]);
        let slice = staging.slice(0..total.max(4));
        let (tx, rx) = std::sync::mpsc::channel();
        slice.map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        self.ctx
            .device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| KernelError::Readback(e.to_string()))?;
        rx.recv()
            .map_err(|e| KernelError::Readback(e.to_string()))?
            .map_err(|e| KernelError::Readback(e.to_string()))?;
        let mapped = slice
            .get_mapped_range()
            .map_err(|e| KernelError::Readback(e.to_string()))?;
        let mut out = Vec::new();
        let mut offset = 0usize;
        for (_, n) in outputs {
            out.push(mapped[offset..offset + *n as usize].to_vec());
            offset += n.next_multiple_of(4) as usize;
        }
        drop(mapped);
        staging.unmap();
        Ok(out)
    }

    pub(crate) fn encoder(&self) -> wgpu::CommandEncoder {
        self.ctx
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("grpo-lab"),
            })
    }

    fn encode_sample(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        logits: &[f32],
        (b, t, v, g): (usize, usize, usize, usize),
        params: SamplingParams,
        seed: u64,
        iteration: u32,
    ) -> Result<wgpu::Buffer, KernelError> {
        if logits.len() != b * t * v {
            return Err(KernelError::Input {
                what: "logits",
                reason: format!("{} values, expected B·T·V = {}", logits.len(), b * t * v),
            });
        }
        let u = self.uniform(
            "sample.params",
            &words(&[
                Word::U(b as u32),
                Word::U(g as u32),
                Word::U(t as u32),
                Word::U(v as u32),
                Word::F(1.0 / params.temperature),
                Word::U(params.top_k as u32),
                Word::F(params.top_p),
                Word::U(iteration),
                Word::U(seed as u32),
                Word::U((seed >> 32) as u32),
            ]),
        )?;
        let logits_buf = self.upload("sample.logits", &f32_bytes(logits))?;
        let weights = self.storage("sample.weights", (b * t * v * 4) as u64)?;
        let tokens = self.storage("sample.tokens", (b * g * t * 4) as u64)?;
        let group = self.bind(&self.sample, &[&u, &logits_buf, &weights, &tokens]);
        self.dispatch(
            encoder,
            &self.sample,
            "row_weights",
            &group,
            self.grid(b * t)?,
        );
        self.dispatch(encoder, &self.sample, "draw", &group, self.grid(b * g * t)?);
        Ok(tokens)
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn encode_score(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        prompts: &[u32],
        responses: &wgpu::Buffer,
        lengths: &[u32],
        (b, g, t, n): (usize, usize, usize, usize),
        weights: [f32; 3],
    ) -> Result<(wgpu::Buffer, wgpu::Buffer), KernelError> {
        if n > 64 {
            return Err(KernelError::Input {
                what: "prompt length",
                reason: format!("n = {n}, the verifier kernel handles n ≤ 64"),
            });
        }
        if prompts.len() != b * n || lengths.len() != b * g {
            return Err(KernelError::Input {
                what: "verifier input",
                reason: format!(
                    "{} prompt values for B·n = {}, {} lengths for B·G = {}",
                    prompts.len(),
                    b * n,
                    lengths.len(),
                    b * g
                ),
            });
        }
        let u = self.uniform(
            "reward.params",
            &words(&[
                Word::U(b as u32),
                Word::U(g as u32),
                Word::U(t as u32),
                Word::U(n as u32),
                Word::F(weights[0]),
                Word::F(weights[1]),
                Word::F(weights[2]),
            ]),
        )?;
        let prompts_buf = self.upload("reward.prompts", &u32_bytes(prompts))?;
        let lengths_buf = self.upload("reward.lengths", &u32_bytes(lengths))?;
        let parts = self.storage("reward.parts", (b * g * 16) as u64)?;
        let rewards = self.storage("reward.rewards", (b * g * 4) as u64)?;
        let group = self.bind(
            &self.reward,
            &[&u, &prompts_buf, responses, &lengths_buf, &parts, &rewards],
        );
        self.dispatch(encoder, &self.reward, "score", &group, self.grid(b * g)?);
        Ok((parts, rewards))
    }

    pub(crate) fn encode_advantages(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        rewards: &wgpu::Buffer,
        b: usize,
        g: usize,
    ) -> Result<[wgpu::Buffer; 4], KernelError> {
        let u = self.uniform(
            "advantage.params",
            &words(&[Word::U(b as u32), Word::U(g as u32)]),
        )?;
        let batch = self.storage("advantage.batch", 8)?;
        let stats = self.storage("advantage.stats", (b * 16) as u64)?;
        let zero = self.storage("advantage.zero_std", (b * 4) as u64)?;
        let adv = self.storage("advantage.advantages", (6 * b * g * 4) as u64)?;
        let group = self.bind(&self.advantage, &[&u, rewards, &batch, &stats, &zero, &adv]);
        self.dispatch(encoder, &self.advantage, "batch_stats", &group, (1, 1));
        self.dispatch(
            encoder,
            &self.advantage,
            "group_advantages",
            &group,
            self.grid(b)?,
        );
        Ok([batch, stats, zero, adv])
    }

    fn read_advantages(bufs: &[Vec<u8>], b: usize, g: usize) -> AdvantageOutput {
        let f = |bytes: &[u8]| -> Vec<f32> {
            bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect()
        };
        let u = |bytes: &[u8]| -> Vec<u32> {
            bytes
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
                .collect()
        };
        let batch = f(&bufs[0]);
        let stats = f(&bufs[1]);
        let zero = u(&bufs[2]);
        let adv = f(&bufs[3]);
        AdvantageOutput {
            by_mode: adv.chunks(b * g).map(|c| c.to_vec()).collect(),
            groups: (0..b)
                .map(|i| GroupStats {
                    mean: stats[i * 4],
                    std: stats[i * 4 + 1],
                    max: stats[i * 4 + 2],
                    min: stats[i * 4 + 3],
                    zero_std: zero[i] == 1,
                })
                .collect(),
            batch_mean: batch[0],
            batch_std: batch[1],
        }
    }

    /// Sample `[B, G, T]` tokens from `logits [B, T, V]` (the kernel path of `grpo::sampling`).
    #[allow(clippy::too_many_arguments)]
    pub fn sample(
        &self,
        logits: &[f32],
        b: usize,
        t: usize,
        v: usize,
        g: usize,
        params: SamplingParams,
        seed: u64,
        iteration: u32,
    ) -> Result<Vec<u32>, KernelError> {
        let _busy = self.lock();
        let mut enc = self.encoder();
        let tokens = self.encode_sample(&mut enc, logits, (b, t, v, g), params, seed, iteration)?;
        let out = self.finish_and_read(enc, &[(&tokens, (b * g * t * 4) as u64)])?;
        Ok(to_u32(&out[0]))
    }

    /// Score `[B, G, T]` responses (each with a length) against `[B, n]` prompts.
    #[allow(clippy::too_many_arguments)]
    pub fn score(
        &self,
        prompts: &[u32],
        responses: &[u32],
        lengths: &[u32],
        b: usize,
        g: usize,
        t: usize,
        n: usize,
        weights: [f32; 3],
    ) -> Result<ScoreOutput, KernelError> {
        let _busy = self.lock();
        if responses.len() != b * g * t {
            return Err(KernelError::Input {
                what: "responses",
                reason: format!("{} values, expected B·G·T = {}", responses.len(), b * g * t),
            });
        }
        let mut enc = self.encoder();
        let resp = self.upload("reward.responses", &u32_bytes(responses))?;
        let (parts, rewards) =
            self.encode_score(&mut enc, prompts, &resp, lengths, (b, g, t, n), weights)?;
        let out = self.finish_and_read(
            enc,
            &[
                (&parts, (b * g * 16) as u64),
                (&rewards, (b * g * 4) as u64),
            ],
        )?;
        Ok(ScoreOutput {
            parts: to_parts(&out[0]),
            rewards: to_f32(&out[1]),
        })
    }

    /// Every advantage mode, group statistics and batch statistics for `[B, G]` rewards.
    pub fn advantages(&self, rewards: &[f32], g: usize) -> Result<AdvantageOutput, KernelError> {
        let _busy = self.lock();
        if g == 0 || rewards.is_empty() || !rewards.len().is_multiple_of(g) {
            return Err(KernelError::Input {
                what: "rewards",
                reason: format!(
                    "{} values is not a whole number of groups of {g}",
                    rewards.len()
                ),
            });
        }
        let b = rewards.len() / g;
        let mut enc = self.encoder();
        let r = self.upload("advantage.rewards", &f32_bytes(rewards))?;
        let bufs = self.encode_advantages(&mut enc, &r, b, g)?;
        let sizes = [8, (b * 16) as u64, (b * 4) as u64, (6 * b * g * 4) as u64];
        let out = self.finish_and_read(
            enc,
            &[
                (&bufs[0], sizes[0]),
                (&bufs[1], sizes[1]),
                (&bufs[2], sizes[2]),
                (&bufs[3], sizes[3]),
            ],
        )?;
        Ok(Self::read_advantages(&out, b, g))
    }

    /// Rollout, verify and (optionally) advantages in one submission: the tokens go from the
    /// sampler to the verifier, and the rewards to the advantage kernel, without leaving the device.
    #[allow(clippy::too_many_arguments)]
    pub fn rollout(
        &self,
        logits: &[f32],
        prompts: &[u32],
        (b, t, v, g, n): (usize, usize, usize, usize, usize),
        params: SamplingParams,
        seed: u64,
        iteration: u32,
        weights: [f32; 3],
        with_advantages: bool,
    ) -> Result<(Vec<u32>, ScoreOutput, Option<AdvantageOutput>), KernelError> {
        let _busy = self.lock();
        let mut enc = self.encoder();
        let tokens = self.encode_sample(&mut enc, logits, (b, t, v, g), params, seed, iteration)?;
        let lengths = vec![t as u32; b * g];
        let (parts, rewards) =
            self.encode_score(&mut enc, prompts, &tokens, &lengths, (b, g, t, n), weights)?;
        let mut outputs: Vec<(&wgpu::Buffer, u64)> = vec![
            (&tokens, (b * g * t * 4) as u64),
            (&parts, (b * g * 16) as u64),
            (&rewards, (b * g * 4) as u64),
        ];
        let adv_bufs = if with_advantages {
            Some(self.encode_advantages(&mut enc, &rewards, b, g)?)
        } else {
            None
        };
        if let Some(bufs) = &adv_bufs {
            outputs.extend([
                (&bufs[0], 8),
                (&bufs[1], (b * 16) as u64),
                (&bufs[2], (b * 4) as u64),
                (&bufs[3], (6 * b * g * 4) as u64),
            ]);
        }
        let out = self.finish_and_read(enc, &outputs)?;
        let advantages = adv_bufs.map(|_| Self::read_advantages(&out[3..7], b, g));
        Ok((
            to_u32(&out[0]),
            ScoreOutput {
                parts: to_parts(&out[1]),
                rewards: to_f32(&out[2]),
            },
            advantages,
        ))
    }
}

fn to_f32(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}
fn to_u32(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}
fn to_parts(bytes: &[u8]) -> Vec<[u32; 4]> {
    to_u32(bytes)
        .chunks_exact(4)
        .map(|c| [c[0], c[1], c[2], c[3]])
        .collect()
}
