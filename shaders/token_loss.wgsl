// Per-token GRPO terms (GRPO-SPEC §4) and the reductions the metrics need.
// Reference: grpo::loss::reference (token_terms, entropy_row, reduce).
//   tokens:  one invocation per token of [B, G, T]: ratio ρ = exp(logπ − logπ_old), the
//            per-token loss (naive / unclipped / clipped, + β·KL when the KL is in the loss),
//            the chosen KL estimate, and clip flags (bit 0: ρ < 1−ε_low with A < 0;
//            bit 1: ρ > 1+ε_high with A > 0);
//   entropy: one invocation per (prompt, position) row of logits [B, T, V];
//   reduce:  one workgroup sums mask·kl, mask·low, mask·high, mask·ρ, mask, and the entropy.

struct Params {
    b: u32, g: u32, t: u32, v: u32,
    mode: u32,          // 0 naive, 1 unclipped, 2 clipped
    estimator: u32,     // 0 k1, 1 k2, 2 k3
    kl_in_loss: u32,
    bug_quotient: u32,  // BUG (gallery): ρ = logπ / logπ_old
    eps_low: f32, eps_high: f32, beta: f32, temperature: f32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> logp: array<f32>;       // [B, G, T]
@group(0) @binding(2) var<storage, read> old_logp: array<f32>;   // [B, G, T]
@group(0) @binding(3) var<storage, read> ref_logp: array<f32>;   // [B, G, T]
@group(0) @binding(4) var<storage, read> adv: array<f32>;        // [B, G]
@group(0) @binding(5) var<storage, read> mask: array<f32>;       // [B, G, T]
@group(0) @binding(6) var<storage, read> logits: array<f32>;     // [B, T, V]
@group(0) @binding(7) var<storage, read_write> terms: array<f32>;  // [4, B, G, T]: ratio, loss, kl, flags
@group(0) @binding(8) var<storage, read_write> ent: array<f32>;    // [B, T]
@group(0) @binding(9) var<storage, read_write> sums: array<f32>;   // [6]

@compute @workgroup_size(64)
fn tokens(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_index(gid, nwg);
    let count = p.b * p.g * p.t;
    if (i >= count) { return; }
    let a = adv[i / p.t];
    let lp = logp[i];
    var ratio = exp(lp - old_logp[i]);
    if (p.bug_quotient == 1u) { ratio = lp / old_logp[i]; }
    // The formulas the WGSL engine trains with (common.wgsl).
    var loss = pg_term(p.mode, a, ratio, lp, 1.0 - p.eps_low, 1.0 + p.eps_high).x;
    let kl = kl_term(p.estimator, lp, ref_logp[i], 0.0).x;
    if (p.kl_in_loss == 1u && p.beta > 0.0) { loss = loss + p.beta * kl; }
    var flags = 0u;
    if (ratio < 1.0 - p.eps_low && a < 0.0) { flags |= 1u; }
    if (ratio > 1.0 + p.eps_high && a > 0.0) { flags |= 2u; }
    terms[i] = ratio;
    terms[count + i] = loss;
    terms[2u * count + i] = kl;
    terms[3u * count + i] = f32(flags);
}

@compute @workgroup_size(64)
fn entropy(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = flat_index(gid, nwg);
    if (row >= p.b * p.t) { return; }
    let base = row * p.v;
    var m = F32_LOWEST;
    for (var i = 0u; i < p.v; i++) { m = max(m, logits[base + i] / p.temperature); }
    var z = 0.0;
    for (var i = 0u; i < p.v; i++) { z += exp(logits[base + i] / p.temperature - m); }
    let log_z = log(z);
    var h = 0.0;
    for (var i = 0u; i < p.v; i++) {
        let lq = logits[base + i] / p.temperature - m - log_z;
        h -= exp(lq) * lq;
    }
    ent[row] = h;
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

@compute @workgroup_size(256)
fn reduce(@builtin(local_invocation_index) lid: u32) {
    let count = p.b * p.g * p.t;
    var kl = 0.0; var low = 0.0; var high = 0.0; var ratio = 0.0; var m = 0.0; var h = 0.0;
    for (var i = lid; i < count; i += 256u) {
        let w = mask[i];
        let flags = u32(terms[3u * count + i]);
        ratio += w * terms[i];
        kl += w * terms[2u * count + i];
        low += w * f32(flags & 1u);
        high += w * f32((flags >> 1u) & 1u);
        m += w;
    }
    for (var i = lid; i < p.b * p.t; i += 256u) { h += ent[i]; }
    let s_kl = workgroup_sum(lid, kl);
    let s_low = workgroup_sum(lid, low);
    let s_high = workgroup_sum(lid, high);
    let s_ratio = workgroup_sum(lid, ratio);
    let s_m = workgroup_sum(lid, m);
    let s_h = workgroup_sum(lid, h);
    if (lid == 0u) {
        sums[0] = s_kl; sums[1] = s_low; sums[2] = s_high; sums[3] = s_ratio; sums[4] = s_m; sums[5] = s_h;
    }
}
