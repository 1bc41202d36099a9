//! The compiled pipelines (every entry point of `matmul.wgsl`, `lecture_step.wgsl` and
//! `transformer.wgsl`) and the step kernels' bind group.

use super::*;

impl Programs {
    pub(super) fn new(ctx: &GpuContext, kernel: MatmulKernel) -> Result<Self, EngineError> {
        Self::with_heads(ctx, kernel, None)
    }

    /// [`Programs::new`] with transformer.wgsl compiled for heads of at most 16 (`Some(true)`),
    /// of more (`Some(false)`) or either, decided per dispatch (`None`): its `SMALL_HEADS`.
    pub(super) fn with_heads(
        ctx: &GpuContext,
        kernel: MatmulKernel,
        small_heads: Option<bool>,
    ) -> Result<Self, EngineError> {
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
        let matmul_module = module("matmul.wgsl", matmul_src.clone());
        let step_module = module("lecture_step.wgsl", format!("{COMMON}\n{STEP}"));
        let sample_module = module("sample.wgsl", format!("{COMMON}\n{SAMPLE}"));
        let transformer_module = module("transformer.wgsl", format!("{COMMON}\n{TRANSFORMER}"));
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
        let entries = (STEP_ENTRIES.map(|e| (e, &step_module)).into_iter())
            .chain(TRANSFORMER_ENTRIES.map(|e| (e, &transformer_module)));
        let heads = [("SMALL_HEADS", small_heads.map_or(2.0, |s| s as u32 as f64))];
        let step = entries.map(|(e, m)| {
            let consts: &[(&str, f64)] = if std::ptr::eq(m, &transformer_module) {
                &heads
            } else {
                &[]
            };
            (e, pipeline(&main_layout, m, e, consts))
        });
        let step = step.collect();
        let subgroup = kernel == MatmulKernel::WindowSubgroup;
        if subgroup && !MatmulKernel::subgroups_allow(ctx) {
            return Err(kerr(
                "adapter",
                "matmul_window_subgroup needs subgroups of at least 8 invocations",
            ));
        }
        let window_module = subgroup.then(|| {
            module(
                "matmul.wgsl + matmul_subgroup.wgsl",
                format!("{COMMON}\n{matmul_src}\n{MATMUL_SUBGROUP}"),
            )
        });
        let (window_module, window_entry) = match &window_module {
            Some(m) => (m, "matmul_window_subgroup"),
            None => (&matmul_module, "matmul_window"),
        };
        let window = (matches!(kernel, MatmulKernel::Window | MatmulKernel::WindowSubgroup)
            && limits.max_uniform_buffer_binding_size >= (WINDOW_ELEMS * 4) as u64)
            .then(|| {
                let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                    label: Some("matmul_window"),
                    entries: &[
                        layout_entry(0, Uniform, true),
                        layout_entry(2, rw, false),
                        layout_entry(4, Uniform, true),
                        layout_entry(5, Storage { read_only: true }, false),
                    ],
                });
                let pipeline_layout = pipeline_layout(&layout);
                // One variant of each entry point built now (a pipeline error surfaces here, in
                // the scope); the others on their first use.
                let programs = WindowPrograms {
                    device: device.clone(),
                    module: window_module.clone(),
                    entry: window_entry,
                    pipeline_layout,
                    pipelines: (0..WindowPrograms::index(B_WORK + 1, false, 0))
                        .map(|_| std::sync::OnceLock::new())
                        .collect(),
                    cols: if subgroup { 64 } else { 32 },
                    subgroup,
                    layout,
                    align: (limits.min_uniform_buffer_offset_alignment as usize / 4).max(1),
                };
                programs.pipeline(0);
                if subgroup {
                    programs.pipeline(WindowPrograms::index(0, true, 0));
                }
                programs
            });
        let sample_pl = pipeline_layout(&sample_layout);
        let row_weights = pipeline(&sample_pl, &sample_module, "row_weights", &[]);
        let draw = pipeline(&sample_pl, &sample_module, "draw", &[]);
        if let Some(error) = crate::gpu::context::scope_error(scope.pop()) {
            return Err(EngineError::Kernel(KernelError::Shader {
                file: "matmul.wgsl / lecture_step.wgsl / transformer.wgsl".into(),
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
            window,
        })
    }
}

/// `matmul_window`'s bind group ([`MatmulKernel::Window`]; `None` for the other kernels): the
/// uniform slots, the work buffer, a window of `source` (which holds [`WINDOW_ELEMS`] elements
/// past any window's start) and the model, read-only (the epilogues' biases and gains).
pub(super) fn window_bind_group(
    device: &wgpu::Device,
    programs: &Programs,
    [uniform, work, source, model]: [&wgpu::Buffer; 4],
) -> Option<wgpu::BindGroup> {
    let w = programs.window.as_ref()?;
    let slice = |buffer, size| {
        wgpu::BindingResource::Buffer(wgpu::BufferBinding {
            buffer,
            offset: 0,
            size: wgpu::BufferSize::new(size),
        })
    };
    Some(device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: Some("matmul_window"),
        layout: &w.layout,
        entries: &[
            wgpu::BindGroupEntry {
                binding: 0,
                resource: slice(uniform, SLOT),
            },
            wgpu::BindGroupEntry {
                binding: 2,
                resource: work.as_entire_binding(),
            },
            wgpu::BindGroupEntry {
                binding: 4,
                resource: slice(source, (WINDOW_ELEMS * 4) as u64),
            },
            wgpu::BindGroupEntry {
                binding: 5,
                resource: model.as_entire_binding(),
            },
        ],
    }))
}

pub(super) fn layout_entry(
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

/// The step kernels' bind group: one `SLOT` of the uniform buffer (its dynamic offset picks the
/// dispatch's parameters), the model, the work buffer and the token ids.
pub(super) fn step_bind_group(
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

/// The place of matmul_subgroup.wgsl's `B_WORK` pipelines (no epilogue, B read in place)
/// among the `EPI` values of [`WindowPrograms::index`].
pub(super) const B_WORK: usize = 7;

impl WindowPrograms {
    /// The pipeline of `EPI` `epi` (or [`B_WORK`]), one or `two` rows of C per invocation, and
    /// `modes` (`submit::window_modes`: 0 … 11).
    pub(super) fn index(epi: usize, two: bool, modes: usize) -> usize {
        epi * 24 + two as usize * 12 + modes
    }

    /// The kernel for a product of `m` rows: (two rows per invocation, columns, rows of a
    /// workgroup) — one row where the rows must be whole (`whole_rows`: a LayerNorm after) or
    /// the kernels are matmul_window's, else two past 64 rows.
    pub(super) fn rows_of(&self, m: u32, whole_rows: bool) -> (bool, u32, u32) {
        if self.subgroup && !whole_rows && m > 64 {
            (true, 32, 128)
        } else {
            (false, self.cols, 64)
        }
    }

    /// The grid of a window product of `m` rows and `n` columns on the kernel [`Self::rows_of`]
    /// picked (`(two, cols, rows)`). Lavapipe runs each of its threads on one contiguous run of
    /// a dispatch's workgroups (x fastest), so:
    /// - matmul_subgroup.wgsl's kernels take the row blocks along x and the column blocks along
    ///   y: each thread's run then holds whole sets of row blocks, the last (short) one among
    ///   them, where column blocks along x gave one thread the full blocks' workgroups and the
    ///   other the short one's (∂W_qkvᵀ on transformer-sort, 192 rows = 128 + 64 on the
    ///   two-row kernel: 4 workgroups). `matmul_window` takes column blocks × row blocks.
    /// - where the one-row subgroup kernel would run fewer than 4 workgroups (a product of at
    ///   most 64 rows), its row block is cut into up to 4 along z (matmul_subgroup.wgsl's
    ///   `rows_wg`): one workgroup used one core.
    pub(super) fn grid(
        &self,
        m: u32,
        n: u32,
        (two, cols, rows): (bool, u32, u32),
    ) -> (u32, u32, u32) {
        let (x, y) = (n.div_ceil(cols).max(1), m.div_ceil(rows).max(1));
        if !self.subgroup {
            return (x, y, 1);
        }
        let z = if !two && y == 1 && x < 4 {
            (4 / x).min(m.div_ceil(8)).max(1)
        } else {
            1
        };
        (y, x, z)
    }

    /// The pipeline at `index` (see `pipelines`), built on its first use: only the variants a
    /// run's products take are compiled (all 24 up front cost lavapipe ~0.4 s of set-up).
    /// `matmul_window` reads B entry by entry whatever VEC_B, stores C quad by quad and has one
    /// row per invocation, so it is built once per VEC_K and stands in every other place.
    pub(super) fn pipeline(&self, index: usize) -> wgpu::ComputePipeline {
        let subgroup = self.subgroup;
        debug_assert!(
            subgroup || index < 24,
            "epilogues are matmul_subgroup.wgsl's"
        );
        let slot = if subgroup { index } else { index / 3 % 2 * 3 };
        self.pipelines[slot]
            .get_or_init(|| {
                let epi = slot / 24;
                let consts = [
                    ("WHOLE", (slot / 6 % 2) as f64),
                    ("VEC_K", (slot / 3 % 2) as f64),
                    ("VEC_B", (slot % 3) as f64),
                    ("EPI", if epi == B_WORK { 0.0 } else { epi as f64 }),
                    ("B_WORK", (epi == B_WORK) as u32 as f64),
                ];
                let (entry, consts) = match (subgroup, slot % 24 >= 12) {
                    (true, true) => ("matmul_window_subgroup2", &consts[..]),
                    (true, false) => (self.entry, &consts[..]),
                    (false, _) => (self.entry, &consts[1..2]),
                };
                self.device
                    .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                        label: Some(entry),
                        layout: Some(&self.pipeline_layout),
                        module: &self.module,
                        entry_point: Some(entry),
                        compilation_options: wgpu::PipelineCompilationOptions {
                            constants: consts,
                            zero_initialize_workgroup_memory: true,
                        },
                        cache: None,
                    })
            })
            .clone()
    }
}
