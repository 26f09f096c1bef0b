/*
 * Mock CANN: f16 and bf16 <-> f32, exactly as the hardware converts (round to nearest even, NaN
 * kept quiet, overflow to infinity, subnormals exact). Shared by libopapi.so (the operators'
 * loads and stores) and libhccl.so (the collectives' f16/bf16 reductions), so both round alike.
 */
#ifndef ASCEND_MOCK_HALF_H
#define ASCEND_MOCK_HALF_H

#include <stdint.h>
#include <string.h>

static inline float mock_bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint32_t mock_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float mock_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1F;
    uint32_t man = h & 0x3FF;
    if (exp == 0) {
        /* zero or subnormal: man * 2^-24, exact in f32 */
        float v = (float)man * mock_bits_f32(0x33800000u); /* 2^-24 */
        return mock_bits_f32(mock_f32_bits(v) | sign);
    }
    if (exp == 31) {
        return mock_bits_f32(sign | 0x7F800000u | (man << 13));
    }
    return mock_bits_f32(sign | ((exp + 112) << 23) | (man << 13));
}

static inline uint16_t mock_f32_to_f16(float f) {
    uint32_t x = mock_f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t a = x & 0x7FFFFFFFu;
    if (a > 0x7F800000u) { /* NaN: keep it quiet, keep the top payload bits */
        return (uint16_t)(sign | 0x7E00 | ((a >> 13) & 0x3FF));
    }
    if (a >= 0x477FF000u) { /* >= 65520 (halfway past 65504) rounds to infinity; Inf stays Inf */
        return (uint16_t)(sign | 0x7C00);
    }
    if (a < 0x38800000u) { /* below 2^-14: f16 subnormal or zero */
        if (a < 0x33000000u) { /* below 2^-25: rounds to zero */
            return sign;
        }
        uint32_t e = a >> 23;                  /* 102..112 */
        uint32_t m = (a & 0x7FFFFFu) | 0x800000u; /* value = m * 2^(e-150) */
        uint32_t shift = 126 - e;             /* f16 units of 2^-24: m >> shift */
        uint32_t q = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1))) {
            q++;
        }
        return (uint16_t)(sign | q);
    }
    uint32_t h = ((a >> 23) - 112) << 10 | ((a >> 13) & 0x3FF);
    uint32_t rem = a & 0x1FFF;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) {
        h++; /* may carry into the exponent: still correct */
    }
    return (uint16_t)(sign | h);
}

static inline float mock_bf16_to_f32(uint16_t b) {
    return mock_bits_f32((uint32_t)b << 16);
}

static inline uint16_t mock_f32_to_bf16(float f) {
    uint32_t x = mock_f32_bits(f);
    if ((x & 0x7FFFFFFFu) > 0x7F800000u) {
        return (uint16_t)((x >> 16) | 0x40); /* quiet NaN */
    }
    x += 0x7FFFu + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

#endif /* ASCEND_MOCK_HALF_H */
