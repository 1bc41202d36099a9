//! Threads for the fused CPU engines, with results that do not depend on how many there are.
//!
//! A batch is cut into **parts** — runs of whole prompts, a function of the shape alone
//! ([`parts`]), never of the thread count — and each part's rows go through the forward and
//! backward passes on their own buffers. The threads take parts; whatever sums over parts (the
//! gradient) is added in part order. So a run is bit-identical with 1, 2 or 16 threads, and a
//! shape below [`PART_WORK`] is one part: exactly the single-threaded engine. Counter-based
//! draws stay per row, and the draws themselves are taken on the calling thread.
//!
//! In the browser (wasm32 without shared memory) there is one thread and the parts run in turn.

use std::ops::Range;

/// The work (multiply-adds, roughly) below which a part is not worth a thread hand-off: a
/// part of this size takes about 1 ms on one AVX2 core, a hand-off ~10 µs.
pub const PART_WORK: usize = 2_000_000;

/// At most this many parts: enough for 8 cores, few enough that the per-part gradients'
/// reduction stays a small share of a step.
pub const MAX_PARTS: usize = 8;

/// `units` (prompts) cut into at most [`MAX_PARTS`] runs of whole units, each about
/// `work_per_unit · units / parts ≥ PART_WORK` (one run when the whole is smaller).
pub fn parts(units: usize, work_per_unit: usize) -> Vec<Range<usize>> {
    let total = units.saturating_mul(work_per_unit.max(1));
    let k = (total / PART_WORK).clamp(1, MAX_PARTS).min(units.max(1));
    let per = units.div_ceil(k).max(1);
    (0..units.max(1))
        .step_by(per)
        .map(|a| a..(a + per).min(units))
        .collect()
}

/// The threads a run may use: `0` = every core this process may run on.
pub fn resolve(threads: usize) -> usize {
    match threads {
        0 => available(),
        n => n,
    }
}

/// The cores this process may run on (1 in the browser).
pub fn available() -> usize {
    #[cfg(target_arch = "wasm32")]
    return 1;
    #[cfg(not(target_arch = "wasm32"))]
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// A pool of threads for one engine (none for one thread).
#[derive(Clone, Default)]
pub struct Cores {
    #[cfg(not(target_arch = "wasm32"))]
    pool: Option<std::sync::Arc<rayon::ThreadPool>>,
}

impl std::fmt::Debug for Cores {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Cores({})", self.threads())
    }
}

impl Cores {
    /// `threads` as `run.threads` reads (0 = every core). Where the pool cannot be built, one
    /// thread, said once in the log.
    pub fn new(threads: usize) -> Self {
        let n = resolve(threads);
        #[cfg(not(target_arch = "wasm32"))]
        if n > 1 {
            match rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .thread_name(|i| format!("grpo-lab-{i}"))
                .build()
            {
                Ok(pool) => {
                    return Self {
                        pool: Some(std::sync::Arc::new(pool)),
                    };
                }
                Err(e) => log::warn!("one thread: could not start {n} ({e})"),
            }
        }
        let _ = n;
        Self::default()
    }

    /// How many threads run parts.
    pub fn threads(&self) -> usize {
        #[cfg(not(target_arch = "wasm32"))]
        if let Some(p) = &self.pool {
            return p.current_num_threads();
        }
        1
    }

    /// `f(i, &mut items[i])` for every item, spread over the threads (in order on one).
    pub fn each<T: Send>(&self, items: &mut [T], f: impl Fn(usize, &mut T) + Sync) {
        #[cfg(not(target_arch = "wasm32"))]
        if let Some(pool) = &self.pool
            && items.len() > 1
        {
            use rayon::prelude::*;
            pool.install(|| {
                items
                    .par_iter_mut()
                    .enumerate()
                    .with_max_len(1)
                    .for_each(|(i, x)| f(i, x))
            });
            return;
        }
        for (i, x) in items.iter_mut().enumerate() {
            f(i, x);
        }
    }

    /// `out[k] = Σ_p parts[p][k]` in part order, for every `k` (the threads split `k`; each
    /// element's sum is the same whatever their number).
    pub fn sum_in_order(&self, sources: &[&[f32]], out: &mut [f32]) {
        let Some((first, rest)) = sources.split_first() else {
            out.fill(0.0);
            return;
        };
        out.copy_from_slice(&first[..out.len()]);
        if rest.is_empty() {
            return;
        }
        const SPAN: usize = 1 << 14;
        let mut spans: Vec<(usize, &mut [f32])> = out
            .chunks_mut(SPAN)
            .enumerate()
            .map(|(i, c)| (i * SPAN, c))
            .collect();
        self.each(&mut spans, |_, (at, span)| {
            for src in rest {
                for (o, &x) in span.iter_mut().zip(&src[*at..]) {
                    *o += x;
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_cover_every_unit_once_and_ignore_threads() {
        for (units, work) in [
            (0, 1),
            (1, 1),
            (3, 10),
            (32, 500_000),
            (256, 65_536),
            (7, 9_000_000),
        ] {
            let p = parts(units, work);
            assert!(!p.is_empty() && p.len() <= MAX_PARTS);
            assert_eq!(p[0].start, 0);
            assert_eq!(p.last().unwrap().end, units);
            for w in p.windows(2) {
                assert_eq!(w[0].end, w[1].start);
                assert!(!w[1].is_empty());
            }
        }
        assert_eq!(parts(32, 10).len(), 1, "a small batch stays whole");
        assert_eq!(parts(32, 500_000).len(), 8);
    }

    #[test]
    fn sums_are_the_same_on_any_number_of_threads() {
        let mut rng = crate::rng::SplitMix64::new(3);
        let srcs: Vec<Vec<f32>> = (0..5)
            .map(|_| {
                (0..40_001)
                    .map(|_| (rng.next_f64() * 2.0 - 1.0) as f32)
                    .collect()
            })
            .collect();
        let views: Vec<&[f32]> = srcs.iter().map(|v| v.as_slice()).collect();
        let mut want = srcs[0].clone();
        for s in &srcs[1..] {
            for (w, &x) in want.iter_mut().zip(s) {
                *w += x;
            }
        }
        for threads in [1, 2, 3] {
            let mut out = vec![0.0; 40_001];
            Cores::new(threads).sum_in_order(&views, &mut out);
            assert!(
                out.iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits())
            );
        }
        let mut seen = vec![0usize; 9];
        Cores::new(3).each(&mut seen, |i, x| *x = i + 1);
        assert_eq!(seen, (1..=9).collect::<Vec<_>>());
    }
}
