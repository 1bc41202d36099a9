//! Charts (PNG and SVG, plotters with an embedded font) drawn from metric records,
//! so any run can be re-plotted from its `metrics.jsonl`.

pub mod chart;
pub mod stats;

pub use chart::{Series, line_chart, run_charts};
