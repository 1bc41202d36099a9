// The sorting verifiers (GRPO-SPEC §1) for B × G responses. Reference: task::reward.
// One invocation per response. Responses are [B, G, T] with a length each (≤ T);
// positions past the length are ignored. Outputs the parts and the weighted reward
//   reward = w_distance·distance + w_exact·exact + w_inclusion_ordering·(inclusion + ordering)
// (summed in that order, as RewardFn does).

struct Params {
    b: u32, g: u32, t: u32, n: u32,
    w_distance: f32, w_exact: f32, w_inclusion_ordering: f32, _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> prompts: array<u32>;      // [B, n]
@group(0) @binding(2) var<storage, read> responses: array<u32>;    // [B, G, T]
@group(0) @binding(3) var<storage, read> lengths: array<u32>;      // [B, G]
@group(0) @binding(4) var<storage, read_write> parts: array<u32>;  // [B, G, 4]: distance, inclusion, ordering, exact
@group(0) @binding(5) var<storage, read_write> rewards: array<f32>; // [B, G]

const MAX_N: u32 = 64u;

@compute @workgroup_size(64)
fn score(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let idx = flat_index(gid, nwg);
    if (idx >= p.b * p.g) { return; }
    let bi = idx / p.g;
    let len = min(lengths[idx], p.t);
    let r0 = idx * p.t;
    // sorted(prompt) by insertion sort
    var truth: array<u32, 64>;
    for (var i = 0u; i < p.n; i++) {
        let x = prompts[bi * p.n + i];
        var j = i;
        while (j > 0u && truth[j - 1u] > x) { truth[j] = truth[j - 1u]; j -= 1u; }
        truth[j] = x;
    }
    var distance = 0u;
    for (var i = 0u; i < min(len, p.n); i++) {
        if (responses[r0 + i] == truth[i]) { distance += 1u; }
    }
    var inclusion = 0u;
    for (var i = 0u; i < p.n; i++) {
        let x = prompts[bi * p.n + i];
        var found = false;
        for (var j = 0u; j < len; j++) { if (responses[r0 + j] == x) { found = true; } }
        if (found) { inclusion += 1u; }
    }
    var ordering = 0u;
    for (var i = 1u; i < len; i++) {
        if (responses[r0 + i - 1u] <= responses[r0 + i]) { ordering += 1u; }
    }
    let exact = select(0u, 1u, len == p.n && distance == p.n);
    parts[idx * 4u + 0u] = distance;
    parts[idx * 4u + 1u] = inclusion;
    parts[idx * 4u + 2u] = ordering;
    parts[idx * 4u + 3u] = exact;
    var reward = 0.0;
    reward += p.w_distance * f32(distance);
    reward += p.w_exact * f32(exact);
    reward += p.w_inclusion_ordering * f32(inclusion + ordering);
    rewards[idx] = reward;
}
