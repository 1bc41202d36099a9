// The lecture step's elementwise kernels, four floats per invocation: `model` and `work`
// are vec4 arrays here, so where a kernel's offsets (and D) are multiples of 4 it moves
// whole vectors, and elsewhere it reads and writes single components. Each does exactly the
// arithmetic of its scalar form in the same order (reference: engine::wgsl_lecture::reference,
// the entry points of the same names). Parameters: lecture_params.wgsl (prepended).
//
//   gather_enc   [B·⌈D/4⌉]  enc[b] = Σ_p T_p[x_bp]                     (T = [V, n·D])
//   scatter_dt   [n·⌈D/4⌉]  dT_p = Σ_b onehot(x_bp) ⊗ d_enc[b], gather_enc's backward
//   adam         [⌈P/4⌉]    grad-norm clip and Adam, as burn's (the policy at model[w_off ..])

@group(0) @binding(1) var<storage, read_write> model: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> work: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> ints: array<u32>;

fn w1(i: u32) -> f32 { return work[i >> 2u][i & 3u]; }
fn set_w1(i: u32, x: f32) { work[i >> 2u][i & 3u] = x; }
fn m1(i: u32) -> f32 { return model[i >> 2u][i & 3u]; }
fn set_m1(i: u32, x: f32) { model[i >> 2u][i & 3u] = x; }

fn aligned(x: u32) -> bool { return (x & 3u) == 0u; }

// Four elements of `work` from `i` (the last `d - j0` of a row short: clamped reads).
fn w4(i: u32, j0: u32, d: u32, vec: bool) -> vec4<f32> {
    if (vec) { return work[i >> 2u]; }
    let l = d - 1u - j0;
    return vec4<f32>(w1(i), w1(i + min(1u, l)), w1(i + min(2u, l)), w1(i + min(3u, l)));
}

// Store the first `d - j0` (at most 4) of `x` at `work[i ..]`.
fn set_w4(i: u32, j0: u32, d: u32, vec: bool, x: vec4<f32>) {
    if (vec) {
        work[i >> 2u] = x;
        return;
    }
    for (var c = 0u; c < 4u; c++) {
        if (j0 + c < d) { set_w1(i + c, x[c]); }
    }
}

// Four consecutive columns of one prompt per invocation.
@compute @workgroup_size(64)
fn gather_enc(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let dq = (lp.d + 3u) / 4u;
    let q = flat_index(gid, nwg);
    if (q >= lp.b * dq) { return; }
    let b = q / dq;
    let j0 = (q % dq) * 4u;
    let nd = lp.n * lp.d;
    let vec = aligned(lp.d) && aligned(lp.t_off) && aligned(lp.enc_off);
    var acc = vec4<f32>(0.0);
    for (var p = 0u; p < lp.n; p++) {
        let at = lp.t_off + ints[lp.i_prompts + b * lp.n + p] * nd + p * lp.d + j0;
        acc += w4(at, j0, lp.d, vec);
    }
    set_w4(lp.enc_off + b * lp.d + j0, j0, lp.d, vec, acc);
}

// Per (position p, four columns from j0) one invocation walking the B prompts in order: a
// scatter without races (those columns of dT_p are this invocation's alone); B·n·D adds
// where the one-hot product takes V× as many.
@compute @workgroup_size(64)
fn scatter_dt(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let dq = (lp.d + 3u) / 4u;
    let q = flat_index(gid, nwg);
    if (q >= lp.n * dq) { return; }
    let p = q / dq;
    let j0 = (q % dq) * 4u;
    let nd = lp.n * lp.d;
    let col = lp.dt_off + p * lp.d + j0;
    let vec = aligned(lp.d) && aligned(lp.dt_off) && aligned(lp.denc_off);
    for (var u = 0u; u < lp.v; u++) { set_w4(col + u * nd, j0, lp.d, vec, vec4<f32>(0.0)); }
    for (var b = 0u; b < lp.b; b++) {
        let at = col + ints[lp.i_prompts + b * lp.n + p] * nd;
        let g = w4(lp.denc_off + b * lp.d + j0, j0, lp.d, vec);
        set_w4(at, j0, lp.d, vec, w4(at, j0, lp.d, vec) + g);
    }
}

// Grad-norm clip, then Adam as burn's: m̂/(√v + ε·√(1−β2^t)) · √(1−β2^t)/(1−β1^t)
// (engine::fused_lecture's step), four parameters per invocation. The squared norm is
// work[sums_off + 6].
@compute @workgroup_size(64)
fn adam(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i0 = flat_index(gid, nwg) * 4u;
    if (i0 >= lp.p_count) { return; }
    let norm = sqrt(w1(lp.sums_off + 6u));
    var scale = 1.0;
    if (lp.max_norm > 0.0 && norm > lp.max_norm) { scale = lp.max_norm / norm; }
    let vec = i0 + 4u <= lp.p_count && aligned(lp.grad_off) && aligned(lp.am_off)
        && aligned(lp.av_off) && aligned(lp.w_off);
    if (vec) {
        let gs = work[(lp.grad_off + i0) >> 2u] * scale;
        let m = model[(lp.am_off + i0) >> 2u] * lp.b1 + gs * (1.0 - lp.b1);
        let v = model[(lp.av_off + i0) >> 2u] * lp.b2 + gs * gs * (1.0 - lp.b2);
        model[(lp.am_off + i0) >> 2u] = m;
        model[(lp.av_off + i0) >> 2u] = v;
        let update = m * lp.factor / (sqrt(v) + lp.eps * lp.bc2);
        let w = (lp.w_off + i0) >> 2u;
        model[w] = model[w] - update * lp.lr;
        return;
    }
    for (var e = 0u; e < 4u; e++) {
        let i = i0 + e;
        if (i < lp.p_count) {
            let gs = w1(lp.grad_off + i) * scale;
            let m = m1(lp.am_off + i) * lp.b1 + gs * (1.0 - lp.b1);
            let v = m1(lp.av_off + i) * lp.b2 + gs * gs * (1.0 - lp.b2);
            set_m1(lp.am_off + i, m);
            set_m1(lp.av_off + i, v);
            let update = m * lp.factor / (sqrt(v) + lp.eps * lp.bc2);
            set_m1(lp.w_off + i, m1(lp.w_off + i) - update * lp.lr);
        }
    }
}
