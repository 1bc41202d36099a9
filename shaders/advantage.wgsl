// Group statistics and every advantage mode in one pass (GRPO-SPEC §3). Reference: objective::advantage.
//   batch_stats:      one workgroup reduces all B·G rewards to the batch mean and unbiased std;
//   group_advantages: one invocation per group: mean, unbiased std, max, min, the zero-std
//                     flag, and the advantage of each response under all six modes.
// Mode order in `advantages` ([6, B, G]): raw, centered, normalized, max, rloo, batch_normalized.

struct Params { b: u32, g: u32, _pad0: u32, _pad1: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> rewards: array<f32>;          // [B, G]
@group(0) @binding(2) var<storage, read_write> batch: array<f32>;      // [2]: mean, std
@group(0) @binding(3) var<storage, read_write> stats: array<f32>;      // [B, 4]: mean, std, max, min
@group(0) @binding(4) var<storage, read_write> zero_std: array<u32>;   // [B]
@group(0) @binding(5) var<storage, read_write> advantages: array<f32>; // [6, B, G]

const STD_EPS: f32 = 1e-5;
var<workgroup> partial: array<f32, 256>;

@compute @workgroup_size(256)
fn batch_stats(@builtin(local_invocation_index) lid: u32) {
    let count = p.b * p.g;
    var s = 0.0;
    for (var i = lid; i < count; i += 256u) { s += rewards[i]; }
    partial[lid] = s;
    workgroupBarrier();
    for (var stride = 128u; stride > 0u; stride >>= 1u) {
        if (lid < stride) { partial[lid] += partial[lid + stride]; }
        workgroupBarrier();
    }
    let mean = partial[0] / f32(count);
    workgroupBarrier();
    var q = 0.0;
    for (var i = lid; i < count; i += 256u) { let d = rewards[i] - mean; q += d * d; }
    partial[lid] = q;
    workgroupBarrier();
    for (var stride = 128u; stride > 0u; stride >>= 1u) {
        if (lid < stride) { partial[lid] += partial[lid + stride]; }
        workgroupBarrier();
    }
    if (lid == 0u) {
        batch[0] = mean;
        batch[1] = select(0.0, sqrt(partial[0] / f32(count - 1u)), count > 1u);
    }
}

@compute @workgroup_size(64)
fn group_advantages(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let bi = flat_index(gid, nwg);
    if (bi >= p.b) { return; }
    let g = p.g;
    let base = bi * g;
    var sum = 0.0;
    var mx = F32_LOWEST;
    var mn = F32_HIGHEST;
    for (var i = 0u; i < g; i++) {
        let r = rewards[base + i];
        sum += r;
        mx = max(mx, r);
        mn = min(mn, r);
    }
    // A flat group's mean is its value (the sum can round a ulp off it; objective::advantage).
    let mean = select(sum / f32(g), mx, mx == mn);
    var q = 0.0;
    for (var i = 0u; i < g; i++) { let d = rewards[base + i] - mean; q += d * d; }
    let sd = select(0.0, sqrt(q / f32(g - 1u)), g > 1u);
    stats[bi * 4u + 0u] = mean;
    stats[bi * 4u + 1u] = sd;
    stats[bi * 4u + 2u] = mx;
    stats[bi * 4u + 3u] = mn;
    zero_std[bi] = select(0u, 1u, mx == mn);
    let bg = p.b * g;
    let bstd = batch[1];
    for (var i = 0u; i < g; i++) {
        let r = rewards[base + i];
        let j = base + i;
        advantages[0u * bg + j] = r;
        advantages[1u * bg + j] = r - mean;
        advantages[2u * bg + j] = (r - mean) / (sd + STD_EPS);
        advantages[3u * bg + j] = select(0.0, r, r == mx);
        advantages[4u * bg + j] = select(0.0, (r - mean) * f32(g) / f32(g - 1u), g > 1u);
        advantages[5u * bg + j] = (r - mean) / (bstd + STD_EPS);
    }
}
