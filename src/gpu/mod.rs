//! The compute device: our own wgpu instance/adapter/device/queue, registered with
//! burn so that burn's tensors and our WGSL kernels share one device.

pub mod context;
pub mod kernels;

pub use context::{AdapterSummary, Compute, DeviceError, GpuContext};
