//! The formulas, once: advantages per mode, sampling (temperature, top-k, top-p and the
//! counter-based draws), the per-token objective and its derivative, Adam. Plain Rust over slices:
//! the engines, the WGSL kernels' tests and the app's inspector all call these.

pub mod adam;
pub mod advantage;
pub mod calculator;
pub mod correction;
pub mod entropy_control;
pub mod entropy_dynamics;
pub mod explain;
pub mod loss;
pub mod numeric;
pub mod sampling;
pub mod value;
