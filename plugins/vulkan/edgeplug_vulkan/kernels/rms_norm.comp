// et_vk.rms_norm for the Vulkan backend: GLSL 450, compiled to SPIR-V by glslang and spirv-opt -O.
//
// glsl_source() in rms_norm.py puts "#version 450" and these defines in front:
//   WG         invocations per workgroup (a power of two)
//   T          invocations per row (a power of two dividing WG); WG / T rows per workgroup
//   ITEMS      16-byte units of its row each invocation keeps in registers (0..16; 0: read twice)
//   HALF       1: fp16 storage, 8 halves packed in a uvec4; 0: fp32, a vec4
//   SUBGROUP   1: reduce with subgroup shuffles; 0: a tree in shared memory
//   STRAIGHT   1: load the registers without branches, the weight with x (WorkgroupShape.straight_loads)
// The buffer layout and parameter block are edgeplug.runtime.rms_norm's; the
// algorithm is the WebGPU plugin's WGSL kernel, line for line.

#if SUBGROUP
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#endif

layout(local_size_x = WG, local_size_y = 1, local_size_z = 1) in;

#if HALF
#define UNIT uvec4
#else
#define UNIT vec4
#endif

layout(std430, set = 0, binding = 0) readonly buffer XBuffer { UNIT x[]; };
layout(std430, set = 0, binding = 1) readonly buffer WBuffer { UNIT w[]; };
layout(std430, set = 0, binding = 2) buffer YBuffer { UNIT y[]; };
layout(std140, set = 0, binding = 3) uniform Params {
    uint rows;
    uint units;
    float n;
    float eps;
} p;

shared float partial[WG];

#if HALF
float sum_sq(UNIT u) {
    vec2 a = unpackHalf2x16(u.x), b = unpackHalf2x16(u.y), c = unpackHalf2x16(u.z), d = unpackHalf2x16(u.w);
    return dot(a, a) + dot(b, b) + dot(c, c) + dot(d, d);
}
UNIT scaled(UNIT u, UNIT g, float s) {
    return UNIT(
        packHalf2x16(unpackHalf2x16(u.x) * s * unpackHalf2x16(g.x)),
        packHalf2x16(unpackHalf2x16(u.y) * s * unpackHalf2x16(g.y)),
        packHalf2x16(unpackHalf2x16(u.z) * s * unpackHalf2x16(g.z)),
        packHalf2x16(unpackHalf2x16(u.w) * s * unpackHalf2x16(g.w)));
}
#else
float sum_sq(UNIT u) { return dot(u, u); }
UNIT scaled(UNIT u, UNIT g, float s) { return u * s * g; }
#endif

// unit k of this invocation's part of the row: loaded into v<k>, summed, scaled and stored
#if STRAIGHT
// few units: every load without a branch, the weight's (g<k>) with x's, addresses clamped into
// the buffers and units past the row zeroed, so all of an invocation's loads are in flight at once
#define LOAD(k) uint i##k = t + k * uint(T); UNIT v##k = mix(UNIT(0), x[min(base + i##k, last)], bvec4(valid && i##k < p.units)); UNIT g##k = w[min(i##k, p.units - 1u)]; acc += sum_sq(v##k);
#define STORE(k) if (i##k < p.units) { y[base + i##k] = scaled(v##k, g##k, scale); }
#else
#define LOAD(k) uint i##k = t + k * uint(T); UNIT v##k = (valid && i##k < p.units) ? x[base + i##k] : UNIT(0); acc += sum_sq(v##k);
#define STORE(k) if (i##k < p.units) { y[base + i##k] = scaled(v##k, w[i##k], scale); }
#endif

void main() {
    // workgroups past the per-dimension dispatch limit arrive in gl_WorkGroupID.y
    uint group = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    uint lid = gl_LocalInvocationIndex;
    uint t = lid % uint(T);
    uint row = group * uint(WG / T) + lid / uint(T);
    // no early return: every invocation must reach the barriers
    bool valid = row < p.rows;
    uint base = row * p.units;
    uint last = p.rows * p.units - 1u;  // x's last unit: where straight loads clamp to
    // the register-cached part, one named variable per unit (a local array would go to local memory)
    float acc = 0.0;
#if ITEMS > 0
    LOAD(0)
#endif
#if ITEMS > 1
    LOAD(1)
#endif
#if ITEMS > 2
    LOAD(2)
#endif
#if ITEMS > 3
    LOAD(3)
#endif
#if ITEMS > 4
    LOAD(4)
#endif
#if ITEMS > 5
    LOAD(5)
#endif
#if ITEMS > 6
    LOAD(6)
#endif
#if ITEMS > 7
    LOAD(7)
#endif
#if ITEMS > 8
    LOAD(8)
#endif
#if ITEMS > 9
    LOAD(9)
#endif
#if ITEMS > 10
    LOAD(10)
#endif
#if ITEMS > 11
    LOAD(11)
#endif
#if ITEMS > 12
    LOAD(12)
#endif
#if ITEMS > 13
    LOAD(13)
#endif
#if ITEMS > 14
    LOAD(14)
#endif
#if ITEMS > 15
    LOAD(15)
#endif
    // the part of a row past the registers is read twice
    for (uint i = t + uint(ITEMS * T); valid && i < p.units; i += uint(T)) {
        acc += sum_sq(x[base + i]);
    }
#if SUBGROUP
    // shuffles within a subgroup; a row wider than one subgroup adds its subgroups' sums in
    // shared memory (subgroups are runs of consecutive invocations; the tests check it)
    uint sg = gl_SubgroupSize;
    uint span = min(uint(T), sg);
    for (uint off = 1u; off < span; off <<= 1) {
        acc += subgroupShuffleXor(acc, off);
    }
    if (uint(T) > sg) {
        if (gl_SubgroupInvocationID == 0u) {
            partial[lid / sg] = acc;
        }
        memoryBarrierShared();
        barrier();
        uint per = uint(T) / sg;
        uint first = (lid / uint(T)) * per;
        acc = 0.0;
        for (uint j = 0u; j < per; ++j) {
            acc += partial[first + j];
        }
    }
#else
    partial[lid] = acc;
    memoryBarrierShared();
    barrier();
    for (uint s = uint(T) / 2u; s > 0u; s >>= 1) {
        if (t < s) {
            partial[lid] += partial[lid + s];
        }
        memoryBarrierShared();
        barrier();
    }
    acc = partial[lid - t];
#endif
    float scale = inversesqrt(acc / p.n + p.eps);
    if (valid) {
#if ITEMS > 0
        STORE(0)
#endif
#if ITEMS > 1
        STORE(1)
#endif
#if ITEMS > 2
        STORE(2)
#endif
#if ITEMS > 3
        STORE(3)
#endif
#if ITEMS > 4
        STORE(4)
#endif
#if ITEMS > 5
        STORE(5)
#endif
#if ITEMS > 6
        STORE(6)
#endif
#if ITEMS > 7
        STORE(7)
#endif
#if ITEMS > 8
        STORE(8)
#endif
#if ITEMS > 9
        STORE(9)
#endif
#if ITEMS > 10
        STORE(10)
#endif
#if ITEMS > 11
        STORE(11)
#endif
#if ITEMS > 12
        STORE(12)
#endif
#if ITEMS > 13
        STORE(13)
#endif
#if ITEMS > 14
        STORE(14)
#endif
#if ITEMS > 15
        STORE(15)
#endif
        for (uint i = t + uint(ITEMS * T); i < p.units; i += uint(T)) {
            y[base + i] = scaled(x[base + i], w[i], scale);
        }
    }
}
