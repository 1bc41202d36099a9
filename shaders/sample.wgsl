// Categorical sampling with temperature, top-k and top-p (GRPO-SPEC §2, step 2).
// Reference: objective::sampling (token_weights, draw). Two passes:
//   row_weights: one invocation per (prompt, position) row of logits [B, T, V] writes the
//                unnormalised weights exp(l/T − max) of the kept tokens (0 for dropped ones);
//   draw:        one invocation per (prompt, response, position) draws by inverse CDF with a
//                counter-based uniform u = hash(seed, iteration, prompt, response, position);
//                `row0` is the first prompt's index where a rollout is cut into chunks (else 0);
//                with `listed`, each prompt's index follows the B·G·T drawn tokens in `tokens`.

struct Params {
    b: u32, g: u32, t: u32, v: u32,
    inv_temperature: f32, top_k: u32, top_p: f32, iteration: u32,
    seed_lo: u32, seed_hi: u32, row0: u32, listed: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> logits: array<f32>;        // [B, T, V]
@group(0) @binding(2) var<storage, read_write> weights: array<f32>; // [B, T, V]
@group(0) @binding(3) var<storage, read_write> tokens: array<u32>;  // [B, G, T]

@compute @workgroup_size(64)
fn row_weights(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = flat_index(gid, nwg);
    if (row >= p.b * p.t) { return; }
    let base = row * p.v;
    // Logits are scaled by 1/T with a multiplication (correctly rounded everywhere, unlike
    // division on some GPUs), and tokens are ranked by the scaled logits, which are exact:
    // only exp() may differ from the Rust reference by an ulp.
    var m = F32_LOWEST;
    for (var i = 0u; i < p.v; i++) { m = max(m, logits[base + i] * p.inv_temperature); }
    var total = 0.0;
    for (var i = 0u; i < p.v; i++) {
        let w = exp(logits[base + i] * p.inv_temperature - m);
        weights[base + i] = w;
        total += w;
    }
    let filter_k = p.top_k > 0u && p.top_k < p.v;
    let filter_p = p.top_p < 1.0;
    if (!(filter_k || filter_p)) { return; }
    // rank(i) = tokens that come before i: larger scaled logit, or an equal one and a lower id.
    // mass_before(i) = weight of the tokens ranked before i, summed in id order.
    // Kept: rank < top_k and mass_before < top_p · total. Dropped weights are written as
    // negative first (so later ranks still see them), then zeroed.
    for (var i = 0u; i < p.v; i++) {
        let li = logits[base + i] * p.inv_temperature;
        var rank = 0u;
        var before = 0.0;
        for (var j = 0u; j < p.v; j++) {
            let lj = logits[base + j] * p.inv_temperature;
            if (lj > li || (lj == li && j < i)) { rank += 1u; before += abs(weights[base + j]); }
        }
        let keep = (!filter_k || rank < p.top_k) && (!filter_p || before < p.top_p * total);
        if (!keep) { weights[base + i] = -weights[base + i]; }
    }
    for (var i = 0u; i < p.v; i++) { weights[base + i] = max(weights[base + i], 0.0); }
}

@compute @workgroup_size(64)
fn draw(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let idx = flat_index(gid, nwg);
    if (idx >= p.b * p.g * p.t) { return; }
    let ti = idx % p.t;
    let gi = (idx / p.t) % p.g;
    let bi = idx / (p.t * p.g);
    var h = pcg_hash(p.seed_lo ^ pcg_hash(p.seed_hi));
    h = pcg_hash(h ^ p.iteration);
    // The prompt's index: row0 + bi, or (`listed`: the rows a decode left open, drawn apart)
    // the index listed after the drawn tokens.
    var row = p.row0 + bi;
    if (p.listed != 0u) { row = tokens[p.b * p.g * p.t + bi]; }
    h = pcg_hash(h ^ row);
    h = pcg_hash(h ^ gi);
    h = pcg_hash(h ^ ti);
    let u = f32(h >> 8u) * (1.0 / 16777216.0);
    let base = (bi * p.t + ti) * p.v;
    var kept = 0.0;
    for (var i = 0u; i < p.v; i++) { kept += weights[base + i]; }
    let target_mass = u * kept;
    var acc = 0.0;
    var last = 0u;
    var chosen = 0xffffffffu;
    for (var i = 0u; i < p.v; i++) {
        let w = weights[base + i];
        if (w > 0.0) {
            acc += w;
            last = i;
            if (chosen == 0xffffffffu && target_mass < acc) { chosen = i; }
        }
    }
    if (chosen == 0xffffffffu) { chosen = last; }
    tokens[idx] = chosen;
}
