// attnlab's CPU attention kernel: float32 or bfloat16, on PyTorch's oneDNN micro-GEMM (at::native::cpublas::brgemm).
//
// It computes what attnlab.exact.tiles.plain_forward / plain_backward compute (the formula
// softmax(q k^T * scale + bias, masked) v; a row that may see no key gives out = 0 and
// lse = -inf, and zero gradients), and attnlab/exact/native.py checks it against the float64
// formula at first use. Forward: FlashAttention's online softmax over the key tiles a query
// block may see. Backward: the five products of FlashAttention-2's backward per tile, given
// the rows' global out and lse (the contract of attnlab.exact.tiles.attend_block_backward).
//
// Shape legend, as in the Python: B batch, H query heads, Hkv key/value heads, G = H / Hkv
// (query head h reads key/value head h / G), N queries, M keys, D head dim, Dv value head dim,
// BQ x BK one tile (query rows x keys), nqb = ceil(N / BQ), nkb = ceil(M / BK).
//
// Which keys a query row may see (every part optional; the parts are ANDed):
//   lo, hi  int32 (Bi, N), Bi in {1, B}: the row's key interval [lo, hi) (values are clamped to [0, M]);
//   tiles   int32 (Bt, Ht, nqb, nkb), Bt in {1, B}, Ht in {1, H}: -1 FULL (the interval says all),
//           -2 EMPTY (skipped), k >= 0: bit tile k of bits;
//   bits    uint8 (P, BQ, BK / 8): bit (j % 8) of byte j / 8 of row i says whether row i of the tile
//           may see key j of the tile;
//   dense   uint8 (B, H, N, M), any strides: an explicit boolean mask (attend_block's tile_mask);
//   bias    float32 (B, H, N, M), any strides: an additive score bias;
//   rel     float32 (1|H, N + M - 1): a bias of the relative position alone (ALiBi, T5 buckets), key j of
//           query row i reading rel[h][(N - 1) - i + j] (its gradient is the backward's fourth output).
// q, k, v, out, dout are (B, H|Hkv, N|M, D|Dv) with any strides whose last one is 1, all float32 or all
// bfloat16. In bfloat16 every product reads bfloat16 operands and accumulates in float32 (oneDNN's bf16 brgemm,
// whose B operand is in VNNI layout: the pairs along the product's K dimension interleaved, so D, Dv and the
// products' key and row counts are even, zero-padded); scores, softmax, lse and the gradient accumulators stay
// float32, P and dS are rounded to bfloat16 for the products that read them, out, dq, dk, dv come back bfloat16.
//
// Every sum runs in an order fixed by the shapes alone (never by the thread count), so one
// and two threads give bit-identical results. Built with -DATTNLAB_NATIVE_DEBUG, every
// buffer access of the loops is bounds-checked (NA_CHECK).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/native/CPUBlas.h>
#include <torch/library.h>

#if defined(__AVX512F__)
#include <immintrin.h>
#else
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#if defined(CPU_CAPABILITY_AVX2) && !(defined(__AVX2__) && defined(__FMA__) && defined(__F16C__))
#error "CPU_CAPABILITY_AVX2 needs a build that targets AVX2, FMA and F16C"
#endif
#endif

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#ifndef CPUBLAS_BRGEMM_F32F32F32
#error "this torch has no float32 cpublas::brgemm (CPUBLAS_BRGEMM_F32F32F32 is not defined)"
#endif

#ifdef ATTNLAB_NATIVE_DEBUG
#define NA_CHECK(cond) TORCH_CHECK((cond), "attnlab native kernel: bounds check failed: " #cond)
#else
#define NA_CHECK(cond) ((void)0)
#endif

namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int32_t kFull = -1;
constexpr int32_t kEmpty = -2;

using bf16 = at::BFloat16;
template <typename T>
constexpr bool kBf16 = std::is_same_v<T, bf16>;
//: elements per column of a B operand: a bfloat16 one is in VNNI layout, two rows of K per column
template <typename T>
constexpr int64_t kVnni = kBf16<T> ? 2 : 1;

// 2^x for x <= about 0.5, 0 below -126: a degree-6 polynomial on the remainder of x rounded to an
// integer (max relative error 1.1e-7), written without branches so that loops over it vectorize.
inline float exp2_neg(float x) {
  const float xc = x < -127.f ? -127.f : x;
  const float t = xc + 12582912.f;  // 1.5 * 2^23: the integer nearest xc lands in the low mantissa bits
  const float n = t - 12582912.f;
  const float f = xc - n;  // [-0.5, 0.5]
  float p = 1.546974090160802e-4f;
  p = p * f + 1.3400441966950893e-3f;
  p = p * f + 9.61802527308464e-3f;
  p = p * f + 5.550327152013779e-2f;
  p = p * f + 0.24022650718688965f;
  p = p * f + 0.6931471824645996f;
  p = p * f + 1.0f;
  const int32_t e = std::bit_cast<int32_t>(t) - 0x4B400000;  // n as an integer
  const float s = std::bit_cast<float>((e + 127) << 23);
  return x < -126.f ? 0.f : p * s;
}

// Row reductions and the exponent pass of one tile row: AVX-512 intrinsics where the compiler targets it
// (kept there: at::vec's 512-bit Vectorized was slower in a trial), else at::vec (GCC turns plain loops'
// reductions into a sequential chain of scalar adds).
#if defined(__AVX512F__)
inline __m512 exp2_neg16(__m512 x) {
  const __m512 xc = _mm512_max_ps(_mm512_set1_ps(-127.f), x);  // a NaN x stays NaN (max_ps returns its second)
  const __m512 t = _mm512_add_ps(xc, _mm512_set1_ps(12582912.f));
  const __m512 f = _mm512_sub_ps(xc, _mm512_sub_ps(t, _mm512_set1_ps(12582912.f)));
  __m512 p = _mm512_set1_ps(1.546974090160802e-4f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3400441966950893e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.61802527308464e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550327152013779e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.24022650718688965f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.6931471824645996f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  const __m512i e = _mm512_sub_epi32(_mm512_castps_si512(t), _mm512_set1_epi32(0x4B400000));
  const __m512 sc = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(e, _mm512_set1_epi32(127)), 23));
  const __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-126.f), _CMP_NLT_UQ);  // NaN is live: stays NaN
  return _mm512_maskz_mul_ps(live, p, sc);
}

inline __mmask16 tail_mask(int64_t n) { return static_cast<__mmask16>((1u << n) - 1u); }

// max of s[a, e) (a < e); NaN when one of them is NaN (as torch.amax)
inline float row_max(const float* s, int64_t a, int64_t e) {
  __m512 acc = _mm512_set1_ps(kNegInf);
  __mmask16 nan = 0;
  int64_t j = a;
  for (; j + 16 <= e; j += 16) {
    const __m512 x = _mm512_loadu_ps(s + j);
    nan |= _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    acc = _mm512_max_ps(acc, x);
  }
  if (j < e) {
    const __m512 x = _mm512_maskz_loadu_ps(tail_mask(e - j), s + j);
    nan |= _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    acc = _mm512_mask_max_ps(acc, tail_mask(e - j), acc, x);
  }
  return nan ? std::numeric_limits<float>::quiet_NaN() : _mm512_reduce_max_ps(acc);
}

// min of s[a, e) (a < e); NaN when one of them is NaN
inline float row_min(const float* s, int64_t a, int64_t e) {
  __m512 acc = _mm512_set1_ps(-kNegInf);
  __mmask16 nan = 0;
  int64_t j = a;
  for (; j + 16 <= e; j += 16) {
    const __m512 x = _mm512_loadu_ps(s + j);
    nan |= _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    acc = _mm512_min_ps(acc, x);
  }
  if (j < e) {
    const __m512 x = _mm512_maskz_loadu_ps(tail_mask(e - j), s + j);
    nan |= _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    acc = _mm512_mask_min_ps(acc, tail_mask(e - j), acc, x);
  }
  return nan ? std::numeric_limits<float>::quiet_NaN() : _mm512_reduce_min_ps(acc);
}

// s[j] = 2^(s[j] * mul - ref) on [a, e), 0 where s[j] * mul is -inf (masked, even when ref is NaN); returns their sum
inline __m512 exp_masked16(__m512 x, __m512 vm, __m512 vr) {
  const __m512 y = _mm512_mul_ps(x, vm);
  const __mmask16 masked = _mm512_cmp_ps_mask(y, _mm512_set1_ps(kNegInf), _CMP_EQ_OQ);
  return _mm512_maskz_mov_ps(static_cast<__mmask16>(~masked), exp2_neg16(_mm512_fmsub_ps(x, vm, vr)));
}

inline float exp_span(float* s, int64_t a, int64_t e, float mul, float ref) {
  const __m512 vm = _mm512_set1_ps(mul), vr = _mm512_set1_ps(ref);
  __m512 acc = _mm512_setzero_ps();
  int64_t j = a;
  for (; j + 16 <= e; j += 16) {
    const __m512 p = exp_masked16(_mm512_loadu_ps(s + j), vm, vr);
    _mm512_storeu_ps(s + j, p);
    acc = _mm512_add_ps(acc, p);
  }
  if (j < e) {
    const __mmask16 m = tail_mask(e - j);
    const __m512 p = _mm512_maskz_mov_ps(m, exp_masked16(_mm512_maskz_loadu_ps(m, s + j), vm, vr));
    _mm512_mask_storeu_ps(s + j, m, p);
    acc = _mm512_add_ps(acc, p);
  }
  return _mm512_reduce_add_ps(acc);
}
#else
// The same three on at::vec::Vectorized<float>: 8 lanes of AVX2 where the build defines CPU_CAPABILITY_AVX2
// (native_build.py does for ATTNLAB_NATIVE_ISA=avx2 and on AVX2 CPUs without AVX-512), else at::vec's
// portable default. Each is the AVX-512 function above lane for lane: maximum / minimum propagate NaN,
// a tail's missing lanes are the reduction's identity (or 0 in the sum), and the reductions over the
// lanes run in a fixed order.
using Vec = at::vec::Vectorized<float>;
using VecI = at::vec::Vectorized<int32_t>;
constexpr int64_t kLanes = Vec::size();

inline Vec exp2_neg_vec(Vec x) {
  const Vec xc = at::vec::maximum(x, Vec(-127.f));  // a NaN x stays NaN (maximum propagates it)
  const Vec t = xc + Vec(12582912.f);
  const Vec n = t - Vec(12582912.f);
  const Vec f = xc - n;
  Vec p(1.546974090160802e-4f);
  p = at::vec::fmadd(p, f, Vec(1.3400441966950893e-3f));
  p = at::vec::fmadd(p, f, Vec(9.61802527308464e-3f));
  p = at::vec::fmadd(p, f, Vec(5.550327152013779e-2f));
  p = at::vec::fmadd(p, f, Vec(0.24022650718688965f));
  p = at::vec::fmadd(p, f, Vec(0.6931471824645996f));
  p = at::vec::fmadd(p, f, Vec(1.0f));
  // n as an integer from t's bits, as in exp2_neg (a NaN's garbage scale leaves p * sc NaN); the casts
  // reinterpret the bits, and GCC compiles them to nothing
  const VecI e = at::vec::cast<int32_t>(t) - VecI(0x4B400000);
  const Vec sc = at::vec::cast<float>((e + VecI(127)) << VecI(23));
  return Vec::blendv(p * sc, Vec(0.f), x < Vec(-126.f));  // ordered compare: a NaN x is live, stays NaN
}

// max of s[a, e) (a < e); NaN when one of them is NaN (as torch.amax)
inline float row_max(const float* s, int64_t a, int64_t e) {
  Vec acc(kNegInf);
  int64_t j = a;
  for (; j + kLanes <= e; j += kLanes) acc = at::vec::maximum(acc, Vec::loadu(s + j));
  if (j < e) acc = at::vec::maximum(acc, Vec::set(Vec(kNegInf), Vec::loadu(s + j, e - j), e - j));
  return at::vec::vec_reduce_all([](const Vec& x, const Vec& y) { return at::vec::maximum(x, y); }, acc);
}

// min of s[a, e) (a < e); NaN when one of them is NaN
inline float row_min(const float* s, int64_t a, int64_t e) {
  Vec acc(-kNegInf);
  int64_t j = a;
  for (; j + kLanes <= e; j += kLanes) acc = at::vec::minimum(acc, Vec::loadu(s + j));
  if (j < e) acc = at::vec::minimum(acc, Vec::set(Vec(-kNegInf), Vec::loadu(s + j, e - j), e - j));
  return at::vec::vec_reduce_all([](const Vec& x, const Vec& y) { return at::vec::minimum(x, y); }, acc);
}

// s[j] = 2^(s[j] * mul - ref) on [a, e), 0 where s[j] * mul is -inf (masked, even when ref is NaN); returns their sum
inline Vec exp_masked_vec(Vec x, Vec vm, Vec vr) {
  return Vec::blendv(exp2_neg_vec(at::vec::fmsub(x, vm, vr)), Vec(0.f), x * vm == Vec(kNegInf));
}

inline float exp_span(float* s, int64_t a, int64_t e, float mul, float ref) {
  const Vec vm(mul), vr(ref);
  Vec acc(0.f);
  int64_t j = a;
  for (; j + kLanes <= e; j += kLanes) {
    const Vec p = exp_masked_vec(Vec::loadu(s + j), vm, vr);
    p.store(s + j);
    acc = acc + p;
  }
  if (j < e) {
    const Vec p = Vec::set(Vec(0.f), exp_masked_vec(Vec::loadu(s + j, e - j), vm, vr), e - j);
    p.store(s + j, e - j);
    acc = acc + p;
  }
  return at::vec::vec_reduce_all([](const Vec& x, const Vec& y) { return x + y; }, acc);
}
#endif

// float32 -> bfloat16, rounded to nearest even (NaN stays NaN): dst[j] = src[j] on [0, n), and the
// interleave of two rows into one VNNI row pair, dst[2 j] = r0[j], dst[2 j + 1] = r1[j] (r1 null: zeros).
#if defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__AVX512VL__)
constexpr bool kNativeBf16 = true;

inline __m256i cvt16(const float* src, __mmask16 m) {
  return reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, src)));
}

inline void to_bf16(const float* src, bf16* dst, int64_t n) {
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + j), cvt16(src + j, 0xFFFF));
  if (j < n) _mm256_mask_storeu_epi16(dst + j, tail_mask(n - j), cvt16(src + j, tail_mask(n - j)));
}

// 32 bf16 from two rows' 16: a[0] b[0] a[1] b[1] ...
inline __m512i pair_bf16(__m256i a, __m256i b) {
  alignas(64) static constexpr int16_t kIdx[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                                   8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  return _mm512_permutexvar_epi16(_mm512_load_si512(kIdx), _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1));
}

inline void interleave_bf16(const float* r0, const float* r1, bf16* dst, int64_t n) {
  for (int64_t j = 0; j < n; j += 16) {  // 16 columns of both rows: 32 bf16 out
    const __mmask16 m = n - j >= 16 ? static_cast<__mmask16>(0xFFFF) : tail_mask(n - j);
    const __m512i ab = pair_bf16(cvt16(r0 + j, m), r1 ? cvt16(r1 + j, m) : _mm256_setzero_si256());
    if (n - j >= 16) {
      _mm512_storeu_si512(dst + 2 * j, ab);
    } else {
      _mm512_mask_storeu_epi16(dst + 2 * j, (1u << (2 * (n - j))) - 1u, ab);
    }
  }
}
#else
constexpr bool kNativeBf16 = false;

inline void to_bf16(const float* src, bf16* dst, int64_t n) {
  for (int64_t j = 0; j < n; ++j) dst[j] = static_cast<bf16>(src[j]);  // c10: round to nearest even
}

inline void interleave_bf16(const float* r0, const float* r1, bf16* dst, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    dst[2 * j] = static_cast<bf16>(r0[j]);
    dst[2 * j + 1] = r1 ? static_cast<bf16>(r1[j]) : bf16(0.f);
  }
}
#endif

// The backward's score gradient of a row pair, fused with its bfloat16 operands: on [0, n),
// ds_r = p_r (dp_r - delta_r) * scale in float32 (0 where p_r is 0: a NaN delta stays out), then P and dS
// interleaved as a VNNI row pair (p2, ds2: 2 n each) and dS's rows as they are (o0, o1), rounded as to_bf16
// rounds. Row 1 null (p1, d1, o1): a zero row. The same values as the three separate passes. Only where the
// CPU converts to bfloat16 itself (kNativeBf16): elsewhere the kernel does not serve bfloat16.
#if defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__AVX512VL__)
inline void ds_pair_bf16(const float* p0, const float* p1, const float* d0, const float* d1, float dl0, float dl1,
                         float scale, bf16* p2, bf16* ds2, bf16* o0, bf16* o1, int64_t n) {
  const __m512 vs = _mm512_set1_ps(scale), vd0 = _mm512_set1_ps(dl0), vd1 = _mm512_set1_ps(dl1);
  const __m512 zero = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = n - j >= 16 ? static_cast<__mmask16>(0xFFFF) : tail_mask(n - j);
    const __m512 a0 = _mm512_maskz_loadu_ps(m, p0 + j);
    const __m512 a1 = p1 ? _mm512_maskz_loadu_ps(m, p1 + j) : zero;
    const __mmask16 l0 = _mm512_cmp_ps_mask(a0, zero, _CMP_NEQ_UQ), l1 = _mm512_cmp_ps_mask(a1, zero, _CMP_NEQ_UQ);
    const __m512 g0 = _mm512_maskz_mul_ps(l0, _mm512_mul_ps(a0, _mm512_sub_ps(_mm512_maskz_loadu_ps(m, d0 + j), vd0)), vs);
    const __m512 g1 = p1 ? _mm512_maskz_mul_ps(l1, _mm512_mul_ps(a1, _mm512_sub_ps(_mm512_maskz_loadu_ps(m, d1 + j), vd1)), vs)
                         : zero;
    const __m256i b0 = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(g0));
    const __m256i b1 = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(g1));
    const __m512i pp = pair_bf16(reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(a0)),
                                 reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(a1)));
    const __m512i dd = pair_bf16(b0, b1);
    if (n - j >= 16) {
      _mm512_storeu_si512(p2 + 2 * j, pp);
      _mm512_storeu_si512(ds2 + 2 * j, dd);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o0 + j), b0);
      if (o1) _mm256_storeu_si256(reinterpret_cast<__m256i*>(o1 + j), b1);
    } else {
      const __mmask32 m2 = (1u << (2 * (n - j))) - 1u;
      _mm512_mask_storeu_epi16(p2 + 2 * j, m2, pp);
      _mm512_mask_storeu_epi16(ds2 + 2 * j, m2, dd);
      _mm256_mask_storeu_epi16(o0 + j, m, b0);
      if (o1) _mm256_mask_storeu_epi16(o1 + j, m, b1);
    }
  }
}
#endif

// A strided (b, h, row) view of a 4-D float32 or bfloat16 tensor whose last dimension is contiguous.
template <typename T>
struct View {
  T* p = nullptr;
  int64_t sb = 0, sh = 0, sr = 0, rows = 0, heads = 0, batch = 0, cols = 0;
  T* row(int64_t b, int64_t h, int64_t r) const {
    NA_CHECK(b >= 0 && b < batch && h >= 0 && h < heads && r >= 0 && r < rows);
    return p + b * sb + h * sh + r * sr;
  }
};

template <typename T>
View<T> view_of(const at::Tensor& t) {
  View<T> v;
  v.p = t.data_ptr<T>();
  v.sb = t.stride(0);
  v.sh = t.stride(1);
  v.sr = t.stride(2);
  v.batch = t.size(0);
  v.heads = t.size(1);
  v.rows = t.size(2);
  v.cols = t.size(3);
  return v;
}

// What a call may see, as raw pointers and strides (see the header comment).
struct Masking {
  const int32_t* lo = nullptr;
  const int32_t* hi = nullptr;
  int64_t iv_sb = 0;
  const int32_t* tiles = nullptr;
  int64_t t_sb = 0, t_sh = 0, t_sq = 0;
  const uint8_t* bits = nullptr;
  int64_t n_bits = 0;
  const uint8_t* dense = nullptr;
  int64_t d_sb = 0, d_sh = 0, d_si = 0, d_sj = 0;
  const float* bias = nullptr;  // a bias tensor, or the relative table read with b_si = -1, b_sj = 1
  int64_t b_sb = 0, b_sh = 0, b_si = 0, b_sj = 0;
  int64_t rel_heads = 0;  // rows of the relative table (0: none)
};

struct Shape {
  int64_t B, H, Hkv, G, N, M, D, Dv, BQ, BK, nqb, nkb;
  float scale;
};

// One run of rows of a tile computed by one product: rows [g0, g1), tile columns [c0, c0 + w)
// (w a multiple of 16, or the whole tile), of which the first wk are keys < M.
struct Group {
  int64_t g0, g1, c0, w, wk;
};

// Which columns of the tile each row may see by its interval: [a[i], e[i]) (a >= e: none).
// Returns false when no row of the block sees a key of this tile.
bool tile_spans(const int32_t* lo, const int32_t* hi, int64_t nr, int64_t k0, int64_t k1, int32_t* a,
                int32_t* e) {
  bool any = false;
  for (int64_t i = 0; i < nr; ++i) {
    a[i] = static_cast<int32_t>(std::max<int64_t>(lo[i], k0) - k0);
    e[i] = static_cast<int32_t>(std::min<int64_t>(hi[i], k1) - k0);
    any = any || a[i] < e[i];
  }
  return any;
}

// Split the tile's rows into 1, 2 or 4 runs, each computing only the columns its rows may see
// (the upper half of a causal diagonal tile is skipped this way), at the fewest computed elements
// (one product costs about 256 elements more). even: every run's first row and column even (bfloat16: the
// runs' keys, and in the backward their rows, are the K dimension of a VNNI product, read in pairs).
int64_t plan_groups(const int32_t* a, const int32_t* e, int64_t nr, int64_t BK, int64_t kcols, Group* out,
                    bool even = false) {
  int64_t best_cost = std::numeric_limits<int64_t>::max(), best_n = 0;
  Group cand[4], best[4];
  for (int64_t ng : {1, 2, 4}) {
    if (ng > 1 && nr < 8 * ng) break;
    int64_t cost = 0, n = 0;
    for (int64_t g = 0; g < ng; ++g) {
      const int64_t g0 = even ? nr * g / ng / 2 * 2 : nr * g / ng;
      const int64_t g1 = g + 1 == ng ? nr : (even ? nr * (g + 1) / ng / 2 * 2 : nr * (g + 1) / ng);
      int64_t ca = BK, ce = 0;
      for (int64_t i = g0; i < g1; ++i) {
        if (a[i] < e[i]) {
          ca = std::min<int64_t>(ca, a[i]);
          ce = std::max<int64_t>(ce, e[i]);
        }
      }
      if (ca >= ce) continue;  // no row of this run sees the tile
      if (even) ca = ca / 2 * 2;  // c0 below is then even too (BK and w are multiples of 16)
      const int64_t w = std::min<int64_t>(BK, (ce - ca + 15) / 16 * 16);
      const int64_t c0 = std::min<int64_t>(ca, BK - w);
      cand[n++] = Group{g0, g1, c0, w, std::min<int64_t>(w, kcols - c0)};
      cost += (g1 - g0) * w + 256;
    }
    if (cost < best_cost) {
      best_cost = cost;
      best_n = n;
      std::copy(cand, cand + n, best);
    }
  }
  std::copy(best, best + best_n, out);
  return best_n;
}

// The scores of one tile row in the log2 domain, (s[j] * scale + bias) * log2(e) on the columns
// [a, e) its interval allows, and the row's maximum (-inf: the row sees nothing here). In a tile
// without a bias, bit tile or dense mask ("plain") the scores stay unscaled in s (the exponent pass
// scales them: mul = scale * log2(e)); otherwise s holds them scaled, -inf where masked (mul = 1).
float row_logits(float* s, int64_t a, int64_t e, float cs, const float* bias, int64_t bsj, const uint8_t* bits,
                 const uint8_t* dense, int64_t dsj) {
  if (a >= e) return kNegInf;
  if (bias == nullptr && bits == nullptr && dense == nullptr) {  // the maximum of s * cs: of s, or its minimum when cs < 0
    return (cs >= 0.f ? row_max(s, a, e) : row_min(s, a, e)) * cs;
  }
  if (bias != nullptr) {
    for (int64_t j = a; j < e; ++j) s[j] = s[j] * cs + bias[j * bsj] * kLog2e;
  } else {
    for (int64_t j = a; j < e; ++j) s[j] *= cs;
  }
  if (bits != nullptr) {
    for (int64_t j = a; j < e; ++j) s[j] = ((bits[j >> 3] >> (j & 7)) & 1) ? s[j] : kNegInf;
  }
  if (dense != nullptr) {
    for (int64_t j = a; j < e; ++j) s[j] = dense[j * dsj] ? s[j] : kNegInf;
  }
  return row_max(s, a, e);
}

// p = 2^(s * mul - ref) on [a, e) in place, 0 on the rest of [c0, c1); returns the sum.
float row_exp(float* s, int64_t c0, int64_t c1, int64_t a, int64_t e, float mul, float ref) {
  if (a >= e) {
    std::fill(s + c0, s + c1, 0.f);
    return 0.f;
  }
  NA_CHECK(c0 <= a && e <= c1);
  std::fill(s + c0, s + a, 0.f);
  std::fill(s + e, s + c1, 0.f);
  return exp_span(s, a, e, mul, ref);
}

// bfloat16: row_exp with P written to dst in bfloat16 on [c0, c1) (s is left as scratch); the same sum, of
// the float32 values before rounding. With avx512_bf16 the exponent and the rounding are one pass.
float row_exp_bf16(float* s, bf16* dst, int64_t c0, int64_t c1, int64_t a, int64_t e, float mul, float ref) {
#if defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__AVX512VL__)
  if (a >= e) {
    std::fill(dst + c0, dst + c1, bf16(0.f));
    return 0.f;
  }
  NA_CHECK(c0 <= a && e <= c1);
  std::fill(dst + c0, dst + a, bf16(0.f));
  std::fill(dst + e, dst + c1, bf16(0.f));
  const __m512 vm = _mm512_set1_ps(mul), vr = _mm512_set1_ps(ref);
  __m512 acc = _mm512_setzero_ps();
  for (int64_t j = a; j < e; j += 16) {
    const __mmask16 m = e - j >= 16 ? static_cast<__mmask16>(0xFFFF) : tail_mask(e - j);
    const __m512 p = _mm512_maskz_mov_ps(m, exp_masked16(_mm512_maskz_loadu_ps(m, s + j), vm, vr));
    _mm256_mask_storeu_epi16(dst + j, m, reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(p)));
    acc = _mm512_add_ps(acc, p);
  }
  return _mm512_reduce_add_ps(acc);
#else
  const float sum = row_exp(s, c0, c1, a, e, mul, ref);
  to_bf16(s + c0, dst + c0, c1 - c0);
  return sum;
#endif
}

// Everything one call shares but its tensors: sizes and the mask.
struct Call {
  Shape sh;
  Masking mk;

  int32_t tile(int64_t b, int64_t h, int64_t qb, int64_t kb) const {
    if (mk.tiles == nullptr) return kFull;
    const int32_t t = mk.tiles[b * mk.t_sb + h * mk.t_sh + qb * mk.t_sq + kb];
    NA_CHECK(t == kFull || t == kEmpty || (t >= 0 && t < mk.n_bits));
    return t;
  }
  const uint8_t* bit_tile(int32_t t) const {
    return t >= 0 ? mk.bits + static_cast<int64_t>(t) * sh.BQ * (sh.BK / 8) : nullptr;
  }
  // the key intervals of rows r0 .. r0 + nr - 1 of batch b, clamped to [0, M]
  void intervals(int64_t b, int64_t r0, int64_t nr, int32_t* lo, int32_t* hi) const {
    const int64_t M = sh.M;
    for (int64_t i = 0; i < nr; ++i) {
      NA_CHECK(r0 + i < sh.N);
      const int64_t l = mk.lo ? mk.lo[b * mk.iv_sb + r0 + i] : 0;
      const int64_t h = mk.hi ? mk.hi[b * mk.iv_sb + r0 + i] : M;
      lo[i] = static_cast<int32_t>(std::clamp<int64_t>(l, 0, M));
      hi[i] = static_cast<int32_t>(std::clamp<int64_t>(h, 0, M));
    }
  }
  // row_logits of row r (tile row ri) of head h on the tile at key k0 (its columns [a, e))
  float logits(float* s, int64_t b, int64_t h, int64_t r, int64_t ri, int64_t k0, int64_t a, int64_t e,
               const uint8_t* bt) const {
    const float* bias = mk.bias ? mk.bias + b * mk.b_sb + h * mk.b_sh + r * mk.b_si + k0 * mk.b_sj : nullptr;
    const uint8_t* dense = mk.dense ? mk.dense + b * mk.d_sb + h * mk.d_sh + r * mk.d_si + k0 * mk.d_sj : nullptr;
    const uint8_t* bits = bt ? bt + ri * (sh.BK / 8) : nullptr;
    return row_logits(s, a, e, sh.scale * kLog2e, bias, mk.b_sj, bits, dense, mk.d_sj);
  }
  // a tile with no bias, bit tile or dense mask: row_logits leaves s as it is and only takes the maximum
  bool plain(const uint8_t* bt) const { return mk.bias == nullptr && mk.dense == nullptr && bt == nullptr; }
  // the exponent pass's multiplier for a tile (see row_logits)
  float mul(const uint8_t* bt) const { return plain(bt) ? sh.scale * kLog2e : 1.f; }
};

// ... and its q, k, v.
template <typename T>
struct CallT : Call {
  View<T> q, k, v;
};

// ---------------------------------------------------------------------------------------------
// forward

// rows [r0, r0 + n) of a (B, H, rows, F) view, transposed into dst (F x ld), columns past n zeroed
// (an A operand: Q^T, dO^T)
template <typename T>
void transpose_rows(const View<T>& x, int64_t b, int64_t h, int64_t r0, int64_t n, int64_t F, int64_t ld, T* dst) {
  for (int64_t i = 0; i < ld; ++i) {
    if (i < n) {
      const T* src = x.row(b, h, r0 + i);
      for (int64_t d = 0; d < F; ++d) dst[d * ld + i] = src[d];
    } else {
      for (int64_t d = 0; d < F; ++d) dst[d * ld + i] = T(0.f);
    }
  }
}

// rows [r0, r0 + n) of a view as the B operand of a product over its F columns (K^T of S = Q K^T, V^T of
// dP = dO V^T), columns past n zeroed: float32 transposed (F x ld); bfloat16 in VNNI layout, column pairs
// (2p, 2p + 1) of each row side by side, dst[(p * ld + i) * 2 + d % 2] (F even).
template <typename T>
void operand_t(const View<T>& x, int64_t b, int64_t h, int64_t r0, int64_t n, int64_t F, int64_t ld, T* dst) {
  if constexpr (!kBf16<T>) {
    transpose_rows(x, b, h, r0, n, F, ld, dst);
  } else {
    NA_CHECK(F % 2 == 0);
    uint32_t* out = reinterpret_cast<uint32_t*>(dst);  // one pair per 32-bit word
    for (int64_t i = 0; i < ld; ++i) {  // row i of the block: its column pairs down column i of the pair rows
      if (i < n) {
        const T* src = x.row(b, h, r0 + i);
        for (int64_t p = 0; p < F / 2; ++p) std::memcpy(out + p * ld + i, src + 2 * p, 4);
      } else {
        for (int64_t p = 0; p < F / 2; ++p) out[p * ld + i] = 0;
      }
    }
  }
}

// rows [r0, r0 + n) of a bfloat16 view as the B operand of a product over the rows (V of O += P V, K of
// dQ += dS K), zero-padded to ld rows (ld even): VNNI layout, rows (2p, 2p + 1) interleaved,
// dst[(p * F + d) * 2 + i % 2].
void operand_rows(const View<bf16>& x, int64_t b, int64_t h, int64_t r0, int64_t n, int64_t F, int64_t ld,
                  bf16* dst) {
  for (int64_t p = 0; p < ld / 2; ++p) {  // one pair of rows
    const bf16* x0 = 2 * p < n ? x.row(b, h, r0 + 2 * p) : nullptr;
    const bf16* x1 = 2 * p + 1 < n ? x.row(b, h, r0 + 2 * p + 1) : nullptr;
    bf16* o = dst + p * F * 2;
    for (int64_t d = 0; d < F; ++d) {  // column d of both rows, side by side
      o[2 * d] = x0 ? x0[d] : bf16(0.f);
      o[2 * d + 1] = x1 ? x1[d] : bf16(0.f);
    }
  }
}

// per key block of every (batch, kv head), zero-padded to BK keys: kt (B, Hkv, nkb, D x BK), K^T as
// operand_t writes it (the B operand of S = Q K^T); bfloat16 also vp (B, Hkv, nkb, BK x Dv) in VNNI
// layout (the B operand of O += P V; float32 reads V in place). kt null: few queries, no keys packed.
template <typename T>
void pack_keys(const CallT<T>& c, T* kt, bf16* vp) {
  const Shape& s = c.sh;
  at::parallel_for(0, s.B * s.Hkv * s.nkb, 1, [&](int64_t u0, int64_t u1) {
    for (int64_t u = u0; u < u1; ++u) {  // one key block of one (batch, kv head)
      const int64_t b = u / (s.Hkv * s.nkb), hk = (u / s.nkb) % s.Hkv, kb = u % s.nkb;
      const int64_t k0 = kb * s.BK, n = std::min(s.BK, s.M - k0);
      if (kt != nullptr) operand_t(c.k, b, hk, k0, n, s.D, s.BK, kt + u * s.D * s.BK);
      if constexpr (kBf16<T>) operand_rows(c.v, b, hk, k0, n, s.Dv, s.BK, vp + u * s.BK * s.Dv);
    }
  });
}

//: at most this many queries: the forward computes S^T = K Q^T from the keys as they are (decoding with a KV
//: cache: transposing every key for a few queries would cost as much as the attention)
constexpr int64_t kFewQueries = 16;

template <typename T>
struct FwdScratch {
  std::vector<float> S, O, m, l, mt, alpha, ST;
  std::vector<T> QT;
  std::vector<bf16> P;  // bfloat16: the tile's P, the A operand of O += P V
  std::vector<int32_t> lo, hi, a, e;
  explicit FwdScratch(const Shape& s)
      : S(s.BQ * s.BK), O(s.BQ * s.Dv), m(s.BQ), l(s.BQ), mt(s.BQ), alpha(s.BQ),
        ST(s.N <= kFewQueries ? s.BK * s.BQ : 0), QT(s.N <= kFewQueries ? s.D * s.BQ : 0),
        P(kBf16<T> ? s.BQ * s.BK : 0), lo(s.BQ), hi(s.BQ), a(s.BQ), e(s.BQ) {}
};

// S = Q K^T on one row run from the keys in place (few queries): S^T = K Q^T (Q^T in w.QT), then transposed
template <typename T>
void scores_few_queries(const CallT<T>& c, FwdScratch<T>& w, const Group& gr, int64_t b, int64_t hk, int64_t k0) {
  const Shape& s = c.sh;
  const int64_t rows = gr.g1 - gr.g0;
  at::native::cpublas::brgemm(gr.wk, rows, s.D, c.k.sr, s.BQ, s.BQ, false, c.k.row(b, hk, k0 + gr.c0),
                              w.QT.data() + gr.g0 * kVnni<T>, w.ST.data(), kBf16<T>);
  for (int64_t j = 0; j < gr.wk; ++j) {  // (wk x rows) -> the run's rows of S, columns c0 ..
    for (int64_t i = 0; i < rows; ++i) w.S[(gr.g0 + i) * s.BK + gr.c0 + j] = w.ST[j * s.BQ + i];
  }
}

// The online softmax on one row run of a tile whose scores are in w.S: P = 2^(s - m) in place, and the
// rows' maxima m, sums l and accumulators O rescaled to the new maxima.
template <typename T>
void softmax_run(const Call& c, FwdScratch<T>& w, const Group& gr, int64_t b, int64_t h, int64_t r0, int64_t k0,
                 int32_t t) {
  const Shape& s = c.sh;
  const uint8_t* bt = c.bit_tile(t);
  const float mul = c.mul(bt);
  for (int64_t i = gr.g0; i < gr.g1; ++i) {  // the rows' maxima on the tile
    w.mt[i] = c.logits(w.S.data() + i * s.BK, b, h, r0 + i, i, k0, w.a[i], w.e[i], bt);
  }
  for (int64_t i = gr.g0; i < gr.g1; ++i) {  // new maxima and the rescale of what was summed (vectorized)
    const float mn = (w.mt[i] > w.m[i] || std::isnan(w.mt[i])) ? w.mt[i] : w.m[i];  // a NaN maximum stays NaN
    w.alpha[i] = mn == kNegInf ? 1.f : exp2_neg(w.m[i] - mn);
    w.m[i] = mn;
  }
  for (int64_t i = gr.g0; i < gr.g1; ++i) {  // P = 2^(s - m), row sums, rescaled accumulators
    float* row = w.S.data() + i * s.BK;
    bf16* prow = kBf16<T> ? w.P.data() + i * s.BK : nullptr;  // bfloat16: P here, P V's A operand
    if (w.mt[i] == kNegInf) {  // nothing of this tile for the row
      if constexpr (kBf16<T>) {
        std::fill(prow + gr.c0, prow + gr.c0 + gr.w, bf16(0.f));
      } else {
        std::fill(row + gr.c0, row + gr.c0 + gr.w, 0.f);
      }
    } else {
      const float sum = kBf16<T> ? row_exp_bf16(row, prow, gr.c0, gr.c0 + gr.w, w.a[i], w.e[i], mul, w.m[i])
                                 : row_exp(row, gr.c0, gr.c0 + gr.w, w.a[i], w.e[i], mul, w.m[i]);
      w.l[i] = w.l[i] * w.alpha[i] + sum;
      if (w.alpha[i] != 1.f) {
        float* o = w.O.data() + i * s.Dv;
        const float al = w.alpha[i];
        for (int64_t d = 0; d < s.Dv; ++d) o[d] *= al;
      }
    }
  }
}

// rows r0 .. r0 + nr - 1 of head h: out = O / l and lse = m + log2(l) (natural log); rows that saw nothing are
// 0 with lse -inf
template <typename T>
void finish_block(const Shape& s, const FwdScratch<T>& w, int64_t b, int64_t h, int64_t r0, int64_t nr,
                  const View<T>& out, float* lse) {
  for (int64_t i = 0; i < nr; ++i) {
    T* o = out.row(b, h, r0 + i);
    const float l = w.l[i];
    if (l != 0.f) {  // l > 0, or NaN: a row that saw a NaN or +inf score is NaN, as in the formula
      const float inv = 1.f / l;
      for (int64_t d = 0; d < s.Dv; ++d) o[d] = static_cast<T>(w.O[i * s.Dv + d] * inv);
      lse[(b * s.H + h) * s.N + r0 + i] = (w.m[i] + std::log2(l)) * kLn2;
    } else {
      std::fill(o, o + s.Dv, T(0.f));
      lse[(b * s.H + h) * s.N + r0 + i] = kNegInf;
    }
  }
}

// One query block (b, h, qb): walk the key tiles its rows may see, online softmax, write out and lse.
// kt, vp: pack_keys's blocks (kt null: few queries, S from the keys in place).
template <typename T>
void forward_block(const CallT<T>& c, const T* kt, const bf16* vp, int64_t b, int64_t h, int64_t qb,
                   FwdScratch<T>& w, const View<T>& out, float* lse) {
  const Shape& s = c.sh;
  const int64_t hk = h / s.G, r0 = qb * s.BQ, nr = std::min(s.BQ, s.N - r0);
  c.intervals(s.B > 1 && c.mk.iv_sb ? b : 0, r0, nr, w.lo.data(), w.hi.data());
  std::fill(w.m.begin(), w.m.end(), kNegInf);
  std::fill(w.l.begin(), w.l.end(), 0.f);
  std::fill(w.O.begin(), w.O.end(), 0.f);
  int64_t qlo = s.M, qhi = 0;
  for (int64_t i = 0; i < nr; ++i) {
    if (w.lo[i] < w.hi[i]) {
      qlo = std::min<int64_t>(qlo, w.lo[i]);
      qhi = std::max<int64_t>(qhi, w.hi[i]);
    }
  }
  if (kt == nullptr) operand_t(c.q, b, h, r0, nr, s.D, s.BQ, w.QT.data());  // few queries: Q^T once
  Group groups[4];
  for (int64_t kb = qlo / s.BK; qlo < qhi && kb <= (qhi - 1) / s.BK; ++kb) {  // the key tiles of the block
    const int32_t t = c.tile(b, h, qb, kb);
    if (t == kEmpty) continue;
    const int64_t k0 = kb * s.BK, k1 = std::min(k0 + s.BK, s.M);
    if (!tile_spans(w.lo.data(), w.hi.data(), nr, k0, k1, w.a.data(), w.e.data())) continue;
    const int64_t ng = plan_groups(w.a.data(), w.e.data(), nr, s.BK, k1 - k0, groups, kBf16<T>);
    const int64_t blk = (b * s.Hkv + hk) * s.nkb + kb;  // the key block's index among pack_keys's
    const T* ktb = kt ? kt + blk * s.D * s.BK : nullptr;
    for (int64_t g = 0; g < ng; ++g) {  // the row runs of the tile
      const Group& gr = groups[g];
      const int64_t rows = gr.g1 - gr.g0;
      float* S = w.S.data() + gr.g0 * s.BK + gr.c0;
      NA_CHECK(gr.c0 >= 0 && gr.c0 + gr.w <= s.BK && gr.g1 <= nr && gr.wk <= gr.w && k0 + gr.c0 + gr.wk <= s.M);
      // S = Q K^T on the run's rows and columns, the softmax, O += P V
      if (kt == nullptr) {
        scores_few_queries(c, w, gr, b, hk, k0);
      } else {
        at::native::cpublas::brgemm(rows, gr.w, s.D, c.q.sr, s.BK, s.BK, false, c.q.row(b, h, r0 + gr.g0),
                                    ktb + gr.c0 * kVnni<T>, S, kBf16<T>);
      }
      softmax_run(c, w, gr, b, h, r0, k0, t);
      if constexpr (kBf16<T>) {  // P (bf16, its keys padded to even with P = 0) times V's VNNI block
        NA_CHECK(gr.c0 % 2 == 0 && gr.c0 + (gr.wk + 1) / 2 * 2 <= s.BK);
        at::native::cpublas::brgemm(rows, s.Dv, (gr.wk + 1) / 2 * 2, s.BK, s.Dv, s.Dv, true,
                                    w.P.data() + gr.g0 * s.BK + gr.c0, vp + blk * s.BK * s.Dv + gr.c0 * s.Dv,
                                    w.O.data() + gr.g0 * s.Dv, true);
      } else {
        at::native::cpublas::brgemm(rows, s.Dv, gr.wk, s.BK, c.v.sr, s.Dv, true, S, c.v.row(b, hk, k0 + gr.c0),
                                    w.O.data() + gr.g0 * s.Dv);
      }
    }
  }
  finish_block(s, w, b, h, r0, nr, out, lse);
}

// Work items handed out one at a time (load balance for causal masks), in an order that does not
// change what any item computes.
// bf16: the worker releases the brgemm hardware state its bfloat16 products set up (AMX tiles) when done.
template <typename Scratch, typename Fn>
void for_each_item(int64_t items, const Shape& s, Fn fn, bool bf16 = false) {
  std::atomic<int64_t> next{0};
  at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
    Scratch w(s);
    for (int64_t u = next.fetch_add(1); u < items; u = next.fetch_add(1)) fn(u, w);
    if (bf16) at::native::cpublas::brgemm_release(true);
  });
}

// ---------------------------------------------------------------------------------------------
// argument checks (the Python checks first and names the argument; these keep bad calls from the loops)

void check_qkv(const at::Tensor& t, const char* name, at::ScalarType dtype) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be a CPU tensor, got ", t.device());
  TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16, name,
              " must be float32 or bfloat16, got ", t.scalar_type());
  TORCH_CHECK(t.scalar_type() == dtype, name, " must be ", dtype, " as q is, got ", t.scalar_type());
  TORCH_CHECK(t.dim() == 4, name, " must be 4-D, got ", t.sizes());
  TORCH_CHECK(dtype != at::kBFloat16 || t.size(3) % 2 == 0, name,
              " must have an even last dimension in bfloat16 (the products read pairs), got ", t.sizes());
  TORCH_CHECK(t.numel() == 0 || ((t.stride(3) == 1 || t.size(3) == 1) && (t.size(2) == 1 || t.stride(2) >= t.size(3))),
              name, " must have a contiguous last dimension and a row stride of at least its size, got strides ",
              t.strides(), " for sizes ", t.sizes());
}

Masking masking(const Shape& s, const std::optional<at::Tensor>& lo, const std::optional<at::Tensor>& hi,
                const std::optional<at::Tensor>& tiles, const std::optional<at::Tensor>& bits,
                const std::optional<at::Tensor>& dense, const std::optional<at::Tensor>& bias,
                const std::optional<at::Tensor>& rel) {
  Masking mk;
  TORCH_CHECK(lo.has_value() == hi.has_value(), "lo and hi come together");
  if (lo.has_value()) {
    for (const at::Tensor* t : {&*lo, &*hi}) {
      TORCH_CHECK(t->scalar_type() == at::kInt && t->dim() == 2 && t->is_contiguous(),
                  "lo/hi must be contiguous int32 (Bi, N), got ", t->scalar_type(), " ", t->sizes());
      TORCH_CHECK((t->size(0) == 1 || t->size(0) == s.B) && t->size(1) == s.N, "lo/hi must be (1|B, N) = (1|", s.B,
                  ", ", s.N, "), got ", t->sizes());
    }
    TORCH_CHECK(lo->sizes() == hi->sizes(), "lo and hi must have one shape");
    mk.lo = lo->data_ptr<int32_t>();
    mk.hi = hi->data_ptr<int32_t>();
    mk.iv_sb = lo->size(0) == 1 ? 0 : s.N;
  }
  TORCH_CHECK(tiles.has_value() == bits.has_value(), "tiles and bits come together");
  if (tiles.has_value()) {
    const at::Tensor& t = *tiles;
    TORCH_CHECK(t.scalar_type() == at::kInt && t.dim() == 4 && t.is_contiguous(), "tiles must be contiguous int32 4-D");
    TORCH_CHECK((t.size(0) == 1 || t.size(0) == s.B) && (t.size(1) == 1 || t.size(1) == s.H) && t.size(2) == s.nqb &&
                    t.size(3) == s.nkb,
                "tiles must be (1|B, 1|H, nqb, nkb) = (1|", s.B, ", 1|", s.H, ", ", s.nqb, ", ", s.nkb, "), got ",
                t.sizes());
    const at::Tensor& bt = *bits;
    TORCH_CHECK(bt.scalar_type() == at::kByte && bt.dim() == 3 && bt.is_contiguous() && bt.size(1) == s.BQ &&
                    bt.size(2) == s.BK / 8,
                "bits must be contiguous uint8 (P, ", s.BQ, ", ", s.BK / 8, "), got ", bt.sizes());
    if (t.numel() > 0) {
      const int64_t top = t.max().item<int32_t>(), bottom = t.min().item<int32_t>();
      TORCH_CHECK(top < bt.size(0) && bottom >= kEmpty, "tiles holds a value outside [-2, ", bt.size(0), ")");
    }
    mk.tiles = t.data_ptr<int32_t>();
    mk.t_sb = t.size(0) == 1 ? 0 : t.stride(0);
    mk.t_sh = t.size(1) == 1 ? 0 : t.stride(1);
    mk.t_sq = t.stride(2);
    mk.bits = bt.data_ptr<uint8_t>();
    mk.n_bits = bt.size(0);
  }
  if (dense.has_value()) {
    const at::Tensor& d = *dense;
    TORCH_CHECK(d.scalar_type() == at::kByte && d.dim() == 4, "dense must be a uint8 4-D tensor");
    TORCH_CHECK(d.size(0) == s.B && d.size(1) == s.H && d.size(2) == s.N && d.size(3) == s.M,
                "dense must be (B, H, N, M) = (", s.B, ", ", s.H, ", ", s.N, ", ", s.M, "), got ", d.sizes());
    mk.dense = d.data_ptr<uint8_t>();
    mk.d_sb = d.stride(0), mk.d_sh = d.stride(1), mk.d_si = d.stride(2), mk.d_sj = d.stride(3);
  }
  if (bias.has_value()) {
    const at::Tensor& d = *bias;
    TORCH_CHECK(d.scalar_type() == at::kFloat && d.dim() == 4, "bias must be a float32 4-D tensor");
    TORCH_CHECK(d.size(0) == s.B && d.size(1) == s.H && d.size(2) == s.N && d.size(3) == s.M,
                "bias must be (B, H, N, M) = (", s.B, ", ", s.H, ", ", s.N, ", ", s.M, "), got ", d.sizes());
    mk.bias = d.data_ptr<float>();
    mk.b_sb = d.stride(0), mk.b_sh = d.stride(1), mk.b_si = d.stride(2), mk.b_sj = d.stride(3);
  }
  if (rel.has_value()) {
    const at::Tensor& t = *rel;
    TORCH_CHECK(!bias.has_value(), "bias and rel cannot come together");
    TORCH_CHECK(t.scalar_type() == at::kFloat && t.dim() == 2 && t.is_contiguous() &&
                    (t.size(0) == 1 || t.size(0) == s.H) && t.size(1) == s.N + s.M - 1,
                "rel must be contiguous float32 (1|H, N + M - 1) = (1|", s.H, ", ", s.N + s.M - 1, "), got ",
                t.sizes());
    mk.bias = t.data_ptr<float>() + (s.N - 1);  // row i, key j: rel[h][(N - 1) - i + j]
    mk.b_sb = 0, mk.b_sh = t.size(0) == 1 ? 0 : t.stride(0), mk.b_si = -1, mk.b_sj = 1;
    mk.rel_heads = t.size(0);
  }
  return mk;
}

template <typename T>
CallT<T> make_call(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t block_q, int64_t block_k,
                   double scale) {
  check_qkv(q, "q", q.scalar_type());
  check_qkv(k, "k", q.scalar_type());
  check_qkv(v, "v", q.scalar_type());
  TORCH_CHECK(block_q >= 1 && block_k >= 16 && block_k % 16 == 0, "block_q >= 1 and block_k a multiple of 16");
  TORCH_CHECK(!kBf16<T> || block_q % 2 == 0, "block_q must be even in bfloat16");
  TORCH_CHECK(k.size(0) == q.size(0) && v.size(0) == q.size(0), "q, k, v must share the batch size");
  TORCH_CHECK(k.size(1) >= 1 && q.size(1) % k.size(1) == 0 && v.size(1) == k.size(1),
              "q heads must be a multiple of the k/v heads");
  TORCH_CHECK(k.size(2) == v.size(2) && k.size(3) == q.size(3), "k must be (B, Hkv, M, D) and v (B, Hkv, M, Dv)");
  CallT<T> c;
  Shape& s = c.sh;
  s.B = q.size(0), s.H = q.size(1), s.Hkv = k.size(1), s.G = s.H / s.Hkv, s.N = q.size(2), s.M = k.size(2);
  s.D = q.size(3), s.Dv = v.size(3), s.BQ = block_q, s.BK = block_k;
  s.nqb = (s.N + s.BQ - 1) / s.BQ, s.nkb = (s.M + s.BK - 1) / s.BK, s.scale = static_cast<float>(scale);
  c.q = view_of<T>(q), c.k = view_of<T>(k), c.v = view_of<T>(v);
  return c;
}

// the optional mask inputs of a call, as the ops receive them
struct MaskInputs {
  const std::optional<at::Tensor>&lo, &hi, &tiles, &bits, &dense, &bias, &rel;
};

template <typename T>
std::tuple<at::Tensor, at::Tensor> forward_impl(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                const MaskInputs& mi, double scale, int64_t block_q,
                                                int64_t block_k) {
  CallT<T> c = make_call<T>(q, k, v, block_q, block_k, scale);
  const Shape& s = c.sh;
  c.mk = masking(s, mi.lo, mi.hi, mi.tiles, mi.bits, mi.dense, mi.bias, mi.rel);
  at::Tensor out = at::empty({s.B, s.H, s.N, s.Dv}, q.options());
  at::Tensor lse = at::empty({s.B, s.H, s.N}, q.options().dtype(at::kFloat));
  if (s.B * s.H * s.N == 0) return {out, lse};
  at::Tensor kt, vp;  // the packed keys, unless there are few queries; bfloat16: the packed values
  if (s.N > kFewQueries) kt = at::empty({s.B, s.Hkv, s.nkb, s.D, s.BK}, q.options());
  if (kBf16<T>) vp = at::empty({s.B, s.Hkv, s.nkb, s.BK, s.Dv}, q.options());
  T* ktp = kt.defined() ? kt.template data_ptr<T>() : nullptr;
  bf16* vpp = vp.defined() ? vp.template data_ptr<bf16>() : nullptr;
  if (ktp != nullptr || vpp != nullptr) pack_keys(c, ktp, vpp);
  const View<T> ov = view_of<T>(out);
  float* lp = lse.data_ptr<float>();
  // items (b, h, qb), heaviest query blocks of a head first (the last ones, under a causal mask)
  for_each_item<FwdScratch<T>>(s.B * s.H * s.nqb, s, [&](int64_t u, FwdScratch<T>& w) {
    const int64_t bh = u / s.nqb, qb = s.nqb - 1 - u % s.nqb;
    forward_block(c, ktp, vpp, bh / s.H, bh % s.H, qb, w, ov, lp);
  }, kBf16<T>);
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor> native_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                  const std::optional<at::Tensor>& lo,
                                                  const std::optional<at::Tensor>& hi,
                                                  const std::optional<at::Tensor>& tiles,
                                                  const std::optional<at::Tensor>& bits,
                                                  const std::optional<at::Tensor>& dense,
                                                  const std::optional<at::Tensor>& bias,
                                                  const std::optional<at::Tensor>& rel, double scale, int64_t block_q,
                                                  int64_t block_k) {
  const MaskInputs mi{lo, hi, tiles, bits, dense, bias, rel};
  return q.scalar_type() == at::kBFloat16 ? forward_impl<bf16>(q, k, v, mi, scale, block_q, block_k)
                                          : forward_impl<float>(q, k, v, mi, scale, block_q, block_k);
}

// ---------------------------------------------------------------------------------------------
// backward

//: key blocks a backward unit holds transposed at once (its "super-block"): 32 x 64 keys
constexpr int64_t kSuperBlocks = 32;

template <typename T>
struct BwdScratch {
  std::vector<T> KT, VT, QT, dOT;  // KT, VT: operand_t's blocks; QT, dOT: transpose_rows's
  std::vector<float> dKT, dVT, S, dP, lse2, delta;
  std::vector<bf16> K, P2, dS2, dS;  // bfloat16: K's VNNI blocks (dQ += dS K), P and dS in row pairs and dS
  std::vector<int32_t> lo, hi, a, e;
  explicit BwdScratch(const Shape& s)
      : KT(kSuperBlocks * s.D * s.BK), VT(kSuperBlocks * s.Dv * s.BK), QT(s.D * s.BQ), dOT(s.Dv * s.BQ),
        dKT(kSuperBlocks * s.D * s.BK), dVT(kSuperBlocks * s.Dv * s.BK), S(s.BQ * s.BK), dP(s.BQ * s.BK),
        lse2(s.BQ), delta(s.BQ), K(kBf16<T> ? kSuperBlocks * s.BK * s.D : 0), P2(kBf16<T> ? s.BQ * s.BK : 0),
        dS2(kBf16<T> ? s.BQ * s.BK : 0), dS(kBf16<T> ? s.BQ * s.BK : 0), lo(s.BQ), hi(s.BQ), a(s.BQ), e(s.BQ) {}
};

template <typename T>
struct BwdCall {
  CallT<T> c;
  View<T> dout, out;
  const float* lse;
  const float* delta;        // (B, H, N): rowsum(dout * out)
  std::vector<int32_t> qlo;  // (Bi, nqb): the smallest key a query block may see
  std::vector<int32_t> qhi;  // (Bi, nqb): one past the largest
  int64_t Bi;
  float* drel = nullptr;  // (units, Gr, N + M - 1): each unit's share of the relative table's gradient
  int64_t Gr = 0;         // rows per unit: G when the table has a row per head, else 1
};

// bfloat16: rows [g0, g1) (g0 even) of a float tile x (ld BK), columns [c0, c0 + w), as the B operand of a
// product over the rows: row pairs interleaved into x2 (VNNI, ld BK), an odd last row paired with zeros.
void tile_row_pairs(const float* x, int64_t g0, int64_t g1, int64_t c0, int64_t w, int64_t BK, bf16* x2) {
  for (int64_t i = g0; i < g1; i += 2) {  // one pair of rows
    interleave_bf16(x + i * BK + c0, i + 1 < g1 ? x + (i + 1) * BK + c0 : nullptr, x2 + (i / 2) * BK * 2 + c0 * 2, w);
  }
}

// One tile (query block qb of head h, key block kb held at slot t) of the backward of unit (b, hk):
// the five products on the row runs, dS = P (dP - delta) * scale.
template <typename T>
void backward_tile(const BwdCall<T>& bc, int64_t b, int64_t h, int64_t qb, int64_t kb, int64_t t, int32_t tk,
                   BwdScratch<T>& w, float* dq, float* drel) {
  const CallT<T>& c = bc.c;
  const Shape& s = c.sh;
  const int64_t hk = h / s.G, r0 = qb * s.BQ, nr = std::min(s.BQ, s.N - r0);
  const int64_t k0 = kb * s.BK, k1 = std::min(k0 + s.BK, s.M);
  Group groups[4];
  const int64_t ng = plan_groups(w.a.data(), w.e.data(), nr, s.BK, k1 - k0, groups, kBf16<T>);
  const T* KT = w.KT.data() + t * s.D * s.BK;
  const T* VT = w.VT.data() + t * s.Dv * s.BK;
  float* dKT = w.dKT.data() + t * s.D * s.BK;
  float* dVT = w.dVT.data() + t * s.Dv * s.BK;
  const uint8_t* bt = c.bit_tile(tk);
  const bool plain = c.plain(bt);
  const float mul = c.mul(bt);
  const bool pairs = kBf16<T> && kNativeBf16 && drel == nullptr;  // bfloat16, no relative table: dS fused below
  for (int64_t g = 0; g < ng; ++g) {  // the row runs of the tile
    const Group& gr = groups[g];
    const int64_t rows = gr.g1 - gr.g0;
    NA_CHECK(gr.c0 >= 0 && gr.c0 + gr.w <= s.BK && gr.g1 <= nr && k0 + gr.c0 + gr.wk <= s.M);
    float* S = w.S.data() + gr.g0 * s.BK + gr.c0;
    float* dP = w.dP.data() + gr.g0 * s.BK + gr.c0;
    // S = Q K^T, dP = dO V^T
    at::native::cpublas::brgemm(rows, gr.w, s.D, c.q.sr, s.BK, s.BK, false, c.q.row(b, h, r0 + gr.g0),
                                KT + gr.c0 * kVnni<T>, S, kBf16<T>);
    at::native::cpublas::brgemm(rows, gr.w, s.Dv, bc.dout.sr, s.BK, s.BK, false, bc.dout.row(b, h, r0 + gr.g0),
                                VT + gr.c0 * kVnni<T>, dP, kBf16<T>);
    for (int64_t i = gr.g0; i < gr.g1; ++i) {  // P = 2^(s - lse2), dS = P (dP - delta) * scale
      float* p = w.S.data() + i * s.BK;
      float* ds = w.dP.data() + i * s.BK;
      const float l2 = w.lse2[i];
      if (l2 == kNegInf) {
        std::fill(p + gr.c0, p + gr.c0 + gr.w, 0.f);
        std::fill(ds + gr.c0, ds + gr.c0 + gr.w, 0.f);
        continue;
      }
      if (!plain) c.logits(p, b, h, r0 + i, i, k0, w.a[i], w.e[i], bt);  // a plain tile's maximum is not needed
      row_exp(p, gr.c0, gr.c0 + gr.w, w.a[i], w.e[i], mul, l2);
      if (pairs) continue;  // dS below, with the bfloat16 operands
      const float dl = w.delta[i], sc = s.scale;
      if (drel == nullptr) {  // the score's gradient scaled in one pass: q k^T's gradient
#pragma omp simd
        for (int64_t j = gr.c0; j < gr.c0 + gr.w; ++j) ds[j] = p[j] == 0.f ? 0.f : p[j] * (ds[j] - dl) * sc;
        continue;
      }
#pragma omp simd
      for (int64_t j = gr.c0; j < gr.c0 + gr.w; ++j) {  // the score's gradient; 0 where p is (a NaN delta stays out)
        ds[j] = p[j] == 0.f ? 0.f : p[j] * (ds[j] - dl);
      }
      if (w.a[i] < w.e[i]) {  // d rel[(N - 1) - r + key] += dS (before the scale)
        float* dr = drel + (s.N - 1) - (r0 + i) + k0;
        NA_CHECK((s.N - 1) - (r0 + i) + k0 + w.a[i] >= 0 && (s.N - 1) - (r0 + i) + k0 + w.e[i] <= s.N + s.M - 1);
        for (int64_t j = w.a[i]; j < w.e[i]; ++j) dr[j] += ds[j];
      }
#pragma omp simd
      for (int64_t j = gr.c0; j < gr.c0 + gr.w; ++j) ds[j] *= sc;  // q k^T's gradient
    }
    if constexpr (kBf16<T>) {
      // P and dS in bfloat16 row pairs (B operands over the rows), dS as it is (the A operand of dQ += dS K);
      // an odd run's last pair reads a zero row of P, dS and a zero column of dO^T, Q^T (past nr)
      NA_CHECK(gr.g0 % 2 == 0 && gr.c0 % 2 == 0 && (rows % 2 == 0 || gr.g1 == nr));
      if (pairs) {
        if constexpr (kNativeBf16) {  // (pairs is false without it)
          for (int64_t i = gr.g0; i < gr.g1; i += 2) {  // one row pair: dS, P and dS row pairs, dS's rows
            const bool two = i + 1 < gr.g1;
            const int64_t pr = (i / 2) * s.BK * 2 + gr.c0 * 2;
            ds_pair_bf16(w.S.data() + i * s.BK + gr.c0, two ? w.S.data() + (i + 1) * s.BK + gr.c0 : nullptr,
                         w.dP.data() + i * s.BK + gr.c0, two ? w.dP.data() + (i + 1) * s.BK + gr.c0 : nullptr,
                         w.delta[i], two ? w.delta[i + 1] : 0.f, s.scale, w.P2.data() + pr, w.dS2.data() + pr,
                         w.dS.data() + i * s.BK + gr.c0, two ? w.dS.data() + (i + 1) * s.BK + gr.c0 : nullptr,
                         gr.w);
          }
        }
      } else {
        tile_row_pairs(w.S.data(), gr.g0, gr.g1, gr.c0, gr.w, s.BK, w.P2.data());
        tile_row_pairs(w.dP.data(), gr.g0, gr.g1, gr.c0, gr.w, s.BK, w.dS2.data());
        for (int64_t i = gr.g0; i < gr.g1; ++i) {  // the run's rows of dS, as they are
          to_bf16(dP + (i - gr.g0) * s.BK, w.dS.data() + i * s.BK + gr.c0, gr.w);
        }
      }
      const int64_t rows2 = (rows + 1) / 2 * 2, keys2 = (gr.wk + 1) / 2 * 2;
      const int64_t pair0 = (gr.g0 / 2) * s.BK * 2 + gr.c0 * 2;  // the run's first row pair, column c0
      NA_CHECK(gr.g0 + rows2 <= s.BQ && gr.c0 + keys2 <= gr.c0 + gr.w);
      // dV^T += dO^T P, dK^T += Q^T dS, dQ += dS K
      at::native::cpublas::brgemm(s.Dv, gr.w, rows2, s.BQ, s.BK, s.BK, true, w.dOT.data() + gr.g0,
                                  w.P2.data() + pair0, dVT + gr.c0, true);
      at::native::cpublas::brgemm(s.D, gr.w, rows2, s.BQ, s.BK, s.BK, true, w.QT.data() + gr.g0,
                                  w.dS2.data() + pair0, dKT + gr.c0, true);
      at::native::cpublas::brgemm(rows, s.D, keys2, s.BK, s.D, s.D, true, w.dS.data() + gr.g0 * s.BK + gr.c0,
                                  w.K.data() + t * s.BK * s.D + gr.c0 * s.D,
                                  dq + ((b * s.H + h) * s.N + r0 + gr.g0) * s.D, true);
    } else {
      // dV^T += dO^T P, dK^T += Q^T dS, dQ += dS K
      at::native::cpublas::brgemm(s.Dv, gr.w, rows, s.BQ, s.BK, s.BK, true, w.dOT.data() + gr.g0, S, dVT + gr.c0);
      at::native::cpublas::brgemm(s.D, gr.w, rows, s.BQ, s.BK, s.BK, true, w.QT.data() + gr.g0, dP, dKT + gr.c0);
      at::native::cpublas::brgemm(rows, s.D, gr.wk, s.BK, c.k.sr, s.D, true, dP, c.k.row(b, hk, k0 + gr.c0),
                                  dq + ((b * s.H + h) * s.N + r0 + gr.g0) * s.D);
    }
  }
}

// Query block qb of head h against the unit's held key blocks kbs[0 .. nk).
template <typename T>
void backward_rows(const BwdCall<T>& bc, int64_t b, int64_t h, int64_t qb, const int64_t* kbs, int64_t nk,
                   BwdScratch<T>& w, float* dq, float* drel) {
  const CallT<T>& c = bc.c;
  const Shape& s = c.sh;
  const int64_t r0 = qb * s.BQ, nr = std::min(s.BQ, s.N - r0);
  c.intervals(bc.Bi > 1 ? b : 0, r0, nr, w.lo.data(), w.hi.data());
  bool any = false;
  for (int64_t i = 0; i < nr; ++i) {
    const float l = bc.lse[(b * s.H + h) * s.N + r0 + i];
    w.lse2[i] = l == kNegInf ? kNegInf : l * kLog2e;
    w.delta[i] = bc.delta[(b * s.H + h) * s.N + r0 + i];
    any = any || l != kNegInf;
  }
  if (!any) return;
  bool transposed = false;
  for (int64_t t = 0; t < nk; ++t) {  // the held key blocks this query block may see
    const int64_t kb = kbs[t], k0 = kb * s.BK, k1 = std::min(k0 + s.BK, s.M);
    const int32_t tk = c.tile(b, h, qb, kb);
    if (tk == kEmpty) continue;
    if (!tile_spans(w.lo.data(), w.hi.data(), nr, k0, k1, w.a.data(), w.e.data())) continue;
    if (!transposed) {  // Q^T and dO^T of the block: the A operands of dK^T and dV^T
      transpose_rows(c.q, b, h, r0, nr, s.D, s.BQ, w.QT.data());
      transpose_rows(bc.dout, b, h, r0, nr, s.Dv, s.BQ, w.dOT.data());
      transposed = true;
    }
    backward_tile(bc, b, h, qb, kb, t, tk, w, dq, drel);
  }
}

// Unit (b, hk, chunk): the key blocks kb = chunk, chunk + C, ... of one (batch, kv head), in super-blocks;
// dK and dV of those keys are its own, dQ goes to the chunk's buffer.
template <typename T>
void backward_unit(const BwdCall<T>& bc, int64_t b, int64_t hk, int64_t chunk, int64_t C, BwdScratch<T>& w,
                   float* dq, const View<T>& dk, const View<T>& dv) {
  const int64_t R = bc.c.sh.N + bc.c.sh.M - 1;
  float* drel = bc.drel ? bc.drel + ((b * bc.c.sh.Hkv + hk) * C + chunk) * bc.Gr * R : nullptr;
  const CallT<T>& c = bc.c;
  const Shape& s = c.sh;
  int64_t kbs[kSuperBlocks];
  for (int64_t first = chunk; first < s.nkb; first += C * kSuperBlocks) {  // one super-block
    int64_t nk = 0;
    for (int64_t kb = first; kb < s.nkb && nk < kSuperBlocks; kb += C) kbs[nk++] = kb;
    for (int64_t t = 0; t < nk; ++t) {  // K^T, V^T (bfloat16: and K) of the held key blocks
      const int64_t k0 = kbs[t] * s.BK, n = std::min(s.BK, s.M - k0);
      operand_t(c.k, b, hk, k0, n, s.D, s.BK, w.KT.data() + t * s.D * s.BK);
      operand_t(c.v, b, hk, k0, n, s.Dv, s.BK, w.VT.data() + t * s.Dv * s.BK);
      if constexpr (kBf16<T>) operand_rows(c.k, b, hk, k0, n, s.D, s.BK, w.K.data() + t * s.BK * s.D);
    }
    std::fill(w.dKT.begin(), w.dKT.begin() + nk * s.D * s.BK, 0.f);  // zero their accumulators
    std::fill(w.dVT.begin(), w.dVT.begin() + nk * s.Dv * s.BK, 0.f);
    const int64_t lo_key = kbs[0] * s.BK, hi_key = std::min((kbs[nk - 1] + 1) * s.BK, s.M);
    for (int64_t qb = 0; qb < s.nqb; ++qb) {  // query blocks whose keys meet the held ones
      const int64_t bi = bc.Bi > 1 ? b : 0;
      if (bc.qlo[bi * s.nqb + qb] >= hi_key || bc.qhi[bi * s.nqb + qb] <= lo_key) continue;
      for (int64_t g = 0; g < s.G; ++g) {
        backward_rows(bc, b, hk * s.G + g, qb, kbs, nk, w, dq, drel ? drel + (bc.Gr > 1 ? g : 0) * R : nullptr);
      }
    }
    for (int64_t t = 0; t < nk; ++t) {  // write the held blocks' dK, dV
      const int64_t k0 = kbs[t] * s.BK, n = std::min(s.BK, s.M - k0);
      const float* gk = w.dKT.data() + t * s.D * s.BK;
      const float* gv = w.dVT.data() + t * s.Dv * s.BK;
      for (int64_t j = 0; j < n; ++j) {
        T* ok = dk.row(b, hk, k0 + j);
        T* ov = dv.row(b, hk, k0 + j);
        for (int64_t d = 0; d < s.D; ++d) ok[d] = static_cast<T>(gk[d * s.BK + j]);
        for (int64_t d = 0; d < s.Dv; ++d) ov[d] = static_cast<T>(gv[d * s.BK + j]);
      }
    }
  }
}

// per (Bi, qb): the key range [qlo, qhi) the block's rows may see by their intervals
template <typename T>
void block_ranges(BwdCall<T>& bc) {
  const Shape& s = bc.c.sh;
  bc.Bi = bc.c.mk.iv_sb ? s.B : 1;
  bc.qlo.assign(bc.Bi * s.nqb, static_cast<int32_t>(s.M));
  bc.qhi.assign(bc.Bi * s.nqb, 0);
  std::vector<int32_t> lo(s.BQ), hi(s.BQ);
  for (int64_t bi = 0; bi < bc.Bi; ++bi) {
    for (int64_t qb = 0; qb < s.nqb; ++qb) {
      const int64_t r0 = qb * s.BQ, nr = std::min(s.BQ, s.N - r0);
      bc.c.intervals(bi, r0, nr, lo.data(), hi.data());
      for (int64_t i = 0; i < nr; ++i) {
        if (lo[i] < hi[i]) {
          bc.qlo[bi * s.nqb + qb] = std::min(bc.qlo[bi * s.nqb + qb], lo[i]);
          bc.qhi[bi * s.nqb + qb] = std::max(bc.qhi[bi * s.nqb + qb], hi[i]);
        }
      }
    }
  }
}

// dq chunks: enough units for 8 workers when B * Hkv is small, at most 256 MiB of partial dq;
// never the thread count, so the sums (and the results) do not depend on it
int64_t backward_chunks(const Shape& s) {
  const int64_t units = s.B * s.Hkv;
  const int64_t want = std::max<int64_t>(1, (8 + units - 1) / units);
  const int64_t dq_bytes = std::max<int64_t>(1, s.B * s.H * s.N * s.D * 4);
  const int64_t cap = std::max<int64_t>(1, (int64_t(256) << 20) / dq_bytes);
  return std::max<int64_t>(1, std::min({want, s.nkb, cap}));
}

// delta = rowsum(dout * out), (B, H, N)
template <typename T>
at::Tensor row_deltas(const BwdCall<T>& bc, const at::Tensor& like) {
  const Shape& s = bc.c.sh;
  at::Tensor delta = at::empty({s.B, s.H, s.N}, like.options());
  float* dp = delta.data_ptr<float>();
  at::parallel_for(0, s.B * s.H * s.N, 256, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {  // one query row
      const int64_t b = r / (s.H * s.N), h = (r / s.N) % s.H, i = r % s.N;
      const T* x = bc.dout.row(b, h, i);
      const T* y = bc.out.row(b, h, i);
      float acc = 0.f;
      for (int64_t d = 0; d < s.Dv; ++d) acc += static_cast<float>(x[d]) * static_cast<float>(y[d]);
      dp[r] = acc;
    }
  });
  return delta;
}

// the relative table's gradient (rel_heads, N + M - 1) from the units' shares, summed in a fixed order
template <typename T>
at::Tensor sum_rel_grad(const BwdCall<T>& bc, int64_t C, const at::Tensor& like) {
  const Shape& s = bc.c.sh;
  const int64_t R = s.N + s.M - 1, Hr = bc.c.mk.rel_heads;
  at::Tensor out = at::zeros({Hr, R}, like.options());
  float* o = out.data_ptr<float>();
  for (int64_t u = 0; u < s.B * s.Hkv * C; ++u) {  // unit (b, hk, chunk)
    const int64_t hk = (u / C) % s.Hkv;
    for (int64_t g = 0; g < bc.Gr; ++g) {
      const float* src = bc.drel + (u * bc.Gr + g) * R;
      float* dst = o + (Hr == 1 ? 0 : hk * s.G + g) * R;
      for (int64_t j = 0; j < R; ++j) dst[j] += src[j];
    }
  }
  return out;
}

// the backward in T (float32 or bfloat16); the float32 scratch tensors (delta, the dq chunks, drel) use f32
template <typename T>
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> backward_impl(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
    const at::Tensor& lse, const MaskInputs& mi, bool rel_grad, double scale, int64_t block_q, int64_t block_k) {
  BwdCall<T> bc;
  bc.c = make_call<T>(q, k, v, block_q, block_k, scale);
  const Shape& s = bc.c.sh;
  bc.c.mk = masking(s, mi.lo, mi.hi, mi.tiles, mi.bits, mi.dense, mi.bias, mi.rel);
  check_qkv(dout, "dout", q.scalar_type());
  check_qkv(out, "out", q.scalar_type());
  TORCH_CHECK(dout.sizes() == out.sizes() && out.size(0) == s.B && out.size(1) == s.H && out.size(2) == s.N &&
                  out.size(3) == s.Dv,
              "dout and out must be (B, H, N, Dv)");
  TORCH_CHECK(lse.scalar_type() == at::kFloat && lse.is_contiguous() && lse.dim() == 3 && lse.size(0) == s.B &&
                  lse.size(1) == s.H && lse.size(2) == s.N,
              "lse must be contiguous float32 (B, H, N)");
  TORCH_CHECK(!rel_grad || mi.rel.has_value(), "rel_grad needs rel");
  const at::TensorOptions f32 = q.options().dtype(at::kFloat);
  if (s.B * s.H * s.N == 0 || s.M == 0) {  // nothing to walk (and no work units to divide among)
    at::Tensor drel = rel_grad ? at::zeros({bc.c.mk.rel_heads, s.N + s.M - 1}, f32) : at::empty({0}, f32);
    return {at::zeros({s.B, s.H, s.N, s.D}, q.options()), at::zeros({s.B, s.Hkv, s.M, s.D}, q.options()),
            at::zeros({s.B, s.Hkv, s.M, s.Dv}, q.options()), drel};
  }
  bc.dout = view_of<T>(dout);
  bc.out = view_of<T>(out);
  bc.lse = lse.data_ptr<float>();
  at::Tensor delta = row_deltas(bc, lse);
  bc.delta = delta.data_ptr<float>();
  block_ranges(bc);
  const int64_t C = backward_chunks(s);
  at::Tensor drel_parts;
  if (rel_grad) {
    bc.Gr = bc.c.mk.rel_heads == 1 ? 1 : s.G;
    drel_parts = at::zeros({s.B * s.Hkv * C, bc.Gr, s.N + s.M - 1}, f32);
    bc.drel = drel_parts.data_ptr<float>();
  }
  at::Tensor dq = at::zeros({C, s.B, s.H, s.N, s.D}, f32);  // float32 accumulators in either dtype
  at::Tensor dk = at::empty({s.B, s.Hkv, s.M, s.D}, q.options());
  at::Tensor dv = at::empty({s.B, s.Hkv, s.M, s.Dv}, q.options());
  const View<T> dkv = view_of<T>(dk), dvv = view_of<T>(dv);
  float* dqp = dq.data_ptr<float>();
  const int64_t dq_numel = s.B * s.H * s.N * s.D;
  for_each_item<BwdScratch<T>>(s.B * s.Hkv * C, s, [&](int64_t u, BwdScratch<T>& w) {
    const int64_t b = u / (s.Hkv * C), hk = (u / C) % s.Hkv, chunk = u % C;
    backward_unit(bc, b, hk, chunk, C, w, dqp + chunk * dq_numel, dkv, dvv);
  }, kBf16<T>);
  at::Tensor dq_total = C == 1 ? dq[0] : dq.sum(0);  // the chunks' shares, summed in a fixed order
  if (kBf16<T>) dq_total = dq_total.to(at::kBFloat16);
  at::Tensor drel = rel_grad ? sum_rel_grad(bc, C, lse) : at::empty({0}, f32);
  return {dq_total, dk, dv, drel};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> native_backward(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
    const at::Tensor& lse, const std::optional<at::Tensor>& lo, const std::optional<at::Tensor>& hi,
    const std::optional<at::Tensor>& tiles, const std::optional<at::Tensor>& bits,
    const std::optional<at::Tensor>& dense, const std::optional<at::Tensor>& bias,
    const std::optional<at::Tensor>& rel, bool rel_grad, double scale, int64_t block_q, int64_t block_k) {
  const MaskInputs mi{lo, hi, tiles, bits, dense, bias, rel};
  return q.scalar_type() == at::kBFloat16
             ? backward_impl<bf16>(dout, q, k, v, out, lse, mi, rel_grad, scale, block_q, block_k)
             : backward_impl<float>(dout, q, k, v, out, lse, mi, rel_grad, scale, block_q, block_k);
}

std::string native_info() {
  return std::string("brgemm float32, softmax ")
#if defined(__AVX512F__)
         + "avx512"
#elif defined(CPU_CAPABILITY_AVX2)
         + "avx2 (at::vec)"
#else
         + "default (at::vec)"
#endif
         + (kNativeBf16 ? ", bf16 avx512_bf16" : ", bf16 without avx512_bf16")
         + ", openmp threads " + std::to_string(at::get_num_threads())
#ifdef ATTNLAB_NATIVE_DEBUG
         + ", bounds checks on"
#endif
      ;
}

}  // namespace

TORCH_LIBRARY(attnlab_native, m) {
  m.def(
      "forward(Tensor q, Tensor k, Tensor v, Tensor? lo, Tensor? hi, Tensor? tiles, Tensor? bits, Tensor? dense, "
      "Tensor? bias, Tensor? rel, float scale, int block_q, int block_k) -> (Tensor, Tensor)");
  m.def(
      "backward(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor? lo, Tensor? hi, "
      "Tensor? tiles, Tensor? bits, Tensor? dense, Tensor? bias, Tensor? rel, bool rel_grad, float scale, "
      "int block_q, int block_k) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def("info() -> str");
  m.impl("forward", c10::DispatchKey::CPU, TORCH_FN(native_forward));
  m.impl("backward", c10::DispatchKey::CPU, TORCH_FN(native_backward));
  m.impl("info", c10::DispatchKey::CatchAll, TORCH_FN(native_info));
}
