//! Policies on burn.

pub mod lecture;

pub use lecture::LecturePolicy;
