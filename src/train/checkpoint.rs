//! Checkpoints on disk: the trainer's state (`state.json`) and its engine's named blobs
//! (`policy.bpk`, `reference.bpk` in burn's format, and the optimizer state), one directory
//! per iteration, closed by `manifest.json`: every file's size and SHA-256, and the step the
//! checkpoint belongs to. Each file is written to a temporary name, synced and renamed, the
//! manifest last, so a directory whose manifest verifies is complete and unaltered; resume
//! takes the newest such one.

use crate::grpo::{TrainError, Trainer, TrainerState};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::Path;

const MANIFEST: &str = "manifest.json";

/// Why a checkpoint directory does not verify (the resume passes over it, saying this).
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("{name}: {source}")]
    Read {
        name: String,
        source: std::io::Error,
    },
    #[error("{name}: {source}")]
    Parse {
        name: String,
        source: serde_json::Error,
    },
    #[error("{name} does not match the manifest ({})", if size == expected { "its SHA-256 differs".to_string() } else { format!("{size} bytes, the manifest says {expected}") })]
    Mismatch {
        name: String,
        size: u64,
        expected: u64,
    },
    #[error("no {MANIFEST} ({0}): the checkpoint was not finished")]
    Unfinished(std::io::Error),
    #[error("no state.json")]
    NoState,
}

fn err(dir: &Path, e: impl std::fmt::Display) -> TrainError {
    TrainError::Checkpoint {
        path: dir.display().to_string(),
        reason: e.to_string(),
    }
}

/// Write `bytes` to `path` through a temporary file, synced, then renamed.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    {
        let mut f = fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    fs::rename(&tmp, path)
}

fn sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Manifest {
    iteration: usize,
    global_step: usize,
    /// name → (size in bytes, SHA-256 hex)
    files: BTreeMap<String, (u64, String)>,
}

/// Write the trainer's state between iterations into `dir`.
pub fn save(trainer: &Trainer, dir: &Path) -> Result<(), TrainError> {
    let (state, mut blobs) = trainer.snapshot()?;
    fs::create_dir_all(dir).map_err(|e| err(dir, e))?;
    blobs.push((
        "state.json".into(),
        serde_json::to_vec(&state).map_err(|e| err(dir, e))?,
    ));
    let mut files = BTreeMap::new();
    for (name, bytes) in &blobs {
        write_atomic(&dir.join(name), bytes).map_err(|e| err(dir, e))?;
        files.insert(name.clone(), (bytes.len() as u64, sha256(bytes)));
    }
    let manifest = Manifest {
        iteration: state.iteration,
        global_step: state.global_step,
        files,
    };
    let text = serde_json::to_vec_pretty(&manifest).map_err(|e| err(dir, e))?;
    // The manifest last: a directory with one that verifies is complete.
    write_atomic(&dir.join(MANIFEST), &text).map_err(|e| err(dir, e))
}

/// Read a checkpoint's files, verified against its manifest. A checkpoint written before
/// manifests existed (only `state.json`) is read as it is.
fn read_verified(dir: &Path) -> Result<(TrainerState, crate::engine::Snapshot), CheckpointError> {
    let read = |name: &str| {
        fs::read(dir.join(name)).map_err(|source| CheckpointError::Read {
            name: name.into(),
            source,
        })
    };
    let parse = |name: &str| {
        let name = name.to_string();
        move |source| CheckpointError::Parse { name, source }
    };
    let mut blobs = Vec::new();
    match fs::read(dir.join(MANIFEST)) {
        Ok(text) => {
            let manifest: Manifest = serde_json::from_slice(&text).map_err(parse(MANIFEST))?;
            for (name, (size, hash)) in &manifest.files {
                let bytes = read(name)?;
                if bytes.len() as u64 != *size || sha256(&bytes) != *hash {
                    return Err(CheckpointError::Mismatch {
                        name: name.clone(),
                        size: bytes.len() as u64,
                        expected: *size,
                    });
                }
                blobs.push((name.clone(), bytes));
            }
        }
        Err(_) if dir.join("state.json").exists() => {
            let listing = |source| CheckpointError::Read {
                name: ".".into(),
                source,
            };
            for entry in fs::read_dir(dir).map_err(listing)? {
                let path = entry.map_err(listing)?.path();
                let name = path.file_name().map(|n| n.to_string_lossy().to_string());
                if let Some(name) = name.filter(|n| !n.ends_with(".tmp")) {
                    blobs.push((name.clone(), read(&name)?));
                }
            }
        }
        Err(e) => return Err(CheckpointError::Unfinished(e)),
    }
    let state_at = blobs
        .iter()
        .position(|(n, _)| n == "state.json")
        .ok_or(CheckpointError::NoState)?;
    let (_, state) = blobs.remove(state_at);
    let state: TrainerState = serde_json::from_slice(&state).map_err(parse("state.json"))?;
    blobs.sort();
    Ok((state, blobs))
}

/// Whether `dir` holds a complete checkpoint whose files match their manifest.
pub fn verify(dir: &Path) -> Result<(), CheckpointError> {
    read_verified(dir).map(|_| ())
}

/// The trainer's state in a complete, unaltered checkpoint.
pub fn state_of(dir: &Path) -> Result<TrainerState, CheckpointError> {
    read_verified(dir).map(|(state, _)| state)
}

/// Restore what `save` wrote; the run then continues bit-identically.
pub fn load(trainer: &mut Trainer, dir: &Path) -> Result<(), TrainError> {
    let (state, blobs) = read_verified(dir).map_err(|e| err(dir, e))?;
    trainer.restore(state, &blobs)
}
