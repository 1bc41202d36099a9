// The lecture model's GRPO step on the device, between the products of matmul.wgsl
// (GRPO-SPEC §2 steps 5–6, §4). Reference: engine::wgsl_lecture::reference (one plain-Rust
// function per entry point, the pieces of engine::fused_lecture's step). The per-token loss
// and its derivative are common.wgsl's pg_term / kl_term (reference:
// objective::loss::reference).
//
// Every float lives in one of two buffers: `model` (weights, the reference copy, Adam's
// moments) and `work` (activations, per-token terms, gradients, sums), at the element
// offsets of `Lp`; integers (prompts, sampled tokens, greedy answers) in `ints`. Shapes:
// B prompts of n tokens, G responses each, vocabulary V, width D; rows = B·n
// (prompt, position) pairs; tokens = B·G·n.
//
//   gather_enc   [B·⌈D/4⌉]  enc[b] = Σ_p T_p[x_bp]                     (T = [V, n·D])
//   row_stats    [rows]     log Z of softmax(logits/T) per row, and its entropy
//   gather_logp  [tokens]   log π of each token → work[out]
//   row_step     [rows]     per row: log Z and the entropy; per token of the row log π, ρ,
//                           the loss term, KL and clip flags (summed over the row into the
//                           stats channels) and coef = (∂term/∂logπ + β·∂KL/∂logπ) · w / T;
//                           then dlogits = Σ_g coef·(onehot − softmax)
//   scatter_dt   [n·D]      dT_p = Σ_b onehot(x_bp) ⊗ d_enc[b], gather_enc's backward
//   argmax       [rows]     greedy token per row (first maximum)
//   reduce_partial / reduce_final: deterministic two-level sums of channels
//   adam         [⌈P/4⌉]    grad-norm clip and Adam, as burn's
//   copy_ref     [P]        reference ← policy
// (`adam` and `copy_ref` find the policy's weights at model[w_off ..]: 0 in the engine.)

struct Lp {
    b: u32, g: u32, n: u32, v: u32,
    d: u32, tokens: u32, rows: u32, count: u32,
    w_off: u32, t_off: u32, m_off: u32, enc_off: u32,
    logits_off: u32, logz_off: u32, ent_off: u32, adv_off: u32,
    out_off: u32, coef_off: u32, stats_off: u32, dl_off: u32,
    denc_off: u32, dt_off: u32, grad_off: u32, part_off: u32,
    sums_off: u32, src_off: u32, i_prompts: u32, i_tokens: u32,
    i_greedy: u32, p_count: u32, am_off: u32, av_off: u32,
    ref_off: u32, old_off: u32, rf_off: u32, mode: u32,
    estimator: u32, kl_on: u32, square: u32, chunk: u32,
    nchunks: u32, channels: u32, _u0: u32, _u1: u32,
    inv_t: f32, cw: f32, beta: f32, lo: f32,
    hi: f32, lr: f32, b1: f32, b2: f32,
    eps: f32, bc2: f32, factor: f32, max_norm: f32,
    dual_clip: f32, delta: f32, cispo_cap: f32, tau_pos: f32,
    tau_neg: f32, _f0: f32, _f1: f32, _f2: f32,
}

@group(0) @binding(0) var<uniform> lp: Lp;
@group(0) @binding(1) var<storage, read_write> model: array<f32>;
@group(0) @binding(2) var<storage, read_write> work: array<f32>;
@group(0) @binding(3) var<storage, read_write> ints: array<u32>;


@compute @workgroup_size(64)
fn gather_enc(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    // Four consecutive columns of one prompt per invocation (the last quad of a row may be
    // short): a quarter of the workgroups.
    let dq = (lp.d + 3u) / 4u;
    let q = flat_index(gid, nwg);
    if (q >= lp.b * dq) { return; }
    let b = q / dq;
    let j0 = (q % dq) * 4u;
    let nd = lp.n * lp.d;
    var acc = vec4<f32>(0.0);
    let jl = lp.d - 1u;
    for (var p = 0u; p < lp.n; p++) {
        let at = lp.t_off + ints[lp.i_prompts + b * lp.n + p] * nd + p * lp.d;
        acc += vec4<f32>(
            work[at + j0],
            work[at + min(j0 + 1u, jl)],
            work[at + min(j0 + 2u, jl)],
            work[at + min(j0 + 3u, jl)],
        );
    }
    let out = lp.enc_off + b * lp.d + j0;
    work[out] = acc.x;
    if (j0 + 1u < lp.d) { work[out + 1u] = acc.y; }
    if (j0 + 2u < lp.d) { work[out + 2u] = acc.z; }
    if (j0 + 3u < lp.d) { work[out + 3u] = acc.w; }
}

// (log Z, H) of the row of logits at `base`, at temperature 1/inv_t: a max-shifted sum; terms
// with e^{z−m} = 0 skipped (reference: wgsl_lecture::reference::row_logz_entropy).
fn row_logz_entropy(base: u32) -> vec2<f32> {
    var m = F32_LOWEST;
    for (var u = 0u; u < lp.v; u++) { m = max(m, work[base + u] * lp.inv_t); }
    var total = 0.0;
    for (var u = 0u; u < lp.v; u++) { total += exp(work[base + u] * lp.inv_t - m); }
    let lz = m + log(total);
    var h = 0.0;
    for (var u = 0u; u < lp.v; u++) {
        let z = work[base + u] * lp.inv_t;
        let e = exp(z - m);
        if (e > 0.0) { h -= e / total * (z - lz); }
    }
    return vec2<f32>(lz, h);
}

@compute @workgroup_size(64)
fn row_stats(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = flat_index(gid, nwg);
    if (r >= lp.rows) { return; }
    let stats = row_logz_entropy(lp.logits_off + r * lp.v);
    work[lp.logz_off + r] = stats.x;
    work[lp.ent_off + r] = stats.y;
}

fn pg_params() -> Pg {
    return Pg(lp.mode, lp.lo, lp.hi, lp.dual_clip, lp.delta, lp.cispo_cap, lp.tau_pos, lp.tau_neg);
}

fn token_logp(i: u32) -> f32 {
    let bi = i / (lp.g * lp.n);
    let row = bi * lp.n + i % lp.n;
    let tok = ints[lp.i_tokens + i];
    return work[lp.logits_off + row * lp.v + tok] * lp.inv_t - work[lp.logz_off + row];
}

@compute @workgroup_size(64)
fn gather_logp(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_index(gid, nwg);
    if (i >= lp.tokens) { return; }
    work[lp.out_off + i] = token_logp(i);
}

// The step's per-row work in one pass: per
// (prompt, position) row, log Z and the entropy, then for each of its G tokens log π, the
// loss terms and coef, then dlogits of the row; the stats channels are summed over the row's
// G tokens (`stats[c·rows + row]`; the entropy as G × the row's, as G tokens see it).
@compute @workgroup_size(64)
fn row_step(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = flat_index(gid, nwg);
    if (r >= lp.rows) { return; }
    let base = lp.logits_off + r * lp.v;
    let stats = row_logz_entropy(base);
    let lz = stats.x;
    let h = stats.y;
    let bi = r / lp.n;
    let pos = r % lp.n;
    var beta = 0.0;
    if (lp.kl_on == 1u) { beta = lp.beta; }
    var row_coef = 0.0;
    var s_term = 0.0; var s_kl = 0.0; var s_ratio = 0.0; var s_low = 0.0; var s_high = 0.0;
    for (var gi = 0u; gi < lp.g; gi++) {
        let t = (bi * lp.g + gi) * lp.n + pos;
        let tok = ints[lp.i_tokens + t];
        let l = work[base + tok] * lp.inv_t - lz;
        work[lp.out_off + t] = l;
        let ratio = exp(l - work[lp.old_off + t]);
        let a = work[lp.adv_off + t / lp.n];
        let kl = kl_term(lp.estimator, l, work[lp.rf_off + t], beta);
        var dkl = kl.y;
        if (lp.kl_on == 0u) { dkl = 0.0; }
        let pg = pg_term(pg_params(), a, ratio, ratio, l);
        let c = (pg.y + dkl) * lp.cw;
        work[lp.coef_off + t] = c;
        row_coef += c;
        s_term += pg.x;
        s_kl += kl.x;
        s_ratio += ratio;
        let flags = clip_flags(pg_params(), ratio, a);
        s_low += flags.x;
        s_high += flags.y;
    }
    let s = lp.stats_off;
    let rows = lp.rows;
    work[s + r] = s_term;
    work[s + rows + r] = s_kl;
    work[s + 2u * rows + r] = s_ratio;
    work[s + 3u * rows + r] = s_low;
    work[s + 4u * rows + r] = s_high;
    work[s + 5u * rows + r] = h * f32(lp.g);
    // dlogits = Σ_g coef·onehot − row_coef · softmax, in engine::fused_lecture's order: the
    // one-hot part summed per id in g order from 0, then the softmax part (V + G work per row
    // instead of V × G). The order matters beyond rounding: where the coefs cancel exactly
    // (normalized advantages of a group), row_coef and each id's sum are both exactly 0 and so
    // is dlogits; another order leaves ±1e-9 that Adam would blow up to ±lr steps.
    let dl = lp.dl_off + r * lp.v;
    for (var u = 0u; u < lp.v; u++) { work[dl + u] = 0.0; }
    for (var gi = 0u; gi < lp.g; gi++) {
        let t = (bi * lp.g + gi) * lp.n + pos;
        let at = dl + ints[lp.i_tokens + t];
        work[at] = work[at] + work[lp.coef_off + t];
    }
    // Below f32's normal range: 0, as the fused step writes it (subnormal gradients).
    for (var u = 0u; u < lp.v; u++) {
        work[dl + u] = normal_or_zero(work[dl + u] - row_coef * exp(work[base + u] * lp.inv_t - lz));
    }
}

// The backward of gather_enc: dT_p[u] = Σ_b [x_bp = u] · d_enc[b], per (position p, column
// j) one invocation walking the B prompts in order (a scatter without races: the column
// (p, j) of dT is this invocation's alone). B·n·D adds where the one-hot product takes V×.
@compute @workgroup_size(64)
fn scatter_dt(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_index(gid, nwg);
    let nd = lp.n * lp.d;
    if (i >= nd) { return; }
    let p = i / lp.d;
    let j = i % lp.d;
    for (var u = 0u; u < lp.v; u++) { work[lp.dt_off + u * nd + i] = 0.0; }
    for (var b = 0u; b < lp.b; b++) {
        let at = lp.dt_off + ints[lp.i_prompts + b * lp.n + p] * nd + i;
        work[at] = work[at] + work[lp.denc_off + b * lp.d + j];
    }
}

@compute @workgroup_size(64)
fn argmax(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = flat_index(gid, nwg);
    if (r >= lp.rows) { return; }
    let base = lp.logits_off + r * lp.v;
    var best = 0u;
    for (var u = 1u; u < lp.v; u++) {
        if (work[base + u] > work[base + best]) { best = u; }
    }
    ints[lp.i_greedy + r] = best;
}

var<workgroup> partial: array<f32, 256>;

fn workgroup_sum(lid: u32, x: f32) -> f32 {
    partial[lid] = x;
    workgroupBarrier();
    for (var stride = 128u; stride > 0u; stride >>= 1u) {
        if (lid < stride) { partial[lid] += partial[lid + stride]; }
        workgroupBarrier();
    }
    let total = partial[0];
    workgroupBarrier();
    return total;
}

// Workgroup (x, channel y) sums `chunk` elements of channel y of `work[src_off ..]`
// (`count` per channel; squared when `square`) into work[part_off + y·nchunks + x].
@compute @workgroup_size(256)
fn reduce_partial(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let start = wid.x * lp.chunk;
    let end = min(start + lp.chunk, lp.count);
    let base = lp.src_off + wid.y * lp.count;
    var acc = 0.0;
    for (var i = start + lid; i < end; i += 256u) {
        let x = work[base + i];
        if (lp.square == 1u) { acc += x * x; } else { acc += x; }
    }
    let total = workgroup_sum(lid, acc);
    if (lid == 0u) { work[lp.part_off + wid.y * lp.nchunks + wid.x] = total; }
}

// Workgroup y sums channel y's partials into work[sums_off + y].
@compute @workgroup_size(256)
fn reduce_final(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    var acc = 0.0;
    for (var i = lid; i < lp.nchunks; i += 256u) { acc += work[lp.part_off + wid.y * lp.nchunks + i]; }
    let total = workgroup_sum(lid, acc);
    if (lid == 0u) { work[lp.sums_off + wid.y] = total; }
}

// Grad-norm clip, then Adam as burn's: m̂/(√v + ε·√(1−β2^t)) · √(1−β2^t)/(1−β1^t)
// (engine::fused_lecture's step). The squared norm is work[sums_off + 6].
@compute @workgroup_size(64)
fn adam(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    // Four consecutive parameters per invocation (a quarter of the workgroups: lavapipe pays
    // per workgroup).
    let i0 = flat_index(gid, nwg) * 4u;
    if (i0 >= lp.p_count) { return; }
    // A gradient whose squared norm is not finite (exponent bits all ones) changes nothing, as
    // on the fused engines (the trainer then stops the run). A max_norm below 0: no norm at all
    // (the transformer's cold start, as the fused engine's supervised Adam: no clip, no check).
    var scale = 1.0;
    if (lp.max_norm >= 0.0) {
        let sq = work[lp.sums_off + 6u];
        if ((bitcast<u32>(sq) & 0x7f800000u) == 0x7f800000u) { return; }
        let norm = sqrt(sq);
        if (lp.max_norm > 0.0 && norm > lp.max_norm) { scale = lp.max_norm / norm; }
    }
    // No subnormal enters or leaves the moments (objective::adam's `element`: llvmpipe, as
    // the x86 cores it runs on, is ~100× slower on them; GPUs mostly flush them anyway).
    let tiny_m = F32_MIN_NORMAL / (1.0 - lp.b1);
    let tiny_v = sqrt(F32_MIN_NORMAL / (1.0 - lp.b2));
    for (var e = 0u; e < 4u; e++) {
        let i = i0 + e;
        if (i < lp.p_count) {
            let gs = work[lp.grad_off + i] * scale;
            let gm = select(gs, 0.0, abs(gs) < tiny_m);
            let gv = select(gs, 0.0, abs(gs) < tiny_v);
            let m = normal_or_zero(model[lp.am_off + i] * lp.b1 + gm * (1.0 - lp.b1));
            let v = normal_or_zero(model[lp.av_off + i] * lp.b2 + gv * gv * (1.0 - lp.b2));
            model[lp.am_off + i] = m;
            model[lp.av_off + i] = v;
            let update = m * lp.factor / (sqrt(v) + lp.eps * lp.bc2);
            model[lp.w_off + i] = model[lp.w_off + i] - update * lp.lr;
        }
    }
}

// f32's smallest normal, and `x` or zero where `x` is below it in magnitude (objective::adam).
const F32_MIN_NORMAL: f32 = 1.17549435e-38;

fn normal_or_zero(x: f32) -> f32 {
    return select(x, 0.0, abs(x) < F32_MIN_NORMAL);
}

@compute @workgroup_size(64)
fn copy_ref(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_index(gid, nwg);
    if (i >= lp.p_count) { return; }
    model[lp.ref_off + i] = model[lp.w_off + i];
}
