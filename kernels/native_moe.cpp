// Grouped GEMM over experts' weights packed in column blocks, for the CPU (kernels.native_moe).
//
// y[rows of e] = x[rows of e] @ W[e] for every expert e with rows. W is packed as
// [E][N / NB][K][NB] (N padded to a multiple of NB), so one tile of work, an (expert, column
// block) pair, reads its weights as one contiguous stream. Decode routes a few rows to each
// expert, so the step is bound by reading the weights once: each tile keeps up to MB rows' sums
// in registers while its weights stream past, and the threads split the tiles, not each
// expert's GEMM, so they meet once per call rather than once per expert. Rows and sums are
// float32; weights float32 or bfloat16 (widened as they are read: half the bytes to stream).
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace {

// One hardware vector of L floats. GCC lowers a wider generic vector into narrower ones but
// keeps its values in memory between the pieces, so a 16-float vector without AVX-512 made
// the kernel take 1.7-27x grouped_mm's time (benchmarks/RESULTS.md, "One MoE layer").
#ifdef __AVX512F__
constexpr int L = 16;
constexpr int MB = 8;  // rows a tile keeps in registers: 16 sums in AVX-512's 32 zmm
#else
constexpr int L = 8;
constexpr int MB = 3;  // 12 sums and 4 weight vectors fill AVX2's 16 ymm
#endif
constexpr int NB = 32;      // columns a tile (the packing's block, the same on every CPU)
constexpr int V = NB / L;   // vectors a tile's row spans
typedef float vf __attribute__((vector_size(4 * L)));
typedef uint16_t vh __attribute__((vector_size(2 * L)));
typedef uint32_t vu __attribute__((vector_size(4 * L)));

inline vf vec(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline vf vec(const uint16_t* p) {
  vh h;
  std::memcpy(&h, p, sizeof h);
  vu bits = __builtin_convertvector(h, vu) << 16;
  vf v;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}

// e^x to a few float ulps: 2^n e^r with n = round(x / ln 2), |r| <= ln 2 / 2, and Cephes'
// polynomial for e^r. x is clamped to where 2^n stays a normal float's scale.
inline vf expv(vf x) {
  const vf lo = vf{} - 87.3f, hi = vf{} + 88.3f, shift = vf{} + 12582912.0f;  // 1.5 * 2^23
  x = x < lo ? lo : x;
  x = x > hi ? hi : x;
  const vf t = x * 1.44269504f + shift;  // n in t's low mantissa bits, rounded to nearest
  const vf n = t - shift;
  const vf r = x - n * 0.693359375f + n * 2.12194440e-4f;
  vf p = vf{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const vf e = p * r * r + r + 1.0f;
  vu tb, eb;
  std::memcpy(&tb, &t, sizeof t);
  std::memcpy(&eb, &e, sizeof e);
  eb += (tb - 0x4B400000u) << 23;
  vf out;
  std::memcpy(&out, &eb, sizeof out);
  return out;
}

// How one weight dtype is multiplied. A path packs each row of x (K values) into D values of
// X, spaced MB apart (a group of MB rows is [D][MB]); its weight blocks are [D][NB][LANES];
// `tile` sums M packed rows times one block into acc [M][NB].
template <typename T>
struct Wide {  // T float32 or bfloat16 weights, widened to float32 as read
  using W = T;
  using X = float;
  static constexpr int LANES = 1;
  static int64_t depth(int64_t K) { return K; }
  static void pack(const float* row, int64_t K, X* dst) {
    for (int64_t k = 0; k < K; ++k) dst[k * MB] = row[k];
  }
  template <int M>
  static void tile(const X* x, const W* w, int64_t D, float* acc) {
    vf a[M][V];
    for (int m = 0; m < M; ++m)
      for (int v = 0; v < V; ++v) a[m][v] = vf{};
    for (int64_t k = 0; k < D; ++k) {
      vf wv[V];
      for (int v = 0; v < V; ++v) wv[v] = vec(w + k * NB + L * v);
      for (int m = 0; m < M; ++m) {
        const float s = x[k * MB + m];
        for (int v = 0; v < V; ++v) a[m][v] += s * wv[v];
      }
    }
    for (int m = 0; m < M; ++m)
      for (int v = 0; v < V; ++v) std::memcpy(acc + m * NB + L * v, &a[m][v], sizeof a[m][v]);
  }
};

#ifdef __AVX512BF16__
inline uint32_t to_bf16(float f) {  // round to nearest even, as torch does
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return (bits + 0x7fff + ((bits >> 16) & 1)) >> 16;
}

// bfloat16 weights and rows, in pairs along K (one 32-bit lane holds k = 2d and 2d + 1), by
// AVX512-BF16's dot product: twice the products of an instruction of the widening path.
struct Bf16Pairs {
  using W = uint16_t;
  using X = uint32_t;
  static constexpr int LANES = 2;
  static int64_t depth(int64_t K) { return (K + 1) / 2; }
  static void pack(const float* row, int64_t K, X* dst) {
    for (int64_t d = 0; d < depth(K); ++d) {
      const uint32_t hi = 2 * d + 1 < K ? to_bf16(row[2 * d + 1]) : 0;
      dst[d * MB] = to_bf16(row[2 * d]) | hi << 16;
    }
  }
  template <int M>
  static void tile(const X* x, const W* w, int64_t D, float* acc) {
    static_assert(L == 16 && V == 2, "a tile is two vectors of 16 columns");
    __m512 a[M][2];
    for (int m = 0; m < M; ++m) a[m][0] = a[m][1] = _mm512_setzero_ps();
    for (int64_t d = 0; d < D; ++d) {
      const __m512bh w0 = (__m512bh)_mm512_loadu_si512(w + d * 2 * NB);
      const __m512bh w1 = (__m512bh)_mm512_loadu_si512(w + d * 2 * NB + NB);
      for (int m = 0; m < M; ++m) {
        const __m512bh xv = (__m512bh)_mm512_set1_epi32(int(x[d * MB + m]));
        a[m][0] = _mm512_dpbf16_ps(a[m][0], xv, w0);
        a[m][1] = _mm512_dpbf16_ps(a[m][1], xv, w1);
      }
    }
    for (int m = 0; m < M; ++m) {
      _mm512_storeu_ps(acc + m * NB, a[m][0]);
      _mm512_storeu_ps(acc + m * NB + 16, a[m][1]);
    }
  }
};
using Bf16 = Bf16Pairs;
#else
using Bf16 = Wide<uint16_t>;
#endif

// M is the rows at most: a group's last tile may hold fewer than MB.
template <typename P, int M = MB>
void tile_rows(const typename P::X* x, const typename P::W* w, int64_t D, int mb, float* acc) {
  if constexpr (M > 1)
    if (mb < M) return tile_rows<P, M - 1>(x, w, D, mb, acc);
  P::template tile<M>(x, w, D, acc);
}

// What is done to a tile's sums as they are written: optional per-expert biases and gpt-oss's
// clamped SwiGLU. With neither, the sums are written as they always were.
struct Epilogue {
  const float* bias;  // [E][stride] float32, padded to whole blocks; nullptr: no bias
  int64_t stride;     // GateUp: gate biases in [0, stride / 2), up biases after them
  int clamp;          // 1: (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g), g = min(gate, limit)
  float limit, alpha;
};

// Rows m0.. of one tile's sums acc [mb][NB] into y (row stride N), columns j * NB.. of them.
// GateUp: the block's columns are 16 gate and the same 16 up columns, and y gets
// SiLU(gate) * up, 16 columns a block. b: this expert's bias row (or nullptr).
template <bool GateUp>
inline void write(const float* acc, int mb, float* y, int64_t N, int64_t j, const Epilogue& ep,
                  const float* b) {
  const int64_t width = GateUp ? 16 : NB, col = j * width;
  const int cols = int(N - col < width ? N - col : width);
  const vf lim = vf{} + ep.limit;
  for (int m = 0; m < mb; ++m) {
    float* dst = y + m * N + col;
    if (!GateUp) {
      if (b == nullptr) {
        std::memcpy(dst, acc + m * NB, cols * 4);
      } else {
        for (int c = 0; c < cols; ++c) dst[c] = acc[m * NB + c] + b[col + c];
      }
      continue;
    }
    float h[16];
    for (int c = 0; c < 16; c += L) {
      vf gate = vec(acc + m * NB + c), up = vec(acc + m * NB + 16 + c);
      if (b != nullptr) {
        gate += vec(b + col + c);
        up += vec(b + ep.stride / 2 + col + c);
      }
      vf out;
      if (ep.clamp) {
        gate = gate > lim ? lim : gate;
        up = up > lim ? lim : up;
        up = up < -lim ? -lim : up;
        out = (up + 1.0f) * (gate / (1.0f + expv(-(gate * ep.alpha))));
      } else {
        out = gate / (1.0f + expv(-gate)) * up;
      }
      std::memcpy(h + c, &out, sizeof out);
    }
    std::memcpy(dst, h, cols * 4);
  }
}

// 0, or -1 (nothing written) when an expert's rows are not within x's M rows.
// N: y's columns; with GateUp the packed weights have 2 * 16 columns per 16 of them.
template <bool GateUp, typename P>
int grouped_gemm(const float* x, int64_t M, int64_t K, const typename P::W* w, int64_t E,
                 int64_t N, const int32_t* offsets, float* y, int threads, const Epilogue& ep) {
  const int64_t width = GateUp ? 16 : NB, blocks = (N + width - 1) / width, D = P::depth(K);
  struct Expert {
    int64_t id, start, end, group;  // group: its first row group's index
  };
  std::vector<Expert> used;
  int64_t groups = 0;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t start = e ? offsets[e - 1] : 0;
    if (offsets[e] > M || start < 0) return -1;
    if (offsets[e] > start) {
      used.push_back({e, start, offsets[e], groups});
      groups += (offsets[e] - start + MB - 1) / MB;
    }
  }
  // x's rows in groups of MB of one expert, each group packed [D][MB]: a tile reads its rows'
  // values at one k from one cache line, where rows K floats apart would share cache sets.
  // Kept per calling thread and grown, never freed: a prefill's worth is megabytes, and
  // fresh pages every call would be faulted in every call.
  thread_local std::vector<typename P::X> packed;
  if (packed.size() < size_t(groups * D * MB)) packed.resize(groups * D * MB);
  typename P::X* xp = packed.data();
  const int64_t tiles = int64_t(used.size()) * blocks;
#pragma omp parallel num_threads(threads)
  {
#pragma omp for schedule(static)
    for (int64_t u = 0; u < int64_t(used.size()); ++u)
      for (int64_t m0 = used[u].start, g = used[u].group; m0 < used[u].end; m0 += MB, ++g)
        for (int64_t m = 0; m < MB && m0 + m < used[u].end; ++m)
          P::pack(x + (m0 + m) * K, K, xp + g * D * MB + m);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < tiles; ++t) {
      const Expert& e = used[t / blocks];
      const int64_t j = t % blocks;
      const typename P::W* wj = w + (e.id * blocks + j) * D * NB * P::LANES;
      const float* b = ep.bias == nullptr ? nullptr : ep.bias + e.id * ep.stride;
      float acc[MB * NB];
      for (int64_t m0 = e.start, g = e.group; m0 < e.end; m0 += MB, ++g) {
        const int mb = int(e.end - m0 < MB ? e.end - m0 : MB);
        tile_rows<P>(xp + g * D * MB, wj, D, mb, acc);
        write<GateUp>(acc, mb, y + m0 * N, N, j, ep, b);
      }
    }
  }
  return 0;
}

}  // namespace

extern "C" {
int native_moe_block() { return NB; }
int native_moe_bf16_lanes() { return Bf16::LANES; }  // bf16 weights packed in pairs along K: 2

// float32 or bfloat16 (its bits as uint16) weights; float32 rows in and sums out; the last
// five arguments are the Epilogue's fields
#define ENTRY(name, gate_up, P)                                                               \
  int name(const float* x, int64_t M, int64_t K, const P::W* w, int64_t E, int64_t N,        \
           const int32_t* offsets, float* y, int threads, const float* bias, int64_t stride, \
           int clamp, float limit, float alpha) {                                            \
    return grouped_gemm<gate_up, P>(x, M, K, w, E, N, offsets, y, threads,                   \
                                    Epilogue{bias, stride, clamp, limit, alpha});             \
  }
ENTRY(grouped_gemm_f32, false, Wide<float>)
ENTRY(grouped_gemm_bf16, false, Bf16)
ENTRY(grouped_gate_up_f32, true, Wide<float>)
ENTRY(grouped_gate_up_bf16, true, Bf16)
}
