//! Threads for the fused CPU engines, with results that do not depend on how many there are.
//!
//! A batch is cut into **parts** — runs of whole prompts, a function of the shape alone
//! ([`parts`]), never of the thread count — and each part's rows go through the forward and
//! backward passes on their own buffers. The threads take parts; whatever sums over parts (the
//! gradient) is added in part order. So a run is bit-identical with 1, 2 or 16 threads, and a
//! shape below [`PART_WORK`] is one part: exactly the single-threaded engine. Counter-based
//! draws stay per row (the transformer takes them on the calling thread, the lecture model by
//! parts, each keyed by its row's index in the batch).
//!
//! The threads are a `hot` pool: the calling thread and `threads − 1` workers that spin
//! between jobs, since a step hands out work several times a millisecond.
//!
//! In the browser (wasm32 without shared memory) there is one thread and the parts run in turn.

use std::ops::Range;

/// The work (multiply-adds, roughly) below which a part is not worth a thread hand-off: a
/// part of this size takes about 1 ms on one AVX2 core, a hand-off ~10 µs.
pub const PART_WORK: usize = 2_000_000;

/// The work (elements touched, roughly) below which a job of independent items runs in order
/// on the calling thread ([`Cores::each_worth`]): a few µs on one core, what handing it to a
/// spinning worker and taking its cache lines back costs. Lecture17's whole step is ~10–20 µs:
/// its Adam (~650 weights) and its four advantage modes (30 rewards) stay on one thread.
pub const SOLO_WORK: usize = 16_384;

/// The elements of one job of the element-wise helpers ([`Cores::sums_sq`],
/// [`Cores::sum_in_order`]): a fixed span, so that what they sum does
/// not depend on the threads.
pub const SPAN: usize = 1 << 14;

/// Responses per span where the engines make a rollout's rows on the threads, and where the
/// trainer frees them ([`Cores::drop_spread`]): the same cut both times.
pub const ROWS_SPAN: usize = 512;

/// At most this many parts: enough for 8 cores, few enough that the per-part gradients'
/// reduction stays a small share of a step.
pub const MAX_PARTS: usize = 8;

/// `units` (prompts) cut into at most [`MAX_PARTS`] runs of whole units, each about
/// `work_per_unit · units / parts ≥ PART_WORK` (one run when the whole is smaller).
pub fn parts(units: usize, work_per_unit: usize) -> Vec<Range<usize>> {
    parts_at(units, work_per_unit, PART_WORK)
}

/// [`parts`] with parts of at least `part_work` (an engine whose work runs at another speed
/// than its multiply-adds say).
pub fn parts_at(units: usize, work_per_unit: usize, part_work: usize) -> Vec<Range<usize>> {
    let total = units.saturating_mul(work_per_unit.max(1));
    let k = (total / part_work.max(1))
        .clamp(1, MAX_PARTS)
        .min(units.max(1));
    let per = units.div_ceil(k).max(1);
    (0..units.max(1))
        .step_by(per)
        .map(|a| a..(a + per).min(units))
        .collect()
}

/// Keeps the memory `free` returns in the process (glibc's allocator), so that the buffers a
/// step or an iteration allocates anew reuse pages already mapped: by default glibc gives
/// a freed heap top back to the kernel and takes every block of 128 KiB or more from a
/// fresh mapping, and the next allocation page-faults its memory in again, on the calling
/// thread. Freed memory stays with the process until it exits (its peak is what it was).
/// Nothing on other C libraries.
pub fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        unsafe extern "C" {
            fn mallopt(param: i32, value: i32) -> i32;
        }
        const M_TRIM_THRESHOLD: i32 = -1;
        const M_MMAP_THRESHOLD: i32 = -3;
        // SAFETY: mallopt only sets allocator parameters; called before any other thread.
        unsafe {
            mallopt(M_MMAP_THRESHOLD, 32 << 20);
            mallopt(M_TRIM_THRESHOLD, 1 << 30);
        }
    }
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
    pool: Option<std::sync::Arc<hot::Pool>>,
}

impl std::fmt::Debug for Cores {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Cores({})", self.threads())
    }
}

impl Cores {
    /// `threads` as `run.threads` reads (0 = every core): the calling thread and `threads − 1`
    /// workers. Where a worker cannot be started, one thread, said once in the log.
    pub fn new(threads: usize) -> Self {
        let n = resolve(threads);
        #[cfg(not(target_arch = "wasm32"))]
        if n > 1 {
            match hot::Pool::new(n - 1) {
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
            return p.workers() + 1;
        }
        1
    }

    /// Wakes workers that sleep after a pause and waits (at most 1 ms) until they spin again,
    /// so that what runs next starts on every thread at once, as in a run without a pause
    /// (a benchmark that times engines in turn calls it before each engine's turn).
    pub fn wake(&self) {
        #[cfg(not(target_arch = "wasm32"))]
        if let Some(p) = &self.pool {
            p.wake();
        }
    }

    /// Jobs handed to the threads so far (wrapping; 0 on one thread): what a test counts to
    /// see that a small shape stays on the calling thread.
    pub fn jobs(&self) -> u32 {
        #[cfg(not(target_arch = "wasm32"))]
        if let Some(p) = &self.pool {
            return p.jobs();
        }
        0
    }

    /// `f(i, &mut items[i])` for every item, spread over the threads (in order on one).
    pub fn each<T: Send>(&self, items: &mut [T], f: impl Fn(usize, &mut T) + Sync) {
        #[cfg(not(target_arch = "wasm32"))]
        if let Some(pool) = &self.pool
            && items.len() > 1
        {
            let base = hot::SendPtr(items.as_mut_ptr());
            let len = items.len();
            pool.run(len, &|i| {
                assert!(i < len);
                // SAFETY: the pool runs each index once, so the `&mut` are disjoint, and `run`
                // returns only when every index has run (the borrow of `items` outlives them).
                let item = unsafe { &mut *base.at(i) };
                f(i, item)
            });
            return;
        }
        for (i, x) in items.iter_mut().enumerate() {
            f(i, x);
        }
    }

    /// [`Cores::each`] for a job worth a hand-off: `work` (elements touched, roughly, by all
    /// the items together) of at least [`SOLO_WORK`]; a smaller one runs in order on the
    /// calling thread. The same values either way (each item is its own).
    pub fn each_worth<T: Send>(
        &self,
        work: usize,
        items: &mut [T],
        f: impl Fn(usize, &mut T) + Sync,
    ) {
        if work >= SOLO_WORK {
            return self.each(items, f);
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

    /// `Σ x²` of each array: spans of [`SPAN`] elements on the threads, each array's spans
    /// added in order, so the same bits on any number of threads (an array of one span gives
    /// `numeric::sum_sq` of it, as one thread always did).
    pub fn sums_sq<const K: usize>(&self, arrays: [&[f32]; K]) -> [f32; K] {
        let mut spans: Vec<(usize, &[f32], f32)> = (arrays.iter().enumerate())
            .flat_map(|(a, x)| x.chunks(SPAN).map(move |c| (a, c, 0.0)))
            .collect();
        let work = arrays.iter().map(|x| x.len()).sum();
        self.each_worth(work, &mut spans, |_, (_, x, s)| {
            *s = crate::objective::numeric::sum_sq(x);
        });
        let mut out = [None::<f32>; K];
        for (a, _, s) in spans {
            out[a] = Some(out[a].map_or(s, |sum| sum + s));
        }
        out.map(|s| s.unwrap_or(0.0))
    }

    /// `f` of `items` in spans of `span` (a multiple of what `f` reads as one unit) on the
    /// threads, the results in order: what one `f(items)` gives where `f` maps units alone.
    /// The allocations `f` makes are spread over the threads too.
    pub fn map_spans<T: Sync, U: Send>(
        &self,
        items: &[T],
        span: usize,
        f: impl Fn(&[T]) -> Vec<U> + Sync,
    ) -> Vec<U> {
        if self.threads() == 1 || items.len() <= span {
            return f(items);
        }
        let mut jobs: Vec<(&[T], Vec<U>)> = items.chunks(span).map(|c| (c, Vec::new())).collect();
        self.each(&mut jobs, |_, (x, out)| *out = f(x));
        let mut out = Vec::with_capacity(jobs.iter().map(|j| j.1.len()).sum());
        for (_, part) in jobs {
            out.extend(part);
        }
        out
    }

    /// A copy of `src`, by spans of [`SPAN`] on the threads.
    pub fn to_vec<T: Copy + Send + Sync>(&self, src: &[T]) -> Vec<T> {
        if self.threads() == 1 || src.len() <= SPAN {
            return src.to_vec();
        }
        let mut out = Vec::with_capacity(src.len());
        let mut spans: Vec<_> = (out.spare_capacity_mut()[..src.len()].chunks_mut(SPAN))
            .zip(src.chunks(SPAN))
            .collect();
        self.each(&mut spans, |_, (to, from)| {
            for (t, &f) in to.iter_mut().zip(from.iter()) {
                t.write(f);
            }
        });
        // SAFETY: the spans cover the first `src.len()` elements, and each was written above.
        unsafe { out.set_len(src.len()) };
        out
    }

    /// Drops `items` on the threads in spans of `span`, in order: the same cut as the
    /// [`Cores::map_spans`] (or [`Cores::each`]) that made them, so that each thread frees what
    /// it allocated. A rollout's thousands of small responses are as many `free`s, and glibc
    /// takes a block back into the arena of the thread that allocated it: freed from the other
    /// thread, every `free` contends with that thread's own for the arena (`scaled`, two
    /// threads: 4 096 responses freed in 4 spans cut from the end took 227 and 264 µs on the
    /// two threads; in the spans that made them, 119 µs each).
    pub fn drop_spread<T: Send>(&self, items: Vec<T>, span: usize) {
        let (len, span) = (items.len(), span.max(1));
        if self.threads() == 1 || len <= span {
            return;
        }
        #[cfg(not(target_arch = "wasm32"))]
        {
            let mut items = items;
            // SAFETY: the elements are dropped once each, below, by the span that holds them;
            // the vector forgets them first, so that it frees only its buffer.
            unsafe { items.set_len(0) };
            let base = hot::SendPtr(items.as_mut_ptr());
            let mut spans: Vec<Range<usize>> = (0..len)
                .step_by(span)
                .map(|a| a..(a + span).min(len))
                .collect();
            self.each(&mut spans, |_, r| {
                let at = base.at(r.start);
                // SAFETY: the spans are disjoint and within the first `len` elements, which
                // are initialized and which nothing else drops.
                unsafe { std::ptr::drop_in_place(std::ptr::slice_from_raw_parts_mut(at, r.len())) };
            });
        }
    }
}

/// A row-major matrix whose column blocks the jobs of one [`Cores::each`] write at once, each
/// job its own block of every row (a per-position table or gradient written straight into the
/// `[rows, positions·width]` layout the rest of the step reads, with no gathering copy).
pub struct Blocks<'a> {
    ptr: *mut f32,
    len: usize,
    _borrow: std::marker::PhantomData<&'a mut [f32]>,
}

// SAFETY: `Blocks` hands out raw pointers only (`at`), whose users promise disjoint writes.
unsafe impl Send for Blocks<'_> {}
unsafe impl Sync for Blocks<'_> {}

impl<'a> Blocks<'a> {
    /// The matrix, borrowed mutably for as long as the blocks live.
    pub fn new(m: &'a mut [f32]) -> Self {
        Self {
            ptr: m.as_mut_ptr(),
            len: m.len(),
            _borrow: std::marker::PhantomData,
        }
    }

    /// Element `i` on (a pointer) and the elements from it to the end.
    ///
    /// # Safety
    /// No two threads may write (or one write and another read) the same element through the
    /// pointers of one `Blocks` while both run; `i ≤ len`.
    pub unsafe fn at(&self, i: usize) -> (*mut f32, usize) {
        assert!(i <= self.len);
        // SAFETY: in bounds (asserted).
        (unsafe { self.ptr.add(i) }, self.len - i)
    }
}

/// How long an engine's idle workers keep their cores busy after its last job (they spin, then
/// sleep): a benchmark that times engines in turn waits this long between them.
#[cfg(not(target_arch = "wasm32"))]
pub const IDLE_SPIN: std::time::Duration = hot::SPIN;

/// Workers that spin between jobs before they sleep: an engine's step hands its threads work
/// several times a step, ~50–200 µs apart, and waking a sleeping thread costs 20–130 µs on a
/// virtual machine (measured with rayon's pool: 30 µs of work took 50 µs back to back, 131 µs
/// with 200 µs between) — a worker that is still spinning starts in well under 1 µs.
#[cfg(not(target_arch = "wasm32"))]
mod hot {
    use std::cell::UnsafeCell;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering::*};
    use std::time::{Duration, Instant};

    /// How long an idle worker spins before it sleeps (a step's gaps are far shorter; a run's
    /// pauses — a checkpoint, the app's frame — longer).
    pub(super) const SPIN: Duration = Duration::from_millis(2);

    /// A job: a function of the item's index, its lifetime erased (see [`Pool::run`]).
    type Job = *const (dyn Fn(usize) + Sync + 'static);

    /// A raw pointer that a job may carry to another thread.
    pub struct SendPtr<T>(pub *mut T);
    // SAFETY: the pool hands each index to one thread (`Cores::each`).
    unsafe impl<T: Send> Send for SendPtr<T> {}
    unsafe impl<T: Send> Sync for SendPtr<T> {}

    impl<T> SendPtr<T> {
        /// The pointer to item `i` (a method, so closures capture the whole `SendPtr`).
        pub fn at(&self, i: usize) -> *mut T {
            self.0.wrapping_add(i)
        }
    }

    struct Shared {
        /// The current job's number, published after its blocks.
        epoch: AtomicU32,
        /// Per thread (the calling thread first), `epoch << 32 | next << 16 | end`: the job's
        /// items cut into one contiguous block per thread; a thread claims from its own block
        /// first, then from the others' in turn. A claim (a compare-and-swap of one word) is of
        /// one job's index, and part `j` of successive jobs of the same size runs on the same
        /// thread while the threads keep pace (its rows stay in that core's cache — measured on
        /// `scaled`: the claim-whatever-is-next order moved each part's activations between
        /// the cores between the forward, the objective and the backward).
        blocks: Vec<AtomicU64>,
        /// The current job, written before its number is published, read after a claim.
        job: UnsafeCell<Option<Job>>,
        /// Items of the current job that have run.
        done: AtomicUsize,
        panicked: AtomicBool,
        sleeping: AtomicUsize,
        stop: AtomicBool,
    }

    // SAFETY: `job` is written only while no thread can claim an index (every index of the
    // previous job has run, and the next number is not yet published) and read only after a
    // claim, which the publishing store happens-before; the job it points to is `Sync`.
    unsafe impl Sync for Shared {}
    unsafe impl Send for Shared {}

    /// Claim and run job `epoch`'s items until none is left: thread `me`'s block first, then
    /// the others' in turn.
    fn work(s: &Shared, me: usize, epoch: u64) {
        let n = s.blocks.len();
        for b in (0..n).map(|k| (me + k) % n) {
            let block = &s.blocks[b];
            loop {
                let t = block.load(Acquire);
                let (next, end) = ((t >> 16) & 0xffff, t & 0xffff);
                if t >> 32 != epoch || next >= end {
                    break;
                }
                if block
                    .compare_exchange_weak(t, t + (1 << 16), AcqRel, Relaxed)
                    .is_err()
                {
                    continue;
                }
                // SAFETY: a claimed index of job `epoch`: `job` is that job's, alive until its
                // `done` reaches its count (which this item's increment below is part of).
                let job = unsafe { (*s.job.get()).expect("a published job") };
                let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| unsafe {
                    (*job)(next as usize)
                }));
                if ran.is_err() {
                    s.panicked.store(true, Relaxed);
                }
                s.done.fetch_add(1, Release);
            }
        }
    }

    fn worker(s: Arc<Shared>, me: usize) {
        let mut seen = s.epoch.load(Acquire);
        let mut idle = Instant::now();
        let mut spins = 0u32;
        while !s.stop.load(Relaxed) {
            let e = s.epoch.load(Acquire);
            if e != seen {
                seen = e;
                work(&s, me, seen.into());
                idle = Instant::now();
                continue;
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(256) && idle.elapsed() > SPIN {
                s.sleeping.fetch_add(1, SeqCst);
                // Either the publisher sees this sleeper and wakes it, or this sees the job.
                if s.epoch.load(SeqCst) == seen && !s.stop.load(SeqCst) {
                    std::thread::park();
                }
                s.sleeping.fetch_sub(1, SeqCst);
                idle = Instant::now();
            } else {
                std::hint::spin_loop();
            }
        }
    }

    pub struct Pool {
        shared: Arc<Shared>,
        threads: Vec<std::thread::JoinHandle<()>>,
        /// One job at a time; a job started from inside a job (or from another thread while
        /// one runs) runs on its caller.
        busy: std::sync::Mutex<()>,
    }

    impl Pool {
        pub fn new(workers: usize) -> std::io::Result<Self> {
            let shared = Arc::new(Shared {
                epoch: AtomicU32::new(0),
                blocks: (0..=workers).map(|_| AtomicU64::new(0)).collect(),
                job: UnsafeCell::new(None),
                done: AtomicUsize::new(0),
                panicked: AtomicBool::new(false),
                sleeping: AtomicUsize::new(0),
                stop: AtomicBool::new(false),
            });
            let mut pool = Self {
                shared: shared.clone(),
                threads: Vec::new(),
                busy: std::sync::Mutex::new(()),
            };
            for i in 0..workers {
                let s = shared.clone();
                let h = std::thread::Builder::new()
                    .name(format!("grpo-lab-{i}"))
                    .spawn(move || worker(s, i + 1))?;
                pool.threads.push(h);
            }
            Ok(pool)
        }

        pub fn workers(&self) -> usize {
            self.threads.len()
        }

        /// Workers asleep now.
        #[cfg(test)]
        pub fn sleeping(&self) -> usize {
            self.shared.sleeping.load(SeqCst)
        }

        /// [`super::Cores::wake`].
        pub fn wake(&self) {
            let s = &*self.shared;
            let since = Instant::now();
            while s.sleeping.load(SeqCst) > 0 && since.elapsed() < Duration::from_millis(1) {
                for h in &self.threads {
                    h.thread().unpark();
                }
                std::thread::yield_now();
            }
        }

        /// Jobs published so far (each one's number).
        pub fn jobs(&self) -> u32 {
            self.shared.epoch.load(Relaxed)
        }

        /// `f(i)` for every `i < items`, on the workers and the calling thread; returns when
        /// every one has run (a panic in one is raised here).
        pub fn run(&self, items: usize, f: &(dyn Fn(usize) + Sync)) {
            let guard = self.busy.try_lock();
            if guard.is_err() || items > 0xffff {
                (0..items).for_each(f);
                return;
            }
            let s = &*self.shared;
            // SAFETY: only the lifetime is erased; no thread calls the job after `done`
            // reaches `items`, which this waits for before it returns (and `f` outlives that).
            let job: Job = unsafe {
                std::mem::transmute::<&(dyn Fn(usize) + Sync), &'static (dyn Fn(usize) + Sync)>(f)
            };
            // SAFETY: no index of any job is claimable now (the previous one ran to the end).
            unsafe { *s.job.get() = Some(job) };
            s.done.store(0, Relaxed);
            let epoch = s.epoch.load(Relaxed).wrapping_add(1);
            let n = s.blocks.len();
            for (b, block) in s.blocks.iter().enumerate() {
                let (from, to) = (b * items / n, (b + 1) * items / n);
                block.store(
                    u64::from(epoch) << 32 | (from as u64) << 16 | to as u64,
                    SeqCst,
                );
            }
            s.epoch.store(epoch, SeqCst);
            if s.sleeping.load(SeqCst) > 0 {
                for h in &self.threads {
                    h.thread().unpark();
                }
            }
            work(s, 0, epoch.into());
            while s.done.load(Acquire) < items {
                std::hint::spin_loop();
            }
            if s.panicked.swap(false, Relaxed) {
                panic!("a part panicked on a worker thread");
            }
        }
    }

    impl Drop for Pool {
        fn drop(&mut self) {
            self.shared.stop.store(true, SeqCst);
            for h in &self.threads {
                h.thread().unpark();
            }
            for h in self.threads.drain(..) {
                let _ = h.join();
            }
        }
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

    /// `sums_sq`, `to_vec`, `map_spans` and `drop_spread` give what one thread gives, bit for
    /// bit, on any number of threads (and the pool really ran them: the job count moves).
    #[test]
    fn element_helpers_give_one_thread_s_results() {
        let mut rng = crate::rng::SplitMix64::new(5);
        let mut draw = |len: usize| -> Vec<f32> {
            (0..len)
                .map(|_| (rng.next_f64() * 2.0 - 1.0) as f32)
                .collect()
        };
        let (big, small) = (draw(3 * SPAN + 17), draw(SPAN - 3));
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let one = Cores::new(1).sums_sq([&big, &small, &[]]);
        // One span: `numeric::sum_sq` itself; several: the spans' sums in order.
        assert_eq!(
            one[1].to_bits(),
            crate::objective::numeric::sum_sq(&small).to_bits()
        );
        let spans = big.chunks(SPAN).map(crate::objective::numeric::sum_sq);
        assert_eq!(
            one[0].to_bits(),
            spans.reduce(|a, b| a + b).unwrap().to_bits()
        );
        assert_eq!(one[2], 0.0);
        let rows: Vec<u32> = (0..5000).collect();
        let cut = |x: &[u32]| x.chunks(5).map(<[u32]>::to_vec).collect::<Vec<_>>();
        for threads in [2, 3] {
            let cores = Cores::new(threads);
            let jobs = cores.jobs();
            assert_eq!(bits(&cores.sums_sq([&big, &small, &[]])), bits(&one));
            assert_eq!(bits(&cores.to_vec(&big)), bits(&big));
            assert_eq!(cores.map_spans(&rows, 512 * 5, cut), cut(&rows));
            assert!(cores.jobs().wrapping_sub(jobs) >= 3, "the pool ran them");
            // Every item dropped once.
            let alive = std::sync::Arc::new(());
            for span in [ROWS_SPAN, 7, 4999, 5000] {
                let items = vec![alive.clone(); 5000];
                assert_eq!(std::sync::Arc::strong_count(&alive), 5001);
                let jobs = cores.jobs();
                cores.drop_spread(items, span);
                assert_eq!(std::sync::Arc::strong_count(&alive), 1);
                let spread = cores.jobs() != jobs;
                assert_eq!(spread, span < 5000, "spans of {span}");
            }
        }
    }

    #[test]
    fn small_jobs_stay_on_the_calling_thread() {
        let cores = Cores::new(2);
        let me = std::thread::current().id();
        let mut on: Vec<(usize, Option<std::thread::ThreadId>)> = vec![(0, None); 9];
        let f = |i: usize, x: &mut (usize, Option<std::thread::ThreadId>)| {
            *x = (i + 1, Some(std::thread::current().id()));
        };
        let jobs = cores.jobs();
        cores.each_worth(SOLO_WORK - 1, &mut on, f);
        assert_eq!(cores.jobs(), jobs, "below SOLO_WORK: no job for the pool");
        assert!(on.iter().enumerate().all(|(i, x)| *x == (i + 1, Some(me))));
        cores.each_worth(SOLO_WORK, &mut on, f);
        assert_eq!(
            cores.jobs(),
            jobs.wrapping_add(1),
            "at SOLO_WORK: the pool's job"
        );
        assert!(on.iter().enumerate().all(|(i, x)| x.0 == i + 1));
        assert_eq!(Cores::new(1).jobs(), 0);
    }

    #[test]
    fn every_item_runs_once_in_jobs_of_any_size_back_to_back() {
        // Jobs of fewer items than threads (empty blocks), of uneven blocks and of many, one
        // right after another, so a worker still leaving one job meets the next one's blocks.
        for threads in [2, 3, 5] {
            let cores = Cores::new(threads);
            for round in 0..3_000usize {
                let len = 2 + round % 13;
                let mut runs = vec![0u32; len];
                cores.each(&mut runs, |i, x| *x += 1 + i as u32);
                let want: Vec<u32> = (1..=len as u32).collect();
                assert_eq!(runs, want, "threads {threads}, round {round}");
            }
        }
    }

    #[test]
    fn wake_brings_sleeping_workers_back_without_a_job() {
        use std::time::{Duration, Instant};
        // One worker: woken, it spins on the second core while this thread watches.
        let cores = Cores::new(2);
        let pool = cores.pool.as_ref().expect("a pool");
        let t0 = Instant::now();
        while pool.sleeping() != 1 && t0.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(
            pool.sleeping(),
            1,
            "an idle worker sleeps after {IDLE_SPIN:?}"
        );
        let jobs = cores.jobs();
        // Seen awake right after a wake (on a loaded machine the worker may take longer than
        // the wake waits, or sleep again before this thread looks: wake again).
        let t0 = Instant::now();
        let mut awake = false;
        while !awake && t0.elapsed() < Duration::from_secs(10) {
            cores.wake();
            awake = pool.sleeping() == 0;
        }
        assert!(awake, "woken, it spins");
        assert_eq!(cores.jobs(), jobs, "no job was published");
        let mut runs = vec![0u8; 8];
        cores.each(&mut runs, |_, x| *x += 1);
        assert_eq!(runs, [1; 8]);
    }
}
