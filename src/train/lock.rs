//! One writer per run directory. Whatever writes a run (`train`, new, `--resume` or `--force`;
//! `compare` on its `--out` and on each cell) first takes an OS advisory lock on
//! `DIR/.grpo-lab.lock` and holds it until it is done. A second writer is refused at once,
//! before it touches anything, with the holder named (pid, command, since when). The lock is
//! the kernel's (`flock` on Unix, `LockFileEx` on Windows): a writer killed with `kill -9`
//! releases it with its last file handle, so no stale lock is ever left to clear by hand. The
//! file itself stays (no command deletes it, `--force` included), so two processes always
//! lock the same inode. Readers (`export`, `export-log`, the app's Runs overlay) never take it.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use thiserror::Error;

/// The lock file's name inside a run directory.
pub const LOCK_FILE: &str = ".grpo-lab.lock";

/// "No locks available" (Linux's ENOLCK): NFS without its lock daemon.
const ENOLCK: i32 = 37;

#[derive(Debug, Error)]
pub enum LockError {
    #[error(
        "{dir} is being written by another process ({holder}); refusing to write it too, and nothing was touched. Wait for that process to finish, or stop it: a killed writer leaves no lock behind (`--resume` continues its run)"
    )]
    Held { dir: PathBuf, holder: String },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The held lock of one run directory; released when dropped (or when the process ends, however
/// it ends).
#[derive(Debug)]
pub struct RunLock {
    _file: File,
    dir: PathBuf,
}

impl RunLock {
    /// Take the lock of `dir` (created if missing), or say who holds it. Never waits.
    pub fn acquire(dir: &Path) -> Result<Self, LockError> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| LockError::Io { path, source }
        };
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let path = dir.join(LOCK_FILE);
        // Not truncated on open: the holder's line must survive a refused writer.
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io(&path))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let holder = holder.trim();
                return Err(LockError::Held {
                    dir: dir.to_path_buf(),
                    holder: if holder.is_empty() {
                        "a process that has not written its name yet".into()
                    } else {
                        holder.to_string()
                    },
                });
            }
            // A file system without locks (some network mounts: `Unsupported`, or ENOLCK without
            // a lock daemon): say so, and go on as before locks existed rather than refuse every
            // run there.
            Err(TryLockError::Error(e))
                if e.kind() == std::io::ErrorKind::Unsupported
                    || e.raw_os_error() == Some(ENOLCK) =>
            {
                super::progress::say(&format!(
                    "grpo-lab: {} cannot be locked on this file system ({e}); nothing stops a second writer here",
                    path.display()
                ));
            }
            Err(TryLockError::Error(e)) => return Err(io(&path)(e)),
        }
        let line = holder_line();
        file.set_len(0)
            .and_then(|()| file.seek(SeekFrom::Start(0)))
            .and_then(|_| file.write_all(line.as_bytes()))
            .and_then(|()| file.sync_data())
            .map_err(io(&path))?;
        Ok(Self {
            _file: file,
            dir: dir.to_path_buf(),
        })
    }

    /// The directory this lock holds.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// `pid 1234, `grpo-lab train --resume run2`, since 2026-12-01 13:50:02 UTC`.
fn holder_line() -> String {
    let command = std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .enumerate()
        .map(|(i, a)| {
            let a = if i == 0 {
                Path::new(&a)
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or(a)
            } else {
                a
            };
            if a.is_empty() || a.contains(char::is_whitespace) {
                format!("'{a}'")
            } else {
                a
            }
        })
        .collect::<Vec<_>>()
        .join(" ");
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| utc(d.as_secs()))
        .unwrap_or_else(|_| "an unknown time".into());
    format!("pid {}, `{command}`, since {since}\n", std::process::id())
}

/// Seconds since 1970 as `YYYY-MM-DD hh:mm:ss UTC` (Howard Hinnant's civil-from-days).
fn utc(secs: u64) -> String {
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rem / 3_600,
        rem / 60 % 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc(1_796_139_002), "2026-12-01 15:30:02 UTC");
    }

    #[test]
    fn a_second_holder_is_refused_with_the_first_named_and_the_file_kept() {
        let dir = std::env::temp_dir().join(format!("grpo-lab-lock-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let first = RunLock::acquire(&dir).unwrap();
        let held = std::fs::read_to_string(dir.join(LOCK_FILE)).unwrap();
        assert!(
            held.starts_with(&format!("pid {}, `", std::process::id())),
            "{held}"
        );
        // flock locks belong to an open file: a second open in this process is refused too.
        match RunLock::acquire(&dir) {
            Err(LockError::Held { holder, .. }) => assert_eq!(holder, held.trim()),
            other => panic!("{other:?}"),
        }
        assert_eq!(std::fs::read_to_string(dir.join(LOCK_FILE)).unwrap(), held);
        drop(first);
        let again = RunLock::acquire(&dir).unwrap();
        assert_eq!(again.dir(), dir);
        drop(again);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
