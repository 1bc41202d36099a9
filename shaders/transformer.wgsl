// The transformer policy's teacher-forced pass and its backward on the device, between the
// products of matmul.wgsl (model::transformer; the pieces of engine::fused_transformer's
// forward_into / backward, which is the reference the tests hold this file to, as a whole
// pass: log π, the entropy and every weight's gradient).
//
// Buffers as lecture_step.wgsl's: `model` (weights, the reference copy, Adam's moments),
// `work` (activations, per-token values, gradients), `ints` (token ids), at the element
// offsets of `Tp`. A batch is `rows` sequences of `s` positions — the prompt's n tokens, then
// the response's first T − 1 — answering `b` prompts: rows 0..sampled answer prompt r / g,
// the rest (a rollout's greedy rows) prompt r − sampled. Position-major, the prompt's
// positions once per prompt: flat row p·b + prompt for p < n, then per position p ≥ n the rows
// that hold it (below `start`: a batch's closed rows skip their padding). The
// positions t0..t1 of every row — the whole pass (0..s), a prefill (0..n), a decoding step
// (one position; earlier keys and values already in `qkv`: the KV cache is the pass's own
// activations) — are one block of rows and one matrix product. The logits at position
// n − 1 + i predict response token i (at n − 1: every response of the prompt's first token),
// so past its keys and values the last block, the final LayerNorm and the head run from
// position n − 1 on (t0 = n − 1 for those dispatches; in the backward the rows before get
// their gradient through the keys and values alone).
//
//   embed          [W·D]        x = tok_emb[token] + pos_emb[position]      (W rows in range;
//                               where D is not a multiple of 4)
//   layer_norm     [W]          y = x̂·g + b, keeping x̂ and 1/σ                   (ε = 1e-5)
//                               (layer_norm4: x = the embedding or x += the previous block's
//                               b₂ first where asked; layer_norm4_y, bias_gelu4_act and
//                               attention4_ctx keep only their output: a rollout's and the
//                               reference's passes, which no backward reads)
//   attention      [W·H]        causal softmax(q·kᵀ·scale) over keys 0..=q, ctx = Σ p·v
//   bias_gelu      [W·F]        h += b₁, keeping Φ(h), act = h·Φ(h)
//   add_bias       [W·cols]     x += b (b₂ where D is not a multiple of 4)
//   score          [rows·T]     log Z, log π of the response token and the entropy (masked)
//   dlogits        [N]          ∂L/∂logits from ∂L/∂log π and ∂L/∂H of the tokens a row
//                               predicts (a prompt's last position: its responses' first)
//   ln_backward    [W]          dx (+)= LayerNorm's backward                (W rows in range)
//   ln_params      [D]          ∂g = Σ dy·x̂, ∂b = Σ dy over the range's rows, in row order
//   col_sum        [cols]       out[c] = Σ_r src[r·stride + c], in row order
//   pos_grad       [s·D]        ∂pos_emb[p] = Σ over position p's rows, in row order
//                               (ln_params4, col_sum4, pos_grad4: four columns an invocation,
//                               workgroups of 8 — the same sums)
//   gelu_backward  [W·F]        dh ·= Φ(h) + h·φ(h)
//   attn_back_q    [N·H]        dS = P ⊙ (dP − Σ P·dP) into `z`, dq = scale·dS·K
//   attn_back_kv   [N·H]        dk = scale·dSᵀ·Q, dv = Pᵀ·dctx over every query of the key
//                               (a prompt's key: its prompt's and all its responses' queries)
//   expand         [rows·V]     a prompt's logits to each of its rows (a rollout's first token)
//   place          [rows]       a rollout's position i: each open row's drawn token (log π of
//                               it for the sampled rows) into its response and its sequence;
//                               a row that drew <eos> is closed and gets <eos> after
// Every sum over rows runs in one invocation in a fixed order: the same bits on every run.

struct Tp {
    rows: u32, s: u32, t0: u32, t1: u32,
    d: u32, h: u32, f: u32, v: u32,
    n: u32, t: u32, cols: u32, stride: u32,
    x: u32, y: u32, z: u32, xhat: u32,
    rstd: u32, gain: u32, bias: u32, qkv: u32,
    att: u32, ctx: u32, cdf: u32, act: u32,
    logits: u32, logz: u32, logp: u32, ent: u32,
    coef: u32, dcoef: u32, mask: u32, i_seq: u32,
    i_resp: u32, tok: u32, pos: u32, flags: u32,
    i: u32, sampled: u32, i_drawn: u32, i_state: u32,
    inv_t: f32, scale: f32, g: u32, b: u32,
    i_start: u32, i_rank: u32, i_row: u32, i_pos: u32,
    i_npos: u32, r0: u32, rn: u32, total: u32,
    dense: u32, pad0: u32, pad1: u32, pad2: u32,
}

@group(0) @binding(0) var<uniform> tp: Tp;
@group(0) @binding(1) var<storage, read_write> model: array<f32>;
@group(0) @binding(2) var<storage, read_write> work: array<f32>;
@group(0) @binding(3) var<storage, read_write> ints: array<u32>;

// Whether the heads are of at most 16 (4 quads: attention4 and its backward kernels hold a head
// in registers): 1 yes, 0 no — the transformer engine knows its shape and compiles only that
// path — or 2, decided per dispatch (both paths compiled in). On llvmpipe a path compiled in
// but not taken still costs: the matrix product ran ~25 % slower with its unused general store.
override SMALL_HEADS: u32 = 2u;

fn small_heads(dq: u32) -> bool {
    return SMALL_HEADS == 1u || (SMALL_HEADS == 2u && dq <= 4u);
}

// The prompt row r answers.
fn prompt_of(r: u32) -> u32 {
    if (r < tp.sampled) { return r / tp.g; }
    return r - tp.sampled;
}

// A response position holds only the rows that need it (row r the first npos[r] positions
// from n: those that predict a real token), the rows ordered longest first, so position p's
// are one block: through tables in `ints` the host writes with each batch — the first flat row
// of each position n..s (i_start), each row's rank in that order (i_rank), the row and the
// position of each response flat row (i_row, i_pos; from row n·b), npos (i_npos). Where every
// row holds every position (`dense`: a rollout, the cold start, a batch of full rows) the rank
// is the row and these are the arithmetic below, with no table read (a uniform branch).

// The first flat row of position p (p ≤ s).
fn start(p: u32) -> u32 {
    if (p < tp.n) { return p * tp.b; }
    if (tp.dense != 0u) { return tp.n * tp.b + (p - tp.n) * tp.rows; }
    return ints[tp.i_start + p - tp.n];
}

// Row r's rank among a response position's rows.
fn rank_of(r: u32) -> u32 {
    if (tp.dense != 0u) { return r; }
    return ints[tp.i_rank + r];
}

// The flat row of position p of row r (p < n + npos[r]).
fn flat(p: u32, r: u32) -> u32 {
    if (p < tp.n) { return p * tp.b + prompt_of(r); }
    return start(p) + rank_of(r);
}

// The position of a flat row.
fn position(row: u32) -> u32 {
    if (row < tp.n * tp.b) { return row / tp.b; }
    if (tp.dense != 0u) { return tp.n + (row - tp.n * tp.b) / tp.rows; }
    return ints[tp.i_pos + row - tp.n * tp.b];
}

// The row of a response flat row (row ≥ n·b).
fn row_of(row: u32) -> u32 {
    if (tp.dense != 0u) { return (row - tp.n * tp.b) % tp.rows; }
    return ints[tp.i_row + row - tp.n * tp.b];
}

// The positions past the prompt row r holds.
fn npos(r: u32) -> u32 {
    if (tp.dense != 0u) { return tp.s - tp.n; }
    return ints[tp.i_npos + r];
}

// The keys the query at flat row `row` sees, resolved once per query: its prompt and, past the
// prompt, its row's rank — prompt_of's and row_of's divisions out of the loops over keys
// (llvmpipe divides a vector's lanes one by one). Under the profiler attention4_ctx's median
// went 0.42 → 0.39 ms; the same rows, the same bits.
struct Keys { prompt: u32, rank: u32 }

fn keys_of(row: u32) -> Keys {
    if (row < tp.n * tp.b) { return Keys(row % tp.b, 0u); }
    let r = row_of(row);
    return Keys(prompt_of(r), rank_of(r));
}

// The flat row of key position j for the query whose keys are `k` (j ≤ its position).
fn key_row(j: u32, k: Keys) -> u32 {
    if (j < tp.n) { return j * tp.b + k.prompt; }
    return start(j) + k.rank;
}

// The flat row of the q-th row of the range t0..t1 (from r0 = start(t0)), and the range's
// rows (rn = start(t1) − r0): the host's, uniform.
fn range_row(q: u32) -> u32 {
    return tp.r0 + q;
}

fn range_count() -> u32 {
    return tp.rn;
}

// Every flat row of a whole pass (start(s)).
fn total_rows() -> u32 {
    return tp.total;
}

@compute @workgroup_size(64)
fn embed(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_index(gid, nwg);
    if (i >= range_count() * tp.d) { return; }
    let j = i % tp.d;
    let row = range_row(i / tp.d);
    let token = ints[tp.i_seq + row];
    work[tp.x + row * tp.d + j] = model[tp.tok + token * tp.d + j] + model[tp.pos + position(row) * tp.d + j];
}

// y = LayerNorm(x)·g + b per row of D (x at `x`, y at `y`), x̂ at `xhat`, 1/σ at `rstd`.
@compute @workgroup_size(64)
fn layer_norm(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let q = flat_index(gid, nwg);
    if (q >= range_count()) { return; }
    let row = range_row(q);
    let base = row * tp.d;
    var total = 0.0;
    for (var j = 0u; j < tp.d; j++) { total += work[tp.x + base + j]; }
    let mean = total / f32(tp.d);
    var var_sum = 0.0;
    for (var j = 0u; j < tp.d; j++) {
        let c = work[tp.x + base + j] - mean;
        var_sum += c * c;
    }
    let r = 1.0 / sqrt(var_sum / f32(tp.d) + LN_EPS);
    work[tp.rstd + row] = r;
    for (var j = 0u; j < tp.d; j++) {
        let h = (work[tp.x + base + j] - mean) * r;
        work[tp.xhat + base + j] = h;
        work[tp.y + base + j] = h * model[tp.gain + j] + model[tp.bias + j];
    }
}

// One query's causal attention in one head over keys 0..=q of its row: the probabilities at
// att[((r·H + head)·s + q)·s + j], the context into ctx's head columns.
@compute @workgroup_size(64)
fn attention(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_index(gid, nwg);
    if (i >= range_count() * tp.h) { return; }
    let head = i % tp.h;
    let row = range_row(i / tp.h);
    let q = position(row);
    let keys = keys_of(row);
    let dh = tp.d / tp.h;
    let d3 = 3u * tp.d;
    let qb = tp.qkv + row * d3 + head * dh;
    let ab = tp.att + (row * tp.h + head) * tp.s;
    var m = F32_LOWEST;
    for (var j = 0u; j <= q; j++) {
        let kb = tp.qkv + key_row(j, keys) * d3 + tp.d + head * dh;
        var qk = 0.0;
        for (var e = 0u; e < dh; e++) { qk += work[qb + e] * work[kb + e]; }
        let sc = qk * tp.scale;
        work[ab + j] = sc;
        m = max(m, sc);
    }
    var total = 0.0;
    for (var j = 0u; j <= q; j++) {
        let p = exp(work[ab + j] - m);
        work[ab + j] = p;
        total += p;
    }
    let inv = 1.0 / total;
    for (var j = 0u; j <= q; j++) { work[ab + j] = work[ab + j] * inv; }
    let cb = tp.ctx + row * tp.d + head * dh;
    for (var e = 0u; e < dh; e++) {
        var acc = 0.0;
        for (var j = 0u; j <= q; j++) {
            acc += work[ab + j] * work[tp.qkv + key_row(j, keys) * d3 + 2u * tp.d + head * dh + e];
        }
        work[cb + e] = acc;
    }
}

// layer_norm where D is a multiple of 4: four elements per load through `work4`, the sums in
// the same order (so the same values). First, with flags bit 1, the residual stream gets the
// previous block's b₂ (at `model[z..]`: `x += b`, add_bias folded in), or with bit 2 it is the
// embedding (`embed` folded in, before the first block) — the same sums, one dispatch and one
// pass over x fewer. layer_norm4_y keeps neither x̂ nor 1/σ: a pass no backward reads (a
// rollout's, the reference's).
fn layer_norm_row4(row: u32, keep: bool) {
    let dq = tp.d / 4u;
    let xb = tp.x / 4u + row * dq;
    let add = (tp.flags & 2u) != 0u;
    let embed = (tp.flags & 4u) != 0u;
    var tok = 0u;
    var pos = 0u;
    if (embed) {
        tok = tp.tok + ints[tp.i_seq + row] * tp.d;
        pos = tp.pos + position(row) * tp.d;
    }
    var total = 0.0;
    for (var j = 0u; j < dq; j++) {
        var v: vec4<f32>;
        if (embed) {
            v = m4quad(tok + 4u * j) + m4quad(pos + 4u * j);
            work4[xb + j] = v;
        } else {
            v = work4[xb + j];
        }
        if (add) {
            v = v + m4quad(tp.z + 4u * j);
            work4[xb + j] = v;
        }
        total += v.x;
        total += v.y;
        total += v.z;
        total += v.w;
    }
    let mean = total / f32(tp.d);
    var var_sum = 0.0;
    for (var j = 0u; j < dq; j++) {
        let c = work4[xb + j] - vec4<f32>(mean);
        var_sum += c.x * c.x;
        var_sum += c.y * c.y;
        var_sum += c.z * c.z;
        var_sum += c.w * c.w;
    }
    let r = 1.0 / sqrt(var_sum / f32(tp.d) + LN_EPS);
    if (keep) { w4set(tp.rstd + row, r); }
    for (var j = 0u; j < dq; j++) {
        let h = (work4[xb + j] - vec4<f32>(mean)) * r;
        if (keep) { work4[tp.xhat / 4u + row * dq + j] = h; }
        let e = 4u * j;
        work4[tp.y / 4u + row * dq + j] = h * m4quad(tp.gain + e) + m4quad(tp.bias + e);
    }
}

@compute @workgroup_size(64)
fn layer_norm4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let q = flat_index(gid, nwg);
    if (q >= range_count()) { return; }
    layer_norm_row4(range_row(q), true);
}

@compute @workgroup_size(64)
fn layer_norm4_y(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let q = flat_index(gid, nwg);
    if (q >= range_count()) { return; }
    layer_norm_row4(range_row(q), false);
}

// `attention` where the head size, D and so every row's q, k, v and ctx start at multiples of
// 4: the same values through `work4` (the work buffer as vec4s, this entry's only view of it —
// on lavapipe a storage load costs a loop over the SIMD lanes per load, so four elements at
// once cost about one), q·k as four partial sums then added (x + y + z + w), the context
// Σ p·v four columns at a time.
@group(0) @binding(2) var<storage, read_write> work4: array<vec4<f32>>;

fn w4get(i: u32) -> f32 {
    return work4[i >> 2u][i & 3u];
}

// The model buffer as vec4s, for the entries that read a weight four at a time (their only view
// of it): a quad from element `i`, one load where `i` is a multiple of 4 (a uniform branch).
@group(0) @binding(1) var<storage, read_write> model4: array<vec4<f32>>;

fn m4quad(i: u32) -> vec4<f32> {
    if ((i & 3u) == 0u) {
        return model4[i >> 2u];
    }
    let j = i + 1u;
    let k = i + 2u;
    let l = i + 3u;
    return vec4<f32>(
        model4[i >> 2u][i & 3u], model4[j >> 2u][j & 3u], model4[k >> 2u][k & 3u], model4[l >> 2u][l & 3u],
    );
}

fn w4set(i: u32, v: f32) {
    work4[i >> 2u][i & 3u] = v;
}

// attention4_ctx: the context alone, P not stored where the heads are small (no backward
// reads it: a rollout's, the reference's).
@compute @workgroup_size(64)
fn attention4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = folded_index(gid, nwg);
    if (i >= range_count() * tp.h) { return; }
    attention_query4(i, true);
}

@compute @workgroup_size(64)
fn attention4_ctx(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = folded_index(gid, nwg);
    if (i >= range_count() * tp.h) { return; }
    attention_query4(i, false);
}

fn attention_query4(i: u32, keep: bool) {
    let head = i % tp.h;
    let row = range_row(i / tp.h);
    let q = position(row);
    let dq = tp.d / tp.h / 4u;
    let d3 = 3u * tp.d;
    let qb = (tp.qkv + row * d3) / 4u + head * dq;
    let ab = tp.att + (row * tp.h + head) * tp.s;
    if (small_heads(dq)) {
        attention_small(row, head, q, dq, qb, ab, keep);
        return;
    }
    let keys = keys_of(row);
    var m = F32_LOWEST;
    for (var j = 0u; j <= q; j++) {
        let kb = (tp.qkv + key_row(j, keys) * d3 + tp.d) / 4u + head * dq;
        var qk = vec4<f32>(0.0);
        for (var e = 0u; e < dq; e++) { qk += work4[qb + e] * work4[kb + e]; }
        let sc = (qk.x + qk.y + qk.z + qk.w) * tp.scale;
        w4set(ab + j, sc);
        m = max(m, sc);
    }
    var total = 0.0;
    for (var j = 0u; j <= q; j++) {
        let p = exp(w4get(ab + j) - m);
        w4set(ab + j, p);
        total += p;
    }
    let inv = 1.0 / total;
    for (var j = 0u; j <= q; j++) { w4set(ab + j, w4get(ab + j) * inv); }
    let cb = (tp.ctx + row * tp.d) / 4u + head * dq;
    for (var e = 0u; e < dq; e++) {
        var acc = vec4<f32>(0.0);
        for (var j = 0u; j <= q; j++) {
            acc += w4get(ab + j) * work4[(tp.qkv + key_row(j, keys) * d3 + 2u * tp.d) / 4u + head * dq + e];
        }
        work4[cb + e] = acc;
    }
}

// attention4 for heads of at most 16 (dq ≤ 4 quads): q and the context held in registers, the
// scores written once, read twice (the softmax's sum, then P), each v read once — 12 storage
// accesses per key instead of 21 or more. The same arithmetic in the same order: q·k over the
// quads in order, exp(s − m) recomputed (the same f32) and multiplied by 1/Σ, each context
// quad summed over the keys in order.
// Quad `i` of the dq quads from `at`, zero past them (a head of at most 16 in named registers).
fn quad_or_zero(at: u32, i: u32, dq: u32) -> vec4<f32> {
    return select(vec4<f32>(0.0), work4[at + min(i, dq - 1u)], dq > i);
}

fn attention_small(row: u32, head: u32, q: u32, dq: u32, qb: u32, ab: u32, keep: bool) {
    let keys = keys_of(row);
    let d3 = 3u * tp.d;
    let zero = vec4<f32>(0.0);
    let q0 = work4[qb];
    let q1 = quad_or_zero(qb, 1u, dq);
    let q2 = quad_or_zero(qb, 2u, dq);
    let q3 = quad_or_zero(qb, 3u, dq);
    var m = F32_LOWEST;
    for (var j = 0u; j <= q; j++) {
        let kb = (tp.qkv + key_row(j, keys) * d3 + tp.d) / 4u + head * dq;
        var qk = q0 * work4[kb];
        if (dq > 1u) { qk += q1 * work4[kb + 1u]; }
        if (dq > 2u) { qk += q2 * work4[kb + 2u]; }
        if (dq > 3u) { qk += q3 * work4[kb + 3u]; }
        let sc = (qk.x + qk.y + qk.z + qk.w) * tp.scale;
        w4set(ab + j, sc);
        m = max(m, sc);
    }
    var total = 0.0;
    for (var j = 0u; j <= q; j++) { total += exp(w4get(ab + j) - m); }
    let inv = 1.0 / total;
    var c0 = zero;
    var c1 = zero;
    var c2 = zero;
    var c3 = zero;
    for (var j = 0u; j <= q; j++) {
        let p = exp(w4get(ab + j) - m) * inv;
        if (keep) { w4set(ab + j, p); }
        let vb = (tp.qkv + key_row(j, keys) * d3 + 2u * tp.d) / 4u + head * dq;
        c0 += p * work4[vb];
        if (dq > 1u) { c1 += p * work4[vb + 1u]; }
        if (dq > 2u) { c2 += p * work4[vb + 2u]; }
        if (dq > 3u) { c3 += p * work4[vb + 3u]; }
    }
    let cb = (tp.ctx + row * tp.d) / 4u + head * dq;
    work4[cb] = c0;
    if (dq > 1u) { work4[cb + 1u] = c1; }
    if (dq > 2u) { work4[cb + 2u] = c2; }
    if (dq > 3u) { work4[cb + 3u] = c3; }
}

@compute @workgroup_size(64)
fn bias_gelu(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_index(gid, nwg);
    if (i >= range_count() * tp.f) { return; }
    let c = i % tp.f;
    let at = range_row(i / tp.f) * tp.f + c;
    let h = work[tp.z + at] + model[tp.bias + c];
    work[tp.z + at] = h;
    let p = normal_cdf(h);
    work[tp.cdf + at] = p;
    work[tp.act + at] = h * p;
}

@compute @workgroup_size(64)
fn add_bias(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_index(gid, nwg);
    if (i >= range_count() * tp.cols) { return; }
    let c = i % tp.cols;
    let at = tp.x + range_row(i / tp.cols) * tp.cols + c;
    work[at] = work[at] + model[tp.bias + c];
}

// The row of logits that predicts response token k = r·T + i.
fn predictor(k: u32) -> u32 {
    return flat(tp.n - 1u + k % tp.t, k / tp.t);
}

// log Z of softmax(logits/T) over the row of logits at `base` (max-shifted).
fn log_z(base: u32) -> f32 {
    var m = F32_LOWEST;
    for (var u = 0u; u < tp.v; u++) { m = max(m, work[base + u] * tp.inv_t); }
    var total = 0.0;
    for (var u = 0u; u < tp.v; u++) { total += exp(work[base + u] * tp.inv_t - m); }
    return m + log(total);
}

// Per response token: log Z of softmax(logits/T), log π of the token and the entropy; 0 where
// the mask is 0 (after a row's end), as the fused pass leaves them.
@compute @workgroup_size(64)
fn score(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let k = flat_index(gid, nwg);
    if (k >= tp.rows * tp.t) { return; }
    if (work[tp.mask + k] == 0.0) {
        work[tp.logp + k] = 0.0;
        work[tp.ent + k] = 0.0;
        work[tp.logz + k] = 0.0;
        return;
    }
    let base = tp.logits + predictor(k) * tp.v;
    let lz = log_z(base);
    var h = 0.0;
    for (var u = 0u; u < tp.v; u++) {
        let lp = work[base + u] * tp.inv_t - lz;
        let p = exp(lp);
        if (p > 0.0) { h -= p * lp; }
    }
    work[tp.logz + k] = lz;
    work[tp.ent + k] = h;
    work[tp.logp + k] = work[base + ints[tp.i_resp + k]] * tp.inv_t - lz;
}

// ∂L/∂logits per flat row (into `y`) from the tokens it predicts — at a response position
// p ≥ n its row's token i = p + 1 − n, at a prompt's last position the first token of each of
// its g responses, none elsewhere — with c = ∂L/∂log π (`coef`) and e = ∂L/∂H (`dcoef`, when
// flags bit 0) of the real ones (mask 1): (Σ c·1[u = token] − (Σ c)·p_u − (Σ e)·p_u·(log p_u + H)) / T.
@compute @workgroup_size(64)
fn dlogits(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = flat_index(gid, nwg);
    if (row >= total_rows()) { return; }
    let out = tp.y + row * tp.v;
    let p = position(row);
    // The tokens: k0, k0 + step, … (count of them).
    var k0 = 0u;
    var count = 0u;
    var step = 0u;
    if (p >= tp.n) {
        k0 = row_of(row) * tp.t + p + 1u - tp.n;
        count = 1u;
    } else if (p + 1u == tp.n) {
        k0 = (row % tp.b) * tp.g * tp.t;
        count = tp.g;
        step = tp.t;
    }
    var csum = 0.0;
    var esum = 0.0;
    var first = 0xffffffffu;
    for (var c = 0u; c < count; c++) {
        let k = k0 + c * step;
        if (work[tp.mask + k] != 0.0) {
            if (first == 0xffffffffu) { first = k; }
            csum += work[tp.coef + k];
            if ((tp.flags & 1u) != 0u) { esum += work[tp.dcoef + k]; }
        }
    }
    if (first == 0xffffffffu) {
        for (var u = 0u; u < tp.v; u++) { work[out + u] = 0.0; }
        return;
    }
    let lz = work[tp.logz + first];
    let h = work[tp.ent + first];
    let base = tp.logits + row * tp.v;
    for (var u = 0u; u < tp.v; u++) {
        let lpj = work[base + u] * tp.inv_t - lz;
        let pj = exp(lpj);
        work[out + u] = (-csum * pj - esum * pj * (lpj + h)) * tp.inv_t;
    }
    for (var c = 0u; c < count; c++) {
        let k = k0 + c * step;
        if (work[tp.mask + k] != 0.0) {
            let at = out + ints[tp.i_resp + k];
            work[at] = work[at] + work[tp.coef + k] * tp.inv_t;
        }
    }
}

// LayerNorm's backward per row of positions t0..t1: dy at `y`, x̂ at `xhat`, 1/σ at `rstd`,
// gain at `gain`; dx at `x`, added to when flags bit 0, else overwritten.
@compute @workgroup_size(64)
fn ln_backward(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_index(gid, nwg);
    if (i >= range_count()) { return; }
    let row = range_row(i);
    let base = row * tp.d;
    var m1 = 0.0;
    var m2 = 0.0;
    for (var j = 0u; j < tp.d; j++) {
        let dh = work[tp.y + base + j] * model[tp.gain + j];
        m1 += dh;
        m2 += dh * work[tp.xhat + base + j];
    }
    m1 /= f32(tp.d);
    m2 /= f32(tp.d);
    let r = work[tp.rstd + row];
    let add = (tp.flags & 1u) != 0u;
    for (var j = 0u; j < tp.d; j++) {
        let hv = work[tp.xhat + base + j];
        let dx = r * (work[tp.y + base + j] * model[tp.gain + j] - m1 - hv * m2);
        let at = tp.x + base + j;
        work[at] = select(dx, work[at] + dx, add);
    }
}

// A LayerNorm's ∂g and ∂b (at `z` and `z + D`): per column, Σ over the rows of positions
// t0..t1 of dy·x̂ and dy.
@compute @workgroup_size(64)
fn ln_params(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let j = flat_index(gid, nwg);
    if (j >= tp.d) { return; }
    var dg = 0.0;
    var db = 0.0;
    for (var row = tp.r0; row < tp.r0 + tp.rn; row++) {
        let dy = work[tp.y + row * tp.d + j];
        dg += dy * work[tp.xhat + row * tp.d + j];
        db += dy;
    }
    work[tp.z + j] = dg;
    work[tp.z + tp.d + j] = db;
}

// out[c] = Σ_{r < rows} src[r·stride + c] for c < cols (src at `y`, out at `z`).
@compute @workgroup_size(64)
fn col_sum(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let c = flat_index(gid, nwg);
    if (c >= tp.cols) { return; }
    var acc = 0.0;
    for (var r = 0u; r < tp.rows; r++) { acc += work[tp.y + r * tp.stride + c]; }
    work[tp.z + c] = acc;
}

// ∂pos_emb[p][j] = Σ over position p's rows of dx[row][j] (dx at `y`, out at `z`).
@compute @workgroup_size(64)
fn pos_grad(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_index(gid, nwg);
    if (i >= tp.s * tp.d) { return; }
    let p = i / tp.d;
    let j = i % tp.d;
    var acc = 0.0;
    for (var row = start(p); row < start(p + 1u); row++) { acc += work[tp.y + row * tp.d + j]; }
    work[tp.z + i] = acc;
}

// dh ·= d gelu/dh = Φ(h) + h·φ(h) (h at `z`, Φ at `cdf`, dh at `y`) at positions t0..t1.
@compute @workgroup_size(64)
fn gelu_backward(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let k = flat_index(gid, nwg);
    if (k >= range_count() * tp.f) { return; }
    let i = range_row(0u) * tp.f + k;
    let x = work[tp.z + i];
    let g = gelu_grad4(vec4<f32>(x), vec4<f32>(work[tp.cdf + i])).x;
    work[tp.y + i] = work[tp.y + i] * g;
}

// bias_gelu and gelu_backward four columns at a time where F is a multiple of 4 (the same
// arithmetic per element, through `work4`); bias_gelu4_act keeps only GELU's output (a pass no
// backward reads).
fn bias_gelu_quad4(i: u32, keep: bool) {
    let fq = tp.f / 4u;
    let c = 4u * (i % fq);
    let at = (range_row(i / fq) * tp.f + c) / 4u;
    let h = work4[tp.z / 4u + at] + m4quad(tp.bias + c);
    let p = vec4<f32>(normal_cdf(h.x), normal_cdf(h.y), normal_cdf(h.z), normal_cdf(h.w));
    if (keep) {
        work4[tp.z / 4u + at] = h;
        work4[tp.cdf / 4u + at] = p;
    }
    work4[tp.act / 4u + at] = h * p;
}

@compute @workgroup_size(64)
fn bias_gelu4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_index(gid, nwg);
    if (i >= range_count() * (tp.f / 4u)) { return; }
    bias_gelu_quad4(i, true);
}

@compute @workgroup_size(64)
fn bias_gelu4_act(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_index(gid, nwg);
    if (i >= range_count() * (tp.f / 4u)) { return; }
    bias_gelu_quad4(i, false);
}

@compute @workgroup_size(64)
fn gelu_backward4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let k = flat_index(gid, nwg);
    if (k >= range_count() * tp.f / 4u) { return; }
    let i = range_row(0u) * tp.f / 4u + k;
    let x = work4[tp.z / 4u + i];
    let g = gelu_grad4(x, work4[tp.cdf / 4u + i]);
    work4[tp.y / 4u + i] = work4[tp.y / 4u + i] * g;
}

// Attention's backward, per (query row, head): dP_j = dctx·v_j, dS_j = P_j·(dP_j − Σ P·dP)
// (into `z`, laid out as `att`), dq = scale·Σ_j dS_j·k_j into dqkv (at `y`); dctx at `ctx`.
@compute @workgroup_size(64)
fn attn_back_q(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_index(gid, nwg);
    if (i >= total_rows() * tp.h) { return; }
    let head = i % tp.h;
    let row = i / tp.h;
    let q = position(row);
    let keys = keys_of(row);
    let dh = tp.d / tp.h;
    let d3 = 3u * tp.d;
    let ab = (row * tp.h + head) * tp.s;
    let cb = tp.ctx + row * tp.d + head * dh;
    var sum = 0.0;
    for (var j = 0u; j <= q; j++) {
        let vb = tp.qkv + key_row(j, keys) * d3 + 2u * tp.d + head * dh;
        var dp = 0.0;
        for (var e = 0u; e < dh; e++) { dp += work[cb + e] * work[vb + e]; }
        work[tp.z + ab + j] = dp;
        sum += work[tp.att + ab + j] * dp;
    }
    for (var j = 0u; j <= q; j++) {
        work[tp.z + ab + j] = work[tp.att + ab + j] * (work[tp.z + ab + j] - sum);
    }
    let out = tp.y + row * d3 + head * dh;
    for (var e = 0u; e < dh; e++) {
        var acc = 0.0;
        for (var j = 0u; j <= q; j++) {
            acc += work[tp.z + ab + j] * work[tp.qkv + key_row(j, keys) * d3 + tp.d + head * dh + e];
        }
        work[out + e] = acc * tp.scale;
    }
}

// dk += scale·dS_qj·q_q and dv += P_qj·dctx_q of one query row (key position j).
fn kv_terms(qrow: u32, j: u32, head: u32, e: u32) -> vec2<f32> {
    let a = (qrow * tp.h + head) * tp.s + j;
    let dh = tp.d / tp.h;
    let dk = work[tp.z + a] * work[tp.qkv + qrow * 3u * tp.d + head * dh + e];
    let dv = work[tp.att + a] * work[tp.ctx + qrow * tp.d + head * dh + e];
    return vec2<f32>(dk, dv);
}

// Per (key row, head): dk = scale·Σ dS_qj·q_q, dv = Σ P_qj·dctx_q over the queries that read
// the key — its own row's later positions; for a prompt's key, the prompt's later positions
// and then every position each of its g responses holds, in that order.
@compute @workgroup_size(64)
fn attn_back_kv(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_index(gid, nwg);
    if (i >= total_rows() * tp.h) { return; }
    let head = i % tp.h;
    let row = i / tp.h;
    let j = position(row);
    let dh = tp.d / tp.h;
    let out = tp.y + row * 3u * tp.d + head * dh;
    let prompt = row < tp.n * tp.b;
    for (var e = 0u; e < dh; e++) {
        var acc = vec2<f32>(0.0);
        if (prompt) {
            let pb = row % tp.b;
            for (var q = j; q < tp.n; q++) { acc += kv_terms(q * tp.b + pb, j, head, e); }
            for (var r = pb * tp.g; r < (pb + 1u) * tp.g; r++) {
                for (var q = tp.n; q < tp.n + npos(r); q++) { acc += kv_terms(flat(q, r), j, head, e); }
            }
        } else {
            let r = row_of(row);
            for (var q = j; q < tp.n + npos(r); q++) { acc += kv_terms(flat(q, r), j, head, e); }
        }
        work[out + tp.d + e] = acc.x * tp.scale;
        work[out + 2u * tp.d + e] = acc.y;
    }
}

// attn_back_q and attn_back_kv through `work4` where `attention4` runs (the same sums; dP's
// dot product as four partial sums, then added; the rest four columns at a time in the same
// order per column).
@compute @workgroup_size(64)
fn attn_back_q4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = folded_index(gid, nwg);
    if (i >= total_rows() * tp.h) { return; }
    let head = i % tp.h;
    let row = i / tp.h;
    let q = position(row);
    let dq = tp.d / tp.h / 4u;
    let d3 = 3u * tp.d;
    let ab = (row * tp.h + head) * tp.s;
    let cb = (tp.ctx + row * tp.d) / 4u + head * dq;
    if (small_heads(dq)) {
        attn_back_q_small(row, head, q, dq, ab, cb);
        return;
    }
    let keys = keys_of(row);
    var sum = 0.0;
    for (var j = 0u; j <= q; j++) {
        let vb = (tp.qkv + key_row(j, keys) * d3 + 2u * tp.d) / 4u + head * dq;
        var dp4 = vec4<f32>(0.0);
        for (var e = 0u; e < dq; e++) { dp4 += work4[cb + e] * work4[vb + e]; }
        let dp = dp4.x + dp4.y + dp4.z + dp4.w;
        w4set(tp.z + ab + j, dp);
        sum += w4get(tp.att + ab + j) * dp;
    }
    for (var j = 0u; j <= q; j++) {
        w4set(tp.z + ab + j, w4get(tp.att + ab + j) * (w4get(tp.z + ab + j) - sum));
    }
    let out = (tp.y + row * d3) / 4u + head * dq;
    for (var e = 0u; e < dq; e++) {
        var acc = vec4<f32>(0.0);
        for (var j = 0u; j <= q; j++) {
            acc += w4get(tp.z + ab + j) * work4[(tp.qkv + key_row(j, keys) * d3 + tp.d) / 4u + head * dq + e];
        }
        work4[out + e] = acc * tp.scale;
    }
}

// kv_terms for four columns: (dk, dv) of columns 4e .. 4e + 3 of the head.
fn kv_terms4(qrow: u32, j: u32, head: u32, e: u32, acc: ptr<function, array<vec4<f32>, 2>>) {
    let a = (qrow * tp.h + head) * tp.s + j;
    let dq = tp.d / tp.h / 4u;
    (*acc)[0] += w4get(tp.z + a) * work4[(tp.qkv + qrow * 3u * tp.d) / 4u + head * dq + e];
    (*acc)[1] += w4get(tp.att + a) * work4[(tp.ctx + qrow * tp.d) / 4u + head * dq + e];
}

// attn_back_q4 for heads of at most 16: dctx and dq in named registers (llvmpipe keeps an
// array or a struct in memory), dS_j stored once and used at once for dq — the same values,
// summed over the keys in the same order per quad.
fn attn_back_q_small(row: u32, head: u32, q: u32, dq: u32, ab: u32, cb: u32) {
    let keys = keys_of(row);
    let d3 = 3u * tp.d;
    let zero = vec4<f32>(0.0);
    let x0 = work4[cb];
    let x1 = quad_or_zero(cb, 1u, dq);
    let x2 = quad_or_zero(cb, 2u, dq);
    let x3 = quad_or_zero(cb, 3u, dq);
    var sum = 0.0;
    for (var j = 0u; j <= q; j++) {
        let vb = (tp.qkv + key_row(j, keys) * d3 + 2u * tp.d) / 4u + head * dq;
        var dp4 = x0 * work4[vb];
        if (dq > 1u) { dp4 += x1 * work4[vb + 1u]; }
        if (dq > 2u) { dp4 += x2 * work4[vb + 2u]; }
        if (dq > 3u) { dp4 += x3 * work4[vb + 3u]; }
        let dp = dp4.x + dp4.y + dp4.z + dp4.w;
        w4set(tp.z + ab + j, dp);
        sum += w4get(tp.att + ab + j) * dp;
    }
    var a0 = zero;
    var a1 = zero;
    var a2 = zero;
    var a3 = zero;
    for (var j = 0u; j <= q; j++) {
        let ds = w4get(tp.att + ab + j) * (w4get(tp.z + ab + j) - sum);
        w4set(tp.z + ab + j, ds);
        let kb = (tp.qkv + key_row(j, keys) * d3 + tp.d) / 4u + head * dq;
        a0 += ds * work4[kb];
        if (dq > 1u) { a1 += ds * work4[kb + 1u]; }
        if (dq > 2u) { a2 += ds * work4[kb + 2u]; }
        if (dq > 3u) { a3 += ds * work4[kb + 3u]; }
    }
    let out = (tp.y + row * d3) / 4u + head * dq;
    work4[out] = a0 * tp.scale;
    if (dq > 1u) { work4[out + 1u] = a1 * tp.scale; }
    if (dq > 2u) { work4[out + 2u] = a2 * tp.scale; }
    if (dq > 3u) { work4[out + 3u] = a3 * tp.scale; }
}

// attn_back_kv4 for heads of at most 16: dk and dv of every quad at once in named registers, dS
// and P read once per query; the queries that see key row `row` (position j) in kv_terms4's
// order — a prompt row's own prompt positions, then each of its group's responses — as one
// loop over their count.
fn attn_back_kv_small(row: u32, head: u32, j: u32, dq: u32, out: u32) {
    let zero = vec4<f32>(0.0);
    var k0 = zero;
    var k1 = zero;
    var k2 = zero;
    var k3 = zero;
    var v0 = zero;
    var v1 = zero;
    var v2 = zero;
    var v3 = zero;
    let prompt = row < tp.n * tp.b;
    let pb = row % tp.b;
    var r = 0u;
    var own = tp.n - j;
    var count = own;
    if (prompt) {
        for (var x = pb * tp.g; x < (pb + 1u) * tp.g; x++) { count += npos(x); }
    } else {
        r = row_of(row);
        own = tp.n + npos(r) - j;
        count = own;
    }
    // A prompt's key: its responses' queries, position n + qa of row rr, in row order.
    var qa = 0u;
    var rr = pb * tp.g;
    for (var t = 0u; t < count; t++) {
        var qrow: u32;
        if (!prompt) {
            qrow = flat(j + t, r);
        } else if (t < own) {
            qrow = (j + t) * tp.b + pb;
        } else {
            loop {
                if (qa < npos(rr)) { break; }
                qa = 0u;
                rr += 1u;
            }
            qrow = flat(tp.n + qa, rr);
            qa += 1u;
        }
        let a = (qrow * tp.h + head) * tp.s + j;
        let dsv = w4get(tp.z + a);
        let p = w4get(tp.att + a);
        let qb = (tp.qkv + qrow * 3u * tp.d) / 4u + head * dq;
        let cb = (tp.ctx + qrow * tp.d) / 4u + head * dq;
        k0 += dsv * work4[qb];
        v0 += p * work4[cb];
        if (dq > 1u) { k1 += dsv * work4[qb + 1u]; v1 += p * work4[cb + 1u]; }
        if (dq > 2u) { k2 += dsv * work4[qb + 2u]; v2 += p * work4[cb + 2u]; }
        if (dq > 3u) { k3 += dsv * work4[qb + 3u]; v3 += p * work4[cb + 3u]; }
    }
    let kb = out + tp.d / 4u;
    let vb = out + tp.d / 2u;
    work4[kb] = k0 * tp.scale;
    work4[vb] = v0;
    if (dq > 1u) { work4[kb + 1u] = k1 * tp.scale; work4[vb + 1u] = v1; }
    if (dq > 2u) { work4[kb + 2u] = k2 * tp.scale; work4[vb + 2u] = v2; }
    if (dq > 3u) { work4[kb + 3u] = k3 * tp.scale; work4[vb + 3u] = v3; }
}

@compute @workgroup_size(64)
fn attn_back_kv4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = folded_index(gid, nwg);
    if (i >= total_rows() * tp.h) { return; }
    let head = i % tp.h;
    let row = i / tp.h;
    let j = position(row);
    let dq = tp.d / tp.h / 4u;
    let out = (tp.y + row * 3u * tp.d) / 4u + head * dq;
    if (small_heads(dq)) {
        attn_back_kv_small(row, head, j, dq, out);
        return;
    }
    let prompt = row < tp.n * tp.b;
    for (var e = 0u; e < dq; e++) {
        var acc = array<vec4<f32>, 2>(vec4<f32>(0.0), vec4<f32>(0.0));
        if (prompt) {
            let pb = row % tp.b;
            for (var q = j; q < tp.n; q++) { kv_terms4(q * tp.b + pb, j, head, e, &acc); }
            for (var r = pb * tp.g; r < (pb + 1u) * tp.g; r++) {
                for (var q = tp.n; q < tp.n + npos(r); q++) { kv_terms4(flat(q, r), j, head, e, &acc); }
            }
        } else {
            let r = row_of(row);
            for (var q = j; q < tp.n + npos(r); q++) { kv_terms4(flat(q, r), j, head, e, &acc); }
        }
        work4[out + tp.d / 4u + e] = acc[0] * tp.scale;
        work4[out + tp.d / 2u + e] = acc[1];
    }
}

// ln_backward where D is a multiple of 4, through `work4`: the same sums in the same order.
// With flags bit 1, the workgroups past the rows' (the rows rounded up to whole workgroups) sum
// ∂g and ∂β into z as ln_params4 does, eight column quads a workgroup (its first 8 lanes): the
// two read dy and x̂ and write apart (dx, the gradient), so they share one dispatch — a
// dispatch of lavapipe's costs ~40 µs before any work, and ln_params4's two 8-wide workgroups
// ran 0.13–0.18 ms each, four a supervised step of transformer-sort. The same sums in the same
// order: the same bits.
@compute @workgroup_size(64)
fn ln_backward4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_index(gid, nwg);
    let rows = (range_count() + 63u) / 64u * 64u;
    if ((tp.flags & 2u) != 0u && i >= rows) {
        let l = (i - rows) % 64u;
        if (l < 8u) { ln_params_quad((i - rows) / 64u * 8u + l); }
        return;
    }
    if (i >= range_count()) { return; }
    let row = range_row(i);
    let dq = tp.d / 4u;
    let yb = tp.y / 4u + row * dq;
    let hb = tp.xhat / 4u + row * dq;
    let xb = tp.x / 4u + row * dq;
    var m = vec2<f32>(0.0);
    for (var j = 0u; j < dq; j++) {
        m = ln_back_sums(m, work4[yb + j] * m4quad(tp.gain + 4u * j), work4[hb + j]);
    }
    let m1 = m.x / f32(tp.d);
    let m2 = m.y / f32(tp.d);
    let r = w4get(tp.rstd + row);
    let add = (tp.flags & 1u) != 0u;
    for (var j = 0u; j < dq; j++) {
        let dx = r * (work4[yb + j] * m4quad(tp.gain + 4u * j) - vec4<f32>(m1) - work4[hb + j] * m2);
        if (add) {
            work4[xb + j] = work4[xb + j] + dx;
        } else {
            work4[xb + j] = dx;
        }
    }
}

// The sums over rows four columns per invocation, in workgroups of 8: on llvmpipe a workgroup
// is one thread's work, so the columns spread over both cores where one 64-wide group summed
// them all on one; each column's sum in row order as before (the same values).
fn flat8(gid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return gid.x + gid.y * nwg.x * 8u;
}

// A quad into `work` from element i (four stores where i is not a multiple of 4: a gradient's
// offset in the weights' layout).
fn w4set4(i: u32, v: vec4<f32>) {
    if ((i & 3u) == 0u) {
        work4[i >> 2u] = v;
        return;
    }
    w4set(i, v.x);
    w4set(i + 1u, v.y);
    w4set(i + 2u, v.z);
    w4set(i + 3u, v.w);
}

// ln_params where D is a multiple of 4.
@compute @workgroup_size(8)
fn ln_params4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    ln_params_quad(flat8(gid, nwg));
}

// ∂g and ∂β of column quad jq: Σ over the range's rows of dy·x̂ and of dy, in row order.
fn ln_params_quad(jq: u32) {
    let dq = tp.d / 4u;
    if (jq >= dq) { return; }
    var dg = vec4<f32>(0.0);
    var db = vec4<f32>(0.0);
    for (var row = tp.r0; row < tp.r0 + tp.rn; row++) {
        let dy = work4[tp.y / 4u + row * dq + jq];
        dg += dy * work4[tp.xhat / 4u + row * dq + jq];
        db += dy;
    }
    w4set4(tp.z + 4u * jq, dg);
    w4set4(tp.z + tp.d + 4u * jq, db);
}

// col_sum where the columns, the stride and `y` are multiples of 4.
@compute @workgroup_size(8)
fn col_sum4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let cq = flat8(gid, nwg);
    if (4u * cq >= tp.cols) { return; }
    var acc = vec4<f32>(0.0);
    for (var r = 0u; r < tp.rows; r++) { acc += work4[(tp.y + r * tp.stride) / 4u + cq]; }
    w4set4(tp.z + 4u * cq, acc);
}

// pos_grad where D is a multiple of 4.
@compute @workgroup_size(8)
fn pos_grad4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat8(gid, nwg);
    let dq = tp.d / 4u;
    // The positions from S to the model's context (tp.cols): 0, here rather than by a clear of
    // their own (~0.06 ms a step on lavapipe).
    if (i >= tp.s * dq) {
        if (i < tp.cols * dq) { w4set4(tp.z + 4u * i, vec4<f32>(0.0)); }
        return;
    }
    let p = i / dq;
    let jq = i % dq;
    var acc = vec4<f32>(0.0);
    for (var row = start(p); row < start(p + 1u); row++) { acc += work4[tp.y / 4u + row * dq + jq]; }
    w4set4(tp.z + 4u * i, acc);
}

// A rollout's first token: each row's logits `[rows, V]` (at `y`) from its prompt's (at `z`).
@compute @workgroup_size(64)
fn expand(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_index(gid, nwg);
    if (i >= tp.rows * tp.v) { return; }
    work[tp.y + i] = work[tp.z + prompt_of(i / tp.v) * tp.v + i % tp.v];
}

// A rollout's position i (`i`): rows `0..sampled` were drawn by sample.wgsl, the rest by
// argmax, into ints[i_drawn + r]; ints[i_state + r] is 1 once row r drew <eos> (= V − 1) and
// ints[i_state + rows + r] its tokens so far. Each open row's token goes to its response and, when
// a later position reads it, its sequence; log π of a sampled row's token at 1/inv_t from the
// position's logits (`logits`, `[rows, V]`) to `logp` (`[rows, t]`); a closed row gets <eos>
// and log π 0.
@compute @workgroup_size(64)
fn place(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = flat_index(gid, nwg);
    if (r >= tp.rows) { return; }
    let eos = tp.v - 1u;
    let closed_at = tp.i_state + r;
    let len_at = tp.i_state + tp.rows + r;
    var tok = eos;
    var l = 0.0;
    if (ints[closed_at] == 0u) {
        tok = ints[tp.i_drawn + r];
        if (r < tp.sampled) {
            let base = tp.logits + r * tp.v;
            l = work[base + tok] * tp.inv_t - log_z(base);
        }
        ints[len_at] = ints[len_at] + 1u;
        if (tok == eos) { ints[closed_at] = 1u; }
    }
    ints[tp.i_resp + r * tp.t + tp.i] = tok;
    work[tp.logp + r * tp.t + tp.i] = l;
    if (tp.n + tp.i < tp.s) { ints[tp.i_seq + flat(tp.n + tp.i, r)] = tok; }
}
