//! Submissions and read-backs: the recorder of one submission's dispatches (each with its
//! uniform slot), the submission itself, the staged (asynchronous) read-back, the profiler.

use super::*;

impl WgslLectureEngine {
    /// Run `ops` as one submission and read back `(buffer, element offset, elements)`,
    /// waiting for it (natively; the browser cannot wait: there it is an error, and only
    /// [`Engine::iteration`] reads back, asynchronously).
    pub(super) fn submit(
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
    pub(super) fn submit_staged(
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
            uni.extend_from_slice(&s.slot_bytes());
        }
        if !uni.is_empty() {
            self.ctx.queue.write_buffer(&plan.uniform, 0, &uni);
        }
        let mut ops = ops;
        if std::env::var_os("GRPO_WGSL_PROFILE").is_some() {
            profile(&self.ctx, &plan.group, &mut ops, slots);
        }
        let (mut buffers, mut encoder) = encode_ops(device, plan, ops);
        let reads: Vec<(&wgpu::Buffer, usize, usize)> = reads
            .iter()
            .map(|(which, at, len)| {
                let src = match which {
                    Reads::Work => &plan.work,
                    Reads::Ints => &plan.ints,
                    Reads::Model => &self.model,
                    Reads::Buffer(b) => b,
                };
                (src, *at, *len)
            })
            .collect();
        let (staging, total, lens) = stage(device, &mut encoder, &reads);
        buffers.push(encoder.finish());
        self.ctx.queue.submit(buffers);
        self.count_submission();
        if let Some(error) = crate::gpu::context::scope_error(scope.pop()) {
            return Err(EngineError::Kernel(KernelError::Readback(format!(
                "the device refused the submission: {error}"
            ))));
        }
        Ok(Staged::map(staging, total, lens))
    }
}

/// Runs `ops` (drained: the caller runs none of them again) one per submission, in order,
/// waiting for each, and prints to stderr each dispatch's time by label, shape and grid:
/// `GRPO_WGSL_PROFILE=1`. Each op runs once, on the run's own values, so the run's results
/// are unchanged and so is what each dispatch computes on (a profile that repeated each
/// dispatch 20 times compounded the accumulating ones, `C += A·B`: downstream products then
/// read subnormal gradients a real run never holds and timed 4–10× too slow). Each time
/// includes one submission and its wait; an empty submission's time is printed first.
/// Diagnostics only: far slower than one submission.
pub(super) fn profile(
    ctx: &GpuContext,
    group: &wgpu::BindGroup,
    ops: &mut Vec<Op>,
    slots: &[StepParamsOrMm],
) {
    let device = &ctx.device;
    let submit_and_wait = |buffer: wgpu::CommandBuffer| {
        let t0 = std::time::Instant::now();
        ctx.queue.submit([buffer]);
        let _ = device.poll(wgpu::PollType::wait_indefinitely());
        t0.elapsed().as_secs_f64() * 1e3
    };
    let empty = submit_and_wait(device.create_command_encoder(&Default::default()).finish());
    let mut lines = vec![format!("{empty:9.3} ms  (an empty submission)")];
    for op in ops.drain(..) {
        if let Op::Commands(commands) = op {
            let ms = submit_and_wait(commands);
            lines.push(format!("{ms:9.3} ms  commands"));
            continue;
        }
        let what = match op.dispatch(group) {
            Some(d) => match (d.slot, d.label) {
                (Some(slot), label) => match &slots[slot as usize] {
                    StepParamsOrMm::Mm(m)
                    | StepParamsOrMm::MmThen(m, _)
                    | StepParamsOrMm::MmRowSums(m, _) => {
                        format!("{label} {}x{}x{} b{} {:?}", m.m, m.n, m.k, m.batch, d.grid)
                    }
                    StepParamsOrMm::Step(_) | StepParamsOrMm::Tf(_) => {
                        format!("{label} {:?}", d.grid)
                    }
                },
                (None, label) => format!("{label} {:?}", d.grid),
            },
            None => "copy / clear".to_string(),
        };
        let mut encoder = device.create_command_encoder(&Default::default());
        dispatch_all(&mut encoder, group, std::slice::from_ref(&op));
        let ms = submit_and_wait(encoder.finish());
        lines.push(format!("{ms:9.3} ms  {what}"));
    }
    eprintln!("[wgsl profile]\n{}", lines.join("\n"));
}

/// Copy `reads` (buffer, element offset, elements) into one new staging buffer at the end of
/// `encoder`: the buffer, its bytes and each read's elements (for [`Staged::map`] once the
/// encoder is submitted).
pub(super) fn stage(
    device: &wgpu::Device,
    encoder: &mut wgpu::CommandEncoder,
    reads: &[(&wgpu::Buffer, usize, usize)],
) -> (wgpu::Buffer, u64, Vec<usize>) {
    let total: u64 = reads.iter().map(|r| (r.2 * 4) as u64).sum();
    let staging = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("wgsl.staging"),
        size: total.max(4).next_multiple_of(4),
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut offset = 0u64;
    for &(src, at, len) in reads {
        let bytes = (len * 4) as u64;
        if bytes > 0 {
            encoder.copy_buffer_to_buffer(src, (at * 4) as u64, &staging, offset, bytes);
        }
        offset += bytes;
    }
    (staging, total, reads.iter().map(|r| r.2).collect())
}

/// `ops` in order into `encoder`: copies as copies, each run of dispatches in one compute pass
/// (the step kernels on `group` at their uniform slots, sample.wgsl on its own group).
/// Commands encoded elsewhere are not among them ([`encode_ops`] splits at those).
pub(super) fn dispatch_all(
    encoder: &mut wgpu::CommandEncoder,
    group: &wgpu::BindGroup,
    ops: &[Op],
) {
    let mut i = 0;
    while i < ops.len() {
        match &ops[i] {
            Op::Copy {
                src,
                src_off,
                dst,
                dst_off,
                bytes,
            } => {
                if *bytes > 0 {
                    encoder.copy_buffer_to_buffer(src, *src_off, dst, *dst_off, *bytes);
                }
                i += 1;
                continue;
            }
            Op::Clear {
                buffer,
                offset,
                bytes,
            } => {
                if *bytes > 0 {
                    encoder.clear_buffer(buffer, *offset, Some(*bytes));
                }
                i += 1;
                continue;
            }
            _ => {}
        }
        let mut pass = encoder.begin_compute_pass(&Default::default());
        while let Some(op) = ops.get(i) {
            match op {
                Op::Copy { .. } | Op::Clear { .. } => break,
                Op::Commands(_) => unreachable!("encode_ops splits at commands"),
                _ => {
                    let d = op.dispatch(group).expect("a dispatch");
                    pass.set_pipeline(d.pipeline);
                    pass.set_bind_group(0, d.group, d.offsets());
                    pass.dispatch_workgroups(d.grid.0, d.grid.1, d.grid.2);
                }
            }
            i += 1;
        }
    }
}

/// What a dispatch op binds and runs.
pub(super) struct Dispatch<'a> {
    pipeline: &'a wgpu::ComputePipeline,
    group: &'a wgpu::BindGroup,
    offsets: [u32; 2],
    /// How many of `offsets` the bind group takes.
    dynamic: usize,
    grid: (u32, u32, u32),
    /// The uniform slot (none for sample.wgsl's dispatches) and a label for the profile.
    slot: Option<u32>,
    label: &'static str,
}

impl Dispatch<'_> {
    fn offsets(&self) -> &[u32] {
        &self.offsets[..self.dynamic]
    }
}

impl Op {
    /// The dispatch `self` records (the step kernels on `group`); `None` for copies and
    /// encoded commands.
    pub(super) fn dispatch<'a>(&'a self, group: &'a wgpu::BindGroup) -> Option<Dispatch<'a>> {
        let slot_offset = |slot: u32| slot * SLOT as u32;
        Some(match self {
            Op::Step {
                pipeline,
                slot,
                grid,
                label,
            } => Dispatch {
                pipeline,
                group,
                offsets: [slot_offset(*slot), 0],
                dynamic: 1,
                grid: *grid,
                slot: Some(*slot),
                label,
            },
            Op::Window {
                pipeline,
                slot,
                window,
                grid,
                group,
            } => Dispatch {
                pipeline,
                group,
                offsets: [slot_offset(*slot), *window],
                dynamic: 2,
                grid: *grid,
                slot: Some(*slot),
                label: "matmul_window",
            },
            Op::Sample {
                pipeline,
                grid,
                group,
            } => Dispatch {
                pipeline,
                group,
                offsets: [0, 0],
                dynamic: 0,
                grid: *grid,
                slot: None,
                label: "sample",
            },
            Op::Copy { .. } | Op::Clear { .. } | Op::Commands(_) => return None,
        })
    }
}

/// The window pipeline for `part` on a kernel with `cols` columns per workgroup: `WHOLE` (C
/// row-major from multiples of 4 and n a multiple of `cols`: stored as whole quads) × 6 +
/// `VEC_K` (A along k from multiples of 4) × 3 + `VEC_B` (matmul_subgroup.wgsl: 1 B row-major
/// from multiples of 4, 2 B along k from multiples of 4, 0 any other strides).
fn window_modes(part: &MatmulParams, cols: u32) -> usize {
    let [a_off, a_rs, a_cs, _] = part.a;
    let [b_off, b_rs, b_cs, _] = part.b;
    let vec_k = a_cs == 1 && (a_off | a_rs | part.k).is_multiple_of(4);
    let vec_b = if b_cs == 1 && (b_off | b_rs).is_multiple_of(4) {
        1
    } else if b_rs == 1 && (b_off | b_cs | part.k).is_multiple_of(4) {
        2
    } else {
        0
    };
    let [c_off, c_rs, _] = part.c;
    let whole = part.c_cs <= 1 && (c_off | c_rs).is_multiple_of(4) && part.n.is_multiple_of(cols);
    whole as usize * 6 + vec_k as usize * 3 + vec_b
}

/// `mm` (B in the model buffer) as `matmul_window` products, each with the byte offset of its
/// window (a multiple of `align` elements; the part's `b_off` counts from it): one product
/// where B's entries span at most a window, else B cut into ranges of k (accumulated into C in
/// order) or of columns, whichever strides apart less far. `None` where one row or column of
/// B alone exceeds a window.
fn window_parts(mm: MatmulParams, align: usize) -> Option<Vec<(MatmulParams, u32)>> {
    let u = |x: usize| x as u32;
    let [b_off, rs, cs, _] = mm.b.map(|x| x as usize);
    let (k, n) = (mm.k as usize, mm.n as usize);
    if k == 0 || n == 0 {
        return None;
    }
    let room = WINDOW_ELEMS - (align - 1);
    let span = |k: usize, n: usize| (k - 1) * rs + (n - 1) * cs + 1;
    // The most rows (columns) of B in a window, rounded down to the kernel's steps.
    let most = |one: usize, stride: usize, step: usize| {
        let c = if one > room {
            0
        } else {
            (room - one) / stride.max(1) + 1
        };
        if c >= step { c / step * step } else { c }
    };
    let (along_k, chunk) = if b_off % align + span(k, n) <= WINDOW_ELEMS {
        (true, k)
    } else if rs >= cs {
        (true, most(span(1, n), rs, 4))
    } else {
        (false, most(span(k, 1), cs, 32))
    };
    if chunk == 0 {
        return None;
    }
    let total = if along_k { k } else { n };
    let parts = (0..total).step_by(chunk).map(|at| {
        let len = chunk.min(total - at);
        let mut part = mm;
        if along_k {
            part.k = u(len);
            part.a[0] += u(at) * mm.a[2];
            part.b[0] = u(b_off + at * rs);
            part.accumulate = mm.accumulate || at > 0;
        } else {
            part.n = u(len);
            part.b[0] = u(b_off + at * cs);
            part.c[0] += u(at) * mm.c_cs.max(1);
        }
        let base = part.b[0] as usize / align * align;
        part.b[0] -= u(base);
        (part, u(base * 4))
    });
    Some(parts.collect())
}

/// Workgroups for `count` invocations of 64, over x and y past 65 535 per dimension.
pub(super) fn grid_1d(count: usize) -> (u32, u32, u32) {
    grid_of(count, 64)
}

/// Workgroups of `width` for `count` invocations, over x and y past 65 535 per dimension (the
/// kernels' flat index: `gid.x + gid.y · nwg.x · width`).
pub(super) fn grid_of(count: usize, width: usize) -> (u32, u32, u32) {
    let groups = count.div_ceil(width).max(1);
    let x = groups.min(65_535);
    (x as u32, groups.div_ceil(x) as u32, 1)
}

/// What a window product does with its result besides storing it (matmul_subgroup.wgsl's
/// `EPI` pipelines): the work of the dispatch that would follow it, in the product's own. Every
/// offset is an element offset of the product's first row (shifted like C's); the host asks
/// only where they are multiples of 4 ([`Epilogue::aligned`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Epilogue {
    /// `h = C + b₁` (`bias` in the model), GELU's output `h·Φ(h)` at `act`; with `keep`, `h` at
    /// C and `Φ(h)` at `cdf` (transformer.wgsl's `bias_gelu4` / `bias_gelu4_act`).
    Gelu {
        bias: u32,
        act: u32,
        cdf: u32,
        keep: bool,
    },
    /// `x = C` (`+ b` where `bias`: the block's b₂) stored at C, then the LayerNorm of each row:
    /// `y` with the gain at `gain` (β after it); with `keep`, `x̂` at `xhat` and `1/σ` at `rstd`
    /// (`layer_norm4` / `layer_norm4_y`). C's rows must be whole in one invocation: n = 64.
    Norm {
        bias: Option<u32>,
        gain: u32,
        y: u32,
        xhat: u32,
        rstd: u32,
        keep: bool,
    },
    /// GELU's backward: `C·(Φ(h) + h·φ(h))` stored at C, C the gradient of GELU's output
    /// (`h` at `pre`, `Φ(h)` at `cdf`; transformer.wgsl's `gelu_backward4`).
    GeluBack { pre: u32, cdf: u32 },
    /// LayerNorm's backward: C (the LayerNorm's dy) stored, then each row's `dx` into `dx`
    /// (added to where `add`), with the gain at `gain` and the forward's `x̂` at `xhat` and
    /// `1/σ` at `rstd` (`ln_backward4`). C's rows must be whole in one invocation: n = 64.
    LnBack {
        gain: u32,
        xhat: u32,
        rstd: u32,
        dx: u32,
        add: bool,
    },
}

impl Epilogue {
    /// matmul_subgroup.wgsl's `EPI` for it (1 … 6).
    pub(super) fn mode(&self) -> usize {
        match self {
            Self::Gelu { keep, .. } => 1 + *keep as usize,
            Self::Norm { keep, .. } => 3 + *keep as usize,
            Self::GeluBack { .. } => 5,
            Self::LnBack { .. } => 6,
        }
    }

    /// Whether each row of C must be whole in one invocation (the LayerNorms).
    pub(super) fn whole_rows(&self) -> bool {
        matches!(self, Self::Norm { .. } | Self::LnBack { .. })
    }

    /// Whether every vector the epilogue reads or writes starts at a multiple of 4.
    pub(super) fn aligned(&self) -> bool {
        let quads = |xs: &[u32]| xs.iter().all(|x| x.is_multiple_of(4));
        match *self {
            Self::Gelu { bias, act, cdf, .. } => quads(&[bias, act, cdf]),
            Self::Norm {
                bias,
                gain,
                y,
                xhat,
                ..
            } => quads(&[bias.unwrap_or(0), gain, y, xhat]),
            Self::GeluBack { pre, cdf } => quads(&[pre, cdf]),
            Self::LnBack { gain, xhat, dx, .. } => quads(&[gain, xhat, dx]),
        }
    }

    /// `Mm`'s fields `e_bias` … `e_pad1`.
    pub(super) fn words(&self) -> [u32; 8] {
        match *self {
            Self::Gelu { bias, act, cdf, .. } => [bias, 0, act, cdf, 0, 0, 0, 0],
            Self::Norm {
                bias,
                gain,
                y,
                xhat,
                rstd,
                ..
            } => [
                bias.unwrap_or(0),
                gain,
                y,
                xhat,
                rstd,
                bias.is_some() as u32,
                0,
                0,
            ],
            Self::GeluBack { pre, cdf } => [0, 0, cdf, pre, 0, 0, 0, 0],
            Self::LnBack {
                gain,
                xhat,
                rstd,
                dx,
                add,
            } => [0, gain, dx, xhat, rstd, (add as u32) << 1, 0, 0],
        }
    }
}

impl Recorder {
    pub(super) fn step(
        &mut self,
        p: &Programs,
        entry: &'static str,
        params: StepParams,
        count: usize,
    ) {
        self.step_grid(p, entry, params, grid_1d(count));
    }

    pub(super) fn step_grid(
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

    pub(super) fn matmul(&mut self, p: &Programs, src: (u32, u32), mm: MatmulParams) {
        if src == (1, 0)
            && let Some(group) = self.window.clone()
            && self.windowed(p, &group, mm, None)
        {
            return;
        }
        let tile = p.tile;
        let batch = if mm.reduce { 1 } else { mm.batch.max(1) };
        let grid = match p.kernel {
            MatmulKernel::Tiled => (
                mm.n.div_ceil(tile).max(1),
                mm.m.div_ceil(tile).max(1),
                batch,
            ),
            MatmulKernel::Rows | MatmulKernel::Window | MatmulKernel::WindowSubgroup => {
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

    /// `mm` (A and C in `work`, B in the model) followed by `then` in the product's own
    /// dispatch: true where recorded so — matmul_subgroup.wgsl's kernels, C stored as whole
    /// quads, B cut (if at all) into ranges of k, whose last one runs the epilogue — else
    /// false, with nothing recorded (the caller records the product and the dispatch after it).
    pub(super) fn matmul_then(&mut self, p: &Programs, mm: MatmulParams, then: Epilogue) -> bool {
        match self.window.clone() {
            Some(group) => self.windowed(p, &group, mm, Some(then)),
            None => false,
        }
    }

    /// `mm` through `matmul_window`, B read through windows of the buffer that `group` binds
    /// (A in `work`), and `then` after it where given ([`Self::matmul_then`]); false (nothing
    /// recorded) where the kernel or the product does not allow it.
    pub(super) fn windowed(
        &mut self,
        p: &Programs,
        group: &wgpu::BindGroup,
        mm: MatmulParams,
        then: Option<Epilogue>,
    ) -> bool {
        let Some(w) = &p.window else {
            return false;
        };
        if mm.reduce || mm.batch > 1 {
            return false;
        }
        let Some(parts) = window_parts(mm, w.align) else {
            return false;
        };
        // Two rows of C per invocation where there are more than 64 rows (not with a
        // LayerNorm after: its rows must be whole in one invocation).
        let norm = then.is_some_and(|e| e.whole_rows());
        let cols = |part: &MatmulParams| w.rows_of(part.m, norm).1;
        if let Some(e) = then {
            let whole = |part: &MatmulParams| window_modes(part, cols(part)) >= 6;
            let fits = w.subgroup
                && e.aligned()
                && (!norm || (mm.n == 64 && mm.c[1] == 64))
                && parts
                    .iter()
                    .all(|(part, _)| part.n == mm.n && part.c[0] == mm.c[0] && whole(part));
            if !fits {
                return false;
            }
        }
        let last = parts.len() - 1;
        for (i, (part, window)) in parts.into_iter().enumerate() {
            let slot = self.slots.len() as u32;
            let epi = then.filter(|_| i == last);
            self.slots.push(match epi {
                Some(e) => StepParamsOrMm::MmThen(part, e),
                None => StepParamsOrMm::Mm(part),
            });
            let kernel = w.rows_of(part.m, norm);
            let (two, cols, _) = kernel;
            let mode = epi.map_or(0, |e| e.mode());
            self.ops.push(Op::Window {
                pipeline: w.pipeline(WindowPrograms::index(mode, two, window_modes(&part, cols))),
                slot,
                window,
                grid: w.grid(part.m, part.n, kernel),
                group: group.clone(),
            });
            self.dispatches += 1;
        }
        true
    }

    /// `mm` through matmul_subgroup.wgsl's kernels with B read from the work buffer (`B_WORK`:
    /// `mm.b` counts in `work`, as A does), all of k in one dispatch: the weight gradients,
    /// whose B spans many windows. False (nothing recorded) where the kernels are others or B's
    /// strides do not allow whole-quad reads (`VEC_B` 1 or 2). With `row_sums`, each row's sum
    /// of A (in k order) into `work[row_sums + row]` too: a bias's gradient where A = dYᵀ.
    pub(super) fn matmul_b_work(
        &mut self,
        p: &Programs,
        group: &wgpu::BindGroup,
        mm: MatmulParams,
        row_sums: Option<u32>,
    ) -> bool {
        let Some(w) = p.window.as_ref().filter(|w| w.subgroup) else {
            return false;
        };
        if mm.reduce || mm.batch > 1 || mm.k == 0 || mm.n == 0 {
            return false;
        }
        let (two, cols, rows) = w.rows_of(mm.m, false);
        let modes = window_modes(&mm, cols);
        let vec_b = modes % 3;
        if vec_b == 0 {
            return false;
        }
        let slot = self.slots.len() as u32;
        self.slots.push(match row_sums {
            Some(dst) => StepParamsOrMm::MmRowSums(mm, dst),
            None => StepParamsOrMm::Mm(mm),
        });
        self.ops.push(Op::Window {
            pipeline: w.pipeline(WindowPrograms::index(programs::B_WORK, two, modes)),
            slot,
            window: 0,
            grid: w.grid(mm.m, mm.n, (two, cols, rows)),
            group: group.clone(),
        });
        self.dispatches += 1;
        true
    }

    /// A two-level sum of `channels` channels of `count` elements from `src` into
    /// `sums[dst..dst + channels]` (squared when `square`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn reduce(
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

impl Staged {
    /// Ask for `staging`'s first `total` bytes (read-backs of `lens` elements, in order) to be
    /// mapped, after the submission that fills it.
    pub(super) fn map(staging: wgpu::Buffer, total: u64, lens: Vec<usize>) -> Self {
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
    pub(super) fn is_ready(&self) -> bool {
        self.total == 0
            || self
                .ready
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_some()
    }

    /// Wait for the device, then read (natively).
    pub(super) fn wait(self, ctx: &GpuContext) -> Result<Vec<Vec<u8>>, EngineError> {
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
    pub(super) fn read(self) -> Result<Vec<Vec<u8>>, EngineError> {
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

/// The command buffers of one submission, in order: the recorded ops, broken where commands
/// encoded elsewhere come in. Returns them with the encoder still open (the read-backs go
/// last).
fn encode_ops(
    device: &wgpu::Device,
    plan: &Plan,
    ops: Vec<Op>,
) -> (Vec<wgpu::CommandBuffer>, wgpu::CommandEncoder) {
    let new_encoder = || {
        device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
            label: Some("wgsl_lecture"),
        })
    };
    let mut buffers = Vec::new();
    let mut encoder = new_encoder();
    let mut run = Vec::new();
    for op in ops {
        if let Op::Commands(commands) = op {
            dispatch_all(&mut encoder, &plan.group, &std::mem::take(&mut run));
            buffers.push(std::mem::replace(&mut encoder, new_encoder()).finish());
            buffers.push(commands);
        } else {
            run.push(op);
        }
    }
    dispatch_all(&mut encoder, &plan.group, &run);
    (buffers, encoder)
}
