// Shared by every kernel (prepended to each file by gpu::kernels).

// PCG-RXS-M-XS 32-bit hash (Jarzynski & Olano 2020); same as rng::pcg_hash.
fn pcg_hash(v: u32) -> u32 {
    let state = v * 747796405u + 2891336453u;
    let word = ((state >> ((state >> 28u) + 4u)) ^ state) * 277803737u;
    return (word >> 22u) ^ word;
}

// Invocation index for 1-D work spread over a 2-D grid of 64-wide workgroups.
fn flat_index(gid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return gid.x + gid.y * nwg.x * 64u;
}
