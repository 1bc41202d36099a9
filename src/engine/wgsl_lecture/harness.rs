//! Single kernels on given buffers, for the kernel tests.

use super::*;

/// One kernel dispatch for [`KernelHarness::run`]. (A few per test case: the step's 256-byte
/// parameters stay inline, so the ops stay `Copy`.)
#[derive(Debug, Clone, Copy)]
#[allow(clippy::large_enum_variant)]
pub enum HarnessOp {
    Matmul(MatmulParams, (u32, u32)),
    /// A product (A in `work`, B in `model`) and its epilogue, in one window dispatch
    /// (matmul_subgroup.wgsl; `run` errs where the kernel does not take it).
    MatmulThen(MatmulParams, Epilogue),
    /// A product with A and B in `work`, B read in place (matmul_subgroup.wgsl's `B_WORK`, the
    /// weight gradients; `run` errs where the kernel does not take it), and each row's sum of A
    /// into `work[dst + row]` where given.
    MatmulInWork(MatmulParams, Option<u32>),
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

    /// Whether the adapter runs on the CPU (lavapipe): its arithmetic keeps subnormals, as the
    /// host's does, where a GPU may flush them.
    pub fn on_cpu(&self) -> bool {
        self.ctx.summary.is_software()
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
        // A window's worth past the end for `matmul_window`.
        let model =
            WgslLectureEngine::storage(ctx, "harness.model", buf.model.len() + WINDOW_ELEMS)?;
        let work = WgslLectureEngine::storage(ctx, "harness.work", buf.work.len())?;
        let ints = WgslLectureEngine::storage(ctx, "harness.ints", buf.ints.len())?;
        ctx.queue.write_buffer(&model, 0, &f32_bytes(&buf.model));
        ctx.queue.write_buffer(&work, 0, &f32_bytes(&buf.work));
        ctx.queue.write_buffer(&ints, 0, &u32_bytes(&buf.ints));
        let uniform = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("harness.uniform"),
            size: (ops.len() * 8 + 8) as u64 * SLOT,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut rec = Recorder {
            window: window_bind_group(device, &self.programs, [&uniform, &work, &model, &model]),
            ..Default::default()
        };
        for op in ops {
            match *op {
                HarnessOp::Matmul(mm, src) => rec.matmul(&self.programs, src, mm),
                HarnessOp::MatmulThen(mm, then) => {
                    if !rec.matmul_then(&self.programs, mm, then) {
                        return Err(kerr("harness", format!("no epilogue for {mm:?}, {then:?}")));
                    }
                }
                HarnessOp::MatmulInWork(mm, sums) => {
                    let group = rec.window.clone();
                    if !group.is_some_and(|g| rec.matmul_b_work(&self.programs, &g, mm, sums)) {
                        return Err(kerr("harness", format!("no B_WORK product for {mm:?}")));
                    }
                }
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
        if rec.slots.len() > ops.len() * 8 + 8 {
            return Err(kerr("harness", "more dispatches than uniform slots"));
        }
        let mut uni = Vec::new();
        for s in &rec.slots {
            uni.extend_from_slice(&s.slot_bytes());
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
        submit::dispatch_all(&mut encoder, &group, &rec.ops);
        let lens = [buf.model.len(), buf.work.len(), buf.ints.len()];
        let reads: Vec<_> = [&model, &work, &ints]
            .into_iter()
            .zip(lens)
            .map(|(b, len)| (b, 0, len))
            .collect();
        let (staging, total, lens) = submit::stage(device, &mut encoder, &reads);
        ctx.queue.submit([encoder.finish()]);
        if let Some(error) = crate::gpu::context::scope_error(scope.pop()) {
            return Err(EngineError::Kernel(KernelError::Readback(
                error.to_string(),
            )));
        }
        let out = Staged::map(staging, total, lens).wait(ctx)?;
        Ok(reference::Buffers {
            model: f32s(&out[0]),
            work: f32s(&out[1]),
            ints: u32s(&out[2]),
        })
    }
}
