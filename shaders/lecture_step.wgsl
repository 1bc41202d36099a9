// The lecture model's GRPO step on the device, between the products of matmul.wgsl
// (GRPO-SPEC §2 steps 5–6, §4). Reference: engine::wgsl_lecture::reference (one plain-Rust
// function per entry point, the pieces of engine::fused_lecture's step). The per-token loss
// and its derivative are common.wgsl's pg_term / kl_term (the formulas token_loss.wgsl logs
// with; reference: objective::loss::reference).
//
// Every float lives in one of two buffers: `model` (weights, the reference copy, Adam's
// moments) and `work` (activations, per-token terms, gradients, sums), at the element
// offsets of `Lp`; integers (prompts, sampled tokens, greedy answers) in `ints`. Shapes:
// B prompts of n tokens, G responses each, vocabulary V, width D; rows = B·n
// (prompt, position) pairs; tokens = B·G·n.
//
//   row_stats    [rows]     log Z of softmax(logits/T) per row, and its entropy
//   gather_logp  [tokens]   log π of each token → work[out]
//   row_step     [rows]     per row: log Z and the entropy; per token of the row log π, ρ,
//                           the loss term, KL and clip flags (summed over the row into the
//                           stats channels) and coef = (∂term/∂logπ + β·∂KL/∂logπ) · w / T;
//                           then dlogits = Σ_g coef·(onehot − softmax)
//   argmax       [rows]     greedy token per row (first maximum)
//   reduce_partial / reduce_final: deterministic two-level sums of channels
//   copy_ref     [P]        reference ← policy
// (`copy_ref` finds the policy's weights at model[w_off ..]: 0 in the engine.) The gather,
// its backward and Adam are in lecture_vec.wgsl (four floats at a time).

@group(0) @binding(1) var<storage, read_write> model: array<f32>;
@group(0) @binding(2) var<storage, read_write> work: array<f32>;
@group(0) @binding(3) var<storage, read_write> ints: array<u32>;


@compute @workgroup_size(64)
fn row_stats(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = flat_index(gid, nwg);
    if (r >= lp.rows) { return; }
    let base = lp.logits_off + r * lp.v;
    var m = F32_LOWEST;
    for (var u = 0u; u < lp.v; u++) { m = max(m, work[base + u] * lp.inv_t); }
    var total = 0.0;
    for (var u = 0u; u < lp.v; u++) { total += exp(work[base + u] * lp.inv_t - m); }
    let lz = m + log(total);
    work[lp.logz_off + r] = lz;
    var h = 0.0;
    for (var u = 0u; u < lp.v; u++) {
        let z = work[base + u] * lp.inv_t;
        let e = exp(z - m);
        if (e > 0.0) { h -= e / total * (z - lz); }
    }
    work[lp.ent_off + r] = h;
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
        let pg = pg_term(lp.mode, a, ratio, l, lp.lo, lp.hi);
        let c = (pg.y + dkl) * lp.cw;
        work[lp.coef_off + t] = c;
        row_coef += c;
        s_term += pg.x;
        s_kl += kl.x;
        s_ratio += ratio;
        s_low += select(0.0, 1.0, ratio < lp.lo && a < 0.0);
        s_high += select(0.0, 1.0, ratio > lp.hi && a > 0.0);
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
    for (var u = 0u; u < lp.v; u++) {
        work[dl + u] = work[dl + u] - row_coef * exp(work[base + u] * lp.inv_t - lz);
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

@compute @workgroup_size(64)
fn copy_ref(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_index(gid, nwg);
    if (i >= lp.p_count) { return; }
    model[lp.ref_off + i] = model[lp.w_off + i];
}
