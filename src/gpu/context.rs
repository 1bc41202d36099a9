//! Device selection (`--device auto|gpu|software|cpu`) and the shared wgpu context.
//!
//! We create the wgpu instance, adapter, device and queue ourselves and hand them to
//! burn (`Device::wgpu_options().setup(..).init()`), so the WGSL kernels in `shaders/`
//! and the app can use the same device as burn's tensors. `cpu` uses burn's pure-Rust
//! CPU backend (`flex`) with no wgpu at all.

use crate::config::DeviceChoice;
use burn::tensor::Device;
#[cfg(not(target_arch = "wasm32"))]
use burn::tensor::wgpu::WgpuSetup;
use serde::Serialize;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use thiserror::Error;

const LAVAPIPE_HINT: &str = "install Mesa's software Vulkan driver (lavapipe): apt-get install -y mesa-vulkan-drivers libvulkan1";

#[derive(Debug, Error, Clone)]
pub enum DeviceError {
    #[error(
        "--device gpu (or run.device = gpu): no hardware GPU adapter found (adapters seen: {seen}); use --device software or --device cpu"
    )]
    NoGpu { seen: String },
    #[error(
        "--device software (or run.device = software): no CPU (software) adapter such as lavapipe found (adapters seen: {seen}); {hint}"
    )]
    NoSoftware { seen: String, hint: &'static str },
    #[error("could not open the wgpu device on {adapter}: {reason}")]
    RequestDevice { adapter: String, reason: String },
    #[error("burn refused the wgpu device on {adapter}: {reason}")]
    Register { adapter: String, reason: String },
    #[error(
        "the wgpu device is still being set up (a browser answers asynchronously): await Compute::select_async first"
    )]
    Pending,
}

/// What `grpo-lab devices` prints for each adapter.
#[derive(Debug, Clone, Serialize)]
pub struct AdapterSummary {
    pub name: String,
    pub backend: String,
    pub device_type: String,
    pub driver: String,
    pub max_storage_buffer_binding_size: u64,
    pub max_buffer_size: u64,
    pub max_compute_workgroup_size_x: u32,
    pub max_compute_invocations_per_workgroup: u32,
    pub max_compute_workgroups_per_dimension: u32,
    pub max_storage_buffers_per_shader_stage: u32,
    /// The subgroup sizes (min, max) where the adapter has wgpu's `SUBGROUP` feature (the
    /// broadcast product of `shaders/matmul_subgroup.wgsl` needs at least 8).
    pub subgroup_sizes: Option<(u32, u32)>,
}

impl AdapterSummary {
    fn of(adapter: &wgpu::Adapter) -> Self {
        let info = adapter.get_info();
        let limits = adapter.limits();
        // A browser does not name its WebGPU adapter.
        let name = if info.name.is_empty() {
            format!("an unnamed {:?} adapter", info.backend)
        } else {
            info.name
        };
        Self {
            name,
            backend: format!("{:?}", info.backend),
            device_type: format!("{:?}", info.device_type),
            driver: format!("{} {}", info.driver, info.driver_info)
                .trim()
                .to_string(),
            max_storage_buffer_binding_size: limits.max_storage_buffer_binding_size,
            max_buffer_size: limits.max_buffer_size,
            max_compute_workgroup_size_x: limits.max_compute_workgroup_size_x,
            max_compute_invocations_per_workgroup: limits.max_compute_invocations_per_workgroup,
            max_compute_workgroups_per_dimension: limits.max_compute_workgroups_per_dimension,
            max_storage_buffers_per_shader_stage: limits.max_storage_buffers_per_shader_stage,
            subgroup_sizes: adapter
                .features()
                .contains(wgpu::Features::SUBGROUP)
                .then_some((info.subgroup_min_size, info.subgroup_max_size)),
        }
    }

    pub fn is_software(&self) -> bool {
        self.device_type == "Cpu"
    }
}

/// Our wgpu handles, shared with burn.
#[derive(Debug)]
pub struct GpuContext {
    pub instance: wgpu::Instance,
    pub adapter: wgpu::Adapter,
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub summary: AdapterSummary,
}

/// Where a run computes: a burn device, and our wgpu context when burn runs on wgpu.
#[derive(Debug, Clone)]
pub struct Compute {
    pub device: Device,
    pub gpu: Option<Arc<GpuContext>>,
    /// `wgpu (llvmpipe ..., Vulkan, Cpu)` or `cpu (burn flex)`.
    pub label: String,
}

impl Compute {
    /// burn's pure-Rust CPU backend.
    pub fn cpu() -> Self {
        Self {
            device: Device::flex(),
            gpu: None,
            label: "cpu (burn flex backend)".into(),
        }
    }

    pub fn is_wgpu(&self) -> bool {
        self.gpu.is_some()
    }

    /// Pick a device. `auto` takes a hardware GPU, else burn's CPU backend (never lavapipe;
    /// `engine::select` refines `auto` per config and prints why). Handles are opened once
    /// per process and kind, then shared.
    pub fn select(choice: DeviceChoice) -> Result<Self, DeviceError> {
        let mut cache = cache().lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = cache.get(&choice) {
            return Ok(c.clone());
        }
        let compute = Self::open(choice)?;
        cache.insert(choice, compute.clone());
        Ok(compute)
    }

    /// [`Compute::select`] without blocking, for the browser (wgpu's adapter and device
    /// requests are promises there): await it once at start-up; later `select` calls for
    /// the same choice find its handles.
    pub async fn select_async(choice: DeviceChoice) -> Result<Self, DeviceError> {
        let cached = cache()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&choice)
            .cloned();
        if let Some(c) = cached {
            return Ok(c);
        }
        let compute = Self::open_async(choice).await?;
        let mut cache = cache().lock().unwrap_or_else(|e| e.into_inner());
        Ok(cache.entry(choice).or_insert(compute).clone())
    }

    /// Open a device, blocking: native wgpu answers at once. Without the `native`
    /// feature a request that is still pending gives [`DeviceError::Pending`].
    fn open(choice: DeviceChoice) -> Result<Self, DeviceError> {
        block_on_ready(Self::open_async(choice)).unwrap_or(Err(DeviceError::Pending))
    }

    /// Open a device (uncached): the set-up behind [`Compute::select`] and
    /// [`Compute::select_async`].
    pub async fn open_async(choice: DeviceChoice) -> Result<Self, DeviceError> {
        if choice == DeviceChoice::Cpu {
            return Ok(Self::cpu());
        }
        let instance = instance();
        let adapters = instance.enumerate_adapters(backends()).await;
        let seen = || {
            let names: Vec<String> = adapters
                .iter()
                .map(|a| {
                    let i = a.get_info();
                    format!("{} ({:?}, {:?})", i.name, i.backend, i.device_type)
                })
                .collect();
            if names.is_empty() {
                "none".to_string()
            } else {
                names.join("; ")
            }
        };
        let hardware = adapters
            .iter()
            .filter(|a| a.get_info().device_type != wgpu::DeviceType::Cpu)
            .min_by_key(|a| match a.get_info().device_type {
                wgpu::DeviceType::DiscreteGpu => 0,
                wgpu::DeviceType::IntegratedGpu => 1,
                wgpu::DeviceType::VirtualGpu => 2,
                _ => 3,
            });
        let software = adapters
            .iter()
            .find(|a| a.get_info().device_type == wgpu::DeviceType::Cpu);
        // A browser offers one WebGPU adapter, whatever kind it says it is (headless Chromium's
        // SwiftShader calls itself a CPU): `gpu` and `software` both take it there.
        #[cfg(target_arch = "wasm32")]
        let (hardware, software) = {
            let any = adapters.first();
            (hardware.or(any), software.or(any))
        };
        let adapter = match choice {
            DeviceChoice::Gpu => hardware.ok_or_else(|| DeviceError::NoGpu { seen: seen() })?,
            DeviceChoice::Software => software.ok_or_else(|| DeviceError::NoSoftware {
                seen: seen(),
                hint: LAVAPIPE_HINT,
            })?,
            // `auto`: a hardware GPU, else the CPU backend. Lavapipe (a CPU emulating a GPU) is
            // never chosen for training by default; `engine::select` says which and why.
            _ => match hardware {
                Some(a) => a,
                None => return Ok(Self::cpu()),
            },
        };
        let gpu = open_context(instance.clone(), adapter.clone()).await?;
        #[cfg(target_arch = "wasm32")]
        {
            // The browser build leaves burn's wgpu backend out (~25 MB of wasm; its synchronous
            // reads cannot run in a tab anyway): the WGSL lecture engine trains on WebGPU, and
            // burn (the cold start, configs that engine does not cover) on its CPU backend.
            let label = format!("webgpu ({}, {})", gpu.summary.name, gpu.summary.device_type);
            Ok(Self {
                device: Device::flex(),
                gpu: Some(Arc::new(gpu)),
                label,
            })
        }
        #[cfg(not(target_arch = "wasm32"))]
        {
            let setup = WgpuSetup {
                instance: gpu.instance.clone(),
                adapter: gpu.adapter.clone(),
                device: gpu.device.clone(),
                queue: gpu.queue.clone(),
                backend: gpu.adapter.get_info().backend,
            };
            let device =
                Device::wgpu_options()
                    .setup(setup)
                    .init()
                    .map_err(|e| DeviceError::Register {
                        adapter: gpu.summary.name.clone(),
                        reason: e.to_string(),
                    })?;
            let label = format!(
                "wgpu ({}, {}, {})",
                gpu.summary.name, gpu.summary.backend, gpu.summary.device_type
            );
            Ok(Self {
                device,
                gpu: Some(Arc::new(gpu)),
                label,
            })
        }
    }
}

/// The handles `select` has opened, per choice.
fn cache() -> &'static Mutex<HashMap<DeviceChoice, Compute>> {
    static CACHE: OnceLock<Mutex<HashMap<DeviceChoice, Compute>>> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

/// The validation error a device reports for the work recorded since its error scope was
/// pushed (`pop`, the scope's pop): natively at once; in a browser, where it is a promise,
/// `None` now and the error in the console when it comes.
pub(crate) fn scope_error<F>(pop: F) -> Option<wgpu::Error>
where
    F: Future<Output = Option<wgpu::Error>> + 'static,
{
    #[cfg(all(target_arch = "wasm32", feature = "web"))]
    {
        wasm_bindgen_futures::spawn_local(async move {
            if let Some(e) = pop.await {
                log::error!("the device refused a submission: {e}");
            }
        });
        None
    }
    #[cfg(not(all(target_arch = "wasm32", feature = "web")))]
    {
        block_on_ready(pop).flatten()
    }
}

/// Wait for a wgpu future that native backends resolve at once. With `native`, pollster
/// blocks until it is ready; without it (the browser cannot block) the future is polled
/// once and `None` means it is still pending.
pub(crate) fn block_on_ready<F: Future>(future: F) -> Option<F::Output> {
    #[cfg(feature = "native")]
    {
        Some(pollster::block_on(future))
    }
    #[cfg(not(feature = "native"))]
    {
        let mut future = std::pin::pin!(future);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match future.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(out) => Some(out),
            std::task::Poll::Pending => None,
        }
    }
}

/// Vulkan, Metal, DX12 and WebGPU only: probing GL/EGL prints `XDG_RUNTIME_DIR`
/// noise on headless machines, and adds nothing for compute. `WGPU_BACKEND` overrides.
fn backends() -> wgpu::Backends {
    wgpu::Backends::from_env().unwrap_or(wgpu::Backends::PRIMARY)
}

fn instance() -> wgpu::Instance {
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.backends = backends();
    wgpu::Instance::new(desc)
}

async fn open_context(
    instance: wgpu::Instance,
    adapter: wgpu::Adapter,
) -> Result<GpuContext, DeviceError> {
    let summary = AdapterSummary::of(&adapter);
    // The same request cubecl makes for itself, so burn's kernels find what they expect.
    let (device, queue) = adapter
        .request_device(&wgpu::DeviceDescriptor {
            label: Some("grpo-lab"),
            required_features: adapter
                .features()
                .difference(wgpu::Features::MAPPABLE_PRIMARY_BUFFERS),
            required_limits: adapter.limits(),
            memory_hints: wgpu::MemoryHints::MemoryUsage,
            trace: wgpu::Trace::Off,
            // SAFETY: cubecl's WGSL path asks for the same experimental features on its own devices.
            experimental_features: unsafe { wgpu::ExperimentalFeatures::enabled() },
        })
        .await
        .map_err(|e| DeviceError::RequestDevice {
            adapter: summary.name.clone(),
            reason: e.to_string(),
        })?;
    Ok(GpuContext {
        instance,
        adapter,
        device,
        queue,
        summary,
    })
}

/// Every adapter wgpu can see (for `grpo-lab devices`); none while a browser is still
/// answering.
pub fn list_adapters() -> Vec<AdapterSummary> {
    let instance = instance();
    block_on_ready(instance.enumerate_adapters(backends()))
        .unwrap_or_default()
        .iter()
        .map(AdapterSummary::of)
        .collect()
}

/// The name of the best hardware (non-CPU) adapter, if there is one (for `--device auto`);
/// looked up once per process.
pub fn hardware_adapter_name() -> Option<String> {
    static NAME: OnceLock<Option<String>> = OnceLock::new();
    NAME.get_or_init(probe_hardware_adapter).clone()
}

fn probe_hardware_adapter() -> Option<String> {
    let adapters = block_on_ready(instance().enumerate_adapters(backends()))?;
    adapters
        .iter()
        .map(|a| a.get_info())
        .filter(|i| i.device_type != wgpu::DeviceType::Cpu)
        .min_by_key(|i| match i.device_type {
            wgpu::DeviceType::DiscreteGpu => 0,
            wgpu::DeviceType::IntegratedGpu => 1,
            wgpu::DeviceType::VirtualGpu => 2,
            _ => 3,
        })
        .map(|i| i.name)
}
