// Tiled matrix products through workgroup memory: every product of the lecture model's
// step (forward and backward) in the cheap order of engine::fused_lecture (per-position
// tables, gather, one product).
// Reference: engine::wgsl_lecture::reference::matmul (plain loops; the fused CPU step takes
// the same products through gemm in engine::fused_lecture::product_into).
//
//   C[z] (+)= A[z] · B[z] for z in 0..batch (workgroup z), every operand a strided view:
//     A[z](i, k) = src_a[a_off + z·a_bs + i·a_rs + k·a_cs], B likewise, C row-major with
//     row stride c_rs from c_off + z·c_bs;
//   or, with flag bit 1 ("reduce"), C (+)= Σ_z A[z] · B[z]: one contraction over (z, k),
//     so a sum over positions lands in one output without races.
// Flag bit 0: accumulate into C instead of overwriting it. Flag bit 2 (batch 1 only): C's
// column stride is c_bs, not 1 (C stored transposed: a weight's gradient computed as
// ∂Wᵀ = dYᵀ·X lands as ∂W).
// A and B are read from `model` (weights) or `work` (activations) as the pipeline
// constants A_SRC / B_SRC say (0 model, 1 work); C is always in `work`. A_SRC = 2 is a
// one-hot A built from token ids: A[z](i, k) = 1 if ints[a_off + z·a_bs + k·a_cs] == i
// (the scatter of a gather, dT_p = onehot(x_p)ᵀ · d_enc, as a product without races).
// The tile: TILE×TILE outputs (TILE = 4·WG) from WG×WG invocations, each computing a 4×4
// block as four vec4 rows; K-slices of TK through workgroup memory. WG comes from the
// adapter's limits (8: 64 invocations and 4 KiB of workgroup memory, within WebGPU's
// defaults; 16 where the adapter allows 256 invocations and is a GPU).
// `matmul_rows` (at the end) is the same product for CPU adapters: register blocks, no
// workgroup memory.

struct Mm {
    m: u32, n: u32, k: u32, batch: u32,
    a_off: u32, a_rs: u32, a_cs: u32, a_bs: u32,
    b_off: u32, b_rs: u32, b_cs: u32, b_bs: u32,
    c_off: u32, c_rs: u32, c_bs: u32, flags: u32,
    // matmul_subgroup.wgsl's epilogues (its EPI pipelines; zero and unread elsewhere): the
    // offsets of a bias and a LayerNorm gain in the model, of the outputs in `work`, and e_flags
    // bit 0: add the bias. Its B_WORK products: e_flags bit 2, each row's sum of A into
    // work[e_sum + row] (a bias's gradient).
    e_bias: u32, e_gain: u32, e_out: u32, e_aux: u32,
    e_rstd: u32, e_flags: u32, e_sum: u32, e_pad1: u32,
}

@group(0) @binding(0) var<uniform> mm: Mm;
@group(0) @binding(1) var<storage, read_write> model: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> work: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> ints: array<u32>;

override A_SRC: u32 = 0u;
override B_SRC: u32 = 0u;

const WG: u32 = 8u;
const TILE: u32 = WG * 4u;
const TK: u32 = 16u;

var<workgroup> ta: array<f32, TILE * TK>;          // [TILE rows][TK]
var<workgroup> tb: array<vec4<f32>, TK * WG>;      // [TK][WG column quads]

fn load_a(i: u32) -> f32 {
    if (A_SRC == 0u) { return model[i >> 2u][i & 3u]; }
    return work[i >> 2u][i & 3u];
}

// Four consecutive elements from a multiple of 4 (the vector paths of matmul_rows).
fn load_a4(i: u32) -> vec4<f32> {
    if (A_SRC == 0u) { return model[i >> 2u]; }
    return work[i >> 2u];
}

fn load_b4(i: u32) -> vec4<f32> {
    if (B_SRC == 0u) { return model[i >> 2u]; }
    return work[i >> 2u];
}

fn a_at(zz: u32, gi: u32, kq: u32) -> f32 {
    if (A_SRC == 2u) {
        return select(0.0, 1.0, ints[mm.a_off + zz * mm.a_bs + kq * mm.a_cs] == gi);
    }
    return load_a(mm.a_off + zz * mm.a_bs + gi * mm.a_rs + kq * mm.a_cs);
}

fn load_b(i: u32) -> f32 {
    if (B_SRC == 0u) { return model[i >> 2u][i & 3u]; }
    return work[i >> 2u][i & 3u];
}

fn b_at(z: u32, reduce: bool, gk: u32, kk: u32, gj: u32) -> f32 {
    if (gj >= mm.n || gk >= kk) { return 0.0; }
    var zz = z;
    var kq = gk;
    if (reduce) { zz = gk / mm.k; kq = gk % mm.k; }
    return load_b(mm.b_off + zz * mm.b_bs + kq * mm.b_rs + gj * mm.b_cs);
}

// Invocation (x, y) computes rows y, y + WG, y + 2·WG, y + 3·WG of the tile and the four
// adjacent columns 4x .. 4x + 3 (one vec4 per row).
@compute @workgroup_size(WG, WG)
fn matmul(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let reduce = (mm.flags & 2u) != 0u;
    var kk = mm.k;
    var z = wid.z;
    if (reduce) { kk = mm.k * mm.batch; z = 0u; }
    let row0 = wid.y * TILE;
    let col0 = wid.x * TILE;
    let tid = lid.y * WG + lid.x;
    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    var acc2 = vec4<f32>(0.0);
    var acc3 = vec4<f32>(0.0);
    for (var k0 = 0u; k0 < kk; k0 += TK) {
        for (var e = tid; e < TILE * TK; e += WG * WG) {
            let gi = row0 + e / TK;
            let gk = k0 + e % TK;
            var v = 0.0;
            if (gi < mm.m && gk < kk) {
                var zz = z;
                var kq = gk;
                if (reduce) { zz = gk / mm.k; kq = gk % mm.k; }
                v = a_at(zz, gi, kq);
            }
            ta[e] = v;
        }
        for (var e = tid; e < TK * WG; e += WG * WG) {
            let gk = k0 + e / WG;
            let gj = col0 + (e % WG) * 4u;
            tb[e] = vec4<f32>(
                b_at(z, reduce, gk, kk, gj),
                b_at(z, reduce, gk, kk, gj + 1u),
                b_at(z, reduce, gk, kk, gj + 2u),
                b_at(z, reduce, gk, kk, gj + 3u),
            );
        }
        workgroupBarrier();
        for (var kc = 0u; kc < TK; kc++) {
            let bv = tb[kc * WG + lid.x];
            acc0 = fma(vec4<f32>(ta[lid.y * TK + kc]), bv, acc0);
            acc1 = fma(vec4<f32>(ta[(lid.y + WG) * TK + kc]), bv, acc1);
            acc2 = fma(vec4<f32>(ta[(lid.y + 2u * WG) * TK + kc]), bv, acc2);
            acc3 = fma(vec4<f32>(ta[(lid.y + 3u * WG) * TK + kc]), bv, acc3);
        }
        workgroupBarrier();
    }
    store_row(row0 + lid.y, col0 + lid.x * 4u, z, acc0);
    store_row(row0 + lid.y + WG, col0 + lid.x * 4u, z, acc1);
    store_row(row0 + lid.y + 2u * WG, col0 + lid.x * 4u, z, acc2);
    store_row(row0 + lid.y + 3u * WG, col0 + lid.x * 4u, z, acc3);
}

fn store_row(gi: u32, gj: u32, z: u32, acc: vec4<f32>) {
    if (gi >= mm.m) { return; }
    let by_columns = (mm.flags & 4u) != 0u;
    let c_cs = select(1u, mm.c_bs, by_columns);
    let c_bs = select(mm.c_bs, 0u, by_columns);
    for (var c = 0u; c < 4u; c++) {
        if (gj + c < mm.n) {
            let at = mm.c_off + z * c_bs + gi * mm.c_rs + (gj + c) * c_cs;
            if ((mm.flags & 1u) != 0u) {
                work[at >> 2u][at & 3u] = work[at >> 2u][at & 3u] + acc[c];
            } else {
                work[at >> 2u][at & 3u] = acc[c];
            }
        }
    }
}

// The same product without workgroup memory, for CPU adapters (lavapipe), where barriers
// and tile staging cost more than they save and caches do the tiling: each invocation holds
// ROWS × 4 outputs in registers (rows i0 .. i0 + ROWS of C, columns j .. j + 3), and
// consecutive invocations take consecutive column quads of the same rows, so a vector of
// invocations reads one A value and contiguous B values per k. Out-of-range rows and
// columns read clamped indices and are not stored. Operands that run along k (A) or along the
// block's rows or columns in memory, from multiples of 4, come in as vectors — the model and
// work buffers are vec4 arrays here for that (lavapipe: 1.6× on the `scaled` products); the
// order of the sums is the scalar path's in every case. The accumulators are named variables,
// not an array: llvmpipe keeps an array indexed in a loop in memory (1.7× slower, measured).
// Measured on lavapipe at the `scaled` shape: 2.5–4× the tiled kernel.
const ROWS: u32 = 8u;
// Invocations per workgroup of matmul_rows: lavapipe hands whole workgroups to its threads, so
// small ones keep both busy on products of few blocks.
const ROWS_WG: u32 = 16u;

// acc + a.x·b0 + a.y·b1 + a.z·b2 + a.w·b3, in that order (four k of one row).
fn fma4(a: vec4<f32>, b0: vec4<f32>, b1: vec4<f32>, b2: vec4<f32>, b3: vec4<f32>, acc: vec4<f32>) -> vec4<f32> {
    return fma(vec4<f32>(a.w), b3, fma(vec4<f32>(a.z), b2, fma(vec4<f32>(a.y), b1, fma(vec4<f32>(a.x), b0, acc))));
}

// Row k of B at columns j, j1, j2, j3 (from `bk`, the row's start): one vector when B runs
// along columns from a multiple of 4, else four loads.
fn b_quad(bk: u32, j: u32, j1: u32, j2: u32, j3: u32, vec_b: bool) -> vec4<f32> {
    if (vec_b) { return load_b4(bk + j); }
    return vec4<f32>(load_b(bk + j * mm.b_cs), load_b(bk + j1 * mm.b_cs), load_b(bk + j2 * mm.b_cs), load_b(bk + j3 * mm.b_cs));
}

@compute @workgroup_size(ROWS_WG)
fn matmul_rows(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let reduce = (mm.flags & 2u) != 0u;
    var z = gid.z;
    var zs = 1u;
    if (reduce) { z = 0u; zs = mm.batch; }
    let nq = (mm.n + 3u) / 4u;
    let idx = gid.x + gid.y * nwg.x * ROWS_WG;
    if (idx >= ((mm.m + ROWS - 1u) / ROWS) * nq) { return; }
    let i0 = (idx / nq) * ROWS;
    let j = (idx % nq) * 4u;
    let jl = mm.n - 1u;
    let j1 = min(j + 1u, jl);
    let j2 = min(j + 2u, jl);
    let j3 = min(j + 3u, jl);
    let ml = mm.m - 1u;
    // Which operands come in as vectors (all offsets and strides multiples of 4): B along
    // its columns; A along k (four k at a time) or along its rows (eight rows in two loads).
    let vec_b = mm.b_cs == 1u && (mm.b_off & 3u) == 0u && (mm.b_rs & 3u) == 0u
        && (mm.b_bs & 3u) == 0u && j + 4u <= mm.n;
    let a_ok = A_SRC != 2u && (mm.a_off & 3u) == 0u && (mm.a_bs & 3u) == 0u;
    let vec_k = a_ok && mm.a_cs == 1u && (mm.a_rs & 3u) == 0u && (mm.k & 3u) == 0u;
    let vec_rows = a_ok && mm.a_rs == 1u && (mm.a_cs & 3u) == 0u && i0 + ROWS <= mm.m;
    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    var acc2 = vec4<f32>(0.0);
    var acc3 = vec4<f32>(0.0);
    var acc4 = vec4<f32>(0.0);
    var acc5 = vec4<f32>(0.0);
    var acc6 = vec4<f32>(0.0);
    var acc7 = vec4<f32>(0.0);
    for (var zi = 0u; zi < zs; zi++) {
        let zz = z + zi;
        let bz = mm.b_off + zz * mm.b_bs;
        let az = mm.a_off + zz * mm.a_bs;
        if (vec_k) {
            let r0 = az + min(i0, ml) * mm.a_rs;
            let r1 = az + min(i0 + 1u, ml) * mm.a_rs;
            let r2 = az + min(i0 + 2u, ml) * mm.a_rs;
            let r3 = az + min(i0 + 3u, ml) * mm.a_rs;
            let r4 = az + min(i0 + 4u, ml) * mm.a_rs;
            let r5 = az + min(i0 + 5u, ml) * mm.a_rs;
            let r6 = az + min(i0 + 6u, ml) * mm.a_rs;
            let r7 = az + min(i0 + 7u, ml) * mm.a_rs;
            for (var kq = 0u; kq < mm.k; kq += 4u) {
                let bk = bz + kq * mm.b_rs;
                let b0 = b_quad(bk, j, j1, j2, j3, vec_b);
                let b1 = b_quad(bk + mm.b_rs, j, j1, j2, j3, vec_b);
                let b2 = b_quad(bk + 2u * mm.b_rs, j, j1, j2, j3, vec_b);
                let b3 = b_quad(bk + 3u * mm.b_rs, j, j1, j2, j3, vec_b);
                acc0 = fma4(load_a4(r0 + kq), b0, b1, b2, b3, acc0);
                acc1 = fma4(load_a4(r1 + kq), b0, b1, b2, b3, acc1);
                acc2 = fma4(load_a4(r2 + kq), b0, b1, b2, b3, acc2);
                acc3 = fma4(load_a4(r3 + kq), b0, b1, b2, b3, acc3);
                acc4 = fma4(load_a4(r4 + kq), b0, b1, b2, b3, acc4);
                acc5 = fma4(load_a4(r5 + kq), b0, b1, b2, b3, acc5);
                acc6 = fma4(load_a4(r6 + kq), b0, b1, b2, b3, acc6);
                acc7 = fma4(load_a4(r7 + kq), b0, b1, b2, b3, acc7);
            }
        } else if (vec_rows) {
            for (var kq = 0u; kq < mm.k; kq++) {
                let bv = b_quad(bz + kq * mm.b_rs, j, j1, j2, j3, vec_b);
                let at = az + kq * mm.a_cs + i0;
                let lo = load_a4(at);
                let hi = load_a4(at + 4u);
                acc0 = fma(vec4<f32>(lo.x), bv, acc0);
                acc1 = fma(vec4<f32>(lo.y), bv, acc1);
                acc2 = fma(vec4<f32>(lo.z), bv, acc2);
                acc3 = fma(vec4<f32>(lo.w), bv, acc3);
                acc4 = fma(vec4<f32>(hi.x), bv, acc4);
                acc5 = fma(vec4<f32>(hi.y), bv, acc5);
                acc6 = fma(vec4<f32>(hi.z), bv, acc6);
                acc7 = fma(vec4<f32>(hi.w), bv, acc7);
            }
        } else {
            for (var kq = 0u; kq < mm.k; kq++) {
                let bv = b_quad(bz + kq * mm.b_rs, j, j1, j2, j3, vec_b);
                acc0 = fma(vec4<f32>(a_at(zz, min(i0, ml), kq)), bv, acc0);
                acc1 = fma(vec4<f32>(a_at(zz, min(i0 + 1u, ml), kq)), bv, acc1);
                acc2 = fma(vec4<f32>(a_at(zz, min(i0 + 2u, ml), kq)), bv, acc2);
                acc3 = fma(vec4<f32>(a_at(zz, min(i0 + 3u, ml), kq)), bv, acc3);
                acc4 = fma(vec4<f32>(a_at(zz, min(i0 + 4u, ml), kq)), bv, acc4);
                acc5 = fma(vec4<f32>(a_at(zz, min(i0 + 5u, ml), kq)), bv, acc5);
                acc6 = fma(vec4<f32>(a_at(zz, min(i0 + 6u, ml), kq)), bv, acc6);
                acc7 = fma(vec4<f32>(a_at(zz, min(i0 + 7u, ml), kq)), bv, acc7);
            }
        }
    }
    store_row(i0, j, z, acc0);
    store_row(i0 + 1u, j, z, acc1);
    store_row(i0 + 2u, j, z, acc2);
    store_row(i0 + 3u, j, z, acc3);
    store_row(i0 + 4u, j, z, acc4);
    store_row(i0 + 5u, j, z, acc5);
    store_row(i0 + 6u, j, z, acc6);
    store_row(i0 + 7u, j, z, acc7);
}

// `matmul_window`: C (+)= A·B with B read through a uniform window of the model buffer (its
// dynamic offset, 256-byte aligned, is where the window starts; `b_off` counts from there) —
// for CPU adapters, where a storage load is a loop over the SIMD lanes and a uniform load is a
// branch-free gather (lavapipe: ~3.5× matmul_rows on the transformer's products; a scalar load
// and a broadcast only where the offset is provably uniform, which a loop's is not — hence
// matmul_subgroup.wgsl, 2–3× this where subgroups allow). A from `work`. Each invocation owns one row of C (rows
// 64·wid.y + lid.x) and the 32 columns 32·wid.x .. + 32 (B's entries are then the same for
// every invocation of the workgroup). The caller cuts a product whose B spans more than the
// window into several (k ranges accumulated, or column ranges). VEC_K (a pipeline constant):
// A runs along k from multiples of 4 and k is a multiple of 4, so A comes four k at a time.
// Out-of-range columns read valid window entries and are not stored; a k beyond the end (K not
// a multiple of 4) multiplies B's last row by 0.
@group(0) @binding(4) var<uniform> window: array<vec4<f32>, 4096>;

override VEC_K: bool = false;
const WIN_COLS: u32 = 32u;
const WIN_ROWS: u32 = 64u;

fn win(i: u32) -> f32 {
    return window[i >> 2u][i & 3u];
}

// B's row `bk` (window index of its column j0) at the four columns j0 + 4q .. + 3.
fn win4(bk: u32, q: u32) -> vec4<f32> {
    let s = mm.b_cs;
    let at = bk + 4u * q * s;
    return vec4<f32>(win(at), win(at + s), win(at + 2u * s), win(at + 3u * s));
}

fn work_at(i: u32) -> f32 {
    return work[i >> 2u][i & 3u];
}

// A's entries k .. k + 3 of the row that starts at `ar` (zero past the end).
fn a_quad(ar: u32, k: u32, kl: u32) -> vec4<f32> {
    if (VEC_K) {
        return work[(ar + k) >> 2u];
    }
    return vec4<f32>(
        work_at(ar + k * mm.a_cs),
        select(0.0, work_at(ar + min(k + 1u, kl) * mm.a_cs), k + 1u <= kl),
        select(0.0, work_at(ar + min(k + 2u, kl) * mm.a_cs), k + 2u <= kl),
        select(0.0, work_at(ar + min(k + 3u, kl) * mm.a_cs), k + 3u <= kl),
    );
}

@compute @workgroup_size(WIN_ROWS)
fn matmul_window(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let gi = wid.y * WIN_ROWS + lid.x;
    let ar = mm.a_off + min(gi, mm.m - 1u) * mm.a_rs;
    let j0 = wid.x * WIN_COLS;
    let b0 = mm.b_off + j0 * mm.b_cs;
    let kl = mm.k - 1u;
    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    var acc2 = vec4<f32>(0.0);
    var acc3 = vec4<f32>(0.0);
    var acc4 = vec4<f32>(0.0);
    var acc5 = vec4<f32>(0.0);
    var acc6 = vec4<f32>(0.0);
    var acc7 = vec4<f32>(0.0);
    for (var k = 0u; k < mm.k; k += 4u) {
        let av = a_quad(ar, k, kl);
        for (var t = 0u; t < 4u; t++) {
            let x = vec4<f32>(av[t]);
            let bk = b0 + min(k + t, kl) * mm.b_rs;
            acc0 = fma(x, win4(bk, 0u), acc0);
            acc1 = fma(x, win4(bk, 1u), acc1);
            acc2 = fma(x, win4(bk, 2u), acc2);
            acc3 = fma(x, win4(bk, 3u), acc3);
            acc4 = fma(x, win4(bk, 4u), acc4);
            acc5 = fma(x, win4(bk, 5u), acc5);
            acc6 = fma(x, win4(bk, 6u), acc6);
            acc7 = fma(x, win4(bk, 7u), acc7);
        }
    }
    store_row(gi, j0, 0u, acc0);
    store_row(gi, j0 + 4u, 0u, acc1);
    store_row(gi, j0 + 8u, 0u, acc2);
    store_row(gi, j0 + 12u, 0u, acc3);
    store_row(gi, j0 + 16u, 0u, acc4);
    store_row(gi, j0 + 20u, 0u, acc5);
    store_row(gi, j0 + 24u, 0u, acc6);
    store_row(gi, j0 + 28u, 0u, acc7);
}
