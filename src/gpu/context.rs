//! Device selection (`--device auto|gpu|software|cpu`) and the shared wgpu context.
//!
//! We create the wgpu instance, adapter, device and queue ourselves and hand them to
//! burn (`Device::wgpu_options().setup(..).init()`), so the WGSL kernels in `shaders/`
//! and the app can use the same device as burn's tensors. `cpu` uses burn's pure-Rust
//! CPU backend (`flex`) with no wgpu at all.

use crate::config::DeviceChoice;
use burn::tensor::Device;
use burn::tensor::wgpu::WgpuSetup;
use serde::Serialize;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use thiserror::Error;

const LAVAPIPE_HINT: &str = "install Mesa's software Vulkan driver (lavapipe): apt-get install -y mesa-vulkan-drivers libvulkan1";

#[derive(Debug, Error, Clone)]
pub enum DeviceError {
    #[error(
        "--device gpu: no hardware GPU adapter found (adapters seen: {seen}); use --device software or --device cpu"
    )]
    NoGpu { seen: String },
    #[error(
        "--device software: no CPU (software) adapter such as lavapipe found (adapters seen: {seen}); {hint}"
    )]
    NoSoftware { seen: String, hint: &'static str },
    #[error("could not open the wgpu device on {adapter}: {reason}")]
    RequestDevice { adapter: String, reason: String },
    #[error("burn refused the wgpu device on {adapter}: {reason}")]
    Register { adapter: String, reason: String },
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
}

impl AdapterSummary {
    fn of(adapter: &wgpu::Adapter) -> Self {
        let info = adapter.get_info();
        let limits = adapter.limits();
        Self {
            name: info.name,
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

    /// Pick a device. `auto` prefers a hardware GPU, then a software adapter, then
    /// falls back to the CPU backend with one line on stderr. Handles are opened once
    /// per process and kind, then shared.
    pub fn select(choice: DeviceChoice) -> Result<Self, DeviceError> {
        static CACHE: OnceLock<Mutex<HashMap<DeviceChoice, Compute>>> = OnceLock::new();
        let cache = CACHE.get_or_init(Default::default);
        let mut cache = cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = cache.get(&choice) {
            return Ok(c.clone());
        }
        let compute = Self::open(choice)?;
        cache.insert(choice, compute.clone());
        Ok(compute)
    }

    fn open(choice: DeviceChoice) -> Result<Self, DeviceError> {
        if choice == DeviceChoice::Cpu {
            return Ok(Self::cpu());
        }
        let instance = instance();
        let adapters = pollster::block_on(instance.enumerate_adapters(backends()));
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
        let adapter = match choice {
            DeviceChoice::Gpu => hardware.ok_or_else(|| DeviceError::NoGpu { seen: seen() })?,
            DeviceChoice::Software => software.ok_or_else(|| DeviceError::NoSoftware {
                seen: seen(),
                hint: LAVAPIPE_HINT,
            })?,
            _ => match hardware.or(software) {
                Some(a) => a,
                None => {
                    eprintln!(
                        "grpo-lab: no wgpu adapter found; falling back to burn's CPU backend ({LAVAPIPE_HINT})"
                    );
                    return Ok(Self::cpu());
                }
            },
        };
        let gpu = open_context(instance.clone(), adapter.clone())?;
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

fn open_context(
    instance: wgpu::Instance,
    adapter: wgpu::Adapter,
) -> Result<GpuContext, DeviceError> {
    let summary = AdapterSummary::of(&adapter);
    // The same request cubecl makes for itself, so burn's kernels find what they expect.
    let (device, queue) = pollster::block_on(
        adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("grpo-lab"),
            required_features: adapter
                .features()
                .difference(wgpu::Features::MAPPABLE_PRIMARY_BUFFERS),
            required_limits: adapter.limits(),
            memory_hints: wgpu::MemoryHints::MemoryUsage,
            trace: wgpu::Trace::Off,
            // SAFETY: cubecl's WGSL path asks for the same experimental features on its own devices.
            experimental_features: unsafe { wgpu::ExperimentalFeatures::enabled() },
        }),
    )
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

/// Every adapter wgpu can see (for `grpo-lab devices`).
pub fn list_adapters() -> Vec<AdapterSummary> {
    let instance = instance();
    pollster::block_on(instance.enumerate_adapters(backends()))
        .iter()
        .map(AdapterSummary::of)
        .collect()
}
