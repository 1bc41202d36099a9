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
// Flag bit 0: accumulate into C instead of overwriting it.
// A and B are read from `model` (weights) or `work` (activations) as the pipeline
// constants A_SRC / B_SRC say (0 model, 1 work); C is always in `work`.
// The tile: WG×WG invocations (WG from the adapter's limits; 16 under WebGPU's defaults),
// each computing R×R outputs, a K-slice of TK through workgroup memory.

struct Mm {
    m: u32, n: u32, k: u32, batch: u32,
    a_off: u32, a_rs: u32, a_cs: u32, a_bs: u32,
    b_off: u32, b_rs: u32, b_cs: u32, b_bs: u32,
    c_off: u32, c_rs: u32, c_bs: u32, flags: u32,
}

@group(0) @binding(0) var<uniform> mm: Mm;
@group(0) @binding(1) var<storage, read_write> model: array<f32>;
@group(0) @binding(2) var<storage, read_write> work: array<f32>;

override A_SRC: u32 = 0u;
override B_SRC: u32 = 0u;

const WG: u32 = 16u;
const R: u32 = 2u;
const TILE: u32 = WG * R;
const TK: u32 = 16u;

var<workgroup> ta: array<f32, TILE * TK>; // [TILE][TK]
var<workgroup> tb: array<f32, TK * TILE>; // [TK][TILE]

fn load_a(i: u32) -> f32 {
    if (A_SRC == 0u) { return model[i]; }
    return work[i];
}

fn load_b(i: u32) -> f32 {
    if (B_SRC == 0u) { return model[i]; }
    return work[i];
}

@compute @workgroup_size(WG, WG)
fn matmul(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let reduce = (mm.flags & 2u) != 0u;
    var kk = mm.k;
    var z = wid.z;
    if (reduce) { kk = mm.k * mm.batch; z = 0u; }
    let row0 = wid.y * TILE;
    let col0 = wid.x * TILE;
    let tid = lid.y * WG + lid.x;
    var acc: array<f32, 4>; // R·R
    for (var k0 = 0u; k0 < kk; k0 += TK) {
        for (var e = tid; e < TILE * TK; e += WG * WG) {
            let gi = row0 + e / TK;
            let gk = k0 + e % TK;
            var v = 0.0;
            if (gi < mm.m && gk < kk) {
                var zz = z;
                var kq = gk;
                if (reduce) { zz = gk / mm.k; kq = gk % mm.k; }
                v = load_a(mm.a_off + zz * mm.a_bs + gi * mm.a_rs + kq * mm.a_cs);
            }
            ta[e] = v;
        }
        for (var e = tid; e < TK * TILE; e += WG * WG) {
            let gk = k0 + e / TILE;
            let gj = col0 + e % TILE;
            var v = 0.0;
            if (gj < mm.n && gk < kk) {
                var zz = z;
                var kq = gk;
                if (reduce) { zz = gk / mm.k; kq = gk % mm.k; }
                v = load_b(mm.b_off + zz * mm.b_bs + kq * mm.b_rs + gj * mm.b_cs);
            }
            tb[e] = v;
        }
        workgroupBarrier();
        for (var kc = 0u; kc < TK; kc++) {
            var av: array<f32, 2>; // R
            var bv: array<f32, 2>;
            for (var r = 0u; r < R; r++) {
                av[r] = ta[(lid.y + r * WG) * TK + kc];
                bv[r] = tb[kc * TILE + lid.x + r * WG];
            }
            for (var i = 0u; i < R; i++) {
                for (var j = 0u; j < R; j++) {
                    acc[i * R + j] = fma(av[i], bv[j], acc[i * R + j]);
                }
            }
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < R; i++) {
        let gi = row0 + lid.y + i * WG;
        for (var j = 0u; j < R; j++) {
            let gj = col0 + lid.x + j * WG;
            if (gi < mm.m && gj < mm.n) {
                let at = mm.c_off + z * mm.c_bs + gi * mm.c_rs + gj;
                if ((mm.flags & 1u) != 0u) {
                    work[at] = work[at] + acc[i * R + j];
                } else {
                    work[at] = acc[i * R + j];
                }
            }
        }
    }
}
